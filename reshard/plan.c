#include "reshard/plan.h"

#include "core/error.h"
#include "core/hash.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  const refit_catalog_t *cat;
  const refit_plan_options_t *opt;
  refit_plan_t *plan;
  int64_t chunk_cap;
  /* Bucket filling state of the generator rank being planned. */
  int32_t bucket;
  int64_t bucket_used;
  int32_t last_tensor; /* destination tensor of the last chunk placed */
  /* Holder chosen for (source tensor, part), when engines share choices
   * (refit_plan_create says when); -1 until the first choice. */
  int32_t *memo;
  int32_t memo_parts;
} refit_planner_t;

int64_t refit_plan_row_bytes(const refit_gen_tensor_t *gen, refit_wire_t wire,
                             int64_t cols) {
  if (wire == REFIT_WIRE_MXFP8 && gen->quantized)
    return cols + cols / 32;
  return cols * 2;
}

static refit_status_t refit_planner_push(refit_planner_t *p,
                                         const refit_chunk_t *c) {
  refit_plan_t *plan = p->plan;
  if (plan->nchunks == p->chunk_cap) {
    int64_t ncap = p->chunk_cap ? p->chunk_cap * 2 : 4096;
    refit_chunk_t *nc = realloc(plan->chunks, (size_t)ncap * sizeof(*nc));
    if (nc == NULL)
      return REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: cannot hold %lld chunks",
                       (long long)ncap);
    plan->chunks = nc;
    p->chunk_cap = ncap;
  }
  plan->chunks[plan->nchunks++] = *c;
  return REFIT_OK;
}

/* Place a rectangle into the current generator rank's buckets, cutting it by
 * rows where the current bucket has less room than the whole rectangle. */
static refit_status_t refit_planner_place(refit_planner_t *p, refit_chunk_t c) {
  const int64_t limit = (int64_t)p->opt->bucket_bytes;
  const int64_t trailer = p->opt->chunk_trailer;
  if (p->opt->per_tensor_buckets && c.dst_tensor != p->last_tensor &&
      p->bucket_used > 0) {
    p->bucket++;
    p->bucket_used = 0;
  }
  p->last_tensor = c.dst_tensor;
  if (c.row_bytes + trailer > limit)
    return REFIT_ERR(
        REFIT_ERR_INVALID_ARGUMENT,
        "refit.bucket_bytes %lld is smaller than one row of %s (%d bytes)",
        (long long)limit, p->cat->gen[c.dst_tensor].name, c.row_bytes);
  while (c.rows > 0) {
    int64_t room = (limit - p->bucket_used - trailer) / c.row_bytes;
    if (room <= 0) {
      p->bucket++;
      p->bucket_used = 0;
      continue;
    }
    refit_chunk_t part = c;
    part.rows = c.rows < room ? c.rows : room;
    part.bucket = p->bucket;
    REFIT_CHECK(refit_planner_push(p, &part));
    p->bucket_used += part.rows * c.row_bytes + trailer;
    c.rows -= part.rows;
    c.src_row += part.rows;
    c.dst_row += part.rows;
  }
  return REFIT_OK;
}

/* Least-loaded holder of part `part` of trainer tensor `src` (`t`), or,
 * with the memo, the holder an earlier engine got for it. */
static int32_t refit_planner_pick(const refit_planner_t *p, int32_t src,
                                  const refit_src_tensor_t *t, int32_t part) {
  int32_t *memo = p->memo != NULL && part < p->memo_parts
                      ? &p->memo[(int64_t)src * p->memo_parts + part]
                      : NULL;
  if (memo != NULL && *memo >= 0)
    return *memo;
  int32_t best = refit_src_holder(p->cat, t, part, 0);
  for (int32_t r = 1; r < t->nreplicas; r++) {
    int32_t h = refit_src_holder(p->cat, t, part, r);
    if (p->plan->egress[h] < p->plan->egress[best])
      best = h;
  }
  if (memo != NULL)
    *memo = best;
  return best;
}

