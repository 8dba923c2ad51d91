/*
 * One value of a configuration table (config_parse.h): parse it as its row
 * types it, say what the row accepts, write it back as YAML; and the
 * operations on a whole table that need no file: defaults, hash, format.
 * Nothing here knows a key of refit's own table.
 */
#include "config/config_parse.h"

#include "core/hash.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ------------------------------------------------------------------------ */
/* Sizes with units                                                          */
/* ------------------------------------------------------------------------ */

static const struct {
  const char *name;
  uint64_t scale;
} refit_config_units[] = {
    {"B", 1},
    {"KB", UINT64_C(1000)},
    {"MB", UINT64_C(1000000)},
    {"GB", UINT64_C(1000000000)},
    {"TB", UINT64_C(1000000000000)},
    {"KiB", UINT64_C(1) << 10},
    {"MiB", UINT64_C(1) << 20},
    {"GiB", UINT64_C(1) << 30},
    {"TiB", UINT64_C(1) << 40},
};

#define REFIT_CONFIG_NUNITS (sizeof(refit_config_units) / sizeof(refit_config_units[0]))

/* Parse without touching the thread's last error; `why` explains a failure. */
int refit_config_bytes_parse(const char *text, uint64_t *bytes, char *why,
                             size_t why_len) {
  const char *p = text;
  uint64_t value = 0;
  if (!isdigit((unsigned char)*p)) {
    snprintf(why, why_len, "a size starts with a decimal number");
    return -1;
  }
  for (; isdigit((unsigned char)*p); p++) {
    unsigned digit = (unsigned)(*p - '0');
    if (value > (UINT64_MAX - digit) / 10) {
      snprintf(why, why_len, "the number does not fit in 64 bits");
      return -1;
    }
    value = value * 10 + digit;
  }
  if (*p == '.') {
    snprintf(why, why_len, "fractions are not allowed; use a smaller unit");
    return -1;
  }
  while (*p == ' ')
    p++;
  uint64_t scale = 1;
  if (*p != '\0') {
    size_t i;
    for (i = 0; i < REFIT_CONFIG_NUNITS; i++)
      if (strcasecmp(p, refit_config_units[i].name) == 0)
        break;
    if (i == REFIT_CONFIG_NUNITS) {
      snprintf(why, why_len,
               "unknown unit '%.16s'; use B, KB, MB, GB, TB, KiB, MiB, GiB "
               "or TiB",
               p);
      return -1;
    }
    scale = refit_config_units[i].scale;
  }
  if (value != 0 && value > UINT64_MAX / scale) {
    snprintf(why, why_len, "the size does not fit in 64 bits");
    return -1;
  }
  *bytes = value * scale;
  return 0;
}

/* The shortest exact spelling: "256MiB", "1MB", "4097". */
static void refit_config_bytes_format(uint64_t bytes, char *buf, size_t n) {
  for (size_t i = REFIT_CONFIG_NUNITS; i-- > 1;) {
    uint64_t scale = refit_config_units[i].scale;
    if (bytes != 0 && bytes % scale == 0 && (scale & (scale - 1)) == 0) {
      snprintf(buf, n, "%" PRIu64 "%s", bytes / scale, refit_config_units[i].name);
      return;
    }
  }
  snprintf(buf, n, "%" PRIu64, bytes);
}

/* ------------------------------------------------------------------------ */
/* Suggestions for unknown keys and values                                   */
/* ------------------------------------------------------------------------ */

/* Case-insensitive Levenshtein distance; SIZE_MAX for very long names. */
static size_t refit_config_distance(const char *a, const char *b) {
  enum { MAXLEN = 63 };
  size_t la = strlen(a), lb = strlen(b);
  size_t prev[MAXLEN + 1], cur[MAXLEN + 1];
  if (la > MAXLEN || lb > MAXLEN)
    return SIZE_MAX;
  for (size_t j = 0; j <= lb; j++)
    prev[j] = j;
  for (size_t i = 1; i <= la; i++) {
    cur[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
      size_t best = prev[j - 1] + cost;
      if (prev[j] + 1 < best)
        best = prev[j] + 1;
      if (cur[j - 1] + 1 < best)
        best = cur[j - 1] + 1;
      cur[j] = best;
    }
    memcpy(prev, cur, (lb + 1) * sizeof(size_t));
  }
  return prev[lb];
}

