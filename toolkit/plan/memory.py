"""The memory plan: what one GPU of each role's servers holds, and the rules on it.

For the fullest rank of one server (tp x pp GPUs, attention DP or not, MoE TP x EP):

    weights       parameters by how TensorRT-LLM shards them (facts.models.weight_params) x bytes per weight
    activations   the forward pass TensorRT-LLM profiles before it sizes the KV pool (max_num_tokens tokens)
    CUDA graphs   the same for the largest captured decode batch
    runtime       CUDA context, cuBLAS/NCCL workspaces, NCCL buffers
    KV pool       (GPU memory - all of the above) x free_gpu_memory_fraction, and the tokens it holds

How TensorRT-LLM does it, from its source:

- The KV pool: ``KvCacheCreator._cal_max_memory`` (tensorrt_llm/_torch/pyexecutor/_util.py, NVIDIA/TensorRT-LLM @
  d8ae02caed59708512e5aa578a09bb09f365bfed): ``available_kv_mem = (total_gpu_memory - peak_memory +
  allocated_bytes) * free_gpu_memory_fraction``, where the peak is the model's weights plus a profiling run of
  dummy requests filling ``max_num_tokens`` (one per attention-DP rank), plus memory used outside torch (NCCL,
  CUDA graphs); ``max_tokens = available_kv_mem // kv_size_per_token``.
- Attention sharding: ``Attention.__init__`` / ``MLA.__init__`` (tensorrt_llm/_torch/modules/attention.py @
  00547a25ac61d28d1dabb2e47383a1af605ebb59): with ``enable_attention_dp`` the attention TP size is 1 (every rank
  holds all heads, for its own requests); otherwise ``assert num_heads % tp_size == 0`` and each rank keeps
  ``ceil(num_kv_heads / tp_size)`` KV heads. ``duplicate_kv_weight`` (tensorrt_llm/_torch/models/
  modeling_utils.py @ cb4c622cf5bb97009451f7f44609498a48a2b11d) asserts ``num_kv_heads % tp == 0`` when there are
  at least as many KV heads as ranks, else ``tp % num_kv_heads == 0`` (each KV head replicated tp/kv times).
- MoE: ``Mapping`` (tensorrt_llm/mapping.py): ``moe_tp_size * moe_ep_size == tp_size``, ``moe_tp = tp // moe_ep``
  when only EP is given; routed experts are split over all of them. ``_compute_mlp_tp_size``
  (tensorrt_llm/_torch/models/modeling_deepseekv3.py): "If using attention DP, the MLP also uses DP instead of
  TP" (dense layers and shared experts replicated). The MTP layer of an NVFP4 checkpoint is unquantized
  (``_get_decoder_layer_quant_config``, same file).

What is an estimate, stated where it is used: activations follow aiconfigurator 0.12.0's TensorRT-LLM memory
model (aiconfigurator_core/sdk/backends/{base,trtllm}_backend.py ``_get_memory_usage``:
2 x tokens x hidden x a per-family coefficient, plus the MoE dispatch workspace of DeepSeek-family models), the
runtime its measured constants (facts.hardware.RUNTIME_OTHER_BYTES, nccl_bytes). Quantized checkpoints keep
some layers at 16 bits (attention, shared experts and the router of the 4-bit MoE checkpoints NVIDIA and OpenAI
publish); the estimate assumes so, and a lower bound assumes every linear layer at the quantized width.

Refused only what cannot run whatever the estimates' error: weights whose lower bound exceeds the GPU, and a KV
pool that cannot hold one full sequence even with no activations at all (an error naming the smallest layout
that fits). Everything that depends on the estimates is a warning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolkit.facts.hardware import RUNTIME_OTHER_BYTES, GpuFigures, nccl_bytes
from toolkit.facts.models import FOUR_BIT, KV_DTYPE_BYTES, QUANT_BYTES, ModelSpec, quant_name, weight_params
from toolkit.plan.model import RoleMemory

GIB = 1 << 30
# aiconfigurator 0.12.0 TRTLLMBackend.ACTIVATION_COEFFICIENTS: activation bytes = 2 x tokens x hidden x coeff,
# by attention TP (clamped to 8) and model family.
_ACTIVATION_COEFF = {
    "moe": {1: 22, 2: 13, 4: 10, 8: 10},
    "llama": {1: 11, 2: 6.5, 4: 5, 8: 5},
    "default": {1: 10, 2: 6, 4: 5, 8: 5},
}
_MIN_ACTIVATION_BYTES = 70 * 1024 * 1024  # aiconfigurator's floor
_LLAMA_FAMILY = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")


@dataclass(frozen=True)
class WeightsQuant:
    """The weights quantization the memory plan assumes, and how sure it is."""

    name: str  # a QUANT_BYTES key, or the dtype ("bfloat16") for unquantized weights
    source: str  # where it comes from, for the plan's table
    certain: bool  # False: the lower bound assumes 4-bit weights (the checkpoint may be quantized)


def weights_quant(model: ModelSpec, recipe_quantization: str | None, model_path_given: bool) -> tuple[WeightsQuant,
                                                                                                        str | None]:
    """What the weights are stored as: the recipe's `quantization` (the checkpoint served), else what the
    checkpoint's config.json declares, else its dtype. Returns (quant, warning or None)."""
    dtype = quant_name(model.dtype) or "bfloat16"
    own = model.quantization or dtype
    if recipe_quantization:
        name = quant_name(recipe_quantization)
        if name is None:
            return WeightsQuant(own, f"the model's own; tk does not know quantization {recipe_quantization!r}",
                                certain=False), (
                f"quantization {recipe_quantization!r} is not one tk's memory plan knows "
                f"({', '.join(sorted(QUANT_BYTES))}); weights are estimated as {own} and only refused when they "
                "could not fit even at 4 bits")
        return WeightsQuant(name, "the recipe's quantization", certain=True), None
    if model.source != "built-in" and model.quantization_unread:
        return WeightsQuant(own, "unknown: the checkpoint's quantization could not be read (see the warning)",
                            certain=False), (
            f"{model.quantization_unread}: the weights' quantization is unknown; they are estimated as {own} and only "
            "refused when they could not fit even at 4 bits. Fix: set quantization in the recipe to the checkpoint's "
            f"({', '.join(sorted(QUANT_BYTES))})")
    if model.source != "built-in":
        note = model.quantization_note or f"config.json: no quantization_config, {model.dtype} weights"
        return WeightsQuant(own, note, certain=True), None
    if model_path_given:
        # model_path names a checkpoint tk cannot read: it may be a quantized variant of the built-in model.
        return WeightsQuant(own, "the built-in model's checkpoint; model_path may hold another: set quantization "
                                 "to say", certain=False), None
    return WeightsQuant(own, model.quantization_note or "the built-in model's checkpoint", certain=True), None


