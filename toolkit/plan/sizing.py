"""Numbers the plan derives: KV geometry, the transfer buffer, the rough estimates `tk plan` prints."""

from __future__ import annotations

import math

from toolkit.facts import trtllm, versions
from toolkit.facts.hardware import GPU_PEAK_TFLOPS, PREFILL_EFFICIENCY, TransportProfile
from toolkit.facts.models import KV_DTYPE_BYTES, ModelSpec
from toolkit.plan.model import BufferSizing, Estimates, KvGeometry, RoleKv
from toolkit.recipe.schema import Recipe, RoleSpec


def ceil_to(multiple: int, value: int) -> int:
    return int(math.ceil(value / multiple) * multiple)


def longest_input(r: Recipe) -> int:
    return r.traffic.max_input_len + r.traffic.prefix_len


def given_buffers(r: Recipe) -> dict[str, tuple[str, int]]:
    """cache_transceiver_config.max_tokens_in_buffer the recipe gives, per role title: (the field, its value). A
    role's own (context.max_tokens_in_buffer, generation.max_tokens_in_buffer), else kv_transfer.max_tokens_in_buffer
    (rules.check_buffer checks them)."""
    out = {}
    for title, role in (("context", r.context), ("generation", r.generation)):
        if role.max_tokens_in_buffer is not None:
            out[title] = (f"{title}.max_tokens_in_buffer", role.max_tokens_in_buffer)
        elif r.kv_transfer.max_tokens_in_buffer is not None:
            out[title] = ("kv_transfer.max_tokens_in_buffer", r.kv_transfer.max_tokens_in_buffer)
    return out


def size_buffer(r: Recipe) -> BufferSizing:
    """cache_transceiver_config.max_tokens_in_buffer per role: the one the recipe gives (``given_buffers``), else
    derived."""
    tpb = r.kv_transfer.tokens_per_block
    longest = longest_input(r)
    values = {title: value for title, (_, value) in given_buffers(r).items()}
    ctx_mnt = r.context.max_num_tokens or ceil_to(tpb, longest)
    derived = ceil_to(tpb, max(longest, ctx_mnt))
    why = (f"the larger of the longest admitted input ({r.traffic.max_input_len} input + {r.traffic.prefix_len} "
           f"prefix = {longest} tokens) and the context servers' max_num_tokens ({ctx_mnt}), the most KV one "
           f"prefill iteration hands to the transceiver, rounded up to tokens_per_block={tpb} (NVIDIA's "
           "examples/disaggregated/slurm/benchmark/config.yaml sets it to the context max_num_tokens)")
    if not values:
        return BufferSizing(derived, why, user_given=False)
    ctx = values.get("context")
    gen = values.get("generation")
    reason = "given in the recipe"
    if ctx is None:  # only the generation role's is given: the context servers' is derived
        ctx = derived
        reason = f"context servers: {why}; generation servers: given in the recipe (generation.max_tokens_in_buffer)"
    return BufferSizing(ctx, reason, user_given=True,
                        generation_max_tokens_in_buffer=gen if gen is not None and gen != ctx else None)


def spec_layers(r: Recipe, version: trtllm.TrtllmVersion) -> int:
    """KV layers TensorRT-LLM adds for speculative decoding (MTP): facts.versions.mtp_kv_layers."""
    return versions.mtp_kv_layers(version, r.speculative.mtp_layers)


def role_kv(model: ModelSpec, kv_dtype: str, role: RoleSpec, extra_layers: int = 0) -> RoleKv:
    """One rank's KV per token. ``extra_layers`` (MTP) sit on the last pipeline rank; the fullest rank counts,
    so the validation payloads (toolkit/validate/params.py reads these) move what TensorRT-LLM moves."""
    tp = attention_tp(role)
    per_layer = model.kv_bytes_per_token_per_layer_per_rank(kv_dtype, tp)
    return RoleKv(layers_per_rank=model.layers_per_rank(role.pp, extra_layers),
                  bytes_per_token_per_layer_per_rank=per_layer,
                  bytes_per_token_per_rank=model.kv_bytes_per_token_per_rank(kv_dtype, tp, role.pp, extra_layers))


def attention_tp(role: RoleSpec) -> int:
    """How many ranks split one request's attention heads (and KV): 1 under attention DP, where each rank serves
    its own requests with all heads (tensorrt_llm/_torch/modules/attention.py: enable_attention_dp -> tp_size 1)."""
    return 1 if role.attention_dp else role.tp


def geometry(r: Recipe, model: ModelSpec, extra_layers: int = 0) -> KvGeometry:
    """``num_layers`` is what TensorRT-LLM allocates KV for: the model's layers plus ``extra_layers`` (MTP)."""
    dtype = r.kv_transfer.dtype
    per_layer = model.kv_bytes_per_token_per_layer(dtype)
    layers = "(layers + MTP layers)" if extra_layers else "layers"
    if model.attention == "mla":
        formula = f"(kv_lora_rank + qk_rope_head_dim) x {layers} x bytes_per_element"
    else:
        formula = f"2 x {layers} x kv_heads x head_dim x bytes_per_element"
    kv_layers = model.num_layers + extra_layers
    per_token = int(per_layer * kv_layers)
    longest = longest_input(r)
    return KvGeometry(
        attention=model.attention, num_layers=kv_layers, bytes_per_element=KV_DTYPE_BYTES[dtype],
        bytes_per_token=per_token, bytes_per_token_per_layer=int(per_layer),
        tokens_per_block=r.kv_transfer.tokens_per_block,
        ctx_bytes_per_token_per_rank=model.kv_bytes_per_token_per_rank(dtype, attention_tp(r.context), r.context.pp,
                                                                       extra_layers),
        gen_bytes_per_token_per_rank=model.kv_bytes_per_token_per_rank(dtype, attention_tp(r.generation),
                                                                       r.generation.pp, extra_layers),
        largest_request_tokens=longest, largest_request_bytes=per_token * longest, formula=formula,
    )


def estimates(r: Recipe, model: ModelSpec, kv: KvGeometry, transport: TransportProfile,
              gpu: str | None = None) -> Estimates:
    """Prefill and KV transfer of the largest request on the recipe's GPUs; with emulated timing (stand-in
    `standin.emulate`), of the emulated model on the emulated GPU, which is what the run's timing follows."""
    ctx_gpus = r.context.tp * r.context.pp
    peak = GPU_PEAK_TFLOPS[gpu or r.cluster.gpu]
    prefill_s = 2 * model.active_params * kv.largest_request_tokens / (ctx_gpus * peak * 1e12 * PREFILL_EFFICIENCY)
    # Each context rank sends its share over its own NIC in parallel.
    transfer_s = kv.ctx_bytes_per_token_per_rank * kv.largest_request_tokens / (transport.nominal_gbps * 1e9)
    return Estimates(transport=transport.name, nominal_gbps=transport.nominal_gbps,
                     largest_request_transfer_ms=round(transfer_s * 1e3, 3),
                     largest_request_prefill_ms=round(prefill_s * 1e3, 3),
                     prefill_efficiency=PREFILL_EFFICIENCY, gpu_peak_tflops=peak,
                     transfer_dominates=transfer_s > prefill_s)
