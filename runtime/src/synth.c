#include "synth.h"

#include "core/hash.h"

#include <string.h>

void refit_synth_init(refit_synth_t *s, uint64_t seed, uint64_t version,
                      const refit_src_tensor_t *tensor) {
  uint64_t h = refit_hash_bytes(REFIT_HASH_INIT, tensor->name, strlen(tensor->name));
  s->key = refit_synth_mix(refit_synth_mix(seed) ^ refit_synth_mix(version + h));
  s->norm = tensor->role == REFIT_ROLE_NORM;
}
