"""refit where RL stacks plug in weight sync (docs/integrations.md).

- refit.integrations.vllm: vLLM's weight-transfer backend `refit`
  (registered from the `vllm.general_plugins` entry point);
- refit.integrations.nemo_rl: NeMo-RL's checkpoint engine
  ("refit.integrations.nemo_rl:RefitCheckpointEngine") and a
  WeightSynchronizer;
- refit.integrations.verl: verl's checkpoint engine `refit`.

Each imports without its framework and fails with a sentence naming it where
the framework is needed. All are built on refit.attach (pure Python, no MPI).
A trainer process names the tensors refit reads with provide().
"""

from ._core import detach_all, provide

__all__ = ["provide", "detach_all"]
