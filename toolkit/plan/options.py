"""What the plan writes for the engine: LLM-API options, server flags, environment, the proxy config.

Names come from ``toolkit.facts.trtllm``; what differs between engines from the plan's ``EngineProfile``.
"""

from __future__ import annotations

from toolkit.facts import llm_args, trtllm
from toolkit.facts.engines import EngineProfile
from toolkit.facts.hardware import MNNVL_GPUS, TransportProfile
from toolkit.facts.models import ModelSpec
from toolkit.plan.model import BufferSizing, ProxyPlan, ServerInstance
from toolkit.plan.sizing import ceil_to, longest_input
from toolkit.recipe.schema import Recipe, RoleSpec


def derived_options(r: Recipe, title: str, role: RoleSpec, model: ModelSpec, version: trtllm.TrtllmVersion,
                    buffer: BufferSizing, target: llm_args.Target | None = None) -> dict:
    """The LLM-API options tk derives from the recipe. ctx.yaml / gen.yaml hold these with the role's checked
    extra_options merged in last (``deep_merge``, in ``build``)."""
    target = target or llm_args.Target(version.line)
    is_ctx = title == "context"
    kv = r.kv_transfer
    tpb = kv.tokens_per_block
    longest = longest_input(r)
    mtp = r.speculative.mtp_layers
    max_batch = role.max_batch_size or (8 if is_ctx else 256)
    default_mnt = ceil_to(tpb, longest) if is_ctx else ceil_to(tpb, max(max_batch * (1 + mtp), tpb))
    if not is_ctx and r.proxy.conditional_max_local_prefill_length is not None:
        # Under conditional disaggregation short prompts are prefilled on the generation server itself.
        default_mnt = max(default_mnt, ceil_to(tpb, r.proxy.conditional_max_local_prefill_length))
    router = r.proxy.context_router if is_ctx else r.proxy.generation_router
    kv_aware = router == trtllm.Router.KV_CACHE_AWARE or (not is_ctx and r.proxy.conditional_max_local_prefill_length is not None)
    # Block reuse where a router keeps requests on the server that holds their prefix (kv_cache_aware, or 1.3's
    # conversation router with its affinity); KV-cache events (event_buffer_max_size) only where a kv_cache_aware
    # router reads them: without them it routes by load alone (TensorRT-LLM #14882, toolkit.facts.kvreuse).
    reuse = kv_aware or router == trtllm.Router.CONVERSATION
    opts: dict = {
        "tensor_parallel_size": role.tp,
        "pipeline_parallel_size": role.pp,
    }
    if model.is_moe:
        opts["moe_expert_parallel_size"] = role.ep or role.tp
    opts["enable_attention_dp"] = role.attention_dp
    opts["max_batch_size"] = max_batch
    opts["max_num_tokens"] = role.max_num_tokens or default_mnt
    opts["max_seq_len"] = role.max_seq_len or default_max_seq_len(r)
    opts["disable_overlap_scheduler"] = True if is_ctx else False
    opts["print_iter_log"] = True
    if r.trust_remote_code:  # TensorRT-LLM's default is False: written only when the recipe asks
        opts["trust_remote_code"] = True
    if is_ctx or role.cuda_graph is False:
        opts["cuda_graph_config"] = None
    else:
        given = role.extra_options.get("cuda_graph_config")
        if isinstance(given, dict) and "max_batch_size" in given and "batch_sizes" not in given:
            # The recipe asks TensorRT-LLM to generate the sizes up to its max_batch_size (its padded list 1, 2, 4,
            # then multiples of 8): tk's own list would be merged in beside it, which the late-2025
            # TorchLlmArgs.validate_cuda_graph_config refuses unless it equals the generated list (llm_args.py
            # @ 3e906a0e) and later lines silently prefer (BaseCudaGraphConfig, llm_args.py @ 011d0933).
            opts["cuda_graph_config"] = {"enable_padding": True}
        else:
            sizes = sorted({1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch} | {max_batch})
            opts["cuda_graph_config"] = {"enable_padding": True, "batch_sizes": sizes}
    kv_cfg = {
        "tokens_per_block": tpb,
        "free_gpu_memory_fraction": role.free_gpu_memory_fraction or (0.85 if is_ctx else 0.8),
        "dtype": kv.dtype,
        "enable_block_reuse": reuse,
    }
    if kv_aware:
        kv_cfg["event_buffer_max_size"] = 1024
    opts["kv_cache_config"] = kv_cfg
    ct = {"backend": kv.backend, "max_tokens_in_buffer": buffer.for_role(title)}
    # Written where the line has the key; where that is unverified only if the recipe set it (tk warns then).
    timeout = llm_args.status(target, TIMEOUT_PATH).verdict
    if kv.kv_transfer_timeout_ms is not None and (timeout is llm_args.Verdict.KNOWN or (
            timeout is llm_args.Verdict.UNSURE and "kv_transfer_timeout_ms" in kv.model_fields_set)):
        ct["kv_transfer_timeout_ms"] = kv.kv_transfer_timeout_ms
    for key, value in (("transceiver_runtime", kv.runtime), ("kv_transfer_poll_interval_ms", kv.poll_interval_ms),
                       ("kv_cache_bounce_size_mb", kv.bounce_size_mb), ("enable_pipelined_transfer", kv.pipelined)):
        if value is not None:
            ct[key] = value  # the rules check the line has it (check_transceiver)
    opts["cache_transceiver_config"] = ct
    spec = speculative_config(r, target)
    if spec:
        opts["speculative_config"] = spec
    omit_unverified_defaults(opts, version)
    return opts


