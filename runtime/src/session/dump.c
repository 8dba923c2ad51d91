/*
 * The generator dump (schema in dump.h). Serial HDF5: one writer at a time, so
 * generator ranks take turns, passing a token over MPI; each opens the file,
 * writes its group and closes it before passing the token on.
 */
#include "session/dump.h"

#include "mpi/outlive.h"

#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>

/* ---------------------------------------------------------------------- */
/* The dump                                                                */
/* ---------------------------------------------------------------------- */

/* Root attributes: the config and the generator layout. */
static refit_status_t refit_dump_write_root(const refit_session_t *s, hid_t file) {
  const refit_generator_layout_t *g = &s->cfg.generator;
  const int64_t tp = g->tp, ngen = s->ngenerator;
  const refit_h5_i64_t scalars[] = {{"version", (int64_t)s->committed},
                                    {"generator_tp", tp},
                                    {"generator_ep", g->ep},
                                    {"generator_engines", g->engines},
                                    {"generator_ranks", ngen},
                                    {"trainer_ranks", s->ntrainer}};
  refit_status_t st = REFIT_OK;
  int64_t *engine = malloc((size_t)ngen * sizeof(int64_t));
  int64_t *tp_rank = malloc((size_t)ngen * sizeof(int64_t));
  if (engine == NULL || tp_rank == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "dump: rank table of %lld", (long long)ngen);
    goto out;
  }
  /* The same split as refit_session_create: rank r is tp rank r % tp of
   * engine r / tp. */
  for (int64_t r = 0; r < ngen; r++) {
    engine[r] = r / tp;
    tp_rank[r] = r % tp;
  }
  REFIT_CHECK_GOTO(refit_h5_attr_write_str(file, "format", REFIT_DUMP_FORMAT), st, out);
  REFIT_CHECK_GOTO(refit_h5_attr_write_str(file, "config", s->config_text), st, out);
  REFIT_CHECK_GOTO(
      refit_h5_attr_write_i64s(file, scalars, sizeof(scalars) / sizeof(scalars[0])), st,
      out);
  REFIT_CHECK_GOTO(refit_h5_attr_write_i64(file, "rank_engine", engine, (size_t)ngen),
                   st, out);
  REFIT_CHECK_GOTO(refit_h5_attr_write_i64(file, "rank_tp", tp_rank, (size_t)ngen),
                   st, out);
out:
  free(engine);
  free(tp_rank);
  return st;
}

static refit_status_t refit_dump_write_store(const refit_session_t *s,
                                             const char *path, hid_t group,
                                             const refit_store_t *store) {
  refit_status_t st = REFIT_OK;
  hid_t space = -1, dset = -1;
  const size_t elem = store->dtype == REFIT_DTYPE_BF16  ? 2
                      : store->dtype == REFIT_DTYPE_F32 ? 4
                                                        : 1;
  /* float32 bits as they are (an FP32 store is moved bytewise). */
  hid_t ftype = elem == 2 ? H5T_STD_U16LE : elem == 4 ? H5T_IEEE_F32LE : H5T_STD_U8LE;
  hid_t mtype = elem == 2   ? H5T_NATIVE_UINT16
                : elem == 4 ? H5T_IEEE_F32LE
                            : H5T_NATIVE_UINT8;
  hsize_t dims[3];
  void *host = NULL;
  int ndim = store->ndim;
  size_t count = 1;
  const int64_t ver = (int64_t)s->committed;

  for (int d = 0; d < ndim; d++) {
    dims[d] = (hsize_t)store->shape[d];
    count *= (size_t)store->shape[d];
  }
  if (ndim < 1 || ndim > 3 || count * elem != store->bytes) {
    /* Padded storage (swizzled scales): keep every byte, flat. */
    ndim = 1;
    dims[0] = store->bytes / elem;
  }
  REFIT_H5_CHECK_GOTO(space = H5Screate_simple(ndim, dims, NULL), st, out,
                      "dump %s: generator rank %d: %s", path, s->role_rank,
                      store->name);
  REFIT_H5_CHECK_GOTO(dset = H5Dcreate2(group, store->name, ftype, space,
                                        H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      st, out, "dump %s: generator rank %d: %s", path,
                      s->role_rank, store->name);
  /* Storage on a GPU is written through a host copy. */
  const void *bytes = store->data;
  if (refit_mem_on_device(s->mem)) {
    host = malloc(store->bytes ? store->bytes : 1);
    if (host == NULL) {
      st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "dump %s: host copy of %s (%zu bytes)",
                     path, store->name, store->bytes);
      goto out;
    }
    REFIT_CHECK_GOTO(refit_mem_to_host(s->mem, host, store->data, store->bytes), st,
                     out);
    bytes = host;
  }
  REFIT_H5_CHECK_GOTO(H5Dwrite(dset, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes),
                      st, out, "dump %s: generator rank %d: %s (%zu bytes)",
                      path, s->role_rank, store->name, store->bytes);
  REFIT_CHECK_GOTO(
      refit_h5_attr_write_str(dset, "dtype", refit_dtype_name(store->dtype)),
      st, out);
  REFIT_CHECK_GOTO(refit_h5_attr_write_str(dset, "layout", store->layout), st, out);
  REFIT_CHECK_GOTO(refit_h5_attr_write_i64(dset, "version", &ver, 0), st, out);
out:
  free(host);
  if (dset >= 0)
    H5Dclose(dset);
  if (space >= 0)
    H5Sclose(space);
  return st;
}

/* One generator rank's turn: create (rank 0) or reopen the file, add
 * /rank<g>, close. */
