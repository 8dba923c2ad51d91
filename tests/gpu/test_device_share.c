/*
 * Shareable device memory (runtime/src/device/device_share.h) between two processes
 * of one GPU: a child allocates, fills with fresh random bytes and exports;
 * the parent maps the child's allocation and reads every byte back. Also the
 * refusals: a descriptor the child does not hold, a process that does not
 * exist. Exits 77 (skipped) without a CUDA device.
 *
 * The parent forks before it touches CUDA (CUDA does not survive a fork).
 */
#include "device/device_share.h"

#include "core/error.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  int skip;
  int fd;
  size_t size, bytes;
  uint64_t seed;
} share_msg_t;

static void fill(uint8_t *h, size_t n, uint64_t x) {
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    h[i] = (uint8_t)(x >> 24);
  }
}

static int child(int to_parent, int from_parent, uint64_t seed) {
  share_msg_t m = {0, -1, 0, (3u << 20) + 12345, seed};
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    m.skip = 1;
    return write(to_parent, &m, sizeof(m)) == sizeof(m) ? 0 : 1;
  }
  void *p = NULL, *base = NULL;
  if (refit_share_alloc(&p, m.bytes) != REFIT_OK) {
    fprintf(stderr, "child: %s\n", refit_last_error());
    return 1;
  }
  uint8_t *h = malloc(m.bytes);
  fill(h, m.bytes, seed);
  cudaMemcpy(p, h, m.bytes, cudaMemcpyHostToDevice);
  if (!refit_share_lookup((uint8_t *)p + 1000, &base, &m.fd, &m.size) || base != p ||
      m.fd < 0 || m.size < m.bytes) {
    fprintf(stderr, "child: lookup inside the allocation failed\n");
    return 1;
  }
  int fd2;
  size_t size2;
  if (refit_share_lookup((uint8_t *)p + m.size, &base, &fd2, &size2)) {
    fprintf(stderr, "child: lookup past the allocation found it\n");
    return 1;
  }
  if (write(to_parent, &m, sizeof(m)) != sizeof(m))
    return 1;
  char done;
  if (read(from_parent, &done, 1) != 1)
    return 1;
  int bad = refit_share_free(h) != 0; /* not one of its allocations */
  bad |= refit_share_free(p) != 1;
  free(h);
  return bad;
}

int main(void) {
  int up[2], down[2];
  if (pipe(up) != 0 || pipe(down) != 0)
    return 1;
  const uint64_t seed = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull | 1;
  const pid_t pid = fork();
  if (pid == 0)
    _exit(child(up[1], down[0], seed));
  share_msg_t m;
  if (read(up[0], &m, sizeof(m)) != sizeof(m)) {
    fprintf(stderr, "no word from the child\n");
    return 1;
  }
  if (m.skip) {
    waitpid(pid, NULL, 0);
    printf("skipped: no CUDA device\n");
    return 77;
  }
  int fails = 0;
  void *q = NULL;
  if (refit_share_map((int)pid, m.fd, m.size, &q) != REFIT_OK) {
    fprintf(stderr, "FAIL map: %s\n", refit_last_error());
    fails++;
  } else {
    uint8_t *want = malloc(m.bytes), *got = malloc(m.bytes);
    fill(want, m.bytes, m.seed);
    cudaMemcpy(got, q, m.bytes, cudaMemcpyDeviceToHost);
    size_t wrong = 0;
    for (size_t i = 0; i < m.bytes; i++)
      wrong += got[i] != want[i];
    if (wrong != 0) {
      fprintf(stderr, "FAIL: %zu of %zu bytes differ through the mapping\n", wrong, m.bytes);
      fails++;
    }
    refit_share_unmap(q, m.size);
    free(want);
    free(got);
  }
  /* A descriptor the child does not hold, and a process that does not exist. */
  void *r = NULL;
  refit_status_t st = refit_share_map((int)pid, 1000, m.size, &r);
  if (st == REFIT_OK || strstr(refit_last_error(), "process") == NULL) {
    fprintf(stderr, "FAIL: a descriptor the child lacks: %s\n",
            st == REFIT_OK ? "mapped" : refit_last_error());
    fails++;
  }
  st = refit_share_map(0x3ffffff0, m.fd, m.size, &r);
  if (st == REFIT_OK || strstr(refit_last_error(), "zero_copy: off") == NULL) {
    fprintf(stderr, "FAIL: a process that does not exist: %s\n",
            st == REFIT_OK ? "mapped" : refit_last_error());
    fails++;
  }
  char done = 1;
  int status = 0;
  if (write(down[1], &done, 1) != 1 || waitpid(pid, &status, 0) != pid ||
      !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "FAIL: the child's checks (lookup, free)\n");
    fails++;
  }
  printf("%s: %zu bytes shared between two processes\n", fails ? "FAILED" : "ok", m.bytes);
  return fails ? 1 : 0;
}
