/*
 * The C client of a refit agent (refit/agent.h): requests over the attach
 * protocol's framing (agent_wire.h), replies turned into refit_status_t with
 * the agent's sentence in refit_last_error(). No MPI, no CUDA, no librefit.
 */

#include "refit/agent.h"

#include "agent/agent_wire.h"
#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* Connecting, the hello and every request answered at once. */
#define CLIENT_TIMEOUT_S 60.0
/* How long client_call waits for a reply: the client's bound, or none (for
 * the first byte; the rest of a message is bounded by the framing). */
#define CLIENT_BOUNDED 0.0
#define CLIENT_NO_DEADLINE (-1.0)

struct refit_agent_client {
  int sock; /* -1 once closed */
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  double timeout_s;
  refit_agent_info_t info;
  int have_commit_event;
  unsigned char commit_event[REFIT_AGENT_IPC_HANDLE_BYTES];
  json_t *hello; /* the hello's reply: the expected names point into it */
  refit_agent_tensor_t *expected;
  int64_t nexpected;
  refit_agent_times_t times;
  char cause[1024];
};

static const char *const client_dtypes[] = {"bfloat16", "float8_e4m3fn", "float8_e8m0fnu",
                                            "float32", "uint8"};
#define CLIENT_NDTYPES ((int)(sizeof(client_dtypes) / sizeof(client_dtypes[0])))

const char *refit_agent_dtype_name(refit_agent_dtype_t dtype) {
  return (unsigned)dtype < (unsigned)CLIENT_NDTYPES ? client_dtypes[dtype] : "?";
}

/* The status the agent named ("REFIT_ERR_PEER"); one it does not share with
 * this library is an internal error, never a silent success. */
static refit_status_t client_status_of(const char *name) {
  for (int s = 1; name != NULL && s < REFIT_STATUS_COUNT; s++)
    if (strcmp(name, refit_status_name((refit_status_t)s)) == 0)
      return (refit_status_t)s;
  return REFIT_ERR_INTERNAL;
}

static void client_disconnect(refit_agent_client_h c) {
  if (c->sock >= 0)
    close(c->sock);
  c->sock = -1;
}

/*
 * One request and its reply. `req` is consumed. `timeout_s` bounds the
 * wait for the reply: CLIENT_BOUNDED, CLIENT_NO_DEADLINE or seconds. On success *reply
 * (if not NULL) owns the reply object. A transport failure closes the connection: the
 * protocol has no way to find the next reply again.
 */
static refit_status_t client_call(refit_agent_client_h c, const char *op, json_t *req,
                                  const int *fds, int nfds, double timeout_s,
                                  json_t **reply) {
  refit_agent_msg_t msg = {0};
  refit_status_t st = REFIT_OK;
  if (c == NULL) {
    st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "%s: NULL client", op);
    goto out;
  }
  c->cause[0] = '\0';
  if (req == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "%s: building the request", op);
    goto out;
  }
  if (c->sock < 0) {
    st = REFIT_ERR(REFIT_ERR_STATE,
                   "%s: this client's connection to %s is closed; attach again", op,
                   c->path);
    goto out;
  }
  st = refit_agent_send(c->sock, req, fds, nfds, c->timeout_s);
  if (st == REFIT_OK)
    st = refit_agent_recv(c->sock, &msg,
                          timeout_s == CLIENT_BOUNDED ? c->timeout_s : timeout_s);
  if (st != REFIT_OK) {
    char why[1024];
    snprintf(why, sizeof(why), "%s", refit_last_error());
    client_disconnect(c);
    st = REFIT_ERR(st, "%s: the agent at %s: %s (the connection is closed; attach again)",
                   op, c->path, why);
    goto out;
  }
  if (!json_is_true(json_object_get(msg.json, "ok"))) {
    const char *error = json_string_value(json_object_get(msg.json, "error"));
    const char *cause = json_string_value(json_object_get(msg.json, "cause"));
    snprintf(c->cause, sizeof(c->cause), "%s", cause != NULL ? cause : "");
    st = REFIT_ERR(
        client_status_of(json_string_value(json_object_get(msg.json, "status"))), "%s",
        error != NULL ? error : "the agent refused without a message");
    goto out;
  }
  if (reply != NULL)
    *reply = json_incref(msg.json);
