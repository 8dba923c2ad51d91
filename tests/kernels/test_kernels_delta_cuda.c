/*
 * The delta codec's CUDA twin (kernels/delta_cuda.h) == its C reference
 * (kernels/delta.h), byte for byte: batches of chunks of 0, 1, 31, 32, 33
 * bytes up to several MiB, at densities 0 to 1 (scattered and clustered),
 * every encoding forced and AUTO, chunks and deltas at aligned and
 * misaligned addresses, and a batch of hundreds of chunks of mixed sizes in
 * one call. Each GPU delta equals the C delta (bytes and length); the GPU
 * applies its own deltas and the C ones, the C decoder applies the GPU ones,
 * all giving the new bytes. Every malformed delta the C decoder refuses is
 * refused on the GPU with the first bad chunk and its reason, and no byte of
 * any destination of the call changes; encode's own errors (capacity, a
 * chunk too large, NULL inputs, a small workspace) write nothing either.
 * Exits 77 (skipped) without a GPU.
 */
#include "kernels/delta_cuda.h"
#include "kernels_test.h"

#include "refit/status.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

#define CK(call) assert_int_equal((int)(call), (int)cudaSuccess)

static void *dev_alloc(size_t n) {
  void *d = NULL;
  CK(cudaMalloc(&d, n > 0 ? n : 1));
  CK(cudaMemset(d, 0, n > 0 ? n : 1));
  return d;
}

static void *dev_copy(const void *host, size_t n) {
  void *d = dev_alloc(n);
  if (n > 0)
    CK(cudaMemcpy(d, host, n, cudaMemcpyHostToDevice));
  return d;
}

static void *host_copy(const void *dev, size_t n) {
  void *h = malloc(n > 0 ? n : 1);
  CK(cudaDeviceSynchronize());
  if (n > 0)
    CK(cudaMemcpy(h, dev, n, cudaMemcpyDeviceToHost));
  return h;
}

static size_t round16(size_t x) { return (x + 15) & ~(size_t)15; }

/* A call's workspace and error outputs (device). */
typedef struct {
  void *ws;
  size_t ws_bytes;
  int64_t *bad;
  int32_t *reason;
} call_t;

static call_t call_open(size_t ws_bytes) {
  call_t c = {dev_alloc(ws_bytes), ws_bytes, dev_alloc(8), dev_alloc(4)};
  return c;
}

/* Wait for the call, read its error outputs, free the lot. */
static void call_close(call_t *c, int64_t *bad, int32_t *reason) {
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(bad, c->bad, 8, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(reason, c->reason, 4, cudaMemcpyDeviceToHost));
  CK(cudaFree(c->ws));
  CK(cudaFree(c->bad));
  CK(cudaFree(c->reason));
}

/* ---- Inputs ------------------------------------------------------------- */

/* new = base with a fraction `density` of its bytes changed (each to another
 * value), scattered or clustered (runs of 1 to 64 bytes); density >= 1
 * changes every byte. Positions are drawn with replacement, so a little
 * under the fraction changes. */
static void make_change(const uint8_t *base, uint8_t *next, size_t n, double density,
                        int clustered) {
  if (n == 0)
    return;
  memcpy(next, base, n);
  if (density <= 0)
    return;
  if (density >= 1) {
    for (size_t i = 0; i < n; i++)
      next[i] = (uint8_t)(base[i] ^ (uint8_t)kt_rand_range(1, 255));
    return;
  }
  size_t want = (size_t)(density * (double)n + 0.5);
  if (want == 0)
    want = kt_rand() % 2; /* 1e-5 of a small chunk: 0 or 1 */
  for (size_t done = 0; done < want;) {
    const size_t at = (size_t)kt_rand_range(0, (int64_t)n - 1);
    const size_t run = clustered ? (size_t)kt_rand_range(1, 64) : 1;
    for (size_t i = at; i < n && i < at + run && done < want; i++, done++)
      next[i] = (uint8_t)(base[i] ^ (uint8_t)kt_rand_range(1, 255));
  }
}

/* A batch of chunks: host copies, and device copies at in_off[i] of one
 * buffer per side (some chunks misaligned on purpose). */
typedef struct {
  int64_t n;
  size_t *bytes, *in_off, in_total, total_bytes;
  uint8_t **base, **next;
  uint8_t *d_base, *d_next;
} batch_t;

static size_t misalign(int64_t i) { return i % 5 == 4 ? (size_t)(1 + i % 15) : 0; }

