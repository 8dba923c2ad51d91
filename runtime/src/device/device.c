/*
 * CUDA device layer (see device.h).
 */
#include "device/device.h"
#include "mpi/wait.h"

#include "core/env.h"

#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

refit_status_t refit_cuda_error(cudaError_t err, const char *call,
                                const char *file, int line) {
  refit_status_t st =
      REFIT_ERR(REFIT_ERR_CUDA, "%s failed at %s:%d: %s (%s)", call, file, line,
                cudaGetErrorName(err), cudaGetErrorString(err));
  REFIT_WARN("%s", refit_last_error());
  return st;
}

refit_status_t refit_nccl_error(ncclResult_t res, ncclComm_t comm,
                                const char *call, const char *file, int line) {
  /* ncclGetLastError has the detail (which peer, which system call) that the
   * result code lacks. */
  const char *detail = ncclGetLastError(comm);
  refit_status_t st = REFIT_ERR(REFIT_ERR_NCCL, "%s failed at %s:%d: %s%s%s",
                                call, file, line, ncclGetErrorString(res),
                                detail && *detail ? ": " : "",
                                detail ? detail : "");
  REFIT_WARN("%s", refit_last_error());
  return st;
}

refit_status_t refit_device_count(int *count) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    /* No driver, or no device: a fact about the machine, not a failure. */
    REFIT_INFO("cudaGetDeviceCount: %s (%s): no usable GPU",
               cudaGetErrorName(err), cudaGetErrorString(err));
    (void)cudaGetLastError();
    n = 0;
  }
  *count = n;
  return REFIT_OK;
}

/* Node-local rank from the launcher's variables, else the number of lower
 * ranks of `world` on this host (the host names are always gathered, so
 * that the call stays collective; bounded by timeout_s). */
static refit_status_t refit_device_local_rank(MPI_Comm world, double timeout_s, int *out) {
  int rank = 0, size = 0, split_rank = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  /* The gather's buffers outlive a missed deadline: kept then. */
  char *names = calloc((size_t)size + 1, REFIT_DEVICE_HOST_LEN);
  if (names == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "node-local rank: host names of %d ranks", size);
  char *mine = names + (size_t)size * REFIT_DEVICE_HOST_LEN;
  gethostname(mine, REFIT_DEVICE_HOST_LEN - 1);
  MPI_Request req;
  refit_status_t st = refit_mpi_startup(
      MPI_Iallgather(mine, REFIT_DEVICE_HOST_LEN, MPI_CHAR, names, REFIT_DEVICE_HOST_LEN,
                     MPI_CHAR, world, &req),
      &req, MPI_Wtime() + timeout_s, "binding GPUs: gathering host names");
  if (st != REFIT_OK) {
    if (st != REFIT_ERR_TIMEOUT)
      free(names);
    return st;
  }
  for (int r = 0; r < rank; r++)
    split_rank += strcmp(names + (size_t)r * REFIT_DEVICE_HOST_LEN, mine) == 0;
  free(names);

  /* In order of precedence (core/env.h). */
  static const char *const vars[] = {"REFIT_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                     "SLURM_LOCALID", "MPI_LOCALRANKID"};
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
    int64_t r = 0;
    int set = 0;
    REFIT_CHECK(refit_env_int(vars[i], &r, &set));
    if (!set)
      continue;
    *out = (int)r;
    return REFIT_OK;
  }
  *out = split_rank;
  return REFIT_OK;
}

refit_status_t refit_device_info(refit_device_info_t *info) {
  refit_device_info_t d;
  memset(&d, 0, sizeof(d));
  d.local_rank = info->local_rank;
  REFIT_CUDA_CHECK(cudaGetDeviceCount(&d.count));
  REFIT_CUDA_CHECK(cudaGetDevice(&d.device));
  REFIT_CUDA_CHECK(
      cudaDeviceGetPCIBusId(d.bus_id, (int)sizeof(d.bus_id), d.device));
  gethostname(d.host, sizeof(d.host) - 1);
  d.host[sizeof(d.host) - 1] = '\0';
  *info = d;
  return REFIT_OK;
}

