"""A live trainer refits its own Megatron-Core tensors; checked independently.

Run on every rank of a job (through launch/refit-launch, or
tests/caller/run_caller.sh, which checks the outcome):

    caller_refit.py [--build DIR] [--work DIR] CONFIG [scenario options]
    caller_refit.py [--build DIR] [--work DIR] --batch LIST

scenario options: [--versions N] [--nested-experts] [--move | --move-at V]
                  [--matrix] [--hdf5-reference [FILE]] [--torch-cuda]
                  [--engine-ignore MODULES] [--update-rate R] [--delta]

The first form runs one scenario on every rank of the job. With --batch the
job runs every scenario of LIST in turn, one a line: NAME CONFIG OPTIONS...,
words separated by white space (no quoting), blank lines and lines that
start with # left out. A job's Python start-up, imports, mpirun and
MPI_Init cost more CPU than most scenarios' refits, so a batch pays them
once: the job has as many ranks as its largest scenario, each scenario runs
on a communicator split off its first N ranks (N: its config's world size)
while the others wait, and every rank meets before the next scenario. Each
scenario draws its own seed and opens and closes its own Session, as a
process that refits one model after another does.

Every scenario prints "caller_refit: [NAME] passed on every rank (seed S, T s)"
(NAME: the config's file name without .yaml in the first form). A failure
prints the scenario, its seed and the command that runs it alone
(run_caller.sh BUILD CONFIG OPTIONS, BUILD from --build), then aborts the
job. REFIT_CALLER_SEED=S (rank 0's environment) replaces every scenario's
random seed by S. --work DIR: where rewritten configs and checkpoints go
(default: a temporary folder, removed at the end).

CONFIG has source.kind caller, or --matrix: CONFIG is a test layout with a
source of its own (tests/mpi), which the scenario runs with trainer.layout
megatron, source.kind caller, verify false and no dump instead. A config
that an option changes (--matrix, --hdf5-reference, --delta) is rewritten
once, by the job's rank 0, into the work folder.

Every rank draws the same full Hugging Face weights for each version from a
seed (fresh random bits, chosen by the scenario's rank 0 and printed);
trainer ranks build the tensors Megatron-Core would hold from them with
tests/caller/megatron_rules.py, register them once and write each new
version into them in place (--move: into new arrays, registered again at
their new addresses, as a distributed optimizer that re-grows its buffers
does; --move-at V: only for version V); generator ranks register runtime
tensors of their own (--nested-experts: under vLLM's nested expert
spelling) and after every refit compare each of them, byte for byte, with
what tests/reference/vllm_rules.py says vLLM holds for those weights.
Neither rule module shares code with refit's catalog or kernels.

--hdf5-reference [FILE]: rank 0 writes the weights with h5py as a checkpoint
(FILE, by default NAME.h5 in the work folder; the config gets reference.kind
hdf5 with that path and verify true), every version sends those weights, and
generators also require refit's own verification against that file
(refit_verify) to find no difference.

--engine-ignore MODULES: the engine quantizes by its own list (comma
separated, vLLM's ignored layers; "" for none) instead of the config's
refit.quantization_ignore: generators register what vllm_rules.py says vLLM
holds under that list (BF16 weights where the config quantizes, e4m3 weights
and their scales where it does not), refit must follow them, and every byte
is checked against that engine's rules. Also: a router registered as e4m3
is refused by name (vLLM never quantizes it).

--torch-cuda: every tensor is a torch CUDA tensor from PyTorch's caching
allocator on the rank's GPU. Trainers write each version with a kernel on a
stream of their own, queued behind a long GPU sleep, and call refit on that
stream at once (no synchronization): refit must order its reads after the
kernel. Generators read back on the same stream after the commit.

--update-rate R: versions are training steps instead of independent draws:
each element's FP32 master takes a random walk, m += R * |m| * u with u
uniform in (-1, 1) drawn afresh per element and step, and a version holds
bf16(m), so only the elements whose master crossed a BF16 rounding boundary
change (about 128 R of them at small R, as mixed-precision training does).

--delta: the config is run with refit.delta: on (and the engine checks as
always, byte for byte against vLLM's rules, which know nothing of deltas):
refit 1 must be full and every later one a delta refit that moved fewer
bytes than a full one and wrote exactly the runtime bytes it found changed,
except where --move or --move-at re-registered the trainer's tensors (a new
address: that refit must be full).

Before the first refit each side also tries bad registrations (unknown
name, wrong shape, wrong dtype, duplicate, a missing tensor at begin) and
requires an error that names the tensor.
"""

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
import traceback

