"""Spec: `tk import` turns an existing TensorRT-LLM disaggregated config into a tk recipe. Everything tk can carry
is carried, what it cannot is listed with the reason, the recipe is planned at once, and bad input gets the file,
line, field and fix, with nothing half-written."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.unit.helpers import tk_in_process
from toolkit import api
from toolkit.errors import RecipeError
from toolkit.importer import import_doc
from toolkit.importer.common import flatten
from toolkit.recipe import load_recipe

# The shape of an NVIDIA/srt-slurm TensorRT-LLM recipe (recipes/trtllm/gb300-fp4/... @ c88ef731), shortened.
SRT = """\
name: "ctx2_gen1_dep8_mtp1"
model:
  path: "dsr1"
  container: "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc24"
  precision: "fp4"
resources:
  gpu_type: "gb300"
  prefill_nodes: 1
  prefill_workers: 2
  decode_workers: 1
  decode_nodes: 2
  gpus_per_node: 4
backend:
  type: trtllm
  prefill_environment:
    TRTLLM_ENABLE_PDL: "1"
    NCCL_GRAPH_MIXING_SUPPORT: "0"
  decode_environment:
    TRTLLM_ENABLE_PDL: "1"
  trtllm_config:
    prefill:
      max_batch_size: 2
      max_num_tokens: 16640
      max_seq_len: 8232
      tensor_parallel_size: 2
      moe_expert_parallel_size: 2
      enable_attention_dp: true
      cuda_graph_config: null
      disable_overlap_scheduler: true
      moe_config: {backend: TRTLLM}
      kv_cache_config: {enable_block_reuse: false, free_gpu_memory_fraction: 0.6, dtype: fp8}
      cache_transceiver_config: {max_tokens_in_buffer: 16384, backend: UCX}
      speculative_config: {decoding_type: MTP, num_nextn_predict_layers: 1}
    decode:
      tensor_parallel_size: 8
      moe_expert_parallel_size: 8
      enable_attention_dp: true
      max_batch_size: 64
      max_num_tokens: 128
      max_seq_len: 9256
      cuda_graph_config: {enable_padding: true, max_batch_size: 64}
      kv_cache_config: {enable_block_reuse: false, free_gpu_memory_fraction: 0.8, dtype: fp8}
      cache_transceiver_config: {max_tokens_in_buffer: 16384, backend: UCX}
      stream_interval: 100
      speculative_config: {decoding_type: MTP, num_nextn_predict_layers: 1}
benchmark:
  type: "sa-bench"
  isl: 8192
  osl: 1024
  concurrencies: "64"
frontend:
  type: "dynamo"
