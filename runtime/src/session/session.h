/*
 * A refit session: one rank's share of a refit job. It owns the parsed
 * config, the trainer/generator split of the world, the catalog and plan
 * (identical on every rank, proven by hash), the transport, and the memory:
 * trainer shards on trainer ranks, runtime tensors and staging on generator
 * ranks. Runtime tensors are allocated once; every refit writes them in place.
 */
#ifndef REFIT_SESSION_H
#define REFIT_SESSION_H

#include "config/config.h"
#include "fault/fault.h"
#include "refit/refit.h"
#include "reshard/catalog.h"
#include "reshard/plan.h"
#include "generator/loader.h"
#include "device/memory.h"
#include "source/source.h"
#include "session/timeline.h"
#include "transport/transport.h"

#include <mpi.h>
#include <stdint.h>

/* Tags of the point-to-point exchanges on the control communicator
 * (refit_session_gather); zero_copy.c's is 0x7000. */
enum {
  REFIT_CTRL_TAG_HEADER = 0x7100, /* begin: header exchange */
  REFIT_CTRL_TAG_REPAIR = 0x7101, /* begin: transport repair's outcome */
  REFIT_CTRL_TAG_VOTE = 0x7102,   /* commit vote */
  REFIT_CTRL_TAG_FIRST = 0x7103,  /* first begin: every rank is here */
  REFIT_CTRL_TAG_AMAX = 0x7104    /* begin: NVFP4's global amax keys */
};

/* Seconds per phase of one refit, as seen by one rank. */
typedef struct {
  double source;   /* trainer: produce the new weights */
  double pack;     /* trainer: gather chunks into send buffers */
  double transfer; /* waiting on the transport */
  double unpack;   /* generator: land staging in runtime storage (copy, or
                      quantize and lay out) */
  double commit;   /* the vote, and the shadow copy in async mode */
  double staging;  /* keep_staging: false: giving staging back and taking it */
  double total;    /* begin to the end of commit */
} refit_phase_times_t;


