/*
 * Descriptors served over an abstract Unix socket named after the pid
 * (fd_share.h).
 */
#include "device/fd_share.h"

#include "core/error.h"
#include "core/log.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t refit_fd_lock = PTHREAD_MUTEX_INITIALIZER;
static int (*refit_fd_allowed)(int fd);
static int refit_fd_listener = -1;
static pid_t refit_fd_owner; /* the process the listener serves: a forked
                                child serves on a socket of its own */

/* "\0refit-fd-<pid>": the address and its length (abstract: no NUL end). */
static socklen_t refit_fd_addr(int pid, struct sockaddr_un *a) {
  memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  const int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "refit-fd-%d", pid);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* The answer's shape, both ways: one status byte, room for one descriptor. */
typedef struct {
  struct iovec iov;
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl;
} refit_fd_msg_t;

static void refit_fd_msg(refit_fd_msg_t *fm, struct msghdr *m, char *status) {
  memset(fm, 0, sizeof(*fm));
  memset(m, 0, sizeof(*m));
  fm->iov = (struct iovec){status, 1};
  m->msg_iov = &fm->iov;
  m->msg_iovlen = 1;
  m->msg_control = fm->ctl.buf;
  m->msg_controllen = sizeof(fm->ctl.buf);
}

static void refit_fd_answer(int conn) {
  struct ucred cred;
  socklen_t len = sizeof(cred);
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
      cred.uid != geteuid())
    return; /* another user: nothing said */
  const struct timeval tv = {1, 0};
  setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  int32_t want = -1;
  if (recv(conn, &want, sizeof(want), MSG_WAITALL) != (ssize_t)sizeof(want))
    return;
  pthread_mutex_lock(&refit_fd_lock);
  int (*allowed)(int) = refit_fd_allowed;
  pthread_mutex_unlock(&refit_fd_lock);
  char ok = want >= 0 && allowed != NULL && allowed(want) ? 1 : 0;
  refit_fd_msg_t fm;
  struct msghdr m;
  refit_fd_msg(&fm, &m, &ok);
  if (ok) {
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    const int fd = want;
    memcpy(CMSG_DATA(c), &fd, sizeof(fd));
  } else {
    m.msg_control = NULL;
    m.msg_controllen = 0;
  }
  (void)sendmsg(conn, &m, MSG_NOSIGNAL);
}

static void *refit_fd_server(void *arg) {
  const int listener = (int)(intptr_t)arg;
  for (;;) {
    const int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      return NULL;
    }
    refit_fd_answer(conn);
    close(conn);
  }
}

refit_status_t refit_fd_serve(int (*allowed)(int fd)) {
  pthread_mutex_lock(&refit_fd_lock);
  refit_fd_allowed = allowed;
  if (refit_fd_listener >= 0 && refit_fd_owner == getpid()) {
    pthread_mutex_unlock(&refit_fd_lock);
    return REFIT_OK;
  }
  struct sockaddr_un a;
  const socklen_t len = refit_fd_addr((int)getpid(), &a);
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  refit_status_t st = REFIT_OK;
  pthread_t thread;
  if (s < 0 || bind(s, (struct sockaddr *)&a, len) != 0 || listen(s, 64) != 0)
    st = REFIT_ERR(REFIT_ERR_SYSTEM, "serving memory descriptors on @refit-fd-%d: %s",
                   (int)getpid(), strerror(errno));
  else if (pthread_create(&thread, NULL, refit_fd_server, (void *)(intptr_t)s) != 0)
    st = REFIT_ERR(REFIT_ERR_SYSTEM, "serving memory descriptors: no thread");
  if (st != REFIT_OK) {
    if (s >= 0)
      close(s);
  } else {
    pthread_detach(thread);
    refit_fd_listener = s;
    refit_fd_owner = getpid();
  }
  pthread_mutex_unlock(&refit_fd_lock);
  return st;
}

refit_status_t refit_fd_fetch(int pid, int fd, double timeout_s, int *out) {
  struct sockaddr_un a;
  const socklen_t len = refit_fd_addr(pid, &a);
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return REFIT_ERR(REFIT_ERR_SYSTEM, "socket: %s", strerror(errno));
  struct timeval tv = {(time_t)timeout_s,
                       (long)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
  if (timeout_s <= 0)
    tv = (struct timeval){0, 1000};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  refit_status_t st = REFIT_OK;
  const int32_t want = fd;
  if (connect(s, (struct sockaddr *)&a, len) != 0) {
    st = REFIT_ERR(
        REFIT_ERR_PEER,
        "process %d serves no memory descriptors on @refit-fd-%d (%s): is it on "
        "this node and in this network namespace?",
        pid, pid, strerror(errno));
    goto out;
  }
  if (send(s, &want, sizeof(want), MSG_NOSIGNAL) != (ssize_t)sizeof(want)) {
    st = REFIT_ERR(REFIT_ERR_PEER, "asking process %d for descriptor %d: %s", pid, fd,
                   strerror(errno));
    goto out;
  }
  char ok = 0;
  refit_fd_msg_t fm;
  struct msghdr m;
  refit_fd_msg(&fm, &m, &ok);
  const ssize_t n = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
  int got = -1;
  for (struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&m) : NULL; c != NULL;
       c = CMSG_NXTHDR(&m, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
      memcpy(&got, CMSG_DATA(c), sizeof(got));
  if (n != 1 || !ok || got < 0) {
    if (got >= 0)
      close(got);
    st = REFIT_ERR(REFIT_ERR_PEER,
                   "process %d did not hand over descriptor %d (%s): it is not one it "
                   "shares, or the process belongs to another user",
                   pid, fd,
                   n < 0    ? strerror(errno)
                   : n == 0 ? "closed"
                            : "refused");
    goto out;
  }
  *out = got;
out:
  close(s);
  return st;
}
