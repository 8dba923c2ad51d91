/*
 * NVFP4's global amax (docs/nvfp4.md, "The global amax"): every weight is
 * quantized under one FP32 global scale from the amax of its WHOLE Hugging
 * Face tensor (and a fused layer under the max over its pieces), but the
 * trainers hold shards and a generator assembles only its own. At begin,
 * after the trainers' new weights are in place, every trainer computes the
 * amax key (kernels/nvfp4.h: BF16 bits, sign cleared, ordered like the
 * values) of each Hugging Face tensor's rows in each shard it holds, and
 * every rank's keys are exchanged under the begin deadline
 * (refit_session_gather: a rank that does not answer is named); a
 * generator's key of a tensor is then the maximum over all trainers, which
 * is the key of the whole tensor. Generators send zeros. Only the tensors an
 * NVFP4 runtime tensor of any generator rank reads take part.
 */
#include "session.h"

#include "core/error.h"
#include "kernels/nvfp4.h"
#include "reshard/blocks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Which Hugging Face tensors feed an NVFP4 runtime tensor (mask[h] = 1). */
static refit_status_t refit_nvfp4_amax_mask(const refit_catalog_t *cat, unsigned char *mask) {
  for (int64_t g = 0; g < cat->gen_begin[cat->generator.tp]; g++) {
    if (cat->gen[g].quantized != REFIT_QUANT_NVFP4)
      continue;
    refit_block_piece_t *p = NULL;
    int64_t n = 0;
    REFIT_CHECK(refit_block_pieces(cat, g, &p, &n));
    for (int64_t k = 0; k < n; k++)
      mask[p[k].hf] = 1;
    free(p);
  }
  return REFIT_OK;
}

/* This trainer's keys: for each shard, each row run's rows in it. */
static refit_status_t refit_nvfp4_amax_local(refit_session_t *s, const unsigned char *mask,
                                             uint16_t *keys) {
  const refit_catalog_t *cat = s->cat;
  for (int64_t i = 0; i < cat->nsrc; i++) {
    if (s->shards[i] == NULL)
      continue;
    const refit_src_tensor_t *t = &cat->src[i];
    int64_t rows, cols;
    refit_src_shard_shape(t, &rows, &cols);
    const int64_t row0 = t->split == REFIT_SPLIT_ROWS ? s->shard_part[i] * rows : 0;
    for (int64_t k = t->run_begin; k < t->run_begin + t->run_count; k++) {
      const refit_row_run_t *r = &cat->runs[k];
      const int64_t lo = r->src_row > row0 ? r->src_row : row0;
      const int64_t hi =
          r->src_row + r->rows < row0 + rows ? r->src_row + r->rows : row0 + rows;
      if (hi <= lo || !mask[r->hf])
        continue;
      uint16_t key = 0;
      REFIT_CHECK(refit_mem_amax_key(s->mem, s->shards[i] + (lo - row0) * cols, hi - lo,
                                     cols, cols, &key));
      if (key > keys[r->hf])
        keys[r->hf] = key;
    }
  }
  return REFIT_OK;
}

refit_status_t refit_session_nvfp4_amax(refit_session_t *s, int ok, uint64_t version) {
  const refit_catalog_t *cat = s->cat;
  const int64_t nhf = cat->nhf;
  /* keys[nhf] then this rank's ok flag, per rank. */
  const size_t one = (size_t)(nhf + 1) * sizeof(uint16_t);
  if (one > (size_t)INT32_MAX)
    return REFIT_ERR(REFIT_ERR_INTERNAL, "begin %llu: %lld amax keys exceed one message",
                     (unsigned long long)version, (long long)nhf);
  uint16_t *mine = calloc(1, one);
  uint16_t *all = malloc(one * (size_t)s->size);
  unsigned char *mask = calloc((size_t)(nhf ? nhf : 1), 1);
  refit_status_t st = REFIT_OK;
  if (mine == NULL || all == NULL || mask == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "begin %llu: amax keys of %d ranks",
                   (unsigned long long)version, s->size);
    ok = 0;
  }
  if (st == REFIT_OK)
    st = refit_nvfp4_amax_mask(cat, mask);
  if (st == REFIT_OK && ok && s->is_trainer)
    st = refit_nvfp4_amax_local(s, mask, mine);
  free(mask);
  if (mine == NULL || all == NULL) {
    /* No buffers to exchange with: the peers will time out naming this rank. */
    free(mine);
    free(all);
    s->broken = 1;
    return st;
  }
  mine[nhf] = ok && st == REFIT_OK;
  void *blocks[2] = {mine, all};
  const double deadline = MPI_Wtime() + s->cfg.refit.timeout_s;
  refit_status_t wst =
      refit_session_gather(s, mine, all, (int)one, REFIT_CTRL_TAG_AMAX, deadline,
                           "begin: NVFP4 global amax exchange", blocks, 2);
  if (wst != REFIT_OK)
    return wst; /* the blocks belong to outlive.h now */
  for (int r = 0; r < s->size && st == REFIT_OK; r++)
    if (!all[(size_t)r * (size_t)(nhf + 1) + (size_t)nhf] && ok) {
      char who[96];
      refit_session_rank_name(s, r, who, sizeof(who));
      st = REFIT_ERR(REFIT_ERR_PEER,
                     "begin %llu: %s could not compute its NVFP4 amax keys (its error "
                     "is in its log)",
                     (unsigned long long)version, who);
    }
  if (st == REFIT_OK && !s->is_trainer) {
    for (int r = 0; r < s->size; r++)
      for (int64_t h = 0; h < nhf; h++) {
        const uint16_t k = all[(size_t)r * (size_t)(nhf + 1) + (size_t)h];
        if (k > mine[h])
          mine[h] = k;
      }
    refit_loader_nvfp4_scales(s->loader, mine);
  }
  free(mine);
  free(all);
  return st;
}
