/*
 * refit: move freshly trained weights from trainer ranks to generator ranks,
 * re-sharded, optionally quantized to MXFP8 and laid out for the inference
 * kernels, written in place into storage whose addresses never change.
 *
 * This header is the whole public API of a refit (refit/plan.h plans one
 * without MPI, for tools that only plan). A trainer process and an inference
 * engine process each open a session over the same MPI communicator (the
 * first trainer.tp*pp*dp ranks are trainers, the rest generators), then for
 * each new version:
 *
 *   trainer                          generator (inference engine)
 *   -------                          ----------------------------
 *   (optimizer step on stream)       (forward passes on stream)
 *   refit_begin(s, v, stream)        refit_begin(s, v, stream)
 *   while (!done)                    while (!done) {
 *     refit_progress(s, &done);        serve a step;      (async mode)
 *                                      refit_progress(s, &done);
 *                                    }
 *   refit_commit(s, stream)          refit_commit(s, stream)  at a safe point
 *
 * CUDA streams, as NCCL takes them: `stream` is a cudaStream_t passed as
 * void * (NULL is the legacy default stream; PyTorch's is
 * torch.cuda.current_stream().cuda_stream). refit_begin orders refit's own
 * device work after everything the caller queued on `stream` before the
 * call; refit_commit orders what the caller queues on `stream` after it
 * returns after refit's writes. Neither blocks the host on the stream.
 * Sessions on host memory ignore it.
 *
 * Every call that involves other ranks is collective over the session's
 * communicator (a duplicate of the caller's) and bounded: a refit fails
 * when no bucket completes for refit.timeout_s, the commit vote waits up to
 * twice it, refit_session_open's collectives timeout_s (REFIT_STARTUP_TIMEOUT_S
 * before the config is read). A dead or stalled peer gives a typed error
 * naming the phase and the peer, never a hang. A rank that voted yes but
 * cannot learn the vote's outcome does not guess: a generator becomes
 * POISONED. Any failure on any
 * rank makes every generator keep (sync, restore: full) or restore version V;
 * commit happens at most once per version and only when every rank voted
 * success.
 *
 * Thread safety: a session is used by one thread at a time. Different
 * sessions are independent. Errors: every function returns a refit_status_t;
 * refit_last_error() gives the message of the last failure on the thread.
 */
#ifndef REFIT_REFIT_H
#define REFIT_REFIT_H

#include "refit/status.h"

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define REFIT_VERSION_STRING "0.1.0"

/* Opaque session handle. */
typedef struct refit_session *refit_session_h;

/* X(name, text) */
#define REFIT_STATE_MAP(X)                                                     \
  X(IDLE, "idle: serving the committed version")                               \
  X(RECEIVING, "receiving a new version")                                      \
  X(READY, "new version complete, waiting for commit")                         \
  X(COMMITTING, "committing")                                                  \
  X(POISONED, "poisoned: a failed refit left runtime storage inconsistent")

typedef enum {
#define REFIT_STATE_ENUM_(name, text) REFIT_STATE_##name,
  REFIT_STATE_MAP(REFIT_STATE_ENUM_)
#undef REFIT_STATE_ENUM_
} refit_state_t;

typedef enum { REFIT_SIDE_TRAINER = 0, REFIT_SIDE_GENERATOR = 1 } refit_side_t;

typedef enum {
  REFIT_TENSOR_BF16 = 0, /* uint16 bit patterns */
  REFIT_TENSOR_E4M3 = 1, /* float8_e4m3fn */
  REFIT_TENSOR_E8M0 = 2, /* block scale exponents */
  REFIT_TENSOR_F32 = 3,  /* float32 (DeepSeek's e_score_correction_bias, fp8_block's weight_scale_inv) */
  REFIT_TENSOR_U8 = 4    /* uint8 (NVFP4's weight: E2M1 values two to a byte, the even element low) */
} refit_tensor_dtype_t;

/* A tensor a side holds: trainer shards under the trainer's names
 * (trainer.layout megatron: Megatron-Core's named_parameters(), without
 * the trainer.name_prefix wrappers add only when configured; hf: Hugging
 * Face names), generator runtime storage under vLLM's names. Contiguous,
 * row-major. */
typedef struct {
  const char *name;
  void *data;        /* host memory (device memory with the GPU path) */
  size_t bytes;
  int ndim;          /* 0 when registering: check bytes only */
  int64_t shape[3];
  refit_tensor_dtype_t dtype;
} refit_tensor_t;

