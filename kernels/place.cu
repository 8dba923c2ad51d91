/*
 * Deltas applied through their places on a GPU: CUDA twin of the apply of
 * kernels/place.c (contract in kernels/place_cuda.h).
 *
 * A thread block takes one tile (one chunk's items) and walks them kThreads
 * at a time, every thread of the block through every step, so that block
 * scans can run in the loop:
 *
 *   positions  a thread per position: range and order against the position
 *              before, the byte at its place (or the old trailer's), and the
 *              digest word, gathered by the word's first position;
 *   mask       a thread per mask word (32 blocks): a block scan of the
 *              words' popcounts gives each marked block its data, then each
 *              block word by word;
 *   dense      a thread per 8-byte word of the span (a whole span too).
 *
 * Write runs the same walks and writes the bytes that differ; with an undo
 * log a block scan of the threads' write counts takes the log's entries for
 * the block with one atomicAdd per step. Check's sums go out by warps (an
 * atomicAdd a warp), so that no warp waits for the block's slowest.
 */
#include "kernels/block_scan.cuh"
#include "kernels/cuda_launch.cuh"
#include "kernels/place_cuda.h"

#include "core/digest.h"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kTilePositions = 2 * kThreads;
constexpr int64_t kTileMaskWords = kThreads; /* 32 blocks each */
constexpr int64_t kTileWords = 16 * kThreads;
constexpr int kKeyChunkShift = 40;

/* A chunk as a block walks it: kernels/place.h's address rule with its
 * per-chunk constants worked out once, and the divisions by the two that
 * vary (a row's wire bytes, a matrix's rows) in 32 bits (a chunk is at most
 * UINT32_MAX bytes, a tensor's rows fewer than 2^32). */
struct Walk {
  int64_t rows_len, span;
  uint64_t old_trailer;
  int bf16, block, perm;
  uint32_t row_bytes, cols, m, row0;
  int64_t col0, tcols, perm_rows, kp, scale_matrix;
  uint8_t *values, *scales;
};

__device__ inline void walk_init(Walk *c, const refit_place_cuda_chunk_t *d) {
  const refit_place_tensor_t *t = &d->t;
  c->rows_len = d->rows * d->row_bytes;
  c->span = c->rows_len + d->trailer_bytes;
  c->old_trailer = d->old_trailer;
  c->bf16 = t->kind == REFIT_PLACE_BF16;
  c->block = t->kind == REFIT_PLACE_FP8_BLOCK;
  c->perm = t->perm;
  c->row_bytes = (uint32_t)d->row_bytes;
  c->cols = (uint32_t)d->cols;
  c->m = (uint32_t)(t->rows / t->matrices);
  c->row0 = (uint32_t)d->row0;
  c->col0 = d->col0;
  c->tcols = t->cols;
  c->perm_rows = t->perm_rows;
  c->kp = refit_round_up(t->cols / 32, 4);
  c->scale_matrix = refit_round_up(t->perm_rows, 128) * c->kp;
  if (c->block) { /* kp: scale columns; scale_matrix: a matrix's scale rows */
    c->kp = (t->cols + 127) / 128;
    c->scale_matrix = (c->m + 127) / 128;
  }
  c->values = t->values;
  c->scales = t->scales;
}

