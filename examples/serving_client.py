"""What the serving examples share: `estimator serve` started on a free port
of this machine, and a TF Serving client's JSON POST (plain HTTP, as a client
of TF Serving's REST API would send it)."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(export_base: str, model_name: str, timeout: float = 60.0):
    """`estimator serve export_base` in a child process, once its status
    answers: yields (the model's URL, its status); the server ends with the block."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "estimator", "serve", export_base,
                               "--port", str(port), "--model_name", model_name], cwd=ROOT)
    url = f"http://127.0.0.1:{port}/v1/models/{model_name}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = json.loads(urllib.request.urlopen(url, timeout=2).read())
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("estimator serve did not start")
                time.sleep(0.2)
        yield url, status
    finally:
        server.terminate()
        server.wait(timeout=30)


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())
