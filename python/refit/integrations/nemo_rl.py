"""refit in NeMo-RL: a CheckpointEngine loaded by class path, and a
WeightSynchronizer.

RefitCheckpointEngine follows nemo_rl/utils/checkpoint_engines/base.py
(CheckpointEngine: prepare, init_policy_process_group,
init_rollout_process_group, async send_weights, receive_weight_batches,
finalize; create_checkpoint_engine makes it from 'module:ClassName' with
bucket_size= and the config's engine_kwargs) as NeMo-RL's workers call it:
nemo_rl/models/policy/workers/checkpoint_engine.py
(PolicyCheckpointEngineMixin: checkpoint_engine_rpc, `await
send_weights(iterator)` under torch.no_grad) and
nemo_rl/models/generation/vllm/checkpoint_engine.py
(VllmCheckpointEngineMixin: init_rollout_process_group(rollout_rank=...),
`async for batch in receive_weight_batches()` then _load_weights(batch)).
Select it with

    policy.generation.refit_transport: "refit.integrations.nemo_rl:RefitCheckpointEngine"

send_weights refits the next version from the policy worker's own shards
(refit.integrations.provide) and never iterates NeMo-RL's generator of
gathered Hugging Face tensors; receive_weight_batches refits the engine's
runtime parameters in place (registered by refit's vLLM backend in the same
vLLM worker) and yields no batch, so NeMo-RL loads nothing. finalize()
keeps the process attached: NeMo-RL may finalize after every refit
(release_after_refit) and prepare again.

RefitWeightSynchronizer follows nemo_rl/weight_sync/interfaces.py
(WeightSynchronizer: sync_weights(*, timer=None, kv_scales=None), is_stale,
init_communicator, shutdown) and the mark_stale() the training loop calls
after a policy step (nemo_rl/algorithms/grpo.py); it drives the policy and
generation worker groups through the same checkpoint_engine_rpc calls as
nemo_rl/weight_sync/checkpoint_engine_weight_synchronizer.py.
"""

import contextlib
import time

from . import _core

_INSTALL = "install NeMo-RL (nemo_rl)"

CheckpointEngine = _core.framework_base("nemo_rl.utils.checkpoint_engines.base",
                                        "CheckpointEngine", "NeMo-RL", _INSTALL)
WeightSynchronizer = _core.framework_base("nemo_rl.weight_sync.interfaces",
                                          "WeightSynchronizer", "NeMo-RL", _INSTALL)

CLASS_PATH = "refit.integrations.nemo_rl:RefitCheckpointEngine"


class RefitCheckpointEngine(CheckpointEngine):
    """NeMo-RL's checkpoint engine over refit agents. `bucket_size` is
    NeMo-RL's (unused: refit's buckets are its config's refit.bucket_bytes);
    engine_kwargs: socket_dir, timeout_s, next_timeout_s, and NeMo-RL's
    release_after_refit."""

    shard_expert_weights = False

    def __init__(self, bucket_size=None, release_after_refit=False, socket_dir=None,
                 timeout_s=None, next_timeout_s=None):
        super().__init__()
        self._opts = _core.options({"socket_dir": socket_dir, "timeout_s": timeout_s,
                                    "next_timeout_s": next_timeout_s}, type(self).__name__)
        self._endpoint = None

    def prepare(self):
        """Nothing to allocate: refit's buffers live in the agents."""
        import os
        return {"backend": "refit", "pid": os.getpid()}

    def init_policy_process_group(self, *, worker_rank, train_world_size,
                                  rollout_world_size, metadata):
        self._endpoint = _core.endpoint("trainer", worker_rank, self._opts,
                                        "refit NeMo-RL checkpoint engine")

    def init_rollout_process_group(self, *, rollout_rank, train_world_size,
                                   rollout_world_size, metadata):
        self._endpoint = _core.endpoint("generator", rollout_rank, self._opts,
                                        "refit NeMo-RL checkpoint engine")

    def _live(self, side):
        if self._endpoint is None or self._endpoint.side != side:
            raise RuntimeError("refit NeMo-RL checkpoint engine: init_%s_process_group was "
                               "not called" % ("policy" if side == "trainer" else "rollout"))
        return self._endpoint

    async def send_weights(self, weights):
        """Refit the next version from this policy worker's shards. The
        generator of gathered tensors is closed unread."""
        self.last_metrics = await self._live("trainer").trainer_refit_async(weights)

    async def receive_weight_batches(self):
        """Refit this rollout worker's runtime parameters in place; no batch
        to load."""
        e = self._live("generator")
        self.last_metrics = await e.engine_refit_async()
        return
        yield  # an async generator that yields nothing

    def finalize(self):
        """Per-refit state only: the process stays attached."""
        if self._endpoint is not None:
            self._endpoint.abort()


