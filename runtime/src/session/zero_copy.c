/*
 * Zero-copy refit between ranks that share a GPU (refit.zero_copy;
 * kernels/direct.h, runtime/src/generator/loader_direct.c).
 *
 * When every (trainer, generator) pair of the plan runs on one GPU and memory
 * is device memory, a generator reads each chunk where its trainer holds it,
 * through a CUDA IPC mapping of the trainer's allocation (base of the
 * allocation plus the tensor's offset, so tensors from a caching allocator
 * work), and writes it straight to its place in the runtime layout. The
 * bucket loop, its deadlines, the vote, restore and POISONED stay as they
 * are: a bucket's message carries the trainer's 8-byte sealed digests of its
 * chunks instead of their rows (nothing is computed with refit.digests off),
 * and its arrival tells the generator that the trainer's tensors hold the
 * version. The trainer does not touch its tensors until the commit vote,
 * which every generator joins only after its reads.
 *
 * The mapping is exchanged after the first begin's header exchange (every
 * rank is known to be ready then), and again when a trainer registered a
 * tensor at a new address (the header says so).
 */
#include "session/zero_copy.h"

#include "core/digest.h"
#include "core/error.h"
#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef REFIT_HAVE_CUDA
#include "device/device.h"
#include "device/device_share.h"

#include <unistd.h>
#endif

/* The control communicator's point-to-point tag of the exchange. */
enum { REFIT_ZC_TAG = 0x7000 };

refit_status_t refit_zc_locate(refit_session_t *s) {
  const int want = s->cfg.refit.zero_copy != REFIT_ZERO_COPY_OFF && refit_mem_on_device(s->mem);
  MPI_Request req;
  s->startup_buf[0] = want;
  s->startup_buf[1] = 0;
  REFIT_CHECK(refit_session_startup_wait(
      s, &req,
      MPI_Iallreduce(&s->startup_buf[0], &s->startup_buf[1], 1, MPI_INT, MPI_MIN, s->world,
                     &req),
      "zero-copy: memory"));
  if (!s->startup_buf[1])
    return REFIT_OK;
#ifdef REFIT_HAVE_CUDA
  refit_device_locality_t loc;
  REFIT_CHECK(refit_device_locality(s->world, s->startup_timeout_s, &loc));
  s->gpu_of = malloc((size_t)s->size * sizeof(int));
  if (s->gpu_of == NULL) {
    refit_device_locality_free(&loc);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "zero-copy: GPUs of %d ranks", s->size);
  }
  for (int r = 0; r < s->size; r++)
    s->gpu_of[r] = loc.gpu_of[r];
  refit_device_locality_free(&loc);
#endif
  return REFIT_OK;
}

/* The first pair of the plan whose ranks use different GPUs: 1 and its
 * trainer and generator ranks, or 0. */
static int refit_zc_far_pair(const refit_session_t *s, int32_t *far_t, int32_t *far_g) {
  const refit_plan_t *p = s->plan;
  for (int64_t i = 0; i < p->nmsgs; i++)
    if (s->gpu_of[p->msgs[i].src_rank] != s->gpu_of[s->ntrainer + p->msgs[i].dst_rank]) {
      *far_t = p->msgs[i].src_rank;
      *far_g = p->msgs[i].dst_rank;
      return 1;
    }
  return 0;
}

