"""`RNNClassifier` and `RNNEstimator` (TF: ``tf.estimator.experimental.RNNClassifier``
/ ``RNNEstimator``, TF2's successors of TF1 contrib's ``tf.contrib.estimator.RNN*``).

The network is TF's ``RNNModel``, with its variables under TF's names:

    sequence_features/<column>/embedding_weights    the sequence columns
                                                    (`sequence_input_layer`)
    dense_features/<column>/...                     the context columns, appended to
                                                    every step (`concatenate_context_input`)
    rnn_model/rnn/<cell>/kernel [in, g * units],    one Keras cell ("simple_rnn_cell",
        recurrent_kernel [units, g * units], bias   "lstm_cell", "gru_cell") over the steps
    rnn_model/rnn/stacked_rnn_cells/<cell>_<i>/...  (several `units`: cell, cell_1, ...)
    rnn_model/logits/kernel [units, n], bias        on the last cell's final output (at
                                                    every step: `return_sequences=True`)

The cells compute as Keras' (run by torch's RNN, LSTM and GRU with these variables
in torch's layout): "simple_rnn" ``tanh(x K + h R + b)``; "lstm" gates
i, f, c, o (sigmoid, tanh), the forget gate's bias starting at 1; "gru" gates z,
r, h with the reset applied after the recurrent product (``reset_after``: bias
[2, 3 * units], input and recurrent). Kernels start Glorot uniform, recurrent
kernels orthogonal, biases zero. A step past an example's length keeps the
state (Keras' masking): the output is each example's state at its last step
(zeros for an empty sequence). Summaries: TF's ``loss`` and the
``rnn_model/sequence_input_layer/sequence_length`` histogram.

Default optimizer: ``'Adagrad'`` at 0.05 (accumulators from 0.1, epsilon 1e-7:
Keras' legacy Adagrad) with each gradient clipped to norm 5.0, TF2's; another
name is Keras' legacy optimizer at 0.05 (`_clipped`), clipped alike; a
factory is used as it is (TF: an instance, unclipped). TF1 contrib clipped
by the global norm, and its cells were TF1's: a GRU resetting before the
product, an LSTM adding its forget bias at run time.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from hooks import model_scope, summary

from .. import feature_column
from ..losses import Reduction
from ..optimizers import Adam, RMSProp, optimizer_factory
from ._base import (CannedEstimator, check_optimizer_spec, column_tuple, features_cache,
                    make_optimizer)
from .dnn import Dense
from .heads import BinaryClassHead, MultiClassHead
from .sequential_head import SequentialHeadWrapper

LEARNING_RATE = 0.05
CLIP_NORM = 5.0
CELL_TYPES = {"simple_rnn": 1, "lstm": 4, "gru": 3}   # cell type: its gates


_TORCH_RNN = {"simple_rnn": torch.nn.RNN, "lstm": torch.nn.LSTM, "gru": torch.nn.GRU}


class KerasCell(torch.nn.Module):
    """One Keras RNN cell's variables (``kernel``, ``recurrent_kernel``,
    ``bias``), run over the steps by torch's RNN with them in its layout
    (Keras' GRU gates z, r, h are torch's r, z, n)."""

    def __init__(self, cell_type: str, in_features: int, units: int):
        super().__init__()
        gates = CELL_TYPES[cell_type]
        self.cell_type, self.units = cell_type, units
        limit = math.sqrt(6.0 / (in_features + gates * units))
        self.kernel = torch.nn.Parameter(
            torch.empty(in_features, gates * units).uniform_(-limit, limit))
        self.recurrent_kernel = torch.nn.Parameter(
            torch.nn.init.orthogonal_(torch.empty(units, gates * units)))
        bias = torch.zeros((2, 3 * units) if cell_type == "gru" else (gates * units,))
        if cell_type == "lstm":
            bias[units:2 * units] = 1.0   # (unit_forget_bias)
        self.bias = torch.nn.Parameter(bias)
        # torch's RNN, run with this cell's variables (not a parameter of its own)
        self.__dict__["_runner"] = _TORCH_RNN[cell_type](in_features, units, batch_first=True)

    def _torch_weights(self) -> dict:
        def rows(matrix):   # [in, gates * units] -> torch's [gates * units, in]
            if self.cell_type != "gru":
                return matrix.t()
            z, r, h = matrix.chunk(3, -1)
            return torch.cat([r, z, h], -1).t()

        def vector(values):
            if self.cell_type != "gru":
                return values
            z, r, h = values.chunk(3)
            return torch.cat([r, z, h])
        if self.cell_type == "gru":
            bias_ih, bias_hh = vector(self.bias[0]), vector(self.bias[1])
        else:
            bias_ih, bias_hh = self.bias, torch.zeros_like(self.bias)
        return {"weight_ih_l0": rows(self.kernel), "weight_hh_l0": rows(self.recurrent_kernel),
                "bias_ih_l0": bias_ih, "bias_hh_l0": bias_hh}

    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor) -> tuple:
        """(outputs [batch, T, units], final [batch, units]) of `inputs` [batch,
        T, in]: `final` each example's output at its last step (Keras' masking
        keeps the state past it; zeros for none)."""
        batch, steps = inputs.shape[0], inputs.shape[1]
        if steps == 0:   # (no step: zeros, the variables and inputs still in the graph,
            # as DDP needs a gradient for each on every replica)
            zero = sum(p.sum() for p in self.parameters()) * 0.0 + inputs.sum() * 0.0
            return (inputs.new_zeros(batch, 0, self.units) + zero,
                    inputs.new_zeros(batch, self.units) + zero)
        runner = self.__dict__["_runner"]
        outputs = torch.func.functional_call(runner, self._torch_weights(), (inputs,))[0]
        last = (lengths - 1).clamp(min=0).view(-1, 1, 1).expand(-1, 1, self.units)
        final = outputs.gather(1, last).squeeze(1)
        return outputs, torch.where((lengths > 0).unsqueeze(1), final, 0.0)


def _clip_each_gradient(optimizer, *_):
    """Keras' ``clipnorm``: each gradient scaled to norm `CLIP_NORM` at most
    (TF's ``clip_by_norm``: ``g * clip / max(norm(g), clip)``)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                p.grad.mul_(CLIP_NORM / torch.clamp(torch.linalg.vector_norm(p.grad),
                                                    min=CLIP_NORM))


