/*
 * MXFP8 quantization as device code shared by the CUDA kernels that quantize
 * (kernels/mxfp8.cu, and the pack and land kernels of kernels/datapath.cu).
 * Internal; CUDA sources only.
 *
 * Mapping: a warp quantizes 8 * U consecutive 32-element blocks of a row-major
 * [rows, k / 32] grid of blocks (refit_mxfp8_dev_warp_tile). A block belongs
 * to a quad of lanes, each lane holding 8 elements (16 bytes of BF16), so that
 * one warp-wide load reads 512 contiguous bytes and one warp-wide store writes
 * 256; the quad's amax takes two shuffles. All U loads of a lane are issued
 * before any arithmetic, which keeps enough bytes in flight per multiprocessor.
 * Narrower loads and stores are picked by the actual alignment of each
 * address, so any alignment is correct and aligned data takes the wide path.
 *
 * Element encoding. With sm_89 or newer device code the hardware instruction
 * cvt.rn.satfinite.e4m3x2.f32 does it. Older targets (and PTX of an older
 * target that the driver compiles for a newer GPU, which is what a build with
 * nvcc's default architecture runs on a Hopper) would get cuda_fp8.h's
 * emulation: a conversion to double and 64-bit integer code with branches per
 * element, which held the kernels to a fifth of copy bandwidth on an H200.
 * For them the encoding here is the
 * C reference's own branch-free recipe (kernels/mxfp8.c) folded into one
 * fp32 add per element: for finite |v| <= 448 the sum |v| + C, with C =
 * 2^(e+20) for the binade e of max(|v|, 2^-6) and 8 * (e + 6) in C's low
 * mantissa bits, is rounded by the FPU to the E4M3 step of that binade (ties to
 * even, the low bits of C being a multiple of 8), and its low byte is the E4M3
 * magnitude code. Groups with a NaN or a value beyond 448 (only possible with
 * an Inf in the block) take cuda_fp8.h's exact conversion instead. The rules
 * are those of kernels/mxfp8.h (scale rule from kernels/mxfp8_rules.h); the
 * tests hold the bytes equal to the C reference on every BF16 value under
 * every scale.
 */
#ifndef REFIT_KERNELS_MXFP8_DEVICE_CUH
#define REFIT_KERNELS_MXFP8_DEVICE_CUH

#include "kernels/mxfp8_rules.h"

#include "core/digest.h"

#include <cuda_fp8.h>
#include <stdint.h>

/* Low and high BF16 of a little-endian pair as fp32 (exact). */
__device__ inline float refit_mxfp8_dev_lo(uint32_t p) {
  return __uint_as_float(p << 16);
}
__device__ inline float refit_mxfp8_dev_hi(uint32_t p) {
  return __uint_as_float(p & 0xffff0000u);
}

/* 8 BF16 values (16 bytes) at s, any alignment, as 4 little-endian pairs. */
__device__ inline void refit_mxfp8_dev_load8(const uint8_t *__restrict__ s,
                                             uint32_t x[4]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(s);
  if ((a & 15) == 0) {
    const uint4 t = *reinterpret_cast<const uint4 *>(s);
    x[0] = t.x;
    x[1] = t.y;
    x[2] = t.z;
    x[3] = t.w;
  } else if ((a & 3) == 0) {
#pragma unroll
    for (int i = 0; i < 4; i++)
      x[i] = reinterpret_cast<const uint32_t *>(s)[i];
  } else if ((a & 1) == 0) {
    const uint16_t *h = reinterpret_cast<const uint16_t *>(s);
#pragma unroll
    for (int i = 0; i < 4; i++)
      x[i] = static_cast<uint32_t>(h[2 * i]) |
             static_cast<uint32_t>(h[2 * i + 1]) << 16;
  } else {
#pragma unroll
    for (int i = 0; i < 4; i++)
      x[i] = static_cast<uint32_t>(s[4 * i]) |
             static_cast<uint32_t>(s[4 * i + 1]) << 8 |
             static_cast<uint32_t>(s[4 * i + 2]) << 16 |
             static_cast<uint32_t>(s[4 * i + 3]) << 24;
  }
}

