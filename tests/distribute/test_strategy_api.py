"""The Strategy API for custom loops under MirroredStrategy (inside the replica
processes), the custom-loop example, input sharding and argument errors."""
import dataclasses
import json
import logging
import os
import random
import sys

import numpy as np
import pytest
import torch

import distribute
from distribute import input_lib
from paths import FIXTURES, ROOT

sys.path.insert(0, os.path.join(ROOT, "examples"))

DEVICES = ["cpu:0", "cpu:1"]


def _observe(strategy):
    """Runs in each replica: what the Strategy API answers there."""
    rank = strategy.run(lambda: distribute.get_replica_context().replica_id_in_sync_group)
    with strategy.scope():
        cross = distribute.in_cross_replica_context()
    ctx_sum = strategy.run(lambda: distribute.get_replica_context().all_reduce(
        distribute.ReduceOp.SUM, torch.tensor(float(rank + 1))))
    value = torch.tensor([float(rank), 10.0])
    split = [b.tolist() for b in strategy.experimental_distribute_dataset(
        [torch.arange(5.0), torch.arange(4.0)])]
    contexts = []

    def dataset_fn(context):
        contexts.append((context.num_input_pipelines, context.input_pipeline_id,
                         context.num_replicas_in_sync))
        return [torch.tensor([i]) for i in range(3 + context.input_pipeline_id)]

    from_function = [b.tolist() for b in strategy.distribute_datasets_from_function(dataset_fn)]
    per_replica = distribute.InputOptions(
        experimental_fetch_to_device=False,
        experimental_replication_mode=distribute.InputReplicationMode.PER_REPLICA)
    on_host = [b.tolist() for b in strategy.distribute_datasets_from_function(
        lambda context: [np.arange(2.0) + context.input_pipeline_id], per_replica)]
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync))
    return {
        "rank": rank, "replicas": strategy.num_replicas_in_sync, "cross": cross,
        "in_run_cross": strategy.run(distribute.in_cross_replica_context),
        "all_reduce": ctx_sum.item(),
        "sum": strategy.reduce("SUM", value, axis=None).tolist(),
        "mean_axis": strategy.reduce(distribute.ReduceOp.MEAN, value, axis=0).item(),
        "local": len(strategy.experimental_local_results(value)),
        "split": split, "contexts": contexts, "from_function": from_function,
        "on_host": on_host, "values": values,
        "chief": strategy.extended.should_checkpoint,
        "loss_reduction": distribute.get_loss_reduction(),
    }


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@dataclasses.dataclass
class _Rows:
    x: torch.Tensor


