"""TensorFlow-1-Estimator-shaped training on PyTorch.

    import estimator as est
    estimator = est.Estimator(model_fn, model_dir="runs/x", config=est.RunConfig())
    estimator.train(input_fn, max_steps=1000)

See the README and docs/ for the contract; names follow `tf.estimator`.
"""
from . import checkpoint, export, feature_column, metrics, optimizers, summary
from hooks.model_scope import (get_global_step, get_grad_scaler, get_module, get_optimizer,
                               is_training, named_tensor)
from .estimator import Estimator
from . import (data, experimental, inputs, io, layers, learning_rate_decay, losses,
               moving_averages, nn, serving)
from .canned import (BaselineClassifier, BaselineEstimator, BaselineRegressor,
                     BoostedTreesClassifier, BoostedTreesEstimator, BoostedTreesRegressor,
                     KMeansClustering, BinaryClassHead, DNNClassifier, DNNEstimator,
                     DNNLinearCombinedClassifier, DNNLinearCombinedEstimator,
                     DNNLinearCombinedRegressor, DNNRegressor,
                     LinearClassifier, LinearEstimator, LinearRegressor, LogisticRegressionHead,
                     MultiClassHead, MultiHead, MultiLabelHead, PoissonRegressionHead,
                     RegressionHead, RNNClassifier, RNNEstimator, SequentialHeadWrapper,
                     classifier_parse_example_spec, regressor_parse_example_spec)
from .extenders import add_metrics, forward_features
from .exporter import BestExporter, Exporter, FinalExporter, LatestExporter
from hooks.mode_keys import ModeKeys
# tf.estimator's names of the session hooks (TF: the tf.train classes themselves)
from hooks import (CheckpointSaverHook, CheckpointSaverListener, FeedFnHook, FinalOpsHook,
                   GlobalStepWaiterHook, LoggingTensorHook, NanLossDuringTrainingError,
                   NanTensorHook, ProfilerHook, SecondOrStepTimer, SessionRunArgs,
                   SessionRunContext, SessionRunHook, SessionRunValues, StepCounterHook,
                   StopAtStepHook, SummarySaverHook)
from .model_fn import EstimatorSpec
from .run_config import DistributeConfig, RunConfig
from .training import EvalSpec, TrainSpec, train_and_evaluate
from .warm_start import VocabInfo, WarmStartSettings

__all__ = [
    "Estimator", "EstimatorSpec", "ModeKeys", "RunConfig", "DistributeConfig", "WarmStartSettings",
    "VocabInfo",
    "get_module", "get_optimizer", "get_grad_scaler", "get_global_step", "is_training",
    "named_tensor",
    "checkpoint", "feature_column", "metrics", "optimizers", "summary",
    "TrainSpec", "EvalSpec", "train_and_evaluate", "export",
    "Exporter", "LatestExporter", "BestExporter", "FinalExporter",
    "DNNClassifier", "DNNRegressor", "RNNClassifier", "RNNEstimator", "LinearClassifier",
    "LinearRegressor",
    "DNNLinearCombinedClassifier", "DNNLinearCombinedRegressor",
    "BaselineClassifier", "BaselineRegressor", "classifier_parse_example_spec",
    "DNNEstimator", "LinearEstimator", "DNNLinearCombinedEstimator", "BaselineEstimator",
    "MultiLabelHead", "BinaryClassHead", "MultiClassHead", "RegressionHead",
    "PoissonRegressionHead", "LogisticRegressionHead", "MultiHead", "SequentialHeadWrapper",
    "BoostedTreesClassifier", "BoostedTreesEstimator", "BoostedTreesRegressor",
    "KMeansClustering",
    "regressor_parse_example_spec", "add_metrics", "forward_features", "losses",
    "data", "experimental", "inputs", "io", "layers", "learning_rate_decay", "moving_averages",
    "serving",
    "CheckpointSaverHook", "CheckpointSaverListener", "FeedFnHook", "FinalOpsHook",
    "GlobalStepWaiterHook", "LoggingTensorHook", "NanLossDuringTrainingError", "NanTensorHook",
    "ProfilerHook", "SecondOrStepTimer", "SessionRunArgs", "SessionRunContext", "SessionRunHook",
    "SessionRunValues", "StepCounterHook", "StopAtStepHook", "SummarySaverHook",
]
