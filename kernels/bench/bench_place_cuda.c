/*
 * refit-bench-place-cuda: deltas applied through their places on a GPU
 * (kernels/place_cuda.h), the generator's side of a delta refit, on one MoE
 * w13 tensor of about 1 GiB in the flashinfer_trtllm layout (row
 * permutation and 128x4 scale swizzle), cut into one chunk per expert, all
 * applied in one batch; against cudaMemcpy D2D of the tensor in the same
 * run.
 *
 * Per density (1e-4, 1e-3, 1e-2 of the wire bytes changed, scattered; the
 * trailer resealed) the deltas are the C encoder's (AUTO), and the table is:
 *   check    the check kernel (reads each delta and the bytes it names);
 *   write    the write kernel with the undo log (what a sync refit with
 *            restore: full runs);
 *   call     the whole step as the generator takes it, timed on the host:
 *            the tiles made on the host, tables uploaded, check, outputs
 *            read back, write, outputs read back (two synchronizations).
 * The floor is the bytes the apply must move: the deltas read once and the
 * runtime's changed 32-byte sectors written, at the D2D ceiling's
 * bandwidth. Times are the best of REFIT_BENCH_REPS runs (default 10)
 * after a warm-up; storage is reset between runs, untimed.
 *
 * Checks, so that no number comes from a wrong kernel: no chunk refused,
 * each chunk's changed count, digest change and trailer equal the C check's
 * (kernels/place.h), and after the write the whole tensor equals the C
 * write's result on a host copy. "wrong" counts failures; exit 1 if any.
 *
 * Usage: refit-bench-place-cuda [experts, default 64] [K, default 4096]
 */
#include "bench_cuda.h"
#include "bench_util.h"
#include "core/digest.h"
#include "kernels/delta.h"
#include "kernels/place_cuda.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) { return bench_rand(&rng); }

static int reps = 10;
static cudaEvent_t e0, e1;

typedef struct {
  int64_t n, ntiles;
  size_t store_bytes;
  uint8_t *d_store, *d_base; /* runtime storage, and its baseline copy */
  refit_place_cuda_chunk_t *chunks, *d_chunks;
  refit_place_cuda_tile_t *tiles, *d_tiles;
  refit_place_cuda_out_t *outs, *d_outs;
  unsigned long long *d_err, *d_next;
  uint64_t *d_undo_at;
  uint8_t *d_undo_old;
  const void **hosts;
} ctx_t;

static void reset_outs(ctx_t *c) {
  for (int64_t i = 0; i < c->n; i++)
    c->outs[i] = (refit_place_cuda_out_t){.trailer = c->chunks[i].old_trailer};
  cuda_check(cudaMemcpy(c->d_outs, c->outs, (size_t)c->n * sizeof(*c->outs),
                        cudaMemcpyHostToDevice),
             "outputs");
  cuda_check(cudaMemset(c->d_err, 0xff, 8), "error key");
  cuda_check(cudaMemset(c->d_next, 0, 8), "undo counter");
}

static void reset_store(ctx_t *c) {
  cuda_check(cudaMemcpy(c->d_store, c->d_base, c->store_bytes, cudaMemcpyDeviceToDevice),
             "reset storage");
}

static double timed(ctx_t *c, int write) {
  double best = 1e30;
  for (int r = 0; r < reps + 1; r++) {
    reset_store(c);
    reset_outs(c);
    cuda_check(cudaEventRecord(e0, 0), "event");
    if (write)
      check(refit_place_write_cuda(c->d_chunks, c->d_tiles, c->ntiles, c->d_outs,
                                   c->d_undo_at, c->d_undo_old, c->d_next, 0),
            "write");
    else
      check(refit_place_check_cuda(c->d_chunks, c->d_tiles, c->ntiles, c->d_outs,
                                   c->d_err, 0),
            "check");
    cuda_check(cudaEventRecord(e1, 0), "event");
    cuda_check(cudaEventSynchronize(e1), "a timed run");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (r > 0 && ms * 1e-3 < best)
      best = ms * 1e-3;
  }
  return best;
}

