"""refit.Session: one refit session (refit_session_h) of this rank."""

import atexit
import ctypes
import difflib
import os
import queue
import sys
import tempfile
import threading
import time
import weakref

from mpi4py import MPI

from . import _config, _dtype, _lib, _report
from . import _tensors
from .errors import check, error, file_not_found, Error


# Sessions still open at exit are closed before MPI is finalized: mpi4py
# finalizes in an atexit hook registered when it was imported, before this
# one, and atexit runs the hooks last in, first out.
_open = weakref.WeakSet()
# C sessions kept alive by views after Session.close() (see _Storage).
_storages = weakref.WeakSet()
# Set once this process opened a session (or joined): from then on its
# peers wait for it in collectives, so an uncaught exception ends the job.
_joined = False
# _Storage objects whose session a call interrupted by Ctrl-C still uses.
_in_flight = set()

# refit.session.abort_on_uncaught = False keeps Python's default: an
# uncaught exception ends this rank only, and its peers wait for it until
# refit.timeout_s.
abort_on_uncaught = True


@atexit.register
def _close_all():
    for s in list(_open):
        s.close()
    if any(w.busy for w in _Worker.all) and _mpi_usable():
        # A refit call interrupted by Ctrl-C still runs on its thread: MPI
        # cannot finalize under it, and the peers would wait for this rank.
        sys.stderr.write("refit: a refit call interrupted on rank %d is still in "
                         "flight; aborting the job\n" % MPI.COMM_WORLD.Get_rank())
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
    for st in list(_storages):
        st.release()


def _mpi_usable():
    return MPI.Is_initialized() and not MPI.Is_finalized()


_NOTICE_TAG = 3737


def _excepthook(tp, value, tb):
    """An uncaught exception on a rank of a refit job (a bad registration,
    a KeyboardInterrupt) ends the job at once: its peers wait for this rank
    in collectives, up to refit.timeout_s, and MPI_Finalize would hang.
    Each open session's peers get a notice first (a launcher that keeps a
    job going when a rank dies, as refit-launch's mpirun --enable-recovery
    does, ends only the aborting rank), which their waits raise as
    refit.PeerError; then MPI_Abort."""
    _prev_excepthook(tp, value, tb)
    if not (abort_on_uncaught and _joined and _mpi_usable()
            and MPI.COMM_WORLD.Get_size() > 1):
        return
    me = MPI.COMM_WORLD.Get_rank()
    sys.stderr.write("refit: rank %d: uncaught %s: aborting the MPI job so that "
                     "no peer waits for this rank\n" % (me, tp.__name__))
    sys.stderr.flush()
    if not getattr(value, "_refit_notice", False):
        text = ("rank %d ended on an uncaught %s: %s" % (me, tp.__name__, value))[:900]
        for w in list(_Worker.all):
            w.tell_peers(text.encode(errors="replace"))
    MPI.COMM_WORLD.Abort(1)


_prev_excepthook = None


def _joining():
    """Called when this process enters a refit job: installs _excepthook
    (once; the hook it replaces still prints the traceback)."""
    global _joined, _prev_excepthook
    _joined = True
    if _prev_excepthook is None:
        _prev_excepthook = sys.excepthook
        sys.excepthook = _excepthook


