/*
 * Logging in the NCCL manner: WARN for failures, INFO for progress, TRACE for
 * detail. REFIT_DEBUG=WARN|INFO|TRACE (default WARN) picks the level; every
 * line starts with host:pid:rank so interleaved output from many ranks can be
 * sorted out.
 */
#ifndef REFIT_CORE_LOG_H
#define REFIT_CORE_LOG_H

#include "core/error.h"

typedef enum {
  REFIT_LOG_NONE = 0,
  REFIT_LOG_WARN = 1,
  REFIT_LOG_INFO = 2,
  REFIT_LOG_TRACE = 3
} refit_log_level_t;

/* Set the rank printed on every line (-1 before the rank is known). */
void refit_log_set_rank(int rank);
refit_log_level_t refit_log_level(void);
void refit_log(refit_log_level_t level, const char *file, int line,
               const char *fmt, ...) REFIT_PRINTF(4, 5);

#define REFIT_WARN(...)                                                        \
  refit_log(REFIT_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define REFIT_INFO(...)                                                        \
  do {                                                                         \
    if (refit_log_level() >= REFIT_LOG_INFO)                                   \
      refit_log(REFIT_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__);              \
  } while (0)
#define REFIT_TRACE(...)                                                       \
  do {                                                                         \
    if (refit_log_level() >= REFIT_LOG_TRACE)                                  \
      refit_log(REFIT_LOG_TRACE, __FILE__, __LINE__, __VA_ARGS__);             \
  } while (0)

#endif /* REFIT_CORE_LOG_H */
