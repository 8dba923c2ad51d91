/*
 * The per-pair transport's NCCL groups (runtime/src/transport/pair_groups.h) over
 * random jobs: 1 to 4 nodes of 1 to 4 GPUs with 1 to 3 ranks per GPU, ranks
 * placed on GPUs in random order, and a random set of (sender, receiver)
 * pairs (trainer -> generator sides, or any direction). Checked against the
 * rules, not against the builder's own key: every pair across nodes shares
 * exactly one group with both directions in it, no group holds two ranks of
 * one GPU, every group is ascending without repeats and only holds ranks of
 * pairs across nodes; without shared GPUs there is at most one group. Also
 * the colocated layout across two nodes in full, and an error-free empty
 * list.
 */
#include "transport/pair_groups.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h> /* after setjmp.h, stdarg.h, stddef.h */

static uint64_t rng_state;
static int rnd(int n) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (int)((rng_state >> 33) % (uint64_t)n);
}

/* Groups of the list that hold both a and b. */
static int groups_with(const int *begin, const int *ranks, int ngroups, int a, int b) {
  int n = 0;
  for (int g = 0; g < ngroups; g++) {
    int has_a = 0, has_b = 0;
    for (int i = begin[g]; i < begin[g + 1]; i++) {
      has_a |= ranks[i] == a;
      has_b |= ranks[i] == b;
    }
    n += has_a && has_b;
  }
  return n;
}

static void check_rules(const int *pairs, int np, int n, const int *node_of,
                        const int *gpu_of, int keyed) {
  int ngroups = -1, *begin = NULL, *ranks = NULL;
  assert_int_equal(
      refit_pair_groups(pairs, np, n, node_of, gpu_of, keyed, &ngroups, &begin, &ranks),
      REFIT_OK);
  assert_true(ngroups >= 0);
  if (!keyed)
    assert_true(ngroups <= 1);
  int crossing = 0;
  for (int i = 0; i < np; i++) {
    const int s = pairs[2 * i], d = pairs[2 * i + 1];
    if (node_of[s] == node_of[d])
      continue;
    crossing++;
    assert_int_equal(groups_with(begin, ranks, ngroups, s, d), 1);
  }
  if (crossing == 0)
    assert_int_equal(ngroups, 0);
  for (int g = 0; g < ngroups; g++) {
    assert_true(begin[g + 1] - begin[g] >= 2);
    for (int i = begin[g]; i < begin[g + 1]; i++) {
      if (i > begin[g])
        assert_true(ranks[i] > ranks[i - 1]);
      for (int j = begin[g]; j < i; j++)
        assert_int_not_equal(gpu_of[ranks[i]], gpu_of[ranks[j]]);
      /* Only ranks with a pair across nodes. */
      int crosses = 0;
      for (int k = 0; k < np && !crosses; k++)
        crosses = (pairs[2 * k] == ranks[i] || pairs[2 * k + 1] == ranks[i]) &&
                  node_of[pairs[2 * k]] != node_of[pairs[2 * k + 1]];
      assert_true(crosses);
    }
  }
  free(begin);
  free(ranks);
}

static void test_random_jobs(void **state) {
  (void)state;
  rng_state = 0x9a17u;
  for (int trial = 0; trial < 400; trial++) {
    const int nodes = 1 + rnd(4), gpus = 1 + rnd(4);
    const int per_gpu = trial % 2 ? 1 : 1 + rnd(3);
    const int n = nodes * gpus * per_gpu;
    int *node_of = malloc((size_t)n * sizeof(int)),
        *gpu_of = malloc((size_t)n * sizeof(int));
    int *slots = malloc((size_t)n * sizeof(int));
    assert_non_null(node_of);
    assert_non_null(gpu_of);
    assert_non_null(slots);
    /* Every (GPU, place) once, shuffled over the ranks. */
    for (int k = 0; k < n; k++)
      slots[k] = k;
    for (int k = n - 1; k > 0; k--) {
      const int j = rnd(k + 1), t = slots[k];
      slots[k] = slots[j];
      slots[j] = t;
    }
    for (int r = 0; r < n; r++) {
      gpu_of[r] = slots[r] / per_gpu;
      node_of[r] = gpu_of[r] / gpus;
    }
    /* Sides: the first half of the ranks send to the rest, or any to any. */
    const int any = rnd(2);
    int *pairs = malloc((size_t)(n * n + 1) * 2 * sizeof(int)), np = 0;
    assert_non_null(pairs);
    for (int s = 0; s < n; s++)
      for (int d = 0; d < n; d++) {
        const int allowed = any ? s != d : (s < n / 2 && d >= n / 2);
        if (allowed && rnd(3) != 0) {
          pairs[2 * np] = s;
          pairs[2 * np + 1] = d;
          np++;
        }
      }
    check_rules(pairs, np, n, node_of, gpu_of, per_gpu > 1);
    free(pairs);
    free(node_of);
    free(gpu_of);
    free(slots);
  }
}

/* Two nodes of 4 GPUs, a trainer and a generator rank on each GPU (trainers
 * 0..7, generators 8..15), every trainer sending to every generator: the
 * pairs across nodes need the two directions' groups and no more. */
static void test_colocated_two_nodes(void **state) {
  (void)state;
  enum { N = 16 };
  int node_of[N], gpu_of[N], pairs[2 * 64], np = 0;
  for (int r = 0; r < N; r++) {
    gpu_of[r] = r % 8;
    node_of[r] = gpu_of[r] / 4;
  }
  for (int t = 0; t < 8; t++)
    for (int g = 8; g < 16; g++) {
      pairs[2 * np] = t;
      pairs[2 * np + 1] = g;
      np++;
    }
  check_rules(pairs, np, N, node_of, gpu_of, 1);
  int ngroups = 0, *begin = NULL, *ranks = NULL;
  assert_int_equal(
      refit_pair_groups(pairs, np, N, node_of, gpu_of, 1, &ngroups, &begin, &ranks),
      REFIT_OK);
  /* Trainers of node 0 with generators of node 1, and the reverse. */
  assert_int_equal(ngroups, 2);
  assert_int_equal(begin[1] - begin[0], 8);
  assert_int_equal(begin[2] - begin[1], 8);
  free(begin);
  free(ranks);
}

static void test_no_pairs(void **state) {
  (void)state;
  const int node_of[2] = {0, 1}, gpu_of[2] = {0, 1};
  int ngroups = -1, *begin = NULL, *ranks = NULL;
  assert_int_equal(
      refit_pair_groups(NULL, 0, 2, node_of, gpu_of, 0, &ngroups, &begin, &ranks),
      REFIT_OK);
  assert_int_equal(ngroups, 0);
  free(begin);
  free(ranks);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_jobs),
      cmocka_unit_test(test_colocated_two_nodes),
      cmocka_unit_test(test_no_pairs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
