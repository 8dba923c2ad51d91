#include "source/synth.h"

#include "core/hash.h"

#include <string.h>

/* Arbitrary, odd: keeps the master's key apart from every version's key. */
#define REFIT_SYNTH_MASTER_SALT 0x6d617374657221c5ull

void refit_synth_init(refit_synth_key_t *k, uint64_t seed, double rate, uint64_t version,
                      const refit_src_tensor_t *tensor) {
  uint64_t h = refit_hash_bytes(REFIT_HASH_INIT, tensor->name, strlen(tensor->name));
  k->key = refit_synth_mix(refit_synth_mix(seed) ^ refit_synth_mix(version + h));
  k->master = refit_synth_mix(refit_synth_mix(seed) ^ refit_synth_mix(h) ^
                              REFIT_SYNTH_MASTER_SALT);
  k->rate = (float)rate;
  k->norm = tensor->role == REFIT_ROLE_NORM;
}
