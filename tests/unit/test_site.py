"""Spec: site defaults. One file ($TK_SITE, else $XDG_CONFIG_HOME/tk/site.yaml, else ~/.config/tk/site.yaml) holds
what every recipe on a site shares; it is merged under every recipe (the recipe wins, --set wins over both), checked
like a recipe with errors at the site file's line, and `tk plan` shows where each value came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.unit.helpers import tk_in_process
from toolkit.errors import RecipeError
from toolkit.plan import build_plan
from toolkit.recipe import load_recipe, load_recipe_text
from toolkit.recipe.site import load_site, site_path
from toolkit.render import render_files

SITE = """\
cluster:
  partition: gpu
  account: team-llm
  container_image: nvcr.io/nvidia/tensorrt-llm/release:1.2.0
  container_mounts: ["/lustre/models:/models:ro"]
  srun_args: ["--container-writable"]
kv_transfer:
  transport: roce
"""
RECIPE = """\
schema_version: 1
name: mine
model: meta-llama/Llama-3.1-8B-Instruct
cluster:
  gpus_per_node: 8
  share_nodes: true
"""


@pytest.fixture
def site(tmp_path, monkeypatch):
    def write(text: str = SITE) -> Path:
        path = tmp_path / "site.yaml"
        path.write_text(text)
        monkeypatch.setenv("TK_SITE", str(path))
        return path
    return write


@pytest.fixture
def recipe(tmp_path):
    def write(text: str = RECIPE) -> Path:
        path = tmp_path / "mine.yaml"
        path.write_text(text)
        return path
    return write


def test_the_site_file_supplies_partition_account_image_and_mounts_to_a_recipe(site, recipe):
    site()
    plan = build_plan(load_recipe(recipe()))
    assert (plan.slurm.partition, plan.slurm.account) == ("gpu", "team-llm")
    assert plan.slurm.container_mounts == ("/lustre/models:/models:ro",)
    assert plan.kv_transfer.transport.name == "roce"
    files = render_files(plan)
    sbatch, job = files["launch.sbatch"], files["job.json"]  # job.json: every step's srun flags
    assert "#SBATCH --partition=gpu" in sbatch and "#SBATCH --account=team-llm" in sbatch
    assert "--container-image=nvcr.io#nvidia/tensorrt-llm/release:1.2.0" in job
    assert "--container-mounts=/lustre/models:/models:ro" in job and "--container-writable" in job


def test_the_recipe_wins_over_the_site_and_set_wins_over_both(site, recipe):
    site()
    text = RECIPE + "  partition: mine\n  container_mounts: [\"/scratch:/scratch\"]\n"
    loaded = load_recipe(recipe(text), ["cluster.account=other"])
    plan = build_plan(loaded)
    assert plan.slurm.partition == "mine"  # the recipe's
    assert plan.slurm.account == "other"  # --set's
    assert plan.slurm.container_mounts == ("/scratch:/scratch",)  # a list is replaced whole, never merged
    assert plan.slurm.container_image.startswith("nvcr.io#")  # the site's, in a mapping the recipe also has
    sources = {field: source for field, _, source in plan.value_sources}
    assert sources["cluster.account"] == "--set cluster.account=other"
    assert sources["cluster.container_image"].endswith("site.yaml:4")
    assert "cluster.partition" not in sources and "cluster.container_mounts" not in sources


def test_plan_shows_where_each_value_came_from(site, recipe):
    site_file = site()
    proc = tk_in_process("plan", str(recipe()), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["site_file"] == str(site_file)
    assert doc["value_sources"]["cluster.partition"] == {"value": "gpu", "from": f"{site_file}:2"}
    assert doc["value_sources"]["kv_transfer.transport"] == {"value": "roce", "from": f"{site_file}:8"}
    text = tk_in_process("plan", str(recipe())).stderr
    assert f"site defaults {site_file}" in text and "Values from outside the recipe" in text
    assert "cluster.account" in text and "team-llm" in text and "site.yaml:3" in text


def test_the_manifest_records_where_values_came_from(site, recipe):
    site()
    manifest = json.loads(render_files(build_plan(load_recipe(recipe())))["manifest.json"])
    assert manifest["value_sources"]["cluster.partition"].endswith("site.yaml:2")
    assert manifest["recipe"]["cluster"]["partition"] == "gpu"


def test_a_site_error_names_the_site_file_and_its_line(site, recipe):
    path = site(SITE + "  partiton: typo\n")  # under kv_transfer: an unknown key, line 9
    with pytest.raises(RecipeError) as info:
        load_recipe(recipe())
    v = info.value.violations[0]
    assert (v.file, v.line, v.field) == (str(path), 9, "kv_transfer.partiton")
    path = site("cluster:\n  partition: \"gpu q\"\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(recipe())
    v = info.value.violations[0]
    assert (v.file, v.line, v.field) == (str(path), 2, "cluster.partition") and "letters, digits" in v.message


def test_a_plan_rule_broken_by_a_site_value_is_reported_at_the_site_line(site, recipe):
    path = site("kv_transfer:\n  max_tokens_in_buffer: 100\n")
    with pytest.raises(RecipeError) as info:
        build_plan(load_recipe(recipe()))
    v = next(v for v in info.value.violations if v.field == "kv_transfer.max_tokens_in_buffer")
    assert (v.file, v.line) == (str(path), 2)


def test_a_site_file_may_not_say_what_a_deployment_is(site, recipe):
    site("name: everything\nmodel: x\ncluster:\n  partition: gpu\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(recipe())
    assert {v.field for v in info.value.violations} == {"name", "model"}
    assert all("move" in v.fix for v in info.value.violations)


def test_a_site_file_that_is_not_a_mapping_is_refused(site, recipe):
    site("- cluster\n")
    with pytest.raises(RecipeError, match="a site file must be a YAML mapping"):
        load_recipe(recipe())


def test_tk_site_naming_a_missing_file_is_an_error_and_none_turns_it_off(tmp_path, monkeypatch, recipe):
    monkeypatch.setenv("TK_SITE", str(tmp_path / "nope.yaml"))
    with pytest.raises(RecipeError, match=r"no such site file \(named by \$TK_SITE\)"):
        load_recipe(recipe())
    monkeypatch.setenv("TK_SITE", "none")
    assert site_path() is None and load_site() is None
    assert build_plan(load_recipe(recipe())).site_file is None


def test_the_default_site_file_is_under_xdg_config_home_and_optional(tmp_path, monkeypatch, recipe):
    monkeypatch.delenv("TK_SITE")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert site_path() == tmp_path / "cfg" / "tk" / "site.yaml"
    assert build_plan(load_recipe(recipe())).site_file is None  # absent: no defaults, no error
    (tmp_path / "cfg" / "tk").mkdir(parents=True)
    (tmp_path / "cfg" / "tk" / "site.yaml").write_text(SITE)
    assert build_plan(load_recipe(recipe())).slurm.partition == "gpu"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert site_path() == tmp_path / "home" / ".config" / "tk" / "site.yaml"


def test_shipped_recipes_take_partition_and_account_from_the_site(site):
    site()
    plan = build_plan(load_recipe(ROOT / "recipes" / "llama-3.3-70b-h100.yaml"))
    assert (plan.slurm.partition, plan.slurm.account) == ("gpu", "team-llm")
    assert plan.kv_transfer.transport.name == "infiniband"  # the recipe's own value wins


def test_a_resolved_recipe_read_back_from_a_manifest_does_not_take_the_site_again(site):
    site("cluster:\n  container_mounts: [\"/site:/site\"]\n")
    # load_recipe_text is how tk rereads a run's resolved recipe (bench, baselines): no site unless given
    plan = build_plan(load_recipe_text(RECIPE, "manifest.json"))
    assert plan.slurm.container_mounts == () and plan.site_file is None


def test_the_example_site_file_the_readme_copies_is_valid_under_every_shipped_recipe(monkeypatch):
    from tests.conftest import RECIPES

    monkeypatch.setenv("TK_SITE", str(ROOT / "docs" / "site.example.yaml"))
    for path in RECIPES:
        plan = build_plan(load_recipe(path))
        assert plan.slurm.partition == "gpu" and plan.slurm.account == "my-account", path.name
    smoke = build_plan(load_recipe(ROOT / "recipes" / "qwen3-smoke.yaml"))
    assert smoke.slurm.container_image == "nvcr.io#nvidia/tensorrt-llm/release:1.2.0"
