#include "device/memory.h"

#include "core/error.h"
#include "kernels/delta.h"
#include "kernels/fp8_block.h"
#include "kernels/layout.h"
#include "kernels/nvfp4.h"
#include "kernels/mxfp8.h"

#include <stdlib.h>
#include <string.h>

#ifdef REFIT_HAVE_CUDA
#include "device/device.h"
#include "device/device_share.h"
#include "kernels/datapath_cuda.h"
#include "kernels/delta_cuda.h"
#include "kernels/direct_cuda.h"
#include "kernels/fp8_block_cuda.h"
#include "kernels/nvfp4_cuda.h"
#include "kernels/mxfp8_cuda.h"
#include "kernels/place_cuda.h"
#endif

struct refit_mem {
  int device;
  /* Land runs: the result of run r (relative bad index or -1), its first
   * table index. */
  int64_t *run_bad, *run_first, runs_cap;
#ifdef REFIT_HAVE_CUDA
  int64_t *run_bad_device;
#endif
#ifdef REFIT_HAVE_CUDA
  cudaStream_t stream;
  cudaEvent_t order; /* orders refit's stream with a caller's stream */
  int64_t *scratch;  /* device: bad chunk, count, first */
  /* The delta codec's tables and workspace (grown on demand): `dbuf` holds
   * the descriptor table, then the lengths or the gather table, then the
   * workspace; `dhost` is its host image of the tables. */
  void *dbuf, *dhost;
  size_t dbuf_bytes, dhost_bytes;
  /* The place apply's last check (refit_mem_place_check): its chunks and
   * tiles, and where its outputs lie in dbuf (chunks, tiles, outputs, then
   * the error key and the undo counter). */
  int64_t place_n, place_tiles;
  size_t place_tiles_off, place_outs_off, place_err_off;
#endif
};

int refit_mem_gpu_count(void) {
#ifdef REFIT_HAVE_CUDA
  int n = 0;
  if (refit_device_count(&n) != REFIT_OK)
    return 0;
  return n;
#else
  return 0;
#endif
}

int refit_mem_on_device(const refit_mem_t *m) { return m->device; }

int refit_mem_device_ordinal(const refit_mem_t *m) {
  int dev = -1;
#ifdef REFIT_HAVE_CUDA
  if (m->device && cudaGetDevice(&dev) != cudaSuccess)
    dev = -1;
#endif
  (void)m;
  return dev;
}

refit_status_t refit_mem_after_stream(refit_mem_t *m, void *stream) {
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    REFIT_CUDA_CHECK(cudaEventRecord(m->order, (cudaStream_t)stream));
    REFIT_CUDA_CHECK(cudaStreamWaitEvent(m->stream, m->order, 0));
  }
#endif
  (void)m;
  (void)stream;
  return REFIT_OK;
}

refit_status_t refit_mem_before_stream(refit_mem_t *m, void *stream) {
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    REFIT_CUDA_CHECK(cudaEventRecord(m->order, m->stream));
    REFIT_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)stream, m->order, 0));
  }
#endif
  (void)m;
  (void)stream;
  return REFIT_OK;
}

refit_status_t refit_mem_create(int device, refit_mem_t **out) {
  refit_mem_t *m = calloc(1, sizeof(*m));
  if (m == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "memory context");
  m->device = device;
#ifdef REFIT_HAVE_CUDA
  if (device) {
    refit_status_t st = refit_device_stream_create(&m->stream);
    if (st == REFIT_OK)
      st = refit_device_event_create(&m->order);
    if (st == REFIT_OK)
      st = refit_device_alloc((void **)&m->scratch, 4 * sizeof(int64_t));
    if (st != REFIT_OK) {
      refit_mem_destroy(m);
      return st;
    }
  }
#else
  if (device) {
    free(m);
    return REFIT_ERR(REFIT_ERR_NOT_AVAILABLE,
                     "device memory requested but this refit was built without "
                     "CUDA (configure with -DREFIT_CUDA=ON)");
  }
#endif
  *out = m;
  return REFIT_OK;
}

void refit_mem_destroy(refit_mem_t *m) {
  if (m == NULL)
    return;
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    if (m->stream != NULL) {
      cudaStreamSynchronize(m->stream);
      refit_device_stream_destroy(m->stream);
    }
    if (m->order != NULL)
      refit_device_event_destroy(m->order);
    refit_device_free(m->scratch);
    refit_device_free(m->run_bad_device);
    refit_device_free(m->dbuf);
    free(m->dhost);
  }
#endif
  free(m->run_bad);
  free(m->run_first);
  free(m);
}

