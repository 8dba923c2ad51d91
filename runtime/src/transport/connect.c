/*
 * refit_comm_join: a trainer job and a generator job, started by separate
 * launches, meet through MPI's ports and become one communicator.
 *
 * The generator job opens a port and publishes its name in a file; the
 * trainer job claims the file, connects, and the intercommunicator is merged
 * with the trainers first. MPI_Comm_accept returns only when someone
 * connects, and MPI_Comm_connect to a port nobody accepts on never returns
 * (Open MPI 4.1; connecting to one's own port from a helper thread, to end
 * an accept, deadlocks there too). So neither side enters the MPI call
 * before it knows the other is there, and the file is how it knows:
 *
 * - the trainer claims the port by renaming the published file away (atomic:
 *   one claimer wins), then connects;
 * - the generator waits, with the deadline, for its file to be claimed and
 *   only then accepts. At the deadline it expires the file by the same
 *   rename: if that works no trainer can claim it any more and it returns
 *   REFIT_ERR_TIMEOUT without having entered MPI; if the file is already
 *   gone, a trainer claimed it just now and it accepts.
 *
 * Anyone who can write the port file's directory can claim the port, so
 * before either side trusts the other (the generators take their config and
 * weights from the trainers' rank 0) the two roots prove to each other that
 * they hold the job's secret: a key file only this user can read (0600,
 * owned by this user; PORT_FILE.key, created by whichever side comes first,
 * or REFIT_JOIN_KEY_FILE). The generator sends a fresh nonce, the trainer
 * answers with its own nonce and an HMAC-SHA256 of both under the key, and
 * the generator, having checked it, answers with the HMAC of the nonces the
 * other way round; the key itself never crosses the wire, and a recorded
 * answer is worth nothing against the next nonce.
 *
 * Every wait is bounded by timeout_s: the file waits by polling, the
 * handshake by non-blocking messages and the agreements inside each job by
 * non-blocking broadcasts. What MPI cannot bound is a blocking connect,
 * accept or merge with a process that died after the claim (or, for the
 * merge, after the handshake). A watchdog thread on each root then aborts
 * the job (MPI_Abort) with a message saying so, rather than hang without
 * one; it calls MPI concurrently with the main thread, so the function
 * requires MPI_THREAD_MULTIPLE (mpi4py's default; Open MPI 4.1 supports it).
 */
#include "refit/refit.h"

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The handshake's messages between the two roots, all of one layout. */
enum {
  REFIT_JOIN_TAG = 7712,
  REFIT_JOIN_MAGIC = 0x4a465252, /* "RRFJ": refit join, version 2 */
  REFIT_JOIN_CHALLENGE = 1,      /* generator -> trainer: its nonce */
  REFIT_JOIN_RESPONSE = 2,       /* trainer -> generator: its nonce, its proof */
  REFIT_JOIN_ACCEPT = 3,         /* generator -> trainer: the generator's proof */
  REFIT_JOIN_REFUSE = 4,         /* generator -> trainer: the proof was wrong */
  REFIT_JOIN_NONCE = 32,
  REFIT_JOIN_MAC = 32,     /* HMAC-SHA256 */
  REFIT_JOIN_KEY_MIN = 16, /* bytes of a key file */
  REFIT_JOIN_KEY_MAX = 4096,
};

typedef struct {
  uint32_t magic;
  uint32_t kind;
  unsigned char nonce[REFIT_JOIN_NONCE];
  unsigned char mac[REFIT_JOIN_MAC];
} refit_join_msg_t;

/* The handshake's buffers: on the heap, as a message still pending at a
 * deadline keeps its buffer (then deliberately never freed). */
typedef struct {
  unsigned char key[REFIT_JOIN_KEY_MAX];
  size_t key_len;
  char key_path[4200];
  refit_join_msg_t mine, theirs, verdict;
} refit_join_hs_t;

static refit_status_t refit_join_mpi(int rc, const char *side, const char *what) {
  if (rc == MPI_SUCCESS)
    return REFIT_OK;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return REFIT_ERR(REFIT_ERR_MPI, "refit_comm_join (%s): %s failed: %s", side, what, msg);
}

static double refit_join_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void refit_join_nap(void) {
  struct timespec nap = {0, 20 * 1000 * 1000};
  nanosleep(&nap, NULL);
}

/* The watchdog over a connect or accept that the other side's claim made
 * due: the main thread calls it off when the MPI call returns. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int finished;
  double timeout_s;
  const char *side;
  const char *port_file;
  const char *what; /* what the MPI call does, for the message */
  pthread_t thread;
  int started;
} refit_join_watch_t;

