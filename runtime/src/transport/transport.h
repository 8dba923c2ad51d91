/*
 * Transports move one bucket's messages between trainer and generator ranks.
 *
 * A transport is a table of functions (refit_transport_ops_t). The runtime
 * asks each compiled-in transport, in the order of refit_transports[], whether
 * it can serve the job; with refit.transport: auto the first that can wins,
 * naming one forces it (and an impossible choice is an error).
 *
 * Per pair: the per-pair transport (transport_pairs.c) serves each pair of
 * ranks by the first transport of the same table whose can_connect() accepts
 * the pair's locality facts (refit_transport_for_pair), as NCCL's transports
 * answer canConnect for two peers.
 *
 * One exchange = the sends and receives of one rank for one bucket; it is
 * started without blocking and completed by wait(), which returns
 * REFIT_ERR_TIMEOUT naming the peers still outstanding when the deadline
 * passes, never hangs. At most REFIT_EXCHANGES_IN_FLIGHT exchanges per rank
 * are open at once (double buffering).
 *
 * Memory: a transport moves one kind of memory or both (ops->memory). The
 * MPI transport moves host memory; NCCL and IPC (compiled in with
 * REFIT_HAVE_CUDA) move device memory allocated with cudaMalloc on the GPU
 * the rank is bound to (device.h: refit_device_bind, before opening); UCX
 * moves either, device memory where the UCX build has CUDA transports (its
 * query() says). The caller says which memory its buffers live in
 * (args->memory); transports of the other kind are skipped by auto and
 * refused when named. GPU
 * transports work on their own non-blocking streams: send buffers must be
 * complete when start() is called (synchronize the stream that wrote them),
 * and receive buffers are complete for every stream once wait() succeeds.
 *
 * Registered buffers: a transport that writes into its peers' memory (IPC)
 * needs the receive buffers known before the first exchange. The caller
 * registers them once, collectively, right after opening the transport:
 * every rank calls refit_transport_register() the same number of times, in
 * the same order, passing NULL/0 when it has nothing to register in that
 * round (trainers, typically). Afterwards every receive buffer given to
 * start() must lie inside a buffer this rank registered; send buffers need no
 * registration. Transports that do not need it say so (registers_buffers 0)
 * and take refit_transport_register_none, a no-op. Registrations live until
 * destroy().
 *
 * Full tables: every function of refit_transport_ops_t is set, so that no
 * caller tests for NULL. What a transport does not do is one of the explicit
 * defaults below (refit_transport_register_none, _never_per_pair,
 * _not_per_pair), or its own few lines saying what it does instead (a
 * transport that cannot cancel abandons by a wait whose deadline has
 * passed). refit_transport_check_table() refuses a table with a hole, and
 * refit_transport_open() asks it of the table it chose.
 */
#ifndef REFIT_TRANSPORT_H
#define REFIT_TRANSPORT_H

#include "config/config.h"
#include "mpi/wait.h"

#include <mpi.h>
#include <stddef.h>

#define REFIT_EXCHANGES_IN_FLIGHT 2

typedef enum {
  REFIT_MEMORY_HOST = 0,   /* malloc'd or pinned host memory */
  REFIT_MEMORY_DEVICE = 1, /* cudaMalloc'd memory of the rank's GPU */
  REFIT_MEMORY_ANY = 2     /* ops->memory only: either (its query() decides) */
} refit_memory_t;

typedef struct {
  int peer;    /* rank in the world communicator */
  void *buf;   /* memory of the kind given in args->memory */
  size_t bytes;
  /* Receives only. NULL: the message is exactly `bytes` long (anything else
   * fails the exchange). Otherwise the message may be shorter (at most
   * `bytes`; a longer one still fails) and its length is stored here when
   * the exchange completes: only for transports whose ops->variable_length
   * is 1 (delta refits, runtime/src/session/delta_wire.h). Sends ignore it. */
  size_t *got;
} refit_xfer_t;

