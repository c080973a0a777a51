"""TensorRT-LLM facts: what each supported release line accepts, and every TensorRT-LLM name tk writes.

The one place version differences live: every other module asks this table (``get(version)``) instead of
testing version numbers. The names tk writes (commands, CLI flags, the options-file flag, environment
selectors, option keys tk owns) are the constants below the table's dataclass; plan and templates use them.
Adding a TensorRT-LLM field is one row here plus one template line (or one line of the option builder in
``toolkit/plan/options.py`` when the value is derived).
Facts were checked against TensorRT-LLM's own source (stored NVIDIA/TensorRT-LLM files on main, pinned by
commit below) and the upstream pull requests that changed them; the release-tag trees themselves could not
be read, so facts that depend on when a change reached a release branch carry "unverified at tag":
  - LLM-API option keys: ``tensorrt_llm/llmapi/llm_args.py`` (``TorchLlmArgs``/``BaseLlmArgs``,
    ``KvCacheConfig``, ``CacheTransceiverConfig``, ``CudaGraphConfig``, ``MTPDecodingConfig``);
    pydantic ``extra="forbid"``, so an unknown key fails at start-up.
  - disaggregated proxy config: ``tensorrt_llm/llmapi/disagg_utils.py``; routers: ``tensorrt_llm/serve/router.py``.
  - environment: ``cpp/tensorrt_llm/common/envUtils.cpp``.
  - CLI: ``tensorrt_llm/commands/serve.py``.
docs/trtllm-versions.md has the per-line table, every source, what is unverified, and how to add a line.
"""

from __future__ import annotations

import re
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
    cache_transceiver_backends: tuple[str, ...]
    disagg_keys: frozenset[str]  # top level of `trtllm-serve disaggregated -c` YAML
    disagg_server_keys: frozenset[str]  # keys tk writes under context_servers / generation_servers
    routers: tuple[str, ...]
    env_vars: frozenset[str]  # TRTLLM_* variables this version reads
    nixl_transports: tuple[str, ...]  # values of TRTLLM_NIXL_KVCACHE_BACKEND
    serve_flags: frozenset[str]  # `trtllm-serve MODEL` flags tk may pass
    disaggregated_flags: frozenset[str]  # `trtllm-serve disaggregated` flags tk may pass
    kv_dtypes: tuple[str, ...] = ("auto", "fp8")
    # KV-cache layers TensorRT-LLM adds for MTP with speculative_config.num_nextn_predict_layers = N:
    # "per_mtp_layer" = N (get_num_spec_layers returns num_nextn_predict_layers); see mtp_kv_layers().
    mtp_kv_layers: str = "per_mtp_layer"
    # Membership TensorRT-LLM keeps itself (disagg_cluster: workers register and heartbeat into cluster storage,
    # the proxy adds and drops them): the storages the line accepts, () = none (see MEMBERSHIP_* below).
    cluster_storages: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)


# ---------------------------------------------------------------------------------------------------
# Names tk writes. Commands and flags: tensorrt_llm/commands/serve.py; env: envUtils.cpp (see below).
# ---------------------------------------------------------------------------------------------------
SERVE_COMMAND = "trtllm-serve"
LAUNCHER = "trtllm-llmapi-launch"  # wraps each MPI rank of a multi-GPU server
PROXY_SUBCOMMAND = "disaggregated"  # `trtllm-serve disaggregated -c FILE`
PYTORCH_BACKEND = "pytorch"  # the value of --backend and of disagg.yaml's `backend`
# `trtllm-serve MODEL` flags tk writes, by what they carry.
SERVE_FLAG = {
    "host": "--host", "port": "--port", "backend": "--backend", "tp": "--tp_size", "pp": "--pp_size",
    "ep": "--ep_size",
    # The LLM-API options file, as launch.sbatch passes it (every supported line has this spelling).
    "options_file": "--extra_llm_api_options",
}
OPTIONS_FILE_FLAG = SERVE_FLAG["options_file"]
# `trtllm-serve disaggregated` flags tk writes.
PROXY_FLAG = {"config": "-c", "start_timeout": "-t", "request_timeout": "-r"}

LOG_LEVEL_ENV = "TLLM_LOG_LEVEL"
NIXL_BACKEND_ENV = "TRTLLM_NIXL_KVCACHE_BACKEND"  # which NIXL backend (UCX, LIBFABRIC) moves KV
# cache_transceiver_config.backend -> the env selector that forces the same backend (DEFAULT reads them).
BACKEND_SELECTORS = {"NIXL": "TRTLLM_USE_NIXL_KVCACHE", "UCX": "TRTLLM_USE_UCX_KVCACHE",
                     "MPI": "TRTLLM_USE_MPI_KVCACHE", "MOONCAKE": "TRTLLM_USE_MOONCAKE_KVCACHE"}
# Environment variables a recipe may not set because tk owns them: name -> the recipe field tk derives it from.
# UCX_TLS is not among them: a role's UCX_TLS is honoured, with a warning that it overrides the transport profile.
TK_OWNED_ENV = {NIXL_BACKEND_ENV: "kv_transfer.transport",
                "UCX_NET_DEVICES": "kv_transfer.net_devices",
                "TLLM_SPAWN_PROXY_PROCESS_IPC_PORT": "cluster.internal_base_port"}
