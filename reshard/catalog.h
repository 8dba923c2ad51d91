/*
 * The model catalog: what each side holds.
 *
 * Trainer side: the Hugging Face named parameters with their global shapes and
 * the Megatron-Core sharding of each (which trainer ranks hold which rows or
 * columns, and which ranks are replicas of each other).
 *
 * Generator side: the vLLM runtime tensors of one tensor-parallel rank (all
 * engines hold the same set), each described as a list of rectangular
 * segments taken from trainer tensors. Fused tensors (qkv_proj, gate_up_proj,
 * w13) are several segments; a 3-D expert stack is a 2-D matrix of
 * experts * rows.
 *
 * Every tensor is viewed as a row-major 2-D matrix [rows, cols]; a 1-D tensor
 * [n] is [1, n]. Pure C: no MPI, no CUDA, no I/O.
 */
#ifndef REFIT_RESHARD_CATALOG_H
#define REFIT_RESHARD_CATALOG_H

#include "reshard/layout.h"

#include <stdint.h>

#define REFIT_NAME_MAX 96

typedef enum {
  REFIT_SPLIT_NONE = 0, /* every holder has the whole tensor */
  REFIT_SPLIT_ROWS = 1, /* dim 0 split into nparts equal shards */
  REFIT_SPLIT_COLS = 2  /* dim 1 split into nparts equal shards */
} refit_split_t;

/* What a tensor is, for value generation and for quantization eligibility. */
typedef enum {
  REFIT_ROLE_EMBED = 0,
  REFIT_ROLE_NORM,
  REFIT_ROLE_LINEAR, /* attention and dense MLP projections */
  REFIT_ROLE_ROUTER,
  REFIT_ROLE_EXPERT,
  REFIT_ROLE_LM_HEAD
} refit_role_t;

/*
 * A trainer parameter. Holder of part p, replica r is trainer rank
 *   stage * ranks_per_stage + base + p * part_stride + r * replica_stride.
 */
typedef struct {
  char name[REFIT_NAME_MAX];
  int64_t rows, cols; /* global shape */
  refit_role_t role;
  refit_split_t split;
  int32_t nparts, nreplicas;
  int32_t stage, base, part_stride, replica_stride;
  int32_t layer; /* -1 for non-layer tensors */
} refit_src_tensor_t;

/* A rectangle of a trainer tensor (global coordinates) placed into a runtime
 * tensor's matrix at (dst_row, dst_col). */
typedef struct {
  int32_t src;        /* index into catalog->src */
  int64_t src_row, src_col;
  int64_t rows, cols;
  int64_t dst_row, dst_col;
} refit_segment_t;

/* How a runtime tensor is laid out once transformed (used by precision
 * mxfp8; bf16 keeps every tensor linear). */
typedef enum {
  REFIT_GEN_PLAIN = 0,  /* stays BF16: embeddings, norms, lm_head */
  REFIT_GEN_LINEAR,     /* quantizable dense [N, K] */
  REFIT_GEN_MOE_W13,    /* [E, 2I, H] expert stack, [gate; up] per expert */
  REFIT_GEN_MOE_W2      /* [E, H, I] expert stack */
} refit_gen_kind_t;

typedef struct {
  char name[REFIT_NAME_MAX];
  int ndim;
  int64_t shape[3];   /* logical shape */
  int64_t rows, cols; /* 2-D matrix view: rows = product of all but last */
  refit_gen_kind_t kind;
  refit_role_t role;
  int32_t layer;
  int64_t seg_begin, seg_count; /* into catalog->segs, in dst row order */
  /* Quantized to MXFP8 on the generator. The catalog leaves it 0; the
   * runtime sets it from the precision and the ignore list before planning,
   * and the planner reads it to size rows on the wire. Only kinds other than
   * REFIT_GEN_PLAIN may be set. */
  int quantized;
} refit_gen_tensor_t;

typedef struct {
  refit_model_t model;
  refit_trainer_layout_t trainer;
  refit_generator_layout_t generator;
  int32_t ranks_per_stage;         /* trainer tp * dp */
  int64_t stage_first_layer[65];   /* pp + 1 entries */

  refit_src_tensor_t *src;
  int64_t nsrc;

  /* Runtime tensors of generator tp rank t: gen[gen_begin[t] ..
   * gen_begin[t+1]). Engines share these descriptions. */
  refit_gen_tensor_t *gen;
  int64_t *gen_begin; /* tp + 1 entries */
  refit_segment_t *segs;
  int64_t nsegs;

  /* Open-addressing index of src names: slots hold src index + 1, 0 = free. */
  int32_t *src_index;
  int64_t src_index_mask;
} refit_catalog_t;

/*
 * Build the catalog for a model and the two layouts. Checks the layout rules
 * again (config.c reports them to the user with line numbers; this guards
 * programmatic callers). On success *out is owned by the caller, released
 * with refit_catalog_destroy().
 */
refit_status_t refit_catalog_create(const refit_model_t *model,
                                    const refit_trainer_layout_t *trainer,
                                    const refit_generator_layout_t *generator,
                                    refit_catalog_t **out);
void refit_catalog_destroy(refit_catalog_t *cat);

/* Layer range of pipeline stage s: [first, last). */
refit_status_t refit_stage_layers(const refit_model_t *model,
                                  const refit_trainer_layout_t *trainer,
                                  int64_t *first_layer /* pp + 1 */);

/* Holder of part p, replica r of trainer tensor t. */
static inline int32_t refit_src_holder(const refit_catalog_t *cat,
                                       const refit_src_tensor_t *t, int32_t p,
                                       int32_t r) {
  return t->stage * cat->ranks_per_stage + t->base + p * t->part_stride +
         r * t->replica_stride;
}

/* Shard shape of a trainer tensor (every part has the same shape). */
static inline void refit_src_shard_shape(const refit_src_tensor_t *t,
                                         int64_t *rows, int64_t *cols) {
  *rows = t->split == REFIT_SPLIT_ROWS ? t->rows / t->nparts : t->rows;
  *cols = t->split == REFIT_SPLIT_COLS ? t->cols / t->nparts : t->cols;
}

/* Index of a trainer tensor by name, or -1. */
int64_t refit_catalog_find_src(const refit_catalog_t *cat, const char *name);

#endif /* REFIT_RESHARD_CATALOG_H */
