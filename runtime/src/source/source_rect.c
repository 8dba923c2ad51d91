/* What every checkpoint source checks before it reads a rectangle. */
#include "source/source.h"

#include "core/error.h"

void refit_source_f32_units(const uint32_t *words, int64_t col0, int64_t cols,
                            uint16_t *dst) {
  for (int64_t k = 0; k < cols; k++) {
    const uint32_t w = words[(col0 + k) / 2];
    dst[k] = (uint16_t)((col0 + k) % 2 ? w >> 16 : w & 0xffff);
  }
}

refit_status_t refit_source_check_rect(const refit_catalog_t *cat, const char *path,
                                       const refit_src_tensor_t *t, int64_t row0,
                                       int64_t col0, int64_t rows, int64_t cols,
                                       int64_t *index) {
  int64_t i = t - cat->hf;
  if (i < 0 || i >= cat->nhf)
    i = refit_catalog_find_hf(cat, t->name);
  if (i < 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "checkpoint %s: tensor '%s' is not in the catalog", path, t->name);
  if (row0 < 0 || col0 < 0 || rows < 0 || cols < 0 || row0 + rows > t->rows ||
      col0 + cols > t->cols)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "checkpoint %s: '%s' rows [%lld, %lld) cols [%lld, %lld) "
                     "outside its shape [%lld, %lld]",
                     path, t->name, (long long)row0, (long long)(row0 + rows),
                     (long long)col0, (long long)(col0 + cols), (long long)t->rows,
                     (long long)t->cols);
  *index = i;
  return REFIT_OK;
}
