"""Spec: a new TensorRT-LLM release is regenerated data plus one row, and nothing else. A fake release line 1.9 is added
to a copy of the sources file (a snapshot whose manifest is derived from the newest one, less one option, with one
new option and one new cache transceiver backend; its proxy files, with one new router type; and the line's row),
the data is regenerated with scripts/trtllm_facts.py, and the planner, the importer and the renderer take the new
option, backend and router and refuse the removed option, with no other edit."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import yaml

from toolkit.facts import llm_args, versions
from toolkit.importer import import_doc
from toolkit.plan import build_plan
from toolkit.recipe import load_recipe_text
from toolkit.render import render_files

ROOT = Path(__file__).resolve().parents[2]
FAKE = "f" * 40
MANIFEST = "tensorrt_llm/usage/llm_args_golden_manifest.json"
FAKE_PROXY = "e" * 40
NEW = "cache_transceiver_config.fake_new_knob"  # a bool the fake release adds
REMOVED = "kv_cache_config.enable_partial_reuse"  # a bool every earlier manifest lists, the fake release drops
NEW_BACKEND = "FAKEWIRE"  # a cache_transceiver_config.backend value the fake release adds
NEW_ROUTER = "least_loaded"  # a router type the fake release's create_router adds


def _generator():
    spec = importlib.util.spec_from_file_location("trtllm_facts", ROOT / "scripts" / "trtllm_facts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _proxy_files(root: Path) -> None:
    """The fake release's disagg_utils.py and serve/router.py, written from the newest line's proxy facts in the
    committed data (extract_disagg_cfg's and extract_ctx_gen_cfgs' parameters, DisaggClusterConfig's fields,
    extract_router_config's copied keys, create_router's router_map) plus one router type."""
    proxy = json.loads((ROOT / "toolkit/facts/trtllm_data.json").read_text())["proxy"][versions.supported()[-1]]
    utils = root / FAKE_PROXY / "tensorrt_llm/llmapi/disagg_utils.py"
    utils.parent.mkdir(parents=True)
    server = [k for k in proxy["server"] if k != "router"]
    utils.write_text("\n".join([
        "class DisaggClusterConfig:", *[f"    {k}: str" for k in proxy["cluster"]],
        f"def extract_disagg_cfg({', '.join(proxy['top'])}):", "    pass",
        f"def extract_ctx_gen_cfgs({', '.join(['type', *server])}):", "    pass",
        "def extract_router_config(cfg):", f"    extract_keys = {proxy['router_copied']!r}", ""]))
    router = root / FAKE_PROXY / "tensorrt_llm/serve/router.py"
    router.parent.mkdir(parents=True)
    router.write_text("def create_router(router_config):\n    router_map = {"
                      + ", ".join(f"{r!r}: None" for r in [*proxy["routers"], NEW_ROUTER]) + "}\n")


def _manifest_rows() -> list[dict]:
    """The newest manifest's rows as TensorRT-LLM writes them, rebuilt from the committed data (what the manifest
    itself listed: no section, nothing carried or supplemented)."""
    newest = [s for s in json.loads((ROOT / "toolkit/facts/trtllm_data.json").read_text())["snapshots"]
              if s["kind"] == "manifest"][-1]
    return [{"path": p, "annotation": e["annotation"], "kind": e["kind"], "allowed_values": e.get("allowed", []),
             "converter": e.get("converter", "")}
            for p, e in newest["fields"].items()
            if e["kind"] != "section" and not {"carried", "supplement"} & set(e.get("flags", ()))]


@pytest.fixture(scope="module")
def fake_release(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fake")
    rows = [r for r in _manifest_rows() if r["path"] != REMOVED]
    for row in rows:
        if row["path"] == "cache_transceiver_config.backend":
            row["allowed_values"] = [*row["allowed_values"], NEW_BACKEND]
    rows.append({"path": NEW, "annotation": "<class 'bool'>", "kind": "value", "allowed_values": [], "converter": ""})
    (tmp / "src" / FAKE / MANIFEST).parent.mkdir(parents=True)
    (tmp / "src" / FAKE / MANIFEST).write_text(json.dumps({"TorchLlmArgs": rows}))
    _proxy_files(tmp / "src")
    sources = yaml.safe_load((ROOT / "scripts/trtllm_sources.yaml").read_text())
    sources["snapshots"].append({"id": "manifest@fake", "line": "1.9", "kind": "manifest", "path": MANIFEST,
                                 "commit": FAKE, "first_release": "1.9.0rc0", "last_release": "1.9.0rc1",
                                 "complete": False, "basis": "pinned", "note": "a fake release for this spec"})
    sources["proxy"].append({"lines": ["1.9"], "kind": "disagg_utils", "path": "tensorrt_llm/llmapi/disagg_utils.py",
                             "commit": FAKE_PROXY, "routers_from": {"path": "tensorrt_llm/serve/router.py",
                                                                    "commit": FAKE_PROXY}})
    # a release of the line published after its row was written: listed with its commit, no other edit
    sources["releases"].append({"release": "1.9.0rc2", "commit": FAKE, "published": "2026-12-24"})
    sources["lines"].append({"line": "1.9", "base": "1.4", "release": "1.9.0rc1", "releases": ["1.9.0rc0", "1.9.0rc1"],
                             "notes": ["a fake line"]})
    (tmp / "sources.yaml").write_text(yaml.safe_dump(sources))
    shutil.copy(ROOT / "toolkit/facts/trtllm_data.json", tmp / "data.json")  # the files of the known releases
    assert _generator().main(["--from-dir", str(tmp / "src"), "--reuse", "--sources", str(tmp / "sources.yaml"),
                              "--output", str(tmp / "data.json")]) == 0
    with llm_args.use_data(tmp / "data.json"):
        yield


RECIPE = (ROOT / "recipes/standin-1p1d-1.4.yaml").read_text().replace('trtllm_version: "1.4.0rc1"',
                                                                      'trtllm_version: "1.9.0rc1"')


def _plan(*overrides):
    return build_plan(load_recipe_text(RECIPE, "fake.yaml", list(overrides)))


def test_the_new_line_is_supported_with_its_row(fake_release):
    assert "1.9" in versions.supported() and versions.get("1.9.0rc1").releases == ("1.9.0rc0", "1.9.0rc2")
    assert versions.unknown_release("1.9.0rc2") is None and "1.9.0rc0 .. 1.9.0rc2" in versions.unknown_release("1.9.0rc3")
    assert versions.latest() == "1.2"  # a pre-release line never becomes the default


def test_the_planner_and_renderer_take_the_new_option(fake_release):
    plan = _plan(f"context.extra_options.{NEW}=true")
    assert plan.trtllm_version == "1.9" and plan.target_release == "1.9.0rc1"
    assert not [w for w in plan.warnings if "fake_new_knob" in w]
    assert yaml.safe_load(render_files(plan)["ctx.yaml"])["cache_transceiver_config"]["fake_new_knob"] is True
    # its kind is the data's: a bool, so a value pydantic cannot convert is refused
    with pytest.raises(Exception) as info:
        _plan(f"context.extra_options.{NEW}=maybe")
    assert "is not a boolean" in str(info.value)


SMOKE = (ROOT / "recipes/qwen3-smoke.yaml").read_text() + 'trtllm_version: "1.9.0rc1"\n'


def test_the_planner_and_renderer_take_the_new_backend_and_router(fake_release):
    """Values a recipe field names are the target release's data, checked when the recipe is read: a backend or a
    router type the release adds needs no edit of the recipe schema (no list fixed when tk was imported)."""
    plan = build_plan(load_recipe_text(SMOKE, "fake.yaml", [f"kv_transfer.backend={NEW_BACKEND}",
                                                            f"proxy.generation_router={NEW_ROUTER}"]))
    files = render_files(plan)
    assert yaml.safe_load(files["ctx.yaml"])["cache_transceiver_config"]["backend"] == NEW_BACKEND
    assert yaml.safe_load(files["disagg.yaml"])["generation_servers"]["router"]["type"] == NEW_ROUTER
    # a release before it whose data is pinned (1.4.0rc1's is inferred: warned) has neither: the rules refuse each,
    # naming the field
    with pytest.raises(Exception) as info:
        build_plan(load_recipe_text(SMOKE, "fake.yaml", ["trtllm_version=1.3.0rc19", f"kv_transfer.backend={NEW_BACKEND}",
                                                         f"proxy.generation_router={NEW_ROUTER}"]))
    assert {v.field for v in info.value.violations} == {"kv_transfer.backend", "proxy.generation_router"}
    # a value no release has is still refused when the recipe is read, with the data's values
    with pytest.raises(Exception) as info:
        load_recipe_text(SMOKE, "fake.yaml", ["proxy.generation_router=no_such_router"])
    [v] = info.value.violations
    assert v.field == "proxy.generation_router" and NEW_ROUTER in v.fix and "round_robin" in v.fix


def test_the_planner_refuses_the_removed_option(fake_release):
    with pytest.raises(Exception) as info:
        _plan(f"context.extra_options.{REMOVED}=true")
    [v] = info.value.violations
    assert v.field == f"context.extra_options.{REMOVED}" and "TensorRT-LLM 1.9.0rc1 has no option" in v.message
    _plan("trtllm_version=1.4.0rc1", f"context.extra_options.{REMOVED}=true")  # the release before has it


def test_the_importer_carries_the_new_option_and_reports_the_removed_one(fake_release):
    doc = {"name": "fake", "model": {"path": "Qwen/Qwen3-0.6B", "container": "nvcr.io/nvidia/tensorrt-llm/release:1.9.0rc1"},
           "resources": {"gpu_type": "h100", "gpus_per_node": 8, "prefill_workers": 1, "decode_workers": 1},
           "backend": {"type": "trtllm", "trtllm_config": {
               "prefill": {"tensor_parallel_size": 1, "cache_transceiver_config": {"backend": "NIXL", "fake_new_knob": True}},
               "decode": {"tensor_parallel_size": 1, "kv_cache_config": {"enable_partial_reuse": True},
                          "cache_transceiver_config": {"backend": "NIXL"}}}}}
    result = import_doc(doc, "fake.yaml", site=None)
    assert result.recipe["context"]["extra_options"]["cache_transceiver_config"] == {"fake_new_knob": True}
    [v] = result.violations
    assert v.field == f"generation.extra_options.{REMOVED}" and "1.9.0rc1 has no option" in v.message


def test_the_new_line_s_transceiver_runtime_is_read_with_the_nearest_recorded_default(fake_release):
    """The fake manifest lists transceiver_runtime without a default (a manifest records none; the sources file's
    supplement gives it per snapshot): the plan reads it with the nearest earlier snapshot that records one and
    says so, rather than a default of tk's own."""
    t = _plan().kv_transfer.transceiver
    assert (t.runtime.value, t.runtime_setting) == ("PYTHON", "auto")
    assert "records no default: read as" in t.default_source and "000439672005" in t.default_source
