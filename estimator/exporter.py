"""Exporters: what `train_and_evaluate` does with a model after evaluating it
(tf.estimator.Exporter, LatestExporter, BestExporter, FinalExporter).

Each exporter writes under `model_dir/export/<name>/<timestamp>/` through
`Estimator.export_saved_model` (a torch.export program, see estimator.export).
"""
from __future__ import annotations

import inspect
import json
import logging
import numbers
import os
import shutil
from typing import Callable, Optional

from hooks.event_files import read_scalars

from .export import SIGNATURE, is_export_version

logger = logging.getLogger(__name__)


class Exporter:
    """Exports a model after an evaluation (tf.estimator.Exporter)."""

    @property
    def name(self) -> str:
        """Directory name under `model_dir/export/`; unique within an EvalSpec."""
        raise NotImplementedError

    def export(self, estimator, export_path: str, checkpoint_path: str, eval_result: dict,
               is_the_final_export: bool) -> Optional[str]:
        """Export `checkpoint_path` (evaluated as `eval_result`) under
        `export_path`; return the export directory, or None if nothing was written."""
        raise NotImplementedError


class _SavedModelExporter(Exporter):
    """Exports on every call (TF's _SavedModelExporter)."""

    def __init__(self, name: str, serving_input_receiver_fn: Callable, assets_extra=None,
                 as_text: bool = False):
        self._name = name
        self._serving_input_receiver_fn = serving_input_receiver_fn
        self._assets_extra = assets_extra
        self._as_text = as_text

    @property
    def name(self) -> str:
        return self._name

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        return estimator.export_saved_model(export_path, self._serving_input_receiver_fn,
                                            assets_extra=self._assets_extra,
                                            as_text=self._as_text,
                                            checkpoint_path=checkpoint_path)


def _check_exports_to_keep(exports_to_keep) -> None:
    if exports_to_keep is not None and (not isinstance(exports_to_keep, numbers.Integral)
                                        or exports_to_keep <= 0):
        raise ValueError(f"`exports_to_keep`, if provided, must be a positive number. "
                         f"Got {exports_to_keep!r}")


def _garbage_collect_exports(export_dir_base: str, exports_to_keep: Optional[int]) -> None:
    """Delete all but the `exports_to_keep` newest timestamped exports (as
    TF's, only names of 10 digits: a user's `123/` there is not an export)."""
    if exports_to_keep is None or not os.path.isdir(export_dir_base):
        return
    versions = sorted(int(n) for n in os.listdir(export_dir_base) if is_export_version(n))
    for version in versions[:-exports_to_keep]:
        shutil.rmtree(os.path.join(export_dir_base, str(version)), ignore_errors=True)


