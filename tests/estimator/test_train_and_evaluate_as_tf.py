"""A local train_and_evaluate against TF 2.15's recording
(tests/support/fixtures/record_tf_train_and_evaluate.py): the same model from
the same weights, labels moving back and forth so the evaluation loss goes up
and down. The exports a LatestExporter and a BestExporter keeping 2 each and
a FinalExporter keep; where stop_if_no_decrease_hook stops training; and
that a run ending before max_steps (stopped early, or its input ran out)
gets no final export and each evaluated checkpoint one latest export."""
import glob
import json
import os

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import estimator as est
from estimator import export as export_lib
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_train_and_evaluate.json"), encoding="utf-8") as _f:
    TF = json.load(_f)

X = np.arange(16, dtype=np.float32).reshape(8, 2) / 16.0
Y = (X @ np.array([[1.0], [-2.0]], dtype=np.float32) + 0.5).astype(np.float32)
SHIFTS = [0.0, 3.0, 0.0, -3.0, 1.0, 0.0, -1.0, 2.0, 0.0, 0.0]   # as the recorder's
EARLY_SHIFTS = SHIFTS + [2.0 + 0.5 * k for k in range(20)]
KERNEL, BIAS, LR = [[0.25], [-0.5]], [0.1], 0.3


def train_input_fn(shifts=SHIFTS):
    def batches():
        for k, shift in enumerate(shifts):
            rows = slice(4 * (k % 2), 4 * (k % 2) + 4)
            yield {"x": torch.from_numpy(X[rows])}, torch.from_numpy(Y[rows] + shift)
    return batches


def eval_input_fn():
    return [({"x": torch.from_numpy(X)}, torch.from_numpy(Y))]


def dense():
    layer = torch.nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(KERNEL).t())
        layer.bias.copy_(torch.tensor(BIAS))
    return layer


def model_fn(features, labels, mode):
    pred = est.get_module("dense", dense)(features["x"])
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"y": pred})
    return est.EstimatorSpec(
        mode, loss=torch.nn.functional.mse_loss(pred, labels),
        train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, lr=LR)))


def estimator(model_dir):
    return est.Estimator(model_fn, config=est.RunConfig(
        model_dir=str(model_dir), tf_random_seed=1, save_checkpoints_steps=2,
        keep_checkpoint_max=20, save_summary_steps=100, log_step_count_steps=100))


def evaluations_in(model_dir):
    events = EventAccumulator(str(model_dir / "eval"))
    events.Reload()
    return sorted((s.step, s.value) for s in events.Scalars("loss"))


def assert_evaluations_are_tfs(evaluations, recorded):
    assert [s for s, _ in evaluations] == [s for s, _ in recorded]
    assert [v for _, v in evaluations] == pytest.approx([v for _, v in recorded], rel=1e-4)


SERVING = export_lib.build_raw_serving_input_receiver_fn({"x": torch.zeros(1, 2)})


def latest_and_final():
    return [est.LatestExporter("latest", SERVING, exports_to_keep=20),
            est.FinalExporter("final", SERVING)]


def assert_exports_are_tfs(model_dir, exporters, recorded):
    for exporter in exporters:
        kept = sorted(glob.glob(os.path.join(str(model_dir), "export", exporter.name, "*")))
        steps = []
        for path in kept:
            with open(os.path.join(path, "signature.json"), encoding="utf-8") as f:
                steps.append(json.load(f)["global_step"])
        assert steps == recorded[exporter.name], exporter.name


def test_latest_best_and_final_exporters_keep_the_exports_tf_keeps(tmp_path):
    e = estimator(tmp_path)
    exporters = [est.LatestExporter("latest", SERVING, exports_to_keep=2),
                 est.BestExporter("best", SERVING, exports_to_keep=2),
                 est.FinalExporter("final", SERVING)]
    est.train_and_evaluate(e, est.TrainSpec(train_input_fn(), max_steps=len(SHIFTS)),
                           est.EvalSpec(eval_input_fn, steps=None, exporters=exporters,
                                        throttle_secs=0, start_delay_secs=0))
    assert_evaluations_are_tfs(evaluations_in(tmp_path), TF["evaluations"])
    assert_exports_are_tfs(tmp_path, exporters, TF["exported_steps"])


def test_stop_if_no_decrease_stops_where_tf_stops(tmp_path):
    """Best at step 6; the evaluation of step 10 (4 steps later) stops
    training at step 10, as TF's hook sees it after the chief's save. No
    final export (step 10 < max_steps): the last, worse model is not
    published as final; one latest export per evaluation, none twice."""
    e = estimator(tmp_path)
    stop = est.experimental.stop_if_no_decrease_hook(
        e, "loss", max_steps_without_decrease=3, run_every_secs=None, run_every_steps=1)
    exporters = latest_and_final()
    est.train_and_evaluate(e, est.TrainSpec(train_input_fn(EARLY_SHIFTS),
                                            max_steps=len(EARLY_SHIFTS), hooks=[stop]),
                           est.EvalSpec(eval_input_fn, steps=None, throttle_secs=0,
                                        start_delay_secs=0, exporters=exporters))
    recorded = TF["early_stopping"]
    assert_evaluations_are_tfs(evaluations_in(tmp_path), recorded["evaluations"])
    assert est.checkpoint.step_of(e.latest_checkpoint()) == recorded["last_checkpoint"]
    assert_exports_are_tfs(tmp_path, exporters, recorded["exported_steps"])


@pytest.mark.parametrize("max_steps", [100, None])
def test_a_run_whose_input_runs_out_exports_as_tf(tmp_path, max_steps):
    """9 batches: training ends at step 9, evaluated once (no final export,
    as step 9 < max_steps or there is none; no second latest export of 9)."""
    exporters = latest_and_final()
    result = est.train_and_evaluate(
        estimator(tmp_path), est.TrainSpec(train_input_fn(SHIFTS[:9]), max_steps=max_steps),
        est.EvalSpec(eval_input_fn, steps=None, throttle_secs=0, start_delay_secs=0,
                     exporters=exporters))
    recorded = TF["input_runs_out"][str(max_steps)]
    assert_evaluations_are_tfs(evaluations_in(tmp_path), recorded["evaluations"])
    assert_exports_are_tfs(tmp_path, exporters, recorded["exported_steps"])
    metrics, (latest, final) = result
    assert metrics["global_step"] == 9 and final is None and latest is not None
