"""Helpers for the stand-in engine's specs: real `tk-standin-serve` processes on ports 19000-19499.

Every process runs in its own session (process group); a finalizer stops the group (TERM, then KILL), and an
atexit hook does the same for anything a crashed test left behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

PORT_RANGE = (19000, 19499)
MODEL = "tk/standin-tiny"
_handed_out: set[int] = set()
_live: list[Proc] = []


def free_port() -> int:
    """A port in 19000-19499 that nothing listens on and this session has not handed out."""
    lo, hi = PORT_RANGE
    for _ in range(500):
        port = random.randint(lo, hi)
        if port in _handed_out:
            continue
        try:
            with socket.socket() as s:
                s.bind(("0.0.0.0", port))
        except OSError:
            continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port in 19000-19499")


def worker_env(**extra) -> dict:
    env = {**os.environ, "UCX_TLS": "tcp,sm,self", "TK_STANDIN_TRTLLM_VERSION": "1.2"}
    env.pop("TK_STANDIN_FAULT", None)
    env.pop("TRTLLM_SERVE_ENABLE_MSGSPEC", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Proc:
    """One stand-in process (worker or proxy) with its log."""

    def __init__(self, name: str, args: list[str], log_dir: Path, env: dict | None = None, port: int | None = None):
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}" if port else None
        self.log_path = log_dir / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen([sys.executable, "-m", "toolkit.standin", *args], stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=env or worker_env(), start_new_session=True)
        _live.append(self)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_healthy(self, timeout_s: float = 60) -> Proc:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.popen.returncode}:\n{self.log()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name} not healthy after {timeout_s}s:\n{self.log()}")
            time.sleep(0.1)

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait(timeout=5)
        else:
            self.signal(signal.SIGKILL)  # anything the group left behind
        if self in _live:
            _live.remove(self)


@atexit.register
def _stop_leftovers() -> None:
    for p in _live:
        with contextlib.suppress(Exception):
            p.stop()


def run_standin(*args: str, env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    """`tk-standin-serve ARGS` to completion (for start-up failures)."""
    return subprocess.run([sys.executable, "-m", "toolkit.standin", *args], capture_output=True, text=True, check=False,
                          timeout=timeout, env=env or worker_env(), stdin=subprocess.DEVNULL)
