/*
 * refit-agent [--socket-dir DIR] [--attach-grace S] CONFIG: the refit job that framework
 * processes attach to (docs/agent.md). Launched like refit-run, one rank per
 * GPU (or per host-memory rank), beside the training and serving jobs:
 *
 *   launch/refit-launch CONFIG.yaml -- build/runtime/refit-agent CONFIG.yaml
 *
 * Each rank opens the same session refit-run would (an ordinary client of
 * refit/refit.h) and listens on DIR/<side>.<rank>.sock (DIR from
 * --socket-dir, else $REFIT_AGENT_DIR, else /tmp/refit-agent-<uid>; created
 * 0700, never through a symbolic link; the socket 0600). One framework
 * process at a time attaches to it: it learns what its rank holds, hands over
 * its tensors by handle (host memory as shared-memory file descriptors, GPU
 * memory as CUDA IPC handles), and drives the refits; the agent maps each
 * allocation once and refits in place.
 *
 * The agents agree among themselves over MPI (a duplicate of the world)
 * which version is refit and when: rank 0 gathers each rank's state and
 * orders the others (the coordinator below). A refit starts only once every
 * trainer process asked for it and every engine process accepted it; until
 * then nobody waits on a deadline, and a rank whose framework process is
 * missing is named at once. Once it started, the session's own deadlines
 * hold. A framework process that goes away (exit, SIGKILL, Ctrl-C) is
 * noticed when its socket closes: a refit in flight fails on every rank with
 * a message naming it, its memory is dropped (refit_tensor_forget_all), and
 * the agent waits for the next process, which takes the next refit in full.
 *
 * The agent exits when a client asks it to shut the job down (every rank
 * stops), or on SIGTERM/SIGINT.
 */

#include "refit/refit.h"

#include "agent/agent_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <mpi.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#ifdef REFIT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define AGENT_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* Control messages between agents (MPI, a duplicate of the world). */
enum {
  CTL_ATTACHED = 1, /* to rank 0: a client attached (pid) */
  CTL_DETACHED,     /* to rank 0: the client went away */
  CTL_BEGIN,        /* to rank 0: the client asks for / accepts version */
  CTL_PENDING,      /* from rank 0 to generators: trainers began version */
  CTL_GO,           /* from rank 0: everyone is in, refit version now */
  CTL_FAIL,         /* from rank 0: the round of version is off (text) */
  CTL_NOTICE,       /* to every rank: why this rank failed a refit (text) */
  CTL_QUIT          /* to rank 0, then from it: shut the job down */
};
enum { TAG_REPORT = 1, TAG_ORDER = 2, TAG_NOTICE = 3 };

/* How long a refit's start waits for a rank with no framework process
 * attached before it is refused, naming the rank (--attach-grace). */
static double agent_attach_grace_s = 5.0;
#define AGENT_ATTACH_GRACE_S agent_attach_grace_s

typedef struct {
  int32_t kind, rank, pid, pad;
  uint64_t version;
  char text[488];
} agent_ctl_t;

/* An allocation of the client's mapped once: a shared-memory file (host) or
 * a CUDA IPC handle (device). */
typedef struct {
  int device;
  dev_t dev;
  ino_t ino;
  unsigned char handle[64];
  void *base;
  size_t bytes;
} agent_map_t;

typedef struct {
  MPI_Request req;
  agent_ctl_t msg;
} agent_send_t;

typedef struct {
  refit_session_h s;
  refit_settings_t set;
  int rank, size, ntrainer, trainer, role_rank, device;
  const char *side;
  MPI_Comm ctl;
  char dir[256], path[512];
  int listen_fd, client;
  int client_pid;
  agent_map_t *maps;
  int nmaps, cap_maps;
  agent_send_t *sends;
  int nsends, cap_sends;
  /* The client's outstanding request answered later: begin (waits for GO)
   * or next (waits for a pending version). */
  uint64_t begin_wait; /* version asked for; 0: none */
  int begin_all;       /* the begin is part of one "refit" op */
  uint64_t pending;    /* generator: the version trainers began (0: none) */
  uint64_t version;    /* the refit begun last */
  int next_wait;
  double next_deadline; /* < 0: none */
  char notices[1024];
  /* rank 0: the coordinator's view of every rank */
  int *attached;
  uint64_t *began;
  uint64_t round;
  double round_t0;
  int round_told;
  int quit;
#ifdef REFIT_HAVE_CUDA
  cudaStream_t stream;
  cudaEvent_t begin_ev, commit_ev;
  int have_begin_ev;
#endif
} agent_t;

static volatile sig_atomic_t agent_stop;
static void agent_on_signal(int sig) {
  (void)sig;
  agent_stop = 1;
}

static void agent_log(const agent_t *a, const char *fmt, ...) AGENT_PRINTF(2, 3);
static void agent_log(const agent_t *a, const char *fmt, ...) {
  char host[64] = "?";
  gethostname(host, sizeof(host));
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s:%d:%d refit-agent %s %d: ", host, (int)getpid(), a->rank, a->side,
          a->role_rank);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* ---- control messages ------------------------------------------------- */

static void agent_ctl_reap(agent_t *a) {
  for (int i = 0; i < a->nsends;) {
    int done = 0;
    MPI_Test(&a->sends[i].req, &done, MPI_STATUS_IGNORE);
    if (done)
      a->sends[i] = a->sends[--a->nsends];
    else
      i++;
  }
}

static void agent_ctl_send(agent_t *a, int dest, int tag, int kind, uint64_t version,
                           const char *fmt, ...) AGENT_PRINTF(6, 7);
