/*
 * refit/plan.h: a refit's plan without moving data, in one process.
 *
 * A configuration file is read and checked as refit_session_open reads it,
 * the model's tensors are catalogued and the reshard plan is made exactly
 * as every rank of a session makes it, and the plan's figures come back:
 * bytes per rank, messages, buckets, the assembly arena, the plan's
 * hash, and the transfer time predicted for a network. refit-plan prints
 * them; a scheduler can size a job with them.
 *
 * Needs neither MPI nor CUDA nor a GPU: this header and refit/status.h are
 * all it takes. The planner's own tables stay inside; what is given out is
 * copied into the structs below.
 *
 *   refit_plan_report_h r;
 *   refit_plan_report_open("job.yaml", &r, &errors);
 *   refit_plan_report_build(r);
 *   refit_plan_report_figures(r, &figures);
 *   refit_plan_report_predict(r, &links, &prediction);
 *   refit_plan_report_close(r);
 *
 * A report is not thread-safe: one thread at a time per report (reports of
 * their own are independent).
 */
#ifndef REFIT_PLAN_H
#define REFIT_PLAN_H

#include "refit/status.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A configuration read, and once built, its plan. */
typedef struct refit_plan_report_s *refit_plan_report_h;

/*
 * Read and check the configuration at `config_path` (its rules between
 * keys included; the world size is what the file asks for, not checked
 * against a launch). On success *out is a report to close with
 * refit_plan_report_close. On failure *out is untouched and, when `errors`
 * is not NULL, *errors receives a malloc'd text for a person, every problem
 * of the file on a line of its own with file:line:col (the caller frees
 * it; NULL when the failure is not the file's, e.g. out of memory: then
 * refit_last_error() says why). Does not block beyond reading the file.
 * Errors: REFIT_ERR_INVALID_ARGUMENT (NULL path or out), REFIT_ERR_SYSTEM
 * (the file cannot be read), REFIT_ERR_CONFIG (the file is wrong),
 * REFIT_ERR_NO_MEMORY.
 */
refit_status_t refit_plan_report_open(const char *config_path, refit_plan_report_h *out,
                                      char **errors);

/*
 * The MPI ranks the configuration needs: *trainers (trainer.tp * pp * dp)
 * and *generators (generator.tp * engines); a launch starts their sum. Any
 * time after open. Errors: REFIT_ERR_INVALID_ARGUMENT (NULL argument).
 */
refit_status_t refit_plan_report_world(refit_plan_report_h r, int *trainers,
                                       int *generators);

/*
 * Catalogue the model and make the plan, as a session does at open.
 * Single-threaded, CPU only; seconds for the largest layouts. Once per
 * report. Errors: REFIT_ERR_INVALID_ARGUMENT (NULL report, or a layout or
 * bound the planner refuses: refit_last_error() names it), REFIT_ERR_CONFIG
 * (a plan the config cannot run, as a session's open refuses it: under
 * refit.delta: on, a block FP8 tensor that travels BF16 because a trainer
 * shard splits a 128 x 128 block; refit_last_error() names it and what to
 * change), REFIT_ERR_STATE (already built), REFIT_ERR_NO_MEMORY,
 * REFIT_ERR_INTERNAL (a catalog that does not cover the model: a bug).
 */
refit_status_t refit_plan_report_build(refit_plan_report_h r);

/* The plan's figures, independent of any network. */
typedef struct {
  int trainers, generators; /* as refit_plan_report_world */
  int64_t parameters;       /* elements of the model's Hugging Face tensors */
  int64_t trainer_tensors;  /* tensors the trainers hold (per its names) */
  int64_t chunks;           /* rectangles moved per refit, all ranks */
  int64_t messages;         /* (trainer, generator, bucket) messages */
  int32_t buckets;          /* buckets per refit */
  uint64_t bucket_bytes;    /* refit.bucket_bytes: the staging bound */
  int mxfp8;                /* refit.precision: 1 mxfp8, 0 bf16 */
  uint64_t arena_bound;     /* refit.arena_bytes (0: none) */
  double spread;            /* the schedule's spread, 0 (tensor order) .. 1
                               (every bucket from every trainer) */
  uint64_t hash;            /* of the whole plan: equal on every rank of a
                               session with this configuration */
  int delta;                /* refit.delta: 0 off, 1 on, 2 auto */
  int delta_baseline;       /* refit.delta_baseline: 0 auto, 1 device, 2 host */
  /* With delta on or auto: the largest baseline of the last committed
   * version a trainer keeps (the bytes it packs, a message sent to several
   * engines once), and what a generator keeps, which applies deltas in
   * place in runtime storage: two 8-byte digests per chunk it lands; host
   * memory; 0 with delta off. */
  int64_t delta_trainer_bytes, delta_generator_bytes;
} refit_plan_figures_t;

/*
 * Fill *out with the built plan's figures. Errors: REFIT_ERR_INVALID_ARGUMENT
 * (NULL argument), REFIT_ERR_STATE (not built).
 */
refit_status_t refit_plan_report_figures(refit_plan_report_h r,
                                         refit_plan_figures_t *out);

/* The network a prediction assumes. Ranks are placed in blocks of
 * gpus_per_node in world order (trainers, then generators); a pair on one
 * node moves over NVLink, every other pair over the ranks' NICs;
 * gpus_per_node 0 puts every pair on the NIC. Bandwidths in GB/s (1e9
 * bytes) per rank and direction. */
