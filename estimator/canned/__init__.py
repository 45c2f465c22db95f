"""TF1's canned estimators (``tf.compat.v1.estimator.DNNClassifier`` and the
rest): the same arguments, defaults, variable names, evaluation and
prediction keys; see each module. Re-exported as ``est.DNNClassifier`` etc."""
from .boosted_trees import (BoostedTreesClassifier, BoostedTreesEstimator,
                            BoostedTreesRegressor)
from .baseline import BaselineClassifier, BaselineEstimator, BaselineRegressor
from .dnn import DNNClassifier, DNNEstimator, DNNRegressor
from .dnn_linear_combined import (DNNLinearCombinedClassifier, DNNLinearCombinedEstimator,
                                  DNNLinearCombinedRegressor)
from .kmeans import KMeansClustering
from .linear import LinearClassifier, LinearEstimator, LinearRegressor
from .heads import (BinaryClassHead, LogisticRegressionHead, MultiClassHead,
                    PoissonRegressionHead, RegressionHead)
from .multi_head import MultiHead
from .multi_label_head import MultiLabelHead
from .parsing_utils import classifier_parse_example_spec, regressor_parse_example_spec
from .rnn import RNNClassifier, RNNEstimator
from .sequential_head import SequentialHeadWrapper

__all__ = [
    "DNNClassifier", "DNNRegressor", "LinearClassifier", "LinearRegressor",
    "DNNLinearCombinedClassifier", "DNNLinearCombinedRegressor",
    "BaselineClassifier", "BaselineRegressor",
    "DNNEstimator", "LinearEstimator", "DNNLinearCombinedEstimator", "BaselineEstimator",
    "MultiLabelHead", "BinaryClassHead", "MultiClassHead", "RegressionHead",
    "PoissonRegressionHead", "LogisticRegressionHead", "MultiHead",
    "classifier_parse_example_spec", "regressor_parse_example_spec",
    "RNNClassifier", "RNNEstimator", "SequentialHeadWrapper",
    "BoostedTreesClassifier", "BoostedTreesRegressor", "BoostedTreesEstimator",
    "KMeansClustering",
]