@dataclass(frozen=True)
class Sharding:
    """How one server splits the model: TP (the world of a pipeline stage), attention TP, PP."""

    tp: int
    pp: int
    attention_dp: bool
    ep: int  # MoE expert parallel (moe_ep); moe_tp = tp // ep
    lm_head_tp: bool = False  # enable_lm_head_tp_in_adp

    @property
    def attn_tp(self) -> int:
        return 1 if self.attention_dp else self.tp


def _bytes_per_weight(q: WeightsQuant, model: ModelSpec, lower: bool) -> dict[str, float]:
    """Bytes per parameter of each weight group. ``lower``: the smallest the checkpoint could be."""
    dtype = QUANT_BYTES.get(quant_name(model.dtype) or "bfloat16", 2.0)
    dtype = min(dtype, 2.0)  # TensorRT-LLM serves fp32 checkpoints in 16 bits
    qb = QUANT_BYTES.get(q.name, dtype)
    if lower:
        linear = min(qb, dtype) if q.certain else min(qb, dtype, 0.5)
        return {"attention": linear, "mlp": linear, "experts": linear, "shared": linear, "mtp": linear,
                "embedding": dtype if q.certain else linear}
    four_bit_moe = q.name in FOUR_BIT and model.is_moe
    rest = dtype if four_bit_moe else qb  # 4-bit MoE checkpoints keep attention and shared experts in 16 bits
    return {"attention": rest, "mlp": rest, "experts": qb, "shared": rest,
            "mtp": dtype if q.name in FOUR_BIT else qb, "embedding": dtype}


