/*
 * A framework process written in C, attached to a refit agent through
 * librefit-agent.so alone (refit/agent.h: no MPI, no librefit, no CUDA):
 * tests/agent/run_agent_c.sh starts the agents and one of these per rank.
 *
 *   agent_client_c generator RANK SOCKET_DIR VERSIONS
 *   agent_client_c trainer RANK SOCKET_DIR VERSIONS
 *   agent_client_c shutdown 0 SOCKET_DIR 0
 *
 * An engine (generator) allocates every tensor its rank expects in shared
 * memory of its own (refit_agent_alloc_shared, one file per tensor, so the
 * registration spans several messages), registers them, and takes VERSIONS
 * refits as the trainers begin them (next_version, refit); after each, the
 * agent compares that memory with the config's reference (verify) and every
 * element must match. Before that it checks the API's refusals: an unknown
 * tensor name, a tensor past the end of its file, a second process on its
 * rank, device memory on a host rank. A trainer refits versions 1 to
 * VERSIONS (the config's source is synthetic: its agent makes the weights).
 * `shutdown` attaches to trainer 0 once the others left and stops the job
 * (SOCKET_DIR "": the default, $REFIT_AGENT_DIR).
 * Exits 0 only when every step did what it should.
 */
#include "refit/agent.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *who = "?";

#define FAIL(...)                                                                        \
  do {                                                                                   \
    fprintf(stderr, "%s: %s:%d: ", who, __FILE__, __LINE__);                             \
    fprintf(stderr, __VA_ARGS__);                                                        \
    fputc('\n', stderr);                                                                 \
    exit(1);                                                                             \
  } while (0)

