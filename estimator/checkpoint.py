"""`est.checkpoint`: the checkpoints of a model_dir (TF: `tf.train.latest_checkpoint`,
`tf.train.list_variables`, `tf.train.load_variable`, `tf.train.Saver`).

The files are written and read by the session layer (`hooks.checkpoint`, the
one module that touches them); this is their public face for users.
"""
from hooks.checkpoint import (DIGEST_SUFFIX, INDEX, PREFIX, DataLossError, NotFiniteError, Saver,
                              all_checkpoints, checkpoints_on_disk, digest, flat_variables,
                              latest_checkpoint, list_variables, load, load_variable,
                              missing_slots, optimizer_kind, pin, resolve, restore_latest,
                              restore_rng, rng_preserved, rng_state, step_of, unpin,
                              UnsafeCheckpointError)

from .tf_layouts import lstm_from_tf

__all__ = ["DIGEST_SUFFIX", "INDEX", "PREFIX", "DataLossError", "NotFiniteError", "Saver",
           "all_checkpoints", "checkpoints_on_disk", "digest", "flat_variables",
           "latest_checkpoint", "list_variables", "load", "load_variable", "lstm_from_tf",
           "missing_slots", "optimizer_kind", "pin", "resolve", "restore_latest", "restore_rng",
           "rng_preserved", "rng_state", "step_of", "unpin", "UnsafeCheckpointError"]
