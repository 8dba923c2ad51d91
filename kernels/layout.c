/*
 * Runtime layouts of MXFP8 weights, C reference (see kernels/layout.h).
 *
 * Every layout here is one of two primitives applied to a stack of matrices:
 *   row gather           out[e][j] = in[e][perm[j]] (zero row past the input),
 *   gather-pad-swizzle   the same on scale rows, written in the 128x4 layout.
 * Both walk the OUTPUT sequentially so that every output byte, padding
 * included, is written exactly once and stores stream.
 */
#include "kernels/layout.h"
#include "kernels/mxfp8.h"
#include "kernels/parallel.h"

#include "core/error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define REFIT_NAME(n) ((n) != NULL ? (n) : "<unnamed>")

/* ---- Permutations ------------------------------------------------------ */

static const char *refit_kernels_perm_kind_name(refit_kernels_perm_kind_t k) {
  switch (k) {
  case REFIT_KERNELS_PERM_SRC32:
    return "src32";
  case REFIT_KERNELS_PERM_DST32:
    return "dst32";
  case REFIT_KERNELS_PERM_SRC13:
    return "src13";
  case REFIT_KERNELS_PERM_SWAP13:
    return "swap13";
  }
  return "?";
}

typedef struct refit_kernels_perm_entry {
  struct refit_kernels_perm_entry *next;
  refit_kernels_perm_kind_t kind;
  int64_t rows;
  int32_t *perm;
} refit_kernels_perm_entry_t;

/* Shapes per process are few (a handful per model), so a list suffices. */
static pthread_mutex_t refit_kernels_perm_lock = PTHREAD_MUTEX_INITIALIZER;
static refit_kernels_perm_entry_t *refit_kernels_perm_head = NULL;

static refit_status_t refit_kernels_perm_check(refit_kernels_perm_kind_t kind,
                                               int64_t rows) {
  int64_t mult = kind == REFIT_KERNELS_PERM_SRC13    ? 64
                 : kind == REFIT_KERNELS_PERM_SWAP13 ? 2
                                                     : 32;
  if ((unsigned)kind > REFIT_KERNELS_PERM_SWAP13)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "permutation: unknown kind %d", (int)kind);
  if (rows <= 0 || rows % mult != 0 || rows > INT32_MAX)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "permutation %s: rows = %lld must be a positive multiple "
                     "of %lld (and fit int32)",
                     refit_kernels_perm_kind_name(kind), (long long)rows,
                     (long long)mult);
  return REFIT_OK;
}

refit_status_t refit_kernels_perm_get(refit_kernels_perm_kind_t kind,
                                      int64_t rows, const int32_t **out) {
  REFIT_CHECK(refit_kernels_perm_check(kind, rows));
  refit_status_t status = REFIT_OK;
  refit_kernels_perm_entry_t *e;
  pthread_mutex_lock(&refit_kernels_perm_lock);
  for (e = refit_kernels_perm_head; e != NULL; e = e->next)
    if (e->kind == kind && e->rows == rows)
      goto out;
  e = malloc(sizeof(*e));
  if (e == NULL)
    goto err_no_memory;
  e->perm = malloc((size_t)rows * sizeof(int32_t));
  if (e->perm == NULL)
    goto err_free_entry;
  for (int64_t j = 0; j < rows; j++)
    e->perm[j] = (int32_t)refit_kernels_perm_index(kind, rows, j);
  e->kind = kind;
  e->rows = rows;
  e->next = refit_kernels_perm_head;
  refit_kernels_perm_head = e;
out:
  *out = e->perm;
  pthread_mutex_unlock(&refit_kernels_perm_lock);
  return status;
err_free_entry:
  free(e);
err_no_memory:
  pthread_mutex_unlock(&refit_kernels_perm_lock);
  return REFIT_ERR(REFIT_ERR_NO_MEMORY, "permutation %s: no memory for %lld rows",
                   refit_kernels_perm_kind_name(kind), (long long)rows);
}

refit_status_t refit_kernels_perm_fill_i64(refit_kernels_perm_kind_t kind,
                                           int64_t rows, int64_t *out) {
  const int32_t *perm;
  if (out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "permutation: NULL output");
  REFIT_CHECK(refit_kernels_perm_get(kind, rows, &perm));
  for (int64_t j = 0; j < rows; j++)
    out[j] = perm[j];
  return REFIT_OK;
}

