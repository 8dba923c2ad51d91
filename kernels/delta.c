/*
 * Delta codec, C reference (kernels/delta.h states the format).
 *
 * Encode: one pass compares the chunks 32 bytes at a time (four 64-bit
 * words) and marks changed blocks in a bitmap, counting their changed bytes
 * and, under auto, writing the positions as it goes while they may pay; the
 * encoding is chosen from the counts, and a second pass visits only the
 * marked blocks (the mask, or positions the first pass stopped writing).
 * Decode: a checking pass over the delta (and the bytes of the destination
 * it names), then the writes.
 */
#include "kernels/delta.h"

#include "core/error.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK REFIT_DELTA_BLOCK_BYTES

/* The encoder finds a word's changed bytes from the bits of a 64-bit load. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kernels/delta.c: the delta codec's C reference assumes a little-endian host"
#endif

const char *refit_delta_encoding_name(refit_delta_encoding_t e) {
  static const char *const names[] = {"auto", "positions", "mask", "dense"};
  return (unsigned)e < REFIT_DELTA_ENCODINGS ? names[e] : "?";
}

static uint32_t load_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

static void store_u32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static uint64_t load_u64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}

/* The top bit of each nonzero byte of x. */
static uint64_t nonzero_flags(uint64_t x) {
  const uint64_t low7 = UINT64_C(0x7f7f7f7f7f7f7f7f);
  return (((x & low7) + low7) | x) & ~low7;
}

/* Nonzero bytes of x. */
static unsigned nonzero_bytes(uint64_t x) {
  /* The sum of the bytes' flags, in the top byte. */
  return (unsigned)(((nonzero_flags(x) >> 7) * UINT64_C(0x0101010101010101)) >> 56);
}

static unsigned popcount8(uint8_t b) {
  unsigned n = 0;
  for (; b != 0; b &= (uint8_t)(b - 1))
    n++;
  return n;
}

static uint64_t blocks_of(uint64_t bytes) { return (bytes + BLOCK - 1) / BLOCK; }
static uint64_t mask_bytes_of(uint64_t bytes) { return (blocks_of(bytes) + 7) / 8; }

static uint64_t block_len(uint64_t bytes, uint64_t b) {
  const uint64_t rest = bytes - b * BLOCK;
  return rest < BLOCK ? rest : BLOCK;
}

/* The first block at or after k that `mask` marks, or nb: zero bytes of the
 * mask are skipped whole, so sparse masks cost about nb / 8 byte loads. */
static uint64_t next_marked(const uint8_t *mask, uint64_t nb, uint64_t k) {
  while (k < nb) {
    const unsigned bits = mask[k / 8] >> (k % 8);
    if (bits == 0) {
      k = (k / 8 + 1) * 8;
      continue;
    }
    unsigned skip = 0;
    while (!(bits >> skip & 1))
      skip++;
    return k + skip < nb ? k + skip : nb;
  }
  return nb;
}

/* Positions written while the chunk is compared (refit_delta_encode under
 * REFIT_DELTA_AUTO with room for any choice): offsets from `offsets`, values
 * from `values`, at most `room` of each. `stop` ends the writing where
 * positions will not pay (scan): a dense chunk is then compared at full
 * speed, and positions, if chosen after all, come from a second pass. */
typedef struct {
  uint8_t *offsets, *values;
  uint64_t room, n;
  int stop;
} emit_t;

/* Position i of the chunk, with its new byte v. */
static inline void emit(emit_t *em, uint64_t i, uint8_t v) {
  if (em->n < em->room) {
    store_u32(em->offsets + 4 * em->n, (uint32_t)i);
    em->values[em->n] = v;
  }
  em->n++;
}

/* The changed bytes of word w (x = new ^ base there), lowest first: byte i
 * of memory is bits 8i..8i+7 of a little-endian load, so a changed byte
 * costs no mispredicted branch of its own. */
