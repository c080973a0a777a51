"""What each supported TensorRT-LLM release line accepts. The one place version differences live.

Every other module asks this table (``get(version)``) instead of testing version numbers.
Facts come from TensorRT-LLM's own source at each release tag:
  - LLM-API option keys: ``tensorrt_llm/llmapi/llm_args.py`` (``TorchLlmArgs``/``BaseLlmArgs``,
    ``KvCacheConfig``, ``CacheTransceiverConfig``, ``CudaGraphConfig``, ``MTPDecodingConfig``);
    pydantic ``extra="forbid"``, so an unknown key fails at start-up.
  - disaggregated proxy config: ``tensorrt_llm/llmapi/disagg_utils.py``; routers: ``tensorrt_llm/serve/router.py``.
  - environment: ``cpp/tensorrt_llm/common/envUtils.cpp``.
  - CLI: ``tensorrt_llm/commands/serve.py``.
See docs/trtllm-versions.md for the tag and file each fact was read from.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class UnsupportedVersion(ValueError):
    pass


@dataclass(frozen=True)
class TrtllmVersion:
    """What one TensorRT-LLM release line accepts."""

    line: str  # "1.2"
    release: str  # the tag the facts were read from
    llm_api_keys: frozenset[str]  # top-level keys of the --extra_llm_api_options YAML (pytorch backend)
    kv_cache_config_keys: frozenset[str]
    cache_transceiver_keys: frozenset[str]
    cache_transceiver_backends: tuple[str, ...]
    cuda_graph_config_keys: frozenset[str]
    mtp_config_keys: frozenset[str]
    moe_config_keys: frozenset[str]
    disagg_keys: frozenset[str]  # top level of `trtllm-serve disaggregated -c` YAML
    disagg_server_keys: frozenset[str]  # keys tk writes under context_servers / generation_servers
    routers: tuple[str, ...]
    env_vars: frozenset[str]  # TRTLLM_* variables this version reads
    nixl_transports: tuple[str, ...]  # values of TRTLLM_NIXL_KVCACHE_BACKEND
    serve_flags: frozenset[str]  # `trtllm-serve MODEL` flags tk may pass
    disaggregated_flags: frozenset[str]  # `trtllm-serve disaggregated` flags tk may pass
    kv_dtypes: tuple[str, ...] = ("auto", "fp8")
    notes: tuple[str, ...] = field(default_factory=tuple)

    def options_file_flag(self) -> str:
        return "--extra_llm_api_options"


_LLM_API_COMMON = {
    "model", "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code",
    "tensor_parallel_size", "dtype", "revision", "tokenizer_revision", "pipeline_parallel_size",
    "context_parallel_size", "gpus_per_node", "moe_cluster_parallel_size", "moe_tensor_parallel_size",
    "moe_expert_parallel_size", "enable_attention_dp", "cp_config", "load_format",
    "enable_lora", "lora_config", "enable_prompt_adapter", "max_prompt_adapter_token",
    "quant_config", "kv_cache_config", "enable_chunked_prefill", "guided_decoding_backend",
    "batched_logits_processor", "iter_stats_max_iterations", "request_stats_max_iterations",
    "peft_cache_config", "scheduler_config", "cache_transceiver_config", "speculative_config",
    "max_batch_size", "max_input_len", "max_seq_len", "max_beam_width", "max_num_tokens",
    "gather_generation_logits", "num_postprocess_workers", "postprocess_tokenizer_dir",
    "reasoning_parser", "garbage_collection_gen0_threshold", "backend", "build_config",
    "cuda_graph_config", "disable_overlap_scheduler", "moe_config", "attn_backend",
    "enable_mixed_sampler", "enable_iter_perf_stats", "enable_iter_req_stats", "print_iter_log",
    "torch_compile_config", "enable_autotuner", "enable_layerwise_nvtx_marker", "load_format",
    "enable_min_latency", "stream_interval", "force_dynamic_quantization", "allreduce_strategy",
    "checkpoint_loader", "checkpoint_format", "kv_connector_config", "mm_encoder_only",
    "sampler_type", "enable_sleep", "return_perf_metrics", "orchestrator_type",
}

_KV_CACHE_COMMON = {
    "enable_block_reuse", "max_tokens", "max_attention_window", "sink_token_length",
    "free_gpu_memory_fraction", "host_cache_size", "onboard_blocks", "cross_kv_cache_fraction",
    "secondary_offload_min_priority", "event_buffer_max_size", "enable_partial_reuse",
    "copy_on_partial_reuse", "use_uvm", "dtype", "mamba_ssm_cache_dtype", "tokens_per_block",
}

_ENV_COMMON = {
    "TRTLLM_USE_UCX_KVCACHE", "TRTLLM_USE_MPI_KVCACHE", "TRTLLM_USE_NIXL_KVCACHE",
    "TRTLLM_NIXL_KVCACHE_BACKEND", "TRTLLM_UCX_INTERFACE", "TRTLLM_NIXL_INTERFACE",
    "TRTLLM_KVCACHE_TRANSFER_BUFFER_SIZE", "TRTLLM_KVCACHE_TRANSFER_USE_ASYNC_BUFFER",
    "TRTLLM_REQUEST_KV_CACHE_CONCURRENT", "TRTLLM_KVCACHE_SEND_MAX_CONCURRENCY_NUM",
    "TRTLLM_DISABLE_KV_CACHE_TRANSFER_OVERLAP", "TRTLLM_ENABLE_KVCACHE_RECEIVE_PARALLEL",
    "TRTLLM_TRY_ZCOPY_FOR_KVCACHE_TRANSFER", "TRTLLM_KVCACHE_TIME_OUTPUT_PATH",
    "TRTLLM_SERVER_DISABLE_GC", "TRTLLM_WORKER_DISABLE_GC", "TRTLLM_DISAGG_SERVER_DISABLE_GC",
    "TRTLLM_ENABLE_PDL",
}

_DISAGG_TOP = {
    "hostname", "port", "backend", "context_servers", "generation_servers", "max_retries",
    "perf_metrics_max_requests", "conditional_disagg_config",
}

_SERVE_FLAGS = {
    "--host", "--port", "--backend", "--tp_size", "--pp_size", "--ep_size", "--gpus_per_node",
    "--extra_llm_api_options", "--log_level", "--trust_remote_code",
}

_VERSIONS: dict[str, TrtllmVersion] = {}


def _register(v: TrtllmVersion) -> None:
    _VERSIONS[v.line] = v


_register(TrtllmVersion(
    line="1.0",
    release="v1.0.0",
    llm_api_keys=frozenset(_LLM_API_COMMON),
    kv_cache_config_keys=frozenset(_KV_CACHE_COMMON),
    cache_transceiver_keys=frozenset({"backend", "max_tokens_in_buffer"}),
    cache_transceiver_backends=("DEFAULT", "UCX", "NIXL", "MPI"),
    cuda_graph_config_keys=frozenset({"batch_sizes", "max_batch_size", "enable_padding"}),
    mtp_config_keys=frozenset({"decoding_type", "num_nextn_predict_layers", "use_relaxed_acceptance_for_thinking",
                               "relaxed_topk", "relaxed_delta", "use_mtp_vanilla"}),
    moe_config_keys=frozenset({"backend", "max_num_tokens", "load_balancer"}),
    disagg_keys=frozenset(_DISAGG_TOP),
    disagg_server_keys=frozenset({"num_instances", "urls", "router"}),
    routers=("round_robin", "load_balancing", "kv_cache_aware"),
    env_vars=frozenset(_ENV_COMMON),
    nixl_transports=("UCX",),
    serve_flags=frozenset(_SERVE_FLAGS),
    disaggregated_flags=frozenset({"-c", "-t", "-r", "-l"}),
))

_register(TrtllmVersion(
    line="1.1",
    release="v1.1.0",
    llm_api_keys=frozenset(_LLM_API_COMMON),
    kv_cache_config_keys=frozenset(_KV_CACHE_COMMON),
    cache_transceiver_keys=frozenset({"backend", "max_tokens_in_buffer", "kv_transfer_timeout_ms"}),
    cache_transceiver_backends=("DEFAULT", "UCX", "NIXL", "MPI"),
    cuda_graph_config_keys=frozenset({"batch_sizes", "max_batch_size", "enable_padding"}),
    mtp_config_keys=frozenset({"decoding_type", "num_nextn_predict_layers", "use_relaxed_acceptance_for_thinking",
                               "relaxed_topk", "relaxed_delta", "use_mtp_vanilla"}),
    moe_config_keys=frozenset({"backend", "max_num_tokens", "load_balancer"}),
    disagg_keys=frozenset(_DISAGG_TOP | {"disagg_cluster", "otlp_config"}),
    disagg_server_keys=frozenset({"num_instances", "urls", "router"}),
    routers=("round_robin", "load_balancing", "kv_cache_aware"),
    env_vars=frozenset(_ENV_COMMON),
    nixl_transports=("UCX", "LIBFABRIC"),
    serve_flags=frozenset(_SERVE_FLAGS),
    disaggregated_flags=frozenset({"-c", "-t", "-r", "-l", "-m"}),
))

_register(TrtllmVersion(
    line="1.2",
    release="v1.2.0",
    llm_api_keys=frozenset(_LLM_API_COMMON),
    kv_cache_config_keys=frozenset(_KV_CACHE_COMMON),
    cache_transceiver_keys=frozenset({"backend", "max_tokens_in_buffer", "kv_transfer_timeout_ms",
                                      "kv_transfer_sender_future_timeout_ms"}),
    cache_transceiver_backends=("DEFAULT", "UCX", "NIXL", "MPI", "MOONCAKE"),
    cuda_graph_config_keys=frozenset({"batch_sizes", "max_batch_size", "enable_padding"}),
    mtp_config_keys=frozenset({"decoding_type", "num_nextn_predict_layers", "use_relaxed_acceptance_for_thinking",
                               "relaxed_topk", "relaxed_delta", "use_mtp_vanilla"}),
    moe_config_keys=frozenset({"backend", "max_num_tokens", "load_balancer"}),
    disagg_keys=frozenset(_DISAGG_TOP | {"disagg_cluster", "otlp_config", "node_id"}),
    disagg_server_keys=frozenset({"num_instances", "urls", "router"}),
    routers=("round_robin", "load_balancing", "kv_cache_aware"),
    env_vars=frozenset(_ENV_COMMON | {"TRTLLM_USE_MOONCAKE_KVCACHE", "TRTLLM_MOONCAKE_INTERFACE"}),
    nixl_transports=("UCX", "LIBFABRIC"),
    serve_flags=frozenset(_SERVE_FLAGS),
    disaggregated_flags=frozenset({"-c", "-t", "-r", "-l", "-m"}),
))

SUPPORTED = tuple(_VERSIONS)
LATEST = SUPPORTED[-1]


def get(line: str) -> TrtllmVersion:
    """The table entry for a release line ("1.2") or a full version ("1.2.0rc3")."""
    key = ".".join(str(line).split(".")[:2])
    try:
        return _VERSIONS[key]
    except KeyError:
        raise UnsupportedVersion(
            f"TensorRT-LLM {line} is not supported; supported release lines: {', '.join(SUPPORTED)}"
        ) from None
