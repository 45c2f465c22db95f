"""est.checkpoint.lstm_from_tf: TF1's LSTM cells (BasicLSTMCell, LSTMCell,
MultiRNNCell over dynamic_rnn, LSTMCell's num_proj) as torch.nn.LSTM, recorded from TF 2.15 by
tests/support/fixtures/record_tf_lstm.py: the same outputs and states, and
with bias_hh frozen the same SGD step."""
import json
import os

import numpy as np
import pytest
import torch

import estimator as est
from paths import FIXTURES

with open(os.path.join(FIXTURES, "tf_lstm.json"), encoding="utf-8") as _f:
    TF = json.load(_f)


def _state(variables, case):
    state = {}
    for layer in range(case["layers"]):
        prefix = next(n for n in variables if f"cell_{layer}/" in n or case["layers"] == 1)
        prefix = prefix.split("lstm_cell/", 1)[0] + "lstm_cell/"
        state.update(est.checkpoint.lstm_from_tf(
            np.array(variables[prefix + "kernel"]), variables[prefix + "bias"],
            case["forget_bias"], layer=layer, projection=variables.get(
                prefix + "projection/kernel")))
    return state


@pytest.mark.parametrize("name", sorted(TF["cases"]))
def test_a_tf_lstm_runs_and_trains_as_torchs_lstm(name):
    case = TF["cases"][name]
    lstm = torch.nn.LSTM(TF["input"], TF["units"], num_layers=case["layers"], batch_first=True,
                         proj_size=case.get("num_proj", 0))
    lstm.load_state_dict(_state(case["before"], case))
    for layer in range(case["layers"]):
        getattr(lstm, f"bias_hh_l{layer}").requires_grad_(False)
    outputs, (h, c) = lstm(torch.tensor(case["x"]))
    np.testing.assert_allclose(outputs.detach().numpy(), case["outputs"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h[-1].detach().numpy(), case["h"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c[-1].detach().numpy(), case["c"], rtol=1e-5, atol=1e-6)
    optimizer = torch.optim.SGD([p for p in lstm.parameters() if p.requires_grad], lr=0.1)
    (outputs ** 2).sum().backward()
    optimizer.step()
    after = _state(case["after"], case)
    for key, value in lstm.state_dict().items():
        np.testing.assert_allclose(value.numpy(), after[key].numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=key)


def test_wrong_shapes_are_said():
    with pytest.raises(ValueError, match=r"expected a kernel \[input \+ units, 4 \* units\] "
                                         r"and a bias \[4 \* units\], got \[7, 12\] and \[8\]"):
        est.checkpoint.lstm_from_tf(np.zeros((7, 12)), np.zeros(8))
    with pytest.raises(ValueError, match="a kernel of 3 rows has no input rows"):
        est.checkpoint.lstm_from_tf(np.zeros((3, 12)), np.zeros(12))
    with pytest.raises(ValueError, match="of floating point, got torch.int64"):
        est.checkpoint.lstm_from_tf(np.zeros((7, 12), np.int64), np.zeros(12))
    with pytest.raises(ValueError, match=r"expected a projection kernel \[3 units, num_proj\] "
                                         r"of floating point, got \[2, 3\]"):
        est.checkpoint.lstm_from_tf(np.zeros((6, 12)), np.zeros(12), projection=np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"got \[3, 0\]"):
        est.checkpoint.lstm_from_tf(np.zeros((6, 12)), np.zeros(12), projection=np.zeros((3, 0)))
    with pytest.raises(ValueError, match="a kernel of 2 rows has no input rows before its 2"):
        est.checkpoint.lstm_from_tf(np.zeros((2, 12)), np.zeros(12), projection=np.zeros((3, 2)))


def test_parameters_are_taken_as_values():
    kernel = torch.nn.Parameter(torch.ones(7, 12))
    state = est.checkpoint.lstm_from_tf(kernel, torch.nn.Parameter(torch.zeros(12)))
    assert state["weight_ih_l0"].shape == (12, 4) and not state["weight_ih_l0"].requires_grad