def _custom_loop_against_tf(strategy):
    """What a TF2 custom loop met on 2 replicas that TF 2.15 does otherwise
    (each run on replica 0 and 1)."""
    drawn = random.random()   # (forked: Python reseeded each replica's generator)
    rank = strategy.run(lambda: distribute.get_replica_context().replica_id_in_sync_group)
    warned = _Warnings()
    logging.getLogger("distribute").addHandler(warned)
    # a last global batch of 1 row split 1/0: TF's div_no_nan gives 0 on the empty replica
    rows = torch.tensor([3.0]) if rank == 0 else torch.zeros(0)
    losses = strategy.run(distribute.compute_average_loss, args=(rows,))
    # all_reduce has a gradient (the replicas' gradients all-reduced)
    p = torch.tensor(1.0, requires_grad=True)

    def grad_through_all_reduce():
        y = distribute.get_replica_context().all_reduce("SUM", 3 * p * (rank + 1))
        y.backward()
    strategy.run(grad_through_all_reduce, options=distribute.RunOptions())
    # a dataset_fn ignoring input_context: every replica reads the same batches
    unsharded = strategy.distribute_datasets_from_function(
        lambda context: [np.arange(4.0), np.arange(4.0, 8.0)])
    batches = [b.tolist() for b in unsharded]

    def rows(context):   # 9 rows sharded by row, batches of 4: TF's 2nd step is [8] and []
        mine = torch.arange(9.0)[context.input_pipeline_id::2]
        return [[mine[i:i + 4], ["row"] * len(mine[i:i + 4])] for i in range(0, len(mine), 4)]
    partial = [(x.tolist(), names) for x, names in
               strategy.distribute_datasets_from_function(rows)]
    # one with no empty form (a dataclass): every replica stops where one ran out
    odd = strategy.distribute_datasets_from_function(
        lambda context: [_Rows(torch.ones(2))] * (1 + context.input_pipeline_id))
    partial_odd = len(list(odd))
    # a generator's second epoch is empty
    once = strategy.experimental_distribute_dataset(x for x in [np.arange(4.0)])
    epochs = [len(list(once)) for _ in range(2)]
    # a module made under strategy.scope() and a plain optimizer: not mirrored here
    with strategy.scope():
        torch.manual_seed(0)
        plain = torch.nn.Linear(3, 1)
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1))
    stepped = {}
    for name, net in (("plain", plain), ("ddp", ddp)):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)

        def step():
            opt.zero_grad()
            net(torch.full((2, 3), float(rank + 1))).sum().backward()
            opt.step()
        try:
            strategy.run(step)
            stepped[name] = "stepped"
        except RuntimeError as e:
            stepped[name] = str(e)
    return {"rank": rank, "loss": losses.item(), "grad": p.grad.item(), "stepped": stepped,
            "random": (drawn, random.random()), "batches": batches, "epochs": epochs,
            "partial": partial, "partial_odd": partial_odd,
            "warnings": warned.messages}


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_custom_loop_on_two_replicas_as_tf():
    """Found porting TF2 custom loops (TF 2.15 on two logical CPUs): an empty
    replica batch made compute_average_loss NaN (TF: 0); a replica
    context's all_reduce cut the gradient (TF: [6, 12] here);
    strategy.run refused TF's `options`; Python's `random` drew otherwise
    on each replica (a shuffle with it read rows twice and others never);
    a dataset_fn reading everything on every replica, a generator's empty
    second epoch, and a plain module made under strategy.scope() (each
    replica trains it on its own gradients: said once) passed without a word; a
    sharded dataset_fn's last rows were dropped (TF: a partial batch, an
    empty one on the replica that ran out)."""
    random.seed(5)
    expected = random.random()
    random.seed(5)
    strategy = distribute.MirroredStrategy(DEVICES)
    r0, r1 = strategy.extended.call_for_each_replica(_custom_loop_against_tf, (strategy,))
    assert (r0["rank"], r1["rank"]) == (0, 1)
    assert (r0["loss"], r1["loss"]) == (1.5, 0.0)
    assert (r0["grad"], r1["grad"]) == (6.0, 12.0)
    assert r0["random"] == r1["random"] and r0["random"][0] == expected
    assert r0["batches"] == r1["batches"] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    assert r0["epochs"] == r1["epochs"] == [1, 0]
    assert r0["partial"] == [([0.0, 2.0, 4.0, 6.0], ["row"] * 4), ([8.0], ["row"])]
    assert r1["partial"] == [([1.0, 3.0, 5.0, 7.0], ["row"] * 4), ([], [])]
    assert r0["partial_odd"] == r1["partial_odd"] == 1
    assert any("an empty batch (TF's partial batch) cannot be made of its batches (_Rows)" in m
               for m in r0["warnings"])
    for r in (r0, r1):
        assert r["stepped"] == {"plain": "stepped", "ddp": "stepped"}
        assert sum("steps a SGD that est.get_optimizer did not make" in m
                   for m in r["warnings"]) == 1, r["warnings"]   # (once a process)
    assert any("The first training batch is the same on all 2 replicas: a dataset_fn given "
               "input_context but reads the whole input" in m for m in r0["warnings"])
    assert not any("first training batch" in m for m in r1["warnings"])   # (rank 0 says it)
    for r in (r0, r1):
        assert sum("experimental_distribute_dataset: this pass yields nothing: the dataset is "
                   "an iterator (generator)" in m for m in r["warnings"]) == 1, r["warnings"]

