"""refit.Session: one refit session (refit_session_h) of this rank."""

import atexit
import ctypes
import os
import weakref

from mpi4py import MPI

from . import _lib
from . import _tensors
from .errors import check, error, Error

try:
    import torch
except ImportError:
    torch = None


# Sessions still open at exit are closed before MPI is finalized: mpi4py
# finalizes in an atexit hook registered when it was imported, before this
# one, and atexit runs the hooks last in, first out.
_open = weakref.WeakSet()


@atexit.register
def _close_all():
    for s in list(_open):
        s.close()


def comm_handle(comm):
    """The C handle of an mpi4py communicator (MPI_COMM_WORLD for None)."""
    return _lib.Comm(MPI._handleof(MPI.COMM_WORLD if comm is None else comm))


def join(side, port_file, timeout_s=60.0, comm=None):
    """Meet a separately launched job (refit_comm_join): `side` is this job's
    ('trainer' or 'generator'); the generator job publishes an MPI port in
    `port_file`, the trainer job connects. Returns the merged communicator
    (an mpi4py Intracomm, trainers first; the caller frees it), to pass to
    Session. Collective over `comm` (MPI_COMM_WORLD) and with the other job;
    raises refit.TimeoutError naming the file when the other never comes. The
    jobs prove to each other that they hold the key file (REFIT_JOIN_KEY_FILE
    or PORT_FILE.key, 0600, made by the first to start; refit.h)."""
    sides = {v: k for k, v in _lib.SIDES.items()}
    if side not in sides:
        raise ValueError("refit.join: side must be 'trainer' or 'generator', got %r"
                         % (side,))
    merged = MPI.Intracomm()
    check(_lib.comm_join(comm_handle(comm), sides[side], os.fsencode(port_file),
                         float(timeout_s), ctypes.c_void_p(MPI._addressof(merged))))
    return merged


