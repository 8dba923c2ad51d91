/*
 * Zero-copy refit between ranks that share a GPU (refit.zero_copy): the
 * decision, the trainers' digest tables, and the exchange through which each
 * generator maps its trainers' tensors. zero_copy.c states the protocol.
 */
#ifndef REFIT_ZERO_COPY_H
#define REFIT_ZERO_COPY_H

#include "session/session.h"

/* Session open, after the transport (collective): whether every rank's
 * memory is on a GPU, and then which GPU each rank uses (s->gpu_of). */
refit_status_t refit_zc_locate(refit_session_t *s);

/* From the plan and s->gpu_of, on every rank alike (no collective): zero
 * copy when every pair of the plan shares a GPU (refit.zero_copy auto or on;
 * on refuses otherwise, naming a pair), with each of this rank's messages'
 * place in its buffer. Again after a re-plan. */
refit_status_t refit_zc_decide(refit_session_t *s);

/* The bucket cap of a zero-copy plan: the planner's largest. */
#define REFIT_ZC_BUCKET_BYTES (UINT64_C(1) << 40)

/* After refit_zc_decide chose zero copy, in sync mode (collective, every
 * rank alike): plan again with one bucket, since buckets bound staging and
 * zero copy stages nothing; a refit is then one hand-off between the
 * processes instead of one per bucket. Async mode keeps its buckets (a
 * generator serves between progress calls, each landing one bucket). The
 * bucketed plan stays if the merged one fails or pairs ranks on different
 * GPUs. Callers that plan again clear s->zc_merged first. */
refit_status_t refit_zc_merge(refit_session_t *s);

/* Bytes of one send buffer or staging area under zero copy: the digests of
 * this rank's largest bucket. */
int64_t refit_zc_buffer_bytes(const refit_session_t *s);

/* Place and length of my_msgs[k] in the bucket's buffer. */
void refit_zc_msg(const refit_session_t *s, int64_t k, int64_t *offset, int64_t *bytes);

/* Trainer: the DIGEST table of its chunks, bucket by bucket (in s->pack),
 * against the shards' current addresses; built at bind and after a move. */
refit_status_t refit_zc_trainer_tables(refit_session_t *s);

/* Trainer: seal bucket b's digests into `buf` with `tag` (nothing with
 * refit.digests off). */
refit_status_t refit_zc_seal(refit_session_t *s, int32_t b, void *buf, uint64_t tag);

/* After the header exchange of the first begin, or of one where a trainer
 * tensor moved: trainers send each of their generators (allocation handle,
 * offset) of every tensor they hold; generators map each allocation once and
 * build their zero-copy land tables. Bounded by `deadline`. */
refit_status_t refit_zc_exchange(refit_session_t *s, double deadline);

void refit_zc_close(refit_session_t *s);

#endif /* REFIT_ZERO_COPY_H */