/* 8 E4M3 bytes (two little-endian words) to d, any alignment. */
__device__ inline void refit_mxfp8_dev_store8(uint8_t *__restrict__ d,
                                              const uint32_t q[2]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(d);
  if ((a & 7) == 0) {
    *reinterpret_cast<uint2 *>(d) = make_uint2(q[0], q[1]);
  } else if ((a & 3) == 0) {
    reinterpret_cast<uint32_t *>(d)[0] = q[0];
    reinterpret_cast<uint32_t *>(d)[1] = q[1];
  } else {
#pragma unroll
    for (int i = 0; i < 8; i++)
      d[i] = static_cast<uint8_t>(q[i / 4] >> (8 * (i % 4)));
  }
}

/* Exact E4M3 bytes of the 4 values of p0, p1 times inv (cuda_fp8.h). */
__device__ inline uint32_t refit_mxfp8_dev_cvt4(uint32_t p0, uint32_t p1,
                                                float inv) {
  uint32_t w = 0;
  const uint32_t p[2] = {p0, p1};
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const float2 f = make_float2(__fmul_rn(refit_mxfp8_dev_lo(p[h]), inv),
                                 __fmul_rn(refit_mxfp8_dev_hi(p[h]), inv));
    w |= static_cast<uint32_t>(
             __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3))
         << (16 * h);
  }
  return w;
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 890
/*
 * E4M3 magnitude code of v = |x| * inv in the low byte (upper bits are
 * garbage), valid for finite v <= 448; see the header comment. NaN gives a
 * NaN sum, which the caller accumulates in chk to detect.
 */
__device__ inline uint32_t refit_mxfp8_dev_code(float x, float inv,
                                                float &chk) {
  const float v = __fmul_rn(fabsf(x), inv);
  const uint32_t a = __float_as_uint(v);
  /* Binade of max(v, 2^-6): below it the E4M3 step stays 2^-9. */
  const uint32_t eb = max(a, 0x3c800000u) & 0x7f800000u;
  /* C = 2^(e+20) with 8 * (e + 6) = (eb >> 20) - 968 in its mantissa. */
  const uint32_t c = eb + (eb >> 20) + (0x0a000000u - 968u);
  const float s = __fadd_rn(v, __uint_as_float(c));
  chk = __fadd_rn(chk, s);
  return __float_as_uint(s);
}

/* The 4 codes of p0, p1 (see refit_mxfp8_dev_code) with their signs. */
__device__ inline uint32_t refit_mxfp8_dev_fast4(uint32_t p0, uint32_t p1,
                                                 float inv, float &chk) {
  const uint32_t c0 = refit_mxfp8_dev_code(refit_mxfp8_dev_lo(p0), inv, chk);
  const uint32_t c1 = refit_mxfp8_dev_code(refit_mxfp8_dev_hi(p0), inv, chk);
  const uint32_t c2 = refit_mxfp8_dev_code(refit_mxfp8_dev_lo(p1), inv, chk);
  const uint32_t c3 = refit_mxfp8_dev_code(refit_mxfp8_dev_hi(p1), inv, chk);
  const uint32_t w = __byte_perm(__byte_perm(c0, c1, 0x0040),
                                 __byte_perm(c2, c3, 0x0040), 0x5410);
  /* Bytes 1 and 3 of each pair hold the BF16 signs in their top bit. */
  return w | (__byte_perm(p0, p1, 0x7531) & 0x80808080u);
}
#endif

/*
 * E4M3 bytes of the 8 values in x (4 pairs) times inv, as 2 words; amax is
 * the largest magnitude of the block they belong to (NaN excluded).
 */
__device__ inline void refit_mxfp8_dev_encode8(const uint32_t x[4], float inv,
                                               float amax, uint32_t q[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  (void)amax;
  q[0] = refit_mxfp8_dev_cvt4(x[0], x[1], inv);
  q[1] = refit_mxfp8_dev_cvt4(x[2], x[3], inv);
#else
  float chk = 0.0f;
  q[0] = refit_mxfp8_dev_fast4(x[0], x[1], inv, chk);
  q[1] = refit_mxfp8_dev_fast4(x[2], x[3], inv, chk);
  /* A NaN among the 8 (chk is NaN) or a product beyond 448 (an Inf in the
   * block): the exact conversion. Rare, and only this group pays. */
  if (!(chk == chk) || !(__fmul_rn(amax, inv) <= REFIT_MXFP8_E4M3_MAX)) {
    q[0] = refit_mxfp8_dev_cvt4(x[0], x[1], inv);
    q[1] = refit_mxfp8_dev_cvt4(x[2], x[3], inv);
  }
#endif
}

/* Largest magnitude of the 8 values in x; NaN does not count (fmaxf). */
__device__ inline float refit_mxfp8_dev_amax8(const uint32_t x[4]) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; i++)
    m = fmaxf(m, fmaxf(fabsf(refit_mxfp8_dev_lo(x[i])),
                       fabsf(refit_mxfp8_dev_hi(x[i]))));
  return m;
}

