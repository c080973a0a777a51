"""Model facts: what tk needs to know about a model to size its KV cache.

A model is either a built-in name (the table below, numbers taken from each model's
Hugging Face ``config.json``) or a local directory holding a ``config.json``.

Pure Python, no heavy imports: the CPU stand-in engine imports this module too.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

# Bytes per element of the KV cache for each kv dtype tk accepts.
KV_DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "fp8": 1, "nvfp4": 0.5625}
# nvfp4: 4 bits per value plus one fp8 scale per 16 values = 4.5 bits.


class ModelError(ValueError):
    """A model name or directory tk cannot use; the message says why, ``fix`` what to do."""

    def __init__(self, message: str, fix: str = ""):
        super().__init__(message)
        self.fix = fix


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

    def layers_per_rank(self, pp: int, extra_layers: int = 0) -> int:
        """KV layers the fullest pipeline-parallel rank holds. TensorRT-LLM splits the model's layers like
        torch.tensor_split (the first ``num_layers % pp`` ranks take one more: Mapping.pp_layers in
        tensorrt_llm/mapping.py) and appends ``extra_layers`` (speculative-decoding KV layers, e.g. MTP) to
        the last rank (get_pp_layers in tensorrt_llm/_torch/pyexecutor/resource_manager.py)."""
        if not extra_layers:
            return math.ceil(self.num_layers / pp)
        return max(math.ceil(self.num_layers / pp), self.num_layers // pp + extra_layers)

    def kv_bytes_per_token_per_rank(self, kv_dtype: str, tp: int, pp: int, extra_layers: int = 0) -> int:
        """KV bytes one token takes on the fullest rank of a tp x pp server, all of that rank's layers."""
        return int(self.kv_bytes_per_token_per_layer_per_rank(kv_dtype, tp) * self.layers_per_rank(pp, extra_layers))

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


# A Hugging Face model id: ORG/NAME (https://huggingface.co/docs/hub/models-uploading: repo ids are a namespace
# and a name of letters, digits, '-', '_' and '.').
HF_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9_.-]{1,96}", re.ASCII)


def resolve_model(name_or_dir: str, base_dir: str | os.PathLike | None = None,
                  config_dirs: tuple[tuple[str, str | os.PathLike], ...] = ()) -> ModelSpec:
    """A built-in name (full or short, case-insensitive), a directory with config.json, or a Hugging Face id
    (ORG/NAME) whose config.json tk can read here: in one of ``config_dirs`` ((what, directory) pairs the caller
    knows the checkpoint is in, e.g. the recipe's model_path), or in the Hugging Face cache
    (``huggingface-cli download ORG/NAME config.json`` puts it there). Relative paths resolve against base_dir.

    Raises ModelError naming what was looked for: a path that does not exist (resolved), or where an id's
    config.json was looked for."""
    if name_or_dir in BUILTIN_MODELS:
        return BUILTIN_MODELS[name_or_dir]
    alias = ALIASES.get(name_or_dir.lower()) or ALIASES.get(name_or_dir.split("/")[-1].lower())
    if alias and not _looks_like_path(name_or_dir):
        return BUILTIN_MODELS[alias]
    path = _resolved(name_or_dir, base_dir)
    if _is_dir(path):
        return from_config_json(path / "config.json")
    hf_id = HF_ID.fullmatch(name_or_dir) is not None and not _looks_like_path(name_or_dir)
    if "/" not in name_or_dir and not _looks_like_path(name_or_dir):
        import difflib

        known = {**ALIASES, **{n.lower(): n for n in BUILTIN_MODELS}}
        guess = difflib.get_close_matches(name_or_dir.lower(), list(known), 1, 0.6)
        raise ModelError(f"unknown model {name_or_dir!r}: not a built-in name, and no directory {path} here",
                         (f"did you mean {known[guess[0]]!r}? " if guess else "") +
                         "`tk recipes --models` lists the built-in models; or give a Hugging Face id (ORG/NAME) or a "
                         "directory with config.json")
    if not hf_id or _is_dir(path.parent):
        # Written as a path (or its parent directory exists here): a mistyped or missing directory.
        raise ModelError(f"model directory {path} does not exist" + ("" if path.parent.exists() else
                                                                      f" (nor does {path.parent})"),
                         f"correct the path (relative paths are read from the recipe's directory, "
                         f"{base_dir or os.getcwd()}), or use a built-in name (tk recipes --models)")
    looked = []
    for what, directory in config_dirs:
        candidate = _resolved(os.fspath(directory), base_dir)
        looked.append(f"{candidate}/config.json ({what})")
        if (candidate / "config.json").is_file():
            return from_config_json(candidate / "config.json", name=name_or_dir)
    cached, where = hf_cache_config(name_or_dir)
    looked.append(f"{where} (the Hugging Face cache)")
    if cached is not None:
        return from_config_json(cached, name=name_or_dir)
    raise ModelError(
        f"model {name_or_dir!r} is not built in (tk recipes --models) and no config.json for it was found here: "
        f"looked in {'; '.join(looked)}",
        f"fetch its config.json into the Hugging Face cache on this machine (`huggingface-cli download "
        f"{name_or_dir} config.json`), or set model_path to the checkpoint directory where this machine sees it, "
        "or point model at a directory holding its config.json")


