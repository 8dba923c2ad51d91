/*
 * The lifecycle of one refit, as docs/architecture.md states the protocol:
 * begin (header exchange, transport repair), progress (trainers pack and
 * send bucket by bucket, generators receive and land), commit (the vote,
 * one outcome per commit), abort with drain and rollback, verification;
 * and the fault seam that tests fail each step with.
 */
#include "session/path.h"
#include "session/session.h"

#include "core/digest.h"
#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Generator: receives of bucket b into the staging area `buf`. */
static void refit_generator_recvs(refit_session_t *s, int32_t b, unsigned char *buf,
                                  refit_xfer_t *xfers, int *nxfers) {
  const refit_plan_t *p = s->plan;
  *nxfers = 0;
  for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++) {
    const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
    int64_t at, bytes;
    s->path->msg(s, k, &at, &bytes);
    xfers[*nxfers].peer = m->src_rank;
    xfers[*nxfers].buf = buf + at;
    xfers[*nxfers].bytes = (size_t)bytes;
    (*nxfers)++;
  }
  s->path->recvs(s, (int)(b % REFIT_EXCHANGES_IN_FLIGHT), xfers, *nxfers);
}

/* Start an exchange; one that failed part way may leave requests posted
 * that nothing can complete any more (the buffers are then exposed). */
static refit_status_t refit_session_start(refit_session_t *s, const refit_xfer_t *sends,
                                          int nsends, const refit_xfer_t *recvs,
                                          int nrecvs, int tag, refit_exchange_t **ex) {
  refit_status_t st =
      s->transport.ops->start(s->transport.ctx, sends, nsends, recvs, nrecvs, tag, ex);
  if (st != REFIT_OK)
    s->exposed = 1;
  return st;
}

/* Does the fault seam fire on this rank, in this phase, this refit? (A
 * production build: never, and the compiler drops the branch.) */
static int refit_session_fault_here(const refit_session_t *s, int phase) {
  /* The repair runs in begin, before the attempt it begins is counted. */
  const uint64_t attempt = s->attempt + (phase == REFIT_FAULT_PHASE_REPAIR);
  return refit_fault_fires(&s->fault, phase, s->rank, attempt, s->cfg.source.seed);
}

/* The fault seam's action at `where` (kill, exit, stall, error). */
static refit_status_t refit_session_fault_act(refit_session_t *s, const char *where) {
  return refit_fault_act(&s->fault, s->rank, s->cfg.refit.timeout_s, where);
}

/* After a failed refit left some rank's transport unusable, every rank
 * (known alive from the header exchange just done) repairs it together,
 * then agrees on the outcome by the deadline. A transport that cannot be
 * repaired ends the session. */
static refit_status_t
refit_session_recover_transport(refit_session_t *s, int unhealthy_rank, double deadline) {
  const refit_transport_ops_t *ops = s->transport.ops;
  refit_status_t st = REFIT_OK;
  char whose[64];
  refit_session_rank_name(s, unhealthy_rank, whose, sizeof(whose));
  REFIT_WARN("begin: repairing the %s transport on every rank (that of %s "
             "failed in the last refit)",
             ops->name, whose);
  if (refit_session_fault_here(s, REFIT_FAULT_PHASE_REPAIR)) {
    if (s->fault.action == REFIT_FAULT_STALL)
      /* Held until every peer's repair deadline (this begin's, at most
       * timeout_s after the header exchange began) has passed, then it
       * goes on: the peers gave up on the repair's operations, which it
       * completes late into their buffers. */
      refit_fault_hold(s->rank, "at the transport repair",
                       (double)(time_t)s->cfg.refit.timeout_s + 1);
    else
      st = refit_session_fault_act(s, "the transport repair");
  }
  if (st == REFIT_OK)
    st = ops->recover(s->transport.ctx, deadline);
  /* This rank's outcome, then everyone's: on the heap, as a late peer may
   * still write them. */
  int *ok = malloc((size_t)(s->size + 1) * sizeof(int));
  if (ok == NULL) {
    s->broken = 1; /* this rank cannot join the agreement */
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "begin: transport repair");
  }
  ok[0] = st == REFIT_OK;
  void *blocks[] = {ok};
  REFIT_CHECK(refit_session_gather(s, &ok[0], &ok[1], (int)sizeof(int),
                                   REFIT_CTRL_TAG_REPAIR, deadline,
                                   "begin: transport repair", blocks, 1));
  int all_ok = 1;
  for (int r = 0; r < s->size; r++)
    all_ok &= ok[1 + r] != 0;
  free(ok);
  if (st != REFIT_OK || !all_ok) {
    s->broken = 1;
    return st != REFIT_OK ? st
                          : REFIT_ERR(REFIT_ERR_PEER,
                                      "begin: another rank could not repair the %s "
                                      "transport; restart the job",
                                      ops->name);
  }
  return REFIT_OK;
}

