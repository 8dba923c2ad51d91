/*
 * NVFP4 test matrices shared by the C unit test and the CUDA twin's test:
 * random BF16 with a different adversarial pattern in every block of 16
 * (zeros of both signs, subnormals, tiny normals, one huge value among tiny
 * ones, +-Inf, NaN, any finite magnitude).
 */
#ifndef REFIT_TESTS_NVFP4_SCENARIO_H
#define REFIT_TESTS_NVFP4_SCENARIO_H

#include "kernels_test.h"

static inline void nvs_fill(uint16_t *x, int64_t rows, int64_t k) {
  for (int64_t i = 0; i < rows * k; i++)
    x[i] = kt_rand_bf16();
  int64_t kind = 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c0 = 0; c0 < k; c0 += 16, kind++) {
      const int64_t c1 = c0 + 16 < k ? c0 + 16 : k;
      for (int64_t c = c0; c < c1; c++) {
        uint16_t *v = &x[r * k + c];
        const uint16_t sign = (uint16_t)((kt_rand() & 1) << 15);
        switch (kind % 10) {
        case 0: /* zeros of both signs */
          *v = sign;
          break;
        case 1: /* subnormals */
          *v = sign | (uint16_t)(kt_rand() & 0x7f);
          break;
        case 2: /* tiny normals */
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
      const int64_t at = r * k + kt_rand_range(c0, c1 - 1);
      switch (kind % 10) {
      case 3:
        x[at] = 0x7f7f; /* the largest finite BF16 */
        break;
      case 4:
        x[at] = (kt_rand() & 1) ? 0xff80 : 0x7f80;
        break;
      case 7:
        x[at] = (kt_rand() & 1) ? 0x7fc1 : 0xffc0;
        break;
      default:
        break;
      }
    }
}

#endif /* REFIT_TESTS_NVFP4_SCENARIO_H */
