/*
 * refit-bench-delta-cuda: the delta codec's CUDA twin (kernels/delta_cuda.h)
 * on a batch of chunks of about 1 GiB in all (sizes drawn around the chunk
 * size, offsets multiples of 256), one call per pass, against cudaMemcpy
 * D2D of the whole batch in the same run.
 *
 * Changed bytes at densities 1e-4, 1e-3 and 1e-2 of the bytes, scattered
 * (every byte on its own) and in runs of 1 to 64 bytes; AUTO encoding.
 *
 * Bandwidths. The ceiling is cudaMemcpy D2D of the batch's bytes: read +
 * written bytes / time. Each pass has an HBM floor, the bytes it must move,
 * as time at the ceiling's bandwidth:
 *   encode  the new and base chunks read, the deltas written;
 *   apply   the deltas read, and the destination's changed 32-byte sectors
 *           written (a dense delta: the whole chunk).
 * "x floor" = time / floor time; the target is 1.5 or less. Times are the
 * best of REFIT_BENCH_REPS runs (default 10) after a warm-up, with CUDA
 * events; the destination is reset to the baseline between apply runs
 * (outside the timed span).
 *
 * Checks, so that no number comes from a wrong kernel: every chunk's delta
 * length and encoding equal refit_delta_measure's choice, a sample of 16
 * chunks' deltas equal refit_delta_encode's byte for byte, no chunk is
 * refused, and after apply the destination equals the new bytes on the GPU
 * (refit_compare_cuda). "wrong" sums the failures of a row; exit code 1 if
 * any.
 *
 * Usage: refit-bench-delta-cuda [total MiB, default 1024] [chunk MiB, default 4]
 */
#include "bench_cuda.h"
#include "bench_util.h"
#include "kernels/datapath_cuda.h"
#include "kernels/delta_cuda.h"

#include <math.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { return bench_rand(&rng); }

static size_t gap(double mean) { return bench_gap(&rng, mean); }

/* new = base with runs (1 byte when runs == 0, else 1 to 64) at geometric
 * gaps whose mean gives density p. */
static void make_change(const uint8_t *base, uint8_t *next, size_t n, int runs,
                        double p) {
  memcpy(next, base, n);
  const double gap_mean = (runs ? 32.5 : 1.0) * (1.0 - p) / p;
  for (size_t i = gap(gap_mean); i < n;) {
    const size_t run = runs ? 1 + (size_t)(rnd() % 64) : 1;
    for (size_t j = i; j < n && j < i + run; j++)
      next[j] = (uint8_t)(base[j] ^ (uint8_t)(1 + rnd() % 255));
    i += run + gap(gap_mean);
  }
}

static int reps = 10;
static cudaEvent_t e0, e1;

/* Best time in seconds of `n` runs of the enqueued work, after a warm-up;
 * `reset` (untimed) runs before each. */
typedef void (*work_fn)(void *ctx);
static double best_time(work_fn work, work_fn reset, void *ctx) {
  double best = 1e30;
  for (int r = 0; r < reps + 1; r++) {
    if (reset != NULL)
      reset(ctx);
    cudaEventRecord(e0, 0);
    work(ctx);
    cudaEventRecord(e1, 0);
    cuda_check(cudaEventSynchronize(e1), "a timed run");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (r > 0 && ms * 1e-3 < best)
      best = ms * 1e-3;
  }
  return best;
}

typedef struct {
  int64_t n;
  size_t total, out_total, ws_bytes;
  uint8_t *d_base, *d_next, *d_dst, *d_out;
  uint64_t *d_len;
  void *ws;
  int64_t *d_bad;
  int32_t *d_reason;
  refit_delta_cuda_enc_desc_t *d_enc;
  refit_delta_cuda_dec_desc_t *d_dec;
} ctx_t;

