#include "reshard/plan.h"

#include "core/error.h"
#include "core/hash.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
  int quantized; /* some runtime tensor assembles in the MXFP8 arena */
} refit_planner_t;

int64_t refit_plan_row_bytes(const refit_gen_tensor_t *gen, refit_wire_t wire,
                             int64_t cols) {
  if (wire == REFIT_WIRE_MXFP8 && gen->quantized)
    return cols + cols / 32;
  return cols * 2;
}

static refit_status_t refit_chunk_vec_push(refit_chunk_vec_t *vec,
                                           const refit_chunk_t *c) {
  if (vec->n == vec->cap) {
    if (vec->cap >= REFIT_PLAN_MAX_CHUNKS)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "plan: more than %lld chunks; raise refit.bucket_bytes or "
                       "use more generator ranks",
                       (long long)REFIT_PLAN_MAX_CHUNKS);
    int64_t ncap = vec->cap ? vec->cap * 2 : 4096;
    refit_chunk_t *nc = realloc(vec->v, (size_t)ncap * sizeof(*nc));
    if (nc == NULL)
      return REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: cannot hold %lld chunks",
                       (long long)ncap);
    vec->v = nc;
    vec->cap = ncap;
  }
  vec->v[vec->n++] = *c;
  return REFIT_OK;
}

/* Place a rectangle into the current generator rank's buckets in tensor
 * order, cutting it by rows where the current bucket has less room than the
 * whole rectangle (the per-tensor baseline). */
static refit_status_t refit_planner_place(refit_planner_t *p, refit_chunk_t c) {
  const int64_t limit = (int64_t)p->opt->bucket_bytes;
  const int64_t trailer = p->opt->chunk_trailer;
  if (p->opt->per_tensor_buckets && c.dst_tensor != p->last_tensor &&
      p->bucket_used > 0) {
    p->bucket++;
    p->bucket_used = 0;
  }
  p->last_tensor = c.dst_tensor;
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
    REFIT_CHECK(refit_chunk_vec_push(&p->out, &part));
    p->bucket_used += part.rows * c.row_bytes + trailer;
    c.rows -= part.rows;
    c.src_row += part.rows;
    c.dst_row += part.rows;
  }
  if (p->bucket >= REFIT_PLAN_MAX_BUCKETS)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "plan: more than %d buckets; raise refit.bucket_bytes",
                     REFIT_PLAN_MAX_BUCKETS);
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
                                            int64_t gen_index, const refit_segment_t *s) {
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
    c.row_bytes = refit_plan_row_bytes(gen, p->opt->wire, c.cols);
    if (c.row_bytes + p->opt->chunk_trailer > (int64_t)p->opt->bucket_bytes)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "refit.bucket_bytes %llu is smaller than one row of %s "
                       "(%lld bytes)",
                       (unsigned long long)p->opt->bucket_bytes, gen->name,
                       (long long)(c.row_bytes + p->opt->chunk_trailer));
    c.src_rank = refit_planner_pick(p, s->src, t, (int32_t)part);
    c.bucket = -1;
    p->plan->egress[c.src_rank] += c.rows * c.row_bytes;
    p->plan->ingress[g] += c.rows * c.row_bytes;
    REFIT_CHECK(refit_chunk_vec_push(&p->pieces, &c));
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
  plan->hash = h;
  return REFIT_OK;
}

/* ---- The schedule ------------------------------------------------------ */

static refit_status_t refit_arena_walk(const refit_catalog_t *cat, int32_t gen_rank,
                                       const refit_chunk_t *chunks, const int64_t *order,
                                       int64_t norder, int64_t *offsets, int64_t *bytes);
static void refit_land_order_sort(const refit_chunk_t *chunks, int64_t *idx, int64_t n);

/* State of the schedule of every generator rank at once (buckets are
 * filled one at a time across all ranks, so chunks come out in message
 * order). Stream slots of rank g: [stream_first[g], stream_first[g + 1]),
 * one more than it can have (empty ones at the end, the last an end mark). */
