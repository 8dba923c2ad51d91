/*
 * The refit configuration parser.
 *
 * One table (config_table.h) describes every key; one walker reads the YAML
 * document (libyaml document API) against it, so type, bound and default
 * handling exist once. Every problem is collected with the position of the
 * text that caused it, and the whole list is reported at once, sorted by
 * position, as "file:line:col: message" lines: a person fixes a bad file in
 * one round trip, and a bad file never starts a transfer.
 *
 * Two layers of checks, in order:
 *   1. the walk: syntax, unknown and duplicate keys, types and bounds;
 *   2. refit_config_check_layout(): rules between keys, each skipped when
 *      one of its inputs was already reported, so one mistake yields one
 *      message. The layout rules (divisibility, the family's dimensions,
 *      pipeline stage layers) are reshard/rules.c's, the ones the catalog
 *      enforces, reported here at the key each blames; the MXFP8 shape rules
 *      are the kernels' own, asked about the catalog's quantized tensors.
 * Every value the table accepts is implemented; what a machine cannot do
 * (a GPU transport without a GPU) is reported when the job starts.
 *
 * Sections nest: a SECTION row ("refit.fault") is an optional mapping inside
 * its parent, and the walk, the unknown-key suggestions, the required-key
 * check, the hash and the formatter treat it like a top-level section.
 */
#include "config.h"

#include "config_table.h"
#include "core/error.h"
#include "core/hash.h"
#include "hf_config.h"
#include "kernels/layout.h"
#include "kernels/mxfp8.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

/* ------------------------------------------------------------------------ */
/* The table                                                                 */
/* ------------------------------------------------------------------------ */

typedef enum {
  REFIT_CONFIG_TYPE_INT,
  REFIT_CONFIG_TYPE_U64,
  REFIT_CONFIG_TYPE_BYTES,
  REFIT_CONFIG_TYPE_DOUBLE,
  REFIT_CONFIG_TYPE_BOOL,
  REFIT_CONFIG_TYPE_ENUM,
  REFIT_CONFIG_TYPE_STRING,
  REFIT_CONFIG_TYPE_STRING_LIST,
  REFIT_CONFIG_TYPE_SECTION
} refit_config_type_t;

typedef struct {
  const char *dotted; /* SECTION "." KEY; use refit_config_row_path() */
  const char *section;
  const char *key;
  refit_config_type_t type;
  size_t offset;
  size_t size;
  size_t count_offset; /* STRING_LIST: where its item count (an int) lives */
  size_t item_size;    /* STRING_LIST: bytes of one item, NUL included */
  const char *default_text;
  int64_t min;
  int64_t max;
  const char *choices;
  unsigned flags;
  const char *doc;
} refit_config_row_t;

/* A list row keeps its item count in MEMBER_count; other rows have none. */
#define REFIT_CONFIG_LIST_EXTRA_(member)                                       \
  offsetof(refit_config_t, member##_count),                                    \
      sizeof(((refit_config_t *)0)->member[0])
#define REFIT_CONFIG_EXTRA_INT(member) 0, 0
#define REFIT_CONFIG_EXTRA_U64(member) 0, 0
#define REFIT_CONFIG_EXTRA_BYTES(member) 0, 0
#define REFIT_CONFIG_EXTRA_DOUBLE(member) 0, 0
#define REFIT_CONFIG_EXTRA_BOOL(member) 0, 0
#define REFIT_CONFIG_EXTRA_ENUM(member) 0, 0
#define REFIT_CONFIG_EXTRA_STRING(member) 0, 0
#define REFIT_CONFIG_EXTRA_STRING_LIST(member) REFIT_CONFIG_LIST_EXTRA_(member)
#define REFIT_CONFIG_EXTRA_SECTION(member) 0, 0

static const refit_config_row_t refit_config_rows[] = {
#define REFIT_CONFIG_ROW_(id, section, key, type, member, def, min, max,       \
                          choices, flags, doc)                                 \
  {section "." key,                                                            \
   section,                                                                    \
   key,                                                                        \
   REFIT_CONFIG_TYPE_##type,                                                   \
   offsetof(refit_config_t, member),                                           \
   sizeof(((refit_config_t *)0)->member),                                      \
   REFIT_CONFIG_EXTRA_##type(member),                                          \
   def,                                                                        \
   min,                                                                        \
   max,                                                                        \
   choices,                                                                    \
   flags,                                                                      \
   doc},
    REFIT_CONFIG_TABLE(REFIT_CONFIG_ROW_)
#undef REFIT_CONFIG_ROW_
};

_Static_assert(sizeof(refit_config_rows) / sizeof(refit_config_rows[0]) ==
                   REFIT_CONFIG_ROW_COUNT,
               "one row per REFIT_CONFIG_ROW_ id");

#define ROW(id) REFIT_CONFIG_ROW_##id

/* refit.linear_backend's n-th choice is the kernels' n-th dense backend. */
_Static_assert(REFIT_LINEAR_FLASHINFER_CUTLASS ==
                       (int)REFIT_KERNELS_DENSE_FLASHINFER_CUTLASS &&
                   REFIT_LINEAR_FLASHINFER_CUTEDSL ==
                       (int)REFIT_KERNELS_DENSE_FLASHINFER_CUTEDSL &&
                   REFIT_LINEAR_FLASHINFER_TRTLLM ==
                       (int)REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM &&
                   REFIT_KERNELS_DENSE_COUNT == 3,
               "refit_linear_backend_t follows refit_kernels_dense_backend_t");

/* Room for any value as YAML text: a quoted path or a quoted list, with every
 * byte escaped as \xNN in the worst case. */
#define REFIT_CONFIG_TEXT_MAX 8192
_Static_assert(4 * REFIT_PATH_MAX + 8 <= REFIT_CONFIG_TEXT_MAX,
               "a quoted path fits");
_Static_assert(REFIT_QUANT_IGNORE_MAX *(4 * REFIT_MODULE_NAME_MAX + 4) + 8 <=
                   REFIT_CONFIG_TEXT_MAX,
               "a quoted list fits");

/* "model.hidden_size", or "verify" for a top-level key. */
static const char *refit_config_row_path(const refit_config_row_t *r) {
  return r->dotted + (r->section[0] == '\0');
}

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

#define REFIT_CONFIG_NUNITS                                                    \
  (sizeof(refit_config_units) / sizeof(refit_config_units[0]))

