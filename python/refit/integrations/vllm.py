"""refit as a vLLM weight-transfer backend named `refit`.

Follows vLLM's weight-transfer interface (vllm/distributed/weight_transfer/
base.py: WeightTransferEngine, WeightTransferInitInfo,
WeightTransferUpdateInfo, TrainerWeightTransferEngine; factory.py:
WeightTransferEngineFactory and WeightTransferTrainerFactory) and the order
vLLM's GPU worker calls it in (vllm/v1/worker/gpu_worker.py: load_model
creates the engine with the loaded model; init_weight_transfer_engine ->
parse_init_info -> init_transfer_engine; then per update
start_weight_update, update_weights -> parse_update_info -> receive_weights,
finish_weight_update; shutdown). The backend registers itself from the
`vllm.general_plugins` entry point in pyproject.toml (vLLM's
vllm/plugins/__init__.py load_general_plugins runs it in every process).

Worker side (RefitWeightTransferEngine): at init_transfer_engine, after
vLLM's post-load processing, the worker attaches to its GPU's agent and
registers the model's runtime parameters once, under vLLM's names (float8
ones as uint8 views), so that every refit lands in place.
start_weight_update is refit's begin (of the version the trainers began),
receive_weights lands it, finish_weight_update commits it. vLLM's sleep
mode is refused by name: CuMemAllocator keeps the weights' addresses but
unmaps their memory while asleep, and the agent holds a mapping of that
memory; a refit arriving while the weights are asleep is refused by name.

Trainer side (RefitTrainerWeightTransferEngine): send_weights() refits the
next version from the trainer's own shards (refit.integrations.provide) on
every trainer rank, while the sender rank drives the engines through vLLM's
control plane (start_weight_update, update_weights({"version": V}),
finish_weight_update). The WeightSource is never iterated: refit does not
use the gathered Hugging Face tensors (see docs/integrations.md).
"""

import collections.abc
import dataclasses
import sys
import threading
import typing

from . import _core
from .. import agent as _agent

_INSTALL = "install vLLM (pip install vllm), which has vllm.distributed.weight_transfer"
_BASE = "vllm.distributed.weight_transfer.base"

WeightTransferEngine = _core.framework_base(_BASE, "WeightTransferEngine", "vLLM", _INSTALL)
TrainerWeightTransferEngine = _core.framework_base(_BASE, "TrainerWeightTransferEngine",
                                                   "vLLM", _INSTALL)
_InitBase = _core.framework_base(_BASE, "WeightTransferInitInfo", "vLLM", _INSTALL)
_UpdateBase = _core.framework_base(_BASE, "WeightTransferUpdateInfo", "vLLM", _INSTALL)
_TrainerInitBase = _core.framework_base(_BASE, "TrainerInitInfo", "vLLM", _INSTALL)
if getattr(_InitBase, "missing", False):
    _InitBase = _UpdateBase = _TrainerInitBase = object  # the info classes need no vLLM


@dataclasses.dataclass
class RefitInitInfo(_InitBase):
    """What a vLLM worker needs to attach: where the agents' sockets are
    (None: $REFIT_AGENT_DIR or /tmp/refit-agent-<uid>), this vLLM instance's
    engine index in the refit config (None: its data-parallel rank) and the
    seconds to wait for the trainers' version (None: no deadline)."""

    socket_dir: typing.Optional[str] = None
    engine: typing.Optional[int] = None
    next_timeout_s: typing.Optional[float] = None


@dataclasses.dataclass
class RefitUpdateInfo(_UpdateBase):
    """The version the trainers refit (every worker checks it against the
    version it began)."""

    version: int = 0


@dataclasses.dataclass
class RefitTrainerInitInfo(_TrainerInitBase):
    """Trainer side: this trainer's rank (keyword, as vLLM's TrainerInitInfo
    has it; rank 0 drives the engines), where the agents' sockets are, and
    the init info every worker gets."""

    socket_dir: typing.Optional[str] = None
    engine: typing.Optional[int] = None
    next_timeout_s: typing.Optional[float] = None
    if _TrainerInitBase is object:
        rank: int = dataclasses.field(default=0, kw_only=True) \
            if sys.version_info >= (3, 10) else 0


def _sleep_mode(vllm_config):
    model_config = getattr(vllm_config, "model_config", None)
    return bool(getattr(model_config, "enable_sleep_mode", False))


