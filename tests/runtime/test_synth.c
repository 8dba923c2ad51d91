/*
 * The synthetic source (runtime/src/source/synth.h): with source.update_rate 0 the
 * values of before, bit for bit; with a rate, the update of a master as an
 * independent statement of the formula computes it; and the fraction of BF16
 * elements that change between two versions lies in the band the model
 * predicts.
 */
#include "../kernels/kernels_test.h"
#include "config/config.h"
#include "core/hash.h"
#include "kernels/mxfp8.h"
#include "kernels/synth_rules.h"
#include "source/source.h"
#include "source/synth.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

static refit_src_tensor_t tensor(const char *name, refit_role_t role, int64_t rows,
                                 int64_t cols) {
  refit_src_tensor_t t = {.rows = rows, .cols = cols, .role = role};
  snprintf(t.name, sizeof(t.name), "%s", name);
  return t;
}

static const char *const names[] = {"model.layers.0.self_attn.q_proj.weight",
                                    "model.layers.3.mlp.experts.7.down_proj.weight",
                                    "model.layers.1.input_layernorm.weight",
                                    "model.embed_tokens.weight"};
static const refit_role_t roles[] = {REFIT_ROLE_LINEAR, REFIT_ROLE_EXPERT,
                                     REFIT_ROLE_NORM, REFIT_ROLE_EMBED};

/* A synthetic source as refit-run opens it. */
static void *open_source(uint64_t seed, double rate) {
  refit_config_t cfg;
  refit_config_defaults(&cfg);
  cfg.source.seed = seed;
  cfg.source.update_rate = rate;
  void *ctx = NULL;
  assert_int_equal(refit_source_synthetic.open(&cfg, NULL, &ctx), REFIT_OK);
  return ctx;
}

/* ---- Rate 0: the values of before --------------------------------------- */

/* The definition before update_rate existed, restated. */
static uint16_t before_value(uint64_t seed, uint64_t version, const char *name, int norm,
                             int64_t index) {
  const uint64_t h = refit_hash_bytes(REFIT_HASH_INIT, name, strlen(name));
  const uint64_t key =
      refit_synth_mix(refit_synth_mix(seed) ^ refit_synth_mix(version + h));
  const uint64_t x = refit_synth_mix(key ^ (uint64_t)index);
  const uint16_t mant = (uint16_t)(x & 0x7f);
  if (norm)
    return (uint16_t)((127u << 7) | mant);
  const uint16_t sign = (uint16_t)((x >> 7) & 1);
  uint16_t exp = (uint16_t)(115 + ((x >> 8) & 7));
  if (((x >> 11) & 0xff) == 0)
    exp = 124;
  return (uint16_t)((sign << 15) | (exp << 7) | mant);
}

static void test_synth_rate_zero_is_before(void **state) {
  (void)state;
  kt_seed("test_synth_rate_zero_is_before");
  const int64_t rows = 19, cols = 333;
  uint16_t *got = malloc((size_t)(rows * cols) * sizeof(*got));
  for (int iter = 0; iter < 32; iter++) {
    const uint64_t seed = kt_rand(), version = (uint64_t)kt_rand_range(0, 1000);
    const int w = iter % 4;
    const refit_src_tensor_t t = tensor(names[w], roles[w], 1000, cols);
    void *src = open_source(seed, 0.0);
    const int64_t row0 = kt_rand_range(0, 1000 - rows);
    assert_int_equal(
        refit_source_synthetic.read(src, &t, version, row0, 0, rows, cols, got),
        REFIT_OK);
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++)
        assert_int_equal(got[r * cols + c],
                         before_value(seed, version, t.name, roles[w] == REFIT_ROLE_NORM,
                                      (row0 + r) * cols + c));
    refit_source_synthetic.close(src);
  }
  free(got);
}

/* ---- Rate > 0: the formula ---------------------------------------------- */

/* FP32 operations through double: each is exact in double or rounded once
 * more to FP32, which equals the FP32 operation (53 >= 2 * 24 + 2). */