import numpy as np
import yaml
from mpi4py import MPI

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(here, "..", "reference"), here,
                os.path.join(here, "..", "..", "python")]
import megatron_rules  # noqa: E402
import refit  # noqa: E402
import vllm_rules  # noqa: E402


class Scenario:
    """One scenario: a NAME, CONFIG and the options after it (the words
    run_caller.sh takes after its build folder) and, once it runs, its seed."""

    def __init__(self, name, words):
        self.words = words
        self.args = scenario_parser().parse_args(words)
        self.name = name or os.path.splitext(os.path.basename(self.args.config))[0]
        self.seed = None

    def rerun(self, build):
        """The command that runs this scenario alone, with its seed."""
        seed = "" if self.seed is None else "REFIT_CALLER_SEED=%d " % self.seed
        return "%s%s %s %s" % (seed, os.path.join(here, "run_caller.sh"), build or "BUILD",
                               shlex.join(self.words))


# The scenario this rank runs, named by fail(); None between scenarios.
current = None
# --build: the build folder for fail()'s rerun line.
build_dir = None


def say(msg, comm):
    """A line on the scenario's rank 0 only, naming the scenario."""
    if comm.rank == 0:
        print("caller_refit: [%s] %s" % (current.name, msg), flush=True)


def fail(msg):
    """Print what failed, where, and how to run that scenario alone; end the
    whole job (its other ranks wait in collectives that would never end)."""
    rank = MPI.COMM_WORLD.rank
    if current is None:
        print("caller_refit: rank %d: FAIL: %s" % (rank, msg), flush=True)
    else:
        print("caller_refit: [%s] rank %d: FAIL: %s\n"
              "caller_refit: [%s] failed (seed %s); run it alone: %s" % (
                  current.name, rank, msg, current.name, current.seed,
                  current.rerun(build_dir)), flush=True)
    # run_caller.sh launches without recovery (refit-launch --no-recovery):
    # the abort ends every rank of the job, not this one alone.
    MPI.COMM_WORLD.Abort(1)