refit_status_t refit_device_bind(MPI_Comm world, int device, double timeout_s,
                                 refit_device_info_t *info) {
  int count = 0, local = 0;
  REFIT_CHECK(refit_device_local_rank(world, timeout_s, &local));
  REFIT_CHECK(refit_device_count(&count));
  if (count == 0)
    return REFIT_ERR(REFIT_ERR_CUDA,
                     "binding a GPU: no CUDA device is visible to this rank "
                     "(CUDA_VISIBLE_DEVICES='%s')",
                     getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES")
                                                    : "");
  if (device >= count)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "binding a GPU: device %d requested but only %d visible",
                     device, count);
  const int chosen = device >= 0 ? device : local % count;
  REFIT_CUDA_CHECK(cudaSetDevice(chosen));
  /* Create the context now so that its cost and failures show up here. */
  REFIT_CUDA_CHECK(cudaFree(NULL));
  refit_device_info_t d = {.local_rank = local};
  REFIT_CHECK(refit_device_info(&d));
  REFIT_INFO("bound to GPU %d of %d (bus %s, node-local rank %d)", d.device,
             d.count, d.bus_id, local);
  *info = d;
  return REFIT_OK;
}

typedef struct {
  char host[REFIT_DEVICE_HOST_LEN];
  char bus_id[REFIT_DEVICE_BUS_ID_LEN];
} refit_device_where_t;

refit_status_t refit_device_locality(MPI_Comm comm, double timeout_s,
                                     refit_device_locality_t *loc) {
  refit_status_t st = REFIT_OK;
  refit_device_info_t me = {0};
  refit_device_where_t mine, *all = NULL;
  refit_device_locality_t l = {.shared_a = -1, .shared_b = -1};

  /* Every rank must enter the allgather even when its own query failed, or
   * the others would wait forever; a failed rank sends an empty record and
   * the failure is agreed on afterwards. */
  refit_status_t mine_st = refit_device_info(&me);
  memset(&mine, 0, sizeof(mine));
  if (mine_st == REFIT_OK) {
    memcpy(mine.host, me.host, sizeof(mine.host));
    memcpy(mine.bus_id, me.bus_id, sizeof(mine.bus_id));
  }
  MPI_Comm_size(comm, &l.size);
  /* [size] everyone's, then mine; and the agreement's two ints: buffers
   * that outlive a missed deadline (kept then). */
  all = calloc((size_t)l.size + 1, sizeof(*all));
  int *agree = calloc(2, sizeof(int));
  l.node_of = calloc((size_t)l.size, sizeof(int));
  l.gpu_of = calloc((size_t)l.size, sizeof(int));
  if (all == NULL || agree == NULL || l.node_of == NULL || l.gpu_of == NULL) {
    free(agree);
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "device locality of %d ranks", l.size);
    goto err;
  }
  all[l.size] = mine;
  const double deadline = MPI_Wtime() + timeout_s;
  MPI_Request req;
  st = refit_mpi_startup(MPI_Iallgather(&all[l.size], (int)sizeof(mine), MPI_BYTE, all,
                                        (int)sizeof(mine), MPI_BYTE, comm, &req),
                         &req, deadline, "device locality: gathering GPUs");
  agree[0] = mine_st == REFIT_OK;
  if (st == REFIT_OK)
    st = refit_mpi_startup(
        MPI_Iallreduce(&agree[0], &agree[1], 1, MPI_INT, MPI_MIN, comm, &req), &req,
        deadline, "device locality: agreeing");
  if (st != REFIT_OK) {
    if (st == REFIT_ERR_TIMEOUT)
      all = NULL; /* MPI may still write them: kept */
    else
      free(agree);
    goto err;
  }
  const int all_ok = agree[1];
  free(agree);
  if (!all_ok) {
    st = mine_st != REFIT_OK
             ? mine_st
             : REFIT_ERR(REFIT_ERR_PEER,
                         "device locality: another rank has no usable GPU");
    goto err;
  }
  /* Quadratic in ranks, run once at start-up over at most a few thousand. */
  for (int r = 0; r < l.size; r++) {
    l.node_of[r] = -1;
    l.gpu_of[r] = -1;
    for (int q = 0; q < r; q++) {
      if (strcmp(all[q].host, all[r].host) != 0)
        continue;
      l.node_of[r] = l.node_of[q];
      if (strcmp(all[q].bus_id, all[r].bus_id) == 0) {
        l.gpu_of[r] = l.gpu_of[q];
        if (l.shared_a < 0) {
          l.shared_a = q;
          l.shared_b = r;
        }
        break;
      }
    }
    if (l.node_of[r] < 0)
      l.node_of[r] = l.nnodes++;
    if (l.gpu_of[r] < 0)
      l.gpu_of[r] = l.ngpus++;
  }
  free(all);
  *loc = l;
  return REFIT_OK;