static float f32_mul(float a, float b) { return (float)((double)a * (double)b); }
static float f32_add(float a, float b) { return (float)((double)a + (double)b); }

/* BF16 nearest to x, ties to the even one, by comparing distances. */
static uint16_t bf16_nearest(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof(u));
  const uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1); /* toward |inf| */
  const double dlo = fabs((double)x - (double)refit_bf16_to_float(lo));
  const double dhi = fabs((double)refit_bf16_to_float(hi) - (double)x);
  if (dlo != dhi)
    return dlo < dhi ? lo : hi;
  return (lo & 1) == 0 ? lo : hi;
}

/* Element `index` of a version, from the statement in synth.h: the master
 * m (23 random mantissa bits, the exponents of the independent values), a
 * sign times a 24-bit uniform n, bf16(m + (rate * |m|) * n). */
static uint16_t update_value(uint64_t master_key, uint64_t key, float rate, int norm,
                             int64_t index) {
  const uint64_t hm = refit_synth_mix(master_key ^ (uint64_t)index);
  int exp = norm ? 0 : (int)(hm >> 24 & 7) - 12;
  if (!norm && ((hm >> 27) & 0xff) == 0)
    exp = -3;
  const double sig = 1.0 + (double)(hm & 0x7fffff) / 8388608.0;
  const float m = (float)ldexp((!norm && (hm >> 23 & 1)) ? -sig : sig, exp);
  const uint64_t hn = refit_synth_mix(key ^ (uint64_t)index);
  const double u = (double)(hn >> 40) / 16777216.0;
  const float n = (float)((hn & 1) ? -u : u);
  return bf16_nearest(f32_add(m, f32_mul(f32_mul(rate, fabsf(m)), n)));
}

static void test_synth_update_formula(void **state) {
  (void)state;
  kt_seed("test_synth_update_formula");
  const double rates[] = {1e-4, 1e-3, 1e-2, 1.0, 0};
  const int64_t cols = 4096, rows = 64;
  uint16_t *got = malloc((size_t)(rows * cols) * sizeof(*got));
  for (int iter = 0; iter < 20; iter++) {
    double rate = rates[iter % 5];
    if (rate == 0)
      rate = (double)kt_rand_range(1, 1000000) * 1e-8;
    const uint64_t seed = kt_rand(), version = (uint64_t)kt_rand_range(1, 1 << 20);
    const int w = iter % 4;
    const refit_src_tensor_t t = tensor(names[w], roles[w], 1 << 20, cols);
    refit_synth_key_t key;
    refit_synth_init(&key, seed, rate, version, &t);
    assert_true(key.rate == (float)rate);
    void *src = open_source(seed, rate);
    const int64_t row0 = kt_rand_range(0, t.rows - rows);
    assert_int_equal(
        refit_source_synthetic.read(src, &t, version, row0, 0, rows, cols, got),
        REFIT_OK);
    for (int64_t i = 0; i < rows * cols; i++) {
      const uint16_t want =
          update_value(key.master, key.key, key.rate, key.norm, row0 * cols + i);
      if (got[i] != want)
        fail_msg("%s version %llu rate %g element %lld: 0x%04x, formula 0x%04x", t.name,
                 (unsigned long long)version, rate, (long long)(row0 * cols + i), got[i],
                 want);
    }
    /* The master is the version's only anchor: another version's key has the
     * same master and another update. */
    refit_synth_key_t next;
    refit_synth_init(&next, seed, rate, version + 1, &t);
    assert_true(next.master == key.master);
    assert_true(next.key != key.key);
    refit_source_synthetic.close(src);
  }
  free(got);
}

/* ---- The fraction of changed elements ----------------------------------- */

