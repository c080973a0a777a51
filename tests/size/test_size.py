"""Spec: tk size (aiconfigurator behind tk), its translation of aiconfigurator's rows into recipes, and its
KV-transfer term.

Fast: aiconfigurator's own output for each case is replayed from tests/fixtures/aiconfigurator/ (recorded by its
record.py; tests/integration/test_size_aiconfigurator.py re-runs the searches, slowly, and compares)."""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from toolkit.facts.models import BUILTIN_MODELS, resolve_model
from toolkit.size import add_transfer, meets_sla, transfer
from toolkit.size import aiconfigurator as aic
from toolkit.size.candidates import Candidate, RoleShape, candidate

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
RECORDED = sorted((FIXTURES / "aiconfigurator").glob("*.json"))
LLAMA8 = BUILTIN_MODELS["meta-llama/Llama-3.1-8B-Instruct"]
needs_aiconfigurator = pytest.mark.skipif(importlib.util.find_spec("aiconfigurator") is None,
                                          reason="aiconfigurator (the size extra) is not installed")


class Replay:
    """The aiconfigurator adapter's interface (toolkit/size/aiconfigurator.py), answering from a recording."""

    PINNED, SYSTEM_TO_GPU, GPU_TO_SYSTEM = aic.PINNED, aic.SYSTEM_TO_GPU, aic.GPU_TO_SYSTEM
    QUANT_MODES, KV_MODES = aic.QUANT_MODES, aic.KV_MODES

    def __init__(self, path: Path, edit=None):
        self.doc = json.loads(path.read_text())
        self.rows = {mode: [dict(zip(self.doc["columns"], r)) for r in rows] for mode, rows in self.doc["rows"].items()}
        if edit:
            edit(self.rows)
        self.estimates = []

    def _import(self):
        return None

    def check_system(self, system):
        assert system in self.SYSTEM_TO_GPU

    def model_path_for(self, spec):
        return (spec.name if spec.source == "built-in" else str(Path(spec.source).parent)), spec.architecture or None

    def check_support(self, path, system, architecture):
        return self.doc["support_note"]

    def search(self, path, system, gpus, isl, osl, ttft_ms, tpot_ms):
        d = self.doc
        assert (system, gpus, isl, osl, ttft_ms, tpot_ms) == (d["system"], d["gpus"], d["isl"], d["osl"], d["ttft_ms"],
                                                              d["tpot_ms"])
        return self.rows

    def estimate_disagg(self, model_path, system, **kwargs):
        self.estimates.append(kwargs)
        return {"ttft": 500.0, "tpot": 20.0, "tokens/s/gpu": 100.0, "tokens/s/user": 50.0, "concurrency": 64,
                "num_total_gpus": 16, "(p)memory": 60.0, "(d)memory": 70.0}

    def estimate_agg(self, model_path, system, **kwargs):
        self.estimates.append({"agg": True, **kwargs})
        server = kwargs["server"]
        return {"ttft": 900.0, "tpot": 25.0, "tokens/s/gpu": 120.0, "tokens/s/user": 40.0,
                "concurrency": server.batch * server.dp, "num_total_gpus": server.gpus_per_worker, "memory": 65.0,
                "gemm": "nvfp4", "kvcache": "fp8", "version": "1.3.0rc20"}


def model_of(doc: dict) -> str:
    return str(FIXTURES / doc["model"]) if doc["model"].startswith("models/") else doc["model"]


def size_from(path: Path, edit=None, **kw):
    from toolkit.size import size

    replay = Replay(path, edit)
    d = replay.doc
    return size(model_of(d), d["system"], d["gpus"], d["isl"], d["osl"], d["ttft_ms"], d["tpot_ms"],
                adapter=replay, **kw)


# --- every recorded search: the recipe deploys exactly the chosen row ---------------------------------------------

def test_the_recordings_cover_what_people_disaggregate():
    docs = [json.loads(p.read_text()) for p in RECORDED]
    models = {d["model"] for d in docs}
    assert {"deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1", "moonshotai/Kimi-K2-Instruct", "models/kimi-k2",
            "openai/gpt-oss-120b", "Qwen/Qwen3-235B-A22B", "meta-llama/Llama-3.3-70B-Instruct",
            "models/llama-3.1-8b", "models/qwen2.5-72b"} <= models
    assert {d["system"] for d in docs} >= {"h100_sxm", "h200_sxm", "b200_sxm", "gb200"}
    assert min(d["gpus"] for d in docs) == 8 and max(d["gpus"] for d in docs) == 64


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_the_written_recipe_deploys_exactly_the_chosen_row(path):
    from toolkit.plan import build_plan
    from toolkit.recipe.loader import load_recipe_text
    from toolkit.size.recipe import compare

    result = size_from(path)
    c = result.chosen
    assert c.mode == "disagg" and result.meets(c) and not c.rejected and result.recheck["ok"]
    assert result.recheck["disagreements"] == [] and result.recheck["errors"] == []
    # every better SLA-meeting candidate was skipped for a reason that is shown
    for better in result.candidates[:result.candidates.index(c)]:
        assert not result.meets(better) or better.mode == "agg" or better.rejected
    plan = build_plan(load_recipe_text(result.recipe_text, "<spec>"))
    assert compare(plan, c) == []
    assert plan.context.gpu_count + plan.generation.gpu_count == c.gpus_used <= result.gpus
    assert plan.node_count * plan.slurm.gpus_per_node <= result.gpus
    for role, shape in ((plan.context, c.ctx), (plan.generation, c.gen)):
        assert (len(role.instances), role.tp, role.pp, role.attention_dp) == (shape.workers, shape.tp * shape.dp,
                                                                               shape.pp, shape.dp > 1)
        assert role.llm_api_options["max_batch_size"] == shape.batch
        if c.is_moe:
            assert (role.ep, role.moe_tp) == (shape.moe_ep, shape.moe_tp)
        assert role.memory.fits_sequence


