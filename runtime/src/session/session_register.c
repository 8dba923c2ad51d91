/*
 * Registration of the caller's tensors (trainer shards, generator runtime
 * storage), every problem of a tensor in one message; the first begin's
 * reduction of the engines' precisions (precision.h) and the re-plan it may
 * need; and binding memory at the first begin.
 */
#include "session/session.h"
#include "session/path.h"
#include "session/zero_copy.h"

#include "session/precision.h"

#include "core/log.h"
#include "reshard/family.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Append one problem to a registration's list ("; "-separated). */
static void refit_register_problem(char *buf, size_t len, size_t *used, int *n,
                                   const char *fmt, ...) REFIT_PRINTF(5, 6);
static void refit_register_problem(char *buf, size_t len, size_t *used, int *n,
                                   const char *fmt, ...) {
  va_list ap;
  if (*used < len)
    *used += (size_t)snprintf(buf + *used, len - *used, "%s", *n ? "; " : "");
  va_start(ap, fmt);
  if (*used < len)
    *used += (size_t)vsnprintf(buf + *used, len - *used, fmt, ap);
  va_end(ap);
  (*n)++;
}

/* "[a, b]" of a registration's shape, or of an expected one. */
static void refit_shape_str(int ndim, const int64_t *shape, char *buf, size_t len) {
  size_t used = (size_t)snprintf(buf, len, "[");
  for (int d = 0; d < ndim && used < len; d++)
    used += (size_t)snprintf(buf + used, len - used, "%s%lld", d ? ", " : "",
                             (long long)shape[d]);
  if (used < len)
    snprintf(buf + used, len - used, "]");
}

/* Does a registration's shape match? ndim 0 gives none (bytes decide); a
 * tensor of one row may come as [n] or [1, n], and one of one column (a
 * bias, reshard/catalog.h) as [n] or [n, 1]. */
static int refit_shape_matches(const refit_tensor_t *t, int ndim, const int64_t *shape) {
  if (t->ndim == 0)
    return 1;
  if (t->ndim == ndim && memcmp(t->shape, shape, (size_t)ndim * sizeof(int64_t)) == 0)
    return 1;
  return (ndim == 2 && shape[0] == 1 && t->ndim == 1 && t->shape[0] == shape[1]) ||
         (ndim == 2 && shape[1] == 1 && t->ndim == 1 && t->shape[0] == shape[0]);
}

void refit_session_src_form(const refit_src_tensor_t *t, int *ndim, int64_t shape[3],
                            refit_dtype_t *dtype, size_t *bytes) {
  int64_t rows, cols;
  refit_src_shard_shape(t, &rows, &cols);
  *bytes = (size_t)(rows * cols) * 2;
  shape[0] = rows;
  shape[1] = cols;
  shape[2] = 0;
  *ndim = 2;
  *dtype = REFIT_DTYPE_BF16;
  if (refit_src_is_f32(t)) {
    *ndim = 1;
    shape[0] = rows * cols / 2;
    shape[1] = 0;
    *dtype = REFIT_DTYPE_F32;
  }
}

/* vLLM spells the expert stacks "mlp.experts.w13_weight" or, in newer
 * versions, "mlp.experts.routed_experts.w13_weight": the engine registers
 * its own spelling, which becomes the store's name. */
int refit_store_name_matches(const char *store, const char *name) {
  static const char nested[] = ".mlp.experts.routed_experts.";
  const char *at = strstr(name, nested);
  if (strcmp(store, name) == 0)
    return 1;
  if (at == NULL)
    return 0;
  const size_t head = (size_t)(at - name) + strlen(".mlp.experts.");
  return strncmp(store, name, head) == 0 &&
         strcmp(store + head, at + strlen(nested)) == 0;
}

/* A generator registration before the first begin, kept with its form. */
struct refit_registration {
  refit_tensor_t t;
  char name[REFIT_NAME_MAX + 16];
  int form;    /* REFIT_FORM_* */
  int64_t gen; /* catalog generator tensor */
};