out:
  refit_agent_msg_clear(&msg);
  json_decref(req);
  return st;
}

/* An integer field of a reply; REFIT_ERR_INTERNAL names a missing one. */
static refit_status_t client_int(const json_t *reply, const char *op, const char *key,
                                 json_int_t *out) {
  const json_t *v = json_object_get(reply, key);
  if (!json_is_integer(v))
    return REFIT_ERR(REFIT_ERR_INTERNAL, "%s: the agent's reply has no integer '%s'", op,
                     key);
  *out = json_integer_value(v);
  return REFIT_OK;
}

/* A request whose reply carries the integer `key`: into *out, and the
 * reply itself into *reply when that is not NULL. */
static refit_status_t client_call_int(refit_agent_client_h c, const char *op, json_t *req,
                                      double timeout_s, const char *key, json_int_t *out,
                                      json_t **reply) {
  json_t *r = NULL;
  REFIT_CHECK(client_call(c, op, req, NULL, 0, timeout_s, &r));
  const refit_status_t st = client_int(r, op, key, out);
  if (st == REFIT_OK && reply != NULL)
    *reply = r;
  else
    json_decref(r);
  return st;
}

/* A version a request may carry: the protocol's integers are signed. */
static refit_status_t client_version_check(const char *op, uint64_t version) {
  if (version == 0 || version > (uint64_t)INT64_MAX)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "%s %llu: versions start at 1 and stay below 2^63", op,
                     (unsigned long long)version);
  return REFIT_OK;
}

/* ---- attaching ------------------------------------------------------------ */

/* Connect within the client's timeout (a listener's full backlog is
 * EAGAIN on a non-blocking Unix socket: try again). */
static refit_status_t client_connect(refit_agent_client_h c) {
  struct sockaddr_un addr = {0};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, c->path, strlen(c->path) + 1);
  c->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (c->sock < 0)
    return REFIT_ERR(REFIT_ERR_SYSTEM, "attach %s: socket: %s", c->path, strerror(errno));
  for (int waited_ms = 0;; waited_ms += 10) {
    if (connect(c->sock, (struct sockaddr *)&addr, sizeof(addr)) == 0)
      return REFIT_OK;
    const int e = errno;
    if (e == EINTR)
      continue;
    if (e == ENOENT || e == ECONNREFUSED)
      return REFIT_ERR(
          REFIT_ERR_NOT_AVAILABLE,
          "attach: no agent listens at %s (%s): start the agents first "
          "(launch/refit-launch CONFIG -- refit-agent CONFIG), or name their "
          "directory (socket_dir, $REFIT_AGENT_DIR)",
          c->path, strerror(e));
    if (e != EAGAIN || waited_ms >= (int)(c->timeout_s * 1000.0))
      return REFIT_ERR(REFIT_ERR_SYSTEM, "attach: connecting to %s: %s", c->path,
                       strerror(e));
    nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
  }
}

/* The expected-tensor list of the hello's reply, checked entry by entry. */
static refit_status_t client_parse_expected(refit_agent_client_h c) {
  const json_t *list = json_object_get(c->hello, "expected");
  if (!json_is_array(list))
    return REFIT_ERR(REFIT_ERR_INTERNAL,
                     "hello: the agent's reply has no 'expected' list");
  const size_t n = json_array_size(list);
  c->expected = calloc(n ? n : 1, sizeof(*c->expected));
  if (c->expected == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "hello: %zu expected tensors", n);
  for (size_t i = 0; i < n; i++) {
    const json_t *e = json_array_get(list, i);
    const json_t *shape = json_object_get(e, "shape");
    refit_agent_tensor_t *t = &c->expected[i];
    t->name = json_string_value(json_object_get(e, "name"));
    const char *dtype = json_string_value(json_object_get(e, "dtype"));
    int d = 0;
    while (dtype != NULL && d < CLIENT_NDTYPES && strcmp(dtype, client_dtypes[d]) != 0)
      d++;
    if (t->name == NULL || dtype == NULL || d == CLIENT_NDTYPES ||
        !json_is_array(shape) || json_array_size(shape) > REFIT_AGENT_MAX_DIMS ||
        !json_is_integer(json_object_get(e, "bytes")))
      return REFIT_ERR(REFIT_ERR_INTERNAL,
                       "hello: expected tensor %zu of the agent's reply is not {name, "
                       "shape (at most %d dimensions), dtype (bfloat16, float8_e4m3fn, "
                       "float8_e8m0fnu, float32, uint8), bytes}",
                       i, REFIT_AGENT_MAX_DIMS);
    t->dtype = (refit_agent_dtype_t)d;
    t->bytes = (size_t)json_integer_value(json_object_get(e, "bytes"));
    t->ndim = (int)json_array_size(shape);
    for (int k = 0; k < t->ndim; k++)
      t->shape[k] = json_integer_value(json_array_get(shape, (size_t)k));
  }
  c->nexpected = (int64_t)n;
  return REFIT_OK;
}