# LLM-API option keys tk writes from the recipe: dotted path in the options file -> the recipe field that sets it
# ("{role}" is context or generation). A recipe's extra_options may repeat such a key only with exactly the
# value tk writes (harmless, e.g. pasted from an upstream config); any other value is refused and names the field.
# A path tk does not write for a plan (moe_expert_parallel_size of a dense model, speculative_config without MTP,
# kv_transfer_timeout_ms where the line lacks it) has no value to repeat, so any value is refused.
TK_OWNED_OPTIONS = {
    "model": "{role}.model_path (or model_path)",  # trtllm-serve's MODEL argument
    "backend": "engine (tk always serves the pytorch backend)",  # --backend pytorch
    "tensor_parallel_size": "{role}.tp",
    "pipeline_parallel_size": "{role}.pp",
    "moe_expert_parallel_size": "{role}.ep",
    "enable_attention_dp": "{role}.attention_dp",
    "max_batch_size": "{role}.max_batch_size",
    "max_num_tokens": "{role}.max_num_tokens",
    "max_seq_len": "{role}.max_seq_len (or traffic.max_input_len / prefix_len / max_output_len)",
    "kv_cache_config.tokens_per_block": "kv_transfer.tokens_per_block",
    "kv_cache_config.dtype": "kv_transfer.dtype",
    "kv_cache_config.free_gpu_memory_fraction": "{role}.free_gpu_memory_fraction",
    "cache_transceiver_config.backend": "kv_transfer.backend",
    "cache_transceiver_config.max_tokens_in_buffer": "{role}.max_tokens_in_buffer (or kv_transfer.max_tokens_in_buffer)",
    "cache_transceiver_config.kv_transfer_timeout_ms": "kv_transfer.kv_transfer_timeout_ms",
    "speculative_config": "speculative (mtp_layers, or decoding_type / model / max_draft_len / options)",
}
# Owned keys tk passes on the command line rather than in the options file, with the value it passes there
# (None: the plan supplies it, e.g. the role's model path).
TK_IMPLIED_OPTIONS = {"backend": PYTORCH_BACKEND, "model": None}
# The kind of value TensorRT-LLM's pydantic models take for the option keys tk (or the stand-in) reads. A kind ending
# in "?" also takes null (an Optional field). The models validate in pydantic's lax mode (StrictBaseModel is
# extra="forbid", not strict, tensorrt_llm/llmapi/llm_args.py), so a value of another kind that pydantic converts
# (enable_chunked_prefill: 1 or "true", max_batch_size: "8") is accepted and written converted, with a warning; one
# it cannot convert fails at start-up, and tk refuses it (toolkit/plan/rules.py check_extra_options).
OPTION_KINDS = {
    "tensor_parallel_size": "positive integer", "pipeline_parallel_size": "positive integer",
    "moe_expert_parallel_size": "positive integer", "max_batch_size": "positive integer",
    "max_num_tokens": "positive integer", "max_seq_len": "positive integer", "max_input_len": "positive integer",
    "enable_attention_dp": "boolean", "enable_chunked_prefill": "boolean", "print_iter_log": "boolean",
    "disable_overlap_scheduler": "boolean", "trust_remote_code": "boolean",
    "kv_cache_config": "mapping", "cache_transceiver_config": "mapping", "cuda_graph_config": "mapping?",
    "moe_config": "mapping?", "speculative_config": "mapping?",
    "kv_cache_config.tokens_per_block": "positive integer", "kv_cache_config.enable_block_reuse": "boolean",
    "kv_cache_config.free_gpu_memory_fraction": "fraction", "kv_cache_config.dtype": "kv dtype",
    "kv_cache_config.max_tokens": "positive integer", "kv_cache_config.event_buffer_max_size": "non-negative integer",
    "cache_transceiver_config.max_tokens_in_buffer": "positive integer",
    "cache_transceiver_config.kv_transfer_timeout_ms": "positive integer",
    "cache_transceiver_config.kv_transfer_sender_future_timeout_ms": "positive integer?",
    "cuda_graph_config.batch_sizes": "list of positive integers",
    "cuda_graph_config.max_batch_size": "non-negative integer", "cuda_graph_config.enable_padding": "boolean",
    # What the 1.3 transceiver rules compare (toolkit/plan/rules.py check_transceiver); types from the 1.3 golden
    # manifest (tensorrt_llm/usage/llm_args_golden_manifest.json @ 0004396720054fd8e205cbf616f21f0b57c6b412):
    # context_parallel_size int, enable_pipelined_transfer bool, kv_cache_bounce_size_mb int,
    # kv_transfer_poll_interval_ms and kv_transfer_sender_future_timeout_ms Optional[Annotated[int, Gt(gt=0)]].
    "context_parallel_size": "positive integer",
    "cache_transceiver_config.enable_pipelined_transfer": "boolean",
    "cache_transceiver_config.kv_cache_bounce_size_mb": "integer",
    "cache_transceiver_config.kv_transfer_poll_interval_ms": "positive integer?",
}
# What TensorRT-LLM checks when a generation server connects to a context server:
# (what, path in the LLM-API options, the recipe field that sets it once for both roles).
CTX_GEN_MUST_AGREE = (
    ("KV dtype", ("kv_cache_config", "dtype"), "kv_transfer.dtype"),
    ("tokens_per_block", ("kv_cache_config", "tokens_per_block"), "kv_transfer.tokens_per_block"),
    ("speculative config", ("speculative_config",), "speculative"),
    ("cache transceiver backend", ("cache_transceiver_config", "backend"), "kv_transfer.backend"),
)