/* The closest candidate, if close enough to be a plausible typo. */
const char *refit_config_suggest(const char *name, const char *const *cands, size_t n) {
  const char *best = NULL;
  size_t best_d = SIZE_MAX;
  for (size_t i = 0; i < n; i++) {
    size_t d = refit_config_distance(name, cands[i]);
    size_t limit = strlen(cands[i]) / 3 > 2 ? strlen(cands[i]) / 3 : 2;
    if (d <= limit && d < best_d) {
      best = cands[i];
      best_d = d;
    }
  }
  return best;
}

/* ------------------------------------------------------------------------ */
/* One value: parse, describe, format                                        */
/* ------------------------------------------------------------------------ */

static void refit_config_store_int(void *p, size_t size, int64_t v) {
  if (size == sizeof(int32_t)) {
    int32_t x = (int32_t)v;
    memcpy(p, &x, sizeof(x));
  } else {
    memcpy(p, &v, sizeof(v));
  }
}

static int64_t refit_config_load_int(const void *p, size_t size) {
  if (size == sizeof(int32_t)) {
    int32_t x;
    memcpy(&x, p, sizeof(x));
    return x;
  }
  int64_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}

bool refit_config_is_null(const char *text) {
  return text[0] == '\0' || strcmp(text, "~") == 0 || strcmp(text, "null") == 0 ||
         strcmp(text, "Null") == 0 || strcmp(text, "NULL") == 0;
}

/* Index of `text` in a "a|b|c" choice list, or -1. */
int refit_config_choice_index(const char *choices, const char *text) {
  size_t len = strlen(text);
  int index = 0;
  for (const char *p = choices; *p; index++) {
    const char *end = strchr(p, '|');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == len && strncmp(p, text, n) == 0)
      return index;
    p += n + (end != NULL);
  }
  return -1;
}

/* The n-th name of a choice list into buf ("" when out of range). */
void refit_config_choice_name(const char *choices, int64_t index, char *buf, size_t n) {
  const char *p = choices;
  for (int64_t i = 0; i < index && p; i++) {
    p = strchr(p, '|');
    if (p)
      p++;
  }
  if (p == NULL) {
    snprintf(buf, n, "%s", "");
    return;
  }
  const char *end = strchr(p, '|');
  int len = end ? (int)(end - p) : (int)strlen(p);
  snprintf(buf, n, "%.*s", len, p);
}

/* The closest choice to a bad enum value, as " (did you mean 'x'?)" in why. */
static void refit_config_choice_suggest(const char *choices, const char *text, char *why,
                                        size_t why_len) {
  enum { MAX_CHOICES = 16 };
  char names[256];
  const char *cands[MAX_CHOICES];
  size_t n = 0;
  snprintf(names, sizeof(names), "%s", choices);
  for (char *p = names; p && *p && n < MAX_CHOICES;) {
    cands[n++] = p;
    p = strchr(p, '|');
    if (p)
      *p++ = '\0';
  }
  const char *close = refit_config_suggest(text, cands, n);
  if (close)
    snprintf(why, why_len, "did you mean '%s'?", close);
}

/* ---- Lists of strings --------------------------------------------------- */

int refit_config_list_count(const refit_config_row_t *r, const void *target) {
  int n;
  memcpy(&n, (const char *)target + r->count_offset, sizeof(n));
  return n;
}

const char *refit_config_list_item(const refit_config_row_t *r, const void *target,
                                   int i) {
  return (const char *)target + r->offset + (size_t)i * r->item_size;
}

void refit_config_list_clear(const refit_config_row_t *r, void *target) {
  const int zero = 0;
  memset((char *)target + r->offset, 0, r->size);
  memcpy((char *)target + r->count_offset, &zero, sizeof(zero));
}

/* Append `len` bytes of `text` to list row r; the one place items are
 * checked, for table defaults and files alike. */