/*
 * Open a session: collective over `comm`. Rank 0 reads and validates the
 * config at `config_path` (every problem is printed with file:line:col and
 * nothing starts); the config is broadcast and its hash, then the plan's
 * hash, compared on every rank. The session allocates, once, the storage its
 * side needs: trainer shards, generator runtime tensors (see
 * refit_tensor_get), staging. On success *out owns it all until
 * refit_session_close. Blocking.
 */
refit_status_t refit_session_open(MPI_Comm comm, const char *config_path,
                                  refit_session_h *out);

/* Release everything; not collective, waits for nothing; NULL is ignored.
 * During a refit, what is in flight is abandoned (peers fail it at their
 * deadline), and the buffers a late peer may still write or read are kept
 * until the process exits. */
void refit_session_close(refit_session_h s);

refit_side_t refit_session_side(refit_session_h s);

/* Where this rank's tensors live: the CUDA device ordinal the session bound
 * (memory registered must be that GPU's), or -1 for host memory. */
int refit_session_device(refit_session_h s);

/*
 * The tensors this rank holds: trainer shards (the trainer writes new weights
 * there before refit_begin, unless the source is synthetic or a checkpoint)
 * or generator runtime storage (the inference engine reads it; addresses are
 * fixed for the life of the session, so CUDA graphs may capture them).
 * `index` runs from 0 to refit_tensor_count() - 1; pointers stay owned by
 * the session. Before the first refit_begin `data` is NULL unless the
 * caller registered the tensor (refit_tensor_register): the description is
 * what to allocate. Not collective.
 */
int64_t refit_tensor_count(refit_session_h s);
refit_status_t refit_tensor_get(refit_session_h s, int64_t index,
                                refit_tensor_t *out);
/* Look a tensor up by name; REFIT_ERR_INVALID_ARGUMENT names it if absent. */
refit_status_t refit_tensor_find(refit_session_h s, const char *name,
                                 refit_tensor_t *out);
/* Why the trainer tensor `name` is no refit target although a trainer holds
 * it (a DeepSeek multi-token-prediction layer: Megatron-Core mtp.layers.*,
 * Hugging Face model.layers.{l >= num_layers}.*, which vLLM's main model
 * skips), or NULL: refit_tensor_register takes such a tensor on a trainer
 * and keeps nothing of it. NULL on generators and for every other name.
 * The string is static. Not collective. */
const char *refit_tensor_skipped(refit_session_h s, const char *name);

/*
 * Start refitting `version`: collective. Every rank checks that all agree on
 * (run id, version, plan hash) and generators refuse a version that does not
 * increase, before a byte moves. Trainers: with source.kind caller the
 * registered tensors are sent as they are (refit never writes them; do not
 * change them until refit_commit returns); with a synthetic or checkpoint
 * source, the source fills the shards here. `stream`: refit reads trainer
 * tensors, and a sync generator overwrites runtime storage, only after the
 * work queued on it before this call (see the top of this file). A tensor
 * missing from the registration is named here, before a byte moves.
 * Allowed in IDLE and POISONED (a POISONED generator serves again after a
 * full successful refit): REFIT_ERR_STATE while a refit is in progress,
 * REFIT_ERR_PEER once a collective of the session missed its deadline.
 */
refit_status_t refit_begin(refit_session_h s, uint64_t version, void *stream);

/*
 * Advance the refit by one bucket; *done becomes 1 once this rank's part is
 * complete (READY). In async mode a generator's call returns at once while
 * its next bucket is still in flight (call it between serving steps); in
 * sync mode, and on trainers, it waits for that bucket (within
 * refit.timeout_s). On failure the refit is aborted on this rank (see
 * refit_abort: it votes no) and the error returned; refit_commit then
 * returns this rank's failure, and refit_begin may follow at once.
 */
refit_status_t refit_progress(refit_session_h s, int *done);

/*
 * Commit the new version: collective vote over all ranks. Only when every
 * rank voted success does anything change: sync mode keeps what was written
 * in place and drops the saved copy; async mode copies the shadow into
 * runtime storage (same addresses) — the pause the engine sees. Otherwise
 * every generator keeps or restores version V and REFIT_ERR_PEER (a peer
 * voted no) or REFIT_ERR_STATE naming this rank's own failure is returned; a
 * vote that misses its deadline is REFIT_ERR_TIMEOUT (see the top of this
 * file for a rank that voted yes). Generators: work queued on `stream` after
 * this returns reads the committed version. Allowed once per refit begun: in
 * READY, or after refit_progress failed (this rank then votes no);
 * REFIT_ERR_STATE when no begun refit awaits its vote, REFIT_ERR_PEER once a
 * collective of the session missed its deadline.
 */
