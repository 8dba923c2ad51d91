/*
 * 64-bit integrity digest of a byte range, defined so that it can be computed
 * in parallel (the GPU path sums it over thread blocks) and gives the same
 * value on CPU and GPU:
 *
 *   w_i  = the i-th little-endian 8-byte word (the last one zero-padded),
 *          lo_i and hi_i its low and high 32-bit halves
 *   k_i  = (i * K1) mod 2^32                 (a key per word index)
 *   a_i  = (lo_i + k_i) mod 2^32
 *   b_i  = (hi_i + (k_i xor K2)) mod 2^32
 *   d    = len * P1 + sum_i a_i * b_i        (mod 2^64; a_i * b_i exact)
 *
 * Each term is one 32 x 32 -> 64 multiply-add (the NH construction), so the
 * GPU sums it beside the quantizer for a few instructions per 8 bytes. A
 * flipped bit of lo_i changes the sum by 2^j * b_i, of hi_i by 2^j * a_i:
 * caught unless that factor is zero, one word in 2^32 for data not chosen
 * against the keys. The key salts each index, so words moved or dropped
 * change the sum. Not a cryptographic hash.
 */
#ifndef REFIT_CORE_DIGEST_H
#define REFIT_CORE_DIGEST_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define REFIT_DIGEST_HD __host__ __device__
#else
#define REFIT_DIGEST_HD
#endif

#define REFIT_DIGEST_P1 0x9E3779B185EBCA87ull
#define REFIT_DIGEST_K1 0x9E3779B9u
#define REFIT_DIGEST_K2 0x85EBCA6Bu

/* The term of word i given as its two 32-bit halves. */
static inline REFIT_DIGEST_HD uint64_t refit_digest_term2(uint32_t lo, uint32_t hi,
                                                          uint64_t i) {
  const uint32_t k = (uint32_t)i * REFIT_DIGEST_K1;
  const uint32_t a = lo + k, b = hi + (k ^ REFIT_DIGEST_K2);
  return (uint64_t)a * b;
}

/* The term of word i. */
static inline REFIT_DIGEST_HD uint64_t refit_digest_term(uint64_t w, uint64_t i) {
  return refit_digest_term2((uint32_t)w, (uint32_t)(w >> 32), i);
}

static inline uint64_t refit_digest64(const void *data, size_t len) {
  const unsigned char *p = (const unsigned char *)data;
  const size_t words = len / 8;
  uint64_t d = (uint64_t)len * REFIT_DIGEST_P1, w;
  for (size_t i = 0; i < words; i++) {
    memcpy(&w, p + 8 * i, 8);
    d += refit_digest_term(w, i);
  }
  if (len % 8 != 0) {
    w = 0;
    memcpy(&w, p + 8 * words, len % 8);
    d += refit_digest_term(w, words);
  }
  return d;
}

/*
 * The seal that binds a chunk to its refit. A chunk's 8-byte trailer is
 *
 *   trailer = digest(rows) + key + tag * REFIT_SEAL_MUL     (mod 2^64)
 *
 * where `key` names the chunk within the job (the run id, its bucket, and
 * where its rows come from: the same for every engine a message is packed
 * once for) and `tag` names the refit: refit_seal_tag(version, attempt).
 * A chunk of another refit, or of another run, fails the generator's check
 * even though its rows are intact; REFIT_SEAL_MUL is odd, so the tag it was
 * sealed with is recovered from the trailer (refit_seal_untag) and the error
 * can name that refit. Not a cryptographic seal: it catches stale and
 * misrouted chunks, not an adversary.
 */
#define REFIT_SEAL_MUL 0xD6E8FEB86659FD93ull

static inline REFIT_DIGEST_HD uint64_t refit_seal(uint64_t key, uint64_t tag) {
  return key + tag * REFIT_SEAL_MUL;
}

/* The tag of the refit of `version` at attempt `attempt` (its low 24 bits). */
static inline uint64_t refit_seal_tag(uint64_t version, uint32_t attempt) {
  return version << 24 | (attempt & 0xFFFFFFu);
}

/* The version and the attempt (its low 24 bits) a tag names. */
static inline uint64_t refit_seal_version(uint64_t tag) { return tag >> 24; }
static inline uint32_t refit_seal_attempt(uint64_t tag) {
  return (uint32_t)(tag & 0xFFFFFFu);
}

/* A trailer as the wire holds it: 8 bytes, little-endian. */
static inline uint64_t refit_trailer_load(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* The tag a trailer was sealed with, given the digest of the chunk's rows
 * as they arrived and the chunk's key. */
static inline uint64_t refit_seal_untag(uint64_t trailer, uint64_t digest, uint64_t key) {
  uint64_t inv = REFIT_SEAL_MUL; /* Newton: each step doubles the bits right */
  for (int i = 0; i < 5; i++)
    inv *= 2 - REFIT_SEAL_MUL * inv;
  return (trailer - digest - key) * inv;
}

/* The key of a chunk: the run, the bucket, and its rows' origin. */
static inline uint64_t refit_seal_key(uint64_t run_id, int32_t bucket, int64_t src_tensor,
                                      int64_t src_row, int64_t src_col) {
  uint64_t h = run_id ^ 0x6A09E667F3BCC909ull;
  const uint64_t parts[4] = {(uint64_t)(uint32_t)bucket, (uint64_t)src_tensor,
                             (uint64_t)src_row, (uint64_t)src_col};
  for (int i = 0; i < 4; i++) {
    h ^= parts[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  return h;
}

#endif /* REFIT_CORE_DIGEST_H */
