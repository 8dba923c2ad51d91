/*
 * The fault seam's REFIT_FAULT parser (runtime/src/fault/fault.c): the config's
 * bounds for every value, every problem named, and the seam off unless the
 * build's user switches it on (REFIT_ENABLE_FAULTS=1 or refit.fault). Then
 * when a fault fires and what the shared actions do (inject.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/error.h"
#include "fault/fault.h"

#include <string.h>

static const refit_fault_t untouched = {7, 7, 7, 7, 7.0, 7, 7.0};

/* Field by field: a struct copy need not copy the padding bytes. */
static void assert_untouched(const refit_fault_t *f) {
  assert_int_equal(f->enabled, untouched.enabled);
  assert_int_equal(f->phase, untouched.phase);
  assert_int_equal(f->rank, untouched.rank);
  assert_int_equal(f->action, untouched.action);
  assert_true(f->at == untouched.at);
  assert_int_equal(f->refit, untouched.refit);
  assert_true(f->probability == untouched.probability);
}

/* Parse must fail, leave *out as it was, and say each of `words`. */
static void refused(const char *text, int world, int precision,
                    const char *const *words) {
  refit_fault_t f = untouched;
  assert_int_equal(refit_fault_parse(text, world, precision, &f), REFIT_ERR_CONFIG);
  assert_untouched(&f);
  const char *msg = refit_last_error();
  assert_non_null(strstr(msg, "REFIT_FAULT: "));
  for (; *words; words++)
    if (strstr(msg, *words) == NULL)
      fail_msg("'%s' lacks '%s'", msg, *words);
}
#define REFUSED(text, world, precision, ...)                                             \
  refused(text, world, precision, (const char *const[]){__VA_ARGS__, NULL})

static void test_fault_parse_full(void **state) {
  (void)state;
  refit_fault_t f = untouched;
  assert_int_equal(refit_fault_parse("phase=commit,rank=3,action=stall,at=0.25,refit=0,"
                                     "p=0.5",
                                     4, REFIT_PRECISION_BF16, &f),
                   REFIT_OK);
  assert_int_equal(f.enabled, 1);
  assert_int_equal(f.phase, REFIT_FAULT_PHASE_COMMIT);
  assert_int_equal(f.rank, 3);
  assert_int_equal(f.action, REFIT_FAULT_STALL);
  assert_true(f.at == 0.25);
  assert_int_equal(f.refit, 0);
  assert_true(f.probability == 0.5);
  assert_int_equal(
      refit_fault_parse("probability=1,action=error,rank=0,phase=transfer", 0, -1, &f),
      REFIT_OK);
  assert_int_equal(f.action, REFIT_FAULT_ERROR);
  assert_int_equal(f.phase, REFIT_FAULT_PHASE_TRANSFER);
  assert_true(f.probability == 1.0);
}

/* Defaults are the config table's: at 0.5, refit 1, probability 1. */
static void test_fault_parse_defaults(void **state) {
  (void)state;
  refit_fault_t f = untouched;
  assert_int_equal(refit_fault_parse("phase=quantize,rank=1,action=bitflip", 2,
                                     REFIT_PRECISION_MXFP8, &f),
                   REFIT_OK);
  assert_true(f.at == 0.5);
  assert_int_equal(f.refit, 1);
  assert_true(f.probability == 1.0);
  assert_int_equal(f.phase, REFIT_FAULT_PHASE_QUANTIZE);
}

/* Each value outside its row's bounds, by key and value. */
static void test_fault_parse_bounds(void **state) {
  (void)state;
  REFUSED("phase=transfer,rank=-1,action=kill", 0, -1, "rank: '-1' is not an integer");
  REFUSED("phase=transfer,rank=2147483648,action=kill", 0, -1, "rank: '2147483648'");
  REFUSED("phase=transfer,rank=1x,action=kill", 0, -1, "rank: '1x'");
  REFUSED("phase=transfer,rank=,action=kill", 0, -1, "rank: ''");
  REFUSED("phase=transfer,rank=0,action=kill,at=1.5", 0, -1,
          "at: '1.5' is not a number in [0, 1]");
  REFUSED("phase=transfer,rank=0,action=kill,at=nan", 0, -1, "at: 'nan'");
  REFUSED("phase=transfer,rank=0,action=kill,at=-0.1", 0, -1, "at: '-0.1'");
  REFUSED("phase=transfer,rank=0,action=kill,p=0", 0, -1,
          "probability: '0' is not a number in (0, 1]");
  REFUSED("phase=transfer,rank=0,action=kill,p=1e999", 0, -1, "probability: '1e999'");
  REFUSED("phase=transfer,rank=0,action=kill,refit=-2", 0, -1, "refit: '-2'");
  REFUSED("phase=transfers,rank=0,action=kill", 0, -1,
          "phase: 'transfers' is not one of transfer|");
  REFUSED("phase=transfer,rank=0,action=", 0, -1, "action: '' is not one of kill|");
}