def _weights_asleep():
    """A sentence while vLLM's CuMemAllocator holds offloaded weights (a
    worker put to sleep), else None. Reads the allocator only where vLLM
    already imported it."""
    cumem = sys.modules.get("vllm.device_allocator.cumem")
    allocator = getattr(getattr(cumem, "CuMemAllocator", None), "instance", None)
    if allocator is None:
        return None
    asleep = [d for d in getattr(allocator, "pointer_to_data", {}).values()
              if getattr(d, "cpu_backup_tensor", None) is not None]
    if asleep:
        return ("the engine is asleep (vLLM's sleep(): %d allocations offloaded by "
                "CuMemAllocator); wake_up() it before refitting" % len(asleep))
    return None


# MLA under block FP8 (model-families.md 3.4): MLAAttention keeps W_UK_T and
# W_UV as views of scaled_dequantize(kv_b_proj), a BF16 buffer that is no
# parameter; refit rewrites it in place under this name.
_DEQUANT = ".kv_b_proj.weight_dequant"


def _mla_dequantized(model, attn_prefix):
    """The BF16 buffer behind an MLA layer's W_UK_T / W_UV (the root tensor
    of the view chain vLLM builds in process_weights_after_loading), or
    None where `attn_prefix` (model.layers.{l}.self_attn) has none."""
    try:
        attn = model.get_submodule(attn_prefix)
    except AttributeError:
        return None
    for module in attn.modules():
        w = getattr(module, "W_UK_T", None)
        base = getattr(w, "_base", None)
        if base is not None and base.is_contiguous():
            return base
    return None


def runtime_tensors(model):
    """A callable for provide(): given the agent's expected() list, the
    model's parameters and buffers under those (vLLM's) names; float8
    tensors as uint8 views (MXFP8 weights and E8M0 scales)."""
    import torch

    def pick(expected):
        held = dict(model.named_parameters())
        for name, t in model.named_buffers():
            held.setdefault(name, t)
        for name, _, _ in expected:
            if name.endswith(_DEQUANT) and name not in held:
                base = _mla_dequantized(model, name[:-len(_DEQUANT)])
                if base is not None:
                    held[name] = base
        missing = [n for n, _, _ in expected if n not in held]
        if missing:
            raise KeyError("refit vLLM backend: the model has no tensor named %s%s (refit "
                           "expects vLLM's runtime names after process_weights_after_loading)"
                           % (", ".join(missing[:4]), " and %d more" % (len(missing) - 4)
                              if len(missing) > 4 else ""))
        out = []
        for name, _, _ in expected:
            # The parameter itself where it can be, so that one whose storage
            # vLLM replaced later is refused by name at the next begin.
            t = held[name]
            if t.element_size() == 1 and t.dtype != torch.uint8:
                t = t.data.view(torch.uint8)
            out.append((name, t))
        return out

    return pick


class RefitWeightTransferEngine(WeightTransferEngine):
    """The worker side of vLLM's `refit` weight-transfer backend."""

    init_info_cls = RefitInitInfo
    update_info_cls = RefitUpdateInfo
    supports_draft_weight_update = False  # one registration: the target model's

    def __init__(self, config, vllm_config, device, model):
        super().__init__(config, vllm_config, device, model)
        if _sleep_mode(vllm_config):
            raise NotImplementedError(
                "refit vLLM backend: vLLM's sleep mode (enable_sleep_mode) is not supported: "
                "CuMemAllocator unmaps the weights' memory at sleep() and the refit agent "
                "holds a mapping of it; start vLLM without enable_sleep_mode")
        # The model as loaded (vLLM creates the engine after load_model, so
        # after process_weights_after_loading): refit registers its runtime
        # tensors when init_transfer_engine attaches. Other plugins in this
        # process (NeMo-RL's, verl's) use the same registration.
        _core.provide("generator", runtime_tensors(model), asleep=_weights_asleep)
        self._endpoint = None
        self.last_error = None

    def _rank(self, info):
        pc = self.parallel_config
        engine = info.engine if info.engine is not None else \
            int(getattr(pc, "data_parallel_rank", 0) or 0)
        return engine * int(pc.world_size) + int(pc.rank)

    def init_transfer_engine(self, init_info):
        opts = {"socket_dir": init_info.socket_dir, "next_timeout_s": init_info.next_timeout_s}
        self._endpoint = _core.endpoint("generator", self._rank(init_info), opts,
                                        "refit vLLM backend")

    def _live(self):
        if self._endpoint is None:
            raise RuntimeError("refit vLLM backend: init_weight_transfer_engine was not called")
        return self._endpoint

    def start_weight_update(self):
        self._live().engine_begin()

    def receive_weights(self, update_info):
        e = self._live()
        if e.version is None:
            raise RuntimeError("refit vLLM backend: receive_weights without a refit begun "
                               "(start_weight_update failed or was not called)")
        if update_info.version != e.version:
            e.abort()
            raise ValueError("refit vLLM backend: the trainer sent version %d, this worker "
                             "began version %d" % (update_info.version, e.version))
        e.engine_progress()

    def finish_weight_update(self):
        """Commit: the new version on every rank, or the last one kept
        everywhere. A failed vote is not raised here: vLLM's worker would stay
        in its update (gpu_worker.py clears _weight_update_active only after
        this returns) and refuse the next start_weight_update; the trainers'
        send_weights raises it (every rank has the same outcome), and this
        worker logs it and keeps it in last_error."""
        e = self._live()
        if e.version is None:
            raise RuntimeError("refit vLLM backend: finish_weight_update without the refit's "
                               "buckets landed (receive_weights failed or was not called)")
        version = e.version
        try:
            e.engine_commit()
            self.last_error = None
        except _agent.AgentError as err:
            self.last_error = err
            _core.log.warning("refit vLLM backend: generator rank %d: version %d was not "
                              "committed; the engine keeps version %d: %s", e.rank, version,
                              e.client.committed_version, err)

    def metrics(self):
        """The last committed refit's metrics on this worker."""
        return self._live().client.metrics()

    def shutdown(self):
        if self._endpoint is not None:
            self._endpoint.close()
            self._endpoint = None

    @staticmethod
    def trainer_send_weights(iterator, trainer_args):
        raise NotImplementedError(
            "refit vLLM backend: use the trainer engine (WeightTransferTrainerFactory."
            "trainer_init('refit', ...), then send_weights()): refit reads the trainer's own "
            "shards, not an iterator of gathered tensors")


