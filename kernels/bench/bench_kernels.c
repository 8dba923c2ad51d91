/*
 * refit-bench-kernels: speed of the MXFP8 kernels on one Qwen3-30B-A3B expert
 * layer (E = 128, H = 2048, I = 768: w13 [128, 1536, 2048], w2 [128, 2048,
 * 768]) against the memory-copy ceiling measured in the same run.
 *
 * Bandwidth = (bytes read + bytes written) / time, the same definition for the
 * copy (2 x size) and for the kernels, so "ratio" is the fraction of copy
 * speed reached. Time is the best of REFIT_BENCH_REPS runs (default 3).
 * "wrong" counts output bytes that differ from the reference: for the C
 * quantizer the single-thread run, for the batched layout the per-expert
 * oracle, for the GPU kernels the C reference (the GPU oracle: the C oracle).
 * Exit code 1 if any is nonzero.
 * GPU MoE layout: the batched kernels (four launches per layer) against two
 * per-expert baselines, the step-by-step oracle (kernels/moe_oracle.cu, the
 * straightforward implementation) and the batched kernels launched expert by
 * expert; the summary line gives both speedups and the time of all 48 layers.
 * GPU data path (kernels/datapath_cuda.h): pack and land of one 256 MiB
 * bucket of 85 chunks of 3 MiB (an MXFP8 w13 expert of that layer is
 * 1536 x 2048 e4m3 = 3 MiB), COPY with and without digests, with 16-byte
 * aligned and 8-byte-off wire offsets; pack QUANTIZE of 40 BF16 w13 experts
 * and land SPLIT of the result; the whole model's quantization (every
 * quantized tensor of Qwen3-30B-A3B, one launch each). Bytes = source read
 * + destination written
 * (digest reads and trailers not counted: the rate the refit sees).
 * Block FP8 (kernels/fp8_block.h, FP32 scales): the same layer, w13 and w2
 * each as one matrix of 128 x 128 blocks; bytes = BF16 read once + e4m3 and
 * FP32 scales written (the kernels read each block twice, the second time
 * from cache).
 * NVFP4 (kernels/nvfp4.h): the same layer, w13 and w2 each as one matrix
 * under its own global scale; bytes = BF16 read once + packed E2M1 (half a
 * byte an element) and E4M3 scales (one per 16) written.
 * Zero-copy path (kernels/direct_cuda.h): the whole model landed from BF16
 * trainer tensors straight into the runtime layouts (bench_model_direct).
 * Usage: refit-bench-kernels [E H I]
 */
#include "bench_util.h"
#include "kernels/fp8_block.h"
#include "kernels/layout.h"
#include "kernels/mxfp8.h"
#include "kernels/nvfp4.h"
#ifdef REFIT_HAVE_CUDA
#include "kernels/datapath_cuda.h"
#include "kernels/direct_cuda.h"
#include "kernels/fp8_block_cuda.h"
#include "kernels/mxfp8_cuda.h"
#include "kernels/nvfp4_cuda.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t diff_bytes(const uint8_t *a, const uint8_t *b, int64_t n) {
  int64_t d = 0;
  for (int64_t i = 0; i < n; i++)
    d += a[i] != b[i];
  return d;
}

static double ceiling_gbs;
static int64_t total_wrong;

static void row(const char *name, int64_t bytes, double t, int64_t wrong) {
  double gbs = (double)bytes / t / 1e9;
  printf("%-49s %10.1f %10.3f %9.1f %7.2f %8lld\n", name, (double)bytes / 1e6,
         t * 1e3, gbs, gbs / ceiling_gbs, (long long)wrong);
  total_wrong += wrong;
}

#ifdef REFIT_HAVE_CUDA
/* Times `stmt` on the GPU: best of greps runs after one warm-up, in bms (ms). */
#define GPU_TIME(stmt)                                                         \
  bms = 1e30f;                                                                 \
  for (int r = 0; r < greps + 1; r++) {                                        \
    cudaEventRecord(e0, 0);                                                    \
    stmt;                                                                      \
    cudaEventRecord(e1, 0);                                                    \
    cudaEventSynchronize(e1);                                                  \
    cudaEventElapsedTime(&ms, e0, e1);                                         \
    if (r > 0 && ms < bms) /* run 0 is warm-up */                              \
      bms = ms;                                                                \
  }

static void *dmalloc(size_t n) {
  void *p = NULL;
  if (cudaMalloc(&p, n) != cudaSuccess) {
    fprintf(stderr, "cudaMalloc of %zu bytes failed\n", n);
    exit(2);
  }
  return p;
}

static int64_t ddiff(const void *dev, const uint8_t *want, int64_t n) {
  uint8_t *h = xmalloc((size_t)n);
  cudaMemcpy(h, dev, (size_t)n, cudaMemcpyDeviceToHost);
  int64_t d = diff_bytes(h, want, n);
  free(h);
  return d;
}

/* Wrong bytes of the four MoE layout outputs on the device against want. */
static int64_t layout_wrong(uint8_t *const dev[4], uint8_t *const want[4],
                            const int64_t n[4]) {
  int64_t d = 0;
  for (int i = 0; i < 4; i++)
    d += ddiff(dev[i], want[i], n[i]);
  return d;
}

static void layout_poison(uint8_t *const dev[4], const int64_t n[4]) {
  for (int i = 0; i < 4; i++)
    cudaMemset(dev[i], 0xEE, (size_t)n[i]);
}

/* A device copy on the copy engines (cudaMemcpyBatchAsync with the hint to
 * overlap compute), `bytes` src -> dst on `stream`. */
static cudaError_t ce_copy(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
  struct cudaMemcpyAttributes attr;
  memset(&attr, 0, sizeof(attr));
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t idx = 0, size = bytes;
  void *dsts[1] = {dst};
  const void *srcs[1] = {src};
  return cudaMemcpyBatchAsync(dsts, srcs, &size, 1, &attr, &idx, 1, stream);
}

/*
 * Whether a device copy can run beside the quantizer: the copy on the copy
 * engines alone, the quantizer alone, both at once on two streams (wall
 * time, best of greps). The refit's restore copy and the generator's
 * quantization meet like this.
 */