refit_config_item_status_t refit_config_list_add(const refit_config_row_t *r,
                                                 void *target, const char *text,
                                                 size_t len, int *first) {
  int n = refit_config_list_count(r, target);
  if (len == 0)
    return REFIT_CONFIG_ITEM_EMPTY;
  if (len >= r->item_size)
    return REFIT_CONFIG_ITEM_TOO_LONG;
  for (int i = 0; i < n; i++) {
    const char *item = refit_config_list_item(r, target, i);
    if (strlen(item) == len && memcmp(item, text, len) == 0) {
      *first = i;
      return REFIT_CONFIG_ITEM_DUPLICATE;
    }
  }
  if ((size_t)n >= r->size / r->item_size)
    return REFIT_CONFIG_ITEM_FULL;
  char *item = (char *)target + r->offset + (size_t)n * r->item_size;
  memcpy(item, text, len);
  item[len] = '\0';
  n++;
  memcpy((char *)target + r->count_offset, &n, sizeof(n));
  return REFIT_CONFIG_ITEM_OK;
}

/*
 * What a plain YAML scalar means when it is not a string (the core schema:
 * null, booleans, numbers), as a phrase; NULL for a string. A list of names
 * takes strings only, so that "[lm_head, 3]" is a mistake, not module "3".
 */
const char *refit_config_plain_kind(const char *text) {
  static const char *const bools[] = {"true", "false", "yes", "no", "on", "off"};
  if (text[0] == '\0' || strcmp(text, "~") == 0 || strcasecmp(text, "null") == 0)
    return "null";
  for (size_t i = 0; i < sizeof(bools) / sizeof(bools[0]); i++)
    if (strcasecmp(text, bools[i]) == 0)
      return "a boolean";
  if (isdigit((unsigned char)text[0]) || text[0] == '-' || text[0] == '+' ||
      text[0] == '.') {
    char *end;
    errno = 0;
    (void)strtod(text, &end);
    if (*end == '\0')
      return "a number";
  }
  return NULL;
}

/* `text` as a YAML double-quoted scalar; returns the bytes written. */
static size_t refit_config_yaml_quote(const char *text, char *buf, size_t n) {
  size_t off = 0;
  if (n < 3)
    return 0;
  buf[off++] = '"';
  for (const char *p = text; *p && off + 6 < n; p++) {
    unsigned char ch = (unsigned char)*p;
    if (ch == '"' || ch == '\\')
      off += (size_t)snprintf(buf + off, n - off, "\\%c", ch);
    else if (ch < 0x20 || ch == 0x7f)
      off += (size_t)snprintf(buf + off, n - off, "\\x%02x", ch);
    else
      buf[off++] = (char)ch;
  }
  buf[off++] = '"';
  buf[off] = '\0';
  return off;
}

void refit_config_quote(const char *text, char *buf, size_t n) {
  size_t off = 0;
  const size_t limit = 60;
  for (const char *p = text; *p && off + 5 < n; p++) {
    if (p - text >= (ptrdiff_t)limit) {
      off += (size_t)snprintf(buf + off, n - off, "...");
      break;
    }
    if (*p == '\n')
      off += (size_t)snprintf(buf + off, n - off, "\\n");
    else
      buf[off++] = *p;
  }
  buf[off] = '\0';
}

refit_config_value_status_t refit_config_value_check_int(const refit_config_row_t *r,
                                                         int64_t v) {
  if (v < r->min)
    return REFIT_CONFIG_VALUE_INVALID;
  if (v > r->max)
    return REFIT_CONFIG_VALUE_TOO_BIG;
  return REFIT_CONFIG_VALUE_OK;
}