static refit_status_t refit_session_keep_registration(refit_session_t *s,
                                                      const refit_tensor_t *t, int form,
                                                      int64_t gen) {
  for (int64_t i = 0; i < s->nregs; i++)
    if (s->regs[i].form != REFIT_FORM_PLANNED && strcmp(s->regs[i].name, t->name) == 0)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "register: tensor '%s' registered twice on generator rank %d",
                       t->name, s->role_rank);
  if (strlen(t->name) >= sizeof(s->regs[0].name))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "register: generator rank %d holds no tensor '%s' (an unexpected "
                     "tensor)",
                     s->role_rank, t->name);
  if (s->nregs == s->regs_cap) {
    const int64_t cap = s->regs_cap ? 2 * s->regs_cap : 64;
    struct refit_registration *r = realloc(s->regs, (size_t)cap * sizeof(*r));
    if (r == NULL)
      return REFIT_ERR(REFIT_ERR_NO_MEMORY, "registrations");
    s->regs = r;
    s->regs_cap = cap;
  }
  struct refit_registration *r = &s->regs[s->nregs++];
  r->t = *t;
  snprintf(r->name, sizeof(r->name), "%s", t->name);
  r->t.name = NULL; /* r->name, set when replayed (regs may move) */
  r->form = form;
  r->gen = gen;
  return REFIT_OK;
}

