/*
 * MXFP8 quantization, C reference. See kernels/mxfp8.h for the rules.
 *
 * Speed: every step is integer or fp32 arithmetic without branches on the
 * data, over fixed 32-element blocks, so the compiler turns the element loops
 * into SIMD code (this file is built with -O3). The block amax is an integer
 * max over |bf16| bit patterns, which orders like the values for non-NaN
 * inputs.
 */
#include "kernels/mxfp8.h"
#include "kernels/mxfp8_rules.h"
#include "kernels/parallel.h"

#include "core/error.h"

#include <string.h>

uint8_t refit_mxfp8_scale_exponent(float amax) {
  return (uint8_t)refit_mxfp8_scale_rule(amax);
}

/*
 * E4M3 "fn" byte of v: round to nearest even, saturate to +-448, NaN -> 0x7F.
 * Two candidate encodings are computed without branches and one is selected:
 *   normal (|v| >= 2^-6): round the fp32 mantissa to 3 bits (RNE by adding
 *     0x7FFFF plus the lowest kept bit), then rebias the exponent 127 -> 7;
 *   subnormal (|v| < 2^-6): |v| + 2^14 in fp32 has an ulp of exactly 2^-9, the
 *     E4M3 subnormal step, so the FPU's own RNE yields the 0..8 code.
 */
static inline uint32_t refit_select(uint32_t cond, uint32_t a, uint32_t b) {
  /* cond ? a : b without a branch, so the element loop vectorizes. */
  return b ^ ((a ^ b) & (0u - cond));
}

static inline uint8_t refit_e4m3_encode_inline(float v) {
  uint32_t u = refit_f32_bits(v);
  uint32_t sign = (u >> 24) & 0x80;
  uint32_t a = u & 0x7fffffffu;
  uint32_t normal = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
  uint32_t sub = refit_f32_bits(refit_f32_from_bits(a) + 16384.0f) - 0x46800000u;
  uint32_t q = refit_select(a < 0x3c800000u, sub, normal); /* 2^-6 */
  q = refit_select(a >= 0x43e00000u, REFIT_MXFP8_E4M3_MAX_BITS, q); /* >=448 */
  q |= sign;
  q = refit_select(a > 0x7f800000u, REFIT_MXFP8_E4M3_NAN_BITS, q);
  return (uint8_t)q;
}

uint8_t refit_mxfp8_e4m3_encode(float v) { return refit_e4m3_encode_inline(v); }

float refit_mxfp8_e4m3_decode(uint8_t q) {
  uint32_t e = (q >> 3) & 0xf, m = q & 7;
  float mag;
  if ((q & 0x7f) == 0x7f)
    return refit_f32_from_bits(0x7fc00000u);
  if (e == 0)
    mag = (float)m * (1.0f / 512.0f);
  else
    mag = refit_f32_from_bits(((e + 120u) << 23) | (m << 20));
  return (q & 0x80) ? -mag : mag;
}

/* One block; inlined into each clone of the row loop below, so the AVX2
 * clone runs it 8 lanes wide. */
static inline __attribute__((always_inline)) uint8_t
refit_mxfp8_quantize_block_inline(const uint16_t *restrict src, uint8_t *restrict q) {
  int32_t amax = 0;
  for (int i = 0; i < REFIT_MXFP8_BLOCK; i++) {
    int32_t a = refit_mxfp8_amax_key(src[i]);
    amax = a > amax ? a : amax;
  }
  uint32_t E = refit_mxfp8_scale_rule(refit_bf16_to_float((uint16_t)amax));
  float inv = refit_mxfp8_inv_scale(E);
  for (int i = 0; i < REFIT_MXFP8_BLOCK; i++)
    q[i] = refit_e4m3_encode_inline(
        refit_f32_from_bits((uint32_t)src[i] << 16) * inv);
  return (uint8_t)(E == 0 ? 1 : E);
}

uint8_t refit_mxfp8_quantize_block(const uint16_t *src, uint8_t *q) {
  return refit_mxfp8_quantize_block_inline(src, q);
}

typedef struct {
  const uint16_t *src;
  int64_t k, src_stride;
  uint8_t *q;
  int64_t q_stride;
  uint8_t *scale;
  int64_t scale_stride;
} refit_mxfp8_quantize_job_t;

/* Built twice, for AVX2 and for the baseline x86-64 ISA; the loader picks
 * the one the CPU runs (the element loops are 8 lanes wide with AVX2). */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx2", "default")))
#endif
static void refit_mxfp8_quantize_range(void *ctx, int64_t begin, int64_t end) {
  const refit_mxfp8_quantize_job_t *j = ctx;
  int64_t nb = j->k / REFIT_MXFP8_BLOCK;
  for (int64_t r = begin; r < end; r++) {
    const uint16_t *s = j->src + r * j->src_stride;
    uint8_t *q = j->q + r * j->q_stride;
    uint8_t *sc = j->scale + r * j->scale_stride;
    for (int64_t b = 0; b < nb; b++)
      sc[b] = refit_mxfp8_quantize_block_inline(s + b * REFIT_MXFP8_BLOCK,
                                         q + b * REFIT_MXFP8_BLOCK);
  }
}

refit_status_t refit_mxfp8_quantize_rows(const uint16_t *src, int64_t rows,
                                         int64_t k, int64_t src_stride_elems,
                                         uint8_t *q, int64_t q_stride,
                                         uint8_t *scale, int64_t scale_stride) {
  if (rows < 0 || k < 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "mxfp8 quantize: negative shape [%lld, %lld]",
                     (long long)rows, (long long)k);
  if (k % REFIT_MXFP8_BLOCK != 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "mxfp8 quantize: K = %lld is not a multiple of the "
                     "32-element scale block",
                     (long long)k);
  if (rows == 0 || k == 0)
    return REFIT_OK;
  if (src == NULL || q == NULL || scale == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "mxfp8 quantize: NULL buffer (src %p, q %p, scale %p)",
                     (const void *)src, (void *)q, (void *)scale);
  if (src_stride_elems < k || q_stride < k || scale_stride < k / 32)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "mxfp8 quantize: strides (src %lld elems, q %lld B, scale "
                     "%lld B) smaller than a row (K = %lld, K/32 = %lld)",
                     (long long)src_stride_elems, (long long)q_stride,
                     (long long)scale_stride, (long long)k, (long long)(k / 32));
  refit_mxfp8_quantize_job_t job = {src, k, src_stride_elems, q, q_stride,
                                    scale, scale_stride};
  /* 2 bytes read, 1 + 1/32 written per element. */
  refit_kernels_parallel_for(rows, k * 3, refit_mxfp8_quantize_range, &job);
  return REFIT_OK;
}
