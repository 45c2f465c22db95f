"""One task of a ParameterServerStrategy cluster, for tests/distribute/test_parameter_server.py
and bench/ps_bench.py.

Run by the launcher (estimator.launch) with TF_CONFIG set:

    python tests/support/ps_task.py MODEL_DIR --steps 200 [--legacy] [--die-at STEP]
        [--partition] [--placement by_size] [--out OUT_DIR] [--step-secs S]
        [--kill-ps-at STEP] [--decay-steps N] [--batch-norm] [--canned] [--canned-tables]
        [--warm-start CKPT] [--user-model [--every K]]

Trains a small MLP classifier (est.get_module "mlp") with Adam under
train_and_evaluate. `--legacy` gives no train_distribute (TF_CONFIG's ps
tasks alone make it a parameter-server job); `--die-at N` makes worker 0's
first incarnation kill itself (SIGKILL) at global step N; the chief writes
the parameter placement to OUT_DIR/placement.json; `--step-secs` makes
every step last that much longer; `--kill-ps-at N` makes the chief kill ps 1
(SIGKILL) at global step N, once; `--decay-steps N` halves the learning rate
every N steps (TF1's exponential_decay given to the optimizer);
`--batch-norm` adds a BatchNorm1d (buffers: moving averages); `--canned`
trains `canned_estimator` (a DNNLinearCombinedClassifier: Ftrl and Adagrad
on the ps tasks) instead of the MLP, `--canned-tables` its variant with
bucketized tables under RMSProp and Ftrl; `--warm-start CKPT` warm-starts every
variable from CKPT (`vars_to_warm_start=[".*"]`); `--user-model` trains
`user_model_fn` instead (`--every K`: its optimizers step every K-th call).
Each task writes its pid to MODEL_DIR/<task type><index>.pid (chief0.pid,
ps1.pid, ...).
"""
import argparse
import json
import logging
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), HERE]   # the repository, tests/support

import numpy as np  # noqa: E402
import torch  # noqa: E402

import distribute  # noqa: E402
import estimator as est  # noqa: E402
import hooks  # noqa: E402

FEATURES, CLASSES = 8, 3


def dataset(n, seed):
    """A fixed 3-class problem: labels from a random teacher, mostly linear."""
    g = np.random.RandomState(1234)
    w, w1, w2 = g.randn(FEATURES, CLASSES), g.randn(FEATURES, 4), g.randn(4, CLASSES)
    rng = np.random.RandomState(seed)
    x = rng.randn(n, FEATURES).astype(np.float32)
    y = np.argmax(x @ w + 0.5 * np.tanh(x @ w1) @ w2, axis=1).astype(np.int64)
    return x, y


def train_input_fn(input_context=None, batch_size=32):
    x, y = dataset(4096, seed=0)
    shards = input_context.num_input_pipelines if input_context else 1
    index = input_context.input_pipeline_id if input_context else 0
    x, y = x[index::shards], y[index::shards]
    rng = np.random.RandomState(index)

    def gen():
        while True:
            order = rng.permutation(len(x))
            for i in range(0, len(order) - batch_size + 1, batch_size):
                j = order[i:i + batch_size]
                yield {"x": x[j]}, y[j]
    return gen()


def eval_input_fn():
    x, y = dataset(1024, seed=1)
    return [({"x": x[i:i + 256]}, y[i:i + 256]) for i in range(0, 1024, 256)]


def _mlp(batch_norm):
    norm = [torch.nn.BatchNorm1d(64)] if batch_norm else []
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 64), *norm, torch.nn.ReLU(), torch.nn.Linear(64, 64),
        torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))