static void bench_overlap(int greps, const uint16_t *dbf, int64_t rows, int64_t cols,
                          uint8_t *dq, uint8_t *dsc, uint8_t *dcp_dst, int64_t cp_bytes) {
  cudaStream_t s1, s2;
  cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  double best[3] = {1e30, 1e30, 1e30};
  const uint8_t *cp_src = (const uint8_t *)dbf;
  for (int r = 0; r < greps + 1; r++)
    for (int v = 0; v < 3; v++) {
      cudaDeviceSynchronize();
      const double t0 = now_s();
      if (v != 1)
        check(ce_copy(dcp_dst, cp_src, (size_t)cp_bytes, s2) == cudaSuccess
                  ? REFIT_OK
                  : REFIT_ERR_CUDA,
              "cudaMemcpyBatchAsync");
      if (v != 0)
        check(refit_mxfp8_quantize_rows_cuda(dbf, rows, cols, cols, dq, cols, dsc,
                                             cols / 32, s1),
              "quantize cuda");
      cudaStreamSynchronize(s1);
      cudaStreamSynchronize(s2);
      const double t = now_s() - t0;
      if (r > 0 && t < best[v])
        best[v] = t;
    }
  row("copy engines D2D (cudaMemcpyBatchAsync)", 2 * cp_bytes, best[0], 0);
  row("CUDA quantize, alone (wall)", rows * cols * 3 + rows * cols / 32, best[1], 0);
  printf("# copy engines beside the quantizer: both %.3f ms, alone %.3f + %.3f ms "
         "(%.0f %% of the copy hidden)\n",
         best[2] * 1e3, best[0] * 1e3, best[1] * 1e3,
         100.0 * (best[0] + best[1] - best[2]) / best[0]);
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

/* The data-path rows (see the header comment). */
static void bench_datapath(cudaEvent_t e0, cudaEvent_t e1, int greps) {
  enum { N = 85, NQ = 40 };
  const int64_t rows = 1536, rb = 2048, chunk = rows * rb, bytes = N * chunk;
  const int64_t wire_bytes = N * (chunk + 24);
  float ms, bms;
  uint8_t *src = xmalloc((size_t)bytes), *hwire = xmalloc((size_t)wire_bytes);
  uint8_t *hdst = xmalloc((size_t)bytes);
  uint64_t x = 99;
  for (int64_t i = 0; i < bytes; i++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    src[i] = (uint8_t)(x >> 56);
  }
  uint8_t *dsrc = dmalloc((size_t)bytes), *dwire = dmalloc((size_t)wire_bytes);
  uint8_t *ddst = dmalloc((size_t)bytes);
  cudaMemcpy(dsrc, src, (size_t)bytes, cudaMemcpyHostToDevice);
  refit_pack_desc_t hp[N], dp[N];
  refit_land_desc_t hl[N], dl[N];
  refit_pack_desc_t *dpd = dmalloc(sizeof(dp));
  refit_land_desc_t *dld = dmalloc(sizeof(dl));
  int64_t *dbad = dmalloc(sizeof(int64_t)), bad;
  for (int variant = 0; variant < 3; variant++) {
    /* 0: aligned; 1: aligned + digest; 2: wire offsets 8 bytes off 16 */
    const int digest = variant == 1, skew = variant == 2 ? 8 : 0;
    for (int64_t i = 0; i < N; i++) {
      const int64_t off = i * (chunk + 16) + skew;
      hp[i] = (refit_pack_desc_t){.src = src + i * chunk, .src_pitch = rb, .dst_offset = off,
                                  .rows = rows, .cols = 0, .row_bytes = rb,
                                  .op = REFIT_CHUNK_COPY, .digest = digest};
      dp[i] = hp[i];
      dp[i].src = dsrc + i * chunk;
      hl[i] = (refit_land_desc_t){.src_offset = off, .rows = rows, .cols = 0, .row_bytes = rb,
                                  .dst = hdst + i * chunk, .dst_pitch = rb,
                                  .op = REFIT_CHUNK_COPY, .digest = digest};
      dl[i] = hl[i];
      dl[i].dst = ddst + i * chunk;
    }
    cudaMemcpy(dpd, dp, sizeof(dp), cudaMemcpyHostToDevice);
    cudaMemcpy(dld, dl, sizeof(dl), cudaMemcpyHostToDevice);
    check(refit_pack_rows(hp, N, 0, hwire), "pack");
    check(refit_land_rows(hl, N, 0, hwire, &bad), "land");
    GPU_TIME(check(refit_pack_rows_cuda(dpd, N, 0, dwire, 0), "pack cuda"));
    int64_t wrong = 0;
    for (int64_t i = 0; i < N; i++)
      wrong += ddiff(dwire + hp[i].dst_offset, hwire + hp[i].dst_offset, chunk + 8 * digest);
    const char *names[3][2] = {{"CUDA pack, 85 x 3 MiB", "CUDA land, 85 x 3 MiB"},
                               {"CUDA pack + digest", "CUDA land + digest check"},
                               {"CUDA pack, wire 8 B off 16", "CUDA land, wire 8 B off 16"}};
    row(names[variant][0], 2 * bytes, bms * 1e-3, wrong);
    bad = -1;
    cudaMemcpy(dbad, &bad, sizeof(bad), cudaMemcpyHostToDevice);
    GPU_TIME(check(refit_land_rows_cuda(dld, N, 0, dwire, dbad, 0), "land cuda"));
    cudaMemcpy(&bad, dbad, sizeof(bad), cudaMemcpyDeviceToHost);
    row(names[variant][1], 2 * bytes, bms * 1e-3, ddiff(ddst, hdst, bytes) + (bad != -1));
  }

  /* QUANTIZE on pack, SPLIT on land: 40 BF16 w13 experts [1536, 2048]. */
  const int64_t qrows = 1536, cols = 2048, qrb = cols + cols / 32;
  const int64_t in_bytes = NQ * qrows * cols * 2, wbytes = NQ * qrows * qrb;
  uint16_t *bf = xmalloc((size_t)in_bytes);
  for (int64_t i = 0; i < in_bytes / 2; i++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    bf[i] = (uint16_t)(((x >> 33) & 0x8000) | ((120 + (x >> 60)) << 7) | ((x >> 40) & 0x7f));
  }
  uint8_t *dbf = dmalloc((size_t)in_bytes), *qw = xmalloc((size_t)wbytes);
  uint8_t *dqw = dmalloc((size_t)wbytes), *dq = dmalloc((size_t)(NQ * qrows * cols));
  uint8_t *dsc = dmalloc((size_t)(NQ * qrows * cols / 32));
  uint8_t *hq = xmalloc((size_t)(NQ * qrows * cols)), *hsc = xmalloc((size_t)(NQ * qrows * cols / 32));
  cudaMemcpy(dbf, bf, (size_t)in_bytes, cudaMemcpyHostToDevice);
  for (int64_t i = 0; i < NQ; i++) {
    hp[i] = (refit_pack_desc_t){.src = bf + i * qrows * cols, .src_pitch = cols * 2,
                                .dst_offset = i * qrows * qrb, .rows = qrows, .cols = cols,
                                .row_bytes = qrb, .op = REFIT_CHUNK_QUANTIZE, .digest = 0};
    dp[i] = hp[i];
    dp[i].src = dbf + i * qrows * cols * 2;
    hl[i] = (refit_land_desc_t){.src_offset = i * qrows * qrb, .rows = qrows, .cols = cols,
                                .row_bytes = qrb, .dst = hq + i * qrows * cols,
                                .dst_pitch = cols, .scale = hsc + i * qrows * cols / 32,
                                .scale_pitch = cols / 32, .op = REFIT_CHUNK_SPLIT};
    dl[i] = hl[i];
    dl[i].dst = dq + i * qrows * cols;
    dl[i].scale = dsc + i * qrows * cols / 32;
  }
  cudaMemcpy(dpd, dp, sizeof(dp), cudaMemcpyHostToDevice);
  cudaMemcpy(dld, dl, sizeof(dl), cudaMemcpyHostToDevice);
  check(refit_pack_rows(hp, NQ, 0, qw), "pack quantize");
  check(refit_land_rows(hl, NQ, 0, qw, &bad), "land split");
  GPU_TIME(check(refit_pack_rows_cuda(dpd, NQ, 0, dqw, 0), "pack quantize cuda"));
  row("CUDA pack QUANTIZE, 40 w13 experts", in_bytes + wbytes, bms * 1e-3,
      ddiff(dqw, qw, wbytes));
  GPU_TIME(check(refit_land_rows_cuda(dld, NQ, 0, dqw, dbad, 0), "land split cuda"));
  row("CUDA land SPLIT, 40 w13 experts", 2 * wbytes, bms * 1e-3,
      ddiff(dq, hq, NQ * qrows * cols) + ddiff(dsc, hsc, NQ * qrows * cols / 32));
  /* Land QUANTIZE (BF16 on the wire, quantized on the generator), without
   * and with the digest check: the wire is packed (COPY, with digests) from
   * the same experts, so the output must equal the SPLIT row's reference. */
  {
    const int64_t brb = cols * 2, bchunk = qrows * brb, bstride = bchunk + 16;
    uint8_t *bwire = dmalloc((size_t)(NQ * bstride));
    refit_pack_desc_t bp[NQ];
    refit_land_desc_t bl[NQ];
    for (int64_t i = 0; i < NQ; i++) {
      bp[i] = (refit_pack_desc_t){.src = dbf + i * bchunk, .src_pitch = brb,
                                  .dst_offset = i * bstride, .rows = qrows, .cols = 0,
                                  .row_bytes = brb, .op = REFIT_CHUNK_COPY, .digest = 1};
      bl[i] = (refit_land_desc_t){.src_offset = i * bstride, .rows = qrows, .cols = cols,
                                  .row_bytes = brb, .dst = dq + i * qrows * cols,
                                  .dst_pitch = cols, .scale = dsc + i * qrows * cols / 32,
                                  .scale_pitch = cols / 32, .op = REFIT_CHUNK_QUANTIZE};
    }
    cudaMemcpy(dpd, bp, sizeof(bp), cudaMemcpyHostToDevice);
    check(refit_pack_rows_cuda(dpd, NQ, 0, bwire, 0), "pack bf16 cuda");
    cudaDeviceSynchronize();
    for (int digest = 0; digest < 2; digest++) {
      for (int64_t i = 0; i < NQ; i++)
        bl[i].digest = digest;
      cudaMemcpy(dld, bl, sizeof(bl), cudaMemcpyHostToDevice);
      cudaMemset(dq, 0xEE, (size_t)(NQ * qrows * cols));
      bad = -1;
      cudaMemcpy(dbad, &bad, sizeof(bad), cudaMemcpyHostToDevice);
      GPU_TIME(check(refit_land_rows_cuda(dld, NQ, 0, bwire, dbad, 0), "land quantize cuda"));
      cudaMemcpy(&bad, dbad, sizeof(bad), cudaMemcpyDeviceToHost);
      row(digest ? "CUDA land QUANTIZE + digest check, 40 w13" : "CUDA land QUANTIZE, 40 w13",
          in_bytes + NQ * qrows * (cols + cols / 32), bms * 1e-3,
          ddiff(dq, hq, NQ * qrows * cols) + ddiff(dsc, hsc, NQ * qrows * cols / 32) +
              (bad != -1));
    }
    cudaFree(bwire);
  }

  free(src); free(hwire); free(hdst); free(bf); free(qw); free(hq); free(hsc);
  cudaFree(dsrc); cudaFree(dwire); cudaFree(ddst); cudaFree(dpd); cudaFree(dld);
  cudaFree(dbad); cudaFree(dbf); cudaFree(dqw); cudaFree(dq); cudaFree(dsc);
}
/* The whole model's quantized tensors per layer (experts first, their bytes
 * bf's layout): rows x K of w13, w2, q, k, v, o and the router, and each
 * tensor's element offset in a layer. */
enum { kModelLayers = 48, kModelTensors = 7 };
static void model_tensors(const refit_kernels_moe_shape_t *s, int64_t rows[kModelTensors],
                          int64_t ks[kModelTensors], int64_t off[kModelTensors + 1]) {
  const int64_t E = s->num_experts, H = s->hidden, I = s->intermediate;
  const int64_t r[kModelTensors] = {E * 2 * I, E * H, 4096, 512, 512, 2048, E};
  const int64_t k[kModelTensors] = {H, I, H, H, H, 4096, H};
  off[0] = 0;
  for (int i = 0; i < kModelTensors; i++) {
    rows[i] = r[i];
    ks[i] = k[i];
    off[i + 1] = off[i] + r[i] * k[i];
  }
}

/* Every layer's BF16 tensors in device memory (per elements each): the
 * experts from bf, the rest from bf's first elements, copied to all layers. */
static void model_upload(uint16_t *din, const uint16_t *bf, int64_t experts, int64_t per) {
  cudaMemcpy(din, bf, (size_t)(experts * 2), cudaMemcpyHostToDevice);
  cudaMemcpy(din + experts, bf, (size_t)((per - experts) * 2), cudaMemcpyHostToDevice);
  for (int l = 1; l < kModelLayers; l++)
    cudaMemcpy(din + l * per, din, (size_t)(per * 2), cudaMemcpyDeviceToDevice);
}

/*
 * The whole model's quantization on the GPU: every quantized tensor of
 * Qwen3-30B-A3B (48 layers of q/k/v/o projections, the router, and the
 * experts' w13 and w2, 29.9 G elements), each in its own memory, one launch
 * per tensor as the refit issues them. Every layer's input is a copy of the
 * layer above's random data (experts: `bf`; attention and router: bf's first
 * elements), so layers 0 and 47 are checked byte for byte against the C
 * reference (`q`, `sc` for the experts; computed here for the rest). Skipped
 * for shapes other than the model's.
 */
static void bench_model_quantize(cudaEvent_t e0, cudaEvent_t e1, int greps,
                                 const refit_kernels_moe_shape_t *s,
                                 const uint16_t *bf, const uint8_t *q,
                                 const uint8_t *sc) {
  enum { kLayers = kModelLayers, kTensors = kModelTensors };
  const int64_t E = s->num_experts, H = s->hidden, I = s->intermediate;
  if (E != 128 || H != 2048 || I != 768) {
    printf("# whole-model quantization: skipped (not the Qwen3-30B-A3B shape)\n");
    return;
  }
  int64_t rows[kTensors], ks[kTensors], off[kTensors + 1];
  model_tensors(s, rows, ks, off);
  const int64_t per = off[kTensors], experts = off[2];
  uint16_t *din = NULL;
  uint8_t *dq = NULL, *dsc = NULL;
  if (cudaMalloc((void **)&din, (size_t)(kLayers * per * 2)) != cudaSuccess ||
      cudaMalloc((void **)&dq, (size_t)(kLayers * per)) != cudaSuccess ||
      cudaMalloc((void **)&dsc, (size_t)(kLayers * per / 32)) != cudaSuccess) {
    printf("# whole-model quantization: skipped (%.1f GB of device memory not "
           "available)\n", (double)kLayers * per * 3.03 / 1e9);
    cudaGetLastError(); /* clear the allocation failure */
    cudaFree(din);
    cudaFree(dq);
    return;
  }
  model_upload(din, bf, experts, per);
  /* Reference of one layer: the experts' from the caller, the rest here. */
  uint8_t *rq = xmalloc((size_t)per), *rs = xmalloc((size_t)per / 32);
  memcpy(rq, q, (size_t)experts);
  memcpy(rs, sc, (size_t)experts / 32);
  for (int i = 2; i < kTensors; i++)
    check(refit_mxfp8_quantize_rows(bf + (off[i] - experts), rows[i], ks[i], ks[i],
                                    rq + off[i], ks[i], rs + off[i] / 32, ks[i] / 32),
          "quantize reference");
  float ms, bms;
  GPU_TIME(for (int l = 0; l < kLayers; l++) for (int i = 0; i < kTensors; i++)
               check(refit_mxfp8_quantize_rows_cuda(
                         din + l * per + off[i], rows[i], ks[i], ks[i],
                         dq + l * per + off[i], ks[i], dsc + (l * per + off[i]) / 32,
                         ks[i] / 32, 0),
                     "quantize cuda"));
  int64_t wrong = 0;
  for (int l = 0; l < kLayers; l += kLayers - 1)
    wrong += ddiff(dq + l * per, rq, per) + ddiff(dsc + l * per / 32, rs, per / 32);
  const int64_t bytes = kLayers * (per * 2 + per + per / 32);
  row("CUDA quantize, whole model (336 tensors)", bytes, bms * 1e-3, wrong);
  printf("# whole model: %.2f G elements quantized (%.1f GB of BF16) in %.2f ms\n",
         (double)kLayers * per / 1e9, (double)kLayers * per * 2 / 1e9, bms);
  free(rq);
  free(rs);
  cudaFree(din);
  cudaFree(dq);
  cudaFree(dsc);
}

/*
 * The zero-copy path (kernels/direct_cuda.h) over the whole model's quantized
 * tensors, as a same-GPU refit runs it: 48 layers of BF16 trainer tensors
 * (w13, w2 of every expert, q, k, v, o and the router, each a dense
 * flashinfer_cutlass tensor here) read where they are and written straight
 * into the TRTLLM MoE and dense runtime layouts, one descriptor per expert
 * matrix or dense tensor, launched as 114 calls (a refit's buckets).
 * Rows: the trainer's digest pass (DIGEST), the land with digests, the land
 * without. Bytes = BF16 read + MXFP8 written (digest reads not counted); the
 * ratio to cudaMemcpy is the fraction of the HBM floor reached. Layers 0 and
 * 47 are checked byte for byte against the staged GPU path (quantize, then the
 * batched MoE layout or the dense transform), itself tested against the C
 * references.
 */
/*
 * The zero-copy COPY of the BF16 tensors that stay BF16 (the embedding and
 * the LM head of Qwen3-30B-A3B, [151936, 2048] each), two chunks per tensor
 * (a trainer's tp2 shards), against cudaMemcpy of the same bytes; every byte
 * checked.
 */
static void bench_direct_copy(cudaEvent_t e0, cudaEvent_t e1, int greps) {
  enum { kRows = 151936, kCols = 2048, kChunks = 4 };
  const int64_t bytes = 2ll * kRows * kCols * 2, half = bytes / 2;
  uint8_t *src = NULL, *dst = NULL;
  if (cudaMalloc((void **)&src, (size_t)bytes) != cudaSuccess ||
      cudaMalloc((void **)&dst, (size_t)bytes) != cudaSuccess) {
    printf("# direct copy: skipped (device memory)\n");
    cudaGetLastError();
    cudaFree(src);
    return;
  }
  uint8_t *h = xmalloc((size_t)bytes);
  uint64_t x = 0x243F6A8885A308D3ull;
  for (int64_t i = 0; i < bytes; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(h + i, &x, 8);
  }
  cudaMemcpy(src, h, (size_t)bytes, cudaMemcpyHostToDevice);
  refit_direct_desc_t descs[kChunks];
  memset(descs, 0, sizeof(descs));
  for (int c = 0; c < kChunks; c++) {
    refit_direct_desc_t *d = &descs[c];
    const int64_t at = (c / 2) * half + (c % 2) * (half / 2);
    d->op = REFIT_DIRECT_COPY;
    d->src = src + at;
    d->src_pitch = kCols * 2;
    d->rows = kRows / 2;
    d->cols = kCols;
    d->dst = dst + at;
    d->dst_pitch = kCols * 2;
  }
  check(refit_direct_descs_check(descs, kChunks), "copy table");
  refit_direct_desc_t *dd = dmalloc(sizeof(descs));
  unsigned long long *acc = dmalloc(kChunks * 8);
  cudaMemcpy(dd, descs, sizeof(descs), cudaMemcpyHostToDevice);
  float ms, bms;
  GPU_TIME(cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice, 0));
  row("cudaMemcpy D2D, the BF16 embedding + LM head", 2 * bytes, bms * 1e-3, 0);
  cudaMemset(dst, 0x5a, (size_t)bytes);
  GPU_TIME(check(refit_direct_rows_cuda(dd, kChunks, 7, NULL, acc, NULL, 0), "direct copy"));
  row("CUDA direct COPY, the same", 2 * bytes, bms * 1e-3, ddiff(dst, h, bytes));
  free(h);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(dd);
  cudaFree(acc);
}

