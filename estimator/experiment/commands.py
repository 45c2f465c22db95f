"""The experiment subcommands of the `estimator` CLI: `run`
(train_and_evaluate), `train`, `evaluate`, `predict`, `export` on a YAML
experiment, and `inspect` on a model_dir. Registered on `estimator.cli`
through `add_parsers(subparsers)`.

What a TF1 user wrote as a Python driver around `tf.estimator` (build the
Estimator, the specs, call `train_and_evaluate`) is here one command on an
experiment file; the model code itself stays Python.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import glob
import io
import json
import logging
import os
import re
import signal
import sys
import threading
from typing import Optional

import numpy as np

from distribute.host_arrays import to_numpy
from hooks import files, tf_checkpoint

from .. import checkpoint, experiment
from ..run_config import writes_checkpoints
from ..training import LEDGER
from ._yaml import ExperimentError

_CONFIG_EXAMPLES = """
examples:
  estimator run configs/iris.yaml
  estimator run configs/iris.yaml --set train_spec.max_steps=200 --set params.learning_rate=0.05
  estimator run configs/iris.yaml --print-config        # the resolved experiment; runs nothing
  estimator run configs/mirrored_cpu.yaml               # 2 CPU replicas (MirroredStrategy)
  estimator launch --workers 2 --evaluator configs/cluster.yaml
"""
_EXAMPLES = {
    "run": _CONFIG_EXAMPLES,
    "train": """
examples:
  estimator train configs/iris.yaml                     # up to train_spec.max_steps
  estimator train configs/iris.yaml --steps 100         # 100 more steps
  estimator train configs/linear_regression.yaml --set run_config.model_dir=runs/lr2
""",
    "evaluate": """
examples:
  estimator evaluate configs/iris.yaml                  # the latest checkpoint
  estimator evaluate configs/iris.yaml --checkpoint runs/iris/model.ckpt-200 --json
""",
    "predict": """
examples:
  estimator predict configs/iris.yaml                   # JSON lines on stdout
  estimator predict configs/iris.yaml --output preds.csv --keys class_ids,probabilities
  estimator predict configs/iris.yaml --output preds.jsonl --checkpoint runs/iris/model.ckpt-400

The input is predict_spec.input_fn, else eval_spec.input_fn (labels are ignored).
""",
    "export": """
examples:
  estimator export configs/iris.yaml                    # the export section of the file
  estimator export configs/iris.yaml --export-dir /tmp/serving

The experiment needs an `export: {serving_input_receiver_fn: module:function}` section.
The export loads with torch alone: torch.export.load(dir + "/model.pt2").module().
""",
    "inspect": """
examples:
  estimator inspect runs/iris                           # checkpoints, variables, eval results
  estimator inspect configs/iris.yaml                   # the experiment's model_dir
  estimator inspect runs/iris --checkpoint runs/iris/model.ckpt-200 --json
""",
}

TOP_LEVEL_EXAMPLES = """
examples:
  estimator run configs/iris.yaml                       # train_and_evaluate, prints the final evaluation
  estimator run configs/iris.yaml --set train_spec.max_steps=200 --print-config
  estimator train configs/linear_regression.yaml --steps 100
  estimator evaluate configs/iris.yaml --json
  estimator predict configs/iris.yaml --output predictions.csv
  estimator export configs/iris.yaml
  estimator inspect runs/iris
  estimator launch --workers 2 --evaluator configs/cluster.yaml

