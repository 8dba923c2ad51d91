/*
 * Receives of variable length over a transport whose messages must be
 * exactly as long as their receives (NCCL's: ncclRecv takes a count and
 * matches by order). Delta refits need them (delta_wire.h): a frame's
 * length is known only to its sender.
 *
 * Each exchange first tells every peer the lengths of its messages: one
 * header per peer, the lengths (uint64) of that exchange's messages to the
 * peer in list order, over an MPI transport of its own (host memory, a
 * communicator of its own). Then each message goes over the wrapped
 * transport with its exact length; one of length 0 is not sent at all.
 *
 * Order: the wrapped transport matches messages by order per pair of ranks,
 * so every rank posts the bodies of its exchanges in the order it started
 * them (a queue): an exchange whose headers are in waits for every earlier
 * one to post its body. A sender knows its lengths, so an exchange with
 * nothing to receive posts its body at start().
 *
 * Failures: a failed or abandoned exchange marks the wrapper unhealthy, and
 * recover() (the next begin, on every rank) repairs the header transport (a
 * fresh communicator: no header of the failed refit can match a later one)
 * and the wrapped one. A failed exchange's headers stay allocated until
 * destroy(): a late peer may still write them.
 *
 * The wrapper is named after the wrapped transport ("nccl+lengths") and
 * keeps its kind and memory.
 */
#include "transport/transport.h"

#include "core/log.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const refit_transport_ops_t refit_transport_mpi; /* transport_mpi.c */

/* The messages of one list grouped by peer, in order of first appearance:
 * group g is peer[g], holding the list's messages idx[begin[g] ..
 * begin[g+1]) (list order), whose lengths are len[begin[g] .. begin[g+1]). */
typedef struct {
  int n;
  int *peer, *begin, *idx;
  uint64_t *len;
  refit_xfer_t *hdr; /* [n] one header per group */
} refit_lengths_groups_t;

struct refit_exchange {
  refit_exchange_t *next; /* the queue of exchanges whose bodies wait to be posted */
  refit_lengths_groups_t out, in;
  refit_xfer_t *sends, *recvs; /* the caller's, copied */
  int nsends, nrecvs, tag;
  refit_exchange_t *hdr_out, *hdr_in; /* header sends and receives (MPI) */
  refit_exchange_t *body;             /* on the wrapped transport, once posted */
  size_t *rlen; /* [nrecvs] each receive's length, from its header */
  int posted;
  refit_status_t st; /* a failure before the body completed */
  char why[512];
};

typedef struct {
  refit_transport_ops_t ops; /* the wrapped transport's, with variable lengths */
  char name[40];             /* "<wrapped>+lengths" */
  refit_transport_t inner;
  refit_transport_t hdr;
  refit_exchange_t *head, *tail; /* bodies not yet posted, in start order */
  refit_exchange_t *kept;        /* failed exchanges, freed by destroy() */
  int *group_of;                 /* [world size] scratch, -1 */
  int world_size;
  int dirty;
} refit_lengths_ctx_t;

static void refit_lengths_groups_free(refit_lengths_groups_t *g) {
  free(g->peer);
  free(g->begin);
  free(g->idx);
  free(g->len);
  free(g->hdr);
}

static void refit_lengths_exchange_free(refit_exchange_t *ex) {
  refit_lengths_groups_free(&ex->out);
  refit_lengths_groups_free(&ex->in);
  free(ex->sends);
  free(ex->recvs);
  free(ex->rlen);
  free(ex);
}

/* Group the n messages of x by peer into *g, with their lengths (a
 * receive's is overwritten by its header). */