refit_status_t refit_zc_decide(refit_session_t *s) {
  const refit_plan_t *p = s->plan;
  int32_t far_t = -1, far_g = -1;
  s->zero_copy = 0;
  free(s->zc_off);
  s->zc_off = NULL;
  if (s->cfg.refit.zero_copy == REFIT_ZERO_COPY_OFF)
    return REFIT_OK;
  /* delta: on asked for the changed bytes to be sent, which zero copy
   * cannot do (it moves none); under auto the staged path carries them
   * (the config refuses delta: on with zero_copy: on). */
  if (s->cfg.refit.delta == REFIT_DELTA_MODE_ON) {
    if (s->rank == 0 && s->gpu_of != NULL && !refit_zc_far_pair(s, &far_t, &far_g))
      REFIT_INFO("zero-copy: not used although every trainer-generator pair shares a "
                 "GPU: refit.delta: on sends the changed bytes over the staged path");
    return REFIT_OK;
  }
  if (s->gpu_of == NULL) {
    if (s->cfg.refit.zero_copy == REFIT_ZERO_COPY_ON)
      return REFIT_ERR(REFIT_ERR_CONFIG,
                       "refit.zero_copy: on needs every rank's tensors in GPU memory (a "
                       "build with CUDA, a GPU per rank, refit.transport not mpi); use "
                       "refit.zero_copy: auto or off");
    return REFIT_OK;
  }
  if (refit_zc_far_pair(s, &far_t, &far_g)) {
    if (s->cfg.refit.zero_copy == REFIT_ZERO_COPY_ON)
      return REFIT_ERR(REFIT_ERR_CONFIG,
                       "refit.zero_copy: on, but trainer rank %d and generator rank %d "
                       "exchange weights from different GPUs; zero-copy reads need every "
                       "pair on one GPU (use refit.zero_copy: auto or off)",
                       far_t, far_g);
    return REFIT_OK;
  }
  const int64_t nmine = s->my_begin[p->nbuckets];
  s->zc_off = malloc((size_t)(nmine ? nmine : 1) * sizeof(int64_t));
  if (s->zc_off == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "zero-copy: offsets of %lld messages",
                     (long long)nmine);
  for (int32_t b = 0; b < p->nbuckets; b++) {
    int64_t used = 0;
    for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++) {
      const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
      /* A generator's digests in plan order of the bucket's chunks to it
       * (loader_direct.c); a trainer's messages back to back. */
      s->zc_off[k] = s->is_trainer
                         ? used
                         : 8 * (m->chunk_begin - p->msgs[s->my_msgs[s->my_begin[b]]].chunk_begin);
      used += 8 * m->chunk_count;
    }
  }
  s->zero_copy = 1;
  if (s->rank == 0)
    REFIT_INFO("zero-copy: every trainer-generator pair shares a GPU; generators read the "
               "trainers' tensors in place");
  return REFIT_OK;
}

refit_status_t refit_zc_merge(refit_session_t *s) {
  /* Async mode keeps its buckets: a generator serves between progress
   * calls, and each lands one bucket. */
  if (!s->zero_copy || s->zc_merged || s->plan->nbuckets <= 1 ||
      s->cfg.refit.mode != REFIT_MODE_SYNC)
    return REFIT_OK;
  refit_plan_t *bucketed = s->plan;
  int64_t *begin = s->my_begin, *msgs = s->my_msgs;
  const int32_t nbuckets = bucketed->nbuckets;
  int32_t far_t, far_g;
  s->plan = NULL;
  s->my_begin = s->my_msgs = NULL;
  s->zc_merged = 1;
  /* Collective and alike everywhere: the planner's outcome is agreed on, and
   * the pairs are a function of the plan and s->gpu_of. */
  refit_status_t st = refit_session_make_plan(s, REFIT_OK);
  if (st == REFIT_OK && !refit_zc_far_pair(s, &far_t, &far_g)) {
    refit_plan_destroy(bucketed);
    free(begin);
    free(msgs);
    if (s->rank == 0)
      REFIT_INFO("zero-copy: one bucket instead of %d (buckets bound staging, which zero "
                 "copy does not use)",
                 (int)nbuckets);
    return refit_zc_decide(s);
  }
  if (st != REFIT_OK)
    REFIT_WARN("zero-copy: no one-bucket plan (%s); keeping %d buckets",
               refit_status_name(st), (int)nbuckets);
  else
    REFIT_INFO("zero-copy: the one-bucket plan pairs trainer %d with generator %d on "
               "another GPU; keeping %d buckets",
               (int)far_t, (int)far_g, (int)nbuckets);
  refit_plan_destroy(s->plan);
  free(s->my_begin);
  free(s->my_msgs);
  s->plan = bucketed;
  s->my_begin = begin;
  s->my_msgs = msgs;
  s->zc_merged = 0;
  return refit_zc_decide(s);
}