`estimator COMMAND --help` shows each command's options and examples.
"""


def add_parsers(subparsers) -> None:
    """Register run, train, evaluate, predict, export and inspect."""
    specs = [
        ("run", "train and evaluate an experiment (train_and_evaluate)", _run),
        ("train", "train an experiment (Estimator.train)", _train),
        ("evaluate", "evaluate a checkpoint (Estimator.evaluate)", _evaluate),
        ("predict", "write predictions as JSON lines or CSV (Estimator.predict)", _predict),
        ("export", "export the model for serving (Estimator.export_saved_model)", _export),
    ]
    for name, help_text, handler in specs:
        p = subparsers.add_parser(name, help=help_text, description=help_text[0].upper()
                                  + help_text[1:] + ".", epilog=_EXAMPLES[name],
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("config", help="the experiment file (YAML)")
        p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                       dest="overrides", help="override a value, read as YAML (repeatable), "
                       "e.g. --set train_spec.max_steps=100")
        p.add_argument("--print-config", action="store_true",
                       help="print the resolved experiment and exit without running")
        p.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
        if name == "train":
            p.add_argument("--steps", type=_positive_int, default=None,
                           help="train this many more steps instead of up to max_steps")
        if name in ("evaluate", "predict", "export"):
            p.add_argument("--checkpoint", default=None, metavar="PATH",
                           help="a checkpoint file or model_dir (default: the latest)")
        if name == "evaluate":
            p.add_argument("--json", action="store_true", help="print the result as JSON")
        if name == "predict":
            p.add_argument("--output", "-o", default="-", metavar="FILE",
                           help="where to write (default: stdout)")
            p.add_argument("--format", choices=("jsonl", "csv"), default=None,
                           help="jsonl or csv (default: from the file extension, else jsonl)")
            p.add_argument("--keys", default=None, metavar="K1,K2",
                           help="prediction keys to write (default: predict_spec.predict_keys, "
                                "else all)")
        if name == "export":
            p.add_argument("--export-dir", default=None, metavar="DIR",
                           help="export_dir_base (default: export.export_dir_base, else "
                                "<model_dir>/export/saved_model)")
        p.set_defaults(handler=_guarded(name, handler))

    p = subparsers.add_parser(
        "inspect", help="show checkpoints, variables and eval results of a model_dir",
        description="Show a model_dir: its checkpoints (steps, files), the variables of the "
                    "latest one (names, shapes, dtypes), the evaluation results and exports.",
        epilog=_EXAMPLES["inspect"], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="a model_dir, or an experiment file (its run_config.model_dir)")
    p.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                   dest="overrides", help="override the experiment (when TARGET is a file)")
    p.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="show the variables of this checkpoint (default: the latest)")
    p.add_argument("--json", action="store_true", help="print everything as one JSON object")
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    p.set_defaults(handler=_guarded("inspect", _inspect))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _guarded(name: str, handler):
    """Run a handler; a bad experiment is exit status 2 with every problem on
    stderr; an error this library raised with no user code on the stack (a
    missing checkpoint, a model_dir with none to export) is exit status 1
    with its message. Errors from user code keep their traceback."""
    def run(args) -> int:
        _setup_logging(args.quiet)
        try:
            return handler(args)
        except ExperimentError as e:
            for problem in e.problems:
                print(f"estimator {name}: error: {problem}", file=sys.stderr)
            return 2
        except (ValueError, TypeError, OSError, RuntimeError, KeyError) as e:
            if not _ours_alone(e):
                raise
            message = e.args[0] if isinstance(e, KeyError) and len(e.args) == 1 else str(e)
            print(f"estimator {name}: error: " + " ".join([str(message),
                                                           *getattr(e, "__notes__", ())]),
                  file=sys.stderr)   # (one line: the notes, "(raised in replica 1 ...)", after it)
            return 1
    return run


def _ours_alone(error: BaseException) -> bool:
    """Whether `error` was raised by this library's own checks: every frame
    of its traceback in its packages or Python's standard library (none in
    a user's model_fn, input_fn or hook, nor in torch or another installed
    package), and not chained from another error. An error a replica process
    raised comes with its frames' files (`__cause__.filenames`): those count."""
    cause = error.__cause__
    remote = getattr(cause, "filenames", None) if cause is not None else None
    if (cause is not None and remote is None) or (
            error.__context__ is not None and not error.__suppress_context__):
        return False
    import sysconfig
    import distribute
    import hooks
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # estimator/
    ours = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                 for m in (distribute, hooks)) + (package + os.sep,)
    stdlib = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep
                    for k in ("stdlib", "platstdlib")})
    filenames = list(remote or [])
    tb = error.__traceback__
    while tb is not None:
        filenames.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    for filename in filenames:
        if filename.startswith("<frozen "):   # the standard library's frozen modules (os)
            continue
        filename = os.path.abspath(filename)
        installed = f"{os.sep}site-packages{os.sep}" in filename or \
            f"{os.sep}dist-packages{os.sep}" in filename
        if not filename.startswith(ours) and (installed or not filename.startswith(stdlib)):
            return False
    return True


def _setup_logging(quiet: bool) -> None:
    """The command's console: INFO lines (WARNING with -q). Where logging is
    configured already (the CLI called in a Python process that set it up),
    it is left as it is: the caller's levels and handlers decide."""
    level = logging.WARNING if quiet else logging.INFO
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
        root.setLevel(level)


