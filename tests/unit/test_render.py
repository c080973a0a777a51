"""Spec: rendering. Exactly the deployment's files, deterministic, atomic, only keys the target version accepts."""

import errno
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from toolkit.facts import llm_args

from toolkit.facts import versions
from toolkit.errors import RecipeError, TkError
from toolkit.plan import build_plan
from toolkit.recipe import load_recipe
from toolkit.render import (CHECK_SCRIPT, GATEWAY_SCRIPT, JOB_ARCHIVE, MANIFEST, RENDERED_FILES, job_archive, render,
                            render_files)
from tests.conftest import RECIPES, ROOT
from tests.unit.helpers import BASE, plan_of

GOLDEN = ROOT / "tests" / "golden"


def plan_for(path, *overrides):
    return build_plan(load_recipe(path, list(overrides)))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_shipped_recipe_renders_exactly_the_deployment_files(path, tmp_path):
    out, files = render(plan_for(path), tmp_path / "out")
    assert sorted(os.listdir(out)) == sorted([*RENDERED_FILES, MANIFEST])
    manifest = json.loads((out / MANIFEST).read_text())
    for name in RENDERED_FILES:
        assert manifest["files"][name] == hashlib.sha256((out / name).read_bytes()).hexdigest()


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_rendering_is_deterministic(path):
    assert render_files(plan_for(path)) == render_files(plan_for(path))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_launch_sbatch_is_valid_bash(path, tmp_path):
    out, _ = render(plan_for(path), tmp_path / "out")
    subprocess.run(["bash", "-n", str(out / "launch.sbatch")], check=True)


def _line_overrides(path, line):
    """trtllm_version=LINE, and an image of that line where the recipe names one (W1: they must agree)."""
    overrides = [f"trtllm_version={line}"]
    if "container_image:" in path.read_text():
        overrides.append(f"cluster.container_image=nvcr.io/nvidia/tensorrt-llm/release:"
                         f"{versions.get(line).release.lstrip('v')}")
    return overrides


def _all_version_renders():
    for path in RECIPES:
        for line in versions.supported():
            try:
                plan = plan_for(path, *_line_overrides(path, line))
            except RecipeError:
                continue  # a recipe may need a newer line (e.g. EFA); that refusal is tested in test_rules
            yield pytest.param(plan, line, id=f"{path.stem}-{line}")


def test_every_shipped_trtllm_recipe_renders_for_every_line_from_its_own():
    """A recipe renders for every line from the oldest that has the options it sets: any line where it sets
    nothing newer, from its own line where it is a line's recipe (NAME-1.3, NAME-1.4: it uses that line's fields)."""
    rendered = {p.id for p in _all_version_renders()}
    for path in RECIPES:
        if path.stem == "standin-2p2d":
            continue  # sets kv_transfer_timeout_ms explicitly, which 1.0/1.1 lack (refused by design)
        own = plan_for(path).trtllm_version
        pinned = path.stem.rsplit("-", 1)[-1] in versions.supported()
        lines = versions.supported()[versions.supported().index(own):] if pinned else versions.supported()
        assert {f"{path.stem}-{line}" for line in lines} <= rendered, path.stem


