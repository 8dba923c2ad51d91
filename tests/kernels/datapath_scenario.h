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

/* Offset rounded up to 16 plus a random misalignment (none half the time). */
static inline int64_t dps_place(int64_t *used, int64_t bytes) {
  int64_t at = (*used + 15) / 16 * 16;
  if (kt_rand() & 1)
    at += kt_rand_range(0, 15);
  *used = at + bytes;
  return at;
}

static inline void dps_create(dps_t *s, int64_t n, int digest_mode) {
  memset(s, 0, sizeof(*s));
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
      src_row = row_bytes;
    } else {
      cols = 32 * kt_rand_range(1, 12);
      src_row = 2 * cols;
      row_bytes = kind == DPS_QUANT_SPLIT ? cols + cols / 32 : 2 * cols;
    }
    src_pitch = (kt_rand() & 1) ? src_row : src_row + kt_rand_range(1, 40);
    if (kind != DPS_COPY && (kt_rand() & 1))
      src_pitch = src_row + 2 * kt_rand_range(0, 8); /* even: the direct path */
    p->src = (void *)(intptr_t)dps_place(
        &src_used, rows > 0 ? (rows - 1) * src_pitch + src_row : 0);
    p->src_pitch = src_pitch;
    p->dst_offset = dps_place(&wire_used, rows * row_bytes + (digest ? 8 : 0));
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
    const int64_t width = kind == DPS_COPY ? row_bytes : cols;
    l->dst_pitch = (kt_rand() & 1) ? width : width + kt_rand_range(1, 40);
    l->dst = (void *)(intptr_t)dps_place(
        &dst_used, rows > 0 ? (rows - 1) * l->dst_pitch + width : 0);
    if (kind != DPS_COPY) {
      l->scale_pitch =
          (kt_rand() & 1) ? cols / 32 : cols / 32 + kt_rand_range(1, 9);
      l->scale = (void *)(intptr_t)dps_place(
          &dst_used, rows > 0 ? (rows - 1) * l->scale_pitch + cols / 32 : 0);
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
