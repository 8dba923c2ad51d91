/*
 * Data-path kernels, C reference. See kernels/datapath.h for the contract.
 *
 * The references are written for clarity first: one pass per descriptor, row
 * by row, with memcpy and refit_mxfp8_quantize_rows doing the element work
 * (whole chunks at once when the source allows it, so the quantizer's worker
 * threads apply). The CUDA twins (kernels/datapath.cu) produce the same bytes.
 */
#include "kernels/datapath.h"
#include "kernels/mxfp8.h"
#include "kernels/synth_rules.h"

#include "core/digest.h"
#include "core/error.h"

#include <stdlib.h>
#include <string.h>

/* ---- Descriptor checks --------------------------------------------------- */

static refit_status_t check_shape(const char *what, int64_t i, int64_t rows,
                                  int64_t cols, int64_t row_bytes, int32_t op,
                                  int32_t digest) {
  if (rows < 0 || cols < 0 || row_bytes < 0)
    return REFIT_ERR(
        REFIT_ERR_INVALID_ARGUMENT,
        "%s descriptor %lld: negative shape (rows %lld, cols %lld, "
        "row_bytes %lld)",
        what, (long long)i, (long long)rows, (long long)cols,
        (long long)row_bytes);
  if (digest != 0 && digest != 1)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s descriptor %lld: digest flag %d is neither 0 nor 1",
                     what, (long long)i, (int)digest);
  if (op == REFIT_CHUNK_COPY)
    return REFIT_OK;
  if (cols % REFIT_MXFP8_BLOCK != 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s descriptor %lld: cols %lld of a %s chunk is not a "
                     "multiple of the 32-element scale block",
                     what, (long long)i, (long long)cols,
                     op == REFIT_CHUNK_QUANTIZE ? "QUANTIZE" : "SPLIT");
  return REFIT_OK;
}

static refit_status_t check_row_bytes(const char *what, int64_t i,
                                      const char *op, int64_t row_bytes,
                                      int64_t expected, int64_t cols) {
  if (row_bytes != expected)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s descriptor %lld: %s row_bytes %lld, expected %lld for "
                     "cols %lld",
                     what, (long long)i, op, (long long)row_bytes,
                     (long long)expected, (long long)cols);
  return REFIT_OK;
}

static refit_status_t check_pitch(const char *what, int64_t i, const char *name,
                                  int64_t rows, int64_t pitch, int64_t need) {
  if (rows > 1 && pitch < need)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s descriptor %lld: %s %lld is smaller than a row (%lld "
                     "bytes)",
                     what, (long long)i, name, (long long)pitch,
                     (long long)need);
  return REFIT_OK;
}

static refit_status_t check_table(const char *what, const void *descs,
                                  int64_t n) {
  if (n < 0 || (n > 0 && descs == NULL))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s: bad descriptor table (%p, n = %lld)", what, descs,
                     (long long)n);
  return REFIT_OK;
}

refit_status_t refit_pack_descs_check(const refit_pack_desc_t *descs,
                                      int64_t n) {
  const char *what = "pack";
  REFIT_CHECK(check_table(what, descs, n));
  for (int64_t i = 0; i < n; i++) {
    const refit_pack_desc_t *d = &descs[i];
    REFIT_CHECK(
        check_shape(what, i, d->rows, d->cols, d->row_bytes, d->op, d->digest));
    if (d->dst_offset < 0)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "pack descriptor %lld: negative dst_offset %lld",
                       (long long)i, (long long)d->dst_offset);
    if (d->op == REFIT_CHUNK_COPY) {
      REFIT_CHECK(check_pitch(what, i, "src_pitch", d->rows, d->src_pitch,
                              d->row_bytes));
    } else if (d->op == REFIT_CHUNK_QUANTIZE) {
      REFIT_CHECK(check_row_bytes(what, i, "QUANTIZE", d->row_bytes,
                                  d->cols + d->cols / REFIT_MXFP8_BLOCK,
                                  d->cols));
      REFIT_CHECK(check_pitch(what, i, "src_pitch", d->rows, d->src_pitch,
                              2 * d->cols));
    } else {
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "pack descriptor %lld: op %d is not COPY or QUANTIZE",
                       (long long)i, (int)d->op);
    }
    if (d->src == NULL && d->rows * d->row_bytes > 0)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "pack descriptor %lld: NULL src", (long long)i);
  }
  return REFIT_OK;
}

