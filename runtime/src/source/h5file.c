/* The HDF5 plumbing (h5file.h). */
#include "source/h5file.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---------------------------------------------------------------------- */
/* HDF5 plumbing                                                           */
/* ---------------------------------------------------------------------- */

void refit_h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

/* Keep the innermost (most specific) message of the HDF5 error stack. */
static herr_t refit_h5_walk(unsigned n, const H5E_error2_t *e, void *data) {
  char *out = data;
  if (n == 0 && e->desc != NULL)
    snprintf(out, 256, "%s (in %s)", e->desc, e->func_name ? e->func_name : "?");
  return 0;
}

refit_status_t refit_h5_error(const char *call, const char *fmt, ...) {
  char context[512], detail[256] = "no HDF5 error message";
  va_list ap;
  /* Read HDF5's stack before anything else can clear it. */
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, refit_h5_walk, detail);
  H5Eclear2(H5E_DEFAULT);
  va_start(ap, fmt);
  vsnprintf(context, sizeof(context), fmt, ap);
  va_end(ap);
  /* "fid = H5Fopen(...)": name the function, not the assignment. */
  const char *eq = strstr(call, "= H5");
  const char *fn = eq ? eq + 2 : call;
  int fn_len = (int)strcspn(fn, "(");
  return REFIT_ERR(REFIT_ERR_HDF5, "%s: %.*s failed: %s", context, fn_len, fn,
                   detail);
}

/* Attribute `name` on `obj`: a scalar (n == 0) or n values of file type
 * `ftype`, written from `values` in memory type `mtype`. */
static refit_status_t refit_h5_attr_write(hid_t obj, const char *name, hid_t ftype,
                                          hid_t mtype, const void *values, size_t n) {
  refit_status_t st = REFIT_OK;
  hid_t space = -1, attr = -1;
  hsize_t dim = n;
  REFIT_H5_CHECK_GOTO(space = n ? H5Screate_simple(1, &dim, NULL) : H5Screate(H5S_SCALAR),
                      st, out, "attribute %s", name);
  REFIT_H5_CHECK_GOTO(attr =
                          H5Acreate2(obj, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT),
                      st, out, "attribute %s", name);
  REFIT_H5_CHECK_GOTO(H5Awrite(attr, mtype, values), st, out, "attribute %s", name);
out:
  if (attr >= 0)
    H5Aclose(attr);
  if (space >= 0)
    H5Sclose(space);
  return st;
}

refit_status_t refit_h5_attr_write_str(hid_t obj, const char *name,
                                       const char *value) {
  refit_status_t st = REFIT_OK;
  hid_t type = -1;
  const size_t len = strlen(value);
  REFIT_H5_CHECK_GOTO(type = H5Tcopy(H5T_C_S1), st, out, "attribute %s", name);
  REFIT_H5_CHECK_GOTO(H5Tset_size(type, len ? len : 1), st, out, "attribute %s",
                      name);
  REFIT_H5_CHECK_GOTO(H5Tset_strpad(type, H5T_STR_NULLPAD), st, out,
                      "attribute %s", name);
  st = refit_h5_attr_write(obj, name, type, type, len ? value : "", 0);
out:
  if (type >= 0)
    H5Tclose(type);
  return st;
}

refit_status_t refit_h5_attr_write_i64(hid_t obj, const char *name,
                                       const int64_t *values, size_t n) {
  return refit_h5_attr_write(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, values, n);
}

refit_status_t refit_h5_attr_write_i64s(hid_t obj, const refit_h5_i64_t *attrs,
                                        size_t n) {
  for (size_t i = 0; i < n; i++)
    REFIT_CHECK(refit_h5_attr_write_i64(obj, attrs[i].name, &attrs[i].value, 0));
  return REFIT_OK;
}

