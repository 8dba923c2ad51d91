/*
 * 64-bit integrity digest of a byte range, defined so that it can be computed
 * in parallel (the GPU path sums it over thread blocks) and gives the same
 * value on CPU and GPU:
 *
 *   w_i  = the i-th little-endian 8-byte word (the last one zero-padded)
 *   d    = len * P1 + sum_i mix(w_i + i * P2)   (mod 2^64)
 *
 * mix is the splitmix64 finalizer, a bijection, so a flipped bit changes its
 * word's term; the word index salts each term, so moved words change the sum.
 * Not a cryptographic hash.
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
#define REFIT_DIGEST_P2 0xC2B2AE3D27D4EB4Full

static inline REFIT_DIGEST_HD uint64_t refit_digest_mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

/* The term of word i. */
static inline REFIT_DIGEST_HD uint64_t refit_digest_term(uint64_t w, uint64_t i) {
  return refit_digest_mix(w + i * REFIT_DIGEST_P2);
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
