/*
 * The layout rules (rules.h). Each names the field a person would change:
 * usually the divisor, since the model is given and the layout is chosen.
 */
#include "reshard/rules.h"

#include "core/error.h"
#include "reshard/catalog.h"
#include "reshard/family.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const refit_field_names[REFIT_FIELD_COUNT] = {
    [REFIT_FIELD_NONE] = "",
#define REFIT_FIELD_NAME_(id, name, side, member) [REFIT_FIELD_##id] = name,
    REFIT_FIELDS(REFIT_FIELD_NAME_)
#undef REFIT_FIELD_NAME_
};

const char *refit_field_name(refit_field_t f) {
  return (unsigned)f < REFIT_FIELD_COUNT ? refit_field_names[f] : "";
}

int64_t refit_field_value(const refit_model_t *model,
                          const refit_trainer_layout_t *trainer,
                          const refit_generator_layout_t *generator, refit_field_t f) {
  switch (f) {
#define REFIT_FIELD_CASE_(id, name, side, member)                                        \
  case REFIT_FIELD_##id:                                                                 \
    return (int64_t)side->member;
    REFIT_FIELDS(REFIT_FIELD_CASE_)
#undef REFIT_FIELD_CASE_
  case REFIT_FIELD_NONE:
  case REFIT_FIELD_COUNT:
    break;
  }
  return 0;
}

typedef struct {
  const refit_model_t *model;
  const refit_trainer_layout_t *trainer;
  const refit_generator_layout_t *generator;
  refit_fields_t unknown;
  refit_violations_t *out;
} refit_rules_t;

#define BIT(id) REFIT_FIELD_BIT(REFIT_FIELD_##id)

static int64_t refit_rules_value(const refit_rules_t *r, refit_field_t f) {
  return refit_field_value(r->model, r->trainer, r->generator, f);
}

/* May a rule that reads `inputs` be checked? */
static int refit_rules_known(const refit_rules_t *r, refit_fields_t inputs) {
  return (r->unknown & inputs) == 0;
}

static void refit_rules_break(refit_rules_t *r, refit_field_t field,
                              refit_field_t or_field, const char *fmt, ...)
    REFIT_PRINTF(4, 5);

/* Record a broken rule. */
static void refit_rules_break(refit_rules_t *r, refit_field_t field,
                              refit_field_t or_field, const char *fmt, ...) {
  refit_violations_t *out = r->out;
  if (out->count == REFIT_VIOLATIONS_MAX) {
    out->dropped++;
    return;
  }
  refit_violation_t *v = &out->v[out->count++];
  v->field = field;
  v->or_field = or_field;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v->text, sizeof(v->text), fmt, ap);
  va_end(ap);
}

/*
 * The one divisibility rule: field `divisor` must divide field `dividend`
 * (0 = not used by this model, nothing to split). Blames the divisor.
 */
static void refit_rules_divides(refit_rules_t *r, refit_field_t divisor,
                                refit_field_t dividend, const char *why) {
  if (!refit_rules_known(r, REFIT_FIELD_BIT(divisor) | REFIT_FIELD_BIT(dividend)))
    return;
  const int64_t d = refit_rules_value(r, divisor), v = refit_rules_value(r, dividend);
  if (d > 0 && v > 0 && v % d != 0)
    refit_rules_break(r, divisor, REFIT_FIELD_NONE,
                      "%s: %" PRId64 " does not divide %s %" PRId64 " (%s)",
                      refit_field_name(divisor), d, refit_field_name(dividend), v, why);
}

/* Sizes every layout needs: a value below 1 is refused, and the rules that
 * would divide by it are not checked. The config's bounds keep these
 * positive; they guard programmatic callers. */
