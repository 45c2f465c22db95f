"""What ported TF1 programs do with inputs, outputs and set-up (issue 12):
string features and string predictions, float64 from pandas-like numpy,
console logging without set-up, float `max_steps`, `export_savedmodel`,
`export_outputs` signatures and a callable `train_op` with two optimizers."""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import estimator as est
from paths import ROOT, SUPPORT

VOCAB = ["setosa", "versicolor", "virginica"]
rng = np.random.RandomState(0)
X64 = rng.randn(30, 3)                               # float64, as pandas gives
Y = rng.randint(0, 3, 30)
COLOR = np.array(["red", "green", "blue"])[rng.randint(0, 3, 30)]   # numpy str array
KEYS = [f"row-{i}" for i in range(30)]               # a list of str, forwarded


def model_fn(features, labels, mode):
    assert features["x"].dtype == torch.float32      # numpy float64 -> float32
    assert isinstance(features["color"], np.ndarray) and features["color"].dtype.kind == "U"
    assert isinstance(features["key"], list) and isinstance(features["key"][0], str)
    color = torch.as_tensor([["red", "green", "blue"].index(c) for c in features["color"]])
    emb = est.get_module("color", lambda: torch.nn.Embedding(3, 2))
    net = est.get_module("net", lambda: torch.nn.Linear(5, 3))
    logits = net(torch.cat([features["x"], emb(color)], -1))
    if mode == est.ModeKeys.PREDICT:
        ids = logits.argmax(-1)
        return est.EstimatorSpec(mode, predictions={
            "class_ids": ids, "classes": [VOCAB[i] for i in ids.tolist()],
            "key": features["key"]})
    loss = torch.nn.functional.cross_entropy(logits, labels)
    opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
    return est.EstimatorSpec(mode, loss=loss, train_op=opt)


def input_fn(labels=True):
    def fn():
        out = []
        for i in range(0, 30, 8):   # uneven: 8, 8, 8, 6
            f = {"x": X64[i:i + 8], "color": COLOR[i:i + 8], "key": KEYS[i:i + 8]}
            out.append((f, Y[i:i + 8]) if labels else f)
        return out * 3 if labels else out
    return fn


def test_strings_pass_to_model_fn_and_come_back_from_predict(tmp_path):
    e = est.Estimator(model_fn, model_dir=str(tmp_path / "m"))
    e.train(input_fn(), max_steps=8.0)                # an integral float, as TF takes
    assert est.checkpoint.step_of(e.latest_checkpoint()) == 8
    preds = list(e.predict(input_fn(labels=False)))
    assert [p["key"] for p in preds] == [k.encode() for k in KEYS]   # as TF's, bytes
    assert all(p["classes"] == VOCAB[p["class_ids"]].encode() for p in preds)
    batch = next(e.predict(input_fn(labels=False), yield_single_examples=False))
    assert batch["classes"].dtype == object and batch["classes"].shape == (8,)


@pytest.mark.parametrize("bad, what", [
    (np.array([1, "a", None], dtype=object), r"features\['bad'\].*object array holding "
                                               r"NoneType, int, str"),
    (np.array(["2024-01-01"] * 3, dtype="datetime64[D]"),
     r"features\['bad'\].*dtype datetime64\[D\]"),
])
def test_a_feature_that_cannot_be_moved_is_named(tmp_path, bad, what):
    def fn(features, labels, mode):
        raise AssertionError("not reached")
    e = est.Estimator(fn, model_dir=str(tmp_path / "m"))
    with pytest.raises(TypeError, match=what):
        e.train(lambda: [({"x": np.zeros((3, 2)), "bad": bad}, np.zeros(3))], steps=1)


def test_float64_labels_become_float32_and_torch_tensors_keep_their_dtype(tmp_path):
    seen = []

    def fn(features, labels, mode):
        seen.append((features["np"].dtype, features["t"].dtype, labels.dtype))
        net = est.get_module("net", lambda: torch.nn.Linear(1, 1))
        loss = (net(features["np"]) - labels).pow(2).mean() + 0 * features["t"].sum()
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.1)))
    e = est.Estimator(fn, model_dir=str(tmp_path / "m"))
    e.train(lambda: [({"np": np.ones((4, 1)), "t": torch.ones(4, dtype=torch.float64)},
                      np.ones((4, 1)))], steps=1)
    assert seen == [(torch.float32, torch.float64, torch.float32)]


