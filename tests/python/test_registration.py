"""Registration under the calls real code makes (issue 37, defect 8), and
the messages of a session's errors (defect 9): a scale beside a BF16 weight
checked like every tensor; a trainer's tensor whose storage was swapped
(model.float(); model.bfloat16()) registered again at begin, a generator's
refused by name; register_all atomic; views that outlive close(); norm
shapes as torch holds them; version 0 and name misses explained. Runs on
every rank of megatron_mxfp8.yaml's job, each test in a session of its own
(collective: every rank runs the same tests in the same order)."""

import gc

import numpy as np
import pytest
import torch
from mpi4py import MPI

import refit
from refit_testlib import (NamedModel, compare, config, from_bits, full_weights, ranks,
                           torch_like, vllm_rules)
import megatron_rules

comm = MPI.COMM_WORLD
SEED = 3737


def test_package_is_this_worktree():
    import os
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert refit.__file__.startswith(os.path.join(here, "python")), refit.__file__


class Job:
    """A session and this rank's tensors: a trainer's torch module with
    Megatron-Core names, or an engine's runtime tensors."""

    def __init__(self):
        self.path, self.cfg = config()
        self.s = refit.Session(self.path)
        ntrainer, gen_tp = ranks(self.cfg)
        self.tp_rank = (comm.rank - ntrainer) % gen_tp
        if self.s.side == "trainer":
            self.rng = np.random.default_rng([SEED, comm.rank])
            mine = megatron_rules.trainer_tensors(self.cfg, full_weights(self.cfg, SEED, 1),
                                                  comm.rank, self.rng)
            self.model = NamedModel({n: from_bits(a) for n, a in mine.items()})
        else:
            self.held = {n: torch_like(shape, dt) for n, shape, dt in self.s.expected()}

    def register(self):
        if self.s.side == "trainer":
            self.s.register_all(self.model.named_parameters())
        else:
            self.s.register_all(self.held)

    def train(self, version):
        if self.s.side == "trainer":
            new = megatron_rules.trainer_tensors(
                self.cfg, full_weights(self.cfg, SEED, version), comm.rank, self.rng)
            with torch.no_grad():
                for n, p in self.model.named_parameters():
                    p.copy_(from_bits(new[n]).reshape(p.shape))

    def check(self, version):
        if self.s.side == "generator":
            want = vllm_rules.runtime_tensors(self.cfg, full_weights(self.cfg, SEED, version),
                                              self.tp_rank)
            for n, w in want.items():
                compare(self.held[n], w, "version %d %s" % (version, n))

    def close(self):
        self.s.close()
        comm.Barrier()


def refused(call, *words, cls=refit.InvalidArgumentError):
    with pytest.raises(cls) as info:
        call()
    for w in words:
        assert w in info.value.message, "%r not in %r" % (w, info.value.message)
    return info.value


def test_scale_beside_bf16_weight_is_checked():
    job = Job()
    s = job.s
    if s.side == "generator":
        bf16 = [n for n, shape, dt in s.expected() if dt == torch.bfloat16 and n.endswith("weight")
                and len(shape) == 2 and "norm" not in n]
        name = bf16[0] + "_scale"
        rows, cols = dict((n, sh) for n, sh, _ in s.expected())[bf16[0]]
        # One byte broadcast to the whole scale: refit would read far past it.
        broadcast = torch.ones(1, dtype=torch.uint8).expand(rows, cols // 32)
        refused(lambda: s.register(name, broadcast), name, "not contiguous")
        ro = np.ones((rows, cols // 32), np.uint8)
        ro.flags.writeable = False
        refused(lambda: s.register(name, ro), name, "read-only")
    job.close()


def test_expected_gives_norms_as_torch_holds_them():
    job = Job()
    norms = [(n, shape) for n, shape, _ in job.s.expected() if "norm" in n]
    assert norms
    for n, shape in norms:
        assert len(shape) == 1, "%s: %s, torch holds [n]" % (n, list(shape))
    if job.s.side == "trainer":
        params = dict(job.model.named_parameters())
        for n, shape in norms:
            assert tuple(params[n].shape) == tuple(shape), n
    job.register()  # the [n] tensors are what refit takes
    job.train(1)
    job.s.refit(1)
    job.check(1)
    job.close()


def test_name_miss_says_what_was_meant():
    job = Job()
    s = job.s
    name, shape, dtype = s.expected()[0]
    good = torch_like(shape, dtype)
    e = refused(lambda: s.register("module." + name, good), "module." + name,
                "strip_prefix", "'module.'")
    assert "holds no tensor" in e.message
    typo = name[:-3] + name[-2:]  # one letter dropped
    refused(lambda: s.register(typo, good), typo, "did you mean", repr(name))
    refused(lambda: s.register("_orig_mod." + name, good), "'_orig_mod.'")
    job.close()


def test_register_all_is_atomic():
    job = Job()
    s = job.s
    if s.side == "trainer":
        tensors = dict(job.model.named_parameters())
    else:
        tensors = dict(job.held)
    bad_name = sorted(tensors)[len(tensors) // 2]
    good = tensors[bad_name]
    tensors[bad_name] = torch.zeros(tuple(good.shape), dtype=torch.float32)
    refused(lambda: s.register_all(tensors), bad_name, "float32")
    # Nothing was registered: the fixed set goes in whole, and the refit runs.
    tensors[bad_name] = good
    s.register_all(tensors)
    s.register_all(tensors)  # the same tensors again: nothing to do
    job.train(1)
    s.refit(1)
    job.check(1)
    job.close()


def test_trainer_storage_swapped_is_followed():
    job = Job()
    job.register()
    job.train(1)
    job.s.refit(1)
    job.check(1)
    if job.s.side == "trainer":
        before = {n: p.data_ptr() for n, p in job.model.named_parameters()}
        # What mixed-precision code does: every parameter's storage is
        # replaced (param.data = ...), the old one freed; the next step
        # writes the new storage.
        job.model.float()
        job.model.bfloat16()
        gc.collect()
        assert all(p.data_ptr() != before[n] for n, p in job.model.named_parameters())
    job.train(2)
    job.s.refit(2)
    job.check(2)
    job.close()


def test_generator_storage_swapped_is_refused():
    job = Job()
    job.register()
    job.train(1)
    job.s.refit(1)
    job.check(1)
    job.train(2)
    name = sorted(job.held)[0] if job.s.side == "generator" else None
    if name is not None:
        t = job.held[name]
        t.set_(torch.zeros_like(t))  # the engine replaced the storage
    with pytest.raises(refit.Error) as info:
        job.s.refit(2)
    if name is not None:
        assert isinstance(info.value, refit.StateError)
        assert name in info.value.message and "never moves" in info.value.message
    job.close()


def test_views_keep_the_session_alive():
    job = Job()
    job.register() if job.s.side == "trainer" else None
    job.train(1)
    job.s.refit(1)
    name, _, _ = job.s.expected()[0]
    v = job.s.tensor(name)
    want = np.array(v, copy=True)
    job.s.close()
    gc.collect()
    junk = [np.full(v.nbytes, 0x5A, np.uint8) for _ in range(8)]  # reuse freed memory
    assert np.array_equal(v, want)
    v[...] = 0  # still the session's memory, not someone else's
    del v, junk
    comm.Barrier()


def test_version_0_is_explained():
    job = Job()
    job.register()
    e = refused(lambda: job.s.begin(0), "versions start at 1", cls=refit.Error)
    assert e.status != 0
    job.close()