refit_status_t refit_session_begin(refit_session_t *s, uint64_t version, void *stream) {
  refit_status_t st;
  if (s->broken)
    return REFIT_ERR(REFIT_ERR_PEER,
                     "begin %llu: an earlier collective timed out; "
                     "the session cannot continue (restart the job)",
                     (unsigned long long)version);
  if (s->state != REFIT_STATE_IDLE && s->state != REFIT_STATE_POISONED)
    return REFIT_ERR(REFIT_ERR_STATE,
                     "begin %llu: a refit is already in progress "
                     "(state %d); commit or abort it first",
                     (unsigned long long)version, (int)s->state);
  const double t_acquire = MPI_Wtime();
  const double tl0 = s->timeline != NULL ? refit_timeline_clock() : 0;
  /* Every rank's first begin, whether or not its memory is complete: the
   * engines' forms are reduced once (collective). A failure after planning
   * again leaves nothing consistent to refit with. */
  st = REFIT_OK;
  if (!s->precision_settled) {
    s->precision_settled = 1;
    st = refit_session_settle_precision(s);
    if (st != REFIT_OK && st != REFIT_ERR_INVALID_ARGUMENT)
      s->broken = 1;
    if (st != REFIT_OK)
      return st;
  }
  if (!s->bound)
    st = refit_session_bind(s);
  else
    st = refit_session_acquire_staging(s);
  if (st == REFIT_OK && s->forgotten)
    st = refit_session_rebind(s);
  /* A trainer tensor at a new address, or a generator's storage bound anew
   * (refit_tensor_forget_all): every rank maps again under zero copy, and
   * the refit is a full one. */
  const int moved = (s->is_trainer && s->moved) || s->rebound;
  if (st == REFIT_OK && s->moved)
    st = s->path->repoint(s);
  if (st == REFIT_OK)
    st = s->path->prepare(s);
  /* Nothing refit does on the device starts before the caller's work
   * queued on `stream` so far: a trainer's last optimizer step, an engine's
   * last forward over the storage a sync refit overwrites. */
  if (st == REFIT_OK)
    st = refit_mem_after_stream(s->mem, stream);
  const double acquire_s = MPI_Wtime() - t_acquire;

  /* Everyone's (run id, version, plan hash, committed version, whether it
   * could start, transport health) before a byte moves. */
  const int transport_ok = s->transport.ops->healthy(s->transport.ctx);
  /* The exchange's buffers live in the session: a collective that misses
   * its deadline stays with MPI, which may still write them later. */
  refit_header_t *mine = s->header_buf, *all = s->header_buf + 1;
  *mine = (refit_header_t){s->run_id,
                           version,
                           s->plan->hash,
                           s->committed,
                           s->is_trainer ? 0 : 1,
                           st == REFIT_OK,
                           transport_ok,
                           moved,
                           s->path->delta_ready(s) && !moved,
                           0};
  const double deadline = MPI_Wtime() + s->cfg.refit.timeout_s;
  refit_status_t wst =
      refit_session_gather(s, mine, all, (int)sizeof(*mine), REFIT_CTRL_TAG_HEADER,
                           deadline, "begin: header exchange", NULL, 0);
  if (wst != REFIT_OK)
    return wst;
  if (st == REFIT_OK)
    for (int r = 0; r < s->size; r++) {
      const refit_header_t *h = &all[r];
      if (h->run_id != s->run_id || h->plan_hash != s->plan->hash) {
        st = REFIT_ERR(REFIT_ERR_STATE,
                       "begin %llu: rank %d has run id %016llx / plan hash "
                       "%016llx, rank %d has %016llx / %016llx",
                       (unsigned long long)version, r, (unsigned long long)h->run_id,
                       (unsigned long long)h->plan_hash, s->rank,
                       (unsigned long long)s->run_id, (unsigned long long)s->plan->hash);
        break;
      }
      if (!h->ok) {
        st = REFIT_ERR(REFIT_ERR_PEER,
                       "begin %llu: rank %d could not start (its error is in "
                       "its log)",
                       (unsigned long long)version, r);
        break;
      }
      if (h->version != version) {
        st = REFIT_ERR(REFIT_ERR_STATE,
                       "begin %llu: rank %d asks for version %llu instead",
                       (unsigned long long)version, r, (unsigned long long)h->version);
        break;
      }
      if (h->side == 1 && version <= h->committed) {
        st = REFIT_ERR(REFIT_ERR_STATE,
                       "begin %llu: refused: generator rank %d already holds "
                       "version %llu (versions must increase; a stale or "
                       "replayed version)",
                       (unsigned long long)version, r - s->ntrainer,
                       (unsigned long long)h->committed);
        break;
      }
    }
  int unhealthy = -1;
  for (int r = 0; r < s->size && unhealthy < 0; r++)
    if (!all[r].transport_ok)
      unhealthy = r;
  if (st != REFIT_OK)
    return st;
  if (unhealthy >= 0)
    REFIT_CHECK(refit_session_recover_transport(s, unhealthy, deadline));
  /* The path's own begin (path.h): zero copy's generators map their
   * trainers' tensors once, and again after a trainer registered one at a
   * new address; a delta refit needs every rank's baseline of the committed
   * version: one rank without it (first refit, a failed or aborted one,
   * restored or POISONED, a tensor registered anew) makes it a full one
   * everywhere. */
  int any_moved = 0, delta = 1;
  for (int r = 0; r < s->size; r++) {
    any_moved |= all[r].moved;
    delta &= all[r].delta_ready != 0;
  }
  REFIT_CHECK(s->path->begin(s, any_moved, delta, deadline));

  /* The refit begins for real: every rank has seen a moved tensor (the
   * pack table and zero copy's mapping follow it, the delta decision was
   * full), so the flag is spent. A begin that failed before here keeps it. */
  if (moved) {
    s->moved = 0;
    s->rebound = 0;
  }
  s->attempt++;
  s->vote_pending = 1;
  s->vote_settled = REFIT_OK;
  s->peer_lost = 0;
  s->failure[0] = '\0';
  s->poisoned_before = s->state == REFIT_STATE_POISONED;
  s->pending = version;
  s->next_bucket = 0;
  s->next_posted = 0;
  memset(&s->times, 0, sizeof(s->times));
  s->times.staging = acquire_s;
  if (s->timeline != NULL)
    refit_timeline_start(s->timeline, tl0);
  s->t_begin = MPI_Wtime() - acquire_s;
  s->deadline = s->t_begin + s->cfg.refit.timeout_s;
  /* Tags name the attempt as far as MPI_TAG_UB allows (Open MPI: 2^31 - 1,
   * so 32768 attempts; the standard's minimum 32767, 8): a message of a
   * failed refit never matches a later one's receive by its tag (transports
   * that can also start clean after a failure, as MPI's, do). */
  s->tag_base = (int)((s->attempt & s->attempt_mask) << 12);
  s->state = REFIT_STATE_RECEIVING;
  if (s->is_trainer) {
    double t = MPI_Wtime();
    refit_timeline_phase(s->timeline, REFIT_TL_SOURCE_START);
    if (s->cfg.source.kind != REFIT_SOURCE_CALLER)
      st = refit_trainer_source(s, version);
    s->times.source = MPI_Wtime() - t;
    refit_timeline_phase(s->timeline, REFIT_TL_SOURCE_END);
  } else {
    refit_loader_begin(s->loader);
  }
  /* NVFP4's global scales come from whole tensors no rank holds: every rank
   * takes part, also one whose source failed, so that none waits in vain. */
  if (s->cfg.refit.precision == REFIT_PRECISION_NVFP4) {
    if (st == REFIT_OK && refit_session_fault_here(s, REFIT_FAULT_PHASE_AMAX))
      st = refit_session_fault_act(s, "the NVFP4 amax exchange");
    /* This rank's own error, which the exchange's would overwrite. */
    if (st != REFIT_OK)
      snprintf(s->failure, sizeof(s->failure), "%s", refit_last_error());
    const refit_status_t ast = refit_session_nvfp4_amax(s, st == REFIT_OK, version);
    if (s->broken)
      return ast;
    if (st == REFIT_OK)
      st = ast;
    else
      refit_error_set(st, "%s", s->failure);
  }
  if (st != REFIT_OK) {
    snprintf(s->failure, sizeof(s->failure), "%s", refit_last_error());
    refit_session_abort(s); /* votes no: peers learn at their commit */
    refit_error_set(st, "%s", s->failure);
    return st;
  }
  refit_timeline_phase(s->timeline, REFIT_TL_BEGIN_END);
  return REFIT_OK;
}

