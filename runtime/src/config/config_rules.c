/*
 * The rules between keys of a refit configuration, checked on the parsed
 * struct after the walk (config_parse.c), in this order:
 *   - names and families: trainer.layout auto resolved from source.kind, the
 *     Megatron keys under Hugging Face names, and the other family's
 *     dimensions (the families of each are reshard's refit_field_in_family);
 *   - the layout rules: reshard/rules.c's, the ones the catalog enforces,
 *     each reported at the key of the field it blames;
 *   - the world size, the source (its path, and source.update_rate for the
 *     synthetic source only) and the reference;
 *   - the refit section: prequantize, the MXFP8 shape rules (asked of the
 *     kernels about the catalog's quantized tensors) and the fault seam.
 * Each rule is skipped when one of its inputs was already reported, so one
 * mistake yields one message. Every value the table accepts is implemented;
 * what a machine cannot do (a GPU transport without a GPU) is reported when
 * the job starts.
 */
#include "config/config_rules.h"

#include "config/config_table.h"
#include "core/error.h"
#include "kernels/fp8_block.h"
#include "kernels/nvfp4.h"
#include "kernels/layout.h"
#include "kernels/mxfp8.h"
#include "reshard/blocks.h"
#include "reshard/catalog.h"
#include "reshard/family.h"
#include "reshard/rules.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROW(id) REFIT_CONFIG_ROW_##id

/* refit.linear_backend's n-th choice is the kernels' n-th dense backend. */
_Static_assert(
    REFIT_LINEAR_FLASHINFER_CUTLASS == (int)REFIT_KERNELS_DENSE_FLASHINFER_CUTLASS &&
        REFIT_LINEAR_FLASHINFER_CUTEDSL == (int)REFIT_KERNELS_DENSE_FLASHINFER_CUTEDSL &&
        REFIT_LINEAR_FLASHINFER_TRTLLM == (int)REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM &&
        REFIT_KERNELS_DENSE_COUNT == 3,
    "refit_linear_backend_t follows refit_kernels_dense_backend_t");
/* refit.fp8_scale's n-th choice is the kernels' n-th scale mode. */
_Static_assert(REFIT_FP8_SCALE_MODE_FP32 == (int)REFIT_FP8_SCALE_FP32 &&
                   REFIT_FP8_SCALE_MODE_POW2 == (int)REFIT_FP8_SCALE_POW2,
               "refit_fp8_scale_mode_t follows refit_fp8_scale_t");

/* True when none of the rows was already reported (or missing). */
static bool refit_config_rows_ok(const refit_config_ctx_t *c, const int *ids, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (c->parser.keys[ids[i]].bad)
      return false;
  return true;
}

#define ROWS_OK(...)                                                                     \
  refit_config_rows_ok(c, (const int[]){__VA_ARGS__},                                    \
                       sizeof((const int[]){__VA_ARGS__}) / sizeof(int))

static void refit_config_rule(refit_config_ctx_t *c, int id, const char *fmt, ...)
    REFIT_PRINTF(3, 4);

/* Report a rule broken, at the key of row `id`; a value read from
 * model.hf_config is reported at that key, naming the file and its key. */
static void refit_config_rule(refit_config_ctx_t *c, int id, const char *fmt, ...) {
  char text[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  if (c->parser.keys[id].elsewhere == NULL) {
    refit_config_problem(&c->parser, refit_config_key_pos(&c->parser, id), "%s", text);
    return;
  }
  refit_config_problem(&c->parser, refit_config_key_pos(&c->parser, ROW(MODEL_HF_CONFIG)),
                       "%s (%s is %s's key '%s')", text,
                       refit_config_row_path(&refit_config_rows[id]), c->hf_file,
                       c->parser.keys[id].elsewhere);
}

/* The integer value of row `id` in the working configuration. */
static int64_t refit_config_int(const refit_config_ctx_t *c, int id) {
  return refit_config_row_int(&refit_config_rows[id], &c->cfg);
}

/* The row of a layout field: the key of the same path, or -1. */
static int refit_config_field_row(refit_field_t f) {
  const char *name = refit_field_name(f);
  return name[0] != '\0' ? refit_config_table_path(&refit_config_table, name) : -1;
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
    if (row < 0 || c->parser.keys[row].bad)
      unknown |= REFIT_FIELD_BIT(f);
  }
  refit_layout_rules(&c->cfg.model, &c->cfg.trainer, &c->cfg.generator, unknown, &v);
  for (int i = 0; i < v.count; i++) {
    int row = refit_config_field_row(v.v[i].field);
    const int alt = refit_config_field_row(v.v[i].or_field);
    if (row >= 0 && alt >= 0 && c->parser.keys[row].pos.line == 0 &&
        c->parser.keys[alt].pos.line > 0)
      row = alt;
    if (row >= 0)
      refit_config_rule(c, row, "%s", v.v[i].text);
    else
      refit_config_problem(&c->parser, (refit_config_pos_t){1, 1}, "%s", v.v[i].text);
  }
  return unknown == 0 && v.count == 0;
}

