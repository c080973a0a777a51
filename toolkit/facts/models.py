"""Model facts: what tk needs to know about a model to size its KV cache.

A model is either a built-in name (the table below, numbers taken from each model's
Hugging Face ``config.json``) or a local directory holding a ``config.json``.

Pure Python, no heavy imports: the CPU stand-in engine imports this module too.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

# Bytes per element of the KV cache for each kv dtype tk accepts.
KV_DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "fp8": 1, "nvfp4": 0.5625}
# nvfp4: 4 bits per value plus one fp8 scale per 16 values = 4.5 bits.


class ModelError(ValueError):
    """A model name or directory tk cannot use; the message says why and what to do."""


@dataclass(frozen=True)
class ModelSpec:
    """The attention and size facts of one model."""

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    params: float  # total parameters
    active_params: float  # parameters used per token (MoE: shared + routed experts)
    attention: str = "gqa"  # "gqa" (MHA/GQA/MQA) or "mla"
    kv_lora_rank: int = 0  # MLA only
    qk_rope_head_dim: int = 0  # MLA only
    num_experts: int = 0  # routed experts; 0 for dense models
    experts_per_token: int = 0
    max_position_embeddings: int = 0
    dtype: str = "bfloat16"
    source: str = "built-in"

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def kv_bytes_per_token_per_layer(self, kv_dtype: str) -> float:
        """KV cache bytes one token takes in one layer: K and V of every KV head (GQA/MHA), or the
        compressed latent plus the rope key (MLA)."""
        elem = KV_DTYPE_BYTES[kv_dtype]
        if self.attention == "mla":
            return (self.kv_lora_rank + self.qk_rope_head_dim) * elem
        return 2 * self.num_kv_heads * self.head_dim * elem

    @property
    def kv_factor(self) -> int:
        """How many tensors one layer's KV cache is: K and V (GQA/MHA), or one latent (MLA)."""
        return 1 if self.attention == "mla" else 2

    def kv_bytes_per_token_per_layer_per_rank(self, kv_dtype: str, tp: int) -> float:
        """KV bytes one token takes in one layer on one tensor-parallel rank: TP splits the KV heads
        (at least one per rank); MLA's latent is replicated on every rank, not split."""
        elem = KV_DTYPE_BYTES[kv_dtype]
        if self.attention == "mla":
            return (self.kv_lora_rank + self.qk_rope_head_dim) * elem
        return 2 * max(1, self.num_kv_heads // tp) * self.head_dim * elem

    def layers_per_rank(self, pp: int) -> int:
        """Layers one pipeline-parallel rank holds (the first ranks take the remainder)."""
        return math.ceil(self.num_layers / pp)

    def kv_bytes_per_token_per_rank(self, kv_dtype: str, tp: int, pp: int) -> int:
        """KV bytes one token takes on one rank of a tp x pp server, all of that rank's layers."""
        return int(self.kv_bytes_per_token_per_layer_per_rank(kv_dtype, tp) * self.layers_per_rank(pp))

    def to_dict(self) -> dict:
        return asdict(self)


def _gqa(name, layers, heads, kv_heads, head_dim, params, active=None, experts=0, topk=0, ctx=131072):
    return ModelSpec(name=name, num_layers=layers, num_attention_heads=heads, num_kv_heads=kv_heads,
                     head_dim=head_dim, params=params, active_params=active or params,
                     num_experts=experts, experts_per_token=topk, max_position_embeddings=ctx)


BUILTIN_MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        _gqa("meta-llama/Llama-3.1-8B-Instruct", 32, 32, 8, 128, 8.03e9),
        _gqa("meta-llama/Llama-3.3-70B-Instruct", 80, 64, 8, 128, 70.6e9),
        _gqa("Qwen/Qwen3-0.6B", 28, 16, 8, 128, 0.6e9, ctx=40960),
        _gqa("Qwen/Qwen3-32B", 64, 64, 8, 128, 32.8e9, ctx=40960),
        _gqa("Qwen/Qwen3-235B-A22B", 94, 64, 4, 128, 235e9, active=22e9, experts=128, topk=8, ctx=40960),
        _gqa("mistralai/Mixtral-8x7B-Instruct-v0.1", 32, 32, 8, 128, 46.7e9, active=12.9e9,
             experts=8, topk=2, ctx=32768),
        _gqa("openai/gpt-oss-120b", 36, 64, 8, 64, 117e9, active=5.1e9, experts=128, topk=4),
        ModelSpec(name="deepseek-ai/DeepSeek-R1", num_layers=61, num_attention_heads=128,
                  num_kv_heads=1, head_dim=576, params=671e9, active_params=37e9, attention="mla",
                  kv_lora_rank=512, qk_rope_head_dim=64, num_experts=256, experts_per_token=8,
                  max_position_embeddings=163840),
        ModelSpec(name="deepseek-ai/DeepSeek-V3", num_layers=61, num_attention_heads=128,
                  num_kv_heads=1, head_dim=576, params=671e9, active_params=37e9, attention="mla",
                  kv_lora_rank=512, qk_rope_head_dim=64, num_experts=256, experts_per_token=8,
                  max_position_embeddings=163840),
        # A synthetic model for the CPU stand-in engine: small enough that many requests'
        # KV caches move through NIXL on a laptop. Not a real checkpoint.
        _gqa("tk/standin-tiny", 4, 8, 2, 64, 50e6, ctx=8192),
    ]
}

