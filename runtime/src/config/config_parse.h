/*
 * The configuration engine: a YAML file read against a table of fields.
 *
 * A table is an array of rows (refit_config_row_t), each one key of the
 * file: its section, name, type, where its value lands in the caller's
 * struct (an offset), its default, bounds, choices and doc. The engine knows
 * no model and no refit key: it parses, describes, formats and hashes any
 * value a row types (config_value.c), and walks a libyaml document against
 * the rows (config_parse.c), collecting every problem with the line and
 * column of the text that caused it. The refit keys are the table in
 * config_table.h; the rules between them are config_rules.c's.
 *
 * Sections nest: a SECTION row ("refit.fault") is an optional mapping inside
 * its parent, and the walk, the unknown-key suggestions, the required-key
 * check, the hash and the formatter treat it like a top-level section.
 */
#ifndef REFIT_CONFIG_PARSE_H
#define REFIT_CONFIG_PARSE_H

#include "core/error.h"
#include "refit/status.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- Rows ---------------------------------------------------------------- */

typedef enum {
  REFIT_CONFIG_TYPE_INT,         /* int or int64_t, within [min, max] */
  REFIT_CONFIG_TYPE_U64,         /* uint64_t, any */
  REFIT_CONFIG_TYPE_BYTES,       /* uint64_t size with units ("256MiB") */
  REFIT_CONFIG_TYPE_DOUBLE,      /* > min (>= with MIN_INCLUSIVE), <= max */
  REFIT_CONFIG_TYPE_BOOL,        /* an int, 0 or 1 */
  REFIT_CONFIG_TYPE_ENUM,        /* an int: the index of a "a|b|c" choice */
  REFIT_CONFIG_TYPE_STRING,      /* char[size] */
  REFIT_CONFIG_TYPE_STRING_LIST, /* char[cap][item_size] and an int count */
  REFIT_CONFIG_TYPE_SECTION      /* an optional mapping; an int: given */
} refit_config_type_t;

/* Row flags. */
#define REFIT_CONFIG_REQUIRED 1u      /* no default: the file must give it */
#define REFIT_CONFIG_MIN_INCLUSIVE 2u /* DOUBLE: min itself is allowed */

typedef struct {
  const char *dotted;  /* SECTION "." KEY; use refit_config_row_path() */
  const char *section; /* the mapping the key is in, "" for the top level */
  const char *key;
  refit_config_type_t type;
  size_t offset;            /* of the value in the caller's struct */
  size_t size;              /* of the value */
  size_t count_offset;      /* STRING_LIST: where its item count (an int) lives */
  size_t item_size;         /* STRING_LIST: bytes of one item, NUL included */
  const char *default_text; /* YAML text; NULL when the key is required */
  int64_t min, max;
  const char *choices; /* ENUM: "name|name|..." */
  unsigned flags;
  const char *doc;
} refit_config_row_t;

/* A table: the rows of one kind of file, in the order they are formatted. */
typedef struct {
  const refit_config_row_t *rows;
  int nrows;
} refit_config_table_t;

/* Room for any value as YAML text (refit_config_value_format with quotes):
 * the table that defines a long string or list asserts that it fits. */
#define REFIT_CONFIG_TEXT_MAX 8192

/* "model.hidden_size", or "verify" for a top-level key. */
const char *refit_config_row_path(const refit_config_row_t *r);

/* The integer value of an INT, BOOL, ENUM or SECTION row in `target`. */
int64_t refit_config_row_int(const refit_config_row_t *r, const void *target);
void refit_config_row_set_int(const refit_config_row_t *r, void *target, int64_t v);

/* The row `key` of `section` ("" = top level), the row of dotted `path`
 * ("model.hidden_size"), the SECTION row of section `name`: or -1. */
int refit_config_table_find(const refit_config_table_t *t, const char *section,
                            const char *key);
int refit_config_table_path(const refit_config_table_t *t, const char *path);
int refit_config_table_section_row(const refit_config_table_t *t, const char *name);