static void bench_model_direct(cudaEvent_t e0, cudaEvent_t e1, int greps,
                               const refit_kernels_moe_shape_t *s, const uint16_t *bf) {
  enum { kLayers = kModelLayers, kTensors = kModelTensors, kCalls = 114 };
  const int64_t E = s->num_experts, H = s->hidden, I = s->intermediate;
  if (E != 128 || H != 2048 || I != 768) {
    printf("# whole-model direct land: skipped (not the Qwen3-30B-A3B shape)\n");
    return;
  }
  int64_t rows[kTensors], ks[kTensors], off[kTensors + 1];
  int64_t woff[kTensors + 1] = {0}, soff[kTensors + 1] = {0};
  model_tensors(s, rows, ks, off);
  refit_kernels_moe_sizes_t sz;
  check(refit_kernels_moe_check_shape(s, "bench", &sz), "shape");
  for (int i = 0; i < kTensors; i++) {
    woff[i + 1] = woff[i] + rows[i] * ks[i];
    const int64_t sb = i == 0   ? sz.w13_weight_scale
                       : i == 1 ? sz.w2_weight_scale
                                : refit_kernels_swizzle_bytes(rows[i], ks[i] / 32);
    soff[i + 1] = soff[i] + sb;
  }
  const int64_t per = off[kTensors], experts = off[2];
  const int64_t sper = soff[kTensors];
  uint16_t *din = NULL;
  uint8_t *dw = NULL, *dsw = NULL, *dig = NULL;
  if (cudaMalloc((void **)&din, (size_t)(kLayers * per * 2)) != cudaSuccess ||
      cudaMalloc((void **)&dw, (size_t)(kLayers * per)) != cudaSuccess ||
      cudaMalloc((void **)&dsw, (size_t)(kLayers * sper)) != cudaSuccess) {
    printf("# whole-model direct land: skipped (device memory)\n");
    cudaGetLastError();
    cudaFree(din);
    cudaFree(dw);
    return;
  }
  model_upload(din, bf, experts, per);
  const int64_t per_layer = 2 * E + (kTensors - 2), n = kLayers * per_layer;
  refit_direct_desc_t *land = calloc((size_t)n, sizeof(*land));
  refit_direct_desc_t *digest = calloc((size_t)n, sizeof(*digest));
  int64_t k = 0;
  for (int l = 0; l < kLayers; l++)
    for (int i = 0; i < kTensors; i++) {
      const int64_t groups = i < 2 ? E : 1, gr = rows[i] / groups;
      for (int64_t e = 0; e < groups; e++, k++) {
        refit_direct_desc_t *d = &land[k];
        d->op = REFIT_DIRECT_QUANTIZE;
        d->src = din + l * per + off[i] + e * gr * ks[i];
        d->src_pitch = ks[i] * 2;
        d->rows = gr;
        d->cols = ks[i];
        d->digest = 1;
        d->seal_key = (uint64_t)k * 0x9E3779B97F4A7C15ull;
        d->digest_offset = 8 * k;
        d->dst = dw + l * per + woff[i];
        d->scale = dsw + l * sper + soff[i];
        d->row0 = e * gr;
        d->k = ks[i];
        d->group_rows = d->perm_rows = gr;
        d->perm = i == 0 ? REFIT_KERNELS_PERM_SRC13 : i == 1 ? REFIT_KERNELS_PERM_SRC32 : -1;
        d->value_group_bytes = gr * ks[i];
        d->scale_group_bytes = refit_kernels_swizzle_bytes(gr, ks[i] / 32);
        digest[k] = *d;
        digest[k].op = REFIT_DIRECT_DIGEST;
      }
    }
  check(refit_direct_descs_check(land, n), "direct table");
  check(refit_direct_descs_check(digest, n), "digest table");
  refit_direct_desc_t *dland = dmalloc((size_t)n * sizeof(*land));
  refit_direct_desc_t *ddig = dmalloc((size_t)n * sizeof(*digest));
  cudaMemcpy(dland, land, (size_t)n * sizeof(*land), cudaMemcpyHostToDevice);
  cudaMemcpy(ddig, digest, (size_t)n * sizeof(*digest), cudaMemcpyHostToDevice);
  dig = dmalloc((size_t)n * 8);
  unsigned long long *acc = dmalloc((size_t)n * 8);
  int64_t *dbad = dmalloc(8);
  const int64_t minus1 = -1;
  cudaMemcpy(dbad, &minus1, 8, cudaMemcpyHostToDevice);
  const int64_t step = (n + kCalls - 1) / kCalls;
  float ms, bms;
  const int64_t rbytes = kLayers * per * 2, wbytes = kLayers * (per + sper);
  GPU_TIME(for (int64_t a = 0; a < n; a += step) check(
      refit_direct_rows_cuda(ddig + a, a + step < n ? step : n - a, 7, dig, acc + a, NULL, 0),
      "direct digest"));
  row("CUDA direct: trainer digests, whole model", rbytes, bms * 1e-3, 0);
  GPU_TIME(for (int64_t a = 0; a < n; a += step) check(
      refit_direct_rows_cuda(dland + a, a + step < n ? step : n - a, 7, dig, acc + a, dbad, 0),
      "direct land"));
  int64_t bad = 0;
  cudaMemcpy(&bad, dbad, 8, cudaMemcpyDeviceToHost);
  row("CUDA direct land + digests, whole model", rbytes + wbytes, bms * 1e-3, bad >= 0);
  for (int64_t j = 0; j < n; j++)
    land[j].digest = 0;
  cudaMemcpy(dland, land, (size_t)n * sizeof(*land), cudaMemcpyHostToDevice);
  cudaMemset(dw, 0x5a, (size_t)(kLayers * per));
  cudaMemset(dsw, 0x5a, (size_t)(kLayers * sper));
  GPU_TIME(for (int64_t a = 0; a < n; a += step) check(
      refit_direct_rows_cuda(dland + a, a + step < n ? step : n - a, 7, NULL, acc + a, NULL, 0),
      "direct land"));
  /* The staged path's bytes for layers 0 and 47. */
  uint8_t *q = dmalloc((size_t)per), *sc = dmalloc((size_t)per / 32);
  uint8_t *wo = dmalloc((size_t)per), *so = dmalloc((size_t)sper);
  for (int i = 0; i < kTensors; i++)
    check(refit_mxfp8_quantize_rows_cuda(din + off[i], rows[i], ks[i], ks[i], q + off[i], ks[i],
                                         sc + off[i] / 32, ks[i] / 32, 0),
          "quantize cuda");
  check(refit_kernels_moe_transform_cuda(s, q, sc, q + off[1], sc + off[1] / 32, wo, so,
                                         wo + woff[1], so + soff[1], 0),
        "layout cuda");
  for (int i = 2; i < kTensors; i++)
    check(refit_kernels_dense_transform_cuda(REFIT_KERNELS_DENSE_FLASHINFER_CUTLASS, rows[i],
                                             ks[i], q + off[i], sc + off[i] / 32,
                                             wo + woff[i], so + soff[i], 0),
          "dense cuda");
  cudaDeviceSynchronize();
  uint8_t *hw = xmalloc((size_t)per), *hs = xmalloc((size_t)sper);
  cudaMemcpy(hw, wo, (size_t)per, cudaMemcpyDeviceToHost);
  cudaMemcpy(hs, so, (size_t)sper, cudaMemcpyDeviceToHost);
  int64_t wrong = 0;
  for (int l = 0; l < kLayers; l += kLayers - 1)
    wrong += ddiff(dw + l * per, hw, per) + ddiff(dsw + l * sper, hs, sper);
  row("CUDA direct land, no digests, whole model", rbytes + wbytes, bms * 1e-3, wrong);
  /* The same table in one call: how a sync zero-copy refit lands (one bucket). */
  cudaMemset(dw, 0x5a, (size_t)(kLayers * per));
  cudaMemset(dsw, 0x5a, (size_t)(kLayers * sper));
  GPU_TIME(check(refit_direct_rows_cuda(dland, n, 7, NULL, acc, NULL, 0), "direct land"));
  wrong = 0;
  for (int l = 0; l < kLayers; l += kLayers - 1)
    wrong += ddiff(dw + l * per, hw, per) + ddiff(dsw + l * sper, hs, sper);
  row("CUDA direct land, no digests, one call", rbytes + wbytes, bms * 1e-3, wrong);
  printf("# direct land: %lld descriptors in %d calls; %.1f GB read, %.1f GB written\n",
         (long long)n, kCalls, (double)rbytes / 1e9, (double)wbytes / 1e9);
  free(land);
  free(digest);
  free(hw);
  free(hs);
  cudaFree(din);
  cudaFree(dw);
  cudaFree(dsw);
  cudaFree(dig);
  cudaFree(acc);
  cudaFree(dbad);
  cudaFree(dland);
  cudaFree(ddig);
  cudaFree(q);
  cudaFree(sc);
  cudaFree(wo);
  cudaFree(so);
}
#endif

