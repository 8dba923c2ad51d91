/*
 * refit-bench-delta: the delta codec's C reference (kernels/delta.h) on one
 * chunk, single-threaded, against memcpy of the chunk in the same run.
 *
 * Part 1, changed bytes drawn at a density p (the fraction of the chunk's
 * bytes that change), in three patterns: scattered (every byte on its own),
 * runs (runs of 1 to 64 bytes at random places, as a changed stretch of
 * BF16 rows) and blocks (whole aligned 32-byte blocks, as an MXFP8 block
 * whose scale moved). Sizes are the delta's bytes, header included, as a
 * fraction of the chunk, for each encoding and for the one chosen.
 * Throughput is chunk bytes / time for the encoder, the decoder and memcpy
 * alike (the encoder reads both chunks and writes the delta, the decoder
 * reads the delta and the bytes it names and writes them), so "x memcpy" is
 * the fraction of copy speed. Times are the best of REFIT_BENCH_REPS runs
 * (default 3); the decoder's destination is reset to the baseline, untimed,
 * before each. "wrong" counts bytes of the decoded chunk that differ from
 * the new one; exit code 1 if any.
 *
 * Part 2, break-even densities: where two encodings take the same bytes,
 * found by bisection on measured sizes (a chunk of a quarter of the size),
 * and for scattered bytes and whole blocks the model's value from the sizes
 * in kernels/delta.h (scattered: a block changes with 1 - (1 - p)^32).
 *
 * Part 3, the synthetic source's training-like versions (runtime/src/source/synth.h)
 * at several update rates: one [1024, 4096] projection, versions 1 and 2,
 * quantized to MXFP8; the changed fraction of BF16 elements, MXFP8 value and
 * scale bytes and 32-byte value blocks, and the chosen deltas of the values
 * and scales as a fraction of a full prequantized refit of the tensor.
 *
 * Part 4, the same versions as block FP8 wire chunks (refit_pack_rows'
 * BLOCK_QUANTIZE, fp32 scales, chunks of 128 rows as a plan cuts them): the
 * fraction of 128 x 128 blocks whose scale changed, and the chunks' deltas
 * as a fraction of the wire bytes, with every row carrying its block row's
 * scales (the wire format: every byte has a place, kernels/place.h) and,
 * for comparison, with one copy in the block row's first row and zeros in
 * the others (the earlier format, which had no place for the zeros).
 *
 * Usage: refit-bench-delta [chunk MiB, default 64]
 */
#include "bench_util.h"
#include "kernels/datapath.h"
#include "kernels/delta.h"
#include "kernels/mxfp8.h"
#include "kernels/synth_rules.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) { return bench_rand(&rng); }

typedef enum { SCATTERED, RUNS, BLOCKS, PATTERNS } pattern_t;
static const char *const pattern_names[] = {"scattered", "runs", "blocks"};

static size_t gap(double mean) { return bench_gap(&rng, mean); }

/* new = base with runs of changed bytes separated by geometric gaps whose
 * mean gives density p. */
static void make_change(const uint8_t *base, uint8_t *next, size_t n, pattern_t pat,
                        double p) {
  memcpy(next, base, n);
  if (p <= 0)
    return;
  const size_t unit = pat == BLOCKS ? 32 : 1;
  const double gap_mean = (pat == RUNS ? 32.5 : 1.0) * (1.0 - p) / p;
  for (size_t i = gap(gap_mean) * unit; i < n;) {
    const size_t run = pat == RUNS ? 1 + (size_t)(rnd() % 64) : unit;
    for (size_t j = i; j < n && j < i + run; j++)
      next[j] = (uint8_t)(base[j] ^ (uint8_t)(1 + rnd() % 255));
    i += run + gap(gap_mean) * unit;
  }
}

static int reps = 3;
static double copy_gbs;
static long long total_wrong;

