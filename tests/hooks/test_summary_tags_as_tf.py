"""The tags and values of the summaries a model_fn makes, against TF 2.15's
recording (tests/support/fixtures/record_tf_summary_tags.py): a `loss`
summary of the model_fn's own replaces the Estimator's (one series, not two
under one tag), a tag used twice in one model_fn call is made unique (`dup`,
`dup_1`; again from `dup` on the next step), and image tags follow
`max_outputs`, not how many images the batch has."""
import json
import os

import pytest
import torch

import estimator as est
from paths import FIXTURES
from run_outline import summaries_outline

with open(os.path.join(FIXTURES, "tf_summary_tags.json"), encoding="utf-8") as _f:
    TF = json.load(_f)["cases"]


def _images(batch, max_outputs):
    return lambda loss: est.summary.image("img", torch.zeros(batch, 2, 2, 3),
                                          max_outputs=max_outputs)


def _unique(loss):
    est.summary.scalar("dup", 1.0)
    est.summary.scalar("dup", 2.0)
    est.summary.histogram("dup_1_hist", torch.ones(2))
    est.summary.scalar("x_1", 5.0)
    est.summary.scalar("x", 3.0)
    est.summary.scalar("x", 4.0)
    est.summary.image("img", torch.zeros(1, 2, 2, 1))
    est.summary.image("img", torch.zeros(1, 2, 2, 1))


def _identity_names(loss):
    est.named_tensor("cross_entropy", loss)
    est.summary.scalar("cross_entropy", loss)
    est.summary.scalar("learning_rate", 0.1)
    est.named_tensor("learning_rate", 0.1)
    est.named_tensor("Xent", loss)
    est.summary.scalar("xent", loss)
    est.summary.scalar("Dup", loss)
    est.summary.scalar("dup", loss)
    est.named_tensor("a/b", loss)
    est.summary.scalar("a", loss)


OWN = []   # a case's own SummarySaverHook's directory: "own" in the model_dir
CASES = {   # as the recorder's
    "identity_names": _identity_names,
    "own_loss": lambda loss: est.summary.scalar("loss", loss * 2),
    "other_scalar": lambda loss: est.summary.scalar("other", 1.0),
    "unique": _unique,
    "images_3_of_1": _images(1, 3),
    "images_3_of_2": _images(2, 3),
    "images_1_of_1": _images(1, 1),
    "images_1_of_4": _images(4, 1),
    "own_hook_merge_all": lambda loss: [est.SummarySaverHook(   # in "own"
        save_steps=2, output_dir=OWN[0],
        summary_op=(est.summary.scalar("other", loss), est.summary.merge_all())[1])],
}


def _zeroed(module):
    with torch.no_grad():
        for p in module.parameters():
            p.zero_()
    return module


def _run(record, model_dir):
    """The recorder's model: loss exactly 9.0 at every step."""
    OWN[:] = [os.path.join(model_dir, "own")]
    def model_fn(features, labels, mode):
        net = est.get_module("dense", lambda: _zeroed(torch.nn.Linear(1, 1)))
        loss = torch.nn.functional.mse_loss(net(features), labels)
        hooks = record(loss)
        hooks = hooks if isinstance(hooks, list) else None   # (a case's own hook)
        return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
            lambda p: torch.optim.SGD(p, lr=0.0)), training_hooks=hooks)

    def input_fn():
        return [(torch.ones(1, 1), torch.full((1, 1), 3.0))] * 3
    e = est.Estimator(model_fn, config=est.RunConfig(model_dir=model_dir, save_summary_steps=2))
    e.train(input_fn, steps=3)
    if os.path.isdir(OWN[0]):
        return {"estimator": summaries_outline(model_dir), "own": summaries_outline(OWN[0])}
    return summaries_outline(model_dir)


def test_the_cases_are_the_recorders():
    assert sorted(CASES) == sorted(TF)


@pytest.mark.parametrize("case", sorted(CASES))
def test_summary_tags_and_values_are_tfs(tmp_path, case):
    assert _run(CASES[case], str(tmp_path)) == TF[case]


with open(os.path.join(FIXTURES, "tf_summary_names.json"), encoding="utf-8") as _f:
    TF_NAMES = json.load(_f)["tags"]


def test_a_name_a_tag_may_not_hold_is_cleaned_as_tf1_does(tmp_path):
    """cifar10's `scalar("cross_entropy (raw)", ...)`: TF1 writes the tag
    `cross_entropy__raw_` (tests/support/fixtures/record_tf_summary_names.py);
    the name was written as given, so TensorBoard filters and tools reading
    TF's tags did not find it."""
    def record(loss):
        for name in TF_NAMES:
            est.summary.scalar(name, 1.0)
    tags = set(_run(record, str(tmp_path))["scalars"])
    assert set(TF_NAMES.values()) <= tags
    assert not set(TF_NAMES) - set(TF_NAMES.values()) & tags


def test_a_tensor_named_loss_leaves_the_models_loss_summary_the_loss_curve(tmp_path):
    """The attack on the named-tensor uniquing: a tensor named "loss" made
    the model_fn's "loss" summary `loss_1`, and the Estimator wrote its own
    `loss` beside it (TF writes `loss_1` and `loss_2`): the loss curve
    switched values without a word. "loss" is left out of the uniquing."""
    for named in ("loss", "Loss"):   # (names compared without case)
        def record(loss):
            est.named_tensor(named, loss)
            est.summary.scalar("loss", loss + 100.0)
        scalars = _run(record, str(tmp_path / named))["scalars"]
        assert list(scalars) == ["loss"] and scalars["loss"][0][1] == pytest.approx(109.0)