static void agent_ctl_send(agent_t *a, int dest, int tag, int kind, uint64_t version,
                           const char *fmt, ...) {
  agent_ctl_reap(a);
  if (a->nsends == a->cap_sends) {
    /* The messages' buffers move only while none is in flight. */
    while (a->nsends > 0)
      agent_ctl_reap(a);
    const int cap = a->cap_sends ? 2 * a->cap_sends : 16;
    agent_send_t *n = realloc(a->sends, (size_t)cap * sizeof(*n));
    if (n == NULL) {
      agent_log(a, "out of memory for a control message");
      return;
    }
    a->sends = n;
    a->cap_sends = cap;
  }
  agent_send_t *m = &a->sends[a->nsends++];
  memset(&m->msg, 0, sizeof(m->msg));
  m->msg.kind = kind;
  m->msg.rank = a->rank;
  m->msg.pid = a->client_pid;
  m->msg.version = version;
  if (fmt != NULL) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->msg.text, sizeof(m->msg.text), fmt, ap);
    va_end(ap);
  }
  MPI_Isend(&m->msg, (int)sizeof(m->msg), MPI_BYTE, dest, tag, a->ctl, &m->req);
}

static int agent_ctl_poll(agent_t *a, int tag, agent_ctl_t *out) {
  int flag = 0;
  MPI_Status status;
  MPI_Iprobe(MPI_ANY_SOURCE, tag, a->ctl, &flag, &status);
  if (!flag)
    return 0;
  MPI_Recv(out, (int)sizeof(*out), MPI_BYTE, status.MPI_SOURCE, tag, a->ctl,
           MPI_STATUS_IGNORE);
  out->text[sizeof(out->text) - 1] = '\0';
  return 1;
}

/* "trainer 1 (world rank 1)" */
static void agent_rank_name(const agent_t *a, int r, char *buf, size_t len) {
  if (r < a->ntrainer)
    snprintf(buf, len, "trainer rank %d (world rank %d)", r, r);
  else
    snprintf(buf, len, "generator rank %d (world rank %d)", r - a->ntrainer, r);
}

/* ---- the coordinator (rank 0) ------------------------------------------ */

static void agent_coord_fail(agent_t *a, const char *why) {
  for (int r = 0; r < a->size; r++) {
    agent_ctl_send(a, r, TAG_ORDER, CTL_FAIL, a->round, "%s", why);
    a->began[r] = 0;
  }
  a->round = 0;
  a->round_told = 0;
}

/* Names every rank in `list` that lacks what `bad` says. */
static int agent_coord_list(agent_t *a, int want_generators_only,
                            int (*bad)(agent_t *, int), char *buf, size_t len) {
  size_t used = 0;
  int n = 0;
  buf[0] = '\0';
  for (int r = want_generators_only ? a->ntrainer : 0; r < a->size; r++) {
    if (!bad(a, r))
      continue;
    char name[96];
    agent_rank_name(a, r, name, sizeof(name));
    if (n++ < 8 && used < len)
      used += (size_t)snprintf(buf + used, len - used, "%s%s", used ? ", " : "", name);
  }
  return n;
}
static int agent_coord_detached(agent_t *a, int r) { return !a->attached[r]; }
static int agent_coord_not_begun(agent_t *a, int r) { return a->began[r] != a->round; }

static void agent_coord_check(agent_t *a) {
  if (a->round == 0)
    return;
  char who[768], why[1024];
  const int missing = agent_coord_list(a, 0, agent_coord_detached, who, sizeof(who));
  /* Processes of one job start within moments of each other: a rank with no
   * process yet gets a short grace, not the refit's whole deadline. */
  if (missing > 0 && MPI_Wtime() - a->round_t0 > AGENT_ATTACH_GRACE_S) {
    snprintf(why, sizeof(why),
             "refit of version %llu refused: no framework process attached to the agent "
             "of %s%s within %.0f s (start it, or attach it with refit.attach)",
             (unsigned long long)a->round, who, missing > 8 ? ", ..." : "",
             AGENT_ATTACH_GRACE_S);
    agent_coord_fail(a, why);
    return;
  }
  int trainers_in = 1, all_in = 1;
  for (int r = 0; r < a->size; r++) {
    if (a->began[r] != a->round) {
      all_in = 0;
      if (r < a->ntrainer)
        trainers_in = 0;
    }
  }
  if (trainers_in && !a->round_told) {
    for (int r = a->ntrainer; r < a->size; r++)
      agent_ctl_send(a, r, TAG_ORDER, CTL_PENDING, a->round, NULL);
    a->round_told = 1;
  }
  if (all_in) {
    for (int r = 0; r < a->size; r++) {
      agent_ctl_send(a, r, TAG_ORDER, CTL_GO, a->round, NULL);
      a->began[r] = 0;
    }
    a->round = 0;
    a->round_told = 0;
    return;
  }
  if (MPI_Wtime() - a->round_t0 > a->set.timeout_s) {
    const int n = agent_coord_list(a, 0, agent_coord_not_begun, who, sizeof(who));
    snprintf(why, sizeof(why),
             "refit of version %llu abandoned: after %.0f s (refit.timeout_s) %s had not "
             "begun it%s",
             (unsigned long long)a->round, a->set.timeout_s, who, n > 8 ? ", ..." : "");
    agent_coord_fail(a, why);
  }
}

static void agent_coord_report(agent_t *a, const agent_ctl_t *m) {
  const int r = m->rank;
  char name[96], why[1024];
  agent_rank_name(a, r, name, sizeof(name));
  switch (m->kind) {
  case CTL_ATTACHED:
    a->attached[r] = 1;
    break;
  case CTL_DETACHED:
    a->attached[r] = 0;
    a->began[r] = 0;
    if (a->round != 0) {
      snprintf(why, sizeof(why),
               "refit of version %llu abandoned: the framework process (pid %d) of %s "
               "went away",
               (unsigned long long)a->round, m->pid, name);
      agent_coord_fail(a, why);
    }
    break;
  case CTL_BEGIN:
    if (a->round != 0 && m->version != a->round) {
      snprintf(why, sizeof(why),
               "begin %llu on %s: the job is refitting version %llu; every rank refits "
               "the same version",
               (unsigned long long)m->version, name, (unsigned long long)a->round);
      agent_ctl_send(a, r, TAG_ORDER, CTL_FAIL, m->version, "%s", why);
      break;
    }
    if (a->round == 0) {
      if (r >= a->ntrainer) {
        /* An engine ahead of the trainers: counted once they begin. */
        a->began[r] = m->version;
        break;
      }
      a->round = m->version;
      a->round_t0 = MPI_Wtime();
      a->round_told = 0;
      for (int k = 0; k < a->size; k++)
        if (a->began[k] != a->round)
          a->began[k] = 0;
    }
    a->began[r] = m->version;
    break;
  case CTL_QUIT:
    for (int k = 0; k < a->size; k++)
      agent_ctl_send(a, k, TAG_ORDER, CTL_QUIT, 0, "%s", m->text);
    break;
  default:
    break;
  }
  agent_coord_check(a);
}

