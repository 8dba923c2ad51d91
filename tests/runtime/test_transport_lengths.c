/*
 * Receives of variable length over the lengths wrapper (transport_lengths.c),
 * here around the MPI transport in host memory, on 3 or more ranks started
 * by launch/refit-launch (the GPU transport test runs it around NCCL and
 * IPC).
 *
 * 1. Every rank sends to every other in each bucket, two buckets in flight,
 *    the length of each message drawn per (bucket, sender, receiver), some
 *    of them 0, the receive posted for the most a message can be; every
 *    third receive is of exact length (got NULL). Even buckets complete by
 *    wait(), odd ones by test(). Each received byte is checked, the room
 *    past each message must still be poison, and got must be the length.
 * 2. A message longer than its receive: the receiver gets
 *    REFIT_ERR_INTEGRITY naming the sender and both lengths.
 * 3. A rank that does not take part: its peers' waits end at the deadline
 *    with REFIT_ERR_TIMEOUT naming it.
 * 4. Every rank abandons a bucket it started (rank 1 after the others).
 * After 2, 3 and 4 every rank repairs the transport (recover) and a bucket
 * with the same tag must then complete cleanly: nothing of the failed one
 * matches it.
 */
#include "transport/transport.h"

#include "core/log.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define POISON 0x5A
#define MAX_MSG 70000

static int g_rank = -1, g_failed;

#define FAILF(...)                                                                       \
  do {                                                                                   \
    fprintf(stderr, "test_transport_lengths: rank %d: FAIL: ", g_rank);                  \
    fprintf(stderr, __VA_ARGS__);                                                        \
    fprintf(stderr, "\n");                                                               \
    g_failed = 1;                                                                        \
  } while (0)

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

static uint64_t g_seed;

/* Length of bucket b's message from src to dst: 0 one time in six. */
static size_t msg_len(int b, int src, int dst) {
  const uint64_t h =
      mix(g_seed ^ ((uint64_t)b << 40) ^ ((uint64_t)src << 20) ^ (uint64_t)dst);
  return h % 6 == 0 ? 0 : (h % 4 == 0 ? 1 + (h >> 8) % MAX_MSG : 1 + (h >> 8) % 300);
}

static unsigned char msg_byte(int b, int src, int dst, size_t i) {
  return (unsigned char)mix(g_seed + ((uint64_t)b << 48) + ((uint64_t)src << 40) +
                            ((uint64_t)dst << 32) + i);
}

typedef struct {
  int rank, size;
  unsigned char *send[2], *recv[2]; /* [size * MAX_MSG] per slot */
  refit_xfer_t *sends, *recvs;
  size_t *got;
} fixture_t;

static int exact_recv(int b, int peer) { return (b + peer) % 3 == 0; }

/* Post bucket b (tag `tag`) in `slot`; skip: take no part. `longer`: rank 0
 * sends rank 1 a message longer than rank 1 posts for. */
static refit_status_t post(refit_transport_t *t, fixture_t *f, int b, int tag, int slot,
                           int longer, refit_exchange_t **ex) {
  int ns = 0, nr = 0;
  memset(f->recv[slot], POISON, (size_t)f->size * MAX_MSG);
  for (int p = 0; p < f->size; p++) {
    if (p == f->rank)
      continue;
    size_t sn = msg_len(b, f->rank, p);
    if (longer && f->rank == 0 && p == 1)
      sn = MAX_MSG + 5;
    unsigned char *s = f->send[slot] + (size_t)p * MAX_MSG;
    for (size_t i = 0; i < sn && i < MAX_MSG; i++)
      s[i] = msg_byte(b, f->rank, p, i);
    f->sends[ns++] = (refit_xfer_t){p, s, sn, NULL};
    f->got[(size_t)slot * (size_t)f->size + (size_t)p] = (size_t)-1;
    const int exact = exact_recv(b, p) && !(longer && f->rank == 1 && p == 0);
    f->recvs[nr++] = (refit_xfer_t){
        p, f->recv[slot] + (size_t)p * MAX_MSG, exact ? msg_len(b, p, f->rank) : MAX_MSG,
        exact ? NULL : &f->got[(size_t)slot * (size_t)f->size + (size_t)p]};
  }
  return t->ops->start(t->ctx, f->sends, ns, f->recvs, nr, tag, ex);
}