class _Worker:
    """Runs refit's blocking calls (open, join, begin, progress, commit,
    abort) on a thread of their own while the main thread waits in slices
    of 0.2 s: a Ctrl-C (SIGINT) then raises KeyboardInterrupt within a
    second instead of after the C call's deadline. The C waits poll MPI and
    never look at signals, and Python runs its signal handlers only on the
    main thread between bytecodes. An interrupted call keeps running on the
    worker (it cannot be cancelled): `busy` stays set, the session refuses
    further calls and is never freed under it."""

    all = weakref.WeakSet()

    def __init__(self):
        self._q = queue.SimpleQueue()
        self._thread = None
        self.busy = None  # the name of the C call in flight, or None
        self.device = -1
        self.notices = None  # the session's communicator for peers' notices
        _Worker.all.add(self)

    def tell_peers(self, text, grace_s=1.0):
        """Send every peer of the session `text` (an abort notice), waiting
        up to grace_s for the sends to leave."""
        c = self.notices
        if c is None:
            return
        reqs = [c.Isend(text, dest=r, tag=_NOTICE_TAG)
                for r in range(c.Get_size()) if r != c.Get_rank()]
        end = time.monotonic() + grace_s
        while not MPI.Request.Testall(reqs) and time.monotonic() < end:
            time.sleep(0.01)

    def check_notice(self, what):
        """Raise refit.PeerError where a peer sent word that it ended."""
        c = self.notices
        if c is None or MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            return
        status = MPI.Status()
        if c.Iprobe(source=MPI.ANY_SOURCE, tag=_NOTICE_TAG, status=status):
            buf = bytearray(status.Get_count(MPI.BYTE))
            c.Recv(buf, source=status.Get_source(), tag=_NOTICE_TAG)
            e = error("PEER", "%s: abandoned: %s" % (what, buf.decode(errors="replace")))
            e._refit_notice = True  # this rank does not tell the others again
            raise e

    @staticmethod
    def usable():
        # Signals reach the main thread only; MPI must allow another thread.
        return (threading.current_thread() is threading.main_thread()
                and MPI.Query_thread() >= MPI.THREAD_SERIALIZED)

    def _run(self):
        q = self._q
        while True:
            job = q.get()
            if job is None:
                return
            fn, args, box, done = job
            try:
                if self.device >= 0 and _torch_cuda():
                    # CUDA's device is per thread
                    _dtype.torch_if_used().cuda.set_device(self.device)
                st = fn(*args)
                box.append((st, _lib.last_error().decode(errors="replace") if st else ""))
            except BaseException as e:  # noqa: B902  handed to the caller
                box.append((None, e))
            done.set()

    def call(self, what, fn, *args):
        """fn(*args) -> refit_status_t, raising as check() does."""
        if self.busy is not None:
            raise error("STATE", "%s: the refit call %s was interrupted and still "
                        "runs on this rank; the session cannot be used again "
                        "(let the process exit)" % (what, self.busy))
        self.check_notice(what)
        if not self.usable():
            return check(fn(*args))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="refit-calls",
                                            daemon=True)
            self._thread.start()
        box, done = [], threading.Event()
        self.busy = what
        self._q.put((fn, args, box, done))
        while not done.wait(0.2):
            # A signal handler's exception (KeyboardInterrupt), or a peer's
            # notice, leaves busy set: the C call runs on.
            self.check_notice(what)
        self.busy = None
        st, msg = box[0]
        if st is None:
            raise msg
        if st != 0:
            raise error(st, msg)
        return None

    def stop(self):
        if self._thread is not None and self.busy is None:
            self._q.put(None)
            self._thread = None


def _torch_cuda():
    """Does the program use torch with CUDA? (refit does not import torch.)"""
    torch = _dtype.torch_if_used()
    return torch is not None and torch.cuda.is_available()


class _Storage:
    """The C session and the caller's registered objects, owned together:
    freed by Session.close() once no view from tensor()/tensors() refers to
    them any more (each view holds this object), at exit at the latest."""

    def __init__(self, h, worker):
        self.h, self.worker = h, worker
        self.held = {}  # name -> the storage a registration points at
        _storages.add(self)

    def release(self):
        if self.worker.busy is not None:
            # A call interrupted by Ctrl-C still runs in the C session and
            # the memory registered: neither may go until the process does.
            _in_flight.add(self)
            return
        if self.h is not None:
            _lib.session_close(self.h)
            self.h = None
            self.worker.stop()
        self.held.clear()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


# Wrapper prefixes whose names refit's trainer names leave out.
_WRAPPER_PREFIXES = ("module.module.", "module.", "_orig_mod.module.", "_orig_mod.")


