"""Spec: which TensorRT-LLM line a recipe targets. Version text (patch releases, pre-releases), the tag of the
container image (W1: derived when the recipe names no version, a contradiction refused, an unreadable tag a
warning)."""

from __future__ import annotations

import pytest

from toolkit.errors import RecipeError
from toolkit.facts import llm_args, trtllm, versions
from toolkit.plan import build_plan
from toolkit.recipe import load_recipe, load_recipe_text
from tests.conftest import RECIPES

IMG = "nvcr.io/nvidia/tensorrt-llm/release"
PYXIS_IMG = "nvcr.io#nvidia/tensorrt-llm/release"  # as the fixes spell it, and as launch.sbatch renders it
RECIPE = """\
schema_version: 1
name: t
model: meta-llama/Llama-3.1-8B-Instruct  # fits one H100 in bf16
cluster:
  gpus_per_node: 8
  container_image: {image}
"""


def loaded(image: str, *overrides: str, version: str | None = None):
    text = RECIPE.format(image=image) + (f'trtllm_version: "{version}"\n' if version else "")
    return load_recipe_text(text, "r.yaml", list(overrides))


def refused(image: str, *overrides: str, version: str | None = None):
    with pytest.raises(RecipeError) as info:
        build_plan(loaded(image, *overrides, version=version))
    [v] = info.value.violations
    return v


# --- version text ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,line,pre", [
    ("1.2", "1.2", False), ("1.2.0", "1.2", False), ("1.2.1", "1.2", False), ("1.0.0", "1.0", False),
    ("1.2.0rc3", "1.2", True), ("1.2.0rc6.post1", "1.2", True), ("1.1.0.post2", "1.1", False),
    ("1.3.0rc1", "1.3", True),
])
def test_versions_map_to_their_release_line(text, line, pre):
    v = versions.parse_version(text)
    assert (v.line, v.prerelease) == (line, pre)


@pytest.mark.parametrize("text", ["", "1", "v1.2", "1.2.0-rc1", "latest", "1.2.0\n", "1.2.x", "１.２"])
def test_what_is_not_a_version(text):
    assert versions.parse_version(text) is None


@pytest.mark.parametrize("text,line", [("1.2.1", "1.2"), ("1.0.0", "1.0"), ("1.1.0rc5", "1.1")])
def test_patch_and_pre_releases_select_their_line_in_a_recipe(text, line):
    assert trtllm.get(text).line == line
    text_recipe = RECIPE.format(image=f"{IMG}:{text}") + f'trtllm_version: "{text}"\n'
    plan = build_plan(load_recipe_text(text_recipe, "r.yaml"))
    assert plan.trtllm_version == line


# --- image tags ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("image,text", [
    (f"{IMG}:1.0.0", "1.0.0"), (f"{IMG}:1.2.0rc3", "1.2.0rc3"), (f"{IMG}:1.2.1", "1.2.1"),
    (f"{IMG}:v1.1.0", "1.1.0"), ("nvcr.io#nvidia/tensorrt-llm/release:1.2.0", "1.2.0"),
    (f"{IMG}:1.2.0@sha256:" + "a" * 64, "1.2.0"), ("nvcr.io/nvidia/tensorrt-llm/devel:1.1.0", "1.1.0"),
    ("registry.local:5000/nvidia/tensorrt-llm/release:1.0.0", "1.0.0"),
])
def test_readable_image_tags(image, text):
    assert versions.image_version(image).version.text == text


@pytest.mark.parametrize("image,why", [
    (f"{IMG}@sha256:" + "a" * 64, "digest"), (IMG, "no tag"), (f"{IMG}:latest", "not a TensorRT-LLM version"),
    ("nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:0.5.0", "not one of NVIDIA's TensorRT-LLM images"),
    ("/images/trtllm-1.2.0.sqsh", "image file"), ("myorg/trtllm:1.2.0", "not one of"),
])
def test_unreadable_image_tags_say_why(image, why):
    found = versions.image_version(image)
    assert found.version is None and why in found.reason


# --- W1: derive, refuse, warn ----------------------------------------------------------------------------------

@pytest.mark.parametrize("tag,line", [("1.0.0", "1.0"), ("1.1.0", "1.1"), ("1.2.1", "1.2")])
def test_the_line_is_derived_from_the_image_when_the_recipe_names_none(tag, line):
    lr = loaded(f"{IMG}:{tag}")
    assert (lr.recipe.trtllm_version, lr.version_source) == (line, "image")
    plan = build_plan(lr)
    assert plan.trtllm_version == line and plan.recipe["trtllm_version"] == line
    ct = plan.context.llm_api_options["cache_transceiver_config"]
    assert ("kv_transfer_timeout_ms" in ct) == (line == "1.2")  # 1.0/1.1 options for a 1.0/1.1 container


