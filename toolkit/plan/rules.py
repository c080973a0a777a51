"""The rules a recipe must keep, checked on the derived numbers. Each violation points at the recipe line to change."""

from __future__ import annotations

import difflib
import functools
import math
import re
from pathlib import Path

from toolkit.errors import Violation
from toolkit.facts import llm_args, trtllm
from toolkit.facts.engines import ENGINES, EngineProfile
from toolkit.facts.hardware import GPU_FIGURES, TRANSPORT_PROFILES, TransportProfile
from toolkit.facts.models import BUILTIN_MODELS, ModelError, ModelSpec, resolve_model
from toolkit.plan.sizing import ceil_to, longest_input
from toolkit.recipe.loader import LoadedRecipe
from toolkit.recipe.schema import Recipe


class Collector:
    """Violations (with the recipe line each points at) and warnings, gathered over every rule."""

    def __init__(self, loaded: LoadedRecipe):
        self.loaded = loaded
        self.violations: list[Violation] = []
        self.warnings: list[str] = []

    def add(self, path, message: str, fix: str = "") -> None:
        v = self.loaded.violation(path, message, fix)
        if v not in self.violations:  # the same field and message reached from both roles is said once
            self.violations.append(v)


def check_version_features(r: Recipe, version: trtllm.TrtllmVersion, engine: EngineProfile,
                           transport: TransportProfile, c: Collector, target: llm_args.Target | None = None) -> None:
    target = target or llm_args.Target(version.line)
    kv = r.kv_transfer
    backend = llm_args.value_status(target, "cache_transceiver_config.backend", kv.backend)
    if backend is not None and backend.verdict is llm_args.Verdict.ABSENT:
        c.add("kv_transfer.backend", backend.reason, backend.fix + " or a newer trtllm_version")
    elif backend is not None:
        c.warnings.append(backend.reason)
    if kv.dtype not in version.kv_dtypes:
        c.add("kv_transfer.dtype", f"kv dtype {kv.dtype} is not accepted by TensorRT-LLM {version.line}",
              f"use one of {', '.join(version.kv_dtypes)}")
    if "kv_transfer_timeout_ms" in kv.model_fields_set and kv.kv_transfer_timeout_ms is not None:
        timeout = llm_args.status(target, "cache_transceiver_config.kv_transfer_timeout_ms")
        if timeout.verdict is llm_args.Verdict.ABSENT:
            c.add("kv_transfer.kv_transfer_timeout_ms", timeout.reason,
                  "remove the field, or target a newer trtllm_version")
        elif timeout.verdict is llm_args.Verdict.UNSURE:
            c.warnings.append(f"kv_transfer.kv_transfer_timeout_ms is written as you set it: {timeout.reason}")
    if transport.gpus and r.cluster.gpu not in transport.gpus and engine.gpu_fabric_env:
        c.add("kv_transfer.transport", f"transport {transport.name} ({transport.description}) exists only between "
              f"{' and '.join(transport.gpus)} GPUs; cluster.gpu is {r.cluster.gpu}",
              f"use another kv_transfer.transport, or set cluster.gpu to one of {', '.join(transport.gpus)}")
    if transport.nixl_transport != "UCX":
        if kv.backend != "NIXL":
            c.add("kv_transfer.backend",
                  f"transport {transport.name} moves KV with NIXL over {transport.nixl_transport}, "
                  f"but the backend is {kv.backend}", "set kv_transfer.backend: NIXL")
        if transport.nixl_transport not in version.nixl_transports:
            c.add("kv_transfer.transport",
                  f"TensorRT-LLM {version.line} cannot run NIXL over {transport.nixl_transport}",
                  "use a trtllm_version that supports it, or another transport")
    if engine.kv_backends is not None and kv.backend not in engine.kv_backends:
        c.add("kv_transfer.backend", f"{engine.kv_backends_reason} and cannot emulate {kv.backend}",
              engine.kv_backends_fix)
    if kv.backend == "DEFAULT":
        c.warnings.append("kv_transfer.backend DEFAULT lets TensorRT-LLM pick from TRTLLM_USE_*_KVCACHE; "
                          "an explicit NIXL or UCX avoids surprises between versions")
    if kv.backend == "MPI":
        c.warnings.append("the MPI KV-cache backend is deprecated in TensorRT-LLM")


def check_unverified_options(version: trtllm.TrtllmVersion, merged: dict[str, dict], c: Collector) -> None:
    """Keys still written whose acceptance by this line is unverified (options.omit_unverified_defaults left
    them because their value is not TensorRT-LLM's default): a warning naming the value and the source."""
    for fact in trtllm.unverified_options(version):
        seen = {}
        for title, opts in merged.items():
            value = _dig_or_absent(opts, fact.path)
            if value is not _ABSENT:
                seen.setdefault(_show(value), []).append(title)
        for value, titles in seen.items():
            owner = trtllm.TK_OWNED_OPTIONS.get(fact.dotted, "").replace("{role}", titles[0])
            c.warnings.append(
                f"{fact.dotted} = {value} is written for the {' and '.join(titles)} servers"
                + (f" (from {owner})" if owner else "") + f", and whether TensorRT-LLM {version.line} accepts it "
                f"is unverified ({fact.source}); if the servers refuse it at start-up (extra_forbidden), use "
                f"{_show(fact.default)}, TensorRT-LLM's default, which tk then leaves out")


def check_emulation(r: Recipe, engine: EngineProfile, c: Collector) -> str | None:
    """`standin.emulate`: only for an engine that can emulate timing (its profile names the env it reads), with a
    model tk can resolve and a precision the GPU has. Returns what the engine is given as the model (a built-in
    name, or the directory made absolute), or None when there is nothing to emulate or it is refused."""
    emu = r.standin.emulate if r.standin else None
    if emu is None:
        return None
    if engine.emulate_env_prefix is None:
        c.add("standin.emulate", f"engine {r.engine} ({engine.label}) runs for real: emulated timing is the CPU "
              "stand-in's rehearsal model and would misstate this engine's performance",
              "set engine: standin to rehearse with emulated timing, or remove standin.emulate")
        return None
    try:
        spec = resolve_model(emu.model, base_dir=c.loaded.base_dir)
    except ModelError as exc:
        c.add("standin.emulate.model", str(exc),
              exc.fix or "use a name from `tk recipes --models` or a directory with config.json")
        return None
    figures = GPU_FIGURES[emu.gpu]
    if emu.precision == "fp8" and figures.fp8_tflops is None:
        c.add("standin.emulate.precision", f"{emu.gpu} has no FP8 tensor cores", "use precision: bf16")
        return None
    from toolkit.plan.options import emulation_report
    if emu.kv_validation is not None and emulation_report(emu.kv_validation, c.loaded.base_dir) is None:
        c.add("standin.emulate.kv_validation", f"{emu.kv_validation}: no `tk validate cluster` run directory or "
              "report.json there", "give a validate run's directory, or remove it to use the transport's nominal GB/s")
        return None
    if spec.name in BUILTIN_MODELS:
        return spec.name
    path = Path(emu.model).expanduser()
    if not path.is_absolute() and c.loaded.base_dir is not None:
        path = Path(c.loaded.base_dir) / path
    return str(path.resolve())


