/*
 * The public API (refit/refit.h) over the internal session: argument checks,
 * handle conversions, and nothing else.
 */
#include "refit/refit.h"

#include "source/checkpoint.h"
#include "core/error.h"
#include "core/hash.h"
#include "session/delta_wire.h"
#include "session/dump.h"
#include "reshard/family.h"
#include "session/session.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REFIT_API_HANDLE(s)                                                    \
  do {                                                                         \
    if ((s) == NULL)                                                           \
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "%s: NULL session", __func__); \
  } while (0)

refit_status_t refit_session_open(MPI_Comm comm, const char *config_path,
                                  refit_session_h *out) {
  if (config_path == NULL || out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_session_open: NULL config path or output");
  return refit_session_create(comm, config_path, out);
}

void refit_session_close(refit_session_h s) { refit_session_destroy(s); }

refit_side_t refit_session_side(refit_session_h s) {
  return s->is_trainer ? REFIT_SIDE_TRAINER : REFIT_SIDE_GENERATOR;
}

int refit_session_device(refit_session_h s) {
  return s == NULL ? -1 : refit_mem_device_ordinal(s->mem);
}

int64_t refit_tensor_count(refit_session_h s) {
  return s->is_trainer ? s->nshards : s->nstores;
}

static refit_status_t refit_api_tensor(refit_session_h s, int64_t index,
                                       refit_tensor_t *out) {
  memset(out, 0, sizeof(*out));
  if (!s->is_trainer) {
    const refit_store_t *st = &s->stores[index];
    out->name = st->name;
    out->data = st->data;
    out->bytes = st->bytes;
    out->ndim = st->ndim;
    memcpy(out->shape, st->shape, sizeof(out->shape));
    out->dtype = (refit_tensor_dtype_t)st->dtype;
    return REFIT_OK;
  }
  const int64_t i = s->held[index];
  const refit_src_tensor_t *t = &s->cat->src[i];
  refit_dtype_t dtype;
  out->name = t->name;
  out->data = s->shards[i];
  refit_session_src_form(t, &out->ndim, out->shape, &dtype, &out->bytes);
  out->dtype = (refit_tensor_dtype_t)dtype;
  return REFIT_OK;
}

/* Tensor `index` of this rank, for the API function `fn`; NULL `out`
 * is an error like an index out of range. */
static refit_status_t refit_api_tensor_at(refit_session_h s, int64_t index,
                                          refit_tensor_t *out, const char *fn) {
  if (out == NULL || index < 0 || index >= refit_tensor_count(s))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "%s: index %lld out of range 0..%lld",
                     fn, (long long)index, (long long)refit_tensor_count(s) - 1);
  return refit_api_tensor(s, index, out);
}

/* Functions that read a tensor's bytes need its memory, which the first
 * refit_begin attaches unless the caller registered it. */
static refit_status_t refit_api_attached(refit_session_h s, const refit_tensor_t *t,
                                         const char *fn) {
  if (t->data != NULL)
    return REFIT_OK;
  return REFIT_ERR(REFIT_ERR_STATE,
                   "%s: %s rank %d: tensor '%s' has no memory yet (registered or "
                   "allocated at the first refit_begin)",
                   fn, s->is_trainer ? "trainer" : "generator", s->role_rank, t->name);
}

refit_status_t refit_tensor_get(refit_session_h s, int64_t index,
                                refit_tensor_t *out) {
  REFIT_API_HANDLE(s);
  return refit_api_tensor_at(s, index, out, __func__);
}

refit_status_t refit_tensor_find(refit_session_h s, const char *name,
                                 refit_tensor_t *out) {
  REFIT_API_HANDLE(s);
  if (s->is_trainer) { /* by the catalog's name index: jobs hold 10^4+ */
    const int64_t i = refit_catalog_find_src(s->cat, name, s->role_rank);
    if (i >= 0)
      return refit_api_tensor(s, s->held_at[i], out);
  }
  const int64_t n = s->is_trainer ? 0 : refit_tensor_count(s);
  for (int64_t i = 0; i < n; i++) {
    REFIT_CHECK(refit_api_tensor(s, i, out));
    if (s->is_trainer ? strcmp(out->name, name) == 0
                      : refit_store_name_matches(out->name, name))
      return REFIT_OK;
  }
  return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "%s rank %d holds no tensor '%s'",
                   s->is_trainer ? "trainer" : "generator", s->role_rank, name);
}

