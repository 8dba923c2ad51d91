/*
 * Random pack/land scenarios for the data-path tests (host and GPU): a source
 * arena holding trainer rows, a wire buffer, and a destination arena, with one
 * pack and one land descriptor per chunk. Descriptors hold arena offsets in
 * their pointer fields until dps_bind() turns them into pointers into real
 * (host or device) arenas, so one scenario serves both sides.
 *
 * Chunk kinds: COPY -> COPY (any row_bytes, odd ones too, pitched or
 * contiguous, some over the 8 KiB tile), QUANTIZE -> SPLIT (BF16 rows
 * quantized on pack, values and scales split on land) and COPY -> QUANTIZE
 * (BF16 on the wire, quantized on land). Offsets in every arena are
 * deliberately misaligned at random; a chunk may have rows = 1 or, rarely, 0.
 * dps_create_aligned instead keeps every offset, pitch and row 8- or 16-byte
 * aligned and cols a multiple of 256, the cases in which the CUDA twins sum
 * digests from the registers they copy (kernels/datapath_cuda.h).
 */
#ifndef REFIT_TESTS_KERNELS_DATAPATH_SCENARIO_H
#define REFIT_TESTS_KERNELS_DATAPATH_SCENARIO_H

#include "kernels/datapath.h"
#include "kernels_test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { DPS_COPY = 0, DPS_QUANT_SPLIT = 1, DPS_COPY_QUANT = 2 };

typedef struct {
  int64_t n;
  int *kind;
  refit_pack_desc_t *pack; /* src: offset into the source arena */
  refit_land_desc_t *land; /* dst, scale: offsets into the dst arena */
  uint8_t *src;            /* host source arena */
  int64_t src_bytes, wire_bytes, dst_bytes;
} dps_t;

/* Offset rounded up to 16 plus a random misalignment (none half the time);
 * with `aligned`, plus 8 or nothing. */
static inline int64_t dps_place(int64_t *used, int64_t bytes, int aligned) {
  int64_t at = (*used + 15) / 16 * 16;
  if (kt_rand() & 1)
    at += aligned ? 8 : kt_rand_range(0, 15);
  *used = at + bytes;
  return at;
}

/* A pitch for rows of `width` bytes: the width or a little more (with
 * `aligned`, by a multiple of 8, from a width that is one too). */
static inline int64_t dps_pitch(int64_t width, int64_t more, int aligned) {
  if (kt_rand() & 1)
    return width;
  return aligned ? width + 8 * kt_rand_range(1, 4) : width + more;
}

/* The refit tag the scenario's digests are sealed with (drawn by
 * dps_create_aligned; the tests pack and land with it unless they mean a
 * chunk of another refit). */
static uint64_t dps_tag;