static void refit_rules_positive(refit_rules_t *r) {
  static const refit_field_t sizes[] = {
      REFIT_FIELD_MODEL_HIDDEN_SIZE,
      REFIT_FIELD_MODEL_NUM_LAYERS,
      REFIT_FIELD_MODEL_NUM_ATTENTION_HEADS,
      REFIT_FIELD_MODEL_NUM_KV_HEADS,
      REFIT_FIELD_MODEL_HEAD_DIM,
      REFIT_FIELD_MODEL_VOCAB_SIZE,
      REFIT_FIELD_TRAINER_TP,
      REFIT_FIELD_TRAINER_PP,
      REFIT_FIELD_TRAINER_EP,
      REFIT_FIELD_TRAINER_ETP,
      REFIT_FIELD_TRAINER_DP,
      REFIT_FIELD_GENERATOR_TP,
      REFIT_FIELD_GENERATOR_EP,
      REFIT_FIELD_GENERATOR_ENGINES,
  };
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    const refit_field_t f = sizes[i];
    if (refit_rules_known(r, REFIT_FIELD_BIT(f)) && refit_rules_value(r, f) < 1) {
      refit_rules_break(r, f, REFIT_FIELD_NONE, "%s: %" PRId64 " must be positive",
                        refit_field_name(f), refit_rules_value(r, f));
      r->unknown |= REFIT_FIELD_BIT(f);
    }
  }
  const int family = r->model->family;
  if (refit_rules_known(r, BIT(MODEL_FAMILY)) && refit_family_desc(family) == NULL) {
    char names[160];
    refit_family_list(0, names, sizeof(names));
    refit_rules_break(r, REFIT_FIELD_MODEL_FAMILY, REFIT_FIELD_NONE,
                      "model.family: %d is no family (%s)", family, names);
    r->unknown |= BIT(MODEL_FAMILY);
  }
}

/* The dimensions of the family: each must be positive (and then joins the
 * rules), the other family's are not read. */
static void refit_rules_family(refit_rules_t *r) {
  static const struct {
    refit_field_t field; /* a dimension of some families (refit_field_in_family) */
    const char *what;
  } dims[] = {
      {REFIT_FIELD_MODEL_INTERMEDIATE_SIZE, "the dense MLP width F"},
      {REFIT_FIELD_MODEL_NUM_EXPERTS, "the routed experts X"},
      {REFIT_FIELD_MODEL_MOE_INTERMEDIATE_SIZE, "the expert MLP width I"},
      {REFIT_FIELD_MODEL_Q_LORA_RANK, "the query LoRA rank, 0 for q_proj"},
      {REFIT_FIELD_MODEL_KV_LORA_RANK, "the latent KV rank of MLA"},
      {REFIT_FIELD_MODEL_QK_NOPE_HEAD_DIM, "the non-rope q/k head dimension of MLA"},
      {REFIT_FIELD_MODEL_V_HEAD_DIM, "the value head dimension of MLA"},
      {REFIT_FIELD_MODEL_NUM_SHARED_EXPERTS, "the shared experts, 0 for none"},
      {REFIT_FIELD_MODEL_FIRST_K_DENSE_REPLACE, "the dense layers before the first MoE "
                                                "layer"},
      {REFIT_FIELD_MODEL_MOE_LAYER_FREQ, "every how many layers one is MoE, 0 for 1"},
      {REFIT_FIELD_MODEL_EXPERT_BIAS, "the routers' FP32 e_score_correction_bias"},
  };
  if (!refit_rules_known(r, BIT(MODEL_FAMILY)))
    return;
  for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++) {
    const refit_field_t f = dims[i].field;
    const int family = (int)r->model->family;
    const int zero_ok = refit_field_may_be_zero(f);
    if (!refit_field_in_family(f, family) || !refit_rules_known(r, REFIT_FIELD_BIT(f)) ||
        refit_rules_value(r, f) > 0 || (zero_ok && refit_rules_value(r, f) == 0))
      continue;
    refit_rules_break(r, f, REFIT_FIELD_MODEL_FAMILY,
                      "%s: a %s value is required when model.family is %s "
                      "(%s)",
                      refit_field_name(f), zero_ok ? "non-negative" : "positive",
                      refit_family_desc(family)->name, dims[i].what);
    r->unknown |= REFIT_FIELD_BIT(f);
  }
  /* MLA has no KV heads of its own (every head's k and v come from the
   * latent) and no single head dimension: refit reads num_kv_heads as the
   * heads and head_dim as the rope dimension qk_rope_head_dim, which the
   * published configs and transformers' DeepseekV3Config agree with. */
  const refit_model_t *m = r->model;
  if (refit_family_desc(m->family)->mla &&
      refit_rules_known(r, BIT(MODEL_NUM_KV_HEADS) | BIT(MODEL_NUM_ATTENTION_HEADS)) &&
      m->num_kv_heads != m->num_attention_heads)
    refit_rules_break(r, REFIT_FIELD_MODEL_NUM_KV_HEADS, REFIT_FIELD_NONE,
                      "model.num_kv_heads: expected model.num_attention_heads (%" PRId64
                      ") for model.family %s, got %" PRId64
                      " (multi-head latent attention gives every head its own k "
                      "and v)",
                      m->num_attention_heads, refit_family_desc(m->family)->name,
                      m->num_kv_heads);
}

