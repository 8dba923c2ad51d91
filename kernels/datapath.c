/*
 * Data-path kernels, C reference. See kernels/datapath.h for the contract.
 *
 * The references are written for clarity first: one pass per descriptor, row
 * by row, with memcpy and refit_mxfp8_quantize_rows doing the element work
 * (whole chunks at once when the source allows it, so the quantizer's worker
 * threads apply). The CUDA twins (kernels/datapath.cu) produce the same bytes.
 */
#include "kernels/datapath.h"
#include "kernels/fp8_block.h"
#include "kernels/mxfp8.h"
#include "kernels/synth_rules.h"

#include "core/digest.h"
#include "core/error.h"

#include <stdlib.h>
#include <string.h>

/* ---- Descriptor checks --------------------------------------------------- */

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

/* What an op other than COPY moves on one side of the wire: a wire row of
 * BF16 (2 * cols bytes) or of MXFP8 (cols e4m3 bytes then cols/32 scales),
 * and a tensor row of BF16 or of e4m3 with the scales in an array of their
 * own. */
typedef struct {
  int allowed;
  int wire_bf16, tensor_bf16, scales;
  int block; /* block FP8 wire rows: scale slots per 128 columns, any cols */
} refit_desc_op_t;

/* How one table (pack or land) names its fields and which ops it takes,
 * indexed by refit_chunk_op_t. */
typedef struct {
  const char *what, *offset_name, *tensor_name, *pitch_name, *ops_text;
  refit_desc_op_t op[5];
} refit_desc_table_t;

static const char *const refit_desc_op_names[5] = {"COPY", "QUANTIZE", "SPLIT",
                                                   "BLOCK_QUANTIZE", "BLOCK_SPLIT"};

static const refit_desc_table_t refit_pack_table = {
    .what = "pack",
    .offset_name = "dst_offset",
    .tensor_name = "src",
    .pitch_name = "src_pitch",
    .ops_text = "COPY, QUANTIZE or BLOCK_QUANTIZE",
    .op = {[REFIT_CHUNK_COPY] = {.allowed = 1},
           /* BF16 shard rows onto the wire as MXFP8 */
           [REFIT_CHUNK_QUANTIZE] = {.allowed = 1, .tensor_bf16 = 1},
           /* BF16 shard blocks onto the wire as block FP8 */
           [REFIT_CHUNK_BLOCK_QUANTIZE] = {.allowed = 1, .tensor_bf16 = 1, .block = 1}}};
static const refit_desc_table_t refit_land_table = {
    .what = "land",
    .offset_name = "src_offset",
    .tensor_name = "dst",
    .pitch_name = "dst_pitch",
    .ops_text = "COPY, QUANTIZE, SPLIT or BLOCK_SPLIT",
    .op = {[REFIT_CHUNK_COPY] = {.allowed = 1},
           /* BF16 wire rows into e4m3 storage and its scales */
           [REFIT_CHUNK_QUANTIZE] = {.allowed = 1, .wire_bf16 = 1, .scales = 1},
           /* MXFP8 wire rows, split into the same places */
           [REFIT_CHUNK_SPLIT] = {.allowed = 1, .scales = 1},
           /* block FP8 wire rows, values and block rows' scales */
           [REFIT_CHUNK_BLOCK_SPLIT] = {.allowed = 1, .scales = 1, .block = 1}}};

/* A descriptor of either table, as the checks see it. */
typedef struct {
  int64_t offset; /* into the wire buffer or the staging area */
  int64_t rows, cols, row_bytes;
  const void *tensor; /* pack's src, land's dst */
  int64_t pitch;      /* of the tensor rows */
  const void *scale;  /* land only */
  int64_t scale_pitch;
  int32_t op, digest;
  int32_t fp8_scale; /* pack only */
} refit_desc_view_t;

/* The rules of refit_pack_descs_check and refit_land_descs_check (datapath.h)
 * for descriptor i of table t, in order; the first broken one is named. */
