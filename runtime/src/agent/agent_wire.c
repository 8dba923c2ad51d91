/*
 * The attach protocol's framing: header, JSON payload, SCM_RIGHTS
 * descriptors, every read bounded by a deadline (agent_wire.h).
 */

#include "agent/agent_wire.h"

#include "core/env.h"
#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double refit_agent_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Wait until `sock` is ready for `events` or the deadline passes (deadline
 * < 0: no deadline). */
static refit_status_t refit_agent_wait(int sock, short events, double deadline,
                                       const char *what) {
  for (;;) {
    int ms = -1;
    if (deadline >= 0) {
      const double left = deadline - refit_agent_now();
      if (left <= 0)
        return REFIT_ERR(REFIT_ERR_TIMEOUT, "attach protocol: %s: deadline passed", what);
      ms = (int)(left * 1000.0) + 1;
    }
    struct pollfd p = {sock, events, 0};
    const int n = poll(&p, 1, ms);
    if (n > 0)
      return REFIT_OK;
    if (n < 0 && errno != EINTR)
      return REFIT_ERR(REFIT_ERR_SYSTEM, "attach protocol: %s: poll: %s", what,
                       strerror(errno));
  }
}

refit_status_t refit_agent_send(int sock, const json_t *json, const int *fds, int nfds,
                                double timeout_s) {
  if (nfds < 0 || nfds > REFIT_AGENT_FDS_MAX)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "attach protocol: %d descriptors in one message (at most %d)", nfds,
                     REFIT_AGENT_FDS_MAX);
  char *text = json_dumps(json, JSON_COMPACT);
  if (text == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "attach protocol: encoding a message");
  const size_t len = strlen(text);
  if (len > REFIT_AGENT_BYTES_MAX) {
    free(text);
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "attach protocol: a message of %zu bytes (at most %u)", len,
                     REFIT_AGENT_BYTES_MAX);
  }
  refit_agent_frame_t h = {REFIT_AGENT_MAGIC, REFIT_AGENT_PROTO, 0, (uint32_t)len,
                           (uint32_t)nfds};
  const double deadline = refit_agent_now() + timeout_s;
  size_t sent = 0, total = sizeof(h) + len;
  refit_status_t st = REFIT_OK;
  while (sent < total && st == REFIT_OK) {
    struct iovec iov[2];
    int niov = 0;
    if (sent < sizeof(h))
      iov[niov++] = (struct iovec){(char *)&h + sent, sizeof(h) - sent};
    const size_t body = sent > sizeof(h) ? sent - sizeof(h) : 0;
    iov[niov++] = (struct iovec){text + body, len - body};
    union {
      char buf[CMSG_SPACE(sizeof(int) * REFIT_AGENT_FDS_MAX)];
      struct cmsghdr align;
    } ctl;
    struct msghdr m = {0};
    m.msg_iov = iov;
    m.msg_iovlen = (size_t)niov;
    if (sent == 0 && nfds > 0) { /* the descriptors travel with the first byte */
      memset(&ctl, 0, sizeof(ctl));
      m.msg_control = ctl.buf;
      m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
      struct cmsghdr *c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
      memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    const ssize_t n = sendmsg(sock, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      st = refit_agent_wait(sock, POLLOUT, deadline, "sending a message");
    } else if (n < 0 && errno != EINTR) {
      st = REFIT_ERR(REFIT_ERR_PEER,
                     "attach protocol: the peer closed the connection (%s)",
                     strerror(errno));
    }
  }
  free(text);
  return st;
}

/* Read exactly `len` bytes into buf; the first read may also take the
 * descriptors. deadline < 0 before the first byte: none. */
static refit_status_t refit_agent_read(int sock, void *buf, size_t len,
                                       refit_agent_msg_t *msg, double *deadline,
                                       double timeout_s, int first) {
  size_t got = 0;
  while (got < len) {
    REFIT_CHECK(refit_agent_wait(sock, POLLIN, *deadline,
                                 first && got == 0 ? "waiting for a message"
                                                   : "reading a message"));
    union {
      char buf[CMSG_SPACE(sizeof(int) * REFIT_AGENT_FDS_MAX)];
      struct cmsghdr align;
    } ctl;
    struct iovec iov = {(char *)buf + got, len - got};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl.buf;
    m.msg_controllen = sizeof(ctl.buf);
    const ssize_t n = recvmsg(sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
      continue;
    if (n < 0)
      return REFIT_ERR(REFIT_ERR_PEER, "attach protocol: the connection failed: %s",
                       strerror(errno));
    /* Descriptors are taken whenever they come, so none leaks; a count that
     * disagrees with the header is refused below. */
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c != NULL; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
        continue;
      const int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      int fds[REFIT_AGENT_FDS_MAX];
      memcpy(fds, CMSG_DATA(c), sizeof(int) * (size_t)k);
      for (int i = 0; i < k; i++) {
        if (msg->nfds < REFIT_AGENT_FDS_MAX)
          msg->fds[msg->nfds++] = fds[i];
        else
          close(fds[i]);
      }
    }
    if (m.msg_flags & MSG_CTRUNC)
      return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                       "attach protocol: more than %d descriptors in one message",
                       REFIT_AGENT_FDS_MAX);
    if (n == 0)
      return first && got == 0
                 ? REFIT_ERR(REFIT_ERR_PEER,
                             "attach protocol: the peer closed the connection")
                 : REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                             "attach protocol: the peer closed the connection in the "
                             "middle of a message (%zu of %zu bytes)",
                             got, len);
    if (got == 0 && *deadline < 0)
      *deadline = refit_agent_now() + timeout_s;
    got += (size_t)n;
  }
  return REFIT_OK;
}

