"""Reading a run's logs: the last lines, or following them until the run ends."""

from __future__ import annotations

import time
from pathlib import Path

import click

from toolkit.errors import TkError
from toolkit.launch.backends import backend_for
from toolkit.launch.run import RunRecord, log_tail


def select_logs(run: RunRecord, role: str | None, instance: int | None) -> list[Path]:
    names = [s.name for s in run.servers
             if (role is None or s.role == role) and (instance is None or s.instance == instance)]
    if not names:
        raise TkError(f"{run.name} has no server with role={role} instance={instance}")
    return [run.log_path(n) for n in names]


def show_logs(paths: list[Path], lines: int) -> None:
    for path in paths:
        click.echo(f"==> {path} <==")
        click.echo(log_tail(path, lines))


def follow_logs(run: RunRecord, paths: list[Path], lines: int = 10, poll_s: float = 0.5) -> None:
    """The last `lines` lines of each log, then new lines as they come; ends when the run's job has ended (or on
    Ctrl-C)."""
    backend = backend_for(run.backend)
    offsets = {p: (p.stat().st_size if p.exists() else 0) for p in paths}
    if lines > 0:
        show_logs(paths, lines)
    last_check = 0.0
    while True:
        for p in paths:
            if not p.exists():
                continue
            with open(p, "rb") as f:
                f.seek(offsets[p])
                chunk = f.read()
                offsets[p] = f.tell()
            for line in chunk.decode(errors="replace").splitlines():
                click.echo(f"{p.stem}: {line}")
        if time.monotonic() - last_check > 5:
            last_check = time.monotonic()
            if backend.job_state(run).phase == "ENDED":
                click.echo(f"[tk] {run.name} has ended", err=True)
                return
        time.sleep(poll_s)