/*
 * Quantize the 8 elements x of one lane of a quad that holds a block (lane
 * l holds elements 8 (l % 4) .. 8 (l % 4) + 7): q gets their E4M3 bytes;
 * returns the block's stored scale byte (0 stored as 1). Every lane of
 * quad_mask must call it together.
 */
__device__ inline uint8_t refit_mxfp8_dev_quantize8(const uint32_t x[4],
                                                    unsigned quad_mask,
                                                    uint32_t q[2]) {
  float amax = refit_mxfp8_dev_amax8(x);
  amax = fmaxf(amax, __shfl_xor_sync(quad_mask, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(quad_mask, amax, 2));
  const uint32_t E = refit_mxfp8_scale_rule(amax);
  refit_mxfp8_dev_encode8(x, refit_mxfp8_inv_scale(E), amax, q);
  return static_cast<uint8_t>(E == 0 ? 1 : E);
}

/* A row-major grid of blocks: BF16 in, E4M3 and linear scales out. */
struct refit_mxfp8_dev_rows_t {
  const uint8_t *src; /* BF16 bytes; row r at src + r * src_pitch */
  int64_t src_pitch;
  uint8_t *q; /* row r at q + r * q_pitch */
  int64_t q_pitch;
  uint8_t *scale; /* row r at scale + r * scale_pitch */
  int64_t scale_pitch;
  int64_t nb;    /* blocks per row, k / 32 (> 0) */
  int64_t total; /* rows * nb */
};

/*
 * Blocks [g0, g0 + 8 U) of m (those below m.total), by the whole warp (every
 * lane calls it; lane = 0..31): in step i lane l takes part l % 4 of block
 * g0 + 8 i + l / 4. One division per call; the row of each later block
 * follows by stepping.
 *
 * With kDigest, returns this lane's digest terms (core/digest.h) of the BF16
 * bytes it read, taken as words of the byte range that starts at m.src (the
 * land kernel's wire chunk, whose rows are contiguous: each lane's 16 bytes
 * are two whole words of it, whatever the address alignment); else 0.
 */
template <int U, bool kDigest = false>
__device__ inline uint64_t
refit_mxfp8_dev_warp_tile(const refit_mxfp8_dev_rows_t &m, int64_t g0,
                          int lane) {
  const int part = lane & 3;
  const unsigned quad_mask = 0xfu << (lane & 28);
  int64_t r, b;
  if (g0 <= INT32_MAX && m.nb <= INT32_MAX) {
    const uint32_t r32 =
        static_cast<uint32_t>(g0) / static_cast<uint32_t>(m.nb);
    r = r32;
    b = g0 - static_cast<int64_t>(r32) * m.nb;
  } else {
    r = g0 / m.nb;
    b = g0 - r * m.nb;
  }
  b += lane / 4;
  uint32_t x[U][4];
  int64_t rs[U], bs[U];
  uint64_t sum = 0;
#pragma unroll
  for (int i = 0; i < U; i++) {
    while (b >= m.nb) {
      b -= m.nb;
      r++;
    }
    rs[i] = r;
    bs[i] = b;
    if (g0 + 8 * i + lane / 4 < m.total) {
      const int64_t at = r * m.src_pitch + 64 * b + 16 * part;
      refit_mxfp8_dev_load8(m.src + at, x[i]);
      if (kDigest) {
        const uint64_t word = static_cast<uint64_t>(at / 8);
        sum += refit_digest_term2(x[i][0], x[i][1], word);
        sum += refit_digest_term2(x[i][2], x[i][3], word + 1);
      }
    }
    b += 8;
  }
#pragma unroll
  for (int i = 0; i < U; i++) {
    if (g0 + 8 * i + lane / 4 >= m.total)
      break; /* the whole quad leaves together */
    uint32_t q[2];
    const uint8_t s = refit_mxfp8_dev_quantize8(x[i], quad_mask, q);
    refit_mxfp8_dev_store8(m.q + rs[i] * m.q_pitch + 32 * bs[i] + 8 * part, q);
    if (part == 0)
      m.scale[rs[i] * m.scale_pitch + bs[i]] = s;
  }
  return sum;
}

#endif /* REFIT_KERNELS_MXFP8_DEVICE_CUH */
