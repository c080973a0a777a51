"""Run directories: where a launch or a validation keeps everything about itself.

A run directory is created exclusively: two commands never share one. An automatic name gets a -N suffix
until `mkdir` succeeds; a directory the user names must not exist yet, or be empty (then it is claimed by
creating its claim file exclusively).

Every run directory created is also appended to the run index (`runs.jsonl` in the user's state directory:
`$TK_STATE_DIR`, else `$XDG_STATE_HOME/tk`, else `~/.local/state/tk`), so `tk runs`, `status`, `logs`, `stop` and
`doctor` find a run from any working directory. One JSON line per run, written with a single O_APPEND write
(concurrent tk commands never interleave lines); the index is a convenience: failing to write it never fails a
command, and reading it skips damaged lines and directories that are gone.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from toolkit.errors import TkError
from toolkit.runtime import files

CLAIM_FILE = ".tk-run"
STATE_DIR_ENV = "TK_STATE_DIR"
INDEX_FILE = "runs.jsonl"
INDEX_READ_BYTES = 4 << 20  # the index's last 4 MiB (tens of thousands of runs) are read
INDEX_LINE_MAX = 8192  # characters of one index line


def runs_root() -> Path:
    return Path(os.environ.get("TK_RUNS_DIR", "runs"))


def state_dir() -> Path:
    """Where tk keeps its per-user state (the run index)."""
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV])
    if os.environ.get("XDG_STATE_HOME"):
        return Path(os.environ["XDG_STATE_HOME"]) / "tk"
    return Path.home() / ".local" / "state" / "tk"


def index_path() -> Path:
    return state_dir() / INDEX_FILE


def add_to_index(path: Path, name: str, kind: str = "") -> None:
    """Append a run directory to the run index; never fails (the index only helps find runs)."""
    line = json.dumps({"path": str(Path(path).resolve()), "name": name, "kind": kind or "launch",
                       "created": round(time.time(), 3)}) + "\n"
    try:
        index = index_path()
        index.parent.mkdir(parents=True, exist_ok=True)
        files.append_regular(index, line.encode())  # one O_APPEND write: lines of concurrent commands never mix
    except (OSError, RuntimeError, ValueError):  # RuntimeError: Path.home() without a home; ValueError: FileProblem
        pass


def indexed_dirs(kind: str | None = None) -> list[Path]:
    """The run directories the index names that still exist, oldest entry first, each once; only those of `kind`
    ("launch", "validate") where given."""
    try:
        data = files.read_bytes(index_path(), INDEX_READ_BYTES, longer="tail")
    except (OSError, RuntimeError, ValueError):  # missing, no home, or not a regular file (files.FileProblem)
        return []
    lines = data.decode(errors="replace").splitlines()
    if len(data) == INDEX_READ_BYTES and lines:
        lines = lines[1:]  # possibly cut mid-line
    out, seen = [], set()
    for line in lines:
        if len(line) > INDEX_LINE_MAX:  # tk writes a path, a name and a time: a longer line is not one of its own
            continue
        try:
            entry = files.loads(line, max_depth=2)
            path = Path(entry["path"])
            if kind is not None and entry.get("kind", "launch") != kind:
                continue
        except (ValueError, KeyError, TypeError, AttributeError):  # files.FileProblem (too deep, not JSON): ValueError
            continue
        try:
            if str(path) in seen or not path.is_absolute() or not path.is_dir():
                continue
        except (OSError, ValueError):
            continue
        seen.add(str(path))
        out.append(path)
    return out


def _claim(path: Path, created: bool) -> None:
    """Create path's claim file exclusively; fails if another command got there first. It records whether this
    command created the directory, so that a refused start removes only what it made."""
    fd = os.open(path / CLAIM_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(f"pid={os.getpid()} created={int(created)}\n")


def new_run_dir(name: str, run_dir: str | os.PathLike | None, kind: str = "") -> Path:
    """Create and return a new run directory: the given one, or runs/NAME[-KIND]-TIMESTAMP[-N]."""
    if run_dir:
        path = Path(run_dir)
        created = True
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            created = False
            if not path.is_dir():
                raise TkError(f"{path}: exists and is not a directory; give another --run-dir") from None
            if any(p.name != CLAIM_FILE for p in path.iterdir()) or (path / CLAIM_FILE).exists():
                raise TkError(f"{path}: already holds a run or other files; give a new or empty --run-dir") from None
        except OSError as exc:
            raise TkError(f"{path}: cannot create the run directory ({exc.strerror or exc})") from None
        try:
            _claim(path, created)
        except FileExistsError:
            raise TkError(f"{path}: another tk command claimed this run directory; give another --run-dir") from None
        except OSError as exc:
            raise TkError(f"{path}: cannot write in the run directory ({exc.strerror or exc})") from None
        add_to_index(path, path.name, kind)
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
        _claim(candidate, True)
        add_to_index(candidate, candidate.name, kind)
        return candidate
    raise TkError(f"{base}: 999 run directories with this name and time already exist; give --run-dir")


def release_if_unused(path: Path) -> None:
    """Remove a run directory this command created and never used (it holds only its claim file), so a
    command refused before it started leaves nothing behind."""
    try:
        if {p.name for p in path.iterdir()} == {CLAIM_FILE}:
            created = "created=1" in (path / CLAIM_FILE).read_text()
            (path / CLAIM_FILE).unlink()
            if created:
                path.rmdir()  # a directory the user made beforehand stays, empty as it was
    except OSError:
        pass


EVENTS_FILE = "events.jsonl"
EVENTS_READ_BYTES = 1 << 20  # the last MiB: a job writes a few lines per transition
EVENT_FIELDS = {"time": (int, float), "event": str, "component": (str, type(None)), "state": (str, type(None)),
                "reason": (str, type(None)), "exit_code": (int, type(None)), "restarts": (int, type(None))}


def read_events(run_dir: Path) -> list[dict]:
    """The job's own account of itself (state/events.jsonl, written by the orchestrator: orchestrator.events),
    oldest first. Bounded: the file's last MiB, lines of at most 16 KiB; a damaged line, or a field of the wrong
    type, is skipped rather than trusted."""
    try:  # a regular file inside the run only (not a FIFO, not a symlink leading out)
        data = files.read_bytes(files.inside(run_dir, Path("state") / EVENTS_FILE), EVENTS_READ_BYTES, follow=False,
                                longer="tail")
    except (OSError, ValueError):
        return []
    lines = data.split(b"\n")
    if len(data) == EVENTS_READ_BYTES:
        lines = lines[1:]  # possibly cut mid-line
    out = []
    for raw in lines:
        if not raw.strip() or len(raw) > 16384:
            continue
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if isinstance(doc, dict) and all(isinstance(doc.get(k), t) and not isinstance(doc.get(k), bool)
                                         for k, t in EVENT_FIELDS.items()):
            out.append(doc)
    return out


SERVER_STATE_FIELDS = {"state": str, "since": (int, float), "restarts": int, "failures": int,
                       "last_exit": (int, type(None)), "pid": (int, type(None)), "step": (str, type(None)),
                       "reason": (str, type(None)), "policy": str}


def read_server_states(run_dir: Path, names: list[str]) -> dict[str, dict]:
    """state/servers/NAME.json for each name, as the job writes it (atomically, by rename); a missing,
    oversized or damaged file, or a field of the wrong type, is left out rather than trusted."""
    out = {}
    for name in names:
        try:
            doc = files.read_json(files.inside(run_dir, Path("state") / "servers" / f"{name}.json"), 16384,
                                  max_depth=4, follow=False)
        except (OSError, ValueError):  # missing, damaged, too big or deep, not a regular file, outside the run
            continue
        if isinstance(doc, dict) and all(isinstance(doc.get(k), t) and not isinstance(doc.get(k), bool)
                                         for k, t in SERVER_STATE_FIELDS.items()):
            out[name] = doc
    return out


def read_nodes(run_dir: Path) -> dict[int, str]:
    """Plan node index -> address, once the job has resolved them (nodes.tsv: index, node name, address)."""
    out = {}
    try:
        text = files.read_text(files.inside(run_dir, "nodes.tsv"), 1 << 20, follow=False)
    except (OSError, ValueError):
        return out
    if text:
        for line in text.splitlines():
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