def check_parallelism(r: Recipe, model: ModelSpec, c: Collector) -> None:
    for title, role in (("context", r.context), ("generation", r.generation)):
        if role.ep is not None:
            if not model.is_moe:
                c.add(f"{title}.ep", f"{model.name} is a dense model; expert parallelism does not apply",
                      "remove ep")
            elif role.tp % role.ep:
                c.add(f"{title}.ep",
                      f"ep={role.ep} must divide the role's tensor-parallel GPUs (tp={role.tp}); "
                      "TensorRT-LLM splits tp into moe_ep_size x moe_tp_size",
                      f"use an ep that divides {role.tp}, e.g. ep={role.tp}")
            elif model.num_experts % role.ep:
                c.add(f"{title}.ep", f"ep={role.ep} must divide the model's {model.num_experts} experts",
                      "use a divisor of the expert count")
        if role.attention_dp:  # TensorRT-LLM accepts both (its own tests run attention DP at tp 1): warnings
            if not model.is_moe:
                c.warnings.append(f"{title}.attention_dp: attention data parallelism is meant for MoE models; "
                                  f"{model.name} is dense")
            elif role.tp < 2:
                c.warnings.append(f"{title}.attention_dp with tp={role.tp}: one rank per DP group, so attention DP "
                                  "changes nothing")
        if r.kv_transfer.dtype == "auto" and model.attention == "mla" and role.tp > 1 and not role.attention_dp:
            c.warnings.append(f"{title}: MLA with tp={role.tp} and no attention DP replicates the KV cache "
                              "on every rank")
    if r.speculative.mtp_layers and model.attention != "mla":
        c.add("speculative.mtp_layers", f"MTP needs a model trained with multi-token prediction layers "
              f"(DeepSeek-V3/R1); {model.name} has none", "set speculative.mtp_layers: 0")
    if r.traffic.max_input_len + r.traffic.prefix_len + r.traffic.max_output_len > model.max_position_embeddings > 0:
        c.add("traffic.max_input_len",
              f"input + prefix + output = {r.traffic.max_input_len + r.traffic.prefix_len + r.traffic.max_output_len}"
              f" tokens exceeds the model's {model.max_position_embeddings}-token context",
              "lower max_input_len, prefix_len or max_output_len")
    local_prefill = r.proxy.conditional_max_local_prefill_length
    if local_prefill is not None and r.proxy.generation_router != "kv_cache_aware":
        c.add("proxy.conditional_max_local_prefill_length",
              "conditional disaggregation needs a KV-cache-aware generation router "
              "(TensorRT-LLM asserts this at start-up)", "set proxy.generation_router: kv_cache_aware")
    if local_prefill is not None and r.generation.max_num_tokens is not None \
            and r.generation.max_num_tokens < local_prefill:
        # TensorRT-LLM starts with it and refuses the longer prompts when they come (as for the context role's
        # max_num_tokens, check_role_options): a warning, not a refusal.
        c.warnings.append(
            f"generation.max_num_tokens: generation servers prefill prompts of up to {local_prefill} tokens "
            f"themselves under conditional disaggregation, but max_num_tokens is {r.generation.max_num_tokens}: "
            f"TensorRT-LLM refuses such prompts at run time; raise it to at least "
            f"{ceil_to(r.kv_transfer.tokens_per_block, local_prefill)} or lower "
            "proxy.conditional_max_local_prefill_length")


def check_placement(r: Recipe, transport: TransportProfile, servers, node_count: int, ctx_nodes: int,
                    gen_nodes: int, c: Collector) -> None:
    if not transport.multi_node and node_count > 1:
        c.add("kv_transfer.transport",
              f"transport 'nvlink-single-node' needs everything on one node, but the plan uses "
              f"{node_count} nodes ({ctx_nodes} context + {gen_nodes} generation)",
              "use infiniband/roce/efa, set cluster.share_nodes: true if the roles fit one node together, "
              "or shrink the roles")
    ports = [s.port for s in servers]
    if max(ports) > 65535:
        c.add("cluster.worker_base_port", f"worker ports run up to {max(ports)}, past 65535",
              "lower cluster.worker_base_port")
    if r.proxy.port in ports:
        c.add("proxy.port", f"proxy port {r.proxy.port} collides with a worker port "
              f"({min(ports)}-{max(ports)} are the workers')",
              f"use a port outside {min(ports)}-{max(ports)}, or move cluster.worker_base_port")


def check_internal_ports(r: Recipe, servers, c: Collector) -> None:
    """Each instance's internal ports (facts.trtllm.INTERNAL_PORT_ENVS) stay clear of every HTTP port."""
    internal = [p for s in servers for _, p in s.internal_ports]
    if not internal:
        return
    http = {s.port for s in servers} | {r.proxy.port}
    field = "cluster.internal_base_port"
    if max(internal) > 65535:
        c.add(field, f"internal ports run up to {max(internal)}, past 65535", "lower cluster.internal_base_port")
    clash = sorted(http & set(internal))
    if clash:
        c.add(field, f"internal ports {min(internal)}-{max(internal)} include the HTTP port(s) "
              f"{', '.join(map(str, clash))} of the workers or the proxy",
              f"set cluster.internal_base_port outside {min(http)}-{max(http)}")


