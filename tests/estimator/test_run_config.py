"""RunConfig (tf.estimator.RunConfig): TF_CONFIG rules checked against tf.estimator 2.15."""
import json
import os
import pathlib
import types

import pytest

import estimator as est
from distribute.cluster_resolver import ClusterSpec
from estimator.run_config import RunConfig, _USE_DEFAULT

FULL = {"chief": ["c0:2222"], "ps": ["p0:2222", "p1:2222"],
        "worker": ["w0:2222", "w1:2222", "w2:2222"]}
CW = {"chief": ["c0:2222"], "worker": ["w0:2222", "w1:2222"]}
AUX = {"chief": ["c0:1"], "worker": ["w0:1"], "aux": ["a0:1"]}
FULL_E = dict(FULL, evaluator=["e0:2222"])
LEGACY = {"master": ["m0:2222"], "ps": ["p0:2222"], "worker": ["w0:2222", "w1:2222"]}


def j(cluster=None, task=None, **extra):
    """TF_CONFIG text with the given parts."""
    d = {}
    if cluster is not None:
        d["cluster"] = cluster
    if task is not None:
        d["task"] = task
    d.update(extra)
    return json.dumps(d)


def t(type_, index):
    return {"type": type_, "index": index}


def ok(task_type, task_id, is_chief, master, *, workers, ps, gid, cluster=None,
       eval_master="", model_dir=None, service=None):
    """The properties tf.estimator.RunConfig reported."""
    return dict(cluster_spec=cluster or {}, task_type=task_type, task_id=task_id,
                is_chief=is_chief, master=master, evaluation_master=eval_master,
                num_worker_replicas=workers, num_ps_replicas=ps,
                global_id_in_cluster=gid, model_dir=model_dir, service=service)


def raises(tf_outcome, *match):
    """We raise ValueError containing every `match`; `tf_outcome` is what TF did."""
    return types.SimpleNamespace(tf_outcome=tf_outcome, match=match)