/* ---- the client's memory ----------------------------------------------- */

static void agent_unmap_all(agent_t *a) {
  for (int i = 0; i < a->nmaps; i++) {
    if (a->maps[i].device) {
#ifdef REFIT_HAVE_CUDA
      refit_ipc_forget(a->maps[i].base);
      cudaIpcCloseMemHandle(a->maps[i].base);
#endif
    } else {
      munmap(a->maps[i].base, a->maps[i].bytes);
    }
  }
  a->nmaps = 0;
}

static agent_map_t *agent_map_add(agent_t *a) {
  if (a->nmaps == a->cap_maps) {
    const int cap = a->cap_maps ? 2 * a->cap_maps : 16;
    agent_map_t *n = realloc(a->maps, (size_t)cap * sizeof(*n));
    if (n == NULL)
      return NULL;
    a->maps = n;
    a->cap_maps = cap;
  }
  agent_map_t *m = &a->maps[a->nmaps];
  memset(m, 0, sizeof(*m));
  return m;
}

/* Map a shared-memory file once; *base its mapping. */
static int agent_map_fd(agent_t *a, int fd, agent_map_t **out, char *err, size_t len) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
    snprintf(err, len, "a descriptor that is not a shared-memory file of data");
    return -1;
  }
  for (int i = 0; i < a->nmaps; i++)
    if (!a->maps[i].device && a->maps[i].dev == st.st_dev &&
        a->maps[i].ino == st.st_ino && a->maps[i].bytes == (size_t)st.st_size) {
      *out = &a->maps[i];
      return 0;
    }
  void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    snprintf(err, len, "mmap of %lld bytes: %s", (long long)st.st_size, strerror(errno));
    return -1;
  }
  agent_map_t *m = agent_map_add(a);
  if (m == NULL) {
    munmap(p, (size_t)st.st_size);
    snprintf(err, len, "out of memory");
    return -1;
  }
  m->dev = st.st_dev;
  m->ino = st.st_ino;
  m->base = p;
  m->bytes = (size_t)st.st_size;
  a->nmaps++;
  *out = m;
  return 0;
}

static int agent_map_ipc(agent_t *a, const char *hex, size_t bytes, agent_map_t **out,
                         char *err, size_t len) {
  unsigned char h[64];
  if (refit_agent_unhex(hex, h, sizeof(h)) != 0) {
    snprintf(err, len, "'handle' is not 64 bytes of hex");
    return -1;
  }
  for (int i = 0; i < a->nmaps; i++)
    if (a->maps[i].device && memcmp(a->maps[i].handle, h, sizeof(h)) == 0) {
      /* Another tensor of the same allocation (PyTorch's caching allocator
       * cuts many from one block): each tells how far it reaches. */
      if (bytes > a->maps[i].bytes) {
        a->maps[i].bytes = bytes;
#ifdef REFIT_HAVE_CUDA
        refit_ipc_note(a->maps[i].base, bytes, h);
#endif
      }
      *out = &a->maps[i];
      return 0;
    }
#ifdef REFIT_HAVE_CUDA
  cudaIpcMemHandle_t handle;
  memcpy(&handle, h, sizeof(handle));
  void *p = NULL;
  const cudaError_t e = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    snprintf(err, len, "cudaIpcOpenMemHandle: %s", cudaGetErrorString(e));
    return -1;
  }
  agent_map_t *m = agent_map_add(a);
  if (m == NULL) {
    cudaIpcCloseMemHandle(p);
    snprintf(err, len, "out of memory");
    return -1;
  }
  m->device = 1;
  memcpy(m->handle, h, sizeof(h));
  m->base = p;
  m->bytes = bytes;
  a->nmaps++;
  /* Zero copy shares this memory with the engine's agent: with this handle. */
  refit_ipc_note(p, bytes, h);
  *out = m;
  return 0;
#else
  (void)bytes;
  (void)out;
  snprintf(err, len, "this agent was built without CUDA: it takes host memory only");
  return -1;
#endif
}

/* ---- replies ---------------------------------------------------------- */

static void agent_detach(agent_t *a, const char *why);

static void agent_reply(agent_t *a, json_t *j) {
  if (a->client < 0) {
    json_decref(j);
    return;
  }
  refit_status_t st = refit_agent_send(a->client, j, NULL, 0, 10.0);
  json_decref(j);
  if (st != REFIT_OK)
    agent_detach(a, refit_last_error());
}

static json_t *agent_ok(void) { return json_pack("{s:b}", "ok", 1); }

