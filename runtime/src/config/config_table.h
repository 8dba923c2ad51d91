/*
 * Every key of a refit configuration file, in one table. config_table.c
 * turns each row into a row of the configuration engine (config_parse.h):
 * a parser entry, a default, a bound check and a line of documentation, so
 * a key is added by adding a row here and nowhere else.
 *
 * X(ID, SECTION, KEY, TYPE, MEMBER, DEFAULT, MIN, MAX, CHOICES, FLAGS, DOC)
 *   ID       suffix of the row's enum constant (REFIT_CONFIG_ROW_<ID>)
 *   SECTION  the mapping the key lives in, "" for a top-level key
 *   KEY      the key's name inside its section
 *   TYPE     INT (int or int64_t member), U64, BYTES (size with units),
 *            DOUBLE, BOOL, ENUM (CHOICES gives "name|name|...", the n-th name
 *            is enum value n), STRING (char[N]), STRING_LIST (a YAML sequence
 *            of strings into char[CAP][LEN], the count in MEMBER_count),
 *            SECTION (an optional nested mapping: its keys are the rows whose
 *            SECTION is this row's "SECTION.KEY"; the int MEMBER says whether
 *            the file has it)
 *   MEMBER   where the value lands in refit_config_t
 *   DEFAULT  the default written as YAML text, NULL when the key is required
 *            (STRING_LIST: a flow sequence of plain names, "[a, b]")
 *   MIN, MAX bounds for INT, BYTES and DOUBLE. DOUBLE: the value must be
 *            > MIN (>= MIN with REFIT_CONFIG_MIN_INCLUSIVE), and <= MAX when
 *            MAX > MIN
 *   CHOICES  ENUM: the names; STRING_LIST: "ITEM|EXAMPLE", what one item is
 *            and an example list, for messages
 *   FLAGS    REFIT_CONFIG_REQUIRED (inside an optional SECTION: required
 *            when the section is given), REFIT_CONFIG_MIN_INCLUSIVE, or 0
 *   DOC      what the key means, used in messages
 *
 * Rules that relate several keys (divisibility, world size, stage layers,
 * MXFP8 shapes) are not expressible per row; they live in config_rules.c.
 */
#ifndef REFIT_CONFIG_TABLE_H
#define REFIT_CONFIG_TABLE_H

#include "config/config_parse.h"

#include <limits.h>
#include <stdint.h>

/* Bound of every parallel size, so that rank-count products fit in 64 bits. */
#define REFIT_CONFIG_MAX_RANKS 1048576

/*
 * Bounds of the model's dimensions: what published models need, with room
 * to grow, and no more. The largest today (2026): hidden 25,600 (Megatron's
 * 1 T reference), 160 layers, 128 query heads, head dimension 256, a
 * vocabulary of 262,144 (Gemma 3), dense MLP 73,728 (PaLM), 512 routed
 * experts (Qwen3-Next), expert MLP 14,336 (Mixtral). At these bounds a row
 * is at most 2^20 elements (heads x head dimension) and the whole model
 * below 2^58 bytes, so every byte count of the planner fits in 64 bits with
 * room, and a model beyond them is a typo, refused at its key.
 */
#define REFIT_CONFIG_MAX_HIDDEN (1 << 17)
#define REFIT_CONFIG_MAX_LAYERS 1024
#define REFIT_CONFIG_MAX_HEADS 1024
#define REFIT_CONFIG_MAX_HEAD_DIM 1024
#define REFIT_CONFIG_MAX_VOCAB (1 << 22)
#define REFIT_CONFIG_MAX_INTERMEDIATE (1 << 18)
#define REFIT_CONFIG_MAX_EXPERTS 4096
#define REFIT_CONFIG_MAX_MOE_INTERMEDIATE (1 << 16)

