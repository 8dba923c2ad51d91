/*
 * A Hugging Face config.json read into a model shape (model.hf_config).
 *
 * The architectures of the family table (reshard/family.h) are read (the
 * keys listed in refit_hf_config_keys); any other architecture, a key of
 * the wrong JSON type, and a value refit does not support (an attention
 * bias, dense MLP layers inside a Qwen3-MoE model, tied DeepSeek
 * embeddings) are refused by key and value. Keys that change
 * no tensor (rope, routing, dropout) are not read. JSON is parsed by jansson,
 * which refuses malformed text, invalid UTF-8 and duplicate keys.
 */
#ifndef REFIT_HF_CONFIG_H
#define REFIT_HF_CONFIG_H

#include "refit/status.h"
#include "reshard/layout.h"

#include <stddef.h>
#include <stdint.h>

/* One model field that config.json gives: its JSON key, the YAML key of the
 * same meaning (config_table.h), and where it lands in refit_model_t. */
typedef struct {
  const char *json_key;
  const char *yaml_key; /* "model.hidden_size" */
  size_t offset;        /* in refit_model_t */
  int is_bool;          /* an int member read from a JSON boolean */
  refit_field_t field;  /* the same field (reshard/layout.h) */
  /* -1: read for every family that has the field, but one with a row of
   * its own for it; else read only for this family (DeepSeek's config
   * names the experts n_routed_experts). */
  int family;
} refit_hf_key_t;

extern const refit_hf_key_t refit_hf_config_keys[];
extern const int refit_hf_config_nkeys;

/* What a config.json gave: the shape, and which refit_hf_config_keys[i] it
 * set (bit i; family is always set on success). */
typedef struct {
  refit_model_t model;
  uint64_t present;
} refit_hf_config_t;

/* config.json's size bound: real ones are a few KiB. */
#define REFIT_HF_CONFIG_MAX_BYTES (16u << 20)

/*
 * Parse config.json text. `filename` names it in messages. On failure
 * *errors (if not NULL) receives a malloc'd string, one "FILENAME: ..."
 * problem per line (every problem at once, each naming its key and value),
 * and the status is REFIT_ERR_CONFIG. *out is set only on success.
 */
refit_status_t refit_hf_config_parse(const char *text, size_t len, const char *filename,
                                     refit_hf_config_t *out, char **errors);

/*
 * Read `path`: a config.json, or a directory holding one. `file` (if not
 * NULL, `file_len` bytes) receives the file read, also on failure. Errors
 * as refit_hf_config_parse, plus unreadable files.
 */
refit_status_t refit_hf_config_load(const char *path, refit_hf_config_t *out, char *file,
                                    size_t file_len, char **errors);

#endif /* REFIT_HF_CONFIG_H */
