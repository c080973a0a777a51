"""Spec: the real world's configs are accepted (issue 19). NVIDIA/srt-slurm's TensorRT-LLM recipes and TensorRT-LLM's
own disaggregated configs, kept as compact fixtures (their key paths and values, with source repository, path and
commit: tests/fixtures/corpus/, derived by scripts/derive_corpus.py and by hand), are imported with `tk import`,
planned and rendered; every rendered options file is checked against the facts of its TensorRT-LLM version.

Done means: at least 95 % of srt-slurm's TensorRT-LLM recipes import and plan with no refusal, every remaining
refusal is a TensorRT-LLM error tk cites (or a deployment tk does not run: aggregated-only recipes), and no rendered
options file uses a key or value its version lacks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from toolkit.errors import RecipeError
from toolkit.facts import llm_args
from toolkit.importer import import_doc
from toolkit.render import render_files

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"
SRT = json.loads((CORPUS / "srt_slurm_trtllm.json").read_text())
TRT = json.loads((CORPUS / "trtllm_configs.json").read_text())
# Models tk has no built-in for, in TensorRT-LLM's own test configs: a built-in of the same architecture family
# stands in (the corpus checks which options are accepted, for which the family is what matters).
# A model of the test checkpoint's size: the memory plan refuses full DeepSeek-V3 on the 1-4 GPUs these configs use.
STAND_INS = {"TinyLlama/TinyLlama-1.1B-Chat-v1.0": "meta-llama/Llama-3.1-8B-Instruct",
             "DeepSeek-V3-Lite/fp8": str(Path(__file__).resolve().parents[1] / "fixtures/models/deepseek-v3-lite")}


def unflatten(leaves: dict) -> dict:
    out: dict = {}
    for path, value in leaves.items():
        node = out
        *parents, last = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return out


def srt_doc(rec: dict) -> dict:
    """A srt-slurm recipe as srtctl reads it, rebuilt from its fixture record."""
    paths, leaves, envs = SRT["paths"], SRT["leaves"], SRT["envs"]
    configs = {role: unflatten({paths[leaves[i][0]]: leaves[i][1] for i in ids}) for role, ids in rec["roles"].items()}
    backend = {"type": "trtllm", "trtllm_config": configs, **rec.get("backend_settings", {})}
    for role, env in rec.get("env", {}).items():
        backend[f"{role}_environment"] = envs[env]
    doc = {"name": rec["name"], "model": rec["model"], "resources": rec["resources"], "backend": backend,
           "benchmark": rec.get("benchmark", {})}
    if rec.get("frontend"):
        doc["frontend"] = {"type": rec["frontend"]}
    for key in ("sbatch_directives", "srun_options", "identity"):
        if key in rec:
            doc[key] = rec[key]
    for section in rec.get("other_sections", ()):
        doc[section] = {}
    return doc


def audit(plan) -> list:
    """Rendered options files: nothing the version lacks; what it may lack only with a plan warning."""
    problems = []
    files = render_files(plan)
    target = llm_args.Target(plan.trtllm_version, plan.target_release)
    for role in plan.roles:
        opts = yaml.safe_load(files[f"{role.role}.yaml"])
        for st in llm_args.audit(target, opts):
            if st.verdict is llm_args.Verdict.ABSENT or not any(st.path in w for w in plan.warnings):
                problems.append((role.title, st.path, st.verdict.value, st.reason))
    return problems


@pytest.fixture(scope="module")
def srt_results():  # 336 imports, plans and renders: ~25 s (the tests using it are marked slow)
    out = []
    for rec in SRT["recipes"]:
        try:
            out.append((rec, import_doc(srt_doc(rec), rec["file"], kind="srt-slurm")))
        except RecipeError as exc:
            out.append((rec, exc))
    return out


def test_the_corpus_names_its_source():
    assert SRT["source"]["repo"] == "NVIDIA/srt-slurm" and len(SRT["source"]["commit"]) == 40
    assert len(SRT["recipes"]) == 336  # srt-slurm @ c88ef731: 330 disaggregated + 6 aggregated-only
    for cfg in TRT["disagg_configs"] + TRT["benchmark_configs"]:
        assert cfg["path"] and len(cfg["commit"]) == 40 and cfg["line"] in llm_args.lines()


@pytest.mark.slow
def test_at_least_95_percent_of_srt_slurm_trtllm_recipes_import_and_plan(srt_results):
    planned = [r for _, r in srt_results if not isinstance(r, RecipeError) and r.ok]
    assert len(planned) / len(srt_results) >= 0.95, f"{len(planned)} of {len(srt_results)}"
    for rec, result in srt_results:
        if isinstance(result, RecipeError):  # the only import tk refuses: a deployment it does not run
            [v] = result.violations
            assert "aggregated-only" in v.message, (rec["file"], v)
            assert rec["resources"].get("agg_workers"), rec["file"]
        else:  # a recipe that does not plan must be refused for a TensorRT-LLM rule tk cites
            for v in result.violations:
                assert "TensorRT-LLM" in v.message and v.fix, (rec["file"], str(v))


@pytest.mark.slow
def test_no_rendered_srt_slurm_options_file_uses_a_key_or_value_its_version_lacks(srt_results):
    for rec, result in srt_results:
        if not isinstance(result, RecipeError) and result.ok:
            assert audit(result.plan) == [], rec["file"]


@pytest.mark.slow
def test_what_srt_slurm_recipes_use_is_carried_or_listed(srt_results):
    for rec, result in srt_results:
        if isinstance(result, RecipeError):
            continue
        dropped = {d.path.split(".")[0] for d in result.ledger.dropped}
        for section in rec.get("other_sections", ()):  # dynamo, infra, health_check: listed, never silent
            assert section in dropped or any(section in c for c in result.ledger.carried), (rec["file"], section)
        # every per-role option either lands in the rendered file with its value or is listed as changed
        for role in result.plan.roles:
            rendered = yaml.safe_load(render_files(result.plan)[f"{role.role}.yaml"])
            for path, value in _flat(result.ledger.role_sources[role.title]).items():
                got = _dig(rendered, path)
                if got != value:
                    assert (f"{role.title}.{path}", value, got) in result.changed, (rec["file"], path)


@pytest.mark.slow
def test_grace_nodes_get_numactl_and_published_env_passes_through(srt_results):
    by_gpu = {}
    for rec, result in srt_results:
        if not isinstance(result, RecipeError) and result.ok:
            by_gpu.setdefault(rec["resources"]["gpu_type"], result.plan)
    assert by_gpu["gb300"].context.launcher_prefix == ("numactl", "-m", "0,1")
    assert by_gpu["h200"].context.launcher_prefix == ()
    files = render_files(by_gpu["gb300"])  # each server's argv, as the job starts it (job.json)
    workers = [c for c in json.loads(files["job.json"])["components"] if c["kind"] == "worker"]
    assert workers and all(c["argv"][:5] == ["numactl", "-m", "0,1", "trtllm-llmapi-launch", "trtllm-serve"]
                           for c in workers)


@pytest.mark.parametrize("cfg", TRT["disagg_configs"], ids=lambda c: Path(c["path"]).stem)
def test_trtllm_disaggregated_test_configs_import_and_plan(cfg):
    doc = unflatten(cfg["leaves"])
    doc["model"] = STAND_INS.get(doc.get("model"), doc.get("model"))
    result = import_doc(doc, cfg["path"], kind="trtllm-disagg")
    recipe = dict(result.recipe, trtllm_version=cfg["line"])
    from toolkit.importer import ImportResult, check, render_text

    again = ImportResult(kind=result.kind, source=result.source, recipe=recipe,
                         text=render_text(recipe, result.ledger), ledger=result.ledger)
    check(again)
    assert again.ok, [str(v) for v in again.violations]
    assert audit(again.plan) == []


def test_trtllm_benchmark_config_imports_and_plans():
    [cfg] = TRT["benchmark_configs"]
    doc = unflatten(cfg["leaves"])
    doc["environment"]["model_path"] = "deepseek-ai/DeepSeek-R1"  # the example's placeholder
    result = import_doc(doc, cfg["path"], kind="trtllm-bench")
    assert result.ok, [str(v) for v in result.violations]
    p = result.plan
    assert (p.context.tp, p.generation.tp, p.generation.attention_dp) == (4, 8, True)
    assert p.context.launcher_prefix == ("numactl", "-m", "0,1")  # slurm.numa_bind: true
    assert {d.path for d in result.ledger.dropped} >= {"benchmark", "profiling", "environment.trtllm_repo"}
    assert audit(p) == []


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        path = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and v:
            out.update(_flat(v, path))
        else:
            out[path] = v
    return out


def _dig(d, path: str):
    for k in path.split("."):
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d