/* refit_place_addr for the walk's chunk. */
__device__ inline uint8_t *addr(const Walk &c, int64_t off64, int64_t *run) {
  const uint32_t off = (uint32_t)off64, r = off / c.row_bytes, b = off - r * c.row_bytes;
  const uint32_t R = c.row0 + r;
  int64_t n;
  uint8_t *at;
  if (c.bf16) {
    n = c.row_bytes - b;
    at = c.values + ((int64_t)R * c.tcols + c.col0) * 2 + b;
  } else if (c.block) {
    if (b < c.cols) {
      n = c.cols - b;
      at = c.values + (int64_t)R * c.tcols + c.col0 + b;
    } else {
      const uint32_t e = R / c.m, i = R - e * c.m;
      const int64_t srow = (int64_t)e * c.scale_matrix + i / 128;
      n = c.row_bytes - b;
      at = c.scales + (srow * c.kp + c.col0 / 128) * 4 + (b - c.cols);
    }
  } else {
    const uint32_t e = R / c.m, i = R - e * c.m;
    const int64_t j = c.perm < 0 ? (int64_t)i
                                 : refit_kernels_perm_inverse_index(
                                       (refit_kernels_perm_kind_t)c.perm, c.perm_rows, i);
    if (b < c.cols) {
      n = c.cols - b;
      at = c.values + ((int64_t)e * c.perm_rows + j) * c.tcols + c.col0 + b;
    } else {
      const int64_t s = c.col0 / 32 + (b - c.cols);
      const int64_t left = c.row_bytes - b;
      n = 4 - s % 4 < left ? 4 - s % 4 : left;
      at = c.scales + (int64_t)e * c.scale_matrix +
           refit_kernels_swizzle_offset(j, s, c.kp);
    }
  }
  if (run != nullptr)
    *run = n;
  return at;
}

/* refit_place_repeat for the walk's chunk: a block FP8 scale byte of a row
 * that does not start its block row (its place is written by the row that
 * does). */
__device__ inline bool repeat(const Walk &c, int64_t off64) {
  if (!c.block)
    return false;
  const uint32_t off = (uint32_t)off64, r = off / c.row_bytes;
  return r % 128 != 0 && off - r * c.row_bytes >= c.cols;
}

/* The bytes of word w that write may write: all but repeats (and those past
 * the rows, which differ in no old ^ new). */
__device__ inline uint64_t written_mask(const Walk &c, int64_t w) {
  if (!c.block)
    return ~0ull;
  uint64_t mask = 0;
  for (int i = 0; i < 8; i++)
    if (!repeat(c, 8 * w + i))
      mask |= 0xffull << (8 * i);
  return mask;
}

/* A little-endian u32 at any address: two aligned loads (the second word
 * holds one of the four bytes, so it lies in the same allocation). */
__device__ inline uint32_t load_u32(const uint8_t *p) {
  const uintptr_t a = (uintptr_t)p;
  const uint32_t *q = reinterpret_cast<const uint32_t *>(a & ~(uintptr_t)3);
  const unsigned sh = (unsigned)(a & 3) * 8;
  return sh == 0 ? q[0] : __funnelshift_r(q[0], q[1], sh);
}

/* The key's reason sits above its detail, so that within a chunk a
 * position out of range or order is reported before a byte held already, as
 * the C walk reports it. */
__device__ inline void post(unsigned long long *err, int64_t chunk, uint64_t detail,
                            int reason) {
  atomicMin(err, (unsigned long long)chunk << kKeyChunkShift |
                     (unsigned long long)reason << 32 |
                     (unsigned long long)(detail & 0xffffffffu));
}

/* The bytes of x that are not zero. */
__device__ inline uint32_t nonzero_bytes(uint64_t x) {
  x |= x >> 4;
  x |= x >> 2;
  x |= x >> 1;
  return (uint32_t)__popcll(x & 0x0101010101010101ull);
}

/* Exclusive prefix of v over the block, and the block's total
 * (kernels/block_scan.cuh). Every thread of the block calls it. */
__device__ inline uint64_t scan_block(uint64_t v, uint64_t *total) {
  __shared__ uint64_t sums[kWarps];
  return block_scan<uint64_t, kThreads>(v, total, sums);
}

/* Add v of every lane of the warp to *at: one atomicAdd a warp, none for 0
 * (all lanes call it). */
__device__ inline void warp_add(unsigned long long *at, uint64_t v) {
  for (int d = 16; d > 0; d /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, d);
  if (threadIdx.x % 32 == 0 && v != 0)
    atomicAdd(at, (unsigned long long)v);
}

