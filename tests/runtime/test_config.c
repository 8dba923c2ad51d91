/*
 * The configuration module's specification: every class of mistake in a
 * refit YAML file is reported with file:line:col and the words a person
 * needs to fix it, and every preset in configs/ parses.
 */
/* cmocka needs these first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "config/config.h"
#include "core/env.h"
#include "core/error.h"
#include "kernels/layout.h"
#include "reshard/catalog.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef REFIT_CONFIGS_DIR
#define REFIT_CONFIGS_DIR "configs"
#endif

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------ */

/* Strings made by a test, freed by its teardown. */
static char *arena[64];
static size_t narena;

static char *keep(char *s) {
  assert_non_null(s);
  assert_true(narena < sizeof(arena) / sizeof(arena[0]));
  arena[narena++] = s;
  return s;
}

static int teardown(void **state) {
  (void)state;
  for (size_t i = 0; i < narena; i++)
    free(arena[i]);
  narena = 0;
  return 0;
}

/* `base` with the first occurrence of `from` replaced by `to`. */
static const char *edit(const char *base, const char *from, const char *to) {
  const char *at = strstr(base, from);
  if (at == NULL)
    fail_msg("edit: '%s' not found in:\n%s", from, base);
  size_t head = (size_t)(at - base), nfrom = strlen(from), nto = strlen(to);
  char *out = malloc(strlen(base) - nfrom + nto + 1);
  assert_non_null(out);
  memcpy(out, base, head);
  memcpy(out + head, to, nto);
  strcpy(out + head + nto, at + nfrom);
  return keep(out);
}

static const char *cat(const char *a, const char *b) {
  char *out = malloc(strlen(a) + strlen(b) + 1);
  assert_non_null(out);
  strcpy(out, a);
  strcat(out, b);
  return keep(out);
}

/* `base` with `lines` added to its trainer section (after "  dp: 1"). */
static const char *in_trainer(const char *base, const char *lines) {
  return edit(base, "  dp: 1\n", cat("  dp: 1\n", lines));
}

static size_t count_lines(const char *s) {
  size_t n = 0;
  for (; *s; s++)
    n += *s == '\n';
  return n;
}

/* Parse `yaml` as demo.yaml; assert the status and every needle. */
static const char *check_(const char *yaml, int world, refit_status_t want,
                          refit_config_t *out, const char *const *needles) {
  refit_config_t cfg;
  char *errors = (char *)"unset";
  memset(&cfg, 0xab, sizeof(cfg));
  refit_status_t st =
      refit_config_parse(yaml, strlen(yaml), "demo.yaml", world, &cfg, &errors);
  if (st != want)
    fail_msg("status %s, want %s; errors:\n%s\nfor:\n%s", refit_status_name(st),
             refit_status_name(want), errors ? errors : "(none)", yaml);
  if (want == REFIT_OK) {
    assert_null(errors);
    if (out)
      *out = cfg;
    return NULL;
  }
  assert_non_null(errors);
  keep(errors);
  for (const char *const *n = needles; *n; n++)
    if (strstr(errors, *n) == NULL)
      fail_msg("expected '%s' in the errors:\n%s", *n, errors);
  return errors;
}

#define EXPECT_OK(yaml, world, cfg)                                                      \
  check_((yaml), (world), REFIT_OK, (cfg), (const char *const[]){NULL})
#define EXPECT_ERR(yaml, world, status, ...)                                             \
  check_((yaml), (world), (status), NULL, (const char *const[]){__VA_ARGS__, NULL})

/* A valid qwen3_moe config; line numbers below are relied on. */
static const char moe[] = "model:\n"                       /* 1 */
                          "  family: qwen3_moe\n"          /* 2 */
                          "  hidden_size: 256\n"           /* 3 */
                          "  num_layers: 4\n"              /* 4 */
                          "  num_attention_heads: 8\n"     /* 5 */
                          "  num_kv_heads: 4\n"            /* 6 */
                          "  head_dim: 32\n"               /* 7 */
                          "  vocab_size: 1024\n"           /* 8 */
                          "  num_experts: 8\n"             /* 9 */
                          "  moe_intermediate_size: 128\n" /* 10 */
                          "trainer:\n"                     /* 11 */
                          "  tp: 2\n"                      /* 12 */
                          "  pp: 1\n"                      /* 13 */
                          "  ep: 2\n"                      /* 14 */
                          "  etp: 1\n"                     /* 15 */
                          "  dp: 1\n"                      /* 16 */
                          "generator:\n"                   /* 17 */
                          "  tp: 2\n"                      /* 18 */
                          "  ep: 2\n"                      /* 19 */
                          "  engines: 1\n";                /* 20 */

/* A valid dense qwen3 config. */
static const char dense[] = "model:\n"                   /* 1 */
                            "  family: qwen3\n"          /* 2 */
                            "  hidden_size: 256\n"       /* 3 */
                            "  num_layers: 4\n"          /* 4 */
                            "  num_attention_heads: 8\n" /* 5 */
                            "  num_kv_heads: 4\n"        /* 6 */
                            "  head_dim: 32\n"           /* 7 */
                            "  vocab_size: 1024\n"       /* 8 */
                            "  intermediate_size: 512\n" /* 9 */
                            "trainer:\n"                 /* 10 */
                            "  tp: 2\n"                  /* 11 */
                            "  pp: 1\n"                  /* 12 */
                            "  dp: 1\n"                  /* 13 */
                            "generator:\n"               /* 14 */
                            "  tp: 2\n"                  /* 15 */
                            "  engines: 1\n";            /* 16 */

#define GEN_TP "generator:\n  tp: 2\n"
#define GEN_EP "  ep: 2\n  engines"
#define MXFP8 "refit:\n  precision: mxfp8\n"
#define FP8_BLOCK "refit:\n  precision: fp8_block\n"
#define NVFP4 "refit:\n  precision: nvfp4\n"

/* A fault appended to moe (lines 21-25). */
#define FAULT                                                                            \
  "refit:\n"              /* 21 */                                                       \
  "  fault:\n"            /* 22 */                                                       \
  "    phase: transfer\n" /* 23 */                                                       \
  "    rank: 3\n"         /* 24 */                                                       \
  "    action: bitflip\n" /* 25 */

static const char *const presets[] = {"demo.yaml", "qwen3-8b.yaml", "qwen3-30b-a3b.yaml",
                                      "qwen3-235b-a22b.yaml"};
#define NPRESETS (sizeof(presets) / sizeof(presets[0]))

/* ------------------------------------------------------------------------ */
/* Mistakes: a file and what its errors must say                             */
/* ------------------------------------------------------------------------ */

/*
 * One mistake. The text parsed (as demo.yaml, with `world` ranks; 0 skips
 * the world-size rule) is `base` (NULL: "") with `append` added, then each
 * `edit` made in order: the first occurrence of edit[i][0] becomes
 * edit[i][1]. It must fail with REFIT_ERR_CONFIG and errors holding each of
 * `want` ("demo.yaml:LINE:COL: message"), in that order when `ordered`;
 * with exactly `lines` problems when `lines` is not 0; and, when
 * `ok_without_append`, the text without `append` must parse.
 */
#define MAX_EDITS 6

typedef struct {
  int line; /* of the case in this file, for failures */
  const char *base;
  const char *append;
  const char *edit[MAX_EDITS][2];
  int world;
  int lines;
  bool ordered;
  bool ok_without_append;
  const char *want[9];
} mistake_t;

#define CASE(...)                                                                        \
  { .line = __LINE__, __VA_ARGS__ }

