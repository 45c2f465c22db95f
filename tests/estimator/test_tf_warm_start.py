"""Continuing a TF1 model here: canned estimators built with the same columns
warm-start from checkpoints TF 2.15's tf.compat.v1.estimator wrote, then
predict what TF predicted and evaluate what TF evaluated (recorded by
``tests/support/fixtures/record_tf_checkpoints.py`` and
``record_tf_canned_eval.py``)."""
import json
import os
import re

import numpy as np
import pytest
import torch

import estimator as est
from canned_data import batches, columns, make_census
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_ckpt", "tf_checkpoints.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
with open(os.path.join(FIXTURES, "tf_canned_eval.json"), encoding="utf-8") as _f:
    TF_EVAL = json.load(_f)
FROZEN = lambda params: torch.optim.SGD(params, lr=0.0)   # noqa: E731  (weights stay TF's)


def _build(name, model_dir, warm, weight_column=None):
    deep, wide = columns()
    return {
        "dnn": lambda: est.DNNClassifier([8, 4], deep, model_dir=model_dir, optimizer=FROZEN,
                                         warm_start_from=warm, weight_column=weight_column),
        "linear": lambda: est.LinearClassifier(wide, model_dir=model_dir, optimizer=FROZEN,
                                               warm_start_from=warm,
                                               weight_column=weight_column),
        "wide_deep": lambda: est.DNNLinearCombinedClassifier(
            model_dir=model_dir, linear_feature_columns=wide, dnn_feature_columns=deep,
            dnn_hidden_units=[8, 4], linear_optimizer=FROZEN, dnn_optimizer=FROZEN,
            warm_start_from=warm, weight_column=weight_column),
    }[name]()