/* The bucket at which a transfer-phase fault fires. */
static int32_t refit_session_fault_bucket(const refit_session_t *s) {
  return refit_fault_bucket(&s->fault, s->plan->nbuckets);
}

/* Complete the exchange in `slot` by s->deadline. The deadline is one of
 * progress: timeout_s from the last bucket that completed, so a slow but
 * moving refit goes on. A rank that comes back past its deadline (it
 * stalled: an engine that served too long, a trainer held up) gets no new
 * one from what completes then: its peers gave up on this refit at their
 * own deadlines and will vote no, and they wait for its vote only timeout_s
 * more. With a new deadline it could wait up to timeout_s for a bucket
 * nobody sends any more and miss that vote, which breaks the session;
 * without one it finishes with what is already there or fails at once,
 * and votes in time. */
static refit_status_t refit_session_wait_slot(refit_session_t *s, int slot,
                                              const char *what, int32_t bucket) {
  char phase[128];
  if (s->inflight[slot] == NULL)
    return REFIT_OK;
  snprintf(phase, sizeof(phase), "version %llu bucket %d %s on %s rank %d",
           (unsigned long long)s->pending, bucket, what,
           s->is_trainer ? "trainer" : "generator", s->role_rank);
  const int32_t tb = refit_timeline_slot(s->timeline, slot);
  refit_timeline_mark(s->timeline, tb, REFIT_TL_WAIT_START, 1);
  double t = MPI_Wtime();
  const int late = t > s->deadline;
  refit_status_t st =
      s->transport.ops->wait(s->transport.ctx, s->inflight[slot], s->deadline, phase);
  s->inflight[slot] = NULL;
  s->times.transfer += MPI_Wtime() - t;
  refit_timeline_mark(s->timeline, tb, REFIT_TL_WAIT_END, 0);
  if (st != REFIT_OK) /* the transport abandoned what was left */
    s->exposed = 1;
  if (st == REFIT_ERR_TIMEOUT)
    s->peer_lost = 1;
  if (st == REFIT_OK && !late)
    s->deadline = MPI_Wtime() + s->cfg.refit.timeout_s;
  return st;
}

