/*
 * The zero-copy data path, C reference (contract in kernels/direct.h).
 */
#include "kernels/direct.h"

#include "core/digest.h"
#include "core/error.h"
#include "kernels/fp8_block.h"
#include "kernels/layout.h"
#include "kernels/mxfp8.h"

#include <string.h>

static int64_t refit_direct_row(const refit_direct_desc_t *d, int64_t i) {
  return d->perm < 0 ? i
                     : refit_kernels_perm_inverse_index(
                           (refit_kernels_perm_kind_t)d->perm, d->perm_rows, i);
}

/* Bytes of one row as the digest reads it: a BF16 row, or a prequantized
 * MXFP8 row (SPLIT). */
static int64_t refit_direct_row_bytes(const refit_direct_desc_t *d) {
  return d->op == REFIT_DIRECT_SPLIT ? d->cols + d->cols / 32 : 2 * d->cols;
}

/* Where d's rows are: in place, or in the call's buffer (staged). */
static const unsigned char *refit_direct_src(const refit_direct_desc_t *d,
                                             const unsigned char *buf) {
  return d->staged ? buf + d->src_offset : (const unsigned char *)d->src;
}

static int refit_direct_padded_row(const refit_direct_desc_t *d, int64_t j) {
  if (j >= d->perm_rows)
    return 1;
  return d->perm >= 0 && refit_kernels_perm_index((refit_kernels_perm_kind_t)d->perm,
                                                  d->perm_rows, j) >= d->group_rows;
}

refit_status_t refit_direct_descs_check(const refit_direct_desc_t *descs, int64_t n) {
  if (n < 0 || (n > 0 && descs == NULL))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "direct table: %lld descriptors at %p",
                     (long long)n, (const void *)descs);
  for (int64_t i = 0; i < n; i++) {
    const refit_direct_desc_t *d = &descs[i];
    const char *rule = NULL;
    const int reads = d->op != REFIT_DIRECT_PAD;
    const int places = d->op == REFIT_DIRECT_QUANTIZE || d->op == REFIT_DIRECT_SPLIT;
    const int block = d->op == REFIT_DIRECT_BLOCK_QUANTIZE;
    if (d->op < REFIT_DIRECT_COPY || d->op > REFIT_DIRECT_BLOCK_QUANTIZE)
      rule = "op is COPY, QUANTIZE, DIGEST, PAD, SPLIT or BLOCK_QUANTIZE";
    else if (d->rows < 0 || d->cols < 0)
      rule = "rows and cols >= 0";
    else if (d->digest != 0 && d->digest != 1)
      rule = "digest is 0 or 1";
    else if (!reads && d->digest)
      rule = "PAD has no digest";
    else if (d->staged != 0 &&
             (d->staged != 1 || !(d->op == REFIT_DIRECT_COPY || places)))
      rule = "staged is 0, or 1 for COPY, QUANTIZE and SPLIT";
    else if (block && d->staged)
      rule = "BLOCK_QUANTIZE reads its rows in place (staged 0)";
    else if (block && d->rows > 0 && d->cols > 0 &&
             (d->dst == NULL || d->scale == NULL ||
              (d->rows > 1 && d->dst_pitch < d->cols) ||
              (d->rows > REFIT_FP8_BLOCK &&
               d->scale_pitch < 4 * refit_fp8_block_count(d->cols)) ||
              (d->fp8_scale != REFIT_FP8_SCALE_FP32 &&
               d->fp8_scale != REFIT_FP8_SCALE_POW2)))
      rule = "BLOCK_QUANTIZE: dst and scale set, dst_pitch >= cols, scale_pitch >= 4 * "
             "ceil(cols / 128), fp8_scale 0 or 1";
    else if (d->staged && d->src_offset < 0)
      rule = "staged: src_offset >= 0";
    else if (reads && !d->staged && d->rows > 0 && d->cols > 0 && d->src == NULL)
      rule = "src is set";
    else if (reads && d->rows > 1 && d->src_pitch < refit_direct_row_bytes(d))
      rule = "src_pitch >= the row bytes (2 * cols; cols + cols / 32 for SPLIT)";
    else if (d->op == REFIT_DIRECT_COPY && d->rows > 0 && d->cols > 0 &&
             (d->dst == NULL || (d->rows > 1 && d->dst_pitch < 2 * d->cols)))
      rule = "COPY: dst is set and dst_pitch >= 2 * cols";
    else if ((places || d->op == REFIT_DIRECT_PAD) &&
             (d->dst == NULL || d->scale == NULL))
      rule = "QUANTIZE, SPLIT and PAD: dst and scale are set";
    else if ((places || d->op == REFIT_DIRECT_PAD) &&
             (d->k <= 0 || d->k % 32 != 0 || d->group_rows < 1 ||
              d->perm_rows < d->group_rows ||
              (d->perm < 0 && d->perm_rows != d->group_rows) ||
              d->perm > REFIT_KERNELS_PERM_SRC13 ||
              (d->perm >= 0 &&
               d->perm_rows % (d->perm == REFIT_KERNELS_PERM_SRC13 ? 64 : 32) != 0)))
      rule =
          "QUANTIZE, SPLIT and PAD: k a positive multiple of 32, group_rows >= 1, "
          "perm_rows >= group_rows (equal without perm), perm_rows a multiple of 32 (64 "
          "for src13) with perm";
    else if (places && (d->cols % 32 != 0 || d->col0 < 0 || d->col0 % 32 != 0 ||
                        d->col0 + d->cols > d->k || d->row0 < 0))
      rule = "QUANTIZE and SPLIT: cols and col0 multiples of 32, col0 + cols <= k, row0 "
             ">= 0";
    else if (places &&
             (d->rows * (d->cols / 32) > UINT32_MAX || d->row0 + d->rows > UINT32_MAX ||
              d->rows * refit_direct_row_bytes(d) > UINT32_MAX))
      rule = "QUANTIZE and SPLIT: fewer than 2^32 blocks, rows and row bytes (the device "
             "indexes them in 32 bits)";
    else if (d->digest &&
             (d->digest_offset < 0 || (!d->staged && d->digest_offset % 8 != 0)))
      rule = "digest_offset >= 0, and a multiple of 8 unless staged";
    if (rule != NULL)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "direct descriptor %lld (op %d): %s",
                       (long long)i, (int)d->op, rule);
  }
  return REFIT_OK;
}

