/*
 * refit-ckpt CONFIG OUT.h5 [--dtype bf16|f32|f16] [--version V]
 *
 * Write an HDF5 checkpoint (schema in runtime/src/dump.h) of the config's
 * model with the synthetic source's values of version V (default 1, seed from
 * source.seed), so that demos and tests of source.kind hdf5 need no external
 * files. Every tensor is full (unsharded) under its Hugging Face name, 1-D
 * tensors as [n]. f32 widens the BF16 values exactly; f16 rounds them to
 * nearest even (exact for the synthetic magnitudes). The file appears under
 * its name only once complete (written as OUT.h5.tmp, then renamed).
 */
#include "dump.h"
#include "source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { REFIT_CKPT_BF16, REFIT_CKPT_F32, REFIT_CKPT_F16 } refit_ckpt_dtype_t;

/* Rows written per hyperslab: bounds memory for large tensors. */
#define REFIT_CKPT_BLOCK_ELEMS ((int64_t)1 << 22)

static int refit_ckpt_usage(void) {
  fprintf(stderr, "usage: refit-ckpt CONFIG.yaml OUT.h5 [--dtype bf16|f32|f16] "
                  "[--version V]\n");
  return 2;
}

static refit_status_t refit_ckpt_write_tensor(hid_t file, const char *path,
                                              const refit_source_t *synth,
                                              const refit_src_tensor_t *t,
                                              refit_ckpt_dtype_t dtype,
                                              uint64_t version, hid_t f16,
                                              uint16_t *bf, void *conv,
                                              int64_t block) {
  refit_status_t st = REFIT_OK;
  hid_t fspace = -1, mspace = -1, dset = -1;
  const int rank = t->rows == 1 ? 1 : 2;
  hsize_t dims[2] = {(hsize_t)t->rows, (hsize_t)t->cols};
  if (rank == 1)
    dims[0] = (hsize_t)t->cols;
  const hid_t ftype = dtype == REFIT_CKPT_BF16  ? H5T_STD_U16LE
                      : dtype == REFIT_CKPT_F32 ? H5T_IEEE_F32LE
                                                : f16;
  const hid_t mtype = dtype == REFIT_CKPT_BF16  ? H5T_NATIVE_UINT16
                      : dtype == REFIT_CKPT_F32 ? H5T_NATIVE_FLOAT
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
    if (rank == 1) {
      start[0] = 0;
      count[0] = (hsize_t)t->cols;
    }
    REFIT_CHECK_GOTO(synth->ops->read(synth->ctx, t, version, r, 0, n, t->cols, bf),
                     st, out);
    const void *buf = bf;
    if (dtype == REFIT_CKPT_F32) {
      float *f = conv;
      for (hsize_t k = 0; k < elems; k++)
        f[k] = refit_f32_from_bits((uint32_t)bf[k] << 16);
      buf = f;
    } else if (dtype == REFIT_CKPT_F16) {
      uint16_t *h = conv;
      for (hsize_t k = 0; k < elems; k++)
        h[k] = refit_f16_from_f32((uint32_t)bf[k] << 16);
      buf = h;
    }
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
  REFIT_CHECK_GOTO(refit_h5_attr_write_str(dset, "dtype",
                                           dtype == REFIT_CKPT_BF16 ? "bfloat16"
                                           : dtype == REFIT_CKPT_F32
                                               ? "float32"
                                               : "float16"),
                   st, out);
out:
  if (dset >= 0)
    H5Dclose(dset);
  if (mspace >= 0)
    H5Sclose(mspace);
  if (fspace >= 0)
    H5Sclose(fspace);
  return st;
}