def test_without_an_image_the_default_is_the_newest_line():
    text = RECIPE.replace("  container_image: {image}\n", "")
    lr = load_recipe_text(text, "r.yaml")
    assert (lr.recipe.trtllm_version, lr.version_source, lr.warnings) == (versions.latest(), "default", ())


def test_a_version_written_in_the_file_that_contradicts_the_image_is_refused_at_its_line():
    v = refused(f"{IMG}:1.0.0", version="1.2")
    assert (v.file, v.line, v.field) == ("r.yaml", 7, "trtllm_version")
    assert "contradicts" in v.message and "1.0.0" in v.message
    assert f"{PYXIS_IMG}:1.2.0" in v.fix and "remove trtllm_version" in v.fix


def test_set_trtllm_version_on_a_shipped_recipe_needs_the_image_too():
    path = next(p for p in RECIPES if p.stem == "llama-3.1-8b-1node")
    with pytest.raises(RecipeError) as info:
        build_plan(load_recipe(path, ["trtllm_version=1.0"]))
    [v] = info.value.violations
    assert (v.file, v.field) == ("--set trtllm_version=1.0", "trtllm_version")
    assert f"--set cluster.container_image={PYXIS_IMG}:1.0.0" in v.fix and "drop --set trtllm_version" in v.fix
    plan = build_plan(load_recipe(path, ["trtllm_version=1.0", f"cluster.container_image={IMG}:1.0.0"]))
    assert plan.trtllm_version == "1.0" and plan.slurm.container_image == f"{PYXIS_IMG}:1.0.0"


def test_set_image_alone_that_contradicts_the_files_version_blames_the_image():
    v = refused(f"{IMG}:1.2.0", f"cluster.container_image={IMG}:1.0.0", version="1.2")
    assert v.field == "cluster.container_image" and v.file.startswith("--set cluster.container_image=")
    assert "trtllm_version is 1.2" in v.message


def test_an_image_of_a_line_tk_has_no_facts_for_is_refused():
    v = refused(f"{IMG}:1.9.0rc1")
    assert v.field == "cluster.container_image" and "1.9.0rc1" in v.message
    assert f"{PYXIS_IMG}:1.2.0" in v.fix


@pytest.mark.parametrize("version,line", [("1.4.0rc1", "1.4"), ("1.4.0rc0", "1.4"), ("1.3.0rc27", "1.3")])
def test_the_1_4_line_and_1_3_0rc27_images_plan_with_their_release(version, line):
    plan = build_plan(loaded(f"{IMG}:{version}"))
    assert (plan.trtllm_version, plan.target_release) == (line, version)
    assert not [w for w in plan.warnings if "that tk knows of" in w]


def test_a_1_3_pre_release_image_selects_the_1_3_line_and_its_release():
    lr = loaded(f"{IMG}:1.3.0rc23")
    assert (lr.recipe.trtllm_version, lr.version_source, lr.release) == ("1.3", "image", "1.3.0rc23")
    plan = build_plan(lr)
    assert (plan.trtllm_version, plan.target_release) == ("1.3", "1.3.0rc23")
    # rc23 lies between the facts' 1.3 snapshots: the warning names both
    assert any("pre-release (1.3.0rc23)" in w and "1.3.0rc18..1.3.0rc20" in w for w in plan.warnings)


@pytest.mark.parametrize("version", [None, "1.1"])
def test_an_unreadable_tag_is_a_plan_warning_not_an_error(version):
    plan = build_plan(loaded(f"{IMG}@sha256:" + "b" * 64, version=version))
    [w] = [w for w in plan.warnings if "cannot read the TensorRT-LLM version" in w]
    assert "digest" in w
    if version:
        assert plan.trtllm_version == "1.1" and "trtllm_version 1.1" in w
    else:
        assert plan.trtllm_version == versions.latest() and "set trtllm_version" in w


def test_a_pre_release_image_is_named_in_a_warning():
    plan = build_plan(loaded(f"{IMG}:1.2.0rc5"))
    assert plan.trtllm_version == "1.2"
    assert any("pre-release (1.2.0rc5)" in w for w in plan.warnings)


