/*
 * refit-run [--status-dir DIR] [--pause SECONDS] CONFIG [CONFIG...]: run refits
 * as the config says, under mpirun or srun. The first trainer.tp*pp*dp ranks are
 * trainers, the next generator.tp*engines generators. It drives the public API
 * (refit/refit.h) the way a trainer and an inference engine would, simulating the
 * serving side: generators keep reading their runtime weights between progress
 * calls in async mode, and the longest pause between two serving steps is
 * reported as the stall.
 *
 * Prints a per-phase timing table and the verification result; exits 0 only
 * when every refit committed and verified (or, with verify off, committed).
 *
 * Several configs run one after another in one job, for tests that would
 * otherwise pay a job's start-up for each (refit_run_configs): the job starts
 * the largest world size among them; for each config the first ranks, as
 * many as it needs, open a session on a communicator of their own and run it
 * exactly as a job of its own would, while the others wait; every rank meets
 * before the next config. Rank 0 opens each config's output with "refit-run:
 * config I of N: PATH" and closes it with "refit-run: config I of N ended:
 * exit status S (T s)", T its wall time. A failed config does not stop the
 * ones after it; the job's exit status is the largest of theirs (0 only when
 * every config succeeded). A lost peer ends the whole job with status 3: its
 * config's ranks leave (refit_run_lost), and the waiting ranks once they
 * find a process of the job gone (refit_run_meet: on their own host).
 *
 * --status-dir DIR: for tests that judge a job from outside (a chaos test
 * that kills ranks); one config only. Once its session is open each rank
 * writes DIR/rank.R.pid (its process id and side), and on every way out
 * DIR/rank.R.status: key=value lines with rank, side, engine and tp rank,
 * how and in which phase it ended, the error, the committed version, the
 * state, and on generators the result of verifying runtime storage against
 * the committed version and a digest of that storage. Both are written to a temporary
 * name and renamed, so a reader never sees half a file. A rank that leaves because a peer
 * is lost names it: the status file's `lost=` line holds the ranks, and the error and the
 * message on stderr say how each was found lost (refit_run_probe).
 *
 * --pause SECONDS: sleep between a refit's commit (and report) and the next
 * begin, as a training step would; a chaos test kills ranks in that gap.
 */
#include "refit/plan.h"
#include "refit/refit.h"

#include <errno.h>
#include <mpi.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

/* One serving step: read 4 MiB of runtime weights, rotating through the
 * tensors the way successive layers of a forward pass read them; on the host
 * a loop, on a GPU one kernel (refit_tensor_touch). Returns a value so the
 * reads are not optimized away. */
static uint64_t refit_run_serve(refit_session_h s, int64_t *cursor) {
  const int64_t n = refit_tensor_count(s);
  uint64_t value = 0;
  if (n == 0 ||
      refit_tensor_touch(s, (*cursor)++ % n, (size_t)4 << 20, &value) != REFIT_OK)
    return 0;
  return value;
}

static volatile uint64_t refit_run_sink;

typedef struct {
  double stall; /* longest pause between serving steps during the refit */
  refit_status_t st;
  const char *phase; /* where it failed: begin, transfer or commit */
} refit_run_outcome_t;

/* One refit through the lifecycle. Generators in async mode serve between
 * progress calls; in sync mode serving pauses for the whole refit. */
static refit_run_outcome_t refit_run_one(refit_session_h s, uint64_t version, int async,
                                         uint64_t *sink) {
  refit_run_outcome_t o = {0, REFIT_OK, "begin"};
  const int generator = refit_session_side(s) == REFIT_SIDE_GENERATOR;
  const int serving = async && generator;
  int64_t cursor = 0;
  double last = MPI_Wtime();
  int done = 0;
#define REFIT_RUN_SERVED()                                                               \
  do {                                                                                   \
    double now_ = MPI_Wtime();                                                           \
    if (now_ - last > o.stall)                                                           \
      o.stall = now_ - last;                                                             \
    last = now_;                                                                         \
  } while (0)

  o.st = refit_begin(s, version, NULL);
  if (o.st != REFIT_OK)
    return o;
  o.phase = "transfer";
  while (!done && o.st == REFIT_OK) {
    if (serving) {
      *sink += refit_run_serve(s, &cursor);
      REFIT_RUN_SERVED();
    }
    o.st = refit_progress(s, &done);
  }
  if (serving) {
    *sink += refit_run_serve(s, &cursor);
    REFIT_RUN_SERVED();
  }
  /* Every rank votes, also one whose part failed: nobody waits for it.
   * The commit's message then carries the earlier failure. */
  refit_status_t cst = refit_commit(s, NULL);
  if (o.st == REFIT_OK && cst != REFIT_OK)
    o.phase = "commit";
  if (o.st == REFIT_OK || cst != REFIT_ERR_STATE)
    o.st = cst == REFIT_OK ? o.st : cst;
  REFIT_RUN_SERVED();
  refit_times_t t;
  refit_last_times(s, &t);
  if (!generator) /* trainers serve nothing: no stall to report */
    o.stall = 0;
  else if (!serving) /* sync: nothing was served from begin to here */
    o.stall = t.total > 0 ? t.total : o.stall;
#undef REFIT_RUN_SERVED
  return o;
}