refit_status_t refit_mem_alloc(refit_mem_t *m, size_t bytes, void **ptr) {
  (void)m;
  if (bytes == 0)
    bytes = 1;
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    REFIT_CHECK(refit_device_alloc(ptr, bytes));
    /* Defined contents before the first refit, as on the host. */
    REFIT_CUDA_CHECK(cudaMemset(*ptr, 0, bytes));
    return REFIT_OK;
  }
#endif
  *ptr = calloc(1, bytes);
  if (*ptr == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "%zu bytes of host memory", bytes);
  return REFIT_OK;
}

int refit_mem_usable(refit_mem_t *m, const void *ptr) {
#ifdef REFIT_HAVE_CUDA
  struct cudaPointerAttributes a;
  int dev = -1;
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    (void)cudaGetLastError(); /* plain host memory on older drivers */
    return !m->device;
  }
  if (!m->device)
    return a.type != cudaMemoryTypeDevice;
  cudaGetDevice(&dev);
  return a.type == cudaMemoryTypeDevice && a.device == dev;
#else
  (void)m;
  (void)ptr;
  return 1;
#endif
}

refit_status_t refit_mem_alloc_shared(refit_mem_t *m, size_t bytes, void **ptr) {
#ifdef REFIT_HAVE_CUDA
  if (m->device && refit_share_alloc(ptr, bytes ? bytes : 1) == REFIT_OK) {
    REFIT_CUDA_CHECK(cudaMemset(*ptr, 0, bytes)); /* as refit_mem_alloc */
    return REFIT_OK;
  }
  if (m->device)
    REFIT_INFO("%s; cudaMalloc instead (generators then read it through CUDA IPC, slower)",
               refit_last_error());
#endif
  return refit_mem_alloc(m, bytes, ptr);
}

void refit_mem_free(refit_mem_t *m, void *ptr) {
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    if (!refit_share_free(ptr))
      refit_device_free(ptr);
    return;
  }
#endif
  (void)m;
  free(ptr);
}

refit_status_t refit_mem_copy(refit_mem_t *m, void *dst, const void *src,
                              size_t bytes) {
#ifdef REFIT_HAVE_CUDA
  if (m->device)
    return refit_device_memcpy_async(dst, src, bytes, m->stream);
#endif
  (void)m;
  memcpy(dst, src, bytes);
  return REFIT_OK;
}

refit_status_t refit_mem_zero(refit_mem_t *m, void *dst, size_t bytes) {
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    REFIT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, m->stream));
    return REFIT_OK;
  }
#endif
  (void)m;
  memset(dst, 0, bytes);
  return REFIT_OK;
}

refit_status_t refit_mem_sync(refit_mem_t *m) {
#ifdef REFIT_HAVE_CUDA
  if (m->device)
    REFIT_CUDA_CHECK(cudaStreamSynchronize(m->stream));
#endif
  (void)m;
  return REFIT_OK;
}

refit_status_t refit_mem_done(refit_mem_t *m, int *done) {
  *done = 1;
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    cudaError_t e = cudaStreamQuery(m->stream);
    if (e == cudaErrorNotReady) {
      *done = 0;
      return REFIT_OK;
    }
    REFIT_CUDA_CHECK(e);
  }
#endif
  (void)m;
  return REFIT_OK;
}

refit_status_t refit_mem_to_host(refit_mem_t *m, void *host, const void *src,
                                 size_t bytes) {
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    REFIT_CHECK(refit_device_memcpy_async(host, src, bytes, m->stream));
    return refit_mem_sync(m);
  }
#endif
  (void)m;
  memcpy(host, src, bytes);
  return REFIT_OK;
}

refit_status_t refit_mem_from_host(refit_mem_t *m, void *dst, const void *host,
                                   size_t bytes) {
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    REFIT_CHECK(refit_device_memcpy_async(dst, host, bytes, m->stream));
    return refit_mem_sync(m);
  }
#endif
  (void)m;
  memcpy(dst, host, bytes);
  return REFIT_OK;
}

refit_status_t refit_mem_table_upload(refit_mem_t *m, refit_mem_table_t *t,
                                      size_t elem_bytes) {
  t->device = NULL;
#ifdef REFIT_HAVE_CUDA
  if (m->device && t->count > 0) {
    REFIT_CHECK(refit_device_alloc(&t->device, (size_t)t->count * elem_bytes));
    return refit_mem_from_host(m, t->device, t->host, (size_t)t->count * elem_bytes);
  }
#endif
  (void)m;
  (void)elem_bytes;
  return REFIT_OK;
}

refit_status_t refit_mem_table_refresh(refit_mem_t *m, refit_mem_table_t *t,
                                       size_t elem_bytes) {
  if (t->device == NULL)
    return REFIT_OK;
  return refit_mem_from_host(m, t->device, t->host, (size_t)t->count * elem_bytes);
}