/* Keys of other families (reshard's refit_field_in_family) are errors, not
 * silently ignored (the family's own dimensions are a layout rule). */
static void refit_config_check_model(refit_config_ctx_t *c) {
  if (!ROWS_OK(ROW(MODEL_FAMILY)))
    return;
  for (int f = REFIT_FIELD_NONE + 1; f < REFIT_FIELD_COUNT; f++) {
    const int id = refit_config_field_row((refit_field_t)f);
    if (!refit_field_family_specific((refit_field_t)f) || id < 0 || !ROWS_OK(id) ||
        refit_field_in_family((refit_field_t)f, (int)c->cfg.model.family) ||
        refit_config_int(c, id) == 0)
      continue;
    /* The families it does apply to, as "a, b or c". */
    char families[128] = "";
    size_t used = 0;
    int n = 0, total = 0;
    for (int k = 0; k < refit_nfamilies; k++)
      total += refit_field_in_family((refit_field_t)f, k);
    for (int k = 0; k < refit_nfamilies && used < sizeof(families); k++)
      if (refit_field_in_family((refit_field_t)f, k)) {
        n++;
        used += (size_t)snprintf(families + used, sizeof(families) - used, "%s%s",
                                 n == 1       ? ""
                                 : n == total ? " or "
                                              : ", ",
                                 refit_families[k].name);
      }
    refit_config_rule(c, id,
                      "%s: %" PRId64 " is given but applies only to "
                      "model.family %s; remove it or change model.family",
                      refit_config_row_path(&refit_config_rows[id]),
                      refit_config_int(c, id), families);
  }
}

static void refit_config_check_world(refit_config_ctx_t *c, int world_size) {
  const refit_trainer_layout_t *t = &c->cfg.trainer;
  const refit_generator_layout_t *g = &c->cfg.generator;
  if (world_size <= 0 || !ROWS_OK(ROW(TRAINER_TP), ROW(TRAINER_PP), ROW(TRAINER_DP),
                                  ROW(GENERATOR_TP), ROW(GENERATOR_ENGINES)))
    return;
  /* Sizes are at most 2^20 each (table bounds), so the ranks fit. */
  const int64_t trainer = refit_trainer_world(t);
  const int64_t generator = refit_generator_world(g);
  if (trainer + generator == world_size)
    return;
  refit_config_pos_t *at = refit_config_section_pos(&c->parser, "trainer");
  if (at == NULL || at->line == 0)
    at = refit_config_section_pos(&c->parser, "generator");
  refit_config_problem(&c->parser, at ? *at : (refit_config_pos_t){1, 1},
                       "world size %d does not match trainer ranks %" PRId64
                       " (tp %d * pp %d * dp %d) + generator ranks %" PRId64
                       " (tp %d * engines %d) = %" PRId64,
                       world_size, trainer, t->tp, t->pp, t->dp, generator, g->tp,
                       g->engines, trainer + generator);
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
  refit_config_choice_name(refit_config_rows[ROW(SOURCE_KIND)].choices, cfg->source.kind,
                           kind, sizeof(kind));
  if (file && cfg->source.path[0] == '\0')
    refit_config_rule(c, ROW(SOURCE_KIND), "source.path: required when source.kind is %s",
                      kind);
  else if (!file && cfg->source.path[0] != '\0')
    refit_config_rule(c, ROW(SOURCE_PATH),
                      "source.path: given but source.kind is %s; "
                      "remove it or set source.kind: hdf5 or safetensors",
                      kind);
  /* The update model is the synthetic source's; a checkpoint or the caller
   * has versions of its own. The kernels take the rate in FP32. */
  if (ROWS_OK(ROW(SOURCE_UPDATE_RATE)) && cfg->source.update_rate != 0.0) {
    if (cfg->source.kind != REFIT_SOURCE_SYNTHETIC)
      refit_config_rule(c, ROW(SOURCE_UPDATE_RATE),
                        "source.update_rate: %g is for the synthetic source, but "
                        "source.kind is %s; remove it or set source.kind: synthetic",
                        cfg->source.update_rate, kind);
    else if ((float)cfg->source.update_rate == 0.0f)
      refit_config_rule(c, ROW(SOURCE_UPDATE_RATE),
                        "source.update_rate: %g rounds to 0 in FP32, which would "
                        "mean independent versions; use 0 or at least 1e-45",
                        cfg->source.update_rate);
  }
  if (!ROWS_OK(ROW(REFERENCE_KIND), ROW(REFERENCE_PATH)))
    return;
  refit_config_choice_name(refit_config_rows[ROW(REFERENCE_KIND)].choices,
                           cfg->reference.kind, ref_kind, sizeof(ref_kind));
  /* The reference exists for caller-owned weights only: every other source
   * is its own reference. (Values, not the keys' presence, are checked, so
   * that refit_config_format's output, which writes every key, reads back.) */
  if (!caller &&
      (cfg->reference.kind != REFIT_SOURCE_SYNTHETIC || cfg->reference.path[0] != '\0')) {
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
                      "reference.path: required when reference.kind is %s", ref_kind);
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
  /* Values, not presence (refit_config_format writes every key): a value
   * other than the table's default is set. */
  const refit_trainer_layout_t *d = &c->defaults.trainer;
  const struct {
    int row;
    bool set;
  } megatron_only[] = {
      {ROW(TRAINER_SPEC), t->spec != d->spec},
      {ROW(TRAINER_EXPERTS), t->experts != d->experts},
      {ROW(TRAINER_NAME_PREFIX), strcmp(t->name_prefix, d->name_prefix) != 0},
      {ROW(TRAINER_VOCAB_DIVISIBLE_BY), t->vocab_divisible_by != d->vocab_divisible_by},
  };
  if (t->names == REFIT_TRAINER_NAMES_HF)
    for (size_t i = 0; i < sizeof(megatron_only) / sizeof(megatron_only[0]); i++)
      if (megatron_only[i].set && ROWS_OK(megatron_only[i].row))
        refit_config_rule(
            c, megatron_only[i].row,
            "%s: set but the trainer holds Hugging Face names "
            "(trainer.layout hf); remove it or set "
            "trainer.layout: megatron",
            refit_config_row_path(&refit_config_rows[megatron_only[i].row]));
  if (ROWS_OK(ROW(TRAINER_EXPERTS), ROW(MODEL_FAMILY)) &&
      !refit_family_desc(c->cfg.model.family)->moe && t->experts != d->experts)
    refit_config_rule(c, ROW(TRAINER_EXPERTS),
                      "trainer.experts: given but model.family is %s "
                      "(dense); remove it",
                      refit_family_desc(c->cfg.model.family)->name);
}

