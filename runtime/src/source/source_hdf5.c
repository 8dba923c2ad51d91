/*
 * The HDF5 checkpoint source (source.kind: hdf5, schema in dump.h): one file
 * of full tensors under their Hugging Face names. Every rank opens the file;
 * a trainer reads only its own shard and verification only the rows it
 * checks, each as a hyperslab, never a whole tensor. The checkpoint holds one
 * version, so `version` is ignored.
 *
 * open() checks every tensor of the catalog (presence, shape, element type,
 * dtype attribute, data actually in the file) so that a bad checkpoint is
 * rejected before any transfer, with the file, the dataset and expected vs
 * actual in the message.
 *
 * libhdf5 trusts a file's metadata: a damaged or crafted file can make it
 * read past its buffers or die (found by fuzz_hdf5_open, inside H5Aexists
 * and the B-tree code, not in refit). So open() first runs those same checks,
 * and a walk of every chunk index, in a child process: a child that dies,
 * hangs or is killed turns into a refusal that names the file, and only a
 * file the child accepted is opened in the rank itself.
 */
#include "core/file.h"
#include "source/h5file.h"
#include "source/source.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef enum {
  REFIT_H5_ELEM_BF16 = 0, /* uint16 + dtype = "bfloat16" */
  REFIT_H5_ELEM_F32 = 1,
  REFIT_H5_ELEM_F16 = 2
} refit_h5_elem_t;

static const char *const refit_h5_elem_names[] = {"bfloat16", "float32",
                                                  "float16"};

typedef struct {
  char path[REFIT_PATH_MAX];
  const refit_catalog_t *cat;
  hid_t file;
  hid_t f16; /* memory type for float16 */
  unsigned char *elem; /* per src tensor: refit_h5_elem_t */
  unsigned char *rank; /* per src tensor: dataset rank in the file, 1 or 2 */
  int64_t open_index;  /* src tensor whose dataset is open, -1 none */
  hid_t dset;
  float *tmp; /* float32 rows before rounding */
  size_t tmp_elems;
  int probe; /* in the checking child: also walk every chunk index */
} refit_h5_source_t;

/* How long the checking child may take over a file's metadata. */
#define REFIT_H5_PROBE_SECONDS 300

/* Rows read per hyperslab when converting float32: bounds the temporary. */
#define REFIT_H5_BLOCK_ELEMS ((int64_t)1 << 20)

static void refit_h5_shape_str(int rank, const hsize_t *d, char *buf, size_t len) {
  if (rank == 1)
    snprintf(buf, len, "[%llu]", (unsigned long long)d[0]);
  else if (rank == 2)
    snprintf(buf, len, "[%llu, %llu]", (unsigned long long)d[0],
             (unsigned long long)d[1]);
  else
    snprintf(buf, len, "rank %d", rank);
}

static void refit_h5_expected_str(const refit_src_tensor_t *t, char *buf,
                                  size_t len) {
  if (refit_src_is_1d(t))
    snprintf(buf, len, "[%lld]", (long long)refit_src_elements(t));
  else
    snprintf(buf, len, "[%lld, %lld]", (long long)t->rows, (long long)t->cols);
}

/* What the dataset's type is, in words, for messages. */
static void refit_h5_type_str(hid_t type, char *buf, size_t len) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  const char *what = cls == H5T_INTEGER ? (H5Tget_sign(type) == H5T_SGN_NONE
                                               ? "unsigned integer"
                                               : "signed integer")
                     : cls == H5T_FLOAT  ? "float"
                     : cls == H5T_STRING ? "string"
                     : cls == H5T_COMPOUND ? "compound"
                                           : "non-numeric";
  snprintf(buf, len, "%zu-bit %s", size * 8, what);
}

/* Decide the element format of dataset `name` from its type and its dtype
 * attribute; anything else is an unsupported schema. */