static refit_status_t client_parse_hello(refit_agent_client_h c) {
  const json_t *h = c->hello;
  const char *side = json_string_value(json_object_get(h, "side"));
  const char *memory = json_string_value(json_object_get(h, "memory"));
  const char *mode = json_string_value(json_object_get(h, "mode"));
  json_int_t rank = 0, world_rank = 0, engine = 0, tp_rank = 0, device = 0, committed = 0;
  REFIT_CHECK(client_int(h, "hello", "rank", &rank));
  REFIT_CHECK(client_int(h, "hello", "world_rank", &world_rank));
  REFIT_CHECK(client_int(h, "hello", "engine", &engine));
  REFIT_CHECK(client_int(h, "hello", "tp_rank", &tp_rank));
  REFIT_CHECK(client_int(h, "hello", "device", &device));
  REFIT_CHECK(client_int(h, "hello", "committed", &committed));
  if (side == NULL || memory == NULL || mode == NULL ||
      (strcmp(side, "trainer") != 0 && strcmp(side, "generator") != 0))
    return REFIT_ERR(REFIT_ERR_INTERNAL,
                     "hello: the agent's reply lacks 'side' (trainer or generator), "
                     "'memory' or 'mode'");
  c->info.side =
      strcmp(side, "trainer") == 0 ? REFIT_AGENT_TRAINER : REFIT_AGENT_GENERATOR;
  c->info.rank = (int)rank;
  c->info.world_rank = (int)world_rank;
  c->info.engine = (int)engine;
  c->info.tp_rank = (int)tp_rank;
  c->info.async = strcmp(mode, "async") == 0;
  c->info.device = strcmp(memory, "cuda") == 0 ? (int)device : -1;
  c->info.committed = (uint64_t)committed;
  if (c->info.device >= 0) {
    const char *ev = json_string_value(json_object_get(h, "commit_event"));
    if (refit_agent_unhex(ev, c->commit_event, sizeof(c->commit_event)) != 0)
      return REFIT_ERR(
          REFIT_ERR_INTERNAL,
          "hello: a GPU rank's agent sent no 'commit_event' (64 bytes of hex)");
    c->have_commit_event = 1;
  }
  return client_parse_expected(c);
}

static refit_status_t client_attach(const char *path, const char *side,
                                    const unsigned char *begin_event,
                                    refit_agent_client_h *out) {
  if (path == NULL || out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "attach: NULL path or out");
  struct refit_agent_client *c = NULL;
  if (strlen(path) >= sizeof(c->path))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "attach: socket path %s is longer than %zu bytes", path,
                     sizeof(c->path) - 1);
  c = calloc(1, sizeof(*c));
  if (c == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "attach %s: the client", path);
  snprintf(c->path, sizeof(c->path), "%s", path);
  c->timeout_s = CLIENT_TIMEOUT_S;
  refit_status_t st = client_connect(c);
  if (st != REFIT_OK)
    goto err_close;
  json_t *hello = json_pack("{s:s,s:i,s:I}", "op", "hello", "proto", REFIT_AGENT_PROTO,
                            "pid", (json_int_t)getpid());
  if (hello != NULL && side != NULL)
    json_object_set_new(hello, "side", json_string(side));
  if (hello != NULL && begin_event != NULL) {
    char hex[2 * REFIT_AGENT_IPC_HANDLE_BYTES + 1];
    refit_agent_hex(begin_event, REFIT_AGENT_IPC_HANDLE_BYTES, hex);
    json_object_set_new(hello, "begin_event", json_string(hex));
  }
  st = client_call(c, "hello", hello, NULL, 0, CLIENT_BOUNDED, &c->hello);
  if (st != REFIT_OK)
    goto err_close;
  st = client_parse_hello(c);
  if (st != REFIT_OK)
    goto err_close;
  *out = c;
  return REFIT_OK;
