/*
 * refit-dump-check DUMP.h5 [--version V] [--synthetic-version S]
 *
 * --synthetic-version S takes the expected values from the synthetic source
 * at version S (seed from the config) whatever source the config names: a
 * refit from a checkpoint that refit-ckpt wrote with --version S must match
 * it, which checks the HDF5 reader against an independent definition.
 *
 * Check a generator dump (schema in runtime/src/session/dump.h) bit for bit against
 * the from-definition reference: the config is the one stored in the dump,
 * the expected value of every runtime row comes from reshard/reference.h
 * (which trainer row feeds it) and the config's source (synthetic values, or
 * the HDF5 checkpoint). Checks the layout attributes, that every runtime
 * tensor of every generator rank is there with its shape, dtype, layout and
 * version, and that there is nothing else. Exits 0 only when all matches.
 */
#include "source/h5file.h"
#include "reshard/reference.h"
#include "source/source.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *path;
  int64_t problems;
} refit_check_t;

#define REFIT_CHECK_REPORT_MAX 10

static void refit_check_fail(refit_check_t *c, const char *fmt, ...)
    REFIT_PRINTF(2, 3);
static void refit_check_fail(refit_check_t *c, const char *fmt, ...) {
  if (c->problems++ < REFIT_CHECK_REPORT_MAX) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "refit-dump-check: %s: ", c->path);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
  }
}

/* Compare one runtime tensor of generator rank g with the reference. */
static refit_status_t refit_check_tensor(refit_check_t *c, hid_t group, int g,
                                         int tp_rank, const refit_catalog_t *cat,
                                         const refit_source_t *src,
                                         const refit_gen_tensor_t *gt,
                                         uint64_t version, uint64_t value_version,
                                         uint16_t *got,
                                         uint16_t *want) {
  refit_status_t st = REFIT_OK;
  hid_t dset = -1, space = -1;
  hsize_t dims[3] = {0, 0, 0};
  char text[64];
  int found = 0;
  int64_t ver = -1;

  if (H5Lexists(group, gt->name, H5P_DEFAULT) <= 0) {
    refit_check_fail(c, "/rank%d/%s is missing", g, gt->name);
    return REFIT_OK;
  }
  REFIT_H5_CHECK_GOTO(dset = H5Dopen2(group, gt->name, H5P_DEFAULT), st, out,
                      "/rank%d/%s", g, gt->name);
  REFIT_H5_CHECK_GOTO(space = H5Dget_space(dset), st, out, "/rank%d/%s", g,
                      gt->name);
  const int ndim = H5Sget_simple_extent_ndims(space);
  H5Sget_simple_extent_dims(space, dims, NULL);
  int shape_ok = ndim == gt->ndim;
  for (int d = 0; shape_ok && d < ndim; d++)
    shape_ok = dims[d] == (hsize_t)gt->shape[d];
  if (!shape_ok) {
    refit_check_fail(c, "/rank%d/%s: rank %d shape [%llu, %llu, %llu], expected "
                     "rank %d [%lld, %lld, %lld]",
                     g, gt->name, ndim, (unsigned long long)dims[0],
                     (unsigned long long)dims[1], (unsigned long long)dims[2],
                     gt->ndim, (long long)gt->shape[0], (long long)gt->shape[1],
                     (long long)gt->shape[2]);
    goto out;
  }
  REFIT_CHECK_GOTO(refit_h5_attr_read_str(dset, "dtype", text, sizeof(text), &found),
                   st, out);
  if (!found || strcmp(text, "bfloat16") != 0) {
    /* precision bf16 is all this checker knows: say so, never skip. */
    refit_check_fail(c, "/rank%d/%s: dtype '%s', expected 'bfloat16' (the only "
                     "dtype refit-dump-check can recompute)",
                     g, gt->name, found ? text : "(none)");
    goto out;
  }
  REFIT_CHECK_GOTO(refit_h5_attr_read_str(dset, "layout", text, sizeof(text), &found),
                   st, out);
  if (!found || strcmp(text, "linear") != 0)
    refit_check_fail(c, "/rank%d/%s: layout '%s', expected 'linear'", g, gt->name,
                     found ? text : "(none)");
  REFIT_CHECK_GOTO(refit_h5_attr_read_i64(dset, "version", &ver), st, out);
  if (ver != (int64_t)version)
    refit_check_fail(c, "/rank%d/%s: version %lld, expected %llu", g, gt->name,
                     (long long)ver, (unsigned long long)version);
  REFIT_H5_CHECK_GOTO(H5Dread(dset, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL,
                              H5P_DEFAULT, got),
                      st, out, "/rank%d/%s", g, gt->name);
  int64_t bad = 0;
  for (int64_t row = 0; row < gt->rows; row++) {
    char name[REFIT_NAME_MAX];
    int64_t src_row, col_off;
    REFIT_CHECK_GOTO(refit_reference_source_row(&cat->model, &cat->generator,
                                                tp_rank, gt->name, row, name,
                                                &src_row, &col_off),
                     st, out);
    if (src_row < 0) { /* vocabulary padding: zeros */
      for (int64_t col = 0; col < gt->cols; col++)
        if (got[row * gt->cols + col] != 0 && bad++ == 0)
          refit_check_fail(c, "/rank%d/%s [%lld, %lld]: 0x%04x in a vocabulary "
                           "padding row, expected 0",
                           g, gt->name, (long long)row, (long long)col,
                           got[row * gt->cols + col]);
      continue;
    }
    const int64_t si = refit_catalog_find_hf(cat, name);
    if (si < 0) {
      st = REFIT_ERR(REFIT_ERR_INTERNAL, "%s row %lld: unknown source %s",
                     gt->name, (long long)row, name);
      goto out;
    }
    REFIT_CHECK_GOTO(src->ops->read(src->ctx, &cat->hf[si], value_version, src_row,
                                    col_off, 1, gt->cols, want),
                     st, out);
    const uint16_t *r = got + row * gt->cols;
    for (int64_t col = 0; col < gt->cols; col++)
      if (r[col] != want[col] && bad++ == 0)
        refit_check_fail(c, "/rank%d/%s [%lld, %lld]: 0x%04x, expected 0x%04x "
                         "(%s row %lld col %lld, version %llu)",
                         g, gt->name, (long long)row, (long long)col, r[col],
                         want[col], name, (long long)src_row,
                         (long long)(col + col_off),
                         (unsigned long long)value_version);
  }
  if (bad > 1)
    refit_check_fail(c, "/rank%d/%s: %lld elements differ in all", g, gt->name,
                     (long long)bad);
out:
  if (space >= 0)
    H5Sclose(space);
  if (dset >= 0)
    H5Dclose(dset);
  return st;
}

