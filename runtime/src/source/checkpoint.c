/*
 * Synthetic checkpoints (refit_checkpoint_write in refit/refit.h): the
 * config's model with the synthetic source's values of one version, so that
 * demos and tests of source.kind hdf5 and safetensors need no external files.
 * Every tensor is full (unsharded) under its Hugging Face name, 1-D tensors
 * as [n]. f32 widens the BF16 values exactly; f16 rounds them to nearest even
 * (exact for the synthetic magnitudes). The checkpoint appears under its name
 * only once complete (written as PATH.tmp, then renamed).
 *
 * HDF5: the checkpoint schema of dump.h. Safetensors: PATH is one
 * .safetensors file, or with shards > 1 a directory of that many files
 * (model-0000k-of-0000N.safetensors, tensors in name order split by bytes)
 * and model.safetensors.index.json. Each file follows the format's writer:
 * header JSON padded with spaces to a multiple of 8 bytes, "__metadata__"
 * {"format": "pt"} first, tensors ordered by alignment then name (one dtype
 * per checkpoint, so by name), data back to back.
 */
#include "source/checkpoint.h"

#include "source/h5file.h"
#include "source/source.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Rows written per hyperslab: bounds memory for large tensors. */
#define REFIT_CKPT_BLOCK_ELEMS ((int64_t)1 << 22)

/* The element types as each format names them (refit_checkpoint_dtype_t). */
static const char *const refit_ckpt_st_dtypes[] = {"BF16", "F32", "F16"};
static const char *const refit_ckpt_h5_dtypes[] = {"bfloat16", "float32", "float16"};

/* Rows of tensor t converted to the checkpoint's element type into `out`. */
static refit_status_t refit_ckpt_rows(const refit_source_t *synth,
                                      const refit_src_tensor_t *t,
                                      refit_checkpoint_dtype_t dtype, uint64_t version,
                                      int64_t r, int64_t n, uint16_t *bf,
                                      void *conv, const void **out) {
  const int64_t elems = n * t->cols;
  REFIT_CHECK(synth->ops->read(synth->ctx, t, version, r, 0, n, t->cols, bf));
  *out = bf;
  /* An FP32 vector's 2-byte units are its float32 bits, little-endian: it
   * is written as float32 whatever the checkpoint's element type. */
  if (refit_src_is_f32(t))
    return REFIT_OK;
  if (dtype == REFIT_CHECKPOINT_F32) {
    float *f = conv;
    for (int64_t k = 0; k < elems; k++)
      f[k] = refit_f32_from_bits((uint32_t)bf[k] << 16);
    *out = f;
  } else if (dtype == REFIT_CHECKPOINT_F16) {
    uint16_t *h = conv;
    for (int64_t k = 0; k < elems; k++)
      h[k] = refit_f16_from_f32((uint32_t)bf[k] << 16);
    *out = h;
  }
  return REFIT_OK;
}

/* One safetensors file of catalog tensors order[0..n) at `path`. */
static refit_status_t refit_ckpt_st_file(const char *path,
                                         const refit_catalog_t *cat,
                                         const int64_t *order, int64_t n,
                                         const refit_source_t *synth,
                                         refit_checkpoint_dtype_t dtype,
                                         uint64_t version, uint16_t *bf,
                                         void *conv, int64_t block) {
  const size_t esize = dtype == REFIT_CHECKPOINT_F32 ? 4 : 2;
  refit_status_t st = REFIT_OK;
  json_t *root = json_object(), *meta = json_object();
  char *text = NULL;
  FILE *f = NULL;
  uint64_t at = 0;
  if (root == NULL || meta == NULL)
    goto err_oom;
  json_object_set_new(meta, "format", json_string("pt"));
  json_object_set_new(root, "__metadata__", meta);
  meta = NULL;
  for (int64_t k = 0; k < n; k++) {
    const refit_src_tensor_t *t = &cat->hf[order[k]];
    const int f32 = refit_src_is_f32(t);
    const uint64_t bytes = (uint64_t)(t->rows * t->cols) * (f32 ? 2 : esize);
    json_t *shape = refit_src_is_1d(t)
                        ? json_pack("[I]", (json_int_t)refit_src_elements(t))
                        : json_pack("[II]", (json_int_t)t->rows, (json_int_t)t->cols);
    json_t *e =
        json_pack("{s:s, s:o, s:[II]}", "dtype",
                  refit_ckpt_st_dtypes[f32 ? REFIT_CHECKPOINT_F32 : dtype], "shape",
                  shape, "data_offsets", (json_int_t)at, (json_int_t)(at + bytes));
    if (e == NULL || json_object_set_new(root, t->name, e) != 0)
      goto err_oom;
    at += bytes;
  }
  text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  if (text == NULL)
    goto err_oom;
  size_t len = strlen(text);
  const size_t padded = (len + 7) / 8 * 8;
  unsigned char prefix[8];
  for (int i = 0; i < 8; i++)
    prefix[i] = (unsigned char)((uint64_t)padded >> (8 * i));
  f = fopen(path, "wb");
  if (f == NULL) {
    st = REFIT_ERR(REFIT_ERR_SYSTEM, "%s: %s", path, strerror(errno));
    goto out;
  }
  fwrite(prefix, 1, 8, f);
  fwrite(text, 1, len, f);
  for (; len < padded; len++)
    fputc(' ', f);
  for (int64_t k = 0; k < n; k++) {
    const refit_src_tensor_t *t = &cat->hf[order[k]];
    for (int64_t r = 0; r < t->rows; r += block) {
      const int64_t m = t->rows - r < block ? t->rows - r : block;
      const void *buf;
      REFIT_CHECK_GOTO(refit_ckpt_rows(synth, t, dtype, version, r, m, bf, conv, &buf),
                       st, out);
      fwrite(buf, refit_src_is_f32(t) ? 2 : esize, (size_t)(m * t->cols), f);
    }
  }
  if (ferror(f) || fclose(f) != 0) {
    f = NULL;
    st = REFIT_ERR(REFIT_ERR_SYSTEM, "%s: write failed: %s", path, strerror(errno));
    goto out;
  }
  f = NULL;
  goto out;
err_oom:
  st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "%s: header", path);