refit_config_value_status_t refit_config_value_parse(const refit_config_row_t *r,
                                                     const char *text, bool plain,
                                                     void *target, char *why,
                                                     size_t why_len) {
  char *field = (char *)target + r->offset;
  why[0] = '\0';
  switch (r->type) {
  case REFIT_CONFIG_TYPE_INT: {
    const char *p = text;
    if (*p == '+' || *p == '-')
      p++;
    if (!isdigit((unsigned char)*p))
      return REFIT_CONFIG_VALUE_INVALID;
    for (const char *q = p; *q; q++)
      if (!isdigit((unsigned char)*q))
        return REFIT_CONFIG_VALUE_INVALID;
    errno = 0;
    long long v = strtoll(text, NULL, 10);
    if (errno == ERANGE)
      return v < 0 ? REFIT_CONFIG_VALUE_INVALID : REFIT_CONFIG_VALUE_TOO_BIG;
    const refit_config_value_status_t bound = refit_config_value_check_int(r, v);
    if (bound != REFIT_CONFIG_VALUE_OK)
      return bound;
    refit_config_store_int(field, r->size, v);
    return REFIT_CONFIG_VALUE_OK;
  }
  case REFIT_CONFIG_TYPE_U64: {
    if (!isdigit((unsigned char)text[0]))
      return REFIT_CONFIG_VALUE_INVALID;
    for (const char *q = text; *q; q++)
      if (!isdigit((unsigned char)*q))
        return REFIT_CONFIG_VALUE_INVALID;
    errno = 0;
    unsigned long long v = strtoull(text, NULL, 10);
    if (errno == ERANGE)
      return REFIT_CONFIG_VALUE_TOO_BIG;
    uint64_t u = v;
    memcpy(field, &u, sizeof(u));
    return REFIT_CONFIG_VALUE_OK;
  }
  case REFIT_CONFIG_TYPE_BYTES: {
    uint64_t v;
    if (refit_config_bytes_parse(text, &v, why, why_len) != 0)
      return REFIT_CONFIG_VALUE_INVALID;
    if (v < (uint64_t)r->min)
      return REFIT_CONFIG_VALUE_INVALID;
    if (v > (uint64_t)r->max)
      return REFIT_CONFIG_VALUE_TOO_BIG;
    memcpy(field, &v, sizeof(v));
    return REFIT_CONFIG_VALUE_OK;
  }
  case REFIT_CONFIG_TYPE_DOUBLE: {
    char *end;
    if (text[0] == '\0')
      return REFIT_CONFIG_VALUE_INVALID;
    errno = 0;
    double v = strtod(text, &end);
    if (*end != '\0' || errno == ERANGE || !isfinite(v))
      return REFIT_CONFIG_VALUE_INVALID;
    if ((r->flags & REFIT_CONFIG_MIN_INCLUSIVE) ? v < (double)r->min
                                                : v <= (double)r->min)
      return REFIT_CONFIG_VALUE_INVALID;
    if (r->max > r->min && v > (double)r->max)
      return REFIT_CONFIG_VALUE_TOO_BIG;
    memcpy(field, &v, sizeof(v));
    return REFIT_CONFIG_VALUE_OK;
  }
  case REFIT_CONFIG_TYPE_BOOL: {
    static const char *const yes[] = {"true", "yes", "on"};
    static const char *const no[] = {"false", "no", "off"};
    for (size_t i = 0; i < 3; i++) {
      if (strcasecmp(text, yes[i]) == 0 || strcasecmp(text, no[i]) == 0) {
        int v = strcasecmp(text, yes[i]) == 0;
        refit_config_store_int(field, r->size, v);
        return REFIT_CONFIG_VALUE_OK;
      }
    }
    return REFIT_CONFIG_VALUE_INVALID;
  }
  case REFIT_CONFIG_TYPE_ENUM: {
    int index = refit_config_choice_index(r->choices, text);
    if (index < 0) {
      refit_config_choice_suggest(r->choices, text, why, why_len);
      return REFIT_CONFIG_VALUE_INVALID;
    }
    refit_config_store_int(field, r->size, index);
    return REFIT_CONFIG_VALUE_OK;
  }
  case REFIT_CONFIG_TYPE_STRING: {
    if (plain && refit_config_is_null(text))
      text = "";
    size_t len = strlen(text);
    if (len >= r->size)
      return REFIT_CONFIG_VALUE_TOO_BIG;
    memcpy(field, text, len + 1);
    return REFIT_CONFIG_VALUE_OK;
  }
  case REFIT_CONFIG_TYPE_STRING_LIST: {
    /* Only table defaults come here, written "[a, b]" with plain names; a
     * file's list is a YAML sequence read item by item (config_parse.c). */
    size_t len = strlen(text);
    int first;
    if (len < 2 || text[0] != '[' || text[len - 1] != ']')
      return REFIT_CONFIG_VALUE_INVALID;
    refit_config_list_clear(r, target);
    for (const char *p = text + 1, *end = text + len - 1; p < end;) {
      const char *comma = memchr(p, ',', (size_t)(end - p));
      const char *stop = comma ? comma : end, *last = stop;
      while (p < stop && *p == ' ')
        p++;
      while (last > p && last[-1] == ' ')
        last--;
      if (refit_config_list_add(r, target, p, (size_t)(last - p), &first) !=
          REFIT_CONFIG_ITEM_OK)
        return REFIT_CONFIG_VALUE_INVALID;
      p = stop + 1;
    }
    return REFIT_CONFIG_VALUE_OK;
  }
  case REFIT_CONFIG_TYPE_SECTION:
    return REFIT_CONFIG_VALUE_INVALID; /* a mapping, never a scalar */
  }
  return REFIT_CONFIG_VALUE_INVALID;
}