@pytest.mark.parametrize("plan,line", list(_all_version_renders()))
def test_every_rendered_key_is_accepted_by_the_target_version(plan, line):
    v = versions.get(line)
    files = render_files(plan)
    target = llm_args.Target(plan.trtllm_version, plan.target_release)
    for name in ("ctx.yaml", "gen.yaml"):
        opts = yaml.safe_load(files[name])
        # No key or value the line lacks (facts.llm_args ABSENT); one it may lack (UNSURE) only with a plan warning.
        for st in llm_args.audit(target, opts):
            assert st.verdict is not llm_args.Verdict.ABSENT, (name, st.reason)
            assert any(st.path in w for w in plan.warnings), (name, st.reason)
        assert opts["cache_transceiver_config"]["backend"] in v.cache_transceiver_backends
    disagg = yaml.safe_load(files["disagg.yaml"])
    assert set(disagg) <= v.disagg_keys
    for section in ("context_servers", "generation_servers"):
        assert set(disagg[section]) <= v.disagg_server_keys
        assert disagg[section]["router"]["type"] in v.routers
        if "disagg_cluster" in disagg:  # membership: workers register; TensorRT-LLM reads no urls then
            assert "urls" not in disagg[section] and v.cluster_storages
        else:
            assert len(disagg[section]["urls"]) == disagg[section]["num_instances"]
    if "disagg_cluster" in disagg:
        assert set(disagg["disagg_cluster"]) == {"cluster_uri", "cluster_name", "minimal_instances",
                                                 "heartbeat_interval_sec", "inactive_timeout_sec"}
    for name in ("ctx.env", "gen.env"):
        names = [line.split("=", 1)[0] for line in files[name].splitlines() if line and not line.startswith("#")]
        assert ("UCX_TLS" in names) == bool(plan.kv_transfer.transport.ucx_tls(plan.engine.kv_memory))
        assert {n for n in names if n.startswith("TRTLLM_")} <= v.env_vars


def test_env_files_can_be_sourced_and_keep_values_intact(tmp_path):
    text = BASE + "context:\n  env:\n    MY_VAR: \"a b'c $(touch x) `id` ;\"\n"
    out, _ = render(build_plan(_loaded(text, tmp_path)), tmp_path / "out")
    got = subprocess.run(["bash", "-c", 'set -a; . ./ctx.env; printf %s "$MY_VAR"'], cwd=out,
                         capture_output=True, text=True, check=True).stdout
    assert got == "a b'c $(touch x) `id` ;"
    assert not (out / "x").exists()