static void *refit_join_watchdog(void *arg) {
  refit_join_watch_t *w = arg;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts); /* pthread_cond_timedwait's clock */
  ts.tv_sec += (time_t)w->timeout_s;
  ts.tv_nsec += (long)((w->timeout_s - (double)(time_t)w->timeout_s) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&w->mu);
  while (!w->finished)
    if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT)
      break;
  const int finished = w->finished;
  pthread_mutex_unlock(&w->mu);
  if (finished)
    return NULL;
  REFIT_WARN("refit_comm_join (%s): the other job claimed or published the "
             "port of %s but did not %s within %.0f s: it is gone (a file "
             "left by an earlier job?). MPI cannot cancel a connect, accept or "
             "merge: aborting this job",
             w->side, w->port_file, w->what, w->timeout_s);
  MPI_Abort(MPI_COMM_WORLD, 1);
  return NULL;
}

static refit_status_t refit_join_watch_start(refit_join_watch_t *w, const char *what) {
  w->what = what;
  w->finished = 0;
  if (pthread_create(&w->thread, NULL, refit_join_watchdog, w) != 0)
    return REFIT_ERR(REFIT_ERR_SYSTEM,
                     "refit_comm_join (%s): cannot start the deadline thread", w->side);
  w->started = 1;
  return REFIT_OK;
}

static void refit_join_watch_stop(refit_join_watch_t *w) {
  if (!w->started)
    return;
  pthread_mutex_lock(&w->mu);
  w->finished = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  w->started = 0;
}

/* Under Open MPI's mpirun, ports only reach another mpirun through
 * ompi-server; without it the connect aborts both jobs. Say so first. */
static refit_status_t refit_join_check_runtime(const char *side) {
  if (getenv("OMPI_MCA_orte_hnp_uri") != NULL &&
      getenv("OMPI_MCA_pmix_server_uri") == NULL)
    return REFIT_ERR(REFIT_ERR_NOT_AVAILABLE,
                     "refit_comm_join (%s): Open MPI's mpirun connects two "
                     "launches only through ompi-server: start `ompi-server "
                     "--report-uri FILE` once and pass `--ompi-server file:FILE` "
                     "to both mpirun commands",
                     side);
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE)
    return REFIT_ERR(REFIT_ERR_NOT_AVAILABLE,
                     "refit_comm_join (%s): needs MPI_THREAD_MULTIPLE (a "
                     "watchdog thread bounds the connect and accept): initialize MPI "
                     "with MPI_Init_thread (mpi4py does by default)",
                     side);
  return REFIT_OK;
}

/* Wait for `req` until `deadline`; at the deadline cancel it (a receive)
 * or let it go (a send) and return REFIT_ERR_TIMEOUT. Either way the
 * request's buffer must outlive the call: the caller keeps it for good. */
static refit_status_t refit_join_wait(MPI_Request *req, double deadline, double timeout_s,
                                      const char *side, const char *what,
                                      const char *port_file, MPI_Status *status) {
  for (;;) {
    int done = 0;
    const int rc = MPI_Test(req, &done, status);
    if (rc != MPI_SUCCESS)
      return refit_join_mpi(rc, side, what);
    if (done)
      return REFIT_OK;
    if (refit_join_now() > deadline) {
      MPI_Cancel(req);
      MPI_Request_free(req);
      return REFIT_ERR(REFIT_ERR_TIMEOUT,
                       "refit_comm_join (%s): %s through %s did not complete within "
                       "%.0f s (the other job is stalled or not a refit job)",
                       side, what, port_file, timeout_s);
    }
    refit_join_nap();
  }
}

/* The root's outcome, made every rank's: the others return its status with
 * a message that points at the root (whose message says why). The others
 * wait at most `bound_s` (the root's step is bounded by the timeout). */
