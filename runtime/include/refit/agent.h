/*
 * refit/agent.h: the C client of a refit agent (docs/agent.md), for C and
 * C++ engines and trainers that are not ranks of refit's MPI job.
 *
 * A framework process (an engine worker, a trainer rank under torchrun)
 * attaches to the agent of its rank over a local Unix socket, learns which
 * tensors its rank holds, hands its memory over by handle (host memory as a
 * shared-memory file descriptor, GPU memory as a CUDA IPC handle) and asks
 * for refits. The agent maps each allocation once and refits in place.
 *
 * librefit-agent.so links no MPI, no librefit and no CUDA: it speaks the
 * attach protocol (a 16-byte frame and a JSON object per message, descriptors
 * by SCM_RIGHTS) and nothing else. In particular it makes no CUDA call: a GPU
 * caller obtains the IPC handles of its allocations and of an interprocess
 * event itself (cudaIpcGetMemHandle, cudaEventCreateWithFlags with
 * cudaEventInterprocess | cudaEventDisableTiming, cudaIpcGetEventHandle),
 * passes them in, and orders its own streams:
 *
 *   - before each refit_agent_client_begin or _refit, record the begin event
 *     (whose handle went in the hello) on the stream that wrote the tensors:
 *     the agent's stream waits on it before refit reads or writes a byte;
 *   - after each _commit or _refit, make the stream that reads the tensors
 *     wait on the agent's commit event (refit_agent_client_commit_event: open
 *     it once with cudaIpcOpenEventHandle): work queued after it sees the new
 *     weights. Neither blocks the host.
 *
 *     refit_agent_client_h c;
 *     if (refit_agent_client_attach(REFIT_AGENT_GENERATOR, rank, NULL, NULL, &c))
 *       die(refit_last_error());
 *     for (int64_t i = 0; i < refit_agent_client_expected_count(c); i++) {
 *       refit_agent_tensor_t t;
 *       refit_agent_client_expected_get(c, i, &t);
 *       ... allocate t.bytes (refit_agent_alloc_shared), describe it ...
 *     }
 *     refit_agent_client_register_host(c, tensors, n);
 *     for (;;) {
 *       uint64_t v;
 *       refit_agent_client_next_version(c, -1.0, &v);  // waits for the trainers
 *       refit_agent_client_refit(c, v);                // the new weights are in place
 *     }
 *
 * Errors: every function returns a refit_status_t (refit/status.h). The
 * sentence for a failure, the client's own or the one the agent sent (naming
 * the rank, tensor, version), is refit_last_error() on the calling thread;
 * what another rank said of its own failure, when one did, is
 * refit_agent_client_cause(). A status the agent names that this library
 * does not know becomes REFIT_ERR_INTERNAL.
 *
 * Threads: a client is used by one thread at a time (one request at a time
 * on its socket). Different clients are independent.
 *
 * Waits: connecting, the hello and every request that the agent answers at
 * once are bounded by the client's timeout (refit_agent_client_set_timeout,
 * 60 s by default). begin and refit wait without a deadline for the other
 * ranks (the agents refuse a round whose ranks do not come, within their
 * attach grace and refit.timeout_s), and next_version for as long as its
 * caller asked. A request whose reply does not come in time, or a connection
 * that fails, closes the client's connection: every later request returns
 * REFIT_ERR_STATE, and the process attaches again with a new client.
 */
#ifndef REFIT_AGENT_H
#define REFIT_AGENT_H

#include "refit/status.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque client handle: one attached connection to one agent. */
typedef struct refit_agent_client *refit_agent_client_h;

typedef enum { REFIT_AGENT_TRAINER = 0, REFIT_AGENT_GENERATOR = 1 } refit_agent_side_t;

/* The element types of refit's tensors, in refit_tensor_dtype_t's order.
 * float8 tensors are bytes; bfloat16 are uint16 bit patterns; float32 is
 * DeepSeek's e_score_correction_bias and block FP8's weight_scale_inv;
 * uint8 is NVFP4's packed weight. */