static refit_status_t refit_h5_check_type(refit_h5_source_t *c, hid_t dset,
                                          const char *name,
                                          refit_h5_elem_t *elem) {
  refit_status_t st = REFIT_OK;
  char attr[64], tstr[64];
  int has_attr = 0;
  hid_t type = -1;
  REFIT_H5_CHECK_GOTO(type = H5Dget_type(dset), st, out,
                      "checkpoint %s: dataset '%s'", c->path, name);
  st = refit_h5_attr_read_str(dset, "dtype", attr, sizeof(attr), &has_attr);
  if (st != REFIT_OK) {
    char why[512];
    snprintf(why, sizeof(why), "%s", refit_last_error());
    st = REFIT_ERR(st, "checkpoint %s: dataset '%s': %s", c->path, name, why);
    goto out;
  }
  refit_h5_type_str(type, tstr, sizeof(tstr));
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_INTEGER && size == 2 && H5Tget_sign(type) == H5T_SGN_NONE) {
    if (!has_attr || strcmp(attr, "bfloat16") != 0) {
      st = REFIT_ERR(REFIT_ERR_HDF5,
                     "checkpoint %s: dataset '%s': 16-bit unsigned integers "
                     "with dtype attribute %s%s%s; expected dtype = "
                     "\"bfloat16\" (the only 16-bit integer schema refit "
                     "reads)",
                     c->path, name, has_attr ? "\"" : "(none)",
                     has_attr ? attr : "", has_attr ? "\"" : "");
      goto out;
    }
    *elem = REFIT_H5_ELEM_BF16;
  } else if (cls == H5T_FLOAT && (size == 4 || size == 2)) {
    size_t spos, epos, esize, mpos, msize;
    H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize);
    const int ieee32 = size == 4 && esize == 8 && msize == 23 &&
                       H5Tget_ebias(type) == 127;
    const int ieee16 = size == 2 && esize == 5 && msize == 10 &&
                       H5Tget_ebias(type) == 15;
    if (!ieee32 && !ieee16) {
      st = REFIT_ERR(REFIT_ERR_HDF5,
                     "checkpoint %s: dataset '%s': %s with %zu exponent and "
                     "%zu mantissa bits is not IEEE float32 or float16; "
                     "store bfloat16 as uint16 with dtype = \"bfloat16\"",
                     c->path, name, tstr, esize, msize);
      goto out;
    }
    *elem = ieee32 ? REFIT_H5_ELEM_F32 : REFIT_H5_ELEM_F16;
    if (has_attr && strcmp(attr, refit_h5_elem_names[*elem]) != 0) {
      st = REFIT_ERR(REFIT_ERR_HDF5,
                     "checkpoint %s: dataset '%s': element type %s but dtype "
                     "attribute \"%s\"; expected \"%s\" or no attribute",
                     c->path, name, refit_h5_elem_names[*elem], attr,
                     refit_h5_elem_names[*elem]);
      goto out;
    }
  } else {
    st = REFIT_ERR(REFIT_ERR_HDF5,
                   "checkpoint %s: dataset '%s': unsupported element type "
                   "(%s%s%s%s); expected bfloat16 (uint16 with dtype = "
                   "\"bfloat16\"), float32 or float16",
                   c->path, name, tstr, has_attr ? ", dtype \"" : "",
                   has_attr ? attr : "", has_attr ? "\"" : "");
    goto out;
  }
out:
  if (type >= 0)
    H5Tclose(type);
  return st;
}