def hf_cache_config(repo_id: str) -> tuple[Path | None, str]:
    """config.json of ``repo_id`` in the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else
    ~/.cache/huggingface/hub: models--ORG--NAME/snapshots/REVISION/), the snapshot refs/main names first, and
    where it was looked for."""
    env = os.environ
    try:
        hub = Path(env["HF_HUB_CACHE"]) if env.get("HF_HUB_CACHE") else \
            Path(env["HF_HOME"]) / "hub" if env.get("HF_HOME") else Path.home() / ".cache" / "huggingface" / "hub"
    except RuntimeError:  # no home directory
        return None, "the Hugging Face cache (no home directory)"
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    where = f"{repo}/snapshots/*/config.json"
    try:
        main = (repo / "refs" / "main").read_text().strip()[:64] if (repo / "refs" / "main").is_file() else ""
        snapshots = sorted((p for p in (repo / "snapshots").iterdir() if p.is_dir()),
                           key=lambda p: (p.name != main, -p.stat().st_mtime))[:64]
    except OSError:
        return None, where
    for snapshot in snapshots:
        if (snapshot / "config.json").is_file():
            return snapshot / "config.json", where
    return None, where


def _resolved(text: str, base_dir: str | os.PathLike | None) -> Path:
    path = Path(text).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    return Path(os.path.normpath(path))


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):  # a name the OS cannot take (NUL byte, too long)
        return False


def _looks_like_path(s: str) -> bool:
    return s.startswith(("/", "./", "../", "~"))


# The most a config.json may hold (bytes), and the bounds of the fields tk reads: far above any real model,
# low enough that every number tk derives (bytes per token, parameter estimates) stays a finite float.
CONFIG_MAX_BYTES = 16 << 20
_BOUNDS = {
    "layers": 1 << 16, "heads": 1 << 16, "kv_heads": 1 << 16, "hidden": 1 << 20, "head_dim": 1 << 16,
    "experts": 1 << 16, "topk": 1 << 16, "positions": 1 << 31, "ffn": 1 << 24, "vocab": 1 << 28,
    "kv_lora_rank": 1 << 16, "qk_rope_head_dim": 1 << 16,
}
_MISSING = object()


def _short(value) -> str:
    text = json.dumps(value, allow_nan=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _read_config(path: Path) -> dict:
    try:
        if not path.is_file():
            raise ModelError(f"{path}: no config.json in the model directory",
                             "point model at a directory that holds the checkpoint's Hugging Face config.json")
        with open(path, "rb") as f:
            data = f.read(CONFIG_MAX_BYTES + 1)
    except OSError as exc:
        raise ModelError(f"{path}: cannot read the file ({exc.strerror or exc})",
                         "make config.json readable by the user running tk") from None
    if len(data) > CONFIG_MAX_BYTES:
        raise ModelError(f"{path}: larger than {CONFIG_MAX_BYTES >> 20} MiB; not a model config.json",
                         "point model at a directory with the checkpoint's Hugging Face config.json")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ModelError(f"{path}: not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})",
                         "config.json must be the UTF-8 JSON file the checkpoint ships with") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                         "fix the JSON syntax, or restore the checkpoint's original config.json") from None
    except RecursionError:
        raise ModelError(f"{path}: nested too deeply to be a model config.json",
                         "restore the checkpoint's original config.json") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{path}: expected a JSON object, got {type(cfg).__name__}",
                         "config.json must be a JSON object of the model's settings")
    text_cfg = cfg.get("text_config")
    if isinstance(text_cfg, dict):  # multimodal checkpoints keep the language model's settings here
        cfg = {**text_cfg, **cfg}
    return cfg


