/*
 * libFuzzer: the input is a config.json. Whatever the bytes, the reader
 * returns a shape or a list of problems: no crash, no leak, and an accepted
 * shape has every dimension it needs positive.
 */
#include "config/hf_config.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  refit_hf_config_t hf;
  char *errors = NULL;
  if (refit_hf_config_parse((const char *)data, size, "config.json", &hf, &errors) ==
      REFIT_OK) {
    const refit_model_t *m = &hf.model;
    if (m->hidden_size < 1 || m->num_layers < 1 || m->num_attention_heads < 1 ||
        m->num_kv_heads < 1 || m->head_dim < 1 || m->vocab_size < 1 ||
        (m->family == REFIT_FAMILY_QWEN3 && m->intermediate_size < 1) ||
        (m->family == REFIT_FAMILY_QWEN3_MOE &&
         (m->num_experts < 1 || m->moe_intermediate_size < 1)))
      abort();
  } else if (errors == NULL) {
    abort(); /* a failure always says why */
  }
  free(errors);
  return 0;
}