/* A call that must succeed. */
#define OK(call)                                                                         \
  do {                                                                                   \
    const refit_status_t ok_st_ = (call);                                                \
    if (ok_st_ != REFIT_OK)                                                              \
      FAIL("%s: %s: %s", #call, refit_status_name(ok_st_), refit_last_error());          \
  } while (0)

/* A call that must fail with `want`, its message containing `words`. */
#define REFUSED(call, want, words)                                                       \
  do {                                                                                   \
    const refit_status_t r_st_ = (call);                                                 \
    if (r_st_ != (want) || strstr(refit_last_error(), (words)) == NULL)                  \
      FAIL("%s: expected %s with \"%s\", got %s: %s", #call, refit_status_name(want),    \
           (words), refit_status_name(r_st_), refit_last_error());                       \
    printf("refused as expected: %s: %s\n", #call, refit_last_error());                  \
  } while (0)

#define EQ(a, b)                                                                         \
  do {                                                                                   \
    const long long eq_a_ = (long long)(a), eq_b_ = (long long)(b);                      \
    if (eq_a_ != eq_b_)                                                                  \
      FAIL("%s == %s: %lld != %lld", #a, #b, eq_a_, eq_b_);                              \
  } while (0)

static int all_zero(const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != 0)
      return 0;
  return 1;
}

/* The refusals an engine must see before it registers anything. */
static void misuse(refit_agent_client_h c, int rank, const char *dir,
                   const refit_agent_host_tensor_t *first) {
  char words[64];
  /* An unknown name: the whole batch is refused, naming it. */
  refit_agent_host_tensor_t bad[2] = {*first, *first};
  bad[1].tensor.name = "model.layers.99.no_such.weight";
  REFUSED(refit_agent_client_register_host(c, bad, 2), REFIT_ERR_INVALID_ARGUMENT,
          "model.layers.99.no_such.weight");
  /* A tensor that passes the end of its file. */
  bad[0].offset = 4096;
  REFUSED(refit_agent_client_register_host(c, bad, 1), REFIT_ERR_INVALID_ARGUMENT,
          "passes the end");
  /* GPU memory on a host rank, and local argument checks. */
  refit_agent_device_tensor_t dev = {.tensor = first->tensor, .alloc_bytes = 1 << 20};
  REFUSED(refit_agent_client_register_device(c, &dev, 1), REFIT_ERR_STATE, "host memory");
  refit_agent_tensor_t t;
  REFUSED(refit_agent_client_expected_get(c, refit_agent_client_expected_count(c), &t),
          REFIT_ERR_INVALID_ARGUMENT, "out of range");
  REFUSED(refit_agent_client_refit(c, 0), REFIT_ERR_INVALID_ARGUMENT,
          "versions start at 1");
  /* A second process on this rank (this one, again) is refused naming the
   * first; the first stays attached. */
  refit_agent_client_h twice = NULL;
  snprintf(words, sizeof(words), "already serves pid %d", (int)getpid());
  REFUSED(refit_agent_client_attach(REFIT_AGENT_GENERATOR, rank, dir, NULL, &twice),
          REFIT_ERR_STATE, words);
  if (twice != NULL)
    FAIL("a refused attach set its output");
  /* The wrong side for this socket, and a rank without an agent. */
  REFUSED(refit_agent_client_attach(REFIT_AGENT_TRAINER, 999, dir, NULL, &twice),
          REFIT_ERR_NOT_AVAILABLE, "no agent listens");
  /* Still attached and serving. */
  char state[128];
  uint64_t committed = 99;
  OK(refit_agent_client_status(c, state, sizeof(state), &committed));
  EQ(committed, 0);
}

/* Attach to the agent of side rank `rank`, which must say it is that one,
 * on host memory, with nothing committed yet. */
static refit_agent_client_h attach(refit_agent_side_t side, int rank, const char *dir,
                                   refit_agent_info_t *info) {
  refit_agent_client_h c;
  OK(refit_agent_client_attach(side, rank, dir, NULL, &c));
  OK(refit_agent_client_info(c, info));
  EQ(info->side, side);
  EQ(info->rank, rank);
  EQ(info->device, -1);
  EQ(info->committed, 0);
  return c;
}

static int engine(int rank, const char *dir, int versions) {
  refit_agent_info_t info;
  refit_agent_client_h c = attach(REFIT_AGENT_GENERATOR, rank, dir, &info);
  const int64_t n = refit_agent_client_expected_count(c);
  printf("attached generator %d (world rank %d, engine %d, tp rank %d): %lld tensors\n",
         info.rank, info.world_rank, info.engine, info.tp_rank, (long long)n);
  if (n <= 0)
    FAIL("no expected tensors");
  refit_agent_host_tensor_t *ts = calloc((size_t)n, sizeof(*ts));
  void **mem = calloc((size_t)n, sizeof(*mem));
  for (int64_t i = 0; i < n; i++) {
    OK(refit_agent_client_expected_get(c, i, &ts[i].tensor));
    OK(refit_agent_alloc_shared(ts[i].tensor.bytes, &mem[i], &ts[i].fd));
    ts[i].offset = 0;
  }
  misuse(c, rank, dir, &ts[0]);
  OK(refit_agent_client_register_host(c, ts, (size_t)n));
  printf("registered %lld tensors\n", (long long)n);
  unsigned char ev[REFIT_AGENT_IPC_HANDLE_BYTES];
  REFUSED(refit_agent_client_commit_event(c, ev), REFIT_ERR_STATE, "host memory");

  for (int want = 1; want <= versions; want++) {
    uint64_t v = 0;
    OK(refit_agent_client_next_version(c, -1.0, &v));
    EQ(v, want);
    OK(refit_agent_client_refit(c, v));
    int64_t mismatches = -1;
    OK(refit_agent_client_verify(c, 0, &mismatches));
    EQ(mismatches, 0);
    /* verify compares: the version before differs almost everywhere. */
    int64_t before = -1;
    if (v > 1) {
      OK(refit_agent_client_verify(c, v - 1, &before));
      if (before <= 0)
        FAIL("verify of version %llu against version %llu's storage: %lld mismatches",
             (unsigned long long)v - 1, (unsigned long long)v, (long long)before);
    }
    uint64_t committed = 0;
    OK(refit_agent_client_status(c, NULL, 0, &committed));
    EQ(committed, v);
    /* The refit landed in this process's memory: verify read these bytes. */
    for (int64_t i = 0; i < n; i++)
      if (want == 1 && all_zero(mem[i], ts[i].tensor.bytes))
        FAIL("version %llu: tensor %s is still all zero", (unsigned long long)v,
             ts[i].tensor.name);
    refit_agent_times_t times;
    OK(refit_agent_client_last_times(c, &times));
    printf(
        "committed %llu: 0 mismatches (the previous version's reference: %lld), %.3f s\n",
        (unsigned long long)v, (long long)before, times.total);
    fflush(stdout);
  }
  /* No version is pending now: a poll answers 0 at once. */
  uint64_t none = 7;
  OK(refit_agent_client_next_version(c, 0.0, &none));
  EQ(none, 0);
  refit_agent_client_close(c);
  for (int64_t i = 0; i < n; i++)
    refit_agent_free_shared(mem[i], ts[i].tensor.bytes, ts[i].fd);
  free(mem);
  free(ts);
  printf("done\n");
  return 0;
}

static int trainer(int rank, const char *dir, int versions) {
  refit_agent_info_t info;
  refit_agent_client_h c = attach(REFIT_AGENT_TRAINER, rank, dir, &info);
  printf("attached trainer %d: %lld tensors (the synthetic source fills them)\n",
         info.rank, (long long)refit_agent_client_expected_count(c));
  uint64_t v = 0;
  REFUSED(refit_agent_client_next_version(c, 0.0, &v), REFIT_ERR_STATE,
          "trainers decide the versions");
  for (uint64_t want = 1; want <= (uint64_t)versions; want++) {
    OK(refit_agent_client_refit(c, want));
    int64_t mismatches = -1;
    OK(refit_agent_client_verify(c, 0, &mismatches));
    EQ(mismatches, 0);
    printf("committed %llu\n", (unsigned long long)want);
    fflush(stdout);
  }
  refit_agent_client_close(c);
  printf("done\n");
  return 0;
}

/* Attach to trainer 0 once its process has gone (its agent may not have
 * noticed yet: a few tries), and stop every agent. */
static int shutdown_job(const char *dir) {
  refit_agent_client_h c = NULL;
  refit_status_t st = REFIT_ERR_STATE;
  for (int tries = 0; tries < 100 && st == REFIT_ERR_STATE; tries++) {
    st = refit_agent_client_attach(REFIT_AGENT_TRAINER, 0, dir, NULL, &c);
    if (st == REFIT_ERR_STATE)
      nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
  }
  OK(st);
  OK(refit_agent_client_shutdown(c));
  REFUSED(refit_agent_client_status(c, NULL, 0, NULL), REFIT_ERR_STATE, "closed");
  refit_agent_client_close(c);
  printf("done\n");
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s generator|trainer|shutdown RANK SOCKET_DIR VERSIONS\n",
            argv[0]);
    return 2;
  }
  static char name[64];
  snprintf(name, sizeof(name), "%s %s", argv[1], argv[2]);
  who = name;
  setvbuf(stdout, NULL, _IOLBF, 0);
  const int rank = atoi(argv[2]), versions = atoi(argv[4]);
  if (strcmp(argv[1], "generator") == 0)
    return engine(rank, argv[3], versions);
  if (strcmp(argv[1], "trainer") == 0)
    return trainer(rank, argv[3], versions);
  if (strcmp(argv[1], "shutdown") == 0)
    return shutdown_job(argv[3]);
  fprintf(stderr, "%s: unknown role %s\n", argv[0], argv[1]);
  return 2;
}