class _KerasRMSProp(RMSProp):
    """Keras' legacy RMSprop (no momentum): ``rms = rho * rms + (1 - rho) *
    g^2`` from zeros, ``w -= lr * g / (sqrt(rms) + epsilon)`` (TF1's: rms from
    ones, epsilon inside the root); TF1's sparse apply of a looked-up table's
    rows."""

    def _init_state(self, group: dict, w: torch.Tensor, state: dict) -> None:
        super()._init_state(group, w, state)
        state["rms"].zero_()

    def _update(self, group: dict, w: torch.Tensor, g: torch.Tensor, state: dict) -> None:
        if not state:
            self._init_state(group, w, state)
        rho = torch.tensor(group["decay"], dtype=w.dtype)   # (TF's float32 arithmetic)
        rms = state["rms"]
        rms.mul_(rho).add_(g * g * (1 - rho))
        w.sub_(g * group["lr"] / (rms.sqrt() + group["epsilon"]))


_KERAS_OPTIMIZERS = {   # TF2 builds an optimizer= name as Keras' legacy optimizer
    "Adagrad": lambda params: torch.optim.Adagrad(   # acc += g^2; w -= lr g / (sqrt(acc) + eps)
        params, lr=LEARNING_RATE, initial_accumulator_value=0.1, eps=1e-7),
    "Adam": lambda params: Adam(params, learning_rate=LEARNING_RATE, epsilon=1e-7),
    "RMSProp": lambda params: _KerasRMSProp(params, learning_rate=LEARNING_RATE, epsilon=1e-7),
}


def _clipped(name: str):
    """The optimizer factory of an `optimizer=` name, TF2's: Keras' legacy
    optimizer at 0.05 (its defaults: Adagrad's epsilon 1e-7, Adam's 1e-7,
    RMSprop's `_KerasRMSProp`; SGD and Ftrl as TF1's),
    each gradient clipped to norm 5.0 first."""
    build = _KERAS_OPTIMIZERS.get(name) or optimizer_factory(name, LEARNING_RATE)

    def factory(params):
        optimizer = build(params)
        optimizer.register_step_pre_hook(_clip_each_gradient)
        return optimizer
    return factory


