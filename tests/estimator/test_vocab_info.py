"""est.VocabInfo in WarmStartSettings: a TF1 model's vocabulary-indexed
variables (linear weights, embeddings, a logits kernel over the labels) move
to new vocabulary files as TF moves them (recorded from TF 2.15 by
tests/support/fixtures/record_tf_vocab_warm_start.py), and the settings' errors."""
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from paths import FIXTURES

VOCAB = os.path.join(FIXTURES, "tf_ckpt", "vocab")
with open(os.path.join(FIXTURES, "tf_vocab_warm_start.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
fc = est.feature_column
FROZEN = lambda params: torch.optim.SGD(params, lr=0.0)   # noqa: E731
LINEAR = "linear/linear_model/occupation/weights"
EMBEDDING = "dnn/input_from_feature_columns/input_layer/occupation_embedding/embedding_weights"
OLD_OCCUPATIONS = ["clerk", "driver", "nurse", "cook", "pilot", "farmer"]


def path(name):
    return os.path.join(VOCAB, name)


def rows(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return {"occupation": rng.choice(OLD_OCCUPATIONS + ["unknown"], n),
            "age": rng.uniform(20, 60, n).astype(np.float32)}


def wide_deep(model_dir, warm):
    occupation = fc.categorical_column_with_vocabulary_file(
        "occupation", path("new_occupations.txt"), num_oov_buckets=2)
    return est.DNNLinearCombinedClassifier(
        model_dir=model_dir, linear_feature_columns=[occupation],
        dnn_feature_columns=[fc.embedding_column(occupation, 3), fc.numeric_column("age")],
        dnn_hidden_units=[4], linear_optimizer=FROZEN, dnn_optimizer=FROZEN,
        warm_start_from=warm)


def wide_deep_settings(**changes):
    infos = {LINEAR: est.VocabInfo(path("new_occupations.txt"), 5, 2,
                                   path("old_occupations.txt")),
             EMBEDDING: est.VocabInfo(path("new_occupations.txt"), 5, 2,
                                      path("old_occupations.txt"), old_vocab_size=5)}
    infos.update(changes)
    return est.WarmStartSettings(os.path.join(VOCAB, "wide_deep"), vars_to_warm_start=".*",
                                 var_name_to_vocab_info=infos)


def assert_tfs(estimator, recorded):
    names = set(estimator.get_variable_names())
    compared = 0
    for name, value in recorded["after"].items():
        if name in names:
            np.testing.assert_allclose(estimator.get_variable_value(name),
                                       np.asarray(value, np.float32), rtol=1e-6, atol=1e-7,
                                       err_msg=name)
            compared += 1
    return compared


def test_rows_follow_the_vocabulary_as_in_tf(tmp_path):
    """Linear weights and the embedding: a new entry takes its old row, a new
    word and the OOV rows start at zero, old_vocab_size=5 leaves out the old
    file's sixth word."""
    estimator = wide_deep(str(tmp_path), wide_deep_settings())
    features = rows()
    estimator.train(lambda: [(features, (features["age"] > 40).astype(np.int64))], max_steps=1)
    assert assert_tfs(estimator, TF["wide_deep"]) >= 5
    assert np.all(estimator.get_variable_value(EMBEDDING)[4] == 0)      # farmer: past 5 lines
    assert np.all(estimator.get_variable_value(LINEAR)[4] != 0)         # farmer: found


def test_logits_columns_follow_the_label_vocabulary_as_in_tf(tmp_path):
    warm = est.WarmStartSettings(os.path.join(VOCAB, "dnn_labels"), vars_to_warm_start=".*",
                                 var_name_to_vocab_info={"dnn/logits/kernel": est.VocabInfo(
                                     path("new_labels.txt"), 3, 0, path("old_labels.txt"),
                                     axis=1)})
    estimator = est.DNNClassifier([4], [fc.numeric_column("age")], model_dir=str(tmp_path),
                                  n_classes=3, label_vocabulary=["high", "top", "low"],
                                  optimizer=FROZEN, warm_start_from=warm)
    features = rows()
    labels = np.array(["high", "top", "low"])[np.digitize(features["age"], [33, 47])]
    estimator.train(lambda: [({"age": features["age"]}, labels)], max_steps=1)
    assert assert_tfs(estimator, TF["dnn_labels"]) >= 4


def test_only_the_vocabulary_variables_when_vars_to_warm_start_is_none(tmp_path):
    settings = wide_deep_settings()
    settings.vars_to_warm_start = None
    estimator = wide_deep(str(tmp_path), settings)
    features = rows()
    estimator.train(lambda: [(features, (features["age"] > 40).astype(np.int64))], max_steps=1)
    after = TF["wide_deep"]["after"]
    np.testing.assert_allclose(estimator.get_variable_value(LINEAR), after[LINEAR], atol=1e-7)
    assert not np.allclose(estimator.get_variable_value("dnn/logits/kernel"),
                           after["dnn/logits/kernel"])


def test_a_backup_initializer_fills_the_new_entries(tmp_path):
    estimator = wide_deep(str(tmp_path), wide_deep_settings(**{LINEAR: est.VocabInfo(
        path("new_occupations.txt"), 5, 2, path("old_occupations.txt"),
        backup_initializer=lambda shape: torch.full(shape, 0.5))}))
    features = rows()
    estimator.train(lambda: [(features, (features["age"] > 40).astype(np.int64))], max_steps=1)
    weights = estimator.get_variable_value(LINEAR)[:, 0]
    assert weights[2] == 0.5 and list(weights[5:]) == [0.5, 0.5]      # teacher, OOV
    np.testing.assert_allclose(weights[[0, 1, 3, 4]],
                               np.asarray(TF["wide_deep"]["after"][LINEAR])[[0, 1, 3, 4], 0],
                               atol=1e-7)


def _train(tmp_path, settings):
    features = rows()
    wide_deep(str(tmp_path), settings).train(
        lambda: [(features, (features["age"] > 40).astype(np.int64))], max_steps=1)


@pytest.mark.parametrize("change, match", [
    ({"dnn/logit/kernel": est.VocabInfo(path("new_labels.txt"), 3, 0, path("old_labels.txt"))},
     r"var_name_to_vocab_info that were not used: \['dnn/logit/kernel'\].*viable variable "
     r"names: \[.*'dnn/logits/kernel'"),
    ({LINEAR: est.VocabInfo(path("new_occupations.txt"), 4, 2, path("old_occupations.txt"))},
     r"VocabInfo of 'linear/linear_model/occupation/weights'.* has 7 entries along axis 0, "
     r"but new_vocab_size 4 \+ num_oov_buckets 2 = 6"),
    ({LINEAR: est.VocabInfo(path("missing.txt"), 5, 2, path("old_occupations.txt"))},
     r"new_vocab: the vocabulary file .*missing.txt' does not exist"),
    ({LINEAR: est.VocabInfo(path("new_occupations.txt"), 5, 2, path("old_labels.txt"),
                            old_vocab_size=9)},
     r"old_vocab: vocabulary_size 9 is larger than the 3 lines"),
    ({EMBEDDING: est.VocabInfo(path("new_occupations.txt"), 5, 2, path("old_occupations.txt"),
                               axis=1)},
     r"has 3 entries along axis 1, but new_vocab_size 5"),
])
def test_settings_that_do_not_fit_are_errors_naming_the_variable(tmp_path, change, match):
    with pytest.raises(ValueError, match=match):
        _train(tmp_path, wide_deep_settings(**change))


def test_an_unused_renaming_is_an_error_as_in_tf(tmp_path):
    settings = wide_deep_settings()
    settings.var_name_to_prev_var_name = {"dnn/hiddenlayer_9/kernel": "x"}
    with pytest.raises(ValueError, match=r"var_name_to_prev_var_name that were not used: "
                                         r"\['dnn/hiddenlayer_9/kernel'\]"):
        _train(tmp_path, settings)


def test_vocab_info_arguments():
    with pytest.raises(ValueError, match="supported values for the axis argument are 0 and 1"):
        est.VocabInfo("a", 3, 0, "b", axis=2)
    with pytest.raises(ValueError, match="Must provide all of"):
        est.VocabInfo("", 3, 0, "b")
    with pytest.raises(TypeError, match=r"var_name_to_vocab_info\['x'\] must be a VocabInfo"):
        est.WarmStartSettings("/tmp", var_name_to_vocab_info={"x": ("a", 3, 0, "b")})
