/*
 * The generator loader: lands received chunks in runtime storage.
 *
 * It owns the generator's runtime stores (allocated once, written in place
 * every refit). BF16 tensors are written straight into their target, and so
 * are MXFP8 ones, block by block at their places in the runtime layout
 * (kernels/direct.h: the layout's row permutation and the 128x4 scale
 * swizzle folded into the landing):
 *
 *   staging chunk --(BF16 wire: quantize | MXFP8 wire: split)--> runtime
 *   weight + scale
 *
 * Block FP8 and NVFP4 tensors assemble in an area per tensor that exists
 * only while the tensor is incomplete (a 128 x 128 block spans chunks; a
 * global scale needs the whole tensor):
 *
 *   staging chunk --copy--> BF16 [rows, K] --(all pieces present:
 *   quantize and lay out)--> runtime weight + scales
 *
 * Chunks are copied out of the staging area as they are landed, so a staging
 * buffer can be reused for the next bucket while a fused tensor (qkv, gate_up,
 * w13) still waits for pieces that travel in later buckets.
 *
 * The target of a refit is either the runtime storage itself (sync mode) or a
 * shadow copy of it (async mode); see refit_loader_set_target().
 */
#ifndef REFIT_LOADER_H
#define REFIT_LOADER_H

#include "config/config.h"
#include "kernels/direct.h"
#include "kernels/place.h"
#include "device/memory.h"
#include "reshard/blocks.h"
#include "reshard/catalog.h"
#include "reshard/plan.h"
#include "source/source.h"

#include <stddef.h>
#include <stdint.h>

typedef enum {
  REFIT_DTYPE_BF16 = 0, /* uint16 bit patterns */
  REFIT_DTYPE_E4M3 = 1, /* float8_e4m3fn bytes */
  REFIT_DTYPE_E8M0 = 2, /* block scale exponent bytes */
  REFIT_DTYPE_F32 = 3,  /* float32 bits (REFIT_ROLE_F32 tensors, fp8_block's weight_scale_inv) */
  REFIT_DTYPE_U8 = 4    /* uint8: NVFP4's E2M1 values two to a byte */
} refit_dtype_t;

const char *refit_dtype_name(refit_dtype_t dtype);

/*
 * One piece of generator runtime storage, named as vLLM names it
 * ("model.layers.0.self_attn.qkv_proj.weight", "...weight_scale"). Allocated
 * once at start-up; every refit writes into the same bytes.
 */
typedef struct {
  char name[REFIT_NAME_MAX + 16];
  refit_dtype_t dtype;
  const char *layout; /* "linear", "linear_kn", "swizzle_128x4",
                         "trtllm_dense", "trtllm_moe_w13", "trtllm_moe_w2",
                         "cutlass_moe_w31", "per_expert",
                         "block_128x128" */
  int ndim;
  int64_t shape[3];
  void *data;    /* runtime storage: its address never changes */
  void *target;  /* where the refit in progress writes (data or saved) */
  void *saved;   /* sync + restore full: the previous version, copied just
                    before the first write; async: the shadow; else NULL */
  int saved_valid; /* sync: saved holds data's previous bytes this refit */
  size_t bytes;
  int64_t gen;   /* index into catalog->gen */
  int is_scale;  /* the _scale (_scale_inv, _scale_2) beside a quantized weight */
} refit_store_t;