void refit_mem_table_free(refit_mem_t *m, refit_mem_table_t *t) {
#ifdef REFIT_HAVE_CUDA
  if (m->device && t->device != NULL)
    refit_device_free(t->device);
#endif
  (void)m;
  free(t->host);
  t->host = NULL;
  t->device = NULL;
  t->count = 0;
}

refit_status_t refit_mem_pack(refit_mem_t *m, const refit_mem_table_t *t,
                              int64_t first, int64_t n, uint64_t tag, void *buf) {
  if (n == 0)
    return REFIT_OK;
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    /* Block FP8 chunks first (the CUDA twin of the quantizer), then every
     * chunk's rows and seals in the batched kernel. */
    REFIT_CHECK(refit_pack_blocks_cuda((const refit_pack_desc_t *)t->host + first, n, buf,
                                       m->stream));
    return refit_pack_rows_cuda((const refit_pack_desc_t *)t->device + first, n, tag,
                                buf, m->stream);
  }
#endif
  (void)m;
  return refit_pack_rows((const refit_pack_desc_t *)t->host + first, n, tag, buf);
}

refit_status_t refit_mem_land_reserve(refit_mem_t *m, int64_t runs) {
  if (runs <= m->runs_cap)
    return REFIT_OK;
  int64_t *bad = realloc(m->run_bad, (size_t)runs * sizeof(*bad));
  if (bad != NULL)
    m->run_bad = bad;
  int64_t *first = realloc(m->run_first, (size_t)runs * sizeof(*first));
  if (first != NULL)
    m->run_first = first;
  if (bad == NULL || first == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "land results for %lld runs", (long long)runs);
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    refit_device_free(m->run_bad_device);
    m->run_bad_device = NULL;
    REFIT_CHECK(refit_device_alloc((void **)&m->run_bad_device,
                                   (size_t)runs * sizeof(int64_t)));
  }
#endif
  m->runs_cap = runs;
  return REFIT_OK;
}

/* A run's result slot: its first descriptor, no bad chunk yet (on the
 * device too, in stream order, when n > 0). */
static refit_status_t refit_mem_run_slot(refit_mem_t *m, int64_t first, int64_t n,
                                         int64_t run) {
  if (run >= m->runs_cap)
    return REFIT_ERR(REFIT_ERR_INTERNAL, "land run %lld beyond the %lld reserved",
                     (long long)run, (long long)m->runs_cap);
  m->run_first[run] = first;
  m->run_bad[run] = -1;
#ifdef REFIT_HAVE_CUDA
  if (m->device && n > 0)
    return refit_device_memcpy_async(m->run_bad_device + run, &m->run_bad[run],
                                     sizeof(int64_t), m->stream);
#else
  (void)n;
#endif
  return REFIT_OK;
}

refit_status_t refit_mem_land_run(refit_mem_t *m, const refit_mem_table_t *t,
                                  int64_t first, int64_t n, uint64_t tag,
                                  const void *staging, int64_t run) {
  REFIT_CHECK(refit_mem_run_slot(m, first, n, run));
  if (n == 0)
    return REFIT_OK;
#ifdef REFIT_HAVE_CUDA
  if (m->device)
    return refit_land_rows_cuda((const refit_land_desc_t *)t->device + first, n, tag,
                                staging, m->run_bad_device + run, m->stream);
#endif
  return refit_land_rows((const refit_land_desc_t *)t->host + first, n, tag, staging,
                         &m->run_bad[run]);
}

refit_status_t refit_mem_land_collect(refit_mem_t *m, int64_t runs,
                                      int64_t *bad_chunk) {
  *bad_chunk = -1;
#ifdef REFIT_HAVE_CUDA
  if (m->device && runs > 0)
    REFIT_CHECK(refit_mem_to_host(m, m->run_bad, m->run_bad_device,
                                  (size_t)runs * sizeof(int64_t)));
#endif
  for (int64_t r = 0; r < runs; r++)
    if (m->run_bad[r] >= 0) {
      *bad_chunk = m->run_first[r] + m->run_bad[r];
      break;
    }
  return REFIT_OK;
}

refit_status_t refit_mem_direct_run(refit_mem_t *m, const refit_mem_table_t *t,
                                    int64_t first, int64_t n, uint64_t tag, void *digests,
                                    void *acc, int64_t run) {
  if (run >= 0)
    REFIT_CHECK(refit_mem_run_slot(m, first, n, run));
  if (n == 0)
    return REFIT_OK;
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    REFIT_CHECK(refit_direct_rows_cuda((const refit_direct_desc_t *)t->device + first, n, tag,
                                       digests, acc,
                                       run >= 0 ? m->run_bad_device + run : NULL, m->stream));
    /* Block FP8 chunks: the tiles above read them for their digests; their
     * values and scales come from the block quantizer. */
    return refit_direct_blocks_cuda((const refit_direct_desc_t *)t->host + first,
                                    (const refit_direct_desc_t *)t->device + first, n,
                                    m->stream);
  }