/* The sealed digest of d's rows (src), as rows * row bytes back to back. */
static uint64_t refit_direct_digest(const refit_direct_desc_t *d,
                                    const unsigned char *src, uint64_t tag) {
  const int64_t row_bytes = refit_direct_row_bytes(d), len = d->rows * row_bytes;
  uint64_t sum = (uint64_t)len * REFIT_DIGEST_P1;
  unsigned char word[8];
  int fill = 0;
  uint64_t index = 0;
  for (int64_t r = 0; r < d->rows; r++)
    for (int64_t b = 0; b < row_bytes; b++) {
      word[fill++] = src[r * d->src_pitch + b];
      if (fill == 8) {
        uint64_t w;
        memcpy(&w, word, 8);
        sum += refit_digest_term(w, index++);
        fill = 0;
      }
    }
  if (fill > 0) {
    uint64_t w = 0;
    memcpy(&w, word, (size_t)fill);
    sum += refit_digest_term(w, index);
  }
  return sum + refit_seal(d->seal_key, tag);
}

/* QUANTIZE and SPLIT: each block of d's rows (src) at its place in the
 * layout, quantized from BF16 or split from a prequantized row. */
static void refit_direct_place(const refit_direct_desc_t *d, const unsigned char *src) {
  const int64_t kp = refit_round_up(d->k / 32, 4);
  uint8_t *values = d->dst, *scales = d->scale;
  for (int64_t r = 0; r < d->rows; r++) {
    const int64_t R = d->row0 + r, e = R / d->group_rows;
    const int64_t j = refit_direct_row(d, R % d->group_rows);
    const unsigned char *row = src + r * d->src_pitch;
    uint8_t *q = values + e * d->value_group_bytes + j * d->k;
    uint8_t *s = scales + e * d->scale_group_bytes;
    for (int64_t c = 0; c < d->cols; c += 32) {
      const int64_t C = d->col0 + c;
      uint8_t *scale = &s[refit_kernels_swizzle_offset(j, C / 32, kp)];
      if (d->op == REFIT_DIRECT_SPLIT) {
        memcpy(q + C, row + c, 32);
        *scale = row[d->cols + c / 32];
      } else {
        uint16_t block[32]; /* staged rows may lie at any alignment */
        memcpy(block, row + 2 * c, sizeof(block));
        *scale = refit_mxfp8_quantize_block(block, q + C);
      }
    }
  }
}

