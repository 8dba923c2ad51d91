/*
 * MXFP8 quantization of one 32-element block by one thread, as device code
 * shared by the CUDA kernels that quantize (kernels/mxfp8.cu, and the pack and
 * land kernels of kernels/datapath.cu). Internal; CUDA sources only.
 *
 * One thread owns a whole block: 64 bytes of BF16 in (four 16-byte loads when
 * the source is 16-byte aligned), amax and scale in registers, 32 E4M3 bytes
 * out (two 16-byte stores when aligned) and the scale byte returned. Narrower
 * loads and stores are chosen by the actual alignment of each address, so any
 * alignment is correct and aligned data takes the wide path. The rules are
 * those of kernels/mxfp8.h (scale rule from kernels/mxfp8_rules.h, elements
 * by the hardware's cvt.rn.satfinite.e4m3x2.f32); the tests hold the bytes
 * equal to the C reference.
 */
#ifndef REFIT_KERNELS_MXFP8_DEVICE_CUH
#define REFIT_KERNELS_MXFP8_DEVICE_CUH

#include "kernels/mxfp8_rules.h"

#include <cuda_fp8.h>
#include <stdint.h>

/* The 32 BF16 values of a block as 16 little-endian pairs (element 2i low). */
__device__ inline void refit_mxfp8_dev_load_block(const uint8_t *__restrict__ s,
                                                  uint32_t x[16]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(s);
  if ((a & 15) == 0) {
    const uint4 *v = reinterpret_cast<const uint4 *>(s);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const uint4 t = v[i];
      x[4 * i] = t.x;
      x[4 * i + 1] = t.y;
      x[4 * i + 2] = t.z;
      x[4 * i + 3] = t.w;
    }
  } else if ((a & 3) == 0) {
#pragma unroll
    for (int i = 0; i < 16; i++)
      x[i] = reinterpret_cast<const uint32_t *>(s)[i];
  } else if ((a & 1) == 0) {
#pragma unroll
    for (int i = 0; i < 16; i++)
      x[i] =
          static_cast<uint32_t>(reinterpret_cast<const uint16_t *>(s)[2 * i]) |
          static_cast<uint32_t>(
              reinterpret_cast<const uint16_t *>(s)[2 * i + 1])
              << 16;
  } else {
#pragma unroll
    for (int i = 0; i < 16; i++)
      x[i] = static_cast<uint32_t>(s[4 * i]) |
             static_cast<uint32_t>(s[4 * i + 1]) << 8 |
             static_cast<uint32_t>(s[4 * i + 2]) << 16 |
             static_cast<uint32_t>(s[4 * i + 3]) << 24;
  }
}

/* 32 E4M3 bytes as 8 little-endian words, to d at any alignment. */
__device__ inline void refit_mxfp8_dev_store_q(uint8_t *__restrict__ d,
                                               const uint32_t q[8]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(d);
  if ((a & 15) == 0) {
    reinterpret_cast<uint4 *>(d)[0] = make_uint4(q[0], q[1], q[2], q[3]);
    reinterpret_cast<uint4 *>(d)[1] = make_uint4(q[4], q[5], q[6], q[7]);
  } else if ((a & 7) == 0) {
#pragma unroll
    for (int i = 0; i < 4; i++)
      reinterpret_cast<uint2 *>(d)[i] = make_uint2(q[2 * i], q[2 * i + 1]);
  } else if ((a & 3) == 0) {
#pragma unroll
    for (int i = 0; i < 8; i++)
      reinterpret_cast<uint32_t *>(d)[i] = q[i];
  } else {
#pragma unroll
    for (int i = 0; i < 32; i++)
      d[i] = static_cast<uint8_t>(q[i / 4] >> (8 * (i % 4)));
  }
}

__device__ inline float refit_mxfp8_dev_bf16(uint32_t bits16) {
  return __uint_as_float(bits16 << 16);
}

/*
 * Quantize the block held in x (see load_block): q gets the 32 E4M3 bytes as
 * 8 words; returns the stored scale byte (0 stored as 1).
 */
__device__ inline uint8_t refit_mxfp8_dev_quantize(const uint32_t x[16],
                                                   uint32_t q[8]) {
  int32_t amax = 0;
#pragma unroll
  for (int i = 0; i < 16; i++) {
    amax =
        max(amax, refit_mxfp8_amax_key(static_cast<uint16_t>(x[i] & 0xffff)));
    amax = max(amax, refit_mxfp8_amax_key(static_cast<uint16_t>(x[i] >> 16)));
  }
  const uint32_t E =
      refit_mxfp8_scale_rule(refit_mxfp8_dev_bf16(static_cast<uint32_t>(amax)));
  const float inv = refit_mxfp8_inv_scale(E);
#pragma unroll
  for (int i = 0; i < 8; i++) {
    uint32_t w = 0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const uint32_t p = x[2 * i + h];
      const float2 f =
          make_float2(__fmul_rn(refit_mxfp8_dev_bf16(p & 0xffff), inv),
                      __fmul_rn(refit_mxfp8_dev_bf16(p >> 16), inv));
      const __nv_fp8x2_storage_t c =
          __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3);
      w |= static_cast<uint32_t>(c) << (16 * h);
    }
    q[i] = w;
  }
  return static_cast<uint8_t>(E == 0 ? 1 : E);
}

/* Load, quantize and store one block; returns the scale byte. */
__device__ inline uint8_t refit_mxfp8_dev_block(const uint8_t *__restrict__ src,
                                                uint8_t *__restrict__ q) {
  uint32_t x[16], out[8];
  refit_mxfp8_dev_load_block(src, x);
  const uint8_t s = refit_mxfp8_dev_quantize(x, out);
  refit_mxfp8_dev_store_q(q, out);
  return s;
}

#endif /* REFIT_KERNELS_MXFP8_DEVICE_CUH */
