/*
 * The plan's messages (plan_internal.h): the scheduled chunks sorted by
 * (bucket, generator, trainer), one message per (trainer, generator) pair
 * and bucket, staging offsets back to back, and the plan's hash.
 */
#include "reshard/plan_internal.h"

#include "core/error.h"
#include "core/hash.h"

#include <stdlib.h>

static int refit_chunk_cmp(const void *a, const void *b) {
  const refit_chunk_t *x = a, *y = b;
  if (x->bucket != y->bucket)
    return x->bucket < y->bucket ? -1 : 1;
  if (x->dst_rank != y->dst_rank)
    return x->dst_rank < y->dst_rank ? -1 : 1;
  if (x->src_rank != y->src_rank)
    return x->src_rank < y->src_rank ? -1 : 1;
  /* Same bucket, pair: keep generation order (offset holds it for now). */
  return x->offset < y->offset ? -1 : (x->offset > y->offset);
}

/* Assign staging offsets, form messages, and hash the result. */
refit_status_t refit_planner_finish(refit_planner_t *p) {
  refit_plan_t *plan = p->plan;
  int64_t nb = 0;
  uint64_t h = REFIT_HASH_INIT;

  /* Sort by (bucket, dst, src, generation order): buckets by counting,
   * stable; the schedule emits each generator rank's chunks of one bucket
   * by trainer rank, so only a (bucket, dst) group that is not (the
   * baseline's) needs a sort of its own. */
  int32_t maxb = -1;
  for (int64_t i = 0; i < plan->nchunks; i++) {
    plan->chunks[i].offset = i;
    if (plan->chunks[i].bucket > maxb)
      maxb = plan->chunks[i].bucket;
  }
  plan->nbuckets = maxb + 1;
  {
    /* Counting sort on places, then the chunks moved there in place (cycle
     * by cycle): no second copy of the largest table. */
    int64_t *at = calloc((size_t)plan->nbuckets + 1, sizeof(int64_t));
    int64_t *dest = malloc((size_t)(plan->nchunks ? plan->nchunks : 1) * sizeof(int64_t));
    if (at == NULL || dest == NULL) {
      free(at);
      free(dest);
      return REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: sorting %lld chunks",
                       (long long)plan->nchunks);
    }
    for (int64_t i = 0; i < plan->nchunks; i++)
      at[plan->chunks[i].bucket + 1]++;
    for (int32_t b = 0; b < plan->nbuckets; b++)
      at[b + 1] += at[b];
    for (int64_t i = 0; i < plan->nchunks; i++)
      dest[i] = at[plan->chunks[i].bucket]++;
    for (int64_t i = 0; i < plan->nchunks; i++)
      while (dest[i] != i) {
        const int64_t d = dest[i];
        const refit_chunk_t c = plan->chunks[d];
        plan->chunks[d] = plan->chunks[i];
        plan->chunks[i] = c;
        dest[i] = dest[d];
        dest[d] = d;
      }
    free(at);
    free(dest);
    for (int64_t i = 0, j; i < plan->nchunks; i = j) {
      int ordered = 1;
      for (j = i + 1;
           j < plan->nchunks && plan->chunks[j].bucket == plan->chunks[i].bucket &&
           plan->chunks[j].dst_rank == plan->chunks[i].dst_rank;
           j++)
        ordered &= refit_chunk_cmp(&plan->chunks[j - 1], &plan->chunks[j]) < 0;
      if (!ordered)
        qsort(plan->chunks + i, (size_t)(j - i), sizeof(*plan->chunks), refit_chunk_cmp);
    }
  }

  /* Messages are at most one per chunk; shrink afterwards. */
  plan->msgs = malloc((size_t)(plan->nchunks ? plan->nchunks : 1) * sizeof(*plan->msgs));
  plan->bucket_msg_begin = calloc((size_t)plan->nbuckets + 1, sizeof(int64_t));
  if (plan->msgs == NULL || plan->bucket_msg_begin == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: message table");

  int64_t used = 0;
  for (int64_t i = 0; i < plan->nchunks; i++) {
    refit_chunk_t *c = &plan->chunks[i];
    refit_msg_t *m = plan->nmsgs ? &plan->msgs[plan->nmsgs - 1] : NULL;
    int new_dst = m == NULL || m->bucket != c->bucket || m->dst_rank != c->dst_rank;
    if (new_dst)
      used = 0;
    if (new_dst || m->src_rank != c->src_rank) {
      m = &plan->msgs[plan->nmsgs++];
      m->src_rank = c->src_rank;
      m->dst_rank = c->dst_rank;
      m->bucket = c->bucket;
      m->offset = used;
      m->bytes = 0;
      m->chunk_begin = i;
      m->chunk_count = 0;
      while (nb <= c->bucket)
        plan->bucket_msg_begin[nb++] = plan->nmsgs - 1;
    }
    c->offset = used;
    int64_t bytes = c->rows * c->row_bytes + p->opt->chunk_trailer;
    used += bytes;
    m->bytes += bytes;
    m->chunk_count++;
    if (used > plan->staging[c->dst_rank])
      plan->staging[c->dst_rank] = used;
    /* The chunk's fields folded into one word (odd multipliers, so every
     * field changes it), then FNV: a byte-wise FNV of every field cost a
     * third of the planning time at millions of chunks. */
    uint64_t v = ((uint64_t)(uint32_t)c->src_rank << 32) | (uint32_t)c->dst_rank;
    v = v * UINT64_C(0x9e3779b97f4a7c15) ^
        (((uint64_t)(uint32_t)c->src_tensor << 32) | (uint32_t)c->dst_tensor);
    v = v * UINT64_C(0xbf58476d1ce4e5b9) ^
        ((uint64_t)c->src_row ^ ((uint64_t)c->src_col << 32));
    v = v * UINT64_C(0x94d049bb133111eb) ^
        ((uint64_t)c->dst_row ^ ((uint64_t)c->dst_col << 32));
    v = v * UINT64_C(0x9e3779b97f4a7c15) ^
        ((uint64_t)c->rows ^ ((uint64_t)c->cols << 32));
    v = v * UINT64_C(0xbf58476d1ce4e5b9) ^
        ((uint64_t)c->offset ^ ((uint64_t)c->bucket << 48));
    h = refit_hash_u64(h, v);
  }
  while (nb <= plan->nbuckets)
    plan->bucket_msg_begin[nb++] = plan->nmsgs;
  if (plan->nmsgs > 0) {
    refit_msg_t *shrunk = realloc(plan->msgs, (size_t)plan->nmsgs * sizeof(*plan->msgs));
    if (shrunk != NULL)
      plan->msgs = shrunk;
  }
  h = refit_hash_u64(h, p->opt->bucket_bytes);
  h = refit_hash_u64(h, (uint64_t)p->opt->wire);
  h = refit_hash_u64(h, (uint64_t)p->opt->chunk_trailer);
  h = refit_hash_u64(h, (uint64_t)p->opt->per_tensor_buckets);
  h = refit_hash_u64(h, p->opt->arena_bytes);
  if (plan->block_wire != NULL) { /* only under REFIT_WIRE_FP8_BLOCK */
    const int64_t ngen = p->cat->gen_begin[p->cat->generator.tp];
    for (int64_t i = 0; i < ngen; i++)
      h = refit_hash_u64(h, plan->block_wire[i]);
  }
  plan->hash = h;
  return REFIT_OK;
}

