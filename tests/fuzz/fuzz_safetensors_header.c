/*
 * libFuzzer: the input is a whole safetensors file. The header length and
 * the header are checked as the safetensors source checks them
 * (safetensors.h); whatever the bytes, no crash, no leak, and an accepted
 * header describes tensors that lie inside the data and cover it exactly.
 */
#include "source/safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FILE *problems = fopen("/dev/null", "w");
  if (problems == NULL)
    return 0;
  uint64_t n = 0;
  if (refit_st_header_length("fuzz", data, size, size, &n, problems) == 0) {
    refit_st_header_t h;
    const uint64_t data_len = size - 8 - n;
    if (refit_st_header_parse("fuzz", (const char *)data + 8, n, data_len, &h,
                              problems) == 0) {
      uint64_t covered = 0;
      for (int64_t i = 0; i < h.n; i++) {
        if (h.t[i].end > data_len || h.t[i].begin > h.t[i].end)
          abort();
        covered += h.t[i].end - h.t[i].begin;
        if (refit_st_header_find(&h, h.t[i].name) != &h.t[i])
          abort();
      }
      if (covered != data_len)
        abort();
      refit_st_header_free(&h);
    }
  }
  fclose(problems);
  return 0;
}
