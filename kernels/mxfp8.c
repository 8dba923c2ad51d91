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
#include "kernels/e4m3.h"
#include "kernels/mxfp8_rules.h"
#include "kernels/parallel.h"

#include "core/error.h"

#include <string.h>

uint8_t refit_mxfp8_scale_exponent(float amax) {
  return (uint8_t)refit_mxfp8_scale_rule(amax);
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

typedef uint8_t (*refit_mxfp8_block_fn)(const uint16_t *src, uint8_t *q);

/* Rows [begin, end) of a job, block by block. Inlined into each range
 * function with its block function, which is inlined in turn, so each is
 * compiled for its own instruction set. */
static inline __attribute__((always_inline)) void
refit_mxfp8_quantize_job_rows(const refit_mxfp8_quantize_job_t *j, int64_t begin,
                              int64_t end, refit_mxfp8_block_fn block) {
  const int64_t nb = j->k / REFIT_MXFP8_BLOCK;
  for (int64_t r = begin; r < end; r++) {
    const uint16_t *s = j->src + r * j->src_stride;
    uint8_t *q = j->q + r * j->q_stride;
    uint8_t *sc = j->scale + r * j->scale_stride;
    for (int64_t b = 0; b < nb; b++)
      sc[b] = block(s + b * REFIT_MXFP8_BLOCK, q + b * REFIT_MXFP8_BLOCK);
  }
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>

#define REFIT_MXFP8_HAVE_AVX512 1
#define REFIT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

/* refit_e4m3_encode_inline in 16 lanes, step for step (the same integer and
 * fp32 operations, so the same bytes): the selects become masked moves and
 * the narrowing to bytes one vpmovdb. */
static inline REFIT_AVX512 __m128i refit_e4m3_encode16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __m512i sign =
      _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
  __m512i normal =
      _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32(0x7ffff)),
                       _mm512_and_si512(_mm512_srli_epi32(a, 20), _mm512_set1_epi32(1)));
  normal = _mm512_sub_epi32(_mm512_srli_epi32(normal, 20), _mm512_set1_epi32(120 << 3));
  const __m512i sub =
      _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a),
                                                         _mm512_set1_ps(16384.0f))),
                       _mm512_set1_epi32(0x46800000));
  __m512i q = _mm512_mask_mov_epi32(
      normal, _mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(0x3c800000)), sub);
  q = _mm512_mask_mov_epi32(q, _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(0x43e00000)),
                            _mm512_set1_epi32(REFIT_MXFP8_E4M3_MAX_BITS));
  q = _mm512_or_si512(q, sign);
  q = _mm512_mask_mov_epi32(q, _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000)),
                            _mm512_set1_epi32(REFIT_MXFP8_E4M3_NAN_BITS));
  return _mm512_cvtepi32_epi8(q);
}

/* refit_mxfp8_quantize_block_inline with one block in one register: the
 * amax keys (|bf16| bits, NaN as 0) reduced by unsigned 16-bit maxima, the
 * scale rule in scalar code, each half of the block widened to fp32,
 * multiplied by the inverse scale and encoded. */
static inline REFIT_AVX512 uint8_t refit_mxfp8_quantize_block_avx512(const uint16_t *src,
                                                                     uint8_t *q) {
  const __m512i raw = _mm512_loadu_si512(src);
  __m512i key = _mm512_and_si512(raw, _mm512_set1_epi16(0x7fff));
  key = _mm512_maskz_mov_epi16(_mm512_cmple_epu16_mask(key, _mm512_set1_epi16(0x7f80)),
                               key);
  const __m256i m256 =
      _mm256_max_epu16(_mm512_castsi512_si256(key), _mm512_extracti64x4_epi64(key, 1));
  __m128i m =
      _mm_max_epu16(_mm256_castsi256_si128(m256), _mm256_extracti128_si256(m256, 1));
  /* The largest of 8 keys: the smallest of their complements. */
  m = _mm_minpos_epu16(_mm_xor_si128(m, _mm_set1_epi16(-1)));
  const uint16_t amax = (uint16_t) ~(uint32_t)_mm_cvtsi128_si32(m);
  const uint32_t E = refit_mxfp8_scale_rule(refit_bf16_to_float(amax));
  const __m512 inv = _mm512_set1_ps(refit_mxfp8_inv_scale(E));
  const __m512 lo = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(raw)), 16));
  const __m512 hi = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(raw, 1)), 16));
  _mm_storeu_si128((__m128i *)q, refit_e4m3_encode16(_mm512_mul_ps(lo, inv)));
  _mm_storeu_si128((__m128i *)(q + 16), refit_e4m3_encode16(_mm512_mul_ps(hi, inv)));
  return (uint8_t)(E == 0 ? 1 : E);
}

