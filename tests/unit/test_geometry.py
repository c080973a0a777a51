"""Spec: KV geometry. bytes_per_token = 2 x layers x kv_heads x head_dim x bytes (MHA/GQA),
(kv_lora_rank + qk_rope_head_dim) x layers x bytes (MLA, no factor 2); per request and per TP rank."""

import json

import pytest

from toolkit.facts.models import ModelError, resolve_model
from tests.unit.helpers import BASE, plan_of


def with_model(model, *extra):
    return plan_of(BASE.replace("meta-llama/Llama-3.3-70B-Instruct", model), *extra)


@pytest.mark.parametrize("model,dtype,expected", [
    ("meta-llama/Llama-3.1-8B-Instruct", "auto", 2 * 32 * 8 * 128 * 2),
    ("meta-llama/Llama-3.3-70B-Instruct", "fp8", 2 * 80 * 8 * 128 * 1),
    ("Qwen/Qwen3-0.6B", "auto", 2 * 28 * 8 * 128 * 2),
    ("Qwen/Qwen3-32B", "auto", 2 * 64 * 8 * 128 * 2),
    ("Qwen/Qwen3-235B-A22B", "auto", 2 * 94 * 4 * 128 * 2),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "auto", 2 * 32 * 8 * 128 * 2),
    ("openai/gpt-oss-120b", "auto", 2 * 36 * 8 * 64 * 2),
    ("deepseek-ai/DeepSeek-R1", "fp8", (512 + 64) * 61 * 1),
    ("deepseek-ai/DeepSeek-V3", "auto", (512 + 64) * 61 * 2),
])
def test_bytes_per_token(model, dtype, expected):
    # eight B200s per server hold every one of these models' weights (the memory plan refuses fewer for the MoEs)
    p = with_model(model, f"kv_transfer.dtype={dtype}", "traffic.max_input_len=1024", "cluster.gpu=B200",
                   "context.tp=8", "generation.tp=8")
    assert p.kv.bytes_per_token == expected


def test_tensor_parallel_splits_kv_heads_per_rank():
    p = plan_of(BASE, "context.tp=4", "generation.tp=8", "kv_transfer.dtype=fp8")
    assert p.kv.ctx_bytes_per_token_per_rank == 2 * 80 * 2 * 128  # 8 kv heads / 4 ranks
    assert p.kv.gen_bytes_per_token_per_rank == 2 * 80 * 1 * 128  # 8 kv heads / 8 ranks


def test_mla_latent_is_not_split_across_tp_ranks():
    p = with_model("deepseek-ai/DeepSeek-R1", "context.tp=8", "generation.tp=8", "cluster.gpu=H200",
                   "kv_transfer.dtype=fp8")
    assert p.kv.ctx_bytes_per_token_per_rank == p.kv.bytes_per_token


def test_largest_request_and_estimates():
    p = plan_of(BASE, "traffic.max_input_len=4000", "traffic.prefix_len=96", "kv_transfer.dtype=fp8")
    assert p.kv.largest_request_tokens == 4096
    assert p.kv.largest_request_bytes == 4096 * p.kv.bytes_per_token
    est = p.estimates
    assert est.largest_request_transfer_ms > 0 and est.largest_request_prefill_ms > 0
    # 70B dense over InfiniBand: the prefill, not the transfer, dominates.
    assert not est.transfer_dominates
    slow = plan_of(BASE, "kv_transfer.transport=tcp", "context.tp=8", "traffic.max_input_len=4000")
    assert slow.estimates.largest_request_transfer_ms > est.largest_request_transfer_ms


def test_model_directory_config_json_is_read(tmp_path):
    d = tmp_path / "my-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "num_hidden_layers": 10, "num_attention_heads": 16, "num_key_value_heads": 4,
        "hidden_size": 2048, "intermediate_size": 8192, "vocab_size": 32000, "max_position_embeddings": 8192}))
    spec = resolve_model(str(d))
    assert (spec.num_layers, spec.num_kv_heads, spec.head_dim) == (10, 4, 128)
    p = with_model(str(d), "traffic.max_input_len=1024")
    assert p.kv.bytes_per_token == 2 * 10 * 4 * 128 * 2


def test_mla_config_json(tmp_path):
    d = tmp_path / "mla"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "num_hidden_layers": 27, "num_attention_heads": 16, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
        "hidden_size": 2048, "n_routed_experts": 64, "num_experts_per_tok": 6}))
    spec = resolve_model(str(d))
    assert spec.attention == "mla" and spec.is_moe


def test_unknown_model_and_broken_config_are_clear_errors(tmp_path):
    with pytest.raises(ModelError, match="unknown model"):
        resolve_model("no-such-model")
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="num_hidden_layers"):
        resolve_model(str(d))
