/*
 * refit-run CONFIG: run refits as the config says, under mpirun or srun.
 * The first trainer.tp*pp*dp ranks are trainers, the next generator.tp*engines
 * generators. It drives the public API (refit/refit.h) the way a trainer and
 * an inference engine would, simulating the serving side: generators keep
 * reading their runtime weights between progress calls in async mode, and the
 * longest pause between two serving steps is reported as the stall.
 *
 * Prints a per-phase timing table and the verification result; exits 0 only
 * when every refit committed and verified (or, with verify off, committed).
 */
#include "refit/refit.h"
#include "dump.h"
#include "session.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One serving step: read 4 MiB of runtime weights, rotating through the
 * tensors the way successive layers of a forward pass read them; on the host
 * a loop, on a GPU one kernel (the memory layer's compare of the bytes with
 * themselves). Returns a value so the reads are not optimized away. */
static uint64_t refit_run_serve(refit_session_h s, int64_t *cursor) {
  const int64_t n = refit_tensor_count(s);
  refit_tensor_t t;
  if (n == 0 || refit_tensor_get(s, (*cursor)++ % n, &t) != REFIT_OK || t.data == NULL)
    return 0;
  const size_t bytes = t.bytes < ((size_t)4 << 20) ? t.bytes : ((size_t)4 << 20);
  if (refit_mem_on_device(s->mem)) {
    int64_t diff = 0, first = 0;
    refit_mem_compare(s->mem, t.data, t.data, bytes, 1, &diff, &first);
    return (uint64_t)diff + 1;
  }
  uint64_t acc = 0;
  const unsigned char *p = t.data;
  for (size_t k = 0; k < bytes; k += 64)
    acc += p[k];
  return acc;
}

static volatile uint64_t refit_run_sink;

typedef struct {
  double stall; /* longest pause between serving steps during the refit */
  refit_status_t st;
} refit_run_outcome_t;

/* One refit through the lifecycle. Generators in async mode serve between
 * progress calls; in sync mode serving pauses for the whole refit. */
static refit_run_outcome_t refit_run_one(refit_session_h s, uint64_t version,
                                         int async, uint64_t *sink) {
  refit_run_outcome_t o = {0, REFIT_OK};
  const int generator = refit_session_side(s) == REFIT_SIDE_GENERATOR;
  const int serving = async && generator;
  int64_t cursor = 0;
  double last = MPI_Wtime();
  int done = 0;
#define REFIT_RUN_SERVED()                                                     \
  do {                                                                         \
    double now_ = MPI_Wtime();                                                 \
    if (now_ - last > o.stall)                                                 \
      o.stall = now_ - last;                                                   \
    last = now_;                                                               \
  } while (0)

  o.st = refit_begin(s, version, NULL);
  if (o.st != REFIT_OK)
    return o;
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
  if (o.st == REFIT_OK || cst != REFIT_ERR_STATE)
    o.st = cst == REFIT_OK ? o.st : cst;
  REFIT_RUN_SERVED();
  if (!generator) /* trainers serve nothing: no stall to report */
    o.stall = 0;
  else if (!serving) /* sync: nothing was served from begin to here */
    o.stall = s->times.total > 0 ? s->times.total : o.stall;
#undef REFIT_RUN_SERVED
  return o;
}

