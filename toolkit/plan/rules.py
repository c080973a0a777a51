"""The rules a recipe must keep, checked on the derived numbers. Each violation points at the recipe line to change."""

from __future__ import annotations

import difflib
import re
import signal
from typing import Any, Callable

from toolkit.errors import Violation
from toolkit.facts import llm_args, options, transceiver, trtllm
from toolkit.facts.engines import ENGINES
from toolkit.facts.hardware import GPU_FIGURES, TRANSPORT_PROFILES
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


def check_version_features(d, c: Collector) -> None:
    """The line has the backend, the KV dtype, the transceiver's timeout and the transport's NIXL backend; the
    transport exists for the GPU; the engine can move KV with the backend."""
    r, version, engine, transport, target = d.recipe, d.version, d.engine, d.transport, d.target
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


def check_unverified_options(d, c: Collector) -> None:
    """Keys still written whose acceptance by this line is unverified (options.omit_unverified_defaults left
    them because their value is not TensorRT-LLM's default): a warning naming the value and the source."""
    version, merged = d.version, d.merged
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


def check_emulation(d, c: Collector) -> None:
    """`standin.emulate` (toolkit.plan.derive.emulation_of): only for an engine that can emulate timing (its profile
    names the env it reads), with a model tk can resolve, a precision the GPU has and, where it names one, a
    validation report that is there."""
    r = d.recipe
    emu = r.standin.emulate if r.standin else None
    if emu is None:
        return
    if ENGINES[r.engine].emulate_env_prefix is None:
        c.add("standin.emulate", f"engine {r.engine} ({ENGINES[r.engine].label}) runs for real: emulated timing is "
              "the CPU stand-in's rehearsal model and would misstate this engine's performance",
              "set engine: standin to rehearse with emulated timing, or remove standin.emulate")
        return
    if d.emulation.error is not None:
        c.add("standin.emulate.model", str(d.emulation.error),
              d.emulation.error.fix or "use a name from `tk recipes --models` or a directory with config.json")
        return
    if emu.precision == "fp8" and GPU_FIGURES[emu.gpu].fp8_tflops is None:
        c.add("standin.emulate.precision", f"{emu.gpu} has no FP8 tensor cores", "use precision: bf16")
        return
    if emu.kv_validation is not None and d.emulation.kv_report is None:
        c.add("standin.emulate.kv_validation", f"{emu.kv_validation}: no `tk validate cluster` run directory or "
              "report.json there", "give a validate run's directory, or remove it to use the transport's nominal GB/s")


def check_parallelism(d, c: Collector) -> None:
    r, model = d.recipe, d.model
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
    if local_prefill is not None and r.proxy.generation_router != trtllm.Router.KV_CACHE_AWARE:
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


def check_placement(d, c: Collector) -> None:
    r, transport, servers, node_count = d.recipe, d.transport, d.servers, d.node_count
    ctx_nodes, gen_nodes = (len({n for s in role.instances for n in s.nodes}) for role in d.roles)
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


def check_internal_ports(d, c: Collector) -> None:
    """Each instance's internal ports (facts.trtllm.INTERNAL_PORT_ENVS) stay clear of every HTTP port."""
    r, servers = d.recipe, d.servers
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