static json_t *agent_err(refit_status_t st, const char *fmt, ...) AGENT_PRINTF(2, 3);
static json_t *agent_err(refit_status_t st, const char *fmt, ...) {
  char text[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  return json_pack("{s:b,s:s,s:s}", "ok", 0, "status", refit_status_name(st), "error",
                   text);
}

/* The session's last error, with what other ranks said of their failures
 * (notices that came in while this rank failed: give them a moment). */
static json_t *agent_session_err(agent_t *a, refit_status_t st, const char *op) {
  char mine[1024];
  snprintf(mine, sizeof(mine), "%s", refit_last_error());
  agent_ctl_t m;
  const double until = MPI_Wtime() + 0.5;
  while (a->notices[0] == '\0' && MPI_Wtime() < until) {
    if (agent_ctl_poll(a, TAG_NOTICE, &m))
      snprintf(a->notices, sizeof(a->notices), "%s", m.text);
    else
      usleep(1000);
  }
  while (agent_ctl_poll(a, TAG_NOTICE, &m)) {
    const size_t used = strlen(a->notices);
    snprintf(a->notices + used, sizeof(a->notices) - used, "%s%s", used ? "; " : "",
             m.text);
  }
  json_t *j = agent_err(st, "%s on %s rank %d: %s%s%s", op, a->side, a->role_rank, mine,
                        a->notices[0] ? " (" : "", a->notices[0] ? a->notices : "");
  if (a->notices[0])
    json_object_set_new(j, "cause", json_string(a->notices));
  a->notices[0] = '\0';
  return j;
}

static json_t *agent_times(agent_t *a) {
  refit_times_t t = {0};
  refit_wire_stats_t w = {0};
  refit_last_times(a->s, &t);
  refit_last_wire_stats(a->s, &w);
  return json_pack("{s:f,s:f,s:f,s:f,s:f,s:f,s:{s:b,s:I,s:I,s:I,s:I}}", "source",
                   t.source, "pack", t.pack, "transfer", t.transfer, "land", t.land,
                   "commit", t.commit, "total", t.total, "wire", "delta", w.delta,
                   "wire_bytes", (json_int_t)w.wire_bytes, "full_bytes",
                   (json_int_t)w.full_bytes, "changed_bytes", (json_int_t)w.changed_bytes,
                   "written_bytes", (json_int_t)w.written_bytes);
}

static json_t *agent_status(agent_t *a) {
  return json_pack("{s:b,s:s,s:I,s:o}", "ok", 1, "state",
                   refit_state_str(refit_state(a->s)), "committed",
                   (json_int_t)refit_committed_version(a->s), "times", agent_times(a));
}

/* Tell every other rank why this rank fails the refit in flight. */
static void agent_notice(agent_t *a, const char *why) {
  char text[480];
  snprintf(text, sizeof(text),
           "%s rank %d (world rank %d): its framework process (pid %d) went away during "
           "the refit of version %llu: %s",
           a->side, a->role_rank, a->rank, a->client_pid, (unsigned long long)a->version,
           why);
  for (int r = 0; r < a->size; r++)
    if (r != a->rank)
      agent_ctl_send(a, r, TAG_NOTICE, CTL_NOTICE, a->version, "%s", text);
}

/* ---- the lifecycle on behalf of the client ------------------------------ */

static void *agent_stream(agent_t *a) {
#ifdef REFIT_HAVE_CUDA
  return a->device >= 0 ? (void *)a->stream : NULL;
#else
  (void)a;
  return NULL;
#endif
}

/* The client is gone or failed mid-refit: this rank votes no, so that every
 * rank reaches one outcome. */
static void agent_abandon(agent_t *a) {
  const refit_state_t state = refit_state(a->s);
  if (state == REFIT_STATE_RECEIVING || state == REFIT_STATE_READY) {
    refit_abort(a->s);
    refit_commit(a->s, agent_stream(a));
  }
}

static int agent_client_alive(agent_t *a) {
  if (a->client < 0)
    return 0;
  struct pollfd p = {a->client, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0)
    return 1;
  if (p.revents & (POLLHUP | POLLERR))
    return 0;
  char c;
  const ssize_t n = recv(a->client, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n != 0;
}

/* GO: the collective begin, then (op "refit") the whole refit. */
static void agent_go(agent_t *a, uint64_t v) {
  refit_status_t st = REFIT_OK;
  const int mine = a->begin_wait == v && a->client >= 0;
  const int all = a->begin_all;
  a->begin_wait = 0;
  a->begin_all = 0;
  a->pending = 0;
  a->version = v;
#ifdef REFIT_HAVE_CUDA
  if (mine && a->have_begin_ev)
    cudaStreamWaitEvent(a->stream, a->begin_ev, 0);
#endif
  st = refit_begin(a->s, v, agent_stream(a));
  if (!mine) {
    /* The client left between asking and the start: take part, vote no. */
    if (st == REFIT_OK) {
      agent_notice(a, "it left before the refit started");
      agent_abandon(a);
    }
    return;
  }
  if (st != REFIT_OK) {
    agent_reply(a, agent_session_err(a, st, "begin"));
    return;
  }
  if (!all) {
    agent_reply(a, json_pack("{s:b,s:I}", "ok", 1, "version", (json_int_t)v));
    return;
  }
  int done = 0;
  while (!done && st == REFIT_OK) {
    st = refit_progress(a->s, &done);
    if (st == REFIT_OK && !agent_client_alive(a)) {
      agent_detach(a, "the framework process went away during the refit");
      return;
    }
  }
  const refit_status_t cst = refit_commit(a->s, agent_stream(a));
  if (st == REFIT_OK)
    st = cst;
#ifdef REFIT_HAVE_CUDA
  if (a->device >= 0)
    cudaEventRecord(a->commit_ev, a->stream);
#endif
  if (st != REFIT_OK) {
    agent_reply(a, agent_session_err(a, st, "refit"));
    return;
  }
  json_t *j = json_pack("{s:b,s:I,s:o}", "ok", 1, "version", (json_int_t)v, "times",
                        agent_times(a));
  agent_reply(a, j);
}

/* ---- client operations -------------------------------------------------- */

/* The protocol's names of refit_tensor_dtype_t, in its order. */
static const char *const agent_dtypes[] = {"bfloat16", "float8_e4m3fn", "float8_e8m0fnu",
                                           "float32", "uint8"};
#define AGENT_NDTYPES ((int)(sizeof(agent_dtypes) / sizeof(agent_dtypes[0])))

static json_t *agent_expected(agent_t *a) {
  json_t *list = json_array();
  const int64_t n = refit_tensor_count(a->s);
  for (int64_t i = 0; i < n; i++) {
    refit_tensor_t t;
    if (refit_tensor_get(a->s, i, &t) != REFIT_OK)
      continue;
    json_t *shape = json_array();
    for (int d = 0; d < t.ndim; d++)
      json_array_append_new(shape, json_integer(t.shape[d]));
    json_array_append_new(list, json_pack("{s:s,s:o,s:s,s:I}", "name", t.name, "shape",
                                          shape, "dtype",
                                          (unsigned)t.dtype < (unsigned)AGENT_NDTYPES
                                              ? agent_dtypes[t.dtype]
                                              : "?",
                                          "bytes", (json_int_t)t.bytes));
  }
  return list;
}

static int agent_dtype(const char *name) {
  for (int i = 0; i < AGENT_NDTYPES; i++)
    if (name != NULL && strcmp(name, agent_dtypes[i]) == 0)
      return i;
  return -1;
}

/* Register a batch: every tensor checked against what the rank holds and
 * mapped before any is registered. */
static json_t *agent_register(agent_t *a, refit_agent_msg_t *msg) {
  json_t *list = json_object_get(msg->json, "tensors");
  if (!json_is_array(list))
    return agent_err(REFIT_ERR_INVALID_ARGUMENT, "register: 'tensors' must be a list");
  const size_t n = json_array_size(list);
  refit_tensor_t *ts = calloc(n ? n : 1, sizeof(*ts));
  char problems[2048] = "";
  size_t used = 0;
  int bad = 0;
  size_t skipped = 0;
#define AGENT_PROBLEM(...)                                                               \
  do {                                                                                   \
    if (bad++ < 8 && used < sizeof(problems))                                            \
      used += (size_t)snprintf(problems + used, sizeof(problems) - used, "%s",           \
                               used ? "; " : "");                                        \
    if (bad <= 8 && used < sizeof(problems))                                             \
      used += (size_t)snprintf(problems + used, sizeof(problems) - used, __VA_ARGS__);   \
  } while (0)
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(list, i);
    const char *name = json_string_value(json_object_get(e, "name"));
    const int dtype = agent_dtype(json_string_value(json_object_get(e, "dtype")));
    const json_int_t bytes = json_integer_value(json_object_get(e, "bytes"));
    const json_int_t offset = json_integer_value(json_object_get(e, "offset"));
    json_t *shape = json_object_get(e, "shape");
    if (name == NULL || dtype < 0 || !json_is_integer(json_object_get(e, "bytes")) ||
        bytes <= 0 || offset < 0 || !json_is_array(shape) || json_array_size(shape) > 3) {
      AGENT_PROBLEM(
          "entry %zu: needs name, dtype (bfloat16, float8_e4m3fn, "
          "float8_e8m0fnu, float32, uint8), bytes > 0, offset >= 0 and a shape of at most 3 "
          "dimensions",
          i);
      continue;
    }
    if (name != NULL && refit_tensor_skipped(a->s, name) != NULL) {
      skipped++; /* held by the trainer, no refit target: nothing to map */
      continue;
    }
    refit_tensor_t want;
    if (refit_tensor_find(a->s, name, &want) != REFIT_OK) {
      AGENT_PROBLEM("%s", refit_last_error());
      continue;
    }
    ts[i].name = name;
    ts[i].bytes = (size_t)bytes;
    ts[i].dtype = (refit_tensor_dtype_t)dtype;
    ts[i].ndim = (int)json_array_size(shape);
    for (int d = 0; d < ts[i].ndim; d++)
      ts[i].shape[d] = json_integer_value(json_array_get(shape, (size_t)d));
    char err[256] = "";
    agent_map_t *m = NULL;
    const char *handle = json_string_value(json_object_get(e, "handle"));
    const json_int_t fd_index = json_integer_value(json_object_get(e, "fd"));
    if (handle != NULL) {
      const json_int_t alloc = json_integer_value(json_object_get(e, "alloc_bytes"));
      if (alloc < offset + bytes)
        snprintf(err, sizeof(err),
                 "alloc_bytes %lld does not hold offset %lld + %lld bytes",
                 (long long)alloc, (long long)offset, (long long)bytes);
      else
        agent_map_ipc(a, handle, (size_t)alloc, &m, err, sizeof(err));
    } else if (json_is_integer(json_object_get(e, "fd")) && fd_index >= 0 &&
               fd_index < msg->nfds) {
      agent_map_fd(a, msg->fds[fd_index], &m, err, sizeof(err));
    } else {
      snprintf(
          err, sizeof(err),
          "names neither a descriptor of this message ('fd', 0 to %d) nor a CUDA IPC "
          "'handle'",
          msg->nfds - 1);
    }
    if (m != NULL && (size_t)(offset + bytes) > m->bytes)
      snprintf(err, sizeof(err),
               "offset %lld + %lld bytes passes the end of its %zu-byte "
               "allocation",
               (long long)offset, (long long)bytes, m->bytes);
    if (err[0] != '\0') {
      AGENT_PROBLEM("tensor '%s': %s", name, err);
      continue;
    }
    ts[i].data = (unsigned char *)m->base + offset;
  }
  json_t *reply;
  if (bad > 0) {
    reply =
        agent_err(REFIT_ERR_INVALID_ARGUMENT,
                  "register on %s rank %d: %d of %zu tensors refused, none registered: "
                  "%s%s",
                  a->side, a->role_rank, bad, n, problems, bad > 8 ? "; ..." : "");
  } else {
    refit_status_t st = REFIT_OK;
    for (size_t i = 0; i < n && st == REFIT_OK; i++)
      if (ts[i].name != NULL)
        st = refit_tensor_register(a->s, &ts[i]);
    reply = st == REFIT_OK ? json_pack("{s:b,s:I,s:I}", "ok", 1, "registered",
                                       (json_int_t)(n - skipped), "skipped",
                                       (json_int_t)skipped)
                           : agent_err(st, "register on %s rank %d: %s", a->side,
                                       a->role_rank, refit_last_error());
  }
  free(ts);
  return reply;
#undef AGENT_PROBLEM
}

static json_t *agent_hello(agent_t *a, refit_agent_msg_t *msg) {
  const json_int_t proto = json_integer_value(json_object_get(msg->json, "proto"));
  if (proto != REFIT_AGENT_PROTO)
    return agent_err(REFIT_ERR_INVALID_ARGUMENT,
                     "hello: protocol version %lld; this agent speaks version %d",
                     (long long)proto, REFIT_AGENT_PROTO);
  const char *side = json_string_value(json_object_get(msg->json, "side"));
  if (side != NULL && strcmp(side, a->side) != 0)
    return agent_err(REFIT_ERR_INVALID_ARGUMENT,
                     "hello: a %s process attached to the agent of %s rank %d (%s)", side,
                     a->side, a->role_rank, a->path);
  json_t *j = json_pack(
      "{s:b,s:i,s:s,s:i,s:i,s:i,s:i,s:s,s:s,s:I,s:s,s:o}", "ok", 1, "proto",
      REFIT_AGENT_PROTO, "side", a->side, "rank", a->role_rank, "world_rank", a->rank,
      "engine", refit_session_engine(a->s), "tp_rank", refit_session_tp_rank(a->s),
      "mode", a->set.async ? "async" : "sync", "memory", a->device >= 0 ? "cuda" : "host",
      "committed", (json_int_t)refit_committed_version(a->s), "state",
      refit_state_str(refit_state(a->s)), "expected", agent_expected(a));
  json_object_set_new(j, "device", json_integer(a->device));
#ifdef REFIT_HAVE_CUDA
  if (a->device >= 0) {
    const char *ev = json_string_value(json_object_get(msg->json, "begin_event"));
    unsigned char h[64];
    cudaIpcEventHandle_t eh;
    if (ev == NULL || refit_agent_unhex(ev, h, sizeof(h)) != 0) {
      json_decref(j);
      return agent_err(REFIT_ERR_INVALID_ARGUMENT,
                       "hello: a GPU rank needs 'begin_event', the CUDA IPC handle (64 "
                       "bytes of hex) of an interprocess event the client records on its "
                       "stream before each begin");
    }
    memcpy(&eh, h, sizeof(eh));
    if (a->have_begin_ev)
      cudaEventDestroy(a->begin_ev);
    a->have_begin_ev = cudaIpcOpenEventHandle(&a->begin_ev, eh) == cudaSuccess;
    cudaIpcEventHandle_t out;
    char hex[129];
    cudaIpcGetEventHandle(&out, a->commit_ev);
    refit_agent_hex((const unsigned char *)&out, sizeof(out), hex);
    json_object_set_new(j, "commit_event", json_string(hex));
    if (!a->have_begin_ev) {
      json_decref(j);
      return agent_err(REFIT_ERR_CUDA,
                       "hello: cudaIpcOpenEventHandle failed on 'begin_event'");
    }
  }
#endif
  return j;
}

/* One message of the attached client. */
static void agent_serve(agent_t *a) {
  refit_agent_msg_t msg;
  refit_status_t st = refit_agent_recv(a->client, &msg, 2.0);
  if (st != REFIT_OK) {
    agent_detach(a, refit_last_error());
    return;
  }
  const char *op = json_string_value(json_object_get(msg.json, "op"));
  if (op == NULL)
    op = "";
  const json_int_t version = json_integer_value(json_object_get(msg.json, "version"));
  json_t *reply = NULL;
  const refit_state_t state = refit_state(a->s);
  if (a->begin_wait != 0 || a->next_wait) {
    reply = agent_err(REFIT_ERR_STATE,
                      "%s: the previous request is still waiting (one "
                      "request at a time)",
                      op);
  } else if (strcmp(op, "register") == 0) {
    reply = agent_register(a, &msg);
  } else if (strcmp(op, "begin") == 0 || strcmp(op, "refit") == 0) {
    if (version <= 0) {
      reply =
          agent_err(REFIT_ERR_INVALID_ARGUMENT,
                    "%s %lld: versions start at 1 and increase", op, (long long)version);
    } else if (state != REFIT_STATE_IDLE && state != REFIT_STATE_POISONED) {
      reply = agent_err(REFIT_ERR_STATE, "%s %lld: a refit is already in progress (%s)",
                        op, (long long)version, refit_state_str(state));
    } else {
      a->begin_wait = (uint64_t)version;
      a->begin_all = strcmp(op, "refit") == 0;
      agent_ctl_send(a, 0, TAG_REPORT, CTL_BEGIN, (uint64_t)version, NULL);
    }
  } else if (strcmp(op, "next") == 0) {
    const double t = json_number_value(json_object_get(msg.json, "timeout_s"));
    const int forever = json_is_null(json_object_get(msg.json, "timeout_s")) ||
                        json_object_get(msg.json, "timeout_s") == NULL;
    if (a->trainer)
      reply =
          agent_err(REFIT_ERR_STATE,
                    "next: trainers decide the versions; a trainer calls begin or refit");
    else if (a->pending != 0)
      reply = json_pack("{s:b,s:I}", "ok", 1, "version", (json_int_t)a->pending);
    else if (!forever && t <= 0)
      reply = json_pack("{s:b,s:I}", "ok", 1, "version", (json_int_t)0);
    else {
      a->next_wait = 1;
      a->next_deadline = forever ? -1.0 : MPI_Wtime() + t;
    }
  } else if (strcmp(op, "progress") == 0) {
    int done = 0;
    st = refit_progress(a->s, &done);
    reply = st == REFIT_OK ? json_pack("{s:b,s:b}", "ok", 1, "done", done)
                           : agent_session_err(a, st, "progress");
  } else if (strcmp(op, "commit") == 0) {
    st = refit_commit(a->s, agent_stream(a));
#ifdef REFIT_HAVE_CUDA
    if (a->device >= 0)
      cudaEventRecord(a->commit_ev, a->stream);
#endif
    reply = st == REFIT_OK ? json_pack("{s:b,s:I,s:o}", "ok", 1, "version",
                                       (json_int_t)refit_committed_version(a->s), "times",
                                       agent_times(a))
                           : agent_session_err(a, st, "commit");
  } else if (strcmp(op, "abort") == 0) {
    st = refit_abort(a->s);
    reply = st == REFIT_OK ? agent_ok() : agent_session_err(a, st, "abort");
  } else if (strcmp(op, "verify") == 0) {
    /* Runtime storage against the config's reference of a version (source,
     * or reference: with source.kind caller): generators only. */
    int64_t bad = -1;
    const uint64_t v = version > 0 ? (uint64_t)version : refit_committed_version(a->s);
    st = refit_verify(a->s, v, &bad);
    reply = st == REFIT_OK ? json_pack("{s:b,s:I,s:I}", "ok", 1, "version", (json_int_t)v,
                                       "mismatches", (json_int_t)bad)
                           : agent_session_err(a, st, "verify");
  } else if (strcmp(op, "status") == 0) {
    reply = agent_status(a);
  } else if (strcmp(op, "shutdown") == 0) {
    agent_ctl_send(a, 0, TAG_REPORT, CTL_QUIT, 0, "shut down by the client of %s rank %d",
                   a->side, a->role_rank);
    reply = agent_ok();
  } else if (strcmp(op, "hello") == 0) {
    reply = agent_err(REFIT_ERR_STATE, "hello: already attached");
  } else {
    reply = agent_err(REFIT_ERR_INVALID_ARGUMENT,
                      "unknown op '%s' (hello, register, begin, progress, commit, abort, "
                      "refit, next, verify, status, shutdown)",
                      op);
  }
  refit_agent_msg_clear(&msg);
  if (reply != NULL)
    agent_reply(a, reply);
}

/* The client went away (or broke the protocol): fail what it had in
 * flight, drop its memory, wait for the next one. */
static void agent_detach(agent_t *a, const char *why) {
  if (a->client < 0)
    return;
  const refit_state_t state = refit_state(a->s);
  const int in_refit = state == REFIT_STATE_RECEIVING || state == REFIT_STATE_READY;
  agent_log(a, "client pid %d detached: %s%s", a->client_pid, why,
            in_refit ? " (during a refit: it fails on every rank)" : "");
  close(a->client);
  a->client = -1;
  if (in_refit) {
    agent_notice(a, why);
    agent_abandon(a);
  }
  a->begin_wait = 0;
  a->next_wait = 0;
  agent_ctl_send(a, 0, TAG_REPORT, CTL_DETACHED, 0, "%s", why);
  refit_status_t st = refit_tensor_forget_all(a->s);
  if (st != REFIT_OK)
    agent_log(a, "dropping the client's tensors: %s", refit_last_error());
  agent_unmap_all(a);
  a->client_pid = 0;
}

/* A new connection: the peer must be this user; one client at a time. */
static void agent_accept(agent_t *a) {
  const int fd = accept4(a->listen_fd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0)
    return;
  struct ucred cred;
  socklen_t len = sizeof(cred);
  json_t *refuse = NULL;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
      cred.uid != geteuid()) {
    agent_log(a, "refused a connection from uid %d (pid %d): only uid %d may attach",
              (int)cred.uid, (int)cred.pid, (int)geteuid());
    close(fd);
    return;
  }
  refit_agent_msg_t msg;
  if (refit_agent_recv(fd, &msg, 5.0) != REFIT_OK) {
    agent_log(a, "a connection from pid %d sent no valid hello: %s", (int)cred.pid,
              refit_last_error());
    close(fd);
    return;
  }
  /* A client that has exited but whose hang-up the loop has not served yet
   * (a framework process restarted at once, or another attaching right
   * after it left) no longer holds the rank. */
  if (a->client >= 0 && !agent_client_alive(a))
    agent_detach(a, "its connection was closed");
  const char *op = json_string_value(json_object_get(msg.json, "op"));
  if (op == NULL || strcmp(op, "hello") != 0)
    refuse =
        agent_err(REFIT_ERR_INVALID_ARGUMENT, "the first message must be hello, not %s",
                  op ? op : "a message without 'op'");
  else if (a->client >= 0)
    refuse =
        agent_err(REFIT_ERR_STATE,
                  "the agent of %s rank %d already serves pid %d; one framework process "
                  "attaches to a rank at a time",
                  a->side, a->role_rank, a->client_pid);
  if (refuse != NULL) {
    agent_log(a, "refused pid %d: %s", (int)cred.pid,
              json_string_value(json_object_get(refuse, "error")));
    refit_agent_send(fd, refuse, NULL, 0, 1.0);
    json_decref(refuse);
    refit_agent_msg_clear(&msg);
    close(fd);
    return;
  }
  a->client = fd;
  a->client_pid = (int)cred.pid;
  json_t *reply = agent_hello(a, &msg);
  refit_agent_msg_clear(&msg);
  const int ok = json_is_true(json_object_get(reply, "ok"));
  agent_reply(a, reply);
  if (!ok) {
    if (a->client >= 0)
      close(a->client);
    a->client = -1;
    a->client_pid = 0;
    return;
  }
  agent_log(a, "client pid %d attached", a->client_pid);
  agent_ctl_send(a, 0, TAG_REPORT, CTL_ATTACHED, 0, NULL);
}