refit_status_t refit_h5_attr_read_str(hid_t obj, const char *name, char *buf,
                                      size_t len, int *found) {
  refit_status_t st = REFIT_OK;
  hid_t attr = -1, ftype = -1, mtype = -1, space = -1;
  htri_t exists;
  buf[0] = '\0';
  *found = 0;
  REFIT_H5_CHECK_GOTO(exists = H5Aexists(obj, name), st, out, "attribute %s",
                      name);
  if (!exists)
    return REFIT_OK;
  REFIT_H5_CHECK_GOTO(attr = H5Aopen(obj, name, H5P_DEFAULT), st, out,
                      "attribute %s", name);
  REFIT_H5_CHECK_GOTO(ftype = H5Aget_type(attr), st, out, "attribute %s", name);
  if (H5Tget_class(ftype) != H5T_STRING) {
    st = REFIT_ERR(REFIT_ERR_HDF5, "attribute %s is not a string", name);
    goto out;
  }
  /* Exactly one string: an array of strings (or of anything) is refused,
   * never read into a buffer sized for one. */
  REFIT_H5_CHECK_GOTO(space = H5Aget_space(attr), st, out, "attribute %s", name);
  if (H5Sget_simple_extent_type(space) != H5S_SCALAR) {
    st = REFIT_ERR(REFIT_ERR_HDF5,
                   "attribute %s holds an array of %lld strings; expected one "
                   "scalar string",
                   name, (long long)H5Sget_simple_extent_npoints(space));
    goto out;
  }
  if (H5Tis_variable_str(ftype) > 0) {
    char *v = NULL;
    REFIT_H5_CHECK_GOTO(mtype = H5Tcopy(H5T_C_S1), st, out, "attribute %s", name);
    REFIT_H5_CHECK_GOTO(H5Tset_size(mtype, H5T_VARIABLE), st, out,
                        "attribute %s", name);
    /* h5py writes UTF-8; HDF5 converts no character set into another. */
    REFIT_H5_CHECK_GOTO(H5Tset_cset(mtype, H5Tget_cset(ftype)), st, out,
                        "attribute %s", name);
    REFIT_H5_CHECK_GOTO(H5Aread(attr, mtype, &v), st, out, "attribute %s", name);
    snprintf(buf, len, "%s", v ? v : "");
    H5free_memory(v);
  } else {
    size_t n = H5Tget_size(ftype);
    char *tmp = calloc(n + 1, 1);
    if (tmp == NULL) {
      st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "attribute %s of %zu bytes", name, n);
      goto out;
    }
    REFIT_H5_CHECK_GOTO(mtype = H5Tcopy(ftype), st, free_tmp, "attribute %s",
                        name);
    REFIT_H5_CHECK_GOTO(H5Aread(attr, mtype, tmp), st, free_tmp, "attribute %s",
                        name);
    snprintf(buf, len, "%s", tmp);
  free_tmp:
    free(tmp);
  }
  if (st == REFIT_OK)
    *found = 1;
out:
  if (mtype >= 0)
    H5Tclose(mtype);
  if (ftype >= 0)
    H5Tclose(ftype);
  if (space >= 0)
    H5Sclose(space);
  if (attr >= 0)
    H5Aclose(attr);
  return st;
}

refit_status_t refit_h5_attr_read_i64(hid_t obj, const char *name,
                                      int64_t *value) {
  refit_status_t st = REFIT_OK;
  hid_t attr = -1;
  int64_t v = 0;
  REFIT_H5_CHECK_GOTO(attr = H5Aopen(obj, name, H5P_DEFAULT), st, out,
                      "attribute %s", name);
  REFIT_H5_CHECK_GOTO(H5Aread(attr, H5T_NATIVE_INT64, &v), st, out,
                      "attribute %s", name);
  *value = v;
out:
  if (attr >= 0)
    H5Aclose(attr);
  return st;
}

hid_t refit_h5_type_f16(void) {
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  if (t < 0)
    return t;
  /* sign at bit 15, 5 exponent bits at 10, 10 mantissa bits at 0, bias 15 */
  if (H5Tset_fields(t, 15, 10, 5, 0, 10) < 0 || H5Tset_precision(t, 16) < 0 ||
      H5Tset_size(t, 2) < 0 || H5Tset_ebias(t, 15) < 0) {
    H5Tclose(t);
    return -1;
  }
  return t;
}