/* The C quantizer over one expert layer: n13 elements of w13 rows (K = H),
 * then n2 of w2 rows (K = I), outputs packed the same way. */
static void quantize_layer(const refit_kernels_moe_shape_t *s, int64_t n13,
                           int64_t n2, const uint16_t *bf, uint8_t *q, uint8_t *sc) {
  check(refit_mxfp8_quantize_rows(bf, n13 / s->hidden, s->hidden, s->hidden, q,
                                  s->hidden, sc, s->hidden / 32),
        "quantize");
  check(refit_mxfp8_quantize_rows(bf + n13, n2 / s->intermediate, s->intermediate,
                                  s->intermediate, q + n13, s->intermediate,
                                  sc + n13 / 32, s->intermediate / 32),
        "quantize");
}

/* Block FP8 scales of the layer: w13 [n13 / H, H] then w2 [n2 / I, I]. */
static int64_t fp8_layer_scales(const refit_kernels_moe_shape_t *s, int64_t n13,
                                int64_t n2, int64_t *off2) {
  *off2 = refit_fp8_block_count(n13 / s->hidden) * refit_fp8_block_count(s->hidden);
  return *off2 + refit_fp8_block_count(n2 / s->intermediate) *
                     refit_fp8_block_count(s->intermediate);
}