@dataclass(frozen=True)
class Extras:
    """What a server's options add to the model's own weights (speculative_config, moe_config), read by
    ``extras_of``. How TensorRT-LLM allocates each:

    - MTP: ``MTPForCausalLM`` creates one MTP module for MTP-Eagle one-model (the mode tk renders: no
      ``use_mtp_vanilla``) and ``num_nextn_predict_layers`` modules for vanilla MTP (``mtp_num_layers = 1 if
      spec_dec_mode.is_mtp_eagle_one_model() else ...num_nextn_predict_layers``,
      tensorrt_llm/_torch/models/modeling_speculative.py @ b35ac1b64368513d215c57d2ed01d62d910df8da); each module
      is one decoder layer of the model (its MoE included) plus its 2h x h projection.
    - EPLB: with ``moe_config.load_balancer.num_slots`` every MoE layer (the MTP layer's too) allocates
      ``num_slots // moe_ep_size`` expert weight slots per EP rank instead of ``num_experts // moe_ep_size``
      (WideEPMoE: ``expert_size_per_partition = moe_load_balancer_config.num_local_slots``,
      tensorrt_llm/_torch/modules/fused_moe/fused_moe_wide_ep.py @ 01303b3887e039d6dda1b5487ec8a94d9ef9db76;
      ``num_local_slots = num_slots // ep_size``, MoeLoadBalancerConfig, tensorrt_llm/llmapi/llm_args.py @
      0004396720054fd8e205cbf616f21f0b57c6b412): the redundant slots hold replicas of experts, at the experts' width.
    - An Eagle or Eagle3 draft: the PyTorch backend runs both as EAGLE3 one-model (EagleDecodingConfig.spec_dec_mode;
      Eagle3DecodingConfig only renames decoding_type, llm_args.py @ 0004396720054fd8e205cbf616f21f0b57c6b412), so
      the draft is ``Eagle3ForCausalLM`` (modeling_speculative.py @ b35ac1b6): its decoder layers (a QKV projection
      taking 2 x hidden, attention and MLP split as the target's), an ``fc`` of num_capture_layers x hidden_in ->
      hidden (not split; none for one captured layer; num_capture_layers: len(eagle3_layers_to_capture), else 3,
      eagle3_model_arch mistral_large3 capturing {-1}), its lm_head of draft_vocab_size rows (vocab_size where the
      config has none; the target's is reused when the draft checkpoint has no lm_head, so this is an upper bound);
      the embedding is the target's. Sizes from the draft's config.json where tk can read it, else one decoder layer
      of the target's geometry with the target's vocabulary (an estimate, said in the plan's notes).
    - A separate draft model (Draft_Target): its whole weights, from its config.json (not counted without one).
    The draft weights are 16-bit (draft checkpoints are not quantized) and sit on the last pipeline stage.
    """

    mtp_modules: int = 0
    expert_slots: int = 0  # 0: one slot per expert
    draft: str = ""  # the speculative decoding_type that loads a draft model beside the target ("" for none)
    draft_model: ModelSpec | None = None  # the draft's config.json, where tk could read it
    capture_layers: int = 3  # an Eagle draft's num_capture_layers (the target layers its fc takes)


NO_EXTRAS = Extras()
EAGLE_DRAFTS = ("Eagle", "Eagle3")
SEPARATE_DRAFTS = ("Draft_Target", "DraftTarget")


def extras_of(model: ModelSpec, opts: dict, draft_model: ModelSpec | None = None) -> Extras:
    """What a server's LLM-API options add to the model's weights (``Extras``)."""
    spec = _mapping(opts.get("speculative_config"))
    nextn = _count(spec.get("num_nextn_predict_layers"), 0)
    mtp = (nextn if spec.get("use_mtp_vanilla") is True else 1) if nextn else 0
    balancer = _mapping(_mapping(opts.get("moe_config")).get("load_balancer"))
    slots = _count(balancer.get("num_slots"), 0) if model.is_moe else 0
    kind = spec.get("decoding_type")
    draft = kind if kind in EAGLE_DRAFTS + SEPARATE_DRAFTS else ""
    captured = spec.get("eagle3_layers_to_capture")
    capture = (len(set(captured)) if isinstance(captured, (list, tuple, set)) and captured
               else 1 if spec.get("eagle3_model_arch") == "mistral_large3" else 3)
    return Extras(mtp_modules=mtp, expert_slots=slots, draft=draft, draft_model=draft_model if draft else None,
                  capture_layers=capture)


def extras_notes(model: ModelSpec, opts: dict, x: Extras) -> list[str]:
    """What the memory plan says about the weights the options add (``Extras``), where it is not obvious."""
    notes = []
    if x.expert_slots > model.num_experts:
        notes.append(f"moe_config.load_balancer.num_slots {x.expert_slots}: {x.expert_slots - model.num_experts} "
                     f"redundant expert slots beside the {model.num_experts} experts in every MoE layer are counted")
    balancer = _mapping(opts.get("moe_config")).get("load_balancer")
    if model.is_moe and isinstance(balancer, str):
        notes.append(f"moe_config.load_balancer is the file {balancer}, which tk does not read: redundant expert "
                     "slots are not counted")
    spec = _mapping(opts.get("speculative_config"))
    where = spec.get("speculative_model") or spec.get("speculative_model_dir")
    if x.draft in EAGLE_DRAFTS and x.draft_model is None:
        notes.append(f"the {x.draft} draft's weights are estimated as one decoder layer of {model.name}'s geometry "
                     f"with its vocabulary: the draft's config.json ({where}) is not readable here")
    elif x.draft in SEPARATE_DRAFTS and x.draft_model is None:
        notes.append(f"the draft model's weights are not counted: its config.json ({where}) is not readable here")
    return notes


