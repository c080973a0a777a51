"""Processes a run owns, found exactly: its session AND its run id in the environment.

A run starts its job (the batch script, the validation agents) as the leader of a new session; everything
the job starts stays in that session (a child may move to another process group, as GNU `timeout` moves
its command, but not out of the session unless it calls setsid), and every process inherits TK_RUN_ID.
Ownership is both together: a process of another run, or a new process that happens to reuse a recycled
session id, is never touched. Nothing here matches command lines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from toolkit.runtime import files
from toolkit.runtime.rundir import wait_until

RUN_ID_ENV = "TK_RUN_ID"


def start_group(argv: list[str], *, cwd: Path, env: dict, log_path: Path, run_id: str) -> subprocess.Popen:
    """Start argv as the leader of a new session (its pid is the session id), with TK_RUN_ID set."""
    with files.open_append(log_path) as log:
        return subprocess.Popen(argv, cwd=cwd, env={**env, RUN_ID_ENV: run_id}, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, session id) of pid, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
        return fields[0], int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    """pid exists and is not a zombie."""
    st = _stat(pid) if pid else None
    return st is not None and st[0] != "Z"


def leads_session(pid: int | None) -> bool:
    """pid is alive, not a zombie, and the leader of its own session (as a local job's batch script is)."""
    st = _stat(pid) if pid else None
    return st is not None and st[0] != "Z" and st[1] == pid


def _has_run_id(pid: int, run_id: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{RUN_ID_ENV}={run_id}".encode() in environ


def members(session: int | None, run_id: str) -> list[int]:
    """Live processes of the session led by pid `session` that carry this run id."""
    if not session:
        return []
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        st = _stat(pid)
        if st and st[1] == session and st[0] != "Z" and _has_run_id(pid, run_id):
            out.append(pid)
    return out


def signal_members(session: int | None, run_id: str, sig: int) -> list[int]:
    pids = members(session, run_id)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


def terminate(session: int | None, run_id: str, grace_s: float = 15.0, kill_wait_s: float = 5.0) -> list[int]:
    """SIGTERM the run's processes, SIGKILL what is left after grace_s; the pids that survived both.
    Processes that start while it runs (a batch script's cleanup) are signalled on the next round."""
    if not signal_members(session, run_id, signal.SIGTERM):
        return []
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if wait_until(lambda: not members(session, run_id), min(1.0, grace_s)):
            return []
        signal_members(session, run_id, signal.SIGTERM)  # late starters (a cleanup's own children)
    signal_members(session, run_id, signal.SIGKILL)
    wait_until(lambda: not members(session, run_id), kill_wait_s)
    return members(session, run_id)
