/*
 * GPU transports through the transport ops, on 2 to 4 MPI ranks (started by
 * run_gpu.sh through launch/refit-launch).
 *
 * Every rank sends to and receives from every other rank in each bucket, two
 * buckets in flight (as the session does), with message sizes drawn per
 * (bucket, sender, receiver) and placed at odd offsets in two staging areas
 * that are sub-ranges of one cudaMalloc allocation (so IPC must carry the
 * offset within the allocation). Staging is poisoned before each bucket;
 * after it completes every byte of the staging area is checked on the host:
 * each message against refit_pattern_byte, each gap still poison.
 *
 *   test_gpu_transport --transport nccl|ipc|ucx|auto [--same-gpu] [--buckets N]
 *                      [--timeout S] [--expect NAME] [--locality host|gpu]
 *                      [--die-rank R --die-bucket B] [--lengths]
 *
 * --lengths wraps the transport in the lengths wrapper (transport_lengths.c,
 * what delta refits over NCCL use): some messages are then empty, every
 * receive is posted for GAP bytes more than its message and must report
 * the message's exact length (refit_xfer_t.got), the GAP bytes after it
 * still poison. NCCL on ranks that share a GPU is skipped then.
 *
 * --locality gpu makes each GPU a node for auto (refit.locality: gpu): ranks
 * of one GPU then exchange over CUDA IPC and all other pairs over NCCL (the
 * per-pair "ipc+nccl" transport, as across hosts), on one machine.
 * --same-gpu binds every rank to GPU 0. A forced NCCL on ranks that share a
 * GPU must be refused with REFIT_ERR_CONFIG (checked, then PASS). With
 * --die-rank, rank R kills itself (SIGKILL) right after starting bucket B;
 * every other rank must get an error from wait() within the deadline, and a
 * later start() must fail rather than hang. Those runs end without
 * MPI_Finalize (a peer is gone) and print "dead-peer: PASS|FAIL".
 * Exit 77 (skip) when no rank sees a CUDA device, or for --transport ucx
 * when the UCX build has no CUDA transports (the reason is printed).
 */
#include "device/device.h"
#include "pattern.h"
#include "transport/transport.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define POISON 0xA5
#define GAP 3 /* bytes between messages in staging: odd offsets */
#define MAX_MSG (3u << 20)

typedef struct {
  refit_transport_kind_t kind;
  const char *kind_name;
  const char *expect;
  int same_gpu, buckets, die_rank, die_bucket;
  refit_locality_t locality;
  double timeout_s;
  int lengths;
} opts_t;

static int g_rank = -1;
static int g_lengths; /* --lengths: some messages empty */
static int g_trace; /* REFIT_TRACE set: each step of the loop on stderr */
#define TRACE(...)                                                             \
  do {                                                                         \
    if (g_trace) {                                                             \
      fprintf(stderr, "trace: rank %d %.3f: ", g_rank, MPI_Wtime());            \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
    }                                                                          \
  } while (0)

#define FAILF(...)                                                             \
  do {                                                                         \
    fprintf(stderr, "test_gpu_transport: rank %d: FAIL: ", g_rank);            \
    fprintf(stderr, __VA_ARGS__);                                              \
    fprintf(stderr, "\n");                                                     \
  } while (0)

/* Bytes of bucket b from src to dst: 1 .. MAX_MSG, mostly small, some big. */
static size_t msg_bytes(int b, int src, int dst) {
  uint64_t h = 0;
  for (int k = 0; k < 8; k++)
    h = (h << 8) | refit_pattern_byte(0x5eedULL + (uint64_t)b * 131 +
                                          (uint64_t)src * 17 + (uint64_t)dst,
                                      (uint64_t)k);
  if (g_lengths && h % 16 == 3)
    return 0;
  return (h % 8 == 0) ? 1 + h % MAX_MSG : 1 + h % 65536;
}

static uint64_t msg_seed(int b, int src, int dst) {
  return ((uint64_t)b << 32) ^ ((uint64_t)src << 16) ^ (uint64_t)dst ^ 0xabcdef;
}

