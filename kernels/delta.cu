/*
 * Delta codec, CUDA twin of kernels/delta.c (format in kernels/delta.h,
 * contract in kernels/delta_cuda.h).
 *
 * Work is cut into tiles of 32 KiB of each chunk (1024 blocks of 32 bytes;
 * a chunk of 0 bytes still has one tile, for its header), numbered across
 * the table; a thread block of 256 threads takes a contiguous share of them
 * (tile_range), a tile at a time, on a grid that fills the GPU. The kernels
 * of a call, in stream order:
 *
 *   plan      one thread block: each chunk's first tile (a prefix sum of its
 *             tile counts), in apply its first work item too, and the checks
 *             that need only the descriptor.
 *   encode
 *     count   per tile: new and base read once, 16 bytes per load, eight
 *             loads of each in flight per thread (unit u * 256 + thread, so
 *             every load instruction reads 4 KiB contiguous over the block);
 *             a bit per changed block (warp ballots) into the workspace's
 *             bitmap, the tile's changed bytes and blocks into its counts;
 *             a tile with at most kTileList changed bytes, scattered
 *             (listed()), also lists them (offset and new value, in offset
 *             order) in the workspace.
 *     choose  a thread block per chunk: the exclusive prefix of its tiles'
 *             counts (a block scan per 256 tiles), the three sizes, the
 *             encoding (refit_delta_encode's rule and ties), its capacity.
 *     write   per tile, only if no chunk failed: header and length (first
 *             tile), then dense: the tile copied; mask: the tile's part of
 *             the bitmap and its marked blocks, each at its rank (tile
 *             prefix + a block scan of the threads' marked counts); positions:
 *             a listed tile's list copied to its rank, else the changed bytes
 *             of the marked blocks at their ranks, found the same way. A
 *             thread owns 4 consecutive blocks in this pass and reads only
 *             the marked ones.
 *   apply
 *     header  a thread block per delta: refit_delta_info's checks in its
 *             order (a mask's popcount by the block, its per-tile prefix kept
 *             for the next passes), the chunk size, the destination.
 *     check   per work item (items_of: the plan kernel counts them from the
 *             headers, so that these passes walk what the deltas hold, not
 *             every tile of the chunks): a group of 1024 positions (each
 *             offset in the chunk, above the previous one, naming a byte
 *             that differs from dst); 8 tiles of a mask, a warp a tile, its
 *             marked blocks spread over the lanes (mask_tile), each
 *             differing from dst's block; a tile of a dense delta.
 *     write   per work item, only if no chunk failed: the writes.
 *
 * A failing check posts key = chunk << 41 | element << 8 | reason with
 * atomicMin; the smallest key is the first bad chunk and, within it, the
 * first failing element's first failing check, which is what the C decoder
 * reports. The last kernel writes the caller's bad chunk and reason from it.
 */
#include "kernels/block_scan.cuh"
#include "kernels/cuda_launch.cuh"
#include "kernels/delta_cuda.h"

#include <atomic>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPlanThreads = 1024;
constexpr uint64_t kBlock = REFIT_DELTA_BLOCK_BYTES;
constexpr uint64_t kTileBytes = 32768;                /* chunk bytes per tile */
constexpr uint64_t kTileBlocks = kTileBytes / kBlock; /* 1024 */
constexpr uint64_t kTileWords = kTileBlocks / 32;     /* bitmap words per tile */
constexpr uint64_t kPosGroup = 4 * kThreads; /* positions per group (4 a thread) */
/* Changed bytes a tile lists in the count pass (offset and value each), so
 * that the write pass copies a sparse tile's positions instead of reading
 * its marked blocks again: up to 1/64 of a tile's bytes. */
constexpr uint64_t kTileList = 512;
constexpr int kUnits = kTileBytes / 16 / kThreads; /* 16-byte loads per thread */
constexpr unsigned kFull = 0xffffffffu;
constexpr uint64_t kNoKey = UINT64_MAX;
constexpr uint64_t kPlanFailed = UINT64_MAX;

static_assert(kTileBlocks == 4 * kThreads, "a thread owns 4 blocks of a tile");
static_assert(kTileList >= kThreads, "the write pass loads a list entry a thread");
static_assert(kTileBlocks / 8 <= kThreads, "a thread per mask byte of a tile");

/* What a call knows of a chunk after the plan / choose / header kernels. */
struct ChunkRec {
  uint32_t enc;   /* the encoding written or read */
  uint32_t ok;    /* the chunk passed the checks so far */
  uint64_t count; /* encode: changed bytes; apply: the header's count */
  uint64_t size;  /* encode: the delta's length */
  uint64_t blocks;
};

/* The workspace, carved from one caller allocation. */
struct Ws {
  unsigned long long *key; /* smallest error key */
  uint64_t *plan;          /* total tiles, or kPlanFailed */
  uint64_t *start;         /* n + 1 first tiles */
  uint64_t *item;          /* n + 1 first work items (apply: check and write) */
  ChunkRec *rec;           /* n */
  uint64_t *tile;          /* max_tiles: counts, then prefixes */
  uint32_t *bits;          /* max_tiles * kTileWords: changed blocks (encode) */
  uint32_t *list_off;      /* max_tiles * kTileList: a sparse tile's changed bytes */
  uint8_t *list_val;       /* (encode: offsets in the chunk, new values) */
  uint64_t max_tiles;
};

__host__ __device__ inline uint64_t align256(uint64_t x) {
  return (x + 255) & ~uint64_t{255};
}

__host__ __device__ inline uint64_t ws_tile_offset(int64_t n) {
  return align256(align256(256 + 16 * static_cast<uint64_t>(n + 1)) +
                  sizeof(ChunkRec) * static_cast<uint64_t>(n));
}

/* Bytes per tile of the workspace, and the slack that aligns its arrays. */
constexpr uint64_t kWsPerTile = 8 + 4 * kTileWords + 5 * kTileList;
constexpr uint64_t kWsSlack = 3 * 256;

Ws ws_carve(void *base, int64_t n, size_t bytes) {
  uint8_t *p = static_cast<uint8_t *>(base);
  Ws w;
  const uint64_t t0 = ws_tile_offset(n);
  w.max_tiles = bytes >= t0 + kWsSlack ? (bytes - t0 - kWsSlack) / kWsPerTile : 0;
  w.key = reinterpret_cast<unsigned long long *>(p);
  w.plan = reinterpret_cast<uint64_t *>(p + 8);
  w.start = reinterpret_cast<uint64_t *>(p + 256);
  w.item = w.start + (n + 1);
  w.rec =
      reinterpret_cast<ChunkRec *>(p + align256(256 + 16 * static_cast<uint64_t>(n + 1)));
  w.tile = reinterpret_cast<uint64_t *>(p + t0);
  const uint64_t bits = align256(t0 + 8 * w.max_tiles);
  const uint64_t offs = align256(bits + 4 * kTileWords * w.max_tiles);
  w.bits = reinterpret_cast<uint32_t *>(p + bits);
  w.list_off = reinterpret_cast<uint32_t *>(p + offs);
  w.list_val = p + align256(offs + 4 * kTileList * w.max_tiles);
  return w;
}

/* ---- Device helpers ------------------------------------------------------ */

__device__ inline uint64_t make_key(uint64_t chunk, uint64_t element, int reason) {
  return chunk << 41 | element << 8 | static_cast<uint64_t>(reason);
}

