"""Spec: the engine profile. What differs between TensorRT-LLM and the CPU stand-in is one row of
toolkit/facts/engines.py; the plan, templates, report and validation read its fields and never ask which
engine it is."""

import ast
import re
from pathlib import Path

import json

import pytest

from toolkit.facts.engines import ENGINES, STANDIN, TRTLLM
from toolkit.facts.hardware import TRANSPORT_PROFILES
from toolkit.render import render_files
from toolkit.validate.params import Options, build_params
from tests.unit.helpers import BASE, fields, parsed, plan_of, violations_of

ROOT = Path(__file__).resolve().parents[2]
STANDIN_RECIPE = BASE.replace("meta-llama/Llama-3.3-70B-Instruct", "tk/standin-tiny") + "engine: standin\n"


def env_lines(text: str) -> dict:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


@pytest.mark.parametrize("transport", sorted(TRANSPORT_PROFILES))
def test_trtllm_servers_and_proxy_get_the_gpu_ucx_tls(transport):
    profile = TRANSPORT_PROFILES[transport]
    gpu = [f"cluster.gpu={profile.gpus[0]}"] if profile.gpus else []
    files = render_files(plan_of(BASE, f"kv_transfer.transport={transport}", "cluster.share_nodes=true",
                                 "trtllm_version=1.2", "kv_transfer.backend=NIXL", *gpu))
    for name in ("ctx.env", "gen.env", "proxy.env"):
        # "" = the profile leaves UCX to choose (NVIDIA's GB200/GB300 recipes do): no UCX_TLS line at all
        assert env_lines(files[name]).get("UCX_TLS", "") == profile.ucx_tls_gpu, name


def test_a_fabric_of_some_gpus_only_is_refused_on_others():
    [v] = violations_of(BASE, "kv_transfer.transport=nvlink-multi-node")
    assert v.field == "kv_transfer.transport" and "GB200 and GB300" in v.message and "cluster.gpu" in v.fix
    p = plan_of(BASE, "kv_transfer.transport=nvlink-multi-node", "cluster.gpu=GB300")
    assert "UCX_TLS" not in p.context.env and "UCX_CUDA_IPC_ENABLE_MNNVL" not in p.context.env


@pytest.mark.parametrize("transport", sorted(TRANSPORT_PROFILES))
def test_standin_servers_and_proxy_get_the_host_ucx_tls(transport):
    files = render_files(plan_of(STANDIN_RECIPE, f"kv_transfer.transport={transport}", "cluster.share_nodes=true",
                                 "kv_transfer.backend=NIXL"))
    for name in ("ctx.env", "gen.env", "proxy.env"):
        assert env_lines(files[name])["UCX_TLS"] == TRANSPORT_PROFILES[transport].ucx_tls_host, name


def test_gpu_only_fabric_env_and_version_env_follow_the_profile():
    trt = plan_of(BASE)  # infiniband, H100: servers in different NVLink domains
    assert trt.context.env["UCX_CUDA_IPC_ENABLE_MNNVL"] == "n"
    assert STANDIN.version_env not in trt.context.env
    standin = plan_of(STANDIN_RECIPE)
    assert "UCX_CUDA_IPC_ENABLE_MNNVL" not in standin.context.env
    assert standin.context.env[STANDIN.version_env] == standin.trtllm_version


def test_the_plan_carries_the_profile_row_of_its_engine():
    assert plan_of(BASE).engine is TRTLLM
    assert plan_of(STANDIN_RECIPE).engine is STANDIN
    assert set(ENGINES) == {"trtllm", "standin"}


def test_rendered_files_name_the_engine_from_its_profile():
    plans = {TRTLLM: plan_of(BASE), STANDIN: plan_of(STANDIN_RECIPE)}
    trt, standin = (render_files(p) for p in plans.values())
    assert STANDIN.script_note in standin["launch.sbatch"] and STANDIN.options_note in standin["ctx.yaml"]
    assert "stand-in" not in trt["launch.sbatch"] and "stand-in" not in trt["ctx.yaml"]
    for (engine, plan), files in zip(plans.items(), (trt, standin)):
        argvs = [c["argv"] for c in json.loads(files["job.json"])["components"] if c["kind"] == "worker"]
        assert [engine.options_file_flag, {"run_file": "ctx.yaml"}] in [a[-2:] for a in argvs]
        assert sum(a.count(engine.options_file_flag) for a in argvs) == len(plan.servers)


@pytest.mark.parametrize("backend", ["MPI", "MOONCAKE"])
def test_an_engine_refuses_the_kv_backends_its_profile_does_not_list(backend):
    vs = violations_of(STANDIN_RECIPE, f"kv_transfer.backend={backend}")
    assert "kv_transfer.backend" in fields(vs)
    assert any(STANDIN.kv_backends_reason in v.message for v in vs)
    plan_of(BASE, "kv_transfer.backend=MOONCAKE")  # TensorRT-LLM 1.2 accepts it


def test_validation_memory_auto_follows_the_profile(tmp_path):
    assert build_params(plan_of(STANDIN_RECIPE), Options(), str(tmp_path))["memory"] == "dram"
    assert build_params(plan_of(BASE), Options(), str(tmp_path))["memory"] == "auto"
    assert build_params(plan_of(STANDIN_RECIPE), Options(memory="vram"), str(tmp_path))["memory"] == "vram"


def test_no_code_outside_the_engine_row_and_the_standin_asks_which_engine_it_is():
    pattern = re.compile(r"is_standin|==\s*[\"']standin[\"']|[\"']standin[\"']")
    allowed = {ROOT / "toolkit/facts/engines.py", ROOT / "toolkit/recipe/schema.py"}
    offenders = []
    for path in [*(ROOT / "toolkit").rglob("*.py"), *(ROOT / "templates").glob("*.j2")]:
        if path in allowed or (ROOT / "toolkit/standin") in path.parents:
            continue
        offenders += [f"{path.relative_to(ROOT)}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1)
                      if pattern.search(line)]
    assert not offenders


# Besides the facts, the stand-in reads two of tk's sizing modules, both at server start only: tk's one aiconfigurator
# adapter (emulated iteration times from its per-operation data, toolkit.standin.emulate) and the reader of a
# `tk validate cluster` report's bandwidth (the emulated KV transfer at a measured figure).
STANDIN_MAY_IMPORT = ("toolkit.facts", "toolkit.standin", "toolkit.size.aiconfigurator", "toolkit.size.transfer")


def test_the_standin_imports_only_the_facts_and_the_sizing_readers_from_the_toolkit():
    bad = []
    for path in (ROOT / "toolkit/standin").rglob("*.py"):
        for node in ast.walk(parsed(path)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if isinstance(node, ast.ImportFrom) and node.module == "toolkit.size":
                names = [f"toolkit.size.{a.name}" for a in node.names]
            bad += [f"{path.name}: {n}" for n in names if n.startswith("toolkit") and not n.startswith(STANDIN_MAY_IMPORT)]
    assert not bad
