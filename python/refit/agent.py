"""The pure-Python client of a refit agent (docs/agent.md).

A framework process (a torchrun trainer rank, a vLLM worker, a Ray actor)
attaches to the refit agent of its rank, an MPI job launched beside it with
`launch/refit-launch CONFIG -- refit-agent CONFIG`, and refits through it.
Nothing here loads MPI, librefit or mpi4py: the process speaks the attach
protocol over a Unix socket and hands its tensors over by handle.

    import refit
    c = refit.attach("trainer", rank)            # or "generator"
    c.register_all(model.named_parameters(), strip_prefix="module.")
    for version in range(1, steps + 1):
        train_one_step(model)
        c.refit(version)                         # engines: c.refit() takes the
                                                 # version the trainers began

Host tensors travel as shared-memory file descriptors: a torch CPU tensor is
moved into shared memory once, at registration (torch's share_memory_(), the
tensor object stays the same), a numpy array must come from refit.empty().
CUDA tensors travel as CUDA IPC handles of their allocation (PyTorch's own
sharing), with an interprocess event that orders the agent's work after the
caller's current stream at begin, and one the caller's stream waits on after
commit. Either way the agent maps each allocation once and reads and writes
the caller's memory in place.
"""

import array
import json
import mmap
import os
import socket
import struct

from . import _config, _dtype, _report, _status

PROTO = 1
MAGIC = 0x47414652
_HEADER = struct.Struct("<IHHII")
_BYTES_MAX = 16 << 20
_FDS_MAX = 64

# The element types refit_tensor_dtype_t knows, by the agent's names.
DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e8m0fnu", "float32", "uint8")


class AgentError(_status.Error):
    """An agent refused or failed a request. `status` is the refit_status_t
    name (REFIT_ERR_PEER, ...), `message` the agent's sentence (naming the
    rank, tensor, version and, where another rank failed, why: `cause`).
    Each is also the refit error class of its status: an agent's
    REFIT_ERR_TIMEOUT is a refit.TimeoutError and a builtin TimeoutError."""

    def __new__(cls, status, message, cause=None):
        if cls is AgentError:
            cls = _agent_class(status)
        return super().__new__(cls, status, message)

    def __init__(self, status, message, cause=None):
        super().__init__(status, message)
        self.cause = cause


_AGENT_CLASSES = {}  # REFIT_ERR_... -> AgentError's subclass for it


def _agent_class(status):
    cls = _AGENT_CLASSES.get(status)
    if cls is None:
        base = _status.error_class(status)
        cls = type(base.__name__, (AgentError, base), {"__module__": "refit"})
        _AGENT_CLASSES[status] = cls
    return cls


def socket_dir(explicit=None):
    """Where agents put their sockets: `explicit`, else $REFIT_AGENT_DIR, else
    /tmp/refit-agent-<uid> (as refit-agent chooses)."""
    return explicit or os.environ.get("REFIT_AGENT_DIR") or "/tmp/refit-agent-%d" % os.geteuid()


def socket_path(side, rank, directory=None):
    return os.path.join(socket_dir(directory), "%s.%d.sock" % (side, rank))


# -- shared host memory --------------------------------------------------

_regions = []  # (start address, end address, fd, bytes) of refit.empty's files