static inline void emit_word(emit_t *em, uint64_t w, uint64_t x, const uint8_t *a) {
  for (uint64_t f = nonzero_flags(x); f != 0; f &= f - 1) {
    const uint64_t i = w + (uint64_t)__builtin_ctzll(f) / 8;
    emit(em, i, a[i]);
  }
}

/* The changed words of a whole block, lowest first. */
static void emit_block(emit_t *em, uint64_t at, const uint64_t x[4], const uint8_t *a) {
  for (int j = 0; j < 4; j++)
    emit_word(em, at + 8 * (uint64_t)j, x[j], a);
}

/* Changed bytes of the block at `at` (len <= 32), emitted when em != NULL.
 * Inlined into the comparison loop, where an unchanged block must cost only
 * its loads. */
static inline __attribute__((always_inline)) unsigned
block_changes(const uint8_t *a, const uint8_t *b, uint64_t at, uint64_t len, emit_t *em) {
  if (len == BLOCK) {
    uint64_t x[4];
    for (int j = 0; j < 4; j++)
      x[j] = load_u64(a + at + 8 * j) ^ load_u64(b + at + 8 * j);
    if ((x[0] | x[1] | x[2] | x[3]) == 0)
      return 0;
    if (em != NULL && !em->stop)
      emit_block(em, at, x, a);
    return nonzero_bytes(x[0]) + nonzero_bytes(x[1]) + nonzero_bytes(x[2]) +
           nonzero_bytes(x[3]);
  }
  unsigned n = 0;
  for (uint64_t i = at; i < at + len; i++)
    if (a[i] != b[i]) {
      n++;
      if (em != NULL && !em->stop)
        emit(em, i, a[i]);
    }
  return n;
}

static refit_status_t check_chunk(const void *new_bytes, const void *base, size_t bytes) {
  if (bytes > UINT32_MAX)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "delta: a chunk of %zu bytes; at most %" PRIu32
                     " (the caller splits larger ones)",
                     bytes, UINT32_MAX);
  if (bytes > 0 && (new_bytes == NULL || base == NULL))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "delta: NULL %s for a chunk of %zu bytes",
                     new_bytes == NULL ? "new bytes" : "baseline", bytes);
  return REFIT_OK;
}

/* The comparison pass: counts into *st, changed blocks into `bitmap`
 * (mask_bytes_of(bytes), zeroed here) unless NULL, positions into `em`
 * unless NULL. */
static void scan(const uint8_t *a, const uint8_t *b, uint64_t bytes, uint8_t *bitmap,
                 refit_delta_stats_t *st, emit_t *em) {
  uint64_t changed = 0, blocks = 0, block_bytes = 0;
  const uint64_t nb = blocks_of(bytes);
  if (bitmap != NULL)
    memset(bitmap, 0, mask_bytes_of(bytes));
  for (uint64_t k = 0; k < nb; k++) {
    const uint64_t len = block_len(bytes, k);
    const unsigned n = block_changes(a, b, k * BLOCK, len, em);
    if (n == 0)
      continue;
    changed += n;
    blocks++;
    block_bytes += len;
    /* Positions have taken more than a mask of the blocks compared so far
     * (with some slack for a stretch of dense changes in a sparse chunk),
     * so the mask or dense will most likely be chosen. */
    if (em != NULL && !em->stop &&
        (em->n > em->room || 5 * em->n > (k + 8) / 8 + block_bytes + 4096))
      em->stop = 1;
    if (bitmap != NULL)
      bitmap[k / 8] |= (uint8_t)(1u << (k % 8));
  }
  st->changed_bytes = changed;
  st->changed_blocks = blocks;
  st->size[REFIT_DELTA_POSITIONS] = REFIT_DELTA_HEADER_BYTES + 5 * changed;
  st->size[REFIT_DELTA_MASK] =
      REFIT_DELTA_HEADER_BYTES + mask_bytes_of(bytes) + block_bytes;
  st->size[REFIT_DELTA_DENSE] = REFIT_DELTA_HEADER_BYTES + bytes;
  /* Ties go to the faster to apply: dense, then mask. */
  refit_delta_encoding_t best = REFIT_DELTA_DENSE;
  if (st->size[REFIT_DELTA_MASK] < st->size[best])
    best = REFIT_DELTA_MASK;
  if (st->size[REFIT_DELTA_POSITIONS] < st->size[best])
    best = REFIT_DELTA_POSITIONS;
  st->best = best;
  st->size[REFIT_DELTA_AUTO] = st->size[best];
}

