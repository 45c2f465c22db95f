"""`tf.estimator.experimental`'s names: the in-memory evaluator, the
early-stopping hooks (which live in `hooks`), TF2's RNN estimators (also
``est.RNNClassifier``), TF's k-means (``est.KMeansClustering``) and the
linear estimators' SDCA optimizer (`LinearSDCA`)."""
from hooks.early_stopping import (make_early_stopping_hook, stop_if_higher_hook,
                                  stop_if_lower_hook, stop_if_no_decrease_hook,
                                  stop_if_no_increase_hook)

from .canned.kmeans import KMeansClustering as KMeans
from .canned.linear_sdca import LinearSDCA
from .canned.rnn import RNNClassifier, RNNEstimator
from .in_memory_evaluator import InMemoryEvaluatorHook

__all__ = ["InMemoryEvaluatorHook", "make_early_stopping_hook", "stop_if_higher_hook",
           "stop_if_lower_hook", "stop_if_no_decrease_hook", "stop_if_no_increase_hook",
           "RNNClassifier", "RNNEstimator", "KMeans", "LinearSDCA"]