/* Advance the exchange in `slot` without blocking: *arrived = 1 once it
 * completed (then the slot is free). */
static refit_status_t refit_session_poll_slot(refit_session_t *s, int slot,
                                              int *arrived) {
  *arrived = 1;
  if (s->inflight[slot] == NULL)
    return REFIT_OK;
  const int32_t tb = refit_timeline_slot(s->timeline, slot);
  refit_timeline_mark(s->timeline, tb, REFIT_TL_WAIT_START, 1);
  double t = MPI_Wtime();
  const int late = t > s->deadline;
  refit_status_t st =
      s->transport.ops->test(s->transport.ctx, s->inflight[slot], arrived);
  s->times.transfer += MPI_Wtime() - t;
  if (st == REFIT_OK && *arrived)
    refit_timeline_mark(s->timeline, tb, REFIT_TL_WAIT_END, 0);
  if (st != REFIT_OK || *arrived)
    s->inflight[slot] = NULL; /* freed by test */
  if (st != REFIT_OK)
    s->exposed = 1;
  if (st == REFIT_OK && *arrived && !late) /* as in refit_session_wait_slot */
    s->deadline = MPI_Wtime() + s->cfg.refit.timeout_s;
  return st;
}

/* Bytes of an exchange's messages, for the timeline. */
static int64_t refit_xfers_bytes(const refit_xfer_t *xfers, int n) {
  int64_t bytes = 0;
  for (int i = 0; i < n; i++)
    bytes += (int64_t)xfers[i].bytes;
  return bytes;
}