def meet(comm):
    """A barrier whose waiting ranks sleep between polls: ranks that wait out
    a scenario, or a generator's checks, would otherwise spin in MPI's
    progress loop and take a core from the ranks that work."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def to_bf16_bits(f):
    """float32 to bfloat16 bits, round to nearest even."""
    bits = f.view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


class TrainingWeights:
    """Versions as training steps of FP32 masters (--update-rate): version 1
    is full_weights' draw, each later one a random-walk step of every
    master. Versions are asked for in order (each rank walks the same
    steps from the same seed)."""

    def __init__(self, cfg, seed, rate):
        self.cfg, self.seed, self.rate = cfg, seed, rate
        self.version, self.master = 0, None

    def __call__(self, version):
        if version < self.version or version < 1:
            raise ValueError("versions go forward: %d after %d" % (version, self.version))
        while self.version < version:
            self.version += 1
            if self.master is None:
                self.master = draw_masters(self.cfg, self.seed, 1)
                continue
            rng = np.random.default_rng([self.seed, self.version])
            for m in self.master.values():
                u = rng.uniform(-1.0, 1.0, m.shape).astype(np.float32)
                m += np.float32(self.rate) * np.abs(m) * u
        return {name: m.copy() if vllm_rules.is_float32(name) else to_bf16_bits(m)
                for name, m in self.master.items()}


def draw_masters(cfg, seed, version):
    """Fresh float32 Hugging Face weights of `version`: normal values of
    realistic magnitude, norms near 1."""
    rng = np.random.default_rng([seed, version])
    out = {}
    for name, shape in vllm_rules.hf_tensor_shapes(cfg).items():
        scale = 1.0 if "norm" in name else 0.02
        out[name] = (rng.standard_normal(shape, dtype=np.float32) * scale +
                     (1.0 if "norm" in name else 0.0))
    return out


def full_weights(cfg, seed, version):
    """draw_masters' weights as bfloat16 bits (round to nearest even), but
    float32 tensors (vllm_rules.is_float32) as they are."""
    return {name: f if vllm_rules.is_float32(name) else to_bf16_bits(f)
            for name, f in draw_masters(cfg, seed, version).items()}


def expect_error(what, call, *words):
    try:
        call()
    except refit.Error as e:
        for w in words:
            if w not in str(e):
                fail("%s: the error lacks %r: %s" % (what, w, e))
        return
    fail("%s: no error" % what)


class Host:
    """numpy arrays in host memory."""

    def adopt(self, a):
        return a

    def zeros(self, shape, dtype):
        kind = {"bfloat16": np.uint16, "float32": np.float32}.get(refit.dtype_name(dtype))
        return np.zeros(shape, kind or np.uint8)

    def write(self, held, a):
        np.copyto(held, a)

    def flush(self):
        pass

    def fresh(self, a):
        return a.copy()

    def numpy(self, t):
        return t

    def bad_dtype(self, t):
        return t.astype(np.float32)

    def stream(self):
        import contextlib
        return contextlib.nullcontext()


class TorchCuda:
    """torch CUDA tensors from the caching allocator; writes are kernels on
    a stream of the caller's, behind a GPU sleep."""

    def __init__(self, device):
        import torch
        self.torch = torch
        torch.cuda.set_device(device)
        self.dev = torch.device("cuda", device)
        self.side = torch.cuda.Stream(self.dev)  # non-blocking, as torch's pool makes them
        self.pending = []

    def _as_torch(self, a):
        t = self.torch
        if a.dtype == np.uint16:
            return t.from_numpy(a.view(np.int16)).to(self.dev).view(t.bfloat16)
        return t.from_numpy(a).to(self.dev)

    def adopt(self, a):
        return self._as_torch(np.ascontiguousarray(a))

    def zeros(self, shape, dtype):
        t = self.torch
        kind = {"bfloat16": t.bfloat16, "float32": t.float32}.get(refit.dtype_name(dtype), t.uint8)
        return t.zeros(shape, dtype=kind, device=self.dev)

    def write(self, held, a):
        self.pending.append((held, a))

    def flush(self):
        """Every pending write as a kernel, all queued behind one GPU sleep of
        about a quarter of a second: the uploads (synchronous copies) come
        first, so that nothing on the host waits for the sleep."""
        t = self.torch
        with t.cuda.stream(self.side):
            staged = [(held, self._as_torch(a ^ np.array(0x5A5A, a.dtype)).view(t.int16))
                      for held, a in self.pending]
            t.cuda._sleep(500_000_000)
            for held, x in staged:
                t.bitwise_xor(x, 0x5A5A, out=held.view(t.int16))
        self.pending = []

    def fresh(self, a):
        with self.torch.cuda.stream(self.side):
            return self.adopt(a)

    def numpy(self, t):
        with self.torch.cuda.stream(self.side):
            if t.dtype == self.torch.bfloat16:
                return t.view(self.torch.int16).cpu().numpy().view(np.uint16)
            return t.cpu().numpy()

    def bad_dtype(self, t):
        return t.float()

    def stream(self):
        return self.torch.cuda.stream(self.side)


def check_delta(s, comm, version, moved):
    """--delta: what kind of refit `version` was, on every rank alike, and
    what it moved and wrote."""
    w = s.last_wire_stats()
    sent = comm.allreduce(np.array([w["wire_bytes"], w["full_bytes"]] if s.side == "trainer"
                                   else [0, 0], np.int64))
    note = "; %s refit, %d of %d bytes on the wire" % (
        "a delta" if w["delta"] else "a full", sent[0], sent[1])
    kinds = comm.allgather(w["delta"])
    if len(set(kinds)) != 1:
        fail("version %d: ranks disagree on a delta refit: %s" % (version, kinds))
    want = 0 if version == 1 or moved else 1
    if kinds[0] != want:
        fail("version %d: a %s refit, expected a %s one" % (
            version, "delta" if kinds[0] else "full", "delta" if want else "full"))
    if w["full_bytes"] == 0:
        return note  # a rank with nothing to send or receive
    if want and w["wire_bytes"] >= w["full_bytes"]:
        fail("version %d: a delta refit moved %d bytes here, a full one %d" % (
            version, w["wire_bytes"], w["full_bytes"]))
    if not want and w["wire_bytes"] != w["full_bytes"]:
        fail("version %d: a full refit moved %d bytes here, expected %d" % (
            version, w["wire_bytes"], w["full_bytes"]))
    if s.side == "generator" and want and w["written_bytes"] != w["changed_bytes"]:
        fail("version %d: a delta refit wrote %d runtime bytes and found %d changed" % (
            version, w["written_bytes"], w["changed_bytes"]))
    return note


