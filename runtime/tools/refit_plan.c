/*
 * refit-plan CONFIG [--link-gbps G] [--gpus-per-node N] [--nvlink-gbps G]
 *            [--copy-gbps G [--overlap auto|full|pack|none] [--buckets]]
 *            [--ranks] | --world-size CONFIG [CONFIG...]
 * Prints the reshard plan without moving data: per-rank bytes, max/mean,
 * messages, buckets, the floor (the busiest rank's bytes over its links),
 * the transfer time predicted bucket by bucket, their ratio, the worst
 * bucket's balance and the MXFP8 arena; with --copy-gbps also the refit as
 * the lifecycle pipelines it (pack, transfer, land and the restore save),
 * and with --buckets that prediction bucket by bucket. --world-size: the
 * ranks a job of the config needs; of several, the largest (refit-run runs
 * several configs one after another in one job). One process, no MPI launch
 * needed: a client of refit/plan.h alone.
 */
#include "refit/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double refit_plan_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int refit_plan_usage(void) {
  fprintf(stderr,
          "usage: refit-plan CONFIG.yaml [--link-gbps GB_PER_S] [--gpus-per-node N]\n"
          "                  [--nvlink-gbps GB_PER_S] [--copy-gbps GB_PER_S\n"
          "                  [--overlap auto|full|pack|none] [--buckets]] [--ranks]\n"
          "       refit-plan --world-size CONFIG.yaml [CONFIG.yaml...]\n"
          "  --link-gbps  per-rank NIC bandwidth for the predicted time "
          "(default 25)\n"
          "  --gpus-per-node  ranks per node, placed in blocks (trainers "
          "first); pairs\n"
          "               on one node move over NVLink (default 0: every pair "
          "on the NIC)\n"
          "  --nvlink-gbps per-GPU NVLink bandwidth per direction (default "
          "450)\n"
          "  --copy-gbps  one rank's memory copy rate while all ranks run: adds "
          "the\n"
          "               pipelined prediction (pack, transfer, land, restore "
          "save)\n"
          "  --overlap    auto | full | pack | none: transfers move while "
          "ranks pack and\n"
          "               land (full: GPU transports), while trainers pack but "
          "not while\n"
          "               generators land (pack: host MPI), or only while both "
          "ends are\n"
          "               in transport calls (none: host UCX); auto: from the "
          "config\n"
          "  --buckets    with --copy-gbps: the pipelined prediction bucket by "
          "bucket\n"
          "  --ranks      print every rank's bytes, not only the summary\n"
          "  --world-size print the number of MPI ranks the config needs (of several\n"
          "               configs, the largest)\n");
  return 2;
}

/* The pipelined prediction (--copy-gbps), and with `per_bucket` its table:
 * per bucket the busiest trainer's pack, the busiest rank's transfer and
 * the busiest generator's land (restore save included), in seconds, and
 * when each stage of the bucket ends, from the moment every trainer holds
 * the new weights. */
static int refit_plan_print_pipeline(refit_plan_report_h report,
                                     const refit_plan_links_t *links, double copy,
                                     refit_plan_overlap_t overlap, int nbuckets,
                                     int per_bucket) {
  refit_plan_bucket_t *b = calloc((size_t)(nbuckets > 0 ? nbuckets : 1), sizeof(*b));
  refit_plan_pipeline_prediction_t p;
  const refit_plan_copy_t c = {.copy_gbps = copy, .overlap = overlap};
  if (b == NULL || refit_plan_report_pipeline(report, links, &c, b, &p) != REFIT_OK) {
    fprintf(stderr, "refit-plan: %s\n", b == NULL ? "out of memory" : refit_last_error());
    free(b);
    return 1;
  }
  printf("  passes           memory copy %.2f GB/s per rank; transfers %s\n", copy,
         p.overlap == REFIT_PLAN_OVERLAP_NONE
             ? "only while both ends are in transport calls (overlap none)"
         : p.overlap == REFIT_PLAN_OVERLAP_PACK
             ? "while trainers pack, not while generators land (overlap pack)"
             : "beside packing and landing (overlap full)");
  printf("  pipelined        %.4f s: sums pack %.4f s, transfer %.4f s, land %.4f s "
         "(restore save %.1f MiB)%s\n",
         p.total_s, p.pack_s, p.transfer_s, p.land_s, (double)p.save_bytes / 1048576.0,
         p.commit_s > 0 ? ", plus the async commit's copy" : "");
  if (p.commit_s > 0)
    printf("  commit copy      %.4f s (refit.mode async: the shadow into runtime "
           "storage)\n",
           p.commit_s);
  if (per_bucket) {
    printf("\n  %6s %9s %9s %9s %9s %9s %9s %12s %12s %12s\n", "bucket", "pack_s",
           "xfer_s", "land_s", "pack_end", "xfer_end", "land_end", "pack_bytes",
           "land_bytes", "save_bytes");
    for (int i = 0; i < nbuckets; i++)
      printf("  %6d %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %12lld %12lld %12lld\n", i,
             b[i].pack_s, b[i].transfer_s, b[i].land_s, b[i].pack_end_s,
             b[i].transfer_end_s, b[i].land_end_s, (long long)b[i].pack_bytes,
             (long long)b[i].land_bytes, (long long)b[i].save_bytes);
    printf("\n");
  }
  free(b);
  return 0;
}