/* Best time of encoding `next` against `base` (AUTO), then of decoding it. */
static void time_codec(const uint8_t *next, const uint8_t *base, size_t n, uint8_t *delta,
                       uint8_t *dst, double *enc_s, double *dec_s, size_t *len,
                       refit_delta_stats_t *st) {
  *enc_s = *dec_s = 1e30;
  for (int r = 0; r < reps; r++) {
    double t = now_s();
    check(refit_delta_encode(next, base, n, REFIT_DELTA_AUTO, delta,
                             (size_t)refit_delta_bound(n), len, st),
          "encode");
    t = now_s() - t;
    *enc_s = t < *enc_s ? t : *enc_s;
  }
  for (int r = 0; r < reps; r++) {
    memcpy(dst, base, n);
    double t = now_s();
    check(refit_delta_decode(delta, *len, dst, n), "decode");
    t = now_s() - t;
    *dec_s = t < *dec_s ? t : *dec_s;
  }
  long long wrong = 0;
  for (size_t i = 0; i < n; i++)
    wrong += dst[i] != next[i];
  total_wrong += wrong;
}

static void part_densities(const uint8_t *base, uint8_t *next, size_t n, uint8_t *delta,
                           uint8_t *dst) {
  static const double densities[] = {0, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 1};
  printf("\n%-9s %8s %9s %9s | %9s %9s %9s | %-9s %9s | %8s %6s %8s %6s | %5s\n",
         "pattern", "density", "changed", "blocks", "positions", "mask", "dense",
         "chosen", "size", "enc GB/s", "x copy", "dec GB/s", "x copy", "wrong");
  for (int pat = 0; pat < PATTERNS; pat++)
    for (size_t d = 0; d < sizeof(densities) / sizeof(densities[0]); d++) {
      make_change(base, next, n, (pattern_t)pat, densities[d]);
      double enc, dec;
      size_t len;
      refit_delta_stats_t st;
      const long long before = total_wrong;
      time_codec(next, base, n, delta, dst, &enc, &dec, &len, &st);
      const double nb = (double)((n + 31) / 32), fn = (double)n;
      printf(
          "%-9s %8.0e %9.2e %9.2e | %9.2e %9.2e %9.4f | %-9s %9.2e | %8.2f %6.2f %8.2f "
          "%6.2f | %5lld\n",
          pattern_names[pat], densities[d], (double)st.changed_bytes / fn,
          (double)st.changed_blocks / nb, (double)st.size[REFIT_DELTA_POSITIONS] / fn,
          (double)st.size[REFIT_DELTA_MASK] / fn, (double)st.size[REFIT_DELTA_DENSE] / fn,
          refit_delta_encoding_name(st.best), (double)len / fn, fn / enc / 1e9,
          fn / enc / 1e9 / copy_gbs, fn / dec / 1e9, fn / dec / 1e9 / copy_gbs,
          total_wrong - before);
    }
}

/* Measured size of encoding a minus encoding b at density p. */
static double size_gap(const uint8_t *base, uint8_t *next, size_t n, pattern_t pat,
                       double p, refit_delta_encoding_t a, refit_delta_encoding_t b) {
  make_change(base, next, n, pat, p);
  refit_delta_stats_t st;
  check(refit_delta_measure(next, base, n, &st), "measure");
  return (double)st.size[a] - (double)st.size[b];
}

/* The density in [1e-6, 1] where the gap changes sign (log bisection), or
 * -1 when it does not. */
static double break_even(const uint8_t *base, uint8_t *next, size_t n, pattern_t pat,
                         refit_delta_encoding_t a, refit_delta_encoding_t b) {
  double lo = log(1e-6), hi = 0;
  const double glo = size_gap(base, next, n, pat, exp(lo), a, b);
  const double ghi = size_gap(base, next, n, pat, exp(hi), a, b);
  if ((glo < 0) == (ghi < 0))
    return -1;
  for (int it = 0; it < 30; it++) {
    const double mid = 0.5 * (lo + hi);
    if ((size_gap(base, next, n, pat, exp(mid), a, b) < 0) == (glo < 0))
      lo = mid;
    else
      hi = mid;
  }
  return exp(0.5 * (lo + hi));
}