/* A rank as refit_run_probe knows it: process id, side and host. */
typedef struct {
  int pid;
  int generator;
  char host[64];
} refit_run_peer_t;

/* Where and how this rank's run ended, for the status file. */
typedef struct {
  const char *dir; /* --status-dir, or NULL */
  int rank;
  const char *phase; /* open, begin, transfer, commit, verify, report, dump,
                        summary, or "" when nothing failed */
  char error[768];
  /* Naming a lost peer (refit_run_probe): a communicator of its own, and
   * every rank's process id, side and host, gathered once the session is
   * open; alive is MPI_COMM_NULL before that. */
  MPI_Comm alive;
  int size;
  refit_run_peer_t *peers;
  double timeout_s;
  char lost_ranks[256]; /* "3" or "1,3": the ranks named lost, for judges */
  char lost[1024];      /* the same with how each was found lost */
} refit_run_status_t;

/* Write `text` to DIR/NAME through a temporary file and a rename. */
static void refit_run_status_put(const char *dir, const char *name, const char *text) {
  char tmp[1200], path[1200];
  snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, name);
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(tmp, "w");
  if (f == NULL) {
    fprintf(stderr, "refit-run: cannot write %s\n", tmp);
    return;
  }
  fputs(text, f);
  if (fclose(f) != 0 || rename(tmp, path) != 0)
    fprintf(stderr, "refit-run: cannot write %s\n", path);
}

/* The status file: what an outside checker needs to judge this rank. The
 * digest is FNV-1a over every runtime store in order (host memory only; on
 * a GPU it is left out and the verification result stands alone). */
static void refit_run_status_write(const refit_run_status_t *rs, refit_session_h s,
                                   const char *exit_reason) {
  if (rs->dir == NULL)
    return;
  char text[4096];
  int n = 0;
  struct timeval tv;
  gettimeofday(&tv, NULL);
#define PUT(...)                                                                         \
  do {                                                                                   \
    if (n < (int)sizeof(text))                                                           \
      n += snprintf(text + n, sizeof(text) - (size_t)n, __VA_ARGS__);                    \
  } while (0)
  PUT("rank=%d\npid=%d\ntime=%.3f\nexit=%s\nphase=%s\n", rs->rank, (int)getpid(),
      (double)tv.tv_sec + (double)tv.tv_usec * 1e-6, exit_reason,
      rs->phase[0] ? rs->phase : "none");
  /* One line: the message may hold newlines. */
  PUT("error=");
  for (const char *c = rs->error; *c; c++)
    PUT("%c", *c == '\n' ? ' ' : *c);
  PUT("\n");
  if (rs->lost_ranks[0] != '\0')
    PUT("lost=%s\n", rs->lost_ranks);
  if (s != NULL) {
    const int gen = refit_session_side(s) == REFIT_SIDE_GENERATOR;
#define REFIT_RUN_STATE_NAME_(name, text) #name,
    static const char *const states[] = {REFIT_STATE_MAP(REFIT_RUN_STATE_NAME_)};
#undef REFIT_RUN_STATE_NAME_
    const refit_state_t state = refit_state(s);
    const uint64_t committed = refit_committed_version(s);
    PUT("side=%s\nengine=%d\ntp_rank=%d\ncommitted=%llu\nstate=%s\n",
        gen ? "generator" : "trainer", refit_session_engine(s), refit_session_tp_rank(s),
        (unsigned long long)committed, states[state]);
    if (gen) {
      /* Verifying is local (no collective): safe with peers dead. */
      int64_t bad = 0;
      if (state == REFIT_STATE_POISONED)
        PUT("verify=skipped (poisoned)\n");
      else if (committed == 0)
        PUT("verify=skipped (no version committed)\n");
      else if (refit_verify(s, committed, &bad) != REFIT_OK)
        PUT("verify=error: %s\n", refit_last_error());
      else if (bad != 0)
        PUT("verify=mismatch %lld\n", (long long)bad);
      else
        PUT("verify=ok\n");
      uint64_t h;
      if (refit_tensor_digest(s, &h) == REFIT_OK)
        PUT("digest=%016llx\n", (unsigned long long)h);
    }
  }
  PUT("end\n");
#undef PUT
  char name[64];
  snprintf(name, sizeof(name), "rank.%d.status", rs->rank);
  refit_run_status_put(rs->dir, name, text);
}

/* Record a failure: the first one is the one reported. */
static void refit_run_fail(refit_run_status_t *rs, const char *phase, const char *fmt,
                           ...) __attribute__((format(printf, 3, 4)));
static void refit_run_fail(refit_run_status_t *rs, const char *phase, const char *fmt,
                           ...) {
  if (rs->phase[0] != '\0')
    return;
  rs->phase = phase;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rs->error, sizeof(rs->error), fmt, ap);
  va_end(ap);
}

