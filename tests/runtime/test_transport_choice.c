/*
 * The per-pair choice of transport (runtime/src/transport/transport.h): a lookup over
 * refit_transports[] in preference order, each transport answering
 * can_connect() from a pair's locality facts. Device memory: CUDA IPC within
 * a node (also two ranks of one GPU), NCCL between nodes, nothing without
 * the GPU transports compiled in; host memory: MPI for every pair (UCX,
 * later in the table, is never the first). The candidates the per-pair
 * transport opens are the transports the lookup can give, in table order.
 * Every table is full: no function left NULL for a caller to test.
 */
#include "transport/transport.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

#include <string.h>

static const char *chosen(int same_node, int same_gpu, refit_memory_t memory) {
  const refit_pair_facts_t f = {same_node, same_gpu, memory};
  const refit_transport_ops_t *ops = refit_transport_for_pair(&f);
  return ops != NULL ? ops->name : "none";
}

static void test_device_pairs(void **state) {
  (void)state;
#ifdef REFIT_HAVE_CUDA
  assert_string_equal(chosen(1, 1, REFIT_MEMORY_DEVICE), "ipc");
  assert_string_equal(chosen(1, 0, REFIT_MEMORY_DEVICE), "ipc");
  assert_string_equal(chosen(0, 0, REFIT_MEMORY_DEVICE), "nccl");
#else
  assert_string_equal(chosen(1, 1, REFIT_MEMORY_DEVICE), "none");
  assert_string_equal(chosen(0, 0, REFIT_MEMORY_DEVICE), "none");
#endif
}

static void test_host_pairs(void **state) {
  (void)state;
  assert_string_equal(chosen(1, 1, REFIT_MEMORY_HOST), "mpi");
  assert_string_equal(chosen(1, 0, REFIT_MEMORY_HOST), "mpi");
  assert_string_equal(chosen(0, 0, REFIT_MEMORY_HOST), "mpi");
}

static void test_candidates(void **state) {
  (void)state;
  const refit_transport_ops_t *ops[REFIT_TRANSPORTS_MAX];
  const int ndevice = refit_transport_pair_candidates(REFIT_MEMORY_DEVICE, ops);
#ifdef REFIT_HAVE_CUDA
  assert_int_equal(ndevice, 2);
  assert_string_equal(ops[0]->name, "ipc");
  assert_string_equal(ops[1]->name, "nccl");
  assert_true(ops[0]->registers_buffers);  /* IPC hands its peers the handles */
  assert_false(ops[1]->registers_buffers); /* NCCL does not */
#else
  assert_int_equal(ndevice, 0);
#endif
  assert_int_equal(refit_transport_pair_candidates(REFIT_MEMORY_HOST, ops), 1);
  assert_string_equal(ops[0]->name, "mpi");
}

/* Every compiled-in transport's table sets every function. */
static void test_full_tables(void **state) {
  (void)state;
  const refit_transport_ops_t *const tables[] = {
      &refit_transport_mpi, &refit_transport_ucx,
#ifdef REFIT_HAVE_CUDA
      &refit_transport_ipc, &refit_transport_nccl, &refit_transport_pairs,
#endif
  };
  for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++) {
    if (refit_transport_check_table(tables[i]) != REFIT_OK)
      fail_msg("%s: %s", tables[i]->name, refit_last_error());
  }
  /* Explicit defaults do what they say. */
  const refit_pair_facts_t f = {1, 1, REFIT_MEMORY_HOST};
  assert_int_equal(refit_transport_never_per_pair(&f), 0);
  assert_int_equal(refit_transport_register_none(NULL, NULL, 0), REFIT_OK);
  void *ctx = NULL;
  assert_int_equal(refit_transport_not_per_pair(NULL, NULL, &ctx), REFIT_ERR_STATE);
  assert_null(ctx);
  assert_false(refit_transport_mpi.registers_buffers);
  assert_false(refit_transport_ucx.registers_buffers);
}

/* A table with holes is refused, naming the transport and every hole. */
static void test_table_with_holes(void **state) {
  (void)state;
  refit_transport_ops_t holes = refit_transport_mpi;
  holes.name = "holey";
  holes.abandon = NULL;
  holes.recover = NULL;
  assert_int_equal(refit_transport_check_table(&holes), REFIT_ERR_STATE);
  const char *msg = refit_last_error();
  assert_non_null(strstr(msg, "holey"));
  assert_non_null(strstr(msg, "abandon, recover"));
  assert_null(strstr(msg, "healthy"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_device_pairs),
      cmocka_unit_test(test_host_pairs),
      cmocka_unit_test(test_candidates),
      cmocka_unit_test(test_full_tables),
      cmocka_unit_test(test_table_with_holes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