class RNNEstimator(CannedEstimator):
    """An RNN over sequence columns under a given head (TF:
    ``tf.estimator.experimental.RNNEstimator``; TF1 contrib's ``num_units`` is
    `units`). `rnn_cell_fn` (a Keras cell) is not taken: give `units` and
    `cell_type`. `return_sequences=True`: logits at every step ([batch, T,
    n]; at the steps past a sequence's end its last step's, as Keras' masked
    RNN) for a `SequentialHeadWrapper` head, with the sequence mask in the
    features under the head's key unless input_fn gave it. `warm_start_from`
    (TF's RNN estimators take none) is `Estimator`'s."""

    def __init__(self, head, sequence_feature_columns, context_feature_columns=None,
                 units: Optional[Sequence[int]] = None, cell_type: str = "simple_rnn",
                 rnn_cell_fn=None, return_sequences: bool = False, model_dir=None,
                 optimizer="Adagrad", config=None, *, num_units=None, warm_start_from=None):
        if num_units is not None:
            if units is not None:
                raise ValueError("give units or num_units (TF1 contrib's name), not both")
            units = num_units
        if rnn_cell_fn is not None:
            raise NotImplementedError(
                "rnn_cell_fn (a function returning a Keras cell) is not taken here: give "
                "units=[...] and cell_type='simple_rnn' | 'lstm' | 'gru', or write a model_fn "
                "(est.feature_column.sequence_input_layer, a torch RNN, a head)")
        if return_sequences and not isinstance(head, SequentialHeadWrapper):
            raise ValueError("Provided head must be a `_SequentialHead` object when "
                             "`return_sequences` is set to True (est.SequentialHeadWrapper"
                             "(head, sequence_length_mask='sequence_mask')).")
        if isinstance(head, SequentialHeadWrapper) and not return_sequences:
            raise ValueError("a SequentialHeadWrapper head takes logits at every step: give "
                             "return_sequences=True")
        if cell_type not in CELL_TYPES:
            raise ValueError(f"Unsupported cell_type {cell_type!r}: one of "
                             f"{sorted(CELL_TYPES)}")
        if units is None:
            raise ValueError("units must be given (the cells' sizes, e.g. units=[32]; TF's "
                             "alternative, rnn_cell_fn, is not taken here)")
        units = [units] if isinstance(units, int) else list(units)
        if not units or not all(isinstance(u, int) and not isinstance(u, bool) and u > 0
                                for u in units):
            raise ValueError(f"units must be a positive int or a non-empty list of them, got "
                             f"{units!r}")
        self._sequence_columns = column_tuple(sequence_feature_columns,
                                              "sequence_feature_columns")
        if not self._sequence_columns:
            raise ValueError("sequence_feature_columns must not be empty.")
        self._context_columns = column_tuple(context_feature_columns,
                                             "context_feature_columns")
        check_optimizer_spec(optimizer)
        self._units, self._cell_type, self._optimizer = tuple(units), cell_type, optimizer
        self._return_sequences = return_sequences
        super().__init__(head, model_dir, config, warm_start_from)

    def _canned_model_fn(self, features, labels, mode):
        if not self._return_sequences:
            return super()._canned_model_fn(features, labels, mode)
        cache = features_cache(features)
        logits, mask = self._sequence_logits(cache)
        key = self._head.input_sequence_mask_key
        if key not in cache.features:   # (TF: the one input_fn gave, else the model's)
            features = {**cache.features, key: mask}
        return self._head.create_estimator_spec(features, mode, logits, labels,
                                                train_op_fn=self._train_op_fn)

    def _logits(self, features, mode):
        return self._dense(self._rnn(features)[1])

    def _sequence_logits(self, features) -> tuple:
        """(logits [batch, T, n], mask [batch, T]): at steps past a sequence's
        end its last step's outputs (zeros for none), as Keras' masked RNN
        with return_sequences."""
        outputs, _, lengths = self._rnn(features)
        steps = outputs.shape[1]
        positions = torch.arange(steps, device=outputs.device)
        mask = positions < lengths.unsqueeze(1)
        last = torch.minimum(positions, (lengths - 1).clamp(min=0).unsqueeze(1))
        outputs = outputs.gather(1, last.unsqueeze(-1).expand(-1, -1, outputs.shape[-1]))
        outputs = torch.where((lengths > 0).view(-1, 1, 1), outputs, 0.0)
        batch, units = outputs.shape[0], outputs.shape[-1]
        logits = self._dense(outputs.reshape(batch * steps, units))
        return logits.reshape(batch, steps, self._head.logits_dimension), mask

    def _dense(self, net):
        layer = model_scope.get_module("rnn_model/logits", lambda: Dense(
            self._units[-1], self._head.logits_dimension))
        return layer(net)

    def _rnn(self, features) -> tuple:
        """(outputs [batch, T, units], final [batch, units], lengths [batch])
        of the stacked cells."""
        net, lengths = feature_column.sequence_input_layer(
            features, self._sequence_columns, name="sequence_features")
        if summary.should_record_summaries():
            summary.histogram("rnn_model/sequence_input_layer/sequence_length", lengths)
        if self._context_columns:
            context = feature_column.input_layer(features, self._context_columns,
                                                 name="dense_features")
            net = feature_column.concatenate_context_input(context, net)
        lengths = lengths.to(net.device)
        cell = f"{self._cell_type}_cell"
        final = None
        for i, units in enumerate(self._units):
            name = (f"rnn_model/rnn/{cell}" if len(self._units) == 1 else
                    f"rnn_model/rnn/stacked_rnn_cells/{cell}" + (f"_{i}" if i else ""))
            layer = model_scope.get_module(name, lambda n=net.shape[-1], u=units: KerasCell(
                self._cell_type, n, u))
            net, final = layer(net, lengths)
        return net, final, lengths

    def _train_op_fn(self, loss):
        return make_optimizer(_clipped(self._optimizer) if isinstance(self._optimizer, str)
                              else self._optimizer, LEARNING_RATE)