@pytest.mark.parametrize("version,image,field", [
    ("1.2.99", f"{IMG}:1.2.99", "trtllm_version '1.2.99'"),  # said once, for the field the user wrote
    ("1.2", f"{IMG}:1.2.99", f"cluster.container_image '{IMG}:1.2.99' (tag 1.2.99)"),
    (None, f"{IMG}:1.3.0rc99", f"cluster.container_image '{IMG}:1.3.0rc99' (tag 1.3.0rc99)"),
])
def test_a_release_tk_does_not_know_was_published_is_a_warning_naming_the_known_releases(version, image, field):
    plan = build_plan(loaded(image, version=version))
    [w] = [w for w in plan.warnings if "that tk knows of" in w]
    line = versions.parse_version(image.rsplit(":", 1)[1]).line
    first, last = versions.get(line).releases
    assert w.startswith(f"{field}: TensorRT-LLM has no release") and f"{first} .. {last}" in w
    assert plan.trtllm_version == line


@pytest.mark.parametrize("version", ["1.2", "1.2.0", "1.2.0rc6.post1", "1.0.0rc0", "1.1.0", "1.3.0rc24",
                                     "1.2.1"])  # 1.2.1: on PyPI (pip index versions tensorrt-llm), a stub sdist
def test_a_known_release_or_a_line_alone_is_not_warned(version):
    text = RECIPE.format(image=f"{IMG}:{version}") if version != "1.2" else RECIPE.format(image=f"{IMG}:1.2.0")
    plan = build_plan(load_recipe_text(text + f'trtllm_version: "{version}"\n', "r.yaml"))
    assert not [w for w in plan.warnings if "that tk knows of" in w]


def test_a_section_given_as_a_list_says_it_must_be_a_mapping():
    with pytest.raises(RecipeError) as info:
        loaded(f"{IMG}:1.2.0", "context=[1,2]")
    [v] = info.value.violations
    assert v.field == "context" and "mapping" in v.message and v.fix.startswith("give a mapping")
    assert "RoleSpec" not in v.message and "type model" not in v.fix


def test_the_stand_in_does_not_read_the_image():
    text = ("schema_version: 1\nname: s\nengine: standin\nmodel: tk/standin-tiny\ncluster:\n  gpus_per_node: 1\n"
            f"  gpu: CPU\n  container_image: {IMG}:1.0.0\ntrtllm_version: \"1.2\"\n")
    lr = load_recipe_text(text, "r.yaml")
    assert (lr.recipe.trtllm_version, lr.warnings) == ("1.2", ())


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_shipped_recipe_is_coherent(path):
    lr = load_recipe(path)
    plan = build_plan(lr)
    image = lr.recipe.cluster.container_image
    if image and lr.recipe.engine == "trtllm":
        assert lr.version_source in ("image", "recipe")
        assert versions.image_version(image).version.line == plan.trtllm_version
    assert not any("cannot read" in w for w in plan.warnings)


# --- W4: keys whose acceptance by a line is unverified --------------------------------------------------------

def test_every_unverified_key_has_one_facts_row_with_a_default_and_a_source():
    for fact in trtllm.option_facts():
        assert fact.source and fact.default is not None
        for line in versions.supported():
            assert trtllm.acceptance(trtllm.get(line), fact) in (llm_args.Verdict.KNOWN, llm_args.Verdict.UNSURE)
    [tpb] = [f for f in trtllm.option_facts() if f.dotted == "kv_cache_config.tokens_per_block"]
    assert tpb.default == 32 and trtllm.acceptance(trtllm.get("1.0"), tpb) == llm_args.Verdict.UNSURE
    assert trtllm.acceptance(trtllm.get("1.2"), tpb) == llm_args.Verdict.KNOWN


@pytest.mark.parametrize("tag,written", [("1.0.0", False), ("1.1.0", True), ("1.2.0", True)])
def test_tokens_per_block_at_the_default_is_left_out_where_acceptance_is_unverified(tag, written):
    plan = build_plan(loaded(f"{IMG}:{tag}"))
    for role in plan.roles:
        assert ("tokens_per_block" in role.llm_api_options["kv_cache_config"]) == written
    assert not any("tokens_per_block" in w for w in plan.warnings)
    assert plan.kv.tokens_per_block == 32  # sizing still uses it: it is the engine's value either way


def test_tokens_per_block_off_the_default_is_kept_with_a_warning_on_an_unverified_line():
    plan = build_plan(loaded(f"{IMG}:1.0.0", "kv_transfer.tokens_per_block=64"))
    assert all(r.llm_api_options["kv_cache_config"]["tokens_per_block"] == 64 for r in plan.roles)
    [w] = [w for w in plan.warnings if "tokens_per_block" in w]
    assert "= 64" in w and "TensorRT-LLM 1.0" in w and "PR #5911" in w and "use 32" in w
    plan = build_plan(loaded(f"{IMG}:1.2.0", "kv_transfer.tokens_per_block=64"))
    assert not any("tokens_per_block" in w for w in plan.warnings)