static refit_status_t refit_join_agree(MPI_Comm local, int rank, refit_status_t st,
                                       const char *side, const char *what,
                                       const char *port_file, double bound_s) {
  /* Kept for good if the broadcast misses its deadline (see refit_join_wait). */
  int *code = malloc(sizeof(*code));
  if (code == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_comm_join (%s)", side);
  *code = (int)st;
  MPI_Request req;
  int rc = MPI_Ibcast(code, 1, MPI_INT, 0, local, &req);
  refit_status_t wst = rc == MPI_SUCCESS
                           ? refit_join_wait(&req, refit_join_now() + bound_s, bound_s,
                                             side, "the agreement of this job's ranks",
                                             port_file, MPI_STATUS_IGNORE)
                           : refit_join_mpi(rc, side, "MPI_Ibcast");
  if (wst != REFIT_OK)
    return rank == 0 && st != REFIT_OK ? st : wst;
  const int got = *code;
  free(code);
  if (rank == 0 || got == REFIT_OK)
    return st;
  return REFIT_ERR((refit_status_t)got,
                   "refit_comm_join (%s): rank 0 could not %s through %s: %s", side, what,
                   port_file, refit_status_str((refit_status_t)got));
}

/* ------------------------------------------------------------------------ */
/* The job's secret                                                          */
/* ------------------------------------------------------------------------ */

static void refit_join_key_path(const char *port_file, char *out, size_t n) {
  const char *env = NULL;
  int set = 0;
  (void)refit_env_text("REFIT_JOIN_KEY_FILE", &env, &set); /* any text: a path */
  if (set)
    snprintf(out, n, "%s", env);
  else
    snprintf(out, n, "%s.key", port_file);
}

/* Create the key file where none exists: 32 random bytes in hex, written to
 * a private file (O_EXCL|O_NOFOLLOW, 0600) and linked into place. link()
 * fails on any existing name, a planted symbolic link included, so the first
 * side to create it wins and the other reads the whole of it. */
static refit_status_t refit_join_key_create(const char *path, const char *side) {
  unsigned char raw[32];
  char hex[2 * sizeof(raw) + 2], tmp[4300];
  if (RAND_bytes(raw, (int)sizeof(raw)) != 1)
    return REFIT_ERR(REFIT_ERR_SYSTEM, "refit_comm_join (%s): no random bytes for a key",
                     side);
  for (size_t i = 0; i < sizeof(raw); i++)
    snprintf(hex + 2 * i, 3, "%02x", raw[i]);
  hex[2 * sizeof(raw)] = '\n';
  hex[2 * sizeof(raw) + 1] = '\0';
  snprintf(tmp, sizeof(tmp), "%s.new.%ld", path, (long)getpid());
  const int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return REFIT_ERR(REFIT_ERR_SYSTEM,
                     "refit_comm_join (%s): cannot create key file %s: %s", side, tmp,
                     strerror(errno));
  const size_t n = strlen(hex);
  const int bad = write(fd, hex, n) != (ssize_t)n;
  int e = errno;
  if (close(fd) != 0 && !bad) {
    e = errno;
  }
  refit_status_t st = REFIT_OK;
  if (bad)
    st = REFIT_ERR(REFIT_ERR_SYSTEM, "refit_comm_join (%s): cannot write key file %s: %s",
                   side, tmp, strerror(e));
  else if (link(tmp, path) != 0 && errno != EEXIST)
    st =
        REFIT_ERR(REFIT_ERR_SYSTEM, "refit_comm_join (%s): cannot create key file %s: %s",
                  side, path, strerror(errno));
  unlink(tmp);
  return st;
}

/* Read the key (creating it first where absent): a regular file of this
 * user that nobody else may read or write, never through a symbolic link. */
static refit_status_t refit_join_key_read(refit_join_hs_t *hs, const char *side) {
  const char *path = hs->key_path;
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    REFIT_CHECK(refit_join_key_create(path, side));
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  }
  if (fd < 0)
    return REFIT_ERR(
        REFIT_ERR_SYSTEM, "refit_comm_join (%s): cannot open key file %s: %s%s", side,
        path, strerror(errno),
        errno == ELOOP ? " (a symbolic link: refit refuses to follow one)" : "");
  struct stat sb;
  refit_status_t st = REFIT_OK;
  if (fstat(fd, &sb) != 0)
    st = REFIT_ERR(REFIT_ERR_SYSTEM, "refit_comm_join (%s): key file %s: fstat: %s", side,
                   path, strerror(errno));
  else if (!S_ISREG(sb.st_mode))
    st = REFIT_ERR(REFIT_ERR_SYSTEM,
                   "refit_comm_join (%s): key file %s is not a regular file", side, path);
  else if (sb.st_uid != geteuid())
    st = REFIT_ERR(REFIT_ERR_SYSTEM,
                   "refit_comm_join (%s): key file %s belongs to uid %ld, not to this "
                   "user (uid %ld): another user may have planted it; remove it",
                   side, path, (long)sb.st_uid, (long)geteuid());
  else if ((sb.st_mode & 077) != 0)
    st = REFIT_ERR(REFIT_ERR_SYSTEM,
                   "refit_comm_join (%s): key file %s has mode %04o: others may read "
                   "or write it; it must be 0600 (chmod 600 %s)",
                   side, path, (unsigned)(sb.st_mode & 07777), path);
  else if (sb.st_size < REFIT_JOIN_KEY_MIN || sb.st_size > REFIT_JOIN_KEY_MAX)
    st = REFIT_ERR(REFIT_ERR_SYSTEM,
                   "refit_comm_join (%s): key file %s holds %lld bytes, expected %d to "
                   "%d (remove it: the first side to start writes a new one)",
                   side, path, (long long)sb.st_size, REFIT_JOIN_KEY_MIN,
                   REFIT_JOIN_KEY_MAX);
  if (st == REFIT_OK) {
    const ssize_t got = pread(fd, hs->key, (size_t)sb.st_size, 0);
    if (got != (ssize_t)sb.st_size)
      st =
          REFIT_ERR(REFIT_ERR_SYSTEM, "refit_comm_join (%s): cannot read key file %s: %s",
                    side, path, got < 0 ? strerror(errno) : "short read");
    else
      hs->key_len = (size_t)got;
  }
  close(fd);
  return st;
}

