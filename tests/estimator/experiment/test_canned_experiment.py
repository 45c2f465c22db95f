"""Canned estimators in YAML experiments: `estimator: {Name: {arguments}}`
instead of `model_fn:`, feature columns from a function named by import path."""
import os
import sys

import numpy as np
import pytest

from estimator import experiment
from estimator.experiment import ExperimentError, cli
from paths import ROOT

MODULE = '''
import numpy as np
import estimator as est


def columns():
    return [est.feature_column.numeric_column("x")]


def input_fn(mode):
    x = np.linspace(-1, 1, 64).astype(np.float32)
    y = (x > 0).astype(np.int64)
    batches = [({"x": x[i:i + 16]}, y[i:i + 16]) for i in range(0, 64, 16)]
    return batches * 20 if mode == est.ModeKeys.TRAIN else batches


def takes_an_argument(n):
    return []


def build_estimator(nbuckets, config):
    """A Cloud ML trainer's build_estimator: columns by its argument, a metric added."""
    x = est.feature_column.numeric_column("x")
    buckets = est.feature_column.bucketized_column(x, list(np.linspace(-1, 1, nbuckets)))
    estimator = est.LinearClassifier([buckets], config=config)

    def buckets_used(features):
        return {"buckets": est.metrics.mean(features["x"] * 0 + nbuckets)}
    return est.add_metrics(estimator, buckets_used)


def takes_no_config(nbuckets):
    return est.LinearClassifier([est.feature_column.numeric_column("x")])


def forgets_to_return(nbuckets, config):
    est.LinearClassifier([est.feature_column.numeric_column("x")], config=config)
'''
HEAD = """estimator:
  LinearClassifier:
    feature_columns: mod.py:columns
train_spec:
  input_fn: mod.py:input_fn
  max_steps: 40
eval_spec:
  input_fn: mod.py:input_fn
  throttle_secs: 0
"""


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "mod.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))   # (before another test's mod.py)
    sys.modules.pop("mod", None)
    yield tmp_path
    sys.modules.pop("mod", None)


def write(workdir, text):
    path = workdir / "exp.yaml"
    path.write_text(text)
    return str(path)


def test_a_canned_estimator_runs_from_yaml(workdir):
    path = write(workdir, HEAD + "run_config: {model_dir: run, tf_random_seed: 1}\n")
    exp = experiment.load(path)
    estimator = exp.estimator()
    import estimator as est
    assert type(estimator) is est.LinearClassifier
    assert estimator.config.tf_random_seed == 1
    assert cli.main(["run", path, "-q"]) == 0
    results = est.LinearClassifier([est.feature_column.numeric_column("x")],
                                   model_dir=str(workdir / "run")).evaluate(
        lambda: __import__("mod").input_fn("eval"))
    assert results["global_step"] == 40 and results["accuracy"] > 0.9


def test_boosted_trees_run_from_yaml_and_stop_when_grown(workdir):
    """A canned estimator that ends its training itself: `estimator run`
    stops at the trees' last layer (2 trees of 2 layers, a layer from 4
    batches: 16 steps), not at max_steps, and evaluates that checkpoint."""
    text = HEAD.replace("  LinearClassifier:\n    feature_columns: mod.py:columns\n",
                        "  BoostedTreesClassifier:\n    feature_columns: mod.py:bucketized\n"
                        "    n_batches_per_layer: 4\n    n_trees: 2\n    max_depth: 2\n")
    (workdir / "mod.py").write_text(MODULE + """

def bucketized():
    x = est.feature_column.numeric_column("x")
    return [est.feature_column.bucketized_column(x, [-0.5, 0.0, 0.5])]
""")
    path = write(workdir, text + "run_config: {model_dir: run}\n")
    assert cli.main(["run", path, "-q"]) == 0
    import estimator as est
    from hooks.event_files import read_scalars
    assert est.checkpoint.latest_checkpoint(str(workdir / "run")).endswith("model.ckpt-16")
    scalars = read_scalars(str(workdir / "run" / "eval" / "*tfevents*"))
    assert list(scalars) == [16] and scalars[16]["accuracy"] == 1.0


