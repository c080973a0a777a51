"""The plan's transceiver: which TensorRT-LLM cache transceiver each role's servers run (its options file, else the
release's default), what it hands NIXL for the longest request, and the transfer-buffer rule that follows from it.

The facts and their sources are in toolkit/facts/transceiver.py; this module only applies them to a recipe.
"""

from __future__ import annotations

from toolkit.facts import llm_args, trtllm
from toolkit.facts import transceiver as T
from toolkit.facts.models import ModelSpec
from toolkit.plan.model import BufferSizing, TransceiverPlan
from toolkit.plan.sizing import attention_tp, ceil_to, longest_input, role_kv
from toolkit.recipe.schema import Recipe

ROLES = ("context", "generation")


def _role_runtime(r: Recipe, title: str, ct: dict, line: str, default: T.RuntimeDefault
                  ) -> tuple[T.Runtime, str, str | None, str]:
    """(runtime, why, the setting it resolved from, the effective backend) of one role's servers."""
    env = {**r.kv_transfer.env, **getattr(r, title).env}
    backend = T.resolve_backend(str(ct.get("backend")), env, line, trtllm.BACKEND_SELECTORS)
    setting = ct["transceiver_runtime"] if "transceiver_runtime" in ct else default.setting
    timeout_null = "kv_transfer_timeout_ms" in ct and ct["kv_transfer_timeout_ms"] is None
    runtime, why = T.resolve_runtime(setting, backend, timeout_null)
    return runtime, why, setting, backend


def plan_transceiver(r: Recipe, version: trtllm.TrtllmVersion, target: llm_args.Target, model: ModelSpec,
                     merged: dict[str, dict], buffer: BufferSizing, extra_layers: int, c) -> TransceiverPlan | None:
    """The context servers' transceiver and the longest request's descriptors per rank pair; each role's buffer
    checked against what its transceiver does with a request larger than it (violations and warnings to ``c``)."""
    default = T.default_for(version.line, target.release)
    roles = {}
    for title in ROLES:
        ct = merged.get(title, {}).get("cache_transceiver_config")
        if isinstance(ct, dict) and ct.get("backend") is not None:
            roles[title] = _role_runtime(r, title, ct, version.line, default)
    if len(roles) != len(ROLES):
        return None
    (ctx_rt, why, setting, backend), (gen_rt, gen_why, _, _) = roles["context"], roles["generation"]
    if ctx_rt is not gen_rt:
        c.warnings.append(f"the context servers run the {ctx_rt.label} ({why}) and the generation servers the "
                          f"{gen_rt.label} ({gen_why}): TensorRT-LLM negotiates nothing, so the two cannot exchange "
                          "KV; set kv_transfer.runtime once for both roles")
    longest = longest_input(r)
    check_buffers(r, {title: (runtime, role_backend, buffer.for_role(title))
                      for title, (runtime, _, _, role_backend) in roles.items()}, longest, c)

    ctx_kv = role_kv(model, r.kv_transfer.dtype, r.context, extra_layers)
    gen_kv = role_kv(model, r.kv_transfer.dtype, r.generation, extra_layers)
    kvf = model.kv_factor
    slot = min(ctx_kv.bytes_per_token_per_layer_per_rank, gen_kv.bytes_per_token_per_layer_per_rank) / kvf
    pair = T.RankPairGeometry(tokens_per_block=r.kv_transfer.tokens_per_block,
                              layers=min(ctx_kv.layers_per_rank, gen_kv.layers_per_rank), kv_factor=kvf,
                              slot_bytes_per_token=max(1, round(slot)))
    mla = model.attention == "mla"
    mapper = T.mapper_layout(attention_tp(r.context), attention_tp(r.generation), model.num_kv_heads, mla,
                             ctx_kv.layers_per_rank, gen_kv.layers_per_rank)
    ctx_ct = merged["context"]["cache_transceiver_config"]
    bounce = ctx_ct.get("kv_cache_bounce_size_mb") or 0
    bounce = bounce if isinstance(bounce, int) and not isinstance(bounce, bool) else 0
    whole = T.descriptors(mapper, pair, longest)
    layout = T.layout_for(ctx_rt, mapper, bounce, whole.total_bytes)
    desc = T.descriptors(layout, pair, longest)
    return TransceiverPlan(
        runtime=ctx_rt, runtime_setting=setting, runtime_reason=why, default_source=default.source, backend=backend,
        mapper=mapper, layout=layout, bounce_size_mb=bounce, pair=pair,
        targets_per_context_rank=T.targets_per_context_rank(attention_tp(r.context), attention_tp(r.generation),
                                                            r.context.pp, r.generation.pp, mla),
        longest=desc, model=T.describe(ctx_rt, desc))


def check_buffers(r: Recipe, roles: dict[str, tuple[T.Runtime, str, int]], longest: int, c) -> None:
    """Each role's max_tokens_in_buffer (``roles``: title -> (runtime, effective backend, tokens)) below the longest
    request the recipe admits: refused where TensorRT-LLM fails such a request (the C++ transceiver over an agent
    connection, NIXL or MOONCAKE: no dynamic-buffer fallback), a warning where it moves it through buffers allocated
    per request (the C++ transceiver over UCX or MPI). One message per recipe field, naming the roles it holds for."""
    tpb = r.kv_transfer.tokens_per_block
    refused: dict[str, list[str]] = {}
    warned: dict[str, list[str]] = {}
    shown: dict[str, tuple[int, T.Runtime, str]] = {}
    for title, (runtime, backend, tokens) in roles.items():
        if tokens >= longest or tokens % tpb:  # a misaligned buffer is refused already (sizing.size_buffer)
            continue
        spec = getattr(r, title)
        field = f"{title}.max_tokens_in_buffer" if spec.max_tokens_in_buffer is not None \
            else "kv_transfer.max_tokens_in_buffer"
        shown[field] = (tokens, runtime, backend)
        if T.agent_needs_preallocated_buffer(runtime, backend):
            refused.setdefault(field, []).append(title)
        elif runtime is T.Runtime.CPP:
            warned.setdefault(field, []).append(title)
    for field, titles in refused.items():
        tokens, runtime, backend = shown[field]
        c.add(field, f"{field} = {tokens} is smaller than the longest input the recipe admits ({longest} tokens = "
              f"max_input_len + prefix_len): the {' and '.join(titles)} servers run TensorRT-LLM's {runtime.label} "
              f"over {backend}, whose agent connection takes no request larger than its pre-allocated transfer "
              f"buffer; such a request fails (TLLM_CHECK \"{T.AGENT_BUFFER_CHECK}\", {T.AGENT_BUFFER_SOURCE})",
              f"raise it to at least {ceil_to(tpb, longest)} (a multiple of tokens_per_block), remove it and let tk "
              "size it, or lower traffic.max_input_len")
    for field, titles in warned.items():
        tokens, runtime, backend = shown[field]
        c.warnings.append(f"{field} = {tokens} is smaller than the longest input the recipe admits ({longest} tokens "
                          f"= max_input_len + prefix_len): the {' and '.join(titles)} servers' {runtime.label} over "
                          f"{backend} moves the KV of longer requests through buffers allocated for each request "
                          "(slower; over UCX both roles' buffers must then be equal)")
