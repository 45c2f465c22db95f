"""YAML experiments (estimator.experiment) and the experiment subcommands of
the `estimator` CLI: the bad-file table (exact error text: file, line, key
path, fix), overrides, interpolation, the registry, saving, every config in
configs/, and run/train/evaluate/predict/export/inspect."""
import csv
import io
import glob
import json
import logging
import os
import re
import time
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import yaml

import hooks
from estimator import experiment
from estimator.experiment import cli
from estimator.experiment import ExperimentError
from paths import ROOT

CONFIGS = os.path.join(ROOT, "configs")

MODULE = '''
import numpy as np
import torch
import estimator as est
import hooks


def model_fn(features, labels, mode, params):
    net = est.get_module("linear", lambda: torch.nn.Linear(2, 1))
    pred = net(features["x"])
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"y": pred})
    loss = torch.nn.functional.mse_loss(pred, labels)
    if mode == est.ModeKeys.EVAL:
        return est.EstimatorSpec(mode, loss=loss)
    opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=params.get("lr", 0.1)))
    return est.EstimatorSpec(mode, loss=loss, train_op=opt)


def input_fn(params, mode):
    rng = np.random.RandomState(0)
    x = rng.randn(64, 2).astype(np.float32)
    y = x @ np.array([[1.0], [-1.0]], dtype=np.float32)
    batches = [({"x": x[i:i + 16]}, y[i:i + 16]) for i in range(0, 64, 16)]
    return batches * 100 if mode == est.ModeKeys.TRAIN else batches


def bad_model_fn(features, labels, mode, hparams):
    pass


def file_input_fn(path):
    return []


def empty_input_fn(params, mode):
    return []


def serve_nothing():
    features = {"x": est.export.placeholder(torch.float32, [None, 2])}   # (no return)


class CountingHook(hooks.SessionRunHook):
    """Counts steps; a hook class of the user's, named by file path."""
    instances = []

    def __init__(self, every=1):
        self.every, self.steps = every, 0
        CountingHook.instances.append(self)

    def after_run(self, run_context, run_values):
        self.steps += 1
'''

