#include "core/error.h"

#include <stdio.h>

static _Thread_local char refit_error_msg[2048];

static const char *const refit_status_texts[] = {
#define REFIT_STATUS_TEXT_(name, text) text,
    REFIT_STATUS_MAP(REFIT_STATUS_TEXT_)
#undef REFIT_STATUS_TEXT_
};

static const char *const refit_status_names[] = {
#define REFIT_STATUS_NAME_(name, text) "REFIT_" #name,
    REFIT_STATUS_MAP(REFIT_STATUS_NAME_)
#undef REFIT_STATUS_NAME_
};

const char *refit_status_str(refit_status_t status) {
  if ((unsigned)status >= REFIT_STATUS_COUNT)
    return "unknown status";
  return refit_status_texts[status];
}

const char *refit_status_name(refit_status_t status) {
  if ((unsigned)status >= REFIT_STATUS_COUNT)
    return "REFIT_UNKNOWN";
  return refit_status_names[status];
}

const char *refit_last_error(void) { return refit_error_msg; }

refit_status_t refit_error_setv(refit_status_t status, const char *fmt,
                                va_list ap) {
  vsnprintf(refit_error_msg, sizeof(refit_error_msg), fmt, ap);
  return status;
}

refit_status_t refit_error_set(refit_status_t status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  refit_error_setv(status, fmt, ap);
  va_end(ap);
  return status;
}

