/*
 * The safetensors format, read (source_safetensors.c, fuzz harnesses) and
 * written (refit-ckpt). A file is an 8-byte little-endian header length N,
 * N bytes of UTF-8 JSON (padded with spaces) mapping each tensor name to
 * {dtype, shape, data_offsets: [begin, end)} relative to the data after the
 * header, plus an optional "__metadata__" of strings; N is at most
 * 100,000,000. The data is row-major little-endian, every byte of it
 * belonging to exactly one tensor (no holes, no overlaps).
 */
#ifndef REFIT_SAFETENSORS_H
#define REFIT_SAFETENSORS_H

#include "refit/status.h"

#include <stdint.h>
#include <stdio.h>

#define REFIT_ST_HEADER_MAX UINT64_C(100000000)
#define REFIT_ST_RANK_MAX 8

typedef struct {
  char *name;
  char dtype[16]; /* as written, cut to 15 bytes */
  int elem_bytes; /* 0 for an unknown dtype */
  int rank;
  int64_t shape[REFIT_ST_RANK_MAX];
  uint64_t begin, end; /* data_offsets, relative to the data */
} refit_st_tensor_t;

typedef struct {
  refit_st_tensor_t *t; /* sorted by name */
  int64_t n;
  uint64_t data_offset; /* 8 + N: where the data starts in the file */
} refit_st_header_t;

/*
 * The header length from a file's first bytes (`have` of them, the file
 * `file_size` bytes long). Problems (file too short, header over the bound
 * or past the end of the file) are written to `problems`, one line each
 * starting with `file`; returns their count (0: *n is set).
 */
int refit_st_header_length(const char *file, const unsigned char *prefix, size_t have,
                           uint64_t file_size, uint64_t *n, FILE *problems);

/*
 * Parse header text `json` (`len` bytes) of `file`, whose data section is
 * `data_len` bytes. Every problem is written to `problems` (one line each,
 * naming the file and the tensor): malformed or non-UTF-8 JSON, duplicate
 * names, a tensor entry of the wrong form, an unknown dtype, a shape that
 * disagrees with the offsets, offsets out of range, overlapping or leaving
 * holes, metadata that is not strings. Returns the number of problems; *out
 * is filled when there are none (free it with refit_st_header_free).
 */
int refit_st_header_parse(const char *file, const char *json, size_t len,
                          uint64_t data_len, refit_st_header_t *out, FILE *problems);

/* The entry named `name`, or NULL. */
const refit_st_tensor_t *refit_st_header_find(const refit_st_header_t *h,
                                              const char *name);

void refit_st_header_free(refit_st_header_t *h);

/* Bytes of one element of `dtype` ("BF16": 2), 0 when refit does not know
 * the dtype. */
int refit_st_dtype_bytes(const char *dtype);

#endif /* REFIT_SAFETENSORS_H */