refit_status_t refit_commit(refit_session_h s, void *stream);

/*
 * Abandon the refit in progress: generators keep or restore version V (sync
 * with restore: none cannot restore: the generator becomes POISONED and
 * refuses to serve until a full successful refit). Idempotent: a second call,
 * or a call in IDLE or POISONED, does nothing and returns REFIT_OK. In
 * RECEIVING it first completes this rank's part of the bucket schedule
 * without landing anything (each bucket within refit.timeout_s), so that its
 * peers reach the vote; then it casts this rank's vote, no (the commit vote's
 * collective, bounded like it), so peers that finish the refit learn at their
 * refit_commit that it failed, and this rank may call refit_begin next (a
 * refit_commit in between returns this rank's failure, once).
 */
refit_status_t refit_abort(refit_session_h s);

refit_state_t refit_state(refit_session_h s);
const char *refit_state_str(refit_state_t state);

/* The last committed version (0 before the first commit). */
uint64_t refit_committed_version(refit_session_h s);

/* Seconds per phase of the last committed refit on this rank. */
typedef struct {
  double source;   /* trainer: produce the new weights */
  double pack;     /* trainer: gather (and prequantize) chunks */
  double transfer; /* waiting on the transport */
  double land;     /* generator: copy, or quantize and lay out, into storage */
  double commit;   /* vote, plus the shadow copy in async mode */
  double total;    /* refit_begin to the end of refit_commit */
} refit_times_t;

refit_status_t refit_last_times(refit_session_h s, refit_times_t *out);

/* Bytes on the wire of the last refit on this rank (refit.delta; all zero
 * with delta off). */
typedef struct {
  int delta;           /* 1: the ranks agreed on a delta refit; 0: a full one */
  uint64_t wire_bytes; /* trainer: bytes it sent; generator: bytes it got */
  uint64_t full_bytes; /* what a full refit moves on this rank */
  int64_t framed_msgs; /* messages that went as delta frames */
  /* Generator: runtime bytes a delta refit found changed (0 in a full
   * refit), and runtime bytes the refit wrote: a delta refit, applied in
   * place, exactly the changed ones; a full refit every chunk's landed
   * bytes (MXFP8 values and scales, or BF16). */
  uint64_t changed_bytes;
  uint64_t written_bytes;
  /* Generator: 1 where this rank applies deltas in place in runtime
   * storage (host or GPU memory: every generator of a session that carries
   * delta refits); 0 where it carries none (refit.delta off, or auto on a
   * session that cannot). */
  int in_place;
} refit_wire_stats_t;

/* Not collective. REFIT_ERR_INVALID_ARGUMENT for a NULL session or out. */
refit_status_t refit_last_wire_stats(refit_session_h s, refit_wire_stats_t *out);

/* What the config says a driver of the lifecycle (refit-run, a test harness)
 * acts on; the same on every rank. */
typedef struct {
  int steps;        /* refit.steps: refits refit-run performs */
  int async;        /* refit.mode: 1 async, 0 sync */
  int mxfp8;        /* refit.precision: 1 mxfp8, 0 bf16 */
  int restore_full; /* refit.restore: 1 full, 0 none */
  int verify;       /* verify: 1 when each refit is to be verified */
  double timeout_s; /* refit.timeout_s: the deadline of every wait */
  int delta;        /* refit.delta: 0 off, 1 on, 2 auto */
  const char *dump; /* dump: the path for refit_dump, "" for none; owned by the
                       session until refit_session_close */
} refit_settings_t;

/* Fill *out from the session's config. Not collective; any time between
 * open and close. REFIT_ERR_INVALID_ARGUMENT for a NULL session or out. */
refit_status_t refit_session_settings(refit_session_h s, refit_settings_t *out);

/* The plan the session runs (the first three fields are the same on every
 * rank) and the memory this rank holds for it beyond its tensors. */
typedef struct {
  int32_t buckets;       /* buckets per refit */
  int64_t messages;      /* messages per refit, all ranks */
  int64_t bytes;         /* weight bytes moved per refit, all ranks (the
                            chunks' digest trailers not counted) */
  int64_t staging_bytes; /* generator: its staging areas, one per exchange in
                            flight (two), each its largest bucket; trainer: 0 */
  int64_t arena_bytes;   /* generator: the assembly arena it holds now (0
                            when no tensor assembles: bf16, mxfp8; or while keep_staging:
                            false has given staging back); trainer: 0 */
} refit_plan_summary_t;