def _load(args) -> Optional[experiment.Experiment]:
    """The experiment, or None after printing it when --print-config."""
    exp = experiment.load(args.config, args.overrides)
    if args.print_config:
        print(exp.to_yaml(), end="")
        return None
    return exp


# -- run / train / evaluate ------------------------------------------------------------
def _run(args) -> int:
    import estimator as est
    exp = _load(args)
    if exp is None:
        return 0
    exp.require("train_spec", "eval_spec", command="estimator run")
    exp.check_receivers("eval_spec")   # (its exporters' export comes after training)
    estimator = exp.estimator()
    train_spec, eval_spec = exp.train_spec(estimator), exp.eval_spec(estimator)
    record = exp.save_hook(estimator, "run")   # experiment.yaml, once training starts
    if record is not None:
        train_spec = train_spec._replace(hooks=train_spec.hooks + (record,))
    outcome = est.train_and_evaluate(estimator, train_spec, eval_spec)
    if outcome is None or (outcome[0] is None and not _is_chief(estimator)):
        # a training task of a cluster, or a replica other than the chief
        # (torchrun, SLURM): the evaluator or the chief reports
        print(f"{_task(estimator)}: training finished")
        return 0
    result, exports = outcome
    if result is None:
        print(_nothing_trained(estimator, train_spec.max_steps, eval_spec, args.config))
        return 0
    print(_format_result("Final evaluation", result, eval_spec.name))
    for path in exports or ():
        if path:
            print(f"Exported: {_text(path)}")
    return 0


def _nothing_trained(estimator, max_steps, eval_spec, config: str) -> str:
    """Why `run` evaluated nothing: model_dir was at max_steps already, or
    training stopped before its first step (an input_fn that gave no data)."""
    try:
        step = int(estimator.get_variable_value("global_step"))
    except ValueError:   # (no checkpoint)
        step = 0
    then = f"evaluate with: estimator evaluate {config}" + (
        f"; export with: estimator export {config}" if eval_spec.exporters else "")
    if max_steps is not None and step >= max_steps:
        unevaluated = ("" if step in _evaluated_steps(estimator, eval_spec) else
                       f"; its last checkpoint, of global step {step}, was never evaluated "
                       "here (its evaluation interrupted, or trained by `estimator train`) "
                       "nor passed to eval_spec's exporters")
        return (f"No evaluation ran (nothing new to train in {estimator.model_dir}: at global "
                f"step {step}, max_steps {max_steps}){unevaluated}; {then}")
    return (f"No evaluation ran: training stopped before its first step, at global step "
            f"{step} (max_steps {max_steps}); the warnings above say why (an input_fn that "
            f"gave no data, a hook that stopped it)")


def _evaluated_steps(estimator, eval_spec) -> set:
    """The global steps `train_and_evaluate` evaluated (its eval dir's ledger)."""
    path = os.path.join(estimator.eval_dir(eval_spec.name), LEDGER)
    steps = set()
    try:
        with open(path) as f:
            for line in f:
                try:
                    steps.add(int(json.loads(line)["global_step"]))
                except (ValueError, KeyError, TypeError):
                    pass   # (a torn line)
    except OSError:
        pass
    return steps


def _train(args) -> int:
    exp = _load(args)
    if exp is None:
        return 0
    exp.require("train_spec", command="estimator train")
    estimator = exp.estimator()
    spec = exp.train_spec(estimator)
    # experiment.yaml, once training starts; its rerun command with `--steps`
    command = "train" if args.steps is None else f"train --steps {args.steps}"
    record = exp.save_hook(estimator, command)
    # `--steps` trains that many more steps; else up to the TrainSpec's max_steps.
    estimator.train(spec.input_fn, hooks=list(spec.hooks) + ([record] if record else []),
                    steps=args.steps,
                    max_steps=spec.max_steps if args.steps is None else None,
                    saving_listeners=list(spec.saving_listeners))
    if not _is_chief(estimator):
        print(f"{_task(estimator)}: training finished")
        return 0
    latest = estimator.latest_checkpoint()
    step = checkpoint.step_of(latest) if latest else 0
    print(f"Trained to global step {step}; latest checkpoint: {latest}")
    return 0


