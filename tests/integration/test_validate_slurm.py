"""Spec: `tk validate cluster` on the real dev Slurm cluster (4 nodes, partition dev): it submits its own
job with one srun agent per node, or sruns inside an allocation it is given; every pair passes; an agent
killed mid-run fails the pairs it was in, naming it, within a bound; the job is always released."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.nixl]

RECIPE = str(ROOT / "recipes" / "standin-2p2d.yaml")
SMALL = ["--iterations", "3", "--warmup", "1", "--sweep-iterations", "2", "--transfer-timeout", "10",
         "--rendezvous-timeout", "60", "--timeout", "240", "--pending-timeout", "120"]


def run(argv, env, timeout=400):
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL,
                          check=False)
    proc.elapsed = time.monotonic() - t0
    proc.report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    return proc


def tk_validate(dev_slurm, tmp_path, *extra, fault=None):
    env = {**os.environ, **dev_slurm.env, "TK_RUNS_DIR": str(tmp_path / "runs")}
    env.pop("TK_VALIDATE_FAULT", None)
    if fault:
        env["TK_VALIDATE_FAULT"] = fault
    return run([sys.executable, "-m", "toolkit.cli", "validate", "cluster", RECIPE, "--set",
                f"cluster.partition={dev_slurm.partition}", *SMALL, "--json", *extra], env)


def assert_released(dev_slurm, job_id):
    assert job_id
    deadline = time.monotonic() + 60
    while job_id in dev_slurm.jobs():
        assert time.monotonic() < deadline, f"job {job_id} still in squeue"
        time.sleep(1)


def test_own_job_validates_every_pair_and_is_released(dev_slurm, tmp_path):
    proc = tk_validate(dev_slurm, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.report
    assert report["passed"] and report["mode"] == "slurm" and report["cleanup"]["released"]
    assert len(report["pairs"]) == 8 and all(p["passed"] and p["gbps"] > 0 and p["bytes_verified"] > 0
                                             for p in report["pairs"])
    assert {p["direction"] for p in report["pairs"]} == {"forward", "reverse"}
    assert {p["op"] for p in report["pairs"]} == {"WRITE"}  # TensorRT-LLM's op; READ only with --read
    # WRITE on hosts shared by the "nodes", in host memory, measures the host: no advice rests on it
    assert report["advice"]["status"] == "withheld" and report["timing"]["shared_host"]
    assert report["timing"]["cpu_progressed"] is True
    assert report["schedule"]["rounds"] == 2
    run_dir = report["run_dir"]
    assert os.path.isfile(os.path.join(run_dir, "validate.sbatch"))
    assert sorted(os.listdir(os.path.join(run_dir, "rendezvous", "exited"))) == ["node0", "node1", "node2", "node3"]
    # The dev cluster's nodes share one host: no busy-polling progress thread per agent, and the report says so
    assert report["params"]["progress_thread"] is False
    note = next(c for c in report["preflight"] if c["name"] == "progress_thread")
    assert "share a host" in note["detail"] and "node0" in note["detail"]
    assert_released(dev_slurm, report["job_id"])


def test_killed_agent_fails_its_pairs_within_the_bound_and_the_job_is_released(dev_slurm, tmp_path):
    # (with progress threads forced on: a dying agent must not leave a busy thread behind either)
    proc = tk_validate(dev_slurm, tmp_path, "--no-sweep", "--progress-thread", fault="kill:node3")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.elapsed < 180
    report = proc.report
    assert report["params"]["progress_thread"] is True
    bad = [p for p in report["pairs"] if not p["passed"]]
    assert {(p["src"], p["dst"]) for p in bad} == {("node0", "node3"), ("node1", "node3")}
    assert all("node3" in p["error"] for p in bad)
    assert all(p["passed"] for p in report["pairs"] if p["dst"] == "node2")
    assert_released(dev_slurm, report["job_id"])


def test_in_allocation_sruns_the_agents_inside_the_given_job(dev_slurm, tmp_path):
    env = {**os.environ, **dev_slurm.env, "TK_RUNS_DIR": str(tmp_path / "runs")}
    env.pop("TK_VALIDATE_FAULT", None)
    proc = run(["salloc", "-N", "4", "-p", dev_slurm.partition, "--time=10",
                sys.executable, "-m", "toolkit.cli", "validate", "cluster", RECIPE, "--in-allocation", "--no-sweep",
                *SMALL, "--json"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.report
    assert report["passed"] and report["mode"] == "in-allocation"
    assert any(i["name"] == "allocation" and i["status"] == "pass" for i in report["preflight"])
    assert report["params"]["progress_thread"] is False  # the allocation's nodes share a host too
    assert_released(dev_slurm, report["job_id"])  # salloc gave the allocation back
