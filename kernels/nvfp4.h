/*
 * NVFP4: BF16 -> E2M1 elements, two to a byte, one E4M3 scale per 16
 * elements of a row and one FP32 global scale per tensor (C reference). The
 * format vLLM serves ModelOpt NVFP4 checkpoints in: `weight` uint8
 * [N, K/2], `weight_scale` float8_e4m3fn [N, K/16] (128x4-swizzled by the
 * FlashInfer backends), `weight_scale_2` float32, value =
 * e2m1(q) * e4m3(sf) * weight_scale_2.
 *
 * The rules (docs/nvfp4.md states them with the source of each):
 *
 *   - Global scale from the amax of the WHOLE tensor (every shard, and every
 *     piece of a fused layer): gsf = fl(fl(1 / a) * 2688) with 2688 = 448 * 6
 *     and a = amax, +Inf taken as FLT_MAX (torch's `(448 * 6) / t` after
 *     `nan_to_num`); NaN takes no part in the amax. The stored
 *     weight_scale_2 is fl(1 / gsf), the decode scale the quantizer applies.
 *   - Blocks are 16 consecutive elements of one row, aligned to the row's
 *     first column; the last block of a row with k % 16 != 0 is partial and
 *     has only its own elements (nothing is padded in). A block never spans
 *     rows, so a row slice quantizes to the bytes of the whole tensor, and a
 *     column slice does when it starts on a multiple of 16.
 *   - vmax = max |x| over the block (NaN ignored). If vmax == 0 the scale
 *     byte is 0 and out = 0 (so the elements are signed zeros).
 *     Otherwise sf = e4m3_rne_satfinite(fl(vmax * fl(gsf * fl(1/6)))),
 *     out = min(fl(1 / fl(e4m3(sf) * fl(1 / gsf))), FLT_MAX) (1 / 0 = +Inf
 *     becomes FLT_MAX), and element q = e2m1_rne_satfinite(fl(x * out)):
 *     FlashInfer's cvt_warp_fp16_to_fp4 with its fast math disabled.
 *   - E2M1: codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6, bit 3 the sign; ties
 *     to the even code; |v| > 6 and +-Inf saturate to +-6; a negative value
 *     that rounds to zero, -0.0 included, keeps its sign (0x8). Element 2i of a row is
 * the low nibble of byte i, element 2i+1 the high nibble; an odd k leaves the last byte's
 * high nibble 0.
 *
 * Non-finite inputs (our rule, which the CUDA twin follows): NaN elements
 * take no part in any amax and encode as 0x7 (+6, the sign dropped); an Inf
 * element makes its block's sf 448 (0x7E) and encodes as +-6.
 *
 * Every function is thread-safe; large inputs are split over worker threads
 * (kernels/parallel.h) with the same bytes for any number of them.
 */
#ifndef REFIT_KERNELS_NVFP4_H
#define REFIT_KERNELS_NVFP4_H

#include "refit/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Elements per scale block. */
#define REFIT_NVFP4_BLOCK 16

/* Scale columns of a row of k elements: ceil(k / 16). */
static inline int64_t refit_nvfp4_scale_cols(int64_t k) {
  return (k + REFIT_NVFP4_BLOCK - 1) / REFIT_NVFP4_BLOCK;
}

/* Packed bytes of a row of k elements: ceil(k / 2). */
static inline int64_t refit_nvfp4_row_bytes(int64_t k) { return (k + 1) / 2; }

/*
 * The amax key of a BF16 matrix [rows, k] (row r at src + r * stride
 * elements): the largest |x| as BF16 bits with the sign cleared, NaN
 * ignored, 0 for an empty matrix. Keys order like the values, so the key of
 * a tensor held in shards is the integer maximum of its shards' keys: what
 * the global-amax collective reduces. NULL src with a non-empty shape, a
 * negative shape or a stride below k: 0 and REFIT_ERR_INVALID_ARGUMENT in
 * *status (when not NULL); REFIT_OK there otherwise.
 */
uint16_t refit_nvfp4_amax_key(const uint16_t *src, int64_t rows, int64_t k,
                              int64_t src_stride_elems, refit_status_t *status);