typedef struct {
  const refit_catalog_t *cat;
  const refit_config_t *cfg;
  refit_mem_t *mem; /* host or device: where stores, arena and staging live */
  int tp_rank;
  int generator_rank;
  int64_t first;    /* cat->gen_begin[tp_rank] */
  int64_t ntensors; /* catalog tensors of this tp rank */
  refit_store_t *stores;
  int64_t nstores;
  int64_t *store_of; /* tensor i -> its weight store; the scale follows */
  refit_wire_t wire;
  int32_t trailer; /* digest bytes after each chunk (0: none) */
  uint64_t run_id; /* the job's, in every chunk's seal (set before allocate) */

  /* Assembly: a block FP8 or NVFP4 tensor i, while incomplete, has its
   * BF16 matrix [rows, K] (NVFP4: then its scales) at arena + arena_off[i]
   * (blocks span chunks: they are quantized when the tensor is complete);
   * MXFP8 tensors take none (refit_plan_assembles). Offsets come from the plan (a
   * tensor's area is reused once it is complete), so the arena is as large
   * as the most bytes ever incomplete at once. */
  uint8_t *arena;
  int64_t arena_bytes;
  int64_t *arena_off; /* -1 for tensors that are not quantized */
  /* Block FP8 and NVFP4: tensor i's pieces (reshard/blocks.h), NULL for
   * others. */
  refit_block_piece_t **pieces;
  int64_t *npieces;
  /* NVFP4: the global scales this refit (refit_loader_nvfp4_scales), 0
   * until set: tensor i's at gsf + gsf_at[i], one per stacked matrix
   * (expert; one for a 2-D tensor). */
  float *gsf;
  int64_t *gsf_at;

  /* One land descriptor per chunk this rank receives, bucket by bucket;
   * within a bucket, those landed by `land` first, then from land_split[b]
   * the MXFP8 ones, which `layout` lands (a refit_direct_desc_t at the same
   * index: staged QUANTIZE or SPLIT straight into the runtime layout; its
   * `land` twin still describes the wire chunk for the delta path, and the
   * land kernels never run it), then layout_pads PAD descriptors (the
   * layouts' padding, written with bucket 0). */
  refit_mem_table_t land, layout;
  int64_t *land_begin;  /* nbuckets + 1 */
  int64_t *land_split;  /* nbuckets */
  int64_t layout_pads;
  int64_t *desc_tensor; /* local tensor index of each descriptor */
  int64_t *desc_chunk;  /* plan chunk of each descriptor */
  unsigned char *desc_completes; /* its assembling tensor is complete after it */
  const refit_plan_t *plan;

  /* Runtime storage the session owns, and every saved copy, each one
   * allocation; slab_bytes > 0 when every store is in data_slab (then the
   * async commit is one copy). */
  void *data_slab, *saved_slab;
  size_t slab_bytes;

  int64_t *filled; /* elements landed this refit, per tensor */
  int touched;     /* sync: runtime storage written this refit */

  /* Zero-copy (refit.zero_copy, loader_direct.c): `land` holds
   * refit_direct_desc_t, the chunks bucket by bucket, then direct_pads PAD
   * descriptors run with bucket 0; direct_acc the kernels' accumulators. */
  int direct;
  int64_t direct_pads;
  void *direct_acc;

  /* Delta refits in place (loader_delta.c). in_place: every chunk of this
   * rank lands bytewise (BF16 copies, prequantized MXFP8 splits) and its
   * trailer is a digest or nothing, so a delta applies straight to runtime
   * storage through place[] (one per tensor, over the stores' targets);
   * chunk_desc maps a plan chunk to its descriptor (-1: another rank's).
   * sum[0] holds, per descriptor, the unsealed digest of the committed
   * version's chunk rows, sealed with sum_tag; sum[1] the refit in
   * progress's (the candidate), swapped in at commit. */
  int in_place;
  refit_place_tensor_t *place;
  int64_t *chunk_desc;
  uint64_t *sum[2];
  int64_t nsums;
  uint64_t sum_tag, cand_tag;
  /* This refit: runtime bytes a delta named as changed, and runtime bytes
   * written (a full refit: every chunk's landed bytes). */
  uint64_t changed_bytes, written_bytes;
  /* Sync, restore: full, a delta refit: the undo log of the bytes written
   * in place (address, old value), so that rollback need not have saved
   * whole stores; at most undo_max entries (a sixteenth of the stores'
   * bytes), beyond which a chunk's stores are saved whole as in a full
   * refit. Rollback restores saved stores, then undoes the log (each byte is
   * written once a refit, so its old value is the one before the refit). */
  uint8_t **undo_at;
  uint8_t *undo_old;
  int64_t nundo, undo_cap, undo_max;
  /* On a GPU (refit_loader_delta_gpu): a bucket's batch (host tables), the
   * undo log in device memory (addresses, then old values; nundo entries
   * used), and the trailers of a full refit's bucket, read back at once. */
  refit_place_cuda_chunk_t *gpu_chunks;
  refit_place_cuda_out_t *gpu_outs;
  const void **gpu_hosts;
  unsigned char *gpu_seen;      /* per descriptor: applied this refit */
  unsigned char *gpu_completes; /* per batch entry: its tensor's last chunk */
  int64_t gpu_cap;
  uint64_t *undo_dev_at;
  uint8_t *undo_dev_old;
  int64_t undo_dev_cap;
  uint64_t *trail_host;
  refit_mem_piece_t *trail_pieces;
  unsigned char *trail_dev;
  int64_t trail_cap;
} refit_loader_t;

/* Allocate the stores of tp rank `tp_rank`. The catalog's `quantized` flags
 * must already be set (refit_config_mark_quantized). */
refit_status_t refit_loader_create(const refit_catalog_t *cat,
                                   const refit_config_t *cfg, refit_mem_t *mem,
                                   int tp_rank, int generator_rank,
                                   const refit_plan_t *plan,
                                   refit_loader_t **out);