/* The rows of a MLA or shared-expert tensor that tp splits, which no single
 * field gives: `what` names them for the message. */
static void refit_rules_divides_rows(refit_rules_t *r, refit_field_t tp_field,
                                     refit_fields_t inputs, int64_t rows,
                                     const char *what, const char *why) {
  if (!refit_rules_known(r, REFIT_FIELD_BIT(tp_field) | inputs))
    return;
  const int64_t tp = refit_rules_value(r, tp_field);
  if (tp > 0 && rows > 0 && rows % tp != 0)
    refit_rules_break(r, tp_field, REFIT_FIELD_NONE,
                      "%s: %" PRId64 " does not divide %s = %" PRId64 " (%s)",
                      refit_field_name(tp_field), tp, what, rows, why);
}

/* Expert parallelism on a dense model has nothing to split. */
static void refit_rules_no_experts(refit_rules_t *r, refit_field_t f) {
  if (refit_rules_known(r, BIT(MODEL_FAMILY) | REFIT_FIELD_BIT(f)) &&
      !refit_family_desc(r->model->family)->moe && refit_rules_value(r, f) > 1)
    refit_rules_break(r, f, REFIT_FIELD_NONE,
                      "%s: %" PRId64 " needs experts, but model.family is %s "
                      "(dense); use 1",
                      refit_field_name(f), refit_rules_value(r, f),
                      refit_family_desc(r->model->family)->name);
}

/*
 * Tensor parallelism on either side splits query heads, the vocabulary
 * (embed_tokens and lm_head) and the dense MLP. KV heads are split whole; a
 * generator (vLLM) may instead replicate each KV head over tp/KV ranks, and
 * pads the vocabulary to a multiple of 64 (refit_catalog_vocab_rows). A
 * trainer under Hugging Face names splits V itself; under Megatron names it
 * pads V first (refit_catalog_trainer_vocab), so any tp divides it.
 */
static void refit_rules_tp(refit_rules_t *r, refit_field_t tp_field, int generator) {
  const refit_model_t *m = r->model;
  refit_rules_divides(r, tp_field, REFIT_FIELD_MODEL_NUM_ATTENTION_HEADS,
                      "query heads are split over tp");
  if (!generator && refit_rules_known(r, BIT(TRAINER_LAYOUT)) &&
      r->trainer->names != REFIT_TRAINER_NAMES_MEGATRON)
    refit_rules_divides(r, tp_field, REFIT_FIELD_MODEL_VOCAB_SIZE,
                        "embeddings and lm_head are vocab-parallel; "
                        "trainer.layout megatron pads the vocabulary");
  const int64_t tp = refit_rules_value(r, tp_field);
  if (generator &&
      refit_rules_known(r, REFIT_FIELD_BIT(tp_field) | BIT(MODEL_VOCAB_SIZE)) &&
      refit_catalog_vocab_rows(m, 1) % tp != 0)
    refit_rules_break(r, tp_field, REFIT_FIELD_NONE,
                      "%s: %" PRId64 " does not divide model.vocab_size %" PRId64
                      " padded to a multiple of 64 = %" PRId64
                      " (vLLM's vocab-parallel embedding and lm_head)",
                      refit_field_name(tp_field), tp, m->vocab_size,
                      refit_catalog_vocab_rows(m, 1));
  if (refit_rules_known(r, BIT(MODEL_FAMILY) | BIT(MODEL_NUM_LAYERS) |
                               BIT(MODEL_FIRST_K_DENSE_REPLACE) |
                               BIT(MODEL_MOE_LAYER_FREQ)) &&
      refit_model_has_dense_layers(m))
    refit_rules_divides(r, tp_field, REFIT_FIELD_MODEL_INTERMEDIATE_SIZE,
                        "the dense MLP is split over tp");
  if (refit_rules_known(r, BIT(MODEL_FAMILY)) &&
      refit_family_desc(m->family)->deepseek_moe)
    refit_rules_divides_rows(
        r, tp_field, BIT(MODEL_NUM_SHARED_EXPERTS) | BIT(MODEL_MOE_INTERMEDIATE_SIZE),
        m->num_shared_experts * m->moe_intermediate_size,
        "model.num_shared_experts * model.moe_intermediate_size",
        "the shared experts are split over the dense tp group");
  if (!refit_rules_known(r, REFIT_FIELD_BIT(tp_field) | BIT(MODEL_NUM_KV_HEADS)))
    return;
  if (!generator || tp <= m->num_kv_heads)
    refit_rules_divides(r, tp_field, REFIT_FIELD_MODEL_NUM_KV_HEADS,
                        "KV heads are split whole over tp");
  else if (tp % m->num_kv_heads != 0)
    refit_rules_break(r, tp_field, REFIT_FIELD_NONE,
                      "%s: %" PRId64 " is larger than model.num_kv_heads %" PRId64
                      " but not a multiple of it (each KV head is replicated on "
                      "tp/KV ranks)",
                      refit_field_name(tp_field), tp, m->num_kv_heads);
}