TIMEOUT_PATH = "cache_transceiver_config.kv_transfer_timeout_ms"


def default_max_seq_len(r: Recipe) -> int:
    """The longest sequence a server holds: input + prefix + output, plus one slot per MTP draft token."""
    return longest_input(r) + r.traffic.max_output_len + r.speculative.mtp_layers


def speculative_config(r: Recipe, target: llm_args.Target) -> dict:
    """speculative_config from the recipe's `speculative` section (the same on both roles), or {}."""
    sp = r.speculative
    if sp.mtp_layers:
        return {"decoding_type": "MTP", "num_nextn_predict_layers": sp.mtp_layers, **sp.options}
    if sp.decoding_type is None:
        return {}
    cfg: dict = {"decoding_type": sp.decoding_type}
    if sp.max_draft_len is not None:
        cfg["max_draft_len"] = sp.max_draft_len
    if sp.model is not None:
        cfg[draft_model_key(target)] = sp.model
    cfg.update(sp.options)
    return cfg


def draft_model_key(target: llm_args.Target) -> str:
    """The spelling of the draft model's path: `speculative_model` where the line has it (2026 lines; it also takes
    the older name as a validation alias), else `speculative_model_dir` (DecodingBaseConfig, llm_args.py @ 3e906a0e)."""
    new = "speculative_config.speculative_model"
    return "speculative_model" if llm_args.status(target, new).verdict is llm_args.Verdict.KNOWN \
        else "speculative_model_dir"


def omit_unverified_defaults(opts: dict, version: trtllm.TrtllmVersion) -> None:
    """Drop keys whose acceptance by this line is unverified (facts.trtllm.UNVERIFIABLE_OPTIONS) where tk's value is
    TensorRT-LLM's default anyway: the engine behaves the same and cannot refuse a key it is not given. A
    value other than the default is kept (rules.check_unverified_options warns)."""
    for fact in trtllm.unverified_options(version):
        *parents, key = fact.path
        node = opts
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict) and key in node and node[key] == fact.default \
                and type(node[key]) is type(fact.default):
            del node[key]


def deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def serve_args(role: RoleSpec, opts: dict, model: ModelSpec) -> tuple[str, ...]:
    """`trtllm-serve MODEL` flags besides host, port and the options file."""
    flag = trtllm.SERVE_FLAG
    args: list[str] = [flag["backend"], trtllm.PYTORCH_BACKEND, flag["tp"], str(role.tp), flag["pp"], str(role.pp)]
    if model.is_moe:
        args += [flag["ep"], str(opts.get("moe_expert_parallel_size", role.tp))]
    return tuple(args + list(role.extra_serve_args))


def worker_env(r: Recipe, version: trtllm.TrtllmVersion, engine: EngineProfile,
               transport: TransportProfile, target: llm_args.Target | None = None) -> dict:
    """The environment both roles' servers share (before each role's own env)."""
    env = {trtllm.LOG_LEVEL_ENV: "INFO"}
    if transport.ucx_tls(engine.kv_memory):  # "": the profile leaves UCX to choose (TransportProfile.ucx_tls_reason)
        env["UCX_TLS"] = transport.ucx_tls(engine.kv_memory)
    if r.kv_transfer.net_devices:
        env["UCX_NET_DEVICES"] = r.kv_transfer.net_devices
    env.update(transport.env)
    if transport.multi_node and r.cluster.gpu not in MNNVL_GPUS and engine.gpu_fabric_env:
        env["UCX_CUDA_IPC_ENABLE_MNNVL"] = "n"  # servers in different NVLink domains
    if r.kv_transfer.backend == "NIXL" and trtllm.NIXL_BACKEND_ENV in version.env_vars:
        env[trtllm.NIXL_BACKEND_ENV] = transport.nixl_transport
    if engine.version_env:  # the release where the recipe names one, so the engine checks what that release takes
        env[engine.version_env] = (target.release if target and target.release else version.line)
    env.update(r.kv_transfer.env)
    return env


