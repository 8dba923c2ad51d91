/*
 * The refit configuration: one YAML file, parsed with libyaml against a
 * table of keys (name, type, default, bounds, doc). A bad file never starts a
 * transfer: every problem is collected and reported at once as
 * "file:line:col: message" lines.
 */
#ifndef REFIT_CONFIG_H
#define REFIT_CONFIG_H

#include "refit/status.h"
#include "reshard/catalog.h"
#include "reshard/layout.h"
#include "reshard/plan.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { REFIT_MODE_SYNC = 0, REFIT_MODE_ASYNC = 1 } refit_mode_t;

typedef enum {
  REFIT_TRANSPORT_AUTO = 0,
  REFIT_TRANSPORT_MPI,
  REFIT_TRANSPORT_NCCL,
  REFIT_TRANSPORT_IPC,
  REFIT_TRANSPORT_UCX
} refit_transport_kind_t;

typedef enum {
  REFIT_PRECISION_BF16 = 0,
  REFIT_PRECISION_MXFP8 = 1,
  REFIT_PRECISION_FP8_BLOCK = 2, /* 128 x 128 blocks, FP32 weight_scale_inv */
  /* E2M1 + E4M3 per 16 along K + FP32 global scale from each whole tensor's
   * amax (kernels/nvfp4.h, docs/nvfp4.md): qwen3, llama and qwen3_moe. */
  REFIT_PRECISION_NVFP4 = 3
} refit_precision_t;

/* How block FP8 chooses a block's scale (kernels/fp8_block.h's modes, in
 * their order). */
typedef enum {
  REFIT_FP8_SCALE_MODE_FP32 = 0,
  REFIT_FP8_SCALE_MODE_POW2 = 1
} refit_fp8_scale_mode_t;

typedef enum {
  REFIT_SOURCE_SYNTHETIC = 0,
  REFIT_SOURCE_HDF5 = 1,
  REFIT_SOURCE_CALLER = 2, /* trainers send what they registered, as it is */
  REFIT_SOURCE_SAFETENSORS = 3 /* a file, or a directory with its index */
} refit_source_kind_t;

/* Dense MXFP8 GEMM backend of the generator; the same order as
 * refit_kernels_dense_backend_t in kernels/layout.h (config_rules.c asserts
 * it). */
typedef enum {
  REFIT_LINEAR_FLASHINFER_CUTLASS = 0,
  REFIT_LINEAR_FLASHINFER_CUTEDSL = 1,
  REFIT_LINEAR_FLASHINFER_TRTLLM = 2
} refit_linear_backend_t;

/* MoE backend of the generator: the expert layout of MXFP8 (TRTLLM-gen
 * only) and NVFP4 (either; kernels/layout.h refit_kernels_moe_backend_t,
 * same order). */
typedef enum {
  REFIT_MOE_FLASHINFER_TRTLLM = 0,
  REFIT_MOE_FLASHINFER_CUTLASS = 1
} refit_moe_backend_t;

/* What a generator keeps to roll back a failed refit. */
typedef enum { REFIT_RESTORE_FULL = 0, REFIT_RESTORE_NONE = 1 } refit_restore_t;

/* How ranks bind to GPUs: node-local rank modulo visible GPUs, or not at all.
 */
typedef enum {
  REFIT_DEVICE_MAP_LOCAL_RANK = 0,
  REFIT_DEVICE_MAP_NONE = 1
} refit_device_map_t;

/* What counts as one node when transports are chosen per pair of ranks:
 * ranks on one host (CUDA IPC between them, NCCL to other hosts), or ranks on
 * one GPU (IPC between them, NCCL between GPUs, also on one host). */
typedef enum {
  REFIT_LOCALITY_HOST = 0,
  REFIT_LOCALITY_GPU = 1
} refit_locality_t;

/* refit.zero_copy: whether a generator reads the BF16 tensors of trainers on
 * its own GPU in place (kernels/direct.h) instead of receiving them. auto:
 * when every trainer-generator pair of the plan shares a GPU and memory is
 * device memory; on: the same, refused at the first begin otherwise. */
typedef enum {
  REFIT_ZERO_COPY_AUTO = 0,
  REFIT_ZERO_COPY_ON = 1,
  REFIT_ZERO_COPY_OFF = 2
} refit_zero_copy_t;

/* refit.delta: whether trainers send only what changed since the last
 * committed version (runtime/src/session/delta_wire.h). off: every refit is full;
 * on: delta refits wherever the ranks hold that version's bytes, and a job
 * whose transport or memory cannot carry them is refused (config or first
 * begin); auto: the same, falling back to full refits there. Either quantizes
 * on the trainer as refit.prequantize does (under precision mxfp8). */
