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
 * rank stages more than bucket_bytes in one bucket. The schedule (which rows
 * go into which bucket) keeps every link busy: each generator rank's bytes
 * form one stream per trainer rank, and bucket k takes from every stream the
 * rows that fall in the k-th of nbuckets equal windows of that stream, so
 * that in every bucket each generator receives from all its trainers and each
 * trainer sends its share of the whole refit (docs/architecture.md). The
 * spread trades assembly memory (block FP8, NVFP4) for that balance
 * (arena_bytes); MXFP8 takes none, so it always keeps the full spread.
 * Within a bucket all chunks
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
  REFIT_WIRE_MXFP8 = 1, /* tensors marked quantized: per row, K e4m3 bytes
                           then K/32 E8M0 scale bytes; others stay BF16 */
  /* Tensors marked block FP8 whose every trainer piece holds whole 128 x 128
   * blocks of its Hugging Face tensor (refit_plan_t.block_wire): per row, K
   * e4m3 bytes then ceil(K/128) FP32 scale slots (little-endian) holding
   * the scale_inv values of the row's block row (every row of it repeats
   * them; kernels/datapath.h says why); chunks of such a tensor are cut at
   * block rows only. Other tensors stay BF16 (assembled and quantized on
   * the generator). */
  REFIT_WIRE_FP8_BLOCK = 2
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
  /* Bound of the assembly arena of every generator rank (the most bytes of
   * block FP8 and NVFP4 tensors incomplete at once, refit_plan_assembly;
   * MXFP8 lands straight in the runtime layout and takes none);
   * 0 for none. Spreading every bucket over all trainers keeps a tensor of
   * every pipeline stage open at once; when that needs more than the bound,
   * the schedule narrows the spread towards tensor order until it fits, and
   * refuses the plan when even tensor order does not. */
  uint64_t arena_bytes;
} refit_plan_options_t;

typedef struct {
  int32_t src_rank;   /* trainer rank, 0 .. T-1 */
  int32_t dst_rank;   /* generator rank within the generator group */
  int32_t src_tensor; /* index into catalog->src */
  int32_t dst_tensor; /* index into catalog->gen */
  int32_t bucket;
  int64_t row_bytes;        /* bytes of one row of this chunk on the wire */
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
  refit_msg_t *msgs; /* sorted by (bucket, dst, src) */
  int64_t nmsgs;
  int64_t *bucket_msg_begin; /* nbuckets + 1 */
  int64_t *egress;           /* bytes sent, per trainer rank */
  int64_t *ingress;          /* bytes received, per generator rank */
  int64_t *staging;          /* largest bucket, per generator rank */
  int64_t *arena;            /* assembly arena, per generator rank
                                (refit_plan_assembly's bytes; 0 when no
                                tensor assembles) */
  /* The schedule's spread, 0 .. 1: 1 spreads every stream evenly over all
   * buckets, 0 keeps each rank's tensor order; between, a row's place is
   * that blend of its two positions (arena_bytes chose it). */
  double spread;
  /* REFIT_WIRE_FP8_BLOCK only (else NULL): per catalog->gen entry, how the
   * tensor travels (refit_block_wire_t). */
  uint8_t *block_wire;
  uint64_t hash; /* of everything above */
} refit_plan_t;

/* How a block FP8 tensor travels under REFIT_WIRE_FP8_BLOCK. */
typedef enum {
  REFIT_BLOCK_WIRE_BF16 = 0, /* BF16, assembled and quantized on the generator */
  REFIT_BLOCK_WIRE_CUT = 1,  /* quantized by the trainer; cut at block rows */
  REFIT_BLOCK_WIRE_WHOLE = 2 /* quantized by the trainer; pieces never cut (its
                                Hugging Face tensors end in a partial block
                                column, padded with their last element, which
                                every chunk must then hold) */
} refit_block_wire_t;

refit_status_t refit_plan_create(const refit_catalog_t *cat,
                                 const refit_plan_options_t *options, refit_plan_t **out);
void refit_plan_destroy(refit_plan_t *plan);

/* Does chunk ch travel quantized (an MXFP8 wire and a quantized runtime
 * tensor, or a block FP8 wire and a tensor of whole trainer blocks: the
 * trainer quantizes it)? */
int refit_plan_chunk_quantized(const refit_plan_t *plan, const refit_catalog_t *cat,
                               const refit_chunk_t *ch);