/* Trainer: one bucket (pack and send), or the final drain. */
static refit_status_t refit_session_step_trainer(refit_session_t *s, int *done) {
  const refit_plan_t *p = s->plan;
  const int32_t b = s->next_bucket;
  refit_status_t st;
  if (b >= p->nbuckets) {
    for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++)
      REFIT_CHECK(refit_session_wait_slot(s, i, "send", b));
    refit_timeline_phase(s->timeline, REFIT_TL_PROGRESS_END);
    *done = 1;
    return REFIT_OK;
  }
  const int slot = b % REFIT_EXCHANGES_IN_FLIGHT;
  REFIT_CHECK(refit_session_wait_slot(s, slot, "send", b - REFIT_EXCHANGES_IN_FLIGHT));
  int nx = 0;
  double t = MPI_Wtime();
  refit_timeline_mark(s->timeline, b, REFIT_TL_PACK_START, 0);
  unsigned char *packed_at = s->path->pack_target(s, b, s->buffer[slot]);
  st = refit_trainer_pack(s, b, packed_at, s->xfers, &nx, 0);
  /* While the pack kernel runs, keep the bucket in flight moving: some
   * transports (CUDA IPC) only advance when called. */
  for (int packed = 0; st == REFIT_OK && !packed;) {
    st = refit_mem_done(s->mem, &packed);
    const int other = (slot + 1) % REFIT_EXCHANGES_IN_FLIGHT;
    int sent = 1;
    if (st == REFIT_OK && !packed && s->inflight[other] != NULL)
      st = refit_session_poll_slot(s, other, &sent);
  }
  if (st == REFIT_OK)
    st = s->path->packed(s, b, slot, packed_at, s->xfers, nx);
  s->times.pack += MPI_Wtime() - t;
  refit_timeline_mark(s->timeline, b, REFIT_TL_PACK_END, 0);
  REFIT_CHECK(st);
  if (nx > 0 && refit_session_fault_here(s, REFIT_FAULT_PHASE_TRANSFER) &&
      b == refit_session_fault_bucket(s)) {
    REFIT_CHECK(refit_session_fault_act(s, "transfer"));
    if (s->fault.action == REFIT_FAULT_BITFLIP) {
      unsigned char *at = (unsigned char *)s->xfers[0].buf + s->xfers[0].bytes / 2;
      unsigned char byte;
      REFIT_CHECK(refit_mem_to_host(s->mem, &byte, at, 1));
      byte ^= 0x04;
      REFIT_CHECK(refit_mem_from_host(s->mem, at, &byte, 1));
      REFIT_WARN("fault seam: flipped a bit of bucket %d to rank %d", b,
                 s->xfers[0].peer);
    } else if (s->fault.action == REFIT_FAULT_TRUNCATE) {
      s->xfers[0].bytes -= 1;
      REFIT_WARN("fault seam: truncated bucket %d to rank %d", b, s->xfers[0].peer);
    } else if (s->fault.action == REFIT_FAULT_DROP) {
      REFIT_WARN("fault seam: dropped bucket %d to rank %d", b, s->xfers[0].peer);
      s->xfers[0] = s->xfers[--nx];
    } else if (s->fault.action == REFIT_FAULT_STALE && s->pending > 1 && s->attempt > 1) {
      /* The bytes of this refit, sealed as the previous refit's: what a
       * message of that refit left in a queue would look like. */
      REFIT_CHECK(s->path->seal(s, b, packed_at,
                                     refit_seal_tag(s->pending - 1, s->attempt - 1)));
      REFIT_CHECK(refit_mem_sync(s->mem));
      REFIT_WARN("fault seam: bucket %d sealed as the refit of version %llu", b,
                 (unsigned long long)(s->pending - 1));
    }
  }
  REFIT_CHECK(refit_session_start(s, s->xfers, nx, NULL, 0, s->tag_base | (b & 0xfff),
                                  &s->inflight[slot]));
  refit_timeline_post(s->timeline, b, slot, refit_xfers_bytes(s->xfers, nx));
  s->next_posted = b + 1;
  s->next_bucket++;
  *done = 0;
  return REFIT_OK;
}

/* Generator: post bucket b+1, wait for bucket b, land it. */
static refit_status_t refit_session_step_generator(refit_session_t *s, int *done) {
  const refit_plan_t *p = s->plan;
  const int32_t b = s->next_bucket;
  int nx = 0;
  if (b == 0 && p->nbuckets > 0 && s->next_posted == 0) {
    refit_generator_recvs(s, 0, s->buffer[0], s->xfers, &nx);
    REFIT_CHECK(
        refit_session_start(s, NULL, 0, s->xfers, nx, s->tag_base, &s->inflight[0]));
    refit_timeline_post(s->timeline, 0, 0, refit_xfers_bytes(s->xfers, nx));
    s->next_posted = 1;
  }
  if (b >= p->nbuckets) {
    double t = MPI_Wtime();
    refit_status_t st = refit_loader_end(s->loader);
    s->times.unpack += MPI_Wtime() - t;
    REFIT_CHECK(st);
    refit_timeline_phase(s->timeline, REFIT_TL_PROGRESS_END);
    *done = 1;
    return REFIT_OK;
  }
  if (b + 1 < p->nbuckets && s->next_posted <= b + 1) {
    const int next = (b + 1) % REFIT_EXCHANGES_IN_FLIGHT;
    refit_generator_recvs(s, b + 1, s->buffer[next], s->xfers, &nx);
    REFIT_CHECK(refit_session_start(s, NULL, 0, s->xfers, nx,
                                    s->tag_base | ((b + 1) & 0xfff), &s->inflight[next]));
    refit_timeline_post(s->timeline, b + 1, next, refit_xfers_bytes(s->xfers, nx));
    s->next_posted = b + 2;
  }
  const int slot = b % REFIT_EXCHANGES_IN_FLIGHT;
  if (refit_session_fault_here(s, REFIT_FAULT_PHASE_TRANSFER) &&
      b == refit_session_fault_bucket(s))
    REFIT_CHECK(refit_session_fault_act(s, "transfer"));
  if (s->cfg.refit.mode == REFIT_MODE_ASYNC && MPI_Wtime() < s->deadline) {
    /* Async: the engine serves between progress calls, so a bucket still in
     * flight returns at once instead of blocking it. */
    int arrived = 0;
    REFIT_CHECK(refit_session_poll_slot(s, slot, &arrived));
    if (!arrived) {
      *done = 0;
      return REFIT_OK;
    }
  }
  REFIT_CHECK(refit_session_wait_slot(s, slot, "receive", b));
  refit_land_fault_t lf = REFIT_LAND_NORMAL;
  if (refit_session_fault_here(s, REFIT_FAULT_PHASE_QUANTIZE) &&
      b == refit_session_fault_bucket(s)) {
    REFIT_CHECK(refit_session_fault_act(s, "quantize"));
    lf = s->fault.action == REFIT_FAULT_DROP        ? REFIT_LAND_DROP_ONE
         : s->fault.action == REFIT_FAULT_DUPLICATE ? REFIT_LAND_DUPLICATE_ONE
         : s->fault.action == REFIT_FAULT_BITFLIP   ? REFIT_LAND_FLIP_ONE
                                                    : REFIT_LAND_NORMAL;
  }
  double t = MPI_Wtime();
  refit_timeline_mark(s->timeline, b, REFIT_TL_LAND_START, 0);
  const uint64_t tag = refit_seal_tag(s->pending, s->attempt);
  refit_status_t st = s->path->land(s, b, slot, tag, lf);
  s->times.unpack += MPI_Wtime() - t;
  refit_timeline_mark(s->timeline, b, REFIT_TL_LAND_END, 0);
  REFIT_CHECK(st);
  s->next_bucket++;
  *done = 0;
  return REFIT_OK;
}

