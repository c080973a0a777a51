"""scripts/trtllm_facts.py turns TensorRT-LLM's own files into toolkit/facts/trtllm_data.json, and the data file
names the commit of everything it was generated from."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

from toolkit.facts import llm_args
from toolkit.facts import versions

ROOT = Path(__file__).resolve().parents[2]
DATA = json.loads((ROOT / "toolkit" / "facts" / "trtllm_data.json").read_text())
SOURCES = yaml.safe_load((ROOT / "scripts" / "trtllm_sources.yaml").read_text())
COMMIT = re.compile(r"[0-9a-f]{40}")


def _generator():
    spec = importlib.util.spec_from_file_location("trtllm_facts", ROOT / "scripts" / "trtllm_facts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()

# --- the committed data file -------------------------------------------------------------------------------------


def test_every_snapshot_read_from_a_file_names_its_repository_path_and_commit():
    assert DATA["repo"] == "NVIDIA/TensorRT-LLM"
    for snap in DATA["snapshots"]:
        if snap["kind"] == "hand":  # tk's tables from before the generator: the note says what they are
            assert snap["note"] and not snap.get("source"), snap["id"]
            continue
        src = snap["source"]
        assert src["repo"] == "NVIDIA/TensorRT-LLM" and COMMIT.fullmatch(src["commit"]), snap["id"]
        assert src["path"] in ("tensorrt_llm/usage/llm_args_golden_manifest.json", "tensorrt_llm/llmapi/llm_args.py")
        assert snap["first_release"] and snap["last_release"], snap["id"]


def test_env_and_proxy_facts_name_their_sources():
    for line, sides in DATA["env"].items():
        for side, block in sides.items():
            assert block["names"] and block["sources"], (line, side)
            for src in block["sources"]:
                assert src["kind"] == "hand" and src["note"] or COMMIT.fullmatch(src["commit"]), (line, side)
    for line, proxy in DATA["proxy"].items():
        assert {"context_servers", "generation_servers"} <= set(proxy["top"]), line
        for src in proxy["sources"]:
            assert src["kind"] == "hand" and src["note"] or COMMIT.fullmatch(src["commit"]), line


def test_the_data_file_is_generated_from_the_sources_file_as_committed():
    """Someone who edits scripts/trtllm_sources.yaml regenerates the data (python scripts/trtllm_facts.py ...)."""
    assert [s["id"] for s in DATA["snapshots"]] == [s["id"] for s in SOURCES["snapshots"]]
    for mine, theirs in zip(DATA["snapshots"], SOURCES["snapshots"]):
        assert mine["line"] == theirs["line"] and mine.get("source", {}).get("commit") == theirs.get("commit")
        assert (mine["first_release"], mine["last_release"]) == (theirs["first_release"], theirs["last_release"])
    assert [(r["old"], r["new"]) for r in DATA["renames"]] == [(r["old"], r["new"]) for r in SOURCES["renames"]]
    assert set(DATA["env"]) == set(DATA["proxy"]) == set(versions.supported())


def test_every_supported_line_has_facts_and_the_newest_manifest_lists_the_1_3_transceiver_fields():
    for line in versions.supported():  # its own snapshots, or (a line before its first manifest) the nearest ones
        assert llm_args.snapshots_of(line), line
    newest = DATA["snapshots"][-1]
    assert newest["kind"] == "manifest"
    for key in ("transceiver_runtime", "kv_transfer_poll_interval_ms", "kv_cache_bounce_size_mb",
                "enable_pipelined_transfer"):
        assert f"cache_transceiver_config.{key}" in newest["fields"]
    assert "kv_cache_config.block_reuse_config.policy" in newest["fields"]
    assert "kv_cache_config.block_reuse_policy" not in newest["fields"]


# --- the generator on small inputs ---------------------------------------------------------------------------------

LLM_ARGS = '''
from enum import Enum
from typing import Literal, Optional, Dict
from pydantic import BaseModel

class Backend(str, Enum):
    UCX = "UCX"
    NIXL = "NIXL"

class CacheTransceiverConfig(BaseModel):
    backend: Optional[Literal["DEFAULT", "UCX", "NIXL"]] = None
    max_tokens_in_buffer: Optional[int] = None

class KvCacheConfig(BaseModel):
    enable_block_reuse: bool = True
    dtype: str = "auto"

class BaseLlmArgs(BaseModel):
    model: str
    tensor_parallel_size: int = 1
    kv_cache_config: KvCacheConfig = KvCacheConfig()
    _private: int = 0

class TorchLlmArgs(BaseLlmArgs):
    cache_transceiver_config: Optional[CacheTransceiverConfig] = None
    moe_config: Dict[str, int] = {}
    backend_enum: Backend = Backend.UCX
'''

MANIFEST = {"TorchLlmArgs": [
    {"path": "tensor_parallel_size", "annotation": "int", "kind": "value"},
    {"path": "kv_cache_config.enable_block_reuse", "annotation": "bool", "kind": "value"},
    {"path": "cache_transceiver_config.backend", "annotation": "Optional[Literal]", "kind": "categorical",
     "allowed_values": ["DEFAULT", "UCX", "NIXL"]},
    {"path": "cache_transceiver_config.transceiver_runtime", "annotation": "Optional[Literal]",
     "kind": "categorical", "allowed_values": ["CPP", "PYTHON"]},
]}
C1, C2 = "1" * 40, "2" * 40


@pytest.fixture
def small_sources(tmp_path):
    files = {(C1, "tensorrt_llm/llmapi/llm_args.py"): LLM_ARGS,
             (C2, "tensorrt_llm/usage/llm_args_golden_manifest.json"): json.dumps(MANIFEST),
             (C2, "cpp/tensorrt_llm/common/envUtils.cpp"): 'getIntEnv("TRTLLM_A"); std::getenv("TRTLLM_B");',
             (C2, "tensorrt_llm/envs.py"): 'ENV_SPECS = {"TRTLLM_C": 1, "TLLM_D": 2}\n'}
    for (commit, path), text in files.items():
        (tmp_path / "src" / commit / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / commit / path).write_text(text)
    sources = {
        "repo": "NVIDIA/TensorRT-LLM", "raw_url": "https://example.invalid/{repo}/{commit}/{path}",
        "snapshots": [
            {"id": "old", "line": "9.0", "kind": "llm_args", "path": "tensorrt_llm/llmapi/llm_args.py",
             "commit": C1, "first_release": "9.0.0", "last_release": "9.0.1", "complete": True, "basis": "pinned"},
            {"id": "new", "line": "9.1", "kind": "manifest",
             "path": "tensorrt_llm/usage/llm_args_golden_manifest.json", "commit": C2,
             "first_release": "9.1.0rc0", "last_release": "9.1.0rc3", "complete": False, "basis": "inferred"}],
        "renames": [{"old": "a.b", "new": "a.c.b", "pr": "#1"}],
        "env": [{"lines": ["9.1"], "side": "cpp", "kind": "envutils", "path": "cpp/tensorrt_llm/common/envUtils.cpp",
                 "commit": C2},
                {"lines": ["9.1"], "side": "python", "kind": "envs_registry", "path": "tensorrt_llm/envs.py",
                 "commit": C2}],
    }
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump(sources))
    return sources, path, tmp_path / "src"


def test_llm_args_py_is_read_field_by_field_with_values_and_sections(small_sources):
    sources, _, src = small_sources
    data = gen.generate(sources, src)
    old = data["snapshots"][0]
    assert old["source"] == {"repo": "NVIDIA/TensorRT-LLM", "path": "tensorrt_llm/llmapi/llm_args.py",
                             "commit": C1}
    fields = old["fields"]
    assert fields["cache_transceiver_config"]["kind"] == "section"
    assert fields["cache_transceiver_config.backend"]["allowed"] == ["DEFAULT", "UCX", "NIXL"]
    assert fields["backend_enum"]["allowed"] == ["UCX", "NIXL"]  # an Enum's values
    assert "opaque" in fields["moe_config"]["flags"]  # a dict: TensorRT-LLM takes any keys below it
    assert "uncapturable" in fields["model"]["flags"]  # a str: the manifest cannot list it
    assert "_private" not in fields and "kv_cache_config.dtype" in fields
    assert old["complete_sections"] == ["*"]


def test_a_manifest_snapshot_carries_what_the_manifest_cannot_capture_from_the_complete_llm_args(small_sources):
    sources, _, src = small_sources
    new = gen.generate(sources, src)["snapshots"][1]
    fields = new["fields"]
    assert fields["cache_transceiver_config.transceiver_runtime"]["allowed"] == ["CPP", "PYTHON"]
    assert fields["cache_transceiver_config"]["kind"] == "section"  # every captured path's parents are sections
    assert "carried" in fields["model"]["flags"] and fields["model"]["carried_from"] == "old"
    # a capturable field the manifest leaves out is absent, not carried: its absence is the news
    assert "cache_transceiver_config.max_tokens_in_buffer" not in fields


def test_env_names_come_from_envutils_and_the_python_registry(small_sources):
    sources, _, src = small_sources
    env = gen.generate(sources, src)["env"]["9.1"]
    assert env["cpp"]["names"] == ["TRTLLM_A", "TRTLLM_B"]
    assert env["python"]["names"] == ["TLLM_D", "TRTLLM_C"]
    assert env["cpp"]["sources"][0]["commit"] == C2


def test_one_command_writes_the_data_file_and_check_reports_drift(small_sources, tmp_path, capsys):
    _, sources_path, src = small_sources
    out = tmp_path / "data.json"
    args = ["--from-dir", str(src), "--sources", str(sources_path), "--output", str(out)]
    assert gen.main(args) == 0
    data = json.loads(out.read_text())
    assert [s["id"] for s in data["snapshots"]] == ["old", "new"]
    assert gen.main([*args, "--check"]) == 0
    out.write_text(out.read_text().replace('"TRTLLM_A"', '"TRTLLM_Z"'))
    assert gen.main([*args, "--check"]) == 1
    assert "TRTLLM_A" in capsys.readouterr().out


def test_a_missing_source_file_is_named_and_nothing_is_written(small_sources, tmp_path, capsys):
    _, sources_path, src = small_sources
    (src / C2 / "tensorrt_llm/envs.py").unlink()
    out = tmp_path / "data.json"
    assert gen.main(["--from-dir", str(src), "--sources", str(sources_path), "--output", str(out)]) == 2
    assert "tensorrt_llm/envs.py" in capsys.readouterr().err and not out.exists()


# --- what the option checks make of the data ---------------------------------------------------------------------


def test_a_key_of_every_snapshot_of_a_line_is_known_and_one_no_version_has_gets_a_did_you_mean():
    target = llm_args.Target("1.3", "1.3.0rc19")  # manifest@92e3075: pinned
    assert llm_args.status(target, "cache_transceiver_config.max_tokens_in_buffer").verdict is llm_args.Verdict.KNOWN
    st = llm_args.status(target, "cache_transceiver_config.max_tokens_in_bufer")
    assert st.verdict is llm_args.Verdict.ABSENT and "max_tokens_in_buffer" in st.fix


def test_every_snapshot_says_whether_its_releases_are_pinned_or_inferred():
    """The sources file marks each snapshot; the data carries it. The 1.4 bracket (manifest @ 0004396, for
    1.3.0rc27 .. 1.4.0rc1) is inferred: no file at those releases' tags could be read."""
    assert [s["basis"] for s in DATA["snapshots"]] == [s["basis"] for s in SOURCES["snapshots"]]
    assert {s["basis"] for s in DATA["snapshots"]} <= {"pinned", "inferred"}
    basis = {s.id: s.basis for s in llm_args.snapshots()}
    assert basis["manifest@0004396"] is llm_args.Basis.INFERRED
    assert basis["manifest@92e3075"] is basis["llm_args@3e906a0e"] is llm_args.Basis.PINNED