/* Parse without touching the thread's last error; `why` explains a failure. */
static int refit_config_bytes_parse(const char *text, uint64_t *bytes,
                                    char *why, size_t why_len) {
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

refit_status_t refit_config_parse_bytes(const char *text, uint64_t *bytes) {
  char why[128];
  if (text == NULL || bytes == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_config_parse_bytes: NULL argument");
  if (refit_config_bytes_parse(text, bytes, why, sizeof(why)) != 0)
    return REFIT_ERR(REFIT_ERR_CONFIG, "invalid size '%.64s': %s", text, why);
  return REFIT_OK;
}

/* The shortest exact spelling: "256MiB", "1MB", "4097". */
static void refit_config_bytes_format(uint64_t bytes, char *buf, size_t n) {
  for (size_t i = REFIT_CONFIG_NUNITS; i-- > 1;) {
    uint64_t scale = refit_config_units[i].scale;
    if (bytes != 0 && bytes % scale == 0 && (scale & (scale - 1)) == 0) {
      snprintf(buf, n, "%" PRIu64 "%s", bytes / scale,
               refit_config_units[i].name);
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
      size_t cost =
          tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]);
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
static const char *refit_config_suggest(const char *name,
                                        const char *const *cands, size_t n) {
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

static bool refit_config_is_null(const char *text) {
  return text[0] == '\0' || strcmp(text, "~") == 0 ||
         strcmp(text, "null") == 0 || strcmp(text, "Null") == 0 ||
         strcmp(text, "NULL") == 0;
}

/* Index of `text` in a "a|b|c" choice list, or -1. */
static int refit_config_choice_index(const char *choices, const char *text) {
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
static void refit_config_choice_name(const char *choices, int64_t index,
                                     char *buf, size_t n) {
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
static void refit_config_choice_suggest(const char *choices, const char *text,
                                        char *why, size_t why_len) {
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

static int refit_config_list_count(const refit_config_row_t *r,
                                   const refit_config_t *cfg) {
  int n;
  memcpy(&n, (const char *)cfg + r->count_offset, sizeof(n));
  return n;
}

static const char *refit_config_list_item(const refit_config_row_t *r,
                                          const refit_config_t *cfg, int i) {
  return (const char *)cfg + r->offset + (size_t)i * r->item_size;
}

static void refit_config_list_clear(const refit_config_row_t *r,
                                    refit_config_t *cfg) {
  const int zero = 0;
  memset((char *)cfg + r->offset, 0, r->size);
  memcpy((char *)cfg + r->count_offset, &zero, sizeof(zero));
}

typedef enum {
  REFIT_CONFIG_ITEM_OK = 0,
  REFIT_CONFIG_ITEM_EMPTY,
  REFIT_CONFIG_ITEM_TOO_LONG,
  REFIT_CONFIG_ITEM_FULL,
  REFIT_CONFIG_ITEM_DUPLICATE /* *first is the index of the earlier copy */
} refit_config_item_status_t;

/* Append `len` bytes of `text` to list row r; the one place items are
 * checked, for table defaults and files alike. */
static refit_config_item_status_t
refit_config_list_add(const refit_config_row_t *r, refit_config_t *cfg,
                      const char *text, size_t len, int *first) {
  int n = refit_config_list_count(r, cfg);
  if (len == 0)
    return REFIT_CONFIG_ITEM_EMPTY;
  if (len >= r->item_size)
    return REFIT_CONFIG_ITEM_TOO_LONG;
  for (int i = 0; i < n; i++) {
    const char *item = refit_config_list_item(r, cfg, i);
    if (strlen(item) == len && memcmp(item, text, len) == 0) {
      *first = i;
      return REFIT_CONFIG_ITEM_DUPLICATE;
    }
  }
  if ((size_t)n >= r->size / r->item_size)
    return REFIT_CONFIG_ITEM_FULL;
  char *item = (char *)cfg + r->offset + (size_t)n * r->item_size;
  memcpy(item, text, len);
  item[len] = '\0';
  n++;
  memcpy((char *)cfg + r->count_offset, &n, sizeof(n));
  return REFIT_CONFIG_ITEM_OK;
}

/*
 * What a plain YAML scalar means when it is not a string (the core schema:
 * null, booleans, numbers), as a phrase; NULL for a string. A list of names
 * takes strings only, so that "[lm_head, 3]" is a mistake, not module "3".
 */
static const char *refit_config_plain_kind(const char *text) {
  static const char *const bools[] = {"true", "false", "yes",
                                      "no",   "on",    "off"};
  if (text[0] == '\0' || strcmp(text, "~") == 0 ||
      strcasecmp(text, "null") == 0)
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

typedef enum {
  REFIT_CONFIG_VALUE_OK = 0,
  REFIT_CONFIG_VALUE_INVALID, /* not of the row's type, or below its minimum */
  REFIT_CONFIG_VALUE_TOO_BIG  /* above the row's maximum */
} refit_config_value_status_t;

/*
 * Parse `text` as the value of row r into cfg. `plain` says whether the
 * scalar was written unquoted (only plain scalars can be YAML null). `why`
 * receives extra detail for some failures. cfg is untouched on failure.
 */
static refit_config_value_status_t
refit_config_value_parse(const refit_config_row_t *r, const char *text,
                         bool plain, refit_config_t *cfg, char *why,
                         size_t why_len) {
  char *field = (char *)cfg + r->offset;
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
    if (v < r->min)
      return REFIT_CONFIG_VALUE_INVALID;
    if (v > r->max)
      return REFIT_CONFIG_VALUE_TOO_BIG;
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
     * file's list is a YAML sequence read by refit_config_read_list(). */
    size_t len = strlen(text);
    int first;
    if (len < 2 || text[0] != '[' || text[len - 1] != ']')
      return REFIT_CONFIG_VALUE_INVALID;
    refit_config_list_clear(r, cfg);
    for (const char *p = text + 1, *end = text + len - 1; p < end;) {
      const char *comma = memchr(p, ',', (size_t)(end - p));
      const char *stop = comma ? comma : end, *last = stop;
      while (p < stop && *p == ' ')
        p++;
      while (last > p && last[-1] == ' ')
        last--;
      if (refit_config_list_add(r, cfg, p, (size_t)(last - p), &first) !=
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
static void refit_config_value_expect(const refit_config_row_t *r, bool too_big,
                                      char *buf, size_t n) {
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
      snprintf(buf, n, "a number greater than %" PRId64 " and at most %" PRId64,
               r->min, r->max);
    else
      snprintf(buf, n, "a number %s %" PRId64,
               inclusive ? "of at least" : "greater than", r->min);
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
  case REFIT_CONFIG_TYPE_STRING_LIST:
    snprintf(buf, n,
             "a sequence of at most %zu names such as [lm_head, mlp.gate] "
             "([] for none)",
             r->size / r->item_size);
    return;
  case REFIT_CONFIG_TYPE_SECTION:
    snprintf(buf, n, "a mapping of %s keys", refit_config_row_path(r));
    return;
  }
}

/* The value of row r in cfg as YAML text (strings double-quoted). */
static void refit_config_value_format(const refit_config_row_t *r,
                                      const refit_config_t *cfg, bool quote,
                                      char *buf, size_t n) {
  const char *field = (const char *)cfg + r->offset;
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
    snprintf(buf, n, "%s",
             refit_config_load_int(field, r->size) ? "true" : "false");
    return;
  case REFIT_CONFIG_TYPE_ENUM:
    refit_config_choice_name(r->choices, refit_config_load_int(field, r->size),
                             buf, n);
    return;
  case REFIT_CONFIG_TYPE_STRING:
    if (quote)
      refit_config_yaml_quote(field, buf, n);
    else
      snprintf(buf, n, "%s", field);
    return;
  case REFIT_CONFIG_TYPE_STRING_LIST: {
    /* A flow sequence: ["lm_head", "mlp.gate"], or [a, b] unquoted. */
    size_t off = 0;
    const int count = refit_config_list_count(r, cfg);
    buf[0] = '\0';
    off += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < count && off + 8 < n; i++) {
      const char *item = refit_config_list_item(r, cfg, i);
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
    snprintf(buf, n, "%s",
             refit_config_load_int(field, r->size) ? "true" : "false");
    return;
  }
}

/* ------------------------------------------------------------------------ */
/* Collected problems                                                        */
/* ------------------------------------------------------------------------ */

typedef struct {
  int line, col; /* 1-based */
  size_t seq;    /* order of detection, to keep sorting stable */
  char *text;
} refit_config_problem_t;

typedef struct {
  int line, col; /* 1-based; line 0 = not present in the file */
} refit_config_pos_t;

#define REFIT_CONFIG_MAX_SECTIONS 8

typedef struct {
  const char *filename;
  const char *text;
  size_t len;
  refit_config_t cfg;
  refit_config_problem_t *problems;
  size_t nproblems, cap;
  bool oom;
  refit_config_pos_t key_pos[REFIT_CONFIG_ROW_COUNT];
  bool bad[REFIT_CONFIG_ROW_COUNT]; /* already reported, or missing */
  /* Where each item of the list row (refit.quantization_ignore, the only
   * one) is; line 0 for the default's items. */
  refit_config_pos_t item_pos[REFIT_QUANT_IGNORE_MAX];
  bool layout_ok; /* every layout rule was checked and holds */
  /* model.hf_config: the config.json read, and per row the JSON key whose
   * value the row holds (NULL: the row's value is the YAML file's). */
  char hf_file[REFIT_PATH_MAX];
  const char *hf_key[REFIT_CONFIG_ROW_COUNT];
  struct {
    const char *name;
    refit_config_pos_t pos;
    bool malformed; /* not a mapping: already reported */
  } sections[REFIT_CONFIG_MAX_SECTIONS];
  size_t nsections;
} refit_config_ctx_t;

static void refit_config_problemv(refit_config_ctx_t *c, refit_config_pos_t at,
                                  const char *fmt, va_list ap) REFIT_PRINTF(3, 0);

static void refit_config_problemv(refit_config_ctx_t *c, refit_config_pos_t at,
                                  const char *fmt, va_list ap) {
  va_list copy;
  va_copy(copy, ap);
  int n = vsnprintf(NULL, 0, fmt, copy);
  va_end(copy);
  char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (text == NULL) {
    c->oom = true;
    return;
  }
  vsnprintf(text, (size_t)n + 1, fmt, ap);
  if (c->nproblems == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 16;
    refit_config_problem_t *p = realloc(c->problems, cap * sizeof(*p));
    if (p == NULL) {
      free(text);
      c->oom = true;
      return;
    }
    c->problems = p;
    c->cap = cap;
  }
  if (at.line <= 0)
    at.line = at.col = 1;
  c->problems[c->nproblems] = (refit_config_problem_t){
      at.line, at.col, c->nproblems, text};
  c->nproblems++;
}

static void refit_config_problem(refit_config_ctx_t *c, refit_config_pos_t at,
                                 const char *fmt, ...) REFIT_PRINTF(3, 4);

static void refit_config_problem(refit_config_ctx_t *c, refit_config_pos_t at,
                                 const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  refit_config_problemv(c, at, fmt, ap);
  va_end(ap);
}

static refit_config_pos_t refit_config_mark_pos(yaml_mark_t mark) {
  return (refit_config_pos_t){(int)mark.line + 1, (int)mark.column + 1};
}

/* The section named `name` ("refit", "refit.fault"), or -1. */
static int refit_config_section_find(const refit_config_ctx_t *c,
                                     const char *name) {
  for (size_t i = 0; i < c->nsections; i++)
    if (strcmp(c->sections[i].name, name) == 0)
      return (int)i;
  return -1;
}

static refit_config_pos_t *refit_config_section_pos(refit_config_ctx_t *c,
                                                    const char *name) {
  int i = refit_config_section_find(c, name);
  return i < 0 ? NULL : &c->sections[i].pos;
}

/* The last dotted segment of a section name: "fault" for "refit.fault". */
static const char *refit_config_section_key(const char *name) {
  const char *dot = strrchr(name, '.');
  return dot ? dot + 1 : name;
}

/* Is `name` a section directly inside `parent` ("" = the top level)? */
static bool refit_config_section_in(const char *name, const char *parent) {
  size_t n = strlen(parent);
  if (n == 0)
    return strchr(name, '.') == NULL;
  return strncmp(name, parent, n) == 0 && name[n] == '.' &&
         strchr(name + n + 1, '.') == NULL;
}

/* The SECTION row that makes `name` an optional nested section, or -1. */
static int refit_config_section_row(const char *name) {
  for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++)
    if (refit_config_rows[i].type == REFIT_CONFIG_TYPE_SECTION &&
        strcmp(refit_config_row_path(&refit_config_rows[i]), name) == 0)
      return i;
  return -1;
}

/* Does cfg use row r, i.e. is every optional section around it given? */
static bool refit_config_row_live(const refit_config_t *cfg,
                                  const refit_config_row_t *r) {
  for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++) {
    const refit_config_row_t *s = &refit_config_rows[i];
    const char *path = refit_config_row_path(s);
    size_t n = strlen(path);
    if (s->type == REFIT_CONFIG_TYPE_SECTION &&
        strncmp(r->section, path, n) == 0 &&
        (r->section[n] == '\0' || r->section[n] == '.') &&
        !refit_config_load_int((const char *)cfg + s->offset, s->size))
      return false;
  }
  return true;
}

/* Where to point at a row: its key, else its section's key, else 1:1. */
static refit_config_pos_t refit_config_row_pos(refit_config_ctx_t *c, int id) {
  if (c->key_pos[id].line > 0)
    return c->key_pos[id];
  refit_config_pos_t *s =
      refit_config_section_pos(c, refit_config_rows[id].section);
  if (s && s->line > 0)
    return *s;
  return (refit_config_pos_t){1, 1};
}

/* A value as it appears in a message: truncated, newlines made visible. */
static void refit_config_quote(const char *text, char *buf, size_t n) {
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

/*
 * Report an unknown key in `section` ("" = top level): suggest the closest
 * key of that level, else the same key in another section, else list the
 * level's keys.
 */
static void refit_config_unknown_key(refit_config_ctx_t *c,
                                     refit_config_pos_t at, const char *section,
                                     const char *name) {
  const char *cands[REFIT_CONFIG_ROW_COUNT + REFIT_CONFIG_MAX_SECTIONS];
  size_t n = 0;
  /* Sections inside this one that no SECTION row of it already names. */
  for (size_t i = 0; i < c->nsections; i++)
    if (refit_config_section_in(c->sections[i].name, section) &&
        refit_config_section_row(c->sections[i].name) < 0)
      cands[n++] = refit_config_section_key(c->sections[i].name);
  for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++)
    if (strcmp(refit_config_rows[i].section, section) == 0)
      cands[n++] = refit_config_rows[i].key;

  char path[160];
  snprintf(path, sizeof(path), "%s%s%.100s", section, section[0] ? "." : "",
           name);
  const char *close = refit_config_suggest(name, cands, n);
  if (close) {
    refit_config_problem(c, at, "unknown key '%s' (did you mean '%s'?)", path,
                         close);
    return;
  }
  for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++) {
    const refit_config_row_t *r = &refit_config_rows[i];
    if (strcmp(r->section, section) != 0 && strcmp(r->key, name) == 0) {
      refit_config_problem(c, at, "unknown key '%s' (did you mean '%s'?)", path,
                           refit_config_row_path(r));
      return;
    }
  }
  char list[512];
  size_t off = 0;
  list[0] = '\0';
  for (size_t i = 0; i < n && off < sizeof(list); i++)
    off += (size_t)snprintf(list + off, sizeof(list) - off, "%s%s",
                            i ? ", " : "", cands[i]);
  refit_config_problem(c, at, "unknown key '%s'; valid %s%s keys are: %s", path,
                       section, section[0] ? "" : "top-level", list);
}

/* ------------------------------------------------------------------------ */
/* The walk over the YAML document                                           */
/* ------------------------------------------------------------------------ */

static const char *refit_config_node_kind(const yaml_node_t *node) {
  switch (node->type) {
  case YAML_MAPPING_NODE:
    return "a mapping";
  case YAML_SEQUENCE_NODE:
    return "a sequence";
  default:
    return "a scalar";
  }
}

/* The scalar text of a key node, or NULL if it is not a usable key. */
static const char *refit_config_key_text(const yaml_node_t *key) {
  if (key->type != YAML_SCALAR_NODE)
    return NULL;
  const char *text = (const char *)key->data.scalar.value;
  if (strlen(text) != key->data.scalar.length)
    return NULL; /* an embedded NUL; no key has one */
  return text;
}

/* A STRING_LIST value: a sequence whose items are strings. */
static void refit_config_read_list(refit_config_ctx_t *c, int id,
                                   yaml_document_t *doc,
                                   const yaml_node_t *value) {
  const refit_config_row_t *r = &refit_config_rows[id];
  const char *path = refit_config_row_path(r);
  const size_t cap = r->size / r->item_size;
  char shown[80];
  if (value->type != YAML_SEQUENCE_NODE) {
    char expect[160];
    shown[0] = '\0';
    if (value->type == YAML_SCALAR_NODE)
      refit_config_quote((const char *)value->data.scalar.value, shown,
                         sizeof(shown));
    refit_config_value_expect(r, false, expect, sizeof(expect));
    refit_config_problem(c, refit_config_mark_pos(value->start_mark),
                         "%s: expected %s, got %s%s%s%s", path, expect,
                         refit_config_node_kind(value), shown[0] ? " '" : "",
                         shown, shown[0] ? "'" : "");
    c->bad[id] = true;
    return;
  }
  refit_config_list_clear(r, &c->cfg);
  size_t index = 0;
  for (yaml_node_item_t *it = value->data.sequence.items.start;
       it < value->data.sequence.items.top; it++, index++) {
    const yaml_node_t *node = yaml_document_get_node(doc, *it);
    const refit_config_pos_t at = refit_config_mark_pos(node->start_mark);
    if (index == cap) {
      refit_config_problem(c, at, "%s: at most %zu entries, got %zu", path, cap,
                           (size_t)(value->data.sequence.items.top -
                                    value->data.sequence.items.start));
      c->bad[id] = true;
      return;
    }
    if (node->type != YAML_SCALAR_NODE) {
      refit_config_problem(c, at,
                           "%s[%zu]: expected a module name (a string), "
                           "got %s",
                           path, index, refit_config_node_kind(node));
      c->bad[id] = true;
      continue;
    }
    const char *text = (const char *)node->data.scalar.value;
    const char *kind = node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE
                           ? refit_config_plain_kind(text)
                           : NULL;
    int first = 0;
    refit_config_item_status_t st =
        kind ? REFIT_CONFIG_ITEM_OK
             : refit_config_list_add(r, &c->cfg, text, node->data.scalar.length,
                                     &first);
    refit_config_quote(text, shown, sizeof(shown));
    if (kind) {
      refit_config_problem(c, at,
                           "%s[%zu]: expected a module name (a string), got "
                           "%s '%s' (quote it if it is a name)",
                           path, index, kind, shown);
    } else if (st == REFIT_CONFIG_ITEM_EMPTY ||
               strlen(text) != node->data.scalar.length) {
      refit_config_problem(c, at, "%s[%zu]: expected a module name, got '%s'",
                           path, index, shown);
    } else if (st == REFIT_CONFIG_ITEM_TOO_LONG) {
      refit_config_problem(c, at,
                           "%s[%zu]: expected a module name shorter than %zu "
                           "bytes, got '%s'",
                           path, index, r->item_size, shown);
    } else if (st == REFIT_CONFIG_ITEM_DUPLICATE) {
      refit_config_problem(c, at,
                           "%s[%zu]: '%s' is listed twice (first as "
                           "%s[%d])",
                           path, index, shown, path, first);
    } else {
      /* REFIT_CONFIG_ITEM_OK; FULL cannot happen below cap */
      const int n = refit_config_list_count(r, &c->cfg);
      if (n <= REFIT_QUANT_IGNORE_MAX)
        c->item_pos[n - 1] = at;
      continue;
    }
    c->bad[id] = true;
  }
}

static void refit_config_read_value(refit_config_ctx_t *c, int id,
                                    yaml_document_t *doc,
                                    const yaml_node_t *key,
                                    const yaml_node_t *value) {
  const refit_config_row_t *r = &refit_config_rows[id];
  refit_config_pos_t at = refit_config_mark_pos(value->start_mark);
  char expect[160], why[160], shown[80];
  if (c->key_pos[id].line > 0) {
    refit_config_problem(c, refit_config_mark_pos(key->start_mark),
                         "duplicate key '%s' (first set at line %d column %d)",
                         refit_config_row_path(r), c->key_pos[id].line,
                         c->key_pos[id].col);
    return;
  }
  c->key_pos[id] = refit_config_mark_pos(key->start_mark);
  if (r->type == REFIT_CONFIG_TYPE_STRING_LIST) {
    refit_config_read_list(c, id, doc, value);
    return;
  }
  if (value->type != YAML_SCALAR_NODE) {
    refit_config_value_expect(r, false, expect, sizeof(expect));
    refit_config_problem(c, at, "%s: expected %s, got %s",
                         refit_config_row_path(r), expect,
                         refit_config_node_kind(value));
    c->bad[id] = true;
    return;
  }
  const char *text = (const char *)value->data.scalar.value;
  bool plain = value->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
  refit_config_value_status_t st =
      strlen(text) != value->data.scalar.length
          ? REFIT_CONFIG_VALUE_INVALID
          : refit_config_value_parse(r, text, plain, &c->cfg, why, sizeof(why));
  if (st == REFIT_CONFIG_VALUE_OK)
    return;
  c->bad[id] = true;
  refit_config_value_expect(r, st == REFIT_CONFIG_VALUE_TOO_BIG, expect,
                            sizeof(expect));
  refit_config_quote(text, shown, sizeof(shown));
  refit_config_problem(c, at, "%s: expected %s, got '%s'%s%s%s",
                       refit_config_row_path(r), expect, shown,
                       why[0] ? " (" : "", why, why[0] ? ")" : "");
}

/* Find the row `key` of `section`, or -1. */
static int refit_config_row_find(const char *section, const char *key) {
  for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++)
    if (strcmp(refit_config_rows[i].section, section) == 0 &&
        strcmp(refit_config_rows[i].key, key) == 0)
      return i;
  return -1;
}

static void refit_config_walk_keys(refit_config_ctx_t *c, yaml_document_t *doc,
                                   const char *name, const yaml_node_t *map);

/*
 * Walk the mapping of section `name` (sections[si]). Returns true when the
 * file gives it as a mapping; an empty value ("trainer:") means all defaults
 * and returns false, and so does anything else, which is reported.
 */
static bool refit_config_walk_section(refit_config_ctx_t *c,
                                      yaml_document_t *doc, size_t si,
                                      const yaml_node_t *map) {
  const char *name = c->sections[si].name;
  if (map->type == YAML_SCALAR_NODE &&
      map->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
      refit_config_is_null((const char *)map->data.scalar.value))
    return false; /* "trainer:" with nothing under it: all defaults */
  if (map->type != YAML_MAPPING_NODE) {
    char shown[80] = "";
    if (map->type == YAML_SCALAR_NODE)
      refit_config_quote((const char *)map->data.scalar.value, shown,
                         sizeof(shown));
    refit_config_problem(c, refit_config_mark_pos(map->start_mark),
                         "%s: expected a mapping of %s keys, got %s%s%s%s",
                         name, name, refit_config_node_kind(map),
                         shown[0] ? " '" : "", shown, shown[0] ? "'" : "");
    /* Its keys are unknown now: no rule may use them, none is "missing". */
    c->sections[si].malformed = true;
    for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++)
      c->bad[i] |=
          strcmp(refit_config_rows[i].section, name) == 0 ||
          strcmp(refit_config_row_path(&refit_config_rows[i]), name) == 0;
    return false;
  }
  refit_config_walk_keys(c, doc, name, map);
  return true;
}

/* Every key of one mapping: the top level ("") or a section. */
static void refit_config_walk_keys(refit_config_ctx_t *c, yaml_document_t *doc,
                                   const char *name, const yaml_node_t *map) {
  for (yaml_node_pair_t *pair = map->data.mapping.pairs.start;
       pair < map->data.mapping.pairs.top; pair++) {
    yaml_node_t *key = yaml_document_get_node(doc, pair->key);
    yaml_node_t *value = yaml_document_get_node(doc, pair->value);
    refit_config_pos_t at = refit_config_mark_pos(key->start_mark);
    const char *k = refit_config_key_text(key);
    if (k == NULL) {
      refit_config_problem(c, at, "%s%skeys must be plain names, got %s", name,
                           name[0] ? ": " : "", refit_config_node_kind(key));
      continue;
    }
    int id = refit_config_row_find(name, k);
    if (id >= 0 && refit_config_rows[id].type != REFIT_CONFIG_TYPE_SECTION) {
      refit_config_read_value(c, id, doc, key, value);
      continue;
    }
    char path[160];
    snprintf(path, sizeof(path), "%s%s%.100s", name, name[0] ? "." : "", k);
    int si = refit_config_section_find(c, path);
    if (si < 0) {
      refit_config_unknown_key(c, at, name, k);
      continue;
    }
    refit_config_pos_t *s = &c->sections[si].pos;
    if (s->line > 0) {
      refit_config_problem(c, at,
                           "duplicate section '%s' (first at line %d column "
                           "%d)",
                           path, s->line, s->col);
      continue;
    }
    *s = at;
    if (id >= 0)
      c->key_pos[id] = at;
    if (refit_config_walk_section(c, doc, (size_t)si, value) && id >= 0)
      refit_config_store_int((char *)&c->cfg + refit_config_rows[id].offset,
                             refit_config_rows[id].size, 1);
  }
}

static void refit_config_walk(refit_config_ctx_t *c, yaml_document_t *doc) {
  yaml_node_t *root = yaml_document_get_root_node(doc);
  if (root == NULL)
    return; /* an empty file: the missing-key checks speak */
  if (root->type != YAML_MAPPING_NODE) {
    refit_config_problem(c, refit_config_mark_pos(root->start_mark),
                         "expected a mapping of sections (model, trainer, "
                         "generator, ...) at the top level, got %s",
                         refit_config_node_kind(root));
    return;
  }
  refit_config_walk_keys(c, doc, "", root);
}

/* Required keys that the file did not give. */
static void refit_config_check_required(refit_config_ctx_t *c) {
  for (size_t s = 0; s < c->nsections; s++) {
    const char *name = c->sections[s].name;
    /* An optional section that the file does not give has no keys. */
    const int optional = refit_config_section_row(name);
    const bool absent =
        optional >= 0 &&
        (c->bad[optional] ||
         !refit_config_load_int((const char *)&c->cfg +
                                    refit_config_rows[optional].offset,
                                refit_config_rows[optional].size));
    char missing[512];
    size_t off = 0;
    missing[0] = '\0';
    for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++) {
      const refit_config_row_t *r = &refit_config_rows[i];
      if (!(r->flags & REFIT_CONFIG_REQUIRED) || strcmp(r->section, name) ||
          c->key_pos[i].line > 0 || c->hf_key[i] != NULL)
        continue;
      c->bad[i] = true;
      if (c->sections[s].malformed || absent)
        continue; /* reported already, or an optional section not given */
      if (c->sections[s].pos.line > 0)
        refit_config_problem(c, c->sections[s].pos,
                             "%s: missing required key (%s)",
                             refit_config_row_path(r), r->doc);
      else if (off < sizeof(missing))
        off += (size_t)snprintf(missing + off, sizeof(missing) - off, "%s%s",
                                off ? ", " : "", r->key);
    }
    if (off > 0)
      refit_config_problem(c, (refit_config_pos_t){1, 1},
                           "missing required section '%s' (with keys %s)", name,
                           missing);
  }
}

/* ------------------------------------------------------------------------ */
/* model.hf_config                                                           */
/* ------------------------------------------------------------------------ */

static int64_t refit_config_int(const refit_config_ctx_t *c, int id);

/* The row of YAML key `path` ("model.hidden_size"), or -1. */
static int refit_config_path_row(const char *path) {
  for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++)
    if (strcmp(refit_config_row_path(&refit_config_rows[i]), path) == 0)
      return i;
  return -1;
}

/*
 * Fill the model keys from the Hugging Face config.json that model.hf_config
 * names (relative to the YAML file's directory). A key that the YAML file
 * gives too must agree with the file. Every row the file stands for is
 * marked (hf_key), so that it is not "missing" and rules blaming it name the
 * file and its key; when the file cannot be read, those rows are marked bad
 * too, so that no rule repeats the failure.
 */
static void refit_config_read_hf(refit_config_ctx_t *c) {
  const int at_row = ROW(MODEL_HF_CONFIG);
  const char *given = c->cfg.hf_config;
  if (c->bad[at_row] || given[0] == '\0')
    return;
  char path[2 * REFIT_PATH_MAX];
  const char *slash = strrchr(c->filename, '/');
  if (given[0] != '/' && slash != NULL)
    snprintf(path, sizeof(path), "%.*s/%s", (int)(slash - c->filename),
             c->filename, given);
  else
    snprintf(path, sizeof(path), "%s", given);
  refit_hf_config_t hf;
  char *errors = NULL;
  const refit_status_t st =
      refit_hf_config_load(path, &hf, c->hf_file, sizeof(c->hf_file), &errors);
  const refit_config_pos_t at = refit_config_row_pos(c, at_row);
  const int family = ROW(MODEL_FAMILY);
  c->hf_key[family] = "architectures";
  for (int i = 0; i < refit_hf_config_nkeys; i++) {
    const int row = refit_config_path_row(refit_hf_config_keys[i].yaml_key);
    if (row >= 0 && (st != REFIT_OK || (hf.present >> i & 1)))
      c->hf_key[row] = refit_hf_config_keys[i].json_key;
  }
  if (st != REFIT_OK) {
    for (char *line = errors; line != NULL && *line != '\0';) {
      char *end = strchr(line, '\n');
      refit_config_problem(c, at, "model.hf_config: %.*s",
                           end ? (int)(end - line) : (int)strlen(line), line);
      line = end ? end + 1 : NULL;
    }
    if (errors == NULL)
      refit_config_problem(c, at, "model.hf_config: %s", refit_last_error());
    free(errors);
    for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++)
      if (c->hf_key[i] != NULL)
        c->bad[i] = true;
    return;
  }
  for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++) {
    if (c->hf_key[i] == NULL)
      continue;
    const refit_config_row_t *r = &refit_config_rows[i];
    const size_t moff = r->offset - offsetof(refit_config_t, model);
    const int64_t from_file =
        refit_config_load_int((const char *)&hf.model + moff, r->size);
    if (c->key_pos[i].line > 0 && !c->bad[i] &&
        refit_config_int(c, i) != from_file) {
      char yaml_value[64], file_value[64];
      refit_config_value_format(r, &c->cfg, false, yaml_value, sizeof(yaml_value));
      refit_config_store_int((char *)&c->cfg + r->offset, r->size, from_file);
      refit_config_value_format(r, &c->cfg, false, file_value, sizeof(file_value));
      refit_config_problem(c, c->key_pos[i],
                           "%s: %s disagrees with %s's key '%s' (%s); remove "
                           "%s or make them agree",
                           refit_config_row_path(r), yaml_value, c->hf_file,
                           c->hf_key[i], file_value, refit_config_row_path(r));
      c->bad[i] = true;
      continue;
    }
    if (c->key_pos[i].line > 0)
      c->hf_key[i] = NULL; /* the YAML file says it too: blame its key */
    refit_config_store_int((char *)&c->cfg + r->offset, r->size, from_file);
  }
}

/* ------------------------------------------------------------------------ */
/* Rules between keys                                                        */
/* ------------------------------------------------------------------------ */

/* True when none of the rows was already reported (or missing). */
static bool refit_config_rows_ok(const refit_config_ctx_t *c, const int *ids,
                                 size_t n) {
  for (size_t i = 0; i < n; i++)
    if (c->bad[ids[i]])
      return false;
  return true;
}

#define ROWS_OK(...)                                                           \
  refit_config_rows_ok(c, (const int[]){__VA_ARGS__},                          \
                       sizeof((const int[]){__VA_ARGS__}) / sizeof(int))

static void refit_config_rule(refit_config_ctx_t *c, int id, const char *fmt,
                              ...) REFIT_PRINTF(3, 4);

/* Report a rule broken, at the key of row `id`; a value read from
 * model.hf_config is reported at that key, naming the file and its key. */
static void refit_config_rule(refit_config_ctx_t *c, int id, const char *fmt,
                              ...) {
  char text[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  if (c->hf_key[id] == NULL) {
    refit_config_problem(c, refit_config_row_pos(c, id), "%s", text);
    return;
  }
  refit_config_problem(c, refit_config_row_pos(c, ROW(MODEL_HF_CONFIG)),
                       "%s (%s is %s's key '%s')", text,
                       refit_config_row_path(&refit_config_rows[id]),
                       c->hf_file, c->hf_key[id]);
}

/* The integer value of row `id` in the working configuration. */
static int64_t refit_config_int(const refit_config_ctx_t *c, int id) {
  const refit_config_row_t *r = &refit_config_rows[id];
  return refit_config_load_int((const char *)&c->cfg + r->offset, r->size);
}

/* The row of a layout field: the key of the same path, or -1. */
static int refit_config_field_row(refit_field_t f) {
  const char *name = refit_field_name(f);
  for (int i = 0; name[0] != '\0' && i < REFIT_CONFIG_ROW_COUNT; i++)
    if (strcmp(refit_config_row_path(&refit_config_rows[i]), name) == 0)
      return i;
  return -1;
}

/*
 * The layout rules (reshard/rules.c: divisibility by tp, ep and etp, the
 * family's dimensions, the pipeline split), each reported at the key of the
 * field it blames. A rule that reads a value already reported is not
 * checked. True when every rule was checked and holds.
 */
static bool refit_config_check_layout_rules(refit_config_ctx_t *c) {
  refit_fields_t unknown = 0;
  refit_violations_t v;
  for (int f = REFIT_FIELD_NONE + 1; f < REFIT_FIELD_COUNT; f++) {
    const int row = refit_config_field_row((refit_field_t)f);
    if (row < 0 || c->bad[row])
      unknown |= REFIT_FIELD_BIT(f);
  }
  refit_layout_rules(&c->cfg.model, &c->cfg.trainer, &c->cfg.generator, unknown, &v);
  for (int i = 0; i < v.count; i++) {
    int row = refit_config_field_row(v.v[i].field);
    const int alt = refit_config_field_row(v.v[i].or_field);
    if (row >= 0 && alt >= 0 && c->key_pos[row].line == 0 && c->key_pos[alt].line > 0)
      row = alt;
    if (row >= 0)
      refit_config_rule(c, row, "%s", v.v[i].text);
    else
      refit_config_problem(c, (refit_config_pos_t){1, 1}, "%s", v.v[i].text);
  }
  return unknown == 0 && v.count == 0;
}

/* Keys of the other family are errors, not silently ignored (the family's
 * own dimensions are a layout rule). */
static void refit_config_check_model(refit_config_ctx_t *c) {
  static const struct {
    int row;
    refit_family_t family; /* the family the key belongs to */
  } specific[] = {
      {ROW(MODEL_INTERMEDIATE_SIZE), REFIT_FAMILY_QWEN3},
      {ROW(MODEL_NUM_EXPERTS), REFIT_FAMILY_QWEN3_MOE},
      {ROW(MODEL_MOE_INTERMEDIATE_SIZE), REFIT_FAMILY_QWEN3_MOE},
  };
  if (!ROWS_OK(ROW(MODEL_FAMILY)))
    return;
  for (size_t i = 0; i < sizeof(specific) / sizeof(specific[0]); i++) {
    const int id = specific[i].row;
    if (!ROWS_OK(id) || c->cfg.model.family == specific[i].family ||
        refit_config_int(c, id) == 0)
      continue;
    char family[32];
    refit_config_choice_name(refit_config_rows[ROW(MODEL_FAMILY)].choices,
                             specific[i].family, family, sizeof(family));
    refit_config_rule(c, id,
                      "%s: %" PRId64 " is given but applies only to "
                      "model.family %s; remove it or change model.family",
                      refit_config_row_path(&refit_config_rows[id]),
                      refit_config_int(c, id), family);
  }
}

static void refit_config_check_world(refit_config_ctx_t *c, int world_size) {
  const refit_trainer_layout_t *t = &c->cfg.trainer;
  const refit_generator_layout_t *g = &c->cfg.generator;
  if (world_size <= 0 ||
      !ROWS_OK(ROW(TRAINER_TP), ROW(TRAINER_PP), ROW(TRAINER_DP),
               ROW(GENERATOR_TP), ROW(GENERATOR_ENGINES)))
    return;
  /* Sizes are at most 2^20 each (table bounds), so products fit. */
  int64_t trainer = (int64_t)t->tp * t->pp * t->dp;
  int64_t generator = (int64_t)g->tp * g->engines;
  if (trainer + generator == world_size)
    return;
  refit_config_pos_t *at = refit_config_section_pos(c, "trainer");
  if (at == NULL || at->line == 0)
    at = refit_config_section_pos(c, "generator");
  refit_config_problem(c, at ? *at : (refit_config_pos_t){1, 1},
                       "world size %d does not match trainer ranks %" PRId64
                       " (tp %d * pp %d * dp %d) + generator ranks %" PRId64
                       " (tp %d * engines %d) = %" PRId64,
                       world_size, trainer, t->tp, t->pp, t->dp, generator,
                       g->tp, g->engines, trainer + generator);
}

/* Does a source or reference of `kind` read the file at its path? */
static bool refit_config_kind_has_path(refit_source_kind_t kind) {
  return kind == REFIT_SOURCE_HDF5 || kind == REFIT_SOURCE_SAFETENSORS;
}

static void refit_config_check_source(refit_config_ctx_t *c) {
  const refit_config_t *cfg = &c->cfg;
  const bool file = refit_config_kind_has_path(cfg->source.kind);
  const bool caller = cfg->source.kind == REFIT_SOURCE_CALLER;
  char kind[32], ref_kind[32];
  if (!ROWS_OK(ROW(SOURCE_KIND), ROW(SOURCE_PATH), ROW(SOURCE_SEED)))
    return;
  refit_config_choice_name(refit_config_rows[ROW(SOURCE_KIND)].choices,
                           cfg->source.kind, kind, sizeof(kind));
  if (file && cfg->source.path[0] == '\0')
    refit_config_rule(c, ROW(SOURCE_KIND),
                      "source.path: required when source.kind is %s", kind);
  else if (!file && cfg->source.path[0] != '\0')
    refit_config_rule(c, ROW(SOURCE_PATH),
                      "source.path: given but source.kind is %s; "
                      "remove it or set source.kind: hdf5 or safetensors",
                      kind);
  if (!ROWS_OK(ROW(REFERENCE_KIND), ROW(REFERENCE_PATH)))
    return;
  refit_config_choice_name(refit_config_rows[ROW(REFERENCE_KIND)].choices,
                           cfg->reference.kind, ref_kind, sizeof(ref_kind));
  /* The reference exists for caller-owned weights only: every other source
   * is its own reference. (Values, not the keys' presence, are checked, so
   * that refit_config_format's output, which writes every key, reads back.) */
  if (!caller && (cfg->reference.kind != REFIT_SOURCE_SYNTHETIC ||
                  cfg->reference.path[0] != '\0')) {
    refit_config_rule(c, ROW(REFERENCE_KIND),
                      "reference: a %s reference is given but source.kind is "
                      "not caller (a synthetic or checkpoint source is its own "
                      "reference); remove it or set source.kind: caller",
                      ref_kind);
    return;
  }
  if (cfg->reference.kind == REFIT_SOURCE_CALLER) {
    refit_config_rule(c, ROW(REFERENCE_KIND),
                      "reference.kind: caller is not a reference (the trainer's "
                      "weights cannot check themselves); use synthetic, hdf5 "
                      "or safetensors");
    return;
  }
  if (!caller)
    return;
  const bool ref_file = refit_config_kind_has_path(cfg->reference.kind);
  if (ref_file && cfg->reference.path[0] == '\0')
    refit_config_rule(c, ROW(REFERENCE_KIND),
                      "reference.path: required when reference.kind is %s",
                      ref_kind);
  else if (!ref_file && cfg->reference.path[0] != '\0')
    refit_config_rule(c, ROW(REFERENCE_PATH),
                      "reference.path: given but reference.kind is synthetic; "
                      "remove it or set reference.kind: hdf5 or safetensors");
}

/* trainer.layout auto means megatron for caller-owned weights (a live
 * trainer holds Megatron-Core's tensors) and hf for the made-up and
 * checkpoint sources. The Megatron keys mean nothing under hf names. */
static void refit_config_check_names(refit_config_ctx_t *c) {
  refit_trainer_layout_t *t = &c->cfg.trainer;
  if (!ROWS_OK(ROW(TRAINER_LAYOUT), ROW(SOURCE_KIND)))
    return;
  if (t->names == REFIT_TRAINER_NAMES_AUTO)
    t->names = c->cfg.source.kind == REFIT_SOURCE_CALLER ? REFIT_TRAINER_NAMES_MEGATRON
                                                          : REFIT_TRAINER_NAMES_HF;
  /* Values, not presence: refit_config_format writes every key. */
  const struct {
    int row;
    bool set;
  } megatron_only[] = {
      {ROW(TRAINER_SPEC), t->spec != REFIT_SPEC_TE},
      {ROW(TRAINER_EXPERTS), t->experts != REFIT_EXPERTS_AUTO},
      {ROW(TRAINER_NAME_PREFIX), t->name_prefix[0] != '\0'},
      {ROW(TRAINER_VOCAB_DIVISIBLE_BY), t->vocab_divisible_by != 128},
  };
  if (t->names == REFIT_TRAINER_NAMES_HF)
    for (size_t i = 0; i < sizeof(megatron_only) / sizeof(megatron_only[0]); i++)
      if (megatron_only[i].set && ROWS_OK(megatron_only[i].row))
        refit_config_rule(c, megatron_only[i].row,
                          "%s: set but the trainer holds Hugging Face names "
                          "(trainer.layout hf); remove it or set "
                          "trainer.layout: megatron",
                          refit_config_row_path(&refit_config_rows[megatron_only[i].row]));
  if (ROWS_OK(ROW(TRAINER_EXPERTS), ROW(MODEL_FAMILY)) &&
      c->cfg.model.family == REFIT_FAMILY_QWEN3 && t->experts != REFIT_EXPERTS_AUTO)
    refit_config_rule(c, ROW(TRAINER_EXPERTS),
                      "trainer.experts: given but model.family is qwen3 "
                      "(dense); remove it");
}

/* ---- MXFP8 shape rules ----------------------------------------------------
 */

/*
 * MXFP8 keeps one E8M0 scale per REFIT_MXFP8_BLOCK elements along K (a
 * weight's input dimension), so every quantized K must be a multiple of the
 * block, and so must every trainer shard boundary along K: a row-parallel
 * shard that cut a block would need a scale that neither side owns. On top
 * of that the generator's kernels have their own rules (kernels/layout.h),
 * which are asked here rather than restated. The tensors checked are the
 * generator's runtime tensors that the catalog holds and
 * refit_config_quantizes() marks: what the generator will quantize.
 */

/* Does an ignore entry name whole dotted segments of `module`? */
static bool refit_config_module_matches(const char *module, const char *entry) {
  size_t n = strlen(entry);
  for (const char *p = module; n > 0 && (p = strstr(p, entry)) != NULL; p++)
    if ((p == module || p[-1] == '.') && (p[n] == '\0' || p[n] == '.'))
      return true;
  return false;
}

/* A runtime tensor's name for every layer at once:
 * "model.layers.*.self_attn.qkv_proj.weight". */
static void refit_config_tensor_pattern(const char *name, char *buf, size_t n) {
  const char *layer = strstr(name, "layers.");
  const char *end = layer ? layer + strlen("layers.") : NULL;
  if (end == NULL || !isdigit((unsigned char)*end)) {
    snprintf(buf, n, "%s", name);
    return;
  }
  const char *rest = end;
  while (isdigit((unsigned char)*rest))
    rest++;
  snprintf(buf, n, "%.*s*%s", (int)(end - name), name, rest);
}

/* The module of tensor pattern `tensor`: its name less the last segment. */
static void refit_config_tensor_module(const char *tensor, char *buf, size_t n) {
  const char *dot = strrchr(tensor, '.');
  snprintf(buf, n, "%.*s", dot ? (int)(dot - tensor) : (int)strlen(tensor), tensor);
}

/* The module of runtime tensor g within its layer ("self_attn.qkv_proj",
 * "mlp.experts"), or "" for a tensor MXFP8 never quantizes or one outside
 * layer 0. */
static void refit_config_layer_module(const refit_gen_tensor_t *g, char *buf, size_t n) {
  const char *prefix = "model.layers.0.";
  buf[0] = '\0';
  if (g->kind != REFIT_GEN_PLAIN && g->layer == 0 &&
      strncmp(g->name, prefix, strlen(prefix)) == 0)
    refit_config_tensor_module(g->name + strlen(prefix), buf, n);
}

/* The modules that MXFP8 can quantize, for messages:
 * "self_attn.qkv_proj, self_attn.o_proj, mlp.experts". */
static void refit_config_quantizable_modules(const refit_catalog_t *cat, char *buf,
                                             size_t n) {
  size_t off = 0;
  buf[0] = '\0';
  for (int64_t i = cat->gen_begin[0]; i < cat->gen_begin[1] && off < n; i++) {
    char module[REFIT_NAME_MAX], earlier[REFIT_NAME_MAX];
    bool again = false;
    refit_config_layer_module(&cat->gen[i], module, sizeof(module));
    for (int64_t j = cat->gen_begin[0]; module[0] && !again && j < i; j++) {
      refit_config_layer_module(&cat->gen[j], earlier, sizeof(earlier));
      again = strcmp(module, earlier) == 0;
    }
    if (module[0] && !again)
      off += (size_t)snprintf(buf + off, n - off, "%s%s", off ? ", " : "", module);
  }
}

/*
 * refit.quantization_ignore names runtime modules (vLLM's names, as
 * refit_config_quantizes matches them): an entry that matches none would
 * leave the module the person meant quantized. The default's entries are
 * exempt ([lm_head] has nothing to match when the embeddings are tied).
 */
static void refit_config_check_ignore(refit_config_ctx_t *c, const refit_catalog_t *cat) {
  const refit_config_t *cfg = &c->cfg;
  refit_config_t defaults;
  refit_config_defaults(&defaults);
  for (int e = 0; e < cfg->refit.quantization_ignore_count; e++) {
    const char *entry = cfg->refit.quantization_ignore[e];
    bool known = false;
    for (int d = 0; d < defaults.refit.quantization_ignore_count; d++)
      known |= strcmp(entry, defaults.refit.quantization_ignore[d]) == 0;
    for (int64_t i = cat->gen_begin[0]; !known && i < cat->gen_begin[1]; i++)
      known = refit_config_module_matches(cat->gen[i].name, entry);
    if (known)
      continue;
    char shown[80], modules[512];
    refit_config_quote(entry, shown, sizeof(shown));
    refit_config_quantizable_modules(cat, modules, sizeof(modules));
    refit_config_problem(
        c,
        c->item_pos[e].line > 0 ? c->item_pos[e]
                                : refit_config_row_pos(c, ROW(REFIT_QUANTIZATION_IGNORE)),
        "refit.quantization_ignore[%d]: '%s' matches no module of the "
        "generator; entries name vLLM's runtime modules (the quantized ones "
        "of this model are %s)",
        e, shown, modules);
  }
}

/* How the K of a quantized runtime tensor is made, and what splits it. */
typedef struct {
  int64_t k;                        /* the whole K: the trainer tensor's columns */
  int model_row;                    /* the key K is made of */
  char expr[160];                   /* how K is made, for messages */
  int trainer_row;                  /* trainer.tp or trainer.etp */
  int64_t trainer_split, gen_split; /* 1 = not split */
} refit_config_kdim_t;

static void refit_config_kdim(const refit_config_ctx_t *c, const refit_catalog_t *cat,
                              const refit_gen_tensor_t *g, refit_config_kdim_t *k) {
  const refit_model_t *m = &c->cfg.model;
  const refit_src_tensor_t *src = &cat->src[cat->segs[g->seg_begin].src];
  k->k = src->cols;
  k->model_row = refit_config_field_row(g->k_field);
  k->trainer_row = g->role == REFIT_ROLE_EXPERT ? ROW(TRAINER_ETP) : ROW(TRAINER_TP);
  k->trainer_split = src->split == REFIT_SPLIT_COLS ? src->nparts : 1;
  k->gen_split = k->k / g->cols;
  if (g->k_field == REFIT_FIELD_MODEL_HEAD_DIM)
    snprintf(k->expr, sizeof(k->expr),
             "model.num_attention_heads * model.head_dim = %" PRId64 " * %" PRId64
             " = %" PRId64,
             m->num_attention_heads, m->head_dim, k->k);
  else
    snprintf(k->expr, sizeof(k->expr), "%s %" PRId64, refit_field_name(g->k_field), k->k);
}

/*
 * The rules of one K, for the tensor `g` chosen to stand for every quantized
 * tensor with that K. Returns false when the whole K breaks a rule (so the
 * MoE layout check, which uses it, stays quiet).
 */
static bool refit_config_check_kdim(refit_config_ctx_t *c, const refit_catalog_t *cat,
                                    const refit_gen_tensor_t *g) {
  const refit_kernels_dense_backend_t backend =
      (refit_kernels_dense_backend_t)c->cfg.refit.linear_backend;
  const bool dense = g->kind == REFIT_GEN_LINEAR;
  const int64_t n = g->rows;
  refit_config_kdim_t k;
  char tensor[REFIT_NAME_MAX + 8];
  refit_config_kdim(c, cat, g, &k);
  refit_config_tensor_pattern(g->name, tensor, sizeof(tensor));

  /* The whole K: the block, and the dense backend's own rule. */
  if (dense && refit_kernels_check_shape(backend, tensor, n, k.k) != REFIT_OK) {
    refit_config_rule(
        c, k.k % REFIT_MXFP8_BLOCK ? k.model_row : ROW(REFIT_LINEAR_BACKEND),
        "%s (K = %s; refit.precision mxfp8)", refit_last_error(), k.expr);
    return false;
  }
  if (!dense && k.k % REFIT_MXFP8_BLOCK != 0) {
    refit_config_rule(c, k.model_row,
                      "%s: K = %s is not a multiple of %d, the MXFP8 block "
                      "(one scale per %d elements along K; refit.precision "
                      "mxfp8)",
                      tensor, k.expr, REFIT_MXFP8_BLOCK, REFIT_MXFP8_BLOCK);
    return false;
  }

  /* Trainer shards: a shard boundary may not cut a scale block. */
  const int64_t kt = k.k / k.trainer_split;
  if (k.trainer_split > 1 && kt % REFIT_MXFP8_BLOCK != 0)
    refit_config_rule(c, k.trainer_row,
                      "%s: K = %s split over %s %" PRId64 " gives %" PRId64
                      " per rank, not a multiple of %d: a trainer shard "
                      "boundary would cut an MXFP8 scale block "
                      "(refit.precision mxfp8)",
                      tensor, k.expr,
                      refit_config_row_path(&refit_config_rows[k.trainer_row]),
                      k.trainer_split, kt, REFIT_MXFP8_BLOCK);

  /* Generator shards: what its dense kernels get (experts: see the MoE
   * layout check, whose rules include the block). */
  if (dense && k.gen_split > 1 &&
      refit_kernels_check_shape(backend, tensor, n, g->cols) != REFIT_OK)
    refit_config_rule(c, ROW(GENERATOR_TP),
                      "%s (K = %s split over generator.tp %" PRId64 " = %" PRId64
                      " per rank; refit.precision mxfp8)",
                      refit_last_error(), k.expr, k.gen_split, g->cols);
  return true;
}

/* The generator's experts (expert stack g, w13 or w2) in the TRTLLM-gen MoE
 * layout (refit.moe_backend). */
static void refit_config_check_moe_layout(refit_config_ctx_t *c,
                                          const refit_gen_tensor_t *g) {
  const refit_model_t *m = &c->cfg.model;
  const bool w13 = g->kind == REFIT_GEN_MOE_W13;
  const refit_kernels_moe_shape_t shape = {g->shape[0], w13 ? g->shape[2] : g->shape[1],
                                           w13 ? g->shape[1] / 2 : g->shape[2], 1};
  const int64_t split = m->moe_intermediate_size / shape.intermediate;
  char tensor[REFIT_NAME_MAX + 8], module[REFIT_NAME_MAX + 8];
  refit_config_tensor_pattern(g->name, tensor, sizeof(tensor));
  refit_config_tensor_module(tensor, module, sizeof(module));
  if (refit_kernels_moe_check_shape(&shape, module, NULL) == REFIT_OK)
    return;
  char why[512], expr[160];
  snprintf(why, sizeof(why), "%s", refit_last_error());
  /* Blame what a person would change: H, else the tp split, else I. */
  int blame = ROW(MODEL_HIDDEN_SIZE);
  if (m->hidden_size % 128 == 0) {
    refit_kernels_moe_shape_t whole = shape;
    whole.intermediate = m->moe_intermediate_size;
    blame = split > 1 && refit_kernels_moe_check_shape(&whole, NULL, NULL) ==
                             REFIT_OK
                ? ROW(GENERATOR_TP)
                : ROW(MODEL_MOE_INTERMEDIATE_SIZE);
  }
  if (split > 1)
    snprintf(expr, sizeof(expr),
             "I per generator rank = model.moe_intermediate_size %" PRId64
             " / generator.tp %" PRId64 " with generator.ep 1",
             m->moe_intermediate_size, split);
  else
    snprintf(expr, sizeof(expr),
             "I = model.moe_intermediate_size %" PRId64
             ", whole experts on each generator rank",
             m->moe_intermediate_size);
  refit_config_rule(c, blame,
                    "%s (%s; refit.moe_backend flashinfer_trtllm, "
                    "refit.precision mxfp8)",
                    why, expr);
}

/* Runs when the layout rules hold, so that the catalog can be built. */
static void refit_config_check_mxfp8(refit_config_ctx_t *c) {
  if (!ROWS_OK(ROW(REFIT_PRECISION), ROW(REFIT_LINEAR_BACKEND), ROW(REFIT_MOE_BACKEND),
               ROW(REFIT_QUANTIZATION_IGNORE)) ||
      c->cfg.refit.precision != REFIT_PRECISION_MXFP8 || !c->layout_ok)
    return;
  refit_catalog_t *cat = NULL;
  if (refit_catalog_create(&c->cfg.model, &c->cfg.trainer, &c->cfg.generator, &cat) !=
      REFIT_OK) {
    refit_config_rule(c, ROW(REFIT_PRECISION),
                      "refit.precision: mxfp8 needs the generator's tensors to "
                      "check their shapes, which cannot be described: %s",
                      refit_last_error());
    return;
  }
  refit_config_mark_quantized(&c->cfg, cat);
  refit_config_check_ignore(c, cat);
  /* One tensor of generator rank 0 per K (every rank has the same shapes):
   * the first quantized, one of the dense backend when there is one (its
   * rules are the strictest); and the first quantized expert stack. */
  const refit_gen_tensor_t *pick[REFIT_FIELD_COUNT] = {0}, *experts = NULL;
  for (int64_t i = cat->gen_begin[0]; i < cat->gen_begin[1]; i++) {
    const refit_gen_tensor_t *g = &cat->gen[i];
    if (!g->quantized)
      continue;
    const refit_gen_tensor_t **p = &pick[g->k_field];
    if (*p == NULL || ((*p)->kind != REFIT_GEN_LINEAR && g->kind == REFIT_GEN_LINEAR))
      *p = g;
    if (g->kind != REFIT_GEN_LINEAR && experts == NULL)
      experts = g;
  }
  bool whole_ok = true;
  for (int f = 0; f < REFIT_FIELD_COUNT; f++) {
    if (pick[f] == NULL)
      continue;
    const bool ok = refit_config_check_kdim(c, cat, pick[f]);
    if (f == REFIT_FIELD_MODEL_HIDDEN_SIZE ||
        f == REFIT_FIELD_MODEL_MOE_INTERMEDIATE_SIZE)
      whole_ok &= ok;
  }
  if (experts != NULL && whole_ok)
    refit_config_check_moe_layout(c, experts);
  refit_catalog_destroy(cat);
}

refit_status_t refit_config_check_quantizable(const refit_config_t *cfg,
                                              const refit_catalog_t *cat,
                                              const refit_gen_tensor_t *g) {
  refit_config_ctx_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_config_check_quantizable");
  c->filename = "";
  c->cfg = *cfg;
  if (g->kind == REFIT_GEN_PLAIN)
    refit_config_problem(c, (refit_config_pos_t){0, 0},
                         "%s: refit keeps it in bfloat16 (vLLM builds it without a "
                         "quantization method: an embedding, a norm, lm_head or the "
                         "MoE router)",
                         g->name);
  else if (refit_config_check_kdim(c, cat, g) && g->kind != REFIT_GEN_LINEAR)
    refit_config_check_moe_layout(c, g);
  refit_status_t st = REFIT_OK;
  if (c->oom) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_config_check_quantizable");
  } else if (c->nproblems > 0) {
    char text[2048];
    size_t used = 0;
    for (size_t i = 0; i < c->nproblems && used < sizeof(text); i++)
      used += (size_t)snprintf(text + used, sizeof(text) - used, "%s%s",
                               i ? "; " : "", c->problems[i].text);
    st = REFIT_ERR(REFIT_ERR_CONFIG, "%s", text);
  }
  for (size_t i = 0; i < c->nproblems; i++)
    free(c->problems[i].text);
  free(c->problems);
  free(c);
  return st;
}

/* ---- The refit section ----------------------------------------------------
 */

static void refit_config_check_refit(refit_config_ctx_t *c, int world_size) {
  const refit_config_t *cfg = &c->cfg;
  char precision[32];
  refit_config_choice_name(refit_config_rows[ROW(REFIT_PRECISION)].choices,
                           cfg->refit.precision, precision, sizeof(precision));
  if (ROWS_OK(ROW(REFIT_PREQUANTIZE), ROW(REFIT_PRECISION)) &&
      cfg->refit.prequantize && cfg->refit.precision != REFIT_PRECISION_MXFP8)
    refit_config_rule(c, ROW(REFIT_PREQUANTIZE),
                      "refit.prequantize: true needs refit.precision mxfp8, "
                      "got %s (a %s refit has nothing to quantize)",
                      precision, precision);
  refit_config_check_mxfp8(c);

  if (!cfg->refit.fault.enabled)
    return;
  if (world_size > 0 && ROWS_OK(ROW(REFIT_FAULT_RANK)) &&
      cfg->refit.fault.rank >= world_size)
    refit_config_rule(c, ROW(REFIT_FAULT_RANK),
                      "refit.fault.rank: %d is not a rank of this job "
                      "(world size %d, ranks 0..%d)",
                      cfg->refit.fault.rank, world_size, world_size - 1);
  if (ROWS_OK(ROW(REFIT_FAULT_PHASE), ROW(REFIT_PRECISION)) &&
      cfg->refit.fault.phase == REFIT_FAULT_PHASE_QUANTIZE &&
      cfg->refit.precision != REFIT_PRECISION_MXFP8)
    refit_config_rule(c, ROW(REFIT_FAULT_PHASE),
                      "refit.fault.phase: a %s refit has no quantize phase, "
                      "so the fault would never fire; use refit.precision "
                      "mxfp8 or another phase",
                      precision);
}

/* Every rule that relates several keys; each reports independently. */
static void refit_config_check_layout(refit_config_ctx_t *c, int world_size) {
  refit_config_check_names(c);
  refit_config_check_model(c);
  c->layout_ok = refit_config_check_layout_rules(c);
  refit_config_check_world(c, world_size);
  refit_config_check_source(c);
  refit_config_check_refit(c, world_size);
}


/* ------------------------------------------------------------------------ */
/* Entry points                                                              */
/* ------------------------------------------------------------------------ */

void refit_config_defaults(refit_config_t *cfg) {
  char why[128];
  memset(cfg, 0, sizeof(*cfg));
  for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++) {
    const refit_config_row_t *r = &refit_config_rows[i];
    if (r->default_text != NULL) {
      refit_config_value_status_t st = refit_config_value_parse(
          r, r->default_text, false, cfg, why, sizeof(why));
      (void)st; /* a table default always parses: test_config_defaults */
    }
  }
}

