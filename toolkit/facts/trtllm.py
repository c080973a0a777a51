"""Every TensorRT-LLM name tk writes (commands, CLI flags, the options-file flag, environment selectors, option keys
tk owns, membership), and the facts about them no TensorRT-LLM file lists in machine-readable form.

What a release line accepts is data: facts.versions (the line's row and ``get(line)``), facts.llm_args (option keys
and values per release), facts.options (the kind of value each option takes). Adding a TensorRT-LLM field tk writes
is the data plus one template line (or one line of the option builder in ``toolkit/plan/options.py``).
docs/trtllm-versions.md has every source and what is unverified.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.states import Role, Word
from toolkit.facts import llm_args
from toolkit.facts.versions import TrtllmVersion, UnsupportedVersion, get  # noqa: F401 (defined there; used here)


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
# What TensorRT-LLM checks when a generation server connects to a context server:
# (what, path in the LLM-API options, the recipe field that sets it once for both roles).
CTX_GEN_MUST_AGREE = (
    ("KV dtype", ("kv_cache_config", "dtype"), "kv_transfer.dtype"),
    ("tokens_per_block", ("kv_cache_config", "tokens_per_block"), "kv_transfer.tokens_per_block"),
    ("speculative config", ("speculative_config",), "speculative"),
    ("cache transceiver backend", ("cache_transceiver_config", "backend"), "kv_transfer.backend"),
)


# Where each name below was read: a stored NVIDIA/TensorRT-LLM file at a commit (main, not a tag) or the pull request
# that changed it; docs/trtllm-versions.md lists them and what is unverified at the tags.

# Router types of `trtllm-serve disaggregated` (proxy.context_router / generation_router): every type any line's
# create_router knows, read from tensorrt_llm/serve/router.py into the data per line (scripts/trtllm_sources.yaml
# routers_from; "conversation" from PR #12526). Each line's own are TrtllmVersion.routers, which the plan checks the
# recipe's against. A member is its type in capitals (Router.KV_CACHE_AWARE is "kv_cache_aware"): a router a new
# line adds is regenerated data, not an edit here.
Router = Word("Router", [(t.upper(), t) for t in llm_args.all_routers()],  # type: ignore[call-overload]
              module=__name__, qualname="Router")
Router.__doc__ = "A router type of `trtllm-serve disaggregated` (proxy.context_router / generation_router)."

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
#   disagg_utils.py @ 3e53e4adfea6e24674eaec876c3009551cb25134: DisaggClusterConfig(cluster_uri, cluster_name="",
#     minimal_instances=MinimalInstances(1, 1), heartbeat_interval_sec=5, inactive_timeout_sec=10);
#     an unknown key raises KeyError("Key X not found in DisaggClusterConfig"); with disagg_cluster set,
#     extract_disagg_cfg builds no static server list: `urls` are neither read nor checked.
#   tensorrt_llm/serve/cluster_storage.py (PR #7869): http(s):// -> HttpClusterStorageServer hosted on the proxy's
#     own app (routes /set /get /delete /expire /get_prefix), etcd:// -> Etcd3ClusterStorage (gRPC client).
#   tensorrt_llm/serve/disagg_auto_scaling.py: key f"/trtllm-disagg/{cluster_name}/workers/{worker_id}".
#   tensorrt_llm/commands/serve.py: `trtllm-serve MODEL --disagg_cluster_uri URI --server_role ROLE`
#     (ServerRole[role.upper()]: context | generation).
# Which lines have it: the rows' cluster_storages (scripts/trtllm_sources.yaml).
# ---------------------------------------------------------------------------------------------------
MEMBERSHIP_KEY = "disagg_cluster"  # top-level key of the proxy config
MEMBERSHIP_FLAG = {"uri": "--disagg_cluster_uri", "role": "--server_role"}  # `trtllm-serve MODEL` flags
MEMBERSHIP_ROLES = {Role.CTX: "context", Role.GEN: "generation"}  # --server_role values (ServerRole[value.upper()])
MEMBERSHIP_STORAGES = ("http", "etcd")  # http: hosted by the proxy itself; etcd: an etcd v3 server
MEMBERSHIP_URI_SCHEMES = {"http": "http", "etcd": "etcd"}  # cluster_uri scheme per storage
# DisaggClusterConfig defaults (disagg_utils.py @ 3e53e4ad): the recipe's defaults.
MEMBERSHIP_DEFAULTS = {"heartbeat_interval_sec": 5, "inactive_timeout_sec": 10, "minimal_instances": 1}
MEMBERSHIP_KEY_PREFIX = "/trtllm-disagg/{cluster_name}/workers"  # get_worker_key_prefix()
# DisaggClusterWorker.register_worker(retry_interval=5): a failed put-if-absent is retried this often, and a failed
# heartbeat (expire) registers again (disagg_auto_scaling.py @ 00184339)
MEMBERSHIP_REGISTER_RETRY_S = 5
ETCD_CLIENT_PORT = 2379  # etcd's own default client port (the port of NVIDIA's examples' etcd:// URIs)

# Internal ports of `trtllm-llmapi-launch` (several instances on one node). The launcher exports the address of its
# spawn-proxy IPC channel as TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR, searching from port 10012 for one a bind-and-close
# probe finds free, and binds it only later on rank 0: instances started together on one node collide
# (tensorrt_llm/llmapi/trtllm-llmapi-launch @ 020c89e64e49f24102f1b62be96a1a68283cdf7a). Where the line's row names
# TLLM_SPAWN_PROXY_PROCESS_IPC_PORT (PR #8922) tk gives each instance its own port; elsewhere it starts co-located
# instances one after another: the next once the previous launcher's IPC port answers, or after LAUNCHER_STAGGER_S.
LAUNCHER_IPC_PORT_ENV = "TLLM_SPAWN_PROXY_PROCESS_IPC_PORT"
LAUNCHER_IPC_ADDR_ENV = "TLLM_SPAWN_PROXY_PROCESS_IPC_ADDR"  # what the launcher logs, with the port it chose
LAUNCHER_IPC_HOST = "127.0.0.1"  # the launcher's IPC address is always on loopback
LAUNCHER_FIRST_IPC_PORT = 10012  # where the launcher's own search starts (1.0/1.1)
LAUNCHER_STAGGER_S = 120  # bound on waiting for one co-located launcher before starting the next
# ---------------------------------------------------------------------------------------------------
# TensorRT-LLM checks its own config before any server starts. What `trtllm-serve` itself does with the
# options file (tensorrt_llm/commands/serve.py, 1.0-1.2 era: `llm_args = update_llm_args_with_extra_dict(
# llm_args, yaml.safe_load(options_file))`, then `PyTorchLLM(**llm_args)` -> TorchLlmArgs) and with the proxy
# config (`trtllm-serve disaggregated -c` -> disagg_utils.parse_disagg_config_file). Located in:
#   update_llm_args_with_extra_dict: tensorrt_llm/llmapi/llm_args.py (mid-2025 onwards; the 1.0-1.2 lines),
#     tensorrt_llm/llmapi/llm_utils.py in early-2025 main (kept as a fallback);
#   TorchLlmArgs (pydantic, extra="forbid"): tensorrt_llm/llmapi/llm_args.py (mid-2025 and newer);
#   parse_disagg_config_file(path): tensorrt_llm/llmapi/disagg_utils.py (@ 3e53e4ad and @ 0228a712).
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


# Option keys tk writes whose acceptance by a line can be unverified (facts.llm_args.status is not KNOWN), with
# TensorRT-LLM's default from the data. Where a line's acceptance is unverified, tk omits the key when its value is the
# default (the engine then uses that same value), and keeps it with a plan warning when it differs.
UNVERIFIABLE_OPTIONS = ("kv_cache_config.tokens_per_block",)


@dataclass(frozen=True)
class OptionFact:
    path: tuple[str, ...]  # ("kv_cache_config", "tokens_per_block")
    default: object  # TensorRT-LLM's default when the key is absent
    source: str  # where the default comes from

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


def option_facts() -> tuple[OptionFact, ...]:
    out = []
    for dotted in UNVERIFIABLE_OPTIONS:
        default, evidence = llm_args.default(dotted)
        out.append(OptionFact(tuple(dotted.split(".")), default, evidence))
    return tuple(out)


def acceptance(version: TrtllmVersion, fact: OptionFact) -> llm_args.Verdict:
    return llm_args.status(llm_args.Target(version.line), fact.dotted).verdict


def unverified_options(version: TrtllmVersion) -> tuple[OptionFact, ...]:
    """The rows whose acceptance by this line is unverified."""
    return tuple(f for f in option_facts() if acceptance(version, f) is not llm_args.Verdict.KNOWN)


def serve_flags(version: TrtllmVersion) -> frozenset[str]:
    """`trtllm-serve MODEL` flags tk may pass on the line."""
    membership = {MEMBERSHIP_FLAG["uri"], MEMBERSHIP_FLAG["role"]} if version.cluster_storages else set()
    return frozenset(_SERVE_FLAGS | membership)


def disaggregated_flags(version: TrtllmVersion) -> frozenset[str]:
    """`trtllm-serve disaggregated` flags tk may pass on the line."""
    return frozenset(_DISAGG_FLAGS_BASE | ({"-m"} if version.proxy_metadata_flag else set()))


def serve_flag_table(version: TrtllmVersion) -> dict[str, bool]:
    """Every `trtllm-serve MODEL` flag the line accepts -> whether it takes a value."""
    flags = {f: f not in SERVE_SWITCHES for f in serve_flags(version)}
    flags.update(SERVE_FLAGS_MORE)
    if not version.serve_config_flag:
        flags.pop("--config")  # the line knows only --extra_llm_api_options
    if MEMBERSHIP_FLAG["uri"] in flags:
        flags[MEMBERSHIP_FLAG["uri"]] = True
    return flags
