"""``labfbo coordinator serve`` in a subprocess of its own, for tests that kill and restart it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def free_port() -> int:
    """An ephemeral port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_coordinator(config: Path, port: int, errors: Path) -> subprocess.Popen:
    """The coordinator of ``config`` serving on ``port`` (its stderr appended to ``errors``), once healthy."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "labfbo.cli", "coordinator", "serve", "--config", str(config), "--port", str(port)],
        env=ENV, stdout=subprocess.DEVNULL, stderr=open(errors, "a"))
    end = time.monotonic() + 120  # importing torch and BoTorch takes tens of seconds on a busy machine
    while time.monotonic() < end and proc.poll() is None:
        try:
            if requests.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code == 200:
                return proc
        except requests.ConnectionError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(errors.read_text()[-2000:])