typedef struct {
  int32_t *stream_of_rank; /* scratch: trainer rank -> stream, -1 when none */
  int64_t *stream_first;   /* per generator rank, G + 1 */
  int64_t *stream_begin;   /* per stream: into by_stream; one more at the end */
  int64_t *cursor;         /* per stream: index into by_stream */
  int64_t *taken;          /* per stream: rows of its current piece placed */
  int64_t *left;           /* per generator rank: streams not yet empty */
  int64_t *by_stream;      /* pieces grouped by rank, then stream, in order */
  double *base, *rate;     /* per piece: the position of its first byte, and
                              per byte */
  int64_t *mine;           /* chunks of each generator rank, in land order */
  int64_t *offsets;        /* arena places of one rank's tensors */
} refit_sched_t;

static void refit_sched_free(refit_sched_t *w) {
  free(w->stream_of_rank);
  free(w->stream_first);
  free(w->stream_begin);
  free(w->cursor);
  free(w->taken);
  free(w->left);
  free(w->by_stream);
  free(w->base);
  free(w->rate);
  free(w->mine);
  free(w->offsets);
}

/* Streams and positions of generator rank g at spread a. Every byte gets a
 * position in [0, 1): a * (its offset in the stream of its trainer rank /
 * that stream's bytes) + (1 - a) * (its offset in the rank's tensor order /
 * the rank's bytes). */
static void refit_sched_setup_rank(const refit_planner_t *p, refit_sched_t *w, int32_t g,
                                   double a) {
  const int64_t p0 = p->piece_begin[g], n = p->piece_begin[g + 1] - p0;
  const refit_chunk_t *pc = p->pieces.v + p0;
  const int64_t s0 = w->stream_first[g];
  int64_t ns = 0, total = 0, seq = 0;

  for (int64_t i = 0; i < n; i++) {
    total += pc[i].rows * pc[i].row_bytes;
    w->stream_of_rank[pc[i].src_rank] = 0;
  }
  /* Streams in order of trainer rank: the message order. */
  for (int32_t r = 0; r < p->plan->ntrainer; r++)
    if (w->stream_of_rank[r] >= 0)
      w->stream_of_rank[r] = (int32_t)ns++;
  int64_t *count = w->cursor + s0; /* pieces per stream, then cursors */
  for (int64_t k = 0; k < ns; k++)
    count[k] = 0;
  for (int64_t i = 0; i < n; i++)
    count[w->stream_of_rank[pc[i].src_rank]]++;
  for (int64_t k = 0, at = p0; k < ns; k++) {
    w->stream_begin[s0 + k] = at;
    at += count[k];
    count[k] = w->stream_begin[s0 + k];
  }
  for (int64_t i = 0; i < n; i++) {
    const int64_t k = w->stream_of_rank[pc[i].src_rank];
    w->by_stream[count[k]++] = p0 + i;
    w->base[p0 + i] = (double)seq; /* tensor-order offset for now */
    seq += pc[i].rows * pc[i].row_bytes;
  }
  for (int64_t k = 0; k < ns; k++) {
    const int64_t j0 = w->stream_begin[s0 + k], j1 = count[k];
    int64_t off = 0, bytes = 0;
    for (int64_t j = j0; j < j1; j++)
      bytes += p->pieces.v[w->by_stream[j]].rows * p->pieces.v[w->by_stream[j]].row_bytes;
    for (int64_t j = j0; j < j1; j++) {
      const int64_t i = w->by_stream[j];
      w->base[i] = a * (double)off / (double)bytes + (1 - a) * w->base[i] / (double)total;
      w->rate[i] = a / (double)bytes + (1 - a) / (double)total;
      off += p->pieces.v[i].rows * p->pieces.v[i].row_bytes;
    }
    w->cursor[s0 + k] = j0;
    w->taken[s0 + k] = 0;
  }
  for (int64_t k = s0 + ns; k < w->stream_first[g + 1]; k++)
    w->stream_begin[k] = w->cursor[k] = p0 + n;
  w->left[g] = ns;
  for (int64_t i = 0; i < n; i++)
    w->stream_of_rank[pc[i].src_rank] = -1;
}

/*
 * Bucket b of generator rank g: stream by stream, the rows whose middle
 * lies before (b + 1) / nb (all rows from bucket nb - 1 on), as far as
 * bucket_bytes allows (a row left out goes into the next bucket, and its
 * stream catches up there: the windows are cumulative). With spread 1
 * every bucket carries 1/nb of every (trainer, generator) pair; with 0 the
 * rank's tensors in order.
 */