/* Shape, element type and data of the dataset of src tensor i. */
static refit_status_t refit_h5_check_tensor(refit_h5_source_t *c, int64_t i,
                                            off_t file_size) {
  const refit_src_tensor_t *t = &c->cat->hf[i];
  refit_status_t st = REFIT_OK;
  hid_t dset = -1, space = -1, dcpl = -1;
  hsize_t dims[H5S_MAX_RANK];
  char want[64], got[64];
  H5O_info_t info;
  htri_t exists;
  refit_h5_elem_t elem = REFIT_H5_ELEM_BF16;

  refit_h5_expected_str(t, want, sizeof(want));
  REFIT_H5_CHECK_GOTO(exists = H5Lexists(c->file, t->name, H5P_DEFAULT), st, out,
                      "checkpoint %s: dataset '%s'", c->path, t->name);
  if (!exists) {
    st = REFIT_ERR(REFIT_ERR_HDF5,
                   "checkpoint %s: dataset '%s' is missing (expected %s "
                   "bfloat16, float32 or float16 for this model; was the "
                   "checkpoint written for another config?)",
                   c->path, t->name, want);
    goto out;
  }
  REFIT_H5_CHECK_GOTO(H5Oget_info_by_name(c->file, t->name, &info, H5P_DEFAULT),
                      st, out, "checkpoint %s: dataset '%s'", c->path, t->name);
  if (info.type != H5O_TYPE_DATASET) {
    st = REFIT_ERR(REFIT_ERR_HDF5,
                   "checkpoint %s: '%s' is a %s, expected a dataset of shape %s",
                   c->path, t->name,
                   info.type == H5O_TYPE_GROUP ? "group" : "named datatype",
                   want);
    goto out;
  }
  REFIT_H5_CHECK_GOTO(dset = H5Dopen2(c->file, t->name, H5P_DEFAULT), st, out,
                      "checkpoint %s: dataset '%s'", c->path, t->name);
  REFIT_H5_CHECK_GOTO(space = H5Dget_space(dset), st, out,
                      "checkpoint %s: dataset '%s'", c->path, t->name);
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 0 || rank > H5S_MAX_RANK) {
    st = refit_h5_error("H5Sget_simple_extent_ndims",
                        "checkpoint %s: dataset '%s'", c->path, t->name);
    goto out;
  }
  H5Sget_simple_extent_dims(space, dims, NULL);
  /* [n] is the schema for 1-D tensors; [1, n] is the same bytes. */
  const int ok =
      (rank == 2 && dims[0] == (hsize_t)t->rows && dims[1] == (hsize_t)t->cols) ||
      (rank == 1 && refit_src_is_1d(t) && dims[0] == (hsize_t)refit_src_elements(t));
  if (!ok) {
    refit_h5_shape_str(rank, dims, got, sizeof(got));
    st = REFIT_ERR(REFIT_ERR_HDF5,
                   "checkpoint %s: dataset '%s' has shape %s, expected %s",
                   c->path, t->name, got, want);
    goto out;
  }
  REFIT_CHECK_GOTO(refit_h5_check_type(c, dset, t->name, &elem), st, out);

  /* The data must be in the file: a contiguous dataset whose bytes end past
   * the end of the file was cut off (HDF5 itself only notices when read). */
  REFIT_H5_CHECK_GOTO(dcpl = H5Dget_create_plist(dset), st, out,
                      "checkpoint %s: dataset '%s'", c->path, t->name);
  if (H5Pget_layout(dcpl) == H5D_CONTIGUOUS) {
    const unsigned long long need =
        (unsigned long long)refit_src_elements(t) * (elem == REFIT_H5_ELEM_F32 ? 4u : 2u);
    const haddr_t off = H5Dget_offset(dset);
    const unsigned long long have = H5Dget_storage_size(dset);
    if (off == HADDR_UNDEF || have < need ||
        (unsigned long long)off + need > (unsigned long long)file_size) {
      st = REFIT_ERR(REFIT_ERR_HDF5,
                     "checkpoint %s: dataset '%s': %s of data expected at "
                     "offset %s, but the file has %lld bytes (truncated or "
                     "never written; rewrite the checkpoint)",
                     c->path, t->name,
                     (snprintf(want, sizeof(want), "%llu bytes", need), want),
                     off == HADDR_UNDEF
                         ? "(none allocated)"
                         : (snprintf(got, sizeof(got), "%llu",
                                     (unsigned long long)off),
                            got),
                     (long long)file_size);
      goto out;
    }
  }
  /* Chunked data is read through its filters: one this HDF5 cannot decode
   * (h5py's lzf, a plugin not installed) is refused here, not mid-refit. */
  const int nfilters = H5Pget_nfilters(dcpl);
  for (int k = 0; k < nfilters; k++) {
    unsigned flags = 0, cd[8];
    size_t ncd = 8;
    char fname[64] = "";
    const H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)k, &flags, &ncd, cd,
                                           sizeof(fname), fname, NULL);
    if (id < 0 || H5Zfilter_avail(id) <= 0) {
      st = REFIT_ERR(REFIT_ERR_HDF5,
                     "checkpoint %s: dataset '%s' is compressed with filter %d (%s), "
                     "which this HDF5 library cannot decode; rewrite it without "
                     "that filter (e.g. gzip or none)",
                     c->path, t->name, (int)id, fname[0] ? fname : "unnamed");
      goto out;
    }
  }
  /* The child reads every chunk index (metadata, no data), so that a
   * damaged index fails there and not in the rank mid-refit. */
  if (c->probe && H5Pget_layout(dcpl) == H5D_CHUNKED) {
    hsize_t nchunks = 0;
    REFIT_H5_CHECK_GOTO(H5Dget_num_chunks(dset, space, &nchunks), st, out,
                        "checkpoint %s: dataset '%s': chunk index", c->path, t->name);
  }
  c->elem[i] = (unsigned char)elem;
  c->rank[i] = (unsigned char)rank;