const char *refit_tensor_skipped(refit_session_h s, const char *name) {
  if (s == NULL || name == NULL || !s->is_trainer ||
      refit_catalog_find_src(s->cat, name, s->role_rank) >= 0)
    return NULL;
  return refit_family_skipped(&s->cfg.model, &s->cfg.trainer, name);
}

refit_status_t refit_tensor_register(refit_session_h s, const refit_tensor_t *t) {
  REFIT_API_HANDLE(s);
  if (t == NULL || t->name == NULL || t->data == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_tensor_register: NULL tensor, name or data");
  return refit_session_register(s, t);
}

refit_status_t refit_tensor_forget_all(refit_session_h s) {
  REFIT_API_HANDLE(s);
  return refit_session_forget(s);
}

refit_status_t refit_begin(refit_session_h s, uint64_t version, void *stream) {
  REFIT_API_HANDLE(s);
  return refit_session_begin(s, version, stream);
}

refit_status_t refit_progress(refit_session_h s, int *done) {
  REFIT_API_HANDLE(s);
  if (done == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "refit_progress: NULL done");
  return refit_session_progress(s, done);
}

refit_status_t refit_commit(refit_session_h s, void *stream) {
  REFIT_API_HANDLE(s);
  return refit_session_commit(s, stream);
}

refit_status_t refit_abort(refit_session_h s) {
  REFIT_API_HANDLE(s);
  return refit_session_abort(s);
}

refit_state_t refit_state(refit_session_h s) { return s->state; }

const char *refit_state_str(refit_state_t state) {
  static const char *const texts[] = {
#define REFIT_STATE_TEXT_(name, text) text,
      REFIT_STATE_MAP(REFIT_STATE_TEXT_)
#undef REFIT_STATE_TEXT_
  };
  if ((unsigned)state >= sizeof(texts) / sizeof(texts[0]))
    return "unknown state";
  return texts[state];
}

uint64_t refit_committed_version(refit_session_h s) { return s->committed; }

refit_status_t refit_last_times(refit_session_h s, refit_times_t *out) {
  REFIT_API_HANDLE(s);
  out->source = s->times.source;
  out->pack = s->times.pack;
  out->transfer = s->times.transfer;
  out->land = s->times.unpack;
  out->commit = s->times.commit;
  out->total = s->times.total;
  return REFIT_OK;
}

refit_status_t refit_last_wire_stats(refit_session_h s, refit_wire_stats_t *out) {
  REFIT_API_HANDLE(s);
  if (out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "refit_last_wire_stats: NULL out");
  memset(out, 0, sizeof(*out));
  if (s->dw != NULL) {
    out->delta = s->dw->this_refit;
    out->wire_bytes = s->dw->wire_bytes;
    out->full_bytes = s->dw->full_bytes;
    out->framed_msgs = s->dw->framed_msgs;
    if (!s->is_trainer && s->loader != NULL) {
      out->changed_bytes = s->loader->changed_bytes;
      out->written_bytes = s->loader->written_bytes;
      out->in_place = s->loader->in_place;
    }
  }
  return REFIT_OK;
}

refit_status_t refit_session_settings(refit_session_h s, refit_settings_t *out) {
  REFIT_API_HANDLE(s);
  if (out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "refit_session_settings: NULL out");
  const refit_config_t *c = &s->cfg;
  out->steps = c->refit.steps;
  out->async = c->refit.mode == REFIT_MODE_ASYNC;
  out->mxfp8 = c->refit.precision == REFIT_PRECISION_MXFP8;
  out->restore_full = c->refit.restore == REFIT_RESTORE_FULL;
  out->verify = c->verify != 0;
  out->timeout_s = c->refit.timeout_s;
  out->delta = (int)c->refit.delta;
  out->dump = c->dump;
  return REFIT_OK;
}

refit_status_t refit_session_plan_summary(refit_session_h s, refit_plan_summary_t *out) {
  REFIT_API_HANDLE(s);
  if (out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "refit_session_plan_summary: NULL out");
  refit_plan_stats_t st;
  refit_plan_stats(s->plan, 0, &st);
  memset(out, 0, sizeof(*out));
  out->buckets = s->plan->nbuckets;
  out->messages = s->plan->nmsgs;
  out->bytes = st.total_bytes;
  if (!s->is_trainer) {
    /* What was allocated: under zero copy, the trainers' digests only. */
    out->staging_bytes = REFIT_EXCHANGES_IN_FLIGHT * (int64_t)s->buffer_bytes;
    out->arena_bytes = s->loader != NULL ? s->loader->arena_bytes : 0;
  }
  return REFIT_OK;
}

int refit_session_engine(refit_session_h s) { return s == NULL ? -1 : s->engine; }

int refit_session_tp_rank(refit_session_h s) { return s == NULL ? -1 : s->tp_rank; }

int refit_session_broken(refit_session_h s) { return s != NULL && s->broken; }

refit_status_t refit_tensor_touch(refit_session_h s, int64_t index, size_t bytes,
                                  uint64_t *value) {
  REFIT_API_HANDLE(s);
  refit_tensor_t t;
  if (value == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "refit_tensor_touch: NULL value");
  REFIT_CHECK(refit_api_tensor_at(s, index, &t, __func__));
  REFIT_CHECK(refit_api_attached(s, &t, __func__));
  if (bytes > t.bytes)
    bytes = t.bytes;
  if (refit_mem_on_device(s->mem)) {
    /* The memory layer's compare of the bytes with themselves: a kernel
     * that reads them all, on refit's stream. */
    int64_t diff = 0, first = 0;
    REFIT_CHECK(refit_mem_compare(s->mem, t.data, t.data, bytes, 1, &diff, &first));
    *value = (uint64_t)diff + 1;
    return REFIT_OK;
  }
  uint64_t acc = 0;
  const unsigned char *p = t.data;
  for (size_t k = 0; k < bytes; k += 64)
    acc += p[k];
  *value = acc;
  return REFIT_OK;
}

refit_status_t refit_tensor_digest(refit_session_h s, uint64_t *out) {
  REFIT_API_HANDLE(s);
  if (out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "refit_tensor_digest: NULL out");
  if (refit_mem_on_device(s->mem))
    return REFIT_ERR(REFIT_ERR_NOT_AVAILABLE,
                     "refit_tensor_digest: rank %d holds its tensors in GPU memory; "
                     "the digest reads host memory only",
                     s->rank);
  uint64_t h = REFIT_HASH_INIT;
  for (int64_t i = 0; i < refit_tensor_count(s); i++) {
    refit_tensor_t t;
    REFIT_CHECK(refit_api_tensor(s, i, &t));
    REFIT_CHECK(refit_api_attached(s, &t, __func__));
    h = refit_hash_bytes(h, t.data, t.bytes);
  }
  *out = h;
  return REFIT_OK;
}

refit_status_t refit_dump(refit_session_h s, const char *path) {
  REFIT_API_HANDLE(s);
  if (path == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "refit_dump: NULL path");
  return refit_dump_write(s, path);
}

refit_status_t refit_verify(refit_session_h s, uint64_t version,
                            int64_t *mismatches) {
  REFIT_API_HANDLE(s);
  return refit_session_verify(s, version, mismatches);
}

void refit_session_describe(refit_session_h s, char *buf, size_t len) {
  const refit_config_t *c = &s->cfg;
  refit_plan_stats_t st;
  refit_plan_stats(s->plan, 0, &st);
  char quantized[256] = "";
  if (s->plan->options.wire == REFIT_WIRE_MXFP8)
    snprintf(quantized, sizeof(quantized), "(prequantized on the trainer)");
  if (s->plan->options.wire == REFIT_WIRE_FP8_BLOCK) {
    /* Not silent: the tensors whose trainer pieces split a block travel
     * BF16 (reshard/plan.h). */
    int64_t n = 0, on_trainer = 0;
    for (int64_t i = 0; i < s->cat->gen_begin[s->cat->generator.tp]; i++) {
      n += s->cat->gen[i].quantized == REFIT_QUANT_FP8_BLOCK;
      on_trainer += refit_plan_block_prequantized(s->plan, i);
    }
    snprintf(quantized, sizeof(quantized),
             "(prequantized on the trainer: %lld of %lld block FP8 tensors over all "
             "tp ranks%s)",
             (long long)on_trainer, (long long)n,
             on_trainer < n ? "; the others split a 128 x 128 block between trainer "
                              "shards and travel BF16"
                            : "");
  }
  const char *precision = "bf16";
  if (c->refit.precision == REFIT_PRECISION_MXFP8)
    precision = "mxfp8";
  else if (c->refit.precision == REFIT_PRECISION_FP8_BLOCK)
    precision = c->refit.fp8_scale == REFIT_FP8_SCALE_MODE_POW2 ? "fp8_block (pow2)"
                                                                : "fp8_block";
  else if (c->refit.precision == REFIT_PRECISION_NVFP4)
    precision = "nvfp4";
  const char *delta = c->refit.delta == REFIT_DELTA_MODE_ON     ? ", delta on"
                      : c->refit.delta == REFIT_DELTA_MODE_AUTO ? ", delta auto"
                                                                : "";
  snprintf(buf, len,
           "%s, %d ranks = %d trainer (tp %d, pp %d, dp %d, ep %d, etp %d) + %d "
           "generator (%d engine%s x tp %d, ep %d); %s %s, mode %s, restore %s, "
           "digests %s%s\n"
           "plan: %lld trainer tensors -> %lld runtime tensors per tp rank, %d "
           "buckets, %lld messages, %.2f MiB per refit, egress max/mean %.3f, "
           "staging max %.2f MiB, hash %016llx, transport %s%s",
           refit_family_desc(c->model.family)->name, s->size, s->ntrainer, c->trainer.tp,
           c->trainer.pp, c->trainer.dp, c->trainer.ep, c->trainer.etp, s->ngenerator,
           c->generator.engines, c->generator.engines == 1 ? "" : "s", c->generator.tp,
           c->generator.ep, precision, quantized,
           c->refit.mode == REFIT_MODE_ASYNC ? "async" : "sync",
           c->refit.restore == REFIT_RESTORE_FULL ? "full" : "none",
           c->refit.digests ? "on" : "off", delta, (long long)s->cat->nsrc,
           (long long)(s->cat->gen_begin[1] - s->cat->gen_begin[0]), s->plan->nbuckets,
           (long long)s->plan->nmsgs, (double)st.total_bytes / 1048576.0,
           st.egress_mean > 0 ? st.egress_max / st.egress_mean : 0.0,
           (double)st.staging_max / 1048576.0, (unsigned long long)s->plan->hash,
           s->transport.ops->name,
           s->zero_copy ? ", zero copy (generators read the trainers' tensors in place; "
                          "staging holds digests only)"
                        : "");
}

struct refit_config_file {
  refit_config_t cfg;
};

refit_status_t refit_config_open(const char *path, refit_config_h *out) {
  if (path == NULL || out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "refit_config_open: NULL path or out");
  refit_config_h c = malloc(sizeof(*c));
  if (c == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_config_open: %s", path);
  const refit_status_t st = refit_session_read_config(path, 0, &c->cfg, NULL, NULL);
  if (st != REFIT_OK) {
    free(c);
    return st;
  }
  *out = c;
  return REFIT_OK;
}

void refit_config_close(refit_config_h c) { free(c); }

refit_status_t refit_checkpoint_write(refit_config_h c, const char *path,
                                      const refit_checkpoint_options_t *opt,
                                      refit_checkpoint_info_t *info) {
  if (c == NULL || path == NULL || opt == NULL || info == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_checkpoint_write: NULL config, path, options or info");
  if ((unsigned)opt->dtype > REFIT_CHECKPOINT_F16 ||
      (unsigned)opt->format > REFIT_CHECKPOINT_SAFETENSORS)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_checkpoint_write: dtype %d or format %d out of range",
                     (int)opt->dtype, (int)opt->format);
  if (opt->shards < 1 || (opt->shards > 1 && opt->format != REFIT_CHECKPOINT_SAFETENSORS))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "refit_checkpoint_write: %d shards of %s (at least 1; several "
                     "only of safetensors)",
                     opt->shards,
                     opt->format == REFIT_CHECKPOINT_HDF5 ? "hdf5" : "safetensors");
  return refit_checkpoint_write_config(&c->cfg, path, opt, info);
}

void refit_mpi_library(char *version, size_t version_len, char *path, size_t path_len) {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = "";
  int n = 0;
  if (MPI_Get_library_version(text, &n) != MPI_SUCCESS)
    snprintf(text, sizeof text, "(MPI_Get_library_version failed)");
  /* MPICH ends its text with a newline: dropped, as trailing blanks, so that
   * callers compare the texts alone. */
  for (size_t end = strlen(text);
       end > 0 && (text[end - 1] == '\n' || text[end - 1] == ' ');)
    text[--end] = '\0';
  if (version != NULL && version_len > 0)
    snprintf(version, version_len, "%s", text);
  if (path != NULL && path_len > 0) {
    /* The address this library's calls resolve to: the MPI it runs on, not
     * merely the one it was built against. */
    Dl_info info;
    const int found =
        dladdr((void *)(uintptr_t)&MPI_Init, &info) != 0 && info.dli_fname != NULL;
    snprintf(path, path_len, "%s", found ? info.dli_fname : "");
  }
}