/* n undo entries for this thread (all threads call it): the first index. */
__device__ uint64_t reserve(uint64_t n, unsigned long long *next) {
  __shared__ unsigned long long base;
  uint64_t total;
  const uint64_t before = scan_block(n, &total);
  if (threadIdx.x == 0)
    base = total > 0 ? atomicAdd(next, (unsigned long long)total) : 0;
  __syncthreads();
  const uint64_t at = base + before;
  __syncthreads();
  return at;
}

/* Word w of the rows as runtime storage holds it (zero past the rows). */
__device__ uint64_t old_word(const Walk &c, int64_t w) {
  const int64_t off0 = 8 * w, end = off0 + 8 < c.rows_len ? off0 + 8 : c.rows_len;
  int64_t run;
  const uint8_t *at = addr(c, off0, &run);
  if (end - off0 == 8 && run >= 8 && ((uintptr_t)at & 7) == 0)
    return *(const uint64_t *)at;
  uint64_t v = 0;
  for (int64_t off = off0; off < end;) {
    at = addr(c, off, &run);
    run = run < end - off ? run : end - off;
    if (run == 4 && ((uintptr_t)at & 3) == 0) /* a group of swizzled scales */
      v |= (uint64_t) * (const uint32_t *)at << (8 * (off - off0));
    else
      for (int64_t i = 0; i < run; i++)
        v |= (uint64_t)at[i] << (8 * (off - off0 + i));
    off += run;
  }
  return v;
}

/* The new word w from src (its byte 8w), zero past the rows. */
__device__ uint64_t new_word(const Walk &c, int64_t w, const uint8_t *src) {
  const int64_t n = c.rows_len - 8 * w < 8 ? c.rows_len - 8 * w : 8;
  if (n == 8 && ((uintptr_t)src & 7) == 0)
    return *(const uint64_t *)src;
  uint64_t v = 0;
  for (int64_t i = 0; i < n; i++)
    v |= (uint64_t)src[i] << (8 * i);
  return v;
}

/* Check word w (its new bytes from src, those below chunk offset lim): the
 * rows' changed bytes and digest change, the trailer's new bytes into *out.
 * True if any byte differs from what the generator holds. */
__device__ bool check_word(const Walk &c, int64_t w, const uint8_t *src, int64_t lim,
                           uint64_t *changed, uint64_t *dsum,
                           refit_place_cuda_out_t *out) {
  const int64_t off0 = 8 * w;
  bool diff = false;
  if (off0 < c.rows_len) {
    const uint64_t o = old_word(c, w), n = new_word(c, w, src);
    if (o != n) {
      *changed += nonzero_bytes((o ^ n) & written_mask(c, w));
      *dsum += refit_digest_term(n, (uint64_t)w) - refit_digest_term(o, (uint64_t)w);
      diff = true;
    }
  }
  const int64_t end = off0 + 8 < lim ? off0 + 8 : lim;
  for (int64_t off = off0 > c.rows_len ? off0 : c.rows_len; off < end; off++) {
    const int t = (int)(off - c.rows_len);
    const uint8_t v = src[off - off0];
    diff |= v != (uint8_t)(c.old_trailer >> (8 * t));
    reinterpret_cast<uint8_t *>(&out->trailer)[t] = v;
  }
  return diff;
}

/* Row bytes of word w that differ, repeats left out (write's count). */
__device__ uint64_t word_changes(const Walk &c, int64_t w, const uint8_t *src) {
  if (8 * w >= c.rows_len)
    return 0;
  return nonzero_bytes((old_word(c, w) ^ new_word(c, w, src)) & written_mask(c, w));
}

/* Write the row bytes of word w that differ (repeats left out: a run is all
 * repeats or none), logging each at undo index *r. */
