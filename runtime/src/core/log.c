#include "core/log.h"

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
    const char *env = getenv("REFIT_DEBUG");
    refit_log_level_cached = REFIT_LOG_WARN;
    if (env != NULL) {
      if (strcasecmp(env, "NONE") == 0)
        refit_log_level_cached = REFIT_LOG_NONE;
      else if (strcasecmp(env, "INFO") == 0)
        refit_log_level_cached = REFIT_LOG_INFO;
      else if (strcasecmp(env, "TRACE") == 0)
        refit_log_level_cached = REFIT_LOG_TRACE;
    }
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