refit_status_t refit_agent_recv(int sock, refit_agent_msg_t *msg, double timeout_s) {
  memset(msg, 0, sizeof(*msg));
  refit_agent_frame_t h;
  double deadline = timeout_s < 0 ? -1.0 : refit_agent_now() + timeout_s;
  const double bound = timeout_s < 0 ? 10.0 : timeout_s;
  refit_status_t st = refit_agent_read(sock, &h, sizeof(h), msg, &deadline, bound, 1);
  char *text = NULL;
  if (st != REFIT_OK)
    goto err;
  if (h.magic != REFIT_AGENT_MAGIC) {
    st = REFIT_ERR(
        REFIT_ERR_INVALID_ARGUMENT,
        "attach protocol: not a refit agent message (magic %08x, expected %08x)", h.magic,
        REFIT_AGENT_MAGIC);
    goto err;
  }
  if (h.proto != REFIT_AGENT_PROTO || h.flags != 0) {
    st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                   "attach protocol: version %u (flags %u); this side speaks version %d",
                   h.proto, h.flags, REFIT_AGENT_PROTO);
    goto err;
  }
  if (h.bytes == 0 || h.bytes > REFIT_AGENT_BYTES_MAX || h.nfds > REFIT_AGENT_FDS_MAX) {
    st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                   "attach protocol: a message of %u bytes and %u descriptors (1 to %u "
                   "bytes, at most %d descriptors)",
                   h.bytes, h.nfds, REFIT_AGENT_BYTES_MAX, REFIT_AGENT_FDS_MAX);
    goto err;
  }
  text = malloc((size_t)h.bytes + 1);
  if (text == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "attach protocol: %u bytes", h.bytes);
    goto err;
  }
  st = refit_agent_read(sock, text, h.bytes, msg, &deadline, bound, 0);
  if (st != REFIT_OK)
    goto err;
  text[h.bytes] = '\0';
  if ((uint32_t)msg->nfds != h.nfds) {
    st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                   "attach protocol: the header announces %u descriptors, %d arrived",
                   h.nfds, msg->nfds);
    goto err;
  }
  json_error_t jerr;
  msg->json = json_loadb(text, h.bytes, JSON_REJECT_DUPLICATES, &jerr);
  if (msg->json == NULL || !json_is_object(msg->json)) {
    st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                   "attach protocol: the payload is not one JSON object (%s at byte %d)",
                   msg->json == NULL ? jerr.text : "another value",
                   msg->json == NULL ? jerr.position : 0);
    goto err;
  }
  free(text);
  return REFIT_OK;
err:
  free(text);
  refit_agent_msg_clear(msg);
  return st;
}

void refit_agent_msg_clear(refit_agent_msg_t *msg) {
  for (int i = 0; i < msg->nfds; i++)
    if (msg->fds[i] >= 0)
      close(msg->fds[i]);
  msg->nfds = 0;
  if (msg->json != NULL)
    json_decref(msg->json);
  msg->json = NULL;
}

void refit_agent_hex(const unsigned char *in, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[in[i] >> 4];
    out[2 * i + 1] = digits[in[i] & 15];
  }
  out[2 * n] = '\0';
}

int refit_agent_unhex(const char *in, unsigned char *out, size_t n) {
  if (in == NULL || strlen(in) != 2 * n)
    return -1;
  for (size_t i = 0; i < 2 * n; i++) {
    const char c = in[i];
    const int v = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (v < 0)
      return -1;
    if (i % 2 == 0)
      out[i / 2] = (unsigned char)(v << 4);
    else
      out[i / 2] |= (unsigned char)v;
  }
  return 0;
}

refit_status_t refit_agent_dir_check(const char *dir) {
  if (mkdir(dir, 0700) != 0 && errno != EEXIST)
    return REFIT_ERR(REFIT_ERR_SYSTEM, "agent socket directory %s: mkdir: %s", dir,
                     strerror(errno));
  struct stat st;
  if (lstat(dir, &st) != 0)
    return REFIT_ERR(REFIT_ERR_SYSTEM, "agent socket directory %s: %s", dir,
                     strerror(errno));
  if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "agent socket directory %s is %s, not a directory; refused (a "
                     "planted link would put the sockets where another user chose)",
                     dir, S_ISLNK(st.st_mode) ? "a symbolic link" : "not a directory");
  if (st.st_uid != geteuid() || (st.st_mode & 022) != 0)
    return REFIT_ERR(
        REFIT_ERR_INVALID_ARGUMENT,
        "agent socket directory %s belongs to uid %u with mode %03o; it must "
        "be this user's (uid %u) and writable by nobody else",
        dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777), (unsigned)geteuid());
  return REFIT_OK;
}

void refit_agent_socket_dir(const char *explicit_dir, char *out, size_t len) {
  const char *dir = explicit_dir;
  int set = 0;
  if (dir == NULL || dir[0] == '\0')
    (void)refit_env_text("REFIT_AGENT_DIR", &dir, &set); /* any text: a path */
  if (dir != NULL && dir[0] != '\0')
    snprintf(out, len, "%s", dir);
  else
    snprintf(out, len, "/tmp/refit-agent-%u", (unsigned)geteuid());
}

void refit_agent_socket_path(const char *dir, const char *side, int role_rank, char *out,
                             size_t len) {
  snprintf(out, len, "%s/%s.%d.sock", dir, side, role_rank);
}
