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
 *   digest    chunk-relative words (runtime/src/core/digest.h): each warp
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
 * Kernel refit_dp_synth_kernel, refit_dp_compare_kernel: grid-stride loops,
 * 8 synthetic values (one 16-byte store) per thread; 16-byte compares.
 */
#include "kernels/cuda_launch.cuh"
#include "kernels/datapath_cuda.h"
#include "kernels/mxfp8_device.cuh"
#include "kernels/synth_rules.h"

#include "core/digest.h"

#include <pthread.h>

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

/* ---- Descriptors as jobs ------------------------------------------------- */

__device__ inline bool quant_shape_ok(int64_t cols, int64_t row_bytes,
                                      int64_t expected) {
  return cols >= 0 && cols % 32 == 0 && row_bytes == expected;
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
    if (!d.digest || j.kind == kNone || digest_unit(j, len) > 0)
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
__device__ inline bool land_digest_fused(const Job jobs[2], int nj,
                                         int64_t len) {
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
    if (d.digest && !land_digest_fused(jobs, nj, len))
      n += ceil_div(ceil_div(len, 8), kDigestWords);
    return n;
  }
  __device__ void run(int64_t i, int64_t t, int lane) const {
    const refit_land_desc_t &d = descs[i];
    Job jobs[2];
    const int nj = land_jobs(d, staging, jobs);
    const int64_t len = d.rows * d.row_bytes;
    const bool fused = d.digest && land_digest_fused(jobs, nj, len);
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

__global__ void refit_dp_pack_finalize_kernel(const refit_pack_desc_t *descs,
                                              int64_t n, uint64_t tag, uint8_t *buf,
                                              const unsigned long long *acc) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const refit_pack_desc_t &d = descs[i];
    if (!d.digest || pack_job(d, buf).kind == kNone)
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

/* Blocks for a kernel with a thread per descriptor. */
int64_t per_desc_blocks(int64_t n) {
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

/* ---- Synthetic values and comparison --------------------------------------
 */

template <bool kRows>
__global__ void __launch_bounds__(kThreads)
    refit_dp_synth_kernel(uint64_t key, int norm, int64_t tensor_cols,
                          int64_t row0, int64_t col0, const uint64_t *keys,
                          const int32_t *norms, const int64_t *bases,
                          int64_t cols, int64_t total, uint16_t *dst) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads * 8;
  for (int64_t e0 =
           (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * 8;
       e0 < total; e0 += step) {
    int64_t r = e0 / cols, c = e0 - r * cols;
    uint16_t v[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
      if (e0 + k < total)
        v[k] = kRows ? refit_synth_value(keys[r], norms[r], bases[r] + c)
                     : refit_synth_value(key, norm,
                                         (row0 + r) * tensor_cols + col0 + c);
      if (++c == cols) {
        c = 0;
        r++;
      }
    }
    uint16_t *d = dst + e0;
    if (e0 + 8 <= total && reinterpret_cast<uintptr_t>(d) % 16 == 0) {
      uint4 u;
      memcpy(&u, v, sizeof(u));
      *reinterpret_cast<uint4 *>(d) = u;
    } else {
      for (int k = 0; k < 8 && e0 + k < total; k++)
        d[k] = v[k];
    }
  }
}

refit_status_t launch_synth(bool by_rows, uint64_t key, int norm,
                            int64_t tensor_cols, int64_t row0, int64_t col0,
                            const uint64_t *keys, const int32_t *norms,
                            const int64_t *bases, int64_t rows, int64_t cols,
                            uint16_t *dst, cudaStream_t stream) {
  const char *what = by_rows ? "synth rows" : "synth rect";
  if (rows < 0 || cols < 0 || (rows * cols > 0 && dst == NULL) ||
      (by_rows && rows * cols > 0 &&
       (keys == NULL || norms == NULL || bases == NULL)))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s (cuda): bad arguments ([%lld, %lld], dst %p)", what,
                     (long long)rows, (long long)cols,
                     static_cast<void *>(dst));
  const int64_t total = rows * cols;
  if (total == 0)
    return REFIT_OK;
  int64_t blocks = (total + 8 * kThreads - 1) / (8 * kThreads);
  if (by_rows) {
    static const int64_t fill =
        refit_cuda_filling_grid(refit_dp_synth_kernel<true>, kThreads);
    blocks = blocks < fill ? blocks : fill;
    refit_dp_synth_kernel<true>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
            key, norm, tensor_cols, row0, col0, keys, norms, bases, cols, total,
            dst);
  } else {
    static const int64_t fill =
        refit_cuda_filling_grid(refit_dp_synth_kernel<false>, kThreads);
    blocks = blocks < fill ? blocks : fill;
    refit_dp_synth_kernel<false>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
            key, norm, tensor_cols, row0, col0, keys, norms, bases, cols, total,
            dst);
  }
  return refit_cuda_launch_check(what);
}

