/*
 * The refit configuration (config.h): one YAML file read against the table
 * of keys (config_table.h) by the configuration engine (config_parse.h), the
 * model keys a Hugging Face config.json adds (model.hf_config), and the rules
 * between keys (config_rules.c), in that order. Every problem of every stage
 * is collected with its position and reported at once, so a bad file never
 * starts a transfer. Also here: what the configuration gives back, as YAML,
 * as a hash, as planner options.
 */
#include "config/config.h"

#include "config/config_rules.h"
#include "config/config_table.h"
#include "core/error.h"
#include "core/file.h"
#include "config/hf_config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ROW(id) REFIT_CONFIG_ROW_##id

void refit_config_defaults(refit_config_t *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  refit_config_table_defaults(&refit_config_table, cfg);
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

/* ------------------------------------------------------------------------ */
/* model.hf_config                                                           */
/* ------------------------------------------------------------------------ */

/*
 * Fill the model keys from the Hugging Face config.json that model.hf_config
 * names (relative to the YAML file's directory). A key that the YAML file
 * gives too must agree with the file. Every row the file stands for is
 * marked with the file's key (parser.keys[row].elsewhere), so that it is not
 * "missing" and rules blaming it name the file and its key; when the file
 * cannot be read, those rows are marked bad too, so that no rule repeats the
 * failure. A value from the file meets its row's bounds (the table's, as
 * for the YAML file), or is refused at model.hf_config by file and key.
 */
static void refit_config_read_hf(refit_config_ctx_t *c) {
  const int at_row = ROW(MODEL_HF_CONFIG);
  const char *given = c->cfg.hf_config;
  if (c->parser.keys[at_row].bad || given[0] == '\0')
    return;
  char path[2 * REFIT_PATH_MAX];
  const char *slash = strrchr(c->parser.filename, '/');
  if (given[0] != '/' && slash != NULL)
    snprintf(path, sizeof(path), "%.*s/%s", (int)(slash - c->parser.filename),
             c->parser.filename, given);
  else
    snprintf(path, sizeof(path), "%s", given);
  refit_hf_config_t hf;
  char *errors = NULL;
  const refit_status_t st =
      refit_hf_config_load(path, &hf, c->hf_file, sizeof(c->hf_file), &errors);
  const refit_config_pos_t at = refit_config_key_pos(&c->parser, at_row);
  const int family = ROW(MODEL_FAMILY);
  c->parser.keys[family].elsewhere = "architectures";
  for (int i = 0; i < refit_hf_config_nkeys; i++) {
    const int row =
        refit_config_table_path(&refit_config_table, refit_hf_config_keys[i].yaml_key);
    if (row >= 0 && (st != REFIT_OK || (hf.present >> i & 1)))
      c->parser.keys[row].elsewhere = refit_hf_config_keys[i].json_key;
  }
  if (st != REFIT_OK) {
    for (char *line = errors; line != NULL && *line != '\0';) {
      char *end = strchr(line, '\n');
      refit_config_problem(&c->parser, at, "model.hf_config: %.*s",
                           end ? (int)(end - line) : (int)strlen(line), line);
      line = end ? end + 1 : NULL;
    }
    if (errors == NULL)
      refit_config_problem(&c->parser, at, "model.hf_config: %s", refit_last_error());
    free(errors);
    for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++)
      if (c->parser.keys[i].elsewhere != NULL)
        c->parser.keys[i].bad = true;
    return;
  }
  /* The file's model where the rows read it (they are all model keys). */
  refit_config_t file;
  file.model = hf.model;
  for (int i = 0; i < REFIT_CONFIG_ROW_COUNT; i++) {
    if (c->parser.keys[i].elsewhere == NULL)
      continue;
    const refit_config_row_t *r = &refit_config_rows[i];
    const int64_t from_file = refit_config_row_int(r, &file);
    /* The row's bounds hold for the file's value as for the YAML file's. */
    const refit_config_value_status_t bound =
        r->type == REFIT_CONFIG_TYPE_INT ? refit_config_value_check_int(r, from_file)
                                         : REFIT_CONFIG_VALUE_OK;
    if (bound != REFIT_CONFIG_VALUE_OK) {
      char expect[128];
      refit_config_value_expect(r, bound == REFIT_CONFIG_VALUE_TOO_BIG, expect,
                                sizeof(expect));
      refit_config_problem(&c->parser, at,
                           "model.hf_config: %s: %s: %lld is beyond %s's bound "
                           "(expected %s)",
                           c->hf_file, c->parser.keys[i].elsewhere, (long long)from_file,
                           refit_config_row_path(r), expect);
      c->parser.keys[i].bad = true;
      continue;
    }
    if (c->parser.keys[i].pos.line > 0 && !c->parser.keys[i].bad &&
        refit_config_row_int(r, &c->cfg) != from_file) {
      char yaml_value[64], file_value[64];
      refit_config_value_format(r, &c->cfg, false, yaml_value, sizeof(yaml_value));
      refit_config_row_set_int(r, &c->cfg, from_file);
      refit_config_value_format(r, &c->cfg, false, file_value, sizeof(file_value));
      refit_config_problem(&c->parser, c->parser.keys[i].pos,
                           "%s: %s disagrees with %s's key '%s' (%s); remove "
                           "%s or make them agree",
                           refit_config_row_path(r), yaml_value, c->hf_file,
                           c->parser.keys[i].elsewhere, file_value,
                           refit_config_row_path(r));
      c->parser.keys[i].bad = true;
      continue;
    }
    if (c->parser.keys[i].pos.line > 0)
      c->parser.keys[i].elsewhere = NULL; /* the YAML file says it too: blame its key */
    refit_config_row_set_int(r, &c->cfg, from_file);
  }
}

