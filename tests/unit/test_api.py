"""Spec: the public Python API (`toolkit.api`, re-exported by `toolkit`). `__all__` is exactly the public names."""

import json
import types

import pytest

import toolkit
import toolkit.api
from toolkit.errors import RecipeError, TkError
from tests.conftest import RECIPES, ROOT

# Stage packages shadow API functions of the same name on the `toolkit` package (see toolkit/__init__.py).
STAGE_PACKAGES = {"render", "launch", "validate", "doctor", "size", "bench"}


def _public_names(module, *, defined_in=None):
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") and name != "__version__":
            continue
        if isinstance(value, types.ModuleType) or name == "annotations":  # submodules, `from __future__`
            continue
        if name in ("TYPE_CHECKING", "Any", "Callable", "Sequence", "Path"):  # typing helpers
            continue
        if defined_in and getattr(value, "__module__", defined_in) != defined_in:
            continue
        names.add(name)
    return names


def test_toolkit_all_is_exactly_its_public_names():
    assert toolkit.__all__ == sorted(toolkit.__all__)
    assert set(toolkit.__all__) == _public_names(toolkit)


def test_api_all_is_exactly_its_public_functions():
    assert toolkit.api.__all__ == sorted(toolkit.api.__all__)
    assert set(toolkit.api.__all__) == _public_names(toolkit.api, defined_in="toolkit.api")


def test_toolkit_re_exports_the_api_except_the_names_of_stage_packages():
    assert set(toolkit.api.__all__) - set(toolkit.__all__) == STAGE_PACKAGES
    for name in set(toolkit.api.__all__) - STAGE_PACKAGES:
        assert getattr(toolkit, name) is getattr(toolkit.api, name)


def test_load_plan_takes_a_shipped_name_or_a_path_and_overrides():
    by_name = toolkit.load_plan("llama-3.3-70b-h100")
    by_path = toolkit.load_plan(ROOT / "recipes" / "llama-3.3-70b-h100.yaml")
    assert by_name == by_path
    assert len(toolkit.load_plan("llama-3.3-70b-h100", ["generation.instances=4"]).generation.instances) == 4
    with pytest.raises(RecipeError) as info:
        toolkit.load_plan("llama-3.3-70b-h100", ["kv_transfer.max_tokens_in_buffer=33"])
    assert info.value.violations
    with pytest.raises(RecipeError):
        toolkit.load_plan("no-such-recipe")


def test_list_recipes_is_every_shipped_recipe():
    rows = toolkit.list_recipes()
    assert [r["name"] for r in rows] == [p.stem for p in RECIPES]
    assert {"name", "path", "engine", "model", "description"} <= set(rows[0])
    assert toolkit.list_models() and {"name", "attention", "layers", "moe"} <= set(toolkit.list_models()[0])


def test_plan_summary_is_json_ready():
    doc = toolkit.plan_summary(toolkit.load_plan("llama-3.3-70b-h100"))
    assert json.loads(json.dumps(doc))["bytes_per_token"] == 163840


def test_render_writes_the_files_and_defaults_to_render_name(tmp_path, monkeypatch):
    plan = toolkit.load_plan("standin-2p2d")
    out, files = toolkit.api.render(plan, tmp_path / "o")
    assert sorted(p.name for p in out.iterdir()) == sorted(files)
    monkeypatch.chdir(tmp_path)
    out, _ = toolkit.api.render(plan)
    assert out == toolkit.api.Path("render") / plan.name and (tmp_path / "render" / plan.name / "launch.sbatch").exists()


def test_prepare_renders_a_run_directory_and_starts_nothing(tmp_path):
    run = toolkit.prepare(toolkit.load_plan("standin-2p2d"), local=True, run_dir=tmp_path / "run")
    assert run.state == "rendered" and run.backend == "local"
    assert toolkit.find_run(tmp_path / "run").name == run.name
    assert [p.name for p in toolkit.logs(run, role="proxy")] == ["proxy.log"]


def test_validate_refuses_bad_options_before_starting_anything():
    plan = toolkit.load_plan("standin-2p2d")
    with pytest.raises(TkError, match="mode"):
        toolkit.api.validate(plan, mode="cloud")
    with pytest.raises(TkError, match="nodes"):
        toolkit.api.validate(plan, mode="slurm", nodes=4)
    with pytest.raises(TkError, match="unexpected keyword"):
        toolkit.api.validate(plan, mode="local", iterashuns=3)


@pytest.mark.parametrize("progress_thread", [None, True])
def test_validate_in_allocation_outside_an_allocation_is_refused_before_anything_is_written(
        tmp_path, monkeypatch, progress_thread):
    """--in-allocation needs the allocation it runs in: without SLURM_JOB_ID it is refused before the params are
    built, whether or not --progress-thread was given, and its run directory is removed."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    monkeypatch.delenv("SLURM_NODELIST", raising=False)
    plan = toolkit.load_plan("standin-2p2d")
    with pytest.raises(TkError, match="SLURM_JOB_ID"):
        toolkit.api.validate(plan, mode="in-allocation", run_dir=str(tmp_path / "run"), progress_thread=progress_thread)
    assert not (tmp_path / "run").exists()