@pytest.mark.parametrize("name", sorted(TF["canned"]))
def test_warm_started_from_tf_predicts_what_tf_predicted(name, tmp_path):
    recorded = TF["canned"][name]
    tf_dir = os.path.dirname(os.path.join(FIXTURES, recorded["prefix"]))
    estimator = _build(name, str(tmp_path), tf_dir)
    features, labels = make_census(200, 1)
    estimator.train(lambda: [(features, labels)], max_steps=1)
    assert estimator.get_variable_value("global_step") == 1   # TF's step is not taken
    rows = {k: v[:8] for k, v in features.items()}
    got = np.stack([p["probabilities"] for p in estimator.predict(lambda: [(rows, None)])])
    np.testing.assert_allclose(got, np.array(recorded["probabilities"]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(TF["canned"]))
def test_before_any_training_predict_and_evaluate_are_warm_started_as_tf(name, tmp_path):
    """TF's predict and evaluate warm-start when model_dir has no checkpoint
    (_maybe_warm_start): a warm-started estimator answers with TF's weights
    before training. They used the initial model (accuracy of chance)."""
    estimator = _build(name, str(tmp_path), os.path.dirname(
        os.path.join(FIXTURES, TF["canned"][name]["prefix"])))
    features, labels = make_census(TF_EVAL["rows"], TF_EVAL["seed"])
    rows = {k: v[:8] for k, v in make_census(200, 1)[0].items()}
    got = np.stack([p["probabilities"] for p in estimator.predict(lambda: [(rows, None)])])
    np.testing.assert_allclose(got, np.array(TF["canned"][name]["probabilities"]),
                               rtol=1e-5, atol=1e-6)
    got = estimator.evaluate(lambda: batches(features, labels, TF_EVAL["batch_size"]))
    assert got["global_step"] == 0
    for metric, value in TF_EVAL["metrics"][name].items():
        if metric != "global_step":
            assert got[metric] == pytest.approx(value, rel=1e-5, abs=1e-6), metric
    assert estimator.latest_checkpoint() is None


@pytest.mark.parametrize("key", sorted(TF_EVAL["metrics"]))
def test_evaluation_from_tfs_weights_gives_tfs_metrics(key, tmp_path):
    """Every metric TF's evaluate reported, on uneven batches (32 x 6 and 11),
    with and without a float64 weight column: `loss` the mean of the batches'
    summed losses, `average_loss`, AUCs, precision and recall as TF's."""
    name, weighted = key.replace("_weighted", ""), key.endswith("_weighted")
    features, labels = make_census(TF_EVAL["rows"], TF_EVAL["seed"])
    features["w"] = np.linspace(0.5, 2.0, TF_EVAL["rows"])
    tf_dir = os.path.dirname(os.path.join(FIXTURES, TF["canned"][name]["prefix"]))
    estimator = _build(name, str(tmp_path), tf_dir, "w" if weighted else None)
    estimator.train(lambda: [(features, labels)], max_steps=1)
    got = estimator.evaluate(lambda: batches(features, labels, TF_EVAL["batch_size"]))
    expected = dict(TF_EVAL["metrics"][key])
    del expected["global_step"]                  # TF's step is not warm-started
    assert set(got) - {"global_step"} == set(expected)
    for metric, value in expected.items():
        assert got[metric] == pytest.approx(value, rel=1e-5, abs=1e-6), metric


@pytest.mark.parametrize("name", sorted(TF_EVAL["after_one_step"]))
def test_one_more_step_from_tfs_checkpoint_moves_the_weights_as_tf(name, tmp_path):
    """Continuing a TF1 model: weights and the default optimizers' slots (DNN:
    Adagrad at 0.05, linear: Ftrl at 0.2, wide & deep: 0.001 and 0.2) warm-start
    from TF's checkpoint; one step on 32 rows gives the weights TF's step gave."""
    recorded = TF["canned"][name]
    tf_dir = os.path.dirname(os.path.join(FIXTURES, recorded["prefix"]))
    deep, wide = columns()
    settings = est.WarmStartSettings(tf_dir, vars_to_warm_start=[".*"])
    estimator = {
        "dnn": lambda: est.DNNClassifier([8, 4], deep, model_dir=str(tmp_path),
                                         warm_start_from=settings),
        "linear": lambda: est.LinearClassifier(wide, model_dir=str(tmp_path),
                                               warm_start_from=settings),
        "wide_deep": lambda: est.DNNLinearCombinedClassifier(
            model_dir=str(tmp_path), linear_feature_columns=wide, dnn_feature_columns=deep,
            dnn_hidden_units=[8, 4], warm_start_from=settings),
    }[name]()
    features, labels = make_census(200, 1)
    rows = {k: v[:32] for k, v in features.items()}
    estimator.train(lambda: [(rows, labels[:32])], steps=1)
    assert estimator.get_variable_value("global_step") == 21   # TF's list form: its step too
    after = TF_EVAL["after_one_step"][name]
    weights = set(after) & set(estimator.get_variable_names()) - {"global_step"}
    assert len(weights) >= 6                        # the model's weights; slots are named apart
    moved = 0.0
    for variable in sorted(weights):
        tf_after = np.asarray(after[variable], np.float32)
        np.testing.assert_allclose(estimator.get_variable_value(variable), tf_after,
                                   rtol=1e-5, atol=1e-7, err_msg=variable)
        before = recorded["variables"][variable].get("value")
        if before is not None:
            moved = max(moved, float(np.abs(tf_after - np.asarray(before)).max()))
    assert moved > 1e-3                             # the step moved the weights


def test_a_missing_variable_lists_the_closest(tmp_path):
    recorded = TF["canned"]["dnn"]
    settings = est.WarmStartSettings(
        os.path.dirname(os.path.join(FIXTURES, recorded["prefix"])),
        vars_to_warm_start=["dnn/logits/kernel"],
        var_name_to_prev_var_name={"dnn/logits/kernel": "dnn/logit/kernel"})
    deep, _ = columns()
    estimator = est.DNNClassifier([8, 4], deep, model_dir=str(tmp_path),
                                  warm_start_from=settings)
    features, labels = make_census(50, 1)
    with pytest.raises(ValueError, match=r"'dnn/logit/kernel' .* closest names: "
                                         r"\['dnn/logits/kernel'"):
        estimator.train(lambda: [(features, labels)], max_steps=1)


def test_a_shape_mismatch_is_an_error(tmp_path):
    recorded = TF["canned"]["dnn"]
    deep, _ = columns()
    estimator = est.DNNClassifier([16, 4], deep, model_dir=str(tmp_path),
                                  warm_start_from=os.path.join(FIXTURES, recorded["prefix"]))
    features, labels = make_census(50, 1)
    with pytest.raises(ValueError, match=r"'dnn/hiddenlayer_0/kernel' has shape \(17, 16\) "
                                         r"but .* has shape \(17, 8\)"):
        estimator.train(lambda: [(features, labels)], max_steps=1)


def test_hand_written_modules_map_tf_names_with_the_kernel_transposed(tmp_path):
    """A torch.nn.Linear warm-started from TF's dense kernel [in, out] and bias
    through var_name_to_prev_var_name: its weight is the kernel transposed."""
    prefix = os.path.join(FIXTURES, TF["canned"]["dnn"]["prefix"])
    kernel = np.array(TF["canned"]["dnn"]["variables"]["dnn/logits/kernel"]["value"],
                      np.float32)

    def model_fn(features, labels, mode):
        net = est.get_module("head", lambda: torch.nn.Linear(4, 1))
        loss = ((net(features["x"]) - labels) ** 2).mean()
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(FROZEN))
    settings = est.WarmStartSettings(prefix, var_name_to_prev_var_name={
        "head/weight": "dnn/logits/kernel", "head/bias": "dnn/logits/bias"})
    estimator = est.Estimator(model_fn, model_dir=str(tmp_path), warm_start_from=settings)
    estimator.train(lambda: [({"x": torch.ones(2, 4)}, torch.zeros(2, 1))], max_steps=1)
    np.testing.assert_array_equal(estimator.get_variable_value("head/weight"), kernel.T)
    # a misfit names the shape TF stored, and the one it has in torch's layout
    # (it gave the latter alone, as the checkpoint's)
    settings = est.WarmStartSettings(prefix, var_name_to_prev_var_name={
        "head/weight": "dnn/logits/kernel", "head/bias": "dnn/logits/bias"})

    def wider(features, labels, mode):
        net = est.get_module("head", lambda: torch.nn.Linear(5, 1))
        return est.EstimatorSpec(mode, predictions=net(features["x"]))
    wrong = est.Estimator(wider, model_dir=str(tmp_path / "wrong"), warm_start_from=settings)
    with pytest.raises(ValueError, match=re.escape(
            f"'head/weight' has shape (1, 5) but 'dnn/logits/kernel' in {prefix} has shape "
            f"{kernel.shape} ({kernel.T.shape} in torch's layout)")):
        next(wrong.predict(lambda: [{"x": torch.ones(2, 5)}]))


