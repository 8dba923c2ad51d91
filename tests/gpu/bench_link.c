/*
 * refit-bench-link: GPU0 -> GPU1 bandwidth, raw and through the transports.
 * A benchmark, not a test. Run on 2 ranks, one per GPU:
 *
 *   launch/refit-launch --np 2 --build-dir B tests/gpu/gpu_link.yaml -- \
 *     B/tests/gpu/refit-bench-link [--max-bytes 4GiB-as-bytes] [--iters N]
 *
 * Rank 0 sends, rank 1 receives. For each size (1 MiB .. 4 GiB, doubling):
 *   raw-nccl   ncclSend/ncclRecv on a plain blocking communicator, iterations
 *              queued back to back on one stream
 *   raw-ipc    cudaMemcpyAsync from rank 0 into rank 1's buffer opened with
 *              cudaIpcOpenMemHandle, iterations back to back
 *   nccl       the NCCL transport through the ops: start + wait per iteration
 *   ipc        the IPC transport through the ops (ready/done handshake per
 *              message): start + wait per iteration
 *   ucx        the UCX transport on device memory (tagged send/receive; UCX
 *              picks cuda_ipc between GPUs of one node): start + wait per
 *              iteration; left out, with the reason, where the UCX build has
 *              no CUDA transports
 * time = wall time of the timed iterations (after a barrier and warm-up, up
 * to the end of the last one on both ranks, max over ranks) / iterations;
 * GB/s = size / time / 1e9 (one direction, the bytes of one message);
 * vs_raw = GB/s over raw-nccl's GB/s at the same size. Before each variant
 * the sender fills its buffer with a fresh pattern seed and the receiver
 * poisons its buffer; afterwards the receiver counts the bytes that differ
 * from the pattern (wrong): any nonzero value is an error (exit 1).
 */
#include "device/device.h"
#include "pattern.h"
#include "transport/transport.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { V_RAW_NCCL, V_RAW_IPC, V_NCCL, V_IPC, V_UCX, V_COUNT };
static const char *const vname[V_COUNT] = {"raw-nccl", "raw-ipc", "nccl",
                                           "ipc", "ucx"};

static int g_rank;

#define DIE(...)                                                               \
  do {                                                                         \
    fprintf(stderr, "refit-bench-link: rank %d: ", g_rank);                    \
    fprintf(stderr, __VA_ARGS__);                                              \
    fprintf(stderr, "\n");                                                     \
    MPI_Abort(MPI_COMM_WORLD, 1);                                              \
  } while (0)