def test_kmeans_runs_from_yaml_with_its_initial_centers(workdir):
    """est.KMeansClustering by name: `initial_clusters` a YAML list, an
    input_fn of points alone (no labels); the evaluation's score is TF's
    mean of each batch's sum of squared distances."""
    text = HEAD.replace("  LinearClassifier:\n    feature_columns: mod.py:columns\n",
                        "  KMeansClustering:\n    num_clusters: 2\n"
                        "    initial_clusters: [[-0.5], [0.5]]\n    use_mini_batch: false\n"
                        ).replace("mod.py:input_fn", "mod.py:points")
    (workdir / "mod.py").write_text(MODULE + """

def points(mode):
    x = np.linspace(-1, 1, 64).astype(np.float32)
    if mode == "train":   # (full-batch k-means: each step all the points)
        return [x[:, None]] * 40
    return [x[i:i + 16, None] for i in range(0, 64, 16)]
""")
    path = write(workdir, text + "run_config: {model_dir: run}\n")
    assert cli.main(["run", path, "-q"]) == 0
    import estimator as est
    from hooks.event_files import read_scalars
    kmeans = est.KMeansClustering(2, model_dir=str(workdir / "run"))
    centers = sorted(kmeans.cluster_centers()[:, 0].tolist())
    assert centers == pytest.approx([-0.5079365, 0.5079365], abs=1e-5)   # each half's mean
    scalars = read_scalars(str(workdir / "run" / "eval" / "*tfevents*"))
    x = np.linspace(-1, 1, 64).astype(np.float32)
    sums = [float(((b[:, None] - np.array(centers)[None]) ** 2).min(1).sum())
            for b in np.split(x, 4)]
    assert scalars[40]["score"] == pytest.approx(np.mean(sums), rel=1e-5)


def test_linear_sdca_from_yaml(workdir):
    """optimizer: {LinearSDCA: {...}} (TF's tf.estimator.experimental.LinearSDCA
    object); a misspelled argument is named with its line."""
    text = HEAD.replace("    feature_columns: mod.py:columns\n",
                        "    feature_columns: mod.py:columns\n    optimizer:\n"
                        "      LinearSDCA: {example_id_column: id, "
                        "symmetric_l2_regularization: 2.0}\n").replace(
        "mod.py:input_fn", "mod.py:with_ids")
    (workdir / "mod.py").write_text(MODULE + """

def with_ids(mode):
    return [({"x": f["x"], "id": np.arange(i * 16, i * 16 + 16) % 64}, y)
            for i, (f, y) in enumerate(input_fn(mode))]
""")
    path = write(workdir, text + "run_config: {model_dir: run}\n")
    assert cli.main(["run", path, "-q"]) == 0
    import estimator as est
    from hooks.event_files import read_scalars
    trained = est.LinearClassifier([est.feature_column.numeric_column("x")],
                                   model_dir=str(workdir / "run"))
    assert trained.get_variable_value("linear/sdca/examples_seen") == 64
    assert read_scalars(str(workdir / "run" / "eval" / "*tfevents*"))[40]["accuracy"] == 1.0
    bad = write(workdir, text.replace("example_id_column", "example_id_col")
                + "run_config: {model_dir: run2}\n")
    said = (r"exp.yaml:5: .*LinearSDCA has no argument 'example_id_col'; did you mean "
            r"'example_id_column'")
    with pytest.raises(ExperimentError, match=said):
        experiment.load(bad).estimator()


def test_in_memory_evaluator_hook_from_yaml(workdir):
    """TF's InMemoryEvaluatorHook by its bare name: the run's Estimator is
    given to it, its input_fn is an import path; it evaluates at step 0,
    every 10 steps and at the end into eval_inmem."""
    from hooks.event_files import read_scalars
    text = HEAD.replace("  max_steps: 40\n", "  max_steps: 25\n  hooks:\n"
                        "    - InMemoryEvaluatorHook: {input_fn: mod.py:input_fn, "
                        "every_n_iter: 10, name: inmem}\n")
    path = write(workdir, text + "run_config: {model_dir: run, tf_random_seed: 1}\n")
    exp = experiment.load(path)
    estimator = exp.estimator()
    spec = exp.train_spec(estimator)
    estimator.train(spec.input_fn, hooks=spec.hooks, max_steps=spec.max_steps)
    scalars = read_scalars(str(workdir / "run" / "eval_inmem" / "*tfevents*"))
    assert sorted(scalars) == [0, 10, 20, 25]
    assert scalars[25]["accuracy"] > scalars[0]["accuracy"]