# ---------------------------------------------------------------------------------------------------
# Provenance. The release tags' commits were identified from triton-inference-server/tensorrtllm_backend,
# whose `tensorrt_llm` submodule pins them: v1.0.0 = ae8270b713446948246f16fadf4e2a32e35d0f62
# ("Update tensorrt_llm submodule to v1.0.0 ae8270b71", 2025-09-24), v1.1.0 =
# 48b7b5d8b7ed1e6bff57aecc6ff7d1533288bed8 ("TensorRT-LLM Backend v1.1.0 release", 2025-12-19); the v1.2.0
# commit could not be pinned. The TensorRT-LLM tree AT THOSE TAGS could not be read here (repository snapshot
# too large to fetch; PyPI only carries stub sdists). Every entry below therefore says which source it was
# checked against instead: "src@<commit>" = a stored NVIDIA/TensorRT-LLM file at that commit (main branch,
# not the tag), "PR #n" = the upstream pull request that added/changed it, with its date. An entry present
# in a mid-2025 main-branch file (before release/1.0 branched) and in the newest file is taken as present in
# all three lines; anything that depends on when a PR landed relative to a release branch is flagged
# "unverified at tag". docs/trtllm-versions.md lists them.
#   MID25_LLM_ARGS  = tensorrt_llm/llmapi/llm_args.py, stored version with the lowercase backend Literal
#                     (June/July 2025, after PR #5234, before the 2025-08 uppercase switch)
#   NEWEST_ENVUTILS = cpp/tensorrt_llm/common/envUtils.cpp@02734d9e111c8dc242a0e0f413275d2b2578803e (2026)
#   MID25_ENVUTILS  = envUtils.cpp stored version with TRTLLM_PARALLEL_CACHE_SEND and no Mooncake (mid-2025)
#   DISAGG_MID      = tensorrt_llm/llmapi/disagg_utils.py@3e53e4adfea6e24674eaec876c3009551cb25134
#   DISAGG_NEWEST   = tensorrt_llm/llmapi/disagg_utils.py@0228a71223416496ff056a157936bad2e42c762f
# ---------------------------------------------------------------------------------------------------

# Router types the recipe may name (the union over every line; each line's own list is in the data file, and the plan
# checks the recipe's against it): tensorrt_llm/serve/router.py create_router(); "conversation" from PR #12526
# (2026-03-25, router.py @ 00895e31dc5f9865c6bdfd2dd0508a9d6d964e9d).
ROUTERS = ("round_robin", "load_balancing", "kv_cache_aware", "conversation")

# `trtllm-serve MODEL` flags tk passes (--host, --port, --backend, --tp_size, --pp_size, --ep_size,
# --extra_llm_api_options) and a few more; spot-checked in stored tensorrt_llm/commands/serve.py versions
# (early 2025 and newest), not at the tags.
_SERVE_FLAGS = {*SERVE_FLAG.values(), "--gpus_per_node", "--log_level", "--trust_remote_code"}
# Further `trtllm-serve serve` flags a recipe's extra_serve_args may pass (from tensorrt_llm/commands/serve.py; the
# stand-in accepts the same): True = takes a value, False = a switch. Not checked per release line.
SERVE_FLAGS_MORE = {
    "--tensor_parallel_size": True, "--pipeline_parallel_size": True, "--context_parallel_size": True,
    "--cp_size": True, "--moe_expert_parallel_size": True, "--moe_cluster_parallel_size": True,
    "--cluster_size": True, "--max_batch_size": True, "--max_num_tokens": True, "--max_seq_len": True,
    "--max_beam_width": True, "--free_gpu_memory_fraction": True, "--kv_cache_free_gpu_memory_fraction": True,
    "--tokenizer": True, "--num_postprocess_workers": True, "--reasoning_parser": True,
    "--enable_chunked_prefill": False, "--server_role": True, "--config": True,
}
SERVE_SWITCHES = {"--trust_remote_code", "--enable_chunked_prefill"}
# Long spellings of the same setting -> the flag tk writes.
SERVE_FLAG_ALIASES = {
    "--tensor_parallel_size": "--tp_size", "--pipeline_parallel_size": "--pp_size",
    "--moe_expert_parallel_size": "--ep_size", "--context_parallel_size": "--cp_size",
    "--moe_cluster_parallel_size": "--cluster_size",
    "--kv_cache_free_gpu_memory_fraction": "--free_gpu_memory_fraction", "--config": "--extra_llm_api_options",
}
SERVE_INT_FLAGS = {"--port", "--tp_size", "--pp_size", "--ep_size", "--cp_size", "--cluster_size", "--gpus_per_node",
                   "--max_batch_size", "--max_num_tokens", "--max_seq_len", "--max_beam_width",
                   "--num_postprocess_workers"}