class RefitWeightSynchronizer(WeightSynchronizer):
    """NeMo-RL's weight synchronizer over refit's checkpoint engine.
    `policy` and `generation` are NeMo-RL's (their worker_group runs the
    checkpoint_engine_rpc calls); `options` refit's engine_kwargs (a dict or
    mapping: socket_dir, timeout_s, next_timeout_s); `get` resolves the
    worker groups' futures (ray.get by default)."""

    def __init__(self, policy, generation, options=None, get=None):
        super().__init__()
        self._policy = policy
        self._generation = generation
        self._kwargs = _core.options(options, "refit NeMo-RL weight synchronizer")
        self._get = get
        self._stale = True
        self._ready = False
        self._version = 0

    def _resolve(self, refs):
        if self._get is None:
            try:
                import ray
            except ImportError:
                raise ImportError("refit NeMo-RL weight synchronizer: needs Ray (NeMo-RL's "
                                  "worker groups), or pass get=") from None
            self._get = ray.get
        return self._get(refs)

    def _run_policy(self, method, **kwargs):
        return self._policy.worker_group.run_all_workers_single_data(
            "checkpoint_engine_rpc", checkpoint_method=method, method_kwargs=kwargs)

    def _generation_rpc(self):
        async_engine = self._generation.cfg["vllm_cfg"].get("async_engine", False)
        return "checkpoint_engine_rpc_async" if async_engine else "checkpoint_engine_rpc"

    def _run_generation(self, method, args=()):
        return self._generation.worker_group.run_all_workers_single_data(
            self._generation_rpc(), checkpoint_method=method, method_args=args,
            run_rank_0_only_axes=["tensor_parallel", "pipeline_parallel"])

    @property
    def is_stale(self):
        return self._stale

    def mark_stale(self):
        """The policy stepped: the next sync_weights refits."""
        self._stale = True

    def init_communicator(self):
        if self._ready:
            return
        init = (CLASS_PATH, 0, self._kwargs)
        self._resolve(self._run_policy("init_checkpoint_engine", backend=CLASS_PATH,
                                       bucket_size_bytes=0, engine_kwargs=self._kwargs)
                      + self._run_generation("init_checkpoint_engine", init))
        policy = self._run_policy("prepare_checkpoint_engine")
        generation = self._run_generation("prepare_checkpoint_engine")
        metadata = self._resolve(policy + generation)
        train, rollout = len(policy), len(metadata) - len(policy)
        topology = {"metadata": metadata, "train_world_size": train,
                    "rollout_world_size": rollout}
        self._resolve(self._run_policy("init_checkpoint_engine_process_group", **topology)
                      + self._run_generation("init_checkpoint_engine_process_group",
                                             (0, train, rollout, metadata)))
        self._ready = True

    def sync_weights(self, *, timer=None, kv_scales=None):
        """Refit the policy's current weights into the generation workers.
        Returns refit's metrics (refit/version, refit/seconds). Raises
        RuntimeError when a worker reports a failed update; KV-cache scales
        are not carried (NotImplementedError)."""
        if kv_scales is not None:
            raise NotImplementedError(
                "refit NeMo-RL weight synchronizer: FP8 KV-cache scales (kv_scales) are not "
                "carried by refit; calibrate them on the engine")
        self._stale = True
        self.init_communicator()
        context = timer.time("prepare_for_generation/transfer_and_update_weights") \
            if timer is not None else contextlib.nullcontext()
        start = time.monotonic()
        self._version += 1  # every attempt: the trainers number versions so too
        with context:
            policy = self._run_policy("send_weights_via_checkpoint_engine", kv_scales=None)
            results = self._resolve(policy + self._run_generation(
                "update_weights_from_checkpoint_engine"))
        if not all(r for r in results[len(policy):] if r is not None):
            raise RuntimeError("refit NeMo-RL weight synchronizer: a generation worker "
                               "reported a failed update")
        self._stale = False
        return {"refit/version": self._version, "refit/seconds": time.monotonic() - start}

    def shutdown(self):
        if not self._ready:
            return
        self._resolve(self._run_policy("finalize_checkpoint_engine")
                      + self._run_generation("finalize_checkpoint_engine"))
        self._ready = False