static void batch_create(batch_t *b, int64_t n, const size_t *bytes,
                         const double *density, const int *clustered) {
  b->n = n;
  b->bytes = malloc(sizeof(size_t) * (size_t)n);
  b->in_off = malloc(sizeof(size_t) * (size_t)n);
  b->base = malloc(sizeof(uint8_t *) * (size_t)n);
  b->next = malloc(sizeof(uint8_t *) * (size_t)n);
  size_t at = 0;
  b->total_bytes = 0;
  for (int64_t i = 0; i < n; i++) {
    b->bytes[i] = bytes[i];
    b->in_off[i] = at + misalign(i);
    at = round16(b->in_off[i] + bytes[i]);
    b->total_bytes += bytes[i];
    b->base[i] = malloc(bytes[i] + 1);
    b->next[i] = malloc(bytes[i] + 1);
    kt_fill_bytes(b->base[i], bytes[i] + 1);
    make_change(b->base[i], b->next[i], bytes[i], density[i], clustered[i]);
  }
  b->in_total = at;
  uint8_t *hb = calloc(at + 1, 1), *hn = calloc(at + 1, 1);
  for (int64_t i = 0; i < n; i++) {
    memcpy(hb + b->in_off[i], b->base[i], b->bytes[i]);
    memcpy(hn + b->in_off[i], b->next[i], b->bytes[i]);
  }
  b->d_base = dev_copy(hb, at);
  b->d_next = dev_copy(hn, at);
  free(hb);
  free(hn);
}

static void batch_destroy(batch_t *b) {
  for (int64_t i = 0; i < b->n; i++) {
    free(b->base[i]);
    free(b->next[i]);
  }
  free(b->bytes);
  free(b->in_off);
  free(b->base);
  free(b->next);
  CK(cudaFree(b->d_base));
  CK(cudaFree(b->d_next));
}

/* The room a delta of `bytes` takes at most in encoding e. */
static size_t room(size_t bytes, refit_delta_encoding_t e) {
  if (e == REFIT_DELTA_POSITIONS)
    return 16 + 5 * bytes;
  if (e == REFIT_DELTA_MASK)
    return 16 + ((bytes + 31) / 32 + 7) / 8 + bytes;
  return (size_t)refit_delta_bound(bytes);
}

/* A set of deltas in one host buffer (and its device copy). */
typedef struct {
  int64_t n;
  size_t *off, *len, total;
  uint8_t *host;
} deltas_t;

static void deltas_free(deltas_t *d) {
  free(d->off);
  free(d->len);
  free(d->host);
}

/* The C reference's deltas of the batch. */
static void c_encode(const batch_t *b, refit_delta_encoding_t e, deltas_t *out) {
  out->n = b->n;
  out->off = malloc(sizeof(size_t) * (size_t)b->n);
  out->len = malloc(sizeof(size_t) * (size_t)b->n);
  size_t at = 0;
  for (int64_t i = 0; i < b->n; i++) {
    out->off[i] = at + misalign(i + 2);
    at = round16(out->off[i] + room(b->bytes[i], e));
  }
  out->total = at;
  out->host = calloc(at + 1, 1);
  for (int64_t i = 0; i < b->n; i++)
    assert_int_equal(refit_delta_encode(b->next[i], b->base[i], b->bytes[i], e,
                                        out->host + out->off[i], room(b->bytes[i], e),
                                        &out->len[i], NULL),
                     REFIT_OK);
}

/* The GPU's deltas of the batch at the C deltas' offsets (same caps). */
static void gpu_encode(const batch_t *b, refit_delta_encoding_t e, const deltas_t *like,
                       deltas_t *out, int64_t *bad, int32_t *reason) {
  const int64_t n = b->n;
  refit_delta_cuda_enc_desc_t *t = malloc(sizeof(*t) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) {
    t[i].new_bytes = b->d_next + b->in_off[i];
    t[i].base = b->d_base + b->in_off[i];
    t[i].bytes = b->bytes[i];
    t[i].out_off = like->off[i];
    t[i].cap = room(b->bytes[i], e);
  }
  void *dt = dev_copy(t, sizeof(*t) * (size_t)n);
  uint8_t *dout = dev_alloc(like->total);
  uint64_t *dlen = dev_alloc(8 * (size_t)n);
  call_t c = call_open(refit_delta_cuda_workspace(n, b->total_bytes));
  assert_int_equal(
      refit_delta_encode_cuda(dt, n, e, dout, dlen, c.ws, c.ws_bytes, c.bad, c.reason, 0),
      REFIT_OK);
  call_close(&c, bad, reason);
  uint64_t *len = host_copy(dlen, 8 * (size_t)n);
  out->n = n;
  out->off = malloc(sizeof(size_t) * (size_t)n);
  out->len = malloc(sizeof(size_t) * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    out->off[i] = like->off[i];
    out->len[i] = (size_t)len[i];
  }
  out->total = like->total;
  out->host = host_copy(dout, like->total);
  free(len);
  free(t);
  CK(cudaFree(dt));
  CK(cudaFree(dout));
  CK(cudaFree(dlen));
}

