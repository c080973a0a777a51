"""Spec: the aggregated baseline (`tk launch RECIPE --aggregated`, api.launch_baseline): the same model on the
same GPU count, plain trtllm-serve instances (agg-N) with no cache_transceiver_config, no proxy."""

import json
import os
import shutil
import subprocess

import pytest
import yaml

import toolkit.launch as launch_mod
from toolkit import api
from toolkit.errors import RecipeError, TkError
from toolkit.launch import launch
from toolkit.plan import build_plan
from toolkit.recipe import load_recipe
from toolkit.render import CHECK_SCRIPT, JOB_ARCHIVE, MANIFEST, RENDERED_FILES_AGGREGATED, job_archive, render_files
from toolkit.runtime.slurm import JobState
from tests.conftest import RECIPES, ROOT
from tests.unit.test_launch_states import FakeBackend, FakeHttp, fake, write_job_files  # noqa: F401 (fake: a fixture)

GOLDEN = ROOT / "tests" / "golden" / "aggregated"
GOLDEN_RECIPES = ("standin-2p2d", "llama-3.3-70b-h100")


def plans(path, *overrides):
    loaded = load_recipe(path, list(overrides))
    return build_plan(loaded), build_plan(loaded, aggregated=True)


def _aggregatable(path):
    try:
        plans(path)
        return True
    except RecipeError:
        return False


AGG_RECIPES = [p for p in RECIPES if _aggregatable(p)]


def test_most_shipped_recipes_have_an_aggregated_baseline_with_their_defaults():
    assert {"standin-2p2d", "llama-3.3-70b-h100", "llama-3.1-8b-1node"} <= {p.stem for p in AGG_RECIPES}


@pytest.mark.parametrize("path", AGG_RECIPES, ids=lambda p: p.stem)
def test_the_aggregated_plan_uses_exactly_the_disaggregated_plans_gpus(path):
    disagg, agg = plans(path)
    assert agg.is_aggregated and not disagg.is_aggregated
    assert agg.gpu_count == disagg.context.gpu_count + disagg.generation.gpu_count == disagg.gpu_count
    assert len({(n, g) for s in agg.servers for n in s.nodes for g in s.gpus}) == agg.gpu_count
    assert [s.name for s in agg.servers] == [f"agg-{i}" for i in range(len(agg.servers))]
    assert agg.proxy is None and agg.membership is None and agg.name == f"{disagg.name}-agg"


@pytest.mark.parametrize("path", AGG_RECIPES, ids=lambda p: p.stem)
def test_aggregated_options_have_no_cache_transceiver_and_admit_the_longest_request(path):
    disagg, agg = plans(path)
    opts = yaml.safe_load(render_files(agg)["agg.yaml"])
    assert "cache_transceiver_config" not in opts
    assert opts["max_num_tokens"] >= disagg.context.llm_api_options["max_num_tokens"]
    assert opts["max_batch_size"] == disagg.generation.llm_api_options["max_batch_size"]
    assert opts["tensor_parallel_size"] == disagg.generation.tp
    assert opts["disable_overlap_scheduler"] is False


def test_tp_and_pp_from_the_recipe_decide_the_instances():
    disagg, agg = plans(RECIPES_BY["llama-3.3-70b-h100"], "aggregated.tp=4")
    assert agg.aggregated.tp == 4 and len(agg.aggregated.instances) == disagg.gpu_count // 4
    _, agg = plans(RECIPES_BY["llama-3.3-70b-h100"], "aggregated.tp=16")
    assert len(agg.aggregated.instances) == 1 and agg.aggregated.nodes_per_instance == 2


def test_a_tp_that_does_not_divide_the_gpus_is_an_error_naming_the_field_and_the_fix():
    path = RECIPES_BY["standin-2p2d"]  # 4 GPUs
    with pytest.raises(RecipeError) as exc:
        plans(path, "aggregated.tp=3")
    text = str(exc.value)
    assert "aggregated.tp" in text and "4 GPUs" in text and "fix:" in text and "1, 2, 4" in text


def test_max_num_tokens_below_the_longest_request_is_an_error():
    with pytest.raises(RecipeError) as exc:
        plans(RECIPES_BY["standin-2p2d"], "aggregated.max_num_tokens=64")
    assert "aggregated.max_num_tokens" in str(exc.value) and "1024" in str(exc.value)


def test_the_disaggregated_manifest_does_not_gain_an_aggregated_section_it_did_not_write():
    disagg, _ = plans(RECIPES_BY["standin-2p2d"])
    assert "aggregated" not in disagg.recipe
    disagg, _ = plans(RECIPES_BY["standin-2p2d"], "aggregated.pp=1")
    assert disagg.recipe["aggregated"]["pp"] == 1


@pytest.mark.parametrize("path", AGG_RECIPES, ids=lambda p: p.stem)
def test_the_aggregated_render_is_its_files_and_launch_sbatch_is_valid_bash(path, tmp_path):
    _, agg = plans(path)
    files = render_files(agg)
    assert sorted(files) == sorted([*RENDERED_FILES_AGGREGATED, MANIFEST])
    sbatch = tmp_path / "launch.sbatch"
    sbatch.write_text(files["launch.sbatch"])
    subprocess.run(["bash", "-n", str(sbatch)], check=True)
    job = json.loads(files["job.json"])  # what the job starts, in order (launch.sbatch only starts the job)
    assert [c["kind"] for c in job["components"]] == ["worker"] * len(agg.servers)  # no proxy, no etcd
    assert not job["check"]["disagg"] and job["disagg_config"] is None and job["membership"] is None
    assert [c["name"] for c in job["components"]] == [s.name for s in agg.servers]  # each started, each waited on
    argv = [a for c in job["components"] for a in c["argv"] if isinstance(a, str)]
    assert "--server_role" not in argv and "--disagg_cluster_uri" not in argv
    assert json.loads(files[MANIFEST])["derived"]["mode"] == "aggregated"