def test_max_steps_must_be_integral():
    assert est.TrainSpec(lambda: [], max_steps=250.0).max_steps == 250
    assert isinstance(est.TrainSpec(lambda: [], max_steps=np.float64(250)).max_steps, int)
    with pytest.raises(TypeError, match="max_steps.*250.5"):
        est.TrainSpec(lambda: [], max_steps=250.5)
    e = est.Estimator(model_fn)
    with pytest.raises(TypeError, match="steps.*2.5"):
        e.train(input_fn(), steps=2.5)


_LOGGING = r"""
import sys, logging
sys.path[:0] = [{root!r}, {tests!r}]
import estimator as est
from models import regression_model_fn, regression_input_fn
if {configure}:
    logging.basicConfig(level=logging.WARNING)
e = est.Estimator(regression_model_fn, config=est.RunConfig(model_dir={model_dir!r},
                  log_step_count_steps=5), params={{}})
e.train(regression_input_fn(), steps=10)
print(e.evaluate(regression_input_fn(repeat=False)))
"""


@pytest.mark.parametrize("configure", [False, True])
def test_console_logging_by_default_unless_the_program_configured_it(tmp_path, configure):
    script = _LOGGING.format(root=ROOT, tests=SUPPORT, configure=configure,
                             model_dir=str(tmp_path / "m"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    shown = [ln for ln in lines if "basic_session_run_hooks:loss = " in ln]
    evaluated = [ln for ln in lines if "Saving dict for global step 10" in ln]
    if configure:   # the program's WARNING level rules: no INFO line, none twice
        assert not shown and not evaluated, done.stderr
    else:
        assert len(shown) == 2 and len(evaluated) == 1, done.stderr
        assert shown[0].startswith("INFO:hooks.basic_session_run_hooks:loss = ")


# -- export_outputs: named serving signatures -------------------------------------------
def signature_model_fn(features, labels, mode, params):
    net = est.get_module("net", lambda: torch.nn.Linear(3, 3))
    logits = net(features["x"])
    probabilities = logits.softmax(-1)
    if mode == est.ModeKeys.PREDICT:
        outputs = params.get("outputs", "all")
        export_outputs = {
            "serving_default": est.export.ClassificationOutput(scores=probabilities,
                                                               classes=logits.argmax(-1)),
            "regress": est.export.RegressionOutput(logits[:, 0]),
            "predict": est.export.PredictOutput({"logits": logits}),
        } if outputs == "all" else outputs(logits)
        return est.EstimatorSpec(mode, predictions={"probabilities": probabilities},
                                 export_outputs=export_outputs)
    loss = torch.nn.functional.cross_entropy(logits, labels)
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=0.1)))


def _trained(tmp_path, **params):
    e = est.Estimator(signature_model_fn, model_dir=str(tmp_path / "sig"), params=params)
    e.train(lambda: [({"x": X64[:8]}, Y[:8])], steps=2)
    return e


RECEIVER = est.export.build_raw_serving_input_receiver_fn({"x": torch.zeros(2, 3)})


def test_export_outputs_are_the_signatures_of_the_export(tmp_path):
    e = _trained(tmp_path)
    export_dir = e.export_saved_model(str(tmp_path / "export"), RECEIVER)
    served = est.export.load(export_dir)
    assert set(served.signatures) == {"serving_default", "regress", "predict"}
    x = torch.as_tensor(X64[:5], dtype=torch.float32)
    probs = np.stack([p["probabilities"] for p in e.predict(lambda: [{"x": X64[:5]}])])
    default = served.signatures["serving_default"](x=x)
    np.testing.assert_allclose(default["scores"].numpy(), probs, rtol=1e-5)
    np.testing.assert_array_equal(default["classes"].numpy(), probs.argmax(-1))
    logits = served.signatures["predict"](x=x)["logits"]
    torch.testing.assert_close(served.signatures["regress"](x=x)["outputs"], logits[:, 0])
    raw = torch.export.load(os.path.join(export_dir, "model.pt2")).module()(x=x)
    assert set(raw) == {"serving_default", "regress", "predict"}    # torch alone
    sig = served.signature["signatures"]
    assert sig["regress"]["method_name"] == "tensorflow/serving/regress"
    assert [o["name"] for o in sig["serving_default"]["outputs"]] == ["scores", "classes"]