/* ------------------------------------------------------------------------ */
/* Reading a file                                                            */
/* ------------------------------------------------------------------------ */

refit_status_t refit_config_parse(const char *text, size_t len, const char *filename,
                                  int world_size, refit_config_t *cfg, char **errors) {
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
  refit_config_defaults(&c->defaults);
  c->cfg = c->defaults;
  refit_status_t status =
      refit_config_parser_init(&c->parser, &refit_config_table,
                               filename ? filename : "<config>", text, len, &c->cfg);
  if (status != REFIT_OK) {
    free(c);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_config_parse: out of memory");
  }
  if (refit_config_parser_read(&c->parser)) {
    refit_config_read_hf(c);
    refit_config_parser_check_required(&c->parser);
    refit_config_check_rules(c, world_size);
  }
  char *out = NULL;
  status = refit_config_parser_report(&c->parser, &out);
  if (status == REFIT_OK)
    *cfg = c->cfg;
  refit_config_parser_fini(&c->parser);
  free(c);
  if (errors)
    *errors = out;
  else
    free(out);
  return status;
}

static refit_status_t refit_config_error_out(char **errors, refit_status_t status,
                                             const char *fmt, ...) REFIT_PRINTF(3, 4);

/* Record a failure and hand the same sentence back through *errors. */
static refit_status_t refit_config_error_out(char **errors, refit_status_t status,
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

refit_status_t refit_config_load(const char *path, int world_size, refit_config_t *cfg,
                                 char **errors, char **text_out, size_t *len_out) {
  if (errors)
    *errors = NULL;
  if (path == NULL || cfg == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "refit_config_load: NULL path or cfg");
  /* A FIFO or device as the path is refused here rather than read: opening
   * a FIFO would block this rank, and every other rank with it. */
  int fd = -1;
  struct stat sb;
  if (refit_file_open_regular(path, "configuration", &fd, &sb) != REFIT_OK) {
    char why[1024];
    snprintf(why, sizeof(why), "%s", refit_last_error());
    return refit_config_error_out(errors, REFIT_ERR_SYSTEM, "%s", why);
  }
  if ((uint64_t)sb.st_size > REFIT_CONFIG_MAX_BYTES) {
    close(fd);
    return refit_config_error_out(errors, REFIT_ERR_CONFIG,
                                  "%s: the configuration is %lld bytes, more than "
                                  "the %d (%d KiB) a refit YAML file may have",
                                  path, (long long)sb.st_size, REFIT_CONFIG_MAX_BYTES,
                                  REFIT_CONFIG_MAX_BYTES >> 10);
  }
  /* One byte past the cap tells a file that grew after the fstat. */
  char *text = malloc((size_t)REFIT_CONFIG_MAX_BYTES + 2);
  size_t len = 0;
  refit_status_t status = REFIT_OK;
  if (text == NULL) {
    close(fd);
    return refit_config_error_out(errors, REFIT_ERR_NO_MEMORY,
                                  "%s: out of memory reading the configuration", path);
  }
  while (len < (size_t)REFIT_CONFIG_MAX_BYTES + 1) {
    const ssize_t got = read(fd, text + len, (size_t)REFIT_CONFIG_MAX_BYTES + 1 - len);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0) {
      const int e = errno;
      close(fd);
      status = refit_config_error_out(errors, REFIT_ERR_SYSTEM,
                                      "%s: cannot read the configuration: %s", path,
                                      strerror(e));
      goto err_free_text;
    }
    if (got == 0)
      break;
    len += (size_t)got;
  }
  close(fd);
  if (len > (size_t)REFIT_CONFIG_MAX_BYTES) {
    status = refit_config_error_out(errors, REFIT_ERR_CONFIG,
                                    "%s: the configuration is more than the %d bytes "
                                    "a refit YAML file may have",
                                    path, REFIT_CONFIG_MAX_BYTES);
    goto err_free_text;
  }
  text[len] = '\0';

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
  return status;
}

/* ------------------------------------------------------------------------ */
/* What the configuration gives back                                         */
/* ------------------------------------------------------------------------ */

uint64_t refit_config_hash(const refit_config_t *cfg) {
  return refit_config_table_hash(&refit_config_table, cfg);
}

refit_status_t refit_config_format(const refit_config_t *cfg, char **out) {
  if (cfg == NULL || out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "refit_config_format: NULL argument");
  return refit_config_table_format(&refit_config_table, cfg, out);
}

void refit_config_plan_options(const refit_config_t *cfg, refit_plan_options_t *opt) {
  memset(opt, 0, sizeof(*opt));
  opt->bucket_bytes = cfg->refit.bucket_bytes;
  /* A delta refit compares the trainer's wire bytes with the last committed
   * ones, so it quantizes on the trainer as prequantize does. */
  const int on_trainer =
      cfg->refit.prequantize || cfg->refit.delta != REFIT_DELTA_MODE_OFF;
  opt->wire = REFIT_WIRE_BF16;
  if (on_trainer && cfg->refit.precision == REFIT_PRECISION_MXFP8)
    opt->wire = REFIT_WIRE_MXFP8;
  else if (on_trainer && cfg->refit.precision == REFIT_PRECISION_FP8_BLOCK)
    opt->wire = REFIT_WIRE_FP8_BLOCK;
  opt->chunk_trailer = cfg->refit.digests ? 8 : 0;
  opt->per_tensor_buckets = cfg->refit.baseline;
  opt->arena_bytes = cfg->refit.arena_bytes;
}