static const mistake_t mistakes[] = {
    /* ---- A bad value of an enum or a bool names the choices ---- */
    CASE(.base = moe, .append = "refit:\n  linear_backend: flashinfer_cutlas\n",
         .lines = 1,
         .want = {"demo.yaml:22:19: refit.linear_backend: expected one of "
                  "flashinfer_cutlass, flashinfer_cutedsl, flashinfer_trtllm, got "
                  "'flashinfer_cutlas' (did you mean 'flashinfer_cutlass'?)"}),
    CASE(.base = moe, .append = "refit:\n  linear_backend: cublas\n", .lines = 1,
         .want = {"demo.yaml:22:19: refit.linear_backend: expected one of "
                  "flashinfer_cutlass, flashinfer_cutedsl, flashinfer_trtllm, got "
                  "'cublas'\n"}),
    CASE(.base = moe, .append = "refit:\n  moe_backend: cutlass\n", .lines = 1,
         .want =
             {"demo.yaml:22:16: refit.moe_backend: expected one of flashinfer_trtllm, "
              "flashinfer_cutlass, got 'cutlass'"}),
    /* flashinfer_cutlass is NVFP4's only: MXFP8 experts are TRTLLM's. */
    CASE(.base = moe, .append = MXFP8 "  moe_backend: flashinfer_cutlass\n", .lines = 1,
         .want = {"demo.yaml:23:3: refit.moe_backend flashinfer_cutlass is built for "
                  "refit.precision nvfp4 only"}),
    CASE(.base = moe, .append = "refit:\n  restore: ful\n", .lines = 1,
         .want = {"demo.yaml:22:12: refit.restore: expected one of full, none, got 'ful' "
                  "(did you mean 'full'?)"}),
    CASE(.base = moe, .append = "refit:\n  device_map: local-rank\n", .lines = 1,
         .want = {"demo.yaml:22:15: refit.device_map: expected one of local_rank, none, "
                  "got 'local-rank' (did you mean 'local_rank'?)"}),
    CASE(.base = moe,
         .append = "refit:\n  fault:\n    phase: transfr\n    rank: 0\n"
                   "    action: kill\n",
         .lines = 1,
         .want = {"demo.yaml:23:12: refit.fault.phase: expected one of transfer, "
                  "quantize, commit, verify, vote, open, repair, amax, got 'transfr' "
                  "(did you "
                  "mean "
                  "'transfer'?)"}),
    CASE(.base = moe,
         .append = "refit:\n  fault:\n    phase: commit\n    rank: 0\n"
                   "    action: bitflp\n",
         .lines = 1,
         .want = {"demo.yaml:25:13: refit.fault.action: expected one of kill, exit, "
                  "stall, bitflip, truncate, drop, duplicate, error, stale, got 'bitflp' "
                  "(did you mean 'bitflip'?)"}),
    CASE(.base = moe, .append = "refit:\n  prequantize: sometimes\n", .lines = 1,
         .want = {"demo.yaml:22:16: refit.prequantize: expected true or false, got "
                  "'sometimes'"}),
    CASE(.base = moe, .append = "refit:\n  delta: sometimes\n", .lines = 1,
         .want = {"demo.yaml:22:10: refit.delta: expected one of off, on, auto, got "
                  "'sometimes'"}),
    CASE(.base = moe, .append = "refit:\n  delta: [on]\n", .lines = 1,
         .want = {"demo.yaml:22:10: refit.delta: expected one of off, on, auto, got a "
                  "sequence"}),
    CASE(.base = moe, .append = "refit:\n  digests: 2\n", .lines = 1,
         .want = {"demo.yaml:22:12: refit.digests: expected true or false, got '2'"}),
    CASE(.base = moe, .append = "refit:\n  keep_staging: []\n", .lines = 1,
         .want = {"demo.yaml:22:17: refit.keep_staging: expected true or false, got a "
                  "sequence"}),

    /* ---- refit.quantization_ignore: a sequence of names ---- */
    CASE(.base = moe, .append = "refit:\n  quantization_ignore: lm_head\n", .lines = 1,
         .want = {"demo.yaml:22:24: refit.quantization_ignore: expected a "
                  "sequence of at most 16 names such as [lm_head, mlp.gate] "
                  "([] for none), got a scalar 'lm_head'"}),
    CASE(.base = moe, .append = "refit:\n  quantization_ignore:\n",
         .want = {"demo.yaml:22:23: refit.quantization_ignore: expected a sequence",
                  "got a scalar"}),
    CASE(.base = moe, .append = "refit:\n  quantization_ignore: {lm_head: 1}\n",
         .want = {"demo.yaml:22:24: refit.quantization_ignore: expected a sequence",
                  "got a mapping"}),
    /* Items that are not strings, each at its own position. */
    CASE(.base = moe,
         .append = "refit:\n  quantization_ignore: [lm_head, 3, [a], {b: c}, "
                   "true, ~]\n",
         .lines = 5,
         .want = {"demo.yaml:22:34: refit.quantization_ignore[1]: expected a module name "
                  "(a string), got a number '3' (quote it if it is a name)",
                  "demo.yaml:22:37: refit.quantization_ignore[2]: expected a module name "
                  "(a string), got a sequence",
                  "demo.yaml:22:42: refit.quantization_ignore[3]: expected a module name "
                  "(a string), got a mapping",
                  "demo.yaml:22:50: refit.quantization_ignore[4]: expected a module name "
                  "(a string), got a boolean 'true'",
                  "demo.yaml:22:56: refit.quantization_ignore[5]: expected a module name "
                  "(a string), got null '~'"}),
    CASE(.base = moe,
         .append = "refit:\n  quantization_ignore:\n    - lm_head\n"
                   "    - ''\n    - lm_head\n",
         .want = {"demo.yaml:24:7: refit.quantization_ignore[1]: expected a module "
                  "name, got ''",
                  "demo.yaml:25:7: refit.quantization_ignore[2]: 'lm_head' is "
                  "listed twice (first as refit.quantization_ignore[0])"}),

    /* ---- refit.fault: a mapping like any section ---- */
    /* Unknown keys inside it get suggestions like any other. */
    CASE(.base = moe, .append = FAULT "    probabilty: 0.5\n",
         .want = {"demo.yaml:26:5: unknown key 'refit.fault.probabilty' (did you "
                  "mean 'probability'?)"}),
    CASE(.base = moe, .append = FAULT "    colour: red\n",
         .want = {"demo.yaml:26:5: unknown key 'refit.fault.colour'; valid "
                  "refit.fault keys are: phase, rank, action, at, refit, "
                  "probability"}),
    CASE(.base = moe, .append = "refit:\n  falt:\n    rank: 1\n",
         .want = {"demo.yaml:22:3: unknown key 'refit.falt' (did you mean "
                  "'fault'?)"}),
    CASE(.base = moe, .append = "fault:\n  rank: 1\n",
         .want = {"demo.yaml:21:1: unknown key 'fault' (did you mean "
                  "'refit.fault'?)"}),
    CASE(.base = moe, .append = "refit:\n  phase: commit\n",
         .want = {"demo.yaml:22:3: unknown key 'refit.phase' (did you mean "
                  "'refit.fault.phase'?)"}),
    /* Bounds. */
    CASE(.base = moe, .append = FAULT "    at: 1.5\n",
         .want = {"demo.yaml:26:9: refit.fault.at: expected a number from 0 to 1, "
                  "got '1.5'"}),
    CASE(.base = moe, .append = FAULT "    at: -0.1\n",
         .want = {"demo.yaml:26:9: refit.fault.at: expected a number from 0 to 1, "
                  "got '-0.1'"}),
    CASE(.base = moe, .append = FAULT "    probability: 0\n",
         .want = {"demo.yaml:26:18: refit.fault.probability: expected a number "
                  "greater than 0 and at most 1, got '0'"}),
    CASE(.base = moe, .append = FAULT "    refit: -1\n",
         .want = {"demo.yaml:26:12: refit.fault.refit: expected a non-negative "
                  "integer, got '-1'"}),
    CASE(.base = moe, .append = FAULT, .edit = {{"rank: 3", "rank: -3"}},
         .want = {"demo.yaml:24:11: refit.fault.rank: expected a non-negative "
                  "integer, got '-3'"}),
    /* phase, rank and action have no default: a fault names all three. */
    CASE(.base = moe, .append = "refit:\n  fault:\n    at: 0.1\n", .lines = 3,
         .want = {"demo.yaml:22:3: refit.fault.phase: missing required key",
                  "demo.yaml:22:3: refit.fault.rank: missing required key",
                  "demo.yaml:22:3: refit.fault.action: missing required key"}),
    CASE(.base = moe, .append = "refit:\n  fault: kill\n",
         .want = {"demo.yaml:22:10: refit.fault: expected a mapping of refit.fault "
                  "keys, got a scalar 'kill'"}),
    CASE(.base = moe, .append = FAULT "  fault:\n    rank: 1\n",
         .want = {"demo.yaml:26:3: duplicate section 'refit.fault' (first at line "
                  "22 column 3)"}),
    /* Rules: the rank exists; the phase runs. */
    CASE(.base = moe, .append = FAULT, .world = 3,
         .want = {"demo.yaml:24:5: refit.fault.rank: 3 is not a rank of this job "
                  "(world size 3, ranks 0..2)"}),
    CASE(.base = moe, .append = FAULT, .edit = {{"transfer", "quantize"}}, .world = 4,
         .want = {"demo.yaml:23:5: refit.fault.phase: a bf16 refit has no quantize "
                  "phase"}),

    /* ---- Syntax: libyaml's marks are 0-based, ours 1-based ---- */
    /* A second colon on one line. */
    CASE(.base = moe, .edit = {{"  head_dim: 32\n", "  head_dim: 32: 4\n"}}, .lines = 1,
         .want = {"demo.yaml:7:15: syntax error: mapping values are not "
                  "allowed in this context"}),
    /* An unclosed flow sequence names where the sequence started. */
    CASE(.base = moe, .edit = {{"  tp: 2\n", "  tp: [2\n"}},
         .want = {"demo.yaml:13:", "syntax error: did not find expected ',' or ']'",
                  "while parsing a flow sequence at line 12 column 7"}),
    /* Invalid UTF-8 is reported where the bad byte is. */
    CASE(.base = moe, .edit = {{"  head_dim: 32\n", "  head_dim: \xff\n"}},
         .want = {"demo.yaml:7:13: syntax error: ", "(byte 0xff)"}),
    CASE(.base = moe, .append = "---\nverify: false\n",
         .want = {"demo.yaml:22:1: only one YAML document is expected"}),

    /* ---- Unknown keys: the closest key, else the key's section ---- */
    CASE(.base = moe, .edit = {{"  hidden_size:", "  hiden_size:"}},
         .want = {"demo.yaml:3:3: unknown key 'model.hiden_size' (did you mean "
                  "'hidden_size'?)"}),
    CASE(.base = moe, .edit = {{"  etp: 1\n", "  etp: 1\n  tensor_parallel: 2\n"}},
         .want = {"demo.yaml:16:3: unknown key 'trainer.tensor_parallel'; valid "
                  "trainer keys are: tp, pp, ep, etp, dp, first_stage_layers, "
                  "last_stage_layers"}),
    /* The right key in the wrong section points at its section. */
    CASE(.base = moe, .edit = {{"  head_dim: 32\n", "  head_dim: 32\n  dp: 2\n"}},
         .want = {"demo.yaml:8:3: unknown key 'model.dp' (did you mean "
                  "'trainer.dp'?)"}),
    CASE(.base = moe, .edit = {{"trainer:", "trainr:"}},
         .want = {"demo.yaml:11:1: unknown key 'trainr' (did you mean "
                  "'trainer'?)"}),
    CASE(.base = moe, .append = "verfy: true\n",
         .want = {"demo.yaml:21:1: unknown key 'verfy' (did you mean 'verify'?)"}),
    CASE(.base = moe, .append = "steps: 3\n",
         .want = {"demo.yaml:21:1: unknown key 'steps' (did you mean "
                  "'refit.steps'?)"}),
    CASE(.base = moe, .append = "banana: 3\n",
         .want = {"demo.yaml:21:1: unknown key 'banana'; valid top-level keys "
                  "are: model, trainer, generator, refit, source, reference, verify, "
                  "dump"}),

    /* ---- Types ---- */
    CASE(.base = moe, .edit = {{"  tp: 2\n", "  tp: two\n"}},
         .want = {"demo.yaml:12:7: trainer.tp: expected a positive integer, got "
                  "'two'"}),
    CASE(.base = moe, .edit = {{"  head_dim: 32\n", "  head_dim: 32.0\n"}},
         .want = {"demo.yaml:7:13: model.head_dim: expected a positive integer, "
                  "got '32.0'"}),
    CASE(.base = moe, .edit = {{"qwen3_moe", "gemma3"}},
         .want = {"demo.yaml:2:11: model.family: expected one of qwen3, "
                  "qwen3_moe, llama, qwen2, deepseek_v3, got 'gemma3'"}),
    CASE(.base = moe, .append = "verify: maybe\n",
         .want = {"demo.yaml:21:9: verify: expected true or false, got 'maybe'"}),
    CASE(.base = moe, .append = "refit:\n  timeout_s: soon\n",
         .want = {"demo.yaml:22:14: refit.timeout_s: expected a number greater "
                  "than 0, got 'soon'"}),
    CASE(.base = moe, .append = "refit:\n  mode: fast\n",
         .want = {"refit.mode: expected one of sync, async, got 'fast'"}),
    CASE(.base = moe, .edit = {{"  tp: 2\n", "  tp:\n"}},
         .want = {"trainer.tp: expected a positive integer, got ''"}),
    /* A collection where a scalar is expected, and the other way round. */
    CASE(.base = moe, .edit = {{"  tp: 2\n", "  tp: [2, 4]\n"}},
         .want = {"demo.yaml:12:7: trainer.tp: expected a positive integer, got "
                  "a sequence"}),
    CASE(.base = moe, .edit = {{"  head_dim: 32\n", "  head_dim:\n    value: 32\n"}},
         .want = {"demo.yaml:8:5: model.head_dim: expected a positive integer, "
                  "got a mapping"}),
    CASE(.base = moe, .append = "refit: fast\n",
         .want = {"demo.yaml:21:8: refit: expected a mapping of refit keys, got a "
                  "scalar 'fast'"}),
    /* A section that is not a mapping is one error, not one per key. */
    CASE(.base = moe, .edit = {{"model:\n  family", "model: 7\nunused:\n  family"}},
         .world = 4, .lines = 2,
         .want = {"demo.yaml:1:8: model: expected a mapping of model keys, got "
                  "a scalar '7'",
                  "unknown key 'unused'"}),
    CASE(.append = "- model\n- trainer\n",
         .want = {"demo.yaml:1:1: expected a mapping of sections", "got a sequence"}),

    /* ---- Bounds ---- */
    CASE(.base = moe, .edit = {{"  tp: 2\n", "  tp: 0\n"}},
         .want = {"demo.yaml:12:7: trainer.tp: expected a positive integer, got "
                  "'0'"}),
    CASE(.base = moe, .edit = {{"  tp: 2\n", "  tp: -2\n"}},
         .want = {"trainer.tp: expected a positive integer, got '-2'"}),
    CASE(.base = moe, .edit = {{"  tp: 2\n", "  tp: 2000000\n"}},
         .want = {"trainer.tp: expected a positive integer no larger than 1048576, "
                  "got '2000000'"}),
    CASE(.base = moe,
         .edit = {{"  vocab_size: 1024\n", "  vocab_size: 99999999999999999999\n"}},
         .want = {"model.vocab_size: expected a positive integer no larger than "
                  "4194304, got '99999999999999999999'"}),
    /* Model bounds (config_table.h): a dimension past what any model needs
     * is refused at its key, before the planner sees it. */
    CASE(.base = moe, .edit = {{"  vocab_size: 1024\n", "  vocab_size: 4194305\n"}},
         .want = {"model.vocab_size: expected a positive integer no larger than "
                  "4194304, got '4194305'"}),
    CASE(.base = moe, .edit = {{"  num_experts: 8\n", "  num_experts: 4097\n"}},
         .want = {"model.num_experts: expected a non-negative integer no larger "
                  "than 4096, got '4097'"}),
    CASE(.base = moe, .append = "refit:\n  arena_bytes: -1\n",
         .want = {"refit.arena_bytes"}),
    CASE(.base = moe, .edit = {{"  num_experts: 8\n", "  num_experts: -1\n"}},
         .want = {"model.num_experts: expected a non-negative integer, got '-1'"}),
    CASE(.base = moe, .append = "refit:\n  timeout_s: 0\n",
         .want = {"refit.timeout_s: expected a number greater than 0, got '0'"}),
    CASE(.base = moe, .append = "refit:\n  steps: 0\n",
         .want = {"refit.steps: expected a positive integer, got '0'"}),
    CASE(.base = moe, .append = "refit:\n  bucket_bytes: 32KiB\n",
         .want = {"demo.yaml:22:17: refit.bucket_bytes: expected a size of at "
                  "least 64KiB",
                  "got '32KiB'"}),
    /* A bucket's message is counted in an MPI int: 2GiB would pass the
     * config and fail at the first exchange. */
    CASE(.base = moe, .append = "refit:\n  bucket_bytes: 2GiB\n", .lines = 1,
         .want = {"demo.yaml:22:17: refit.bucket_bytes: expected a size of at "
                  "least 64KiB and at most 2147483647 bytes, got '2GiB'"}),
    /* Sizes with units. */
    CASE(.base = moe, .append = "refit:\n  bucket_bytes: 10XB\n",
         .want = {"demo.yaml:22:17: refit.bucket_bytes: expected a size of at "
                  "least 64KiB such as 256MiB, 1GiB, 64KiB, 1MB or 4096, got "
                  "'10XB' (unknown unit 'XB'; use B, KB, MB, GB, TB, KiB, MiB, "
                  "GiB or TiB)"}),
    CASE(.base = moe, .append = "refit:\n  bucket_bytes: 1.5GiB\n",
         .want = {"got '1.5GiB' (fractions are not allowed; use a smaller unit)"}),
    CASE(.base = moe, .append = "refit:\n  bucket_bytes: lots\n",
         .want = {"got 'lots' (a size starts with a decimal number)"}),

    /* ---- Duplicates and missing keys ---- */
    /* The second tp is not used. */
    CASE(.base = moe, .edit = {{"  pp: 1\n", "  pp: 1\n  tp: 4\n"}}, .lines = 1,
         .want = {"demo.yaml:14:3: duplicate key 'trainer.tp' (first set at "
                  "line 12 column 3)"}),
    CASE(.base = moe, .append = "trainer:\n  dp: 2\n",
         .want = {"demo.yaml:21:1: duplicate section 'trainer' (first at line 11 "
                  "column 1)"}),
    CASE(.base = moe, .append = "verify: true\nverify: false\n",
         .want = {"demo.yaml:22:1: duplicate key 'verify' (first set at line 21 "
                  "column 1)"}),
    CASE(.base = moe, .edit = {{"  vocab_size: 1024\n", ""}, {"  head_dim: 32\n", ""}},
         .lines = 2,
         .want = {"demo.yaml:1:1: model.head_dim: missing required key (head dimension "
                  "D)",
                  "demo.yaml:1:1: model.vocab_size: missing required key (vocabulary "
                  "size V)"}),
    CASE(.append = "trainer:\n  tp: 1\n",
         .want = {"demo.yaml:1:1: missing required section 'model' (with keys "
                  "family, hidden_size, num_layers, num_attention_heads, "
                  "num_kv_heads, head_dim, vocab_size)"}),
    CASE(.append = "", .want = {"missing required section 'model'"}),
    CASE(.append = "# only a comment\n", .want = {"missing required section 'model'"}),

    /* ---- The world size ---- */
    CASE(.base = moe, .world = 5,
         .want = {"demo.yaml:11:1: world size 5 does not match trainer ranks 2 "
                  "(tp 2 * pp 1 * dp 1) + generator ranks 2 (tp 2 * engines 1) = "
                  "4"}),
    CASE(.base = moe, .edit = {{"  engines: 1", "  engines: 3"}}, .world = 4,
         .want = {"generator ranks 6 (tp 2 * engines 3) = 8"}),

    /* ---- Layout rules, each at the key it blames ---- */
    CASE(.base = moe, .edit = {{"  num_kv_heads: 4\n", "  num_kv_heads: 3\n"}},
         .want = {"demo.yaml:6:3: model.num_kv_heads: 3 does not divide "
                  "model.num_attention_heads 8"}),
    CASE(.base = moe, .edit = {{"  tp: 2\n", "  tp: 8\n"}},
         .want = {"demo.yaml:12:3: trainer.tp: 8 does not divide "
                  "model.num_kv_heads 4"}),
    CASE(.base = moe, .edit = {{"  tp: 2\n", "  tp: 3\n"}},
         .want = {"demo.yaml:12:3: trainer.tp: 3 does not divide "
                  "model.num_attention_heads 8"}),
    /* vLLM pads the vocabulary to 1088 = 2 * 544, and so does a Megatron
     * trainer (to 1280, a multiple of 128 * tp): only the trainer's tp. */
    CASE(.base = dense, .edit = {{"  vocab_size: 1024\n", "  vocab_size: 1025\n"}},
         .lines = 1,
         .want = {"demo.yaml:11:3: trainer.tp: 2 does not divide model.vocab_size "
                  "1025",
                  "trainer.tp"}),
    CASE(.base = dense,
         .edit = {{"  vocab_size: 1024\n", "  vocab_size: 1000\n"},
                  {GEN_TP, "generator:\n  tp: 3\n"}},
         .want = {"generator.tp: 3 does not divide model.vocab_size 1000 padded"}),
    /* Generator tp 2 divides 510. */
    CASE(.base = dense,
         .edit = {{"  tp: 2\n", "  tp: 4\n"},
                  {"  intermediate_size: 512\n", "  intermediate_size: 510\n"}},
         .lines = 1,
         .want = {"demo.yaml:11:3: trainer.tp: 4 does not divide "
                  "model.intermediate_size 510"}),
    CASE(.base = dense,
         .edit = {{GEN_TP, "generator:\n  tp: 4\n"},
                  {"  intermediate_size: 512\n", "  intermediate_size: 510\n"}},
         .want = {"demo.yaml:15:3: generator.tp: 4 does not divide "
                  "model.intermediate_size 510"}),
    CASE(.base = dense, .edit = {{GEN_TP, "generator:\n  tp: 16\n"}},
         .want = {"demo.yaml:15:3: generator.tp: 16 does not divide "
                  "model.num_attention_heads 8"}),
    /* Q 24, KV 4: tp 6 is above KV but not a multiple of it. */
    CASE(.base = dense,
         .edit = {{"  num_attention_heads: 8\n", "  num_attention_heads: 24\n"},
                  {"  vocab_size: 1024\n", "  vocab_size: 1536\n"},
                  {"  intermediate_size: 512\n", "  intermediate_size: 768\n"},
                  {GEN_TP, "generator:\n  tp: 6\n"}},
         .want = {"demo.yaml:15:3: generator.tp: 6 is larger than "
                  "model.num_kv_heads 4 but not a multiple of it"}),
    /* KV 6: tp 4 is below KV and does not divide it. */
    CASE(.base = dense,
         .edit = {{"  num_attention_heads: 8\n", "  num_attention_heads: 24\n"},
                  {"  vocab_size: 1024\n", "  vocab_size: 1536\n"},
                  {"  intermediate_size: 512\n", "  intermediate_size: 768\n"},
                  {"  num_kv_heads: 4\n", "  num_kv_heads: 6\n"},
                  {GEN_TP, "generator:\n  tp: 4\n"}},
         .lines = 1,
         .want = {"demo.yaml:15:3: generator.tp: 4 does not divide "
                  "model.num_kv_heads 6"}),
    CASE(.base = moe, .edit = {{"  ep: 2\n", "  ep: 3\n"}, {"  dp: 1\n", "  dp: 3\n"}},
         .want = {"demo.yaml:14:3: trainer.ep: 3 does not divide "
                  "model.num_experts 8"}),
    CASE(.base = moe,
         .edit = {{"  num_experts: 8\n", "  num_experts: 6\n"},
                  {GEN_TP, "generator:\n  tp: 4\n"},
                  {GEN_EP, "  ep: 4\n  engines"}},
         .want = {"demo.yaml:19:3: generator.ep: 4 does not divide "
                  "model.num_experts 6"}),
    CASE(.base = moe, .edit = {{"  ep: 2\n", "  ep: 4\n"}},
         .want = {"demo.yaml:14:3: trainer.etp * trainer.ep = 1 * 4 = 4 does not "
                  "divide trainer.tp * trainer.dp = 2 * 1 = 2"}),
    /* Folding blames trainer.ep, or trainer.etp when only it is given. */
    CASE(.base = moe, .edit = {{"  ep: 2\n  etp: 1\n", "  etp: 4\n"}}, .lines = 1,
         .want = {"demo.yaml:14:3: trainer.etp * trainer.ep = 4 * 1 = 4 does not divide "
                  "trainer.tp * trainer.dp = 2 * 1 = 2"}),
    CASE(.base = moe,
         .edit = {{"  ep: 2\n", "  ep: 1\n"},
                  {"  etp: 1\n", "  etp: 2\n"},
                  {"  moe_intermediate_size: 128\n", "  moe_intermediate_size: 129\n"}},
         .want = {"demo.yaml:15:3: trainer.etp: 2 does not divide "
                  "model.moe_intermediate_size 129"}),
    CASE(.base = moe, .edit = {{GEN_TP, "generator:\n  tp: 4\n"}},
         .want = {"demo.yaml:19:3: generator.ep: expected 1 or generator.tp (4), "
                  "got 2"}),
    CASE(.base = moe,
         .edit = {{GEN_TP, "generator:\n  tp: 4\n"},
                  {GEN_EP, "  ep: 1\n  engines"},
                  {"  moe_intermediate_size: 128\n", "  moe_intermediate_size: 130\n"}},
         .want = {"demo.yaml:18:3: generator.tp: 4 does not divide "
                  "model.moe_intermediate_size 130 (with generator.ep 1"}),
    /* Megatron-Core's local spec has no grouped experts. */
    CASE(.base = moe,
         .edit = {{"  dp: 1\n",
                   "  dp: 1\n  layout: megatron\n  spec: local\n  experts: grouped\n"}},
         .lines = 1,
         .want = {"demo.yaml:19:3: trainer.experts: grouped needs trainer.spec te "
                  "(Megatron-Core's local spec has SequentialMLP experts only)"}),

    /* ---- Each family's dimensions, and only those ---- */
    CASE(.base = dense, .edit = {{"  intermediate_size: 512\n", ""}},
         .want = {"demo.yaml:2:3: model.intermediate_size: a positive value is "
                  "required when model.family is qwen3"}),
    CASE(.base = moe, .edit = {{"  num_experts: 8\n", "  num_experts: 0\n"}},
         .want = {"demo.yaml:9:3: model.num_experts: a positive value is required "
                  "when model.family is qwen3_moe"}),
    CASE(.base = moe, .edit = {{"  moe_intermediate_size: 128\n", ""}},
         .want = {"demo.yaml:2:3: model.moe_intermediate_size: a positive value "
                  "is required when model.family is qwen3_moe"}),
    CASE(.base = dense,
         .edit = {{"  intermediate_size: 512\n",
                   "  intermediate_size: 512\n  num_experts: 8\n"}},
         .want = {"demo.yaml:10:3: model.num_experts: 8 is given but applies only "
                  "to model.family qwen3_moe"}),
    CASE(.base = moe,
         .edit = {{"  num_experts: 8\n",
                   "  num_experts: 8\n  intermediate_size: 6144\n"}},
         .want = {"model.intermediate_size: 6144 is given but applies only to "
                  "model.family qwen3"}),
    CASE(.base = dense,
         .edit = {{"  dp: 1\n", "  dp: 1\n  ep: 2\n  etp: 2\n"},
                  {"  engines: 1\n", "  ep: 2\n  engines: 1\n"}},
         .lines = 3,
         .want = {"demo.yaml:14:3: trainer.ep: 2 needs experts, but "
                  "model.family is qwen3 (dense)",
                  "demo.yaml:15:3: trainer.etp: 2 needs experts",
                  "demo.yaml:18:3: generator.ep: 2 needs experts"}),

    /* ---- Pipeline stages ---- */
    CASE(.base = moe, .edit = {{"  pp: 1\n", "  pp: 3\n"}},
         .want = {"demo.yaml:13:3: trainer.pp: 3 does not divide model.num_layers "
                  "4; set trainer.first_stage_layers or last_stage_layers"}),
    /* pp 4, L 10. */
    CASE(.base = moe,
         .edit = {{"  num_layers: 4\n", "  num_layers: 10\n"},
                  {"  pp: 1\n", "  pp: 4\n"},
                  {"  dp: 1\n",
                   "  dp: 1\n  first_stage_layers: 3\n  last_stage_layers: 2\n"}},
         .want = {"demo.yaml:17:3: trainer.first_stage_layers 3 and "
                  "trainer.last_stage_layers 2 leave 5 of model.num_layers 10 for "
                  "the other 2 stages of trainer.pp 4, which must split them "
                  "evenly"}),
    CASE(.base = moe,
         .edit = {{"  num_layers: 4\n", "  num_layers: 10\n"},
                  {"  pp: 1\n", "  pp: 4\n"},
                  {"  dp: 1\n", "  dp: 1\n  last_stage_layers: 8\n"}},
         .want = {"demo.yaml:17:3: trainer.last_stage_layers 8 leaves 2 of "
                  "model.num_layers 10 for the other 3 stages"}),
    CASE(.base = moe,
         .edit = {{"  num_layers: 4\n", "  num_layers: 10\n"},
                  {"  pp: 1\n", "  pp: 4\n"},
                  {"  dp: 1\n", "  dp: 1\n  last_stage_layers: 11\n"}},
         .want = {"trainer.last_stage_layers: 11 exceeds model.num_layers 10"}),
    /* pp 1: 0 or all layers. */
    CASE(.base = moe, .edit = {{"  dp: 1\n", "  dp: 1\n  first_stage_layers: 2\n"}},
         .want = {"demo.yaml:17:3: trainer.first_stage_layers: 2 must be 0 or "
                  "model.num_layers 4 when trainer.pp is 1"}),
    /* pp 2: first + last == L. */
    CASE(.base = moe,
         .edit = {{"  pp: 1\n", "  pp: 2\n"},
                  {"  dp: 1\n",
                   "  dp: 1\n  first_stage_layers: 1\n  last_stage_layers: 2\n"}},
         .want = {"demo.yaml:17:3: trainer.first_stage_layers 1 + "
                  "trainer.last_stage_layers 2 = 3, but model.num_layers is 4"}),
    CASE(.base = moe,
         .edit = {{"  pp: 1\n", "  pp: 2\n"},
                  {"  dp: 1\n", "  dp: 1\n  first_stage_layers: 4\n"}},
         .want = {"trainer.first_stage_layers 4 leaves 0 of model.num_layers 4 "
                  "for the other 1 stage of trainer.pp 2"}),

    /* ---- The source ---- */
    CASE(.base = moe, .append = "source:\n  path: w.h5\n",
         .want = {"demo.yaml:22:3: source.path: given but source.kind is "
                  "synthetic"}),
    CASE(.base = moe, .append = "source:\n  update_rate: 1.5\n",
         .want = {"demo.yaml:22:16: source.update_rate: expected a number from 0 "
                  "to 1, got '1.5'"}),
    CASE(.base = moe, .append = "source:\n  update_rate: -1e-4\n",
         .want = {"source.update_rate: expected a number from 0 to 1, got '-1e-4'"}),
    CASE(.base = moe, .append = "source:\n  update_rate: 1e-50\n",
         .want = {"demo.yaml:22:3: source.update_rate: 1e-50 rounds to 0 in FP32"}),
    CASE(.base = moe,
         .append = "source:\n  kind: hdf5\n  path: w.h5\n  update_rate: 1e-4\n",
         .lines = 1,
         .want = {"demo.yaml:24:3: source.update_rate: 0.0001 is for the synthetic "
                  "source, but source.kind is hdf5"}),

    /* ---- Many mistakes at once, in file order, each once ---- */
    CASE(.base = moe,
         .edit = {{"  num_kv_heads: 4\n", "  num_kv_heads: 3\n"},
                  {"  pp: 1\n", "  pp: 3\n"},
                  {"  ep: 2\n", "  ep: 3\n"},
                  {GEN_TP, "generator:\n  tp: 4\n"}},
         .world = 9, .lines = 8, .ordered = true,
         .want = {"demo.yaml:6:3: model.num_kv_heads: 3 does not divide "
                  "model.num_attention_heads 8",
                  "demo.yaml:11:1: world size 9 does not match trainer ranks 6",
                  "demo.yaml:12:3: trainer.tp: 2 does not divide model.num_kv_heads 3",
                  "demo.yaml:13:3: trainer.pp: 3 does not divide model.num_layers 4",
                  "demo.yaml:14:3: trainer.ep: 3 does not divide model.num_experts 8",
                  "demo.yaml:14:3: trainer.etp * trainer.ep = 1 * 3 = 3 does not divide",
                  "demo.yaml:18:3: generator.tp: 4 is larger than model.num_kv_heads 3",
                  "demo.yaml:19:3: generator.ep: expected 1 or generator.tp (4), got 2"}),
    /* A bad tp is reported once, not again by every rule that uses it. */
    CASE(.base = moe, .edit = {{"  tp: 2\n", "  tp: zwei\n"}}, .world = 4, .lines = 1,
         .want = {"trainer.tp: expected a positive integer, got 'zwei'"}),
    /* A missing head count does not divide by zero. */
    CASE(.base = moe, .edit = {{"  num_kv_heads: 4\n", ""}}, .world = 4, .lines = 1,
         .want = {"model.num_kv_heads: missing"}),

    /* ---- MXFP8 shapes: one problem under mxfp8, none in bf16 ---- */
    CASE(.base = dense, .edit = {{"  hidden_size: 256\n", "  hidden_size: 240\n"}},
         .append = MXFP8, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:3:3: model.layers.*.self_attn.qkv_proj.weight: weight "
                  "[N=256, K=240] cannot use MXFP8 backend flashinfer_cutlass: needs K % "
                  "32 == 0 (one scale per 32-element block along K) (K = "
                  "model.hidden_size 240; refit.precision mxfp8)"}),
    /* o_proj: the whole K = Q*D. */
    CASE(.base = dense, .edit = {{"  head_dim: 32\n", "  head_dim: 30\n"}},
         .append = MXFP8, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:7:3: model.layers.*.self_attn.o_proj.weight: weight "
                  "[N=256, K=240] cannot use MXFP8 backend flashinfer_cutlass: needs K % "
                  "32 == 0 (one scale per 32-element block along K) (K = "
                  "model.num_attention_heads * model.head_dim = 8 * 30 = 240; "
                  "refit.precision mxfp8)"}),
    /* Q*D = 192 is fine whole and over tp 2 (96), not over tp 4 (48). */
    CASE(.base = dense,
         .edit = {{"  head_dim: 32\n", "  head_dim: 24\n"}, {"  tp: 2\n", "  tp: 4\n"}},
         .append = MXFP8, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:11:3: model.layers.*.self_attn.o_proj.weight: K = "
                  "model.num_attention_heads * model.head_dim = 8 * 24 = 192 split over "
                  "trainer.tp 4 gives 48 per rank, not a multiple of 32: a trainer shard "
                  "boundary would cut an MXFP8 scale block (refit.precision mxfp8)"}),
    CASE(.base = dense,
         .edit = {{"  head_dim: 32\n", "  head_dim: 24\n"},
                  {GEN_TP, "generator:\n  tp: 4\n"}},
         .append = MXFP8, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:15:3: model.layers.*.self_attn.o_proj.weight: weight "
                  "[N=256, K=48] cannot use MXFP8 backend flashinfer_cutlass: needs K "
                  "% 32 == 0 (one scale per 32-element block along K) (K = "
                  "model.num_attention_heads * model.head_dim = 8 * 24 = 192 split "
                  "over generator.tp 4 = 48 per rank; refit.precision mxfp8)"}),
    /* An ignore entry that names no module does not keep o_proj in bf16. */
    CASE(.base = dense,
         .edit = {{"  head_dim: 32\n", "  head_dim: 24\n"},
                  {GEN_TP, "generator:\n  tp: 4\n"}},
         .append = MXFP8 "  quantization_ignore: [o_pro]\n",
         .want = {"self_attn.o_proj.weight: weight [N=256, K=48]",
                  "refit.quantization_ignore[0]: 'o_pro' matches no module"}),
    /* down_proj: K = F. */
    CASE(.base = dense,
         .edit = {{"  intermediate_size: 512\n", "  intermediate_size: 200\n"}},
         .append = MXFP8, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:9:3: model.layers.*.mlp.down_proj.weight: weight [N=256, "
                  "K=200] cannot use MXFP8 backend flashinfer_cutlass: needs K % 32 == 0 "
                  "(one scale per 32-element block along K) (K = model.intermediate_size "
                  "200; refit.precision mxfp8)"}),
    CASE(.base = dense,
         .edit = {{"  intermediate_size: 512\n", "  intermediate_size: 192\n"},
                  {"  tp: 2\n", "  tp: 4\n"}},
         .append = MXFP8, .lines = 1, .ok_without_append = true,
         .want =
             {"demo.yaml:11:3: model.layers.*.mlp.down_proj.weight: K = "
              "model.intermediate_size 192 split over trainer.tp 4 gives 48 per rank, "
              "not a multiple of 32: a trainer shard boundary would cut an MXFP8 "
              "scale block (refit.precision mxfp8)"}),
    CASE(.base = dense,
         .edit = {{"  intermediate_size: 512\n", "  intermediate_size: 192\n"},
                  {GEN_TP, "generator:\n  tp: 4\n"}},
         .append = MXFP8, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:15:3: model.layers.*.mlp.down_proj.weight: weight [N=256, "
                  "K=48] cannot use MXFP8 backend flashinfer_cutlass: needs K % 32 == 0 "
                  "(one scale per 32-element block along K) (K = model.intermediate_size "
                  "192 split over generator.tp 4 = 48 per rank; refit.precision mxfp8)"}),
    /* Experts: w2's K = I over trainer.etp 4: 48. */
    CASE(.base = moe,
         .edit = {{"  moe_intermediate_size: 128\n", "  moe_intermediate_size: 192\n"},
                  {"  ep: 2\n  etp: 1\n  dp: 1\n", "  ep: 1\n  etp: 4\n  dp: 2\n"}},
         .append = MXFP8, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:15:3: model.layers.*.mlp.experts.w2_weight: K = "
                  "model.moe_intermediate_size 192 split over trainer.etp 4 gives 48 per "
                  "rank, not a multiple of 32: a trainer shard boundary would cut an "
                  "MXFP8 scale block (refit.precision mxfp8)"}),
    /* ... over generator.tp 4 with ep 1: 48, the MoE layout's I rule. */
    CASE(.base = moe,
         .edit = {{"  moe_intermediate_size: 128\n", "  moe_intermediate_size: 192\n"},
                  {GEN_TP, "generator:\n  tp: 4\n"},
                  {GEN_EP, "  ep: 1\n  engines"}},
         .append = MXFP8, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:18:3: moe model.layers.*.mlp.experts: shape E=8 H=256 I=48 "
                  "(gated) breaks the flashinfer_trtllm MoE rule I % 32 == 0 (w2 scale "
                  "blocks run along I) (I per generator rank = "
                  "model.moe_intermediate_size 192 / generator.tp 4 with generator.ep 1; "
                  "refit.moe_backend flashinfer_trtllm, refit.precision mxfp8)"}),
    /* With whole experts per rank I itself must keep 2I % 128. */
    CASE(.base = moe,
         .edit = {{"  moe_intermediate_size: 128\n", "  moe_intermediate_size: 96\n"}},
         .append = MXFP8, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:10:3: moe model.layers.*.mlp.experts: shape E=4 H=256 I=96 "
                  "(gated) breaks the flashinfer_trtllm MoE rule 2I % 128 == 0 (w13 rows "
                  "are shuffled in 128-row tiles) (I = model.moe_intermediate_size 96, "
                  "whole experts on each generator rank; refit.moe_backend "
                  "flashinfer_trtllm, refit.precision mxfp8)"}),
    /* I 320 is fine whole, but 160 per rank breaks 2I % 128. */
    CASE(.base = moe,
         .edit = {{"  moe_intermediate_size: 128\n", "  moe_intermediate_size: 320\n"},
                  {GEN_EP, "  ep: 1\n  engines"}},
         .append = MXFP8, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:18:3: moe model.layers.*.mlp.experts: shape E=8 H=256 I=160 "
                  "(gated) breaks the flashinfer_trtllm MoE rule 2I % 128 == 0"}),
    /* H 224 is a multiple of 32 but not of 128. */
    CASE(.base = moe, .edit = {{"  hidden_size: 256\n", "  hidden_size: 224\n"}},
         .append = MXFP8, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:3:3: moe model.layers.*.mlp.experts: shape E=4 H=224 I=128 "
                  "(gated) breaks the flashinfer_trtllm MoE rule H % 128 == 0"}),
    /* H 384 suits cutlass, not trtllm: the backend is what to change. */
    CASE(.base = dense,
         .edit = {{"  hidden_size: 256\n", "  hidden_size: 384\n"},
                  {GEN_TP, "generator:\n  tp: 1\n"}},
         .append = MXFP8 "  linear_backend: flashinfer_trtllm\n", .lines = 1,
         .want = {"demo.yaml:19:3: model.layers.*.self_attn.qkv_proj.weight: weight "
                  "[N=512, K=384] cannot use MXFP8 backend flashinfer_trtllm: needs K % "
                  "256 == 0 (flashinfer_trtllm dense GEMM) (K = model.hidden_size 384; "
                  "refit.precision mxfp8)"}),
    /* Q*D and F per generator rank: 256/4 and 512/4. */
    CASE(.base = dense, .edit = {{GEN_TP, "generator:\n  tp: 4\n"}},
         .append = MXFP8 "  linear_backend: flashinfer_trtllm\n", .lines = 2,
         .want =
             {"demo.yaml:15:3: model.layers.*.self_attn.o_proj.weight: weight "
              "[N=256, K=64] cannot use MXFP8 backend flashinfer_trtllm: needs K % 256 "
              "== 0",
              "demo.yaml:15:3: model.layers.*.mlp.down_proj.weight: weight [N=256, "
              "K=128] cannot use MXFP8 backend flashinfer_trtllm: needs K % 256 == 0"}),
    /* refit.quantization_ignore names runtime modules: a checkpoint name
     * matches none and is an error at the entry, naming it, once. */
    CASE(.base = moe, .append = MXFP8 "  quantization_ignore: [lm_head, q_proj]\n",
         .lines = 1,
         .want =
             {"demo.yaml:23:34: refit.quantization_ignore[1]: 'q_proj' matches no "
              "module of the generator; entries name vLLM's runtime modules (the "
              "quantized ones of this model are self_attn.qkv_proj, self_attn.o_proj, "
              "mlp.experts)"}),
    CASE(.base = dense,
         .append = MXFP8 "  quantization_ignore:\n    - mlp.gate_up_proj\n"
                         "    - gate_proj\n",
         .lines = 1,
         .want =
             {"demo.yaml:21:7: refit.quantization_ignore[1]: 'gate_proj' matches no "
              "module of the generator; entries name vLLM's runtime modules (the "
              "quantized ones of this model are self_attn.qkv_proj, self_attn.o_proj, "
              "mlp.gate_up_proj, mlp.down_proj)"}),
    /* The shape rules follow what is quantized: with qkv_proj in bf16,
     * K = hidden_size is gate_up_proj's (dense) or the experts' w13. */
    CASE(.base = dense, .edit = {{"  hidden_size: 256\n", "  hidden_size: 240\n"}},
         .append = MXFP8 "  quantization_ignore: [lm_head, self_attn.qkv_proj]\n",
         .lines = 1,
         .want = {"demo.yaml:3:3: model.layers.*.mlp.gate_up_proj.weight: weight [N=512, "
                  "K=240] cannot use MXFP8 backend flashinfer_cutlass: needs K % 32 == 0 "
                  "(one scale per 32-element block along K) (K = model.hidden_size 240; "
                  "refit.precision mxfp8)"}),
    CASE(.base = moe, .edit = {{"  hidden_size: 256\n", "  hidden_size: 240\n"}},
         .append = MXFP8 "  quantization_ignore: [qkv_proj]\n", .lines = 1,
         .want = {"demo.yaml:3:3: model.layers.*.mlp.experts.w13_weight: K = "
                  "model.hidden_size 240 is not a multiple of 32, the MXFP8 block"}),
    CASE(.base = moe, .append = "refit:\n  prequantize: true\n", .lines = 1,
         .want = {"demo.yaml:22:3: refit.prequantize: true needs "
                  "refit.precision mxfp8 or fp8_block, got bf16"}),
    CASE(.base = moe, .append = "refit:\n  delta: on\n  delta_baseline: gpu\n",
         .lines = 1,
         .want = {"demo.yaml:23:19: refit.delta_baseline: expected one of auto, device, "
                  "host, got 'gpu'"}),
    CASE(.base = moe, .append = "refit:\n  delta_full_every: 8\n", .lines = 1,
         .want = {"demo.yaml:22:3: refit.delta_full_every: 8 has no effect with "
                  "refit.delta off (every refit is full); set delta: on or auto, or "
                  "remove it"}),
    CASE(.base = moe, .append = "refit:\n  delta: on\n  delta_full_every: -1\n",
         .lines = 1, .want = {"demo.yaml:23:21: refit.delta_full_every"}),
    /* ---- Block FP8: the shards vLLM refuses, at the key to change ---- */
    /* k and v of 2 KV heads of 32 per generator rank: 64 rows. */
    CASE(.base = dense, .append = FP8_BLOCK, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:15:3: model.layers.0.self_attn.qkv_proj.weight on generator "
                  "tp rank 0: the piece rows 0..63, columns 0..255 of "
                  "model.layers.0.self_attn.k_proj.weight [128, 256] cannot be "
                  "block-quantized: a tensor-parallel shard of a block-quantized "
                  "dimension is not a multiple of 128 (vLLM's validate_fp8_block_shape "
                  "refuses it) (refit.precision fp8_block)"}),
    /* hidden_size 320: partial blocks along K, padded with each tensor's last
     * element, which only the last tp rank's rows hold. */
    CASE(.base = dense,
         .edit = {{"  hidden_size: 256\n", "  hidden_size: 320\n"},
                  {"  head_dim: 32\n", "  head_dim: 64\n"}},
         .append = FP8_BLOCK, .ok_without_append = true,
         .want =
             {"demo.yaml:15:3: model.layers.0.self_attn.qkv_proj.weight on generator "
              "tp rank 0: the piece rows 0..255, columns 0..319 of "
              "model.layers.0.self_attn.q_proj.weight [512, 320] cannot be "
              "block-quantized: it has a partial 128 x 128 block but not the Hugging "
              "Face tensor's last element",
              "demo.yaml:15:3: model.layers.0.self_attn.o_proj.weight on generator tp "
              "rank 0"}),
    /* Experts of 64 rows: FusedMoE's rule, at the model key (ep: whole experts). */
    CASE(.base = moe,
         .edit = {{"  moe_intermediate_size: 128\n", "  moe_intermediate_size: 64\n"},
                  {"  head_dim: 32\n", "  head_dim: 64\n"}},
         .append = FP8_BLOCK, .lines = 2, .ok_without_append = true,
         .want = {"demo.yaml:10:3: model.layers.0.mlp.experts.w13_weight on generator tp "
                  "rank 0: the piece rows 0..63, columns 0..255 of "
                  "model.layers.0.mlp.experts.0.gate_proj.weight [64, 256] cannot be "
                  "block-quantized: an expert's intermediate size per rank is not a "
                  "multiple of 128 (vLLM's FusedMoE refuses it under block FP8)",
                  "demo.yaml:10:3: model.layers.0.mlp.experts.w2_weight"}),
    /* A delta refit applies the trainer's e4m3 bytes and scales in place:
     * block FP8 takes prequantize: true, said at refit.delta. */
    CASE(.base = moe, .edit = {{"  head_dim: 32\n", "  head_dim: 64\n"}},
         .append = FP8_BLOCK "  delta: auto\n", .lines = 1,
         .want = {"demo.yaml:23:3: refit.delta: auto with refit.precision fp8_block "
                  "needs refit.prequantize: true (a delta refit compares the trainer's "
                  "e4m3 bytes and block scales with the last committed ones and writes "
                  "the changed ones in place; without prequantize the generator "
                  "quantizes every tensor from BF16); set prequantize: true, or delta: "
                  "off"}),
    CASE(.base = moe, .edit = {{"  head_dim: 32\n", "  head_dim: 64\n"}},
         .append = FP8_BLOCK "  prequantize: false\n  delta: on\n", .lines = 1,
         .want = {"demo.yaml:24:3: refit.delta: on with refit.precision fp8_block needs "
                  "refit.prequantize: true"}),
    /* ---- NVFP4: what vLLM's NVFP4 linear and refit refuse ---- */
    CASE(.base = dense, .edit = {{"  family: qwen3\n", "  family: qwen2\n"}},
         .append = NVFP4, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:18:3: refit.precision nvfp4 is not supported for "
                  "model.family qwen2 yet"}),
    /* ---- NVFP4 experts: what vLLM's ModelOptNvFp4FusedMoE serves unpadded ---- */
    /* w2's K = I = 200 is no multiple of 16, at the model key. */
    CASE(.base = moe,
         .edit = {{"  moe_intermediate_size: 128\n", "  moe_intermediate_size: 200\n"}},
         .append = NVFP4, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:10:3: model.layers.*.mlp.experts.w2_weight: K = "
                  "model.moe_intermediate_size 200 is not a multiple of 16"}),
    /* TRTLLM: H 320 would be padded to 256's multiple by vLLM. */
    CASE(.base = moe, .edit = {{"  hidden_size: 256\n", "  hidden_size: 320\n"}},
         .append = NVFP4, .lines = 1, .ok_without_append = true,
         .want =
             {"demo.yaml:3:3: model.layers.*.mlp.experts: experts [E=4, H=320, I=128] "
              "cannot use NVFP4 MoE backend flashinfer_trtllm: needs H % 256 == 0",
              "refit.moe_backend flashinfer_trtllm, refit.precision nvfp4)"}),
    /* Whole experts of I 96: 2I = 192 is no multiple of 128 (either backend). */
    CASE(.base = moe,
         .edit = {{"  moe_intermediate_size: 128\n", "  moe_intermediate_size: 96\n"}},
         .append = NVFP4 "  moe_backend: flashinfer_cutlass\n", .lines = 1,
         .ok_without_append = true,
         .want =
             {"demo.yaml:10:3: model.layers.*.mlp.experts: experts [E=4, H=256, I=96] "
              "cannot use NVFP4 MoE backend flashinfer_cutlass: needs 2I % 128 == 0",
              "(I = model.moe_intermediate_size 96, whole experts on each generator "
              "rank; refit.moe_backend flashinfer_cutlass, refit.precision nvfp4)"}),
    /* I 192 is fine whole, but 96 per rank of generator tp 2 with ep 1 is not. */
    CASE(.base = moe,
         .edit = {{"  moe_intermediate_size: 128\n", "  moe_intermediate_size: 192\n"},
                  {GEN_EP, "  ep: 1\n  engines"}},
         .append = NVFP4, .lines = 1, .ok_without_append = true,
         .want =
             {"demo.yaml:18:3: model.layers.*.mlp.experts: experts [E=8, H=256, I=96] "
              "cannot use NVFP4 MoE backend flashinfer_trtllm: needs 2I % 128 == 0",
              "(I per generator rank = model.moe_intermediate_size 192 / generator.tp "
              "2 with generator.ep 1;"}),
    /* down_proj's K = 520 is no multiple of 16, at the model key. */
    CASE(.base = dense,
         .edit = {{"  intermediate_size: 512\n", "  intermediate_size: 520\n"}},
         .append = NVFP4, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:9:3: model.layers.*.mlp.down_proj.weight: K = "}),
    /* 528 is, but not the 264 of each of 2 generator ranks. */
    CASE(.base = dense,
         .edit = {{"  intermediate_size: 512\n", "  intermediate_size: 528\n"}},
         .append = NVFP4, .lines = 1, .ok_without_append = true,
         .want = {"demo.yaml:15:3: model.layers.*.mlp.down_proj.weight: K = "}),
    CASE(.base = dense, .append = NVFP4 "  prequantize: true\n", .lines = 1,
         .want = {"demo.yaml:19:3: refit.prequantize: true is not supported with "
                  "refit.precision nvfp4"}),
    CASE(.base = dense, .append = NVFP4 "  delta: on\n", .lines = 1,
         .want = {"demo.yaml:19:3: refit.delta: on is not supported with "
                  "refit.precision nvfp4"}),
    CASE(.base = moe, .append = MXFP8 "  fp8_scale: pow2\n", .lines = 1,
         .want = {"demo.yaml:23:3: refit.fp8_scale: pow2 has no effect with "
                  "refit.precision mxfp8"}),
    CASE(.base = moe, .append = "refit:\n  delta: on\n  zero_copy: on\n", .lines = 1,
         .want = {"demo.yaml:22:3: refit.delta: on cannot be combined with "
                  "refit.zero_copy: on (zero copy moves no weight bytes to compare); "
                  "use zero_copy: off, or delta: auto"}),
};

