/*
 * NVFP4's global amax (docs/nvfp4.md, "The global amax"): every weight is
 * quantized under one FP32 global scale from the amax of its WHOLE Hugging
 * Face tensor (and a fused layer under the max over its pieces), but the
 * trainers hold shards and a generator assembles only its own. At begin,
 * after the trainers' new weights are in place, every trainer computes the
 * amax key (kernels/nvfp4.h: BF16 bits, sign cleared, ordered like the
 * values) of each Hugging Face tensor's rows in each shard it holds. The
 * keys reduce by integer max to one root (world rank 0), which answers
 * every rank with a verdict and the generators also with the whole
 * tensors' keys: O(ranks x tensors) bytes in all, where exchanging every
 * rank's keys with every rank would be O(ranks^2 x tensors). Only the
 * tensors an NVFP4 runtime tensor of any generator rank reads take part.
 *
 * Bounded: the root waits for the ranks' keys until the begin deadline
 * (refit.timeout_s) and names the ranks that did not answer in its
 * verdict; the other ranks wait for the verdict half a deadline longer, so
 * that a missing rank is named by the root rather than the root by them,
 * and name the root when it does not answer.
 */
#include "session/session.h"
#include "mpi/outlive.h"

#include "core/error.h"
#include "kernels/nvfp4.h"
#include "reshard/blocks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Which Hugging Face tensors feed an NVFP4 runtime tensor (mask[h] = 1). */
static refit_status_t refit_nvfp4_amax_mask(const refit_catalog_t *cat, unsigned char *mask) {
  for (int64_t g = 0; g < cat->gen_begin[cat->generator.tp]; g++) {
    if (cat->gen[g].quantized != REFIT_QUANT_NVFP4)
      continue;
    refit_block_piece_t *p = NULL;
    int64_t n = 0;
    REFIT_CHECK(refit_block_pieces(cat, g, &p, &n));
    for (int64_t k = 0; k < n; k++)
      mask[p[k].hf] = 1;
    free(p);
  }
  return REFIT_OK;
}

/* This trainer's keys: for each shard, each row run's rows in it, merged
 * per Hugging Face tensor into slots of this rank's memory: one table of
 * every run, one kernel over it on a GPU, one copy reads every slot back. */
static refit_status_t refit_nvfp4_amax_local(refit_session_t *s, const unsigned char *mask,
                                             uint16_t *keys) {
  const refit_catalog_t *cat = s->cat;
  const size_t bytes = (size_t)(cat->nhf ? cat->nhf : 1) * sizeof(uint32_t);
  int64_t nruns = 0, n = 0;
  for (int64_t i = 0; i < cat->nsrc; i++)
    nruns += s->shards[i] != NULL ? cat->src[i].run_count : 0;
  uint32_t *slots = NULL, *host = malloc(bytes);
  refit_nvfp4_amax_desc_t *descs = malloc((size_t)(nruns ? nruns : 1) * sizeof(*descs));
  refit_status_t st = host == NULL || descs == NULL
                          ? REFIT_ERR(REFIT_ERR_NO_MEMORY, "NVFP4 amax keys of %lld runs",
                                      (long long)nruns)
                          : refit_mem_alloc(s->mem, bytes, (void **)&slots);
  if (st == REFIT_OK)
    st = refit_mem_zero(s->mem, slots, bytes);
  for (int64_t i = 0; i < cat->nsrc && st == REFIT_OK; i++) {
    if (s->shards[i] == NULL)
      continue;
    const refit_src_tensor_t *t = &cat->src[i];
    int64_t rows, cols;
    refit_src_shard_shape(t, &rows, &cols);
    const int64_t row0 = t->split == REFIT_SPLIT_ROWS ? s->shard_part[i] * rows : 0;
    for (int64_t k = t->run_begin; k < t->run_begin + t->run_count; k++) {
      const refit_row_run_t *r = &cat->runs[k];
      const int64_t lo = r->src_row > row0 ? r->src_row : row0;
      const int64_t hi =
          r->src_row + r->rows < row0 + rows ? r->src_row + r->rows : row0 + rows;
      if (hi <= lo || !mask[r->hf])
        continue;
      refit_nvfp4_amax_desc_t *d = &descs[n++];
      d->src = s->shards[i] + (lo - row0) * cols;
      d->rows = hi - lo;
      d->k = d->stride = cols;
      d->slot = slots + r->hf;
    }
  }
  if (st == REFIT_OK)
    st = refit_mem_amax_merge(s->mem, descs, n);
  if (st == REFIT_OK)
    st = refit_mem_to_host(s->mem, host, slots, bytes);
  for (int64_t h = 0; h < cat->nhf && st == REFIT_OK; h++)
    if (host[h] > keys[h])
      keys[h] = (uint16_t)host[h];
  if (slots != NULL)
    refit_mem_free(s->mem, slots);
  free(descs);
  free(host);
  return st;
}

