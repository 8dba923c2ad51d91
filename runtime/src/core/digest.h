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

#endif /* REFIT_CORE_DIGEST_H */