@pytest.mark.slow
@pytest.mark.timeout(60)
def test_strategy_api_inside_the_replicas():
    strategy = distribute.MirroredStrategy(DEVICES)
    r0, r1 = strategy.extended.call_for_each_replica(_observe, (strategy,))
    assert (r0["rank"], r1["rank"]) == (0, 1)
    for r in (r0, r1):
        assert r["replicas"] == 2 and r["cross"] and not r["in_run_cross"]
        assert r["all_reduce"] == 3.0 and r["sum"] == [1.0, 20.0]
        assert r["mean_axis"] == pytest.approx((0.5 + 10) / 2) and r["local"] == 1
        assert r["loss_reduction"] == distribute.ReduceOp.MEAN
    assert r0["split"] == [[0.0, 1.0, 2.0], [0.0, 1.0]] and r1["split"] == [[3.0, 4.0], [2.0, 3.0]]
    # uneven: one that ran out gets empty batches while another has some (TF's partial batch)
    assert r0["from_function"] == [[0], [1], [2], []]
    assert r1["from_function"] == [[0], [1], [2], [3]]
    assert r0["contexts"] == [(2, 0, 2)] and r1["contexts"] == [(2, 1, 2)]
    assert r0["on_host"] == [[0.0, 1.0]] and r1["on_host"] == [[1.0, 2.0]]
    assert r0["values"] == (0, 2) and r1["values"] == (1, 2)
    assert r0["chief"] and not r1["chief"]


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_custom_loop_example_on_two_replicas_equals_one(tmp_path, capsys):
    import custom_loop_mirrored as example
    two = example.main(["--devices", "cpu:0,cpu:1", "--steps", "30",
                        "--model_dir", str(tmp_path / "two")])
    one = example.main(["--devices", "cpu:0", "--steps", "30",
                        "--model_dir", str(tmp_path / "one")])
    assert len(two) == 2 and len(one) == 1
    assert two[0] == two[1]                            # same step, loss and weights
    step, loss, w, b = two[0]
    assert step == 30 and one[0][0] == 30
    assert loss == pytest.approx(one[0][1], rel=1e-5)
    assert (w, b) == pytest.approx(one[0][2:], abs=1e-6)
    assert "replica 1: global step 30" in capsys.readouterr().out
    names = os.listdir(tmp_path / "two")           # the chief's files only
    assert len([n for n in names if n.startswith("events")]) == 1
    assert sorted(n for n in names if not n.startswith("events")) == \
        ["checkpoint", "model.ckpt-30", "model.ckpt-30.crc32c"]


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("make", [
    lambda: distribute.MirroredStrategy(["cpu:0", "cpu:1"],
                                        cross_device_ops=distribute.ReductionToOneDevice()),
    lambda: distribute.CentralStorageStrategy(["cpu:0", "cpu:1"]),
], ids=["reduction_to_one_device", "central_storage"])
def test_a_custom_loops_optimizer_steps_on_the_replicas_mean_gradient(tmp_path, make):
    """The example's loop (`opt.step()` inside `strategy.run`, as TF2's
    `apply_gradients` in a replica context) under the strategies that reduce
    without DDP: every replica ends with one process's weights (before: each
    stepped on its own gradients, or, under central storage, nothing moved)."""
    import custom_loop_mirrored as example
    strategy = make()
    two = strategy.extended.call_for_each_replica(example.train,
                                                  (strategy, str(tmp_path / "two"), 30))
    one_device = distribute.MirroredStrategy(["cpu:0"])
    one = one_device.extended.call_for_each_replica(example.train,
                                                    (one_device, str(tmp_path / "one"), 30))
    for replica in two:
        assert replica[0] == 30
        assert replica[2:] == pytest.approx(one[0][2:], abs=1e-6)


