/*
 * Runtime layouts of MXFP8 weights for FlashInfer's kernels (C reference).
 *
 * Inputs are always canonical checkpoint tensors: E4M3 values [rows, K]
 * row-major and linear E8M0 scales [rows, K/32] row-major. Outputs are the
 * bytes the generator's kernels read, written into caller-owned storage whose
 * size the *_sizes functions give (the runtime allocates it once at start-up
 * and refits into the same pointers; see section 7 of the layout contract).
 *
 * Rules (docs: mxfp8-and-trtllm-layouts.md sections 3-6):
 *   swizzle 128x4   rows padded to 128, scale columns to Kp = round_up(K/32,4),
 *                   byte (r, c) at (r/128)*128*Kp + (c/4)*512 + (r%32)*16 +
 *                   ((r%128)/32)*4 + c%4; padding bytes are 0.
 *   src32(j)        32*(j/32) + 4*(j%8) + (j%32)/8 (epilogue-tile shuffle).
 *   dst32(r)        its inverse, 32*(r/32) + 8*(r%4) + (r%32)/4.
 *   src13(j)        r = src32(j); r even ? M/2 + r/2 : r/2, M = rows
 *                   (gate/up swap, then interleave, then shuffle).
 *
 * Errors are REFIT_ERR_INVALID_ARGUMENT with a message naming the tensor and
 * the rule that failed; nothing is written to the outputs then.
 */
#ifndef REFIT_KERNELS_LAYOUT_H
#define REFIT_KERNELS_LAYOUT_H

#include "refit/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Helpers below are shared with the CUDA twins, so they compile for both. */
#ifdef __CUDACC__
#define REFIT_HD __host__ __device__
#else
#define REFIT_HD
#endif

static inline REFIT_HD int64_t refit_round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

/* ---- 128x4 scale swizzle ------------------------------------------------ */

/* Byte offset of scale (row r, column c) in a swizzled matrix of Kp columns. */
static inline REFIT_HD int64_t refit_kernels_swizzle_offset(int64_t r, int64_t c,
                                                   int64_t kp) {
  return (r / 128) * 128 * kp + (c / 4) * 512 + (r % 32) * 16 +
         ((r % 128) / 32) * 4 + (c % 4);
}

/* Bytes of one swizzled matrix: round_up(rows, 128) * round_up(cols, 4). */
int64_t refit_kernels_swizzle_bytes(int64_t rows, int64_t cols);

/*
 * Swizzle a stack of E linear scale matrices [E, rows, cols] (contiguous) into
 * E swizzled matrices, matrix e at out + e * swizzle_bytes(rows, cols).
 * Every output byte is written (padding as 0). E >= 1, rows, cols >= 1.
 */
refit_status_t refit_kernels_scale_swizzle(const uint8_t *lin, int64_t num,
                                           int64_t rows, int64_t cols,
                                           uint8_t *out);

/* ---- Row permutations (value-independent, cached per shape) ------------ */

typedef enum {
  REFIT_KERNELS_PERM_SRC32 = 0, /* rows % 32 == 0 */
  REFIT_KERNELS_PERM_DST32 = 1, /* rows % 32 == 0; inverse of SRC32 */
  REFIT_KERNELS_PERM_SRC13 = 2, /* rows % 64 == 0 (two halves of 32k rows) */
  REFIT_KERNELS_PERM_SWAP13 = 3, /* rows % 2 == 0: [gate; up] -> [up; gate] */
} refit_kernels_perm_kind_t;

/* One entry of a permutation, computed from the formula (no cache). */
static inline REFIT_HD int64_t refit_kernels_perm_index(
    refit_kernels_perm_kind_t kind, int64_t rows, int64_t j) {
  int64_t r;
  switch (kind) {
  case REFIT_KERNELS_PERM_SRC32:
    return 32 * (j / 32) + 4 * (j % 8) + (j % 32) / 8;
  case REFIT_KERNELS_PERM_DST32:
    return 32 * (j / 32) + 8 * (j % 4) + (j % 32) / 4;
  case REFIT_KERNELS_PERM_SRC13:
    r = 32 * (j / 32) + 4 * (j % 8) + (j % 32) / 8;
    return (r % 2 == 0) ? rows / 2 + r / 2 : r / 2;
  case REFIT_KERNELS_PERM_SWAP13:
    return j < rows / 2 ? rows / 2 + j : j - rows / 2;
  }
  return -1;
}

/* The output row that input row i goes to: the inverse of
 * refit_kernels_perm_index (perm_index(kind, rows, inverse(kind, rows, i)) ==
 * i), for writers that place each input row at once (kernels/direct.h). */
