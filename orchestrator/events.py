"""What the job tells tk: state/events.jsonl (one JSON object a line) and state/servers/NAME.json.

events.jsonl, appended with one write per line (O_APPEND), each line:
    {"time": 1718000000.123, "event": "server-exited", "component": "gen-1", "state": "backoff",
     "reason": "gen-1 exited with code 137 (signal 9); restart 1 of 5 in 2s (log: logs/gen-1.log)",
     "exit_code": 137, "restarts": 0}
`event` is an orchestrator.states.EventKind, `state` a ComponentState (or the run's RunState for run-level events,
whose component is null). tk status / doctor / diff / bench read the fields, never the reason's words.

servers/NAME.json is each component's current supervision state, replaced atomically (write, then rename). A
file that cannot be written (a full disk) is removed rather than left showing an older state as current.
Every event is also printed to the job's output (logs/job.log locally, slurm-JOBID.out on Slurm) for people.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Dict, Optional, TextIO

from orchestrator.policy import Event

REASON_LIMIT = 2000


class EventLog:
    def __init__(self, state_dir: str, clock: Callable[[], float] = time.time, out: Optional[TextIO] = None):
        self.path = os.path.join(state_dir, "events.jsonl")
        self.clock = clock
        self.out = out if out is not None else sys.stdout
        self.failures = 0  # lines that could not be written (kept in the job's output)

    def write(self, event: Event) -> Dict[str, Any]:
        now = round(self.clock(), 3)
        doc = {"time": now, "event": event.kind.value, "component": event.component, "state": event.state,
               "reason": (event.reason or "")[:REASON_LIMIT] or None, "exit_code": event.exit_code,
               "restarts": event.restarts}
        line = json.dumps(doc, ensure_ascii=True) + "\n"
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError:
            self.failures += 1
        try:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
            who = f" {event.component}" if event.component else ""
            self.out.write(f"[tk] {stamp} {event.kind.value}{who}: {event.reason or ''}\n")
            self.out.flush()
        except (OSError, ValueError):
            pass
        return doc


def write_atomically(path: str, text: str) -> bool:
    """Replace path with text, whole or not at all; on failure the old file is removed (never shown as current)."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        return True
    except OSError:
        for stale in (tmp, path):
            try:
                os.unlink(stale)
            except OSError:
                pass
        return False


class StateFiles:
    """state/servers/NAME.json, as `tk status` reads it (toolkit.runtime.rundir.read_server_states)."""

    def __init__(self, state_dir: str, policy: str):
        self.dir = os.path.join(state_dir, "servers")
        os.makedirs(self.dir, exist_ok=True)
        self.policy = policy

    def write(self, name: str, role: str, state: str, since: float, restarts: int, failures: int,
              last_exit: Optional[int], pid: Optional[int], step: Optional[str], reason: Optional[str]) -> bool:
        doc = {"name": name, "role": role, "state": state, "since": round(since, 3), "restarts": restarts,
               "failures": failures, "last_exit": last_exit, "pid": pid, "step": step,
               "reason": (reason or "")[:REASON_LIMIT] or None, "policy": self.policy}
        return write_atomically(os.path.join(self.dir, f"{name}.json"), json.dumps(doc) + "\n")