__device__ void write_word(const Walk &c, int64_t w, const uint8_t *src, uint64_t *r,
                           uint64_t *undo_at, uint8_t *undo_old, uint64_t *written) {
  const int64_t off0 = 8 * w, end = off0 + 8 < c.rows_len ? off0 + 8 : c.rows_len;
  for (int64_t off = off0, run = 0; off < end; off += run) {
    uint8_t *at = addr(c, off, &run);
    run = run < end - off ? run : end - off;
    if (repeat(c, off))
      continue;
    for (int64_t i = 0; i < run; i++) {
      const uint8_t v = src[off - off0 + i], o = at[i];
      if (o == v)
        continue;
      at[i] = v;
      if (undo_at != nullptr) {
        undo_at[*r] = (uint64_t)(uintptr_t)(at + i);
        undo_old[*r] = o;
        (*r)++;
      }
      (*written)++;
    }
  }
}

/* The marked blocks of mask word u (bits), the first of them the idx-th
 * marked block of the chunk: f(first offset, length, its new bytes). */
template <class F>
__device__ void for_marked(uint32_t bits, int64_t u, int64_t idx, const uint8_t *data,
                           int64_t span, F f) {
  while (bits != 0) {
    const int b = __ffs(bits) - 1;
    bits &= bits - 1;
    const int64_t at = 32 * (32 * u + b);
    const int64_t len = span - at < 32 ? span - at : 32;
    f(at, len, data + 32 * idx);
    idx++;
  }
}