int64_t refit_zc_buffer_bytes(const refit_session_t *s) {
  int64_t need = 8;
  for (int32_t b = 0; b < s->plan->nbuckets; b++) {
    int64_t bytes = 0;
    for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++)
      bytes += 8 * s->plan->msgs[s->my_msgs[k]].chunk_count;
    if (bytes > need)
      need = bytes;
  }
  return need;
}

void refit_zc_msg(const refit_session_t *s, int64_t k, int64_t *offset, int64_t *bytes) {
  *offset = s->zc_off[k];
  *bytes = 8 * s->plan->msgs[s->my_msgs[k]].chunk_count;
}

refit_status_t refit_zc_trainer_tables(refit_session_t *s) {
  const refit_plan_t *p = s->plan;
  const int64_t nmine = s->my_begin[p->nbuckets];
  int64_t n = 0, most = 1;
  for (int64_t k = 0; k < nmine; k++)
    n += p->msgs[s->my_msgs[k]].chunk_count;
  refit_mem_table_free(s->mem, &s->pack);
  free(s->pack_begin);
  refit_direct_desc_t *d = calloc((size_t)(n ? n : 1), sizeof(*d));
  s->pack_begin = calloc((size_t)p->nbuckets + 1, sizeof(int64_t));
  if (d == NULL || s->pack_begin == NULL) {
    free(d);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "zero-copy digest tables of %lld chunks",
                     (long long)n);
  }
  int64_t j = 0;
  for (int32_t b = 0; b < p->nbuckets; b++) {
    s->pack_begin[b] = j;
    for (int64_t k = s->my_begin[b]; k < s->my_begin[b + 1]; k++) {
      const refit_msg_t *m = &p->msgs[s->my_msgs[k]];
      for (int64_t c = m->chunk_begin; c < m->chunk_begin + m->chunk_count; c++, j++) {
        const refit_chunk_t *ch = &p->chunks[c];
        int64_t shard_rows, shard_cols;
        refit_src_shard_shape(&s->cat->src[ch->src_tensor], &shard_rows, &shard_cols);
        d[j].op = REFIT_DIRECT_DIGEST;
        d[j].src = s->shards[ch->src_tensor] + ch->src_row * shard_cols + ch->src_col;
        d[j].src_pitch = shard_cols * 2;
        d[j].rows = ch->rows;
        d[j].cols = ch->cols;
        d[j].digest = p->options.chunk_trailer > 0;
        d[j].seal_key =
            refit_seal_key(s->run_id, b, ch->src_tensor, ch->src_row, ch->src_col);
        d[j].digest_offset = s->zc_off[k] + 8 * (c - m->chunk_begin);
        d[j].perm = -1;
      }
    }
    if (j - s->pack_begin[b] > most)
      most = j - s->pack_begin[b];
  }
  s->pack_begin[p->nbuckets] = j;
  s->pack.host = d;
  s->pack.count = j;
  REFIT_CHECK(refit_direct_descs_check(d, j));
  if (s->zc_acc == NULL)
    REFIT_CHECK(refit_mem_alloc(s->mem, (size_t)most * 8, &s->zc_acc));
  return refit_mem_table_upload(s->mem, &s->pack, sizeof(refit_direct_desc_t));
}

refit_status_t refit_zc_seal(refit_session_t *s, int32_t b, void *buf, uint64_t tag) {
  if (!s->plan->options.chunk_trailer)
    return REFIT_OK;
  return refit_mem_direct_run(s->mem, &s->pack, s->pack_begin[b],
                              s->pack_begin[b + 1] - s->pack_begin[b], tag, buf, s->zc_acc,
                              -1);
}

