/*
 * NCCL groups for the per-pair transport (pair_groups.h).
 */
#include "transport/pair_groups.h"

#include <stdlib.h>
#include <string.h>

static int refit_pair_groups_cmp(const void *a, const void *b) {
  const int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

refit_status_t refit_pair_groups(const int *pairs, int np, int n, const int *node_of,
                                 const int *gpu_of, int keyed, int *ngroups_out,
                                 int **begin_out, int **ranks_out) {
  refit_status_t st = REFIT_OK;
  int *slot = calloc((size_t)n, sizeof(int));
  int *key = malloc((size_t)(np ? np : 1) * 4 * sizeof(int));
  int *group_of = malloc((size_t)(np ? np : 1) * sizeof(int));
  int *begin = NULL, *ranks = NULL, ngroups = 0;
  if (slot == NULL || key == NULL || group_of == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "ipc+nccl transport: groups of %d pairs", np);
    goto out;
  }
  /* Slot: the rank's place among the ranks of its GPU. */
  for (int r = 0; r < n; r++)
    for (int q = 0; q < r; q++)
      slot[r] += gpu_of[q] == gpu_of[r];
  /* Key of a pair: its two (node, slot), the smaller first, so that both
   * directions of a pair share the group. */
  for (int i = 0; i < np; i++) {
    const int s = pairs[2 * i], d = pairs[2 * i + 1];
    group_of[i] = -1;
    if (node_of[s] == node_of[d])
      continue;
    const int lo = node_of[s] < node_of[d] ? s : d, hi = lo == s ? d : s;
    const int k[4] = {keyed ? node_of[lo] : 0, keyed ? slot[lo] : 0,
                      keyed ? node_of[hi] : 0, keyed ? slot[hi] : 0};
    int g = 0;
    while (g < ngroups && memcmp(&key[4 * g], k, sizeof(k)) != 0)
      g++;
    if (g == ngroups)
      memcpy(&key[4 * ngroups++], k, sizeof(k));
    group_of[i] = g;
  }
  /* Members: the ranks of the pairs of each group, ascending, once each. */
  begin = calloc((size_t)ngroups + 1, sizeof(int));
  ranks = malloc((size_t)(np ? 2 * np : 1) * sizeof(int));
  if (begin == NULL || ranks == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "ipc+nccl transport: %d groups", ngroups);
    goto out;
  }
  int used = 0;
  for (int g = 0; g < ngroups; g++) {
    begin[g] = used;
    for (int i = 0; i < np; i++)
      if (group_of[i] == g) {
        ranks[used++] = pairs[2 * i];
        ranks[used++] = pairs[2 * i + 1];
      }
    qsort(ranks + begin[g], (size_t)(used - begin[g]), sizeof(int),
          refit_pair_groups_cmp);
    int w = begin[g];
    for (int i = begin[g]; i < used; i++)
      if (i == begin[g] || ranks[i] != ranks[w - 1])
        ranks[w++] = ranks[i];
    used = w;
    for (int i = begin[g]; i < used; i++)
      for (int j = begin[g]; j < i; j++)
        if (gpu_of[ranks[i]] == gpu_of[ranks[j]]) {
          st = REFIT_ERR(REFIT_ERR_INTERNAL,
                         "ipc+nccl transport: NCCL group %d would hold ranks %d "
                         "and %d of one GPU",
                         g, ranks[j], ranks[i]);
          goto out;
        }
  }
  begin[ngroups] = used;
  *ngroups_out = ngroups;
  *begin_out = begin;
  *ranks_out = ranks;
  begin = ranks = NULL;
out:
  free(slot);
  free(key);
  free(group_of);
  free(begin);
  free(ranks);
  return st;
}
