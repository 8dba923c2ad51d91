/*
 * The walk of a YAML document against a configuration table
 * (config_parse.h). libyaml loads the document; every mapping key is looked
 * up in the table, its value parsed as the row types it (config_value.c),
 * and every problem is collected with the position of the text that caused
 * it: syntax, unknown keys (with the closest key as a suggestion), duplicate
 * keys and sections, types, bounds and missing required keys. The whole list
 * is reported at once, sorted by position, as "file:line:col: message"
 * lines, so that a person fixes a bad file in one round trip. The rules
 * between keys are the caller's, run on the parsed struct afterwards; a row
 * already reported is marked bad so that they leave it alone.
 */
#include "config/config_parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* ------------------------------------------------------------------------ */
/* Collected problems                                                        */
/* ------------------------------------------------------------------------ */

void refit_config_problemv(refit_config_parser_t *c, refit_config_pos_t at,
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
  c->problems[c->nproblems] =
      (refit_config_problem_t){at.line, at.col, c->nproblems, text};
  c->nproblems++;
}

void refit_config_problem(refit_config_parser_t *c, refit_config_pos_t at,
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
static int refit_config_section_find(const refit_config_parser_t *c, const char *name) {
  for (size_t i = 0; i < c->nsections; i++)
    if (strcmp(c->sections[i].name, name) == 0)
      return (int)i;
  return -1;
}

refit_config_pos_t *refit_config_section_pos(refit_config_parser_t *c, const char *name) {
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

refit_config_pos_t refit_config_key_pos(refit_config_parser_t *c, int id) {
  if (c->keys[id].pos.line > 0)
    return c->keys[id].pos;
  refit_config_pos_t *s = refit_config_section_pos(c, c->table->rows[id].section);
  if (s && s->line > 0)
    return *s;
  return (refit_config_pos_t){1, 1};
}

/*
 * Report an unknown key in `section` ("" = top level): suggest the closest
 * key of that level, else the same key in another section, else list the
 * level's keys.
 */
static void refit_config_unknown_key(refit_config_parser_t *c, refit_config_pos_t at,
                                     const char *section, const char *name) {
  const char *cands[REFIT_CONFIG_MAX_ROWS + REFIT_CONFIG_MAX_SECTIONS];
  size_t n = 0;
  /* Sections inside this one that no SECTION row of it already names. */
  for (size_t i = 0; i < c->nsections; i++)
    if (refit_config_section_in(c->sections[i].name, section) &&
        refit_config_table_section_row(c->table, c->sections[i].name) < 0)
      cands[n++] = refit_config_section_key(c->sections[i].name);
  for (int i = 0; i < c->table->nrows; i++)
    if (strcmp(c->table->rows[i].section, section) == 0)
      cands[n++] = c->table->rows[i].key;

  char path[160];
  snprintf(path, sizeof(path), "%s%s%.100s", section, section[0] ? "." : "", name);
  const char *close = refit_config_suggest(name, cands, n);
  if (close) {
    refit_config_problem(c, at, "unknown key '%s' (did you mean '%s'?)", path, close);
    return;
  }
  for (int i = 0; i < c->table->nrows; i++) {
    const refit_config_row_t *r = &c->table->rows[i];
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
    off +=
        (size_t)snprintf(list + off, sizeof(list) - off, "%s%s", i ? ", " : "", cands[i]);
  refit_config_problem(c, at, "unknown key '%s'; valid %s%s keys are: %s", path, section,
                       section[0] ? "" : "top-level", list);
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
static void refit_config_read_list(refit_config_parser_t *c, int id, yaml_document_t *doc,
                                   const yaml_node_t *value) {
  const refit_config_row_t *r = &c->table->rows[id];
  const char *path = refit_config_row_path(r);
  const size_t cap = r->size / r->item_size;
  char shown[80], item[64];
  refit_config_choice_name(r->choices, 0, item, sizeof(item));
  if (value->type != YAML_SEQUENCE_NODE) {
    char expect[160];
    shown[0] = '\0';
    if (value->type == YAML_SCALAR_NODE)
      refit_config_quote((const char *)value->data.scalar.value, shown, sizeof(shown));
    refit_config_value_expect(r, false, expect, sizeof(expect));
    refit_config_problem(c, refit_config_mark_pos(value->start_mark),
                         "%s: expected %s, got %s%s%s%s", path, expect,
                         refit_config_node_kind(value), shown[0] ? " '" : "", shown,
                         shown[0] ? "'" : "");
    c->keys[id].bad = true;
    return;
  }
  refit_config_list_clear(r, c->target);
  size_t index = 0;
  for (yaml_node_item_t *it = value->data.sequence.items.start;
       it < value->data.sequence.items.top; it++, index++) {
    const yaml_node_t *node = yaml_document_get_node(doc, *it);
    const refit_config_pos_t at = refit_config_mark_pos(node->start_mark);
    if (index == cap) {
      refit_config_problem(
          c, at, "%s: at most %zu entries, got %zu", path, cap,
          (size_t)(value->data.sequence.items.top - value->data.sequence.items.start));
      c->keys[id].bad = true;
      return;
    }
    if (node->type != YAML_SCALAR_NODE) {
      refit_config_problem(c, at, "%s[%zu]: expected a %s (a string), got %s", path,
                           index, item, refit_config_node_kind(node));
      c->keys[id].bad = true;
      continue;
    }
    const char *text = (const char *)node->data.scalar.value;
    const char *kind = node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE
                           ? refit_config_plain_kind(text)
                           : NULL;
    int first = 0;
    refit_config_item_status_t st =
        kind
            ? REFIT_CONFIG_ITEM_OK
            : refit_config_list_add(r, c->target, text, node->data.scalar.length, &first);
    refit_config_quote(text, shown, sizeof(shown));
    if (kind) {
      refit_config_problem(c, at,
                           "%s[%zu]: expected a %s (a string), got %s '%s' (quote "
                           "it if it is a name)",
                           path, index, item, kind, shown);
    } else if (st == REFIT_CONFIG_ITEM_EMPTY ||
               strlen(text) != node->data.scalar.length) {
      refit_config_problem(c, at, "%s[%zu]: expected a %s, got '%s'", path, index, item,
                           shown);
    } else if (st == REFIT_CONFIG_ITEM_TOO_LONG) {
      refit_config_problem(c, at,
                           "%s[%zu]: expected a %s shorter than %zu bytes, got '%s'",
                           path, index, item, r->item_size, shown);
    } else if (st == REFIT_CONFIG_ITEM_DUPLICATE) {
      refit_config_problem(c, at,
                           "%s[%zu]: '%s' is listed twice (first as "
                           "%s[%d])",
                           path, index, shown, path, first);
    } else {
      /* REFIT_CONFIG_ITEM_OK; FULL cannot happen below cap */
      const int n = refit_config_list_count(r, c->target);
      c->keys[id].items[n - 1] = at;
      continue;
    }
    c->keys[id].bad = true;
  }
}

static void refit_config_read_value(refit_config_parser_t *c, int id,
                                    yaml_document_t *doc, const yaml_node_t *key,
                                    const yaml_node_t *value) {
  const refit_config_row_t *r = &c->table->rows[id];
  refit_config_pos_t at = refit_config_mark_pos(value->start_mark);
  char expect[160], why[160], shown[80];
  if (c->keys[id].pos.line > 0) {
    refit_config_problem(c, refit_config_mark_pos(key->start_mark),
                         "duplicate key '%s' (first set at line %d column %d)",
                         refit_config_row_path(r), c->keys[id].pos.line,
                         c->keys[id].pos.col);
    return;
  }
  c->keys[id].pos = refit_config_mark_pos(key->start_mark);
  if (r->type == REFIT_CONFIG_TYPE_STRING_LIST) {
    refit_config_read_list(c, id, doc, value);
    return;
  }
  if (value->type != YAML_SCALAR_NODE) {
    refit_config_value_expect(r, false, expect, sizeof(expect));
    refit_config_problem(c, at, "%s: expected %s, got %s", refit_config_row_path(r),
                         expect, refit_config_node_kind(value));
    c->keys[id].bad = true;
    return;
  }
  const char *text = (const char *)value->data.scalar.value;
  bool plain = value->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
  refit_config_value_status_t st =
      strlen(text) != value->data.scalar.length
          ? REFIT_CONFIG_VALUE_INVALID
          : refit_config_value_parse(r, text, plain, c->target, why, sizeof(why));
  if (st == REFIT_CONFIG_VALUE_OK)
    return;
  c->keys[id].bad = true;
  refit_config_value_expect(r, st == REFIT_CONFIG_VALUE_TOO_BIG, expect, sizeof(expect));
  refit_config_quote(text, shown, sizeof(shown));
  refit_config_problem(c, at, "%s: expected %s, got '%s'%s%s%s", refit_config_row_path(r),
                       expect, shown, why[0] ? " (" : "", why, why[0] ? ")" : "");
}

static void refit_config_walk_keys(refit_config_parser_t *c, yaml_document_t *doc,
                                   const char *name, const yaml_node_t *map);

/*
 * Walk the mapping of section `name` (sections[si]). Returns true when the
 * file gives it as a mapping; an empty value ("trainer:") means all defaults
 * and returns false, and so does anything else, which is reported.
 */
static bool refit_config_walk_section(refit_config_parser_t *c, yaml_document_t *doc,
                                      size_t si, const yaml_node_t *map) {
  const char *name = c->sections[si].name;
  if (map->type == YAML_SCALAR_NODE &&
      map->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
      refit_config_is_null((const char *)map->data.scalar.value))
    return false; /* "trainer:" with nothing under it: all defaults */
  if (map->type != YAML_MAPPING_NODE) {
    char shown[80] = "";
    if (map->type == YAML_SCALAR_NODE)
      refit_config_quote((const char *)map->data.scalar.value, shown, sizeof(shown));
    refit_config_problem(c, refit_config_mark_pos(map->start_mark),
                         "%s: expected a mapping of %s keys, got %s%s%s%s", name, name,
                         refit_config_node_kind(map), shown[0] ? " '" : "", shown,
                         shown[0] ? "'" : "");
    /* Its keys are unknown now: no rule may use them, none is "missing". */
    c->sections[si].malformed = true;
    for (int i = 0; i < c->table->nrows; i++)
      c->keys[i].bad |= strcmp(c->table->rows[i].section, name) == 0 ||
                        strcmp(refit_config_row_path(&c->table->rows[i]), name) == 0;
    return false;
  }
  refit_config_walk_keys(c, doc, name, map);
  return true;
}

/* Every key of one mapping: the top level ("") or a section. */
static void refit_config_walk_keys(refit_config_parser_t *c, yaml_document_t *doc,
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
    int id = refit_config_table_find(c->table, name, k);
    if (id >= 0 && c->table->rows[id].type != REFIT_CONFIG_TYPE_SECTION) {
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
      c->keys[id].pos = at;
    if (refit_config_walk_section(c, doc, (size_t)si, value) && id >= 0)
      refit_config_row_set_int(&c->table->rows[id], c->target, 1);
  }
}

static void refit_config_walk(refit_config_parser_t *c, yaml_document_t *doc) {
  yaml_node_t *root = yaml_document_get_root_node(doc);
  if (root == NULL)
    return; /* an empty file: the missing-key checks speak */
  if (root->type != YAML_MAPPING_NODE) {
    /* The first three top-level sections name the kind of file. */
    char names[160];
    size_t off = 0;
    int shown = 0;
    names[0] = '\0';
    for (size_t i = 0; i < c->nsections && shown < 4; i++) {
      if (!refit_config_section_in(c->sections[i].name, ""))
        continue;
      off += (size_t)snprintf(names + off, sizeof(names) - off, "%s%.40s",
                              shown ? ", " : "", shown < 3 ? c->sections[i].name : "...");
      shown++;
    }
    refit_config_problem(c, refit_config_mark_pos(root->start_mark),
                         "expected a mapping of sections (%s) at the top level, got %s",
                         names, refit_config_node_kind(root));
    return;
  }
  refit_config_walk_keys(c, doc, "", root);
}

void refit_config_parser_check_required(refit_config_parser_t *c) {
  for (size_t s = 0; s < c->nsections; s++) {
    const char *name = c->sections[s].name;
    /* An optional section that the file does not give has no keys. */
    const int optional = refit_config_table_section_row(c->table, name);
    const bool absent =
        optional >= 0 && (c->keys[optional].bad ||
                          !refit_config_row_int(&c->table->rows[optional], c->target));
    char missing[512];
    size_t off = 0;
    missing[0] = '\0';
    for (int i = 0; i < c->table->nrows; i++) {
      const refit_config_row_t *r = &c->table->rows[i];
      if (!(r->flags & REFIT_CONFIG_REQUIRED) || strcmp(r->section, name) ||
          c->keys[i].pos.line > 0 || c->keys[i].elsewhere != NULL)
        continue;
      c->keys[i].bad = true;
      if (c->sections[s].malformed || absent)
        continue; /* reported already, or an optional section not given */
      if (c->sections[s].pos.line > 0)
        refit_config_problem(c, c->sections[s].pos, "%s: missing required key (%s)",
                             refit_config_row_path(r), r->doc);
      else if (off < sizeof(missing))
        off += (size_t)snprintf(missing + off, sizeof(missing) - off, "%s%s",
                                off ? ", " : "", r->key);
    }
    if (off > 0)
      refit_config_problem(c, (refit_config_pos_t){1, 1},
                           "missing required section '%s' (with keys %s)", name, missing);
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

/* A libyaml failure as a problem at its position. */
static void refit_config_syntax_error(refit_config_parser_t *c,
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
    refit_config_problem(c, at, "syntax error: %s, %s at line %d column %d", problem,
                         parser->context, (int)parser->context_mark.line + 1,
                         (int)parser->context_mark.column + 1);
  else
    refit_config_problem(c, at, "syntax error: %s", problem);
}

/* Load the YAML text; true when the document loaded (the caller deletes
 * it). A syntax error becomes the only problem. */
static bool refit_config_load_yaml(refit_config_parser_t *c, yaml_document_t *doc) {
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
        c, refit_config_mark_pos(yaml_document_get_root_node(&next)->start_mark),
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

/* ------------------------------------------------------------------------ */
/* Entry points                                                              */
/* ------------------------------------------------------------------------ */

refit_status_t refit_config_parser_init(refit_config_parser_t *c,
                                        const refit_config_table_t *table,
                                        const char *filename, const char *text,
                                        size_t len, void *target) {
  memset(c, 0, sizeof(*c));
  if (table->nrows > REFIT_CONFIG_MAX_ROWS)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_config_parser_init: %d rows, more than %d", table->nrows,
                     REFIT_CONFIG_MAX_ROWS);
  c->table = table;
  c->target = target;
  c->filename = filename;
  c->text = text;
  c->len = len;
  for (int i = 0; i < table->nrows; i++) {
    const refit_config_row_t *r = &table->rows[i];
    if (r->section[0] != '\0' && refit_config_section_pos(c, r->section) == NULL &&
        c->nsections < REFIT_CONFIG_MAX_SECTIONS)
      c->sections[c->nsections++].name = r->section;
    if (r->type == REFIT_CONFIG_TYPE_STRING_LIST) {
      c->keys[i].items = calloc(r->size / r->item_size, sizeof(refit_config_pos_t));
      if (c->keys[i].items == NULL) {
        refit_config_parser_fini(c);
        return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_config_parser_init: out of memory");
      }
    }
  }
  return REFIT_OK;
}

void refit_config_parser_fini(refit_config_parser_t *c) {
  for (size_t i = 0; i < c->nproblems; i++)
    free(c->problems[i].text);
  free(c->problems);
  for (int i = 0; c->table != NULL && i < c->table->nrows; i++)
    free(c->keys[i].items);
  memset(c, 0, sizeof(*c));
}

bool refit_config_parser_read(refit_config_parser_t *c) {
  yaml_document_t doc;
  if (!refit_config_load_yaml(c, &doc))
    return false;
  refit_config_walk(c, &doc);
  yaml_document_delete(&doc);
  return true;
}

refit_status_t refit_config_parser_report(refit_config_parser_t *c, char **errors) {
  *errors = NULL;
  if (c->oom)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY,
                     "%s: out of memory while parsing the configuration", c->filename);
  if (c->nproblems == 0)
    return REFIT_OK;
  size_t total = 1;
  qsort(c->problems, c->nproblems, sizeof(*c->problems), refit_config_problem_cmp);
  for (size_t i = 0; i < c->nproblems; i++)
    total += strlen(c->filename) + strlen(c->problems[i].text) + 32;
  char *out = malloc(total);
  if (out == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "%s: out of memory while reporting problems",
                     c->filename);
  size_t off = 0;
  for (size_t i = 0; i < c->nproblems; i++)
    off += (size_t)snprintf(out + off, total - off, "%s:%d:%d: %s\n", c->filename,
                            c->problems[i].line, c->problems[i].col, c->problems[i].text);
  /* refit_last_error() gets the list too (truncated to its buffer). */
  REFIT_ERR(REFIT_ERR_CONFIG, "%s", out);
  *errors = out;
  return REFIT_ERR_CONFIG;
}
