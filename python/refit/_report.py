"""One log record and one metrics dict per committed refit, for the agent
client and the in-process Session alike.

The record goes to the `refit` logger at INFO (configure it as any other:
logging.getLogger("refit")). The metrics dict is flat, with slash-separated
keys, as trainers' loggers (wandb, TensorBoard, MLflow) take them.
"""

import logging

log = logging.getLogger("refit")


def committed(side, rank, version, nbytes, times):
    """Log the refit of `version` that this rank (`side`, `rank`) committed,
    moving `nbytes` (what it holds: the bytes it sent or landed), with the
    refit_times_t dict `times` (seconds). Returns the metrics dict."""
    seconds = float(times.get("total", 0.0)) if times else 0.0
    gbps = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    metrics = {"refit/version": int(version), "refit/bytes": int(nbytes),
               "refit/seconds": seconds, "refit/gbps": gbps}
    for phase, s in (times or {}).items():
        if phase != "total" and isinstance(s, (int, float)):
            metrics["refit/%s_s" % phase] = float(s)
    log.info("refit: %s rank %d committed version %d: %d bytes in %.3f s (%.2f GB/s)",
             side, rank, version, nbytes, seconds, gbps)
    return metrics