/* `text` with edit[i][0] replaced by edit[i][1], in order. */
static const char *apply_edits(const char *text, const char *const (*edits)[2]) {
  for (size_t i = 0; i < MAX_EDITS && edits[i][0] != NULL; i++)
    text = edit(text, edits[i][0], edits[i][1]);
  return text;
}

static void test_mistakes(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(mistakes) / sizeof(mistakes[0]); i++) {
    const mistake_t *m = &mistakes[i];
    const char *base = m->base ? m->base : "";
    const char *yaml = apply_edits(cat(base, m->append ? m->append : ""), m->edit);
    refit_config_t cfg;
    char *errors = NULL;
    const refit_status_t st =
        refit_config_parse(yaml, strlen(yaml), "demo.yaml", m->world, &cfg, &errors);
    if (st != REFIT_ERR_CONFIG)
      fail_msg(
          "test_config.c:%d: status %s, want REFIT_ERR_CONFIG; errors:\n%s\nfor:\n%s",
          m->line, refit_status_name(st), errors ? errors : "(none)", yaml);
    keep(errors);
    const char *from = errors;
    for (const char *const *w = m->want; *w != NULL; w++) {
      const char *at = strstr(m->ordered ? from : errors, *w);
      if (at == NULL)
        fail_msg("test_config.c:%d: expected '%s'%s in the errors:\n%s", m->line, *w,
                 m->ordered ? " (in this order)" : "", errors);
      from = at + 1;
    }
    if (m->lines > 0 && count_lines(errors) != (size_t)m->lines)
      fail_msg("test_config.c:%d: expected %d problems, got:\n%s", m->line, m->lines,
               errors);
    if (m->ok_without_append)
      EXPECT_OK(apply_edits(base, m->edit), m->world, NULL);
    teardown(NULL); /* each case's strings */
  }
}