typedef enum {
  REFIT_AGENT_BFLOAT16 = 0,
  REFIT_AGENT_FLOAT8_E4M3FN = 1,
  REFIT_AGENT_FLOAT8_E8M0FNU = 2,
  REFIT_AGENT_FLOAT32 = 3,
  REFIT_AGENT_UINT8 = 4
} refit_agent_dtype_t;

/* The protocol's name of a dtype ("bfloat16"); "?" for a value out of range. */
const char *refit_agent_dtype_name(refit_agent_dtype_t dtype);

/* Bytes of a CUDA IPC handle (cudaIpcMemHandle_t, cudaIpcEventHandle_t). */
#define REFIT_AGENT_IPC_HANDLE_BYTES 64
/* Dimensions of a tensor at most. */
#define REFIT_AGENT_MAX_DIMS 3

/* A tensor's description: what the rank expects, and what a registration
 * says of the caller's memory. Contiguous, row-major. */
typedef struct {
  const char *name;
  int ndim;
  int64_t shape[REFIT_AGENT_MAX_DIMS];
  refit_agent_dtype_t dtype;
  size_t bytes;
} refit_agent_tensor_t;

/* A host tensor: `bytes` at byte `offset` of the shared-memory file open as
 * `fd` (a memfd, a file under /dev/shm; see refit_agent_alloc_shared). */
typedef struct {
  refit_agent_tensor_t tensor;
  int fd;
  size_t offset;
} refit_agent_host_tensor_t;

/* A GPU tensor: `bytes` at byte `offset` of the device allocation whose CUDA
 * IPC handle (cudaIpcGetMemHandle of the allocation's base) is `handle`, and
 * which is `alloc_bytes` long. The allocation must be on the agent's GPU
 * (refit_agent_info_t.device). */
typedef struct {
  refit_agent_tensor_t tensor;
  unsigned char handle[REFIT_AGENT_IPC_HANDLE_BYTES];
  size_t offset;
  size_t alloc_bytes;
} refit_agent_device_tensor_t;

/* What the agent said of its rank in reply to the hello. */
typedef struct {
  refit_agent_side_t side;
  int rank;           /* within the side: trainer RANK, engine * tp + tp_rank */
  int world_rank;     /* in the agents' MPI job (trainers first) */
  int engine;         /* generators: the engine replica; trainers: 0 */
  int tp_rank;        /* generators: rank within the engine */
  int async;          /* 1: refit.mode async (the engine serves while it fills) */
  int device;         /* the agent's CUDA device, or -1: host memory */
  uint64_t committed; /* the version committed when the client attached */
} refit_agent_info_t;

/* Seconds per phase and wire bytes of the last committed refit on the
 * agent's rank (refit_times_t and refit_wire_stats_t of refit/refit.h). */
typedef struct {
  double source, pack, transfer, land, commit, total;
  int delta;              /* 1: a delta refit; 0: a full one */
  uint64_t wire_bytes;    /* trainer: bytes sent; generator: bytes received */
  uint64_t full_bytes;    /* what a full refit moves on this rank */
  uint64_t changed_bytes; /* generator: bytes a delta refit found changed */
  uint64_t written_bytes; /* generator: runtime bytes the refit wrote */
} refit_agent_times_t;

/* ---- attaching --------------------------------------------------------- */

/*
 * Attach to the agent of `side` rank `rank`: its socket is
 * DIR/<side>.<rank>.sock, DIR `socket_dir`, else $REFIT_AGENT_DIR, else
 * /tmp/refit-agent-<uid> (where refit-agent puts it). Connects, sends the
 * hello and keeps the reply (refit_agent_client_info, _expected_*).
 *
 * `begin_event`: GPU ranks need the CUDA IPC handle (64 bytes) of an
 * interprocess event the caller records on its stream before each begin;
 * NULL on host ranks (a GPU rank's agent refuses a hello without one).
 * Copied; the event stays the caller's.
 *
 * On success *out is the client, owned by the caller until
 * refit_agent_client_close. Blocking, bounded by the default timeout.
 * Errors: REFIT_ERR_INVALID_ARGUMENT for a bad side, a negative rank, a
 * NULL out, or a path too long for a socket; REFIT_ERR_NOT_AVAILABLE when
 * no agent listens there (start the agents first); REFIT_ERR_SYSTEM when
 * connecting fails otherwise; the agent's refusal (REFIT_ERR_STATE when
 * another process is attached to the rank, naming its pid;
 * REFIT_ERR_INVALID_ARGUMENT for the wrong side or a missing begin event).
 */
