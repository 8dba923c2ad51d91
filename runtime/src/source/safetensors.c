/*
 * The safetensors header (safetensors.h). Rules from the format's
 * specification (huggingface/safetensors README, "Format"): the header is
 * JSON, its length at most 100 MB; duplicate keys are not allowed; offsets
 * are [begin, end) into the byte buffer, which the tensors cover entirely
 * (no holes); dtypes are the names below.
 */
#include "source/safetensors.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const struct {
  const char *name;
  int bytes;
} refit_st_dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
    {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8},
};

int refit_st_dtype_bytes(const char *dtype) {
  for (size_t i = 0; i < sizeof(refit_st_dtypes) / sizeof(refit_st_dtypes[0]); i++)
    if (strcmp(dtype, refit_st_dtypes[i].name) == 0)
      return refit_st_dtypes[i].bytes;
  return 0;
}

static int refit_st_problem(FILE *out, const char *file, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int refit_st_problem(FILE *out, const char *file, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(out, "%s: ", file);
  vfprintf(out, fmt, ap);
  fputc('\n', out);
  va_end(ap);
  return 1;
}

int refit_st_header_length(const char *file, const unsigned char *prefix, size_t have,
                           uint64_t file_size, uint64_t *n, FILE *problems) {
  if (have < 8 || file_size < 8)
    return refit_st_problem(problems, file,
                            "%llu bytes: too short for the 8-byte header "
                            "length of a safetensors file",
                            (unsigned long long)file_size);
  uint64_t len = 0;
  for (int i = 7; i >= 0; i--)
    len = len << 8 | prefix[i];
  if (len > REFIT_ST_HEADER_MAX)
    return refit_st_problem(problems, file,
                            "header length %llu is over the format's bound of "
                            "%llu bytes (not a safetensors file?)",
                            (unsigned long long)len,
                            (unsigned long long)REFIT_ST_HEADER_MAX);
  if (len > file_size - 8)
    return refit_st_problem(problems, file,
                            "header length %llu runs past the end of the "
                            "%llu-byte file (truncated?)",
                            (unsigned long long)len, (unsigned long long)file_size);
  *n = len;
  return 0;
}

static int refit_st_name_cmp(const void *a, const void *b) {
  return strcmp(((const refit_st_tensor_t *)a)->name,
                ((const refit_st_tensor_t *)b)->name);
}

static int refit_st_begin_cmp(const void *a, const void *b) {
  const refit_st_tensor_t *x = *(refit_st_tensor_t *const *)a;
  const refit_st_tensor_t *y = *(refit_st_tensor_t *const *)b;
  if (x->begin != y->begin)
    return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

/* A non-negative JSON integer. */
static bool refit_st_uint(const json_t *v, uint64_t *out) {
  if (!json_is_integer(v) || json_integer_value(v) < 0)
    return false;
  *out = (uint64_t)json_integer_value(v);
  return true;
}

/* One tensor entry; returns its problem count. */
static int refit_st_entry(const char *file, const char *name, const json_t *v,
                          uint64_t data_len, refit_st_tensor_t *t, FILE *problems) {
  const json_t *dtype = json_object_get(v, "dtype");
  const json_t *shape = json_object_get(v, "shape");
  const json_t *offsets = json_object_get(v, "data_offsets");
  if (!json_is_object(v) || !json_is_string(dtype) || !json_is_array(shape) ||
      !json_is_array(offsets) || json_array_size(offsets) != 2 ||
      !refit_st_uint(json_array_get(offsets, 0), &t->begin) ||
      !refit_st_uint(json_array_get(offsets, 1), &t->end))
    return refit_st_problem(problems, file,
                            "tensor '%s': expected {\"dtype\": name, "
                            "\"shape\": [n, ...], \"data_offsets\": [begin, "
                            "end]} with non-negative integers",
                            name);
  snprintf(t->dtype, sizeof(t->dtype), "%s", json_string_value(dtype));
  t->elem_bytes = refit_st_dtype_bytes(json_string_value(dtype));
  if (t->elem_bytes == 0)
    return refit_st_problem(problems, file, "tensor '%s': unknown dtype \"%.40s\"", name,
                            json_string_value(dtype));
  if (json_array_size(shape) > REFIT_ST_RANK_MAX)
    return refit_st_problem(problems, file, "tensor '%s': %zu dimensions; at most %d",
                            name, json_array_size(shape), REFIT_ST_RANK_MAX);
  t->rank = (int)json_array_size(shape);
  /* Element count and byte size, refusing overflow of 64 bits. */
  uint64_t bytes = (uint64_t)t->elem_bytes;
  bool overflow = false;
  for (int d = 0; d < t->rank; d++) {
    uint64_t n;
    if (!refit_st_uint(json_array_get(shape, (size_t)d), &n))
      return refit_st_problem(problems, file,
                              "tensor '%s': shape entry %d is not a "
                              "non-negative integer",
                              name, d);
    t->shape[d] = (int64_t)n;
    if (n != 0 && bytes > UINT64_MAX / n)
      overflow = true;
    else
      bytes *= n;
  }
  if (t->begin > t->end)
    return refit_st_problem(problems, file,
                            "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                            ") end before they begin",
                            name, t->begin, t->end);
  int bad = 0;
  if (overflow || bytes != t->end - t->begin)
    bad += refit_st_problem(
        problems, file,
        "tensor '%s': shape and dtype %s make %s%" PRIu64
        " bytes but data_offsets [%" PRIu64 ", %" PRIu64 ") hold %" PRIu64,
        name, t->dtype, overflow ? "more than " : "", overflow ? UINT64_MAX : bytes,
        t->begin, t->end, t->end - t->begin);
  if (t->end > data_len)
    bad += refit_st_problem(problems, file,
                            "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                            ") end past the %" PRIu64 " data bytes of the file",
                            name, t->begin, t->end, data_len);
  return bad;
}