static refit_status_t refit_lengths_group(refit_lengths_ctx_t *c, const refit_xfer_t *x,
                                          int n, refit_lengths_groups_t *g) {
  const size_t k = (size_t)(n ? n : 1);
  int *fill = malloc(k * sizeof(*fill));
  g->peer = malloc(k * sizeof(*g->peer));
  g->begin = calloc(k + 1, sizeof(*g->begin));
  g->idx = malloc(k * sizeof(*g->idx));
  g->len = calloc(k, sizeof(*g->len));
  g->hdr = calloc(k, sizeof(*g->hdr));
  if (fill == NULL || g->peer == NULL || g->begin == NULL || g->idx == NULL ||
      g->len == NULL || g->hdr == NULL) {
    free(fill);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "message lengths: %d messages", n);
  }
  refit_status_t st = REFIT_OK;
  int i = 0;
  for (; i < n; i++) {
    const int peer = x[i].peer;
    if (peer < 0 || peer >= c->world_size) {
      st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "message lengths: peer rank %d is not in the world (size %d)", peer,
                     c->world_size);
      break;
    }
    if (c->group_of[peer] < 0) {
      c->group_of[peer] = g->n;
      g->peer[g->n++] = peer;
    }
    g->begin[c->group_of[peer] + 1]++;
  }
  if (st == REFIT_OK) {
    for (int q = 0; q < g->n; q++) {
      g->begin[q + 1] += g->begin[q];
      fill[q] = g->begin[q];
    }
    for (int j = 0; j < n; j++) {
      const int at = fill[c->group_of[x[j].peer]]++;
      g->idx[at] = j;
      g->len[at] = x[j].bytes;
    }
    for (int q = 0; q < g->n; q++)
      g->hdr[q] = (refit_xfer_t){.peer = g->peer[q],
                                 .buf = &g->len[g->begin[q]],
                                 .bytes = (size_t)(g->begin[q + 1] - g->begin[q]) *
                                          sizeof(uint64_t)};
  }
  for (int j = 0; j < i; j++) /* the scratch back to -1 */
    c->group_of[x[j].peer] = -1;
  free(fill);
  return st;
}

/* Record ex's first failure, with its message for the caller's wait. */
static void refit_lengths_fail(refit_lengths_ctx_t *c, refit_exchange_t *ex,
                               refit_status_t st) {
  c->dirty = 1;
  if (ex->st != REFIT_OK)
    return;
  ex->st = st;
  snprintf(ex->why, sizeof(ex->why), "%s", refit_last_error());
}

/* Post ex's body on the wrapped transport: each receive with the length its
 * header gave (checked against what the caller posted), messages of
 * length 0 left out on both sides. */
static refit_status_t refit_lengths_post(refit_lengths_ctx_t *c, refit_exchange_t *ex) {
  const size_t k = (size_t)(ex->nsends + ex->nrecvs) + 1;
  refit_xfer_t *body = malloc(k * sizeof(*body));
  ex->rlen = malloc((size_t)(ex->nrecvs ? ex->nrecvs : 1) * sizeof(*ex->rlen));
  if (body == NULL || ex->rlen == NULL) {
    free(body);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "message lengths: %zu messages", k - 1);
  }
  for (int slot = 0; slot < ex->nrecvs; slot++)
    ex->rlen[ex->in.idx[slot]] = (size_t)ex->in.len[slot];
  int n = 0, ns = 0;
  for (int i = 0; i < ex->nsends; i++)
    if (ex->sends[i].bytes > 0)
      body[n++] = ex->sends[i];
  ns = n;
  refit_status_t st = REFIT_OK;
  for (int i = 0; i < ex->nrecvs && st == REFIT_OK; i++) {
    const refit_xfer_t *r = &ex->recvs[i];
    const size_t len = ex->rlen[i];
    if (len > r->bytes || (r->got == NULL && len != r->bytes))
      st = REFIT_ERR(REFIT_ERR_INTEGRITY,
                     "message lengths: rank %d sends a message of %zu bytes, but its "
                     "receive %s %zu bytes",
                     r->peer, len, r->got == NULL ? "expects exactly" : "holds at most",
                     r->bytes);
    else if (len > 0)
      body[n++] = (refit_xfer_t){.peer = r->peer, .buf = r->buf, .bytes = len};
  }
  if (st == REFIT_OK && n > 0)
    st = c->inner.ops->start(c->inner.ctx, body, ns, body + ns, n - ns, ex->tag,
                             &ex->body);
  free(body);
  if (st == REFIT_OK)
    ex->posted = 1;
  return st;
}

/* Post the bodies the queue allows, in start order: the head's once its
 * headers are in. A failed exchange leaves the queue with its failure. */