static inline REFIT_HD int64_t refit_kernels_perm_inverse_index(
    refit_kernels_perm_kind_t kind, int64_t rows, int64_t i) {
  int64_t r;
  switch (kind) {
  case REFIT_KERNELS_PERM_SRC32:
    return refit_kernels_perm_index(REFIT_KERNELS_PERM_DST32, rows, i);
  case REFIT_KERNELS_PERM_DST32:
    return refit_kernels_perm_index(REFIT_KERNELS_PERM_SRC32, rows, i);
  case REFIT_KERNELS_PERM_SRC13:
    r = i >= rows / 2 ? 2 * (i - rows / 2) : 2 * i + 1;
    return refit_kernels_perm_index(REFIT_KERNELS_PERM_DST32, rows, r);
  case REFIT_KERNELS_PERM_SWAP13: /* its own inverse */
    return refit_kernels_perm_index(REFIT_KERNELS_PERM_SWAP13, rows, i);
  }
  return -1;
}

/*
 * The permutation of `kind` for `rows` rows, as an int32 array of length rows:
 * output row j takes input row perm[j]. The array lives in a process-wide
 * cache (thread-safe; computed on first use) and stays valid until
 * refit_kernels_perm_cache_clear(). *out is set only on success.
 * Errors: rows not a positive multiple of 32 (64 for SRC13, 2 for SWAP13),
 * rows > INT32_MAX,
 * out of memory.
 */
refit_status_t refit_kernels_perm_get(refit_kernels_perm_kind_t kind,
                                      int64_t rows, const int32_t **out);

/* The same permutation written into caller memory as int64 (torch indices). */
refit_status_t refit_kernels_perm_fill_i64(refit_kernels_perm_kind_t kind,
                                           int64_t rows, int64_t *out);

/* Free every cached permutation. Not safe while another thread uses one. */
void refit_kernels_perm_cache_clear(void);

/* ---- TRTLLM-gen MoE expert layout ------------------------------------- */

typedef struct {
  int64_t num_experts;  /* E: local experts of the layer */
  int64_t hidden;       /* H */
  int64_t intermediate; /* I: per TP rank */
  int gated;            /* 1: W13 is [gate; up] (act-and-mul), 2I rows;
                           0: W13 is one [I, H] matrix */
} refit_kernels_moe_shape_t;

typedef enum {
  REFIT_KERNELS_MOE_W13 = 0, /* [E, M13, H], M13 = gated ? 2I : I */
  REFIT_KERNELS_MOE_W2 = 1,  /* [E, H, I] */
} refit_kernels_moe_tensor_t;

/* Rows, K and row permutation of one tensor of a layer: W13 is [M13, H]
 * with M13 = gated ? 2I : I (src13 when gated, else src32), W2 is [H, I]
 * (src32). Returns 0 for an unknown tensor. Shared by the C and CUDA paths. */
static inline int refit_kernels_moe_tensor_dims(const refit_kernels_moe_shape_t *s,
                                                refit_kernels_moe_tensor_t which,
                                                int64_t *rows, int64_t *k,
                                                refit_kernels_perm_kind_t *kind) {
  if (which == REFIT_KERNELS_MOE_W13) {
    *rows = s->gated ? 2 * s->intermediate : s->intermediate;
    *k = s->hidden;
    *kind = s->gated ? REFIT_KERNELS_PERM_SRC13 : REFIT_KERNELS_PERM_SRC32;
    return 1;
  }
  if (which == REFIT_KERNELS_MOE_W2) {
    *rows = s->hidden;
    *k = s->intermediate;
    *kind = REFIT_KERNELS_PERM_SRC32;
    return 1;
  }
  return 0;
}

/* Byte sizes of the runtime tensors of one layer. */
typedef struct {
  int64_t w13_weight;       /* E * M13 * H */
  int64_t w13_weight_scale; /* E * round_up(M13,128) * round_up(H/32,4) */
  int64_t w2_weight;        /* E * H * I */
  int64_t w2_weight_scale;  /* E * round_up(H,128) * round_up(I/32,4) */
} refit_kernels_moe_sizes_t;

/*
 * Check the shape rules (H % 128, M13 % 128, H and I multiples of 32, E >= 1)
 * and, on success, give the runtime sizes. `name` (e.g. the layer's prefix)
 * appears in the error message; it may be NULL. sizes may be NULL.
 */
refit_status_t refit_kernels_moe_check_shape(const refit_kernels_moe_shape_t *s,
                                             const char *name,
                                             refit_kernels_moe_sizes_t *sizes);

