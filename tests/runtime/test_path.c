/*
 * The refit paths (runtime/src/session/path.h): one table each, every
 * function set, and the session's choice: zero copy where it was decided,
 * delta where refit.delta is not off, staged otherwise.
 */
#include "session/path.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

#include <string.h>

static void assert_full(const refit_path_ops_t *p) {
  const void *fns[] = {
      (const void *)p->trainer_tables, (const void *)p->repoint,
      (const void *)p->buffer_bytes,   (const void *)p->msg,
      (const void *)p->prepare,        (const void *)p->delta_ready,
      (const void *)p->begin,          (const void *)p->pack_target,
      (const void *)p->seal,           (const void *)p->packed,
      (const void *)p->recvs,          (const void *)p->land,
      (const void *)p->commit,
  };
  /* Every member of the table is listed above: a function added to the
   * table without a line here changes its size. */
  assert_int_equal(sizeof(*p), sizeof(const char *) + sizeof(fns));
  for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++)
    if (fns[i] == NULL)
      fail_msg("path %s: function %zu of its table is NULL", p->name, i);
}

static void test_full_tables(void **state) {
  (void)state;
  assert_full(&refit_path_staged);
  assert_full(&refit_path_delta);
  assert_full(&refit_path_zero_copy);
}

static const char *chosen(int zero_copy, refit_delta_mode_t delta) {
  refit_session_t s;
  memset(&s, 0, sizeof(s));
  s.zero_copy = zero_copy;
  s.cfg.refit.delta = delta;
  refit_session_choose_path(&s);
  return s.path->name;
}

static void test_choice(void **state) {
  (void)state;
  assert_string_equal(chosen(0, REFIT_DELTA_MODE_OFF), "staged");
  assert_string_equal(chosen(0, REFIT_DELTA_MODE_AUTO), "delta");
  assert_string_equal(chosen(0, REFIT_DELTA_MODE_ON), "delta");
  assert_string_equal(chosen(1, REFIT_DELTA_MODE_OFF), "zero copy");
  assert_string_equal(chosen(1, REFIT_DELTA_MODE_AUTO), "zero copy");
}

/* The paths that send what they pack: a generator receives a message of
 * exactly the posted length, staged and zero copy alike. */
static void test_fixed_receives(void **state) {
  (void)state;
  size_t got = 7;
  refit_xfer_t x[2] = {{.got = &got}, {.got = &got}};
  refit_session_t s;
  memset(&s, 0, sizeof(s));
  refit_path_staged.recvs(&s, 0, x, 2);
  assert_null(x[0].got);
  assert_null(x[1].got);
  assert_int_equal(refit_path_zero_copy.delta_ready(&s), 0);
  assert_int_equal(refit_path_staged.delta_ready(&s), 0);
  /* delta without its state (delta off on this rank, or before the first
   * begin) cannot take a delta refit either */
  assert_int_equal(refit_path_delta.delta_ready(&s), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_full_tables),
      cmocka_unit_test(test_choice),
      cmocka_unit_test(test_fixed_receives),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