@pytest.mark.parametrize("stem", GOLDEN_RECIPES)
def test_aggregated_golden_files(stem):
    """TK_UPDATE_GOLDEN=1 python3 -m pytest tests/unit/test_aggregated.py -k golden   (then review the diff)"""
    _, agg = plans(RECIPES_BY[stem])
    files = render_files(agg)
    assert files.pop(CHECK_SCRIPT) == (ROOT / "templates" / CHECK_SCRIPT).read_text()
    assert files.pop(JOB_ARCHIVE) == job_archive()  # the orchestrator package, compared with its source
    doc = json.loads(files[MANIFEST])
    doc["files"][JOB_ARCHIVE] = "<sha256 of job.pyz>"
    files[MANIFEST] = json.dumps(doc, indent=2) + "\n"
    gold = GOLDEN / stem
    if os.environ.get("TK_UPDATE_GOLDEN") == "1":
        shutil.rmtree(gold, ignore_errors=True)
        gold.mkdir(parents=True)
        for fname, text in files.items():
            (gold / fname).write_text(text)
    assert sorted(p.name for p in gold.iterdir()) == sorted(files)
    for fname, text in files.items():
        assert (gold / fname).read_text() == text, f"aggregated/{stem}/{fname} differs from the golden file"


RECIPES_BY = {p.stem: p for p in RECIPES}


def test_the_launch_state_machine_takes_an_aggregated_run_to_ready_with_every_instance_an_endpoint(fake, tmp_path):
    _, agg = plans(RECIPES_BY["standin-2p2d"])
    names = [s.name for s in agg.servers]
    http = FakeHttp([s.port for s in agg.servers])
    posted = []
    real_post = http.post
    http.post = lambda url, json, timeout: posted.append(url) or real_post(url, json, timeout)
    fake(FakeBackend([JobState("RUNNING")], on_submit=lambda run: write_job_files(run, names)), http)
    run = launch(agg, "fake", str(tmp_path / "run"))
    assert run.state == "ready" and run.mode == "aggregated"
    assert [s.name for s in run.servers] == names  # no proxy record
    assert run.endpoints == [f"http://127.0.0.1:{s.port}" for s in agg.servers]
    assert run.endpoint == run.endpoints[0]
    assert posted == [f"{u}/v1/completions" for u in run.endpoints]  # a smoke request through each instance


def test_an_aggregated_run_is_not_ready_until_every_instance_answers(fake, tmp_path):
    _, agg = plans(RECIPES_BY["standin-2p2d"])
    names = [s.name for s in agg.servers]
    backend = fake(FakeBackend([JobState("RUNNING")], on_submit=lambda run: write_job_files(run, names)),
                   FakeHttp([s.port for s in agg.servers[:-1]]))
    with pytest.raises(launch_mod.LaunchFailed) as exc:
        launch(agg, "fake", str(tmp_path / "run"), startup_timeout_s=0.05)
    assert names[-1] in str(exc.value) and backend.stopped == 1


def test_launch_baseline_plans_from_the_runs_manifest_with_its_overrides_fail_fast(tmp_path, monkeypatch):
    path = RECIPES_BY["standin-2p2d"]
    disagg = build_plan(load_recipe(path, ["generation.max_batch_size=32"]))
    run = api.prepare(disagg, local=True, run_dir=tmp_path / "run")
    seen = {}
    monkeypatch.setattr(api, "launch", lambda plan, **kw: seen.update(plan=plan, **kw) or "record")
    assert api.launch_baseline(run.run_dir) == "record"
    plan = seen["plan"]
    assert plan.is_aggregated and plan.supervision.policy == "fail-fast" and seen["local"] is True
    assert plan.aggregated.llm_api_options["max_batch_size"] == 32  # the run's --set, from its manifest
    assert plan.gpu_count == disagg.gpu_count


def test_launch_baseline_refuses_an_aggregated_run(tmp_path):
    _, agg = plans(RECIPES_BY["standin-2p2d"])
    run = api.prepare(agg, local=True, run_dir=tmp_path / "run")
    with pytest.raises(TkError, match="already an aggregated run"):
        api.launch_baseline(run)


def test_validate_refuses_an_aggregated_plan():
    _, agg = plans(RECIPES_BY["standin-2p2d"])
    with pytest.raises(TkError, match="nothing to validate"):
        api.validate(agg, mode="local")


def test_aiperf_gets_every_aggregated_instance_url():
    from toolkit.bench.workload import aiperf_argv, build_workload

    cell = build_workload("fixed", isl=16, osl=4).cells[0]
    argv = aiperf_argv(cell, aiperf="aiperf", url=("http://a:1", "http://b:2"), model="m", tokenizer="t", out_dir="o")
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--url"] == ["http://a:1", "http://b:2"]
