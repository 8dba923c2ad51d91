/*
 * 64-bit FNV-1a, used to prove that ranks agree on a config or a plan before
 * a byte moves. It is not a cryptographic hash and is not meant to be one.
 */
#ifndef REFIT_CORE_HASH_H
#define REFIT_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>

#define REFIT_HASH_INIT UINT64_C(0xcbf29ce484222325)

static inline uint64_t refit_hash_bytes(uint64_t h, const void *data,
                                        size_t len) {
  const unsigned char *p = (const unsigned char *)data;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= UINT64_C(0x100000001b3);
  }
  return h;
}

static inline uint64_t refit_hash_u64(uint64_t h, uint64_t v) {
  return refit_hash_bytes(h, &v, sizeof(v));
}

#endif /* REFIT_CORE_HASH_H */