def nested(name):
    return name.replace(".mlp.experts.", ".mlp.experts.routed_experts.")


def scenario_parser():
    ap = argparse.ArgumentParser(prog="caller_refit.py", allow_abbrev=False)
    ap.add_argument("config")
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--nested-experts", action="store_true")
    ap.add_argument("--move", action="store_true")
    ap.add_argument("--move-at", type=int)
    ap.add_argument("--matrix", action="store_true")
    ap.add_argument("--hdf5-reference", nargs="?", const="")
    ap.add_argument("--torch-cuda", action="store_true")
    ap.add_argument("--engine-ignore")
    ap.add_argument("--update-rate", type=float)
    ap.add_argument("--delta", action="store_true")
    return ap


def job_config(sc, comm, work):
    """The path of the config the scenario runs and the config: CONFIG as it
    is, or as --matrix, --hdf5-reference and --delta change it, written by
    rank 0 of `comm` into `work`; the same on every rank of `comm`."""
    args = sc.args
    if args.hdf5_reference == "":
        args.hdf5_reference = os.path.join(work, sc.name + ".h5")
    path, cfg = args.config, None
    if comm.rank == 0:
        with open(path) as f:
            cfg = yaml.safe_load(f)
        if args.matrix or args.hdf5_reference is not None or args.delta:
            if args.matrix:
                cfg.setdefault("trainer", {})["layout"] = "megatron"
                cfg["source"] = {"kind": "caller"}
                cfg["verify"] = False
                cfg.pop("dump", None)
            if args.hdf5_reference is not None:
                cfg["reference"] = {"kind": "hdf5", "path": args.hdf5_reference}
                cfg["verify"] = True
            if args.delta:
                cfg.setdefault("refit", {})["delta"] = "on"
            path = os.path.join(work, sc.name + ".yaml")
            with open(path, "w") as f:
                yaml.safe_dump(cfg, f)
    return comm.bcast((path, cfg))


def ranks(cfg):
    """The config's trainer and generator ranks."""
    t, g = cfg.get("trainer", {}), cfg.get("generator", {})
    return (t.get("tp", 1) * t.get("pp", 1) * t.get("dp", 1),
            g.get("tp", 1) * g.get("engines", 1))


