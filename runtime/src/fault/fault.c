/*
 * The fault seam's settings (test builds only): REFIT_FAULT, parsed against
 * the rows of refit.fault in the config table: the same keys, choices,
 * bounds and defaults as the config file, so that the environment cannot
 * arm a fault the config would refuse (a rank that is no rank, a fraction
 * of 7, a probability of -1).
 */
#include "fault/fault.h"

#include "config/config_table.h"
#include "core/env.h"
#include "core/error.h"
#include "core/log.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The keys of REFIT_FAULT, in refit_fault_t's order of fields. */
enum { KEY_PHASE, KEY_RANK, KEY_ACTION, KEY_AT, KEY_REFIT, KEY_PROBABILITY, NKEYS };
static const char *const refit_fault_keys[NKEYS] = {"phase", "rank",  "action",
                                                    "at",    "refit", "probability"};

/* The config table's row of refit.fault's `key`. */
static const refit_config_row_t *refit_fault_row(const char *key) {
  const int i = refit_config_table_find(&refit_config_table, "refit.fault", key);
  return i < 0 ? NULL : &refit_config_rows[i];
}

/* Problems, "; "-separated, for one message. */
typedef struct {
  char text[1024];
  size_t len;
  int count;
} refit_fault_problems_t;

static void refit_fault_problem(refit_fault_problems_t *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void refit_fault_problem(refit_fault_problems_t *p, const char *fmt, ...) {
  if (p->len + 3 < sizeof(p->text)) {
    if (p->count > 0) {
      memcpy(p->text + p->len, "; ", 3);
      p->len += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(p->text + p->len, sizeof(p->text) - p->len, fmt, ap);
    va_end(ap);
    if (n > 0)
      p->len +=
          (size_t)n < sizeof(p->text) - p->len ? (size_t)n : sizeof(p->text) - p->len - 1;
  }
  p->count++;
}

/* `value` (NUL-terminated) as `row` types it: the index of an ENUM choice,
 * or an INT or DOUBLE within the row's bounds. 0 on success. */
static int refit_fault_value(const refit_config_row_t *row, const char *value,
                             double *out, refit_fault_problems_t *p) {
  const char *key = row->key;
  const double min = (double)row->min, max = (double)row->max;
  if (row->type == REFIT_CONFIG_TYPE_ENUM) {
    const int index = refit_config_choice_index(row->choices, value);
    if (index >= 0) {
      *out = index;
      return 0;
    }
    refit_fault_problem(p, "%s: '%s' is not one of %s", key, value, row->choices);
    return -1;
  }
  char *end = NULL;
  errno = 0;
  if (row->type == REFIT_CONFIG_TYPE_INT) {
    const long long v = strtoll(value, &end, 10);
    if (value[0] == '\0' || *end != '\0' || errno != 0 || (double)v < min ||
        (double)v > max) {
      refit_fault_problem(p, "%s: '%s' is not an integer in [%.0f, %.0f]", key, value,
                          min, max);
      return -1;
    }
    *out = (double)v;
    return 0;
  }
  /* DOUBLE: > min (>= with MIN_INCLUSIVE), <= max when max > min. */
  const int inclusive = (row->flags & REFIT_CONFIG_MIN_INCLUSIVE) != 0;
  const double v = strtod(value, &end);
  if (value[0] == '\0' || *end != '\0' || errno != 0 || !isfinite(v) ||
      (inclusive ? v < min : v <= min) || (max > min && v > max)) {
    refit_fault_problem(p, "%s: '%s' is not a number in %s%g, %g]", key, value,
                        inclusive ? "[" : "(", min, max);
    return -1;
  }
  *out = v;
  return 0;
}

refit_status_t refit_fault_parse(const char *text, int world_size, int precision,
                                 refit_fault_t *out) {
  refit_fault_problems_t p = {.len = 0, .count = 0};
  double value[NKEYS] = {0};
  int given[NKEYS] = {0};
  char buf[512];

  if (text == NULL)
    text = "";
  if (strlen(text) >= sizeof(buf))
    return REFIT_ERR(REFIT_ERR_CONFIG,
                     "REFIT_FAULT: %zu bytes, more than the %zu a fault needs",
                     strlen(text), sizeof(buf) - 1);
  memcpy(buf, text, strlen(text) + 1);
  /* Pairs split at commas by hand: strtok would merge empty fields. */
  for (char *kv = buf; kv != NULL;) {
    char *comma = strchr(kv, ',');
    if (comma != NULL)
      *comma = '\0';
    char *eq = strchr(kv, '=');
    int k = -1;
    if (eq == NULL) {
      refit_fault_problem(&p, "'%s' is not key=value", kv);
    } else {
      *eq++ = '\0';
      const char *key = strcmp(kv, "p") == 0 ? "probability" : kv;
      for (int i = 0; i < NKEYS; i++)
        if (strcmp(key, refit_fault_keys[i]) == 0)
          k = i;
      if (k < 0)
        refit_fault_problem(&p,
                            "unknown key '%s' (keys: phase, rank, action, at, refit, "
                            "p or probability)",
                            kv);
      else if (given[k])
        refit_fault_problem(&p, "%s given twice", refit_fault_keys[k]);
      else if (refit_fault_value(refit_fault_row(key), eq, &value[k], &p) == 0)
        given[k] = 1;
      else
        given[k] = -1; /* given, but refused: not also "required" */
    }
    kv = comma != NULL ? comma + 1 : NULL;
  }
  for (int k = 0; k < NKEYS; k++) {
    const refit_config_row_t *row = refit_fault_row(refit_fault_keys[k]);
    if (given[k] != 0)
      continue;
    if (row->flags & REFIT_CONFIG_REQUIRED) {
      if (row->type == REFIT_CONFIG_TYPE_ENUM)
        refit_fault_problem(&p, "%s is required (one of %s)", row->key, row->choices);
      else
        refit_fault_problem(&p, "%s is required", row->key);
    } else {
      /* Table defaults are valid values of their rows (test_config). */
      refit_fault_value(row, row->default_text, &value[k], &p);
    }
  }
  if (given[KEY_RANK] == 1 && !refit_fault_rank_exists((int)value[KEY_RANK], world_size))
    refit_fault_problem(
        &p, "rank: %.0f is not a rank of this job (world size %d, ranks 0..%d)",
        value[KEY_RANK], world_size, world_size - 1);
  if (given[KEY_PHASE] == 1 && precision >= 0 &&
      !refit_fault_phase_runs((int)value[KEY_PHASE], precision))
    refit_fault_problem(&p, (int)value[KEY_PHASE] == REFIT_FAULT_PHASE_AMAX
                                ? "phase: a refit without refit.precision nvfp4 has no "
                                  "amax exchange, so the fault would never fire"
                                : "phase: a bf16 refit has no quantize phase, so the "
                                  "fault would never fire");
  if (p.count > 0)
    return REFIT_ERR(REFIT_ERR_CONFIG, "REFIT_FAULT: %s", p.text);
  out->enabled = 1;
  out->phase = (int)value[KEY_PHASE];
  out->rank = (int)value[KEY_RANK];
  out->action = (int)value[KEY_ACTION];
  out->at = value[KEY_AT];
  out->refit = (int)value[KEY_REFIT];
  out->probability = value[KEY_PROBABILITY];
  return REFIT_OK;
}

refit_status_t refit_fault_select(const refit_config_t *cfg, int world_size,
                                  const char *env_fault, const char *env_enable,
                                  refit_fault_t *out, int *ignored) {
  const int configured = cfg->refit.fault.enabled;
  refit_fault_t f = {
      .enabled = configured,
      .phase = cfg->refit.fault.phase,
      .rank = cfg->refit.fault.rank,
      .action = cfg->refit.fault.action,
      .at = cfg->refit.fault.at,
      .refit = cfg->refit.fault.refit,
      .probability = cfg->refit.fault.probability,
  };
  const int given = env_fault != NULL && env_fault[0] != '\0';
  const int on = configured || (env_enable != NULL && strcmp(env_enable, "1") == 0);
  if (ignored != NULL)
    *ignored = given && !on;
  if (given && on) {
    refit_status_t st =
        refit_fault_parse(env_fault, world_size, (int)cfg->refit.precision, &f);
    if (st != REFIT_OK)
      return st;
  }
  *out = f;
  return REFIT_OK;
}

refit_status_t refit_fault_from_env(const refit_config_t *cfg, int world_size,
                                    refit_fault_t *out) {
  int ignored = 0, set = 0;
  const char *spec = NULL;
  int64_t enable = 0;
  REFIT_CHECK(refit_env_text("REFIT_FAULT", &spec, &set));
  REFIT_CHECK(refit_env_int("REFIT_ENABLE_FAULTS", &enable, &set));
  refit_status_t st = refit_fault_select(cfg, world_size, spec, enable ? "1" : NULL, out,
                                         &ignored);
  static int warned;
  if (st == REFIT_OK && ignored && !warned) {
    warned = 1;
    REFIT_WARN("REFIT_FAULT is set but ignored: the fault seam is off (set "
               "REFIT_ENABLE_FAULTS=1, or give refit.fault in the config)");
  }
  return st;
}