/* Cut a segment along the trainer shard boundaries and place each piece. */
static refit_status_t refit_planner_segment(refit_planner_t *p, int32_t g,
                                            int64_t gen_index,
                                            const refit_segment_t *s) {
  const refit_src_tensor_t *t = &p->cat->src[s->src];
  const refit_gen_tensor_t *gen = &p->cat->gen[gen_index];
  int64_t shard_rows, shard_cols;
  refit_src_shard_shape(t, &shard_rows, &shard_cols);
  const int by_rows = t->split == REFIT_SPLIT_ROWS;
  const int64_t lo = by_rows ? s->src_row : s->src_col;
  const int64_t len = by_rows ? s->rows : s->cols;
  const int64_t step = by_rows ? shard_rows : shard_cols;
  int64_t first_part = t->split == REFIT_SPLIT_NONE ? 0 : lo / step;
  int64_t last_part = t->split == REFIT_SPLIT_NONE ? 0 : (lo + len - 1) / step;

  for (int64_t part = first_part; part <= last_part; part++) {
    refit_chunk_t c;
    memset(&c, 0, sizeof(c));
    c.src_tensor = s->src;
    c.dst_tensor = (int32_t)gen_index;
    c.dst_rank = g;
    c.src_row = s->src_row;
    c.src_col = s->src_col;
    c.rows = s->rows;
    c.cols = s->cols;
    c.dst_row = s->dst_row;
    c.dst_col = s->dst_col;
    if (t->split != REFIT_SPLIT_NONE) {
      int64_t a = part * step > lo ? part * step : lo;
      int64_t e = (part + 1) * step < lo + len ? (part + 1) * step : lo + len;
      if (by_rows) {
        c.dst_row += a - lo;
        c.rows = e - a;
        c.src_row = a - part * step;
      } else {
        c.dst_col += a - lo;
        c.cols = e - a;
        c.src_col = a - part * step;
      }
    }
    c.row_bytes = (int32_t)refit_plan_row_bytes(gen, p->opt->wire, c.cols);
    c.src_rank = refit_planner_pick(p, s->src, t, (int32_t)part);
    p->plan->egress[c.src_rank] += c.rows * c.row_bytes;
    p->plan->ingress[g] += c.rows * c.row_bytes;
    REFIT_CHECK(refit_planner_place(p, c));
  }
  return REFIT_OK;
}

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
static refit_status_t refit_planner_finish(refit_planner_t *p) {
  refit_plan_t *plan = p->plan;
  int64_t nb = 0;
  uint64_t h = REFIT_HASH_INIT;

  for (int64_t i = 0; i < plan->nchunks; i++)
    plan->chunks[i].offset = i;
  qsort(plan->chunks, (size_t)plan->nchunks, sizeof(*plan->chunks),
        refit_chunk_cmp);
  plan->nbuckets = plan->nchunks ? plan->chunks[plan->nchunks - 1].bucket + 1 : 0;

  /* Messages are at most one per chunk; shrink afterwards. */
  plan->msgs = malloc((size_t)(plan->nchunks ? plan->nchunks : 1) *
                      sizeof(*plan->msgs));
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
    h = refit_hash_u64(h, ((uint64_t)(uint32_t)c->src_rank << 32) |
                              (uint32_t)c->dst_rank);
    h = refit_hash_u64(h, ((uint64_t)(uint32_t)c->src_tensor << 32) |
                              (uint32_t)c->dst_tensor);
    h = refit_hash_u64(h, (uint64_t)c->src_row ^ ((uint64_t)c->src_col << 32));
    h = refit_hash_u64(h, (uint64_t)c->dst_row ^ ((uint64_t)c->dst_col << 32));
    h = refit_hash_u64(h, (uint64_t)c->rows ^ ((uint64_t)c->cols << 32));
    h = refit_hash_u64(h, (uint64_t)c->offset ^ ((uint64_t)c->bucket << 48));
  }
  while (nb <= plan->nbuckets)
    plan->bucket_msg_begin[nb++] = plan->nmsgs;
  if (plan->nmsgs > 0) {
    refit_msg_t *shrunk =
        realloc(plan->msgs, (size_t)plan->nmsgs * sizeof(*plan->msgs));
    if (shrunk != NULL)
      plan->msgs = shrunk;
  }
  h = refit_hash_u64(h, p->opt->bucket_bytes);
  h = refit_hash_u64(h, (uint64_t)p->opt->wire);
  h = refit_hash_u64(h, (uint64_t)p->opt->chunk_trailer);
  h = refit_hash_u64(h, (uint64_t)p->opt->per_tensor_buckets);
  plan->hash = h;
  return REFIT_OK;
}

