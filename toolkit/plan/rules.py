"""The rules a recipe must keep, checked on the derived numbers. Each violation points at the recipe line to change."""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path

from toolkit.errors import Violation
from toolkit.facts import trtllm
from toolkit.facts.engines import EngineProfile
from toolkit.facts.hardware import GPU_FIGURES, TransportProfile
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
        self.violations.append(self.loaded.violation(path, message, fix))


def check_version_features(r: Recipe, version: trtllm.TrtllmVersion, engine: EngineProfile,
                           transport: TransportProfile, c: Collector) -> None:
    kv = r.kv_transfer
    if kv.backend not in version.cache_transceiver_backends:
        c.add("kv_transfer.backend",
              f"backend {kv.backend} is not accepted by TensorRT-LLM {version.line}",
              f"use one of {', '.join(version.cache_transceiver_backends)} or a newer trtllm_version")
    if kv.dtype not in version.kv_dtypes:
        c.add("kv_transfer.dtype", f"kv dtype {kv.dtype} is not accepted by TensorRT-LLM {version.line}",
              f"use one of {', '.join(version.kv_dtypes)}")
    if "kv_transfer_timeout_ms" in kv.model_fields_set and kv.kv_transfer_timeout_ms is not None \
            and "kv_transfer_timeout_ms" not in version.cache_transceiver_keys:
        c.add("kv_transfer.kv_transfer_timeout_ms",
              f"TensorRT-LLM {version.line} has no kv_transfer_timeout_ms in cache_transceiver_config",
              "remove the field, or target a newer trtllm_version")
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
    for field_name in ("context_router", "generation_router"):
        router = getattr(r.proxy, field_name)
        if router not in version.routers:
            c.add(f"proxy.{field_name}",
                  f"TensorRT-LLM {version.line} has no router type {router!r} (create_router in "
                  f"tensorrt_llm/serve/router.py answers 'Unsupported router type'); the conversation router "
                  f"arrived with PR #12526 (2026-03)",
                  f"use one of {', '.join(version.routers)}, or a trtllm_version that has it")
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
        if role.attention_dp:
            if not model.is_moe:
                c.add(f"{title}.attention_dp",
                      f"attention data parallelism applies to MoE models; {model.name} is dense",
                      "set attention_dp: false")
            elif role.tp < 2:
                c.add(f"{title}.attention_dp", "attention data parallelism needs tp >= 2 (one rank per DP group)",
                      "raise tp or set attention_dp: false")
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
        c.add("generation.max_num_tokens",
              f"generation servers prefill prompts of up to {local_prefill} tokens themselves under conditional "
              f"disaggregation, but max_num_tokens is {r.generation.max_num_tokens}, so such prompts are refused",
              f"raise generation.max_num_tokens to at least {ceil_to(r.kv_transfer.tokens_per_block, local_prefill)}"
              " or lower proxy.conditional_max_local_prefill_length")


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
    "kill-on-bad-exit": "tk", "mpi": "engine (tk passes --mpi=pmix for TensorRT-LLM)",
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
    for title, role, opts in (("context", r.context, ctx_opts), ("generation", r.generation, gen_opts)):
        mnt = opts["max_num_tokens"]
        if not _is_kind(mnt, "positive integer", None):
            continue  # reported by check_extra_options
        if mnt % tpb:
            c.add(f"{title}.max_num_tokens", f"{mnt} is not a multiple of tokens_per_block={tpb}",
                  f"use {ceil_to(tpb, mnt)}")
        if title == "context" and mnt < longest and not opts.get("enable_chunked_prefill"):
            c.add("context.max_num_tokens",
                  f"{mnt} tokens cannot hold the longest admitted input ({longest} tokens) in one prefill",
                  f"use at least {ceil_to(tpb, longest)}, or enable chunked prefill in context.extra_options")


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
    user = {**r.kv_transfer.env, **getattr(r, role).env}
    owned = trtllm.TK_OWNED_ENV
    for name in user:
        if name in owned:
            src = "kv_transfer.env" if name in r.kv_transfer.env else f"{role}.env"
            c.add(f"{src}.{name}", f"tk sets {name} from {owned[name]}",
                  f"change {owned[name]} instead of setting {name}")
        elif name.startswith("TRTLLM_") and name not in version.env_vars:
            src = "kv_transfer.env" if name in r.kv_transfer.env else f"{role}.env"
            c.add(f"{src}.{name}", f"TensorRT-LLM {version.line} does not read {name}",
                  "check the name (tk knows: " + ", ".join(sorted(v for v in version.env_vars
                                                                   if v[:12] == name[:12])[:4]) + ")")
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
    def pos_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 < v <= _INT_MAX

    if kind == "positive integer":
        return pos_int(value)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _INT_MAX
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "fraction":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            and 0 < value <= 1
    if kind == "kv dtype":
        return value in version.kv_dtypes
    if kind == "mapping":
        return isinstance(value, dict)
    if kind == "mapping?":
        return value is None or isinstance(value, dict)
    if kind == "list of positive integers":
        return isinstance(value, list) and all(pos_int(v) for v in value)
    raise AssertionError(kind)