/* Whether the process `pid` of this host is gone: none with that id, or
 * one that has exited and waits to be reaped (a zombie). */
static int refit_run_pid_gone(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH)
    return 1;
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 0; /* no /proc: the answer, or its absence, decides */
  const size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *c = strrchr(buf, ')'); /* the command name may hold spaces */
  return c != NULL && c[1] == ' ' && (c[2] == 'Z' || c[2] == 'X');
}

/*
 * Name the peers that are lost, once, before a rank leaves through
 * refit_run_lost. The session's collectives say only that not every rank
 * joined, and its header exchange and vote only whose message did not
 * arrive, not whether that peer is dead; this asks each peer directly. The rank sends
 * every peer a synchronous hello (MPI_Issend) and listens for theirs on a communicator of
 * its own. A peer is accounted for when its hello arrived and it took ours; it is lost
 * when its process is gone (a peer on this host, checked by process id), when talking to
 * it fails, or when it does neither within refit.timeout_s. Because a rank's probe ends
 * only once every live peer took its hello, a survivor that leaves first is not mistaken
 * for a dead one by a survivor that probes later (within the bound). Requests to lost
 * peers are left pending and their buffers kept: the process exits next.
 */
static void refit_run_probe(refit_run_status_t *rs) {
  if (rs->alive == MPI_COMM_NULL || rs->lost[0] != '\0')
    return;
  enum { PENDING, ANSWERED, GONE, FAILED, SILENT };
  static const char *const how[] = {"", "", "process gone", "MPI error",
                                    "no answer within refit.timeout_s"};
  const int n = rs->size, tag = 0x5fe;
  static int me;
  me = rs->rank;
  int *hello = calloc((size_t)n, sizeof(int)), *state = calloc((size_t)n, sizeof(int));
  MPI_Request *req = malloc(2 * (size_t)n * sizeof(MPI_Request));
  if (hello == NULL || state == NULL || req == NULL)
    return;
  for (int p = 0; p < n; p++) {
    req[2 * p] = req[2 * p + 1] = MPI_REQUEST_NULL;
    if (p == rs->rank) {
      state[p] = ANSWERED;
      continue;
    }
    if (MPI_Irecv(&hello[p], 1, MPI_INT, p, tag, rs->alive, &req[2 * p]) != MPI_SUCCESS ||
        MPI_Issend(&me, 1, MPI_INT, p, tag, rs->alive, &req[2 * p + 1]) != MPI_SUCCESS)
      state[p] = FAILED;
  }
  const double deadline = MPI_Wtime() + rs->timeout_s;
  for (int pending = 1; pending && MPI_Wtime() < deadline;) {
    pending = 0;
    for (int p = 0; p < n; p++) {
      if (state[p] != PENDING)
        continue;
      int done[2] = {0, 0};
      for (int k = 0; k < 2; k++)
        if (MPI_Test(&req[2 * p + k], &done[k], MPI_STATUS_IGNORE) != MPI_SUCCESS)
          state[p] = FAILED;
      if (state[p] == PENDING && done[0] && done[1])
        state[p] = ANSWERED;
      else if (state[p] == PENDING &&
               strcmp(rs->peers[p].host, rs->peers[rs->rank].host) == 0 &&
               refit_run_pid_gone(rs->peers[p].pid))
        state[p] = GONE;
      pending += state[p] == PENDING;
    }
    if (pending)
      usleep(1000);
  }
  int m = 0, k = 0;
  for (int p = 0; p < n; p++) {
    if (state[p] == PENDING)
      state[p] = SILENT;
    if (state[p] == ANSWERED)
      continue;
    if (m < (int)sizeof(rs->lost_ranks))
      m += snprintf(rs->lost_ranks + m, sizeof(rs->lost_ranks) - (size_t)m, "%s%d",
                    m ? "," : "", p);
    if (k < (int)sizeof(rs->lost))
      k += snprintf(rs->lost + k, sizeof(rs->lost) - (size_t)k,
                    "%srank %d (%s, pid %d on %s): %s", k ? "; " : "", p,
                    rs->peers[p].generator ? "generator" : "trainer", rs->peers[p].pid,
                    rs->peers[p].host, how[state[p]]);
  }
  if (k == 0)
    snprintf(rs->lost, sizeof(rs->lost), "every rank answered (a peer stalled)");
}

/* A peer is dead or stalled: no collective can complete, MPI_Finalize
 * included. Name it (refit_run_probe), write the status file and leave
 * without MPI_Finalize. */
static void refit_run_lost(refit_run_status_t *rs, refit_session_h s) {
  refit_run_probe(rs);
  if (rs->lost[0] != '\0') {
    const size_t len = strlen(rs->error);
    snprintf(rs->error + len, sizeof(rs->error) - len, "%slost: %s", len ? "; " : "",
             rs->lost);
  }
  fprintf(stderr,
          "refit-run: rank %d: a peer is lost%s%s; exiting without MPI_Finalize\n",
          rs->rank, rs->lost[0] ? ": " : "", rs->lost);
  refit_run_status_write(rs, s, "peer_lost");
  fflush(stderr);
  fflush(stdout);
  _exit(3);
}