#define CK(call)                                                               \
  do {                                                                         \
    if ((call) != REFIT_OK)                                                    \
      DIE("%s: %s", #call, refit_last_error());                                \
  } while (0)

#define CU(call)                                                               \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess)                                                     \
      DIE("%s: %s", #call, cudaGetErrorString(e_));                            \
  } while (0)

#define NC(call)                                                               \
  do {                                                                         \
    ncclResult_t r_ = (call);                                                  \
    if (r_ != ncclSuccess)                                                     \
      DIE("%s: %s", #call, ncclGetErrorString(r_));                            \
  } while (0)

int main(int argc, char **argv) {
  int rank, size, ndev = 0;
  size_t max_bytes = (size_t)4 << 30;
  int max_iters = 50;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  g_rank = rank;
  refit_log_set_rank(rank);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--max-bytes") == 0)
      max_bytes = (size_t)strtoull(argv[i + 1], NULL, 10);
    else if (strcmp(argv[i], "--iters") == 0)
      max_iters = atoi(argv[i + 1]);
  }
  if (size != 2)
    DIE("runs on exactly 2 ranks (one sender, one receiver), got %d", size);
  refit_device_count(&ndev);
  if (ndev == 0)
    DIE("no CUDA device");
  refit_device_info_t info;
  CK(refit_device_bind(MPI_COMM_WORLD, -1, 120.0, &info));
  refit_device_locality_t loc;
  CK(refit_device_locality(MPI_COMM_WORLD, 120.0, &loc));
  const int shared = loc.shared_a >= 0;
  refit_device_locality_free(&loc);

  refit_device_info_t peer_info;
  MPI_Sendrecv(&info, (int)sizeof(info), MPI_BYTE, 1 - rank, 0, &peer_info,
               (int)sizeof(info), MPI_BYTE, 1 - rank, 0, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
  if (rank == 0) {
    char when[64];
    time_t now = time(NULL);
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M UTC", gmtime(&now));
    int nv = 0;
    ncclGetVersion(&nv);
    printf("# refit-bench-link %s on %s: rank 0 GPU %d (bus %s) -> rank 1 GPU "
           "%d (bus %s); NCCL %d; GPUs %s\n",
           when, info.host, info.device, info.bus_id, peer_info.device,
           peer_info.bus_id, nv, shared ? "SHARED (nccl variants skipped)" : "distinct");
    printf("# time: wall per iteration after warm-up, max over ranks; GB/s = "
           "message bytes / time / 1e9; vs_raw = GB/s / raw-nccl GB/s\n");
    printf("%12s  %-8s  %5s  %12s  %8s  %7s  %s\n", "bytes", "variant", "iters",
           "time_us", "GB/s", "vs_raw", "wrong");
    fflush(stdout);
  }

  /* Buffers of the largest size, allocated once. */
  void *buf = NULL;
  CK(refit_device_alloc(&buf, max_bytes));
  cudaStream_t stream;
  CK(refit_device_stream_create(&stream));

  /* Raw NCCL: a plain blocking communicator. */
  ncclComm_t raw = NULL;
  if (!shared) {
    ncclUniqueId id;
    if (rank == 0)
      NC(ncclGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    NC(ncclCommInitRank(&raw, 2, id, rank));
  }
  /* Raw IPC: a second buffer of rank 1, opened by rank 0 (the IPC transport
   * opens `buf` itself; one allocation is not opened twice). */
  void *rawbuf = NULL;
  cudaIpcMemHandle_t h;
  memset(&h, 0, sizeof(h));
  if (rank == 1) {
    CK(refit_device_alloc(&rawbuf, max_bytes));
    CU(cudaIpcGetMemHandle(&h, rawbuf));
  }
  MPI_Bcast(&h, (int)sizeof(h), MPI_BYTE, 1, MPI_COMM_WORLD);
  void *remote = NULL;
  if (rank == 0)
    CU(cudaIpcOpenMemHandle(&remote, h, cudaIpcMemLazyEnablePeerAccess));

  /* The transports, through the ops. */
  refit_transport_args_t args = {.world = MPI_COMM_WORLD,
                                 .world_rank = rank,
                                 .world_size = 2,
                                 .timeout_s = 120,
                                 .memory = REFIT_MEMORY_DEVICE};
  refit_transport_t tn = {0}, ti = {0}, tu = {0};
  if (!shared)
    CK(refit_transport_open(REFIT_TRANSPORT_NCCL, &args, &tn));
  /* query() agrees over the world: every rank gets the same answer. */
  const int have_ucx = refit_transport_open(REFIT_TRANSPORT_UCX, &args, &tu) == REFIT_OK;
  if (!have_ucx && rank == 0)
    printf("# ucx variant left out: %s\n", refit_last_error());
  CK(refit_transport_open(REFIT_TRANSPORT_IPC, &args, &ti));
  CK(refit_transport_register(&ti, rank == 1 ? buf : NULL,
                              rank == 1 ? max_bytes : 0));

  long long total_wrong = 0;
  for (size_t bytes = (size_t)1 << 20; bytes <= max_bytes; bytes *= 2) {
    int iters = (int)(((size_t)8 << 30) / bytes);
    iters = iters > max_iters ? max_iters : iters < 5 ? 5 : iters;
    double raw_gbs = 0;
    for (int v = 0; v < V_COUNT; v++) {
      const int skip = (shared && (v == V_RAW_NCCL || v == V_NCCL)) ||
                       (v == V_UCX && !have_ucx);
      if (skip)
        continue;
      const uint64_t seed = (uint64_t)bytes * 8 + (uint64_t)v;
      void *dst = v == V_RAW_IPC && rank == 1 ? rawbuf : buf;
      if (rank == 0) {
        if (refit_pattern_fill_device(buf, bytes, seed) != 0)
          DIE("pattern fill failed");
      } else {
        CK(refit_device_memset(dst, 0xA5, bytes));
      }
      refit_transport_t *t = v == V_NCCL ? &tn : v == V_UCX ? &tu : &ti;
      refit_xfer_t x = {1 - rank, buf, bytes, NULL};
      double t0 = 0;
      for (int it = -2; it < iters; it++) { /* two warm-up iterations */
        if (it == 0) {
          CU(cudaStreamSynchronize(stream));
          MPI_Barrier(MPI_COMM_WORLD);
          t0 = MPI_Wtime();
        }
        if (v == V_RAW_NCCL) {
          if (rank == 0)
            NC(ncclSend(buf, bytes, ncclUint8, 1, raw, stream));
          else
            NC(ncclRecv(buf, bytes, ncclUint8, 0, raw, stream));
        } else if (v == V_RAW_IPC) {
          if (rank == 0)
            CU(cudaMemcpyAsync(remote, buf, bytes, cudaMemcpyDefault, stream));
        } else {
          refit_exchange_t *ex = NULL;
          CK(t->ops->start(t->ctx, rank == 0 ? &x : NULL, rank == 0,
                           rank == 1 ? &x : NULL, rank == 1, it & 0x3fff, &ex));
          CK(t->ops->wait(t->ctx, ex, MPI_Wtime() + 120, vname[v]));
        }
      }
      CU(cudaStreamSynchronize(stream));
      /* raw-ipc: rank 1 learns of completion from rank 0's barrier. */
      MPI_Barrier(MPI_COMM_WORLD);
      double dt = (MPI_Wtime() - t0) / iters, dtmax = 0;
      MPI_Allreduce(&dt, &dtmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      unsigned long long wrong = 0;
      if (rank == 1 && refit_pattern_check_device(dst, bytes, seed, &wrong) != 0)
        DIE("pattern check failed");
      MPI_Bcast(&wrong, 1, MPI_UNSIGNED_LONG_LONG, 1, MPI_COMM_WORLD);
      total_wrong += (long long)wrong;
      const double gbs = (double)bytes / dtmax / 1e9;
      if (v == V_RAW_NCCL)
        raw_gbs = gbs;
      if (rank == 0) {
        char ratio[16] = "n/a";
        if (raw_gbs > 0)
          snprintf(ratio, sizeof(ratio), "%.2f", gbs / raw_gbs);
        printf("%12zu  %-8s  %5d  %12.1f  %8.2f  %7s  %llu\n", bytes, vname[v],
               iters, dtmax * 1e6, gbs, ratio, wrong);
        fflush(stdout);
      }
    }
  }
  refit_transport_close(&ti);
  refit_transport_close(&tn);
  if (have_ucx)
    refit_transport_close(&tu);
  if (remote != NULL)
    cudaIpcCloseMemHandle(remote);
  if (raw != NULL)
    ncclCommDestroy(raw);
  refit_device_stream_destroy(stream);
  refit_device_free(buf);
  refit_device_free(rawbuf);
  if (rank == 0)
    printf("# refit-bench-link: %s (%lld wrong bytes in all)\n",
           total_wrong ? "ERRORS" : "all bytes verified", total_wrong);
  MPI_Finalize();
  return total_wrong ? 1 : 0;
}