def _draft_bytes(model: ModelSpec, x: Extras, s: Sharding, dtype: float, lower: bool) -> float:
    """The draft model's weight bytes on one GPU of the last stage (``Extras``); its layers only for ``lower``."""
    d = x.draft_model
    if x.draft in SEPARATE_DRAFTS:
        return weight_params(d).total * dtype / s.tp if d is not None else 0.0
    if not x.draft:
        return 0.0
    g = d or model  # the draft's geometry, else one decoder layer of the target's
    h = g.hidden_size or g.num_attention_heads * g.head_dim
    q, kv = g.num_attention_heads * g.head_dim, g.num_kv_heads * g.head_dim
    qkv_in = 2 * h  # Eagle3Attention's qkv_proj takes the embedding and the hidden state side by side
    layer = qkv_in * (q + 2 * kv) + q * h + 3 * h * (g.intermediate_size or 4 * h)
    layers = (d.num_layers if d is not None else 1) * layer / (s.tp if lower else s.attn_tp)
    if lower:
        return layers * dtype
    target_h = model.hidden_size or h
    fc = x.capture_layers * target_h * h if x.capture_layers > 1 else 0
    lm_tp = s.tp if (s.lm_head_tp or not s.attention_dp) else 1
    lm_head = (g.draft_vocab_size or g.vocab_size or model.vocab_size) * h / lm_tp
    return (layers + fc + lm_head) * dtype


def weights_per_gpu(model: ModelSpec, q: WeightsQuant, s: Sharding, extras: Extras = NO_EXTRAS, lower: bool = False
                    ) -> tuple[int, tuple[tuple[str, int], ...]]:
    """Weight bytes on the fullest rank of a server sharded as ``s``, with what its options add (``extras``:
    MTP modules, redundant expert slots, a draft model). ``lower``: the lower bound (every weight split over the
    whole TP group, at the narrowest width the checkpoint could have)."""
    w = weight_params(model)
    b = _bytes_per_weight(q, model, lower)
    attn_tp = s.tp if lower else s.attn_tp
    mlp_tp = attn_tp  # dense MLPs and shared experts follow attention (DP under attention DP)
    attn = w.attn_split / attn_tp * b["attention"] + w.attn_replicated * b["attention"] / (s.tp if lower else 1)
    per_dense = attn + w.dense_mlp / mlp_tp * b["mlp"]
    per_moe = attn + w.experts / s.tp * b["experts"] + w.shared / mlp_tp * b["shared"] + w.router * b["embedding"]
    # redundant expert slots (EPLB): slots - experts more experts' weights in every MoE layer, split as the experts
    slots = extras.expert_slots
    slot_share = max(0, slots - model.num_experts) / model.num_experts if slots and model.num_experts else 0.0
    per_slots = w.experts * slot_share / s.tp * b["experts"]
    embed = w.embed / attn_tp * b["embedding"]
    lm_tp = s.tp if (lower or s.lm_head_tp or not s.attention_dp) else 1
    lm_head = w.lm_head / lm_tp * b["embedding"]
    mtp_bytes = 0.0
    if extras.mtp_modules and w.mtp_layer:
        m_attn = (w.attn_split / attn_tp + w.attn_replicated / (s.tp if lower else 1))
        mtp_bytes = extras.mtp_modules * (m_attn + w.experts * (1 + slot_share) / s.tp + w.shared / mlp_tp
                                          + 2 * model.hidden_size * model.hidden_size) * b["mtp"]
    draft = _draft_bytes(model, extras, s, min(2.0, b["embedding"]), lower)
    # Pipeline stages (tensorrt_llm/mapping.py pp_layers: torch.tensor_split, the first ranks one layer more):
    # the first holds the embedding and the leading (dense) layers, the last the lm_head, the MTP layers, the draft.
    layers = w.dense_layers + w.moe_layers
    first_n = math.ceil(layers / s.pp)
    last_n = layers // s.pp if s.pp > 1 else layers

    def stage(n_layers: int, first: bool) -> tuple[float, dict[str, float]]:
        dense = min(n_layers, w.dense_layers) if first else max(0, n_layers - w.moe_layers)
        moe = n_layers - dense
        parts = {"layers": dense * per_dense + moe * per_moe, "expert_slots": moe * per_slots}
        if first or s.pp == 1:
            parts["embedding"] = embed
        if not first or s.pp == 1:
            parts["lm_head"] = lm_head
            parts["mtp"] = mtp_bytes
            parts["draft"] = draft
        return sum(parts.values()), parts

    candidates = [stage(first_n, True)] + ([stage(last_n, False)] if s.pp > 1 else [])
    total, parts = max(candidates, key=lambda t: t[0])
    detail = tuple((k, int(v)) for k, v in parts.items() if v)
    return int(total), detail


