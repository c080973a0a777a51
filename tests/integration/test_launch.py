"""Spec: `tk launch` brings up 2 context + 2 generation stand-in servers and the proxy, on the real dev
Slurm cluster (4 nodes) and on the local backend; answers equal the aggregated baseline's; under --fail-fast a
dead server fails the run with its log tail (the restart policy is specified in test_self_healing.py);
`tk stop` leaves no job and no process behind."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.integration.helpers import (PROMPTS, STANDIN_RECIPE, aggregated_baseline, complete, processes_mentioning, tk, tk_json,
                     wait_until)

pytestmark = [pytest.mark.slow, pytest.mark.nixl]

LAUNCH_TIMEOUT_S = 400


@pytest.fixture(params=[pytest.param("slurm", marks=pytest.mark.slurm), "local"])
def backend(request):
    if request.param == "slurm":
        request.getfixturevalue("dev_slurm")
    return request.param


@pytest.fixture
def runs_env(tmp_path):
    return {"TK_RUNS_DIR": str(tmp_path / "runs")}


def launch(backend: str, env: dict, recipe=STANDIN_RECIPE, *extra: str) -> dict:
    args = ["launch", str(recipe), *extra] + (["--local"] if backend == "local" else [])
    return tk_json(*args, env=env, timeout=LAUNCH_TIMEOUT_S)


def assert_nothing_left(run_dir: str, backend: str, job_id: str | None, timeout_s: float = 60) -> None:
    wait_until(lambda: not processes_mentioning(run_dir), timeout_s,
               lambda: f"every process of {run_dir} to exit (left: {processes_mentioning(run_dir)})")
    if backend == "slurm":
        # slurmctld records the end a moment after the last process exits (the job passes through COMPLETING)
        wait_until(lambda: job_id not in tk_squeue(), 30,
                   lambda: f"job {job_id} to leave squeue (now: {_squeue_states()})")


def tk_squeue() -> list[str]:
    import subprocess
    return subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30).stdout.split()


def _squeue_states() -> str:
    import subprocess
    return subprocess.run(["squeue", "-h", "-o", "%i %T %r"], capture_output=True, text=True, timeout=30).stdout


def server_pids(run_dir: str, port: int) -> list[int]:
    """The stand-in server process itself (not the bash wrapper or srun around it)."""
    return [pid for pid, cmd in processes_mentioning(run_dir)
            if f"--port {port} " in cmd + " " and "tk-standin-serve" in cmd and not cmd.startswith(("bash", "srun"))]


def test_a_launched_deployment_answers_like_the_aggregated_baseline_and_stops_clean(backend, runs_env, tmp_path):
    record = launch(backend, runs_env)
    run_dir = record["run_dir"]
    try:
        assert record["backend"] == backend
        assert record["state"] == "ready"
        assert record["endpoint"].startswith("http://")
        workers = [s for s in record["servers"] if s["role"] in ("ctx", "gen")]
        assert sorted((s["role"], s["instance"]) for s in workers) == [("ctx", 0), ("ctx", 1), ("gen", 0), ("gen", 1)]
        assert all(s["state"] == "healthy" for s in record["servers"])
        assert len({s["node"] for s in workers}) == 4, "2+2 servers spread over the 4 nodes"
        if backend == "slurm":
            assert record["job_id"]

        baseline = aggregated_baseline(Path(run_dir), tmp_path)
        try:
            for i, prompt in enumerate(PROMPTS):
                expected = complete(baseline.url, prompt)
                assert expected, "the baseline generates at least one token"
                assert complete(record["endpoint"], prompt) == expected, f"prompt {i} ({len(prompt.split())} words)"
                assert complete(record["endpoint"], prompt, stream=True) == expected, f"prompt {i}, streaming"
            for prompt in PROMPTS[:3]:
                assert complete(record["endpoint"], prompt, chat=True) == complete(baseline.url, prompt, chat=True)
        finally:
            baseline.close()

        status = tk_json("status", env=runs_env)
        assert status["name"] == record["name"] and status["state"] == "ready"
        assert all(s["state"] == "healthy" for s in status["servers"])
        logs = tk("logs", "--role", "gen", "--instance", "0", env=runs_env, check=True)
        assert logs.stdout.strip(), "the generation server wrote a log"
    finally:
        stopped = tk("stop", env=runs_env, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert_nothing_left(run_dir, backend, record.get("job_id"))
    after = tk_json("status", env=runs_env)
    assert after["state"] == "stopped"


def test_under_fail_fast_a_dead_generation_server_fails_the_run_with_its_log_tail(backend, runs_env):
    record = launch(backend, runs_env, STANDIN_RECIPE, "--fail-fast")
    run_dir = record["run_dir"]
    try:
        victim = next(s for s in record["servers"] if s["role"] == "gen" and s["instance"] == 1)
        pids = server_pids(run_dir, victim["port"])
        assert pids, f"no process found for gen-1 in {processes_mentioning(run_dir)}"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

        def failed():
            doc = json.loads(tk("status", "--json", env=runs_env).stdout)
            return doc if doc["state"] == "failed" else None

        status = wait_until(failed, 60, "tk status to report the run failed")
        states = {s["name"]: s["state"] for s in status["servers"]}
        assert states["gen-1"] == "failed", states
        assert "gen-1" in status["reason"]
        text = tk("status", env=runs_env)
        assert text.returncode != 0, "a failed run is reported with a non-zero exit code"
        assert "last lines of gen-1" in text.stderr + text.stdout
        # the job ends itself when one component dies: nothing is left even before `tk stop`
        assert_nothing_left(run_dir, backend, record.get("job_id"))
    finally:
        tk("stop", env=runs_env, timeout=120)
    assert_nothing_left(run_dir, backend, record.get("job_id"), timeout_s=10)


def test_a_hostile_recipe_launches_nothing_unintended(backend, runs_env, tmp_path):
    marker = tmp_path / "PWNED"
    text = STANDIN_RECIPE.read_text()
    text = text.replace("description: ", f"description: \"$(touch {marker}) `touch {marker}`\" # ")
    text = text.replace("context:\n  instances: 2\n",
                        f"context:\n  instances: 2\n  env:\n    EVIL: \"'; touch {marker}; $(touch {marker})\"\n")
    recipe = tmp_path / "hostile.yaml"
    recipe.write_text(text)
    run_dir = tmp_path / f"run dir; touch {marker.name} $(touch {marker})"
    record = launch(backend, runs_env, recipe, "--run-dir", str(run_dir))
    try:
        assert record["state"] == "ready"
        assert not marker.exists(), "a recipe value was executed by a shell"
        ctx_env = (run_dir / "ctx.env").read_text()
        assert "EVIL=" in ctx_env
    finally:
        tk("stop", str(run_dir), env=runs_env, timeout=120)
    assert not marker.exists()
    assert_nothing_left(str(run_dir), backend, record.get("job_id"))


def test_a_second_deployment_on_taken_ports_fails_naming_them_and_leaves_the_first_serving(backend, runs_env, tmp_path):
    # Whatever answers on a server's host and port is not necessarily this run's server: the same recipe
    # launched twice must not report the second run healthy through the first run's servers.
    first = launch(backend, runs_env)
    try:
        second = tk("launch", str(STANDIN_RECIPE), "--json", *(["--local"] if backend == "local" else []),
                    "--run-dir", str(tmp_path / "second"), env=runs_env, timeout=LAUNCH_TIMEOUT_S)
        assert second.returncode != 0, second.stdout
        message = json.loads(second.stdout)["errors"][0]["message"]
        assert "already in use" in message and "18336" in message, message
        assert "worker_base_port" in message
        if backend == "slurm":
            second_job = json.loads((tmp_path / "second" / "run.json").read_text())["job_id"]
            wait_until(lambda: second_job not in tk_squeue(), 30,
                       lambda: f"the second job {second_job} to be released (now: {_squeue_states()})")
        assert complete(first["endpoint"], PROMPTS[0]), "the first deployment still answers"
        status = tk_json("status", first["name"], env=runs_env)
        assert status["state"] == "ready"
    finally:
        tk("stop", first["name"], env=runs_env, timeout=120)
    assert_nothing_left(first["run_dir"], backend, first.get("job_id"))