@pytest.mark.parametrize("case,directory", [("deepseek-v3-h200-16", "deepseek-v3"),
                                            ("gpt-oss-120b-h200-8", "gpt-oss-120b"),
                                            ("qwen3-235b-h100-16", "qwen3-235b-a22b"),
                                            ("kimi-k2-gb200-16", "kimi-k2")])
def test_a_model_directory_sizes_as_its_built_in_twin(case, directory, monkeypatch):
    """The same aiconfigurator rows for the model given as a directory: the same choice, the recipe names the
    directory, and its memory plan reads the checkpoint's quantization from config.json."""
    from toolkit.size import size

    built_in = size_from(FIXTURES / "aiconfigurator" / f"{case}.json")
    replay = Replay(FIXTURES / "aiconfigurator" / f"{case}.json")
    d = replay.doc
    path = FIXTURES / "models" / directory
    result = size(str(path), d["system"], d["gpus"], d["isl"], d["osl"], d["ttft_ms"], d["tpot_ms"], adapter=replay)
    assert result.chosen.shape() == built_in.chosen.shape() and result.recheck["ok"]
    assert f"model: {path}" in result.recipe_text and "quantization" not in result.recipe_text
    ours = result.recheck["plan"]["memory"]
    theirs = built_in.recheck["plan"]["memory"]
    for role in ("context", "generation"):
        assert ours[role]["weights_gib"] == pytest.approx(theirs[role]["weights_gib"], rel=0.02)


def test_a_relative_model_directory_is_written_so_the_recipe_deploys_from_its_own_directory(tmp_path, monkeypatch,
                                                                                            capsys):
    """`tk size --model ./q72 -o other/dir/q.yaml`: a recipe resolves a relative model against its own directory,
    so tk writes the absolute directory, and the re-check reads the text as the written file will be read."""
    import shutil

    import toolkit.size
    from toolkit.api import load_plan
    from toolkit.cli import main

    shutil.copytree(FIXTURES / "models" / "qwen2.5-72b", tmp_path / "q72")
    (tmp_path / "other" / "dir").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(toolkit.size, "aic", Replay(FIXTURES / "aiconfigurator" / "qwen2.5-72b-dir-h100-16.json"))
    d = json.loads((FIXTURES / "aiconfigurator" / "qwen2.5-72b-dir-h100-16.json").read_text())
    rc = main(["size", "--model", "./q72", "--system", d["system"], "--gpus", str(d["gpus"]), "--isl", str(d["isl"]),
               "--osl", str(d["osl"]), "--ttft", str(d["ttft_ms"]), "--tpot", str(d["tpot_ms"]),
               "-o", "other/dir/q.yaml"])
    assert rc == 0, capsys.readouterr().err
    written = (tmp_path / "other" / "dir" / "q.yaml").read_text()
    assert f"model: {tmp_path / 'q72'}\n" in written
    monkeypatch.chdir(tmp_path / "other")  # from anywhere: the recipe names the same directory
    plan = load_plan(str(tmp_path / "other" / "dir" / "q.yaml"))
    assert plan.model.source == str(tmp_path / "q72" / "config.json")


def test_the_recheck_resolves_relative_paths_against_the_output_files_directory(tmp_path):
    """What the re-check says deploys is what the written file deploys: a relative model in the text is read
    from the output's directory (where it is missing here), not from the working directory."""
    from toolkit.size.recipe import recheck

    result = size_from(FIXTURES / "aiconfigurator" / "qwen2.5-72b-dir-h100-16.json")
    relative = os.path.relpath(FIXTURES / "models" / "qwen2.5-72b")
    text = result.recipe_text.replace(f"model: {FIXTURES / 'models' / 'qwen2.5-72b'}", f"model: {relative}")
    assert recheck(text, result.chosen, result)["ok"]  # read from the working directory, as "<tk size>"
    (tmp_path / "sub").mkdir()
    check = recheck(text, result.chosen, result, output=str(tmp_path / "sub" / "q.yaml"))
    assert not check["ok"] and "does not exist" in check["errors"][0]


