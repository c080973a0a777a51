"""Spec: `tk launch` refuses what cannot run on this cluster, quickly, with the cause and the fix, and
submits nothing: no Slurm commands, the controller down, an unknown partition, more nodes than the
partition has."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from tests.integration.helpers import STANDIN_RECIPE, tk

pytestmark = [pytest.mark.slow]


def refused(env: dict, *args: str) -> str:
    """Run `tk launch --json` that must fail; return its error message, after checking nothing ran."""
    start = time.monotonic()
    proc = tk("launch", str(STANDIN_RECIPE), "--json", *args, env=env, timeout=120)
    assert time.monotonic() - start < 60, "a refusal is quick"
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False
    return doc["errors"][0]["message"]


def test_without_slurm_commands_it_says_so_and_points_to_local(tmp_path):
    # An interpreter, but no sbatch/squeue/... on PATH.
    env = {"TK_RUNS_DIR": str(tmp_path / "runs"), "PATH": str(Path(sys.executable).parent) + ":/nonexistent"}
    message = refused(env)
    assert "`sbatch` not found" in message and "--local" in message
    assert not (tmp_path / "runs").exists(), "nothing was rendered or submitted"


@pytest.mark.slurm
def test_a_controller_that_does_not_answer_is_named(dev_slurm, tmp_path):
    conf = Path(dev_slurm.conf).read_text()
    dead = re.sub(r"(?m)^SlurmctldPort=\d+$", "SlurmctldPort=1", conf)  # nobody listens on port 1
    assert dead != conf
    (tmp_path / "slurm.conf").write_text(dead)
    env = {"TK_RUNS_DIR": str(tmp_path / "runs"), "SLURM_CONF": str(tmp_path / "slurm.conf")}
    message = refused(env)
    assert "controller does not answer" in message and "SLURM_CONF" in message
    assert "****" not in message, "scontrol's banner is left out"
    assert not (tmp_path / "runs").exists()


@pytest.mark.slurm
def test_an_unknown_partition_lists_the_real_ones(dev_slurm, tmp_path):
    jobs_before = dev_slurm.jobs()
    message = refused({"TK_RUNS_DIR": str(tmp_path / "runs")}, "--set", "cluster.partition=nosuch")
    assert "partition 'nosuch' does not exist" in message and "partitions: dev" in message
    assert "cluster.partition" in message
    assert dev_slurm.jobs() == jobs_before, "nothing was submitted"


def test_more_nodes_than_the_partition_has_is_refused_before_submitting(dev_slurm, tmp_path):
    jobs_before = dev_slurm.jobs()
    message = refused({"TK_RUNS_DIR": str(tmp_path / "runs")}, "--set", "context.instances=6")
    assert f"needs 8 nodes but partition 'dev' has {dev_slurm.nodes}" in message
    assert dev_slurm.jobs() == jobs_before


@pytest.mark.slurm
def test_every_shipped_standin_recipe_is_accepted_by_the_rehearsal_cluster(dev_slurm, tmp_path):
    """Round 3 left standin-1p1d-1.3 asking for --gres=gpu:2, which the dev cluster (no GPU gres) refuses at
    submission. Each shipped stand-in recipe's launch.sbatch is given to sbatch --test-only (nothing is queued) and
    a GPU request is refused with Slurm's own words, which tk doctor recognises."""
    from toolkit import api
    from toolkit.doctor import scan
    from toolkit.render import render_files

    def test_only(name: str, *overrides: str):
        d = tmp_path / f"{name}{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        script = d / "launch.sbatch"
        script.write_text(render_files(api.load_plan(name, list(overrides)))["launch.sbatch"])
        return dev_slurm.run("sbatch", "--test-only", f"--chdir={d}", str(script))

    jobs_before = dev_slurm.jobs()
    names = [r["name"] for r in api.list_recipes() if r["engine"] == "standin"]
    assert len(names) >= 4
    for name in names:
        proc = test_only(name)
        assert proc.returncode == 0 and "to start at" in proc.stderr, (name, proc.stderr)
    gres = test_only("standin-1p1d-1.3", "cluster.gpu_request=gres")
    assert gres.returncode != 0 and scan([gres.stderr.strip()], "job") == ["slurm-gres-invalid"], gres.stderr
    assert dev_slurm.jobs() == jobs_before, "--test-only queues nothing"