/* Wait for the request of a collective that `rc` started until refit.timeout_s
 * has passed; on a deadline or an MPI error, record the failure in `phase`
 * and leave through refit_run_lost: a collective that never completed
 * cannot be abandoned. */
static void refit_run_wait(refit_run_status_t *rs, refit_session_h s, const char *phase,
                           int rc, MPI_Request *req) {
  const double deadline = MPI_Wtime() + rs->timeout_s;
  int done = 0;
  while (rc == MPI_SUCCESS && !done && MPI_Wtime() < deadline) {
    rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS && !done)
      usleep(100); /* leave the core to the ranks being waited for */
  }
  if (rc == MPI_SUCCESS && done)
    return;
  char why[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  if (rc != MPI_SUCCESS)
    MPI_Error_string(rc, why, &len);
  fprintf(stderr, "refit-run: rank %d: %s: %s\n", rs->rank, phase,
          rc != MPI_SUCCESS ? why : "not every rank took part within refit.timeout_s");
  refit_run_fail(rs, phase, "%s: %s (timeout_s %g)", phase,
                 rc != MPI_SUCCESS ? why
                                   : "not every rank took part in the collective "
                                     "within refit.timeout_s: a peer is lost",
                 rs->timeout_s);
  refit_run_lost(rs, s);
}

/*
 * refit-run's own reductions (the timing table, mismatch counts, the
 * verdict) over `comm` (errors returned): non-blocking and polled against
 * refit.timeout_s (refit_run_wait), so a peer that dies after the last
 * refit's vote (while its neighbours verify, say) is an error naming the
 * phase, not a hang in a blocking MPI_Reduce. root < 0: every rank gets the
 * result.
 */
static void refit_run_reduce(refit_run_status_t *rs, refit_session_h s, MPI_Comm comm,
                             const char *phase, const void *in, void *out, int count,
                             MPI_Datatype type, MPI_Op op, int root) {
  MPI_Request req;
  int rc;
  if (root < 0)
    rc = MPI_Iallreduce(in, out, count, type, op, comm, &req);
  else
    rc = MPI_Ireduce(in, out, count, type, op, root, comm, &req);
  refit_run_wait(rs, s, phase, rc, &req);
}

/* The command line (see the comment at the top). */
typedef struct {
  const char *status_dir; /* or NULL */
  double pause_s;
  char **configs; /* argv's, in order */
  int nconfigs;
} refit_run_options_t;

/* Read the command line into `opt`: -1 to run, else the exit status (0 for
 * --help, 2 for a usage error, with the usage printed). */
static int refit_run_args(int argc, char **argv, refit_run_options_t *opt) {
  int usage = 0, help = 0;
  *opt = (refit_run_options_t){.configs = argv + argc};
  for (int a = 1; a < argc && !usage; a++) {
    if (strcmp(argv[a], "--status-dir") == 0 && a + 1 < argc)
      opt->status_dir = argv[++a];
    else if (strcmp(argv[a], "--pause") == 0 && a + 1 < argc)
      usage = (opt->pause_s = atof(argv[++a])) < 0;
    else if (strcmp(argv[a], "--help") == 0 || strcmp(argv[a], "-h") == 0)
      help = usage = 1;
    else if (argv[a][0] != '-' &&
             (opt->nconfigs == 0 || argv + a == opt->configs + opt->nconfigs)) {
      if (opt->nconfigs++ == 0)
        opt->configs = argv + a;
    } else
      usage = 1;
  }
  if (!usage && opt->nconfigs > 1 && opt->status_dir != NULL) {
    fprintf(stderr, "refit-run: --status-dir takes one config, got %d\n", opt->nconfigs);
    usage = 1;
  }
  if (!usage && opt->nconfigs > 0)
    return -1;
  fprintf(stderr,
          "usage: refit-run [--status-dir DIR] [--pause SECONDS] CONFIG.yaml "
          "[CONFIG.yaml...]\n"
          "  under mpirun/srun, or launch/refit-launch CONFIG.yaml; several configs:\n"
          "  launch/refit-launch --np N CONFIG.yaml -- refit-run CONFIG.yaml...\n"
          "Several configs run one after another in one job of N ranks, the largest\n"
          "world size among them; a failed config does not stop the ones after it.\n"
          "Exit status: the largest of the configs' (0: every config succeeded; 1: a\n"
          "refit failed; 2: a config did not open), 3 when a peer is lost (that ends\n"
          "the job). --status-dir takes one config.\n");
  return help ? 0 : 2;
}

/* One config's run on this rank: its session and what its report needs. */
typedef struct {
  const char *config;
  double pause_s;
  int rank;
  refit_session_h s;
  refit_settings_t cfg;
  refit_run_status_t rs;
  MPI_Comm report; /* refit-run's reductions (refit_run_reduce) */
  refit_plan_summary_t pst;
  int gen;
  int failed; /* a refit or the dump failed on this rank */
  int64_t total_bad;
  double mem_local[3]; /* generators: staging, assembly arena, runtime tensors */
  uint64_t sink;
} refit_run_job_t;

