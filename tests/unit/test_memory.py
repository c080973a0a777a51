"""Spec: the memory plan (toolkit/plan/memory.py). Every role gets one GPU's weights, activations, runtime, KV pool
and the tokens it holds; impossible layouts are refused with the smallest layout that fits; NVIDIA's published
TensorRT-LLM recipes (NVIDIA/srt-slurm, tests/fixtures/srt_slurm) are all accepted; heads must split as
TensorRT-LLM splits them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.helpers import BASE, fields, plan_of, violations_of
from toolkit.facts import trtllm, versions
from toolkit.facts.hardware import GPU_FIGURES
from toolkit.facts.models import BUILTIN_MODELS, resolve_model, weight_params
from toolkit.plan import memory

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
LAYOUTS = json.loads((ROOT / "tests" / "fixtures" / "srt_slurm" / "trtllm_layouts.json").read_text())

# Hugging Face config.json values of published checkpoints (the keys tk reads).
QWEN25_72B = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 8192, "intermediate_size": 29568,
              "max_position_embeddings": 32768, "num_attention_heads": 64, "num_hidden_layers": 80,
              "num_key_value_heads": 8, "torch_dtype": "bfloat16", "vocab_size": 152064}
KIMI_K2 = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
           "moe_intermediate_size": 2048, "num_attention_heads": 64, "num_key_value_heads": 64,
           "num_hidden_layers": 61, "vocab_size": 163840, "n_routed_experts": 384, "num_experts_per_tok": 8,
           "n_shared_experts": 1, "first_k_dense_replace": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
           "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "num_nextn_predict_layers": 0,
           "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
           "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": "e4m3"}}


def model_dir(tmp_path: Path, cfg: dict, name: str = "m", **files) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    for fname, doc in files.items():
        (d / fname).write_text(json.dumps(doc))
    return d


def recipe(model: str, gpu: str, gpn: int, ctx: str, gen: str, extra: str = "") -> str:
    return (f"schema_version: 1\nname: m\nmodel: {model}\ncluster: {{gpus_per_node: {gpn}, gpu: {gpu}}}\n"
            f"context: {ctx}\ngeneration: {gen}\nkv_transfer: {{dtype: fp8}}\n"
            f"traffic: {{max_input_len: 8000, max_output_len: 1000}}\n{extra}")


# --- the impossible layouts of issue 20 are refused, with the smallest layout that fits -----------------------

def test_qwen25_72b_bf16_on_one_h100_is_refused_with_tp2(tmp_path):
    d = model_dir(tmp_path, QWEN25_72B)
    vs = violations_of(recipe(str(d), "H100", 8, "{instances: 8, tp: 1}", "{tp: 8}"))
    [v] = vs
    assert v.field == "context.tp" and "more than one H100's 79.6 GiB" in v.message and "bfloat16" in v.message
    assert "tp: 2" in v.fix and "2 x H100 per instance" in v.fix


def test_deepseek_v3_on_one_h200_is_refused(tmp_path):
    # what tk size wrote before attention DP was translated: 1x ctx TP8 + 1x gen TP1
    vs = violations_of(recipe("deepseek-ai/DeepSeek-V3", "H200", 8, "{tp: 8}", "{tp: 1}"))
    [v] = vs
    assert v.field == "generation.tp" and "626.8 GiB" in v.message and "fp8_block" in v.message
    assert "8 x H200 per instance (tp: 8, ep: 8)" in v.fix


@pytest.mark.parametrize("model", ["built-in", "directory"])
def test_kimi_k2_on_one_gb200_is_refused(tmp_path, model):
    name = "moonshotai/Kimi-K2-Instruct" if model == "built-in" else str(model_dir(tmp_path, KIMI_K2))
    vs = violations_of(recipe(name, "GB200", 4, "{tp: 1}", "{tp: 8, ep: 8, attention_dp: true}"))
    assert [v.field for v in vs] == ["context.tp"]
    assert "GB200's 185.0 GiB" in vs[0].message and "8 x GB200 per instance" in vs[0].fix


def test_a_layout_that_fits_plans_and_shows_the_numbers(tmp_path):
    d = model_dir(tmp_path, QWEN25_72B)
    p = plan_of(recipe(str(d), "H100", 8, "{instances: 4, tp: 2}", "{tp: 8}"))
    m = p.context.memory
    assert m.gpu == "H100" and m.gpu_memory_bytes == 81559 << 20 and m.quantization == "bfloat16"  # nvidia-smi's
    assert 66 * GIB < m.weights_bytes < 70 * GIB  # 72.7B x 2 bytes over 2 ranks
    assert m.kv_bytes_per_token == 2 * 80 * 4 * 128 * 1  # 4 of 8 KV heads per rank, fp8
    free = m.gpu_memory_bytes - m.weights_bytes - m.activation_bytes - m.cuda_graph_bytes - m.runtime_bytes
    assert m.kv_pool_bytes == int(free * 0.85) and m.kv_pool_tokens == m.kv_pool_bytes // m.kv_bytes_per_token
    assert m.fits_sequence and m.sequence_tokens == 8000
    g = p.generation.memory
    assert g.sequence_tokens == 9000 and g.max_batch_size == 256 and g.batch_tokens == 256 * 9000


# --- NVIDIA's published recipes are never refused ----------------------------------------------------------------

def _role_plans():
    for layout in LAYOUTS["layouts"]:
        model = BUILTIN_MODELS[layout["model"]]
        q, _ = memory.weights_quant(model, layout["quantization"], True)
        for name, opts in layout["roles"].items():
            mtp = (opts.get("speculative_config") or {}).get("num_nextn_predict_layers", 0)
            seq = layout["isl"] if name == "prefill" else opts["max_seq_len"]
            yield layout, name, memory.plan_role(
                name, model, GPU_FIGURES[layout["gpu"]], q, opts, sequence_tokens=seq,
                kv_extra_layers=versions.mtp_kv_layers(trtllm.get(versions.latest()), mtp),
                buffer_tokens=opts.get("max_tokens_in_buffer", 0))


def test_no_published_tensorrt_llm_recipe_is_refused():
    seen = {(layout["model"], layout["gpu"], layout["quantization"]) for layout in LAYOUTS["layouts"]}
    # DeepSeek-R1 (fp8 and nvfp4) on H100/H200/B200/B300/GB200/GB300, Kimi-K2.5/2.6 nvfp4, gpt-oss-120b mxfp4
    assert {("deepseek-ai/DeepSeek-R1", "H100", "fp8_block"), ("deepseek-ai/DeepSeek-R1", "GB200", "nvfp4"),
            ("moonshotai/Kimi-K2-Instruct", "GB200", "nvfp4"), ("openai/gpt-oss-120b", "B200", "mxfp4")} <= seen
    refused, planned = [], 0
    for layout, name, (m, errors, _) in _role_plans():
        planned += 1
        refused += [(layout["source"], name, e) for e in errors]
        assert m.weights_bytes < m.gpu_memory_bytes and m.fits_sequence, (layout["source"], name)
    assert not refused
    assert planned >= 800


def test_published_recipes_warn_rarely():
    warned = [(layout["source"], w) for layout, _, (_, _, warnings) in _role_plans() for w in warnings]
    assert len(warned) <= 20 and all("full sequences" in w for _, w in warned)  # only batch-size notes


# --- weights -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(n for n in BUILTIN_MODELS if not n.startswith("tk/")))
def test_built_in_parameter_counts_match_the_model_cards(name):
    m = BUILTIN_MODELS[name]
    w = weight_params(m)
    assert w.total == pytest.approx(m.params, rel=0.02)
    assert w.active == pytest.approx(m.active_params, rel=0.08)


def test_config_json_parameters_count_gqa_attention_exactly(tmp_path):
    m = resolve_model(str(model_dir(tmp_path, QWEN25_72B)))
    assert m.params == pytest.approx(72.7e9, rel=0.01)  # the model card; the old 4h^2 estimate said 82.1B


@pytest.mark.parametrize("cfg,files,expected", [
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}, {}, "fp8_block"),
    ({"quantization_config": {"quant_method": "mxfp4"}}, {}, "mxfp4"),
    ({}, {"hf_quant_config.json": {"quantization": {"quant_algo": "NVFP4"}}}, "nvfp4"),
    ({}, {"hf_quant_config.json": {"quantization": {"quant_algo": "FP8"}}}, "fp8"),
    ({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {
        "num_bits": 4, "type": "float", "group_size": 16}}}}}, {}, "nvfp4"),
    ({}, {}, ""),
])
def test_the_checkpoint_quantization_is_read_from_the_directory(tmp_path, cfg, files, expected):
    m = resolve_model(str(model_dir(tmp_path, {**QWEN25_72B, **cfg}, **files)))
    assert m.quantization == expected


@pytest.mark.parametrize("qc,field", [
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
      "config_groups": [{"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "group_size": 16}}]},
     "quantization_config.config_groups is a list"),
    ({"quant_method": "compressed-tensors", "config_groups": "W4A16"}, "quantization_config.config_groups is a str"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": [4], "type": "float"}}}},
     "quantization_config.config_groups: no group"),
    ({"quant_method": "hqq"}, "quantization_config.quant_method 'hqq'"),
    ({"quant_method": "modelopt", "quant_algo": "W2A2"}, "quantization_config.quant_algo 'W2A2' (modelopt)"),
    (["fp8"], "quantization_config is a list"),
])
def test_a_declared_quantization_tk_cannot_read_is_unknown_named_and_judged_at_four_bits(tmp_path, qc, field):
    """Never a crash: the file and field are named, the weights' quantization is unknown (the lower bound assumes
    4 bits, as for a recipe quantization tk does not know) and the plan warns."""
    d = model_dir(tmp_path, {**QWEN25_72B, "quantization_config": qc})
    m = resolve_model(str(d))
    assert m.quantization == "" and m.quantization_unread.startswith(f"{d / 'config.json'}: {field}")
    q, warning = memory.weights_quant(m, None, False)
    assert not q.certain and warning.startswith(m.quantization_unread) and "4 bits" in warning
    assert "set quantization" in warning
    p = plan_of(BASE.replace("model: meta-llama/Llama-3.3-70B-Instruct", f"model: {d}").replace("quantization: fp8\n", ""))
    assert any(w.startswith(f"{d / 'config.json'}: {field}") for w in p.warnings)
    assert p.context.memory.weights_min_bytes < p.context.memory.weights_bytes


def test_attention_dp_replicates_attention_and_dense_layers_but_splits_experts():
    m = BUILTIN_MODELS["deepseek-ai/DeepSeek-R1"]
    q, _ = memory.weights_quant(m, None, False)
    tep, _ = memory.weights_per_gpu(m, q, memory.Sharding(8, 1, False, 8))
    dep, _ = memory.weights_per_gpu(m, q, memory.Sharding(8, 1, True, 8))
    w = weight_params(m)
    # what DEP8 holds whole on every rank instead of an eighth: attention's TP-split projections, the dense MLPs and
    # shared experts (fp8), the embedding and the lm_head (bf16)
    replicated = (w.attn_split * m.num_layers + w.dense_mlp * w.dense_layers + w.shared * w.moe_layers
                  + 2 * (w.embed + w.lm_head)) * 7 / 8
    assert dep - tep == pytest.approx(replicated, rel=0.05)


def test_nvfp4_moe_checkpoints_keep_attention_in_16_bits_in_the_estimate_not_the_lower_bound():
    m = BUILTIN_MODELS["moonshotai/Kimi-K2-Instruct"]
    q, _ = memory.weights_quant(m, "nvfp4", False)
    est, _ = memory.weights_per_gpu(m, q, memory.Sharding(4, 1, True, 4))
    low, _ = memory.weights_per_gpu(m, q, memory.Sharding(4, 1, True, 4), lower=True)
    assert 150 * GIB < est < GPU_FIGURES["GB200"].memory_bytes  # DEP4 on GB200, as NVIDIA runs it
    assert low < 140 * GIB


def test_a_built_in_model_served_from_another_checkpoint_is_judged_at_four_bits(tmp_path):
    # model_path may hold a quantized variant: bf16 Llama-3.3-70B on one H100 is a warning, not a refusal
    text = BASE.replace("quantization: fp8\n", "") + "model_path: /models/llama-70b\n"
    p = plan_of(text)
    assert p.context.memory.quantization == "bfloat16" and p.context.memory.weights_min_bytes < 40 * GIB
    assert any("exceed a H100" in w or "exceed" in w for w in p.warnings)
    assert "context.tp" in fields(violations_of(BASE.replace("quantization: fp8\n", "")))


def test_an_unknown_quantization_is_a_warning_and_judged_at_four_bits():
    p = plan_of(BASE.replace("quantization: fp8", "quantization: int3-magic"))
    assert any("int3-magic" in w and "4 bits" in w for w in p.warnings)


# --- the KV pool ---------------------------------------------------------------------------------------------

def test_a_pool_that_cannot_hold_one_sequence_is_refused():
    vs = violations_of(BASE, "context.extra_options.kv_cache_config.free_gpu_memory_fraction=0.01",
                       "traffic.max_input_len=60000", "traffic.max_output_len=1000")
    assert any(v.field == "context.tp" and "cannot hold one full sequence" in v.message for v in vs)


def test_a_pool_that_cannot_hold_the_batch_is_a_warning():
    p = plan_of(BASE, "generation.max_batch_size=4096", "traffic.max_input_len=8000")
    assert not p.generation.memory.fits_batch and p.generation.memory.fits_sequence
    assert any(w.startswith("generation: the KV pool holds") and "max_batch_size 4096" in w for w in p.warnings)


def test_kv_cache_max_tokens_caps_the_pool():
    p = plan_of(BASE, "generation.extra_options.kv_cache_config.max_tokens=20000")
    assert p.generation.memory.kv_pool_tokens == 20000


def test_attention_dp_keeps_every_kv_head_on_each_rank():
    # Qwen3-235B-A22B: 4 KV heads. TP8 gives each rank one (replicated); DEP8 keeps all four per rank.
    text = BASE.replace("meta-llama/Llama-3.3-70B-Instruct", "Qwen/Qwen3-235B-A22B")
    p = plan_of(text, "context.tp=8", "generation.tp=8", "generation.attention_dp=true", "kv_transfer.dtype=fp8")
    assert p.context.kv.bytes_per_token_per_rank == 2 * 94 * 1 * 128
    assert p.generation.kv.bytes_per_token_per_rank == 2 * 94 * 4 * 128
    assert p.generation.memory.kv_bytes_per_token == 2 * 94 * 4 * 128


def test_the_memory_plan_is_in_plan_json_and_the_manifest(tmp_path):
    from toolkit import api

    p = api.load_plan("deepseek-r1-gb200")
    doc = api.plan_summary(p)
    mem = doc["roles"]["generation"]["memory"]
    assert mem["gpu"] == "GB200" and mem["quantization"] == "nvfp4" and mem["fits_sequence"] is True
    assert mem["kv_pool_tokens"] > 0 and set(mem["weights_detail"]) >= {"layers", "embedding", "lm_head", "mtp"}
    assert doc["gpu"] == "GB200" and doc["quantization"] == "nvfp4"
    assert doc["roles"]["generation"]["moe_tp"] == 1
    out, files = api.render(p, tmp_path / "r")
    manifest = json.loads(files["manifest.json"])
    assert manifest["derived"]["roles"]["context"]["memory"] == doc["roles"]["context"]["memory"]


def test_the_stand_in_has_no_gpu_memory_plan():
    p = plan_of((ROOT / "recipes" / "standin-2p2d.yaml").read_text())
    assert p.context.memory is None and p.generation.memory is None


def test_the_aggregated_baseline_gets_a_memory_plan_and_its_refusal_names_aggregated_tp():
    from toolkit.plan.build import build_plan
    from toolkit.recipe import load_recipe_text
    from toolkit.errors import RecipeError

    agg = build_plan(load_recipe_text(BASE, "r.yaml", ["context.tp=8", "generation.tp=8", "aggregated.tp=2"]),
                     aggregated=True)
    assert agg.aggregated.memory is not None and agg.aggregated.memory.fits_sequence
    text = BASE.replace("quantization: fp8", "quantization: bfloat16")
    with pytest.raises(RecipeError) as info:
        build_plan(load_recipe_text(text, "r.yaml", ["context.tp=2", "generation.tp=2", "aggregated.tp=1"]),
                   aggregated=True)
    assert [v.field for v in info.value.violations] == ["aggregated.tp"]


# --- heads and TP (TensorRT-LLM's asserts) ---------------------------------------------------------------------

LLAMA4_SCOUT = {"architectures": ["Llama4ForConditionalGeneration"], "text_config": {
    "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_attention_heads": 40,
    "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 48, "num_local_experts": 16,
    "num_experts_per_tok": 1, "vocab_size": 202048, "max_position_embeddings": 10485760,
    "interleave_moe_layer_step": 1, "torch_dtype": "bfloat16"}}


def test_tp_must_divide_the_attention_heads(tmp_path):
    d = model_dir(tmp_path, LLAMA4_SCOUT)
    vs = violations_of(recipe(str(d), "H200", 8, "{tp: 4}", "{tp: 16, ep: 16}"))
    v = next(v for v in vs if v.field == "generation.tp")
    assert "does not divide the model's 40 attention heads" in v.message and "num_heads % tp == 0" in v.message
    assert "1, 2, 4, 8" in v.fix and "attention_dp: true" in v.fix
    # under attention DP every rank runs all heads: no split to refuse
    assert not any("attention heads" in v.message for v in
                   violations_of(recipe(str(d), "H200", 8, "{tp: 3}", "{tp: 16, ep: 16, attention_dp: true}"))
                   if v.field == "generation.tp")


@pytest.mark.parametrize("heads,kv,tp,ok", [
    (64, 8, 16, True),  # more ranks than KV heads: each head replicated twice
    (64, 8, 8, True),
    (48, 6, 4, False),  # 6 KV heads over 4 ranks
    (48, 6, 16, False),  # 16 ranks, 6 KV heads: 16 % 6
    (48, 6, 12, True),
    (40, 8, 8, True),
])
def test_kv_heads_split_or_replicate_evenly(heads, kv, tp, ok):
    m = BUILTIN_MODELS["meta-llama/Llama-3.1-8B-Instruct"].__class__(
        name="x", num_layers=2, num_attention_heads=heads, num_kv_heads=kv, head_dim=128, params=1e9,
        active_params=1e9)
    assert (memory.check_heads(m, tp, attention_dp=False) is None) is ok


def test_mla_needs_only_the_query_heads_to_divide():
    m = BUILTIN_MODELS["deepseek-ai/DeepSeek-R1"]
    assert memory.check_heads(m, 16, False) is None and memory.check_heads(m, 3, False) is not None


# --- quantization and hardware: warned, not refused (TensorRT-LLM has no start-up check) ------------------------

def test_nvfp4_on_h100_is_a_warning():
    p = plan_of(BASE.replace("quantization: fp8", "quantization: nvfp4"))
    assert any("nvfp4 on H100" in w and "Blackwell only" in w for w in p.warnings)


def test_fp8_kv_cache_on_a100_is_accepted_silently():
    p = plan_of(BASE.replace("meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-3.1-8B-Instruct").replace(
        "quantization: fp8\n", ""), "cluster.gpu=A100", "kv_transfer.dtype=fp8")
    assert not any("A100" in w for w in p.warnings)


# --- what the options add to the weights: EPLB slots, MTP modules, a draft model; GPUs as nvidia-smi reports them --

QWEN3_MOE = BASE.replace("meta-llama/Llama-3.3-70B-Instruct", "Qwen/Qwen3-235B-A22B") + \
    "context:\n  tp: 4\ngeneration:\n  tp: 8\n  ep: 8\n  attention_dp: true\n"
EAGLE3_DRAFT = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 4096, "intermediate_size": 14336,
                "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1, "vocab_size": 128256,
                "draft_vocab_size": 32000, "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}


def test_eplb_redundant_expert_slots_are_weights_on_every_gpu():
    # before: num_slots changed nothing in the memory plan. TensorRT-LLM allocates num_slots // ep slots per EP rank
    # (WideEPMoE.expert_size_per_partition = num_local_slots), each a whole expert's weights
    plain = plan_of(QWEN3_MOE).generation.memory
    eplb = plan_of(QWEN3_MOE, "generation.extra_options.moe_config.load_balancer.num_slots=160").generation.memory
    m = BUILTIN_MODELS["Qwen/Qwen3-235B-A22B"]
    w = weight_params(m)
    slots = dict(eplb.weights_detail)["expert_slots"]
    per_expert_layer = w.experts / m.num_experts / 8 * 1.0  # fp8: one byte a weight, over the 8 EP ranks
    assert slots == pytest.approx(w.moe_layers * 32 * per_expert_layer, rel=1e-6)  # 160 - 128 redundant slots
    assert eplb.weights_bytes == plain.weights_bytes + slots and eplb.kv_pool_bytes < plain.kv_pool_bytes
    assert any("32 redundant expert slots" in n for n in eplb.notes)


def test_eplb_slots_must_split_over_the_expert_parallel_ranks():
    # TensorRT-LLM: MoeLoadBalancerConfig.setup raises unless num_slots % ep_size == 0
    [v] = violations_of(QWEN3_MOE, "generation.extra_options.moe_config.load_balancer.num_slots=132")
    assert v.field == "generation.extra_options.moe_config.load_balancer.num_slots" and "multiple of 8" in v.fix
    p = plan_of(QWEN3_MOE, "generation.extra_options.moe_config.load_balancer.num_slots=120")
    assert any("fewer than Qwen/Qwen3-235B-A22B's 128 experts" in w for w in p.warnings)


def test_mtp_modules_are_one_for_mtp_eagle_and_one_per_draft_token_for_vanilla_mtp():
    # MTPForCausalLM: mtp_num_layers = 1 for MTP-Eagle one-model (what tk renders), num_nextn_predict_layers with
    # use_mtp_vanilla
    text = recipe("deepseek-ai/DeepSeek-R1", "B200", 8, "{tp: 8, ep: 8, attention_dp: true}",
                  "{tp: 8, ep: 8, attention_dp: true}", "quantization: fp8_block\n")
    one = dict(plan_of(text, "speculative.mtp_layers=3").generation.memory.weights_detail)["mtp"]
    vanilla = plan_of(text, "speculative.mtp_layers=3", "speculative.options.use_mtp_vanilla=true")
    assert dict(vanilla.generation.memory.weights_detail)["mtp"] == pytest.approx(3 * one, rel=1e-6)


def test_an_eagle3_draft_model_is_weights_beside_the_target(tmp_path):
    draft = model_dir(tmp_path, EAGLE3_DRAFT, "eagle3")
    base = BASE.replace("meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-3.1-8B-Instruct")
    spec = ["speculative.decoding_type=Eagle3", "speculative.max_draft_len=3"]
    without = plan_of(base).generation.memory
    read = plan_of(base, *spec, f"speculative.model={draft}").generation.memory
    h, q, kv, inter = 4096, 32 * 128, 8 * 128, 14336
    layer = 2 * h * (q + 2 * kv) + q * h + 3 * h * inter  # Eagle3's QKV takes 2 x hidden
    # + fc (3 captured layers) + its lm_head of draft_vocab_size rows (Eagle3ForCausalLM: vocab_size =
    # draft_vocab_size), 16-bit
    expected = (layer + 3 * h * h + 32000 * h) * 2
    assert dict(read.weights_detail)["draft"] == expected
    assert read.weights_bytes == without.weights_bytes + expected and not read.notes
    guessed = plan_of(base, *spec, "speculative.model=/nowhere/eagle3").generation.memory
    # the target's geometry (the same shape here) and its vocabulary, having no draft config to say otherwise
    assert dict(guessed.weights_detail)["draft"] == (layer + 3 * h * h + 128256 * h) * 2
    assert any("estimated as one decoder layer" in n and "/nowhere/eagle3" in n for n in guessed.notes)


def test_an_eagle_draft_is_the_eagle3_model_and_its_fc_takes_the_captured_layers(tmp_path):
    """TensorRT-LLM's PyTorch backend runs decoding_type Eagle as EAGLE3 one-model (EagleDecodingConfig.spec_dec_mode;
    Eagle3DecodingConfig only renames it), and Eagle3DraftModel's fc takes num_capture_layers x hidden: the
    eagle3_layers_to_capture given, else 3; with one captured layer (eagle3_model_arch mistral_large3: {-1}) there
    is no fc (llm_args.py @ 0004396720054fd8e205cbf616f21f0b57c6b412, modeling_speculative.py @ b35ac1b6)."""
    draft = model_dir(tmp_path, EAGLE3_DRAFT, "eagle3")
    base = BASE.replace("meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-3.1-8B-Instruct")

    def draft_bytes(*options):
        spec = ["speculative.max_draft_len=3", f"speculative.model={draft}", *options]
        return dict(plan_of(base, *spec).generation.memory.weights_detail)["draft"]

    h = 4096
    eagle3 = draft_bytes("speculative.decoding_type=Eagle3")
    assert draft_bytes("speculative.decoding_type=Eagle") == eagle3  # before: a 1 x hidden QKV and a 2 x hidden fc
    two = draft_bytes("speculative.decoding_type=Eagle3", "speculative.options.eagle3_layers_to_capture=[1,20]")
    assert eagle3 - two == h * h * 2
    one = draft_bytes("speculative.decoding_type=Eagle3", "speculative.options.eagle3_model_arch=mistral_large3")
    assert eagle3 - one == 3 * h * h * 2


def test_gpu_memory_is_what_nvidia_smi_reports():
    # H100 80GB HBM3 and H200 read on the machines (issue 30); B200 from public nvidia-smi printouts; the Blackwell
    # Ultra, GB200 and L40S rows from aiconfigurator 0.12.0's systems files ("reported by nvidia-smi")
    mib = {name: g.memory_bytes >> 20 for name, g in GPU_FIGURES.items() if g.memory_bytes}
    assert mib == {"H100": 81559, "H200": 143771, "B200": 183359, "GB200": 189471, "B300": 275040,
                   "GB300": 284208, "A100": 81920, "L40S": 46068}
    assert all(g.memory_bytes % (1 << 20) == 0 for g in GPU_FIGURES.values())