typedef struct {
  MPI_Comm world;
  int world_rank, world_size;
  double timeout_s;
  /* Where the buffers of start() live. Zero (host) keeps the MPI transport;
   * device memory selects among the GPU transports. */
  refit_memory_t memory;
  /* The pairs of ranks that exchange bytes: pairs[2i] sends to pairs[2i+1]
   * (world ranks), each pair once, the same list on every rank; the
   * per-pair transport builds its NCCL communicators for them. */
  const int *pairs;
  int npairs;
  /* What one node is when choosing a transport per pair (refit.locality). */
  refit_locality_t locality;
  /* 1: the caller posts receives of variable length (refit_xfer_t.got, delta
   * refits); a transport whose messages have a fixed length is then wrapped
   * (refit_transport_lengths_wrap). */
  int variable_length;
  /* 1: wrap whatever transport is chosen (refit.lengths_ahead). */
  int lengths_ahead;
} refit_transport_args_t;

typedef struct refit_exchange refit_exchange_t;

/* What the per-pair choice knows of two ranks that exchange bytes. */
typedef struct {
  int same_node;         /* one node under refit.locality (a host, or a GPU) */
  int same_gpu;          /* both ranks use one GPU */
  refit_memory_t memory; /* where the buffers live (host or device) */
} refit_pair_facts_t;

/* Where the ranks are, for a transport the per-pair transport opens for some
 * of the job's pairs (create_pairs). */
typedef struct {
  const int *node_of; /* [world size] node of each rank under refit.locality */
  const int *gpu_of;  /* [world size] GPU of each rank */
  int gpus_shared;    /* some two ranks of the world use one GPU */
} refit_pair_locality_t;

typedef struct {
  const char *name;
  refit_transport_kind_t kind;
  /* The memory its buffers must be in (zero-initialized: host). */
  refit_memory_t memory;
  /* 1 when its receives can be shorter than posted and report their length
   * (refit_xfer_t.got); 0 (zero-initialized) when every message must be
   * exactly as long as its receive. */
  int variable_length;
  /* REFIT_OK when this transport can serve the job; otherwise the reason
   * (REFIT_ERR_CONFIG for a job it can never serve). Collective over
   * args->world: every rank gets the same answer. */
  refit_status_t (*query)(const refit_transport_args_t *args);
  refit_status_t (*create)(const refit_transport_args_t *args, void **ctx);
  /* 1 when register_buffer() hands the buffers to the peers once (IPC
   * handles): staging must then stay allocated (refit.keep_staging). */
  int registers_buffers;
  /* Whether this transport can carry the bytes of one pair of ranks, from
   * the pair's facts alone (no communication): the per-pair choice gives the
   * pair to the first transport of refit_transports[] that answers 1
   * (refit_transport_never_per_pair: never). */
  int (*can_connect)(const refit_pair_facts_t *pair);
  /* Create this transport for the pairs the per-pair choice gave it
   * (args->pairs, possibly none), collectively over args->world; leaves *ctx
   * untouched when those pairs need nothing opened (every rank then agrees,
   * having the same pairs). A transport that opens the same way for any
   * pairs calls its create(); one never chosen per pair refuses
   * (refit_transport_not_per_pair). */
  refit_status_t (*create_pairs)(const refit_transport_args_t *args,
                                 const refit_pair_locality_t *loc, void **ctx);
  /* Post every send and receive of one bucket; `tag` tells buckets apart. */
  refit_status_t (*start)(void *ctx, const refit_xfer_t *sends, int nsends,
                          const refit_xfer_t *recvs, int nrecvs, int tag,
                          refit_exchange_t **ex);
  /* Complete an exchange by `deadline` (MPI_Wtime seconds); frees it. */
  refit_status_t (*wait)(void *ctx, refit_exchange_t *ex, double deadline,
                         const char *phase);
  /* Advance an exchange without blocking; *done = 1 when it completed, and
   * then (or on an error) the exchange is freed. Deadlines are the caller's:
   * wait() reports them. */
  refit_status_t (*test)(void *ctx, refit_exchange_t *ex, int *done);
  /* Give up an exchange after a failure: receives are cancelled, sends are
   * left to finish or fail on their own; frees the exchange. The buffers
   * must stay valid until destroy(): a late peer may still touch them. A
   * transport that cannot cancel (IPC, NCCL) waits with a deadline already
   * past, which leaves it unhealthy (NCCL aborts its communicators) until
   * recover(). */
  void (*abandon)(void *ctx, refit_exchange_t *ex);
  void (*destroy)(void *ctx);
  /* Collective over the world: see "Registered buffers" above. `ptr` may be
   * NULL with `bytes` 0. */
  refit_status_t (*register_buffer)(void *ctx, void *ptr, size_t bytes);
  /* 0 once a failed exchange left this rank's side of the transport
   * unusable (an aborted NCCL communicator, IPC copies and messages of a
   * dropped exchange still in flight). */
  int (*healthy)(void *ctx);
  /* Make the transport usable again after a failed refit (or say why it
   * cannot: the session then ends). Collective over the world,
   * entered by every rank at the same point (the next begin, once every
   * rank is known alive and not one has an exchange in flight), healthy or
   * not; bounded by `deadline` (MPI_Wtime seconds). */
  refit_status_t (*recover)(void *ctx, double deadline);
} refit_transport_ops_t;

