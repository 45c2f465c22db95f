"""tf.distribute for PyTorch: strategies, cluster resolvers, input distribution.

    import distribute
    strategy = distribute.OneDeviceStrategy("cpu")
    config = est.RunConfig(train_distribute=strategy)
"""
from . import cluster_resolver, cross_device_ops, input_lib
from .central_storage_strategy import CentralStorageStrategy
from .collective_all_reduce_strategy import (CollectiveAllReduceStrategy,
                                             MultiWorkerMirroredStrategy)
from .cross_device_ops import (CollectiveCommunication, CommunicationImplementation,
                               CommunicationOptions, CrossDeviceOps, HierarchicalCopyAllReduce,
                               NcclAllReduce, ReductionToOneDevice)
from ._process_group import ReplicaFailedError
from .input_options import InputOptions, InputReplicationMode, RunOptions
from .mirrored_strategy import MirroredStrategy
from . import partitioners
from . import coordinator, experimental
from ._ps_rpc import ParameterServerError
from .loss_scaling import compute_average_loss, scale_regularization_loss
from .parameter_server_strategy import ParameterServerStrategy
from .server import Server
from .strategy import (InputContext, OneDeviceStrategy, ReduceOp, ReplicaContext, Strategy,
                       StrategyExtended, experimental_set_strategy, get_loss_reduction,
                       get_replica_context, get_strategy, has_strategy, in_cross_replica_context)

__all__ = [
    "Strategy", "StrategyExtended", "OneDeviceStrategy", "ReduceOp", "InputContext",
    "ReplicaContext", "get_strategy", "has_strategy", "get_replica_context",
    "in_cross_replica_context", "experimental_set_strategy", "cluster_resolver",
    "get_loss_reduction", "MirroredStrategy", "MultiWorkerMirroredStrategy",
    "CollectiveAllReduceStrategy", "CentralStorageStrategy", "CrossDeviceOps", "NcclAllReduce",
    "HierarchicalCopyAllReduce", "ReductionToOneDevice", "CommunicationImplementation",
    "CollectiveCommunication", "CommunicationOptions", "ReplicaFailedError", "cross_device_ops",
    "input_lib", "ParameterServerStrategy", "Server", "ParameterServerError", "partitioners",
    "coordinator", "experimental", "compute_average_loss", "scale_regularization_loss",
    "InputOptions", "InputReplicationMode", "RunOptions",
]