/* HMAC-SHA256 under the key of `label`, then `a`, then `b` (nonces). */
static void refit_join_mac(const refit_join_hs_t *hs, const char *label,
                           const unsigned char *a, const unsigned char *b,
                           unsigned char *out) {
  unsigned char data[64 + 2 * REFIT_JOIN_NONCE];
  const size_t nl = strlen(label);
  memcpy(data, label, nl);
  memcpy(data + nl, a, REFIT_JOIN_NONCE);
  memcpy(data + nl + REFIT_JOIN_NONCE, b, REFIT_JOIN_NONCE);
  unsigned int len = REFIT_JOIN_MAC;
  HMAC(EVP_sha256(), hs->key, (int)hs->key_len, data, nl + 2 * REFIT_JOIN_NONCE, out,
       &len);
}

static const char refit_join_label_trainer[] = "refit-join trainer";
static const char refit_join_label_generator[] = "refit-join generator";

/* Send `m` to the other root and wait for it to leave, by `deadline`. */
static refit_status_t refit_join_send(MPI_Comm inter, refit_join_msg_t *m,
                                      double deadline, double timeout_s, const char *side,
                                      const char *what, const char *port_file) {
  MPI_Request req;
  const int rc = MPI_Isend(m, (int)sizeof(*m), MPI_BYTE, 0, REFIT_JOIN_TAG, inter, &req);
  if (rc != MPI_SUCCESS)
    return refit_join_mpi(rc, side, what);
  return refit_join_wait(&req, deadline, timeout_s, side, what, port_file,
                         MPI_STATUS_IGNORE);
}

/* Receive the other root's message of kind `kind` into *m by `deadline`;
 * anything else (another size, magic or kind) is refused as not a refit job
 * of this version. */
static refit_status_t refit_join_recv(MPI_Comm inter, refit_join_msg_t *m, uint32_t kind,
                                      double deadline, double timeout_s, const char *side,
                                      const char *what, const char *port_file,
                                      const char *key_path) {
  MPI_Request req;
  MPI_Status status;
  const int rc = MPI_Irecv(m, (int)sizeof(*m), MPI_BYTE, 0, MPI_ANY_TAG, inter, &req);
  if (rc != MPI_SUCCESS)
    return refit_join_mpi(rc, side, what);
  REFIT_CHECK(refit_join_wait(&req, deadline, timeout_s, side, what, port_file, &status));
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  if (count != (int)sizeof(*m) || status.MPI_TAG != REFIT_JOIN_TAG ||
      m->magic != REFIT_JOIN_MAGIC ||
      (m->kind != kind && !(kind == REFIT_JOIN_ACCEPT && m->kind == REFIT_JOIN_REFUSE)))
    return REFIT_ERR(REFIT_ERR_PEER,
                     "refit_comm_join (%s): the job that connected through %s did not "
                     "prove that it holds the key of %s: %s was %d bytes with tag %d, "
                     "not refit's %d bytes with tag %d (not a refit job of this "
                     "version); refused, nothing was sent to it",
                     side, port_file, key_path, what, count, status.MPI_TAG,
                     (int)sizeof(*m), REFIT_JOIN_TAG);
  return REFIT_OK;
}