err_close:
  refit_agent_client_close(c);
  return st;
}

refit_status_t refit_agent_client_attach_path(const char *path,
                                              const unsigned char *begin_event,
                                              refit_agent_client_h *out) {
  return client_attach(path, NULL, begin_event, out);
}

refit_status_t refit_agent_client_attach(refit_agent_side_t side, int rank,
                                         const char *socket_dir,
                                         const unsigned char *begin_event,
                                         refit_agent_client_h *out) {
  if ((side != REFIT_AGENT_TRAINER && side != REFIT_AGENT_GENERATOR) || rank < 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "attach: side %d rank %d (REFIT_AGENT_TRAINER or "
                     "REFIT_AGENT_GENERATOR, a rank >= 0)",
                     (int)side, rank);
  char dir[4096];
  refit_agent_socket_dir(socket_dir, dir, sizeof(dir));
  const char *name = side == REFIT_AGENT_TRAINER ? "trainer" : "generator";
  char path[4200];
  refit_agent_socket_path(dir, name, rank, path, sizeof(path));
  return client_attach(path, name, begin_event, out);
}

void refit_agent_client_close(refit_agent_client_h c) {
  if (c == NULL)
    return;
  client_disconnect(c);
  free(c->expected);
  if (c->hello != NULL)
    json_decref(c->hello);
  free(c);
}

refit_status_t refit_agent_client_set_timeout(refit_agent_client_h c, double timeout_s) {
  if (c == NULL || !(timeout_s > 0))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "set_timeout: a client and a bound > 0 s (got %g)", timeout_s);
  c->timeout_s = timeout_s;
  return REFIT_OK;
}

refit_status_t refit_agent_client_info(refit_agent_client_h c, refit_agent_info_t *out) {
  if (c == NULL || out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "info: NULL client or out");
  *out = c->info;
  return REFIT_OK;
}

refit_status_t
refit_agent_client_commit_event(refit_agent_client_h c,
                                unsigned char out[REFIT_AGENT_IPC_HANDLE_BYTES]) {
  if (c == NULL || out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "commit_event: NULL client or out");
  if (!c->have_commit_event)
    return REFIT_ERR(REFIT_ERR_STATE,
                     "commit_event: the agent of this rank runs on host memory; there is "
                     "no commit event to wait on");
  memcpy(out, c->commit_event, REFIT_AGENT_IPC_HANDLE_BYTES);
  return REFIT_OK;
}

const char *refit_agent_client_cause(refit_agent_client_h c) {
  return c != NULL ? c->cause : "";
}

/* ---- the tensors this rank holds --------------------------------------------- */

int64_t refit_agent_client_expected_count(refit_agent_client_h c) {
  return c != NULL ? c->nexpected : -1;
}

refit_status_t refit_agent_client_expected_get(refit_agent_client_h c, int64_t index,
                                               refit_agent_tensor_t *out) {
  if (c == NULL || out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "expected_get: NULL client or out");
  if (index < 0 || index >= c->nexpected)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "expected_get: index %lld out of range (0 to %lld)",
                     (long long)index, (long long)c->nexpected - 1);
  *out = c->expected[index];
  return REFIT_OK;
}

