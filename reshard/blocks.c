/*
 * Block FP8 pieces of runtime tensors and the shard rules (blocks.h).
 */
#include "reshard/blocks.h"

#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>

static int64_t refit_block_count(int64_t n) {
  return (n + REFIT_BLOCK_EDGE - 1) / REFIT_BLOCK_EDGE;
}

int64_t refit_block_matrices(const refit_gen_tensor_t *g) {
  return g->ndim == 3 ? g->shape[0] : 1;
}

int64_t refit_block_scale_rows(const refit_gen_tensor_t *g) {
  const int64_t e = refit_block_matrices(g);
  return e * refit_block_count(g->rows / e);
}

int64_t refit_block_scale_cols(const refit_gen_tensor_t *g) {
  return refit_block_count(g->cols);
}

/* The Hugging Face tensor and row of row `src_row` of trainer tensor `src`,
 * from its row runs; -1 when no run holds it. */
static int32_t refit_block_hf_of(const refit_catalog_t *cat, int32_t src, int64_t src_row,
                                 int64_t *hf_row) {
  const refit_src_tensor_t *t = &cat->src[src];
  for (int64_t k = t->run_begin; k < t->run_begin + t->run_count; k++) {
    const refit_row_run_t *r = &cat->runs[k];
    if (src_row >= r->src_row && src_row < r->src_row + r->rows) {
      *hf_row = r->hf_row + (src_row - r->src_row);
      return r->hf;
    }
  }
  return -1;
}

refit_status_t refit_block_pieces(const refit_catalog_t *cat, int64_t gen,
                                  refit_block_piece_t **out, int64_t *count) {
  const refit_gen_tensor_t *g = &cat->gen[gen];
  const int64_t n = g->rows / refit_block_matrices(g);
  refit_block_piece_t *p = malloc((size_t)(g->seg_count ? g->seg_count : 1) * sizeof(*p));
  int64_t np = 0;
  if (p == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "block pieces of %s", g->name);
  /* Segments are in destination row order; those of one row range (split
   * by columns) share it. A piece grows while the next rows continue the
   * same Hugging Face tensor in the same matrix. */
  for (int64_t s = g->seg_begin; s < g->seg_begin + g->seg_count; s++) {
    const refit_segment_t *seg = &cat->segs[s];
    int64_t hf_row = 0;
    const int32_t hf = refit_block_hf_of(cat, seg->src, seg->src_row, &hf_row);
    if (hf < 0) {
      free(p);
      return REFIT_ERR(REFIT_ERR_INTERNAL,
                       "block pieces of %s: rows %lld.. of trainer tensor %s are in no "
                       "Hugging Face tensor",
                       g->name, (long long)seg->src_row, cat->src[seg->src].name);
    }
    const int64_t matrix = seg->dst_row / n, row0 = seg->dst_row - matrix * n;
    refit_block_piece_t *last = np > 0 ? &p[np - 1] : NULL;
    if (last != NULL && last->matrix == matrix && last->row0 <= row0 &&
        row0 < last->row0 + last->rows)
      continue; /* another column range of rows already counted */
    if (last != NULL && last->hf == hf && last->matrix == matrix &&
        last->row0 + last->rows == row0 && last->hf_row + last->rows == hf_row) {
      last->rows += seg->rows;
      continue;
    }
    /* The piece's columns: where the tensor's first column is in the
     * Hugging Face tensor (segments of one row range start at dst_col 0). */
    p[np].hf = hf;
    p[np].matrix = matrix;
    p[np].row0 = row0;
    p[np].rows = seg->rows;
    p[np].hf_row = hf_row;
    p[np].hf_col = seg->src_col - seg->dst_col;
    p[np].cols = g->cols;
    p[np].scale_row0 = matrix * refit_block_count(n) + row0 / REFIT_BLOCK_EDGE;
    np++;
  }
  *out = p;
  *count = np;
  return REFIT_OK;
}