def _family(model: ModelSpec) -> str:
    if model.is_moe:
        return "moe"
    return "llama" if model.architecture in _LLAMA_FAMILY else "default"


def activation_bytes(model: ModelSpec, s: Sharding, tokens: int) -> int:
    """aiconfigurator's estimate of a forward pass over ``tokens`` tokens on one rank (see the module doc)."""
    if tokens <= 0:
        return 0
    h = model.num_attention_heads * model.head_dim if model.attention != "mla" else \
        (model.hidden_size or model.num_attention_heads * model.head_dim)
    tp = min(8, 1 << (max(1, s.attn_tp).bit_length() - 1))
    coeff = _ACTIVATION_COEFF[_family(model)][tp]
    act = 2 * tokens * h * coeff
    if model.attention == "mla" and model.is_moe:  # DeepSeek-family MoE dispatch workspace (block scale 128, fp32)
        dp = s.tp if s.attention_dp else 1
        act += tokens * h * dp * model.num_experts * model.experts_per_token / max(1, s.ep) / 128 * 4
    return int(max(act, _MIN_ACTIVATION_BYTES))


def kv_bytes_per_token(model: ModelSpec, kv_dtype: str, s: Sharding, extra_layers: int, full_only: bool = False
                       ) -> int:
    """KV bytes one token takes on the fullest rank of a server sharded as ``s``: all heads under attention DP,
    ceil(kv_heads / tp) otherwise (MLA's latent on every rank), the rank's layers plus ``extra_layers`` (MTP) on the
    last stage (facts.models.ModelSpec.kv_bytes_per_token_per_rank, the one computation)."""
    return model.kv_bytes_per_token_per_rank(kv_dtype, s.attn_tp, s.pp, extra_layers, full_only=full_only)


def role_memory(model: ModelSpec, gpu: GpuFigures, q: WeightsQuant, s: Sharding, *, opts: dict,
                sequence_tokens: int, kv_extra_layers: int, buffer_tokens: int = 0,
                draft_model: ModelSpec | None = None) -> RoleMemory:
    """The memory plan of one GPU of a server whose LLM-API options are ``opts`` (ctx.yaml / gen.yaml, or a
    published recipe's): max_batch_size, max_num_tokens, kv_cache_config (dtype, free_gpu_memory_fraction,
    max_tokens), cuda_graph_config, speculative_config, moe_config.load_balancer. ``sequence_tokens``: the longest
    request the role holds (a context server's longest input, a generation server's max_seq_len). ``draft_model``:
    the speculative draft's config.json, where tk could read it (``Extras``)."""
    kv_cfg = _mapping(opts.get("kv_cache_config"))
    fraction = _fraction(kv_cfg.get("free_gpu_memory_fraction"), 0.9)  # TensorRT-LLM's KvCacheConfig default
    kv_dtype = kv_cfg.get("dtype") if kv_cfg.get("dtype") in KV_DTYPE_BYTES else "auto"
    spec = _mapping(opts.get("speculative_config"))
    draft = _count(spec.get("num_nextn_predict_layers"), 0)
    mnt = _count(opts.get("max_num_tokens"), 8192)  # TensorRT-LLM's default
    batch = _count(opts.get("max_batch_size"), 2048)
    graphs = _mapping(opts.get("cuda_graph_config"))
    sizes = graphs.get("batch_sizes") if isinstance(graphs.get("batch_sizes"), list) else []
    graph_batch = max([_count(x, 0) for x in sizes] + [_count(graphs.get("max_batch_size"), 0)]) if graphs else 0
    extras = extras_of(model, opts, draft_model)
    weights, detail = weights_per_gpu(model, q, s, extras)
    weights_min, _ = weights_per_gpu(model, q, s, extras, lower=True)
    act = activation_bytes(model, s, mnt)
    graph = activation_bytes(model, s, graph_batch * (1 + draft)) if graph_batch else 0
    runtime = RUNTIME_OTHER_BYTES + nccl_bytes(s.tp)
    capacity = gpu.memory_bytes
    free = capacity - weights - act - graph - runtime
    pool = max(0, int(free * fraction))
    per_token = kv_bytes_per_token(model, kv_dtype, s, kv_extra_layers)
    cap_tokens = _count(kv_cfg.get("max_tokens"), 0)
    tokens = pool // per_token if per_token else 0
    notes = []
    if 0 < cap_tokens < tokens:
        tokens, pool = cap_tokens, cap_tokens * per_token
        notes.append(f"kv_cache_config.max_tokens {cap_tokens} caps the pool")
    optimistic_per_token = kv_bytes_per_token(model, kv_dtype, s, kv_extra_layers, full_only=True)
    optimistic = max(0, int((capacity - weights_min) * fraction)) // max(1, optimistic_per_token)
    if model.sliding_layers:
        notes.append(f"{model.sliding_layers} sliding-window layers ({model.sliding_window} tokens) are counted "
                     "as full layers: the pool holds more tokens than shown")
    notes.extend(extras_notes(model, opts, extras))
    buffer = buffer_tokens * per_token
    return RoleMemory(
        gpu=gpu.name, gpu_memory_bytes=capacity, quantization=q.name, quantization_source=q.source,
        weights_bytes=weights, weights_min_bytes=weights_min, weights_detail=detail, activation_bytes=act,
        cuda_graph_bytes=graph, runtime_bytes=runtime, free_gpu_memory_fraction=fraction,
        kv_pool_bytes=pool, kv_dtype=kv_dtype, kv_bytes_per_token=per_token, kv_pool_tokens=int(tokens),
        kv_pool_tokens_max=int(optimistic), sequence_tokens=sequence_tokens, max_batch_size=batch,
        batch_tokens=batch * sequence_tokens, transfer_buffer_bytes=buffer,
        headroom_bytes=max(0, int(free - pool)), notes=tuple(notes))