template <bool kWrite>
__global__ void __launch_bounds__(kThreads)
    place_pass(const refit_place_cuda_chunk_t *chunks,
               const refit_place_cuda_tile_t *tiles, refit_place_cuda_out_t *outs,
               unsigned long long *err, uint64_t *undo_at, uint8_t *undo_old,
               unsigned long long *undo_next) {
  const refit_place_cuda_tile_t tile = tiles[blockIdx.x];
  const refit_place_cuda_chunk_t *d = chunks + tile.chunk;
  Walk c;
  walk_init(&c, d);
  refit_place_cuda_out_t *out = outs + tile.chunk;
  const bool undo = kWrite && undo_at != nullptr;
  uint64_t changed = 0, dsum = 0, written = 0;
  const int64_t end = tile.item0 + tile.items;

  if (tile.kind == REFIT_DELTA_POSITIONS) {
    const uint8_t *pos = d->bytes + REFIT_DELTA_HEADER_BYTES;
    const int64_t count = load_u32(d->bytes + 12);
    const uint8_t *vals = pos + 4 * count;
    for (int64_t base = tile.item0; base < end; base += kThreads) {
      const int64_t j = base + threadIdx.x;
      uint8_t *at = nullptr;
      uint8_t v = 0, o = 0;
      /* Check: the positions before and after j from the lanes beside,
       * the warp's first and last lanes load theirs. */
      const int64_t off = j < end ? (int64_t)load_u32(pos + 4 * j) : 0;
      int64_t prev = -1, next = -1;
      if (!kWrite) {
        prev = __shfl_up_sync(0xffffffffu, off, 1);
        next = __shfl_down_sync(0xffffffffu, off, 1);
        if (threadIdx.x % 32 == 0)
          prev = j > 0 && j < end ? (int64_t)load_u32(pos + 4 * (j - 1)) : -1;
        if (threadIdx.x % 32 == 31 || j + 1 >= end)
          next = j + 1 < count ? (int64_t)load_u32(pos + 4 * (j + 1)) : -1;
        if (j == 0)
          prev = -1;
      }
      if (j < end) {
        v = vals[j];
        if (kWrite) {
          if (off < c.rows_len && !repeat(c, off)) {
            at = addr(c, off, nullptr);
            o = *at;
          }
        } else if (off >= c.span) {
          post(err, tile.chunk, (uint64_t)j, REFIT_DELTA_CUDA_POS_RANGE);
        } else if (off <= prev) {
          post(err, tile.chunk, (uint64_t)j, REFIT_DELTA_CUDA_POS_ORDER);
        } else if (off >= c.rows_len) {
          const int t = (int)(off - c.rows_len);
          if ((uint8_t)(c.old_trailer >> (8 * t)) == v)
            post(err, tile.chunk, (uint64_t)off, REFIT_DELTA_CUDA_POS_SAME);
          reinterpret_cast<uint8_t *>(&out->trailer)[t] = v;
        } else {
          const int64_t w = off / 8;
          if (prev < 0 || prev / 8 != w) {
            /* The word's first position: its old word, and in it the byte. */
            const uint64_t ow = old_word(c, w);
            o = (uint8_t)(ow >> (8 * (off - 8 * w)));
            uint64_t nw = ow;
            for (int64_t q = j; q < count && q < j + 8; q++) {
              const int64_t oq = q == j       ? off
                                 : q == j + 1 ? next
                                              : (int64_t)load_u32(pos + 4 * q);
              if (oq / 8 != w)
                break;
              if (oq < c.rows_len) {
                const int sh = 8 * (int)(oq % 8);
                nw = (nw & ~(0xffull << sh)) | (uint64_t)vals[q] << sh;
              }
            }
            dsum +=
                refit_digest_term(nw, (uint64_t)w) - refit_digest_term(ow, (uint64_t)w);
          } else {
            o = *addr(c, off, nullptr);
          }
          if (o == v)
            post(err, tile.chunk, (uint64_t)off, REFIT_DELTA_CUDA_POS_SAME);
          else
            changed += !repeat(c, off);
        }
      }
      if (kWrite) {
        uint64_t r = undo ? reserve(at != nullptr, undo_next) : 0;
        if (at != nullptr) {
          *at = v;
          if (undo) {
            undo_at[r] = (uint64_t)(uintptr_t)at;
            undo_old[r] = o;
          }
          written++;
        }
      }
    }
  } else if (tile.kind == REFIT_DELTA_MASK) {
    const uint8_t *mask = d->bytes + REFIT_DELTA_HEADER_BYTES;
    const int64_t nb = (c.span + 31) / 32, mb = (nb + 7) / 8;
    const uint8_t *data = mask + mb;
    int64_t carry = tile.data0;
    for (int64_t base = tile.item0; base < end; base += kThreads) {
      const int64_t u = base + threadIdx.x;
      uint32_t bits = 0;
      if (u < end)
        for (int64_t i = 4 * u; i < 4 * u + 4 && i < mb; i++)
          bits |= (uint32_t)mask[i] << (8 * (i - 4 * u));
      uint64_t total;
      const int64_t idx = carry + (int64_t)scan_block((uint64_t)__popc(bits), &total);
      carry += (int64_t)total;
      if (!kWrite) {
        for_marked(
            bits, u, idx, data, c.span, [&](int64_t at, int64_t len, const uint8_t *src) {
              bool diff = false;
              for (int64_t o = 0; o < len; o += 8)
                diff |=
                    check_word(c, (at + o) / 8, src + o, at + len, &changed, &dsum, out);
              if (!diff)
                post(err, tile.chunk, (uint64_t)at, REFIT_DELTA_CUDA_BLOCK_SAME);
            });
        continue;
      }
      uint64_t r = 0, r_end = 0;
      if (undo) {
        uint64_t n = 0;
        for_marked(bits, u, idx, data, c.span,
                   [&](int64_t at, int64_t len, const uint8_t *src) {
                     for (int64_t o = 0; o < len; o += 8)
                       n += word_changes(c, (at + o) / 8, src + o);
                   });
        r = reserve(n, undo_next);
        r_end = r + n;
      }
      for_marked(bits, u, idx, data, c.span,
                 [&](int64_t at, int64_t len, const uint8_t *src) {
                   for (int64_t o = 0; o < len; o += 8)
                     write_word(c, (at + o) / 8, src + o, &r, undo ? undo_at : nullptr,
                                undo_old, &written);
                 });
      for (; undo && r < r_end; r++) /* taken, not written: skipped by undo */
        undo_at[r] = 0;
    }
  } else {
    const uint8_t *src = d->full ? d->bytes : d->bytes + REFIT_DELTA_HEADER_BYTES;
    for (int64_t base = tile.item0; base < end; base += kThreads) {
      const int64_t w = base + threadIdx.x;
      const bool act = w < end;
      if (!kWrite) {
        if (act)
          check_word(c, w, src + 8 * w, c.span, &changed, &dsum, out);
        continue;
      }
      const uint64_t n = undo && act ? word_changes(c, w, src + 8 * w) : 0;
      uint64_t r = undo ? reserve(n, undo_next) : 0;
      const uint64_t r_end = r + n;
      if (act)
        write_word(c, w, src + 8 * w, &r, undo ? undo_at : nullptr, undo_old, &written);
      for (; undo && r < r_end; r++) /* taken, not written: skipped by undo */
        undo_at[r] = 0;
    }
  }

  uint64_t total;
  if (kWrite) {
    scan_block(written, &total);
    if (threadIdx.x == 0 && total > 0)
      atomicAdd(reinterpret_cast<unsigned long long *>(&out->written), total);
    return;
  }
  /* Check's sums by warps, so that no warp waits at a barrier for the
   * block's slowest (measured no faster for write's one sum). */
  warp_add(reinterpret_cast<unsigned long long *>(&out->changed), changed);
  warp_add(reinterpret_cast<unsigned long long *>(&out->sum), dsum);
}

