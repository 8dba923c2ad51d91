#include "core/log.h"

#include "core/env.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static int refit_log_rank = -1;
static int refit_log_level_cached = -1;

void refit_log_set_rank(int rank) { refit_log_rank = rank; }

refit_log_level_t refit_log_level(void) {
  if (refit_log_level_cached < 0) {
    /* REFIT_DEBUG's choices are the levels in order (core/env.h). A bad
     * value keeps WARN and says so once: a logger has no caller to fail. */
    int level = REFIT_LOG_WARN, set = 0;
    char pending[2048]; /* a caller's error message, kept */
    snprintf(pending, sizeof(pending), "%s", refit_last_error());
    refit_log_level_cached = REFIT_LOG_WARN;
    if (refit_env_choice("REFIT_DEBUG", &level, &set) != REFIT_OK)
      fprintf(stderr, "refit: WARN %s; logging at WARN\n", refit_last_error());
    else if (set)
      refit_log_level_cached = level;
    refit_error_set(REFIT_OK, "%s", pending);
  }
  return (refit_log_level_t)refit_log_level_cached;
}

void refit_log(refit_log_level_t level, const char *file, int line,
               const char *fmt, ...) {
  static const char *const names[] = {"", "WARN", "INFO", "TRACE"};
  char host[64] = "?";
  char msg[4096];
  va_list ap;

  if (level > refit_log_level())
    return;
  gethostname(host, sizeof(host) - 1);
  host[sizeof(host) - 1] = '\0';
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  /* One fprintf per line keeps lines from different ranks whole. */
  if (level == REFIT_LOG_WARN)
    fprintf(stderr, "%s:%d:%d refit %s %s:%d %s\n", host, (int)getpid(),
            refit_log_rank, names[level], file, line, msg);
  else
    fprintf(stderr, "%s:%d:%d refit %s %s\n", host, (int)getpid(),
            refit_log_rank, names[level], msg);
}