/* Staging offset of the message from `src` to `dst` in bucket b; messages
 * are packed by sender rank with GAP bytes before each. */
static size_t recv_offset(int b, int dst, int src) {
  size_t off = 0;
  for (int r = 0; r < src; r++)
    if (r != dst)
      off += GAP + msg_bytes(b, r, dst);
  return off + GAP;
}

static size_t send_offset(int b, int src, int dst) {
  size_t off = 0;
  for (int r = 0; r < dst; r++)
    if (r != src)
      off += msg_bytes(b, src, r);
  return off;
}

static int parse(int argc, char **argv, opts_t *o) {
  memset(o, 0, sizeof(*o));
  o->kind = REFIT_TRANSPORT_AUTO;
  o->kind_name = "auto";
  o->buckets = 6;
  o->die_rank = -1;
  o->timeout_s = 60;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--transport") == 0 && v) {
      o->kind_name = v;
      o->kind = strcmp(v, "nccl") == 0  ? REFIT_TRANSPORT_NCCL
                : strcmp(v, "ipc") == 0 ? REFIT_TRANSPORT_IPC
                : strcmp(v, "ucx") == 0 ? REFIT_TRANSPORT_UCX
                                        : REFIT_TRANSPORT_AUTO;
      i++;
    } else if (strcmp(a, "--locality") == 0 && v) {
      o->locality = strcmp(v, "gpu") == 0 ? REFIT_LOCALITY_GPU : REFIT_LOCALITY_HOST;
      i++;
    } else if (strcmp(a, "--lengths") == 0) {
      o->lengths = 1;
    } else if (strcmp(a, "--same-gpu") == 0) {
      o->same_gpu = 1;
    } else if (strcmp(a, "--buckets") == 0 && v) {
      o->buckets = atoi(v), i++;
    } else if (strcmp(a, "--timeout") == 0 && v) {
      o->timeout_s = atof(v), i++;
    } else if (strcmp(a, "--expect") == 0 && v) {
      o->expect = v, i++;
    } else if (strcmp(a, "--die-rank") == 0 && v) {
      o->die_rank = atoi(v), i++;
    } else if (strcmp(a, "--die-bucket") == 0 && v) {
      o->die_bucket = atoi(v), i++;
    } else {
      fprintf(stderr, "test_gpu_transport: unknown or incomplete option '%s'\n",
              a);
      return -1;
    }
  }
  return 0;
}

/* A survivor of the dead-peer run reports and leaves without MPI_Finalize. */
static void dead_peer_exit(int ok, const char *what, double waited,
                           double timeout, const char *msg) {
  printf("dead-peer: %s: rank %d: %s after %.2f s (deadline %.1f s): %s\n",
         ok ? "PASS" : "FAIL", g_rank, what, waited, timeout, msg);
  fflush(stdout);
  fflush(stderr);
  _exit(ok ? 0 : 1);
}