#define REFIT_CONFIG_TABLE(X)                                                  \
  X(MODEL_FAMILY, "model", "family", ENUM, model.family, NULL, 0, 0,           \
    "qwen3|qwen3_moe|llama|qwen2|deepseek_v3", REFIT_CONFIG_REQUIRED,          \
    "model family: qwen3 (dense MLP), qwen3_moe (routed experts), llama "      \
    "(LlamaForCausalLM), qwen2 (Qwen2ForCausalLM, q/k/v biases) or "           \
    "deepseek_v3 (DeepseekV3ForCausalLM: MLA, dense first layers, routed "     \
    "and shared experts)")                                                     \
  X(MODEL_HIDDEN_SIZE, "model", "hidden_size", INT, model.hidden_size, NULL,   \
    1, REFIT_CONFIG_MAX_HIDDEN, "", REFIT_CONFIG_REQUIRED, "hidden size H")                  \
  X(MODEL_NUM_LAYERS, "model", "num_layers", INT, model.num_layers, NULL, 1,   \
    REFIT_CONFIG_MAX_LAYERS, "", REFIT_CONFIG_REQUIRED,                        \
    "number of decoder layers L")        \
  X(MODEL_NUM_ATTENTION_HEADS, "model", "num_attention_heads", INT,            \
    model.num_attention_heads, NULL, 1, REFIT_CONFIG_MAX_HEADS, "",            \
    REFIT_CONFIG_REQUIRED,                                                     \
    "query heads Q")                                                           \
  X(MODEL_NUM_KV_HEADS, "model", "num_kv_heads", INT, model.num_kv_heads,      \
    NULL, 1, REFIT_CONFIG_MAX_HEADS, "", REFIT_CONFIG_REQUIRED,                \
    "key/value heads KV")       \
  X(MODEL_HEAD_DIM, "model", "head_dim", INT, model.head_dim, NULL, 1,         \
    REFIT_CONFIG_MAX_HEAD_DIM, "", REFIT_CONFIG_REQUIRED, "head dimension D")                  \
  X(MODEL_VOCAB_SIZE, "model", "vocab_size", INT, model.vocab_size, NULL, 1,   \
    REFIT_CONFIG_MAX_VOCAB, "", REFIT_CONFIG_REQUIRED, "vocabulary size V")                 \
  X(MODEL_INTERMEDIATE_SIZE, "model", "intermediate_size", INT,                \
    model.intermediate_size, "0", 0, REFIT_CONFIG_MAX_INTERMEDIATE, "", 0,     \
    "dense MLP width F (qwen3, llama, qwen2; deepseek_v3's dense layers)")      \
  X(MODEL_NUM_EXPERTS, "model", "num_experts", INT, model.num_experts, "0", 0, \
    REFIT_CONFIG_MAX_EXPERTS, "", 0, "routed experts X (qwen3_moe, deepseek_v3)") \
  X(MODEL_MOE_INTERMEDIATE_SIZE, "model", "moe_intermediate_size", INT,        \
    model.moe_intermediate_size, "0", 0, REFIT_CONFIG_MAX_MOE_INTERMEDIATE, "", \
    0,                                                                         \
    "expert MLP width I (qwen3_moe, deepseek_v3)")                             \
  X(MODEL_TIE_WORD_EMBEDDINGS, "model", "tie_word_embeddings", BOOL,           \
    model.tie_word_embeddings, "false", 0, 0, "", 0,                           \
    "lm_head shares embed_tokens (no lm_head.weight)")                         \
  X(MODEL_Q_LORA_RANK, "model", "q_lora_rank", INT, model.q_lora_rank, "0", 0, \
    REFIT_CONFIG_MAX_HIDDEN, "", 0,                                            \
    "query LoRA rank of MLA, 0 for q_proj (deepseek_v3)")                      \
  X(MODEL_KV_LORA_RANK, "model", "kv_lora_rank", INT, model.kv_lora_rank, "0", \
    0, REFIT_CONFIG_MAX_HIDDEN, "", 0, "latent KV rank of MLA (deepseek_v3)")  \
  X(MODEL_QK_NOPE_HEAD_DIM, "model", "qk_nope_head_dim", INT,                  \
    model.qk_nope_head_dim, "0", 0, REFIT_CONFIG_MAX_HEAD_DIM, "", 0,          \
    "q/k head dimension without rope; head_dim is the rope one (deepseek_v3)") \
  X(MODEL_V_HEAD_DIM, "model", "v_head_dim", INT, model.v_head_dim, "0", 0,    \
    REFIT_CONFIG_MAX_HEAD_DIM, "", 0, "value head dimension (deepseek_v3)")    \
  X(MODEL_NUM_SHARED_EXPERTS, "model", "num_shared_experts", INT,              \
    model.num_shared_experts, "0", 0, REFIT_CONFIG_MAX_EXPERTS, "", 0,         \
    "shared experts per MoE layer (deepseek_v3)")                              \
  X(MODEL_FIRST_K_DENSE_REPLACE, "model", "first_k_dense_replace", INT,        \
    model.first_k_dense_replace, "0", 0, REFIT_CONFIG_MAX_LAYERS, "", 0,       \
    "dense MLP layers before the first MoE layer (deepseek_v3)")               \
  X(MODEL_MOE_LAYER_FREQ, "model", "moe_layer_freq", INT, model.moe_layer_freq, \
    "0", 0, REFIT_CONFIG_MAX_LAYERS, "", 0,                                    \
    "layer l >= first_k_dense_replace is MoE iff moe_layer_freq divides l; 0 "\
    "reads as 1 (deepseek_v3)")                                                \
  X(MODEL_EXPERT_BIAS, "model", "expert_bias", BOOL, model.expert_bias,        \
    "false", 0, 0, "", 0,                                                      \
    "routers with the FP32 e_score_correction_bias (topk_method noaux_tc; "    \
    "deepseek_v3)")                                                            \
  X(MODEL_HF_CONFIG, "model", "hf_config", STRING, hf_config, "", 0, 0, "", 0, \
    "Hugging Face config.json (or its directory) giving the model keys")      \
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
    trainer.first_stage_layers, "0", 0, REFIT_CONFIG_MAX_LAYERS, "", 0,        \
    "layers on the first pipeline stage, 0 = split evenly")                    \
  X(TRAINER_LAST_STAGE_LAYERS, "trainer", "last_stage_layers", INT,            \
    trainer.last_stage_layers, "0", 0, REFIT_CONFIG_MAX_LAYERS, "", 0,         \
    "layers on the last pipeline stage, 0 = split evenly")                     \
  X(TRAINER_LAYOUT, "trainer", "layout", ENUM, trainer.names, "auto", 0, 0,    \
    "auto|hf|megatron", 0,                                                     \
    "trainer tensor names: Hugging Face, or Megatron-Core's named_parameters() " \
    "(auto: megatron when source.kind is caller, else hf)")                    \
  X(TRAINER_SPEC, "trainer", "spec", ENUM, trainer.spec, "te", 0, 0,           \
    "te|local", 0, "Megatron-Core layer spec: Transformer Engine or local")    \
  X(TRAINER_EXPERTS, "trainer", "experts", ENUM, trainer.experts, "auto", 0,   \
    0, "auto|grouped|sequential", 0,                                           \
    "Megatron-Core expert module: TEGroupedMLP (weight{k}) or SequentialMLP "  \
    "(local_experts.{k}); auto: grouped with spec te, else sequential")        \
  X(TRAINER_NAME_PREFIX, "trainer", "name_prefix", STRING, trainer.name_prefix, \
    "", 0, 0, "", 0,                                                           \
    "prefix of every Megatron name, as training wrappers add it "             \
    "(module.module.)")                                                        \
  X(TRAINER_VOCAB_DIVISIBLE_BY, "trainer", "vocab_divisible_by", INT,          \
    trainer.vocab_divisible_by, "128", 1, 65536, "", 0,                        \
    "Megatron pads the vocabulary to a multiple of this times trainer.tp "     \
    "(make_vocab_size_divisible_by)")                                          \
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
    "256MiB", 65536, INT32_MAX, "", 0,                                         \
    "bytes per transfer bucket (below 2GiB: a message's MPI count is an int)") \
  X(REFIT_ARENA_BYTES, "refit", "arena_bytes", BYTES, refit.arena_bytes,       \
    "4GiB", 0, INT64_MAX, "", 0,                                               \
    "bound of the assembly arena per generator rank (0 = none): the "          \
    "schedule spreads buckets over fewer trainers when spreading them over "   \
    "all would need more")                                                     \
  X(REFIT_PRECISION, "refit", "precision", ENUM, refit.precision, "bf16", 0,   \
    0, "bf16|mxfp8|fp8_block|nvfp4", 0,                                        \
    "what the generator holds: bf16, or quantized weights")                    \
  X(REFIT_FP8_SCALE, "refit", "fp8_scale", ENUM, refit.fp8_scale, "fp32", 0,   \
    0, "fp32|pow2", 0,                                                         \
    "block scales under fp8_block: 448/amax, or a power of two")               \
  X(REFIT_TIMEOUT_S, "refit", "timeout_s", DOUBLE, refit.timeout_s, "300", 0,  \
    0, "", 0, "seconds before a refit is declared stuck")                      \
  X(REFIT_STEPS, "refit", "steps", INT, refit.steps, "3", 1, INT_MAX, "", 0,   \
    "refits that refit-run performs")                                          \
  X(REFIT_LINEAR_BACKEND, "refit", "linear_backend", ENUM,                     \
    refit.linear_backend, "flashinfer_cutlass", 0, 0,                          \
    "flashinfer_cutlass|flashinfer_cutedsl|flashinfer_trtllm", 0,              \
    "generator GEMM backend for dense MXFP8 weights")                          \
  X(REFIT_MOE_BACKEND, "refit", "moe_backend", ENUM, refit.moe_backend,        \
    "flashinfer_trtllm", 0, 0, "flashinfer_trtllm|flashinfer_cutlass", 0,      \
    "generator MoE backend (expert layout): MXFP8 flashinfer_trtllm only")     \
  X(REFIT_PREQUANTIZE, "refit", "prequantize", BOOL, refit.prequantize,        \
    "false", 0, 0, "", 0,                                                      \
    "quantize on the trainer before sending (needs precision mxfp8)")          \
  X(REFIT_DELTA, "refit", "delta", ENUM, refit.delta, "off", 0, 0,             \
    "off|on|auto", 0,                                                          \
    "send only what changed since the last committed version")                 \
  X(REFIT_LENGTHS_AHEAD, "refit", "lengths_ahead", BOOL, refit.lengths_ahead, \
    "false", 0, 0, "", 0,                                                      \
    "send every message's length ahead over MPI, on any transport")           \
  X(REFIT_DELTA_FULL_EVERY, "refit", "delta_full_every", INT,                  \
    refit.delta_full_every, "0", 0, INT_MAX, "", 0,                            \
    "under delta: every N-th refit is a full one (0: only where needed)")     \
  X(REFIT_DELTA_BASELINE, "refit", "delta_baseline", ENUM,                     \
    refit.delta_baseline, "auto", 0, 0, "auto|device|host", 0,                 \
    "where a trainer on a GPU keeps its delta baseline (auto: device)")        \
  X(REFIT_QUANTIZATION_IGNORE, "refit", "quantization_ignore", STRING_LIST,    \
    refit.quantization_ignore, "[lm_head]", 0, 0,                              \
    "module name|[lm_head, mlp.gate]", 0,                                      \
    "modules kept in bf16 when quantizing (whole dotted segments of a name)")  \
  X(REFIT_RESTORE, "refit", "restore", ENUM, refit.restore, "full", 0, 0,      \
    "full|none", 0, "what a generator keeps to roll back a failed refit")      \
  X(REFIT_DIGESTS, "refit", "digests", BOOL, refit.digests, "true", 0, 0, "",  \
    0, "per-chunk integrity digests")                                          \
  X(REFIT_KEEP_STAGING, "refit", "keep_staging", BOOL, refit.keep_staging,     \
    "true", 0, 0, "", 0, "keep staging buffers allocated between refits")      \
  X(REFIT_BASELINE, "refit", "baseline", BOOL, refit.baseline, "false", 0, 0,  \
    "", 0,                                                                     \
    "benchmark baseline: one bucket per tensor, expert-by-expert layout")      \
  X(REFIT_DEVICE_MAP, "refit", "device_map", ENUM, refit.device_map,           \
    "local_rank", 0, 0, "local_rank|none", 0,                                  \
    "GPU binding: node-local rank modulo visible GPUs, or none")               \
  X(REFIT_LOCALITY, "refit", "locality", ENUM, refit.locality, "host", 0, 0, \
    "host|gpu", 0,                                                             \
    "what one node is for transport auto: a host, or a GPU")                   \
  X(REFIT_ZERO_COPY, "refit", "zero_copy", ENUM, refit.zero_copy, "auto", 0,   \
    0, "auto|on|off", 0,                                                       \
    "generators read trainers on their GPU in place (auto: where all can)")    \
  X(REFIT_TIMELINE, "refit", "timeline", STRING, refit.timeline, "", 0, 0,   \
    "", 0,                                                                     \
    "file prefix of per-bucket timelines: after each committed refit every "  \
    "rank writes PREFIX.refit<N>.rank<R>.json; empty = none")                 \
  X(REFIT_FAULT, "refit", "fault", SECTION, refit.fault.enabled, NULL, 0, 0,   \
    "", 0, "fault injection seam for tests")                                   \
  X(REFIT_FAULT_PHASE, "refit.fault", "phase", ENUM, refit.fault.phase, NULL,  \
    0, 0, "transfer|quantize|commit|verify|vote|open|repair|amax",            \
    REFIT_CONFIG_REQUIRED,                                                     \
    "phase the fault fires in")                                                \
  X(REFIT_FAULT_RANK, "refit.fault", "rank", INT, refit.fault.rank, NULL, 0,   \
    INT_MAX, "", REFIT_CONFIG_REQUIRED, "world rank that injects the fault")   \
  X(REFIT_FAULT_ACTION, "refit.fault", "action", ENUM, refit.fault.action,     \
    NULL, 0, 0, "kill|exit|stall|bitflip|truncate|drop|duplicate|error|stale", \
    REFIT_CONFIG_REQUIRED, "what the fault does")                              \
  X(REFIT_FAULT_AT, "refit.fault", "at", DOUBLE, refit.fault.at, "0.5", 0, 1,  \
    "", REFIT_CONFIG_MIN_INCLUSIVE, "fraction of the phase's bytes")           \
  X(REFIT_FAULT_REFIT, "refit.fault", "refit", INT, refit.fault.refit, "1", 0, \
    INT_MAX, "", 0, "which refit, 1-based; 0 = every refit")                   \
  X(REFIT_FAULT_PROBABILITY, "refit.fault", "probability", DOUBLE,             \
    refit.fault.probability, "1", 0, 1, "", 0,                                 \
    "chance per refit, drawn with source.seed when below 1")                   \
  X(SOURCE_KIND, "source", "kind", ENUM, source.kind, "synthetic", 0, 0,       \
    "synthetic|hdf5|caller|safetensors", 0,                                    \
    "where trainer weights come from: made up, a checkpoint (HDF5 or "        \
    "safetensors), or the tensors the trainer registered (caller)")            \
  X(SOURCE_SEED, "source", "seed", U64, source.seed, "1234", 0, 0, "", 0,      \
    "seed of the synthetic weights")                                           \
  X(SOURCE_UPDATE_RATE, "source", "update_rate", DOUBLE, source.update_rate,  \
    "0", 0, 1, "", REFIT_CONFIG_MIN_INCLUSIVE,                                 \
    "synthetic versions as optimizer-like updates of a master, each element "  \
    "moving by up to this fraction of itself (0 = independent versions)")     \
  X(SOURCE_PATH, "source", "path", STRING, source.path, "", 0, 0, "", 0,       \
    "checkpoint for source.kind hdf5 (a file) or safetensors (a file, or a "  \
    "directory with model.safetensors.index.json)")                            \
  X(REFERENCE_KIND, "reference", "kind", ENUM, reference.kind, "synthetic", 0, \
    0, "synthetic|hdf5|caller|safetensors", 0,                                 \
    "what generators verify against when source.kind is caller")               \
  X(REFERENCE_SEED, "reference", "seed", U64, reference.seed, "1234", 0, 0,    \
    "", 0, "seed of the synthetic reference")                                  \
  X(REFERENCE_PATH, "reference", "path", STRING, reference.path, "", 0, 0, "", \
    0, "checkpoint for reference.kind hdf5 or safetensors")                    \
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

/* The table's rows, in the order above (config_table.c). */
extern const refit_config_table_t refit_config_table;
extern const refit_config_row_t refit_config_rows[REFIT_CONFIG_ROW_COUNT];

#endif /* REFIT_CONFIG_TABLE_H */
