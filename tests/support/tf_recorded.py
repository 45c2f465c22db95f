"""Comparisons of what a canned model here gives with what TF recorded
(tests/support/fixtures/record_tf_*.py): evaluations, predictions and
variables, to TF's float32 precision."""
import numpy as np
import pytest


def assert_evaluation_is_tfs(got: dict, recorded: dict) -> None:
    """The same keys as TF's evaluation and the same values (the global step
    aside: the tests start from TF's checkpoint, not its step)."""
    expected = {k: v for k, v in recorded.items() if k != "global_step"}
    assert set(got) - {"global_step"} == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def assert_predictions_are_tfs(predictions: list, recorded: list) -> None:
    """Each prediction's keys and values as TF's (strings read back as bytes; a
    MultiHead's keys (head, key) recorded as "head/key")."""
    assert len(predictions) == len(recorded)
    for ours, theirs in zip(predictions, recorded):
        ours = {"/".join(k) if isinstance(k, tuple) else k: v for k, v in ours.items()}
        assert set(ours) == set(theirs)
        for key, value in theirs.items():
            mine = np.asarray(ours[key])
            if mine.dtype.kind in "SUO":
                assert [v.decode() if isinstance(v, bytes) else v
                        for v in mine.reshape(-1).tolist()] == value, key
            else:
                np.testing.assert_allclose(mine, np.asarray(value), rtol=1e-5, atol=1e-6,
                                           err_msg=key)


def assert_variables_are_tfs(estimator, recorded: dict) -> None:
    for variable, value in recorded.items():
        np.testing.assert_allclose(estimator.get_variable_value(variable), value,
                                   rtol=1e-5, atol=1e-6, err_msg=variable)