# Flags (canonical spelling) tk sets itself, or whose setting tk writes into the options file (which wins over
# the flag): a recipe's extra_serve_args may not pass them. Flag -> the recipe field to set instead.
TK_OWNED_SERVE_FLAGS = {
    SERVE_FLAG["host"]: "nothing (tk binds each server to its node's address)",
    SERVE_FLAG["port"]: "cluster.worker_base_port",
    SERVE_FLAG["backend"]: "engine (tk always serves the pytorch backend)",
    SERVE_FLAG["tp"]: "{role}.tp", SERVE_FLAG["pp"]: "{role}.pp", SERVE_FLAG["ep"]: "{role}.ep",
    OPTIONS_FILE_FLAG: "{role}.extra_options",
    "--max_batch_size": "{role}.max_batch_size", "--max_num_tokens": "{role}.max_num_tokens",
    "--max_seq_len": "{role}.max_seq_len",
    "--free_gpu_memory_fraction": "{role}.free_gpu_memory_fraction",
    "--disagg_cluster_uri": "membership (tk passes the proxy's cluster storage)",
}
# `trtllm-serve disaggregated`: -c/--config_file, -t/--server_start_timeout, -r/--request_timeout in an
# early-2025 serve.py and in a mid/late-2025 one, which also has -m/--metadata_server_config_file and
# -l/--log_level. tk passes only -c, -t and -r. Whether 1.0 has -m is unverified (left as before).
_DISAGG_FLAGS_BASE = {*PROXY_FLAG.values(), "-l"}

# ---------------------------------------------------------------------------------------------------
# Membership that TensorRT-LLM keeps itself (`disagg_cluster`, "service discovery" / auto-scaling).
# Sources (NVIDIA/TensorRT-LLM; docs/trtllm-versions.md "Membership" has the whole protocol):
#   DISAGG_MID (disagg_utils.py@3e53e4ad): DisaggClusterConfig(cluster_uri, cluster_name="", minimal_instances=
#     MinimalInstances(context_servers=1, generation_servers=1), heartbeat_interval_sec=5, inactive_timeout_sec=10);
#     an unknown key raises KeyError("Key X not found in DisaggClusterConfig"); with disagg_cluster set,
#     extract_disagg_cfg builds no static server list: `urls` are neither read nor checked.
#   tensorrt_llm/serve/cluster_storage.py (PR #7869): http(s):// -> HttpClusterStorageServer hosted on the proxy's
#     own app (routes /set /get /delete /expire /get_prefix), etcd:// -> Etcd3ClusterStorage (gRPC client).
#   tensorrt_llm/serve/disagg_auto_scaling.py: key f"/trtllm-disagg/{cluster_name}/workers/{worker_id}".
#   tensorrt_llm/commands/serve.py: `trtllm-serve MODEL --disagg_cluster_uri URI --server_role ROLE`
#     (ServerRole[role.upper()]: context | generation).
# First line: 1.2 (PR #7869 under review 2025-09-26; main = 1.2.0rc0 by 2025-09-30). Not at the v1.2.0 tag itself.
# ---------------------------------------------------------------------------------------------------
MEMBERSHIP_KEY = "disagg_cluster"  # top-level key of the proxy config
MEMBERSHIP_FLAG = {"uri": "--disagg_cluster_uri", "role": "--server_role"}  # `trtllm-serve MODEL` flags
MEMBERSHIP_ROLES = {"ctx": "context", "gen": "generation"}  # --server_role values (ServerRole[value.upper()])
MEMBERSHIP_STORAGES = ("http", "etcd")  # http: hosted by the proxy itself; etcd: an etcd v3 server
MEMBERSHIP_URI_SCHEMES = {"http": "http", "etcd": "etcd"}  # cluster_uri scheme per storage
# DisaggClusterConfig defaults (DISAGG_MID): the recipe's defaults.
MEMBERSHIP_DEFAULTS = {"heartbeat_interval_sec": 5, "inactive_timeout_sec": 10, "minimal_instances": 1}
MEMBERSHIP_KEY_PREFIX = "/trtllm-disagg/{cluster_name}/workers"  # get_worker_key_prefix()
# DisaggClusterWorker.register_worker(retry_interval=5): a failed put-if-absent is retried this often, and a failed
# heartbeat (expire) registers again (disagg_auto_scaling.py @ 00184339)
MEMBERSHIP_REGISTER_RETRY_S = 5
ETCD_CLIENT_PORT = 2379  # etcd's own default client port (the port of NVIDIA's examples' etcd:// URIs)

_VERSIONS: dict[str, TrtllmVersion] = {}


def _register(v: TrtllmVersion) -> None:
    _VERSIONS[v.line] = v


def _from_data(line: str, release: str, **hand) -> TrtllmVersion:
    """A line's table: option keys, backends, env names and proxy keys from the generated data file
    (toolkit/facts/llm_args.py, scripts/trtllm_facts.py); CLI flags and the rest (``hand``) as read by hand."""
    from toolkit.facts import llm_args

    def keys(section: str) -> frozenset[str]:
        return llm_args.section_keys(line, section)

    env = llm_args.env_names(line)
    proxy = llm_args.proxy(line)
    return TrtllmVersion(
        line=line, release=release,
        llm_api_keys=keys(""), kv_cache_config_keys=keys("kv_cache_config"),
        cache_transceiver_backends=llm_args.line_choices(line, "cache_transceiver_config.backend"),
        # tk writes `backend: pytorch` at the top of the proxy config: extract_disagg_cfg takes unknown top-level keys
        # as **kwargs and copies them into both server sections (DISAGG_MID, DISAGG_NEWEST), so it is accepted.
        disagg_keys=frozenset(proxy["top"]) | {"backend"}, disagg_server_keys=frozenset(proxy["server"]),
        routers=tuple(proxy["routers"]), env_vars=env["cpp"] | env["python"], **hand)


