"""A TF1 Estimator's Keras LSTM and GRU warm-started into torch.nn.LSTM and
GRU, against TF 2.15's outputs from the same checkpoint
(tests/support/fixtures/record_tf_keras_rnn.py): the kernels transposed
(square ones too), a GRU's gates in torch's order and its two biases split."""
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_keras_rnn.json"), encoding="utf-8") as _f:
    TF = json.load(_f)
CKPT = os.path.join(FIXTURES, "tf_ckpt", "keras_rnn", "model.ckpt")


def _lstm():
    lstm = torch.nn.LSTM(8, 2, batch_first=True)
    with torch.no_grad():   # Keras' LSTM has one bias: torch's second at zero, frozen
        lstm.bias_hh_l0.zero_()
    lstm.bias_hh_l0.requires_grad_(False)
    return lstm


def model_fn(features, labels, mode):
    lstm = est.get_module("lstm", _lstm)
    gru = est.get_module("gru", lambda: torch.nn.GRU(6, 2, batch_first=True))
    predictions = {"lstm": lstm(features["x_lstm"])[0], "gru": gru(features["x_gru"])[0]}
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions=predictions)
    loss = sum(p.square().sum() for p in predictions.values())
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=0.0)))


MAP = {"lstm/weight_ih_l0": "lstm/lstm_cell/kernel",
       "lstm/weight_hh_l0": "lstm/lstm_cell/recurrent_kernel",
       "lstm/bias_ih_l0": "lstm/lstm_cell/bias",
       "gru/weight_ih_l0": "gru/gru_cell/kernel",
       "gru/weight_hh_l0": "gru/gru_cell/recurrent_kernel",
       "gru/bias_ih_l0": "gru/gru_cell/bias",
       "gru/bias_hh_l0": "gru/gru_cell/bias"}


def _features():
    return {"x_lstm": np.array(TF["x_lstm"], np.float32),
            "x_gru": np.array(TF["x_gru"], np.float32)}


def _predictions(model_dir, mapping):
    e = est.Estimator(model_fn, model_dir, warm_start_from=est.WarmStartSettings(
        CKPT, vars_to_warm_start=list(mapping), var_name_to_prev_var_name=mapping))
    e.train(lambda: [(_features(), None)], steps=1)
    return next(e.predict(lambda: [_features()], yield_single_examples=False))


def test_keras_lstm_and_gru_warm_start_as_tf_computes_them(tmp_path):
    """The LSTM's kernel [8, 8] (input 8 = 4 units x 2) was taken as it was,
    not transposed (only a shape mismatch turned a kernel): outputs off by
    0.33, without a word (Keras-layers port probe); the GRU's gates (Keras's
    z, r, h; torch's r, z, n) were not reordered (off by 0.35)."""
    ours = _predictions(str(tmp_path), MAP)
    for layer in ("lstm", "gru"):
        np.testing.assert_allclose(ours[layer], TF["outputs"][layer], atol=2e-6, err_msg=layer)


@pytest.mark.parametrize("mapping, match", [
    (dict(MAP, **{"gru/bias_ih_l0": "gru_v1/gru_cell/bias"}),
     r"'gru_v1/gru_cell/bias' is a GRU bias of one row, Keras's GRU with reset_after=False"),
    ({"lstm/bias_hh_l0": "lstm/lstm_cell/bias"},
     r"'lstm/lstm_cell/bias' is the recurrent layer's one bias: map it to bias_ih"),
])
def test_a_recurrent_bias_torch_cannot_take_is_refused(tmp_path, mapping, match):
    with pytest.raises(ValueError, match=match):
        _predictions(str(tmp_path), mapping)


class _Cells(torch.nn.Module):
    """torch.nn.LSTMCell / GRUCell stepped over time, as Keras' RNN(cell)."""

    def __init__(self, cell):
        super().__init__()
        self.cell = cell

    def forward(self, x):
        state, out = None, []
        for t in range(x.shape[1]):
            state = self.cell(x[:, t], state)
            out.append(state[0] if isinstance(state, tuple) else state)
        return torch.stack(out, 1)


class _LSTMCell(torch.nn.LSTMCell):
    """A subclass: its gates are still an LSTM's (the class name said not)."""


def _cells():
    lstm = _LSTMCell(8, 2)
    with torch.no_grad():
        lstm.bias_hh.zero_()
    lstm.bias_hh.requires_grad_(False)
    return lstm


