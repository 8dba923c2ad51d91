/*
 * Every key of a refit configuration file, in one table. config.c turns each
 * row into a parser entry, a default, a bound check and a line of
 * documentation, so a key is added by adding a row here and nowhere else.
 *
 * X(ID, SECTION, KEY, TYPE, MEMBER, DEFAULT, MIN, MAX, CHOICES, FLAGS, DOC)
 *   ID       suffix of the row's enum constant (REFIT_CONFIG_ROW_<ID>)
 *   SECTION  the mapping the key lives in, "" for a top-level key
 *   KEY      the key's name inside its section
 *   TYPE     INT (int or int64_t member), U64, BYTES (size with units),
 *            DOUBLE, BOOL, ENUM (CHOICES gives "name|name|...", the n-th name
 *            is enum value n), STRING (char[REFIT_PATH_MAX])
 *   MEMBER   where the value lands in refit_config_t
 *   DEFAULT  the default written as YAML text, NULL when the key is required
 *   MIN, MAX bounds for INT, BYTES and DOUBLE (DOUBLE: MIN 0 means "> 0")
 *   FLAGS    REFIT_CONFIG_REQUIRED or 0
 *   DOC      what the key means, used in messages
 *
 * Rules that relate several keys (divisibility, world size, stage layers)
 * are not expressible per row; they live in refit_config_check_layout().
 */
#ifndef REFIT_CONFIG_TABLE_H
#define REFIT_CONFIG_TABLE_H

#include <limits.h>
#include <stdint.h>

#define REFIT_CONFIG_REQUIRED 1u

/* Bound of every parallel size, so that rank-count products fit in 64 bits. */
#define REFIT_CONFIG_MAX_RANKS 1048576