static void refit_lengths_advance(refit_lengths_ctx_t *c) {
  while (c->head != NULL) {
    refit_exchange_t *ex = c->head;
    refit_status_t st = REFIT_OK;
    if (ex->hdr_in != NULL) {
      int done = 0;
      st = c->hdr.ops->test(c->hdr.ctx, ex->hdr_in, &done);
      if (st == REFIT_OK && !done)
        return;
      ex->hdr_in = NULL; /* complete, or freed by its failure */
    }
    if (st == REFIT_OK)
      st = refit_lengths_post(c, ex);
    if (st != REFIT_OK)
      refit_lengths_fail(c, ex, st);
    c->head = ex->next;
    if (c->head == NULL)
      c->tail = NULL;
    ex->next = NULL;
  }
}

static void refit_lengths_unqueue(refit_lengths_ctx_t *c, refit_exchange_t *ex) {
  refit_exchange_t **at = &c->head, *prev = NULL;
  while (*at != NULL && *at != ex) {
    prev = *at;
    at = &(*at)->next;
  }
  if (*at == NULL)
    return;
  *at = ex->next;
  if (c->tail == ex)
    c->tail = prev;
  ex->next = NULL;
}

/* Give up one of ex's parts on transport t (where t cannot cancel, NCCL
 * and IPC, its abandon waits with a deadline already past, and NCCL then
 * aborts its communicators). */
static void refit_lengths_give_up(const refit_transport_t *t, refit_exchange_t *part) {
  t->ops->abandon(t->ctx, part);
}

/* Give up what of ex is still in flight and keep its buffers until
 * destroy(). */
static void refit_lengths_drop(refit_lengths_ctx_t *c, refit_exchange_t *ex) {
  refit_lengths_unqueue(c, ex);
  if (ex->hdr_in != NULL)
    refit_lengths_give_up(&c->hdr, ex->hdr_in);
  if (ex->body != NULL)
    refit_lengths_give_up(&c->inner, ex->body);
  if (ex->hdr_out != NULL)
    refit_lengths_give_up(&c->hdr, ex->hdr_out);
  ex->hdr_in = ex->body = ex->hdr_out = NULL;
  c->dirty = 1;
  ex->next = c->kept;
  c->kept = ex;
}

static refit_status_t refit_lengths_start(void *ctx, const refit_xfer_t *sends,
                                          int nsends, const refit_xfer_t *recvs,
                                          int nrecvs, int tag, refit_exchange_t **out) {
  refit_lengths_ctx_t *c = ctx;
  refit_exchange_t *ex = calloc(1, sizeof(*ex));
  if (ex == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "message lengths: exchange");
  ex->nsends = nsends;
  ex->nrecvs = nrecvs;
  ex->tag = tag;
  ex->sends = malloc((size_t)(nsends ? nsends : 1) * sizeof(*ex->sends));
  ex->recvs = malloc((size_t)(nrecvs ? nrecvs : 1) * sizeof(*ex->recvs));
  refit_status_t st = REFIT_OK;
  if (ex->sends == NULL || ex->recvs == NULL)
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "message lengths: %d messages", nsends + nrecvs);
  if (st == REFIT_OK) {
    if (nsends > 0) /* a rank with nothing to send may pass NULL */
      memcpy(ex->sends, sends, (size_t)nsends * sizeof(*sends));
    if (nrecvs > 0)
      memcpy(ex->recvs, recvs, (size_t)nrecvs * sizeof(*recvs));
    st = refit_lengths_group(c, sends, nsends, &ex->out);
  }
  if (st == REFIT_OK)
    st = refit_lengths_group(c, recvs, nrecvs, &ex->in);
  if (st != REFIT_OK) {
    refit_lengths_exchange_free(ex);
    return st;
  }
  /* Headers: receives first, so that the sends find them posted. */
  if (ex->in.n > 0)
    st = c->hdr.ops->start(c->hdr.ctx, NULL, 0, ex->in.hdr, ex->in.n, tag, &ex->hdr_in);
  if (st == REFIT_OK && ex->out.n > 0)
    st =
        c->hdr.ops->start(c->hdr.ctx, ex->out.hdr, ex->out.n, NULL, 0, tag, &ex->hdr_out);
  if (st != REFIT_OK) {
    refit_lengths_drop(c, ex);
    return st;
  }
  if (c->tail != NULL)
    c->tail->next = ex;
  else
    c->head = ex;
  c->tail = ex;
  refit_lengths_advance(c);
  if (ex->st != REFIT_OK) {
    st = REFIT_ERR(ex->st, "%s", ex->why);
    refit_lengths_drop(c, ex);
    return st;
  }
  *out = ex;
  return REFIT_OK;
}