def _evaluate(args) -> int:
    exp = _load(args)
    if exp is None:
        return 0
    exp.require("eval_spec", command="estimator evaluate")
    estimator = exp.estimator()
    spec = exp.eval_spec(estimator)
    result = estimator.evaluate(spec.input_fn, steps=spec.steps, hooks=list(spec.hooks),
                                checkpoint_path=args.checkpoint, name=spec.name)
    if args.json:
        print(json.dumps({k: _jsonable(v) for k, v in result.items()}, sort_keys=True))
    else:
        print(_format_result("Evaluation", result, spec.name))
    return 0


def _task(estimator) -> str:
    c = estimator.config
    return f"{c.task_type} {c.task_id}" if c.cluster_spec else "this replica"


def _is_chief(estimator) -> bool:
    return writes_checkpoints(estimator.config)


def _format_result(title: str, result: dict, name: Optional[str]) -> str:
    step = result.get("global_step")
    values = ", ".join(f"{k} = {_number(v)}" for k, v in sorted(result.items())
                       if k != "global_step")
    where = f" ({name})" if name else ""
    return f"{title}{where} at global step {step}: {values}"


def _number(value) -> str:
    value = _jsonable(value)
    if isinstance(value, float):
        text = f"{value:.6g}"
        return text + ".0" if text.lstrip("-").isdigit() else text   # 1.0, not 1
    return str(value)


# -- predict ---------------------------------------------------------------------------
def _predict(args) -> int:
    exp = _load(args)
    if exp is None:
        return 0
    section = "predict_spec" if exp.section("predict_spec") else "eval_spec"
    if section == "eval_spec" and not exp.section("eval_spec"):
        exp.require("predict_spec", command="estimator predict")
    spec = exp.section(section)
    estimator = exp.estimator()
    keys = args.keys.split(",") if args.keys else spec.get("predict_keys") \
        if section == "predict_spec" else None
    if isinstance(keys, str):
        keys = [keys]
    hooks = exp.hooks(section, estimator) if section == "predict_spec" else []
    ckpt = args.checkpoint or (spec.get("checkpoint_path") if section == "predict_spec" else None)
    fmt = args.format or _format_of(args.output)
    if args.output != "-":
        _check_output(args.output)
    predictions = estimator.predict(exp.function(section, "input_fn"), predict_keys=keys,
                                    hooks=hooks, checkpoint_path=ckpt)
    write = _write_csv if fmt == "csv" else _write_jsonl
    if args.output == "-":
        count = write(predictions, sys.stdout)
    else:   # a temp file renamed over FILE once complete: a failure leaves FILE as it was
        written = []

        def fill(binary):
            text = io.TextIOWrapper(binary, encoding="utf-8", newline="")
            written.append(write(predictions, text))
            text.flush()
            text.detach()   # (the binary file is closed by atomic_write)
        with _sigterm_interrupts():   # (its temp file removed then too)
            files.atomic_write(args.output, fill)
        count = written[0]
    where = "stdout" if args.output == "-" else args.output
    print(f"Wrote {count} predictions ({fmt}) to {where}", file=sys.stderr)
    return 0


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does, so that what is
    being written is cleaned up (its default ends the process at once)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _check_output(output: str) -> None:
    """A FILE predictions can be written to, said before predicting (the
    error named the temp file written first)."""
    if os.path.isdir(output):
        raise ValueError(f"--output {output} is a directory; name a file (in it: "
                         f"{os.path.join(output, 'predictions.jsonl')})")
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise ValueError(f"--output {output}: directory {parent} does not exist; create it "
                         f"first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--output {output}: directory {parent} is not writable")


def _format_of(output: str) -> str:
    """csv for a .csv FILE, else jsonl (said where the extension is another)."""
    extension = os.path.splitext(output)[1].lower()
    if extension == ".csv":
        return "csv"
    if output != "-" and extension not in ("", ".jsonl", ".json", ".ndjson"):
        print(f"estimator predict: warning: writing JSON lines to {output} (only .csv is "
              "written as CSV; give --format csv|jsonl to choose)", file=sys.stderr)
    return "jsonl"


def _write_jsonl(predictions, out) -> int:
    count = 0
    for p in predictions:
        out.write(json.dumps({k: _jsonable(v) for k, v in p.items()}) + "\n")
        count += 1
    return count