refit_status_t refit_session_register(refit_session_t *s, const refit_tensor_t *t) {
  const char *side = s->is_trainer ? "trainer" : "generator";
  const char *name = t->name;
  char problems[1024] = "", want[64], got[64];
  size_t used = 0;
  int n = 0;

  if (s->bound && !s->is_trainer && !s->forgotten)
    return REFIT_ERR(REFIT_ERR_STATE,
                     "register %s: generator runtime storage never moves (CUDA "
                     "graphs captured its addresses); register it before the "
                     "first refit_begin",
                     name);
  if (s->bound && s->state != REFIT_STATE_IDLE && s->state != REFIT_STATE_POISONED)
    return REFIT_ERR(REFIT_ERR_STATE,
                     "register %s: trainer rank %d is in a refit (%s); move a "
                     "tensor only between refit_commit and the next refit_begin",
                     name, s->role_rank, refit_state_str(s->state));
  int ndim;
  int64_t shape[3] = {0, 0, 0};
  size_t bytes;
  refit_dtype_t dtype;
  int64_t index = -1;
  if (s->is_trainer) {
    index = refit_catalog_find_src(s->cat, name, s->role_rank);
    const char *skip =
        index < 0 ? refit_family_skipped(&s->cfg.model, &s->cfg.trainer, name) : NULL;
    if (skip != NULL) { /* held, but no refit target: taken and not kept */
      REFIT_TRACE("register: trainer rank %d: '%s' skipped: %s", s->role_rank, name,
                  skip);
      return REFIT_OK;
    }
    if (index < 0)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "register: trainer rank %d holds no tensor '%s' (an "
                       "unexpected tensor; refit_tensor_get lists what this "
                       "rank holds under trainer.layout %s)",
                       s->role_rank, name,
                       s->cfg.trainer.names == REFIT_TRAINER_NAMES_MEGATRON ? "megatron"
                                                                            : "hf");
    refit_session_src_form(&s->cat->src[index], &ndim, shape, &dtype, &bytes);
    if (s->shards[index] != NULL && !s->bound)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "register: tensor '%s' registered twice on trainer rank %d", name,
                       s->role_rank);
  } else {
    for (int64_t i = 0; i < s->nstores && index < 0; i++)
      if (refit_store_name_matches(s->stores[i].name, name))
        index = i;
    /* The other precision's form of a runtime tensor: the engine decides
     * (precision.h); checked against the stores it makes at the first begin. */
    const refit_store_t *found = index >= 0 ? &s->stores[index] : NULL;
    if (!s->replaying && !s->precision_settled &&
        (found == NULL || (int)t->dtype != (int)found->dtype)) {
      int64_t gen = -1;
      const int form =
          refit_precision_form(&s->cfg, s->cat, s->stores, s->nstores, found, t, &gen);
      if (form != 0)
        return refit_session_keep_registration(s, t, form, gen);
    }
    if (index < 0)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "register: generator rank %d holds no tensor '%s' (an "
                       "unexpected tensor)",
                       s->role_rank, name);
    const refit_store_t *st = &s->stores[index];
    if (st->data != NULL)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "register: tensor '%s' registered twice on generator rank %d",
                       name, s->role_rank);
    ndim = st->ndim;
    memcpy(shape, st->shape, sizeof(shape));
    bytes = st->bytes;
    dtype = st->dtype;
  }
  /* Every problem of this tensor at once. */
  refit_shape_str(ndim, shape, want, sizeof(want));
  refit_shape_str(t->ndim, t->shape, got, sizeof(got));
  if (!refit_shape_matches(t, ndim, shape))
    refit_register_problem(problems, sizeof(problems), &used, &n,
                           "shape: expected %s, got %s", want, got);
  if ((int)t->dtype != (int)dtype)
    refit_register_problem(
        problems, sizeof(problems), &used, &n, "dtype: expected %s, got %s%s",
        refit_dtype_name(dtype), refit_dtype_name((refit_dtype_t)t->dtype),
        s->is_trainer || dtype != REFIT_DTYPE_BF16 ? ""
        : s->cat->gen[s->stores[index].gen].kind == REFIT_GEN_PLAIN
            ? " (vLLM keeps this tensor in bf16: it has no quantization method)"
            : " (refit.precision bf16, or refit.quantization_ignore, keeps it in "
              "bf16)");
  if (t->bytes != bytes)
    refit_register_problem(problems, sizeof(problems), &used, &n,
                           "bytes: expected %zu, got %zu", bytes, t->bytes);
  if (!refit_mem_usable(s->mem, t->data))
    refit_register_problem(problems, sizeof(problems), &used, &n,
                           "device: the rank runs on %s, this memory is not there "
                           "(register %s)",
                           refit_mem_on_device(s->mem) ? "its GPU" : "the host",
                           refit_mem_on_device(s->mem) ? "cudaMalloc'd memory of that GPU"
                                                       : "host memory");
  if (n > 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "register: %s rank %d tensor '%s': %s",
                     side, s->role_rank, name, problems);
  if (!s->is_trainer) {
    refit_store_t *st = &s->stores[index];
    if (!s->replaying && !s->bound)
      REFIT_CHECK(refit_session_keep_registration(s, t, REFIT_FORM_PLANNED, st->gen));
    if (strcmp(st->name, name) != 0)
      snprintf(st->name, sizeof(st->name), "%s", name);
    st->data = t->data;
    s->nregistered++;
    return REFIT_OK;
  }
  if (s->bound) {
    /* Between refits: a new address for a tensor the caller owns. */
    if (s->shard_owned[index])
      return REFIT_ERR(REFIT_ERR_STATE,
                       "register %s: trainer rank %d allocated this tensor itself "
                       "(nothing was registered before the first refit_begin); "
                       "register every tensor before it to own them",
                       name, s->role_rank);
    if (s->shards[index] != t->data) {
      s->shards[index] = t->data;
      s->moved = 1;
    }
    return REFIT_OK;
  }
  s->shards[index] = t->data;
  s->nregistered++;
  return REFIT_OK;
}

/* The engine's forms changed which tensors are MXFP8: plan again, open the
 * transport for the new pairs, make the generator's stores again and check
 * every registration against them (collective, first begin). */
static refit_status_t refit_session_replan(refit_session_t *s) {
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++) {
    refit_mem_free(s->mem, s->buffer[i]);
    s->buffer[i] = NULL;
  }
  free(s->xfers);
  free(s->my_begin);
  free(s->my_msgs);
  s->xfers = NULL;
  s->my_begin = NULL;
  s->my_msgs = NULL;
  refit_plan_destroy(s->plan);
  s->plan = NULL;
  s->zc_merged = 0;
  REFIT_CHECK(refit_session_make_plan(s, REFIT_OK));
  REFIT_CHECK(refit_zc_decide(s));
  REFIT_CHECK(refit_zc_merge(s));
  refit_session_choose_path(s);
  refit_transport_close(&s->transport);
  REFIT_CHECK(refit_session_open_transport(s));
  refit_status_t st = REFIT_OK;
  if (!s->is_trainer) {
    refit_loader_destroy(s->loader);
    s->loader = NULL;
    s->stores = NULL;
    s->nstores = 0;
    st = refit_session_make_loader(s);
    if (st == REFIT_OK) {
      s->nregistered = 0;
      s->replaying = 1;
      for (int64_t i = 0; i < s->nregs && st == REFIT_OK; i++) {
        refit_tensor_t t = s->regs[i].t;
        t.name = s->regs[i].name;
        st = refit_session_register(s, &t);
      }
      s->replaying = 0;
    }
  }
  REFIT_CHECK(refit_session_agree(s, st, "checking the engine's registrations"));
  REFIT_CHECK(
      refit_session_agree(s, refit_session_alloc_buffers(s), "allocating memory"));
  return refit_session_register_staging(s, REFIT_OK);
}