int refit_st_header_parse(const char *file, const char *json, size_t len,
                          uint64_t data_len, refit_st_header_t *out, FILE *problems) {
  json_error_t jerr;
  int bad = 0;
  refit_st_header_t h = {NULL, 0, 8 + (uint64_t)len};
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (root == NULL)
    return refit_st_problem(problems, file,
                            "header is not valid UTF-8 JSON (line %d column "
                            "%d: %s)",
                            jerr.line, jerr.column, jerr.text);
  if (!json_is_object(root)) {
    json_decref(root);
    return refit_st_problem(problems, file, "header is not a JSON object of tensors");
  }
  h.t = calloc(json_object_size(root) + 1, sizeof(*h.t));
  if (h.t == NULL) {
    json_decref(root);
    return refit_st_problem(problems, file, "out of memory for the header");
  }
  const char *name;
  json_t *v;
  json_object_foreach(root, name, v) {
    if (strcmp(name, "__metadata__") == 0) {
      const char *k;
      json_t *m;
      if (!json_is_object(v)) {
        bad +=
            refit_st_problem(problems, file, "__metadata__ is not an object of strings");
        continue;
      }
      json_object_foreach(v, k, m) if (!json_is_string(m)) {
        bad +=
            refit_st_problem(problems, file, "__metadata__ '%.80s' is not a string", k);
      }
      continue;
    }
    refit_st_tensor_t *t = &h.t[h.n];
    const int e = refit_st_entry(file, name, v, data_len, t, problems);
    bad += e;
    if (e == 0 && (t->name = strdup(name)) != NULL)
      h.n++;
    else if (e == 0)
      bad += refit_st_problem(problems, file, "out of memory for the header");
  }
  json_decref(root);

  /* Coverage: sorted by offsets, each tensor starts where the last ended. */
  refit_st_tensor_t **by_begin = calloc((size_t)h.n + 1, sizeof(*by_begin));
  if (by_begin == NULL) {
    bad += refit_st_problem(problems, file, "out of memory for the header");
  } else if (bad == 0) {
    for (int64_t i = 0; i < h.n; i++)
      by_begin[i] = &h.t[i];
    qsort(by_begin, (size_t)h.n, sizeof(*by_begin), refit_st_begin_cmp);
    uint64_t at = 0;
    const char *prev = NULL;
    for (int64_t i = 0; i < h.n; i++) {
      const refit_st_tensor_t *t = by_begin[i];
      if (t->begin > at)
        bad += refit_st_problem(problems, file,
                                "bytes [%" PRIu64 ", %" PRIu64 ") of the data "
                                "belong to no tensor (a hole before '%s')",
                                at, t->begin, t->name);
      else if (t->begin < at)
        bad += refit_st_problem(problems, file,
                                "tensor '%s' at [%" PRIu64 ", %" PRIu64
                                ") overlaps '%s', which ends at %" PRIu64,
                                t->name, t->begin, t->end, prev, at);
      if (t->end > at) {
        at = t->end;
        prev = t->name;
      }
    }
    if (at < data_len)
      bad += refit_st_problem(problems, file,
                              "bytes [%" PRIu64 ", %" PRIu64 ") at the end of "
                              "the data belong to no tensor",
                              at, data_len);
  }
  free(by_begin);
  if (bad > 0) {
    refit_st_header_free(&h);
    return bad;
  }
  qsort(h.t, (size_t)h.n, sizeof(*h.t), refit_st_name_cmp);
  *out = h;
  return 0;
}

const refit_st_tensor_t *refit_st_header_find(const refit_st_header_t *h,
                                              const char *name) {
  refit_st_tensor_t key = {0};
  key.name = (char *)name;
  return bsearch(&key, h->t, (size_t)h->n, sizeof(*h->t), refit_st_name_cmp);
}

void refit_st_header_free(refit_st_header_t *h) {
  for (int64_t i = 0; i < h->n; i++)
    free(h->t[i].name);
  free(h->t);
  h->t = NULL;
  h->n = 0;
}