def _dropout_over_shuffled_global_batches(strategy, epochs=3):
    """A custom loop's input: a shuffling DataLoader of 45 rows in global
    batches of 10 (the last 5: 3 and 2 rows a replica), split over the
    replicas; dropout on each replica's slice. Returns per step (rows, mask)."""
    x = torch.arange(45.0).reshape(45, 1).repeat(1, 8)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=10,
                                         shuffle=True)
    dataset = strategy.experimental_distribute_dataset(loader)
    drop = torch.nn.Dropout(0.5)
    out = []
    for _ in range(epochs):
        for (rows,) in dataset:
            mask = strategy.run(lambda: drop(torch.ones_like(rows)) > 0)
            out.append((rows[:, 0].int().tolist(), mask.int().tolist()))
    return out


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_custom_loops_replicas_split_the_same_shuffle_and_draw_their_own_dropout():
    """As TF2's strategy.run: each replica's dropout its own, the global
    batches one shuffle. Before, the replicas drew the same masks."""
    strategy = distribute.MirroredStrategy(DEVICES)
    r0, r1 = strategy.extended.call_for_each_replica(_dropout_over_shuffled_global_batches,
                                                     (strategy,))
    assert len(r0) == len(r1) == 15
    assert all(a[1][:2] != b[1][:2] for a, b in zip(r0, r1))
    for epoch in range(3):
        seen = [i for steps in (r0, r1) for rows, _ in steps[5 * epoch:5 * epoch + 5]
                for i in rows]
        assert sorted(seen) == list(range(45)), epoch


def _tf2_loop(strategy, model_dir, steps=3):
    """TF2's custom-loop pattern, ported unchanged: global batches of 8 split
    over the replicas, `compute_average_loss` of the per-example losses plus
    `scale_regularization_loss` of an L2 term. Returns (weights, the losses
    `strategy.reduce(SUM, ...)` gave)."""
    import estimator as est
    import hooks
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(8, 3, generator=g), torch.randn(8, 1, generator=g))
            for _ in range(steps)]
    with hooks.MonitoredTrainingSession(checkpoint_dir=model_dir, strategy=strategy,
                                        log_step_count_steps=None) as sess:
        torch.manual_seed(0)
        net = est.get_module("net", lambda: torch.nn.Linear(3, 1))
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))

        def step_fn(x, y):
            opt.zero_grad()
            per_example = (net(x) - y).pow(2).squeeze(1)
            loss = (distribute.compute_average_loss(per_example, global_batch_size=8)
                    + distribute.scale_regularization_loss(
                        0.01 * sum(p.pow(2).sum() for p in net.parameters())))
            loss.backward()
            opt.step()
            return loss

        losses = []
        for x, y in strategy.experimental_distribute_dataset(data):
            per_replica = sess.run(strategy.run, step_fn, args=(x, y))
            losses.append(strategy.reduce(distribute.ReduceOp.SUM, per_replica,
                                          axis=None).item())
        module = sess.session.scope.raw_modules["net"]
        return module.weight.detach().tolist(), module.bias.detach().tolist(), losses


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_tf2s_average_loss_helpers_step_and_reduce_as_one_device(tmp_path):
    """TF2 sums the replicas' gradients, so its loss helpers divide by the
    global batch and the replicas; the strategies here average them: ported
    unchanged, the helpers give TF2's step (one device's on the global
    batch) and TF2's reduced loss (the global batch's mean plus the L2 term)
    on two replicas."""
    two = distribute.MirroredStrategy(DEVICES)
    r0, r1 = two.extended.call_for_each_replica(_tf2_loop, (two, str(tmp_path / "two")))
    one = distribute.MirroredStrategy(["cpu:0"])
    (single,) = one.extended.call_for_each_replica(_tf2_loop, (one, str(tmp_path / "one")))
    for replica in (r0, r1):
        for got, want in zip(replica, single):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_tf2s_average_loss_helpers_in_one_process_and_their_errors():
    losses = torch.tensor([1.0, 2.0, 3.0, 6.0])
    assert distribute.compute_average_loss(losses).item() == pytest.approx(3.0)
    assert distribute.compute_average_loss(losses, global_batch_size=8).item() == 1.5
    assert distribute.compute_average_loss(
        losses, sample_weight=torch.tensor([1.0, 0.0, 0.0, 0.5])).item() == pytest.approx(1.0)
    assert distribute.scale_regularization_loss([torch.ones(2), torch.tensor(3.0)]).item() == 5.0
    with pytest.raises(ValueError, match="at least rank 1"):
        distribute.compute_average_loss(torch.tensor(2.0))
    for bad in (0, -8, 8.0, True):
        with pytest.raises(ValueError, match="global_batch_size must be a positive integer"):
            distribute.compute_average_loss(losses, global_batch_size=bad)
    with distribute.MirroredStrategy(DEVICES).scope():
        with pytest.raises(RuntimeError, match="cross-replica context"):
            distribute.compute_average_loss(losses)