/* First begin, before anything is bound: every rank's registration forms
 * decide which runtime tensors are MXFP8 (precision.h; collective). */
refit_status_t refit_session_settle_precision(refit_session_t *s) {
  const int64_t n = s->cat->gen_begin[s->cat->generator.tp];
  unsigned char *mine = s->form_votes, *all = s->form_votes + n + 1;
  memset(mine, 0, (size_t)(2 * n + 2));
  for (int64_t i = 0; i < s->nregs; i++)
    mine[s->regs[i].gen] |= (unsigned char)s->regs[i].form;
  /* Every rank's first begin, named: a rank that does not come is named here
   * (the reduction below could say only that not every rank joined). On the
   * heap: a late rank may still write it. */
  int *here = malloc((size_t)(s->size + 1) * sizeof(int));
  if (here == NULL) {
    s->broken = 1; /* the peers wait for this rank in vain */
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "first begin: %d ranks", s->size);
  }
  here[0] = 1;
  void *blocks[] = {here};
  REFIT_CHECK(
      refit_session_gather(s, &here[0], &here[1], (int)sizeof(int), REFIT_CTRL_TAG_FIRST,
                           MPI_Wtime() + s->startup_timeout_s, "first begin", blocks, 1));
  free(here);
  MPI_Request req;
  REFIT_CHECK(refit_session_startup_wait(
      s, &req,
      MPI_Iallreduce(mine, all, (int)n, MPI_UNSIGNED_CHAR, MPI_BOR, s->world, &req),
      "first begin: the engines' registered precisions"));
  int64_t to_bf16 = 0, to_mxfp8 = 0;
  REFIT_CHECK(refit_precision_decide(&s->cfg, s->cat, all, &to_bf16, &to_mxfp8));
  if (to_bf16 == 0 && to_mxfp8 == 0)
    return REFIT_OK;
  if (s->rank == 0)
    REFIT_INFO(
        "the engine registers %lld runtime tensor%s in bfloat16 and %lld in MXFP8 "
        "where the config said otherwise; refit follows the engine and plans again",
        (long long)to_bf16, to_bf16 == 1 ? "" : "s", (long long)to_mxfp8);
  return refit_session_replan(s);
}

/* First refit: every tensor either registered by the caller or, when the
 * caller registered none, allocated here. A partial registration is an
 * error listing what is missing. */
/* Every tensor of the rank registered, or none (allowed only where refit
 * may allocate them): otherwise an error listing what is missing. */
static refit_status_t refit_session_check_registered(refit_session_t *s) {
  char missing[1024] = "";
  size_t used = 0;
  int64_t nmissing = 0;
  /* Caller-owned weights must be the caller's: refit allocating them would
   * send zeros. */
  const int caller = s->is_trainer && s->cfg.source.kind == REFIT_SOURCE_CALLER;
  if (s->nregistered == 0 && !caller && !s->forgotten)
    return REFIT_OK;
  if (s->is_trainer) {
    for (int64_t i = 0; i < s->cat->nsrc; i++)
      if (s->shard_part[i] >= 0 && s->shards[i] == NULL && nmissing++ < 8 &&
          used < sizeof(missing))
        used += (size_t)snprintf(missing + used, sizeof(missing) - used, "%s%s",
                                 used ? ", " : "", s->cat->src[i].name);
  } else {
    for (int64_t i = 0; i < s->nstores; i++)
      if (s->stores[i].data == NULL && nmissing++ < 8 && used < sizeof(missing))
        used += (size_t)snprintf(missing + used, sizeof(missing) - used, "%s%s",
                                 used ? ", " : "", s->stores[i].name);
  }
  if (nmissing > 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s rank %d: %lld tensor%s not registered%s: %s%s",
                     s->is_trainer ? "trainer" : "generator", s->role_rank,
                     (long long)nmissing, nmissing == 1 ? "" : "s",
                     s->forgotten ? " (their owner went away: register every "
                                    "tensor again before the next refit)"
                     : caller     ? " (source.kind caller: the trainer registers "
                                    "every tensor it holds)"
                                  : "",
                     missing, nmissing > 8 ? ", ..." : "");
  return REFIT_OK;
}