def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


def _count(value, default: int) -> int:
    """A positive integer option, or ``default`` (ill-typed values are the rules' to report)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < (1 << 40) else default


def _fraction(value, default: float) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 < value <= 1
    return float(value) if ok else default


# --- rules ------------------------------------------------------------------------------------------------------

def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def check_heads(model: ModelSpec, tp: int, attention_dp: bool) -> str | None:
    """Why TensorRT-LLM refuses this attention split (module doc: Attention/MLA asserts, duplicate_kv_weight),
    or None."""
    attn_tp = 1 if attention_dp else tp
    if attn_tp == 1:
        return None
    heads = model.num_attention_heads
    if heads % attn_tp:
        return f"tp={tp} does not divide the model's {heads} attention heads (TensorRT-LLM asserts num_heads % tp == 0)"
    if model.attention == "mla":
        return None
    kv = model.num_kv_heads
    if kv >= attn_tp and kv % attn_tp:
        return (f"tp={tp} does not divide the model's {kv} KV heads (TensorRT-LLM asserts num_kv_heads % tp == 0 "
                "when there are at least as many KV heads as ranks)")
    if kv < attn_tp and attn_tp % kv:
        return (f"tp={tp} is not a multiple of the model's {kv} KV heads (TensorRT-LLM replicates each KV head "
                "tp / num_kv_heads times and asserts that it divides)")
    return None


def smallest_fit(model: ModelSpec, gpu: GpuFigures, q: WeightsQuant, opts: dict, *, sequence_tokens: int,
                 kv_extra_layers: int, pp: int = 1) -> str | None:
    """The smallest layout (GPUs per instance, powers of two up to 512) whose estimated KV pool holds one full
    sequence, as recipe fields; None when none does."""
    for tp in (1 << i for i in range(10)):
        layouts = []
        if model.is_moe:
            layouts += [Sharding(tp, pp, False, tp), Sharding(tp, pp, True, tp)] if tp > 1 else \
                [Sharding(1, pp, False, 1)]
        else:
            layouts.append(Sharding(tp, pp, False, 1))
        for s in layouts:
            if check_heads(model, s.tp, s.attention_dp):
                continue
            m = role_memory(model, gpu, q, s, opts=opts, sequence_tokens=sequence_tokens,
                            kv_extra_layers=kv_extra_layers)
            if m.kv_pool_tokens >= sequence_tokens:
                fields = f"tp: {s.tp}" + (f", ep: {s.ep}" if model.is_moe else "") + \
                    (", attention_dp: true" if s.attention_dp else "") + (f", pp: {pp}" if pp > 1 else "")
                return (f"{s.tp * pp} x {gpu.name} per instance ({fields}): weights ≈ {gib(m.weights_bytes)} per "
                        f"GPU, a KV pool of ≈ {m.kv_pool_tokens:,} tokens")
    return None


def verdicts(title: str, m: RoleMemory, model: ModelSpec, gpu: GpuFigures, q: WeightsQuant, opts: dict, *,
             kv_extra_layers: int, pp: int) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(violations as (field, message, fix), warnings) for one role's memory plan."""
    errors: list[tuple[str, str, str]] = []
    warnings: list[str] = []
    cap = m.gpu_memory_bytes
    fit = None

    def fix() -> str:
        nonlocal fit
        if fit is None:
            fit = smallest_fit(model, gpu, q, opts, sequence_tokens=m.sequence_tokens,
                               kv_extra_layers=kv_extra_layers, pp=pp) or ""
        return f"use at least {fit}" if fit else "use a quantized checkpoint (quantization: fp8 or nvfp4) or a " \
                                                 "GPU with more memory"

    if m.weights_min_bytes > cap:
        errors.append((f"{title}.tp", f"{model.name}'s weights need at least {gib(m.weights_min_bytes)} per GPU "
                       f"({m.quantization}: {m.quantization_source}), more than one {gpu.name}'s {gib(cap)}", fix()))
        return errors, warnings
    if m.kv_pool_tokens_max < m.sequence_tokens:
        errors.append((f"{title}.tp", f"even with no activations, the KV pool of a {gpu.name} holding "
                       f"{gib(m.weights_min_bytes)} of weights cannot hold one full sequence ({m.sequence_tokens:,} "
                       f"tokens at {m.kv_bytes_per_token:,} B per token, free_gpu_memory_fraction "
                       f"{m.free_gpu_memory_fraction:g})", fix()))
        return errors, warnings
    used = m.weights_bytes + m.activation_bytes + m.cuda_graph_bytes + m.runtime_bytes
    if m.weights_bytes > cap:
        warnings.append(f"{title}: weights ≈ {gib(m.weights_bytes)} per GPU ({m.quantization}) exceed a "
                        f"{gpu.name}'s {gib(cap)}; they fit only if the checkpoint is smaller than estimated; "
                        f"{fix()}")
    elif m.kv_pool_tokens < m.sequence_tokens:
        warnings.append(f"{title}: the KV pool (≈ {gib(m.kv_pool_bytes)} after ≈ {gib(used)} of weights, "
                        f"activations and runtime) holds ≈ {m.kv_pool_tokens:,} tokens, less than one full sequence "
                        f"({m.sequence_tokens:,} tokens); {fix()}, or raise free_gpu_memory_fraction / lower "
                        f"max_num_tokens")
    elif m.kv_pool_tokens < m.batch_tokens:
        held = m.kv_pool_tokens // max(1, m.sequence_tokens)
        warnings.append(f"{title}: the KV pool holds ≈ {m.kv_pool_tokens:,} tokens, {held} full sequences of "
                        f"{m.sequence_tokens:,} tokens, fewer than max_batch_size "
                        f"{m.max_batch_size} (TensorRT-LLM then schedules fewer requests at once)")
    if m.transfer_buffer_bytes and m.transfer_buffer_bytes > m.headroom_bytes:
        warnings.append(f"{title}: the KV transfer buffer (max_tokens_in_buffer: {gib(m.transfer_buffer_bytes)}) "
                        f"is larger than the memory the KV pool leaves free (≈ {gib(m.headroom_bytes)}); lower "
                        "free_gpu_memory_fraction if the servers run out of memory at the first transfer")
    return errors, warnings