typedef enum {
  REFIT_DELTA_MODE_OFF = 0,
  REFIT_DELTA_MODE_ON = 1,
  REFIT_DELTA_MODE_AUTO = 2
} refit_delta_mode_t;

/* refit.delta_baseline: where a trainer whose buffers are device memory
 * keeps the last committed version's bytes (delta_wire.h): auto and device
 * in memory of its GPU, host in pinned host memory its GPU reads and writes
 * over the bus (no GPU memory for it, at the bus's bandwidth). A trainer on
 * host memory keeps it in host memory either way. */
typedef enum {
  REFIT_DELTA_BASELINE_AUTO = 0,
  REFIT_DELTA_BASELINE_DEVICE = 1,
  REFIT_DELTA_BASELINE_HOST = 2
} refit_delta_baseline_t;

/* Fault injection (tests only): the phase a fault fires in ... */
typedef enum {
  REFIT_FAULT_PHASE_TRANSFER = 0,
  REFIT_FAULT_PHASE_QUANTIZE = 1,
  REFIT_FAULT_PHASE_COMMIT = 2,
  REFIT_FAULT_PHASE_VERIFY = 3,
  REFIT_FAULT_PHASE_VOTE = 4,  /* the commit vote: stall holds this rank's
                                  vote back for 2 x timeout_s + 1 s */
  REFIT_FAULT_PHASE_OPEN = 5,  /* refit_session_open, as the transport opens */
  REFIT_FAULT_PHASE_REPAIR = 6, /* a begin's transport repair (after a failed
                                   refit): stall holds this rank for timeout_s
                                   + 1 s, past every peer's deadline, then it
                                   goes on */
  REFIT_FAULT_PHASE_AMAX = 7     /* begin: NVFP4's global amax exchange */
} refit_fault_phase_t;

/* ... and what it does there. */
typedef enum {
  REFIT_FAULT_KILL = 0,      /* SIGKILL the rank */
  REFIT_FAULT_EXIT = 1,      /* the rank exits with a failure status */
  REFIT_FAULT_STALL = 2,     /* the rank stops making progress */
  REFIT_FAULT_BITFLIP = 3,   /* flip one bit of the payload */
  REFIT_FAULT_TRUNCATE = 4,  /* send fewer bytes than announced */
  REFIT_FAULT_DROP = 5,      /* lose a message */
  REFIT_FAULT_DUPLICATE = 6, /* deliver a message twice */
  REFIT_FAULT_ERROR = 7,     /* the phase returns an error */
  REFIT_FAULT_STALE = 8      /* a trainer sends a bucket sealed as the
                                previous refit's (transfer phase) */
} refit_fault_action_t;

/* Is the fault seam (fault/fault.h) compiled in (test builds: CMake option
 * REFIT_TESTS)? A constant, so that without it every branch on it is dead
 * code; config_rules.c refuses refit.fault without it. */
/* What a build without it says of a fault it was asked for. */
#define REFIT_NO_FAULT_SEAM                                                     \
  "this build has no fault seam, which makes refits fail on purpose (a test "   \
  "build has it: configure with -DREFIT_TESTS=ON)"
#ifdef REFIT_HAVE_FAULTS
#define REFIT_FAULTS_BUILT 1
#else
#define REFIT_FAULTS_BUILT 0
#endif

/* The rules a fault obeys wherever it is given (refit.fault, REFIT_FAULT):
 * it fires on a rank of the job (world_size 0: not known yet), and in a
 * phase that runs (quantize only under a quantizing refit.precision, amax
 * only under nvfp4). */
static inline int refit_fault_rank_exists(int rank, int world_size) {
  return world_size <= 0 || rank < world_size;
}

static inline int refit_fault_phase_runs(int phase, int precision) {
  if (phase == REFIT_FAULT_PHASE_AMAX)
    return precision == REFIT_PRECISION_NVFP4;
  return phase != REFIT_FAULT_PHASE_QUANTIZE || precision != REFIT_PRECISION_BF16;
}

#define REFIT_PATH_MAX 1024
#define REFIT_QUANT_IGNORE_MAX 16 /* entries of refit.quantization_ignore */
#define REFIT_MODULE_NAME_MAX 96  /* bytes of one entry, NUL included */