#endif
  (void)acc;
  return refit_direct_rows((const refit_direct_desc_t *)t->host + first, n, tag, digests,
                           run >= 0 ? &m->run_bad[run] : NULL);
}

refit_status_t refit_mem_quantize_rows(refit_mem_t *m, const uint16_t *src,
                                       int64_t rows, int64_t k, uint8_t *q,
                                       uint8_t *scale) {
#ifdef REFIT_HAVE_CUDA
  if (m->device)
    return refit_mxfp8_quantize_rows_cuda(src, rows, k, k, q, k, scale, k / 32,
                                          m->stream);
#endif
  (void)m;
  return refit_mxfp8_quantize_rows(src, rows, k, k, q, k, scale, k / 32);
}

refit_status_t refit_mem_fp8_block_quantize(refit_mem_t *m, const uint16_t *src,
                                            int64_t rows, int64_t k, int64_t src_stride,
                                            int mode, uint8_t *q, int64_t q_stride,
                                            float *scale_inv, int64_t scale_stride) {
#ifdef REFIT_HAVE_CUDA
  if (m->device)
    return refit_fp8_block_quantize_cuda(src, rows, k, src_stride,
                                         (refit_fp8_scale_t)mode, q, q_stride, scale_inv,
                                         scale_stride, m->stream);
#endif
  (void)m;
  return refit_fp8_block_quantize(src, rows, k, src_stride, (refit_fp8_scale_t)mode, q,
                                  q_stride, scale_inv, scale_stride);
}

refit_status_t refit_mem_fp8_block_dequantize(refit_mem_t *m, const uint8_t *q,
                                              int64_t rows, int64_t k, int64_t q_stride,
                                              const float *scale_inv, int64_t scale_stride,
                                              uint16_t *out, int64_t out_stride) {
#ifdef REFIT_HAVE_CUDA
  if (m->device)
    return refit_fp8_block_dequantize_cuda(q, rows, k, q_stride, scale_inv, scale_stride,
                                           out, out_stride, m->stream);
#endif
  (void)m;
  return refit_fp8_block_dequantize(q, rows, k, q_stride, scale_inv, scale_stride, out,
                                    out_stride);
}

refit_status_t refit_mem_nvfp4_quantize(refit_mem_t *m, const uint16_t *src,
                                        int64_t groups, int64_t rows, int64_t k,
                                        const float *gsf, uint8_t *q, uint8_t *sf,
                                        float *decode) {
#ifdef REFIT_HAVE_CUDA
  if (m->device)
    return refit_nvfp4_quantize_groups_cuda(src, groups, rows, k, k, gsf, q,
                                            refit_nvfp4_row_bytes(k), sf,
                                            refit_nvfp4_scale_cols(k), decode, m->stream);
#endif
  (void)m;
  return refit_nvfp4_quantize_groups(src, groups, rows, k, k, gsf, q,
                                     refit_nvfp4_row_bytes(k), sf,
                                     refit_nvfp4_scale_cols(k), decode);
}

refit_status_t refit_mem_scale_swizzle(refit_mem_t *m, const uint8_t *lin, int64_t num,
                                       int64_t rows, int64_t cols, uint8_t *out) {
#ifdef REFIT_HAVE_CUDA
  if (m->device)
    return refit_kernels_scale_swizzle_cuda(lin, num, rows, cols, out, m->stream);
#endif
  (void)m;
  return refit_kernels_scale_swizzle(lin, num, rows, cols, out);
}

refit_status_t refit_mem_amax_merge(refit_mem_t *m, refit_nvfp4_amax_desc_t *descs,
                                    int64_t n) {
  refit_status_t st = REFIT_OK;
  const int64_t tiles = refit_nvfp4_amax_number(descs, n, &st);
  REFIT_CHECK(st);
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    if (tiles == 0)
      return REFIT_OK;
    void *table = NULL;
    const size_t bytes = (size_t)n * sizeof(*descs);
    REFIT_CHECK(refit_device_alloc(&table, bytes));
    st = refit_mem_from_host(m, table, descs, bytes);
    if (st == REFIT_OK)
      st = refit_nvfp4_amax_keys_cuda(table, n, tiles, m->stream);
    if (st == REFIT_OK)
      st = refit_mem_sync(m);
    refit_device_free(table);
    return st;
  }