def test_adagrad_and_ftrl_slots_warm_start_when_listed(tmp_path):
    """vars_to_warm_start as a list reaching the slots (TF's rule for
    non-trainable variables): Adagrad's accumulators and Ftrl's two slots
    start as TF left them."""
    recorded = TF["canned"]["wide_deep"]
    prefix = os.path.join(FIXTURES, recorded["prefix"])
    deep, wide = columns()
    features, labels = make_census(50, 1)

    def slots(name, vars_to_warm_start):
        estimator = est.DNNLinearCombinedClassifier(
            model_dir=str(tmp_path / name), linear_feature_columns=wide,
            dnn_feature_columns=deep, dnn_hidden_units=[8, 4],
            linear_optimizer=lambda p: est.optimizers.Ftrl(p, learning_rate=1e-30),
            dnn_optimizer=lambda p: torch.optim.Adagrad(p, lr=0.0,
                                                        initial_accumulator_value=0.1),
            warm_start_from=est.WarmStartSettings(prefix, vars_to_warm_start))
        estimator.train(lambda: [(features, labels)], steps=1)
        return (estimator.get_variable_value("dnn_optimizer/dnn/logits/kernel/sum"),
                estimator.get_variable_value(
                    "linear_optimizer/linear/linear_model/gender/weights/accum"))
    (sum_with, accum_with), (sum_without, accum_without) = slots("a", [".*"]), slots("b", ".*")
    variables = recorded["variables"]
    tf_sum = np.array(variables["dnn/logits/kernel/Adagrad"]["value"], np.float32)
    tf_accum = np.array(variables["linear/linear_model/gender/weights/Ftrl"]["value"],
                        np.float32)
    # the same weights give the same gradient: one step adds the same g**2 to both starts
    np.testing.assert_allclose(sum_with - tf_sum, sum_without - 0.1, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(accum_with - tf_accum, accum_without - 0.1, rtol=1e-4,
                               atol=1e-6)
    assert not np.allclose(tf_sum, 0.1)


def test_a_list_warm_start_past_max_steps_still_saves_the_warm_started_model(tmp_path):
    """TF's list form carries the step (20 here); with max_steps below it no
    step runs, and TF's saver has written the warm-started model at session
    start: so is it here, at the end."""
    recorded = TF["canned"]["dnn"]
    deep, _ = columns()
    estimator = est.DNNClassifier([8, 4], deep, model_dir=str(tmp_path), warm_start_from=(
        est.WarmStartSettings(os.path.dirname(os.path.join(FIXTURES, recorded["prefix"])),
                              [".*"])))
    features, labels = make_census(50, 1)
    estimator.train(lambda: [(features, labels)], max_steps=1)
    assert estimator.latest_checkpoint().endswith("model.ckpt-20")
    np.testing.assert_array_equal(estimator.get_variable_value("dnn/logits/kernel"),
                                  np.array(recorded["variables"]["dnn/logits/kernel"]["value"],
                                           np.float32))


@pytest.mark.parametrize("call", ["train", "evaluate", "predict", "export"])
def test_training_into_a_tf_model_dir_is_an_error_saying_warm_start(tmp_path, call):
    """A port given TF's model_dir as its model_dir (for warm_start_from) trained
    from step 0 without a word and rewrote TF's checkpoint index; evaluate,
    predict and export failed on a file "that does not exist"."""
    import shutil
    recorded = TF["canned"]["linear"]
    tf_dir = str(tmp_path / "tf")
    shutil.copytree(os.path.dirname(os.path.join(FIXTURES, recorded["prefix"])), tf_dir)
    before = {n: open(os.path.join(tf_dir, n), "rb").read() for n in os.listdir(tf_dir)}
    estimator = _build("linear", tf_dir, None)
    features, labels = make_census(64, 1)
    prefix = os.path.join(tf_dir, os.path.basename(recorded["prefix"]))
    with pytest.raises(ValueError, match=f"model_dir {tf_dir} holds TensorFlow's checkpoint "
                       f"{os.path.basename(prefix)}.*warm_start_from='{prefix}'"):
        if call == "train":
            estimator.train(lambda: [(features, labels)], steps=1)
        elif call == "evaluate":
            estimator.evaluate(lambda: [(features, labels)])
        elif call == "predict":
            next(estimator.predict(lambda: [features]))
        else:
            estimator.export_saved_model(str(tmp_path / "export"), lambda: None)
    assert {n: open(os.path.join(tf_dir, n), "rb").read() for n in os.listdir(tf_dir)} == before


with open(os.path.join(FIXTURES, "tf_layer_kernels.json"), encoding="utf-8") as _f:
    LAYERS = json.load(_f)


class _Layers(torch.nn.Module):
    """record_tf_layer_kernels.py's layers, written in torch as a user would."""

    def __init__(self):
        super().__init__()
        self.hidden, self.out = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3)
        self.conv2d, self.conv1d = torch.nn.Conv2d(3, 3, 3), torch.nn.Conv1d(3, 3, 3)
        self.depthwise = torch.nn.Conv2d(3, 6, 3, groups=3)   # TF's depth_multiplier=2

    def forward(self, features):
        images = features["conv2d"].permute(0, 3, 1, 2)   # NHWC -> NCHW
        sequences = features["conv1d"].permute(0, 2, 1)   # NWC -> NCW
        return {"dense": self.out(torch.relu(self.hidden(features["dense"]))),
                "conv2d": self.conv2d(images).permute(0, 2, 3, 1),
                "conv1d": self.conv1d(sequences).permute(0, 2, 1),
                "depthwise": self.depthwise(
                    features["depthwise"].permute(0, 3, 1, 2)).permute(0, 2, 3, 1)}