out:
  if (dcpl >= 0)
    H5Pclose(dcpl);
  if (space >= 0)
    H5Sclose(space);
  if (dset >= 0)
    H5Dclose(dset);
  return st;
}

static void refit_h5_source_close(void *ctx) {
  refit_h5_source_t *c = ctx;
  if (c == NULL)
    return;
  if (c->dset >= 0)
    H5Dclose(c->dset);
  if (c->f16 >= 0)
    H5Tclose(c->f16);
  if (c->file >= 0)
    H5Fclose(c->file);
  free(c->elem);
  free(c->rank);
  free(c->tmp);
  free(c);
}

/* Open and check the file in this process; probe: the checking child. */
static refit_status_t refit_h5_open_here(const refit_config_t *cfg,
                                         const refit_catalog_t *cat, int probe,
                                         void **ctx) {
  refit_status_t st = REFIT_OK;
  struct stat sb;
  int fd = -1;
  htri_t is_h5;
  refit_h5_source_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "hdf5 source");
  c->file = c->dset = c->f16 = -1;
  c->open_index = -1;
  c->cat = cat;
  c->probe = probe;
  snprintf(c->path, sizeof(c->path), "%s", cfg->source.path);
  refit_h5_quiet();

  /* HDF5 opens the path itself: make sure first that it is a regular file,
   * so that a FIFO is refused by name instead of blocking the open. */
  if (refit_file_open_regular(c->path, "checkpoint", &fd, &sb) != REFIT_OK) {
    char why[1024];
    snprintf(why, sizeof(why), "%s", refit_last_error());
    st = REFIT_ERR(REFIT_ERR_HDF5,
                   "%s (source.path; write one with refit-ckpt CONFIG FILE)", why);
    goto err_free;
  }
  close(fd);
  REFIT_H5_CHECK_GOTO(is_h5 = H5Fis_hdf5(c->path), st, err_free,
                      "checkpoint %s", c->path);
  if (!is_h5) {
    st = REFIT_ERR(REFIT_ERR_HDF5,
                   "checkpoint %s: not an HDF5 file (no HDF5 signature in its "
                   "%lld bytes)",
                   c->path, (long long)sb.st_size);
    goto err_free;
  }
  REFIT_H5_CHECK_GOTO(c->file = H5Fopen(c->path, H5F_ACC_RDONLY, H5P_DEFAULT),
                      st, err_free,
                      "checkpoint %s (%lld bytes): cannot open it as HDF5; "
                      "the file is damaged or truncated",
                      c->path, (long long)sb.st_size);
  REFIT_H5_CHECK_GOTO(c->f16 = refit_h5_type_f16(), st, err_free,
                      "checkpoint %s: float16 type", c->path);
  c->elem = calloc((size_t)cat->nhf, 1);
  c->rank = calloc((size_t)cat->nhf, 1);
  if (c->elem == NULL || c->rank == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "hdf5 source: %lld tensors",
                   (long long)cat->nhf);
    goto err_free;
  }
  for (int64_t i = 0; i < cat->nhf; i++)
    REFIT_CHECK_GOTO(refit_h5_check_tensor(c, i, sb.st_size), st, err_free);
  *ctx = c;
  return REFIT_OK;

