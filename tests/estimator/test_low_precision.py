"""Mixed precision and low-precision dtypes as a port uses them: a loss
scaler against TF 2.15's dynamic loss scaling
(tests/support/fixtures/record_tf_loss_scale.py), bfloat16 values leaving
torch (predict, summaries, checkpoints, serving), restores that would round,
small integer labels and a float64 default dtype.

Before: a GradScaler's scale started over at every restart and a step it
skipped counted in the global step (TF counts 5 of 6 batches, one skipped;
here 6); every bfloat16 tensor turned into numpy raised `TypeError: Got
unsupported ScalarType BFloat16`; a float32 model_dir resumed or
warm-started by a bfloat16 model was rounded without a word (TF refuses);
int8 class labels and a float64 model fed numpy float64 raised torch's
errors."""
import json
import os

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import estimator as est
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_loss_scale.json"), encoding="utf-8") as _f:
    TF = json.load(_f)


# -- a loss scaler, as TF's MixedPrecisionLossScaleOptimizer --------------------
def _scaled_model_fn(rows):
    def model_fn(features, labels, mode):
        lin = est.get_module("lin", lambda: torch.nn.Linear(1, 1, bias=False))
        if est.get_global_step() == 0 and not rows:
            with torch.no_grad():
                lin.weight.zero_()
        loss = ((lin(features["x"]) - labels) ** 2).mean()
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        scaler = est.get_grad_scaler(lambda: torch.amp.GradScaler(
            "cpu", init_scale=2.0 ** 15, growth_factor=2.0, backoff_factor=0.5,
            growth_interval=2))

        def train_op():   # (no zero_grad: the framework frees what was not applied)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            rows.append({"w": lin.weight.item(), "loss_scale": scaler.get_scale()})
        return est.EstimatorSpec(mode, loss=loss, train_op=train_op)
    return model_fn


class _Steps(est.SessionRunHook):
    def __init__(self, rows):
        self.rows = rows

    def before_run(self, run_context):
        return est.SessionRunArgs("global_step")

    def after_run(self, run_context, run_values):
        self.rows[-1]["global_step"] = run_context.session.global_step
        self.rows[-1]["fetched"] = run_values.results


def _batches(xs):
    return [({"x": torch.tensor([[float(x)]])}, torch.ones(1, 1)) for x in xs]


def test_a_grad_scaler_is_checkpointed_and_its_skipped_steps_are_not_counted_as_tf(tmp_path):
    for run in ("first", "second"):
        rows = []
        e = est.Estimator(_scaled_model_fn(rows), model_dir=str(tmp_path))
        e.train(lambda: _batches(TF[f"{run}_x"]), hooks=[_Steps(rows)])
        want = TF[run]["steps"]
        assert [r["global_step"] for r in rows] == [int(r["global_step"]) for r in want]
        # a fetch reads the step before its update: the last step's (not one
        # less on a skipped step, where the global step stays as it was)
        first = TF["first"]["steps"][-1]["global_step"] if run == "second" else 0
        assert [r["fetched"] for r in rows] == [int(s) for s in [first] + [
            r["global_step"] for r in want][:-1]]
        assert [r["loss_scale"] for r in rows] == [r["loss_scale"] for r in want]
        np.testing.assert_allclose([r["w"] for r in rows], [r["w"] for r in want], rtol=1e-6)
        saved = TF[run]["checkpoint"]
        assert e.get_variable_value("global_step") == saved["global_step"]
        assert e.get_variable_value("grad_scaler/scale") == saved["current_loss_scale"]
        assert e.get_variable_value("grad_scaler/growth_tracker") == saved["good_steps"]


def test_a_grad_scaler_with_an_optimizer_as_train_op_is_an_error(tmp_path):
    def model_fn(features, labels, mode):
        lin = est.get_module("lin", lambda: torch.nn.Linear(1, 1))
        est.get_grad_scaler(lambda: torch.amp.GradScaler("cpu"))
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        return est.EstimatorSpec(mode, loss=lin(features["x"]).pow(2).mean(), train_op=opt)
    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"get_grad_scaler\('grad_scaler'\).*callable train_op"):
        e.train(lambda: _batches([1.0]))
    assert e.latest_checkpoint() is None

    def not_a_scaler(features, labels, mode):
        est.get_module("lin", lambda: torch.nn.Linear(1, 1))
        est.get_grad_scaler(lambda: torch.optim.SGD([torch.zeros(1)], lr=1))
    with pytest.raises(TypeError, match="must return a torch.amp.GradScaler, got SGD"):
        est.Estimator(not_a_scaler, model_dir=str(tmp_path / "b")).train(
            lambda: _batches([1.0]))