with open(os.path.join(FIXTURES, "tf_reduce_gather.json"), encoding="utf-8") as _f:
    TF_REDUCE = json.load(_f)


def _reduce_and_gather(strategy):
    """Runs in each replica: TF's recorded reductions and gathers of its
    values (tests/support/fixtures/record_tf_reduce_gather.py), and the
    error of an elementwise reduce of uneven values."""
    rank = strategy.run(lambda: distribute.get_replica_context().replica_id_in_sync_group)
    out = {}
    for name, by_replica in TF_REDUCE["values"].items():
        value = torch.tensor(by_replica[rank])
        got = {}
        for op in ("SUM", "MEAN"):
            if value.dim() == 0 or name == "vector":
                got[f"reduce_{op}_axis_none"] = strategy.reduce(op, value, axis=None).tolist()
            if value.dim():
                got[f"reduce_{op}_axis_0"] = strategy.reduce(op, value, axis=0).tolist()
        if value.dim():
            got["gather_axis_0"] = strategy.gather(value, axis=0).tolist()
            got["all_gather_axis_0"] = strategy.run(
                lambda: distribute.get_replica_context().all_gather(value, 0)).tolist()
        out[name] = got
    try:
        strategy.reduce("MEAN", torch.tensor(TF_REDUCE["values"]["uneven"][rank]))
    except ValueError as e:
        out["error"] = str(e)
    out["nest"] = strategy.reduce("SUM", {"loss": torch.tensor(1.0 + rank),
                                          "rows": (torch.ones(2 + rank, 2),)}, axis=0)
    return out


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_reduce_along_an_axis_and_gather_uneven_batches_as_tf():
    """A short last batch split 3 and 2 over the replicas: MEAN along the batch
    is the mean over the five examples, gather concatenates them, as TF.
    Before, an uneven reduce along the batch waited forever in the all-reduce
    (and would have averaged the replicas' means)."""
    strategy = distribute.MirroredStrategy(DEVICES)
    replicas = strategy.extended.call_for_each_replica(_reduce_and_gather, (strategy,))
    for rank, got in enumerate(replicas):
        for name, recorded in TF_REDUCE["results"].items():
            for key, want in recorded.items():
                if want is None:
                    continue
                if key == "all_gather_axis_0":
                    want = want[rank]
                np.testing.assert_allclose(got[name][key], want, rtol=1e-6, err_msg=key)
            assert len(got[name]) == sum(v is not None for v in recorded.values())
        assert got["error"] == (
            "strategy.reduce: the replicas' values have different shapes [(3,), (2,)] (by "
            "replica): give `axis` (the batch dimension) to reduce each replica's value along "
            "it first, or concatenate them with strategy.gather")
        assert got["nest"]["loss"].item() == 3.0
        assert got["nest"]["rows"][0].tolist() == [5.0, 5.0]


def test_reduce_and_gather_in_one_process():
    """One replica: reduce along an axis is the tensor's own sum or mean,
    gather the value itself; a bad axis is named."""
    x = torch.tensor([[1.0, 2.0], [3.0, 6.0], [5.0, 1.0]])
    for strategy in (distribute.get_strategy(), distribute.OneDeviceStrategy("cpu")):
        assert strategy.reduce("MEAN", x, axis=0).tolist() == [3.0, 3.0]
        assert strategy.reduce(distribute.ReduceOp.SUM, x, axis=[0, 1]).item() == 18.0
        assert strategy.reduce("MEAN", x, axis=(0, 1)).item() == 3.0
        assert strategy.reduce("MEAN", torch.tensor([1, 2]), axis=0).item() == 1.5
        assert strategy.reduce("SUM", [x, {"n": 2.0}], axis=None)[1]["n"] == 2.0
        assert strategy.gather(x, axis=1) is x
        assert strategy.run(lambda: distribute.get_replica_context().all_gather(
            {"x": x}, axis=0))["x"] is x
        with pytest.raises(ValueError, match=r"gather: axis 2 is not a dimension of a value "
                                             r"of shape \[3, 2\]"):
            strategy.gather(x, axis=2)