/* ------------------------------------------------------------------------ */
/* Single values                                                            */
/* ------------------------------------------------------------------------ */

static void test_parse_bytes_units(void **state) {
  (void)state;
  static const struct {
    const char *text;
    uint64_t bytes;
  } good[] = {
      {"4096", 4096},
      {"64KiB", 65536},
      {"256MiB", UINT64_C(256) << 20},
      {"1GiB", UINT64_C(1) << 30},
      {"2TiB", UINT64_C(2) << 40},
      {"1MB", 1000000},
      {"64KB", 64000},
      {"3GB", UINT64_C(3000000000)},
      {"12B", 12},
      {"1 GiB", UINT64_C(1) << 30},
      {"1mib", UINT64_C(1) << 20},
  };
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    uint64_t v = 0;
    assert_int_equal(refit_config_parse_bytes(good[i].text, &v), REFIT_OK);
    assert_int_equal(v, good[i].bytes);
  }
  static const struct {
    const char *text;
    const char *why;
  } bad[] = {
      {"", "starts with a decimal number"},
      {"MiB", "starts with a decimal number"},
      {"-1", "starts with a decimal number"},
      {"1.5GiB", "fractions are not allowed"},
      {"10XB", "unknown unit 'XB'"},
      {"1 M", "unknown unit 'M'"},
      {"99999999999999999999", "does not fit in 64 bits"},
      {"17179869184GiB", "does not fit in 64 bits"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    uint64_t v = 77;
    assert_int_equal(refit_config_parse_bytes(bad[i].text, &v), REFIT_ERR_CONFIG);
    assert_int_equal(v, 77); /* untouched on failure */
    if (strstr(refit_last_error(), bad[i].why) == NULL)
      fail_msg("'%s': want '%s' in '%s'", bad[i].text, bad[i].why, refit_last_error());
  }
}