out:
  if (f != NULL)
    fclose(f);
  free(text);
  json_decref(meta);
  json_decref(root);
  return st;
}

static int refit_ckpt_name_cmp(const void *a, const void *b, void *cat) {
  const refit_catalog_t *c = cat;
  return strcmp(c->hf[*(const int64_t *)a].name, c->hf[*(const int64_t *)b].name);
}

/* A safetensors checkpoint at `out` (a file, or a directory of `shards`). */
static refit_status_t refit_ckpt_safetensors(const char *out, int shards,
                                             const refit_catalog_t *cat,
                                             const refit_source_t *synth,
                                             refit_checkpoint_dtype_t dtype,
                                             uint64_t version, uint16_t *bf,
                                             void *conv, int64_t block) {
  const uint64_t esize = dtype == REFIT_CHECKPOINT_F32 ? 4 : 2;
  refit_status_t st = REFIT_OK;
  char tmp[REFIT_PATH_MAX + 8], path[2 * REFIT_PATH_MAX];
  json_t *index = NULL, *map = NULL;
  int64_t *order = malloc((size_t)cat->nhf * sizeof(*order));
  if (order == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "%lld tensors", (long long)cat->nhf);
  for (int64_t i = 0; i < cat->nhf; i++)
    order[i] = i;
  qsort_r(order, (size_t)cat->nhf, sizeof(*order), refit_ckpt_name_cmp, (void *)cat);
  snprintf(tmp, sizeof(tmp), "%s.tmp", out);
  if (shards <= 1) {
    REFIT_CHECK_GOTO(refit_ckpt_st_file(tmp, cat, order, cat->nhf, synth, dtype,
                                        version, bf, conv, block),
                     st, out);
  } else {
    uint64_t total = 0, done = 0;
    for (int64_t i = 0; i < cat->nhf; i++)
      total += (uint64_t)(cat->hf[i].rows * cat->hf[i].cols) * esize;
    if (mkdir(tmp, 0777) != 0 && errno != EEXIST) {
      st = REFIT_ERR(REFIT_ERR_SYSTEM, "mkdir %s: %s", tmp, strerror(errno));
      goto out;
    }
    index = json_object();
    map = json_object();
    if (index == NULL || map == NULL) {
      st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "index");
      goto out;
    }
    int64_t begin = 0;
    for (int s = 0; s < shards; s++) {
      /* Shard s ends once the bytes so far reach (s + 1) / shards. */
      int64_t end = begin;
      while (end < cat->nhf &&
             (s == shards - 1 || done < total / (uint64_t)shards * (uint64_t)(s + 1))) {
        done += (uint64_t)(cat->hf[order[end]].rows * cat->hf[order[end]].cols) * esize;
        end++;
      }
      char name[96];
      snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", s + 1, shards);
      snprintf(path, sizeof(path), "%s/%s", tmp, name);
      REFIT_CHECK_GOTO(refit_ckpt_st_file(path, cat, order + begin, end - begin,
                                          synth, dtype, version, bf, conv, block),
                       st, out);
      for (int64_t k = begin; k < end; k++)
        json_object_set_new(map, cat->hf[order[k]].name, json_string(name));
      begin = end;
    }
    json_object_set_new(index, "metadata", json_pack("{s:I}", "total_size",
                                                     (json_int_t)total));
    json_object_set(index, "weight_map", map);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", tmp);
    if (json_dump_file(index, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0) {
      st = REFIT_ERR(REFIT_ERR_SYSTEM, "%s: write failed", path);
      goto out;
    }
  }
  if (rename(tmp, out) != 0)
    st = REFIT_ERR(REFIT_ERR_SYSTEM, "rename %s -> %s failed: %s (remove %s "
                   "first)", tmp, out, strerror(errno), out);
out:
  json_decref(map);
  json_decref(index);
  free(order);
  return st;
}

