"""The recipe format, schema_version 1.

A recipe says what to deploy; everything tk can derive (buffer sizes, node counts, ports,
environment) it derives in the plan stage. ``None`` on a field means "let tk derive it".
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Annotated, Any, Callable, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from orchestrator.states import RestartPolicy
from toolkit.facts import llm_args, trtllm, versions
from toolkit.facts.hardware import EMULATED_GPUS, GPUS, TRANSPORTS, Transport
from toolkit.facts.models import KV_DTYPES
from toolkit.facts.roofline import PRECISIONS
from toolkit.facts.trtllm import Router


def _either(values: tuple[str, ...]) -> str:
    """'A', 'B' or 'C', as pydantic words a Literal's choices."""
    quoted = [repr(v) for v in values]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def facts_choice(choices: Callable[[], tuple[str, ...]]) -> AfterValidator:
    """A recipe field that names a TensorRT-LLM value (a cache transceiver backend or runtime, a router type): one
    that some release in the facts has, read from the data when the recipe is read, not fixed when tk is imported,
    so a release that adds one is regenerated data only. The plan's rules check the recipe's own release
    (rules.check_version_features, check_transceiver, check_proxy)."""
    def check(value: str) -> str:
        allowed = choices()
        if value not in allowed:
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": _either(allowed)})
        return value

    return AfterValidator(check)


Backend = Annotated[str, facts_choice(lambda: llm_args.all_choices("cache_transceiver_config.backend"))]
Runtime = Annotated[str, facts_choice(lambda: llm_args.all_choices("cache_transceiver_config.transceiver_runtime"))]
RouterType = Annotated[str, facts_choice(llm_args.all_routers)]

# Every pattern is used with fullmatch (``$`` would accept a trailing newline) and spells digits [0-9]
# (``\d`` matches Arabic-Indic and other Unicode digits, which Slurm and bash do not read).
# Names end up in file names, Slurm job names and log paths: keep them boring.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", re.ASCII)
# Environment variable names tk lets a recipe set: POSIX names (IEEE Std 1003.1, "Environment Variables": letters,
# digits and underscore, not starting with a digit), any case: Open MPI's OMPI_MCA_coll_ucc_enable is one.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}", re.ASCII)
TIME_LIMIT = re.compile(r"([0-9]{1,3}-)?[0-9]{1,3}:[0-9]{2}(:[0-9]{2})?|[0-9]{1,7}", re.ASCII)
SLURM_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}", re.ASCII)
HOST_PORT = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}:[0-9]{1,5}", re.ASCII)
NET_DEVICES = re.compile(r"[A-Za-z0-9_.:,-]{1,512}", re.ASCII)
MPI_PLUGIN = re.compile(r"[a-z][a-z0-9_]{0,31}", re.ASCII)

# One extra sbatch/srun argument: the long form `--option` or `--option=value`, value in the characters an
# #SBATCH line carries safely (toolkit/render/escape.py `sbatch`). Short options and separate values are
# refused so every argument names its option (tk refuses those it sets itself: toolkit/plan/rules.py).
SLURM_ARG = re.compile(r"--[a-z][a-z0-9-]{0,63}(=[A-Za-z0-9._:/@%+=,\-]{1,1024})?", re.ASCII)

# Bounds for free text: a path, an image name or an argument is never longer than this.
MAX_TEXT = 4096
MAX_ITEMS = 256  # list entries (mounts, serve args) and env variables per mapping
# Largest values TensorRT-LLM reads into C++ ints: int32 for timeouts and token counts.
INT32_MAX = (1 << 31) - 1
WEEK_S = 7 * 86400


def check_text(v: str) -> str:
    """Free text that reaches a rendered file: no control characters (newline, NUL, ESC, tab...), no line or
    paragraph separators. bash quoting would survive them, but env files read by other tools, YAML comments,
    Slurm, pyxis and the terminal do not."""
    for ch in v:
        if unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp"):
            raise ValueError(f"contains the control character {ch!r}; write it on one line, without control "
                             "characters")
    return v


Text = Annotated[str, Field(max_length=MAX_TEXT), AfterValidator(check_text)]