/* core/env.h: each kind read and bounded through the table; unset and empty
 * are "not set"; a name outside the table, or read as another kind, is a
 * programming error. */
static void test_env_table(void **state) {
  (void)state;
  int set = 7, choice = -1;
  int64_t v = -1;
  const char *text = NULL;
  unsetenv("REFIT_DEBUG");
  assert_int_equal(refit_env_choice("REFIT_DEBUG", &choice, &set), REFIT_OK);
  assert_int_equal(set, 0);
  setenv("REFIT_DEBUG", "", 1);
  assert_int_equal(refit_env_choice("REFIT_DEBUG", &choice, &set), REFIT_OK);
  assert_int_equal(set, 0);
  setenv("REFIT_DEBUG", "trace", 1);
  assert_int_equal(refit_env_choice("REFIT_DEBUG", &choice, &set), REFIT_OK);
  assert_int_equal(set, 1);
  assert_int_equal(choice, 3);
  setenv("REFIT_DEBUG", "loud", 1);
  choice = -1;
  assert_int_equal(refit_env_choice("REFIT_DEBUG", &choice, &set), REFIT_ERR_CONFIG);
  assert_int_equal(choice, -1);
  assert_non_null(strstr(refit_last_error(), "REFIT_DEBUG='loud'"));
  assert_non_null(strstr(refit_last_error(), "NONE|WARN|INFO|TRACE"));
  unsetenv("REFIT_DEBUG");
  static const struct {
    const char *text;
    int ok;
    int64_t value;
  } ints[] = {{"1", 1, 1}, {"16", 1, 16}, {"0", 0, 0}, {"17", 0, 0}, {"4x", 0, 0}, {"-3", 0, 0}};
  for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
    setenv("REFIT_KERNELS_THREADS", ints[i].text, 1);
    v = -1;
    const refit_status_t st = refit_env_int("REFIT_KERNELS_THREADS", &v, &set);
    if (ints[i].ok) {
      assert_int_equal(st, REFIT_OK);
      assert_int_equal(v, ints[i].value);
    } else {
      assert_int_equal(st, REFIT_ERR_CONFIG);
      assert_int_equal(v, -1);
      if (strstr(refit_last_error(), "REFIT_KERNELS_THREADS") == NULL ||
          strstr(refit_last_error(), "from 1 to 16") == NULL)
        fail_msg("'%s': want the variable and its bounds in '%s'", ints[i].text,
                 refit_last_error());
    }
  }
  unsetenv("REFIT_KERNELS_THREADS");
  setenv("REFIT_AGENT_DIR", "/some/dir", 1);
  assert_int_equal(refit_env_text("REFIT_AGENT_DIR", &text, &set), REFIT_OK);
  assert_int_equal(set, 1);
  assert_string_equal(text, "/some/dir");
  unsetenv("REFIT_AGENT_DIR");
  assert_int_equal(refit_env_text("REFIT_DEBUG", &text, &set), REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_env_int("REFIT_NO_SUCH", &v, &set), REFIT_ERR_INVALID_ARGUMENT);
  int n = 0;
  const refit_env_var_t *vars = refit_env_vars(&n);
  assert_true(n >= 10);
  for (int i = 0; i < n; i++) {
    assert_non_null(vars[i].precedence);
    assert_true(vars[i].kind != REFIT_ENV_CHOICE || vars[i].choices != NULL);
  }
}

/* REFIT_STARTUP_TIMEOUT_S: finite seconds in (0, one day]; everything else
 * refused naming the variable (issue 37, defect 10: inf was accepted). */
static void test_startup_timeout_parsed(void **state) {
  (void)state;
  static const struct {
    const char *text;
    double seconds;
  } good[] = {{"300", 300}, {"4", 4}, {"0.5", 0.5}, {"86400", 86400}, {"1e2", 100}};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    double v = 0;
    assert_int_equal(refit_env_parse_seconds("REFIT_STARTUP_TIMEOUT_S", good[i].text, &v), REFIT_OK);
    assert_true(v == good[i].seconds);
  }
  static const char *const bad[] = {"inf",   "INF", "infinity", "nan", "1e999",
                                    "0",     "-5",  "",         "10s", "5 ",
                                    "86401", "abc", "0x0p0"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    double v = 77;
    assert_int_equal(refit_env_parse_seconds("REFIT_STARTUP_TIMEOUT_S", bad[i], &v), REFIT_ERR_CONFIG);
    assert_true(v == 77); /* untouched on failure */
    if (strstr(refit_last_error(), "REFIT_STARTUP_TIMEOUT_S") == NULL ||
        strstr(refit_last_error(), bad[i]) == NULL)
      fail_msg("'%s': want the variable and the value in '%s'", bad[i],
               refit_last_error());
  }
  assert_int_equal(refit_env_parse_seconds("REFIT_STARTUP_TIMEOUT_S", NULL, &(double){0}),
                   REFIT_ERR_INVALID_ARGUMENT);
  /* A name outside core/env.h's table is a programming error. */
  assert_int_equal(refit_env_parse_seconds("REFIT_NO_SUCH", "5", &(double){0}),
                   REFIT_ERR_INVALID_ARGUMENT);
}

