/*
 * The model catalog: what each side holds.
 *
 * The model itself is its Hugging Face tensors (`hf`): one per projection,
 * norm and expert, under their checkpoint names and full shapes. Sources
 * (synthetic values, checkpoints) and the reference rules speak of these.
 *
 * Trainer side (`src`): the tensors the trainer holds, with their global
 * shapes and the Megatron-Core sharding of each (which trainer ranks hold
 * which rows or columns, and which ranks are replicas of each other). With
 * trainer.names hf they are the Hugging Face tensors themselves; with
 * megatron they are Megatron-Core's fused tensors under the names
 * named_parameters() gives on their holders (linear_qkv, linear_fc1, experts
 * numbered per ep rank, layers numbered per pipeline stage). Each trainer
 * tensor's rows are runs of Hugging Face rows (`runs`); columns are the same.
 *
 * Generator side: the vLLM runtime tensors of one tensor-parallel rank (all
 * engines hold the same set), each described as a list of rectangular
 * segments taken from trainer tensors. Fused tensors (qkv_proj, gate_up_proj,
 * w13) are several segments; a 3-D expert stack is a 2-D matrix of
 * experts * rows.
 *
 * Every tensor is viewed as a row-major 2-D matrix [rows, cols]; a 1-D tensor
 * [n] is [1, n], but a bias, which frameworks split and fuse by rows exactly
 * as its weight (Megatron's linear_qkv.bias, vLLM's qkv_proj.bias), is the
 * column [n, 1] (refit_src_is_1d). Pure C: no MPI, no CUDA, no I/O.
 */
#ifndef REFIT_RESHARD_CATALOG_H
#define REFIT_RESHARD_CATALOG_H

#include "reshard/layout.h"
#include "reshard/rules.h" /* refit_stage_layers */

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
  REFIT_ROLE_LM_HEAD,
  REFIT_ROLE_BIAS, /* a 1-D bias [n], the column [n, 1]; never quantized */
  /* A 1-D FP32 vector [n] (DeepSeek's e_score_correction_bias), described
   * in refit's 2-byte units as the row [1, 2n]: element k is units 2k (low
   * half) and 2k + 1 (high half), little-endian. Moved bytewise, replicated,
   * never quantized. */
  REFIT_ROLE_F32
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
  /* Rows of this tensor that are rows of Hugging Face tensors:
   * catalog->runs[run_begin .. run_begin + run_count). Rows in no run are
   * padding (Megatron's vocabulary padding): never sent. */
  int64_t run_begin, run_count;
} refit_src_tensor_t;

/* Rows [src_row, src_row + rows) of a trainer tensor (global coordinates)
 * are rows [hf_row, hf_row + rows) of Hugging Face tensor `hf`. */
typedef struct {
  int32_t src, hf;
  int64_t src_row, hf_row, rows;
} refit_row_run_t;

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

/* The quantized formats of a runtime tensor (refit_gen_tensor_t.quantized). */
typedef enum {
  REFIT_QUANT_NONE = 0,
  REFIT_QUANT_MXFP8 = 1,    /* E4M3 + E8M0 per 32 along K, laid out for FlashInfer */
  REFIT_QUANT_FP8_BLOCK = 2, /* E4M3 + FP32 per 128 x 128 block (reshard/blocks.h) */
  REFIT_QUANT_NVFP4 = 3      /* E2M1 + E4M3 per 16 along K + FP32 per tensor
                                (kernels/nvfp4.h) */
} refit_quant_t;

typedef struct {
  char name[REFIT_NAME_MAX];
  int ndim;
  int64_t shape[3];   /* logical shape (elements; of FP32 for REFIT_ROLE_F32) */
  int64_t rows, cols; /* 2-D matrix view: rows = product of all but last */
  refit_gen_kind_t kind;
  refit_role_t role;
  int32_t layer;
  /* The model field K (cols, or the last dimension) is made of, for
   * messages about quantizable kinds: hidden_size, head_dim (K = heads *
   * head_dim), intermediate_size or moe_intermediate_size. */
  refit_field_t k_field;
  int64_t seg_begin, seg_count; /* into catalog->segs, in dst row order */
  /* Elements the segments fill: rows * cols, less vLLM's vocabulary
   * padding (rows that hold zeros and are never sent). */
  int64_t elements;
  /* How the generator quantizes it (refit_quant_t; 0: it stays BF16). The
   * catalog leaves it 0; the runtime sets it from the precision and the
   * ignore list before planning, and the planner reads it to size rows on
   * the wire and the assembly arena. Only kinds other than REFIT_GEN_PLAIN
   * may be set. */
  int quantized;
  /* vLLM derives tensors from this one after loading (MLA's kv_b_proj:
   * W_UK_T and W_UV, model-families.md 3.4): views of its storage while it
   * stays BF16, a separate dequantized copy once it is quantized. */
  int mla_derived;
} refit_gen_tensor_t;

