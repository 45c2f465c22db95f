"""The TF1 names this project ports take TF's arguments in TF's order (TF
2.15's signatures, recorded by tests/support/fixtures/record_tf_signatures.py),
so that a TF1 program's calls port by search and replace."""
import inspect
import json
import os

import pytest

import distribute
import estimator as est
import hooks
from paths import FIXTURES, ROOT

with open(os.path.join(FIXTURES, "tf_signatures.json"), encoding="utf-8") as _f:
    _RECORDED = json.load(_f)
TF = _RECORDED["signatures"]
OURS = {"estimator": est, "inputs": est.inputs, "experimental": est.experimental,
        "metrics": est.metrics, "losses": est.losses, "learning_rate_decay": est.learning_rate_decay,
        "feature_column": est.feature_column, "hooks": hooks,
        "estimator_methods": est.Estimator, "exporters": est, "export": est.export,
        "distribute": distribute, "distribute.experimental": distribute.experimental}
OURS.update({"placeholder": est.export,   # tf.compat.v1.placeholder's stand-in
             "sequence_feature_column": est.feature_column, "rnn": est,
             "kmeans": est.experimental, "sdca": est.experimental,
             "distribute.Strategy": distribute.Strategy,
             "distribute.ReplicaContext": distribute.ReplicaContext,
             "moving_averages": est.moving_averages,
             "moving_averages.ExponentialMovingAverage":
                 est.moving_averages.ExponentialMovingAverage})
OURS.update({head: getattr(est, head) for head in [   # (their create_estimator_spec)
    "BinaryClassHead", "MultiClassHead", "RegressionHead", "PoissonRegressionHead",
    "LogisticRegressionHead", "MultiLabelHead", "MultiHead"]})
# Where this project deliberately differs (said in its docs): extra arguments
# only, after TF's.
EXTRA = {"estimator.RunConfig": ["random_seed", "experimental_async_checkpoint",
                                 "experimental_prefetch_batches"],
         "estimator.EvalSpec": ["checkpoint_policy"],
         "estimator.DNNLinearCombinedEstimator": ["warm_start_from"],
         "feature_column.input_layer": ["scope", "name"],
         "feature_column.linear_model": ["scope"],
         "rnn.RNNClassifier": ["num_units", "warm_start_from"],
         "rnn.RNNEstimator": ["num_units", "warm_start_from"],
         "hooks.MonitoredTrainingSession": ["keep_checkpoint_max", "strategy"],
         "hooks.GlobalStepWaiterHook": ["timeout_secs", "poll_secs"],
         "hooks.NanTensorHook": ["every_n_iter"],
         "export.ServingInputReceiver": ["dynamic_batch"],
         "export.build_parsing_serving_input_receiver_fn": ["max_sequence_length"],
         "placeholder.placeholder": ["fill_value"],
         "export.ClassificationOutput": ["class_names"],
         "export.PredictOutput": ["class_names", "named_outputs"],
         "distribute.MirroredStrategy": ["communication_options"],
         "distribute.experimental.CentralStorageStrategy": ["communication_options"],
         "distribute.MultiWorkerMirroredStrategy": ["communication"],
         "distribute.experimental.ParameterServerStrategy": [
             "placement", "timeout_secs", "init_timeout_secs"]}
ABSENT = {"metrics.mean_tensor"}     # said absent in docs/migration.md


@pytest.mark.parametrize("name", sorted(set(TF) - ABSENT))
def test_arguments_are_tfs(name):
    group, attr = name.rsplit(".", 1)
    ours = [p for p in inspect.signature(getattr(OURS[group], attr)).parameters
            if p != "self"]
    assert [p for p in ours if p not in EXTRA.get(name, [])] == TF[name]
    assert list(ours)[:len(TF[name])] == TF[name]


# tf.compat.v1.estimator's public names not here, each said absent in
# docs/migration.md ("Not covered yet").
ABSENT_NAMES = {
    "estimator": {"Head", "tpu"},
    "estimator.experimental": {"build_raw_supervised_input_receiver_fn",
                               "call_logit_fn", "dnn_logit_fn_builder", "linear_logit_fn_builder",
                               "make_stop_at_checkpoint_step_hook"},
    "estimator.export": {"EvalOutput"},
    "distribute": {"DistributedDataset", "DistributedIterator", "DistributedValues",
                   "TPUStrategy"},
    "distribute.experimental": {"CollectiveHints", "PreemptionCheckpointHandler",
                                "PreemptionWatcher", "TPUStrategy", "TerminationConfig", "rpc"},
}


@pytest.mark.parametrize("module", sorted(ABSENT_NAMES))
def test_tfs_estimator_names_are_here_or_said_absent(module):
    """`tf.estimator.X` ports as `est.X` (hooks included, as TF exports them
    there too), `tf.distribute.X` as `distribute.X`, but for the names said
    absent (docs/migration.md, docs/distribute.md)."""
    ours = {"estimator": est, "estimator.experimental": est.experimental,
            "estimator.export": est.export, "distribute": distribute,
            "distribute.experimental": distribute.experimental}[module]
    names = set(_RECORDED["names"][module])
    assert {n for n in names if not hasattr(ours, n)} == ABSENT_NAMES[module]
    doc = ""
    for page in ("migration.md", "distribute.md"):
        with open(os.path.join(ROOT, "docs", page), encoding="utf-8") as f:
            doc += f.read()
    for name in ABSENT_NAMES[module]:
        assert f"`tf.{module}.{name}`" in doc or f"`{name}`" in doc, name


def test_only_predict_exports(tmp_path):
    with pytest.raises(NotImplementedError, match="only 'infer' exports are built here"):
        est.Estimator(lambda features, labels, mode: None, model_dir=str(tmp_path)
                      ).export_saved_model(str(tmp_path), lambda: None, experimental_mode="eval")