static REFIT_AVX512 void refit_mxfp8_quantize_range_avx512(void *ctx, int64_t begin,
                                                           int64_t end) {
  refit_mxfp8_quantize_job_rows(ctx, begin, end, refit_mxfp8_quantize_block_avx512);
}

static int refit_mxfp8_cpu_has_avx512(void) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}
#else
static int refit_mxfp8_cpu_has_avx512(void) { return 0; }
#endif

/* Built twice, for AVX2 and for the baseline x86-64 ISA; the loader picks
 * the one the CPU runs (the element loops are 8 lanes wide with AVX2). */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx2", "default")))
#endif
static void
refit_mxfp8_quantize_range(void *ctx, int64_t begin, int64_t end) {
  refit_mxfp8_quantize_job_rows(ctx, begin, end, refit_mxfp8_quantize_block_inline);
}

refit_status_t refit_mxfp8_quantize_rows(const uint16_t *src, int64_t rows, int64_t k,
                                         int64_t src_stride_elems, uint8_t *q,
                                         int64_t q_stride, uint8_t *scale,
                                         int64_t scale_stride) {
  if (rows < 0 || k < 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "mxfp8 quantize: negative shape [%lld, %lld]", (long long)rows,
                     (long long)k);
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
  refit_mxfp8_quantize_job_t job = {src,      k,     src_stride_elems, q,
                                    q_stride, scale, scale_stride};
  void (*range)(void *, int64_t, int64_t) = refit_mxfp8_quantize_range;
#ifdef REFIT_MXFP8_HAVE_AVX512
  if (refit_mxfp8_quantize_code() == REFIT_MXFP8_CODE_AVX512)
    range = refit_mxfp8_quantize_range_avx512;
#endif
  /* 2 bytes read, 1 + 1/32 written per element. */
  refit_kernels_parallel_for(rows, k * 3, range, &job);
  return REFIT_OK;
}

/* -1 until the first call decides; REFIT_MXFP8_CODE_* after. */
static int refit_mxfp8_code = -1;

static int refit_mxfp8_code_runs(refit_mxfp8_code_t code) {
  return code == REFIT_MXFP8_CODE_PORTABLE ||
         (code == REFIT_MXFP8_CODE_AVX512 && refit_mxfp8_cpu_has_avx512());
}

refit_mxfp8_code_t refit_mxfp8_quantize_code(void) {
  int code = __atomic_load_n(&refit_mxfp8_code, __ATOMIC_RELAXED);
  if (code < 0) {
    code = refit_mxfp8_code_runs(REFIT_MXFP8_CODE_AVX512) ? REFIT_MXFP8_CODE_AVX512
                                                          : REFIT_MXFP8_CODE_PORTABLE;
    __atomic_store_n(&refit_mxfp8_code, code, __ATOMIC_RELAXED);
  }
  return (refit_mxfp8_code_t)code;
}

refit_status_t refit_mxfp8_quantize_use(refit_mxfp8_code_t code) {
  if (code == REFIT_MXFP8_CODE_BEST) {
    __atomic_store_n(&refit_mxfp8_code, -1, __ATOMIC_RELAXED);
    return REFIT_OK;
  }
  if (!refit_mxfp8_code_runs(code))
    return REFIT_ERR(REFIT_ERR_NOT_AVAILABLE,
                     "mxfp8 quantize: this CPU cannot run the %s code (it needs "
                     "AVX-512 F, BW and VL)",
                     refit_mxfp8_code_name(code));
  __atomic_store_n(&refit_mxfp8_code, (int)code, __ATOMIC_RELAXED);
  return REFIT_OK;
}

const char *refit_mxfp8_code_name(refit_mxfp8_code_t code) {
  switch (code) {
  case REFIT_MXFP8_CODE_PORTABLE:
    return "portable";
  case REFIT_MXFP8_CODE_AVX512:
    return "avx512";
  case REFIT_MXFP8_CODE_BEST:
    return "best";
  }
  return "unknown";
}