void refit_kernels_perm_cache_clear(void) {
  pthread_mutex_lock(&refit_kernels_perm_lock);
  while (refit_kernels_perm_head != NULL) {
    refit_kernels_perm_entry_t *e = refit_kernels_perm_head;
    refit_kernels_perm_head = e->next;
    free(e->perm);
    free(e);
  }
  pthread_mutex_unlock(&refit_kernels_perm_lock);
}

/* ---- Primitive 1: row gather ------------------------------------------- */

typedef struct {
  const uint8_t *src;
  int64_t src_rows, k;
  const int32_t *perm; /* NULL: identity */
  int64_t out_rows;
  uint8_t *out;
} refit_kernels_gather_job_t;

/* Items are (matrix, output row) pairs flattened: e * out_rows + j. */
static void refit_kernels_gather_range(void *ctx, int64_t begin, int64_t end) {
  const refit_kernels_gather_job_t *g = ctx;
  for (int64_t it = begin; it < end; it++) {
    int64_t e = it / g->out_rows, j = it % g->out_rows;
    int64_t r = g->perm != NULL ? g->perm[j] : j;
    uint8_t *dst = g->out + it * g->k;
    if (r < g->src_rows)
      memcpy(dst, g->src + (e * g->src_rows + r) * g->k, (size_t)g->k);
    else
      memset(dst, 0, (size_t)g->k);
  }
}

static void refit_kernels_gather_rows(const uint8_t *src, int64_t num,
                                      int64_t src_rows, int64_t k,
                                      const int32_t *perm, int64_t out_rows,
                                      uint8_t *out) {
  refit_kernels_gather_job_t g = {src, src_rows, k, perm, out_rows, out};
  refit_kernels_parallel_for(num * out_rows, 2 * k, refit_kernels_gather_range,
                             &g);
}

/* ---- Primitive 2: gather, pad and swizzle scale rows ------------------- */

typedef struct {
  const uint8_t *src;
  int64_t src_rows, cols;
  const int32_t *perm; /* NULL: identity; length round_up(src_rows,128) */
  int64_t tiles;       /* 128-row tiles per matrix */
  int64_t kp;
  uint8_t *out;
} refit_kernels_swizzle_job_t;

/*
 * One item is one 128-row tile of one matrix: 128 * Kp output bytes, written
 * in address order: column group c4 (512 B), then row r%32 (16 B), then row
 * group (r%128)/32 (4 B), then column c%4.
 */
static void refit_kernels_swizzle_range(void *ctx, int64_t begin, int64_t end) {
  const refit_kernels_swizzle_job_t *w = ctx;
  int64_t full = w->cols / 4; /* column groups with 4 real columns */
  for (int64_t it = begin; it < end; it++) {
    int64_t e = it / w->tiles, tile = it % w->tiles;
    const uint8_t *src = w->src + e * w->src_rows * w->cols;
    uint8_t *dst = w->out + it * 128 * w->kp;
    const uint8_t *rowp[128];
    for (int64_t i = 0; i < 128; i++) {
      int64_t j = tile * 128 + i;
      int64_t r = w->perm != NULL ? w->perm[j] : j;
      rowp[i] = r < w->src_rows ? src + r * w->cols : NULL;
    }
    for (int64_t c4 = 0; c4 < w->kp / 4; c4++) {
      for (int64_t r32 = 0; r32 < 32; r32++) {
        for (int64_t rq = 0; rq < 4; rq++) {
          const uint8_t *row = rowp[rq * 32 + r32];
          uint8_t *d = dst + c4 * 512 + r32 * 16 + rq * 4;
          if (row != NULL && c4 < full) {
            memcpy(d, row + c4 * 4, 4);
          } else {
            for (int64_t c = 0; c < 4; c++)
              d[c] = (row != NULL && c4 * 4 + c < w->cols) ? row[c4 * 4 + c] : 0;
          }
        }
      }
    }
  }
}