refit_status_t refit_plan_create(const refit_catalog_t *cat,
                                 const refit_plan_options_t *options,
                                 refit_plan_t **out) {
  refit_planner_t p = {0};
  refit_status_t st = REFIT_OK;
  refit_plan_t *plan = calloc(1, sizeof(*plan));

  if (plan == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: allocation failed");
  if (options->bucket_bytes == 0 || options->bucket_bytes > (UINT64_C(1) << 40) ||
      options->chunk_trailer < 0 || options->chunk_trailer > 64) {
    st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                   "plan: bucket_bytes %llu (1 .. 1TiB) or chunk_trailer %d "
                   "(0 .. 64) out of range",
                   (unsigned long long)options->bucket_bytes,
                   (int)options->chunk_trailer);
    goto err;
  }
  memset(&p, 0, sizeof(p));
  p.cat = cat;
  p.opt = options;
  p.plan = plan;
  plan->options = *options;
  plan->ntrainer = refit_trainer_world(&cat->trainer);
  plan->ngenerator = refit_generator_world(&cat->generator);
  plan->egress = calloc((size_t)plan->ntrainer, sizeof(int64_t));
  plan->ingress = calloc((size_t)plan->ngenerator, sizeof(int64_t));
  plan->staging = calloc((size_t)plan->ngenerator, sizeof(int64_t));
  if (plan->egress == NULL || plan->ingress == NULL || plan->staging == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: rank tables");
    goto err;
  }
  /* Without data parallelism the replicas of a tensor are the copies held
   * by the tensor- or expert-parallel ranks of the one model replica (norms,
   * routers): every engine then takes a tensor from the copy the first
   * engine got, so a trainer sends all engines the same bytes in the same
   * buckets and packs them once (runtime/src/session.c), at no cost to
   * balance (such tensors are small). With data-parallel replicas the
   * engines spread over them instead. */
  if (cat->trainer.dp == 1 && cat->generator.engines > 1) {
    for (int64_t i = 0; i < cat->nsrc; i++)
      if (cat->src[i].nparts > p.memo_parts)
        p.memo_parts = cat->src[i].nparts;
    p.memo = malloc((size_t)(cat->nsrc * p.memo_parts + 1) * sizeof(int32_t));
    if (p.memo == NULL) {
      st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: holder table");
      goto err;
    }
    memset(p.memo, 0xff, (size_t)(cat->nsrc * p.memo_parts + 1) * sizeof(int32_t));
  }
  for (int32_t g = 0; g < plan->ngenerator; g++) {
    const int32_t t = g % cat->generator.tp;
    p.bucket = 0;
    p.bucket_used = 0;
    p.last_tensor = -1;
    for (int64_t i = cat->gen_begin[t]; i < cat->gen_begin[t + 1]; i++) {
      const refit_gen_tensor_t *gen = &cat->gen[i];
      for (int64_t s = 0; s < gen->seg_count; s++)
        REFIT_CHECK_GOTO(
            refit_planner_segment(&p, g, i, &cat->segs[gen->seg_begin + s]), st,
            err);
    }
  }
  REFIT_CHECK_GOTO(refit_planner_finish(&p), st, err);
  free(p.memo);
  *out = plan;
  return REFIT_OK;

err:
  free(p.memo);
  refit_plan_destroy(plan);
  return st;
}

