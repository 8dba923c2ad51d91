/*
 * Inside the planner (plan.h): the state plan.c, plan_schedule.c,
 * plan_messages.c and plan_arena.c share while a plan is made. plan.c cuts
 * every generator rank's segments into pieces along the trainer shards and
 * picks each piece's holder (balancing trainer egress); plan_schedule.c
 * cuts the pieces into the chunks of buckets; plan_messages.c sorts the
 * chunks into messages and hashes the plan; plan_arena.c lays out the
 * assembly arena (block FP8, NVFP4) the schedule is bounded by.
 */
#ifndef REFIT_RESHARD_PLAN_INTERNAL_H
#define REFIT_RESHARD_PLAN_INTERNAL_H

#include "reshard/plan.h"

#include <stdint.h>

/* Bounds that keep a plan in memory and its counts in their types: a plan
 * beyond them is refused, never attempted. 2^26 chunks are about 7 GB of
 * tables on every rank (today's trillion-parameter layouts need 1.3 M);
 * bucket numbers travel in 32 bits. */
#define REFIT_PLAN_MAX_CHUNKS (INT64_C(1) << 26)
#define REFIT_PLAN_MAX_BUCKETS (1 << 24)

/* A growing array of chunks. */
typedef struct {
  refit_chunk_t *v;
  int64_t n, cap;
} refit_chunk_vec_t;

typedef struct {
  const refit_catalog_t *cat;
  const refit_plan_options_t *opt;
  refit_plan_t *plan;
  /* Pieces: every generator rank's rectangles with their trainer, in the
   * rank's tensor order (bucket unset), rank g's at [piece_begin[g],
   * piece_begin[g + 1]); the schedule cuts them into `out`. */
  refit_chunk_vec_t pieces, out;
  int64_t *piece_begin;
  /* Bucket filling state of the generator rank being placed in tensor
   * order (the per-tensor baseline). */
  int32_t bucket;
  int64_t bucket_used;
  int32_t last_tensor; /* destination tensor of the last chunk placed */
  /* Holder chosen for (source tensor, part), when engines share choices
   * (refit_plan_create says when); -1 until the first choice. */
  int32_t *memo;
  int32_t memo_parts;
  int quantized; /* some runtime tensor assembles in the arena */
} refit_planner_t;

/* Append *c; refuses more than REFIT_PLAN_MAX_CHUNKS. */
refit_status_t refit_chunk_vec_push(refit_chunk_vec_t *vec, const refit_chunk_t *c);

/* Rows a cut of `piece` (an uncut piece of p->pieces) must be a multiple
 * of: 1, or for a tensor the trainer quantizes to block FP8 a block row (or
 * the piece's rows: not cut at all). A piece's remainder needs none. */
int64_t refit_planner_quantum(const refit_planner_t *p, const refit_chunk_t *piece);

/* Cut p->pieces into p->out, bucket by bucket, at the widest spread the
 * arena bound allows (plan->spread, plan->arena). `ntensors`: the most
 * runtime tensors of one generator rank. */
refit_status_t refit_planner_schedule_spread(refit_planner_t *p, int64_t ntensors);

/* Sort plan->chunks into messages, assign staging offsets, fill the
 * message tables and plan->staging, and hash the plan. */
refit_status_t refit_planner_finish(refit_planner_t *p);

/* Sort idx[0 .. n) (chunk indices of one generator rank) into land order. */
void refit_land_order_sort(const refit_chunk_t *chunks, int64_t *idx, int64_t n);

/* The arena walk of refit_plan_assembly over chunks[order[0 .. norder)], the
 * chunks of generator rank gen_rank in land order (tensors the trainer
 * quantizes, block_wire non-zero, land in place: no area). */
refit_status_t refit_arena_walk(const refit_catalog_t *cat, const uint8_t *block_wire,
                                int32_t gen_rank, const refit_chunk_t *chunks,
                                const int64_t *order, int64_t norder, int64_t *offsets,
                                int64_t *bytes);

#endif /* REFIT_RESHARD_PLAN_INTERNAL_H */
