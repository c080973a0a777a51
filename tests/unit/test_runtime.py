"""Spec: the machinery launch and validate share (toolkit.runtime): run directories are never shared, and
a run ends exactly the processes it started."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from toolkit.errors import TkError
from toolkit.runtime import procs, rundir


def test_automatic_run_directories_are_created_exclusively(tmp_path, monkeypatch):
    monkeypatch.setenv("TK_RUNS_DIR", str(tmp_path / "runs"))
    made = {rundir.new_run_dir("r", None) for _ in range(5)}
    assert len(made) == 5 and all(p.is_dir() for p in made)


def test_a_named_run_directory_must_be_new_or_empty_and_is_claimed_once(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert rundir.new_run_dir("r", empty) == empty
    with pytest.raises(TkError, match="already holds"):
        rundir.new_run_dir("r", empty)  # claimed by the first command
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    with pytest.raises(TkError, match="already holds"):
        rundir.new_run_dir("r", used)
    assert (used / "notes.txt").read_text() == "mine"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(TkError, match="not a directory"):
        rundir.new_run_dir("r", a_file)


def test_a_run_directory_refused_before_use_is_removed(tmp_path):
    path = rundir.new_run_dir("r", tmp_path / "x")
    rundir.release_if_unused(path)
    assert not path.exists()
    path = rundir.new_run_dir("r", tmp_path / "y")
    (path / "report.json").write_text("{}")
    rundir.release_if_unused(path)
    assert (path / "report.json").exists()


def _group(tmp_path, name: str, run_id: str) -> subprocess.Popen:
    d = tmp_path / name
    d.mkdir()
    # A leader and a child in its group: as launch.sbatch and the servers it starts.
    return procs.start_group(["bash", "-c", f"sleep 60 & exec sleep 61 # {d}"], cwd=d, env=dict(os.environ),
                             log_path=d / "log", run_id=run_id)


def test_terminate_ends_the_runs_process_group_and_spares_a_run_whose_directory_shares_its_prefix(tmp_path):
    mine = _group(tmp_path, "x", "run-x")
    other = _group(tmp_path, "x-2", "run-x-2")
    try:
        assert rundir.wait_until(lambda: len(procs.members(mine.pid, "run-x")) == 2, 5)
        assert procs.members(mine.pid, "run-x-2") == []  # same group, other id: not this run's
        assert procs.terminate(mine.pid, "run-x", grace_s=5) == []
        assert procs.members(mine.pid, "run-x") == []
        assert len(procs.members(other.pid, "run-x-2")) == 2
    finally:
        procs.terminate(other.pid, "run-x-2", grace_s=5)
        for p in (mine, other):
            p.wait(timeout=5)


def test_a_process_that_ignores_sigterm_is_killed_within_the_bound(tmp_path):
    d = tmp_path / "stubborn"
    d.mkdir()
    proc = procs.start_group([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                              "print('up', flush=True); time.sleep(60)"], cwd=d, env=dict(os.environ),
                             log_path=d / "log", run_id="stubborn")
    assert rundir.wait_until(lambda: (d / "log").read_text().startswith("up"), 5)
    t0 = time.monotonic()
    assert procs.terminate(proc.pid, "stubborn", grace_s=0.5) == []
    assert time.monotonic() - t0 < 5
    proc.wait(timeout=5)


def test_a_child_that_moved_to_its_own_process_group_is_still_the_runs(tmp_path):
    # GNU timeout puts its command in a process group of its own (launch.sbatch runs `timeout 300 srun ...`):
    # it stays in the run's session, so stopping the run ends it too.
    d = tmp_path / "t"
    d.mkdir()
    proc = procs.start_group(["bash", "-c", "timeout 60 sleep 61 & exec sleep 62"], cwd=d, env=dict(os.environ),
                             log_path=d / "log", run_id="run-t")
    try:
        assert rundir.wait_until(lambda: len(procs.members(proc.pid, "run-t")) == 3, 5)
        groups = {int(open(f"/proc/{p}/stat").read().rsplit(") ", 1)[1].split()[2]) for p in procs.members(proc.pid, "run-t")}
        assert len(groups) == 2  # the leader's group and timeout's own
        assert procs.terminate(proc.pid, "run-t", grace_s=5) == []
    finally:
        proc.wait(timeout=5)
