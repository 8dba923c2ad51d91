/*
 * Block-scaled FP8: BF16 -> E4M3 elements + one FP32 inverse scale per
 * 128 x 128 block (C reference). The format vLLM serves DeepSeek-V3-style
 * checkpoints in (`quant_method: fp8`, `weight_block_size: [128, 128]`):
 * `weight` float8_e4m3fn [N, K] and `weight_scale_inv` float32
 * [ceil(N/128), ceil(K/128)], value = e4m3(q) * scale_inv.
 *
 * The rules are NeMo-RL's refit quantizer (cast_tensor_to_fp8_blockwise) as
 * docs/shared "model-families.md" section 4.2 states them, for one matrix:
 *
 *   - Blocks are 128 x 128, aligned to the matrix's first row and column.
 *     A partial block (the last block row when rows % 128 != 0, the last
 *     block column when k % 128 != 0) is padded with the matrix's last
 *     element x[rows-1, k-1], which takes part in its amax; the padding is
 *     not written.
 *   - amax = max |x| over the block, exact.
 *   - REFIT_FP8_SCALE_FP32: scale = fl(fl(1 / amax) * 448) (torch's
 *     `448 / t` is a reciprocal and a multiply, one rounding more than a
 *     division); scale = 1 where amax is 0 or +Inf; scale_inv = fl(1 /
 *     scale). A block whose amax is so small that 1/amax or the product
 *     overflows gets scale = +Inf: its non-zero elements encode as +-448,
 *     its zeros as NaN (0 * Inf), and scale_inv is 0, as torch computes it.
 *   - REFIT_FP8_SCALE_POW2: E = clamp(ceil(log2(fl(amax * fl(1/448)))),
 *     -127, 127) + 127; scale = 2^(127 - E) and scale_inv = 2^(E - 127),
 *     both 1.0 when E == 0 (amax == 0 included). E is the MXFP8 scale
 *     exponent of the same amax (kernels/mxfp8_rules.h).
 *   - Element q = e4m3fn_rne(clamp(fl(x * scale), -448, 448)).
 *
 * Non-finite inputs (outside the upstream contract; our rule, which the CUDA
 * twin follows):
 *   - A block with a NaN (a padded one whose pad is NaN included) has every
 *     byte 0x7F and scale_inv NaN (0x7FC00000), in both scale modes.
 *   - NaN elements produced by the rule (0 * Inf above) encode as 0x7F, the
 *     sign dropped, as the GPU's canonical NaN does.
 *
 * Every function is thread-safe; large inputs are split over worker threads
 * (kernels/parallel.h) with the same bytes for any number of them.
 */
#ifndef REFIT_KERNELS_FP8_BLOCK_H
#define REFIT_KERNELS_FP8_BLOCK_H

#include "refit/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Rows and columns of a scale block. */
#define REFIT_FP8_BLOCK 128

/* How a block's scale is chosen (refit.fp8_scale). */
typedef enum {
  REFIT_FP8_SCALE_FP32 = 0, /* 448 / amax, any FP32 value */
  REFIT_FP8_SCALE_POW2 = 1  /* a power of two, rounded up (UE8M0 values) */
} refit_fp8_scale_t;

/* Scale rows or columns of a dimension of n elements: ceil(n / 128). */
static inline int64_t refit_fp8_block_count(int64_t n) {
  return (n + REFIT_FP8_BLOCK - 1) / REFIT_FP8_BLOCK;
}

/*
 * The scale of a block whose amax key is `amax_bits` (the BF16 bit pattern
 * of the largest |x|, sign cleared; a NaN pattern for a block with a NaN):
 * *scale multiplies the elements, *scale_inv is stored. Exposed so that tests
 * can check the rule on every BF16 amax.
 */
void refit_fp8_block_scale(uint16_t amax_bits, refit_fp8_scale_t mode, float *scale,
                           float *scale_inv);

/*
 * Quantize a row-major BF16 matrix [rows, k] to block FP8.
 *
 *   src              BF16 bits; row r at src + r * src_stride_elems.
 *   rows, k          shape, any (partial blocks are padded as above).
 *   mode             REFIT_FP8_SCALE_FP32 or REFIT_FP8_SCALE_POW2.
 *   q                E4M3 [rows, k]; row r at q + r * q_stride (bytes >= k).
 *   scale_inv        FP32 [ceil(rows/128), ceil(k/128)]; block row b at
 *                    scale_inv + b * scale_stride (elements >= ceil(k/128)).
 *
 * Errors: REFIT_ERR_INVALID_ARGUMENT (negative shape, NULL buffer with a
 * non-empty shape, a stride smaller than a row, an unknown mode); nothing is
 * written then.
 */
refit_status_t refit_fp8_block_quantize(const uint16_t *src, int64_t rows, int64_t k,
                                        int64_t src_stride_elems, refit_fp8_scale_t mode,
                                        uint8_t *q, int64_t q_stride, float *scale_inv,
                                        int64_t scale_stride);

/*
 * Dequantize block FP8 back to BF16 as vLLM's scaled_dequantize does for
 * MLA's W_UK_T / W_UV (model-families.md 3.4): out[r, c] = bf16_rne(float(
 * q[r, c]) * scale_inv[r / 128, c / 128]) (kernels/fp8_block_rules.h).
 *
 *   q, q_stride      E4M3 [rows, k]; row r at q + r * q_stride bytes.
 *   scale_inv        FP32 [ceil(rows/128), ceil(k/128)], block row b at
 *                    scale_inv + b * scale_stride elements.
 *   out              BF16 bits [rows, k]; row r at out + r * out_stride
 *                    elements.
 *
 * Errors: REFIT_ERR_INVALID_ARGUMENT as refit_fp8_block_quantize's.
 */
refit_status_t refit_fp8_block_dequantize(const uint8_t *q, int64_t rows, int64_t k,
                                          int64_t q_stride, const float *scale_inv,
                                          int64_t scale_stride, uint16_t *out,
                                          int64_t out_stride_elems);

/* The argument rule of refit_fp8_block_quantize and its CUDA twin; `who`
 * names the caller in the message. */
refit_status_t refit_fp8_block_check(const char *who, const void *src, int64_t rows,
                                     int64_t k, int64_t src_stride_elems,
                                     refit_fp8_scale_t mode, const void *q,
                                     int64_t q_stride, const void *scale_inv,
                                     int64_t scale_stride);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_FP8_BLOCK_H */