__global__ void undo_pass(const uint64_t *undo_at, const uint8_t *undo_old, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    if (undo_at[i] != 0)
      *(uint8_t *)(uintptr_t)undo_at[i] = undo_old[i];
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

} // namespace

extern "C" refit_status_t refit_place_cuda_tiles(const refit_place_cuda_chunk_t *c,
                                                 int64_t chunk, const void *host_bytes,
                                                 refit_place_cuda_tile_t *tiles,
                                                 int64_t *ntiles) {
  *ntiles = 0;
  if (c->trailer_bytes != 0 && c->trailer_bytes != 8)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "place delta: a trailer of %d bytes (0 or an 8-byte digest)",
                     c->trailer_bytes);
  if (chunk < 0 || chunk >= REFIT_DELTA_CUDA_MAX_CHUNKS)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "place delta: chunk %lld of a batch (at most %lld)",
                     (long long)chunk, (long long)REFIT_DELTA_CUDA_MAX_CHUNKS);
  const int64_t span = c->rows * c->row_bytes + c->trailer_bytes;
  if (span > (int64_t)UINT32_MAX || c->t.rows > (int64_t)UINT32_MAX || c->rows < 1 ||
      c->row_bytes < 1)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "place delta: a chunk of %lld bytes (%lld rows) of a tensor of %lld "
                     "rows: at most UINT32_MAX bytes and rows",
                     (long long)span, (long long)c->rows, (long long)c->t.rows);
  int kind = REFIT_DELTA_DENSE;
  int64_t items = ceil_div(span, 8), per = kTileWords;
  const uint8_t *mask = nullptr;
  if (c->full) {
    if (c->len != (uint64_t)span)
      return REFIT_ERR(REFIT_ERR_INTEGRITY, "%llu bytes for a chunk span of %lld",
                       (unsigned long long)c->len, (long long)span);
  } else {
    refit_delta_info_t info;
    REFIT_CHECK(refit_delta_info(host_bytes, (size_t)c->len, &info));
    if (info.chunk_bytes != (uint64_t)span)
      return REFIT_ERR(REFIT_ERR_INTEGRITY,
                       "delta: made for a chunk of %u bytes, this one has %lld",
                       info.chunk_bytes, (long long)span);
    kind = info.encoding;
    if (kind == REFIT_DELTA_POSITIONS) {
      items = info.count;
      per = kTilePositions;
    } else if (kind == REFIT_DELTA_MASK) {
      items = ceil_div(ceil_div(span, 32), 32);
      per = kTileMaskWords;
      mask = (const uint8_t *)host_bytes + REFIT_DELTA_HEADER_BYTES;
    }
  }
  const int64_t mb = ceil_div(ceil_div(span, 32), 8);
  int64_t marked = 0;
  for (int64_t item0 = 0; item0 < items; item0 += per) {
    const int64_t n = items - item0 < per ? items - item0 : per;
    if (tiles != nullptr)
      tiles[*ntiles] = refit_place_cuda_tile_t{chunk, item0, n, marked, kind, 0};
    (*ntiles)++;
    if (mask != nullptr)
      for (int64_t i = 4 * item0; i < 4 * (item0 + n) && i < mb; i++)
        marked += __builtin_popcount(mask[i]);
  }
  return REFIT_OK;
}

