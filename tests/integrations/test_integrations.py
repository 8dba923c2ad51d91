"""refit's framework plugins (python/refit/integrations, docs/integrations.md)
driven as vLLM, NeMo-RL and verl drive them.

Each test starts the refit agents of tests/agent/moe_mxfp8.yaml (two
Megatron-Core trainer ranks, tp2/ep2, into two vLLM engines of tp1, MXFP8)
and one process per framework worker (roles.py, where each framework file's
calls are restated), then plays the framework's driver: the calls, their
order, their arguments and which are awaited follow the framework's source,
named at each step. Three updates each: one that commits, one that an
engine refuses (it was put to sleep) so that it fails on every rank, and one
that commits after it; after each, every engine compares every byte it
holds with tests/reference/vllm_rules.py (the failed update must leave the
previous version in place). The frameworks themselves are stand-ins
(standins/): the real ones are not installed on the CI machine.
"""

import json
import os
import subprocess
import sys
import types

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(ROOT, "tests", "agent"), HERE, os.path.join(HERE, "standins"),
                os.path.join(ROOT, "python"), os.path.join(ROOT, "python", "build_backend")]
import refit  # noqa: E402
import refit_build  # noqa: E402
from roles import Group, Remote, RemoteError, gather  # noqa: E402
from test_agent import Job, output, ranks, tmp  # noqa: E402,F401

CONFIG = "moe_mxfp8.yaml"


class World:
    """The agents of CONFIG and the role processes of one test."""

    def __init__(self, tmp, env=None):
        self.job = Job(CONFIG, tmp)
        self.tmp = tmp
        self.ntrainer, self.ngen = ranks(CONFIG)
        # The package's metadata as pip would install it: vLLM's plugin loader
        # finds refit's backend through the entry point pyproject.toml declares.
        meta = os.path.join(tmp, "meta")
        os.makedirs(meta)
        refit_build.prepare_metadata_for_build_wheel(meta)
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_"))}
        self.env["PYTHONPATH"] = meta
        self.env.update(env or {})
        self.procs = []

    def start(self, role, rank):
        address = os.path.join(self.tmp, "%s.%d.rpc" % (role, rank))
        log = open(os.path.join(self.tmp, "%s.%d.log" % (role, rank)), "w+")
        p = subprocess.Popen([sys.executable, os.path.join(HERE, "roles.py"), role, str(rank),
                              self.job.config, address],
                             stdout=log, stderr=subprocess.STDOUT, env=self.env)
        p.out = log
        self.procs.append(p)
        self.job.clients.append(p)
        return address, p

    def remotes(self, role, n):
        started = [self.start(role, r) for r in range(n)]
        try:
            remotes = [Remote(a, "%s %d" % (role, r), process=p)
                       for r, (a, p) in enumerate(started)]
        except RuntimeError:
            print(self.logs())
            raise
        return remotes, [a for a, _ in started]

    def log(self, name):
        """What the role process `name` (role.rank) printed."""
        with open(os.path.join(self.tmp, name + ".log")) as f:
            return f.read()

    def logs(self):
        return "".join("\n--- %s:\n%s" % (" ".join(p.args[2:4]), output(p)) for p in self.procs)

    def abandon(self):
        """A test failed: print what every process said, stop them all."""
        print(self.logs() + "\nagents:\n" + self.job.agent_log())
        self.job.close(expect_clean=False)

    def close(self, remotes):
        for r in remotes:
            r.call("exit")
        for p in self.procs:
            p.wait(60)
            assert p.returncode == 0, self.logs()
        # Options as a mapping, as a framework's config gives them.
        refit.attach({"side": "trainer", "rank": 0, "socket_dir": self.job.dir}).shutdown()
        self.job.close()


def check_all(engines, version):
    """Every engine's bytes are vLLM's for `version`, and it committed it."""
    assert all(n > 0 for n in gather([e.submit("check", version) for e in engines]))


def failed_everywhere(futures, remotes):
    """Every call failed; their errors by worker name."""
    for f in futures:
        f.thread.join()
    errors = {}
    for f, r in zip(futures, remotes):
        assert "error" in f.box, "%s did not fail: %s" % (r.name, f.box)
        errors[r.name] = f.box["error"]
    return errors