int refit_plan_chunk_quantized(const refit_plan_t *plan, const refit_catalog_t *cat,
                               const refit_chunk_t *ch) {
  return (plan->options.wire == REFIT_WIRE_MXFP8 &&
          cat->gen[ch->dst_tensor].quantized == REFIT_QUANT_MXFP8) ||
         refit_plan_block_prequantized(plan, ch->dst_tensor);
}

int refit_plan_msgs_same(const refit_plan_t *plan, const refit_catalog_t *cat,
                         const refit_msg_t *a, const refit_msg_t *b) {
  if (a->bytes != b->bytes || a->chunk_count != b->chunk_count)
    return 0;
  for (int64_t i = 0; i < a->chunk_count; i++) {
    const refit_chunk_t *x = &plan->chunks[a->chunk_begin + i];
    const refit_chunk_t *y = &plan->chunks[b->chunk_begin + i];
    if (x->src_tensor != y->src_tensor || x->src_row != y->src_row ||
        x->src_col != y->src_col || x->rows != y->rows || x->cols != y->cols ||
        x->row_bytes != y->row_bytes || x->offset - a->offset != y->offset - b->offset ||
        refit_plan_chunk_quantized(plan, cat, x) !=
            refit_plan_chunk_quantized(plan, cat, y))
      return 0;
  }
  return 1;
}

int64_t refit_plan_packed_bytes(const refit_plan_t *plan, const refit_catalog_t *cat,
                                int32_t trainer) {
  int64_t bytes = 0;
  for (int32_t b = 0; b < plan->nbuckets; b++)
    for (int64_t i = plan->bucket_msg_begin[b]; i < plan->bucket_msg_begin[b + 1]; i++) {
      const refit_msg_t *m = &plan->msgs[i];
      int same = 0;
      if (m->src_rank != trainer)
        continue;
      for (int64_t j = plan->bucket_msg_begin[b]; j < i && !same; j++)
        same = plan->msgs[j].src_rank == trainer &&
               refit_plan_msgs_same(plan, cat, &plan->msgs[j], m);
      bytes += same ? 0 : m->bytes;
    }
  return bytes;
}
