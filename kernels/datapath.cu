/*
 * Data-path kernels, CUDA twins of kernels/datapath.c (contract in
 * kernels/datapath.h and kernels/datapath_cuda.h).
 *
 * Kernel refit_dp_tile_kernel<Plan>  (pack, land, the pack digest pass)
 *   computes  every descriptor's work, cut into equal warp tiles: a copy tile
 *             is up to 8 KiB of one row, or of several narrow rows (as a
 *             row-major grid of 16-byte units, 4 loads in flight per lane,
 *             when rows are whole aligned units; else each row taken by a
 *             group of lanes), a quantize tile is kQuantTile consecutive
 *             32-element blocks in kQuantSteps steps (a quad of lanes per
 *             block, kernels/mxfp8_device.cuh), a digest tile is 1024 words
 *             of a chunk.
 *   mapping   a machine-filling grid; each block reads the descriptor table
 *             in batches of 256, counts tiles per descriptor, prefix-sums the
 *             counts in shared memory, and its warps take the batch's tiles
 *             T with T % (warps in grid) == global warp id (binary search in
 *             the prefix for the descriptor). Large and small chunks thus
 *             spread evenly, whatever n is. Pack and land launch it twice,
 *             once for the quantizing descriptors and once for the rest, so
 *             that the quantizer is compiled on its own (80 registers, 3
 *             blocks per SM) instead of at the copy paths' register count.
 *   digest    chunk-relative words (core/digest.h): each warp
 *             sums its terms and adds them to the chunk's 64-bit accumulator
 *             with one atomicAdd (addition mod 2^64 commutes, so the order of
 *             the warps does not matter). Terms come from the registers that
 *             are copied or quantized when the chunk's wire rows, source and
 *             destination are 16- or 8-byte aligned (digest_unit; land
 *             QUANTIZE at any alignment), else from a read of the wire bytes:
 *             for pack a second pass after the copy, for land extra tiles of
 *             the same kernel. Pack: a finalize kernel writes len*P1 + sum
 *             + the seal (key, tag) after the rows. Land reads the staging
 *             area once: every chunk lands, then a check kernel (a thread
 *             per descriptor) reports the smallest index whose sealed sum
 *             does not match its trailer (kernels/datapath.h says why
 *             landing a bad chunk is harmless).
 *
 * The tile primitives (copy, digest, quantize tiles) are in
 * kernels/datapath_tiles.cuh; the synthetic fill and compare kernels, which
 * verification uses and the data path does not, in kernels/synth.cu.
 */
#include "kernels/cuda_launch.cuh"
#include "kernels/datapath_cuda.h"
#include "kernels/datapath_tiles.cuh"
#include "kernels/fp8_block_cuda.h"

#include "core/digest.h"

#include <pthread.h>