def test_input_options_values_from_function_and_run_options_in_one_process():
    strategy = distribute.OneDeviceStrategy("cpu")
    host = distribute.InputOptions(experimental_fetch_to_device=False)
    (batch,) = strategy.experimental_distribute_dataset([np.ones(2)], host)
    assert isinstance(batch, torch.Tensor) and batch.dtype == torch.float32
    assert strategy.experimental_distribute_values_from_function(
        lambda ctx: ctx.replica_id_in_sync_group + 10 * ctx.num_replicas_in_sync) == 10
    assert strategy.run(lambda: 3, options=distribute.RunOptions()) == 3
    with pytest.raises(ValueError, match="experimental_distribute_dataset: "
                                         "InputReplicationMode.PER_REPLICA is only supported by "
                                         "distribute_datasets_from_function"):
        strategy.experimental_distribute_dataset([], distribute.InputOptions(
            experimental_replication_mode=distribute.InputReplicationMode.PER_REPLICA))
    with pytest.raises(ValueError, match="distribute_datasets_from_function: options must be a "
                                         "distribute.InputOptions, got dict"):
        strategy.distribute_datasets_from_function(lambda c: [], {"fetch": False})
    with pytest.raises(ValueError, match="experimental_replication_mode must be an "
                                         "InputReplicationMode, got 'PER_REPLICA'"):
        distribute.InputOptions(experimental_replication_mode="PER_REPLICA")


def _loop_until_a_hook_stops_replica_1(strategy, model_dir):
    """A custom loop (MonitoredTrainingSession + strategy.run) where only replica
    1's hook asks to stop, after step 3."""
    import estimator as est
    import hooks
    from replica_helpers import OnReplica
    with hooks.MonitoredTrainingSession(checkpoint_dir=model_dir, strategy=strategy,
                                        hooks=[OnReplica(1, 3, "stop")],
                                        log_step_count_steps=None) as sess:
        net = est.get_module("net", lambda: torch.nn.Linear(2, 1))
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))

        def step_fn():
            opt.zero_grad()
            loss = net(torch.ones(4, 2)).pow(2).mean()
            loss.backward()
            opt.step()
            return loss

        runs = 0
        while not sess.should_stop() and runs < 20:
            sess.run(strategy.run, step_fn)
            runs += 1
        return est.get_global_step()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_custom_loop_stops_every_replica_with_the_one_that_asked(tmp_path):
    strategy = distribute.MirroredStrategy(
        DEVICES, communication_options=distribute.CommunicationOptions(timeout_seconds=20))
    steps = strategy.extended.call_for_each_replica(
        _loop_until_a_hook_stops_replica_1, (strategy, str(tmp_path)))
    assert steps == (3, 3)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_result_that_cannot_come_back_is_an_error():
    strategy = distribute.MirroredStrategy(DEVICES)
    # Every replica fails the same way; whichever reports first is named.
    with pytest.raises(RuntimeError, match=r"result of replica [01] cannot be sent back"):
        strategy.extended.call_for_each_replica(lambda: (lambda: 1))


def test_run_in_the_launching_process_explains_what_to_do():
    strategy = distribute.MirroredStrategy(DEVICES)
    with pytest.raises(RuntimeError, match="call_for_each_replica"):
        strategy.run(lambda: 1)
    assert distribute.MirroredStrategy(["cpu:0"]).extended.call_for_each_replica(
        lambda x: x + 1, (1,)) == (2,)


@pytest.mark.parametrize("devices, error, match", [
    (["cpu:0", "/gpu:0"], ValueError, "mix CPUs and GPUs"),
    (["/device:GPU:7"], ValueError, "does not exist"),
    (["tpu:0"], ValueError, "Unrecognized device 'tpu:0'"),
    ([], ValueError, "at least one device"),
    ([3], TypeError, "must be a string"),
    # TF 2.15: AssertionError "No duplicates allowed in `devices` argument" (two
    # replicas trained on one device here, without a word)
    (["cpu:0", "/device:CPU:0"], ValueError, r"No duplicates allowed in `devices` argument"),
    (["cpu", "cpu:0"], ValueError, r"No duplicates allowed in `devices` argument"),
])
def test_bad_devices(devices, error, match):
    if "GPU" in str(devices) and torch.cuda.device_count() > 7:
        pytest.skip("this machine has the GPU")
    with pytest.raises(error, match=match):
        distribute.MirroredStrategy(devices)