HEAD = """\
model_fn: mod.py:model_fn
train_spec:
  input_fn: mod.py:input_fn
"""


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A directory with mod.py (model_fn, input_fn, ...) and broken.py; the
    experiment files go there too."""
    (tmp_path / "mod.py").write_text(MODULE)
    (tmp_path / "broken.py").write_text("def input_fn(:\n")
    (tmp_path / "failing.py").write_text("import json\n\nVOCAB = json.loads('[1, 2')\n")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("mod", None)


def write(workdir, text, name="exp.yaml"):
    path = workdir / name
    path.write_text(text)
    return str(path)


# -- the bad-file table: the exact error, with file, line, key path and fix ------------
RUN_CONFIG_KEYS = (
    "model_dir", "tf_random_seed", "save_summary_steps", "save_checkpoints_steps",
    "save_checkpoints_secs", "session_config", "keep_checkpoint_max",
    "keep_checkpoint_every_n_hours", "log_step_count_steps", "train_distribute", "device_fn",
    "protocol", "eval_distribute", "experimental_distribute",
    "experimental_max_worker_delay_secs", "session_creation_timeout_secs",
    "checkpoint_save_graph_def", "random_seed", "experimental_async_checkpoint",
    "experimental_prefetch_batches")

_NO_CUDA = (f"this machine has {torch.cuda.device_count()} CUDA device(s); "
            + (f"use cuda:0..cuda:{torch.cuda.device_count() - 1}"
               if torch.cuda.device_count() else "use cpu or cpu:N replicas"))

BAD = [
    ("unknown key, closest suggested", HEAD + "run_config:\n  save_checkpoint_steps: 10\n",
     "{f}:5: run_config.save_checkpoint_steps: unknown key 'save_checkpoint_steps'; did you "
     "mean 'save_checkpoints_steps'?"),
    ("unknown top-level key, valid ones listed", HEAD + "colour: blue\n",
     "{f}:4: colour: unknown key 'colour'; valid keys at the top level: model_fn, estimator, "
     "params, run_config, train_spec, eval_spec, predict_spec, export, warm_start"),
    ("quoted number", HEAD + "  max_steps: '100'\n",
     "{f}:4: train_spec.max_steps: expected a positive integer, got a string '100'; "
     "remove the quotes: max_steps: 100"),
    ("wrong type", HEAD + "  max_steps: lots\n",
     "{f}:4: train_spec.max_steps: expected a positive integer, got a string 'lots'; "
     "e.g. max_steps: 100"),
    ("float for an integer", HEAD + "eval_spec: {input_fn: mod.py:input_fn, steps: 12.5}\n",
     "{f}:4: eval_spec.steps: expected a positive integer, got a number 12.5; e.g. steps: 100"),
    ("negative value", HEAD + "run_config:\n  save_summary_steps: -1\n",
     "{f}:5: run_config.save_summary_steps: must be >= 0, got -1; e.g. save_summary_steps: 2"),
    ("missing model_fn", "params: {lr: 0.1}\ntrain_spec:\n  input_fn: mod.py:input_fn\n",
     "{f}:1: model_fn: missing required key 'model_fn'; add model_fn: package.module:function "
     "at the top level, or a canned estimator: estimator: {{DNNClassifier: {{hidden_units: "
     "[10], feature_columns: package.module:feature_columns}}}}"),
    ("missing input_fn", "model_fn: mod.py:model_fn\ntrain_spec:\n  max_steps: 10\n",
     "{f}:2: train_spec.input_fn: missing required key 'input_fn'; add input_fn: "
     "package.module:function under train_spec"),
    ("import error: no module", "model_fn: nosuchpkg.models:model_fn\n",
     "{f}:1: model_fn: cannot import 'nosuchpkg.models': no module named 'nosuchpkg'; install it "
     "or put its directory on PYTHONPATH, or name the file instead (path/to/file.py:function)"),
    ("import error: misspelt function", "model_fn: mod.py:modle_fn\n",
     "{f}:1: model_fn: cannot import 'mod.py:modle_fn': mod.py has no 'modle_fn'; did you mean "
     "'model_fn'?"),
    ("import error: no file", "model_fn: nothere.py:model_fn\n",
     "{f}:1: model_fn: cannot import from 'nothere.py': no such file (looked for {d}/nothere.py); "
     "a file path is relative to the experiment file's directory or the current directory"),
    ("import error: the module fails", "model_fn: broken.py:input_fn\n",
     "{f}:1: model_fn: importing 'broken.py' ({d}/broken.py) failed: SyntaxError: invalid syntax "
     "({d}/broken.py, line 1); fix that file"),
    ("import error: the module raises", "model_fn: failing.py:model_fn\n",   # (it had no line)
     "{f}:1: model_fn: importing 'failing.py' ({d}/failing.py) failed: JSONDecodeError: "
     "Expecting ',' delimiter: line 1 column 6 (char 5) ({d}/failing.py, line 3); fix that "
     "file"),
    ("model_fn signature", "model_fn: mod.py:bad_model_fn\n",
     "{f}:1: model_fn: mod.py:bad_model_fn: model_fn has unexpected arguments ['hparams']; it "
     "may take features, labels, mode, params, config"),
    ("input_fn signature", "model_fn: mod.py:model_fn\ntrain_spec:\n  input_fn: "
     "mod.py:file_input_fn\n",
     "{f}:3: train_spec.input_fn: mod.py:file_input_fn: input_fn takes 'path', which the "
     "Estimator cannot pass (it passes params, mode, config, input_context by name); give it a "
     "default or read it from params"),
    ("bad strategy name", HEAD + "run_config:\n  train_distribute: {OneDeviceStrategi: "
     "{device: cpu}}\n",
     "{f}:5: run_config.train_distribute.OneDeviceStrategi: unknown strategy "
     "'OneDeviceStrategi'; did you mean 'OneDeviceStrategy'?"),
    ("bad device string", HEAD + "run_config:\n  train_distribute:\n    OneDeviceStrategy: "
     "{device: gpu0}\n",
     "{f}:6: run_config.train_distribute.OneDeviceStrategy.device: 'gpu0' is not a device; "
     "write cpu, cpu:N or cuda:N (TF's /cpu:0 and /gpu:N are accepted too)"),
    ("device this machine lacks", HEAD + "run_config:\n  train_distribute:\n    "
     "MirroredStrategy:\n      devices: [cpu:0, cuda:99]\n",
     "{f}:7: run_config.train_distribute.MirroredStrategy.devices[1]: 'cuda:99': " + _NO_CUDA),
    ("strategy missing an argument", HEAD + "run_config:\n  train_distribute: "
     "OneDeviceStrategy\n",
     "{f}:5: run_config.train_distribute: OneDeviceStrategy needs argument 'device'; add it: "
     "OneDeviceStrategy: {{device: ...}}"),
    ("bad hook argument", HEAD + "  hooks:\n    - LoggingTensorHook: {tensors: [loss], "
     "every_n_iters: 10}\n",
     "{f}:5: train_spec.hooks[0].LoggingTensorHook.every_n_iters: LoggingTensorHook has no "
     "argument 'every_n_iters'; did you mean 'every_n_iter'?"),
    ("hook missing an argument", HEAD + "  hooks:\n    - LoggingTensorHook: {every_n_iter: 10}\n",
     "{f}:5: train_spec.hooks[0].LoggingTensorHook: LoggingTensorHook needs argument 'tensors'; "
     "add it: LoggingTensorHook: {{tensors: ...}}"),
    ("unknown hook", HEAD + "  hooks:\n    - LogingTensorHook: {tensors: [loss]}\n",
     "{f}:5: train_spec.hooks[0].LogingTensorHook: unknown hook 'LogingTensorHook'; did you "
     "mean 'LoggingTensorHook'?"),
    ("two hooks in one item", HEAD + "  hooks:\n    - StopAtStepHook: {last_step: 5}\n"
     "      NanTensorHook: {}\n",
     "{f}:5: train_spec.hooks[0]: expected one hook written as Name or Name: {{argument: "
     "value}}; it has 2 keys (StopAtStepHook, NanTensorHook); give each hook as its own list "
     "item; e.g. {{LoggingTensorHook: {{tensors: [loss], every_n_iter: 100}}}}"),
    ("hooks not a list", HEAD + "  hooks: {StopAtStepHook: {last_step: 5}}\n",
     "{f}:4: train_spec.hooks: expected a list of hooks, each Name or Name: {{argument: value}}, "
     "got a mapping {{'StopAtStepHook': {{'last_step': 5}}}}; e.g. hooks: [{{LoggingTensorHook: "
     "{{tensors: [loss], every_n_iter: 100}}}}]"),
    ("unknown exporter", HEAD + "eval_spec:\n  input_fn: mod.py:input_fn\n  exporters:\n"
     "    - LatestExport: {name: x}\n",
     "{f}:7: eval_spec.exporters[0].LatestExport: unknown exporter 'LatestExport'; did you mean "
     "'LatestExporter'?"),
    ("exporter's function import", HEAD + "eval_spec:\n  input_fn: mod.py:input_fn\n"
     "  exporters:\n    - LatestExporter: {name: x, serving_input_receiver_fn: mod.py:serve}\n",
     "{f}:7: eval_spec.exporters[0].LatestExporter.serving_input_receiver_fn: cannot import "
     "'mod.py:serve': mod.py has no 'serve'; it defines: CountingHook, bad_model_fn, "
     "empty_input_fn, file_input_fn, input_fn, model_fn, serve_nothing"),
    ("malformed YAML", "model_fn: mod.py:model_fn\ntrain_spec:\n  input_fn: mod.py:input_fn\n"
     "   max_steps: 5\n",
     "{f}:4: malformed YAML: mapping values are not allowed here at column 13; fix the YAML "
     "syntax on this line (indentation, ':' after each key, closed quotes and brackets)"),
    ("a key without its colon", HEAD + "params:\n  layers: 2\n  lr 0.1\n  seed: 3\n",
     "{f}:6: malformed YAML: 'lr 0.1' is not a 'key: value' pair; put ': ' after the key (or, "
     "for a value continued from the line above, indent it under that key)"),
    ("a tab for indentation", HEAD + "params:\n\tlr: 0.1\n",
     "{f}:5: malformed YAML: found character '\\t' that cannot start any token (while "
     "scanning for the next token) at column 1; indent with spaces: YAML does not take tabs "
     "for indentation"),
    ("a first key without its colon", HEAD + "params:\n  lr 0.1\n  # seed\n\n  seed: 3\n",
     "{f}:5: malformed YAML: 'lr 0.1' is not a 'key: value' pair; put ': ' after the key (or, "
     "for a value continued from the line above, indent it under that key)"),
    ("unclosed bracket", HEAD + "params: {lr: 0.1\n",
     "{f}:5: malformed YAML: expected ',' or '}}', but got '<stream end>' (while parsing a flow "
     "mapping started on line 4) at column 1; close the bracket opened on line 4, or fix the "
     "YAML syntax on this line"),
    ("a reference unquoted in a flow mapping", HEAD + "params: {lr: 0.1, b: ${params.lr}}\n",
     "{f}:4: malformed YAML: expected ',' or '}}', but got '{{' (while parsing a flow mapping) "
     "at column 23; quote a ${{...}} reference inside {{...}} or [...] ('${{a.b}}'): unquoted, "
     "its braces are YAML's"),
    ("duplicate key", HEAD + "run_config:\n  model_dir: a\n  model_dir: b\n",
     "{f}:6: run_config.model_dir: duplicate key (first given on line 5); keep only one of "
     "them"),
    ("both checkpoint triggers", HEAD + "run_config:\n  save_checkpoints_steps: 10\n"
     "  save_checkpoints_secs: 60\n",
     "{f}:6: run_config.save_checkpoints_secs: save_checkpoints_steps and save_checkpoints_secs "
     "cannot both be set; keep one (set the other to null)"),
    ("RunConfig rejects a value", HEAD + "run_config:\n  keep_checkpoint_every_n_hours: 0\n",
     "{f}:5: run_config.keep_checkpoint_every_n_hours: RunConfig rejected it: "
     "keep_checkpoint_every_n_hours should be > 0, got 0"),
    ("interpolation of a missing key", HEAD + "run_config: {model_dir: /tmp/x}\n"
     "eval_spec: {input_fn: mod.py:input_fn, name: '${run_config.modeldir}'}\n",
     "{f}:5: eval_spec.name: ${{run_config.modeldir}} refers to run_config.modeldir, which is "
     "not in the experiment; did you mean ${{run_config.model_dir}}?"),
    # A reference that fails because a key is misspelt or of the wrong kind:
    # that mistake, not the reference's error (which said to use the typo).
    ("a misspelt key a reference names", HEAD + "runconfig: {model_dir: /tmp/x}\n"
     "eval_spec: {input_fn: mod.py:input_fn, name: '${run_config.model_dir}'}\n",
     "{f}:4: runconfig: unknown key 'runconfig'; did you mean 'run_config'?"),
    ("a list where a reference names a key", HEAD + "run_config: [{model_dir: /tmp/x}]\n"
     "eval_spec: {input_fn: mod.py:input_fn, name: '${run_config.model_dir}'}\n",
     "{f}:4: run_config: expected a mapping of keys (" + ", ".join(RUN_CONFIG_KEYS) + "), got "
     "a list [{{'model_dir': '/tmp/x'}}]; indent its keys under run_config:"),
    ("an unclosed reference", HEAD + "run_config: {model_dir: 'runs/${params.seed'}\n",
     "{f}:4: run_config.model_dir: 'runs/${{params.seed': the ${{ at character 6 is not "
     "closed; close it with }} (a reference: ${{section.key}}), or write $${{ for a literal "
     "${{"),
    ("interpolation cycle", HEAD + "params: {a: '${params.b}', b: '${params.a}'}\n",
     "{f}:4: params.a: interpolation cycle: params.a -> params.b -> params.a; make one of these "
     "a plain value"),
    ("unset environment variable", HEAD + "params: {a: '${env:NO_SUCH_VAR_X}'}\n",
     "{f}:4: params.a: ${{env:NO_SUCH_VAR_X}}: environment variable 'NO_SUCH_VAR_X' is not set; "
     "set it, or give a default as ${{env:NO_SUCH_VAR_X:-value}}"),
    ("Python tag", HEAD + "params: !!python/object/apply:os.system ['echo hi']\n",
     "{f}:4: params: the tag 'tag:yaml.org,2002:python/object/apply:os.system' is not allowed; "
     "experiment files hold plain YAML values only (no Python tags)"),
    ("not a mapping", "- model_fn: mod.py:model_fn\n",
     "{f}:1: an experiment is a mapping of keys (model_fn, params, run_config, train_spec, "
     "eval_spec, ...), but this file is a list [{{'model_fn': 'mod.py:model_fn'}}]; start with "
     "model_fn: package.module:model_fn"),
]


@pytest.mark.parametrize("text, expected", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_experiment_file_gives_the_exact_error(workdir, text, expected):
    path = write(workdir, text)
    with pytest.raises(ExperimentError) as info:
        experiment.load(path)
    assert str(info.value) == expected.format(f=path, d=workdir)
    assert len(info.value.problems) == 1


def test_every_mistake_of_a_file_and_its_overrides_is_said_at_once(workdir):
    """A duplicate key hid every other mistake, schema mistakes hid every
    reference error, and only the first reference error was said: a file of
    five mistakes took five runs to fix (docs probe). A reference a mistake
    explains (its key misspelt beside it) is still left out."""
    path = write(workdir, HEAD + "  max_steps: ten\n"
                 "run_config:\n  model_dir: /tmp/a\n  model_dir: /tmp/b\n"
                 "  save_checkpoint_steps: 10\n"
                 "params: {batch_size: 8, a: '${nope.x'}\n"
                 "eval_spec: {input_fn: mod.py:input_fn, steps: '${params.bsize}',\n"
                 "            throttle_secs: '${run_config.save_checkpoints_steps}',\n"
                 "            name: '${run_config.tf_random_sed}'}\n")
    with pytest.raises(ExperimentError) as info:
        experiment.load(path, ["eval_spec.hooks[0].X=1", "eval_spec.start_delay_secs=soon"])
    f = path
    assert str(info.value).splitlines() == [
        f"{f}:7: run_config.model_dir: duplicate key (first given on line 6); keep only one "
        "of them",
        "--set eval_spec.hooks[0].X=1: eval_spec.hooks: eval_spec.hooks is not in the "
        "experiment, so it has no item [0]; set the whole list, e.g. --set "
        "'eval_spec.hooks=[...]'",
        f"{f}:8: run_config.save_checkpoint_steps: unknown key 'save_checkpoint_steps'; did "
        "you mean 'save_checkpoints_steps'?",
        f"{f}:4: train_spec.max_steps: expected a positive integer, got a string 'ten'; e.g. "
        "max_steps: 100",
        "--set eval_spec.start_delay_secs=soon: eval_spec.start_delay_secs: expected a number "
        ">= 0, got a string 'soon'; e.g. start_delay_secs: 60",
        f"{f}:9: params.a: '${{nope.x': the ${{ at character 1 is not closed; close it with }} "
        "(a reference: ${section.key}), or write $${ for a literal ${",
        f"{f}:10: eval_spec.steps: ${{params.bsize}} refers to params.bsize, which is not in "
        "the experiment; did you mean ${params.batch_size}?",
        f"{f}:12: eval_spec.name: ${{run_config.tf_random_sed}} refers to "
        "run_config.tf_random_sed, which is not in the experiment; run_config has: model_dir, "
        "save_checkpoint_steps"]


def test_a_failed_override_leaves_the_file_as_it_was(workdir):
    """`--set run_config.foo.bar[0]=1` made `run_config.foo` before it
    failed, which then was said as an unknown key of the file (attack probe)."""
    with pytest.raises(ExperimentError) as info:
        experiment.load(write(workdir, HEAD), ["run_config.foo.bar[0]=1"])
    assert len(info.value.problems) == 1
    assert str(info.value).startswith("--set run_config.foo.bar[0]=1: run_config.foo.bar: ")


def test_an_empty_environment_variable_takes_the_default_as_in_a_shell(workdir, monkeypatch):
    """`${env:MODEL_DIR:-runs}` with MODEL_DIR exported empty (a pod
    template's) gave an empty model_dir, which RunConfig refused."""
    monkeypatch.setenv("EMPTY_X", "")
    monkeypatch.setenv("SET_X", "b")
    exp = experiment.load(write(workdir, HEAD + "params: {a: '${env:EMPTY_X:-dflt}', "
                                "b: '${env:SET_X:-dflt}', c: 'x${env:EMPTY_X}y'}\n"))
    assert exp.params == {"a": "dflt", "b": "b", "c": "xy"}


def test_a_path_from_the_home_directory_is_taken_as_a_shell_takes_it(workdir, monkeypatch):
    """`model_dir: ~/runs/x` made a directory named `~` where the command ran."""
    monkeypatch.setenv("HOME", str(workdir / "home"))
    exp = experiment.load(write(workdir, HEAD + "run_config: {model_dir: ~/runs/x}\n"
                                "warm_start: ~/old/model.ckpt-5\n"))
    assert exp.estimator().model_dir == str(workdir / "home" / "runs" / "x")
    assert exp.config["warm_start"]["ckpt_to_initialize_from"] == str(
        workdir / "home" / "old" / "model.ckpt-5")


def test_integral_float_steps_are_taken_as_trainspec_takes_them(workdir):
    exp = experiment.load(write(workdir, HEAD + "  max_steps: 250.0\n"))
    assert exp.train_spec(exp.estimator()).max_steps == 250
    with pytest.raises(ExperimentError, match="max_steps: expected a positive integer, got"):
        experiment.load(write(workdir, HEAD + "  max_steps: 250.5\n"))


def test_tf_only_run_config_keys_are_accepted_and_ignored_as_by_run_config(workdir, caplog):
    """The YAML takes what RunConfig takes: session_config does nothing here,
    and RunConfig says so."""
    path = write(workdir, HEAD + "run_config:\n  session_config: {allow_soft_placement: true}\n")
    exp = experiment.load(path)
    with caplog.at_level("WARNING", logger="estimator.run_config"):
        config = exp.run_config()
    assert config.session_config == {"allow_soft_placement": True}
    assert "session_config is accepted for TF compatibility and ignored" in caplog.text


def test_run_config_says_its_lines_once_a_run(workdir, caplog, monkeypatch):
    """The check of the YAML's run_config built a RunConfig of its own: every
    RunConfig line (TF_CONFIG, keys ignored) was said twice. They are said at
    load, so by --print-config and inspect too, and not again by the run."""
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"chief": ["127.0.0.1:1"]}, "task": {"type": "chief", "index": 0}}))
    path = write(workdir, HEAD + "run_config:\n  session_config: {allow_soft_placement: true}\n")
    with caplog.at_level("INFO", logger="estimator.run_config"):
        exp = experiment.load(path)
        assert caplog.text.count("session_config is accepted") == 1
        exp.run_config()
    assert caplog.text.count("TF_CONFIG environment variable") == 1
    assert caplog.text.count("session_config is accepted") == 1
    assert not logging.getLogger("estimator.run_config").disabled