#ifdef REFIT_HAVE_CUDA
/* What a trainer tells its generators of one tensor it holds: where it lies
 * in an allocation, shared either as a file descriptor of process `pid`
 * (memory refit allocated, device_share.h: mapped at full speed) or as a
 * legacy CUDA IPC handle (a caller's own memory). */
typedef struct {
  int64_t src;     /* catalog tensor */
  uint64_t offset; /* of the tensor in its allocation */
  int32_t pid, fd; /* fd >= 0: a shared allocation of `size` bytes */
  uint64_t size;
  cudaIpcMemHandle_t handle; /* fd < 0 */
} refit_zc_entry_t;

struct refit_zc_map {
  int32_t pid, fd; /* fd >= 0: mapped with refit_share_map, `size` bytes */
  uint64_t size;
  cudaIpcMemHandle_t handle;
  void *mapped;
  int used; /* named by the last exchange */
};

/* Mappings this process opened from another process's CUDA IPC handle
 * (refit_ipc_note): CUDA exports no handle for them, so zero copy hands the
 * original one on. A short list: a refit agent notes one per allocation of
 * its client. */
typedef struct {
  void *base;
  size_t bytes;
  cudaIpcMemHandle_t handle;
} refit_zc_noted_t;
static refit_zc_noted_t *refit_zc_noted;
static int refit_zc_nnoted, refit_zc_cap_noted;

refit_status_t refit_ipc_note(void *base, size_t bytes, const void *handle) {
  if (base == NULL || handle == NULL || bytes == 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "refit_ipc_note: NULL base or handle, or 0 bytes");
  refit_ipc_forget(base);
  if (refit_zc_nnoted == refit_zc_cap_noted) {
    const int cap = refit_zc_cap_noted ? 2 * refit_zc_cap_noted : 16;
    refit_zc_noted_t *n = realloc(refit_zc_noted, (size_t)cap * sizeof(*n));
    if (n == NULL)
      return REFIT_ERR(REFIT_ERR_NO_MEMORY, "refit_ipc_note: %d mappings", cap);
    refit_zc_noted = n;
    refit_zc_cap_noted = cap;
  }
  refit_zc_noted_t *e = &refit_zc_noted[refit_zc_nnoted++];
  e->base = base;
  e->bytes = bytes;
  memcpy(&e->handle, handle, sizeof(e->handle));
  return REFIT_OK;
}

void refit_ipc_forget(void *base) {
  for (int i = 0; i < refit_zc_nnoted; i++)
    if (refit_zc_noted[i].base == base) {
      refit_zc_noted[i] = refit_zc_noted[--refit_zc_nnoted];
      return;
    }
}

static const cudaIpcMemHandle_t *refit_zc_noted_handle(const void *base) {
  for (int i = 0; i < refit_zc_nnoted; i++)
    if (refit_zc_noted[i].base == base)
      return &refit_zc_noted[i].handle;
  return NULL;
}

static void refit_zc_map_close(const struct refit_zc_map *m) {
  if (m->fd >= 0)
    refit_share_unmap(m->mapped, (size_t)m->size);
  else
    cudaIpcCloseMemHandle(m->mapped);
}

