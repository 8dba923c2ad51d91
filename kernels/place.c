/*
 * Where each byte of a chunk lands (kernels/place.h states the rules).
 */
#include "kernels/place.h"

#include "core/digest.h"
#include "core/error.h"
#include "kernels/delta.h"

#include <string.h>

refit_status_t refit_place_bf16_tensor(int64_t rows, int64_t cols, uint8_t *data,
                                       refit_place_tensor_t *out) {
  if (rows < 1 || cols < 1 || data == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "place: BF16 tensor [%lld, %lld] at %p: needs a positive shape "
                     "and storage",
                     (long long)rows, (long long)cols, (void *)data);
  *out = (refit_place_tensor_t){REFIT_PLACE_BF16, rows, cols, 1, -1, rows, data, NULL};
  return REFIT_OK;
}

refit_status_t refit_place_dense_tensor(refit_kernels_dense_backend_t backend, int64_t n,
                                        int64_t k, uint8_t *weight, uint8_t *scale,
                                        refit_place_tensor_t *out) {
  REFIT_CHECK(refit_kernels_check_shape(backend, NULL, n, k));
  if (weight == NULL || scale == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "place: dense %s tensor: NULL storage",
                     refit_kernels_dense_backend_name(backend));
  int perm;
  const int64_t rows = refit_kernels_dense_rows(backend, n, &perm);
  *out = (refit_place_tensor_t){REFIT_PLACE_MXFP8, n, k, 1, perm, rows, weight, scale};
  return REFIT_OK;
}

refit_status_t refit_place_moe_tensor(const refit_kernels_moe_shape_t *s,
                                      refit_kernels_moe_tensor_t which, uint8_t *weight,
                                      uint8_t *scale, refit_place_tensor_t *out) {
  REFIT_CHECK(refit_kernels_moe_check_shape(s, NULL, NULL));
  int64_t rows, k;
  refit_kernels_perm_kind_t kind;
  if (!refit_kernels_moe_tensor_dims(s, which, &rows, &k, &kind))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "place: unknown MoE tensor %d",
                     (int)which);
  if (weight == NULL || scale == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "place: MoE %s tensor: NULL storage",
                     which == REFIT_KERNELS_MOE_W13 ? "w13" : "w2");
  *out = (refit_place_tensor_t){REFIT_PLACE_MXFP8, s->num_experts * rows, k,
                                s->num_experts,    (int)kind,
                                rows,              weight, scale};
  return REFIT_OK;
}

refit_status_t refit_place_fp8_block_tensor(int64_t matrices, int64_t rows, int64_t cols,
                                            uint8_t *weight, uint8_t *scale_inv,
                                            refit_place_tensor_t *out) {
  if (matrices < 1 || rows < 1 || cols < 1 || rows % matrices != 0 || weight == NULL ||
      scale_inv == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "place: block FP8 tensor of %lld matrices, [%lld, %lld] in all, at "
                     "%p and %p: needs a positive shape whose rows the matrices divide, "
                     "and storage",
                     (long long)matrices, (long long)rows, (long long)cols,
                     (void *)weight, (void *)scale_inv);
  *out = (refit_place_tensor_t){REFIT_PLACE_FP8_BLOCK, rows,   cols,     matrices, -1,
                                rows / matrices,       weight, scale_inv};
  return REFIT_OK;
}

/* Why a chunk of block FP8 tensor t is not whole blocks of one matrix, or
 * NULL. */
static const char *refit_place_block_rule(const refit_place_tensor_t *t, int64_t row0,
                                          int64_t col0, int64_t rows, int64_t cols) {
  const int64_t m = t->rows / t->matrices, i = row0 % m;
  if (col0 % 128 != 0 || (cols % 128 != 0 && col0 + cols != t->cols))
    return "block FP8 columns come in whole 128-column blocks (or end at the last "
           "column)";
  if (i % 128 != 0 || i + rows > m || ((i + rows) % 128 != 0 && i + rows != m))
    return "block FP8 rows come in whole 128-row blocks of one matrix (or end at its "
           "last row)";
  return NULL;
}