namespace {

/* ---- Descriptors as jobs ------------------------------------------------- */

__device__ inline bool quant_shape_ok(int64_t cols, int64_t row_bytes,
                                      int64_t expected) {
  return cols >= 0 && cols % 32 == 0 && row_bytes == expected;
}

/* A BLOCK_QUANTIZE descriptor whose rows refit_pack_blocks_cuda wrote: the
 * tile kernels only seal it (a digest read back from the wire). */
__device__ inline bool pack_prewritten(const refit_pack_desc_t &d) {
  return d.op == REFIT_CHUNK_BLOCK_QUANTIZE && d.rows >= 0 && d.cols >= 0 &&
         d.dst_offset >= 0 && d.row_bytes == d.cols + 4 * REFIT_BLOCK_WIRE_SLOTS(d.cols);
}

__device__ inline Job pack_job(const refit_pack_desc_t &d, uint8_t *buf) {
  Job j{};
  if (d.rows < 0 || d.row_bytes < 0 || d.dst_offset < 0)
    return j;
  uint8_t *wire = buf + d.dst_offset;
  j.src = static_cast<const uint8_t *>(d.src);
  j.src_pitch = d.src_pitch;
  j.dst = wire;
  j.dst_pitch = d.row_bytes;
  j.rows = d.rows;
  j.chunk_pitch = d.row_bytes;
  if (d.op == REFIT_CHUNK_COPY) {
    j.kind = kCopy;
    j.width = d.row_bytes;
  } else if (d.op == REFIT_CHUNK_QUANTIZE &&
             quant_shape_ok(d.cols, d.row_bytes, d.cols + d.cols / 32)) {
    j.kind = kQuant;
    j.width = d.cols;
    j.scale = wire + d.cols;
    j.scale_pitch = d.row_bytes;
  }
  return collapse(j);
}

/* Land: up to two jobs (SPLIT copies values and scales). */
__device__ inline int land_jobs(const refit_land_desc_t &d,
                                const uint8_t *staging, Job jobs[2]) {
  jobs[0] = Job{};
  jobs[1] = Job{};
  if (d.rows < 0 || d.row_bytes < 0 || d.src_offset < 0)
    return 0;
  const uint8_t *wire = staging + d.src_offset;
  Job j{};
  j.src = wire;
  j.src_pitch = d.row_bytes;
  j.dst = static_cast<uint8_t *>(d.dst);
  j.dst_pitch = d.dst_pitch;
  j.rows = d.rows;
  j.chunk_pitch = d.row_bytes;
  if (d.op == REFIT_CHUNK_COPY) {
    j.kind = kCopy;
    j.width = d.row_bytes;
    jobs[0] = collapse(j);
    return 1;
  }
  if (d.op == REFIT_CHUNK_QUANTIZE &&
      quant_shape_ok(d.cols, d.row_bytes, 2 * d.cols)) {
    j.kind = kQuant;
    j.width = d.cols;
    j.scale = static_cast<uint8_t *>(d.scale);
    j.scale_pitch = d.scale_pitch;
    jobs[0] = j;
    return 1;
  }
  if (d.op == REFIT_CHUNK_SPLIT &&
      quant_shape_ok(d.cols, d.row_bytes, d.cols + d.cols / 32)) {
    j.kind = kCopy;
    j.width = d.cols;
    jobs[0] = collapse(j);
    j.src = wire + d.cols;
    j.chunk_off = d.cols;
    j.dst = static_cast<uint8_t *>(d.scale);
    j.dst_pitch = d.scale_pitch;
    j.width = d.cols / 32;
    jobs[1] = collapse(j);
    return 2;
  }
  if (d.op == REFIT_CHUNK_BLOCK_SPLIT && d.cols >= 0 &&
      d.row_bytes == d.cols + 4 * REFIT_BLOCK_WIRE_SLOTS(d.cols)) {
    /* The values, then the scale slots of every block row's first row
     * (the other rows' slots, repeats of those, are read by the digest
     * only). */
    j.kind = kCopy;
    j.width = d.cols;
    jobs[0] = collapse(j);
    j.src = wire + d.cols;
    j.src_pitch = REFIT_FP8_BLOCK * d.row_bytes;
    j.chunk_off = d.cols;
    j.chunk_pitch = REFIT_FP8_BLOCK * d.row_bytes;
    j.dst = static_cast<uint8_t *>(d.scale);
    j.dst_pitch = d.scale_pitch;
    j.rows = (d.rows + REFIT_FP8_BLOCK - 1) / REFIT_FP8_BLOCK;
    j.width = 4 * REFIT_BLOCK_WIRE_SLOTS(d.cols);
    jobs[1] = collapse(j);
    return 2;
  }
  return 0;
}

/* ---- Plans: what the tile kernel does per descriptor ----------------------
 */

template <int kSel> struct PackPlan {
  static constexpr int kMinBlocks = kSel == kQuantJobs ? kQuantMinBlocks : 1;
  const refit_pack_desc_t *descs;
  uint8_t *buf;
  unsigned long long *acc;
  __device__ int64_t tiles(int64_t i) const {
    const Job j = pack_job(descs[i], buf);
    return selected<kSel>(&j, j.kind == kNone ? 0 : 1) ? job_tiles(j) : 0;
  }
  __device__ void run(int64_t i, int64_t t, int lane) const {
    const refit_pack_desc_t &d = descs[i];
    const Job j = pack_job(d, buf);
    const int64_t len = d.rows * d.row_bytes;
    if (d.digest && digest_unit(j, len) > 0) {
      const uint64_t s = warp_sum(run_job<kSel>(j, t, lane, true, len));
      if (lane == 0)
        atomicAdd(&acc[i], static_cast<unsigned long long>(s));
    } else {
      run_job<kSel>(j, t, lane, false, len);
    }
  }
};

/* Pack digests not fused into the copy: read back the wire bytes. */
struct PackDigestPlan {
  static constexpr int kMinBlocks = 1;
  const refit_pack_desc_t *descs;
  uint8_t *buf;
  unsigned long long *acc;
  __device__ int64_t tiles(int64_t i) const {
    const refit_pack_desc_t &d = descs[i];
    const Job j = pack_job(d, buf);
    const int64_t len = d.rows * d.row_bytes;
    if (!d.digest || (!pack_prewritten(d) && (j.kind == kNone || digest_unit(j, len) > 0)))
      return 0;
    return ceil_div(ceil_div(len, 8), kDigestWords);
  }
  __device__ void run(int64_t i, int64_t t, int lane) const {
    const refit_pack_desc_t &d = descs[i];
    const uint64_t s = warp_sum(
        digest_tile(buf + d.dst_offset, d.rows * d.row_bytes, t, lane));
    if (lane == 0)
      atomicAdd(&acc[i], static_cast<unsigned long long>(s));
  }
};

/*
 * Whether every job of a land descriptor sums the digest of the wire bytes it
 * reads while landing them: QUANTIZE always (its BF16 loads are whole words of
 * the contiguous wire rows, at any alignment), COPY and SPLIT when
 * digest_unit allows.
 */
__device__ inline bool land_digest_fused(const refit_land_desc_t &d, const Job jobs[2],
                                         int nj, int64_t len) {
  if (d.op == REFIT_CHUNK_BLOCK_SPLIT) /* its jobs skip the repeated slots */
    return false;
  for (int k = 0; k < nj; k++)
    if (jobs[k].kind != kQuant && digest_unit(jobs[k], len) == 0)
      return false;
  return true;
}

/*
 * Land, one pass: every descriptor's jobs, each summing its chunk's digest
 * from the bytes it reads where land_digest_fused allows. A digest chunk that
 * cannot (misaligned wire or destination) gets digest tiles after its land
 * tiles in the same launch: a second read of that chunk only, with no order
 * between the two since landing does not wait for the check.
 */
template <int kSel> struct LandPlan {
  static constexpr int kMinBlocks = kSel == kQuantJobs ? kQuantMinBlocks : 1;
  const refit_land_desc_t *descs;
  const uint8_t *staging;
  unsigned long long *acc;
  __device__ int64_t tiles(int64_t i) const {
    const refit_land_desc_t &d = descs[i];
    Job jobs[2];
    const int nj = land_jobs(d, staging, jobs);
    if (!selected<kSel>(jobs, nj))
      return 0;
    const int64_t len = d.rows * d.row_bytes;
    int64_t n = job_tiles(jobs[0]) + (nj > 1 ? job_tiles(jobs[1]) : 0);
    if (d.digest && !land_digest_fused(d, jobs, nj, len))
      n += ceil_div(ceil_div(len, 8), kDigestWords);
    return n;
  }
  __device__ void run(int64_t i, int64_t t, int lane) const {
    const refit_land_desc_t &d = descs[i];
    Job jobs[2];
    const int nj = land_jobs(d, staging, jobs);
    const int64_t len = d.rows * d.row_bytes;
    const bool fused = d.digest && land_digest_fused(d, jobs, nj, len);
    const int64_t t0 = job_tiles(jobs[0]), t1 = nj > 1 ? job_tiles(jobs[1]) : 0;
    uint64_t s;
    if (t < t0)
      s = run_job<kSel>(jobs[0], t, lane, fused, len);
    else if (t < t0 + t1)
      s = run_job<kSel>(jobs[1], t - t0, lane, fused, len);
    else
      s = digest_tile(staging + d.src_offset, len, t - t0 - t1, lane);
    if (fused || t >= t0 + t1) {
      s = warp_sum(s);
      if (lane == 0)
        atomicAdd(&acc[i], static_cast<unsigned long long>(s));
    }
  }
};

__global__ void refit_dp_pack_finalize_kernel(const refit_pack_desc_t *descs,
                                              int64_t n, uint64_t tag, uint8_t *buf,
                                              const unsigned long long *acc) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const refit_pack_desc_t &d = descs[i];
    if (!d.digest || (pack_job(d, buf).kind == kNone && !pack_prewritten(d)))
      continue;
    const int64_t len = d.rows * d.row_bytes;
    const uint64_t v = static_cast<uint64_t>(len) * REFIT_DIGEST_P1 + acc[i] +
                       refit_seal(d.seal_key, tag);
    uint8_t *p = buf + d.dst_offset + len;
    for (int b = 0; b < 8; b++)
      p[b] = static_cast<uint8_t>(v >> (8 * b));
  }
}