/* What row r accepts, as a phrase that follows "expected ". */
void refit_config_value_expect(const refit_config_row_t *r, bool too_big, char *buf,
                               size_t n) {
  switch (r->type) {
  case REFIT_CONFIG_TYPE_INT: {
    const char *what = r->min == 1   ? "a positive integer"
                       : r->min == 0 ? "a non-negative integer"
                                     : "an integer";
    if (too_big)
      snprintf(buf, n, "%s no larger than %" PRId64, what, r->max);
    else
      snprintf(buf, n, "%s", what);
    return;
  }
  case REFIT_CONFIG_TYPE_U64:
    snprintf(buf, n, "a non-negative integer below 2^64");
    return;
  case REFIT_CONFIG_TYPE_BYTES: {
    char min[32];
    refit_config_bytes_format((uint64_t)r->min, min, sizeof(min));
    if (too_big && r->max < INT64_MAX)
      snprintf(buf, n, "a size of at least %s and at most %" PRId64 " bytes", min,
               r->max);
    else
      snprintf(buf, n,
               "a size of at least %s such as 256MiB, 1GiB, 64KiB, 1MB or "
               "4096",
               min);
    return;
  }
  case REFIT_CONFIG_TYPE_DOUBLE: {
    const bool inclusive = r->flags & REFIT_CONFIG_MIN_INCLUSIVE;
    if (r->max > r->min && inclusive)
      snprintf(buf, n, "a number from %" PRId64 " to %" PRId64, r->min, r->max);
    else if (r->max > r->min)
      snprintf(buf, n, "a number greater than %" PRId64 " and at most %" PRId64, r->min,
               r->max);
    else
      snprintf(buf, n, "a number %s %" PRId64, inclusive ? "of at least" : "greater than",
               r->min);
    return;
  }
  case REFIT_CONFIG_TYPE_BOOL:
    snprintf(buf, n, "true or false");
    return;
  case REFIT_CONFIG_TYPE_ENUM: {
    size_t off = (size_t)snprintf(buf, n, "one of ");
    for (const char *p = r->choices; *p && off + 3 < n; p++) {
      if (*p == '|') {
        buf[off++] = ',';
        buf[off++] = ' ';
      } else {
        buf[off++] = *p;
      }
    }
    buf[off < n ? off : n - 1] = '\0';
    return;
  }
  case REFIT_CONFIG_TYPE_STRING:
    snprintf(buf, n, "a string shorter than %zu bytes", r->size);
    return;
  case REFIT_CONFIG_TYPE_STRING_LIST: {
    char example[128];
    refit_config_choice_name(r->choices, 1, example, sizeof(example));
    snprintf(buf, n, "a sequence of at most %zu names such as %s ([] for none)",
             r->size / r->item_size, example);
    return;
  }
  case REFIT_CONFIG_TYPE_SECTION:
    snprintf(buf, n, "a mapping of %s keys", refit_config_row_path(r));
    return;
  }
}

