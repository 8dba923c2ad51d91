/*
 * The refit configuration as it is read (internal to config*.c): the
 * engine's walk of the file (config_parse.h) into a refit_config_t, what
 * model.hf_config added, and the rules between keys (config_rules.c) that
 * run on the result.
 */
#ifndef REFIT_CONFIG_RULES_H
#define REFIT_CONFIG_RULES_H

#include "config/config.h"
#include "config/config_parse.h"

#include <stdbool.h>

typedef struct {
  refit_config_parser_t parser; /* its target is cfg */
  refit_config_t cfg;
  refit_config_t defaults; /* the table's, which some rules compare with */
  /* model.hf_config: the config.json read. The rows it gave carry its key
   * names (parser.keys[row].elsewhere). */
  char hf_file[REFIT_PATH_MAX];
  bool layout_ok; /* every layout rule was checked and holds */
} refit_config_ctx_t;

/*
 * Every rule that relates several keys, each reported at the key a person
 * would change (a value from model.hf_config at that key, naming the file's
 * key). A rule that reads a row already reported is skipped, so that one
 * mistake yields one message. `world_size` 0 skips the rules that need it.
 */
void refit_config_check_rules(refit_config_ctx_t *c, int world_size);

/* A runtime tensor's name for every layer at once:
 * "model.layers.*.self_attn.qkv_proj.weight". */
void refit_config_tensor_pattern(const char *name, char *buf, size_t n);

#endif /* REFIT_CONFIG_RULES_H */