/* Does `target` use row r, i.e. is every optional section around it given? */
bool refit_config_table_live(const refit_config_table_t *t, const void *target,
                             const refit_config_row_t *r);

/* Every row's default into `target` (which the caller zeroed first). */
void refit_config_table_defaults(const refit_config_table_t *t, void *target);

/* 64-bit FNV-1a over every live row: its path and its value as YAML. */
uint64_t refit_config_table_hash(const refit_config_table_t *t, const void *target);

/* Every live row as YAML with its doc as a comment; the text parses back to
 * an equal `target`. *out is malloc'd. Errors: REFIT_ERR_NO_MEMORY. */
refit_status_t refit_config_table_format(const refit_config_table_t *t,
                                         const void *target, char **out);

/* ---- One value ----------------------------------------------------------- */

/* A size: see refit_config_parse_bytes (config.h). Does not touch the
 * thread's last error; `why` explains a failure. 0 on success. */
int refit_config_bytes_parse(const char *text, uint64_t *bytes, char *why,
                             size_t why_len);

/* Is a plain scalar YAML null ("", "~", "null")? */
bool refit_config_is_null(const char *text);

/* Index of `text` in a "a|b|c" choice list, or -1; the n-th name of a
 * choice list into buf ("" when out of range). */
int refit_config_choice_index(const char *choices, const char *text);
void refit_config_choice_name(const char *choices, int64_t index, char *buf, size_t n);

/* The closest candidate to `name`, if close enough to be a plausible typo. */
const char *refit_config_suggest(const char *name, const char *const *cands, size_t n);

/* A value as it appears in a message: truncated, newlines made visible. */
void refit_config_quote(const char *text, char *buf, size_t n);

typedef enum {
  REFIT_CONFIG_VALUE_OK = 0,
  REFIT_CONFIG_VALUE_INVALID, /* not of the row's type, or below its minimum */
  REFIT_CONFIG_VALUE_TOO_BIG  /* above the row's maximum */
} refit_config_value_status_t;

/*
 * Parse `text` as the value of row r into `target`. `plain` says whether the
 * scalar was written unquoted (only plain scalars can be YAML null). `why`
 * receives extra detail for some failures. `target` is untouched on failure.
 * A STRING_LIST value here is a table default, "[a, b]" with plain names.
 */
refit_config_value_status_t refit_config_value_parse(const refit_config_row_t *r,
                                                     const char *text, bool plain,
                                                     void *target, char *why,
                                                     size_t why_len);

/* Whether `v` is within the bounds of INT row r: the check of
 * refit_config_value_parse, for values that come from elsewhere than YAML
 * text (model.hf_config). */
refit_config_value_status_t refit_config_value_check_int(const refit_config_row_t *r,
                                                         int64_t v);

/* What row r accepts, as a phrase that follows "expected ". */
void refit_config_value_expect(const refit_config_row_t *r, bool too_big, char *buf,
                               size_t n);

/* The value of row r in `target` as YAML text (strings double-quoted when
 * `quote`). */
void refit_config_value_format(const refit_config_row_t *r, const void *target,
                               bool quote, char *buf, size_t n);

/* ---- Lists of strings ---------------------------------------------------- */

int refit_config_list_count(const refit_config_row_t *r, const void *target);
const char *refit_config_list_item(const refit_config_row_t *r, const void *target,
                                   int i);
void refit_config_list_clear(const refit_config_row_t *r, void *target);

typedef enum {
  REFIT_CONFIG_ITEM_OK = 0,
  REFIT_CONFIG_ITEM_EMPTY,
  REFIT_CONFIG_ITEM_TOO_LONG,
  REFIT_CONFIG_ITEM_FULL,
  REFIT_CONFIG_ITEM_DUPLICATE /* *first is the index of the earlier copy */
} refit_config_item_status_t;

/* Append `len` bytes of `text` to list row r; the one place items are
 * checked, for table defaults and files alike. */