# -- bfloat16 values out of torch --------------------------------------------------
def _bf16_model_fn(features, labels, mode):
    net = est.get_module("net", lambda: torch.nn.Linear(3, 2).to(torch.bfloat16))
    logits = net(features["x"].to(torch.bfloat16))
    est.summary.histogram("logits", logits)
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"logits": logits})
    loss = logits.float().pow(2).mean()
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=0.1)))


def test_bfloat16_values_leave_torch_as_float32(tmp_path):
    x = np.random.RandomState(0).randn(4, 3).astype(np.float32)
    e = est.Estimator(_bf16_model_fn, config=est.RunConfig(
        model_dir=str(tmp_path), save_summary_steps=1))
    e.train(lambda: [({"x": x}, None)] * 2)
    want = e.get_variable_value("net/weight")
    assert want.dtype == np.float32 and want.shape == (2, 3)
    assert est.checkpoint.load_variable(str(tmp_path), "net/weight").tolist() == want.tolist()
    # the bfloat16 weights, exactly: what predict computes with them
    net = torch.nn.Linear(3, 2).to(torch.bfloat16)
    net.load_state_dict({"weight": torch.from_numpy(want).to(torch.bfloat16),
                         "bias": torch.from_numpy(e.get_variable_value("net/bias"))
                         .to(torch.bfloat16)})
    expected = net(torch.from_numpy(x).to(torch.bfloat16)).detach().float().numpy()
    out = np.stack([p["logits"] for p in e.predict(lambda: [{"x": x}])])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)
    acc = EventAccumulator(str(tmp_path), size_guidance={"histograms": 0})
    acc.Reload()
    assert [h.step for h in acc.Histograms("logits")] == [1, 2]

    path = e.export_saved_model(str(tmp_path / "export"),
                                est.export.build_raw_serving_input_receiver_fn(
                                    {"x": torch.zeros(1, 3)}))
    served = est.serving.Model(path).predict({"instances": x.tolist()})["predictions"]
    np.testing.assert_array_equal(np.array(served, np.float32), expected)


# -- restores that would round -------------------------------------------------------
def _typed_model_fn(dtype, lr=0.1):
    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(3, 2).to(dtype))
        out = net(features["x"].to(dtype)).float()
        if mode == est.ModeKeys.PREDICT:
            return est.EstimatorSpec(mode, predictions={"out": out})
        return est.EstimatorSpec(mode, loss=out.pow(2).mean(), train_op=est.get_optimizer(
            lambda p: torch.optim.Adam(p, lr=lr)))
    return model_fn


def _x_batches():
    return [({"x": np.random.RandomState(0).randn(8, 3).astype(np.float32)}, None)] * 3


def test_a_restore_or_warm_start_that_would_round_is_refused_as_tf(tmp_path):
    f32, bf16 = str(tmp_path / "f32"), str(tmp_path / "bf16")
    est.Estimator(_typed_model_fn(torch.float32), model_dir=f32).train(_x_batches, max_steps=3)
    before = sorted(os.listdir(f32))
    with pytest.raises(ValueError, match=r"cannot restore net/weight from .*model\.ckpt-3: the "
                       r"checkpoint holds it as torch\.float32, the module as torch\.bfloat16"):
        est.Estimator(_typed_model_fn(torch.bfloat16), model_dir=f32).train(
            _x_batches, max_steps=6)
    with pytest.raises(ValueError, match="cannot restore net/weight"):
        list(est.Estimator(_typed_model_fn(torch.bfloat16), model_dir=f32).predict(
            lambda: [{"x": np.zeros((1, 3), np.float32)}]))
    assert sorted(os.listdir(f32)) == before   # nothing written
    with pytest.raises(ValueError, match=r"Warm-start: 'net/weight' is torch\.bfloat16 but "
                       r"'net/weight' in .* is torch\.float32, whose values it would round"):
        est.Estimator(_typed_model_fn(torch.bfloat16), model_dir=bf16,
                      warm_start_from=f32).train(_x_batches, max_steps=1)

    # bfloat16 into float32 keeps every value: restored and warm-started
    est.Estimator(_typed_model_fn(torch.bfloat16), model_dir=bf16).train(
        _x_batches, max_steps=2)
    saved = est.checkpoint.load_variable(bf16, "net/weight")
    e = est.Estimator(_typed_model_fn(torch.float32), model_dir=bf16)
    e.train(_x_batches, max_steps=2)   # (resumed at 2: nothing to train, restored)
    assert e.get_variable_value("net/weight").dtype == np.float32
    warm = est.Estimator(_typed_model_fn(torch.float32, lr=0.0), model_dir=str(tmp_path / "w"),
                         warm_start_from=bf16)
    warm.train(_x_batches, max_steps=1)   # (warm-started, then a step that moves nothing)
    np.testing.assert_array_equal(warm.get_variable_value("net/weight"), saved)


