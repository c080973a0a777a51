"""Spec: tk size (aiconfigurator behind tk) and its KV-transfer term.

The transfer-term and report tests are pure. The sizing tests need the `size` extra (aiconfigurator 0.12.0,
offline); CI installs it through scripts/setup, elsewhere they are skipped with the reason."""

from __future__ import annotations

import importlib.util
import json

import pytest

from toolkit.facts.models import BUILTIN_MODELS
from toolkit.size import add_transfer, meets_sla, transfer
from toolkit.size.aiconfigurator import Candidate

HAS_AIC = importlib.util.find_spec("aiconfigurator") is not None
needs_aic = pytest.mark.skipif(not HAS_AIC, reason="aiconfigurator (pip install 'tk-disagg[size]') is not installed")

LLAMA8 = BUILTIN_MODELS["meta-llama/Llama-3.1-8B-Instruct"]


def _cand(mode="disagg", ctx_tp=1, ttft=200.0, tpot=20.0, tps=1000.0, kv="bfloat16") -> Candidate:
    return Candidate(mode=mode, replicas=1, gpus_used=4, ctx_instances=2, ctx_tp=ctx_tp, ctx_pp=1, ctx_batch=1,
                     gen_instances=1, gen_tp=2, gen_pp=1, gen_batch=64, concurrency=64, ttft_ms=ttft, tpot_ms=tpot,
                     tokens_s_gpu=tps, tokens_s_user=50.0, gemm="bfloat16", kvcache=kv, trtllm_version="1.3.0rc20")


# --- the transfer term (pure) ----------------------------------------------------------------------------

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
    with pytest.raises(transfer.MeasuredError, match="no measured"):
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


# --- sizing with aiconfigurator ---------------------------------------------------------------------------

def _run(args, capsys):
    from toolkit.cli import main

    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


@needs_aic
@pytest.mark.parametrize("model,gpus,isl,osl,ttft,tpot", [
    ("meta-llama/Llama-3.1-8B-Instruct", 8, 4000, 500, 1000, 30),
    ("meta-llama/Llama-3.3-70B-Instruct", 16, 4000, 500, 1000, 30),
])
def test_sized_recipes_render(model, gpus, isl, osl, ttft, tpot, tmp_path, capsys):
    import toolkit.api

    out_file = tmp_path / "recipe.yaml"
    rc, out, err = _run(["size", "--model", model, "--system", "h100_sxm", "--gpus", str(gpus), "--isl", str(isl),
                         "--osl", str(osl), "--ttft", str(ttft), "--tpot", str(tpot), "--transport", "infiniband",
                         "-o", str(out_file), "--json"], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    chosen = doc["chosen"]
    assert chosen["mode"] == "disagg" and chosen["ttft_total_ms"] <= ttft and chosen["tpot_ms"] <= tpot
    assert doc["recheck"]["ok"] and not doc["recheck"]["errors"]
    assert any(c["meets_sla"] for c in doc["candidates"]) and doc["bandwidth"]["gbps"] == 50.0
    text = out_file.read_text()
    assert text.startswith("# Written by tk size") and "Predicted: TTFT" in text
    plan = toolkit.api.load_plan(str(out_file))  # tk's own recipe and plan rules accept it as is
    assert len(plan.context.instances) == chosen["ctx_instances"] and plan.context.tp == chosen["ctx_tp"]
    assert len(plan.generation.instances) == chosen["gen_instances"] and plan.generation.tp == chosen["gen_tp"]
    _, files = toolkit.api.render(plan, tmp_path / "render")
    assert {"ctx.yaml", "gen.yaml", "launch.sbatch"} <= set(files)


@needs_aic
def test_unsupported_model_and_system_exit_2_listing_what_is_supported(capsys):
    base = ["size", "--system", "h100_sxm", "--gpus", "8", "--isl", "1000", "--osl", "100", "--ttft", "1000",
            "--tpot", "30"]
    rc, _, err = _run(base + ["--model", "tk/standin-tiny"], capsys)
    assert rc == 2 and "cannot size tk/standin-tiny" in err and "meta-llama/Llama-3.3-70B-Instruct" in err
    rc, _, err = _run(["size", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--system", "tpu_v9", "--gpus", "8",
                       "--isl", "1000", "--osl", "100", "--ttft", "1000", "--tpot", "30"], capsys)
    assert rc == 2 and "tpu_v9" in err and "h100_sxm" in err and "h200_sxm" in err


@needs_aic
def test_impossible_sla_exits_2_with_the_closest_candidate(capsys):
    rc, _, err = _run(["size", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--system", "h100_sxm", "--gpus", "2",
                       "--isl", "2000", "--osl", "200", "--ttft", "2000", "--tpot", "0.5"], capsys)
    assert rc == 2, err
    assert "impossible SLA" in err and "Closest:" in err and "TPOT" in err


@needs_aic
def test_plan_predict_maps_the_recipe_roles(capsys):
    # At the recipe's longest requests (8192 + 1024 tokens) 128 sequences per TP2 generation server do not fit
    # in H100 memory: aiconfigurator says so, and tk passes that on (exit 2) rather than inventing numbers.
    rc, _, err = _run(["plan", "llama-3.1-8b-1node", "--predict"], capsys)
    assert rc == 2 and "does not fit in GPU memory" in err
    rc, out, err = _run(["plan", "llama-3.1-8b-1node", "--predict", "--json", "--set", "traffic.typical_input_len=2000"],
                        capsys)
    assert rc == 0, err
    p = json.loads(out)["prediction"]
    assert p["isl"] == 2000 and p["osl"] == 1024
    assert p["context"] == {"instances": 2, "tp": 1, "pp": 1, "batch": 4}  # 8192 tokens // 2000 = 4 prompts
    assert p["generation"] == {"instances": 2, "tp": 2, "pp": 1, "batch": 128}
    assert p["ttft_total_ms"] == pytest.approx(p["ttft_ms"] + p["transfer_ms"], abs=2e-3)
    assert p["tpot_ms"] > 0 and p["tokens_s_gpu"] > 0 and "max_num_tokens chunking" in p["not_modelled"]
