/*
 * The data path's tile primitives (internal to kernels/datapath.cu and
 * kernels/direct.cu): the constants of their launches, a descriptor's work as
 * a Job, the warp-level copy, digest and quantize tiles with the digest terms
 * they sum, and the tile kernel that spreads a descriptor table's tiles over
 * a machine-filling grid (kernels/datapath.cu describes its mapping).
 */
#ifndef REFIT_KERNELS_DATAPATH_TILES_CUH
#define REFIT_KERNELS_DATAPATH_TILES_CUH

#include "kernels/cuda_launch.cuh"
#include "kernels/mxfp8_device.cuh"

#include "core/digest.h"

#include <stdint.h>

namespace {
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kCopyTile = 8192;    /* bytes of copy per warp tile */
constexpr int64_t kDigestWords = 1024; /* words per digest tile */
constexpr int kQuantUnroll = 4;        /* loads in flight per lane */
constexpr int64_t kQuantStep = 8 * kQuantUnroll; /* blocks per warp step */
/* Steps per warp tile: a tile's descriptor lookup (binary search, the
 * descriptor's loads) is paid once for this many steps. */
constexpr int kQuantSteps = 4;
constexpr int64_t kQuantTile = kQuantStep * kQuantSteps; /* blocks per tile */
constexpr unsigned kFull = 0xffffffffu;

enum { kNone = 0, kCopy = 1, kQuant = 2 };

/* One piece of work of a descriptor: copy rows, or quantize BF16 rows. */
struct Job {
  int kind;
  const uint8_t *src;
  int64_t src_pitch;
  uint8_t *dst;
  int64_t dst_pitch;
  uint8_t *scale;
  int64_t scale_pitch;
  int64_t rows, width; /* copy: width = bytes per row; quantize: cols */
  /* Where the job's bytes lie in its wire chunk (the digest's word index):
   * byte c of row r is byte chunk_off + r * chunk_pitch + c of the chunk. */
  int64_t chunk_off, chunk_pitch;
};

__device__ inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

/* Contiguous rows of a copy become one long row (more 16-byte work, fewer
 * tiles). */
__device__ inline Job collapse(Job j) {
  if (j.kind == kCopy && j.rows > 1 && j.src_pitch == j.width &&
      j.dst_pitch == j.width) {
    j.width *= j.rows;
    j.rows = 1;
  }
  return j;
}

/* Copy jobs: rows per tile (narrow rows share a tile) and tiles per row. */
__device__ inline int64_t copy_rows_per_tile(const Job &j) {
  return j.width >= kCopyTile ? 1 : kCopyTile / (j.width > 0 ? j.width : 1);
}

__device__ inline int64_t job_tiles(const Job &j) {
  if (j.rows <= 0 || j.width <= 0)
    return 0;
  if (j.kind == kCopy)
    return j.width > kCopyTile ? j.rows * ceil_div(j.width, kCopyTile)
                               : ceil_div(j.rows, copy_rows_per_tile(j));
  if (j.kind == kQuant)
    return ceil_div(j.rows * (j.width / 32), kQuantTile);
  return 0;
}

__device__ inline uint64_t warp_sum(uint64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(kFull, v, o);
  return v;
}

/*
 * Copy n bytes s -> d with `lanes` lanes (lane = 0 .. lanes-1) in units of V:
 * bytes up to V's alignment of s first, then V units, then the tail. The
 * caller picked V so that s and d are equally aligned modulo sizeof(V).
 */
template <typename V>
__device__ inline void copy_units(const uint8_t *__restrict__ s,
                                  uint8_t *__restrict__ d, int64_t n, int lane,
                                  int lanes) {
  constexpr int64_t kV = sizeof(V);
  int64_t head =
      static_cast<int64_t>((kV - reinterpret_cast<uintptr_t>(s) % kV) % kV);
  head = head < n ? head : n;
  for (int64_t i = lane; i < head; i += lanes)
    d[i] = s[i];
  const V *sv = reinterpret_cast<const V *>(s + head);
  V *dv = reinterpret_cast<V *>(d + head);
  const int64_t nv = (n - head) / kV;
  int64_t i = lane;
  /* Four loads in flight before their stores. */
  for (; i + 3 * lanes < nv; i += 4 * lanes) {
    const V a = sv[i], b = sv[i + lanes], c = sv[i + 2 * lanes],
            e = sv[i + 3 * lanes];
    dv[i] = a;
    dv[i + lanes] = b;
    dv[i + 2 * lanes] = c;
    dv[i + 3 * lanes] = e;
  }
  for (; i < nv; i += lanes)
    dv[i] = sv[i];
  for (int64_t t = head + nv * kV + lane; t < n; t += lanes)
    d[t] = s[t];
}

__device__ inline void copy_span(const uint8_t *s, uint8_t *d, int64_t n,
                                 int lane, int lanes) {
  const uintptr_t x =
      reinterpret_cast<uintptr_t>(s) ^ reinterpret_cast<uintptr_t>(d);
  if (x % 16 == 0)
    copy_units<uint4>(s, d, n, lane, lanes);
  else if (x % 8 == 0)
    copy_units<uint2>(s, d, n, lane, lanes);
  else if (x % 4 == 0)
    copy_units<uint32_t>(s, d, n, lane, lanes);
  else if (x % 2 == 0)
    copy_units<uint16_t>(s, d, n, lane, lanes);
  else
    copy_units<uint8_t>(s, d, n, lane, lanes);
}

/* Little-endian word of up to 8 bytes at p (zero-padded), read bytewise. */
__device__ inline uint64_t gather_word(const uint8_t *p, int64_t avail) {
  uint64_t w = 0;
  for (int64_t b = 0; b < 8 && b < avail; b++)
    w |= static_cast<uint64_t>(p[b]) << (8 * b);
  return w;
}

/* The digest terms of the words of one copy unit, word0 its first word. */
__device__ inline uint64_t unit_terms(uint4 v, int64_t word0) {
  return refit_digest_term2(v.x, v.y, static_cast<uint64_t>(word0)) +
         refit_digest_term2(v.z, v.w, static_cast<uint64_t>(word0 + 1));
}
__device__ inline uint64_t unit_terms(uint2 v, int64_t word0) {
  return refit_digest_term2(v.x, v.y, static_cast<uint64_t>(word0));
}

/*
 * Copy n bytes s -> d (both aligned to V, 16 or 8 bytes) and return this
 * lane's digest terms for them: s and d start at word `word0` of the wire
 * chunk (whichever of the two it is). The span ends on a word boundary of the
 * chunk or at its end (digest_unit checks it), so the bytes after the last
 * full unit are whole words plus at most the chunk's zero-padded last one;
 * lane 0 adds them.
 */
template <typename V>
__device__ inline uint64_t
copy_span_digest(const uint8_t *__restrict__ s, uint8_t *__restrict__ d,
                 int64_t n, int64_t word0, int lane, int lanes) {
  constexpr int64_t kV = sizeof(V), kWords = kV / 8;
  const V *sv = reinterpret_cast<const V *>(s);
  V *dv = reinterpret_cast<V *>(d);
  const int64_t nv = n / kV;
  uint64_t sum = 0;
  int64_t i = lane;
  /* Four loads in flight before their stores and sums. */
  for (; i + 3 * lanes < nv; i += 4 * lanes) {
    V v[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
      v[k] = sv[i + k * lanes];
#pragma unroll
    for (int k = 0; k < 4; k++) {
      dv[i + k * lanes] = v[k];
      sum += unit_terms(v[k], word0 + kWords * (i + k * lanes));
    }
  }
  for (; i < nv; i += lanes) {
    const V v = sv[i];
    dv[i] = v;
    sum += unit_terms(v, word0 + kWords * i);
  }
  const int64_t t0 = nv * kV;
  for (int64_t t = t0 + lane; t < n; t += lanes)
    d[t] = s[t];
  if (lane == 0)
    for (int64_t t = t0; t < n; t += 8)
      sum += refit_digest_term(gather_word(s + t, n - t),
                               static_cast<uint64_t>(word0 + t / 8));
  return sum;
}

/* The lane's group for rows narrower than a warp's 512 bytes per step. */
__device__ inline int group_lanes(int64_t width) {
  int l = 1;
  while (l < 32 && 16 * l < width)
    l *= 2;
  return l;
}

/*
 * The unit (16 or 8 bytes) in which a copy job can sum the digest of the wire
 * bytes it moves while it copies them, or 0 when it cannot: source and
 * destination aligned to the unit, every row starting on a unit boundary of
 * the chunk (so a unit holds whole words) and ending on a word boundary or at
 * the chunk's end (the chunk's rows are len bytes).
 */
__device__ inline int digest_unit(const Job &j, int64_t len) {
  if (j.kind != kCopy ||
      !(j.width % 8 == 0 || (j.rows <= 1 && j.chunk_off + j.width == len)))
    return 0;
  const uintptr_t s = reinterpret_cast<uintptr_t>(j.src),
                  d = reinterpret_cast<uintptr_t>(j.dst);
  for (int u = 16; u >= 8; u -= 8)
    if (s % u == 0 && d % u == 0 && j.chunk_off % u == 0 &&
        (j.rows <= 1 || (j.src_pitch % u == 0 && j.dst_pitch % u == 0 &&
                         j.chunk_pitch % u == 0)))
      return u;
  return 0;
}

/* n bytes s -> d, with the digest terms when unit is 16 or 8 (else 0). */
__device__ inline uint64_t copy_span_unit(const uint8_t *s, uint8_t *d,
                                          int64_t n, int64_t chunk_byte,
                                          int unit, int lane, int lanes) {
  if (unit == 16)
    return copy_span_digest<uint4>(s, d, n, chunk_byte / 8, lane, lanes);
  if (unit == 8)
    return copy_span_digest<uint2>(s, d, n, chunk_byte / 8, lane, lanes);
  copy_span(s, d, n, lane, lanes);
  return 0;
}

/* Can rows of j be copied as a grid of 16-byte units (every row a whole
 * number of units, sources and destinations 16-byte aligned)? */
__device__ inline bool rows_of_units(const Job &j) {
  const uintptr_t s = reinterpret_cast<uintptr_t>(j.src),
                  d = reinterpret_cast<uintptr_t>(j.dst);
  return j.width % 16 == 0 && s % 16 == 0 && d % 16 == 0 &&
         (j.rows <= 1 || (j.src_pitch % 16 == 0 && j.dst_pitch % 16 == 0));
}

/*
 * Rows [r0, r1) of a copy job whose rows are whole 16-byte units
 * (rows_of_units): the tile's units in row-major order, unit u to lane
 * u % 32, four loads in flight per lane before their stores. Narrow rows
 * (the 64-byte scale rows of a SPLIT) thus keep as many loads in flight as
 * wide ones. With kDigest (digest_unit 16) returns the lane's terms.
 */
template <bool kDigest>
__device__ inline uint64_t copy_rows_units(const Job &j, int64_t r0, int64_t r1,
                                           int lane) {
  const int64_t upr = j.width / 16, total = (r1 - r0) * upr;
  uint64_t sum = 0;
  int64_t u = lane;
  for (; u < total; u += 4 * 32) {
    uint4 v[4];
    int64_t r[4], c[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const int64_t x = u + 32 * k;
      r[k] = x / upr;
      c[k] = x - r[k] * upr;
      r[k] += r0;
      if (x < total)
        v[k] = *reinterpret_cast<const uint4 *>(j.src + r[k] * j.src_pitch + 16 * c[k]);
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
      if (u + 32 * k >= total)
        break;
      *reinterpret_cast<uint4 *>(j.dst + r[k] * j.dst_pitch + 16 * c[k]) = v[k];
      if (kDigest)
        sum += unit_terms(v[k], (j.chunk_off + r[k] * j.chunk_pitch + 16 * c[k]) / 8);
    }
  }
  return sum;
}

/*
 * Tile t of a copy job. With unit 16 or 8 (digest_unit: the job may sum the
 * digest of its wire bytes while copying) returns the lane's terms, else 0.
 */
__device__ inline uint64_t copy_tile(const Job &j, int64_t t, int lane,
                                     int unit) {
  if (j.width <= kCopyTile && (unit == 16 || unit == 0) && rows_of_units(j)) {
    const int64_t rpt = copy_rows_per_tile(j);
    const int64_t r0 = t * rpt, r1 = r0 + rpt < j.rows ? r0 + rpt : j.rows;
    return unit == 16 ? copy_rows_units<true>(j, r0, r1, lane)
                      : copy_rows_units<false>(j, r0, r1, lane);
  }
  if (j.width > kCopyTile) {
    const int64_t segs = ceil_div(j.width, kCopyTile);
    const int64_t r = t / segs, lo = (t % segs) * kCopyTile;
    const int64_t n = j.width - lo < kCopyTile ? j.width - lo : kCopyTile;
    return copy_span_unit(j.src + r * j.src_pitch + lo,
                          j.dst + r * j.dst_pitch + lo, n,
                          j.chunk_off + r * j.chunk_pitch + lo, unit, lane, 32);
  }
  uint64_t sum = 0;
  const int64_t rpt = copy_rows_per_tile(j);
  const int lanes = group_lanes(j.width), groups = 32 / lanes;
  const int64_t r0 = t * rpt, r1 = r0 + rpt < j.rows ? r0 + rpt : j.rows;
  for (int64_t r = r0 + lane / lanes; r < r1; r += groups)
    sum += copy_span_unit(j.src + r * j.src_pitch, j.dst + r * j.dst_pitch,
                          j.width, j.chunk_off + r * j.chunk_pitch, unit,
                          lane % lanes, lanes);
  return sum;
}

/*
 * Tile t of a quantize job: the warp quantizes its kQuantTile blocks. With
 * `digest` (land QUANTIZE, whose source is the whole contiguous wire chunk)
 * returns the lane's terms of the BF16 words it read, else 0.
 */
__device__ inline uint64_t quant_tile(const Job &j, int64_t t, int lane,
                                      bool digest) {
  const int64_t nb = j.width / 32;
  const refit_mxfp8_dev_rows_t m = {j.src,   j.src_pitch,   j.dst, j.dst_pitch,
                                    j.scale, j.scale_pitch, nb,    j.rows * nb};
  uint64_t sum = 0;
  for (int k = 0; k < kQuantSteps; k++) {
    const int64_t g0 = t * kQuantTile + k * kQuantStep;
    if (g0 >= m.total)
      break;
    sum += digest ? refit_mxfp8_dev_warp_tile<kQuantUnroll, true>(m, g0, lane)
                  : refit_mxfp8_dev_warp_tile<kQuantUnroll>(m, g0, lane);
  }
  return sum;
}

/*
 * Which descriptors a tile kernel takes: the quantizing ones and the rest run
 * as two kernels, so that each is compiled for its own work (one kernel for
 * both needed twice the registers of the quantizer alone and spilled, which
 * halved the quantizer's speed).
 */
enum Select { kQuantJobs = 1, kOtherJobs = 2 };
/* Blocks per SM the quantizing kernels are compiled for: 3 caps them at 80
 * registers (110 unbounded, 2 blocks); measured on the H200, land QUANTIZE
 * 0.54 of copy speed at 2 blocks, 0.60 at 3, 0.48 at 4 (spills). */
constexpr int kQuantMinBlocks = 3;

/* A descriptor's jobs belong to kernel kSel: a quantize job is alone. */
template <int kSel>
__device__ inline bool selected(const Job jobs[2], int nj) {
  const bool quant = nj == 1 && jobs[0].kind == kQuant;
  return kSel == kQuantJobs ? quant : (nj > 0 && !quant);
}

/*
 * Tile t of a job of kernel kSel; with `digest`, the lane's terms of the
 * wire bytes it read (the caller has checked with job_digest_fused that the
 * job can sum them).
 */
template <int kSel>
__device__ inline uint64_t run_job(const Job &j, int64_t t, int lane,
                                   bool digest, int64_t len) {
  if constexpr (kSel == kQuantJobs) {
    (void)len;
    return quant_tile(j, t, lane, digest);
  } else {
    return j.kind == kCopy ? copy_tile(j, t, lane, digest ? digest_unit(j, len) : 0)
                           : 0;
  }
}

/*
 * Word i of the chunk [w, w + len): aligned 8-byte load when w is 8-byte
 * aligned, two aligned loads and a funnel shift when both lie inside the
 * chunk, bytes otherwise (chunk ends).
 */
__device__ inline uint64_t chunk_word(const uint8_t *w, int64_t len,
                                      int64_t i) {
  const uint8_t *a = w + 8 * i;
  const int64_t sh = static_cast<int64_t>(reinterpret_cast<uintptr_t>(a) & 7);
  const uint8_t *p = a - sh;
  if (8 * i + 8 <= len) {
    if (sh == 0)
      return *reinterpret_cast<const uint64_t *>(a);
    if (p >= w && p + 16 <= w + len) {
      const uint64_t lo = reinterpret_cast<const uint64_t *>(p)[0];
      const uint64_t hi = reinterpret_cast<const uint64_t *>(p)[1];
      return (lo >> (8 * sh)) | (hi << (64 - 8 * sh));
    }
  }
  return gather_word(a, len - 8 * i);
}

/* This lane's terms of digest tile t of the chunk [w, w + len). */
__device__ inline uint64_t digest_tile(const uint8_t *w, int64_t len, int64_t t,
                                       int lane) {
  const int64_t words = ceil_div(len, 8);
  const int64_t i1 =
      (t + 1) * kDigestWords < words ? (t + 1) * kDigestWords : words;
  uint64_t sum = 0;
  for (int64_t i = t * kDigestWords + lane; i < i1; i += 32)
    sum += refit_digest_term(chunk_word(w, len, i), static_cast<uint64_t>(i));
  return sum;
}

__device__ inline uint64_t load_le64(const uint8_t *p) {
  return gather_word(p, 8);
}

/* *bad = min(*bad, i) where -1 means "none yet". */
__device__ inline void report_bad(int64_t *bad, int64_t i) {
  unsigned long long *p = reinterpret_cast<unsigned long long *>(bad);
  unsigned long long old = atomicAdd(p, 0ull), seen;
  do {
    seen = old;
    const long long cur = static_cast<long long>(seen);
    if (cur != -1 && cur <= i)
      return;
    old = atomicCAS(p, seen, static_cast<unsigned long long>(i));
  } while (old != seen);
}

/* ---- The tile kernel ------------------------------------------------------
 */

template <typename Plan>
__global__ void __launch_bounds__(kThreads, Plan::kMinBlocks)
    refit_dp_tile_kernel(Plan plan, int64_t n) {
  __shared__ int64_t prefix[kThreads];
  __shared__ int64_t warp_total[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  const int64_t nw = static_cast<int64_t>(gridDim.x) * kWarps;
  int64_t base = 0; /* number of the batch's first tile */
  for (int64_t d0 = 0; d0 < n; d0 += kThreads) {
    const int64_t d = d0 + threadIdx.x;
    int64_t c = d < n ? plan.tiles(d) : 0;
    /* Inclusive prefix sum over the block: warps, then warp totals. */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t y = __shfl_up_sync(kFull, c, o);
      if (lane >= o)
        c += y;
    }
    if (lane == 31)
      warp_total[warp] = c;
    __syncthreads();
    if (warp == 0) {
      int64_t v = lane < kWarps ? warp_total[lane] : 0;
#pragma unroll
      for (int o = 1; o < kWarps; o <<= 1) {
        const int64_t y = __shfl_up_sync(kFull, v, o);
        if (lane >= o)
          v += y;
      }
      if (lane < kWarps)
        warp_total[lane] = v;
    }
    __syncthreads();
    if (warp > 0)
      c += warp_total[warp - 1];
    prefix[threadIdx.x] = c;
    __syncthreads();
    const int64_t total = prefix[kThreads - 1];
    const int64_t batch = n - d0 < kThreads ? n - d0 : kThreads;
    /* This warp's first tile number >= base, then every nw-th. */
    for (int64_t T = base + ((gw - base) % nw + nw) % nw; T < base + total;
         T += nw) {
      const int64_t local = T - base;
      int lo = 0,
          hi = static_cast<int>(batch) - 1; /* smallest j: prefix[j] > local */
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (prefix[mid] > local)
          hi = mid;
        else
          lo = mid + 1;
      }
      plan.run(d0 + lo, local - (lo > 0 ? prefix[lo - 1] : 0), lane);
    }
    base += total;
    __syncthreads();
  }
}

/* Blocks for a kernel with a thread per descriptor. */
inline int64_t per_desc_blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return b < 1024 ? b : 1024;
}

template <typename Plan>
refit_status_t launch_tiles(const Plan &plan, int64_t n, cudaStream_t stream,
                            const char *what) {
  static const int64_t grid =
      refit_cuda_filling_grid(refit_dp_tile_kernel<Plan>, kThreads);
  refit_dp_tile_kernel<Plan>
      <<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(plan, n);
  return refit_cuda_launch_check(what);
}

} // namespace

#endif /* REFIT_KERNELS_DATAPATH_TILES_CUH */
