"""TF1's canned estimators (``tf.compat.v1.estimator.DNNClassifier`` and the
rest): the same arguments, defaults, variable names, evaluation and
prediction keys; see each module. Re-exported as ``est.DNNClassifier`` etc."""
from .baseline import BaselineClassifier, BaselineRegressor
from .dnn import DNNClassifier, DNNRegressor
from .dnn_linear_combined import DNNLinearCombinedClassifier, DNNLinearCombinedRegressor
from .linear import LinearClassifier, LinearRegressor
from .parsing_utils import classifier_parse_example_spec, regressor_parse_example_spec

__all__ = [
    "DNNClassifier", "DNNRegressor", "LinearClassifier", "LinearRegressor",
    "DNNLinearCombinedClassifier", "DNNLinearCombinedRegressor",
    "BaselineClassifier", "BaselineRegressor",
    "classifier_parse_example_spec", "regressor_parse_example_spec",
]
