#include "core/file.h"

#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

const char *refit_file_kind(mode_t mode) {
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISSOCK(mode))
    return "a socket";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  if (S_ISREG(mode))
    return "a regular file";
  return "not a regular file";
}

refit_status_t refit_file_open_regular(const char *path, const char *what, int *fd,
                                       struct stat *sb) {
  /* O_NONBLOCK: opening a FIFO for reading returns at once instead of
   * waiting for a writer; fstat then tells what was opened. */
  const int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (f < 0)
    return REFIT_ERR(REFIT_ERR_SYSTEM, "%s: cannot open the %s: %s", path, what,
                     strerror(errno));
  struct stat st;
  if (fstat(f, &st) != 0) {
    const int e = errno;
    close(f);
    return REFIT_ERR(REFIT_ERR_SYSTEM, "%s: cannot stat the %s: %s", path, what,
                     strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(f);
    return REFIT_ERR(REFIT_ERR_SYSTEM,
                     "%s: the %s is %s, not a regular file; refit reads only "
                     "regular files (a FIFO or device could block every rank)",
                     path, what, refit_file_kind(st.st_mode));
  }
  /* Reads of a regular file never block; clear the flag all the same so that
   * stdio and libraries see an ordinary descriptor. */
  const int fl = fcntl(f, F_GETFL);
  if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    const int e = errno;
    close(f);
    return REFIT_ERR(REFIT_ERR_SYSTEM, "%s: the %s: fcntl: %s", path, what, strerror(e));
  }
  *fd = f;
  if (sb != NULL)
    *sb = st;
  return REFIT_OK;
}
