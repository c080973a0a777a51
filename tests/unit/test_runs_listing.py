"""Spec: what `tk runs` lists and what `tk stop` without RUN stops (issue 31, left from round 3): validation runs are
listed beside launched ones; with several runs active, `tk stop` names them and stops none; with one, it stops that
one. Pure: run directories in tmp_path, backends faked, nothing spawned."""

from __future__ import annotations

import json
import os

import pytest

from tests.unit.helpers import plan_of
from tests.unit.test_hostile_files import runs_env  # noqa: F401 (the fixture: an empty runs directory and index)
from tests.unit.test_launch_states import STANDIN
from toolkit import api
from toolkit.cli import main
from toolkit.errors import TkError
from toolkit.launch.run import RunRecord
from toolkit.runtime import rundir
from toolkit.runtime.slurm import JobState


def _launched(name: str, state: str, created: float) -> RunRecord:
    d = rundir.runs_root() / name
    d.mkdir()
    (d / "state").mkdir()
    rundir.add_to_index(d, name)
    record = RunRecord.new(plan_of(STANDIN), d, "local")
    record.state, record.created, record.job_pid, record.job_id = state, created, 4242, "local-0123456789ab"
    record.save()
    return record


def _validation(name: str, passed: bool | None, created: float, pid: int | None = None) -> str:
    d = rundir.new_run_dir("standin-2p2d", rundir.runs_root() / name, kind="validate")
    if pid is not None:
        (d / rundir.CLAIM_FILE).write_text(f"pid={pid} created=1\n")
    (d / "params.json").write_text(json.dumps({"recipe": "standin-2p2d", "mode": "local", "agents": []}))
    if passed is not None:
        (d / "report.json").write_text(json.dumps({"kind": "tk-validate-cluster", "passed": passed,
                                                   "run": {"mode": "local", "job_id": None,
                                                           "duration_s": 12.5}}))
    os.utime(d / rundir.CLAIM_FILE, (created, created))
    return name


def test_validation_runs_are_listed_by_tk_runs_beside_launched_ones(runs_env, capsys):
    _launched("serve-a", "stopped", 1000.0)
    _validation("val-pass", True, 2000.0)
    _validation("val-fail", False, 3000.0)
    _validation("val-now", None, 4000.0, pid=os.getpid())  # its coordinator still runs: in progress
    _validation("val-killed", None, 5000.0, pid=2**22 + 12345)  # no report, and nobody runs it any more
    names = {v.name: v.state for v in api.validation_runs()}
    assert names == {"val-pass": "passed", "val-fail": "failed", "val-now": "validating", "val-killed": "incomplete"}
    capsys.readouterr()
    assert main(["runs"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines()[1:]]
    assert rows == ["serve-a", "val-pass", "val-fail", "val-now", "val-killed"]  # oldest first, one table
    assert "validate: passed" in out and "validate: failed" in out
    assert main(["runs", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in doc["runs"]] == ["serve-a"]
    assert [v["name"] for v in doc["validations"]] == ["val-pass", "val-fail", "val-now", "val-killed"]
    assert doc["validations"][0]["report"].endswith("val-pass/report.json")


@pytest.mark.parametrize("pid", [0, -1, -os.getpgrp(), 2**70, "12abc"], ids=str)
def test_a_claim_naming_no_single_process_is_not_a_validation_in_progress(runs_env, pid):
    """The claim file's pid is asked with kill(pid, 0); 0 and negative numbers ask a whole process group (-1: every
    process root may signal), which always answers: a hand-edited or foreign claim made the run "validating" for
    ever (review of issue 31)."""
    _validation("val-odd", None, 1000.0, pid=pid)
    assert {v.name: v.state for v in api.validation_runs()} == {"val-odd": "incomplete"}


@pytest.fixture
def fake_jobs(monkeypatch):
    """Every local job "runs" unless its run is named in `ended`; stops are recorded, not done."""
    from toolkit import launch

    ended: set[str] = set()
    stopped: list[str] = []

    class Backend:
        name, log_name = "local", "job"

        def job_state(self, run):
            return JobState("ENDED" if run.name in ended else "RUNNING", "fake")

        def stop(self, run):
            stopped.append(run.name)
            return []

    monkeypatch.setattr(launch, "backend_for", lambda name: Backend())
    return ended, stopped


def test_stop_without_a_run_refuses_when_several_are_active_and_lists_them(runs_env, fake_jobs, capsys):
    ended, stopped = fake_jobs
    _launched("old", "ready", 1000.0)
    _launched("new", "degraded", 2000.0)
    _launched("done", "stopped", 3000.0)
    with pytest.raises(TkError) as exc:
        api.find_run(None, active=True)
    assert "old" in str(exc.value) and "new" in str(exc.value) and "done" not in str(exc.value)
    assert "tk stop RUN" in str(exc.value)
    capsys.readouterr()
    assert main(["stop"]) == 1 and stopped == []
    assert "2 runs are active" in capsys.readouterr().err


def test_stop_without_a_run_stops_the_one_active_run_even_if_a_later_one_ended(runs_env, fake_jobs):
    ended, stopped = fake_jobs
    _launched("serving", "ready", 1000.0)
    _launched("later", "ready", 2000.0)  # its record says ready, but its job has ended: not active
    ended.add("later")
    assert main(["stop"]) == 0 and stopped == ["serving"]


def test_stop_without_a_run_and_none_active_stops_the_last_one_as_before(runs_env, fake_jobs):
    ended, stopped = fake_jobs
    _launched("first", "stopped", 1000.0)
    _launched("second", "failed", 2000.0)
    assert main(["stop"]) == 0 and stopped == ["second"]


def test_run_names_in_an_error_are_inert(runs_env, fake_jobs, capsys):
    """A run's name is run.json's text: `tk stop` listing the active runs (and a name that matches several runs)
    must not hand an OSC, a colour or a bidirectional override to the terminal (review of issue 31; tk runs and tk
    status escape theirs)."""
    hostile = ("x-evil\x1b]0;PWNED\x07", "x-red\x1b[31m\u202e")
    for i, name in enumerate(hostile):
        record = _launched(f"r{i}", "ready", 1000.0 + i)
        doc = json.loads((record.path / "run.json").read_text())
        doc["name"] = name
        (record.path / "run.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["stop"]) == 1
    assert main(["status", "x-"]) == 1  # "matches several runs"
    err = capsys.readouterr().err
    assert "runs are active: x-evil\\x1b]0;PWNED\\x07, x-red\\x1b[31m\\u202e" in err
    assert "matches several runs: x-evil\\x1b]0;PWNED\\x07, x-red" in err
    assert not any(ch in err for ch in "\x1b\x07\u202e"), err