refit_status_t refit_agent_client_attach(refit_agent_side_t side, int rank,
                                         const char *socket_dir,
                                         const unsigned char *begin_event,
                                         refit_agent_client_h *out);

/* Attach to the agent listening at socket `path` (as above, with the side
 * not checked). */
refit_status_t refit_agent_client_attach_path(const char *path,
                                              const unsigned char *begin_event,
                                              refit_agent_client_h *out);

/* Detach: close the connection and free the client; the agent forgets this
 * process's tensors and waits for the next process. Not collective, never
 * blocks; NULL is ignored. Memory the caller registered stays the caller's
 * (unmap it after closing). */
void refit_agent_client_close(refit_agent_client_h c);

/* The bound, in seconds (> 0), of every request answered at once (default
 * 60). REFIT_ERR_INVALID_ARGUMENT for a NULL client or a bound <= 0. */
refit_status_t refit_agent_client_set_timeout(refit_agent_client_h c, double timeout_s);

/* What the agent said of its rank (copied into *out). Not blocking.
 * REFIT_ERR_INVALID_ARGUMENT for NULL arguments. */
refit_status_t refit_agent_client_info(refit_agent_client_h c, refit_agent_info_t *out);

/* GPU ranks: the CUDA IPC handle of the agent's commit event (64 bytes into
 * out), recorded on the agent's stream after each commit. Not blocking.
 * REFIT_ERR_STATE on a host rank (there is none). */
refit_status_t
refit_agent_client_commit_event(refit_agent_client_h c,
                                unsigned char out[REFIT_AGENT_IPC_HANDLE_BYTES]);

/* The causes another rank gave for the last failure (what it said of its
 * own failure: side, rank, pid, version), or "" when none. Valid until the
 * next request on `c`. */
const char *refit_agent_client_cause(refit_agent_client_h c);

/* ---- the tensors this rank holds ----------------------------------------- */

/* How many tensors the rank expects (Megatron-Core's names on trainers,
 * vLLM's on engines); -1 for a NULL client. Not blocking. */
int64_t refit_agent_client_expected_count(refit_agent_client_h c);

/* Tensor `index` (0 to count - 1) of that list into *out; out->name stays
 * owned by the client, valid until refit_agent_client_close. Not blocking.
 * REFIT_ERR_INVALID_ARGUMENT for an index out of range or NULL arguments. */
refit_status_t refit_agent_client_expected_get(refit_agent_client_h c, int64_t index,
                                               refit_agent_tensor_t *out);

/*
 * Register `n` host tensors. The agent checks every one (name, dtype, shape,
 * size, that it lies inside its file) before it registers any, and maps each
 * file once; the reply names every tensor refused and why. The memory stays
 * the caller's: keep it mapped and the contents untouched during a refit
 * (the agent writes an engine's tensors, reads a trainer's). The descriptors
 * stay the caller's too (the agent gets duplicates); close them whenever.
 *
 * A batch sees at most 64 distinct descriptors per message: a larger one is
 * sent as several messages, each checked whole. Blocking, bounded by the
 * client's timeout. Errors: REFIT_ERR_INVALID_ARGUMENT for NULL arguments, a
 * tensor without a name, a negative fd, more than 3 dimensions, or the
 * agent's refusal (its sentence names each tensor); REFIT_ERR_STATE on a GPU
 * rank (whose agent takes device memory) or a closed client.
 */
refit_status_t refit_agent_client_register_host(refit_agent_client_h c,
                                                const refit_agent_host_tensor_t *tensors,
                                                size_t n);

/* Register `n` GPU tensors by CUDA IPC handle (as register_host, one
 * message; the agent opens each handle once). REFIT_ERR_STATE on a host
 * rank. */
refit_status_t
refit_agent_client_register_device(refit_agent_client_h c,
                                   const refit_agent_device_tensor_t *tensors, size_t n);