refit_config_item_status_t refit_config_list_add(const refit_config_row_t *r,
                                                 void *target, const char *text,
                                                 size_t len, int *first);

/* What a plain YAML scalar means when it is not a string (null, a boolean,
 * a number), as a phrase; NULL for a string. */
const char *refit_config_plain_kind(const char *text);

/* ---- The walk ------------------------------------------------------------ */

typedef struct {
  int line, col; /* 1-based; line 0 = not present in the file */
} refit_config_pos_t;

typedef struct {
  int line, col; /* 1-based */
  size_t seq;    /* order of detection, to keep sorting stable */
  char *text;
} refit_config_problem_t;

/* What the walk learned about one row. */
typedef struct {
  refit_config_pos_t pos; /* of its key; line 0 = not in the file */
  bool bad;               /* reported already, or missing: rules leave it alone */
  /* The value was read from another file, under this name there (the model
   * keys of model.hf_config): it is not missing. NULL otherwise. */
  const char *elsewhere;
  /* STRING_LIST: where each item is; line 0 for a default's items. */
  refit_config_pos_t *items;
} refit_config_key_t;

#define REFIT_CONFIG_MAX_SECTIONS 8
#define REFIT_CONFIG_MAX_ROWS 128

typedef struct {
  const char *name;       /* "refit", "refit.fault" */
  refit_config_pos_t pos; /* of its key; line 0 = not in the file */
  bool malformed;         /* not a mapping: already reported */
} refit_config_section_t;

typedef struct {
  const refit_config_table_t *table;
  void *target; /* the struct the rows' offsets point into */
  const char *filename;
  const char *text;
  size_t len;
  refit_config_key_t keys[REFIT_CONFIG_MAX_ROWS]; /* one per row */
  refit_config_section_t sections[REFIT_CONFIG_MAX_SECTIONS];
  size_t nsections;
  refit_config_problem_t *problems;
  size_t nproblems, cap;
  bool oom;
} refit_config_parser_t;

/*
 * Prepare a walk of `len` bytes of `text` (NULL when there is none: only
 * problems are collected) into `target`, which already holds the defaults.
 * `filename` is used only in messages. Errors: REFIT_ERR_NO_MEMORY.
 */
refit_status_t refit_config_parser_init(refit_config_parser_t *c,
                                        const refit_config_table_t *table,
                                        const char *filename, const char *text,
                                        size_t len, void *target);
void refit_config_parser_fini(refit_config_parser_t *c);

/* Load the YAML document and walk it: syntax, unknown and duplicate keys,
 * types and bounds. False when the text is no YAML document (reported). */
bool refit_config_parser_read(refit_config_parser_t *c);

/* Report the required keys that are neither in the file nor `elsewhere`
 * (and mark them bad). */
void refit_config_parser_check_required(refit_config_parser_t *c);

/* Collect a problem at `at` (line 0: at 1:1). Out of memory sets c->oom. */
void refit_config_problem(refit_config_parser_t *c, refit_config_pos_t at,
                          const char *fmt, ...) REFIT_PRINTF(3, 4);
void refit_config_problemv(refit_config_parser_t *c, refit_config_pos_t at,
                           const char *fmt, va_list ap) REFIT_PRINTF(3, 0);

/* The position of section `name` (NULL for no such section). */
refit_config_pos_t *refit_config_section_pos(refit_config_parser_t *c, const char *name);

/* Where to point at row `id`: its key, else its section's key, else 1:1. */
refit_config_pos_t refit_config_key_pos(refit_config_parser_t *c, int id);

/*
 * The problems, sorted by position, as one malloc'd string of
 * "file:line:col: message" lines into *errors (NULL when there are none),
 * also set as the last error. REFIT_OK when there are none, else
 * REFIT_ERR_CONFIG, or REFIT_ERR_NO_MEMORY when the walk or the report ran
 * out of memory.
 */
refit_status_t refit_config_parser_report(refit_config_parser_t *c, char **errors);

#endif /* REFIT_CONFIG_PARSE_H */