/* Fill *out with the plan's figures. Not collective; any time between open
 * and close. The first refit_begin plans again when the engines registered
 * a tensor in the other precision, so figures read before it may differ from
 * those read after. REFIT_ERR_INVALID_ARGUMENT for a NULL session or out. */
refit_status_t refit_session_plan_summary(refit_session_h s, refit_plan_summary_t *out);

/* Generators: the engine replica this rank belongs to (0 .. engines - 1) and
 * its tensor-parallel rank in it (0 .. generator.tp - 1), as the dump's
 * rank_engine and rank_tp record them. Trainers: 0. A NULL session: -1.
 * Not collective. */
int refit_session_engine(refit_session_h s);
int refit_session_tp_rank(refit_session_h s);

/* 1 when a collective of the session missed its deadline (a peer is dead or
 * stalled): no refit can begin again, and no collective over the job, MPI's
 * own (MPI_Finalize included) among them, can be relied on to complete;
 * restart the job. 0 otherwise, and for a NULL session. Not collective. */
int refit_session_broken(refit_session_h s);

/* Attach caller-owned memory to a tensor this rank holds, instead of the
 * session allocating it: name, shape (ndim 0: bytes only), dtype and size
 * must be one of refit_tensor_get's; every problem is named at once (tensor,
 * rank, expected, actual). Call before the first refit_begin; the memory
 * must stay valid while the session may read or write it. Either register
 * every tensor of the rank or none (source.kind caller: every one on
 * trainers): refit_begin lists the missing ones. Duplicate or unknown names
 * are errors naming the tensor. Generators may register the expert stacks
 * under vLLM's nested spelling (mlp.experts.routed_experts.w13_weight).
 * Trainers may register a tensor again between refits (IDLE) at a new
 * address, e.g. after the distributed optimizer re-grew its buffers: the
 * next refit_begin only rewrites the addresses it reads (no re-planning).
 * Generator storage never moves. On a machine with GPUs the session runs on
 * the rank's GPU and the memory must be device memory of that GPU (also a
 * pointer inside a larger cudaMalloc block, as PyTorch's caching allocator
 * hands out); other memory is refused. */
refit_status_t refit_tensor_register(refit_session_h s, const refit_tensor_t *t);

/*
 * Forget every tensor the caller registered on this rank because the memory
 * is gone: its owner, a framework process attached to a refit agent
 * (docs/agent.md), exited. refit reads and writes none of it again. Allowed
 * between refits (IDLE or POISONED; REFIT_ERR_STATE otherwise); not
 * collective; a rank on which the session allocated every tensor is left as
 * it is. Afterwards every tensor of the rank is registered again, at new
 * addresses (generators too, this once), before the next refit_begin, which
 * names any that are missing. A generator becomes POISONED: its runtime
 * storage holds whatever the new owner loaded, so it serves no version until
 * a full refit, and the next refit is a full one on every rank (as after a
 * trainer's tensor moved).
 */
refit_status_t refit_tensor_forget_all(refit_session_h s);

/*
 * Device memory this process mapped from another process's CUDA IPC handle
 * (cudaIpcOpenMemHandle), as a refit agent maps its clients' tensors: CUDA
 * exports no handle of such a mapping again, so where refit shares the
 * memory with a rank of another process (zero copy) it hands on `handle`
 * (the 64-byte cudaIpcMemHandle_t it was opened from). `base` is what
 * cudaIpcOpenMemHandle returned, `bytes` the allocation's size. Process-wide,
 * not thread-safe; note it before the refit_begin that shares it and forget
 * it (refit_ipc_forget) before closing the mapping. REFIT_ERR_NOT_AVAILABLE
 * in a build without CUDA.
 */
refit_status_t refit_ipc_note(void *base, size_t bytes, const void *handle);
void refit_ipc_forget(void *base);

/* One paragraph about the job and its plan (ranks, bytes, buckets, balance,
 * plan hash, transport), for logs. Not collective. */
void refit_session_describe(refit_session_h s, char *buf, size_t len);

/*
 * Generators: compare runtime storage with what `version` must be, from the
 * config's source and the published sharding rules (no gather). *mismatches
 * counts differing elements; the first is logged with tensor, rank, index,
 * expected and actual. Trainers: *mismatches = 0. Not collective.
 */
