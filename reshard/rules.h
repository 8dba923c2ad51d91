/*
 * The layout rules: what a model and the two parallel layouts must satisfy
 * for the catalog to describe them (../shared/reference/sharding.md). They
 * are stated once, here. The catalog refuses a layout that breaks one
 * (refit_catalog_create, for programmatic callers); the YAML config
 * (runtime/src/config/config_rules.c) reports every broken rule at the key of the field
 * it blames, with the file's line and column.
 *
 * Pure C: no MPI, no CUDA, no I/O.
 */
#ifndef REFIT_RESHARD_RULES_H
#define REFIT_RESHARD_RULES_H

#include "reshard/layout.h"

#include <stdint.h>

/* A set of fields: bit f for refit_field_t f. */
typedef uint64_t refit_fields_t;
#define REFIT_FIELD_BIT(f) ((refit_fields_t)1 << (f))
_Static_assert(REFIT_FIELD_COUNT <= 64, "a field set holds every field");

#define REFIT_VIOLATION_TEXT 384
#define REFIT_VIOLATIONS_MAX 32

/* One broken rule. */
typedef struct {
  /* The field a person would change. */
  refit_field_t field;
  /* Where a caller that knows which fields were given (the config: keys in
   * the file) points instead when `field` was not given but this one was;
   * REFIT_FIELD_NONE when there is no such choice. */
  refit_field_t or_field;
  /* What is wrong, naming fields by refit_field_name():
   * "trainer.tp: 3 does not divide model.num_attention_heads 8 (...)". */
  char text[REFIT_VIOLATION_TEXT];
} refit_violation_t;

typedef struct {
  int count;   /* entries of v */
  int dropped; /* broken rules past REFIT_VIOLATIONS_MAX, not described */
  refit_violation_t v[REFIT_VIOLATIONS_MAX];
} refit_violations_t;

/* The path of a field ("trainer.tp"); "" for REFIT_FIELD_NONE or out of
 * range. */
const char *refit_field_name(refit_field_t f);

/* The value of field f in (model, trainer, generator), as an integer. */
int64_t refit_field_value(const refit_model_t *model,
                          const refit_trainer_layout_t *trainer,
                          const refit_generator_layout_t *generator, refit_field_t f);

/*
 * Check every layout rule and describe each one broken in *out (filled
 * whole; count 0 when all hold). A rule that reads a field of `unknown`
 * (the config: a value already reported as bad) is not checked, so one
 * mistake yields one violation; a field found not positive joins `unknown`
 * for the rules after it. Rules that only apply with 0 (a dimension the
 * family does not use) are skipped for 0 as well.
 */
void refit_layout_rules(const refit_model_t *model, const refit_trainer_layout_t *trainer,
                        const refit_generator_layout_t *generator, refit_fields_t unknown,
                        refit_violations_t *out);

/*
 * Layer range of every pipeline stage: stage s holds layers
 * [first_layer[s], first_layer[s + 1]), so first_layer has trainer->pp + 1
 * entries. trainer.first_stage_layers / last_stage_layers 0 mean "split
 * evenly"; the stages not given split the rest evenly, at least one layer
 * each. This is the rule refit_layout_rules checks.
 * Errors: REFIT_ERR_INVALID_ARGUMENT with the violation's text.
 */
refit_status_t refit_stage_layers(const refit_model_t *model,
                                  const refit_trainer_layout_t *trainer,
                                  int64_t *first_layer /* pp + 1 */);

#endif /* REFIT_RESHARD_RULES_H */