/*
 * The pipeline split (refit_stage_layers). Fills first_layer (pp + 1
 * entries) when it is not NULL; returns 0, or -1 with *why filled.
 */
static int refit_stage_split(const refit_model_t *model,
                             const refit_trainer_layout_t *trainer, int64_t *first_layer,
                             refit_violation_t *why) {
  const int64_t L = model->num_layers;
  const int pp = trainer->pp;
  const int64_t f = trainer->first_stage_layers;
  const int64_t l = trainer->last_stage_layers;
  why->or_field = REFIT_FIELD_NONE;
#define REFIT_STAGE_FAIL(blame, ...)                                                     \
  do {                                                                                   \
    why->field = (blame);                                                                \
    snprintf(why->text, sizeof(why->text), __VA_ARGS__);                                 \
    return -1;                                                                           \
  } while (0)
  if (f < 0 || l < 0)
    REFIT_STAGE_FAIL(f < 0 ? REFIT_FIELD_TRAINER_FIRST_STAGE_LAYERS
                           : REFIT_FIELD_TRAINER_LAST_STAGE_LAYERS,
                     "trainer.%s_stage_layers: %" PRId64 " is negative",
                     f < 0 ? "first" : "last", f < 0 ? f : l);
  if (f > L || l > L)
    REFIT_STAGE_FAIL(f > L ? REFIT_FIELD_TRAINER_FIRST_STAGE_LAYERS
                           : REFIT_FIELD_TRAINER_LAST_STAGE_LAYERS,
                     "trainer.%s_stage_layers: %" PRId64
                     " exceeds model.num_layers %" PRId64,
                     f > L ? "first" : "last", f > L ? f : l, L);
  int64_t per_stage[2] = {0, 0}; /* first and last; middle ones get `rest` */
  int64_t rest = L;
  int stages = pp;
  if (pp == 1) {
    const int first = f != 0 && f != L;
    if (first || (l != 0 && l != L))
      REFIT_STAGE_FAIL(first ? REFIT_FIELD_TRAINER_FIRST_STAGE_LAYERS
                             : REFIT_FIELD_TRAINER_LAST_STAGE_LAYERS,
                       "trainer.%s_stage_layers: %" PRId64
                       " must be 0 or model.num_layers %" PRId64
                       " when trainer.pp is 1 (the only stage holds every layer)",
                       first ? "first" : "last", first ? f : l, L);
  } else if (f == 0 && l == 0) {
    if (L % pp != 0)
      REFIT_STAGE_FAIL(REFIT_FIELD_TRAINER_PP,
                       "trainer.pp: %d does not divide model.num_layers %" PRId64
                       "; set trainer.first_stage_layers or last_stage_layers "
                       "for an uneven split",
                       pp, L);
  } else {
    const refit_field_t blame = f ? REFIT_FIELD_TRAINER_FIRST_STAGE_LAYERS
                                  : REFIT_FIELD_TRAINER_LAST_STAGE_LAYERS;
    per_stage[0] = f;
    per_stage[1] = l;
    rest = L - f - l;
    stages = pp - (f != 0) - (l != 0);
    if (stages == 0 && rest != 0)
      REFIT_STAGE_FAIL(blame,
                       "trainer.first_stage_layers %" PRId64
                       " + trainer.last_stage_layers %" PRId64 " = %" PRId64
                       ", but model.num_layers is %" PRId64
                       " (trainer.pp 2 has no middle stages)",
                       f, l, f + l, L);
    /* The stages not given split what the given ones leave, evenly. */
    if (stages > 0 && (rest < stages || rest % stages != 0)) {
      char given[128];
      if (f && l)
        snprintf(given, sizeof(given),
                 "trainer.first_stage_layers %" PRId64
                 " and trainer.last_stage_layers %" PRId64 " leave",
                 f, l);
      else
        snprintf(given, sizeof(given), "trainer.%s_stage_layers %" PRId64 " leaves",
                 f ? "first" : "last", f ? f : l);
      REFIT_STAGE_FAIL(blame,
                       "%s %" PRId64 " of model.num_layers %" PRId64
                       " for the other %d stage%s of trainer.pp %d, which must "
                       "split them evenly with at least one layer each",
                       given, rest, L, stages, stages == 1 ? "" : "s", pp);
    }
  }
#undef REFIT_STAGE_FAIL
  if (first_layer == NULL)
    return 0;
  first_layer[0] = 0;
  for (int s = 0; s < pp; s++) {
    int64_t n = stages > 0 ? rest / stages : 0;
    if (s == 0 && per_stage[0])
      n = per_stage[0];
    else if (s == pp - 1 && per_stage[1])
      n = per_stage[1];
    first_layer[s + 1] = first_layer[s] + n;
  }
  return 0;
}