int main(int argc, char **argv) {
  const char *config = NULL, *out = NULL;
  refit_ckpt_dtype_t dtype = REFIT_CKPT_BF16;
  uint64_t version = 1;
  refit_config_t cfg;
  refit_catalog_t *cat = NULL;
  refit_source_t synth = {0};
  char *errors = NULL, tmp[REFIT_PATH_MAX + 8];
  hid_t file = -1, f16 = -1;
  uint16_t *bf = NULL;
  void *conv = NULL;
  refit_status_t st = REFIT_OK;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
      const char *d = argv[++i];
      if (strcmp(d, "bf16") == 0)
        dtype = REFIT_CKPT_BF16;
      else if (strcmp(d, "f32") == 0)
        dtype = REFIT_CKPT_F32;
      else if (strcmp(d, "f16") == 0)
        dtype = REFIT_CKPT_F16;
      else {
        fprintf(stderr, "refit-ckpt: --dtype must be bf16, f32 or f16, got '%s'\n", d);
        return 2;
      }
    } else if (strcmp(argv[i], "--version") == 0 && i + 1 < argc) {
      char *end = NULL;
      version = strtoull(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0') {
        fprintf(stderr, "refit-ckpt: --version expects a number, got '%s'\n", argv[i]);
        return 2;
      }
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      refit_ckpt_usage();
      return 0;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "refit-ckpt: unknown option '%s'\n", argv[i]);
      return refit_ckpt_usage();
    } else if (config == NULL) {
      config = argv[i];
    } else if (out == NULL) {
      out = argv[i];
    } else {
      return refit_ckpt_usage();
    }
  }
  if (config == NULL || out == NULL)
    return refit_ckpt_usage();

  st = refit_config_load(config, 0, &cfg, &errors, NULL, NULL);
  if (st != REFIT_OK) {
    fprintf(stderr, "%s", errors ? errors : refit_last_error());
    free(errors);
    return 2;
  }
  REFIT_CHECK_GOTO(refit_catalog_create(&cfg.model, &cfg.trainer, &cfg.generator,
                                        &cat),
                   st, done);
  /* The values are the synthetic source's, whatever source the config names. */
  REFIT_CHECK_GOTO(refit_source_synthetic.open(&cfg, cat, &synth.ctx), st, done);
  synth.ops = &refit_source_synthetic;

  int64_t max_cols = 1;
  for (int64_t i = 0; i < cat->nhf; i++)
    if (cat->hf[i].cols > max_cols)
      max_cols = cat->hf[i].cols;
  const int64_t block = REFIT_CKPT_BLOCK_ELEMS / max_cols > 0
                            ? REFIT_CKPT_BLOCK_ELEMS / max_cols
                            : 1;
  bf = malloc((size_t)(block * max_cols) * sizeof(uint16_t));
  conv = malloc((size_t)(block * max_cols) * sizeof(float));
  if (bf == NULL || conv == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "%lld-element buffers",
                   (long long)(block * max_cols));
    goto done;
  }

  refit_h5_quiet();
  snprintf(tmp, sizeof(tmp), "%s.tmp", out);
  REFIT_H5_CHECK_GOTO(f16 = refit_h5_type_f16(), st, done, "float16 type");
  REFIT_H5_CHECK_GOTO(file = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT,
                                       H5P_DEFAULT),
                      st, done, "%s (does the directory exist and is it "
                      "writable?)", tmp);
  const int64_t ver = (int64_t)version, seed = (int64_t)cfg.source.seed;
  REFIT_CHECK_GOTO(refit_h5_attr_write_str(file, "format", REFIT_CKPT_FORMAT), st,
                   done);
  REFIT_CHECK_GOTO(refit_h5_attr_write_i64(file, "version", &ver, 0), st, done);
  REFIT_CHECK_GOTO(refit_h5_attr_write_i64(file, "synthetic_seed", &seed, 0), st,
                   done);
  uint64_t bytes = 0;
  for (int64_t i = 0; i < cat->nhf; i++) {
    REFIT_CHECK_GOTO(refit_ckpt_write_tensor(file, tmp, &synth, &cat->hf[i],
                                             dtype, version, f16, bf, conv, block),
                     st, done);
    bytes += (uint64_t)(cat->hf[i].rows * cat->hf[i].cols) *
             (dtype == REFIT_CKPT_F32 ? 4u : 2u);
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
  printf("refit-ckpt: wrote %s: %lld tensors, %.1f MiB of %s, version %llu, "
         "seed %llu\n",
         out, (long long)cat->nhf, (double)bytes / 1048576.0,
         dtype == REFIT_CKPT_BF16 ? "bfloat16"
         : dtype == REFIT_CKPT_F32 ? "float32"
                                   : "float16",
         (unsigned long long)version, (unsigned long long)cfg.source.seed);

done:
  if (file >= 0) {
    H5Fclose(file);
    remove(tmp);
  }
  if (f16 >= 0)
    H5Tclose(f16);
  free(bf);
  free(conv);
  refit_source_close(&synth);
  refit_catalog_destroy(cat);
  if (st != REFIT_OK) {
    fprintf(stderr, "refit-ckpt: %s: %s\n", refit_status_str(st), refit_last_error());
    return 1;
  }
  return 0;
}
