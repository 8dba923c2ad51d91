/*
 * CUDA device layer: which GPU a rank uses, device memory, copies, streams,
 * and the CHECK macros that turn CUDA and NCCL failures into refit statuses.
 * Compiled only with REFIT_HAVE_CUDA.
 *
 * Binding: a rank takes GPU (node-local rank mod device count), unless the
 * caller names a device. The node-local rank comes from the launcher
 * (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID) or, failing both, from
 * MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). More ranks than GPUs on a node
 * therefore share GPUs; transports that cannot live with that (NCCL) refuse.
 *
 * Memory is taken with cudaMalloc only, never managed memory.
 */
#ifndef REFIT_DEVICE_H
#define REFIT_DEVICE_H

#include "core/log.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <stddef.h>

/* Translate a failed CUDA/NCCL call into REFIT_ERR_CUDA / REFIT_ERR_NCCL,
 * recording and logging (WARN) the call, file:line and the library's text.
 * They return the refit status; callers use the macros below. */
refit_status_t refit_cuda_error(cudaError_t err, const char *call,
                                const char *file, int line);
refit_status_t refit_nccl_error(ncclResult_t res, ncclComm_t comm,
                                const char *call, const char *file, int line);

#define REFIT_CUDA_CHECK(call)                                                 \
  do {                                                                         \
    cudaError_t cuda_err_ = (call);                                            \
    if (cuda_err_ != cudaSuccess)                                              \
      return refit_cuda_error(cuda_err_, #call, __FILE__, __LINE__);           \
  } while (0)

#define REFIT_CUDA_CHECK_GOTO(call, status_var, label)                         \
  do {                                                                         \
    cudaError_t cuda_err_ = (call);                                            \
    if (cuda_err_ != cudaSuccess) {                                            \
      (status_var) = refit_cuda_error(cuda_err_, #call, __FILE__, __LINE__);   \
      goto label;                                                              \
    }                                                                          \
  } while (0)

/* ncclInProgress is not a failure: non-blocking communicators return it
 * while work is being set up; callers poll ncclCommGetAsyncError. */
#define REFIT_NCCL_CHECK(call, comm)                                           \
  do {                                                                         \
    ncclResult_t nccl_res_ = (call);                                           \
    if (nccl_res_ != ncclSuccess && nccl_res_ != ncclInProgress)               \
      return refit_nccl_error(nccl_res_, (comm), #call, __FILE__, __LINE__);   \
  } while (0)

#define REFIT_NCCL_CHECK_GOTO(call, comm, status_var, label)                   \
  do {                                                                         \
    ncclResult_t nccl_res_ = (call);                                           \
    if (nccl_res_ != ncclSuccess && nccl_res_ != ncclInProgress) {             \
      (status_var) =                                                           \
          refit_nccl_error(nccl_res_, (comm), #call, __FILE__, __LINE__);      \
      goto label;                                                              \
    }                                                                          \
  } while (0)

#define REFIT_DEVICE_BUS_ID_LEN 32
#define REFIT_DEVICE_HOST_LEN 64

typedef struct {
  int count;      /* CUDA devices visible to this process */
  int device;     /* the ordinal this rank is bound to */
  int local_rank; /* node-local rank used for the choice */
  char bus_id[REFIT_DEVICE_BUS_ID_LEN]; /* "0000:19:00.0" */
  char host[REFIT_DEVICE_HOST_LEN];
} refit_device_info_t;

/* Where every rank of a communicator runs, gathered once (collective). */
typedef struct {
  int size;
  int nnodes;    /* distinct hosts */
  int ngpus;     /* distinct (host, bus id) pairs */
  int *node_of;  /* [size] node index of each rank, 0..nnodes-1 */
  int *gpu_of;   /* [size] GPU index of each rank, 0..ngpus-1 */
  int shared_a, shared_b; /* first two ranks on one GPU, or -1 */
} refit_device_locality_t;

/*
 * Number of CUDA devices. A machine without a driver or device is not an
 * error here: *count is 0 and REFIT_OK is returned (tests skip on it).
 */
refit_status_t refit_device_count(int *count);

/*
 * Bind the calling rank to a GPU and fill *info. `device` >= 0 names the
 * ordinal; -1 chooses node-local rank mod device count. Collective over
 * `world` (the ranks' host names are gathered, and count when no launcher
 * variable gives the node-local rank), bounded by timeout_s seconds
 * (REFIT_ERR_TIMEOUT: a peer did not join). REFIT_ERR_CUDA when no device
 * exists or the ordinal is out of range.
 */
refit_status_t refit_device_bind(MPI_Comm world, int device, double timeout_s,
                                 refit_device_info_t *info);

/* Describe the GPU this process is currently bound to (no binding). */
refit_status_t refit_device_info(refit_device_info_t *info);

/*
 * Gather (host, PCI bus id) of the current device of every rank of `comm`
 * (collective, bounded by timeout_s seconds: REFIT_ERR_TIMEOUT when a peer
 * did not join) and number nodes and GPUs. Free with
 * refit_device_locality_free.
 */
refit_status_t refit_device_locality(MPI_Comm comm, double timeout_s,
                                     refit_device_locality_t *loc);
void refit_device_locality_free(refit_device_locality_t *loc);

/* cudaMalloc `bytes` on the current device (never managed memory). */
refit_status_t refit_device_alloc(void **ptr, size_t bytes);
void refit_device_free(void *ptr);

/* Copies between any two of host and device memory (cudaMemcpyDefault). The
 * plain form returns when the copy is complete. memset returns once the
 * legacy default stream is done (not the whole device). */
refit_status_t refit_device_memcpy(void *dst, const void *src, size_t bytes);
refit_status_t refit_device_memcpy_async(void *dst, const void *src,
                                         size_t bytes, cudaStream_t stream);
refit_status_t refit_device_memset(void *ptr, int value, size_t bytes);

/* A non-blocking stream (cudaStreamNonBlocking): transport work on it is not
 * ordered with the legacy default stream in either direction, so unpacking
 * one bucket on the default stream overlaps the transfer of the next, and a
 * transfer stuck on a dead peer never blocks the caller's own copies. */
refit_status_t refit_device_stream_create(cudaStream_t *stream);
void refit_device_stream_destroy(cudaStream_t stream);
/* An event without timing, for completion polling. */
refit_status_t refit_device_event_create(cudaEvent_t *event);
void refit_device_event_destroy(cudaEvent_t event);

/* Poll `event`: *done = 1 when complete, 0 when still pending. */
refit_status_t refit_device_event_done(cudaEvent_t event, int *done);

/*
 * Allocation that contains `ptr`: its base and the offset of `ptr` in it
 * (IPC handles name whole allocations).
 */
refit_status_t refit_device_alloc_range(const void *ptr, void **base,
                                        size_t *size);

#endif /* REFIT_DEVICE_H */
