"""What the canned estimators share: an `Estimator` whose model_fn is logits
from the model plus a head (TF1: each canned ``_*_model_fn`` handing its logits
to ``head.create_estimator_spec``), the optimizer argument, and the modules
of a variable scope for the combined model's two optimizers."""
from __future__ import annotations

from typing import List

import torch

from hooks import model_scope

from .. import feature_column
from ..estimator import Estimator
from ..optimizers import optimizer_factory
from ._head import Head
from .linear_sdca import LinearSDCA


class CannedEstimator(Estimator):
    """An Estimator with a built-in model_fn: `_logits(features, mode)` then the
    head. `_logits` gets a `feature_column.FeatureTransformationCache` of the
    features, so that the model's parts transform each column once."""

    def __init__(self, head, model_dir=None, config=None, warm_start_from=None):
        self._head = check_head(head)
        super().__init__(self._canned_model_fn, model_dir=model_dir, config=config,
                         warm_start_from=warm_start_from)

    def _canned_model_fn(self, features, labels, mode):
        cache = features_cache(features)
        logits = self._logits(cache, mode)
        return self._head.create_estimator_spec(cache, mode, logits, labels,
                                                train_op_fn=self._train_op_fn)

    def _logits(self, features, mode) -> torch.Tensor:
        raise NotImplementedError

    def _train_op_fn(self, loss: torch.Tensor):
        raise NotImplementedError


def check_head(head) -> Head:
    """`head`, refused unless it is a head of this library."""
    if not isinstance(head, Head):
        raise TypeError(f"head must be a head of this library (est.MultiLabelHead(...)), "
                        f"got {type(head).__name__}")
    return head


def features_cache(features) -> "feature_column.FeatureTransformationCache":
    """The columns' transformation cache of a canned model_fn's features (a
    dict, as TF requires)."""
    if not isinstance(features, dict):
        raise ValueError("features should be a dictionary of `Tensor`s. Given type: "
                         f"{type(features)}")
    return feature_column.transformation_cache(features)


def make_optimizer(spec, learning_rate: float, name: str = "optimizer", var_list=None):
    """The scope's optimizer `name` from a canned `optimizer=` argument (a TF1 name
    with `learning_rate`, or a factory `lambda params: torch.optim...`) over
    `var_list` (or what the callable `var_list()` gives, asked on creation)."""
    built = model_scope.current().built_optimizer(name)   # (every step after the first)
    if built is not None:
        return built
    return model_scope.get_optimizer(optimizer_factory(spec, learning_rate), name=name,
                                     var_list=var_list() if callable(var_list) else var_list)


def modules_under(prefix: str) -> List[torch.nn.Module]:
    """The modules of the active scope in variable scope `prefix` (TF: the
    TRAINABLE_VARIABLES collection filtered by scope)."""
    return [m for name, m in model_scope.current().modules.items()
            if name == prefix or name.startswith(prefix + "/")]


def check_optimizer_spec(spec) -> None:
    """Fail at construction, not at the first step, on a bad `optimizer=`."""
    if isinstance(spec, LinearSDCA):
        raise ValueError("LinearSDCA trains LinearClassifier, LinearRegressor and "
                         "LinearEstimator only (TF fails at train: The given object is not an "
                         "Optimizer instance): give this estimator an optimizer name or factory")
    optimizer_factory(spec, 0.1)   # raises naming the value


def column_tuple(columns, what: str) -> tuple:
    """`columns` (None, a column or an iterable of them) as a tuple, checked."""
    if columns is None:
        return ()
    if isinstance(columns, feature_column.FeatureColumn):
        columns = [columns]
    columns = tuple(columns)
    for column in columns:
        if not isinstance(column, feature_column.FeatureColumn):
            raise ValueError(f"{what}: items must be feature columns "
                             f"(est.feature_column.*), got {column!r}")
    return columns


def batch_size(features) -> int:
    """The batch size of a features dict: the first dimension of its first value
    (TF's baseline takes it from the weight column or the features)."""
    for key in sorted(features):
        value = features[key]
        if isinstance(value, torch.Tensor) and value.dim():
            return value.shape[0]
        if hasattr(value, "__len__") and not isinstance(value, (str, bytes)):
            return len(value)
    raise ValueError("features holds no value with a batch dimension to take the batch "
                     f"size from (keys {sorted(features)})")

