/*
 * The block FP8 C reference as a command, for the independent statement in
 * tests/reference/test_fp8_block_kernel.py:
 *
 *   fp8_block_tool fp32|pow2 ROWS K IN Q SCALE_INV
 *   fp8_block_tool scales fp32|pow2 OUT
 *
 * IN holds ROWS * K little-endian BF16 bit patterns, row-major; Q gets the
 * E4M3 bytes [ROWS, K] and SCALE_INV the little-endian FP32 scales
 * [ceil(ROWS/128), ceil(K/128)]. `scales` writes, for every amax key
 * 0x0000 .. 0x7FFF (BF16 bits, sign clear), the FP32 scale and scale_inv of
 * refit_fp8_block_scale as two little-endian words. Exit status 0 on success, 1 with a
 * message on stderr otherwise.
 */
#include "kernels/fp8_block.h"

#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tool_io(const char *path, const char *how, void *buf, size_t n) {
  FILE *f = fopen(path, how);
  if (f == NULL) {
    fprintf(stderr, "fp8_block_tool: cannot open %s\n", path);
    return 1;
  }
  const size_t done = how[0] == 'r' ? fread(buf, 1, n, f) : fwrite(buf, 1, n, f);
  const int bad = fclose(f) != 0 || done != n;
  if (bad)
    fprintf(stderr, "fp8_block_tool: %s %zu bytes of %s failed (%zu done)\n",
            how[0] == 'r' ? "reading" : "writing", n, path, done);
  return bad;
}

static int tool_scales(const char *mode, const char *path) {
  static uint32_t out[0x8000][2];
  const refit_fp8_scale_t m =
      strcmp(mode, "pow2") == 0 ? REFIT_FP8_SCALE_POW2 : REFIT_FP8_SCALE_FP32;
  for (uint32_t key = 0; key < 0x8000; key++) {
    float scale, inv;
    refit_fp8_block_scale((uint16_t)key, m, &scale, &inv);
    memcpy(&out[key][0], &scale, 4);
    memcpy(&out[key][1], &inv, 4);
  }
  return tool_io(path, "wb", out, sizeof(out));
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "scales") == 0)
    return tool_scales(argv[2], argv[3]);
  if (argc != 7 || (strcmp(argv[1], "fp32") != 0 && strcmp(argv[1], "pow2") != 0)) {
    fprintf(
        stderr,
        "usage: fp8_block_tool fp32|pow2 ROWS K IN Q SCALE_INV | scales fp32|pow2 OUT\n");
    return 1;
  }
  const refit_fp8_scale_t mode =
      strcmp(argv[1], "pow2") == 0 ? REFIT_FP8_SCALE_POW2 : REFIT_FP8_SCALE_FP32;
  const int64_t rows = strtoll(argv[2], NULL, 10), k = strtoll(argv[3], NULL, 10);
  if (rows <= 0 || k <= 0) {
    fprintf(stderr, "fp8_block_tool: shape [%lld, %lld] must be positive\n",
            (long long)rows, (long long)k);
    return 1;
  }
  const int64_t nbr = refit_fp8_block_count(rows), nbc = refit_fp8_block_count(k);
  uint16_t *src = malloc((size_t)(rows * k) * 2);
  uint8_t *q = malloc((size_t)(rows * k));
  float *scale = malloc((size_t)(nbr * nbc) * sizeof(float));
  int rc = 1;
  if (src == NULL || q == NULL || scale == NULL) {
    fprintf(stderr, "fp8_block_tool: out of memory for [%lld, %lld]\n", (long long)rows,
            (long long)k);
    goto out;
  }
  if (tool_io(argv[4], "rb", src, (size_t)(rows * k) * 2))
    goto out;
  if (refit_fp8_block_quantize(src, rows, k, k, mode, q, k, scale, nbc) != REFIT_OK) {
    fprintf(stderr, "fp8_block_tool: %s\n", refit_last_error());
    goto out;
  }
  rc = tool_io(argv[5], "wb", q, (size_t)(rows * k)) ||
       tool_io(argv[6], "wb", scale, (size_t)(nbr * nbc) * sizeof(float));
out:
  free(src);
  free(q);
  free(scale);
  return rc;
}