# Options tk sets itself on the #SBATCH lines / on every server's srun step -> the recipe field (or the reason).
# Slurm's option parser (getopt_long) also takes unambiguous abbreviations, so a prefix of one of these
# (--node, --out) is refused as well.
SBATCH_OWNED = {
    "nodes": "the plan (roles and instances)", "ntasks": "the plan (roles and instances)",
    "ntasks-per-node": "the plan (gpus_per_node)", "nodelist": "the plan (tk places servers on the allocation)",
    "output": "tk (slurm-%j.out in the run directory)", "error": "tk (slurm-%j.out in the run directory)",
    "open-mode": "tk", "job-name": "name", "partition": "cluster.partition", "account": "cluster.account",
    "time": "cluster.time_limit", "gres": "cluster.gpu_request", "gpus": "cluster.gpu_request",
    "gpus-per-node": "cluster.gpu_request", "exclusive": "cluster.exclusive",
    "chdir": "tk launch (the run directory)", "export": "tk launch (--export=ALL)", "wrap": "tk (launch.sbatch)",
    "array": "tk (one job per run)",
}
SRUN_OWNED = {
    "nodes": "the plan", "ntasks": "the plan", "ntasks-per-node": "the plan", "nodelist": "the plan",
    "output": "tk (logs/NAME.log)", "error": "tk (logs/NAME.log)", "open-mode": "tk", "overlap": "tk",
    "kill-on-bad-exit": "tk", "mpi": "cluster.mpi",
    "container-image": "cluster.container_image", "container-mounts": "cluster.container_mounts",
    "no-container-mount-home": "tk", "gres": "cluster.gpu_request", "gpus": "cluster.gpu_request",
    "gpus-per-node": "cluster.gpu_request", "exclusive": "cluster.exclusive", "chdir": "tk",
    "export": "tk (each server's environment comes from its env file)",
}


def check_slurm_args(r: Recipe, c: Collector) -> None:
    for field, owned, where in (("sbatch_args", SBATCH_OWNED, "#SBATCH"), ("srun_args", SRUN_OWNED, "srun")):
        for arg in getattr(r.cluster, field):
            name = arg[2:].split("=", 1)[0]
            hits = sorted(o for o in owned if o.startswith(name))
            if hits:
                key = name if name in owned else hits[0]
                what = f"--{name}" if name in owned else \
                    f"{', '.join('--' + h for h in hits)} (Slurm reads --{name} as an abbreviation)"
                source = owned[key]
                fix = ("remove it; tk derives that option" if source.startswith(("tk", "the plan"))
                       else f"remove it; set {source} instead")
                c.add(f"cluster.{field}", f"{arg} contradicts the {where} option {what} that tk sets itself "
                      f"(from {source})", fix)


def check_role_options(r: Recipe, ctx_opts: dict, gen_opts: dict, c: Collector) -> None:
    tpb = r.kv_transfer.tokens_per_block
    longest = longest_input(r)
    for title, _role, opts in (("context", r.context, ctx_opts), ("generation", r.generation, gen_opts)):
        mnt = opts["max_num_tokens"]
        if not _is_kind(mnt, "positive integer", None):
            continue  # reported by check_extra_options
        # No rule ties max_num_tokens to tokens_per_block: TensorRT-LLM has none (llm_args.py only warns when
        # max_batch_size > max_num_tokens, validate_runtime_args @ 3e906a0e); NVIDIA runs generation servers with
        # max_num_tokens 1, 4, 16... (NVIDIA/srt-slurm recipes/trtllm @ c88ef731).
        msl = opts.get("max_seq_len")
        need = longest + (1 if title == "context" else r.traffic.max_output_len)
        if _is_kind(msl, "positive integer", None) and msl < need:
            c.warnings.append(
                f"{title} servers' max_seq_len is {msl}, below the {need} tokens the recipe's longest request takes "
                f"there ({longest} input + prefix{' + the first token' if title == 'context' else ' + output'}): "
                "TensorRT-LLM refuses such requests at run time")
        if title == "context" and mnt < longest and not opts.get("enable_chunked_prefill"):
            # TensorRT-LLM starts with it and refuses the longer prompts when they come: a warning.
            c.warnings.append(
                f"context.max_num_tokens = {mnt} cannot hold the longest admitted input ({longest} tokens) in one "
                f"prefill without chunked prefill: TensorRT-LLM refuses such requests at run time; use at least "
                f"{ceil_to(tpb, longest)}, lower traffic.max_input_len, or enable chunked prefill in "
                "context.extra_options")


def check_agreement(r: Recipe, ctx: dict, gen: dict, c: Collector) -> None:
    """What TensorRT-LLM checks when a generation server connects to a context server."""
    reported = {v.field for v in c.violations}
    for what, path, field in trtllm.CTX_GEN_MUST_AGREE:
        a, b = _dig(ctx, path), _dig(gen, path)
        if any(f"{t}.extra_options.{'.'.join(path[:i])}" in reported
               for t in ("context", "generation") for i in range(1, len(path) + 1)):
            continue  # an extra_options override of it is already reported, naming the field to set
        if a != b:
            c.add(f"generation.extra_options.{'.'.join(path)}",
                  f"context and generation disagree on {what} ({a!r} vs {b!r}); the KV transfer fails",
                  f"set it once in {field} and remove the per-role override")
    ctx_model = r.context.model_path or r.model_path or r.model
    gen_model = r.generation.model_path or r.model_path or r.model
    if ctx_model != gen_model:
        c.add("generation.model_path", f"context serves {ctx_model!r} but generation serves {gen_model!r}",
              "serve the same checkpoint on both roles (set model_path once at the top level)")
    cq = r.context.quantization or r.quantization
    gq = r.generation.quantization or r.quantization
    if cq != gq:
        c.add("generation.quantization", f"context quantization {cq!r} differs from generation {gq!r}; "
              "the KV layouts differ", "use the same quantization on both roles")


def _dig(d: dict, path):
    for k in path:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def check_env(r: Recipe, role: str, env: dict, version: trtllm.TrtllmVersion, c: Collector) -> None:
    """A role's environment: any POSIX name (the schema); what tk derives itself is refused with the field to set;
    UCX_TLS is honoured with a warning; a TRTLLM_/TLLM_ name TensorRT-LLM does not read (as far as tk knows: C++
    envUtils.cpp and the Python side, facts.llm_args.env_reader) is a warning, not a refusal."""
    user = {**r.kv_transfer.env, **getattr(r, role).env}
    owned = trtllm.TK_OWNED_ENV
    for name in user:
        src = "kv_transfer.env" if name in r.kv_transfer.env and name not in getattr(r, role).env else f"{role}.env"
        if name in owned:
            c.add(f"{src}.{name}", f"tk sets {name} from {owned[name]}",
                  f"change {owned[name]} instead of setting {name}")
        elif name == "UCX_TLS":
            profile = TRANSPORT_PROFILES[r.kv_transfer.transport]
            mine = profile.ucx_tls(ENGINES[r.engine].kv_memory) or "unset (UCX chooses)"
            c.warnings.append(f"{src}.UCX_TLS = {user[name]} overrides transport {profile.name}'s UCX_TLS ({mine}) "
                              f"on the {role} servers; tk's validation measures with it too")
        elif name.startswith(("TRTLLM_", "TLLM_")) and llm_args.env_reader(version.line, name) is None:
            others = llm_args.env_lines(name)
            c.warnings.append(
                f"{src}.{name}: TensorRT-LLM {version.line} does not read {name} as far as tk knows (C++ envUtils.cpp"
                f" and the Python side: docs/trtllm-versions.md)" + (f"; TensorRT-LLM {', '.join(others)} does"
                                                                     if others else "") + "; it is set anyway")
    if "NIXL_BACKEND" in env and trtllm.NIXL_BACKEND_ENV in env:
        c.add(f"{role}.env.NIXL_BACKEND",
              f"NIXL_BACKEND together with {trtllm.NIXL_BACKEND_ENV} breaks NIXL endpoint exchange "
              "('Failed to deserialize data rail endpoints')", "remove NIXL_BACKEND; tk sets the TRT-LLM one")
    backend = r.kv_transfer.backend
    for b, var in trtllm.BACKEND_SELECTORS.items():
        if env.get(var) == "1" and backend not in ("DEFAULT", b):
            c.add(f"{role}.env.{var}", f"{var}=1 contradicts kv_transfer.backend {backend}",
                  f"remove {var}; the backend is set in cache_transceiver_config")