typedef struct refit_session {
  refit_config_t cfg;
  char *config_text;
  size_t config_len;

  MPI_Comm world; /* a duplicate of the caller's communicator */
  int rank, size;
  double startup_timeout_s; /* deadline of each start-up collective */
  int startup_buf[2];       /* start-up collectives' buffers */
  uint64_t startup_u64[4];
  int ntrainer, ngenerator;
  int is_trainer;
  int role_rank; /* rank within the trainer or generator group */

  refit_catalog_t *cat;
  refit_plan_t *plan;
  refit_transport_t transport;
  refit_source_t source;

  /* This rank's messages, by bucket: my_msgs[my_begin[b] .. my_begin[b+1]). */
  int64_t *my_msgs;
  int64_t *my_begin;

  /* Trainer: shard of each catalog src tensor this rank holds (part index
   * in shard_part, -1 when not held); memory registered or allocated at the
   * first begin. */
  uint16_t **shards;
  int32_t *shard_part;
  unsigned char *shard_owned;
  int64_t nshards;
  int64_t *held;    /* the src index of this rank's k-th tensor, k < nshards */
  int64_t *held_at; /* src index -> k, or -1 */

  /* Generator: the loader owns the runtime storage of tp rank `tp_rank`;
   * stores / nstores are its stores, for readers such as the dump. */
  int tp_rank, engine;
  refit_loader_t *loader;
  refit_store_t *stores;
  int64_t nstores;
  /* Generator: every registration before the first begin, with its form
   * (precision.h), checked again if the engine's forms re-plan the job. */
  struct refit_registration *regs;
  int64_t nregs, regs_cap;
  int replaying;
  int precision_settled; /* the first begin reduced the forms */
  /* The forms' reduction at the first begin: mine, then everyone's (one
   * byte per catalog generator tensor each); kept like the other
   * collectives' buffers. */
  unsigned char *form_votes;

  refit_mem_t *mem; /* host or this rank's GPU: shards, stores, buffers */

  /* Trainer: one pack descriptor per chunk sent, by bucket. A message whose
   * bytes equal an earlier one's of the same bucket (the same chunks of the
   * same shards, as every engine replica needs) is packed once: msg_wire[k]
   * is the offset in the send buffer of my_msgs[k]'s bytes, shared. */
  refit_mem_table_t pack;
  int64_t *pack_begin;
  int64_t *msg_wire;
  int64_t *pack_src, *pack_elem; /* per descriptor: shard and element offset */
  int moved;                     /* a shard was registered at a new address */
  /* refit_tensor_forget_all: the caller's memory is gone; every tensor must
   * be registered again (generators too, this once) before the next begin,
   * which binds the new addresses. */
  int forgotten;
  int rebound; /* generator: bound anew at this begin, until it starts */
  int64_t shared_msgs, shared_bytes; /* messages and bytes not packed again */

  /* Send buffers (trainer) or staging areas (generator), one per exchange
   * in flight, each as large as this rank's largest bucket. */
  unsigned char *buffer[REFIT_EXCHANGES_IN_FLIGHT];
  refit_xfer_t *xfers;

  /* Lifecycle. */
  MPI_Comm ctrl;      /* headers and votes, errors returned */
  /* Buffers of the header exchange (this rank's, then everyone's) and of
   * the vote (likewise): they outlive an exchange that missed its deadline,
   * which MPI may still complete into them. */
  struct refit_header *header_buf;
  int *vote_buf;
  uint64_t run_id;
  refit_state_t state;
  int broken;         /* a collective timed out: no further refits */
  int bound;          /* memory attached (first begin) */
  int64_t nregistered;
  int poisoned_before;
  int staging_released; /* keep_staging: false, between refits */
  int vote_settled;     /* refit_abort voted no: the status the next commit
                           reports (REFIT_ERR_STATE, or the vote's failure);
                           REFIT_OK: nothing to report */
  int exposed;          /* an exchange was abandoned: released requests may still
                           target the buffers (kept at close, outlive.h) */
  int vote_pending;   /* begun: this attempt still owes the commit vote */
  int peer_lost;      /* a wait of this attempt timed out */
  char failure[512];  /* this attempt's first failure (the vote names it) */
  uint64_t committed; /* version in runtime storage (0: none yet) */
  uint64_t pending;   /* version being refitted */
  uint32_t attempt;   /* refits begun, 1-based */
  uint32_t attempt_mask; /* of the attempt in message tags */
  int tag_base;
  int32_t next_bucket; /* next bucket to complete */
  int32_t next_posted; /* first bucket whose exchange is not started */
  refit_exchange_t *inflight[REFIT_EXCHANGES_IN_FLIGHT];
  double t_begin, deadline;
  refit_phase_times_t times;
  /* refit.timeline: this refit's bucket marks; NULL when not asked for. */
  refit_timeline_t *timeline;
  refit_fault_t fault;

  /* Zero copy (refit.zero_copy, zero_copy.c): the GPU of every rank (NULL
   * when some rank's memory is not on a GPU), whether this plan reads in
   * place, each of my_msgs' place in its buffer, the trainer's digest
   * accumulators and the count it sent; the generator's mapped trainer
   * allocations and every trainer tensor's address here
   * ([trainer * nsrc + tensor]). */
  int *gpu_of;
  int zero_copy;
  int zc_merged; /* the plan is zero copy's one bucket (refit_zc_merge) */
  int zc_ready; /* the mapping was exchanged */
  int64_t *zc_off;
  void *zc_acc;
  int64_t zc_count;
  struct refit_zc_map *zc_maps;
  int64_t zc_nmaps;
  const uint16_t **zc_base;
  void *shard_slab; /* trainer: the shards it allocated itself, one allocation */
  size_t buffer_bytes; /* of each send buffer or staging area */

  /* refit.delta (delta_wire.h): baselines and frames, made at the first
   * begin once memory is bound; NULL with delta off. */
  struct refit_dw *dw;
  int dw_made;

  /* The refit path this session takes (path.h): staged, delta or zero copy,
   * chosen once the plan is known. */
  const struct refit_path_ops *path;
} refit_session_t;

/*
 * Collective over `world`: rank 0 reads and validates the config (printing
 * every problem), the config is broadcast, the plan built everywhere and its
 * hash compared. Fails on every rank when any rank fails.
 */
refit_status_t refit_session_create(MPI_Comm world, const char *config_path,
                                    refit_session_t **out);