def check_quantization_hardware(gpu: GpuFigures, q: WeightsQuant, kv_dtype: str) -> list[str]:
    """Warnings for formats TensorRT-LLM's hardware support matrix does not list for the GPU
    (docs/source/features/quantization.md, "Hardware Support Matrix", NVIDIA/TensorRT-LLM @
    09d4c79ba941a5c2c62c878c3572c0dcc8b85efa). No start-up check refusing them is known, so tk warns: NVFP4 is
    listed for Blackwell only; MXFP4 for Blackwell (gpt-oss also runs W4A16 MXFP4 on Hopper, which aiconfigurator
    0.12.0 models); FP8 KV cache is listed for every architecture down to Ampere, so fp8 KV on A100 is accepted."""
    out = []
    if gpu.arch in ("", "blackwell"):
        return out
    if q.name == "nvfp4":
        out.append(f"quantization nvfp4 on {gpu.name} ({gpu.arch}): TensorRT-LLM's hardware support matrix lists "
                   "NVFP4 for Blackwell only; expect the checkpoint to fail to load or to run without FP4 kernels")
    if q.name == "mxfp4" and gpu.arch != "hopper":
        out.append(f"quantization mxfp4 on {gpu.name} ({gpu.arch}): TensorRT-LLM lists MXFP4 for Blackwell (and "
                   "W4A16 MXFP4 runs on Hopper); expect no MXFP4 kernels here")
    if q.name in ("fp8", "fp8_block", "fp8_rowwise") and gpu.arch == "ampere":
        out.append(f"quantization {q.name} on {gpu.name}: TensorRT-LLM's hardware support matrix lists FP8 weights "
                   "from Ada/Hopper on; Ampere has no FP8 tensor cores")
    if kv_dtype == "nvfp4":
        out.append(f"kv dtype nvfp4 on {gpu.name} ({gpu.arch}): an NVFP4 KV cache needs Blackwell")
    return out