def test_repeating_an_omitted_key_in_extra_options_says_why_it_is_left_out():
    v = refused(f"{IMG}:1.0.0", "context.extra_options.kv_cache_config.tokens_per_block=32")
    assert v.field == "context.extra_options.kv_cache_config.tokens_per_block"
    assert "leaves kv_cache_config.tokens_per_block out for TensorRT-LLM 1.0" in v.message


# --- W5: MTP adds KV layers ------------------------------------------------------------------------------------

def _deepseek(*overrides):
    path = next(p for p in RECIPES if p.stem == "deepseek-r1-gb200")
    return build_plan(load_recipe(path, list(overrides)))


@pytest.mark.parametrize("line", ["1.0", "1.1", "1.2"])
def test_released_lines_allocate_one_kv_layer_per_mtp_layer(line):
    v = trtllm.get(line)
    assert [versions.mtp_kv_layers(v, n) for n in (0, 1, 3)] == [0, 1, 3]


def test_the_1_3_line_allocates_one_kv_layer_for_mtp_eagle_one_model():
    # speculative/utils.py @ 011d0933 (2026): get_num_spec_layers returns 1 for MTP-Eagle one-model
    v = trtllm.get("1.3")
    assert [versions.mtp_kv_layers(v, n) for n in (0, 1, 3)] == [0, 1, 1]


def test_deepseek_r1_with_mtp3_moves_64_layers_of_576_bytes_in_fp8():
    plan = _deepseek()
    assert (plan.kv.num_layers, plan.kv.bytes_per_token_per_layer, plan.kv.bytes_per_token) == (64, 576, 36_864)
    assert plan.kv.largest_request_bytes == 36_864 * 8192
    for role in plan.roles:  # MLA: the latent is not split by TP; pp=1 holds all 61 + 3 layers
        assert (role.kv.layers_per_rank, role.kv.bytes_per_token_per_rank) == (64, 36_864)
    assert plan.kv.ctx_bytes_per_token_per_rank == plan.kv.gen_bytes_per_token_per_rank == 36_864
    assert plan.estimates.largest_request_transfer_ms == round(36_864 * 8192 / 50e9 * 1e3, 3)


def test_without_mtp_deepseek_r1_moves_its_61_layers():
    plan = _deepseek("speculative.mtp_layers=0")
    assert (plan.kv.num_layers, plan.kv.bytes_per_token) == (61, 35_136)


def test_mtp_layers_sit_on_the_last_pipeline_rank():
    plan = _deepseek("context.pp=2", "context.instances=1", "context.ep=4")
    # 61 layers over pp=2: ranks hold 31 and 30 (tensor_split); the last adds the 3 MTP layers -> 33
    assert plan.context.kv.layers_per_rank == 33 and plan.generation.kv.layers_per_rank == 64


def test_validation_payloads_carry_the_mtp_layers():
    from toolkit.validate.params import Options, geometry

    plan = _deepseek()
    geom, _, _ = geometry(plan, Options(max_memory_mb=1 << 16))
    assert geom["layers_per_rank"] == 64 and geom["bytes_per_token_full"] == 36_864


# --- what changes for a deployment of a line: the line's row, shown by tk plan ----------------------------------

STANDIN_14 = next(p for p in RECIPES if p.name == "standin-1p1d-1.4.yaml")

def test_tk_plan_says_what_a_1_4_deployment_does_differently():
    """The 1.4 row's changes (the Python transceiver by default with NIXL, the agent bounce keys unverified, the
    bounce environment knobs) are the plan's and tk plan shows them; a line with none shows nothing."""
    from tests.unit.helpers import tk_in_process
    from toolkit.api import plan_summary

    plan = build_plan(load_recipe(STANDIN_14))
    assert plan.trtllm_changes == versions.get("1.4").changes and len(plan.trtllm_changes) >= 3
    text = " ".join(plan.trtllm_changes)
    assert "Python transceiver" in text and "agent_bounce_buffer_enable" in text and "TRTLLM_NIXL_BOUNCE_" in text
    assert plan_summary(plan)["trtllm_changes"] == list(plan.trtllm_changes)
    proc = tk_in_process("plan", str(STANDIN_14), env={"COLUMNS": "200"})
    assert proc.returncode == 0 and "TensorRT-LLM 1.4 changes:" in proc.stderr
    assert "agent_bounce_buffer_enable" in proc.stderr
    assert build_plan(loaded(f"{IMG}:1.2.0")).trtllm_changes == ()