typedef struct {
  double link_gbps;   /* NIC, > 0 */
  double nvlink_gbps; /* NVLink */
  int gpus_per_node;
} refit_plan_links_t;

/* Bytes per rank and the predicted transfer time. */
typedef struct {
  int64_t total_bytes;              /* moved per refit, digests not counted */
  int64_t egress_max, ingress_max;  /* the busiest trainer's, generator's */
  double egress_mean, ingress_mean; /* over all trainers, all generators */
  int64_t staging_max;              /* the largest bucket of a generator */
  int64_t arena_max;                /* the largest assembly arena (fp8_block, nvfp4) */
  double floor_s;                   /* the busiest rank's bytes over its links */
  double predicted_s;               /* buckets one after another */
  double bucket_egress_imbalance;   /* the worst bucket's max/mean */
  double bucket_ingress_imbalance;
} refit_plan_prediction_t;

/*
 * Fill *out for the built plan on `links`. Pure computation over the plan,
 * as many times as wanted. Errors: REFIT_ERR_INVALID_ARGUMENT (NULL
 * argument, or link_gbps not positive), REFIT_ERR_STATE (not built).
 */
refit_status_t refit_plan_report_predict(refit_plan_report_h r,
                                         const refit_plan_links_t *links,
                                         refit_plan_prediction_t *out);

/* Whether a bucket's transfer moves while the ranks pack and land. */
typedef enum {
  /* From the configuration: where it keeps every rank in host memory
   * (refit.transport mpi, or refit.device_map none), PACK for MPI and
   * NONE for UCX; else FULL. A job in host memory for want of a GPU names
   * its overlap itself. */
  REFIT_PLAN_OVERLAP_AUTO = 0,
  /* Transfers move beside the ranks' passes (GPU transports: NCCL's
   * kernels, CUDA IPC's copies). */
  REFIT_PLAN_OVERLAP_FULL = 1,
  /* Transfers move while trainers pack, not while generators land: the
   * generator's own CPU moves the bytes in its transport calls (MPI in
   * host memory on one host, single-copy CMA). */
  REFIT_PLAN_OVERLAP_PACK = 2,
  /* Transfers move only while both ends are in their transport calls:
   * neither while the generator lands nor while the trainer packs the next
   * bucket (UCX in host memory on one host, over TCP). */
  REFIT_PLAN_OVERLAP_NONE = 3
} refit_plan_overlap_t;

/* The ranks' own passes over memory, for refit_plan_report_pipeline. */
typedef struct {
  double copy_gbps; /* one rank's memory copy rate (GB/s, 1e9 bytes copied a
                       second) while the job's other ranks run too; > 0 */
  refit_plan_overlap_t overlap;
} refit_plan_copy_t;

/* One bucket of the pipelined prediction: each stage's busiest rank, and
 * when each stage of the bucket ends, in seconds from the moment every
 * trainer holds the new weights. */
typedef struct {
  int64_t pack_bytes; /* the busiest trainer's: (read + written) / 2 */
  int64_t land_bytes; /* the busiest generator's land, likewise ... */
  int64_t save_bytes; /* ... and its restore save (sync, restore: full) */
  double pack_s, transfer_s, land_s;
  double pack_end_s, transfer_end_s, land_end_s;
} refit_plan_bucket_t;

typedef struct {
  double pack_s, transfer_s, land_s; /* each stage summed over buckets */
  int64_t save_bytes;                /* the restore saves, summed */
  double commit_s;              /* refit.mode async: the commit's copy of the shadow */
  double total_s;               /* the last bucket landed, plus commit_s */
  refit_plan_overlap_t overlap; /* as used (AUTO resolved) */
} refit_plan_pipeline_prediction_t;

/*
 * The refit as the lifecycle pipelines it (docs/architecture.md, "The
 * prediction's model"): per bucket the busiest trainer's pack, the
 * busiest rank's transfer over `links` (as refit_plan_report_predict) and
 * the busiest generator's land with its restore save, each pass charged
 * (bytes read + bytes written) / 2 at copy->copy_gbps; two exchanges in
 * flight; transfers beside landing or not (copy->overlap). `buckets`, when
 * not NULL, receives figures.buckets entries. Pure computation over the
 * plan. Errors: REFIT_ERR_INVALID_ARGUMENT (NULL argument, a rate not
 * positive), REFIT_ERR_STATE (not built), REFIT_ERR_NO_MEMORY.
 */
refit_status_t refit_plan_report_pipeline(refit_plan_report_h r,
                                          const refit_plan_links_t *links,
                                          const refit_plan_copy_t *copy,
                                          refit_plan_bucket_t *buckets,
                                          refit_plan_pipeline_prediction_t *out);

typedef enum {
  REFIT_PLAN_SIDE_TRAINER = 0,
  REFIT_PLAN_SIDE_GENERATOR = 1
} refit_plan_side_t;

/*
 * *bytes: what trainer `rank` sends (REFIT_PLAN_SIDE_TRAINER, rank in
 * [0, trainers)) or generator `rank` receives (REFIT_PLAN_SIDE_GENERATOR,
 * [0, generators)) per refit. Errors: REFIT_ERR_INVALID_ARGUMENT (NULL
 * argument, a side or rank out of range), REFIT_ERR_STATE (not built).
 */
refit_status_t refit_plan_report_rank_bytes(refit_plan_report_h r, refit_plan_side_t side,
                                            int rank, int64_t *bytes);

/* Free the report and its plan; NULL is allowed. */
void refit_plan_report_close(refit_plan_report_h r);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_PLAN_H */