/* The model's sizes per chunk byte at density p (kernels/delta.h). */
static double model_size(pattern_t pat, refit_delta_encoding_t e, double p) {
  const double blocks = pat == BLOCKS ? p : 1.0 - pow(1.0 - p, 32);
  if (e == REFIT_DELTA_POSITIONS)
    return 5.0 * p;
  if (e == REFIT_DELTA_MASK)
    return 1.0 / 256 + blocks;
  return 1.0;
}

static double model_break_even(pattern_t pat, refit_delta_encoding_t a,
                               refit_delta_encoding_t b) {
  double lo = 1e-6, hi = 1;
  const double glo = model_size(pat, a, lo) - model_size(pat, b, lo);
  if ((glo < 0) == (model_size(pat, a, hi) - model_size(pat, b, hi) < 0))
    return -1;
  for (int it = 0; it < 100; it++) {
    const double mid = 0.5 * (lo + hi);
    if ((model_size(pat, a, mid) - model_size(pat, b, mid) < 0) == (glo < 0))
      lo = mid;
    else
      hi = mid;
  }
  return 0.5 * (lo + hi);
}

static void part_break_even(const uint8_t *base, uint8_t *next, size_t n) {
  static const refit_delta_encoding_t pairs[][2] = {
      {REFIT_DELTA_POSITIONS, REFIT_DELTA_MASK},
      {REFIT_DELTA_MASK, REFIT_DELTA_DENSE},
      {REFIT_DELTA_POSITIONS, REFIT_DELTA_DENSE}};
  printf("\nbreak-even densities (chunk of %.0f MiB; none: one is smaller at every "
         "density)\n",
         (double)n / 1048576);
  printf("%-9s %-18s %10s %10s\n", "pattern", "encodings", "measured", "model");
  for (int pat = 0; pat < PATTERNS; pat++)
    for (int k = 0; k < 3; k++) {
      char name[32], m[16], mm[16];
      snprintf(name, sizeof(name), "%s=%s", refit_delta_encoding_name(pairs[k][0]),
               refit_delta_encoding_name(pairs[k][1]));
      const double got =
          break_even(base, next, n, (pattern_t)pat, pairs[k][0], pairs[k][1]);
      const double want =
          pat == RUNS ? -2 : model_break_even((pattern_t)pat, pairs[k][0], pairs[k][1]);
      snprintf(m, sizeof(m), "%.3e", got);
      snprintf(mm, sizeof(mm), "%.3e", want);
      printf("%-9s %-18s %10s %10s\n", pattern_names[pat], name, got < 0 ? "none" : m,
             want == -2 ? "-"
             : want < 0 ? "none"
                        : mm);
    }
}

/* Version v (0 or 1) of the synthetic projection [rows, k] at update rate
 * `rate` into bf (parts 3 and 4). */
static void synth_version(int v, double rate, int64_t rows, int64_t k, uint16_t *bf) {
  const refit_synth_key_t key = {.key = refit_synth_mix(0x5eedull + (uint64_t)v),
                                 .master = refit_synth_mix(0x3a57e7ull),
                                 .rate = (float)rate,
                                 .norm = 0};
  refit_synth_rect(&key, k, 0, 0, rows, k, bf);
}