extern "C" refit_status_t refit_place_check_cuda(const refit_place_cuda_chunk_t *chunks,
                                                 const refit_place_cuda_tile_t *tiles,
                                                 int64_t ntiles,
                                                 refit_place_cuda_out_t *outs,
                                                 unsigned long long *err,
                                                 cudaStream_t stream) {
  if (ntiles <= 0)
    return REFIT_OK;
  if (ntiles > INT32_MAX)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "place delta: %lld tiles in one call",
                     (long long)ntiles);
  place_pass<false><<<(unsigned)ntiles, kThreads, 0, stream>>>(chunks, tiles, outs, err,
                                                               nullptr, nullptr, nullptr);
  return refit_cuda_launch_check("place delta check");
}

extern "C" refit_status_t
refit_place_write_cuda(const refit_place_cuda_chunk_t *chunks,
                       const refit_place_cuda_tile_t *tiles, int64_t ntiles,
                       refit_place_cuda_out_t *outs, uint64_t *undo_at, uint8_t *undo_old,
                       unsigned long long *undo_next, cudaStream_t stream) {
  if (ntiles <= 0)
    return REFIT_OK;
  if (ntiles > INT32_MAX)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "place delta: %lld tiles in one call",
                     (long long)ntiles);
  if (undo_at != nullptr && (undo_old == nullptr || undo_next == nullptr))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "place delta write: an undo log needs its old values and counter");
  place_pass<true><<<(unsigned)ntiles, kThreads, 0, stream>>>(
      chunks, tiles, outs, nullptr, undo_at, undo_old, undo_next);
  return refit_cuda_launch_check("place delta write");
}

extern "C" refit_status_t refit_place_undo_cuda(const uint64_t *undo_at,
                                                const uint8_t *undo_old, int64_t n,
                                                cudaStream_t stream) {
  if (n <= 0)
    return REFIT_OK;
  const int64_t want = ceil_div(n, kThreads);
  const int64_t fill = refit_cuda_filling_grid(undo_pass, kThreads);
  undo_pass<<<(unsigned)(want < fill ? want : fill), kThreads, 0, stream>>>(undo_at,
                                                                            undo_old, n);
  return refit_cuda_launch_check("place delta undo");
}

extern "C" refit_status_t refit_place_cuda_report(unsigned long long key,
                                                  int64_t *chunk) {
  *chunk = -1;
  if (key == ~0ull)
    return REFIT_OK;
  *chunk = (int64_t)(key >> kKeyChunkShift);
  const unsigned long long detail = key & 0xffffffffu;
  const int reason = (int)(key >> 32 & 0xff);
  switch (reason) {
  case REFIT_DELTA_CUDA_POS_RANGE:
    return REFIT_ERR(REFIT_ERR_INTEGRITY, "position %llu lies past the chunk", detail);
  case REFIT_DELTA_CUDA_POS_ORDER:
    return REFIT_ERR(REFIT_ERR_INTEGRITY, "position %llu does not follow the one before",
                     detail);
  case REFIT_DELTA_CUDA_POS_SAME:
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "its positions delta names byte %llu as changed, but the "
                     "destination holds that already: the delta was not made against "
                     "these bytes",
                     detail);
  case REFIT_DELTA_CUDA_BLOCK_SAME:
    return REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "its mask delta marks the block at byte %llu as changed, but the "
                     "destination holds it already: the delta was not made against "
                     "these bytes",
                     detail);
  default:
    return REFIT_ERR(REFIT_ERR_INTERNAL, "place delta: unknown check %d at %llu", reason,
                     detail);
  }
}