"""


def tk(*args, cwd=None):
    """tk in this process (tests/unit/helpers.py; tests/unit/test_cli.py covers the installed entry point)."""
    return tk_in_process(*args, cwd=cwd)


def test_an_srt_slurm_recipe_becomes_a_recipe_that_plans(tmp_path):
    src = tmp_path / "srt.yaml"
    src.write_text(SRT)
    result = api.import_config(src, output=tmp_path / "r.yaml")
    assert result.ok and result.kind == "srt-slurm", result.violations
    loaded = load_recipe(tmp_path / "r.yaml")
    r = loaded.recipe
    assert loaded.release == "1.3.0rc24" and r.cluster.gpu == "GB300"
    assert (r.context.instances, r.context.tp, r.context.ep, r.context.attention_dp) == (2, 2, 2, True)
    assert (r.context.max_seq_len, r.generation.max_seq_len) == (8232, 9256)
    assert r.context.max_tokens_in_buffer == r.generation.max_tokens_in_buffer == 16384
    assert r.context.launcher_prefix == ["numactl", "-m", "0,1"]  # srt-slurm binds memory on Grace nodes
    assert r.kv_transfer.transport == "nvlink-multi-node" and r.kv_transfer.backend == "UCX"
    assert r.context.env["NCCL_GRAPH_MIXING_SUPPORT"] == "0"
    assert r.speculative.mtp_layers == 1
    ctx = result.plan.context.llm_api_options
    assert ctx["moe_config"] == {"backend": "TRTLLM"} and ctx["cuda_graph_config"] is None
    # the user's cuda_graph_config.max_batch_size replaces tk's batch_sizes list
    assert result.plan.generation.llm_api_options["cuda_graph_config"] == {"enable_padding": True,
                                                                          "max_batch_size": 64}


def test_every_source_option_is_rendered_as_given_or_reported(tmp_path):
    src = tmp_path / "srt.yaml"
    src.write_text(SRT)
    result = api.import_config(src)
    changed = {path for path, _, _ in result.changed}
    doc = yaml.safe_load(SRT)["backend"]["trtllm_config"]
    for src_role, plan_role in (("prefill", result.plan.context), ("decode", result.plan.generation)):
        rendered = flatten(plan_role.llm_api_options)
        for path, value in flatten(doc[src_role]).items():
            assert rendered.get(path) == value or f"{plan_role.title}.{path}" in changed, (src_role, path)


def test_what_tk_cannot_carry_is_listed_with_the_reason_in_the_recipe_and_the_report(tmp_path):
    src = tmp_path / "srt.yaml"
    src.write_text(SRT)
    proc = tk("import", str(src), "-o", str(tmp_path / "r.yaml"))
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "r.yaml").read_text()
    for path in ("benchmark.type", "benchmark.concurrencies", "frontend"):
        assert f"#   {path}: " in text and f"not carried: {path}" in proc.stderr
    assert "model.path 'dsr1'" in proc.stderr  # a site alias: the user must name the checkpoint
    assert "the recipe plans" in proc.stderr and "Traceback" not in proc.stderr


def test_json_output_is_one_document_with_the_recipe(tmp_path):
    src = tmp_path / "srt.yaml"
    src.write_text(SRT)
    proc = tk("import", str(src), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] and doc["kind"] == "srt-slurm" and doc["recipe"]["context"]["tp"] == 2
    assert {d["path"] for d in doc["not_carried"]} >= {"benchmark.type", "frontend"}


def test_an_existing_output_is_never_overwritten_without_force(tmp_path):
    src = tmp_path / "srt.yaml"
    src.write_text(SRT)
    out = tmp_path / "mine.yaml"
    out.write_text("my recipe\n")
    proc = tk("import", str(src), "-o", str(out))
    assert proc.returncode == 2 and "exists already" in proc.stderr and "--force" in proc.stderr
    assert out.read_text() == "my recipe\n"
    assert tk("import", str(src), "-o", str(out), "--force").returncode == 0
    assert out.read_text().startswith("# Imported by `tk import`")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml", "srt.yaml"]  # no temporary left


def test_broken_yaml_is_named_by_file_and_line_and_nothing_is_written(tmp_path):
    src = tmp_path / "srt.yaml"
    src.write_text(SRT.replace("  gpus_per_node: 4", "  gpus_per_node: [4"))
    proc = tk("import", str(src), "-o", str(tmp_path / "r.yaml"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert re.search(r"srt\.yaml:\d+: \(yaml\): not valid YAML", proc.stderr) and "fix:" in proc.stderr
    assert not (tmp_path / "r.yaml").exists()


@pytest.mark.parametrize("text,needle", [
    ("just: a mapping\n", "--kind"),
    ("- a list\n", "not a YAML mapping"),
])
def test_a_file_of_no_known_format_says_which_formats_there_are(tmp_path, text, needle):
    src = tmp_path / "x.yaml"
    src.write_text(text)
    proc = tk("import", str(src))
    assert proc.returncode == 2 and needle in proc.stderr and "srt-slurm" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_missing_source_is_an_error_not_a_traceback(tmp_path):
    proc = tk("import", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "nope.yaml" in proc.stderr and "Traceback" not in proc.stderr


def test_what_tensorrt_llm_refuses_is_refused_with_the_field_and_the_recipe_is_still_written(tmp_path):
    # the context and generation servers must agree on tokens_per_block (the cache transceiver's block layout)
    doc = yaml.safe_load(SRT)
    doc["backend"]["trtllm_config"]["decode"]["kv_cache_config"]["tokens_per_block"] = 64
    doc["backend"]["trtllm_config"]["prefill"]["kv_cache_config"]["tokens_per_block"] = 32
    src = tmp_path / "srt.yaml"
    src.write_text(yaml.safe_dump(doc))
    proc = tk("import", str(src), "-o", str(tmp_path / "r.yaml"))
    assert proc.returncode == 1, proc.stderr
    assert "tokens_per_block" in proc.stderr and (tmp_path / "r.yaml").exists()


def test_a_trtllm_serve_disaggregated_config_with_server_options_imports():
    doc = {"hostname": "localhost", "port": 8000, "backend": "pytorch",
           "context_servers": {"num_instances": 1, "tensor_parallel_size": 1, "max_num_tokens": 4096,
                               "cache_transceiver_config": {"backend": "NIXL"},
                               "urls": ["localhost:8001"]},
           "generation_servers": {"num_instances": 1, "tensor_parallel_size": 1, "max_batch_size": 32,
                                  "cache_transceiver_config": {"backend": "NIXL"},
                                  "urls": ["localhost:8002"]},
           "model": "Qwen/Qwen3-0.6B"}
    result = import_doc(doc, "disagg.yaml")
    assert result.kind == "trtllm-disagg" and result.ok, result.violations
    assert result.recipe["kv_transfer"]["backend"] == "NIXL"
    assert result.recipe["generation"]["max_batch_size"] == 32


def test_a_source_that_is_not_a_disaggregated_config_of_its_kind_is_refused_with_a_fix():
    with pytest.raises(RecipeError) as info:
        import_doc({"backend": {"type": "trtllm", "trtllm_config": {"aggregated": {}}}, "model": {"path": "x"}},
                   "agg.yaml", kind="srt-slurm")
    v = info.value.violations[0]
    assert v.file == "agg.yaml" and v.fix


@pytest.mark.parametrize("breaker", ["\n", "\r", "\x85", "\u2028", "\u2029", "\x0b", "\x0c"])
def test_a_source_key_cannot_write_lines_into_the_recipe(tmp_path, breaker):
    # a benchmark key that ends the header comment line and starts a recipe line of its own
    doc = yaml.safe_load(SRT)
    doc["benchmark"][f"x{breaker}trust_remote_code: true{breaker}#"] = 1
    doc["frontend"] = {f"y{breaker}cluster: {{gpus_per_node: 1}}": 2}
    src = tmp_path / "srt.yaml"
    src.write_text(yaml.safe_dump(doc))
    result = api.import_config(src, output=tmp_path / "r.yaml")
    written = yaml.safe_load((tmp_path / "r.yaml").read_text())
    assert written == result.recipe  # exactly the intended keys: nothing from the header comment
    assert "trust_remote_code" not in written and written["cluster"]["gpus_per_node"] == 4
    assert all(line.startswith("#") for line in result.text.split("\n")
               if line and not line.startswith(tuple("abcdefghijklmnopqrstuvwxyz -")))


def test_json_output_carries_yaml_dates_binary_and_sets_as_text(tmp_path):
    src = tmp_path / "srt.yaml"
    src.write_text(SRT.replace('  concurrencies: "64"\n', '  concurrencies: "64"\n  when: 2024-01-01\n'
                               "  at: 2024-01-01 10:00:00\n  blob: !!binary aGk=\n  tags: !!set {a}\n"
                               "  2024-02-02: keyed by a date\n"))
    proc = tk("import", str(src), "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    dropped = {d["path"]: d["value"] for d in json.loads(proc.stdout)["not_carried"]}
    assert dropped["benchmark.when"] == "2024-01-01" and dropped["benchmark.at"] == "2024-01-01 10:00:00"
    assert dropped["benchmark.2024-02-02"] == "keyed by a date" and dropped["benchmark.tags"] == ["a"]
    assert isinstance(dropped["benchmark.blob"], str)


@pytest.mark.parametrize("old,new,field", [
    ("resources:\n  gpu_type", "resources: 5\nx:\n  gpu_type", "resources"),
    ('model:\n  path: "dsr1"', 'model: "dsr1"\nx:\n  path: "dsr1"', "model"),
    ('benchmark:\n  type: "sa-bench"', 'benchmark: [1]\nx:\n  type: "sa-bench"', "benchmark"),
    ('frontend:\n  type: "dynamo"', 'frontend: dynamo', "frontend"),
    ("  prefill_environment:\n", "  trtllm_config: 7\n  prefill_environment:\n", "backend.trtllm_config"),
])
def test_a_section_of_the_wrong_kind_is_named_with_its_line_and_the_kind_it_must_be(tmp_path, old, new, field):
    src = tmp_path / "srt.yaml"
    text = SRT.replace(old, new)
    if field == "backend.trtllm_config":  # the recipe's own trtllm_config follows: drop it (a duplicate key)
        text = text.replace("  trtllm_config:\n    prefill:", "  x:\n    prefill:")
    src.write_text(text)
    with pytest.raises(RecipeError) as info:
        api.import_config(src, kind="srt-slurm")
    [v] = info.value.violations
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.strip().startswith(field.split(".")[-1] + ":"))
    assert (v.file, v.field, v.line) == (str(src), field, line)
    assert "not a mapping" in v.message and "attribute" not in v.message and field in v.fix


def test_a_trtllm_bench_or_disagg_section_of_the_wrong_kind_is_named():
    doc = {"worker_config": {"ctx": {}, "gen": {}}, "hardware": "8 GPUs"}
    with pytest.raises(RecipeError) as info:
        import_doc(doc, "config.yaml")
    assert info.value.violations[0].field == "hardware"
    doc = {"context_servers": {}, "generation_servers": {}, "conditional_disagg_config": 4}
    with pytest.raises(RecipeError) as info:
        import_doc(doc, "disagg.yaml")
    assert info.value.violations[0].field == "conditional_disagg_config"


def test_the_plan_check_names_the_file_written(tmp_path):
    doc = yaml.safe_load(SRT)
    doc["backend"]["trtllm_config"]["decode"]["kv_cache_config"]["tokens_per_block"] = 64
    doc["backend"]["trtllm_config"]["prefill"]["kv_cache_config"]["tokens_per_block"] = 32
    src = tmp_path / "srt.yaml"
    src.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out5.yaml"
    result = api.import_config(src, output=out)
    assert not result.ok and {v.file for v in result.violations} == {str(out)}
    # each violation's line is the line of its field in the file written
    lines = out.read_text().splitlines()
    for v in result.violations:
        assert v.line is None or v.field.rsplit(".", 1)[-1] in lines[v.line - 1], (v, lines[v.line - 1])
    on_stdout = api.import_config(src)
    assert {v.file for v in on_stdout.violations} == {"<stdout>"}


def test_the_plan_check_reads_the_site_file_as_tk_plan_does(tmp_path, monkeypatch):
    src = tmp_path / "srt.yaml"
    src.write_text(SRT)
    site = tmp_path / "site.yaml"
    site.write_text("kv_transfer:\n  runtime: PYTHON\n")  # the Python transceiver takes only NIXL; SRT's is UCX
    monkeypatch.setenv("TK_SITE", str(site))
    result = api.import_config(src, output=tmp_path / "r.yaml")
    assert not result.ok and any("Python transceiver" in v.message for v in result.violations)
    plan = tk_plan_violations(tmp_path / "r.yaml")
    assert {v.message for v in plan} == {v.message for v in result.violations}


def tk_plan_violations(path):
    from toolkit.plan import build_plan

    with pytest.raises(RecipeError) as info:
        build_plan(load_recipe(path))
    return info.value.violations


@pytest.mark.parametrize("path,precision,model,quantization", [
    ("dsr1", "fp4", "deepseek-ai/DeepSeek-R1", "nvfp4"),  # NVIDIA's NVFP4 checkpoint
    ("dsr1", "fp8", "deepseek-ai/DeepSeek-R1", "fp8_block"),  # DeepSeek's own block-scaled FP8
    ("DeepSeek-R1-0528", "fp8", "deepseek-ai/DeepSeek-R1", "fp8_block"),
    ("dsr1-fp8", "fp4", "deepseek-ai/DeepSeek-R1", "fp8_block"),  # the alias names FP8 weights
    ("hf:openai/gpt-oss-120b", "fp4", "openai/gpt-oss-120b", "mxfp4"),  # OpenAI's MXFP4 checkpoint, not NVFP4
    ("/models/gpt-oss-120b", "fp4", "openai/gpt-oss-120b", "mxfp4"),
    ("nvidia/Kimi-K2.5-NVFP4", "fp4", "moonshotai/Kimi-K2-Instruct", "nvfp4"),
    ("hf:nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4", "fp4", "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4",
     "nvfp4"),
])
def test_srt_slurm_precision_becomes_the_checkpoints_quantization_per_model(path, precision, model, quantization):
    doc = yaml.safe_load(SRT)
    doc["model"].update(path=path, precision=precision)
    result = import_doc(doc, "srt.yaml", kind="srt-slurm")
    assert (result.recipe["model"], result.recipe["quantization"]) == (model, quantization)


def test_the_layout_fixture_is_derived_with_the_importers_model_table():
    import importlib.util
    from pathlib import Path

    from toolkit.importer import srtslurm

    path = Path(__file__).resolve().parents[1] / "fixtures" / "srt_slurm" / "derive.py"
    spec = importlib.util.spec_from_file_location("derive_layouts", path)
    derive = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(derive)
    assert derive.srt_model is srtslurm.srt_model and not hasattr(derive, "MODELS")
    layouts = json.loads((path.parent / "trtllm_layouts.json").read_text())["layouts"]
    assert {(row["model"], row["quantization"]) for row in layouts} <= {
        srtslurm.srt_model(p, q)[::2] for p in ("dsr1", "dsr1-fp8", "hf:openai/gpt-oss-120b", "nvidia/Kimi-K2.5-NVFP4")
        for q in ("fp4", "fp8")}


def test_the_report_shows_a_source_key_with_control_characters_escaped(tmp_path):
    doc = yaml.safe_load(SRT)
    doc["benchmark"]["x\x1b[2J\ny"] = 1
    src = tmp_path / "srt.yaml"
    src.write_text(yaml.safe_dump(doc))
    proc = tk("import", str(src), "-o", str(tmp_path / "r.yaml"))
    assert proc.returncode == 0 and "\x1b" not in proc.stderr
    assert "not carried: benchmark.x\\x1b[2J\\ny:" in proc.stderr


def test_keys_tk_does_not_know_are_listed_as_not_understood_with_their_path():
    """Nothing vanishes: a key no importer rule reads (a new srt-slurm section, a new resources knob, a new backend
    setting, a new key in a role's options' neighbours) is listed, and the header does not claim nothing else was
    dropped."""
    doc = yaml.safe_load(SRT)
    doc["new_section"] = {"knob": 1}
    doc["resources"]["new_knob"] = 3
    doc["backend"]["new_backend_knob"] = "x"
    doc["model"]["new_model_knob"] = [1, 2]
    result = import_doc(doc, "new.yaml", site=None)
    dropped = {d.path: d for d in result.ledger.dropped}
    for path, value in (("new_section.knob", 1), ("resources.new_knob", 3), ("backend.new_backend_knob", "x"),
                        ("model.new_model_knob", [1, 2])):
        assert path in dropped and dropped[path].value == value, sorted(dropped)
        assert "not understood" in dropped[path].why
        assert f"#   {path}: " in result.text
    assert "nothing else was dropped" not in result.text
    # what the importer reads is not listed: the known keys are carried or dropped with their own reason
    assert not [p for p, d in dropped.items() if "not understood" in d.why and not p.split(".")[0].startswith("new")
                and "new_" not in p]


def test_a_source_whose_every_key_is_read_says_nothing_else_was_dropped():
    doc = yaml.safe_load(SRT)
    result = import_doc(doc, "known.yaml", site=None)
    assert not [d for d in result.ledger.dropped if "not understood" in d.why], result.ledger.dropped