/* Differences of one 16-byte unit at element index i0 (elements of `elem`). */
__device__ inline void compare_unit(uint4 x, uint4 y, int elem, int64_t i0,
                                    int64_t &count, int64_t &first) {
  const uint32_t a[4] = {x.x, x.y, x.z, x.w}, b[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
  for (int w = 0; w < 4; w++) {
    const uint32_t diff = a[w] ^ b[w];
    if (diff == 0)
      continue;
    const int per = 4 / elem;
    for (int k = 0; k < per; k++) {
      const uint32_t mask = elem == 1 ? 0xffu : 0xffffu;
      if ((diff >> (8 * elem * k)) & mask) {
        const int64_t idx = i0 + w * per + k;
        first = idx < first ? idx : first;
        count++;
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    refit_dp_compare_kernel(const uint8_t *a, const uint8_t *b, int64_t bytes,
                            int elem, int64_t *count_out, int64_t *first_out) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  int64_t count = 0, first = INT64_MAX, done = 0;
  if (reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(b) % 16 == 0) {
    const uint4 *va = reinterpret_cast<const uint4 *>(a),
                *vb = reinterpret_cast<const uint4 *>(b);
    const int64_t nv = bytes / 16;
    for (int64_t v = tid; v < nv; v += step)
      compare_unit(va[v], vb[v], elem, v * (16 / elem), count, first);
    done = nv * 16;
  }
  for (int64_t i = done / elem + tid; i < bytes / elem; i += step) {
    bool differ = a[i * elem] != b[i * elem];
    if (elem == 2)
      differ = differ || a[i * elem + 1] != b[i * elem + 1];
    if (differ) {
      count++;
      first = i < first ? i : first;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    count += __shfl_xor_sync(kFull, count, o);
    const int64_t f = __shfl_xor_sync(kFull, first, o);
    first = f < first ? f : first;
  }
  if (threadIdx.x % 32 == 0 && count > 0) {
    atomicAdd(reinterpret_cast<unsigned long long *>(count_out),
              static_cast<unsigned long long>(count));
    atomicMin(reinterpret_cast<long long *>(first_out),
              static_cast<long long>(first));
  }
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

extern "C" refit_status_t
refit_synth_rect_cuda(uint64_t key, int norm, int64_t tensor_cols, int64_t row0,
                      int64_t col0, int64_t rows, int64_t cols, uint16_t *dst,
                      cudaStream_t stream) {
  return launch_synth(false, key, norm, tensor_cols, row0, col0, NULL, NULL,
                      NULL, rows, cols, dst, stream);
}

extern "C" refit_status_t
refit_synth_rows_cuda(const uint64_t *keys, const int32_t *norms,
                      const int64_t *bases, int64_t rows, int64_t cols,
                      uint16_t *dst, cudaStream_t stream) {
  return launch_synth(true, 0, 0, 0, 0, 0, keys, norms, bases, rows, cols, dst,
                      stream);
}

extern "C" refit_status_t refit_compare_cuda(const void *a, const void *b,
                                             size_t bytes, size_t elem,
                                             int64_t *count_device,
                                             int64_t *first_device,
                                             cudaStream_t stream) {
  REFIT_CHECK(refit_compare_check(bytes, elem));
  if (bytes == 0)
    return REFIT_OK;
  if (a == NULL || b == NULL || count_device == NULL || first_device == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "compare (cuda): NULL pointer");
  static const int64_t fill =
      refit_cuda_filling_grid(refit_dp_compare_kernel, kThreads);
  const int64_t units = static_cast<int64_t>(bytes / 16) + 1;
  int64_t blocks = (units + kThreads - 1) / kThreads;
  blocks = blocks < fill ? blocks : fill;
  refit_dp_compare_kernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                            stream>>>(
      static_cast<const uint8_t *>(a), static_cast<const uint8_t *>(b),
      static_cast<int64_t>(bytes), static_cast<int>(elem), count_device,
      first_device);
  return refit_cuda_launch_check("compare");
}