def test_torch_layers_warm_started_from_tf_layers_compute_what_tf_computed(tmp_path):
    """torch.nn.Linear/Conv1d/Conv2d weights take TF's kernels in torch's
    layout even where the shapes cannot tell them apart (a square dense
    kernel; a 3x3 conv kernel from 3 to 3 channels): the layer type says. A
    convolution with a group per input channel takes TF's depthwise kernel
    [h, w, in, multiplier] (it was permuted as an ordinary one and refused;
    EfficientNet port probe)."""
    names = {f"layers/{layer}/{ours}": f"{layer}/{theirs}"
             for layer in ("hidden", "out", "conv2d", "conv1d")
             for ours, theirs in (("weight", "kernel"), ("bias", "bias"))}
    names.update({"layers/depthwise/weight": "depthwise/depthwise_kernel",
                  "layers/depthwise/bias": "depthwise/bias"})
    settings = est.WarmStartSettings(os.path.join(FIXTURES, LAYERS["prefix"]),
                                     var_name_to_prev_var_name=names)

    def model_fn(features, labels, mode):
        outputs = est.get_module("layers", _Layers)(features)
        return est.EstimatorSpec(mode, predictions=outputs)
    estimator = est.Estimator(model_fn, model_dir=str(tmp_path), warm_start_from=settings)
    inputs = {k: np.array(v, np.float32) for k, v in LAYERS["inputs"].items()}
    predicted = list(estimator.predict(lambda: [inputs], yield_single_examples=False))[0]
    for key, expected in LAYERS["outputs"].items():
        np.testing.assert_allclose(predicted[key], np.array(expected, np.float32),
                                   rtol=1e-5, atol=1e-6, err_msg=key)