static void refit_kernels_gather_swizzle(const uint8_t *src, int64_t num,
                                         int64_t src_rows, int64_t cols,
                                         const int32_t *perm, uint8_t *out) {
  refit_kernels_swizzle_job_t w = {src,  src_rows, cols,
                                   perm, refit_round_up(src_rows, 128) / 128,
                                   refit_round_up(cols, 4), out};
  refit_kernels_parallel_for(num * w.tiles, 2 * 128 * w.kp,
                             refit_kernels_swizzle_range, &w);
}

int64_t refit_kernels_swizzle_bytes(int64_t rows, int64_t cols) {
  return refit_round_up(rows, 128) * refit_round_up(cols, 4);
}

refit_status_t refit_kernels_scale_swizzle(const uint8_t *lin, int64_t num,
                                           int64_t rows, int64_t cols,
                                           uint8_t *out) {
  if (lin == NULL || out == NULL || num < 1 || rows < 1 || cols < 1)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "scale swizzle: bad arguments (lin %p, out %p, [%lld, "
                     "%lld, %lld])",
                     (const void *)lin, (void *)out, (long long)num,
                     (long long)rows, (long long)cols);
  refit_kernels_gather_swizzle(lin, num, rows, cols, NULL, out);
  return REFIT_OK;
}

/* ---- MoE --------------------------------------------------------------- */

refit_status_t refit_kernels_moe_check_shape(const refit_kernels_moe_shape_t *s,
                                             const char *name,
                                             refit_kernels_moe_sizes_t *sizes) {
  if (s == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "moe %s: NULL shape",
                     REFIT_NAME(name));
  int64_t E = s->num_experts, H = s->hidden, I = s->intermediate;
  int64_t m13 = s->gated ? 2 * I : I;
  const char *rule = NULL;
  if (E < 1 || H < 1 || I < 1)
    rule = "E, H and I must be positive";
  else if (H % 128 != 0)
    rule = "H % 128 == 0 (w2 rows are shuffled and swizzled in 128-row tiles)";
  else if (I % 32 != 0)
    rule = "I % 32 == 0 (w2 scale blocks run along I)";
  else if (m13 % 128 != 0)
    rule = s->gated ? "2I % 128 == 0 (w13 rows are shuffled in 128-row tiles)"
                    : "I % 128 == 0 (non-gated w13 rows are shuffled in "
                      "128-row tiles)";
  if (rule != NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "moe %s: shape E=%lld H=%lld I=%lld (%s) breaks the "
                     "flashinfer_trtllm MoE rule %s",
                     REFIT_NAME(name), (long long)E, (long long)H, (long long)I,
                     s->gated ? "gated" : "non-gated", rule);
  if (sizes != NULL) {
    sizes->w13_weight = E * m13 * H;
    sizes->w13_weight_scale = E * refit_kernels_swizzle_bytes(m13, H / 32);
    sizes->w2_weight = E * H * I;
    sizes->w2_weight_scale = E * refit_kernels_swizzle_bytes(H, I / 32);
  }
  return REFIT_OK;
}

refit_status_t refit_kernels_moe_transform_tensor(
    const refit_kernels_moe_shape_t *s, refit_kernels_moe_tensor_t which,
    const uint8_t *values, const uint8_t *scales, uint8_t *values_out,
    uint8_t *scales_out) {
  REFIT_CHECK(refit_kernels_moe_check_shape(s, NULL, NULL));
  if (values == NULL || scales == NULL || values_out == NULL ||
      scales_out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "moe %s: NULL buffer",
                     which == REFIT_KERNELS_MOE_W13 ? "w13" : "w2");
  int64_t rows, k;
  refit_kernels_perm_kind_t kind;
  if (!refit_kernels_moe_tensor_dims(s, which, &rows, &k, &kind))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "moe: unknown tensor %d",
                     (int)which);
  const int32_t *perm;
  REFIT_CHECK(refit_kernels_perm_get(kind, rows, &perm));
  refit_kernels_gather_rows(values, s->num_experts, rows, k, perm, rows,
                            values_out);
  refit_kernels_gather_swizzle(scales, s->num_experts, rows, k / 32, perm,
                               scales_out);
  return REFIT_OK;
}

