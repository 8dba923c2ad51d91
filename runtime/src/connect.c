/*
 * refit_comm_join: a trainer job and a generator job, started by separate
 * launches, meet through MPI's ports and become one communicator.
 *
 * The generator job opens a port and publishes its name in a file; the
 * trainer job claims the file, connects, and the intercommunicator is merged
 * with the trainers first. Both waits MPI leaves unbounded get a deadline:
 *
 * - MPI_Comm_accept returns only when someone connects. A helper thread on
 *   the generator's root connects to the port itself when the deadline
 *   passes, which makes the accept return; a one-integer hello over the new
 *   intercommunicator tells the generator whether the trainer or its own
 *   helper came, and the root broadcasts the verdict to its job.
 * - MPI_Comm_connect to a port nobody accepts on any more never returns
 *   (Open MPI 4.1 with ompi-server waits forever). So the trainer connects
 *   only to a port it has claimed: it renames the published file away, an
 *   atomic step that the generator's helper also tries at its deadline. Who
 *   renames first wins: a trainer that claimed the port finds a live accept
 *   (the helper no longer fires until a second grace period), a helper that
 *   expired it leaves the trainer nothing to connect to, and the trainer
 *   times out cleanly. What remains unbounded is a generator that died after
 *   publishing; a watchdog on the trainer's root aborts the trainer job with
 *   a message saying so, rather than hang without one.
 *
 * The helper threads call MPI concurrently with the main thread, so the
 * function requires MPI_THREAD_MULTIPLE (mpi4py's default; Open MPI 4.1
 * supports it).
 */
#include "refit/refit.h"

#include "core/error.h"
#include "core/log.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The hello the connecting side's root sends to the generator's root. */
enum { REFIT_JOIN_TAG = 7711, REFIT_JOIN_TRAINER = 0x72656674, REFIT_JOIN_WAKE = 1 };

static refit_status_t refit_join_mpi(int rc, const char *side, const char *what) {
  if (rc == MPI_SUCCESS)
    return REFIT_OK;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return REFIT_ERR(REFIT_ERR_MPI, "refit_comm_join (%s): %s failed: %s", side,
                   what, msg);
}

static double refit_join_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void refit_join_deadline_ts(double deadline, struct timespec *out) {
  /* pthread_cond_timedwait measures CLOCK_REALTIME by default. */
  struct timespec rt;
  clock_gettime(CLOCK_REALTIME, &rt);
  double left = deadline - refit_join_now();
  if (left < 0)
    left = 0;
  double t = (double)rt.tv_sec + 1e-9 * (double)rt.tv_nsec + left;
  out->tv_sec = (time_t)t;
  out->tv_nsec = (long)((t - (double)out->tv_sec) * 1e9);
}

/* One waiting thread with a deadline that the main thread can call off. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int finished;  /* main thread: the wait the watch bounds is over */
  double deadline;
  const char *port;
  const char *port_file;
  double timeout_s;
  int fired;     /* generator helper: connected to the port itself */
} refit_join_watch_t;

static int refit_join_watch_wait(refit_join_watch_t *w) {
  struct timespec ts;
  refit_join_deadline_ts(w->deadline, &ts);
  while (!w->finished && refit_join_now() < w->deadline)
    if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT)
      break;
  return w->finished;
}