def test_the_table_is_long_enough():
    assert len(BAD) >= 15


def test_every_problem_is_reported_at_once(workdir):
    path = write(workdir, HEAD + "  max_stepz: 5\nrun_config:\n  model_dir: 3\n"
                                 "eval_spec:\n  input_fn: mod.py:nope\n")
    with pytest.raises(ExperimentError) as info:
        experiment.load(path)
    lines = str(info.value).splitlines()
    assert [line.split(": ")[0:2] for line in lines] == [
        [f"{path}:6", "run_config.model_dir"], [f"{path}:4", "train_spec.max_stepz"],
        [f"{path}:8", "eval_spec.input_fn"]]


def test_missing_file(workdir):
    with pytest.raises(ExperimentError, match=r"^nope\.yaml: no such experiment file; check "
                                               r"the path"):
        experiment.load("nope.yaml")


@pytest.mark.parametrize("override, expected", [
    ("train_spec.max_stepz=5", "--set train_spec.max_stepz=5: train_spec.max_stepz: unknown key "
                               "'max_stepz'; did you mean 'max_steps'?"),
    ("train_spec.max_steps", "--set train_spec.max_steps: expected --set key.path=value, e.g. "
                             "--set train_spec.max_steps=100"),
    ("train_spec.input_fn.x=1", "--set train_spec.input_fn.x=1: train_spec.input_fn.x: "
                                "train_spec.input_fn is a string, not a mapping; set it as a "
                                "whole instead"),
    ("train_spec.max_steps=[1", "--set train_spec.max_steps=[1: the value is not valid YAML "
                                "(expected ',' or ']', but got '<stream end>'); quote it, e.g. "
                                "--set key='text'"),
    ("train_spec.max_steps=-3", "--set train_spec.max_steps=-3: train_spec.max_steps: must be > "
                                "0, got -3; e.g. max_steps: 100"),
])
def test_bad_override_names_the_override(workdir, override, expected):
    with pytest.raises(ExperimentError) as info:
        experiment.load(write(workdir, HEAD), [override])
    assert str(info.value) == expected


# -- overrides, interpolation, anchors -----------------------------------------------------
def test_overrides_are_yaml_scalars_and_reach_into_lists(workdir):
    path = write(workdir, HEAD + "  hooks:\n    - LoggingTensorHook: {tensors: [loss], "
                                 "every_n_iter: 100}\n")
    exp = experiment.load(path, ["params.lr=1e-3", "params.layers=[8, 8]", "params.name=abc",
                                 "params.flag=true", "params.none=null",
                                 "train_spec.hooks[0].LoggingTensorHook.every_n_iter=7",
                                 "train_spec.max_steps=12"])
    assert exp.params == {"lr": 0.001, "layers": [8, 8], "name": "abc", "flag": True,
                          "none": None}
    assert exp.config["train_spec"]["max_steps"] == 12
    estimator = exp.estimator()
    (hook,) = exp.train_spec(estimator).hooks
    assert isinstance(hook, hooks.LoggingTensorHook)
    assert exp.config["train_spec"]["hooks"] == [
        {"LoggingTensorHook": {"tensors": ["loss"], "every_n_iter": 7}}]


def test_interpolation_keeps_types_reads_the_environment_and_escapes(workdir, monkeypatch):
    monkeypatch.setenv("STEPS_X", "25")
    path = write(workdir, HEAD + (
        "  max_steps: ${env:STEPS_X}\n"
        "params: {units: 8, layers: ['${params.units}', 4], tag: 'u${params.units}-$${literal}',\n"
        "         default: '${env:NO_SUCH_VAR_X:-0.5}'}\n"
        "run_config: {model_dir: '${env:NO_SUCH_VAR_X:-runs}/m${params.units}'}\n"
        "x-shared: {steps: 3}\n"
        "eval_spec: {input_fn: mod.py:input_fn, steps: '${x-shared.steps}'}\n"))
    exp = experiment.load(path)
    assert exp.config["train_spec"]["max_steps"] == 25
    assert exp.params == {"units": 8, "layers": [8, 4], "tag": "u8-${literal}", "default": 0.5}
    assert exp.model_dir == "runs/m8"
    assert exp.config["eval_spec"]["steps"] == 3


def test_yaml_anchors_and_merge_keys(workdir):
    path = write(workdir, textwrap.dedent("""\
        model_fn: mod.py:model_fn
        x-input: &input {input_fn: mod.py:input_fn}
        train_spec: {<<: *input, max_steps: 7}
        eval_spec: {<<: *input, steps: 2}
        """))
    exp = experiment.load(path)
    assert exp.config["train_spec"]["max_steps"] == 7
    assert exp.function("eval_spec", "input_fn") is exp.function("train_spec", "input_fn")


def test_print_config_round_trips(workdir):
    path = write(workdir, HEAD + "  max_steps: 5\nrun_config:\n  model_dir: runs/x\n")
    exp = experiment.load(path)
    again = write(workdir, exp.to_yaml(), "again.yaml")
    assert experiment.load(again).config == exp.config
    resolved = yaml.safe_load(exp.to_yaml())
    assert resolved["model_fn"] == f"{workdir}/mod.py:model_fn"     # absolute: runs anywhere
    assert (resolved["run_config"]["save_checkpoints_steps"],       # TF's rule, spelt out
            resolved["run_config"]["save_checkpoints_secs"]) == (None, 600)


def test_a_set_that_adds_a_key_to_params_is_warned(workdir, caplog):
    """params are free-form, as TF's: a typo in a sweep's --set added a key
    model_fn never read, and every run of the sweep trained the same model."""
    path = write(workdir, HEAD + "params: {learning_rate: 0.1, hidden: {units: 8}}\n")
    with caplog.at_level(logging.WARNING):
        exp = experiment.load(path, ["params.learnin_rate=0.3", "params.learning_rate=0.2",
                                     "params.hidden.unit=4", "params.hidden.units=5"])
    assert exp.params["learning_rate"] == 0.2 and exp.params["learnin_rate"] == 0.3
    assert [r.getMessage() for r in caplog.records] == [
        "--set params.learnin_rate=0.3: params has no key 'learnin_rate', so it is added "
        "(did you mean 'learning_rate'?)",
        "--set params.hidden.unit=4: params.hidden has no key 'unit', so it is added "
        "(did you mean 'units'?)"]


