/*
 * make_bad_ckpt GOOD.h5 KIND TENSOR OUT.h5
 *
 * Test helper: copy a good checkpoint and break one tensor the way KIND says,
 * with the HDF5 API, so that the rejection tests start from a file that is
 * otherwise correct:
 *   missing  the dataset is deleted
 *   shape    the dataset has twice the rows
 *   dtype    the dataset holds 32-bit signed integers
 *   attr     the uint16 dataset's dtype attribute says "float16"
 */
#include "source/h5file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int copy_file(const char *from, const char *to) {
  FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
  char buf[1 << 16];
  size_t n;
  int rc = in && out ? 0 : 1;
  while (rc == 0 && (n = fread(buf, 1, sizeof(buf), in)) > 0)
    rc = fwrite(buf, 1, n, out) != n;
  if (in)
    fclose(in);
  if (out && fclose(out) != 0)
    rc = 1;
  return rc;
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: make_bad_ckpt GOOD.h5 missing|shape|dtype|attr|attr-array "
                    "TENSOR OUT.h5\n");
    return 2;
  }
  const char *kind = argv[2], *name = argv[3];
  hsize_t dims[2] = {0, 0};
  int rank = 0, rc = 1;
  if (copy_file(argv[1], argv[4]) != 0) {
    fprintf(stderr, "make_bad_ckpt: cannot copy %s to %s\n", argv[1], argv[4]);
    return 1;
  }
  hid_t file = H5Fopen(argv[4], H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t dset = file >= 0 ? H5Dopen2(file, name, H5P_DEFAULT) : -1;
  if (dset < 0) {
    fprintf(stderr, "make_bad_ckpt: cannot open %s in %s\n", name, argv[4]);
    goto out;
  }
  hid_t space = H5Dget_space(dset);
  rank = H5Sget_simple_extent_ndims(space);
  H5Sget_simple_extent_dims(space, dims, NULL);
  H5Sclose(space);
  if (strcmp(kind, "attr") == 0) {
    rc = H5Adelete(dset, "dtype") < 0 ||
         refit_h5_attr_write_str(dset, "dtype", "float16") != REFIT_OK;
    H5Dclose(dset);
    goto out;
  }
  if (strcmp(kind, "attr-array") == 0) {
    /* dtype as two fixed-length strings: an array where one string belongs
     * (it once overflowed the reader's buffer). */
    hsize_t two = 2;
    hid_t str = H5Tcopy(H5T_C_S1);
    hid_t aspace = H5Screate_simple(1, &two, NULL);
    H5Tset_size(str, 8);
    hid_t attr = H5Adelete(dset, "dtype") < 0
                     ? -1
                     : H5Acreate2(dset, "dtype", str, aspace, H5P_DEFAULT, H5P_DEFAULT);
    rc = attr < 0 || H5Awrite(attr, str, "bfloat16float16\0") < 0;
    if (attr >= 0)
      H5Aclose(attr);
    H5Sclose(aspace);
    H5Tclose(str);
    H5Dclose(dset);
    goto out;
  }
  H5Dclose(dset);
  if (H5Ldelete(file, name, H5P_DEFAULT) < 0)
    goto out;
  if (strcmp(kind, "missing") == 0) {
    rc = 0;
    goto out;
  }
  hid_t type = H5T_STD_U16LE;
  if (strcmp(kind, "shape") == 0)
    dims[0] *= 2;
  else if (strcmp(kind, "dtype") == 0)
    type = H5T_STD_I32LE;
  else {
    fprintf(stderr, "make_bad_ckpt: unknown kind '%s'\n", kind);
    goto out;
  }
  space = H5Screate_simple(rank, dims, NULL);
  dset = H5Dcreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Sclose(space);
  if (dset < 0)
    goto out;
  /* Zeros, so the data is allocated and only the schema is wrong. */
  size_t n = (size_t)dims[0] * (rank == 2 ? (size_t)dims[1] : 1);
  void *zeros = calloc(n, 4);
  rc = zeros == NULL ||
       H5Dwrite(dset, type == H5T_STD_I32LE ? H5T_NATIVE_INT32 : H5T_NATIVE_UINT16,
                H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros) < 0 ||
       (type == H5T_STD_U16LE &&
        refit_h5_attr_write_str(dset, "dtype", "bfloat16") != REFIT_OK);
  free(zeros);
  H5Dclose(dset);
out:
  if (file >= 0 && H5Fclose(file) < 0)
    rc = 1;
  if (rc != 0)
    fprintf(stderr, "make_bad_ckpt: could not make '%s' of %s\n", kind, name);
  return rc;
}