static void refit_join_watch_finish(refit_join_watch_t *w, int *fired) {
  pthread_mutex_lock(&w->mu);
  w->finished = 1;
  *fired = w->fired;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

/* Generator root's helper: at the deadline, expire the published file; if
 * that works nobody can claim the port any more and the helper connects to
 * it itself to end the accept. If a trainer claimed it first, wait one more
 * timeout for its connect before giving up the same way. */
static void *refit_join_accept_helper(void *arg) {
  refit_join_watch_t *w = arg;
  pthread_mutex_lock(&w->mu);
  if (refit_join_watch_wait(w)) {
    pthread_mutex_unlock(&w->mu);
    return NULL;
  }
  char expired[4096];
  snprintf(expired, sizeof(expired), "%s.expired.%ld", w->port_file, (long)getpid());
  if (rename(w->port_file, expired) == 0) {
    unlink(expired);
  } else {
    REFIT_WARN("refit_comm_join (generator): a trainer claimed port file %s "
               "but has not connected; waiting %.0f s more",
               w->port_file, w->timeout_s);
    w->deadline = refit_join_now() + w->timeout_s;
    if (refit_join_watch_wait(w)) {
      pthread_mutex_unlock(&w->mu);
      return NULL;
    }
  }
  w->fired = 1;
  pthread_mutex_unlock(&w->mu);
  MPI_Comm self;
  if (MPI_Comm_connect(w->port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &self) == MPI_SUCCESS) {
    int hello = REFIT_JOIN_WAKE;
    MPI_Send(&hello, 1, MPI_INT, 0, REFIT_JOIN_TAG, self);
    MPI_Comm_disconnect(&self);
  }
  return NULL;
}

/* Trainer root's watchdog over a connect to a claimed port. */
static void *refit_join_connect_watchdog(void *arg) {
  refit_join_watch_t *w = arg;
  pthread_mutex_lock(&w->mu);
  const int finished = refit_join_watch_wait(w);
  pthread_mutex_unlock(&w->mu);
  if (finished)
    return NULL;
  REFIT_WARN("refit_comm_join (trainer): MPI_Comm_connect to the port published "
             "in %s did not complete within %.0f s: the generator job that "
             "wrote it is gone (a file left by an earlier job?). MPI cannot "
             "cancel a connect: aborting this job",
             w->port_file, w->timeout_s);
  MPI_Abort(MPI_COMM_WORLD, 1);
  return NULL;
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
                     "refit_comm_join (%s): needs MPI_THREAD_MULTIPLE (a helper "
                     "thread bounds the accept and connect): initialize MPI "
                     "with MPI_Init_thread (mpi4py does by default)",
                     side);
  return REFIT_OK;
}

/* The root's outcome, made every rank's: the others return its status with
 * a message that points at the root (whose message says why). */
static refit_status_t refit_join_agree(MPI_Comm local, int rank, refit_status_t st,
                                       const char *side, const char *what) {
  int code = (int)st;
  MPI_Bcast(&code, 1, MPI_INT, 0, local);
  if (rank == 0 || code == REFIT_OK)
    return st;
  return REFIT_ERR((refit_status_t)code, "refit_comm_join (%s): rank 0 could not %s: %s",
                   side, what, refit_status_str((refit_status_t)code));
}

static refit_status_t refit_join_publish(const char *port_file, const char *port) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", port_file, (long)getpid());
  FILE *f = fopen(tmp, "w");
  if (f == NULL)
    return REFIT_ERR(REFIT_ERR_SYSTEM,
                     "refit_comm_join (generator): cannot write port file %s: %s",
                     tmp, strerror(errno));
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

/* Generator root: the outcome the whole generator job then acts on. */
static refit_status_t refit_join_accept_root(MPI_Comm inter, refit_join_watch_t *w) {
  int hello = 0, fired = 0;
  int rc = MPI_Recv(&hello, 1, MPI_INT, 0, REFIT_JOIN_TAG, inter, MPI_STATUS_IGNORE);
  refit_join_watch_finish(w, &fired);
  if (rc == MPI_SUCCESS && hello == REFIT_JOIN_TRAINER && fired) {
    /* The helper gave up just as the trainer came: take its connect too, so
     * that it returns, and keep the trainer. */
    MPI_Comm self;
    if (MPI_Comm_accept(w->port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &self) == MPI_SUCCESS) {
      int drop;
      MPI_Recv(&drop, 1, MPI_INT, 0, REFIT_JOIN_TAG, self, MPI_STATUS_IGNORE);
      MPI_Comm_disconnect(&self);
    }
  }
  REFIT_CHECK(refit_join_mpi(rc, "generator", "the trainer's hello"));
  if (hello == REFIT_JOIN_WAKE)
    return REFIT_ERR(REFIT_ERR_TIMEOUT,
                     "refit_comm_join (generator): no trainer job connected to "
                     "the port published in %s within %.0f s",
                     w->port_file, w->timeout_s);
  if (hello != REFIT_JOIN_TRAINER)
    return REFIT_ERR(REFIT_ERR_PEER,
                     "refit_comm_join (generator): the job that connected through "
                     "%s is not a refit trainer (hello %#x, expected %#x)",
                     w->port_file, (unsigned)hello, (unsigned)REFIT_JOIN_TRAINER);
  return REFIT_OK;
}