/* Check bucket b as received in `slot`. */
static void check(const fixture_t *f, int b, int slot) {
  for (int p = 0; p < f->size; p++) {
    if (p == f->rank)
      continue;
    const size_t n = msg_len(b, p, f->rank);
    const unsigned char *r = f->recv[slot] + (size_t)p * MAX_MSG;
    const size_t got = f->got[(size_t)slot * (size_t)f->size + (size_t)p];
    if (!exact_recv(b, p) && got != n)
      FAILF("bucket %d from rank %d: got says %zu bytes, the message has %zu", b, p, got,
            n);
    for (size_t i = 0; i < MAX_MSG; i++) {
      const unsigned char want = i < n ? msg_byte(b, p, f->rank, i) : POISON;
      if (r[i] != want) {
        FAILF("bucket %d from rank %d byte %zu (message of %zu): 0x%02x, expected 0x%02x",
              b, p, i, n, r[i], want);
        break;
      }
    }
  }
}

static void expect_error(refit_status_t st, refit_status_t want, const char *what,
                         const char *needle) {
  if (st != want || strstr(refit_last_error(), needle) == NULL)
    FAILF("%s: %s \"%s\", expected %s naming \"%s\"", what, refit_status_name(st),
          refit_last_error(), refit_status_name(want), needle);
  else
    printf("test_transport_lengths: rank %d: %s: %s as expected: %s\n", g_rank, what,
           refit_status_name(st), refit_last_error());
}

static refit_status_t recover(refit_transport_t *t) {
  if (t->ops->healthy(t->ctx))
    FAILF("the wrapper reports healthy after a failed exchange somewhere");
  return t->ops->recover(t->ctx, MPI_Wtime() + 30);
}