/* Generator root: challenge the trainer, check its proof, prove the key in
 * turn (or say that the proof was wrong, so that a trainer with another key
 * fails at once). */
static refit_status_t refit_join_challenge(MPI_Comm inter, refit_join_hs_t *hs,
                                           const char *port_file, double timeout_s) {
  const char *side = "generator";
  const double deadline = refit_join_now() + timeout_s;
  hs->mine = (refit_join_msg_t){.magic = REFIT_JOIN_MAGIC, .kind = REFIT_JOIN_CHALLENGE};
  if (RAND_bytes(hs->mine.nonce, REFIT_JOIN_NONCE) != 1)
    return REFIT_ERR(REFIT_ERR_SYSTEM, "refit_comm_join (generator): no random nonce");
  REFIT_CHECK(refit_join_send(inter, &hs->mine, deadline, timeout_s, side,
                              "the challenge to the trainer", port_file));
  REFIT_CHECK(refit_join_recv(inter, &hs->theirs, REFIT_JOIN_RESPONSE, deadline,
                              timeout_s, side, "the trainer's answer to the challenge",
                              port_file, hs->key_path));
  unsigned char want[REFIT_JOIN_MAC];
  refit_join_mac(hs, refit_join_label_trainer, hs->mine.nonce, hs->theirs.nonce, want);
  const int ok = CRYPTO_memcmp(want, hs->theirs.mac, REFIT_JOIN_MAC) == 0;
  hs->verdict = (refit_join_msg_t){.magic = REFIT_JOIN_MAGIC,
                                   .kind = ok ? REFIT_JOIN_ACCEPT : REFIT_JOIN_REFUSE};
  if (ok)
    refit_join_mac(hs, refit_join_label_generator, hs->theirs.nonce, hs->mine.nonce,
                   hs->verdict.mac);
  const refit_status_t st =
      refit_join_send(inter, &hs->verdict, deadline, timeout_s, side,
                      "the verdict to the trainer", port_file);
  if (!ok)
    return REFIT_ERR(REFIT_ERR_PEER,
                     "refit_comm_join (generator): the job that connected through %s "
                     "did not prove that it holds the key of %s: refused, nothing was "
                     "sent to it (a stranger, or a trainer job with another key file)",
                     port_file, hs->key_path);
  return st;
}

/* Trainer root: answer the generator's challenge and check its proof. */
static refit_status_t refit_join_answer(MPI_Comm inter, refit_join_hs_t *hs,
                                        const char *port_file, double timeout_s) {
  const char *side = "trainer";
  const double deadline = refit_join_now() + timeout_s;
  REFIT_CHECK(refit_join_recv(inter, &hs->theirs, REFIT_JOIN_CHALLENGE, deadline,
                              timeout_s, side, "the generator's challenge", port_file,
                              hs->key_path));
  hs->mine = (refit_join_msg_t){.magic = REFIT_JOIN_MAGIC, .kind = REFIT_JOIN_RESPONSE};
  if (RAND_bytes(hs->mine.nonce, REFIT_JOIN_NONCE) != 1)
    return REFIT_ERR(REFIT_ERR_SYSTEM, "refit_comm_join (trainer): no random nonce");
  refit_join_mac(hs, refit_join_label_trainer, hs->theirs.nonce, hs->mine.nonce,
                 hs->mine.mac);
  /* Our nonce is needed again after the verdict overwrites `theirs`. */
  unsigned char their_nonce[REFIT_JOIN_NONCE];
  memcpy(their_nonce, hs->theirs.nonce, REFIT_JOIN_NONCE);
  REFIT_CHECK(refit_join_send(inter, &hs->mine, deadline, timeout_s, side,
                              "the answer to the generator", port_file));
  REFIT_CHECK(refit_join_recv(inter, &hs->verdict, REFIT_JOIN_ACCEPT, deadline, timeout_s,
                              side, "the generator's verdict", port_file, hs->key_path));
  if (hs->verdict.kind == REFIT_JOIN_REFUSE)
    return REFIT_ERR(
        REFIT_ERR_PEER,
        "refit_comm_join (trainer): the generator job behind %s refused this "
        "job's key (%s): the two jobs do not share one key file",
        port_file, hs->key_path);
  unsigned char want[REFIT_JOIN_MAC];
  refit_join_mac(hs, refit_join_label_generator, hs->mine.nonce, their_nonce, want);
  if (CRYPTO_memcmp(want, hs->verdict.mac, REFIT_JOIN_MAC) != 0)
    return REFIT_ERR(REFIT_ERR_PEER,
                     "refit_comm_join (trainer): the job that published %s did not prove "
                     "that it holds the key of %s: refused, nothing was sent to it",
                     port_file, hs->key_path);
  return REFIT_OK;
}