class Session:
    """A refit session over `comm` (an mpi4py communicator; MPI_COMM_WORLD by
    default), configured by the YAML file at `config_path`. Collective.

    With `join={'side': 'trainer'|'generator', 'port_file': PATH,
    'timeout_s': 60}` the two sides are separate launches: the session first
    meets the other job (refit.join) and runs over the merged communicator,
    which it frees on close.

    Tensors registered with register() must stay alive and in place while
    the session uses them: the session keeps a reference to each. Views from
    tensor() and tensors() alias refit's (or the registered) memory and must
    not be used after close().
    """

    def __init__(self, config_path, comm=None, join=None):
        self._h = None
        self._merged = None
        self._registered = {}
        if join is not None:
            opts = dict(join)
            self._merged = globals()["join"](opts.pop("side"), opts.pop("port_file"),
                                             opts.pop("timeout_s", 60.0), comm)
            if opts:
                raise TypeError("refit.Session: unknown join options %s" % sorted(opts))
            comm = self._merged
        h = ctypes.c_void_p()
        try:
            check(_lib.session_open(comm_handle(comm), os.fsencode(config_path),
                                    ctypes.byref(h)))
        except Error:
            self._free_comm()
            raise
        self._h = h
        _open.add(self)
        # The mpi4py communicator the session runs over (the merged one with
        # join): trainers first, then generators.
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.side = _lib.SIDES[_lib.session_side(h)]
        # The CUDA device of the session's memory, -1 for host memory.
        self.device = _lib.session_device(h)

    # -- lifetime ---------------------------------------------------------
    def close(self):
        """Release the session (not collective); idempotent."""
        if self._h is not None:
            _lib.session_close(self._h)
            self._h = None
        self._registered.clear()
        self._free_comm()

    def _free_comm(self):
        if self._merged is not None:
            self._merged.Free()
            self._merged = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _handle(self):
        if self._h is None:
            raise ValueError("refit: the session is closed")
        return self._h

    # -- tensors ----------------------------------------------------------
    def _get(self, index):
        t = _lib.Tensor()
        check(_lib.tensor_get(self._handle(), index, ctypes.byref(t)))
        return t

    @staticmethod
    def _shape(t):
        return tuple(t.shape[i] for i in range(t.ndim))

    def expected(self):
        """[(name, shape, dtype)] of every tensor this rank holds, in refit's
        order: what register() must be given (all of them or none)."""
        out = []
        for i in range(_lib.tensor_count(self._handle())):
            t = self._get(i)
            out.append((t.name.decode(), self._shape(t), _lib.DTYPES[t.dtype]))
        return out

    def _find(self, name):
        t = _lib.Tensor()
        check(_lib.tensor_find(self._handle(), name.encode(), ctypes.byref(t)))
        return t

    def register(self, name, tensor):
        """Hand refit the caller's tensor for `name` (zero copy): a torch
        tensor (CPU or CUDA, caching-allocator memory included) or a numpy
        array, contiguous, of the expected shape and dtype (float8 may come
        as uint8 views), where the session runs. On trainers, calling it
        again between refits moves the tensor to a new address."""
        d = _tensors.describe(tensor)
        t = _lib.Tensor()
        expected = None
        if _lib.tensor_find(self._handle(), name.encode(), ctypes.byref(t)) == 0:
            expected = _lib.DTYPES[t.dtype]
            if self.side == "generator":
                # The engine decides which tensors are MXFP8: a BF16 weight
                # where refit planned e4m3, or the reverse, is C's to judge.
                expected = _tensors.engine_form(d, expected)
            _tensors.check(name, d, expected, self.side, self.device)
        elif name.endswith("_scale"):
            expected = "float8_e8m0fnu"  # a scale beside a weight planned in BF16
        # An unknown name goes to C all the same: refit_tensor_register names
        # it, in the same words as every other registration problem.
        t = _lib.Tensor(name=name.encode(), data=d.ptr, bytes=d.nbytes,
                        ndim=min(len(d.shape), 3), dtype=_tensors.refit_dtype(d, expected))
        for i, n in enumerate(d.shape[:3]):
            t.shape[i] = n
        check(_lib.tensor_register(self._handle(), ctypes.byref(t)))
        self._registered[name] = tensor

    def register_all(self, named_tensors, strip_prefix=None):
        """register() every (name, tensor) of an iterable or a mapping, e.g.
        model.named_parameters() or a state dict, with `strip_prefix`
        removed from the front of each name that has it ('module.')."""
        items = named_tensors.items() if hasattr(named_tensors, "items") else named_tensors
        for name, tensor in items:
            if strip_prefix and name.startswith(strip_prefix):
                name = name[len(strip_prefix):]
            if torch is not None and isinstance(tensor, torch.nn.Parameter):
                tensor = tensor.data
            self.register(name, tensor)

    def tensor(self, name, framework=None):
        """A zero-copy view of the tensor `name` of this rank: numpy
        (framework='numpy', the default for host memory) or torch ('torch',
        the only choice for device memory). Before the first begin a tensor
        nobody registered has no memory yet: refit.StateError."""
        t = self._find(name)
        return self._view(t, framework)

    def tensors(self, framework=None):
        """{name: view} of every tensor of this rank (see tensor())."""
        return {n: self.tensor(n, framework) for n, _, _ in self.expected()}

    def _view(self, t, framework):
        name = t.name.decode()
        if not t.data:
            raise error("STATE", "tensor %s: %s rank has no memory for it yet: "
                         "register it or call begin() first" % (name, self.side))
        device = self.device
        if framework is None:
            framework = "numpy" if device < 0 else "torch"
        return _tensors.view(t.data, t.bytes, self._shape(t), _lib.DTYPES[t.dtype],
                             device, framework)

    # -- the lifecycle ------------------------------------------------------
    def _stream(self):
        """The caller's CUDA stream (torch's current stream), so that work
        queued before begin() is seen and work queued after commit() reads
        the new weights; NULL on the host."""
        if self.device < 0 or torch is None:
            return None
        return ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)

    def begin(self, version):
        """Start refitting `version` (collective)."""
        check(_lib.begin(self._handle(), version, self._stream()))

    def progress(self):
        """Advance by one bucket; True once this rank's part is done. On an
        error the refit is aborted here: call commit() anyway (it votes no
        and raises), so that no peer waits for this rank."""
        done = ctypes.c_int(0)
        check(_lib.progress(self._handle(), ctypes.byref(done)))
        return bool(done.value)

    def commit(self):
        """Commit the version (collective vote)."""
        check(_lib.commit(self._handle(), self._stream()))

    def abort(self):
        """Abandon the refit in progress (not collective; idempotent)."""
        check(_lib.abort(self._handle()))

    def refit(self, version):
        """The sync loop: begin, progress until done, commit. Returns
        last_times(). On a failure the exception of the first failing step
        is raised, after this rank voted no."""
        self.begin(version)
        try:
            while not self.progress():
                pass
        except Error:
            try:
                self.commit()
            except Error:
                pass
            raise
        self.commit()
        return self.last_times()

    @property
    def state(self):
        """'idle', 'receiving', 'ready', 'committing' or 'poisoned'
        (state_text says what each means)."""
        return _lib.STATES[_lib.state(self._handle())]

    @property
    def state_text(self):
        """refit_state_str: 'idle: serving the committed version', ..."""
        return _lib.state_str(_lib.state(self._handle())).decode()

    @property
    def committed_version(self):
        return _lib.committed_version(self._handle())

    def last_times(self):
        """Seconds per phase of the last committed refit on this rank."""
        t = _lib.Times()
        check(_lib.last_times(self._handle(), ctypes.byref(t)))
        return {name: getattr(t, name) for name, _ in _lib.Times._fields_}

    def last_wire_stats(self):
        """Bytes on the wire of the last refit on this rank (refit.delta):
        delta (1 for a delta refit), wire_bytes (sent by a trainer, received
        by a generator), full_bytes (what a full refit moves here),
        framed_msgs; on a generator changed_bytes (runtime bytes a delta
        refit applied in place found changed), written_bytes (runtime
        bytes written) and in_place (1 where this rank applies deltas in
        place, host or GPU memory; 0 where it carries no delta refits); all
        zero with refit.delta off."""
        w = _lib.WireStats()
        check(_lib.last_wire_stats(self._handle(), ctypes.byref(w)))
        return {name: getattr(w, name) for name, _ in _lib.WireStats._fields_}

    def verify(self, version):
        """Generators: the number of runtime elements that differ from what
        `version` must be (0: verified); trainers: 0."""
        bad = ctypes.c_int64(0)
        check(_lib.verify(self._handle(), version, ctypes.byref(bad)))
        return bad.value

    def describe(self):
        """One paragraph about the job and its plan, for logs."""
        buf = ctypes.create_string_buffer(4096)
        _lib.session_describe(self._handle(), buf, len(buf))
        return buf.value.decode()