/* The root's answer: a verdict, then (to generators) the keys. */
enum { AMAX_OK = 0, AMAX_FAILED = 1, AMAX_LATE = 2 };
typedef struct {
  int32_t verdict; /* AMAX_* */
  int32_t rank;    /* AMAX_FAILED: the first rank that could not compute its
                      keys; AMAX_LATE: the first that did not answer */
  int32_t count;   /* how many failed or did not answer */
  int32_t pad;
} amax_verdict_t;

/* Wait for reqs[0..n) (peer[i]'s) until `deadline`; on a timeout name the
 * pending ones into `names` and return their count, else 0 (-1: MPI
 * failed). */
static int refit_amax_wait(refit_session_t *s, MPI_Request *reqs, const int *peer, int n,
                           double deadline, char *names, size_t len) {
  for (unsigned spins = 0;;) {
    int done = 0;
    if (MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
      return -1;
    if (done)
      return 0;
    if (MPI_Wtime() > deadline)
      return refit_session_name_pending(s, reqs, peer, n, names, len);
    refit_poll_nap(&spins);
  }
}

/* The verdict as this rank's error (REFIT_OK for AMAX_OK). */
static refit_status_t refit_amax_verdict(refit_session_t *s, const amax_verdict_t *v,
                                         uint64_t version) {
  char who[96];
  if (v->verdict == AMAX_OK)
    return REFIT_OK;
  refit_session_rank_name(s, v->rank, who, sizeof(who));
  if (v->verdict == AMAX_FAILED)
    return REFIT_ERR(REFIT_ERR_PEER,
                     "begin %llu: %s failed before or in the NVFP4 global amax "
                     "exchange (its error is in its log)%s",
                     (unsigned long long)version, who,
                     v->count > 1 ? ", and other ranks too" : "");
  s->broken = 1;
  return REFIT_ERR(REFIT_ERR_TIMEOUT,
                   "begin %llu: NVFP4 global amax exchange: %d rank%s did not answer "
                   "world rank 0 within refit.timeout_s = %.1f s: %s%s (dead, stalled or "
                   "not started); this session cannot continue",
                   (unsigned long long)version, (int)v->count, v->count == 1 ? "" : "s",
                   s->cfg.refit.timeout_s, who, v->count > 1 ? " and others" : "");
}

/* Root (world rank 0): every other rank's keys, reduced; the verdict and
 * keys to every rank. `keys` (nhf + 1 entries, heap) holds this rank's
 * keys and ok flag on entry, the whole tensors' keys on return. */
static refit_status_t refit_amax_root(refit_session_t *s, uint16_t *keys, uint64_t version,
                                      double deadline) {
  const int64_t nhf = s->cat->nhf;
  const size_t tkeys = (size_t)(nhf + 1); /* a trainer's message, in keys */
  const int npeers = s->size - 1;
  /* Trainers' keys at up[(r - 1) * tkeys], generators' ok flags after. */
  const size_t nup = (size_t)(s->ntrainer - 1) * tkeys + (size_t)s->ngenerator;
  uint16_t *up = calloc(nup ? nup : 1, sizeof(uint16_t));
  unsigned char *down = malloc(sizeof(amax_verdict_t) + (size_t)nhf * sizeof(uint16_t));
  MPI_Request *reqs = malloc((size_t)(npeers + 1) * sizeof(*reqs));
  int *peer = malloc((size_t)(npeers + 1) * sizeof(*peer));
  if (up == NULL || down == NULL || reqs == NULL || peer == NULL) {
    free(up);
    free(down);
    free(reqs);
    free(peer);
    s->broken = 1; /* the peers wait for the root in vain and name it */
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "begin %llu: NVFP4 amax keys of %d ranks",
                     (unsigned long long)version, s->size);
  }
  refit_status_t st = REFIT_OK;
  for (int r = 1; r <= npeers; r++) {
    const int trainer = r < s->ntrainer;
    uint16_t *at = trainer ? up + (size_t)(r - 1) * tkeys
                           : up + (size_t)(s->ntrainer - 1) * tkeys + (r - s->ntrainer);
    peer[r - 1] = r;
    reqs[r - 1] = MPI_REQUEST_NULL;
    if (st == REFIT_OK &&
        MPI_Irecv(at, (int)((trainer ? tkeys : 1) * sizeof(uint16_t)), MPI_BYTE, r,
                  REFIT_CTRL_TAG_AMAX, s->ctrl, &reqs[r - 1]) != MPI_SUCCESS)
      st = REFIT_ERR(REFIT_ERR_MPI, "begin %llu: NVFP4 amax: MPI_Irecv from world rank %d "
                     "failed", (unsigned long long)version, r);
  }
  amax_verdict_t v = {AMAX_OK, 0, 0, 0};
  char names[512];
  const int late = st == REFIT_OK
                       ? refit_amax_wait(s, reqs, peer, npeers, deadline, names, sizeof(names))
                       : -1;
  if (late < 0 && st == REFIT_OK)
    st = REFIT_ERR(REFIT_ERR_MPI, "begin %llu: NVFP4 amax: MPI_Testall failed",
                   (unsigned long long)version);
  if (late > 0) {
    v.verdict = AMAX_LATE;
    v.count = late;
    for (int i = 0; i < npeers; i++) {
      int flag = 1;
      if (reqs[i] != MPI_REQUEST_NULL)
        MPI_Request_get_status(reqs[i], &flag, MPI_STATUS_IGNORE);
      if (!flag) {
        v.rank = peer[i];
        break;
      }
    }
  } else {
    /* Every rank's ok flag, then the maximum of every trainer's keys. */
    if (!keys[nhf])
      v = (amax_verdict_t){AMAX_FAILED, 0, 1, 0};
    for (int r = 1; r <= npeers; r++) {
      const uint16_t ok = r < s->ntrainer
                              ? up[(size_t)(r - 1) * tkeys + (size_t)nhf]
                              : up[(size_t)(s->ntrainer - 1) * tkeys + (r - s->ntrainer)];
      if (!ok && v.count++ == 0)
        v = (amax_verdict_t){AMAX_FAILED, r, 1, 0};
    }
    for (int r = 1; r < s->ntrainer; r++)
      for (int64_t h = 0; h < nhf; h++)
        if (up[(size_t)(r - 1) * tkeys + (size_t)h] > keys[h])
          keys[h] = up[(size_t)(r - 1) * tkeys + (size_t)h];
  }
  memcpy(down, &v, sizeof(v));
  memcpy(down + sizeof(v), keys, (size_t)nhf * sizeof(uint16_t));
  /* The answer: the verdict to trainers, verdict and keys to generators.
   * Sent to every rank, a late one too (it learns it was named). */
  MPI_Request *sends = malloc((size_t)(npeers + 1) * sizeof(*sends));
  if (sends == NULL && st == REFIT_OK)
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "begin %llu: NVFP4 amax answer",
                   (unsigned long long)version);
  int unsent = 0;
  if (sends != NULL) {
    for (int r = 1; r <= npeers; r++) {
      sends[r - 1] = MPI_REQUEST_NULL;
      const size_t bytes =
          sizeof(v) + (r < s->ntrainer ? 0 : (size_t)nhf * sizeof(uint16_t));
      if (MPI_Isend(down, (int)bytes, MPI_BYTE, r, REFIT_CTRL_TAG_AMAX, s->ctrl,
                    &sends[r - 1]) != MPI_SUCCESS && st == REFIT_OK)
        st = REFIT_ERR(REFIT_ERR_MPI, "begin %llu: NVFP4 amax: MPI_Isend to world rank %d "
                       "failed", (unsigned long long)version, r);
    }
    /* A live rank takes its answer within its own, longer deadline. */
    char unnamed[512];
    unsent = refit_amax_wait(s, sends, peer, npeers,
                             deadline + 0.5 * s->cfg.refit.timeout_s, unnamed,
                             sizeof(unnamed));
    if (unsent != 0 && v.verdict == AMAX_OK && st == REFIT_OK)
      st = REFIT_ERR(REFIT_ERR_TIMEOUT,
                     "begin %llu: NVFP4 global amax exchange: %s did not take world rank "
                     "0's answer within refit.timeout_s = %.1f s; this session cannot "
                     "continue",
                     (unsigned long long)version, unnamed, s->cfg.refit.timeout_s);
  }
  if (late != 0 || unsent != 0 || st != REFIT_OK) {
    /* What is still posted may complete later, into up and from down. */
    s->broken = 1;
    void *blocks[2] = {up, down};
    refit_outlive_park_all(reqs, npeers, blocks, 2);
    if (sends != NULL)
      refit_outlive_park_all(sends, npeers, NULL, 0);
  } else {
    free(up);
    free(down);
  }
  free(sends);
  free(reqs);
  free(peer);
  if (st != REFIT_OK)
    return st;
  if (v.verdict == AMAX_LATE) {
    return REFIT_ERR(REFIT_ERR_TIMEOUT,
                     "begin %llu: NVFP4 global amax exchange: %d rank%s did not answer "
                     "within refit.timeout_s = %.1f s: %s (dead, stalled or not started); "
                     "this session cannot continue",
                     (unsigned long long)version, late, late == 1 ? "" : "s",
                     s->cfg.refit.timeout_s, names);
  }
  return refit_amax_verdict(s, &v, version);
}