static refit_status_t refit_sched_bucket_rank(refit_planner_t *p, refit_sched_t *w,
                                              int32_t g, int32_t b, int32_t nb) {
  const int64_t cap = (int64_t)p->opt->bucket_bytes;
  const int64_t trailer = p->opt->chunk_trailer;
  const int last = b >= nb - 1;
  const double end = (double)(b + 1) / (double)nb;
  int64_t used = 0;
  for (int64_t k = w->stream_first[g]; k + 1 < w->stream_first[g + 1]; k++) {
    while (w->cursor[k] < w->stream_begin[k + 1]) {
      const int64_t i = w->by_stream[w->cursor[k]];
      const refit_chunk_t *c = &p->pieces.v[i];
      int64_t take = c->rows - w->taken[k];
      if (!last) {
        const double in = (end - w->base[i]) / (w->rate[i] * (double)c->row_bytes) + 0.5;
        const int64_t upto = in <= 0 ? 0 : in >= (double)c->rows ? c->rows : (int64_t)in;
        take = upto - w->taken[k];
      }
      const int64_t room = (cap - used - trailer) / c->row_bytes;
      if (take > room)
        take = room;
      if (take <= 0)
        break;
      refit_chunk_t part = *c;
      part.rows = take;
      part.src_row += w->taken[k];
      part.dst_row += w->taken[k];
      part.bucket = b;
      REFIT_CHECK(refit_chunk_vec_push(&p->out, &part));
      used += take * c->row_bytes + trailer;
      w->taken[k] += take;
      if (w->taken[k] < c->rows)
        break; /* the window or the bucket ends inside this piece */
      w->taken[k] = 0;
      if (++w->cursor[k] == w->stream_begin[k + 1])
        w->left[g]--;
    }
  }
  return REFIT_OK;
}

/* The arena of every generator rank in [0, g_end) from p->out (into
 * plan->arena with `keep`); *arena_max the largest. */
static refit_status_t refit_sched_arenas(refit_planner_t *p, refit_sched_t *w,
                                         int32_t g_end, int keep, int64_t *arena_max) {
  const refit_chunk_vec_t *o = &p->out;
  int64_t *first = calloc((size_t)g_end + 1, sizeof(int64_t));
  int64_t *mine = realloc(w->mine, (size_t)(o->n ? o->n : 1) * sizeof(int64_t));
  if (first == NULL || mine == NULL) {
    free(first);
    if (mine != NULL)
      w->mine = mine;
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: land order of %lld chunks",
                     (long long)o->n);
  }
  w->mine = mine;
  for (int64_t c = 0; c < o->n; c++)
    first[o->v[c].dst_rank + 1]++;
  for (int32_t g = 0; g < g_end; g++)
    first[g + 1] += first[g];
  for (int64_t c = 0; c < o->n; c++)
    mine[first[o->v[c].dst_rank]++] = c;
  for (int32_t g = g_end; g > 0; g--)
    first[g] = first[g - 1];
  first[0] = 0;
  refit_status_t st = REFIT_OK;
  for (int32_t g = 0; g < g_end && st == REFIT_OK; g++) {
    int64_t bytes = 0;
    refit_land_order_sort(o->v, mine + first[g], first[g + 1] - first[g]);
    st = refit_arena_walk(p->cat, g, o->v, mine + first[g], first[g + 1] - first[g],
                          w->offsets, &bytes);
    if (bytes > *arena_max)
      *arena_max = bytes;
    if (keep)
      p->plan->arena[g] = bytes;
  }
  free(first);
  return st;
}

/* Schedule generator ranks [0, g_end) at spread a into p->out; with `keep`
 * each rank's arena goes to plan->arena. *arena_max: the largest arena. */