typedef struct {
  refit_model_t model;
  /* model.hf_config: the Hugging Face config.json (or its directory) the
   * model shape was read from, as written in the file (relative paths are
   * relative to the YAML file's directory); "" when typed in YAML. */
  char hf_config[REFIT_PATH_MAX];
  refit_trainer_layout_t trainer;
  refit_generator_layout_t generator;
  struct {
    refit_mode_t mode;                /* sync (default) | async */
    refit_transport_kind_t transport; /* auto (default) | mpi | nccl | ipc | ucx */
    uint64_t bucket_bytes;            /* default 256MiB; 64KiB to 2GiB - 1 */
    uint64_t arena_bytes;             /* fp8_block/nvfp4 assembly bound; 4GiB,
                                         0 = none */
    refit_precision_t precision;      /* bf16 (default) | mxfp8 | fp8_block | nvfp4 */
    refit_fp8_scale_mode_t fp8_scale; /* fp8_block: fp32 (default) | pow2 */
    double timeout_s;                 /* default 300; > 0 */
    int steps;                        /* refits refit-run performs, default 3 */
    refit_linear_backend_t linear_backend; /* flashinfer_cutlass (default) */
    refit_moe_backend_t moe_backend;       /* flashinfer_trtllm | flashinfer_cutlass */
    int prequantize; /* quantize on the trainer before sending; default false */
    refit_delta_mode_t delta; /* off (default) | on | auto */
    refit_delta_baseline_t delta_baseline; /* auto (default) | device | host */
    /* Under delta on or auto, at most this many refits in a row are delta
     * ones minus one: every N-th committed refit is full, rewriting every
     * runtime byte (a delta refit reads and writes only the words it
     * changes, so damage elsewhere would last). 0 (default): no bound. */
    int delta_full_every;
    /* Modules left in bf16 under mxfp8 and fp8_block, by their runtime
     * (vLLM) names: an
     * entry matches a module when it equals whole dotted segments of its
     * name ("mlp.gate" matches model.layers.*.mlp.gate, not
     * mlp.gate_up_proj; "self_attn.qkv_proj", not q_proj). Default
     * [lm_head]. */
    char quantization_ignore[REFIT_QUANT_IGNORE_MAX][REFIT_MODULE_NAME_MAX];
    int quantization_ignore_count;
    refit_restore_t restore; /* full (default) | none */
    int digests;             /* per-chunk integrity digests; default true */
    int keep_staging;        /* default true */
    /* Every exchange sends its messages' lengths ahead over MPI
     * (transport_lengths.c) even where the transport reports lengths
     * itself: the path delta refits over NCCL take, on any transport (for
     * tests and diagnosis). Default false. */
    int lengths_ahead;
    /* Benchmark baseline: the straightforward path refit is measured
     * against: every tensor its own bucket, MoE layouts expert by expert.
     * Same bytes, slower. Default false. */
    int baseline;
    refit_device_map_t device_map; /* local_rank (default) | none */
    refit_locality_t locality;     /* host (default) | gpu */
    refit_zero_copy_t zero_copy;   /* auto (default) | on | off */
    /* File prefix of the per-bucket timelines (timeline.h): each rank
     * writes one file per committed refit; "" (default) records none. */
    char timeline[REFIT_PATH_MAX];
    struct {
      int enabled;        /* the file has a refit.fault mapping */
      int phase;          /* refit_fault_phase_t */
      int rank;           /* world rank that injects the fault */
      int action;         /* refit_fault_action_t */
      double at;          /* fraction of the phase's bytes, 0..1; default 0.5 */
      int refit;          /* which refit, 1-based; 0 = every refit; default 1 */
      double probability; /* 0 < p <= 1, default 1; below 1 each refit draws
                             with source.seed */
    } fault;
  } refit;
  struct {
    refit_source_kind_t kind; /* synthetic (default) | hdf5 | caller |
                                 safetensors */
    uint64_t seed;            /* default 1234 */
    double update_rate;       /* synthetic only: 0 (default) = independent
                                 versions, else updates of a master (synth.h) */
    char path[REFIT_PATH_MAX];
  } source;
  /* What generators verify against when source.kind is caller (the
   * trainer's weights are then the caller's, so verification needs an
   * independent statement of them): synthetic, hdf5 or safetensors. */
  struct {
    refit_source_kind_t kind;
    uint64_t seed;
    char path[REFIT_PATH_MAX];
  } reference;
  int verify;                    /* default true */
  char dump[REFIT_PATH_MAX];     /* "" = no dump */
} refit_config_t;

/* Fill *cfg with every default. */
void refit_config_defaults(refit_config_t *cfg);

/*
 * Parse and validate YAML text. `filename` is used only in messages.
 * `world_size` is the number of MPI ranks the job runs with, or 0 to skip the
 * world-size check (refit-plan). On failure *errors (if not NULL) receives a
 * malloc'd string with one "file:line:col: message" per line, the caller
 * frees it, and the status is REFIT_ERR_CONFIG (every value the table
 * accepts is implemented; REFIT_ERR_NO_MEMORY when memory runs out, with
 * *errors NULL). On success *cfg is filled and *errors is NULL.
 */