refit_status_t refit_stage_layers(const refit_model_t *model,
                                  const refit_trainer_layout_t *trainer,
                                  int64_t *first_layer) {
  refit_violation_t why;
  if (trainer->pp < 1)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "trainer.pp: %d must be positive",
                     trainer->pp);
  if (refit_stage_split(model, trainer, first_layer, &why) != 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "%s", why.text);
  return REFIT_OK;
}

/* The trainer: tp (above), expert parallelism folded into each stage's tp*dp
 * ranks, pipeline stages. */
static void refit_rules_trainer(refit_rules_t *r) {
  const refit_trainer_layout_t *t = r->trainer;
  refit_rules_tp(r, REFIT_FIELD_TRAINER_TP, 0);
  refit_rules_no_experts(r, REFIT_FIELD_TRAINER_EP);
  refit_rules_no_experts(r, REFIT_FIELD_TRAINER_ETP);
  if (refit_rules_known(r, BIT(MODEL_FAMILY)) &&
      refit_family_desc(r->model->family)->moe) {
    refit_rules_divides(r, REFIT_FIELD_TRAINER_EP, REFIT_FIELD_MODEL_NUM_EXPERTS,
                        "experts are split contiguously over ep");
    refit_rules_divides(r, REFIT_FIELD_TRAINER_ETP,
                        REFIT_FIELD_MODEL_MOE_INTERMEDIATE_SIZE,
                        "each expert is split over etp");
    const int64_t dense = (int64_t)t->tp * t->dp, expert = (int64_t)t->etp * t->ep;
    if (refit_rules_known(r, BIT(TRAINER_TP) | BIT(TRAINER_DP) | BIT(TRAINER_EP) |
                                 BIT(TRAINER_ETP)) &&
        dense % expert != 0)
      refit_rules_break(r, REFIT_FIELD_TRAINER_EP, REFIT_FIELD_TRAINER_ETP,
                        "trainer.etp * trainer.ep = %d * %d = %" PRId64
                        " does not divide trainer.tp * trainer.dp = %d * %d = "
                        "%" PRId64 " (MoE parallel folding re-views each stage's "
                        "tp*dp ranks as etp*ep*edp)",
                        t->etp, t->ep, expert, t->tp, t->dp, dense);
  }
  if (refit_rules_known(r, BIT(MODEL_NUM_LAYERS) | BIT(TRAINER_PP) |
                               BIT(TRAINER_FIRST_STAGE_LAYERS) |
                               BIT(TRAINER_LAST_STAGE_LAYERS))) {
    refit_violation_t why;
    if (refit_stage_split(r->model, t, NULL, &why) != 0)
      refit_rules_break(r, why.field, why.or_field, "%s", why.text);
  }
  /* The local spec's MLA down projections are ColumnParallelLinears, split
   * by rows over tp (Megatron-LM multi_latent_attention.py); TE duplicates
   * them. */
  if (refit_rules_known(r, BIT(MODEL_FAMILY) | BIT(TRAINER_SPEC) | BIT(TRAINER_LAYOUT)) &&
      refit_family_desc(r->model->family)->mla && t->spec == REFIT_SPEC_LOCAL &&
      t->names == REFIT_TRAINER_NAMES_MEGATRON) {
    const char *why = "trainer.spec local splits linear_q_down_proj and "
                      "linear_kv_down_proj by rows over tp";
    refit_rules_divides_rows(r, REFIT_FIELD_TRAINER_TP, BIT(MODEL_Q_LORA_RANK),
                             r->model->q_lora_rank, "model.q_lora_rank", why);
    refit_rules_divides_rows(
        r, REFIT_FIELD_TRAINER_TP, BIT(MODEL_KV_LORA_RANK) | BIT(MODEL_HEAD_DIM),
        r->model->kv_lora_rank + r->model->head_dim,
        "model.kv_lora_rank + model.head_dim (the rope dimension)", why);
  }
  /* Megatron-Core's local spec has only SequentialMLP experts. */
  if (refit_rules_known(r, BIT(TRAINER_SPEC) | BIT(TRAINER_EXPERTS)) &&
      t->spec == REFIT_SPEC_LOCAL && t->experts == REFIT_EXPERTS_GROUPED)
    refit_rules_break(r, REFIT_FIELD_TRAINER_EXPERTS, REFIT_FIELD_NONE,
                      "trainer.experts: grouped needs trainer.spec te "
                      "(Megatron-Core's local spec has SequentialMLP experts "
                      "only)");
}