static refit_status_t refit_dump_write_rank(const refit_session_t *s,
                                            const char *path) {
  refit_status_t st = REFIT_OK;
  hid_t file = -1, group = -1;
  char gname[32];
  const refit_h5_i64_t scalars[] = {
      {"engine", s->engine}, {"tp_rank", s->tp_rank}, {"world_rank", s->rank}};

  refit_h5_quiet();
  if (s->role_rank == 0)
    REFIT_H5_CHECK_GOTO(file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT,
                                         H5P_DEFAULT),
                        st, out, "dump %s: generator rank 0 (check that the "
                        "directory exists and is writable)", path);
  else
    REFIT_H5_CHECK_GOTO(file = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT), st,
                        out, "dump %s: generator rank %d reopening the file "
                        "(is the path on a file system all generator nodes "
                        "share?)", path, s->role_rank);
  if (s->role_rank == 0)
    REFIT_CHECK_GOTO(refit_dump_write_root(s, file), st, out);
  snprintf(gname, sizeof(gname), "rank%d", s->role_rank);
  REFIT_H5_CHECK_GOTO(group = H5Gcreate2(file, gname, H5P_DEFAULT, H5P_DEFAULT,
                                         H5P_DEFAULT),
                      st, out, "dump %s: group /%s", path, gname);
  REFIT_CHECK_GOTO(
      refit_h5_attr_write_i64s(group, scalars, sizeof(scalars) / sizeof(scalars[0])), st,
      out);
  for (int64_t i = 0; i < s->nstores; i++)
    REFIT_CHECK_GOTO(refit_dump_write_store(s, path, group, &s->stores[i]), st, out);
out:
  if (group >= 0)
    H5Gclose(group);
  if (file >= 0 && H5Fclose(file) < 0 && st == REFIT_OK)
    st = refit_h5_error("H5Fclose", "dump %s: generator rank %d", path,
                        s->role_rank);
  return st;
}

/* Every wait of the dump is bounded: a predecessor has refit.timeout_s to
 * write its part, so generator rank g waits up to (g + 1) timeouts for the
 * token, everyone else the whole ring. The communicator, the token and the
 * agreement live in one heap block: after a missed deadline MPI may still
 * write them, so it goes with the request to outlive.h. */
static refit_status_t refit_dump_wait(MPI_Request *req, double deadline, const char *path,
                                      const char *what, void *block) {
  void *blocks[] = {block};
  refit_status_t st = refit_outlive_wait(req, deadline, what, blocks, 1);
  if (st == REFIT_ERR_TIMEOUT)
    return REFIT_ERR(REFIT_ERR_TIMEOUT,
                     "dump %s: %s: not done by the deadline (a generator rank is "
                     "dead or took longer than refit.timeout_s to write)",
                     path, what);
  return st;
}

refit_status_t refit_dump_write(const refit_session_t *s, const char *path) {
  refit_status_t st = REFIT_OK;
  MPI_Request req;
  struct {
    MPI_Comm comm;
    int buf[4]; /* token in, token out, mine, any */
  } *b = calloc(1, sizeof(*b));
  const double t0 = MPI_Wtime(), timeout = s->cfg.refit.timeout_s;
  if (b == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "dump %s: token", path);
  int *const buf = b->buf;

  /* A private communicator keeps the token away from the caller's tags. */
  if (MPI_Comm_idup(s->world, &b->comm, &req) != MPI_SUCCESS) {
    free(b);
    return REFIT_ERR(REFIT_ERR_MPI, "dump %s: MPI_Comm_idup failed", path);
  }
  REFIT_CHECK(
      refit_dump_wait(&req, t0 + timeout, path, "duplicating the communicator", b));
  MPI_Comm comm = b->comm;
  if (!s->is_trainer) {
    const int g = s->role_rank;
    int failed_before = 0;
    if (g > 0) {
      MPI_Irecv(&buf[0], 1, MPI_INT, s->ntrainer + g - 1, 0, comm, &req);
      REFIT_CHECK(refit_dump_wait(&req, t0 + (g + 1) * timeout, path,
                                  "waiting for the previous generator rank's token", b));
      failed_before = buf[0];
    }
    if (failed_before)
      st = REFIT_ERR(REFIT_ERR_PEER,
                     "dump %s: an earlier generator rank failed; rank %d did "
                     "not write",
                     path, g);
    else
      st = refit_dump_write_rank(s, path);
    buf[1] = failed_before || st != REFIT_OK;
    if (g + 1 < s->ngenerator) {
      MPI_Isend(&buf[1], 1, MPI_INT, s->ntrainer + g + 1, 0, comm, &req);
      REFIT_CHECK(refit_dump_wait(&req, MPI_Wtime() + timeout, path,
                                  "passing the token to the next generator rank", b));
    }
    if (st == REFIT_OK)
      REFIT_INFO("dump %s: generator rank %d wrote %lld stores", path, g,
                 (long long)s->nstores);
  }
  buf[2] = st != REFIT_OK;
  MPI_Iallreduce(&buf[2], &buf[3], 1, MPI_INT, MPI_MAX, comm, &req);
  REFIT_CHECK(refit_dump_wait(&req, t0 + (s->ngenerator + 1) * timeout, path,
                              "agreeing on the outcome", b));
  const int any = buf[3];
  free(b);
  MPI_Comm_free(&comm);
  if (st == REFIT_OK && any)
    st = REFIT_ERR(REFIT_ERR_PEER, "dump %s failed on another rank", path);
  return st;
}
