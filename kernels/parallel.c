#include "kernels/parallel.h"
#include "kernels/mxfp8.h"

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

/* Below this many bytes touched, one thread is faster than several. */
#define REFIT_KERNELS_PARALLEL_MIN_BYTES (1 << 20)
/* Each extra thread must get at least this much work. */
#define REFIT_KERNELS_PARALLEL_SLICE_BYTES (256 << 10)
#define REFIT_KERNELS_MAX_THREADS 16

static atomic_int refit_kernels_threads_ = 0; /* 0: not decided yet */

static int refit_kernels_threads_default(void) {
  /* REFIT_KERNELS_THREADS, 1 .. 16 (core/env.h); a bad value is named once
   * and the default used: a kernel has no caller to fail here. */
  int64_t threads = 0;
  int set = 0;
  if (refit_env_int("REFIT_KERNELS_THREADS", &threads, &set) != REFIT_OK)
    REFIT_WARN("%s; using the online CPUs", refit_last_error());
  else if (set)
    return (int)threads;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1)
    n = 1;
  return n > REFIT_KERNELS_MAX_THREADS ? REFIT_KERNELS_MAX_THREADS : (int)n;
}

void refit_kernels_threads_set(int n) {
  if (n <= 0)
    n = refit_kernels_threads_default();
  if (n > REFIT_KERNELS_MAX_THREADS)
    n = REFIT_KERNELS_MAX_THREADS;
  atomic_store(&refit_kernels_threads_, n);
}

int refit_kernels_threads_get(void) {
  int n = atomic_load(&refit_kernels_threads_);
  if (n == 0) {
    n = refit_kernels_threads_default();
    atomic_store(&refit_kernels_threads_, n);
  }
  return n;
}

typedef struct {
  refit_kernels_range_fn_t fn;
  void *ctx;
  int64_t begin, end;
} refit_kernels_slice_t;

static void *refit_kernels_slice_run(void *arg) {
  refit_kernels_slice_t *s = arg;
  s->fn(s->ctx, s->begin, s->end);
  return NULL;
}

void refit_kernels_parallel_for(int64_t n, int64_t bytes_per_item,
                                refit_kernels_range_fn_t fn, void *ctx) {
  if (n <= 0)
    return;
  int64_t total = n * (bytes_per_item > 0 ? bytes_per_item : 1);
  int64_t nt = refit_kernels_threads_get();
  if (nt > total / REFIT_KERNELS_PARALLEL_SLICE_BYTES)
    nt = total / REFIT_KERNELS_PARALLEL_SLICE_BYTES;
  if (nt > n)
    nt = n;
  if (total < REFIT_KERNELS_PARALLEL_MIN_BYTES || nt <= 1) {
    fn(ctx, 0, n);
    return;
  }
  refit_kernels_slice_t slices[REFIT_KERNELS_MAX_THREADS];
  pthread_t tids[REFIT_KERNELS_MAX_THREADS];
  int started[REFIT_KERNELS_MAX_THREADS] = {0};
  for (int64_t t = 0; t < nt; t++) {
    slices[t].fn = fn;
    slices[t].ctx = ctx;
    slices[t].begin = n * t / nt;
    slices[t].end = n * (t + 1) / nt;
  }
  /* Slice 0 runs here; the others on new threads (or here, if creation fails). */
  for (int64_t t = 1; t < nt; t++)
    started[t] =
        pthread_create(&tids[t], NULL, refit_kernels_slice_run, &slices[t]) == 0;
  refit_kernels_slice_run(&slices[0]);
  for (int64_t t = 1; t < nt; t++) {
    if (started[t])
      pthread_join(tids[t], NULL);
    else
      refit_kernels_slice_run(&slices[t]);
  }
}