/* The value of row r in target as YAML text (strings double-quoted). */
void refit_config_value_format(const refit_config_row_t *r, const void *target,
                               bool quote, char *buf, size_t n) {
  const char *field = (const char *)target + r->offset;
  switch (r->type) {
  case REFIT_CONFIG_TYPE_INT:
    snprintf(buf, n, "%" PRId64, refit_config_load_int(field, r->size));
    return;
  case REFIT_CONFIG_TYPE_U64: {
    uint64_t v;
    memcpy(&v, field, sizeof(v));
    snprintf(buf, n, "%" PRIu64, v);
    return;
  }
  case REFIT_CONFIG_TYPE_BYTES: {
    uint64_t v;
    memcpy(&v, field, sizeof(v));
    refit_config_bytes_format(v, buf, n);
    return;
  }
  case REFIT_CONFIG_TYPE_DOUBLE: {
    double v;
    memcpy(&v, field, sizeof(v));
    snprintf(buf, n, "%.17g", v);
    return;
  }
  case REFIT_CONFIG_TYPE_BOOL:
    snprintf(buf, n, "%s", refit_config_load_int(field, r->size) ? "true" : "false");
    return;
  case REFIT_CONFIG_TYPE_ENUM:
    refit_config_choice_name(r->choices, refit_config_load_int(field, r->size), buf, n);
    return;
  case REFIT_CONFIG_TYPE_STRING:
    if (quote)
      refit_config_yaml_quote(field, buf, n);
    else
      snprintf(buf, n, "%s", field);
    return;
  case REFIT_CONFIG_TYPE_STRING_LIST: {
    /* A flow sequence: ["a", "b.c"], or [a, b.c] unquoted. */
    size_t off = 0;
    const int count = refit_config_list_count(r, target);
    buf[0] = '\0';
    off += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < count && off + 8 < n; i++) {
      const char *item = refit_config_list_item(r, target, i);
      if (i > 0)
        off += (size_t)snprintf(buf + off, n - off, ", ");
      if (quote)
        off += refit_config_yaml_quote(item, buf + off, n - off);
      else
        off += (size_t)snprintf(buf + off, n - off, "%s", item);
      if (off >= n)
        off = n - 1; /* truncated: only messages use so small a buffer */
    }
    if (off + 2 <= n)
      snprintf(buf + off, n - off, "]");
    return;
  }
  case REFIT_CONFIG_TYPE_SECTION:
    snprintf(buf, n, "%s", refit_config_load_int(field, r->size) ? "true" : "false");
    return;
  }
}

/* ------------------------------------------------------------------------ */
/* Rows and tables                                                           */
/* ------------------------------------------------------------------------ */

const char *refit_config_row_path(const refit_config_row_t *r) {
  return r->dotted + (r->section[0] == '\0');
}

int64_t refit_config_row_int(const refit_config_row_t *r, const void *target) {
  return refit_config_load_int((const char *)target + r->offset, r->size);
}

void refit_config_row_set_int(const refit_config_row_t *r, void *target, int64_t v) {
  refit_config_store_int((char *)target + r->offset, r->size, v);
}

int refit_config_table_find(const refit_config_table_t *t, const char *section,
                            const char *key) {
  for (int i = 0; i < t->nrows; i++)
    if (strcmp(t->rows[i].section, section) == 0 && strcmp(t->rows[i].key, key) == 0)
      return i;
  return -1;
}

int refit_config_table_path(const refit_config_table_t *t, const char *path) {
  for (int i = 0; i < t->nrows; i++)
    if (strcmp(refit_config_row_path(&t->rows[i]), path) == 0)
      return i;
  return -1;
}

int refit_config_table_section_row(const refit_config_table_t *t, const char *name) {
  const int i = refit_config_table_path(t, name);
  return i >= 0 && t->rows[i].type == REFIT_CONFIG_TYPE_SECTION ? i : -1;
}

/* ------------------------------------------------------------------------ */
/* A whole table                                                             */
/* ------------------------------------------------------------------------ */