def _loaded(text, tmp_path):
    from toolkit.recipe import load_recipe_text

    return load_recipe_text(text, str(tmp_path / "r.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_golden_files(path):
    """Pinned output of every shipped recipe. After an intended change, or for a new recipe:
    TK_UPDATE_GOLDEN=1 python3 -m pytest tests/unit/test_render.py -k golden   (then review the diff)"""
    files = render_files(plan_for(path))
    # check_config.py is copied as it is (templates/check_config.py) and job.pyz is the orchestrator package built
    # as a zipapp: each is compared with its source, not pinned once per recipe; the manifest's hash of job.pyz is
    # masked (it changes with the orchestrator's code, which its own specs cover).
    assert files.pop(CHECK_SCRIPT) == (Path(__file__).parents[2] / "templates" / CHECK_SCRIPT).read_text()
    assert files.pop(JOB_ARCHIVE) == job_archive()
    doc = json.loads(files[MANIFEST])
    doc["files"][JOB_ARCHIVE] = "<sha256 of job.pyz>"
    files[MANIFEST] = json.dumps(doc, indent=2) + "\n"
    if GATEWAY_SCRIPT in files:  # copied as it is, where the plan's etcd wants the run's certificate
        assert files.pop(GATEWAY_SCRIPT) == (Path(__file__).parents[2] / "templates" / GATEWAY_SCRIPT).read_text()
    gold = GOLDEN / path.stem
    if os.environ.get("TK_UPDATE_GOLDEN") == "1":
        shutil.rmtree(gold, ignore_errors=True)
        gold.mkdir(parents=True)
        for fname, text in files.items():
            (gold / fname).write_text(text)
    if not gold.is_dir():
        pytest.fail(f"recipes/{path.name} has no golden files: create tests/golden/{path.stem}/ with "
                    "`TK_UPDATE_GOLDEN=1 python3 -m pytest tests/unit/test_render.py -k golden`, "
                    "review the files and commit them")
    assert sorted(p.name for p in gold.iterdir()) == sorted(files)
    for fname, text in files.items():
        assert (gold / fname).read_text() == text, f"{path.stem}/{fname} differs from the golden file"


def test_every_golden_directory_belongs_to_a_shipped_recipe():
    # tests/golden/aggregated/ holds the --aggregated renders of some recipes (tests/unit/test_aggregated.py)
    orphans = {p.name for p in GOLDEN.iterdir() if p.is_dir()} - {p.stem for p in RECIPES} - {"aggregated"}
    assert not orphans, f"tests/golden/ holds files of recipes that are no longer shipped: {sorted(orphans)}"


@pytest.mark.parametrize("fail_at", [1, 4])
def test_failed_render_leaves_an_existing_output_directory_untouched(tmp_path, monkeypatch, fail_at):
    """The write fails part-way (disk full after `fail_at - 1` files): the old files stay as they were."""
    out, _ = render(plan_for(RECIPES[0]), tmp_path / "out")
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    plan = plan_for(RECIPES[0], "generation.instances=2")  # a valid plan whose files differ
    assert render_files(plan)["disagg.yaml"] != before["disagg.yaml"].decode()

    real_write_text, written = Path.write_text, []

    def write_text(self, *args, **kwargs):
        if len(written) + 1 == fail_at:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(self.name)
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(TkError, match="cannot write the rendered files"):
        render(plan, out)
    monkeypatch.undo()
    assert len(written) == fail_at - 1  # it did fail during the write, after that many files
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary directory left behind


def test_rerender_replaces_our_files_and_keeps_the_users(tmp_path):
    out, _ = render(plan_for(ROOT / "recipes" / "llama-3.3-70b-h100.yaml"), tmp_path / "out")
    (out / "notes.txt").write_text("mine")
    render(plan_for(ROOT / "recipes" / "llama-3.3-70b-h100.yaml", "generation.instances=2"), out)
    assert (out / "notes.txt").read_text() == "mine"
    assert yaml.safe_load((out / "disagg.yaml").read_text())["generation_servers"]["num_instances"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_disagg_urls_name_nodes_and_ports_from_the_plan():
    plan = plan_of(BASE, "context.instances=2", "context.tp=4", "generation.tp=8", "membership.enabled=false")
    disagg = yaml.safe_load(render_files(plan)["disagg.yaml"])
    assert disagg["context_servers"]["urls"] == ["<node0>:8336", "<node0>:8337"]
    assert disagg["generation_servers"]["urls"] == ["<node1>:8338"]
    assert disagg["hostname"] == "<node0>" and disagg["port"] == 8000


def test_container_and_mpi_flags_in_the_batch_script():
    files = render_files(plan_for(ROOT / "recipes" / "llama-3.3-70b-h100.yaml"))
    sbatch, job = files["launch.sbatch"], json.loads(files["job.json"])  # the script starts the job, job.json its data
    assert "--container-image=nvcr.io#nvidia/tensorrt-llm/release:1.2.0" in job["srun_flags"]
    assert "--container-mounts=/lustre/models:/models:ro,/lustre/scratch:/scratch" in job["srun_flags"]
    workers = [c for c in job["components"] if c["kind"] == "worker"]
    assert "--mpi=pmix" in job["srun_flags"] and all(c["argv"][:2] == ["trtllm-llmapi-launch", "trtllm-serve"]
                                                      for c in workers)
    assert "#SBATCH --nodes=2" in sbatch and "#SBATCH --account" not in sbatch  # the site file gives it
    standin = json.loads(render_files(plan_for(ROOT / "recipes" / "standin-2p2d.yaml"))["job.json"])
    argv = [a for c in standin["components"] for a in c["argv"] if isinstance(a, str)]
    assert "tk-standin-serve" in argv and "trtllm-llmapi-launch" not in argv


def test_the_batch_script_fits_one_screen_and_only_starts_the_job():
    for path in RECIPES:
        sbatch = render_files(plan_for(path))["launch.sbatch"]
        assert len(sbatch.splitlines()) < 60, path.stem
        assert sbatch.rstrip().endswith('exec python3 "$RUN_DIR/job.pyz" "$RUN_DIR/job.json"')


def test_a_template_is_compiled_once_per_process(monkeypatch):
    """Rendering again compiles nothing: before, every render built a new jinja2 environment and compiled every
    template again (a third of the unit layer's rendering time)."""
    import jinja2

    plan = plan_of()
    render_files(plan)
    compiled = []
    original = jinja2.Environment.compile
    monkeypatch.setattr(jinja2.Environment, "compile", lambda self, *a, **kw: compiled.append(a) or original(self, *a, **kw))
    render_files(plan)
    assert compiled == []