#define REFIT_CONFIG_TABLE(X)                                                  \
  X(MODEL_FAMILY, "model", "family", ENUM, model.family, NULL, 0, 0,           \
    "qwen3|qwen3_moe", REFIT_CONFIG_REQUIRED,                                  \
    "model family: qwen3 (dense MLP) or qwen3_moe (routed experts)")           \
  X(MODEL_HIDDEN_SIZE, "model", "hidden_size", INT, model.hidden_size, NULL,   \
    1, INT64_MAX, "", REFIT_CONFIG_REQUIRED, "hidden size H")                  \
  X(MODEL_NUM_LAYERS, "model", "num_layers", INT, model.num_layers, NULL, 1,   \
    INT64_MAX, "", REFIT_CONFIG_REQUIRED, "number of decoder layers L")        \
  X(MODEL_NUM_ATTENTION_HEADS, "model", "num_attention_heads", INT,            \
    model.num_attention_heads, NULL, 1, INT64_MAX, "", REFIT_CONFIG_REQUIRED,  \
    "query heads Q")                                                           \
  X(MODEL_NUM_KV_HEADS, "model", "num_kv_heads", INT, model.num_kv_heads,      \
    NULL, 1, INT64_MAX, "", REFIT_CONFIG_REQUIRED, "key/value heads KV")       \
  X(MODEL_HEAD_DIM, "model", "head_dim", INT, model.head_dim, NULL, 1,         \
    INT64_MAX, "", REFIT_CONFIG_REQUIRED, "head dimension D")                  \
  X(MODEL_VOCAB_SIZE, "model", "vocab_size", INT, model.vocab_size, NULL, 1,   \
    INT64_MAX, "", REFIT_CONFIG_REQUIRED, "vocabulary size V")                 \
  X(MODEL_INTERMEDIATE_SIZE, "model", "intermediate_size", INT,                \
    model.intermediate_size, "0", 0, INT64_MAX, "", 0,                         \
    "dense MLP width F (qwen3 only)")                                          \
  X(MODEL_NUM_EXPERTS, "model", "num_experts", INT, model.num_experts, "0", 0, \
    INT64_MAX, "", 0, "routed experts X (qwen3_moe only)")                     \
  X(MODEL_MOE_INTERMEDIATE_SIZE, "model", "moe_intermediate_size", INT,        \
    model.moe_intermediate_size, "0", 0, INT64_MAX, "", 0,                     \
    "expert MLP width I (qwen3_moe only)")                                     \
  X(MODEL_TIE_WORD_EMBEDDINGS, "model", "tie_word_embeddings", BOOL,           \
    model.tie_word_embeddings, "false", 0, 0, "", 0,                           \
    "lm_head shares embed_tokens (no lm_head.weight)")                         \
  X(TRAINER_TP, "trainer", "tp", INT, trainer.tp, "1", 1,                      \
    REFIT_CONFIG_MAX_RANKS, "", 0, "trainer tensor-parallel size")             \
  X(TRAINER_PP, "trainer", "pp", INT, trainer.pp, "1", 1,                      \
    REFIT_CONFIG_MAX_RANKS, "", 0, "trainer pipeline-parallel size")           \
  X(TRAINER_EP, "trainer", "ep", INT, trainer.ep, "1", 1,                      \
    REFIT_CONFIG_MAX_RANKS, "", 0, "trainer expert-parallel size")             \
  X(TRAINER_ETP, "trainer", "etp", INT, trainer.etp, "1", 1,                   \
    REFIT_CONFIG_MAX_RANKS, "", 0, "trainer expert tensor-parallel size")      \
  X(TRAINER_DP, "trainer", "dp", INT, trainer.dp, "1", 1,                      \
    REFIT_CONFIG_MAX_RANKS, "", 0, "trainer data-parallel size")               \
  X(TRAINER_FIRST_STAGE_LAYERS, "trainer", "first_stage_layers", INT,          \
    trainer.first_stage_layers, "0", 0, INT64_MAX, "", 0,                      \
    "layers on the first pipeline stage, 0 = split evenly")                    \
  X(TRAINER_LAST_STAGE_LAYERS, "trainer", "last_stage_layers", INT,            \
    trainer.last_stage_layers, "0", 0, INT64_MAX, "", 0,                       \
    "layers on the last pipeline stage, 0 = split evenly")                     \
  X(GENERATOR_TP, "generator", "tp", INT, generator.tp, "1", 1,                \
    REFIT_CONFIG_MAX_RANKS, "", 0, "ranks per generator engine")               \
  X(GENERATOR_EP, "generator", "ep", INT, generator.ep, "1", 1,                \
    REFIT_CONFIG_MAX_RANKS, "", 0,                                             \
    "generator expert-parallel size, 1 or generator.tp")                       \
  X(GENERATOR_ENGINES, "generator", "engines", INT, generator.engines, "1", 1, \
    REFIT_CONFIG_MAX_RANKS, "", 0, "independent generator engines")            \
  X(REFIT_MODE, "refit", "mode", ENUM, refit.mode, "sync", 0, 0, "sync|async", \
    0, "refit mode")                                                           \
  X(REFIT_TRANSPORT, "refit", "transport", ENUM, refit.transport, "auto", 0,   \
    0, "auto|mpi|nccl|ipc|ucx", 0, "transport between trainer and generator")  \
  X(REFIT_BUCKET_BYTES, "refit", "bucket_bytes", BYTES, refit.bucket_bytes,    \
    "256MiB", 65536, INT64_MAX, "", 0, "bytes per transfer bucket")          \
  X(REFIT_PRECISION, "refit", "precision", ENUM, refit.precision, "bf16", 0,   \
    0, "bf16|mxfp8", 0, "precision on the wire")                               \
  X(REFIT_TIMEOUT_S, "refit", "timeout_s", DOUBLE, refit.timeout_s, "300", 0,  \
    0, "", 0, "seconds before a refit is declared stuck")                      \
  X(REFIT_STEPS, "refit", "steps", INT, refit.steps, "3", 1, INT_MAX, "", 0,   \
    "refits that refit-run performs")                                          \
  X(SOURCE_KIND, "source", "kind", ENUM, source.kind, "synthetic", 0, 0,       \
    "synthetic|hdf5", 0, "where trainer weights come from")                    \
  X(SOURCE_SEED, "source", "seed", U64, source.seed, "1234", 0, 0, "", 0,      \
    "seed of the synthetic weights")                                           \
  X(SOURCE_PATH, "source", "path", STRING, source.path, "", 0, 0, "", 0,       \
    "checkpoint file for source.kind hdf5")                                    \
  X(VERIFY, "", "verify", BOOL, verify, "true", 0, 0, "", 0,                   \
    "compare every generator byte with its reference after a refit")           \
  X(DUMP, "", "dump", STRING, dump, "", 0, 0, "", 0,                           \
    "file to dump generator tensors to, empty = no dump")

typedef enum {
#define REFIT_CONFIG_ROW_ENUM_(id, ...) REFIT_CONFIG_ROW_##id,
  REFIT_CONFIG_TABLE(REFIT_CONFIG_ROW_ENUM_)
#undef REFIT_CONFIG_ROW_ENUM_
      REFIT_CONFIG_ROW_COUNT
} refit_config_row_id_t;

#endif /* REFIT_CONFIG_TABLE_H */
