"""tf.distribute.experimental: `coordinator` (TF2's parameter-server training
with a ClusterCoordinator)."""
from .. import coordinator

__all__ = ["coordinator"]