/* A registration entry's common part: name, shape, dtype, bytes, offset. */
static refit_status_t client_entry(const refit_agent_tensor_t *t, size_t i, size_t offset,
                                   json_t **out) {
  if (t->name == NULL || t->ndim < 0 || t->ndim > REFIT_AGENT_MAX_DIMS ||
      (unsigned)t->dtype >= (unsigned)CLIENT_NDTYPES)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "register: tensor %zu (%s): needs a name, 0 to %d dimensions and a "
                     "dtype of refit_agent_dtype_t (got ndim %d, dtype %d)",
                     i, t->name != NULL ? t->name : "no name", REFIT_AGENT_MAX_DIMS,
                     t->ndim, (int)t->dtype);
  json_t *shape = json_array();
  for (int d = 0; shape != NULL && d < t->ndim; d++)
    json_array_append_new(shape, json_integer(t->shape[d]));
  *out = json_pack("{s:s,s:o,s:s,s:I,s:I}", "name", t->name, "shape", shape, "dtype",
                   client_dtypes[t->dtype], "bytes", (json_int_t)t->bytes, "offset",
                   (json_int_t)offset);
  if (*out == NULL)
    return REFIT_ERR(REFIT_ERR_NO_MEMORY, "register: tensor %s", t->name);
  return REFIT_OK;
}

static refit_status_t client_register_batch(refit_agent_client_h c, json_t *entries,
                                            const int *fds, int nfds) {
  json_t *req = json_pack("{s:s,s:o}", "op", "register", "tensors", entries);
  return client_call(c, "register", req, fds, nfds, CLIENT_BOUNDED, NULL);
}

refit_status_t refit_agent_client_register_host(refit_agent_client_h c,
                                                const refit_agent_host_tensor_t *tensors,
                                                size_t n) {
  if (c == NULL || (tensors == NULL && n > 0))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "register_host: NULL client or tensors");
  if (c->info.device >= 0)
    return REFIT_ERR(REFIT_ERR_STATE,
                     "register_host: the agent of %s rank %d runs on GPU %d; register "
                     "device memory of that GPU (refit_agent_client_register_device)",
                     c->info.side == REFIT_AGENT_TRAINER ? "trainer" : "generator",
                     c->info.rank, c->info.device);
  /* One message per 64 distinct descriptors: the framing's bound. */
  int fds[REFIT_AGENT_FDS_MAX];
  int nfds = 0;
  json_t *entries = json_array();
  refit_status_t st = REFIT_OK;
  for (size_t i = 0; i < n && st == REFIT_OK; i++) {
    const refit_agent_host_tensor_t *t = &tensors[i];
    if (t->fd < 0) {
      st = REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "register_host: tensor %zu (%s): fd %d is not a descriptor", i,
                     t->tensor.name != NULL ? t->tensor.name : "no name", t->fd);
      break;
    }
    int k = 0;
    while (k < nfds && fds[k] != t->fd)
      k++;
    if (k == REFIT_AGENT_FDS_MAX) {
      st = client_register_batch(c, entries, fds, nfds);
      entries = json_array();
      nfds = k = 0;
      if (st != REFIT_OK)
        break;
    }
    if (k == nfds)
      fds[nfds++] = t->fd;
    json_t *e = NULL;
    st = client_entry(&t->tensor, i, t->offset, &e);
    if (st == REFIT_OK) {
      json_object_set_new(e, "fd", json_integer(k));
      json_array_append_new(entries, e);
    }
  }
  if (st == REFIT_OK && json_array_size(entries) > 0)
    return client_register_batch(c, entries, fds, nfds);
  json_decref(entries);
  return st;
}

