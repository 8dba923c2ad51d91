/*
 * Delta codec of one chunk (the C reference; issue "Delta refit"): given a
 * chunk's new bytes and its baseline (the bytes the receiver holds, the same
 * length), encode only what changed, and apply such a delta in place to a
 * destination that holds the baseline. Bytes are bytes: MXFP8 values, E8M0
 * scales and BF16 (little-endian: a one-ulp change mostly touches the low
 * byte only) all go the same way.
 *
 * A delta is a 16-byte header and a payload, little-endian throughout:
 *   header   u32 magic "RFD1", u8 encoding, 3 zero bytes, u32 chunk bytes,
 *            u32 count
 *   positions (encoding 1): count = changed bytes; count u32 offsets,
 *            strictly increasing, then count new bytes (offsets first so that
 *            both arrays are read in order)
 *   mask     (encoding 2): count = changed 32-byte blocks; one bit per block
 *            of the chunk (block b is bit b % 8 of byte b / 8, bits past the
 *            last block zero), then the new bytes of each marked block in
 *            order (the last block of a chunk may be shorter than 32)
 *   dense    (encoding 3): count = 0; the whole chunk
 * Sizes, header included, for n chunk bytes, k changed bytes in c changed
 * blocks of B bytes in all: positions 16 + 5k, mask 16 + ceil(ceil(n / 32) / 8) + B,
 * dense 16 + n. The encoder picks the smallest (ties: dense, then mask, then
 * positions, the faster to apply). A chunk is at most UINT32_MAX bytes.
 *
 * Decoding checks everything before it writes anything: a delta that is
 * short, long, of another chunk size, malformed (offsets out of order or
 * past the chunk, mask bits past the chunk or not matching the count), or
 * made against another baseline (a position whose byte, or a marked block
 * whose bytes, the destination already holds: an encoder never emits those)
 * is REFIT_ERR_INTEGRITY naming what is wrong, and the destination is left as
 * it was. The layout permutation of a runtime tensor is not applied here:
 * the destination is the chunk's bytes, flat.
 */
#ifndef REFIT_KERNELS_DELTA_H
#define REFIT_KERNELS_DELTA_H

#include "refit/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define REFIT_DELTA_HEADER_BYTES 16
#define REFIT_DELTA_BLOCK_BYTES 32
#define REFIT_DELTA_MAGIC UINT32_C(0x31444652) /* "RFD1" in memory order */

typedef enum {
  REFIT_DELTA_AUTO = 0, /* encode: the smallest of the three */
  REFIT_DELTA_POSITIONS = 1,
  REFIT_DELTA_MASK = 2,
  REFIT_DELTA_DENSE = 3,
  REFIT_DELTA_ENCODINGS
} refit_delta_encoding_t;

/* "auto", "positions", "mask", "dense", or "?" */
const char *refit_delta_encoding_name(refit_delta_encoding_t e);

/* What changed in a chunk, and what each encoding of it would take. */
typedef struct {
  uint64_t changed_bytes;
  uint64_t changed_blocks;
  /* Encoded bytes, header included, by encoding; size[REFIT_DELTA_AUTO] is
   * the smallest, the one `best` names. */
  uint64_t size[REFIT_DELTA_ENCODINGS];
  refit_delta_encoding_t best;
} refit_delta_stats_t;

/* A delta's header, as refit_delta_info read and checked it. */
typedef struct {
  refit_delta_encoding_t encoding;
  uint32_t chunk_bytes;
  uint32_t count;
  uint64_t bytes; /* the whole delta's length, header included */
} refit_delta_info_t;

/* The most bytes a delta of a chunk of `chunk_bytes` takes (dense). */
static inline uint64_t refit_delta_bound(uint64_t chunk_bytes) {
  return REFIT_DELTA_HEADER_BYTES + chunk_bytes;
}

/* Compare `new_bytes` with `base` (both `bytes` long) into *out.
 * Errors: REFIT_ERR_INVALID_ARGUMENT (NULL with bytes > 0, bytes above
 * UINT32_MAX). */
refit_status_t refit_delta_measure(const void *new_bytes, const void *base, size_t bytes,
                                   refit_delta_stats_t *out);

/*
 * Encode the change from `base` to `new_bytes` (both `bytes` long) into
 * `out` (capacity `cap`) as `encoding` (REFIT_DELTA_AUTO: the smallest);
 * *out_len = the delta's length, and `stats` (optional) gets the chunk's
 * refit_delta_stats_t. refit_delta_bound(bytes) is room enough for
 * REFIT_DELTA_AUTO; a forced encoding may need more (positions: up to
 * 16 + 5 * bytes). The inputs and `out` must not overlap.
 * Errors: REFIT_ERR_INVALID_ARGUMENT (as measure, an unknown encoding, `cap`
 * below the chosen encoding's size), REFIT_ERR_NO_MEMORY (the bitmap);
 * *out_len and out untouched then. Single-threaded; allocates a bitmap of
 * bytes / 256 bytes.
 */
refit_status_t refit_delta_encode(const void *new_bytes, const void *base, size_t bytes,
                                  refit_delta_encoding_t encoding, void *out, size_t cap,
                                  size_t *out_len, refit_delta_stats_t *stats);

/* Read and check a delta's header and its length against `delta_len`
 * (everything but the payload's contents). Errors: REFIT_ERR_INTEGRITY. */
refit_status_t refit_delta_info(const void *delta, size_t delta_len,
                                refit_delta_info_t *out);

/*
 * Apply `delta` (delta_len bytes) to `dst` (dst_bytes, holding the
 * baseline the delta was made against): afterwards dst holds the new bytes.
 * Errors: REFIT_ERR_INTEGRITY (see the file's comment: a chunk size other
 * than dst_bytes included), REFIT_ERR_INVALID_ARGUMENT (NULL pointers); dst
 * untouched then.
 */
refit_status_t refit_delta_decode(const void *delta, size_t delta_len, void *dst,
                                  size_t dst_bytes);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_DELTA_H */