refit_status_t refit_session_progress(refit_session_t *s, int *done) {
  *done = 0;
  if (s->state == REFIT_STATE_READY) {
    *done = 1;
    return REFIT_OK;
  }
  if (s->state != REFIT_STATE_RECEIVING)
    return REFIT_ERR(REFIT_ERR_STATE, "progress: no refit in progress (state %d)",
                     (int)s->state);
  refit_status_t st = s->is_trainer ? refit_session_step_trainer(s, done)
                                    : refit_session_step_generator(s, done);
  if (st != REFIT_OK) {
    /* Keep the first failure's message: the drain in abort may fail again
     * (a transport refusing work after the first failure), and the vote
     * should name the cause, not the echo. */
    if (s->failure[0] == '\0')
      snprintf(s->failure, sizeof(s->failure), "%s", refit_last_error());
    refit_session_abort(s);
    return st;
  }
  if (*done)
    s->state = REFIT_STATE_READY;
  return REFIT_OK;
}

/* refit.timeline: this committed refit's marks to their file. The refit
 * stands whatever becomes of the file: a failure to write it is a warning. */
static void refit_session_write_timeline(const refit_session_t *s) {
  if (s->timeline == NULL)
    return;
  const refit_timeline_owner_t who = {.rank = s->rank,
                                      .role_rank = s->role_rank,
                                      .trainer = s->is_trainer,
                                      .version = s->committed,
                                      .attempt = s->attempt,
                                      .transport = s->transport.ops->name};
  if (refit_timeline_write(s->timeline, s->cfg.refit.timeline, &who) != REFIT_OK)
    REFIT_WARN("%s", refit_last_error());
}

/* This rank's vote on the attempt begun (ok: yes), everyone's into
 * s->vote_buf + 1; the vote is no longer owed, whatever the outcome. A live
 * peer may still be waiting out this refit's deadline (a message that never
 * came) before it votes: a rank that got here early waits for that deadline
 * plus the timeout, so only a dead or stalled peer misses the vote. */
static refit_status_t refit_session_vote(refit_session_t *s, int ok) {
  s->vote_buf[0] = ok;
  s->vote_pending = 0;
  const double vote_deadline =
      (MPI_Wtime() > s->deadline ? MPI_Wtime() : s->deadline) + s->cfg.refit.timeout_s;
  return refit_session_gather(s, s->vote_buf, s->vote_buf + 1, (int)sizeof(int),
                              REFIT_CTRL_TAG_VOTE, vote_deadline, "commit: vote", NULL,
                              0);
}