/* Trainer: every tensor it holds, as (allocation handle, offset). */
static refit_status_t refit_zc_entries(refit_session_t *s, refit_zc_entry_t **out) {
  refit_zc_entry_t *e = calloc((size_t)(s->nshards ? s->nshards : 1), sizeof(*e));
  if (e == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "zero-copy: %lld tensors", (long long)s->nshards);
  void *last_base = NULL;
  cudaIpcMemHandle_t last = {0};
  const int32_t pid = (int32_t)getpid();
  for (int64_t k = 0; k < s->nshards; k++) {
    const int64_t i = s->held[k];
    void *base = NULL;
    size_t size = 0;
    int fd = -1;
    e[k].src = i;
    e[k].pid = pid;
    e[k].fd = -1;
    if (refit_share_lookup(s->shards[i], &base, &fd, &size)) {
      e[k].offset = (uint64_t)((uintptr_t)s->shards[i] - (uintptr_t)base);
      e[k].fd = fd;
      e[k].size = size;
      continue;
    }
    refit_status_t st = refit_device_alloc_range(s->shards[i], &base, &size);
    const cudaIpcMemHandle_t *noted = st == REFIT_OK ? refit_zc_noted_handle(base) : NULL;
    if (noted != NULL && base != last_base) {
      last = *noted;
      last_base = base;
    } else if (st == REFIT_OK && base != last_base) {
      cudaError_t err = cudaIpcGetMemHandle(&last, base);
      if (err != cudaSuccess)
        st = REFIT_ERR(REFIT_ERR_CUDA,
                       "zero-copy: trainer rank %d cannot share tensor %s (%s): %s; memory "
                       "from cudaMalloc (or PyTorch's caching allocator without "
                       "expandable segments) is needed, or refit.zero_copy: off",
                       s->role_rank, s->cat->src[i].name, cudaGetErrorName(err),
                       cudaGetErrorString(err));
      last_base = base;
    }
    if (st != REFIT_OK) {
      free(e);
      return st;
    }
    e[k].offset = (uint64_t)((uintptr_t)s->shards[i] - (uintptr_t)base);
    e[k].handle = last;
  }
  *out = e;
  return REFIT_OK;
}

/* Generator: the mapping of entry e's allocation, opened once for the
 * session. */
static refit_status_t refit_zc_map(refit_session_t *s, const refit_zc_entry_t *e, int trainer,
                                   void **out) {
  for (int64_t i = 0; i < s->zc_nmaps; i++) {
    const struct refit_zc_map *c = &s->zc_maps[i];
    const int same = e->fd >= 0 ? c->fd == e->fd && c->pid == e->pid && c->size == e->size
                                : c->fd < 0 && memcmp(&c->handle, &e->handle,
                                                      sizeof(e->handle)) == 0;
    if (same) {
      s->zc_maps[i].used = 1;
      *out = c->mapped;
      return REFIT_OK;
    }
  }
  struct refit_zc_map *m = realloc(s->zc_maps, (size_t)(s->zc_nmaps + 1) * sizeof(*m));
  if (m == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "zero-copy: mappings");
  s->zc_maps = m;
  void *p = NULL;
  if (e->fd >= 0) {
    refit_status_t st = refit_share_map(e->pid, e->fd, (size_t)e->size, &p);
    if (st != REFIT_OK) {
      char why[512];
      snprintf(why, sizeof(why), "%s", refit_last_error());
      return REFIT_ERR(st, "zero-copy: generator rank %d cannot map the memory of trainer "
                           "rank %d: %s",
                       s->role_rank, trainer, why);
    }
  } else {
    cudaError_t err = cudaIpcOpenMemHandle(&p, e->handle, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess)
      return REFIT_ERR(REFIT_ERR_CUDA,
                       "zero-copy: generator rank %d cannot map the memory of trainer rank "
                       "%d: %s (%s)",
                       s->role_rank, trainer, cudaGetErrorName(err), cudaGetErrorString(err));
  }
  m[s->zc_nmaps].pid = e->pid;
  m[s->zc_nmaps].fd = e->fd;
  m[s->zc_nmaps].size = e->size;
  m[s->zc_nmaps].handle = e->handle;
  m[s->zc_nmaps].mapped = p;
  m[s->zc_nmaps].used = 1;
  s->zc_nmaps++;
  *out = p;
  return REFIT_OK;
}

/* Generator, after an exchange: close the mappings no tensor lies in any
 * more (a trainer re-registered its tensors elsewhere), so that mappings do
 * not pile up over a job whose optimizer re-grows its buffers. The exchange
 * runs at begin, after the last refit's reads completed. CUDA leaves a
 * cudaFree of memory another process still maps undefined: a trainer's
 * allocator must keep an allocation it registered until the next begin has
 * exchanged the new addresses (PyTorch's caching allocator keeps its
 * segments; docs/architecture.md states the rule). */
