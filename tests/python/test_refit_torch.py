"""A torch trainer with Megatron-Core parameter names refits 3 versions into
torch runtime tensors an engine registered; every generator byte is compared
with vLLM's rules (tests/reference/vllm_rules.py) applied to the full
weights, independently of refit's catalog. Also: bad registrations, each
refused with a message naming the tensor, and errors carrying the C message
and status. Runs on every rank of megatron_mxfp8.yaml's job (collective:
every rank runs the same tests in the same order)."""

import numpy as np
import pytest
import torch
from mpi4py import MPI

import refit
from refit_testlib import (NamedModel, compare, config, from_bits, full_weights, ranks,
                           torch_like, vllm_rules)
import megatron_rules

comm = MPI.COMM_WORLD
SEED = 20260


@pytest.fixture(scope="module")
def job():
    path, cfg = config()
    s = refit.Session(path)
    ntrainer, gen_tp = ranks(cfg)
    state = {"s": s, "cfg": cfg, "tp_rank": (comm.rank - ntrainer) % gen_tp}
    if s.side == "trainer":
        rng = np.random.default_rng([SEED, comm.rank])
        mine = megatron_rules.trainer_tensors(cfg, full_weights(cfg, SEED, 1), comm.rank, rng)
        # What a DDP-wrapped Megatron model's named_parameters() give:
        # "module." + Megatron-Core's names.
        wrapper = torch.nn.Module()
        wrapper.add_module("module", NamedModel({n: from_bits(a) for n, a in mine.items()}))
        state.update(model=wrapper, rng=rng)
    else:
        state["held"] = {n: torch_like(shape, dt) for n, shape, dt in s.expected()}
    yield state
    s.close()


def expect(call, *words, status="INVALID_ARGUMENT"):
    with pytest.raises(refit.Error) as info:
        call()
    e = info.value
    assert e.status == refit.CODE[status] and isinstance(e, refit.BY_STATUS[e.status])
    for w in words:
        assert w in e.message, "%r not in %r" % (w, e.message)
    return e


def test_expected_is_megatron(job):
    s = job["s"]
    names = [n for n, _, _ in s.expected()]
    if s.side == "trainer":
        assert sorted(names) == sorted(n[len("module."):] for n, _ in
                                       job["model"].named_parameters())
    else:
        want = vllm_rules.runtime_tensors(job["cfg"], full_weights(job["cfg"], SEED, 1),
                                          job["tp_rank"])
        assert sorted(names) == sorted(want)
    assert s.state == "idle" and s.committed_version == 0


def test_bad_registrations(job):
    s = job["s"]
    name, shape, dtype = s.expected()[1]
    good = torch_like(shape, dtype)
    # Refused by refit_tensor_register: its C message names the tensor.
    e = expect(lambda: s.register("no.such.tensor", good), "no.such.tensor", "holds no tensor")
    assert e.message == e.args[0].split(": ", 1)[1] and e.status_name == "REFIT_ERR_INVALID_ARGUMENT"
    expect(lambda: s.register(name, torch_like((shape[0] + 1,) + tuple(shape[1:]), dtype)),
           name, "shape")
    # Refused in Python before C sees a pointer: layout and element type.
    expect(lambda: s.register(name, torch.zeros(shape, dtype=torch.float32)), name, "dtype",
           refit.dtype_name(dtype), "float32")
    if len(shape) == 2 and shape[0] > 1 and shape[1] > 1:
        strided = torch_like((shape[1], shape[0]), dtype).t()
        expect(lambda: s.register(name, strided), name, "not contiguous")
    expect(lambda: s.register(name, np.zeros(shape, np.float64)), name, "dtype")
    with pytest.raises(TypeError):
        s.register(name, [0, 1, 2])
    # A duplicate (C again).
    s.register(name, good)
    expect(lambda: s.register(name, torch_like(shape, dtype)), name, "twice")
    job["first"] = (name, good)


def test_refit_three_versions(job):
    s, cfg = job["s"], job["cfg"]
    if s.side == "trainer":
        params = dict(job["model"].named_parameters())
        first, tensor = job["first"]
        # The first tensor was registered by the previous test: give the
        # model that storage, then register the rest under stripped names.
        with torch.no_grad():
            tensor.copy_(params["module." + first].data)
        params["module." + first].data = tensor
        s.register_all(((n, p) for n, p in params.items() if n != "module." + first),
                       strip_prefix="module.")
    else:
        first, tensor = job["first"]
        job["held"][first] = tensor
        s.register_all({n: t for n, t in job["held"].items() if n != first})
    for version in (1, 2, 3):
        full = full_weights(cfg, SEED, version)
        if s.side == "trainer":
            new = megatron_rules.trainer_tensors(cfg, full, comm.rank, job["rng"])
            with torch.no_grad():
                for n, p in job["model"].named_parameters():
                    p.copy_(from_bits(new[n[len("module."):]]).reshape(p.shape))
        times = s.refit(version)
        assert s.committed_version == version and s.state == "idle"
        assert set(times) == {"source", "pack", "transfer", "land", "commit", "total"}
        assert times["total"] > 0
        if s.side == "generator":
            want = vllm_rules.runtime_tensors(cfg, full, job["tp_rank"])
            for n, w in want.items():
                compare(job["held"][n], w, "version %d %s" % (version, n))
        comm.Barrier()


def test_views_alias_registered_memory(job):
    s = job["s"]
    if s.side != "generator":
        return
    for n, v in s.tensors(framework="torch").items():
        assert v.data_ptr() == job["held"][n].data_ptr(), n
    v = s.tensor(next(iter(job["held"])))  # host memory: numpy by default
    assert isinstance(v, np.ndarray)


def test_stale_version_refused(job):
    s = job["s"]
    with pytest.raises(refit.Error) as info:
        s.begin(2)
    e = info.value
    assert e.message and e.status != 0 and "2" in e.message
    s.abort()
    assert s.committed_version == 3 and s.state == "idle"
