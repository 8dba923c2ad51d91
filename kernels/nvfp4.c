/*
 * NVFP4 quantization, C reference. See kernels/nvfp4.h for the rules; the
 * arithmetic is the shared inline code of kernels/nvfp4_rules.h.
 *
 * A job is a band of rows; each row is quantized block by block (16
 * elements: one amax, one scale, eight packed bytes), so every byte depends
 * only on its own block and the global scale.
 */
#include "kernels/nvfp4.h"
#include "kernels/nvfp4_rules.h"
#include "kernels/parallel.h"

#include "core/error.h"

static refit_status_t refit_nvfp4_shape_check(const char *who, const void *src,
                                              int64_t rows, int64_t k,
                                              int64_t src_stride_elems) {
  if (rows < 0 || k < 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "%s: negative shape [%lld, %lld]", who,
                     (long long)rows, (long long)k);
  if (rows == 0 || k == 0)
    return REFIT_OK;
  if (src == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "%s: NULL source for [%lld, %lld]", who,
                     (long long)rows, (long long)k);
  if (src_stride_elems < k)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s: source stride %lld elements is smaller than a row (K = %lld)",
                     who, (long long)src_stride_elems, (long long)k);
  return REFIT_OK;
}

refit_status_t refit_nvfp4_check(const char *who, const void *src, int64_t rows,
                                 int64_t k, int64_t src_stride_elems, float gsf,
                                 const void *q, int64_t q_stride, const void *sf,
                                 int64_t sf_stride) {
  REFIT_CHECK(refit_nvfp4_shape_check(who, src, rows, k, src_stride_elems));
  if (!(gsf > 0.0f))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s: global scale %g must be positive (+Inf allowed), not zero, "
                     "negative or NaN",
                     who, (double)gsf);
  if (rows == 0 || k == 0)
    return REFIT_OK;
  if (q == NULL || sf == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s: NULL output (q %p, sf %p) for [%lld, %lld]", who, q, sf,
                     (long long)rows, (long long)k);
  if (q_stride < refit_nvfp4_row_bytes(k) || sf_stride < refit_nvfp4_scale_cols(k))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s: strides (q %lld B, sf %lld B) smaller than a row (K = %lld: "
                     "%lld packed bytes, %lld scales)",
                     who, (long long)q_stride, (long long)sf_stride, (long long)k,
                     (long long)refit_nvfp4_row_bytes(k),
                     (long long)refit_nvfp4_scale_cols(k));
  return REFIT_OK;
}

uint16_t refit_nvfp4_amax_key(const uint16_t *src, int64_t rows, int64_t k,
                              int64_t src_stride_elems, refit_status_t *status) {
  const refit_status_t st =
      refit_nvfp4_shape_check("nvfp4 amax", src, rows, k, src_stride_elems);
  if (status != NULL)
    *status = st;
  if (st != REFIT_OK)
    return 0;
  uint32_t m = 0;
  for (int64_t r = 0; r < rows; r++) {
    const uint16_t *s = src + r * src_stride_elems;
    for (int64_t i = 0; i < k; i++) {
      const uint32_t a = refit_nvfp4_key(s[i]);
      m = a > m ? a : m;
    }
  }
  return (uint16_t)m;
}

int64_t refit_nvfp4_amax_number(refit_nvfp4_amax_desc_t *descs, int64_t n,
                                refit_status_t *status) {
  int64_t tiles = 0;
  for (int64_t i = 0; i < n; i++) {
    refit_nvfp4_amax_desc_t *d = &descs[i];
    refit_status_t st =
        refit_nvfp4_shape_check("nvfp4 amax (table)", d->src, d->rows, d->k, d->stride);
    if (st == REFIT_OK && d->rows > 0 && d->k > 0 &&
        (d->slot == NULL || (d->k + 7) / 8 > INT32_MAX))
      st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "nvfp4 amax (table): descriptor %lld of %lld: slot %p, K = %lld: "
                     "needs a slot and K / 8 below 2^31",
                     (long long)i, (long long)n, (void *)d->slot, (long long)d->k);
    if (st != REFIT_OK) {
      if (status != NULL)
        *status = st;
      return -1;
    }
    d->tile0 = tiles;
    if (d->rows > 0 && d->k > 0) {
      const int64_t per = refit_nvfp4_amax_tile_rows(d->k);
      tiles += (d->rows + per - 1) / per;
    }
  }
  if (status != NULL)
    *status = REFIT_OK;
  return tiles;
}

refit_status_t refit_nvfp4_amax_keys(const refit_nvfp4_amax_desc_t *descs, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const refit_nvfp4_amax_desc_t *d = &descs[i];
    if (d->rows > 0 && d->k > 0 && d->slot == NULL) /* before reading the matrix */
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "nvfp4 amax (table): descriptor %lld of %lld has no slot",
                       (long long)i, (long long)n);
    refit_status_t st = REFIT_OK;
    const uint16_t key = refit_nvfp4_amax_key(d->src, d->rows, d->k, d->stride, &st);
    REFIT_CHECK(st);
    if (d->slot != NULL && key > *d->slot)
      *d->slot = key;
  }
  return REFIT_OK;
}