/* ex complete: the caller's lengths stored, ex freed. */
static void refit_lengths_finish(refit_exchange_t *ex) {
  for (int i = 0; i < ex->nrecvs; i++)
    if (ex->recvs[i].got != NULL)
      *ex->recvs[i].got = ex->rlen[i];
  refit_lengths_exchange_free(ex);
}

static refit_status_t refit_lengths_failed(refit_lengths_ctx_t *c, refit_exchange_t *ex) {
  const refit_status_t st = REFIT_ERR(ex->st, "%s", ex->why);
  refit_lengths_drop(c, ex);
  return st;
}

static refit_status_t refit_lengths_wait(void *ctx, refit_exchange_t *ex, double deadline,
                                         const char *phase) {
  refit_lengths_ctx_t *c = ctx;
  unsigned spins = 0;
  for (;;) {
    refit_lengths_advance(c);
    if (ex->st != REFIT_OK)
      return refit_lengths_failed(c, ex);
    if (ex->posted)
      break;
    if (MPI_Wtime() > deadline) {
      char what[256];
      snprintf(what, sizeof(what), "%s (message lengths)", phase);
      if (ex->hdr_in != NULL && c->head == ex) {
        /* Past the deadline: names the peers whose headers never came. */
        refit_status_t st = c->hdr.ops->wait(c->hdr.ctx, ex->hdr_in, deadline, what);
        ex->hdr_in = NULL;
        if (st == REFIT_OK) /* they came just now: post the body */
          continue;
        refit_lengths_fail(c, ex, st);
      } else {
        refit_lengths_fail(c, ex,
                           REFIT_ERR(REFIT_ERR_TIMEOUT,
                                     "%s: an exchange started earlier still waits for "
                                     "its message lengths at the deadline",
                                     what));
      }
      return refit_lengths_failed(c, ex);
    }
    refit_poll_nap(&spins);
  }
  if (ex->body != NULL) {
    refit_status_t st = c->inner.ops->wait(c->inner.ctx, ex->body, deadline, phase);
    ex->body = NULL; /* freed by the wrapped transport either way */
    if (st != REFIT_OK) {
      refit_lengths_fail(c, ex, st);
      return refit_lengths_failed(c, ex);
    }
  }
  if (ex->hdr_out != NULL) {
    char what[256];
    snprintf(what, sizeof(what), "%s (message lengths)", phase);
    refit_status_t st = c->hdr.ops->wait(c->hdr.ctx, ex->hdr_out, deadline, what);
    ex->hdr_out = NULL;
    if (st != REFIT_OK) {
      refit_lengths_fail(c, ex, st);
      return refit_lengths_failed(c, ex);
    }
  }
  refit_lengths_finish(ex);
  return REFIT_OK;
}

/* wait() without blocking (only where the wrapped transport has test()). */
static refit_status_t refit_lengths_test(void *ctx, refit_exchange_t *ex, int *done) {
  refit_lengths_ctx_t *c = ctx;
  *done = 0;
  refit_lengths_advance(c);
  if (ex->st != REFIT_OK) {
    *done = 1;
    return refit_lengths_failed(c, ex);
  }
  if (!ex->posted)
    return REFIT_OK;
  refit_exchange_t **part[2] = {&ex->body, &ex->hdr_out};
  const refit_transport_t *via[2] = {&c->inner, &c->hdr};
  for (int k = 0; k < 2; k++) {
    if (*part[k] == NULL)
      continue;
    int d = 0;
    refit_status_t st = via[k]->ops->test(via[k]->ctx, *part[k], &d);
    if (st != REFIT_OK) {
      *part[k] = NULL; /* freed by its failure */
      refit_lengths_fail(c, ex, st);
      *done = 1;
      return refit_lengths_failed(c, ex);
    }
    if (!d)
      return REFIT_OK;
    *part[k] = NULL;
  }
  refit_lengths_finish(ex);
  *done = 1;
  return REFIT_OK;
}