refit_status_t refit_delta_measure(const void *new_bytes, const void *base, size_t bytes,
                                   refit_delta_stats_t *out) {
  REFIT_CHECK(check_chunk(new_bytes, base, bytes));
  if (out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "delta measure: NULL stats");
  scan(new_bytes, base, bytes, NULL, out, NULL);
  return REFIT_OK;
}

refit_status_t refit_delta_encode(const void *new_bytes, const void *base, size_t bytes,
                                  refit_delta_encoding_t encoding, void *out, size_t cap,
                                  size_t *out_len, refit_delta_stats_t *stats) {
  REFIT_CHECK(check_chunk(new_bytes, base, bytes));
  if ((unsigned)encoding >= REFIT_DELTA_ENCODINGS)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "delta encode: encoding %d is none of auto (0), positions (1), "
                     "mask (2), dense (3)",
                     (int)encoding);
  if (out == NULL || out_len == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "delta encode: NULL %s",
                     out == NULL ? "output" : "output length");
  const uint8_t *a = new_bytes, *b = base;
  const uint64_t mb = mask_bytes_of(bytes);
  uint8_t *bitmap = malloc(mb > 0 ? mb : 1);
  if (bitmap == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "delta encode: a %" PRIu64 "-byte block bitmap",
                     mb);
  /* With room for whatever is chosen (so that out is written only when
   * the encode succeeds), positions are written during the comparison:
   * offsets where they belong, values after room for as many offsets as
   * could pay (positions stop paying above bytes / 5 changed bytes), moved
   * behind the offsets if positions are chosen. Else a second pass. */
  uint8_t *p = (uint8_t *)out + REFIT_DELTA_HEADER_BYTES;
  emit_t em = {p, p + 4 * (bytes / 5), bytes / 5, 0, 0}, *emp = NULL;
  if (encoding == REFIT_DELTA_AUTO && cap >= refit_delta_bound(bytes))
    emp = &em;
  refit_delta_stats_t st;
  scan(a, b, bytes, bitmap, &st, emp);
  const refit_delta_encoding_t e = encoding == REFIT_DELTA_AUTO ? st.best : encoding;
  if (st.size[e] > cap) {
    free(bitmap);
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "delta encode: the %s encoding of a %zu-byte chunk takes %" PRIu64
                     " bytes, the output holds %zu",
                     refit_delta_encoding_name(e), bytes, st.size[e], cap);
  }
  uint8_t *o = out;
  store_u32(o, REFIT_DELTA_MAGIC);
  o[4] = (uint8_t)e;
  o[5] = o[6] = o[7] = 0;
  store_u32(o + 8, (uint32_t)bytes);
  const uint64_t nb = blocks_of(bytes);
  if (e == REFIT_DELTA_POSITIONS && emp != NULL && !em.stop) {
    store_u32(o + 12, (uint32_t)st.changed_bytes);
    memmove(p + 4 * st.changed_bytes, em.values, st.changed_bytes);
  } else if (e == REFIT_DELTA_POSITIONS) { /* the second pass: marked blocks only */
    store_u32(o + 12, (uint32_t)st.changed_bytes);
    emit_t em2 = {p, p + 4 * st.changed_bytes, st.changed_bytes, 0, 0};
    for (uint64_t k = next_marked(bitmap, nb, 0); k < nb;
         k = next_marked(bitmap, nb, k + 1))
      (void)block_changes(a, b, k * BLOCK, block_len(bytes, k), &em2);
  } else if (e == REFIT_DELTA_MASK) {
    store_u32(o + 12, (uint32_t)st.changed_blocks);
    memcpy(p, bitmap, mb);
    p += mb;
    for (uint64_t k = next_marked(bitmap, nb, 0); k < nb;
         k = next_marked(bitmap, nb, k + 1)) {
      const uint64_t len = block_len(bytes, k);
      memcpy(p, a + k * BLOCK, len);
      p += len;
    }
  } else {
    store_u32(o + 12, 0);
    if (bytes > 0)
      memcpy(p, a, bytes);
  }
  free(bitmap);
  *out_len = st.size[e];
  if (stats != NULL)
    *stats = st;
  return REFIT_OK;
}