# --- extra_options and extra_serve_args -------------------------------------------------------------------------

_ABSENT = object()  # an option tk does not write for this plan
_INT_MAX = (1 << 31) - 1  # TensorRT-LLM hands these to C++ as int32


def _show(value) -> str:
    text = {_ABSENT: "nothing", None: "null", True: "true", False: "false"}.get(value, None) \
        if value is _ABSENT or value is None or isinstance(value, bool) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_kind(value, kind: str, version) -> bool:
    """Whether ``value`` is of ``kind`` (facts.trtllm.OPTION_KINDS); a kind ending in "?" also takes null."""
    if kind.endswith("?"):
        if value is None:
            return True
        kind = kind[:-1]

    def whole(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    def pos_int(v) -> bool:
        return whole(v) and 0 < v <= _INT_MAX

    if kind == "positive integer":
        return pos_int(value)
    if kind == "non-negative integer":
        return whole(value) and 0 <= value <= _INT_MAX
    if kind == "integer":
        return whole(value) and -_INT_MAX - 1 <= value <= _INT_MAX
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "fraction":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            and 0 < value <= 1
    if kind == "kv dtype":
        return value in version.kv_dtypes
    if kind == "mapping":
        return isinstance(value, dict)
    if kind == "list of positive integers":
        return isinstance(value, list) and all(pos_int(v) for v in value)
    raise AssertionError(kind)


# What TensorRT-LLM's pydantic makes of a value for an option of each kind tk checks: its option models are
# StrictBaseModel = pydantic BaseModel with extra="forbid" (tensorrt_llm/llmapi/llm_args.py), not strict=True, so
# pydantic's lax mode converts (bool: 0/1, "true"/"false", "yes"/"no", "on"/"off", "t"/"f", "y"/"n", "1"/"0" in any
# case; int: "2", 2.0, true; float: "0.5"; lists item by item). The kinds without a row take no conversion.
_LAX_TYPES = {"positive integer": "int", "non-negative integer": "int", "integer": "int", "boolean": "bool",
              "fraction": "float", "list of positive integers": "list[int]"}


@functools.lru_cache(maxsize=None)
def _adapter(name: str):
    from pydantic import TypeAdapter

    return TypeAdapter({"int": int, "bool": bool, "float": float, "list[int]": list[int]}[name])


def _lax(value, kind: str, version):
    """``value`` as TensorRT-LLM's pydantic (lax mode) converts it for an option of ``kind``, where the result is of
    that kind; else _ABSENT (pydantic refuses it, or tk would: a kind's range is tk's check too)."""
    name = _LAX_TYPES.get(kind.removesuffix("?"))
    if name is None or isinstance(value, dict):
        return _ABSENT
    from pydantic import ValidationError

    try:
        converted = _adapter(name).validate_python(value)
    except (ValidationError, ValueError, TypeError, OverflowError):
        return _ABSENT
    return converted if _is_kind(converted, kind, version) else _ABSENT


def lax_converted(options: dict, version, prefix: str = "") -> dict:
    """A copy of ``options`` with every value of a checked kind (facts.trtllm.OPTION_KINDS) that pydantic converts
    replaced by what it converts to: what TensorRT-LLM reads, written so (toolkit.plan.aggregated)."""
    out = {}
    for key, value in options.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        kind = trtllm.OPTION_KINDS.get(dotted)
        if kind and not _is_kind(value, kind, version) and _lax(value, kind, version) is not _ABSENT:
            value = _lax(value, kind, version)
        elif isinstance(value, dict):
            value = lax_converted(value, version, dotted)
        out[key] = value
    return out


def _kind_text(kind: str, version) -> str:
    if kind.endswith("?"):
        return f"{_kind_text(kind[:-1], version)} (or null)"
    if kind == "kv dtype":
        return f"a KV dtype TensorRT-LLM {version.line} accepts ({', '.join(version.kv_dtypes)})"
    if kind == "fraction":
        return "a fraction in (0, 1]"
    if kind in ("positive integer", "non-negative integer"):
        return f"a {kind} (at most {_INT_MAX})"
    if kind == "integer":
        return f"an integer (from {-_INT_MAX - 1} to {_INT_MAX})"
    return f"a {kind}"


def _same(a, b) -> bool:
    """Equal values of the same kind (true is not 1, "1" is not 1); 64 and 64.0 are the same number."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def check_extra_options(r: Recipe, title: str, role, derived: dict, version: trtllm.TrtllmVersion,
                        c: Collector, target: llm_args.Target | None = None) -> dict:
    """A role's extra_options, every key at every depth: one TensorRT-LLM accepts (facts.llm_args: refused only
    where every snapshot that speaks for the target lists the section whole and lacks the key, else a warning),
    values of the kind tk reads, a fixed-choice value TensorRT-LLM has, nothing tk owns overridden.

    ``derived`` is what tk writes before extra_options are merged in. One violation per key at most, and none for
    the keys below a refused one. A value pydantic converts (lax mode: ``enable_chunked_prefill: 1``) is accepted
    with a warning. Returns the extra_options as TensorRT-LLM reads them, which the plan writes and the rules that
    read values read: converted, and without the subtrees reported here (the plan fails anyway; no later rule
    compares a value of the wrong kind).
    """
    target = target or llm_args.Target(version.line)
    implied = {**trtllm.TK_IMPLIED_OPTIONS, "model": role.model_path or r.model_path or r.model}
    stopped: list[str] = []
    reported: list[tuple] = []
    conversions: dict[tuple, object] = {}

    def refuse(path: tuple, dotted: str, *violation) -> None:
        c.add(*violation)
        stopped.append(dotted)
        reported.append(path)

    for dotted, key, value in llm_args.walk_options(role.extra_options):
        if any(dotted == s or dotted.startswith(s + ".") for s in stopped):
            continue
        path = tuple(dotted.split("."))
        field = (title, "extra_options", *path)
        where = f"{title}.extra_options.{dotted}"
        if not isinstance(key, str):
            refuse(path, dotted, field, f"option name {_show(key)} is not a string", "write the option name as text")
            continue
        owner = trtllm.TK_OWNED_OPTIONS.get(dotted)
        owner = owner.replace("{role}", title) if owner else None
        instead = f"set {owner} instead and remove {where}" if owner else ""
        kind = trtllm.OPTION_KINDS.get(dotted)
        if kind and not _is_kind(value, kind, version):
            converted = _lax(value, kind, version)
            if converted is _ABSENT:
                refuse(path, dotted, field, f"{_show(value)} is not {_kind_text(kind, version)}",
                       instead or f"give {dotted} {_kind_text(kind, version)}")
                continue
            c.warnings.append(f"{where}: {_show(value)} is not {_kind_text(kind, version)} as written; TensorRT-LLM's "
                              f"pydantic (lax mode) converts it to {_show(converted)}, which tk writes")
            conversions[path] = value = converted
        if owner:
            stopped.append(dotted)  # tk's value stands for the whole subtree
            tk_value = implied[key] if key in implied and len(path) == 1 else _dig_or_absent(derived, path)
            if not _same(value, tk_value):
                omitted = tk_value is _ABSENT and any(f.dotted == dotted for f in trtllm.unverified_options(version))
                what_tk = (f"tk writes {dotted} = {_show(tk_value)} from {owner}" if tk_value is not _ABSENT
                           else f"tk leaves {dotted} out for TensorRT-LLM {version.line}: {owner} is the engine's "
                                "default, and whether that line accepts the key is unverified" if omitted
                           else f"tk writes no {dotted} for this recipe (it follows {owner})")
                refuse(path, dotted, field, f"{what_tk}; extra_options would change it to {_show(value)}", instead)
            continue
        st = llm_args.status(target, dotted)
        if st.verdict is llm_args.Verdict.ABSENT:
            refuse(path, dotted, field, st.reason,
                   st.fix.replace(dotted, where, 1) if st.fix.startswith("remove") else st.fix)
            continue
        if st.verdict is llm_args.Verdict.UNSURE:
            c.warnings.append(f"{where}: {st.reason}")
        if st.below_opaque:
            stopped.append(dotted)  # TensorRT-LLM takes any keys below it
            continue
        bad = llm_args.value_status(target, dotted, value)
        if bad is not None and bad.verdict is llm_args.Verdict.ABSENT:
            refuse(path, dotted, field, bad.reason, bad.fix)
        elif bad is not None:
            c.warnings.append(f"{where}: {bad.reason}")
    return _checked(role.extra_options, reported, conversions)


def _checked(options: dict, reported: list[tuple], conversions: dict[tuple, object]) -> dict:
    """A copy of ``options`` less the subtrees at the ``reported`` paths, with the converted values."""
    out = {}
    for key, value in options.items():
        below = [p[1:] for p in reported if p and p[0] == str(key)]
        if any(not p for p in below):
            continue
        if (str(key),) in conversions:
            value = conversions[(str(key),)]
        elif isinstance(value, dict):
            value = _checked(value, below, {p[1:]: v for p, v in conversions.items() if p[0] == str(key)})
        out[key] = value
    return out


def _dig_or_absent(d: dict, path):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return _ABSENT
        d = d[k]
    return d


def check_extra_serve_args(title: str, role, version: trtllm.TrtllmVersion, c: Collector) -> None:
    """A role's extra_serve_args: flags the version's trtllm-serve takes, none that tk sets itself."""
    known = trtllm.serve_flag_table(version)
    field = f"{title}.extra_serve_args"
    args = list(role.extra_serve_args)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-"):
            c.add(field, f"{_show(arg)} is not a flag, and no flag before it takes a value (trtllm-serve would "
                  "read it as a second MODEL)", "remove it, or put the flag it belongs to before it")
            continue
        name, eq, inline = arg.partition("=")
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            c.add(field, f"trtllm-serve of TensorRT-LLM {version.line} has no flag {_show(name)}{hint}",
                  f"use {close[0]}" if close else f"remove {_show(name)} from {field}")
            if not eq and i < len(args) and not args[i].startswith("-"):
                i += 1  # most likely its value
            continue
        canon = trtllm.SERVE_FLAG_ALIASES.get(name, name)
        takes_value = known[name]
        if takes_value and not eq:
            if i >= len(args):
                c.add(field, f"{name} needs a value", f"add the value after {name}, or write {name}=VALUE")
                continue
            value = args[i]
            i += 1
        else:
            value = inline
        owner = trtllm.TK_OWNED_SERVE_FLAGS.get(canon)
        if owner:
            spelled = name if canon == name else f"{name} (the same as {canon})"
            owner = owner.replace("{role}", title)
            c.add(field, f"tk passes {spelled} itself (from {owner}); a second one would contradict the plan",
                  f"remove {name} from {field}" + ("" if owner.startswith("nothing") else f"; set {owner} instead"))
            continue
        if not takes_value and eq:
            c.add(field, f"{name} is a switch and takes no value", f"write {name} without ={inline}")
        elif takes_value and canon in trtllm.SERVE_INT_FLAGS and not re.fullmatch(r"[0-9]+", value):
            c.add(field, f"{name}: {_show(value)} is not an integer", f"give {name} a whole number")


def check_supervision(r: Recipe, c: Collector) -> None:
    """The restart policy's numbers must describe something that can happen."""
    sv = r.supervision
    if sv.backoff_initial_s > sv.backoff_max_s:
        c.add("supervision.backoff_initial_s",
              f"backoff_initial_s ({sv.backoff_initial_s}) is above backoff_max_s ({sv.backoff_max_s})",
              f"lower it to at most {sv.backoff_max_s}, or raise supervision.backoff_max_s")
    if 0 < sv.stall_after_s < 5:
        c.add("supervision.stall_after_s",
              f"stall_after_s ({sv.stall_after_s}) would call a server wedged when one token takes {sv.stall_after_s}s",
              "set it to at least 5 (above the worst time to first token under load), or 0 to turn progress probes off")
    for field, spec, title in (("min_context", r.context, "context"), ("min_generation", r.generation, "generation")):
        minimum = getattr(sv, field)
        if minimum > spec.instances:
            c.add(f"supervision.{field}",
                  f"{field} is {minimum} but the recipe has {spec.instances} {title} instance(s): the run could "
                  "never meet it", f"set it to at most {spec.instances}, or add {title} instances")