static refit_status_t refit_planner_schedule(refit_planner_t *p, refit_sched_t *w,
                                             double a, int32_t nb, int32_t g_end,
                                             int keep, int64_t *arena_max) {
  *arena_max = 0;
  p->out.n = 0;
  if (p->opt->per_tensor_buckets) {
    for (int32_t g = 0; g < g_end; g++) {
      p->bucket = 0;
      p->bucket_used = 0;
      p->last_tensor = -1;
      for (int64_t i = p->piece_begin[g]; i < p->piece_begin[g + 1]; i++)
        REFIT_CHECK(refit_planner_place(p, p->pieces.v[i]));
    }
  } else {
    int64_t busy = 0;
    for (int32_t g = 0; g < g_end; g++) {
      refit_sched_setup_rank(p, w, g, a);
      busy += w->left[g] > 0;
    }
    for (int32_t b = 0; busy > 0; b++) {
      if (b >= REFIT_PLAN_MAX_BUCKETS)
        return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                         "plan: more than %d buckets; raise refit.bucket_bytes",
                         REFIT_PLAN_MAX_BUCKETS);
      for (int32_t g = 0; g < g_end; g++)
        if (w->left[g] > 0) {
          REFIT_CHECK(refit_sched_bucket_rank(p, w, g, b, nb));
          busy -= w->left[g] == 0;
        }
    }
  }
  return p->quantized ? refit_sched_arenas(p, w, g_end, keep, arena_max) : REFIT_OK;
}

/* Buckets of the spread schedule: the busiest generator rank's bytes, its
 * chunk trailers and room for rows that do not divide evenly: a bucket
 * holds each stream's share plus at most one row carried over from the
 * last, so one row of the widest kind per stream (at most a thirty-second
 * of the bucket). Every rank uses the same count, so bucket k is the same
 * fraction of every rank's refit and trainers serve all generators evenly. */
static int32_t refit_planner_buckets(const refit_planner_t *p) {
  const int64_t cap_bytes = (int64_t)p->opt->bucket_bytes;
  const double ns = (double)p->plan->ntrainer; /* streams, at most */
  int64_t widest = 0;
  for (int64_t i = 0; i < p->pieces.n; i++)
    if (p->pieces.v[i].row_bytes > widest)
      widest = p->pieces.v[i].row_bytes;
  const double carry = ns * (double)widest;
  const double cap = (double)cap_bytes - (carry < (double)cap_bytes / 32.0
                                              ? carry
                                              : (double)cap_bytes / 32.0);
  double need = 0;
  for (int32_t g = 0; g < p->plan->ngenerator; g++) {
    const int64_t n = p->piece_begin[g + 1] - p->piece_begin[g];
    double b = (double)p->plan->ingress[g] + (double)n * p->opt->chunk_trailer;
    if (b > need)
      need = b;
  }
  /* Each bucket may cut a piece of every stream: a trailer more each. */
  double nb = ceil(need / cap);
  nb = ceil((need + nb * ns * p->opt->chunk_trailer) / cap);
  if (nb < 1)
    nb = 1;
  return nb > REFIT_PLAN_MAX_BUCKETS ? REFIT_PLAN_MAX_BUCKETS + 1 : (int32_t)nb;
}