def from_config_json(path: Path, name: str | None = None) -> ModelSpec:
    """Read the attention geometry from a Hugging Face config.json; every number tk uses is checked. The model is
    named ``name`` (a Hugging Face id), else its directory."""
    cfg = _read_config(path)

    def bad(key: str, value, what: str, fix: str = "") -> ModelError:
        return ModelError(f"{path}: {key}: {_short(value)} {what}",
                          fix or f"set {key} in {path} to the value the checkpoint was trained with "
                                 f"(a positive integer)")

    def integer(keys: tuple[str, ...], bound: str, required: bool = False, default=_MISSING, zero_ok=False):
        """The first of keys that is present (null counts as absent), as a positive integer within bounds."""
        for key in keys:
            value = cfg.get(key)
            if value is None:
                continue
            if isinstance(value, float) and math.isfinite(value) and value.is_integer():
                number = int(value)  # 64.0 is 64; 64.5 is refused below
            elif isinstance(value, int) and not isinstance(value, bool):
                number = value
            else:
                raise bad(key, value, "is not an integer")
            if number < 0 or (number == 0 and not zero_ok):
                raise bad(key, value, "must be positive" if not zero_ok else "must not be negative")
            if number > _BOUNDS[bound]:
                raise bad(key, value, f"is larger than any model tk can size (at most {_BOUNDS[bound]})")
            return key, number
        if required:
            raise ModelError(f"{path}: missing integer field {keys[0]!r}; tk needs it to size the KV cache",
                             f"add {keys[0]} to {path} (the checkpoint's own value)")
        return None, default

    _, layers = integer(("num_hidden_layers", "n_layer", "num_layers"), "layers", required=True)
    heads_key, heads = integer(("num_attention_heads", "n_head"), "heads", required=True)
    hidden_key, hidden = integer(("hidden_size", "n_embd"), "hidden", default=0)
    experts_key, experts = integer(("n_routed_experts", "num_local_experts", "num_experts"), "experts", default=0)
    topk_key, topk = integer(("num_experts_per_tok", "num_experts_per_token"), "topk", default=0)
    if experts and topk > experts:
        raise bad(topk_key, topk, f"is more than the model's {experts} experts ({experts_key})",
                  f"set {topk_key} in {path} to at most {experts}")
    _, positions = integer(("max_position_embeddings",), "positions", default=0)
    ffn_key = "moe_intermediate_size" if experts and cfg.get("moe_intermediate_size") is not None \
        else "intermediate_size"
    _, ffn = integer((ffn_key,), "ffn", default=0)
    _, vocab = integer(("vocab_size",), "vocab", default=0)
    dtype = cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))
    if dtype is None:
        dtype = "bfloat16"
    if not isinstance(dtype, str) or not re.fullmatch(r"[A-Za-z0-9_.]{1,32}", dtype):
        raise bad("torch_dtype", dtype, "is not a dtype name",
                  f"set torch_dtype in {path} to the checkpoint's dtype, e.g. \"bfloat16\"")
    name = name or os.path.normpath(path.parent)

    def spec(hidden_for_estimate: int, **attention) -> ModelSpec:
        params = _estimate_params(layers, hidden_for_estimate, ffn, vocab, experts)
        active = _estimate_params(layers, hidden_for_estimate, ffn, vocab, topk) if experts else params
        return ModelSpec(name=name, num_layers=layers, num_attention_heads=heads, params=params,
                         active_params=active, num_experts=experts, experts_per_token=topk,
                         max_position_embeddings=positions, dtype=dtype, source=str(path), **attention)

    if cfg.get("kv_lora_rank") is not None:  # multi-head latent attention (DeepSeek-V2/V3/R1)
        _, rank = integer(("kv_lora_rank",), "kv_lora_rank")
        _, rope = integer(("qk_rope_head_dim",), "qk_rope_head_dim", default=0, zero_ok=True)
        if not hidden:
            raise ModelError(f"{path}: missing integer field 'hidden_size'; tk needs it to estimate the prefill",
                             f"add hidden_size to {path} (the checkpoint's own value)")
        return spec(hidden, num_kv_heads=1, head_dim=rank + rope, attention="mla", kv_lora_rank=rank,
                    qk_rope_head_dim=rope)
    kv_key, kv_heads = integer(("num_key_value_heads",), "kv_heads", default=heads)
    if kv_key and kv_heads > heads:
        raise bad(kv_key, kv_heads, f"is more than {heads_key} ({heads})",
                  f"set {kv_key} in {path} to a divisor of {heads_key} ({heads})")
    if heads % kv_heads:
        raise bad(kv_key, kv_heads, f"does not divide {heads_key} ({heads}); grouped-query attention shares "
                  "each KV head among a whole number of query heads",
                  f"set {kv_key} in {path} to a divisor of {heads}")
    _, head_dim = integer(("head_dim",), "head_dim", default=0)
    if not head_dim:
        if not hidden:
            raise ModelError(f"{path}: neither head_dim nor hidden_size is set; tk cannot size the KV cache",
                             f"add head_dim (or hidden_size) to {path}")
        if hidden % heads:
            raise bad(hidden_key, hidden, f"is not a multiple of {heads_key} ({heads}), so head_dim is not a "
                      "whole number", f"correct {hidden_key}, or add the checkpoint's head_dim to {path}")
        head_dim = hidden // heads
    return spec(hidden or heads * head_dim, num_kv_heads=kv_heads, head_dim=head_dim)


def _estimate_params(layers: int, hidden: int, ffn: int, vocab: int, experts: int) -> float:
    """Rough parameter count: attention 4h^2 plus MLP 3·h·ffn per (active) expert, plus embeddings."""
    ffn = ffn or 4 * hidden
    mlp = 3 * hidden * ffn * max(experts, 1)
    return float(layers * (4 * hidden * hidden + mlp) + 2 * vocab * hidden)