class _Registration:
    """What register() handed C for one name, to compare at each begin."""

    def __init__(self, obj, print_, expected):
        self.obj, self.print, self.expected = obj, print_, expected
        self.storage = _tensors.storage_of(obj)


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
    _joining()
    worker = _Worker()
    try:
        worker.call("join", _lib.comm_join, comm_handle(comm), sides[side],
                    os.fsencode(port_file), float(timeout_s),
                    ctypes.c_void_p(MPI._addressof(merged)))
    finally:
        worker.stop()
    return merged


def _config_problems(path):
    """The problems refit_config_open finds in the config at `path`, one
    line each ("file:line:col: ..."), as it prints them on stderr; [] when
    this rank cannot read the file or finds none."""
    if not os.path.isfile(path):
        return []
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as f:
            os.dup2(f.fileno(), 2)
            try:
                c = ctypes.c_void_p()
                if _lib.config_open(os.fsencode(path), ctypes.byref(c)) == 0:
                    _lib.config_close(c)
            finally:
                os.dup2(saved, 2)
            f.seek(0)
            text = f.read().decode(errors="replace")
    finally:
        os.close(saved)
    return [line for line in text.splitlines() if line.strip()]


class Session:
    """A refit session over `comm` (an mpi4py communicator; MPI_COMM_WORLD by
    default), configured by `config_path`: the YAML file's path, or the config
itself as a dict or a mapping (OmegaConf's DictConfig). Collective.

    With `join={'side': 'trainer'|'generator', 'port_file': PATH,
    'timeout_s': 60}` the two sides are separate launches: the session first
    meets the other job (refit.join) and runs over the merged communicator,
    which it frees on close.

    Tensors registered with register() are held by the session, and every
    begin() checks that each still has the address, size, dtype and layout
    it was registered with: a trainer's tensor whose storage was swapped
    (model.float(); model.bfloat16(), module.to(), param.data = ...,
    resize_) is registered again at its new address; a generator's is
    refused by name (runtime storage never moves). Views from tensor() and
    tensors() keep the session's storage alive until they are gone, even
    past close().

    Once a session is open, an uncaught exception on this rank (also
    KeyboardInterrupt) aborts the MPI job instead of leaving the peers
    waiting (refit.session.abort_on_uncaught = False turns that off).
    """

    def __init__(self, config_path, comm=None, join=None):
        self._h = None
        self._storage = None
        self._merged = None
        self._registered = {}
        self._begun = False  # a begin went past registration (C bound the tensors)
        self._worker = _Worker()
        if join is not None:
            opts = dict(join)
            self._merged = globals()["join"](opts.pop("side"), opts.pop("port_file"),
                                             opts.pop("timeout_s", 60.0), comm)
            if opts:
                raise TypeError("refit.Session: unknown join options %s" % sorted(opts))
            comm = self._merged
        _joining()
        h = ctypes.c_void_p()
        config = _config.AsFile(config_path, "refit.Session")
        try:
            self._worker.call("open", _lib.session_open, comm_handle(comm),
                              os.fsencode(config.path), ctypes.byref(h))
        except Error as e:
            self._free_comm()
            self._worker.stop()
            raise self._open_error(e, config.path) from None
        finally:
            config.close()
        self._h = h
        self._storage = _Storage(h, self._worker)
        # Abort notices from peers (_excepthook) travel apart from refit's
        # messages.
        self._worker.notices = (MPI.COMM_WORLD if comm is None else comm).Dup()
        _open.add(self)
        # The mpi4py communicator the session runs over (the merged one with
        # join): trainers first, then generators.
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.side = _lib.SIDES[_lib.session_side(h)]
        # The CUDA device of the session's memory, -1 for host memory.
        self.device = _lib.session_device(h)
        self._worker.device = self.device
        if self.device >= 0 and _torch_cuda():
            # refit_session_open bound its calling thread (the worker) to the
            # GPU; bind this one too, as a call on this thread did before.
            _dtype.torch_if_used().cuda.set_device(self.device)

    @staticmethod
    def _open_error(e, config_path):
        """The config's problems on the exception (e.problems, a list of
        'file:line:col: ...' lines, [] where this rank did not read them), and
        a missing file as a FileNotFoundError."""
        path = os.fspath(config_path)
        e.problems = []
        if "config" in e.message:
            if not os.path.exists(path):
                e = file_not_found(e, path)
                e.problems = ["%s: no such file" % path]
            else:
                e.problems = _config_problems(path) or [e.message]
        return e

    # -- lifetime ---------------------------------------------------------
    def close(self):
        """Release the session (not collective); idempotent. Memory that
        views from tensor() still show stays until the last of them is gone."""
        if self._h is not None:
            self._h = None
            # Freed here (refcount) unless a view from tensor() holds it.
            self._storage = None
            _open.discard(self)
        self._registered.clear()
        if self._worker.busy is None:
            self._free_comm()
            if self._worker.notices is not None:
                self._worker.notices.Free()
                self._worker.notices = None

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
        order: what register() must be given (all of them or none). Shapes
        are the framework's: a norm weight or bias is [n] (refit also takes
        [1, n]); dtype a torch.dtype where the program imported torch and
        torch has the type, else refit's name (refit.dtype_name reads
        either)."""
        out = []
        for i in range(_lib.tensor_count(self._handle())):
            t = self._get(i)
            name = t.name.decode()
            out.append((name, _tensors.framework_shape(name, self._shape(t)),
                        _dtype.framework(_lib.DTYPES[t.dtype])))
        return out

    def _find(self, name):
        t = _lib.Tensor()
        check(_lib.tensor_find(self._handle(), name.encode(), ctypes.byref(t)))
        return t

    def _name_hint(self, name):
        """Did-you-mean for a name this rank does not hold, and the prefix
        a wrapper (DDP's module., torch.compile's _orig_mod.) added."""
        names = [n for n, _, _ in self.expected()]
        known = set(names)
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix) and name[len(prefix):] in known:
                return (" (%r carries the wrapper prefix %r: pass "
                        "strip_prefix=%r to register_all, or register %r)"
                        % (name, prefix, prefix, name[len(prefix):]))
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
        hint = " (did you mean %s?)" % " or ".join(repr(c) for c in close) if close else ""
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                return hint + (" (the name starts with the wrapper prefix %r, which "
                               "this rank's names do not have: strip_prefix=%r)"
                               % (prefix, prefix))
        return hint

    def _prepare(self, name, tensor):
        """The refit_tensor_t for (name, tensor) and the dtype it is checked
        as, after every check Python can make before C sees the pointer; the
        error naming the tensor otherwise."""
        d = _tensors.describe(tensor)
        t = _lib.Tensor()
        expected, planned = None, None
        if _lib.tensor_find(self._handle(), name.encode(), ctypes.byref(t)) == 0:
            planned = _lib.DTYPES[t.dtype]
            expected = planned
            if self.side == "generator":
                # The engine decides which tensors are MXFP8: a BF16 weight
                # where refit planned e4m3, or the reverse, is C's to judge.
                expected = _tensors.engine_form(d, expected)
            _tensors.check(name, d, expected, self.side, self.device)
            want = self._shape(t)
            if expected == planned and len(d.shape) <= 3 and not (
                    _tensors.shape_ok(d.shape, want) and d.nbytes == t.bytes):
                raise error("INVALID_ARGUMENT", "register %s: %s rank: shape: expected "
                            "%s, got %s (%d bytes, refit holds %d)" % (
                                name, self.side, list(_tensors.framework_shape(name, want)),
                                list(d.shape), d.nbytes, t.bytes))
        elif self.side == "generator" and name.endswith("_scale"):
            # A scale beside a weight planned in BF16 (the engine quantizes
            # it): checked as every other registration is.
            expected = "float8_e8m0fnu"
            _tensors.check(name, d, expected, self.side, self.device)
        elif ".mlp.experts.routed_experts." not in name:
            raise error("INVALID_ARGUMENT", "register: %s rank holds no tensor %r (an "
                        "unexpected tensor; expected() lists this rank's)%s"
                        % (self.side, name, self._name_hint(name)))
        # Other names (vLLM's nested spelling of the expert stacks) are C's
        # to match.
        t = _lib.Tensor(name=name.encode(), data=d.ptr, bytes=d.nbytes,
                        ndim=min(len(d.shape), 3), dtype=_tensors.refit_dtype(d, expected))
        for i, n in enumerate(d.shape[:3]):
            t.shape[i] = n
        return t, expected

    def _c_register(self, name, tensor, t, expected):
        try:
            check(_lib.tensor_register(self._handle(), ctypes.byref(t)))
        except Error as e:
            if "holds no tensor" in e.message:
                e = error(e.status, e.message + self._name_hint(name))
            raise e from None
        reg = _Registration(tensor, _tensors.fingerprint(tensor), expected)
        self._registered[name] = reg
        if self._storage is not None:
            self._storage.held[name] = reg.storage

    def _same_registration(self, name, tensor):
        """Is `tensor` what `name` was registered as, where it was?"""
        reg = self._registered.get(name)
        return reg is not None and _tensors.fingerprint(tensor) == reg.print and (
            reg.obj is tensor or _tensors.fingerprint(reg.obj) == reg.print)

    def register(self, name, tensor):
        """Hand refit the caller's tensor for `name` (zero copy): a torch
        tensor (CPU or CUDA, caching-allocator memory included) or a numpy
        array, contiguous, of the expected shape and dtype (float8 may come
        as uint8 views), where the session runs. On trainers, calling it
        again between refits moves the tensor to a new address. The same
        tensor registered again under its name is a no-op."""
        if self._same_registration(name, tensor) or self._skipped(name):
            return
        t, expected = self._prepare(name, tensor)
        self._c_register(name, tensor, t, expected)

    def _skipped(self, name):
        """Is `name` a trainer tensor refit takes and does not move (a
        DeepSeek multi-token-prediction layer, which vLLM skips)?"""
        why = _lib.tensor_skipped(self._handle(), name.encode())
        return why is not None

    def register_all(self, named_tensors, strip_prefix=None):
        """register() every (name, tensor) of an iterable or a mapping, e.g.
        model.named_parameters() or a state dict, with `strip_prefix`
        removed from the front of each name that has it ('module.').
        Atomic as far as Python can tell: every tensor is checked first and
        every problem named in one exception before any is registered."""
        items = named_tensors.items() if hasattr(named_tensors, "items") else named_tensors
        todo, problems, seen, first = [], [], set(), None
        for name, tensor in items:
            if strip_prefix and name.startswith(strip_prefix):
                name = name[len(strip_prefix):]
            if name in seen:
                problems.append("register %s: given twice" % name)
                continue
            seen.add(name)
            if self._same_registration(name, tensor) or self._skipped(name):
                continue
            try:
                todo.append((name, tensor) + self._prepare(name, tensor))
            except (Error, TypeError) as e:
                first = first or e
                problems.append(e.message if isinstance(e, Error) else str(e))
        if problems:
            if len(problems) == 1 and first is not None:
                raise first
            raise error(first.status if isinstance(first, Error) else "INVALID_ARGUMENT",
                        "%d of the tensors cannot be registered, none was: %s"
                        % (len(problems), "; ".join(problems)))
        for name, tensor, t, expected in todo:
            self._c_register(name, tensor, t, expected)

    def tensor(self, name, framework=None):
        """A zero-copy view of the tensor `name` of this rank: numpy
        (framework='numpy', the default for host memory) or torch ('torch',
        the only choice for device memory). Before the first begin a tensor
        nobody registered has no memory yet: refit.StateError. The view
        keeps the session's storage alive."""
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
                             device, framework, keep=self._storage)

    def _recheck(self):
        """Every registered tensor as register() saw it? A trainer's that
        moved is registered again (C allows it between refits); otherwise
        the error naming the tensor, what it was and what it is now."""
        for name, reg in self._registered.items():
            now = _tensors.fingerprint(reg.obj)
            if now == reg.print:
                continue
            d = _tensors.describe(reg.obj)
            what = ("tensor %s changed since it was registered (%d bytes at 0x%x, "
                    "now %s, %d bytes at 0x%x)" % (name, reg.print[1], reg.print[0],
                                                   d.text, d.nbytes, d.ptr))
            if self.side == "generator":
                raise error("STATE", "begin: generator %s: runtime storage never "
                            "moves (refit writes where it was registered, CUDA graphs "
                            "captured it): write new values into the registered "
                            "tensor (copy_) instead of replacing its storage" % what)
            if not self._begun:
                raise error("STATE", "begin: trainer %s, before the first begin: "
                            "refit follows a trainer's tensor to a new address only "
                            "between refits; register after the model's last dtype "
                            "or device conversion" % what)
            try:
                t, expected = self._prepare(name, reg.obj)
                self._c_register(name, reg.obj, t, expected)
            except Error as e:
                raise error(e.status, "begin: trainer %s, and cannot be registered "
                            "again: %s" % (what, e.message)) from None

    # -- the lifecycle ------------------------------------------------------
    def _stream(self):
        """The caller's CUDA stream (torch's current stream), so that work
        queued before begin() is seen and work queued after commit() reads
        the new weights; NULL on the host."""
        torch = _dtype.torch_if_used()  # a program without torch has no torch stream
        if self.device < 0 or torch is None:
            return None
        return ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)

    def begin(self, version):
        """Start refitting `version` (collective). Versions start at 1 and
        increase. Every registered tensor is checked first (see the class)."""
        h = self._handle()
        try:
            self._recheck()
        except Error as refused:
            # Take part in the begin all the same, then vote no, so that the
            # peers fail this refit at once instead of waiting for this rank;
            # memory the registration pointed at is still held.
            try:
                self._worker.call("refit_begin", _lib.begin, h, version, self._stream())
                self._worker.call("refit_abort", _lib.abort, h)
                self._worker.call("refit_commit", _lib.commit, h, self._stream())
            except Error:
                pass
            raise refused
        try:
            self._worker.call("refit_begin", _lib.begin, h, version, self._stream())
        except Error as e:
            if version == 0:
                raise error(e.status, "%s (versions start at 1: 0 is what a session "
                            "holds before its first refit)" % e.message) from None
            raise
        self._begun = True

    def progress(self):
        """Advance by one bucket; True once this rank's part is done. On an
        error the refit is aborted here: call commit() anyway (it votes no
        and raises), so that no peer waits for this rank."""
        done = ctypes.c_int(0)
        self._worker.call("refit_progress", _lib.progress, self._handle(),
                          ctypes.byref(done))
        return bool(done.value)

    def commit(self):
        """Commit the version (collective vote). Logs one record to the
        `refit` logger and keeps metrics() for it."""
        self._worker.call("refit_commit", _lib.commit, self._handle(), self._stream())
        nbytes = sum(self._get(i).bytes for i in range(_lib.tensor_count(self._handle())))
        self._metrics = _report.committed(self.side, self.comm.Get_rank(),
                                          self.committed_version, nbytes, self.last_times())

    def metrics(self):
        """A flat dict of the last committed refit on this rank, for a
        trainer's logger: refit/version, refit/bytes (what this rank holds),
        refit/seconds, refit/gbps and refit/<phase>_s."""
        return dict(getattr(self, "_metrics", {}))

    def abort(self):
        """Abandon the refit in progress (not collective; idempotent)."""
        self._worker.call("refit_abort", _lib.abort, self._handle())
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