/* ---- MXFP8 shape rules --------------------------------------------------- */

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

void refit_config_tensor_pattern(const char *name, char *buf, size_t n) {
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
  const refit_config_t *defaults = &c->defaults;
  const refit_config_pos_t *at = c->parser.keys[ROW(REFIT_QUANTIZATION_IGNORE)].items;
  for (int e = 0; e < cfg->refit.quantization_ignore_count; e++) {
    const char *entry = cfg->refit.quantization_ignore[e];
    bool known = false;
    for (int d = 0; d < defaults->refit.quantization_ignore_count; d++)
      known |= strcmp(entry, defaults->refit.quantization_ignore[d]) == 0;
    for (int64_t i = cat->gen_begin[0]; !known && i < cat->gen_begin[1]; i++)
      known = refit_config_module_matches(cat->gen[i].name, entry);
    if (known)
      continue;
    char shown[80], modules[512];
    refit_config_quote(entry, shown, sizeof(shown));
    refit_config_quantizable_modules(cat, modules, sizeof(modules));
    refit_config_problem(
        &c->parser,
        at != NULL && at[e].line > 0
            ? at[e]
            : refit_config_key_pos(&c->parser, ROW(REFIT_QUANTIZATION_IGNORE)),
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
  if (g->k_field == REFIT_FIELD_MODEL_HEAD_DIM ||
      g->k_field == REFIT_FIELD_MODEL_V_HEAD_DIM)
    snprintf(k->expr, sizeof(k->expr),
             "model.num_attention_heads * %s = %" PRId64 " * %" PRId64 " = %" PRId64,
             refit_field_name(g->k_field), m->num_attention_heads,
             k->k / m->num_attention_heads, k->k);
  else if (g->k_field == REFIT_FIELD_MODEL_NUM_SHARED_EXPERTS)
    snprintf(k->expr, sizeof(k->expr),
             "model.num_shared_experts * model.moe_intermediate_size = %" PRId64
             " * %" PRId64 " = %" PRId64,
             m->num_shared_experts, m->moe_intermediate_size, k->k);
  else
    snprintf(k->expr, sizeof(k->expr), "%s %" PRId64, refit_field_name(g->k_field), k->k);
}

/*
 * MLA's W_UK_T and W_UV (model-families.md 3.4): vLLM derives them from
 * kv_b_proj after loading. A BF16 kv_b_proj's are views of its storage, so
 * a refit in place updates them; a quantized kv_b_proj's are a separate
 * dequantized BF16 copy (for MXFP8 through the quantized GEMM against an
 * identity), which refit does not write: the engine would decode with the
 * old weights. Refused until refit rewrites that copy. True when g is not
 * such a tensor.
 */
static bool refit_config_check_derived(refit_config_ctx_t *c,
                                       const refit_gen_tensor_t *g) {
  if (!g->quantized || !g->mla_derived ||
      c->cfg.refit.precision == REFIT_PRECISION_FP8_BLOCK)
    return true; /* block FP8: refit rewrites the copy (loader.c, "_dequant") */
  char tensor[REFIT_NAME_MAX + 8];
  refit_config_tensor_pattern(g->name, tensor, sizeof(tensor));
  refit_config_rule(c, ROW(REFIT_PRECISION),
                    "%s: refit.precision mxfp8 would quantize it, but vLLM's MLA "
                    "then keeps W_UK_T and W_UV in a separate dequantized copy "
                    "that refit does not rewrite (they are views of kv_b_proj "
                    "only in bfloat16); add self_attn.kv_b_proj to "
                    "refit.quantization_ignore",
                    tensor);
  return false;
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
    refit_config_rule(c,
                      k.k % REFIT_MXFP8_BLOCK ? k.model_row : ROW(REFIT_LINEAR_BACKEND),
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

/* The shape rules of the expert layout of the configured precision and
 * refit.moe_backend (MXFP8: the TRTLLM-gen MoE layout; NVFP4: the FlashInfer
 * NVFP4 MoE backends), with the message in refit_last_error(). */
static bool refit_config_moe_shape_ok(const refit_config_t *cfg,
                                      const refit_kernels_moe_shape_t *shape,
                                      const char *module) {
  if (cfg->refit.precision == REFIT_PRECISION_NVFP4)
    return refit_kernels_nvfp4_moe_check_shape(
               (refit_kernels_moe_backend_t)cfg->refit.moe_backend, shape, module) ==
           REFIT_OK;
  return refit_kernels_moe_check_shape(shape, module, NULL) == REFIT_OK;
}

/* The generator's experts (expert stack g, w13 or w2) in the expert layout
 * of refit.moe_backend. */
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
  if (refit_config_moe_shape_ok(&c->cfg, &shape, module))
    return;
  char why[512], expr[160], backend[32], precision[32];
  snprintf(why, sizeof(why), "%s", refit_last_error());
  /* Blame what a person would change: H, else the tp split, else I. H is
   * not to blame when the kernels take it with I = H (their rules for I
   * then hold too), so the rule stays theirs alone. */
  int blame = ROW(MODEL_HIDDEN_SIZE);
  refit_kernels_moe_shape_t probe = shape;
  probe.intermediate = shape.hidden;
  if (refit_config_moe_shape_ok(&c->cfg, &probe, NULL)) {
    refit_kernels_moe_shape_t whole = shape;
    whole.intermediate = m->moe_intermediate_size;
    blame = split > 1 && refit_config_moe_shape_ok(&c->cfg, &whole, NULL)
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
  refit_config_choice_name(refit_config_rows[ROW(REFIT_MOE_BACKEND)].choices,
                           c->cfg.refit.moe_backend, backend, sizeof(backend));
  refit_config_choice_name(refit_config_rows[ROW(REFIT_PRECISION)].choices,
                           c->cfg.refit.precision, precision, sizeof(precision));
  refit_config_rule(c, blame, "%s (%s; refit.moe_backend %s, refit.precision %s)", why,
                    expr, backend, precision);
}

/* The catalog of a quantizing config, its tensors marked and the ignore
 * entries checked (the layout rules hold, so that it can be built); NULL,
 * with the problem reported, when it cannot be described. */
static refit_catalog_t *refit_config_quantized_catalog(refit_config_ctx_t *c) {
  refit_catalog_t *cat = NULL;
  char precision[32];
  refit_config_choice_name(refit_config_rows[ROW(REFIT_PRECISION)].choices,
                           c->cfg.refit.precision, precision, sizeof(precision));
  if (refit_catalog_create(&c->cfg.model, &c->cfg.trainer, &c->cfg.generator, &cat) !=
      REFIT_OK) {
    refit_config_rule(c, ROW(REFIT_PRECISION),
                      "refit.precision: %s needs the generator's tensors to "
                      "check their shapes, which cannot be described: %s",
                      precision, refit_last_error());
    return NULL;
  }
  refit_config_mark_quantized(&c->cfg, cat);
  refit_config_check_ignore(c, cat);
  return cat;
}

/* Runs when the layout rules hold, so that the catalog can be built. */
static void refit_config_check_mxfp8(refit_config_ctx_t *c) {
  if (!ROWS_OK(ROW(REFIT_PRECISION), ROW(REFIT_LINEAR_BACKEND), ROW(REFIT_MOE_BACKEND),
               ROW(REFIT_QUANTIZATION_IGNORE)) ||
      c->cfg.refit.precision != REFIT_PRECISION_MXFP8 || !c->layout_ok)
    return;
  if (c->cfg.refit.moe_backend != REFIT_MOE_FLASHINFER_TRTLLM &&
      refit_family_desc(c->cfg.model.family)->moe) {
    refit_config_rule(c, ROW(REFIT_MOE_BACKEND),
                      "refit.moe_backend flashinfer_cutlass is built for refit.precision "
                      "nvfp4 only; MXFP8 experts take flashinfer_trtllm");
    return;
  }
  refit_catalog_t *cat = refit_config_quantized_catalog(c);
  if (cat == NULL)
    return;
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
  for (int64_t i = cat->gen_begin[0]; i < cat->gen_begin[1]; i++)
    if (!refit_config_check_derived(c, &cat->gen[i]))
      break; /* one message for every layer */
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

/* ---- Block FP8 shard rules ------------------------------------------------ */

/*
 * Every piece of every quantized runtime tensor of every generator tp rank
 * against reshard/blocks.h's rules (what vLLM accepts, and what a shard can
 * reproduce of NeMo-RL's whole-tensor quantization). One problem per tensor
 * pattern ("model.layers.*.self_attn.o_proj.weight"), at the key a person
 * would change; tensors not marked quantized are skipped when
 * `quantized_only`. Returns false when a piece breaks a rule.
 */
static bool refit_config_check_blocks(refit_config_ctx_t *c, const refit_catalog_t *cat,
                                      int64_t first, int64_t end, bool quantized_only) {
  char reported[16][REFIT_NAME_MAX + 8];
  int nreported = 0;
  bool ok = true;
  for (int64_t i = first; i < end; i++) {
    const refit_gen_tensor_t *g = &cat->gen[i];
    if (quantized_only && !g->quantized)
      continue;
    int t = 0;
    while (i >= cat->gen_begin[t + 1])
      t++;
    refit_block_piece_t *pieces = NULL;
    int64_t np = 0;
    if (refit_block_pieces(cat, i, &pieces, &np) != REFIT_OK) {
      refit_config_rule(c, ROW(REFIT_PRECISION), "refit.precision fp8_block: %s",
                        refit_last_error());
      return false;
    }
    for (int64_t k = 0; k < np; k++) {
      refit_field_t field = REFIT_FIELD_NONE;
      if (refit_block_piece_check(cat, g, t, &pieces[k], &field) == REFIT_OK)
        continue;
      ok = false;
      char tensor[REFIT_NAME_MAX + 8];
      refit_config_tensor_pattern(g->name, tensor, sizeof(tensor));
      bool again = false;
      for (int r = 0; r < nreported && !again; r++)
        again = strcmp(reported[r], tensor) == 0;
      if (!again) {
        if (nreported < 16)
          snprintf(reported[nreported++], sizeof(reported[0]), "%s", tensor);
        refit_config_rule(c,
                          field == REFIT_FIELD_NONE ? ROW(REFIT_PRECISION)
                                                    : refit_config_field_row(field),
                          "%s (refit.precision fp8_block)", refit_last_error());
      }
      break;
    }
    free(pieces);
  }
  return ok;
}

/* Runs when the layout rules hold, so that the catalog can be built. */
static void refit_config_check_fp8_block(refit_config_ctx_t *c) {
  if (!ROWS_OK(ROW(REFIT_PRECISION), ROW(REFIT_QUANTIZATION_IGNORE)) ||
      c->cfg.refit.precision != REFIT_PRECISION_FP8_BLOCK || !c->layout_ok)
    return;
  refit_catalog_t *cat = refit_config_quantized_catalog(c);
  if (cat == NULL)
    return;
  refit_config_check_blocks(c, cat, 0, cat->gen_begin[cat->generator.tp], true);
  refit_catalog_destroy(cat);
}

/* ---- NVFP4 ------------------------------------------------------------------ */

/*
 * NVFP4 (docs/nvfp4.md) for qwen3, llama and qwen3_moe (its experts in
 * FlashInfer's NVFP4 MoE layouts, refit.moe_backend); no other family's
 * NVFP4 statement exists on either side of the check.
 * vLLM's ModelOptNvFp4LinearMethod.create_weights refuses an input
 * partition that is not a multiple of 16 ("Unsupported model when in
 * features size is not multiple of 16"): every quantized K of every
 * generator rank must be one (a trainer shard may split a block: the
 * generator assembles the tensor first). True when g (or, g NULL, every
 * quantized tensor of `cat`) passes; one problem per K.
 */
static bool refit_config_check_nvfp4_k(refit_config_ctx_t *c, const refit_catalog_t *cat,
                                       const refit_gen_tensor_t *g) {
  bool reported[REFIT_FIELD_COUNT] = {0}, ok = true;
  const int64_t first = g != NULL ? g - cat->gen : 0;
  const int64_t end = g != NULL ? first + 1 : cat->gen_begin[cat->generator.tp];
  for (int64_t i = first; i < end; i++) {
    const refit_gen_tensor_t *t = &cat->gen[i];
    if ((g == NULL && !t->quantized) || t->cols % REFIT_NVFP4_BLOCK == 0)
      continue;
    ok = false;
    if (reported[t->k_field])
      continue;
    reported[t->k_field] = true;
    refit_config_kdim_t k;
    char tensor[REFIT_NAME_MAX + 8];
    refit_config_kdim(c, cat, t, &k);
    refit_config_tensor_pattern(t->name, tensor, sizeof(tensor));
    if (k.gen_split > 1 && k.k % REFIT_NVFP4_BLOCK == 0)
      refit_config_rule(c, ROW(GENERATOR_TP),
                        "%s: K = %s split over generator.tp %" PRId64 " gives %" PRId64
                        " per rank, not a multiple of %d (vLLM's NVFP4 linear refuses "
                        "an input partition that is not; refit.precision nvfp4)",
                        tensor, k.expr, k.gen_split, t->cols, REFIT_NVFP4_BLOCK);
    else
      refit_config_rule(c, k.model_row,
                        "%s: K = %s is not a multiple of %d, the NVFP4 block (vLLM's "
                        "NVFP4 linear refuses it; refit.precision nvfp4)",
                        tensor, k.expr, REFIT_NVFP4_BLOCK);
  }
  return ok;
}

/* Runs when the layout rules hold, so that the catalog can be built. */
static void refit_config_check_nvfp4(refit_config_ctx_t *c) {
  if (!ROWS_OK(ROW(REFIT_PRECISION), ROW(REFIT_QUANTIZATION_IGNORE), ROW(MODEL_FAMILY)) ||
      c->cfg.refit.precision != REFIT_PRECISION_NVFP4)
    return;
  const char *family = refit_family_desc(c->cfg.model.family)->name;
  if (strcmp(family, "qwen3") != 0 && strcmp(family, "llama") != 0 &&
      strcmp(family, "qwen3_moe") != 0) {
    refit_config_rule(c, ROW(REFIT_PRECISION),
                      "refit.precision nvfp4 is not supported for model.family %s yet: "
                      "it covers qwen3, llama and qwen3_moe (no NVFP4 statement of this "
                      "family exists yet); use bf16, mxfp8 or fp8_block",
                      family);
    return;
  }
  if (!c->layout_ok || !ROWS_OK(ROW(REFIT_MOE_BACKEND)))
    return;
  refit_catalog_t *cat = refit_config_quantized_catalog(c);
  if (cat == NULL)
    return;
  /* K of every tensor first; the experts' layout rules (which include it)
   * only when K holds, so that one cause gives one message. */
  if (refit_config_check_nvfp4_k(c, cat, NULL))
    for (int64_t i = cat->gen_begin[0]; i < cat->gen_begin[1]; i++)
      if (cat->gen[i].quantized && cat->gen[i].kind != REFIT_GEN_LINEAR &&
          cat->gen[i].kind != REFIT_GEN_PLAIN) {
        refit_config_check_moe_layout(c, &cat->gen[i]);
        break;
      }
  refit_catalog_destroy(cat);
}

refit_status_t refit_config_check_quantizable(const refit_config_t *cfg,
                                              const refit_catalog_t *cat,
                                              const refit_gen_tensor_t *g) {
  refit_config_ctx_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_config_check_quantizable");
  c->cfg = *cfg;
  refit_config_defaults(&c->defaults);
  if (refit_config_parser_init(&c->parser, &refit_config_table, "", NULL, 0, &c->cfg) !=
      REFIT_OK) {
    free(c);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_config_check_quantizable");
  }
  if (g->kind == REFIT_GEN_PLAIN)
    refit_config_problem(&c->parser, (refit_config_pos_t){0, 0},
                         "%s: refit keeps it in bfloat16 (vLLM builds it without a "
                         "quantization method: an embedding, a norm, lm_head or the "
                         "MoE router)",
                         g->name);
  else if (cfg->refit.precision == REFIT_PRECISION_FP8_BLOCK)
    refit_config_check_blocks(c, cat, g - cat->gen, g - cat->gen + 1, false);
  else if (cfg->refit.precision == REFIT_PRECISION_NVFP4) {
    if (refit_config_check_nvfp4_k(c, cat, g) && g->kind != REFIT_GEN_LINEAR)
      refit_config_check_moe_layout(c, g);
  }
  else if (refit_config_check_kdim(c, cat, g) && g->kind != REFIT_GEN_LINEAR)
    refit_config_check_moe_layout(c, g);
  if (g->kind != REFIT_GEN_PLAIN) {
    refit_gen_tensor_t quantized = *g;
    quantized.quantized = 1;
    refit_config_check_derived(c, &quantized);
  }
  refit_status_t st = REFIT_OK;
  if (c->parser.oom) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_config_check_quantizable");
  } else if (c->parser.nproblems > 0) {
    char text[2048];
    size_t used = 0;
    for (size_t i = 0; i < c->parser.nproblems && used < sizeof(text); i++)
      used += (size_t)snprintf(text + used, sizeof(text) - used, "%s%s", i ? "; " : "",
                               c->parser.problems[i].text);
    st = REFIT_ERR(REFIT_ERR_CONFIG, "%s", text);
  }
  refit_config_parser_fini(&c->parser);
  free(c);
  return st;
}

/* ---- The refit section --------------------------------------------------- */

static void refit_config_check_refit(refit_config_ctx_t *c, int world_size) {
  const refit_config_t *cfg = &c->cfg;
  char precision[32];
  refit_config_choice_name(refit_config_rows[ROW(REFIT_PRECISION)].choices,
                           cfg->refit.precision, precision, sizeof(precision));
  if (ROWS_OK(ROW(REFIT_PREQUANTIZE), ROW(REFIT_PRECISION)) && cfg->refit.prequantize &&
      cfg->refit.precision == REFIT_PRECISION_BF16)
    refit_config_rule(c, ROW(REFIT_PREQUANTIZE),
                      "refit.prequantize: true needs refit.precision mxfp8 or "
                      "fp8_block, got %s (a %s refit has nothing to quantize)",
                      precision, precision);
  /* NVFP4's global scale is the whole tensor's: the generator assembles each
   * tensor before it quantizes, so neither the trainer nor a delta of wire
   * bytes can. Block FP8 quantizes on the trainer the tensors whose trainer
   * pieces hold whole 128 x 128 blocks (the others travel BF16: plan.h); a
   * delta refit applies those wire bytes in place (kernels/place.h), which
   * takes prequantize: true, and refuses or runs full refits where a tensor
   * falls back (refit_config_plan_check). */
  const bool gen_side = cfg->refit.precision == REFIT_PRECISION_NVFP4;
  if (ROWS_OK(ROW(REFIT_PREQUANTIZE), ROW(REFIT_PRECISION)) && cfg->refit.prequantize &&
      gen_side)
    refit_config_rule(c, ROW(REFIT_PREQUANTIZE),
                      "refit.prequantize: true is not supported with refit.precision "
                      "%s (an NVFP4 global scale comes from the amax of the whole "
                      "tensor, which no trainer holds; the generator assembles and "
                      "quantizes it); remove it",
                      precision);
  if (ROWS_OK(ROW(REFIT_DELTA), ROW(REFIT_PRECISION)) &&
      cfg->refit.delta != REFIT_DELTA_MODE_OFF && gen_side)
    refit_config_rule(c, ROW(REFIT_DELTA),
                      "refit.delta: %s is not supported with refit.precision %s "
                      "(delta refits compare quantized wire bytes, and nvfp4 quantizes "
                      "on the generator); use delta: off",
                      cfg->refit.delta == REFIT_DELTA_MODE_ON ? "on" : "auto", precision);
  if (ROWS_OK(ROW(REFIT_DELTA), ROW(REFIT_PRECISION), ROW(REFIT_PREQUANTIZE)) &&
      cfg->refit.delta != REFIT_DELTA_MODE_OFF &&
      cfg->refit.precision == REFIT_PRECISION_FP8_BLOCK && !cfg->refit.prequantize)
    refit_config_rule(c, ROW(REFIT_DELTA),
                      "refit.delta: %s with refit.precision fp8_block needs "
                      "refit.prequantize: true (a delta refit compares the trainer's "
                      "e4m3 bytes and block scales with the last committed ones and "
                      "writes the changed ones in place; without prequantize the "
                      "generator quantizes every tensor from BF16); set prequantize: "
                      "true, or delta: off",
                      cfg->refit.delta == REFIT_DELTA_MODE_ON ? "on" : "auto");
  if (ROWS_OK(ROW(REFIT_FP8_SCALE), ROW(REFIT_PRECISION)) &&
      cfg->refit.fp8_scale != REFIT_FP8_SCALE_MODE_FP32 &&
      cfg->refit.precision != REFIT_PRECISION_FP8_BLOCK)
    refit_config_rule(c, ROW(REFIT_FP8_SCALE),
                      "refit.fp8_scale: pow2 has no effect with refit.precision %s "
                      "(it chooses block FP8's scales); set precision: fp8_block, or "
                      "remove it",
                      precision);
  if (ROWS_OK(ROW(REFIT_DELTA), ROW(REFIT_ZERO_COPY)) &&
      cfg->refit.delta == REFIT_DELTA_MODE_ON &&
      cfg->refit.zero_copy == REFIT_ZERO_COPY_ON)
    refit_config_rule(c, ROW(REFIT_DELTA),
                      "refit.delta: on cannot be combined with refit.zero_copy: on "
                      "(zero copy moves no weight bytes to compare); use "
                      "zero_copy: off, or delta: auto");
  if (ROWS_OK(ROW(REFIT_DELTA_FULL_EVERY), ROW(REFIT_DELTA)) &&
      cfg->refit.delta_full_every > 0 && cfg->refit.delta == REFIT_DELTA_MODE_OFF)
    refit_config_rule(c, ROW(REFIT_DELTA_FULL_EVERY),
                      "refit.delta_full_every: %d has no effect with refit.delta off "
                      "(every refit is full); set delta: on or auto, or remove it",
                      cfg->refit.delta_full_every);
  refit_config_check_mxfp8(c);
  refit_config_check_fp8_block(c);
  refit_config_check_nvfp4(c);

  if (!cfg->refit.fault.enabled)
    return;
  if (!REFIT_FAULTS_BUILT) {
    refit_config_rule(c, ROW(REFIT_FAULT_PHASE),
                      "refit.fault: " REFIT_NO_FAULT_SEAM "; remove the section");
    return;
  }
  if (ROWS_OK(ROW(REFIT_FAULT_RANK)) &&
      !refit_fault_rank_exists(cfg->refit.fault.rank, world_size))
    refit_config_rule(c, ROW(REFIT_FAULT_RANK),
                      "refit.fault.rank: %d is not a rank of this job "
                      "(world size %d, ranks 0..%d)",
                      cfg->refit.fault.rank, world_size, world_size - 1);
  if (ROWS_OK(ROW(REFIT_FAULT_PHASE), ROW(REFIT_PRECISION)) &&
      !refit_fault_phase_runs(cfg->refit.fault.phase, cfg->refit.precision))
    refit_config_rule(c, ROW(REFIT_FAULT_PHASE),
                      cfg->refit.fault.phase == REFIT_FAULT_PHASE_AMAX
                          ? "refit.fault.phase: a %s refit has no NVFP4 amax exchange, "
                            "so the fault would never fire; use refit.precision nvfp4, "
                            "or another phase"
                          : "refit.fault.phase: a %s refit has no quantize phase, "
                            "so the fault would never fire; use refit.precision "
                            "mxfp8, fp8_block or nvfp4, or another phase",
                      precision);
}

void refit_config_check_rules(refit_config_ctx_t *c, int world_size) {
  refit_config_check_names(c);
  refit_config_check_model(c);
  c->layout_ok = refit_config_check_layout_rules(c);
  refit_config_check_world(c, world_size);
  refit_config_check_source(c);
  refit_config_check_refit(c, world_size);
}

/* ---- What the config quantizes ------------------------------------------ */

int refit_config_quant_format(const refit_config_t *cfg) {
  switch (cfg->refit.precision) {
  case REFIT_PRECISION_MXFP8:
    return REFIT_QUANT_MXFP8;
  case REFIT_PRECISION_FP8_BLOCK:
    return REFIT_QUANT_FP8_BLOCK;
  case REFIT_PRECISION_NVFP4:
    return REFIT_QUANT_NVFP4;
  case REFIT_PRECISION_BF16:
    break;
  }
  return REFIT_QUANT_NONE;
}

int refit_config_quantizes(const refit_config_t *cfg, const refit_gen_tensor_t *g) {
  if (refit_config_quant_format(cfg) == REFIT_QUANT_NONE || g->kind == REFIT_GEN_PLAIN)
    return REFIT_QUANT_NONE;
  for (int i = 0; i < cfg->refit.quantization_ignore_count; i++)
    if (refit_config_module_matches(g->name, cfg->refit.quantization_ignore[i]))
      return REFIT_QUANT_NONE;
  return refit_config_quant_format(cfg);
}

void refit_config_mark_quantized(const refit_config_t *cfg, refit_catalog_t *cat) {
  const int64_t n = cat->gen_begin[cat->generator.tp];
  for (int64_t i = 0; i < n; i++)
    cat->gen[i].quantized = refit_config_quantizes(cfg, &cat->gen[i]);
}