static void test_defaults_applied(void **state) {
  (void)state;
  refit_config_t d;
  refit_config_defaults(&d);
  assert_int_equal(d.refit.bucket_bytes, UINT64_C(256) << 20);
  assert_true(d.refit.timeout_s == 300.0);
  assert_int_equal(d.refit.steps, 3);
  assert_int_equal(d.refit.mode, REFIT_MODE_SYNC);
  assert_int_equal(d.refit.transport, REFIT_TRANSPORT_AUTO);
  assert_int_equal(d.refit.precision, REFIT_PRECISION_BF16);
  assert_int_equal(d.source.kind, REFIT_SOURCE_SYNTHETIC);
  assert_int_equal(d.source.seed, 1234);
  assert_string_equal(d.source.path, "");
  assert_true(d.source.update_rate == 0.0);
  assert_int_equal(d.verify, 1);
  assert_string_equal(d.dump, "");
  assert_int_equal(d.model.tie_word_embeddings, 0);
  assert_int_equal(d.trainer.tp, 1);
  assert_int_equal(d.trainer.pp, 1);
  assert_int_equal(d.trainer.ep, 1);
  assert_int_equal(d.trainer.etp, 1);
  assert_int_equal(d.trainer.dp, 1);
  assert_int_equal(d.trainer.first_stage_layers, 0);
  assert_int_equal(d.trainer.last_stage_layers, 0);
  assert_int_equal(d.generator.tp, 1);
  assert_int_equal(d.generator.ep, 1);
  assert_int_equal(d.generator.engines, 1);
  assert_int_equal(d.refit.linear_backend, REFIT_LINEAR_FLASHINFER_CUTLASS);
  assert_int_equal(d.refit.moe_backend, REFIT_MOE_FLASHINFER_TRTLLM);
  assert_int_equal(d.refit.prequantize, 0);
  assert_int_equal(d.refit.delta, REFIT_DELTA_MODE_OFF);
  assert_int_equal(d.refit.quantization_ignore_count, 1);
  assert_string_equal(d.refit.quantization_ignore[0], "lm_head");
  assert_int_equal(d.refit.restore, REFIT_RESTORE_FULL);
  assert_int_equal(d.refit.digests, 1);
  assert_int_equal(d.refit.keep_staging, 1);
  assert_int_equal(d.refit.lengths_ahead, 0);
  assert_int_equal(d.refit.device_map, REFIT_DEVICE_MAP_LOCAL_RANK);
  assert_int_equal(d.refit.fault.enabled, 0);
  assert_true(d.refit.fault.at == 0.5);
  assert_int_equal(d.refit.fault.refit, 1);
  assert_true(d.refit.fault.probability == 1.0);

  /* Only the model: everything else comes from the defaults. */
  refit_config_t cfg;
  const char *yaml = edit(dense,
                          "trainer:\n  tp: 2\n  pp: 1\n  dp: 1\n"
                          "generator:\n  tp: 2\n  engines: 1\n",
                          "");
  EXPECT_OK(yaml, 2, &cfg);
  assert_int_equal(cfg.model.family, REFIT_FAMILY_QWEN3);
  assert_int_equal(cfg.model.hidden_size, 256);
  assert_int_equal(cfg.model.intermediate_size, 512);
  assert_int_equal(cfg.model.num_experts, 0);
  /* trainer.layout auto resolves to hf for a synthetic source. */
  assert_int_equal(d.trainer.names, REFIT_TRAINER_NAMES_AUTO);
  assert_int_equal(cfg.trainer.names, REFIT_TRAINER_NAMES_HF);
  refit_trainer_layout_t resolved = d.trainer;
  resolved.names = REFIT_TRAINER_NAMES_HF;
  assert_int_equal(refit_config_hash(&cfg), refit_config_hash(&(refit_config_t){
                                                .model = cfg.model,
                                                .trainer = resolved,
                                                .generator = d.generator,
                                                .refit = d.refit,
                                                .source = d.source,
                                                .reference = d.reference,
                                                .verify = d.verify,
                                            }));
  assert_int_equal(cfg.refit.bucket_bytes, UINT64_C(256) << 20);
  assert_int_equal(cfg.verify, 1);

  /* An empty section means "all defaults" too. */
  EXPECT_OK(cat(yaml, "trainer:\nrefit:\n"), 2, &cfg);
  assert_int_equal(cfg.trainer.tp, 1);
}

static void test_values_parsed(void **state) {
  (void)state;
  refit_config_t cfg;
  EXPECT_OK(cat(moe, "refit:\n"
                     "  bucket_bytes: 64MB\n"
                     "  timeout_s: 12.5\n"
                     "  steps: 7\n"
                     "  transport: mpi\n"
                     "source:\n"
                     "  seed: 18446744073709551615\n"
                     "  update_rate: 2.5e-4\n"
                     "verify: off\n"),
            4, &cfg);
  assert_int_equal(cfg.model.family, REFIT_FAMILY_QWEN3_MOE);
  assert_int_equal(cfg.model.num_experts, 8);
  assert_int_equal(cfg.trainer.ep, 2);
  assert_int_equal(cfg.generator.ep, 2);
  assert_int_equal(cfg.refit.bucket_bytes, 64000000);
  assert_true(cfg.refit.timeout_s == 12.5);
  assert_int_equal(cfg.refit.steps, 7);
  assert_int_equal(cfg.refit.transport, REFIT_TRANSPORT_MPI);
  assert_true(cfg.source.seed == UINT64_MAX);
  assert_true(cfg.source.update_rate == 2.5e-4);
  assert_int_equal(cfg.verify, 0);
}

static void test_refit_keys_parsed(void **state) {
  (void)state;
  refit_config_t cfg;
  EXPECT_OK(cat(moe, "refit:\n"
                     "  precision: mxfp8\n"
                     "  linear_backend: flashinfer_cutedsl\n"
                     "  moe_backend: flashinfer_trtllm\n"
                     "  prequantize: true\n"
                     "  restore: none\n"
                     "  digests: false\n"
                     "  keep_staging: off\n"
                     "  device_map: none\n"),
            4, &cfg);
  assert_int_equal(cfg.refit.precision, REFIT_PRECISION_MXFP8);
  assert_int_equal(cfg.refit.linear_backend, REFIT_LINEAR_FLASHINFER_CUTEDSL);
  assert_int_equal(cfg.refit.moe_backend, REFIT_MOE_FLASHINFER_TRTLLM);
  assert_int_equal(cfg.refit.prequantize, 1);
  assert_int_equal(cfg.refit.restore, REFIT_RESTORE_NONE);
  assert_int_equal(cfg.refit.digests, 0);
  assert_int_equal(cfg.refit.keep_staging, 0);
  assert_int_equal(cfg.refit.device_map, REFIT_DEVICE_MAP_NONE);
  assert_int_equal(cfg.refit.fault.enabled, 0);
}

/* refit.delta: a delta refit compares the trainer's wire bytes, so under
 * mxfp8 it quantizes on the trainer (the plan's wire is MXFP8) without
 * prequantize; at bf16 the wire stays BF16. */
static void test_delta_keys_parsed(void **state) {
  (void)state;
  refit_config_t cfg;
  refit_plan_options_t opt;
  EXPECT_OK(cat(moe, MXFP8 "  delta: auto\n"), 0, &cfg);
  assert_int_equal(cfg.refit.delta, REFIT_DELTA_MODE_AUTO);
  assert_int_equal(cfg.refit.prequantize, 0);
  refit_config_plan_options(&cfg, &opt);
  assert_int_equal(opt.wire, REFIT_WIRE_MXFP8);
  EXPECT_OK(cat(moe, MXFP8 "  delta: off\n"), 0, &cfg);
  refit_config_plan_options(&cfg, &opt);
  assert_int_equal(opt.wire, REFIT_WIRE_BF16);
  EXPECT_OK(cat(moe, "refit:\n  delta: on\n"), 0, &cfg);
  assert_int_equal(cfg.refit.delta, REFIT_DELTA_MODE_ON);
  refit_config_plan_options(&cfg, &opt);
  assert_int_equal(opt.wire, REFIT_WIRE_BF16);
}

/* The config spells each dense backend as the kernels do, in their order. */
static void test_linear_backend_names_match_kernels(void **state) {
  (void)state;
  for (int b = 0; b < REFIT_KERNELS_DENSE_COUNT; b++) {
    refit_config_t cfg;
    char line[96];
    snprintf(line, sizeof(line), "refit:\n  linear_backend: %s\n",
             refit_kernels_dense_backend_name((refit_kernels_dense_backend_t)b));
    EXPECT_OK(cat(moe, line), 0, &cfg);
    assert_int_equal(cfg.refit.linear_backend, b);
  }
}

/* Strings longer than their keys take (the other bounds: mistakes[]). */
static void test_string_too_long(void **state) {
  (void)state;
  char *long_path = keep(malloc(REFIT_PATH_MAX + 32));
  strcpy(long_path, "dump: ");
  memset(long_path + 6, 'x', REFIT_PATH_MAX);
  strcpy(long_path + 6 + REFIT_PATH_MAX, "\n");
  EXPECT_ERR(cat(moe, long_path), 0, REFIT_ERR_CONFIG,
             "dump: expected a string shorter than 1024 bytes, got "
             "'xxxxxxxx",
             "...'");
}

static void test_quantization_ignore_list(void **state) {
  (void)state;
  refit_config_t cfg;
  /* Default [lm_head]; a flow list, a block list and [] replace it. */
  EXPECT_OK(moe, 0, &cfg);
  assert_int_equal(cfg.refit.quantization_ignore_count, 1);
  assert_string_equal(cfg.refit.quantization_ignore[0], "lm_head");
  EXPECT_OK(cat(moe, "refit:\n  quantization_ignore: [lm_head, mlp.gate]\n"), 0, &cfg);
  assert_int_equal(cfg.refit.quantization_ignore_count, 2);
  assert_string_equal(cfg.refit.quantization_ignore[0], "lm_head");
  assert_string_equal(cfg.refit.quantization_ignore[1], "mlp.gate");
  EXPECT_OK(cat(moe, "refit:\n  quantization_ignore:\n    - mlp.gate\n"
                     "    - \"7\"\n"),
            0, &cfg);
  assert_int_equal(cfg.refit.quantization_ignore_count, 2);
  assert_string_equal(cfg.refit.quantization_ignore[0], "mlp.gate");
  assert_string_equal(cfg.refit.quantization_ignore[1], "7");
  EXPECT_OK(cat(moe, "refit:\n  quantization_ignore: []\n"), 0, &cfg);
  assert_int_equal(cfg.refit.quantization_ignore_count, 0);

  /* Too long an entry, too many entries (the other mistakes: mistakes[]). */
  char *item = keep(malloc(REFIT_MODULE_NAME_MAX + 64));
  strcpy(item, "refit:\n  quantization_ignore: [");
  size_t off = strlen(item);
  memset(item + off, 'm', REFIT_MODULE_NAME_MAX);
  strcpy(item + off + REFIT_MODULE_NAME_MAX, "]\n");
  EXPECT_ERR(cat(moe, item), 0, REFIT_ERR_CONFIG,
             "demo.yaml:22:25: refit.quantization_ignore[0]: expected a "
             "module name shorter than 96 bytes, got 'mmmm");
  char many[512] = "refit:\n  quantization_ignore:\n";
  for (int i = 0; i < REFIT_QUANT_IGNORE_MAX + 2; i++)
    snprintf(many + strlen(many), sizeof(many) - strlen(many), "    - layer%d\n", i);
  const char *errors = EXPECT_ERR(cat(moe, many), 0, REFIT_ERR_CONFIG,
                                  "demo.yaml:39:7: refit.quantization_ignore: at most 16 "
                                  "entries, got 18");
  assert_int_equal(count_lines(errors), 1);
  EXPECT_OK(cat(moe, edit(many, "    - layer16\n    - layer17\n", "")), 0, &cfg);
  assert_int_equal(cfg.refit.quantization_ignore_count, 16);
  assert_string_equal(cfg.refit.quantization_ignore[15], "layer15");

  /* In the hash and the formatted config, which parses back. */
  refit_config_t a, b;
  EXPECT_OK(cat(moe, "refit:\n  quantization_ignore: [lm_head, \"a\\\"b\"]\n"), 0, &a);
  assert_string_equal(a.refit.quantization_ignore[1], "a\"b");
  char *text = NULL;
  assert_int_equal(refit_config_format(&a, &text), REFIT_OK);
  keep(text);
  assert_non_null(strstr(text, "  quantization_ignore: [\"lm_head\", "
                               "\"a\\\"b\"]  # "));
  EXPECT_OK(text, 0, &b);
  assert_int_equal(b.refit.quantization_ignore_count, 2);
  assert_string_equal(b.refit.quantization_ignore[1], "a\"b");
  assert_true(refit_config_hash(&a) == refit_config_hash(&b));
  EXPECT_OK(cat(moe, "refit:\n  quantization_ignore: [lm_head]\n"), 0, &b);
  assert_true(refit_config_hash(&a) != refit_config_hash(&b));
  EXPECT_OK(moe, 0, &a); /* the default list is the same value */
  assert_true(refit_config_hash(&a) == refit_config_hash(&b));
}

/* refit.fault is a mapping like any section (its mistakes: mistakes[]). */
static void test_fault_mapping(void **state) {
  (void)state;
  refit_config_t cfg;
  EXPECT_OK(cat(moe, FAULT), 4, &cfg);
  assert_int_equal(cfg.refit.fault.enabled, 1);
  assert_int_equal(cfg.refit.fault.phase, REFIT_FAULT_PHASE_TRANSFER);
  assert_int_equal(cfg.refit.fault.rank, 3);
  assert_int_equal(cfg.refit.fault.action, REFIT_FAULT_BITFLIP);
  assert_true(cfg.refit.fault.at == 0.5);
  assert_int_equal(cfg.refit.fault.refit, 1);
  assert_true(cfg.refit.fault.probability == 1.0);
  EXPECT_OK(cat(moe, "refit: {fault: {phase: verify, rank: 0, action: error, "
                     "at: 1, refit: 0, probability: 0.25}}\n"),
            4, &cfg);
  assert_int_equal(cfg.refit.fault.phase, REFIT_FAULT_PHASE_VERIFY);
  assert_int_equal(cfg.refit.fault.action, REFIT_FAULT_ERROR);
  assert_true(cfg.refit.fault.at == 1.0);
  assert_int_equal(cfg.refit.fault.refit, 0);
  assert_true(cfg.refit.fault.probability == 0.25);
  /* An empty fault mapping means no fault. */
  EXPECT_OK(cat(moe, "refit:\n  fault:\n"), 4, &cfg);
  assert_int_equal(cfg.refit.fault.enabled, 0);
  /* at's bound includes 0; the quantize phase runs under mxfp8. */
  EXPECT_OK(cat(moe, FAULT "    at: 0\n"), 0, &cfg);
  assert_true(cfg.refit.fault.at == 0.0);
  EXPECT_OK(edit(edit(cat(moe, FAULT), "transfer", "quantize"), "refit:\n",
                 "refit:\n  precision: mxfp8\n"),
            4, NULL);

  /* In the formatted config and the hash only when given. */
  refit_config_t a, b;
  char *text = NULL;
  EXPECT_OK(cat(moe, FAULT "    at: 0.25\n  digests: false\n"), 4, &a);
  assert_int_equal(refit_config_format(&a, &text), REFIT_OK);
  keep(text);
  assert_non_null(strstr(text, "\n  fault:  # "));
  assert_non_null(strstr(text, "\n    at: 0.25  # "));
  EXPECT_OK(text, 4, &b);
  assert_int_equal(b.refit.fault.enabled, 1);
  assert_true(b.refit.fault.at == 0.25);
  assert_int_equal(b.refit.digests, 0);
  assert_true(refit_config_hash(&a) == refit_config_hash(&b));
  EXPECT_OK(moe, 4, &b);
  assert_int_equal(refit_config_format(&b, &text), REFIT_OK);
  keep(text);
  assert_null(strstr(text, "fault"));
  assert_true(refit_config_hash(&a) != refit_config_hash(&b));
  a = b;
  a.refit.fault.at = 0.75; /* unused while no fault is given */
  assert_true(refit_config_hash(&a) == refit_config_hash(&b));
}