/* The layer in block FP8 with the C reference, or the CUDA twin (device
 * buffers, on stream 0) when `cuda`. */
static void fp8_layer(const refit_kernels_moe_shape_t *s, int64_t n13, int64_t n2,
                      const uint16_t *bf, uint8_t *q, float *sc, int cuda) {
  int64_t off2;
  fp8_layer_scales(s, n13, n2, &off2);
  const int64_t r13 = n13 / s->hidden, r2 = n2 / s->intermediate;
  const int64_t c13 = refit_fp8_block_count(s->hidden),
                c2 = refit_fp8_block_count(s->intermediate);
#ifdef REFIT_HAVE_CUDA
  if (cuda) {
    check(refit_fp8_block_quantize_cuda(bf, r13, s->hidden, s->hidden,
                                        REFIT_FP8_SCALE_FP32, q, s->hidden, sc, c13, 0),
          "fp8_block cuda");
    check(refit_fp8_block_quantize_cuda(bf + n13, r2, s->intermediate, s->intermediate,
                                        REFIT_FP8_SCALE_FP32, q + n13, s->intermediate,
                                        sc + off2, c2, 0),
          "fp8_block cuda");
    return;
  }
#endif
  (void)cuda;
  check(refit_fp8_block_quantize(bf, r13, s->hidden, s->hidden, REFIT_FP8_SCALE_FP32, q,
                                 s->hidden, sc, c13),
        "fp8_block");
  check(refit_fp8_block_quantize(bf + n13, r2, s->intermediate, s->intermediate,
                                 REFIT_FP8_SCALE_FP32, q + n13, s->intermediate,
                                 sc + off2, c2),
        "fp8_block");
}