/*
 * Shared host memory for tensors: a memfd of `bytes` (> 0) mapped read-write
 * into *ptr, its descriptor in *fd (close-on-exec). Zero-filled. The caller
 * owns both and frees them with refit_agent_free_shared (after closing the
 * client, or after the agent forgot the tensors). Not blocking.
 * REFIT_ERR_INVALID_ARGUMENT for bytes == 0 or NULL outputs, REFIT_ERR_SYSTEM
 * when memfd_create, ftruncate or mmap fails. Outputs are set only on
 * success.
 */
refit_status_t refit_agent_alloc_shared(size_t bytes, void **ptr, int *fd);

/* Unmap and close what refit_agent_alloc_shared made. NULL ptr or fd < 0:
 * that part is skipped. */
void refit_agent_free_shared(void *ptr, size_t bytes, int fd);

/* ---- refits -------------------------------------------------------------- */

/*
 * Start refitting `version` (>= 1): trainers ask for it, engines accept it
 * (the one next_version returned). Returns once every rank's process is in
 * and the agents began together. Waits without a deadline; the agents
 * refuse the round (REFIT_ERR_PEER, naming the ranks) when a rank has no
 * process attached within the attach grace, a process goes away, a rank asks
 * for another version, or a rank does not come within refit.timeout_s.
 */
refit_status_t refit_agent_client_begin(refit_agent_client_h c, uint64_t version);

/* One bucket of the refit begun (refit_progress); *done = 1 once this rank's
 * part is complete. Bounded by the client's timeout. */
refit_status_t refit_agent_client_progress(refit_agent_client_h c, int *done);

/* The vote: the new version on every rank or on none. On success *version
 * (NULL: not returned) is the committed version. Bounded by the client's
 * timeout. A failed vote is REFIT_ERR_PEER with the other ranks' causes. */
refit_status_t refit_agent_client_commit(refit_agent_client_h c, uint64_t *version);

/* Roll the refit in flight back (refit_abort; the commit that follows votes
 * no). Bounded by the client's timeout. */
refit_status_t refit_agent_client_abort(refit_agent_client_h c);

/*
 * A whole refit of `version` in one round trip: begin, every progress and
 * commit, in the agent. Waits as begin does (no deadline for the other ranks
 * to come), then for the refit under the session's deadlines. On success the
 * version is committed everywhere and the times are in
 * refit_agent_client_last_times.
 */
refit_status_t refit_agent_client_refit(refit_agent_client_h c, uint64_t version);

/*
 * Engines: the version the trainers began, into *version (0: none came).
 * timeout_s < 0 waits without a deadline, 0 polls, > 0 waits that long.
 * REFIT_ERR_STATE on a trainer (trainers decide versions).
 */
refit_status_t refit_agent_client_next_version(refit_agent_client_h c, double timeout_s,
                                               uint64_t *version);

/*
 * Engines: compare the runtime storage of this rank with the config's
 * reference of `version` (0: the committed one); *mismatches counts the
 * elements that differ (0: every byte as it must be; the first mismatch is
 * in the agent's log). Trainers: 0. Bounded by the client's timeout. A
 * config with no reference to compare with (source.kind caller without
 * reference:) is the agent's error.
 */
refit_status_t refit_agent_client_verify(refit_agent_client_h c, uint64_t version,
                                         int64_t *mismatches);

/* The agent's session: its state ("idle: ...", refit_state_str) into
 * `state` (len bytes, cut to fit; NULL: not returned) and the committed
 * version into *committed (NULL: not returned). Bounded. */
refit_status_t refit_agent_client_status(refit_agent_client_h c, char *state, size_t len,
                                         uint64_t *committed);

/* The times of the last refit this client committed (zero before one).
 * Not blocking. */
refit_status_t refit_agent_client_last_times(refit_agent_client_h c,
                                             refit_agent_times_t *out);

/* Stop every agent of the job (a trainer's last step), then close the
 * connection (the client must still be closed). Bounded. */
refit_status_t refit_agent_client_shutdown(refit_agent_client_h c);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_AGENT_H */