static refit_status_t refit_join_generator(MPI_Comm local, const char *port_file,
                                           double timeout_s, MPI_Comm *inter) {
  int rank;
  MPI_Comm_rank(local, &rank);
  char port[MPI_MAX_PORT_NAME] = "";
  refit_join_watch_t w = {.mu = PTHREAD_MUTEX_INITIALIZER,
                          .cv = PTHREAD_COND_INITIALIZER,
                          .deadline = refit_join_now() + timeout_s,
                          .port = port,
                          .port_file = port_file,
                          .timeout_s = timeout_s};
  pthread_t helper;
  int have_helper = 0, opened = 0, fired = 0;
  refit_status_t st = REFIT_OK;
  if (rank == 0) {
    st = refit_join_check_runtime("generator");
    if (st == REFIT_OK)
      st = refit_join_mpi(MPI_Open_port(MPI_INFO_NULL, port), "generator", "MPI_Open_port");
    opened = st == REFIT_OK;
    if (st == REFIT_OK)
      st = refit_join_publish(port_file, port);
    if (st == REFIT_OK) {
      if (pthread_create(&helper, NULL, refit_join_accept_helper, &w) == 0)
        have_helper = 1;
      else
        st = REFIT_ERR(REFIT_ERR_SYSTEM,
                       "refit_comm_join (generator): cannot start the deadline thread");
    }
    if (st != REFIT_OK)
      unlink(port_file);
    REFIT_INFO("refit_comm_join (generator): port %s published in %s", port, port_file);
  }
  /* Every generator rank learns whether the root could publish. */
  REFIT_CHECK_GOTO(refit_join_agree(local, rank, st, "generator", "publish a port"), st, out);
  MPI_Comm accepted;
  st = refit_join_mpi(MPI_Comm_accept(port, MPI_INFO_NULL, 0, local, &accepted),
                      "generator", "MPI_Comm_accept");
  if (st != REFIT_OK) {
    if (rank == 0)
      refit_join_watch_finish(&w, &fired);
    goto out;
  }
  if (rank == 0)
    st = refit_join_accept_root(accepted, &w);
  st = refit_join_agree(local, rank, st, "generator", "meet a trainer job");
  if (st != REFIT_OK) {
    MPI_Comm_disconnect(&accepted);
    goto out;
  }
  *inter = accepted;
out:
  if (have_helper)
    pthread_join(helper, NULL);
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
    struct timespec nap = {0, 20 * 1000 * 1000};
    nanosleep(&nap, NULL);
  }
  FILE *f = fopen(claimed, "r");
  int ok = f != NULL && fgets(port, MPI_MAX_PORT_NAME, f) != NULL;
  char peer_host[256] = "";
  long peer_pid = 0;
  if (ok && fscanf(f, "%255s %ld", peer_host, &peer_pid) != 2)
    peer_pid = 0;
  if (f != NULL)
    fclose(f);
  unlink(claimed);
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
                                         double timeout_s, MPI_Comm *inter) {
  int rank;
  MPI_Comm_rank(local, &rank);
  char port[MPI_MAX_PORT_NAME] = "";
  refit_join_watch_t w = {.mu = PTHREAD_MUTEX_INITIALIZER,
                          .cv = PTHREAD_COND_INITIALIZER,
                          .port_file = port_file,
                          .timeout_s = timeout_s};
  pthread_t watchdog;
  int have_watchdog = 0;
  refit_status_t st = REFIT_OK;
  if (rank == 0) {
    st = refit_join_check_runtime("trainer");
    if (st == REFIT_OK)
      st = refit_join_claim(port_file, refit_join_now() + timeout_s, timeout_s, port);
    if (st == REFIT_OK) {
      w.deadline = refit_join_now() + timeout_s;
      if (pthread_create(&watchdog, NULL, refit_join_connect_watchdog, &w) == 0)
        have_watchdog = 1;
      else
        st = REFIT_ERR(REFIT_ERR_SYSTEM,
                       "refit_comm_join (trainer): cannot start the deadline thread");
    }
  }
  REFIT_CHECK_GOTO(refit_join_agree(local, rank, st, "trainer", "find a port"), st, out);
  MPI_Comm connected;
  st = refit_join_mpi(MPI_Comm_connect(port, MPI_INFO_NULL, 0, local, &connected),
                      "trainer", "MPI_Comm_connect");
  if (st == REFIT_OK && rank == 0) {
    int hello = REFIT_JOIN_TRAINER;
    st = refit_join_mpi(MPI_Send(&hello, 1, MPI_INT, 0, REFIT_JOIN_TAG, connected),
                        "trainer", "the hello to the generator");
  }
  if (st == REFIT_OK)
    *inter = connected;
out:
  if (have_watchdog) {
    int fired;
    refit_join_watch_finish(&w, &fired);
    pthread_join(watchdog, NULL);
  }
  return st;
}

