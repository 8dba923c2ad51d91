/*
 * File descriptors handed between processes of one node over a Unix socket
 * (SCM_RIGHTS), as NCCL passes cuMem descriptors: no ptrace rights needed
 * (pidfd_getfd(2) needs them, and Ubuntu's Yama default and containers deny
 * them).
 *
 * A process that shares descriptors serves them from one background thread
 * on an abstract socket named after its pid ("\0refit-fd-<pid>": per network
 * namespace, no file to clean up). A request is one int32, the descriptor
 * number in the server; the answer one status byte, with the descriptor
 * attached when the server's `allowed` says it may be handed out. Only a
 * peer of the server's own uid is served (SO_PEERCRED); anyone else is
 * closed on without an answer. No CUDA here: device_share.c serves its VMM
 * descriptors through it, and the tests use memfds.
 */
#ifndef REFIT_FD_SHARE_H
#define REFIT_FD_SHARE_H

#include "refit/status.h"

/* Start serving this process's descriptors (once; later calls only replace
 * `allowed`). `allowed(fd)` returns nonzero for a descriptor that may be
 * handed out; it runs on the server thread. */
refit_status_t refit_fd_serve(int (*allowed)(int fd));

/* A duplicate, in this process, of descriptor `fd` of process `pid` (which
 * serves it), within `timeout_s`. REFIT_ERR_PEER naming the process when it
 * does not serve, refuses or does not answer. */
refit_status_t refit_fd_fetch(int pid, int fd, double timeout_s, int *out);

#endif