def emulation_env(r: Recipe, engine: EngineProfile, transport: TransportProfile, model_arg: str,
                  kv_report: str | None = None) -> dict:
    """The env that turns the engine's emulated timing on (`standin.emulate`, checked by rules.check_emulation):
    the model, GPU and precision whose time it sleeps (the layout is each server's own flags and options, the
    TensorRT-LLM line the engine's version env), the transport's nominal GB/s for its emulated KV transfer, and
    the validation report whose measured GB/s replaces that figure when the recipe names one."""
    emu = r.standin.emulate
    prefix = engine.emulate_env_prefix
    env = {f"{prefix}MODEL": model_arg, f"{prefix}GPU": emu.gpu, f"{prefix}PRECISION": emu.precision,
           f"{prefix}KV_GBPS": f"{transport.nominal_gbps:g}"}
    if kv_report:
        env[f"{prefix}KV_REPORT"] = kv_report
    return env


def worker_cluster_block(membership) -> dict:
    """The `disagg_cluster` block of a worker's options file (toolkit.plan.build explains why no cluster_uri)."""
    return {"cluster_name": membership.cluster_name, "heartbeat_interval_sec": membership.heartbeat_interval_s,
            "inactive_timeout_sec": membership.inactive_timeout_s}


def proxy_plan(r: Recipe, ctx: tuple[ServerInstance, ...], gen: tuple[ServerInstance, ...],
               transport: TransportProfile, engine: EngineProfile, membership=None,
               version: trtllm.TrtllmVersion | None = None) -> ProxyPlan:
    def section(instances, router: str, tpb: int, args: dict) -> dict:
        router_cfg: dict = {"type": router}
        if router == trtllm.Router.KV_CACHE_AWARE:
            router_cfg["tokens_per_block"] = tpb
        router_cfg.update(args)
        out: dict = {"num_instances": len(instances)}
        if membership is None:  # with disagg_cluster TensorRT-LLM neither reads nor checks urls (DISAGG_MID)
            out["urls"] = [f"<node{s.first_node}>:{s.port}" for s in instances]
        out["router"] = router_cfg
        return out

    tpb = r.kv_transfer.tokens_per_block
    cfg: dict = {
        "hostname": "<node0>",
        "port": r.proxy.port,
        "backend": trtllm.PYTORCH_BACKEND,
        "max_retries": r.proxy.max_retries,
        "context_servers": section(ctx, r.proxy.context_router, tpb, r.proxy.context_router_args),
        "generation_servers": section(gen, r.proxy.generation_router, tpb, r.proxy.generation_router_args),
    }
    if membership is not None:
        cfg[trtllm.MEMBERSHIP_KEY] = {
            "cluster_uri": membership.uri_for("proxy"),
            "cluster_name": membership.cluster_name,
            "minimal_instances": {"context_servers": membership.minimal_context,
                                  "generation_servers": membership.minimal_generation},
            "heartbeat_interval_sec": membership.heartbeat_interval_s,
            "inactive_timeout_sec": membership.inactive_timeout_s,
        }
    if r.proxy.perf_metrics_max_requests:
        # the /perf_metrics buffer: per finished request its context and generation servers, which `tk bench` reads
        # as TensorRT-LLM's own proof that a request took both legs (a stable top-level key, DISAGG_MID/NEWEST)
        cfg["perf_metrics_max_requests"] = r.proxy.perf_metrics_max_requests
    if r.proxy.conditional_max_local_prefill_length is not None:
        cfg["conditional_disagg_config"] = {"max_local_prefill_length": r.proxy.conditional_max_local_prefill_length}
    flag = trtllm.PROXY_FLAG
    args = (flag["start_timeout"], str(proxy_start_timeout_s(r)),
            flag["request_timeout"], str(r.proxy.request_timeout_s))
    env = {trtllm.LOG_LEVEL_ENV: "INFO"}
    if transport.ucx_tls(engine.kv_memory):
        env["UCX_TLS"] = transport.ucx_tls(engine.kv_memory)
    if engine.version_env and version is not None:
        # the engine imitates a line (the CPU stand-in): its proxy must speak the same one as the workers (which
        # keys it accepts, ctx_usage on the generation leg, the conversation router)
        env[engine.version_env] = version.line
    env.update(r.proxy.env)
    return ProxyPlan(node=0, port=r.proxy.port, config=cfg, args=args, env=env,
                     request_timeout_s=r.proxy.request_timeout_s)


def proxy_start_timeout_s(r: Recipe) -> int:
    """`trtllm-serve disaggregated -t`: the recipe's, else as long as tk waits for the servers itself
    (cluster.startup_timeout_s): a longer wait would outlive the job's own start-up bound."""
    return r.proxy.server_start_timeout_s or r.cluster.startup_timeout_s
