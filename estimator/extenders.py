"""`add_metrics` and `forward_features` (TF: ``tf.estimator.add_metrics``,
``tf.estimator.forward_features``): a new Estimator over the same model_dir,
config and warm start whose model_fn is the given estimator's plus the
extra evaluation metrics, or plus features copied into the predictions."""
from __future__ import annotations

import inspect
from typing import Callable, Optional, Sequence

from hooks.mode_keys import ModeKeys

from . import export
from ._checks import is_host_feature
from .estimator import Estimator

_METRIC_FN_ARGS = ("labels", "predictions", "features", "config")


def _extended(estimator: Estimator, wrap: Callable) -> Estimator:
    if not isinstance(estimator, Estimator):
        raise TypeError(f"estimator must be an est.Estimator, got {type(estimator).__name__}")
    call = estimator._call_model_fn   # (the params bound: the estimator's own copy)

    def model_fn(features, labels, mode, params):
        return wrap(call(features, labels, mode), features, labels, mode)

    return Estimator(model_fn, model_dir=estimator.model_dir, config=estimator.config,
                     params=estimator.params,
                     warm_start_from=estimator._warm_start_settings)


def add_metrics(estimator: Estimator, metric_fn: Callable) -> Estimator:
    """An Estimator that evaluates `metric_fn`'s metrics besides the model's.

    `metric_fn` takes any of ``labels``, ``predictions``, ``features``,
    ``config`` (by name) and returns ``{name: metric}`` as `eval_metric_ops`
    takes them (an ``est.metrics.*`` result, a new Metric, a scalar tensor);
    its names replace the model's own of the same name."""
    if not callable(metric_fn):
        raise TypeError(f"metric_fn must be callable, got {type(metric_fn).__name__}")
    names = list(inspect.signature(metric_fn).parameters)
    unexpected = [n for n in names if n not in _METRIC_FN_ARGS]
    if unexpected:
        raise ValueError(f"metric_fn ({metric_fn}) has following not expected args: "
                         f"{unexpected}; it may take {list(_METRIC_FN_ARGS)}")

    def wrap(spec, features, labels, mode):
        if mode != ModeKeys.EVAL:
            return spec
        given = {"labels": labels, "predictions": spec.predictions, "features": features,
                 "config": estimator.config}
        new = metric_fn(**{n: given[n] for n in names})
        if not isinstance(new, dict):
            raise TypeError(f"metric_fn must return a dict {{name: metric}}, got "
                            f"{type(new).__name__}")
        return spec._replace(eval_metric_ops={**spec.eval_metric_ops, **new})

    return _extended(estimator, wrap)


def forward_features(estimator: Estimator, keys: Optional[Sequence[str]] = None,
                     sparse_default_values=None) -> Estimator:
    """An Estimator whose predictions also hold the features `keys` (all
    features when None), e.g. an example id to join results on. As TF's,
    a forwarded feature is added to the export's ``predict`` signature (and
    to ``serving_default`` where that is a PredictOutput) too: the server
    answers with each request's own values, strings included. Features
    given as lists of lists (sparse) cannot be forwarded;
    `sparse_default_values` is accepted for TF's signature."""
    del sparse_default_values
    if isinstance(keys, str):
        keys = [keys]
    if keys is not None and not all(isinstance(k, str) for k in keys):
        raise TypeError(f"keys should be either a string or a list of strings, got {keys!r}")

    def wrap(spec, features, labels, mode):
        if mode != ModeKeys.PREDICT:
            return spec
        predictions = spec.predictions
        if not isinstance(predictions, dict):
            raise ValueError("Predictions should be a dict to be able to forward features. "
                             f"Given: {type(predictions)}")
        forwarded = {}
        for key in (features if keys is None else keys):
            if key not in features:
                raise ValueError(f"Feature ({key}) is not in features dict; the features "
                                 f"are {sorted(features)}")
            if key in predictions:
                raise ValueError(f"Cannot forward feature key ({key}). Since it does exist "
                                 "in predictions.")
            value = features[key]
            if value.sparse if is_host_feature(value) else (
                    isinstance(value, list) and value and isinstance(value[0], (list, tuple))):
                raise ValueError(f"Feature ({key}) is sparse (a list of lists); only dense "
                                 "features can be forwarded")
            forwarded[key] = value
        outputs = spec.export_outputs
        if outputs:   # TF's: its `predict` and `serving_default` PredictOutputs
            outputs = {name: output._with_outputs(forwarded)
                       if name in ("predict", export.DEFAULT_SERVING_SIGNATURE_DEF_KEY)
                       and isinstance(output, export.PredictOutput) else output
                       for name, output in outputs.items()}
        return spec._replace(predictions={**predictions, **forwarded}, export_outputs=outputs)

    return _extended(estimator, wrap)