err:
  free(all);
  refit_device_locality_free(&l);
  return st;
}

void refit_device_locality_free(refit_device_locality_t *loc) {
  free(loc->node_of);
  free(loc->gpu_of);
  loc->node_of = NULL;
  loc->gpu_of = NULL;
}

refit_status_t refit_device_alloc(void **ptr, size_t bytes) {
  void *p = NULL;
  cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    refit_status_t st =
        REFIT_ERR(REFIT_ERR_NO_MEMORY, "cudaMalloc of %zu bytes failed: %s (%s)",
                  bytes, cudaGetErrorName(err), cudaGetErrorString(err));
    REFIT_WARN("%s", refit_last_error());
    return st;
  }
  *ptr = p;
  return REFIT_OK;
}

void refit_device_free(void *ptr) {
  if (ptr != NULL)
    cudaFree(ptr);
}

refit_status_t refit_device_memcpy(void *dst, const void *src, size_t bytes) {
  REFIT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  return REFIT_OK;
}

refit_status_t refit_device_memcpy_async(void *dst, const void *src,
                                         size_t bytes, cudaStream_t stream) {
  REFIT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  return REFIT_OK;
}

refit_status_t refit_device_memset(void *ptr, int value, size_t bytes) {
  REFIT_CUDA_CHECK(cudaMemset(ptr, value, bytes));
  /* The legacy stream only: a device-wide synchronize would also wait for
   * transport kernels, which may be waiting on a peer. */
  REFIT_CUDA_CHECK(cudaStreamSynchronize(0));
  return REFIT_OK;
}

refit_status_t refit_device_stream_create(cudaStream_t *stream) {
  REFIT_CUDA_CHECK(cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking));
  return REFIT_OK;
}

void refit_device_stream_destroy(cudaStream_t stream) {
  if (stream != NULL)
    cudaStreamDestroy(stream);
}

refit_status_t refit_device_event_create(cudaEvent_t *event) {
  REFIT_CUDA_CHECK(cudaEventCreateWithFlags(event, cudaEventDisableTiming));
  return REFIT_OK;
}

void refit_device_event_destroy(cudaEvent_t event) {
  if (event != NULL)
    cudaEventDestroy(event);
}

refit_status_t refit_device_event_done(cudaEvent_t event, int *done) {
  cudaError_t err = cudaEventQuery(event);
  if (err == cudaErrorNotReady) {
    *done = 0;
    return REFIT_OK;
  }
  if (err != cudaSuccess)
    return refit_cuda_error(err, "cudaEventQuery(event)", __FILE__, __LINE__);
  *done = 1;
  return REFIT_OK;
}

/* cuMemGetAddressRange through the runtime's entry-point lookup: linking
 * libcuda directly would make every binary of the project need a driver to
 * start, also on machines that only build or run the CPU tests. */
typedef CUresult (*refit_cu_mem_get_address_range_t)(CUdeviceptr *base,
                                                      size_t *size,
                                                      CUdeviceptr ptr);

refit_status_t refit_device_alloc_range(const void *ptr, void **base,
                                        size_t *size) {
  static refit_cu_mem_get_address_range_t fn = NULL;
  if (fn == NULL) {
    void *sym = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    REFIT_CUDA_CHECK(cudaGetDriverEntryPointByVersion(
        "cuMemGetAddressRange", &sym, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || sym == NULL)
      return REFIT_ERR(REFIT_ERR_CUDA,
                       "the driver has no cuMemGetAddressRange (query %d)",
                       (int)q);
    fn = (refit_cu_mem_get_address_range_t)(uintptr_t)sym;
  }
  CUdeviceptr b = 0;
  size_t s = 0;
  CUresult r = fn(&b, &s, (CUdeviceptr)(uintptr_t)ptr);
  if (r != CUDA_SUCCESS)
    return REFIT_ERR(REFIT_ERR_CUDA,
                     "cuMemGetAddressRange(%p) failed with CUresult %d: not "
                     "device memory of this process",
                     ptr, (int)r);
  *base = (void *)(uintptr_t)b;
  *size = s;
  return REFIT_OK;
}
