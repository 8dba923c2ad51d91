/*
 * The per-pair choice of transport (runtime/src/transport/transport.h): a lookup over
 * refit_transports[] in preference order, each transport answering
 * can_connect() from a pair's locality facts. Device memory: CUDA IPC within
 * a node (also two ranks of one GPU), NCCL between nodes, nothing without
 * the GPU transports compiled in; host memory: MPI for every pair (UCX,
 * later in the table, is never the first). The candidates the per-pair
 * transport opens are the transports the lookup can give, in table order.
 */
#include "transport/transport.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

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
  assert_non_null(ops[1]->create_pairs); /* NCCL builds communicators per pair */
  assert_null(ops[0]->create_pairs);     /* IPC reaches every rank once open */
#else
  assert_int_equal(ndevice, 0);
#endif
  assert_int_equal(refit_transport_pair_candidates(REFIT_MEMORY_HOST, ops), 1);
  assert_string_equal(ops[0]->name, "mpi");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_device_pairs),
      cmocka_unit_test(test_host_pairs),
      cmocka_unit_test(test_candidates),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