def test_set_null_removes_a_section(workdir):
    """`--set predict_spec=null` said "missing required key 'input_fn'"."""
    path = write(workdir, HEAD + "predict_spec: {input_fn: mod.py:input_fn}\n"
                                 f"export: {{serving_input_receiver_fn: {ROOT}/examples/"
                                 "export_and_serve.py:serving_input_receiver_fn}\n")
    exp = experiment.load(path, ["predict_spec=null", "export=null"])
    assert "predict_spec" not in exp.config and "export" not in exp.config
    assert "predict_spec" in experiment.load(path).config


def test_saved_strings_read_back_as_they_were(workdir):
    """A literal `$${...}` was saved as `${...}`, which a rerun of the saved
    file interpolated (or failed on); strings YAML 1.2 reads as floats
    (`"1e-3"`, a git sha `8e12`) were saved bare and came back as floats."""
    path = write(workdir, HEAD + "  max_steps: 5\n" + textwrap.dedent("""\
        params:
          out: "preds_$${params.n}.csv"
          price: "cost $${x and $${ ${params.n}"
          n: 16
          tags: ["1e-3", "+1E3", "2e5", "1e+3", "yes", "${params.n}"]
          rate: 1e-3
        """))
    exp = experiment.load(path, overrides=['params.rev="8e12"'])
    assert exp.params == {"out": "preds_${params.n}.csv", "n": 16, "rate": 0.001, "rev": "8e12",
                          "tags": ["1e-3", "+1E3", "2e5", "1e+3", "yes", 16],
                          "price": "cost ${x and ${ 16"}   # (a literal ${ nothing closes)
    again = experiment.load(write(workdir, exp.to_yaml(), "again.yaml"))
    assert again.params == exp.params


# -- the registry ----------------------------------------------------------------------------
def test_names_are_looked_up_when_loading_so_new_hooks_need_no_edit(workdir, monkeypatch):
    class BrandNewHook(hooks.SessionRunHook):
        def __init__(self, level: int):
            self.level = level

    path = write(workdir, HEAD + "  hooks: [{BrandNewHook: {level: 3}}]\n")
    with pytest.raises(ExperimentError, match="unknown hook 'BrandNewHook'"):
        experiment.load(path)
    monkeypatch.setattr(hooks, "BrandNewHook", BrandNewHook, raising=False)
    exp = experiment.load(path)
    (hook,) = exp.train_spec(exp.estimator()).hooks
    assert isinstance(hook, BrandNewHook) and hook.level == 3


def test_user_classes_by_file_path_and_injected_estimator(workdir):
    path = write(workdir, HEAD + (
        "  max_steps: 6\n"
        "  hooks:\n"
        "    - mod.py:CountingHook: {every: 2}\n"
        "    - stop_if_no_decrease_hook: {metric_name: loss, max_steps_without_decrease: 100}\n"
        "run_config: {model_dir: run, save_checkpoints_steps: 3}\n"))
    exp = experiment.load(path)
    estimator = exp.estimator()
    spec = exp.train_spec(estimator)
    counting, early = spec.hooks
    assert type(counting).__name__ == "CountingHook" and counting.every == 2
    assert isinstance(early, hooks.SessionRunHook)      # built with the Estimator injected
    estimator.train(spec.input_fn, hooks=list(spec.hooks), max_steps=spec.max_steps)
    assert counting.steps == 6


def test_set_reaches_a_hook_named_by_import_path_and_names_a_misspelt_hook(workdir):
    """A hook's key with dots in it (`mod.py:CountingHook`) could not be
    reached by --set (a second key, then "it has 2 keys" at the file's line);
    it is quoted now. A misspelt name said the same, about the file."""
    path = write(workdir, HEAD + (
        "  hooks:\n"
        "    - mod.py:CountingHook: {every: 2}\n"
        "    - LoggingTensorHook: {tensors: [loss], every_n_iter: 100}\n"))
    exp = experiment.load(path, ['train_spec.hooks[0]."mod.py:CountingHook".every=5',
                                 "train_spec.hooks[1].LoggingTensorHook.every_n_iter=3"])
    counting, logging_hook = exp.train_spec(exp.estimator()).hooks
    assert counting.every == 5 and exp.config["train_spec"]["hooks"][1] == {
        "LoggingTensorHook": {"tensors": ["loss"], "every_n_iter": 3}}
    with pytest.raises(ExperimentError) as info:
        experiment.load(path, ["train_spec.hooks[1].LogingTensorHook.every_n_iter=3"])
    assert str(info.value) == (
        "--set train_spec.hooks[1].LogingTensorHook.every_n_iter=3: "
        "train_spec.hooks[1].LogingTensorHook: train_spec.hooks[1] is LoggingTensorHook, not "
        "LogingTensorHook; did you mean --set "
        "train_spec.hooks[1].LoggingTensorHook.every_n_iter=...? (to replace the item, set "
        "train_spec.hooks[1] itself)")
    with pytest.raises(ExperimentError, match=r'train_spec.hooks\[0\] is "mod.py:CountingHook"'):
        experiment.load(path, ["train_spec.hooks[0].CountingHook.every=5"])


def test_tf_device_names_are_normalised(workdir):
    path = write(workdir, HEAD + "run_config:\n  train_distribute: {OneDeviceStrategy: "
                                 "{device: /cpu:0}}\n")
    exp = experiment.load(path)
    assert exp.config["run_config"]["train_distribute"] == {
        "OneDeviceStrategy": {"device": "cpu:0"}}
    strategy = exp.run_config().train_distribute
    assert str(strategy.extended._device) == "cpu:0"


def test_constructor_errors_are_located(workdir):
    path = write(workdir, HEAD + "  hooks:\n    - StopAtStepHook: {}\n")
    exp = experiment.load(path)
    with pytest.raises(ExperimentError) as info:
        exp.train_spec(exp.estimator())
    assert str(info.value) == (
        f"{path}:5: train_spec.hooks[0].StopAtStepHook: StopAtStepHook rejected it: "
        "StopAtStepHook: one of num_steps or last_step must be specified.")


def test_an_exporter_s_problem_is_located_at_the_exporters(workdir):
    """"An Exporter cannot have a name that is None or empty" was said at
    eval_spec.name, the eval dir's name: the key the message's word `name`
    matched (YAML journey probe)."""
    path = write(workdir, HEAD + "eval_spec:\n  input_fn: mod.py:input_fn\n  name: holdout\n"
                 "  exporters:\n    - LatestExporter: {name: '', serving_input_receiver_fn: "
                 "mod.py:serve_nothing}\n")
    exp = experiment.load(path)
    with pytest.raises(ExperimentError) as info:
        exp.eval_spec(exp.estimator())
    assert str(info.value).startswith(f"{path}:7: eval_spec.exporters: EvalSpec rejected it: "
                                      "An Exporter cannot have a name")


@pytest.mark.parametrize("value, said", [
    ("no", "no is read as the boolean false (YAML 1.1)"),
    ("On", "On is read as the boolean true (YAML 1.1)"),
    ("0123", "0123 is read as the octal number 83 (YAML 1.1)"),
    ("12:30", "12:30 is read as the base-60 number 750 (YAML 1.1)"),
    ("2024-01-02", "2024-01-02 is read as the date datetime.date(2024, 1, 2) (YAML 1.1)"),
])
def test_values_yaml_1_1_reads_otherwise_are_said(workdir, caplog, value, said):
    """`country: NO` reached model_fn as False, `tag: 0123` as 83, without a
    word (YAML journey probe); quoted, or true/false/123, nothing is said."""
    path = write(workdir, HEAD + f"params:\n  a: {value}\n  b: '{value}'\n  c: true\n"
                 "  d: 123\n  e: 0x1F\n  f: 1e-3\n  g: 1_000\n  h: 07\n  on: 1\n")
    with caplog.at_level(logging.WARNING, logger="estimator.experiment._yaml"):
        exp = experiment.load(path, [f"params.i={value}", f"params.j='{value}'",
                                     f"params.k=[1, {value}]", f"params.l={{m: {value}}}"])
    assert exp.params["b"] == exp.params["j"] == value and exp.params["on"] == 1
    assert [r.getMessage() for r in caplog.records if r.name.endswith("_yaml")] == [
        f"{path}:5: params.a: {said}; quote it ('{value}') for the text as written",
        f"--set params.i={value}: {said}; quote it ('{value}') for the text as written",
        f"--set params.k=[1, {value}]: [1]: {said}; quote it ('{value}') for the text as "
        "written",
        f"--set params.l={{m: {value}}}: m: {said}; quote it ('{value}') for the text as "
        "written"]


def test_a_users_file_named_as_a_library_package_is_said_to_be_shadowed(workdir):
    """`hooks:MyHook` with a hooks.py beside the file imported the library's
    `hooks` and suggested one of its modules (YAML journey probe)."""
    (workdir / "hooks.py").write_text("class MyHook:\n    pass\n")
    path = write(workdir, HEAD + "  hooks:\n    - hooks:MyHook: {}\n")
    with pytest.raises(ExperimentError, match=r"hooks.py is not what 'hooks' imports: the "
                                              r"library's own package 'hooks' has that name; "
                                              r"name the file by its path, hooks.py:MyHook"):
        experiment.load(path)
    experiment.load(write(workdir, HEAD + "  hooks:\n    - hooks.py:MyHook: {}\n"))