class RNNClassifier(RNNEstimator):
    """An RNN classifier over sequence columns (TF:
    ``tf.estimator.experimental.RNNClassifier``, same arguments and defaults;
    TF1: ``tf.contrib.estimator.RNNClassifier``, whose ``num_units`` is `units`).
    Its head is TF2's `BinaryClassHead` (2 classes) or `MultiClassHead`;
    `return_sequences=True`: a label at each step, the head wrapped in a
    `SequentialHeadWrapper` (the mask under the key `sequence_mask`, the
    `weight_column` a weight at each step)."""

    def __init__(self, sequence_feature_columns, context_feature_columns=None,
                 units: Optional[Sequence[int]] = None, cell_type: str = "simple_rnn",
                 rnn_cell_fn=None, return_sequences: bool = False, model_dir=None,
                 n_classes: int = 2, weight_column=None, label_vocabulary=None,
                 optimizer="Adagrad", loss_reduction=Reduction.SUM_OVER_BATCH_SIZE,
                 sequence_mask: str = "sequence_mask", config=None, *, num_units=None,
                 warm_start_from=None):
        if n_classes == 2:
            head = BinaryClassHead(weight_column=weight_column,
                                   label_vocabulary=label_vocabulary,
                                   loss_reduction=loss_reduction)
        else:
            head = MultiClassHead(n_classes, weight_column=weight_column,
                                  label_vocabulary=label_vocabulary,
                                  loss_reduction=loss_reduction)
        if return_sequences:   # (TF: the weight column's key the wrapper flattens)
            key = getattr(weight_column, "key", weight_column)
            head = SequentialHeadWrapper(head, sequence_length_mask=sequence_mask,
                                         feature_columns=key)
        super().__init__(head, sequence_feature_columns, context_feature_columns, units,
                         cell_type, rnn_cell_fn, return_sequences, model_dir, optimizer,
                         config, num_units=num_units, warm_start_from=warm_start_from)