refit_status_t refit_land_descs_check(const refit_land_desc_t *descs,
                                      int64_t n) {
  const char *what = "land";
  REFIT_CHECK(check_table(what, descs, n));
  for (int64_t i = 0; i < n; i++) {
    const refit_land_desc_t *d = &descs[i];
    REFIT_CHECK(
        check_shape(what, i, d->rows, d->cols, d->row_bytes, d->op, d->digest));
    if (d->src_offset < 0)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "land descriptor %lld: negative src_offset %lld",
                       (long long)i, (long long)d->src_offset);
    const int64_t nb = d->cols / REFIT_MXFP8_BLOCK;
    if (d->op == REFIT_CHUNK_COPY) {
      REFIT_CHECK(check_pitch(what, i, "dst_pitch", d->rows, d->dst_pitch,
                              d->row_bytes));
    } else if (d->op == REFIT_CHUNK_QUANTIZE || d->op == REFIT_CHUNK_SPLIT) {
      const int quantize = d->op == REFIT_CHUNK_QUANTIZE;
      REFIT_CHECK(check_row_bytes(
          what, i, quantize ? "QUANTIZE" : "SPLIT", d->row_bytes,
          quantize ? 2 * d->cols : d->cols + nb, d->cols));
      REFIT_CHECK(
          check_pitch(what, i, "dst_pitch", d->rows, d->dst_pitch, d->cols));
      REFIT_CHECK(
          check_pitch(what, i, "scale_pitch", d->rows, d->scale_pitch, nb));
      if (d->scale == NULL && d->rows * nb > 0)
        return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                         "land descriptor %lld: NULL scale", (long long)i);
    } else {
      return REFIT_ERR(
          REFIT_ERR_INVALID_ARGUMENT,
          "land descriptor %lld: op %d is not COPY, QUANTIZE or SPLIT",
          (long long)i, (int)d->op);
    }
    if (d->dst == NULL && d->rows * d->row_bytes > 0)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "land descriptor %lld: NULL dst", (long long)i);
  }
  return REFIT_OK;
}

/* ---- Pack and land ---------------------------------------------------------
 */

static void put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/*
 * Quantize `rows` BF16 rows of `cols` at src (pitch bytes apart) to q/scale.
 * refit_mxfp8_quantize_rows reads uint16_t, so a source that is not 2-byte
 * aligned (wire rows at odd staging offsets) goes row by row through `tmp`.
 */
static refit_status_t quantize_any(const uint8_t *src, int64_t pitch,
                                   int64_t rows, int64_t cols, uint8_t *q,
                                   int64_t q_pitch, uint8_t *scale,
                                   int64_t scale_pitch, uint16_t *tmp) {
  const int64_t nb = cols / REFIT_MXFP8_BLOCK;
  if (((uintptr_t)src % 2 == 0 && pitch % 2 == 0) || rows == 0)
    return refit_mxfp8_quantize_rows((const uint16_t *)(const void *)src, rows,
                                     cols, rows > 1 ? pitch / 2 : cols, q,
                                     rows > 1 ? q_pitch : cols, scale,
                                     rows > 1 ? scale_pitch : nb);
  for (int64_t r = 0; r < rows; r++) {
    memcpy(tmp, src + r * pitch, (size_t)cols * 2);
    REFIT_CHECK(refit_mxfp8_quantize_rows(tmp, 1, cols, cols, q + r * q_pitch,
                                          cols, scale + r * scale_pitch, nb));
  }
  return REFIT_OK;
}

static void copy_rows(const uint8_t *src, int64_t src_pitch, uint8_t *dst,
                      int64_t dst_pitch, int64_t rows, int64_t row_bytes) {
  for (int64_t r = 0; r < rows; r++)
    memcpy(dst + r * dst_pitch, src + r * src_pitch, (size_t)row_bytes);
}

/* Largest cols over QUANTIZE descriptors: the size of the bounce row. */
#define REFIT_MAX_QUANT_COLS(descs, n, out)                                    \
  do {                                                                         \
    (out) = 0;                                                                 \
    for (int64_t i_ = 0; i_ < (n); i_++)                                       \
      if ((descs)[i_].op == REFIT_CHUNK_QUANTIZE && (descs)[i_].cols > (out))  \
        (out) = (descs)[i_].cols;                                              \
  } while (0)

refit_status_t refit_pack_rows(const refit_pack_desc_t *descs, int64_t n, uint64_t tag,
                               void *buf) {
  REFIT_CHECK(refit_pack_descs_check(descs, n));
  if (buf == NULL && n > 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "pack: NULL wire buffer");
  int64_t max_cols;
  REFIT_MAX_QUANT_COLS(descs, n, max_cols);
  uint16_t *tmp = max_cols > 0 ? malloc((size_t)max_cols * 2) : NULL;
  if (max_cols > 0 && tmp == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY,
                     "pack: no memory for a %lld-column row",
                     (long long)max_cols);
  refit_status_t st = REFIT_OK;
  for (int64_t i = 0; i < n; i++) {
    const refit_pack_desc_t *d = &descs[i];
    uint8_t *wire = (uint8_t *)buf + d->dst_offset;
    const uint8_t *src = d->src;
    if (d->op == REFIT_CHUNK_COPY)
      copy_rows(src, d->src_pitch, wire, d->row_bytes, d->rows, d->row_bytes);
    else
      REFIT_CHECK_GOTO(quantize_any(src, d->src_pitch, d->rows, d->cols, wire,
                                    d->row_bytes, wire + d->cols, d->row_bytes,
                                    tmp),
                       st, out);
    if (d->digest)
      put_le64(wire + d->rows * d->row_bytes,
               refit_digest64(wire, (size_t)(d->rows * d->row_bytes)) +
                   refit_seal(d->seal_key, tag));
  }
out:
  free(tmp);
  return st;
}