/* ------------------------------------------------------------------------ */
/* Rules between keys                                                       */
/* ------------------------------------------------------------------------ */

/* What the layout rules allow is accepted (what they refuse: mistakes[]). */
static void test_layouts_accepted(void **state) {
  (void)state;
  refit_config_t cfg;
  EXPECT_OK(moe, 4, NULL);
  EXPECT_OK(moe, 0, NULL); /* 0 skips the world-size check (refit-plan) */
  /* vLLM pads the vocabulary to 1088 = 2 * 544, and so does a Megatron
   * trainer (to 1280, a multiple of 128 * tp). */
  EXPECT_OK(edit(edit(dense, "  vocab_size: 1024\n", "  vocab_size: 1025\n"),
                 "trainer:\n", "trainer:\n  layout: megatron\n"),
            0, &cfg);
  assert_int_equal(cfg.trainer.names, REFIT_TRAINER_NAMES_MEGATRON);
  /* tp > KV is fine when it is a multiple: each KV head is replicated. */
  EXPECT_OK(edit(dense, GEN_TP, "generator:\n  tp: 8\n"), 0, &cfg);
  assert_int_equal(cfg.generator.tp, 8);
  /* Six experts over ep 2 on both sides. */
  EXPECT_OK(edit(moe, "  num_experts: 8\n", "  num_experts: 6\n"), 0, NULL);
  /* With dp 2 the same ep 4 folds. */
  EXPECT_OK(edit(edit(moe, "  ep: 2\n", "  ep: 4\n"), "  dp: 1\n", "  dp: 2\n"), 0, NULL);
  /* etp 2 splits each expert's I = 128. */
  EXPECT_OK(edit(edit(moe, "  ep: 2\n", "  ep: 1\n"), "  etp: 1\n", "  etp: 2\n"), 0,
            NULL);
  /* generator.ep is 1 or generator.tp. */
  const char *g = edit(moe, GEN_TP, "generator:\n  tp: 4\n");
  EXPECT_OK(edit(g, GEN_EP, "  ep: 1\n  engines"), 0, NULL);
  EXPECT_OK(edit(g, GEN_EP, "  ep: 4\n  engines"), 0, NULL);
  /* With ep == tp each rank holds whole experts: no I split. */
  EXPECT_OK(edit(edit(g, GEN_EP, "  ep: 4\n  engines"), "  moe_intermediate_size: 128\n",
                 "  moe_intermediate_size: 130\n"),
            0, NULL);
}

static void test_stage_layers(void **state) {
  (void)state;
  const char *pp3 = edit(moe, "  pp: 1\n", "  pp: 3\n");

  /* pp 3, first 2: the other two stages split the remaining 2. */
  refit_config_t cfg;
  int64_t first[9];
  EXPECT_OK(in_trainer(pp3, "  first_stage_layers: 2\n"), 0, &cfg);
  assert_int_equal(refit_stage_layers(&cfg.model, &cfg.trainer, first), REFIT_OK);
  assert_int_equal(first[1], 2);
  assert_int_equal(first[2], 3);
  assert_int_equal(first[3], 4);

  /* pp 4, L 10: first 2 + last 2 leave 6 for the 2 middle stages. */
  const char *l10 = edit(edit(moe, "  num_layers: 4\n", "  num_layers: 10\n"),
                         "  pp: 1\n", "  pp: 4\n");
  EXPECT_OK(in_trainer(l10, "  first_stage_layers: 2\n  last_stage_layers: 2\n"), 0,
            &cfg);
  assert_int_equal(refit_stage_layers(&cfg.model, &cfg.trainer, first), REFIT_OK);
  assert_int_equal(first[1], 2);
  assert_int_equal(first[2], 5);
  assert_int_equal(first[3], 8);
  assert_int_equal(first[4], 10);

  /* pp 1: 0 or all layers. */
  EXPECT_OK(in_trainer(moe, "  first_stage_layers: 4\n"), 0, NULL);

  /* pp 2: first + last == L, an unspecified one inferred. */
  const char *pp2 = edit(moe, "  pp: 1\n", "  pp: 2\n");
  EXPECT_OK(in_trainer(pp2, "  first_stage_layers: 1\n"), 0, &cfg);
  assert_int_equal(refit_stage_layers(&cfg.model, &cfg.trainer, first), REFIT_OK);
  assert_int_equal(first[1], 1);
  assert_int_equal(first[2], 4);
  EXPECT_OK(in_trainer(pp2, "  last_stage_layers: 1\n"), 0, &cfg);
  assert_int_equal(refit_stage_layers(&cfg.model, &cfg.trainer, first), REFIT_OK);
  assert_int_equal(first[1], 3);
  assert_int_equal(first[2], 4);
}

/* The layout rules come from reshard/rules.c: each is reported at the key
 * of the field it blames, which must be a key of the file. */
static void test_layout_rules_at_their_keys(void **state) {
  (void)state;
  for (int f = REFIT_FIELD_NONE + 1; f < REFIT_FIELD_COUNT; f++) {
    char yaml[160];
    const char *name = refit_field_name((refit_field_t)f);
    const char *dot = strchr(name, '.');
    assert_non_null(dot);
    snprintf(yaml, sizeof(yaml), "%.*s:\n  %s: 1\n", (int)(dot - name), name, dot + 1);
    refit_config_t cfg;
    char *errors = NULL;
    assert_int_not_equal(
        refit_config_parse(yaml, strlen(yaml), "demo.yaml", 0, &cfg, &errors), REFIT_OK);
    keep(errors);
    if (strstr(errors, "unknown key") != NULL)
      fail_msg("field %s is no key:\n%s", name, errors);
  }
}

/* ------------------------------------------------------------------------ */
/* MXFP8 shape rules                                                        */
/* ------------------------------------------------------------------------ */

/* What the MXFP8 shape rules allow is accepted (what they refuse, and
 * that it passes in bf16: mistakes[]). */
static void test_mxfp8_accepted(void **state) {
  (void)state;
  /* A module kept in bf16 has no MXFP8 rule: o_proj's K = 48 per rank. */
  const char *g4 = edit(edit(dense, "  head_dim: 32\n", "  head_dim: 24\n"), GEN_TP,
                        "generator:\n  tp: 4\n");
  EXPECT_OK(cat(g4, MXFP8 "  quantization_ignore: [lm_head, "
                          "self_attn.o_proj]\n"),
            0, NULL);
  /* H 384 suits cutlass, not trtllm. */
  const char *h384 = edit(edit(dense, "  hidden_size: 256\n", "  hidden_size: 384\n"),
                          GEN_TP, "generator:\n  tp: 1\n");
  EXPECT_OK(cat(h384, MXFP8), 0, NULL);
  /* With qkv_proj and gate_up_proj in bf16, no quantized tensor has
   * K = hidden_size 240. */
  const char *h240 = edit(dense, "  hidden_size: 256\n", "  hidden_size: 240\n");
  EXPECT_OK(cat(h240, MXFP8 "  quantization_ignore: [qkv_proj, gate_up_proj]\n"), 0,
            NULL);
  /* prequantize needs mxfp8, and false needs nothing. */
  EXPECT_OK(cat(moe, "refit:\n  prequantize: false\n"), 0, NULL);
  EXPECT_OK(cat(moe, MXFP8 "  prequantize: true\n"), 0, NULL);
  /* delta: auto falls back to full refits where on is refused; on runs over
   * mpi and ucx, at bf16 too. */
  EXPECT_OK(cat(moe, "refit:\n  delta: auto\n  transport: nccl\n"), 0, NULL);
  EXPECT_OK(cat(moe, "refit:\n  delta: on\n  transport: ucx\n"), 0, NULL);
  EXPECT_OK(cat(moe, MXFP8 "  delta: on\n"), 0, NULL);
}

/* refit.quantization_ignore names the generator's runtime modules (vLLM's
 * names), the ones refit_config_quantizes matches. */
/* Block FP8 layouts vLLM accepts: generator tp 1 with partial blocks (each
 * tensor whole on every rank), and 128-row shards at tp 2, ep or not. */
static void test_fp8_block_accepted(void **state) {
  (void)state;
  refit_config_t cfg;
  const char *partial =
      edit(edit(edit(dense, "  hidden_size: 256\n", "  hidden_size: 320\n"),
                "  head_dim: 32\n", "  head_dim: 64\n"),
           GEN_TP, "generator:\n  tp: 1\n");
  EXPECT_OK(cat(partial, FP8_BLOCK "  fp8_scale: pow2\n"), 0, &cfg);
  assert_int_equal(cfg.refit.precision, REFIT_PRECISION_FP8_BLOCK);
  assert_int_equal(cfg.refit.fp8_scale, REFIT_FP8_SCALE_MODE_POW2);
  const char *moe64 = edit(moe, "  head_dim: 32\n", "  head_dim: 64\n");
  EXPECT_OK(cat(moe64, FP8_BLOCK), 0, &cfg);
  assert_int_equal(cfg.refit.fp8_scale, REFIT_FP8_SCALE_MODE_FP32);
  EXPECT_OK(cat(edit(edit(moe64, GEN_EP, "  ep: 1\n  engines"),
                     "  moe_intermediate_size: 128\n", "  moe_intermediate_size: 256\n"),
                FP8_BLOCK),
            0, &cfg);
  /* NVFP4: a dense qwen3 and llama at generator tp 2, K of 128 and 256. */
  EXPECT_OK(cat(dense, NVFP4), 0, &cfg);
  assert_int_equal(cfg.refit.precision, REFIT_PRECISION_NVFP4);
  assert_int_equal(refit_config_quant_format(&cfg), REFIT_QUANT_NVFP4);
  EXPECT_OK(cat(edit(dense, "  family: qwen3\n", "  family: llama\n"), NVFP4), 0, &cfg);
  /* Quantized on the trainer: the block FP8 wire (tensors whose trainer
   * shards split a block travel BF16, the plan decides; not refused). */
  EXPECT_OK(cat(moe64, FP8_BLOCK "  prequantize: true\n"), 0, &cfg);
  refit_plan_options_t opt;
  refit_config_plan_options(&cfg, &opt);
  assert_int_equal(opt.wire, REFIT_WIRE_FP8_BLOCK);
  EXPECT_OK(cat(partial, FP8_BLOCK "  prequantize: true\n"), 0, &cfg);
  /* Delta refits with prequantize (on or auto; a tensor that falls back to
   * BF16 is the plan's to judge, refit_config_plan_check). */
  EXPECT_OK(cat(moe64, FP8_BLOCK "  prequantize: true\n  delta: on\n"), 0, &cfg);
  refit_config_plan_options(&cfg, &opt);
  assert_int_equal(opt.wire, REFIT_WIRE_FP8_BLOCK);
  EXPECT_OK(cat(partial, FP8_BLOCK "  delta: auto\n  prequantize: true\n"), 0, &cfg);
  /* qkv_proj kept in bf16: its KV shards of 64 rows are not quantized. */
  EXPECT_OK(
      cat(dense, FP8_BLOCK "  quantization_ignore: [lm_head, self_attn.qkv_proj]\n"), 0,
      &cfg);
}

static void test_quantization_ignore_runtime_names(void **state) {
  (void)state;
  refit_config_t cfg;
  refit_catalog_t *c = NULL;
  /* qkv_proj keeps q, k and v in bf16; o_proj and the experts stay MXFP8;
   * the router never is (vLLM builds it with quant_config=None). */
  EXPECT_OK(cat(moe, MXFP8 "  quantization_ignore: [lm_head, qkv_proj]\n"), 0, &cfg);
  assert_int_equal(refit_catalog_create(&cfg.model, &cfg.trainer, &cfg.generator, &c),
                   REFIT_OK);
  refit_config_mark_quantized(&cfg, c);
  int seen = 0;
  for (int64_t i = 0; i < c->gen_begin[c->generator.tp]; i++) {
    const refit_gen_tensor_t *g = &c->gen[i];
    if (strstr(g->name, ".qkv_proj.") || strstr(g->name, ".mlp.gate.") ||
        strstr(g->name, "norm") || strstr(g->name, "embed_tokens") ||
        strcmp(g->name, "lm_head.weight") == 0)
      assert_int_equal(g->quantized, 0);
    else
      assert_int_equal(g->quantized, 1); /* o_proj, w13, w2 */
    seen += strstr(g->name, ".qkv_proj.") != NULL;
  }
  assert_int_equal(seen, 2 * 4); /* 2 ranks, 4 layers */
  refit_catalog_destroy(c);

  /* Modules kept in bf16 anyway may be named (mlp.gate, lm_head); a
   * checkpoint name may not (mistakes[]). */
  EXPECT_OK(cat(moe, MXFP8 "  quantization_ignore: [lm_head, mlp.gate]\n"), 0, NULL);
  /* A bf16 refit quantizes nothing and leaves the list unused. */
  EXPECT_OK(cat(moe, "refit:\n  quantization_ignore: [q_proj]\n"), 0, NULL);

  /* Tied embeddings have no lm_head: the default [lm_head] is no error,
   * nor is the formatted config, which writes it out. */
  const char *tied =
      cat(edit(moe, "  moe_intermediate_size: 128\n",
               "  moe_intermediate_size: 128\n  tie_word_embeddings: true\n"),
          MXFP8);
  EXPECT_OK(tied, 0, &cfg);
  assert_int_equal(cfg.model.tie_word_embeddings, 1);
  char *text = NULL;
  assert_int_equal(refit_config_format(&cfg, &text), REFIT_OK);
  keep(text);
  EXPECT_OK(text, 0, NULL);
}