# -- labels and inputs ----------------------------------------------------------------
def test_int8_class_labels_train_as_int64_ones():
    rng = np.random.RandomState(0)
    x = rng.randn(60, 3)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)
    columns = [est.feature_column.numeric_column("x", shape=(3,))]
    results = []
    for labels in (y, y.astype(np.int8), y.astype(np.int16)):
        torch.manual_seed(0)
        e = est.DNNClassifier(hidden_units=[4], feature_columns=columns, n_classes=3)
        e.train(est.inputs.numpy_input_fn({"x": x}, labels, batch_size=20, shuffle=False))
        results.append(e.evaluate(est.inputs.numpy_input_fn({"x": x}, labels, batch_size=20,
                                                            shuffle=False)))
    assert results[1] == results[0] and results[2] == results[0]


def test_numpy_float64_stays_float64_where_torch_defaults_to_float64(tmp_path):
    seen = []

    def model_fn(features, labels, mode):
        seen.append((features["x"].dtype, labels.dtype))
        net = est.get_module("net", lambda: torch.nn.Linear(1, 1))
        loss = (net(features["x"]) - labels).pow(2).mean()
        return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "label": est.metrics.mean(labels)},
            train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.0)))
    y = np.array([[1e8 + 0.25], [1e8 - 0.5]])   # (float32 rounds both to 1e8)
    batches = [({"x": np.ones((2, 1))}, y)]
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        e = est.Estimator(model_fn, model_dir=str(tmp_path))
        e.train(lambda: batches, max_steps=1)
        result = e.evaluate(lambda: batches)
    finally:
        torch.set_default_dtype(default)
    assert set(seen) == {(torch.float64, torch.float64)}
    assert result["label"] == pytest.approx(1e8 - 0.125, abs=1e-6)
    seen.clear()
    est.Estimator(model_fn, model_dir=str(tmp_path / "b")).train(lambda: batches, max_steps=1)
    assert set(seen) == {(torch.float32, torch.float32)}   # TF's default float otherwise


def test_a_fused_optimizers_skipped_step_is_not_counted_and_a_disabled_scaler_is_no_scaler(
        tmp_path):
    """A fused optimizer skips in its own kernel (its step is called): the
    skip is read from the scaler; a disabled scaler (`enabled=use_amp`) beside
    an optimizer train_op is no error."""
    def model_fn(features, labels, mode):
        lin = est.get_module("lin", lambda: torch.nn.Linear(1, 1, bias=False))
        loss = ((lin(features["x"]) - labels) ** 2).mean()
        opt = est.get_optimizer(lambda p: torch.optim.Adam(p, lr=0.1, fused=True))
        scaler = est.get_grad_scaler(lambda: torch.amp.GradScaler("cpu", init_scale=2.0 ** 15))

        def train_op():
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return est.EstimatorSpec(mode, loss=loss, train_op=train_op)
    e = est.Estimator(model_fn, model_dir=str(tmp_path / "fused"))
    e.train(lambda: _batches([1.0, float("inf"), 1.0, 1.0]))
    assert e.get_variable_value("global_step") == 3
    assert e.get_variable_value("grad_scaler/scale") == 2.0 ** 14

    def disabled(features, labels, mode):
        lin = est.get_module("lin", lambda: torch.nn.Linear(1, 1))
        est.get_grad_scaler(lambda: torch.amp.GradScaler("cpu", enabled=False))
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        return est.EstimatorSpec(mode, loss=lin(features["x"]).pow(2).mean(), train_op=opt)
    e = est.Estimator(disabled, model_dir=str(tmp_path / "disabled"))
    e.train(lambda: _batches([1.0, 2.0]))
    assert e.get_variable_value("global_step") == 2
    assert "grad_scaler/scale" not in e.get_variable_names()