ETCD_TLS_DIR = "<run_dir>/secrets/etcd"  # where tk launch writes the run's certificates (launch.sbatch resolves it)


def check_membership(r: Recipe, version: trtllm.TrtllmVersion, servers, c: Collector):
    """The membership TensorRT-LLM keeps (disagg_cluster), or None where it is off (the default: static urls) or the
    line lacks it. Rules: the line has it (and the storage); inactive_timeout_s > heartbeat_interval_s (TensorRT-LLM's
    DisaggClusterWorker silently disables the heartbeat otherwise, and every worker then expires); an etcd
    endpoint only with etcd storage, and the etcd the job starts on ports no server or the proxy uses; storage that
    anyone who reaches it can write only when the recipe accepts that (then a warning, which tk launch prints every
    time). minimal_instances are supervision.min_context / min_generation.

    Who can write the storage. TensorRT-LLM's HTTP storage is routes on the proxy's own client port, open to every
    client (HttpClusterStorageServer.add_routes; a bearer token only on 2026 main, not in a release tk targets), and
    its etcd client sends no credentials and speaks no TLS: Etcd3ClusterStorage takes host and port from cluster_uri
    and nothing else (`etcd3.client(host, port)` at NVIDIA/TensorRT-LLM@b3809755; urlparse's hostname and port with
    `secure=False` at @057d4a79, a user:password@ part ignored), tensorrt_llm/serve/cluster_storage.py. So the etcd
    the job starts accepts only clients with a certificate of the run's own authority (--client-cert-auth), and each
    server reaches it through a gateway on its node's loopback that presents that certificate, to connections of
    the gateway's own user only (templates/etcd_gateway.py). An external etcd gets the same through etcd_tls_dir."""
    from toolkit.plan.model import EtcdPlan, MembershipPlan
    m = r.membership
    if m.enabled is False or (m.enabled == "auto" and not version.cluster_storages):
        return None
    if not version.cluster_storages:
        c.add("membership.enabled", f"TensorRT-LLM {version.line} has no disagg_cluster membership (it came with the "
              "1.2 line, PR #7869)", "set membership.enabled: false (static urls), or target trtllm_version 1.2")
        return None
    if m.storage not in version.cluster_storages:
        c.add("membership.storage", f"TensorRT-LLM {version.line} has no {m.storage} cluster storage",
              f"use one of {', '.join(version.cluster_storages)}")
    if m.inactive_timeout_s <= m.heartbeat_interval_s:
        c.add("membership.inactive_timeout_s",
              f"inactive_timeout_s ({m.inactive_timeout_s}) must be greater than heartbeat_interval_s "
              f"({m.heartbeat_interval_s}): TensorRT-LLM's workers then send no heartbeat at all and expire "
              f"after inactive_timeout_s", f"set it to at least {2 * m.heartbeat_interval_s}")
    # minimal_instances is the supervision minimum (checked by check_supervision): a proxy that required every
    # instance would refuse all requests while one worker restarts.
    minimal = {"ctx": r.supervision.min_context, "gen": r.supervision.min_generation}
    etcd = None
    if m.etcd_endpoint is not None and m.storage != "etcd":
        c.add("membership.etcd_endpoint", "etcd_endpoint is only read with storage: etcd",
              "remove it, or set membership.storage: etcd")
    if m.etcd_tls_dir is not None and (m.storage != "etcd" or m.etcd_endpoint is None):
        c.add("membership.etcd_tls_dir", "etcd_tls_dir is the client certificate of an external etcd "
              "(etcd_endpoint); the etcd the job starts uses the run's own", "remove it, or set etcd_endpoint")
    taken = {r.proxy.port} | {s.port for s in servers} | {p for s in servers for _, p in s.internal_ports}
    unauthenticated = None
    if m.storage == "etcd":
        if m.etcd_endpoint:
            etcd = EtcdPlan(endpoint=m.etcd_endpoint, started_by_job=False, node=None, port=None, peer_port=None,
                            tls_dir=m.etcd_tls_dir)
            if m.etcd_tls_dir is None:
                unauthenticated = (f"the etcd at {m.etcd_endpoint} is used without a client certificate "
                                   "(etcd_tls_dir): whoever reaches it can register workers")
        else:
            node0 = {s.port for s in servers if 0 in s.nodes} | {r.proxy.port} | \
                    {p for s in servers if s.first_node == 0 for _, p in s.internal_ports}
            peer = m.etcd_port + 1
            for port, what in ((m.etcd_port, "client"), (peer, "peer")):
                if port in node0:
                    c.add("membership.etcd_port", f"the etcd the job starts would take port {port} ({what}) on node 0, "
                          f"which a server or the proxy already uses", "choose another membership.etcd_port")
            etcd = EtcdPlan(endpoint=f"<node0>:{m.etcd_port}", started_by_job=True, node=0, port=m.etcd_port,
                            peer_port=peer, tls_dir=ETCD_TLS_DIR)
            taken |= {m.etcd_port, peer}
        uri = f"{trtllm.MEMBERSHIP_URI_SCHEMES['etcd']}://{etcd.endpoint}"
    else:
        unauthenticated = (f"storage http is served on the proxy's client port {r.proxy.port}: every client of the "
                           "proxy can register a worker that receives other users' prompts, or delete the real "
                           "workers (TensorRT-LLM's HttpClusterStorageServer has no authentication)")
        uri = f"{trtllm.MEMBERSHIP_URI_SCHEMES['http']}://<node0>:{r.proxy.port}"
    if unauthenticated:
        if not m.accept_unauthenticated_storage:
            c.add("membership.storage" if m.storage == "http" else "membership.etcd_tls_dir", unauthenticated,
                  "use storage: etcd (the job's own etcd, opened only by the run's certificate)"
                  + (" or give etcd_tls_dir" if m.etcd_endpoint else "")
                  + ", or membership.enabled: false (static urls); or set membership.accept_unauthenticated_storage:"
                    " true to accept the risk")
        else:
            c.warnings.append(f"membership: {unauthenticated}; accepted by membership.accept_unauthenticated_storage")
    gateways: tuple[tuple[str, int], ...] = ()
    if etcd is not None and etcd.tls_dir is not None:
        # one loopback port per component, from etcd_port + 2 on: clear of every port the plan uses (all nodes share
        # one host under tk launch --local)
        names = ["proxy", *(s.name for s in servers)]
        ports = [m.etcd_port + 2 + i for i in range(len(names))]
        clash = sorted(set(ports) & taken)
        if clash or ports[-1] > 65535:
            c.add("membership.etcd_port", f"the etcd gateways would take ports {ports[0]}-{ports[-1]}, which "
                  f"{'collide with ' + ', '.join(map(str, clash[:5])) if clash else 'run past 65535'}",
                  "choose another membership.etcd_port (the gateways use the ports after etcd_port + 1)")
        gateways = tuple(zip(names, ports))
    name = m.cluster_name or r.name
    return MembershipPlan(storage=m.storage, cluster_uri=uri, cluster_name=name,
                          heartbeat_interval_s=m.heartbeat_interval_s, inactive_timeout_s=m.inactive_timeout_s,
                          minimal_context=minimal["ctx"], minimal_generation=minimal["gen"],
                          worker_key_prefix=trtllm.MEMBERSHIP_KEY_PREFIX.format(cluster_name=name),
                          etcd=etcd, gateways=gateways, unauthenticated=bool(unauthenticated))