err_free:
  refit_h5_source_close(c);
  return st;
}

/* Exit status of a child that refused the file (its message on the pipe). */
#define REFIT_H5_PROBE_REFUSED 64

/* Run refit_h5_open_here's checks in a child: REFIT_OK when it accepted the
 * file, its message when it refused it, and a refusal naming the file when
 * libhdf5 crashed or hung on it. The child's verdict travels on the pipe
 * (a status byte, REFIT_OK included, then a refusal's message), and the
 * parent decides from it: its exit status only says how a child without a
 * verdict died, and an application that reaps its children (SIGCHLD set to
 * SIG_IGN, or a handler calling waitpid) takes that from us (ECHILD). */
static refit_status_t refit_h5_probe(const refit_config_t *cfg,
                                     const refit_catalog_t *cat) {
  const char *path = cfg->source.path;
  int fds[2];
  if (pipe(fds) != 0)
    return REFIT_ERR(REFIT_ERR_SYSTEM, "checkpoint %s: pipe: %s", path,
                     strerror(errno));
  fflush(NULL);
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    close(fds[0]);
    close(fds[1]);
    return REFIT_ERR(REFIT_ERR_SYSTEM, "checkpoint %s: fork: %s", path, strerror(e));
  }
  if (pid == 0) { /* the child: check, report, _exit (no atexit handlers) */
    close(fds[0]);
    void *ctx = NULL;
    const refit_status_t cst = refit_h5_open_here(cfg, cat, 1, &ctx);
    if (cst == REFIT_OK) {
      refit_h5_source_close(ctx);
      const unsigned char ok = REFIT_OK; /* the verdict: accepted */
      _exit(write(fds[1], &ok, 1) == 1 ? 0 : REFIT_H5_PROBE_REFUSED);
    }
    const unsigned char code = (unsigned char)cst; /* first byte: the status */
    if (write(fds[1], &code, 1) != 1)
      _exit(REFIT_H5_PROBE_REFUSED);
    const char *msg = refit_last_error();
    size_t left = strlen(msg);
    while (left > 0) {
      const ssize_t w = write(fds[1], msg, left);
      if (w <= 0)
        break;
      msg += w;
      left -= (size_t)w;
    }
    _exit(REFIT_H5_PROBE_REFUSED);
  }
  close(fds[1]);
  char msg[2048];
  size_t got = 0;
  int timed_out = 0;
  const time_t deadline = time(NULL) + REFIT_H5_PROBE_SECONDS;
  for (;;) {
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    const time_t now = time(NULL);
    if (now >= deadline) {
      timed_out = 1;
      break;
    }
    const int r = poll(&p, 1, (int)(deadline - now) * 1000);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      timed_out = r == 0;
      break;
    }
    char buf[512];
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break; /* end of file: the child is done */
    const size_t take = (size_t)n < sizeof(msg) - 1 - got ? (size_t)n : sizeof(msg) - 1 - got;
    memcpy(msg + got, buf, take);
    got += take;
  }
  msg[got] = '\0';
  close(fds[0]);
  if (timed_out)
    kill(pid, SIGKILL);
  /* The child is reaped here, or by the application (ECHILD): either way
   * the verdict on the pipe decides. */
  int wst = 0, reaped = 1;
  while (waitpid(pid, &wst, 0) < 0) {
    if (errno == ECHILD) {
      reaped = 0;
      break;
    }
    if (errno != EINTR)
      return REFIT_ERR(REFIT_ERR_SYSTEM, "checkpoint %s: waitpid: %s", path,
                       strerror(errno));
  }
  if (timed_out)
    return REFIT_ERR(REFIT_ERR_HDF5,
                     "checkpoint %s: the HDF5 library did not finish reading its "
                     "metadata in %d s; the file is damaged (rewrite the checkpoint)",
                     path, REFIT_H5_PROBE_SECONDS);
  const int exited_clean = !reaped || WIFEXITED(wst);
  if (exited_clean && got == 1 && msg[0] == REFIT_OK)
    return REFIT_OK;
  if (exited_clean && got > 1 && (unsigned char)msg[0] < REFIT_STATUS_COUNT &&
      msg[0] != REFIT_OK)
    return REFIT_ERR((refit_status_t)(unsigned char)msg[0], "%s", msg + 1);
  char how[96];
  if (!reaped)
    snprintf(how, sizeof(how),
             "ended without a verdict (crashed; the application "
             "reaped it, so how is unknown) while");
  else if (WIFSIGNALED(wst))
    snprintf(how, sizeof(how), "died of signal %d (%s)", WTERMSIG(wst),
             strsignal(WTERMSIG(wst)));
  else
    snprintf(how, sizeof(how), "exited with status %d", WEXITSTATUS(wst));
  return REFIT_ERR(REFIT_ERR_HDF5,
                   "checkpoint %s: the HDF5 library %s reading its metadata (in a "
                   "checking process; this rank is unharmed): the file is damaged "
                   "or not written by HDF5; rewrite the checkpoint",
                   path, how);
}