refit_status_t refit_comm_join(MPI_Comm local, refit_side_t side, const char *port_file,
                               double timeout_s, MPI_Comm *merged) {
  if (port_file == NULL || port_file[0] == '\0' || merged == NULL || !(timeout_s > 0))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_comm_join: needs a port file path, a positive timeout "
                     "(got %g s) and an output",
                     timeout_s);
  if (side != REFIT_SIDE_TRAINER && side != REFIT_SIDE_GENERATOR)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "refit_comm_join: side %d is "
                     "neither REFIT_SIDE_TRAINER nor REFIT_SIDE_GENERATOR", (int)side);
  const int trainer = side == REFIT_SIDE_TRAINER;
  const char *name = trainer ? "trainer" : "generator";
  /* Errors come back as codes on the local communicator (connect and accept
   * report there), as everywhere else in refit. */
  MPI_Errhandler saved;
  MPI_Comm_get_errhandler(local, &saved);
  MPI_Comm_set_errhandler(local, MPI_ERRORS_RETURN);
  MPI_Comm inter = MPI_COMM_NULL;
  refit_status_t st = trainer ? refit_join_trainer(local, port_file, timeout_s, &inter)
                              : refit_join_generator(local, port_file, timeout_s, &inter);
  MPI_Comm_set_errhandler(local, saved);
  MPI_Errhandler_free(&saved);
  if (st != REFIT_OK)
    return st;
  MPI_Comm out;
  MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
  /* high = 0 on the trainers puts them first in the merged communicator. */
  st = refit_join_mpi(MPI_Intercomm_merge(inter, trainer ? 0 : 1, &out), name,
                      "MPI_Intercomm_merge");
  MPI_Comm_free(&inter);
  if (st != REFIT_OK)
    return st;
  int r, n;
  MPI_Comm_rank(out, &r);
  MPI_Comm_size(out, &n);
  REFIT_INFO("refit_comm_join (%s): joined through %s as rank %d of %d", name,
             port_file, r, n);
  *merged = out;
  return REFIT_OK;
}