/* Land digests, after the land: compare each sum with the chunk's trailer. */
__global__ void refit_dp_land_check_kernel(const refit_land_desc_t *descs,
                                           int64_t n, uint64_t tag,
                                           const uint8_t *staging,
                                           const unsigned long long *acc,
                                           int64_t *bad) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const refit_land_desc_t &d = descs[i];
    Job jobs[2];
    if (!d.digest || land_jobs(d, staging, jobs) == 0)
      continue;
    const int64_t len = d.rows * d.row_bytes;
    if (static_cast<uint64_t>(len) * REFIT_DIGEST_P1 + acc[i] + refit_seal(d.seal_key, tag) !=
        load_le64(staging + d.src_offset + len))
      report_bad(bad, i);
  }
}

/* ---- Scratch: per-descriptor accumulators from a private pool -------------
 */

constexpr int kMaxDevices = 64;
pthread_mutex_t g_pool_lock = PTHREAD_MUTEX_INITIALIZER;
cudaMemPool_t g_pool[kMaxDevices];
bool g_pool_made[kMaxDevices];

/*
 * n zeroed 8-byte accumulators, stream-ordered. The pool keeps freed memory
 * (release threshold: unlimited), so after the first refit an allocation
 * costs no driver call into the OS; it is private so that our threshold does
 * not change the process's default pool.
 */