def test_an_experiment_loaded_again_runs_its_file_as_it_is_now(workdir):
    """A file loaded by path was kept by name: edited and loaded again in the
    same process (a notebook), the old model_fn ran, without a word."""
    import os
    (workdir / "edited.py").write_text(
        "def model_fn(features, labels, mode):\n    return 'first'\n")
    path = write(workdir, "model_fn: edited.py:model_fn\n" + HEAD.split("\n", 1)[1])
    assert experiment.load(path).model_fn(None, None, None) == "first"
    (workdir / "edited.py").write_text(
        "def model_fn(features, labels, mode):\n    return 'second, edited'\n")
    os.utime(workdir / "edited.py", ns=(1, 1))   # (a time of its own: within one tick too)
    assert experiment.load(path).model_fn(None, None, None) == "second, edited"
    sys.modules.pop("edited", None)


def test_the_cli_in_a_configured_process_leaves_its_root_logger(workdir, capsys):
    """cli.main called from a process that set up logging set the root
    logger's level (INFO, WARNING with -q): the caller's debug lines went."""
    import logging
    root = logging.getLogger()
    handler = logging.NullHandler()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        path = write(workdir, HEAD + "  max_steps: 2\nrun_config: {model_dir: run}\n")
        assert cli.main(["train", path, "-q"]) == 0
        assert root.level == logging.DEBUG and handler in root.handlers
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


# -- saving the resolved experiment ----------------------------------------------------------
def test_saved_experiment_reruns_from_anywhere(workdir, tmp_path_factory):
    (workdir / "serve.py").write_text(
        "import torch\nimport estimator as est\n\n\ndef receiver():\n"
        "    return est.export.build_raw_serving_input_receiver_fn(\n"
        "        {'x': est.export.placeholder(torch.float32, [None, 2])})()\n")
    path = write(workdir, HEAD + "  max_steps: 4\nrun_config: {model_dir: rel/run}\n"
                 "export: {serving_input_receiver_fn: serve.py:receiver,\n"
                 "         export_dir_base: '${run_config.model_dir}/exports'}\n"
                 "warm_start: rel/old\n")
    exp = experiment.load(path, ["params.lr=0.2"])
    estimator = exp.estimator()
    hook = exp.save_hook(estimator, "run")
    hook.after_create_session(None, None)   # (when training starts)
    saved = hook.path
    assert saved == os.path.join("rel/run", "experiment.yaml")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    os.chdir(elsewhere)
    again = experiment.load(os.path.join(workdir, saved))
    assert again.params == {"lr": 0.2}
    assert again.model_dir == os.path.join(str(workdir), "rel/run")
    assert again.config["train_spec"] == exp.config["train_spec"]
    # every path, not only model_dir (the export went to elsewhere/rel/run/exports)
    assert again.config["export"]["export_dir_base"] == os.path.join(str(workdir),
                                                                     "rel/run/exports")
    assert again.config["warm_start"]["ckpt_to_initialize_from"] == os.path.join(
        str(workdir), "rel/old")
    # a rerun into another model_dir exports there (it went into the first run's)
    assert "export_dir_base: ${run_config.model_dir}/exports\n" in open(
        os.path.join(workdir, saved)).read()
    moved = experiment.load(os.path.join(workdir, saved), ["run_config.model_dir=/tmp/b"])
    assert moved.config["export"]["export_dir_base"] == "/tmp/b/exports"


def test_only_the_chief_saves_the_experiment(workdir, set_tf_config):
    path = write(workdir, HEAD + "run_config: {model_dir: shared}\n")
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}
    set_tf_config(cluster, "worker", 0)
    exp = experiment.load(path)
    assert exp.save_hook(exp.estimator()) is None
    set_tf_config(cluster, "chief", 0)
    exp = experiment.load(path)
    assert exp.save_hook(exp.estimator()).path == os.path.join("shared", "experiment.yaml")


def test_a_rerun_that_cannot_resume_keeps_the_experiment_file(tmp_path, capsys):
    """A changed model in a model_dir of checkpoints fails to restore; its
    experiment.yaml used to be rewritten first, losing the record of the run
    that wrote the checkpoints (and its rerun command then failed too)."""
    result, _, model_dir = _run_config("iris.yaml", tmp_path, capsys,
                                       "--set", "train_spec.max_steps=20")
    record = os.path.join(model_dir, "experiment.yaml")
    before = open(record).read()
    with pytest.raises(ValueError, match=r"the model no longer fits the checkpoints of this "
                                         r"model_dir \(dnn/0/bias is \[16\] in the checkpoint, "
                                         r"\[32\] in the model; .*dnn/4/weight is in the "
                                         r"checkpoint, not in the model\); train the changed "
                                         r"model in a new model_dir"):
        cli.main(["run", os.path.join(CONFIGS, "iris.yaml"), "-q",
                  "--set", f"run_config.model_dir={model_dir}",
                  "--set", "params.hidden_units=[32]", "--set", "train_spec.max_steps=40"])
    assert open(record).read() == before
    assert experiment.load(record).params["hidden_units"] == [16, 16]


def test_a_rerun_with_other_settings_keeps_the_earlier_experiment_file(tmp_path, capsys):
    """A rerun with another learning rate that fails before its first save
    (a hook's unknown tensor: one line, not a traceback of the library's
    frames) wrote over experiment.yaml: the checkpoints' run's settings were
    lost. The earlier record is kept beside it; a rerun of the same settings
    keeps none."""
    _, _, model_dir = _run_config("iris.yaml", tmp_path, capsys,
                                  "--set", "train_spec.max_steps=20")
    record = os.path.join(model_dir, "experiment.yaml")
    before = open(record).read()
    assert cli.main(["run", os.path.join(CONFIGS, "iris.yaml"), "-q",
                     "--set", f"run_config.model_dir={model_dir}",
                     "--set", "params.learning_rate=5.0", "--set", "train_spec.max_steps=40",
                     "--set", "train_spec.hooks=[{LoggingTensorHook: "
                     "{tensors: [nope], every_n_iter: 5}}]"]) == 1
    err = capsys.readouterr().err   # (one line, as the library's other errors)
    assert err.startswith("estimator run: error: LoggingTensorHook fetches 'nope', which")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    kept = [f for f in os.listdir(model_dir)
            if f.startswith("experiment.") and f != "experiment.yaml"]
    assert len(kept) == 1 and open(os.path.join(model_dir, kept[0])).read() == before
    assert experiment.load(record).params["learning_rate"] == 5.0
    _run_config("iris.yaml", tmp_path, capsys, "--set", "train_spec.max_steps=30",
                "--set", "params.learning_rate=5.0")
    assert len([f for f in os.listdir(model_dir) if f.startswith("experiment.")]) == 3
    text = open(record).read()
    again = experiment.SaveExperimentHook(record, "# written again\n" + _body_of(text))
    again.after_create_session(None, None)
    assert len([f for f in os.listdir(model_dir) if f.startswith("experiment.")]) == 3
    assert open(record).read().startswith("# written again")


def _body_of(record):
    return "".join(line for line in record.splitlines(True) if not line.startswith("#"))


def test_a_serving_input_receiver_fn_returning_none_is_said_before_training(
        workdir, tmp_path, capsys):
    """It failed after training, naming neither the key nor the function;
    `run` and `export` call it once first (other commands not at all)."""
    path = write(workdir, "model_fn: mod.py:model_fn\ntrain_spec:\n"
                 "  input_fn: mod.py:input_fn\n  max_steps: 20\n"
                 "eval_spec:\n  input_fn: mod.py:input_fn\n  exporters:\n"
                 "    - LatestExporter: {name: x, serving_input_receiver_fn: "
                 "'${export.serving_input_receiver_fn}'}\n"
                 "export: {serving_input_receiver_fn: mod.py:serve_nothing}\n")
    model_dir = tmp_path / "m"
    fix = ("returned NoneType, not a ServingInputReceiver; return est.export."
           "ServingInputReceiver(features, receiver_tensors) (or "
           "build_raw_serving_input_receiver_fn(...)())")
    assert cli.main(["run", path, "-q", "--set", f"run_config.model_dir={model_dir}"]) == 2
    assert capsys.readouterr().err == (
        f"estimator run: error: {path}:8: eval_spec.exporters[0].LatestExporter."
        f"serving_input_receiver_fn: mod.py:serve_nothing: {fix}\n")
    assert not model_dir.exists()   # (before training)
    assert cli.main(["export", path, "-q", "--set", f"run_config.model_dir={model_dir}"]) == 2
    assert capsys.readouterr().err == (
        f"estimator export: error: {path}:9: export.serving_input_receiver_fn: "
        f"mod.py:serve_nothing: {fix}\n")
    assert cli.main(["train", path, "-q", "--set", f"run_config.model_dir={model_dir}"]) == 0


def test_a_run_that_evaluated_nothing_says_why(workdir, tmp_path, capsys):
    """An input_fn that gave no data was said to leave "nothing new to train"
    (as for a model_dir at max_steps), with exit status 0 either way."""
    path = write(workdir, "model_fn: mod.py:model_fn\ntrain_spec:\n"
                 "  input_fn: mod.py:empty_input_fn\n  max_steps: 20\n"
                 "eval_spec: {input_fn: mod.py:input_fn}\n")
    assert cli.main(["run", path, "-q", "--set", f"run_config.model_dir={tmp_path / 'e'}"]) == 0
    assert capsys.readouterr().out == (
        "No evaluation ran: training stopped before its first step, at global step 0 "
        "(max_steps 20); the warnings above say why (an input_fn that gave no data, a hook "
        "that stopped it)\n")
    _, _, model_dir = _run_config("iris.yaml", tmp_path, capsys, "--set",
                                  "train_spec.max_steps=20")
    config = os.path.join(CONFIGS, "iris.yaml")
    assert cli.main(["run", config, "-q", "--set", f"run_config.model_dir={model_dir}",
                     "--set", "train_spec.max_steps=20"]) == 0
    assert capsys.readouterr().out == (
        f"No evaluation ran (nothing new to train in {model_dir}: at global step 20, max_steps "
        f"20); evaluate with: estimator evaluate {config}; export with: estimator export "
        f"{config}\n")
    # the final evaluation interrupted (Ctrl-C twice, fault probe): said, as TF does
    # nothing either (a rerun evaluating it could race the run still evaluating it)
    ledger = os.path.join(model_dir, "eval", "evaluated_checkpoints.jsonl")
    with open(ledger) as f:
        lines = f.read().splitlines()
    with open(ledger, "w") as f:
        f.write("\n".join(line for line in lines if '"global_step": 20' not in line) + "\n")
    assert cli.main(["run", config, "-q", "--set", f"run_config.model_dir={model_dir}",
                     "--set", "train_spec.max_steps=20"]) == 0
    assert "20); its last checkpoint, of global step 20, was never evaluated here (its " \
           "evaluation interrupted, or trained by `estimator train`) nor passed to " \
           "eval_spec's exporters; evaluate with" in capsys.readouterr().out