/* ---- orders from rank 0 -------------------------------------------------- */

static void agent_order(agent_t *a, const agent_ctl_t *m) {
  switch (m->kind) {
  case CTL_PENDING:
    a->pending = m->version;
    if (a->next_wait) {
      a->next_wait = 0;
      agent_reply(a, json_pack("{s:b,s:I}", "ok", 1, "version", (json_int_t)m->version));
    }
    break;
  case CTL_GO:
    agent_go(a, m->version);
    break;
  case CTL_FAIL:
    if (a->pending == m->version)
      a->pending = 0;
    if (a->begin_wait != 0 && (m->version == 0 || a->begin_wait == m->version)) {
      a->begin_wait = 0;
      a->begin_all = 0;
      agent_reply(a, agent_err(REFIT_ERR_PEER, "%s", m->text));
    }
    break;
  case CTL_QUIT:
    agent_log(a, "%s", m->text);
    a->quit = 1;
    break;
  default:
    break;
  }
}

static int agent_listen(agent_t *a) {
  struct sockaddr_un addr = {0};
  addr.sun_family = AF_UNIX;
  if (strlen(a->path) >= sizeof(addr.sun_path)) {
    agent_log(a, "socket path %s is longer than %zu bytes; choose a shorter --socket-dir",
              a->path, sizeof(addr.sun_path) - 1);
    return -1;
  }
  memcpy(addr.sun_path, a->path, strlen(a->path) + 1); /* length checked above */
  /* A socket left by an earlier agent of this user is replaced; anything
   * else at the path is refused (never followed). */
  struct stat st;
  if (lstat(a->path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode) || st.st_uid != geteuid()) {
      agent_log(a, "%s exists and is not this user's socket; refusing to replace it",
                a->path);
      return -1;
    }
    unlink(a->path);
  }
  a->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const mode_t old = umask(0177);
  const int rc = bind(a->listen_fd, (struct sockaddr *)&addr, sizeof(addr));
  umask(old);
  if (rc != 0 || listen(a->listen_fd, 4) != 0) {
    agent_log(a, "listening on %s: %s", a->path, strerror(errno));
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  agent_t a = {0};
  const char *config = NULL, *dir = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--socket-dir") == 0 && i + 1 < argc)
      dir = argv[++i];
    else if (strcmp(argv[i], "--attach-grace") == 0 && i + 1 < argc)
      agent_attach_grace_s = atof(argv[++i]);
    else if (argv[i][0] != '-' && config == NULL)
      config = argv[i];
    else {
      config = NULL;
      break;
    }
  }
  if (config == NULL) {
    fprintf(stderr,
            "usage: refit-agent [--socket-dir DIR] [--attach-grace S] CONFIG.yaml (under "
            "mpirun or "
            "srun: launch/refit-launch CONFIG.yaml -- refit-agent CONFIG.yaml)\n");
    return 2;
  }
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &a.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &a.size);
  a.client = -1;
  a.listen_fd = -1;
  a.side = "?";
  refit_status_t st = refit_session_open(MPI_COMM_WORLD, config, &a.s);
  if (st != REFIT_OK) {
    fprintf(stderr, "refit-agent: rank %d: %s: %s\n", a.rank, refit_status_str(st),
            refit_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  refit_session_settings(a.s, &a.set);
  a.trainer = refit_session_side(a.s) == REFIT_SIDE_TRAINER;
  a.side = a.trainer ? "trainer" : "generator";
  a.device = refit_session_device(a.s);
  /* Trainers come first in the world: the count is where generators start. */
  int is_gen = !a.trainer, ngen = 0;
  MPI_Allreduce(&is_gen, &ngen, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  a.ntrainer = a.size - ngen;
  a.role_rank = a.trainer ? a.rank : a.rank - a.ntrainer;
  MPI_Comm_dup(MPI_COMM_WORLD, &a.ctl);
  MPI_Comm_set_errhandler(a.ctl, MPI_ERRORS_RETURN);
  refit_agent_socket_dir(dir, a.dir, sizeof(a.dir));
  refit_agent_socket_path(a.dir, a.side, a.role_rank, a.path, sizeof(a.path));
  int ok = refit_agent_dir_check(a.dir) == REFIT_OK;
  if (!ok)
    agent_log(&a, "%s", refit_last_error());
  if (ok)
    ok = agent_listen(&a) == 0;
#ifdef REFIT_HAVE_CUDA
  if (ok && a.device >= 0) {
    ok = cudaStreamCreateWithFlags(&a.stream, cudaStreamNonBlocking) == cudaSuccess &&
         cudaEventCreateWithFlags(&a.commit_ev, cudaEventDisableTiming |
                                                    cudaEventInterprocess) == cudaSuccess;
    if (!ok)
      agent_log(&a, "creating the agent's stream and commit event failed");
  }
#endif
  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    refit_session_close(a.s);
    MPI_Finalize();
    return 1;
  }
  if (a.rank == 0) {
    a.attached = calloc((size_t)a.size, sizeof(int));
    a.began = calloc((size_t)a.size, sizeof(uint64_t));
  }
  struct sigaction sa = {0};
  sa.sa_handler = agent_on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  agent_log(&a, "listening on %s", a.path);
  fflush(stderr);
  MPI_Barrier(MPI_COMM_WORLD);
  if (a.rank == 0) {
    char ready[600];
    snprintf(ready, sizeof(ready), "%s/ready", a.dir);
    FILE *f = fopen(ready, "w");
    if (f != NULL) {
      fprintf(f, "%d\n", a.size);
      fclose(f);
    }
  }

  while (!a.quit && !agent_stop) {
    /* Busy while a round is on (latency of a refit's start), idle otherwise. */
    const int busy = a.begin_wait != 0 || a.next_wait || (a.rank == 0 && a.round != 0);
    struct pollfd p[2] = {{a.listen_fd, POLLIN, 0}, {a.client, POLLIN, 0}};
    const int n = poll(p, a.client >= 0 ? 2 : 1, busy ? 0 : 5);
    if (n > 0 && (p[0].revents & POLLIN))
      agent_accept(&a);
    if (n > 0 && a.client >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR)))
      agent_serve(&a);
    agent_ctl_t m;
    if (a.rank == 0) {
      while (agent_ctl_poll(&a, TAG_REPORT, &m))
        agent_coord_report(&a, &m);
      agent_coord_check(&a);
    }
    while (!a.quit && agent_ctl_poll(&a, TAG_ORDER, &m))
      agent_order(&a, &m);
    /* Notices that arrive outside a failure are stale by the next refit. */
    if (refit_state(a.s) == REFIT_STATE_IDLE)
      while (agent_ctl_poll(&a, TAG_NOTICE, &m))
        ;
    if (a.next_wait && a.next_deadline >= 0 && MPI_Wtime() > a.next_deadline) {
      a.next_wait = 0;
      agent_reply(&a, json_pack("{s:b,s:I}", "ok", 1, "version", (json_int_t)0));
    }
    agent_ctl_reap(&a);
  }
  if (a.client >= 0)
    close(a.client);
  close(a.listen_fd);
  unlink(a.path);
  refit_session_close(a.s);
  agent_unmap_all(&a);
  free(a.maps);
  free(a.attached);
  free(a.began);
  if (a.quit) {
    /* Every rank was told: a clean end of the job. */
    while (a.nsends > 0)
      agent_ctl_reap(&a);
    free(a.sends);
    MPI_Comm_free(&a.ctl);
    MPI_Finalize();
    return 0;
  }
  /* A signal: the other ranks may be anywhere; do not wait on them. */
  fprintf(stderr, "refit-agent: rank %d stopped by a signal\n", a.rank);
  _exit(0);
}
