"""Spec (slow): tk size and tk plan --predict against aiconfigurator 0.12.0 itself (offline, the `size` extra).

The unit specs (tests/size/test_size.py) replay recorded aiconfigurator output; here the searches run again and
must give exactly the recorded rows, the command line sizes MoE, attention-DP and local-directory models end to
end, `tk plan --predict` answers for the shipped MoE recipe and for what tk size writes, and tk's memory plan is
compared with aiconfigurator's own memory model. Each search takes 5-25 s on two cores."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(FIXTURES / "aiconfigurator"))

pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("aiconfigurator") is None,
                                                   reason="aiconfigurator (pip install 'tk-disagg[size]') is not "
                                                          "installed")]


def _run(args, capsys):
    from toolkit.cli import main

    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("case", ["deepseek-v3-h200-16", "kimi-k2-dir-b200-16", "qwen2.5-72b-dir-h100-16",
                                  "llama-3.3-70b-h100-16"])
def test_the_recordings_are_aiconfigurators_own_output(case):
    import record

    recorded = json.loads((FIXTURES / "aiconfigurator" / f"{case}.json").read_text())
    live = json.loads(json.dumps(record.record(case)))
    assert live["columns"] == recorded["columns"] and live["support_note"] == recorded["support_note"]
    assert live["rows"].keys() == recorded["rows"].keys()
    for mode, rows in recorded["rows"].items():
        assert len(live["rows"][mode]) == len(rows), mode
        for got, want in zip(live["rows"][mode], rows):
            for g, w in zip(got, want):
                assert g == (pytest.approx(w) if isinstance(w, float) else w), mode


def test_deepseek_v3_on_16_h200_is_written_with_attention_dp_and_predicted(tmp_path, capsys):
    out = tmp_path / "dsv3.yaml"
    rc, _, err = _run(["size", "--model", "deepseek-ai/DeepSeek-V3", "--system", "h200_sxm", "--gpus", "16", "--isl",
                       "8000", "--osl", "1000", "--ttft", "2000", "--tpot", "40", "-o", str(out)], capsys)
    assert rc == 0, err
    assert "1x ctx TEP8 bs1 + 1x gen ADP8 EP2 ETP4 bs16/rank" in err and "deploys exactly this (16 GPUs" in err
    rc, stdout, err = _run(["plan", str(out), "--predict", "--json"], capsys)
    assert rc == 0, err
    doc = json.loads(stdout)
    p = doc["prediction"]
    assert p["generation"]["layout"] == "ADP8 EP2 ETP4" and p["generation"]["batch"] == 16
    assert p["ttft_ms"] > 0 and p["tpot_ms"] > 0 and p["gpus"] == 16
    assert doc["roles"]["generation"]["memory"]["fits_sequence"]


def test_plan_predict_answers_for_the_shipped_deepseek_r1_recipe(capsys):
    rc, stdout, err = _run(["plan", "deepseek-r1-gb200", "--predict", "--json"], capsys)
    assert rc == 0, err
    p = json.loads(stdout)["prediction"]
    assert p["context"]["layout"] == "DEP4" and p["generation"]["layout"] == "DEP16"
    assert p["gemm"] == "nvfp4" and p["ttft_ms"] > 0 and p["tokens_s_gpu"] > 0


def test_plan_aggregated_predict_is_aiconfigurators_aggregated_estimate(capsys):
    rc, stdout, err = _run(["plan", "deepseek-r1-gb200", "--set", "aggregated.tp=8", "--aggregated", "--predict",
                            "--json"], capsys)
    assert rc == 0, err
    p = json.loads(stdout)["prediction"]
    assert p["mode"] == "aggregated" and "context" not in p and p["transfer"] is None
    assert p["aggregated"]["layout"] == "DEP8" and p["aggregated"]["instances"] == 3 and p["gpus"] == 24
    assert p["ttft_ms"] > 0 and p["tpot_ms"] > 0 and p["tokens_s_gpu"] > 0 and p["gemm"] == "nvfp4"


@pytest.mark.parametrize("case", ["kimi-k2-gb200-16", "gpt-oss-120b-h200-8", "qwen3-235b-h100-16",
                                  "deepseek-r1-h100-32", "qwen2.5-72b-dir-h100-16"])
def test_plan_predict_answers_for_what_tk_size_writes(case, tmp_path):
    """The recipe written from the recorded search, predicted by aiconfigurator for real."""
    from tests.size.test_size import size_from
    from toolkit import api

    result = size_from(FIXTURES / "aiconfigurator" / f"{case}.json")
    path = tmp_path / "r.yaml"
    path.write_text(result.recipe_text)
    p = api.predict(api.load_plan(str(path)))
    assert p["ttft_ms"] > 0 and p["tpot_ms"] > 0 and p["gpus"] == result.chosen.gpus_used
    # aiconfigurator models the exact row tk size chose: its own TPOT comes back
    assert p["tpot_ms"] == pytest.approx(result.chosen.tpot_ms, rel=0.25)


def test_local_directories_pass_their_architecture(tmp_path):
    from toolkit.facts.models import resolve_model
    from toolkit.size import aiconfigurator as aic

    kimi = resolve_model(str(FIXTURES / "models" / "kimi-k2"))
    path, arch = aic.model_path_for(kimi)
    assert (path, arch) == (str(FIXTURES / "models" / "kimi-k2"), "DeepseekV3ForCausalLM")
    assert aic.check_support(path, "gb200", arch) is None
    qwen2_path, qwen2_arch = aic.model_path_for(resolve_model(str(FIXTURES / "models" / "qwen2.5-72b")))
    note = aic.check_support(qwen2_path, "h100_sxm", qwen2_arch)
    assert "no disaggregated TensorRT-LLM result for Qwen2ForCausalLM on h100_sxm" in note


def test_an_unsupported_local_model_says_whether_the_architecture_or_the_system_is_the_problem(tmp_path, capsys):
    base = ["--gpus", "16", "--isl", "4000", "--osl", "500", "--ttft", "2000", "--tpot", "50"]
    mistral = tmp_path / "mistral"
    mistral.mkdir()
    (mistral / "config.json").write_text(json.dumps({
        "architectures": ["MistralForCausalLM"], "hidden_size": 5120, "head_dim": 128, "intermediate_size": 32768,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 40, "vocab_size": 131072}))
    rc, _, err = _run(["size", "--model", str(mistral), "--system", "h200_sxm", *base], capsys)
    assert rc == 2 and "the architecture is the problem: MistralForCausalLM" in err and "Fix:" in err
    k25 = tmp_path / "kimi-k25"
    k25.mkdir()
    cfg = json.loads((FIXTURES / "models" / "kimi-k2" / "config.json").read_text())
    (k25 / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"],
                                                 "text_config": cfg}))
    rc, _, err = _run(["size", "--model", str(k25), "--system", "h100_sxm", *base], capsys)
    assert rc == 2 and "the system is the problem" in err and "KimiK25ForConditionalGeneration" in err
    assert "--system one of" in err and "gb200" in err
    rc, _, err = _run(["size", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--system", "tpu_v9", *base], capsys)
    assert rc == 2 and "the system is the problem: 'tpu_v9'" in err and "h100_sxm" in err


def test_unsupported_built_in_model_lists_what_is_supported(capsys):
    rc, _, err = _run(["size", "--model", "tk/standin-tiny", "--system", "h100_sxm", "--gpus", "8", "--isl", "1000",
                       "--osl", "100", "--ttft", "1000", "--tpot", "30"], capsys)
    assert rc == 2 and "cannot size tk/standin-tiny" in err and "moonshotai/Kimi-K2-Instruct" in err


def test_impossible_sla_exits_2_with_the_closest_candidate(capsys):
    rc, _, err = _run(["size", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--system", "h100_sxm", "--gpus", "2",
                       "--isl", "2000", "--osl", "200", "--ttft", "2000", "--tpot", "0.5"], capsys)
    assert rc == 2, err
    assert "impossible SLA" in err and "Closest:" in err and "TPOT" in err


def test_plan_predict_of_a_dense_recipe_maps_the_roles(capsys):
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


@pytest.mark.parametrize("model,system,tp,dp,ep", [
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", 8, 1, 8),
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", 1, 8, 8),
    ("meta-llama/Llama-3.3-70B-Instruct", "h100_sxm", 4, 1, 1),
    ("openai/gpt-oss-120b", "h200_sxm", 4, 1, 4),
    ("Qwen/Qwen3-235B-A22B", "h200_sxm", 8, 1, 8),
    ("moonshotai/Kimi-K2-Instruct", "b200_sxm", 8, 1, 8),
])
def test_the_memory_plan_agrees_with_aiconfigurators_memory_model(model, system, tp, dp, ep):
    """One request of 1024 tokens: weights + activations + runtime + its KV, tk's against aiconfigurator's."""
    import contextlib
    import io

    from toolkit.facts.hardware import RUNTIME_OTHER_BYTES, nccl_bytes
    from toolkit.facts.models import BUILTIN_MODELS
    from toolkit.plan import memory
    from toolkit.size import aiconfigurator as aic

    api = aic._import()
    m = BUILTIN_MODELS[model]
    path, _ = aic.model_path_for(m)
    moe = {"moe_tp_size": 1, "moe_ep_size": ep} if m.is_moe else {}
    with contextlib.redirect_stdout(io.StringIO()):
        est = api.cli_estimate(path, system, mode="static", isl=1024, osl=2, batch_size=1, tp_size=tp,
                               attention_dp_size=dp, **moe)
    q, _ = memory.weights_quant(m, None, False)
    s = memory.Sharding(tp * dp, 1, dp > 1, ep)
    weights, _ = memory.weights_per_gpu(m, q, s)
    kv_dtype = "fp8" if m.quantization.startswith("fp8") else "auto"
    ours = (weights + memory.activation_bytes(m, s, 1024) + RUNTIME_OTHER_BYTES + nccl_bytes(tp)
            + memory.kv_bytes_per_token(m, kv_dtype, s, 0) * 1026) / (1 << 30)
    assert ours == pytest.approx(est.memory, rel=0.10)
