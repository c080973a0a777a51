"""Spec: the rules checked before anything is written."""

import json
import math

import pytest

from tests.unit.helpers import BASE, fields, plan_of, violations_of

DEEPSEEK = BASE.replace("meta-llama/Llama-3.3-70B-Instruct", "deepseek-ai/DeepSeek-R1").replace(
    "cluster: {gpus_per_node: 8}", "cluster: {gpus_per_node: 8, gpu: H200}")  # 671B in fp8: 8 H200s per server


# --- max_tokens_in_buffer ------------------------------------------------------------------------

def test_buffer_is_derived_from_the_longest_admitted_input_aligned_to_blocks():
    p = plan_of(BASE, "traffic.max_input_len=1000", "traffic.prefix_len=24", "kv_transfer.tokens_per_block=64")
    assert p.buffer.max_tokens_in_buffer == 1024
    assert "1000 input + 24 prefix" in p.buffer.reason and not p.buffer.user_given
    for role in p.roles:
        assert role.llm_api_options["cache_transceiver_config"]["max_tokens_in_buffer"] == 1024


def test_user_buffer_not_a_multiple_of_tokens_per_block_is_an_error_not_a_fix():
    # TensorRT-LLM's TLLM_CHECK(maxNumTokens.value() % tokensPerBlock == 0) in cacheTransBuffer.cpp
    [v] = violations_of(BASE, "traffic.max_input_len=1000", "kv_transfer.max_tokens_in_buffer=1050")
    assert v.field == "kv_transfer.max_tokens_in_buffer"
    assert "not a multiple of tokens_per_block=32" in v.message and "cacheTransBuffer.cpp" in v.message
    assert "1056" in v.fix
    [v] = violations_of(BASE, "generation.max_tokens_in_buffer=100")
    assert v.field == "generation.max_tokens_in_buffer" and "128" in v.fix


def test_user_buffer_smaller_than_longest_input_is_refused_with_nixl_on_the_cpp_transceiver():
    # CacheFormatter::format: TLLM_CHECK_WITH_INFO(bufferCoverTargetNum == bufferTargetNum, "Agent need all buffer
    # pre-allocated"): over NIXL's agent connection the request fails, there is no dynamic-buffer fallback.
    [v] = violations_of(BASE, "traffic.max_input_len=4096", "kv_transfer.max_tokens_in_buffer=2048")
    assert v.field == "kv_transfer.max_tokens_in_buffer"
    assert "context and generation servers run TensorRT-LLM's C++ transceiver over NIXL" in v.message
    assert '"Agent need all buffer pre-allocated"' in v.message and "cacheFormatter.cpp @ 00c77b30" in v.message
    assert "at least 4096" in v.fix
    [v] = violations_of(BASE, "traffic.max_input_len=4096", "generation.max_tokens_in_buffer=2048")
    assert v.field == "generation.max_tokens_in_buffer" and "the generation servers run" in v.message


def test_the_buffer_refusal_cites_the_check_that_fails_on_each_role():
    # the context's send buffer fails in CacheFormatter::format ("Agent need all buffer pre-allocated"), the
    # generation's receive buffer in CacheFormatter::unformat ("Agent need buffer pre-allocated")
    [v] = violations_of(BASE, "traffic.max_input_len=4096", "generation.max_tokens_in_buffer=2048")
    assert '"Agent need buffer pre-allocated"' in v.message and "unformat" in v.message
    assert "Agent need all buffer" not in v.message
    [v] = violations_of(BASE, "traffic.max_input_len=4096", "context.max_tokens_in_buffer=2048")
    assert '"Agent need all buffer pre-allocated"' in v.message and "format" in v.message
    [v] = violations_of(BASE, "traffic.max_input_len=4096", "kv_transfer.max_tokens_in_buffer=2048")
    assert '"Agent need all buffer pre-allocated"' in v.message and '"Agent need buffer pre-allocated"' in v.message


def test_user_buffer_smaller_than_longest_input_is_a_warning_where_tensorrt_llm_falls_back():
    # Over UCX the C++ transceiver allocates buffers for the request (baseTransBuffer.cpp's warning); the Python
    # transceiver registers the KV pools themselves.
    p = plan_of(BASE, "traffic.max_input_len=4096", "kv_transfer.max_tokens_in_buffer=2048", "kv_transfer.backend=UCX")
    assert p.buffer.max_tokens_in_buffer == 2048
    assert any("smaller than the longest input" in w and "buffers allocated for each request" in w
               for w in p.warnings)
    p = plan_of(BASE, "trtllm_version=1.3.0rc27", "kv_transfer.runtime=PYTHON", "traffic.max_input_len=4096",
                "kv_transfer.max_tokens_in_buffer=2048")
    assert p.kv_transfer.transceiver.runtime.value == "PYTHON"
    assert not any("smaller than the longest input" in w for w in p.warnings)