def test_one_export_output_is_also_the_default_and_none_serves_predictions(tmp_path):
    e = _trained(tmp_path, outputs=lambda logits: {"pred": est.export.PredictOutput(logits)})
    served = est.export.load(e.export_saved_model(str(tmp_path / "a"), RECEIVER))
    assert set(served.signatures) == {"pred", "serving_default"}
    assert set(served.signatures["serving_default"](x=torch.ones(2, 3))) == {"output"}
    plain = _trained(tmp_path, outputs=lambda logits: None)
    served = est.export.load(plain.export_saved_model(str(tmp_path / "b"), RECEIVER))
    assert set(served.signatures) == {"serving_default"}
    assert set(served.signatures["serving_default"](x=torch.ones(2, 3))) == {"probabilities"}


@pytest.mark.parametrize("outputs, error", [
    (lambda logits: {"a": est.export.PredictOutput(logits),
                     "b": est.export.PredictOutput(logits)}, "none of them is specified"),
    (lambda logits: {"a": logits}, r"export_outputs\['a'\] must be an est.export"),
    (lambda logits: [logits], "export_outputs. must be a dict"),
    (lambda logits: {"r": est.export.RegressionOutput(logits.argmax(-1))}, "float tensor"),
    (lambda logits: {"c": est.export.ClassificationOutput()}, "at least one of scores"),
])
def test_bad_export_outputs_are_clear_errors(tmp_path, outputs, error):
    e = _trained(tmp_path, outputs=outputs)
    with pytest.raises((TypeError, ValueError), match=error):
        e.export_saved_model(str(tmp_path / "export"), RECEIVER)
    assert not os.path.exists(tmp_path / "export") or not os.listdir(tmp_path / "export")


# -- a callable train_op: the documented contract ---------------------------------------
def test_callable_train_op_with_two_optimizers(tmp_path):
    """DNNLinearCombined's shape: two optimizers over two parts of the model.
    The callable is called with no arguments after model_fn; it back-propagates,
    steps and zeroes; the framework counts the global step, once per step."""
    calls = []

    def fn(features, labels, mode):
        linear = est.get_module("linear", lambda: torch.nn.Linear(3, 3))
        dnn = est.get_module("dnn", lambda: torch.nn.Sequential(
            torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)))
        loss = torch.nn.functional.cross_entropy(linear(features["x"]) + dnn(features["x"]),
                                                 labels)
        lin_opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.2, momentum=0.9),
                                    name="linear_opt",
                                    var_list=linear)
        dnn_opt = est.get_optimizer(lambda p: torch.optim.Adagrad(p, lr=0.05,
                                                                  initial_accumulator_value=0.1),
                                    name="dnn_opt", var_list=dnn)

        def train_op():
            calls.append(est.get_global_step())
            loss.backward()
            lin_opt.step()
            dnn_opt.step()
            lin_opt.zero_grad(set_to_none=True)
            dnn_opt.zero_grad(set_to_none=True)
        return est.EstimatorSpec(mode, loss=loss, train_op=train_op)

    e = est.Estimator(fn, model_dir=str(tmp_path / "m"), config=est.RunConfig(
        tf_random_seed=0))
    e.train(input_fn(), steps=6)
    assert calls == [0, 1, 2, 3, 4, 5]     # the global step before each step
    assert est.checkpoint.step_of(e.latest_checkpoint()) == 6
    names = e.get_variable_names()
    assert "linear_opt/linear/weight/momentum_buffer" in names
    assert any(n.startswith("dnn_opt/") and n.endswith("sum") for n in names)
    e.train(input_fn(), steps=2)            # resumes both optimizers
    assert calls[-2:] == [6, 7]


def test_a_train_op_that_does_not_zero_its_gradients_trains_as_one_that_does(tmp_path):
    """TF1's apply_gradients has nothing to zero, so a port's train_op may
    read `loss.backward(); opt.step()`. Before, the gradients then added up
    across steps (and not under central storage, whose steps replace them):
    now each step's gradients are its own, freed after the train_op, as in TF.
    Gradients the model_fn itself computed still reach the train_op."""
    def model_fn(zeroes, backward_in_model_fn=False):
        def fn(features, labels, mode):
            net = est.get_module("net", lambda: torch.nn.Linear(3, 3))
            loss = torch.nn.functional.cross_entropy(net(features["x"]), labels)
            opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
            if backward_in_model_fn:
                loss.backward()

            def train_op():
                if not backward_in_model_fn:
                    loss.backward()
                opt.step()
                if zeroes:
                    opt.zero_grad()
            return est.EstimatorSpec(mode, loss=loss, train_op=train_op)
        return fn

    def trained(name, *args):
        e = est.Estimator(model_fn(*args), model_dir=str(tmp_path / name),
                          config=est.RunConfig(tf_random_seed=0))
        e.train(input_fn(), steps=6)
        return e.get_variable_value("net/weight")
    zeroing = trained("zeroes", True)
    np.testing.assert_allclose(trained("forgets", False), zeroing, rtol=1e-6)
    np.testing.assert_allclose(trained("in_model_fn", False, True), zeroing, rtol=1e-6)