static int refit_config_problem_cmp(const void *a, const void *b) {
  const refit_config_problem_t *x = a, *y = b;
  if (x->line != y->line)
    return x->line < y->line ? -1 : 1;
  if (x->col != y->col)
    return x->col < y->col ? -1 : 1;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Load the YAML text; a syntax error becomes the only problem. */
static void refit_config_syntax_error(refit_config_ctx_t *c,
                                      const yaml_parser_t *parser) {
  refit_config_pos_t at;
  if (parser->error == YAML_MEMORY_ERROR) {
    c->oom = true;
    return;
  }
  if (parser->error == YAML_READER_ERROR) {
    /* Reader errors carry a byte offset, not a mark. */
    at = (refit_config_pos_t){1, 1};
    for (size_t i = 0; i < parser->problem_offset && i < c->len; i++) {
      if (c->text[i] == '\n') {
        at.line++;
        at.col = 1;
      } else {
        at.col++;
      }
    }
  } else {
    at = refit_config_mark_pos(parser->problem_mark);
  }
  const char *problem = parser->problem ? parser->problem : "unknown error";
  if (parser->error == YAML_READER_ERROR && parser->problem_value != -1)
    refit_config_problem(c, at, "syntax error: %s (byte 0x%02x)", problem,
                         (unsigned)parser->problem_value);
  else if (parser->context)
    refit_config_problem(c, at, "syntax error: %s, %s at line %d column %d",
                         problem, parser->context,
                         (int)parser->context_mark.line + 1,
                         (int)parser->context_mark.column + 1);
  else
    refit_config_problem(c, at, "syntax error: %s", problem);
}

/* Returns true when the document loaded; the caller deletes it. */
static bool refit_config_load_yaml(refit_config_ctx_t *c,
                                   yaml_document_t *doc) {
  yaml_parser_t parser;
  bool ok = false;
  if (!yaml_parser_initialize(&parser)) {
    c->oom = true;
    return false;
  }
  yaml_parser_set_input_string(&parser, (const unsigned char *)c->text, c->len);
  if (!yaml_parser_load(&parser, doc)) {
    refit_config_syntax_error(c, &parser);
    goto out;
  }
  /* A second document would be silently ignored: refuse it. */
  yaml_document_t next;
  if (!yaml_parser_load(&parser, &next)) {
    refit_config_syntax_error(c, &parser);
    yaml_document_delete(doc);
    goto out;
  }
  if (yaml_document_get_root_node(&next) != NULL) {
    refit_config_problem(
        c,
        refit_config_mark_pos(yaml_document_get_root_node(&next)->start_mark),
        "only one YAML document is expected; this is a second one");
    yaml_document_delete(&next);
    yaml_document_delete(doc);
    goto out;
  }
  yaml_document_delete(&next);
  ok = true;
out:
  yaml_parser_delete(&parser);
  return ok;
}

refit_status_t refit_config_parse(const char *text, size_t len,
                                  const char *filename, int world_size,
                                  refit_config_t *cfg, char **errors) {
  if (errors)
    *errors = NULL;
  if (text == NULL || cfg == NULL || world_size < 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_config_parse: NULL text or cfg, or negative "
                     "world_size %d",
                     world_size);
  refit_config_ctx_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_config_parse: out of memory");
  c->filename = filename ? filename : "<config>";
  c->text = text;
  c->len = len;
  refit_config_defaults(&c->cfg);
  for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++) {
    const char *s = refit_config_rows[i].section;
    if (s[0] != '\0' && refit_config_section_pos(c, s) == NULL &&
        c->nsections < REFIT_CONFIG_MAX_SECTIONS)
      c->sections[c->nsections++].name = s;
  }

  yaml_document_t doc;
  if (refit_config_load_yaml(c, &doc)) {
    refit_config_walk(c, &doc);
    yaml_document_delete(&doc);
    refit_config_read_hf(c);
    refit_config_check_required(c);
    refit_config_check_layout(c, world_size);
  }

  refit_status_t status = REFIT_OK;
  char *out = NULL;
  if (c->oom) {
    status = REFIT_ERR(REFIT_ERR_NO_MEMORY,
                       "%s: out of memory while parsing the configuration",
                       c->filename);
  } else if (c->nproblems > 0) {
    size_t total = 1;
    qsort(c->problems, c->nproblems, sizeof(*c->problems),
          refit_config_problem_cmp);
    for (size_t i = 0; i < c->nproblems; i++) {
      total += strlen(c->filename) + strlen(c->problems[i].text) + 32;
    }
    status = REFIT_ERR_CONFIG;
    out = malloc(total);
    if (out == NULL) {
      status =
          REFIT_ERR(REFIT_ERR_NO_MEMORY,
                    "%s: out of memory while reporting problems", c->filename);
    } else {
      size_t off = 0;
      for (size_t i = 0; i < c->nproblems; i++)
        off += (size_t)snprintf(out + off, total - off, "%s:%d:%d: %s\n",
                                c->filename, c->problems[i].line,
                                c->problems[i].col, c->problems[i].text);
      /* refit_last_error() gets the list too (truncated to its buffer). */
      REFIT_ERR(status, "%s", out);
    }
  } else {
    *cfg = c->cfg;
  }

  for (size_t i = 0; i < c->nproblems; i++)
    free(c->problems[i].text);
  free(c->problems);
  free(c);
  if (errors)
    *errors = out;
  else
    free(out);
  return status;
}

