/*
 * Internal error recording: the function that first detects a failure calls
 * REFIT_ERR(status, fmt, ...) which stores the message for refit_last_error()
 * and evaluates to the status, so that `return REFIT_ERR(...)` reads naturally.
 * This file does no I/O; logging the message is the caller's decision.
 */
#ifndef REFIT_CORE_ERROR_H
#define REFIT_CORE_ERROR_H

#include "refit/status.h"

#include <stdarg.h>

#if defined(__GNUC__)
#define REFIT_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define REFIT_PRINTF(a, b)
#endif

refit_status_t refit_error_set(refit_status_t status, const char *fmt, ...)
    REFIT_PRINTF(2, 3);
refit_status_t refit_error_setv(refit_status_t status, const char *fmt,
                                va_list ap);

#define REFIT_ERR(status, ...) refit_error_set((status), __VA_ARGS__)

/* Propagate a failure that already recorded its message. */
#define REFIT_CHECK(call)                                                      \
  do {                                                                         \
    refit_status_t check_status_ = (call);                                     \
    if (check_status_ != REFIT_OK)                                             \
      return check_status_;                                                    \
  } while (0)

#define REFIT_CHECK_GOTO(call, status_var, label)                              \
  do {                                                                         \
    (status_var) = (call);                                                     \
    if ((status_var) != REFIT_OK)                                              \
      goto label;                                                              \
  } while (0)

#endif /* REFIT_CORE_ERROR_H */