/*
 * Apply deltas d on the GPU to destinations that hold `dst_init` (per chunk;
 * the batch's base when NULL), the table as given except dst_bytes[i] when
 * dst_bytes is not NULL. Returns the destinations' bytes (host, in_total)
 * and the error outputs.
 */
static uint8_t *gpu_apply(const batch_t *b, const deltas_t *d, uint8_t *const *dst_init,
                          const size_t *dst_bytes, const uint8_t *null_delta_at,
                          int64_t *bad, int32_t *reason) {
  const int64_t n = b->n;
  uint8_t *hdst = calloc(b->in_total + 1, 1);
  for (int64_t i = 0; i < n; i++)
    memcpy(hdst + b->in_off[i], dst_init != NULL ? dst_init[i] : b->base[i], b->bytes[i]);
  uint8_t *ddst = dev_copy(hdst, b->in_total);
  uint8_t *ddelta = dev_copy(d->host, d->total);
  refit_delta_cuda_dec_desc_t *t = malloc(sizeof(*t) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) {
    t[i].delta = null_delta_at != NULL && null_delta_at[i] ? NULL : ddelta + d->off[i];
    t[i].delta_len = d->len[i];
    t[i].dst = ddst + b->in_off[i];
    t[i].dst_bytes = dst_bytes != NULL ? dst_bytes[i] : b->bytes[i];
  }
  void *dt = dev_copy(t, sizeof(*t) * (size_t)n);
  call_t c = call_open(refit_delta_cuda_workspace(n, b->total_bytes));
  assert_int_equal(refit_delta_apply_cuda(dt, n, c.ws, c.ws_bytes, c.bad, c.reason, 0),
                   REFIT_OK);
  call_close(&c, bad, reason);
  uint8_t *got = host_copy(ddst, b->in_total);
  free(hdst);
  free(t);
  CK(cudaFree(ddst));
  CK(cudaFree(ddelta));
  CK(cudaFree(dt));
  return got;
}

/* Destinations (gpu_apply's result) hold want[i] for every chunk. */
static void expect_chunks(const batch_t *b, const uint8_t *got, uint8_t *const *want,
                          const char *what) {
  for (int64_t i = 0; i < b->n; i++)
    for (size_t k = 0; k < b->bytes[i]; k++)
      if (got[b->in_off[i] + k] != want[i][k])
        fail_msg("%s: chunk %lld (%zu bytes) byte %zu: 0x%02x, want 0x%02x", what,
                 (long long)i, b->bytes[i], k, got[b->in_off[i] + k], want[i][k]);
}

/* GPU deltas == C deltas, and all four ways of applying them give new. */
static void check_twin(const batch_t *b, refit_delta_encoding_t e) {
  deltas_t cd, gd;
  c_encode(b, e, &cd);
  int64_t bad = 7;
  int32_t reason = 7;
  gpu_encode(b, e, &cd, &gd, &bad, &reason);
  if (bad != -1)
    fail_msg("encode %s: chunk %lld refused: %s", refit_delta_encoding_name(e),
             (long long)bad, refit_delta_cuda_reason_str(reason));
  assert_int_equal(reason, 0);
  for (int64_t i = 0; i < b->n; i++) {
    if (gd.len[i] != cd.len[i])
      fail_msg("encode %s: chunk %lld (%zu bytes): GPU length %zu, C %zu",
               refit_delta_encoding_name(e), (long long)i, b->bytes[i], gd.len[i],
               cd.len[i]);
    for (size_t k = 0; k < cd.len[i]; k++)
      if (gd.host[gd.off[i] + k] != cd.host[cd.off[i] + k])
        fail_msg(
            "encode %s: chunk %lld (%zu bytes, %s) delta byte %zu of %zu: GPU 0x%02x, C "
            "0x%02x",
            refit_delta_encoding_name(e), (long long)i, b->bytes[i],
            refit_delta_encoding_name((refit_delta_encoding_t)cd.host[cd.off[i] + 4]), k,
            cd.len[i], gd.host[gd.off[i] + k], cd.host[cd.off[i] + k]);
  }
  /* GPU apply of GPU deltas and of C deltas. */
  uint8_t *got = gpu_apply(b, &gd, NULL, NULL, NULL, &bad, &reason);
  if (bad != -1)
    fail_msg("apply (GPU deltas, %s): chunk %lld refused: %s",
             refit_delta_encoding_name(e), (long long)bad,
             refit_delta_cuda_reason_str(reason));
  expect_chunks(b, got, b->next, "GPU apply of GPU deltas");
  free(got);
  got = gpu_apply(b, &cd, NULL, NULL, NULL, &bad, &reason);
  assert_int_equal(bad, -1);
  expect_chunks(b, got, b->next, "GPU apply of C deltas");
  free(got);
  /* C decode of GPU deltas. */
  for (int64_t i = 0; i < b->n; i++) {
    uint8_t *dst = malloc(b->bytes[i] + 1);
    memcpy(dst, b->base[i], b->bytes[i]);
    const refit_status_t st =
        refit_delta_decode(gd.host + gd.off[i], gd.len[i], dst, b->bytes[i]);
    if (st != REFIT_OK)
      fail_msg("C decode of GPU delta %lld: %s", (long long)i, refit_last_error());
    assert_memory_equal(dst, b->next[i], b->bytes[i]);
    free(dst);
  }
  deltas_free(&cd);
  deltas_free(&gd);
}

