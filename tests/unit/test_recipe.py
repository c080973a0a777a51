"""Spec: loading a recipe. Every problem names the file, the line, the field and the fix."""

import pytest

from toolkit.errors import RecipeError
from toolkit.recipe import load_recipe, load_recipe_text
from tests.conftest import RECIPES
from tests.unit.helpers import BASE


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_shipped_recipe_loads(path):
    loaded = load_recipe(path)
    assert loaded.recipe.name == path.stem


def test_defaults_fill_everything_but_model_and_cluster():
    r = load_recipe_text(BASE, "r.yaml").recipe
    assert r.kv_transfer.backend == "NIXL"
    assert r.kv_transfer.tokens_per_block == 32
    assert r.context.instances == 1 and r.generation.instances == 1
    assert r.proxy.port == 8000


def test_unknown_key_is_reported_with_line_and_did_you_mean():
    text = BASE + "context:\n  instnces: 2\n"
    with pytest.raises(RecipeError) as info:
        load_recipe_text(text, "r.yaml")
    [v] = info.value.violations
    assert (v.file, v.line, v.field) == ("r.yaml", 7, "context.instnces")
    assert "did you mean 'instances'" in v.fix


def test_several_violations_are_reported_together():
    text = BASE + "context:\n  tp: 0\nkv_transfer:\n  backend: RDMA\n  tokens_per_blok: 32\n"
    with pytest.raises(RecipeError) as info:
        load_recipe_text(text, "r.yaml")
    got = {(v.field, v.line) for v in info.value.violations}
    assert got == {("context.tp", 7), ("kv_transfer.backend", 9), ("kv_transfer.tokens_per_blok", 10)}
    assert all(v.fix for v in info.value.violations)


def test_missing_required_fields_are_named():
    with pytest.raises(RecipeError) as info:
        load_recipe_text("schema_version: 1\nname: t\n", "r.yaml")
    assert {v.field for v in info.value.violations} == {"model", "cluster"}


def test_yaml_syntax_error_points_at_the_line():
    with pytest.raises(RecipeError) as info:
        load_recipe_text(BASE + "context: [\n", "r.yaml")
    assert info.value.violations[0].line is not None
    assert "not valid YAML" in info.value.violations[0].message


def test_duplicate_keys_are_refused():
    with pytest.raises(RecipeError) as info:
        load_recipe_text(BASE + "context:\n  tp: 2\n  tp: 4\n", "r.yaml")
    assert "duplicate key 'tp'" in info.value.violations[0].message


def test_set_overrides_any_field_with_the_same_validation():
    r = load_recipe_text(BASE, "r.yaml", ["generation.instances=4", "kv_transfer.dtype=fp8"]).recipe
    assert r.generation.instances == 4 and r.kv_transfer.dtype == "fp8"
    with pytest.raises(RecipeError) as info:
        load_recipe_text(BASE, "r.yaml", ["generation.instances=zero"])
    [v] = info.value.violations
    assert v.file == "--set generation.instances=zero" and v.field == "generation.instances"


def test_set_of_an_unknown_field_gets_a_suggestion():
    with pytest.raises(RecipeError) as info:
        load_recipe_text(BASE, "r.yaml", ["generation.instance=4"])
    assert "did you mean 'instances'" in info.value.violations[0].fix


def test_malformed_set_expression():
    with pytest.raises(RecipeError) as info:
        load_recipe_text(BASE, "r.yaml", ["generation.instances"])
    assert "a.b=value" in info.value.violations[0].message


def test_trtllm_version_may_be_written_as_a_number_but_must_be_supported():
    assert load_recipe_text(BASE + "trtllm_version: 1.1\n", "r.yaml").recipe.trtllm_version == "1.1"
    with pytest.raises(RecipeError) as info:
        load_recipe_text(BASE + "trtllm_version: 0.19\n", "r.yaml")
    assert "supported release lines" in info.value.violations[0].message


@pytest.mark.parametrize("bad", ["a b", "x;rm", "$(id)", "-lead"])
def test_recipe_name_must_be_file_and_job_safe(bad):
    with pytest.raises(RecipeError):
        load_recipe_text(BASE.replace("name: t", f"name: '{bad}'"), "r.yaml")


def test_env_names_are_checked():
    with pytest.raises(RecipeError) as info:
        load_recipe_text(BASE + "context:\n  env:\n    'BAD NAME': x\n", "r.yaml")
    assert info.value.violations[0].field == "context.env"