/* ------------------------------------------------------------------------ */
/* The port file                                                             */
/* ------------------------------------------------------------------------ */

static refit_status_t refit_join_publish(const char *port_file, const char *port) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", port_file, (long)getpid());
  /* O_EXCL|O_NOFOLLOW: a file or link planted under the temporary name is
   * refused rather than written through. */
  const int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (f == NULL) {
    const int e = errno;
    if (fd >= 0) {
      close(fd);
      unlink(tmp);
    }
    return REFIT_ERR(REFIT_ERR_SYSTEM,
                     "refit_comm_join (generator): cannot write port file %s: %s", tmp,
                     strerror(e));
  }
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  const int bad = fprintf(f, "%s\n%s %ld\n", port, host, (long)getpid()) < 0;
  if (fclose(f) != 0 || bad || rename(tmp, port_file) != 0) {
    const int e = errno;
    unlink(tmp);
    return REFIT_ERR(REFIT_ERR_SYSTEM,
                     "refit_comm_join (generator): cannot publish port file %s: %s",
                     port_file, strerror(e));
  }
  return REFIT_OK;
}

/* Generator root: wait until a trainer claims the published file; at the
 * deadline expire it (the same rename a trainer claims with, so exactly one
 * of the two wins). */
static refit_status_t refit_join_wait_claim(const char *port_file, double timeout_s) {
  const double deadline = refit_join_now() + timeout_s;
  char expired[4096];
  snprintf(expired, sizeof(expired), "%s.expired.%ld", port_file, (long)getpid());
  for (;;) {
    if (access(port_file, F_OK) != 0 && errno == ENOENT)
      return REFIT_OK;
    if (refit_join_now() > deadline) {
      if (rename(port_file, expired) != 0)
        return REFIT_OK; /* claimed just now */
      unlink(expired);
      return REFIT_ERR(REFIT_ERR_TIMEOUT,
                       "refit_comm_join (generator): no trainer job claimed the "
                       "port published in %s within %.0f s (is it started, with "
                       "the same path?)",
                       port_file, timeout_s);
    }
    refit_join_nap();
  }
}

/* The bound of a non-root rank's wait for its root's step: the step's own
 * timeout and a margin for the file system and MPI. */
static double refit_join_bound(double timeout_s) { return 2 * timeout_s + 30; }

static refit_status_t refit_join_generator(MPI_Comm local, const char *port_file,
                                           double timeout_s, refit_join_hs_t *hs,
                                           MPI_Comm *inter) {
  int rank;
  MPI_Comm_rank(local, &rank);
  char port[MPI_MAX_PORT_NAME] = "";
  refit_join_watch_t w = {.mu = PTHREAD_MUTEX_INITIALIZER,
                          .cv = PTHREAD_COND_INITIALIZER,
                          .timeout_s = timeout_s,
                          .side = "generator",
                          .port_file = port_file};
  int opened = 0;
  refit_status_t st = REFIT_OK;
  if (rank == 0) {
    st = refit_join_check_runtime("generator");
    if (st == REFIT_OK)
      st = refit_join_key_read(hs, "generator");
    if (st == REFIT_OK)
      st = refit_join_mpi(MPI_Open_port(MPI_INFO_NULL, port), "generator",
                          "MPI_Open_port");
    opened = st == REFIT_OK;
    if (st == REFIT_OK)
      st = refit_join_publish(port_file, port);
    if (st == REFIT_OK) {
      REFIT_INFO("refit_comm_join (generator): port %s published in %s", port, port_file);
      st = refit_join_wait_claim(port_file, timeout_s);
    }
    if (st == REFIT_OK)
      st = refit_join_watch_start(&w, "complete the MPI connection");
  }
  /* Every generator rank learns whether a trainer is coming. */
  REFIT_CHECK_GOTO(refit_join_agree(local, rank, st, "generator", "meet a trainer job",
                                    port_file, refit_join_bound(timeout_s)),
                   st, out);
  MPI_Comm accepted;
  st = refit_join_mpi(MPI_Comm_accept(port, MPI_INFO_NULL, 0, local, &accepted),
                      "generator", "MPI_Comm_accept");
  refit_join_watch_stop(&w);
  if (st != REFIT_OK)
    goto out;
  MPI_Comm_set_errhandler(accepted, MPI_ERRORS_RETURN);
  if (rank == 0)
    st = refit_join_challenge(accepted, hs, port_file, timeout_s);
  st = refit_join_agree(local, rank, st, "generator", "authenticate the trainer job",
                        port_file, refit_join_bound(timeout_s));
  if (st != REFIT_OK) {
    /* Not MPI_Comm_disconnect, which waits for a stranger's cooperation. */
    MPI_Comm_free(&accepted);
    goto out;
  }
  *inter = accepted;
out:
  refit_join_watch_stop(&w);
  if (opened)
    MPI_Close_port(port);
  return st;
}

