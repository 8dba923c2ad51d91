/*
 * Opening the files a job names (config, checkpoint, shard, index, port
 * file) so that a path that is not a regular file is refused by name at
 * once instead of blocking: open(2) of a FIFO for reading waits for a writer,
 * forever where none comes, and would hang every rank that waits on this one.
 */
#ifndef REFIT_CORE_FILE_H
#define REFIT_CORE_FILE_H

#include "refit/status.h"

#include <sys/stat.h>

/* Open `path` read-only without blocking (O_NONBLOCK, cleared again once the
 * file is known to be regular) and refuse anything but a regular file
 * (FIFO, socket, device, directory) with REFIT_ERR_SYSTEM and a message that
 * names the path and `what` it is ("PATH: the checkpoint is a FIFO, not a
 * regular file; ..." or "PATH: cannot open the checkpoint: No such file or
 * directory"). On success *fd is the open descriptor (O_CLOEXEC; the caller
 * closes it) and *sb, when not NULL, its fstat. */
refit_status_t refit_file_open_regular(const char *path, const char *what, int *fd,
                                       struct stat *sb);

/* What kind of file `mode` is, for messages: "a FIFO", "a directory", ... */
const char *refit_file_kind(mode_t mode);

#endif /* REFIT_CORE_FILE_H */