static void do_copy(void *p) {
  ctx_t *c = p;
  cudaMemcpyAsync(c->d_dst, c->d_next, c->total, cudaMemcpyDeviceToDevice, 0);
}
static void do_encode(void *p) {
  ctx_t *c = p;
  check(refit_delta_encode_cuda(c->d_enc, c->n, REFIT_DELTA_AUTO, c->d_out, c->d_len,
                                c->ws, c->ws_bytes, c->d_bad, c->d_reason, 0),
        "encode (cuda)");
}
static void do_reset(void *p) {
  ctx_t *c = p;
  cudaMemcpyAsync(c->d_dst, c->d_base, c->total, cudaMemcpyDeviceToDevice, 0);
}
static void do_apply(void *p) {
  ctx_t *c = p;
  check(refit_delta_apply_cuda(c->d_dec, c->n, c->ws, c->ws_bytes, c->d_bad, c->d_reason,
                               0),
        "apply (cuda)");
}

/* A refused chunk counts as one wrong value, named on stderr. */
static long long refused(const ctx_t *c, const char *what) {
  int64_t bad = 0;
  int32_t reason = 0;
  cuda_check(cudaMemcpy(&bad, c->d_bad, 8, cudaMemcpyDeviceToHost), "read bad chunk");
  cuda_check(cudaMemcpy(&reason, c->d_reason, 4, cudaMemcpyDeviceToHost), "read reason");
  if (bad < 0)
    return 0;
  fprintf(stderr, "%s: chunk %lld refused: %s\n", what, (long long)bad,
          refit_delta_cuda_reason_str(reason));
  return 1;
}