typedef struct {
  refit_model_t model;
  refit_trainer_layout_t trainer;
  refit_generator_layout_t generator;
  int32_t ranks_per_stage;         /* trainer tp * dp */
  int64_t stage_first_layer[65];   /* pp + 1 entries */

  /* The trainer's tensors (see above) and the model's Hugging Face
   * tensors; with trainer.names hf, hf == src. Only src carry sharding. */
  refit_src_tensor_t *src;
  int64_t nsrc;
  refit_src_tensor_t *hf;
  int64_t nhf;
  refit_row_run_t *runs; /* by trainer tensor, then src_row */
  int64_t nruns;
  /* Runs of Hugging Face tensor h, by hf_row:
   * runs[hf_runs[hf_run_begin[h] .. hf_run_begin[h + 1])]. */
  int64_t *hf_runs;
  int64_t *hf_run_begin;

  /* Runtime tensors of generator tp rank t: gen[gen_begin[t] ..
   * gen_begin[t+1]). Engines share these descriptions. */
  refit_gen_tensor_t *gen;
  int64_t *gen_begin; /* tp + 1 entries */
  refit_segment_t *segs;
  int64_t nsegs;

  /* Open-addressing indexes of src and hf names: slots hold index + 1,
   * 0 = free. Megatron names repeat across ranks (weight0 of every ep
   * rank), so a src name may fill several slots. */
  int32_t *src_index, *hf_index;
  int64_t src_index_mask, hf_index_mask;
} refit_catalog_t;

/*
 * Build the catalog for a model and the two layouts. Refuses a layout that
 * breaks a layout rule (reshard/rules.h; config_rules.c reports the same rules to
 * the user with line numbers) or has more than 64 pipeline stages. On success *out is
 * owned by the caller, released with refit_catalog_destroy().
 */
refit_status_t refit_catalog_create(const refit_model_t *model,
                                    const refit_trainer_layout_t *trainer,
                                    const refit_generator_layout_t *generator,
                                    refit_catalog_t **out);
void refit_catalog_destroy(refit_catalog_t *cat);

/* Is trainer (or Hugging Face) tensor t 1-D in its framework: a norm
 * weight [1, n] or a bias [n, 1]? Its length is then rows * cols. */
static inline int refit_src_is_1d(const refit_src_tensor_t *t) {
  return t->rows == 1 || t->role == REFIT_ROLE_BIAS;
}

/* Is trainer (or Hugging Face) tensor t an FP32 vector (REFIT_ROLE_F32)?
 * Its framework shape is then [cols / 2] in float32. */
static inline int refit_src_is_f32(const refit_src_tensor_t *t) {
  return t->role == REFIT_ROLE_F32;
}

/* Elements of tensor t in its framework: float32 ones for an FP32 vector,
 * else rows * cols. */
static inline int64_t refit_src_elements(const refit_src_tensor_t *t) {
  return refit_src_is_f32(t) ? t->cols / 2 : t->rows * t->cols;
}

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

/* The trainer tensor named `name` that trainer rank `rank` holds (any
 * holder when rank < 0), or -1. */
int64_t refit_catalog_find_src(const refit_catalog_t *cat, const char *name,
                               int32_t rank);

/* Rows of model.embed_tokens / lm_head on one generator tp rank: vLLM pads
 * the vocabulary to a multiple of 64 and splits the padded rows. */
int64_t refit_catalog_vocab_rows(const refit_model_t *m, int gen_tp);

/* Rows of the trainer's embedding and output layer: V, or with Megatron
 * names V padded to a multiple of vocab_divisible_by * tp. */
int64_t refit_catalog_trainer_vocab(const refit_model_t *m,
                                    const refit_trainer_layout_t *t);

/* Index of a Hugging Face tensor by name, or -1. */
int64_t refit_catalog_find_hf(const refit_catalog_t *cat, const char *name);

/* Part index of trainer tensor t that trainer rank `rank` holds, or -1. */
int32_t refit_src_part_of(const refit_catalog_t *cat, const refit_src_tensor_t *t,
                          int32_t rank);

#endif /* REFIT_RESHARD_CATALOG_H */