/* ---- Tests -------------------------------------------------------------- */

/* 1/64: about 512 changed bytes per 32 KiB tile, the most a tile lists in
 * the encoder's count pass, so tiles fall on both sides of that bound. */
static const double kDensities[] = {0, 1e-5, 1e-3, 1.0 / 64, 0.05, 0.05, 1.0};
static const int kClustered[] = {0, 0, 0, 0, 0, 1, 0};
#define NDENS (int)(sizeof(kDensities) / sizeof(kDensities[0]))

/* Every size x density, one call per encoding. */
static void test_twin_sizes(void **state) {
  (void)state;
  static const size_t sizes[] = {
      0, 1, 31, 32, 33, 100, 1000, 32767, 32768, 32769, 65536 + 5, 250001, 3u << 20 | 7};
  const int ns = (int)(sizeof(sizes) / sizeof(sizes[0]));
  const int64_t n = (int64_t)ns * NDENS;
  size_t *bytes = malloc(sizeof(size_t) * (size_t)n);
  double *dens = malloc(sizeof(double) * (size_t)n);
  int *cl = malloc(sizeof(int) * (size_t)n);
  for (int s = 0; s < ns; s++)
    for (int d = 0; d < NDENS; d++) {
      bytes[s * NDENS + d] = sizes[s];
      dens[s * NDENS + d] = kDensities[d];
      cl[s * NDENS + d] = kClustered[d];
    }
  batch_t b;
  batch_create(&b, n, bytes, dens, cl);
  for (int e = REFIT_DELTA_AUTO; e < REFIT_DELTA_ENCODINGS; e++)
    check_twin(&b, (refit_delta_encoding_t)e);
  batch_destroy(&b);
  free(bytes);
  free(dens);
  free(cl);
}

/* Several MiB per chunk, every density, AUTO and each forced encoding. */
static void test_twin_large(void **state) {
  (void)state;
  const int64_t n = NDENS;
  size_t bytes[NDENS];
  for (int d = 0; d < NDENS; d++)
    bytes[d] = (size_t)kt_rand_range(5 << 20, 9 << 20);
  batch_t b;
  batch_create(&b, n, bytes, kDensities, kClustered);
  for (int e = REFIT_DELTA_AUTO; e < REFIT_DELTA_ENCODINGS; e++)
    check_twin(&b, (refit_delta_encoding_t)e);
  batch_destroy(&b);
}

/* Hundreds of chunks of mixed sizes and densities in one call. */
static void test_twin_many(void **state) {
  (void)state;
  for (int round = 0; round < 3; round++) {
    const int64_t n = kt_rand_range(300, 900);
    size_t *bytes = malloc(sizeof(size_t) * (size_t)n);
    double *dens = malloc(sizeof(double) * (size_t)n);
    int *cl = malloc(sizeof(int) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
      const int64_t kind = kt_rand_range(0, 49);
      bytes[i] = kind < 5    ? (size_t)kt_rand_range(0, 40)
                 : kind < 45 ? (size_t)kt_rand_range(41, 70000)
                 : kind < 49 ? (size_t)kt_rand_range(70000, 300000)
                             : (size_t)kt_rand_range(1 << 20, 2 << 20);
      const int d = (int)kt_rand_range(0, NDENS - 1);
      dens[i] = kDensities[d];
      cl[i] = kClustered[d];
    }
    batch_t b;
    batch_create(&b, n, bytes, dens, cl);
    check_twin(&b, REFIT_DELTA_AUTO);
    if (round == 0)
      for (int e = REFIT_DELTA_POSITIONS; e < REFIT_DELTA_ENCODINGS; e++)
        check_twin(&b, (refit_delta_encoding_t)e);
    batch_destroy(&b);
    free(bytes);
    free(dens);
    free(cl);
  }
}