static void refit_lengths_abandon(void *ctx, refit_exchange_t *ex) {
  refit_lengths_drop(ctx, ex);
}

static int refit_lengths_healthy(void *ctx) {
  refit_lengths_ctx_t *c = ctx;
  return !c->dirty && c->hdr.ops->healthy(c->hdr.ctx) && c->inner.ops->healthy(c->inner.ctx);
}

/* Collective over the world: both transports repaired (the header one gets
 * a fresh communicator). */
static refit_status_t refit_lengths_recover(void *ctx, double deadline) {
  refit_lengths_ctx_t *c = ctx;
  refit_status_t st = c->hdr.ops->recover(c->hdr.ctx, deadline);
  refit_status_t st_inner = c->inner.ops->recover(c->inner.ctx, deadline);
  if (st != REFIT_OK)
    return st;
  REFIT_CHECK(st_inner);
  c->dirty = 0;
  return REFIT_OK;
}

static refit_status_t refit_lengths_register(void *ctx, void *ptr, size_t bytes) {
  refit_lengths_ctx_t *c = ctx;
  return c->inner.ops->register_buffer(c->inner.ctx, ptr, bytes);
}

/* The wrapper is made by refit_transport_lengths_wrap(), never chosen. */
static refit_status_t refit_lengths_query(const refit_transport_args_t *args) {
  (void)args;
  return REFIT_ERR(REFIT_ERR_STATE, "message lengths: a wrapper, not chosen by query");
}

static refit_status_t refit_lengths_create(const refit_transport_args_t *args, void **ctx) {
  (void)args;
  (void)ctx;
  return REFIT_ERR(REFIT_ERR_STATE,
                   "message lengths: made by refit_transport_lengths_wrap, not create");
}

static void refit_lengths_destroy(void *ctx) {
  refit_lengths_ctx_t *c = ctx;
  if (c == NULL)
    return;
  while (c->head != NULL) /* never waited for: the caller's failure */
    refit_lengths_drop(c, c->head);
  refit_transport_close(&c->inner);
  refit_transport_close(&c->hdr);
  while (c->kept != NULL) {
    refit_exchange_t *next = c->kept->next;
    refit_lengths_exchange_free(c->kept);
    c->kept = next;
  }
  free(c->group_of);
  free(c);
}

refit_status_t refit_transport_lengths_wrap(refit_transport_t *t,
                                            const refit_transport_args_t *args) {
  refit_lengths_ctx_t *c = calloc(1, sizeof(*c));
  if (c != NULL)
    c->group_of =
        malloc((size_t)(args->world_size ? args->world_size : 1) * sizeof(*c->group_of));
  if (c == NULL || c->group_of == NULL) {
    free(c);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "message lengths: context");
  }
  for (int r = 0; r < args->world_size; r++)
    c->group_of[r] = -1;
  c->world_size = args->world_size;
  refit_transport_args_t hargs = *args;
  hargs.memory = REFIT_MEMORY_HOST;
  refit_status_t st = refit_transport_mpi.create(&hargs, &c->hdr.ctx);
  if (st != REFIT_OK) {
    free(c->group_of);
    free(c);
    return st;
  }
  c->hdr.ops = &refit_transport_mpi;
  c->inner = *t;
  snprintf(c->name, sizeof(c->name), "%s+lengths", t->ops->name);
  c->ops = (refit_transport_ops_t){
      .name = c->name,
      .kind = t->ops->kind,
      .memory = t->ops->memory,
      .variable_length = 1,
      .registers_buffers = t->ops->registers_buffers,
      .query = refit_lengths_query,
      .create = refit_lengths_create,
      .can_connect = refit_transport_never_per_pair,
      .create_pairs = refit_transport_not_per_pair,
      .start = refit_lengths_start,
      .wait = refit_lengths_wait,
      .test = refit_lengths_test,
      .abandon = refit_lengths_abandon,
      .destroy = refit_lengths_destroy,
      .register_buffer = refit_lengths_register,
      .healthy = refit_lengths_healthy,
      .recover = refit_lengths_recover,
  };
  t->ops = &c->ops;
  t->ctx = c;
  return refit_transport_check_table(t->ops);
}