def model_fn(features, labels, mode, params):
    net = est.get_module("mlp", lambda: _mlp(params.get("batch_norm")))
    net.train(mode == est.ModeKeys.TRAIN)
    logits = net(torch.as_tensor(features["x"]))
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"class": logits.argmax(-1)})
    loss = torch.nn.functional.cross_entropy(logits, torch.as_tensor(labels))
    if mode == est.ModeKeys.EVAL:
        return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "accuracy": est.metrics.accuracy(labels, logits.argmax(-1))})
    lr = params.get("lr", 3e-3)
    if params.get("decay_steps"):   # TF's exponential_decay, given to the optimizer as in TF
        lr = est.learning_rate_decay.exponential_decay(lr, est.get_global_step(),
                                                       params["decay_steps"], 0.5)
    opt = est.get_optimizer(lambda p: torch.optim.Adam(p, lr=lr))
    if params.get("moving_average"):   # (refused on ps tasks)
        est.moving_averages.ExponentialMovingAverage(0.99).apply()
    return est.EstimatorSpec(mode, loss=loss, train_op=opt)


def user_model_fn(features, labels, mode, params):
    """What users write: a LazyLinear layer, a sparse embedding of ids (made
    from the features) under Ftrl beside Adam, a callable train_op that
    does not zero the gradients (the Estimator frees them after a step)."""
    x = torch.as_tensor(features["x"])
    ids = (x[:, 0].abs() * 7).long() % 50
    emb = est.get_module("emb", lambda: torch.nn.Embedding(50, 4, sparse=True))
    net = est.get_module("net", lambda: torch.nn.Sequential(
        torch.nn.LazyLinear(16), torch.nn.ReLU(), torch.nn.Linear(16, CLASSES)))
    logits = net(torch.cat([x, emb(ids)], 1))
    loss = torch.nn.functional.cross_entropy(logits, torch.as_tensor(labels))
    if mode == est.ModeKeys.EVAL:
        return est.EstimatorSpec(mode, loss=loss)
    opt = est.get_optimizer(lambda p: torch.optim.Adam(p, lr=3e-3), var_list=net)
    sparse = est.get_optimizer(lambda p: est.optimizers.Ftrl(p, 0.1), name="emb",
                               var_list=emb)

    every, step = params.get("every") or 1, est.get_global_step()

    def train_op():   # (`every` > 1: gradient accumulation, a step every that many calls)
        loss.backward()
        if step % every == every - 1:
            opt.step()
            sparse.step()
    return est.EstimatorSpec(mode, loss=loss, train_op=train_op)


def canned_estimator(config, tables=False, warm_start_from=None):
    """Wide & deep over the features, with TF1's two default optimizers;
    `tables`: over the features cut in 82 buckets each too (a linear table
    under RMSProp, an embedding table under Ftrl: TF's sparse applies leave
    the rows a batch did not read)."""
    numeric = est.feature_column.numeric_column("x", shape=(FEATURES,))
    if not tables:
        return est.DNNLinearCombinedClassifier(
            linear_feature_columns=[numeric], dnn_feature_columns=[numeric],
            dnn_hidden_units=[16], n_classes=CLASSES, config=config,
            warm_start_from=warm_start_from)
    buckets = est.feature_column.bucketized_column(numeric, list(np.linspace(-4, 4, 81)))
    return est.DNNLinearCombinedClassifier(
        linear_feature_columns=[buckets], linear_optimizer="RMSProp",
        dnn_feature_columns=[numeric, est.feature_column.embedding_column(buckets, 3)],
        dnn_optimizer="Ftrl", dnn_hidden_units=[16], n_classes=CLASSES, config=config,
        warm_start_from=warm_start_from)