/* The generator's whole step, on the host clock. */
static double timed_call(ctx_t *c) {
  double best = 1e30;
  for (int r = 0; r < reps + 1; r++) {
    reset_store(c);
    cuda_check(cudaDeviceSynchronize(), "sync");
    const double t0 = now_s();
    int64_t at = 0;
    for (int64_t i = 0; i < c->n; i++) {
      int64_t t = 0;
      check(refit_place_cuda_tiles(&c->chunks[i], i, c->hosts[i], c->tiles + at, &t),
            "tiles");
      at += t;
    }
    for (int64_t i = 0; i < c->n; i++)
      c->outs[i] = (refit_place_cuda_out_t){.trailer = c->chunks[i].old_trailer};
    cuda_check(cudaMemcpyAsync(c->d_chunks, c->chunks, (size_t)c->n * sizeof(*c->chunks),
                               cudaMemcpyHostToDevice, 0),
               "tables");
    cuda_check(cudaMemcpyAsync(c->d_tiles, c->tiles, (size_t)at * sizeof(*c->tiles),
                               cudaMemcpyHostToDevice, 0),
               "tiles");
    cuda_check(cudaMemcpyAsync(c->d_outs, c->outs, (size_t)c->n * sizeof(*c->outs),
                               cudaMemcpyHostToDevice, 0),
               "outputs");
    cuda_check(cudaMemsetAsync(c->d_err, 0xff, 8, 0), "error key");
    cuda_check(cudaMemsetAsync(c->d_next, 0, 8, 0), "undo counter");
    check(refit_place_check_cuda(c->d_chunks, c->d_tiles, at, c->d_outs, c->d_err, 0),
          "check");
    cuda_check(cudaMemcpyAsync(c->outs, c->d_outs, (size_t)c->n * sizeof(*c->outs),
                               cudaMemcpyDeviceToHost, 0),
               "read back");
    cuda_check(cudaStreamSynchronize(0), "sync");
    check(refit_place_write_cuda(c->d_chunks, c->d_tiles, at, c->d_outs, c->d_undo_at,
                                 c->d_undo_old, c->d_next, 0),
          "write");
    cuda_check(cudaMemcpyAsync(c->outs, c->d_outs, (size_t)c->n * sizeof(*c->outs),
                               cudaMemcpyDeviceToHost, 0),
               "read back");
    cuda_check(cudaStreamSynchronize(0), "sync");
    const double t = now_s() - t0;
    if (r > 0 && t < best)
      best = t;
  }
  return best;
}

