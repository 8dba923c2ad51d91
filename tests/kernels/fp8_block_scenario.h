/*
 * Block FP8 test matrices shared by the C unit test and the CUDA twin's test:
 * random weights with a different adversarial pattern in every 128 x 128
 * block (all zeros, BF16 subnormals, tiny values whose 1/amax overflows, huge
 * next to tiny, +-Inf, amax 448 * 2^e, mixed magnitudes, NaN when asked).
 */
#ifndef REFIT_TESTS_FP8_BLOCK_SCENARIO_H
#define REFIT_TESTS_FP8_BLOCK_SCENARIO_H

#include "kernels_test.h"

static inline void fbs_fill(uint16_t *x, int64_t rows, int64_t k, int with_nan) {
  for (int64_t i = 0; i < rows * k; i++)
    x[i] = kt_rand_bf16();
  int64_t kind = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += 128)
    for (int64_t c0 = 0; c0 < k; c0 += 128, kind++) {
      const int64_t r1 = r0 + 128 < rows ? r0 + 128 : rows;
      const int64_t c1 = c0 + 128 < k ? c0 + 128 : k;
      const int64_t at = kt_rand_range(r0, r1 - 1) * k + kt_rand_range(c0, c1 - 1);
      for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) {
          uint16_t *v = &x[r * k + c];
          const uint16_t sign = (uint16_t)((kt_rand() & 1) << 15);
          switch (kind % 9) {
          case 0: /* zeros of both signs */
            *v = sign;
            break;
          case 1: /* subnormals */
            *v = sign | (uint16_t)(kt_rand() & 0x7f);
            break;
          case 2: /* tiny normals: 448 / amax overflows */
            *v = sign | (uint16_t)kt_rand_range(0x0080, 0x03ff);
            break;
          case 3: /* tiny, one huge value below */
            *v = sign | (uint16_t)kt_rand_range(0x0c00, 0x0fff);
            break;
          case 6: /* any finite magnitude */
            *v = sign | (uint16_t)kt_rand_range(0, 0x7f7f);
            break;
          default:
            break;
          }
        }
      switch (kind % 9) {
      case 3:
        x[at] = 0x7f7f; /* the largest finite BF16 */
        break;
      case 4:
        x[at] = (kt_rand() & 1) ? 0xff80 : 0x7f80;
        break;
      case 5: /* 448 * 2^e */
        x[at] = (uint16_t)(((127 + 8 + kt_rand_range(-20, 20)) << 7) | 0x60);
        break;
      case 7:
        if (with_nan)
          x[at] = 0x7fc1;
        break;
      default:
        break;
      }
    }
}

#endif /* REFIT_TESTS_FP8_BLOCK_SCENARIO_H */