/* World size and precision rules, as refit_config_parse() applies them. */
static void test_fault_parse_rules(void **state) {
  (void)state;
  REFUSED("phase=transfer,rank=4,action=kill", 4, -1,
          "rank: 4 is not a rank of this job (world size 4, ranks 0..3)");
  REFUSED("phase=quantize,rank=0,action=drop", 4, REFIT_PRECISION_BF16,
          "phase: a bf16 refit has no quantize phase");
  REFUSED("phase=amax,rank=0,action=kill", 4, REFIT_PRECISION_MXFP8,
          "phase: a refit without refit.precision nvfp4 has no amax exchange");
  refit_fault_t a = untouched;
  assert_int_equal(refit_fault_parse("phase=amax,rank=1,action=stall", 4,
                                     REFIT_PRECISION_NVFP4, &a),
                   REFIT_OK);
  assert_int_equal(a.phase, REFIT_FAULT_PHASE_AMAX);
  refit_fault_t f = untouched;
  assert_int_equal(refit_fault_parse("phase=transfer,rank=4,action=kill", 0, -1, &f),
                   REFIT_OK); /* world size 0: not checked */
}

/* Syntax: every problem in one message. */
static void test_fault_parse_syntax(void **state) {
  (void)state;
  REFUSED("", 0, -1, "phase is required (one of transfer|", "rank is required",
          "action is required (one of kill|");
  REFUSED("phase=transfer,rank=0", 0, -1, "action is required");
  REFUSED("phase=transfer,rank=0,action=kill,when=now", 0, -1, "unknown key 'when'");
  REFUSED("phase=transfer,rank=0,action=kill,bogus", 0, -1, "'bogus' is not key=value");
  REFUSED("phase=transfer,rank=0,action=kill,,", 0, -1, "'' is not key=value");
  REFUSED("phase=transfer,rank=0,rank=1,action=kill", 0, -1, "rank given twice");
  REFUSED("phase=transfer,rank=0,action=kill,p=1,probability=1", 0, -1,
          "probability given twice");
  REFUSED("phase=verify,rank=x,action=y,at=2", 0, -1, "rank: 'x'", "action: 'y'",
          "at: '2'");
  char big[600];
  memset(big, 'a', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  REFUSED(big, 0, -1, "599 bytes");
}

/* The seam is off unless switched on: REFIT_FAULT alone does nothing. */
static void test_fault_select(void **state) {
  (void)state;
  refit_config_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.refit.precision = REFIT_PRECISION_BF16;
  refit_fault_t f = untouched;
  int ignored = -1;
  const char *kill1 = "phase=transfer,rank=1,action=kill";

  /* Off: ignored, the config's (none) stands. */
  assert_int_equal(refit_fault_select(&cfg, 4, kill1, NULL, &f, &ignored), REFIT_OK);
  assert_int_equal(f.enabled, 0);
  assert_int_equal(ignored, 1);
  assert_int_equal(refit_fault_select(&cfg, 4, kill1, "0", &f, &ignored), REFIT_OK);
  assert_int_equal(f.enabled, 0);
  assert_int_equal(ignored, 1);
  /* Off and not set: nothing to ignore; a bad value is not even read. */
  assert_int_equal(refit_fault_select(&cfg, 4, "", NULL, &f, &ignored), REFIT_OK);
  assert_int_equal(ignored, 0);
  assert_int_equal(refit_fault_select(&cfg, 4, "rank=99", NULL, &f, &ignored), REFIT_OK);
  assert_int_equal(f.enabled, 0);

  /* On through REFIT_ENABLE_FAULTS=1: parsed with the config's bounds. */
  assert_int_equal(refit_fault_select(&cfg, 4, kill1, "1", &f, &ignored), REFIT_OK);
  assert_int_equal(ignored, 0);
  assert_int_equal(f.enabled, 1);
  assert_int_equal(f.rank, 1);
  f = untouched;
  assert_int_equal(
      refit_fault_select(&cfg, 4, "phase=transfer,rank=9,action=kill", "1", &f, &ignored),
      REFIT_ERR_CONFIG);
  assert_untouched(&f);
  assert_non_null(strstr(refit_last_error(), "rank: 9 is not a rank of this job"));

  /* On through refit.fault: REFIT_FAULT replaces it; unset keeps it. */
  cfg.refit.fault.enabled = 1;
  cfg.refit.fault.phase = REFIT_FAULT_PHASE_COMMIT;
  cfg.refit.fault.rank = 2;
  cfg.refit.fault.action = REFIT_FAULT_ERROR;
  cfg.refit.fault.at = 0.5;
  cfg.refit.fault.refit = 3;
  cfg.refit.fault.probability = 1;
  assert_int_equal(refit_fault_select(&cfg, 4, NULL, NULL, &f, &ignored), REFIT_OK);
  assert_int_equal(f.enabled, 1);
  assert_int_equal(f.phase, REFIT_FAULT_PHASE_COMMIT);
  assert_int_equal(f.rank, 2);
  assert_int_equal(f.refit, 3);
  assert_int_equal(refit_fault_select(&cfg, 4, kill1, NULL, &f, &ignored), REFIT_OK);
  assert_int_equal(ignored, 0);
  assert_int_equal(f.phase, REFIT_FAULT_PHASE_TRANSFER);
  assert_int_equal(f.rank, 1);
  assert_int_equal(f.refit, 1); /* REFIT_FAULT's own defaults, not a mix */
}

/* Whether a fault fires: its phase, its rank, its refit (0: every refit;
 * the open phase comes before any refit), its probability (a draw the same
 * on every run, from the seed and the refit). */
static void test_fault_fires(void **state) {
  (void)state;
  refit_fault_t f = {.enabled = 1,
                     .phase = REFIT_FAULT_PHASE_TRANSFER,
                     .rank = 2,
                     .action = REFIT_FAULT_KILL,
                     .at = 0.5,
                     .refit = 3,
                     .probability = 1};
  assert_true(refit_fault_fires(&f, REFIT_FAULT_PHASE_TRANSFER, 2, 3, 11));
  assert_false(refit_fault_fires(&f, REFIT_FAULT_PHASE_TRANSFER, 2, 2, 11));
  assert_false(refit_fault_fires(&f, REFIT_FAULT_PHASE_TRANSFER, 1, 3, 11));
  assert_false(refit_fault_fires(&f, REFIT_FAULT_PHASE_COMMIT, 2, 3, 11));
  f.enabled = 0;
  assert_false(refit_fault_fires(&f, REFIT_FAULT_PHASE_TRANSFER, 2, 3, 11));
  f.enabled = 1;
  f.refit = 0;
  for (uint64_t a = 1; a <= 5; a++)
    assert_true(refit_fault_fires(&f, REFIT_FAULT_PHASE_TRANSFER, 2, a, 11));
  /* Open: before any refit, whatever refit and probability say. */
  f.phase = REFIT_FAULT_PHASE_OPEN;
  f.refit = 4;
  f.probability = 1e-9;
  assert_true(refit_fault_fires(&f, REFIT_FAULT_PHASE_OPEN, 2, 0, 11));
  assert_false(refit_fault_fires(&f, REFIT_FAULT_PHASE_OPEN, 3, 0, 11));
  /* Probability one half over 400 refits: some fire, some do not, the same
   * ones on a second pass; another seed draws other ones. */
  f.phase = REFIT_FAULT_PHASE_COMMIT;
  f.refit = 0;
  f.probability = 0.5;
  int fired = 0, differ = 0;
  for (uint64_t a = 1; a <= 400; a++) {
    const int here = refit_fault_fires(&f, REFIT_FAULT_PHASE_COMMIT, 2, a, 11);
    assert_int_equal(here, refit_fault_fires(&f, REFIT_FAULT_PHASE_COMMIT, 2, a, 11));
    fired += here;
    differ += here != refit_fault_fires(&f, REFIT_FAULT_PHASE_COMMIT, 2, a, 12);
  }
  assert_in_range(fired, 140, 260);
  assert_true(differ > 0);
}

/* The bucket a transfer or quantize fault fires at: the fraction `at` of the
 * buckets, the last one for at = 1. */
static void test_fault_bucket(void **state) {
  (void)state;
  refit_fault_t f = {.enabled = 1, .at = 0};
  assert_int_equal(refit_fault_bucket(&f, 10), 0);
  f.at = 0.5;
  assert_int_equal(refit_fault_bucket(&f, 10), 5);
  assert_int_equal(refit_fault_bucket(&f, 1), 0);
  f.at = 1;
  assert_int_equal(refit_fault_bucket(&f, 10), 9);
}

/* The actions every phase shares: error and stall return their errors, naming
 * the place and the rank; the data faults are the caller's (REFIT_OK). */
static void test_fault_act(void **state) {
  (void)state;
  refit_fault_t f = {.enabled = 1, .action = REFIT_FAULT_ERROR};
  assert_int_equal(refit_fault_act(&f, 3, 1, "commit"), REFIT_ERR_INTERNAL);
  assert_non_null(strstr(refit_last_error(), "injected error at commit on rank 3"));
  f.action = REFIT_FAULT_STALL;
  assert_int_equal(refit_fault_act(&f, 1, 0.02, "transfer"), REFIT_ERR_TIMEOUT);
  assert_non_null(strstr(refit_last_error(), "rank 1 stalled at transfer"));
  const int data[] = {REFIT_FAULT_BITFLIP, REFIT_FAULT_TRUNCATE, REFIT_FAULT_DROP,
                      REFIT_FAULT_DUPLICATE, REFIT_FAULT_STALE};
  for (size_t i = 0; i < sizeof(data) / sizeof(data[0]); i++) {
    f.action = data[i];
    assert_int_equal(refit_fault_act(&f, 0, 1, "transfer"), REFIT_OK);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fault_parse_full),
      cmocka_unit_test(test_fault_parse_defaults),
      cmocka_unit_test(test_fault_parse_bounds),
      cmocka_unit_test(test_fault_parse_rules),
      cmocka_unit_test(test_fault_parse_syntax),
      cmocka_unit_test(test_fault_select),
      cmocka_unit_test(test_fault_fires),
      cmocka_unit_test(test_fault_bucket),
      cmocka_unit_test(test_fault_act),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