/* Part 3. */
static void part_synthetic(void) {
  const int64_t rows = 1024, k = 4096, nel = rows * k, ns = nel / 32;
  uint16_t *bf[2] = {xmalloc((size_t)nel * 2), xmalloc((size_t)nel * 2)};
  uint8_t *q[2] = {xmalloc((size_t)nel), xmalloc((size_t)nel)};
  uint8_t *sc[2] = {xmalloc((size_t)ns), xmalloc((size_t)ns)};
  uint8_t *delta = xmalloc((size_t)refit_delta_bound((uint64_t)nel * 2));
  static const double rates[] = {1e-5, 1e-4, 1e-3, 1e-2};
  printf("\nsynthetic versions 1 -> 2 of a [%lld, %lld] projection (source.update_rate): "
         "changed fractions, and deltas as a fraction of the tensor's bytes\n",
         (long long)rows, (long long)k);
  printf("%-8s %9s %9s %9s %9s | %-9s %9s | %-9s %9s | %9s | %-9s %9s\n", "rate", "bf16",
         "values", "scales", "blocks", "values", "delta", "scales", "delta", "mxfp8 wire",
         "bf16", "delta");
  for (size_t ri = 0; ri < sizeof(rates) / sizeof(rates[0]); ri++) {
    for (int v = 0; v < 2; v++) {
      synth_version(v, rates[ri], rows, k, bf[v]);
      check(refit_mxfp8_quantize_rows(bf[v], rows, k, k, q[v], k, sc[v], k / 32),
            "quantize");
    }
    refit_delta_stats_t sq, ss, sb;
    size_t lq, ls, lb;
    check(refit_delta_encode(q[1], q[0], (size_t)nel, REFIT_DELTA_AUTO, delta,
                             (size_t)refit_delta_bound((uint64_t)nel), &lq, &sq),
          "encode values");
    check(refit_delta_encode(sc[1], sc[0], (size_t)ns, REFIT_DELTA_AUTO, delta,
                             (size_t)refit_delta_bound((uint64_t)ns), &ls, &ss),
          "encode scales");
    check(refit_delta_encode(bf[1], bf[0], (size_t)nel * 2, REFIT_DELTA_AUTO, delta,
                             (size_t)refit_delta_bound((uint64_t)nel * 2), &lb, &sb),
          "encode bf16");
    int64_t bf_changed = 0;
    for (int64_t i = 0; i < nel; i++)
      bf_changed += bf[0][i] != bf[1][i];
    printf("%-8.0e %9.2e %9.2e %9.2e %9.2e | %-9s %9.2e | %-9s %9.2e | %9.2e | %-9s "
           "%9.2e\n",
           rates[ri], (double)bf_changed / (double)nel,
           (double)sq.changed_bytes / (double)nel, (double)ss.changed_bytes / (double)ns,
           (double)sq.changed_blocks / (double)(nel / 32),
           refit_delta_encoding_name(sq.best), (double)lq / (double)nel,
           refit_delta_encoding_name(ss.best), (double)ls / (double)ns,
           (double)(lq + ls) / (double)(nel + ns), refit_delta_encoding_name(sb.best),
           (double)lb / (double)(nel * 2));
  }
  for (int v = 0; v < 2; v++) {
    free(bf[v]);
    free(q[v]);
    free(sc[v]);
  }
  free(delta);
}