refit_status_t refit_block_piece_check(const refit_catalog_t *cat,
                                       const refit_gen_tensor_t *g, int tp_rank,
                                       const refit_block_piece_t *p,
                                       refit_field_t *blame) {
  const refit_src_tensor_t *hf = &cat->hf[p->hf];
  const int split = cat->generator.tp > 1;
  const int64_t n = g->rows / refit_block_matrices(g);
  refit_field_t field = split ? REFIT_FIELD_GENERATOR_TP : REFIT_FIELD_NONE;
  const char *why = NULL;
  char what[REFIT_NAME_MAX + 160];
  snprintf(what, sizeof(what), "rows %lld..%lld, columns %lld..%lld of %s [%lld, %lld]",
           (long long)p->hf_row, (long long)(p->hf_row + p->rows - 1),
           (long long)p->hf_col, (long long)(p->hf_col + p->cols - 1), hf->name,
           (long long)hf->rows, (long long)hf->cols);

  const int partial = p->rows % REFIT_BLOCK_EDGE != 0 || p->cols % REFIT_BLOCK_EDGE != 0;
  const int holds_last =
      p->hf_row + p->rows == hf->rows && p->hf_col + p->cols == hf->cols;
  const int64_t expert_i = g->kind == REFIT_GEN_MOE_W13 ? n / 2 : g->cols;
  if (split && ((p->rows < hf->rows && p->rows % REFIT_BLOCK_EDGE != 0) ||
                (p->cols < hf->cols && p->cols % REFIT_BLOCK_EDGE != 0))) {
    why = g->kind == REFIT_GEN_LINEAR
              ? "a tensor-parallel shard of a block-quantized dimension is not a "
                "multiple of 128 (vLLM's validate_fp8_block_shape refuses it)"
              : "a tensor-parallel shard of a block-quantized dimension is not a "
                "multiple of 128 (vLLM's FusedMoE refuses it under block FP8)";
  } else if (p->row0 % REFIT_BLOCK_EDGE != 0) {
    why = "it starts inside a 128-row block of the fused tensor (vLLM's "
          "validate_fp8_block_shape: every piece of a merged layer but the last is a "
          "multiple of 128 rows)";
  } else if ((g->kind == REFIT_GEN_MOE_W13 || g->kind == REFIT_GEN_MOE_W2) &&
             expert_i % REFIT_BLOCK_EDGE != 0) {
    why = "an expert's intermediate size per rank is not a multiple of 128 (vLLM's "
          "FusedMoE refuses it under block FP8)";
    field =
        split && cat->generator.ep == 1 ? field : REFIT_FIELD_MODEL_MOE_INTERMEDIATE_SIZE;
  } else if (p->hf_row % REFIT_BLOCK_EDGE != 0 || p->hf_col % REFIT_BLOCK_EDGE != 0) {
    why = "it does not start on a 128 x 128 block boundary of the Hugging Face tensor";
  } else if (partial && !holds_last) {
    why = "it has a partial 128 x 128 block but not the Hugging Face tensor's last "
          "element, which pads every partial block (NeMo-RL quantizes the whole "
          "tensor): refit cannot reproduce those blocks from this shard";
    field = split ? field : g->k_field;
  }
  if (why == NULL)
    return REFIT_OK;
  if (blame != NULL)
    *blame = field;
  return REFIT_ERR(
      REFIT_ERR_CONFIG,
      "%s on generator tp rank %d: the piece %s cannot be block-quantized: %s", g->name,
      tp_rank, what, why);
}

int refit_block_rect_whole(const refit_catalog_t *cat, const refit_gen_tensor_t *g,
                           const refit_block_piece_t *p, int64_t np, int64_t dst_row,
                           int64_t dst_col, int64_t rows, int64_t cols) {
  const int64_t n = g->rows / refit_block_matrices(g);
  const int64_t matrix = dst_row / n, r0 = dst_row - matrix * n;
  const refit_block_piece_t *piece = NULL;
  for (int64_t k = 0; k < np && piece == NULL; k++)
    if (p[k].matrix == matrix && p[k].row0 <= r0 && r0 < p[k].row0 + p[k].rows)
      piece = &p[k];
  if (piece == NULL || r0 + rows > piece->row0 + piece->rows)
    return 0;
  const refit_src_tensor_t *hf = &cat->hf[piece->hf];
  const int64_t hr = piece->hf_row + (r0 - piece->row0), hc = piece->hf_col + dst_col;
  const int64_t er = hr + rows, ec = hc + cols;
  if (hr % REFIT_BLOCK_EDGE != 0 || hc % REFIT_BLOCK_EDGE != 0 ||
      (er % REFIT_BLOCK_EDGE != 0 && er != hf->rows) ||
      (ec % REFIT_BLOCK_EDGE != 0 && ec != hf->cols))
    return 0;
  const int partial = (er == hf->rows && hf->rows % REFIT_BLOCK_EDGE != 0) ||
                      (ec == hf->cols && hf->cols % REFIT_BLOCK_EDGE != 0);
  return !partial || (er == hf->rows && ec == hf->cols);
}

int refit_block_partial_cols(const refit_catalog_t *cat, const refit_block_piece_t *p,
                             int64_t np) {
  for (int64_t k = 0; k < np; k++)
    if (cat->hf[p[k].hf].cols % REFIT_BLOCK_EDGE != 0)
      return 1;
  return 0;
}