#endif
  (void)m;
  (void)tiles;
  return refit_nvfp4_amax_keys(descs, n);
}

refit_status_t refit_mem_dense_transform(refit_mem_t *m,
                                         refit_kernels_dense_backend_t backend,
                                         int64_t n, int64_t k, const uint8_t *q,
                                         const uint8_t *scale, uint8_t *w_out,
                                         uint8_t *s_out) {
#ifdef REFIT_HAVE_CUDA
  if (m->device)
    return refit_kernels_dense_transform_cuda(backend, n, k, q, scale, w_out,
                                              s_out, m->stream);
#endif
  (void)m;
  return refit_kernels_dense_transform(backend, n, k, q, scale, w_out, s_out);
}

refit_status_t refit_mem_moe_transform(refit_mem_t *m,
                                       const refit_kernels_moe_shape_t *shape,
                                       refit_kernels_moe_tensor_t which,
                                       const uint8_t *q, const uint8_t *scale,
                                       uint8_t *w_out, uint8_t *s_out) {
#ifdef REFIT_HAVE_CUDA
  if (m->device)
    return refit_kernels_moe_transform_tensor_cuda(shape, which, q, scale, w_out,
                                                   s_out, m->stream);
#endif
  (void)m;
  return refit_kernels_moe_transform_tensor(shape, which, q, scale, w_out, s_out);
}

refit_status_t refit_mem_nvfp4_moe_transform(refit_mem_t *m,
                                             refit_kernels_moe_backend_t backend,
                                             const refit_kernels_moe_shape_t *shape,
                                             refit_kernels_moe_tensor_t which,
                                             const uint8_t *packed, const uint8_t *lin,
                                             uint8_t *w_out, uint8_t *s_out) {
#ifdef REFIT_HAVE_CUDA
  if (m->device)
    return refit_kernels_nvfp4_moe_transform_cuda(backend, shape, which, packed, lin,
                                                  w_out, s_out, m->stream);
#endif
  (void)m;
  return refit_kernels_nvfp4_moe_transform(backend, shape, which, packed, lin, w_out,
                                           s_out);
}

refit_status_t refit_mem_synth_rect(refit_mem_t *m, const refit_synth_key_t *key,
                                    int64_t tensor_cols, int64_t row0, int64_t col0,
                                    int64_t rows, int64_t cols, uint16_t *dst) {
#ifdef REFIT_HAVE_CUDA
  if (m->device)
    return refit_synth_rect_cuda(key, tensor_cols, row0, col0, rows, cols, dst,
                                 m->stream);
#endif
  (void)m;
  refit_synth_rect(key, tensor_cols, row0, col0, rows, cols, dst);
  return REFIT_OK;
}

refit_status_t refit_mem_synth_rows(refit_mem_t *m, const refit_synth_key_t *keys,
                                    const int64_t *bases, int64_t rows, int64_t cols,
                                    uint16_t *dst) {
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    /* The row tables travel once per tensor; small next to the tensor. */
    const size_t kb = (size_t)rows * sizeof(*keys), bb = (size_t)rows * sizeof(*bases);
    unsigned char *d = NULL;
    refit_status_t st = refit_device_alloc((void **)&d, kb + bb);
    if (st != REFIT_OK)
      return st;
    st = refit_device_memcpy_async(d, keys, kb, m->stream);
    if (st == REFIT_OK)
      st = refit_device_memcpy_async(d + kb, bases, bb, m->stream);
    if (st == REFIT_OK)
      st = refit_synth_rows_cuda((const refit_synth_key_t *)d, (const int64_t *)(d + kb),
                                 rows, cols, dst, m->stream);
    if (st == REFIT_OK)
      st = refit_mem_sync(m);
    refit_device_free(d);
    return st;
  }
#endif
  (void)m;
  refit_synth_rows(keys, bases, rows, cols, dst);
  return REFIT_OK;
}

refit_status_t refit_mem_compare(refit_mem_t *m, const void *a, const void *b,
                                 size_t bytes, size_t elem, int64_t *count,
                                 int64_t *first) {
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    const int64_t init[2] = {0, INT64_MAX};
    int64_t out[2];
    REFIT_CHECK(refit_device_memcpy_async(m->scratch + 1, init, sizeof(init),
                                          m->stream));
    REFIT_CHECK(refit_compare_cuda(a, b, bytes, elem, m->scratch + 1,
                                   m->scratch + 2, m->stream));
    REFIT_CHECK(refit_mem_to_host(m, out, m->scratch + 1, sizeof(out)));
    *count = out[0];
    *first = out[1];
    return REFIT_OK;
  }
#endif
  (void)m;
  return refit_compare(a, b, bytes, elem, count, first);
}