def test_each_role_may_size_its_own_buffer():
    # NVIDIA's published configs give the roles different values (18 srt-slurm recipes at c88ef731); equal tokens
    # are not equal bytes when the roles' TP differs, and TensorRT-LLM sizes each side from its own value.
    p = plan_of(BASE, "context.max_tokens_in_buffer=8192", "generation.max_tokens_in_buffer=4096")
    assert p.context.llm_api_options["cache_transceiver_config"]["max_tokens_in_buffer"] == 8192
    assert p.generation.llm_api_options["cache_transceiver_config"]["max_tokens_in_buffer"] == 4096


def test_a_buffer_given_for_the_generation_role_only_says_the_context_one_is_derived():
    p = plan_of(BASE, "traffic.max_input_len=2048", "generation.max_tokens_in_buffer=4096")
    assert (p.buffer.max_tokens_in_buffer, p.buffer.for_role("generation")) == (2048, 4096)
    assert p.buffer.reason.startswith("context servers: the larger of the longest admitted input")
    assert p.buffer.reason.endswith("generation servers: given in the recipe (generation.max_tokens_in_buffer)")
    both = plan_of(BASE, "context.max_tokens_in_buffer=8192", "generation.max_tokens_in_buffer=4096")
    assert both.buffer.reason == "given in the recipe"


def test_the_derived_buffer_holds_a_whole_prefill_iteration():
    p = plan_of(BASE, "traffic.max_input_len=1000", "context.max_num_tokens=8192")
    assert p.buffer.max_tokens_in_buffer == 8192 and "max_num_tokens" in p.buffer.reason
    p = plan_of(BASE, "traffic.max_input_len=1000")
    assert p.buffer.max_tokens_in_buffer == 1024


def test_buffer_must_be_identical_on_both_roles():
    # A per-role override of a value both roles must share is refused, naming the one field that sets it.
    text = BASE + "generation:\n  extra_options:\n    kv_cache_config:\n      tokens_per_block: 64\n"
    [v] = violations_of(text)
    assert v.field == "generation.extra_options.kv_cache_config.tokens_per_block"
    assert "kv_transfer.tokens_per_block" in v.fix


def test_max_num_tokens_need_not_be_a_multiple_of_tokens_per_block():
    # TensorRT-LLM has no such rule; NVIDIA runs generation servers with max_num_tokens 1, 4, 16...
    for n in (1, 4, 500):
        assert plan_of(BASE, f"generation.max_num_tokens={n}").generation.llm_api_options["max_num_tokens"] == n


def test_each_role_may_set_its_max_seq_len():
    p = plan_of(BASE, "traffic.max_input_len=1024", "traffic.max_output_len=1024", "context.max_seq_len=1064",
                "generation.max_seq_len=2088")
    assert (p.context.llm_api_options["max_seq_len"], p.generation.llm_api_options["max_seq_len"]) == (1064, 2088)
    p = plan_of(BASE, "traffic.max_input_len=1024", "traffic.max_output_len=1024", "generation.max_seq_len=1500")
    assert any("generation servers' max_seq_len is 1500" in w for w in p.warnings)


def test_context_max_num_tokens_below_the_longest_input_is_a_warning():
    # TensorRT-LLM starts with it and refuses the longer prompts at run time
    p = plan_of(BASE, "traffic.max_input_len=8192", "context.max_num_tokens=4096")
    assert any("context.max_num_tokens = 4096 cannot hold" in w and "8192" in w for w in p.warnings)


# --- agreement between roles ---------------------------------------------------------------------

def test_roles_must_agree_on_kv_dtype():
    text = BASE + "context:\n  extra_options:\n    kv_cache_config:\n      dtype: fp8\n"
    [v] = violations_of(text)
    assert v.field == "context.extra_options.kv_cache_config.dtype" and "kv_transfer.dtype" in v.fix


def test_roles_must_agree_on_model_and_quantization():
    text = BASE + "generation:\n  model_path: /other\n  quantization: nvfp4\n"
    assert {"generation.model_path", "generation.quantization"} <= fields(violations_of(text))