typedef struct {
  const refit_transport_ops_t *ops;
  void *ctx;
} refit_transport_t;

/* Pick and create the transport for `kind` (REFIT_TRANSPORT_AUTO: first that
 * can serve). */
refit_status_t refit_transport_open(refit_transport_kind_t kind,
                                    const refit_transport_args_t *args,
                                    refit_transport_t *out);
void refit_transport_close(refit_transport_t *t);

/* Receives of variable length over the open transport *t, whatever its
 * own messages allow (transport_lengths.c): each exchange first sends every
 * peer the lengths of its messages over an MPI transport of its own, then
 * the messages with their exact lengths over *t, bodies posted in start
 * order. *t is replaced by the wrapper ("<name>+lengths", the same kind),
 * which owns (and destroys) it; on an
 * error *t is left as it was. Collective over args->world. */
refit_status_t refit_transport_lengths_wrap(refit_transport_t *t,
                                            const refit_transport_args_t *args);

/* The most transports refit_transports[] holds. */
#define REFIT_TRANSPORTS_MAX 8

/* The per-pair choice: the first transport of refit_transports[] whose
 * can_connect() accepts `pair`, or NULL when none does. */
const refit_transport_ops_t *refit_transport_for_pair(const refit_pair_facts_t *pair);

/* The transports the per-pair choice can give some pair whose buffers are in
 * `memory`, in the order of refit_transports[]: stored in out[] (room for
 * REFIT_TRANSPORTS_MAX); returns how many. */
int refit_transport_pair_candidates(refit_memory_t memory,
                                    const refit_transport_ops_t **out);

/* Register a receive buffer with the open transport, collectively (every
 * rank, same number of calls; NULL/0 where a rank has none). */
refit_status_t refit_transport_register(refit_transport_t *t, void *ptr,
                                        size_t bytes);

/* REFIT_OK when every function of `ops` is set; otherwise REFIT_ERR_STATE
 * naming the transport and each missing function. */
refit_status_t refit_transport_check_table(const refit_transport_ops_t *ops);

/* The explicit defaults of a full table. */
/* register_buffer of a transport that needs no registration: a no-op. */
refit_status_t refit_transport_register_none(void *ctx, void *ptr, size_t bytes);
/* can_connect of a transport the per-pair choice never takes: 0. */
int refit_transport_never_per_pair(const refit_pair_facts_t *pair);
/* create_pairs of a transport the per-pair choice never takes:
 * REFIT_ERR_STATE. */
refit_status_t refit_transport_not_per_pair(const refit_transport_args_t *args,
                                            const refit_pair_locality_t *loc, void **ctx);

extern const refit_transport_ops_t refit_transport_mpi;
extern const refit_transport_ops_t refit_transport_ucx;
#ifdef REFIT_HAVE_CUDA
extern const refit_transport_ops_t refit_transport_ipc;
extern const refit_transport_ops_t refit_transport_nccl;
extern const refit_transport_ops_t refit_transport_pairs;
#endif

#endif /* REFIT_TRANSPORT_H */