bool refit_config_table_live(const refit_config_table_t *t, const void *target,
                             const refit_config_row_t *r) {
  for (int i = 0; i < t->nrows; i++) {
    const refit_config_row_t *s = &t->rows[i];
    const char *path = refit_config_row_path(s);
    size_t n = strlen(path);
    if (s->type == REFIT_CONFIG_TYPE_SECTION && strncmp(r->section, path, n) == 0 &&
        (r->section[n] == '\0' || r->section[n] == '.') &&
        !refit_config_row_int(s, target))
      return false;
  }
  return true;
}

void refit_config_table_defaults(const refit_config_table_t *t, void *target) {
  char why[128];
  for (int i = 0; i < t->nrows; i++) {
    const refit_config_row_t *r = &t->rows[i];
    if (r->default_text != NULL) {
      refit_config_value_status_t st =
          refit_config_value_parse(r, r->default_text, false, target, why, sizeof(why));
      (void)st; /* a table default always parses (test_defaults_applied) */
    }
  }
}

uint64_t refit_config_table_hash(const refit_config_table_t *t, const void *target) {
  uint64_t h = REFIT_HASH_INIT;
  char value[REFIT_CONFIG_TEXT_MAX];
  for (int i = 0; i < t->nrows; i++) {
    const refit_config_row_t *r = &t->rows[i];
    const char *path = refit_config_row_path(r);
    if (!refit_config_table_live(t, target, r))
      continue; /* inside an optional section that is not given */
    refit_config_value_format(r, target, true, value, sizeof(value));
    /* Include the terminating NULs so "a" "bc" and "ab" "c" differ. */
    h = refit_hash_bytes(h, path, strlen(path) + 1);
    h = refit_hash_bytes(h, value, strlen(value) + 1);
  }
  return h;
}

/*
 * Open the mappings of `section` that are not open yet (`open` is the one the
 * previous key was written in): "refit.fault" after "refit" writes
 * "  fault:", after "generator" it writes "refit:" and "  fault:".
 */
static void refit_config_format_open(const refit_config_table_t *t, FILE *f,
                                     const char *open, const char *section) {
  size_t same = 0; /* bytes of the common whole-segment prefix */
  for (size_t i = 0;; i++) {
    bool end_s = section[i] == '\0' || section[i] == '.';
    bool end_o = open[i] == '\0' || open[i] == '.';
    if (end_s && end_o)
      same = i;
    if (section[i] == '\0' || open[i] == '\0' || section[i] != open[i])
      break;
  }
  int depth = 0;
  for (size_t i = 0; i < same; i++)
    depth += section[i] == '.';
  depth += same > 0;
  for (const char *p = section + same + (section[same] == '.'); *p; depth++) {
    const char *dot = strchr(p, '.');
    int len = dot ? (int)(dot - p) : (int)strlen(p);
    int id = refit_config_table_section_row(t, section);
    fprintf(f, "%*s%.*s:", 2 * depth, "", len, p);
    if (id >= 0 && dot == NULL)
      fprintf(f, "  # %s", t->rows[id].doc);
    fputc('\n', f);
    p += len + (dot != NULL);
  }
}

refit_status_t refit_config_table_format(const refit_config_table_t *t,
                                         const void *target, char **out) {
  char *buf = NULL;
  size_t size = 0;
  char value[REFIT_CONFIG_TEXT_MAX];
  FILE *f = open_memstream(&buf, &size);
  if (f == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_config_format: %s", strerror(errno));
  const char *open = "";
  for (int i = 0; i < t->nrows; i++) {
    const refit_config_row_t *r = &t->rows[i];
    /* A SECTION row is written as the header of its keys. */
    if (r->type == REFIT_CONFIG_TYPE_SECTION || !refit_config_table_live(t, target, r))
      continue;
    if (strcmp(open, r->section) != 0) {
      refit_config_format_open(t, f, open, r->section);
      open = r->section;
    }
    int depth = 0;
    for (const char *p = r->section; *p; p++)
      depth += *p == '.';
    depth += r->section[0] != '\0';
    refit_config_value_format(r, target, true, value, sizeof(value));
    fprintf(f, "%*s%s: %s  # %s\n", 2 * depth, "", r->key, value, r->doc);
  }
  if (fclose(f) != 0 || buf == NULL) {
    free(buf);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_config_format: out of memory");
  }
  *out = buf;
  return REFIT_OK;
}
