"""Runs aiperf as a subprocess: bounded, its output streamed to a log file, progress reported per line."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from toolkit.bench.workload import BenchInputError
from toolkit.runtime import files, signals

AIPERF_ENV = "TK_AIPERF"
INSTALL_FIX = "install it with: pip install 'tk-disagg[bench]' (or scripts/setup), or point TK_AIPERF at an aiperf"


def find_aiperf() -> str:
    """The aiperf executable: $TK_AIPERF, beside this Python, or on PATH. BenchInputError (exit 2) if none."""
    env = os.environ.get(AIPERF_ENV)
    if env:
        if shutil.which(env):
            return shutil.which(env)
        raise BenchInputError(f"{AIPERF_ENV}={env}: not an executable; {INSTALL_FIX}")
    beside = Path(sys.executable).parent / "aiperf"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("aiperf")
    if not found:
        raise BenchInputError(f"aiperf is not installed; {INSTALL_FIX}")
    return found


class AiperfFailed(Exception):
    def __init__(self, rc: int, tail: str):
        super().__init__(f"aiperf exited {rc}")
        self.rc, self.tail = rc, tail


def run_aiperf(argv: list[str], log_path: Path, timeout_s: float,
               on_line: Callable[[str], None] | None = None) -> int:
    """Run one aiperf command; stdout and stderr go to log_path. Returns its exit code; kills its process
    group and raises TimeoutError past timeout_s."""
    env = dict(os.environ, NO_COLOR="1", TERM="dumb")
    deadline = time.monotonic() + timeout_s
    with files.open_append(log_path) as log:
        log.write(("$ " + " ".join(argv) + "\n").encode())
        log.flush()
        # A process group of its own (so a timeout ends aiperf and its workers), but not a session of its own:
        # Linux's autogroup scheduling shares CPU per session, and a new session measurably slowed aiperf on a
        # loaded machine (TTFT p50 +15 % against the same command in the caller's session, bench_tk_bench.py).
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, preexec_fn=os.setpgrp)  # noqa: PLW1509 (process_group= needs 3.11)
        try:
            import selectors

            sel = selectors.DefaultSelector()
            sel.register(proc.stdout, selectors.EVENT_READ)
            buf = b""
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"aiperf ran past {timeout_s:g} s")
                if sel.select(timeout=min(left, 1.0)):
                    chunk = os.read(proc.stdout.fileno(), 65536)
                    if not chunk:
                        break
                    log.write(chunk)
                    log.flush()
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    if on_line:
                        for line in lines:
                            on_line(line.decode(errors="replace"))
            try:
                return proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # it closed its output but kept running past the bound
                raise TimeoutError(f"aiperf ran past {timeout_s:g} s") from None
        finally:
            if proc.poll() is None:
                with signals.deferred():  # Ctrl-C, SIGTERM, SIGHUP: aiperf's group ends, even on a second signal
                    end_group(proc)
            proc.stdout.close()


def end_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """End a process and its process group (aiperf's controller and workers): SIGTERM, then SIGKILL after grace_s
    (aiperf's system controller can take seconds to act on SIGTERM). Bounded."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:  # whatever of its group is left (a worker that outlived its controller)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of aiperf's log, read from its last 64 KiB."""
    from toolkit.runtime import files

    try:
        return "\n".join(files.read_text(path, 64 * 1024, longer="tail").splitlines()[-lines:])
    except (OSError, ValueError):
        return ""
