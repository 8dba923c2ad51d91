/*
 * Assembly areas (plan.h): the order a generator rank lands its chunks in,
 * and where each tensor that assembles (block FP8, NVFP4) lies while
 * incomplete (first fit in a free list, 256-byte aligned). MXFP8 tensors
 * land straight in their runtime layout and take no area. The schedule
 * bounds the largest arena by refit.arena_bytes (plan_schedule.c).
 */
#include "reshard/plan_internal.h"

#include "core/error.h"

#include <stdlib.h>
#include <string.h>

int refit_plan_assembles(const refit_gen_tensor_t *g) {
  return g->quantized == REFIT_QUANT_FP8_BLOCK || g->quantized == REFIT_QUANT_NVFP4;
}

int64_t refit_plan_assembly_bytes(const refit_gen_tensor_t *g) {
  /* BF16: block FP8's blocks span chunks, and NVFP4's global scale needs
   * the whole tensor's amax: both are quantized once the tensor is whole.
   * NVFP4 adds its linear scales, one byte per 16 along K, swizzled from
   * there (experts: below). */
  if (g->quantized == REFIT_QUANT_FP8_BLOCK)
    return g->rows * g->cols * 2;
  if (g->quantized == REFIT_QUANT_NVFP4 && g->kind == REFIT_GEN_LINEAR)
    return g->rows * g->cols * 2 + g->rows * ((g->cols + 15) / 16);
  /* NVFP4 experts: the packed values too, in canonical order, which the
   * expert layout then gathers into the runtime weight. */
  if (g->quantized == REFIT_QUANT_NVFP4)
    return g->rows * g->cols * 2 + g->rows * ((g->cols + 15) / 16) +
           g->rows * ((g->cols + 1) / 2);
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
void refit_land_order_sort(const refit_chunk_t *chunks, int64_t *idx, int64_t n) {
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

refit_status_t refit_arena_walk(const refit_catalog_t *cat, const uint8_t *block_wire,
                                int32_t gen_rank, const refit_chunk_t *chunks,
                                const int64_t *order, int64_t norder, int64_t *offsets,
                                int64_t *bytes) {
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
    if (!refit_plan_assembles(g) || (block_wire != NULL && block_wire[ch->dst_tensor]))
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
  refit_status_t st = refit_arena_walk(cat, plan->block_wire, gen_rank, plan->chunks,
                                       order, norder, offsets, bytes);
  free(order);
  return st;
}
