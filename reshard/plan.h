/*
 * The reshard planner: descriptors in, plan out.
 *
 * For every generator rank (engine-major: rank g is tp rank g % tp of engine
 * g / tp) and every byte of its runtime tensors, the plan names exactly one
 * trainer rank and the rectangle of that rank's shard that provides it.
 * Replicas (dp, edp, replicated tensors, KV heads shared by several generator
 * ranks) are alternatives: each piece goes to the least-loaded holder so far.
 *
 * Pieces are cut into chunks and grouped into buckets so that no generator
 * rank stages more than bucket_bytes in one bucket. Within a bucket all chunks
 * between one (trainer, generator) pair form one message; the generator's
 * staging area for a bucket holds its messages back to back, ordered by
 * trainer rank, and each message holds its chunks back to back, each chunk
 * its rows back to back.
 *
 * Pure C: no MPI, no CUDA, no I/O.
 */
#ifndef REFIT_RESHARD_PLAN_H
#define REFIT_RESHARD_PLAN_H

#include "reshard/catalog.h"

#include <stdint.h>

/* What crosses the wire for quantizable tensors. */
typedef enum {
  REFIT_WIRE_BF16 = 0,  /* 2 bytes per element everywhere */
  REFIT_WIRE_MXFP8 = 1  /* tensors marked quantized: per row, K e4m3 bytes
                           then K/32 E8M0 scale bytes; others stay BF16 */
} refit_wire_t;

typedef struct {
  uint64_t bucket_bytes; /* staging bound per generator rank and bucket */
  refit_wire_t wire;
  /* Bytes after each chunk's rows (its integrity digest), counted in the
   * staging bound; 0 for none. */
  int32_t chunk_trailer;
  /* Start a new bucket at every new destination tensor (the benchmark
   * baseline: one message per tensor). */
  int per_tensor_buckets;
} refit_plan_options_t;

typedef struct {
  int32_t src_rank;   /* trainer rank, 0 .. T-1 */
  int32_t dst_rank;   /* generator rank within the generator group */
  int32_t src_tensor; /* index into catalog->src */
  int32_t dst_tensor; /* index into catalog->gen */
  int32_t bucket;
  int32_t row_bytes;        /* bytes of one row of this chunk on the wire */
  int64_t src_row, src_col; /* in the source shard's local coordinates */
  int64_t rows, cols;
  int64_t dst_row, dst_col; /* in the runtime tensor's matrix */
  int64_t offset;           /* byte offset in the destination's staging;
                               the chunk's trailer follows its rows */
} refit_chunk_t;

typedef struct {
  int32_t src_rank, dst_rank, bucket;
  int64_t offset, bytes; /* place in the destination's staging */
  int64_t chunk_begin, chunk_count;
} refit_msg_t;

typedef struct {
  refit_plan_options_t options;
  int32_t ntrainer, ngenerator, nbuckets;
  refit_chunk_t *chunks; /* sorted by (bucket, dst, src, dst order) */
  int64_t nchunks;
  refit_msg_t *msgs;     /* sorted by (bucket, dst, src) */
  int64_t nmsgs;
  int64_t *bucket_msg_begin; /* nbuckets + 1 */
  int64_t *egress;           /* bytes sent, per trainer rank */
  int64_t *ingress;          /* bytes received, per generator rank */
  int64_t *staging;          /* largest bucket, per generator rank */
  uint64_t hash;             /* of everything above */
} refit_plan_t;

refit_status_t refit_plan_create(const refit_catalog_t *cat,
                                 const refit_plan_options_t *options,
                                 refit_plan_t **out);
void refit_plan_destroy(refit_plan_t *plan);

/* Bytes one row of `cols` elements of generator tensor `gen` takes on the
 * wire in format `wire`. */
int64_t refit_plan_row_bytes(const refit_gen_tensor_t *gen, refit_wire_t wire,
                             int64_t cols);

/*
 * The order in which generator rank `gen_rank` lands its chunks: by bucket,
 * then in the rank's tensor order (not the message order of the staging
 * area), so that a tensor's pieces land together and its assembly area is
 * short-lived. *order (malloc'd, the caller frees) lists plan chunk indices.
 * Not thread-safe (qsort without a context).
 */
refit_status_t refit_plan_land_order(const refit_plan_t *plan, int32_t gen_rank,
                                     int64_t **order, int64_t *count);

/*
 * Where each MXFP8 tensor of generator rank `gen_rank` assembles while it is
 * incomplete: a tensor takes an area at its first chunk (in land order) and
 * gives it back at its last, first fit, 256-byte aligned. offsets[i] is the
 * byte offset of local tensor i (cat->gen_begin[tp rank] + i) or -1 when it
 * is not quantized; *bytes the area needed, the most bytes ever incomplete at
 * once. The loader lands a bucket in runs that end where a tensor completes,
 * so an area is reused only after its tensor's layout transform.
 */
refit_status_t refit_plan_assembly(const refit_plan_t *plan,
                                   const refit_catalog_t *cat, int32_t gen_rank,
                                   int64_t *offsets, int64_t *bytes);

/* Canonical MXFP8 bytes of a tensor: e4m3 values then linear scales. */
int64_t refit_plan_assembly_bytes(const refit_gen_tensor_t *gen);

typedef struct {
  int64_t total_bytes;
  int64_t egress_max, ingress_max;
  double egress_mean, ingress_mean;
  int64_t staging_max;
  /* Lower bound of the transfer time at `link_gbps` GB/s per rank and
   * direction: per bucket the busiest rank's bytes, summed over buckets. */
  double predicted_s;
} refit_plan_stats_t;

void refit_plan_stats(const refit_plan_t *plan, double link_gbps,
                      refit_plan_stats_t *stats);

#endif /* REFIT_RESHARD_PLAN_H */