/* ---- Delta codec, gather, pinned memory (delta refits) ------------------- */

#ifdef REFIT_HAVE_CUDA
/* Room for `dev` bytes of device tables and workspace and `host` bytes of
 * their host image. */
static refit_status_t refit_mem_delta_room(refit_mem_t *m, size_t dev, size_t host) {
  if (dev > m->dbuf_bytes) {
    REFIT_CHECK(refit_mem_sync(m));
    refit_device_free(m->dbuf);
    m->dbuf = NULL;
    m->dbuf_bytes = 0;
    REFIT_CHECK(refit_device_alloc(&m->dbuf, dev));
    m->dbuf_bytes = dev;
  }
  if (host > m->dhost_bytes) {
    void *h = realloc(m->dhost, host);
    if (h == NULL)
      return REFIT_ERR(REFIT_ERR_NO_MEMORY, "delta tables of %zu bytes", host);
    m->dhost = h;
    m->dhost_bytes = host;
  }
  return REFIT_OK;
}

static size_t refit_mem_align16(size_t n) { return (n + 15) & ~(size_t)15; }

/* The chunks' bytes in all (the codec's workspace grows with them). */
static uint64_t refit_mem_delta_total(const refit_mem_delta_t *chunks, int64_t n) {
  uint64_t total = 0;
  for (int64_t i = 0; i < n; i++)
    total += chunks[i].bytes;
  return total;
}
#endif

refit_status_t refit_mem_delta_encode(refit_mem_t *m, const refit_mem_delta_t *chunks,
                                      int64_t n, void *out, uint64_t *lens) {
  if (n <= 0)
    return REFIT_OK;
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    const size_t tab = refit_mem_align16((size_t)n * sizeof(refit_delta_cuda_enc_desc_t));
    const size_t len = refit_mem_align16((size_t)n * sizeof(uint64_t));
    const size_t err = 16;
    const size_t ws = refit_delta_cuda_workspace(n, refit_mem_delta_total(chunks, n));
    REFIT_CHECK(refit_mem_delta_room(m, tab + len + err + ws, tab));
    refit_delta_cuda_enc_desc_t *d = m->dhost;
    for (int64_t i = 0; i < n; i++)
      d[i] = (refit_delta_cuda_enc_desc_t){.new_bytes = chunks[i].now,
                                           .base = chunks[i].base,
                                           .bytes = chunks[i].bytes,
                                           .out_off = chunks[i].off,
                                           .cap = refit_delta_bound(chunks[i].bytes)};
    unsigned char *dev = m->dbuf;
    REFIT_CHECK(refit_device_memcpy_async(dev, d, (size_t)n * sizeof(*d), m->stream));
    REFIT_CHECK(refit_delta_encode_cuda((const refit_delta_cuda_enc_desc_t *)dev, n,
                                        REFIT_DELTA_AUTO, out, (uint64_t *)(dev + tab),
                                        dev + tab + len + err, ws,
                                        (int64_t *)(dev + tab + len),
                                        (int32_t *)(dev + tab + len + 8), m->stream));
    int64_t bad[2] = {0, 0};
    REFIT_CHECK(refit_device_memcpy_async(lens, dev + tab, (size_t)n * sizeof(uint64_t),
                                          m->stream));
    REFIT_CHECK(refit_mem_to_host(m, bad, dev + tab + len, sizeof(bad)));
    return refit_delta_cuda_report("delta encode", bad[0], (int32_t)bad[1]);
  }
#endif
  (void)m;
  for (int64_t i = 0; i < n; i++) {
    size_t got = 0;
    REFIT_CHECK(refit_delta_encode(chunks[i].now, chunks[i].base, chunks[i].bytes,
                                   REFIT_DELTA_AUTO, (unsigned char *)out + chunks[i].off,
                                   refit_delta_bound(chunks[i].bytes), &got, NULL));
    lens[i] = got;
  }
  return REFIT_OK;
}

