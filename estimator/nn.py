"""TF1's sampled losses over large output vocabularies (TF:
``tf.nn.sampled_softmax_loss``, ``tf.nn.nce_loss``) and the candidate
sampler they draw from (``tf.nn.log_uniform_candidate_sampler``).

Each loss takes the output layer's `weights` ``[num_classes, dim]`` (or a
list of its shards, as TF's partitioned variables, split by
`partition_strategy`) and `biases` ``[num_classes]``, the `labels`
``[batch, num_true]`` and the last hidden layer's `inputs` ``[batch, dim]``,
and returns one loss per example ``[batch]``, as TF's (reduce it yourself;
TF's programs take the mean). Their logits are the true and the sampled
classes' less the log of their expected counts (TF's ``subtract_log_q``).
TF's programs evaluate with the full softmax; so do these in EVAL: compute
``inputs @ weights.T + biases`` there.

The draw is torch's (the default generator, or `seed`'s), not TF's: with
`sampled_values` given, the losses equal TF's for the same candidates.

Under MirroredStrategy a module's parameters are averaged by its own call:
hold `weights` and `biases` in a module whose `forward` computes the loss::

    class SampledSoftmax(torch.nn.Module):
        def __init__(self, classes, dim):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(classes, dim) * dim ** -0.5)
            self.bias = torch.nn.Parameter(torch.zeros(classes))

        def forward(self, inputs, labels):
            return est.nn.sampled_softmax_loss(self.weight, self.bias, labels, inputs,
                                               num_sampled=64, num_classes=len(self.bias))
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["log_uniform_candidate_sampler", "nce_loss", "sampled_softmax_loss"]


def log_uniform_candidate_sampler(true_classes, num_true: int, num_sampled: int, unique: bool,
                                  range_max: int, seed: Optional[int] = None):
    """`num_sampled` classes drawn from Zipf's law over ``[0, range_max)``,
    P(k) = (log(k + 2) - log(k + 1)) / log(range_max + 1), without repeats
    where `unique` (TF: ``tf.nn.log_uniform_candidate_sampler``). Returns
    ``(sampled_candidates, true_expected_count, sampled_expected_count)``:
    the expected counts, of `true_classes` ``[batch, num_true]`` and of the
    candidates, are TF's, ``p * num_sampled`` or, where the unique draw took
    more tries than `num_sampled`, ``-expm1(tries * log1p(-p))``."""
    true_classes = torch.as_tensor(true_classes)
    if true_classes.dim() != 2 or true_classes.shape[1] != num_true:
        raise ValueError(f"true_classes must be [batch, num_true={num_true}], got "
                         f"{tuple(true_classes.shape)}")
    if unique and num_sampled > range_max:
        raise ValueError(f"num_sampled ({num_sampled}) must be at most range_max "
                         f"({range_max}) for a unique draw")
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    log_range = math.log(range_max + 1)

    def draw(n):
        u = torch.rand(n, dtype=torch.float64, generator=generator)
        return (torch.exp(u * log_range).long() - 1) % range_max   # (TF's mod of rounding)

    if unique:
        draws = torch.empty(0, dtype=torch.long)
        while True:   # chunks of draws until num_sampled distinct ones, in draw order
            draws = torch.cat([draws, draw(max(2 * num_sampled, 16) + len(draws))])
            _, first = np.unique(draws.numpy(), return_index=True)
            if len(first) >= num_sampled:
                firsts = np.sort(first)[:num_sampled]
                sampled, tries = draws[torch.from_numpy(firsts)], int(firsts[-1]) + 1
                break
    else:
        sampled, tries = draw(num_sampled), num_sampled

    def expected(classes):
        k = classes.to(torch.float64)
        p = (torch.log(k + 2) - torch.log(k + 1)) / log_range
        count = p * num_sampled if tries == num_sampled else -torch.expm1(
            tries * torch.log1p(-p))
        return count.float()

    device = true_classes.device
    return (sampled.to(device), expected(true_classes.cpu()).to(device),
            expected(sampled).to(device))


def sampled_softmax_loss(weights, biases, labels, inputs, num_sampled: int, num_classes: int,
                         num_true: int = 1, sampled_values=None,
                         remove_accidental_hits: bool = True, partition_strategy: str = "mod",
                         seed: Optional[int] = None) -> torch.Tensor:
    """The softmax cross entropy over the true and `num_sampled` sampled
    classes (TF1: ``tf.nn.sampled_softmax_loss``; TF 2's splits shards
    "div"): one loss per example, ``[batch]``. A sampled class equal to a
    label of its row is removed (`remove_accidental_hits`)."""
    logits, targets = _sampled_logits(weights, biases, labels, inputs, num_sampled, num_classes,
                                      num_true, sampled_values, remove_accidental_hits,
                                      partition_strategy, seed)
    return -(targets * F.log_softmax(logits, dim=1)).sum(1)


def nce_loss(weights, biases, labels, inputs, num_sampled: int, num_classes: int,
             num_true: int = 1, sampled_values=None, remove_accidental_hits: bool = False,
             partition_strategy: str = "mod", seed: Optional[int] = None) -> torch.Tensor:
    """Noise-contrastive estimation (TF1: ``tf.nn.nce_loss``): the logistic
    loss of telling each true class (target ``1 / num_true``) from the
    sampled ones (target 0), summed per example, ``[batch]``. Accidental
    hits are kept by default, as TF's."""
    logits, targets = _sampled_logits(weights, biases, labels, inputs, num_sampled, num_classes,
                                      num_true, sampled_values, remove_accidental_hits,
                                      partition_strategy, seed)
    return F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(1)


