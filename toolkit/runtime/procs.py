"""Processes a run owns, found exactly: its process group AND its run id in the environment.

A run starts its job (the batch script, the validation agents) in a new session, so everything the job
starts shares one process group, and every process inherits TK_RUN_ID. Ownership is both together: a
process of another run, or a new process that happens to reuse a recycled group id, is never touched.
Nothing here matches command lines.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from toolkit.runtime.rundir import wait_until

RUN_ID_ENV = "TK_RUN_ID"


def start_group(argv: list[str], *, cwd: Path, env: dict, log_path: Path, run_id: str) -> subprocess.Popen:
    """Start argv as the leader of a new session and process group, with TK_RUN_ID set."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, cwd=cwd, env={**env, RUN_ID_ENV: run_id}, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) of pid, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
        return fields[0], int(fields[2])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    """pid exists and is not a zombie."""
    st = _stat(pid) if pid else None
    return st is not None and st[0] != "Z"


def _has_run_id(pid: int, run_id: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{RUN_ID_ENV}={run_id}".encode() in environ


def members(pgid: int | None, run_id: str) -> list[int]:
    """Live processes of process group pgid that carry this run id."""
    if not pgid:
        return []
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        st = _stat(pid)
        if st and st[1] == pgid and st[0] != "Z" and _has_run_id(pid, run_id):
            out.append(pid)
    return out


def signal_members(pgid: int | None, run_id: str, sig: int) -> list[int]:
    pids = members(pgid, run_id)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


def terminate(pgid: int | None, run_id: str, grace_s: float = 15.0, kill_wait_s: float = 5.0) -> list[int]:
    """SIGTERM the run's processes, SIGKILL what is left after grace_s; the pids that survived both."""
    if not signal_members(pgid, run_id, signal.SIGTERM):
        return []
    if wait_until(lambda: not members(pgid, run_id), grace_s):
        return []
    signal_members(pgid, run_id, signal.SIGKILL)
    wait_until(lambda: not members(pgid, run_id), kill_wait_s)
    return members(pgid, run_id)
