"""Spec: `tk bench` verdicts and ownership under faults (issue 21), locally on the stand-in with NVIDIA's aiperf:

- SIGTERM to `tk bench RECIPE` while aiperf runs ends it as Ctrl-C does: exit 143, the deployment it launched
  stopped, aiperf's process group ended, no staging directory left (M5);
- a deployment with etcd membership benchmarks as PASS: the probe asks the workers, not the job's etcd (M1);
- KV that arrives corrupted gives answers that differ from the aggregated baseline: a FAIL, exit 2 (M4).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import ROOT, processes_mentioning, tk, wait_until

pytest.importorskip("aiperf")

pytestmark = [pytest.mark.slow, pytest.mark.nixl]

RECIPE = str(ROOT / "recipes" / "standin-2p2d.yaml")
# ports below Linux's ephemeral range (32768-60999), where an outgoing connection can hold one
PORTS = ["--set", "proxy.port=25100", "--set", "cluster.worker_base_port=25200",
         "--set", "cluster.internal_base_port=25400"]
SMALL = ["--isl", "64", "--osl", "8", "--concurrency", "2", "--requests", "16"]


def _env(tmp_path) -> dict:
    return {"TK_RUNS_DIR": str(tmp_path / "runs"), "TK_STATE_DIR": str(tmp_path / "state")}


def _bench(tmp_path, *args, timeout=500):
    run_dir = tmp_path / "run"
    proc = tk("bench", RECIPE, "--local", "--run-dir", str(run_dir), *PORTS, *args, "--json", env=_env(tmp_path),
              timeout=timeout)
    wait_until(lambda: not processes_mentioning(str(run_dir)), 60, "the benchmarked deployment to be stopped")
    doc = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    return proc, doc, run_dir


def test_sigterm_to_tk_bench_stops_the_deployment_ends_aiperf_and_leaves_no_staging(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.cli", "bench", RECIPE, "--local", "--run-dir", str(run_dir),
                             *PORTS, "--isl", "64", "--osl", "8", "--concurrency", "2", "--requests", "100000"],
                            env={**os.environ, **_env(tmp_path)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        wait_until(lambda: proc.poll() is not None or
                   any("aiperf" in cmd for _, cmd in processes_mentioning(str(run_dir / "bench"))), 300,
                   "aiperf to run against the deployment")
        if proc.poll() is not None:
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"tk bench ended (exit {proc.returncode}) before aiperf ran:\n{err[-3000:]}")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err
    wait_until(lambda: not processes_mentioning(str(run_dir)), 60,
               lambda: f"nothing of the run left (left: {processes_mentioning(str(run_dir))})")
    assert json.loads((run_dir / "run.json").read_text())["state"] == "stopped"
    bench = run_dir / "bench"
    assert not bench.exists() or not [p.name for p in bench.iterdir()], list(bench.iterdir())


def test_a_membership_run_with_its_etcd_benchmarks_as_pass(tmp_path):
    proc, doc, _ = _bench(tmp_path, *SMALL, "--set", "membership.enabled=true", "--set",
                          "membership.etcd_port=25300")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert doc["verdict"]["summary"].startswith("PASS: valid, disaggregated"), doc["verdict"]["summary"]


def test_corrupted_kv_is_a_fail_against_the_aggregated_baseline(tmp_path):
    proc, doc, run_dir = _bench(tmp_path, *SMALL, "--set", 'generation.env={"TK_STANDIN_FAULT": "corrupt_kv"}',
                                "--baseline", "aggregated")
    assert proc.returncode == 2, proc.stderr[-3000:]
    verdict = doc["verdict"]
    assert verdict["summary"].startswith("FAIL: the answers differ from the aggregated baseline"), verdict["summary"]
    assert not verdict["passed"]
    saved = json.loads(next(Path(run_dir, "bench").glob("*/verdict.json")).read_text())
    assert saved["exit_code"] == 2 and not saved["passed"]


def test_a_supervised_restart_during_tk_bench_is_named_and_counted_per_server_lifetime(tmp_path):
    """kill -9 of a generation server while aiperf runs (supervision: restart): the proxy retries on the other one,
    the server comes back, and the verdict names the restart instead of calling the deployment not disaggregated
    from negative counts (M3)."""
    import threading
    import time

    env = _env(tmp_path)
    run_dir = tmp_path / "run"
    launched = tk("launch", RECIPE, "--local", "--run-dir", str(run_dir), *PORTS, "--json", env=env, timeout=400)
    assert launched.returncode == 0, launched.stderr[-2000:]
    record = json.loads(launched.stdout)
    port = next(s["port"] for s in record["servers"] if s["name"] == "gen-1")
    killed = []

    def kill_gen1():
        wait_until(lambda: any("aiperf" in cmd for _, cmd in processes_mentioning(str(run_dir / "bench"))), 120,
                   "aiperf to run")
        time.sleep(6)  # into the profiling phase
        from tests.integration.test_launch import server_pids
        for pid in server_pids(str(run_dir), port):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    killer = threading.Thread(target=kill_gen1, daemon=True)
    killer.start()
    try:
        proc = tk("bench", str(run_dir), "--isl", "32", "--osl", "8", "--concurrency", "2", "--requests", "1500",
                  "--max-error-rate", "0.2", "--json", env=env, timeout=500)
        killer.join(5)
        assert killed, "gen-1 was not killed during the benchmark"
        doc = json.loads(proc.stdout)
        summary = doc["verdict"]["summary"]
        assert "restarted during the run: gen-1" in summary, summary
        assert "not disaggregated" not in summary and proc.returncode == 0, summary
        assert all(v >= 0 for s in doc["proof"]["per_server"].values() for v in s.values() if isinstance(v, int))
    finally:
        tk("stop", str(run_dir), env=env, timeout=120)


def test_corrupted_kv_is_a_fail_even_without_a_baseline(tmp_path):
    """Without --baseline the answers through the proxy are compared with a generation server's own answers to whole
    requests, which move no KV: corrupted KV is caught there too (M4)."""
    proc, doc, _ = _bench(tmp_path, *SMALL, "--set", 'generation.env={"TK_STANDIN_FAULT": "corrupt_kv"}')
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert doc["verdict"]["summary"].startswith("FAIL: the answers differ from those of a generation server"), \
        doc["verdict"]["summary"]
