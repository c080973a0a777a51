"""Spec: recipe fields a first hour on a real cluster needs. `cluster.mpi` picks srun's MPI plugin (default pmix, as
NVIDIA's Slurm scripts run TensorRT-LLM); `trust_remote_code` is the recipe's choice (default false, TensorRT-LLM's)."""

from __future__ import annotations

import json

import yaml

from tests.unit.helpers import BASE, plan_of, violations_of
from toolkit.render import render_files

STANDIN = """\
schema_version: 1
name: s
engine: standin
model: tk/standin-tiny
cluster:
  gpus_per_node: 1
  gpu: CPU
  gpu_request: none
"""


def _srun_flags(plan) -> list[str]:
    """The flags of every server's srun step, as the job's orchestrator gets them (job.json)."""
    return json.loads(render_files(plan)["job.json"])["srun_flags"]


def test_trtllm_servers_run_under_srun_mpi_pmix_by_default():
    plan = plan_of(BASE)
    assert plan.slurm.mpi == "pmix"
    assert "--mpi=pmix" in _srun_flags(plan)


def test_cluster_mpi_picks_another_plugin():
    plan = plan_of(BASE, "cluster.mpi=pmi2")
    flags = _srun_flags(plan)
    assert plan.slurm.mpi == "pmi2" and "--mpi=pmi2" in flags and "--mpi=pmix" not in flags


def test_mpi_in_srun_args_is_refused_with_a_fix_that_names_cluster_mpi():
    [v] = [v for v in violations_of(BASE, 'cluster.srun_args=["--mpi=pmi2"]') if v.field == "cluster.srun_args"]
    assert "contradicts the srun option --mpi that tk sets itself (from cluster.mpi)" in v.message
    assert v.fix == "remove it; set cluster.mpi instead"


def test_cluster_mpi_must_be_a_plugin_name():
    [v] = violations_of(BASE, "cluster.mpi=pmix --export=ALL")
    assert v.field == "cluster.mpi" and "srun --mpi=list" in v.message


def test_the_stand_in_runs_without_mpi_and_says_cluster_mpi_is_unused():
    plan = plan_of(STANDIN)
    assert plan.slurm.mpi is None and not [f for f in _srun_flags(plan) if f.startswith("--mpi")]
    plan = plan_of(STANDIN, "cluster.mpi=pmi2")
    assert plan.slurm.mpi is None and any("cluster.mpi pmi2 is not used" in w for w in plan.warnings)


def test_trust_remote_code_is_off_unless_the_recipe_says_so():
    files = render_files(plan_of(BASE))
    for name in ("ctx.yaml", "gen.yaml"):
        assert "trust_remote_code" not in yaml.safe_load(files[name])
    files = render_files(plan_of(BASE, "trust_remote_code=true"))
    for name in ("ctx.yaml", "gen.yaml"):
        assert yaml.safe_load(files[name])["trust_remote_code"] is True


def test_trust_remote_code_is_a_boolean():
    [v] = violations_of(BASE, "trust_remote_code=yes please")
    assert v.field == "trust_remote_code"