def test_roles_must_agree_on_speculative_config():
    text = DEEPSEEK + ("context:\n  tp: 8\n  ep: 8\n  attention_dp: true\ngeneration:\n  tp: 8\n  ep: 8\n"
                       "  extra_options:\n    speculative_config: {decoding_type: MTP, num_nextn_predict_layers: 2}\n"
                       "speculative:\n  mtp_layers: 1\n")
    [v] = violations_of(text)
    assert v.field == "generation.extra_options.speculative_config" and "speculative" in v.fix


# --- GPU accounting and ports --------------------------------------------------------------------

@pytest.mark.parametrize("gpn,tp,pp,instances", [
    (8, 1, 1, 3), (8, 2, 1, 5), (8, 4, 1, 2), (8, 8, 1, 3), (8, 8, 2, 2), (4, 4, 1, 3), (4, 16, 1, 1), (8, 2, 2, 4),
])
def test_nodes_per_role_is_ceil_of_gpus_over_gpus_per_node(gpn, tp, pp, instances):
    p = plan_of(BASE, f"cluster.gpus_per_node={gpn}", f"generation.tp={tp}", f"generation.pp={pp}",
                f"generation.instances={instances}")
    assert p.generation.node_count == math.ceil(tp * pp * instances / gpn)
    assert p.generation.gpu_count == tp * pp * instances
    # every instance gets tp*pp distinct GPUs
    for s in p.generation.instances:
        assert len(s.gpus) * len(s.nodes) == tp * pp


def test_roles_do_not_share_nodes_unless_asked():
    p = plan_of(BASE, "context.instances=1", "generation.instances=1")
    assert p.node_count == 2
    shared = plan_of(BASE, "context.instances=1", "generation.instances=1", "cluster.share_nodes=true")
    assert shared.node_count == 1
    assert set(shared.context.instances[0].gpus).isdisjoint(shared.generation.instances[0].gpus)


def test_instance_that_does_not_pack_evenly_is_refused():
    assert "context.tp" in fields(violations_of(BASE, "context.tp=3"))
    assert "generation.tp" in fields(violations_of(BASE, "generation.tp=12"))


def test_every_server_gets_a_distinct_port_and_the_proxy_none_of_them():
    p = plan_of(BASE, "context.instances=4", "generation.instances=3", "cluster.share_nodes=true")
    ports = [s.port for s in p.servers]
    assert len(set(ports)) == len(ports) == 7
    assert p.proxy.port not in ports


def test_proxy_port_colliding_with_a_worker_port_is_an_error():
    [v] = violations_of(BASE, "proxy.port=8337")
    assert v.field == "proxy.port" and "collides" in v.message


def test_nvlink_single_node_transport_needs_one_node():
    assert "kv_transfer.transport" in fields(violations_of(BASE, "kv_transfer.transport=nvlink-single-node"))


# --- backend and environment ---------------------------------------------------------------------

def test_efa_means_nixl_over_libfabric():
    p = plan_of(BASE, "kv_transfer.transport=efa")
    assert p.context.env["TRTLLM_NIXL_KVCACHE_BACKEND"] == "LIBFABRIC"
    assert p.context.env["FI_PROVIDER"] == "efa"
    assert "kv_transfer.backend" in fields(violations_of(BASE, "kv_transfer.transport=efa", "kv_transfer.backend=UCX"))


def test_libfabric_only_where_the_target_version_supports_it():
    vs = violations_of(BASE, "kv_transfer.transport=efa", "trtllm_version=1.0")
    assert any(v.field == "kv_transfer.transport" and "LIBFABRIC" in v.message for v in vs)


def test_never_both_nixl_backend_variables():
    vs = violations_of(BASE, "kv_transfer.transport=efa", "context.env.NIXL_BACKEND=LIBFABRIC")
    assert any("NIXL_BACKEND" in v.field and "deserialize" in v.message for v in vs)


def test_backend_selector_env_must_not_contradict_the_backend():
    vs = violations_of(BASE, "kv_transfer.env.TRTLLM_USE_UCX_KVCACHE=1")
    assert any("contradicts" in v.message for v in vs)


