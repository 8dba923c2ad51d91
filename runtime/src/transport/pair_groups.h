/*
 * Which NCCL communicators the per-pair transport (transport_pairs.c) builds
 * for the pairs of ranks on different nodes. Plain C, no CUDA, so that the
 * rules are tested on any machine (tests/runtime/test_pair_groups.c).
 *
 *   unkeyed (no two ranks of the job share a GPU): one group, every rank of
 *           a pair that crosses nodes.
 *   keyed   (some do): a rank's slot is its place among the ranks of its GPU
 *           (by rank); a pair crossing nodes belongs to the group
 *           {(node, slot) of one end, (node, slot) of the other}, smaller
 *           first, which holds the ends of every pair with that key.
 * Either way every pair that crosses nodes shares exactly one group (both
 * directions the same one), and no group holds two ranks of one GPU (checked:
 * REFIT_ERR_INTERNAL names them). Groups are numbered in the order of the
 * pairs' first appearance and list their ranks ascending, so every rank
 * computes the same groups from the same pairs.
 */
#ifndef REFIT_PAIR_GROUPS_H
#define REFIT_PAIR_GROUPS_H

#include "core/error.h"

/* pairs[2i] sends to pairs[2i+1] (ranks 0 .. n-1), np pairs; node_of and
 * gpu_of [n]. On success *begin_out [*ngroups_out + 1] and *ranks_out hold
 * group k as ranks[begin[k] .. begin[k+1]) (caller frees both). */
refit_status_t refit_pair_groups(const int *pairs, int np, int n, const int *node_of,
                                 const int *gpu_of, int keyed, int *ngroups_out,
                                 int **begin_out, int **ranks_out);

#endif /* REFIT_PAIR_GROUPS_H */