def check_path(v: str) -> str:
    """A model name or directory: tk looks it up on disk, and no file system has a name over 255 bytes."""
    for part in v.split("/"):
        if len(part.encode("utf-8", "surrogatepass")) > 255:
            raise ValueError(f"has a path component of {len(part)} characters; a file name has at most 255 bytes")
    return v


PathText = Annotated[Text, AfterValidator(check_path)]


def _strict_one(v: Any) -> Any:
    if type(v) is not int or v != 1:  # `schema_version: true` is not 1
        raise ValueError("schema_version must be the number 1")
    return v


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True, allow_inf_nan=False)


def _cut(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _check_env(env) -> dict[str, str]:
    """Environment values are strings; numbers written unquoted in YAML (`X: 1`) are taken as written.

    Raises only ValueError (pydantic turns it into a violation; a TypeError would be a traceback)."""
    if not isinstance(env, dict):
        raise ValueError("must be a mapping of NAME: value")
    if len(env) > MAX_ITEMS:
        raise ValueError(f"{len(env)} variables; at most {MAX_ITEMS} may be set here")
    out = {}
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise ValueError(f"environment variable name {_cut(repr(name))} is not a POSIX name: letters, digits "
                             "and '_', not starting with a digit, at most 128 characters")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(f"value of {name} must be a string; quote it, e.g. {name}: \"1\"")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"value of {name} is {value!r}; quote it if you mean the text")
        value = str(value)
        if len(value) > MAX_TEXT:
            raise ValueError(f"value of {name} is {len(value)} characters long; at most {MAX_TEXT}")
        try:
            check_text(value)
        except ValueError as exc:
            raise ValueError(f"value of {name} {exc}") from None
        out[name] = value
    return out


_OPTION_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}", re.ASCII)


def _check_option_key(key, where: str) -> None:
    """A mapping key among the options: at the top (``where`` empty) an option name, an identifier; below it a
    name of 1-128 characters of text."""
    if not where and (not isinstance(key, str) or not _OPTION_KEY.fullmatch(key)):
        raise ValueError(f"option name {_cut(repr(key))} must be an identifier such as max_num_tokens")
    if not isinstance(key, str) or not key or len(key) > 128:
        raise ValueError(f"key {_cut(repr(key))} in {where} must be a name (text of 1-128 characters)")
    try:
        check_text(key)
    except ValueError as exc:
        raise ValueError(f"key {_cut(repr(key))} in {where} {exc}") from None