def test_ucx_tls_comes_from_the_profile_and_a_role_may_override_it_with_a_warning():
    p = plan_of(BASE)
    assert p.context.env["UCX_TLS"] and p.generation.env["UCX_TLS"] and p.proxy.env["UCX_TLS"]
    published = "rc,dc,ud,cuda_copy,cuda_ipc,gdr_copy,tcp"  # NVIDIA's H200 recipes (srt-slurm @ c88ef731)
    p = plan_of(BASE, f"context.env.UCX_TLS={published}")
    assert p.context.env["UCX_TLS"] == published and p.generation.env["UCX_TLS"] != published
    assert any("context.env.UCX_TLS" in w and "overrides transport infiniband" in w for w in p.warnings)
    assert plan_of(BASE, "kv_transfer.env.UCX_TLS=tcp").generation.env["UCX_TLS"] == "tcp"


def test_any_posix_env_name_is_accepted():
    p = plan_of(BASE, "context.env.OMPI_MCA_coll_ucc_enable=0")  # Open MPI's MCA names are lower case
    assert p.context.env["OMPI_MCA_coll_ucc_enable"] == "0"
    [v] = violations_of(BASE, "context.env.9LIVES=1")
    assert "POSIX name" in v.message


def test_unknown_trtllm_env_var_is_a_warning_and_known_python_side_ones_pass():
    p = plan_of(BASE, "context.env.TRTLLM_USE_NIXL_KVCACHEE=1")
    assert p.context.env["TRTLLM_USE_NIXL_KVCACHEE"] == "1"
    assert any("does not read TRTLLM_USE_NIXL_KVCACHEE" in w for w in p.warnings)
    # read by TensorRT-LLM's Python side (the MoE communication factory; tensorrt_llm/envs.py on 1.3)
    p = plan_of(BASE, "context.env.TRTLLM_FORCE_COMM_METHOD=NVLINK_ONE_SIDED", "trtllm_version=1.3.0rc26")
    assert not any("TRTLLM_FORCE_COMM_METHOD" in w for w in p.warnings)


def test_backend_must_exist_in_the_target_version():
    assert "kv_transfer.backend" in fields(violations_of(BASE, "kv_transfer.backend=MOONCAKE", "trtllm_version=1.0"))


def test_timeout_field_only_where_the_version_has_it():
    p = plan_of(BASE, "trtllm_version=1.0")
    assert "kv_transfer_timeout_ms" not in p.context.llm_api_options["cache_transceiver_config"]
    vs = violations_of(BASE, "trtllm_version=1.0", "kv_transfer.kv_transfer_timeout_ms=5000")
    assert "kv_transfer.kv_transfer_timeout_ms" in fields(vs)
    # 1.1: unverified (landed on main after release/1.1 branched): not written unless asked, then with a warning
    assert "kv_transfer_timeout_ms" not in plan_of(BASE, "trtllm_version=1.1").context.llm_api_options[
        "cache_transceiver_config"]
    p = plan_of(BASE, "trtllm_version=1.1", "kv_transfer.kv_transfer_timeout_ms=5000")
    assert p.context.llm_api_options["cache_transceiver_config"]["kv_transfer_timeout_ms"] == 5000
    assert any("kv_transfer_timeout_ms is written as you set it" in w for w in p.warnings)


# --- MoE, attention DP, MTP, routers -------------------------------------------------------------

def test_expert_parallel_on_a_dense_model_is_refused():
    assert "context.ep" in fields(violations_of(BASE, "context.tp=4", "context.ep=4"))


def test_expert_parallel_must_divide_the_role_gpus():
    vs = violations_of(DEEPSEEK, "context.tp=8", "context.ep=3")
    assert any(v.field == "context.ep" and "divide" in v.message for v in vs)


def test_moe_defaults_expert_parallel_to_tp():
    p = plan_of(DEEPSEEK, "context.tp=8", "generation.tp=8")
    assert p.context.llm_api_options["moe_expert_parallel_size"] == 8


def test_attention_dp_where_it_does_not_apply_is_a_warning():
    # TensorRT-LLM accepts it: its own disaggregated tests run attention DP at tp 1
    # (disagg_config_ctxtp1_gentp1_deepseek_v3_lite_one_mtp.yaml @ b35ac1b6)
    assert any("is dense" in w for w in plan_of(BASE, "context.attention_dp=true", "context.tp=4").warnings)
    # (a MoE whose fp8 weights fit one GPU: DeepSeek-R1 on one GPU is refused by the memory plan)
    mixtral = BASE.replace("meta-llama/Llama-3.3-70B-Instruct", "mistralai/Mixtral-8x7B-Instruct-v0.1")
    assert any("changes nothing" in w for w in plan_of(mixtral, "generation.attention_dp=true").warnings)
    p = plan_of(DEEPSEEK, "context.tp=8", "generation.tp=8", "generation.attention_dp=true")
    assert p.generation.llm_api_options["enable_attention_dp"] is True


