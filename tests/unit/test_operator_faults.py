"""Spec: what an operator types or leaves behind never ends in a traceback, a wrong answer or an unbounded
wait (a hostile-input audit's bugs 4, 12, 13, 14 and 20: numbers, damaged run records, rich markup in paths,
exact run names, `tk logs --lines`)."""

from __future__ import annotations

import json

import pytest

from tests.unit.helpers import tk_in_process
from toolkit.api import load_plan, prepare
from toolkit.launch.run import find_run, load_run, log_tail
from toolkit.errors import TkError


def tk(*args, env=None, timeout=120):
    """tk in this process (tests/unit/helpers.py); `timeout` is kept for the call sites' reading."""
    return tk_in_process(*args, env=env)


@pytest.mark.parametrize("args", [
    ["validate", "cluster", "standin-2p2d", "--local", "--timeout", "inf"],
    ["validate", "cluster", "standin-2p2d", "--local", "--timeout", "nan"],
    ["validate", "cluster", "standin-2p2d", "--local", "--transfer-timeout", "inf"],
    ["validate", "cluster", "standin-2p2d", "--local", "--min-fraction", "nan"],
    ["validate", "cluster", "standin-2p2d", "--local", "--min-fraction", "2"],
    ["validate", "cluster", "standin-2p2d", "--local", "--nodes", "100000"],
    ["validate", "cluster", "standin-2p2d", "--local", "--iterations", "10000000000"],
    ["launch", "standin-2p2d", "--local", "--pending-timeout", "nan"],
    ["launch", "standin-2p2d", "--local", "--startup-timeout", "inf"],
    ["logs", "--lines", "-3"],
])
def test_every_number_on_the_command_line_has_a_finite_range(args, tmp_path):
    proc = tk(*args, env={"TK_RUNS_DIR": str(tmp_path / "runs")})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Invalid value" in proc.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything was made


def _dry_run(tmp_path, name: str):
    return prepare(load_plan("standin-2p2d"), local=True, run_dir=tmp_path / "runs" / name)


@pytest.mark.parametrize("edit, what", [
    ({"backend": "kubernetes"}, "backend"),
    ({"job_id": 11}, "job_id"),
    ({"created": "yesterday"}, "created"),
    ({"servers": "many"}, "servers"),
    ({"servers": [{"name": 1, "role": "ctx", "instance": 0, "node": 0, "port": "x"}]}, "servers"),
    ({"unknown_field": 1}, "unknown_field"),
])
def test_a_damaged_run_record_is_named_not_a_traceback_and_does_not_hide_the_other_runs(tmp_path, edit, what):
    good = _dry_run(tmp_path, "good")
    bad = _dry_run(tmp_path, "bad")
    record = json.loads((bad.path / "run.json").read_text())
    record.update(edit)
    (bad.path / "run.json").write_text(json.dumps(record))
    with pytest.raises(TkError, match="not a readable tk run"):
        load_run(bad.path)
    env = {"TK_RUNS_DIR": str(tmp_path / "runs")}
    for args in (["status", str(bad.path)], ["stop", str(bad.path)]):
        proc = tk(*args, env=env)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr and what in proc.stderr, proc.stderr
    listed = tk("runs", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert good.name in listed.stdout


def test_status_of_a_read_only_run_directory_answers(tmp_path, monkeypatch):
    # A copied or read-only run (chattr +i, another user's): tk status shows it without writing run.json.
    from toolkit import api
    from toolkit.launch.run import RunRecord

    run = _dry_run(tmp_path, "ro")

    def read_only(self):
        raise PermissionError(13, "Permission denied", str(self.path / "run.json"))

    monkeypatch.setattr(RunRecord, "save", read_only)
    assert api.status(run.path).state == "rendered"


def test_an_exact_run_name_wins_over_runs_it_is_a_prefix_of(tmp_path, monkeypatch):
    monkeypatch.setenv("TK_RUNS_DIR", str(tmp_path / "runs"))
    first = _dry_run(tmp_path, "hb-20261123-171956")
    _dry_run(tmp_path, "hb-20261123-171956-2")
    assert find_run("hb-20261123-171956").path == first.path
    with pytest.raises(TkError, match="matches several runs"):
        find_run("hb-2026")


def test_logs_lines_zero_prints_nothing(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(10)))
    assert log_tail(log, 0) == ""
    assert log_tail(log, 3) == "line 7\nline 8\nline 9"


def test_rich_markup_characters_in_a_model_directory_are_shown_as_written(tmp_path):
    model = tmp_path / "m[/bold]"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "num_attention_heads": 8,
                                                   "num_key_value_heads": 2, "hidden_size": 512}))
    proc = tk("plan", "standin-2p2d", "--set", f"model={model}")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "m[/bold]" in proc.stderr
    proc = tk("plan", "standin-2p2d", "--set", f"model={tmp_path / 'm[red]x'}")
    assert proc.returncode == 2 and "m[red]x" in proc.stderr