def test_the_generator_carries_each_snapshot_s_basis_and_names_one_that_lacks_it(small_sources, tmp_path, capsys):
    sources, sources_path, src = small_sources
    data = gen.generate(sources, src)
    assert [s["basis"] for s in data["snapshots"]] == ["pinned", "inferred"]
    sources["snapshots"][1]["basis"] = "guessed"
    sources_path.write_text(yaml.safe_dump(sources))
    out = tmp_path / "data.json"
    assert gen.main(["--from-dir", str(src), "--sources", str(sources_path), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "new" in err and "basis" in err and "pinned" in err and not out.exists()


@pytest.mark.parametrize("release", ["1.3.0rc27", "1.4.0rc1"])
def test_a_key_an_inferred_snapshot_lacks_is_unsure_never_absent(release):
    """What the inferred 1.4 bracket lacks may be in the releases themselves: a warning that says the data is inferred
    (with the nearest name where no version has the key), and the render proceeds."""
    target = llm_args.Target(release[:3], release)
    removed = llm_args.status(target, "disable_flashinfer_sampling")  # in manifest@92e3075, not in @0004396
    assert removed.verdict is llm_args.Verdict.UNSURE and "inferred" in removed.reason
    typo = llm_args.status(target, "cache_transceiver_config.max_tokens_in_bufer")
    assert typo.verdict is llm_args.Verdict.UNSURE and "inferred" in typo.reason
    assert "cache_transceiver_config.max_tokens_in_buffer" in typo.reason
    # a rename is its own evidence (PR, first release with the new name), not the snapshot's absence
    renamed = llm_args.status(target, "kv_cache_config.block_reuse_policy")
    assert renamed.verdict is llm_args.Verdict.ABSENT and "block_reuse_config.policy" in renamed.fix


def test_whether_a_snapshot_is_inferred_is_the_data_s(tmp_path):
    """The same snapshot, marked pinned in the data, decides absence again: nothing in the code names it."""
    data = json.loads((ROOT / "toolkit/facts/trtllm_data.json").read_text())
    for snap in data["snapshots"]:
        snap["basis"] = "pinned"
    (tmp_path / "data.json").write_text(json.dumps(data))
    with llm_args.use_data(tmp_path / "data.json"):
        target = llm_args.Target("1.4", "1.4.0rc1")
        assert llm_args.status(target, "disable_flashinfer_sampling").verdict is llm_args.Verdict.ABSENT
        assert llm_args.status(target, "cache_transceiver_config.max_tokens_in_bufer").verdict \
            is llm_args.Verdict.ABSENT


def test_a_recipe_key_the_inferred_bracket_lacks_renders_with_a_warning():
    from toolkit.plan import build_plan
    from toolkit.recipe import load_recipe_text
    from toolkit.render import render_files

    text = (ROOT / "recipes/standin-1p1d-1.4.yaml").read_text()
    plan = build_plan(load_recipe_text(text, "r.yaml", ["context.extra_options.disable_flashinfer_sampling=true"]))
    assert [w for w in plan.warnings if "disable_flashinfer_sampling" in w and "inferred" in w]
    assert yaml.safe_load(render_files(plan)["ctx.yaml"])["disable_flashinfer_sampling"] is True


def test_a_value_outside_the_manifest_s_allowed_values_is_refused_with_them():
    target = llm_args.Target("1.3", "1.3.0rc19")  # manifest@92e3075: pinned
    st = llm_args.value_status(target, "cache_transceiver_config.transceiver_runtime", "RUST")
    assert st is not None and st.verdict is llm_args.Verdict.ABSENT and "PYTHON" in st.reason + st.fix
    assert llm_args.value_status(target, "cache_transceiver_config.transceiver_runtime", "PYTHON") is None


def test_a_value_outside_an_inferred_snapshot_s_set_is_unsure_naming_the_set():
    """The 1.3.0rc27..1.4.0rc1 bracket's fields are a nearby commit's: a value its set lacks may be one the release
    takes, so it is warned and rendered, as a key it lacks is."""
    target = llm_args.Target("1.4", "1.4.0rc1")
    st = llm_args.value_status(target, "cache_transceiver_config.transceiver_runtime", "RUST")
    assert st is not None and st.verdict is llm_args.Verdict.UNSURE
    assert "inferred" in st.reason and "PYTHON" in st.reason
    assert llm_args.value_status(target, "cache_transceiver_config.transceiver_runtime", "PYTHON") is None


# --- value kinds, supplements, rows, reuse --------------------------------------------------------------------------


@pytest.mark.parametrize("annotation,kind,allowed,converter,expect", [
    ("<class 'int'>", "value", [], "", {"type": "int"}),
    ("Optional[Annotated[int, Gt(gt=0)]]", "value", [], "", {"type": "int", "gt": 0, "optional": True}),
    ("Optional[PositiveInt]", "value", [], "", {"type": "int", "ge": 1, "optional": True}),
    ("Optional[List[Annotated[int, Gt(gt=0)]]]", "value", [], "", {"type": "list", "items": {"type": "int", "gt": 0},
                                                                     "optional": True}),
    ("Optional[Literal['CPP', 'PYTHON']]", "categorical", ["CPP", "PYTHON"], "",
     {"type": "enum", "values": ["CPP", "PYTHON"], "optional": True}),
    ("Literal['AUTO']", "categorical", ["AUTO", "MTP"], "", {"type": "enum", "values": ["AUTO", "MTP"]}),  # all arms
    ("<class 'str'>", "categorical", ["auto", "fp8"], "allowlist", {"type": "enum", "values": ["auto", "fp8"],
                                                                     "open": True}),
    ("Union[bool, Literal['auto']]", "value", ["auto"], "", {"type": "union", "of": [
        {"type": "bool"}, {"type": "enum", "values": ["auto"]}]}),
    ("Optional[Dict[str, str]]", "value", [], "", {"type": "dict", "optional": True}),
    ("Optional[Union[str, Path]]", "value", [], "", {"type": "str", "optional": True}),
    ("dispatch key", "categorical", ["MTP", "Eagle"], "", {"type": "enum", "values": ["MTP", "Eagle"]}),
    ("Optional[CudaGraphConfig]", "section", [], "", {"type": "model", "optional": True}),
    ("", "value", [], "", None),  # tk's hand tables record no type
])
def test_every_annotation_becomes_a_value_kind(annotation, kind, allowed, converter, expect):
    assert gen.value_kind(gen.field(annotation, kind, allowed, converter)) == expect


def test_llm_args_py_gives_defaults_and_field_bounds(small_sources):
    sources, _, src = small_sources
    (src / C1 / "tensorrt_llm/llmapi/llm_args.py").write_text(LLM_ARGS.replace(
        "max_tokens_in_buffer: Optional[int] = None",
        "max_tokens_in_buffer: Optional[int] = Field(default=None, ge=1)\n    poll_ms: int = Field(default=5000)"))
    fields = gen.generate(sources, src)["snapshots"][0]["fields"]
    assert fields["cache_transceiver_config.poll_ms"]["default"] == 5000
    assert fields["cache_transceiver_config.max_tokens_in_buffer"]["value"] == {"type": "int", "optional": True, "ge": 1}
    assert fields["kv_cache_config.enable_block_reuse"]["default"] is True


def test_supplements_add_bounds_values_and_defaults_with_their_evidence(small_sources):
    sources, _, src = small_sources
    sources["supplements"] = [
        {"snapshots": "*", "path": "tensor_parallel_size", "value": {"ge": 1}, "default": 1, "evidence": "E1"},
        {"snapshots": ["new"], "path": "cache_transceiver_config.backend", "values": ["UCX"], "evidence": "E2"},
        {"snapshots": ["new"], "path": "speculative_config.speculative_model", "annotation": "Optional[str]",
         "evidence": "E3"}]
    new = gen.generate(sources, src)["snapshots"][1]["fields"]
    assert new["tensor_parallel_size"]["value"]["ge"] == 1 and new["tensor_parallel_size"]["default"] == 1
    assert new["tensor_parallel_size"]["evidence"] == ["E1"]
    assert new["cache_transceiver_config.backend"]["value"]["values"] == ["UCX"]
    assert "supplement" in new["speculative_config.speculative_model"]["flags"]
    sources["supplements"] = [{"snapshots": ["nope"], "path": "a", "value": {}, "evidence": "x"}]
    with pytest.raises(gen.SourceError, match="no snapshot nope"):
        gen.generate(sources, src)


def test_a_line_row_repeats_its_base_and_names_only_known_keys(small_sources):
    sources, _, src = small_sources
    base = {"line": "9.0", "release": "9.0.1", "releases": ["9.0.0", "9.0.1"], "prerelease": False,
            "nixl_transports": ["UCX"], "cluster_storages": [], "mtp_kv_layers": "one", "internal_port_envs": [],
            "serve_config_flag": True, "proxy_metadata_flag": True, "notes": ["n"]}
    sources["lines"] = [base, {"line": "9.1", "base": "9.0", "release": "9.1.0rc3", "releases": ["9.1.0rc0", "9.1.0rc3"],
                               "prerelease": True}]
    rows = gen.generate(sources, src)["lines"]
    assert rows[1]["nixl_transports"] == ["UCX"] and rows[1]["prerelease"] is True and rows[1]["notes"] == []
    sources["lines"] = [{**base, "colour": "red"}]
    with pytest.raises(gen.SourceError, match="colour"):
        gen.generate(sources, src)


def test_the_committed_data_regenerates_from_the_sources_file_with_reuse(tmp_path):
    """Every fact in the data file is what the sources file says, regenerated (no file at hand: --reuse)."""
    out = tmp_path / "data.json"
    out.write_text((ROOT / "toolkit/facts/trtllm_data.json").read_text())
    assert gen.main(["--from-dir", str(tmp_path / "none"), "--reuse", "--output", str(out), "--check"]) == 0


def test_the_transceiver_runtime_default_and_what_it_selects_per_release():
    """What the transceiver model reads: TensorRT-LLM's default of transceiver_runtime, per release, and what each
    value selects (llm_args.py @ 0004396: 'auto' is the Python transceiver with NIXL and a finite timeout)."""
    path = "cache_transceiver_config.transceiver_runtime"
    before = llm_args.entry(path, llm_args.Target("1.3", "1.3.0rc19"))
    assert before["default"] is None and before["resolves"]["null"] == "CPP"
    for target in (llm_args.Target("1.3", "1.3.0rc27"), llm_args.Target("1.4", "1.4.0rc1"), llm_args.Target("1.4")):
        now = llm_args.entry(path, target)
        assert now["default"] == "auto" and now["resolves"]["auto"] == "PYTHON", target
        assert now["resolves"]["auto_when_not_nixl"] == "CPP" and now["evidence"]