refit_status_t
refit_agent_client_register_device(refit_agent_client_h c,
                                   const refit_agent_device_tensor_t *tensors, size_t n) {
  if (c == NULL || (tensors == NULL && n > 0))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "register_device: NULL client or tensors");
  if (c->info.device < 0)
    return REFIT_ERR(REFIT_ERR_STATE,
                     "register_device: the agent of %s rank %d runs on host memory; "
                     "register shared host memory (refit_agent_client_register_host)",
                     c->info.side == REFIT_AGENT_TRAINER ? "trainer" : "generator",
                     c->info.rank);
  json_t *entries = json_array();
  refit_status_t st = REFIT_OK;
  for (size_t i = 0; i < n && st == REFIT_OK; i++) {
    const refit_agent_device_tensor_t *t = &tensors[i];
    json_t *e = NULL;
    st = client_entry(&t->tensor, i, t->offset, &e);
    if (st != REFIT_OK)
      break;
    char hex[2 * REFIT_AGENT_IPC_HANDLE_BYTES + 1];
    refit_agent_hex(t->handle, REFIT_AGENT_IPC_HANDLE_BYTES, hex);
    json_object_set_new(e, "handle", json_string(hex));
    json_object_set_new(e, "alloc_bytes", json_integer((json_int_t)t->alloc_bytes));
    json_array_append_new(entries, e);
  }
  if (st != REFIT_OK) {
    json_decref(entries);
    return st;
  }
  return client_register_batch(c, entries, NULL, 0);
}

refit_status_t refit_agent_alloc_shared(size_t bytes, void **ptr, int *fd) {
  if (bytes == 0 || ptr == NULL || fd == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "alloc_shared: %zu bytes (> 0) and non-NULL ptr and fd", bytes);
  const int f = memfd_create("refit-agent-tensors", MFD_CLOEXEC);
  if (f < 0)
    return REFIT_ERR(REFIT_ERR_SYSTEM, "alloc_shared: memfd_create: %s", strerror(errno));
  if (ftruncate(f, (off_t)bytes) != 0) {
    const int e = errno;
    close(f);
    return REFIT_ERR(REFIT_ERR_SYSTEM, "alloc_shared: ftruncate to %zu bytes: %s", bytes,
                     strerror(e));
  }
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    close(f);
    return REFIT_ERR(REFIT_ERR_SYSTEM, "alloc_shared: mmap of %zu bytes: %s", bytes,
                     strerror(e));
  }
  *ptr = p;
  *fd = f;
  return REFIT_OK;
}

void refit_agent_free_shared(void *ptr, size_t bytes, int fd) {
  if (ptr != NULL)
    munmap(ptr, bytes);
  if (fd >= 0)
    close(fd);
}

/* ---- refits ------------------------------------------------------------------ */

/* The times a committing reply carries (left as they were when absent). */
static void client_take_times(refit_agent_client_h c, const json_t *reply) {
  const json_t *t = json_object_get(reply, "times");
  if (!json_is_object(t))
    return;
  const json_t *w = json_object_get(t, "wire");
  refit_agent_times_t *o = &c->times;
  o->source = json_number_value(json_object_get(t, "source"));
  o->pack = json_number_value(json_object_get(t, "pack"));
  o->transfer = json_number_value(json_object_get(t, "transfer"));
  o->land = json_number_value(json_object_get(t, "land"));
  o->commit = json_number_value(json_object_get(t, "commit"));
  o->total = json_number_value(json_object_get(t, "total"));
  o->delta = json_is_true(json_object_get(w, "delta"));
  o->wire_bytes = (uint64_t)json_integer_value(json_object_get(w, "wire_bytes"));
  o->full_bytes = (uint64_t)json_integer_value(json_object_get(w, "full_bytes"));
  o->changed_bytes = (uint64_t)json_integer_value(json_object_get(w, "changed_bytes"));
  o->written_bytes = (uint64_t)json_integer_value(json_object_get(w, "written_bytes"));
}

/* A request of `op` without fields, answered at once. */
static refit_status_t client_simple(refit_agent_client_h c, const char *op,
                                    json_t **reply) {
  return client_call(c, op, json_pack("{s:s}", "op", op), NULL, 0, CLIENT_BOUNDED, reply);
}

/* commit and refit: the version the reply says committed, and its times. */
static refit_status_t client_call_commit(refit_agent_client_h c, const char *op,
                                         json_t *req, double timeout_s,
                                         uint64_t *version) {
  json_t *r = NULL;
  json_int_t v = 0;
  REFIT_CHECK(client_call_int(c, op, req, timeout_s, "version", &v, &r));
  c->info.committed = (uint64_t)v;
  client_take_times(c, r);
  json_decref(r);
  if (version != NULL)
    *version = (uint64_t)v;
  return REFIT_OK;
}