refit_status_t refit_delta_info(const void *delta, size_t delta_len,
                                refit_delta_info_t *out) {
  const uint8_t *d = delta;
  if (delta == NULL || out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "delta: NULL %s",
                     delta == NULL ? "delta" : "info");
  if (delta_len < REFIT_DELTA_HEADER_BYTES)
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "delta: %zu bytes, shorter than its %d-byte header", delta_len,
                     REFIT_DELTA_HEADER_BYTES);
  const uint32_t magic = load_u32(d);
  if (magic != REFIT_DELTA_MAGIC)
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "delta: magic 0x%08" PRIx32 ", expected 0x%08" PRIx32
                     " (\"RFD1\"): not a delta",
                     magic, REFIT_DELTA_MAGIC);
  const unsigned e = d[4];
  if (e < REFIT_DELTA_POSITIONS || e > REFIT_DELTA_DENSE)
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "delta: encoding %u is none of positions (1), mask (2), dense (3)",
                     e);
  if (d[5] != 0 || d[6] != 0 || d[7] != 0)
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "delta: header bytes 5..7 are %02x %02x %02x, must be zero", d[5],
                     d[6], d[7]);
  const uint32_t chunk = load_u32(d + 8), count = load_u32(d + 12);
  uint64_t want = REFIT_DELTA_HEADER_BYTES;
  if (e == REFIT_DELTA_POSITIONS) {
    if (count > chunk)
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "delta: %" PRIu32 " positions in a chunk of %" PRIu32 " bytes",
                       count, chunk);
    want += 5 * (uint64_t)count;
  } else if (e == REFIT_DELTA_MASK) {
    /* The payload's length depends on which blocks are marked: checked here
     * from the mask when the mask is there, else from the count alone. */
    const uint64_t nb = blocks_of(chunk), mb = mask_bytes_of(chunk);
    if (count > nb)
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "delta: %" PRIu32 " changed blocks in a chunk of %" PRIu64
                       " blocks",
                       count, nb);
    if (delta_len < want + mb)
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "delta: %zu bytes, shorter than its header and the %" PRIu64
                       "-byte block mask of a %" PRIu32 "-byte chunk",
                       delta_len, mb, chunk);
    const uint8_t *mask = d + REFIT_DELTA_HEADER_BYTES;
    uint64_t marked = 0;
    for (uint64_t i = 0; i < mb; i++)
      marked += popcount8(mask[i]);
    if (nb % 8 != 0 && (mask[mb - 1] >> (nb % 8)) != 0)
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "delta: mask bits past the chunk's %" PRIu64 " blocks are set",
                       nb);
    if (marked != count)
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "delta: the mask marks %" PRIu64
                       " blocks, the header says %" PRIu32,
                       marked, count);
    want += mb + (uint64_t)count * BLOCK;
    /* The chunk's last block may be short. */
    if (count > 0 && chunk % BLOCK != 0 && (mask[(nb - 1) / 8] >> ((nb - 1) % 8) & 1))
      want -= BLOCK - chunk % BLOCK;
  } else {
    if (count != 0)
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "delta: a dense delta with count %" PRIu32 ", must be 0", count);
    want += chunk;
  }
  if (delta_len != want)
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "delta: %zu bytes, but its %s encoding of %" PRIu32
                     " entries for a %" PRIu32 "-byte chunk takes %" PRIu64
                     " (truncated or padded)",
                     delta_len, refit_delta_encoding_name((refit_delta_encoding_t)e),
                     count, chunk, want);
  out->encoding = (refit_delta_encoding_t)e;
  out->chunk_bytes = chunk;
  out->count = count;
  out->bytes = want;
  return REFIT_OK;
}