refit_status_t refit_mem_delta_apply(refit_mem_t *m, const refit_mem_delta_t *chunks,
                                     int64_t n, const void *out, const uint64_t *lens) {
  if (n <= 0)
    return REFIT_OK;
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    const size_t tab = refit_mem_align16((size_t)n * sizeof(refit_delta_cuda_dec_desc_t));
    const size_t err = 16;
    const size_t ws = refit_delta_cuda_workspace(n, refit_mem_delta_total(chunks, n));
    REFIT_CHECK(refit_mem_delta_room(m, tab + err + ws, tab));
    refit_delta_cuda_dec_desc_t *d = m->dhost;
    for (int64_t i = 0; i < n; i++)
      d[i] = (refit_delta_cuda_dec_desc_t){.delta = (const unsigned char *)out + chunks[i].off,
                                           .delta_len = lens[i],
                                           .dst = chunks[i].base,
                                           .dst_bytes = chunks[i].bytes};
    unsigned char *dev = m->dbuf;
    REFIT_CHECK(refit_device_memcpy_async(dev, d, (size_t)n * sizeof(*d), m->stream));
    REFIT_CHECK(refit_delta_apply_cuda((const refit_delta_cuda_dec_desc_t *)dev, n,
                                       dev + tab + err, ws, (int64_t *)(dev + tab),
                                       (int32_t *)(dev + tab + 8), m->stream));
    int64_t bad[2] = {0, 0};
    REFIT_CHECK(refit_mem_to_host(m, bad, dev + tab, sizeof(bad)));
    return refit_delta_cuda_report("delta apply", bad[0], (int32_t)bad[1]);
  }
#endif
  (void)m;
  for (int64_t i = 0; i < n; i++)
    REFIT_CHECK(refit_delta_decode((const unsigned char *)out + chunks[i].off, lens[i],
                                   chunks[i].base, chunks[i].bytes));
  return REFIT_OK;
}

refit_status_t refit_mem_place_check(refit_mem_t *m, const refit_place_cuda_chunk_t *chunks,
                                     const void *const *host_bytes, int64_t n,
                                     refit_place_cuda_out_t *outs, int64_t *bad_chunk) {
  *bad_chunk = -1;
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    m->place_n = m->place_tiles = 0;
    if (n <= 0)
      return REFIT_OK;
    int64_t ntiles = 0;
    for (int64_t i = 0; i < n; i++) {
      int64_t t = 0;
      refit_status_t st = refit_place_cuda_tiles(&chunks[i], i, host_bytes[i], NULL, &t);
      if (st != REFIT_OK) {
        *bad_chunk = i;
        return st;
      }
      ntiles += t;
    }
    const size_t ctab = refit_mem_align16((size_t)n * sizeof(*chunks));
    const size_t ttab = refit_mem_align16((size_t)ntiles * sizeof(refit_place_cuda_tile_t));
    const size_t otab = refit_mem_align16((size_t)n * sizeof(*outs));
    REFIT_CHECK(refit_mem_delta_room(m, ctab + ttab + otab + 16, ctab + ttab + otab + 16));
    unsigned char *h = m->dhost, *dev = m->dbuf;
    memcpy(h, chunks, (size_t)n * sizeof(*chunks));
    refit_place_cuda_tile_t *tiles = (refit_place_cuda_tile_t *)(h + ctab);
    for (int64_t i = 0, at = 0; i < n; i++) {
      int64_t t = 0;
      REFIT_CHECK(refit_place_cuda_tiles(&chunks[i], i, host_bytes[i], tiles + at, &t));
      at += t;
    }
    refit_place_cuda_out_t *o = (refit_place_cuda_out_t *)(h + ctab + ttab);
    for (int64_t i = 0; i < n; i++)
      o[i] = (refit_place_cuda_out_t){.trailer = chunks[i].old_trailer};
    memset(h + ctab + ttab + otab, 0xff, 8); /* no error */
    memset(h + ctab + ttab + otab + 8, 0, 8);
    REFIT_CHECK(
        refit_device_memcpy_async(dev, h, ctab + ttab + otab + 16, m->stream));
    REFIT_CHECK(refit_place_check_cuda((const refit_place_cuda_chunk_t *)dev,
                                       (const refit_place_cuda_tile_t *)(dev + ctab), ntiles,
                                       (refit_place_cuda_out_t *)(dev + ctab + ttab),
                                       (unsigned long long *)(dev + ctab + ttab + otab),
                                       m->stream));
    REFIT_CHECK(refit_mem_to_host(m, o, dev + ctab + ttab, otab + 8));
    unsigned long long key;
    memcpy(&key, h + ctab + ttab + otab, 8);
    memcpy(outs, o, (size_t)n * sizeof(*outs));
    m->place_n = n;
    m->place_tiles = ntiles;
    m->place_tiles_off = ctab;
    m->place_outs_off = ctab + ttab;
    m->place_err_off = ctab + ttab + otab;
    refit_status_t st = refit_place_cuda_report(key, bad_chunk);
    if (st != REFIT_OK)
      m->place_n = m->place_tiles = 0; /* nothing to write */
    return st;
  }
#endif
  (void)m;
  (void)chunks;
  (void)host_bytes;
  (void)n;
  (void)outs;
  return REFIT_ERR(REFIT_ERR_INTERNAL,
                   "deltas applied through their places on a GPU, on a host session");
}