/* Part 4. */
static void part_block_wire(void) {
  const int64_t rows = 1024, k = 4096, nel = rows * k, slots = REFIT_BLOCK_WIRE_SLOTS(k);
  const int64_t rb = k + 4 * slots, chunk = 128 * rb, wire_bytes = rows * rb;
  uint16_t *bf = xmalloc((size_t)nel * 2);
  uint8_t *w[2] = {xmalloc((size_t)wire_bytes), xmalloc((size_t)wire_bytes)};
  uint8_t *one[2] = {xmalloc((size_t)wire_bytes), xmalloc((size_t)wire_bytes)};
  uint8_t *delta = xmalloc((size_t)refit_delta_bound((uint64_t)chunk));
  static const double rates[] = {1e-5, 1e-4, 1e-3, 1e-2};
  printf("\nblock FP8 wire chunks of the same projection (128 rows each, fp32 scales): "
         "changed scales, and deltas as a fraction of the wire bytes\n");
  printf("%-8s %9s | %12s %15s %9s\n", "rate", "scales", "every row", "first row only",
         "ratio");
  for (size_t ri = 0; ri < sizeof(rates) / sizeof(rates[0]); ri++) {
    for (int v = 0; v < 2; v++) {
      synth_version(v, rates[ri], rows, k, bf);
      const refit_pack_desc_t d = {.src = bf,
                                   .src_pitch = k * 2,
                                   .rows = rows,
                                   .cols = k,
                                   .row_bytes = rb,
                                   .op = REFIT_CHUNK_BLOCK_QUANTIZE,
                                   .fp8_scale = 0};
      check(refit_pack_rows(&d, 1, 0, w[v]), "pack");
      memcpy(one[v], w[v], (size_t)wire_bytes);
      for (int64_t r = 0; r < rows; r++)
        if (r % 128 != 0)
          memset(one[v] + r * rb + k, 0, (size_t)(4 * slots));
    }
    int64_t scales = 0;
    for (int64_t b = 0; b < rows / 128; b++)
      for (int64_t s = 0; s < slots; s++)
        scales += memcmp(w[0] + b * 128 * rb + k + 4 * s, w[1] + b * 128 * rb + k + 4 * s,
                         4) != 0;
    size_t every = 0, first = 0;
    for (int64_t c = 0; c < rows / 128; c++) {
      size_t len;
      check(refit_delta_encode(w[1] + c * chunk, w[0] + c * chunk, (size_t)chunk,
                               REFIT_DELTA_AUTO, delta,
                               (size_t)refit_delta_bound((uint64_t)chunk), &len, NULL),
            "encode wire");
      every += len;
      check(refit_delta_encode(one[1] + c * chunk, one[0] + c * chunk, (size_t)chunk,
                               REFIT_DELTA_AUTO, delta,
                               (size_t)refit_delta_bound((uint64_t)chunk), &len, NULL),
            "encode first rows");
      first += len;
    }
    printf("%-8.0e %9.2e | %12.2e %15.2e %9.3f\n", rates[ri],
           (double)scales / (double)(rows / 128 * slots),
           (double)every / (double)wire_bytes, (double)first / (double)wire_bytes,
           (double)every / (double)first);
  }
  free(bf);
  for (int v = 0; v < 2; v++) {
    free(w[v]);
    free(one[v]);
  }
  free(delta);
}

int main(int argc, char **argv) {
  const double mib = argc > 1 ? atof(argv[1]) : 64;
  if (!(mib > 0) || mib > 4095) {
    fprintf(stderr, "usage: %s [chunk MiB, 0 < MiB < 4096; default 64]\n", argv[0]);
    return 2;
  }
  const char *env = getenv("REFIT_BENCH_REPS");
  if (env != NULL && atoi(env) > 0)
    reps = atoi(env);
  const size_t n = (size_t)(mib * 1048576);
  uint8_t *base = xmalloc(n), *next = xmalloc(n), *dst = xmalloc(n);
  uint8_t *delta = xmalloc((size_t)refit_delta_bound(n));
  for (size_t i = 0; i < n; i++)
    base[i] = (uint8_t)(rnd() >> 56);
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double t = now_s();
    memcpy(dst, base, n);
    t = now_s() - t;
    best = t < best ? t : best;
  }
  copy_gbs = (double)n / best / 1e9;
  printf("refit-bench-delta: chunk %.0f MiB, best of %d, memcpy %.2f GB/s (chunk bytes / "
         "time)\n",
         mib, reps, copy_gbs);
  part_densities(base, next, n, delta, dst);
  part_break_even(base, next, n / 4);
  part_synthetic();
  part_block_wire();
  printf("\nwrong bytes: %lld\n", total_wrong);
  free(base);
  free(next);
  free(dst);
  free(delta);
  return total_wrong != 0;
}