__device__ inline uint64_t ceil_div_u(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
__device__ inline uint64_t tiles_of(uint64_t bytes) {
  return bytes == 0 ? 1 : ceil_div_u(bytes, kTileBytes);
}
__device__ inline uint64_t blocks_of(uint64_t bytes) { return ceil_div_u(bytes, kBlock); }
__device__ inline uint64_t mask_bytes_of(uint64_t bytes) {
  return ceil_div_u(blocks_of(bytes), 8);
}

__device__ inline bool aligned(const void *p, uintptr_t a) {
  return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0;
}

/* 16 bytes at p, of which `avail` exist (the rest read as 0). */
__device__ inline uint4 load16(const uint8_t *p, uint64_t avail) {
  if (avail >= 16 && aligned(p, 16))
    return *reinterpret_cast<const uint4 *>(p);
  uint32_t w[4] = {0, 0, 0, 0};
  if (avail >= 16 && aligned(p, 4)) {
#pragma unroll
    for (int i = 0; i < 4; i++)
      w[i] = reinterpret_cast<const uint32_t *>(p)[i];
  } else {
    for (int i = 0; i < 16 && static_cast<uint64_t>(i) < avail; i++)
      w[i / 4] |= static_cast<uint32_t>(p[i]) << (8 * (i % 4));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

/* The first `len` (<= 16) bytes of v to p. */
__device__ inline void store16(uint8_t *p, uint4 v, uint64_t len) {
  if (len >= 16 && aligned(p, 16)) {
    *reinterpret_cast<uint4 *>(p) = v;
    return;
  }
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  if (len >= 16 && aligned(p, 4)) {
#pragma unroll
    for (int i = 0; i < 4; i++)
      reinterpret_cast<uint32_t *>(p)[i] = w[i];
    return;
  }
  for (int i = 0; i < 16 && static_cast<uint64_t>(i) < len; i++)
    p[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
}

__device__ inline uint32_t load_u32(const uint8_t *p) {
  if (aligned(p, 4))
    return *reinterpret_cast<const uint32_t *>(p);
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

__device__ inline void store_u32(uint8_t *p, uint32_t v) {
  if (aligned(p, 4)) {
    *reinterpret_cast<uint32_t *>(p) = v;
    return;
  }
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16);
  p[3] = static_cast<uint8_t>(v >> 24);
}

/* Bit i of the result: byte i of x is nonzero (4 bits). */
__device__ inline uint32_t nonzero_nibble(uint32_t x) {
  const uint32_t m = __vcmpne4(x, 0u) & 0x80808080u;
  return (m >> 7 | m >> 14 | m >> 21 | m >> 28) & 0xfu;
}

/* Bit i of the result: byte i of a differs from byte i of b (16 bits). */
__device__ inline uint32_t diff16(uint4 a, uint4 b) {
  return nonzero_nibble(a.x ^ b.x) | nonzero_nibble(a.y ^ b.y) << 4 |
         nonzero_nibble(a.z ^ b.z) << 8 | nonzero_nibble(a.w ^ b.w) << 12;
}

/* The even bits of x, packed (bit 2i -> bit i). */
__device__ inline uint32_t even_bits(uint32_t x) {
  x &= 0x55555555u;
  x = (x | x >> 1) & 0x33333333u;
  x = (x | x >> 2) & 0x0f0f0f0fu;
  x = (x | x >> 4) & 0x00ff00ffu;
  return (x | x >> 8) & 0x0000ffffu;
}

/* Post the smallest of the block's keys (kNoKey: none). All threads call. */
__device__ inline void post_key(unsigned long long *key, uint64_t k) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    const uint64_t o = __shfl_xor_sync(kFull, k, d);
    k = o < k ? o : k;
  }
  if ((threadIdx.x & 31) == 0 && k != kNoKey)
    atomicMin(key, static_cast<unsigned long long>(k));
}

/* The chunk whose tiles hold tile g: the last c with start[c] <= g. */
__device__ inline int64_t chunk_of(const uint64_t *start, int64_t n, uint64_t g) {
  int64_t lo = 0, hi = n;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (start[mid] <= g)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

__device__ inline uint64_t chunk_bytes(const refit_delta_cuda_enc_desc_t &d) {
  return d.bytes;
}
__device__ inline uint64_t chunk_bytes(const refit_delta_cuda_dec_desc_t &d) {
  /* A destination too large for any delta fails the header's size check;
   * one tile keeps it off the workspace meanwhile. */
  return d.dst_bytes > UINT32_MAX ? 0 : d.dst_bytes;
}

/* What the descriptor alone says is wrong (encode; apply checks headers). */
__device__ inline int desc_reason(const refit_delta_cuda_enc_desc_t &d) {
  if (d.bytes > UINT32_MAX)
    return REFIT_DELTA_CUDA_CHUNK_TOO_LARGE;
  if (d.bytes > 0 && (d.new_bytes == NULL || d.base == NULL))
    return REFIT_DELTA_CUDA_NULL_POINTER;
  return REFIT_DELTA_CUDA_NONE;
}
__device__ inline int desc_reason(const refit_delta_cuda_dec_desc_t &) {
  return REFIT_DELTA_CUDA_NONE;
}

/*
 * The tiles [*g0, *g1) of this thread block: an even, contiguous share of
 * the call's `total` tiles, so that a block walks a chunk's tiles in order
 * and steps to the next chunk at most once a chunk (TileCursor), instead of
 * searching the table for every tile of a grid-stride loop (a chain of
 * dependent loads that a sparse tile's work cannot hide).
 */
__device__ inline void tile_range(uint64_t total, uint64_t *g0, uint64_t *g1) {
  const uint64_t b = blockIdx.x, per = total / gridDim.x, extra = total % gridDim.x;
  *g0 = b * per + (b < extra ? b : extra);
  *g1 = *g0 + per + (b < extra ? 1 : 0);
}

/*
 * Where unit g (a tile, or an apply's work item) lies, for a thread block
 * that walks g upwards (its tile_range): its chunk c, the chunk's units [t0,
 * t1) of `first` (w.start or w.item), descriptor and record. Nothing is
 * loaded while g stays in the chunk, one load steps to the next chunk, a
 * binary search goes further; the descriptor and record are loaded once per
 * chunk.
 */
template <typename Desc> struct TileCursor {
  int64_t c = -1;
  uint64_t t0 = 0, t1 = 0;
  Desc d{};
  ChunkRec r{};
  __device__ inline void seek(const Desc *descs, const Ws &w, const uint64_t *first,
                              int64_t n, uint64_t g) {
    if (c >= 0 && g < t1)
      return;
    c = c >= 0 && c + 1 < n && first[c + 2] > g ? c + 1 : chunk_of(first, n, g);
    t0 = first[c];
    t1 = first[c + 1];
    d = descs[c];
    r = w.rec[c];
  }
};

/* ---- Plan ---------------------------------------------------------------- */

/* Tiles of a mask delta in one work item of apply's check and write: a warp
 * each. */
constexpr uint64_t kMaskTiles = kWarps;

/* Work items of a chunk in apply's check and write passes: a position group
 * each (none when the count is 0), kMaskTiles tiles of a mask each, a tile of
 * a dense delta each; none for a header the header kernel refuses (its
 * checks are not repeated here: a bad count only sizes the items, clamped to
 * the chunk). Encode has no items (its passes walk tiles). */
__device__ inline uint64_t items_of(const refit_delta_cuda_enc_desc_t &, uint64_t) {
  return 0;
}
__device__ inline uint64_t items_of(const refit_delta_cuda_dec_desc_t &d,
                                    uint64_t tiles) {
  const uint8_t *h = static_cast<const uint8_t *>(d.delta);
  if (h == NULL || d.delta_len < REFIT_DELTA_HEADER_BYTES ||
      load_u32(h) != REFIT_DELTA_MAGIC)
    return 0;
  const uint64_t chunk = chunk_bytes(d), count = load_u32(h + 12);
  switch (h[4]) {
  case REFIT_DELTA_POSITIONS:
    return ceil_div_u(count < chunk ? count : chunk, kPosGroup);
  case REFIT_DELTA_MASK:
    return count == 0 ? 0 : ceil_div_u(tiles, kMaskTiles);
  case REFIT_DELTA_DENSE:
    return tiles;
  default:
    return 0;
  }
}

/* One block of kPlanThreads: first tiles, descriptor checks, the key reset. */
template <typename Desc>
__global__ void __launch_bounds__(kPlanThreads)
    refit_delta_plan_kernel(const Desc *descs, int64_t n, Ws w) {
  __shared__ uint64_t sh[kPlanThreads / 32];
  if (threadIdx.x == 0)
    *w.key = kNoKey;
  __syncthreads();
  uint64_t carry = 0, items_carry = 0;
  uint64_t over = kNoKey; /* the first chunk past the workspace */
  for (int64_t i0 = 0; i0 < n; i0 += kPlanThreads) {
    const int64_t i = i0 + threadIdx.x;
    uint64_t tiles = 0, items = 0;
    if (i < n) {
      const Desc d = descs[i];
      const int reason = desc_reason(d);
      tiles = reason == REFIT_DELTA_CUDA_NONE ? tiles_of(chunk_bytes(d)) : 1;
      items = items_of(d, tiles);
      w.rec[i].ok = reason == REFIT_DELTA_CUDA_NONE;
      if (reason != REFIT_DELTA_CUDA_NONE)
        atomicMin(w.key, static_cast<unsigned long long>(make_key(i, 0, reason)));
    }
    uint64_t sum;
    const uint64_t first = carry + block_scan<uint64_t, kPlanThreads>(tiles, &sum, sh);
    carry += sum;
    const uint64_t first_item =
        items_carry + block_scan<uint64_t, kPlanThreads>(items, &sum, sh);
    items_carry += sum;
    if (i < n) {
      w.start[i] = first;
      w.item[i] = first_item;
      if (first + tiles > w.max_tiles && over == kNoKey)
        over = static_cast<uint64_t>(i);
    }
  }
  if (over != kNoKey)
    atomicMin(w.key, static_cast<unsigned long long>(
                         make_key(over, 0, REFIT_DELTA_CUDA_WORKSPACE)));
  if (threadIdx.x == 0) {
    w.start[n] = carry;
    w.item[n] = items_carry;
    *w.plan = carry > w.max_tiles ? kPlanFailed : carry;
  }
}

/* The caller's error outputs from the key; true when every chunk is good. */
__device__ inline bool report(const Ws &w, int64_t *bad_chunk, int32_t *reason) {
  const uint64_t key = *w.key;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *bad_chunk = key == kNoKey ? -1 : static_cast<int64_t>(key >> 41);
    *reason = key == kNoKey ? 0 : static_cast<int32_t>(key & 0xff);
  }
  return key == kNoKey;
}

/* ---- Encode -------------------------------------------------------------- */

/* Whether the count pass lists a tile's changed bytes (and the write pass
 * copies the list): a few (kTileFew), or at most kTileList scattered ones (4
 * or fewer a changed block on average). Many bytes in runs are cheaper to
 * find again from the blocks than to list one at a time (a thread lists its
 * 16-byte unit's serially), and go as a mask above ~1e-3 anyway. */
constexpr uint64_t kTileFew = 64;
__device__ inline bool listed(uint64_t changed, uint64_t blocks) {
  return changed > 0 &&
         (changed <= kTileFew || (changed <= kTileList && changed <= 4 * blocks));
}

/* Tile g (local tile t of its chunk): counts and bitmap. */
/* 3 blocks per SM (80 registers): each has 64 KiB of loads in flight. */
__global__ void __launch_bounds__(kThreads, 3)
    refit_delta_count_kernel(const refit_delta_cuda_enc_desc_t *descs, int64_t n, Ws w) {
  __shared__ __align__(16) uint16_t s_half[2 * kTileWords];
  __shared__ uint32_t sh[kWarps];
  __shared__ uint32_t s_at[kUnits * kWarps]; /* changed bytes per (unit, warp) */
  __shared__ uint32_t s_blocks[kWarps];      /* changed blocks per warp */
  const uint64_t total = *w.plan;
  if (total == kPlanFailed)
    return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  TileCursor<refit_delta_cuda_enc_desc_t> cur;
  uint64_t g0, g1;
  tile_range(total, &g0, &g1);
  for (uint64_t g = g0; g < g1; g++) {
    cur.seek(descs, w, w.start, n, g);
    if (!cur.r.ok) /* uniform over the block, as every branch on the chunk */
      continue;
    const refit_delta_cuda_enc_desc_t &d = cur.d;
    const uint64_t off0 = (g - cur.t0) * kTileBytes;
    const uint64_t rem = d.bytes - off0 < kTileBytes ? d.bytes - off0 : kTileBytes;
    const uint8_t *a = static_cast<const uint8_t *>(d.new_bytes) + off0;
    const uint8_t *b = static_cast<const uint8_t *>(d.base) + off0;
    uint4 x[kUnits], y[kUnits];
    if (rem == kTileBytes && aligned(a, 16) && aligned(b, 16)) {
#pragma unroll
      for (int u = 0; u < kUnits; u++) {
        x[u] = reinterpret_cast<const uint4 *>(a)[u * kThreads + threadIdx.x];
        y[u] = reinterpret_cast<const uint4 *>(b)[u * kThreads + threadIdx.x];
      }
    } else {
#pragma unroll
      for (int u = 0; u < kUnits; u++) {
        const uint64_t o = 16 * static_cast<uint64_t>(u * kThreads + threadIdx.x);
        x[u] = o < rem ? load16(a + o, rem - o) : make_uint4(0, 0, 0, 0);
        y[u] = o < rem ? load16(b + o, rem - o) : make_uint4(0, 0, 0, 0);
      }
    }
    uint32_t changed = 0, blocks = 0, m[kUnits];
#pragma unroll
    for (int u = 0; u < kUnits; u++) {
      m[u] = diff16(x[u], y[u]);
      changed += __popc(m[u]);
      /* Lanes 2i and 2i + 1 hold block 16 * warp + i of this step. */
      const bool any = (m[u] | __shfl_xor_sync(kFull, m[u], 1)) != 0;
      const uint32_t ballot = __ballot_sync(kFull, any);
      blocks += __popc(ballot) / 2;
      const uint32_t at = __reduce_add_sync(kFull, static_cast<uint32_t>(__popc(m[u])));
      if (lane == 0) {
        s_half[u * kWarps + warp] = static_cast<uint16_t>(even_bits(ballot));
        s_at[u * kWarps + warp] = at;
      }
    }
    /* Warp sums, then the tile's: two barriers a tile (three for a tile
     * that lists its changed bytes). */
    const uint32_t warp_changed = __reduce_add_sync(kFull, changed);
    if (lane == 0) {
      sh[warp] = warp_changed;
      s_blocks[warp] = blocks;
    }
    __syncthreads(); /* orders sh's, s_blocks', s_half's and s_at's stores */
    uint32_t tile_changed = 0, tile_blocks = 0;
#pragma unroll
    for (int i = 0; i < kWarps; i++) {
      tile_changed += sh[i];
      tile_blocks += s_blocks[i];
    }
    if (listed(tile_changed, tile_blocks)) { /* uniform over the block */
      /* The tile's changed bytes in offset order, unit u's 4 KiB before
       * unit u + 1's, warp by warp within a unit: (unit, warp) starts from
       * an exclusive scan of s_at by warp 0, lanes from a warp scan. */
      if (threadIdx.x < 32) {
        const uint32_t a0 = s_at[2 * lane], a1 = s_at[2 * lane + 1];
        const uint32_t v = warp_inclusive_scan(a0 + a1);
        s_at[2 * lane] = v - a0 - a1;
        s_at[2 * lane + 1] = v - a1;
      }
      __syncthreads();
      uint32_t *lo = w.list_off + g * kTileList;
      uint8_t *lv = w.list_val + g * kTileList;
#pragma unroll
      for (int u = 0; u < kUnits; u++) {
        if (__ballot_sync(kFull, m[u] != 0) == 0)
          continue;
        const uint32_t c = __popc(m[u]);
        uint32_t idx = s_at[u * kWarps + warp] + warp_inclusive_scan(c) - c;
        const uint32_t base = static_cast<uint32_t>(off0) +
                              16 * static_cast<uint32_t>(u * kThreads + threadIdx.x);
        for (uint32_t mm = m[u]; mm != 0; mm &= mm - 1) {
          const int bit = __ffs(mm) - 1;
          const uint32_t word = bit < 4    ? x[u].x
                                : bit < 8  ? x[u].y
                                : bit < 12 ? x[u].z
                                           : x[u].w;
          lo[idx] = base + static_cast<uint32_t>(bit);
          lv[idx] = static_cast<uint8_t>(word >> (8 * (bit % 4)));
          idx++;
        }
      }
    }
    /* The bitmap from warp 0; the counts every thread summed above. */
    if (threadIdx.x < 32)
      w.bits[g * kTileWords + threadIdx.x] =
          reinterpret_cast<const uint32_t *>(s_half)[threadIdx.x];
    if (threadIdx.x == 0)
      w.tile[g] = static_cast<uint64_t>(tile_changed) << 32 | tile_blocks;
    __syncthreads(); /* s_half is rewritten by the next tile */
  }
}

/* A block per chunk: tile prefixes, sizes, encoding, capacity. */
__global__ void __launch_bounds__(kThreads)
    refit_delta_choose_kernel(const refit_delta_cuda_enc_desc_t *descs, int encoding,
                              Ws w) {
  __shared__ uint64_t sh[kWarps];
  const int64_t c = blockIdx.x;
  if (*w.plan == kPlanFailed || !w.rec[c].ok)
    return;
  const refit_delta_cuda_enc_desc_t d = descs[c];
  const uint64_t ts = w.start[c], te = w.start[c + 1];
  uint64_t carry = 0;
  for (uint64_t t0 = ts; t0 < te; t0 += kThreads) {
    const uint64_t t = t0 + threadIdx.x;
    const uint64_t v = t < te ? w.tile[t] : 0;
    uint64_t sum;
    const uint64_t before = block_scan<uint64_t, kThreads>(v, &sum, sh);
    if (t < te)
      w.tile[t] = carry + before;
    carry += sum;
  }
  if (threadIdx.x != 0)
    return;
  const uint64_t bytes = d.bytes, k = carry >> 32, blocks = carry & 0xffffffffu;
  const uint64_t nb = blocks_of(bytes);
  uint64_t block_bytes = kBlock * blocks;
  if (bytes % kBlock != 0 && blocks > 0 &&
      (w.bits[ts * kTileWords + (nb - 1) / 32] >> ((nb - 1) % 32) & 1))
    block_bytes -= kBlock - bytes % kBlock;
  uint64_t size[REFIT_DELTA_ENCODINGS];
  size[REFIT_DELTA_POSITIONS] = REFIT_DELTA_HEADER_BYTES + 5 * k;
  size[REFIT_DELTA_MASK] = REFIT_DELTA_HEADER_BYTES + mask_bytes_of(bytes) + block_bytes;
  size[REFIT_DELTA_DENSE] = REFIT_DELTA_HEADER_BYTES + bytes;
  /* refit_delta_encode's rule: ties go to dense, then mask. */
  int best = REFIT_DELTA_DENSE;
  if (size[REFIT_DELTA_MASK] < size[best])
    best = REFIT_DELTA_MASK;
  if (size[REFIT_DELTA_POSITIONS] < size[best])
    best = REFIT_DELTA_POSITIONS;
  const int e = encoding == REFIT_DELTA_AUTO ? best : encoding;
  ChunkRec r;
  r.enc = static_cast<uint32_t>(e);
  r.ok = size[e] <= d.cap;
  r.count = k;
  r.size = size[e];
  r.blocks = blocks;
  w.rec[c] = r;
  if (!r.ok)
    atomicMin(w.key,
              static_cast<unsigned long long>(make_key(c, 0, REFIT_DELTA_CUDA_CAPACITY)));
}

/* Copy `rem` (<= kTileBytes) bytes s -> o, unit u * kThreads + thread. */
__device__ inline void copy_tile(const uint8_t *s, uint8_t *o, uint64_t rem) {
  uint4 v[kUnits];
#pragma unroll
  for (int u = 0; u < kUnits; u++) {
    const uint64_t at = 16 * static_cast<uint64_t>(u * kThreads + threadIdx.x);
    v[u] = at < rem ? load16(s + at, rem - at) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int u = 0; u < kUnits; u++) {
    const uint64_t at = 16 * static_cast<uint64_t>(u * kThreads + threadIdx.x);
    if (at < rem)
      store16(o + at, v[u], rem - at);
  }
}

/* Store a whole block (32 bytes, words w[0..7] little-endian) at o, which
 * is not 4-byte aligned (a mask's blocks follow its bitmap, whose length is
 * the chunk's): 7 word stores whose bytes are shifted across word pairs, and
 * the 4 - d head and d tail bytes one at a time (those words are shared with
 * the neighbouring blocks). store16 would store all 32 one at a time. */
__device__ inline void store_block32_unaligned(uint8_t *o, const uint32_t (&w)[8]) {
  const unsigned d = static_cast<unsigned>(reinterpret_cast<uintptr_t>(o) & 3);
  for (unsigned i = 0; i < 4 - d; i++)
    o[i] = static_cast<uint8_t>(w[0] >> (8 * i));
  uint32_t *words = reinterpret_cast<uint32_t *>(o - d); /* word j: bytes 4j - d .. */
#pragma unroll
  for (int j = 1; j < 8; j++)
    words[j] = __funnelshift_r(w[j - 1], w[j], 8 * (4 - d));
  for (unsigned i = 32 - d; i < 32; i++)
    o[i] = static_cast<uint8_t>(w[7] >> (8 * (i % 4)));
}

/* A whole block (32 bytes) at s as words w[0..7], little-endian, at any
 * alignment: when s is not 4-byte aligned, the 8 words from s's word down
 * (bytes before s are the same buffer's: a delta's header or bitmap, a
 * chunk's earlier bytes) and its last 1-3 bytes one at a time (the word
 * holding them may run past the buffer), shifted across word pairs. load16
 * would load all 32 one at a time. */
__device__ inline void load_block32(const uint8_t *s, uint32_t (&w)[8]) {
  const unsigned d = static_cast<unsigned>(reinterpret_cast<uintptr_t>(s) & 3);
  if (d == 0) {
    if (aligned(s, 16)) {
      const uint4 a = reinterpret_cast<const uint4 *>(s)[0],
                  b = reinterpret_cast<const uint4 *>(s)[1];
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
      w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
      return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
      w[j] = reinterpret_cast<const uint32_t *>(s)[j];
    return;
  }
  const uint32_t *words = reinterpret_cast<const uint32_t *>(s - d);
  uint32_t x[9];
#pragma unroll
  for (int j = 0; j < 8; j++)
    x[j] = words[j];
  x[8] = 0;
  for (unsigned i = 0; i < d; i++)
    x[8] |= static_cast<uint32_t>(s[32 - d + i]) << (8 * i);
#pragma unroll
  for (int j = 0; j < 8; j++)
    w[j] = __funnelshift_r(x[j], x[j + 1], 8 * d);
}

/* Copy one block of len (<= 32) bytes. */
__device__ inline void copy_block(const uint8_t *s, uint8_t *o, uint64_t len) {
  if (len == kBlock) {
    uint32_t w[8];
    load_block32(s, w);
    if (aligned(o, 16)) {
      reinterpret_cast<uint4 *>(o)[0] = make_uint4(w[0], w[1], w[2], w[3]);
      reinterpret_cast<uint4 *>(o)[1] = make_uint4(w[4], w[5], w[6], w[7]);
    } else if (aligned(o, 4)) {
#pragma unroll
      for (int j = 0; j < 8; j++)
        reinterpret_cast<uint32_t *>(o)[j] = w[j];
    } else {
      store_block32_unaligned(o, w);
    }
    return;
  }
  for (uint64_t i = 0; i < len; i++)
    o[i] = s[i];
}

/* Whether the len (<= 32) bytes at a and b are equal. */
__device__ inline bool same_block(const uint8_t *a, const uint8_t *b, uint64_t len) {
  if (len == kBlock) {
    uint32_t x[8], y[8];
    load_block32(a, x);
    load_block32(b, y);
    uint32_t diff = 0;
#pragma unroll
    for (int j = 0; j < 8; j++)
      diff |= x[j] ^ y[j];
    return diff == 0;
  }
  for (uint64_t i = 0; i < len; i++)
    if (a[i] != b[i])
      return false;
  return true;
}

/* The 4-block nibble of the tile's bitmap that thread `t` owns. */
__device__ inline uint32_t owned_nibble(const uint32_t *tile_bits) {
  return tile_bits[threadIdx.x / 8] >> (4 * (threadIdx.x % 8)) & 0xfu;
}

/* A sparse tile's work is a short chain of dependent loads and a scan:
 * occupancy hides it. 4 blocks per SM fit its registers without spills. */
__global__ void __launch_bounds__(kThreads, 4)
    refit_delta_write_kernel(const refit_delta_cuda_enc_desc_t *descs, int64_t n,
                             uint8_t *out, uint64_t *len, Ws w, int64_t *bad_chunk,
                             int32_t *reason) {
  __shared__ uint32_t sh[kWarps];
  if (!report(w, bad_chunk, reason))
    return;
  const uint64_t total = *w.plan;
  TileCursor<refit_delta_cuda_enc_desc_t> cur;
  uint64_t g0, g1;
  tile_range(total, &g0, &g1);
  for (uint64_t g = g0; g < g1; g++) {
    cur.seek(descs, w, w.start, n, g);
    const refit_delta_cuda_enc_desc_t &d = cur.d;
    const ChunkRec &r = cur.r;
    const int64_t c = cur.c;
    const uint64_t lt = g - cur.t0, off0 = lt * kTileBytes;
    const uint64_t rem = d.bytes - off0 < kTileBytes ? d.bytes - off0 : kTileBytes;
    const uint8_t *a = static_cast<const uint8_t *>(d.new_bytes);
    uint8_t *o = out + d.out_off;
    /* A positions tile's list entry for this thread, loaded before the tile
     * counts say whether the tile is listed (its list is in the workspace
     * either way): the copy then waits for one round of loads, not two. */
    const uint32_t *lo = w.list_off + g * kTileList;
    const uint8_t *lv = w.list_val + g * kTileList;
    uint32_t pre_off = 0;
    uint8_t pre_val = 0;
    if (r.enc == REFIT_DELTA_POSITIONS) {
      pre_off = lo[threadIdx.x];
      pre_val = lv[threadIdx.x];
    }
    if (lt == 0 && threadIdx.x < REFIT_DELTA_HEADER_BYTES) {
      const uint32_t count = r.enc == REFIT_DELTA_POSITIONS
                                 ? static_cast<uint32_t>(r.count)
                             : r.enc == REFIT_DELTA_MASK ? static_cast<uint32_t>(r.blocks)
                                                         : 0;
      const uint32_t words[4] = {REFIT_DELTA_MAGIC, r.enc, static_cast<uint32_t>(d.bytes),
                                 count};
      const int i = threadIdx.x;
      o[i] = static_cast<uint8_t>(words[i / 4] >> (8 * (i % 4)));
      if (i == 0)
        len[c] = r.size;
    }
    uint8_t *p = o + REFIT_DELTA_HEADER_BYTES;
    if (r.enc == REFIT_DELTA_DENSE) {
      copy_tile(a + off0, p + off0, rem);
      continue;
    }
    const uint32_t *tile_bits = w.bits + g * kTileWords;
    if (r.enc == REFIT_DELTA_MASK) {
      const uint64_t mb = mask_bytes_of(d.bytes), m0 = lt * (kTileBlocks / 8);
      if (threadIdx.x < kTileBlocks / 8 && m0 + threadIdx.x < mb)
        p[m0 + threadIdx.x] = reinterpret_cast<const uint8_t *>(tile_bits)[threadIdx.x];
    }
    /* A tile without a changed block has nothing more to write (its count:
     * the next tile's prefix, or the chunk's total, less its own). The
     * nibble's load goes out with the prefixes'. */
    const uint32_t nib = owned_nibble(tile_bits);
    const uint64_t next = g + 1 < cur.t1 ? w.tile[g + 1] : r.count << 32 | r.blocks;
    if (((next - w.tile[g]) & 0xffffffffu) == 0)
      continue;
    const uint64_t k0 = lt * kTileBlocks + 4 * threadIdx.x; /* first owned block */
    if (r.enc == REFIT_DELTA_MASK) {
      const uint64_t mb = mask_bytes_of(d.bytes);
      uint32_t unused;
      uint64_t rank =
          (w.tile[g] & 0xffffffffu) +
          block_scan<uint32_t, kThreads>(static_cast<uint32_t>(__popc(nib)), &unused, sh);
      uint8_t *data = p + mb;
#pragma unroll
      for (int q = 0; q < 4; q++)
        if (nib >> q & 1) {
          const uint64_t k = k0 + q, bl = d.bytes - kBlock * k < kBlock
                                              ? d.bytes - kBlock * k
                                              : kBlock;
          copy_block(a + kBlock * k, data + kBlock * rank, bl);
          rank++;
        }
      continue;
    }
    /* Positions: a listed tile's changed bytes are copied from its list
     * (its count: the next prefix less its own, as above). */
    const uint64_t here = (next >> 32) - (w.tile[g] >> 32);
    if (listed(here, (next - w.tile[g]) & 0xffffffffu)) {
      const uint64_t idx0 = w.tile[g] >> 32;
      uint8_t *values = p + 4 * r.count;
      if (threadIdx.x < here) {
        store_u32(p + 4 * (idx0 + threadIdx.x), pre_off);
        values[idx0 + threadIdx.x] = pre_val;
      }
      for (uint64_t e = threadIdx.x + kThreads; e < here; e += kThreads) {
        store_u32(p + 4 * (idx0 + e), lo[e]);
        values[idx0 + e] = lv[e];
      }
      continue;
    }
    /* Else the changed bytes of the owned marked blocks. */
    const uint8_t *b = static_cast<const uint8_t *>(d.base);
    uint32_t cm[4];
    uint32_t cnt = 0;
#pragma unroll
    for (int q = 0; q < 4; q++) {
      cm[q] = 0;
      if (nib >> q & 1) {
        const uint64_t k = k0 + q,
                       bl = d.bytes - kBlock * k < kBlock ? d.bytes - kBlock * k : kBlock;
        const uint8_t *pa = a + kBlock * k, *pb = b + kBlock * k;
        const uint4 a0 = load16(pa, bl), b0 = load16(pb, bl);
        const uint4 a1 = bl > 16 ? load16(pa + 16, bl - 16) : make_uint4(0, 0, 0, 0);
        const uint4 b1 = bl > 16 ? load16(pb + 16, bl - 16) : make_uint4(0, 0, 0, 0);
        cm[q] = diff16(a0, b0) | diff16(a1, b1) << 16;
        cnt += __popc(cm[q]);
      }
    }
    uint32_t unused;
    uint64_t idx = (w.tile[g] >> 32) + block_scan<uint32_t, kThreads>(cnt, &unused, sh);
    uint8_t *values = p + 4 * r.count;
#pragma unroll
    for (int q = 0; q < 4; q++)
      for (uint32_t m = cm[q]; m != 0; m &= m - 1) {
        const uint64_t at = kBlock * (k0 + q) + (__ffs(m) - 1);
        store_u32(p + 4 * idx, static_cast<uint32_t>(at));
        values[idx] = a[at];
        idx++;
      }
  }
}

/* ---- Apply --------------------------------------------------------------- */

/* A block per delta: the header's checks, the mask's tile prefixes. */
__global__ void __launch_bounds__(kThreads)
    refit_delta_header_kernel(const refit_delta_cuda_dec_desc_t *descs, Ws w) {
  __shared__ uint64_t sh[kWarps];
  __shared__ int s_reason;
  __shared__ uint32_t s_enc, s_chunk, s_count;
  const int64_t c = blockIdx.x;
  if (*w.plan == kPlanFailed)
    return;
  const refit_delta_cuda_dec_desc_t d = descs[c];
  const uint8_t *h = static_cast<const uint8_t *>(d.delta);
  if (threadIdx.x == 0) {
    int why = REFIT_DELTA_CUDA_NONE;
    uint32_t e = 0, chunk = 0, count = 0;
    if (h == NULL) {
      why = REFIT_DELTA_CUDA_NULL_POINTER;
    } else if (d.delta_len < REFIT_DELTA_HEADER_BYTES) {
      why = REFIT_DELTA_CUDA_SHORT;
    } else {
      e = h[4];
      chunk = load_u32(h + 8);
      count = load_u32(h + 12);
      if (load_u32(h) != REFIT_DELTA_MAGIC)
        why = REFIT_DELTA_CUDA_MAGIC;
      else if (e < REFIT_DELTA_POSITIONS || e > REFIT_DELTA_DENSE)
        why = REFIT_DELTA_CUDA_ENCODING;
      else if (h[5] != 0 || h[6] != 0 || h[7] != 0)
        why = REFIT_DELTA_CUDA_HEADER_PAD;
      else if (e == REFIT_DELTA_POSITIONS && count > chunk)
        why = REFIT_DELTA_CUDA_COUNT;
      else if (e == REFIT_DELTA_MASK && count > blocks_of(chunk))
        why = REFIT_DELTA_CUDA_COUNT;
      else if (e == REFIT_DELTA_MASK &&
               d.delta_len < REFIT_DELTA_HEADER_BYTES + mask_bytes_of(chunk))
        why = REFIT_DELTA_CUDA_SHORT_MASK;
      else if (e == REFIT_DELTA_DENSE && count != 0)
        why = REFIT_DELTA_CUDA_COUNT;
    }
    s_reason = why;
    s_enc = e;
    s_chunk = chunk;
    s_count = count;
  }
  __syncthreads();
  int why = s_reason;
  const uint32_t e = s_enc, chunk = s_chunk, count = s_count;
  uint64_t want = REFIT_DELTA_HEADER_BYTES;
  if (why == REFIT_DELTA_CUDA_NONE && e == REFIT_DELTA_MASK) {
    /* Popcount of the mask, per tile of 128 mask bytes; the tiles' prefixes
     * are kept only when the chunk is the destination's (else the header
     * fails on its size below, and the tiles are not the chunk's). */
    const uint8_t *mask = h + REFIT_DELTA_HEADER_BYTES;
    const uint64_t nb = blocks_of(chunk), mb = mask_bytes_of(chunk);
    const uint64_t ntiles = ceil_div_u(nb, kTileBlocks);
    const bool keep = chunk == d.dst_bytes;
    const uint64_t ts = w.start[c];
    uint64_t carry = 0;
    for (uint64_t t0 = 0; t0 < ntiles; t0 += kThreads) {
      const uint64_t t = t0 + threadIdx.x;
      uint64_t marked = 0;
      if (t < ntiles) {
        const uint64_t m0 = t * (kTileBlocks / 8);
        const uint64_t m1 = m0 + kTileBlocks / 8 < mb ? m0 + kTileBlocks / 8 : mb;
        if (m1 - m0 == kTileBlocks / 8 && aligned(mask + m0, 4)) {
#pragma unroll 8
          for (uint64_t i = m0; i < m1; i += 4)
            marked += __popc(*reinterpret_cast<const uint32_t *>(mask + i));
        } else {
          for (uint64_t i = m0; i < m1; i++)
            marked += __popc(mask[i]);
        }
      }
      uint64_t sum;
      const uint64_t before = block_scan<uint64_t, kThreads>(marked, &sum, sh);
      if (keep && t < ntiles)
        w.tile[ts + t] = carry + before;
      carry += sum;
    }
    if (nb % 8 != 0 && (mask[mb - 1] >> (nb % 8)) != 0)
      why = REFIT_DELTA_CUDA_MASK_TAIL;
    else if (carry != count)
      why = REFIT_DELTA_CUDA_MASK_COUNT;
    want += mb + kBlock * count;
    if (count > 0 && chunk % kBlock != 0 && (mask[(nb - 1) / 8] >> ((nb - 1) % 8) & 1))
      want -= kBlock - chunk % kBlock;
  } else if (e == REFIT_DELTA_POSITIONS) {
    want += 5 * static_cast<uint64_t>(count);
  } else {
    want += chunk;
  }
  if (threadIdx.x != 0)
    return;
  if (why == REFIT_DELTA_CUDA_NONE && d.delta_len != want)
    why = REFIT_DELTA_CUDA_LENGTH;
  if (why == REFIT_DELTA_CUDA_NONE && chunk != d.dst_bytes)
    why = REFIT_DELTA_CUDA_CHUNK_SIZE;
  if (why == REFIT_DELTA_CUDA_NONE && d.dst == NULL && d.dst_bytes > 0)
    why = REFIT_DELTA_CUDA_NULL_POINTER;
  ChunkRec r;
  r.enc = e;
  r.ok = why == REFIT_DELTA_CUDA_NONE;
  r.count = count;
  r.size = want;
  r.blocks = 0;
  w.rec[c] = r;
  if (!r.ok)
    atomicMin(w.key, static_cast<unsigned long long>(make_key(c, 0, why)));
}

/* The 32-bit word of a delta's mask that lane `lane` owns in local tile lt:
 * mask bytes lt * 128 + 4 * lane onwards, those past the mask read as 0. */
__device__ inline uint32_t mask_word(const uint8_t *mask, uint64_t mb, uint64_t lt,
                                     unsigned lane) {
  const uint64_t i = lt * (kTileBlocks / 8) + 4 * lane;
  if (i + 4 <= mb)
    return load_u32(mask + i);
  uint32_t v = 0;
  for (uint64_t b = i; b < mb && b < i + 4; b++)
    v |= static_cast<uint32_t>(mask[b]) << (8 * (b - i));
  return v;
}

/* The position (0..31) of set bit r (0 first) of x, which has more than r. */
__device__ inline unsigned select_bit(uint32_t x, uint32_t r) {
  unsigned pos = 0;
#pragma unroll
  for (unsigned s = 16; s > 0; s >>= 1) {
    const uint32_t c = __popc(x >> pos & ((1u << s) - 1));
    if (r >= c) {
      r -= c;
      pos += s;
    }
  }
  return pos;
}

/*
 * Check (kApply false) or write local tile lt of a good mask delta, by one
 * warp. Lane l owns blocks 32 l .. 32 l + 31 of the tile (a mask word); a
 * scan of the words' popcounts ranks them, and then the warp walks the
 * tile's marked blocks 32 at a time, lane l the (s + l)-th: its owner word
 * by a binary search of the ranks over the lanes, its bit by select_bit. So
 * a tile's copies are spread over the lanes whatever the mask's pattern, and
 * the marked blocks' data, contiguous in the delta, is read contiguously.
 */
template <bool kApply>
__device__ inline void mask_tile(const refit_delta_cuda_dec_desc_t &d, int64_t c,
                                 uint64_t lt, uint64_t tile_rank, uint64_t *key) {
  const unsigned lane = threadIdx.x & 31;
  const uint64_t chunk = d.dst_bytes, mb = mask_bytes_of(chunk);
  const uint8_t *mask = static_cast<const uint8_t *>(d.delta) + REFIT_DELTA_HEADER_BYTES;
  const uint8_t *data = mask + mb;
  uint8_t *dst = static_cast<uint8_t *>(d.dst);
  const uint32_t word = mask_word(mask, mb, lt, lane);
  const uint32_t pc = static_cast<uint32_t>(__popc(word));
  const uint32_t incl = warp_inclusive_scan(pc), excl = incl - pc;
  const uint32_t marked = __shfl_sync(kFull, incl, 31);
  for (uint32_t s = 0; s < marked; s += 32) {
    const uint32_t j = s + lane;
    unsigned owner = 0; /* the last lane whose rank is <= j: its word holds j */
#pragma unroll
    for (unsigned step = 16; step > 0; step >>= 1)
      if (__shfl_sync(kFull, excl, owner + step) <= j)
        owner += step;
    const uint32_t owner_word = __shfl_sync(kFull, word, owner);
    const uint32_t owner_excl = __shfl_sync(kFull, excl, owner);
    if (j >= marked)
      continue;
    const uint64_t k =
        lt * kTileBlocks + 32 * owner + select_bit(owner_word, j - owner_excl);
    const uint64_t bl = chunk - kBlock * k < kBlock ? chunk - kBlock * k : kBlock;
    const uint8_t *src = data + kBlock * (tile_rank + j);
    uint8_t *o = dst + kBlock * k;
    if (kApply) {
      copy_block(src, o, bl);
    } else if (same_block(src, o, bl)) {
      const uint64_t key1 = make_key(c, k, REFIT_DELTA_CUDA_BLOCK_SAME);
      *key = key1 < *key ? key1 : *key;
    }
  }
}

/* Check (kApply false) or write work item li of a good delta (items_of):
 * a dense tile, a group of kPosGroup positions, or kMaskTiles mask tiles. */
template <bool kApply>
__device__ inline void delta_item(const refit_delta_cuda_dec_desc_t &d, const ChunkRec &r,
                                  int64_t c, uint64_t li, const Ws &w, uint64_t *key) {
  const uint8_t *p = static_cast<const uint8_t *>(d.delta) + REFIT_DELTA_HEADER_BYTES;
  uint8_t *dst = static_cast<uint8_t *>(d.dst);
  const uint64_t chunk = d.dst_bytes;
  if (r.enc == REFIT_DELTA_DENSE) {
    if (kApply) {
      const uint64_t off0 = li * kTileBytes;
      copy_tile(p + off0, dst + off0,
                chunk - off0 < kTileBytes ? chunk - off0 : kTileBytes);
    }
    return;
  }
  if (r.enc == REFIT_DELTA_MASK) {
    const uint64_t lt = li * kMaskTiles + threadIdx.x / 32;
    if (lt < tiles_of(chunk))
      mask_tile<kApply>(d, c, lt, w.tile[w.start[c] + lt], key);
    return;
  }
  /* Positions j0 .. j0 + kPosGroup - 1, 4 a thread. */
  const uint8_t *values = p + 4 * r.count;
  const uint64_t j0 = li * kPosGroup;
  uint32_t off[4], prev[4];
  uint8_t v[4];
  bool in[4];
#pragma unroll
  for (int u = 0; u < 4; u++) {
    const uint64_t j = j0 + u * kThreads + threadIdx.x;
    in[u] = j < r.count;
    off[u] = in[u] ? load_u32(p + 4 * j) : 0;
    v[u] = in[u] ? values[j] : 0;
    prev[u] = !kApply && in[u] && j > 0 ? load_u32(p + 4 * (j - 1)) : 0;
  }
#pragma unroll
  for (int u = 0; u < 4; u++) {
    if (!in[u])
      continue;
    const uint64_t j = j0 + u * kThreads + threadIdx.x;
    if (kApply) {
      dst[off[u]] = v[u];
      continue;
    }
    int why = REFIT_DELTA_CUDA_NONE;
    if (off[u] >= chunk)
      why = REFIT_DELTA_CUDA_POS_RANGE;
    else if (j > 0 && off[u] <= prev[u])
      why = REFIT_DELTA_CUDA_POS_ORDER;
    else if (dst[off[u]] == v[u])
      why = REFIT_DELTA_CUDA_POS_SAME;
    if (why != REFIT_DELTA_CUDA_NONE) {
      const uint64_t k = make_key(c, j, why);
      *key = k < *key ? k : *key;
    }
  }
}

/* Check (kApply false) or write every work item, a block's contiguous share
 * of them; the write pass runs only when no chunk failed. */
template <bool kApply>
__global__ void __launch_bounds__(kThreads)
    refit_delta_items_kernel(const refit_delta_cuda_dec_desc_t *descs, int64_t n, Ws w,
                             int64_t *bad_chunk, int32_t *reason) {
  if (kApply ? !report(w, bad_chunk, reason) : *w.plan == kPlanFailed)
    return;
  const uint64_t total = w.item[n];
  uint64_t key = kNoKey;
  TileCursor<refit_delta_cuda_dec_desc_t> cur;
  uint64_t g0, g1;
  tile_range(total, &g0, &g1);
  for (uint64_t g = g0; g < g1; g++) {
    cur.seek(descs, w, w.item, n, g);
    if (cur.r.ok)
      delta_item<kApply>(cur.d, cur.r, cur.c, g - cur.t0, w, &key);
  }
  if (!kApply)
    post_key(w.key, key);
}

/* ---- Host side ----------------------------------------------------------- */

/* A machine-filling grid for `kernel`, queried once per device. */
template <typename K>
int64_t filling_grid(K kernel, refit_cuda_grid_cache_t &cache) {
  return refit_cuda_cached_grid(kernel, kThreads, cache);
}

refit_cuda_grid_cache_t g_count_grid, g_write_grid, g_check_grid, g_apply_grid;

unsigned grid_of(int64_t filling, uint64_t max_tiles) {
  const uint64_t g = static_cast<uint64_t>(filling) < max_tiles
                         ? static_cast<uint64_t>(filling)
                         : max_tiles;
  return static_cast<unsigned>(g > 0 ? g : 1);
}

refit_status_t check_call(const char *what, const void *descs, int64_t n, const void *ws,
                          size_t ws_bytes, const int64_t *bad_chunk,
                          const int32_t *reason) {
  if (n < 0 || n > REFIT_DELTA_CUDA_MAX_CHUNKS)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s (cuda): %lld chunks; between 0 and %lld in one call", what,
                     (long long)n, (long long)REFIT_DELTA_CUDA_MAX_CHUNKS);
  if ((n > 0 && descs == NULL) || ws == NULL || bad_chunk == NULL || reason == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "%s (cuda): NULL %s", what,
                     ws == NULL          ? "workspace"
                     : bad_chunk == NULL ? "bad chunk output"
                     : reason == NULL    ? "reason output"
                                         : "descriptor table");
  if ((reinterpret_cast<uintptr_t>(ws) & 15) != 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s (cuda): the workspace at %p is not 16-byte aligned", what, ws);
  if (ws_bytes < refit_delta_cuda_workspace(n, 0))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s (cuda): a workspace of %zu bytes; %zu at least for %lld chunks "
                     "(refit_delta_cuda_workspace)",
                     what, ws_bytes, refit_delta_cuda_workspace(n, 0), (long long)n);
  return REFIT_OK;
}

} // namespace

extern "C" const char *refit_delta_cuda_reason_str(int32_t reason) {
  static const char *const text[] = {
#define REFIT_DELTA_CUDA_REASON_TEXT_(name, t) t,
      REFIT_DELTA_CUDA_REASON_MAP(REFIT_DELTA_CUDA_REASON_TEXT_)
#undef REFIT_DELTA_CUDA_REASON_TEXT_
  };
  return reason >= 0 && reason < REFIT_DELTA_CUDA_REASONS ? text[reason] : "?";
}

extern "C" size_t refit_delta_cuda_workspace(int64_t n, uint64_t total_bytes) {
  const uint64_t nn = n > 0 ? static_cast<uint64_t>(n) : 0;
  const uint64_t max_tiles = total_bytes / kTileBytes + nn;
  return static_cast<size_t>(ws_tile_offset(static_cast<int64_t>(nn)) + kWsSlack +
                             kWsPerTile * max_tiles);
}

extern "C" refit_status_t
refit_delta_encode_cuda(const refit_delta_cuda_enc_desc_t *descs_device, int64_t n,
                        refit_delta_encoding_t encoding, void *out, uint64_t *len_device,
                        void *workspace, size_t workspace_bytes,
                        int64_t *bad_chunk_device, int32_t *reason_device,
                        cudaStream_t stream) {
  const char *what = "delta encode";
  REFIT_CHECK(check_call(what, descs_device, n, workspace, workspace_bytes,
                         bad_chunk_device, reason_device));
  if ((unsigned)encoding >= REFIT_DELTA_ENCODINGS)
    return REFIT_ERR(
        REFIT_ERR_INVALID_ARGUMENT,
        "delta encode (cuda): encoding %d is none of auto (0), positions (1), "
        "mask (2), dense (3)",
        (int)encoding);
  if (n > 0 && (out == NULL || len_device == NULL))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "delta encode (cuda): NULL %s",
                     out == NULL ? "output" : "length array");
  const Ws w = ws_carve(workspace, n, workspace_bytes);
  refit_delta_plan_kernel<<<1, kPlanThreads, 0, stream>>>(descs_device, n, w);
  REFIT_CHECK(refit_cuda_launch_check("delta encode plan"));
  if (n > 0) {
    refit_delta_count_kernel<<<
        grid_of(filling_grid(refit_delta_count_kernel, g_count_grid), w.max_tiles),
        kThreads, 0, stream>>>(descs_device, n, w);
    REFIT_CHECK(refit_cuda_launch_check("delta encode count"));
    refit_delta_choose_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
        descs_device, (int)encoding, w);
    REFIT_CHECK(refit_cuda_launch_check("delta encode choose"));
  }
  refit_delta_write_kernel<<<grid_of(filling_grid(refit_delta_write_kernel, g_write_grid),
                                     w.max_tiles),
                             kThreads, 0, stream>>>(
      descs_device, n, static_cast<uint8_t *>(out), len_device, w, bad_chunk_device,
      reason_device);
  return refit_cuda_launch_check("delta encode write");
}

