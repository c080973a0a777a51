"""What the plan writes for the engine: LLM-API options, server flags, environment, the proxy config.

Names come from ``toolkit.facts.trtllm``; what differs between engines from the plan's ``EngineProfile``.
"""

from __future__ import annotations

from toolkit.facts import trtllm
from toolkit.facts.engines import EngineProfile
from toolkit.facts.hardware import MNNVL_GPUS, TransportProfile
from toolkit.facts.kvreuse import CONVERSATION_ROUTER
from toolkit.facts.models import ModelSpec
from toolkit.plan.model import BufferSizing, ProxyPlan, ServerInstance
from toolkit.plan.sizing import ceil_to, longest_input
from toolkit.recipe.schema import Recipe, RoleSpec


def derived_options(r: Recipe, title: str, role: RoleSpec, model: ModelSpec, version: trtllm.TrtllmVersion,
                    buffer: BufferSizing) -> dict:
    """The LLM-API options tk derives from the recipe. ctx.yaml / gen.yaml hold these with the role's checked
    extra_options merged in last (``deep_merge``, in ``build``)."""
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
    kv_aware = router == "kv_cache_aware" or (not is_ctx and r.proxy.conditional_max_local_prefill_length is not None)
    # Block reuse where a router keeps requests on the server that holds their prefix (kv_cache_aware, or 1.3's
    # conversation router with its affinity); KV-cache events (event_buffer_max_size) only where a kv_cache_aware
    # router reads them: without them it routes by load alone (TensorRT-LLM #14882, toolkit.facts.kvreuse).
    reuse = kv_aware or router == CONVERSATION_ROUTER
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
        "enable_block_reuse": reuse,
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
    omit_unverified_defaults(opts, version)
    return opts


def omit_unverified_defaults(opts: dict, version: trtllm.TrtllmVersion) -> None:
    """Drop keys whose acceptance by this line is unverified (facts.trtllm.OPTION_FACTS) where tk's value is
    TensorRT-LLM's default anyway: the engine behaves the same and cannot refuse a key it is not given. A
    value other than the default is kept (rules.check_version_features warns)."""
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
               transport: TransportProfile) -> dict:
    """The environment both roles' servers share (before each role's own env)."""
    env = {trtllm.LOG_LEVEL_ENV: "INFO"}
    env["UCX_TLS"] = transport.ucx_tls(engine.kv_memory)
    if r.kv_transfer.net_devices:
        env["UCX_NET_DEVICES"] = r.kv_transfer.net_devices
    env.update(transport.env)
    if transport.multi_node and r.cluster.gpu not in MNNVL_GPUS and engine.gpu_fabric_env:
        env["UCX_CUDA_IPC_ENABLE_MNNVL"] = "n"  # servers in different NVLink domains
    if r.kv_transfer.backend == "NIXL" and trtllm.NIXL_BACKEND_ENV in version.env_vars:
        env[trtllm.NIXL_BACKEND_ENV] = transport.nixl_transport
    if engine.version_env:
        env[engine.version_env] = version.line
    env.update(r.kv_transfer.env)
    return env


def emulation_env(r: Recipe, engine: EngineProfile, transport: TransportProfile, model_arg: str) -> dict:
    """The env that turns the engine's emulated timing on (`standin.emulate`, checked by rules.check_emulation):
    the model and GPU whose roofline it sleeps, and the transport's nominal GB/s for the KV bytes it does not
    move for real."""
    emu = r.standin.emulate
    prefix = engine.emulate_env_prefix
    return {f"{prefix}MODEL": model_arg, f"{prefix}GPU": emu.gpu, f"{prefix}PRECISION": emu.precision,
            f"{prefix}KV_GBPS": f"{transport.nominal_gbps:g}"}


def proxy_plan(r: Recipe, ctx: tuple[ServerInstance, ...], gen: tuple[ServerInstance, ...],
               transport: TransportProfile, engine: EngineProfile, membership=None) -> ProxyPlan:
    def section(instances, router: str, tpb: int) -> dict:
        router_cfg: dict = {"type": router}
        if router == "kv_cache_aware":
            router_cfg["tokens_per_block"] = tpb
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
        "context_servers": section(ctx, r.proxy.context_router, tpb),
        "generation_servers": section(gen, r.proxy.generation_router, tpb),
    }
    if membership is not None:
        cfg[trtllm.MEMBERSHIP_KEY] = {
            "cluster_uri": membership.cluster_uri,
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
    args = (flag["start_timeout"], str(r.proxy.server_start_timeout_s),
            flag["request_timeout"], str(r.proxy.request_timeout_s))
    env = {trtllm.LOG_LEVEL_ENV: "INFO", "UCX_TLS": transport.ucx_tls(engine.kv_memory)}
    return ProxyPlan(node=0, port=r.proxy.port, config=cfg, args=args, env=env,
                     request_timeout_s=r.proxy.request_timeout_s)