# -- every config in configs/ runs ------------------------------------------------------------
def _final_evaluation(out: str) -> dict:
    lines = [l for l in out.splitlines() if l.startswith("Final evaluation at global step")]
    assert len(lines) == 1, out
    line = lines[0]
    head, _, values = line.partition(": ")
    result = {"global_step": int(head.rsplit(" ", 1)[1])}
    for item in values.split(", "):
        key, _, value = item.partition(" = ")
        result[key] = float(value)
    return result


def _run_config(name, tmp_path, capsys, *sets):
    model_dir = str(tmp_path / name)
    code = cli.main(["run", os.path.join(CONFIGS, name), "-q",
                     "--set", f"run_config.model_dir={model_dir}", *sets])
    out = capsys.readouterr().out
    assert code == 0, out
    return _final_evaluation(out), out, model_dir


def test_config_iris(tmp_path, capsys):
    result, out, model_dir = _run_config("iris.yaml", tmp_path, capsys,
                                         "--set", "train_spec.max_steps=200")
    assert result["global_step"] == 200 and result["accuracy"] >= 0.9
    assert f"Exported: {model_dir}/export/final/" in out
    assert experiment.load(os.path.join(model_dir, "experiment.yaml")).config[
        "train_spec"]["max_steps"] == 200


def test_config_linear_regression(tmp_path, capsys):
    result, _, model_dir = _run_config("linear_regression.yaml", tmp_path, capsys,
                                       "--set", "train_spec.max_steps=60")
    assert result["global_step"] == 60 and result["average_loss"] < 0.05
    assert os.path.isfile(os.path.join(model_dir, "experiment.yaml"))