/* Do messages a and b carry the same bytes: the same chunks of the same
 * source rectangles, packed the same way at the same places? A trainer packs
 * such messages of one bucket once (every engine replica needs them). */
int refit_plan_msgs_same(const refit_plan_t *plan, const refit_catalog_t *cat,
                         const refit_msg_t *a, const refit_msg_t *b);

/* The bytes trainer rank `trainer` packs per refit: its messages, each one
 * equal to an earlier one of its bucket counted once (what a delta refit's
 * trainer baseline holds). */
int64_t refit_plan_packed_bytes(const refit_plan_t *plan, const refit_catalog_t *cat,
                                int32_t trainer);

/* Does generator tensor `gen` (catalog->gen index) travel as block FP8
 * quantized by the trainer (landed in place, without an assembly area)? */
int refit_plan_block_prequantized(const refit_plan_t *plan, int64_t gen);

/* Under REFIT_WIRE_FP8_BLOCK: the first block FP8 tensor from catalog index
 * `from` on that falls back to BF16 (assembled and quantized on the
 * generator), or -1 (none, or another wire). */
int64_t refit_plan_block_fallback(const refit_plan_t *plan, const refit_catalog_t *cat,
                                  int64_t from);

/* Why block FP8 tensor `gen` falls back to BF16 under the plan's options,
 * said for a person into why[len] (empty when it does not): the trainer rank
 * whose piece of it is not whole 128 x 128 blocks, or the smallest cut that
 * does not fit a bucket. Errors: no memory. */
refit_status_t refit_plan_block_why(const refit_plan_t *plan, const refit_catalog_t *cat,
                                    int64_t gen, char *why, size_t len);

/* Bytes one row of `cols` elements of generator tensor `gen` takes on the
 * wire in format `wire` (`block`: a tensor the trainer quantizes to block
 * FP8). */
