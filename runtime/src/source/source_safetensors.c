/*
 * The safetensors checkpoint source (source.kind: safetensors): a Hugging
 * Face checkpoint, one file or a directory of shards with
 * model.safetensors.index.json ({"metadata": {...}, "weight_map": {tensor:
 * file}}), tensors under their Hugging Face names as they are on disk (one
 * per expert). Every rank reads the headers; a trainer then reads only its
 * own shard's rows and verification only the rows it checks, each with
 * pread, never a whole tensor. BF16 is read as it is; F16 and F32 are
 * converted to BF16 as the HDF5 source converts them (dump.h). The
 * checkpoint holds one version, so `version` is ignored.
 *
 * open() checks every file and every tensor of the catalog (header rules of
 * safetensors.h, presence, dtype, shape) and lists every problem at once,
 * each with its file and tensor, before any transfer.
 */
#include "core/file.h"
#include "source/h5file.h"
#include "source/safetensors.h"
#include "source/source.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REFIT_ST_INDEX "model.safetensors.index.json"
#define REFIT_ST_SINGLE "model.safetensors"
/* Problems listed in the error message; the rest are counted. */
#define REFIT_ST_LISTED 12
/* Elements converted per pread: bounds the temporary. */
#define REFIT_ST_BLOCK_BYTES ((size_t)4 << 20)

typedef struct {
  char *path;
  int fd;
  int ok; /* its header was read and holds */
  refit_st_header_t header;
} refit_st_file_t;

typedef struct {
  char path[REFIT_PATH_MAX]; /* source.path */
  const refit_catalog_t *cat;
  refit_st_file_t *files;
  int nfiles;
  /* Per catalog Hugging Face tensor: its file and entry. */
  int *file_of;
  const refit_st_tensor_t **entry;
  unsigned char *tmp;
} refit_st_source_t;

typedef struct {
  FILE *out;
  char *text;
  size_t len;
  int n;
} refit_st_list_t;

