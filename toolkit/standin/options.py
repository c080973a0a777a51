"""The worker's command line and LLM-API options file, checked the way TensorRT-LLM checks them (tk CPU stand-in).

``tk-standin-serve MODEL [trtllm-serve flags] --extra_llm_api_options FILE``. What the target TensorRT-LLM line
accepts (option keys, cache_transceiver_config fields and backends, KV dtypes, CLI flags) comes from
``toolkit.facts.versions`` (``TK_STANDIN_TRTLLM_VERSION``, default ``toolkit.facts.versions.latest()``). Every problem is
one line that names the file and the key, raised as ``ConfigError`` before anything heavy is imported or any port
is bound.

Merging: a key set in the options file wins over the same setting given as a CLI flag (TensorRT-LLM <= 1.2).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from toolkit.facts import llm_args, trtllm, versions
from toolkit.facts import transceiver as transceiver_facts
from toolkit.facts.engines import STANDIN
from toolkit.facts.models import KV_DTYPE_BYTES, ModelError, ModelSpec, resolve_model

VERSION_ENV = STANDIN.version_env  # which TensorRT-LLM line to imitate; the plan sets it in ctx.env / gen.env
DEFAULT_TRANSFER_BUFFER_BYTES = 512 << 20  # TRTLLM_KVCACHE_TRANSFER_BUFFER_SIZE's default
BUFFER_OVERRIDE_ENV = "TK_STANDIN_MAX_TOKENS_IN_BUFFER"  # fault knob: this server's buffer, as if its file said so
DEFAULT_TIMEOUT_MS = 60000  # the stand-in's own bound when kv_transfer_timeout_ms is unset or unknown

# The trtllm-serve flags the stand-in accepts: toolkit.facts.trtllm (the plan checks extra_serve_args the same way).
_ALIASES = trtllm.SERVE_FLAG_ALIASES
_INT_FLAGS = trtllm.SERVE_INT_FLAGS


class ConfigError(Exception):
    """A start-up problem: one line naming the file (or flag) and the key. Exit code 2."""

    exit_code = 2


def target_version() -> trtllm.TrtllmVersion:
    line = os.environ.get(VERSION_ENV) or versions.latest()
    try:
        return versions.get(line)
    except versions.UnsupportedVersion as exc:
        raise ConfigError(f"{VERSION_ENV}={line}: {exc}") from None


def serve_flags(version: trtllm.TrtllmVersion) -> dict[str, bool]:
    return trtllm.serve_flag_table(version)


def parse_serve_args(argv: list[str], version: trtllm.TrtllmVersion) -> tuple[str, dict]:
    """MODEL and {canonical flag: value}; unknown flags are refused like click does (exit 2)."""
    known = serve_flags(version)
    model = None
    values: dict = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-"):
            name, eq, inline = arg.partition("=")
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise ConfigError(f"tk-standin-serve: no such option: {name} (trtllm-serve serve does not take it "
                                  f"for TensorRT-LLM {version.line}){hint}")
            canon = _ALIASES.get(name, name)
            if not known[name]:
                if eq:
                    raise ConfigError(f"tk-standin-serve: option {name} does not take a value")
                values[canon] = True
                i += 1
                continue
            if eq:
                value = inline
                i += 1
            else:
                if i + 1 >= len(argv):
                    raise ConfigError(f"tk-standin-serve: option {name} requires an argument")
                value = argv[i + 1]
                i += 2
            if canon in _INT_FLAGS:
                try:
                    value = int(value)
                except ValueError:
                    raise ConfigError(f"tk-standin-serve: option {name}: {value!r} is not an integer") from None
            values[canon] = value
        else:
            if model is not None:
                raise ConfigError(f"tk-standin-serve: unexpected extra argument {arg!r} (MODEL is {model!r})")
            model = arg
            i += 1
    if model is None:
        raise ConfigError("tk-standin-serve: missing argument MODEL (a tk built-in model name or a directory "
                          "with a Hugging Face config.json)")
    backend = values.get("--backend", "pytorch")
    if backend != "pytorch":
        raise ConfigError(f"tk-standin-serve: --backend {backend}: the stand-in emulates the pytorch backend only")
    return model, values


# --- the options file -----------------------------------------------------------------------------------------

def _flag_int(value):
    """A command-line flag's value as an int where it is written as one (options-file values are typed already)."""
    return int(value) if isinstance(value, str) and value.isdigit() else value