static refit_status_t refit_ckpt_write_tensor(hid_t file, const char *path,
                                              const refit_source_t *synth,
                                              const refit_src_tensor_t *t,
                                              refit_checkpoint_dtype_t dtype,
                                              uint64_t version, hid_t f16,
                                              uint16_t *bf, void *conv,
                                              int64_t block) {
  refit_status_t st = REFIT_OK;
  hid_t fspace = -1, mspace = -1, dset = -1;
  const int rank = refit_src_is_1d(t) ? 1 : 2;
  hsize_t dims[2] = {(hsize_t)t->rows, (hsize_t)t->cols};
  if (rank == 1)
    dims[0] = (hsize_t)refit_src_elements(t);
  /* An FP32 vector: float32 whatever the checkpoint's element type (its
   * bits are the synthetic units, refit_ckpt_rows). */
  if (refit_src_is_f32(t))
    dtype = REFIT_CHECKPOINT_F32;
  const hid_t ftype = dtype == REFIT_CHECKPOINT_BF16  ? H5T_STD_U16LE
                      : dtype == REFIT_CHECKPOINT_F32 ? H5T_IEEE_F32LE
                                                : f16;
  const hid_t mtype = dtype == REFIT_CHECKPOINT_BF16  ? H5T_NATIVE_UINT16
                      : dtype == REFIT_CHECKPOINT_F32 ? H5T_NATIVE_FLOAT
                                                : f16;
  REFIT_H5_CHECK_GOTO(fspace = H5Screate_simple(rank, dims, NULL), st, out,
                      "%s: dataset '%s'", path, t->name);
  REFIT_H5_CHECK_GOTO(dset = H5Dcreate2(file, t->name, ftype, fspace,
                                        H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      st, out, "%s: dataset '%s'", path, t->name);
  for (int64_t r = 0; r < t->rows; r += block) {
    const int64_t n = t->rows - r < block ? t->rows - r : block;
    hsize_t start[2] = {(hsize_t)r, 0}, count[2] = {(hsize_t)n, (hsize_t)t->cols};
    hsize_t elems = (hsize_t)(n * t->cols);
    if (rank == 1) { /* one row [1, n] or one column [n, 1] */
      start[0] = (hsize_t)(r * t->cols);
      count[0] = elems;
    }
    if (refit_src_is_f32(t)) { /* one row of 2-byte units: float32 [n] */
      start[0] = 0;
      count[0] = elems = dims[0];
    }
    const void *buf;
    REFIT_CHECK_GOTO(refit_ckpt_rows(synth, t, dtype, version, r, n, bf, conv, &buf),
                     st, out);
    REFIT_H5_CHECK_GOTO(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL,
                                            count, NULL),
                        st, out, "%s: dataset '%s'", path, t->name);
    if (mspace >= 0)
      H5Sclose(mspace);
    REFIT_H5_CHECK_GOTO(mspace = H5Screate_simple(1, &elems, NULL), st, out,
                        "%s: dataset '%s'", path, t->name);
    REFIT_H5_CHECK_GOTO(H5Dwrite(dset, mtype, mspace, fspace, H5P_DEFAULT, buf),
                        st, out, "%s: dataset '%s' rows [%lld, %lld)", path,
                        t->name, (long long)r, (long long)(r + n));
  }
  REFIT_CHECK_GOTO(refit_h5_attr_write_str(dset, "dtype", refit_ckpt_h5_dtypes[dtype]), st,
                   out);
out:
  if (dset >= 0)
    H5Dclose(dset);
  if (mspace >= 0)
    H5Sclose(mspace);
  if (fspace >= 0)
    H5Sclose(fspace);
  return st;
}

