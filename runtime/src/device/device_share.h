/*
 * Device memory that another process on the node maps at full speed (CUDA
 * virtual memory management, shared as a POSIX file descriptor). Compiled
 * only with REFIT_HAVE_CUDA.
 *
 * Why. A generator that reads a trainer's memory through a legacy CUDA IPC
 * mapping (cudaIpcOpenMemHandle) ran the zero-copy land 27 % slower than over
 * the same bytes in its own memory (H200, docs/benchmarks.md: 36.6 against
 * 28.8 ms), while memory created with cuMemCreate, exported as a file
 * descriptor and mapped with cuMemMap ran at local speed (28.9 ms). So the
 * memory refit allocates for a trainer's own tensors (the shard slab) is
 * created that way; tensors a caller registers from its own allocator keep
 * the IPC path.
 *
 * Sharing. The owner exports its allocation's descriptor once and serves it
 * to processes of its own user over an abstract Unix socket (fd_share.h,
 * SCM_RIGHTS, as NCCL passes cuMem descriptors): no ptrace rights needed,
 * so Yama's ptrace_scope 1 and containers do not stop it. A peer imports
 * and maps it; only where the owner serves none does it try pidfd_getfd(2).
 */
#ifndef REFIT_DEVICE_SHARE_H
#define REFIT_DEVICE_SHARE_H

#include "refit/status.h"

#include <stddef.h>
#include <stdint.h>

/* Allocate `bytes` of shareable memory on the current device (rounded up to
 * the allocation granularity). REFIT_ERR_CUDA where the driver cannot (no
 * VMM or no POSIX descriptor handles); the caller then uses cudaMalloc. */
refit_status_t refit_share_alloc(void **ptr, size_t bytes);

/* Whether `ptr` lies in an allocation of refit_share_alloc; if so its base,
 * its exported descriptor (in this process) and its size. */
int refit_share_lookup(const void *ptr, void **base, int *fd, size_t *size);

/* Free an allocation of refit_share_alloc; returns 0 when `ptr` is not one
 * (the caller frees it as its own). */
int refit_share_free(void *ptr);

/* Peer: map allocation `fd` (of `size` bytes) of process `pid` on the
 * current device, read and write; *ptr its base. Unmap with
 * refit_share_unmap. Errors name the pid and what to do. */
refit_status_t refit_share_map(int pid, int fd, size_t size, void **ptr);
void refit_share_unmap(void *ptr, size_t size);

#endif /* REFIT_DEVICE_SHARE_H */