# --- speculative decoding, the 1.3 transceiver, the proxy ---------------------------------------------------------

# What TensorRT-LLM's LLM args require of a speculative method that drafts with its own weights (llm_args.py
# @ 3e906a0ed7c66ed4df90aa4856bf1a6c98ca7df6: EagleDecodingConfig.__init__ "max_draft_len is required for Eagle",
# validate() "Draft model must be provided for EAGLE"; BaseLlmArgs.validate_speculative_config asserts
# speculative_model_dir for Eagle ("Path to EAGLE3 weights must be specified.") and DraftTarget ("Path to draft model
# must be specified.") and max_draft_len > 0 for both).
DRAFT_WEIGHTS_METHODS = ("Eagle", "Eagle3", "Draft_Target", "DraftTarget")


def check_speculative(r: Recipe, target: llm_args.Target, model: ModelSpec, c: Collector) -> None:
    sp = r.speculative
    other = sp.decoding_type is not None or sp.model is not None or sp.max_draft_len is not None
    if sp.mtp_layers and other:
        c.add("speculative.decoding_type", "speculative.mtp_layers and another method's fields are both set; "
              "TensorRT-LLM runs one speculative_config", "keep mtp_layers (MTP) or the other method's fields")
        return
    if not other and not sp.options:
        return
    if sp.decoding_type is None and not sp.mtp_layers:
        c.add("speculative.decoding_type", "speculative.model, max_draft_len or options need a decoding_type",
              "set speculative.decoding_type, e.g. Eagle3")
        return
    if sp.decoding_type == "MTP":
        c.add("speculative.decoding_type", "MTP is set with speculative.mtp_layers (tk sizes the KV of the MTP "
              "layers from it)", "remove decoding_type and set speculative.mtp_layers")
        return
    bad = llm_args.value_status(target, "speculative_config.decoding_type", sp.decoding_type)
    if bad is not None and bad.verdict is llm_args.Verdict.ABSENT:
        c.add("speculative.decoding_type", bad.reason, bad.fix)
    elif bad is not None:
        c.warnings.append(f"speculative.decoding_type: {bad.reason}")
    _check_speculative_options(sp, target, c)
    if sp.mtp_layers:
        return
    if sp.decoding_type in DRAFT_WEIGHTS_METHODS:
        if sp.model is None:
            c.add("speculative.model", f"{sp.decoding_type} drafts with its own weights, and TensorRT-LLM refuses a "
                  "speculative_config without them (llm_args.py: \"Path to EAGLE3 weights must be specified.\" / "
                  "\"Path to draft model must be specified.\")", "set speculative.model to the draft weights")
        if sp.max_draft_len is None and "max_draft_len" not in sp.options:
            c.add("speculative.max_draft_len", f"TensorRT-LLM requires max_draft_len for {sp.decoding_type} "
                  "(llm_args.py: \"max_draft_len is required for Eagle\"; max_draft_len > 0)",
                  "set speculative.max_draft_len, e.g. 3")
    c.warnings.append(f"speculative decoding {sp.decoding_type}: tk sizes the KV transfer for {model.name}'s own "
                      "layers; a draft layer kept in the same KV cache (Eagle3 one-model) is not counted in tk's "
                      "KV bytes or validation payloads")