refit_status_t refit_kernels_moe_transform(const refit_kernels_moe_shape_t *s,
                                           const uint8_t *w13,
                                           const uint8_t *w13_scale,
                                           const uint8_t *w2,
                                           const uint8_t *w2_scale,
                                           uint8_t *w13_out,
                                           uint8_t *w13_scale_out,
                                           uint8_t *w2_out,
                                           uint8_t *w2_scale_out) {
  REFIT_CHECK(refit_kernels_moe_transform_tensor(s, REFIT_KERNELS_MOE_W13, w13,
                                                 w13_scale, w13_out,
                                                 w13_scale_out));
  return refit_kernels_moe_transform_tensor(s, REFIT_KERNELS_MOE_W2, w2,
                                            w2_scale, w2_out, w2_scale_out);
}

/* ---- NVFP4 MoE --------------------------------------------------------- */

refit_status_t refit_kernels_nvfp4_moe_check_shape(refit_kernels_moe_backend_t backend,
                                                   const refit_kernels_moe_shape_t *s,
                                                   const char *name) {
  const char *bname = backend == REFIT_KERNELS_MOE_FLASHINFER_TRTLLM   ? "flashinfer_trtllm"
                      : backend == REFIT_KERNELS_MOE_FLASHINFER_CUTLASS ? "flashinfer_cutlass"
                                                                        : NULL;
  if (s == NULL || bname == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "nvfp4 moe %s: NULL shape or backend %d",
                     REFIT_NAME(name), (int)backend);
  const int64_t E = s->num_experts, H = s->hidden, I = s->intermediate;
  const char *rule = NULL;
  if (E < 1 || H < 1 || I < 1 || !s->gated)
    rule = "E, H and I positive, gated w13 ([gate; up])";
  else if (H % 16 != 0)
    rule = "H % 16 == 0 (one E4M3 scale per 16 elements along K of w13)";
  else if (I % 16 != 0)
    rule = "I % 16 == 0 (one E4M3 scale per 16 elements along K of w2)";
  else if ((2 * I) % 128 != 0)
    rule = backend == REFIT_KERNELS_MOE_FLASHINFER_TRTLLM
               ? "2I % 128 == 0 (shuffle_matrix_sf_a's 128-row tiles; vLLM pads I "
                 "to a multiple of 64 otherwise, which refit does not)"
               : "2I % 128 == 0 (vLLM raises for a gated w13 whose swizzled scale "
                 "rows need padding)";
  else if (backend == REFIT_KERNELS_MOE_FLASHINFER_TRTLLM && H % 256 != 0)
    rule = "H % 256 == 0 (vLLM pads the experts' hidden size to 256 for the TRTLLM "
           "NVFP4 MoE kernels otherwise, which refit does not)";
  if (rule != NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s: experts [E=%lld, H=%lld, I=%lld] cannot use NVFP4 MoE backend "
                     "%s: needs %s",
                     REFIT_NAME(name), (long long)E, (long long)H, (long long)I, bname,
                     rule);
  return REFIT_OK;
}

refit_status_t refit_kernels_nvfp4_moe_transform(refit_kernels_moe_backend_t backend,
                                                 const refit_kernels_moe_shape_t *s,
                                                 refit_kernels_moe_tensor_t which,
                                                 const uint8_t *packed, const uint8_t *lin,
                                                 uint8_t *w_out, uint8_t *s_out) {
  REFIT_CHECK(refit_kernels_nvfp4_moe_check_shape(backend, s, NULL));
  int64_t rows, k;
  refit_kernels_perm_kind_t unused;
  if (!refit_kernels_moe_tensor_dims(s, which, &rows, &k, &unused))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "nvfp4 moe: unknown tensor %d", (int)which);
  if (packed == NULL || lin == NULL || w_out == NULL || s_out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "nvfp4 moe %s: NULL buffer",
                     which == REFIT_KERNELS_MOE_W13 ? "w13" : "w2");
  int kind;
  const int32_t *perm = NULL;
  refit_kernels_nvfp4_moe_perm(backend, which, &kind);
  if (kind >= 0)
    REFIT_CHECK(refit_kernels_perm_get((refit_kernels_perm_kind_t)kind, rows, &perm));
  refit_kernels_gather_rows(packed, s->num_experts, rows, (k + 1) / 2, perm, rows, w_out);
  refit_kernels_gather_swizzle(lin, s->num_experts, rows, (k + 15) / 16, perm, s_out);
  return REFIT_OK;
}

