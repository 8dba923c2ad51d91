#include "synth.h"

#include "core/hash.h"

#include <string.h>

void refit_synth_init(refit_synth_t *s, uint64_t seed, uint64_t version,
                      const refit_src_tensor_t *tensor) {
  uint64_t h = refit_hash_bytes(REFIT_HASH_INIT, tensor->name, strlen(tensor->name));
  s->key = refit_synth_mix(refit_synth_mix(seed) ^ refit_synth_mix(version + h));
  s->norm = tensor->role == REFIT_ROLE_NORM;
}

void refit_synth_fill(const refit_synth_t *s, const refit_src_tensor_t *tensor,
                      int64_t row0, int64_t col0, int64_t rows, int64_t cols,
                      uint16_t *dst) {
  for (int64_t r = 0; r < rows; r++) {
    const int64_t base = (row0 + r) * tensor->cols + col0;
    uint16_t *out = dst + r * cols;
    for (int64_t c = 0; c < cols; c++)
      out[c] = refit_synth_bf16(s, base + c);
  }
}