def sharding_of(model: ModelSpec, opts: dict) -> Sharding:
    """A server's sharding as its LLM-API options say (what TensorRT-LLM reads)."""
    tp = _count(opts.get("tensor_parallel_size"), 1)
    ep = _count(opts.get("moe_expert_parallel_size"), tp) if model.is_moe else 1
    return Sharding(tp=tp, pp=_count(opts.get("pipeline_parallel_size"), 1),
                    attention_dp=bool(opts.get("enable_attention_dp")), ep=ep,
                    lm_head_tp=bool(opts.get("enable_lm_head_tp_in_adp")))


def heads_problems(title: str, model: ModelSpec, s: Sharding) -> list[tuple[str, str, str]]:
    """The attention split TensorRT-LLM refuses (``check_heads``) as a violation (field, message, fix), or none."""
    why = check_heads(model, s.tp, s.attention_dp)
    if not why:
        return []
    valid = [t for t in (1 << i for i in range(10)) if t <= max(64, s.tp) and check_heads(model, t, False) is None]
    return [(f"{title}.tp", why, f"use a tp that fits the heads ({', '.join(map(str, valid))})"
             + (", or attention_dp: true" if model.is_moe else ""))]


def plan_role(title: str, model: ModelSpec, gpu: GpuFigures, q: WeightsQuant, opts: dict, *, sequence_tokens: int,
              kv_extra_layers: int, buffer_tokens: int = 0
              ) -> tuple[RoleMemory | None, list[tuple[str, str, str]], list[str]]:
    """One server's memory plan and its verdicts, for options outside a plan (a published recipe's): (plan,
    violations as (field, message, fix), warnings). No plan for a GPU whose memory tk does not know."""
    s = sharding_of(model, opts)
    errors = heads_problems(title, model, s)
    if not gpu.memory_bytes:
        return None, errors, []
    m = role_memory(model, gpu, q, s, opts=opts, sequence_tokens=sequence_tokens, kv_extra_layers=kv_extra_layers,
                    buffer_tokens=buffer_tokens)
    more, warnings = verdicts(title, m, model, gpu, q, opts, kv_extra_layers=kv_extra_layers, pp=s.pp)
    return m, errors + more, warnings


def sequence_tokens(r, title: str, opts: dict) -> int:
    """The longest request a role's server holds: a context server's longest input, a generation server's
    max_seq_len."""
    from toolkit.plan.sizing import longest_input

    if title == "context":
        return longest_input(r)
    return _count(opts.get("max_seq_len"), longest_input(r) + r.traffic.max_output_len)


def role_memories(r, model: ModelSpec, engine, q: WeightsQuant, merged: dict[str, dict], kv_extra_layers: int,
                  drafts: dict[str, ModelSpec | None] | None = None) -> dict[str, RoleMemory]:
    """The memory plan of one GPU of each role's servers (``merged``: title -> LLM-API options; ``drafts``: title ->
    the speculative draft's config.json where tk could read it): only for an engine whose KV cache lives on the GPU
    (TensorRT-LLM) and a GPU whose memory tk knows. ``check_roles`` judges them."""
    from toolkit.facts.hardware import GPU_FIGURES

    gpu = GPU_FIGURES[r.cluster.gpu]
    if engine.kv_memory != "gpu" or not gpu.memory_bytes:
        return {}
    return {title: role_memory(model, gpu, q, sharding_of(model, opts), opts=opts,
                               sequence_tokens=sequence_tokens(r, title, opts), kv_extra_layers=kv_extra_layers,
                               buffer_tokens=_count(_mapping(opts.get("cache_transceiver_config")).get(
                                   "max_tokens_in_buffer"), 0), draft_model=(drafts or {}).get(title))
            for title, opts in merged.items()}


def check_roles(r, model: ModelSpec, engine, q: WeightsQuant, note: str | None, merged: dict[str, dict],
                memories: dict[str, RoleMemory], kv_extra_layers: int, c, general: bool = True) -> None:
    """The rules on the roles' memory (module doc), to the rules' collector ``c``: the attention split, weights
    that cannot fit, a KV pool that cannot hold one sequence; warnings for what depends on the estimates
    (``general``: also the plan-wide quantization warnings). Only for an engine whose KV cache lives on the GPU."""
    from toolkit.facts.hardware import GPU_FIGURES

    if engine.kv_memory != "gpu":
        return
    gpu = GPU_FIGURES[r.cluster.gpu]
    if note and general:
        c.warnings.append(note)
    if general:
        c.warnings.extend(check_quantization_hardware(gpu, q, r.kv_transfer.dtype))
    for title, opts in merged.items():
        s = sharding_of(model, opts)
        errors, warnings = heads_problems(title, model, s), []
        if title in memories:
            more, warnings = verdicts(title, memories[title], model, gpu, q, opts, kv_extra_layers=kv_extra_layers,
                                      pp=s.pp)
            errors += more
        for field, message, fix in errors:
            c.add(field, message, fix)
        c.warnings.extend(warnings)