void refit_session_destroy(refit_session_t *s);

/* Attach caller memory to a tensor this rank holds (before the first begin;
 * trainers may register a tensor again at a new address between refits).
 * Checks name, shape, dtype, size and memory, every problem in one message. */
refit_status_t refit_session_register(refit_session_t *s, const refit_tensor_t *t);

/* Drop every caller registration of this rank (refit_tensor_forget_all). */
refit_status_t refit_session_forget(refit_session_t *s);

/* Begin, after refit_session_forget: every tensor registered again, the
 * generator's land tables rebuilt over the new addresses. */
refit_status_t refit_session_rebind(refit_session_t *s);

/* Does `name`, as an engine registers it, name runtime store `store`? Equal
 * names, or vLLM's nested spelling of the expert stacks
 * (mlp.experts.routed_experts.w13_weight for mlp.experts.w13_weight). */
int refit_store_name_matches(const char *store, const char *name);

/* What a framework holds for trainer tensor t's shard: BF16 [rows, cols],
 * or for an FP32 vector (REFIT_ROLE_F32) float32 [cols / 2]; *bytes is the
 * same rows * cols * 2 either way. */
void refit_session_src_form(const refit_src_tensor_t *t, int *ndim, int64_t shape[3],
                            refit_dtype_t *dtype, size_t *bytes);

/* The lifecycle: see runtime/include/refit/refit.h for the contract. */
refit_status_t refit_session_begin(refit_session_t *s, uint64_t version, void *stream);
refit_status_t refit_session_progress(refit_session_t *s, int *done);
refit_status_t refit_session_commit(refit_session_t *s, void *stream);
refit_status_t refit_session_abort(refit_session_t *s);


/* Generator ranks: compare every runtime byte with the from-definition
 * reference of `version`; *mismatches counts wrong elements (the first is
 * logged with tensor, rank, index, expected and actual). Trainers: 0. */
refit_status_t refit_session_verify(refit_session_t *s, uint64_t version,
                                    int64_t *mismatches);

/* ---------------------------------------------------------------------- */
/* Between the session's files (session.c, trainer.c, session_register.c, */
/* lifecycle.c): not for other callers.                                    */
/* ---------------------------------------------------------------------- */

/* What every rank tells the others at begin. */
typedef struct refit_header {
  uint64_t run_id, version, plan_hash, committed;
  int32_t side, ok; /* ok: this rank could start (memory bound) */
  int32_t transport_ok, moved; /* transport_ok: its transport is healthy;
                                  moved: a trainer tensor has a new address */
  int32_t delta_ready, pad;    /* this rank can take part in a delta refit
                                  (refit_dw_ready) */
} refit_header_t;

/* session.c: read and validate the config at `path` (refit_config_load;
 * world_size 0 skips that check). On failure every problem is printed to
 * stderr and the error says the config was rejected. */
refit_status_t refit_session_read_config(const char *path, int world_size,
                                         refit_config_t *cfg, char **text, size_t *len);

/* session.c: the collectives' helpers. */

/* Wait for a collective on the session's communicators until `deadline`. A
 * rank that did not join, or an MPI failure, breaks the session; `limit`
 * names the bound. */
refit_status_t refit_session_join_wait(refit_session_t *s, MPI_Request *req,
                                       double deadline, const char *what,
                                       const char *limit, double limit_s);

/* refit_session_join_wait of an operation whose buffers are the heap blocks
 * blocks[0..n): on any failure they go with the request to outlive.h (the
 * caller must not free them); on success the caller keeps them. */
refit_status_t refit_session_join_wait_blocks(refit_session_t *s, MPI_Request *req,
                                              void *const *blocks, int n, double deadline,
                                              const char *what, const char *limit,
                                              double limit_s);

/* World rank r as messages name it: "generator rank 1 (world rank 3)". */
void refit_session_rank_name(const refit_session_t *s, int r, char *out, size_t len);

/* The ranks whose requests among reqs[0..n) (to or from peer[i]) are still
 * pending, named into out: "generator rank 1 (world rank 3), ..."; their
 * count. */
int refit_session_name_pending(const refit_session_t *s, MPI_Request *reqs, const int *peer,
                               int n, char *out, size_t len);