def test_premade_iris_config_reaches_tfs_accuracy(tmp_path, monkeypatch):
    """configs/premade_iris.yaml: TF's premade Iris program as an experiment
    (1000 steps); TF reaches 1.0 on this split (tests/estimator/test_canned.py)."""
    monkeypatch.chdir(tmp_path)
    path = os.path.join(ROOT, "configs", "premade_iris.yaml")
    assert cli.main(["run", path, "-q", "--set", f"run_config.model_dir={tmp_path}/run"]) == 0
    exp = experiment.load(path, overrides=[f"run_config.model_dir={tmp_path}/run"])
    results = exp.estimator().evaluate(lambda: exp.function("eval_spec", "input_fn")("eval"))
    assert results["accuracy"] == 1.0


BAD = [
    ("both model_fn and estimator", "model_fn: mod.py:columns\n" + HEAD,
     "{f}:2: estimator: give either model_fn or estimator, not both: estimator replaces "
     "model_fn (its model is built in)"),
    ("neither", "train_spec:\n  input_fn: mod.py:input_fn\n",
     "{f}:1: model_fn: missing required key 'model_fn'; add model_fn: package.module:function "
     "at the top level, or a canned estimator: estimator: {{DNNClassifier: {{hidden_units: [10], "
     "feature_columns: package.module:feature_columns}}}}"),
    ("unknown estimator", HEAD.replace("LinearClassifier", "LinearClasifier"),
     "{f}:2: estimator.LinearClasifier: unknown estimator 'LinearClasifier'; did you mean "
     "'LinearClassifier'?"),
    ("unknown argument", HEAD.replace("    feature_columns: mod.py:columns\n",
                                      "    feature_columns: mod.py:columns\n    n_clases: 3\n"),
     "{f}:4: estimator.LinearClassifier.n_clases: LinearClassifier has no argument 'n_clases'; "
     "did you mean 'n_classes'?"),
    ("columns function takes an argument",
     HEAD.replace("mod.py:columns", "mod.py:takes_an_argument"),
     "{f}:3: estimator.LinearClassifier.feature_columns: mod.py:takes_an_argument: "
     "feature_columns is called with no arguments but takes 'n'; give them defaults"),
    ("params with a canned estimator", HEAD + "params: {lr: 0.1}\n",
     "{f}:10: params: a canned estimator takes no params; give its arguments under "
     "estimator: {{Name: {{argument: value}}}}"),
    ("unknown head", HEAD.replace("LinearClassifier:\n", "LinearEstimator:\n    head: "
                                  "{MultiLableHead: {n_classes: 2}}\n"),
     "{f}:3: estimator.LinearEstimator.head.MultiLableHead: unknown head 'MultiLableHead'; did "
     "you mean 'MultiLabelHead'?"),
    ("bad head argument", HEAD.replace("LinearClassifier:\n", "LinearEstimator:\n    head: "
                                       "{MultiLabelHead: {n_class: 2}}\n"),
     "{f}:3: estimator.LinearEstimator.head.MultiLabelHead.n_class: MultiLabelHead has no "
     "argument 'n_class'; did you mean 'n_classes'?"),
]