/* Read and check the config at `path` (refit_plan_report_open), printing
 * every problem of the file. */
static refit_status_t refit_plan_open(const char *path, refit_plan_report_h *report) {
  char *errors = NULL;
  const refit_status_t st = refit_plan_report_open(path, report, &errors);
  if (st != REFIT_OK) {
    fprintf(stderr, "%s", errors ? errors : refit_last_error());
    if (errors == NULL || (errors[0] && errors[strlen(errors) - 1] != '\n'))
      fputc('\n', stderr);
    free(errors);
  }
  return st;
}

/* --world-size CONFIG...: the largest world size among the configs. */
static int refit_plan_world_size(int argc, char **argv) {
  int largest = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--world-size") == 0)
      continue;
    refit_plan_report_h report = NULL;
    if (argv[i][0] == '-')
      return refit_plan_usage();
    if (refit_plan_open(argv[i], &report) != REFIT_OK)
      return 2;
    int trainers = 0, generators = 0;
    refit_plan_report_world(report, &trainers, &generators);
    refit_plan_report_close(report);
    largest = trainers + generators > largest ? trainers + generators : largest;
  }
  if (largest == 0)
    return refit_plan_usage();
  printf("%d\n", largest);
  return 0;
}

int main(int argc, char **argv) {
  const char *path = NULL;
  double gbps = 25.0, nvlink = 450.0, copy = 0;
  int gpus_per_node = 0;
  int all_ranks = 0, per_bucket = 0;
  refit_plan_overlap_t overlap = REFIT_PLAN_OVERLAP_AUTO;
  refit_plan_report_h report = NULL;

  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--world-size") == 0)
      return refit_plan_world_size(argc, argv);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--ranks") == 0)
      all_ranks = 1;
    else if (strcmp(argv[i], "--buckets") == 0)
      per_bucket = 1;
    else if (strcmp(argv[i], "--copy-gbps") == 0 && i + 1 < argc) {
      char *end = NULL;
      copy = strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || !(copy > 0)) {
        fprintf(stderr, "refit-plan: --copy-gbps expects a positive number, got '%s'\n",
                argv[i]);
        return 2;
      }
    } else if (strcmp(argv[i], "--overlap") == 0 && i + 1 < argc) {
      const char *v = argv[++i];
      if (strcmp(v, "auto") == 0)
        overlap = REFIT_PLAN_OVERLAP_AUTO;
      else if (strcmp(v, "full") == 0)
        overlap = REFIT_PLAN_OVERLAP_FULL;
      else if (strcmp(v, "pack") == 0)
        overlap = REFIT_PLAN_OVERLAP_PACK;
      else if (strcmp(v, "none") == 0)
        overlap = REFIT_PLAN_OVERLAP_NONE;
      else {
        fprintf(stderr,
                "refit-plan: --overlap expects auto, full, pack or none, got '%s'\n", v);
        return 2;
      }
    } else if (strcmp(argv[i], "--link-gbps") == 0 && i + 1 < argc) {
      char *end = NULL;
      gbps = strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || gbps <= 0) {
        fprintf(stderr,
                "refit-plan: --link-gbps expects a positive number, got "
                "'%s'\n",
                argv[i]);
        return 2;
      }
    } else if (strcmp(argv[i], "--nvlink-gbps") == 0 && i + 1 < argc) {
      char *end = NULL;
      nvlink = strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || nvlink <= 0) {
        fprintf(stderr,
                "refit-plan: --nvlink-gbps expects a positive number, "
                "got '%s'\n",
                argv[i]);
        return 2;
      }
    } else if (strcmp(argv[i], "--gpus-per-node") == 0 && i + 1 < argc) {
      char *end = NULL;
      long v = strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || v < 1 || v > 1024) {
        fprintf(stderr,
                "refit-plan: --gpus-per-node expects 1 .. 1024, got "
                "'%s'\n",
                argv[i]);
        return 2;
      }
      gpus_per_node = (int)v;
    } else if (argv[i][0] == '-')
      return refit_plan_usage();
    else if (path == NULL)
      path = argv[i];
    else
      return refit_plan_usage();
  }
  if (path == NULL || (per_bucket && copy <= 0))
    return refit_plan_usage();
  if (refit_plan_open(path, &report) != REFIT_OK)
    return 2;
  int T = 0, G = 0;
  refit_plan_report_world(report, &T, &G);

  double t0 = refit_plan_now();
  refit_status_t st = refit_plan_report_build(report);
  double plan_s = refit_plan_now() - t0;
  if (st != REFIT_OK) {
    fprintf(stderr, "refit-plan: %s: %s\n", refit_status_str(st), refit_last_error());
    refit_plan_report_close(report);
    return 1;
  }
  refit_plan_figures_t f;
  refit_plan_prediction_t s;
  const refit_plan_links_t links = {
      .link_gbps = gbps, .nvlink_gbps = nvlink, .gpus_per_node = gpus_per_node};
  refit_plan_report_figures(report, &f);
  refit_plan_report_predict(report, &links, &s);

  printf("refit-plan %s\n", path);
  printf("  model            %.3f B parameters, %lld trainer tensors\n",
         (double)f.parameters / 1e9, (long long)f.trainer_tensors);
  printf("  ranks            %d trainer + %d generator = %d\n", T, G, T + G);
  printf("  bytes moved      %.3f GB per refit\n", (double)s.total_bytes / 1e9);
  printf("  trainer egress   max %.3f GB, mean %.3f GB, max/mean %.3f\n",
         (double)s.egress_max / 1e9, s.egress_mean / 1e9,
         s.egress_mean > 0 ? (double)s.egress_max / s.egress_mean : 0.0);
  printf("  generator ingress max %.3f GB, mean %.3f GB, max/mean %.3f\n",
         (double)s.ingress_max / 1e9, s.ingress_mean / 1e9,
         s.ingress_mean > 0 ? (double)s.ingress_max / s.ingress_mean : 0.0);
  printf("  chunks           %lld\n", (long long)f.chunks);
  printf("  messages         %lld\n", (long long)f.messages);
  printf("  buckets          %d of at most %llu bytes per generator rank "
         "(largest staged: %lld)\n",
         f.buckets, (unsigned long long)f.bucket_bytes, (long long)s.staging_max);
  if (gpus_per_node > 0)
    printf("  network          NIC %.1f GB/s per rank and direction; %d GPUs per "
           "node on NVLink %.1f GB/s\n",
           gbps, gpus_per_node, nvlink);
  else
    printf("  network          NIC %.1f GB/s per rank and direction\n", gbps);
  printf("  floor            %.4f s (the busiest rank's bytes over its links)\n",
         s.floor_s);
  printf("  predicted        %.4f s, %.3f x the floor (buckets one after "
         "another)\n",
         s.predicted_s, s.floor_s > 0 ? s.predicted_s / s.floor_s : 0.0);
  printf("  worst bucket     trainer egress max/mean %.3f, generator ingress "
         "max/mean %.3f\n",
         s.bucket_egress_imbalance, s.bucket_ingress_imbalance);
  printf("  schedule spread  %.3f (1: every bucket from every trainer; 0: "
         "tensor order)\n",
         f.spread);
  /* Block FP8 or NVFP4 tensors assembling; under MXFP8 the arena is 0 (its
   * chunks land straight in the runtime layout), printed as such. */
  if (s.arena_max > 0 || f.mxfp8)
    printf("  assembly arena   %.1f MiB per generator rank (largest; bound "
           "refit.arena_bytes %.1f MiB); staging 2 x %.1f MiB\n",
           (double)s.arena_max / 1048576.0, (double)f.arena_bound / 1048576.0,
           (double)s.staging_max / 1048576.0);
  if (f.delta != 0)
    printf("  delta baseline   %.1f MiB per trainer rank (host memory; on GPUs %s); "
           "generators apply deltas in place and keep %.1f KiB of chunk digests "
           "per rank, on GPUs also pinned host memory for a bucket's frames "
           "(largest; refit.delta %s)\n",
           (double)f.delta_trainer_bytes / 1048576.0,
           f.delta_baseline == 2 ? "pinned host memory" : "GPU memory",
           (double)f.delta_generator_bytes / 1024.0, f.delta == 1 ? "on" : "auto");
  if (copy > 0 && refit_plan_print_pipeline(report, &links, copy, overlap, f.buckets,
                                            per_bucket) != 0) {
    refit_plan_report_close(report);
    return 1;
  }
  printf("  planned in       %.3f s\n", plan_s);
  printf("  plan hash        %016llx\n", (unsigned long long)f.hash);
  if (all_ranks || T + G <= 16) {
    int64_t bytes = 0;
    printf("\n  %-10s %6s %16s\n", "side", "rank", "bytes");
    for (int r = 0; r < T; r++) {
      refit_plan_report_rank_bytes(report, REFIT_PLAN_SIDE_TRAINER, r, &bytes);
      printf("  %-10s %6d %16lld\n", "trainer", r, (long long)bytes);
    }
    for (int g = 0; g < G; g++) {
      refit_plan_report_rank_bytes(report, REFIT_PLAN_SIDE_GENERATOR, g, &bytes);
      printf("  %-10s %6d %16lld\n", "generator", g, (long long)bytes);
    }
  }
  refit_plan_report_close(report);
  return 0;
}
