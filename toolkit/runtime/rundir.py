"""Run directories: where a launch or a validation keeps everything about itself.

A run directory is created exclusively: two commands never share one. An automatic name gets a -N suffix
until `mkdir` succeeds; a directory the user names must not exist yet, or be empty (then it is claimed by
creating its claim file exclusively).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from toolkit.errors import TkError

CLAIM_FILE = ".tk-run"


def runs_root() -> Path:
    return Path(os.environ.get("TK_RUNS_DIR", "runs"))


def _claim(path: Path) -> None:
    """Create path's claim file exclusively; fails if another command got there first."""
    fd = os.open(path / CLAIM_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")


def new_run_dir(name: str, run_dir: str | os.PathLike | None, kind: str = "") -> Path:
    """Create and return a new run directory: the given one, or runs/NAME[-KIND]-TIMESTAMP[-N]."""
    if run_dir:
        path = Path(run_dir)
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            if not path.is_dir():
                raise TkError(f"{path}: exists and is not a directory; give another --run-dir") from None
            if any(p.name != CLAIM_FILE for p in path.iterdir()) or (path / CLAIM_FILE).exists():
                raise TkError(f"{path}: already holds a run or other files; give a new or empty --run-dir") from None
        except OSError as exc:
            raise TkError(f"{path}: cannot create the run directory ({exc.strerror or exc})") from None
        try:
            _claim(path)
        except FileExistsError:
            raise TkError(f"{path}: another tk command claimed this run directory; give another --run-dir") from None
        except OSError as exc:
            raise TkError(f"{path}: cannot write in the run directory ({exc.strerror or exc})") from None
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = runs_root() / f"{name}{'-' + kind if kind else ''}-{stamp}"
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TkError(f"{base.parent}: cannot create the runs directory ({exc.strerror or exc}); "
                      "set TK_RUNS_DIR or give --run-dir") from None
    for n in range(1, 1000):
        candidate = base if n == 1 else Path(f"{base}-{n}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise TkError(f"{candidate}: cannot create the run directory ({exc.strerror or exc})") from None
        _claim(candidate)
        return candidate
    raise TkError(f"{base}: 999 run directories with this name and time already exist; give --run-dir")


def release_if_unused(path: Path) -> None:
    """Remove a run directory this command created and never used (it holds only its claim file), so a
    command refused before it started leaves nothing behind."""
    try:
        if {p.name for p in path.iterdir()} == {CLAIM_FILE}:
            (path / CLAIM_FILE).unlink()
            path.rmdir()
    except OSError:
        pass


def write_text_atomically(path: Path, text: str) -> None:
    """Write a small file so that a reader sees the old content or the new one, whole."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_phases(run_dir: Path) -> list[tuple[float, str, str]]:
    """The job's own account of itself (state/phases.tsv: time, phase, detail), oldest first."""
    path = Path(run_dir) / "state" / "phases.tsv"
    out = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split("\t", 2)
            if len(parts) == 3:
                try:
                    out.append((float(parts[0]), parts[1], parts[2]))
                except ValueError:
                    continue
    return out


def read_nodes(run_dir: Path) -> dict[int, str]:
    """Plan node index -> address, once the job has resolved them (nodes.tsv: index, node name, address)."""
    path = Path(run_dir) / "nodes.tsv"
    out = {}
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) == 3 and parts[0].isdigit():
                out[int(parts[0])] = parts[2]
    return out


def wait_until(predicate, timeout_s: float, poll_s: float = 0.2) -> bool:
    """Poll predicate until it is true or timeout_s has passed; whether it became true."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