static void refit_st_add(refit_st_list_t *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void refit_st_add(refit_st_list_t *l, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfprintf(l->out, fmt, ap);
  fputc('\n', l->out);
  va_end(ap);
  l->n++;
}

static void refit_st_source_close(void *ctx) {
  refit_st_source_t *c = ctx;
  if (c == NULL)
    return;
  for (int i = 0; i < c->nfiles; i++) {
    if (c->files[i].fd >= 0)
      close(c->files[i].fd);
    refit_st_header_free(&c->files[i].header);
    free(c->files[i].path);
  }
  free(c->files);
  free(c->file_of);
  free(c->entry);
  free(c->tmp);
  free(c);
}

/* Open file `path` and read its header; problems go to the list. */
static void refit_st_open_file(refit_st_file_t *f, refit_st_list_t *l) {
  struct stat sb;
  unsigned char prefix[8];
  uint64_t n = 0;
  /* A FIFO among the shards is refused by name, never opened blocking. */
  if (refit_file_open_regular(f->path, "safetensors file", &f->fd, &sb) != REFIT_OK) {
    f->fd = -1;
    refit_st_add(l, "%s", refit_last_error());
    return;
  }
  const ssize_t got = pread(f->fd, prefix, sizeof(prefix), 0);
  if (refit_st_header_length(f->path, prefix, got > 0 ? (size_t)got : 0,
                             (uint64_t)sb.st_size, &n, l->out) > 0) {
    l->n++;
    return;
  }
  char *json = malloc(n + 1);
  if (json == NULL) {
    refit_st_add(l, "%s: out of memory for a %llu-byte header", f->path,
                 (unsigned long long)n);
    return;
  }
  if (pread(f->fd, json, n, 8) != (ssize_t)n) {
    refit_st_add(l, "%s: reading the %llu-byte header: %s", f->path,
                 (unsigned long long)n, strerror(errno));
    free(json);
    return;
  }
  const int bad = refit_st_header_parse(f->path, json, n, (uint64_t)sb.st_size - 8 - n,
                                        &f->header, l->out);
  l->n += bad;
  f->ok = bad == 0;
  free(json);
}

/* Add a file by path; returns its index, or -1 out of memory. */
static int refit_st_add_file(refit_st_source_t *c, const char *path) {
  for (int i = 0; i < c->nfiles; i++)
    if (strcmp(c->files[i].path, path) == 0)
      return i;
  refit_st_file_t *f = realloc(c->files, (size_t)(c->nfiles + 1) * sizeof(*f));
  if (f == NULL)
    return -1;
  c->files = f;
  f[c->nfiles] = (refit_st_file_t){strdup(path), -1, 0, {NULL, 0, 0}};
  if (f[c->nfiles].path == NULL)
    return -1;
  return c->nfiles++;
}

/* The index of a sharded checkpoint: file of every catalog tensor. */
static void refit_st_read_index(refit_st_source_t *c, const char *dir, const char *index,
                                refit_st_list_t *l) {
  json_error_t jerr;
  int fd = -1;
  if (refit_file_open_regular(index, "safetensors index", &fd, NULL) != REFIT_OK) {
    refit_st_add(l, "%s", refit_last_error());
    return;
  }
  json_t *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &jerr);
  close(fd);
  if (root == NULL) {
    refit_st_add(l, "%s: not a valid index (line %d column %d: %s)", index, jerr.line,
                 jerr.column, jerr.text);
    return;
  }
  const json_t *map = json_object_get(root, "weight_map");
  if (!json_is_object(map)) {
    refit_st_add(l, "%s: no \"weight_map\" object of tensor -> file", index);
    json_decref(root);
    return;
  }
  const char *name;
  json_t *v;
  json_object_foreach((json_t *)map, name, v) {
    const char *file = json_string_value(v);
    if (file == NULL || file[0] == '\0' || strchr(file, '/') != NULL ||
        strcmp(file, "..") == 0 || strcmp(file, ".") == 0)
      refit_st_add(l,
                   "%s: weight_map['%.200s'] is not a file name in the "
                   "index's directory",
                   index, name);
  }
  for (int64_t i = 0; i < c->cat->nhf; i++) {
    const char *file = json_string_value(json_object_get(map, c->cat->hf[i].name));
    c->file_of[i] = -1;
    if (file != NULL && (file[0] == '\0' || strchr(file, '/') != NULL ||
                         strcmp(file, "..") == 0 || strcmp(file, ".") == 0))
      continue; /* reported above */
    if (file == NULL) {
      refit_st_add(l,
                   "%s: tensor '%s' is missing from weight_map (was the "
                   "checkpoint written for another model?)",
                   index, c->cat->hf[i].name);
      continue;
    }
    char path[2 * REFIT_PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    c->file_of[i] = refit_st_add_file(c, path);
    if (c->file_of[i] < 0)
      refit_st_add(l, "%s: out of memory", index);
  }
  json_decref(root);
}

static void refit_st_shape_str(const refit_st_tensor_t *t, char *buf, size_t n) {
  size_t off = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < t->rank && off < n; d++)
    off += (size_t)snprintf(buf + off, n - off, "%s%lld", d ? ", " : "",
                            (long long)t->shape[d]);
  if (off < n)
    snprintf(buf + off, n - off, "]");
}

/* The tensor as the catalog needs it: BF16, F16 or F32 of its shape. */
static void refit_st_check_tensor(refit_st_source_t *c, int64_t i, refit_st_list_t *l) {
  const refit_src_tensor_t *t = &c->cat->hf[i];
  const refit_st_file_t *f = &c->files[c->file_of[i]];
  char want[64], got[160];
  if (refit_src_is_1d(t))
    snprintf(want, sizeof(want), "[%lld]", (long long)refit_src_elements(t));
  else
    snprintf(want, sizeof(want), "[%lld, %lld]", (long long)t->rows, (long long)t->cols);
  const refit_st_tensor_t *e = refit_st_header_find(&f->header, t->name);
  if (e == NULL) {
    refit_st_add(l,
                 "%s: tensor '%s' is missing (expected %s BF16, F16 or "
                 "F32 for this model)",
                 f->path, t->name, want);
    return;
  }
  const int ok =
      (e->rank == 2 && e->shape[0] == t->rows && e->shape[1] == t->cols) ||
      (e->rank == 1 && refit_src_is_1d(t) && e->shape[0] == refit_src_elements(t));
  if (!ok) {
    refit_st_shape_str(e, got, sizeof(got));
    refit_st_add(l, "%s: tensor '%s' has shape %s, expected %s", f->path, t->name, got,
                 want);
  }
  if (strcmp(e->dtype, "BF16") && strcmp(e->dtype, "F16") && strcmp(e->dtype, "F32"))
    refit_st_add(l, "%s: tensor '%s' has dtype %s; expected BF16, F16 or F32", f->path,
                 t->name, e->dtype);
  c->entry[i] = e;
}