refit_status_t refit_verify(refit_session_h s, uint64_t version,
                            int64_t *mismatches);

/*
 * Read the first `bytes` bytes of tensor `index` (cut to its size) where they
 * live, as an inference step reads its weights: a stand-in for serving, for
 * drivers that measure what a refit costs the engine (refit-run serves with
 * it between refit_progress calls). Host memory: a loop on the calling
 * thread; on a GPU one kernel on refit's own stream, waited for, so it queues
 * behind the refit's device work as an engine's kernels contend with it.
 * *value depends on the bytes read, so the reads cannot be optimized away;
 * it means nothing else. Not collective. REFIT_ERR_INVALID_ARGUMENT for a
 * NULL session or value or an index out of range; REFIT_ERR_STATE when the
 * tensor has no memory yet (see refit_tensor_get); a kernel's failure as
 * its status.
 */
refit_status_t refit_tensor_touch(refit_session_h s, int64_t index, size_t bytes,
                                  uint64_t *value);

/*
 * 64-bit FNV-1a over the bytes of every tensor this rank holds, in
 * refit_tensor_get's order, as they stand: ranks holding equal bytes have
 * equal digests (a check, not a cryptographic hash). Call it between
 * refits. Host memory only: REFIT_ERR_NOT_AVAILABLE on a session on a GPU;
 * REFIT_ERR_STATE while a tensor has no memory yet (before the first
 * refit_begin); REFIT_ERR_INVALID_ARGUMENT for a NULL session or out. Not
 * collective.
 */
refit_status_t refit_tensor_digest(refit_session_h s, uint64_t *out);

/*
 * Write every generator rank's runtime storage, as it stands, to one HDF5
 * file at `path` (format "refit-dump-1": a group per generator rank, a
 * dataset per runtime tensor holding its bytes exactly, the config and the
 * committed version as attributes; runtime/src/session/dump.h states the schema).
 * Collective: generator ranks write one after another, trainers take part
 * in the final agreement only. Blocking, every wait bounded by
 * refit.timeout_s (a generator rank's turn by its predecessors' too):
 * REFIT_ERR_TIMEOUT names the step. Call it between refits. REFIT_OK on
 * every rank only when every generator rank wrote its part; when one failed,
 * every rank that did not fail itself returns REFIT_ERR_PEER (a generator
 * rank after the failed one writes nothing); an HDF5 failure is
 * REFIT_ERR_HDF5 naming the file and the tensor. REFIT_ERR_INVALID_ARGUMENT
 * for a NULL session or path.
 */
refit_status_t refit_dump(refit_session_h s, const char *path);

/*
 * Configs without a session. A config read in one process, with no MPI and
 * no ranks: for tools that work from the job's description alone.
 */

/* Opaque handle on a validated config. */
typedef struct refit_config_file *refit_config_h;

/*
 * Read and validate the config at `path` as refit_session_open does, but in
 * this process alone and without the world-size check. Every problem is
 * printed to stderr with file:line:col and nothing is opened: then
 * REFIT_ERR_CONFIG (REFIT_ERR_NOT_AVAILABLE when the only problems are
 * options not implemented yet), or the error of reading the file, is
 * returned, refit_last_error() saying the config was rejected. On success
 * *out owns the config until refit_config_close. Not collective; blocking
 * (reads one file). REFIT_ERR_INVALID_ARGUMENT for a NULL path or out.
 */
refit_status_t refit_config_open(const char *path, refit_config_h *out);

/* Release the config; NULL is ignored. */
void refit_config_close(refit_config_h c);

/* The element type of a checkpoint's tensors. */
typedef enum {
  REFIT_CHECKPOINT_BF16 = 0, /* the synthetic BF16 values as they are */
  REFIT_CHECKPOINT_F32 = 1,  /* widened exactly */
  REFIT_CHECKPOINT_F16 = 2   /* rounded to nearest even */
} refit_checkpoint_dtype_t;

typedef enum {
  REFIT_CHECKPOINT_HDF5 = 0,       /* one file, the schema of source.kind hdf5 */
  REFIT_CHECKPOINT_SAFETENSORS = 1 /* Hugging Face files, source.kind safetensors */
} refit_checkpoint_format_t;

typedef struct {
  refit_checkpoint_format_t format;
  refit_checkpoint_dtype_t dtype;
  uint64_t version; /* the synthetic source's version whose values are written */
  int shards;       /* safetensors: 1 writes one file at the path; more, a directory
                       of that many files and their index. HDF5: 1 */
} refit_checkpoint_options_t;

