/*
 * The generator dump: every generator rank's runtime stores, as they sit in
 * memory, in one HDF5 file (h5file.h has the plumbing and the format names).
 *
 * Dump schema (one file per job, serial HDF5, written by generator ranks in
 * turn):
 *   /                      attributes: format = "refit-dump-1", config (the
 *                          config file text), version, generator_tp,
 *                          generator_ep, generator_engines, generator_ranks,
 *                          trainer_ranks, rank_engine[G], rank_tp[G]
 *   /rank<g>               one group per generator rank g (0 .. G-1, numbered
 *                          within the generator group); attributes engine,
 *                          tp_rank, world_rank
 *   /rank<g>/<store name>  one dataset per runtime store, the bytes exactly as
 *                          they sit in runtime storage: uint16 for bfloat16,
 *                          uint8 for float8_e4m3fn and e8m0, IEEE float32
 *                          for float32 (block FP8's _scale_inv); shape = the
 *                          store's shape (1-D of elements when the store's
 *                          bytes are padded beyond its shape); attributes
 *                          dtype, layout, version
 *
 */
#ifndef REFIT_DUMP_H
#define REFIT_DUMP_H

#include "source/h5file.h"
#include "session/session.h"

/* ---------------------------------------------------------------------- */
/* The dump                                                                */
/* ---------------------------------------------------------------------- */

/*
 * Collective over s->world: generator ranks write their runtime stores into
 * `path` one after another (generator rank 0 creates the file; a token passed
 * over MPI orders the others), trainer ranks only take part in the final
 * agreement. Returns REFIT_OK on every rank only when every generator rank
 * wrote its group; a rank whose predecessor failed skips writing and returns
 * REFIT_ERR_PEER.
 */
refit_status_t refit_dump_write(const refit_session_t *s, const char *path);

#endif /* REFIT_DUMP_H */