refit_status_t refit_session_commit(refit_session_t *s, void *stream) {
  refit_status_t st = REFIT_OK;
  /* The vote's buffers live in the session (see begin's headers). */
  int *const votes = s->vote_buf + 1;
  int ok = s->state == REFIT_STATE_READY;
  if (!s->vote_pending && s->vote_settled != REFIT_OK) {
    /* refit_abort (or a failed progress or begin) voted no already: the
     * commit the API asks for after a failure names that failure, or the
     * vote's own, once. */
    const refit_status_t settled = (refit_status_t)s->vote_settled;
    s->vote_settled = REFIT_OK;
    if (settled != REFIT_ERR_STATE)
      return REFIT_ERR(settled, "%s", s->failure);
    return REFIT_ERR(REFIT_ERR_STATE,
                     "commit of version %llu refused: this rank failed: %s; version "
                     "%llu stays",
                     (unsigned long long)s->pending, s->failure,
                     (unsigned long long)s->committed);
  }
  if (s->broken)
    return REFIT_ERR(REFIT_ERR_PEER, "commit: the session cannot continue after "
                                     "an earlier timeout (restart the job)");
  if (!s->vote_pending)
    return REFIT_ERR(REFIT_ERR_STATE, "commit: no refit to commit (none begun, "
                                      "or its vote already happened)");
  if (refit_session_fault_here(s, REFIT_FAULT_PHASE_COMMIT)) {
    st = refit_session_fault_act(s, "commit");
    ok = ok && st == REFIT_OK;
  }
  /* A rank that failed earlier still votes (no), so that nobody waits for
   * it and nobody commits. */
  if (ok)
    s->state = REFIT_STATE_COMMITTING;
  const double t = MPI_Wtime();
  refit_timeline_phase(s->timeline, REFIT_TL_COMMIT_START);
  if (refit_session_fault_here(s, REFIT_FAULT_PHASE_VOTE) &&
      s->fault.action == REFIT_FAULT_STALL) {
    /* Held at the vote until every peer's vote deadline has passed, then
     * it votes: nobody can know the outcome. */
    refit_fault_hold(s->rank, "inside the commit vote",
                     (double)(time_t)(2 * s->cfg.refit.timeout_s) + 1);
  }
  refit_status_t wst = refit_session_vote(s, ok);
  if (wst != REFIT_OK && !ok) {
    /* This rank voted no: nobody can have committed, whatever became of
     * the vote elsewhere. Keep or restore version V (below). */
    if (st == REFIT_OK)
      st = wst;
  } else if (wst != REFIT_OK) {
    /* This rank voted yes and cannot learn the outcome: peers whose vote
     * completed may have committed the new version, others may not have.
     * Guessing either way could leave the ranks of one engine on different
     * versions, so a generator refuses to serve (POISONED) until a full
     * successful refit; the session is broken (a collective never
     * completed), so that means a restart. */
    char why[512];
    snprintf(why, sizeof(why), "%s", refit_last_error());
    s->state = s->is_trainer ? REFIT_STATE_IDLE : REFIT_STATE_POISONED;
    return REFIT_ERR(wst,
                     "commit of version %llu: the vote did not complete on %s "
                     "rank %d (%s); its outcome is unknown here (peers may have "
                     "committed)%s",
                     (unsigned long long)s->pending,
                     s->is_trainer ? "trainer" : "generator", s->role_rank, why,
                     s->is_trainer ? ""
                                   : ": POISONED, refusing to serve until a "
                                     "full successful refit (restart the job)");
  } else if (ok) {
    int first_no = -1, nno = 0;
    for (int r = 0; r < s->size; r++)
      if (!votes[r]) {
        if (first_no < 0)
          first_no = r;
        nno++;
      }
    if (nno > 0)
      st = REFIT_ERR(REFIT_ERR_PEER,
                     "commit of version %llu refused: %d rank%s did not complete "
                     "(first: world rank %d); version %llu stays",
                     (unsigned long long)s->pending, nno, nno == 1 ? "" : "s", first_no,
                     (unsigned long long)s->committed);
  } else if (st == REFIT_OK) {
    /* This rank failed earlier: name that failure. */
    char why[512];
    snprintf(why, sizeof(why), "%s", s->failure[0] ? s->failure : refit_last_error());
    st = REFIT_ERR(REFIT_ERR_STATE,
                   "commit of version %llu refused: this rank failed: %s; "
                   "version %llu stays",
                   (unsigned long long)s->pending, why, (unsigned long long)s->committed);
  }
  if (st != REFIT_OK) {
    if (s->state == REFIT_STATE_COMMITTING)
      s->state = REFIT_STATE_READY;
    refit_session_abort(s);
    return st;
  }
  if (!s->is_trainer) {
    st = refit_loader_commit(s->loader);
    if (st != REFIT_OK) {
      /* The vote passed but the shadow copy failed: storage may be mixed. */
      s->state = REFIT_STATE_POISONED;
      return st;
    }
  }
  /* The engine's work queued on `stream` from now on reads the new
   * version (the async shadow copy above is on refit's stream). */
  if (!s->is_trainer && (st = refit_mem_before_stream(s->mem, stream)) != REFIT_OK) {
    s->state = REFIT_STATE_POISONED;
    return st;
  }
  s->times.commit = MPI_Wtime() - t;
  s->committed = s->pending;
  s->path->commit(s);
  s->poisoned_before = 0;
  s->state = REFIT_STATE_IDLE;
  const double t_release = MPI_Wtime();
  refit_session_release_staging(s);
  s->times.staging += MPI_Wtime() - t_release;
  s->times.total = MPI_Wtime() - s->t_begin;
  refit_timeline_phase(s->timeline, REFIT_TL_COMMIT_END);
  refit_session_write_timeline(s);
  return REFIT_OK;
}