static refit_status_t refit_st_source_open(const refit_config_t *cfg,
                                           const refit_catalog_t *cat, void **ctx) {
  refit_status_t st = REFIT_OK;
  struct stat sb;
  refit_st_list_t l = {0};
  refit_st_source_t *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "safetensors source");
  c->cat = cat;
  snprintf(c->path, sizeof(c->path), "%s", cfg->source.path);
  c->file_of = calloc((size_t)cat->nhf + 1, sizeof(*c->file_of));
  c->entry = calloc((size_t)cat->nhf + 1, sizeof(*c->entry));
  c->tmp = malloc(REFIT_ST_BLOCK_BYTES);
  l.out = open_memstream(&l.text, &l.len);
  if (c->file_of == NULL || c->entry == NULL || c->tmp == NULL || l.out == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "safetensors source: %lld tensors",
                   (long long)cat->nhf);
    goto err;
  }

  if (stat(c->path, &sb) != 0) {
    refit_st_add(&l,
                 "%s: %s (source.path: a .safetensors file or a directory "
                 "with " REFIT_ST_INDEX "; write one with refit-ckpt "
                 "--format safetensors)",
                 c->path, strerror(errno));
  } else if (S_ISDIR(sb.st_mode)) {
    char index[2 * REFIT_PATH_MAX];
    snprintf(index, sizeof(index), "%s/" REFIT_ST_INDEX, c->path);
    if (stat(index, &sb) == 0) {
      refit_st_read_index(c, c->path, index, &l);
    } else {
      snprintf(index, sizeof(index), "%s/" REFIT_ST_SINGLE, c->path);
      if (stat(index, &sb) != 0)
        refit_st_add(
            &l, "%s: a directory with neither " REFIT_ST_INDEX " nor " REFIT_ST_SINGLE,
            c->path);
      else if (refit_st_add_file(c, index) < 0)
        refit_st_add(&l, "%s: out of memory", c->path);
    }
  } else if (refit_st_add_file(c, c->path) < 0) {
    refit_st_add(&l, "%s: out of memory", c->path);
  }
  for (int i = 0; i < c->nfiles; i++)
    refit_st_open_file(&c->files[i], &l);
  for (int64_t i = 0; i < cat->nhf; i++)
    if (c->file_of[i] >= 0 && c->file_of[i] < c->nfiles && c->files[c->file_of[i]].ok)
      refit_st_check_tensor(c, i, &l);
  fflush(l.out);
  if (l.n > 0) {
    /* The first problems in full, then a count: the message is bounded. */
    int shown = 0;
    const char *end = l.text;
    while (shown < REFIT_ST_LISTED && (end = strchr(end, '\n')) != NULL) {
      end++;
      shown++;
    }
    if (end == NULL)
      end = l.text + strlen(l.text);
    st = REFIT_ERR(REFIT_ERR_CONFIG,
                   "safetensors checkpoint %s: %d problem%s, no transfer "
                   "started:\n%.*s%s",
                   c->path, l.n, l.n == 1 ? "" : "s", (int)(end - l.text), l.text,
                   shown < l.n ? "(and more)\n" : "");
    goto err;
  }
  fclose(l.out);
  free(l.text);
  *ctx = c;
  return REFIT_OK;

err:
  if (l.out != NULL)
    fclose(l.out);
  free(l.text);
  refit_st_source_close(c);
  return st;
}

/* An FP32 vector (REFIT_ROLE_F32), whole: F32 as it is, BF16 and F16
 * widened (exactly), then cut into 2-byte units. */
static refit_status_t refit_st_read_f32(const refit_st_file_t *f,
                                        const refit_st_tensor_t *e,
                                        const refit_src_tensor_t *t, int64_t col0,
                                        int64_t cols, uint16_t *dst) {
  const int64_t n = refit_src_elements(t);
  const size_t esize = (size_t)e->elem_bytes, bytes = (size_t)n * esize;
  unsigned char *raw = malloc(bytes ? bytes : 1);
  uint32_t *words = malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
  refit_status_t st = REFIT_OK;
  if (raw == NULL || words == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "checkpoint %s: '%s': %lld floats", f->path,
                   t->name, (long long)n);
    goto out;
  }
  for (size_t done = 0; done < bytes;) {
    const off_t off = (off_t)(f->header.data_offset + e->begin + done);
    ssize_t got = pread(f->fd, raw + done, bytes - done, off);
    if (got <= 0) {
      st =
          REFIT_ERR(REFIT_ERR_SYSTEM, "checkpoint %s: tensor '%s': read at byte %llu: %s",
                    f->path, t->name, (unsigned long long)off,
                    got == 0 ? "end of file (truncated since opened?)" : strerror(errno));
      goto out;
    }
    done += (size_t)got;
  }
  for (int64_t k = 0; k < n; k++) {
    uint16_t h;
    if (esize == 4) {
      memcpy(&words[k], raw + 4 * k, 4);
      continue;
    }
    memcpy(&h, raw + 2 * k, 2);
    words[k] = strcmp(e->dtype, "F16") == 0 ? refit_f32_from_f16(h) : (uint32_t)h << 16;
  }
  refit_source_f32_units(words, col0, cols, dst);