/* The layer in NVFP4 with the C reference, or the CUDA twin (device buffers,
 * on stream 0) when `cuda`: w13 [n13 / H, H] under gsf[0], then w2
 * [n2 / I, I] under gsf[1]; values at q, q + n13 / 2, scales at sf,
 * sf + n13 / 16. */
static void nvfp4_layer(const refit_kernels_moe_shape_t *s, int64_t n13, int64_t n2,
                        const uint16_t *bf, const float gsf[2], uint8_t *q, uint8_t *sf,
                        int cuda) {
  const int64_t h = s->hidden, i = s->intermediate;
#ifdef REFIT_HAVE_CUDA
  if (cuda) {
    check(refit_nvfp4_quantize_cuda(bf, n13 / h, h, h, gsf[0], q, h / 2, sf, h / 16, 0),
          "nvfp4 cuda");
    check(refit_nvfp4_quantize_cuda(bf + n13, n2 / i, i, i, gsf[1], q + n13 / 2, i / 2,
                                    sf + n13 / 16, i / 16, 0),
          "nvfp4 cuda");
    return;
  }
#endif
  (void)cuda;
  check(refit_nvfp4_quantize(bf, n13 / h, h, h, gsf[0], q, h / 2, sf, h / 16), "nvfp4");
  check(refit_nvfp4_quantize(bf + n13, n2 / i, i, i, gsf[1], q + n13 / 2, i / 2,
                             sf + n13 / 16, i / 16),
        "nvfp4");
}