refit_status_t refit_land_rows(const refit_land_desc_t *descs, int64_t n, uint64_t tag,
                               const void *staging, int64_t *bad_chunk) {
  REFIT_CHECK(refit_land_descs_check(descs, n));
  if ((staging == NULL && n > 0) || bad_chunk == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "land: NULL staging area or bad_chunk");
  int64_t max_cols;
  REFIT_MAX_QUANT_COLS(descs, n, max_cols);
  uint16_t *tmp = max_cols > 0 ? malloc((size_t)max_cols * 2) : NULL;
  if (max_cols > 0 && tmp == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY,
                     "land: no memory for a %lld-column row",
                     (long long)max_cols);
  refit_status_t st = REFIT_OK;
  int64_t bad = -1;
  for (int64_t i = 0; i < n; i++) {
    const refit_land_desc_t *d = &descs[i];
    const uint8_t *wire = (const uint8_t *)staging + d->src_offset;
    const int64_t len = d->rows * d->row_bytes;
    /* Every chunk lands, a bad one too (datapath.h: the caller discards the
     * whole refit on a mismatch), as the CUDA twin does in its one pass. */
    if (d->digest && bad < 0 &&
        refit_digest64(wire, (size_t)len) + refit_seal(d->seal_key, tag) !=
            refit_trailer_load(wire + len))
      bad = i;
    uint8_t *dst = d->dst;
    if (d->op == REFIT_CHUNK_COPY) {
      copy_rows(wire, d->row_bytes, dst, d->dst_pitch, d->rows, d->row_bytes);
    } else if (d->op == REFIT_CHUNK_QUANTIZE) {
      REFIT_CHECK_GOTO(quantize_any(wire, d->row_bytes, d->rows, d->cols, dst,
                                    d->dst_pitch, d->scale, d->scale_pitch,
                                    tmp),
                       st, out);
    } else { /* SPLIT */
      copy_rows(wire, d->row_bytes, dst, d->dst_pitch, d->rows, d->cols);
      copy_rows(wire + d->cols, d->row_bytes, d->scale, d->scale_pitch, d->rows,
                d->cols / REFIT_MXFP8_BLOCK);
    }
  }
  *bad_chunk = bad;
out:
  free(tmp);
  return st;
}

/* ---- Synthetic weights and comparison -------------------------------------
 */

void refit_synth_rect(uint64_t key, int norm, int64_t tensor_cols, int64_t row0,
                      int64_t col0, int64_t rows, int64_t cols, uint16_t *dst) {
  for (int64_t r = 0; r < rows; r++) {
    const int64_t base = (row0 + r) * tensor_cols + col0;
    for (int64_t c = 0; c < cols; c++)
      dst[r * cols + c] = refit_synth_value(key, norm, base + c);
  }
}

void refit_synth_rows(const uint64_t *keys, const int32_t *norms,
                      const int64_t *bases, int64_t rows, int64_t cols,
                      uint16_t *dst) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++)
      dst[r * cols + c] = refit_synth_value(keys[r], norms[r], bases[r] + c);
}

refit_status_t refit_compare_check(size_t bytes, size_t elem) {
  if ((elem != 1 && elem != 2) || bytes % elem != 0)
    return REFIT_ERR(
        REFIT_ERR_INVALID_ARGUMENT,
        "compare: element size %zu must be 1 or 2 and divide %zu bytes", elem,
        bytes);
  return REFIT_OK;
}

refit_status_t refit_compare(const void *a, const void *b, size_t bytes,
                             size_t elem, int64_t *count, int64_t *first) {
  REFIT_CHECK(refit_compare_check(bytes, elem));
  if ((a == NULL || b == NULL) && bytes > 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "compare: NULL buffer");
  const uint8_t *x = a, *y = b;
  int64_t n = 0, f = INT64_MAX;
  for (size_t i = 0; i < bytes / elem; i++)
    if (memcmp(x + i * elem, y + i * elem, elem) != 0) {
      if (n == 0)
        f = (int64_t)i;
      n++;
    }
  *count = n;
  *first = f;
  return REFIT_OK;
}