refit_status_t refit_place_chunk(const refit_place_tensor_t *t, int64_t row0, int64_t col0,
                                 int64_t rows, int64_t cols, refit_place_chunk_t *out) {
  const char *rule = NULL;
  if (row0 < 0 || col0 < 0 || rows < 1 || cols < 1 || row0 + rows > t->rows ||
      col0 + cols > t->cols)
    rule = "it must lie inside the tensor";
  else if (t->kind == REFIT_PLACE_MXFP8 && (col0 % 32 != 0 || cols % 32 != 0))
    rule = "MXFP8 columns come in whole blocks of 32";
  else if (t->kind == REFIT_PLACE_FP8_BLOCK)
    rule = refit_place_block_rule(t, row0, col0, rows, cols);
  if (rule != NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "place: chunk rows %lld+%lld, cols %lld+%lld of a [%lld, %lld] "
                     "tensor: %s",
                     (long long)row0, (long long)rows, (long long)col0, (long long)cols,
                     (long long)t->rows, (long long)t->cols, rule);
  const int64_t row_bytes = t->kind == REFIT_PLACE_BF16 ? 2 * cols
                            : t->kind == REFIT_PLACE_FP8_BLOCK
                                ? cols + 4 * ((cols + 127) / 128)
                                : cols + cols / 32;
  *out = (refit_place_chunk_t){t, row0, col0, rows, cols, row_bytes};
  return REFIT_OK;
}

/* ---- Deltas applied through the places --------------------------------- */

/* One chunk being applied. */
typedef struct {
  refit_place_chunk_t pc;
  int64_t rows_len;      /* bytes with a place: rows * row_bytes */
  int64_t span;          /* rows_len + the trailer */
  uint8_t old_trailer[8];
  uint8_t new_trailer[8];
  /* The digest change so far, over whole words of the rows. */
  uint64_t delta_sum;
  int64_t word;      /* the word being gathered, or -1 */
  uint8_t patch[8];  /* its new bytes where `have` says so */
  unsigned have;     /* bit b: byte b of `word` changes */
  uint64_t changed;  /* row bytes that change, repeats left out */
  uint64_t differs;  /* row bytes that differ from their place, repeats too */
  uint64_t written;
  int write;         /* the second walk: write, do not check */
  uint8_t **undo_at; /* write: where each written byte was, and its old value */
  uint8_t *undo_old;
  /* The place of the last row's first byte: a row's values (or BF16 bytes)
   * are consecutive, so most bytes cost one division. */
  int64_t row;
  uint8_t *row_at;
  /* The first byte the delta names as changed that the destination holds
   * already (a delta made against another baseline), or -1. */
  int64_t same_at;
  const char *encoding;
} refit_pd_chunk_t;

/* The place of row byte `off` (off < rows_len). */
static uint8_t *refit_pd_addr(refit_pd_chunk_t *c, int64_t off) {
  const int64_t r = off / c->pc.row_bytes, b = off - r * c->pc.row_bytes;
  const int64_t flat = c->pc.t->kind == REFIT_PLACE_BF16 ? c->pc.row_bytes : c->pc.cols;
  if (b >= flat)
    return refit_place_addr(&c->pc, off, NULL);
  if (r != c->row) {
    c->row = r;
    c->row_at = refit_place_addr(&c->pc, r * c->pc.row_bytes, NULL);
  }
  return c->row_at + b;
}

/* Word w of the rows as runtime storage holds it (the last one zero-padded,
 * as the digest pads it), read run by run. */
static uint64_t refit_pd_old_word(refit_pd_chunk_t *c, int64_t w) {
  uint8_t b[8] = {0};
  const int64_t end = 8 * w + 8 < c->rows_len ? 8 * w + 8 : c->rows_len;
  const int64_t flat = c->pc.t->kind == REFIT_PLACE_BF16 ? c->pc.row_bytes : c->pc.cols;
  if (end - 8 * w == 8 && (8 * w) % c->pc.row_bytes + 8 <= flat) {
    uint64_t v; /* the word lies in one row's consecutive bytes */
    memcpy(&v, refit_pd_addr(c, 8 * w), 8);
    return v;
  }
  for (int64_t off = 8 * w, run = 0; off < end; off += run) {
    const uint8_t *at = refit_place_addr(&c->pc, off, &run);
    run = run < end - off ? run : end - off;
    memcpy(b + (off - 8 * w), at, (size_t)run);
  }
  uint64_t v;
  memcpy(&v, b, 8);
  return v;
}