int main(int argc, char **argv) {
  refit_kernels_moe_shape_t s = {128, 2048, 768, 1};
  if (argc == 4) {
    s.num_experts = atoll(argv[1]);
    s.hidden = atoll(argv[2]);
    s.intermediate = atoll(argv[3]);
  }
  int reps = getenv("REFIT_BENCH_REPS") ? atoi(getenv("REFIT_BENCH_REPS")) : 3;
  if (reps < 1)
    reps = 1;
  refit_kernels_moe_sizes_t z;
  check(refit_kernels_moe_check_shape(&s, "bench", &z), "shape");
  int64_t n13 = z.w13_weight, n2 = z.w2_weight, nel = n13 + n2;
  printf("# refit-bench-kernels: E=%lld H=%lld I=%lld, %d C threads, best of %d\n",
         (long long)s.num_experts, (long long)s.hidden, (long long)s.intermediate,
         refit_kernels_threads_get(), reps);

  /* Inputs: BF16 weights with a realistic spread (deterministic LCG). */
  uint16_t *bf = xmalloc((size_t)nel * 2);
  uint64_t x = 12345;
  for (int64_t i = 0; i < nel; i++) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    bf[i] = (uint16_t)(((x >> 33) & 0x8000) | ((120 + (x >> 60)) << 7) | ((x >> 40) & 0x7f));
  }
  uint8_t *q = xmalloc((size_t)nel), *q1 = xmalloc((size_t)nel);
  uint8_t *sc = xmalloc((size_t)nel / 32), *sc1 = xmalloc((size_t)nel / 32);
  uint8_t *cp = xmalloc((size_t)nel * 2);
  double t, best;

  printf("%-49s %10s %10s %9s %7s %8s\n", "kernel", "MB moved", "time ms",
         "GB/s", "ratio", "wrong");
  /* Ceiling: memcpy of the BF16 layer. */
  best = 1e30;
  for (int r = 0; r < reps; r++) {
    t = now_s();
    memcpy(cp, bf, (size_t)nel * 2);
    t = now_s() - t;
    best = t < best ? t : best;
  }
  ceiling_gbs = (double)nel * 4 / best / 1e9;
  row("memcpy (ceiling)", nel * 4, best, diff_bytes(cp, (uint8_t *)bf, nel * 2));

  /* Quantize the layer (w13 and w2 rows are all K-blocked rows): the
   * portable code on one thread (the bytes the others are checked against),
   * then the code the CPU runs best (AVX-512 where it has it) on one and on
   * every thread. */
  int64_t qbytes = nel * 2 + nel + nel / 32;
  int nthreads = refit_kernels_threads_get();
  const refit_mxfp8_code_t best_code = refit_mxfp8_quantize_code();
  char name[64];
  refit_kernels_threads_set(1);
  for (int c = 0; c < 2; c++) {
    const refit_mxfp8_code_t code = c == 0 ? REFIT_MXFP8_CODE_PORTABLE : best_code;
    if (c == 1 && code == REFIT_MXFP8_CODE_PORTABLE)
      break;
    check(refit_mxfp8_quantize_use(code), "quantize code");
    best = 1e30;
    for (int r = 0; r < reps; r++) {
      t = now_s();
      quantize_layer(&s, n13, n2, bf, c == 0 ? q1 : q, c == 0 ? sc1 : sc);
      t = now_s() - t;
      best = t < best ? t : best;
    }
    snprintf(name, sizeof(name), "C quantize (%s), 1 thread", refit_mxfp8_code_name(code));
    row(name, qbytes, best,
        c == 0 ? 0 : diff_bytes(q, q1, nel) + diff_bytes(sc, sc1, nel / 32));
  }
  check(refit_mxfp8_quantize_use(REFIT_MXFP8_CODE_BEST), "quantize code");
  refit_kernels_threads_set(nthreads);
  best = 1e30;
  for (int r = 0; r < reps; r++) {
    t = now_s();
    quantize_layer(&s, n13, n2, bf, q, sc);
    t = now_s() - t;
    best = t < best ? t : best;
  }
  snprintf(name, sizeof(name), "C quantize (%s), %d threads", refit_mxfp8_code_name(best_code),
           nthreads);
  row(name, qbytes, best,
      diff_bytes(q, q1, nel) + diff_bytes(sc, sc1, nel / 32));

  /* Block FP8 of the layer: one thread (the reference bytes), then all. */
  int64_t fp8_off2;
  const int64_t nfsc = fp8_layer_scales(&s, n13, n2, &fp8_off2);
  const int64_t fbytes = nel * 3 + nfsc * 4;
  uint8_t *fq1 = xmalloc((size_t)nel), *fq = xmalloc((size_t)nel);
  float *fsc1 = xmalloc((size_t)nfsc * 4), *fsc = xmalloc((size_t)nfsc * 4);
  for (int pass = 0; pass < 2; pass++) {
    refit_kernels_threads_set(pass == 0 ? 1 : nthreads);
    best = 1e30;
    for (int r = 0; r < reps; r++) {
      t = now_s();
      fp8_layer(&s, n13, n2, bf, pass == 0 ? fq1 : fq, pass == 0 ? fsc1 : fsc, 0);
      t = now_s() - t;
      best = t < best ? t : best;
    }
    snprintf(name, sizeof(name), "C fp8_block quantize, %d thread(s)",
             pass == 0 ? 1 : nthreads);
    row(name, fbytes, best,
        pass == 0 ? 0
                  : diff_bytes(fq, fq1, nel) +
                        diff_bytes((uint8_t *)fsc, (uint8_t *)fsc1, nfsc * 4));
  }
  refit_kernels_threads_set(nthreads);

  /* NVFP4 of the layer: one thread (the reference bytes), then all. */
  const float ngsf[2] = {
      refit_nvfp4_global_scale(
          refit_nvfp4_amax_key(bf, n13 / s.hidden, s.hidden, s.hidden, NULL)),
      refit_nvfp4_global_scale(refit_nvfp4_amax_key(bf + n13, n2 / s.intermediate,
                                                    s.intermediate, s.intermediate, NULL))};
  const int64_t nbytes = nel * 2 + nel / 2 + nel / 16;
  uint8_t *nq1 = xmalloc((size_t)nel / 2), *nq = xmalloc((size_t)nel / 2);
  uint8_t *nsf1 = xmalloc((size_t)nel / 16), *nsf = xmalloc((size_t)nel / 16);
  for (int pass = 0; pass < 2; pass++) {
    refit_kernels_threads_set(pass == 0 ? 1 : nthreads);
    best = 1e30;
    for (int r = 0; r < reps; r++) {
      t = now_s();
      nvfp4_layer(&s, n13, n2, bf, ngsf, pass == 0 ? nq1 : nq, pass == 0 ? nsf1 : nsf, 0);
      t = now_s() - t;
      best = t < best ? t : best;
    }
    snprintf(name, sizeof(name), "C nvfp4 quantize, %d thread(s)", pass == 0 ? 1 : nthreads);
    row(name, nbytes, best,
        pass == 0 ? 0 : diff_bytes(nq, nq1, nel / 2) + diff_bytes(nsf, nsf1, nel / 16));
  }
  refit_kernels_threads_set(nthreads);

  /* MoE layout: batched (4 gathers) vs per-expert oracle. */
  uint8_t *o[4], *w[4];
  int64_t osz[4] = {z.w13_weight, z.w13_weight_scale, z.w2_weight, z.w2_weight_scale};
  for (int i = 0; i < 4; i++) {
    o[i] = xmalloc((size_t)osz[i]);
    w[i] = xmalloc((size_t)osz[i]);
  }
  int64_t lbytes = 2 * (nel + nel / 32); /* approx: padding adds nothing here */
  best = 1e30;
  for (int r = 0; r < reps; r++) {
    t = now_s();
    check(refit_kernels_moe_transform_oracle(&s, q, sc, q + n13, sc + n13 / 32, w[0],
                                             w[1], w[2], w[3]), "oracle");
    t = now_s() - t;
    best = t < best ? t : best;
  }
  row("C MoE layout, per-expert oracle", lbytes, best, 0);
  best = 1e30;
  for (int r = 0; r < reps; r++) {
    t = now_s();
    check(refit_kernels_moe_transform(&s, q, sc, q + n13, sc + n13 / 32, o[0], o[1],
                                      o[2], o[3]), "layout");
    t = now_s() - t;
    best = t < best ? t : best;
  }
  int64_t wrong = 0;
  for (int i = 0; i < 4; i++)
    wrong += diff_bytes(o[i], w[i], osz[i]);
  snprintf(name, sizeof(name), "C MoE layout, batched, %d thr", nthreads);
  row(name, lbytes, best, wrong);

