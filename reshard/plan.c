/*
 * The planner (plan.h): what every generator rank needs and from whom.
 * Each runtime tensor's segments are cut along the trainer shard boundaries
 * into pieces, and each piece goes to the least-loaded holder of its part
 * so far; then the schedule (plan_schedule.c) cuts the pieces into buckets
 * and plan_messages.c forms the messages and the hash.
 */
#include "reshard/plan_internal.h"

#include "reshard/blocks.h"

#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t refit_plan_row_bytes(const refit_gen_tensor_t *gen, refit_wire_t wire, int block,
                             int64_t cols) {
  if (wire == REFIT_WIRE_MXFP8 && gen->quantized == REFIT_QUANT_MXFP8)
    return cols + cols / 32;
  if (wire == REFIT_WIRE_FP8_BLOCK && block)
    return cols + 4 * ((cols + REFIT_BLOCK_EDGE - 1) / REFIT_BLOCK_EDGE);
  return cols * 2;
}

int refit_plan_block_prequantized(const refit_plan_t *plan, int64_t gen) {
  return plan->block_wire != NULL && plan->block_wire[gen] != REFIT_BLOCK_WIRE_BF16;
}

refit_status_t refit_chunk_vec_push(refit_chunk_vec_t *vec, const refit_chunk_t *c) {
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

/* Segment s along the dimension its trainer tensor is split by: its start
 * and length there, and a trainer part's extent. */
static void refit_segment_span(const refit_src_tensor_t *t, const refit_segment_t *s,
                               int64_t *lo, int64_t *len, int64_t *step) {
  int64_t shard_rows, shard_cols;
  refit_src_shard_shape(t, &shard_rows, &shard_cols);
  const int by_rows = t->split == REFIT_SPLIT_ROWS;
  *lo = by_rows ? s->src_row : s->src_col;
  *len = by_rows ? s->rows : s->cols;
  *step = by_rows ? shard_rows : shard_cols;
}

/* The trainer parts segment s covers: [*first, *last]. */
static void refit_segment_parts(const refit_src_tensor_t *t, const refit_segment_t *s,
                                int64_t *first, int64_t *last) {
  int64_t lo, len, step;
  refit_segment_span(t, s, &lo, &len, &step);
  *first = t->split == REFIT_SPLIT_NONE ? 0 : lo / step;
  *last = t->split == REFIT_SPLIT_NONE ? 0 : (lo + len - 1) / step;
}

/* The rectangle of segment s that trainer part `part` holds, as a chunk of
 * generator tensor `gen_index` (holder, bucket and row bytes unset). */
static refit_chunk_t refit_segment_part(const refit_src_tensor_t *t,
                                        const refit_segment_t *s, int64_t gen_index,
                                        int64_t part) {
  const int by_rows = t->split == REFIT_SPLIT_ROWS;
  int64_t lo, len, step;
  refit_segment_span(t, s, &lo, &len, &step);
  refit_chunk_t c;
  memset(&c, 0, sizeof(c));
  c.src_tensor = s->src;
  c.dst_tensor = (int32_t)gen_index;
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
  return c;
}

/* plan_internal.h: a block row, or the piece's rows (a piece of a tensor
 * whose blocks pad with its last element, or shorter than a block row). */
int64_t refit_planner_quantum(const refit_planner_t *p, const refit_chunk_t *piece) {
  const uint8_t *bw = p->plan->block_wire;
  if (bw == NULL || bw[piece->dst_tensor] == REFIT_BLOCK_WIRE_BF16)
    return 1;
  if (bw[piece->dst_tensor] == REFIT_BLOCK_WIRE_WHOLE || piece->rows < REFIT_BLOCK_EDGE)
    return piece->rows > 0 ? piece->rows : 1;
  return REFIT_BLOCK_EDGE;
}

/*
 * Under REFIT_WIRE_FP8_BLOCK: how block FP8 tensor i travels
 * (refit_block_wire_t). The trainer quantizes it when every piece a trainer
 * part holds is a rectangle of whole blocks (refit_block_rect_whole) and the
 * smallest cut of it fits a bucket; otherwise it falls back to BF16 rows,
 * assembled and quantized on the generator as without prequantize (same
 * bytes, twice the wire). A trainer shard that splits a block (trainer.tp
 * splitting K or N at a non-multiple of 128) is the usual reason; `why` (may
 * be NULL) gets the first such part, said for a person.
 */
static refit_status_t refit_block_wire_of(const refit_catalog_t *cat,
                                          const refit_plan_options_t *opt, int64_t i,
                                          uint8_t *wire, char *why, size_t len) {
  const refit_gen_tensor_t *g = &cat->gen[i];
  refit_block_piece_t *bp = NULL;
  int64_t np = 0;
  REFIT_CHECK(refit_block_pieces(cat, i, &bp, &np));
  const int whole = refit_block_partial_cols(cat, bp, np);
  int ok = 1;
  for (int64_t k = 0; k < g->seg_count && ok; k++) {
    const refit_segment_t *s = &cat->segs[g->seg_begin + k];
    const refit_src_tensor_t *t = &cat->src[s->src];
    int64_t first, last;
    refit_segment_parts(t, s, &first, &last);
    for (int64_t part = first; part <= last && ok; part++) {
      const refit_chunk_t c = refit_segment_part(t, s, i, part);
      const int64_t cut = whole || c.rows < REFIT_BLOCK_EDGE ? c.rows : REFIT_BLOCK_EDGE;
      const int64_t bytes =
          cut * refit_plan_row_bytes(g, opt->wire, 1, c.cols) + opt->chunk_trailer;
      const int rect =
          refit_block_rect_whole(cat, g, bp, np, c.dst_row, c.dst_col, c.rows, c.cols);
      ok = rect && bytes <= (int64_t)opt->bucket_bytes;
      if (ok || why == NULL)
        continue;
      if (!rect)
        snprintf(why, len,
                 "trainer rank %d holds its rows %lld..%lld, columns %lld..%lld (of "
                 "trainer tensor %s), which are not whole 128 x 128 blocks of its "
                 "Hugging Face tensor",
                 refit_src_holder(cat, t, (int32_t)part, 0), (long long)c.dst_row,
                 (long long)(c.dst_row + c.rows - 1), (long long)c.dst_col,
                 (long long)(c.dst_col + c.cols - 1), t->name);
      else
        snprintf(why, len,
                 "its smallest cut, %lld rows of trainer rank %d (%lld bytes with the "
                 "scales), is larger than refit.bucket_bytes %llu",
                 (long long)cut, refit_src_holder(cat, t, (int32_t)part, 0),
                 (long long)bytes, (unsigned long long)opt->bucket_bytes);
    }
  }
  free(bp);
  *wire = !ok     ? REFIT_BLOCK_WIRE_BF16
          : whole ? REFIT_BLOCK_WIRE_WHOLE
                  : REFIT_BLOCK_WIRE_CUT;
  return REFIT_OK;
}

static refit_status_t refit_planner_block_wire(refit_planner_t *p) {
  const refit_catalog_t *cat = p->cat;
  const int64_t ngen = cat->gen_begin[cat->generator.tp];
  p->plan->block_wire = calloc((size_t)(ngen ? ngen : 1), 1);
  if (p->plan->block_wire == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan: block wire table");
  for (int64_t i = 0; i < ngen; i++)
    if (cat->gen[i].quantized == REFIT_QUANT_FP8_BLOCK)
      REFIT_CHECK(refit_block_wire_of(cat, p->opt, i, &p->plan->block_wire[i], NULL, 0));
  return REFIT_OK;
}

int64_t refit_plan_block_fallback(const refit_plan_t *plan, const refit_catalog_t *cat,
                                  int64_t from) {
  if (plan->block_wire == NULL)
    return -1;
  for (int64_t i = from < 0 ? 0 : from; i < cat->gen_begin[cat->generator.tp]; i++)
    if (cat->gen[i].quantized == REFIT_QUANT_FP8_BLOCK &&
        !refit_plan_block_prequantized(plan, i))
      return i;
  return -1;
}

refit_status_t refit_plan_block_why(const refit_plan_t *plan, const refit_catalog_t *cat,
                                    int64_t gen, char *why, size_t len) {
  uint8_t wire;
  if (len > 0)
    why[0] = '\0';
  return refit_block_wire_of(cat, &plan->options, gen, &wire, why, len);
}

/* Cut a segment along the trainer shard boundaries and place each piece. */
static refit_status_t refit_planner_segment(refit_planner_t *p, int32_t g,
                                            int64_t gen_index, const refit_segment_t *s) {
  const refit_src_tensor_t *t = &p->cat->src[s->src];
  const refit_gen_tensor_t *gen = &p->cat->gen[gen_index];
  const int block = refit_plan_block_prequantized(p->plan, gen_index);
  int64_t first_part, last_part;
  refit_segment_parts(t, s, &first_part, &last_part);
  for (int64_t part = first_part; part <= last_part; part++) {
    refit_chunk_t c = refit_segment_part(t, s, gen_index, part);
    c.dst_rank = g;
    c.row_bytes = refit_plan_row_bytes(gen, p->opt->wire, block, c.cols);
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
   * buckets and packs them once (runtime/src/session/session.c), at no cost to
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
  if (options->wire == REFIT_WIRE_FP8_BLOCK)
    REFIT_CHECK_GOTO(refit_planner_block_wire(&p), st, err);
  /* Pieces: what each generator rank needs, and from whom. */
  int64_t ntensors = 1;
  for (int32_t g = 0; g < plan->ngenerator; g++) {
    const int32_t t = g % cat->generator.tp;
    p.piece_begin[g] = p.pieces.n;
    for (int64_t i = cat->gen_begin[t]; i < cat->gen_begin[t + 1]; i++) {
      const refit_gen_tensor_t *gen = &cat->gen[i];
      p.quantized |= refit_plan_assembles(gen) && !refit_plan_block_prequantized(plan, i);
      for (int64_t s = 0; s < gen->seg_count; s++)
        REFIT_CHECK_GOTO(refit_planner_segment(&p, g, i, &cat->segs[gen->seg_begin + s]),
                         st, err);
    }
    if (cat->gen_begin[t + 1] - cat->gen_begin[t] > ntensors)
      ntensors = cat->gen_begin[t + 1] - cat->gen_begin[t];
  }
  p.piece_begin[plan->ngenerator] = p.pieces.n;

  REFIT_CHECK_GOTO(refit_planner_schedule_spread(&p, ntensors), st, err);
  free(p.pieces.v);
  p.pieces.v = NULL;
  plan->chunks = p.out.v;
  plan->nchunks = p.out.n;
  p.out.v = NULL;
  REFIT_CHECK_GOTO(refit_planner_finish(&p), st, err);
  free(p.memo);
  free(p.piece_begin);
  *out = plan;
  return REFIT_OK;

err:
  free(p.memo);
  free(p.piece_begin);
  free(p.pieces.v);
  free(p.out.v);
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
  free(plan->block_wire);
  free(plan);
}