def test_a_checkpoint_quantization_tk_cannot_read_is_sized_with_a_warning_not_a_crash(tmp_path):
    """compressed-tensors with config_groups as a list (not the mapping it writes): the quantization is unknown, the
    re-check's plan warns naming the file and field, and the recipe is still written."""
    from toolkit.size import size

    cfg = json.loads((FIXTURES / "models" / "qwen2.5-72b" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "compressed-tensors", "config_groups": [
        {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}]}
    (tmp_path / "q72").mkdir()
    (tmp_path / "q72" / "config.json").write_text(json.dumps(cfg))
    replay = Replay(FIXTURES / "aiconfigurator" / "qwen2.5-72b-dir-h100-16.json")
    d = replay.doc
    result = size(str(tmp_path / "q72"), d["system"], d["gpus"], d["isl"], d["osl"], d["ttft_ms"], d["tpot_ms"],
                  adapter=replay)
    assert result.recheck["ok"] and result.recipe_text
    assert any(w.startswith(f"{tmp_path / 'q72' / 'config.json'}: quantization_config.config_groups is a list")
               for w in result.recheck["warnings"])


def test_deepseek_v3_on_16_h200_keeps_attention_dp_and_moe_parallelism():
    """newcomer B1: the rank-1 row is decode tp1 dp8 moe_tp4 moe_ep2 (8 GPUs); it used to be written as TP1."""
    result = size_from(FIXTURES / "aiconfigurator" / "deepseek-v3-h200-16.json")
    c = result.chosen
    assert c.aic_rank == 1 and c.gpus_used == 16
    assert (c.gen.tp, c.gen.dp, c.gen.moe_tp, c.gen.moe_ep, c.gen.batch) == (1, 8, 4, 2, 16)
    assert "generation:\n  instances: 1\n  tp: 8\n  ep: 2\n  attention_dp: true\n  max_batch_size: 16\n" \
        in result.recipe_text
    assert "context:\n  instances: 1\n  tp: 8\n  ep: 8\n  max_batch_size: 1\n" in result.recipe_text
    assert result.recheck["deployed"]["GPUs"] == 16
    assert c.shape() == "1x ctx TEP8 bs1 + 1x gen ADP8 EP2 ETP4 bs16/rank"
    assert "quantization" not in result.recipe_text  # the checkpoint's own fp8 blocks


def test_a_context_batch_of_several_prompts_gets_the_tokens_to_prefill_them_together():
    """aiconfigurator's (p)bs 4 at ISL 4000 prefills 4 prompts in one step: the context servers' max_num_tokens must
    hold 16000 tokens (rounded up to tokens_per_block 32), not ISL, or they would prefill one prompt per step."""
    from toolkit.plan import build_plan
    from toolkit.recipe.loader import load_recipe_text
    from toolkit.size.recipe import compare

    def context_batch_4(rows):
        for r in rows["disagg"]:
            r["(p)bs"] = 4

    result = size_from(FIXTURES / "aiconfigurator" / "llama-3.3-70b-h100-16.json", edit=context_batch_4)
    c = result.chosen
    assert c.ctx.batch == 4 and result.recheck["ok"], result.recheck
    assert "  max_batch_size: 4\n  max_num_tokens: 16000\n" in result.recipe_text
    assert result.recheck["deployed"]["context"]["max_num_tokens"] == 16000
    fewer = result.recipe_text.replace("  max_num_tokens: 16000\n", "")
    assert "context max_num_tokens: aiconfigurator 16000, the recipe 4000" in \
        compare(build_plan(load_recipe_text(fewer, "<old>")), c)


def test_context_max_num_tokens_is_the_batch_of_whole_prompts_rounded_up_to_blocks():
    role = RoleShape(workers=2, tp=4, pp=1, dp=1, moe_tp=4, moe_ep=1, batch=3)
    assert role.recipe_fields(is_moe=False, prefill_isl=1000)["max_num_tokens"] == 3008  # 3000 up to 32s
    assert "max_num_tokens" not in RoleShape(2, 4, 1, 1, 4, 1, 1).recipe_fields(is_moe=False, prefill_isl=1000)
    assert "max_num_tokens" not in role.recipe_fields(is_moe=False)  # a generation role


def test_a_row_tk_cannot_express_is_marked_and_never_written():
    def attention_tp_and_dp(rows):  # aiconfigurator's best row, but with attention TP2 x DP4 on the decode side
        best = max(rows["disagg"], key=lambda r: r["tokens/s/gpu"])
        rows["disagg"].append({**best, "(d)tp": 2, "(d)dp": 4, "tokens/s/gpu": best["tokens/s/gpu"] * 2})

    result = size_from(FIXTURES / "aiconfigurator" / "deepseek-v3-h200-16.json", edit=attention_tp_and_dp)
    first = result.candidates[0]
    assert first.mode == "disagg" and result.meets(first)
    assert first.rejected.startswith("tk cannot express it: generation: attention TP x DP (tp2 dp4)")
    assert result.chosen is not first and result.chosen.gen.dp == 8
    assert any("skipped" in n and "attention TP x DP" in n for n in result.notes)


def test_a_row_tk_plan_refuses_is_marked_and_skipped():
    def one_gpu_decode(rows):  # DeepSeek-V3 (671B) on a single H200 for decoding
        best = max(rows["disagg"], key=lambda r: r["tokens/s/gpu"])
        rows["disagg"].append({**best, "(d)tp": 1, "(d)dp": 1, "(d)moe_tp": 1, "(d)moe_ep": 1,
                               "num_total_gpus": 9, "tokens/s/gpu": best["tokens/s/gpu"] * 2})

    result = size_from(FIXTURES / "aiconfigurator" / "deepseek-v3-h200-16.json", edit=one_gpu_decode)
    first = result.candidates[0]
    assert first.rejected.startswith("tk's plan refuses it: generation.tp: deepseek-ai/DeepSeek-V3's weights need")
    assert result.chosen.gpus_used == 16


def test_no_deployable_candidate_is_exit_2_with_the_reasons():
    from toolkit.size import SizingError

    def only_tp_dp(rows):
        rows["disagg"] = [{**r, "(d)tp": 2, "(d)dp": 4} for r in rows["disagg"]]

    with pytest.raises(SizingError, match="none of the .* SLA-meeting disaggregated candidates is one tk can deploy"):
        size_from(FIXTURES / "aiconfigurator" / "deepseek-v3-h200-16.json", edit=only_tp_dp)


def test_the_recheck_reports_every_difference_between_recipe_and_row():
    """What the old translation wrote for B1 (gen TP1: one GPU) differs from the row in GPUs and layout."""
    from toolkit.plan import build_plan
    from toolkit.recipe.loader import load_recipe_text
    from toolkit.size.recipe import compare

    result = size_from(FIXTURES / "aiconfigurator" / "deepseek-v3-h200-16.json")
    old = result.recipe_text.replace("  tp: 8\n  ep: 2\n  attention_dp: true\n", "  tp: 8\n  ep: 8\n")
    diffs = compare(build_plan(load_recipe_text(old, "<old>")), result.chosen)
    assert "generation attention_dp: aiconfigurator True, the recipe False" in diffs
    assert "generation ep: aiconfigurator 2, the recipe 8" in diffs
    assert "generation moe_tp: aiconfigurator 4, the recipe 1" in diffs


def test_the_command_exits_1_and_writes_nothing_when_the_recipe_would_differ(tmp_path, monkeypatch, capsys):
    import toolkit.size
    import toolkit.size.recipe as recipe_mod
    from toolkit.cli import main

    replay = Replay(FIXTURES / "aiconfigurator" / "deepseek-v3-h200-16.json")
    monkeypatch.setattr(toolkit.size, "aic", replay)
    real = recipe_mod.write_recipe

    def drops_attention_dp(*a, **kw):  # the translation bug of newcomer B1
        return real(*a, **kw).replace("  attention_dp: true\n", "")

    monkeypatch.setattr(recipe_mod, "write_recipe", drops_attention_dp)
    out = tmp_path / "r.yaml"
    rc = main(["size", "--model", "deepseek-ai/DeepSeek-V3", "--system", "h200_sxm", "--gpus", "16", "--isl", "8000",
               "--osl", "1000", "--ttft", "2000", "--tpot", "40", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and not out.exists()
    assert "disagreement: generation attention_dp: aiconfigurator True, the recipe False" in err
    assert "did NOT write" in err


def test_the_command_writes_the_recipe_and_its_json(tmp_path, monkeypatch, capsys):
    import toolkit.size
    from toolkit.cli import main

    monkeypatch.setattr(toolkit.size, "aic", Replay(FIXTURES / "aiconfigurator" / "gpt-oss-120b-h200-8.json"))
    out = tmp_path / "r.yaml"
    rc = main(["size", "--model", "openai/gpt-oss-120b", "--system", "h200_sxm", "--gpus", "8", "--isl", "4000",
               "--osl", "1000", "--ttft", "1000", "--tpot", "20", "-o", str(out), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and out.read_text() == doc["recipe"] and doc["recheck"]["ok"]
    assert doc["chosen"]["gpus_used"] == doc["recheck"]["deployed"]["GPUs"]
    assert all("rejected" in c and "shape" in c for c in doc["candidates"])


def test_answer_len_without_turns_is_refused_before_the_search_and_writes_nothing(tmp_path, monkeypatch, capsys):
    import toolkit.size
    from toolkit.cli import main

    replay = Replay(FIXTURES / "aiconfigurator" / "gpt-oss-120b-h200-8.json")
    searched = []
    monkeypatch.setattr(replay, "search", lambda *a, **kw: searched.append(a) or replay.rows)
    monkeypatch.setattr(toolkit.size, "aic", replay)
    out = tmp_path / "r.yaml"
    rc = main(["size", "--model", "openai/gpt-oss-120b", "--system", "h200_sxm", "--gpus", "8", "--isl", "4000",
               "--osl", "1000", "--ttft", "1000", "--tpot", "20", "-o", str(out), "--answer-len", "200"])
    err = capsys.readouterr().err
    assert rc == 2 and "--answer-len describes a multi-turn shape: add --turns N" in err
    assert not out.exists() and searched == []


def test_isl_plus_osl_beyond_the_models_context_is_refused_before_the_search():
    """Qwen2.5-72B's config.json says max_position_embeddings 32768: 30000 + 4000 tokens never fit, whatever the GPUs."""
    from toolkit.size import SizingError, size

    replay = Replay(FIXTURES / "aiconfigurator" / "qwen2.5-72b-dir-h100-16.json")
    searched = []
    replay.search = lambda *a, **kw: searched.append(a) or replay.rows
    with pytest.raises(SizingError) as caught:
        size(str(FIXTURES / "models" / "qwen2.5-72b"), "h100_sxm", 16, 30000, 4000, 5000, 50, adapter=replay)
    message = str(caught.value)
    assert "--isl 30000 + --osl 4000 = 34000 tokens" in message and "32768-token context" in message
    assert "max_position_embeddings" in message and "more GPUs" not in message and searched == []
    assert size(str(FIXTURES / "models" / "qwen2.5-72b"), "h100_sxm", 16, 4000, 500, 2000, 50,
                adapter=Replay(FIXTURES / "aiconfigurator" / "qwen2.5-72b-dir-h100-16.json")).recheck["ok"]


@needs_aiconfigurator
def test_a_config_json_aiconfigurator_cannot_parse_is_a_sizing_error_naming_the_file_and_key(tmp_path, capsys):
    """A Qwen2 config.json without max_position_embeddings: tk reads it, aiconfigurator 0.12.0's
    _parse_hf_config_json raises KeyError on it (about two seconds: it fails before searching)."""
    from toolkit.cli import main

    cfg = json.loads((FIXTURES / "models" / "qwen2.5-72b" / "config.json").read_text())
    del cfg["max_position_embeddings"]
    (tmp_path / "q72").mkdir()
    (tmp_path / "q72" / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "r.yaml"
    rc = main(["size", "--model", str(tmp_path / "q72"), "--system", "h100_sxm", "--gpus", "16", "--isl", "4000",
               "--osl", "500", "--ttft", "2000", "--tpot", "50", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and not out.exists()
    assert f"{tmp_path / 'q72' / 'config.json'}: aiconfigurator 0.12.0 needs 'max_position_embeddings'" in err
    assert "Fix: add max_position_embeddings" in err


@needs_aiconfigurator
@pytest.mark.parametrize("raised", [RuntimeError("perf database error: gemm data missing"), IndexError("list index"),
                                    ValueError("bad head_dim")])
def test_whatever_aiconfigurator_raises_in_its_search_is_a_sizing_error(raised, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from toolkit.size import SizingError

    def cli_default(**kw):
        raise raised

    monkeypatch.setattr(aic, "_import", lambda: SimpleNamespace(cli_default=cli_default))
    with pytest.raises(SizingError, match=f"{tmp_path}/config.json: aiconfigurator 0.12.0 failed on it: "
                                          f"{type(raised).__name__}: "):
        aic.search(str(tmp_path), "h100_sxm", 16, 4000, 500, 2000.0, 50.0)
    with pytest.raises(SizingError, match="aiconfigurator 0.12.0 failed on its config of Qwen/Qwen3-32B: "):
        aic.search("Qwen/Qwen3-32B", "h100_sxm", 16, 4000, 500, 2000.0, 50.0)


# --- rows -> candidates ----------------------------------------------------------------------------------------

def test_rows_are_read_per_role_with_attention_dp_and_moe_sizes():
    doc = json.loads((FIXTURES / "aiconfigurator" / "deepseek-v3-h200-16.json").read_text())
    row = dict(zip(doc["columns"], doc["rows"]["disagg"][0]))
    c = candidate("disagg", row, 16, is_moe=True)
    assert (c.ctx.workers, c.ctx.tp, c.ctx.dp, c.ctx.moe_tp, c.ctx.moe_ep) == (1, 8, 1, 1, 8)
    assert (c.gen.workers, c.gen.tp, c.gen.dp, c.gen.moe_tp, c.gen.moe_ep) == (1, 1, 8, 4, 2)
    assert row["(d)parallel"] == "tp1pp1dp8etp4ep2" and c.gen.gpus_per_worker == 8 and c.gpus_used == 16
    assert c.gen.memory_gib > 0 and c.ctx.gemm == "fp8_block" and c.kvcache == "fp8"
    assert candidate("disagg", row, 8, is_moe=True) is None  # a replica larger than the budget


def test_replicas_multiply_workers_and_aggregated_rows_count_servers():
    row = {"num_total_gpus": 8, "tokens/s/gpu": 100.0, "tp": 1, "pp": 1, "dp": 8, "moe_tp": 1, "moe_ep": 8, "bs": 32}
    agg = candidate("agg", row, 32, is_moe=True)
    assert agg.replicas == 4 and agg.gen.workers == 4 and agg.shape() == "4x agg DEP8 bs32/rank"
    disagg = candidate("disagg", {"num_total_gpus": 8, "(p)workers": 2, "(p)tp": 2, "(d)workers": 1, "(d)tp": 4},
                       24, is_moe=False)
    assert (disagg.replicas, disagg.ctx.workers, disagg.gen.workers, disagg.gpus_used) == (3, 6, 3, 24)


@pytest.mark.parametrize("shape,is_moe,layout,why", [
    (RoleShape(1, 8, 1, 1, 8, 1, 4), False, "TP8", ""),
    (RoleShape(1, 8, 1, 1, 1, 8, 4), True, "TEP8", ""),
    (RoleShape(1, 1, 1, 8, 1, 8, 4), True, "DEP8", ""),
    (RoleShape(1, 8, 1, 1, 8, 1, 4), True, "TP8", ""),
    (RoleShape(1, 8, 2, 1, 4, 2, 4), True, "TP8 EP2 ETP4 PP2", ""),
    (RoleShape(1, 2, 1, 4, 1, 8, 4), True, "TP2 ADP4 EP8 ETP1", "attention TP x DP"),
    (RoleShape(1, 1, 1, 4, 1, 4, 4), False, "TP1 DP4", "dense model"),
    (RoleShape(1, 1, 1, 8, 1, 4, 4), True, "ADP8 EP4 ETP1", "is not the attention width"),
    (RoleShape(1, 4, 1, 1, 1, 4, 4, cp=2), True, "TEP4 CP2", "context parallelism"),
])
def test_role_layouts_and_what_tk_cannot_express(shape, is_moe, layout, why):
    assert shape.layout(is_moe) == layout
    assert (why in shape.why_not(is_moe)) if why else shape.why_not(is_moe) == ""


def test_recipe_fields_are_tensorrt_llms_layout():
    dep = RoleShape(workers=2, tp=1, pp=1, dp=8, moe_tp=4, moe_ep=2, batch=16)
    assert dep.recipe_fields(is_moe=True) == {"instances": 2, "tp": 8, "ep": 2, "attention_dp": True,
                                              "max_batch_size": 16}
    assert RoleShape(3, 4, 2, 1, 1, 1, 64).recipe_fields(is_moe=False) == {"instances": 3, "tp": 4, "pp": 2,
                                                                           "max_batch_size": 64}


# --- tk plan --predict: the plan's layout as aiconfigurator's parallel sizes ---------------------------------------

def test_predict_passes_attention_dp_and_moe_sizes_for_the_shipped_deepseek_recipe():
    from toolkit.api import load_plan
    from toolkit.size import predict

    replay = Replay(RECORDED[0])
    p = predict(load_plan("deepseek-r1-gb200"), adapter=replay)
    [est] = replay.estimates
    assert est["ctx"] == RoleShape(workers=2, tp=1, pp=1, dp=4, moe_tp=1, moe_ep=4, batch=1)
    assert est["gen"] == RoleShape(workers=1, tp=1, pp=1, dp=16, moe_tp=1, moe_ep=16, batch=256)
    assert est["is_moe"] and est["quantization"] == "nvfp4" and est["kv_dtype"] == "fp8"
    assert p["context"]["layout"] == "DEP4" and p["generation"]["layout"] == "DEP16"
    assert p["aiconfigurator_memory_gib"] == {"context": 60.0, "generation": 70.0}
    assert "MTP speculative decoding (estimated without it)" in p["not_modelled"]
    assert not any("expert parallelism" in n or "attention DP" in n for n in p["not_modelled"])


def test_predict_of_a_dense_recipe_passes_plain_tp():
    from toolkit.api import load_plan
    from toolkit.size import predict

    replay = Replay(RECORDED[0])
    predict(load_plan("llama-3.3-70b-h100"), adapter=replay)
    [est] = replay.estimates
    assert est["ctx"] == RoleShape(workers=2, tp=4, pp=1, dp=1, moe_tp=4, moe_ep=1, batch=1)  # 8192 // 8192
    assert not est["is_moe"] and est["quantization"] == "fp8"


def test_predict_of_an_aggregated_plan_estimates_the_aggregated_servers():
    """`tk plan RECIPE --aggregated --predict`: aiconfigurator's aggregated (in-flight batching) estimate of one
    server of the aggregated role, times its instances; no context/generation roles and no KV transfer."""
    from toolkit.api import load_plan
    from toolkit.size import predict

    replay = Replay(RECORDED[0])
    plan = load_plan("deepseek-r1-gb200", ["aggregated.tp=8"], aggregated=True)
    p = predict(plan, adapter=replay)
    [est] = replay.estimates
    assert est["agg"] and est["server"] == RoleShape(workers=3, tp=1, pp=1, dp=8, moe_tp=1, moe_ep=8, batch=256)
    assert est["ctx_tokens"] == plan.aggregated.llm_api_options["max_num_tokens"] == 8192
    assert est["quantization"] == "nvfp4" and est["kv_dtype"] == "fp8"
    assert p["mode"] == "aggregated" and "context" not in p and "generation" not in p
    assert p["aggregated"]["layout"] == "DEP8" and p["aggregated"]["instances"] == 3
    assert p["transfer_ms"] == 0.0 and p["ttft_total_ms"] == p["ttft_ms"] == 900.0 and p["transfer"] is None
    assert p["gpus"] == 24 and p["concurrency"] == 3 * 256 * 8
    assert p["aiconfigurator_memory_gib"] == {"aggregated": 65.0}


def test_plan_aggregated_predict_on_the_command_line_says_aggregated_throughout(monkeypatch, capsys):
    import toolkit.size
    from toolkit.cli import main

    monkeypatch.setattr(toolkit.size, "aic", Replay(RECORDED[0]))
    rc = main(["plan", "llama-3.3-70b-h100", "--aggregated", "--predict", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["prediction"]["mode"] == "aggregated"
    assert doc["prediction"]["aggregated"] == {"instances": 2, "tp": 8, "pp": 1, "batch": 256}
    assert not {"context", "generation", "context_batch_basis"} & set(doc["prediction"])
    rc = main(["plan", "llama-3.3-70b-h100", "--aggregated", "--predict"])
    err = capsys.readouterr().err
    assert rc == 0 and "2x agg TP8 bs256 at full batch" in err and "no KV transfer (aggregated)" in err
    assert "ctx" not in err.split("prediction (")[1]


def test_predict_passes_the_kv_dtype_the_plan_resolved_not_aiconfigurators_guess():
    """kv_transfer.dtype auto: TensorRT-LLM keeps the KV cache in the checkpoint's dtype when it declares no KV
    quantization (tk's plan counts 2 bytes), so aiconfigurator is told bfloat16 instead of inferring fp8 for
    DeepSeek's fp8 checkpoints."""
    from toolkit.api import load_plan
    from toolkit.size import predict

    replay = Replay(RECORDED[0])
    p = predict(load_plan("deepseek-r1-gb200", ["kv_transfer.dtype=auto"]), adapter=replay)
    [est] = replay.estimates
    assert est["kv_dtype"] == "bfloat16"
    assert p["kv_cache_dtype"] == {"recipe": "auto", "estimated_as": "bfloat16"}


@needs_aiconfigurator
@pytest.mark.parametrize("kv_dtype,mode", [("bfloat16", "bfloat16"), ("float16", "bfloat16"), ("fp8", "fp8"),
                                           ("nvfp4", None)])
def test_the_adapter_always_names_the_kv_cache_mode_it_can(kv_dtype, mode, monkeypatch):
    from types import SimpleNamespace

    calls = []

    def cli_estimate(*a, **kw):
        calls.append(kw)
        return SimpleNamespace(raw={"ttft": 1.0, "tpot": 1.0}, kv_cache_warning=None)

    monkeypatch.setattr(aic, "_import", lambda: SimpleNamespace(cli_estimate=cli_estimate))
    shape = RoleShape(workers=1, tp=8, pp=1, dp=1, moe_tp=8, moe_ep=1, batch=1)
    aic.estimate_disagg("deepseek-ai/DeepSeek-V3", "h200_sxm", isl=1000, osl=100, ctx=shape, gen=shape, is_moe=True,
                        quantization=None, kv_dtype=kv_dtype)
    assert calls[0].get("kvcache_quant_mode") == mode


# --- the transfer term (pure) ----------------------------------------------------------------------------------

def _cand(mode="disagg", ctx_tp=1, ttft=200.0, tpot=20.0, tps=1000.0, kv="bfloat16") -> Candidate:
    ctx = RoleShape(workers=2, tp=ctx_tp, pp=1, dp=1, moe_tp=1, moe_ep=1, batch=1, kvcache=kv)
    gen = RoleShape(workers=1, tp=2, pp=1, dp=1, moe_tp=1, moe_ep=1, batch=64, kvcache=kv)
    return Candidate(mode=mode, replicas=1, gpus_used=4, ctx=ctx if mode == "disagg" else None, gen=gen,
                     concurrency=64, ttft_ms=ttft, tpot_ms=tpot, tokens_s_gpu=tps, tokens_s_user=50.0, is_moe=False,
                     trtllm_version="1.3.0rc20")


def test_transfer_term_is_exactly_bytes_per_token_times_isl_over_bandwidth():
    gbps, isl = 50.0, 4000
    bpt = 2 * 8 * 128 * 2 * 32  # K and V, 8 KV heads, head_dim 128, bf16, 32 layers = 131072 bytes
    assert transfer.bytes_per_token(LLAMA8, "auto") == bpt
    expected_ms = bpt * isl / (gbps * 1e9) * 1e3  # 10.48576 ms
    [after] = add_transfer([_cand(ttft=200.0)], LLAMA8, isl, gbps)
    assert after.transfer_ms == pytest.approx(expected_ms, abs=1e-6)
    assert after.ttft_total_ms - after.ttft_ms == pytest.approx(expected_ms, abs=1e-6)
    assert after.ttft_ms == 200.0  # aiconfigurator's own number is kept as it was


def test_transfer_term_uses_the_context_rank_shard_and_the_kv_dtype():
    [tp2] = add_transfer([_cand(ctx_tp=2)], LLAMA8, 1000, 10.0)
    assert tp2.transfer_ms == pytest.approx(65536 * 1000 / 10e9 * 1e3, abs=1e-6)  # each TP2 rank holds 4 KV heads
    [fp8] = add_transfer([_cand(kv="fp8")], LLAMA8, 1000, 10.0)
    assert fp8.transfer_ms == pytest.approx(65536 * 1000 / 10e9 * 1e3, abs=1e-6)  # one byte per element
    [agg] = add_transfer([_cand(mode="agg")], LLAMA8, 1000, 10.0)
    assert agg.transfer_ms == 0.0  # aggregated serving moves no KV


def test_under_attention_dp_a_context_rank_sends_every_kv_head():
    qwen = BUILTIN_MODELS["Qwen/Qwen3-235B-A22B"]
    c = _cand()
    dep = replace(c, ctx=RoleShape(workers=1, tp=1, pp=1, dp=8, moe_tp=1, moe_ep=8, batch=1))
    tep = replace(c, ctx=RoleShape(workers=1, tp=8, pp=1, dp=1, moe_tp=1, moe_ep=8, batch=1))
    [d], [t] = add_transfer([dep], qwen, 1000, 10.0), add_transfer([tep], qwen, 1000, 10.0)
    assert d.extra["bytes_per_token_per_ctx_rank"] == 2 * 94 * 4 * 128 * 2  # all 4 KV heads
    assert t.extra["bytes_per_token_per_ctx_rank"] == 2 * 94 * 1 * 128 * 2  # one (replicated) head per rank


def test_transfer_term_can_push_a_candidate_out_of_the_sla():
    c = _cand(ttft=990.0)
    assert meets_sla(c, 1000, 30)
    [slow] = add_transfer([c], LLAMA8, 4000, transfer.nominal("tcp").gbps)  # 3.125 GB/s: 167.8 ms
    assert not meets_sla(slow, 1000, 30)
    with pytest.raises(ValueError):
        transfer.transfer_ms(1, 1, 0.0)


def test_measured_bandwidth_comes_from_the_validate_report_matrix(tmp_path):
    from toolkit.validate.report import bandwidth_matrix

    pairs = [{"src": s, "dst": d, "op": "WRITE", "gbps": g}
             for s, d, g in (("ctx0", "gen0", 20.0), ("ctx0", "gen1", 40.0), ("ctx1", "gen0", 30.0), ("ctx1", "gen1", None))]
    matrix = bandwidth_matrix(pairs)
    assert matrix["op"] == "WRITE" and matrix["context"] == ["ctx0", "ctx1"] and matrix["generation"] == ["gen0", "gen1"]
    assert matrix["gbps"] == [[20.0, 40.0], [30.0, None]]
    (tmp_path / "report.json").write_text(json.dumps({"kind": "tk-validate-cluster", "passed": True,
                                                      "bandwidth_matrix": matrix,
                                                      "thresholds": {"transport": "infiniband"}}))
    slowest = transfer.measured(tmp_path)
    assert (slowest.gbps, slowest.source, slowest.transport) == (20.0, "measured", "infiniband")
    assert "slowest of 3" in slowest.detail
    assert transfer.measured(tmp_path, "median").gbps == 30.0
    (tmp_path / "report.json").write_text(json.dumps({"kind": "tk-validate-cluster", "passed": False, "pairs": []}))
    with pytest.raises(transfer.MeasuredError, match="no measured"):
        transfer.measured(tmp_path)


@pytest.mark.parametrize("damaged", [{"bandwidth_matrix": "fast"}, {"bandwidth_matrix": {"gbps": "x"}},
                                     {"bandwidth_matrix": {"gbps": [1, [True, "2"]]}, "pairs": ["x", 3]},
                                     {"pairs": {"gbps": 3}}])
def test_a_damaged_validation_report_is_a_clear_error(tmp_path, damaged):
    (tmp_path / "report.json").write_text(json.dumps({"kind": "tk-validate-cluster", **damaged}))
    # a figure that is not one is named by its field (tests/unit/test_hostile_inputs.py); a report without any is said so
    with pytest.raises(transfer.MeasuredError, match=r"no measured|bandwidth_matrix\.gbps\[1\]\[0\]: True"):
        transfer.measured(tmp_path)


@pytest.mark.parametrize("field,value", [("ttft_ms", 0), ("ttft_ms", float("nan")), ("tpot_ms", float("inf")),
                                         ("gpus", 0), ("isl", -1)])
def test_the_size_api_checks_the_ranges_the_command_line_does(field, value):
    from toolkit import api
    from toolkit.size.aiconfigurator import SizingError

    args = dict(model="meta-llama/Llama-3.1-8B-Instruct", system="h100_sxm", gpus=8, isl=4000, osl=500, ttft_ms=1000,
                tpot_ms=30)
    with pytest.raises(SizingError, match="out of range|not a number"):
        api.size(**{**args, field: value})


def test_writing_the_recipe_where_it_cannot_be_written_is_a_message(tmp_path):
    from toolkit.errors import TkError
    from toolkit.size.recipe import write_file

    with pytest.raises(TkError, match="cannot write the recipe there"):
        write_file(str(tmp_path / "missing" / "r.yaml"), "schema_version: 1\n")


def test_fixture_model_directories_resolve_to_the_published_geometry():
    kimi = resolve_model(str(FIXTURES / "models" / "kimi-k2"))
    assert kimi.architecture == "DeepseekV3ForCausalLM" and kimi.quantization == "fp8_block"
    assert kimi.params == pytest.approx(BUILTIN_MODELS["moonshotai/Kimi-K2-Instruct"].params, rel=0.01)
    assert resolve_model(str(FIXTURES / "models" / "qwen2.5-72b")).architecture == "Qwen2ForCausalLM"


def test_the_multi_turn_pull_back_moves_what_one_context_rank_holds():
    # Llama-3.3-70B on 16 H100: context TP2, so one context rank holds half the KV of a token (GQA heads split)
    from toolkit import api
    from toolkit.size import transfer
    result = size_from(FIXTURES / "aiconfigurator" / "llama-3.3-70b-h100-16.json")
    chosen = result.chosen or result.best_overall
    assert chosen.ctx.tp == 2
    whole = transfer.bytes_per_token(result.model, transfer.kv_dtype_of(chosen.kvcache))
    estimate = api.size_multi_turn(result, 3)
    assert estimate["inputs"]["kv_bytes_per_token_per_rank"] == whole // 2 == 163840
