/*
 * MXFP8 quantization: BF16 -> E4M3 elements + E8M0 block scales (C reference).
 *
 * The rules are those of docs/shared "mxfp8-and-trtllm-layouts.md" section 1:
 *
 *   - A block is 32 consecutive elements of one row along K. Blocks never span
 *     rows, so quantizing a row slice gives the same bytes as quantizing the
 *     whole tensor.
 *   - Scale byte E (E8M0, bias 127) of a block with amax = max |x_i|:
 *     E = 0 if amax == 0, else clamp(ceil(log2(amax / 448)) + 127, 0, 254).
 *     The scale rounds UP so finite inputs never saturate.
 *   - Element q = e4m3fn_rne_satfinite(x * 2^(127 - E)); when E == 0 the
 *     inverse scale is 0 and every element is (signed) zero.
 *   - Scale bytes equal to 0 are stored as 1 (the TRTLLM kernels reject 0).
 *
 * BF16 values travel as uint16_t bit patterns so that no header here needs a
 * compiler's bfloat16 type.
 *
 * Non-finite inputs (outside the upstream bit-exact contract; our rule, chosen
 * to equal what the CUDA twins do with fmaxf and cvt.rn.satfinite):
 *   - NaN elements do not take part in amax; each NaN encodes as 0x7F (the
 *     E4M3 NaN, sign dropped). A block of only NaN (and zeros) has E = 0,
 *     stored as 1.
 *   - +-Inf makes amax infinite, so E = 254; the Inf elements encode as +-448
 *     (0x7E / 0xFE) and the finite elements of that block are scaled by
 *     2^-127, which flushes all but the largest to zero.
 *   - Negative values that round to zero keep their sign (0x80), as the
 *     hardware conversion does; -0.0 in gives 0x80 out.
 *
 * All functions are thread-safe and reentrant. Large inputs are split over a
 * few worker threads (see refit_kernels_threads_set); the bytes produced do not
 * depend on the number of threads.
 */
#ifndef REFIT_KERNELS_MXFP8_H
#define REFIT_KERNELS_MXFP8_H

#include "refit/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Elements per scale block. */
#define REFIT_MXFP8_BLOCK 32
/* Largest finite E4M3 magnitude and its encoding. */
#define REFIT_MXFP8_E4M3_MAX 448.0f
#define REFIT_MXFP8_E4M3_MAX_BITS 0x7E
#define REFIT_MXFP8_E4M3_NAN_BITS 0x7F
/* fp32 nearest to 1/448; the GPU kernels multiply by it to derive the scale. */
#define REFIT_MXFP8_INV_448_BITS 0x3b124925u

/*
 * Scale exponent E (0..254, bias 127) for a block whose largest magnitude is
 * amax (amax >= 0, may be +Inf; NaN is treated as 0). Uses the bit recipe of
 * the GPU kernels: t = fp32(amax * 1/448), E = exp(t) + (t not a power of two
 * and not below 2^-127), capped at 254. Returns the raw E: 0 is possible here;
 * refit_mxfp8_quantize_rows stores 0 as 1.
 */
uint8_t refit_mxfp8_scale_exponent(float amax);

/*
 * E4M3 "fn" encoding of v, round to nearest even, saturating to +-448.
 * NaN -> 0x7F; +-Inf -> 0x7E / 0xFE; the sign of zero is kept.
 */
uint8_t refit_mxfp8_e4m3_encode(float v);

/* Exact value of an E4M3 "fn" byte (0x7F / 0xFF give NaN). */
float refit_mxfp8_e4m3_decode(uint8_t q);

/* BF16 bit pattern -> float (exact). */
static inline float refit_bf16_to_float(uint16_t b) {
  union {
    uint32_t u;
    float f;
  } v;
  v.u = (uint32_t)b << 16;
  return v.f;
}

/*
 * Quantize one block of 32 BF16 values: writes 32 E4M3 bytes to q and returns
 * the stored scale byte (never 0). The building block of quantize_rows,
 * exposed so tests can feed adversarial blocks.
 */
uint8_t refit_mxfp8_quantize_block(const uint16_t *src, uint8_t *q);

/*
 * Quantize a row-major BF16 matrix [rows, k] to MXFP8.
 *
 *   src              BF16 bits; row r starts at src + r * src_stride_elems.
 *   rows, k          shape; k % 32 == 0. rows == 0 is a no-op.
 *   src_stride_elems >= k.
 *   q                E4M3 output; row r at q + r * q_stride (bytes, >= k).
 *   scale            linear E8M0 scales [rows, k/32]; row r at
 *                    scale + r * scale_stride (bytes, >= k/32). No byte is 0.
 *
 * Errors: REFIT_ERR_INVALID_ARGUMENT (NULL pointer with rows > 0, negative
 * sizes, k % 32 != 0, strides too small); nothing is written then.
 */
refit_status_t refit_mxfp8_quantize_rows(const uint16_t *src, int64_t rows,
                                         int64_t k, int64_t src_stride_elems,
                                         uint8_t *q, int64_t q_stride,
                                         uint8_t *scale, int64_t scale_stride);

/*
 * The code refit_mxfp8_quantize_rows runs: the portable C (vectorized by the
 * compiler, AVX2 where the CPU has it) or, on x86-64 CPUs with AVX-512 F, BW
 * and VL, the same steps written 16 lanes wide with intrinsics, which is
 * about 2x faster on one core (docs/benchmarks.md). Both write the same
 * bytes (the tests hold them equal on every BF16 value at every scale). The
 * best one the CPU runs is
 * chosen at the first call; refit_mxfp8_quantize_use selects one for the
 * whole process (tests and benchmarks): REFIT_MXFP8_CODE_BEST restores the
 * choice, and a code this CPU cannot run is refused with
 * REFIT_ERR_NOT_AVAILABLE. Not to be called while a quantize runs.
 */
typedef enum {
  REFIT_MXFP8_CODE_BEST = 0,
  REFIT_MXFP8_CODE_PORTABLE = 1,
  REFIT_MXFP8_CODE_AVX512 = 2,
} refit_mxfp8_code_t;

refit_mxfp8_code_t refit_mxfp8_quantize_code(void);
refit_status_t refit_mxfp8_quantize_use(refit_mxfp8_code_t code);
const char *refit_mxfp8_code_name(refit_mxfp8_code_t code);

/*
 * Worker threads used by the C reference for large inputs (quantize, layout
 * gathers). n <= 0 restores the default: the number of online CPUs, at most
 * 16, or REFIT_KERNELS_THREADS from the environment. Inputs below about 1 MiB
 * always run on the calling thread.
 */
void refit_kernels_threads_set(int n);
int refit_kernels_threads_get(void);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_MXFP8_H */