/* ---- Dense ------------------------------------------------------------- */

static const char *const refit_kernels_dense_names[] = {
#define REFIT_KERNELS_DENSE_NAME_(name, text) text,
    REFIT_KERNELS_DENSE_BACKEND_MAP(REFIT_KERNELS_DENSE_NAME_)
#undef REFIT_KERNELS_DENSE_NAME_
};

const char *refit_kernels_dense_backend_name(refit_kernels_dense_backend_t b) {
  return (unsigned)b < REFIT_KERNELS_DENSE_COUNT ? refit_kernels_dense_names[b]
                                                 : "?";
}

refit_status_t refit_kernels_dense_backend_parse(
    const char *text, refit_kernels_dense_backend_t *out) {
  for (int b = 0; text != NULL && b < REFIT_KERNELS_DENSE_COUNT; b++) {
    if (strcmp(text, refit_kernels_dense_names[b]) == 0) {
      *out = (refit_kernels_dense_backend_t)b;
      return REFIT_OK;
    }
  }
  return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                   "unknown dense MXFP8 backend '%s' (expected "
                   "flashinfer_cutlass, flashinfer_cutedsl or flashinfer_trtllm)",
                   text != NULL ? text : "(null)");
}

refit_status_t refit_kernels_check_shape(refit_kernels_dense_backend_t backend,
                                         const char *name, int64_t n,
                                         int64_t k) {
  const char *rule = NULL;
  if ((unsigned)backend >= REFIT_KERNELS_DENSE_COUNT)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s: unknown dense MXFP8 backend %d", REFIT_NAME(name),
                     (int)backend);
  if (n < 1 || k < 1)
    rule = "N >= 1 and K >= 1";
  else if (k % 32 != 0)
    rule = "K % 32 == 0 (one scale per 32-element block along K)";
  else if (backend == REFIT_KERNELS_DENSE_FLASHINFER_TRTLLM && k % 256 != 0)
    rule = "K % 256 == 0 (flashinfer_trtllm dense GEMM)";
  if (rule != NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s: weight [N=%lld, K=%lld] cannot use MXFP8 backend %s: "
                     "needs %s",
                     REFIT_NAME(name), (long long)n, (long long)k,
                     refit_kernels_dense_backend_name(backend), rule);
  return REFIT_OK;
}

refit_status_t refit_kernels_dense_sizes(refit_kernels_dense_backend_t backend,
                                         int64_t n, int64_t k,
                                         int64_t *weight_bytes,
                                         int64_t *scale_bytes) {
  REFIT_CHECK(refit_kernels_check_shape(backend, NULL, n, k));
  int perm;
  const int64_t rows = refit_kernels_dense_rows(backend, n, &perm);
  if (weight_bytes != NULL)
    *weight_bytes = rows * k;
  if (scale_bytes != NULL)
    *scale_bytes = refit_kernels_swizzle_bytes(n, k / 32);
  return REFIT_OK;
}

refit_status_t refit_kernels_dense_transform(
    refit_kernels_dense_backend_t backend, int64_t n, int64_t k,
    const uint8_t *q, const uint8_t *scale, uint8_t *weight_out,
    uint8_t *scale_out) {
  REFIT_CHECK(refit_kernels_check_shape(backend, NULL, n, k));
  if (q == NULL || scale == NULL || weight_out == NULL || scale_out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "dense %s transform: NULL buffer",
                     refit_kernels_dense_backend_name(backend));
  const int32_t *perm = NULL;
  int kind;
  const int64_t rows = refit_kernels_dense_rows(backend, n, &kind);
  if (kind >= 0)
    REFIT_CHECK(refit_kernels_perm_get((refit_kernels_perm_kind_t)kind, rows, &perm));
  /* cutlass and cutedsl keep the weight bytes: the gather is then a copy. */
  refit_kernels_gather_rows(q, 1, n, k, perm, rows, weight_out);
  refit_kernels_gather_swizzle(scale, 1, n, k / 32, perm, scale_out);
  return REFIT_OK;
}