static refit_status_t refit_config_error_out(char **errors,
                                             refit_status_t status,
                                             const char *fmt, ...)
    REFIT_PRINTF(3, 4);

/* Record a failure and hand the same sentence back through *errors. */
static refit_status_t refit_config_error_out(char **errors,
                                             refit_status_t status,
                                             const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  refit_error_setv(status, fmt, ap);
  va_end(ap);
  if (errors) {
    size_t n = strlen(refit_last_error());
    *errors = malloc(n + 2);
    if (*errors)
      snprintf(*errors, n + 2, "%s\n", refit_last_error());
  }
  return status;
}

refit_status_t refit_config_load(const char *path, int world_size,
                                 refit_config_t *cfg, char **errors,
                                 char **text_out, size_t *len_out) {
  if (errors)
    *errors = NULL;
  if (path == NULL || cfg == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_config_load: NULL path or cfg");
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return refit_config_error_out(errors, REFIT_ERR_SYSTEM,
                                  "%s: cannot open the configuration: %s", path,
                                  strerror(errno));
  char *text = NULL;
  size_t len = 0, cap = 0;
  refit_status_t status = REFIT_OK;
  for (;;) {
    if (cap - len < 4096 + 1) {
      size_t ncap = cap ? 2 * cap : 8192;
      char *p = realloc(text, ncap);
      if (p == NULL) {
        status = refit_config_error_out(errors, REFIT_ERR_NO_MEMORY,
                                        "%s: out of memory reading the "
                                        "configuration",
                                        path);
        goto err_free_text;
      }
      text = p;
      cap = ncap;
    }
    size_t got = fread(text + len, 1, cap - len - 1, f);
    len += got;
    if (got == 0)
      break;
  }
  if (ferror(f)) {
    status = refit_config_error_out(errors, REFIT_ERR_SYSTEM,
                                    "%s: cannot read the configuration: %s",
                                    path, strerror(errno));
    goto err_free_text;
  }
  text[len] = '\0';
  fclose(f);
  f = NULL;

  status = refit_config_parse(text, len, path, world_size, cfg, errors);
  if (status != REFIT_OK)
    goto err_free_text;
  if (text_out)
    *text_out = text;
  else
    free(text);
  if (len_out)
    *len_out = len;
  return REFIT_OK;

err_free_text:
  free(text);
  if (f)
    fclose(f);
  return status;
}

uint64_t refit_config_hash(const refit_config_t *cfg) {
  uint64_t h = REFIT_HASH_INIT;
  char value[REFIT_CONFIG_TEXT_MAX];
  for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++) {
    const refit_config_row_t *r = &refit_config_rows[i];
    const char *path = refit_config_row_path(r);
    if (!refit_config_row_live(cfg, r))
      continue; /* inside an optional section that is not given */
    refit_config_value_format(r, cfg, true, value, sizeof(value));
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
static void refit_config_format_open(FILE *f, const char *open,
                                     const char *section) {
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
    int id = refit_config_section_row(section);
    fprintf(f, "%*s%.*s:", 2 * depth, "", len, p);
    if (id >= 0 && dot == NULL)
      fprintf(f, "  # %s", refit_config_rows[id].doc);
    fputc('\n', f);
    p += len + (dot != NULL);
  }
}

refit_status_t refit_config_format(const refit_config_t *cfg, char **out) {
  char *buf = NULL;
  size_t size = 0;
  char value[REFIT_CONFIG_TEXT_MAX];
  if (cfg == NULL || out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_config_format: NULL argument");
  FILE *f = open_memstream(&buf, &size);
  if (f == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_config_format: %s",
                     strerror(errno));
  const char *open = "";
  for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++) {
    const refit_config_row_t *r = &refit_config_rows[i];
    /* A SECTION row is written as the header of its keys. */
    if (r->type == REFIT_CONFIG_TYPE_SECTION || !refit_config_row_live(cfg, r))
      continue;
    if (strcmp(open, r->section) != 0) {
      refit_config_format_open(f, open, r->section);
      open = r->section;
    }
    int depth = 0;
    for (const char *p = r->section; *p; p++)
      depth += *p == '.';
    depth += r->section[0] != '\0';
    refit_config_value_format(r, cfg, true, value, sizeof(value));
    fprintf(f, "%*s%s: %s  # %s\n", 2 * depth, "", r->key, value, r->doc);
  }
  if (fclose(f) != 0 || buf == NULL) {
    free(buf);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_config_format: out of memory");
  }
  *out = buf;
  return REFIT_OK;
}

/* ---- What the config means for the plan --------------------------------- */

int refit_config_quantizes(const refit_config_t *cfg, const refit_gen_tensor_t *g) {
  if (cfg->refit.precision != REFIT_PRECISION_MXFP8 || g->kind == REFIT_GEN_PLAIN)
    return 0;
  for (int i = 0; i < cfg->refit.quantization_ignore_count; i++)
    if (refit_config_module_matches(g->name, cfg->refit.quantization_ignore[i]))
      return 0;
  return 1;
}

void refit_config_mark_quantized(const refit_config_t *cfg, refit_catalog_t *cat) {
  const int64_t n = cat->gen_begin[cat->generator.tp];
  for (int64_t i = 0; i < n; i++)
    cat->gen[i].quantized = refit_config_quantizes(cfg, &cat->gen[i]);
}


void refit_config_plan_options(const refit_config_t *cfg,
                               refit_plan_options_t *opt) {
  memset(opt, 0, sizeof(*opt));
  opt->bucket_bytes = cfg->refit.bucket_bytes;
  opt->wire = cfg->refit.prequantize ? REFIT_WIRE_MXFP8 : REFIT_WIRE_BF16;
  opt->chunk_trailer = cfg->refit.digests ? 8 : 0;
  opt->per_tensor_buckets = cfg->refit.baseline;
  opt->arena_bytes = cfg->refit.arena_bytes;
}