@pytest.mark.slow
def test_config_mirrored_cpu_train_then_evaluate(tmp_path, capsys):
    model_dir = str(tmp_path / "mirrored")
    args = [os.path.join(CONFIGS, "mirrored_cpu.yaml"), "-q", "--set",
            f"run_config.model_dir={model_dir}", "--set", "train_spec.max_steps=40"]
    assert cli.main(["train", *args]) == 0
    assert capsys.readouterr().out.startswith("Trained to global step 40; ")
    assert cli.main(["evaluate", *args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["global_step"] == 40 and result["average_loss"] < 0.1
    assert os.path.isfile(os.path.join(model_dir, "experiment.yaml"))


@pytest.mark.slow
def test_config_mirrored_cpu(tmp_path, capsys):
    result, _, model_dir = _run_config("mirrored_cpu.yaml", tmp_path, capsys,
                                       "--set", "train_spec.max_steps=40")
    assert result["global_step"] == 40 and result["average_loss"] < 0.1
    assert os.path.isfile(os.path.join(model_dir, "experiment.yaml"))


@pytest.mark.slow
def test_config_cluster_under_launch(tmp_path, capsys):
    model_dir = str(tmp_path / "cluster")
    code = cli.main(["launch", "--workers", "1", "--evaluator", "--timeout", "240",
                     os.path.join(CONFIGS, "cluster.yaml"), "--", "-q",
                     "--set", f"run_config.model_dir={model_dir}",
                     "--set", "train_spec.max_steps=40"])
    out = capsys.readouterr().out
    assert code == 0, out
    evaluator = "\n".join(l[len("[evaluator] "):] for l in out.splitlines()
                          if l.startswith("[evaluator] "))
    assert _final_evaluation(evaluator)["global_step"] == 40, out
    assert "[chief] chief 0: training finished" in out, out
    assert "[worker 0] worker 0: training finished" in out, out
    assert os.path.isfile(os.path.join(model_dir, "experiment.yaml")), out
    assert glob.glob(os.path.join(model_dir, "export", "best", "*", "model.pt2")), out


@pytest.mark.slow
def test_config_parameter_server_under_launch(tmp_path, capsys):
    model_dir = str(tmp_path / "ps")
    code = cli.main(["launch", "--workers", "1", "--ps", "2", "--evaluator", "--timeout", "240",
                     os.path.join(CONFIGS, "parameter_server.yaml"), "--", "-q",
                     "--set", f"run_config.model_dir={model_dir}",
                     "--set", "train_spec.max_steps=60"])
    out = capsys.readouterr().out
    assert code == 0, out
    evaluator = "\n".join(l[len("[evaluator] "):] for l in out.splitlines()
                          if l.startswith("[evaluator] "))
    result = _final_evaluation(evaluator)
    assert result["global_step"] == 60 and result["average_loss"] < 0.05, out
    assert "[ps 1] ps 1: training finished" in out, out


CONFIG_TESTS = {"iris.yaml": test_config_iris,
                "linear_regression.yaml": test_config_linear_regression,
                "mirrored_cpu.yaml": (test_config_mirrored_cpu,
                                      test_config_mirrored_cpu_train_then_evaluate),
                "cluster.yaml": test_config_cluster_under_launch,
                "parameter_server.yaml": test_config_parameter_server_under_launch,
                "premade_iris.yaml": "tests/estimator/experiment/test_canned_experiment.py"}


def test_every_config_has_a_run_test_and_loads():
    configs = sorted(os.path.basename(p) for p in glob.glob(os.path.join(CONFIGS, "*.yaml")))
    assert configs == sorted(CONFIG_TESTS), "a config in configs/ has no test that runs it"
    for name in configs:
        experiment.load(os.path.join(CONFIGS, name))


# -- the CLI subcommands ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """configs/iris.yaml trained 100 steps by `estimator train`."""
    model_dir = str(tmp_path_factory.mktemp("cli") / "iris")
    sets = ["--set", f"run_config.model_dir={model_dir}", "--set", "train_spec.max_steps=100",
            "--set", "run_config.save_checkpoints_steps=50"]
    assert cli.main(["train", os.path.join(CONFIGS, "iris.yaml"), "-q", *sets]) == 0
    return model_dir, [os.path.join(CONFIGS, "iris.yaml"), "-q", *sets]


@pytest.mark.slow
def test_cli_error_of_a_library_check_in_a_replica_is_one_line(trained, capsys, tmp_path):
    """Raised in a replica process, it came back chained from the replica's
    traceback, which the CLI took for user code: a full traceback was printed."""
    _, args = trained
    odd = tmp_path / "odd_input.py"   # one batch, of which no empty one can be made
    odd.write_text("import torch\n\ndef input_fn(params, mode):\n"
                   "    return [({'x': torch.zeros(30, 4), 'o': object()},"
                   " torch.zeros(30, dtype=torch.long))]\n")
    code = cli.main(["evaluate", *args, "--set", f"eval_spec.input_fn={odd}:input_fn", "--set",
                     "run_config.eval_distribute={MirroredStrategy: {devices: [cpu:0, cpu:1]}}"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("estimator evaluate: error: The evaluation input has no batch for "
                          "replica 1 (cpu:1)") and "(raised in replica " in err, err


def test_cli_train_max_steps_then_relative_steps(tmp_path, capsys):
    args = [os.path.join(CONFIGS, "linear_regression.yaml"), "-q",
            "--set", f"run_config.model_dir={tmp_path / 'lr'}", "--set", "train_spec.max_steps=30"]
    assert cli.main(["train", *args]) == 0
    assert cli.main(["train", *args]) == 0          # max_steps reached: nothing to do
    assert cli.main(["train", *args, "--steps", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(";")[0] for line in lines] == ["Trained to global step 30"] * 2 + [
        "Trained to global step 50"]
    text = (tmp_path / "lr" / "experiment.yaml").read_text()
    assert yaml.safe_load(text)["train_spec"]["max_steps"] == 30
    # (rerun as written it trains 20 more steps: it said `estimator train`, to step 30)
    assert (f"# Run it again with: estimator train --steps 20 {tmp_path / 'lr'}/experiment.yaml"
            in text.splitlines())


def test_the_rerun_line_is_one_a_shell_takes(tmp_path, capsys):
    """A model_dir with spaces (`runs/modèle 1`) made a rerun line the shell
    split in two (names probe)."""
    import shlex
    model_dir = tmp_path / "modèle 1"
    assert cli.main(["train", os.path.join(CONFIGS, "linear_regression.yaml"), "-q", "--set",
                     f"run_config.model_dir={model_dir}", "--set", "train_spec.max_steps=2"]) == 0
    line = (model_dir / "experiment.yaml").read_text().splitlines()[1]
    assert shlex.split(line.split(": ", 1)[1]) == [
        "estimator", "train", str(model_dir / "experiment.yaml")]


def test_cli_inspect_errors(tmp_path, workdir, capsys):
    assert cli.main(["inspect", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == (f"estimator inspect: error: {tmp_path / 'nope'} is not a "
                                       "directory (a model_dir or an experiment file)\n")
    path = write(workdir, HEAD)
    assert cli.main(["inspect", path]) == 2
    assert capsys.readouterr().err == f"estimator inspect: error: {path} sets no " \
                                      "run_config.model_dir\n"


def test_cli_errors_of_its_own_checks_are_one_line_user_code_s_keep_the_traceback(
        trained, tmp_path, capsys):
    """A missing checkpoint or model printed a traceback through the library."""
    config, sets = trained[1][0], ["-q", "--set", f"run_config.model_dir={tmp_path / 'none'}"]
    assert cli.main(["export", config, *sets]) == 1
    assert capsys.readouterr().err == (f"estimator export: error: Couldn't find trained model "
                                       f"at {tmp_path / 'none'}.\n")
    assert cli.main(["evaluate", config, *trained[1][1:], "--checkpoint",
                     str(tmp_path / "model.ckpt-7")]) == 1
    assert capsys.readouterr().err == (f"estimator evaluate: error: Checkpoint "
                                       f"'{tmp_path / 'model.ckpt-7'}' does not exist\n")
    (tmp_path / "mod.py").write_text(
        "def input_fn(params, mode):\n"
        "    raise ValueError('a bug in input_fn')\n")
    with pytest.raises(ValueError, match="a bug in input_fn"):   # the traceback is the user's
        cli.main(["evaluate", config, *trained[1][1:], "--set",
                  f"eval_spec.input_fn={tmp_path / 'mod.py'}:input_fn"])


def test_cli_keeps_the_traceback_of_code_installed_with_pip():
    """A user's model package in site-packages (or torch under it) is not the
    library: its errors keep their traceback."""
    from estimator import checkpoint
    from estimator.experiment import commands
    namespace = {}
    exec(compile("def input_fn():\n    raise ValueError('a bug')\n",
                 os.path.join(sys.prefix, "lib", "site-packages", "users_model", "inputs.py"),
                 "exec"), namespace)
    for call, ours in ((namespace["input_fn"], False),
                       (lambda: checkpoint.resolve("/no/such/model.ckpt-1"), True)):
        try:
            call()
        except ValueError as e:   # (its traceback less this test's frame and the lambda's)
            tb = e.__traceback__.tb_next
            assert commands._ours_alone(e.with_traceback(tb.tb_next if ours else tb)) == ours


def test_cli_a_model_dir_that_cannot_be_made_is_a_one_line_error(tmp_path, capsys):
    """os.makedirs's error came through the standard library's frozen `os`,
    which the CLI took for user code: a full traceback was printed."""
    (tmp_path / "file").write_text("")
    code = cli.main(["run", os.path.join(CONFIGS, "iris.yaml"), "-q", "--set",
                     f"run_config.model_dir={tmp_path / 'file' / 'run'}"])
    assert code == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("estimator run: error: ") and \
        str(tmp_path / "file" / "run") in err, err


def test_cli_evaluate_json_and_text(trained, capsys):
    _, args = trained
    assert cli.main(["evaluate", *args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["global_step"] == 100 and 0 <= result["accuracy"] <= 1
    assert cli.main(["evaluate", *args, "--checkpoint", os.path.join(trained[0],
                                                                      "model.ckpt-50")]) == 0
    assert capsys.readouterr().out.startswith("Evaluation at global step 50: accuracy = ")


def test_cli_predict_jsonl_and_csv(trained, tmp_path, capsys):
    _, args = trained
    assert cli.main(["predict", *args]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 30 and set(rows[0]) == {"class_ids", "probabilities", "logits"}
    assert sum(rows[0]["probabilities"]) == pytest.approx(1, abs=1e-5)
    out = tmp_path / "p.csv"
    assert cli.main(["predict", *args, "--output", str(out), "--keys", "class_ids,probabilities"]) == 0
    with open(out) as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == ["class_ids", "probabilities_0", "probabilities_1",
                              "probabilities_2"]
    assert [int(r["class_ids"]) for r in table] == [r["class_ids"] for r in rows]
    assert "Wrote 30 predictions (csv)" in capsys.readouterr().err


def test_cli_predict_csv_refuses_a_column_two_predictions_would_fill():
    """`p` of shape [2] and a prediction named `p_0`: the second overwrote
    p[0] in the CSV without a word (names probe)."""
    from estimator.experiment import commands
    for rows, column in (({"p": np.array([0.25, 0.75]), "p_0": np.float32(7)}, "p_0"),
                         ({"p_0": np.ones(1), "p": np.ones((2, 2))}, "p_0_0")):
        with pytest.raises(ValueError, match=f"predictions {list(rows)[0]!r} and "
                                             f"{list(rows)[1]!r} would both be CSV column "
                                             f"{column!r}"):
            commands._write_csv(iter([rows]), io.StringIO())
    out = io.StringIO()   # (p's p_0, p_1 and p_0's p_0_0 are three columns)
    commands._write_csv(iter([{"p": np.ones(2), "p_0": np.zeros(1)}]), out)
    assert out.getvalue().splitlines()[0] == "p_0,p_1,p_0_0"


def test_cli_predict_that_fails_leaves_the_output_file_as_it_was(trained, tmp_path, capsys):
    """A bad --keys (or any failure while predicting) left FILE empty: it was
    opened, and truncated, before the first prediction."""
    _, args = trained
    out = tmp_path / "p.csv"
    assert cli.main(["predict", *args, "--output", str(out)]) == 0
    before = out.read_bytes()
    assert before.count(b"\n") == 31
    assert cli.main(["predict", *args, "--output", str(out), "--keys", "nope"]) == 1
    assert "Expected to run at least one output" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["p.csv"]   # (no temp file left)
    assert cli.main(["predict", *args, "--output", str(tmp_path / "p.xlsx")]) == 0
    assert "writing JSON lines to" in capsys.readouterr().err
    assert json.loads((tmp_path / "p.xlsx").read_text().splitlines()[0])["class_ids"] in (0, 1, 2)


def test_cli_predict_to_a_place_it_cannot_write_says_so_first(trained, tmp_path, capsys):
    """The error named the temp file written first (`p.csv.tmp-<pid>-0`), or
    a rename, after predicting."""
    _, args = trained
    missing = tmp_path / "no_such_dir" / "p.csv"
    assert cli.main(["predict", *args, "--output", str(missing)]) == 1
    assert capsys.readouterr().err == (
        f"estimator predict: error: --output {missing}: directory {missing.parent} does not "
        f"exist; create it first\n")
    assert cli.main(["predict", *args, "--output", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"estimator predict: error: --output {tmp_path} is a directory; name a file (in it: "
        f"{tmp_path / 'predictions.jsonl'})\n")


def test_cli_export_loads_with_torch_alone(trained, tmp_path, capsys):
    _, args = trained
    assert cli.main(["export", *args, "--export-dir", str(tmp_path / "exp")]) == 0
    export_dir = capsys.readouterr().out.strip()
    assert os.path.dirname(export_dir) == str(tmp_path / "exp")
    program = torch.export.load(os.path.join(export_dir, "model.pt2")).module()
    out = program(x=torch.tensor([[5.1, 3.3, 1.7, 0.5], [6.9, 3.1, 5.4, 2.1]]))
    assert out["probabilities"].shape == (2, 3)


def test_cli_train_steps_not_positive_is_an_argument_error(workdir, capsys):
    path = write(workdir, HEAD)
    for steps, why in (("-5", "must be > 0, got -5"),
                       ("x", "expected a positive integer, got 'x'")):
        with pytest.raises(SystemExit) as exited:
            cli.main(["train", path, "--steps", steps])
        assert exited.value.code == 2
        assert capsys.readouterr().err.endswith(
            f"estimator train: error: argument --steps: {why}\n")


def test_cli_inspect_of_an_experiment_not_trained_yet_says_so(workdir, capsys):
    path = write(workdir, HEAD + "run_config: {model_dir: runs/never}\n")
    assert cli.main(["inspect", path]) == 2
    assert capsys.readouterr().err == (
        f"estimator inspect: error: {path}: model_dir runs/never does not exist yet (nothing "
        f"trained there; train with: estimator run {path})\n")
    assert cli.main(["inspect", "runs/never"]) == 2
    assert capsys.readouterr().err == ("estimator inspect: error: runs/never is not a "
                                       "directory (a model_dir or an experiment file)\n")


def test_cli_inspect(trained, capsys):
    model_dir, args = trained
    assert cli.main(["evaluate", *args]) == 0
    capsys.readouterr()
    assert cli.main(["inspect", model_dir, "-q"]) == 0
    text = capsys.readouterr().out
    assert "checkpoints (2 kept, latest model.ckpt-100):" in text
    assert "  dnn/0/weight" in text and "[16, 4]" in text
    assert "eval results (eval):" in text and "step      100: accuracy = " in text
    assert cli.main(["inspect", os.path.join(CONFIGS, "iris.yaml"), *args[1:], "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [c["step"] for c in report["checkpoints"]] == [50, 100]
    assert {"name": "dnn/0/weight", "shape": [16, 4], "dtype": "float32"} in report["variables"]
    assert report["experiment"] == os.path.join(model_dir, "experiment.yaml")
    assert report["eval"]["eval"]["100"]["accuracy"] >= 0


def test_cli_evaluate_and_inspect_a_model_dir_with_a_damaged_latest(trained, tmp_path, capsys,
                                                                    caplog):
    """evaluate, predict and export fall back to the newest good checkpoint
    (they stopped with a traceback); inspect marks the damaged one."""
    import shutil
    model_dir = str(tmp_path / "iris")
    shutil.copytree(trained[0], model_dir)
    latest = os.path.join(model_dir, "model.ckpt-100")
    with open(latest, "r+b") as f:
        f.truncate(os.path.getsize(latest) // 2)
    args = [trained[1][0], "-q", "--set", f"run_config.model_dir={model_dir}"]
    assert cli.main(["evaluate", *args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["global_step"] == 50
    assert "model.ckpt-100' is damaged" in caplog.text
    assert "falling back to model.ckpt-50" in caplog.text
    assert cli.main(["inspect", model_dir]) == 0
    text = capsys.readouterr().out
    assert "checkpoints (2 kept, latest model.ckpt-100):" in text
    assert f"    DAMAGED: Checkpoint '{latest}' is damaged: its content" in text
    assert "variables in model.ckpt-50:" in text and "  dnn/0/weight" in text
    assert cli.main(["inspect", model_dir, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [bool(c["damaged"]) for c in report["checkpoints"]] == [False, True]
    assert report["variables_of"] == os.path.join(model_dir, "model.ckpt-50")
    # the index missing, or unreadable: the files on disk, as restore reads them (it
    # failed on the damaged latest, and on a garbage index)
    index = os.path.join(model_dir, "checkpoint")
    for damage in ("missing", "garbage"):
        if damage == "missing":
            os.remove(index)
        else:
            open(index, "wb").write(b"\xff\xfe garbage: here\n")
        assert cli.main(["inspect", model_dir, "--json"]) == 0, capsys.readouterr().err
        report = json.loads(capsys.readouterr().out)
        assert [(c["step"], bool(c["damaged"])) for c in report["checkpoints"]] == [
            (50, False), (100, True)]
        assert report["variables_of"] == os.path.join(model_dir, "model.ckpt-50")
    # a checkpoint's path that is a directory: marked, the others shown (inspect
    # failed whole: "does not exist"; chaos probe)
    os.remove(latest)
    os.mkdir(latest)
    assert cli.main(["inspect", model_dir]) == 0
    assert f"    DAMAGED: Checkpoint '{latest}' is a directory, not a checkpoint file" in \
        capsys.readouterr().out


def test_cli_print_config_runs_nothing(tmp_path, capsys):
    model_dir = tmp_path / "never"
    assert cli.main(["run", os.path.join(CONFIGS, "iris.yaml"), "--print-config",
                     "--set", f"run_config.model_dir={model_dir}",
                     "--set", "train_spec.max_steps=7"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert resolved["train_spec"]["max_steps"] == 7
    assert resolved["eval_spec"]["exporters"][0]["FinalExporter"][
        "serving_input_receiver_fn"].endswith("examples/export_and_serve.py:"
                                              "serving_input_receiver_fn")
    assert not model_dir.exists()


def test_cli_bad_experiment_is_exit_2_with_the_error(workdir, capsys):
    path = write(workdir, HEAD + "run_config:\n  save_checkpoint_steps: 10\n")
    assert cli.main(["run", path]) == 2
    assert capsys.readouterr().err == (
        f"estimator run: error: {path}:5: run_config.save_checkpoint_steps: unknown key "
        "'save_checkpoint_steps'; did you mean 'save_checkpoints_steps'?\n")


def test_cli_command_needs_its_section(workdir, capsys):
    path = write(workdir, HEAD)
    assert cli.main(["run", path]) == 2
    assert capsys.readouterr().err == (
        f"estimator run: error: {path}:1: eval_spec: missing; estimator run needs it: add "
        "eval_spec: {input_fn: package.module:input_fn}\n")


def test_cli_help_shows_real_examples(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = capsys.readouterr().out
    assert "estimator run configs/iris.yaml --set train_spec.max_steps=200" in text
    assert "--print-config" in text


@pytest.mark.parametrize("command", ["run", "train", "evaluate", "predict", "export", "inspect",
                                     "launch", "serve", "server"])
def test_every_command_help_shows_examples_of_files_that_exist(command, capsys):
    """The docs say `estimator COMMAND --help` shows examples: launch, serve
    and server showed none (docs probe)."""
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = capsys.readouterr().out
    assert "\nexamples:\n  estimator " in text or "\nexamples:\n  ESTIMATOR_" in text
    for path in re.findall(r"(?:configs|examples)/[\w.-]+\.(?:yaml|py)", text):
        assert os.path.exists(os.path.join(ROOT, path)), path


def test_python_dash_m_estimator_help():
    done = subprocess.run([sys.executable, "-m", "estimator", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for command in ("run", "train", "evaluate", "predict", "export", "inspect", "launch"):
        assert f"\n    {command} " in done.stdout
    assert "estimator run configs/iris.yaml" in done.stdout


def test_an_alias_bomb_is_refused_quickly_with_file_and_line(workdir):
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        levels.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    path = write(workdir, HEAD + "params:\n" + "".join(f"  {line}\n" for line in levels))
    assert os.path.getsize(path) < 1500
    start = time.monotonic()
    with pytest.raises(ExperimentError, match=rf"{path}:\d+: .*aliases expand to more than "
                                              r"100000 values"):
        experiment.load(path)
    assert time.monotonic() - start < 5


def test_deep_nesting_and_a_huge_file_are_refused_with_file_and_line(workdir):
    deep = write(workdir, HEAD + "params:\n  p: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(ExperimentError, match=rf"{deep}:5: nested more than 64 levels deep"):
        experiment.load(deep)
    huge = write(workdir, HEAD + "# " + "x" * (2 << 20) + "\n")
    with pytest.raises(ExperimentError, match=rf"{huge}:1: the file holds \d+ characters; "
                                              "experiment files are limited"):
        experiment.load(huge)


@pytest.fixture
def trainer_package(tmp_path, monkeypatch):
    """A Cloud ML trainer's layout: trainer/task.py does `from . import model`."""
    for root in ("proj", "other"):
        package = tmp_path / root / "trainer"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "model.py").write_text(f"ROOT = {root!r}\n\n" + MODULE)
        (package / "task.py").write_text("from . import model\nfrom .model import model_fn\n"
                                         "ROOT = model.ROOT\n")
    monkeypatch.chdir(tmp_path / "proj")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    yield tmp_path
    for name in ("trainer", "trainer.model", "trainer.task"):
        sys.modules.pop(name, None)


def test_a_file_of_a_package_is_imported_as_its_module(trainer_package, capsys):
    """Before, `from . import model` failed and the error said to fix the file;
    and the `estimator` command, unlike `python -m estimator`, did not find
    modules in the current directory."""
    path = write(trainer_package / "proj", "model_fn: trainer/task.py:model_fn\ntrain_spec:\n"
                 "  input_fn: trainer.task:model.input_fn\n  max_steps: 1\n")
    assert cli.main(["run", str(path), "--print-config"]) == 0
    assert f"model_fn: {trainer_package}/proj/trainer/task.py:model_fn" in capsys.readouterr().out
    assert sys.modules["trainer.task"].ROOT == "proj"
    # a package of the same name from elsewhere is said, not taken for it
    other = write(trainer_package / "proj", f"model_fn: {trainer_package}/other/trainer/task.py:"
                  "model_fn\n", "other.yaml")
    with pytest.raises(ExperimentError, match=r"as module trainer.task \(its package's name\): "
                                              r"a module 'trainer' is loaded already, from "
                                              r".*/proj/trainer/__init__.py; rename the package"):
        experiment.load(other)
    for name in ("trainer", "trainer.model", "trainer.task"):
        sys.modules.pop(name)
    experiment.load(other)   # (proj's unloaded: the other one, its directory first on sys.path)
    assert sys.modules["trainer.task"].ROOT == "other"
    for name in ("trainer", "trainer.model", "trainer.task"):
        sys.modules.pop(name)
    # a file of the package edited since: the package runs again, its other files too
    experiment.load(path)
    model = trainer_package / "proj" / "trainer" / "model.py"
    model.write_text(model.read_text().replace("ROOT = 'proj'", "ROOT = 'edited'"))
    os.utime(model, ns=(time.time_ns() + 10**9,) * 2)
    experiment.load(path)
    assert sys.modules["trainer.task"].ROOT == "edited"
    # a package named as a module loaded already (the standard library's json)
    (trainer_package / "proj" / "json").mkdir()
    (trainer_package / "proj" / "json" / "__init__.py").write_text("")
    (trainer_package / "proj" / "json" / "task.py").write_text(MODULE)
    clash = write(trainer_package / "proj", "model_fn: json/task.py:model_fn\n", "clash.yaml")
    with pytest.raises(ExperimentError, match=r"a module 'json' is loaded already, from .*"
                                              r"json/__init__.py; rename the package"):
        experiment.load(clash)


def test_a_namespace_packages_file_is_said_to_be_named_by_module(tmp_path, monkeypatch):
    """No __init__.py: the file cannot know its package; its relative import
    failed with 'fix that file'."""
    (tmp_path / "ns" / "sub").mkdir(parents=True)
    (tmp_path / "ns" / "sub" / "model.py").write_text(MODULE)
    (tmp_path / "ns" / "sub" / "task.py").write_text("from .model import model_fn\n")
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "model_fn: ns/sub/task.py:model_fn\n")
    with pytest.raises(ExperimentError, match=r"a file is imported as a module of its package "
                                              r"where its directories hold __init__.py; name a "
                                              r"namespace package's module by import path"):
        experiment.load(path)
    sys.modules.pop("task", None)


_PREDICT_THEN_SIGTERM = r"""
import os, signal, sys
from estimator.experiment import cli, commands
real = commands._write_jsonl

def write(predictions, out):   # (one row, then a SIGTERM: docker stop, a scheduler)
    for p in predictions:
        out.write("{}\n")
        os.kill(os.getpid(), signal.SIGTERM)
    return 1
commands._write_jsonl = write
cli.main(["predict", *sys.argv[1:]])
"""


def test_cli_predict_stopped_by_sigterm_leaves_no_temp_file(trained, tmp_path):
    """SIGTERM ended the process at once, the temp file left beside FILE."""
    _, args = trained
    out = tmp_path / "p.jsonl"
    done = subprocess.run([sys.executable, "-c", _PREDICT_THEN_SIGTERM, *args, "--output",
                           str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "KeyboardInterrupt" in done.stderr, done.stderr[-800:]
    assert os.listdir(tmp_path) == []
