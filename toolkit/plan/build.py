"""Stage 2: a validated recipe becomes a Plan, or a list of every rule it breaks.

Rules live here because they need derived numbers (buffer sizes, GPU counts, ports,
final option dicts). Each violation points at the recipe line to change.
"""

from __future__ import annotations

import math
from toolkit import __version__, versions
from toolkit.errors import RecipeError, Violation
from toolkit.models import KV_DTYPE_BYTES, ModelError, ModelSpec, resolve_model
from toolkit.plan.hardware import GPU_PEAK_TFLOPS, PREFILL_EFFICIENCY, TRANSPORT_PROFILES, TransportProfile
from toolkit.plan.model import (BufferSizing, EnginePlan, Estimates, KvGeometry, Plan, ProxyPlan, RolePlan,
                           ServerInstance, SlurmPlan)
from toolkit.recipe.loader import LoadedRecipe
from toolkit.recipe.schema import Recipe, RoleSpec

ENGINES = {
    "trtllm": EnginePlan(name="trtllm", serve_command=("trtllm-serve",), launcher=("trtllm-llmapi-launch",),
                         uses_mpi=True, is_standin=False),
    "standin": EnginePlan(name="standin", serve_command=("tk-standin-serve",), launcher=(),
                          uses_mpi=False, is_standin=True),
}

# Environment variables a recipe may not set because tk owns them (it derives them from other fields).
TK_OWNED_ENV = {"UCX_TLS": "kv_transfer.transport", "TRTLLM_NIXL_KVCACHE_BACKEND": "kv_transfer.transport",
                "UCX_NET_DEVICES": "kv_transfer.net_devices"}
BACKEND_SELECTORS = {"NIXL": "TRTLLM_USE_NIXL_KVCACHE", "UCX": "TRTLLM_USE_UCX_KVCACHE",
                     "MPI": "TRTLLM_USE_MPI_KVCACHE", "MOONCAKE": "TRTLLM_USE_MOONCAKE_KVCACHE"}


def ceil_to(multiple: int, value: int) -> int:
    return int(math.ceil(value / multiple) * multiple)


class _Collector:
    def __init__(self, loaded: LoadedRecipe):
        self.loaded = loaded
        self.violations: list[Violation] = []
        self.warnings: list[str] = []

    def add(self, path, message: str, fix: str = "") -> None:
        self.violations.append(self.loaded.violation(path, message, fix))


