"""Spec: a model directory's config.json is checked when read: malformed or hostile files are refused with the file and field named.

Every bad value ends in a RecipeError whose violation names the file, the key, the value and the fix; never a
ZeroDivisionError, TypeError, ValueError or UnicodeDecodeError, and never a plan with non-positive sizes.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.helpers import plan_of
from toolkit.errors import RecipeError
from toolkit.facts.models import ModelError, checkpoint_quantization, resolve_model

ROOT = Path(__file__).resolve().parents[2]
STANDIN = (ROOT / "recipes" / "standin-2p2d.yaml").read_text()
GOOD = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512}


def _model_dir(root: Path, content) -> Path:
    d = root / "m"
    d.mkdir(exist_ok=True)
    data = content if isinstance(content, bytes) else (
        content if isinstance(content, str) else json.dumps(content)).encode()
    (d / "config.json").write_bytes(data)
    return d


def _violation(root: Path, content):
    d = _model_dir(root, content)
    with pytest.raises(RecipeError) as info:
        plan_of(STANDIN, f"model={d}")
    [v] = info.value.violations
    assert v.field == "model" and str(d / "config.json") in v.message and v.fix
    return v


# --- the reproductions of bugs 14 (config.json rows) and 18 ------------------------------------------------

@pytest.mark.parametrize("changes,key,shown", [
    ({"num_attention_heads": 0}, "num_attention_heads", "0"),                # bug 14: ZeroDivisionError
    ({"hidden_size": "abc"}, "hidden_size", "'abc'"),                        # bug 14: TypeError
    ({"num_experts": "many"}, "num_experts", "'many'"),                      # bug 14: ValueError
    ({"max_position_embeddings": "lots"}, "max_position_embeddings", "'lots'"),
    ({"kv_lora_rank": 512, "qk_rope_head_dim": "x"}, "qk_rope_head_dim", "'x'"),
    ({"num_hidden_layers": -4}, "num_hidden_layers", "-4"),                  # bug 18: -2048 bytes per token
    ({"num_hidden_layers": 0}, "num_hidden_layers", "0"),                    # bug 18
    ({"num_key_value_heads": -2}, "num_key_value_heads", "-2"),              # bug 18
    ({"head_dim": 64.5}, "head_dim", "64.5"),                                # bug 18: silently 64
    ({"num_key_value_heads": 3}, "num_key_value_heads", "3"),                # 8 heads not divisible by 3
    ({"num_key_value_heads": 16}, "num_key_value_heads", "16"),              # more KV heads than heads
    ({"num_hidden_layers": True}, "num_hidden_layers", "true"),
    ({"hidden_size": 500}, "hidden_size", "500"),                            # head_dim would be 62.5
    ({"num_experts": 0}, "num_experts", "0"),
    ({"num_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok", "9"),
    ({"max_position_embeddings": -1}, "max_position_embeddings", "-1"),
    ({"num_hidden_layers": 10 ** 30}, "num_hidden_layers", "1000000000000000000000000000000"),
    ({"vocab_size": [1]}, "vocab_size", "[1]"),
    ({"intermediate_size": {"a": 1}}, "intermediate_size", '{"a": 1}'),
    ({"torch_dtype": "bf16; rm -rf /"}, "torch_dtype", "'bf16; rm -rf /'"),
])
def test_bad_config_values_are_violations_naming_file_key_and_value(tmp_path, changes, key, shown):
    v = _violation(tmp_path, {**GOOD, **changes})
    assert f": {key}: {shown} " in v.message
    assert key in v.fix


def test_nan_in_config_json_is_a_violation(tmp_path):                       # bug 14: hidden_size: NaN
    text = json.dumps(GOOD).replace('"hidden_size": 512', '"hidden_size": NaN')
    v = _violation(tmp_path, text)
    assert "hidden_size: NaN is not an integer" in v.message


@pytest.mark.parametrize("content,expect", [
    (b'{"num_hidden_layers": 4, "name": "\xff\xfe"}', "not UTF-8"),         # bug 14: UnicodeDecodeError
    ('{"num_hidden_layers": 4,', "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
    ("{}", "missing integer field 'num_hidden_layers'"),
    ({"num_hidden_layers": 4, "num_attention_heads": 8}, "neither head_dim nor hidden_size"),
])
def test_unreadable_config_json_is_a_violation(tmp_path, content, expect):
    assert expect in _violation(tmp_path, content).message


def test_integral_floats_and_nulls_are_accepted(tmp_path):
    d = _model_dir(tmp_path, {**GOOD, "head_dim": 64.0, "num_experts": None, "max_position_embeddings": None})
    spec = resolve_model(str(d))
    assert (spec.head_dim, spec.num_experts, spec.max_position_embeddings) == (64, 0, 0)
    assert isinstance(spec.head_dim, int)


def test_missing_hidden_size_still_gives_a_positive_prefill_estimate(tmp_path):
    d = _model_dir(tmp_path, {"num_hidden_layers": 4, "num_attention_heads": 8, "head_dim": 64})
    p = plan_of(STANDIN, f"model={d}")
    assert p.model.params > 0 and p.estimates.largest_request_prefill_ms > 0


def test_model_error_is_a_value_error_with_a_fix(tmp_path):
    d = _model_dir(tmp_path, {**GOOD, "num_attention_heads": 0})
    with pytest.raises(ModelError) as info:
        resolve_model(str(d))
    assert isinstance(info.value, ValueError) and "num_attention_heads" in info.value.fix


def test_a_model_name_the_os_cannot_take_is_a_directory_that_does_not_exist():
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model("./a\0b")



# --- what each section of a config.json becomes (the fields read beyond the attention geometry) -------------

_MOE_BASE = {"num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "hidden_size": 2048}


@pytest.mark.parametrize("changes,expected", [
    # Qwen2-MoE style: one MoE layer every decoder_sparse_step layers (more than mlp_only_layers names), a shared
    # expert of its own size, the routed experts' size apart from the dense MLP's
    ({"num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408, "intermediate_size": 5632,
      "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 2, "mlp_only_layers": [0, 1, 2],
      "vocab_size": 151936},
     dict(num_experts=60, experts_per_token=4, intermediate_size=5632, moe_intermediate_size=1408,
          shared_expert_intermediate_size=5632, num_shared_experts=0, dense_layers=24, vocab_size=151936,
          dtype="bfloat16", architecture="")),
    # Llama 4: intermediate_size is each expert's, intermediate_size_mlp the dense layers'; one implied shared
    # expert; a null torch_dtype is bfloat16
    ({"architectures": ["Llama4ForConditionalGeneration"], "num_local_experts": 16, "num_experts_per_tok": 1,
      "intermediate_size": 8192, "intermediate_size_mlp": 16384, "interleave_moe_layer_step": 1,
      "tie_word_embeddings": True, "torch_dtype": None},
     dict(num_experts=16, experts_per_token=1, intermediate_size=16384, moe_intermediate_size=8192,
          num_shared_experts=1, dense_layers=0, tie_word_embeddings=True, dtype="bfloat16",
          architecture="Llama4ForConditionalGeneration")),
    # gpt-oss style: sliding-window layers counted from layer_types, first_k_dense_replace dense layers, MTP
    # layers and an Eagle3 draft vocabulary
    ({"architectures": ["GptOssForCausalLM"], "num_local_experts": 32, "num_experts_per_tok": 4,
      "intermediate_size": 2880, "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 24,
      "first_k_dense_replace": 2, "num_nextn_predict_layers": 1, "draft_vocab_size": 32000},
     dict(num_experts=32, moe_intermediate_size=2880, dense_layers=2, sliding_window=128, sliding_layers=24,
          mtp_layers=1, draft_vocab_size=32000, tie_word_embeddings=False)),
    # a dense model: the MoE fields are 0 whatever the file says; an architecture that is not a class name is ""
    ({"architectures": ["bad name!"], "dtype": "float16", "shared_expert_intermediate_size": 512,
      "first_k_dense_replace": 3, "sliding_window": 4096},
     dict(num_experts=0, moe_intermediate_size=0, shared_expert_intermediate_size=0, dense_layers=0,
          sliding_window=0, sliding_layers=0, dtype="float16", architecture="")),
])
def test_the_expert_layer_vocabulary_and_window_fields_of_a_config_json_are_read(tmp_path, changes, expected):
    m = resolve_model(str(_model_dir(tmp_path, {**_MOE_BASE, **changes})))
    assert {k: getattr(m, k) for k in expected} == expected
    assert (m.num_layers, m.num_attention_heads, m.num_kv_heads, m.head_dim) == (48, 32, 4, 64)


@pytest.mark.parametrize("changes,message,fix", [
    ({"n_routed_experts": 8, "n_shared_experts": -1}, "n_shared_experts: -1 must not be negative",
     "set n_shared_experts in {config} to the value the checkpoint was trained with (a positive integer)"),
    ({"kv_lora_rank": 512, "qk_rope_head_dim": 64, "hidden_size": None},
     "missing integer field 'hidden_size'; tk needs it to estimate the prefill",
     "add hidden_size to {config} (the checkpoint's own value)"),
    ({"num_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok: 9 is more than the model's 8 experts "
     "(num_experts)", "set num_experts_per_tok in {config} to at most 8"),
    ({"num_key_value_heads": 3}, "num_key_value_heads: 3 does not divide num_attention_heads (32); grouped-query "
     "attention shares each KV head among a whole number of query heads",
     "set num_key_value_heads in {config} to a divisor of 32"),
    ({"hidden_size": 2047}, "hidden_size: 2047 is not a multiple of num_attention_heads (32), so head_dim is not a "
     "whole number", "correct hidden_size, or add the checkpoint's head_dim to {config}"),
    # two bad fields: the first one read is named
    ({"num_hidden_layers": 0, "num_attention_heads": 0}, "num_hidden_layers: 0 must be positive",
     "set num_hidden_layers in {config} to the value the checkpoint was trained with (a positive integer)"),
    ({"vocab_size": -1, "torch_dtype": "no way"}, "vocab_size: -1 must be positive", None),
    ({"torch_dtype": "no way", "num_key_value_heads": 3}, "torch_dtype: 'no way' is not a dtype name",
     "set torch_dtype in {config} to the checkpoint's dtype, e.g. \"bfloat16\""),
])
def test_a_bad_config_json_field_is_refused_with_this_message_and_fix(tmp_path, changes, message, fix):
    d = _model_dir(tmp_path, {**_MOE_BASE, **changes})
    config = d / "config.json"
    with pytest.raises(ModelError) as info:
        resolve_model(str(d))
    assert str(info.value) == f"{config}: {message}"
    if fix is not None:
        assert info.value.fix == fix.format(config=config)


@pytest.mark.parametrize("cfg,hf_quant,expected", [
    ({"quantization_config": {"quant_method": "fp8"}}, None,
     ("fp8", "config.json quantization_config: quant_method fp8", "")),
    ({"quantization_config": {"quant_method": "awq"}}, None,
     ("int4", "config.json quantization_config: quant_method awq", "")),
    ({"quantization_config": {"quant_method": "gptq"}}, None,
     ("int4", "config.json quantization_config: quant_method gptq", "")),
    ({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}, None,
     ("nvfp4", "config.json quantization_config: modelopt NVFP4", "")),
    # groups without a weights scheme tk reads are passed over; the first one it reads decides
    ({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "a": "W8A8", "b": {"weights": None}, "c": {"weights": {"num_bits": 8, "type": "float"}},
        "d": {"weights": {"num_bits": 4, "type": "int"}}}}}, None,
     ("fp8", "config.json quantization_config: compressed-tensors 8-bit float", "")),
    ({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "g": {"weights": {"num_bits": 4, "type": "float", "group_size": 32}}}}}, None,
     ("mxfp4", "config.json quantization_config: compressed-tensors 4-bit float", "")),
    # no quant_method: hf_quant_config.json beside it decides
    ({"quantization_config": {}}, {"quantization": {"quant_algo": "FP8"}},
     ("fp8", "hf_quant_config.json: quant_algo FP8", "")),
    ({}, "{not json", ("", "", "")),
    ({}, {"quantization": {"quant_algo": "W2A2"}}, ("", "", "")),
    ({}, {"quantization": "FP8"}, ("", "", "")),
])
def test_the_declared_quantization_is_read_from_config_json_then_hf_quant_config(tmp_path, cfg, hf_quant, expected):
    if hf_quant is not None:
        (tmp_path / "hf_quant_config.json").write_text(hf_quant if isinstance(hf_quant, str) else json.dumps(hf_quant))
    assert checkpoint_quantization(cfg, tmp_path) == expected


def test_without_a_directory_only_config_json_is_read_and_named_as_config_json():
    assert checkpoint_quantization({}) == ("", "", "")
    assert checkpoint_quantization({"quantization_config": 3}) == (
        "", "config.json: quantization_config is a int, not a mapping",
        "config.json: quantization_config is a int, not a mapping")

# --- property: hostile config.json files either plan with positive finite numbers or are RecipeErrors -------

_hostile_number = st.one_of(
    st.integers(min_value=-4, max_value=300), st.integers(), st.booleans(), st.none(),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([64.0, 64.5, 0.0, -1.0, 1e308]),
    st.text(max_size=6), st.sampled_from(["abc", "many", "lots", "64", ""]),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
_KEYS = ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim",
         "num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok", "max_position_embeddings",
         "intermediate_size", "moe_intermediate_size", "vocab_size", "kv_lora_rank", "qk_rope_head_dim",
         "n_layer", "n_head", "n_embd", "torch_dtype"]
_config = st.one_of(
    st.fixed_dictionaries({}, optional={k: _hostile_number for k in _KEYS}),
    # mostly sane configs with one or two hostile fields, so the success path is exercised too
    st.builds(lambda base, bad: {**base, **bad},
              st.fixed_dictionaries({"num_hidden_layers": st.integers(1, 96), "num_attention_heads": st.just(8),
                                     "num_key_value_heads": st.sampled_from([1, 2, 4, 8]),
                                     "hidden_size": st.sampled_from([256, 512, 4096])},
                                    optional={"max_position_embeddings": st.integers(1, 1 << 20)}),
              st.dictionaries(st.sampled_from(_KEYS), _hostile_number, max_size=2)),
    st.fixed_dictionaries({"text_config": st.dictionaries(st.sampled_from(_KEYS), _hostile_number, max_size=6)}),
)


def _numbers(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _numbers(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _numbers(v)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield obj


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=_config)
def test_hostile_config_json_plans_with_positive_finite_numbers_or_is_a_recipe_error(cfg):
    with tempfile.TemporaryDirectory() as tmp:
        d = _model_dir(Path(tmp), json.dumps(cfg, allow_nan=True))
        try:
            p = plan_of(STANDIN, f"model={d}")
        except RecipeError as exc:
            assert exc.violations and all(v.message and v.fix for v in exc.violations)
            return
    m = p.model
    for n in (m.num_layers, m.num_attention_heads, m.num_kv_heads, m.head_dim, m.params, m.active_params):
        assert n > 0 and math.isfinite(n)
    assert all(isinstance(n, int) and not isinstance(n, bool)
               for n in (m.num_layers, m.num_attention_heads, m.num_kv_heads, m.head_dim))
    assert m.num_experts >= 0 and m.max_position_embeddings >= 0
    for section in (p.kv, p.context.kv, p.generation.kv, p.estimates):
        nums = list(_numbers(section.__dict__))
        assert nums and all(math.isfinite(n) and n > 0 for n in nums), section