def _sampled_logits(weights, biases, labels, inputs, num_sampled, num_classes, num_true,
                    sampled_values, remove_accidental_hits, partition_strategy, seed):
    """TF's `_compute_sampled_logits`: ([batch, num_true + num_sampled]
    logits, their targets)."""
    inputs = torch.as_tensor(inputs)
    labels = torch.as_tensor(labels, device=inputs.device).long()
    if labels.dim() == 1 and num_true == 1:
        labels = labels.unsqueeze(1)
    if labels.dim() != 2 or labels.shape[1] != num_true or labels.shape[0] != inputs.shape[0]:
        raise ValueError(f"labels must be [batch={inputs.shape[0]}, num_true={num_true}], "
                         f"got {tuple(labels.shape)}")
    if sampled_values is None:
        sampled_values = log_uniform_candidate_sampler(labels, num_true, num_sampled, True,
                                                       num_classes, seed)
    sampled, true_expected, sampled_expected = (
        torch.as_tensor(v, device=inputs.device).detach() for v in sampled_values)
    sampled = sampled.long().reshape(-1)
    if sampled.numel() != num_sampled:
        raise ValueError(f"sampled_values hold {sampled.numel()} candidates where "
                         f"num_sampled is {num_sampled}")
    batch = labels.shape[0]
    rows = _lookup(weights, torch.cat([labels.reshape(-1), sampled]), num_classes,
                   partition_strategy)
    biases = torch.as_tensor(biases, device=inputs.device)
    true_w = rows[:batch * num_true].reshape(batch, num_true, -1)
    true_logits = (inputs.unsqueeze(1) * true_w).sum(-1) + biases[labels]
    sampled_logits = inputs @ rows[batch * num_true:].t() + biases[sampled]
    if remove_accidental_hits:   # (TF adds -FLT_MAX: the lowest value of the dtype, here)
        hits = (labels.unsqueeze(2) == sampled.view(1, 1, -1)).any(1)
        sampled_logits = sampled_logits.masked_fill(hits, torch.finfo(sampled_logits.dtype).min)
    true_logits = true_logits - torch.log(true_expected.to(true_logits.dtype)).reshape(
        batch, num_true)
    sampled_logits = sampled_logits - torch.log(sampled_expected.to(sampled_logits.dtype))
    logits = torch.cat([true_logits, sampled_logits], 1)
    targets = torch.cat([torch.full_like(true_logits, 1.0 / num_true),
                         torch.zeros_like(sampled_logits)], 1)
    return logits, targets


def _lookup(params: Union[torch.Tensor, Sequence[torch.Tensor]], ids: torch.Tensor,
            num_classes: int, partition_strategy: str) -> torch.Tensor:
    """Rows `ids` of `params`, one tensor or the shards of one (TF's
    ``embedding_lookup``: "mod" puts class i in shard i % n at row i // n,
    "div" splits the classes into n consecutive blocks, the first
    ``num_classes % n`` one row longer)."""
    if isinstance(params, torch.Tensor):
        return F.embedding(ids, params)
    shards = list(params)
    n = len(shards)
    if partition_strategy not in ("mod", "div"):
        raise ValueError(f"partition_strategy is 'mod' or 'div', got {partition_strategy!r}")
    if n == 1:
        return F.embedding(ids, shards[0])
    sizes = [s.shape[0] for s in shards]
    if sum(sizes) != num_classes:
        raise ValueError(f"the {n} shards of weights hold {sum(sizes)} rows where num_classes "
                         f"is {num_classes}")
    if partition_strategy == "mod":
        shard, row = ids % n, ids // n
    else:
        ends = torch.tensor(np.cumsum(sizes), device=ids.device)
        shard = torch.bucketize(ids, ends, right=True)
        row = ids - torch.cat([ends.new_zeros(1), ends])[shard]
    out = shards[0].new_zeros((ids.numel(), shards[0].shape[1]))
    for index, part in enumerate(shards):
        where = shard == index
        out = out.index_put((where.nonzero().reshape(-1),), F.embedding(row[where], part))
    return out