float refit_nvfp4_global_scale(uint16_t key) { return refit_nvfp4_global_rule(key); }

float refit_nvfp4_global_decode(float gsf) { return 1.0f / gsf; }

typedef struct {
  const uint16_t *src;
  int64_t k, src_stride;
  float gsf;
  uint8_t *q;
  int64_t q_stride;
  uint8_t *sf;
  int64_t sf_stride;
} refit_nvfp4_job_t;

/* One row: blocks of 16 elements, the last one possibly partial. */
static void refit_nvfp4_row(const refit_nvfp4_job_t *j, const uint16_t *s, uint8_t *q,
                            uint8_t *sf) {
  const int64_t nb = refit_nvfp4_scale_cols(j->k);
  const refit_nvfp4_tensor_rule_t t = refit_nvfp4_tensor_rule(j->gsf);
  for (int64_t b = 0; b < nb; b++) {
    const int64_t x0 = b * REFIT_NVFP4_BLOCK;
    const int n = (int)(j->k - x0 < REFIT_NVFP4_BLOCK ? j->k - x0 : REFIT_NVFP4_BLOCK);
    uint32_t key = 0;
    for (int i = 0; i < n; i++) {
      const uint32_t a = refit_nvfp4_key(s[x0 + i]);
      key = a > key ? a : key;
    }
    const float out = refit_nvfp4_block_rule(key, t, &sf[b]);
    for (int i = 0; i < n; i += 2) {
      const uint32_t lo =
          refit_nvfp4_e2m1(refit_f32_from_bits((uint32_t)s[x0 + i] << 16) * out);
      const uint32_t hi =
          i + 1 < n
              ? refit_nvfp4_e2m1(refit_f32_from_bits((uint32_t)s[x0 + i + 1] << 16) * out)
              : 0u;
      q[(x0 + i) / 2] = (uint8_t)(lo | hi << 4);
    }
  }
}

static void refit_nvfp4_range(void *ctx, int64_t begin, int64_t end) {
  const refit_nvfp4_job_t *j = ctx;
  for (int64_t r = begin; r < end; r++)
    refit_nvfp4_row(j, j->src + r * j->src_stride, j->q + r * j->q_stride,
                    j->sf + r * j->sf_stride);
}

refit_status_t refit_nvfp4_quantize(const uint16_t *src, int64_t rows, int64_t k,
                                    int64_t src_stride_elems, float gsf, uint8_t *q,
                                    int64_t q_stride, uint8_t *sf, int64_t sf_stride) {
  REFIT_CHECK(refit_nvfp4_check("nvfp4 quantize", src, rows, k, src_stride_elems, gsf, q,
                                q_stride, sf, sf_stride));
  if (rows == 0 || k == 0)
    return REFIT_OK;
  refit_nvfp4_job_t job = {src, k, src_stride_elems, gsf, q, q_stride, sf, sf_stride};
  /* Per row: 2 bytes read and about 0.56 written per element. */
  refit_kernels_parallel_for(rows, k * 3, refit_nvfp4_range, &job);
  return REFIT_OK;
}

refit_status_t refit_nvfp4_groups_check(const char *who, const void *src, int64_t groups,
                                        int64_t rows, int64_t k, int64_t src_stride_elems,
                                        const float *gsf, const void *q, int64_t q_stride,
                                        const void *sf, int64_t sf_stride) {
  if (groups < 0 || (groups > 0 && gsf == NULL))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s: %lld matrices with global scales %p: needs a count >= 0 and a "
                     "scale for each",
                     who, (long long)groups, (const void *)gsf);
  for (int64_t g = 0; g < groups; g++)
    if (!(gsf[g] > 0.0f))
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "%s: matrix %lld of %lld: global scale %g must be positive (+Inf "
                       "allowed), not zero, negative or NaN",
                       who, (long long)g, (long long)groups, (double)gsf[g]);
  return groups == 0 ? REFIT_OK
                     : refit_nvfp4_check(who, src, rows, k, src_stride_elems, gsf[0], q,
                                         q_stride, sf, sf_stride);
}

refit_status_t refit_nvfp4_quantize_groups(const uint16_t *src, int64_t groups,
                                           int64_t rows, int64_t k,
                                           int64_t src_stride_elems, const float *gsf,
                                           uint8_t *q, int64_t q_stride, uint8_t *sf,
                                           int64_t sf_stride, float *decode) {
  REFIT_CHECK(refit_nvfp4_groups_check("nvfp4 quantize", src, groups, rows, k,
                                       src_stride_elems, gsf, q, q_stride, sf,
                                       sf_stride));
  for (int64_t g = 0; g < groups && decode != NULL; g++)
    decode[g] = refit_nvfp4_global_decode(gsf[g]);
  for (int64_t g = 0; g < groups && rows > 0 && k > 0; g++)
    REFIT_CHECK(refit_nvfp4_quantize(src + g * rows * src_stride_elems, rows, k,
                                     src_stride_elems, gsf[g], q + g * rows * q_stride,
                                     q_stride, sf + g * rows * sf_stride, sf_stride));
  return REFIT_OK;
}
