/*
 * The NVFP4 C reference as a command, for the independent statement in
 * tests/reference/test_nvfp4_kernel.py:
 *
 *   nvfp4_tool ROWS K IN Q SF GLOBAL [GSF]
 *   nvfp4_tool globals OUT
 *
 * IN holds ROWS * K little-endian BF16 bit patterns, row-major. Without GSF
 * the global scale is the one of IN's own amax (refit_nvfp4_amax_key, then
 * refit_nvfp4_global_scale); GSF (the FP32 bits in hex) sets it instead, as
 * for a shard quantized with the global scale of its whole tensor. Q gets
 * the packed E2M1 bytes [ROWS, ceil(K/2)], SF the E4M3 scales
 * [ROWS, ceil(K/16)] (linear layout), GLOBAL three little-endian words: the
 * amax key of IN, the global scale used and its weight_scale_2
 * (refit_nvfp4_global_decode). `globals` writes, for every amax key
 * 0x0000 .. 0x7FFF, the global scale and weight_scale_2 as two little-endian
 * words. Exit status 0 on success, 1 with a message
 * on stderr otherwise.
 */
#include "kernels/nvfp4.h"

#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tool_io(const char *path, const char *how, void *buf, size_t n) {
  FILE *f = fopen(path, how);
  if (f == NULL) {
    fprintf(stderr, "nvfp4_tool: cannot open %s\n", path);
    return 1;
  }
  const size_t done = how[0] == 'r' ? fread(buf, 1, n, f) : fwrite(buf, 1, n, f);
  const int bad = fclose(f) != 0 || done != n;
  if (bad)
    fprintf(stderr, "nvfp4_tool: %s %zu bytes of %s failed (%zu done)\n",
            how[0] == 'r' ? "reading" : "writing", n, path, done);
  return bad;
}

static int tool_globals(const char *path) {
  static uint32_t out[0x8000][2];
  for (uint32_t key = 0; key < 0x8000; key++) {
    const float gsf = refit_nvfp4_global_scale((uint16_t)key);
    const float decode = refit_nvfp4_global_decode(gsf);
    memcpy(&out[key][0], &gsf, 4);
    memcpy(&out[key][1], &decode, 4);
  }
  return tool_io(path, "wb", out, sizeof(out));
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "globals") == 0)
    return tool_globals(argv[2]);
  if (argc != 7 && argc != 8) {
    fprintf(stderr,
            "usage: nvfp4_tool ROWS K IN Q SF GLOBAL [GSF_HEX_BITS] | globals OUT\n");
    return 1;
  }
  const int64_t rows = strtoll(argv[1], NULL, 10), k = strtoll(argv[2], NULL, 10);
  if (rows <= 0 || k <= 0) {
    fprintf(stderr, "nvfp4_tool: shape [%lld, %lld] must be positive\n", (long long)rows,
            (long long)k);
    return 1;
  }
  const int64_t qb = refit_nvfp4_row_bytes(k), nb = refit_nvfp4_scale_cols(k);
  uint16_t *src = malloc((size_t)(rows * k) * 2);
  uint8_t *q = malloc((size_t)(rows * qb));
  uint8_t *sf = malloc((size_t)(rows * nb));
  int rc = 1;
  if (src == NULL || q == NULL || sf == NULL) {
    fprintf(stderr, "nvfp4_tool: out of memory for [%lld, %lld]\n", (long long)rows,
            (long long)k);
    goto out;
  }
  if (tool_io(argv[3], "rb", src, (size_t)(rows * k) * 2))
    goto out;
  refit_status_t st;
  const uint16_t key = refit_nvfp4_amax_key(src, rows, k, k, &st);
  float gsf = refit_nvfp4_global_scale(key);
  if (argc == 8) {
    const uint32_t bits = (uint32_t)strtoul(argv[7], NULL, 16);
    memcpy(&gsf, &bits, 4);
  }
  if (st != REFIT_OK ||
      refit_nvfp4_quantize(src, rows, k, k, gsf, q, qb, sf, nb) != REFIT_OK) {
    fprintf(stderr, "nvfp4_tool: %s\n", refit_last_error());
    goto out;
  }
  const float decode = refit_nvfp4_global_decode(gsf);
  uint32_t global[3] = {key, 0, 0};
  memcpy(&global[1], &gsf, 4);
  memcpy(&global[2], &decode, 4);
  rc = tool_io(argv[4], "wb", q, (size_t)(rows * qb)) ||
       tool_io(argv[5], "wb", sf, (size_t)(rows * nb)) ||
       tool_io(argv[6], "wb", global, sizeof(global));
out:
  free(src);
  free(q);
  free(sf);
  return rc;
}
