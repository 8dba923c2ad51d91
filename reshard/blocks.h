/*
 * Where the 128 x 128 blocks of block FP8 fall in a generator's runtime
 * tensors, and which shards vLLM accepts (docs/shared "model-families.md"
 * section 4).
 *
 * NeMo-RL quantizes every Hugging Face tensor whole (kernels/fp8_block.h:
 * blocks aligned to its first row and column, partial blocks padded with its
 * last element) and vLLM's loaders then shard the values and the scales: a
 * fused runtime tensor (qkv_proj, gate_up_proj, w13) keeps one run of scale
 * rows per piece, each piece being the rows of one Hugging Face tensor. A
 * runtime tensor of E stacked matrices (E experts; 1 for a 2-D weight) of
 * [n, K] each has the scale [E, ceil(n/128), ceil(K/128)], FP32.
 *
 * A generator can quantize each piece of its own shard and get NeMo-RL's
 * bytes when the piece's blocks are the Hugging Face tensor's blocks (it
 * starts on a block boundary of that tensor, rows and columns, and on a
 * block row of its matrix) and, when it has a partial block, it ends where
 * the Hugging Face tensor ends (so its last element is the padding value).
 * vLLM refuses the shards that break the first rule at model build
 * (validate_fp8_block_shape: a TP-split output or input partition, or a
 * merged piece other than the last, that is not a multiple of 128; FusedMoE:
 * an intermediate size per rank that is not); the second rule refuses a
 * row-parallel shard of a tensor whose rows end in a partial block, and a
 * column-parallel shard (not the last) of one whose columns do, which vLLM
 * would accept but NeMo-RL pads with an element that rank does not hold.
 *
 * Pure C: no MPI, no CUDA, no I/O.
 */
#ifndef REFIT_RESHARD_BLOCKS_H
#define REFIT_RESHARD_BLOCKS_H

#include "reshard/catalog.h"

#include <stdint.h>

#define REFIT_BLOCK_EDGE 128

/* One piece of a runtime tensor: the rows of one Hugging Face tensor. */
typedef struct {
  int32_t hf;             /* Hugging Face tensor (catalog->hf) */
  int64_t matrix;         /* which stacked matrix (expert), 0 for a 2-D tensor */
  int64_t row0, rows;     /* rows within that matrix */
  int64_t hf_row, hf_col; /* where they start in the Hugging Face tensor */
  int64_t cols;           /* every column of the runtime tensor */
  int64_t scale_row0;     /* its first row of the scale's [E * ceil(n/128),
                             ceil(K/128)] matrix view */
} refit_block_piece_t;

/* Stacked matrices of a runtime tensor (shape[0] of a 3-D one, else 1) and
 * the rows of each. */
int64_t refit_block_matrices(const refit_gen_tensor_t *g);

/* Rows and columns of the scale's matrix view: E * ceil(n/128) and
 * ceil(K/128). */
int64_t refit_block_scale_rows(const refit_gen_tensor_t *g);
int64_t refit_block_scale_cols(const refit_gen_tensor_t *g);

/* The pieces of catalog tensor `gen` in row order (malloc'd into *out, the
 * caller frees). Errors: no memory; a segment whose rows no run describes
 * (REFIT_ERR_INTERNAL). */
refit_status_t refit_block_pieces(const refit_catalog_t *cat, int64_t gen,
                                  refit_block_piece_t **out, int64_t *count);

/*
 * The rules above for piece p of tensor g, held by generator tp rank
 * `tp_rank`: REFIT_OK, or REFIT_ERR_CONFIG with a message naming the tensor,
 * the rank, the piece and the rule. *blame (may be NULL) gets the field a
 * person would change: REFIT_FIELD_GENERATOR_TP when the tensor is split over
 * the generator's ranks, else the model field of the dimension at fault
 * (REFIT_FIELD_NONE when there is none to name).
 */
refit_status_t refit_block_piece_check(const refit_catalog_t *cat,
                                       const refit_gen_tensor_t *g, int tp_rank,
                                       const refit_block_piece_t *p,
                                       refit_field_t *blame);

/*
 * Can a holder of rows x cols from (dst_row, dst_col) of runtime tensor
 * `g` (its pieces p[0 .. np)) quantize them itself and get NeMo-RL's bytes
 * (refit.prequantize)? True when the rectangle lies in one piece, starts on
 * a block row and a block column of that piece's Hugging Face tensor, ends
 * on one or at the tensor's last row / column, and, when it holds a partial
 * block, holds the tensor's last element (the padding value). Its blocks
 * are then the Hugging Face tensor's blocks, quantized alone.
 */
int refit_block_rect_whole(const refit_catalog_t *cat, const refit_gen_tensor_t *g,
                           const refit_block_piece_t *p, int64_t np, int64_t dst_row,
                           int64_t dst_col, int64_t rows, int64_t cols);

/* Does any piece's Hugging Face tensor end in a partial block column (K not a
 * multiple of 128, so every block row is padded with its last element)? */
int refit_block_partial_cols(const refit_catalog_t *cat, const refit_block_piece_t *p,
                             int64_t np);

#endif /* REFIT_RESHARD_BLOCKS_H */