void refit_plan_destroy(refit_plan_t *plan) {
  if (plan == NULL)
    return;
  free(plan->chunks);
  free(plan->msgs);
  free(plan->bucket_msg_begin);
  free(plan->egress);
  free(plan->ingress);
  free(plan->staging);
  free(plan);
}

void refit_plan_stats(const refit_plan_t *plan, double link_gbps,
                      refit_plan_stats_t *stats) {
  int64_t *out_b = calloc((size_t)plan->ntrainer, sizeof(int64_t));
  int64_t *in_b = calloc((size_t)plan->ngenerator, sizeof(int64_t));

  memset(stats, 0, sizeof(*stats));
  for (int32_t r = 0; r < plan->ntrainer; r++) {
    stats->total_bytes += plan->egress[r];
    if (plan->egress[r] > stats->egress_max)
      stats->egress_max = plan->egress[r];
  }
  for (int32_t g = 0; g < plan->ngenerator; g++) {
    if (plan->ingress[g] > stats->ingress_max)
      stats->ingress_max = plan->ingress[g];
    if (plan->staging[g] > stats->staging_max)
      stats->staging_max = plan->staging[g];
  }
  stats->egress_mean = (double)stats->total_bytes / plan->ntrainer;
  stats->ingress_mean = (double)stats->total_bytes / plan->ngenerator;
  if (out_b == NULL || in_b == NULL || link_gbps <= 0)
    goto out;
  for (int32_t b = 0; b < plan->nbuckets; b++) {
    int64_t busiest = 0;
    for (int64_t i = plan->bucket_msg_begin[b]; i < plan->bucket_msg_begin[b + 1];
         i++) {
      const refit_msg_t *m = &plan->msgs[i];
      out_b[m->src_rank] += m->bytes;
      in_b[m->dst_rank] += m->bytes;
    }
    for (int32_t r = 0; r < plan->ntrainer; r++) {
      if (out_b[r] > busiest)
        busiest = out_b[r];
      out_b[r] = 0;
    }
    for (int32_t g = 0; g < plan->ngenerator; g++) {
      if (in_b[g] > busiest)
        busiest = in_b[g];
      in_b[g] = 0;
    }
    stats->predicted_s += (double)busiest / (link_gbps * 1e9);
  }
out:
  free(out_b);
  free(in_b);
}

/* ---- MXFP8 assembly areas ---------------------------------------------- */

int64_t refit_plan_assembly_bytes(const refit_gen_tensor_t *g) {
  return g->rows * g->cols + g->rows * (g->cols / 32);
}

typedef struct {
  int64_t off, len;
} refit_range_t;

/* First fit in a sorted free list; grows the high-water mark when nothing
 * fits. 256-byte aligned, as the kernels prefer. */
static int64_t refit_arena_take(refit_range_t *free_list, int64_t *nfree,
                                int64_t *top, int64_t len) {
  len = (len + 255) & ~(int64_t)255;
  for (int64_t k = 0; k < *nfree; k++)
    if (free_list[k].len >= len) {
      int64_t off = free_list[k].off;
      free_list[k].off += len;
      free_list[k].len -= len;
      return off;
    }
  int64_t off = *top;
  *top += len;
  return off;
}

static void refit_arena_give(refit_range_t *free_list, int64_t *nfree, int64_t off,
                             int64_t len) {
  len = (len + 255) & ~(int64_t)255;
  int64_t k = 0;
  while (k < *nfree && free_list[k].off < off)
    k++;
  memmove(&free_list[k + 1], &free_list[k], (size_t)(*nfree - k) * sizeof(*free_list));
  free_list[k].off = off;
  free_list[k].len = len;
  (*nfree)++;
  /* Merge with the neighbours. */
  if (k + 1 < *nfree && free_list[k].off + free_list[k].len == free_list[k + 1].off) {
    free_list[k].len += free_list[k + 1].len;
    memmove(&free_list[k + 1], &free_list[k + 2],
            (size_t)(*nfree - k - 2) * sizeof(*free_list));
    (*nfree)--;
  }
  if (k > 0 && free_list[k - 1].off + free_list[k - 1].len == free_list[k].off) {
    free_list[k - 1].len += free_list[k].len;
    memmove(&free_list[k], &free_list[k + 1],
            (size_t)(*nfree - k - 1) * sizeof(*free_list));
    (*nfree)--;
  }
}

