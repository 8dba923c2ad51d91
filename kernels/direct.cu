/*
 * The zero-copy data path, CUDA twin of kernels/direct.c (contract in
 * kernels/direct.h and kernels/direct_cuda.h). The tile kernel and its
 * mapping are the data path's (kernels/datapath_tiles.cuh); this file gives
 * it the direct descriptors' work.
 */
#include "kernels/cuda_launch.cuh"
#include "kernels/datapath_tiles.cuh"
#include "kernels/direct_cuda.h"
#include "kernels/fp8_block.h"
#include "kernels/fp8_block_device.cuh"
#include "kernels/layout.h"

#include "core/digest.h"

namespace {

constexpr int64_t kDirectQuantTile = 512; /* MXFP8 blocks per warp tile */
constexpr int64_t kDirectWordTile = 1024; /* 8-byte words per warp tile */
constexpr int64_t kDirectUnitTile = 2048; /* 16-byte units per DIGEST tile */
constexpr int kDirectUnitLoads = 4;       /* a lane's 16-byte loads in flight */

__device__ inline bool direct_reads(const refit_direct_desc_t &d) {
  return d.op == REFIT_DIRECT_COPY || d.op == REFIT_DIRECT_QUANTIZE ||
         d.op == REFIT_DIRECT_DIGEST || d.op == REFIT_DIRECT_SPLIT ||
         d.op == REFIT_DIRECT_BLOCK_QUANTIZE;
}

/* What the device can execute safely (the host check is the real one). */
__device__ inline bool direct_ok(const refit_direct_desc_t &d) {
  if (d.rows < 0 || d.cols < 0 || (d.staged && d.src_offset < 0))
    return false;
  if (d.op == REFIT_DIRECT_QUANTIZE || d.op == REFIT_DIRECT_SPLIT ||
      d.op == REFIT_DIRECT_PAD)
    return d.k > 0 && d.k % 32 == 0 && d.group_rows >= 1 && d.perm_rows >= d.group_rows &&
           (d.op == REFIT_DIRECT_PAD || (d.cols % 32 == 0 && d.col0 % 32 == 0));
  return d.op == REFIT_DIRECT_COPY || d.op == REFIT_DIRECT_DIGEST ||
         (d.op == REFIT_DIRECT_BLOCK_QUANTIZE && !d.staged);
}

/* Bytes of one row as the digest reads it (kernels/direct.h). */
__device__ inline int64_t direct_row_bytes(const refit_direct_desc_t &d) {
  return d.op == REFIT_DIRECT_SPLIT ? d.cols + d.cols / 32 : 2 * d.cols;
}

/* Descriptor i with src where its rows are: in place, or in the call's
 * buffer (staged). */
__device__ inline refit_direct_desc_t direct_at(const refit_direct_desc_t *descs,
                                                int64_t i, const uint8_t *buf) {
  refit_direct_desc_t d = descs[i];
  if (d.staged)
    d.src = buf + d.src_offset;
  return d;
}

__device__ inline int64_t direct_row(const refit_direct_desc_t &d, int64_t i) {
  return d.perm < 0 ? i
                    : refit_kernels_perm_inverse_index(
                          static_cast<refit_kernels_perm_kind_t>(d.perm), d.perm_rows, i);
}

__device__ inline bool direct_padded_row(const refit_direct_desc_t &d, int64_t j) {
  return j >= d.perm_rows ||
         (d.perm >= 0 &&
          refit_kernels_perm_index(static_cast<refit_kernels_perm_kind_t>(d.perm),
                                   d.perm_rows, j) >= d.group_rows);
}

/* Word w (8 bytes) of the chunk's rows taken back to back, read from the
 * strided source; the bytes past the chunk's end are 0. */
__device__ inline uint64_t direct_word(const refit_direct_desc_t &d, int64_t row_bytes,
                                       int64_t len, int64_t w) {
  const uint8_t *src = static_cast<const uint8_t *>(d.src);
  const int64_t o = 8 * w, r = o / row_bytes, c = o - r * row_bytes;
  const uint8_t *p = src + r * d.src_pitch + c;
  if (c + 8 <= row_bytes && (reinterpret_cast<uintptr_t>(p) & 7) == 0)
    return *reinterpret_cast<const uint64_t *>(p);
  uint64_t v = 0;
  for (int b = 0; b < 8 && o + b < len; b++) {
    const int64_t rb = (o + b) / row_bytes, cb = (o + b) - rb * row_bytes;
    v |= static_cast<uint64_t>(src[rb * d.src_pitch + cb]) << (8 * b);
  }
  return v;
}

/* Store word w of a COPY at its place in dst (the inverse of direct_word). */
__device__ inline void direct_store_word(const refit_direct_desc_t &d, int64_t row_bytes,
                                         int64_t len, int64_t w, uint64_t v) {
  uint8_t *dst = static_cast<uint8_t *>(d.dst);
  const int64_t o = 8 * w, r = o / row_bytes, c = o - r * row_bytes;
  uint8_t *p = dst + r * d.dst_pitch + c;
  if (c + 8 <= row_bytes && (reinterpret_cast<uintptr_t>(p) & 7) == 0) {
    *reinterpret_cast<uint64_t *>(p) = v;
    return;
  }
  for (int b = 0; b < 8 && o + b < len; b++) {
    const int64_t rb = (o + b) / row_bytes, cb = (o + b) - rb * row_bytes;
    dst[rb * d.dst_pitch + cb] = static_cast<uint8_t>(v >> (8 * b));
  }
}

/* Tile t of a COPY or DIGEST: words [t * kDirectWordTile, +kDirectWordTile),
 * a word per lane per step; each lane steps its (row, column) instead of
 * dividing per word, and reads a word whole where it lies aligned in one row. */
__device__ inline uint64_t direct_word_tile(const refit_direct_desc_t &d, int64_t t,
                                            int lane) {
  const int64_t row_bytes = 2 * d.cols, len = d.rows * row_bytes;
  const int64_t words = ceil_div(len, 8);
  const int64_t w0 = t * kDirectWordTile + lane;
  const int64_t w1 =
      (t + 1) * kDirectWordTile < words ? (t + 1) * kDirectWordTile : words;
  const uint8_t *src = static_cast<const uint8_t *>(d.src);
  uint8_t *dst = static_cast<uint8_t *>(d.dst);
  const bool copy = d.op == REFIT_DIRECT_COPY;
  int64_t r = 8 * w0 / row_bytes, c = 8 * w0 - r * row_bytes;
  uint64_t sum = 0;
  for (int64_t w = w0; w < w1; w += 32) {
    const uint8_t *p = src + r * d.src_pitch + c;
    uint8_t *q = copy ? dst + r * d.dst_pitch + c : NULL;
    const bool whole = c + 8 <= row_bytes && (reinterpret_cast<uintptr_t>(p) & 7) == 0;
    uint64_t v;
    if (whole) {
      v = *reinterpret_cast<const uint64_t *>(p);
      if (copy && (reinterpret_cast<uintptr_t>(q) & 7) == 0)
        *reinterpret_cast<uint64_t *>(q) = v;
      else if (copy)
        direct_store_word(d, row_bytes, len, w, v);
    } else {
      v = direct_word(d, row_bytes, len, w);
      if (copy)
        direct_store_word(d, row_bytes, len, w, v);
    }
    if (d.digest)
      sum += refit_digest_term(v, static_cast<uint64_t>(w));
    c += 256;
    while (c >= row_bytes) {
      c -= row_bytes;
      r++;
    }
  }
  return sum;
}

/* A DIGEST, or a COPY at both ends, whose rows are whole, aligned 16-byte
 * units: read 16 bytes per lane, several loads in flight (the general tile
 * moves a word at a time). */
__device__ inline bool direct_units(const refit_direct_desc_t &d) {
  const bool copy = d.op == REFIT_DIRECT_COPY;
  if (d.op != REFIT_DIRECT_DIGEST && d.op != REFIT_DIRECT_BLOCK_QUANTIZE && !copy)
    return false;
  return d.cols % 8 == 0 && d.src_pitch % 16 == 0 &&
         (reinterpret_cast<uintptr_t>(d.src) & 15) == 0 &&
         d.rows * (d.cols / 8) <= UINT32_MAX &&
         (!copy ||
          (d.dst_pitch % 16 == 0 && (reinterpret_cast<uintptr_t>(d.dst) & 15) == 0));
}

/*
 * Tile t of such a descriptor. Its steps (kDirectUnitLoads x 32 units, each
 * load instruction 512 contiguous bytes over the warp) are strided by the
 * descriptor's tile count: the warps that run a descriptor's tiles side by
 * side read one window of it, as a copy does. A COPY stores a step's units
 * after all its loads (a store between them would keep the later loads from
 * issuing early; the trainer's DIGEST is compiled without them). Returns the
 * lane's terms (a COPY's with d.digest only).
 */
template <bool kCopy>
__device__ inline uint64_t direct_unit_tile(const refit_direct_desc_t &d, int64_t t,
                                            int lane) {
  constexpr int U = kDirectUnitLoads;
  const uint32_t row_bytes = static_cast<uint32_t>(2 * d.cols), nu = row_bytes / 16;
  const uint32_t total = static_cast<uint32_t>(d.rows) * nu;
  const uint32_t ntiles = static_cast<uint32_t>(ceil_div(total, kDirectUnitTile));
  const uint32_t nsteps = static_cast<uint32_t>(ceil_div(total, 32 * U));
  const uint8_t *src = static_cast<const uint8_t *>(d.src);
  uint8_t *dst = static_cast<uint8_t *>(d.dst);
  const bool digest = !kCopy || d.digest != 0;
  uint64_t sum = 0;
  for (uint32_t k = static_cast<uint32_t>(t); k < nsteps; k += ntiles) {
    uint4 x[U];
    uint32_t rs[U], cs[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const uint32_t unit = (k * U + u) * 32 + lane;
      rs[u] = UINT32_MAX;
      if (unit < total) {
        rs[u] = unit / nu;
        cs[u] = unit - rs[u] * nu;
        x[u] = *reinterpret_cast<const uint4 *>(src + rs[u] * d.src_pitch + 16 * cs[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (rs[u] == UINT32_MAX)
        continue;
      if (kCopy)
        *reinterpret_cast<uint4 *>(dst + rs[u] * d.dst_pitch + 16 * cs[u]) = x[u];
      if (digest) {
        const uint64_t word = (static_cast<uint64_t>(rs[u]) * row_bytes + 16 * cs[u]) / 8;
        sum += refit_digest_term2(x[u].x, x[u].y, word) +
               refit_digest_term2(x[u].z, x[u].w, word + 1);
      }
    }
  }
  return sum;
}

/*
 * Tile t of a SPLIT: wire words [t * kDirectWordTile, +kDirectWordTile) of
 * the chunk's rows (cols E4M3 bytes then cols / 32 scales each), a word per
 * lane per step as in direct_word_tile, each byte stored at its place in the
 * layout: a word that lies among one row's values whole goes as one 8-byte
 * store, others byte by byte. A row's place is found once per row the lane
 * enters. Returns the lane's digest terms.
 */
__device__ inline uint64_t direct_split_tile(const refit_direct_desc_t &d, int64_t t,
                                             int lane) {
  const int64_t row_bytes = direct_row_bytes(d), len = d.rows * row_bytes;
  const int64_t words = ceil_div(len, 8);
  const int64_t w0 = t * kDirectWordTile + lane;
  const int64_t w1 =
      (t + 1) * kDirectWordTile < words ? (t + 1) * kDirectWordTile : words;
  const int64_t kp = refit_round_up(d.k / 32, 4), s0 = d.col0 / 32;
  const uint8_t *src = static_cast<const uint8_t *>(d.src);
  int64_t r = 8 * w0 / row_bytes, c = 8 * w0 - r * row_bytes;
  int64_t row_at = -1;
  uint8_t *vrow = NULL, *srow = NULL;
  uint64_t sum = 0;
  for (int64_t w = w0; w < w1; w += 32) {
    const uint8_t *p = src + r * d.src_pitch + c;
    const bool whole = c + 8 <= row_bytes && (reinterpret_cast<uintptr_t>(p) & 7) == 0;
    const uint64_t v = whole ? *reinterpret_cast<const uint64_t *>(p)
                             : direct_word(d, row_bytes, len, w);
    if (d.digest)
      sum += refit_digest_term(v, static_cast<uint64_t>(w));
    int64_t rb = r, cb = c;
    for (int b = 0; b < 8 && 8 * w + b < len; b++, cb++) {
      if (cb == row_bytes) {
        cb = 0;
        rb++;
      }
      if (rb != row_at) {
        row_at = rb;
        const int64_t R = d.row0 + rb, e = R / d.group_rows;
        const int64_t j = direct_row(d, R - e * d.group_rows);
        vrow = static_cast<uint8_t *>(d.dst) + e * d.value_group_bytes + j * d.k + d.col0;
        /* The row's part of refit_kernels_swizzle_offset(j, s, kp). */
        srow = static_cast<uint8_t *>(d.scale) + e * d.scale_group_bytes +
               (j / 128) * 128 * kp + (j % 32) * 16 + ((j % 128) / 32) * 4;
      }
      if (b == 0 && cb + 8 <= d.cols) {
        const uint32_t q[2] = {static_cast<uint32_t>(v), static_cast<uint32_t>(v >> 32)};
        refit_mxfp8_dev_store8(vrow + cb, q);
        break;
      }
      const uint8_t byte = static_cast<uint8_t>(v >> (8 * b));
      if (cb < d.cols) {
        vrow[cb] = byte;
      } else {
        const int64_t sc = s0 + (cb - d.cols);
        srow[(sc >> 2) * 512 + (sc & 3)] = byte;
      }
    }
    c += 256;
    while (c >= row_bytes) {
      c -= row_bytes;
      r++;
    }
  }
  return sum;
}

/*
 * Tile t of a QUANTIZE: blocks [t * kDirectQuantTile, +kDirectQuantTile) of
 * the chunk's row-major block grid, 32 per warp step (a quad per block, four
 * loads in flight per lane). One division per tile: later blocks step
 * along their row, and a row's place in the layout is found once per row.
 * Returns the lane's digest terms.
 */
__device__ inline uint64_t direct_quant_tile(const refit_direct_desc_t &d, int64_t t,
                                             int lane) {
  const int part = lane & 3;
  const unsigned quad_mask = 0xfu << (lane & 28);
  const uint32_t nb = static_cast<uint32_t>(d.cols / 32);
  const uint32_t total = static_cast<uint32_t>(d.rows) * nb;
  const uint32_t group = static_cast<uint32_t>(d.group_rows);
  const uint32_t row_bytes = static_cast<uint32_t>(2 * d.cols);
  const int64_t kp = refit_round_up(d.k / 32, 4);
  const uint8_t *src = static_cast<const uint8_t *>(d.src);
  uint8_t *values = static_cast<uint8_t *>(d.dst) + d.col0 + 8 * part;
  uint8_t *scales = static_cast<uint8_t *>(d.scale);
  const uint32_t c0 = static_cast<uint32_t>(d.col0 / 32);
  constexpr int U = kQuantUnroll;
  uint32_t g = static_cast<uint32_t>(t * kDirectQuantTile) + lane / 4;
  uint32_t r = g / nb, b = g - r * nb;
  /* This lane's current row: its source and its places in the layout. */
  uint32_t row_at = UINT32_MAX;
  uint8_t *vrow = NULL, *srow_scale = NULL;
  int64_t j = 0;
  uint64_t sum = 0;
  for (int step = 0; step < kDirectQuantTile / (8 * U); step++) {
    uint32_t x[U][4];
    uint32_t rs[U], bs[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      rs[u] = r;
      bs[u] = b;
      if (g + 8 * u < total) {
        refit_mxfp8_dev_load8(src + rs[u] * d.src_pitch + 64 * b + 16 * part, x[u]);
        if (d.digest) {
          const uint64_t word =
              (static_cast<uint64_t>(r) * row_bytes + 64 * b + 16 * part) / 8;
          sum += refit_digest_term2(x[u][0], x[u][1], word);
          sum += refit_digest_term2(x[u][2], x[u][3], word + 1);
        }
      }
      b += 8;
      while (b >= nb) {
        b -= nb;
        r++;
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (g + 8 * u >= total)
        break; /* the whole quad leaves together */
      uint32_t q[2];
      const uint8_t sb = refit_mxfp8_dev_quantize8(x[u], quad_mask, q);
      if (rs[u] != row_at) {
        row_at = rs[u];
        const uint32_t R = static_cast<uint32_t>(d.row0) + row_at, e = R / group;
        j = direct_row(d, R - e * group);
        vrow = values + e * d.value_group_bytes + j * d.k;
        /* The row's part of refit_kernels_swizzle_offset(j, c, kp). */
        srow_scale = scales + e * d.scale_group_bytes + (j / 128) * 128 * kp +
                     (j % 32) * 16 + ((j % 128) / 32) * 4;
      }
      refit_mxfp8_dev_store8(vrow + 32 * bs[u], q);
      if (part == 0) {
        const uint32_t c = c0 + bs[u];
        srow_scale[(c >> 2) * 512 + (c & 3)] = sb;
      }
    }
    g += 8 * U;
    if (g >= total)
      break;
  }
  return sum;
}

/* PAD, one group per tile: its padded value rows and scale bytes to 0. */
__device__ inline void direct_pad_tile(const refit_direct_desc_t &d, int64_t e,
                                       int lane) {
  const int64_t kb = d.k / 32, kp = refit_round_up(kb, 4);
  const int64_t srows = refit_round_up(d.perm_rows, 128);
  uint8_t *values = static_cast<uint8_t *>(d.dst) + e * d.value_group_bytes;
  uint8_t *scales = static_cast<uint8_t *>(d.scale) + e * d.scale_group_bytes;
  if (d.perm_rows > d.group_rows)
    for (int64_t j = 0; j < d.perm_rows; j++)
      if (direct_padded_row(d, j))
        for (int64_t c = lane; c < d.k; c += 32)
          values[j * d.k + c] = 0;
  for (int64_t x = lane; x < srows * kp; x += 32) {
    const int64_t j = x / kp, c = x - j * kp;
    if (c >= kb || direct_padded_row(d, j))
      scales[refit_kernels_swizzle_offset(j, c, kp)] = 0;
  }
}

template <int kSel> struct DirectPlan {
  static constexpr int kMinBlocks = kSel == kQuantJobs ? kQuantMinBlocks : 1;
  const refit_direct_desc_t *descs;
  const uint8_t *buf; /* the call's buffer: digests, and staged rows */
  unsigned long long *acc;
  __device__ int64_t tiles(int64_t i) const {
    const refit_direct_desc_t d = direct_at(descs, i, buf);
    if (!direct_ok(d))
      return 0;
    if (d.op == REFIT_DIRECT_QUANTIZE)
      return kSel == kQuantJobs ? ceil_div(d.rows * (d.cols / 32), kDirectQuantTile) : 0;
    if (kSel == kQuantJobs)
      return 0;
    if (d.op == REFIT_DIRECT_PAD)
      return d.rows;
    if (d.op == REFIT_DIRECT_SPLIT)
      return ceil_div(ceil_div(d.rows * direct_row_bytes(d), 8), kDirectWordTile);
    /* BLOCK_QUANTIZE: its rows read for their digest only (written by
     * refit_direct_blocks_cuda). */
    if (d.op == REFIT_DIRECT_BLOCK_QUANTIZE && !d.digest)
      return 0;
    if (direct_units(d))
      return ceil_div(d.rows * (d.cols / 8), kDirectUnitTile);
    return ceil_div(ceil_div(d.rows * 2 * d.cols, 8), kDirectWordTile);
  }
  __device__ void run(int64_t i, int64_t t, int lane) const {
    /* A copy, not a reference: the stores below could alias the table, so
     * through a reference every field would be loaded again after each. */
    const refit_direct_desc_t d = direct_at(descs, i, buf);
    uint64_t s = 0;
    if (d.op == REFIT_DIRECT_PAD) {
      direct_pad_tile(d, t, lane);
      return;
    }
    if constexpr (kSel == kQuantJobs)
      s = direct_quant_tile(d, t, lane);
    else
      s = d.op == REFIT_DIRECT_SPLIT  ? direct_split_tile(d, t, lane)
          : !direct_units(d)          ? direct_word_tile(d, t, lane)
          : d.op == REFIT_DIRECT_COPY ? direct_unit_tile<true>(d, t, lane)
                                      : direct_unit_tile<false>(d, t, lane);
    if (d.digest) {
      s = warp_sum(s);
      if (lane == 0)
        atomicAdd(&acc[i], static_cast<unsigned long long>(s));
    }
  }
};

/* After the tiles: DIGEST writes each sealed digest, COPY, QUANTIZE,
 * SPLIT and BLOCK_QUANTIZE compare theirs with the trainer's. */
__global__ void refit_direct_digest_kernel(const refit_direct_desc_t *descs, int64_t n,
                                           uint64_t tag, uint8_t *digests,
                                           const unsigned long long *acc, int64_t *bad) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const refit_direct_desc_t &d = descs[i];
    if (!d.digest || !direct_reads(d) || !direct_ok(d) || d.digest_offset < 0)
      continue;
    const int64_t len = d.rows * direct_row_bytes(d);
    const uint64_t v = static_cast<uint64_t>(len) * REFIT_DIGEST_P1 + acc[i] +
                       refit_seal(d.seal_key, tag);
    uint8_t *p = digests + d.digest_offset;
    if (d.op == REFIT_DIRECT_DIGEST) {
      for (int b = 0; b < 8; b++)
        p[b] = static_cast<uint8_t>(v >> (8 * b));
    } else if (v != load_le64(p) && bad != NULL) {
      report_bad(bad, i);
    }
  }
}

} // namespace

extern "C" refit_status_t
refit_direct_rows_cuda(const refit_direct_desc_t *descs_device, int64_t n, uint64_t tag,
                       void *digests_device, unsigned long long *acc_device,
                       int64_t *bad_chunk_device, cudaStream_t stream) {
  const char *what = "direct land";
  if (n < 0 || (n > 0 && (descs_device == NULL || acc_device == NULL)))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s (cuda): bad arguments (table %p, n = %lld, accumulators %p)",
                     what, (const void *)descs_device, (long long)n, (void *)acc_device);
  if (n == 0)
    return REFIT_OK;
  cudaError_t err = cudaMemsetAsync(acc_device, 0,
                                    static_cast<size_t>(n) * sizeof(*acc_device), stream);
  if (err != cudaSuccess)
    return REFIT_ERR(REFIT_ERR_CUDA, "%s (cuda): zeroing accumulators: %s", what,
                     cudaGetErrorString(err));
  const uint8_t *buf = static_cast<const uint8_t *>(digests_device);
  REFIT_CHECK(launch_tiles(DirectPlan<kQuantJobs>{descs_device, buf, acc_device}, n,
                           stream, what));
  REFIT_CHECK(launch_tiles(DirectPlan<kOtherJobs>{descs_device, buf, acc_device}, n,
                           stream, what));
  if (digests_device == NULL)
    return REFIT_OK;
  refit_direct_digest_kernel<<<static_cast<unsigned>(per_desc_blocks(n)), kThreads, 0,
                               stream>>>(descs_device, n, tag,
                                         static_cast<uint8_t *>(digests_device),
                                         acc_device, bad_chunk_device);
  return refit_cuda_launch_check("direct digests");
}

namespace {

/* One thread block per 128 x 128 block of the range's BLOCK_QUANTIZE
 * descriptors (blocks base .. base + total of the table's numbering): the
 * last descriptor whose block0 is at most the block's number holds it (a
 * descriptor without blocks never does: the next one's block0 is its own). */
__global__ void __launch_bounds__(refit_fp8_block_dev::kThreads)
    refit_direct_blocks_kernel(const refit_direct_desc_t *descs, int64_t n, int64_t base,
                               int64_t total) {
  __shared__ uint32_t warp_keys[refit_fp8_block_dev::kWarps];
  __shared__ float block_scale;
  for (int64_t blk = blockIdx.x; blk < total; blk += gridDim.x) {
    const int64_t global = base + blk;
    int64_t lo = 0, hi = n - 1; /* the last i with block0 <= global */
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (descs[mid].block0 <= global)
        lo = mid;
      else
        hi = mid - 1;
    }
    const refit_direct_desc_t &d = descs[lo];
    refit_fp8_block_dev::refit_fp8_block_dev_t m;
    m.src = static_cast<const uint16_t *>(d.src);
    m.src_stride = d.rows > 1 ? d.src_pitch / 2 : d.cols;
    m.q = static_cast<uint8_t *>(d.dst);
    m.q_stride = d.rows > 1 ? d.dst_pitch : d.cols;
    m.nbr = (d.rows + REFIT_FP8_BLOCK - 1) / REFIT_FP8_BLOCK;
    m.nbc = (d.cols + REFIT_FP8_BLOCK - 1) / REFIT_FP8_BLOCK;
    m.scale_inv = static_cast<float *>(d.scale);
    m.scale_stride = d.rows > REFIT_FP8_BLOCK ? d.scale_pitch / 4 : m.nbc;
    m.rows = d.rows;
    m.k = d.cols;
    m.mode = d.fp8_scale;
    m.aligned = (reinterpret_cast<uintptr_t>(m.src) & 15) == 0 && m.src_stride % 8 == 0 &&
                (reinterpret_cast<uintptr_t>(m.q) & 7) == 0 && m.q_stride % 8 == 0;
    refit_fp8_block_dev::refit_fp8_block_quantize_one(m, global - d.block0, warp_keys,
                                                      &block_scale);
  }
}

} // namespace

extern "C" refit_status_t
refit_direct_blocks_cuda(const refit_direct_desc_t *descs_host,
                         const refit_direct_desc_t *descs_device, int64_t n,
                         cudaStream_t stream) {
  int64_t first = -1, total = 0;
  for (int64_t i = 0; i < n; i++) {
    const refit_direct_desc_t &d = descs_host[i];
    if (d.op != REFIT_DIRECT_BLOCK_QUANTIZE || d.rows == 0 || d.cols == 0)
      continue;
    if (first < 0)
      first = d.block0;
    total =
        d.block0 + refit_fp8_block_count(d.rows) * refit_fp8_block_count(d.cols) - first;
  }
  if (total == 0)
    return REFIT_OK;
  if (descs_device == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "direct blocks (cuda): NULL device table");
  static refit_cuda_grid_cache_t grid;
  refit_direct_blocks_kernel<<<refit_cuda_grid(refit_direct_blocks_kernel,
                                               refit_fp8_block_dev::kThreads, grid,
                                               total),
                               refit_fp8_block_dev::kThreads, 0, stream>>>(
      descs_device, n, first, total);
  return refit_cuda_launch_check("direct blocks");
}