def test_mtp_is_applied_to_both_roles_and_only_for_mtp_models():
    p = plan_of(DEEPSEEK, "speculative.mtp_layers=3", "context.tp=8", "generation.tp=8")
    for role in p.roles:
        assert role.llm_api_options["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 3}
    assert "speculative.mtp_layers" in fields(violations_of(BASE, "speculative.mtp_layers=1"))


def test_conditional_disaggregation_needs_a_kv_cache_aware_generation_router():
    vs = violations_of(BASE, "proxy.conditional_max_local_prefill_length=256")
    assert "proxy.conditional_max_local_prefill_length" in fields(vs)
    p = plan_of(BASE, "proxy.conditional_max_local_prefill_length=256", "proxy.generation_router=kv_cache_aware")
    assert p.proxy.config["conditional_disagg_config"] == {"max_local_prefill_length": 256}
    kv = p.generation.llm_api_options["kv_cache_config"]
    assert kv["enable_block_reuse"] is True and kv["event_buffer_max_size"] > 0


def test_context_role_shape():
    p = plan_of(BASE)
    ctx, gen = p.context.llm_api_options, p.generation.llm_api_options
    assert ctx["disable_overlap_scheduler"] is True and ctx["cuda_graph_config"] is None
    assert gen["cuda_graph_config"]["enable_padding"] is True
    assert max(gen["cuda_graph_config"]["batch_sizes"]) == gen["max_batch_size"]
    assert ctx["cache_transceiver_config"]["backend"] == gen["cache_transceiver_config"]["backend"] == "NIXL"


def test_input_longer_than_the_model_context_is_refused():
    assert "traffic.max_input_len" in fields(violations_of(BASE, "traffic.max_input_len=200000"))


def test_generation_servers_can_prefill_what_conditional_disaggregation_keeps_local():
    local = ("proxy.conditional_max_local_prefill_length=1000", "proxy.generation_router=kv_cache_aware")
    p = plan_of(BASE, *local, "generation.max_batch_size=8")
    assert p.generation.llm_api_options["max_num_tokens"] == 1024  # 1000 rounded up to tokens_per_block=32
    # TensorRT-LLM starts and refuses such prompts when they come: a warning with the fix, not a refusal
    p = plan_of(BASE, *local, "generation.max_num_tokens=512")
    [w] = [w for w in p.warnings if w.startswith("generation.max_num_tokens")]
    assert "1000 tokens" in w and "1024" in w


# --- internal ports, GPU request and extra Slurm arguments (issue 15: W2, W3) --------------------------------

def test_each_instance_gets_its_own_internal_port_on_lines_that_read_one():
    p = plan_of(BASE, "context.instances=2", "generation.instances=2", "context.tp=2", "generation.tp=2",
                "cluster.share_nodes=true")
    ports = [dict(s.internal_ports)["TLLM_SPAWN_PROXY_PROCESS_IPC_PORT"] for s in p.servers]
    assert ports == [9336, 9337, 9338, 9339]  # worker_base_port + 1000 onwards
    assert all(s.start_after is None for s in p.servers)
    assert set(ports) <= set(p.ports_by_node[0])  # the per-node port check covers them


def test_lines_without_the_knob_stagger_co_located_instances_instead():
    p = plan_of(BASE, "trtllm_version=1.1", "context.instances=2", "generation.instances=2", "context.tp=2",
                "generation.tp=2", "cluster.share_nodes=true")
    assert all(s.internal_ports == () for s in p.servers)
    assert [s.start_after for s in p.servers] == [None, "ctx-0", "ctx-1", "gen-0"]


def test_internal_ports_may_not_hit_an_http_port():
    [v] = violations_of(BASE, "cluster.internal_base_port=8000")  # the proxy's port
    assert v.field == "cluster.internal_base_port" and "8000" in v.message


def test_gpu_request_defaults_to_gres_and_renders_each_form():
    assert plan_of(BASE).slurm.gpu_directives == ("--gres=gpu:8",)
    assert plan_of(BASE, "cluster.gpu_request=gpus-per-node", "cluster.exclusive=true").slurm.gpu_directives == \
        ("--gpus-per-node=8", "--exclusive")
    assert plan_of(BASE, "cluster.gpu_request=none").slurm.gpu_directives == ()


def test_an_engine_that_uses_no_gpu_asks_slurm_for_none_unless_the_recipe_says():
    """Round 3 left standin-1p1d-1.3 (and standin-lab-1p1d) asking the rehearsal cluster for --gres=gpu:2, which a
    partition without GPU gres refuses: the CPU stand-in's default request is none, from its engine profile."""
    from toolkit import api
    from toolkit.facts.engines import ENGINES

    assert ENGINES["trtllm"].uses_gpus and not ENGINES["standin"].uses_gpus
    from toolkit.render import render_files

    for row in [r for r in api.list_recipes() if r["engine"] == "standin"]:
        plan = api.load_plan(row["name"])
        assert plan.slurm.gpu_directives == (), row["name"]
        assert "--gres" not in render_files(plan)["launch.sbatch"], row["name"]
    asked = api.load_plan("standin-1p1d-1.3", ["cluster.gpu_request=gres"])  # said in the recipe: rendered as said
    assert asked.slurm.gpu_directives == ("--gres=gpu:2",)
    # the resolved recipe (manifest.json, what tk bench and the baseline rebuild the plan from) keeps "the engine's"
    assert api.load_plan("standin-1p1d-1.3").recipe["cluster"]["gpu_request"] is None


@pytest.mark.parametrize("field,arg,owner", [
    ("sbatch_args", "--nodes=3", "--nodes"), ("sbatch_args", "--node=3", "abbreviation"),
    ("sbatch_args", "--output=x.log", "--output"), ("sbatch_args", "--gres=gpu:4", "cluster.gpu_request"),
    ("sbatch_args", "--exclusive", "cluster.exclusive"), ("sbatch_args", "--job-name=x", "--job-name"),
    ("srun_args", "--nodelist=n1", "--nodelist"), ("srun_args", "--mpi=none", "--mpi"),
    ("srun_args", "--container-image=x", "cluster.container_image"),
])
def test_extra_slurm_arguments_may_not_contradict_what_tk_sets(field, arg, owner):
    [v] = violations_of(BASE, f"cluster.{field}=[\"{arg}\"]")
    assert v.field == f"cluster.{field}" and arg in v.message and owner in v.message + v.fix


@pytest.mark.parametrize("arg", ["-N 2", "--constraint h100", "--comment=a b", "--x=$(id)", "--foo=`id`",
                                 "--a=b;c", "constraint=h100", "--A=1"])
def test_extra_slurm_arguments_are_one_long_option_in_a_safe_charset(arg):
    for field in ("sbatch_args", "srun_args"):
        assert f"cluster.{field}" in {f.split("[")[0] for f in fields(violations_of(
            BASE, f"cluster.{field}={json.dumps([arg])}"))}


def test_harmless_extra_slurm_arguments_are_rendered():
    p = plan_of(BASE, 'cluster.sbatch_args=["--constraint=h100", "--exclude=node1,node2", "--qos=high"]',
                'cluster.srun_args=["--container-writable", "--cpu-bind=none"]')
    assert p.slurm.sbatch_args == ("--constraint=h100", "--exclude=node1,node2", "--qos=high")
    assert p.slurm.srun_args == ("--container-writable", "--cpu-bind=none")


# --- rules after derivation ----------------------------------------------------------------------

def test_the_planner_derives_first_and_every_rule_only_reads_and_reports():
    """The derivation is complete for a recipe that breaks rules; then every rule in RULES reads it and reports to
    the collector, returning nothing and changing nothing (a rule never computes plan data)."""
    import copy

    from toolkit.plan.derive import derive
    from toolkit.plan.rules import RULES, Collector
    from toolkit.recipe import load_recipe_text

    broken = load_recipe_text(BASE, "r.yaml", ["kv_transfer.max_tokens_in_buffer=1050", "context.tp=3",
                                               "membership.enabled=true", "membership.storage=http",
                                               "supervision.backoff_initial_s=500", "supervision.backoff_max_s=60"])
    d = derive(broken)  # no RecipeError: deriving refuses nothing
    assert d.membership is not None and d.membership.unauthenticated and d.buffer.max_tokens_in_buffer == 1050
    assert set(d.memories) == {"context", "generation"} and d.context.instances and d.generation.instances
    before = copy.deepcopy(d)
    c = Collector(broken)
    for rule in RULES:
        assert rule(d, c) is None, rule
    assert d == before
    assert {"kv_transfer.max_tokens_in_buffer", "context.tp", "membership.storage",
            "supervision.backoff_initial_s"} <= fields(c.violations)
    assert fields(c.violations) == fields(violations_of(BASE, *broken.overrides))  # what build_plan refuses