static refit_status_t check_desc(const refit_desc_table_t *t, int64_t i,
                                 const refit_desc_view_t *d) {
  const char *what = t->what;
  if (d->rows < 0 || d->cols < 0 || d->row_bytes < 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s descriptor %lld: negative shape (rows %lld, cols %lld, "
                     "row_bytes %lld)",
                     what, (long long)i, (long long)d->rows, (long long)d->cols,
                     (long long)d->row_bytes);
  if (d->digest != 0 && d->digest != 1)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s descriptor %lld: digest flag %d is neither 0 nor 1", what,
                     (long long)i, (int)d->digest);
  if (d->offset < 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "%s descriptor %lld: negative %s %lld",
                     what, (long long)i, t->offset_name, (long long)d->offset);
  const refit_desc_op_t *o =
      d->op >= 0 && d->op < 5 && t->op[d->op].allowed ? &t->op[d->op] : NULL;
  if (o == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "%s descriptor %lld: op %d is not %s",
                     what, (long long)i, (int)d->op, t->ops_text);
  const char *op_name = refit_desc_op_names[d->op];
  if (d->op != REFIT_CHUNK_COPY && !o->block && d->cols % REFIT_MXFP8_BLOCK != 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s descriptor %lld: cols %lld of a %s chunk is not a "
                     "multiple of the 32-element scale block",
                     what, (long long)i, (long long)d->cols, op_name);
  if (d->op == REFIT_CHUNK_BLOCK_QUANTIZE && d->fp8_scale != REFIT_FP8_SCALE_FP32 &&
      d->fp8_scale != REFIT_FP8_SCALE_POW2)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s descriptor %lld: fp8_scale %d is neither fp32 (0) nor pow2 (1)",
                     what, (long long)i, (int)d->fp8_scale);
  /* Scale bytes per scale row, and scale rows (MXFP8: one per row). */
  const int64_t nb = o->block ? 4 * REFIT_BLOCK_WIRE_SLOTS(d->cols)
                              : d->cols / REFIT_MXFP8_BLOCK;
  const int64_t scale_rows = o->block ? refit_fp8_block_count(d->rows) : d->rows;
  if (d->op == REFIT_CHUNK_COPY) {
    REFIT_CHECK(check_pitch(what, i, t->pitch_name, d->rows, d->pitch, d->row_bytes));
  } else {
    const int64_t row_bytes = o->wire_bf16 ? 2 * d->cols : d->cols + nb;
    if (d->row_bytes != row_bytes)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "%s descriptor %lld: %s row_bytes %lld, expected %lld for "
                       "cols %lld",
                       what, (long long)i, op_name, (long long)d->row_bytes,
                       (long long)row_bytes, (long long)d->cols);
    REFIT_CHECK(check_pitch(what, i, t->pitch_name, d->rows, d->pitch,
                            o->tensor_bf16 ? 2 * d->cols : d->cols));
    if (o->scales) {
      REFIT_CHECK(check_pitch(what, i, "scale_pitch", scale_rows, d->scale_pitch, nb));
      if (d->scale == NULL && scale_rows * nb > 0)
        return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "%s descriptor %lld: NULL scale",
                         what, (long long)i);
    }
  }
  if (d->tensor == NULL && d->rows * d->row_bytes > 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "%s descriptor %lld: NULL %s", what,
                     (long long)i, t->tensor_name);
  return REFIT_OK;
}

refit_status_t refit_pack_descs_check(const refit_pack_desc_t *descs,
                                      int64_t n) {
  REFIT_CHECK(check_table(refit_pack_table.what, descs, n));
  for (int64_t i = 0; i < n; i++) {
    const refit_pack_desc_t *d = &descs[i];
    const refit_desc_view_t v = {.offset = d->dst_offset,
                                 .rows = d->rows,
                                 .cols = d->cols,
                                 .row_bytes = d->row_bytes,
                                 .tensor = d->src,
                                 .pitch = d->src_pitch,
                                 .op = d->op,
                                 .digest = d->digest,
                                 .fp8_scale = d->fp8_scale};
    REFIT_CHECK(check_desc(&refit_pack_table, i, &v));
  }
  return REFIT_OK;
}