int64_t refit_plan_row_bytes(const refit_gen_tensor_t *gen, refit_wire_t wire, int block,
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
 * Where each tensor of generator rank `gen_rank` that assembles
 * (refit_plan_assembles) lies while it is incomplete: a tensor takes an area at its first
 * chunk (in land order) and gives it back at its last, first fit, 256-byte aligned.
 * offsets[i] is the byte offset of local tensor i (cat->gen_begin[tp rank] + i) or -1
 * when it does not assemble; *bytes the area needed, the most bytes ever incomplete at
 * once. The loader lands a bucket in runs that end where a tensor completes,
 * so an area is reused only after its tensor's layout transform.
 */
refit_status_t refit_plan_assembly(const refit_plan_t *plan, const refit_catalog_t *cat,
                                   int32_t gen_rank, int64_t *offsets, int64_t *bytes);

/* Does quantized tensor `gen` assemble in the arena? Block FP8 and NVFP4
 * do: a 128 x 128 block spans chunks, an NVFP4 tensor needs its global
 * scale. MXFP8 does not: every chunk holds whole 1 x 32 blocks (the config
 * keeps every shard boundary along K on a block), and every MXFP8 runtime
 * layout puts a row where its index alone says (kernels/layout.h), so the
 * loader lands each chunk straight at its place in the runtime layout. */
int refit_plan_assembles(const refit_gen_tensor_t *gen);

/* Bytes a quantized tensor assembles in: MXFP8's canonical e4m3 values then
 * linear scales, or block FP8's and NVFP4's BF16 matrix (a 128 x 128 block
 * spans chunks, an NVFP4 tensor needs its global scale: either is quantized
 * once the tensor is complete). */
int64_t refit_plan_assembly_bytes(const refit_gen_tensor_t *gen);

/* The network a prediction assumes. Ranks are placed in blocks of
 * gpus_per_node (world order: trainers, then generators, as the
 * disaggregated launch places them); a pair on one node moves over NVLink,
 * every other pair over the rank's NIC. gpus_per_node 0 puts every pair on
 * the NIC. Bandwidths in GB/s (1e9 bytes) per rank and direction. */
typedef struct {
  double link_gbps;
  double nvlink_gbps;
  int32_t gpus_per_node;
} refit_plan_network_t;

typedef struct {
  int64_t total_bytes;
  int64_t egress_max, ingress_max;
  double egress_mean, ingress_mean;
  int64_t staging_max;
  int64_t arena_max; /* largest assembly arena of a generator rank */
  /* The floor: the busiest rank's whole refit over its links (NIC and
   * NVLink bytes each at their own speed, the slower one counting). */
  double floor_s;
  /* Transfer time with buckets one after another: per bucket the busiest
   * rank's time as in floor_s, summed over buckets. */
  double predicted_s;
  /* The worst bucket's max/mean of trainer egress and generator ingress
   * (means over all trainer, all generator ranks). */
  double bucket_egress_imbalance, bucket_ingress_imbalance;
} refit_plan_stats_t;

/* Statistics with every pair on a NIC of `link_gbps` (0: no prediction). */
void refit_plan_stats(const refit_plan_t *plan, double link_gbps,
                      refit_plan_stats_t *stats);
void refit_plan_predict(const refit_plan_t *plan, const refit_plan_network_t *net,
                        refit_plan_stats_t *stats);

/* Whether the transport moves a bucket's bytes while the ranks pack and
 * land (refit_plan_passes_t.progress). */
typedef enum {
  /* GPU transports: NCCL's kernels, CUDA IPC's copies run beside the
   * ranks' own kernels. */
  REFIT_PLAN_PROGRESS_ASYNC = 0,
  /* The receiver moves the bytes, in its transport calls (MPI in host
   * memory on one host: the generator's CPU copies them by CMA in its
   * wait): never while the generator lands; while the trainer packs, yes. */
  REFIT_PLAN_PROGRESS_RECEIVER = 1,
  /* Bytes move only while both ends are in their transport calls (UCX on
   * one host, over TCP): neither while the generator lands nor while the
   * trainer packs the next bucket. */
  REFIT_PLAN_PROGRESS_BOTH = 2
} refit_plan_progress_t;

/* The ranks' own passes over memory that a prediction charges. */
typedef struct {
  /* One rank's memory copy rate, GB/s (1e9 bytes copied a second) while
   * the other ranks run too; a pass that reads R bytes and writes W is
   * charged (R + W) / 2 at it. */
  double copy_gbps;
  refit_plan_progress_t progress;
  /* refit.mode sync with refit.restore full: a tensor's whole runtime
   * storage is copied aside before its first chunk of the refit lands. */
  int save;
  /* refit.mode async: the commit copies the whole shadow into runtime
   * storage. */
  int commit_copy;
} refit_plan_passes_t;

/* One bucket of a pipelined prediction: each stage's busiest rank, and
 * when the stage ends, in seconds from the moment every trainer holds the
 * new weights. */
typedef struct {
  int64_t pack_bytes; /* the busiest trainer's charged bytes */
  int64_t land_bytes; /* the busiest generator's land ... */
  int64_t save_bytes; /* ... and restore save */
  double pack_s, transfer_s, land_s;
  double pack_end_s, transfer_end_s, land_end_s;
} refit_plan_bucket_prediction_t;

/* A pipelined prediction's sums. */
typedef struct {
  double pack_s, transfer_s, land_s; /* each stage summed over buckets */
  int64_t save_bytes;                /* summed over buckets (busiest ranks) */
  double commit_s;                   /* the async commit's copy, else 0 */
  double total_s;                    /* the last land's end plus the commit */
} refit_plan_pipeline_t;

/*
 * The refit predicted as the lifecycle pipelines it (docs/architecture.md,
 * "The prediction's model"): per bucket, the busiest trainer's pack, the
 * busiest rank's transfer over its links (as refit_plan_predict) and the
 * busiest generator's land (and restore save), each pass's bytes at
 * passes->copy_gbps; then the schedule of two exchanges in flight.
 * buckets[] holds plan->nbuckets entries. Computation (quantizing, digests),
 * per-message latency and the begin and commit exchanges are not charged.
 * Errors: REFIT_ERR_INVALID_ARGUMENT (a rate not positive),
 * REFIT_ERR_NO_MEMORY.
 */
refit_status_t refit_plan_predict_passes(const refit_plan_t *plan,
                                         const refit_catalog_t *cat,
                                         const refit_plan_network_t *net,
                                         const refit_plan_passes_t *passes,
                                         refit_plan_bucket_prediction_t *buckets,
                                         refit_plan_pipeline_t *out);

#endif /* REFIT_RESHARD_PLAN_H */
