/*
 * libFuzzer: the input is a refit YAML config. Whatever the bytes, the
 * parser returns a configuration or a list of problems: no crash, no leak,
 * no undefined behaviour, and an accepted configuration formats to YAML that
 * parses back to the same configuration (same hash).
 */
#include "config/config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  refit_config_t cfg, again;
  char *errors = NULL, *text = NULL;
  refit_status_t st =
      refit_config_parse((const char *)data, size, "fuzz.yaml", 0, &cfg, &errors);
  if (st != REFIT_OK) {
    if (errors == NULL || errors[0] == '\0')
      abort(); /* a failure always says why */
    free(errors);
    return 0;
  }
  if (errors != NULL)
    abort();
  if (refit_config_format(&cfg, &text) != REFIT_OK)
    abort();
  if (refit_config_parse(text, strlen(text), "formatted.yaml", 0, &again, &errors) !=
          REFIT_OK ||
      refit_config_hash(&again) != refit_config_hash(&cfg))
    abort(); /* the effective config must read back as itself */
  free(text);
  free(errors);
  return 0;
}