def _projected():
    """TF1's LSTMCell(3, num_proj=2) but its projection, from lstm_from_tf."""
    tf_cell = "proj/rnn/lstm_cell/"
    state = est.checkpoint.lstm_from_tf(
        est.checkpoint.load_variable(CKPT, tf_cell + "kernel"),
        est.checkpoint.load_variable(CKPT, tf_cell + "bias"),
        projection=est.checkpoint.load_variable(CKPT, tf_cell + "projection/kernel"))
    lstm = torch.nn.LSTM(4, 3, batch_first=True, proj_size=2)
    lstm.load_state_dict({k: v for k, v in state.items() if k != "weight_hr_l0"}, strict=False)
    return lstm


def _cells_model_fn(features, labels, mode):
    lstm = est.get_module("lstm", lambda: _Cells(_cells()))
    gru = est.get_module("gru", lambda: _Cells(torch.nn.GRUCell(6, 2)))
    proj = est.get_module("proj", _projected)
    predictions = {"lstm_cell": lstm(features["x_lstm"]), "gru_cell": gru(features["x_gru"]),
                   "proj": proj(features["x_proj"])[0]}
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions=predictions)
    loss = sum(p.square().sum() for p in predictions.values())
    return est.EstimatorSpec(mode, loss=loss, train_op=est.get_optimizer(
        lambda p: torch.optim.SGD(p, lr=0.0)))


def test_keras_cells_and_a_tf1_projection_warm_start_as_tf_computes_them(tmp_path):
    """torch.nn.LSTMCell / GRUCell took a square Keras cell kernel as it was
    and a GRU cell's gates unordered (0.81, 0.63 off); an LSTM's projection
    kernel (TF1's LSTMCell(num_proj)) must still be transposed for
    `weight_hr_l0` (the attack on the recurrent layout: refused there)."""
    cell = "rnn_{}_cell/{}_cell/"
    mapping = {"lstm/cell/weight_ih": cell.format("lstm", "lstm") + "kernel",
               "lstm/cell/weight_hh": cell.format("lstm", "lstm") + "recurrent_kernel",
               "lstm/cell/bias_ih": cell.format("lstm", "lstm") + "bias",
               "gru/cell/weight_ih": cell.format("gru", "gru") + "kernel",
               "gru/cell/weight_hh": cell.format("gru", "gru") + "recurrent_kernel",
               "gru/cell/bias_ih": cell.format("gru", "gru") + "bias",
               "gru/cell/bias_hh": cell.format("gru", "gru") + "bias",
               "proj/weight_hr_l0": "proj/rnn/lstm_cell/projection/kernel"}
    features = dict(_features(), x_proj=np.array(TF["x_proj"], np.float32))
    e = est.Estimator(_cells_model_fn, str(tmp_path), warm_start_from=est.WarmStartSettings(
        CKPT, vars_to_warm_start=list(mapping), var_name_to_prev_var_name=mapping))
    e.train(lambda: [(features, None)], steps=1)
    ours = next(e.predict(lambda: [features], yield_single_examples=False))
    for name in ("lstm_cell", "gru_cell", "proj"):
        np.testing.assert_allclose(ours[name], TF["outputs"][name], atol=2e-6, err_msg=name)


def test_a_tf1_cells_bias_mapped_to_an_lstm_bias_is_refused(tmp_path):
    """TF1's LSTMCell bias [4 * units] fits torch's by shape: it was taken as
    it is (gates i, j, f, o, no forget bias; quickdraw port probe: 1.10 off
    lstm_from_tf's), where the same cell's kernel was refused."""
    mapping = {"proj/bias_ih_l0": "proj/rnn/lstm_cell/bias"}
    e = est.Estimator(_cells_model_fn, str(tmp_path), warm_start_from=est.WarmStartSettings(
        CKPT, vars_to_warm_start=list(mapping), var_name_to_prev_var_name=mapping))
    features = dict(_features(), x_proj=np.zeros((1, 2, 4), np.float32))
    with pytest.raises(ValueError, match=r"'proj/rnn/lstm_cell/bias' \(for 'proj/bias_ih_l0'\) "
                                         r"is a TF1 LSTM cell's bias.*lstm_from_tf"):
        e.train(lambda: [(features, None)], steps=1)
