"""Sampled softmax, NCE and the sequence loss against TensorFlow: TF 2.15's
`tf.compat.v1.nn.sampled_softmax_loss` / `nce_loss` on the same candidates
(losses and gradients), its log-uniform sampler's expected counts, and
`sequence_loss` in every averaging (tensorflow-addons' copy of
tf.contrib.seq2seq's), recorded by
``tests/support/fixtures/record_tf_sampled_losses.py``; TF is not needed
here."""
import json
import math
import os

import numpy as np
import pytest
import torch

import estimator as est
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_sampled_losses.json"), encoding="utf-8") as _f:
    TF = json.load(_f)


def _close(ours, theirs, tol=2e-5):
    np.testing.assert_allclose(ours.detach().numpy(), np.asarray(theirs, dtype=np.float32),
                               rtol=tol, atol=tol)


@pytest.mark.parametrize("name", sorted(TF["cases"]))
def test_sampled_losses_and_gradients_are_tfs(name):
    case = TF["cases"][name]
    shards = [torch.tensor(s, requires_grad=True) for s in case["shards"]]
    biases = torch.tensor(TF["biases"], requires_grad=True)
    inputs = torch.tensor(TF["inputs"], requires_grad=True)
    fn = est.nn.sampled_softmax_loss if case["function"] == "softmax" else est.nn.nce_loss
    sampled_values = (torch.tensor(TF["sampled"]), torch.tensor(case["true_expected"]),
                      torch.tensor(TF["sampled_expected"]))
    loss = fn(shards if len(shards) > 1 else shards[0], biases, torch.tensor(case["labels"]),
              inputs, num_sampled=len(TF["sampled"]), num_classes=TF["num_classes"],
              num_true=case["num_true"], sampled_values=sampled_values,
              remove_accidental_hits=case["remove_accidental_hits"],
              partition_strategy=case["partition_strategy"])
    assert loss.shape == (len(case["labels"]),)
    _close(loss, case["loss"])
    loss.sum().backward()
    for shard, grad in zip(shards, case["grad_shards"]):
        _close(shard.grad, grad)
    _close(biases.grad, case["grad_biases"])
    _close(inputs.grad, case["grad_inputs"])


def _p(k, range_max):
    return (math.log(k + 2) - math.log(k + 1)) / math.log(range_max + 1)


@pytest.mark.parametrize("kind", ["unique", "not_unique"])
def test_the_samplers_expected_counts_are_tfs_formula(kind):
    """TF's counts for its own draw: p * num_sampled without repeats drawn,
    else -expm1(tries * log1p(-p)), tries (unseen) read back from one."""
    case = TF["sampler"][kind]
    n, range_max = case["num_sampled"], case["range_max"]
    counts = dict(zip(case["sampled"], case["sampled_expected"]))
    counts.update({c[0]: e[0] for c, e in zip(case["true"], case["true_expected"])})
    if kind == "unique":
        k = case["sampled"][0]
        tries = math.log1p(-counts[k]) / math.log1p(-_p(k, range_max))
        assert abs(tries - round(tries)) < 1e-3 and round(tries) > n
        tries = round(tries)
        for k, count in counts.items():
            assert count == pytest.approx(-math.expm1(tries * math.log1p(-_p(k, range_max))),
                                          rel=1e-5)
    else:
        for k, count in counts.items():
            assert count == pytest.approx(_p(k, range_max) * n, rel=1e-5)


