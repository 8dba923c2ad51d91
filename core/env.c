/*
 * Environment variables, read through one table (contract in core/env.h).
 */
#include "core/env.h"

#include "core/error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define REFIT_ENV_ROW(name_, kind_, lo_, hi_, choices_, reader_, precedence_)                \
  {name_, kind_, lo_, hi_, choices_, reader_, precedence_},
static const refit_env_var_t refit_env_table[] = {REFIT_ENV_TABLE(REFIT_ENV_ROW)};
#undef REFIT_ENV_ROW

const refit_env_var_t *refit_env_vars(int *n) {
  *n = (int)(sizeof(refit_env_table) / sizeof(refit_env_table[0]));
  return refit_env_table;
}

static const refit_env_var_t *refit_env_row(const char *name, refit_env_kind_t kind) {
  for (size_t i = 0; i < sizeof(refit_env_table) / sizeof(refit_env_table[0]); i++)
    if (strcmp(refit_env_table[i].name, name) == 0)
      return refit_env_table[i].kind == kind ? &refit_env_table[i] : NULL;
  return NULL;
}

/* The row of `name` of that kind and its value, or an error; *text NULL when
 * unset or empty. */
static refit_status_t refit_env_get(const char *name, refit_env_kind_t kind,
                                    const refit_env_var_t **row, const char **text) {
  *row = name != NULL ? refit_env_row(name, kind) : NULL;
  if (*row == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "environment variable %s is not in core/env.h's table as kind %d",
                     name != NULL ? name : "(null)", (int)kind);
  const char *v = getenv(name);
  *text = v != NULL && v[0] != '\0' ? v : NULL;
  return REFIT_OK;
}

refit_status_t refit_env_int(const char *name, int64_t *out, int *set) {
  const refit_env_var_t *row;
  const char *v;
  *set = 0;
  REFIT_CHECK(refit_env_get(name, REFIT_ENV_INT, &row, &v));
  if (v == NULL)
    return REFIT_OK;
  char *end = NULL;
  errno = 0;
  const long long x = strtoll(v, &end, 10);
  if (end == v || *end != '\0' || errno != 0 || x < (long long)row->lo ||
      x > (long long)row->hi)
    return REFIT_ERR(REFIT_ERR_CONFIG,
                     "environment variable %s='%.64s': not an integer from %.0f to %.0f "
                     "(%s; unset it for the default)",
                     name, v, row->lo, row->hi, row->precedence);
  *out = x;
  *set = 1;
  return REFIT_OK;
}

refit_status_t refit_env_parse_seconds(const char *name, const char *text, double *out) {
  const refit_env_var_t *row = name != NULL ? refit_env_row(name, REFIT_ENV_SECONDS) : NULL;
  if (row == NULL || text == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "environment variable %s is not in core/env.h's table as seconds",
                     name != NULL ? name : "(null)");
  char *end = NULL;
  errno = 0;
  const double x = strtod(text, &end);
  /* x > lo and x <= hi: false for NaN too; strtod reads "inf" as well. */
  if (end == text || *end != '\0' || errno != 0 || !(x > row->lo) || !(x <= row->hi))
    return REFIT_ERR(REFIT_ERR_CONFIG,
                     "environment variable %s='%.64s': not a number of seconds above %.0f "
                     "and at most %.0f (%s; unset it for the default)",
                     name, text, row->lo, row->hi, row->precedence);
  *out = x;
  return REFIT_OK;
}

refit_status_t refit_env_seconds(const char *name, double *out, int *set) {
  const refit_env_var_t *row;
  const char *v;
  *set = 0;
  REFIT_CHECK(refit_env_get(name, REFIT_ENV_SECONDS, &row, &v));
  if (v == NULL)
    return REFIT_OK;
  REFIT_CHECK(refit_env_parse_seconds(name, v, out));
  *set = 1;
  return REFIT_OK;
}

refit_status_t refit_env_choice(const char *name, int *out, int *set) {
  const refit_env_var_t *row;
  const char *v;
  *set = 0;
  REFIT_CHECK(refit_env_get(name, REFIT_ENV_CHOICE, &row, &v));
  if (v == NULL)
    return REFIT_OK;
  const char *c = row->choices;
  for (int i = 0; c != NULL && *c != '\0'; i++) {
    const char *bar = strchr(c, '|');
    const size_t len = bar != NULL ? (size_t)(bar - c) : strlen(c);
    if (strlen(v) == len && strncasecmp(v, c, len) == 0) {
      *out = i;
      *set = 1;
      return REFIT_OK;
    }
    c = bar != NULL ? bar + 1 : c + len;
  }
  return REFIT_ERR(REFIT_ERR_CONFIG,
                   "environment variable %s='%.64s': not one of %s (%s; unset it for the "
                   "default)",
                   name, v, row->choices, row->precedence);
}

refit_status_t refit_env_text(const char *name, const char **out, int *set) {
  const refit_env_var_t *row;
  const char *v;
  *set = 0;
  REFIT_CHECK(refit_env_get(name, REFIT_ENV_TEXT, &row, &v));
  if (v == NULL)
    return REFIT_OK;
  *out = v;
  *set = 1;
  return REFIT_OK;
}
