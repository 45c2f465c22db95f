"""tf.compat.v1.train.Scaffold has no counterpart here (no graph, no
tf.Session to initialize or wait for): the APIs that take one accept it
empty and refuse one whose parts they would otherwise ignore, naming what
takes each part's place (an `init_fn` not run trains from scratch unsaid)."""
from __future__ import annotations

# Scaffold's parts, and what takes their place here
_PARTS = {
    "init_fn": "load pretrained values in get_module's factory, or warm_start_from",
    "init_op": "initialize in get_module's factory",
    "init_feed_dict": "initialize in get_module's factory",
    "ready_op": "nothing to wait for: the model is ready when get_module returns",
    "ready_for_local_init_op": "nothing to wait for",
    "local_init_op": "initialize in get_module's factory",
    "saver": "the checkpoints kept: RunConfig(keep_checkpoint_max=..., "
             "keep_checkpoint_every_n_hours=...), MonitoredTrainingSession(keep_checkpoint_max"
             "=...), CheckpointSaverHook(saver=checkpoint.Saver(dir, max_to_keep=...)); "
             "a Saver(ema.variables_to_restore()) evaluating on moving averages: "
             "est.moving_averages.ExponentialMovingAverage(...).copy_to() in the model_fn",
    "summary_op": "est.summary.* calls write the summaries; SummarySaverHook(summary_op=[tags]) "
                  "picks some",
}


def check_scaffold(scaffold, where: str) -> None:
    """Raise ValueError, naming `where` (the API given it), if `scaffold`
    has any part set."""
    if scaffold is None:
        return
    used = [name for name in _PARTS if getattr(scaffold, name, None) is not None]
    if used:
        raise ValueError(
            f"{where}: scaffold's " + ", ".join(used) + " cannot run here (there is no graph "
            "or tf.Session); instead: " + "; ".join(f"{name}: {_PARTS[name]}" for name in used)
            + ". Leave scaffold out")