extern "C" refit_status_t
refit_delta_apply_cuda(const refit_delta_cuda_dec_desc_t *descs_device, int64_t n,
                       void *workspace, size_t workspace_bytes, int64_t *bad_chunk_device,
                       int32_t *reason_device, cudaStream_t stream) {
  const char *what = "delta apply";
  REFIT_CHECK(check_call(what, descs_device, n, workspace, workspace_bytes,
                         bad_chunk_device, reason_device));
  const Ws w = ws_carve(workspace, n, workspace_bytes);
  refit_delta_plan_kernel<<<1, kPlanThreads, 0, stream>>>(descs_device, n, w);
  REFIT_CHECK(refit_cuda_launch_check("delta apply plan"));
  if (n > 0) {
    refit_delta_header_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
        descs_device, w);
    REFIT_CHECK(refit_cuda_launch_check("delta apply header"));
    refit_delta_items_kernel<false>
        <<<grid_of(filling_grid(refit_delta_items_kernel<false>, g_check_grid),
                   w.max_tiles),
           kThreads, 0, stream>>>(descs_device, n, w, bad_chunk_device, reason_device);
    REFIT_CHECK(refit_cuda_launch_check("delta apply check"));
  }
  refit_delta_items_kernel<true>
      <<<grid_of(filling_grid(refit_delta_items_kernel<true>, g_apply_grid), w.max_tiles),
         kThreads, 0, stream>>>(descs_device, n, w, bad_chunk_device, reason_device);
  return refit_cuda_launch_check("delta apply");
}

extern "C" refit_status_t refit_delta_cuda_report(const char *what, int64_t bad_chunk,
                                                  int32_t reason) {
  if (bad_chunk < 0)
    return REFIT_OK;
  const refit_status_t st =
      reason >= REFIT_DELTA_CUDA_SHORT ? REFIT_ERR_INTEGRITY : REFIT_ERR_INVALID_ARGUMENT;
  return REFIT_ERR(st, "%s (cuda): chunk %lld: %s", what, (long long)bad_chunk,
                   refit_delta_cuda_reason_str(reason));
}
