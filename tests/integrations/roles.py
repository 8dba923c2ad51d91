"""One framework process of the plugin tests (test_integrations.py starts
them), serving calls over a Unix socket the way Ray actors and vLLM's worker
processes are driven by their frameworks: one call at a time, async methods
run to completion.

    roles.py ROLE RANK CONFIG SOCKET_DIR RPC_ADDRESS

Each role restates, in a few lines, what its framework's own file does
around the plugin (named in each class), so that the plugin is called in
the framework's order with the framework's argument shapes:

- vllm_engine: vLLM's GPU worker (vllm/v1/worker/gpu_worker.py) holding a
  model whose tensors have vLLM's runtime names, with refit's backend
  loaded through the `vllm.general_plugins` entry point;
- vllm_trainer: a trainer that builds vLLM's trainer engine
  (WeightTransferTrainerFactory.trainer_init) over a VLLMWeightSyncClient;
- nemo_policy / nemo_generation: NeMo-RL's policy worker
  (PolicyCheckpointEngineMixin) and vLLM generation worker
  (VllmCheckpointEngineMixin);
- verl_trainer / verl_rollout: verl's actor worker (engine_workers.py
  update_weights) and CheckpointEngineWorker beside a vLLM worker.

Trainers hold Megatron-Core tensors (tests/caller/megatron_rules.py) and
write each version's values in place (the optimizer step); engines compare
every byte they hold with tests/reference/vllm_rules.py (check()).
"""

import asyncio
import os
import sys
import threading
import time
import traceback
import types
from multiprocessing.connection import Client, Listener

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.join(HERE, "standins"), os.path.join(ROOT, "python"),
                os.path.join(ROOT, "tests", "python")]

AUTHKEY = b"refit-integrations-test"
SEED = 4242


# -- calls between processes ------------------------------------------------------

def serve(obj, address):
    """Answer calls on `address` with obj's methods until one asks to exit."""
    listener = Listener(address, authkey=AUTHKEY)
    lock = threading.Lock()
    done = threading.Event()

    def answer(conn):
        with conn:
            while not done.is_set():
                try:
                    method, args, kwargs = conn.recv()
                except EOFError:
                    return
                if method == "exit":
                    conn.send(("ok", None))
                    done.set()
                    return
                with lock:
                    try:
                        out = getattr(obj, method)(*args, **kwargs)
                        if asyncio.iscoroutine(out):
                            out = asyncio.run(out)
                        reply = ("ok", out)
                    except BaseException as e:  # the caller raises it
                        reply = ("error", "%s.%s" % (type(e).__module__, type(e).__name__),
                                 "".join(traceback.format_exception(type(e), e,
                                                                    e.__traceback__)))
                conn.send(reply)

    def accept():
        while True:
            try:
                conn = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    print("serving %s" % address, flush=True)
    done.wait()
    listener.close()


class RemoteError(RuntimeError):
    """A call failed in another process: `kind` is the exception's class
    (module.Name), the message its traceback there."""

    def __init__(self, where, kind, text):
        self.kind = kind
        super().__init__("%s raised %s:\n%s" % (where, kind, text))


class Remote:
    """Calls into one role process; submit() returns a future (as a Ray
    actor's method.remote() does)."""

    def __init__(self, address, name, timeout=300, process=None):
        self.name = name
        deadline = time.time() + timeout
        while True:
            try:
                self.conn = Client(address, authkey=AUTHKEY)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.time() > deadline or (process is not None and
                                              process.poll() is not None):
                    raise RuntimeError("%s never served %s (exit status %s)"
                                       % (name, address, process and process.poll()))
                time.sleep(0.1)
        self.lock = threading.Lock()

    def call(self, method, *args, **kwargs):
        with self.lock:
            self.conn.send((method, args, kwargs))
            reply = self.conn.recv()
        if reply[0] == "ok":
            return reply[1]
        raise RemoteError(self.name, reply[1], reply[2])

    def submit(self, method, *args, **kwargs):
        box = {}

        def run():
            try:
                box["value"] = self.call(method, *args, **kwargs)
            except BaseException as e:
                box["error"] = e

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return types.SimpleNamespace(thread=t, box=box)


def gather(futures):
    """Every future's value (ray.get's shape): waits for all, then raises
    the first error."""
    for f in futures:
        f.thread.join()
    for f in futures:
        if "error" in f.box:
            raise f.box["error"]
    return [f.box["value"] for f in futures]


class Group:
    """A worker group of role processes: NeMo-RL's RayWorkerGroup calls as
    far as the plugins' drivers use them."""

    def __init__(self, remotes):
        self.remotes = remotes
        self.workers = remotes

    def run_all_workers_single_data(self, method, *args, run_rank_0_only_axes=None,
                                    **kwargs):
        return [r.submit(method, *args, **kwargs) for r in self.remotes]

    def call_all(self, method, *args, **kwargs):
        return gather([r.submit(method, *args, **kwargs) for r in self.remotes])


