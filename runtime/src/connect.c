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
 * What remains unbounded is the other process dying between the claim and
 * the connect or accept. A watchdog thread on each root then aborts the job
 * (MPI_Abort) with a message saying so, rather than hang without one; it
 * calls MPI concurrently with the main thread, so the function requires
 * MPI_THREAD_MULTIPLE (mpi4py's default; Open MPI 4.1 supports it).
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

/* The hello the trainer's root sends to the generator's root. */
enum { REFIT_JOIN_TAG = 7711, REFIT_JOIN_HELLO = 0x72656674 };

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
             "port of %s but did not complete the MPI connection within %.0f "
             "s: it is gone (a file left by an earlier job?). MPI cannot "
             "cancel a connect or accept: aborting this job",
             w->side, w->port_file, w->timeout_s);
  MPI_Abort(MPI_COMM_WORLD, 1);
  return NULL;
}

static refit_status_t refit_join_watch_start(refit_join_watch_t *w) {
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

/* The root's outcome, made every rank's: the others return its status with
 * a message that points at the root (whose message says why). */
static refit_status_t refit_join_agree(MPI_Comm local, int rank, refit_status_t st,
                                       const char *side, const char *what,
                                       const char *port_file) {
  int code = (int)st;
  MPI_Bcast(&code, 1, MPI_INT, 0, local);
  if (rank == 0 || code == REFIT_OK)
    return st;
  return REFIT_ERR((refit_status_t)code,
                   "refit_comm_join (%s): rank 0 could not %s through %s: %s", side, what,
                   port_file, refit_status_str((refit_status_t)code));
}

static refit_status_t refit_join_publish(const char *port_file, const char *port) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", port_file, (long)getpid());
  FILE *f = fopen(tmp, "w");
  if (f == NULL)
    return REFIT_ERR(REFIT_ERR_SYSTEM,
                     "refit_comm_join (generator): cannot write port file %s: %s", tmp,
                     strerror(errno));
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

static refit_status_t refit_join_generator(MPI_Comm local, const char *port_file,
                                           double timeout_s, MPI_Comm *inter) {
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
      st = refit_join_watch_start(&w);
  }
  /* Every generator rank learns whether a trainer is coming. */
  REFIT_CHECK_GOTO(
      refit_join_agree(local, rank, st, "generator", "meet a trainer job", port_file), st,
      out);
  MPI_Comm accepted;
  st = refit_join_mpi(MPI_Comm_accept(port, MPI_INFO_NULL, 0, local, &accepted),
                      "generator", "MPI_Comm_accept");
  refit_join_watch_stop(&w);
  if (st != REFIT_OK)
    goto out;
  if (rank == 0) {
    int hello = 0;
    st = refit_join_mpi(
        MPI_Recv(&hello, 1, MPI_INT, 0, REFIT_JOIN_TAG, accepted, MPI_STATUS_IGNORE),
        "generator", "the trainer's hello");
    if (st == REFIT_OK && hello != REFIT_JOIN_HELLO)
      st = REFIT_ERR(REFIT_ERR_PEER,
                     "refit_comm_join (generator): the job that connected through "
                     "%s is not a refit trainer (hello %#x, expected %#x)",
                     port_file, (unsigned)hello, (unsigned)REFIT_JOIN_HELLO);
  }
  st = refit_join_agree(local, rank, st, "generator", "greet the trainer job", port_file);
  if (st != REFIT_OK) {
    MPI_Comm_disconnect(&accepted);
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
                          .timeout_s = timeout_s,
                          .side = "trainer",
                          .port_file = port_file};
  refit_status_t st = REFIT_OK;
  if (rank == 0) {
    st = refit_join_check_runtime("trainer");
    if (st == REFIT_OK)
      st = refit_join_claim(port_file, refit_join_now() + timeout_s, timeout_s, port);
    if (st == REFIT_OK)
      st = refit_join_watch_start(&w);
  }
  REFIT_CHECK_GOTO(refit_join_agree(local, rank, st, "trainer", "find a port", port_file),
                   st, out);
  MPI_Comm connected;
  st = refit_join_mpi(MPI_Comm_connect(port, MPI_INFO_NULL, 0, local, &connected),
                      "trainer", "MPI_Comm_connect");
  refit_join_watch_stop(&w);
  if (st == REFIT_OK && rank == 0) {
    int hello = REFIT_JOIN_HELLO;
    st = refit_join_mpi(MPI_Send(&hello, 1, MPI_INT, 0, REFIT_JOIN_TAG, connected),
                        "trainer", "the hello to the generator");
  }
  if (st == REFIT_OK)
    *inter = connected;
out:
  refit_join_watch_stop(&w);
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
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_comm_join: side %d is "
                     "neither REFIT_SIDE_TRAINER nor REFIT_SIDE_GENERATOR",
                     (int)side);
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
  REFIT_INFO("refit_comm_join (%s): joined through %s as rank %d of %d", name, port_file,
             r, n);
  *merged = out;
  return REFIT_OK;
}