def test_cross_device_ops_choices():
    for ops in (distribute.NcclAllReduce(), distribute.HierarchicalCopyAllReduce()):
        assert ops._backend("cuda") == "nccl"
        with pytest.raises(ValueError, match="needs GPU devices"):
            distribute.MirroredStrategy(DEVICES, cross_device_ops=ops)
    assert distribute.HierarchicalCopyAllReduce()._nccl_env == {"NCCL_ALGO": "Tree"}
    assert distribute.ReductionToOneDevice()._reduce_to_one
    assert distribute.NcclAllReduce(num_packs=4)._bucket_cap_mb(40 * 2 ** 20) == 10.0
    with pytest.raises(TypeError, match="CrossDeviceOps instance"):
        distribute.MirroredStrategy(DEVICES, cross_device_ops="nccl")
    with pytest.raises(ValueError, match="num_packs"):
        distribute.NcclAllReduce(num_packs=0)
    central = distribute.CentralStorageStrategy(DEVICES)
    assert central.extended.parameter_devices == ("cpu",)
    assert central.extended.worker_devices == ("cpu:0", "cpu:1")


def test_shard_sampler_partitions_without_padding_and_reshuffles_each_epoch():
    shards = [input_lib.ShardSampler(10, 3, i, shuffle=True, seed=5) for i in range(3)]
    first = [list(s) for s in shards]
    assert sorted(sum(first, [])) == list(range(10)) and [len(s) for s in first] == [4, 3, 3]
    second = [list(s) for s in shards]
    assert sorted(sum(second, [])) == list(range(10)) and second != first
    shards[0].set_epoch(0)
    assert list(shards[0]) == first[0]
    assert list(input_lib.ShardSampler(5, 2, 1, shuffle=False)) == [1, 3]


def test_batch_digest_tells_batches_apart_by_values_shape_dtype_and_strings():
    """What the replicas compare to warn that all read the same first batch."""
    def made(x):
        return ({"x": x, "city": np.array(["oslo", "lima", "rome"], dtype=object),
                 "ids": np.arange(3)}, [b"a", b"b", b"c"])
    x = torch.arange(6.0).reshape(3, 2)
    digest = input_lib.batch_digest
    batch = made(x)
    assert digest(batch) == digest(made(x.clone()))
    features, labels = batch
    others = [made(x + 1), made(x.reshape(2, 3)), made(x.double()),
              ({**features, "ids": np.arange(1, 4)}, labels),
              ({**features, "city": np.array(["oslo", "lima", "paris"], dtype=object)}, labels),
              (features, [b"a", b"b", b"d"]), (features, [b"a", b"b"])]
    assert len({digest(b) for b in [batch] + others}) == len(others) + 1
    # batches alike at their start differ further on (a black top of an image, left padding)
    image = torch.zeros(4, 64, 64)
    shifted = image.clone()
    shifted[:, -1, -1] = 1.0
    long_text = ["x" * 5000, "x" * 4999 + "y"]
    assert digest(image) != digest(shifted) and digest(long_text[:1]) != digest(long_text[1:])
    assert digest(list(range(100))) != digest(list(range(99)) + [7])
    assert 0 <= digest(batch) < 2 ** 48
    assert digest(torch.tensor(True)) != digest(torch.tensor(False))


def test_an_empty_batch_keeps_the_structure_or_is_not_made():
    """The partial batch a replica whose dataset ran out gets (TF's)."""
    import collections
    import dataclasses
    empty = input_lib._empty_like
    Pair = collections.namedtuple("Pair", "x y")
    got = empty([torch.ones(2, 3), ["a", "b"], None, {"ids": np.arange(2), "lang": "en"},
                 Pair(torch.ones(2), [1, 2])])
    assert got[0].shape == (0, 3) and got[1] == [] and got[2] is None
    assert got[3]["ids"].shape == (0,) and got[3]["lang"] == "en"
    assert isinstance(got[4], Pair) and got[4].x.shape == (0,) and got[4].y == []

    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
    packed = torch.nn.utils.rnn.pack_sequence([torch.ones(2), torch.ones(1)])
    for odd in (Batch(torch.ones(2)), packed, torch.ones(2, 2).to_sparse(),
                {"x": torch.ones(2), "extra": Batch(torch.ones(2))}):
        assert empty(odd) is None

