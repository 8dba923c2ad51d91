/*
 * Where each byte of a chunk lands (kernels/place.h states the rules).
 */
#include "kernels/place.h"

#include "core/error.h"

refit_status_t refit_place_bf16_tensor(int64_t rows, int64_t cols, uint8_t *data,
                                       refit_place_tensor_t *out) {
  if (rows < 1 || cols < 1 || data == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "place: BF16 tensor [%lld, %lld] at %p: needs a positive shape "
                     "and storage",
                     (long long)rows, (long long)cols, (void *)data);
  *out = (refit_place_tensor_t){REFIT_PLACE_BF16, rows, cols, 1, -1, rows, data, NULL};
  return REFIT_OK;
}

refit_status_t refit_place_dense_tensor(refit_kernels_dense_backend_t backend, int64_t n,
                                        int64_t k, uint8_t *weight, uint8_t *scale,
                                        refit_place_tensor_t *out) {
  REFIT_CHECK(refit_kernels_check_shape(backend, NULL, n, k));
  if (weight == NULL || scale == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "place: dense %s tensor: NULL storage",
                     refit_kernels_dense_backend_name(backend));
  int perm;
  const int64_t rows = refit_kernels_dense_rows(backend, n, &perm);
  *out = (refit_place_tensor_t){REFIT_PLACE_MXFP8, n, k, 1, perm, rows, weight, scale};
  return REFIT_OK;
}

refit_status_t refit_place_moe_tensor(const refit_kernels_moe_shape_t *s,
                                      refit_kernels_moe_tensor_t which, uint8_t *weight,
                                      uint8_t *scale, refit_place_tensor_t *out) {
  REFIT_CHECK(refit_kernels_moe_check_shape(s, NULL, NULL));
  int64_t rows, k;
  refit_kernels_perm_kind_t kind;
  if (!refit_kernels_moe_tensor_dims(s, which, &rows, &k, &kind))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "place: unknown MoE tensor %d",
                     (int)which);
  if (weight == NULL || scale == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "place: MoE %s tensor: NULL storage",
                     which == REFIT_KERNELS_MOE_W13 ? "w13" : "w2");
  *out = (refit_place_tensor_t){REFIT_PLACE_MXFP8, s->num_experts * rows, k,
                                s->num_experts,    (int)kind,
                                rows,              weight, scale};
  return REFIT_OK;
}

refit_status_t refit_place_chunk(const refit_place_tensor_t *t, int64_t row0, int64_t col0,
                                 int64_t rows, int64_t cols, refit_place_chunk_t *out) {
  const char *rule = NULL;
  if (row0 < 0 || col0 < 0 || rows < 1 || cols < 1 || row0 + rows > t->rows ||
      col0 + cols > t->cols)
    rule = "it must lie inside the tensor";
  else if (t->kind == REFIT_PLACE_MXFP8 && (col0 % 32 != 0 || cols % 32 != 0))
    rule = "MXFP8 columns come in whole blocks of 32";
  if (rule != NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "place: chunk rows %lld+%lld, cols %lld+%lld of a [%lld, %lld] "
                     "tensor: %s",
                     (long long)row0, (long long)rows, (long long)col0, (long long)cols,
                     (long long)t->rows, (long long)t->cols, rule);
  const int64_t row_bytes = t->kind == REFIT_PLACE_BF16 ? 2 * cols : cols + cols / 32;
  *out = (refit_place_chunk_t){t, row0, col0, rows, cols, row_bytes};
  return REFIT_OK;
}

uint8_t *refit_place_addr(const refit_place_chunk_t *c, int64_t off, int64_t *run) {
  const refit_place_tensor_t *t = c->t;
  const int64_t r = off / c->row_bytes, b = off % c->row_bytes, R = c->row0 + r;
  int64_t n;
  uint8_t *at;
  if (t->kind == REFIT_PLACE_BF16) {
    n = c->row_bytes - b;
    at = t->values + (R * t->cols + c->col0) * 2 + b;
  } else {
    const int64_t m = t->rows / t->matrices, e = R / m, i = R % m;
    const int64_t j =
        t->perm < 0 ? i
                    : refit_kernels_perm_inverse_index((refit_kernels_perm_kind_t)t->perm,
                                                       t->perm_rows, i);
    if (b < c->cols) {
      n = c->cols - b;
      at = t->values + (e * t->perm_rows + j) * t->cols + c->col0 + b;
    } else {
      const int64_t kp = refit_round_up(t->cols / 32, 4);
      const int64_t s = c->col0 / 32 + (b - c->cols);
      const int64_t left = c->row_bytes - b;
      n = 4 - s % 4 < left ? 4 - s % 4 : left;
      at = t->scales + e * refit_round_up(t->perm_rows, 128) * kp +
           refit_kernels_swizzle_offset(j, s, kp);
    }
  }
  if (run != NULL)
    *run = n;
  return at;
}