class RefitTrainerWeightTransferEngine(TrainerWeightTransferEngine):
    """The trainer side of vLLM's `refit` backend, made by
    WeightTransferTrainerFactory.trainer_init('refit', config, init_info,
    client=..., source=...) on every trainer rank."""

    init_info_cls = RefitTrainerInitInfo
    config_cls = dict

    @classmethod
    def trainer_init(cls, config, init_info, *, client, source):
        self = cls(config, client=client, source=source, is_sender=init_info.rank == 0)
        # vLLM hands its WeightTransferConfig; refit's options may ride in a
        # mapping instead.
        opts = _core.options(config, "refit vLLM trainer engine") \
            if isinstance(config, collections.abc.Mapping) else {}
        if init_info.socket_dir is not None:
            opts["socket_dir"] = init_info.socket_dir
        self._endpoint = _core.endpoint("trainer", init_info.rank, opts,
                                        "refit vLLM trainer engine")
        if self.is_sender:
            client.init_weight_transfer_engine(
                {"socket_dir": init_info.socket_dir, "engine": init_info.engine,
                 "next_timeout_s": init_info.next_timeout_s})
        return self

    def send_weights(self):
        """One refit: every trainer rank refits its shards; the sender drives
        the engines' start/update/finish meanwhile (refit's begin waits for
        every rank). Raises the engines' error, else the trainer's."""
        e = self._endpoint
        version = e.tried + 1
        outcome = {}

        def refit():
            try:
                outcome["metrics"] = e.trainer_refit()
            except BaseException as err:  # joined below
                outcome["error"] = err

        t = threading.Thread(target=refit, name="refit-trainer", daemon=True)
        t.start()
        engines_error = None
        if self.is_sender:
            # Every step reaches every worker even after one failed: a worker
            # that began lands and votes (its peers' refits end, with one
            # outcome), one that refused answers the next calls by name.
            for call, args in ((self.client.start_weight_update, ()),
                               (self.client.update_weights, ({"version": version},)),
                               (self.client.finish_weight_update, ())):
                try:
                    call(*args)
                except Exception as err:
                    engines_error = engines_error or err
        t.join()
        if engines_error is not None:
            raise engines_error
        if "error" in outcome:
            raise outcome["error"]
        return outcome["metrics"]

    def shutdown(self):
        self._endpoint.close()


def register():
    """The `vllm.general_plugins` entry point: registers the `refit` backend
    with both of vLLM's factories (lazily: the engine module is imported
    when a worker asks for it)."""
    try:
        from vllm.distributed.weight_transfer.factory import (
            WeightTransferEngineFactory, WeightTransferTrainerFactory)
    except ImportError as e:
        raise ImportError("refit vLLM backend: vllm.distributed.weight_transfer.factory could "
                          "not be imported (%s); %s" % (e, _INSTALL)) from None
    for factory, cls in ((WeightTransferEngineFactory, "RefitWeightTransferEngine"),
                         (WeightTransferTrainerFactory, "RefitTrainerWeightTransferEngine")):
        if "refit" not in getattr(factory, "_registry", {}):
            factory.register_engine("refit", __name__, cls)