/* The HDF5 checkpoint at `out`; *bytes_out is its tensor data bytes. */
static refit_status_t refit_ckpt_hdf5(const char *out, const refit_config_t *cfg,
                                      const refit_catalog_t *cat,
                                      const refit_source_t *synth,
                                      refit_checkpoint_dtype_t dtype, uint64_t version,
                                      uint16_t *bf, void *conv, int64_t block,
                                      uint64_t *bytes_out) {
  refit_status_t st = REFIT_OK;
  char tmp[REFIT_PATH_MAX + 8];
  hid_t file = -1, f16 = -1;
  refit_h5_quiet();
  snprintf(tmp, sizeof(tmp), "%s.tmp", out);
  REFIT_H5_CHECK_GOTO(f16 = refit_h5_type_f16(), st, done, "float16 type");
  REFIT_H5_CHECK_GOTO(file = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), st,
                      done, "%s (does the directory exist and is it writable?)", tmp);
  const refit_h5_i64_t scalars[] = {{"version", (int64_t)version},
                                    {"synthetic_seed", (int64_t)cfg->source.seed}};
  REFIT_CHECK_GOTO(refit_h5_attr_write_str(file, "format", REFIT_CKPT_FORMAT), st, done);
  REFIT_CHECK_GOTO(refit_h5_attr_write_i64s(file, scalars, 2), st, done);
  uint64_t bytes = 0;
  for (int64_t i = 0; i < cat->nhf; i++) {
    REFIT_CHECK_GOTO(refit_ckpt_write_tensor(file, tmp, synth, &cat->hf[i], dtype,
                                             version, f16, bf, conv, block),
                     st, done);
    bytes += (uint64_t)(cat->hf[i].rows * cat->hf[i].cols) *
             (dtype == REFIT_CHECKPOINT_F32 ? 4u : 2u);
  }
  if (H5Fclose(file) < 0) {
    file = -1;
    st = refit_h5_error("H5Fclose", "%s", tmp);
    goto done;
  }
  file = -1;
  if (rename(tmp, out) != 0) {
    st = REFIT_ERR(REFIT_ERR_SYSTEM, "rename %s -> %s failed", tmp, out);
    goto done;
  }
  *bytes_out = bytes;
done:
  if (file >= 0) {
    H5Fclose(file);
    remove(tmp);
  }
  if (f16 >= 0)
    H5Tclose(f16);
  return st;
}

refit_status_t refit_checkpoint_write_config(const refit_config_t *cfg, const char *path,
                                             const refit_checkpoint_options_t *opt,
                                             refit_checkpoint_info_t *info) {
  const refit_checkpoint_dtype_t dtype = opt->dtype;
  const int safetensors = opt->format == REFIT_CHECKPOINT_SAFETENSORS;
  refit_status_t st = REFIT_OK;
  refit_catalog_t *cat = NULL;
  refit_source_t synth = {0};
  uint16_t *bf = NULL;
  void *conv = NULL;
  uint64_t bytes = 0;

  REFIT_CHECK_GOTO(
      refit_catalog_create(&cfg->model, &cfg->trainer, &cfg->generator, &cat), st, done);
  /* The values are the synthetic source's, whatever source the config names. */
  REFIT_CHECK_GOTO(refit_source_synthetic.open(cfg, cat, &synth.ctx), st, done);
  synth.ops = &refit_source_synthetic;

  int64_t max_cols = 1;
  for (int64_t i = 0; i < cat->nhf; i++)
    if (cat->hf[i].cols > max_cols)
      max_cols = cat->hf[i].cols;
  const int64_t block =
      REFIT_CKPT_BLOCK_ELEMS / max_cols > 0 ? REFIT_CKPT_BLOCK_ELEMS / max_cols : 1;
  bf = malloc((size_t)(block * max_cols) * sizeof(uint16_t));
  conv = malloc((size_t)(block * max_cols) * sizeof(float));
  if (bf == NULL || conv == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "%lld-element buffers",
                   (long long)(block * max_cols));
    goto done;
  }
  if (safetensors) {
    REFIT_CHECK_GOTO(refit_ckpt_safetensors(path, opt->shards, cat, &synth, dtype,
                                            opt->version, bf, conv, block),
                     st, done);
    for (int64_t i = 0; i < cat->nhf; i++)
      bytes += (uint64_t)(cat->hf[i].rows * cat->hf[i].cols) *
               (dtype == REFIT_CHECKPOINT_F32 ? 4u : 2u);
  } else {
    REFIT_CHECK_GOTO(refit_ckpt_hdf5(path, cfg, cat, &synth, dtype, opt->version, bf,
                                     conv, block, &bytes),
                     st, done);
  }
  info->tensors = cat->nhf;
  info->bytes = bytes;
  info->seed = cfg->source.seed;
  info->dtype_name =
      safetensors ? refit_ckpt_st_dtypes[dtype] : refit_ckpt_h5_dtypes[dtype];

done:
  free(bf);
  free(conv);
  refit_source_close(&synth);
  refit_catalog_destroy(cat);
  return st;
}