/*
 * Transform one tensor of a layer, all experts at once: one gather of value
 * rows and one gather-pad-swizzle of scale rows, with the cached permutation
 * (src13 for gated W13, src32 otherwise).
 *   values  canonical [E, rows, K] E4M3;   scales [E, rows, K/32] linear.
 *   values_out [E, rows, K];  scales_out [E, round_up(rows,128)*Kp] swizzled.
 * Outputs must not overlap inputs.
 */
refit_status_t refit_kernels_moe_transform_tensor(
    const refit_kernels_moe_shape_t *s, refit_kernels_moe_tensor_t which,
    const uint8_t *values, const uint8_t *scales, uint8_t *values_out,
    uint8_t *scales_out);

/* Both tensors of a layer (four batched gathers). */
refit_status_t refit_kernels_moe_transform(const refit_kernels_moe_shape_t *s,
                                           const uint8_t *w13,
                                           const uint8_t *w13_scale,
                                           const uint8_t *w2,
                                           const uint8_t *w2_scale,
                                           uint8_t *w13_out,
                                           uint8_t *w13_scale_out,
                                           uint8_t *w2_out,
                                           uint8_t *w2_scale_out);

/*
 * The same result computed expert by expert, step by step as the layout
 * contract describes it (swap gate/up, interleave, shuffle values, shuffle
 * scales, pad, swizzle by the offset formula). Deliberately independent of
 * the batched path: it is the test oracle and the benchmark baseline, not a
 * production path. Allocates scratch (REFIT_ERR_NO_MEMORY possible).
 */
refit_status_t refit_kernels_moe_transform_oracle(
    const refit_kernels_moe_shape_t *s, const uint8_t *w13,
    const uint8_t *w13_scale, const uint8_t *w2, const uint8_t *w2_scale,
    uint8_t *w13_out, uint8_t *w13_scale_out, uint8_t *w2_out,
    uint8_t *w2_scale_out);

/* ---- NVFP4 MoE expert layouts (docs/nvfp4.md, "MoE") ------------------ */

/* The FlashInfer NVFP4 MoE backend a generator's experts are laid out for
 * (refit.moe_backend; the config's order). */
typedef enum {
  REFIT_KERNELS_MOE_FLASHINFER_TRTLLM = 0,
  REFIT_KERNELS_MOE_FLASHINFER_CUTLASS = 1,
} refit_kernels_moe_backend_t;

/* The row permutation of an NVFP4 expert tensor's weight rows and scale
 * rows under `backend` (*kind = -1: none). vLLM's
 * prepare_nvfp4_moe_layer_for_fi_or_cutlass first swaps [gate; up] to
 * [up; gate] for both backends; flashinfer_trtllm then applies the
 * gated-activation interleave and the epilogue-tile shuffle (the swap, the
 * interleave and the shuffle together are SRC13, as for MXFP8) to w13 and
 * the shuffle (SRC32) to w2; flashinfer_cutlass keeps the swapped rows
 * (SWAP13) and w2 as it is. */
static inline REFIT_HD void refit_kernels_nvfp4_moe_perm(refit_kernels_moe_backend_t backend,
                                                         refit_kernels_moe_tensor_t which,
                                                         int *kind) {
  const int trtllm = backend == REFIT_KERNELS_MOE_FLASHINFER_TRTLLM;
  if (which == REFIT_KERNELS_MOE_W13)
    *kind = trtllm ? (int)REFIT_KERNELS_PERM_SRC13 : (int)REFIT_KERNELS_PERM_SWAP13;
  else
    *kind = trtllm ? (int)REFIT_KERNELS_PERM_SRC32 : -1;
}

/*
 * Can the experts of `s` (gated, I per rank) take `backend` under NVFP4?
 * Rules (each vLLM's or FlashInfer's, docs/nvfp4.md): H % 16 and I % 16
 * (one scale per 16 along K); 2I % 128 (flashinfer_cutlass: vLLM does not
 * pad a gated w13 and raises; flashinfer_trtllm: shuffle_matrix_sf_a
 * asserts 128-row scale tiles, and vLLM pads I to 64 otherwise, which refit
 * does not); flashinfer_trtllm also H % 256 (vLLM pads the hidden size of
 * the experts otherwise). The message names `name`, the backend and the
 * rule. name may be NULL.
 */
refit_status_t refit_kernels_nvfp4_moe_check_shape(refit_kernels_moe_backend_t backend,
                                                   const refit_kernels_moe_shape_t *s,
                                                   const char *name);