def test_plugins_import_without_frameworks():
    """Each plugin module imports with no framework installed, loads neither
    MPI nor librefit, and says what is missing where the framework is
    needed; refit's errors named after builtins subclass them."""
    probe = """
import sys, refit
import refit.integrations.vllm as v, refit.integrations.nemo_rl as n, refit.integrations.verl as r
assert "mpi4py" not in sys.modules and "refit._lib" not in sys.modules
assert issubclass(refit.TimeoutError, TimeoutError) and issubclass(refit.TimeoutError, refit.Error)
assert issubclass(refit.AgentError, refit.Error)
for make, words in ((lambda: v.RefitWeightTransferEngine(None, None, None, None), "needs vLLM"),
                    (v.register, "vllm.distributed.weight_transfer.factory"),
                    (n.RefitCheckpointEngine, "needs NeMo-RL"),
                    (lambda: n.RefitWeightSynchronizer(None, None), "needs NeMo-RL"),
                    (r.RefitCheckpointEngine, "needs verl")):
    try:
        make()
    except ImportError as e:
        assert words in str(e), e
    else:
        raise AssertionError(words)
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_pip_install_brings_the_plugins(tmp):
    """`pip install .` in a fresh venv (offline, no framework, no torch)
    installs the plugin modules and the `vllm.general_plugins` entry point
    vLLM loads refit's backend from."""
    venv = os.path.join(tmp, "venv")
    py = os.path.join(venv, "bin", "python")
    # This interpreter's pip installs into the venv where it can (pip
    # --python, pip 22.3 and later): the venv is then made without a pip of
    # its own, which ensurepip took 4 s of CPU to copy in. What is tested is
    # what pip installs from this tree, not which pip.
    pip = [sys.executable, "-m", "pip", "--python", py]
    outer = subprocess.run([sys.executable, "-m", "pip", "--python", sys.executable, "--version"],
                           capture_output=True, timeout=60).returncode == 0
    if not outer:
        pip = [py, "-m", "pip"]
    subprocess.run([sys.executable, "-m", "venv", venv] + (["--without-pip"] if outer else []),
                   check=True, timeout=120)
    out = subprocess.run(pip + ["install", "-q", "--no-index", ROOT],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    probe = """
from importlib import metadata
import refit, refit.integrations.vllm, refit.integrations.nemo_rl, refit.integrations.verl
eps = metadata.entry_points().select(group="vllm.general_plugins")
print(refit.__file__, [(e.name, e.value) for e in eps])
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([py, "-c", probe], capture_output=True, text=True, cwd=tmp, env=env,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert venv in out.stdout and \
        "[('refit', 'refit.integrations.vllm:register')]" in out.stdout, out.stdout


def test_vllm_sleep_mode_refused():
    """vLLM started with sleep mode: the backend refuses at engine creation,
    naming sleep mode (CuMemAllocator), instead of refitting memory it
    unmaps."""
    from refit.integrations.vllm import RefitWeightTransferEngine
    ns = types.SimpleNamespace
    vllm_config = ns(parallel_config=ns(rank=0, world_size=1),
                     model_config=ns(enable_sleep_mode=True))
    with pytest.raises(NotImplementedError) as info:
        RefitWeightTransferEngine(ns(backend="refit"), vllm_config, None, None)
    assert "sleep mode" in str(info.value) and "CuMemAllocator" in str(info.value)


def test_vllm_mla_dequantized_copy():
    """Block FP8 DeepSeek: the engine hands refit the BF16 buffer W_UK_T and
    W_UV are views of (built as MLAAttention builds them), under
    kv_b_proj.weight_dequant, beside the model's parameters."""
    import torch
    from refit.integrations.vllm import runtime_tensors
    n, p, v, r = 2, 4, 4, 8  # heads, nope, v_head, kv_lora_rank

    class MLA(torch.nn.Module):
        def __init__(self):
            super().__init__()
            w = torch.randn(n * (p + v), r).to(torch.bfloat16)
            w_uk, w_uv = w.T.view(r, n, p + v).split([p, v], dim=-1)
            self.W_UK_T, self.W_UV = w_uk.permute(1, 2, 0), w_uv.transpose(0, 1)

    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([torch.nn.Module()])
    attn = model.model.layers[0].self_attn = torch.nn.Module()
    attn.kv_b_proj = torch.nn.Linear(r, n * (p + v), bias=False)
    attn.mla_attn = MLA()
    name = "model.layers.0.self_attn.kv_b_proj.weight_dequant"
    got = dict(runtime_tensors(model)([("model.layers.0.self_attn.kv_b_proj.weight", None,
                                        None), (name, None, None)]))
    base = got[name]
    assert base.shape == (n * (p + v), r) and base.dtype == torch.bfloat16
    base.add_(1)  # a write in place is seen through both views
    assert torch.equal(attn.mla_attn.W_UK_T, base.T.view(r, n, p + v)[..., :p].permute(1, 2, 0))
    assert torch.equal(attn.mla_attn.W_UV, base.T.view(r, n, p + v)[..., p:].transpose(0, 1))
    assert attn.mla_attn.W_UV.data_ptr() == base.data_ptr() + p * r * base.element_size()
    with pytest.raises(KeyError) as info:
        runtime_tensors(model)([("model.layers.1.self_attn.kv_b_proj.weight_dequant", None,
                                 None)])
    assert "weight_dequant" in str(info.value)


def test_vllm_backend(tmp):
    """vLLM: the `refit` backend from the entry point, created by the worker
    after load; trainer_init on every trainer rank (rank 0 sends init_info
    to the workers); per update every trainer rank's send_weights(), the
    sender driving start_weight_update, update_weights({"version": V}) and
    finish_weight_update through the control plane. An engine put to sleep
    refuses update 2 by name and every rank fails it; update 3 commits."""
    w = World(tmp)
    engines, addresses = w.remotes("vllm_engine", w.ngen)
    trainers, _ = w.remotes("vllm_trainer", w.ntrainer)
    try:
        gather([e.submit("load_model") for e in engines])
        gather([t.submit("init", w.job.dir, addresses if t is trainers[0] else None)
                for t in trainers])
        for version in (1, 2, 3):
            gather([t.submit("step", version) for t in trainers])  # the optimizer step
            if version == 2:
                engines[1].call("sleep", 1)
            futures = [t.submit("send_weights") for t in trainers]
            if version == 2:
                errors = failed_everywhere(futures, trainers)
                sender = str(errors["vllm_trainer 0"])
                assert "generator rank 1 refused the refit of version 2" in sender, sender
                assert "asleep" in sender and "wake_up" in sender, sender
                assert errors["vllm_trainer 1"].kind == "refit.PeerError", errors
                check_all(engines, 1)  # restored or never touched
                engines[1].call("wake_up")
                continue
            for m in gather(futures):
                assert m["refit/version"] == version and m["refit/bytes"] > 0, m
            check_all(engines, version)
            m = engines[0].call("metrics")
            assert m["refit/version"] == version and m["refit/gbps"] >= 0, m
        # The WeightSource is never iterated: refit reads the shards.
        assert [t.call("reads") for t in trainers] == [0] * w.ntrainer
        gather([e.submit("shutdown") for e in engines])
        # One record per committed refit on the `refit` logger, per rank.
        for role, n, side in (("vllm_engine", w.ngen, "generator"),
                              ("vllm_trainer", w.ntrainer, "trainer")):
            for r in range(n):
                records = [x for x in w.log("%s.%d" % (role, r)).splitlines()
                           if x.startswith("refit INFO refit: %s rank %d committed" % (side, r))]
                assert [x.split()[8].rstrip(":") for x in records] == ["1", "3"], records
                assert all(" bytes in " in x and "GB/s" in x for x in records), records
    except BaseException:
        w.abandon()
        raise
    w.close(engines + trainers)


class Timer:
    """NeMo-RL's Timer as sync_weights uses it: time(label) is a context."""

    def __init__(self):
        self.labels = []

    def time(self, label):
        import contextlib
        self.labels.append(label)
        return contextlib.nullcontext()


def test_nemo_rl_checkpoint_engine(tmp):
    """NeMo-RL: RefitWeightSynchronizer drives the policy and vLLM
    generation workers through checkpoint_engine_rpc (create by class path,
    prepare, init_*_process_group, `await send_weights(iterator)` beside
    `async for batch in receive_weight_batches()`), in the training loop's
    order: step, mark_stale, sync_weights(timer=...) while is_stale. The
    generation workers' runtime tensors come from refit's vLLM backend in
    the same process; nothing is loaded from batches."""
    from refit.integrations.nemo_rl import RefitWeightSynchronizer
    w = World(tmp)
    gens, _ = w.remotes("nemo_generation", w.ngen)
    policies, _ = w.remotes("nemo_policy", w.ntrainer)
    try:
        gather([g.submit("load_model") for g in gens])
        ns = types.SimpleNamespace
        sync = RefitWeightSynchronizer(
            ns(worker_group=Group(policies)),
            ns(worker_group=Group(gens), cfg={"vllm_cfg": {"async_engine": False}}),
            options={"socket_dir": w.job.dir}, get=gather)
        assert sync.is_stale
        timer = Timer()
        for version in (1, 2, 3):
            Group(policies).call_all("step", version)
            sync.mark_stale()
            assert sync.is_stale
            if version == 2:
                gens[1].call("sleep", 1)
                with pytest.raises(RemoteError) as info:
                    sync.sync_weights(timer=timer)
                assert info.value.kind.startswith("refit."), info.value
                assert sync.is_stale
                check_all(gens, 1)
                gens[1].call("wake_up")
                continue
            metrics = sync.sync_weights(timer=timer, kv_scales=None)
            assert not sync.is_stale and metrics["refit/version"] == version, metrics
            check_all(gens, version)
        assert timer.labels == ["prepare_for_generation/transfer_and_update_weights"] * 3
        with pytest.raises(NotImplementedError):
            sync.sync_weights(kv_scales={"layers.0.k_scale": 1.0})
        assert [p.call("reads") for p in policies] == [0] * w.ntrainer
        assert [g.call("__getattribute__", "loaded") for g in gens] == [0] * w.ngen
        sync.shutdown()
    except BaseException:
        w.abandon()
        raise
    w.close(gens + policies)


def test_verl_checkpoint_engine(tmp):
    """verl: the engine registered as `refit` (imported in each process
    through VERL_USE_EXTERNAL_MODULES) and made with verl's constructor
    arguments; per update CheckpointEngineManager's sequence: prepare on
    every worker, the classmethod build_topology, init_process_group with
    each worker's share, `await send_weights(per_tensor_param)` beside the
    server adapter's `async for` over receive_weights(), finalize on every
    worker. The attachment survives each update's prepare/finalize."""
    w = World(tmp, {"VERL_USE_EXTERNAL_MODULES": "refit.integrations.verl"})
    # The config's engine_kwargs["refit"], as verl passes them to the engine.
    w.env["REFIT_TEST_ENGINE_KWARGS"] = json.dumps({"socket_dir": w.job.dir})
    rollouts, _ = w.remotes("verl_rollout", w.ngen)
    trainers, _ = w.remotes("verl_trainer", w.ntrainer)
    import refit.integrations.verl  # noqa: F401  (registers `refit`, as in verl's processes)
    from verl.checkpoint_engine.base import CheckpointEngineRegistry
    backend_cls = CheckpointEngineRegistry.get("refit")
    try:
        gather([r.submit("load_model") for r in rollouts])
        workers = trainers + rollouts
        for version in (1, 2, 3):
            gather([t.submit("step", version) for t in trainers])
            if version == 2:
                rollouts[1].call("sleep", 1)
            metadata = gather([x.submit("execute_checkpoint_engine", "prepare") for x in workers])
            trainer_kwargs, rollout_kwargs = backend_cls.build_topology(
                len(trainers), len(rollouts), metadata)
            gather([x.submit("execute_checkpoint_engine", "init_process_group",
                             **{k: v[i] for k, v in kwargs.items()})
                    for group, kwargs in ((trainers, trainer_kwargs), (rollouts, rollout_kwargs))
                    for i, x in enumerate(group)])
            futures = [x.submit("update_weights") for x in workers]
            if version == 2:
                errors = failed_everywhere(futures, workers)
                assert "asleep" in str(errors["verl_rollout 1"]), errors
                assert errors["verl_trainer 0"].kind == "refit.PeerError", errors
            else:
                gather(futures)
            gather([x.submit("execute_checkpoint_engine", "finalize") for x in workers])
            check_all(rollouts, 1 if version == 2 else version)
            if version == 2:
                rollouts[1].call("wake_up")
        assert [t.call("reads") for t in trainers] == [0] * w.ntrainer
        assert [r.call("__getattribute__", "loaded") for r in rollouts] == [0] * w.ngen
    except BaseException:
        w.abandon()
        raise
    w.close(workers)