refit_status_t refit_plan_create(const refit_catalog_t *cat,
                                 const refit_plan_options_t *options,
                                 refit_plan_t **out) {
  refit_planner_t p = {0};
  refit_sched_t w = {0};
  refit_status_t st = REFIT_OK;
  refit_plan_t *plan = calloc(1, sizeof(*plan));

  if (plan == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: allocation failed");
  if (options->bucket_bytes == 0 || options->bucket_bytes > (UINT64_C(1) << 40) ||
      options->chunk_trailer < 0 || options->chunk_trailer > 64) {
    st =
        REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                  "plan: bucket_bytes %llu (1 .. 1TiB) or chunk_trailer %d "
                  "(0 .. 64) out of range",
                  (unsigned long long)options->bucket_bytes, (int)options->chunk_trailer);
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
  plan->arena = calloc((size_t)plan->ngenerator, sizeof(int64_t));
  p.piece_begin = calloc((size_t)plan->ngenerator + 1, sizeof(int64_t));
  if (plan->egress == NULL || plan->ingress == NULL || plan->staging == NULL ||
      plan->arena == NULL || p.piece_begin == NULL) {
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
  /* Pieces: what each generator rank needs, and from whom. */
  int64_t ntensors = 1;
  for (int32_t g = 0; g < plan->ngenerator; g++) {
    const int32_t t = g % cat->generator.tp;
    p.piece_begin[g] = p.pieces.n;
    for (int64_t i = cat->gen_begin[t]; i < cat->gen_begin[t + 1]; i++) {
      const refit_gen_tensor_t *gen = &cat->gen[i];
      p.quantized |= gen->quantized;
      for (int64_t s = 0; s < gen->seg_count; s++)
        REFIT_CHECK_GOTO(refit_planner_segment(&p, g, i, &cat->segs[gen->seg_begin + s]),
                         st, err);
    }
    if (cat->gen_begin[t + 1] - cat->gen_begin[t] > ntensors)
      ntensors = cat->gen_begin[t + 1] - cat->gen_begin[t];
  }
  p.piece_begin[plan->ngenerator] = p.pieces.n;

  const int32_t nb = refit_planner_buckets(&p);
  if (nb > REFIT_PLAN_MAX_BUCKETS) {
    st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                   "plan: a generator rank needs more than %d buckets of "
                   "refit.bucket_bytes %llu; raise it",
                   REFIT_PLAN_MAX_BUCKETS, (unsigned long long)options->bucket_bytes);
    goto err;
  }
  /* Streams: a rank has at most one per trainer and one per piece. */
  const int64_t nt = plan->ntrainer, G64 = plan->ngenerator;
  w.stream_first = malloc((size_t)(G64 + 1) * sizeof(int64_t));
  w.left = malloc((size_t)G64 * sizeof(int64_t));
  if (w.stream_first == NULL || w.left == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: schedule tables");
    goto err;
  }
  w.stream_first[0] = 0;
  for (int32_t g = 0; g < plan->ngenerator; g++) {
    const int64_t n = p.piece_begin[g + 1] - p.piece_begin[g];
    w.stream_first[g + 1] = w.stream_first[g] + (n < nt ? n : nt) + 1;
  }
  const int64_t nstreams = w.stream_first[G64];
  w.stream_of_rank = malloc((size_t)nt * sizeof(int32_t));
  w.stream_begin = malloc((size_t)(nstreams + 1) * sizeof(int64_t));
  w.cursor = malloc((size_t)(nstreams + 1) * sizeof(int64_t));
  w.taken = malloc((size_t)(nstreams + 1) * sizeof(int64_t));
  w.by_stream = malloc((size_t)(p.pieces.n + 1) * sizeof(int64_t));
  w.base = malloc((size_t)(p.pieces.n + 1) * sizeof(double));
  w.rate = malloc((size_t)(p.pieces.n + 1) * sizeof(double));
  w.offsets = malloc((size_t)ntensors * sizeof(int64_t));
  if (w.stream_of_rank == NULL || w.stream_begin == NULL || w.cursor == NULL ||
      w.taken == NULL || w.by_stream == NULL || w.base == NULL || w.rate == NULL ||
      w.offsets == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: schedule tables");
    goto err;
  }
  for (int64_t r = 0; r < nt; r++)
    w.stream_of_rank[r] = -1;

  /* The spread: all of it when the arena allows; else the largest that fits
   * on the first engine's ranks (bisection), checked on all ranks. */
  const int64_t bound = (int64_t)options->arena_bytes;
  const int32_t G = plan->ngenerator, tp = cat->generator.tp;
  int64_t arena = 0;
  double a = 1.0;
  for (;;) {
    REFIT_CHECK_GOTO(refit_planner_schedule(&p, &w, a, nb, G, 1, &arena), st, err);
    if (!p.quantized || bound == 0 || arena <= bound || options->per_tensor_buckets)
      break;
    if (a == 0.0) {
      st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit.arena_bytes %lld is less than the MXFP8 assembly "
                     "arena even in tensor order (%lld bytes on a generator "
                     "rank); raise it or lower refit.bucket_bytes",
                     (long long)bound, (long long)arena);
      goto err;
    }
    if (a == 1.0) {
      double lo = 0.0, hi = 1.0;
      for (int it = 0; it < 7; it++) {
        const double mid = 0.5 * (lo + hi);
        int64_t am = 0;
        REFIT_CHECK_GOTO(refit_planner_schedule(&p, &w, mid, nb, tp, 0, &am), st, err);
        if (am <= bound)
          lo = mid;
        else
          hi = mid;
      }
      a = lo;
    } else {
      a = a <= 1.0 / 16 ? 0.0 : a - 1.0 / 16; /* another engine's rank */
    }
  }
  plan->spread = a;
  free(p.pieces.v);
  p.pieces.v = NULL;
  plan->chunks = p.out.v;
  plan->nchunks = p.out.n;
  p.out.v = NULL;
  REFIT_CHECK_GOTO(refit_planner_finish(&p), st, err);
  free(p.memo);
  free(p.piece_begin);
  refit_sched_free(&w);
  *out = plan;
  return REFIT_OK;

err:
  free(p.memo);
  free(p.piece_begin);
  free(p.pieces.v);
  free(p.out.v);
  refit_sched_free(&w);
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
  free(plan->arena);
  free(plan);
}