static refit_status_t refit_h5_source_open(const refit_config_t *cfg,
                                           const refit_catalog_t *cat,
                                           void **ctx) {
  REFIT_CHECK(refit_h5_probe(cfg, cat));
  return refit_h5_open_here(cfg, cat, 0, ctx);
}

/* An FP32 vector (REFIT_ROLE_F32), whole: float32 as it is, bfloat16 and
 * float16 widened (exactly), then cut into 2-byte units. */
static refit_status_t refit_h5_read_f32(refit_h5_source_t *c, const refit_src_tensor_t *t,
                                        refit_h5_elem_t elem, int64_t col0, int64_t cols,
                                        uint16_t *dst) {
  const int64_t n = refit_src_elements(t);
  uint32_t *words = malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
  uint16_t *half = malloc((size_t)(n ? n : 1) * sizeof(uint16_t));
  refit_status_t st = REFIT_OK;
  if (words == NULL || half == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "checkpoint %s: '%s': %lld floats", c->path,
                   t->name, (long long)n);
    goto out;
  }
  const hid_t mtype = elem == REFIT_H5_ELEM_BF16  ? H5T_NATIVE_UINT16
                      : elem == REFIT_H5_ELEM_F16 ? c->f16
                                                  : H5T_NATIVE_FLOAT;
  REFIT_H5_CHECK_GOTO(H5Dread(c->dset, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                              elem == REFIT_H5_ELEM_F32 ? (void *)words : (void *)half),
                      st, out, "checkpoint %s: dataset '%s'", c->path, t->name);
  for (int64_t k = 0; elem != REFIT_H5_ELEM_F32 && k < n; k++)
    words[k] = elem == REFIT_H5_ELEM_BF16 ? (uint32_t)half[k] << 16
                                          : refit_f32_from_f16(half[k]);
  refit_source_f32_units(words, col0, cols, dst);
out:
  free(words);
  free(half);
  return st;
}