def run_scenario(sc, comm, config, cfg):
    """Run scenario `sc` (its config at `config`, read as `cfg`) on every
    rank of `comm`, checking everything the module docstring says; return
    once every rank of `comm` passed."""
    args = sc.args
    engine_cfg = cfg  # what the engine holds: the config's rules, or its own list
    if args.engine_ignore is not None:
        engine_cfg = yaml.safe_load(yaml.safe_dump(cfg))
        engine_cfg.setdefault("refit", {})["quantization_ignore"] = [
            m for m in args.engine_ignore.split(",") if m]
    started = time.monotonic()
    seed = None
    if comm.rank == 0:
        seed = int(os.environ.get("REFIT_CALLER_SEED") or
                   int.from_bytes(os.urandom(4), "little"))
    seed = sc.seed = comm.bcast(seed)
    say("%s on %d ranks, seed %d" % (shlex.join(sc.words), comm.size, seed), comm)
    ntrainer = ranks(cfg)[0]
    gen_tp = cfg.get("generator", {}).get("tp", 1)
    pad_rng = np.random.default_rng([seed, comm.rank])
    if args.hdf5_reference:
        # One checkpoint, written by another tool than refit, for every version.
        weights_of = lambda version: full_weights(cfg, seed, 0)  # noqa: E731
        if comm.rank == 0:
            import h5py
            with h5py.File(args.hdf5_reference + ".tmp", "w") as f:
                for name, a in weights_of(0).items():
                    f.create_dataset(name, data=a).attrs["dtype"] = (
                        "float32" if a.dtype == np.float32 else "bfloat16")
            os.replace(args.hdf5_reference + ".tmp", args.hdf5_reference)
        meet(comm)
    elif args.update_rate is not None:
        weights_of = TrainingWeights(cfg, seed, args.update_rate)
    else:
        weights_of = lambda version: full_weights(cfg, seed, version)  # noqa: E731

    s = refit.Session(config, comm=comm)
    expected = {name: (shape, dtype) for name, shape, dtype in s.expected()}
    if args.torch_cuda:
        if s.device is None or s.device < 0:
            fail("--torch-cuda: the session runs on host memory (no GPU here)")
        mem = TorchCuda(s.device)
    else:
        mem = Host()
    held = {}
    if s.side == "trainer":
        mine = megatron_rules.trainer_tensors(cfg, weights_of(1), comm.rank, pad_rng)
        if set(mine) != set(expected):
            fail("Megatron-Core holds %s; refit expects %s" % (
                sorted(set(mine) - set(expected))[:4], sorted(set(expected) - set(mine))[:4]))
        for name, a in mine.items():
            if tuple(a.shape) != tuple(n for n in expected[name][0] if a.ndim == 2 or n != 1):
                fail("%s: Megatron shape %s, refit expects %s" % (name, a.shape, expected[name][0]))
        held = {name: mem.adopt(a) for name, a in mine.items()}
    elif args.engine_ignore is not None:
        tp_rank = (comm.rank - ntrainer) % gen_tp
        for name, a in vllm_rules.runtime_tensors(engine_cfg, weights_of(1), tp_rank).items():
            held[name] = mem.zeros(a.shape, vllm_rules.dtype_name(name, a))
        if set(held) == set(expected):
            fail("--engine-ignore %r: the engine holds what the config plans; the test "
                 "would prove nothing" % args.engine_ignore)
        router = [n for n in held if n.endswith(".mlp.gate.weight")]
        if router:
            expect_error("a router registered as e4m3",
                         lambda: s.register(router[0], mem.zeros(held[router[0]].shape,
                                                                 "float8_e4m3fn")),
                         router[0], "dtype")
    else:
        for name, (shape, dtype) in expected.items():
            held[name] = mem.zeros(shape, dtype)

    # Bad registrations, each named.
    first = next(iter(held))
    expect_error("unknown name", lambda: s.register("decoder.layers.999.bogus.weight", held[first]),
                 "decoder.layers.999.bogus.weight")
    expect_error("wrong shape", lambda: s.register(first, held[first].reshape(-1)[:-1]), first, "shape")
    expect_error("wrong dtype", lambda: s.register(first, mem.bad_dtype(held[first])), first,
                 "dtype")
    s.register(first, held[first])
    if s.side == "trainer" and cfg["model"]["family"] == "deepseek_v3":
        # A multi-token-prediction layer (Megatron-Core's mtp.layers.*) is
        # the trainer's and not vLLM's main model's: register_all takes it
        # beside a tensor refit expects and keeps nothing of it.
        prefix = cfg["trainer"].get("name_prefix", "")
        hidden = cfg["model"]["hidden_size"]
        mtp = {prefix + "mtp.layers.0.enorm.weight": mem.zeros((hidden,), "bfloat16"),
               prefix + "mtp.layers.0.eh_proj.weight": mem.zeros((hidden, 2 * hidden),
                                                                 "bfloat16")}
        s.register_all(dict(mtp, **{first: held[first]}))
        for name in mtp:
            s.register(name, mtp[name])
            if name in dict((n, 0) for n, _, _ in s.expected()):
                fail("%s: a multi-token-prediction tensor among the expected ones" % name)
        expect_error("a look-alike of an MTP name",
                     lambda: s.register(prefix + "mtpx.layers.0.enorm.weight",
                                        mtp[prefix + "mtp.layers.0.enorm.weight"]),
                     "mtpx.layers.0.enorm.weight")
    # A second tensor under a registered name (the same tensor again is a
    # no-op in the binding: Session.register).
    other = mem.fresh(mem.numpy(held[first]))
    expect_error("duplicate", lambda: s.register(first, other), first, "twice")
    names = list(held)
    last = names[-1]
    for name in names[1:-1]:
        s.register(nested(name) if args.nested_experts and s.side == "generator" else name,
                   held[name])
    # A tensor missing at begin (collective: every rank begins, the trainers
    # name what they lack, the generators learn that a peer could not start).
    if s.side == "trainer":
        expect_error("missing", lambda: s.begin(1), "not registered", last)
    else:
        s.register(nested(last) if args.nested_experts else last, held[last])
        expect_error("a trainer missing a tensor", lambda: s.begin(1), "could not start")
    if s.side == "trainer":
        s.register(last, held[last])

    for version in range(1, args.versions + 1):
        full = weights_of(version)
        if s.side == "trainer":
            new = megatron_rules.trainer_tensors(cfg, full, comm.rank, pad_rng)
            for name, a in new.items():
                if (args.move and version > 1) or version == args.move_at:
                    held[name] = mem.fresh(a)  # a new address
                    s.register(name, held[name])
                else:
                    mem.write(held[name], a)
            mem.flush()
        with mem.stream():  # torch: refit takes the current stream
            times = s.refit(version)
        if s.committed_version != version:
            fail("committed %d after refit %d" % (s.committed_version, version))
        if s.side == "generator":
            want = vllm_rules.runtime_tensors(engine_cfg, full, (comm.rank - ntrainer) % gen_tp)
            if set(want) != set(held):
                fail("vLLM holds %s; refit holds %s" % (sorted(set(want) - set(held))[:4],
                                                       sorted(set(held) - set(want))[:4]))
            for name, w in want.items():
                got = mem.numpy(held[name]).reshape(-1).view(np.uint8)
                ref = np.ascontiguousarray(w).reshape(-1).view(np.uint8)
                if got.size != ref.size:
                    fail("%s: %d bytes, vLLM holds %d" % (name, got.size, ref.size))
                bad = np.flatnonzero(got != ref)
                if bad.size:
                    fail("version %d, %s: %d of %d bytes differ, first at byte %d: %d, expected %d" % (
                        version, name, bad.size, got.size, bad[0], got[bad[0]], ref[bad[0]]))
            if args.hdf5_reference and s.verify(version) != 0:
                fail("version %d: refit's verification against %s found differences" % (
                    version, args.hdf5_reference))
        meet(comm)
        wire = ""
        if args.delta:
            wire = check_delta(s, comm, version,
                               (args.move and version > 1) or version == args.move_at)
        say("version %d refitted and matches vLLM's rules on every generator rank "
            "(%.4f s%s)" % (version, times["total"], wire), comm)
    s.close()
    meet(comm)
    say("passed on every rank (seed %d, %.1f s)" % (seed, time.monotonic() - started), comm)