def _pos_int(where: str, key: str, value, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{where}: {key}: {value!r} is not a positive integer")
    return value


def target_of(version: trtllm.TrtllmVersion) -> llm_args.Target:
    """The line, and the exact release where TK_STANDIN_TRTLLM_VERSION names one ("1.3.0rc23")."""
    text = os.environ.get(VERSION_ENV) or ""
    parsed = versions.parse_version(text)
    release = text if parsed is not None and text != parsed.line else None
    return llm_args.Target(version.line, release)


def _load_options_file(path: str | os.PathLike) -> dict:
    """The options file's YAML mapping ({} for an empty file)."""
    where = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the options file ({exc.strerror or exc})") from None
    try:
        opts = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if opts is None:
        opts = {}
    if not isinstance(opts, dict):
        raise ConfigError(f"{where}: expected a mapping of LLM-API options, got {type(opts).__name__}")
    return opts


def _check_option(where: str, target: llm_args.Target, opts: dict, dotted: str, key, value) -> bool:
    """One key of the options file against the target's facts; True where the keys below it are not looked up
    (a field that takes any keys)."""
    if not isinstance(key, str):
        raise ConfigError(f"{where}: option name {key!r} is not a string")
    st = llm_args.status(target, dotted)
    if st.verdict is llm_args.Verdict.ABSENT:
        close = llm_args.did_you_mean(dotted) if not llm_args.where(dotted) else None
        hint = f"; did you mean {close!r}?" if close else ""
        raise ConfigError(f"{where}: unknown key {dotted!r} in the LLM-API options of TensorRT-LLM {target} "
                          f"(TensorRT-LLM forbids extra keys and fails at start-up){hint}")
    if st.below_opaque:
        return True
    bad = llm_args.value_status(target, dotted, value)
    if bad is not None and bad.verdict is llm_args.Verdict.ABSENT:
        raise ConfigError(f"{where}: {dotted}: {value!r} is not accepted by TensorRT-LLM {target} "
                          f"({bad.fix})")
    if isinstance(value, dict) or value is None:
        return False
    parent = dotted.rpartition(".")[0]
    if parent and not isinstance(_dig(opts, parent), dict):
        raise ConfigError(f"{where}: {parent}: expected a mapping")
    return False


def _check_option_keys(where: str, opts: dict, version: trtllm.TrtllmVersion) -> None:
    """Every key of the options file, sections first, depth first."""
    target = target_of(version)
    stopped: list[str] = []
    for dotted, key, value in llm_args.walk_options(opts):
        if any(dotted.startswith(s + ".") for s in stopped):
            continue
        if dotted == trtllm.MEMBERSHIP_KEY and version.cluster_storages:
            # serve.py pops disagg_cluster before the LLM args see it (tensorrt_llm/commands/serve.py @ 00209af1)
            stopped.append(dotted)
            continue
        if _check_option(where, target, opts, dotted, key, value):
            stopped.append(dotted)


def _check_sections(where: str, opts: dict) -> None:
    """The sections the stand-in reads are mappings, and the backend is the one it emulates."""
    for section in ("kv_cache_config", "cache_transceiver_config", "cuda_graph_config", "moe_config",
                    "speculative_config"):
        if opts.get(section) is not None and not isinstance(opts[section], dict):
            raise ConfigError(f"{where}: {section}: expected a mapping, got {type(opts[section]).__name__}")
    if opts.get("backend") not in (None, "pytorch"):
        raise ConfigError(f"{where}: backend: {opts['backend']!r}; the stand-in emulates the pytorch backend only")


def read_options(path: str | os.PathLike, version: trtllm.TrtllmVersion) -> dict:
    """The options file, every key and fixed-choice value checked against the facts of the target release
    (toolkit.facts.llm_args): what TensorRT-LLM surely refuses (pydantic extra="forbid", a Literal it lacks) is
    refused; what it may accept is accepted, as the engine would."""
    opts = _load_options_file(path)
    _check_option_keys(str(path), opts, version)
    _check_sections(str(path), opts)
    return opts


def _dig(d: dict, dotted: str):
    for k in dotted.split("."):
        d = d.get(k) if isinstance(d, dict) else None
    return d


# --- the resolved worker settings -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Transceiver:
    backend: str
    max_tokens_in_buffer: int
    kv_transfer_timeout_ms: int
    runtime: str | None = None  # transceiver_runtime (1.3): CPP | PYTHON | auto; the stand-in moves KV the same way
    pipelined: bool = False  # enable_pipelined_transfer (1.3)
    # TensorRT-LLM's C++ transceiver over an agent connection (NIXL): a request larger than the pre-allocated buffer
    # fails ("Agent need all buffer pre-allocated", toolkit/facts/transceiver.py) where others fall back
    preallocated_buffer: bool = False
    # the transceiver this server runs (toolkit.facts.transceiver.resolve_runtime: CPP | PYTHON) and its bounce
    # region (kv_cache_bounce_size_mb, Python transceiver): what the emulated KV transfer time follows
    resolved_runtime: str = "CPP"
    bounce_size_mb: int = 0


@dataclass(frozen=True)
class KvCacheSettings:
    """kv_cache_config as the block manager reads it (defaults: TensorRT-LLM's, toolkit.facts.kvreuse)."""

    enable_block_reuse: bool
    enable_partial_reuse: bool
    event_buffer_max_size: int
    free_gpu_memory_fraction: float
    max_tokens: int | None
    policy: str  # block_reuse_config.policy (1.3); all_reusable before
    max_num_turns: int
    manager_v2: bool  # use_kv_cache_manager_v2 true: generated tokens' blocks are not reusable (PR #18711 closed)


@dataclass(frozen=True)
class WorkerSettings:
    model_arg: str
    model: ModelSpec
    host: str
    port: int
    version: trtllm.TrtllmVersion
    options_file: str | None
    options: dict
    max_batch_size: int
    max_num_tokens: int
    max_seq_len: int
    max_input_len: int | None
    enable_chunked_prefill: bool
    tokens_per_block: int
    kv_dtype: str
    print_iter_log: bool
    transceiver: Transceiver | None  # None: aggregated mode ("cache_transceiver is disabled")
    tp: int
    pp: int
    ep: int | None = None  # moe_expert_parallel_size / --ep_size (the emulated MoE model's layout); None: not given
    attention_dp: bool = False  # enable_attention_dp
    emulate: object | None = None  # toolkit.standin.emulate.Emulation: emulated timing of MODEL on GPU
    cluster: object | None = None  # toolkit.standin.cluster.ClusterConfig: register into the proxy's membership
    server_role: str | None = None  # "context" | "generation" (--server_role)
    kv_cache: KvCacheSettings | None = None  # None: TensorRT-LLM's defaults

    @property
    def kv(self) -> KvCacheSettings:
        return self.kv_cache or _kv_cache_settings("defaults", {})

    @property
    def disaggregated(self) -> bool:
        return self.transceiver is not None


def worker_settings(argv: list[str]) -> WorkerSettings:
    version = target_version()
    model_arg, flags = parse_serve_args(argv, version)
    try:
        model = resolve_model(model_arg)
    except ModelError as exc:
        raise ConfigError(f"tk-standin-serve: MODEL: {exc}") from None
    options_file = flags.get("--extra_llm_api_options")
    opts = read_options(options_file, version) if options_file else {}
    where = options_file or "command line"

    def pick(key: str, flag: str, default):
        if key in opts and opts[key] is not None:
            return opts[key]
        return flags.get(flag, default)

    max_batch_size = _pos_int(where, "max_batch_size", pick("max_batch_size", "--max_batch_size", 2048), False)
    max_num_tokens = _pos_int(where, "max_num_tokens", pick("max_num_tokens", "--max_num_tokens", 8192), False)
    max_seq_len = _pos_int(where, "max_seq_len",
                           pick("max_seq_len", "--max_seq_len", model.max_position_embeddings or 8192), False)
    max_input_len = _pos_int(where, "max_input_len", opts.get("max_input_len"))
    chunked = pick("enable_chunked_prefill", "--enable_chunked_prefill", False)
    if not isinstance(chunked, bool):
        raise ConfigError(f"{where}: enable_chunked_prefill: {chunked!r} is not a boolean")
    kvc = opts.get("kv_cache_config") or {}
    tpb = _pos_int(where, "kv_cache_config.tokens_per_block", kvc.get("tokens_per_block", 32), False)
    kv_dtype = kvc.get("dtype", "auto")
    if kv_dtype not in version.kv_dtypes or kv_dtype not in KV_DTYPE_BYTES:
        raise ConfigError(f"{where}: kv_cache_config.dtype: {kv_dtype!r} is not accepted by TensorRT-LLM "
                          f"{version.line} (use one of {', '.join(version.kv_dtypes)})")
    transceiver = _transceiver(where, opts.get("cache_transceiver_config"), version, tpb,
                               model, kv_dtype, max_seq_len)
    if transceiver is not None and transceiver.pipelined:
        # tensorrt_llm/_torch/pyexecutor/kv_cache_transceiver.py, create_kv_cache_transceiver
        if not chunked:
            raise ConfigError(f"{where}: enable_chunked_prefill is required when enable_pipelined_transfer is set.")
        if os.environ.get("TRTLLM_DISAGG_ROLE") != "generation" and int(pick("pipeline_parallel_size",
                                                                              "--pp_size", 1)) != 1:
            raise ConfigError(f"{where}: pipeline_parallel_size=1 is required when enable_pipelined_transfer is set.")
    from toolkit.standin.emulate import EmulationError, from_env
    try:
        emulate = from_env()
    except EmulationError as exc:
        raise ConfigError(f"tk-standin-serve: {exc}") from None
    cluster, role = _membership(flags, opts)
    kv_cache = _kv_cache_settings(where, kvc)
    return WorkerSettings(
        kv_cache=kv_cache,
        cluster=cluster, server_role=role, model_arg=model_arg, model=model, host=str(flags.get("--host", "localhost")),
        port=int(flags.get("--port", 8000)), version=version, options_file=options_file, options=opts,
        max_batch_size=max_batch_size, max_num_tokens=max_num_tokens, max_seq_len=max_seq_len,
        max_input_len=max_input_len, enable_chunked_prefill=chunked, tokens_per_block=tpb, kv_dtype=kv_dtype,
        print_iter_log=bool(opts.get("print_iter_log", False)), transceiver=transceiver,
        tp=int(pick("tensor_parallel_size", "--tp_size", 1)), pp=int(pick("pipeline_parallel_size", "--pp_size", 1)),
        ep=_pos_int(where, "moe_expert_parallel_size", _flag_int(pick("moe_expert_parallel_size", "--ep_size", None))),
        attention_dp=opts.get("enable_attention_dp") is True, emulate=emulate)


def _kv_cache_settings(where: str, kvc: dict) -> KvCacheSettings:
    """The reuse-related kv_cache_config keys, type-checked as TensorRT-LLM's pydantic model does (a wrong type or
    value fails start-up there too); keys the line does not know were refused by read_options already."""
    from toolkit.facts import kvreuse as F

    def boolean(key, default):
        v = kvc.get(key, default)
        if not isinstance(v, bool):
            raise ConfigError(f"{where}: kv_cache_config.{key}: {v!r} is not a boolean")
        return v
    frac = kvc.get("free_gpu_memory_fraction", F.FREE_GPU_MEMORY_FRACTION_DEFAULT)
    if frac is None:
        frac = F.FREE_GPU_MEMORY_FRACTION_DEFAULT
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac <= 1:
        raise ConfigError(f"{where}: kv_cache_config.free_gpu_memory_fraction: {frac!r} is not a number from 0 to 1")
    events = kvc.get("event_buffer_max_size", F.EVENT_BUFFER_MAX_SIZE_DEFAULT)
    if isinstance(events, bool) or not isinstance(events, int) or events < 0:
        raise ConfigError(f"{where}: kv_cache_config.event_buffer_max_size: {events!r} is not a non-negative integer")
    max_tokens = _pos_int(where, "kv_cache_config.max_tokens", kvc.get("max_tokens"))
    brc = kvc.get("block_reuse_config") or {}
    if not isinstance(brc, dict):
        raise ConfigError(f"{where}: kv_cache_config.block_reuse_config: expected a mapping (policy, max_num_turns)")
    unknown = set(brc) - {"policy", "max_num_turns", "swa_endpoint_rewind_tokens"}
    if unknown:
        raise ConfigError(f"{where}: unknown key 'kv_cache_config.block_reuse_config.{sorted(unknown)[0]}' "
                          f"(BlockReuseConfig forbids extra keys: policy, max_num_turns)")
    policy = brc.get("policy", F.BLOCK_REUSE_POLICY_DEFAULT)
    if policy not in F.BLOCK_REUSE_POLICIES:
        raise ConfigError(f"{where}: kv_cache_config.block_reuse_config.policy: {policy!r} is not one of "
                          f"{', '.join(F.BLOCK_REUSE_POLICIES)}")
    turns = _pos_int(where, "kv_cache_config.block_reuse_config.max_num_turns",
                     brc.get("max_num_turns", F.MAX_NUM_TURNS_DEFAULT), False)
    v2 = kvc.get("use_kv_cache_manager_v2", "auto")
    if v2 not in (True, False, "auto"):
        raise ConfigError(f"{where}: kv_cache_config.use_kv_cache_manager_v2: {v2!r} is not true, false or 'auto'")
    return KvCacheSettings(enable_block_reuse=boolean("enable_block_reuse", F.ENABLE_BLOCK_REUSE_DEFAULT),
                           enable_partial_reuse=boolean("enable_partial_reuse", F.ENABLE_PARTIAL_REUSE_DEFAULT),
                           event_buffer_max_size=events, free_gpu_memory_fraction=float(frac), max_tokens=max_tokens,
                           policy=policy, max_num_turns=turns, manager_v2=v2 is True)


def _membership(flags: dict, opts: dict):
    """serve.py: `disagg_cluster` from the options file (popped from the LLM args), --disagg_cluster_uri overriding its
    cluster_uri; --server_role required with either, ServerRole[role.upper()]."""
    from toolkit.standin.cluster import ClusterConfig, ClusterConfigError, parse_cluster_config
    uri = flags.get(trtllm.MEMBERSHIP_FLAG["uri"])
    in_file = opts.pop(trtllm.MEMBERSHIP_KEY, None)
    try:
        cluster = parse_cluster_config(in_file, uri) if in_file else (ClusterConfig(cluster_uri=uri) if uri else None)
        if cluster is not None and uri:
            parse_cluster_config({"cluster_uri": uri})  # the URI scheme check
    except ClusterConfigError as exc:
        raise ConfigError(f"tk-standin-serve: {exc}") from None
    role = flags.get(trtllm.MEMBERSHIP_FLAG["role"])
    if cluster is None:
        return None, role
    if role is None:
        raise ConfigError("tk-standin-serve: server_role is required when metadata_server_cfg or "
                          "disagg_cluster_config is provided (--server_role context|generation)")
    if role.upper() not in ("CONTEXT", "GENERATION"):
        raise ConfigError(f"tk-standin-serve: --server_role {role}: Invalid server role; the stand-in serves "
                          f"CONTEXT or GENERATION")
    return cluster, role.lower()


def _transceiver(where, ct, version, tpb, model, kv_dtype, max_seq_len) -> Transceiver | None:
    if ct is None or ct.get("backend") is None:
        return None  # TensorRT-LLM: backend None disables the transceiver
    backend = ct["backend"]
    if backend not in version.cache_transceiver_backends:
        raise ConfigError(f"{where}: cache_transceiver_config.backend: {backend!r} is not accepted by TensorRT-LLM "
                          f"{version.line} (one of {', '.join(version.cache_transceiver_backends)})")
    if backend not in STANDIN.kv_backends:
        raise ConfigError(f"{where}: cache_transceiver_config.backend: the stand-in moves KV with NIXL and cannot "
                          f"emulate {backend}; use NIXL, UCX or DEFAULT")
    mtib = _pos_int(where, "cache_transceiver_config.max_tokens_in_buffer", ct.get("max_tokens_in_buffer"))
    if os.environ.get(BUFFER_OVERRIDE_ENV):
        try:
            mtib = _pos_int(BUFFER_OVERRIDE_ENV, "value", int(os.environ[BUFFER_OVERRIDE_ENV]))
        except ValueError:
            raise ConfigError(f"{BUFFER_OVERRIDE_ENV}: {os.environ[BUFFER_OVERRIDE_ENV]!r} is not an integer") from None
    if mtib is not None and mtib % tpb:
        raise ConfigError(f"{where}: cache_transceiver_config.max_tokens_in_buffer: {mtib} is not a multiple of "
                          f"kv_cache_config.tokens_per_block={tpb} (TensorRT-LLM: Assertion failed: "
                          f"maxNumTokens.value() % tokensPerBlock == 0, cacheTransBuffer.cpp)")
    if mtib is None:  # TensorRT-LLM sizes the buffer from TRTLLM_KVCACHE_TRANSFER_BUFFER_SIZE (512MB)
        from toolkit.standin.model import geometry
        bpt = geometry(model, tpb, kv_dtype).bytes_per_token
        cap = -(-max_seq_len // tpb) * tpb
        mtib = max(tpb, min(cap, DEFAULT_TRANSFER_BUFFER_BYTES // bpt // tpb * tpb))
    timeout = _pos_int(where, "cache_transceiver_config.kv_transfer_timeout_ms", ct.get("kv_transfer_timeout_ms"))
    # resolve_cache_transceiver_config (tensorrt_llm/_torch/pyexecutor/kv_cache_transceiver.py): DEFAULT is the
    # legacy TRTLLM_USE_*_KVCACHE selector set to 1, else the line's default (the plan's resolve_backend); the Python
    # transceiver takes NIXL only.
    resolved = transceiver_facts.resolve_backend(backend, dict(os.environ), version.line, trtllm.BACKEND_SELECTORS)
    runtime = ct.get("transceiver_runtime")
    pipelined = bool(ct.get("enable_pipelined_transfer"))
    bounce = ct.get("kv_cache_bounce_size_mb") or 0
    if pipelined and runtime == "CPP":
        raise ConfigError(f"{where}: enable_pipelined_transfer is set but transceiver_runtime='CPP' explicitly "
                          "disables Python auto-selection. Use transceiver_runtime='PYTHON' to enable pipelined "
                          "transfer.")
    if pipelined and runtime in (None, "auto") and resolved != "NIXL":
        raise ConfigError(f"{where}: enable_pipelined_transfer is set but backend '{resolved}' requires the C++ "
                          "transceiver, which does not support pipelined transfer. Use NIXL backend to enable "
                          "pipelined transfer.")
    if pipelined and runtime in (None, "auto"):
        runtime = "PYTHON"
    if runtime == "PYTHON" and resolved != "NIXL":
        raise ConfigError(f"{where}: Python transceiver currently only supports NIXL backend, got {resolved}. "
                          "Please use transceiver_runtime='CPP' for MPI, UCX, or MOONCAKE backends.")
    if pipelined and bounce > 0:
        raise ConfigError(f"{where}: kv_cache_bounce_size_mb must be 0 when enable_pipelined_transfer is set.")
    # The transceiver TensorRT-LLM would run: the options file's setting (PYTHON where pipelined transfer selected
    # it), else the release's default, resolved as the generated data says (toolkit/facts/transceiver.py)
    given = "transceiver_runtime" in ct or pipelined
    resolved_runtime = transceiver_facts.choose_runtime(
        target_of(version), given, runtime if given else None, resolved,
        "kv_transfer_timeout_ms" in ct and ct["kv_transfer_timeout_ms"] is None).runtime
    return Transceiver(backend=backend, max_tokens_in_buffer=mtib,
                       kv_transfer_timeout_ms=timeout or DEFAULT_TIMEOUT_MS, runtime=runtime, pipelined=pipelined,
                       preallocated_buffer=transceiver_facts.agent_needs_preallocated_buffer(resolved_runtime,
                                                                                           resolved),
                       resolved_runtime=resolved_runtime.value,
                       bounce_size_mb=bounce if isinstance(bounce, int) and not isinstance(bounce, bool) else 0)