/* Any rank but the root: its keys (a trainer) or ok flag (a generator) up,
 * the root's answer down. `keys` (nhf + 1 entries, heap) as for the root. */
static refit_status_t refit_amax_leaf(refit_session_t *s, uint16_t *keys, uint64_t version,
                                      double deadline) {
  const int64_t nhf = s->cat->nhf;
  const size_t answer = sizeof(amax_verdict_t) + (s->is_trainer ? 0 : (size_t)nhf * 2);
  /* A generator sends only its ok flag (keys[nhf]). The message goes from a
   * copy, so that a missed deadline parks it and never the caller's keys. */
  const size_t up = (s->is_trainer ? (size_t)(nhf + 1) : 1) * sizeof(uint16_t);
  unsigned char *down = malloc(answer);
  uint16_t *mine = malloc(up);
  if (down == NULL || mine == NULL) {
    free(down);
    free(mine);
    s->broken = 1; /* the root names this rank */
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "begin %llu: NVFP4 amax answer",
                     (unsigned long long)version);
  }
  memcpy(mine, s->is_trainer ? keys : keys + nhf, up);
  MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  const int peer[2] = {0, 0};
  refit_status_t st = REFIT_OK;
  if (MPI_Irecv(down, (int)answer, MPI_BYTE, 0, REFIT_CTRL_TAG_AMAX, s->ctrl, &reqs[0]) !=
          MPI_SUCCESS ||
      MPI_Isend(mine, (int)up, MPI_BYTE, 0, REFIT_CTRL_TAG_AMAX, s->ctrl, &reqs[1]) !=
          MPI_SUCCESS)
    st = REFIT_ERR(REFIT_ERR_MPI, "begin %llu: NVFP4 amax: MPI_Irecv/MPI_Isend with world "
                   "rank 0 failed", (unsigned long long)version);
  char names[160];
  const int late = st == REFIT_OK ? refit_amax_wait(s, reqs, peer, 2,
                                                    deadline + 0.5 * s->cfg.refit.timeout_s,
                                                    names, sizeof(names))
                                  : -1;
  if (late != 0) {
    s->broken = 1;
    void *blocks[2] = {down, mine};
    refit_outlive_park_all(reqs, 2, blocks, 2);
    if (st != REFIT_OK)
      return st;
    if (late < 0)
      return REFIT_ERR(REFIT_ERR_MPI, "begin %llu: NVFP4 amax: MPI_Testall failed",
                       (unsigned long long)version);
    return REFIT_ERR(REFIT_ERR_TIMEOUT,
                     "begin %llu: NVFP4 global amax exchange: trainer rank 0 (world rank 0) "
                     "did not answer within 1.5 x refit.timeout_s = %.1f s (dead, stalled "
                     "or not started); this session cannot continue",
                     (unsigned long long)version, 1.5 * s->cfg.refit.timeout_s);
  }
  amax_verdict_t v;
  memcpy(&v, down, sizeof(v));
  if (!s->is_trainer)
    memcpy(keys, down + sizeof(v), (size_t)nhf * sizeof(uint16_t));
  free(down);
  free(mine);
  return refit_amax_verdict(s, &v, version);
}