def _optimizer_built_in_model_fn(features, labels, mode):
    """TF1's `tf.train.AdamOptimizer(lr).minimize(loss)` ported literally: a
    new Adam every step, its moments starting over, nothing saved."""
    net = est.get_module("net", lambda: torch.nn.Linear(3, 3))
    loss = torch.nn.functional.cross_entropy(net(features["x"]), labels)
    return est.EstimatorSpec(mode, loss=loss,
                             train_op=torch.optim.Adam(net.parameters(), lr=0.01))


def _layer_built_in_model_fn(features, labels, mode):
    """TF1's `tf.layers.dense(h, 3)` ported literally as `torch.nn.Linear(8, 3)(h)`:
    a new, random layer every step, never trained nor saved."""
    body = est.get_module("body", lambda: torch.nn.Linear(3, 8))
    logits = torch.nn.Linear(8, 3)(torch.relu(body(features["x"])))
    loss = torch.nn.functional.cross_entropy(logits, labels)
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=0.1)))


@pytest.mark.parametrize("model_fn, error", [
    (_optimizer_built_in_model_fn,
     r"the Adam was not made by est.get_optimizer.*new one each step.*"
     r"est.get_optimizer\(lambda params: torch.optim.Adam\(params, ...\)\)"),
    (_layer_built_in_model_fn,
     r"The loss depends on parameters not made by est.get_module \(shapes \(3, 8\), "
     r"\(3,\)\).*est.get_module\(name, "),
], ids=["optimizer", "layer"])
def test_an_optimizer_or_layer_built_in_the_model_fn_is_refused(tmp_path, model_fn, error):
    """Both trained silently (before); now the first step refuses them, saying
    to build them once with est.get_optimizer / est.get_module."""
    e = est.Estimator(model_fn, model_dir=str(tmp_path / "m"))
    with pytest.raises(ValueError, match=error):
        e.train(input_fn(), steps=2)
    assert e.latest_checkpoint() is None


def test_two_optimizers_under_one_default_name_are_refused(tmp_path):
    """TF1's GAN shape: `AdamOptimizer().minimize(g_loss, var_list=g_vars)` and
    again for the discriminator, two optimizers. Ported without names, the
    second get_optimizer returned the first (over the generator): the
    discriminator never trained and the generator stepped twice, silently.
    Now refused at the first step, naming the fix; named, both train."""
    def model_fn(names):
        def fn(features, labels, mode):
            gen = est.get_module("gen", lambda: torch.nn.Linear(3, 3))
            disc = est.get_module("disc", lambda: torch.nn.Linear(3, 1))
            g_opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1), var_list=[gen],
                                      **names[0])
            d_opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1), var_list=[disc],
                                      **names[1])
            loss = disc(gen(features["x"])).pow(2).mean()

            def train_op():
                g_opt.zero_grad()
                d_opt.zero_grad()
                loss.backward()
                g_opt.step()
                d_opt.step()
            return est.EstimatorSpec(mode, loss=loss, train_op=train_op)
        return fn

    bad = est.Estimator(model_fn([{}, {}]), model_dir=str(tmp_path / "bad"))
    with pytest.raises(ValueError, match=r"get_optimizer\(name='optimizer'\) was built over "
                                         r"other variables than this call's var_list.*two "
                                         r"names"):
        bad.train(input_fn(), steps=2)
    good = est.Estimator(model_fn([{"name": "g"}, {"name": "d"}]),
                         model_dir=str(tmp_path / "good"), config=est.RunConfig(tf_random_seed=0))
    good.train(input_fn(), steps=2)
    torch.manual_seed(0)
    initial = {"gen": torch.nn.Linear(3, 3), "disc": torch.nn.Linear(3, 1)}
    for module, layer in initial.items():
        assert not np.allclose(good.get_variable_value(f"{module}/weight"),
                               layer.weight.detach().numpy())


