"""TF1 variables in torch's layouts, where one TF variable is not one torch
parameter (dense and convolution kernels, which are, warm-start by name:
`est.WarmStartSettings`)."""
from __future__ import annotations

from typing import Dict

import numpy as np
import torch


def lstm_from_tf(kernel, bias, forget_bias: float = 1.0, layer: int = 0,
                 projection=None) -> Dict[str, torch.Tensor]:
    """A TF1 LSTM cell's variables as layer `layer` of a `torch.nn.LSTM`'s
    state dict (`weight_ih_l0`, `weight_hh_l0`, `bias_ih_l0`, `bias_hh_l0`).

    TF's `BasicLSTMCell` and `LSTMCell` (without peepholes or clipping)
    hold one `kernel` [input + units, 4 * units] over `concat([x, h])` and
    one `bias` [4 * units], gates in the order i, j, f, o, and add
    `forget_bias` (1.0 by default) to the forget gate in the cell; torch's
    LSTM holds the input and hidden weights apart, gates i, f, g, o, and two
    biases. So the forget bias is folded into `bias_ih` and `bias_hh` is
    zero: freeze it (`lstm.bias_hh_l0.requires_grad_(False)`) and training
    goes on as TF's, one bias per gate. A `MultiRNNCell`'s cells are the
    layers (`rnn/multi_rnn_cell/cell_<k>/basic_lstm_cell/kernel`)::

        state = {}
        for k in range(2):
            prefix = f"rnn/multi_rnn_cell/cell_{k}/basic_lstm_cell/"
            state.update(est.checkpoint.lstm_from_tf(
                est.checkpoint.load_variable(tf_dir, prefix + "kernel"),
                est.checkpoint.load_variable(tf_dir, prefix + "bias"), layer=k))
        lstm.load_state_dict(state)

    `LSTMCell(num_proj=p)`'s `projection/kernel` [units, p] is `projection`:
    its kernel's hidden rows are then p, and it is torch's
    `LSTM(..., proj_size=p)` (`weight_hr_l0`, the projection's transpose).

    Keras' `LSTM` needs none of this: its gates are torch's order, so
    `weight_ih = kernel.T`, `weight_hh = recurrent_kernel.T`, `bias_ih = bias`.
    """
    kernel, bias = _value(kernel), _value(bias)
    if not (kernel.is_floating_point() and bias.is_floating_point()):
        raise ValueError(f"lstm_from_tf: a kernel and a bias of floating point, got "
                         f"{kernel.dtype} and {bias.dtype}")
    if kernel.dim() != 2 or kernel.shape[1] % 4 or bias.shape != (kernel.shape[1],):
        raise ValueError(f"lstm_from_tf: expected a kernel [input + units, 4 * units] and a "
                         f"bias [4 * units], got {list(kernel.shape)} and {list(bias.shape)}")
    units = kernel.shape[1] // 4
    hidden = units
    if projection is not None:
        projection = _value(projection)
        if projection.dim() != 2 or projection.shape[0] != units or projection.shape[1] < 1 \
                or not projection.is_floating_point():
            raise ValueError(f"lstm_from_tf: expected a projection kernel [{units} units, "
                             f"num_proj] of floating point, got {list(projection.shape)} "
                             f"{projection.dtype}")
        hidden = projection.shape[1]
    if kernel.shape[0] <= hidden:
        raise ValueError(f"lstm_from_tf: a kernel of {kernel.shape[0]} rows has no input rows "
                         f"before its {hidden} hidden ones")
    order = torch.cat([torch.arange(units) + units * gate for gate in (0, 2, 1, 3)])   # i f j o
    weights = kernel[:, order].t().contiguous()
    folded = bias[order].clone()
    folded[units:2 * units] += forget_bias
    inputs = kernel.shape[0] - hidden
    state = {f"weight_ih_l{layer}": weights[:, :inputs].contiguous(),
             f"weight_hh_l{layer}": weights[:, inputs:].contiguous(),
             f"bias_ih_l{layer}": folded, f"bias_hh_l{layer}": torch.zeros_like(folded)}
    if projection is not None:
        state[f"weight_hr_l{layer}"] = projection.t().contiguous()
    return state


def _value(variable) -> torch.Tensor:
    """A variable's value (numpy, a list, a tensor or a Parameter) as a tensor."""
    return torch.as_tensor(variable.detach() if isinstance(variable, torch.Tensor)
                           else np.asarray(variable))