/* After a local failure mid-refit, finish this rank's part of the bucket
 * schedule without landing anything (generators receive and discard, trainers
 * keep sending), so that healthy peers reach the vote instead of waiting for
 * the deadline. Skipped when a peer is already known lost. */
static void refit_session_drain(refit_session_t *s) {
  const refit_plan_t *p = s->plan;
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++)
    if (refit_session_wait_slot(s, i, "drain", -1) != REFIT_OK)
      return;
  for (int32_t b = s->next_posted; b < p->nbuckets && !s->peer_lost; b++) {
    int nx = 0;
    refit_exchange_t *ex = NULL;
    if (s->is_trainer) {
      if (refit_trainer_pack(s, b, s->buffer[0], s->xfers, &nx, 1) != REFIT_OK)
        return;
      if (refit_session_start(s, s->xfers, nx, NULL, 0, s->tag_base | (b & 0xfff), &ex) !=
          REFIT_OK)
        return;
    } else {
      refit_generator_recvs(s, b, s->buffer[0], s->xfers, &nx);
      if (refit_session_start(s, NULL, 0, s->xfers, nx, s->tag_base | (b & 0xfff), &ex) !=
          REFIT_OK)
        return;
    }
    s->inflight[0] = ex;
    if (refit_session_wait_slot(s, 0, "drain", b) != REFIT_OK)
      return;
  }
}

refit_status_t refit_session_abort(refit_session_t *s) {
  if (s->state == REFIT_STATE_IDLE || s->state == REFIT_STATE_POISONED)
    return REFIT_OK;
  if (s->failure[0] == '\0')
    snprintf(s->failure, sizeof(s->failure), "the refit was aborted (refit_abort)");
  if (s->state == REFIT_STATE_RECEIVING && !s->peer_lost && !s->broken)
    refit_session_drain(s);
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++)
    if (s->inflight[i] != NULL) {
      s->transport.ops->abandon(s->transport.ctx, s->inflight[i]);
      s->inflight[i] = NULL;
      s->exposed = 1;
    }
  /* The aborted attempt's vote is settled here (no), so that peers still
   * finishing it learn the outcome at their commit, and this rank's next
   * begin meets their next begin, not their vote. Voting no is safe even if
   * the vote misses its deadline: nobody can have committed. */
  if (s->vote_pending) {
    refit_status_t vst = s->broken ? REFIT_OK : refit_session_vote(s, 0);
    s->vote_pending = 0;
    s->vote_settled = REFIT_ERR_STATE;
    if (vst != REFIT_OK) { /* the commit that follows reports the vote's end */
      s->vote_settled = vst;
      snprintf(s->failure, sizeof(s->failure), "%s", refit_last_error());
    }
  }
  if (!s->is_trainer && !refit_loader_rollback(s->loader)) {
    REFIT_WARN("generator rank %d: refit of version %llu failed after runtime "
               "storage was written and refit.restore is none: POISONED until "
               "a full successful refit",
               s->role_rank, (unsigned long long)s->pending);
    s->state = REFIT_STATE_POISONED;
    return REFIT_OK;
  }
  s->state = s->poisoned_before ? REFIT_STATE_POISONED : REFIT_STATE_IDLE;
  if (!s->vote_pending && !s->peer_lost)
    refit_session_release_staging(s);
  return REFIT_OK;
}

refit_status_t refit_session_verify(refit_session_t *s, uint64_t version,
                                    int64_t *mismatches) {
  *mismatches = 0;
  if (s->is_trainer)
    return REFIT_OK;
  if (refit_session_fault_here(s, REFIT_FAULT_PHASE_VERIFY) && s->nstores > 0 &&
      s->fault.action == REFIT_FAULT_BITFLIP) {
    unsigned char *at = (unsigned char *)s->stores[0].data + s->stores[0].bytes / 2;
    unsigned char byte;
    REFIT_CHECK(refit_mem_to_host(s->mem, &byte, at, 1));
    byte ^= 0x01;
    REFIT_CHECK(refit_mem_from_host(s->mem, at, &byte, 1));
    REFIT_WARN("fault seam: flipped a bit of runtime %s before verification",
               s->stores[0].name);
  }
  return refit_loader_verify(s->loader, &s->source, version, mismatches);
}