static inline void dps_create_aligned(dps_t *s, int64_t n, int digest_mode,
                                      int aligned) {
  memset(s, 0, sizeof(*s));
  dps_tag = kt_rand();
  s->n = n;
  s->kind = calloc((size_t)n, sizeof(int));
  s->pack = calloc((size_t)n, sizeof(refit_pack_desc_t));
  s->land = calloc((size_t)n, sizeof(refit_land_desc_t));
  int64_t src_used = 0, wire_used = 0, dst_used = 0;
  for (int64_t i = 0; i < n; i++) {
    refit_pack_desc_t *p = &s->pack[i];
    refit_land_desc_t *l = &s->land[i];
    const int kind = (int)kt_rand_range(0, 2);
    int64_t rows = kt_rand_range(1, 3) == 1 ? 1 : kt_rand_range(2, 40);
    if (kt_rand_range(0, 40) == 0)
      rows = 0;
    const int digest = digest_mode == 2 ? (int)(kt_rand() & 1) : digest_mode;
    int64_t cols = 0, row_bytes, src_row, src_pitch;
    if (kind == DPS_COPY) {
      row_bytes = kt_rand_range(1, 4) == 1 ? kt_rand_range(8193, 30000)
                                           : kt_rand_range(1, 3000);
      if (aligned)
        row_bytes = (row_bytes + 7) / 8 * 8;
      src_row = row_bytes;
    } else {
      cols = aligned ? 256 * kt_rand_range(1, 8) : 32 * kt_rand_range(1, 12);
      src_row = 2 * cols;
      row_bytes = kind == DPS_QUANT_SPLIT ? cols + cols / 32 : 2 * cols;
    }
    src_pitch = dps_pitch(src_row, kt_rand_range(1, 40), aligned);
    if (kind != DPS_COPY && (kt_rand() & 1))
      src_pitch = src_row + 2 * kt_rand_range(0, 8); /* even: the direct path */
    p->src = (void *)(intptr_t)dps_place(
        &src_used, rows > 0 ? (rows - 1) * src_pitch + src_row : 0, aligned);
    p->src_pitch = src_pitch;
    p->dst_offset =
        dps_place(&wire_used, rows * row_bytes + (digest ? 8 : 0), aligned);
    p->rows = rows;
    p->cols = cols;
    p->row_bytes = row_bytes;
    p->op = kind == DPS_QUANT_SPLIT ? REFIT_CHUNK_QUANTIZE : REFIT_CHUNK_COPY;
    p->digest = digest;
    l->src_offset = p->dst_offset;
    l->rows = rows;
    l->cols = cols;
    l->row_bytes = row_bytes;
    l->op = kind == DPS_COPY          ? REFIT_CHUNK_COPY
            : kind == DPS_QUANT_SPLIT ? REFIT_CHUNK_SPLIT
                                      : REFIT_CHUNK_QUANTIZE;
    l->digest = digest;
    p->seal_key = l->seal_key = kt_rand(); /* the chunk's key: any value */
    const int64_t width = kind == DPS_COPY ? row_bytes : cols;
    l->dst_pitch = dps_pitch(width, kt_rand_range(1, 40), aligned);
    l->dst = (void *)(intptr_t)dps_place(
        &dst_used, rows > 0 ? (rows - 1) * l->dst_pitch + width : 0, aligned);
    if (kind != DPS_COPY) {
      l->scale_pitch = dps_pitch(cols / 32, kt_rand_range(1, 9), aligned);
      l->scale = (void *)(intptr_t)dps_place(
          &dst_used, rows > 0 ? (rows - 1) * l->scale_pitch + cols / 32 : 0,
          aligned);
    }
    s->kind[i] = kind;
  }
  s->src_bytes = src_used + 16;
  s->wire_bytes = wire_used + 16;
  s->dst_bytes = dst_used + 16;
  s->src = calloc((size_t)s->src_bytes, 1);
  kt_fill_bytes(s->src, (size_t)s->src_bytes);
  /* BF16 sources get realistic values (random bytes make NaN-heavy blocks). */
  for (int64_t i = 0; i < n; i++) {
    if (s->kind[i] == DPS_COPY)
      continue;
    const refit_pack_desc_t *p = &s->pack[i];
    for (int64_t r = 0; r < p->rows; r++) {
      uint8_t *row = s->src + (intptr_t)p->src + r * p->src_pitch;
      for (int64_t c = 0; c < p->cols; c++) {
        const uint16_t v = kt_rand_bf16();
        row[2 * c] = (uint8_t)v;
        row[2 * c + 1] = (uint8_t)(v >> 8);
      }
    }
  }
}

static inline void dps_create(dps_t *s, int64_t n, int digest_mode) {
  dps_create_aligned(s, n, digest_mode, 0);
}

/*
 * Whether chunk i landed the same bytes into arenas a and b (values and, for
 * a quantizing chunk, scales; land is bound to arena base, as dps_bind makes
 * it). The gaps between rows are not the chunk's.
 */
static inline int dps_chunk_same(const dps_t *s, const refit_land_desc_t *land,
                                 int64_t i, const uint8_t *base,
                                 const uint8_t *a, const uint8_t *b) {
  const refit_land_desc_t *l = &land[i];
  const int64_t width = s->kind[i] == DPS_COPY ? l->row_bytes : l->cols;
  const int64_t off = (const uint8_t *)l->dst - base,
                soff = (const uint8_t *)l->scale - base;
  for (int64_t r = 0; r < l->rows; r++) {
    if (memcmp(a + off + r * l->dst_pitch, b + off + r * l->dst_pitch,
               (size_t)width) != 0)
      return 0;
    if (s->kind[i] != DPS_COPY &&
        memcmp(a + soff + r * l->scale_pitch, b + soff + r * l->scale_pitch,
               (size_t)l->cols / 32) != 0)
      return 0;
  }
  return 1;
}

/* Descriptors with pointers into real arenas (host or device). */
static inline void dps_bind(const dps_t *s, void *src, void *dst,
                            refit_pack_desc_t *pack, refit_land_desc_t *land) {
  for (int64_t i = 0; i < s->n; i++) {
    pack[i] = s->pack[i];
    pack[i].src = (uint8_t *)src + (intptr_t)s->pack[i].src;
    land[i] = s->land[i];
    land[i].dst = (uint8_t *)dst + (intptr_t)s->land[i].dst;
    land[i].scale = s->land[i].scale == NULL && s->kind[i] == DPS_COPY
                        ? NULL
                        : (uint8_t *)dst + (intptr_t)s->land[i].scale;
  }
}

static inline void dps_destroy(dps_t *s) {
  free(s->kind);
  free(s->pack);
  free(s->land);
  free(s->src);
  memset(s, 0, sizeof(*s));
}

#endif /* REFIT_TESTS_KERNELS_DATAPATH_SCENARIO_H */