int main(int argc, char **argv) {
  opts_t o;
  int rank, size, ndev = 0, min_dev = 0;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  g_rank = rank;
  g_trace = getenv("REFIT_TRACE") != NULL;
  refit_log_set_rank(rank);
  /* A rule of the shared GPU machines, kept also where the environment was
   * not passed on: no NVLink multicast. */
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  if (parse(argc, argv, &o) != 0) {
    MPI_Finalize();
    return 2;
  }
  g_lengths = o.lengths;
  refit_device_count(&ndev);
  MPI_Allreduce(&ndev, &min_dev, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (min_dev == 0) {
    if (rank == 0)
      printf("test_gpu_transport: SKIP: a rank sees no CUDA device\n");
    MPI_Finalize();
    return 77;
  }

  refit_device_info_t info;
  refit_status_t st = refit_device_bind(MPI_COMM_WORLD, o.same_gpu ? 0 : -1,
                                        120.0, &info);
  if (st != REFIT_OK) {
    FAILF("bind: %s", refit_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  printf("test_gpu_transport: rank %d of %d on %s GPU %d of %d (bus %s)\n",
         rank, size, info.host, info.device, info.count, info.bus_id);
  fflush(stdout);

  refit_device_locality_t loc;
  if (refit_device_locality(MPI_COMM_WORLD, 120.0, &loc) != REFIT_OK) {
    FAILF("locality: %s", refit_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const int shared = loc.shared_a >= 0, ngpus = loc.ngpus;
  refit_device_locality_free(&loc);
  if (o.locality == REFIT_LOCALITY_GPU && ngpus < 2) {
    if (rank == 0)
      printf("test_gpu_transport: SKIP: --locality gpu needs ranks on two GPUs "
             "(%d here)\n", ngpus);
    MPI_Finalize();
    return 77;
  }

  /* Every rank sends to every other rank. */
  int *pairs = malloc((size_t)size * (size_t)size * 2 * sizeof(int)), npairs = 0;
  if (pairs == NULL) {
    FAILF("pairs of %d ranks", size);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (int a = 0; a < size; a++)
    for (int b = 0; b < size; b++)
      if (a != b) {
        pairs[2 * npairs] = a;
        pairs[2 * npairs + 1] = b;
        npairs++;
      }
  refit_transport_args_t args = {.world = MPI_COMM_WORLD,
                                 .world_rank = rank,
                                 .world_size = size,
                                 .timeout_s = o.timeout_s,
                                 .memory = REFIT_MEMORY_DEVICE,
                                 .pairs = pairs,
                                 .npairs = npairs,
                                 .locality = o.locality};
  refit_transport_t t = {0};
  st = refit_transport_open(o.kind, &args, &t);
  free(pairs);
  if (o.kind == REFIT_TRANSPORT_NCCL && shared && o.lengths && o.die_rank < 0) {
    if (rank == 0)
      printf("test_gpu_transport: SKIP: NCCL under the lengths wrapper needs one GPU "
             "per rank\n");
    refit_transport_close(&t);
    MPI_Finalize();
    return 77;
  }
  if (o.kind == REFIT_TRANSPORT_NCCL && shared) {
    /* Two ranks on one GPU: NCCL must refuse, naming the reason. */
    int ok = st == REFIT_ERR_CONFIG &&
             strstr(refit_last_error(), "same GPU") != NULL;
    if (rank == 0)
      printf("test_gpu_transport: nccl on a shared GPU: %s (%s: %s)\n",
             ok ? "refused as expected" : "NOT refused as expected",
             refit_status_name(st), refit_last_error());
    if (o.die_rank >= 0) {
      if (rank == 0)
        printf("test_gpu_transport: SKIP: dead-peer NCCL run needs one GPU "
               "per rank\n");
      MPI_Finalize();
      return 77;
    }
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == 0)
      printf("test_gpu_transport: %s\n", all ? "PASS" : "FAIL");
    refit_transport_close(&t);
    MPI_Finalize();
    return all ? 0 : 1;
  }
  if (o.kind == REFIT_TRANSPORT_UCX && st == REFIT_ERR_CONFIG &&
      strstr(refit_last_error(), "no CUDA transports") != NULL) {
    /* Every rank got the same answer (query agrees over the world). */
    if (rank == 0)
      printf("test_gpu_transport: SKIP: %s\n", refit_last_error());
    MPI_Finalize();
    return 77;
  }
  if (st != REFIT_OK) {
    FAILF("opening transport %s: %s: %s", o.kind_name, refit_status_name(st),
          refit_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (o.lengths && (st = refit_transport_lengths_wrap(&t, &args)) != REFIT_OK) {
    FAILF("wrapping transport %s: %s: %s", o.kind_name, refit_status_name(st),
          refit_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0)
    printf("test_gpu_transport: transport %s selected for --transport %s%s\n",
           t.ops->name, o.kind_name, o.lengths ? ", lengths ahead over mpi" : "");
  if (o.expect != NULL && strcmp(o.expect, t.ops->name) != 0) {
    FAILF("expected transport %s, got %s", o.expect, t.ops->name);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  /* Capacity of one staging area and one send buffer over all buckets. */
  size_t stage_cap = 1, send_cap = 1;
  for (int b = 0; b < o.buckets; b++) {
    size_t r = recv_offset(b, rank, size), s = send_offset(b, rank, size);
    stage_cap = r > stage_cap ? r : stage_cap;
    send_cap = s > send_cap ? s : send_cap;
  }
  /* Two staging areas inside one allocation, the second at an odd offset. */
  const size_t second = stage_cap + 4099;
  unsigned char *stage_alloc = NULL, *stage[2], *sendbuf[2] = {NULL, NULL};
  unsigned char *host_stage = malloc(stage_cap), *host_send = malloc(send_cap);
  if (host_stage == NULL || host_send == NULL ||
      refit_device_alloc((void **)&stage_alloc, second + stage_cap) != REFIT_OK ||
      refit_device_alloc((void **)&sendbuf[0], send_cap) != REFIT_OK ||
      refit_device_alloc((void **)&sendbuf[1], send_cap) != REFIT_OK) {
    FAILF("allocating buffers: %s", refit_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  stage[0] = stage_alloc;
  stage[1] = stage_alloc + second;
  for (int k = 0; k < 2; k++)
    if (refit_transport_register(&t, stage[k], stage_cap) != REFIT_OK) {
      FAILF("registering staging %d: %s", k, refit_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }

  refit_xfer_t *sends = calloc((size_t)size, sizeof(*sends));
  refit_xfer_t *recvs = calloc((size_t)size, sizeof(*recvs));
  size_t *got = calloc(2 * (size_t)size, sizeof(*got)); /* [slot][peer] */
  refit_exchange_t *inflight[2] = {NULL, NULL};
  int inflight_bucket[2] = {-1, -1};
  long long wrong = 0, moved = 0;
  double t0 = MPI_Wtime();

  for (int b = 0; b < o.buckets + 2; b++) {
    const int slot = b % 2;
    if (inflight[slot] != NULL) {
      const int vb = inflight_bucket[slot];
      char phase[64];
      snprintf(phase, sizeof(phase), "bucket %d", vb);
      const double w0 = MPI_Wtime();
      TRACE("wait %s", phase);
      st = t.ops->wait(t.ctx, inflight[slot], w0 + o.timeout_s, phase);
      TRACE("wait %s: %s", phase, refit_status_name(st));
      const double waited = MPI_Wtime() - w0;
      inflight[slot] = NULL;
      if (o.die_rank >= 0 && st != REFIT_OK) {
        char first[512];
        snprintf(first, sizeof(first), "%s: %s", refit_status_name(st),
                 refit_last_error());
        /* Slack for ncclCommAbort, which joins NCCL's threads. */
        int ok = waited <= o.timeout_s + 10.0;
        /* A later exchange with the dead rank must fail, not hang. */
        refit_exchange_t *again = NULL;
        refit_xfer_t from_dead = {o.die_rank, stage[0], 1, NULL};
        const double s0 = MPI_Wtime();
        TRACE("a later exchange");
        refit_status_t st2 =
            t.ops->start(t.ctx, NULL, 0, &from_dead, 1, 9999, &again);
        if (st2 == REFIT_OK && again != NULL)
          st2 = t.ops->wait(t.ctx, again, MPI_Wtime() + 1.0, "after failure");
        printf("dead-peer: rank %d: a later exchange returned %s in %.2f s\n",
               rank, refit_status_name(st2), MPI_Wtime() - s0);
        dead_peer_exit(ok && st2 != REFIT_OK, "wait() failed", waited,
                       o.timeout_s, first);
      }
      if (st != REFIT_OK) {
        FAILF("wait %s: %s: %s", phase, refit_status_name(st),
              refit_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      /* Check every byte of the staging area: messages and gaps. */
      if (refit_device_memcpy(host_stage, stage[slot], stage_cap) != REFIT_OK) {
        FAILF("copying staging back: %s", refit_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      size_t pos = 0;
      long long bad_here = 0;
      for (int src = 0; src < size; src++) {
        if (src == rank)
          continue;
        const size_t off = recv_offset(vb, rank, src);
        const size_t n = msg_bytes(vb, src, rank);
        const uint64_t seed = msg_seed(vb, src, rank);
        if (o.lengths && got[(size_t)slot * (size_t)size + (size_t)src] != n) {
          FAILF("bucket %d from rank %d: the receive reports %zu bytes, the message "
                "has %zu",
                vb, src, got[(size_t)slot * (size_t)size + (size_t)src], n);
          bad_here++;
        }
        for (; pos < off; pos++)
          bad_here += host_stage[pos] != POISON;
        for (size_t i = 0; i < n; i++, pos++) {
          const uint8_t want = refit_pattern_byte(seed, i);
          if (host_stage[pos] != want) {
            if (bad_here < 3)
              FAILF("bucket %d from rank %d byte %zu of %zu: expected 0x%02x, "
                    "got 0x%02x",
                    vb, src, i, n, want, host_stage[pos]);
            bad_here++;
          }
        }
        moved += (long long)n;
      }
      for (; pos < stage_cap; pos++)
        bad_here += host_stage[pos] != POISON;
      wrong += bad_here;
    }
    if (b >= o.buckets)
      continue;
    /* Post bucket b: pack sends, poison staging, start. */
    int ns = 0, nr = 0;
    for (int peer = 0; peer < size; peer++) {
      if (peer == rank)
        continue;
      const size_t so = send_offset(b, rank, peer), sn = msg_bytes(b, rank, peer);
      const uint64_t seed = msg_seed(b, rank, peer);
      for (size_t i = 0; i < sn; i++)
        host_send[so + i] = refit_pattern_byte(seed, i);
      sends[ns++] = (refit_xfer_t){peer, sendbuf[slot] + so, sn, NULL};
      size_t *len = &got[(size_t)slot * (size_t)size + (size_t)peer];
      *len = (size_t)-1;
      recvs[nr++] = (refit_xfer_t){peer, stage[slot] + recv_offset(b, rank, peer),
                                   msg_bytes(b, peer, rank) + (o.lengths ? GAP : 0),
                                   o.lengths ? len : NULL};
    }
    TRACE("prepare bucket %d", b);
    if (refit_device_memcpy(sendbuf[slot], host_send, send_offset(b, rank, size)) !=
            REFIT_OK ||
        refit_device_memset(stage[slot], POISON, stage_cap) != REFIT_OK) {
      FAILF("preparing bucket %d: %s", b, refit_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    TRACE("start bucket %d", b);
    st = t.ops->start(t.ctx, sends, ns, recvs, nr, b, &inflight[slot]);
    TRACE("start bucket %d: %s", b, refit_status_name(st));
    inflight_bucket[slot] = b;
    if (st != REFIT_OK) {
      if (o.die_rank >= 0)
        dead_peer_exit(1, "start() failed", 0.0, o.timeout_s,
                       refit_last_error());
      FAILF("start bucket %d: %s: %s", b, refit_status_name(st),
            refit_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == o.die_rank && b == o.die_bucket) {
      printf("dead-peer: rank %d: killing itself (SIGKILL) with bucket %d in "
             "flight\n",
             rank, b);
      fflush(stdout);
      raise(SIGKILL);
    }
  }
  const double elapsed = MPI_Wtime() - t0;
  if (o.die_rank >= 0)
    dead_peer_exit(0, "no error although a peer died", elapsed, o.timeout_s,
                   "every wait() succeeded");

  long long total_wrong = 0, total_moved = 0;
  MPI_Allreduce(&wrong, &total_wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&moved, &total_moved, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  refit_transport_close(&t);
  refit_device_free(stage_alloc);
  refit_device_free(sendbuf[0]);
  refit_device_free(sendbuf[1]);
  free(host_stage);
  free(host_send);
  free(sends);
  free(recvs);
  free(got);
  if (rank == 0)
    printf("test_gpu_transport: %s: transport %s, %d ranks%s, %d buckets, "
           "%lld bytes moved in %.3f s, %lld wrong bytes\n",
           total_wrong == 0 ? "PASS" : "FAIL", o.kind_name, size,
           o.same_gpu ? " on one GPU" : "", o.buckets, total_moved, elapsed,
           total_wrong);
  MPI_Finalize();
  return total_wrong == 0 ? 0 : 1;
}
