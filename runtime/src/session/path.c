/*
 * The refit paths' tables (path.h): each function a path's own few lines,
 * over the code that does the work (trainer.c, zero_copy.c, delta_wire.c,
 * the loader).
 */
#include "session/path.h"

#include "session/delta_wire.h"
#include "session/zero_copy.h"

#include "core/log.h"

/* ---------------------------------------------------------------------- */
/* Staged                                                                  */
/* ---------------------------------------------------------------------- */

/* The largest bucket of a trainer's sends, or a generator's staging area. */
static int64_t refit_staged_buffer_bytes(const refit_session_t *s) {
  if (!s->is_trainer)
    return s->plan->staging[s->role_rank];
  int64_t need = 0;
  for (int32_t b = 0; b < s->plan->nbuckets; b++) {
    int64_t bytes = 0;
    for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++)
      bytes += s->plan->msgs[s->my_msgs[k]].bytes;
    if (bytes > need)
      need = bytes;
  }
  return need;
}

/* A trainer's message at its place in the send buffer (one packed for
 * several generators is there once); a generator's at its staging offset. */
static void refit_staged_msg(const refit_session_t *s, int64_t k, int64_t *at,
                             int64_t *bytes) {
  const refit_msg_t *m = &s->plan->msgs[s->my_msgs[k]];
  *at = s->is_trainer ? s->msg_wire[k] : m->offset;
  *bytes = m->bytes;
}

static refit_status_t refit_path_nothing(refit_session_t *s) {
  (void)s;
  return REFIT_OK;
}

static int refit_path_no_delta(const refit_session_t *s) {
  (void)s;
  return 0;
}

static refit_status_t refit_staged_begin(refit_session_t *s, int any_moved, int delta,
                                         double deadline) {
  (void)s;
  (void)any_moved;
  (void)delta;
  (void)deadline;
  return REFIT_OK;
}

static unsigned char *refit_path_pack_in_place(refit_session_t *s, int32_t b,
                                               unsigned char *buf) {
  (void)s;
  (void)b;
  return buf;
}

static refit_status_t refit_staged_seal(refit_session_t *s, int32_t b, unsigned char *buf,
                                        uint64_t tag) {
  return refit_mem_pack(s->mem, &s->pack, s->pack_begin[b],
                        s->pack_begin[b + 1] - s->pack_begin[b], tag, buf);
}

static refit_status_t refit_path_sent_as_packed(refit_session_t *s, int32_t b, int slot,
                                                unsigned char *packed_at,
                                                refit_xfer_t *xfers, int nx) {
  (void)s;
  (void)b;
  (void)slot;
  (void)packed_at;
  (void)xfers;
  (void)nx;
  return REFIT_OK;
}

static void refit_path_fixed_recvs(refit_session_t *s, int slot, refit_xfer_t *xfers,
                                   int nx) {
  (void)s;
  (void)slot;
  for (int i = 0; i < nx; i++)
    xfers[i].got = NULL; /* exactly as long as posted */
}

static refit_status_t refit_staged_land(refit_session_t *s, int32_t b, int slot,
                                        uint64_t tag, refit_land_fault_t lf) {
  return refit_loader_land_bucket(s->loader, b, s->buffer[slot], tag, lf);
}

static void refit_path_commit_nothing(refit_session_t *s) { (void)s; }

const refit_path_ops_t refit_path_staged = {
    .name = "staged",
    .trainer_tables = refit_trainer_tables,
    .repoint = refit_trainer_repoint,
    .buffer_bytes = refit_staged_buffer_bytes,
    .msg = refit_staged_msg,
    .prepare = refit_path_nothing,
    .delta_ready = refit_path_no_delta,
    .begin = refit_staged_begin,
    .pack_target = refit_path_pack_in_place,
    .seal = refit_staged_seal,
    .packed = refit_path_sent_as_packed,
    .recvs = refit_path_fixed_recvs,
    .land = refit_staged_land,
    .commit = refit_path_commit_nothing,
};

/* ---------------------------------------------------------------------- */
/* Delta                                                                   */
/* ---------------------------------------------------------------------- */

/* The delta state, made once at the first begin (the tensors are bound by
 * then); delta: on refuses a session that cannot carry delta refits here. */
static refit_status_t refit_delta_prepare(refit_session_t *s) {
  if (s->dw_made)
    return REFIT_OK;
  REFIT_CHECK(refit_dw_create(s, &s->dw));
  s->dw_made = 1;
  return REFIT_OK;
}

static int refit_delta_ready(const refit_session_t *s) { return refit_dw_ready(s, s->dw); }

static refit_status_t refit_delta_begin(refit_session_t *s, int any_moved, int delta,
                                        double deadline) {
  (void)any_moved;
  (void)deadline;
  refit_dw_begin(s->dw, delta);
  return REFIT_OK;
}

