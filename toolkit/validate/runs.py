"""The validation runs there are (`tk runs` lists them beside the launched ones): read from their directories only.

A validation run directory (toolkit.validate.run) holds params.json from the start and report.json once the
coordinator has finished (passed or not, interrupted included); its claim file names the coordinator's process.
Found through the run index (kind "validate") and under the runs directory; every read is bounded
(toolkit.runtime.files), and a directory that cannot be read is skipped.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.runtime import files, rundir

PARAMS_MAX_BYTES = 16 << 20
REPORT_MAX_BYTES = 64 << 20


@dataclass
class ValidationRun:
    name: str
    run_dir: str
    recipe: str
    mode: str  # local | slurm | in-allocation
    created: float
    state: str  # validating (its coordinator runs) | passed | failed | incomplete (no report, nobody running it)
    job_id: str | None = None
    report: str | None = None  # report.json, once written

    def to_dict(self) -> dict:
        return asdict(self)


def _coordinator_alive(run_dir: Path) -> bool:
    """The process that claimed the directory (its claim file's pid) still runs on this machine."""
    try:
        claim = files.read_text(run_dir / rundir.CLAIM_FILE, 4096, follow=False)
        pid = int(dict(kv.split("=", 1) for kv in claim.split() if "=" in kv)["pid"])
        if pid <= 1:  # 0 and below name process groups (-1: every process), 1 is init: no coordinator of tk's
            return False
        os.kill(pid, 0)
        return True
    except PermissionError:
        return True  # someone's process: running
    except (OSError, ValueError, KeyError, OverflowError):
        return False


def read_validation_run(run_dir: Path) -> ValidationRun | None:
    """The validation run in run_dir, or None where it is not one (no params.json, a run.json) or cannot be read."""
    try:
        params = files.read_json(run_dir / "params.json", PARAMS_MAX_BYTES, follow=False)
        if not isinstance(params, dict) or (run_dir / "run.json").exists():
            return None
        try:
            created = os.stat(run_dir / rundir.CLAIM_FILE).st_mtime
        except OSError:
            created = os.stat(run_dir).st_mtime
        report = None
        if (run_dir / "report.json").is_file():
            report = files.read_json(run_dir / "report.json", REPORT_MAX_BYTES, follow=False)
    except (OSError, ValueError):  # files.FileProblem: too big, too deep, not a regular file
        return None
    run = report.get("run") if isinstance(report, dict) and isinstance(report.get("run"), dict) else {}
    if isinstance(report, dict) and isinstance(report.get("passed"), bool):
        state = "passed" if report["passed"] else "failed"
    else:
        state = "validating" if _coordinator_alive(run_dir) else "incomplete"
    job = run.get("job_id")
    mode = params.get("mode")
    return ValidationRun(name=run_dir.name, run_dir=str(run_dir), recipe=str(params.get("recipe", ""))[:200],
                         mode=mode if mode in ("local", "slurm", "in-allocation") else "?", created=created,
                         state=state, job_id=str(job)[:64] if job is not None else None,
                         report=str(run_dir / "report.json") if report is not None else None)


def validation_runs() -> list[ValidationRun]:
    """Every validation run in the run index and under the runs directory, each once, oldest first."""
    root = rundir.runs_root()
    candidates: list[Path] = []
    try:
        if root.is_dir():
            candidates = sorted(p for p in root.iterdir() if (p / "params.json").is_file())[:10000]
    except OSError:
        pass
    candidates += rundir.indexed_dirs("validate")
    out, seen = [], set()
    for d in candidates:
        try:
            key = str(d.resolve())
        except OSError:
            continue
        if key in seen:
            continue
        seen.add(key)
        found = read_validation_run(d)
        if found is not None:
            out.append(found)
    return sorted(out, key=lambda v: v.created)


__all__ = ["ValidationRun", "read_validation_run", "validation_runs"]