static void refit_pd_flush(refit_pd_chunk_t *c) {
  if (c->word < 0)
    return;
  const uint64_t old = refit_pd_old_word(c, c->word);
  uint8_t b[8];
  memcpy(b, &old, 8);
  for (int i = 0; i < 8; i++)
    if (c->have >> i & 1)
      b[i] = c->patch[i];
  uint64_t now;
  memcpy(&now, b, 8);
  c->delta_sum += refit_digest_term(now, (uint64_t)c->word) -
                  refit_digest_term(old, (uint64_t)c->word);
  c->word = -1;
  c->have = 0;
}

/* The walk's visit of byte `off` set to `v`; `named` when the encoding names
 * this very byte as changed (positions), so that it must differ. */
static void refit_pd_visit(refit_pd_chunk_t *c, int64_t off, uint8_t v, int named) {
  if (off >= c->rows_len) {
    if (named && c->old_trailer[off - c->rows_len] == v && c->same_at < 0)
      c->same_at = off;
    c->new_trailer[off - c->rows_len] = v;
    return;
  }
  uint8_t *at = refit_pd_addr(c, off);
  if (*at == v) {
    if (named && c->same_at < 0)
      c->same_at = off;
    return;
  }
  /* A repeat (place.h) counts in the digest, and its block row's first row
   * writes its place. */
  const int repeat = refit_place_repeat(&c->pc, off);
  if (c->write && repeat)
    return;
  if (c->write) {
    if (c->undo_at != NULL) {
      c->undo_at[c->written] = at;
      c->undo_old[c->written] = *at;
    }
    *at = v;
    c->written++;
    return;
  }
  c->changed += !repeat;
  c->differs++;
  if (off / 8 != c->word) {
    refit_pd_flush(c);
    c->word = off / 8;
  }
  c->patch[off % 8] = v;
  c->have |= 1u << (off % 8);
}

static uint32_t refit_pd_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

/* Walk the new bytes `bytes` (a delta whose shape refit_delta_info checked,
 * or the whole span when `full`). Positions must increase and lie in the
 * chunk; a marked block must change. */
static refit_status_t refit_pd_walk(refit_pd_chunk_t *c, const uint8_t *bytes, int full,
                                    const refit_delta_info_t *info) {
  if (full || info->encoding == REFIT_DELTA_DENSE) {
    const uint8_t *p = full ? bytes : bytes + REFIT_DELTA_HEADER_BYTES;
    c->encoding = full ? "whole" : "dense";
    /* Runs of consecutive places are compared and written at once. */
    for (int64_t off = 0; off < c->span;) {
      int64_t run = 1;
      if (off < c->rows_len) {
        uint8_t *at = refit_place_addr(&c->pc, off, &run);
        if (memcmp(at, p + off, (size_t)run) == 0) {
          off += run;
          continue;
        }
      }
      for (int64_t i = 0; i < run; i++)
        refit_pd_visit(c, off + i, p[off + i], 0);
      off += run;
    }
    return REFIT_OK;
  }
  const uint8_t *p = bytes + REFIT_DELTA_HEADER_BYTES;
  if (info->encoding == REFIT_DELTA_POSITIONS) {
    c->encoding = "positions";
    const uint8_t *values = p + 4 * (uint64_t)info->count;
    int64_t prev = -1;
    /* Sparse positions land far apart: the place of a later one is fetched
     * while this one is visited (memory latency, not arithmetic, is what a
     * visit costs). Only a hint: an offset out of range is not fetched. */
    enum { AHEAD = 8 };
    for (uint32_t j = 0; j < info->count; j++) {
      if (j + AHEAD < info->count) {
        const int64_t next = refit_pd_u32(p + 4 * (uint64_t)(j + AHEAD));
        if (next < c->rows_len)
          __builtin_prefetch(refit_place_addr(&c->pc, next, NULL));
      }
      const int64_t off = refit_pd_u32(p + 4 * (uint64_t)j);
      if (off >= c->span || off <= prev)
        return REFIT_ERR(REFIT_ERR_INTEGRITY,
                         "position %u at offset %lld %s", j, (long long)off,
                         off >= c->span ? "lies past the chunk"
                                        : "does not follow the one before");
      refit_pd_visit(c, off, values[j], 1);
      prev = off;
    }
    return REFIT_OK;
  }
  c->encoding = "mask";
  const int64_t nb = (c->span + REFIT_DELTA_BLOCK_BYTES - 1) / REFIT_DELTA_BLOCK_BYTES;
  const uint8_t *data = p + (nb + 7) / 8;
  for (int64_t k = 0; k < nb; k++) {
    if (!(p[k / 8] >> (k % 8) & 1))
      continue;
    const int64_t at = k * REFIT_DELTA_BLOCK_BYTES;
    const int64_t len = c->span - at < REFIT_DELTA_BLOCK_BYTES ? c->span - at
                                                               : REFIT_DELTA_BLOCK_BYTES;
    const uint64_t before = c->differs;
    int trailer_changed = 0;
    for (int64_t i = 0; i < len; i++) {
      trailer_changed |= at + i >= c->rows_len &&
                         c->old_trailer[at + i - c->rows_len] != data[i];
      refit_pd_visit(c, at + i, data[i], 0);
    }
    if (!c->write && c->differs == before && !trailer_changed && c->same_at < 0)
      c->same_at = at;
    data += len;
  }
  return REFIT_OK;
}

