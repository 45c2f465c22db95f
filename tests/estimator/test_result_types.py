"""The Python types of what TF hands back, against TF 2.15
(tests/support/fixtures/tf_result_types.json, recorded by
record_tf_result_types.py): `evaluate`'s results and a hook's fetches are
numpy values (a float32 scalar is `np.float32`, the global step `np.int64`),
so a ported program's `print(results)` and `results["loss"].dtype` work as
in TF."""
import json
import os

import numpy as np
import torch

import estimator as est
import hooks

FIXTURE = os.path.join(os.path.dirname(__file__), os.pardir, "support", "fixtures",
                       "tf_result_types.json")
X = torch.arange(16, dtype=torch.float32).reshape(8, 2) / 16.0
Y = torch.tensor([0, 1, 0, 1, 1, 0, 1, 1])


def describe(value):
    return {"type": type(value).__name__,
            "dtype": str(value.dtype) if hasattr(value, "dtype") else None,
            "shape": list(np.shape(value)) if hasattr(value, "shape") else None}


class Fetch(hooks.SessionRunHook):
    seen = None

    def before_run(self, run_context):
        return hooks.SessionRunArgs({"loss": "loss", "global_step": "global_step",
                                     "logits": "logits"})

    def after_run(self, run_context, run_values):
        self.seen = {k: describe(v) for k, v in run_values.results.items()}


def model_fn(features, labels, mode):
    logits = est.named_tensor("logits", est.get_module(
        "dense", lambda: torch.nn.Linear(2, 2))(features["x"]))
    loss = torch.nn.functional.cross_entropy(logits, labels)
    prob, pred = logits.softmax(1)[:, 1], logits.argmax(1)
    ops = {"accuracy": est.metrics.accuracy(labels, pred),
           "auc": est.metrics.auc(labels, prob),
           "mean_prob": est.metrics.mean(prob),
           "true_positives": est.metrics.true_positives(labels, pred),
           "precision_at": est.metrics.precision_at_thresholds(labels, prob, [0.3, 0.6])}
    return est.EstimatorSpec(mode, loss=loss, eval_metric_ops=ops,
                             train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, 0.1)))


def input_fn():
    return iter([({"x": X[:4]}, Y[:4]), ({"x": X[4:]}, Y[4:])])


def test_evaluate_results_and_hook_fetches_are_numpy_values_as_tf(tmp_path):
    tf = json.load(open(FIXTURE))
    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    hook = Fetch()
    e.train(input_fn, steps=2, hooks=[hook])
    results = e.evaluate(input_fn)
    assert {k: describe(v) for k, v in results.items()} == tf["evaluate"]
    assert hook.seen == tf["fetched"]
    # What a ported program prints: float32's shortest digits, as TF's
    assert str(results["accuracy"]) == str(np.float32(results["accuracy"].item()))
    assert str(results["global_step"]) == "2"


class StopAtCreation(hooks.SessionRunHook):
    def after_create_session(self, session, coord):
        coord.request_stop()


def test_an_evaluation_stopped_before_its_first_step_reports_every_metric_as_tf(tmp_path):
    """TF's update ops never ran: every metric reads 0 (it was loss and
    global_step only; the streaming metrics the first model_fn call updated
    are not counted)."""
    tf = json.load(open(FIXTURE))["stopped_at_creation"]
    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    e.train(input_fn, steps=2)
    results = e.evaluate(input_fn, hooks=[StopAtCreation()])
    assert {k: dict(describe(v), value=np.asarray(v).tolist())
            for k, v in results.items()} == tf

    def own_metrics(features, labels, mode):   # a scalar tensor and a Metric of the call's
        spec = model_fn(features, labels, mode)
        mean = est.metrics.Mean()
        mean.update_state(features["x"])
        return spec._replace(eval_metric_ops={"tensor": features["x"].mean(), "own": mean})
    e = est.Estimator(own_metrics, model_dir=str(tmp_path))
    results = e.evaluate(input_fn, hooks=[StopAtCreation()])
    assert {k: v.item() for k, v in results.items()} == {
        "loss": 0.0, "own": 0.0, "tensor": 0.0, "global_step": 2}


def test_numpy_numbers_are_taken_where_tf_takes_numbers(tmp_path):
    """A threshold or rate taken from these results (numpy, as TF's) is a
    number (they were TypeError/ValueError: 'must be a number')."""
    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    e.train(input_fn, steps=2)
    loss = e.evaluate(input_fn)["loss"]
    hook = hooks.stop_if_lower_hook(e, "loss", loss * np.float32(2), run_every_secs=None,
                                    run_every_steps=1)
    e.train(input_fn, steps=2, hooks=[hook])
    assert est.checkpoint.step_of(e.latest_checkpoint()) == 3   # stopped at its first check
    metric = est.metrics.SensitivityAtSpecificity(np.float32(0.5))
    assert metric.config["specificity"] == 0.5
    step = e.evaluate(input_fn)["global_step"]   # np.int64, as TF's: an int wherever one is
    from hooks.progress import ProgressHook
    for make in (lambda: hooks.GlobalStepWaiterHook(step + 1),
                 lambda: hooks.LoggingTensorHook({"loss": "loss"}, every_n_iter=step),
                 lambda: hooks.NanTensorHook(every_n_iter=step),
                 lambda: ProgressHook(last_step=step + 2),
                 lambda: hooks.stop_if_no_decrease_hook(e, "loss", step, min_steps=step),
                 lambda: est.BestExporter(exports_to_keep=step),
                 lambda: est.metrics.AUC(num_thresholds=step)):
        make()