_register(_from_data(
    "1.0", "v1.0.0",  # tag commit ae8270b713446948246f16fadf4e2a32e35d0f62 (tensorrtllm_backend v1.0.0)
    # NIXL runs over UCX only; there is no variable to pick another NIXL backend before PR #9075.
    nixl_transports=("UCX",),
    serve_flags=frozenset(_SERVE_FLAGS),
    disaggregated_flags=frozenset(_DISAGG_FLAGS_BASE),
    notes=(
        ("cache_transceiver_config.backend spelling at v1.0.0 is unverified: main accepted only lowercase "
         "'default|ucx|nixl|mpi' from PR #5234 (2025-06) until the uppercase switch around 2025-08-14 "
         "(PR #6583 of 2025-08-04 still aligned examples to lowercase; PR #6887 of 2025-08-14 describes the "
         "uppercase-only change). tk renders uppercase."),
        ("backend DEFAULT: PR #5234 (2025-06) made the C++ factory fall back to UCX when no "
         "TRTLLM_USE_*_KVCACHE selector is set; the v1.0.0 behaviour itself is unverified."),
    ),
))

_register(_from_data(
    "1.1", "v1.1.0",  # tag commit 48b7b5d8b7ed1e6bff57aecc6ff7d1533288bed8 (tensorrtllm_backend v1.1.0)
    nixl_transports=("UCX",),  # TRTLLM_NIXL_KVCACHE_BACKEND landed after release/1.1 branched
    serve_flags=frozenset(_SERVE_FLAGS),
    disaggregated_flags=frozenset(_DISAGG_FLAGS_BASE | {"-m"}),
    notes=(
        ("kv_transfer_timeout_ms and TRTLLM_NIXL_KVCACHE_BACKEND are unverified on 1.1: both landed on main "
         "after release/1.1 branched (Oct/Nov 2025); a back-port into v1.1.0 could not be ruled out."),
    ),
))

_register(_from_data(
    "1.2", "v1.2.0",  # tag 51f5ef3 (2026-03-12; full commit not pinned: tensorrtllm_backend pins a triton fork)
    # UCX (default) and LIBFABRIC: PR #9075 review (LIBFABRIC once NIXL >= 0.6.1), issue #10024 (1.2.0rc5
    # with TRTLLM_NIXL_KVCACHE_BACKEND=LIBFABRIC); value set at v1.2.0 itself unverified.
    nixl_transports=("UCX", "LIBFABRIC"),
    serve_flags=frozenset(_SERVE_FLAGS | {MEMBERSHIP_FLAG["uri"], MEMBERSHIP_FLAG["role"]}),
    cluster_storages=MEMBERSHIP_STORAGES,
    disaggregated_flags=frozenset(_DISAGG_FLAGS_BASE | {"-m"}),
    notes=(
        ("backend DEFAULT: kv_cache_transceiver.py on main (PR #9352 context, 2025-11-21) maps DEFAULT to the "
         "TRTLLM_USE_*_KVCACHE selectors, else NIXL; PR #9352 (revert to UCX) was closed unmerged."),
    ),
))

# The 1.3 line: weekly pre-releases all 2026 (1.3.0rc0 2026-01-22 .. rc29 2026-09-29 on PyPI; no 1.3.0 final).
# Option keys from two golden manifests (1.3.0rc18..rc20 and rc24..rc26, scripts/trtllm_sources.yaml); proxy keys
# from disagg_utils.py @ 0228a712, routers from serve/router.py @ 00895e31; env from envUtils.cpp @ 02734d9e and the
# Python registry tensorrt_llm/envs.py @ 0fccc5b9. serve/disaggregated flags as on 1.2 (srt-slurm's trtllm-serve path
# is verified on 1.3.0rc15/rc17 with --config, src/srtctl/backends/trtllm.py @ c88ef731).
_register(_from_data(
    "1.3", "1.3.0rc26",
    nixl_transports=("UCX", "LIBFABRIC"),
    serve_flags=frozenset(_SERVE_FLAGS | {MEMBERSHIP_FLAG["uri"], MEMBERSHIP_FLAG["role"]}),
    cluster_storages=MEMBERSHIP_STORAGES,
    disaggregated_flags=frozenset(_DISAGG_FLAGS_BASE | {"-m"}),
    kv_dtypes=("auto", "fp8", "nvfp4"),  # kv_cache_config.dtype's allow-list in both 1.3 manifests has nvfp4
    # speculative/utils.py @ 011d0933dcb5e592f5fa2626beaf42a96324c578 (2026 main, with the usage telemetry of
    # PR #12384, 2026-03-20): get_num_spec_layers returns 1 for MTP-Eagle one-model. Early 1.3 rcs unverified.
    mtp_kv_layers="one",
    notes=(
        "a pre-release line: facts from main between 1.3.0rc18 and rc26; other rcs bracket between snapshots",
        ("backend DEFAULT resolves to NIXL unless a TRTLLM_USE_*_KVCACHE selector is 1 "
         "(tensorrt_llm/_torch/pyexecutor/kv_cache_transceiver.py, resolve_cache_transceiver_config)."),
    ),
))

