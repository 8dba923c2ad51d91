/*
 * A production build's side of the fault seam (CMake REFIT_TESTS off): there
 * is none. The config refuses refit.fault (config_rules.c); REFIT_FAULT is
 * ignored, with one warning that says how to get a build that has the seam.
 */
#include "fault/fault.h"

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"

#include <string.h>

refit_status_t refit_fault_from_env(const refit_config_t *cfg, int world_size,
                                    refit_fault_t *out) {
  (void)cfg, (void)world_size; /* refit.fault: refused by the config's rules */
  const char *spec = NULL;
  int set = 0;
  REFIT_CHECK(refit_env_text("REFIT_FAULT", &spec, &set));
  static int warned;
  if (set && spec != NULL && spec[0] != '\0' && !warned) {
    warned = 1;
    REFIT_WARN("REFIT_FAULT is set but ignored: " REFIT_NO_FAULT_SEAM);
  }
  memset(out, 0, sizeof(*out));
  return REFIT_OK;
}