def build_plan(loaded: LoadedRecipe) -> Plan:
    """Resolve everything; raise RecipeError listing every rule the recipe breaks."""
    r = loaded.recipe
    c = _Collector(loaded)
    version = versions.get(r.trtllm_version)
    engine = ENGINES[r.engine]

    try:
        model = resolve_model(r.model, base_dir=loaded.base_dir)
    except ModelError as exc:
        c.add("model", str(exc), "use a name from `tk recipes --models` or a directory with config.json")
        raise RecipeError(c.violations) from None

    transport = TRANSPORT_PROFILES[r.kv_transfer.transport]
    _check_version_features(r, loaded, version, transport, c)
    _check_parallelism(r, model, c)
    buffer = _size_buffer(r, c)

    ctx_opts = _llm_api_options(r, "context", r.context, model, version, buffer)
    gen_opts = _llm_api_options(r, "generation", r.generation, model, version, buffer)
    _check_role_options(r, ctx_opts, gen_opts, model, c)
    _check_agreement(r, ctx_opts, gen_opts, c)

    gpn = r.cluster.gpus_per_node
    ctx_layout = _layout(r.context, gpn, "context", c)
    gen_layout = _layout(r.generation, gpn, "generation", c)

    port = r.cluster.worker_base_port
    cursor = _GpuCursor(gpn)
    ctx_instances = _place("ctx", r.context, cursor, first_port=port, engine=engine)
    if not r.cluster.share_nodes:
        cursor.next_node()
    gen_instances = _place("gen", r.generation, cursor, first_port=port + len(ctx_instances), engine=engine)
    ctx_nodes = len({n for s in ctx_instances for n in s.nodes})
    gen_nodes = len({n for s in gen_instances for n in s.nodes})
    node_count = 1 + max(n for s in ctx_instances + gen_instances for n in s.nodes)
    if not transport.multi_node and node_count > 1:
        c.add("kv_transfer.transport",
              f"transport 'nvlink-single-node' needs everything on one node, but the plan uses "
              f"{node_count} nodes ({ctx_nodes} context + {gen_nodes} generation)",
              "use infiniband/roce/efa, set cluster.share_nodes: true if the roles fit one node together, "
              "or shrink the roles")
    _check_ports(r, ctx_instances + gen_instances, c)

    env_base = _worker_env(r, version, engine, transport, c)
    ctx_env = {**env_base, **r.context.env}
    gen_env = {**env_base, **r.generation.env}
    for role, env in (("context", ctx_env), ("generation", gen_env)):
        _check_env(r, role, env, version, c)
    if c.violations:
        raise RecipeError(c.violations)

    geometry = _geometry(r, model)
    estimates = _estimates(r, model, geometry, transport)
    ctx_plan = _role_plan("ctx", "context", r.context, r, ctx_layout, ctx_nodes, ctx_instances, ctx_opts, ctx_env,
                          model, engine)
    gen_plan = _role_plan("gen", "generation", r.generation, r, gen_layout, gen_nodes, gen_instances, gen_opts,
                          gen_env, model, engine)
    proxy = _proxy_plan(r, ctx_instances, gen_instances, transport, engine)
    slurm = SlurmPlan(job_name=f"tk-{r.name}", nodes=node_count, gpus_per_node=gpn,
                      partition=r.cluster.partition, account=r.cluster.account, time_limit=r.cluster.time_limit,
                      container_image=r.cluster.container_image, container_mounts=tuple(r.cluster.container_mounts),
                      pending_timeout_s=r.cluster.pending_timeout_s, startup_timeout_s=r.cluster.startup_timeout_s)
    return Plan(
        name=r.name, recipe_file=loaded.file, toolkit_version=__version__, trtllm_version=version.line,
        trtllm_release=version.release, model=model.to_dict(), engine=engine, kv=geometry, buffer=buffer,
        estimates=estimates, context=ctx_plan, generation=gen_plan, proxy=proxy, slurm=slurm,
        node_count=node_count, recipe=r.model_dump(mode="json"), warnings=tuple(c.warnings),
    )


# --- rules -------------------------------------------------------------------------------------

def _check_version_features(r: Recipe, loaded, version, transport: TransportProfile, c: _Collector) -> None:
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
    if r.engine == "standin" and kv.backend in ("MPI", "MOONCAKE"):
        c.add("kv_transfer.backend", f"the CPU stand-in moves KV with NIXL and cannot emulate {kv.backend}",
              "use NIXL, UCX or DEFAULT for stand-in recipes")
    if kv.backend == "DEFAULT":
        c.warnings.append("kv_transfer.backend DEFAULT lets TensorRT-LLM pick from TRTLLM_USE_*_KVCACHE; "
                          "an explicit NIXL or UCX avoids surprises between versions")
    if kv.backend == "MPI":
        c.warnings.append("the MPI KV-cache backend is deprecated in TensorRT-LLM")


def _check_parallelism(r: Recipe, model: ModelSpec, c: _Collector) -> None:
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
    for path in ("proxy.conditional_max_local_prefill_length",):
        if r.proxy.conditional_max_local_prefill_length is not None and r.proxy.generation_router != "kv_cache_aware":
            c.add(path, "conditional disaggregation needs a KV-cache-aware generation router "
                  "(TensorRT-LLM asserts this at start-up)", "set proxy.generation_router: kv_cache_aware")
    local_prefill = r.proxy.conditional_max_local_prefill_length
    if local_prefill is not None and r.generation.max_num_tokens is not None \
            and r.generation.max_num_tokens < local_prefill:
        c.add("generation.max_num_tokens",
              f"generation servers prefill prompts of up to {local_prefill} tokens themselves under conditional "
              f"disaggregation, but max_num_tokens is {r.generation.max_num_tokens}, so such prompts are refused",
              f"raise generation.max_num_tokens to at least {ceil_to(r.kv_transfer.tokens_per_block, local_prefill)}"
              " or lower proxy.conditional_max_local_prefill_length")


