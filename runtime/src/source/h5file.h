/*
 * HDF5 files: the plumbing that the generator dump (dump.c), the checkpoint
 * source (source_hdf5.c), the checkpoint writer (checkpoint.c) and
 * refit-dump-check share, the two formats' names, and the bit-level number
 * conversions their readers use. The dump's schema is in dump.h.
 *
 * Checkpoint schema (refit_checkpoint_write writes it for refit-ckpt,
 * source.kind hdf5 reads it): one
 * dataset per trainer tensor under its Hugging Face name, full (unsharded)
 * shape, [n] for 1-D tensors; element type uint16 with attribute dtype =
 * "bfloat16", or IEEE float32, or IEEE float16 (optional dtype attribute
 * "float32" / "float16").
 */
#ifndef REFIT_H5FILE_H
#define REFIT_H5FILE_H

#include "core/error.h"

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define REFIT_DUMP_FORMAT "refit-dump-1"
#define REFIT_CKPT_FORMAT "refit-checkpoint-1"

/* ---------------------------------------------------------------------- */
/* HDF5 plumbing                                                           */
/* ---------------------------------------------------------------------- */

/* Turn off HDF5's own printing of its error stack on this thread: refit
 * reports HDF5 failures itself, through refit_h5_error(). */
void refit_h5_quiet(void);

/*
 * Record an HDF5 failure: "<context>: <call> failed: <HDF5's innermost
 * message>" with REFIT_ERR_HDF5, where context is the printf-style rest.
 */
refit_status_t refit_h5_error(const char *call, const char *fmt, ...)
    REFIT_PRINTF(2, 3);

/* HDF5 calls return a negative hid_t/herr_t/htri_t on failure. `expr` may be
 * an assignment (`fid = H5Fopen(...)`); the rest is the context message. */
#define REFIT_H5_CHECK_GOTO(expr, status_var, label, ...)                     \
  do {                                                                        \
    if ((expr) < 0) {                                                         \
      (status_var) = refit_h5_error(#expr, __VA_ARGS__);                      \
      goto label;                                                             \
    }                                                                         \
  } while (0)

/* A string attribute (fixed length) on `obj`. */
refit_status_t refit_h5_attr_write_str(hid_t obj, const char *name,
                                       const char *value);
/* A 64-bit integer attribute, scalar (n == 0) or an array of n values. */
refit_status_t refit_h5_attr_write_i64(hid_t obj, const char *name,
                                       const int64_t *values, size_t n);
/* Scalar 64-bit integer attributes attrs[0 .. n) on `obj`, in order. */
typedef struct {
  const char *name;
  int64_t value;
} refit_h5_i64_t;
refit_status_t refit_h5_attr_write_i64s(hid_t obj, const refit_h5_i64_t *attrs, size_t n);
/*
 * Read string attribute `name` of `obj` (fixed or variable length) into
 * buf[len]. *found is 0 when there is no such attribute; a non-string
 * attribute is REFIT_ERR_HDF5.
 */
refit_status_t refit_h5_attr_read_str(hid_t obj, const char *name, char *buf,
                                      size_t len, int *found);
/* Read a scalar integer attribute into *value (converted to int64). */
refit_status_t refit_h5_attr_read_i64(hid_t obj, const char *name,
                                      int64_t *value);
/* IEEE binary16, little endian (HDF5 1.10 has no predefined half type).
 * The caller closes it with H5Tclose. */
hid_t refit_h5_type_f16(void);

/* ---------------------------------------------------------------------- */
/* Number formats (bit patterns)                                           */
/* ---------------------------------------------------------------------- */

/* float32 -> bfloat16, round to nearest even; NaN stays a (quiet) NaN. */
static inline uint16_t refit_bf16_from_f32(uint32_t f) {
  if ((f & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((f >> 16) | 0x40u);
  return (uint16_t)((f + 0x7fffu + ((f >> 16) & 1u)) >> 16);
}

/* float16 -> float32, exact. */
static inline uint32_t refit_f32_from_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0x1f) /* inf, NaN */
    return sign | 0x7f800000u | (mant << 13);
  if (exp == 0) {
    if (mant == 0)
      return sign;
    /* subnormal: normalize */
    int e = -1;
    do {
      mant <<= 1;
      e++;
    } while ((mant & 0x400u) == 0);
    return sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return sign | ((exp + 127 - 15) << 23) | (mant << 13);
}

/* float16 -> bfloat16: exact where bfloat16 holds the value (always in
 * range; rounds to nearest even when the 10-bit mantissa does not fit). */
static inline uint16_t refit_bf16_from_f16(uint16_t h) {
  return refit_bf16_from_f32(refit_f32_from_f16(h));
}

/* float32 -> float16, round to nearest even, overflow to infinity. */
static inline uint16_t refit_f16_from_f32(uint32_t f) {
  uint16_t sign = (uint16_t)((f >> 16) & 0x8000u);
  uint32_t exp = (f >> 23) & 0xffu, mant = f & 0x7fffffu;
  if (exp == 0xff)
    return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0));
  int32_t e = (int32_t)exp - 127 + 15;
  if (e >= 0x1f)
    return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10)
      return sign;
    mant |= 0x800000u; /* implicit bit */
    uint32_t shift = (uint32_t)(14 - e);
    uint32_t half = 1u << (shift - 1);
    uint32_t rest = mant & ((1u << shift) - 1u);
    uint32_t v = mant >> shift;
    if (rest > half || (rest == half && (v & 1u)))
      v++;
    return (uint16_t)(sign | v);
  }
  uint32_t v = ((uint32_t)e << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (v & 1u)))
    v++; /* may carry into the exponent, up to infinity: correct */
  return (uint16_t)(sign | v);
}

static inline uint32_t refit_f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof(u));
  return u;
}

static inline float refit_f32_from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof(x));
  return x;
}

#endif /* REFIT_H5FILE_H */