static void refit_zc_release_unused(refit_session_t *s) {
  int64_t kept = 0, closed = 0;
  for (int64_t i = 0; i < s->zc_nmaps; i++) {
    if (s->zc_maps[i].used) {
      s->zc_maps[kept++] = s->zc_maps[i];
      continue;
    }
    refit_zc_map_close(&s->zc_maps[i]);
    closed++;
  }
  s->zc_nmaps = kept;
  if (closed > 0)
    REFIT_INFO("zero-copy: generator rank %d closed %lld mapping(s) of trainer memory no "
               "tensor lies in any more",
               s->role_rank, (long long)closed);
}

/* The distinct peers of this rank's messages (world ranks). */
static int refit_zc_peers(const refit_session_t *s, int *peers) {
  int n = 0;
  for (int64_t k = 0; k < s->my_begin[s->plan->nbuckets]; k++) {
    const refit_msg_t *m = &s->plan->msgs[s->my_msgs[k]];
    const int peer = s->is_trainer ? s->ntrainer + m->dst_rank : m->src_rank;
    int seen = 0;
    for (int i = 0; i < n && !seen; i++)
      seen = peers[i] == peer;
    if (!seen)
      peers[n++] = peer;
  }
  return n;
}

refit_status_t refit_zc_exchange(refit_session_t *s, double deadline) {
  int *peers = malloc((size_t)s->size * sizeof(int));
  if (peers == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "zero-copy: peers");
  const int npeers = refit_zc_peers(s, peers);
  refit_status_t st = REFIT_OK;
  if (s->is_trainer) {
    refit_zc_entry_t *e = NULL;
    st = refit_zc_entries(s, &e);
    /* A failure still sends its count (-1): the generators must hear it,
     * not wait for entries that will not come. */
    s->zc_count = st == REFIT_OK ? s->nshards : -1;
    refit_status_t wst = REFIT_OK;
    int handed = 0; /* e went to outlive.h with a send that missed its deadline */
    for (int i = 0; i < npeers && wst == REFIT_OK; i++) {
      /* The count lives in the session (kept when the session breaks), the
       * entries on the heap: a send that misses its deadline keeps them. */
      MPI_Request req;
      void *blocks[] = {e};
      char what[128], name[64];
      refit_session_rank_name(s, peers[i], name, sizeof(name));
      snprintf(what, sizeof(what), "zero-copy: sending the tensors to %s", name);
      MPI_Isend(&s->zc_count, 1, MPI_INT64_T, peers[i], REFIT_ZC_TAG, s->ctrl, &req);
      wst = refit_session_join_wait(s, &req, deadline, what, "refit.timeout_s",
                                    s->cfg.refit.timeout_s);
      if (wst != REFIT_OK || s->zc_count < 0)
        continue;
      MPI_Isend(e, (int)(s->nshards * (int64_t)sizeof(*e)), MPI_BYTE, peers[i],
                REFIT_ZC_TAG, s->ctrl, &req);
      wst = refit_session_join_wait_blocks(s, &req, blocks, 1, deadline, what,
                                           "refit.timeout_s", s->cfg.refit.timeout_s);
      handed = wst != REFIT_OK;
    }
    if (!handed)
      free(e);
    free(peers);
    return st != REFIT_OK ? st : wst;
  }
  const int64_t nsrc = s->cat->nsrc;
  if (s->zc_base == NULL)
    s->zc_base = calloc((size_t)(s->ntrainer * nsrc), sizeof(*s->zc_base));
  if (s->zc_base == NULL) {
    free(peers);
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "zero-copy: tensor table");
  }
  for (int64_t i = 0; i < s->zc_nmaps; i++)
    s->zc_maps[i].used = 0;
  for (int i = 0; i < npeers && st == REFIT_OK; i++) {
    /* The count and the entries on the heap: a receive that misses its
     * deadline keeps them (outlive.h). */
    MPI_Request req;
    char what[128], name[64];
    refit_session_rank_name(s, peers[i], name, sizeof(name));
    snprintf(what, sizeof(what), "zero-copy: receiving the tensors from %s", name);
    int64_t *got = malloc(sizeof(*got));
    if (got == NULL) {
      st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "zero-copy: count");
      break;
    }
    void *count_block[] = {got};
    MPI_Irecv(got, 1, MPI_INT64_T, peers[i], REFIT_ZC_TAG, s->ctrl, &req);
    st = refit_session_join_wait_blocks(s, &req, count_block, 1, deadline, what,
                                        "refit.timeout_s", s->cfg.refit.timeout_s);
    if (st != REFIT_OK)
      break; /* got is parked */
    const int64_t count = *got;
    free(got);
    if (count < 0)
      st = REFIT_ERR(REFIT_ERR_PEER,
                     "zero-copy: trainer rank %d cannot share its tensors (its error is in "
                     "its log)",
                     peers[i]);
    if (st != REFIT_OK)
      break;
    refit_zc_entry_t *e = calloc((size_t)(count ? count : 1), sizeof(*e));
    if (e == NULL) {
      st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "zero-copy: %lld tensors", (long long)count);
      break;
    }
    void *blocks[] = {e};
    MPI_Irecv(e, (int)(count * (int64_t)sizeof(*e)), MPI_BYTE, peers[i], REFIT_ZC_TAG, s->ctrl,
              &req);
    st = refit_session_join_wait_blocks(s, &req, blocks, 1, deadline, what,
                                        "refit.timeout_s", s->cfg.refit.timeout_s);
    if (st != REFIT_OK)
      break; /* e is parked */
    for (int64_t k = 0; k < count && st == REFIT_OK; k++) {
      void *base = NULL;
      if (e[k].src < 0 || e[k].src >= nsrc) {
        st = REFIT_ERR(REFIT_ERR_PEER, "zero-copy: trainer rank %d names tensor %lld of %lld",
                       peers[i], (long long)e[k].src, (long long)nsrc);
        break;
      }
      st = refit_zc_map(s, &e[k], peers[i], &base);
      if (st == REFIT_OK)
        s->zc_base[(int64_t)peers[i] * nsrc + e[k].src] =
            (const uint16_t *)((const unsigned char *)base + e[k].offset);
    }
    free(e);
  }
  free(peers);
  if (st == REFIT_OK)
    st = refit_loader_direct_tables(s->loader, s->zc_base, nsrc);
  if (st == REFIT_OK)
    refit_zc_release_unused(s);
  return st;
}