static void refit_direct_pad(const refit_direct_desc_t *d) {
  const int64_t kb = d->k / 32, kp = refit_round_up(kb, 4);
  const int64_t srows = refit_round_up(d->perm_rows, 128);
  for (int64_t e = 0; e < d->rows; e++) {
    uint8_t *values = (uint8_t *)d->dst + e * d->value_group_bytes;
    uint8_t *scales = (uint8_t *)d->scale + e * d->scale_group_bytes;
    for (int64_t j = 0; j < d->perm_rows; j++)
      if (refit_direct_padded_row(d, j))
        memset(values + j * d->k, 0, (size_t)d->k);
    for (int64_t j = 0; j < srows; j++) {
      const int padded = refit_direct_padded_row(d, j);
      for (int64_t c = 0; c < kp; c++)
        if (padded || c >= kb)
          scales[refit_kernels_swizzle_offset(j, c, kp)] = 0;
    }
  }
}

int64_t refit_direct_number_blocks(refit_direct_desc_t *descs, int64_t n) {
  int64_t total = 0;
  for (int64_t i = 0; i < n; i++) {
    descs[i].block0 = total;
    if (descs[i].op == REFIT_DIRECT_BLOCK_QUANTIZE && descs[i].rows > 0 &&
        descs[i].cols > 0)
      total +=
          refit_fp8_block_count(descs[i].rows) * refit_fp8_block_count(descs[i].cols);
  }
  return total;
}

refit_status_t refit_direct_rows(const refit_direct_desc_t *descs, int64_t n,
                                 uint64_t tag, void *digests, int64_t *bad_chunk) {
  REFIT_CHECK(refit_direct_descs_check(descs, n));
  for (int64_t i = 0; i < n; i++)
    if ((descs[i].digest || descs[i].staged) && digests == NULL)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "direct descriptor %lld: a digest or staged rows, and no buffer",
                       (long long)i);
  int64_t bad = -1;
  unsigned char *dig = digests;
  for (int64_t i = 0; i < n; i++) {
    const refit_direct_desc_t *d = &descs[i];
    if (d->op == REFIT_DIRECT_PAD) {
      refit_direct_pad(d);
      continue;
    }
    const unsigned char *src = refit_direct_src(d, dig);
    if (d->op == REFIT_DIRECT_COPY)
      for (int64_t r = 0; r < d->rows; r++)
        memcpy((unsigned char *)d->dst + r * d->dst_pitch, src + r * d->src_pitch,
               (size_t)(2 * d->cols));
    else if (d->op == REFIT_DIRECT_QUANTIZE || d->op == REFIT_DIRECT_SPLIT)
      refit_direct_place(d, src);
    else if (d->op == REFIT_DIRECT_BLOCK_QUANTIZE && d->rows > 0 && d->cols > 0)
      REFIT_CHECK(refit_fp8_block_quantize(
          (const uint16_t *)(const void *)src, d->rows, d->cols,
          d->rows > 1 ? d->src_pitch / 2 : d->cols, (refit_fp8_scale_t)d->fp8_scale,
          d->dst, d->rows > 1 ? d->dst_pitch : d->cols, d->scale,
          d->rows > REFIT_FP8_BLOCK ? d->scale_pitch / 4
                                    : refit_fp8_block_count(d->cols)));
    if (!d->digest)
      continue;
    const uint64_t v = refit_direct_digest(d, src, tag);
    if (d->op == REFIT_DIRECT_DIGEST) {
      for (int b = 0; b < 8; b++)
        dig[d->digest_offset + b] = (unsigned char)(v >> (8 * b));
    } else if (bad < 0 && refit_trailer_load(dig + d->digest_offset) != v) {
      bad = i;
    }
  }
  if (bad_chunk != NULL)
    *bad_chunk = bad;
  return REFIT_OK;
}