def _longest_input(r: Recipe) -> int:
    return r.traffic.max_input_len + r.traffic.prefix_len


def _size_buffer(r: Recipe, c: _Collector) -> BufferSizing:
    tpb = r.kv_transfer.tokens_per_block
    longest = _longest_input(r)
    given = r.kv_transfer.max_tokens_in_buffer
    if given is None:
        value = ceil_to(tpb, longest)
        return BufferSizing(value, f"longest admitted input ({r.traffic.max_input_len} input + "
                                   f"{r.traffic.prefix_len} prefix = {longest} tokens) rounded up to a multiple "
                                   f"of tokens_per_block={tpb}", user_given=False)
    if given % tpb:
        c.add("kv_transfer.max_tokens_in_buffer",
              f"{given} is not a multiple of tokens_per_block={tpb}; TensorRT-LLM aborts at start-up "
              "(maxNumTokens % tokensPerBlock == 0 in cacheTransBuffer.cpp)",
              f"use {ceil_to(tpb, given)}, or remove the field and let tk size it")
    if given < longest:
        c.add("kv_transfer.max_tokens_in_buffer",
              f"{given} is smaller than the longest input the recipe admits ({longest} tokens = max_input_len "
              "+ prefix_len); longer requests fall back to dynamic buffers, which fail with NIXL",
              f"use at least {ceil_to(tpb, longest)}, or remove the field and let tk size it")
    return BufferSizing(given, "given in the recipe", user_given=True)


def _layout(role: RoleSpec, gpn: int, title: str, c: _Collector) -> tuple[int, int]:
    """(nodes per instance, instances per node) or a violation."""
    world = role.tp * role.pp
    if world <= gpn:
        if gpn % world:
            c.add(f"{title}.tp", f"an instance of tp*pp={world} GPUs does not pack evenly into "
                  f"{gpn}-GPU nodes", f"use tp*pp that divides {gpn}")
            return 1, 1
        return 1, gpn // world
    if world % gpn:
        c.add(f"{title}.tp", f"an instance of tp*pp={world} GPUs spans nodes but is not a multiple of "
              f"gpus_per_node={gpn}", f"use tp*pp that is a multiple of {gpn}")
        return math.ceil(world / gpn), 1
    return world // gpn, 1