# ---------------------------------------------------------------------------------------------------
# Internal ports of `trtllm-llmapi-launch` (several instances on one node, W2).
# The launcher (tensorrt_llm/llmapi/trtllm-llmapi-launch @ 020c89e64e49f24102f1b62be96a1a68283cdf7a, main
# before PR #8922) picks the address of its spawn-proxy IPC channel as "tcp://127.0.0.1:<first port from
# 10012 that a bind-and-close probe finds free>", exports it as TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR (and logs
# "TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR: tcp://127.0.0.1:PORT" on stderr), and only binds it later, in
# `python3 -m tensorrt_llm.llmapi.mgmn_leader_node` on rank 0, after importing tensorrt_llm. Instances
# started together on one node all see 10012 free and collide. NVIDIA called the scheme "not stable"
# (PR #3795, 2025-04, closed unmerged). PR #8922 (merged 2025-11-07, main = the 1.2 line since 1.2.0rc0 of
# 2025-09-30) added TLLM_SPAWN_PROXY_PROCESS_IPC_PORT: when set, the launcher uses
# tcp://127.0.0.1:$TLLM_SPAWN_PROXY_PROCESS_IPC_PORT instead of searching (presence at v1.2.0 itself:
# unverified at tag, it is on main months before the release). 1.0 and 1.1 branched before PR #8922: no knob.
# Without the launcher, one `trtllm-serve` task would have to spawn its own MPI ranks (the LLM API's MPI pool
# session, mpi4py MPI_Comm_spawn), a path none of NVIDIA's Slurm examples takes: the launcher is documented as
# what "launches the LLM-API code on Slurm-like systems" (docs, PR #5220) and every official Slurm script uses
# it (examples/disaggregated/slurm/simple_example/launch.slurm, benchmark/start_worker.sh). Whether spawning
# works under srun --mpi=pmix was not established from source, so tk keeps the launcher and, on 1.0/1.1,
# starts instances that share a node one after another: the next once the previous launcher's IPC port
# answers, or after LAUNCHER_STAGGER_S seconds, whichever comes first.
# ---------------------------------------------------------------------------------------------------
LAUNCHER_IPC_PORT_ENV = "TLLM_SPAWN_PROXY_PROCESS_IPC_PORT"
LAUNCHER_IPC_ADDR_ENV = "TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR"  # what the launcher logs, with the port it chose
LAUNCHER_IPC_HOST = "127.0.0.1"  # the launcher's IPC address is always on loopback
LAUNCHER_FIRST_IPC_PORT = 10012  # where the launcher's own search starts (1.0/1.1)
LAUNCHER_STAGGER_S = 120  # bound on waiting for one co-located launcher before starting the next
# Release line -> the environment variables that give one instance its own internal port (each a port number
# tk allocates per instance, like the HTTP ports). A line absent here or with () has none: stagger instead.
INTERNAL_PORT_ENVS = {"1.0": (), "1.1": (), "1.2": (LAUNCHER_IPC_PORT_ENV,), "1.3": (LAUNCHER_IPC_PORT_ENV,)}


def internal_port_envs(version: "TrtllmVersion") -> tuple[str, ...]:
    return INTERNAL_PORT_ENVS.get(version.line, ())


# ---------------------------------------------------------------------------------------------------
# TensorRT-LLM checks its own config before any server starts. What `trtllm-serve` itself does with the
# options file (tensorrt_llm/commands/serve.py, 1.0-1.2 era: `llm_args = update_llm_args_with_extra_dict(
# llm_args, yaml.safe_load(options_file))`, then `PyTorchLLM(**llm_args)` -> TorchLlmArgs) and with the proxy
# config (`trtllm-serve disaggregated -c` -> disagg_utils.parse_disagg_config_file). Located in:
#   update_llm_args_with_extra_dict: tensorrt_llm/llmapi/llm_args.py (mid-2025 onwards; the 1.0-1.2 lines),
#     tensorrt_llm/llmapi/llm_utils.py in early-2025 main (kept as a fallback);
#   TorchLlmArgs (pydantic, extra="forbid"): tensorrt_llm/llmapi/llm_args.py (MID25_LLM_ARGS and newer);
#   parse_disagg_config_file(path): tensorrt_llm/llmapi/disagg_utils.py (DISAGG_MID and DISAGG_NEWEST).
# "module:attribute", tried in order; the check script (templates/check_config.py) imports them on the node.
CONFIG_CHECK_MERGE = ("tensorrt_llm.llmapi.llm_args:update_llm_args_with_extra_dict",
                      "tensorrt_llm.llmapi.llm_utils:update_llm_args_with_extra_dict")
CONFIG_CHECK_LLM_ARGS = ("tensorrt_llm.llmapi.llm_args:TorchLlmArgs",)
CONFIG_CHECK_DISAGG = ("tensorrt_llm.llmapi.disagg_utils:parse_disagg_config_file",)
# Liveness as progress: trtllm-serve's GET /health_generate runs one minimal chat completion (one token) through the
# engine and answers 200 only when it comes back ("Health check that performs a minimal generation"): /health
# stays 200 while a wedged executor makes no progress. Added for exactly that ("for kubernetes to detect when the
# runtime is hung ... even if the server /health returns a 200", NVIDIA/TensorRT-LLM PR #3856, merged as PR #4349
# in May 2025), so every supported line (1.0 onwards) has it; route table: tensorrt_llm/serve/openai_server.py
# register_routes (NVIDIA/TensorRT-LLM @ 00057725d9a6591f033e44f31c219e2426827bb7). /metrics is no substitute: it
# drains the iteration-stats queue other readers need, and is empty unless enable_iter_perf_stats is set.
PROGRESS_PROBE_PATH = "/health_generate"
CONFIG_CHECK_TIMEOUT_S = 300  # importing tensorrt_llm (torch, the C++ bindings) takes up to a minute or two