static char *preset_text(const char *name) {
  char path[512], *errors = NULL, *text = NULL;
  refit_config_t cfg;
  snprintf(path, sizeof(path), "%s/%s", REFIT_CONFIGS_DIR, name);
  refit_status_t st = refit_config_load(path, 0, &cfg, &errors, &text, NULL);
  if (st != REFIT_OK)
    fail_msg("%s: %s\n%s", path, refit_status_name(st), errors);
  return keep(text);
}

/* A preset with precision mxfp8, whatever precision it ships with. */
static const char *preset_mxfp8(const char *name) {
  const char *text = preset_text(name);
  if (strstr(text, "precision: bf16") != NULL)
    return edit(text, "precision: bf16", "precision: mxfp8");
  assert_non_null(strstr(text, "precision: mxfp8"));
  return text;
}

static void test_mxfp8_presets_pass(void **state) {
  (void)state;
  for (size_t i = 0; i < NPRESETS; i++) {
    refit_config_t cfg;
    const char *yaml = preset_mxfp8(presets[i]);
    EXPECT_OK(yaml, 0, &cfg);
    assert_int_equal(cfg.refit.precision, REFIT_PRECISION_MXFP8);
    EXPECT_OK(edit(yaml, "precision: mxfp8", "precision: mxfp8\n  prequantize: true"), 0,
              NULL);
  }
  /* deepseek_v3 under block FP8 quantizes kv_b_proj too (refit rewrites
   * the dequantized copy behind W_UK_T / W_UV); under MXFP8 it must stay
   * ignored. */
  const char *ds_fp8 =
      edit(edit(preset_text("deepseek-v3.yaml"), "precision: mxfp8", "precision: fp8_block"),
           "quantization_ignore: [lm_head, self_attn.kv_b_proj]", "quantization_ignore: [lm_head]");
  EXPECT_OK(ds_fp8, 0, NULL);
  EXPECT_ERR(edit(preset_text("deepseek-v3.yaml"),
                  "quantization_ignore: [lm_head, self_attn.kv_b_proj]",
                  "quantization_ignore: [lm_head]"),
             0, REFIT_ERR_CONFIG, "add self_attn.kv_b_proj to refit.quantization_ignore");
  /* nvfp4 covers qwen3_moe: the MoE demo passes under either MoE backend. */
  const char *demo_nvfp4 =
      edit(preset_mxfp8("demo.yaml"), "precision: mxfp8", "precision: nvfp4");
  EXPECT_OK(demo_nvfp4, 0, NULL);
  EXPECT_OK(edit(demo_nvfp4, "precision: nvfp4",
                 "precision: nvfp4\n  moe_backend: flashinfer_cutlass"),
            0, NULL);
  /* H 320 is refused under flashinfer_trtllm (test_mistakes) but served
   * unpadded by flashinfer_cutlass. */
  EXPECT_OK(edit(cat(moe, NVFP4 "  moe_backend: flashinfer_cutlass\n"),
                 "  hidden_size: 256\n", "  hidden_size: 320\n"),
            0, NULL);
  /* demo.yaml with trtllm GEMMs: with one rank per engine o_proj's K is the
   * whole 256 and passes; with tp 2 it is 128 per rank and is refused. */
  const char *demo = edit(preset_mxfp8("demo.yaml"), "precision: mxfp8",
                          "precision: mxfp8\n  linear_backend: flashinfer_trtllm");
  EXPECT_OK(demo, 4, NULL);
  const char *tp2 =
      edit(edit(demo, "  tp: 1  ", "  tp: 2  "), "  engines: 2 ", "  engines: 1 ");
  EXPECT_ERR(tp2, 4, REFIT_ERR_CONFIG,
             "model.layers.*.self_attn.o_proj.weight: weight [N=256, K=128] "
             "cannot use MXFP8 backend flashinfer_trtllm: needs K % 256 == 0");
}

/* ------------------------------------------------------------------------ */
/* Every option, files, presets, hash, format                               */
/* ------------------------------------------------------------------------ */

/* Every value the table offers is implemented: all are accepted. */
static void test_every_option_accepted(void **state) {
  (void)state;
  refit_config_t cfg;
  static const char *const transports[] = {"auto", "mpi", "nccl", "ipc", "ucx"};
  for (size_t i = 0; i < sizeof(transports) / sizeof(transports[0]); i++) {
    char yaml[64];
    snprintf(yaml, sizeof(yaml), "refit:\n  transport: %s\n", transports[i]);
    EXPECT_OK(cat(moe, yaml), 4, &cfg);
    assert_int_equal(cfg.refit.transport, (int)i);
  }
  EXPECT_OK(cat(moe, "refit:\n  mode: async\n  precision: mxfp8\n"
                     "  restore: none\n  keep_staging: false\n  baseline: true\n"),
            4, &cfg);
  assert_int_equal(cfg.refit.mode, REFIT_MODE_ASYNC);
  assert_int_equal(cfg.refit.precision, REFIT_PRECISION_MXFP8);
  assert_int_equal(cfg.refit.restore, REFIT_RESTORE_NONE);
  assert_int_equal(cfg.refit.keep_staging, 0);
  assert_int_equal(cfg.refit.baseline, 1);
  EXPECT_OK(cat(moe, "source:\n  kind: hdf5\n  path: ckpt.h5\ndump: out.h5\n"), 4, &cfg);
  assert_string_equal(cfg.dump, "out.h5");
}

static void test_presets_parse(void **state) {
  (void)state;
  for (size_t i = 0; i < NPRESETS; i++) {
    char path[512];
    refit_config_t cfg;
    char *errors = NULL, *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof(path), "%s/%s", REFIT_CONFIGS_DIR, presets[i]);
    refit_status_t st = refit_config_load(path, 0, &cfg, &errors, &text, &len);
    if (st != REFIT_OK)
      fail_msg("%s: %s\n%s", path, refit_status_name(st), errors);
    assert_non_null(text);
    assert_int_equal(strlen(text), len);
    free(text);
  }

  /* demo.yaml runs on 4 ranks, with buckets small enough to see several. */
  char path[512];
  refit_config_t cfg;
  char *errors = NULL;
  snprintf(path, sizeof(path), "%s/demo.yaml", REFIT_CONFIGS_DIR);
  assert_int_equal(refit_config_load(path, 4, &cfg, &errors, NULL, NULL), REFIT_OK);
  assert_int_equal(cfg.model.family, REFIT_FAMILY_QWEN3_MOE);
  assert_int_equal(
      refit_trainer_world(&cfg.trainer) + refit_generator_world(&cfg.generator), 4);
  assert_int_equal(cfg.refit.bucket_bytes, UINT64_C(1) << 20);
  assert_int_equal(cfg.model.hidden_size % 128, 0);
  assert_int_equal((2 * cfg.model.moe_intermediate_size) % 128, 0);

  /* The published Qwen3-235B-A22B has 94 layers: an uneven pipeline. */
  snprintf(path, sizeof(path), "%s/qwen3-235b-a22b.yaml", REFIT_CONFIGS_DIR);
  assert_int_equal(refit_config_load(path, 96, &cfg, &errors, NULL, NULL), REFIT_OK);
  int64_t first[9];
  assert_int_equal(refit_stage_layers(&cfg.model, &cfg.trainer, first), REFIT_OK);
  assert_int_equal(first[8], 94);
  assert_int_equal(first[1], 10);
  assert_int_equal(first[8] - first[7], 12);
}

static void test_load_errors(void **state) {
  (void)state;
  refit_config_t cfg;
  char *errors = NULL, *text = (char *)"untouched";
  assert_int_equal(
      refit_config_load("/nonexistent/refit.yaml", 0, &cfg, &errors, &text, NULL),
      REFIT_ERR_SYSTEM);
  assert_non_null(errors);
  keep(errors);
  assert_non_null(strstr(errors, "/nonexistent/refit.yaml: cannot open the "
                                 "configuration: No such file or directory"));
  assert_string_equal(text, "untouched");

  /* A file's problems are reported against its path. */
  char path[] = "/tmp/refit_test_config_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  assert_non_null(f);
  fputs(edit(moe, "  hidden_size:", "  hiden_size:"), f);
  fclose(f);
  assert_int_equal(refit_config_load(path, 0, &cfg, &errors, NULL, NULL),
                   REFIT_ERR_CONFIG);
  keep(errors);
  remove(path);
  char want[128];
  snprintf(want, sizeof(want), "%s:3:3: unknown key 'model.hiden_size'", path);
  if (strstr(errors, want) == NULL)
    fail_msg("expected '%s' in:\n%s", want, errors);
  assert_non_null(strstr(refit_last_error(), want));
}

/* A FIFO as the configuration is refused by name at once (opening it for
 * reading would wait for a writer forever: the alarm fails the test instead),
 * and so is a file over REFIT_CONFIG_MAX_BYTES. */
static void test_load_refuses_fifo_and_huge_file(void **state) {
  (void)state;
  char dir[] = "/tmp/refit_test_config_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[128], want[256];
  snprintf(path, sizeof(path), "%s/job.yaml", dir);
  assert_int_equal(mkfifo(path, 0600), 0);
  refit_config_t cfg;
  char *errors = NULL;
  alarm(20);
  assert_int_equal(refit_config_load(path, 0, &cfg, &errors, NULL, NULL),
                   REFIT_ERR_SYSTEM);
  alarm(0);
  keep(errors);
  snprintf(want, sizeof(want), "%s: the configuration is a FIFO, not a regular file",
           path);
  if (strstr(errors, want) == NULL)
    fail_msg("expected '%s' in:\n%s", want, errors);
  assert_int_equal(unlink(path), 0);

  /* A valid file padded with comments past the cap. */
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(moe, f);
  for (size_t n = strlen(moe); n <= REFIT_CONFIG_MAX_BYTES; n += 64)
    fprintf(f, "#%62s\n", "padding");
  fclose(f);
  assert_int_equal(refit_config_load(path, 0, &cfg, &errors, NULL, NULL),
                   REFIT_ERR_CONFIG);
  keep(errors);
  snprintf(want, sizeof(want), "%s: the configuration is ", path);
  if (strstr(errors, want) == NULL ||
      strstr(errors, "bytes, more than the 1048576") == NULL)
    fail_msg("expected '%s... bytes, more than the 1048576' in:\n%s", want, errors);
  assert_int_equal(unlink(path), 0);
  assert_int_equal(rmdir(dir), 0);
}

static void test_hash_and_format_round_trip(void **state) {
  (void)state;
  refit_config_t a, b;
  EXPECT_OK(cat(moe, "refit:\n  bucket_bytes: 3MiB\n  timeout_s: 0.25\n"
                     "source:\n  seed: 42\n"),
            0, &a);
  char *text = NULL;
  assert_int_equal(refit_config_format(&a, &text), REFIT_OK);
  keep(text);
  assert_non_null(strstr(text, "  bucket_bytes: 3MiB"));
  assert_non_null(strstr(text, "model:\n  family: qwen3_moe"));
  EXPECT_OK(text, 0, &b);
  assert_true(refit_config_hash(&a) == refit_config_hash(&b));
  assert_true(b.refit.timeout_s == 0.25);

  /* Same values, different spelling and comments: same hash. */
  EXPECT_OK(cat(moe, "# tuned\nrefit: {bucket_bytes: 3145728, timeout_s: "
                     "2.5e-1}\nsource: {seed: 42}\n"),
            0, &b);
  assert_true(refit_config_hash(&a) == refit_config_hash(&b));
  b.generator.engines = 2;
  assert_true(refit_config_hash(&a) != refit_config_hash(&b));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_parse_bytes_units, teardown),
      cmocka_unit_test_teardown(test_startup_timeout_parsed, teardown),
      cmocka_unit_test_teardown(test_env_table, teardown),
      cmocka_unit_test_teardown(test_defaults_applied, teardown),
      cmocka_unit_test_teardown(test_values_parsed, teardown),
      cmocka_unit_test_teardown(test_refit_keys_parsed, teardown),
      cmocka_unit_test_teardown(test_delta_keys_parsed, teardown),
      cmocka_unit_test_teardown(test_linear_backend_names_match_kernels, teardown),
      cmocka_unit_test_teardown(test_mistakes, teardown),
      cmocka_unit_test_teardown(test_string_too_long, teardown),
      cmocka_unit_test_teardown(test_quantization_ignore_list, teardown),
      cmocka_unit_test_teardown(test_fault_mapping, teardown),
      cmocka_unit_test_teardown(test_layouts_accepted, teardown),
      cmocka_unit_test_teardown(test_stage_layers, teardown),
      cmocka_unit_test_teardown(test_layout_rules_at_their_keys, teardown),
      cmocka_unit_test_teardown(test_mxfp8_accepted, teardown),
      cmocka_unit_test_teardown(test_fp8_block_accepted, teardown),
      cmocka_unit_test_teardown(test_quantization_ignore_runtime_names, teardown),
      cmocka_unit_test_teardown(test_mxfp8_presets_pass, teardown),
      cmocka_unit_test_teardown(test_every_option_accepted, teardown),
      cmocka_unit_test_teardown(test_presets_parse, teardown),
      cmocka_unit_test_teardown(test_load_errors, teardown),
      cmocka_unit_test_teardown(test_load_refuses_fifo_and_huge_file, teardown),
      cmocka_unit_test_teardown(test_hash_and_format_round_trip, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
