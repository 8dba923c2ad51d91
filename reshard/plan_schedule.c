/*
 * The plan's schedule (plan_internal.h): which rows of the pieces go into
 * which bucket. Each generator rank's bytes form one stream per trainer
 * rank, and bucket k takes from every stream the rows of the k-th of
 * nbuckets windows (refit_sched_bucket_rank); the windows blend stream
 * order with tensor order by the spread, the widest spread whose
 * assembly arena fits refit.arena_bytes (a bisection on the first engine,
 * checked on all). The per-tensor baseline fills buckets in tensor order
 * instead (refit_planner_place).
 */
#include "reshard/plan_internal.h"

#include "core/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
  const int64_t quantum = refit_planner_quantum(p, &c);
  while (c.rows > 0) {
    int64_t room = (limit - p->bucket_used - trailer) / c.row_bytes;
    if (room > 0 && room < c.rows)
      room -= room % quantum;
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
      /* Cuts of a tensor the trainer quantizes to block FP8 fall on its
       * block rows: the window and the room round down to them. */
      const int64_t quantum = refit_planner_quantum(p, c);
      if (w->taken[k] + take < c->rows)
        take -= (w->taken[k] + take) % quantum;
      int64_t room = (cap - used - trailer) / c->row_bytes;
      if (room > 0 && w->taken[k] + room < c->rows)
        room -= (w->taken[k] + room) % quantum;
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
    st = refit_arena_walk(p->cat, p->plan->block_wire, g, o->v, mine + first[g],
                          first[g + 1] - first[g], w->offsets, &bytes);
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
  const double cap =
      (double)cap_bytes -
      (carry < (double)cap_bytes / 32.0 ? carry : (double)cap_bytes / 32.0);
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

refit_status_t refit_planner_schedule_spread(refit_planner_t *p, int64_t ntensors) {
  const refit_catalog_t *cat = p->cat;
  const refit_plan_options_t *options = p->opt;
  refit_plan_t *plan = p->plan;
  refit_sched_t w = {0};
  refit_status_t st = REFIT_OK;

  const int32_t nb = refit_planner_buckets(p);
  if (nb > REFIT_PLAN_MAX_BUCKETS) {
    st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                   "plan: a generator rank needs more than %d buckets of "
                   "refit.bucket_bytes %llu; raise it",
                   REFIT_PLAN_MAX_BUCKETS, (unsigned long long)options->bucket_bytes);
    goto out;
  }
  /* Streams: a rank has at most one per trainer and one per piece. */
  const int64_t nt = plan->ntrainer, G64 = plan->ngenerator;
  w.stream_first = malloc((size_t)(G64 + 1) * sizeof(int64_t));
  w.left = malloc((size_t)G64 * sizeof(int64_t));
  if (w.stream_first == NULL || w.left == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: schedule tables");
    goto out;
  }
  w.stream_first[0] = 0;
  for (int32_t g = 0; g < plan->ngenerator; g++) {
    const int64_t n = p->piece_begin[g + 1] - p->piece_begin[g];
    w.stream_first[g + 1] = w.stream_first[g] + (n < nt ? n : nt) + 1;
  }
  const int64_t nstreams = w.stream_first[G64];
  w.stream_of_rank = malloc((size_t)nt * sizeof(int32_t));
  w.stream_begin = malloc((size_t)(nstreams + 1) * sizeof(int64_t));
  w.cursor = malloc((size_t)(nstreams + 1) * sizeof(int64_t));
  w.taken = malloc((size_t)(nstreams + 1) * sizeof(int64_t));
  w.by_stream = malloc((size_t)(p->pieces.n + 1) * sizeof(int64_t));
  w.base = malloc((size_t)(p->pieces.n + 1) * sizeof(double));
  w.rate = malloc((size_t)(p->pieces.n + 1) * sizeof(double));
  w.offsets = malloc((size_t)ntensors * sizeof(int64_t));
  if (w.stream_of_rank == NULL || w.stream_begin == NULL || w.cursor == NULL ||
      w.taken == NULL || w.by_stream == NULL || w.base == NULL || w.rate == NULL ||
      w.offsets == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: schedule tables");
    goto out;
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
    REFIT_CHECK_GOTO(refit_planner_schedule(p, &w, a, nb, G, 1, &arena), st, out);
    if (!p->quantized || bound == 0 || arena <= bound || options->per_tensor_buckets)
      break;
    if (a == 0.0) {
      st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit.arena_bytes %lld is less than the block FP8 / NVFP4 assembly "
                     "arena even in tensor order (%lld bytes on a generator "
                     "rank); raise it or lower refit.bucket_bytes",
                     (long long)bound, (long long)arena);
      goto out;
    }
    if (a == 1.0) {
      double lo = 0.0, hi = 1.0;
      for (int it = 0; it < 7; it++) {
        const double mid = 0.5 * (lo + hi);
        int64_t am = 0;
        REFIT_CHECK_GOTO(refit_planner_schedule(p, &w, mid, nb, tp, 0, &am), st, out);
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

out:
  refit_sched_free(&w);
  return st;
}