int main(int argc, char **argv) {
  refit_session_h s = NULL;
  int rank = 0, failed = 0;
  int64_t total_bad = 0;
  uint64_t sink = 0;
  char desc[2048];

  if (argc != 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    fprintf(stderr, "usage: refit-run CONFIG.yaml   (under mpirun/srun, or "
                    "launch/refit-launch CONFIG.yaml)\n");
    return argc == 2 ? 0 : 2;
  }
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  refit_status_t st = refit_session_open(MPI_COMM_WORLD, argv[1], &s);
  if (st != REFIT_OK) {
    if (st != REFIT_ERR_PEER)
      fprintf(stderr, "refit-run: rank %d: %s: %s\n", rank, refit_status_str(st),
              refit_last_error());
    MPI_Finalize();
    return 2;
  }
  const refit_config_t *cfg = &s->cfg;
  const int async = cfg->refit.mode == REFIT_MODE_ASYNC;
  if (rank == 0) {
    refit_session_describe(s, desc, sizeof(desc));
    printf("refit-run %s: %s\n", argv[1], desc);
    /* refit_s leaves out source_s: producing the weights is the training
     * step's job. GB/s = bytes moved per refit / refit_s. */
    printf("\n%6s %8s %9s %9s %10s %9s %9s %9s %9s %9s %8s  %s\n", "refit",
           "version", "source_s", "pack_s", "transfer_s", "land_s", "commit_s",
           "total_s", "refit_s", "stall_s", "GB/s", "result");
    fflush(stdout);
  }

  refit_plan_stats_t pst;
  refit_plan_stats(s->plan, 0, &pst);
  /* Generator memory beyond its runtime tensors, the largest over ranks. */
  const int gen = refit_session_side(s) == REFIT_SIDE_GENERATOR;
  double mem_local[3] = {0, 0, 0}, mem_max[3];
  if (gen) {
    mem_local[0] = (double)REFIT_EXCHANGES_IN_FLIGHT * (double)s->plan->staging[s->role_rank];
    for (int64_t i = 0; i < s->nstores; i++)
      mem_local[2] += (double)s->stores[i].bytes;
  }

  for (int step = 1; step <= cfg->refit.steps; step++) {
    const uint64_t version = (uint64_t)step;
    refit_run_outcome_t o = refit_run_one(s, version, async, &sink);
    if (o.st != REFIT_OK) {
      failed = 1;
      fprintf(stderr, "refit-run: rank %d: refit of version %llu failed: %s: %s\n",
              rank, (unsigned long long)version, refit_status_str(o.st),
              refit_last_error());
      /* What the generator serves now must be the last committed version. */
      const uint64_t kept = refit_committed_version(s);
      if (refit_session_side(s) == REFIT_SIDE_GENERATOR) {
        int64_t bad = 0;
        if (refit_state(s) == REFIT_STATE_POISONED)
          fprintf(stderr, "refit-run: rank %d: POISONED: runtime storage may mix "
                          "versions; refusing to serve until a full refit\n",
                  rank);
        else if (kept > 0 && refit_verify(s, kept, &bad) == REFIT_OK)
          fprintf(stderr, "refit-run: rank %d: runtime storage holds version "
                          "%llu: %s\n",
                  rank, (unsigned long long)kept,
                  bad == 0 ? "verified bit for bit" : "MISMATCH");
        if (bad != 0)
          total_bad += bad;
      }
      fflush(stderr);
      if (s->broken) {
        /* A peer is dead or stalled: no collective can complete, including
         * MPI_Finalize. Leave without it. */
        fprintf(stderr, "refit-run: rank %d: a peer is lost; exiting without "
                        "MPI_Finalize\n", rank);
        fflush(stderr);
        fflush(stdout);
        _exit(3);
      }
      if (rank == 0)
        printf("%6d %8llu %9s %9s %10s %9s %9s %9s %9s %9s %8s  aborted: kept "
               "version %llu\n",
               step, (unsigned long long)version, "-", "-", "-", "-", "-", "-",
               "-", "-", "-", (unsigned long long)kept);
      continue;
    }
    refit_times_t t;
    refit_last_times(s, &t);
    int64_t bad = 0, bad_all = 0;
    double v0 = MPI_Wtime(), verify_s;
    if (cfg->verify) {
      st = refit_verify(s, version, &bad);
      if (st != REFIT_OK) {
        fprintf(stderr, "refit-run: rank %d: verify: %s\n", rank, refit_last_error());
        bad = bad ? bad : 1;
      }
    }
    verify_s = MPI_Wtime() - v0;
    (void)verify_s;
    double local[8] = {t.source, t.pack, t.transfer, t.land, t.commit, t.total,
                       o.stall, 0};
    double maxes[8];
    MPI_Reduce(local, maxes, 8, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Allreduce(&bad, &bad_all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    total_bad += bad_all;
    if (rank == 0) {
      const double refit_s = maxes[5] - maxes[0];
      printf("%6d %8llu %9.4f %9.4f %10.4f %9.4f %9.4f %9.4f %9.4f %9.4f %8.2f  %s\n",
             step, (unsigned long long)version, maxes[0], maxes[1], maxes[2],
             maxes[3], maxes[4], maxes[5], refit_s, maxes[6],
             refit_s > 0 ? (double)pst.total_bytes / refit_s / 1e9 : 0.0,
             !cfg->verify ? "committed" : (bad_all == 0 ? "verified" : "MISMATCH"));
      fflush(stdout);
    }
  }

  /* dump: the generator stores as they stand after the last refit. */
  if (cfg->dump[0] != '\0') {
    st = refit_dump_write(s, cfg->dump);
    if (st != REFIT_OK && st != REFIT_ERR_PEER)
      fprintf(stderr, "refit-run: rank %d: %s: %s\n", rank, refit_status_str(st),
              refit_last_error());
    else if (st == REFIT_OK && rank == 0)
      printf("\nrefit-run: dumped the generator tensors of version %llu to %s\n",
             (unsigned long long)refit_committed_version(s), cfg->dump);
    failed |= st != REFIT_OK;
  }
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (gen && s->loader != NULL)
    mem_local[1] = (double)s->loader->arena_bytes;
  MPI_Reduce(mem_local, mem_max, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    const int saved = cfg->refit.mode == REFIT_MODE_ASYNC ||
                      cfg->refit.restore == REFIT_RESTORE_FULL;
    printf("\ngenerator memory (largest rank): runtime tensors %.1f MiB; beyond "
           "them staging %.1f MiB",
           mem_max[2] / 1048576.0, mem_max[0] / 1048576.0);
    if (cfg->refit.precision == REFIT_PRECISION_MXFP8)
      printf(" + MXFP8 assembly %.1f MiB", mem_max[1] / 1048576.0);
    if (saved)
      printf(" + %s %.1f MiB", cfg->refit.mode == REFIT_MODE_ASYNC ? "async shadow"
                                                                   : "restore copy",
             mem_max[2] / 1048576.0);
    printf("\n");
  }
  if (rank == 0) {
    if (total_bad != 0)
      printf("\nrefit-run: FAILED: %lld elements differ from the reference "
             "(first mismatches logged above)\n",
             (long long)total_bad);
    else if (any_failed)
      printf("\nrefit-run: FAILED: not every refit committed (errors above); "
             "committed versions verified\n");
    else if (!cfg->verify)
      printf("\nrefit-run: %d refits committed (verification off)\n",
             cfg->refit.steps);
    else
      printf("\nrefit-run: verified: %d refits, every generator byte matches "
             "the reference bit for bit\n",
             cfg->refit.steps);
    fflush(stdout);
  }
  refit_run_sink = sink; /* keeps the serving reads observable */
  refit_session_close(s);
  MPI_Finalize();
  return (any_failed || total_bad != 0) ? 1 : 0;
}
