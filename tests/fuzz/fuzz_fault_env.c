/*
 * libFuzzer: the input is a REFIT_FAULT value. The parser arms a fault
 * within refit.fault's bounds or refuses with a message, never touching
 * its output on failure; no crash, no undefined behaviour.
 */
#include "core/error.h"
#include "fault/fault.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (text == NULL)
    return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  const refit_fault_t before = {-1, -1, -1, -1, -1.0, -1, -1.0};
  refit_fault_t f = before;
  /* The last input byte picks the world size: 0 (unchecked) to 7. */
  const int world = size > 0 ? data[size - 1] % 8 : 0;
  if (refit_fault_parse(text, world, size % 2 ? REFIT_PRECISION_MXFP8 : -1, &f) ==
      REFIT_OK) {
    if (f.enabled != 1 || f.phase < 0 || f.action < 0 || f.rank < 0 ||
        (world > 0 && f.rank >= world) || !(f.at >= 0 && f.at <= 1) ||
        !(f.probability > 0 && f.probability <= 1) || f.refit < 0)
      abort();
  } else if (memcmp(&f, &before, sizeof(f)) != 0 ||
             strncmp(refit_last_error(), "REFIT_FAULT: ", 13) != 0) {
    abort();
  }
  free(text);
  return 0;
}
