/*
 * The public API's config and checkpoint calls (refit_config_open,
 * refit_checkpoint_write in refit/refit.h), through librefit.so and its
 * public header alone: a config read without MPI, the arguments refused
 * with REFIT_ERR_INVALID_ARGUMENT before anything is written, a config
 * that does not exist refused, and a safetensors checkpoint of the demo
 * config written with the figures it reports (every tensor of the model, two
 * bytes each element in BF16, the config's seed) and no PATH.tmp left.
 */
#include "refit/refit.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

static const char *const demo = REFIT_CONFIGS_DIR "/demo.yaml";

static void test_config_refused(void **state) {
  (void)state;
  refit_config_h c = NULL;
  assert_int_equal(refit_config_open(NULL, &c), REFIT_ERR_INVALID_ARGUMENT);
  assert_int_not_equal(refit_config_open("/nonexistent/refit.yaml", &c), REFIT_OK);
  assert_null(c);
  refit_config_close(NULL);
}

static void test_arguments_refused(void **state) {
  (void)state;
  refit_config_h c = NULL;
  assert_int_equal(refit_config_open(demo, &c), REFIT_OK);
  refit_checkpoint_info_t info = {.tensors = -1};
  refit_checkpoint_options_t opt = {.format = REFIT_CHECKPOINT_HDF5, .shards = 2};
  assert_int_equal(refit_checkpoint_write(c, "unused.h5", &opt, &info),
                   REFIT_ERR_INVALID_ARGUMENT);
  opt.shards = 0;
  assert_int_equal(refit_checkpoint_write(c, "unused.h5", &opt, &info),
                   REFIT_ERR_INVALID_ARGUMENT);
  opt.shards = 1;
  opt.dtype = (refit_checkpoint_dtype_t)3;
  assert_int_equal(refit_checkpoint_write(c, "unused.h5", &opt, &info),
                   REFIT_ERR_INVALID_ARGUMENT);
  opt.dtype = REFIT_CHECKPOINT_BF16;
  assert_int_equal(refit_checkpoint_write(NULL, "unused.h5", &opt, &info),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(refit_checkpoint_write(c, NULL, &opt, &info),
                   REFIT_ERR_INVALID_ARGUMENT);
  assert_int_equal(info.tensors, -1); /* set only on success */
  struct stat sb;
  assert_int_not_equal(stat("unused.h5", &sb), 0);
  refit_config_close(c);
}

static void test_safetensors_written(void **state) {
  (void)state;
  char dir[] = "/tmp/refit-ckpt-api-XXXXXX", path[64], tmp[80];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof(path), "%s/demo.safetensors", dir);
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  refit_config_h c = NULL;
  assert_int_equal(refit_config_open(demo, &c), REFIT_OK);
  const refit_checkpoint_options_t opt = {.format = REFIT_CHECKPOINT_SAFETENSORS,
                                          .dtype = REFIT_CHECKPOINT_BF16,
                                          .version = 2,
                                          .shards = 1};
  refit_checkpoint_info_t info;
  assert_int_equal(refit_checkpoint_write(c, path, &opt, &info), REFIT_OK);
  refit_config_close(c);
  assert_int_equal(info.tensors, 135); /* the demo model's */
  assert_string_equal(info.dtype_name, "BF16");
  assert_int_equal(info.seed, 1234);
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  assert_true((uint64_t)sb.st_size > info.bytes); /* header, then the data */
  assert_int_not_equal(stat(tmp, &sb), 0);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_refused),
      cmocka_unit_test(test_arguments_refused),
      cmocka_unit_test(test_safetensors_written),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
