/*
 * Block FP8 quantization, C reference. See kernels/fp8_block.h for the rules.
 *
 * A job is a band of 128 rows (one block row): a first pass over its rows
 * takes the amax key of every block column (an integer max over |bf16| bit
 * patterns, which orders like the values), the scales follow from the shared
 * rule (kernels/fp8_block_rules.h), and a second pass over the same rows
 * encodes. Both passes read rows front to back over at most 64 block
 * columns, so a band of a wide matrix stays in cache between them.
 */
#include "kernels/fp8_block.h"
#include "kernels/e4m3.h"
#include "kernels/fp8_block_rules.h"
#include "kernels/parallel.h"

#include "core/error.h"

void refit_fp8_block_scale(uint16_t amax_bits, refit_fp8_scale_t mode, float *scale,
                           float *scale_inv) {
  refit_fp8_block_scale_rule(refit_fp8_block_amax_key(amax_bits), (int)mode, scale,
                             scale_inv);
}

refit_status_t refit_fp8_block_check(const char *who, const void *src, int64_t rows,
                                     int64_t k, int64_t src_stride_elems,
                                     refit_fp8_scale_t mode, const void *q,
                                     int64_t q_stride, const void *scale_inv,
                                     int64_t scale_stride) {
  if (rows < 0 || k < 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "%s: negative shape [%lld, %lld]", who,
                     (long long)rows, (long long)k);
  if (mode != REFIT_FP8_SCALE_FP32 && mode != REFIT_FP8_SCALE_POW2)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s: scale mode %d is neither fp32 (0) nor pow2 (1)", who,
                     (int)mode);
  if (rows == 0 || k == 0)
    return REFIT_OK;
  if (src == NULL || q == NULL || scale_inv == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s: NULL buffer (src %p, q %p, scale_inv %p) for [%lld, %lld]", who,
                     src, q, scale_inv, (long long)rows, (long long)k);
  if (src_stride_elems < k || q_stride < k || scale_stride < refit_fp8_block_count(k))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s: strides (src %lld elements, q %lld B, scale_inv %lld "
                     "elements) smaller than a row (K = %lld, %lld scale columns)",
                     who, (long long)src_stride_elems, (long long)q_stride,
                     (long long)scale_stride, (long long)k,
                     (long long)refit_fp8_block_count(k));
  return REFIT_OK;
}

typedef struct {
  const uint16_t *src;
  int64_t rows, k, src_stride;
  int mode;
  uint8_t *q;
  int64_t q_stride;
  float *scale_inv;
  int64_t scale_stride;
  uint32_t pad_key; /* amax key of the matrix's last element */
} refit_fp8_block_job_t;

/* The largest key of n BF16 values (an integer max the compiler vectorizes). */
static inline uint32_t refit_fp8_block_row_key(const uint16_t *restrict s, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; i++) {
    const uint32_t a = refit_fp8_block_amax_key(s[i]);
    m = a > m ? a : m;
  }
  return m;
}

/* n elements times `scale` as E4M3 (the same steps as MXFP8's element loop). */
static inline void refit_fp8_block_encode(const uint16_t *restrict s, int64_t n,
                                          float scale, uint8_t *restrict q) {
  for (int64_t i = 0; i < n; i++)
    q[i] = refit_e4m3_encode_inline(refit_f32_from_bits((uint32_t)s[i] << 16) * scale);
}