out:
  free(raw);
  free(words);
  return st;
}

static refit_status_t refit_st_source_read(void *ctx, const refit_src_tensor_t *t,
                                           uint64_t version, int64_t row0, int64_t col0,
                                           int64_t rows, int64_t cols, uint16_t *dst) {
  refit_st_source_t *c = ctx;
  (void)version; /* a checkpoint holds one version */
  int64_t i;
  REFIT_CHECK(refit_source_check_rect(c->cat, c->path, t, row0, col0, rows, cols, &i));
  const refit_st_file_t *f = &c->files[c->file_of[i]];
  const refit_st_tensor_t *e = c->entry[i];
  if (refit_src_is_f32(t))
    return rows == 0 || cols == 0 ? REFIT_OK
                                  : refit_st_read_f32(f, e, t, col0, cols, dst);
  const size_t esize = (size_t)e->elem_bytes;
  const int f32 = esize == 4, f16 = strcmp(e->dtype, "F16") == 0;
  /* Whole rows are contiguous in the file: read several at once. */
  const size_t row_bytes = esize * (size_t)cols;
  const int64_t per = cols == t->cols ? (int64_t)(REFIT_ST_BLOCK_BYTES / row_bytes)
                      : row_bytes <= REFIT_ST_BLOCK_BYTES ? 1
                                                          : 0;
  const int64_t block = per > 0 ? per : 1;
  for (int64_t r = 0; r < rows;) {
    int64_t n = rows - r < block ? rows - r : block;
    int64_t want_cols = cols;
    if (per == 0) /* a row over the block: read it in pieces */
      want_cols = (int64_t)(REFIT_ST_BLOCK_BYTES / esize);
    for (int64_t k = 0; k < cols; k += want_cols) {
      const int64_t kc = cols - k < want_cols ? cols - k : want_cols;
      const int64_t elems = per == 0 ? kc : n * cols;
      const uint64_t off =
          f->header.data_offset + e->begin +
          ((uint64_t)(row0 + r) * (uint64_t)t->cols + (uint64_t)(col0 + k)) * esize;
      const size_t bytes = (size_t)elems * esize;
      unsigned char *buf = f32 ? c->tmp : (unsigned char *)(dst + r * cols + k);
      size_t done = 0;
      while (done < bytes) {
        ssize_t got = pread(f->fd, buf + done, bytes - done, (off_t)(off + done));
        if (got <= 0)
          return REFIT_ERR(REFIT_ERR_SYSTEM,
                           "checkpoint %s: tensor '%s' rows [%lld, %lld): "
                           "read at byte %llu: %s",
                           f->path, t->name, (long long)(row0 + r),
                           (long long)(row0 + r + n), (unsigned long long)(off + done),
                           got == 0 ? "end of file (truncated since opened?)"
                                    : strerror(errno));
        done += (size_t)got;
      }
      uint16_t *out16 = dst + r * cols + k;
      /* Little-endian on disk and in memory (x86-64, aarch64). */
      if (f32)
        for (int64_t q = 0; q < elems; q++) {
          uint32_t u;
          memcpy(&u, c->tmp + 4 * q, 4);
          out16[q] = refit_bf16_from_f32(u);
        }
      else if (f16)
        for (int64_t q = 0; q < elems; q++)
          out16[q] = refit_bf16_from_f16(out16[q]);
      if (per != 0)
        break;
    }
    r += per == 0 ? 1 : n;
  }
  return REFIT_OK;
}

const refit_source_ops_t refit_source_safetensors = {
    .name = "safetensors",
    .kind = REFIT_SOURCE_SAFETENSORS,
    .open = refit_st_source_open,
    .read = refit_st_source_read,
    .close = refit_st_source_close,
};