/* Every rank's `bytes` at `mine` into all + r * bytes for each world rank r
 * (this rank's copied there), point to point on s->ctrl with `tag`, by
 * `deadline`: a message that did not arrive is an error that names the
 * ranks it did not come from, and breaks the session, as a collective that
 * missed its deadline does. `mine` and `all` are the session's buffers or
 * heap blocks among blocks[0..n) (malloc): on any failure the blocks belong
 * to outlive.h with what is still posted (the caller must not free them);
 * on success the caller keeps them. */
refit_status_t refit_session_gather(refit_session_t *s, const void *mine, void *all,
                                    int bytes, int tag, double deadline, const char *what,
                                    void *const *blocks, int n);

/* A start-up collective started by the MPI call that returned `rc`, waited
 * on against the start-up deadline. */
refit_status_t refit_session_startup_wait(refit_session_t *s, MPI_Request *req, int rc,
                                          const char *what);

/* NVFP4, at begin once the trainers' weights of `version` are in place
 * (nvfp4_amax.c): every rank's amax keys of the Hugging Face tensors NVFP4
 * reads, exchanged by the begin deadline; a generator sets its loader's
 * global scales from their maxima. `ok`: this rank got this far (a rank
 * that did not still takes part, so that its peers learn it). Blocking;
 * a timeout names the ranks that did not answer and breaks the session. */
refit_status_t refit_session_nvfp4_amax(refit_session_t *s, int ok, uint64_t version);

/* Every rank learns whether any rank failed `phase` (st: this rank's
 * outcome); a rank that did not fail itself returns REFIT_ERR_PEER. */
refit_status_t refit_session_agree(refit_session_t *s, refit_status_t st,
                                   const char *phase);

/* session.c: what start-up builds, also rebuilt when the engines' precisions
 * re-plan the job (session_register.c). */

/* Plan from the catalog's quantized flags (collective; st: this rank's
 * outcome so far), compare hashes, index this rank's messages. */
refit_status_t refit_session_make_plan(refit_session_t *s, refit_status_t st);

/* Open the transport between the plan's (sender, receiver) pairs
 * (collective). */
refit_status_t refit_session_open_transport(refit_session_t *s);

/* Generator: the loader of this rank's runtime stores, for this plan. */
refit_status_t refit_session_make_loader(refit_session_t *s);

/* The send buffers (trainer) or staging areas (generator), one per exchange
 * in flight, and the transfer list. */
refit_status_t refit_session_alloc_buffers(refit_session_t *s);

/* Transports that write into their peers' memory learn the staging areas
 * (collective; st: this rank's outcome so far). */
refit_status_t refit_session_register_staging(refit_session_t *s, refit_status_t st);

/* refit.keep_staging: false gives the staging memory back between refits,
 * and begin takes it again. */
void refit_session_release_staging(refit_session_t *s);
refit_status_t refit_session_acquire_staging(refit_session_t *s);

/* trainer.c */

/* The shards this trainer rank holds (memory attached at bind). */
refit_status_t refit_session_index_trainer(refit_session_t *s);

/* Produce `version` into the shards from the configured source (synthetic
 * or checkpoint; never called with source.kind caller). */
refit_status_t refit_trainer_source(refit_session_t *s, uint64_t version);

/* The pack descriptor tables, built at bind and uploaded. */
refit_status_t refit_trainer_tables(refit_session_t *s);

/* Point the pack descriptors at shards registered again at new addresses. */
refit_status_t refit_trainer_repoint(refit_session_t *s);

/* Pack bucket b into `buf` and list its sends in xfers (*nxfers); with
 * wait_done, return when the packed bytes are ready. */
refit_status_t refit_trainer_pack(refit_session_t *s, int32_t b, unsigned char *buf,
                                  refit_xfer_t *xfers, int *nxfers, int wait_done);

/* session_register.c */

/* First begin, on every rank: the engines' registration forms decide which
 * runtime tensors are MXFP8, re-planning when they differ (collective). */
refit_status_t refit_session_settle_precision(refit_session_t *s);

/* First begin: attach every registered tensor, allocate the rest (or name
 * what is missing), build the pack or land tables. */
refit_status_t refit_session_bind(refit_session_t *s);

/* lifecycle.c */


#endif /* REFIT_SESSION_H */
