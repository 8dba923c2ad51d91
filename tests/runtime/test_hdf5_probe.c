/*
 * The HDF5 source's probe (a child process checks the file first) under an
 * application that reaps its own children (issue 37, defect 10): with
 * SIGCHLD set to SIG_IGN (the kernel reaps every child) or a SIGCHLD handler
 * that reaps with waitpid(-1), the probe's own waitpid fails with ECHILD. A
 * good checkpoint must still open and read, and a damaged one must still be
 * refused by its checks' message, never "waitpid: No child processes".
 */
#include "source/checkpoint.h"
#include "config/config.h"
#include "core/error.h"
#include "reshard/catalog.h"
#include "source/source.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

static const char tiny[] = "model: {family: qwen3, hidden_size: 32, num_layers: 1,\n"
                           "  num_attention_heads: 2, num_kv_heads: 1, head_dim: 16,\n"
                           "  vocab_size: 64, intermediate_size: 64}\n"
                           "trainer: {tp: 1}\n"
                           "generator: {tp: 1}\n"
                           "source: {kind: hdf5, path: ckpt.h5}\n";

static refit_config_t cfg;
static refit_catalog_t *cat;
static char dir[] = "/tmp/refit-h5-probe-XXXXXX";
static char good[128], damaged[128];

static int setup(void **state) {
  (void)state;
  char *errors = NULL;
  if (refit_config_parse(tiny, sizeof(tiny) - 1, "tiny.yaml", 0, &cfg, &errors) !=
          REFIT_OK ||
      refit_catalog_create(&cfg.model, &cfg.trainer, &cfg.generator, &cat) != REFIT_OK ||
      mkdtemp(dir) == NULL) {
    fprintf(stderr, "setup: %s\n", errors ? errors : refit_last_error());
    return -1;
  }
  snprintf(good, sizeof(good), "%s/good.h5", dir);
  snprintf(damaged, sizeof(damaged), "%s/damaged.h5", dir);
  const refit_checkpoint_options_t opt = {.format = REFIT_CHECKPOINT_HDF5,
                                          .dtype = REFIT_CHECKPOINT_BF16,
                                          .version = 1,
                                          .shards = 1};
  refit_checkpoint_info_t info;
  if (refit_checkpoint_write_config(&cfg, good, &opt, &info) != REFIT_OK) {
    fprintf(stderr, "setup: %s\n", refit_last_error());
    return -1;
  }
  /* The damaged copy: the good file cut to its first half. */
  FILE *in = fopen(good, "rb"), *out = fopen(damaged, "wb");
  if (in == NULL || out == NULL)
    return -1;
  fseek(in, 0, SEEK_END);
  const long half = ftell(in) / 2;
  fseek(in, 0, SEEK_SET);
  for (long i = 0; i < half; i++)
    fputc(fgetc(in), out);
  fclose(in);
  fclose(out);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  signal(SIGCHLD, SIG_DFL);
  unlink(good);
  unlink(damaged);
  rmdir(dir);
  refit_catalog_destroy(cat);
  return 0;
}

/* The good checkpoint opens, and every tensor reads. */
static void expect_opens(void) {
  snprintf(cfg.source.path, sizeof(cfg.source.path), "%s", good);
  refit_source_t src = {0};
  const refit_status_t st = refit_source_open(&cfg, cat, &src);
  if (st != REFIT_OK)
    fail_msg("good checkpoint refused: %s", refit_last_error());
  for (int64_t i = 0; i < cat->nhf; i++) {
    const refit_src_tensor_t *t = &cat->hf[i];
    uint16_t *buf = malloc((size_t)(t->rows * t->cols) * sizeof(uint16_t));
    assert_non_null(buf);
    assert_int_equal(src.ops->read(src.ctx, t, 1, 0, 0, t->rows, t->cols, buf), REFIT_OK);
    free(buf);
  }
  refit_source_close(&src);
}

/* The damaged checkpoint is refused by the probe's checks, naming the file. */
static void expect_refused(void) {
  snprintf(cfg.source.path, sizeof(cfg.source.path), "%s", damaged);
  refit_source_t src = {0};
  const refit_status_t st = refit_source_open(&cfg, cat, &src);
  assert_int_not_equal(st, REFIT_OK);
  assert_int_not_equal(st, REFIT_ERR_SYSTEM);
  if (strstr(refit_last_error(), damaged) == NULL ||
      strstr(refit_last_error(), "waitpid") != NULL)
    fail_msg("damaged checkpoint: want a refusal naming %s, got '%s'", damaged,
             refit_last_error());
}

static void test_default_sigchld(void **state) {
  (void)state;
  signal(SIGCHLD, SIG_DFL);
  expect_opens();
  expect_refused();
}

static void test_sigchld_ignored(void **state) {
  (void)state;
  signal(SIGCHLD, SIG_IGN); /* the kernel reaps every child at once */
  expect_opens();
  expect_refused();
  signal(SIGCHLD, SIG_DFL);
}

static void reap_all(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

static void test_sigchld_handler_reaps(void **state) {
  (void)state;
  struct sigaction sa = {.sa_handler = reap_all, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGCHLD, &sa, NULL);
  expect_opens();
  expect_refused();
  signal(SIGCHLD, SIG_DFL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_default_sigchld),
      cmocka_unit_test(test_sigchld_ignored),
      cmocka_unit_test(test_sigchld_handler_reaps),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
