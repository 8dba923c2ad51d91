/*
 * refit status codes and error reporting.
 *
 * Every refit function returns a refit_status_t. The code says what class of
 * failure happened; refit_last_error() returns the sentence that the function
 * which first detected the failure wrote, naming the phase, rank, tensor and
 * expected/actual values that a person needs to act on it.
 */
#ifndef REFIT_STATUS_H
#define REFIT_STATUS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, text): one row per status code, in numeric order starting at 0. */
#define REFIT_STATUS_MAP(X)                                                    \
  X(OK, "success")                                                             \
  X(ERR_INVALID_ARGUMENT, "invalid argument")                                  \
  X(ERR_CONFIG, "invalid configuration")                                       \
  X(ERR_NOT_AVAILABLE, "not available yet")                                    \
  X(ERR_NO_MEMORY, "out of memory")                                            \
  X(ERR_SYSTEM, "system call failed")                                          \
  X(ERR_MPI, "MPI error")                                                      \
  X(ERR_CUDA, "CUDA error")                                                    \
  X(ERR_NCCL, "NCCL error")                                                    \
  X(ERR_UCX, "UCX error")                                                      \
  X(ERR_HDF5, "HDF5 error")                                                    \
  X(ERR_TIMEOUT, "deadline exceeded")                                          \
  X(ERR_PEER, "a peer rank failed")                                            \
  X(ERR_MISMATCH, "data does not match its reference")                         \
  X(ERR_INTEGRITY, "integrity check failed")                                   \
  X(ERR_STATE, "operation not allowed in this state")                          \
  X(ERR_INTERNAL, "internal error")

typedef enum {
#define REFIT_STATUS_ENUM_(name, text) REFIT_##name,
  REFIT_STATUS_MAP(REFIT_STATUS_ENUM_)
#undef REFIT_STATUS_ENUM_
  REFIT_STATUS_COUNT
} refit_status_t;

/* Short fixed text for a status code ("invalid configuration"). Never NULL. */
const char *refit_status_str(refit_status_t status);

/* Symbolic name of a status code ("REFIT_ERR_CONFIG"). Never NULL. */
const char *refit_status_name(refit_status_t status);

/*
 * The message of the most recent failure on the calling thread, or "" when
 * none was recorded. The pointer stays valid until the next refit call on the
 * same thread.
 */
const char *refit_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_STATUS_H */