/* Open the session on `comm`; on failure write the status file and return 2
 * (a peer that never joined leaves through refit_run_lost). */
static int refit_run_open(refit_run_job_t *j, MPI_Comm comm) {
  refit_status_t st = refit_session_open(comm, j->config, &j->s);
  if (st == REFIT_OK)
    return 0;
  if (st != REFIT_ERR_PEER)
    fprintf(stderr, "refit-run: rank %d: %s: %s\n", j->rank, refit_status_str(st),
            refit_last_error());
  refit_run_fail(&j->rs, "open", "%s: %s", refit_status_str(st), refit_last_error());
  if (st == REFIT_ERR_TIMEOUT)
    refit_run_lost(&j->rs, NULL); /* a peer never joined: MPI_Finalize would wait too */
  refit_run_status_write(&j->rs, NULL, "failed");
  return 2;
}

/* After open: the settings, refit-run's communicators, every rank's process
 * id, side and host (to name a lost peer), and the pid file. */
static void refit_run_start(refit_run_job_t *j, MPI_Comm comm) {
  refit_run_status_t *rs = &j->rs;
  refit_session_settings(j->s, &j->cfg);
  rs->timeout_s = j->cfg.timeout_s;
  /* refit-run's reports travel on a communicator of their own, and the
   * probe that names a lost peer on another, both with errors returned: a
   * lost peer is then a failed reduction, not an abort. Duplicated and
   * gathered under the deadline: a peer may die here too. */
  MPI_Comm alive;
  MPI_Request req;
  refit_run_wait(rs, j->s, "start-up", MPI_Comm_idup(comm, &j->report, &req), &req);
  refit_run_wait(rs, j->s, "start-up", MPI_Comm_idup(comm, &alive, &req), &req);
  MPI_Comm_set_errhandler(j->report, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(alive, MPI_ERRORS_RETURN);
  MPI_Comm_size(comm, &rs->size);
  rs->peers = calloc((size_t)rs->size, sizeof(*rs->peers));
  if (rs->peers == NULL) {
    fprintf(stderr, "refit-run: rank %d: out of memory\n", j->rank);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  refit_run_peer_t *mine = &rs->peers[j->rank];
  mine->pid = (int)getpid();
  mine->generator = j->gen = refit_session_side(j->s) == REFIT_SIDE_GENERATOR;
  gethostname(mine->host, sizeof(mine->host) - 1);
  refit_run_wait(rs, j->s, "start-up",
                 MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, rs->peers,
                                (int)sizeof(*rs->peers), MPI_BYTE, alive, &req),
                 &req);
  rs->alive = alive;
  /* The pid file says the rank is ready to be judged: its session is open
   * and a lost peer can be named. */
  if (rs->dir != NULL) {
    char pid[64], name[64];
    snprintf(pid, sizeof(pid), "%d %s\n", (int)getpid(),
             mine->generator ? "generator" : "trainer");
    snprintf(name, sizeof(name), "rank.%d.pid", j->rank);
    refit_run_status_put(rs->dir, name, pid);
  }
}

/* Rank 0 describes the session and heads the table; every generator counts
 * its memory beyond its runtime tensors, for the summary. */
static void refit_run_banner(refit_run_job_t *j) {
  if (j->rank == 0) {
    char desc[2048];
    refit_session_describe(j->s, desc, sizeof(desc));
    printf("refit-run %s: %s\n", j->config, desc);
    /* refit_s leaves out source_s: producing the weights is the training
     * step's job. GB/s = bytes moved per refit / refit_s. */
    printf("\n%6s %8s %9s %9s %10s %9s %9s %9s %9s %9s %8s  %s\n", "refit", "version",
           "source_s", "pack_s", "transfer_s", "land_s", "commit_s", "total_s", "refit_s",
           "stall_s", "GB/s", "result");
    fflush(stdout);
  }
  refit_session_plan_summary(j->s, &j->pst);
  if (j->gen) {
    j->mem_local[0] = (double)j->pst.staging_bytes;
    for (int64_t i = 0; i < refit_tensor_count(j->s); i++) {
      refit_tensor_t t;
      if (refit_tensor_get(j->s, i, &t) == REFIT_OK)
        j->mem_local[2] += (double)t.bytes;
    }
  }
}

/* A refit that did not commit: say so, check what the generator serves now
 * (the last committed version), and leave if a peer is lost. */
static void refit_run_aborted(refit_run_job_t *j, int step, uint64_t version,
                              const refit_run_outcome_t *o) {
  refit_session_h s = j->s;
  const int rank = j->rank;
  j->failed = 1;
  fprintf(stderr, "refit-run: rank %d: refit of version %llu failed: %s: %s\n", rank,
          (unsigned long long)version, refit_status_str(o->st), refit_last_error());
  refit_run_fail(&j->rs, o->phase, "refit of version %llu failed in %s: %s: %s",
                 (unsigned long long)version, o->phase, refit_status_str(o->st),
                 refit_last_error());
  /* What the generator serves now must be the last committed version. */
  const uint64_t kept = refit_committed_version(s);
  if (refit_session_side(s) == REFIT_SIDE_GENERATOR) {
    int64_t bad = 0;
    if (refit_state(s) == REFIT_STATE_POISONED)
      fprintf(stderr,
              "refit-run: rank %d: POISONED: runtime storage may mix "
              "versions; refusing to serve until a full refit\n",
              rank);
    else if (kept > 0 && refit_verify(s, kept, &bad) == REFIT_OK)
      fprintf(stderr,
              "refit-run: rank %d: runtime storage holds version "
              "%llu: %s\n",
              rank, (unsigned long long)kept,
              bad == 0 ? "verified bit for bit" : "MISMATCH");
    if (bad != 0)
      j->total_bad += bad;
  }
  fflush(stderr);
  if (refit_session_broken(s))
    refit_run_lost(&j->rs, s);
  if (rank == 0)
    printf("%6d %8llu %9s %9s %10s %9s %9s %9s %9s %9s %8s  aborted: kept "
           "version %llu\n",
           step, (unsigned long long)version, "-", "-", "-", "-", "-", "-", "-", "-", "-",
           (unsigned long long)kept);
}

/* A committed refit: verify it, and rank 0 prints its row (the largest time
 * of each phase over ranks) and, for delta refits, its wire line. */
static void refit_run_row(refit_run_job_t *j, int step, uint64_t version,
                          const refit_run_outcome_t *o) {
  refit_run_status_t *rs = &j->rs;
  refit_times_t t;
  refit_last_times(j->s, &t);
  int64_t bad = 0, bad_all = 0;
  if (j->cfg.verify) {
    if (refit_verify(j->s, version, &bad) != REFIT_OK) {
      fprintf(stderr, "refit-run: rank %d: verify: %s\n", j->rank, refit_last_error());
      refit_run_fail(rs, "verify", "verify of version %llu: %s",
                     (unsigned long long)version, refit_last_error());
      bad = bad ? bad : 1;
    }
    if (bad != 0)
      refit_run_fail(rs, "verify", "version %llu: %lld elements differ",
                     (unsigned long long)version, (long long)bad);
  }
  double local[8] = {t.source, t.pack,  t.transfer, t.land,
                     t.commit, t.total, o->stall,   0};
  double maxes[8];
  refit_run_reduce(rs, j->s, j->report, "report", local, maxes, 8, MPI_DOUBLE, MPI_MAX,
                   0);
  refit_run_reduce(rs, j->s, j->report, "report", &bad, &bad_all, 1, MPI_INT64_T, MPI_SUM,
                   -1);
  j->total_bad += bad_all;
  /* Delta refits: the trainers' bytes on the wire against a full refit's,
   * and the generators' runtime bytes changed and written. */
  double wire_local[5] = {0, 0, 0, 0, 0}, wire_sum[5] = {0, 0, 0, 0, 0};
  refit_wire_stats_t ws;
  if (j->cfg.delta != 0 && refit_last_wire_stats(j->s, &ws) == REFIT_OK) {
    if (!j->gen) {
      wire_local[0] = (double)ws.wire_bytes;
      wire_local[1] = (double)ws.full_bytes;
      wire_local[2] = ws.delta;
    } else {
      wire_local[3] = (double)ws.changed_bytes;
      wire_local[4] = (double)ws.written_bytes;
    }
  }
  if (j->cfg.delta != 0)
    refit_run_reduce(rs, j->s, j->report, "report", wire_local, wire_sum, 5, MPI_DOUBLE,
                     MPI_SUM, 0);
  if (j->rank != 0)
    return;
  const double refit_s = maxes[5] - maxes[0];
  /* What crossed the transport: a delta refit's frames, not the plan. */
  const double moved = j->cfg.delta != 0 ? wire_sum[0] : (double)j->pst.bytes;
  printf("%6d %8llu %9.4f %9.4f %10.4f %9.4f %9.4f %9.4f %9.4f %9.4f %8.2f  %s\n", step,
         (unsigned long long)version, maxes[0], maxes[1], maxes[2], maxes[3], maxes[4],
         maxes[5], refit_s, maxes[6], refit_s > 0 ? moved / refit_s / 1e9 : 0.0,
         !j->cfg.verify ? "committed" : (bad_all == 0 ? "verified" : "MISMATCH"));
  if (j->cfg.delta != 0) {
    printf("refit-run: wire: refit %d %s: %.0f of %.0f bytes (%.6f of a full "
           "refit); generators: %.0f bytes changed, %.0f written\n",
           step, wire_sum[2] > 0 ? "delta" : "full", wire_sum[0], wire_sum[1],
           wire_sum[1] > 0 ? wire_sum[0] / wire_sum[1] : 0.0, wire_sum[3], wire_sum[4]);
  }
  fflush(stdout);
}

/* dump: the generator stores as they stand after the last refit. */
static void refit_run_dump(refit_run_job_t *j) {
  if (j->cfg.dump[0] == '\0')
    return;
  const refit_status_t st = refit_dump(j->s, j->cfg.dump);
  if (st != REFIT_OK && st != REFIT_ERR_PEER)
    fprintf(stderr, "refit-run: rank %d: %s: %s\n", j->rank, refit_status_str(st),
            refit_last_error());
  if (st != REFIT_OK)
    refit_run_fail(&j->rs, "dump", "%s: %s", refit_status_str(st), refit_last_error());
  else if (j->rank == 0)
    printf("\nrefit-run: dumped the generator tensors of version %llu to %s\n",
           (unsigned long long)refit_committed_version(j->s), j->cfg.dump);
  j->failed |= st != REFIT_OK;
}

/* The generators' memory (largest rank) and the verdict, on rank 0; the
 * status file; returns the exit status: 0, or 1 when a rank failed. */
static int refit_run_summary(refit_run_job_t *j) {
  refit_run_status_t *rs = &j->rs;
  const refit_settings_t *cfg = &j->cfg;
  int any_failed = 0;
  double mem_max[3];
  refit_run_reduce(rs, j->s, j->report, "summary", &j->failed, &any_failed, 1, MPI_INT,
                   MPI_MAX, -1);
  if (j->gen) {
    refit_plan_summary_t after; /* the arena as the last refit left it */
    refit_session_plan_summary(j->s, &after);
    j->mem_local[1] = (double)after.arena_bytes;
  }
  refit_run_reduce(rs, j->s, j->report, "summary", j->mem_local, mem_max, 3, MPI_DOUBLE,
                   MPI_MAX, 0);
  if (j->rank == 0) {
    const int saved = cfg->async || cfg->restore_full;
    printf("\ngenerator memory (largest rank): runtime tensors %.1f MiB; beyond "
           "them staging %.1f MiB",
           mem_max[2] / 1048576.0, mem_max[0] / 1048576.0);
    if (mem_max[1] > 0) /* MXFP8 or block FP8 tensors assembling */
      printf(" + assembly %.1f MiB", mem_max[1] / 1048576.0);
    if (saved)
      printf(" + %s %.1f MiB", cfg->async ? "async shadow" : "restore copy",
             mem_max[2] / 1048576.0);
    printf("\n");
    if (j->total_bad != 0)
      printf("\nrefit-run: FAILED: %lld elements differ from the reference "
             "(first mismatches logged above)\n",
             (long long)j->total_bad);
    else if (any_failed)
      printf("\nrefit-run: FAILED: not every refit committed (errors above); "
             "committed versions verified\n");
    else if (!cfg->verify)
      printf("\nrefit-run: %d refits committed (verification off)\n", cfg->steps);
    else
      printf("\nrefit-run: verified: %d refits, every generator byte matches "
             "the reference bit for bit\n",
             cfg->steps);
    fflush(stdout);
  }
  if (any_failed && rs->phase[0] == '\0')
    refit_run_fail(rs, "summary", "another rank failed (errors above)");
  const int failed = any_failed || j->total_bad != 0;
  refit_run_status_write(rs, j->s, failed ? "failed" : "ok");
  return failed;
}

/*
 * One config on `comm`, as a job of its own: open, run refit.steps refits,
 * dump, report, close; everything it allocated is freed before it returns
 * (several configs open sessions one after another in one process). Returns
 * the exit status: 0, 1 (a refit or its verification failed) or 2 (the
 * session did not open).
 */
static int refit_run_config(MPI_Comm comm, const char *config,
                            const refit_run_options_t *opt) {
  refit_run_job_t j = {.config = config, .pause_s = opt->pause_s};
  MPI_Comm_rank(comm, &j.rank);
  j.rs = (refit_run_status_t){
      .dir = opt->status_dir, .rank = j.rank, .phase = "", .alive = MPI_COMM_NULL};
  if (refit_run_open(&j, comm) != 0)
    return 2;
  refit_run_start(&j, comm);
  refit_run_banner(&j);
  for (int step = 1; step <= j.cfg.steps; step++) {
    const uint64_t version = (uint64_t)step;
    if (step > 1 && j.pause_s > 0) /* a training step between commit and begin */
      usleep((useconds_t)(j.pause_s * 1e6));
    const refit_run_outcome_t o = refit_run_one(j.s, version, j.cfg.async, &j.sink);
    if (o.st != REFIT_OK)
      refit_run_aborted(&j, step, version, &o);
    else
      refit_run_row(&j, step, version, &o);
  }
  refit_run_dump(&j);
  const int status = refit_run_summary(&j);
  refit_run_sink = j.sink; /* keeps the serving reads observable */
  refit_session_close(j.s);
  MPI_Comm_free(&j.report);
  MPI_Comm_free(&j.rs.alive);
  free(j.rs.peers);
  return status;
}

/* The ranks config `path` needs (refit/plan.h), read on rank 0 of a job of
 * `size` ranks: its world size, or 0 when it cannot run here (the problems
 * printed). */
static int refit_run_world_size(const char *path, int size) {
  refit_plan_report_h report = NULL;
  char *errors = NULL;
  const refit_status_t st = refit_plan_report_open(path, &report, &errors);
  if (st != REFIT_OK) {
    fprintf(stderr, "%s", errors ? errors : refit_last_error());
    if (errors == NULL || (errors[0] && errors[strlen(errors) - 1] != '\n'))
      fputc('\n', stderr);
    fprintf(stderr, "refit-run: config %s rejected (problems listed above)\n", path);
    free(errors);
    return 0;
  }
  int trainers = 0, generators = 0;
  refit_plan_report_world(report, &trainers, &generators);
  refit_plan_report_close(report);
  if (trainers + generators > size) {
    fprintf(stderr,
            "refit-run: config %s needs %d ranks, the job has %d: start the largest "
            "world size among the configs\n",
            path, trainers + generators, size);
    return 0;
  }
  return trainers + generators;
}

/*
 * Wait for `req`, a collective of every rank of the job, between configs: with no
 * deadline, as a config runs as long as it needs, napping between polls to leave the
 * cores to the ranks that work. A rank that left the job (through refit_run_lost, when
 * its config lost a peer) would never come: every tenth of a second the waiting rank
 * looks for the job's processes on its host (`peers`, `size` of them), and leaves when
 * one is gone.
 */
static void refit_run_meet(const refit_run_peer_t *peers, int size, int rank,
                           MPI_Request *req) {
  int done = 0;
  for (int poll = 1;; poll++) {
    MPI_Test(req, &done, MPI_STATUS_IGNORE); /* MPI_COMM_WORLD's errors abort */
    if (done)
      return;
    usleep(2000);
    if (poll % 50 != 0)
      continue;
    for (int p = 0; p < size; p++) {
      if (strcmp(peers[p].host, peers[rank].host) != 0 ||
          !refit_run_pid_gone(peers[p].pid))
        continue;
      fprintf(stderr,
              "refit-run: rank %d: rank %d (pid %d) left the job between configs; "
              "exiting without MPI_Finalize\n",
              rank, p, peers[p].pid);
      fflush(stderr);
      fflush(stdout);
      _exit(3);
    }
  }
}

/*
 * Several configs in one job, one after another: for each, rank 0 names it
 * and reads its world size N; the first N ranks split off a communicator and
 * run it (refit_run_config); the others wait, and every rank meets to learn
 * its exit status (the largest over ranks) before the next
 * (refit_run_meet). Returns the largest exit status of the configs.
 */
static int refit_run_configs(const refit_run_options_t *opt) {
  int rank = 0, size = 0, worst = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  refit_run_peer_t *peers = calloc((size_t)size, sizeof(*peers));
  if (peers == NULL) {
    fprintf(stderr, "refit-run: rank %d: out of memory\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  peers[rank].pid = (int)getpid();
  gethostname(peers[rank].host, sizeof(peers[rank].host) - 1);
  MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, peers, (int)sizeof(*peers), MPI_BYTE,
                MPI_COMM_WORLD);
  for (int i = 0; i < opt->nconfigs; i++) {
    const char *path = opt->configs[i];
    int n = 0, status = 0, job_status = 0;
    MPI_Request req;
    const double start = MPI_Wtime();
    if (rank == 0) {
      printf("refit-run: config %d of %d: %s\n", i + 1, opt->nconfigs, path);
      fflush(stdout);
      n = refit_run_world_size(path, size);
      status = n == 0 ? 2 : 0;
    }
    MPI_Ibcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD, &req);
    refit_run_meet(peers, size, rank, &req);
    if (n > 0) {
      MPI_Comm comm;
      MPI_Comm_split(MPI_COMM_WORLD, rank < n ? 0 : MPI_UNDEFINED, rank, &comm);
      if (comm != MPI_COMM_NULL) {
        status = refit_run_config(comm, path, opt);
        MPI_Comm_free(&comm);
      }
    }
    MPI_Iallreduce(&status, &job_status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req);
    refit_run_meet(peers, size, rank, &req);
    if (rank == 0) {
      printf("refit-run: config %d of %d ended: exit status %d (%.1f s)\n", i + 1,
             opt->nconfigs, job_status, MPI_Wtime() - start);
      fflush(stdout);
    }
    worst = job_status > worst ? job_status : worst;
  }
  free(peers);
  return worst;
}

int main(int argc, char **argv) {
  refit_run_options_t opt;
  const int usage = refit_run_args(argc, argv, &opt);
  if (usage >= 0)
    return usage;
  MPI_Init(&argc, &argv);
  const int status = opt.nconfigs == 1
                         ? refit_run_config(MPI_COMM_WORLD, opt.configs[0], &opt)
                         : refit_run_configs(&opt);
  MPI_Finalize();
  return status;
}