#ifdef REFIT_HAVE_CUDA
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("# no CUDA device: GPU rows skipped\n");
  } else {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    uint16_t *dbf;
    uint8_t *dcp, *dq, *dsc, *dout[4];
    cudaMalloc((void **)&dbf, (size_t)nel * 2);
    cudaMalloc((void **)&dcp, (size_t)nel * 2);
    cudaMalloc((void **)&dq, (size_t)nel);
    cudaMalloc((void **)&dsc, (size_t)nel / 32);
    for (int i = 0; i < 4; i++)
      cudaMalloc((void **)&dout[i], (size_t)osz[i]);
    cudaMemcpy(dbf, bf, (size_t)nel * 2, cudaMemcpyHostToDevice);
    float ms, bms;
    int greps = reps < 10 ? 10 : reps;
    GPU_TIME(cudaMemcpyAsync(dcp, dbf, (size_t)nel * 2, cudaMemcpyDeviceToDevice, 0));
    double cpu_ceiling = ceiling_gbs;
    ceiling_gbs = (double)nel * 4 / (bms * 1e-3) / 1e9;
    row("cudaMemcpy D2D (GPU ceiling)", nel * 4, bms * 1e-3, 0);
    bench_overlap(greps, dbf, n13 / s.hidden, s.hidden, dq, dsc, dcp, nel * 2);
    GPU_TIME(check(refit_mxfp8_quantize_rows_cuda(dbf, n13 / s.hidden, s.hidden, s.hidden,
                                                  dq, s.hidden, dsc, s.hidden / 32, 0),
                   "quantize cuda");
             check(refit_mxfp8_quantize_rows_cuda(
                       dbf + n13, n2 / s.intermediate, s.intermediate, s.intermediate,
                       dq + n13, s.intermediate, dsc + n13 / 32, s.intermediate / 32, 0),
                   "quantize cuda"));
    uint8_t *hq = xmalloc((size_t)nel), *hs = xmalloc((size_t)nel / 32);
    cudaMemcpy(hq, dq, (size_t)nel, cudaMemcpyDeviceToHost);
    cudaMemcpy(hs, dsc, (size_t)nel / 32, cudaMemcpyDeviceToHost);
    row("CUDA quantize", qbytes, bms * 1e-3,
        diff_bytes(hq, q, nel) + diff_bytes(hs, sc, nel / 32));
    {
      float *dfsc = dmalloc((size_t)nfsc * 4), *hfsc = xmalloc((size_t)nfsc * 4);
      GPU_TIME(fp8_layer(&s, n13, n2, dbf, dq, dfsc, 1));
      cudaMemcpy(hq, dq, (size_t)nel, cudaMemcpyDeviceToHost);
      cudaMemcpy(hfsc, dfsc, (size_t)nfsc * 4, cudaMemcpyDeviceToHost);
      row("CUDA fp8_block quantize", fbytes, bms * 1e-3,
          diff_bytes(hq, fq1, nel) +
              diff_bytes((uint8_t *)hfsc, (uint8_t *)fsc1, nfsc * 4));
      cudaFree(dfsc);
      free(hfsc);
      /* NVFP4: values in dq's first half, scales in their own buffer. */
      uint8_t *dnsf = dmalloc((size_t)nel / 16), *hnsf = xmalloc((size_t)nel / 16);
      GPU_TIME(nvfp4_layer(&s, n13, n2, dbf, ngsf, dq, dnsf, 1));
      cudaMemcpy(hq, dq, (size_t)nel / 2, cudaMemcpyDeviceToHost);
      cudaMemcpy(hnsf, dnsf, (size_t)nel / 16, cudaMemcpyDeviceToHost);
      row("CUDA nvfp4 quantize", nbytes, bms * 1e-3,
          diff_bytes(hq, nq1, nel / 2) + diff_bytes(hnsf, nsf1, nel / 16));
      cudaFree(dnsf);
      free(hnsf);
      /* The MXFP8 rows after this one read dq's MXFP8 bytes again. */
      GPU_TIME(
          check(refit_mxfp8_quantize_rows_cuda(dbf, n13 / s.hidden, s.hidden, s.hidden,
                                               dq, s.hidden, dsc, s.hidden / 32, 0),
                "quantize cuda");
          check(refit_mxfp8_quantize_rows_cuda(
                    dbf + n13, n2 / s.intermediate, s.intermediate, s.intermediate,
                    dq + n13, s.intermediate, dsc + n13 / 32, s.intermediate / 32, 0),
                "quantize cuda"));
    }
    bench_model_quantize(e0, e1, greps, &s, bf, q, sc);
    bench_model_direct(e0, e1, greps, &s, bf);
    bench_direct_copy(e0, e1, greps);
    /* MoE layout: batched, the step-by-step oracle, the batched kernels per
     * expert. Outputs are poisoned before each row, so a byte a row does not
     * write counts as wrong. */
    layout_poison(dout, osz);
    GPU_TIME(
        check(refit_kernels_moe_transform_cuda(&s, dq, dsc, dq + n13, dsc + n13 / 32,
                                               dout[0], dout[1], dout[2], dout[3], 0),
              "layout cuda"));
    row("CUDA MoE layout, batched", lbytes, bms * 1e-3, layout_wrong(dout, o, osz));
    const double batched_ms = bms;
    /* The straightforward GPU implementation: kernels/moe_oracle.cu, expert
     * by expert and step by step like the C oracle (16 copies, fills and
     * kernels per expert); checked against the C oracle's bytes. */
    {
      const int64_t scratch_bytes = refit_kernels_moe_oracle_scratch_bytes(&s);
      uint8_t *scratch = dmalloc((size_t)scratch_bytes);
      layout_poison(dout, osz);
      GPU_TIME(check(refit_kernels_moe_transform_oracle_cuda(
                         &s, dq, dsc, dq + n13, dsc + n13 / 32, dout[0], dout[1], dout[2],
                         dout[3], scratch, scratch_bytes, 0),
                     "layout oracle cuda"));
      row("CUDA MoE layout, per-expert oracle (step by step)", lbytes, bms * 1e-3,
          layout_wrong(dout, w, osz));
      cudaFree(scratch);
    }
    const double oracle_ms = bms;
    /* The batched kernels launched expert by expert, four launches each (the
     * runtime's refit.baseline does the same). */
    {
      refit_kernels_moe_shape_t one = s;
      refit_kernels_moe_sizes_t z1;
      one.num_experts = 1;
      check(refit_kernels_moe_check_shape(&one, "bench", &z1), "shape");
      const int64_t r13 = n13 / s.num_experts, r2 = n2 / s.num_experts;
      layout_poison(dout, osz);
      GPU_TIME(for (int64_t e = 0; e < s.num_experts; e++) check(
          refit_kernels_moe_transform_cuda(
              &one, dq + e * r13, dsc + e * r13 / 32, dq + n13 + e * r2,
              dsc + (n13 + e * r2) / 32, dout[0] + e * z1.w13_weight,
              dout[1] + e * z1.w13_weight_scale, dout[2] + e * z1.w2_weight,
              dout[3] + e * z1.w2_weight_scale, 0),
          "layout cuda, per expert"));
      row("CUDA MoE layout, per expert", lbytes, bms * 1e-3, layout_wrong(dout, o, osz));
    }
    printf("# MoE layout on the GPU: batched %.1fx the step-by-step per-expert oracle, "
           "%.1fx the batched kernels launched per expert; all 48 layers of "
           "Qwen3-30B-A3B: batched %.2f ms, oracle %.2f ms, per expert %.2f ms\n",
           oracle_ms / batched_ms, bms / batched_ms, 48 * batched_ms, 48 * oracle_ms,
           48 * bms);
    bench_datapath(e0, e1, greps);
    printf("# GPU ratios are to cudaMemcpy D2D; CPU ratios to memcpy (%.1f GB/s)\n",
           cpu_ceiling);
    free(hq);
    free(hs);
    cudaFree(dbf);
    cudaFree(dcp);
    cudaFree(dq);
    cudaFree(dsc);
    for (int i = 0; i < 4; i++)
      cudaFree(dout[i]);
  }
#endif
  for (int i = 0; i < 4; i++) {
    free(o[i]);
    free(w[i]);
  }
  free(bf);
  free(q);
  free(q1);
  free(sc);
  free(sc1);
  free(fq1);
  free(fq);
  free(fsc1);
  free(nq1);
  free(nq);
  free(nsf1);
  free(nsf);
  free(fsc);
  free(cp);
  printf("# wrong bytes in total: %lld\n", (long long)total_wrong);
  return total_wrong != 0;
}