@pytest.mark.parametrize("text, expected", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_canned_experiments(workdir, text, expected):
    path = write(workdir, text)
    with pytest.raises(ExperimentError) as info:
        experiment.load(path)
    assert expected.format(f=path) in str(info.value)


MULTI_LABEL_MODULE = '''
import numpy as np


def input_fn(mode):
    x = np.linspace(-1, 1, 64).astype(np.float32)
    words = np.where(np.stack([x > 0.2, x < -0.2], 1), np.array(["up", "down"]), "")
    return [({"x": x[i:i + 16]}, words[i:i + 16]) for i in range(0, 64, 16)] * (
        20 if mode == "train" else 1)
'''


def test_a_head_taking_estimator_from_yaml(workdir):
    """`head: {MultiLabelHead: {...}}` under DNNEstimator (TF's
    `DNNEstimator(head=MultiLabelHead(...))`), run by the CLI."""
    import estimator as est
    (workdir / "mlmod.py").write_text(MULTI_LABEL_MODULE)
    text = """estimator:
  DNNEstimator:
    head: {MultiLabelHead: {n_classes: 2, label_vocabulary: [up, down], thresholds: [0.5]}}
    hidden_units: [8]
    feature_columns: mod.py:columns
    optimizer: Adam
train_spec: {input_fn: mlmod.py:input_fn, max_steps: 60}
eval_spec: {input_fn: mlmod.py:input_fn, throttle_secs: 0}
run_config: {model_dir: run, tf_random_seed: 1}
"""
    path = write(workdir, text)
    try:
        exp = experiment.load(path)
        estimator = exp.estimator()
        assert type(estimator) is est.DNNEstimator
        assert cli.main(["run", path, "-q"]) == 0
        results = exp.estimator().evaluate(lambda: __import__("mlmod").input_fn("eval"))
    finally:
        sys.modules.pop("mlmod", None)
    assert results["global_step"] == 60
    assert results["accuracy/positive_threshold_0.5"] > 0.9 and results["auc"] > 0.95


def test_a_multi_head_from_yaml(workdir):
    """`head: {MultiHead: {heads: [...]}}`: each head built from its own entry."""
    import estimator as est
    text = """estimator:
  LinearEstimator:
    head:
      MultiHead:
        heads:
          - BinaryClassHead: {name: up}
          - {RegressionHead: {name: size, label_dimension: 2}}
        head_weights: [1.0, 0.5]
    feature_columns: mod.py:columns
train_spec: {input_fn: mod.py:input_fn, max_steps: 1}
"""
    estimator = experiment.load(write(workdir, text)).estimator()
    assert type(estimator) is est.LinearEstimator
    heads = estimator._head.heads
    assert [type(h).__name__ for h in heads] == ["BinaryClassHead", "RegressionHead"]
    assert [h.name for h in heads] == ["up", "size"] and heads[1].logits_dimension == 2
    bad = text.replace("          - BinaryClassHead: {name: up}\n",
                       "          - BinaryClasHead: {name: up}\n")
    with pytest.raises(ExperimentError, match=r"exp.yaml:6: estimator.LinearEstimator.head."
                                              r"MultiHead.heads\[0\].BinaryClasHead: unknown "
                                              r"head 'BinaryClasHead'; did you mean "
                                              r"'BinaryClassHead'\?"):
        experiment.load(write(workdir, bad))


def test_a_model_fn_under_estimator_says_where_it_goes(workdir):
    text = HEAD.replace("LinearClassifier:\n    feature_columns: mod.py:columns\n",
                        "model_fn: mod.py:columns\n")
    with pytest.raises(ExperimentError, match=r"exp.yaml:2: estimator.model_fn: "
                                              r"estimator.model_fn is not an estimator; known "
                                              r"estimator names: .*; a model_fn of your own is "
                                              r"a top-level key: `model_fn: "):
        experiment.load(write(workdir, text)).estimator()


def test_warm_start_refused_where_tf_refuses_it(workdir):
    text = HEAD.replace("LinearClassifier:\n    feature_columns: mod.py:columns\n",
                        "BaselineClassifier: {n_classes: 2}\n") + "warm_start: other_run\n"
    exp = experiment.load(write(workdir, text))
    with pytest.raises(ExperimentError, match="BaselineClassifier takes no warm_start_from"):
        exp.estimator()


VOCAB_MODULE = '''
import estimator as est


def columns():
    return [est.feature_column.categorical_column_with_vocabulary_file(
        "occupation", VOCAB, num_oov_buckets=2)]
'''


def test_warm_start_with_vocab_info_from_yaml(workdir):
    """TF's VocabInfo as a mapping of its arguments: the settings the
    experiment builds move TF's linear weights to the new vocabulary file as
    tests/estimator/test_vocab_info.py checks against TF."""
    import json
    import numpy as np
    import torch
    import estimator as est
    from paths import FIXTURES
    vocab = os.path.join(FIXTURES, "tf_ckpt", "vocab")
    (workdir / "vmod.py").write_text(VOCAB_MODULE.replace(
        "VOCAB,", repr(os.path.join(vocab, "new_occupations.txt")) + ","))
    text = f"""estimator:
  LinearClassifier:
    feature_columns: vmod.py:columns
train_spec: {{input_fn: mod.py:input_fn, max_steps: 1}}
run_config: {{model_dir: run}}
warm_start:
  ckpt_to_initialize_from: {vocab}/wide_deep
  vars_to_warm_start: linear/linear_model/occupation/.*
  var_name_to_vocab_info:
    linear/linear_model/occupation/weights:
      new_vocab: {vocab}/new_occupations.txt
      new_vocab_size: 5
      num_oov_buckets: 2
      old_vocab: {vocab}/old_occupations.txt
"""
    exp = experiment.load(write(workdir, text))
    settings = exp.warm_start_settings()
    name = "linear/linear_model/occupation/weights"
    assert settings.var_name_to_vocab_info == {name: est.VocabInfo(
        f"{vocab}/new_occupations.txt", 5, 2, f"{vocab}/old_occupations.txt")}
    sys.path.insert(0, str(workdir))
    try:
        import vmod
        estimator = est.LinearClassifier(vmod.columns(), model_dir=str(workdir / "py"),
                                         optimizer=lambda p: torch.optim.SGD(p, lr=0.0),
                                         warm_start_from=settings)
    finally:
        sys.path.remove(str(workdir))
        sys.modules.pop("vmod", None)
    occupation = np.array(["pilot", "nurse", "teacher", "clerk"] * 4)
    estimator.train(lambda: [({"occupation": occupation}, np.arange(16) % 2)], max_steps=1)
    with open(os.path.join(FIXTURES, "tf_vocab_warm_start.json")) as f:
        tf_after = json.load(f)["wide_deep"]["after"][name]
    np.testing.assert_allclose(estimator.get_variable_value(name), tf_after, atol=1e-7)
    bad = text.replace("      new_vocab_size: 5\n", "      new_vocab_size: 5\n      size: 3\n")
    with pytest.raises(ExperimentError, match=r"warm_start.*VocabInfo.*unexpected keyword "
                                              r"argument 'size'"):
        experiment.load(write(workdir, bad)).warm_start_settings()


def test_a_trainers_build_estimator_function_from_yaml(workdir):
    """TF Cloud ML trainers build their estimator in a function of their
    hyperparameters (taxifare's build_estimator(nbuckets, ...)) and add
    metrics to it: given by import path, it gets run_config's RunConfig as
    `config`, and --set reaches its arguments. It was refused: "needs
    argument 'config'"."""
    path = write(workdir, HEAD.replace("  LinearClassifier:\n    feature_columns: mod.py:columns",
                                       "  mod.py:build_estimator: {nbuckets: 3}")
                 + "run_config: {model_dir: run, tf_random_seed: 1}\n")
    exp = experiment.load(path, overrides=['estimator."mod.py:build_estimator".nbuckets=5'])
    estimator = exp.estimator()
    assert estimator.config.tf_random_seed == 1 and estimator.model_dir.endswith("run")
    assert cli.main(["run", path, "-q", "--set",
                     'estimator."mod.py:build_estimator".nbuckets=5']) == 0
    results = estimator.evaluate(lambda: __import__("mod").input_fn("eval"))
    assert results["buckets"] == 5 and results["global_step"] == 40
    for function, error in (("takes_no_config", "takes no config: give it a `config` "
                                                "argument"),
                            ("forgets_to_return", "returned NoneType, not an Estimator")):
        with pytest.raises(ExperimentError, match=f"{function} {error}"):
            experiment.load(write(workdir, HEAD.replace(
                "  LinearClassifier:\n    feature_columns: mod.py:columns",
                f"  mod.py:{function}: {{nbuckets: 3}}"))).estimator()