int main(int argc, char **argv) {
  const char *path = NULL;
  int64_t want_version = -1, synthetic_version = -1;
  refit_check_t c = {0};
  refit_config_t cfg;
  refit_catalog_t *cat = NULL;
  refit_source_t src = {0};
  hid_t file = -1, group = -1;
  uint16_t *got = NULL, *want = NULL;
  char *config = NULL, *errors = NULL, text[64];
  int found = 0;
  int64_t version = -1, ngen = -1, tp = -1, engines = -1, checked = 0;
  uint64_t bytes = 0;
  refit_status_t st = REFIT_OK;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--version") == 0 && i + 1 < argc)
      want_version = strtoll(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--synthetic-version") == 0 && i + 1 < argc)
      synthetic_version = strtoll(argv[++i], NULL, 10);
    else if (path == NULL && argv[i][0] != '-')
      path = argv[i];
    else {
      fprintf(stderr, "usage: refit-dump-check DUMP.h5 [--version V] [--synthetic-version S]\n");
      return 2;
    }
  }
  if (path == NULL) {
    fprintf(stderr, "usage: refit-dump-check DUMP.h5 [--version V] [--synthetic-version S]\n");
    return 2;
  }
  c.path = path;
  refit_h5_quiet();
  REFIT_H5_CHECK_GOTO(file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT), st, done,
                      "%s", path);
  REFIT_CHECK_GOTO(refit_h5_attr_read_str(file, "format", text, sizeof(text), &found),
                   st, done);
  if (!found || strcmp(text, REFIT_DUMP_FORMAT) != 0) {
    st = REFIT_ERR(REFIT_ERR_HDF5, "%s: format '%s', expected '%s'", path,
                   found ? text : "(none)", REFIT_DUMP_FORMAT);
    goto done;
  }
  /* The config text can be long: size the buffer from the attribute. */
  {
    hid_t a = H5Aopen(file, "config", H5P_DEFAULT), t = a >= 0 ? H5Aget_type(a) : -1;
    size_t n = t >= 0 ? H5Tget_size(t) : 0;
    if (t >= 0)
      H5Tclose(t);
    if (a >= 0)
      H5Aclose(a);
    config = malloc(n + 1);
    if (config == NULL) {
      st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "config of %zu bytes", n);
      goto done;
    }
    REFIT_CHECK_GOTO(refit_h5_attr_read_str(file, "config", config, n + 1, &found),
                     st, done);
  }
  st = refit_config_parse(config, strlen(config), "(dump config)", 0, &cfg, &errors);
  if (st != REFIT_OK) {
    fprintf(stderr, "%s", errors ? errors : "");
    st = REFIT_ERR(st, "%s: the config stored in the dump does not parse", path);
    goto done;
  }
  REFIT_CHECK_GOTO(refit_h5_attr_read_i64(file, "version", &version), st, done);
  REFIT_CHECK_GOTO(refit_h5_attr_read_i64(file, "generator_ranks", &ngen), st, done);
  REFIT_CHECK_GOTO(refit_h5_attr_read_i64(file, "generator_tp", &tp), st, done);
  REFIT_CHECK_GOTO(refit_h5_attr_read_i64(file, "generator_engines", &engines), st,
                   done);
  if (want_version >= 0 && version != want_version)
    refit_check_fail(&c, "version %lld, expected %lld", (long long)version,
                     (long long)want_version);
  if (tp != cfg.generator.tp || engines != cfg.generator.engines ||
      ngen != refit_generator_world(&cfg.generator))
    refit_check_fail(&c, "layout tp %lld x %lld engines = %lld ranks, config says "
                     "tp %d x %d engines",
                     (long long)tp, (long long)engines, (long long)ngen,
                     cfg.generator.tp, cfg.generator.engines);
  REFIT_CHECK_GOTO(refit_catalog_create(&cfg.model, &cfg.trainer, &cfg.generator,
                                        &cat),
                   st, done);
  if (synthetic_version >= 0)
    cfg.source.kind = REFIT_SOURCE_SYNTHETIC;
  REFIT_CHECK_GOTO(refit_source_open(&cfg, cat, &src), st, done);
  const uint64_t value_version =
      synthetic_version >= 0 ? (uint64_t)synthetic_version : (uint64_t)version;

  int64_t max_elems = 1, max_cols = 1;
  for (int64_t i = 0; i < cat->gen_begin[cfg.generator.tp]; i++) {
    if (cat->gen[i].rows * cat->gen[i].cols > max_elems)
      max_elems = cat->gen[i].rows * cat->gen[i].cols;
    if (cat->gen[i].cols > max_cols)
      max_cols = cat->gen[i].cols;
  }
  got = malloc((size_t)max_elems * sizeof(uint16_t));
  want = malloc((size_t)max_cols * sizeof(uint16_t));
  if (got == NULL || want == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "buffers of %lld elements",
                   (long long)max_elems);
    goto done;
  }
  for (int g = 0; g < refit_generator_world(&cfg.generator); g++) {
    const int tp_rank = g % cfg.generator.tp;
    char gname[32];
    int64_t attr_tp = -1, attr_engine = -1;
    H5G_info_t info;
    snprintf(gname, sizeof(gname), "rank%d", g);
    if (H5Lexists(file, gname, H5P_DEFAULT) <= 0) {
      refit_check_fail(&c, "group /%s is missing", gname);
      continue;
    }
    REFIT_H5_CHECK_GOTO(group = H5Gopen2(file, gname, H5P_DEFAULT), st, done,
                        "%s: /%s", path, gname);
    REFIT_CHECK_GOTO(refit_h5_attr_read_i64(group, "tp_rank", &attr_tp), st, done);
    REFIT_CHECK_GOTO(refit_h5_attr_read_i64(group, "engine", &attr_engine), st, done);
    if (attr_tp != tp_rank || attr_engine != g / cfg.generator.tp)
      refit_check_fail(&c, "/%s: engine %lld tp rank %lld, expected engine %d tp "
                       "rank %d",
                       gname, (long long)attr_engine, (long long)attr_tp,
                       g / cfg.generator.tp, tp_rank);
    const int64_t first = cat->gen_begin[tp_rank], n = cat->gen_begin[tp_rank + 1] - first;
    REFIT_H5_CHECK_GOTO(H5Gget_info(group, &info), st, done, "%s: /%s", path, gname);
    if ((int64_t)info.nlinks != n)
      refit_check_fail(&c, "/%s holds %llu datasets, expected %lld runtime tensors",
                       gname, (unsigned long long)info.nlinks, (long long)n);
    for (int64_t i = 0; i < n; i++) {
      const refit_gen_tensor_t *gt = &cat->gen[first + i];
      REFIT_CHECK_GOTO(refit_check_tensor(&c, group, g, tp_rank, cat, &src, gt,
                                          (uint64_t)version, value_version, got,
                                          want),
                       st, done);
      checked++;
      bytes += (uint64_t)(gt->rows * gt->cols) * 2u;
    }
    H5Gclose(group);
    group = -1;
  }

done:
  if (group >= 0)
    H5Gclose(group);
  if (file >= 0)
    H5Fclose(file);
  refit_source_close(&src);
  refit_catalog_destroy(cat);
  free(got);
  free(want);
  free(config);
  free(errors);
  if (st != REFIT_OK) {
    fprintf(stderr, "refit-dump-check: %s: %s\n", refit_status_str(st),
            refit_last_error());
    return 2;
  }
  if (c.problems) {
    printf("refit-dump-check: %s: FAILED: %lld problems (first %d above)\n", path,
           (long long)c.problems, REFIT_CHECK_REPORT_MAX);
    return 1;
  }
  printf("refit-dump-check: %s: %lld generator ranks, %lld tensors, %llu bytes "
         "match the reference of version %lld bit for bit\n",
         path, (long long)ngen, (long long)checked, (unsigned long long)bytes,
         (long long)version);
  return 0;
}