SUPPORTED = tuple(_VERSIONS)


# ---------------------------------------------------------------------------------------------------
# Option keys tk writes whose acceptance by a line can be unverified (facts.llm_args.status is UNSURE for it), with
# TensorRT-LLM's default. Where a line's acceptance is unverified, tk omits the key when its value is the default (the
# engine then uses that same value), and keeps it with a plan warning when it differs.
# ---------------------------------------------------------------------------------------------------
VERIFIED, UNVERIFIED = "verified", "unverified"


@dataclass(frozen=True)
class OptionFact:
    path: tuple[str, ...]  # ("kv_cache_config", "tokens_per_block")
    default: object  # TensorRT-LLM's default when the key is absent
    source: str  # where the default comes from

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


OPTION_FACTS: tuple[OptionFact, ...] = (
    # KvCacheConfig.tokens_per_block: int = Field(default=32) in llm_args.py @ 3e906a0e and every later file; 32 is
    # also the router's default (router.py) and the value every line used before the key existed.
    OptionFact(("kv_cache_config", "tokens_per_block"), 32,
               "KvCacheConfig.tokens_per_block default 32 (llm_args.py @ 3e906a0e); PR #5911 (opened 2025-07-10) "
               "added it, absent from the June/July 2025 llm_args.py tk's 1.0 table was read from"),
)


def acceptance(version: "TrtllmVersion", fact: OptionFact) -> str:
    from toolkit.facts import llm_args

    known = llm_args.status(llm_args.Target(version.line), fact.dotted).verdict is llm_args.Verdict.KNOWN
    return VERIFIED if known else UNVERIFIED


def unverified_options(version: "TrtllmVersion") -> tuple[OptionFact, ...]:
    """The rows whose acceptance by this line is unverified."""
    return tuple(f for f in OPTION_FACTS if acceptance(version, f) == UNVERIFIED)


LATEST = "1.2"
PRERELEASE_LINES = ("1.3",)
# The releases of each line tk knows were published, first and last (PyPI uploads and release tags; the dates are in
# docs/trtllm-versions.md, "The snapshots"); no patch release (1.2.1) is known. A version of a line outside its
# range is named in a warning (a typo such as 1.2.99, or a release newer than tk's facts), never refused: the line's
# facts still apply.
KNOWN_RELEASES = {"1.0": ("1.0.0rc0", "1.0.0"), "1.1": ("1.1.0rc0", "1.1.0"), "1.2": ("1.2.0rc0", "1.2.0"),
                  "1.3": ("1.3.0rc0", "1.3.0rc29")}


def unknown_release(text: str) -> str | None:
    """Why ``text`` (a release, not a line alone) is not a release tk knows of its line, or None."""
    from toolkit.facts import llm_args

    parsed = parse_version(text)
    if parsed is None or parsed.line not in KNOWN_RELEASES or re.fullmatch(r"[0-9]+\.[0-9]+", text):
        return None
    first, last = KNOWN_RELEASES[parsed.line]
    if llm_args.version_key(first) <= llm_args.version_key(text) <= llm_args.version_key(last):
        return None
    return (f"TensorRT-LLM has no release {text} that tk knows of: the {parsed.line} line's releases it knows are "
            f"{first} .. {last}; tk checks the recipe against the {parsed.line} line's facts")


# ---------------------------------------------------------------------------------------------------
# Version text: a recipe's trtllm_version, or the tag of a TensorRT-LLM container image.
# TensorRT-LLM versions are MAJOR.MINOR.PATCH with an optional pre-release (rcN) and post suffix, as
# tensorrt_llm/version.py writes them ("1.0.0rc4", "1.2.0rc6.post1") and as NGC tags its release images
# (nvcr.io/nvidia/tensorrt-llm/release:1.0.0, :1.2.0rc3). A patch release (1.2.1) belongs to its line (1.2):
# the facts are per MINOR line. A recipe may also name the line alone ("1.2").
# ---------------------------------------------------------------------------------------------------
VERSION_TEXT = re.compile(
    r"(?P<major>[0-9]{1,4})\.(?P<minor>[0-9]{1,4})(?:\.(?P<patch>[0-9]{1,4}))?"
    r"(?P<pre>(?:a|b|rc|dev)[0-9]{0,4})?(?P<post>\.?post[0-9]{1,4})?", re.ASCII)


@dataclass(frozen=True)
class ParsedVersion:
    text: str  # as written
    line: str  # "1.2"
    prerelease: bool  # an rc/dev/alpha/beta build of the line


def parse_version(text: str) -> ParsedVersion | None:
    """``1.2``, ``1.2.1``, ``1.0.0``, ``1.2.0rc3``, ``1.2.0rc6.post1`` -> its line; None if not a version."""
    m = VERSION_TEXT.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        return None
    return ParsedVersion(text=text, line=f"{int(m['major'])}.{int(m['minor'])}", prerelease=bool(m["pre"]))


# Container images whose tag is the TensorRT-LLM version: NVIDIA's NGC release and devel images, under any
# registry or mirror that keeps the repository path (nvcr.io/nvidia/tensorrt-llm/release:1.2.0,
# registry.example.com/nvidia/tensorrt-llm/release:1.2.0). Other images (Dynamo's tensorrtllm-runtime, whose
# tag is the Dynamo version; a site's own build; a .sqsh file) do not say which TensorRT-LLM they hold.
IMAGE_REPOSITORIES = ("nvidia/tensorrt-llm/release", "nvidia/tensorrt-llm/devel")
_IMAGE_TAG = re.compile(r"v?(?P<version>[0-9][0-9A-Za-z.]*)", re.ASCII)