with open(os.path.join(FIXTURES, "tf_warm_start_scope.json"), encoding="utf-8") as _f:
    SCOPE = json.load(_f)


@pytest.mark.parametrize("form", sorted(SCOPE["warm_started"]))
def test_a_regex_warm_starts_trainable_variables_only_as_tf(form, tmp_path):
    """vars_to_warm_start as a regex reaches the trainable variables only, as
    TF's (TRAINABLE_VARIABLES): batch norm's moving statistics keep their
    initial values; as a list it reaches every variable. Before, a regex
    took the moving statistics too and predicted other probabilities than
    TF's warm-started model."""
    recorded = SCOPE["warm_started"][form]
    deep, _ = columns()
    warm = est.WarmStartSettings(os.path.join(FIXTURES, SCOPE["prefix"]),
                                 vars_to_warm_start=recorded["vars_to_warm_start"])
    estimator = est.DNNClassifier([8, 4], deep, model_dir=str(tmp_path), batch_norm=True,
                                  warm_start_from=warm)
    rows = {k: v[:8] for k, v in make_census(200, 1)[0].items()}
    got = np.stack([p["probabilities"] for p in estimator.predict(lambda: [(rows, None)])])
    np.testing.assert_allclose(got, np.array(recorded["probabilities"]), rtol=1e-4, atol=1e-7)


def test_warm_start_from_a_tf_saved_model_directory_takes_its_variables(tmp_path):
    """warm_start_from naming a TF SavedModel directory warm-starts from its
    variables/variables, as TF's Estimator does (an export being what a TF1
    pipeline often keeps); before, no checkpoint was found there."""
    with open(os.path.join(FIXTURES, "tf_warm_start_saved_model.json"), encoding="utf-8") as f:
        recorded = json.load(f)
    deep, _ = columns()
    estimator = est.DNNClassifier([8, 4], deep, model_dir=str(tmp_path),
                                  warm_start_from=os.path.join(FIXTURES, recorded["export_dir"]))
    rows = {k: v[:8] for k, v in make_census(200, 1)[0].items()}
    got = np.stack([p["probabilities"] for p in estimator.predict(lambda: [(rows, None)])])
    np.testing.assert_allclose(got, np.array(recorded["probabilities"]), rtol=1e-5, atol=1e-6)