def _exported_steps(export_dir_base: str) -> Optional[set]:
    """The global steps of the exports in `export_dir_base` (their
    signature.json's); None where one does not say (an export of an earlier
    version: then every evaluation counts)."""
    steps = set()
    if not os.path.isdir(export_dir_base):
        return steps
    for name in os.listdir(export_dir_base):
        if not is_export_version(name):
            continue
        try:
            with open(os.path.join(export_dir_base, name, SIGNATURE), encoding="utf-8") as f:
                steps.add(int(json.load(f)["global_step"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return steps


class LatestExporter(Exporter):
    """Exports after every evaluation and keeps the `exports_to_keep` newest
    (tf.estimator.LatestExporter)."""

    def __init__(self, name: str, serving_input_receiver_fn: Callable, assets_extra=None,
                 as_text: bool = False, exports_to_keep: Optional[int] = 5):
        self._saved_model_exporter = _SavedModelExporter(name, serving_input_receiver_fn,
                                                         assets_extra, as_text)
        _check_exports_to_keep(exports_to_keep)
        self._exports_to_keep = exports_to_keep

    @property
    def name(self) -> str:
        return self._saved_model_exporter.name

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        result = self._saved_model_exporter.export(estimator, export_path, checkpoint_path,
                                                   eval_result, is_the_final_export)
        _garbage_collect_exports(export_path, self._exports_to_keep)
        return result


class FinalExporter(Exporter):
    """Exports once, after the evaluation of the final checkpoint
    (tf.estimator.FinalExporter)."""

    def __init__(self, name: str, serving_input_receiver_fn: Callable, assets_extra=None,
                 as_text: bool = False):
        self._saved_model_exporter = _SavedModelExporter(name, serving_input_receiver_fn,
                                                         assets_extra, as_text)

    @property
    def name(self) -> str:
        return self._saved_model_exporter.name

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        if not is_the_final_export:
            return None
        logger.info("Performing the final export in the end of training.")
        return self._saved_model_exporter.export(estimator, export_path, checkpoint_path,
                                                 eval_result, is_the_final_export)


def _loss_smaller(best_eval_result: dict, current_eval_result: dict) -> bool:
    """True if `current_eval_result` has the smaller `loss` (TF's default compare_fn)."""
    if not best_eval_result or "loss" not in best_eval_result:
        raise ValueError("best_eval_result cannot be empty or no loss is found in it.")
    if not current_eval_result or "loss" not in current_eval_result:
        raise ValueError("current_eval_result cannot be empty or no loss is found in it.")
    return best_eval_result["loss"] > current_eval_result["loss"]


def _verify_compare_fn_args(compare_fn) -> None:
    if not callable(compare_fn):
        raise ValueError(f"compare_fn must be callable, got {compare_fn!r}")
    args = set(inspect.signature(compare_fn).parameters)
    for needed in ("best_eval_result", "current_eval_result"):
        if needed not in args:
            raise ValueError(f"compare_fn ({compare_fn}) must include {needed} argument.")
    extra = sorted(args - {"best_eval_result", "current_eval_result"})
    if extra:
        raise ValueError(f"compare_fn ({compare_fn}) has following not expected args: {extra}")


class BestExporter(Exporter):
    """Exports when the evaluation is better than every earlier one, by
    `compare_fn(best_eval_result, current_eval_result)` (smaller `loss` by
    default), keeping the `exports_to_keep` newest (tf.estimator.BestExporter).

    Preemption-safe: on its first export in a process it reads the earlier
    evaluation results from the event files matching `event_file_pattern`
    (relative to model_dir; the evaluation summaries), those before the
    evaluated step of the steps its exports (in `export_path`) hold, so a
    restarted evaluator does not export a model worse than one it exported
    before. An evaluation it did not export (its evaluator killed between
    the summaries and the export; another's, `evaluate` called by hand) is
    no baseline: a better model is never held back by one that is not
    there. TF 2.15 instead exports the first evaluation of each process
    whatever it is (its fix for the evaluated step's own result being read
    back), so a restart there can export a worse model
    (tensorflow/tensorflow#47396).
    """

    def __init__(self, name: str = "best_exporter", serving_input_receiver_fn: Callable = None,
                 event_file_pattern: Optional[str] = "eval/*.tfevents.*",
                 compare_fn: Callable = _loss_smaller, assets_extra=None, as_text: bool = False,
                 exports_to_keep: Optional[int] = 5):
        if compare_fn is None:
            raise ValueError("`compare_fn` must not be None.")
        _verify_compare_fn_args(compare_fn)
        _check_exports_to_keep(exports_to_keep)
        self._compare_fn = compare_fn
        self._saved_model_exporter = _SavedModelExporter(name, serving_input_receiver_fn,
                                                         assets_extra, as_text)
        self._event_file_pattern = event_file_pattern
        self._exports_to_keep = exports_to_keep
        self._model_dir = None
        self._best_eval_result = None

    @property
    def name(self) -> str:
        return self._saved_model_exporter.name

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        if self._model_dir != estimator.model_dir and self._event_file_pattern:
            logger.info("Loading best metric from event files.")
            self._model_dir = estimator.model_dir
            self._best_eval_result = self._get_best_eval_result(
                os.path.join(self._model_dir, self._event_file_pattern),
                before_step=eval_result.get("global_step"), steps=_exported_steps(export_path))
        if self._best_eval_result is not None and not self._compare_fn(
                best_eval_result=self._best_eval_result, current_eval_result=eval_result):
            return None
        logger.info("Performing best model export.")
        self._best_eval_result = eval_result
        result = self._saved_model_exporter.export(estimator, export_path, checkpoint_path,
                                                   eval_result, is_the_final_export)
        _garbage_collect_exports(export_path, self._exports_to_keep)
        return result

    def _get_best_eval_result(self, pattern: str, before_step: Optional[int],
                              steps: Optional[set] = None) -> Optional[dict]:
        """The best of the evaluation results recorded in the event files
        matching `pattern`, one result per step (every scalar written at that
        step), of `steps` alone where given, leaving out results at
        `before_step` or later: the evaluation being exported has already
        written its own."""
        results = read_scalars(pattern)
        best = None
        for step in sorted(results):
            if (before_step is not None and step >= before_step) or (
                    steps is not None and step not in steps):
                continue
            result = dict(results[step], global_step=step)
            if best is None or self._compare_fn(best_eval_result=best,
                                                current_eval_result=result):
                best = result
        return best
