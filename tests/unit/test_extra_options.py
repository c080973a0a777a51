"""Spec: extra_options and extra_serve_args are checked: unknown or conflicting keys are refused with the fix named.

extra_options: keys the target TensorRT-LLM line accepts; values of the kind tk reads; a key tk writes from a
recipe field may repeat tk's value but not change it. extra_serve_args: flags the line's trtllm-serve takes, never
one tk passes itself (in either spelling, `--flag value` or `--flag=value`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.helpers import BASE, plan_of, violations_of
from toolkit.errors import RecipeError
from toolkit.facts import trtllm

ROOT = Path(__file__).resolve().parents[2]
QWEN = (ROOT / "recipes" / "qwen3-smoke.yaml").read_text()
STANDIN = (ROOT / "recipes" / "standin-2p2d.yaml").read_text()
MOE = BASE.replace("meta-llama/Llama-3.3-70B-Instruct", "Qwen/Qwen3-235B-A22B") + \
    "context:\n  tp: 4\ngeneration:\n  tp: 4\n"  # 235B in fp8 needs 4 H100s per server


def only(text, *overrides):
    [v] = violations_of(text, *overrides)
    return v


# --- bug 16 reproductions ----------------------------------------------------------------------------------

def test_unknown_extra_option_is_a_violation_for_trtllm_and_standin_recipes():
    for text in (QWEN, STANDIN):
        v = only(text, "context.extra_options.not_an_option=1")
        assert v.field == "context.extra_options.not_an_option"
        assert v.file == "--set context.extra_options.not_an_option=1"
        assert "no TensorRT-LLM version tk knows has an option not_an_option" in v.message
        assert "extra=\"forbid\"" in v.message and v.fix == "remove context.extra_options.not_an_option"


def test_did_you_mean_only_for_a_key_no_version_has():
    v = only(BASE, "generation.extra_options.max_num_token=64")
    assert "did you mean max_num_tokens?" in v.message and v.fix == "rename it to max_num_tokens"
    # a key another version has is named with the versions, never renamed into another option
    v = only(BASE, "trtllm_version=1.2", "context.extra_options.cache_transceiver_config.enable_pipelined_transfer=true")
    assert "It exists in TensorRT-LLM 1.3.0rc27..1.4.0rc1" in v.message and "did you mean" not in v.message
    assert "target a TensorRT-LLM version that has it" in v.fix


def test_unknown_key_inside_a_section_is_a_violation():
    v = only(BASE, "context.extra_options.kv_cache_config.tokens_per_blok=32")
    assert v.field == "context.extra_options.kv_cache_config.tokens_per_blok"
    assert "kv_cache_config.tokens_per_block" in v.message


def test_key_the_line_lacks_is_refused_for_that_line_only():
    key = "cache_transceiver_config.kv_transfer_sender_future_timeout_ms=5"
    plan_of(BASE, "trtllm_version=1.3", f"context.extra_options.{key}")
    v = only(BASE, "trtllm_version=1.0", f"context.extra_options.{key}")
    assert "TensorRT-LLM 1.0 has no option cache_transceiver_config.kv_transfer_sender_future_timeout_ms" in v.message


def test_keys_nvidia_ships_on_1_2_are_accepted():
    # the late-2025 keys of NVIDIA's srt-slurm recipes pinned to a 1.2 image (c88ef731)
    p = plan_of(MOE, "context.tp=8", "context.ep=8", "context.attention_dp=true",
                "context.extra_options.enable_lm_head_tp_in_adp=true",
                "context.extra_options.moe_config.use_low_precision_moe_combine=true",
                "context.extra_options.attention_dp_config.enable_balance=true",
                "context.extra_options.moe_config.load_balancer.num_slots=288")
    opts = p.context.llm_api_options
    assert opts["enable_lm_head_tp_in_adp"] and opts["moe_config"]["load_balancer"] == {"num_slots": 288}
    # a key the 1.2 rc snapshot lacks but the line's later releases may have: a warning, rendered
    p = plan_of(BASE, "context.extra_options.nvfp4_gemm_config.allowed_backends=[cutlass]")
    assert p.context.llm_api_options["nvfp4_gemm_config"] == {"allowed_backends": ["cutlass"]}
    assert any("nvfp4_gemm_config" in w and "unverified" in w for w in p.warnings)


def test_a_renamed_key_is_refused_with_the_new_spelling_where_the_release_renamed_it():
    key = "context.extra_options.kv_cache_config.block_reuse_policy=all_reusable"
    v = only(BASE, "trtllm_version=1.3.0rc26", key)
    assert "PR #16883" in v.message and v.fix == ("write kv_cache_config.block_reuse_config.policy instead of "
                                                   "kv_cache_config.block_reuse_policy")
    p = plan_of(BASE, "trtllm_version=1.3.0rc19", key)  # the old spelling was still current then
    assert p.context.llm_api_options["kv_cache_config"]["block_reuse_policy"] == "all_reusable"
    p = plan_of(BASE, "trtllm_version=1.3", key)  # some 1.3 rc: unsure, rendered with a warning naming the rename
    assert any("renamed to kv_cache_config.block_reuse_config.policy" in w for w in p.warnings)


def test_a_value_the_line_lacks_is_refused():
    v = only(BASE, "trtllm_version=1.3.0rc19", "context.extra_options.moe_config.backend=NOPE")  # pinned data
    assert "NOPE is not a value of moe_config.backend" in v.message and "CUTLASS" in v.fix


def test_tensor_parallel_size_contradicting_tp_is_refused_naming_tp():
    v = only(QWEN, "context.extra_options.tensor_parallel_size=8")
    assert v.field == "context.extra_options.tensor_parallel_size"
    assert "tk writes tensor_parallel_size = 1 from context.tp" in v.message
    assert v.fix == "set context.tp instead and remove context.extra_options.tensor_parallel_size"


@pytest.mark.parametrize("override,recipe_field", [
    ("generation.extra_options.pipeline_parallel_size=2", "generation.pp"),
    ("context.extra_options.max_batch_size=3", "context.max_batch_size"),
    ("context.extra_options.backend=tensorrt", "engine"),
    ("context.extra_options.model=/other", "context.model_path"),
    ("context.extra_options.kv_cache_config.free_gpu_memory_fraction=0.5", "context.free_gpu_memory_fraction"),
    ("generation.extra_options.cache_transceiver_config.max_tokens_in_buffer=64",
     "generation.max_tokens_in_buffer"),
    # a dense model: tk writes none, and one that does not divide tp TensorRT-LLM's Mapping refuses
    ("context.extra_options.moe_expert_parallel_size=2", "context.ep"),
    ("context.extra_options.max_seq_len=99", "context.max_seq_len"),
])
def test_owned_options_are_refused_when_they_change_tks_value(override, recipe_field):
    v = only(BASE, override)
    assert v.field == override.split("=")[0] and recipe_field in v.fix


SPEC = "{decoding_type: Eagle3, max_draft_len: 3, speculative_model_dir: /models/eagle3}"


def test_a_section_tk_derives_from_an_unset_field_is_rendered_as_pasted_with_a_warning():
    # before: refused ("tk writes no speculative_config for this recipe"), so a published config pasted whole failed
    p = plan_of(BASE, "trtllm_version=1.3", f"context.extra_options.speculative_config={SPEC}",
                f"generation.extra_options.speculative_config={SPEC}")
    for role in (p.context, p.generation):
        assert role.llm_api_options["speculative_config"] == {
            "decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model_dir": "/models/eagle3"}
    [warning] = [w for w in p.warnings if w.startswith("context.extra_options.speculative_config is written as given")]
    assert "its better home is speculative (" in warning
    # the keys below it are still checked as any key is: a value the line lacks is refused
    refused = violations_of(BASE, "trtllm_version=1.0", f"context.extra_options.speculative_config={SPEC}",
                            f"generation.extra_options.speculative_config={SPEC}")
    assert {v.field for v in refused} == {f"{t}.extra_options.speculative_config.decoding_type"
                                          for t in ("context", "generation")}
    assert all("Eagle3 is not a value of speculative_config.decoding_type" in v.message for v in refused)


def test_a_section_tk_derives_from_a_set_field_is_refused_when_it_differs():
    deepseek = BASE.replace("meta-llama/Llama-3.3-70B-Instruct", "deepseek-ai/DeepSeek-R1") + \
        "cluster: {gpus_per_node: 8, gpu: B200}\ncontext: {tp: 8}\ngeneration: {tp: 8}\n"
    deepseek = deepseek.replace("cluster: {gpus_per_node: 8}\n", "")
    mtp = "{decoding_type: MTP, num_nextn_predict_layers: 3}"
    v = only(deepseek, "speculative.mtp_layers=1", f"context.extra_options.speculative_config={mtp}")
    assert "tk writes speculative_config = " in v.message and v.fix.startswith("set speculative (")
    p = plan_of(deepseek, "speculative.mtp_layers=3", f"context.extra_options.speculative_config={mtp}")
    assert p.context.llm_api_options["speculative_config"]["num_nextn_predict_layers"] == 3  # repeats tk's value


def test_expert_parallelism_of_a_dense_model_is_rendered_where_tensorrt_llm_takes_it():
    p = plan_of(BASE, "context.tp=4", "context.extra_options.moe_expert_parallel_size=2")
    assert p.context.llm_api_options["moe_expert_parallel_size"] == 2
    assert any(w.startswith("context.extra_options.moe_expert_parallel_size is written as given") for w in p.warnings)
    v = only(BASE, "context.tp=4", "context.extra_options.moe_expert_parallel_size=3")
    assert "does not divide context.tp = 4" in v.message and "mapping.py" in v.message


def test_owned_options_may_repeat_tks_value():
    p = plan_of(MOE, "context.tp=4", "context.extra_options.tensor_parallel_size=4",
                "context.extra_options.moe_expert_parallel_size=4", "context.extra_options.backend=pytorch",
                "context.extra_options.kv_cache_config.tokens_per_block=32",
                "context.extra_options.cache_transceiver_config.backend=NIXL")
    assert p.context.llm_api_options["tensor_parallel_size"] == 4 and p.context.ep == 4
    # ... in another kind only where pydantic (lax mode) converts it: int(true) is 1, "one" is not a number
    p = plan_of(BASE, "context.extra_options.tensor_parallel_size=true")
    assert p.context.llm_api_options["tensor_parallel_size"] == 1
    assert any("converts it to 1" in w for w in p.warnings)
    v = only(BASE, "context.extra_options.tensor_parallel_size=one")
    assert "'one' is not a positive integer" in v.message


def test_options_tk_does_not_own_stay_tunable():
    p = plan_of(BASE, "context.extra_options.enable_chunked_prefill=true",
                "generation.extra_options.cuda_graph_config.batch_sizes=[1, 2]",
                "generation.extra_options.kv_cache_config.enable_block_reuse=true")
    assert p.context.llm_api_options["enable_chunked_prefill"] is True
    assert p.generation.llm_api_options["cuda_graph_config"] == {"enable_padding": True, "batch_sizes": [1, 2]}


def test_port_in_extra_serve_args_is_refused():
    for args in ('["--port", "1"]', '["--port=1"]'):
        v = only(STANDIN, f"context.extra_serve_args={args}")
        assert v.field == "context.extra_serve_args" and v.file.startswith("--set ")
        assert "tk passes --port itself (from cluster.worker_base_port)" in v.message
        assert "cluster.worker_base_port" in v.fix


@pytest.mark.parametrize("flag,field", [
    ("--host", "nothing"), ("--backend", "engine"), ("--tp_size", "generation.tp"),
    ("--tensor_parallel_size", "generation.tp"), ("--pp_size", "generation.pp"), ("--ep_size", "generation.ep"),
    (trtllm.OPTIONS_FILE_FLAG, "generation.extra_options"), ("--config", "generation.extra_options"),
    ("--max_num_tokens", "generation.max_num_tokens"),
])
def test_flags_tk_sets_are_refused_even_with_tks_value(flag, field):
    v = only(BASE, f'generation.extra_serve_args=["{flag}", "1"]')
    assert flag in v.message and field in v.message


@pytest.mark.parametrize("args,expect", [
    ('["--max_batch_sizes", "3"]', "did you mean --max_batch_size?"),
    ('["--nope"]', "has no flag '--nope'"),
    ('["stray"]', "is not a flag"),
    ('["--log_level"]', "needs a value"),
    ('["--trust_remote_code=1"]', "takes no value"),
    ('["--gpus_per_node", "x"]', "'x' is not an integer"),
    ('["--gpus_per_node=\u0663"]', "is not an integer"),  # an Arabic-Indic digit
])
def test_bad_extra_serve_args_are_violations(args, expect):
    v = only(BASE, f"context.extra_serve_args={args}")
    assert expect in v.message and v.fix


def test_flags_the_line_takes_pass_through():
    p = plan_of(BASE, 'context.extra_serve_args=["--log_level", "info", "--trust_remote_code", "--gpus_per_node=8"]')
    assert p.context.serve_args[-4:] == ("--log_level", "info", "--trust_remote_code", "--gpus_per_node=8")


def test_config_flag_is_unknown_to_1_0():
    v = only(BASE, "trtllm_version=1.0", 'context.extra_serve_args=["--config", "x"]')
    assert "has no flag '--config'" in v.message


# --- bug 14: extra_options values tk reads are type-checked, never a TypeError -------------------------------

@pytest.mark.parametrize("value,shown", [("abc", "'abc'"), ('"%d"', "'%d'"), ("0", "0"),
                                         ("-32", "-32"), ("4096.5", "4096.5"), ("[1]", "[1]")])
def test_max_num_tokens_of_the_wrong_kind_is_a_violation(value, shown):
    v = only(STANDIN, f"context.extra_options.max_num_tokens={value}")
    assert v.message.startswith(f"{shown} is not a positive integer")
    assert v.fix == "set context.max_num_tokens instead and remove context.extra_options.max_num_tokens"


@pytest.mark.parametrize("override,expect", [
    ("context.extra_options.enable_chunked_prefill=maybe", "is not a boolean"),
    ("context.extra_options.kv_cache_config=3", "is not a mapping"),
    ("context.extra_options.kv_cache_config=null", "is not a mapping"),
    ("context.extra_options.cache_transceiver_config=[]", "is not a mapping"),
    ("generation.extra_options.cuda_graph_config.batch_sizes=[0]", "list of positive integers"),
    ("context.extra_options.kv_cache_config.free_gpu_memory_fraction=.nan", "fraction"),
    ("context.extra_options.kv_cache_config.dtype=int4", "would change it to 'int4'"),  # tk's kv_transfer.dtype
    ("context.extra_options={1: x}", "option name 1 must be an identifier"),
    ("context.extra_options.max_num_tokens=99999999999999999999", "does not fit in 64 bits"),
])
def test_values_of_the_wrong_kind_are_violations(override, expect):
    assert expect in only(BASE, override).message



@pytest.mark.parametrize("override,message", [
    ("context.extra_options=3", "must be a mapping of option: value"),
    ('context.extra_options={"max num": 1}', "option name 'max num' must be an identifier such as max_num_tokens"),
    ("context.extra_options.kv_cache_config={1: x}",
     "key 1 in kv_cache_config must be a name (text of 1-128 characters)"),
    ('context.extra_options.kv_cache_config={"": x}',
     "key '' in kv_cache_config must be a name (text of 1-128 characters)"),
    (f"context.extra_options.kv_cache_config={{{'k' * 129}: x}}",
     f"key '{'k' * 79}... in kv_cache_config must be a name (text of 1-128 characters)"),  # the repr cut at 80
    ('context.extra_options.kv_cache_config={"a\\x85": 1}',
     "key 'a\\x85' in kv_cache_config contains the control character '\\x85'; write it on one line, without "
     "control characters"),
    ("context.extra_options.speculative_config.x=[1, 2, 99999999999999999999]",
     "speculative_config.x[2] = 99999999999999999999 does not fit in 64 bits"),
    ("context.extra_options.kv_cache_config.free_gpu_memory_fraction=.inf",
     "kv_cache_config.free_gpu_memory_fraction is inf; give a finite number"),
    (f"context.extra_options.kv_cache_config.dtype={'x' * 4097}",
     "kv_cache_config.dtype is 4097 characters long; at most 4096"),
    ('context.extra_options.kv_cache_config.dtype="a\\x85"',
     "kv_cache_config.dtype contains the control character '\\x85'; write it on one line, without control "
     "characters"),
    ("context.extra_options.kv_cache_config.dtype=2024-01-01",
     "kv_cache_config.dtype is a date; use a string, number, boolean, list or mapping"),
])
def test_extra_options_that_are_not_plain_yaml_values_are_refused_naming_where(override, message):
    v = only(BASE, override)
    assert v.field == "context.extra_options" and v.message.startswith(message + " (got ")

# --- property: hostile extra_options / extra_serve_args plan or are RecipeErrors, nothing else ---------------

_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
              st.sampled_from(["NIXL", "pytorch", "auto", "fp8", "MTP"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(
        st.one_of(st.sampled_from(sorted(trtllm.get("1.2").kv_cache_config_keys | {"backend", "decoding_type"})),
                  st.text(max_size=5)), inner, max_size=3)),
    max_leaves=6)
_key = st.one_of(st.sampled_from(sorted(trtllm.get("1.2").llm_api_keys)), st.text(max_size=12), st.integers())
_flag = st.one_of(st.sampled_from(sorted(trtllm.serve_flag_table(trtllm.get("1.2")))), st.text(max_size=10))
_arg = st.one_of(_flag, st.builds(lambda f, v: f"{f}={v}", _flag, st.text(max_size=4)), st.text(max_size=4))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(opts=st.dictionaries(_key, _value, max_size=4), args=st.lists(_arg, max_size=4),
       role=st.sampled_from(["context", "generation"]), text=st.sampled_from([BASE, MOE, STANDIN]))
def test_hostile_extra_options_and_serve_args_plan_or_are_recipe_errors(opts, args, role, text):
    import json

    overrides = [f"{role}.extra_options={json.dumps(opts)}" if all(isinstance(k, str) for k in opts) else
                 f"{role}.extra_options={{{', '.join(f'{k}: {json.dumps(v)}' for k, v in opts.items())}}}",
                 f"{role}.extra_serve_args={json.dumps(args)}"]
    try:
        p = plan_of(text, *overrides)
    except RecipeError as exc:
        assert exc.violations and all(v.message for v in exc.violations)
        return
    spec = getattr(p, role)
    opts_out = spec.llm_api_options
    assert opts_out["tensor_parallel_size"] == spec.tp and opts_out["pipeline_parallel_size"] == spec.pp
    assert isinstance(opts_out["max_num_tokens"], int) and opts_out["max_num_tokens"] > 0
    assert all(k in trtllm.get(p.trtllm_version).llm_api_keys for k in opts_out)
    assert not {"--port", "--host", "--tp_size"} & {a.split("=")[0] for a in spec.serve_args[6:]}


# --- values the 1.3 transceiver rules compare: checked first, and a reported value is never compared ---------------

B13 = 'trtllm_version: "1.3"\n' + QWEN
PIPELINED = "enable_chunked_prefill: true, cache_transceiver_config: {enable_pipelined_transfer: true"


@pytest.mark.parametrize("extra,field,expect", [
    (PIPELINED + ', kv_cache_bounce_size_mb: "x"}', "cache_transceiver_config.kv_cache_bounce_size_mb",
     "'x' is not a non-negative integer"),
    (PIPELINED + '}, context_parallel_size: "two"', "context_parallel_size", "'two' is not a positive integer"),
    (PIPELINED + ", kv_cache_bounce_size_mb: [1]}", "cache_transceiver_config.kv_cache_bounce_size_mb",
     "[1] is not a non-negative integer"),
    (PIPELINED + ", kv_transfer_poll_interval_ms: {a: 1}}", "cache_transceiver_config.kv_transfer_poll_interval_ms",
     "is not a positive integer"),
    ("enable_chunked_prefill: true, cache_transceiver_config: {enable_pipelined_transfer: maybe}",
     "cache_transceiver_config.enable_pipelined_transfer", "'maybe' is not a boolean"),
])
def test_transceiver_values_of_the_wrong_kind_are_violations_not_type_errors(extra, field, expect):
    v = only(B13, f"context.extra_options={{{extra}}}")
    assert v.field == f"context.extra_options.{field}" and expect in v.message


def test_a_section_reported_as_the_wrong_kind_is_not_read_by_the_transceiver_rules():
    vs = violations_of(B13, "kv_transfer.runtime=PYTHON", "context.extra_options.cache_transceiver_config=5")
    assert [v.field for v in vs] == ["context.extra_options.cache_transceiver_config"]


def test_pipelined_transfer_with_context_parallelism_is_still_refused_when_the_value_is_right():
    vs = violations_of(B13, f"context.extra_options={{{PIPELINED}}}, context_parallel_size: 2}}")
    assert any("context parallelism" in v.message for v in vs)


_hostile = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["x", "2", "", "CPP", "PYTHON"]),
                     st.lists(st.integers(0, 2), max_size=2), st.dictionaries(st.sampled_from(["a"]), st.integers(),
                                                                              max_size=1))
_ct_key = st.sampled_from(["enable_pipelined_transfer", "kv_cache_bounce_size_mb", "kv_transfer_poll_interval_ms",
                           "transceiver_runtime", "backend"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ct=st.dictionaries(_ct_key, _hostile, max_size=4), top=st.dictionaries(st.sampled_from(
    ["enable_chunked_prefill", "context_parallel_size", "kv_cache_config", "cache_transceiver_config"]), _hostile,
    max_size=2), role=st.sampled_from(["context", "generation"]), pipelined=st.sampled_from([None, "true", "false"]))
def test_hostile_1_3_transceiver_options_plan_or_are_recipe_errors(ct, top, role, pipelined):
    import json

    extra = {**top, "cache_transceiver_config": ct} if "cache_transceiver_config" not in top else top
    overrides = [f"{role}.extra_options={json.dumps(extra)}"]
    if pipelined:
        overrides.append(f"kv_transfer.pipelined={pipelined}")
    try:
        plan_of(B13, *overrides)
    except RecipeError as exc:
        assert exc.violations and all(v.message and v.fix for v in exc.violations)


# --- the 1.0/1.1 hand tables list only what tk needed: a top-level key missing there is unverified, not refused ------

@pytest.mark.parametrize("version,key", [
    ("1.1.0rc0", "use_torch_sampler=true"),  # NVIDIA's 1.1.0rc0 blog config sets it
    ("1.1.0", "sampler_type=TorchSampler"),
    ("1.0", "use_torch_sampler=true"),
    ("1.0.0", "sampler_type=TorchSampler"),
])
def test_a_top_level_key_the_1_0_1_1_hand_tables_lack_is_a_warning_and_rendered(version, key):
    name, value = key.split("=")
    p = plan_of(BASE, f"trtllm_version={version}", f"context.extra_options.{key}")
    assert name in p.context.llm_api_options
    assert any(w.startswith(f"context.extra_options.{name}:") and "unverified" in w for w in p.warnings)


def test_the_1_0_kv_cache_config_list_is_still_whole():
    # its 14 fields were read whole, so a key there that came with 1.1 is refused for a 1.0 release
    v = only(BASE, "trtllm_version=1.0.0", "context.extra_options.kv_cache_config.max_gpu_total_bytes=1")
    assert "has no option kv_cache_config.max_gpu_total_bytes" in v.message


# --- what TensorRT-LLM's pydantic converts (lax mode: TorchLlmArgs is extra="forbid", not strict) is accepted -------

@pytest.mark.parametrize("override,key,value", [
    ("context.extra_options.enable_chunked_prefill=1", ("enable_chunked_prefill",), True),
    ("context.extra_options.enable_chunked_prefill=0", ("enable_chunked_prefill",), False),
    ('context.extra_options.enable_chunked_prefill="yes"', ("enable_chunked_prefill",), True),
    ('context.extra_options.enable_chunked_prefill="Off"', ("enable_chunked_prefill",), False),
    ('context.extra_options.kv_cache_config.enable_block_reuse="true"', ("kv_cache_config", "enable_block_reuse"),
     True),
    ('generation.extra_options.cuda_graph_config.max_batch_size="16"', ("cuda_graph_config", "max_batch_size"), 16),
    ('generation.extra_options.cuda_graph_config.batch_sizes=[1, "2", 4.0]', ("cuda_graph_config", "batch_sizes"),
     [1, 2, 4]),
    ('context.extra_options.kv_cache_config.event_buffer_max_size="64"', ("kv_cache_config", "event_buffer_max_size"),
     64),
])
def test_a_value_pydantic_converts_is_accepted_written_converted_and_warned(override, key, value):
    p = plan_of(QWEN, override)
    opts = getattr(p, override.split(".")[0]).llm_api_options
    for k in key:
        opts = opts[k]
    assert opts == value and type(opts) is type(value)
    assert any(w.startswith(f"{override.split('=')[0]}:") and "converts it to" in w for w in p.warnings)


@pytest.mark.parametrize("override,expect", [
    ("context.extra_options.enable_chunked_prefill=2", "2 is not a boolean"),
    ('context.extra_options.enable_chunked_prefill=""', "'' is not a boolean"),
    ("context.extra_options.enable_chunked_prefill=0.5", "0.5 is not a boolean"),
    ('context.extra_options.kv_cache_config.enable_block_reuse="maybe"', "'maybe' is not a boolean"),
    ('generation.extra_options.cuda_graph_config.max_batch_size="1e3"', "'1e3' is not a non-negative integer"),
    ("generation.extra_options.cuda_graph_config.max_batch_size=2.5", "2.5 is not a non-negative integer"),
])
def test_a_value_pydantic_refuses_is_still_refused(override, expect):
    assert expect in only(QWEN, override).message


def test_a_converted_value_of_a_key_tk_owns_may_repeat_tks_value():
    p = plan_of(QWEN, 'context.extra_options.max_batch_size="8"')  # tk writes 8 for the context servers
    assert p.context.llm_api_options["max_batch_size"] == 8


def test_a_converted_context_parallel_size_is_read_by_the_transceiver_rules():
    vs = violations_of(B13, f"context.extra_options={{{PIPELINED}}}, context_parallel_size: \"2\"}}")
    assert any("context parallelism" in v.message for v in vs)


def test_the_aggregated_baseline_writes_the_converted_value_too():
    from toolkit.plan import build_plan
    from toolkit.recipe import load_recipe_text

    p = build_plan(load_recipe_text(QWEN, "r.yaml", ["generation.extra_options.enable_chunked_prefill=1"]),
                   aggregated=True)
    assert p.aggregated.llm_api_options["enable_chunked_prefill"] is True


def test_a_null_option_pydantic_takes_is_refused_only_as_a_change_of_tks_value():
    v = only(STANDIN, "context.extra_options.max_num_tokens=null")  # Optional[int] in TensorRT-LLM: null is taken
    assert "would change it to null" in v.message and "context.max_num_tokens" in v.fix