static void put_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/*
 * One malformed delta in a batch of good ones. The batch: `fillers` random
 * chunks plus a 1000-byte chunk (32 blocks, the last of 8 bytes) whose delta
 * (as `e`) the mutation spoils, at a random index j; a second spoiled copy
 * (bad magic) later in the batch when there is room. The GPU must name j
 * and `want`, the C decoder refuse the delta, and no destination change.
 */
typedef void (*mutate_fn)(uint8_t *d, size_t *len, size_t *dst_bytes, const uint8_t *base,
                          const uint8_t *next);

static void expect_refused(refit_delta_encoding_t e, mutate_fn mutate, int32_t want,
                           const char *what) {
  const int64_t fillers = kt_rand_range(2, 12);
  const int64_t n = fillers + 1, j = kt_rand_range(0, fillers);
  size_t *bytes = malloc(sizeof(size_t) * (size_t)n);
  double *dens = malloc(sizeof(double) * (size_t)n);
  int *cl = calloc((size_t)n, sizeof(int));
  for (int64_t i = 0; i < n; i++) {
    bytes[i] = i == j ? 1000 : (size_t)kt_rand_range(1, 80000);
    dens[i] = i == j ? 0 : kDensities[kt_rand_range(1, NDENS - 1)];
  }
  batch_t b;
  batch_create(&b, n, bytes, dens, cl);
  /* Chunk j: bytes 10, 20 and one in the last, short block change. */
  memcpy(b.next[j], b.base[j], 1000);
  b.next[j][10] ^= 1;
  b.next[j][20] ^= 2;
  b.next[j][995] ^= 4;
  deltas_t d;
  c_encode(&b, REFIT_DELTA_AUTO, &d);
  /* Re-encode chunk j as e in its room (16 + 1000 covers every encoding of
   * this change), then spoil it. */
  uint8_t *dj = d.host + d.off[j];
  assert_int_equal(
      refit_delta_encode(b.next[j], b.base[j], 1000, e, dj, 1016, &d.len[j], NULL),
      REFIT_OK);
  size_t *dst_bytes = malloc(sizeof(size_t) * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    dst_bytes[i] = b.bytes[i];
  uint8_t *null_at = calloc((size_t)n, 1);
  uint8_t **init = malloc(sizeof(uint8_t *) * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    init[i] = b.base[i];
  if (mutate != NULL) {
    mutate(dj, &d.len[j], &dst_bytes[j], b.base[j], b.next[j]);
  } else if (want == REFIT_DELTA_CUDA_NULL_POINTER) {
    null_at[j] = 1;
  } else {
    init[j] = b.next[j]; /* the destination already holds the new bytes */
  }
  /* The C decoder refuses it too (a NULL delta as an invalid argument). */
  if (want != REFIT_DELTA_CUDA_NULL_POINTER) {
    uint8_t *tmp = malloc(1000 + 64);
    memcpy(tmp, init[j], 1000);
    const refit_status_t st = refit_delta_decode(dj, d.len[j], tmp, dst_bytes[j]);
    if (st != REFIT_ERR_INTEGRITY)
      fail_msg("%s: the C decoder says %s", what, refit_status_name(st));
    free(tmp);
  }
  /* A second bad delta after j: the first one is reported. */
  if (j + 1 < n)
    d.host[d.off[j + 1 + kt_rand() % (uint64_t)(n - j - 1)]] ^= 0x40;
  int64_t bad = 7;
  int32_t reason = 7;
  uint8_t *got = gpu_apply(&b, &d, init, dst_bytes, null_at, &bad, &reason);
  if (bad != j || reason != want)
    fail_msg("%s (%s delta): GPU says chunk %lld, %s (%d); want chunk %lld, %s (%d)",
             what, refit_delta_encoding_name(e), (long long)bad,
             refit_delta_cuda_reason_str(reason), reason, (long long)j,
             refit_delta_cuda_reason_str(want), want);
  expect_chunks(&b, got, init, what);
  assert_int_equal(refit_delta_cuda_report("apply", bad, reason),
                   want == REFIT_DELTA_CUDA_NULL_POINTER ? REFIT_ERR_INVALID_ARGUMENT
                                                         : REFIT_ERR_INTEGRITY);
  assert_non_null(strstr(refit_last_error(), refit_delta_cuda_reason_str(want)));
  free(got);
  free(dst_bytes);
  free(null_at);
  free(init);
  deltas_free(&d);
  batch_destroy(&b);
  free(bytes);
  free(dens);
  free(cl);
}

/* The mutations (the C test's, tests/kernels/test_kernels_delta.c). */
static void m_short(uint8_t *d, size_t *len, size_t *db, const uint8_t *ba,
                    const uint8_t *nx) {
  (void)d, (void)db, (void)ba, (void)nx;
  *len = 15;
}
static void m_magic(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                    const uint8_t *nx) {
  (void)l, (void)db, (void)ba, (void)nx;
  d[0] = 'X';
}
static void m_enc0(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                   const uint8_t *nx) {
  (void)l, (void)db, (void)ba, (void)nx;
  d[4] = 0;
}
static void m_enc9(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                   const uint8_t *nx) {
  (void)l, (void)db, (void)ba, (void)nx;
  d[4] = 9;
}
static void m_pad(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                  const uint8_t *nx) {
  (void)l, (void)db, (void)ba, (void)nx;
  d[6] = 1;
}
static void m_dst_size(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                       const uint8_t *nx) {
  (void)d, (void)l, (void)ba, (void)nx;
  *db = 999;
}
static void m_truncate(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                       const uint8_t *nx) {
  (void)d, (void)db, (void)ba, (void)nx;
  *l -= 1;
}
static void m_pad_len(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                      const uint8_t *nx) {
  (void)d, (void)db, (void)ba, (void)nx;
  *l += 1;
}
static void m_pos_count(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                        const uint8_t *nx) {
  (void)l, (void)db, (void)ba, (void)nx;
  put_u32(d + 12, 1001);
}
static void m_pos_back(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                       const uint8_t *nx) {
  (void)l, (void)db, (void)ba, (void)nx;
  put_u32(d + 16 + 4, 5); /* position 1 at 5, below position 0's 10 */
}
static void m_pos_dup(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                      const uint8_t *nx) {
  (void)l, (void)db, (void)ba, (void)nx;
  put_u32(d + 16 + 4, 10);
}
static void m_pos_past(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                       const uint8_t *nx) {
  (void)l, (void)db, (void)ba, (void)nx;
  put_u32(d + 16 + 8, 1000);
}
static void m_pos_max(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                      const uint8_t *nx) {
  (void)l, (void)db, (void)ba, (void)nx;
  put_u32(d + 16 + 8, UINT32_MAX);
}
static void m_pos_same(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                       const uint8_t *nx) {
  (void)l, (void)db, (void)nx;
  d[16 + 12 + 1] = ba[20];
}
static void m_mask_count3(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                          const uint8_t *nx) {
  (void)l, (void)db, (void)ba, (void)nx;
  put_u32(d + 12, 3);
}
static void m_mask_count33(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                           const uint8_t *nx) {
  (void)l, (void)db, (void)ba, (void)nx;
  put_u32(d + 12, 33);
}
static void m_mask_bit(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                       const uint8_t *nx) {
  (void)l, (void)db, (void)ba, (void)nx;
  d[16 + 1] |= 1;
}
static void m_mask_short(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                         const uint8_t *nx) {
  (void)d, (void)db, (void)ba, (void)nx;
  *l = 19;
}
static void m_mask_moved(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                         const uint8_t *nx) {
  (void)l, (void)db, (void)ba, (void)nx;
  d[16 + 3] = 0x40; /* block 30 instead of the short block 31: 84 bytes, not 60 */
}
static void m_mask_same(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                        const uint8_t *nx) {
  (void)l, (void)db, (void)nx;
  memcpy(d + 16 + 4, ba, 32); /* block 0's new bytes are the baseline's */
}
static void m_mask_tail(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                        const uint8_t *nx) {
  (void)l, (void)ba, (void)nx;
  put_u32(d + 8, 968); /* 31 blocks: the mark of block 31 is past them */
  *db = 968;
}
static void m_dense_count(uint8_t *d, size_t *l, size_t *db, const uint8_t *ba,
                          const uint8_t *nx) {
  (void)l, (void)db, (void)ba, (void)nx;
  put_u32(d + 12, 1);
}

static void test_refused(void **state) {
  (void)state;
  static const struct {
    refit_delta_encoding_t e;
    mutate_fn m;
    int32_t want;
    const char *what;
  } cases[] = {
      {REFIT_DELTA_POSITIONS, m_short, REFIT_DELTA_CUDA_SHORT, "15 bytes"},
      {REFIT_DELTA_POSITIONS, m_magic, REFIT_DELTA_CUDA_MAGIC, "magic"},
      {REFIT_DELTA_MASK, m_enc0, REFIT_DELTA_CUDA_ENCODING, "encoding 0"},
      {REFIT_DELTA_DENSE, m_enc9, REFIT_DELTA_CUDA_ENCODING, "encoding 9"},
      {REFIT_DELTA_POSITIONS, m_pad, REFIT_DELTA_CUDA_HEADER_PAD, "header pad"},
      {REFIT_DELTA_POSITIONS, m_dst_size, REFIT_DELTA_CUDA_CHUNK_SIZE,
       "destination size"},
      {REFIT_DELTA_MASK, m_dst_size, REFIT_DELTA_CUDA_CHUNK_SIZE, "destination size"},
      {REFIT_DELTA_POSITIONS, m_truncate, REFIT_DELTA_CUDA_LENGTH, "truncated"},
      {REFIT_DELTA_POSITIONS, m_pad_len, REFIT_DELTA_CUDA_LENGTH, "padded"},
      {REFIT_DELTA_POSITIONS, m_pos_count, REFIT_DELTA_CUDA_COUNT, "1001 positions"},
      {REFIT_DELTA_POSITIONS, m_pos_back, REFIT_DELTA_CUDA_POS_ORDER,
       "offset going back"},
      {REFIT_DELTA_POSITIONS, m_pos_dup, REFIT_DELTA_CUDA_POS_ORDER, "offset repeated"},
      {REFIT_DELTA_POSITIONS, m_pos_past, REFIT_DELTA_CUDA_POS_RANGE, "offset 1000"},
      {REFIT_DELTA_POSITIONS, m_pos_max, REFIT_DELTA_CUDA_POS_RANGE, "offset UINT32_MAX"},
      {REFIT_DELTA_POSITIONS, m_pos_same, REFIT_DELTA_CUDA_POS_SAME,
       "a value already there"},
      {REFIT_DELTA_POSITIONS, NULL, REFIT_DELTA_CUDA_POS_SAME, "applied twice"},
      {REFIT_DELTA_MASK, NULL, REFIT_DELTA_CUDA_BLOCK_SAME, "applied twice"},
      {REFIT_DELTA_DENSE, NULL, REFIT_DELTA_CUDA_NULL_POINTER, "NULL delta"},
      {REFIT_DELTA_MASK, m_mask_count3, REFIT_DELTA_CUDA_MASK_COUNT,
       "count 3 for 2 marks"},
      {REFIT_DELTA_MASK, m_mask_count33, REFIT_DELTA_CUDA_COUNT, "33 blocks of 32"},
      {REFIT_DELTA_MASK, m_mask_bit, REFIT_DELTA_CUDA_MASK_COUNT, "an extra mark"},
      {REFIT_DELTA_MASK, m_mask_short, REFIT_DELTA_CUDA_SHORT_MASK, "mask cut"},
      {REFIT_DELTA_MASK, m_truncate, REFIT_DELTA_CUDA_LENGTH, "mask data truncated"},
      {REFIT_DELTA_MASK, m_mask_moved, REFIT_DELTA_CUDA_LENGTH, "short block unmarked"},
      {REFIT_DELTA_MASK, m_mask_same, REFIT_DELTA_CUDA_BLOCK_SAME,
       "a block already there"},
      {REFIT_DELTA_MASK, m_mask_tail, REFIT_DELTA_CUDA_MASK_TAIL,
       "a mark past the chunk"},
      {REFIT_DELTA_DENSE, m_dense_count, REFIT_DELTA_CUDA_COUNT, "dense count 1"},
      {REFIT_DELTA_DENSE, m_truncate, REFIT_DELTA_CUDA_LENGTH, "dense truncated"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    for (int round = 0; round < 3; round++)
      expect_refused(cases[i].e, cases[i].m, cases[i].want, cases[i].what);
}

/* Encode's own refusals: nothing written (output, lengths), the first bad
 * chunk named. */
static void expect_encode_refused(const refit_delta_cuda_enc_desc_t *t, int64_t n,
                                  refit_delta_encoding_t e, size_t out_bytes, size_t wsb,
                                  int64_t want_chunk, int32_t want) {
  void *dt = dev_copy(t, sizeof(*t) * (size_t)n);
  uint8_t *dout = dev_alloc(out_bytes);
  CK(cudaMemset(dout, 0x5a, out_bytes));
  uint64_t *dlen = dev_alloc(8 * (size_t)n);
  CK(cudaMemset(dlen, 0xa5, 8 * (size_t)n));
  call_t c = call_open(wsb);
  assert_int_equal(
      refit_delta_encode_cuda(dt, n, e, dout, dlen, c.ws, c.ws_bytes, c.bad, c.reason, 0),
      REFIT_OK);
  int64_t bad;
  int32_t reason;
  call_close(&c, &bad, &reason);
  if (bad != want_chunk || reason != want)
    fail_msg("encode: GPU says chunk %lld, %s; want chunk %lld, %s", (long long)bad,
             refit_delta_cuda_reason_str(reason), (long long)want_chunk,
             refit_delta_cuda_reason_str(want));
  uint8_t *out = host_copy(dout, out_bytes);
  for (size_t i = 0; i < out_bytes; i++)
    if (out[i] != 0x5a)
      fail_msg("encode refused, yet output byte %zu was written", i);
  uint8_t *len = host_copy(dlen, 8 * (size_t)n);
  for (size_t i = 0; i < 8 * (size_t)n; i++)
    assert_int_equal(len[i], 0xa5);
  assert_int_equal(refit_delta_cuda_report("encode", bad, reason),
                   REFIT_ERR_INVALID_ARGUMENT);
  free(out);
  free(len);
  CK(cudaFree(dt));
  CK(cudaFree(dout));
  CK(cudaFree(dlen));
}

static void test_encode_refused(void **state) {
  (void)state;
  const size_t n = 100000;
  uint8_t *hb = malloc(n), *hn = malloc(n);
  kt_fill_bytes(hb, n);
  make_change(hb, hn, n, 1.0, 0);
  uint8_t *db = dev_copy(hb, n), *dn = dev_copy(hn, n);
  enum { K = 6 };
  refit_delta_cuda_enc_desc_t t[K];
  size_t out = 0;
  for (int i = 0; i < K; i++) {
    t[i].new_bytes = dn;
    t[i].base = db;
    t[i].bytes = n;
    t[i].out_off = out;
    t[i].cap = refit_delta_bound(n);
    out += (size_t)refit_delta_bound(n);
  }
  const size_t wsb = refit_delta_cuda_workspace(K, (uint64_t)K * n);
  /* Every byte changed: forced positions take 16 + 5n > the bound. */
  expect_encode_refused(t, K, REFIT_DELTA_POSITIONS, out, wsb, 0,
                        REFIT_DELTA_CUDA_CAPACITY);
  /* AUTO fits; one chunk's capacity is one byte short of dense. */
  t[4].cap = refit_delta_bound(n) - 1;
  expect_encode_refused(t, K, REFIT_DELTA_AUTO, out, wsb, 4, REFIT_DELTA_CUDA_CAPACITY);
  t[4].cap = refit_delta_bound(n);
  /* A chunk above UINT32_MAX bytes (never read: its pointers are bogus). */
  t[3].bytes = UINT64_C(1) << 33;
  t[3].new_bytes = (const void *)(uintptr_t)0x1000;
  expect_encode_refused(t, K, REFIT_DELTA_AUTO, out, wsb, 3,
                        REFIT_DELTA_CUDA_CHUNK_TOO_LARGE);
  t[3].bytes = n;
  t[3].new_bytes = dn;
  t[2].base = NULL;
  expect_encode_refused(t, K, REFIT_DELTA_AUTO, out, wsb, 2,
                        REFIT_DELTA_CUDA_NULL_POINTER);
  t[2].base = db;
  /* A workspace for half the bytes: the first chunk past it is named. */
  const size_t small = refit_delta_cuda_workspace(K, (uint64_t)K * n / 2);
  expect_encode_refused(t, K, REFIT_DELTA_AUTO, out, small, 3,
                        REFIT_DELTA_CUDA_WORKSPACE);
  /* Host-side argument checks. */
  call_t c = call_open(wsb);
  assert_int_equal(refit_delta_encode_cuda(t, K, (refit_delta_encoding_t)7, db, NULL,
                                           c.ws, c.ws_bytes, c.bad, c.reason, 0),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_delta_encode_cuda(t, K, REFIT_DELTA_AUTO, db, (uint64_t *)db,
                                           c.ws, 64, c.bad, c.reason, 0),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_delta_apply_cuda(NULL, 3, c.ws, c.ws_bytes, c.bad, c.reason, 0),
                   REFIT_ERR_INVALID_ARGUMENT);
  /* An empty call succeeds and reports no bad chunk. */
  int64_t bad = 5;
  int32_t reason = 5;
  assert_int_equal(refit_delta_apply_cuda(NULL, 0, c.ws, c.ws_bytes, c.bad, c.reason, 0),
                   REFIT_OK);
  call_close(&c, &bad, &reason);
  assert_int_equal(bad, -1);
  assert_int_equal(reason, 0);
  assert_string_equal(refit_delta_cuda_reason_str(99), "?");
  CK(cudaFree(db));
  CK(cudaFree(dn));
  free(hb);
  free(hn);
}

int main(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("no GPU: skipped\n");
    return 77;
  }
  kt_seed("test_kernels_delta_cuda");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_twin_sizes),     cmocka_unit_test(test_twin_large),
      cmocka_unit_test(test_twin_many),      cmocka_unit_test(test_refused),
      cmocka_unit_test(test_encode_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