/* Allocate runtime storage for every store not registered by the caller,
 * the saved copies the mode needs and the arena, and build the land tables
 * against `staging` layout. Once, before the first refit. */
refit_status_t refit_loader_allocate(refit_loader_t *l);
void refit_loader_destroy(refit_loader_t *l);

/* refit.keep_staging: false: give back the assembly arena and the land
 * tables (which point into it) between refits, and take them again. */
void refit_loader_release(refit_loader_t *l);
refit_status_t refit_loader_acquire(refit_loader_t *l);

/* Start a refit: forget partial assemblies, count from zero, point every
 * store's target at runtime storage (sync) or its shadow (async). */
void refit_loader_begin(refit_loader_t *l);

/*
 * NVFP4: the global scale of every quantized tensor of this rank from the
 * amax keys of the whole Hugging Face tensors (hf_keys[h] for catalog->hf
 * h, the max over every trainer shard: the begin collective): a tensor
 * (each expert of a stack) takes the max over its pieces (q, k, v of
 * qkv_proj; gate and up of gate_up_proj and of an expert's w13), as vLLM
 * keeps the max of a fused layer's weight_scale_2 (and w13's one decode
 * scale per expert).
 * Set before anything of the refit lands.
 */
void refit_loader_nvfp4_scales(refit_loader_t *l, const uint16_t *hf_keys);

/* The fault seam (fault/fault.h, test builds): what landing does to one chunk
 * of the next message. */
typedef enum {
  REFIT_LAND_NORMAL = 0,
  REFIT_LAND_DROP_ONE,      /* skip the message's first chunk */
  REFIT_LAND_DUPLICATE_ONE, /* land the message's first chunk twice */
  REFIT_LAND_FLIP_ONE       /* flip a bit of the first chunk before landing */
} refit_land_fault_t;

/* `f` as this build plays it: a production build has no fault seam, so it is
 * the constant REFIT_LAND_NORMAL, and every branch on it is dropped. Each
 * function that is given a land fault reads it through this. */
static inline refit_land_fault_t refit_land_fault(refit_land_fault_t f) {
  return REFIT_FAULTS_BUILT ? f : REFIT_LAND_NORMAL;
}


/* Land bucket b from `staging` (the bucket's area), checking each chunk's
 * digest, sealed with `tag` (refit_seal_tag of this refit), when the plan
 * carries digests; completes the layout of every quantized tensor whose last
 * piece arrived. Returns when the bucket's work is done, so the staging area
 * may be reused. A chunk whose rows are intact but whose seal is another
 * refit's is REFIT_ERR_INTEGRITY naming that refit's version and attempt. */
refit_status_t refit_loader_land_bucket(refit_loader_t *l, int32_t b,
                                        unsigned char *staging, uint64_t tag,
                                        refit_land_fault_t fault);

/*
 * Delta refits in place (loader_delta.c; l->in_place). Plan chunk `c` of a
 * delta refit sealed with `tag`: `bytes` (len of them) are either its delta
 * (kernels/delta.h) against the committed version, or, with `full` set, its
 * whole span (rows and trailer) as a full message carries it. Checks
 * everything before it writes anything: the delta's shape, that every byte
 * it names as changed differs from what runtime storage (the trailer: the
 * committed one) holds, and the chunk's digest, the committed one plus the
 * change over the 8-byte words touched, against the new trailer. Then writes
 * the changed bytes to the target (runtime storage or the async shadow) and
 * keeps the candidate digest. `what` names the message (bucket, trainer and
 * generator rank, version), `index` and `count` the chunk within it, in
 * errors: REFIT_ERR_INTEGRITY, nothing of the chunk written then.
 */
refit_status_t refit_loader_delta_chunk(refit_loader_t *l, int64_t c,
                                        const unsigned char *bytes, size_t len, int full,
                                        uint64_t tag, const char *what, int64_t index,
                                        int64_t count);

/*
 * The same on a GPU, for a whole bucket at once (kernels/place_cuda.h): n
 * chunks, each plan chunk `chunk` with its delta (or whole span, `full`) at
 * `dev` in device memory and a host copy at `host` (NULL for a whole span).
 * Every chunk of the batch is checked (its shape, the bytes it names, its
 * digest) before any byte of any is written. On an error *bad is the index
 * of the chunk at fault (or -1) and nothing was written.
 */
typedef struct {
  int64_t chunk;
  const unsigned char *host, *dev;
  size_t len;
  int full;
} refit_loader_gpu_chunk_t;
refit_status_t refit_loader_delta_gpu(refit_loader_t *l, const refit_loader_gpu_chunk_t *c,
                                      int64_t n, uint64_t tag, int64_t *bad);