@pytest.mark.parametrize("wrap", ["module_list", "parameters", "module_dict"])
def test_a_var_list_made_anew_each_call_names_the_same_variables(tmp_path, wrap):
    """`var_list=torch.nn.ModuleList([...])` (the NCF port's) was refused from
    the second step as "other variables" (a new container each call);
    `net.parameters()`, a generator, failed outright."""
    made = []

    def model_fn(features, labels, mode):
        gen = est.get_module("gen", lambda: torch.nn.Linear(3, 3))
        disc = est.get_module("disc", lambda: torch.nn.Linear(3, 1))
        var_list = {"module_list": lambda: torch.nn.ModuleList([gen, disc]),
                    "parameters": lambda: itertools.chain(gen.parameters(), disc.parameters()),
                    "module_dict": lambda: torch.nn.ModuleDict({"g": gen, "d": disc})}[wrap]()
        made.append(var_list)   # (kept, as a model's attribute would: no id is reused)
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1), var_list=var_list)
        if est.get_global_step() == 2:   # another list under the same name: still refused
            est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1),
                              var_list=torch.nn.ModuleList([gen]))
        return est.EstimatorSpec(mode, loss=disc(gen(features["x"])).pow(2).mean(), train_op=opt)
    e = est.Estimator(model_fn, model_dir=str(tmp_path))
    with pytest.raises(ValueError, match="other variables than this call's var_list"):
        e.train(input_fn(), steps=4)
    assert len(made) == 3   # refused at step 2 only


def _rewriting_model_fn(features, labels, mode, params):
    """Rewrites its params, as TF1 programs may (TF gives each graph a copy):
    a flag string parsed into a list, a learning rate scaled."""
    params["hidden_units"] = [int(u) for u in params["hidden_units"].split(",")]
    params["learning_rate"] = params["learning_rate"] * 2
    net = est.get_module("net", lambda: torch.nn.Sequential(
        torch.nn.Linear(3, params["hidden_units"][0]), torch.nn.ReLU(),
        torch.nn.Linear(params["hidden_units"][0], 3)))
    logits = net(features["x"])
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"logits": logits})
    loss = torch.nn.functional.cross_entropy(logits, labels)
    opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
    for group in opt.param_groups:
        group["lr"] = params["learning_rate"]
    return est.EstimatorSpec(mode, loss=loss, train_op=opt)


def _fixed_model_fn(features, labels, mode, params):
    """The same program with the rewritten values given."""
    return _rewriting_model_fn(features, labels, mode, dict(
        params, hidden_units=",".join(map(str, params["hidden_units"])),
        learning_rate=params["learning_rate"] / 2))


def _params_input_fn(params):
    params["batch_size"] = int(params.pop("batch"))   # an input_fn may rewrite them too
    return [({"x": X64[i:i + 8]}, Y[i:i + 8]) for i in range(0, 30, params["batch_size"])]


def test_a_model_fn_rewriting_its_params_sees_the_given_ones_every_step(tmp_path):
    """TF calls model_fn once per graph with a copy of params; here it runs
    every step. Before: the second step split a list (AttributeError) and a
    scaled learning rate doubled at every step, silently."""
    given = {"hidden_units": "4", "learning_rate": 0.05, "batch": "8"}
    seeded = est.RunConfig(tf_random_seed=1)
    e = est.Estimator(_rewriting_model_fn, model_dir=str(tmp_path / "a"), params=given,
                      config=seeded)
    e.train(_params_input_fn, steps=8)
    assert e.params == given
    fixed = est.Estimator(_fixed_model_fn, model_dir=str(tmp_path / "b"), params={
        "hidden_units": [4], "learning_rate": 0.1, "batch": "8"}, config=seeded)
    fixed.train(_params_input_fn, steps=8)
    a, b = est.Estimator.get_variable_value, est.Estimator.get_variable_value
    for name in e.get_variable_names():
        if name.startswith("net/"):
            np.testing.assert_allclose(a(e, name), b(fixed, name), rtol=1e-6, err_msg=name)
    assert e.evaluate(_params_input_fn)["loss"] == pytest.approx(
        fixed.evaluate(_params_input_fn)["loss"], rel=1e-6)
    assert len(list(e.predict(lambda params: [{"x": X64[:4]}]))) == 4
