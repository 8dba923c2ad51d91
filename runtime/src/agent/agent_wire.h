/*
 * The attach protocol's framing (docs/agent.md): what a refit agent and a
 * framework process attached to it exchange over a Unix stream socket.
 *
 * A message is a 16-byte frame header, then `bytes` of UTF-8 JSON (one
 * object), with `nfds` file descriptors passed alongside the header
 * (SCM_RIGHTS). Everything is checked before it is trusted: the magic, the
 * protocol version, the payload bound, the count of descriptors against
 * what arrived, that the payload is one JSON object. A message that fails
 * any check, or that does not arrive whole within its deadline, ends the
 * connection with an error naming what was wrong; the peer is never asked
 * to resynchronize.
 *
 * No MPI and no CUDA here: both the agent (runtime/tools/refit_agent.c) and
 * the C client library (refit/agent.h) use it.
 */
#ifndef REFIT_AGENT_WIRE_H
#define REFIT_AGENT_WIRE_H

#include "refit/status.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define REFIT_AGENT_PROTO 1
#define REFIT_AGENT_MAGIC 0x47414652u /* "RFAG" little-endian */
/* A message's JSON: the expected-tensor list of a large rank (thousands of
 * tensors) fits many times over. */
#define REFIT_AGENT_BYTES_MAX (16u << 20)
/* Descriptors in one message: one per distinct allocation of a batch. */
#define REFIT_AGENT_FDS_MAX 64

typedef struct {
  uint32_t magic;
  uint16_t proto;
  uint16_t flags; /* 0 */
  uint32_t bytes; /* JSON payload after the header */
  uint32_t nfds;  /* descriptors passed with the header */
} refit_agent_frame_t;

/* A received message: its JSON object and descriptors (owned: the caller
 * closes what it does not keep, refit_agent_msg_clear closes the rest). */
typedef struct {
  json_t *json;
  int fds[REFIT_AGENT_FDS_MAX];
  int nfds;
} refit_agent_msg_t;

/* Send `json` (not consumed) with `nfds` descriptors. Blocking, bounded by
 * `timeout_s` (a peer that stops reading is an error, not a hang). */
refit_status_t refit_agent_send(int sock, const json_t *json, const int *fds, int nfds,
                                double timeout_s);

/* Receive one message whole, within `timeout_s` of its first byte (a
 * negative timeout_s waits for the first byte without a deadline). Returns
 * REFIT_ERR_PEER with "closed" in the message when the peer closed the
 * connection before a message began, REFIT_ERR_INVALID_ARGUMENT for a
 * malformed message, REFIT_ERR_TIMEOUT for one that stopped part way. */
refit_status_t refit_agent_recv(int sock, refit_agent_msg_t *msg, double timeout_s);

/* Close the descriptors still held and free the JSON. */
void refit_agent_msg_clear(refit_agent_msg_t *msg);

/* Lower-case hex of `n` bytes into `out` (2n + 1 bytes), and back (0 on
 * success, -1 on a bad string or length). */
void refit_agent_hex(const unsigned char *in, size_t n, char *out);
int refit_agent_unhex(const char *in, unsigned char *out, size_t n);

/* Create `dir` (0700) if missing and check it is a directory owned by this
 * user, not a symbolic link, writable by nobody else: where an agent puts
 * its socket. */
refit_status_t refit_agent_dir_check(const char *dir);

/* Where the agents' sockets are (docs/agent.md): `explicit_dir` when given
 * and not empty, else $REFIT_AGENT_DIR when set and not empty, else
 * /tmp/refit-agent-<uid>; the agent and the C client choose alike. */
void refit_agent_socket_dir(const char *explicit_dir, char *out, size_t len);

/* The socket of side ("trainer" or "generator") rank `role_rank` in `dir`. */
void refit_agent_socket_path(const char *dir, const char *side, int role_rank, char *out,
                             size_t len);

#endif