int main(int argc, char **argv) {
  const int64_t experts = argc > 1 ? atoll(argv[1]) : 64;
  const int64_t k = argc > 2 ? atoll(argv[2]) : 4096;
  const char *env = getenv("REFIT_BENCH_REPS");
  if (env != NULL && atoi(env) > 0)
    reps = atoi(env);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    fprintf(stderr, "refit-bench-place-cuda: no GPU\n");
    return 2;
  }
  /* The tensor: MoE w13, gated, intermediate 1024 (2048 rows an expert). */
  const refit_kernels_moe_shape_t shape = {experts, k, 1024, 1};
  refit_kernels_moe_sizes_t sz;
  check(refit_kernels_moe_check_shape(&shape, "bench", &sz), "shape");
  const size_t wbytes = (size_t)sz.w13_weight, sbytes = (size_t)sz.w13_weight_scale;
  ctx_t c = {.n = experts, .store_bytes = wbytes + sbytes};
  uint8_t *store = xmalloc(c.store_bytes), *ref = xmalloc(c.store_bytes);
  for (size_t i = 0; i + 8 <= c.store_bytes; i += 8) {
    const uint64_t r = rnd();
    memcpy(store + i, &r, 8);
  }
  c.d_store = dmalloc(c.store_bytes);
  c.d_base = dmalloc(c.store_bytes);
  cuda_check(cudaMemcpy(c.d_base, store, c.store_bytes, cudaMemcpyHostToDevice),
             "upload");
  refit_place_tensor_t ht, dt;
  check(refit_place_moe_tensor(&shape, REFIT_KERNELS_MOE_W13, store, store + wbytes, &ht),
        "host place");
  check(refit_place_moe_tensor(&shape, REFIT_KERNELS_MOE_W13, c.d_store,
                               c.d_store + wbytes, &dt),
        "device place");
  const int64_t rows = 2 * shape.intermediate;
  refit_place_chunk_t *pc = xmalloc((size_t)experts * sizeof(*pc));
  const int64_t row_bytes = k + k / 32, len = rows * row_bytes, span = len + 8;
  uint8_t *a = xmalloc((size_t)span), *b = xmalloc((size_t)span);
  uint8_t *deltas = xmalloc((size_t)experts * (size_t)refit_delta_bound((uint64_t)span));
  size_t *doff = xmalloc((size_t)experts * sizeof(size_t));
  size_t *dlen = xmalloc((size_t)experts * sizeof(size_t));
  uint64_t *sum_a = xmalloc((size_t)experts * 8),
           *trailer_a = xmalloc((size_t)experts * 8);
  c.chunks = xmalloc((size_t)experts * sizeof(*c.chunks));
  c.outs = xmalloc((size_t)experts * sizeof(*c.outs));
  c.hosts = xmalloc((size_t)experts * sizeof(*c.hosts));
  c.d_chunks = dmalloc((size_t)experts * sizeof(*c.chunks));
  c.d_outs = dmalloc((size_t)experts * sizeof(*c.outs));
  c.d_err = dmalloc(8);
  c.d_next = dmalloc(8);
  uint8_t *d_deltas =
      dmalloc((size_t)experts * (size_t)refit_delta_bound((uint64_t)span));
  c.d_undo_at = dmalloc(8 * (size_t)span * (size_t)experts / 50 + 64);
  c.d_undo_old = dmalloc((size_t)span * (size_t)experts / 50 + 64);
  uint8_t *sector = xmalloc(c.store_bytes / 32 + 1);
  cuda_check(cudaEventCreate(&e0), "event");
  cuda_check(cudaEventCreate(&e1), "event");

  /* The ceiling. */
  double t_copy = 1e30;
  for (int r = 0; r < reps + 1; r++) {
    cudaEventRecord(e0, 0);
    cudaMemcpyAsync(c.d_store, c.d_base, c.store_bytes, cudaMemcpyDeviceToDevice, 0);
    cudaEventRecord(e1, 0);
    cuda_check(cudaEventSynchronize(e1), "copy");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (r > 0 && ms * 1e-3 < t_copy)
      t_copy = ms * 1e-3;
  }
  const double ceiling = 2.0 * (double)c.store_bytes / t_copy;
  struct cudaDeviceProp prop;
  int dev = 0;
  cudaGetDevice(&dev);
  cudaGetDeviceProperties(&prop, dev);
  printf("refit-bench-place-cuda: %s, MoE w13 trtllm [%lld experts, %lld rows, K %lld], "
         "%.1f MiB of storage, %lld chunks of %.2f MiB, best of %d\n",
         prop.name, (long long)experts, (long long)rows, (long long)k,
         (double)c.store_bytes / 1048576, (long long)experts, (double)span / 1048576,
         reps);
  printf(
      "cudaMemcpy D2D of the storage: %.3f ms, %.1f GB/s read + written (the ceiling)\n",
      t_copy * 1e3, ceiling / 1e9);
  printf("\n%8s | %10s %9s %6s %9s | %9s %9s %9s %9s | %6s %6s | %5s\n", "density",
         "changed", "sectors", "tiles", "delta MiB", "check us", "write us", "call us",
         "floor us", "x k+w", "x call", "wrong");

  static const double densities[] = {1e-4, 1e-3, 1e-2};
  long long total_wrong = 0;
  for (size_t di = 0; di < sizeof(densities) / sizeof(densities[0]); di++) {
    const double p = densities[di];
    long long wrong = 0;
    memcpy(ref, store, c.store_bytes);
    memset(sector, 0, c.store_bytes / 32 + 1);
    size_t at = 0;
    double changed = 0, sectors = 0;
    c.ntiles = 0;
    for (int64_t e = 0; e < experts; e++) {
      check(refit_place_chunk(&ht, e * rows, 0, rows, k, &pc[e]), "chunk");
      for (int64_t off = 0; off < len;) { /* A: the wire bytes storage holds */
        int64_t run = 0;
        const uint8_t *src = refit_place_addr(&pc[e], off, &run);
        memcpy(a + off, src, (size_t)run);
        off += run;
      }
      memcpy(b, a, (size_t)len);
      const double gap_mean = (1.0 - p) / p;
      for (size_t i = bench_gap(&rng, gap_mean); i < (size_t)len;
           i += 1 + bench_gap(&rng, gap_mean))
        b[i] ^= (uint8_t)(1 + rnd() % 255);
      sum_a[e] = refit_digest64(a, (size_t)len);
      trailer_a[e] = sum_a[e] + rnd();
      const uint64_t trailer_b = refit_digest64(b, (size_t)len) + rnd();
      for (int i = 0; i < 8; i++) {
        a[len + i] = (uint8_t)(trailer_a[e] >> (8 * i));
        b[len + i] = (uint8_t)(trailer_b >> (8 * i));
      }
      doff[e] = at;
      check(refit_delta_encode(b, a, (size_t)span, REFIT_DELTA_AUTO, deltas + at,
                               (size_t)refit_delta_bound((uint64_t)span), &dlen[e], NULL),
            "encode");
      for (int64_t off = 0; off < len; off++)
        if (a[off] != b[off]) {
          const size_t s = (size_t)(refit_place_addr(&pc[e], off, NULL) - store) / 32;
          sectors += !sector[s];
          sector[s] = 1;
          changed++;
        }
      c.chunks[e] = (refit_place_cuda_chunk_t){
          dt,      e * rows, 0, rows,        k, row_bytes, d_deltas + at,
          dlen[e], 0,        8, trailer_a[e]};
      c.hosts[e] = deltas + at;
      int64_t t = 0;
      check(refit_place_cuda_tiles(&c.chunks[e], e, c.hosts[e], NULL, &t), "tiles");
      c.ntiles += t;
      at += dlen[e];
    }
    cuda_check(cudaMemcpy(d_deltas, deltas, at, cudaMemcpyHostToDevice), "deltas");
    free(c.tiles);
    c.tiles = xmalloc((size_t)c.ntiles * sizeof(*c.tiles));
    if (c.d_tiles != NULL)
      cudaFree(c.d_tiles);
    c.d_tiles = dmalloc((size_t)c.ntiles * sizeof(*c.tiles));
    for (int64_t e = 0, t0 = 0; e < experts; e++) {
      int64_t t = 0;
      check(refit_place_cuda_tiles(&c.chunks[e], e, c.hosts[e], c.tiles + t0, &t),
            "tiles");
      t0 += t;
    }
    cuda_check(cudaMemcpy(c.d_chunks, c.chunks, (size_t)experts * sizeof(*c.chunks),
                          cudaMemcpyHostToDevice),
               "tables");
    cuda_check(cudaMemcpy(c.d_tiles, c.tiles, (size_t)c.ntiles * sizeof(*c.tiles),
                          cudaMemcpyHostToDevice),
               "tiles");
    if (changed > (double)span * (double)experts / 50) {
      fprintf(stderr, "undo log too small for %.0f changed bytes\n", changed);
      return 2;
    }
    const double t_check = timed(&c, 0);
    unsigned long long key = 0;
    cuda_check(cudaMemcpy(&key, c.d_err, 8, cudaMemcpyDeviceToHost), "error key");
    cuda_check(cudaMemcpy(c.outs, c.d_outs, (size_t)experts * sizeof(*c.outs),
                          cudaMemcpyDeviceToHost),
               "outputs");
    if (key != ~0ull) {
      int64_t bad = -1;
      (void)refit_place_cuda_report(key, &bad);
      fprintf(stderr, "chunk %lld refused: %s\n", (long long)bad, refit_last_error());
      wrong++;
    }
    /* The C reference on the host copy: check, then write. */
    for (int64_t e = 0; e < experts; e++) {
      refit_place_chunk_t rc = pc[e];
      refit_place_tensor_t rt = ht;
      rt.values = ref + (ht.values - store);
      rt.scales = ref + (ht.scales - store);
      rc.t = &rt;
      refit_place_delta_t r;
      check(refit_place_delta_check(&rc, 8, sum_a[e], trailer_a[e], deltas + doff[e],
                                    dlen[e], 0, &r),
            "C check");
      if (r.changed != c.outs[e].changed || r.sum != sum_a[e] + c.outs[e].sum ||
          r.trailer != c.outs[e].trailer) {
        if (wrong < 5)
          fprintf(stderr, "chunk %lld: the GPU check differs from the C check\n",
                  (long long)e);
        wrong++;
      }
      uint64_t w = 0;
      check(refit_place_delta_write(&rc, 8, deltas + doff[e], dlen[e], 0, NULL, NULL, &w),
            "C write");
    }
    const double t_write = timed(&c, 1);
    uint8_t *got = xmalloc(c.store_bytes);
    cuda_check(cudaMemcpy(got, c.d_store, c.store_bytes, cudaMemcpyDeviceToHost),
               "storage");
    if (memcmp(got, ref, c.store_bytes) != 0) {
      fprintf(stderr, "storage after the GPU write differs from the C write's\n");
      wrong++;
    }
    free(got);
    const double t_call = timed_call(&c);
    const double floor_s = ((double)at + 32.0 * sectors) / ceiling;
    printf("%8.0e | %10.0f %9.0f %6lld %9.2f | %9.1f %9.1f %9.1f %9.1f | %6.1f %6.1f | "
           "%5lld\n",
           p, changed, sectors, (long long)c.ntiles, (double)at / 1048576, t_check * 1e6,
           t_write * 1e6, t_call * 1e6, floor_s * 1e6, (t_check + t_write) / floor_s,
           t_call / floor_s, wrong);
    total_wrong += wrong;
  }
  printf(
      "\nfloor: the deltas read once + the changed 32-byte sectors of storage written, "
      "at the D2D ceiling's bandwidth; x k+w = (check + write kernels) / floor, x call "
      "= the whole step (tiles, uploads, both kernels, two read-backs) / floor\n");
  printf("wrong: %lld\n", total_wrong);
  return total_wrong != 0;
}