# -- the tensors ---------------------------------------------------------------

def job(config):
    import yaml
    with open(config) as f:
        return yaml.safe_load(f)


class TrainerTensors:
    """A trainer rank's Megatron-Core parameters (a torch module), given to
    refit with provide(); step(v) writes version v's values in place."""

    def __init__(self, cfg, rank):
        import numpy as np
        import refit.integrations
        from refit_testlib import NamedModel, from_bits, full_weights  # tests/caller on the path
        import megatron_rules
        self.cfg, self.rank = cfg, rank
        self.rng = np.random.default_rng([SEED, rank])
        tensors = megatron_rules.trainer_tensors(cfg, full_weights(cfg, SEED, 1), rank, self.rng)
        self.model = NamedModel({n: from_bits(a) for n, a in tensors.items()})
        # What a user adds to the trainer process (docs/integrations.md).
        refit.integrations.provide("trainer", self.model.named_parameters())
        self.hf_reads = 0

    def step(self, version):
        from refit_testlib import from_bits, full_weights
        import megatron_rules
        new = megatron_rules.trainer_tensors(self.cfg, full_weights(self.cfg, SEED, version),
                                             self.rank, self.rng)
        for n, p in self.model.named_parameters():
            p.data.copy_(from_bits(new[n]).reshape(p.shape))

    def hf_stream(self):
        """The gathered Hugging Face tensors a framework streams (what
        verl's get_per_tensor_param and NeMo-RL's export yield); counts what
        the plugin reads of it."""
        from refit_testlib import from_bits, full_weights
        for name, a in full_weights(self.cfg, SEED, 0).items():
            self.hf_reads += 1
            yield name, from_bits(a)

    def reads(self):
        return self.hf_reads