/* What refit_checkpoint_write wrote. */
typedef struct {
  int64_t tensors;        /* every trainer tensor under its Hugging Face name */
  uint64_t bytes;         /* their data */
  uint64_t seed;          /* source.seed, which the values derive from */
  const char *dtype_name; /* the element type as the file names it ("bfloat16"
                             in HDF5, "BF16" in safetensors); static */
} refit_checkpoint_info_t;

/*
 * Write a checkpoint of the config's model holding the synthetic source's
 * values of opt->version (from source.seed, whatever source the config
 * names), every tensor full (unsharded) under its Hugging Face name, so that
 * source.kind hdf5 or safetensors can read it back. The checkpoint appears at
 * `path` only once complete (written as PATH.tmp, then renamed); a directory
 * of shards may not exist yet. Not collective; blocking; memory bounded by a
 * few million elements whatever the model. *info is set only on success.
 * REFIT_ERR_INVALID_ARGUMENT for a NULL argument, a dtype or format out of
 * range, shards below 1, or several shards of HDF5; REFIT_ERR_HDF5 or
 * REFIT_ERR_SYSTEM naming the file that could not be written.
 */
refit_status_t refit_checkpoint_write(refit_config_h c, const char *path,
                                      const refit_checkpoint_options_t *opt,
                                      refit_checkpoint_info_t *info);

/*
 * Trainer and generator jobs started by separate launches (two mpirun
 * commands, two srun steps): make one communicator of them to open the
 * session over. Collective over `local` (this job's ranks, usually
 * MPI_COMM_WORLD) and, through MPI's ports, with the other job.
 *
 * The generator job opens a port (MPI_Open_port) and its rank 0 writes the
 * port name to `port_file` atomically (a temporary file renamed into place);
 * the trainer job's rank 0 waits for the file, claims it (renames it away,
 * so a port is used once) and connects. The intercommunicator is merged with
 * the trainers first, as refit_session_open expects; *merged is set only on
 * success and belongs to the caller (MPI_Comm_free). Use a path both jobs
 * see and no earlier job left behind (a file of a dead generator of the same
 * host is detected and refused).
 *
 * Before anything is trusted the two roots prove to each other, by a
 * challenge and response with HMAC-SHA256, that they hold the same secret:
 * the key file REFIT_JOIN_KEY_FILE, or `port_file`.key, which the first side
 * to start creates (32 random bytes, mode 0600). It must be a regular file
 * of this user that no one else may read or write, never a symbolic link;
 * otherwise REFIT_ERR_SYSTEM names it. A side that cannot prove the key is
 * refused with REFIT_ERR_PEER and is sent nothing. Files are created with
 * O_EXCL|O_NOFOLLOW.
 *
 * Blocking, bounded by `timeout_s` (at most a day) on each side:
 * REFIT_ERR_TIMEOUT names the file when the other job never came or stalled
 * in the handshake. Neither side enters MPI_Comm_accept or MPI_Comm_connect
 * (which MPI cannot cancel) before the claim shows the other is there;
 * should the other process die between the claim and the connection, or
 * between the handshake and the merge, a watchdog thread aborts this job
 * (MPI_Abort) with a message saying so after another `timeout_s`. MPI must therefore run with
 * MPI_THREAD_MULTIPLE (mpi4py's default), else REFIT_ERR_NOT_AVAILABLE.
 * Under Open MPI's mpirun the two launches must share an ompi-server
 * (`ompi-server --report-uri FILE`, then `mpirun --ompi-server file:FILE ...`
 * for both); without one this returns REFIT_ERR_NOT_AVAILABLE saying so
 * before anything is opened.
 */
refit_status_t refit_comm_join(MPI_Comm local, refit_side_t side,
                               const char *port_file, double timeout_s,
                               MPI_Comm *merged);

/*
 * The MPI library this librefit.so calls, for a caller that brings its own
 * MPI (Python's mpi4py) to check that both are one library: writes
 * MPI_Get_library_version's text into `version` and the file that defines
 * MPI_Init for this library (as the dynamic loader resolved it; "" where it
 * cannot tell) into `path`, each truncated to its length and terminated
 * (either may be NULL with length 0). Callable before MPI_Init, from any
 * thread; does not block.
 */
void refit_mpi_library(char *version, size_t version_len, char *path, size_t path_len);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_REFIT_H */
