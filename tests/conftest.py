import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))


@pytest.fixture(autouse=True)
def _no_tf_config(monkeypatch):
    """Tests start outside any cluster unless they set TF_CONFIG themselves."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