def test_warm_start_from_one_of_our_exports_says_to_use_its_model_dir(tmp_path):
    def model_fn(features, labels, mode):
        net = est.get_module("net", lambda: torch.nn.Linear(2, 1))
        predictions = net(features["x"])
        loss = None if labels is None else ((predictions - labels) ** 2).mean()
        return est.EstimatorSpec(mode, predictions={"y": predictions}, loss=loss,
                                 train_op=est.get_optimizer(FROZEN))
    trained = est.Estimator(model_fn, model_dir=str(tmp_path / "run"))
    trained.train(lambda: [({"x": torch.ones(4, 2)}, torch.ones(4, 1))] * 3, max_steps=3)
    export = trained.export_saved_model(str(tmp_path / "export"),
                                        est.export.build_raw_serving_input_receiver_fn(
                                            {"x": torch.zeros(1, 2)}))
    warm = est.Estimator(model_fn, model_dir=str(tmp_path / "new"), warm_start_from=export)
    with pytest.raises(ValueError, match=r"warm_start_from: .*it is an export \(model\.pt2\), "
                                         r".*model_dir it was exported from .*step 3\)"):
        warm.train(lambda: [({"x": torch.ones(4, 2)}, torch.ones(4, 1))], max_steps=1)


def test_an_experiment_warm_starts_from_a_tf_saved_model_directory(tmp_path):
    """YAML's `warm_start: <path>` is warm_start_from=<path>: a SavedModel too."""
    from estimator import experiment
    with open(os.path.join(FIXTURES, "tf_warm_start_saved_model.json"), encoding="utf-8") as f:
        export_dir = os.path.join(FIXTURES, json.load(f)["export_dir"])
    path = tmp_path / "exp.yaml"
    (tmp_path / "mod.py").write_text("def model_fn(features, labels, mode): pass\n"
                                     "def input_fn(): pass\n")
    path.write_text("model_fn: mod.py:model_fn\n"
                    "train_spec: {input_fn: mod.py:input_fn, max_steps: 1}\n"
                    f"run_config: {{model_dir: run}}\nwarm_start: {export_dir}\n")
    settings = experiment.load(str(path)).warm_start_settings()
    from estimator.warm_start import _WarmStarter
    assert _WarmStarter(settings).path == os.path.join(export_dir, "variables", "variables")


with open(os.path.join(FIXTURES, "tf_warm_start_missing.json"), encoding="utf-8") as _f:
    MISSING = json.load(_f)


class _Bias(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(n))


@pytest.mark.parametrize("case", sorted(MISSING["cases"]))
def test_a_selected_variable_missing_from_the_checkpoint_is_an_error_as_tf(case, tmp_path):
    """record_tf_warm_start_missing.py: a variable the settings select (a
    regex, the default ".*" included, or a list) that the checkpoint does not
    hold, or a renaming to a name it does not hold (a typo), is TF's
    ValueError. Before, a regex only logged a warning and left the variable
    at its initial value: a BERT port's typo in a renaming trained from a
    random pooler without a word."""
    recorded = MISSING["cases"][case]

    def model_fn(features, labels, mode):
        hidden = est.get_module("hidden", lambda: torch.nn.Linear(4, 4))
        new = est.get_module("new", lambda: _Bias(3))
        loss = (hidden(features["x"]).sum() + new.bias.sum()) * 0.0
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(FROZEN))
    settings = est.WarmStartSettings(
        os.path.join(FIXTURES, LAYERS["prefix"]),
        vars_to_warm_start=recorded["vars_to_warm_start"],
        var_name_to_prev_var_name=dict(recorded["var_name_to_prev_var_name"],
                                       **{"hidden/weight": "hidden/kernel"}))
    estimator = est.Estimator(model_fn, model_dir=str(tmp_path), warm_start_from=settings)

    def train():
        estimator.train(lambda: [({"x": torch.ones(1, 4)}, None)], max_steps=1)
    if recorded["error"] is None:
        train()
        np.testing.assert_allclose(estimator.get_variable_value("hidden/bias"),
                                   recorded["hidden/bias"], rtol=1e-6)
        return
    kind, message = recorded["error"]
    assert kind == "ValueError"
    missing = message.split()[1]   # "Tensor <name> is not found in CKPT"
    with pytest.raises(ValueError, match=rf"tensor '{missing}' .*is not found in checkpoint"):
        train()
    assert not os.path.exists(os.path.join(tmp_path, "checkpoint"))   # nothing written


