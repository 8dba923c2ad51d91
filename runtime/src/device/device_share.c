/*
 * Shareable device memory through the CUDA driver's virtual memory API
 * (device_share.h says why). The driver calls go through the runtime's
 * entry-point lookup, as in device.c: linking libcuda would make every binary
 * need a driver to start.
 */
#include "device/device_share.h"

#include "core/error.h"
#include "core/log.h"
#include "device/fd_share.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

typedef struct {
  CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
                          CUmemAllocationGranularity_flags);
  CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                     unsigned long long);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*address_free)(CUdeviceptr, size_t);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                  unsigned long long);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*export_handle)(void *, CUmemGenericAllocationHandle,
                            CUmemAllocationHandleType, unsigned long long);
  CUresult (*import_handle)(CUmemGenericAllocationHandle *, void *,
                            CUmemAllocationHandleType);
} refit_share_api_t;

static refit_share_api_t api;
static int api_state; /* 0 not looked up, 1 usable, -1 missing */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

enum { kMaxShared = 64 };
static struct {
  void *ptr;
  size_t size;
  CUmemGenericAllocationHandle handle;
  int fd;
} shared[kMaxShared];

static int refit_share_sym(const char *name, void **fn) {
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q) !=
          cudaSuccess ||
      q != cudaDriverEntryPointSuccess || *fn == NULL) {
    (void)cudaGetLastError();
    return 0;
  }
  return 1;
}

static refit_status_t refit_share_api(void) {
  pthread_mutex_lock(&lock);
  if (api_state == 0) {
    int ok = 1;
#define SYM(field, name) ok = ok && refit_share_sym(name, (void **)&api.field)
    SYM(granularity, "cuMemGetAllocationGranularity");
    SYM(create, "cuMemCreate");
    SYM(release, "cuMemRelease");
    SYM(reserve, "cuMemAddressReserve");
    SYM(address_free, "cuMemAddressFree");
    SYM(map, "cuMemMap");
    SYM(unmap, "cuMemUnmap");
    SYM(set_access, "cuMemSetAccess");
    SYM(export_handle, "cuMemExportToShareableHandle");
    SYM(import_handle, "cuMemImportFromShareableHandle");
#undef SYM
    api_state = ok ? 1 : -1;
  }
  const int state = api_state;
  pthread_mutex_unlock(&lock);
  if (state < 0)
    return REFIT_ERR(REFIT_ERR_CUDA,
                     "the driver has no virtual memory management entry points");
  return REFIT_OK;
}

static CUmemAllocationProp refit_share_prop(int device) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof(p));
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

/* Reserve an address range for `h` (size bytes), map it and allow this
 * device to read and write it. */
static CUresult refit_share_place(CUmemGenericAllocationHandle h, size_t size,
                                  size_t align, int device, CUdeviceptr *out) {
  CUdeviceptr va = 0;
  CUresult r = api.reserve(&va, size, align, 0, 0);
  if (r != CUDA_SUCCESS)
    return r;
  r = api.map(va, size, 0, h, 0);
  if (r != CUDA_SUCCESS) {
    api.address_free(va, size);
    return r;
  }
  CUmemAccessDesc a;
  memset(&a, 0, sizeof(a));
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = device;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = api.set_access(va, size, &a, 1);
  if (r != CUDA_SUCCESS) {
    api.unmap(va, size);
    api.address_free(va, size);
    return r;
  }
  *out = va;
  return CUDA_SUCCESS;
}

/* fd_share's question: is `fd` the exported descriptor of an allocation of
 * this process (and nothing else it holds)? */
static int refit_share_fd_allowed(int fd) {
  int found = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < kMaxShared && !found; i++)
    found = shared[i].ptr != NULL && shared[i].fd == fd;
  pthread_mutex_unlock(&lock);
  return found;
}

refit_status_t refit_share_alloc(void **ptr, size_t bytes) {
  REFIT_CHECK(refit_share_api());
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return REFIT_ERR(REFIT_ERR_CUDA, "shareable memory: no current device");
  }
  const CUmemAllocationProp p = refit_share_prop(device);
  size_t gran = 0;
  CUresult r = api.granularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r != CUDA_SUCCESS || gran == 0)
    return REFIT_ERR(REFIT_ERR_CUDA,
                     "shareable memory: no allocation granularity (CUresult %d)", (int)r);
  const size_t size = (bytes + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle h = 0;
  r = api.create(&h, size, &p, 0);
  if (r != CUDA_SUCCESS)
    return REFIT_ERR(r == CUDA_ERROR_OUT_OF_MEMORY ? REFIT_ERR_NO_MEMORY : REFIT_ERR_CUDA,
                     "shareable memory: cuMemCreate of %zu bytes failed (CUresult %d)",
                     size, (int)r);
  CUdeviceptr va = 0;
  int fd = -1;
  r = refit_share_place(h, size, gran, device, &va);
  if (r == CUDA_SUCCESS)
    r = api.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  int slot = -1;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < kMaxShared && r == CUDA_SUCCESS && slot < 0; i++)
    if (shared[i].ptr == NULL) {
      slot = i;
      shared[i].ptr = (void *)(uintptr_t)va;
      shared[i].size = size;
      shared[i].handle = h;
      shared[i].fd = fd;
    }
  pthread_mutex_unlock(&lock);
  if (slot < 0) {
    if (fd >= 0)
      close(fd);
    if (va != 0) {
      api.unmap(va, size);
      api.address_free(va, size);
    }
    api.release(h);
    if (r != CUDA_SUCCESS)
      return REFIT_ERR(
          REFIT_ERR_CUDA,
          "shareable memory: mapping or exporting %zu bytes failed (CUresult %d)", size,
          (int)r);
    return REFIT_ERR(REFIT_ERR_CUDA,
                     "shareable memory: more than the %d allocations this process keeps",
                     (int)kMaxShared);
  }
  /* Peers take the descriptor over a Unix socket (SCM_RIGHTS). */
  if (refit_fd_serve(refit_share_fd_allowed) != REFIT_OK)
    REFIT_WARN("%s; peers will try pidfd_getfd instead", refit_last_error());
  *ptr = (void *)(uintptr_t)va;
  return REFIT_OK;
}

