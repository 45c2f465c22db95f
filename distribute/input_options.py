"""Options of the Strategy API's input and run calls (tf.distribute.InputOptions,
InputReplicationMode, RunOptions), checked where a strategy takes them."""
from __future__ import annotations

import enum


class InputReplicationMode(enum.Enum):
    """How `distribute_datasets_from_function` calls its function
    (tf.distribute.InputReplicationMode). Here every replica is a process that
    calls it once with its own InputContext, which is both: PER_WORKER with
    one replica a worker, PER_REPLICA."""

    PER_WORKER = "PER_WORKER"
    PER_REPLICA = "PER_REPLICA"


class InputOptions:
    """tf.distribute.InputOptions, same arguments. `experimental_fetch_to_device`
    False keeps the batches where the dataset made them (default: moved to
    the replica's device); the placement and buffer options are TPU and
    tf.data details, accepted and unused (a DataLoader's own prefetching
    applies)."""

    def __init__(self, experimental_fetch_to_device=None,
                 experimental_replication_mode=InputReplicationMode.PER_WORKER,
                 experimental_place_dataset_on_device=False,
                 experimental_per_replica_buffer_size=1):
        if not isinstance(experimental_replication_mode, InputReplicationMode):
            raise ValueError(f"InputOptions: experimental_replication_mode must be an "
                             f"InputReplicationMode, got {experimental_replication_mode!r}")
        self.experimental_fetch_to_device = experimental_fetch_to_device
        self.experimental_replication_mode = experimental_replication_mode
        self.experimental_place_dataset_on_device = experimental_place_dataset_on_device
        self.experimental_per_replica_buffer_size = experimental_per_replica_buffer_size

    def __repr__(self):
        return (f"InputOptions(experimental_fetch_to_device="
                f"{self.experimental_fetch_to_device!r}, experimental_replication_mode="
                f"{self.experimental_replication_mode})")


class RunOptions:
    """tf.distribute.RunOptions, same arguments: TPU and XLA settings,
    accepted by `strategy.run` and unused."""

    def __init__(self, experimental_enable_dynamic_batch_size=True,
                 experimental_bucketizing_dynamic_shape=False, experimental_xla_options=None):
        self.experimental_enable_dynamic_batch_size = experimental_enable_dynamic_batch_size
        self.experimental_bucketizing_dynamic_shape = experimental_bucketizing_dynamic_shape
        self.experimental_xla_options = experimental_xla_options


def fetch_to_device(options, what: str, per_replica_allowed: bool = True) -> bool:
    """Whether the batches go to the replica's device under `options` (an
    InputOptions or None), checked for `what` (the method taking them)."""
    if options is None:
        return True
    if not isinstance(options, InputOptions):
        raise ValueError(f"{what}: options must be a distribute.InputOptions, got "
                         f"{type(options).__name__}")
    if (not per_replica_allowed
            and options.experimental_replication_mode == InputReplicationMode.PER_REPLICA):
        raise ValueError(f"{what}: InputReplicationMode.PER_REPLICA is only supported by "
                         f"distribute_datasets_from_function")
    return options.experimental_fetch_to_device is not False