/* The generator (vLLM): tp (above); experts TP-sharded (ep 1) or whole
 * experts split over the tp ranks (ep == tp). */
static void refit_rules_generator(refit_rules_t *r) {
  const refit_generator_layout_t *g = r->generator;
  refit_rules_tp(r, REFIT_FIELD_GENERATOR_TP, 1);
  refit_rules_no_experts(r, REFIT_FIELD_GENERATOR_EP);
  if (!refit_rules_known(r, BIT(MODEL_FAMILY) | BIT(GENERATOR_TP) | BIT(GENERATOR_EP)) ||
      !refit_family_desc(r->model->family)->moe)
    return;
  if (g->ep != 1 && g->ep != g->tp)
    refit_rules_break(r, REFIT_FIELD_GENERATOR_EP, REFIT_FIELD_NONE,
                      "generator.ep: expected 1 or generator.tp (%d), got %d", g->tp,
                      g->ep);
  else if (g->ep > 1)
    refit_rules_divides(r, REFIT_FIELD_GENERATOR_EP, REFIT_FIELD_MODEL_NUM_EXPERTS,
                        "with generator.ep == tp each rank holds whole experts");
  else
    refit_rules_divides(r, REFIT_FIELD_GENERATOR_TP,
                        REFIT_FIELD_MODEL_MOE_INTERMEDIATE_SIZE,
                        "with generator.ep 1 every rank holds a tp shard of each "
                        "expert");
}

void refit_layout_rules(const refit_model_t *model, const refit_trainer_layout_t *trainer,
                        const refit_generator_layout_t *generator, refit_fields_t unknown,
                        refit_violations_t *out) {
  refit_rules_t r = {model, trainer, generator, unknown, out};
  out->count = 0;
  out->dropped = 0;
  refit_rules_positive(&r);
  refit_rules_family(&r);
  refit_rules_divides(&r, REFIT_FIELD_MODEL_NUM_KV_HEADS,
                      REFIT_FIELD_MODEL_NUM_ATTENTION_HEADS,
                      "each KV head serves a whole group of query heads");
  refit_rules_trainer(&r);
  refit_rules_generator(&r);
}