/*
 * The model's fraction for rate r (synth.h): two versions' values lie
 * d = r |m| (n_v - n_w) apart, with n_v - n_w triangular on (-2, 2), and m's
 * position within its BF16 rounding cell (width 2^-7 of its binade) uniform,
 * so a cell boundary falls between them with probability min(1, |d| / ulp)
 * = min(1, a t), a = 128 r s, s = m's significand (uniform in [1, 2)),
 * t = |n_v - n_w| (density (2 - t) / 2 on [0, 2)). Over t:
 *   E min(1, a t) = 2a/3 for a <= 1/2, else 1 - c/2 + c^2/12, c = 1/a;
 * over s numerically.
 */
static double model_fraction(double r) {
  const int steps = 100000;
  double sum = 0;
  for (int i = 0; i < steps; i++) {
    const double s = 1.0 + (i + 0.5) / steps, a = 128.0 * r * s, c = 1.0 / a;
    sum += c >= 2.0 ? 2.0 * a / 3.0 : 1.0 - c / 2.0 + c * c / 12.0;
  }
  return sum / steps;
}

static void test_synth_changed_fraction(void **state) {
  (void)state;
  kt_seed("test_synth_changed_fraction");
  const int64_t cols = 1024, rows = 1024, n = rows * cols;
  uint16_t *a = malloc((size_t)n * sizeof(*a)), *b = malloc((size_t)n * sizeof(*b));
  const double rates[] = {1e-4, 1e-3, 1e-2, 0};
  for (int iter = 0; iter < 8; iter++) {
    double r = rates[iter % 4];
    if (r == 0)
      r = exp(log(1e-5) + (double)kt_rand_range(0, 1000) / 1000.0 * log(1e3));
    const uint64_t seed = kt_rand(), v = (uint64_t)kt_rand_range(1, 1 << 30);
    const int w = iter % 4;
    const refit_src_tensor_t t = tensor(names[w], roles[w], rows, cols);
    void *src = open_source(seed, r);
    assert_int_equal(refit_source_synthetic.read(src, &t, v, 0, 0, rows, cols, a),
                     REFIT_OK);
    assert_int_equal(refit_source_synthetic.read(src, &t, v + 1, 0, 0, rows, cols, b),
                     REFIT_OK);
    refit_source_synthetic.close(src);
    int64_t changed = 0;
    for (int64_t i = 0; i < n; i++)
      changed += a[i] != b[i];
    const double got = (double)changed / (double)n, want = model_fraction(r);
    /* The band: the model's one approximation, that both values lie in m's
     * binade, fails only for m within 2 r |m| of a binade's edge (|d| < 2 r
     * |m| and s - 1 or 2 - s < 2 r), a fraction of at most 4 r of the
     * elements; plus six standard deviations of a binomial count of n. */
    const double band = 4.0 * r + 6.0 * sqrt(want * (1.0 - want) / (double)n);
    printf("  %s rate %.3g: %.5f of BF16 elements changed, model %.5f +- %.5f\n", t.name,
           r, got, want, band);
    if (fabs(got - want) > band)
      fail_msg("%s rate %g: %.6f changed, the model says %.6f +- %.6f", t.name, r, got,
               want, band);
  }
  /* Rate 0: independent versions, nearly every element differs (a value
   * repeats with probability about 1/2048: 7 mantissa bits, sign, 8
   * exponents). */
  const refit_src_tensor_t t = tensor(names[0], roles[0], rows, cols);
  void *src = open_source(kt_rand(), 0.0);
  assert_int_equal(refit_source_synthetic.read(src, &t, 7, 0, 0, rows, cols, a),
                   REFIT_OK);
  assert_int_equal(refit_source_synthetic.read(src, &t, 8, 0, 0, rows, cols, b),
                   REFIT_OK);
  refit_source_synthetic.close(src);
  int64_t same = 0;
  for (int64_t i = 0; i < n; i++)
    same += a[i] == b[i];
  assert_true(same < n / 256);
  free(a);
  free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_synth_rate_zero_is_before),
      cmocka_unit_test(test_synth_update_formula),
      cmocka_unit_test(test_synth_changed_fraction),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