# Expected values generated from the real tf.estimator 2.15 (tensorflow-cpu
# 2.15.0 + tensorflow-estimator 2.15.0 in a throwaway virtualenv outside the
# repo): a script set os.environ["TF_CONFIG"] to each case's text, built
# tf.estimator.RunConfig(**kwargs), and printed the properties below or the
# exception's class. Where TF raised (whatever the class: JSONDecodeError,
# AttributeError and TypeError for malformed structure), we raise ValueError
# quoting the offending part. The last four cases are clearly malformed inputs
# TF accepts silently (its outcome is in the first argument of raises()); we
# raise there on purpose.
CASES = [
    # --- valid: local mode
    ('unset', None, {},
     ok('worker', 0, True, '', workers=1, ps=0, gid=0)),
    ('empty_object', "{}", {},
     ok('worker', 0, True, '', workers=1, ps=0, gid=0)),
    ('local_task_worker0', j(task=t("worker", 0)), {},
     ok('worker', 0, True, '', workers=1, ps=0, gid=0)),
    ('local_empty_cluster', j(cluster={}, task=t("worker", 0)), {},
     ok('worker', 0, True, '', workers=1, ps=0, gid=0)),
    ('local_session_masters', j(session_master="sm:1", eval_session_master="esm:1"), {},
     ok('worker', 0, True, 'sm:1', workers=1, ps=0, gid=0, eval_master='esm:1')),
    ('local_index_str0', j(task=t("worker", "0")), {},
     ok('worker', 0, True, '', workers=1, ps=0, gid=0)),
    ('local_type_only', j(task={"type": "worker"}), {},
     ok('worker', 0, True, '', workers=1, ps=0, gid=0)),
    # --- valid: chief / worker / ps
    ('chief_only', j({"chief": ["c0:2222"]}, t("chief", 0)), {},
     ok('chief', 0, True, '', workers=1, ps=0, gid=0, cluster={'chief': ['c0:2222']})),
    ('cw_chief', j(CW, t("chief", 0)), {},
     ok('chief', 0, True, 'grpc://c0:2222', workers=3, ps=0, gid=0, cluster=CW)),
    ('cw_worker0', j(CW, t("worker", 0)), {},
     ok('worker', 0, False, 'grpc://w0:2222', workers=3, ps=0, gid=1, cluster=CW)),
    ('cw_worker1', j(CW, t("worker", 1)), {},
     ok('worker', 1, False, 'grpc://w1:2222', workers=3, ps=0, gid=2, cluster=CW)),
    ('full_chief', j(FULL, t("chief", 0)), {},
     ok('chief', 0, True, 'grpc://c0:2222', workers=4, ps=2, gid=0, cluster=FULL)),
    ('full_worker2', j(FULL, t("worker", 2)), {},
     ok('worker', 2, False, 'grpc://w2:2222', workers=4, ps=2, gid=3, cluster=FULL)),
    ('full_ps0', j(FULL, t("ps", 0)), {},
     ok('ps', 0, False, 'grpc://p0:2222', workers=4, ps=2, gid=4, cluster=FULL)),
    ('full_ps1', j(FULL, t("ps", 1)), {},
     ok('ps', 1, False, 'grpc://p1:2222', workers=4, ps=2, gid=5, cluster=FULL)),
    ('index_as_string', j(FULL, t("worker", "1")), {},
     ok('worker', 1, False, 'grpc://w1:2222', workers=4, ps=2, gid=2, cluster=FULL)),
    ('index_integral_float', j(FULL, t("worker", 1.0)), {},
     ok('worker', 1, False, 'grpc://w1:2222', workers=4, ps=2, gid=2, cluster=FULL)),
    ('custom_job', j(AUX, t("aux", 0)), {},
     ok('aux', 0, False, 'grpc://a0:1', workers=2, ps=0, gid=1, cluster=AUX)),
    ('custom_job_worker_gid', j(AUX, t("worker", 0)), {},
     ok('worker', 0, False, 'grpc://w0:1', workers=2, ps=0, gid=2, cluster=AUX)),
    ('empty_worker_job_as_chief', j({"chief": ["c0:1"], "worker": []}, t("chief", 0)), {},
     ok('chief', 0, True, 'grpc://c0:1', workers=1, ps=0, gid=0,
        cluster={'chief': ['c0:1'], 'worker': {}})),
    ('sparse_dict_job',
     j({"chief": ["c0:1"], "worker": {"0": "w0:1", "1": "w1:1"}}, t("worker", 1)), {},
     ok('worker', 1, False, 'grpc://w1:1', workers=3, ps=0, gid=2,
        cluster={'chief': ['c0:1'], 'worker': ['w0:1', 'w1:1']})),
    ('cluster_session_master', j(CW, t("worker", 1), session_master="sm:9"), {},
     ok('worker', 1, False, 'sm:9', workers=3, ps=0, gid=2, cluster=CW)),
    ('rpc_layer_ignored', j(CW, t("worker", 0), rpc_layer="grpc+verbs"), {},
     ok('worker', 0, False, 'grpc://w0:2222', workers=3, ps=0, gid=1, cluster=CW)),
    ('environment_key', j(CW, t("worker", 0), environment="cloud"), {},
     ok('worker', 0, False, 'grpc://w0:2222', workers=3, ps=0, gid=1, cluster=CW)),
    ('service_dict', j(CW, t("chief", 0), service={"name": "svc"}), {},
     ok('chief', 0, True, 'grpc://c0:2222', workers=3, ps=0, gid=0, cluster=CW,
        service={'name': 'svc'})),
    # --- valid: evaluator
    ('evaluator_outside_cluster', j(FULL, t("evaluator", 0)), {},
     ok('evaluator', 0, False, '', workers=0, ps=0, gid=None)),
    ('evaluator_in_cluster', j(FULL_E, t("evaluator", 0)), {},
     ok('evaluator', 0, False, '', workers=0, ps=0, gid=None)),
    ('evaluator_index_3', j(FULL, t("evaluator", 3)), {},
     ok('evaluator', 3, False, '', workers=0, ps=0, gid=None)),
    ('evaluator_eval_session_master', j(CW, t("evaluator", 0), eval_session_master="esm:7"), {},
     ok('evaluator', 0, False, '', workers=0, ps=0, gid=None, eval_master='esm:7')),
    ('worker_gid_with_evaluator_job', j(FULL_E, t("worker", 0)), {},
     ok('worker', 0, False, 'grpc://w0:2222', workers=4, ps=2, gid=2, cluster=FULL_E)),
    ('ps_gid_with_evaluator_job', j(FULL_E, t("ps", 1)), {},
     ok('ps', 1, False, 'grpc://p1:2222', workers=4, ps=2, gid=6, cluster=FULL_E)),
    # --- valid: legacy master
    ('legacy_master', j(LEGACY, t("master", 0)), {},
     ok('master', 0, True, 'grpc://m0:2222', workers=3, ps=1, gid=0, cluster=LEGACY)),
    ('legacy_worker1', j(LEGACY, t("worker", 1)), {},
     ok('worker', 1, False, 'grpc://w1:2222', workers=3, ps=1, gid=2, cluster=LEGACY)),
    ('legacy_ps0', j(LEGACY, t("ps", 0)), {},
     ok('ps', 0, False, 'grpc://p0:2222', workers=3, ps=1, gid=3, cluster=LEGACY)),
    ('legacy_master_only', j({"master": ["m0:2222"]}, t("master", 0)), {},
     ok('master', 0, True, '', workers=1, ps=0, gid=0, cluster={'master': ['m0:2222']})),
    # --- valid: model_dir
    ('model_dir_from_tf_config', j(CW, t("chief", 0), model_dir="/tmp/md"), {},
     ok('chief', 0, True, 'grpc://c0:2222', workers=3, ps=0, gid=0, cluster=CW,
        model_dir='/tmp/md')),
    ('model_dir_same_both', j(CW, t("chief", 0), model_dir="/tmp/md"), {"model_dir": "/tmp/md"},
     ok('chief', 0, True, 'grpc://c0:2222', workers=3, ps=0, gid=0, cluster=CW,
        model_dir='/tmp/md')),
    ('model_dir_arg_only', None, {"model_dir": "/tmp/arg"},
     ok('worker', 0, True, '', workers=1, ps=0, gid=0, model_dir='/tmp/arg')),
    # --- malformed: JSON level
    ('not_json', "{not json", {},
     raises('JSONDecodeError', '{not json', 'char 1')),
    ('empty_string', "", {},
     raises('JSONDecodeError', 'not valid JSON', "''")),
    ('json_array', "[1, 2]", {},
     raises('AttributeError', '[1, 2]')),
    ('json_string', '"hello"', {},
     raises('AttributeError', '"hello"')),
    ('json_null', "null", {},
     raises('AttributeError', 'null')),
    # --- malformed: cluster
    ('cluster_list', j(["c0:1"], t("chief", 0)), {},
     raises('TypeError', '["c0:1"]')),
    ('cluster_string', j("c0:1", t("chief", 0)), {},
     raises('TypeError', '"c0:1"')),
    ('cluster_null', '{"cluster": null, "task": {"type": "chief", "index": 0}}', {},
     raises('TypeError', '"cluster" null')),
    ('job_tasks_string', j({"chief": "c0:1"}, t("chief", 0)), {},
     raises('TypeError', "'chief'", '"c0:1"')),
    ('address_not_string', j({"chief": [1234]}, t("chief", 0)), {},
     raises('TypeError', '1234')),
    ('chief_job_empty', j({"chief": [], "worker": ["w0:1"]}, t("worker", 0)), {},
     raises('ValueError', '"chief"', 'got 0')),
    ('worker_job_empty_as_worker', j({"chief": ["c0:1"], "worker": []}, t("worker", 0)), {},
     raises('ValueError', 'task index 0', '"worker"', '0 task(s)')),
    ('two_chiefs', j({"chief": ["c0:1", "c1:1"], "worker": ["w0:1"]}, t("chief", 0)), {},
     raises('ValueError', '"chief"', '["c0:1", "c1:1"]')),
    ('worker_without_chief', j({"worker": ["w0:1", "w1:1"]}, t("worker", 0)), {},
     raises('ValueError', '"chief"', "['worker']")),
    ('ps_without_chief', j({"worker": ["w0:1"], "ps": ["p0:1"]}, t("ps", 0)), {},
     raises('ValueError', '"chief"', "'ps'")),
    ('evaluator_without_chief', j({"worker": ["w0:1"]}, t("evaluator", 0)), {},
     raises('ValueError', '"chief"', "['worker']")),
    # --- malformed: task
    ('task_string', j(CW, "worker"), {},
     raises('AttributeError', '"task"', '"worker"')),
    ('task_list', j(CW, ["worker", 0]), {},
     raises('AttributeError', '["worker", 0]')),
    ('task_missing', j(CW), {},
     raises('ValueError', 'task type must be set', '"task" is {}')),
    ('task_missing_type', j(CW, {"index": 0}), {},
     raises('ValueError', 'task type must be set', '{"index": 0}')),
    ('task_missing_index', j(CW, {"type": "worker"}), {},
     raises('ValueError', 'task index must be set', '{"type": "worker"}')),
    ('task_type_empty', j(CW, t("", 0)), {},
     raises('ValueError', '{"type": "", "index": 0}')),
    ('task_type_null', j(CW, {"type": None, "index": 0}), {},
     raises('ValueError', '{"type": null, "index": 0}')),
    ('task_index_null', j(CW, {"type": "worker", "index": None}), {},
     raises('ValueError', '"index": null')),
    ('task_type_not_string', j(CW, t(1, 0)), {},
     raises('ValueError', '{"type": 1, "index": 0}')),
    ('task_index_negative', j(CW, t("worker", -1)), {},
     raises('ValueError', 'non-negative', '-1')),
    ('task_index_not_int', j(CW, t("worker", "abc")), {},
     raises('ValueError', '"abc"')),
    ('worker_index_out_of_range', j(CW, t("worker", 2)), {},
     raises('ValueError', 'task index 2', '"worker"', '2 task(s)')),
    ('chief_index_1', j(CW, t("chief", 1)), {},
     raises('ValueError', 'task index 1', '"chief"', '1 task(s)')),
    ('ps_not_in_cluster', j(CW, t("ps", 0)), {},
     raises('ValueError', '"ps"', '["chief", "worker"]')),
    ('unknown_task_type', j(CW, t("trainer", 0)), {},
     raises('ValueError', '"trainer"', '["chief", "worker"]')),
    ('sparse_missing_index', j({"chief": ["c0:1"], "worker": {"1": "w1:1"}}, t("worker", 0)), {},
     raises('TypeError', 'task index 0', 'indices [1]')),
    # --- malformed: local mode with task set
    ('local_ps', j(task=t("ps", 0)), {},
     raises('ValueError', '"ps"')),
    ('local_chief', j(task=t("chief", 0)), {},
     raises('ValueError', '"chief"')),
    ('local_evaluator', j(task=t("evaluator", 0)), {},
     raises('ValueError', '"evaluator"')),
    ('local_worker1', j(task=t("worker", 1)), {},
     raises('ValueError', 'index must be 0', 'got 1')),
    ('local_task_string', j(task="worker"), {},
     raises('AttributeError', '"worker"')),
    ('local_index_null', j(task={"type": "worker", "index": None}), {},
     raises('TypeError', '"index": null')),
    # --- malformed: legacy master
    ('legacy_master_and_chief', j(dict(LEGACY, chief=["c0:1"]), t("master", 0)), {},
     raises('ValueError', '"chief"', "'master'")),
    ('legacy_master_evaluator', j(LEGACY, t("evaluator", 0)), {},
     raises('ValueError', '"evaluator"')),
    ('legacy_two_masters', j({"master": ["m0:1", "m1:1"]}, t("master", 0)), {},
     raises('ValueError', '"master"', '["m0:1", "m1:1"]')),
    # --- malformed: model_dir / service
    ('model_dir_conflict', j(CW, t("chief", 0), model_dir="/tmp/a"), {"model_dir": "/tmp/b"},
     raises('ValueError', '/tmp/a', '/tmp/b')),
    ('tf_config_model_dir_empty', j(CW, t("chief", 0), model_dir=""), {},
     raises('ValueError', 'model_dir in TF_CONFIG')),
    ('model_dir_arg_empty', None, {"model_dir": ""},
     raises('ValueError', 'model_dir should be non-empty')),
    ('service_not_dict', j(CW, t("chief", 0), service="svc"), {},
     raises('TypeError', '"service"', '"svc"')),
    # --- malformed: more index / legacy cases
    ('evaluator_index_negative', j(CW, t("evaluator", -1)), {},
     raises('ValueError', 'non-negative', '"evaluator"')),
    ('local_index_negative', j(task=t("worker", -1)), {},
     raises('ValueError', 'non-negative', '-1')),
    ('legacy_index_out_of_range', j({"master": ["m0:1"], "worker": ["w0:1"]}, t("worker", 1)), {},
     raises('ValueError', 'task index 1', '"worker"', '1 task(s)')),
    ('legacy_without_task', j(LEGACY), {},
     raises('ValueError', 'task type must be set')),
    # --- TF accepts these silently; we raise on purpose
    ('index_bool', j(CW, t("worker", True)), {},
     raises('TF accepts: task_id=1', 'true')),
    ('index_fractional_float', j(CW, t("worker", 1.5)), {},
     raises('TF accepts: task_id=1', '1.5')),
    ('model_dir_not_string', j(CW, t("chief", 0), model_dir=5), {},
     raises('TF accepts: model_dir=5', '"model_dir"', 'got 5')),
    ('session_master_not_string', j(CW, t("worker", 0), session_master=5), {},
     raises('TF accepts: master=5', '"session_master"', 'got 5')),
]