refit_status_t scratch_get(int64_t n, cudaStream_t stream,
                           unsigned long long **out, const char *what) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess && (dev < 0 || dev >= kMaxDevices))
    return REFIT_ERR(REFIT_ERR_CUDA,
                     "%s (cuda): device %d beyond the %d supported", what, dev,
                     kMaxDevices);
  if (err == cudaSuccess) {
    pthread_mutex_lock(&g_pool_lock);
    if (!g_pool_made[dev]) {
      cudaMemPoolProps props = {};
      props.allocType = cudaMemAllocationTypePinned;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = dev;
      err = cudaMemPoolCreate(&g_pool[dev], &props);
      if (err == cudaSuccess) {
        uint64_t keep = UINT64_MAX;
        err = cudaMemPoolSetAttribute(g_pool[dev],
                                      cudaMemPoolAttrReleaseThreshold, &keep);
        g_pool_made[dev] = err == cudaSuccess;
      }
    }
    pthread_mutex_unlock(&g_pool_lock);
  }
  void *p = NULL;
  const size_t bytes = static_cast<size_t>(n) * sizeof(unsigned long long);
  if (err == cudaSuccess)
    err = cudaMallocFromPoolAsync(&p, bytes, g_pool[dev], stream);
  if (err == cudaSuccess) {
    err = cudaMemsetAsync(p, 0, bytes, stream);
    if (err != cudaSuccess)
      cudaFreeAsync(p, stream);
  }
  if (err != cudaSuccess)
    return REFIT_ERR(REFIT_ERR_CUDA,
                     "%s (cuda): scratch of %lld accumulators: %s", what,
                     (long long)n, cudaGetErrorString(err));
  *out = static_cast<unsigned long long *>(p);
  return REFIT_OK;
}

refit_status_t scratch_put(unsigned long long *p, cudaStream_t stream,
                           const char *what) {
  const cudaError_t err = cudaFreeAsync(p, stream);
  if (err != cudaSuccess)
    return REFIT_ERR(REFIT_ERR_CUDA, "%s (cuda): freeing scratch: %s", what,
                     cudaGetErrorString(err));
  return REFIT_OK;
}

refit_status_t check_table(const char *what, const void *descs, int64_t n,
                           const void *buf) {
  if (n < 0 || (n > 0 && (descs == NULL || buf == NULL)))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s (cuda): bad arguments (table %p, n = %lld, buffer %p)",
                     what, descs, (long long)n, buf);
  return REFIT_OK;
}

} // namespace

extern "C" refit_status_t
refit_pack_rows_cuda(const refit_pack_desc_t *descs_device, int64_t n,
                     uint64_t tag, void *buf, cudaStream_t stream) {
  const char *what = "pack";
  REFIT_CHECK(check_table(what, descs_device, n, buf));
  if (n == 0)
    return REFIT_OK;
  unsigned long long *acc = NULL;
  REFIT_CHECK(scratch_get(n, stream, &acc, what));
  uint8_t *wire = static_cast<uint8_t *>(buf);
  refit_status_t st =
      launch_tiles(PackPlan<kQuantJobs>{descs_device, wire, acc}, n, stream, what);
  if (st == REFIT_OK)
    st = launch_tiles(PackPlan<kOtherJobs>{descs_device, wire, acc}, n, stream, what);
  if (st == REFIT_OK)
    st = launch_tiles(PackDigestPlan{descs_device, wire, acc}, n, stream,
                      "pack digest");
  if (st == REFIT_OK) {
    refit_dp_pack_finalize_kernel<<<static_cast<unsigned>(per_desc_blocks(n)),
                                    kThreads, 0, stream>>>(descs_device, n, tag,
                                                           wire, acc);
    st = refit_cuda_launch_check("pack digest finalize");
  }
  const refit_status_t put = scratch_put(acc, stream, what);
  return st != REFIT_OK ? st : put;
}