def empty(shape, dtype="uint16"):
    """A numpy array in shared memory (a memfd) that an agent can map: host
    tensors registered from numpy must come from here. bfloat16 bits are
    uint16; float8 bytes uint8; float32 (DeepSeek's score-correction bias)
    float32."""
    import numpy as np
    dt = np.dtype(dtype)
    count = 1
    for n in shape:
        count *= int(n)
    size = max(count * dt.itemsize, 1)
    fd = os.memfd_create("refit-tensor", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    buf = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    arr = np.frombuffer(buf, dtype=dt, count=count).reshape(tuple(int(n) for n in shape))
    start = arr.__array_interface__["data"][0]
    _regions.append((start, start + size, fd, size, buf))
    return arr


def _numpy_handle(arr):
    start = arr.__array_interface__["data"][0]
    for lo, hi, fd, size, _ in _regions:
        if lo <= start and start + arr.nbytes <= hi:
            return fd, size, start - lo
    return None


# -- framing ----------------------------------------------------------------

def _send(sock, obj, fds=()):
    body = json.dumps(obj, separators=(",", ":")).encode()
    if len(body) > _BYTES_MAX:
        raise AgentError("REFIT_ERR_INVALID_ARGUMENT",
                         "a message of %d bytes (at most %d)" % (len(body), _BYTES_MAX))
    head = _HEADER.pack(MAGIC, PROTO, 0, len(body), len(fds))
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    data = head + body
    sent = sock.sendmsg([data], anc)
    if sent < len(data):
        sock.sendall(data[sent:])


def _recv_exact(sock, n):
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the agent closed the connection")
        out += chunk
    return bytes(out)


def _recv(sock):
    magic, proto, flags, nbytes, nfds = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if magic != MAGIC or proto != PROTO or flags or nfds or not 0 < nbytes <= _BYTES_MAX:
        raise AgentError("REFIT_ERR_INVALID_ARGUMENT",
                         "not a refit agent reply (magic %08x, version %d, %d bytes)"
                         % (magic, proto, nbytes))
    return json.loads(_recv_exact(sock, nbytes))


def _torch():
    """torch where the program imported it (a torch tensor or a CUDA rank
    means it did); refit does not import it, which takes seconds."""
    return _dtype.torch_if_used()


class Client:
    """A framework process attached to the refit agent of one rank. Made by
    attach(). One request at a time (a client is used by one thread)."""

    def __init__(self, path, side=None, timeout_s=60.0):
        self.path = path
        torch = _torch()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(path)
        except FileNotFoundError:
            self._sock.close()
            raise FileNotFoundError(
                "refit.attach: no agent socket at %s: start the agents first "
                "(launch/refit-launch CONFIG -- refit-agent CONFIG) or set REFIT_AGENT_DIR"
                % path) from None
        except OSError as e:
            self._sock.close()
            raise ConnectionError("refit.attach: connecting to %s: %s" % (path, e)) from None
        self._sock.settimeout(None)
        self._keep = {}      # name -> the tensor registered (kept alive)
        self._where = {}     # name -> (address, bytes) when it was registered
        self._fds = {}       # id(storage) -> fd shared for it
        self._begin_ev = None
        self._commit_ev = None
        self.last_times = None
        self.last_wire_stats = None
        self._metrics = {}
        hello = {"op": "hello", "proto": PROTO, "pid": os.getpid()}
        if side is not None:
            hello["side"] = side
        self._cuda = False
        # A GPU rank needs the begin event in the hello: made only where the
        # program uses torch with CUDA (a host rank never touches it).
        if torch is not None and torch.cuda.is_available():
            self._begin_ev = torch.cuda.Event(interprocess=True, enable_timing=False)
            self._begin_ev.record()
            hello["begin_event"] = bytes(self._begin_ev.ipc_handle()).hex()
        w = self._call(hello)
        self.side = w["side"]
        self.rank = w["rank"]
        self.world_rank = w["world_rank"]
        self.engine = w["engine"]
        self.tp_rank = w["tp_rank"]
        self.mode = w["mode"]
        self.memory = w["memory"]
        self.device = w["device"]
        self.committed_version = w["committed"]
        self._expected = [(e["name"], tuple(e["shape"]), e["dtype"]) for e in w["expected"]]
        self._expected_by_name = {n: (s, d) for n, s, d in self._expected}
        if self.memory == "cuda":
            self._cuda = True
            self._commit_ev = torch.cuda.Event.from_ipc_handle(
                torch.cuda.current_device(), bytes.fromhex(w["commit_event"]))

    # -- transport ----------------------------------------------------------
    def _call(self, obj, fds=()):
        if self._sock is None:
            raise AgentError("REFIT_ERR_STATE", "this client is closed")
        try:
            _send(self._sock, obj, fds)
            reply = _recv(self._sock)
        except (ConnectionError, BrokenPipeError) as e:
            self.close()
            raise AgentError("REFIT_ERR_PEER", "%s: the agent at %s went away (%s)"
                             % (obj.get("op"), self.path, e)) from None
        if not reply.get("ok"):
            raise AgentError(reply.get("status", "REFIT_ERR_INTERNAL"),
                             reply.get("error", "no message"), reply.get("cause"))
        return reply

    def close(self):
        """Detach (not collective; the agent keeps running and waits for the
        next process). Idempotent."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- what this rank holds -------------------------------------------------
    def expected(self):
        """[(name, shape, dtype)] this rank must register: Megatron-Core's
        names on trainers, vLLM's on engines; dtype a torch.dtype where the
        program imported torch and torch has the type, else refit's name
        (refit.dtype_name reads either)."""
        return [(n, s, _dtype.framework(d)) for n, s, d in self._expected]

    def _describe(self, name, t):
        """One tensor's entry and the descriptor it needs (or None)."""
        want = self._expected_by_name.get(name)
        torch = _torch()
        if torch is not None and isinstance(t, torch.Tensor):
            if not t.is_contiguous():
                raise AgentError("REFIT_ERR_INVALID_ARGUMENT",
                                 "register %s: the tensor is not contiguous" % name)
            dtype = _dtype_name(name, str(t.dtype).replace("torch.", ""), t.element_size(),
                                want)
            shape = list(t.shape)
            nbytes = t.numel() * t.element_size()
            storage = _storage(t)
            if t.is_cuda:
                if not self._cuda:
                    raise AgentError("REFIT_ERR_INVALID_ARGUMENT",
                                     "register %s: a CUDA tensor, but this rank's agent "
                                     "runs on host memory" % name)
                (_, handle, size, offset) = storage._share_cuda_()[:4]
                return {"name": name, "dtype": dtype, "shape": shape, "bytes": nbytes,
                        "handle": _ipc_handle(name, bytes(handle)).hex(),
                        "offset": offset + t.storage_offset() * t.element_size(),
                        "alloc_bytes": offset + size}, None
            if self._cuda:
                raise AgentError("REFIT_ERR_INVALID_ARGUMENT",
                                 "register %s: a host tensor, but this rank's agent runs "
                                 "on GPU %d (register the tensor on that GPU)"
                                 % (name, self.device))
            if not t.is_shared():
                t.share_memory_()
                storage = _storage(t)
            fd, _ = storage._share_fd_cpu_()
            return {"name": name, "dtype": dtype, "shape": shape, "bytes": nbytes,
                    "offset": t.storage_offset() * t.element_size()}, fd
        import numpy as np
        a = t
        if not isinstance(a, np.ndarray):
            raise AgentError("REFIT_ERR_INVALID_ARGUMENT",
                             "register %s: a %s; give a torch tensor or a numpy array from "
                             "refit.empty()" % (name, type(t).__name__))
        if not a.flags["C_CONTIGUOUS"] or not a.flags["WRITEABLE"]:
            raise AgentError("REFIT_ERR_INVALID_ARGUMENT",
                             "register %s: the array is not contiguous and writable" % name)
        found = _numpy_handle(a)
        if found is None:
            raise AgentError("REFIT_ERR_INVALID_ARGUMENT",
                             "register %s: this array is not in shared memory; allocate it "
                             "with refit.empty(shape, dtype) (or pass a torch tensor, moved "
                             "into shared memory for you)" % name)
        fd, _, offset = found
        names = {np.dtype("uint16"): "bfloat16", np.dtype("uint8"): "uint8"}
        dtype = _dtype_name(name, names.get(a.dtype, str(a.dtype)), a.itemsize, want)
        return {"name": name, "dtype": dtype, "shape": list(a.shape), "bytes": a.nbytes,
                "offset": offset}, fd

    def register_all(self, named, strip_prefix=None):
        """Register (name, tensor) pairs in one message: all are checked by the
        agent before any is registered. `strip_prefix` removes a wrapper's
        prefix (module., module.module.) from each name that has it."""
        entries, fds, keep = [], [], {}
        for name, t in (named.items() if hasattr(named, "items") else named):
            if strip_prefix and name.startswith(strip_prefix):
                name = name[len(strip_prefix):]
            entry, fd = self._describe(name, getattr(t, "data", t) if _is_param(t) else t)
            if fd is not None:
                if fd not in fds:
                    if len(fds) == _FDS_MAX:
                        self._register_batch(entries, fds, keep)
                        entries, fds, keep = [], [], {}
                    fds.append(fd)
                entry["fd"] = fds.index(fd)
            entries.append(entry)
            keep[name] = t
        if entries:
            self._register_batch(entries, fds, keep)

    def _register_batch(self, entries, fds, keep):
        self._call({"op": "register", "tensors": entries}, fds)
        self._keep.update(keep)
        for name, t in keep.items():
            self._where[name] = _where(t)

    def _check_moved(self):
        """Before each begin: a torch tensor whose storage was swapped since it
        was registered (param.data = ..., model.float(); model.bfloat16(),
        resize_) is registered again on a trainer (the agent maps the new
        memory) and refused by name on an engine (runtime storage never
        moves while its process lives)."""
        moved = [n for n, t in self._keep.items() if _where(t) != self._where.get(n)]
        if not moved:
            return
        if self.side != "trainer":
            raise AgentError("REFIT_ERR_STATE",
                             "engine rank %d: %d registered tensor%s moved since registration "
                             "(%s): runtime storage must stay in place"
                             % (self.rank, len(moved), "" if len(moved) == 1 else "s",
                                ", ".join(moved[:8])))
        self.register_all([(n, self._keep[n]) for n in moved])

    def register(self, name, tensor):
        """Register one tensor (see register_all)."""
        self.register_all([(name, tensor)])

    # -- the lifecycle ----------------------------------------------------------
    def _before_begin(self):
        self._check_moved()
        if self._cuda:
            import torch
            self._begin_ev.record(torch.cuda.current_stream())

    def _after_commit(self, reply):
        if self._cuda:
            import torch
            torch.cuda.current_stream().wait_event(self._commit_ev)
        self.committed_version = reply.get("version", self.committed_version)
        if "times" in reply:
            t = dict(reply["times"])
            self.last_wire_stats = t.pop("wire", None)
            self.last_times = t
            nbytes = sum(n for _, n in self._where.values())
            self._metrics = _report.committed(self.side, self.rank, self.committed_version,
                                              nbytes, t)

    def metrics(self):
        """A flat dict of the last committed refit on this rank, for a
        trainer's logger: refit/version, refit/bytes (what this rank
        registered), refit/seconds, refit/gbps and refit/<phase>_s. Each
        commit also logs one record to the `refit` logger."""
        return dict(self._metrics)

    def next_version(self, timeout_s=None):
        """Engines: the version the trainers began, waiting for it up to
        `timeout_s` (None: without a deadline; 0: poll). None if none came."""
        v = self._call({"op": "next", "timeout_s": timeout_s})["version"]
        return v or None

    def begin(self, version):
        """Start refitting `version`: returns once every rank's process asked
        for it (trainers) or accepted it (engines) and the agents began."""
        self._before_begin()
        self._call({"op": "begin", "version": int(version)})

    def progress(self):
        """Advance by a bucket; True once this rank's part is complete."""
        return bool(self._call({"op": "progress"})["done"])

    def commit(self):
        """The vote: the new version everywhere or nowhere. Returns the times."""
        r = self._call({"op": "commit"})
        self._after_commit(r)
        return self.last_times

    def abort(self):
        self._call({"op": "abort"})

    def refit(self, version=None, timeout_s=None):
        """One whole refit (begin, progress, commit in the agent). Trainers
        name the version; engines may leave it out and take the next one the
        trainers begin (waiting up to timeout_s; None: no deadline)."""
        if version is None:
            if self.side == "trainer":
                raise AgentError("REFIT_ERR_INVALID_ARGUMENT",
                                 "refit: a trainer names the version it refits")
            version = self.next_version(timeout_s)
            if version is None:
                raise AgentError("REFIT_ERR_TIMEOUT",
                                 "refit: no version began within %s s" % timeout_s)
        self._before_begin()
        r = self._call({"op": "refit", "version": int(version)})
        self._after_commit(r)
        return self.last_times

    def verify(self, version=None):
        """Engines: compare runtime storage with the config's reference of
        `version` (the committed one by default); the count of mismatched
        elements (0: every byte as it must be)."""
        req = {"op": "verify"}
        if version is not None:
            req["version"] = int(version)
        return self._call(req)["mismatches"]

    def status(self):
        """{'state', 'committed', 'times'} of the agent's session."""
        return self._call({"op": "status"})

    def shutdown(self):
        """Stop every agent of the job (after the last refit)."""
        self._call({"op": "shutdown"})
        self.close()


def _ipc_handle(name, h):
    """The 64-byte cudaIpcMemHandle_t of PyTorch's handle: torch 1.x gives it
    bare; torch 2 puts a version byte and a type byte before it ('c': a
    cudaMalloc block, 'e': an expandable segment, which CUDA IPC handles
    cannot map)."""
    if len(h) == 64:
        return h
    kind = h[1:2] if len(h) == 66 else h[:1] if len(h) == 65 else b"?"
    if kind == b"c":
        return h[-64:]
    if kind == b"e":
        raise AgentError("REFIT_ERR_INVALID_ARGUMENT",
                         "register %s: the tensor lives in an expandable segment of PyTorch's "
                         "allocator, which has no CUDA IPC handle; set "
                         "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False" % name)
    raise AgentError("REFIT_ERR_INVALID_ARGUMENT",
                     "register %s: PyTorch gave a %d-byte IPC handle of an unknown kind" %
                     (name, len(h)))


def _where(t):
    """(address, bytes) of a tensor's memory as registered, for _check_moved."""
    torch = _torch()
    if torch is not None and isinstance(t, torch.Tensor):
        return (t.data_ptr(), t.numel() * t.element_size())
    return (t.__array_interface__["data"][0], t.nbytes)


def _storage(t):
    """The tensor's untyped storage (torch 2), or its storage (torch 1.13)."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def _is_param(t):
    torch = _torch()
    return torch is not None and isinstance(t, torch.nn.Parameter)


def _dtype_name(name, got, itemsize, want):
    """The agent's dtype for a tensor of element type `got`: bfloat16 as
    itself, one-byte types (uint8 views of float8) as the expected one."""
    want_dtype = want[1] if want else None
    if got == "bfloat16" or (want_dtype == "bfloat16" and got == "int16"):
        return "bfloat16"
    if itemsize == 1 and want_dtype in ("float8_e4m3fn", "float8_e8m0fnu"):
        return want_dtype
    if got in DTYPES:
        return got
    raise AgentError("REFIT_ERR_INVALID_ARGUMENT",
                     "register %s: dtype: expected %s, got %s" % (name, want_dtype, got))


_ATTACH_KEYS = ("side", "rank", "socket_dir", "path", "timeout_s")


def attach(side=None, rank=None, socket_dir=None, path=None, timeout_s=60.0):
    """Attach this process to the refit agent of (`side`, `rank`): its socket
    is socket_dir/side.rank.sock (see socket_dir()), or `path`. Returns a
    Client. Raises FileNotFoundError when no agent listens there.

    The options may also come as one config: a dict or mapping (OmegaConf's
    DictConfig), or the path of a YAML or JSON file, holding side, rank,
    socket_dir, path and timeout_s: refit.attach(cfg.refit)."""
    if side is not None and side not in ("trainer", "generator"):
        opts = _config.load(side, "refit.attach")
        unknown = sorted(set(opts) - set(_ATTACH_KEYS))
        if unknown:
            raise TypeError("refit.attach: unknown options %s (known: %s)"
                            % (unknown, ", ".join(_ATTACH_KEYS)))
        given = {"rank": rank, "socket_dir": socket_dir, "path": path}
        opts.update({k: v for k, v in given.items() if v is not None})
        return attach(opts.get("side"), opts.get("rank"), opts.get("socket_dir"),
                      opts.get("path"), float(opts.get("timeout_s", timeout_s)))
    if path is None:
        if side not in ("trainer", "generator") or rank is None:
            raise ValueError("refit.attach: give side ('trainer' or 'generator') and rank, "
                             "or path")
        path = socket_path(side, int(rank), socket_dir)
    return Client(path, side, timeout_s)
