"""Shared set-up for the whole suite.

Test folders mirror the packages (tests/estimator, tests/distribute,
tests/hooks); helper modules and fixture data live in tests/support, which is
put on sys.path here (with the repository root) so tests import helpers by
bare name: `from models import ...`, `from paths import ROOT`. Test folders
have no __init__.py, so test module basenames must stay unique across tests/.
"""
import os
import signal
import sys

import pytest

_TESTS = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(_TESTS), os.path.join(_TESTS, "support")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import tf_cluster  # noqa: E402  (tests/support)

# A shell without job control starts background commands (`bash .ci/run &`)
# with Ctrl-C ignored, and the processes the tests start would inherit that:
# the tests that send SIGINT would then wait for nothing. Ctrl-C is handled
# here as at a terminal, so the tasks start with its default action.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _no_tf_config(monkeypatch):
    """Tests start outside any cluster unless they set TF_CONFIG themselves."""
    monkeypatch.delenv("TF_CONFIG", raising=False)


@pytest.fixture
def free_ports():
    """`free_ports(n)`: n distinct ports free on 127.0.0.1 now."""
    return tf_cluster.free_ports


@pytest.fixture
def free_port():
    """One port free on 127.0.0.1 now."""
    return tf_cluster.free_ports(1)[0]


@pytest.fixture
def tf_config():
    """`tf_config(cluster, task_type, index=0, **extra) -> str`: TF_CONFIG JSON
    for one task (for a subprocess's environment)."""
    return tf_cluster.tf_config


@pytest.fixture
def set_tf_config(monkeypatch):
    """`set_tf_config(cluster, task_type, index=0, **extra)`: set TF_CONFIG in
    this process for this test (undone afterwards); returns the text."""
    def set_(cluster, task_type, index=0, **extra):
        text = tf_cluster.tf_config(cluster, task_type, index, **extra)
        monkeypatch.setenv("TF_CONFIG", text)
        return text
    return set_