def _check_speculative_options(sp, target: llm_args.Target, c: Collector) -> None:
    stopped: list[str] = []
    for dotted, _key, _value in llm_args.walk_options(sp.options, "speculative_config"):
        rel = dotted.removeprefix("speculative_config.")
        if any(dotted.startswith(s + ".") for s in stopped):
            continue
        field = ("speculative", "options", *rel.split("."))
        if rel in ("decoding_type", "speculative_model", "speculative_model_dir", "num_nextn_predict_layers"):
            c.add(field, f"speculative.options.{rel} is written from the speculative section itself",
                  "use speculative.decoding_type / model / mtp_layers")
            continue
        st = llm_args.status(target, dotted)
        if st.verdict is llm_args.Verdict.ABSENT:
            c.add(field, st.reason, st.fix)
            stopped.append(dotted)
        elif st.verdict is llm_args.Verdict.UNSURE:
            c.warnings.append(f"speculative.options.{rel}: {st.reason}")


# cache_transceiver_config keys the recipe's kv_transfer section writes to both roles (a role's extra_options may set
# them too, for that role only): key -> kv_transfer field. The backend and buffer are tk's own (TK_OWNED_OPTIONS).
TRANSCEIVER_FIELDS = {"transceiver_runtime": "runtime", "kv_transfer_poll_interval_ms": "poll_interval_ms",
                      "kv_cache_bounce_size_mb": "bounce_size_mb", "enable_pipelined_transfer": "pipelined"}