refit_status_t refit_session_nvfp4_amax(refit_session_t *s, int ok, uint64_t version) {
  const refit_catalog_t *cat = s->cat;
  const int64_t nhf = cat->nhf;
  if ((size_t)(nhf + 1) * sizeof(uint16_t) + sizeof(amax_verdict_t) > (size_t)INT32_MAX)
    return REFIT_ERR(REFIT_ERR_INTERNAL, "begin %llu: %lld amax keys exceed one message",
                     (unsigned long long)version, (long long)nhf);
  /* This rank's keys, then its ok flag; the whole tensors' keys after. */
  uint16_t *keys = calloc((size_t)(nhf + 1), sizeof(uint16_t));
  unsigned char *mask = calloc((size_t)(nhf ? nhf : 1), 1);
  refit_status_t st = REFIT_OK;
  if (keys == NULL || mask == NULL) {
    free(keys);
    free(mask);
    s->broken = 1; /* no buffers to take part with: the root names this rank */
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "begin %llu: NVFP4 amax keys",
                     (unsigned long long)version);
  }
  st = refit_nvfp4_amax_mask(cat, mask);
  if (st == REFIT_OK && ok && s->is_trainer)
    st = refit_nvfp4_amax_local(s, mask, keys);
  free(mask);
  keys[nhf] = ok && st == REFIT_OK;
  const double deadline = MPI_Wtime() + s->cfg.refit.timeout_s;
  const refit_status_t xst = s->rank == 0 ? refit_amax_root(s, keys, version, deadline)
                                          : refit_amax_leaf(s, keys, version, deadline);
  if (s->broken) {
    free(keys);
    return xst;
  }
  if (st == REFIT_OK)
    st = xst;
  if (st == REFIT_OK && !s->is_trainer)
    refit_loader_nvfp4_scales(s->loader, keys);
  free(keys);
  return st;
}
