/*
 * The synthetic weight of one element, shared by the host and the device so
 * that both produce the same bits (runtime/src/source/synth.h states the model).
 *
 * Independent versions (rate 0): a splitmix64 hash of (tensor key, global
 * element index) shaped into BF16 with realistic magnitudes. Projections and
 * experts get values of magnitude 2^-12 .. 2^-5 with one in 256 an outlier
 * near 2^-3, both signs; norms get values in [1, 2).
 *
 * Updates of a master (rate > 0): element i of a version is
 *   bf16_rne(m_i + (rate * |m_i|) * n_i)
 * in FP32 arithmetic, every operation rounded to nearest even, with m_i the
 * element's FP32 master (the magnitudes above with 23 random mantissa bits;
 * the same in every version) and n_i = +-u, u uniform in [0, 1) on 24 bits
 * (a fresh draw in every version). No compiler may fuse the operations
 * into an FMA, which rounds once: the host code puts each in a statement of
 * its own (ISO C contracts at most within one expression, and GCC not at all
 * in ISO mode, which the build uses), the device code rounds each explicitly
 * (__fmul_rn, __fadd_rn).
 */
#ifndef REFIT_KERNELS_SYNTH_RULES_H
#define REFIT_KERNELS_SYNTH_RULES_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define REFIT_SYNTH_HD __host__ __device__
#else
#define REFIT_SYNTH_HD
#endif

/* What defines a tensor's synthetic values in one version. */
typedef struct {
  uint64_t key;    /* seed, version and name: the values (rate 0) or n_i */
  uint64_t master; /* seed and name only: m_i (rate > 0) */
  float rate;      /* 0: independent versions; > 0: updates of the master */
  int32_t norm;    /* norms get values in [1, 2) */
} refit_synth_key_t;

static inline REFIT_SYNTH_HD uint64_t refit_synth_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Sign, exponent and outlier of an element from hash bits h (the exponent
 * is a BF16 and FP32 biased exponent). */
static inline REFIT_SYNTH_HD uint32_t refit_synth_exponent(int norm, uint64_t h) {
  if (norm)
    return 127;
  return ((h >> 3) & 0xff) == 0 ? 124u : (uint32_t)(115 + (h & 7));
}

/* An independent version's value of element `index`. */
static inline REFIT_SYNTH_HD uint16_t refit_synth_independent(uint64_t key, int norm,
                                                              int64_t index) {
  const uint64_t h = refit_synth_mix(key ^ (uint64_t)index);
  const uint16_t mant = (uint16_t)(h & 0x7f);
  const uint16_t sign = norm ? 0 : (uint16_t)((h >> 7) & 1);
  const uint16_t exp = (uint16_t)refit_synth_exponent(norm, h >> 8);
  return (uint16_t)((sign << 15) | (exp << 7) | mant);
}

/* m_i: the FP32 master of element `index`. */
static inline REFIT_SYNTH_HD float refit_synth_master(uint64_t master, int norm,
                                                      int64_t index) {
  const uint64_t h = refit_synth_mix(master ^ (uint64_t)index);
  const uint32_t mant = (uint32_t)(h & 0x7fffff);
  const uint32_t sign = norm ? 0 : (uint32_t)((h >> 23) & 1);
  const uint32_t bits = (sign << 31) | (refit_synth_exponent(norm, h >> 24) << 23) | mant;
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

/* n_i: +-u with u uniform in [0, 1) on 24 bits (exact in FP32). */
static inline REFIT_SYNTH_HD float refit_synth_noise(uint64_t key, int64_t index) {
  const uint64_t h = refit_synth_mix(key ^ (uint64_t)index);
  const float u = (float)(uint32_t)(h >> 40) * 0x1p-24f;
  return (h & 1) ? -u : u;
}

/* FP32 round to BF16, nearest even (x finite). */
static inline REFIT_SYNTH_HD uint16_t refit_synth_bf16_rne(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof(u));
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static inline REFIT_SYNTH_HD uint16_t refit_synth_value(const refit_synth_key_t *k,
                                                        int64_t index) {
  if (k->rate == 0.0f)
    return refit_synth_independent(k->key, k->norm, index);
  const float m = refit_synth_master(k->master, k->norm, index);
  const float n = refit_synth_noise(k->key, index);
  const float a = m < 0.0f ? -m : m;
#if defined(__CUDA_ARCH__)
  const float x = __fadd_rn(m, __fmul_rn(__fmul_rn(k->rate, a), n));
#else
  const float step = k->rate * a;
  const float d = step * n;
  const float x = m + d;
#endif
  return refit_synth_bf16_rne(x);
}

#endif /* REFIT_KERNELS_SYNTH_RULES_H */