PROPERTIES = ["cluster_spec", "task_type", "task_id", "is_chief", "master", "evaluation_master",
              "num_worker_replicas", "num_ps_replicas", "global_id_in_cluster", "model_dir",
              "service"]


def _set_tf_config(monkeypatch, text):
    if text is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", text)


def test_matrix_is_large_and_unique():
    ids = [c[0] for c in CASES]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("tf_config, kwargs, expected",
                         [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_tf_config_matches_tf_estimator(monkeypatch, tf_config, kwargs, expected):
    _set_tf_config(monkeypatch, tf_config)
    if isinstance(expected, types.SimpleNamespace):
        with pytest.raises(ValueError) as info:
            RunConfig(**kwargs)
        for part in expected.match:
            assert part in str(info.value), (part, str(info.value))
        return
    config = RunConfig(**kwargs)
    actual = {p: getattr(config, p) for p in PROPERTIES}
    assert isinstance(actual["cluster_spec"], ClusterSpec)
    actual["cluster_spec"] = actual["cluster_spec"].as_dict()
    assert actual == expected


def test_tf_config_is_read_once_at_construction(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", j(CW, t("worker", 1)))
    config = RunConfig()
    monkeypatch.delenv("TF_CONFIG")
    assert (config.task_type, config.task_id, config.is_chief) == ("worker", 1, False)
    assert config.cluster_spec == CW
    again = config.replace(save_summary_steps=7)
    assert (again.task_type, again.task_id) == ("worker", 1)
    assert again.cluster_spec == config.cluster_spec


# Checkpoint defaults and replace() rules, also checked against tf.estimator 2.15.
@pytest.mark.parametrize("make, steps, secs", [
    (lambda: RunConfig(), None, 600),
    (lambda: RunConfig(save_checkpoints_steps=10), 10, None),
    (lambda: RunConfig(save_checkpoints_secs=None), None, None),
    (lambda: RunConfig(save_checkpoints_steps=None), None, None),
    (lambda: RunConfig(save_checkpoints_steps=None, save_checkpoints_secs=None), None, None),
    (lambda: RunConfig(save_checkpoints_steps=10, save_checkpoints_secs=None), 10, None),
    (lambda: RunConfig(save_checkpoints_steps=0), 0, None),
    (lambda: RunConfig().replace(save_checkpoints_steps=5), 5, None),
    (lambda: RunConfig(save_checkpoints_steps=10).replace(save_checkpoints_secs=5), None, 5),
    (lambda: RunConfig().replace(save_checkpoints_steps=None), None, 600),
    (lambda: RunConfig().replace(save_checkpoints_steps=None, save_checkpoints_secs=None),
     None, None),
], ids=["default", "steps", "secs_none", "steps_none", "both_none", "steps_secs_none", "steps_0",
        "replace_steps", "replace_secs_clears_steps", "replace_steps_none", "replace_both_none"])
def test_checkpoint_steps_and_secs(make, steps, secs):
    config = make()
    assert (config.save_checkpoints_steps, config.save_checkpoints_secs) == (steps, secs)


@pytest.mark.parametrize("make", [
    lambda: RunConfig(save_checkpoints_steps=10, save_checkpoints_secs=20),
    lambda: RunConfig().replace(save_checkpoints_steps=1, save_checkpoints_secs=2),
], ids=["init", "replace"])
def test_checkpoint_steps_and_secs_are_exclusive(make):
    with pytest.raises(ValueError, match="save_checkpoints_steps.*save_checkpoints_secs"):
        make()


def test_defaults():
    config = RunConfig()
    assert config.model_dir is None and config.tf_random_seed is None
    assert config.random_seed is None
    assert (config.save_summary_steps, config.keep_checkpoint_max,
            config.keep_checkpoint_every_n_hours,
            config.log_step_count_steps) == (100, 5, 10000, 100)
    assert config.session_creation_timeout_secs == 7200
    assert config.experimental_max_worker_delay_secs is None
    assert config.train_distribute is None and config.eval_distribute is None
    assert config.session_config is None and config.device_fn is None and config.protocol is None
    assert config.checkpoint_save_graph_def is True


# Validation: TF raises ValueError for each (messages checked against 2.15);
# ours also names the argument and the value. The type checks are ours.
@pytest.mark.parametrize("kwargs, match", [
    ({"save_summary_steps": -1}, "save_summary_steps should be >= 0"),
    ({"save_checkpoints_steps": -1}, "save_checkpoints_steps should be >= 0"),
    ({"save_checkpoints_secs": -1}, "save_checkpoints_secs should be >= 0"),
    ({"keep_checkpoint_max": -1}, "keep_checkpoint_max should be >= 0"),
    ({"keep_checkpoint_every_n_hours": 0}, "keep_checkpoint_every_n_hours should be > 0"),
    ({"log_step_count_steps": 0}, "log_step_count_steps should be > 0"),
    ({"tf_random_seed": "1"}, "tf_random_seed must be integer"),
    ({"session_creation_timeout_secs": 0}, "session_creation_timeout_secs should be > 0"),
    ({"experimental_max_worker_delay_secs": 1.5}, "experimental_max_worker_delay_secs must be"),
    ({"protocol": "http"}, "protocol should be grpc or grpc\\+verbs"),
    ({"device_fn": lambda a, b: None}, "device_fn must be callable with exactly one argument"),
    ({"device_fn": "cpu"}, "device_fn must be callable"),
    ({"save_summary_steps": "10"}, "save_summary_steps must be an integer, got '10'"),
    ({"log_step_count_steps": True}, "log_step_count_steps must be an integer"),
    ({"save_checkpoints_secs": "600"}, "save_checkpoints_secs must be a number"),
    ({"checkpoint_save_graph_def": "yes"}, "checkpoint_save_graph_def must be a bool"),
    ({"model_dir": ""}, "model_dir should be non-empty"),
    ({"model_dir": 5}, "model_dir must be a string"),
])
def test_validation_names_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(**kwargs)


def test_zero_and_none_are_allowed():
    config = RunConfig(save_summary_steps=0, keep_checkpoint_max=0, save_checkpoints_steps=0,
                       keep_checkpoint_every_n_hours=None, log_step_count_steps=None)
    assert config.keep_checkpoint_max == 0 and config.log_step_count_steps is None
    assert RunConfig(keep_checkpoint_max=None).keep_checkpoint_max is None
    assert RunConfig(device_fn=lambda op: "cpu").device_fn(None) == "cpu"


def test_random_seed_alias():
    assert RunConfig(random_seed=3).tf_random_seed == 3
    assert RunConfig(tf_random_seed=3).random_seed == 3
    assert RunConfig(random_seed=3, tf_random_seed=3).random_seed == 3
    with pytest.raises(ValueError, match="random_seed=1, tf_random_seed=2"):
        RunConfig(random_seed=1, tf_random_seed=2)
    assert RunConfig(random_seed=1).replace(random_seed=5).tf_random_seed == 5
    with pytest.raises(ValueError, match="alias"):
        RunConfig().replace(random_seed=1, tf_random_seed=2)


def test_model_dir_path_like_and_tf_config(monkeypatch, tmp_path):
    assert RunConfig(model_dir=tmp_path).model_dir == str(tmp_path)
    assert RunConfig().replace(model_dir=pathlib.Path("/x")).model_dir == "/x"
    monkeypatch.setenv("TF_CONFIG", j(model_dir=str(tmp_path)))
    assert RunConfig(model_dir=tmp_path).model_dir == str(tmp_path)


def test_replace():
    config = RunConfig(model_dir="/a", save_checkpoints_steps=10)
    new = config.replace(model_dir="/b", keep_checkpoint_max=2)
    assert (new.model_dir, new.keep_checkpoint_max, new.save_checkpoints_steps) == ("/b", 2, 10)
    assert (config.model_dir, config.keep_checkpoint_max) == ("/a", 5)
    with pytest.raises(ValueError, match="Replacing foo is not supported"):
        config.replace(foo=1)
    with pytest.raises(ValueError, match="Replacing task_type is not supported"):
        config.replace(task_type="ps")
    with pytest.raises(ValueError, match="save_summary_steps should be >= 0"):
        config.replace(save_summary_steps=-1)
    with pytest.raises(ValueError, match="model_dir should be non-empty"):
        config.replace(model_dir="")


def test_properties_are_read_only():
    config = RunConfig()
    with pytest.raises(AttributeError):
        config.model_dir = "/x"
    with pytest.raises(AttributeError):
        config.is_chief = False


def test_strategies_are_any_object_and_shared_by_replace():
    train, evaluate = object(), object()
    config = RunConfig(train_distribute=train, eval_distribute=evaluate)
    assert config.train_distribute is train and config.eval_distribute is evaluate
    assert config.replace(save_summary_steps=1).train_distribute is train


def test_experimental_distribute():
    train, evaluate = object(), object()
    both = types.SimpleNamespace(train_distribute=train, eval_distribute=evaluate)
    config = RunConfig(experimental_distribute=both)
    assert config.train_distribute is train and config.eval_distribute is evaluate
    with pytest.raises(ValueError, match="Either `train_distribute` or"):
        RunConfig(train_distribute=object(), experimental_distribute=both)
    with pytest.raises(ValueError, match="Either `eval_distribute` or"):
        RunConfig(eval_distribute=object(),
                  experimental_distribute=types.SimpleNamespace(eval_distribute=evaluate))


def test_use_default_sentinel_is_exported():
    assert RunConfig(save_checkpoints_steps=_USE_DEFAULT).save_checkpoints_secs == 600


def test_cluster_without_chief_under_a_strategy_makes_worker_0_chief(set_tf_config):
    """SPEC: the chief writes, worker 0 where the cluster has no chief (TF's
    distribute coordinator accepts such a cluster when a strategy is set)."""
    import distribute
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"], "ps": ["127.0.0.1:3"]}
    strategy = distribute.OneDeviceStrategy("cpu")
    for index, chief in ((0, True), (1, False)):
        set_tf_config(cluster, "worker", index)
        config = RunConfig(train_distribute=strategy)
        assert (config.is_chief, config.num_worker_replicas, config.num_ps_replicas,
                config.global_id_in_cluster) == (chief, 2, 1, index)
    with pytest.raises(ValueError, match='must have one "chief" node'):
        RunConfig()   # without a strategy: TF's rule, one chief required


@pytest.mark.parametrize("task_type", ["chief", "worker", "ps", "evaluator"])
def test_a_cluster_task_without_a_model_dir_is_refused(set_tf_config, task_type):
    """Each task took a temporary directory of its own (TF's rule): the
    evaluator waited for ever for checkpoints the chief wrote elsewhere
    (YAML journey probe: configs/cluster.yaml without model_dir)."""
    set_tf_config({"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]},
                  task_type)

    def model_fn(features, labels, mode):
        raise AssertionError("not called")
    with pytest.raises(ValueError, match=r"model_dir: none given, and (TF_CONFIG's cluster has "
                                         r"3 tasks|this task is TF_CONFIG's evaluator).*same "
                                         r"model_dir"):
        est.Estimator(model_fn, config=est.RunConfig())


def test_a_task_alone_in_tf_config_may_train_in_a_temporary_directory(set_tf_config):
    set_tf_config({"chief": ["127.0.0.1:1"]}, "chief")
    e = est.Estimator(lambda features, labels, mode: None, config=est.RunConfig())
    assert os.path.isdir(e.model_dir)