/* One clean bucket with tag `tag` on every rank, waited for. */
static void clean_bucket(refit_transport_t *t, fixture_t *f, int b, int tag) {
  refit_exchange_t *ex = NULL;
  refit_status_t st = post(t, f, b, tag, 0, 0, &ex);
  if (st == REFIT_OK)
    st = t->ops->wait(t->ctx, ex, MPI_Wtime() + 30, "clean bucket");
  if (st != REFIT_OK)
    FAILF("bucket %d (tag %d) after the repair: %s: %s", b, tag, refit_status_name(st),
          refit_last_error());
  else
    check(f, b, 0);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  fixture_t f = {0};
  MPI_Comm_rank(MPI_COMM_WORLD, &f.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &f.size);
  g_rank = f.rank;
  refit_log_set_rank(f.rank);
  if (f.size < 3) {
    fprintf(stderr, "test_transport_lengths: needs 3 or more ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  /* Fresh lengths and bytes each run, the same on every rank. */
  g_seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16);
  MPI_Bcast(&g_seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  if (f.rank == 0)
    printf("test_transport_lengths: seed %llu\n", (unsigned long long)g_seed);

  const size_t area = (size_t)f.size * MAX_MSG;
  for (int k = 0; k < 2; k++) {
    f.send[k] = malloc(area);
    f.recv[k] = malloc(area);
  }
  f.sends = calloc((size_t)f.size, sizeof(*f.sends));
  f.recvs = calloc((size_t)f.size, sizeof(*f.recvs));
  f.got = calloc(2 * (size_t)f.size, sizeof(*f.got));
  refit_transport_args_t args = {.world = MPI_COMM_WORLD,
                                 .world_rank = f.rank,
                                 .world_size = f.size,
                                 .timeout_s = 30,
                                 .memory = REFIT_MEMORY_HOST};
  refit_transport_t t = {0};
  refit_status_t st = refit_transport_open(REFIT_TRANSPORT_MPI, &args, &t);
  const refit_transport_ops_t *plain = t.ops;
  if (st == REFIT_OK)
    st = refit_transport_lengths_wrap(&t, &args);
  if (st != REFIT_OK || t.ops == plain || !t.ops->variable_length ||
      strcmp(t.ops->name, "mpi+lengths") != 0) {
    FAILF("opening the wrapped transport: %s: %s", refit_status_name(st),
          refit_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  /* 1. Buckets two in flight; odd ones completed by test(). */
  const int buckets = 12;
  refit_exchange_t *inflight[2] = {NULL, NULL};
  for (int b = 0; b < buckets + 2 && !g_failed; b++) {
    const int slot = b % 2;
    if (b >= 2) {
      const int vb = b - 2;
      if (vb % 2 == 0) {
        st = t.ops->wait(t.ctx, inflight[slot], MPI_Wtime() + 30, "bucket");
      } else {
        int done = 0;
        const double until = MPI_Wtime() + 30;
        unsigned spins = 0;
        while ((st = t.ops->test(t.ctx, inflight[slot], &done)) == REFIT_OK && !done &&
               MPI_Wtime() < until)
          refit_poll_nap(&spins);
        if (st == REFIT_OK && !done)
          FAILF("bucket %d: test() never completed", vb);
      }
      inflight[slot] = NULL;
      if (st != REFIT_OK)
        FAILF("bucket %d: %s: %s", vb, refit_status_name(st), refit_last_error());
      else
        check(&f, vb, slot);
    }
    if (b < buckets && (st = post(&t, &f, b, b, slot, 0, &inflight[slot])) != REFIT_OK)
      FAILF("start bucket %d: %s: %s", b, refit_status_name(st), refit_last_error());
  }
  if (!t.ops->healthy(t.ctx))
    FAILF("unhealthy after clean buckets");

  /* 2. Rank 0 sends rank 1 a message longer than its receive. */
  refit_exchange_t *ex = NULL;
  st = post(&t, &f, 100, 100, 0, 1, &ex);
  if (st == REFIT_OK)
    st = t.ops->wait(t.ctx, ex, MPI_Wtime() + 3, "longer");
  if (f.rank == 1) {
    char needle[96];
    snprintf(needle, sizeof(needle),
             "rank 0 sends a message of %d bytes, but its receive "
             "holds at most %d bytes",
             MAX_MSG + 5, MAX_MSG);
    expect_error(st, REFIT_ERR_INTEGRITY, "a message longer than its receive", needle);
  }
  /* Every rank learns that the bucket failed (as a session would agree). */
  int bad = st != REFIT_OK, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!any)
    FAILF("no rank saw the longer message fail");
  if (bad && t.ops->healthy(t.ctx))
    FAILF("healthy after a failed exchange");
  st = t.ops->recover(t.ctx, MPI_Wtime() + 30);
  if (st != REFIT_OK || !t.ops->healthy(t.ctx))
    FAILF("recover after the longer message: %s: %s", refit_status_name(st),
          refit_last_error());
  clean_bucket(&t, &f, 101, 100);

  /* 3. Rank 2 takes no part in bucket tag 200: its peers time out. */
  if (f.rank != 2) {
    st = post(&t, &f, 200, 200, 0, 0, &ex);
    if (st == REFIT_OK)
      st = t.ops->wait(t.ctx, ex, MPI_Wtime() + 2, "absent peer");
    expect_error(st, REFIT_ERR_TIMEOUT, "a peer that never joins", "from 2");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (f.rank != 2)
    st = recover(&t);
  else
    st = t.ops->recover(t.ctx, MPI_Wtime() + 30);
  if (st != REFIT_OK)
    FAILF("recover after the absent peer: %s: %s", refit_status_name(st),
          refit_last_error());
  clean_bucket(&t, &f, 201, 200);

  /* 4. Every rank gives up a bucket it started (as a session's abort does),
   * before or after its peers' headers came, then repairs. */
  if (f.rank == 1)
    MPI_Barrier(MPI_COMM_WORLD);
  st = post(&t, &f, 300, 300, 0, 0, &ex);
  if (st != REFIT_OK)
    FAILF("start bucket 300: %s: %s", refit_status_name(st), refit_last_error());
  else
    t.ops->abandon(t.ctx, ex);
  if (f.rank != 1)
    MPI_Barrier(MPI_COMM_WORLD);
  if (t.ops->healthy(t.ctx))
    FAILF("healthy after abandoning an exchange");
  st = t.ops->recover(t.ctx, MPI_Wtime() + 30);
  if (st != REFIT_OK)
    FAILF("recover after abandoning: %s: %s", refit_status_name(st), refit_last_error());
  clean_bucket(&t, &f, 301, 300);

  refit_transport_close(&t);
  int failed = 0;
  MPI_Allreduce(&g_failed, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (f.rank == 0)
    printf("test_transport_lengths: %s\n", failed ? "FAIL" : "PASS on every rank");
  for (int k = 0; k < 2; k++) {
    free(f.send[k]);
    free(f.recv[k]);
  }
  free(f.sends);
  free(f.recvs);
  free(f.got);
  MPI_Finalize();
  return failed;
}
