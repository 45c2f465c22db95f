"""tf.distribute.experimental: `coordinator` (TF2's parameter-server training
with a ClusterCoordinator), and the strategies and options TF1 programs name
from here (`tf.distribute.experimental.MultiWorkerMirroredStrategy`, ...),
the same classes as `distribute.<Name>`."""
from .. import coordinator, partitioners
from ..central_storage_strategy import CentralStorageStrategy
from ..collective_all_reduce_strategy import MultiWorkerMirroredStrategy
from ..cross_device_ops import (CollectiveCommunication, CommunicationImplementation,
                                CommunicationOptions)
from ..parameter_server_strategy import ParameterServerStrategy
from ..strategy import ValueContext

__all__ = ["coordinator", "partitioners", "CentralStorageStrategy", "MultiWorkerMirroredStrategy",
           "ParameterServerStrategy", "CommunicationOptions", "CommunicationImplementation",
           "CollectiveCommunication", "ValueContext"]