def _mirrored_scaled_model_fn(features, labels, mode):
    lin = est.get_module("lin", lambda: torch.nn.Linear(1, 1, bias=False))
    loss = ((lin(features["x"]) - labels) ** 2).mean()
    opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
    scaler = est.get_grad_scaler(lambda: torch.amp.GradScaler(
        "cpu", init_scale=2.0 ** 15, growth_interval=2))

    def train_op():
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return est.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _sharded_rows(input_context):
    """6 global batches of 2 rows, one row each replica; x = inf on replica
    0's row of the third."""
    xs = [1.0, 0.5, 2.0, 1.5, float("inf"), 1.0, 0.5, 2.0, 1.0, 1.5, 2.0, 0.5]
    x = torch.tensor(xs).reshape(-1, 1)
    i = input_context.input_pipeline_id
    return [({"x": x[j + i:j + i + 1]}, torch.ones(1, 1)) for j in range(0, len(xs), 2)]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_replicas_skip_a_step_together_or_are_refused_a_scaler(tmp_path):
    """Under MirroredStrategy (gradients all-reduced in backward) an inf on
    one replica's rows makes both skip: 6 batches, global step 5 on both.
    Where gradients are reduced in the optimizer's step (ReductionToOneDevice)
    each replica would judge its own and one would wait for ever: refused."""
    import distribute
    options = distribute.CommunicationOptions(timeout_seconds=30)
    strategy = distribute.MirroredStrategy(["cpu:0", "cpu:1"], communication_options=options)
    e = est.Estimator(_mirrored_scaled_model_fn, config=est.RunConfig(
        model_dir=str(tmp_path / "mirrored"), train_distribute=strategy))
    e.train(_sharded_rows)
    assert e.get_variable_value("global_step") == 5
    assert e.get_variable_value("grad_scaler/scale") == 2.0 ** 16   # x2, /2, x2

    strategy = distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], cross_device_ops=distribute.ReductionToOneDevice(),
        communication_options=options)
    e = est.Estimator(_mirrored_scaled_model_fn, config=est.RunConfig(
        model_dir=str(tmp_path / "to_one"), train_distribute=strategy))
    with pytest.raises(Exception, match="reduces the replicas' gradients in the optimizer's"):
        e.train(_sharded_rows)


def test_what_a_restore_would_round_or_wrap_is_refused(tmp_path):
    from hooks.checkpoint import rounded_by_cast
    t = torch.tensor
    assert rounded_by_cast(t([-3, 5], dtype=torch.int8), torch.uint8)     # 253 as uint8
    assert rounded_by_cast(t([200], dtype=torch.uint8), torch.int8)
    assert rounded_by_cast(t([2 ** 40]), torch.int32)
    assert not rounded_by_cast(t([-3, 5], dtype=torch.int8), torch.int64)
    assert not rounded_by_cast(t([1.5, float("nan"), float("inf")]), torch.bfloat16)
    assert rounded_by_cast(t([0.1]), torch.bfloat16)
    assert rounded_by_cast(t([1.5]), torch.int64)

    def lazy(dtype):   # LazyLinear: its restored weight is made in the module's dtype
        def model_fn(features, labels, mode):
            net = est.get_module("net", lambda: torch.nn.LazyLinear(1, dtype=dtype))
            loss = net(features["x"].to(dtype)).float().pow(2).mean()
            return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
                lambda p: torch.optim.SGD(p, lr=0.1)))
        return model_fn
    est.Estimator(lazy(torch.float32), model_dir=str(tmp_path)).train(_x_batches, max_steps=1)
    with pytest.raises(ValueError, match="cannot restore net/weight .* torch.bfloat16"):
        est.Estimator(lazy(torch.bfloat16), model_dir=str(tmp_path)).train(
            _x_batches, max_steps=2)


def test_to_numpy_takes_what_numpy_cannot_hold_directly():
    from distribute.host_arrays import to_numpy
    z = torch.tensor([1 + 2j, 3 - 1j])
    assert to_numpy(z.conj()).tolist() == [1 - 2j, 3 + 1j]
    assert to_numpy(z.conj().imag).tolist() == [-2.0, 1.0]
    assert to_numpy(torch.eye(2).to_sparse()).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    b = to_numpy(torch.tensor([1.1, float("nan")], dtype=torch.bfloat16))
    assert b.dtype == np.float32 and b[0] == np.float32(1.1015625) and np.isnan(b[1])
    assert to_numpy(torch.ones(2, requires_grad=True) * 2).tolist() == [2.0, 2.0]