/* Set up the walk of chunk `c` over `bytes`: the delta's header and
 * lengths (refit_delta_info), or a whole span's length. */
static refit_status_t refit_pd_start(refit_pd_chunk_t *w, const refit_place_chunk_t *c,
                                     int trailer_bytes, uint64_t old_trailer,
                                     const void *bytes, size_t len, int full,
                                     refit_delta_info_t *info) {
  *w = (refit_pd_chunk_t){.pc = *c, .word = -1, .same_at = -1, .row = -1};
  w->rows_len = c->rows * c->row_bytes;
  w->span = w->rows_len + trailer_bytes;
  if (trailer_bytes != 0 && trailer_bytes != 8)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "place delta: a trailer of %d bytes (0 or an 8-byte digest)",
                     trailer_bytes);
  for (int b = 0; b < trailer_bytes; b++)
    w->old_trailer[b] = (uint8_t)(old_trailer >> (8 * b));
  memcpy(w->new_trailer, w->old_trailer, sizeof(w->old_trailer));
  *info = (refit_delta_info_t){0};
  if (full) {
    if (len != (size_t)w->span)
      return REFIT_ERR(REFIT_ERR_INTEGRITY, "%zu bytes for a chunk span of %lld", len,
                       (long long)w->span);
    return REFIT_OK;
  }
  REFIT_CHECK(refit_delta_info(bytes, len, info));
  if (info->chunk_bytes != (uint64_t)w->span)
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "delta: made for a chunk of %u bytes, this one has %lld",
                     info->chunk_bytes, (long long)w->span);
  return REFIT_OK;
}

refit_status_t refit_place_delta_check(const refit_place_chunk_t *c, int trailer_bytes,
                                       uint64_t old_sum, uint64_t old_trailer,
                                       const void *bytes, size_t len, int full,
                                       refit_place_delta_t *out) {
  refit_pd_chunk_t w;
  refit_delta_info_t info;
  REFIT_CHECK(refit_pd_start(&w, c, trailer_bytes, old_trailer, bytes, len, full, &info));
  REFIT_CHECK(refit_pd_walk(&w, bytes, full, &info));
  refit_pd_flush(&w);
  if (w.same_at >= 0)
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "its %s delta names byte %lld as changed, but the destination "
                     "holds that already: the delta was not made against these bytes",
                     w.encoding, (long long)w.same_at);
  out->changed = w.changed;
  out->sum = old_sum + w.delta_sum;
  out->trailer = trailer_bytes == 8 ? refit_trailer_load(w.new_trailer) : 0;
  out->encoding = w.encoding;
  return REFIT_OK;
}

refit_status_t refit_place_delta_write(const refit_place_chunk_t *c, int trailer_bytes,
                                       const void *bytes, size_t len, int full,
                                       uint8_t **undo_at, uint8_t *undo_old,
                                       uint64_t *written) {
  refit_pd_chunk_t w;
  refit_delta_info_t info;
  REFIT_CHECK(refit_pd_start(&w, c, trailer_bytes, 0, bytes, len, full, &info));
  w.write = 1;
  w.undo_at = undo_at;
  w.undo_old = undo_old;
  REFIT_CHECK(refit_pd_walk(&w, bytes, full, &info));
  *written = w.written;
  return REFIT_OK;
}