class _DieAt(hooks.SessionRunHook):
    """Kills this process (SIGKILL) at global step `step`, once (a marker file)."""

    def __init__(self, step, marker):
        self._step, self._marker = step, marker

    def after_run(self, run_context, run_values):
        if run_context.session.global_step >= self._step and not os.path.exists(self._marker):
            open(self._marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


class _FailAt(hooks.SessionRunHook):
    """Raises RuntimeError at global step `step` (a chief's training failing)."""

    def __init__(self, step):
        self._step = step

    def after_run(self, run_context, run_values):
        if run_context.session.global_step >= self._step:
            raise RuntimeError(f"the chief fails at global step {self._step}")


class _KillPs(hooks.SessionRunHook):
    """Kills ps 1 (SIGKILL, its pid from MODEL_DIR/ps1.pid) at global step `step`, once."""

    def __init__(self, step, model_dir):
        self._step, self._model_dir = step, model_dir

    def after_run(self, run_context, run_values):
        marker = os.path.join(self._model_dir, "killed_ps")
        if run_context.session.global_step >= self._step and not os.path.exists(marker):
            open(marker, "w").close()
            with open(os.path.join(self._model_dir, "ps1.pid")) as f:
                os.kill(int(f.read()), signal.SIGKILL)


class _Sleep(hooks.SessionRunHook):
    """Slows each step down by `secs` (a model whose steps take time)."""

    def __init__(self, secs):
        self._secs = secs

    def after_run(self, run_context, run_values):
        time.sleep(self._secs)


class _WritePlacement(hooks.SessionRunHook):
    def __init__(self, path):
        self._path = path

    def end(self, session):
        extended = session.strategy.extended
        with open(self._path, "w") as f:
            json.dump({"placement": extended.parameter_placement,
                       "parameter_devices": list(extended.parameter_devices),
                       "rpc": extended.rpc_stats()}, f)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--legacy", action="store_true")
    parser.add_argument("--die-at", type=int)
    parser.add_argument("--partition", action="store_true")
    parser.add_argument("--placement", default="round_robin")
    parser.add_argument("--out")
    parser.add_argument("--step-secs", type=float, default=0.0)
    parser.add_argument("--kill-ps-at", type=int)
    parser.add_argument("--fail-chief-at", type=int)
    parser.add_argument("--decay-steps", type=int)
    parser.add_argument("--batch-norm", action="store_true")
    parser.add_argument("--canned", action="store_true")
    parser.add_argument("--canned-tables", action="store_true")
    parser.add_argument("--warm-start")
    parser.add_argument("--user-model", action="store_true")
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--moving-average", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    strategy = None
    if not args.legacy:
        strategy = distribute.ParameterServerStrategy(
            variable_partitioner=(distribute.partitioners.FixedShardsPartitioner(2)
                                  if args.partition else None),
            placement=args.placement, timeout_secs=20, init_timeout_secs=60)
    config = est.RunConfig(model_dir=args.model_dir, train_distribute=strategy,
                           tf_random_seed=7, save_checkpoints_steps=50,
                           log_step_count_steps=50)
    warm_start = args.warm_start and est.WarmStartSettings(args.warm_start, [".*"])
    estimator = canned_estimator(config, args.canned_tables, warm_start) if (
        args.canned or args.canned_tables) else est.Estimator(
        user_model_fn if args.user_model else model_fn, config=config,
        params={"lr": 3e-3, "decay_steps": args.decay_steps, "batch_norm": args.batch_norm,
                "every": args.every, "moving_average": args.moving_average},
        warm_start_from=warm_start)
    train_hooks = [_Sleep(args.step_secs)] if args.step_secs else []
    if args.die_at and config.task_type == "worker" and config.task_id == 0:
        train_hooks.append(_DieAt(args.die_at, os.path.join(args.model_dir, "died")))
    os.makedirs(args.model_dir, exist_ok=True)
    with open(os.path.join(args.model_dir, f"{config.task_type}{config.task_id}.pid"), "w") as f:
        f.write(str(os.getpid()))
    if args.kill_ps_at and config.task_type == "chief":
        train_hooks.append(_KillPs(args.kill_ps_at, args.model_dir))
    if args.fail_chief_at and config.task_type == "chief":
        train_hooks.append(_FailAt(args.fail_chief_at))
    if args.out and config.task_type == "chief":
        train_hooks.append(_WritePlacement(os.path.join(args.out, "placement.json")))
    est.train_and_evaluate(
        estimator, est.TrainSpec(train_input_fn, max_steps=args.steps, hooks=train_hooks),
        est.EvalSpec(eval_input_fn, steps=None, start_delay_secs=0, throttle_secs=0))


if __name__ == "__main__":
    main()
