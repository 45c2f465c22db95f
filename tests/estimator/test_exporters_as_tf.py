"""The exports a local train_and_evaluate keeps, against TF 2.15's recording
(tests/support/fixtures/record_tf_exporters.py): the same model from the same
weights, labels moving back and forth so the evaluation loss goes up and
down; a LatestExporter and a BestExporter keeping 2 each, a FinalExporter."""
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

with open(os.path.join(FIXTURES, "tf_exporters.json"), encoding="utf-8") as _f:
    TF = json.load(_f)

X = np.arange(16, dtype=np.float32).reshape(8, 2) / 16.0
Y = (X @ np.array([[1.0], [-2.0]], dtype=np.float32) + 0.5).astype(np.float32)
SHIFTS = [0.0, 3.0, 0.0, -3.0, 1.0, 0.0, -1.0, 2.0, 0.0, 0.0]   # as the recorder's
KERNEL, BIAS, LR = [[0.25], [-0.5]], [0.1], 0.3


def train_input_fn():
    for k, shift in enumerate(SHIFTS):
        rows = slice(4 * (k % 2), 4 * (k % 2) + 4)
        yield {"x": torch.from_numpy(X[rows])}, torch.from_numpy(Y[rows] + shift)


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


def test_latest_best_and_final_exporters_keep_the_exports_tf_keeps(tmp_path):
    serving = export_lib.build_raw_serving_input_receiver_fn({"x": torch.zeros(1, 2)})
    e = est.Estimator(model_fn, config=est.RunConfig(
        model_dir=str(tmp_path), tf_random_seed=1, save_checkpoints_steps=2,
        keep_checkpoint_max=20, save_summary_steps=100, log_step_count_steps=100))
    exporters = [est.LatestExporter("latest", serving, exports_to_keep=2),
                 est.BestExporter("best", serving, exports_to_keep=2),
                 est.FinalExporter("final", serving)]
    est.train_and_evaluate(e, est.TrainSpec(train_input_fn, max_steps=len(SHIFTS)),
                           est.EvalSpec(eval_input_fn, steps=None, exporters=exporters,
                                        throttle_secs=0, start_delay_secs=0))
    events = EventAccumulator(str(tmp_path / "eval"))
    events.Reload()
    evaluations = sorted((s.step, s.value) for s in events.Scalars("loss"))
    assert [s for s, _ in evaluations] == [s for s, _ in TF["evaluations"]]
    assert [v for _, v in evaluations] == pytest.approx([v for _, v in TF["evaluations"]],
                                                        rel=1e-4)
    for exporter in exporters:
        kept = sorted(glob.glob(os.path.join(str(tmp_path), "export", exporter.name, "*")))
        steps = []
        for path in kept:
            with open(os.path.join(path, "signature.json"), encoding="utf-8") as f:
                steps.append(json.load(f)["global_step"])
        assert steps == TF["exported_steps"][exporter.name], exporter.name