class _LazyDense(torch.nn.Module):
    """record_tf_layer_kernels.py's dense layers with torch.nn.LazyLinear, as
    migration.md suggests for tf.layers.dense(units) (no input size given)."""

    def __init__(self):
        super().__init__()
        self.hidden, self.out = torch.nn.LazyLinear(4), torch.nn.LazyLinear(3)

    def forward(self, features):
        return {"dense": self.out(torch.relu(self.hidden(features["dense"])))}


def test_lazy_layers_warm_start_once_their_first_batch_makes_them(tmp_path):
    """A LazyLinear has no weight to copy into until its first batch: it is
    warm-started as that batch makes it, before it computes (the first
    prediction is TF's). Before: a RuntimeError (uninitialized parameter)."""
    names = {f"layers/{layer}/{ours}": f"{layer}/{theirs}" for layer in ("hidden", "out")
             for ours, theirs in (("weight", "kernel"), ("bias", "bias"))}
    settings = est.WarmStartSettings(os.path.join(FIXTURES, LAYERS["prefix"]),
                                     var_name_to_prev_var_name=names)

    def model_fn(features, labels, mode):
        return est.EstimatorSpec(mode, predictions=est.get_module("layers", _LazyDense)(features))
    estimator = est.Estimator(model_fn, model_dir=str(tmp_path), warm_start_from=settings)
    inputs = {"dense": np.array(LAYERS["inputs"]["dense"], np.float32)}
    predicted = list(estimator.predict(lambda: [inputs], yield_single_examples=False))[0]
    np.testing.assert_allclose(predicted["dense"], np.array(LAYERS["outputs"]["dense"],
                                                            np.float32), rtol=1e-5, atol=1e-6)


def test_a_list_warm_start_of_torchs_batch_norm_from_tf_leaves_its_batch_counter(tmp_path):
    """torch's BatchNorm has `num_batches_tracked`, which no TF variable
    holds: a list warm start (every variable, TF's form) failed on it as
    'not found in checkpoint'."""
    prefix = "dnn/hiddenlayer_0/batchnorm_0/"
    path = os.path.join(FIXTURES, "tf_ckpt", "dnn_batch_norm")
    moving_mean = est.checkpoint.load_variable(path, prefix + "moving_mean")

    def model_fn(features, labels, mode):
        bn = est.get_module("bn", lambda: torch.nn.BatchNorm1d(len(moving_mean)))
        return est.EstimatorSpec(mode, predictions={"y": bn(features["x"])})
    renamed = {f"bn/{ours}": prefix + theirs for ours, theirs in (
        ("weight", "gamma"), ("bias", "beta"), ("running_mean", "moving_mean"),
        ("running_var", "moving_variance"))}
    estimator = est.Estimator(model_fn, str(tmp_path), warm_start_from=est.WarmStartSettings(
        path, vars_to_warm_start=["bn/.*"], var_name_to_prev_var_name=renamed))
    x = np.zeros((2, len(moving_mean)), np.float32)
    got = next(iter(estimator.predict(lambda: [{"x": x}])))["y"]
    gamma, beta, var = (est.checkpoint.load_variable(path, prefix + n)
                        for n in ("gamma", "beta", "moving_variance"))
    np.testing.assert_allclose(got, (0 - moving_mean) / np.sqrt(var + 1e-5) * gamma + beta,
                               rtol=1e-5)