/* Trainer root: wait for the published file and claim it (rename), then read
 * the port name. */
static refit_status_t refit_join_claim(const char *port_file, double deadline,
                                       double timeout_s, char *port) {
  char claimed[4096];
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  snprintf(claimed, sizeof(claimed), "%s.claimed.%s.%ld", port_file, host,
           (long)getpid());
  for (;;) {
    if (rename(port_file, claimed) == 0)
      break;
    if (errno != ENOENT)
      return REFIT_ERR(REFIT_ERR_SYSTEM,
                       "refit_comm_join (trainer): cannot claim port file %s: %s",
                       port_file, strerror(errno));
    if (refit_join_now() > deadline)
      return REFIT_ERR(REFIT_ERR_TIMEOUT,
                       "refit_comm_join (trainer): no generator job published a "
                       "port in %s within %.0f s (is it started, with the same "
                       "path?)",
                       port_file, timeout_s);
    refit_join_nap();
  }
  /* Never through a link, never blocking on a FIFO, and only a file of this
   * user (the handshake would refuse a stranger's port anyway; this says so
   * before connecting). */
  const int fd = open(claimed, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  struct stat sb;
  const char *why = NULL;
  if (fd < 0)
    why = errno == ELOOP ? "a symbolic link" : strerror(errno);
  else if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
    why = "not a regular file";
  else if (sb.st_uid != geteuid())
    why = "written by another user";
  FILE *f = fd >= 0 && why == NULL ? fdopen(fd, "r") : NULL;
  if (f == NULL && fd >= 0)
    close(fd);
  int ok = f != NULL && fgets(port, MPI_MAX_PORT_NAME, f) != NULL;
  char peer_host[256] = "";
  long peer_pid = 0;
  if (ok && fscanf(f, "%255s %ld", peer_host, &peer_pid) != 2)
    peer_pid = 0;
  if (f != NULL)
    fclose(f);
  unlink(claimed);
  if (why != NULL)
    return REFIT_ERR(REFIT_ERR_SYSTEM, "refit_comm_join (trainer): port file %s is %s",
                     port_file, why);
  if (!ok)
    return REFIT_ERR(REFIT_ERR_SYSTEM,
                     "refit_comm_join (trainer): port file %s is empty or unreadable",
                     port_file);
  port[strcspn(port, "\n")] = '\0';
  /* A file left behind by a generator of this host that is gone. */
  if (peer_pid > 0 && strcmp(peer_host, host) == 0 && kill((pid_t)peer_pid, 0) != 0 &&
      errno == ESRCH)
    return REFIT_ERR(REFIT_ERR_PEER,
                     "refit_comm_join (trainer): port file %s was written by "
                     "process %ld of this host, which is gone (a file left by an "
                     "earlier job)",
                     port_file, peer_pid);
  return REFIT_OK;
}

static refit_status_t refit_join_trainer(MPI_Comm local, const char *port_file,
                                         double timeout_s, refit_join_hs_t *hs,
                                         MPI_Comm *inter) {
  int rank;
  MPI_Comm_rank(local, &rank);
  char port[MPI_MAX_PORT_NAME] = "";
  refit_join_watch_t w = {.mu = PTHREAD_MUTEX_INITIALIZER,
                          .cv = PTHREAD_COND_INITIALIZER,
                          .timeout_s = timeout_s,
                          .side = "trainer",
                          .port_file = port_file};
  refit_status_t st = REFIT_OK;
  if (rank == 0) {
    st = refit_join_check_runtime("trainer");
    if (st == REFIT_OK)
      st = refit_join_key_read(hs, "trainer");
    if (st == REFIT_OK)
      st = refit_join_claim(port_file, refit_join_now() + timeout_s, timeout_s, port);
    if (st == REFIT_OK)
      st = refit_join_watch_start(&w, "complete the MPI connection");
  }
  REFIT_CHECK_GOTO(refit_join_agree(local, rank, st, "trainer", "find a port", port_file,
                                    refit_join_bound(timeout_s)),
                   st, out);
  MPI_Comm connected;
  st = refit_join_mpi(MPI_Comm_connect(port, MPI_INFO_NULL, 0, local, &connected),
                      "trainer", "MPI_Comm_connect");
  refit_join_watch_stop(&w);
  if (st != REFIT_OK)
    goto out;
  MPI_Comm_set_errhandler(connected, MPI_ERRORS_RETURN);
  if (rank == 0)
    st = refit_join_answer(connected, hs, port_file, timeout_s);
  st = refit_join_agree(local, rank, st, "trainer", "authenticate the generator job",
                        port_file, refit_join_bound(timeout_s));
  if (st != REFIT_OK) {
    MPI_Comm_free(&connected);
    goto out;
  }
  *inter = connected;
out:
  refit_join_watch_stop(&w);
  return st;
}

refit_status_t refit_comm_join(MPI_Comm local, refit_side_t side, const char *port_file,
                               double timeout_s, MPI_Comm *merged) {
  if (port_file == NULL || port_file[0] == '\0' || merged == NULL || !(timeout_s > 0) ||
      !(timeout_s <= 86400))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_comm_join: needs a port file path, a positive timeout of at "
                     "most a day (got %g s) and an output",
                     timeout_s);
  if (side != REFIT_SIDE_TRAINER && side != REFIT_SIDE_GENERATOR)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_comm_join: side %d is "
                     "neither REFIT_SIDE_TRAINER nor REFIT_SIDE_GENERATOR",
                     (int)side);
  const int trainer = side == REFIT_SIDE_TRAINER;
  const char *name = trainer ? "trainer" : "generator";
  refit_join_hs_t *hs = calloc(1, sizeof(*hs));
  if (hs == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_comm_join (%s)", name);
  refit_join_key_path(port_file, hs->key_path, sizeof(hs->key_path));
  int rank;
  MPI_Comm_rank(local, &rank);
  /* Errors come back as codes on the local communicator (connect and accept
   * report there), as everywhere else in refit. */
  MPI_Errhandler saved;
  MPI_Comm_get_errhandler(local, &saved);
  MPI_Comm_set_errhandler(local, MPI_ERRORS_RETURN);
  MPI_Comm inter = MPI_COMM_NULL;
  refit_status_t st = trainer
                          ? refit_join_trainer(local, port_file, timeout_s, hs, &inter)
                          : refit_join_generator(local, port_file, timeout_s, hs, &inter);
  MPI_Comm_set_errhandler(local, saved);
  MPI_Errhandler_free(&saved);
  if (st != REFIT_OK) {
    /* A message may still be pending on the handshake's buffers after a
     * deadline: those are kept (a few hundred bytes, once). */
    if (st != REFIT_ERR_TIMEOUT) {
      OPENSSL_cleanse(hs, sizeof(*hs));
      free(hs);
    }
    return st;
  }
  OPENSSL_cleanse(hs, sizeof(*hs));
  free(hs);
  /* Both sides proved the key: merge, the one blocking call left, under the
   * watchdog (the other job's processes could still die just now). */
  refit_join_watch_t w = {.mu = PTHREAD_MUTEX_INITIALIZER,
                          .cv = PTHREAD_COND_INITIALIZER,
                          .timeout_s = timeout_s,
                          .side = name,
                          .port_file = port_file};
  if (rank == 0)
    st = refit_join_watch_start(&w, "merge the communicators");
  MPI_Comm out = MPI_COMM_NULL;
  /* high = 0 on the trainers puts them first in the merged communicator. */
  if (st == REFIT_OK)
    st = refit_join_mpi(MPI_Intercomm_merge(inter, trainer ? 0 : 1, &out), name,
                        "MPI_Intercomm_merge");
  refit_join_watch_stop(&w);
  MPI_Comm_free(&inter);
  if (st != REFIT_OK)
    return st;
  int r, n;
  MPI_Comm_rank(out, &r);
  MPI_Comm_size(out, &n);
  REFIT_INFO("refit_comm_join (%s): joined through %s as rank %d of %d", name, port_file,
             r, n);
  *merged = out;
  return REFIT_OK;
}