int main(int argc, char **argv) {
  const double total_mib = argc > 1 ? atof(argv[1]) : 1024;
  const double chunk_mib = argc > 2 ? atof(argv[2]) : 4;
  if (!(total_mib > 0) || !(chunk_mib > 0) || chunk_mib > 2048 || chunk_mib > total_mib) {
    fprintf(stderr, "usage: %s [total MiB, default 1024] [chunk MiB < 2048, default 4]\n",
            argv[0]);
    return 2;
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    fprintf(stderr, "refit-bench-delta-cuda: no GPU\n");
    return 2;
  }
  const char *env = getenv("REFIT_BENCH_REPS");
  if (env != NULL && atoi(env) > 0)
    reps = atoi(env);
  /* The batch: chunk sizes uniform in [chunk / 2, 3 chunk / 2), not
   * multiples of 32, each at a multiple of 256 in every buffer. */
  const size_t want_total = (size_t)(total_mib * 1048576),
               chunk = (size_t)(chunk_mib * 1048576);
  size_t cap = want_total / (chunk / 2) + 2;
  size_t *bytes = xmalloc(cap * sizeof(size_t)), *off = xmalloc(cap * sizeof(size_t));
  size_t *out_off = xmalloc(cap * sizeof(size_t));
  int64_t n = 0;
  size_t at = 0, out_at = 0, sum = 0;
  while (sum < want_total && (size_t)n < cap) {
    size_t b = (chunk / 2 + (size_t)(rnd() % (chunk > 1 ? chunk : 2))) | 1;
    if (sum + b > want_total)
      b = want_total - sum;
    bytes[n] = b;
    off[n] = at;
    out_off[n] = out_at;
    at = (at + b + 255) & ~(size_t)255;
    out_at = (out_at + (size_t)refit_delta_bound(b) + 255) & ~(size_t)255;
    sum += b;
    n++;
  }
  ctx_t c = {.n = n, .total = at, .out_total = out_at};
  c.ws_bytes = refit_delta_cuda_workspace(n, sum);
  uint8_t *base = xmalloc(at), *next = xmalloc(at);
  for (size_t i = 0; i + 8 <= at; i += 8) {
    const uint64_t r = rnd();
    memcpy(base + i, &r, 8);
  }
  memcpy(next, base, at); /* the gaps between chunks stay equal */
  c.d_base = dmalloc(at);
  c.d_next = dmalloc(at);
  c.d_dst = dmalloc(at);
  c.d_out = dmalloc(out_at);
  c.d_len = dmalloc(8 * (size_t)n);
  c.ws = dmalloc(c.ws_bytes);
  c.d_bad = dmalloc(8);
  c.d_reason = dmalloc(4);
  int64_t *d_count = dmalloc(16), *d_first = d_count + 1;
  refit_delta_cuda_enc_desc_t *enc = xmalloc(sizeof(*enc) * (size_t)n);
  refit_delta_cuda_dec_desc_t *dec = xmalloc(sizeof(*dec) * (size_t)n);
  uint64_t *len = xmalloc(8 * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    enc[i] = (refit_delta_cuda_enc_desc_t){.new_bytes = c.d_next + off[i],
                                           .base = c.d_base + off[i],
                                           .bytes = bytes[i],
                                           .out_off = out_off[i],
                                           .cap = refit_delta_bound(bytes[i])};
    dec[i] = (refit_delta_cuda_dec_desc_t){
        .delta = c.d_out + out_off[i], .dst = c.d_dst + off[i], .dst_bytes = bytes[i]};
  }
  c.d_enc = dmalloc(sizeof(*enc) * (size_t)n);
  c.d_dec = dmalloc(sizeof(*dec) * (size_t)n);
  cuda_check(cudaMemcpy(c.d_enc, enc, sizeof(*enc) * (size_t)n, cudaMemcpyHostToDevice),
             "upload table");
  cuda_check(cudaMemcpy(c.d_base, base, at, cudaMemcpyHostToDevice), "upload base");
  cuda_check(cudaEventCreate(&e0), "event");
  cuda_check(cudaEventCreate(&e1), "event");

  const double t_copy = best_time(do_copy, NULL, &c);
  const double ceiling = 2.0 * (double)at / t_copy; /* bytes/s, read + written */
  int dev = 0;
  struct cudaDeviceProp prop;
  cudaGetDevice(&dev);
  cudaGetDeviceProperties(&prop, dev);
  printf("refit-bench-delta-cuda: %s, %lld chunks, %.1f MiB in all (%.1f MiB each on "
         "average), best of %d\n",
         prop.name, (long long)n, (double)sum / 1048576,
         (double)sum / 1048576 / (double)n, reps);
  printf("cudaMemcpy D2D of the batch: %.3f ms, %.1f GB/s read + written (the ceiling)\n",
         t_copy * 1e3, ceiling / 1e9);
  printf("\n%-9s %8s | %9s %9s %-13s | %9s %9s %6s | %9s %9s %6s | %5s\n", "pattern",
         "density", "changed", "delta MiB", "pos/mask/den", "enc us", "floor us", "x",
         "apply us", "floor us", "x", "wrong");

  static const double densities[] = {1e-4, 1e-3, 1e-2};
  long long total_wrong = 0;
  for (int runs = 0; runs < 2; runs++)
    for (size_t di = 0; di < sizeof(densities) / sizeof(densities[0]); di++) {
      const double p = densities[di];
      long long wrong = 0;
      for (int64_t i = 0; i < n; i++)
        make_change(base + off[i], next + off[i], bytes[i], runs, p);
      cuda_check(cudaMemcpy(c.d_next, next, at, cudaMemcpyHostToDevice), "upload new");
      const double t_enc = best_time(do_encode, NULL, &c);
      wrong += refused(&c, "encode");
      cuda_check(cudaMemcpy(len, c.d_len, 8 * (size_t)n, cudaMemcpyDeviceToHost),
                 "lengths");
      for (int64_t i = 0; i < n; i++)
        dec[i].delta_len = len[i];
      cuda_check(
          cudaMemcpy(c.d_dec, dec, sizeof(*dec) * (size_t)n, cudaMemcpyHostToDevice),
          "upload table");
      /* Every chunk's length and encoding against the C reference's choice,
       * a sample's bytes against its delta, and the floors' byte counts. */
      double delta_bytes = 0, written = 0, changed = 0;
      int64_t by_enc[REFIT_DELTA_ENCODINGS] = {0};
      for (int64_t i = 0; i < n; i++) {
        refit_delta_stats_t st;
        check(refit_delta_measure(next + off[i], base + off[i], bytes[i], &st),
              "measure");
        uint8_t head[16];
        cuda_check(cudaMemcpy(head, c.d_out + out_off[i], 16, cudaMemcpyDeviceToHost),
                   "header");
        if (len[i] != st.size[REFIT_DELTA_AUTO] || head[4] != (uint8_t)st.best) {
          if (wrong < 5)
            fprintf(stderr, "chunk %lld: GPU %s of %llu bytes, C %s of %llu\n",
                    (long long)i,
                    refit_delta_encoding_name((refit_delta_encoding_t)head[4]),
                    (unsigned long long)len[i], refit_delta_encoding_name(st.best),
                    (unsigned long long)st.size[REFIT_DELTA_AUTO]);
          wrong++;
        }
        by_enc[st.best]++;
        delta_bytes += (double)len[i];
        changed += (double)st.changed_bytes;
        written += st.best == REFIT_DELTA_DENSE ? (double)bytes[i]
                                                : 32.0 * (double)st.changed_blocks;
      }
      for (int s = 0; s < 16; s++) {
        const int64_t i = s == 0 ? 0 : s == 15 ? n - 1 : (int64_t)(rnd() % (uint64_t)n);
        const size_t bound = (size_t)refit_delta_bound(bytes[i]);
        uint8_t *want = xmalloc(bound), *got = xmalloc(bound);
        size_t wl = 0;
        check(refit_delta_encode(next + off[i], base + off[i], bytes[i], REFIT_DELTA_AUTO,
                                 want, bound, &wl, NULL),
              "encode (C)");
        cuda_check(cudaMemcpy(got, c.d_out + out_off[i], wl, cudaMemcpyDeviceToHost),
                   "delta");
        if (wl != len[i] || memcmp(got, want, wl) != 0) {
          fprintf(stderr, "chunk %lld: the GPU delta differs from the C reference's\n",
                  (long long)i);
          wrong++;
        }
        free(want);
        free(got);
      }
      const double t_apply = best_time(do_apply, do_reset, &c);
      wrong += refused(&c, "apply");
      const int64_t zero[2] = {0, INT64_MAX};
      cuda_check(cudaMemcpy(d_count, zero, 16, cudaMemcpyHostToDevice), "reset compare");
      check(refit_compare_cuda(c.d_dst, c.d_next, at, 1, d_count, d_first, 0), "compare");
      int64_t diff[2];
      cuda_check(cudaMemcpy(diff, d_count, 16, cudaMemcpyDeviceToHost), "compare result");
      if (diff[0] != 0)
        fprintf(stderr, "apply: %lld bytes differ from the new ones, the first at %lld\n",
                (long long)diff[0], (long long)diff[1]);
      wrong += diff[0];
      const double f_enc = (2.0 * (double)sum + delta_bytes) / ceiling;
      const double f_apply = (delta_bytes + written) / ceiling;
      char mix[32];
      snprintf(mix, sizeof(mix), "%lld/%lld/%lld",
               (long long)by_enc[REFIT_DELTA_POSITIONS],
               (long long)by_enc[REFIT_DELTA_MASK], (long long)by_enc[REFIT_DELTA_DENSE]);
      printf("%-9s %8.0e | %9.2e %9.2f %-13s | %9.1f %9.1f %6.2f | %9.1f %9.1f %6.2f | "
             "%5lld\n",
             runs ? "runs" : "scattered", p, changed / (double)sum, delta_bytes / 1048576,
             mix, t_enc * 1e6, f_enc * 1e6, t_enc / f_enc, t_apply * 1e6, f_apply * 1e6,
             t_apply / f_apply, wrong);
      total_wrong += wrong;
    }
  printf("\nfloors: encode = new + base read + deltas written; apply = deltas read + "
         "changed "
         "32-byte sectors written; at the D2D ceiling's bandwidth. Target: x <= 1.5\n");
  printf("wrong: %lld\n", total_wrong);
  free(base);
  free(next);
  free(bytes);
  free(off);
  free(out_off);
  free(enc);
  free(dec);
  free(len);
  return total_wrong != 0;
}