def read_batch(path):
    """The scenarios of a --batch LIST file."""
    out = []
    with open(path) as f:
        for line in f:
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if len(words) < 2:
                raise SystemExit("caller_refit: %s: %r: NAME CONFIG [OPTIONS] expected" % (
                    path, line.strip()))
            out.append(Scenario(words[0], words[1:]))
    names = [sc.name for sc in out]
    if len(set(names)) != len(names):
        raise SystemExit("caller_refit: %s: a scenario name twice" % path)
    return out


def main():
    global current, build_dir
    ap = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    ap.add_argument("--batch")
    ap.add_argument("--build")
    ap.add_argument("--work")
    top, words = ap.parse_known_args()
    build_dir = top.build
    if top.batch is not None:
        if words:
            raise SystemExit("caller_refit: --batch LIST takes no other words: %s" % words)
        scenarios = read_batch(top.batch)
    else:
        scenarios = [Scenario(None, words)]
    world = MPI.COMM_WORLD
    work = top.work
    if work is None:
        work = world.bcast(tempfile.mkdtemp(prefix="caller_refit.") if world.rank == 0 else None)
    for sc in scenarios:
        current = sc
        try:
            config, cfg = job_config(sc, world, work)
            n = sum(ranks(cfg))
            if n > world.size:
                fail("it needs %d ranks, the job has %d" % (n, world.size))
            comm = world.Split(0 if world.rank < n else MPI.UNDEFINED, world.rank)
            if comm != MPI.COMM_NULL:
                run_scenario(sc, comm, config, cfg)
                comm.Free()
        except Exception:
            # Named here: the binding's own hook would end the job without it.
            fail("uncaught exception:\n" + traceback.format_exc())
        meet(world)
        current = None
    if top.work is None and world.rank == 0:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
