/*
 * A tiny fork-join helper for the C reference kernels (internal).
 *
 * Work is a range [0, n) of independent items (rows, experts); each worker
 * gets one contiguous slice. Items never share output bytes, so the result is
 * the same for any number of threads. Small jobs run on the calling thread:
 * starting threads costs tens of microseconds, more than quantizing a few
 * hundred kilobytes.
 */
#ifndef REFIT_KERNELS_PARALLEL_H
#define REFIT_KERNELS_PARALLEL_H

#include <stdint.h>

typedef void (*refit_kernels_range_fn_t)(void *ctx, int64_t begin,
                                         int64_t end);

/*
 * Run fn(ctx, begin, end) over [0, n). bytes_per_item (read + written) decides
 * whether threads pay off. If a thread cannot be started its slice runs on
 * the calling thread; output is identical either way.
 */
void refit_kernels_parallel_for(int64_t n, int64_t bytes_per_item,
                                refit_kernels_range_fn_t fn, void *ctx);

#endif /* REFIT_KERNELS_PARALLEL_H */