def test_an_evaluation_dataloader_is_sharded_by_whole_batches():
    """Evaluation reads, in turn, the very batches of one process (its loss is
    a mean over batches): 10 rows in batches of 4 are [0-3], [4-7], [8, 9]."""
    data = torch.utils.data.TensorDataset(torch.arange(10.0))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    shards = [input_lib.shard(loader, 2, i, by_batch=True) for i in range(2)]
    assert [[b[0].tolist() for b in shard] for shard in shards] == [
        [[0.0, 1.0, 2.0, 3.0], [8.0, 9.0]], [[4.0, 5.0, 6.0, 7.0]]]
    assert [len(shard) for shard in shards] == [2, 1]
    assert all(input_lib.ordered_by_sampler(shard) for shard in shards)
    shuffled = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, drop_last=True)
    shards = [input_lib.shard(shuffled, 2, i, seed=7, by_batch=True) for i in range(2)]
    read = [[b[0].tolist() for b in shard] for shard in shards]
    assert [len(r) for r in read] == [1, 1]   # the short batch dropped, as one process drops it
    assert len(set(sum(sum(read, []), []))) == 8   # one order, agreed by the seed


def test_shard_policies(caplog):
    data = torch.utils.data.TensorDataset(torch.arange(10.0))
    loader = torch.utils.data.DataLoader(data, batch_size=2, drop_last=True)
    sharded = input_lib.shard(loader, 2, 1)
    assert isinstance(sharded.sampler, input_lib.ShardSampler) and sharded.drop_last
    assert [b[0].tolist() for b in sharded] == [[1.0, 3.0], [5.0, 7.0]]   # 9 dropped (last)
    with caplog.at_level(logging.WARNING):
        assert list(input_lib.shard([0, 1, 2, 3, 4], 2, 0)) == [0, 2, 4]
    assert "AutoShardPolicy.DATA" in caplog.text
    custom = torch.utils.data.DataLoader(data, batch_size=2,
                                         sampler=torch.utils.data.SubsetRandomSampler([0, 1]))
    assert not isinstance(input_lib.shard(custom, 2, 0), torch.utils.data.DataLoader)
    with pytest.raises(TypeError, match="must return an iterable"):
        list(input_lib.shard(5, 2, 0))
    assert input_lib.takes_input_context(lambda input_context: 0)
    assert not input_lib.takes_input_context(lambda params: 0)


def test_split_batches_split_every_leaf():
    batch = ({"x": np.arange(6).reshape(3, 2)}, torch.arange(3), "tag")
    parts = [input_lib._split(batch, 2, i) for i in range(2)]
    assert parts[0][0]["x"].tolist() == [[0, 1], [2, 3]] and parts[1][1].tolist() == [2]
    assert parts[1][2] == "tag"


with open(os.path.join(FIXTURES, "tf_distribute_split.json")) as _f:
    TF_SPLIT = json.load(_f)


@pytest.mark.parametrize("case", TF_SPLIT,
                         ids=lambda c: "R{replicas}-n{n}-b{batch_size}".format(**c))
def test_a_global_batch_is_split_as_tfs(case):
    """experimental_distribute_dataset's split of `range(n).batch(b)` over R
    replicas equals TF 2.15's (record_tf_distribute_split.py): ceil(size / R)
    rows a replica, in order, the last ones short or empty. torch's
    tensor_split gave a batch of 4 over 3 replicas [2, 1, 1] (TF: [2, 2, 0]):
    the replicas' losses, gradients and batch statistics were not TF's."""
    data = torch.arange(case["n"])
    got = [[input_lib._split(batch, case["replicas"], i).tolist()
            for i in range(case["replicas"])] for batch in data.split(case["batch_size"])]
    assert got == case["rows"]