refit_status_t refit_mem_place_write(refit_mem_t *m, uint64_t *undo_at, uint8_t *undo_old,
                                     uint64_t undo_base, refit_place_cuda_out_t *outs,
                                     uint64_t *undo_end) {
  *undo_end = undo_base;
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    if (m->place_n <= 0)
      return REFIT_ERR(REFIT_ERR_INTERNAL,
                       "place delta write: no checked batch to write (written already, "
                       "or its check failed)");
    unsigned char *dev = m->dbuf;
    unsigned long long *next = (unsigned long long *)(dev + m->place_err_off + 8);
    if (undo_at != NULL)
      REFIT_CHECK(refit_device_memcpy_async(next, &undo_base, 8, m->stream));
    REFIT_CHECK(refit_place_write_cuda(
        (const refit_place_cuda_chunk_t *)dev,
        (const refit_place_cuda_tile_t *)(dev + m->place_tiles_off), m->place_tiles,
        (refit_place_cuda_out_t *)(dev + m->place_outs_off), undo_at, undo_old,
        undo_at != NULL ? next : NULL, m->stream));
    const int64_t n = m->place_n;
    m->place_n = m->place_tiles = 0; /* written once */
    /* The outputs, then the error key and the undo counter, in one copy. */
    const size_t at = m->place_err_off - m->place_outs_off;
    unsigned char *h = m->dhost;
    REFIT_CHECK(refit_mem_to_host(m, h, dev + m->place_outs_off, at + 16));
    memcpy(outs, h, (size_t)n * sizeof(*outs));
    if (undo_at != NULL)
      memcpy(undo_end, h + at + 8, 8);
    return REFIT_OK;
  }
#endif
  (void)m;
  (void)undo_at;
  (void)undo_old;
  (void)outs;
  return REFIT_ERR(REFIT_ERR_INTERNAL,
                   "deltas applied through their places on a GPU, on a host session");
}

refit_status_t refit_mem_place_undo(refit_mem_t *m, const uint64_t *undo_at,
                                    const uint8_t *undo_old, int64_t n) {
#ifdef REFIT_HAVE_CUDA
  if (m->device)
    return refit_place_undo_cuda(undo_at, undo_old, n, m->stream);
#endif
  (void)m;
  (void)undo_at;
  (void)undo_old;
  (void)n;
  return REFIT_ERR(REFIT_ERR_INTERNAL, "a GPU undo log on a host session");
}

refit_status_t refit_mem_gather(refit_mem_t *m, const void *src_base,
                                const refit_mem_piece_t *pieces, int64_t n) {
  if (n <= 0)
    return REFIT_OK;
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    /* The land kernel's COPY rows, digests off: one row per piece. */
    const size_t tab = refit_mem_align16((size_t)n * sizeof(refit_land_desc_t));
    REFIT_CHECK(refit_mem_delta_room(m, tab + 16, tab));
    refit_land_desc_t *d = m->dhost;
    for (int64_t i = 0; i < n; i++)
      d[i] = (refit_land_desc_t){.src_offset = pieces[i].src_off,
                                 .rows = pieces[i].bytes > 0,
                                 .cols = pieces[i].bytes,
                                 .row_bytes = pieces[i].bytes,
                                 .dst = pieces[i].dst,
                                 .dst_pitch = pieces[i].bytes,
                                 .op = REFIT_CHUNK_COPY};
    unsigned char *dev = m->dbuf;
    REFIT_CHECK(refit_device_memcpy_async(dev, d, (size_t)n * sizeof(*d), m->stream));
    return refit_land_rows_cuda((const refit_land_desc_t *)dev, n, 0, src_base,
                                (int64_t *)(dev + tab), m->stream);
  }
#endif
  (void)m;
  for (int64_t i = 0; i < n; i++)
    memcpy(pieces[i].dst, (const unsigned char *)src_base + pieces[i].src_off,
           (size_t)pieces[i].bytes);
  return REFIT_OK;
}

refit_status_t refit_mem_alloc_pinned(refit_mem_t *m, size_t bytes, void **ptr) {
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    REFIT_CUDA_CHECK(cudaHostAlloc(ptr, bytes ? bytes : 1, cudaHostAllocPortable |
                                                               cudaHostAllocMapped));
    memset(*ptr, 0, bytes);
    return REFIT_OK;
  }
#endif
  *ptr = calloc(1, bytes ? bytes : 1);
  if (*ptr == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "%zu bytes of host memory", bytes);
  (void)m;
  return REFIT_OK;
}

void refit_mem_free_pinned(refit_mem_t *m, void *ptr) {
#ifdef REFIT_HAVE_CUDA
  if (m->device) {
    if (ptr != NULL)
      cudaFreeHost(ptr);
    return;
  }
#endif
  (void)m;
  free(ptr);
}
