"""Async refit from Python: the engines never register their runtime
tensors; they serve from zero-copy torch views of the session's own storage
(a forward of one MoE block) between progress calls, see the committed
version unchanged while the next one streams in, and the new one, byte for
byte as vLLM's rules say, right after commit. The trainer is a torch
module under Hugging Face names. Runs on every rank of hf_async.yaml's job."""

import pytest
import torch
from mpi4py import MPI

import refit
from refit_testlib import (NamedModel, compare, config, from_bits, full_weights, ranks,
                           vllm_rules)

comm = MPI.COMM_WORLD
SEED = 777


def moe_block(views, layer, x):
    """The routed-expert MLP of one Qwen3-MoE layer, top-2, from vLLM's
    runtime tensors (w13 = [gate; up] per expert, w2 = down)."""
    p = "model.layers.%d.mlp." % layer
    gate = views[p + "gate.weight"].float()
    w13 = views[p + "experts.w13_weight"].float()
    w2 = views[p + "experts.w2_weight"].float()
    weights, experts = torch.topk(torch.softmax(x @ gate.t(), -1), 2, dim=-1)
    out = torch.zeros_like(x)
    inter = w13.shape[1] // 2
    for k in range(2):
        for e in experts[:, k].unique().tolist():
            rows = experts[:, k] == e
            h = x[rows] @ w13[e].t()
            act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
            out[rows] += weights[rows, k, None] * (act @ w2[e].t())
    return out


def test_async_loop():
    path, cfg = config()
    ntrainer, gen_tp = ranks(cfg)
    with refit.Session(path) as s:
        if s.side == "trainer":
            full = full_weights(cfg, SEED, 1)
            model = NamedModel({n: from_bits(a) for n, a in full.items()})
            s.register_all(model.named_parameters())
        else:
            # Before the first begin the session has not allocated yet.
            with pytest.raises(refit.StateError) as e:
                s.tensors()
            assert "register it or call begin() first" in e.value.message
        previous = None
        x = torch.randn(16, cfg["model"]["hidden_size"], generator=torch.Generator().manual_seed(1))
        for version in (1, 2, 3):
            full = full_weights(cfg, SEED, version)
            if s.side == "trainer":
                with torch.no_grad():
                    for n, p in model.named_parameters():
                        p.copy_(from_bits(full[n]))
            s.begin(version)
            served = 0
            views = s.tensors(framework="torch") if s.side == "generator" else None
            while not s.progress():
                if views is None:
                    continue
                y = moe_block(views, served % cfg["model"]["num_layers"], x)
                assert torch.isfinite(y).all() or previous is None
                served += 1
                if previous is not None:  # still serving version - 1
                    n = "model.layers.0.mlp.experts.w13_weight"
                    compare(views[n], previous[n], "during refit %d, %s" % (version, n))
            assert s.state == "ready"
            s.commit()
            assert s.committed_version == version and s.state == "idle"
            if views is not None:
                want = vllm_rules.runtime_tensors(cfg, full, (comm.rank - ntrainer) % gen_tp)
                for n, w in want.items():
                    compare(views[n], w, "version %d %s" % (version, n))
                assert served > 0, "no serving step between progress calls"
                assert torch.isfinite(moe_block(views, 0, x)).all()
                previous = want
            comm.Barrier()