/* Generator: unmap the trainers' allocations. */
static void refit_zc_unmap(refit_session_t *s) {
  for (int64_t i = 0; i < s->zc_nmaps; i++)
    refit_zc_map_close(&s->zc_maps[i]);
  free(s->zc_maps);
  s->zc_maps = NULL;
  s->zc_nmaps = 0;
}
#else
refit_status_t refit_zc_exchange(refit_session_t *s, double deadline) {
  (void)deadline;
  (void)s;
  return REFIT_ERR(REFIT_ERR_INTERNAL, "zero-copy without CUDA");
}

static void refit_zc_unmap(refit_session_t *s) { (void)s; }

refit_status_t refit_ipc_note(void *base, size_t bytes, const void *handle) {
  (void)base;
  (void)bytes;
  (void)handle;
  return REFIT_ERR(REFIT_ERR_NOT_AVAILABLE, "refit_ipc_note: refit was built without CUDA");
}

void refit_ipc_forget(void *base) { (void)base; }
#endif

void refit_zc_close(refit_session_t *s) {
  refit_zc_unmap(s);
  free((void *)s->zc_base);
  s->zc_base = NULL;
  free(s->zc_off);
  s->zc_off = NULL;
  free(s->gpu_of);
  s->gpu_of = NULL;
  if (s->zc_acc != NULL && s->mem != NULL)
    refit_mem_free(s->mem, s->zc_acc);
  s->zc_acc = NULL;
}