/* Every wire row's scale slots (4 * slots bytes after its `cols` values):
 * the FP32 scales of its block row, row r taking block row r / 128 of
 * `scales` (slots a row), as pack_block of the C reference writes them. */
__global__ void refit_dp_block_slots_kernel(uint8_t *wire, int64_t rows, int64_t cols,
                                            int64_t row_bytes, const float *scales,
                                            int64_t slots) {
  const int64_t width = 4 * slots;
  const uint8_t *from = reinterpret_cast<const uint8_t *>(scales);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < rows * width; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, b = i - r * width;
    wire[r * row_bytes + cols + b] = from[(r / REFIT_FP8_BLOCK) * width + b];
  }
}

extern "C" refit_status_t refit_pack_blocks_cuda(const refit_pack_desc_t *descs_host,
                                                 int64_t n, void *buf,
                                                 cudaStream_t stream) {
  const char *what = "pack block FP8";
  REFIT_CHECK(refit_pack_descs_check(descs_host, n));
  int64_t most = 0; /* FP32 scales of the largest chunk */
  for (int64_t i = 0; i < n; i++)
    if (descs_host[i].op == REFIT_CHUNK_BLOCK_QUANTIZE) {
      const int64_t k = refit_fp8_block_count(descs_host[i].rows) *
                        REFIT_BLOCK_WIRE_SLOTS(descs_host[i].cols);
      most = k > most ? k : most;
    }
  if (most == 0)
    return REFIT_OK;
  if (buf == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "%s (cuda): NULL wire buffer", what);
  unsigned long long *acc = NULL; /* 8-byte units: two scales each */
  REFIT_CHECK(scratch_get((most + 1) / 2, stream, &acc, what));
  float *scales = reinterpret_cast<float *>(acc);
  refit_status_t st = REFIT_OK;
  for (int64_t i = 0; i < n && st == REFIT_OK; i++) {
    const refit_pack_desc_t &d = descs_host[i];
    if (d.op != REFIT_CHUNK_BLOCK_QUANTIZE || d.rows == 0 || d.cols == 0)
      continue;
    uint8_t *wire = static_cast<uint8_t *>(buf) + d.dst_offset;
    const int64_t slots = REFIT_BLOCK_WIRE_SLOTS(d.cols);
    st = refit_fp8_block_quantize_cuda(
        static_cast<const uint16_t *>(d.src), d.rows, d.cols,
        d.rows > 1 ? d.src_pitch / 2 : d.cols, static_cast<refit_fp8_scale_t>(d.fp8_scale),
        wire, d.row_bytes, scales, slots, stream);
    if (st != REFIT_OK)
      break;
    static refit_cuda_grid_cache_t grid;
    const int64_t work = (d.rows * 4 * slots + 255) / 256;
    refit_dp_block_slots_kernel<<<
        refit_cuda_grid(refit_dp_block_slots_kernel, 256, grid, work), 256, 0, stream>>>(
        wire, d.rows, d.cols, d.row_bytes, scales, slots);
    st = refit_cuda_launch_check("pack block FP8 scale slots");
  }
  const refit_status_t put = scratch_put(acc, stream, what);
  return st != REFIT_OK ? st : put;
}

extern "C" refit_status_t
refit_land_rows_cuda(const refit_land_desc_t *descs_device, int64_t n,
                     uint64_t tag, const void *staging, int64_t *bad_chunk_device,
                     cudaStream_t stream) {
  const char *what = "land";
  REFIT_CHECK(check_table(what, descs_device, n, staging));
  if (n > 0 && bad_chunk_device == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "land (cuda): NULL bad_chunk_device");
  if (n == 0)
    return REFIT_OK;
  unsigned long long *acc = NULL;
  REFIT_CHECK(scratch_get(n, stream, &acc, what));
  const uint8_t *wire = static_cast<const uint8_t *>(staging);
  refit_status_t st =
      launch_tiles(LandPlan<kQuantJobs>{descs_device, wire, acc}, n, stream, what);
  if (st == REFIT_OK)
    st = launch_tiles(LandPlan<kOtherJobs>{descs_device, wire, acc}, n, stream, what);
  if (st == REFIT_OK) {
    refit_dp_land_check_kernel<<<static_cast<unsigned>(per_desc_blocks(n)),
                                 kThreads, 0, stream>>>(descs_device, n, tag, wire,
                                                        acc, bad_chunk_device);
    st = refit_cuda_launch_check("land digest check");
  }
  const refit_status_t put = scratch_put(acc, stream, what);
  return st != REFIT_OK ? st : put;
}