def _write_csv(predictions, out) -> int:
    """One row per example; an array value becomes columns key_0, key_1, ..."""
    writer, header, count = None, None, 0
    for p in predictions:
        row, source = {}, {}
        for key, value in p.items():
            value = np.asarray(value)
            cells = ([(key, value)] if value.ndim == 0 else
                     [(key + "_" + "_".join(map(str, i)), value[i])
                      for i in np.ndindex(value.shape)])
            for column, cell in cells:
                if column in row:
                    raise ValueError(
                        f"predictions {source[column]!r} and {key!r} would both be CSV column "
                        f"{column!r}; write JSON lines (--format jsonl), or rename one of them")
                row[column], source[column] = _jsonable(cell), key
        if writer is None:
            header = list(row)
            writer = csv.DictWriter(out, fieldnames=header)
            writer.writeheader()
        elif list(row) != header:
            raise ValueError(f"prediction {count} has columns {list(row)}, the first had "
                             f"{header}; write JSON lines (--format jsonl) for ragged outputs")
        writer.writerow(row)
        count += 1
    return count


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value] if value.ndim else _jsonable(value[()])
    if isinstance(value, np.floating) and value.dtype.itemsize < 8:
        return float(str(value))     # float32's shortest repr: 0.9969594, not 0.99695944786
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "detach"):            # a tensor
        return _jsonable(to_numpy(value))
    return value


# -- export ----------------------------------------------------------------------------
def _export(args) -> int:
    exp = _load(args)
    if exp is None:
        return 0
    exp.require("export", command="estimator export")
    exp.check_receivers("export")
    spec = exp.section("export")
    estimator = exp.estimator()
    base = args.export_dir or spec.get("export_dir_base") or \
        os.path.join(estimator.model_dir, "export", "saved_model")
    path = estimator.export_saved_model(
        base, exp.function("export", "serving_input_receiver_fn"),
        checkpoint_path=args.checkpoint or spec.get("checkpoint_path"))
    print(_text(path))
    return 0


def _text(path) -> str:
    return path.decode() if isinstance(path, bytes) else str(path)


# -- inspect ---------------------------------------------------------------------------
def _inspect(args) -> int:
    target = args.target
    if os.path.isfile(target):
        exp = experiment.load(target, args.overrides)
        model_dir = exp.model_dir
        if not model_dir:
            print(f"estimator inspect: error: {target} sets no run_config.model_dir",
                  file=sys.stderr)
            return 2
    else:
        model_dir = target
    if not os.path.isdir(model_dir):
        why = (f"{target}: model_dir {model_dir} does not exist yet (nothing trained "
               f"there; train with: estimator run {target})" if model_dir != target else
               f"{model_dir} is not a directory (a model_dir or an experiment file)")
        print(f"estimator inspect: error: {why}", file=sys.stderr)
        return 2
    report = _describe_model_dir(model_dir, args.checkpoint)
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    else:
        print(_format_report(report))
    return 0