/* Block rows [begin, end) of a job. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx2", "default")))
#endif
static void
refit_fp8_block_range(void *ctx, int64_t begin, int64_t end) {
  const refit_fp8_block_job_t *j = ctx;
  const int64_t nbc = refit_fp8_block_count(j->k);
  const int partial_cols = j->k % REFIT_FP8_BLOCK != 0;
  /* Block columns a pass covers: 64 of them are 16 KiB of a row, so the
   * band's rows stay in cache between the two passes. */
  enum { step = 64 };
  uint32_t keys[step];
  float scales[step];

  for (int64_t br = begin; br < end; br++) {
    const int64_t r0 = br * REFIT_FP8_BLOCK;
    const int64_t r1 = r0 + REFIT_FP8_BLOCK < j->rows ? r0 + REFIT_FP8_BLOCK : j->rows;
    const int partial_rows = r1 - r0 < REFIT_FP8_BLOCK;
    for (int64_t c0 = 0; c0 < nbc; c0 += step) {
      const int64_t c1 = c0 + step < nbc ? c0 + step : nbc;
      /* Pass 1: amax keys, row by row across the band's block columns. */
      for (int64_t c = c0; c < c1; c++)
        keys[c - c0] = partial_rows || (partial_cols && c == nbc - 1) ? j->pad_key : 0;
      for (int64_t r = r0; r < r1; r++) {
        const uint16_t *s = j->src + r * j->src_stride;
        for (int64_t c = c0; c < c1; c++) {
          const int64_t x0 = c * REFIT_FP8_BLOCK;
          const int64_t n = x0 + REFIT_FP8_BLOCK <= j->k ? REFIT_FP8_BLOCK : j->k - x0;
          const uint32_t m = refit_fp8_block_row_key(s + x0, n);
          keys[c - c0] = m > keys[c - c0] ? m : keys[c - c0];
        }
      }
      for (int64_t c = c0; c < c1; c++)
        refit_fp8_block_scale_rule(keys[c - c0], j->mode, &scales[c - c0],
                                   &j->scale_inv[br * j->scale_stride + c]);
      /* Pass 2: the elements. */
      for (int64_t r = r0; r < r1; r++) {
        const uint16_t *s = j->src + r * j->src_stride;
        uint8_t *q = j->q + r * j->q_stride;
        for (int64_t c = c0; c < c1; c++) {
          const int64_t x0 = c * REFIT_FP8_BLOCK;
          const int64_t n = x0 + REFIT_FP8_BLOCK <= j->k ? REFIT_FP8_BLOCK : j->k - x0;
          refit_fp8_block_encode(s + x0, n, scales[c - c0], q + x0);
        }
      }
    }
  }
}

refit_status_t refit_fp8_block_quantize(const uint16_t *src, int64_t rows, int64_t k,
                                        int64_t src_stride_elems, refit_fp8_scale_t mode,
                                        uint8_t *q, int64_t q_stride, float *scale_inv,
                                        int64_t scale_stride) {
  REFIT_CHECK(refit_fp8_block_check("fp8_block quantize", src, rows, k, src_stride_elems,
                                    mode, q, q_stride, scale_inv, scale_stride));
  if (rows == 0 || k == 0)
    return REFIT_OK;
  refit_fp8_block_job_t job = {
      src,
      rows,
      k,
      src_stride_elems,
      (int)mode,
      q,
      q_stride,
      scale_inv,
      scale_stride,
      refit_fp8_block_amax_key(src[(rows - 1) * src_stride_elems + k - 1])};
  /* Per band: 128 rows of 2 bytes read twice and 1 written per element. */
  refit_kernels_parallel_for(refit_fp8_block_count(rows), REFIT_FP8_BLOCK * k * 5,
                             refit_fp8_block_range, &job);
  return REFIT_OK;
}

refit_status_t refit_fp8_block_dequantize(const uint8_t *q, int64_t rows, int64_t k,
                                          int64_t q_stride, const float *scale_inv,
                                          int64_t scale_stride, uint16_t *out,
                                          int64_t out_stride_elems) {
  /* The quantizer's argument rule, read the other way. */
  REFIT_CHECK(refit_fp8_block_check("fp8_block dequantize", out, rows, k,
                                    out_stride_elems, REFIT_FP8_SCALE_FP32, q, q_stride,
                                    scale_inv, scale_stride));
  for (int64_t r = 0; r < rows; r++) {
    const float *s = scale_inv + (r / REFIT_FP8_BLOCK) * scale_stride;
    for (int64_t c = 0; c < k; c++)
      out[r * out_stride_elems + c] =
          refit_fp8_block_dequant_rule(q[r * q_stride + c], s[c / REFIT_FP8_BLOCK]);
  }
  return REFIT_OK;
}
