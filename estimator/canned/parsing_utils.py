"""Parsing specs for the canned estimators' tf.Examples: the columns' spec
plus the label and the weight (TF1: ``tf.compat.v1.estimator.
classifier_parse_example_spec`` / ``regressor_parse_example_spec``).

    spec = est.classifier_parse_example_spec(columns, label_key="label",
                                             weight_column="w")
    features = est.io.parse_example(serialized, spec)
    labels = features.pop("label")
"""
from __future__ import annotations

import torch

from ..feature_column import NumericColumn, make_parse_example_spec, numeric_column
from ..io import FixedLenFeature


def classifier_parse_example_spec(feature_columns, label_key: str, label_dtype=torch.int64,
                                  label_default=None, weight_column=None) -> dict:
    """The columns' spec, the label as `FixedLenFeature((1,), label_dtype,
    label_default)` (`str` for string labels with a `label_vocabulary`) and
    the weight column's spec."""
    return _with_label_and_weight(make_parse_example_spec(feature_columns), label_key,
                                  FixedLenFeature((1,), label_dtype, label_default),
                                  weight_column)


def regressor_parse_example_spec(feature_columns, label_key: str, label_dtype=torch.float32,
                                 label_default=None, label_dimension: int = 1,
                                 weight_column=None) -> dict:
    """The columns' spec, the label as `FixedLenFeature((label_dimension,),
    label_dtype, label_default)` and the weight column's spec."""
    return _with_label_and_weight(make_parse_example_spec(feature_columns), label_key,
                                  FixedLenFeature((label_dimension,), label_dtype, label_default),
                                  weight_column)


def _with_label_and_weight(spec: dict, label_key: str, label_spec, weight_column) -> dict:
    if label_key in spec:
        raise ValueError(f"label should not be used as feature. label_key: {label_key}, "
                         f"features: {sorted(spec)}")
    spec[label_key] = label_spec
    if weight_column is None:
        return spec
    if isinstance(weight_column, str):
        weight_column = numeric_column(weight_column)
    if not isinstance(weight_column, NumericColumn):
        raise ValueError("weight_column should be an instance of feature_column.numeric_column"
                         f" or a str. Given type: {type(weight_column).__name__} value: "
                         f"{weight_column!r}")
    if weight_column.key in spec:
        raise ValueError(f"weight_column should not be used as feature. weight_column: "
                         f"{weight_column.key}, features: {sorted(spec)}")
    spec.update(weight_column._parse_example_spec)
    return spec