refit_status_t refit_land_descs_check(const refit_land_desc_t *descs,
                                      int64_t n) {
  REFIT_CHECK(check_table(refit_land_table.what, descs, n));
  for (int64_t i = 0; i < n; i++) {
    const refit_land_desc_t *d = &descs[i];
    const refit_desc_view_t v = {.offset = d->src_offset,
                                 .rows = d->rows,
                                 .cols = d->cols,
                                 .row_bytes = d->row_bytes,
                                 .tensor = d->dst,
                                 .pitch = d->dst_pitch,
                                 .scale = d->scale,
                                 .scale_pitch = d->scale_pitch,
                                 .op = d->op,
                                 .digest = d->digest};
    REFIT_CHECK(check_desc(&refit_land_table, i, &v));
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

/*
 * BLOCK_QUANTIZE of one pack descriptor: the chunk's blocks quantized alone
 * (its rows and columns are whole blocks of its tensor, reshard/blocks.h),
 * values straight into the wire rows, scales through `scales` (FP32, at
 * least ceil(rows/128) * slots) into the slots of every row of their block
 * row.
 */
static refit_status_t pack_block(const refit_pack_desc_t *d, uint8_t *wire,
                                 float *scales) {
  const int64_t slots = REFIT_BLOCK_WIRE_SLOTS(d->cols);
  REFIT_CHECK(refit_fp8_block_quantize(d->src, d->rows, d->cols,
                                       d->rows > 1 ? d->src_pitch / 2 : d->cols,
                                       (refit_fp8_scale_t)d->fp8_scale, wire, d->row_bytes,
                                       scales, slots));
  for (int64_t r = 0; r < d->rows; r++)
    memcpy(wire + r * d->row_bytes + d->cols, scales + (r / REFIT_FP8_BLOCK) * slots,
           (size_t)slots * 4);
  return REFIT_OK;
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
  int64_t max_scales = 0;
  for (int64_t i = 0; i < n; i++)
    if (descs[i].op == REFIT_CHUNK_BLOCK_QUANTIZE) {
      const int64_t k = refit_fp8_block_count(descs[i].rows) *
                        REFIT_BLOCK_WIRE_SLOTS(descs[i].cols);
      max_scales = k > max_scales ? k : max_scales;
    }
  uint16_t *tmp = max_cols > 0 ? malloc((size_t)max_cols * 2) : NULL;
  float *scales = max_scales > 0 ? malloc((size_t)max_scales * sizeof(float)) : NULL;
  refit_status_t st = REFIT_OK;
  if ((max_cols > 0 && tmp == NULL) || (max_scales > 0 && scales == NULL)) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY,
                   "pack: no memory for a %lld-column row or %lld block scales",
                   (long long)max_cols, (long long)max_scales);
    goto out;
  }
  for (int64_t i = 0; i < n; i++) {
    const refit_pack_desc_t *d = &descs[i];
    uint8_t *wire = (uint8_t *)buf + d->dst_offset;
    const uint8_t *src = d->src;
    if (d->op == REFIT_CHUNK_COPY)
      copy_rows(src, d->src_pitch, wire, d->row_bytes, d->rows, d->row_bytes);
    else if (d->op == REFIT_CHUNK_BLOCK_QUANTIZE)
      REFIT_CHECK_GOTO(pack_block(d, wire, scales), st, out);
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
  free(scales);
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
    } else if (d->op == REFIT_CHUNK_BLOCK_SPLIT) {
      copy_rows(wire, d->row_bytes, dst, d->dst_pitch, d->rows, d->cols);
      copy_rows(wire + d->cols, REFIT_FP8_BLOCK * d->row_bytes, d->scale, d->scale_pitch,
                refit_fp8_block_count(d->rows), 4 * REFIT_BLOCK_WIRE_SLOTS(d->cols));
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

void refit_synth_rect(const refit_synth_key_t *key, int64_t tensor_cols, int64_t row0,
                      int64_t col0, int64_t rows, int64_t cols, uint16_t *dst) {
  for (int64_t r = 0; r < rows; r++) {
    const int64_t base = (row0 + r) * tensor_cols + col0;
    for (int64_t c = 0; c < cols; c++)
      dst[r * cols + c] = refit_synth_value(key, base + c);
  }
}

void refit_synth_rows(const refit_synth_key_t *keys, const int64_t *bases, int64_t rows,
                      int64_t cols, uint16_t *dst) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++)
      dst[r * cols + c] = refit_synth_value(&keys[r], bases[r] + c);
}

refit_status_t refit_compare_check(size_t bytes, size_t elem) {
  if ((elem != 1 && elem != 2 && elem != 4) || bytes % elem != 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "compare: element size %zu must be 1, 2 or 4 and divide %zu bytes",
                     elem, bytes);
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