def test_our_sampler_draws_zipf_and_counts_as_tf():
    true = torch.tensor([[0], [3], [19]])
    sampled, true_expected, sampled_expected = est.nn.log_uniform_candidate_sampler(
        true, 1, 6, True, 20, seed=3)
    assert len(set(sampled.tolist())) == 6 and 0 <= sampled.min() and sampled.max() < 20
    # the tries behind the counts are whole and at least num_sampled
    k = int(sampled[0])
    tries = math.log1p(-float(sampled_expected[0])) / math.log1p(-_p(k, 20))
    if tries > 6 + 1e-3:
        assert abs(tries - round(tries)) < 1e-2
        tries = round(tries)
    else:
        assert float(sampled_expected[0]) == pytest.approx(_p(k, 20) * 6, rel=1e-5)
        tries = 6
    for k, count in zip(true[:, 0].tolist(), true_expected[:, 0].tolist()):
        want = _p(k, 20) * 6 if tries == 6 else -math.expm1(tries * math.log1p(-_p(k, 20)))
        assert count == pytest.approx(want, rel=1e-5)
    # the same seed, the same draw
    again = est.nn.log_uniform_candidate_sampler(true, 1, 6, True, 20, seed=3)
    assert torch.equal(again[0], sampled)
    # with repeats: the frequencies are Zipf's
    draws = est.nn.log_uniform_candidate_sampler(true, 1, 200000, False, 20, seed=0)[0]
    frequencies = torch.bincount(draws, minlength=20).double() / 200000
    expected = torch.tensor([_p(k, 20) for k in range(20)], dtype=torch.float64)
    assert torch.allclose(frequencies, expected, atol=3e-3)
    assert frequencies.sum() == pytest.approx(1.0)


def test_sampled_softmax_trains_a_large_vocabulary_model_as_the_full_softmax_ranks():
    """Drawn here (no sampled_values): a model trained on the sampled loss
    ranks the true class first under the full softmax, as TF's programs
    evaluate it."""
    torch.manual_seed(0)
    classes, dim = 50, 8
    x = torch.randn(400, dim)
    target = torch.randn(dim, classes)
    y = (x @ target).argmax(1)
    weights = torch.nn.Parameter(torch.zeros(classes, dim))
    biases = torch.nn.Parameter(torch.zeros(classes))
    net = torch.nn.Linear(dim, dim)
    opt = torch.optim.Adam([weights, biases, *net.parameters()], lr=0.05)
    for _ in range(150):
        loss = est.nn.sampled_softmax_loss(weights, biases, y.unsqueeze(1), net(x), 10,
                                           classes).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    accuracy = ((net(x) @ weights.t() + biases).argmax(1) == y).float().mean()
    assert accuracy > 0.8


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_accidental_hits_are_removed_in_half_precision_too(dtype):
    """(TF's -FLT_MAX added to a hit's logit overflowed to -inf there, and its
    target 0 times its log-probability, -inf, made the row's loss NaN.)"""
    case = TF["cases"]["softmax"]
    sampled_values = (torch.tensor(TF["sampled"]), torch.tensor(case["true_expected"]),
                      torch.tensor(TF["sampled_expected"]))
    for fn in (est.nn.sampled_softmax_loss, est.nn.nce_loss):
        loss = fn(torch.tensor(TF["weights"], dtype=dtype), torch.tensor(TF["biases"], dtype=dtype),
                  torch.tensor(case["labels"]), torch.tensor(TF["inputs"], dtype=dtype),
                  len(TF["sampled"]), TF["num_classes"], sampled_values=sampled_values,
                  remove_accidental_hits=True)
        assert loss.dtype == dtype and torch.isfinite(loss).all()
        if fn is est.nn.sampled_softmax_loss:
            _close(loss.float(), case["loss"], tol=0.05)


def test_sampled_losses_say_what_is_wrong():
    w, b, x = torch.zeros(10, 4), torch.zeros(10), torch.zeros(3, 4)
    with pytest.raises(ValueError, match=r"labels must be \[batch=3, num_true=2\]"):
        est.nn.sampled_softmax_loss(w, b, torch.zeros(3, 1), x, 4, 10, num_true=2)
    with pytest.raises(ValueError, match="hold 3 candidates where num_sampled is 4"):
        est.nn.nce_loss(w, b, torch.zeros(3, 1), x, 4, 10,
                        sampled_values=(torch.tensor([1, 2, 3]), torch.ones(3, 1),
                                        torch.ones(3)))
    with pytest.raises(ValueError, match="shards of weights hold 8 rows where num_classes"):
        est.nn.sampled_softmax_loss([torch.zeros(4, 4), torch.zeros(4, 4)], b,
                                    torch.zeros(3, 1), x, 4, 10)
    with pytest.raises(ValueError, match="at most range_max"):
        est.nn.log_uniform_candidate_sampler(torch.zeros(3, 1), 1, 11, True, 10)