def _kind_text(kind: str, version) -> str:
    if kind == "kv dtype":
        return f"a KV dtype TensorRT-LLM {version.line} accepts ({', '.join(version.kv_dtypes)})"
    if kind == "fraction":
        return "a fraction in (0, 1]"
    if kind == "mapping?":
        return "a mapping (or null)"
    if kind in ("positive integer", "integer"):
        return f"a{'' if kind == 'integer' else ' positive'} integer (at most {_INT_MAX})"
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
                        c: Collector) -> None:
    """A role's extra_options: keys the version accepts, values of the right kind, nothing tk owns overridden.

    ``derived`` is what tk writes before extra_options are merged in. One violation per key at most.
    """
    implied = {**trtllm.TK_IMPLIED_OPTIONS, "model": role.model_path or r.model_path or r.model}

    def check(path: tuple, value, allowed, what: str) -> None:
        key = path[-1]
        dotted = ".".join(str(p) for p in path)
        field = (title, "extra_options", *path)
        where = f"{title}.extra_options.{dotted}"
        if not isinstance(key, str):
            c.add(field, f"option name {_show(key)} is not a string", "write the option name as text")
            return
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            c.add(field, f"TensorRT-LLM {version.line} has no {what} {key!r}: it refuses unknown keys at "
                  f"start-up{hint}", f"rename it to {close[0]!r}" if close else
                  f"remove {where}, or use a trtllm_version that has it")
            return
        owner = trtllm.TK_OWNED_OPTIONS.get(dotted)
        owner = owner.replace("{role}", title) if owner else None
        instead = f"set {owner} instead and remove {where}" if owner else ""
        kind = trtllm.OPTION_KINDS.get(dotted)
        if kind and not _is_kind(value, kind, version):
            c.add(field, f"{_show(value)} is not {_kind_text(kind, version)}",
                  instead or f"give {dotted} {_kind_text(kind, version)}")
            return
        if owner:
            tk_value = implied[key] if key in implied and len(path) == 1 else _dig_or_absent(derived, path)
            if not _same(value, tk_value):
                omitted = tk_value is _ABSENT and any(f.dotted == dotted for f in trtllm.unverified_options(version))
                what_tk = (f"tk writes {dotted} = {_show(tk_value)} from {owner}" if tk_value is not _ABSENT
                           else f"tk leaves {dotted} out for TensorRT-LLM {version.line}: {owner} is the engine's "
                                "default, and whether that line accepts the key is unverified" if omitted
                           else f"tk writes no {dotted} for this recipe (it follows {owner})")
                c.add(field, f"{what_tk}; extra_options would change it to {_show(value)}", instead)
                return
        section = trtllm.OPTION_SECTIONS.get(dotted)
        if section and isinstance(value, dict) and not owner:
            if key == "speculative_config" and value.get("decoding_type") != "MTP":
                return
            for sub, sub_value in value.items():
                check((*path, sub), sub_value, getattr(version, section), f"{key} field")

    for key, value in role.extra_options.items():
        check((key,), value, version.llm_api_keys, "LLM-API option")


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
    for field, spec, title in (("min_context", r.context, "context"), ("min_generation", r.generation, "generation")):
        minimum = getattr(sv, field)
        if minimum > spec.instances:
            c.add(f"supervision.{field}",
                  f"{field} is {minimum} but the recipe has {spec.instances} {title} instance(s): the run could "
                  "never meet it", f"set it to at most {spec.instances}, or add {title} instances")


def check_membership(r: Recipe, version: trtllm.TrtllmVersion, servers, c: Collector):
    """The membership TensorRT-LLM keeps (disagg_cluster), or None where the line lacks it or the recipe turns it off.
    Rules: the line has it (and the storage); inactive_timeout_s > heartbeat_interval_s (TensorRT-LLM's
    DisaggClusterWorker silently disables the heartbeat otherwise, and every worker then expires); an etcd
    endpoint only with etcd storage, and the etcd the job starts on ports no server or the proxy uses. minimal_instances are
    supervision.min_context / min_generation."""
    from toolkit.plan.model import EtcdPlan, MembershipPlan
    m = r.membership
    if m.enabled is False or (m.enabled == "auto" and not version.cluster_storages):
        return None
    if not version.cluster_storages:
        c.add("membership.enabled", f"TensorRT-LLM {version.line} has no disagg_cluster membership (it came with the "
              "1.2 line, PR #7869)", "set membership.enabled: auto (or false), or target trtllm_version 1.2")
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
    if m.storage == "etcd":
        if m.etcd_endpoint:
            etcd = EtcdPlan(endpoint=m.etcd_endpoint, started_by_job=False, node=None, port=None, peer_port=None)
        else:
            taken = {r.proxy.port} | {s.port for s in servers if 0 in s.nodes} | \
                    {p for s in servers if s.first_node == 0 for _, p in s.internal_ports}
            peer = m.etcd_port + 1
            for port, what in ((m.etcd_port, "client"), (peer, "peer")):
                if port in taken:
                    c.add("membership.etcd_port", f"the etcd the job starts would take port {port} ({what}) on node 0, "
                          f"which a server or the proxy already uses", "choose another membership.etcd_port")
            etcd = EtcdPlan(endpoint=f"<node0>:{m.etcd_port}", started_by_job=True, node=0, port=m.etcd_port,
                            peer_port=peer)
        uri = f"{trtllm.MEMBERSHIP_URI_SCHEMES['etcd']}://{etcd.endpoint}"
    else:
        uri = f"{trtllm.MEMBERSHIP_URI_SCHEMES['http']}://<node0>:{r.proxy.port}"
    return MembershipPlan(storage=m.storage, cluster_uri=uri, cluster_name=m.cluster_name,
                          heartbeat_interval_s=m.heartbeat_interval_s, inactive_timeout_s=m.inactive_timeout_s,
                          minimal_context=minimal["ctx"], minimal_generation=minimal["gen"],
                          worker_key_prefix=trtllm.MEMBERSHIP_KEY_PREFIX.format(cluster_name=m.cluster_name),
                          etcd=etcd)