def check_transceiver(r: Recipe, target: llm_args.Target, merged: dict[str, dict], c: Collector) -> None:
    """cache_transceiver_config of each role, after extra_options are merged: the 1.3 fields' values and
    enable_pipelined_transfer's preconditions, each the check TensorRT-LLM makes at start-up:
      - tensorrt_llm/_torch/pyexecutor/kv_cache_transceiver.py (resolve_cache_transceiver_config and
        create_kv_cache_transceiver of the stored version with enable_pipelined_transfer; the Python-transceiver
        NIXL rule also @ 00620eb025e7c24895986e1042380bd1be4426d9): pipelined with transceiver_runtime CPP, or with
        a backend other than NIXL; transceiver_runtime PYTHON with a backend other than NIXL; pipelined with
        kv_cache_bounce_size_mb > 0; pipelined without enable_chunked_prefill; pipelined on a context server with
        pipeline_parallel_size != 1;
      - tensorrt_llm/_torch/disaggregation/transceiver.py (KvCacheTransceiverV2._resolve_pipelined_transfer):
        context parallelism; block reuse with a block_reuse_config.policy other than all_reusable."""
    selectors = trtllm.BACKEND_SELECTORS
    for title, opts in merged.items():
        ct = opts.get("cache_transceiver_config")
        if not isinstance(ct, dict):
            continue

        def blame(key: str, title: str = title) -> tuple:
            given = getattr(r, title).extra_options.get("cache_transceiver_config")
            in_extra = isinstance(given, dict) and key in given
            if key in TRANSCEIVER_FIELDS and not in_extra:
                return ("kv_transfer", TRANSCEIVER_FIELDS[key])
            return (title, "extra_options", "cache_transceiver_config", key)

        for key, recipe_field in TRANSCEIVER_FIELDS.items():
            if getattr(r.kv_transfer, recipe_field) is None or blame(key)[0] != "kv_transfer":
                continue  # set in extra_options (check_extra_options looked at it) or not at all
            st = llm_args.status(target, f"cache_transceiver_config.{key}")
            if st.verdict is llm_args.Verdict.ABSENT:
                c.add(blame(key), st.reason, st.fix)
            elif st.verdict is llm_args.Verdict.UNSURE:
                c.warnings.append(f"{title} cache_transceiver_config.{key}: {st.reason}")
            bad = llm_args.value_status(target, f"cache_transceiver_config.{key}", ct[key])
            if bad is not None and bad.verdict is llm_args.Verdict.ABSENT:
                c.add(blame(key), bad.reason, bad.fix)
            elif bad is not None:
                c.warnings.append(f"{title} cache_transceiver_config.{key}: {bad.reason}")
        backend = ct.get("backend")
        env = {**r.kv_transfer.env, **getattr(r, title).env}
        if backend == "DEFAULT":  # resolve_cache_transceiver_config: NIXL unless a legacy selector says otherwise
            backend = next((b for b, var in selectors.items() if env.get(var) == "1"), "NIXL")
        runtime = ct.get("transceiver_runtime")
        where = "tensorrt_llm/_torch/pyexecutor/kv_cache_transceiver.py"
        if runtime == "PYTHON" and backend not in (None, "NIXL"):
            c.add(blame("transceiver_runtime"), f"the Python transceiver (transceiver_runtime PYTHON) supports only "
                  f"the NIXL backend, and the {title} servers' is {backend}: TensorRT-LLM refuses it at start-up "
                  f"(\"Python transceiver currently only supports the NIXL backend\", {where})",
                  "set kv_transfer.backend: NIXL, or transceiver_runtime CPP")
        if ct.get("enable_pipelined_transfer") is not True or llm_args.status(
                target, "cache_transceiver_config.enable_pipelined_transfer").verdict is llm_args.Verdict.ABSENT:
            continue
        reasons = []
        if runtime == "CPP":
            reasons.append(("transceiver_runtime", "transceiver_runtime is CPP, which has no pipelined transfer",
                            "set kv_transfer.runtime: PYTHON (or leave it unset)"))
        elif backend != "NIXL":
            reasons.append(("enable_pipelined_transfer", f"the backend is {backend}; pipelined transfer runs on the "
                            "Python transceiver, which needs NIXL", "set kv_transfer.backend: NIXL"))
        if _number(ct.get("kv_cache_bounce_size_mb"), 0) > 0:
            reasons.append(("kv_cache_bounce_size_mb", "kv_cache_bounce_size_mb must be 0 with pipelined transfer",
                            "set kv_transfer.bounce_size_mb: 0"))
        if opts.get("enable_chunked_prefill") is not True:
            reasons.append(("enable_pipelined_transfer", "pipelined transfer needs enable_chunked_prefill",
                            f"set {title}.extra_options.enable_chunked_prefill: true"))
        if title == "context" and _number(opts.get("pipeline_parallel_size"), 1) != 1:
            reasons.append(("enable_pipelined_transfer", "pipelined transfer needs pipeline_parallel_size 1 on the "
                            "context servers", "set context.pp: 1"))
        if _number(opts.get("context_parallel_size"), 1) > 1:
            reasons.append(("enable_pipelined_transfer", "pipelined transfer does not support context parallelism",
                            f"remove {title}.extra_options.context_parallel_size"))
        kvc = opts.get("kv_cache_config") or {}
        policy = _dig(kvc, ("block_reuse_config", "policy")) if isinstance(kvc, dict) else None
        if isinstance(kvc, dict) and kvc.get("enable_block_reuse") and policy not in (None, "all_reusable"):
            reasons.append(("enable_pipelined_transfer", f"block reuse with policy {policy} defers commits that "
                            "pipelined chunks race (only all_reusable is supported)",
                            "use block_reuse_config.policy: all_reusable or turn block reuse off"))
        for key, why, fix in reasons:
            c.add(blame(key), f"{title} servers: enable_pipelined_transfer is refused by TensorRT-LLM at start-up: "
                  f"{why} ({where}; tensorrt_llm/_torch/disaggregation/transceiver.py)", fix)


def _number(value, default: int) -> int | float:
    """``value`` where it is a number (check_extra_options reported any other kind), else ``default``."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def check_proxy(r: Recipe, version: trtllm.TrtllmVersion, c: Collector) -> None:
    """Routers the line's create_router knows (an unknown type raises "Unsupported router type", serve/router.py),
    router arguments, the proxy's environment."""
    for field, router in (("proxy.context_router", r.proxy.context_router),
                          ("proxy.generation_router", r.proxy.generation_router)):
        if router not in version.routers:
            c.add(field, f"TensorRT-LLM {version.line}'s create_router has no router {router!r} and raises "
                  "\"Unsupported router type\" at start-up (tensorrt_llm/serve/router.py)",
                  f"use one of {', '.join(version.routers)}, or target a TensorRT-LLM line that has it")
    tpb = r.kv_transfer.tokens_per_block
    for field, args in (("proxy.context_router_args", r.proxy.context_router_args),
                        ("proxy.generation_router_args", r.proxy.generation_router_args)):
        if "type" in args:
            c.add(f"{field}.type", "the router type is proxy.context_router / generation_router",
                  f"remove {field}.type")
        if "tokens_per_block" in args and args["tokens_per_block"] != tpb:
            c.warnings.append(f"{field}.tokens_per_block = {args['tokens_per_block']} differs from "
                              f"kv_transfer.tokens_per_block = {tpb}: the cache-aware router hashes blocks of another "
                              "size than the servers', so its block hashes never match (disagg_utils.py @ 0228a712)")
    for name in r.proxy.env:
        if name.startswith(("TRTLLM_", "TLLM_")) and llm_args.env_reader(version.line, name) is None:
            c.warnings.append(f"proxy.env.{name}: TensorRT-LLM {version.line} does not read {name} as far as tk "
                              "knows; it is set anyway")