refit_status_t refit_config_parse(const char *text, size_t len,
                                  const char *filename, int world_size,
                                  refit_config_t *cfg, char **errors);

/* The largest configuration file refit reads: presets are a few KiB, and
 * the text is broadcast to every rank as one MPI message, whose count is an
 * int. */
#define REFIT_CONFIG_MAX_BYTES (1 << 20)

/* Read a file and parse it (as above). *text_out (if not NULL) receives the
 * malloc'd file text, which the caller frees. A path that is not a regular
 * file (a FIFO, a device) is refused with REFIT_ERR_SYSTEM without reading
 * it, a file over REFIT_CONFIG_MAX_BYTES with REFIT_ERR_CONFIG. */
refit_status_t refit_config_load(const char *path, int world_size,
                                 refit_config_t *cfg, char **errors,
                                 char **text_out, size_t *len_out);

/*
 * Parse a size such as "256MiB", "1GiB", "4096", "64KB": a decimal integer,
 * optionally followed (with or without a space) by B, KB, MB, GB, TB (powers
 * of 1000) or KiB, MiB, GiB, TiB (powers of 1024); unit letters are case
 * insensitive. Fractions, signs and overflow are errors (REFIT_ERR_CONFIG,
 * message in refit_last_error()). *bytes is set only on success.
 */
refit_status_t refit_config_parse_bytes(const char *text, uint64_t *bytes);


/*
 * 64-bit FNV-1a over every configured value (key names included), so ranks
 * can prove they run the same configuration even when their files differ in
 * comments or formatting. Not a cryptographic hash.
 */
uint64_t refit_config_hash(const refit_config_t *cfg);

/*
 * The effective configuration (defaults filled in) as YAML that
 * refit_config_parse() reads back to an equal configuration. *out receives a
 * malloc'd NUL-terminated string that the caller frees.
 * Errors: REFIT_ERR_NO_MEMORY.
 */
refit_status_t refit_config_format(const refit_config_t *cfg, char **out);

/* The format (refit_quant_t) refit.precision quantizes to, REFIT_QUANT_NONE
 * for bf16. */
int refit_config_quant_format(const refit_config_t *cfg);

/* The format generator tensor `g` is quantized to under `cfg` (refit_quant_t:
 * the precision's, for a quantizable kind not matched by
 * refit.quantization_ignore; else REFIT_QUANT_NONE, 0). Ignore entries are
 * matched against the runtime (vLLM) tensor names of the catalog, the same
 * ones refit_config_parse() requires every entry given to match when
 * quantizing. */
int refit_config_quantizes(const refit_config_t *cfg, const refit_gen_tensor_t *g);

/* Can generator tensor `g` be quantized to MXFP8 (or, under fp8_block, to
 * block FP8: reshard/blocks.h's rules) under `cfg` (its kind, the
 * block along K, trainer shards along K, the backends' own shape rules)? The
 * same rules refit_config_parse() applies to the tensors the config
 * quantizes, for a tensor the engine asks to quantize (it registered an
 * e4m3 weight). Errors: REFIT_ERR_CONFIG naming the tensor and each rule. */
refit_status_t refit_config_check_quantizable(const refit_config_t *cfg,
                                              const refit_catalog_t *cat,
                                              const refit_gen_tensor_t *g);

/* Set every catalog tensor's `quantized` flag from the config: before
 * planning, as the wire format depends on it. */
void refit_config_mark_quantized(const refit_config_t *cfg, refit_catalog_t *cat);

/* The planner options the config asks for (bucket size, wire format,
 * digest trailer, baseline buckets). */
void refit_config_plan_options(const refit_config_t *cfg, refit_plan_options_t *opt);

/* Under block FP8 with refit.prequantize, a tensor whose trainer shards split
 * a 128 x 128 block travels BF16 and is quantized on the generator (the plan
 * decides, reshard/plan.h), so a delta cannot be applied to it in place. True
 * when the plan has such a tensor, with a sentence naming the first, how
 * many there are and why, into why[len]. */
bool refit_config_block_fallback(const refit_catalog_t *cat, const refit_plan_t *plan,
                                 char *why, size_t len);

/* The rules between the config and its plan, checked once planned (every
 * rank, and refit-plan): refit.delta: on with a tensor that
 * refit_config_block_fallback names is REFIT_ERR_CONFIG saying what to
 * change (delta: auto runs full refits there instead, delta_wire.c). */
refit_status_t refit_config_plan_check(const refit_config_t *cfg,
                                       const refit_catalog_t *cat,
                                       const refit_plan_t *plan);

#endif /* REFIT_CONFIG_H */