refit_status_t refit_agent_client_begin(refit_agent_client_h c, uint64_t version) {
  REFIT_CHECK(client_version_check("begin", version));
  /* No deadline: the agents decide when the round starts or is refused. */
  return client_call(
      c, "begin", json_pack("{s:s,s:I}", "op", "begin", "version", (json_int_t)version),
      NULL, 0, CLIENT_NO_DEADLINE, NULL);
}

refit_status_t refit_agent_client_progress(refit_agent_client_h c, int *done) {
  json_t *r = NULL;
  REFIT_CHECK(client_simple(c, "progress", &r));
  const int d = json_is_true(json_object_get(r, "done"));
  json_decref(r);
  if (done != NULL)
    *done = d;
  return REFIT_OK;
}

refit_status_t refit_agent_client_commit(refit_agent_client_h c, uint64_t *version) {
  return client_call_commit(c, "commit", json_pack("{s:s}", "op", "commit"),
                            CLIENT_BOUNDED, version);
}

refit_status_t refit_agent_client_abort(refit_agent_client_h c) {
  return client_simple(c, "abort", NULL);
}

refit_status_t refit_agent_client_refit(refit_agent_client_h c, uint64_t version) {
  REFIT_CHECK(client_version_check("refit", version));
  /* No deadline for the round to start: the agents decide when it starts or
   * is refused; then the session's own deadlines hold. */
  return client_call_commit(
      c, "refit", json_pack("{s:s,s:I}", "op", "refit", "version", (json_int_t)version),
      CLIENT_NO_DEADLINE, NULL);
}

refit_status_t refit_agent_client_next_version(refit_agent_client_h c, double timeout_s,
                                               uint64_t *version) {
  if (c == NULL || version == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "next_version: NULL client or version");
  json_t *req = json_pack("{s:s}", "op", "next");
  if (req != NULL)
    json_object_set_new(req, "timeout_s",
                        timeout_s < 0 ? json_null() : json_real(timeout_s));
  /* The agent answers at its own deadline (0: none came): allow it the
   * client's bound on top. */
  json_int_t v = 0;
  REFIT_CHECK(client_call_int(
      c, "next", req, timeout_s < 0 ? CLIENT_NO_DEADLINE : timeout_s + c->timeout_s,
      "version", &v, NULL));
  *version = (uint64_t)v;
  return REFIT_OK;
}

refit_status_t refit_agent_client_verify(refit_agent_client_h c, uint64_t version,
                                         int64_t *mismatches) {
  if (c == NULL || mismatches == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "verify: NULL client or mismatches");
  json_t *req = json_pack("{s:s}", "op", "verify");
  if (version != 0) {
    REFIT_CHECK(client_version_check("verify", version));
    if (req != NULL)
      json_object_set_new(req, "version", json_integer((json_int_t)version));
  }
  json_int_t bad = 0;
  REFIT_CHECK(
      client_call_int(c, "verify", req, CLIENT_BOUNDED, "mismatches", &bad, NULL));
  *mismatches = (int64_t)bad;
  return REFIT_OK;
}

refit_status_t refit_agent_client_status(refit_agent_client_h c, char *state, size_t len,
                                         uint64_t *committed) {
  json_t *r = NULL;
  json_int_t v = 0;
  REFIT_CHECK(client_call_int(c, "status", json_pack("{s:s}", "op", "status"),
                              CLIENT_BOUNDED, "committed", &v, &r));
  const char *s = json_string_value(json_object_get(r, "state"));
  if (state != NULL && len > 0)
    snprintf(state, len, "%s", s != NULL ? s : "");
  if (committed != NULL)
    *committed = (uint64_t)v;
  json_decref(r);
  return REFIT_OK;
}

refit_status_t refit_agent_client_last_times(refit_agent_client_h c,
                                             refit_agent_times_t *out) {
  if (c == NULL || out == NULL)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT, "last_times: NULL client or out");
  *out = c->times;
  return REFIT_OK;
}

refit_status_t refit_agent_client_shutdown(refit_agent_client_h c) {
  const refit_status_t st = client_simple(c, "shutdown", NULL);
  if (st == REFIT_OK)
    client_disconnect(c);
  return st;
}