/*
 * One NVFP4 expert tensor of a layer, all experts at once, into `backend`'s
 * layout: packed E2M1 rows of ceil(K/2) bytes gathered by the backend's
 * permutation, and the linear E4M3 scales [E, rows, ceil(K/16)] gathered by
 * the same permutation and written 128x4-swizzled per expert
 * ([E, round_up(rows, 128) * round_up(ceil(K/16), 4)] bytes).
 *   packed [E, rows, ceil(K/2)];  lin [E, rows, ceil(K/16)]
 * Rows and K are refit_kernels_moe_tensor_dims'. Outputs must not overlap
 * inputs. Errors: the shape rules above, a NULL buffer.
 */
refit_status_t refit_kernels_nvfp4_moe_transform(refit_kernels_moe_backend_t backend,
                                                 const refit_kernels_moe_shape_t *s,
                                                 refit_kernels_moe_tensor_t which,
                                                 const uint8_t *packed, const uint8_t *lin,
                                                 uint8_t *w_out, uint8_t *s_out);

/* ---- Dense MXFP8 linear backends -------------------------------------- */

#define REFIT_KERNELS_DENSE_BACKEND_MAP(X)                                     \
  X(FLASHINFER_CUTLASS, "flashinfer_cutlass")                                  \
  X(FLASHINFER_CUTEDSL, "flashinfer_cutedsl")                                  \
  X(FLASHINFER_TRTLLM, "flashinfer_trtllm")

typedef enum {
#define REFIT_KERNELS_DENSE_ENUM_(name, text) REFIT_KERNELS_DENSE_##name,
  REFIT_KERNELS_DENSE_BACKEND_MAP(REFIT_KERNELS_DENSE_ENUM_)
#undef REFIT_KERNELS_DENSE_ENUM_
      REFIT_KERNELS_DENSE_COUNT
} refit_kernels_dense_backend_t;

#define REFIT_KERNELS_DENSE_DEFAULT REFIT_KERNELS_DENSE_FLASHINFER_CUTLASS

/* The rows of a dense backend's runtime weight for [n, k] and the row
 * permutation over them (*perm = -1: none): flashinfer_trtllm pads the rows
 * to 128 and shuffles them with src32, the others keep them. The one
 * statement of that rule for sizes, transforms and the zero-copy path. */
static inline REFIT_HD int64_t refit_kernels_dense_rows(refit_kernels_dense_backend_t backend,
                                                        int64_t n, int *perm) {
  const int trtllm = backend == REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM;
  *perm = trtllm ? (int)REFIT_KERNELS_PERM_SRC32 : -1;
  return trtllm ? refit_round_up(n, 128) : n;
}

/* Config spelling of a backend ("flashinfer_cutlass"); "?" if out of range. */
const char *refit_kernels_dense_backend_name(refit_kernels_dense_backend_t b);

/* Parse a config spelling; REFIT_ERR_INVALID_ARGUMENT lists the valid ones. */
refit_status_t refit_kernels_dense_backend_parse(
    const char *text, refit_kernels_dense_backend_t *out);

/*
 * Can `backend` take the weight `name` of shape [n, k]? Rules: n >= 1,
 * k % 32 == 0 (all), k % 256 == 0 (flashinfer_trtllm). The error message names
 * the tensor, the backend, the shape and the rule. name may be NULL.
 */
refit_status_t refit_kernels_check_shape(refit_kernels_dense_backend_t backend,
                                         const char *name, int64_t n,
                                         int64_t k);

/*
 * Runtime byte sizes of weight and scale for [n, k] (after check_shape):
 *   cutlass / cutedsl  weight n*k,                 scale swizzle_bytes(n, k/32)
 *   trtllm             weight round_up(n,128)*k,   scale swizzle_bytes(n, k/32)
 */
refit_status_t refit_kernels_dense_sizes(refit_kernels_dense_backend_t backend,
                                         int64_t n, int64_t k,
                                         int64_t *weight_bytes,
                                         int64_t *scale_bytes);

/*
 * Canonical q [n, k] + linear scale [n, k/32] -> runtime weight and scale of
 * dense_sizes() bytes. A fused tensor (qkv, gate_up) must be passed whole:
 * the padding and the row shuffle act on the fused matrix. Outputs must not
 * overlap inputs.
 */
refit_status_t refit_kernels_dense_transform(
    refit_kernels_dense_backend_t backend, int64_t n, int64_t k,
    const uint8_t *q, const uint8_t *scale, uint8_t *weight_out,
    uint8_t *scale_out);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_LAYOUT_H */