@dataclass(frozen=True)
class ImageVersion:
    """What tk can read from a container image reference about the TensorRT-LLM it holds."""

    image: str
    version: ParsedVersion | None  # None: not readable
    reason: str  # why not readable ("" when readable)


def image_version(image: str) -> ImageVersion:
    """Read the TensorRT-LLM version from an image reference as pyxis takes it (``REGISTRY/PATH:TAG``,
    ``REGISTRY#PATH:TAG``, optionally ``@sha256:...``). Only a tag of an image in ``IMAGE_REPOSITORIES`` is
    read; a digest alone names no version."""
    ref = image.strip()
    if ref.startswith(("/", "./", "../", "~")) or ref.endswith((".sqsh", ".squashfs")):
        return ImageVersion(image, None, "it is an image file, whose name need not say which TensorRT-LLM it holds")
    name, _, digest = ref.partition("@")
    name = name.replace("#", "/")  # enroot/pyxis spell the registry separator '#'
    last = name.rsplit("/", 1)[-1]
    repo, tag = (name.rsplit(":", 1) if ":" in last else (name, ""))
    if not any(repo == r or repo.endswith("/" + r) for r in IMAGE_REPOSITORIES):
        return ImageVersion(image, None, "it is not one of NVIDIA's TensorRT-LLM images "
                                         f"({', '.join(IMAGE_REPOSITORIES)}), whose tag is the version")
    if not tag:
        return ImageVersion(image, None, "it is pinned by digest only; a digest does not name a version"
                            if digest else "it has no tag (pyxis pulls :latest, which moves)")
    m = _IMAGE_TAG.fullmatch(tag)
    parsed = parse_version(m["version"]) if m else None
    if parsed is None:
        return ImageVersion(image, None, f"its tag {tag!r} is not a TensorRT-LLM version such as 1.2.0 or 1.2.0rc3")
    return ImageVersion(image, parsed, "")


# MTP KV layers. TensorRT-LLM sizes the KV cache for the model's layers plus get_num_spec_layers(spec_config)
# (tensorrt_llm/_torch/speculative/utils.py), appended on the last pipeline rank (get_pp_layers in
# _torch/pyexecutor/resource_manager.py; for MLA models the KV cache manager's num_layers += the same count in
# older _torch/pyexecutor/_util.py), so the context servers send, and the generation servers receive, those
# layers too. tk renders `decoding_type: MTP` without use_mtp_vanilla; with DeepSeek-V3/R1 checkpoints (one MTP
# module in config.json) that is MTP-Eagle. Per line:
#   1.0: mid-2025 main (before release/1.0 branched): SpeculativeDecodingMode.is_mtp() covers MTP and MTP_EAGLE
#        (_torch/speculative/interface.py) and get_num_spec_layers returns num_nextn_predict_layers for is_mtp().
#   1.1, 1.2: from PR #7001 (merged 2025-08, "Enable two-model spec dec for MTP Eagle") MTPDecodingConfig has
#        mtp_eagle_one_model = True, so the mode is MTP_EAGLE_ONE_MODEL (LATE25_LLM_ARGS); get_num_spec_layers
#        returns num_nextn_predict_layers for is_mtp_one_model() = MTP or MTP_EAGLE_ONE_MODEL
#        (speculative/utils.py@3e906a0ed7c66ed4df90aa4856bf1a6c98ca7df6, interface.py of the same era).
#   1.3: 2026 main returns 1 for MTP-Eagle one-model
#        (speculative/utils.py@011d0933dcb5e592f5fa2626beaf42a96324c578): the 1.3 line's table says "one".
def mtp_kv_layers(version: TrtllmVersion, mtp_layers: int) -> int:
    """KV layers TensorRT-LLM allocates beyond the model's own for ``mtp_layers`` MTP draft tokens."""
    if not mtp_layers:
        return 0
    if version.mtp_kv_layers == "per_mtp_layer":
        return mtp_layers
    if version.mtp_kv_layers == "one":
        return 1
    raise AssertionError(version.mtp_kv_layers)


def serve_flag_table(version: TrtllmVersion) -> dict[str, bool]:
    """Every `trtllm-serve MODEL` flag the line accepts -> whether it takes a value."""
    flags = {f: f not in SERVE_SWITCHES for f in version.serve_flags}
    flags.update(SERVE_FLAGS_MORE)
    if version.line == "1.0":
        flags.pop("--config")  # older releases only know --extra_llm_api_options
    if MEMBERSHIP_FLAG["uri"] in version.serve_flags:
        flags[MEMBERSHIP_FLAG["uri"]] = True
    return flags


def get(line: str) -> TrtllmVersion:
    """The table entry for a release line ("1.2"), a release or patch release ("1.2.0", "1.2.1") or a
    pre-release ("1.2.0rc3")."""
    parsed = parse_version(str(line))
    key = parsed.line if parsed else str(line)
    try:
        return _VERSIONS[key]
    except KeyError:
        raise UnsupportedVersion(
            f"TensorRT-LLM {line} is not supported; supported release lines: {', '.join(SUPPORTED)}"
        ) from None