void refit_plan_stats(const refit_plan_t *plan, double link_gbps,
                      refit_plan_stats_t *stats) {
  const refit_plan_network_t net = {
      .link_gbps = link_gbps, .nvlink_gbps = 0, .gpus_per_node = 0};
  refit_plan_predict(plan, &net, stats);
}

/* Seconds a rank's bytes take: NIC and NVLink at once, the slower counts. */
static double refit_plan_rank_s(const refit_plan_network_t *net, int64_t nic,
                                int64_t nvl) {
  double s = (double)nic / (net->link_gbps * 1e9);
  if (nvl > 0) {
    double v = net->nvlink_gbps > 0 ? (double)nvl / (net->nvlink_gbps * 1e9) : 0;
    if (v > s)
      s = v;
  }
  return s;
}

void refit_plan_predict(const refit_plan_t *plan, const refit_plan_network_t *net,
                        refit_plan_stats_t *stats) {
  const int32_t T = plan->ntrainer, G = plan->ngenerator;
  /* Per rank (trainers, then generators): NIC and NVLink bytes of the
   * bucket being summed, and of the whole refit. */
  int64_t *nic = calloc((size_t)(T + G), sizeof(int64_t));
  int64_t *nvl = calloc((size_t)(T + G), sizeof(int64_t));
  int64_t *nic_all = calloc((size_t)(T + G), sizeof(int64_t));
  int64_t *nvl_all = calloc((size_t)(T + G), sizeof(int64_t));

  memset(stats, 0, sizeof(*stats));
  for (int32_t r = 0; r < T; r++) {
    stats->total_bytes += plan->egress[r];
    if (plan->egress[r] > stats->egress_max)
      stats->egress_max = plan->egress[r];
  }
  for (int32_t g = 0; g < G; g++) {
    if (plan->ingress[g] > stats->ingress_max)
      stats->ingress_max = plan->ingress[g];
    if (plan->staging[g] > stats->staging_max)
      stats->staging_max = plan->staging[g];
    if (plan->arena[g] > stats->arena_max)
      stats->arena_max = plan->arena[g];
  }
  stats->egress_mean = (double)stats->total_bytes / T;
  stats->ingress_mean = (double)stats->total_bytes / G;
  if (nic == NULL || nvl == NULL || nic_all == NULL || nvl_all == NULL ||
      net->link_gbps <= 0)
    goto out;
  const int32_t gpn = net->gpus_per_node;
  for (int32_t b = 0; b < plan->nbuckets; b++) {
    int64_t out_sum = 0, out_max = 0, in_max = 0;
    for (int64_t i = plan->bucket_msg_begin[b]; i < plan->bucket_msg_begin[b + 1]; i++) {
      const refit_msg_t *m = &plan->msgs[i];
      const int32_t src = m->src_rank, dst = T + m->dst_rank;
      int64_t *lane = gpn > 0 && src / gpn == dst / gpn ? nvl : nic;
      lane[src] += m->bytes;
      lane[dst] += m->bytes;
    }
    double busiest = 0;
    for (int32_t r = 0; r < T + G; r++) {
      const double s = refit_plan_rank_s(net, nic[r], nvl[r]);
      if (s > busiest)
        busiest = s;
      const int64_t bytes = nic[r] + nvl[r];
      if (r < T) {
        out_sum += bytes;
        if (bytes > out_max)
          out_max = bytes;
      } else if (bytes > in_max) {
        in_max = bytes;
      }
      nic_all[r] += nic[r];
      nvl_all[r] += nvl[r];
      nic[r] = nvl[r] = 0;
    }
    stats->predicted_s += busiest;
    if (out_sum > 0) {
      /* Every byte of the bucket leaves one trainer and reaches one
       * generator: the means share the sum. */
      const double eo = (double)out_max * T / (double)out_sum;
      const double ei = (double)in_max * G / (double)out_sum;
      if (eo > stats->bucket_egress_imbalance)
        stats->bucket_egress_imbalance = eo;
      if (ei > stats->bucket_ingress_imbalance)
        stats->bucket_ingress_imbalance = ei;
    }
  }
  for (int32_t r = 0; r < T + G; r++) {
    const double s = refit_plan_rank_s(net, nic_all[r], nvl_all[r]);
    if (s > stats->floor_s)
      stats->floor_s = s;
  }
out:
  free(nic);
  free(nvl);
  free(nic_all);
  free(nvl_all);
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
static int64_t refit_arena_take(refit_range_t *free_list, int64_t *nfree, int64_t *top,
                                int64_t len) {
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

static const refit_chunk_t *refit_land_order_chunks; /* qsort has no context */

static int refit_land_order_cmp(const void *a, const void *b) {
  const refit_chunk_t *x = &refit_land_order_chunks[*(const int64_t *)a];
  const refit_chunk_t *y = &refit_land_order_chunks[*(const int64_t *)b];
  if (x->bucket != y->bucket)
    return x->bucket < y->bucket ? -1 : 1;
  if (x->dst_tensor != y->dst_tensor)
    return x->dst_tensor < y->dst_tensor ? -1 : 1;
  if (x->dst_row != y->dst_row)
    return x->dst_row < y->dst_row ? -1 : 1;
  return x->dst_col < y->dst_col ? -1 : (x->dst_col > y->dst_col);
}

/* Sort idx[0 .. n) (indices into chunks, all of one generator rank) into
 * land order. Chunks never share a (tensor, row, col) origin on one rank,
 * so the order is total and qsort's instability does not matter. */
static void refit_land_order_sort(const refit_chunk_t *chunks, int64_t *idx, int64_t n) {
  refit_land_order_chunks = chunks;
  qsort(idx, (size_t)n, sizeof(*idx), refit_land_order_cmp);
  refit_land_order_chunks = NULL;
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
  refit_land_order_sort(plan->chunks, idx, n);
  *order = idx;
  *count = n;
  return REFIT_OK;
}

/* The arena walk of refit_plan_assembly over chunks[order[0 .. norder)], the
 * chunks of generator rank gen_rank in land order. */
static refit_status_t refit_arena_walk(const refit_catalog_t *cat, int32_t gen_rank,
                                       const refit_chunk_t *chunks, const int64_t *order,
                                       int64_t norder, int64_t *offsets, int64_t *bytes) {
  const int t = gen_rank % cat->generator.tp;
  const int64_t first = cat->gen_begin[t], n = cat->gen_begin[t + 1] - first;
  refit_range_t *free_list = malloc((size_t)(n + 1) * sizeof(*free_list));
  int64_t *seen = calloc((size_t)(n ? n : 1), sizeof(*seen));
  int64_t nfree = 0, top = 0;

  if (free_list == NULL || seen == NULL) {
    free(free_list);
    free(seen);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: assembly of %lld tensors", (long long)n);
  }
  for (int64_t i = 0; i < n; i++)
    offsets[i] = -1;
  for (int64_t k = 0; k < norder; k++) {
    const refit_chunk_t *ch = &chunks[order[k]];
    const int64_t i = ch->dst_tensor - first;
    const refit_gen_tensor_t *g = &cat->gen[ch->dst_tensor];
    if (!g->quantized)
      continue;
    if (seen[i] == 0)
      offsets[i] =
          refit_arena_take(free_list, &nfree, &top, refit_plan_assembly_bytes(g));
    seen[i] += ch->rows * ch->cols;
    if (seen[i] == g->elements)
      refit_arena_give(free_list, &nfree, offsets[i], refit_plan_assembly_bytes(g));
  }
  free(free_list);
  free(seen);
  *bytes = top;
  return REFIT_OK;
}

refit_status_t refit_plan_assembly(const refit_plan_t *plan, const refit_catalog_t *cat,
                                   int32_t gen_rank, int64_t *offsets, int64_t *bytes) {
  int64_t *order = NULL, norder = 0;
  REFIT_CHECK(refit_plan_land_order(plan, gen_rank, &order, &norder));
  refit_status_t st =
      refit_arena_walk(cat, gen_rank, plan->chunks, order, norder, offsets, bytes);
  free(order);
  return st;
}
