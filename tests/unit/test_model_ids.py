"""Spec: how `model` is found. A built-in name, a directory with config.json (a missing one is named by its resolved
path), or a Hugging Face id whose config.json is on this machine: in model_path, in model_path through a container
mount, or in the Hugging Face cache. Nothing is fetched over the network."""

from __future__ import annotations

import json

import pytest

from toolkit.errors import RecipeError
from toolkit.facts.models import ModelError, resolve_model
from toolkit.plan import build_plan
from toolkit.recipe import load_recipe

CONFIG = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 8192, "intermediate_size": 29568,
          "max_position_embeddings": 32768, "num_attention_heads": 64, "num_hidden_layers": 80,
          "num_key_value_heads": 8, "torch_dtype": "bfloat16", "vocab_size": 152064}
RECIPE = """\
schema_version: 1
name: q
model: Qwen/Qwen2.5-72B-Instruct
model_path: {model_path}
cluster:
  gpus_per_node: 8
  container_mounts: {mounts}
context: {{tp: 4}}
generation: {{tp: 8}}
"""


def _checkpoint(root, name="Qwen2.5-72B-Instruct"):
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(CONFIG))
    return d


def _plan(tmp_path, model_path, mounts="[]", *overrides):
    path = tmp_path / "recipes" / "q.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(RECIPE.format(model_path=model_path, mounts=mounts))
    return build_plan(load_recipe(path, list(overrides)))


def test_a_hugging_face_id_is_read_from_model_path_when_this_machine_sees_it(tmp_path):
    ckpt = _checkpoint(tmp_path / "shared")
    plan = _plan(tmp_path, ckpt)
    assert plan.model.name == "Qwen/Qwen2.5-72B-Instruct" and plan.kv.bytes_per_token == 327_680
    assert plan.context.model_path == str(ckpt)


def test_a_hugging_face_id_is_read_through_the_mount_that_maps_model_path(tmp_path):
    host = tmp_path / "lustre" / "models"
    _checkpoint(host)
    plan = _plan(tmp_path, "/models/Qwen2.5-72B-Instruct", f'["{host}:/models:ro"]')
    assert plan.model.source == str(host / "Qwen2.5-72B-Instruct" / "config.json")
    assert plan.context.model_path == "/models/Qwen2.5-72B-Instruct"  # the servers still load the container path


def test_a_hugging_face_id_is_read_from_the_hugging_face_cache(tmp_path, monkeypatch):
    snapshot = tmp_path / "hf" / "models--Qwen--Qwen2.5-72B-Instruct" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(CONFIG))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    assert resolve_model("Qwen/Qwen2.5-72B-Instruct").num_kv_heads == 8


def test_an_id_tk_cannot_find_says_where_it_looked_and_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(RecipeError) as info:
        _plan(tmp_path, "/models/Qwen2.5-72B-Instruct", f'["{tmp_path}/nowhere:/models"]')
    [v] = info.value.violations
    assert v.field == "model" and v.line == 3
    assert "/models/Qwen2.5-72B-Instruct/config.json (model_path)" in v.message
    assert f"{tmp_path}/nowhere/Qwen2.5-72B-Instruct/config.json" in v.message
    assert "the Hugging Face cache" in v.message
    assert "huggingface-cli download Qwen/Qwen2.5-72B-Instruct config.json" in v.fix


def test_a_mistyped_directory_is_named_by_its_resolved_path(tmp_path):
    _checkpoint(tmp_path / "models")
    with pytest.raises(RecipeError) as info:
        _plan(tmp_path, "/x", "[]", "model=../models/Qwen2.5-72B-Instrct")
    [v] = info.value.violations
    assert f"model directory {tmp_path}/models/Qwen2.5-72B-Instrct does not exist" in v.message
    assert "unknown model" not in v.message and "Llama" not in v.message  # no list of built-in names


def test_a_directory_given_relative_to_the_recipe_is_named_without_dot_dots(tmp_path):
    _checkpoint(tmp_path / "models")
    plan = _plan(tmp_path, "/x", "[]", "model=../models/Qwen2.5-72B-Instruct")
    assert plan.model.name == str(tmp_path / "models" / "Qwen2.5-72B-Instruct")


def test_a_misspelt_built_in_name_gets_a_did_you_mean():
    with pytest.raises(ModelError) as info:
        resolve_model("lama-3.3-70b-instruct")
    assert "did you mean 'meta-llama/Llama-3.3-70B-Instruct'?" in info.value.fix
