"""Fixtures for integration tests: the real dev Slurm cluster (scripts/dev-slurm) and clean-up checks."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEV_SLURM = ROOT / "scripts" / "dev-slurm"
NODES = 4


@dataclass
class DevSlurm:
    """A running dev cluster: `env` goes into os.environ of anything that calls Slurm commands."""

    conf: str
    partition: str = "dev"
    nodes: int = NODES
    env: dict = field(default_factory=dict)

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env})

    def jobs(self) -> list[str]:
        out = self.run("squeue", "-h", "-o", "%i").stdout
        return out.split()


def _dev_slurm(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([str(DEV_SLURM), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def dev_slurm():
    """The 4-node dev cluster, brought up if needed. Taken down at the end only if this session started it."""
    was_running = _dev_slurm("status", timeout=30).returncode == 0
    up = _dev_slurm("up", "--nodes", str(NODES))
    if up.returncode != 0:
        pytest.fail(f"scripts/dev-slurm up failed:\n{up.stderr}")
    conf = _dev_slurm("env").stdout.strip().split("=", 1)[1].strip("'\"")
    cluster = DevSlurm(conf=conf, env={"SLURM_CONF": conf})
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    try:
        yield cluster
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        if not was_running and not os.environ.get("TK_KEEP_DEV_SLURM"):
            _dev_slurm("down", timeout=120)