/* Positions: offsets increase and lie in the chunk, and each names a byte
 * that the destination does not hold already. */
static refit_status_t check_positions(const uint8_t *p, uint32_t count,
                                      const uint8_t *dst, uint32_t chunk) {
  const uint8_t *values = p + 4 * (uint64_t)count;
  uint64_t prev = 0;
  for (uint32_t j = 0; j < count; j++) {
    const uint32_t off = load_u32(p + 4 * (uint64_t)j);
    if (off >= chunk)
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "delta: position %" PRIu32 " at offset %" PRIu32
                       ", past the chunk's %" PRIu32 " bytes",
                       j, off, chunk);
    if (j > 0 && off <= prev)
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "delta: position %" PRIu32 " at offset %" PRIu32
                       " does not follow position %" PRIu32 "'s offset %" PRIu64
                       " (offsets must increase)",
                       j, off, j - 1, prev);
    if (dst[off] == values[j])
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "delta: position %" PRIu32 " (offset %" PRIu32
                       "): the destination already holds 0x%02x; the delta was not made "
                       "against this baseline",
                       j, off, values[j]);
    prev = off;
  }
  return REFIT_OK;
}

/* Mask: each marked block differs from the destination's. The mask's shape
 * was checked by refit_delta_info. */
static refit_status_t check_mask(const uint8_t *p, const uint8_t *dst, uint32_t chunk) {
  const uint64_t nb = blocks_of(chunk);
  const uint8_t *data = p + mask_bytes_of(chunk);
  for (uint64_t k = next_marked(p, nb, 0); k < nb; k = next_marked(p, nb, k + 1)) {
    const uint64_t len = block_len(chunk, k);
    if (memcmp(data, dst + k * BLOCK, len) == 0)
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "delta: block %" PRIu64 " (bytes %" PRIu64 "..%" PRIu64
                       "): the destination holds it already; the delta was not made "
                       "against this baseline",
                       k, k * BLOCK, k * BLOCK + len - 1);
    data += len;
  }
  return REFIT_OK;
}

refit_status_t refit_delta_decode(const void *delta, size_t delta_len, void *dst,
                                  size_t dst_bytes) {
  refit_delta_info_t info;
  REFIT_CHECK(refit_delta_info(delta, delta_len, &info));
  if (info.chunk_bytes != dst_bytes)
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "delta: made for a chunk of %" PRIu32
                     " bytes, the destination has %zu",
                     info.chunk_bytes, dst_bytes);
  if (dst == NULL && dst_bytes > 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "delta decode: NULL destination");
  const uint8_t *p = (const uint8_t *)delta + REFIT_DELTA_HEADER_BYTES;
  uint8_t *o = dst;
  if (info.encoding == REFIT_DELTA_POSITIONS) {
    REFIT_CHECK(check_positions(p, info.count, o, info.chunk_bytes));
    const uint8_t *values = p + 4 * (uint64_t)info.count;
    for (uint32_t j = 0; j < info.count; j++)
      o[load_u32(p + 4 * (uint64_t)j)] = values[j];
  } else if (info.encoding == REFIT_DELTA_MASK) {
    REFIT_CHECK(check_mask(p, o, info.chunk_bytes));
    const uint64_t nb = blocks_of(info.chunk_bytes);
    const uint8_t *data = p + mask_bytes_of(info.chunk_bytes);
    for (uint64_t k = next_marked(p, nb, 0); k < nb; k = next_marked(p, nb, k + 1)) {
      const uint64_t len = block_len(info.chunk_bytes, k);
      memcpy(o + k * BLOCK, data, len);
      data += len;
    }
  } else if (dst_bytes > 0) {
    memcpy(o, p, dst_bytes);
  }
  return REFIT_OK;
}
