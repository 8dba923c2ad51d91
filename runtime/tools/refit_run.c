/*
 * refit-run CONFIG: run refits as the config says, under mpirun or srun.
 * The first trainer.tp*pp*dp ranks are trainers, the next generator.tp*engines
 * generators. Prints a per-phase timing table and the verification result;
 * exits 0 only when every refit verified (or, with verify off, completed).
 */
#include "core/log.h"
#include "session.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *refit_run_human(double bytes, char *buf, size_t len) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    u++;
  }
  snprintf(buf, len, "%.2f %s", bytes, units[u]);
  return buf;
}

static void refit_run_header(const refit_session_t *s, const char *path) {
  const refit_config_t *c = &s->cfg;
  refit_plan_stats_t st;
  char b1[32], b2[32];
  refit_plan_stats(s->plan, 0, &st);
  printf("refit-run %s: %s, %d ranks = %d trainer (tp %d, pp %d, dp %d, ep %d, "
         "etp %d) + %d generator (%d engine%s x tp %d, ep %d)\n",
         path, c->model.family == REFIT_FAMILY_QWEN3_MOE ? "qwen3_moe" : "qwen3",
         s->size, s->ntrainer, c->trainer.tp, c->trainer.pp, c->trainer.dp,
         c->trainer.ep, c->trainer.etp, s->ngenerator, c->generator.engines,
         c->generator.engines == 1 ? "" : "s", c->generator.tp, c->generator.ep);
  printf("plan: %lld tensors -> %lld runtime tensors per tp rank, %d buckets, "
         "%lld messages, %s per refit, egress max/mean %.3f, staging max %s, "
         "hash %016llx, transport %s\n",
         (long long)s->cat->nsrc,
         (long long)(s->cat->gen_begin[1] - s->cat->gen_begin[0]),
         s->plan->nbuckets, (long long)s->plan->nmsgs,
         refit_run_human((double)st.total_bytes, b1, sizeof(b1)),
         st.egress_mean > 0 ? st.egress_max / st.egress_mean : 0.0,
         refit_run_human((double)st.staging_max, b2, sizeof(b2)),
         (unsigned long long)s->plan->hash, s->transport.ops->name);
  printf("\n%6s %8s %10s %10s %10s %10s %10s %10s %9s  %s\n", "refit",
         "version", "source_s", "pack_s", "transfer_s", "unpack_s", "verify_s",
         "total_s", "GB/s", "result");
}

int main(int argc, char **argv) {
  refit_session_t *s = NULL;
  int rank = 0, failed = 0;
  int64_t total_bad = 0;

  if (argc != 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    fprintf(stderr, "usage: refit-run CONFIG.yaml   (under mpirun/srun, or "
                    "launch/refit-launch CONFIG.yaml)\n");
    return argc == 2 ? 0 : 2;
  }
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  refit_status_t st = refit_session_create(MPI_COMM_WORLD, argv[1], &s);
  if (st != REFIT_OK) {
    if (st != REFIT_ERR_PEER)
      fprintf(stderr, "refit-run: rank %d: %s: %s\n", rank, refit_status_str(st),
              refit_last_error());
    MPI_Finalize();
    return 2;
  }
  if (rank == 0)
    refit_run_header(s, argv[1]);

  refit_plan_stats_t pst;
  refit_plan_stats(s->plan, 0, &pst);
  for (int step = 1; step <= s->cfg.refit.steps; step++) {
    refit_phase_times_t t, tmax;
    const uint64_t version = (uint64_t)step;
    st = refit_session_refit(s, version, &t);
    if (st != REFIT_OK) {
      /* A failed transfer can leave peers blocked in MPI: end the job rather
       * than hang in MPI_Finalize. */
      fprintf(stderr, "refit-run: rank %d: refit of version %llu failed: %s: %s\n",
              rank, (unsigned long long)version, refit_status_str(st),
              refit_last_error());
      fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    int64_t bad = 0, bad_all = 0;
    double verify_s = 0, v0 = MPI_Wtime();
    if (s->cfg.verify) {
      st = refit_session_verify(s, version, &bad);
      if (st != REFIT_OK) {
        fprintf(stderr, "refit-run: rank %d: verify: %s\n", rank,
                refit_last_error());
        bad = bad ? bad : 1;
      }
    }
    verify_s = MPI_Wtime() - v0;
    double local[6] = {t.source, t.pack, t.transfer, t.unpack, verify_s, t.total};
    double maxes[6];
    MPI_Reduce(local, maxes, 6, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Allreduce(&bad, &bad_all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    total_bad += bad_all;
    tmax.total = maxes[5];
    if (rank == 0)
      printf("%6d %8llu %10.4f %10.4f %10.4f %10.4f %10.4f %10.4f %9.3f  %s\n",
             step, (unsigned long long)version, maxes[0], maxes[1], maxes[2],
             maxes[3], maxes[4], maxes[5],
             tmax.total > 0 ? (double)pst.total_bytes / tmax.total / 1e9 : 0.0,
             !s->cfg.verify ? "completed"
                            : (bad_all == 0 ? "verified" : "MISMATCH"));
  }
  if (rank == 0) {
    if (!s->cfg.verify)
      printf("\nrefit-run: %d refits completed (verification off)\n",
             s->cfg.refit.steps);
    else if (total_bad == 0)
      printf("\nrefit-run: verified: %d refits, every generator byte matches "
             "the reference bit for bit\n",
             s->cfg.refit.steps);
    else
      printf("\nrefit-run: FAILED: %lld elements differ from the reference "
             "(first mismatches logged above)\n",
             (long long)total_bad);
    fflush(stdout);
  }
  failed = total_bad != 0;
  refit_session_destroy(s);
  MPI_Finalize();
  return failed ? 1 : 0;
}