int refit_share_lookup(const void *ptr, void **base, int *fd, size_t *size) {
  const uintptr_t p = (uintptr_t)ptr;
  int found = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < kMaxShared && !found; i++) {
    const uintptr_t b = (uintptr_t)shared[i].ptr;
    if (b != 0 && p >= b && p < b + shared[i].size) {
      *base = shared[i].ptr;
      *fd = shared[i].fd;
      *size = shared[i].size;
      found = 1;
    }
  }
  pthread_mutex_unlock(&lock);
  return found;
}

int refit_share_free(void *ptr) {
  int i = 0;
  pthread_mutex_lock(&lock);
  while (i < kMaxShared && (ptr == NULL || shared[i].ptr != ptr))
    i++;
  if (i == kMaxShared) {
    pthread_mutex_unlock(&lock);
    return 0;
  }
  const CUdeviceptr va = (CUdeviceptr)(uintptr_t)shared[i].ptr;
  const size_t size = shared[i].size;
  const CUmemGenericAllocationHandle h = shared[i].handle;
  const int fd = shared[i].fd;
  shared[i].ptr = NULL;
  pthread_mutex_unlock(&lock);
  cudaDeviceSynchronize(); /* cuMemUnmap does not wait for work that reads it */
  api.unmap(va, size);
  api.address_free(va, size);
  api.release(h);
  if (fd >= 0)
    close(fd);
  return 1;
}

refit_status_t refit_share_map(int pid, int fd, size_t size, void **ptr) {
  REFIT_CHECK(refit_share_api());
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return REFIT_ERR(REFIT_ERR_CUDA, "shareable memory: no current device");
  }
  /* The owner hands the descriptor over its socket (fd_share.h); a process
   * that does not serve one (an older refit) is asked through pidfd_getfd,
   * which needs leave to ptrace it. */
  int local = -1;
  char why[256] = "";
  if (refit_fd_fetch(pid, fd, 10.0, &local) != REFIT_OK) {
    snprintf(why, sizeof(why), "%s", refit_last_error());
    const int pidfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    local = pidfd < 0 ? -1 : (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
    const int err = errno;
    if (pidfd >= 0)
      close(pidfd);
    if (local < 0)
      return REFIT_ERR(REFIT_ERR_PEER,
                       "cannot take the memory descriptor of process %d: %s; and "
                       "pidfd_getfd failed too (%s: it needs Linux 5.6 and leave to "
                       "ptrace that process); else refit.zero_copy: off",
                       pid, why, strerror(err));
  }
  const CUmemAllocationProp p = refit_share_prop(device);
  size_t gran = 0;
  CUmemGenericAllocationHandle h = 0;
  CUresult r = api.granularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (r == CUDA_SUCCESS)
    r = api.import_handle(&h, (void *)(uintptr_t)local,
                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  close(local);
  if (r != CUDA_SUCCESS)
    return REFIT_ERR(
        REFIT_ERR_CUDA,
        "cannot import the memory of process %d (CUresult %d): is it on this "
        "GPU?",
        pid, (int)r);
  CUdeviceptr va = 0;
  r = refit_share_place(h, size, gran, device, &va);
  api.release(h); /* the mapping keeps the memory */
  if (r != CUDA_SUCCESS)
    return REFIT_ERR(REFIT_ERR_CUDA, "cannot map %zu bytes of process %d (CUresult %d)",
                     size, pid, (int)r);
  *ptr = (void *)(uintptr_t)va;
  return REFIT_OK;
}

void refit_share_unmap(void *ptr, size_t size) {
  if (ptr == NULL || api_state <= 0)
    return;
  cudaDeviceSynchronize();
  api.unmap((CUdeviceptr)(uintptr_t)ptr, size);
  api.address_free((CUdeviceptr)(uintptr_t)ptr, size);
}
