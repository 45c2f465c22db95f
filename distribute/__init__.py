"""tf.distribute for PyTorch: strategies, cluster resolvers, input distribution.

    import distribute
    strategy = distribute.OneDeviceStrategy("cpu")
    config = est.RunConfig(train_distribute=strategy)
"""
from . import cluster_resolver
from .strategy import (InputContext, OneDeviceStrategy, ReduceOp, ReplicaContext, Strategy,
                       StrategyExtended, experimental_set_strategy, get_replica_context,
                       get_strategy, has_strategy, in_cross_replica_context)

__all__ = [
    "Strategy", "StrategyExtended", "OneDeviceStrategy", "ReduceOp", "InputContext",
    "ReplicaContext", "get_strategy", "has_strategy", "get_replica_context",
    "in_cross_replica_context", "experimental_set_strategy", "cluster_resolver",
]
