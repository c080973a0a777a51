"""Spec: what a first hour with tk meets at once. `tk render --check` checks a relative output directory (and a check
that could not run never reads as passed); `tk bench NAME` picks a run or a recipe without guessing; `tk runs` has a
header and a dry run is never "the last run"; `tk logs --follow -n N` starts with N lines."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import ROOT
from tests.unit.helpers import tk_in_process
from toolkit import api
from toolkit.errors import TkError


def tk(*args, cwd=None):
    """tk in this process (tests/unit/helpers.py; tests/unit/test_cli.py covers the installed entry point)."""
    return tk_in_process(*args, cwd=cwd)


# --- tk render --check ---------------------------------------------------------------------------

def test_render_check_with_the_default_relative_output_directory_checks(tmp_path):
    proc = tk("render", "standin-2p2d", "--check", cwd=tmp_path)  # render/standin-2p2d, relative to cwd
    assert proc.returncode == 0, proc.stderr
    assert "config check: ctx.yaml, gen.yaml, disagg.yaml accepted by the tk CPU stand-in" in proc.stderr
    proc = tk("render", "standin-2p2d", "-o", "out/rel", "--check", "--json", cwd=tmp_path)
    check = json.loads(proc.stdout)["check"]
    assert check["status"] == "ok" and check["checked"] is True


def test_a_check_that_could_not_run_is_an_error_not_a_pass(tmp_path):
    from toolkit.render import check_rendered

    plan = api.load_plan("standin-2p2d")
    out, _ = api.render(plan, tmp_path / "s")
    status, message = check_rendered(plan, out, python=str(tmp_path / "no-such-python"))
    assert status == "error" and "could not run" in message
    (out / "check_config.py").write_text("import sys; sys.exit(3)\n")  # runs, says nothing
    status, message = check_rendered(plan, out)
    assert status == "error" and "no verdict (exit 3)" in message


def test_render_check_says_not_checked_where_nothing_here_can_check(tmp_path):
    try:
        import tensorrt_llm  # noqa: F401
        pytest.skip("tensorrt_llm is importable here")
    except ImportError:
        pass
    proc = tk("render", "qwen3-smoke", "-o", str(tmp_path / "q"), "--check", "--json")
    check = json.loads(proc.stdout)["check"]
    assert proc.returncode == 0 and check["status"] == "skipped" and check["checked"] is False
    assert "config NOT checked" in tk("render", "qwen3-smoke", "-o", str(tmp_path / "q"), "--check").stderr


# --- tk bench NAME -------------------------------------------------------------------------------

def _run(name_dir, state="stopped"):
    run = api.prepare(api.load_plan("standin-2p2d"), local=True, run_dir=name_dir)
    run.set_state(state)
    return run


def test_bench_takes_a_recipe_name_when_no_run_has_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TK_RUNS_DIR", str(tmp_path / "runs"))
    assert api.bench_target("standin-2p2d") == str(ROOT / "recipes" / "standin-2p2d.yaml")
    assert api.bench_target(str(ROOT / "recipes" / "standin-2p2d.yaml")) == str(ROOT / "recipes" / "standin-2p2d.yaml")


def test_bench_takes_a_run_by_exact_name_or_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("TK_RUNS_DIR", str(tmp_path / "runs"))
    run = _run(tmp_path / "runs" / "standin-2p2d-20261125-160608")
    assert api.bench_target("standin-2p2d-20261125-160608").run_dir == run.run_dir
    assert api.bench_target(run.run_dir).run_dir == run.run_dir
    assert api.bench_target("standin-2p2d-2026").run_dir == run.run_dir  # a prefix of one run, not a recipe


def test_a_name_that_is_a_recipe_and_a_prefix_of_runs_is_refused_naming_both(tmp_path, monkeypatch):
    monkeypatch.setenv("TK_RUNS_DIR", str(tmp_path / "runs"))
    _run(tmp_path / "runs" / "standin-2p2d-20261125-160608")
    with pytest.raises(TkError) as info:
        api.bench_target("standin-2p2d")
    text = str(info.value)
    assert "ambiguous" in text and "recipes/standin-2p2d.yaml" in text and "standin-2p2d-20261125-160608" in text
    proc = tk("bench", "standin-2p2d", "--local", cwd=tmp_path)
    assert proc.returncode == 2 and "ambiguous" in proc.stderr and "Traceback" not in proc.stderr


# --- tk runs and the last run --------------------------------------------------------------------

def test_runs_has_a_header_and_columns_that_fit_the_longest_name(tmp_path, monkeypatch):
    monkeypatch.setenv("TK_RUNS_DIR", str(tmp_path / "runs"))
    _run(tmp_path / "runs" / "short", state="rendered")
    _run(tmp_path / "runs" / ("a-much-longer-run-name-" + "x" * 30))
    lines = tk("runs").stdout.splitlines()
    assert lines[0].split() == ["RUN", "BACKEND", "JOB", "STATE", "CREATED", "ENDPOINT"]
    starts = {line.index("local") for line in lines[1:]}
    assert len(starts) == 1, lines  # the backend column starts at one place whatever the name
    assert "dry run" in lines[1]


def test_a_dry_run_is_never_the_last_run(tmp_path, monkeypatch):
    monkeypatch.setenv("TK_RUNS_DIR", str(tmp_path / "runs"))
    launched = _run(tmp_path / "runs" / "launched", state="stopped")
    time.sleep(0.01)
    dry = _run(tmp_path / "runs" / "dry", state="rendered")
    assert api.find_run().name == launched.name
    assert api.find_run("dry").name == dry.name  # found by name all the same


# --- tk logs --follow -n ---------------------------------------------------------------------------

def test_logs_follow_starts_with_the_last_n_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("TK_RUNS_DIR", str(tmp_path / "runs"))
    run = _run(tmp_path / "runs" / "followed")  # its job has ended: --follow prints what there is and stops
    run.log_path("gen-1").write_text("".join(f"line {i}\n" for i in range(1, 1001)))
    proc = tk("logs", "followed", "--role", "gen", "--instance", "1", "-n", "2", "--follow")
    assert proc.returncode == 0, proc.stderr
    shown = [line for line in proc.stdout.splitlines() if line.startswith("line ")]
    assert shown == ["line 999", "line 1000"]
    assert "has ended" in proc.stderr