/*
 * Many matrices' amax keys at once: each descriptor's key merged into its
 * slot, *slot = max(*slot, key of [rows, k] at src with row stride `stride`
 * elements). The CUDA twin (refit_nvfp4_amax_keys_cuda) cuts the table's
 * rows into tiles of about REFIT_NVFP4_AMAX_TILE elements (whole rows,
 * refit_nvfp4_amax_tile_rows), numbered across the table by
 * refit_nvfp4_amax_number, and runs them all in one launch.
 */
#define REFIT_NVFP4_AMAX_TILE 32768
typedef struct {
  const uint16_t *src;
  int64_t rows, k, stride; /* stride in elements */
  uint32_t *slot;
  int64_t tile0; /* tiles of the descriptors before this one (number) */
} refit_nvfp4_amax_desc_t;

/* Number the tiles of descs[0 .. n) (tile0) and return their total; a
 * negative shape, a stride below k, a NULL source or slot of a non-empty
 * matrix, or k / 8 beyond 2^31: -1 and REFIT_ERR_INVALID_ARGUMENT in
 * *status (REFIT_OK there otherwise). */
int64_t refit_nvfp4_amax_number(refit_nvfp4_amax_desc_t *descs, int64_t n,
                                refit_status_t *status);

/* The C reference: every descriptor's key merged into its (host) slot. */
refit_status_t refit_nvfp4_amax_keys(const refit_nvfp4_amax_desc_t *descs, int64_t n);

/* The global scale gsf of a tensor whose amax key is `key` (+Inf for 0). */
float refit_nvfp4_global_scale(uint16_t key);

/* The stored weight_scale_2 of global scale gsf: fl(1 / gsf). */
float refit_nvfp4_global_decode(float gsf);

/*
 * Quantize a row-major BF16 matrix [rows, k] to NVFP4 with global scale gsf.
 *
 *   src        BF16 bits; row r at src + r * src_stride_elems.
 *   rows, k    shape, any (a partial last block per row when k % 16 != 0).
 *   gsf        the tensor's global scale: > 0 (+Inf allowed), not NaN.
 *   q          packed E2M1 [rows, ceil(k/2)]; row r at q + r * q_stride.
 *   sf         E4M3 scales [rows, ceil(k/16)] in the linear layout; row r at
 *              sf + r * sf_stride (kernels/layout.h swizzles them).
 *
 * Errors: REFIT_ERR_INVALID_ARGUMENT (negative shape, NULL buffer with a
 * non-empty shape, a stride smaller than a row, a NaN, zero or negative gsf);
 * nothing is written then.
 */
refit_status_t refit_nvfp4_quantize(const uint16_t *src, int64_t rows, int64_t k,
                                    int64_t src_stride_elems, float gsf, uint8_t *q,
                                    int64_t q_stride, uint8_t *sf, int64_t sf_stride);

/* The argument rule of refit_nvfp4_quantize and its CUDA twin; `who` names
 * the caller in the message. */
refit_status_t refit_nvfp4_check(const char *who, const void *src, int64_t rows,
                                 int64_t k, int64_t src_stride_elems, float gsf,
                                 const void *q, int64_t q_stride, const void *sf,
                                 int64_t sf_stride);

/*
 * `groups` matrices [rows, k] stacked as one [groups * rows, k] (matrix g
 * from row g * rows of src, q and sf, with the strides above), matrix g
 * under global scale gsf[g] (a host array): the bytes of refit_nvfp4_quantize
 * on each. The stacked experts of an MoE tensor, each with its own scale.
 * decode (NULL: none) gets each matrix's stored weight_scale_2,
 * refit_nvfp4_global_decode(gsf[g]). Errors: refit_nvfp4_quantize's, naming
 * the matrix whose scale is bad; nothing is written then.
 */
refit_status_t refit_nvfp4_quantize_groups(const uint16_t *src, int64_t groups,
                                           int64_t rows, int64_t k,
                                           int64_t src_stride_elems, const float *gsf,
                                           uint8_t *q, int64_t q_stride, uint8_t *sf,
                                           int64_t sf_stride, float *decode);

/* The argument rule of refit_nvfp4_quantize_groups and its CUDA twin. */
refit_status_t refit_nvfp4_groups_check(const char *who, const void *src, int64_t groups,
                                        int64_t rows, int64_t k, int64_t src_stride_elems,
                                        const float *gsf, const void *q, int64_t q_stride,
                                        const void *sf, int64_t sf_stride);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_NVFP4_H */