# Short aliases users type.
ALIASES = {m.split("/", 1)[1].lower(): m for m in BUILTIN_MODELS}


def builtin_names() -> list[str]:
    return sorted(BUILTIN_MODELS)


def resolve_model(name_or_dir: str, base_dir: str | os.PathLike | None = None) -> ModelSpec:
    """A built-in name (full or short, case-insensitive) or a directory with config.json."""
    if name_or_dir in BUILTIN_MODELS:
        return BUILTIN_MODELS[name_or_dir]
    alias = ALIASES.get(name_or_dir.lower()) or ALIASES.get(name_or_dir.split("/")[-1].lower())
    if alias and not _looks_like_path(name_or_dir):
        return BUILTIN_MODELS[alias]
    path = Path(name_or_dir).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if path.is_dir():
        return from_config_json(path / "config.json")
    raise ModelError(
        f"unknown model {name_or_dir!r}: use a built-in name ({', '.join(builtin_names())}) "
        f"or a local directory holding a Hugging Face config.json"
    )


def _looks_like_path(s: str) -> bool:
    return s.startswith(("/", "./", "../", "~"))


def from_config_json(path: Path) -> ModelSpec:
    """Read the attention geometry from a Hugging Face config.json."""
    if not path.is_file():
        raise ModelError(f"{path}: no config.json in the model directory")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{path}: expected a JSON object")
    cfg = {**cfg.get("text_config", {}), **cfg} if isinstance(cfg.get("text_config"), dict) else cfg

    def need(*keys):
        for k in keys:
            if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool):
                return cfg[k]
        raise ModelError(f"{path}: missing integer field {keys[0]!r}; tk needs it to size the KV cache")

    layers = need("num_hidden_layers", "n_layer", "num_layers")
    heads = need("num_attention_heads", "n_head")
    hidden = cfg.get("hidden_size") or cfg.get("n_embd") or 0
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    topk = int(cfg.get("num_experts_per_tok") or cfg.get("num_experts_per_token") or 0)
    params = _estimate_params(cfg, layers, hidden, experts)
    active = _estimate_params(cfg, layers, hidden, topk) if experts else params
    name = str(path.parent)
    if isinstance(cfg.get("kv_lora_rank"), int):
        return ModelSpec(name=name, num_layers=layers, num_attention_heads=heads, num_kv_heads=1,
                         head_dim=cfg["kv_lora_rank"] + int(cfg.get("qk_rope_head_dim", 0)),
                         params=params, active_params=active, attention="mla",
                         kv_lora_rank=cfg["kv_lora_rank"], qk_rope_head_dim=int(cfg.get("qk_rope_head_dim", 0)),
                         num_experts=experts, experts_per_token=topk,
                         max_position_embeddings=int(cfg.get("max_position_embeddings", 0)),
                         dtype=str(cfg.get("torch_dtype", "bfloat16")), source=str(path))
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or (hidden // heads if hidden else 0)
    if not head_dim:
        raise ModelError(f"{path}: neither head_dim nor hidden_size is set; tk cannot size the KV cache")
    return ModelSpec(name=name, num_layers=layers, num_attention_heads=heads, num_kv_heads=int(kv_heads),
                     head_dim=int(head_dim), params=params, active_params=active,
                     num_experts=experts, experts_per_token=topk,
                     max_position_embeddings=int(cfg.get("max_position_embeddings", 0)),
                     dtype=str(cfg.get("torch_dtype", "bfloat16")), source=str(path))


def _estimate_params(cfg: dict, layers: int, hidden: int, experts: int) -> float:
    """Rough parameter count: attention 4h^2 plus MLP 3·h·ffn per (active) expert, plus embeddings."""
    if not hidden:
        return 0.0
    ffn = cfg.get("moe_intermediate_size") if experts else None
    ffn = ffn or cfg.get("intermediate_size") or 4 * hidden
    mlp = 3 * hidden * ffn * max(experts, 1)
    vocab = cfg.get("vocab_size") or 0
    return float(layers * (4 * hidden * hidden + mlp) + 2 * vocab * hidden)