def _check_option_scalar(value, where: str) -> None:
    """A value among the options that is neither a mapping nor a list: a boolean, null, an integer that fits in 64
    bits, a finite float or a bounded line of text."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 63):
            raise ValueError(f"{where} = {_cut(str(value))} does not fit in 64 bits")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where} is {value!r}; give a finite number")
    elif isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise ValueError(f"{where} is {len(value)} characters long; at most {MAX_TEXT}")
        try:
            check_text(value)
        except ValueError as exc:
            raise ValueError(f"{where} {exc}") from None
    else:
        raise ValueError(f"{where} is a {type(value).__name__}; use a string, number, boolean, list or mapping")


def _check_option_value(value, where: str) -> None:
    """One value among the options and everything in it, depth first; ``where`` is its dotted path ("" at the
    top)."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_option_key(key, where)
            _check_option_value(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_option_value(item, f"{where}[{i}]")
    else:
        _check_option_scalar(value, where)


def _check_options(v: Any) -> dict:
    """TensorRT-LLM LLM-API options: a mapping of option names to plain YAML values (strings, finite numbers
    that fit in 64 bits, booleans, null, lists, mappings), rendered verbatim into ctx.yaml / gen.yaml."""
    if not isinstance(v, dict):
        raise ValueError("must be a mapping of option: value")
    _check_option_value(v, "")
    # The kind of each value tk or TensorRT-LLM reads (max_num_tokens a positive integer, ...) is checked by
    # the plan (toolkit/plan/rules.py, from each option's kind in the facts: facts.options), which names the key and the recipe
    # field to use instead.
    return v


def _check_list(v: Any, what: str) -> Any:
    if isinstance(v, list) and len(v) > MAX_ITEMS:
        raise ValueError(f"{len(v)} {what}; at most {MAX_ITEMS}")
    return v


def _text_pattern(pattern: re.Pattern, message: str):
    def check(v: Optional[str]) -> Optional[str]:
        if v is not None and not pattern.fullmatch(v):
            raise ValueError(message)
        return v

    return check


class ClusterSpec(Section):
    """Where the deployment runs."""

    gpus_per_node: int = Field(ge=1, le=72)
    gpu: Literal[GPUS] = "H100"  # type: ignore[valid-type]
    partition: Optional[str] = None
    account: Optional[str] = None
    time_limit: str = "02:00:00"
    container_image: Optional[Text] = None
    container_mounts: Annotated[list[Text], BeforeValidator(lambda v: _check_list(v, "mounts"))] = \
        Field(default_factory=list)
    worker_base_port: int = Field(8336, ge=1024, le=65000)
    share_nodes: bool = False  # generation servers may use GPUs left free on context nodes
    pending_timeout_s: int = Field(1800, ge=1, le=WEEK_S)
    startup_timeout_s: int = Field(1800, ge=1, le=86400)
    # How the job asks Slurm for GPUs: "gres" (#SBATCH --gres=gpu:N), "gpus-per-node" (--gpus-per-node=N),
    # "none" (no request: clusters that do not confine devices). N = gpus_per_node. Unset (null): the engine's,
    # "gres" for TensorRT-LLM, "none" for the CPU stand-in (toolkit/facts/engines.py uses_gpus).
    gpu_request: Optional[Literal["gres", "gpus-per-node", "none"]] = None
    exclusive: bool = False  # #SBATCH --exclusive
    sbatch_args: Annotated[list[str], BeforeValidator(lambda v: _check_list(v, "arguments"))] = \
        Field(default_factory=list)  # extra #SBATCH lines, e.g. --constraint=h100, --exclude=node1
    srun_args: Annotated[list[str], BeforeValidator(lambda v: _check_list(v, "arguments"))] = \
        Field(default_factory=list)  # extra arguments of every server step, e.g. --container-writable
    # First internal port (per instance, where the TensorRT-LLM line has a knob for it); None: worker_base_port
    # + 1000.
    internal_base_port: Optional[int] = Field(None, ge=1024, le=65000)
    # Slurm's MPI plugin for the ranks of each server step (`srun --mpi=TYPE`; `srun --mpi=list` shows what a
    # cluster has): None is the engine's default (pmix for TensorRT-LLM), "none" passes --mpi=none.
    mpi: Optional[str] = None

    _time_limit = field_validator("time_limit")(classmethod(lambda cls, v: _text_pattern(
        TIME_LIMIT, "time_limit must be Slurm's [D-]HH:MM[:SS] or minutes, e.g. 02:00:00 (ASCII digits)")(v)))
    _slurm_name = field_validator("partition", "account")(classmethod(lambda cls, v: _text_pattern(
        SLURM_NAME, "must be 1-128 letters, digits, '_', '.' and '-'")(v)))
    _mpi = field_validator("mpi")(classmethod(lambda cls, v: _text_pattern(
        MPI_PLUGIN, "mpi must be a Slurm MPI plugin type such as pmix, pmix_v4, pmi2 or none (`srun --mpi=list`)")(v)))

    @field_validator("sbatch_args", "srun_args")
    @classmethod
    def _slurm_args(cls, v: list[str]) -> list[str]:
        for arg in v:
            if not isinstance(arg, str) or not SLURM_ARG.fullmatch(arg):
                raise ValueError(f"argument {_cut(repr(arg))} must be one long option, --name or --name=value "
                                 "(value: letters, digits and ._:/@%+=,- only; no spaces, no short options)")
        return v

    @field_validator("container_mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for m in v:
            parts = m.split(":")
            if len(parts) not in (2, 3) or not all(parts[:2]) or "," in m:
                raise ValueError(f"container mount {m!r} must be SRC:DST[:FLAGS] with no commas")
        return v


# One word of a launcher prefix: no shell (the words are passed as argv), no control characters.
LAUNCHER_WORD = re.compile(r"[A-Za-z0-9_./:,=+@%-]{1,256}", re.ASCII)


def _check_launcher(v: Any) -> Any:
    v = _check_list(v, "words")
    if isinstance(v, list):
        for word in v:
            if not isinstance(word, str) or not LAUNCHER_WORD.fullmatch(word):
                raise ValueError(f"launcher word {_cut(repr(word))} must be letters, digits and _./:,=+@%- only "
                                 "(each word is one argument; no spaces, no shell)")
    return v


class RoleSpec(Section):
    """One server role (context or generation): how many instances, how each is parallelised."""

    instances: int = Field(1, ge=1, le=512)
    tp: int = Field(1, ge=1, le=256)
    pp: int = Field(1, ge=1, le=64)
    ep: Optional[int] = Field(None, ge=1, le=1024)
    attention_dp: bool = False
    max_batch_size: Optional[int] = Field(None, ge=1, le=65536)
    max_num_tokens: Optional[int] = Field(None, ge=1, le=1 << 20)
    # max_seq_len of this role's servers; None: tk derives it from traffic (input + prefix + output + MTP layers)
    max_seq_len: Optional[int] = Field(None, ge=1, le=1 << 22)
    # cache_transceiver_config.max_tokens_in_buffer of this role's servers; None: kv_transfer.max_tokens_in_buffer
    max_tokens_in_buffer: Optional[int] = Field(None, ge=1, le=INT32_MAX)
    free_gpu_memory_fraction: Optional[float] = Field(None, gt=0.0, le=1.0)
    cuda_graph: Optional[bool] = None
    # Words put before each server's command on its nodes, e.g. [numactl, -m, "0,1"] on Grace nodes (NVIDIA's
    # srt-slurm does so for GB200/GB300); empty: none.
    launcher_prefix: Annotated[list[str], BeforeValidator(_check_launcher)] = Field(default_factory=list)
    model_path: Optional[PathText] = None
    quantization: Optional[Text] = None
    extra_options: Annotated[dict, BeforeValidator(_check_options)] = Field(default_factory=dict)
    extra_serve_args: Annotated[list[Text], BeforeValidator(lambda v: _check_list(v, "arguments"))] = \
        Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    _env = field_validator("env", mode="before")(classmethod(lambda cls, v: _check_env(v)))


class AggregatedSpec(Section):
    """The aggregated baseline (`tk launch --aggregated`): plain `trtllm-serve MODEL` instances on the GPUs the
    disaggregated deployment uses (context + generation). tp null: the generation role's tp; instances =
    total GPUs / (tp * pp). max_batch_size null: the generation role's; max_num_tokens null: the larger of the
    two roles' (so the longest request, which the context role admits, fits in one forward pass)."""

    tp: Optional[int] = Field(None, ge=1, le=256)
    pp: int = Field(1, ge=1, le=64)
    max_batch_size: Optional[int] = Field(None, ge=1, le=65536)
    max_num_tokens: Optional[int] = Field(None, ge=1, le=1 << 20)


class KvTransferSpec(Section):
    """How the KV cache moves from context to generation servers."""

    backend: Backend = "NIXL"
    transport: Literal[TRANSPORTS] = Transport.INFINIBAND.value  # type: ignore[valid-type]
    tokens_per_block: int = Field(32, ge=1, le=1024)
    dtype: Literal[KV_DTYPES] = "auto"  # type: ignore[valid-type]
    max_tokens_in_buffer: Optional[int] = Field(None, ge=1, le=INT32_MAX)
    kv_transfer_timeout_ms: Optional[int] = Field(60000, ge=1, le=INT32_MAX)  # a C++ int in TensorRT-LLM
    # cache_transceiver_config fields of the 1.3 line, written to both roles where set (None: not written, the
    # engine's default): transceiver_runtime, kv_transfer_poll_interval_ms, kv_cache_bounce_size_mb,
    # enable_pipelined_transfer (its preconditions: toolkit/plan/rules.py check_transceiver).
    runtime: Optional[Runtime] = None
    poll_interval_ms: Optional[int] = Field(None, ge=1, le=INT32_MAX)
    bounce_size_mb: Optional[int] = Field(None, ge=0, le=1 << 20)
    pipelined: Optional[bool] = None
    net_devices: Optional[str] = None
    env: dict[str, str] = Field(default_factory=dict)

    _env = field_validator("env", mode="before")(classmethod(lambda cls, v: _check_env(v)))
    _net_devices = field_validator("net_devices")(classmethod(lambda cls, v: _text_pattern(
        NET_DEVICES, "net_devices must look like mlx5_0:1,mlx5_1:1")(v)))


class TrafficSpec(Section):
    """The requests the deployment is sized for."""

    max_input_len: int = Field(4096, ge=1, le=1 << 21)
    max_output_len: int = Field(1024, ge=1, le=1 << 20)
    prefix_len: int = Field(0, ge=0, le=1 << 21)
    typical_input_len: Optional[int] = Field(None, ge=1, le=1 << 21)


class SpeculativeSpec(Section):
    """Speculative decoding; applied identically to both roles (TensorRT-LLM's generation servers must run the
    context servers' draft configuration). MTP: ``mtp_layers``. Another method (Eagle3, a draft model, NGram...):
    ``decoding_type`` with ``model`` (the draft or Eagle weights), ``max_draft_len`` and further
    ``speculative_config`` keys in ``options``, each checked against the target line's facts."""

    mtp_layers: int = Field(0, ge=0, le=8)
    decoding_type: Optional[Annotated[str, Field(max_length=64), AfterValidator(check_text)]] = None
    model: Optional[PathText] = None
    max_draft_len: Optional[int] = Field(None, ge=1, le=64)
    options: Annotated[dict, BeforeValidator(_check_options)] = Field(default_factory=dict)


class ProxySpec(Section):
    """The `trtllm-serve disaggregated` proxy."""

    port: int = Field(8000, ge=1024, le=65535)
    context_router: RouterType = Router.ROUND_ROBIN.value
    generation_router: RouterType = Router.ROUND_ROBIN.value
    # Further router arguments, written under the section's `router:` beside `type` (e.g. use_tokens: true of
    # load_balancing, max_batch_size of kv_cache_aware); TensorRT-LLM passes them to the router's constructor.
    context_router_args: Annotated[dict, BeforeValidator(_check_options)] = Field(default_factory=dict)
    generation_router_args: Annotated[dict, BeforeValidator(_check_options)] = Field(default_factory=dict)
    conditional_max_local_prefill_length: Optional[int] = Field(None, ge=0, le=1 << 21)
    # How long `trtllm-serve disaggregated -t` waits for the servers; None: cluster.startup_timeout_s, the time tk
    # itself gives them (a longer wait would outlive the job's own start-up bound). NVIDIA's disaggregated perf
    # harness uses 7200 s for DeepSeek-R1; raise cluster.startup_timeout_s for models that load that slowly.
    server_start_timeout_s: Optional[int] = Field(None, ge=1, le=WEEK_S)
    request_timeout_s: int = Field(7200, ge=1, le=WEEK_S)
    max_retries: int = Field(1, ge=0, le=16)
    # Size of the proxy's /perf_metrics buffer (0: off). tk bench drains it before a run and reads it after, as
    # TensorRT-LLM's proof that every request took the context and the generation leg; keep it above a run's
    # request count.
    perf_metrics_max_requests: int = Field(8192, ge=0, le=1_000_000)
    env: dict[str, str] = Field(default_factory=dict)  # the proxy's environment (e.g. TRTLLM_SERVER_DISABLE_GC)

    _env = field_validator("env", mode="before")(classmethod(lambda cls, v: _check_env(v)))


class SupervisionSpec(Section):
    """What the job does once the deployment serves, when a server or the proxy exits or stops answering /health.

    ``restart``: the component is restarted on its node, with bounded retries and exponential backoff, while the
    others keep serving; the run fails only when a role is left with fewer than its minimum. ``fail-fast``: the
    first exit ends the whole job (benchmarks and validation: a number measured on a half-dead deployment is
    worse than no number). Before the deployment first serves, any exit ends the job under either policy (a
    start-up crash is a configuration error, and restarting it only hides it)."""

    policy: Literal[tuple(p.value for p in RestartPolicy)] = RestartPolicy.RESTART.value  # type: ignore[misc]
    max_restarts: int = Field(5, ge=0, le=100)  # consecutive failed restarts of one component before it is given up
    backoff_initial_s: int = Field(2, ge=0, le=600)  # wait before the first restart; doubled each time
    backoff_max_s: int = Field(60, ge=1, le=3600)
    unhealthy_after_s: int = Field(20, ge=4, le=3600)  # /health failing this long: killed and restarted
    stable_after_s: int = Field(300, ge=10, le=WEEK_S)  # healthy this long: its consecutive failures reset to 0
    # Liveness is progress: a server whose probe generation (TensorRT-LLM's /health_generate, one token) has not
    # answered for this long is wedged (its /health may still be 200): killed and restarted like a dead one.
    # Keep it above the worst time to first token under load. 0: no progress probes.
    stall_after_s: int = Field(120, ge=0, le=3600)
    # Fewer live servers of a role than this ends the run. With membership it is also the proxy's
    # disagg_cluster.minimal_instances: below it TensorRT-LLM's proxy refuses every request ("Cluster is not ready").
    min_context: int = Field(1, ge=1, le=512)
    min_generation: int = Field(1, ge=1, le=512)


class MembershipSpec(Section):
    """Membership TensorRT-LLM keeps itself (`disagg_cluster`): workers register and heartbeat into cluster storage,
    the proxy adds registered workers and drops inactive ones. Off by default: static URLs, as every published
    config. Heartbeat defaults are TensorRT-LLM's (DisaggClusterConfig)."""

    # false: static urls (the default). true: required (an error on lines without it). "auto": on where the line
    # has it (1.2 on), off before.
    enabled: Union[bool, Literal["auto"]] = False
    # etcd: the job starts an etcd that only the run's certificate opens (docs/recipe.md, "Membership"); http: the
    # proxy hosts the storage on its client port, where any client can rewrite the routing (refused unless
    # accept_unauthenticated_storage)
    storage: Literal[trtllm.MEMBERSHIP_STORAGES] = "etcd"  # type: ignore[valid-type]
    heartbeat_interval_s: int = Field(trtllm.MEMBERSHIP_DEFAULTS["heartbeat_interval_sec"], ge=1, le=3600)
    inactive_timeout_s: int = Field(trtllm.MEMBERSHIP_DEFAULTS["inactive_timeout_sec"], ge=2, le=86400)
    # The namespace of the worker keys starts with this (the recipe's name when empty); tk launch adds a part unique
    # to the run, so deployments that share an etcd never see each other's workers.
    cluster_name: str = ""
    # storage etcd: an etcd tk does not start, host:port; None: the job starts one on the proxy's node.
    etcd_endpoint: Optional[str] = None
    # that etcd's client certificate: a directory with ca.crt, client.crt and client.key (tk's gateway presents it
    # for TensorRT-LLM, whose etcd client cannot); None: none (then only with accept_unauthenticated_storage)
    etcd_tls_dir: Optional[PathText] = None
    etcd_port: int = Field(trtllm.ETCD_CLIENT_PORT, ge=1024, le=65000)  # the etcd the job starts (client port)
    # Storage that whoever reaches it can write (storage http: every client of the proxy; an etcd_endpoint without
    # etcd_tls_dir: anyone who reaches that etcd) can register a worker that receives other users' prompts, or
    # delete the real ones. Refused unless this says the risk is accepted; then tk launch warns every time.
    accept_unauthenticated_storage: bool = False

    _cluster_name = field_validator("cluster_name")(classmethod(lambda cls, v: v if v == "" else _text_pattern(
        SAFE_NAME, "cluster_name must be 1-64 letters, digits, '.', '_' or '-'")(v)))
    _endpoint = field_validator("etcd_endpoint")(classmethod(lambda cls, v: _text_pattern(
        HOST_PORT, "etcd_endpoint must be host:port, e.g. etcd1:2379 (no scheme)")(v)))


class EmulateSpec(Section):
    """Emulated timing: the stand-in's iterations take the time of ``model`` on ``gpu`` (aiconfigurator's
    per-operation data where it has the GPU and TensorRT-LLM line, else the roofline: toolkit.standin.emulate)."""

    model: PathText  # a built-in name or a directory with config.json (the model whose timing is emulated)
    gpu: Literal[EMULATED_GPUS]  # type: ignore[valid-type]
    precision: Literal[PRECISIONS] = "bf16"  # type: ignore[valid-type]
    # a `tk validate cluster` run directory (or its report.json): the emulated KV transfer at its measured
    # context->generation GB/s (the slowest pair) instead of the transport profile's nominal figure
    kv_validation: Optional[PathText] = None


class StandinSpec(Section):
    """Settings only the CPU stand-in engine reads (``engine: standin``)."""

    emulate: Optional[EmulateSpec] = None  # None: no timing model, answers as fast as the CPU goes


class Recipe(Section):
    """A whole recipe file."""

    schema_version: Annotated[Literal[1], BeforeValidator(_strict_one)]
    name: str
    description: Annotated[str, Field(max_length=1000), AfterValidator(check_text)] = ""
    engine: Literal["trtllm", "standin"] = "trtllm"
    model: PathText
    model_path: Optional[PathText] = None
    quantization: Optional[Text] = None
    # Let TensorRT-LLM run Python shipped with the checkpoint (its config.json `auto_map`: custom configuration,
    # model or tokenizer code). Off by default, as in TensorRT-LLM's own LLM API (TorchLlmArgs.trust_remote_code
    # defaults to False); rendered into ctx.yaml / gen.yaml only when true.
    trust_remote_code: bool = False
    # None (not written, or null): the loader derives the line from cluster.container_image's tag where tk can
    # read it, else takes versions.latest(); LoadedRecipe.version_source says which. After loading it is a str.
    trtllm_version: Optional[str] = None
    cluster: ClusterSpec
    context: RoleSpec = Field(default_factory=RoleSpec)
    generation: RoleSpec = Field(default_factory=RoleSpec)
    aggregated: AggregatedSpec = Field(default_factory=AggregatedSpec)
    kv_transfer: KvTransferSpec = Field(default_factory=KvTransferSpec)
    traffic: TrafficSpec = Field(default_factory=TrafficSpec)
    speculative: SpeculativeSpec = Field(default_factory=SpeculativeSpec)
    proxy: ProxySpec = Field(default_factory=ProxySpec)
    supervision: SupervisionSpec = Field(default_factory=SupervisionSpec)
    membership: MembershipSpec = Field(default_factory=MembershipSpec)
    standin: Optional[StandinSpec] = None

    def manifest_doc(self) -> dict:
        """The recipe as the plan and manifest record it; the engine-specific `standin` section only where set (its
        emulate.kv_validation too), and `aggregated` (the baseline's section) only where the recipe wrote it."""
        exclude = ({"standin"} if self.standin is None else set()) | \
            (set() if "aggregated" in self.model_fields_set else {"aggregated"})
        doc = self.model_dump(mode="json", exclude=exclude or None)
        emulate = (doc.get("standin") or {}).get("emulate")
        if isinstance(emulate, dict) and emulate.get("kv_validation") is None:
            emulate.pop("kv_validation", None)  # recorded only where set (manifests before it stay as they were)
        return doc

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not SAFE_NAME.fullmatch(v):
            raise ValueError("name must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return v

    @field_validator("trtllm_version", mode="before")
    @classmethod
    def _version(cls, v):
        # The loader passes `trtllm_version: 1.10` on as the text "1.10"; a number that reaches here lost its
        # text (1.10 would be 1.1), so it is refused rather than guessed.
        if v is None:
            return None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            raise ValueError(f"trtllm_version is the number {v!r}; write it as a quoted string, e.g. "
                             f"trtllm_version: \"{v}\" (1.10 unquoted would be read as 1.1)")
        if not isinstance(v, str):
            raise ValueError("trtllm_version must be a string such as \"1.2\"")
        if versions.parse_version(v) is None:
            raise ValueError("trtllm_version must look like \"1.2\", \"1.2.1\" or \"1.2.0rc3\"")
        versions.get(v)  # raises with the supported list
        return v