@pytest.mark.parametrize("name", sorted(TF["sequence"]["cases"]))
def test_sequence_loss_is_tfs(name):
    case = TF["sequence"]["cases"][name]
    logits = torch.tensor(TF["sequence"]["logits"], requires_grad=True)
    kwargs = {k: case[k] for k in ("average_across_timesteps", "average_across_batch",
                                   "sum_over_timesteps", "sum_over_batch")}
    targets = torch.tensor(TF["sequence"]["targets"])
    if "error" in case:
        with pytest.raises(ValueError, match=case["message"][:40]):
            est.losses.sequence_loss(logits, targets, torch.ones(2, 3), **kwargs)
        return
    loss = est.losses.sequence_loss(logits, targets, torch.tensor(case["weights"]), **kwargs)
    _close(loss, case["loss"])
    loss.sum().backward()
    _close(logits.grad, case["grad_logits"])


def test_sequence_loss_takes_a_loss_function_of_its_own():
    logits = torch.tensor(TF["sequence"]["logits"])
    targets = torch.tensor(TF["sequence"]["targets"])
    weights = torch.tensor(TF["sequence"]["cases"]["average_both"]["weights"])
    halved = est.losses.sequence_loss(
        logits, targets, weights,
        softmax_loss_function=lambda labels, logits: 0.5 * torch.nn.functional.cross_entropy(
            logits, labels, reduction="none"))
    assert float(halved) == pytest.approx(0.5 * TF["sequence"]["cases"]["average_both"]["loss"],
                                          rel=1e-5)
    with pytest.raises(ValueError, match=r"logits \[batch, time, classes\]"):
        est.losses.sequence_loss(logits[0], targets, weights)


class _SampledSoftmax(torch.nn.Module):
    """The output layer of the docs' sampled-softmax port."""

    def __init__(self, classes=30, dim=4):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(classes, dim))
        self.bias = torch.nn.Parameter(torch.zeros(classes))

    def forward(self, inputs, labels, sampled_values):
        return est.nn.sampled_softmax_loss(self.weight, self.bias, labels, inputs, 5,
                                           len(self.bias), sampled_values=sampled_values)


def _sampled_model_fn(features, labels, mode):
    body = est.get_module("body", lambda: torch.nn.Linear(3, 4))
    out = est.get_module("out", _SampledSoftmax)
    ids = (labels.reshape(-1).abs() * 7).long() % 30
    sampled_values = (torch.tensor([3, 7, 11, 0, 29]), torch.full((len(ids), 1), 0.3),
                      torch.full((5,), 0.2))
    loss = out(body(features["x"]), ids.unsqueeze(1), sampled_values).mean()
    return est.EstimatorSpec(mode, loss=loss,
                             train_op=est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1)))


@pytest.mark.slow
def test_the_sampled_softmax_module_on_two_replicas_trains_as_one_process(tmp_path):
    import distribute
    from replica_helpers import batches, concatenated
    data = batches(n=64, batch_size=8)
    strategy = distribute.MirroredStrategy(
        ["cpu:0", "cpu:1"], communication_options=distribute.CommunicationOptions(
            timeout_seconds=30))
    two = est.Estimator(_sampled_model_fn, config=est.RunConfig(
        model_dir=str(tmp_path / "two"), tf_random_seed=1, train_distribute=strategy))
    two.train(lambda: data, steps=4)
    one = est.Estimator(_sampled_model_fn, config=est.RunConfig(
        model_dir=str(tmp_path / "one"), tf_random_seed=1))
    one.train(lambda: concatenated(data, 2), steps=4)
    for name in ("body/weight", "out/weight", "out/bias"):
        np.testing.assert_allclose(two.get_variable_value(name), one.get_variable_value(name),
                                   atol=1e-6, err_msg=name)
    assert np.abs(one.get_variable_value("out/bias")).max() > 1e-3   # (it trained)