static const refit_plan_t *refit_land_order_plan; /* qsort has no context */

static int refit_land_order_cmp(const void *a, const void *b) {
  const refit_chunk_t *x = &refit_land_order_plan->chunks[*(const int64_t *)a];
  const refit_chunk_t *y = &refit_land_order_plan->chunks[*(const int64_t *)b];
  if (x->bucket != y->bucket)
    return x->bucket < y->bucket ? -1 : 1;
  if (x->dst_tensor != y->dst_tensor)
    return x->dst_tensor < y->dst_tensor ? -1 : 1;
  if (x->dst_row != y->dst_row)
    return x->dst_row < y->dst_row ? -1 : 1;
  return x->dst_col < y->dst_col ? -1 : (x->dst_col > y->dst_col);
}

refit_status_t refit_plan_land_order(const refit_plan_t *plan, int32_t gen_rank,
                                     int64_t **order, int64_t *count) {
  int64_t n = 0;
  for (int64_t c = 0; c < plan->nchunks; c++)
    n += plan->chunks[c].dst_rank == gen_rank;
  int64_t *idx = malloc((size_t)(n ? n : 1) * sizeof(*idx));
  if (idx == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: land order of %lld chunks",
                     (long long)n);
  n = 0;
  for (int64_t c = 0; c < plan->nchunks; c++)
    if (plan->chunks[c].dst_rank == gen_rank)
      idx[n++] = c;
  /* Chunks never share a (tensor, row, col) origin on one rank, so the
   * order is total and qsort's instability does not matter. */
  refit_land_order_plan = plan;
  qsort(idx, (size_t)n, sizeof(*idx), refit_land_order_cmp);
  refit_land_order_plan = NULL;
  *order = idx;
  *count = n;
  return REFIT_OK;
}

refit_status_t refit_plan_assembly(const refit_plan_t *plan,
                                   const refit_catalog_t *cat, int32_t gen_rank,
                                   int64_t *offsets, int64_t *bytes) {
  const int t = gen_rank % cat->generator.tp;
  const int64_t first = cat->gen_begin[t], n = cat->gen_begin[t + 1] - first;
  refit_range_t *free_list = malloc((size_t)(n + 1) * sizeof(*free_list));
  int64_t *seen = calloc((size_t)(n ? n : 1), sizeof(*seen));
  int64_t nfree = 0, top = 0;

  if (free_list == NULL || seen == NULL) {
    free(free_list);
    free(seen);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: assembly of %lld tensors",
                     (long long)n);
  }
  int64_t *order = NULL, norder = 0;
  refit_status_t st = refit_plan_land_order(plan, gen_rank, &order, &norder);
  if (st != REFIT_OK) {
    free(free_list);
    free(seen);
    return st;
  }
  for (int64_t i = 0; i < n; i++)
    offsets[i] = -1;
  for (int64_t k = 0; k < norder; k++) {
    const refit_chunk_t *ch = &plan->chunks[order[k]];
    const int64_t i = ch->dst_tensor - first;
    const refit_gen_tensor_t *g = &cat->gen[ch->dst_tensor];
    if (!g->quantized)
      continue;
    if (seen[i] == 0)
      offsets[i] = refit_arena_take(free_list, &nfree, &top,
                                    refit_plan_assembly_bytes(g));
    seen[i] += ch->rows * ch->cols;
    if (seen[i] == g->elements)
      refit_arena_give(free_list, &nfree, offsets[i], refit_plan_assembly_bytes(g));
  }
  free(order);
  free(free_list);
  free(seen);
  *bytes = top;
  return REFIT_OK;
}