class _GpuCursor:
    """Hands out GPUs node by node, the way instances are packed onto a Slurm allocation."""

    def __init__(self, gpus_per_node: int):
        self.gpn = gpus_per_node
        self.node = 0
        self.gpu = 0

    def next_node(self) -> None:
        if self.gpu:
            self.node, self.gpu = self.node + 1, 0

    def take(self, world: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if world >= self.gpn:  # whole nodes
            self.next_node()
            span = math.ceil(world / self.gpn)
            nodes = tuple(range(self.node, self.node + span))
            self.node += span
            return nodes, tuple(range(self.gpn))
        if self.gpu + world > self.gpn:
            self.next_node()
        gpus = tuple(range(self.gpu, self.gpu + world))
        node = self.node
        self.gpu += world
        if self.gpu == self.gpn:
            self.node, self.gpu = self.node + 1, 0
        return (node,), gpus


def _place(role_name: str, role: RoleSpec, cursor: _GpuCursor, first_port: int,
           engine: EnginePlan) -> tuple[ServerInstance, ...]:
    world = role.tp * role.pp
    out = []
    for i in range(role.instances):
        nodes, gpus = cursor.take(world)
        ntasks = world if engine.uses_mpi else 1
        out.append(ServerInstance(role=role_name, index=i, nodes=nodes, gpus=gpus, port=first_port + i,
                                  ntasks=ntasks, ntasks_per_node=min(ntasks, cursor.gpn)))
    return tuple(out)


def _check_ports(r: Recipe, servers, c: _Collector) -> None:
    ports = [s.port for s in servers]
    if max(ports) > 65535:
        c.add("cluster.worker_base_port", f"worker ports run up to {max(ports)}, past 65535",
              "lower cluster.worker_base_port")
    if r.proxy.port in ports:
        c.add("proxy.port", f"proxy port {r.proxy.port} collides with a worker port "
              f"({min(ports)}-{max(ports)} are the workers')",
              f"use a port outside {min(ports)}-{max(ports)}, or move cluster.worker_base_port")


def _check_role_options(r: Recipe, ctx_opts: dict, gen_opts: dict, model: ModelSpec, c: _Collector) -> None:
    tpb = r.kv_transfer.tokens_per_block
    longest = _longest_input(r)
    for title, role, opts in (("context", r.context, ctx_opts), ("generation", r.generation, gen_opts)):
        mnt = opts["max_num_tokens"]
        if mnt % tpb:
            c.add(f"{title}.max_num_tokens", f"{mnt} is not a multiple of tokens_per_block={tpb}",
                  f"use {ceil_to(tpb, mnt)}")
        if title == "context" and mnt < longest and not opts.get("enable_chunked_prefill"):
            c.add("context.max_num_tokens",
                  f"{mnt} tokens cannot hold the longest admitted input ({longest} tokens) in one prefill",
                  f"use at least {ceil_to(tpb, longest)}, or enable chunked prefill in context.extra_options")
        for key in role.extra_options:
            if key in ("cache_transceiver_config",):
                c.add(f"{title}.extra_options.{key}", "tk renders cache_transceiver_config from kv_transfer",
                      "set kv_transfer.backend / max_tokens_in_buffer instead")


def _check_agreement(r: Recipe, ctx: dict, gen: dict, c: _Collector) -> None:
    """What TensorRT-LLM checks when a generation server connects to a context server."""
    checks = [
        ("KV dtype", ("kv_cache_config", "dtype"), "kv_transfer.dtype"),
        ("tokens_per_block", ("kv_cache_config", "tokens_per_block"), "kv_transfer.tokens_per_block"),
        ("speculative config", ("speculative_config",), "speculative"),
        ("max_tokens_in_buffer", ("cache_transceiver_config", "max_tokens_in_buffer"),
         "kv_transfer.max_tokens_in_buffer"),
        ("cache transceiver backend", ("cache_transceiver_config", "backend"), "kv_transfer.backend"),
    ]
    for what, path, field in checks:
        a, b = _dig(ctx, path), _dig(gen, path)
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


def _check_env(r: Recipe, role: str, env: dict, version, c: _Collector) -> None:
    user = {**r.kv_transfer.env, **getattr(r, role).env}
    for name in user:
        if name in TK_OWNED_ENV:
            src = "kv_transfer.env" if name in r.kv_transfer.env else f"{role}.env"
            c.add(f"{src}.{name}", f"tk sets {name} from {TK_OWNED_ENV[name]}",
                  f"change {TK_OWNED_ENV[name]} instead of setting {name}")
        elif name.startswith("TRTLLM_") and name not in version.env_vars:
            src = "kv_transfer.env" if name in r.kv_transfer.env else f"{role}.env"
            c.add(f"{src}.{name}", f"TensorRT-LLM {version.line} does not read {name}",
                  "check the name (tk knows: " + ", ".join(sorted(v for v in version.env_vars
                                                                   if v[:12] == name[:12])[:4]) + ")")
    if "NIXL_BACKEND" in env and "TRTLLM_NIXL_KVCACHE_BACKEND" in env:
        c.add(f"{role}.env.NIXL_BACKEND",
              "NIXL_BACKEND together with TRTLLM_NIXL_KVCACHE_BACKEND breaks NIXL endpoint exchange "
              "('Failed to deserialize data rail endpoints')", "remove NIXL_BACKEND; tk sets the TRT-LLM one")
    backend = r.kv_transfer.backend
    for b, var in BACKEND_SELECTORS.items():
        if env.get(var) == "1" and backend not in ("DEFAULT", b):
            c.add(f"{role}.env.{var}", f"{var}=1 contradicts kv_transfer.backend {backend}",
                  f"remove {var}; the backend is set in cache_transceiver_config")


# --- derived values ---------------------------------------------------------------------------

def _llm_api_options(r: Recipe, title: str, role: RoleSpec, model: ModelSpec, version, buffer) -> dict:
    is_ctx = title == "context"
    kv = r.kv_transfer
    tpb = kv.tokens_per_block
    longest = _longest_input(r)
    mtp = r.speculative.mtp_layers
    max_batch = role.max_batch_size or (8 if is_ctx else 256)
    default_mnt = ceil_to(tpb, longest) if is_ctx else ceil_to(tpb, max(max_batch * (1 + mtp), tpb))
    if not is_ctx and r.proxy.conditional_max_local_prefill_length is not None:
        # Under conditional disaggregation short prompts are prefilled on the generation server itself.
        default_mnt = max(default_mnt, ceil_to(tpb, r.proxy.conditional_max_local_prefill_length))
    kv_aware = (r.proxy.context_router if is_ctx else r.proxy.generation_router) == "kv_cache_aware" \
        or (not is_ctx and r.proxy.conditional_max_local_prefill_length is not None)
    opts: dict = {
        "tensor_parallel_size": role.tp,
        "pipeline_parallel_size": role.pp,
    }
    if model.is_moe:
        opts["moe_expert_parallel_size"] = role.ep or role.tp
    opts["enable_attention_dp"] = role.attention_dp
    opts["max_batch_size"] = max_batch
    opts["max_num_tokens"] = role.max_num_tokens or default_mnt
    opts["max_seq_len"] = longest + r.traffic.max_output_len + mtp
    opts["disable_overlap_scheduler"] = True if is_ctx else False
    opts["print_iter_log"] = True
    opts["trust_remote_code"] = True
    if is_ctx or role.cuda_graph is False:
        opts["cuda_graph_config"] = None
    else:
        sizes = sorted({1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch} | {max_batch})
        opts["cuda_graph_config"] = {"enable_padding": True, "batch_sizes": sizes}
    kv_cfg = {
        "tokens_per_block": tpb,
        "free_gpu_memory_fraction": role.free_gpu_memory_fraction or (0.85 if is_ctx else 0.8),
        "dtype": kv.dtype,
        "enable_block_reuse": kv_aware,
    }
    if kv_aware:
        kv_cfg["event_buffer_max_size"] = 1024
    opts["kv_cache_config"] = kv_cfg
    ct = {"backend": kv.backend, "max_tokens_in_buffer": buffer.max_tokens_in_buffer}
    if kv.kv_transfer_timeout_ms is not None and "kv_transfer_timeout_ms" in version.cache_transceiver_keys:
        ct["kv_transfer_timeout_ms"] = kv.kv_transfer_timeout_ms
    opts["cache_transceiver_config"] = ct
    if mtp:
        opts["speculative_config"] = {"decoding_type": "MTP", "num_nextn_predict_layers": mtp}
    return _deep_merge(opts, role.extra_options)


def _deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _worker_env(r: Recipe, version, engine: EnginePlan, transport: TransportProfile, c: _Collector) -> dict:
    env = {"TLLM_LOG_LEVEL": "INFO"}
    env["UCX_TLS"] = transport.ucx_tls_host if engine.is_standin else transport.ucx_tls_gpu
    if r.kv_transfer.net_devices:
        env["UCX_NET_DEVICES"] = r.kv_transfer.net_devices
    env.update(transport.env)
    if transport.multi_node and r.cluster.gpu not in ("GB200",) and not engine.is_standin:
        env["UCX_CUDA_IPC_ENABLE_MNNVL"] = "n"  # servers in different NVLink domains
    if r.kv_transfer.backend == "NIXL" and "TRTLLM_NIXL_KVCACHE_BACKEND" in version.env_vars:
        env["TRTLLM_NIXL_KVCACHE_BACKEND"] = transport.nixl_transport
    if engine.is_standin:
        env["TK_STANDIN_TRTLLM_VERSION"] = version.line
    env.update(r.kv_transfer.env)
    return env


def _geometry(r: Recipe, model: ModelSpec) -> KvGeometry:
    elem = KV_DTYPE_BYTES[r.kv_transfer.dtype]
    per_layer = model.kv_bytes_per_token_per_layer(r.kv_transfer.dtype)
    if model.attention == "mla":
        formula = "(kv_lora_rank + qk_rope_head_dim) x layers x bytes_per_element"

        def per_rank(role: RoleSpec) -> int:  # the latent is replicated, not split, across TP ranks
            return int(per_layer * math.ceil(model.num_layers / role.pp))
    else:
        formula = "2 x layers x kv_heads x head_dim x bytes_per_element"

        def per_rank(role: RoleSpec) -> int:
            heads = max(1, model.num_kv_heads // role.tp)
            return int(2 * heads * model.head_dim * elem * math.ceil(model.num_layers / role.pp))
    per_token = int(per_layer * model.num_layers)
    longest = _longest_input(r)
    return KvGeometry(
        attention=model.attention, num_layers=model.num_layers, bytes_per_element=elem,
        bytes_per_token=per_token, bytes_per_token_per_layer=int(per_layer),
        tokens_per_block=r.kv_transfer.tokens_per_block,
        ctx_bytes_per_token_per_rank=per_rank(r.context), gen_bytes_per_token_per_rank=per_rank(r.generation),
        largest_request_tokens=longest, largest_request_bytes=per_token * longest, formula=formula,
    )


def _estimates(r: Recipe, model: ModelSpec, kv: KvGeometry, transport: TransportProfile) -> Estimates:
    ctx_gpus = r.context.tp * r.context.pp
    peak = GPU_PEAK_TFLOPS[r.cluster.gpu]
    prefill_s = 2 * model.active_params * kv.largest_request_tokens / (ctx_gpus * peak * 1e12 * PREFILL_EFFICIENCY)
    # Each context rank sends its share over its own NIC in parallel.
    transfer_s = kv.ctx_bytes_per_token_per_rank * kv.largest_request_tokens / (transport.nominal_gbps * 1e9)
    return Estimates(transport=transport.name, nominal_gbps=transport.nominal_gbps,
                     largest_request_transfer_ms=round(transfer_s * 1e3, 3),
                     largest_request_prefill_ms=round(prefill_s * 1e3, 3),
                     prefill_efficiency=PREFILL_EFFICIENCY, gpu_peak_tflops=peak,
                     transfer_dominates=transfer_s > prefill_s)


def _role_plan(role_name, title, role: RoleSpec, r: Recipe, layout, node_count, instances, opts, env, model,
               engine) -> RolePlan:
    nodes_per_instance, _ = layout
    args: list[str] = ["--backend", "pytorch", "--tp_size", str(role.tp), "--pp_size", str(role.pp)]
    if model.is_moe:
        args += ["--ep_size", str(opts.get("moe_expert_parallel_size", role.tp))]
    args += list(role.extra_serve_args)
    return RolePlan(role=role_name, title=title, tp=role.tp, pp=role.pp,
                    ep=opts.get("moe_expert_parallel_size"), attention_dp=role.attention_dp,
                    gpus_per_instance=role.tp * role.pp, nodes_per_instance=nodes_per_instance,
                    node_count=node_count, instances=instances,
                    model_path=role.model_path or r.model_path or r.model, llm_api_options=opts,
                    serve_args=tuple(args), env=env)


def _proxy_plan(r: Recipe, ctx, gen, transport: TransportProfile, engine: EnginePlan) -> ProxyPlan:
    def section(instances, router: str, tpb: int) -> dict:
        router_cfg: dict = {"type": router}
        if router == "kv_cache_aware":
            router_cfg["tokens_per_block"] = tpb
        return {"num_instances": len(instances),
                "urls": [f"<node{s.first_node}>:{s.port}" for s in instances],
                "router": router_cfg}

    tpb = r.kv_transfer.tokens_per_block
    cfg: dict = {
        "hostname": "<node0>",
        "port": r.proxy.port,
        "backend": "pytorch",
        "max_retries": r.proxy.max_retries,
        "context_servers": section(ctx, r.proxy.context_router, tpb),
        "generation_servers": section(gen, r.proxy.generation_router, tpb),
    }
    if r.proxy.conditional_max_local_prefill_length is not None:
        cfg["conditional_disagg_config"] = {"max_local_prefill_length": r.proxy.conditional_max_local_prefill_length}
    args = ("-t", str(r.proxy.server_start_timeout_s), "-r", str(r.proxy.request_timeout_s))
    env = {"TLLM_LOG_LEVEL": "INFO",
           "UCX_TLS": transport.ucx_tls_host if engine.is_standin else transport.ucx_tls_gpu}
    return ProxyPlan(node=0, port=r.proxy.port, config=cfg, args=args, env=env)