refit_status_t refit_session_bind(refit_session_t *s) {
  REFIT_CHECK(refit_session_check_registered(s));
  if (s->is_trainer) {
    /* The shards nobody registered, in one allocation (one IPC mapping for
     * a zero-copy generator instead of one per tensor). */
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
      size_t at = 0;
      for (int64_t i = 0; i < s->cat->nsrc; i++) {
        if (s->shard_part[i] < 0 || (s->shards[i] != NULL && !s->shard_owned[i]))
          continue;
        int64_t rows, cols;
        refit_src_shard_shape(&s->cat->src[i], &rows, &cols);
        if (pass == 1) {
          s->shards[i] = (uint16_t *)((unsigned char *)s->shard_slab + at);
          s->shard_owned[i] = 1;
        }
        at += ((size_t)(rows * cols) * sizeof(uint16_t) + 255) & ~(size_t)255;
      }
      total = at;
      if (pass == 0 && total > 0)
        /* Generators read it in place under zero copy: shareable memory. */
        REFIT_CHECK(s->zero_copy ? refit_mem_alloc_shared(s->mem, total, &s->shard_slab)
                                 : refit_mem_alloc(s->mem, total, &s->shard_slab));
      if (total == 0)
        break;
    }
    REFIT_CHECK(s->path->trainer_tables(s));
  } else {
    REFIT_CHECK(refit_loader_allocate(s->loader));
  }
  s->bound = 1;
  return REFIT_OK;
}

refit_status_t refit_session_forget(refit_session_t *s) {
  if (s->state != REFIT_STATE_IDLE && s->state != REFIT_STATE_POISONED)
    return REFIT_ERR(REFIT_ERR_STATE,
                     "forget: %s rank %d is in a refit (%s); abort or commit it first",
                     s->is_trainer ? "trainer" : "generator", s->role_rank,
                     refit_state_str(s->state));
  if (s->nregistered == 0)
    return REFIT_OK; /* refit owns every tensor: nothing of the caller's */
  if (s->is_trainer) {
    for (int64_t i = 0; i < s->cat->nsrc; i++)
      if (!s->shard_owned[i])
        s->shards[i] = NULL;
  } else {
    for (int64_t i = 0; i < s->nstores; i++)
      s->stores[i].data = NULL;
    /* Runtime storage is whatever its next owner loaded: no version is
     * served until a full refit (a POISONED rank makes the next one full). */
    s->state = REFIT_STATE_POISONED;
  }
  s->forgotten = 1;
  return REFIT_OK;
}

refit_status_t refit_session_rebind(refit_session_t *s) {
  REFIT_CHECK(refit_session_check_registered(s));
  if (!s->is_trainer) {
    const int async = s->cfg.refit.mode == REFIT_MODE_ASYNC;
    for (int64_t i = 0; i < s->nstores; i++)
      if (!async)
        s->stores[i].target = s->stores[i].data;
    /* The land tables hold the targets: built again over the new ones (zero
     * copy's direct tables at the next exchange). */
    if (!s->staging_released && !s->loader->direct) {
      refit_loader_release(s->loader);
      REFIT_CHECK(refit_loader_acquire(s->loader));
    }
    s->zc_ready = 0;
    s->rebound = 1; /* tells every rank at the header exchange */
  }
  s->forgotten = 0;
  return REFIT_OK;
}
