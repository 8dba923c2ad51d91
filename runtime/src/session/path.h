/*
 * The refit paths: the ways a refit moves a rank's bytes, behind one table
 * of functions that the lifecycle calls without knowing which it has.
 *
 *   staged     trainers pack their shards into a send buffer, generators
 *              receive into staging and land from there (loader.c);
 *   delta      staged, but a refit after a committed one may send each
 *              changed chunk's delta instead of its bytes, applied in place
 *              (delta_wire.c, loader_delta.c); a full refit where a delta
 *              one cannot run or would not pay;
 *   zero copy  ranks that share a GPU: only the chunks' digests travel, and
 *              generators read the trainers' tensors in place
 *              (zero_copy.c, loader_direct.c).
 *
 * Chosen once per session, when the plan is known (refit_session_choose_path:
 * zero copy where refit_zc_decide took it, else delta where refit.delta is
 * not off, else staged), and again only when the plan is made anew. Every
 * function is set in every table (no caller tests for NULL); what a path does
 * not do is a function that does nothing.
 */
#ifndef REFIT_SESSION_PATH_H
#define REFIT_SESSION_PATH_H

#include "session/session.h"

typedef struct refit_path_ops {
  const char *name; /* "staged", "delta", "zero copy" */
  /* Trainer, once its shards have memory: the pack tables (staged: one
   * PACK descriptor per chunk; zero copy: one DIGEST descriptor). */
  refit_status_t (*trainer_tables)(refit_session_t *s);
  /* Trainer: registered shards moved; point the tables at them again. */
  refit_status_t (*repoint)(refit_session_t *s);
  /* Bytes of one send buffer (trainer) or staging area (generator). */
  int64_t (*buffer_bytes)(const refit_session_t *s);
  /* Where this rank's message k (an index into my_msgs) lies in its
   * bucket's buffer, and how many bytes travel. */
  void (*msg)(const refit_session_t *s, int64_t k, int64_t *at, int64_t *bytes);
  /* Begin, on this rank, before the header exchange (delta: its state,
   * made at the first begin, when the tensors are bound). */
  refit_status_t (*prepare)(refit_session_t *s);
  /* Begin's header: can this rank take a delta refit now? */
  int (*delta_ready)(const refit_session_t *s);
  /* Begin, collectively, once every rank's header is in: `any_moved` some
   * rank's tensors moved, `delta` every rank can take a delta refit. Zero
   * copy maps the trainers' tensors (again after a move); delta decides. */
  refit_status_t (*begin)(refit_session_t *s, int any_moved, int delta, double deadline);
  /* Trainer: where bucket b is packed, given its send buffer `buf`. */
  unsigned char *(*pack_target)(refit_session_t *s, int32_t b, unsigned char *buf);
  /* Trainer: pack (staged) or digest (zero copy) bucket b's chunks into
   * `buf`, each chunk's trailer sealed with `tag`; stream-ordered. */
  refit_status_t (*seal)(refit_session_t *s, int32_t b, unsigned char *buf, uint64_t tag);
  /* Trainer: bucket b was packed at `packed_at` and its sends listed in
   * xfers[0..nx); delta encodes the changed chunks and rewrites the sends. */
  refit_status_t (*packed)(refit_session_t *s, int32_t b, int slot, unsigned char *packed_at,
                           refit_xfer_t *xfers, int nx);
  /* Generator: the receives of a bucket whose buffer is `slot` (delta:
   * messages of variable length). */
  void (*recvs)(refit_session_t *s, int slot, refit_xfer_t *xfers, int nx);
  /* Generator: land bucket b from its buffer `slot`, chunks sealed `tag`. */
  refit_status_t (*land)(refit_session_t *s, int32_t b, int slot, uint64_t tag,
                         refit_land_fault_t lf);
  /* Commit of s->committed, on every rank. */
  void (*commit)(refit_session_t *s);
} refit_path_ops_t;

extern const refit_path_ops_t refit_path_staged;
extern const refit_path_ops_t refit_path_delta;
extern const refit_path_ops_t refit_path_zero_copy;

/* Set s->path from the session's decision (s->zero_copy, refit.delta). */
void refit_session_choose_path(refit_session_t *s);

#endif /* REFIT_SESSION_PATH_H */
