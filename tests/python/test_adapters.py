"""The two adapters (refit.adapters) refit a torch trainer's Megatron-named
module into an engine's vLLM-named torch tensors, checked byte for byte
against vLLM's rules: NeMo-RL's WeightSynchronizer shape for two versions,
then verl's CheckpointEngine shape for two more (a session each). Runs on
every rank of megatron_mxfp8.yaml's job."""

import numpy as np
import torch
from mpi4py import MPI

from refit.adapters import CheckpointEngine, WeightSynchronizer
from refit_testlib import (NamedModel, compare, config, from_bits, full_weights, ranks,
                           torch_like, vllm_rules)
import megatron_rules  # after refit_testlib, which puts tests/caller on the path

comm = MPI.COMM_WORLD
SEED = 4242


def side_tensors(cfg):
    """Trainer: a DDP-style module ("module." + Megatron names); engine: its
    runtime tensors. Which side a rank is follows the config's rank split."""
    ntrainer, _ = ranks(cfg)
    if comm.rank < ntrainer:
        rng = np.random.default_rng([SEED, comm.rank])
        mine = megatron_rules.trainer_tensors(cfg, full_weights(cfg, SEED, 1), comm.rank, rng)
        wrapper = torch.nn.Module()
        wrapper.add_module("module", NamedModel({n: from_bits(a) for n, a in mine.items()}))
        return "trainer", wrapper, rng
    return "generator", None, None


def train_step(cfg, model, rng, version):
    new = megatron_rules.trainer_tensors(cfg, full_weights(cfg, SEED, version), comm.rank, rng)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(from_bits(new[n[len("module."):]]).reshape(p.shape))


def check(cfg, held, version):
    ntrainer, gen_tp = ranks(cfg)
    want = vllm_rules.runtime_tensors(cfg, full_weights(cfg, SEED, version),
                                      (comm.rank - ntrainer) % gen_tp)
    assert set(want) == set(held)
    for n, w in want.items():
        compare(held[n], w, "version %d %s" % (version, n))


def engine_tensors(expected):
    return {n: torch_like(shape, dt) for n, shape, dt in expected}


def test_weight_synchronizer_then_checkpoint_engine():
    path, cfg = config()
    side, model, rng = side_tensors(cfg)

    # NeMo-RL's shape.
    if side == "trainer":
        sync = WeightSynchronizer(path, model.named_parameters(), strip_prefix="module.")
        assert sync.init_communicator() == "trainer"
    else:
        # The engine allocates what the session lists.
        sync = WeightSynchronizer(path, engine_tensors)
        assert sync.init_communicator() == "generator"
        held = sync.tensors
    for version in (1, 2):
        if side == "trainer":
            train_step(cfg, model, rng, version)
        metrics = sync.sync_weights()
        assert metrics["refit/version"] == version and metrics["refit/total_s"] > 0
        if side == "generator":
            check(cfg, held, version)
    sync.shutdown()

    # verl's shape, a new session: versions start again at 1.
    engine = CheckpointEngine(path, strip_prefix="module.")
    engine.prepare()
    topo = engine.build_topology()
    assert topo["side"] == side
    if side == "generator":
        held = engine_tensors(topo["expected"])
    for version in (1, 2):
        if side == "trainer":
            train_step(cfg, model, rng, version + 10)
            metrics = engine.send_weights(model.named_parameters())
        else:
            metrics = engine.receive_weights(held)
            check(cfg, held, version + 10)
        assert metrics["refit/version"] == version
    engine.finalize()

    # The same engine object opens a new session: the tensors are registered
    # in it again.
    engine.prepare()
    if side == "trainer":
        train_step(cfg, model, rng, 20)
        metrics = engine.send_weights(model.named_parameters())
    else:
        metrics = engine.receive_weights(held)
        check(cfg, held, 20)
    assert metrics["refit/version"] == 3
    engine.finalize()