def check_slurm_signal(d, c: Collector) -> None:
    """The job's orchestrator ends the deployment cleanly on every signal whose default ends a process
    (orchestrator/job.py ENDING_SIGNALS): --signal=B:SIG@T is a clean end T seconds before the time limit. Without
    B:, Slurm signals every job step instead (the servers) and not the batch shell: a warning, as what a server does
    with the signal is the engine's business. The signals are derive.slurm_signals' reading of cluster.sbatch_args."""
    from orchestrator.job import ENDING_SIGNALS

    for s in d.slurm_signals:
        arg, sig, seconds = s.arg, s.name, s.seconds
        if sig is None:
            c.warnings.append(f"cluster.sbatch_args {arg}: not a signal Slurm's --signal=[{{R|B}}:]SIG[@TIME] names; "
                              "sbatch refuses it")
        elif not s.batch:
            c.warnings.append(
                f"cluster.sbatch_args {arg}: Slurm sends {sig} to every job step, the servers, and not to the batch "
                f"shell; a server that does not handle {sig} ends, and supervision restarts it. Write "
                f"--signal=B:{sig[3:]}@{seconds} to have the job's orchestrator end the deployment cleanly "
                f"{seconds} s before the time limit")
        elif int(getattr(signal, sig)) not in ENDING_SIGNALS:
            c.warnings.append(
                f"cluster.sbatch_args {arg}: the job's orchestrator does not end on {sig} "
                + ("(it cannot be handled)" if sig in ("SIGKILL", "SIGSTOP", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE")
                   else "(SIGUSR2 prints every thread's stack into the job's output)" if sig == "SIGUSR2"
                   else "(ignored: a write error, not an end)" if sig in ("SIGPIPE", "SIGXFSZ")
                   else "(it stops or continues a process)")
                + f"; use --signal=B:USR1@{seconds} (or TERM) to end the deployment cleanly before the time limit")


def check_slurm_args(d, c: Collector) -> None:
    r = d.recipe
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


def check_role_options(d, c: Collector) -> None:
    r, ctx_opts, gen_opts = d.recipe, d.context.options, d.generation.options
    tpb = r.kv_transfer.tokens_per_block
    longest = longest_input(r)
    for title, _role, opts in (("context", r.context, ctx_opts), ("generation", r.generation, gen_opts)):
        mnt = opts["max_num_tokens"]
        if not _count(mnt):
            continue  # reported by check_extra_options
        # No rule ties max_num_tokens to tokens_per_block: TensorRT-LLM has none (llm_args.py only warns when
        # max_batch_size > max_num_tokens, validate_runtime_args @ 3e906a0e); NVIDIA runs generation servers with
        # max_num_tokens 1, 4, 16... (NVIDIA/srt-slurm recipes/trtllm @ c88ef731).
        msl = opts.get("max_seq_len")
        need = longest + (1 if title == "context" else r.traffic.max_output_len)
        if _count(msl) and msl < need:
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


def check_agreement(d, c: Collector) -> None:
    """What TensorRT-LLM checks when a generation server connects to a context server."""
    r, ctx, gen = d.recipe, d.context.options, d.generation.options
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

_ABSENT = options.ABSENT  # an option tk does not write for this plan


def _show(value) -> str:
    text = {_ABSENT: "nothing", None: "null", True: "true", False: "false"}.get(value, None) \
        if value is _ABSENT or value is None or isinstance(value, bool) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _count(value) -> bool:
    """A whole number above 0 (a value check_extra_options did not report as another kind)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


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
                        c: Collector, target: llm_args.Target | None = None) -> None:
    """A role's extra_options, every key at every depth: one TensorRT-LLM accepts (facts.llm_args: refused only
    where every snapshot that speaks for the target lists the section whole and lacks the key, else a warning),
    values of the kind tk reads, a fixed-choice value TensorRT-LLM has, nothing tk owns contradicted.

    ``derived`` is what tk writes before extra_options are merged in. One violation per key at most, and none for
    the keys below a refused one. A value pydantic converts (lax mode: ``enable_chunked_prefill: 1``) is accepted
    with a warning. A key tk owns may repeat tk's value; where tk writes nothing there for this recipe (the recipe
    field is unset: a published speculative_config pasted in), it is written as given, with a warning naming the
    recipe field that is its better home; only a real conflict is refused (``owned_conflict``). The plan writes the
    extra_options as TensorRT-LLM reads them (toolkit.plan.derive).
    """
    target = target or llm_args.Target(version.line)
    implied = {**trtllm.TK_IMPLIED_OPTIONS, "model": role.model_path or r.model_path or r.model}
    stopped: list[str] = []

    def refuse(dotted: str, *violation) -> None:
        c.add(*violation)
        stopped.append(dotted)

    for dotted, key, value in llm_args.walk_options(role.extra_options):
        if any(dotted == s or dotted.startswith(s + ".") for s in stopped):
            continue
        path = tuple(dotted.split("."))
        field = (title, "extra_options", *path)
        where = f"{title}.extra_options.{dotted}"
        if not isinstance(key, str):
            refuse(dotted, field, f"option name {_show(key)} is not a string", "write the option name as text")
            continue
        owner = trtllm.TK_OWNED_OPTIONS.get(dotted)
        owner = owner.replace("{role}", title) if owner else None
        instead = f"set {owner} instead and remove {where}" if owner else ""
        kind = options.kind_of(target, dotted)
        if kind and not kind.check(value):
            converted = kind.lax(value)
            if converted is _ABSENT:
                refuse(dotted, field, f"{_show(value)} is not {kind.describe()}",
                       instead or f"give {dotted} {kind.describe()}")
                continue
            c.warnings.append(f"{where}: {_show(value)} is not {kind.describe()} as written; TensorRT-LLM's "
                              f"pydantic (lax mode) converts it to {_show(converted)}, which tk writes")
            value = converted
        if owner:
            tk_value = owned_value(dotted, derived, implied)
            if _same(value, tk_value):
                stopped.append(dotted)  # tk's value, repeated (pasted from an upstream config): nothing to check
                continue
            conflict = owned_conflict(dotted, value, tk_value, owner, title, role.tp, version)
            if conflict is not None:
                refuse(dotted, field, f"{conflict}; extra_options would change it to {_show(value)}", instead)
                continue
            c.warnings.append(f"{where} is written as given (tk writes no {dotted} for this recipe), and tk neither "
                              f"derives from it nor checks it with the rest of the plan: its better home is {owner}")
        st = llm_args.status(target, dotted)
        if st.verdict is llm_args.Verdict.ABSENT:
            refuse(dotted, field, st.reason,
                   st.fix.replace(dotted, where, 1) if st.fix.startswith("remove") else st.fix)
            continue
        if st.verdict is llm_args.Verdict.UNSURE:
            c.warnings.append(f"{where}: {st.reason}")
        if st.below_opaque:
            stopped.append(dotted)  # TensorRT-LLM takes any keys below it
            continue
        bad = llm_args.value_status(target, dotted, value)
        if bad is not None and bad.verdict is llm_args.Verdict.ABSENT:
            refuse(dotted, field, bad.reason, bad.fix)
        elif bad is not None:
            c.warnings.append(f"{where}: {bad.reason}")


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


def check_kv_events(d, c: Collector) -> None:
    """A role whose servers keep KV-cache events (kv_cache_config.event_buffer_max_size > 0) answers TensorRT-LLM's
    POST /kv_cache_events: unauthenticated, and draining (tensorrt_llm/serve/openai_server.py
    ``get_kv_cache_events`` @ 00057725d9a6591f033e44f31c219e2426827bb7 returns what
    ``KVCacheEventManager::getEvents`` takes out of the queue, ``std::exchange(mEvents, {})``, each stored block with
    its tokens, ``getUniqueTokens()``: cpp/tensorrt_llm/batch_manager/kvCacheEventManager.cpp @
    05843b0a704070599c938655ada137b66143a445). The servers bind every interface of their node: said, never refused
    (TensorRT-LLM accepts it; the proxy's kv_cache_aware router needs it)."""
    for role in d.roles:
        _warn_kv_events(role.title, role.options, c)


def _warn_kv_events(title: str, options: dict, c: Collector) -> None:
    kvc = options.get("kv_cache_config")
    size = kvc.get("event_buffer_max_size") if isinstance(kvc, dict) else None
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        return
    c.warnings.append(
        f"{title}: kv_cache_config.event_buffer_max_size {size} turns on TensorRT-LLM's POST /kv_cache_events on "
        f"every {title} server. It is unauthenticated and drains: each call takes the events it returns, the stored "
        "blocks' token ids included, so any client that reaches a server's port reads the prompts' tokens (other "
        "users' too) and takes the events from the proxy's kv_cache_aware router, which then matches nothing and "
        "routes by load. On a cluster the servers listen on 0.0.0.0 (every interface of their node; loopback in a "
        "local run, open to every user of the machine): keep their ports reachable from the proxy only (a private "
        "network, a firewall) (docs/multiturn.md, \"KV-cache events\")")


def check_supervision(d, c: Collector) -> None:
    """The restart policy's numbers must describe something that can happen."""
    r = d.recipe
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


def check_membership(d, c: Collector) -> None:
    """The membership TensorRT-LLM keeps (disagg_cluster; toolkit.plan.derive.membership_plan). Rules: the line has it
    (and the storage); inactive_timeout_s > heartbeat_interval_s (TensorRT-LLM's DisaggClusterWorker silently
    disables the heartbeat otherwise, and every worker then expires); an etcd endpoint only with etcd storage, and
    the etcd the job starts and its gateways on ports no server or the proxy uses; storage that anyone who reaches
    it can write only when the recipe accepts that (then a warning, which tk launch prints every time).
    minimal_instances are supervision.min_context / min_generation (check_supervision).

    Who can write the storage. TensorRT-LLM's HTTP storage is routes on the proxy's own client port, open to every
    client (HttpClusterStorageServer.add_routes; a bearer token only on 2026 main, not in a release tk targets), and
    its etcd client sends no credentials and speaks no TLS: Etcd3ClusterStorage takes host and port from cluster_uri
    and nothing else (`etcd3.client(host, port)` at NVIDIA/TensorRT-LLM@b3809755; urlparse's hostname and port with
    `secure=False` at @057d4a79, a user:password@ part ignored), tensorrt_llm/serve/cluster_storage.py. So the etcd
    the job starts accepts only clients with a certificate of the run's own authority (--client-cert-auth), and each
    server reaches it through a gateway on its node's loopback that presents that certificate, to connections of
    the gateway's own user only (templates/etcd_gateway.py). An external etcd gets the same through etcd_tls_dir."""
    r, version, plan = d.recipe, d.version, d.membership
    m = r.membership
    if m.enabled is True and not version.cluster_storages:
        c.add("membership.enabled", f"TensorRT-LLM {version.line} has no disagg_cluster membership (it came with the "
              "1.2 line, PR #7869)", "set membership.enabled: false (static urls), or target trtllm_version 1.2")
    if plan is None:
        return
    if m.storage not in version.cluster_storages:
        c.add("membership.storage", f"TensorRT-LLM {version.line} has no {m.storage} cluster storage",
              f"use one of {', '.join(version.cluster_storages)}")
    if m.inactive_timeout_s <= m.heartbeat_interval_s:
        c.add("membership.inactive_timeout_s",
              f"inactive_timeout_s ({m.inactive_timeout_s}) must be greater than heartbeat_interval_s "
              f"({m.heartbeat_interval_s}): TensorRT-LLM's workers then send no heartbeat at all and expire "
              f"after inactive_timeout_s", f"set it to at least {2 * m.heartbeat_interval_s}")
    if m.etcd_endpoint is not None and m.storage != "etcd":
        c.add("membership.etcd_endpoint", "etcd_endpoint is only read with storage: etcd",
              "remove it, or set membership.storage: etcd")
    if m.etcd_tls_dir is not None and (m.storage != "etcd" or m.etcd_endpoint is None):
        c.add("membership.etcd_tls_dir", "etcd_tls_dir is the client certificate of an external etcd "
              "(etcd_endpoint); the etcd the job starts uses the run's own", "remove it, or set etcd_endpoint")
    taken = _check_etcd_ports(d, c)
    unauthenticated = unauthenticated_storage(r)
    if unauthenticated and not m.accept_unauthenticated_storage:
        c.add("membership.storage" if m.storage == "http" else "membership.etcd_tls_dir", unauthenticated,
              "use storage: etcd (the job's own etcd, opened only by the run's certificate)"
              + (" or give etcd_tls_dir" if m.etcd_endpoint else "")
              + ", or membership.enabled: false (static urls); or set membership.accept_unauthenticated_storage:"
                " true to accept the risk")
    elif unauthenticated:
        c.warnings.append(f"membership: {unauthenticated}; accepted by membership.accept_unauthenticated_storage")
    _check_gateway_ports(d, c, taken)


def unauthenticated_storage(r: Recipe) -> str | None:
    """Why the membership storage takes anyone who reaches it, or None (the job's etcd, or one with etcd_tls_dir)."""
    m = r.membership
    if m.storage != "etcd":
        return (f"storage http is served on the proxy's client port {r.proxy.port}: every client of the proxy can "
                "register a worker that receives other users' prompts, or delete the real workers (TensorRT-LLM's "
                "HttpClusterStorageServer has no authentication)")
    if m.etcd_endpoint and m.etcd_tls_dir is None:
        return (f"the etcd at {m.etcd_endpoint} is used without a client certificate (etcd_tls_dir): whoever reaches "
                "it can register workers")
    return None


def _check_etcd_ports(d, c: Collector) -> set[int]:
    """The etcd the job starts: its client and peer ports on node 0 clear of the servers' and the proxy's. Returns
    every port the plan uses."""
    r, servers, etcd = d.recipe, d.servers, d.membership.etcd
    taken = {r.proxy.port} | {s.port for s in servers} | {p for s in servers for _, p in s.internal_ports}
    if etcd is not None and etcd.started_by_job:
        node0 = {s.port for s in servers if 0 in s.nodes} | {r.proxy.port} | \
                {p for s in servers if s.first_node == 0 for _, p in s.internal_ports}
        for port, what in ((etcd.port, "client"), (etcd.peer_port, "peer")):
            if port in node0:
                c.add("membership.etcd_port", f"the etcd the job starts would take port {port} ({what}) on node 0, "
                      f"which a server or the proxy already uses", "choose another membership.etcd_port")
        taken |= {etcd.port, etcd.peer_port}
    return taken


def _check_gateway_ports(d, c: Collector, taken: set[int]) -> None:
    """The etcd gateways (one loopback port per component, from etcd_port + 2 on) clear of every port the plan uses
    (all nodes share one host under tk launch --local)."""
    ports = [p for _, p in d.membership.gateways]
    if ports:
        clash = sorted(set(ports) & taken)
        if clash or ports[-1] > 65535:
            c.add("membership.etcd_port", f"the etcd gateways would take ports {ports[0]}-{ports[-1]}, which "
                  f"{'collide with ' + ', '.join(map(str, clash[:5])) if clash else 'run past 65535'}",
                  "choose another membership.etcd_port (the gateways use the ports after etcd_port + 1)")


# --- speculative decoding, the 1.3 transceiver, the proxy ---------------------------------------------------------

# What TensorRT-LLM's LLM args require of a speculative method that drafts with its own weights (llm_args.py
# @ 3e906a0ed7c66ed4df90aa4856bf1a6c98ca7df6: EagleDecodingConfig.__init__ "max_draft_len is required for Eagle",
# validate() "Draft model must be provided for EAGLE"; BaseLlmArgs.validate_speculative_config asserts
# speculative_model_dir for Eagle ("Path to EAGLE3 weights must be specified.") and DraftTarget ("Path to draft model
# must be specified.") and max_draft_len > 0 for both).
DRAFT_WEIGHTS_METHODS = ("Eagle", "Eagle3", "Draft_Target", "DraftTarget")


def check_speculative(d, c: Collector) -> None:
    r, target, model = d.recipe, d.target, d.model
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


def check_transceiver(d, c: Collector) -> None:
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
    r, target = d.recipe, d.target
    where = "tensorrt_llm/_torch/pyexecutor/kv_cache_transceiver.py"
    for title, opts in d.merged.items():
        ct = opts.get("cache_transceiver_config")
        if not isinstance(ct, dict):
            continue

        def blame(key: str, title: str = title) -> tuple:
            given = getattr(r, title).extra_options.get("cache_transceiver_config")
            in_extra = isinstance(given, dict) and key in given
            if key in TRANSCEIVER_FIELDS and not in_extra:
                return ("kv_transfer", TRANSCEIVER_FIELDS[key])
            return (title, "extra_options", "cache_transceiver_config", key)

        _check_transceiver_fields(r, target, title, ct, blame, c)
        backend = ct.get("backend")
        if backend == "DEFAULT":  # resolve_cache_transceiver_config: a legacy selector, else the line's default
            env = {**r.kv_transfer.env, **getattr(r, title).env}
            backend = transceiver.resolve_backend(backend, env, target.line, trtllm.BACKEND_SELECTORS)
        runtime = ct.get("transceiver_runtime")
        if runtime == "PYTHON" and backend not in (None, "NIXL"):
            c.add(blame("transceiver_runtime"), f"the Python transceiver (transceiver_runtime PYTHON) supports only "
                  f"the NIXL backend, and the {title} servers' is {backend}: TensorRT-LLM refuses it at start-up "
                  f"(\"Python transceiver currently only supports the NIXL backend\", {where})",
                  "set kv_transfer.backend: NIXL, or transceiver_runtime CPP")
        if ct.get("enable_pipelined_transfer") is not True or llm_args.status(
                target, "cache_transceiver_config.enable_pipelined_transfer").verdict is llm_args.Verdict.ABSENT:
            continue
        for key, why, fix in _pipelined_refusals(title, opts, ct, runtime, backend):
            c.add(blame(key), f"{title} servers: enable_pipelined_transfer is refused by TensorRT-LLM at start-up: "
                  f"{why} ({where}; tensorrt_llm/_torch/disaggregation/transceiver.py)", fix)


def _check_transceiver_fields(r: Recipe, target: llm_args.Target, title: str, ct: dict, blame, c: Collector) -> None:
    """The 1.3 cache_transceiver_config fields the recipe's kv_transfer section writes (TRANSCEIVER_FIELDS): the
    line has the key and the value. One set in extra_options is check_extra_options' to judge."""
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


def _pipelined_refusals(title: str, opts: dict, ct: dict, runtime, backend) -> list[tuple[str, str, str]]:
    """Why TensorRT-LLM refuses enable_pipelined_transfer on the role's servers (check_transceiver's sources): (the
    key to blame, why, the fix) each."""
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
    return reasons


def _number(value, default: int) -> int | float:
    """``value`` where it is a number (check_extra_options reported any other kind), else ``default``."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def check_proxy(d, c: Collector) -> None:
    """Routers the line's create_router knows (an unknown type raises "Unsupported router type", serve/router.py),
    router arguments, the proxy's environment."""
    r, version = d.recipe, d.version
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


# --- options tk owns in extra_options -----------------------------------------------------------------------------

def owned_value(dotted: str, derived: dict, implied: dict):
    """What tk writes at an owned option path (facts.trtllm.TK_OWNED_OPTIONS) for this plan: in the options file
    (``derived``), or on the command line (``implied``: the model, the backend); _ABSENT where it writes nothing."""
    path = tuple(dotted.split("."))
    return implied[path[0]] if len(path) == 1 and path[0] in implied else _dig_or_absent(derived, path)


def owned_conflict(dotted: str, value, tk_value, owner: str, title: str, tp: int,
                   version: trtllm.TrtllmVersion) -> str | None:
    """Why ``value``, given in extra_options at an owned path, contradicts the plan (what tk writes there instead),
    or None where it does not: it repeats tk's value, or tk writes nothing there for this recipe (the recipe leaves
    ``owner`` unset) and TensorRT-LLM takes the value as it is (the plan writes it, with a warning)."""
    if _same(value, tk_value):
        return None
    if tk_value is not _ABSENT:
        return f"tk writes {dotted} = {_show(tk_value)} from {owner}"
    if any(f.dotted == dotted for f in trtllm.unverified_options(version)):
        return (f"tk leaves {dotted} out for TensorRT-LLM {version.line}: {owner} is the engine's default, and "
                "whether that line accepts the key is unverified")
    if dotted == "moe_expert_parallel_size" and isinstance(value, int) and value > 0 and tp % value:
        # a dense model's: TensorRT-LLM's Mapping takes moe_tp = tp // moe_ep and refuses moe_tp x moe_ep != tp
        # ("tp_size must equal to moe_tp_size * moe_ep_size", tensorrt_llm/mapping.py)
        return (f"tk writes no {dotted} for this recipe, and TensorRT-LLM refuses one that does not divide "
                f"{title}.tp = {tp} (tensorrt_llm/mapping.py: tp_size must equal moe_tp_size * moe_ep_size)")
    return None


# --- the rules on derived numbers the derivation only computes ------------------------------------------------

def check_buffer(d, c: Collector) -> None:
    """cache_transceiver_config.max_tokens_in_buffer the recipe gives: a multiple of tokens_per_block, which
    TensorRT-LLM asserts at start-up (TLLM_CHECK(maxNumTokens.value() % tokensPerBlock == 0) in
    CacheTransBufferManager's constructor, cpp/tensorrt_llm/batch_manager/cacheTransBuffer.cpp, e.g. @
    012f8ad2031a113485f7485fd9bfb8aaacded4c5). Smaller than the longest input is judged by the role's transceiver
    (check_transfer_buffer)."""
    from toolkit.plan.sizing import given_buffers

    tpb = d.recipe.kv_transfer.tokens_per_block
    for field, given in given_buffers(d.recipe).values():
        if given % tpb:
            c.add(field, f"{given} is not a multiple of tokens_per_block={tpb}; TensorRT-LLM aborts at start-up "
                  "(TLLM_CHECK(maxNumTokens.value() % tokensPerBlock == 0) in cacheTransBuffer.cpp)",
                  f"use {ceil_to(tpb, given)}, or remove the field and let tk size it")


def check_transfer_buffer(d, c: Collector) -> None:
    """A role's max_tokens_in_buffer below the longest request the recipe admits, judged by what the role's
    transceiver (d.transceiver, toolkit/plan/transceiver.py) does with such a request: refused where TensorRT-LLM
    fails it, i.e. the C++ transceiver over an agent connection (NIXL, MOONCAKE: TLLM_CHECK_WITH_INFO(
    bufferCoverTargetNum == bufferTargetNum, "Agent need all buffer pre-allocated") in CacheFormatter::format,
    cacheFormatter.cpp @ 00c77b30; no dynamic-buffer fallback) on every transceiver the release may run; a warning
    where it moves it through buffers allocated per request (the C++ transceiver over UCX or MPI) or where only some
    of the transceivers the release may run would fail it. One message per recipe field, naming its roles."""
    from toolkit.plan.sizing import given_buffers

    T = transceiver
    r = d.recipe
    tpb = r.kv_transfer.tokens_per_block
    longest = longest_input(r)
    given = given_buffers(r)
    refused: dict[str, list] = {}
    warned: dict[str, list] = {}
    for role in d.transceiver.roles:
        tokens = role.buffer_tokens
        if role.title not in given or tokens >= longest or tokens % tpb:  # misaligned: check_buffer refuses it
            continue
        field = given[role.title][0]
        fails = {rt: T.agent_needs_preallocated_buffer(rt, role.backend) for rt in role.choice.candidates}
        if all(fails.values()):
            refused.setdefault(field, []).append(role)
        elif any(fails.values()) or role.choice.runtime is T.Runtime.CPP:
            warned.setdefault(field, []).append(role)
    for field, roles in refused.items():
        first = roles[0]
        c.add(field, f"{field} = {first.buffer_tokens} is smaller than the longest input the recipe admits ({longest} "
              f"tokens = max_input_len + prefix_len): the {' and '.join(x.title for x in roles)} servers run "
              f"TensorRT-LLM's {T.Runtime.CPP.label} over {first.backend}, whose agent connection takes no request "
              f"larger than its pre-allocated transfer buffer; such a request fails "
              f"({T.agent_buffer_checks([x.title for x in roles])})",
              f"raise it to at least {ceil_to(tpb, longest)} (a multiple of tokens_per_block), remove it and let tk "
              "size it, or lower traffic.max_input_len")
    for field, roles in warned.items():
        first = roles[0]
        titles = " and ".join(x.title for x in roles)
        if first.choice.runtime is T.Runtime.CPP and not T.agent_needs_preallocated_buffer(T.Runtime.CPP, first.backend):
            what = (f"the {titles} servers' {T.Runtime.CPP.label} over {first.backend} moves the KV of longer "
                    "requests through buffers allocated for each request (slower; over UCX both roles' buffers must "
                    "then be equal)")
        else:
            what = (f"which transceiver the {titles} servers run on TensorRT-LLM {d.target} is unverified "
                    f"({first.choice.why}; the snapshots that speak for it select "
                    f"{' or '.join(sorted(x.label for x in first.choice.candidates))}): on the {T.Runtime.CPP.label} "
                    f"over {first.backend} such a request fails ({T.agent_buffer_checks([x.title for x in roles])})")
        c.warnings.append(f"{field} = {first.buffer_tokens} is smaller than the longest input the recipe admits "
                          f"({longest} tokens = max_input_len + prefix_len): {what}")


def check_transceiver_runtimes(d, c: Collector) -> None:
    """The two roles' transceivers (d.transceiver): TensorRT-LLM negotiates nothing, so a context server on one
    runtime cannot send KV to a generation server on the other (a warning: a recipe may mean it, e.g. to see the
    failure); and a release between two snapshots that select different transceivers (which one runs is
    unverified) is named."""
    roles = {role.title: role for role in d.transceiver.roles}
    ctx, gen = roles.get("context"), roles.get("generation")
    if ctx is not None and gen is not None and ctx.choice.runtime is not gen.choice.runtime:
        c.warnings.append(f"the context servers run the {ctx.choice.runtime.label} ({ctx.choice.why}) and the "
                          f"generation servers the {gen.choice.runtime.label} ({gen.choice.why}): TensorRT-LLM "
                          "negotiates nothing, so the two cannot exchange KV; set kv_transfer.runtime once for both "
                          "roles")
    plan = d.transceiver.plan
    if plan is not None and not plan.verified and ctx is not None:
        others = sorted(x.label for x in ctx.choice.candidates if x is not plan.runtime)
        c.warnings.append(f"which cache transceiver TensorRT-LLM {d.target} runs is unverified: tk plans the "
                          f"{plan.runtime.label} ({plan.runtime_reason}), and a snapshot that speaks for it selects "
                          f"the {' or '.join(others)}; set kv_transfer.runtime to choose")


def check_packing(d, c: Collector) -> None:
    """Every instance packs evenly onto the nodes (toolkit.plan.placement)."""
    from toolkit.plan.placement import packing_problem

    for role in d.roles:
        problem = packing_problem(role.spec, d.recipe.cluster.gpus_per_node)
        if problem:
            c.add(f"{role.title}.tp", *problem)


def check_memory(d, c: Collector) -> None:
    """Each role's memory plan (toolkit.plan.memory.check_roles)."""
    from toolkit.plan import memory

    memory.check_roles(d.recipe, d.model, d.engine, d.weights_quant, d.weights_quant_note, d.merged, d.memories,
                       d.extra_layers, c)


def check_load_balancer(d, c: Collector) -> None:
    """moe_config.load_balancer.num_slots (EPLB): a multiple of the role's expert parallelism, which TensorRT-LLM
    asserts at start-up (MoeLoadBalancerConfig.setup: "`num_slots` (...) must be divisible by `ep_size` (...)",
    tensorrt_llm/llmapi/llm_args.py @ 0004396720054fd8e205cbf616f21f0b57c6b412); fewer slots than experts is a
    warning ("There should be at least `num_experts` slots", WideEPMoE, tensorrt_llm/_torch/modules/fused_moe/
    fused_moe_wide_ep.py @ 01303b3887e039d6dda1b5487ec8a94d9ef9db76). The memory plan counts the redundant slots."""
    experts = d.model.num_experts
    for role in d.roles:
        moe = role.options.get("moe_config")
        balancer = moe.get("load_balancer") if isinstance(moe, dict) else None
        slots = balancer.get("num_slots") if isinstance(balancer, dict) else None
        if not experts or not isinstance(slots, int) or isinstance(slots, bool) or slots <= 0:
            continue
        ep = _number(role.options.get("moe_expert_parallel_size"), role.spec.tp)
        field = f"{role.title}.extra_options.moe_config.load_balancer.num_slots"
        if slots % ep:
            c.add(field, f"num_slots {slots} is not a multiple of the {role.title} servers' expert parallelism "
                  f"({ep}): TensorRT-LLM refuses it at start-up (MoeLoadBalancerConfig.setup: num_slots must be "
                  "divisible by ep_size, tensorrt_llm/llmapi/llm_args.py)", f"use a multiple of {ep}, e.g. "
                  f"{ceil_to(ep, max(slots, experts))}")
        elif slots < experts:
            c.warnings.append(f"{field} = {slots} is fewer than {d.model.name}'s {experts} experts: TensorRT-LLM "
                              "expects at least one slot per expert (fused_moe_wide_ep.py)")


def check_role_inputs(d, c: Collector) -> None:
    """Each role's extra_options and extra_serve_args."""
    for role in d.roles:
        check_extra_options(d.recipe, role.title, role.spec, role.derived, d.version, c, d.target)
        check_extra_serve_args(role.title, role.spec, d.version, c)


def check_envs(d, c: Collector) -> None:
    for role in d.roles:
        check_env(d.recipe, role.title, role.env, d.version, c)


def warn_unused(d, c: Collector) -> None:
    """What the recipe sets that this plan does not use, and an image reference pyxis would misread."""
    r = d.recipe
    if r.cluster.mpi and not d.engine.uses_mpi:
        c.warnings.append(f"cluster.mpi {r.cluster.mpi} is not used: the {d.engine.label} starts one process per "
                          "server, without MPI")
    if d.image is not None and d.image.warning:
        c.warnings.append(d.image.warning)


# Every rule, in the order their violations and warnings are listed. Each reads the derivation
# (toolkit.plan.derive.Derivation: a recipe's plan data, derived before any rule runs) and reports to the collector;
# none computes plan data.
RULES: tuple[Callable[[Any, Collector], None], ...] = (
    check_version_features, check_speculative, check_proxy, check_parallelism, check_emulation, check_buffer,
    check_role_inputs, check_load_balancer, check_unverified_options, check_transceiver, check_transceiver_runtimes,
    check_transfer_buffer, check_role_options, check_agreement,
    check_memory, check_packing, check_placement, check_internal_ports, check_slurm_signal, check_slurm_args,
    check_supervision, check_membership, check_envs, check_kv_events, warn_unused,
)