static refit_status_t refit_h5_source_read(void *ctx, const refit_src_tensor_t *t,
                                           uint64_t version, int64_t row0,
                                           int64_t col0, int64_t rows,
                                           int64_t cols, uint16_t *dst) {
  refit_h5_source_t *c = ctx;
  refit_status_t st = REFIT_OK;
  hid_t fspace = -1, mspace = -1;
  (void)version; /* a checkpoint holds one version */

  int64_t i;
  REFIT_CHECK(refit_source_check_rect(c->cat, c->path, t, row0, col0, rows, cols, &i));
  if (rows == 0 || cols == 0)
    return REFIT_OK;
  /* Verification reads one row at a time from the same tensor: keep the
   * last dataset open. */
  if (c->open_index != i) {
    if (c->dset >= 0)
      H5Dclose(c->dset);
    c->open_index = -1;
    REFIT_H5_CHECK_GOTO(c->dset = H5Dopen2(c->file, t->name, H5P_DEFAULT), st,
                        out, "checkpoint %s: dataset '%s'", c->path, t->name);
    c->open_index = i;
  }
  const refit_h5_elem_t elem = (refit_h5_elem_t)c->elem[i];
  if (refit_src_is_f32(t))
    return refit_h5_read_f32(c, t, elem, col0, cols, dst);
  int64_t block = rows;
  if (elem == REFIT_H5_ELEM_F32) {
    block = REFIT_H5_BLOCK_ELEMS / cols > 0 ? REFIT_H5_BLOCK_ELEMS / cols : 1;
    if (block > rows)
      block = rows;
    if (c->tmp_elems < (size_t)(block * cols)) {
      free(c->tmp);
      c->tmp_elems = 0;
      c->tmp = malloc((size_t)(block * cols) * sizeof(float));
      if (c->tmp == NULL)
        return REFIT_ERR(REFIT_ERR_NO_MEMORY, "checkpoint %s: %lld floats",
                         c->path, (long long)(block * cols));
      c->tmp_elems = (size_t)(block * cols);
    }
  }
  REFIT_H5_CHECK_GOTO(fspace = H5Dget_space(c->dset), st, out,
                      "checkpoint %s: dataset '%s'", c->path, t->name);
  for (int64_t r = 0; r < rows; r += block) {
    const int64_t n = rows - r < block ? rows - r : block;
    hsize_t start[2], count[2], elems = (hsize_t)(n * cols);
    uint16_t *out16 = dst + r * cols;
    if (c->rank[i] == 1) {
      /* A 1-D tensor is one row [1, n] (a norm) or one column [n, 1] (a
       * bias): the rows and columns asked for are contiguous elements. */
      start[0] = (hsize_t)((row0 + r) * t->cols + col0);
      count[0] = (hsize_t)(n * cols);
    } else {
      start[0] = (hsize_t)(row0 + r);
      start[1] = (hsize_t)col0;
      count[0] = (hsize_t)n;
      count[1] = (hsize_t)cols;
    }
    REFIT_H5_CHECK_GOTO(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL,
                                            count, NULL),
                        st, out, "checkpoint %s: dataset '%s'", c->path, t->name);
    if (mspace >= 0)
      H5Sclose(mspace);
    REFIT_H5_CHECK_GOTO(mspace = H5Screate_simple(1, &elems, NULL), st, out,
                        "checkpoint %s: dataset '%s'", c->path, t->name);
    const hid_t mtype = elem == REFIT_H5_ELEM_BF16  ? H5T_NATIVE_UINT16
                        : elem == REFIT_H5_ELEM_F16 ? c->f16
                                                    : H5T_NATIVE_FLOAT;
    void *buf = elem == REFIT_H5_ELEM_F32 ? (void *)c->tmp : (void *)out16;
    REFIT_H5_CHECK_GOTO(H5Dread(c->dset, mtype, mspace, fspace, H5P_DEFAULT, buf),
                        st, out,
                        "checkpoint %s: dataset '%s' rows [%lld, %lld) cols "
                        "[%lld, %lld)",
                        c->path, t->name, (long long)(row0 + r),
                        (long long)(row0 + r + n), (long long)col0,
                        (long long)(col0 + cols));
    if (elem == REFIT_H5_ELEM_F32)
      for (hsize_t k = 0; k < elems; k++)
        out16[k] = refit_bf16_from_f32(refit_f32_bits(c->tmp[k]));
    else if (elem == REFIT_H5_ELEM_F16)
      for (hsize_t k = 0; k < elems; k++)
        out16[k] = refit_bf16_from_f16(out16[k]);
  }
out:
  if (mspace >= 0)
    H5Sclose(mspace);
  if (fspace >= 0)
    H5Sclose(fspace);
  return st;
}

const refit_source_ops_t refit_source_hdf5 = {
    .name = "hdf5",
    .kind = REFIT_SOURCE_HDF5,
    .open = refit_h5_source_open,
    .read = refit_h5_source_read,
    .close = refit_h5_source_close,
};