class VllmWorker:
    """vLLM's GPU worker (vllm/v1/worker/gpu_worker.py), its weight-transfer
    and sleep methods restated: load_model creates the engine with the
    loaded model; init/start/update/finish as the worker guards them."""

    def __init__(self, cfg, rank, sleep_mode=False):
        from vllm.plugins import load_general_plugins
        self.cfg, self.rank = cfg, rank
        tp = cfg["generator"].get("tp", 1)
        self.tp_rank = rank % tp
        ns = types.SimpleNamespace
        self.vllm_config = ns(
            parallel_config=ns(rank=self.tp_rank, world_size=tp, data_parallel_rank=rank // tp),
            model_config=ns(enable_sleep_mode=sleep_mode),
            weight_transfer_config=ns(backend="refit"))
        load_general_plugins()  # vLLM does it in every process: refit's entry point
        self.weight_transfer_engine = None
        self._weight_update_active = False

    def load_model(self):
        import torch
        from refit_testlib import NamedModel, full_weights, vllm_rules
        from vllm.device_allocator.cumem import AllocationData, CuMemAllocator
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
        # The runtime tensors after process_weights_after_loading: vLLM's
        # names, shapes and element types (float8 held as uint8 here).
        shapes = vllm_rules.runtime_tensors(self.cfg, full_weights(self.cfg, SEED, 0),
                                            self.tp_rank)
        self.model = NamedModel({
            n: torch.zeros(a.shape, dtype=torch.bfloat16 if a.dtype.itemsize == 2
                           else torch.uint8) for n, a in shapes.items()})
        allocator = CuMemAllocator.get_instance()
        for n, p in self.model.named_parameters():
            allocator.pointer_to_data[p.data_ptr()] = AllocationData(None, "weights")
        if self.vllm_config.weight_transfer_config is not None:
            self.weight_transfer_engine = WeightTransferEngineFactory.create_engine(
                self.vllm_config.weight_transfer_config, self.vllm_config,
                torch.device("cpu"), self.model)

    def init_weight_transfer_engine(self, init_info):
        e = self.weight_transfer_engine
        e.init_transfer_engine(e.parse_init_info(init_info))

    def start_weight_update(self):
        if self._weight_update_active:
            raise RuntimeError("start_weight_update called while a weight update is already "
                               "active. Call finish_weight_update first.")
        self.weight_transfer_engine.start_weight_update()
        self._weight_update_active = True

    def update_weights(self, update_info):
        if not self._weight_update_active:
            raise RuntimeError("start_weight_update must be called before update_weights.")
        try:
            self.weight_transfer_engine.update_weights(update_info)
        except BaseException:
            self._weight_update_active = False
            raise

    def finish_weight_update(self):
        if not self._weight_update_active:
            raise RuntimeError("finish_weight_update called without a matching "
                               "start_weight_update.")
        self.weight_transfer_engine.finish_weight_update()
        self._weight_update_active = False

    def sleep(self, level=1):
        from vllm.device_allocator.cumem import CuMemAllocator
        CuMemAllocator.get_instance().sleep(offload_tags=("weights",))

    def wake_up(self, tags=None):
        from vllm.device_allocator.cumem import CuMemAllocator
        CuMemAllocator.get_instance().wake_up(tags)

    def shutdown(self):
        if self.weight_transfer_engine is not None:
            self.weight_transfer_engine.shutdown()

    def check(self, version):
        """Every byte against vLLM's rules for `version`, and the version
        the agent committed."""
        from refit.integrations import _core
        from refit_testlib import compare, full_weights, vllm_rules
        committed = _core._endpoints["generator"].client.committed_version
        assert committed == version, "engine %d committed %d, expected %d" % (
            self.rank, committed, version)
        want = vllm_rules.runtime_tensors(self.cfg, full_weights(self.cfg, SEED, version),
                                          self.tp_rank)
        held = dict(self.model.named_parameters())
        assert sorted(want) == sorted(held)
        for n, w in want.items():
            compare(held[n], w, "engine %d version %d %s" % (self.rank, version, n))
        return len(want)

    def metrics(self):
        from refit.integrations import _core
        return _core._endpoints["generator"].client.metrics()


# -- vLLM ------------------------------------------------------------------------

class EngineClient:
    """A VLLMWeightSyncClient (vllm/distributed/weight_transfer/base.py):
    each call reaches every worker of the vLLM instance, as collective_rpc
    does, and raises the first failure after all answered."""

    def __init__(self, addresses):
        self.workers = [Remote(a, "vllm worker %d" % i) for i, a in enumerate(addresses)]

    def _all(self, method, *args):
        return gather([w.submit(method, *args) for w in self.workers])

    def init_weight_transfer_engine(self, init_info):
        self._all("init_weight_transfer_engine", init_info)

    def start_weight_update(self):
        self._all("start_weight_update")

    def update_weights(self, update_info):
        self._all("update_weights", update_info)

    def finish_weight_update(self):
        self._all("finish_weight_update")


class VllmTrainer(TrainerTensors):
    """A trainer rank using vLLM's trainer-side engine: trainer_init on
    every rank (rank 0 the sender), then send_weights() per update."""

    def init(self, socket_dir, engine_addresses):
        from vllm.distributed.weight_transfer.base import ModuleSource
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.plugins import load_general_plugins
        from refit.integrations.vllm import RefitTrainerInitInfo
        load_general_plugins()
        self.source = ModuleSource(self.model)
        client = EngineClient(engine_addresses) if self.rank == 0 else None
        self.engine = WeightTransferTrainerFactory.trainer_init(
            "refit", types.SimpleNamespace(backend="refit"),
            RefitTrainerInitInfo(rank=self.rank, socket_dir=socket_dir),
            client=client, source=self.source)

    def send_weights(self):
        return self.engine.send_weights()

    def reads(self):
        return self.source.iterated


# -- NeMo-RL -----------------------------------------------------------------------

class NemoPolicy(TrainerTensors):
    """NeMo-RL's policy worker (nemo_rl/models/policy/workers/
    checkpoint_engine.py PolicyCheckpointEngineMixin.checkpoint_engine_rpc)."""

    checkpoint_engine = None

    async def checkpoint_engine_rpc(self, checkpoint_method, method_kwargs=None):
        import torch
        kwargs = method_kwargs or {}
        if checkpoint_method == "init_checkpoint_engine":
            if self.checkpoint_engine is None:
                from nemo_rl.utils.checkpoint_engines.base import create_checkpoint_engine
                self.checkpoint_engine = create_checkpoint_engine(
                    kwargs["backend"], bucket_size_bytes=kwargs["bucket_size_bytes"],
                    engine_kwargs=kwargs["engine_kwargs"])
            return None
        if checkpoint_method == "prepare_checkpoint_engine":
            metadata = self.checkpoint_engine.prepare()
            return {**metadata, "rank": self.rank} if isinstance(metadata, dict) else metadata
        if checkpoint_method == "init_checkpoint_engine_process_group":
            return self.checkpoint_engine.init_policy_process_group(worker_rank=self.rank,
                                                                    **kwargs)
        if checkpoint_method == "send_weights_via_checkpoint_engine":
            with torch.no_grad():
                await self.checkpoint_engine.send_weights(self.hf_stream())
            return None
        if checkpoint_method == "finalize_checkpoint_engine":
            if self.checkpoint_engine is not None:
                self.checkpoint_engine.finalize()
            return None
        return getattr(self.checkpoint_engine, checkpoint_method)(**kwargs)


class NemoGeneration(VllmWorker):
    """NeMo-RL's vLLM worker (nemo_rl/models/generation/vllm/
    checkpoint_engine.py VllmCheckpointEngineMixin, reached through
    VllmCheckpointEngineRpcMixin.checkpoint_engine_rpc's collective_rpc)."""

    checkpoint_engine = None
    loaded = 0

    def checkpoint_engine_rpc(self, checkpoint_method, method_args=()):
        return [getattr(self, checkpoint_method)(*method_args)]

    def init_checkpoint_engine(self, backend, bucket_size_bytes, engine_kwargs):
        if self.checkpoint_engine is not None:
            return
        from nemo_rl.utils.checkpoint_engines.base import create_checkpoint_engine
        self.checkpoint_engine = create_checkpoint_engine(
            backend, bucket_size_bytes=bucket_size_bytes, engine_kwargs=engine_kwargs)

    def prepare_checkpoint_engine(self):
        metadata = self.checkpoint_engine.prepare()
        return {**metadata, "rank": self.rank} if isinstance(metadata, dict) else metadata

    def init_checkpoint_engine_process_group(self, rank_prefix, train_world_size,
                                             rollout_world_size, metadata):
        # resolve_rollout_rank: this worker's rank among all rollout workers.
        self.checkpoint_engine.init_rollout_process_group(
            rollout_rank=rank_prefix + self.rank, train_world_size=train_world_size,
            rollout_world_size=rollout_world_size, metadata=metadata)

    def finalize_checkpoint_engine(self):
        if self.checkpoint_engine is not None:
            self.checkpoint_engine.finalize()

    async def _update_weights_from_checkpoint_engine_async(self):
        async for weight_batch in self.checkpoint_engine.receive_weight_batches():
            self.loaded += len(weight_batch)  # NeMo-RL: self._load_weights(weight_batch)
        return True

    def update_weights_from_checkpoint_engine(self):
        return asyncio.run(self._update_weights_from_checkpoint_engine_async())


# -- verl ---------------------------------------------------------------------------

ENGINE_KWARGS = {}  # set from the command line: the config's engine_kwargs["refit"]
BUCKET_MB = 256     # verl's update_weights_bucket_megabytes


class VerlTrainer(TrainerTensors):
    """verl's actor worker (verl/workers/engine_workers.py): the engine made
    with is_master and bucket_size; update_weights awaits send_weights with
    the engine's per-tensor generator; execute_checkpoint_engine dispatches
    the manager's calls."""

    def __init__(self, cfg, rank):
        super().__init__(cfg, rank)
        from verl.checkpoint_engine.base import CheckpointEngineRegistry
        self.checkpoint_engine = CheckpointEngineRegistry.new(
            "refit", is_master=rank == 0, bucket_size=BUCKET_MB << 20, **ENGINE_KWARGS)

    async def update_weights(self):
        await self.checkpoint_engine.send_weights(self.hf_stream())

    def execute_checkpoint_engine(self, method, *args, **kwargs):
        return getattr(self.checkpoint_engine, method)(*args, **kwargs)


class VerlRollout(VllmWorker):
    """verl's CheckpointEngineWorker (verl/checkpoint_engine/base.py) beside
    a vLLM worker: receive_weights() goes to the server adapter, which
    iterates it with `async for` and loads what comes."""

    def __init__(self, cfg, rank):
        super().__init__(cfg, rank)
        from verl.checkpoint_engine.base import CheckpointEngineRegistry
        self.checkpoint_engine = CheckpointEngineRegistry.new(
            "refit", bucket_size=BUCKET_MB << 20, **ENGINE_KWARGS)
        self.loaded = 0

    async def _adapter_update_weights(self, weights):
        async for name, weight in weights:  # vllm_rollout.py update_weights
            self.loaded += 1

    async def update_weights(self):
        weights = self.checkpoint_engine.receive_weights()
        await self._adapter_update_weights(weights)

    def execute_checkpoint_engine(self, method, *args, **kwargs):
        return getattr(self.checkpoint_engine, method)(*args, **kwargs)


ROLES = {"vllm_engine": VllmWorker, "vllm_trainer": VllmTrainer, "nemo_policy": NemoPolicy,
         "nemo_generation": NemoGeneration, "verl_trainer": VerlTrainer,
         "verl_rollout": VerlRollout}


def main():
    import faulthandler
    import json
    import signal
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where a hung role waits
    import logging
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    role, rank, config, address = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    ENGINE_KWARGS.update(json.loads(os.environ.get("REFIT_TEST_ENGINE_KWARGS", "{}")))
    obj = ROLES[role](job(config), rank)
    assert "mpi4py" not in sys.modules and "refit._lib" not in sys.modules
    serve(obj, address)


if __name__ == "__main__":
    main()