/* Zero-copy: one descriptor per chunk this rank receives, reading the
 * trainers' shards in place: bases[t * nsrc + i] is trainer rank t's shard of
 * catalog tensor i in this process (mapped), or NULL where it holds none.
 * Built at the first begin, and again when a trainer tensor moved. */
refit_status_t refit_loader_direct_tables(refit_loader_t *l, const uint16_t *const *bases,
                                          int64_t nsrc);

/* Zero-copy: land bucket b, reading each chunk in place and checking it
 * against the trainer's sealed digests in `digests` (this rank's memory: what
 * the bucket's messages carried); bucket 0 also writes the layouts' padding.
 * Errors as refit_loader_land_bucket's. */
refit_status_t refit_loader_land_direct(refit_loader_t *l, int32_t b, unsigned char *digests,
                                        uint64_t tag, refit_land_fault_t fault);

/* Between loader.c and loader_direct.c: save a store before its first write
 * of the refit (sync, restore: full), and count what descriptor k landed
 * (the staged path also lays out an assembling tensor it completes). */
refit_status_t refit_loader_touch(refit_loader_t *l, refit_store_t *s);
/* Descriptor k's chunk for a message: tensor, rows, cols and the pair. */
void refit_loader_chunk_str(const refit_loader_t *l, int64_t k, char *buf, size_t len);
/* The expert-layout shape of a MoE runtime tensor (w13 or w2). */
refit_kernels_moe_shape_t refit_loader_moe_shape(const refit_gen_tensor_t *g);
/* Where chunk ch of a block FP8 tensor the plan marks whole-block
 * (refit_plan_block_prequantized) lands: its E4M3 values in `weight` (row
 * pitch in bytes) and its block rows' FP32 scales in `weight_scale_inv`
 * (pitch between block rows in bytes), each fused piece with its own scale
 * rows. The staged BLOCK_SPLIT and zero copy's BLOCK_QUANTIZE both use it. */
void refit_loader_block_place(const refit_loader_t *l, const refit_chunk_t *ch, void **dst,
                              int64_t *dst_pitch, void **scale, int64_t *scale_pitch);
/* The layout fields of MXFP8 tensor g's QUANTIZE, SPLIT and PAD descriptors
 * (stores w, kernels/direct.h); returns whether the layout has padding bytes
 * no chunk writes. */
int refit_loader_direct_layout(const refit_loader_t *l, const refit_gen_tensor_t *g,
                               const refit_store_t *w, refit_direct_desc_t *d);
refit_status_t refit_loader_account(refit_loader_t *l, int64_t k);
/* Count descriptor k's elements only (no layout transform): a duplicate
 * chunk is REFIT_ERR_INTEGRITY. */
refit_status_t refit_loader_count(refit_loader_t *l, int64_t k);
/* Local tensor i, once every element counted: its layout transform or
 * quantization from the arena, or (block FP8 landed in place, by chunks or
 * deltas) MLA's dequantized copy; nothing before, or for other tensors. */
refit_status_t refit_loader_complete(refit_loader_t *l, int64_t i);

/* Between loader.c and loader_delta.c: once the land tables are built, the
 * in-place tables (in_place, place, chunk_desc, sum); after a full refit's
 * bucket b landed with every digest right, each chunk's candidate digest
 * (read back from its trailer: the sealed digest less the seal); at commit,
 * the candidate digests become the committed ones. */
refit_status_t refit_loader_delta_tables(refit_loader_t *l);
refit_status_t refit_loader_delta_note(refit_loader_t *l, int32_t b,
                                       const unsigned char *staging, uint64_t tag);
void refit_loader_delta_commit(refit_loader_t *l);

/* Give up the refit in progress. Returns 1 when runtime storage holds the
 * previous version (restored from saved copies, or never touched), 0 when it
 * may hold a mix (sync with restore: none after a write). */
int refit_loader_rollback(refit_loader_t *l);

/* Make the new version the runtime one: async copies each shadow into
 * runtime storage (same addresses); sync has nothing left to do. */
refit_status_t refit_loader_commit(refit_loader_t *l);

/* Every tensor complete? Names the first incomplete one. */
refit_status_t refit_loader_end(refit_loader_t *l);

/*
 * Compare runtime storage with what version `version` must produce, computed
 * from the source and the reference rules alone (BF16 element by element;
 * quantized tensors by quantizing and laying out the expected BF16 tensor
 * with the C reference). *mismatches counts differing elements or bytes; the
 * first is logged with store, rank, index, expected and actual.
 */
refit_status_t refit_loader_verify(refit_loader_t *l, refit_source_t *src,
                                   uint64_t version, int64_t *mismatches);

#endif /* REFIT_LOADER_H */