static unsigned char *refit_delta_pack_target(refit_session_t *s, int32_t b,
                                              unsigned char *buf) {
  return refit_dw_pack_target(s->dw, b, buf);
}

static refit_status_t refit_delta_packed(refit_session_t *s, int32_t b, int slot,
                                         unsigned char *packed_at, refit_xfer_t *xfers,
                                         int nx) {
  if (s->dw == NULL)
    return REFIT_OK;
  return refit_dw_trainer_encode(s, b, slot, packed_at, xfers, nx);
}

static void refit_delta_recvs(refit_session_t *s, int slot, refit_xfer_t *xfers, int nx) {
  refit_dw_generator_recvs(s, slot, xfers, nx);
}

/* Deltas applied in place land nothing more; a full bucket lands staged. */
static refit_status_t refit_delta_land(refit_session_t *s, int32_t b, int slot,
                                       uint64_t tag, refit_land_fault_t lf) {
  unsigned char *land_from = s->buffer[slot];
  REFIT_CHECK(refit_dw_generator_apply(s, b, slot, s->buffer[slot], lf, &land_from));
  if (land_from == NULL)
    return REFIT_OK;
  return refit_loader_land_bucket(s->loader, b, land_from, tag, lf);
}

static void refit_delta_commit(refit_session_t *s) { refit_dw_commit(s->dw, s->committed); }

const refit_path_ops_t refit_path_delta = {
    .name = "delta",
    .trainer_tables = refit_trainer_tables,
    .repoint = refit_trainer_repoint,
    .buffer_bytes = refit_staged_buffer_bytes,
    .msg = refit_staged_msg,
    .prepare = refit_delta_prepare,
    .delta_ready = refit_delta_ready,
    .begin = refit_delta_begin,
    .pack_target = refit_delta_pack_target,
    .seal = refit_staged_seal,
    .packed = refit_delta_packed,
    .recvs = refit_delta_recvs,
    .land = refit_delta_land,
    .commit = refit_delta_commit,
};

/* ---------------------------------------------------------------------- */
/* Zero copy                                                               */
/* ---------------------------------------------------------------------- */

static int64_t refit_zc_path_buffer_bytes(const refit_session_t *s) {
  return refit_zc_buffer_bytes(s);
}

/* Map the trainers' tensors at the first begin, and again after some rank's
 * tensors moved. */
static refit_status_t refit_zc_path_begin(refit_session_t *s, int any_moved, int delta,
                                          double deadline) {
  (void)delta;
  if (s->zc_ready && !any_moved)
    return REFIT_OK;
  REFIT_CHECK(refit_session_agree(s, refit_zc_exchange(s, deadline),
                                  "zero-copy: mapping the trainers' tensors"));
  s->zc_ready = 1;
  return REFIT_OK;
}

static refit_status_t refit_zc_path_seal(refit_session_t *s, int32_t b, unsigned char *buf,
                                         uint64_t tag) {
  return refit_zc_seal(s, b, buf, tag);
}

static refit_status_t refit_zc_path_land(refit_session_t *s, int32_t b, int slot,
                                         uint64_t tag, refit_land_fault_t lf) {
  return refit_loader_land_direct(s->loader, b, s->buffer[slot], tag, lf);
}

const refit_path_ops_t refit_path_zero_copy = {
    .name = "zero copy",
    .trainer_tables = refit_zc_trainer_tables,
    .repoint = refit_zc_trainer_tables,
    .buffer_bytes = refit_zc_path_buffer_bytes,
    .msg = refit_zc_msg,
    .prepare = refit_path_nothing,
    .delta_ready = refit_path_no_delta,
    .begin = refit_zc_path_begin,
    .pack_target = refit_path_pack_in_place,
    .seal = refit_zc_path_seal,
    .packed = refit_path_sent_as_packed,
    .recvs = refit_path_fixed_recvs,
    .land = refit_zc_path_land,
    .commit = refit_path_commit_nothing,
};

void refit_session_choose_path(refit_session_t *s) {
  const refit_path_ops_t *was = s->path;
  if (s->zero_copy) {
    s->path = &refit_path_zero_copy;
    /* refit_zc_decide never takes zero copy under delta: on. */
    if (s->cfg.refit.delta != REFIT_DELTA_MODE_OFF && was != s->path)
      REFIT_INFO("%s rank %d: refit.delta: auto: full refits only (zero copy moves no "
                 "weight bytes)",
                 s->is_trainer ? "trainer" : "generator", s->role_rank);
  } else if (s->cfg.refit.delta != REFIT_DELTA_MODE_OFF) {
    s->path = &refit_path_delta;
  } else {
    s->path = &refit_path_staged;
  }
  if (was != s->path)
    REFIT_INFO("rank %d: refit path %s", s->rank, s->path->name);
}