def _describe_model_dir(model_dir: str, ckpt: Optional[str]) -> dict:
    latest = checkpoint.latest_checkpoint(model_dir)
    checkpoints, newest_good = [], None   # (path, contents)
    listed = checkpoint.all_checkpoints(model_dir) or checkpoint.checkpoints_on_disk(model_dir)
    for path in reversed(listed):   # newest first
        stat = os.stat(path)
        try:   # (each read whole: its digest checked; only the newest good one kept)
            state, damaged, unread = checkpoint.load(path), None, None
            newest_good = newest_good or (path, state)
        except (checkpoint.DataLossError, OSError) as e:   # (OSError: not a file, unreadable)
            damaged, unread = str(e), None
        except checkpoint.UnsafeCheckpointError as e:   # (classes this process does not allow)
            damaged, unread = None, str(e)
        checkpoints.insert(0, {"step": checkpoint.step_of(path), "path": path,
                               "bytes": stat.st_size, "damaged": damaged, "not_read": unread,
                               "time": datetime.datetime.fromtimestamp(stat.st_mtime)
                               .isoformat(timespec="seconds")})
    tf_prefix = tf_checkpoint.find_prefix(ckpt or model_dir)
    if tf_prefix is not None:   # a TF model_dir or checkpoint: read without TF
        shown = latest = tf_prefix
        listed = tf_checkpoint.state_prefixes(model_dir)[1] if not ckpt else []
        checkpoints = [{"step": _tf_step(prefix), "path": prefix,
                        "bytes": sum(os.path.getsize(p) for p in glob.glob(
                            glob.escape(prefix) + ".*")),
                        "time": datetime.datetime.fromtimestamp(
                            os.stat(prefix + ".index").st_mtime).isoformat(timespec="seconds")}
                       for prefix in [p for p in listed if p != tf_prefix] + [tf_prefix]
                       if os.path.isfile(prefix + ".index")]
        variables = [{"name": n, "shape": list(shape), "dtype": dtype} for n, (dtype, shape)
                     in tf_checkpoint.TFCheckpointReader(tf_prefix).variables().items()]
    else:   # unless named, the newest good one (on disk when the index lists none)
        shown = checkpoint.resolve(ckpt) if ckpt else newest_good and newest_good[0]
        variables = []
    if shown and tf_prefix is None:
        state = newest_good[1] if newest_good and newest_good[0] == shown else \
            checkpoint.load(shown)
        for name, tensor in sorted(checkpoint.flat_variables(state).items()):
            variables.append({"name": name, "shape": list(tensor.shape),
                              "dtype": str(tensor.dtype).replace("torch.", "")})
    evals = {}
    for entry in sorted(os.listdir(model_dir)):
        directory = os.path.join(model_dir, entry)
        if os.path.isdir(directory) and (entry == "eval" or entry.startswith("eval_")):
            results = _eval_results(directory)
            if results:
                evals[entry] = {str(step): metrics for step, metrics in results.items()}
    experiment_file = os.path.join(model_dir, experiment.EXPERIMENT_FILE)
    return {
        "model_dir": model_dir,
        "experiment": experiment_file if os.path.isfile(experiment_file) else None,
        "latest": latest,
        "checkpoints": checkpoints,
        "variables_of": shown,
        "variables": variables,
        "eval": evals,
        "exports": _exports(model_dir),
    }


def _tf_step(prefix: str) -> Optional[int]:
    match = re.search(r"-(\d+)$", prefix)
    return int(match.group(1)) if match else None


def _eval_results(eval_dir: str) -> dict:
    from hooks import read_eval_metrics
    return {int(step): {k: _jsonable(v) for k, v in metrics.items()}
            for step, metrics in read_eval_metrics(eval_dir).items()}


def _exports(model_dir: str) -> list:
    """Export directories (named by timestamp) under model_dir/export, two levels deep."""
    root = os.path.join(model_dir, "export")
    found = []
    if not os.path.isdir(root):
        return found
    for dirpath, dirnames, _ in os.walk(root):
        depth = os.path.relpath(dirpath, root).count(os.sep)
        for d in sorted(dirnames):
            if d.isdigit():
                found.append(os.path.join(dirpath, d))
        dirnames[:] = [d for d in dirnames if not d.isdigit()] if depth < 1 else []
    return sorted(found)


def _format_report(r: dict) -> str:
    lines = [f"model_dir: {r['model_dir']}"]
    if r["experiment"]:
        lines.append(f"experiment: {r['experiment']}")
    if not r["checkpoints"]:
        lines.append("checkpoints: none")
    else:
        lines.append(f"checkpoints ({len(r['checkpoints'])} kept, latest "
                     f"{os.path.basename(r['latest'] or '-')}):")
        for c in r["checkpoints"]:
            step = "-" if c["step"] is None else c["step"]   # (a TF prefix without -N)
            lines.append(f"  step {step:>8}  {os.path.basename(c['path']):<24} "
                         f"{_size(c['bytes']):>9}  {c['time']}")
            if c.get("damaged"):
                lines.append(f"    DAMAGED: {c['damaged']}")
            if c.get("not_read"):
                lines.append(f"    NOT READ: {c['not_read']}")
    if r["variables_of"]:
        lines.append(f"variables in {os.path.basename(r['variables_of'])}:")
        width = max(len(v["name"]) for v in r["variables"]) if r["variables"] else 0
        for v in r["variables"]:
            lines.append(f"  {v['name']:<{width}}  {str(v['shape']):<14} {v['dtype']}")
    if r["eval"]:
        for name, results in r["eval"].items():
            lines.append(f"eval results ({name}):")
            for step, metrics in sorted(results.items(), key=lambda kv: int(kv[0])):
                values = ", ".join(f"{k} = {_number(v)}" for k, v in sorted(metrics.items()))
                lines.append(f"  step {step:>8}: {values}")
    else:
        lines.append("eval results: none")
    if r["exports"]:
        lines.append("exports:")
        lines += [f"  {path}" for path in r["exports"]]
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
