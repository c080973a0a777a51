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
from dataclasses import asdict, dataclass, replace
from pathlib import Path

# Bytes per element of the KV cache for each kv dtype tk sizes (what a TensorRT-LLM options file may say too).
KV_DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "fp8": 1, "nvfp4": 0.5625}
# nvfp4: 4 bits per value plus one fp8 scale per 16 values = 4.5 bits.
# The KV dtypes a recipe names (kv_transfer.dtype; which a line takes is in its facts: TrtllmVersion.kv_dtypes).
KV_DTYPES = ("auto", "fp8", "nvfp4")


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
    # The rest sizes the weights (toolkit/plan/memory.py); 0 where a config.json does not say.
    architecture: str = ""  # config.json `architectures[0]`, what aiconfigurator and TensorRT-LLM dispatch on
    hidden_size: int = 0
    intermediate_size: int = 0  # a dense MLP's (a MoE model's dense layers)
    moe_intermediate_size: int = 0  # one routed expert's
    vocab_size: int = 0
    draft_vocab_size: int = 0  # an Eagle3 draft's own (smaller) vocabulary, its lm_head's rows; 0: vocab_size
    tie_word_embeddings: bool = False
    num_shared_experts: int = 0  # DeepSeek/Kimi `n_shared_experts` (moe_intermediate_size each)
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE style: one shared expert of this size
    dense_layers: int = 0  # a MoE model's layers with a dense MLP instead of experts (`first_k_dense_replace`)
    q_lora_rank: int = 0  # MLA
    qk_nope_head_dim: int = 0  # MLA
    v_head_dim: int = 0  # MLA
    mtp_layers: int = 0  # multi-token-prediction layers the checkpoint ships (`num_nextn_predict_layers`)
    # The checkpoint's weights quantization (QUANT_BYTES keys: "fp8", "fp8_block", "nvfp4", "mxfp4", ...), or ""
    # for plain ``dtype`` weights; ``quantization_note`` says where it was read.
    quantization: str = ""
    quantization_note: str = ""
    # Why the quantization the checkpoint declares could not be read (the file and field), "" when it was read or
    # none is declared: it is then unknown (the memory plan's lower bound assumes 4 bits, and the plan warns).
    quantization_unread: str = ""
    sliding_window: int = 0  # tokens a sliding-window layer attends to (gpt-oss: 128)
    sliding_layers: int = 0  # how many of the layers use it

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
        """KV bytes one token takes in one layer on one rank of an attention TP group of ``tp`` (1 under attention
        DP): each rank keeps ceil(num_kv_heads / tp) KV heads, one replicated head where there are more ranks than
        heads (Attention.__init__, tensorrt_llm/_torch/modules/attention.py @ 00547a25; toolkit/plan/memory.py);
        MLA's latent is replicated on every rank, not split."""
        elem = KV_DTYPE_BYTES[kv_dtype]
        if self.attention == "mla":
            return (self.kv_lora_rank + self.qk_rope_head_dim) * elem
        return 2 * math.ceil(self.num_kv_heads / tp) * self.head_dim * elem

    def layers_per_rank(self, pp: int, extra_layers: int = 0) -> int:
        """KV layers the fullest pipeline-parallel rank holds. TensorRT-LLM splits the model's layers like
        torch.tensor_split (the first ``num_layers % pp`` ranks take one more: Mapping.pp_layers in
        tensorrt_llm/mapping.py) and appends ``extra_layers`` (speculative-decoding KV layers, e.g. MTP) to
        the last rank (get_pp_layers in tensorrt_llm/_torch/pyexecutor/resource_manager.py)."""
        if not extra_layers:
            return math.ceil(self.num_layers / pp)
        return max(math.ceil(self.num_layers / pp), self.num_layers // pp + extra_layers)

    def kv_bytes_per_token_per_rank(self, kv_dtype: str, tp: int, pp: int, extra_layers: int = 0,
                                    full_only: bool = False) -> int:
        """KV bytes one token takes on the fullest rank of a server (attention TP ``tp``, ``pp`` pipeline stages),
        all of that rank's layers, ``extra_layers`` (MTP) included. The one computation of it: the plan's KV
        geometry, each role's memory plan, the validation payloads and the emulated roofline read it.
        ``full_only``: sliding-window layers left out (they hold at most a window of tokens)."""
        layers = self.layers_per_rank(pp, extra_layers)
        if full_only and self.sliding_layers:
            layers = max(1, layers - math.ceil(self.sliding_layers / pp))
        return int(self.kv_bytes_per_token_per_layer_per_rank(kv_dtype, tp) * layers)

    def to_dict(self) -> dict:
        return asdict(self)


def _gqa(name, layers, heads, kv_heads, head_dim, params, active=None, experts=0, topk=0, ctx=131072, **more):
    return ModelSpec(name=name, num_layers=layers, num_attention_heads=heads, num_kv_heads=kv_heads,
                     head_dim=head_dim, params=params, active_params=active or params,
                     num_experts=experts, experts_per_token=topk, max_position_embeddings=ctx, **more)


def _mla(name, params, active, **more):
    """DeepSeek-V3's architecture (DeepseekV3ForCausalLM): MLA with a 512 + 64 latent, 7168 hidden, 61 layers."""
    geometry = dict(num_layers=61, num_kv_heads=1, head_dim=576, attention="mla", kv_lora_rank=512,
                    qk_rope_head_dim=64, experts_per_token=8, architecture="DeepseekV3ForCausalLM",
                    hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_shared_experts=1,
                    q_lora_rank=1536, qk_nope_head_dim=128, v_head_dim=128, quantization="fp8_block",
                    quantization_note="config.json quantization_config: quant_method fp8, weight_block_size [128, 128]")
    return ModelSpec(name=name, params=params, active_params=active, **{**geometry, **more})


# Numbers from each checkpoint's Hugging Face config.json (as aiconfigurator 0.12.0 ships them in
# aiconfigurator_core/model_configs/), parameter counts from the model cards.
BUILTIN_MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        _gqa("meta-llama/Llama-3.1-8B-Instruct", 32, 32, 8, 128, 8.03e9, architecture="LlamaForCausalLM",
             hidden_size=4096, intermediate_size=14336, vocab_size=128256),
        _gqa("meta-llama/Llama-3.3-70B-Instruct", 80, 64, 8, 128, 70.6e9, architecture="LlamaForCausalLM",
             hidden_size=8192, intermediate_size=28672, vocab_size=128256),
        _gqa("Qwen/Qwen3-0.6B", 28, 16, 8, 128, 0.6e9, ctx=40960, architecture="Qwen3ForCausalLM",
             hidden_size=1024, intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True),
        _gqa("Qwen/Qwen3-32B", 64, 64, 8, 128, 32.8e9, ctx=40960, architecture="Qwen3ForCausalLM",
             hidden_size=5120, intermediate_size=25600, vocab_size=151936),
        _gqa("Qwen/Qwen3-30B-A3B", 48, 32, 4, 128, 30.5e9, active=3.3e9, experts=128, topk=8, ctx=40960,
             architecture="Qwen3MoeForCausalLM", hidden_size=2048, intermediate_size=6144,
             moe_intermediate_size=768, vocab_size=151936),
        _gqa("Qwen/Qwen3-235B-A22B", 94, 64, 4, 128, 235e9, active=22e9, experts=128, topk=8, ctx=40960,
             architecture="Qwen3MoeForCausalLM", hidden_size=4096, intermediate_size=12288,
             moe_intermediate_size=1536, vocab_size=151936),
        _gqa("mistralai/Mixtral-8x7B-Instruct-v0.1", 32, 32, 8, 128, 46.7e9, active=12.9e9,
             experts=8, topk=2, ctx=32768, architecture="MixtralForCausalLM", hidden_size=4096,
             intermediate_size=14336, moe_intermediate_size=14336, vocab_size=32000),
        _gqa("openai/gpt-oss-120b", 36, 64, 8, 64, 117e9, active=5.1e9, experts=128, topk=4,
             architecture="GptOssForCausalLM", hidden_size=2880, intermediate_size=2880,
             moe_intermediate_size=2880, vocab_size=201088, quantization="mxfp4",
             quantization_note="config.json quantization_config: quant_method mxfp4 (experts; attention, router, "
                               "embeddings and lm_head unconverted)", sliding_window=128, sliding_layers=18),
        _mla("deepseek-ai/DeepSeek-R1", 671e9, 37e9, num_attention_heads=128, num_experts=256, dense_layers=3,
             vocab_size=129280, max_position_embeddings=163840, mtp_layers=1),
        _mla("deepseek-ai/DeepSeek-V3", 671e9, 37e9, num_attention_heads=128, num_experts=256, dense_layers=3,
             vocab_size=129280, max_position_embeddings=163840, mtp_layers=1),
        _mla("moonshotai/Kimi-K2-Instruct", 1.03e12, 32e9, num_attention_heads=64, num_experts=384,
             dense_layers=1, vocab_size=163840, max_position_embeddings=131072),
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


class _ConfigFields:
    """The fields of one config.json, each number checked as it is read."""

    def __init__(self, path: Path, cfg: dict):
        self.path = path
        self.cfg = cfg

    def bad(self, key: str | None, value, what: str, fix: str = "") -> ModelError:
        return ModelError(f"{self.path}: {key}: {_short(value)} {what}",
                          fix or f"set {key} in {self.path} to the value the checkpoint was trained with "
                                 f"(a positive integer)")

    def integer(self, keys: tuple[str, ...], bound: str, required: bool = False, default=_MISSING, zero_ok=False):
        """The first of keys that is present (null counts as absent), as a positive integer within bounds."""
        for key in keys:
            value = self.cfg.get(key)
            if value is None:
                continue
            if isinstance(value, float) and math.isfinite(value) and value.is_integer():
                number = int(value)  # 64.0 is 64; 64.5 is refused below
            elif isinstance(value, int) and not isinstance(value, bool):
                number = value
            else:
                raise self.bad(key, value, "is not an integer")
            if number < 0 or (number == 0 and not zero_ok):
                raise self.bad(key, value, "must be positive" if not zero_ok else "must not be negative")
            if number > _BOUNDS[bound]:
                raise self.bad(key, value, f"is larger than any model tk can size (at most {_BOUNDS[bound]})")
            return key, number
        if required:
            raise ModelError(f"{self.path}: missing integer field {keys[0]!r}; tk needs it to size the KV cache",
                             f"add {keys[0]} to {self.path} (the checkpoint's own value)")
        return None, default


@dataclass(frozen=True)
class _Experts:
    """The routed experts of a config.json: how many, and how many each token uses (0 and 0: a dense model)."""

    count: int
    per_token: int


@dataclass(frozen=True)
class _MoeLayers:
    """How a MoE model's layers hold their experts: shared experts beside the routed ones, dense layers."""

    shared: int
    shared_ffn: int
    dense_layers: int


def _read_experts(fields: _ConfigFields) -> _Experts:
    experts_key, experts = fields.integer(("n_routed_experts", "num_local_experts", "num_experts"), "experts",
                                          default=0)
    topk_key, topk = fields.integer(("num_experts_per_tok", "num_experts_per_token"), "topk", default=0)
    if experts and topk > experts:
        raise fields.bad(topk_key, topk, f"is more than the model's {experts} experts ({experts_key})",
                         f"set {topk_key} in {fields.path} to at most {experts}")
    return _Experts(experts, topk)


def _read_mlp_sizes(fields: _ConfigFields, experts: int) -> tuple[int, int]:
    """(a dense MLP's intermediate size, one routed expert's)."""
    _, ffn = fields.integer(("intermediate_size_mlp", "intermediate_size", "ffn_dim", "n_inner"), "ffn", default=0)
    _, moe_ffn = fields.integer(("moe_intermediate_size",), "ffn", default=0)
    if experts and not moe_ffn:
        # Mixtral, gpt-oss: intermediate_size is each expert's (Llama 4: its dense layers' is intermediate_size_mlp)
        _, moe_ffn = fields.integer(("intermediate_size",), "ffn", default=ffn)
    return ffn, moe_ffn


def _read_moe_layers(fields: _ConfigFields, layers: int, experts: int) -> _MoeLayers:
    _, shared = fields.integer(("n_shared_experts", "num_shared_experts"), "experts", default=0, zero_ok=True)
    _, shared_ffn = fields.integer(("shared_expert_intermediate_size",), "ffn", default=0, zero_ok=True)
    _, first_dense = fields.integer(("first_k_dense_replace",), "layers", default=0, zero_ok=True)
    _, sparse_step = fields.integer(("decoder_sparse_step", "interleave_moe_layer_step"), "layers", default=1,
                                    zero_ok=True)
    dense_only = fields.cfg.get("mlp_only_layers")
    dense_layers = 0
    if experts:
        dense_layers = min(layers, first_dense)
        if isinstance(dense_only, list):
            dense_layers = max(dense_layers, min(layers, len(dense_only)))
        if sparse_step > 1:  # one MoE layer every sparse_step layers
            dense_layers = max(dense_layers, layers - layers // sparse_step)
    return _MoeLayers(shared, shared_ffn, dense_layers)


def _read_sliding_window(fields: _ConfigFields) -> tuple[int, int]:
    """(the sliding window in tokens, how many layers use it), each 0 unless the file gives both."""
    _, window = fields.integer(("sliding_window",), "positions", default=0, zero_ok=True)
    types = fields.cfg.get("layer_types")
    sliding = sum(1 for t in types if t == "sliding_attention") if isinstance(types, list) else 0
    return (window if sliding else 0), (sliding if window else 0)


def _read_dtype(fields: _ConfigFields) -> str:
    dtype = fields.cfg.get("torch_dtype", fields.cfg.get("dtype", "bfloat16"))
    if dtype is None:
        dtype = "bfloat16"
    if not isinstance(dtype, str) or not re.fullmatch(r"[A-Za-z0-9_.]{1,32}", dtype):
        raise fields.bad("torch_dtype", dtype, "is not a dtype name",
                         f"set torch_dtype in {fields.path} to the checkpoint's dtype, e.g. \"bfloat16\"")
    return dtype


def _read_architecture(cfg: dict) -> str:
    """``architectures[0]`` where it is a class name, else ""."""
    archs = cfg.get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) \
        and re.fullmatch(r"[A-Za-z0-9_]{1,128}", archs[0]) else ""


def _read_mla(fields: _ConfigFields, hidden: int) -> dict:
    """Multi-head latent attention's geometry (DeepSeek-V2/V3/R1): ModelSpec's attention fields."""
    _, rank = fields.integer(("kv_lora_rank",), "kv_lora_rank")
    _, rope = fields.integer(("qk_rope_head_dim",), "qk_rope_head_dim", default=0, zero_ok=True)
    _, q_rank = fields.integer(("q_lora_rank",), "kv_lora_rank", default=0, zero_ok=True)
    _, nope = fields.integer(("qk_nope_head_dim",), "head_dim", default=0, zero_ok=True)
    _, v_dim = fields.integer(("v_head_dim",), "head_dim", default=0, zero_ok=True)
    if not hidden:
        raise ModelError(f"{fields.path}: missing integer field 'hidden_size'; tk needs it to estimate the prefill",
                         f"add hidden_size to {fields.path} (the checkpoint's own value)")
    return dict(num_kv_heads=1, head_dim=rank + rope, attention="mla", kv_lora_rank=rank, qk_rope_head_dim=rope,
                q_lora_rank=q_rank, qk_nope_head_dim=nope, v_head_dim=v_dim)


def _read_gqa(fields: _ConfigFields, heads_key: str, heads: int, hidden_key: str | None, hidden: int) -> dict:
    """Multi-head / grouped-query attention's geometry: ModelSpec's attention fields."""
    path = fields.path
    kv_key, kv_heads = fields.integer(("num_key_value_heads",), "kv_heads", default=heads)
    if kv_key and kv_heads > heads:
        raise fields.bad(kv_key, kv_heads, f"is more than {heads_key} ({heads})",
                         f"set {kv_key} in {path} to a divisor of {heads_key} ({heads})")
    if heads % kv_heads:
        raise fields.bad(kv_key, kv_heads, f"does not divide {heads_key} ({heads}); grouped-query attention "
                         "shares each KV head among a whole number of query heads",
                         f"set {kv_key} in {path} to a divisor of {heads}")
    _, head_dim = fields.integer(("head_dim",), "head_dim", default=0)
    if not head_dim:
        if not hidden:
            raise ModelError(f"{path}: neither head_dim nor hidden_size is set; tk cannot size the KV cache",
                             f"add head_dim (or hidden_size) to {path}")
        if hidden % heads:
            raise fields.bad(hidden_key, hidden, f"is not a multiple of {heads_key} ({heads}), so head_dim is not "
                             "a whole number", f"correct {hidden_key}, or add the checkpoint's head_dim to {path}")
        head_dim = hidden // heads
    return dict(num_kv_heads=kv_heads, head_dim=head_dim)


def from_config_json(path: Path, name: str | None = None) -> ModelSpec:
    """Read the attention geometry from a Hugging Face config.json; every number tk uses is checked. The model is
    named ``name`` (a Hugging Face id), else its directory."""
    cfg = _read_config(path)
    fields = _ConfigFields(path, cfg)
    _, layers = fields.integer(("num_hidden_layers", "n_layer", "num_layers"), "layers", required=True)
    heads_key, heads = fields.integer(("num_attention_heads", "n_head"), "heads", required=True)
    hidden_key, hidden = fields.integer(("hidden_size", "n_embd"), "hidden", default=0)
    experts = _read_experts(fields)
    _, positions = fields.integer(("max_position_embeddings",), "positions", default=0)
    ffn, moe_ffn = _read_mlp_sizes(fields, experts.count)
    _, vocab = fields.integer(("vocab_size",), "vocab", default=0)
    _, draft_vocab = fields.integer(("draft_vocab_size",), "vocab", default=0)
    moe = _read_moe_layers(fields, layers, experts.count)
    _, mtp = fields.integer(("num_nextn_predict_layers",), "layers", default=0, zero_ok=True)
    window, sliding = _read_sliding_window(fields)
    dtype = _read_dtype(fields)
    arch = _read_architecture(cfg)
    shared = moe.shared
    if experts.count and not shared and arch.startswith("Llama4"):
        shared = 1  # Llama 4's MoE layers add one shared expert (its config has no key for it)
    quant, quant_note, quant_unread = checkpoint_quantization(cfg, path.parent)
    tied = cfg.get("tie_word_embeddings") is True
    is_moe = experts.count > 0
    if cfg.get("kv_lora_rank") is not None:  # multi-head latent attention (DeepSeek-V2/V3/R1)
        attention = _read_mla(fields, hidden)
    else:
        attention = _read_gqa(fields, heads_key, heads, hidden_key, hidden)
    # hidden_size sizes the weights estimate: MLA requires it; MHA/GQA without it takes heads x head_dim
    draft = ModelSpec(
        name=name or os.path.normpath(path.parent), num_layers=layers, num_attention_heads=heads, params=0.0,
        active_params=0.0, num_experts=experts.count, experts_per_token=experts.per_token,
        max_position_embeddings=positions, dtype=dtype, source=str(path),
        hidden_size=hidden or heads * attention["head_dim"], architecture=arch, intermediate_size=ffn,
        moe_intermediate_size=moe_ffn if is_moe else 0, vocab_size=vocab, draft_vocab_size=draft_vocab,
        tie_word_embeddings=tied, num_shared_experts=shared if is_moe else 0,
        shared_expert_intermediate_size=moe.shared_ffn if is_moe else 0, dense_layers=moe.dense_layers,
        mtp_layers=mtp, quantization=quant, quantization_note=quant_note, quantization_unread=quant_unread,
        sliding_window=window, sliding_layers=sliding, **attention)
    weights = weight_params(draft)
    return replace(draft, params=weights.total, active_params=weights.active)


# --- weights --------------------------------------------------------------------------------------------------

# Bytes per weight of each quantization tk knows, scales included: fp8 one byte (per-tensor or 128x128-block
# fp32 scales, negligible); nvfp4 4 bits plus one fp8 scale per 16 values; mxfp4 4 bits plus one e8m0 scale per
# 32; w4a16/int4 (AWQ/GPTQ) 4 bits plus an fp16 scale per group of 128. Plain dtypes by their width.
QUANT_BYTES = {
    "bfloat16": 2.0, "float16": 2.0, "float32": 4.0, "fp8": 1.0, "fp8_block": 1.0, "fp8_rowwise": 1.0,
    "int8": 1.0, "nvfp4": 0.5625, "mxfp4": 0.53125, "int4": 0.515625, "w4a16": 0.515625, "w4a8": 0.515625,
}
QUANT_ALIASES = {
    "bf16": "bfloat16", "fp16": "float16", "half": "float16", "none": "bfloat16", "fp32": "float32",
    "fp4": "nvfp4", "nvfp4_wo": "nvfp4", "w4a16_nvfp4": "nvfp4", "w4a16_mxfp4": "mxfp4", "w4a8_mxfp4_fp8": "mxfp4",
    "w4a8_mxfp4_mxfp8": "mxfp4", "fp8_per_tensor": "fp8", "fp8_static": "fp8", "w8a8": "int8", "int8_wo": "int8",
    "int4_wo": "int4", "int4_awq": "int4", "w4a16_awq": "int4", "w4a16_gptq": "int4", "awq": "int4", "gptq": "int4",
}
FOUR_BIT = ("nvfp4", "mxfp4", "int4", "w4a16", "w4a8")


def quant_name(value: str | None) -> str | None:
    """The QUANT_BYTES name of a quantization as a recipe or a checkpoint spells it; None when tk does not know it."""
    if not value:
        return None
    key = value.strip().lower().replace("-", "_")
    key = QUANT_ALIASES.get(key, key)
    return key if key in QUANT_BYTES else None


def _unread(config: str, why: str) -> tuple[str, str, str]:
    """A declared quantization tk cannot read: unknown, the file and field named."""
    text = f"{config}: {why}"
    return "", text, text


def _compressed_tensors(qc: dict, config: str) -> tuple[str, str, str]:
    """A compressed-tensors checkpoint's weights scheme: the first of its config_groups with one tk reads."""
    # compressed-tensors writes config_groups as a mapping of group name -> scheme, and TensorRT-LLM reads
    # it as one (update_quant_config_from_compressed_tensors in tensorrt_llm/models/quant_config_utils.py
    # @ 21156a7a57acd21e17feb5c2721c30f035e0f2af iterates config_groups.values()).
    groups = qc.get("config_groups")
    if not isinstance(groups, dict):
        return _unread(config, f"quantization_config.config_groups is a {type(groups).__name__}, not the mapping "
                               "of group names to schemes compressed-tensors writes (TensorRT-LLM reads it as one "
                               "and may not load this checkpoint)")
    for group in groups.values():
        weights = group.get("weights") if isinstance(group, dict) else None
        if isinstance(weights, dict):
            bits, kind = weights.get("num_bits"), weights.get("type")
            if not (isinstance(bits, int) and isinstance(kind, str)):
                continue
            name = {(4, "float"): "nvfp4" if weights.get("group_size") == 16 else "mxfp4",
                    (8, "float"): "fp8", (4, "int"): "int4", (8, "int"): "int8"}.get((bits, kind))
            if name:
                return name, f"config.json quantization_config: compressed-tensors {bits}-bit {kind}", ""
    return _unread(config, "quantization_config.config_groups: no group has a weights scheme tk reads (num_bits 4 "
                           "or 8, type float or int)")


def _quantization_config(qc: dict, config: str) -> tuple[str, str, str] | None:
    """What config.json's quantization_config declares; None where it names no quant_method."""
    method = str(qc.get("quant_method") or "").lower()
    if method == "fp8":
        block = qc.get("weight_block_size")
        return ("fp8_block" if block else "fp8"), "config.json quantization_config: quant_method fp8" + \
            (f", weight_block_size {_short(block)}" if block else ""), ""
    if method in ("mxfp4", "awq", "gptq"):
        return quant_name(method) or "", f"config.json quantization_config: quant_method {method}", ""
    if method == "modelopt":
        algo = str(qc.get("quant_algo") or "")
        if quant_name(algo):
            return quant_name(algo) or "", f"config.json quantization_config: modelopt {algo}", ""
        return _unread(config, f"quantization_config.quant_algo {_short(algo)} (modelopt) is not one tk reads")
    if method == "compressed-tensors":
        return _compressed_tensors(qc, config)
    if method:
        return _unread(config, f"quantization_config.quant_method {_short(method)} is not one tk reads (fp8, mxfp4, "
                               "modelopt, compressed-tensors, awq, gptq)")
    return None


def _hf_quant_config(directory: Path) -> tuple[str, str, str]:
    """A ModelOpt checkpoint's hf_quant_config.json (`quantization.quant_algo`); ("", "", "") where it is absent,
    unreadable or names no quantization tk knows."""
    try:
        with open(Path(directory) / "hf_quant_config.json", "rb") as f:  # a bounded read: a few kB in practice
            hf = json.loads(f.read(CONFIG_MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        hf = None
    quant = hf.get("quantization") if isinstance(hf, dict) else None
    algo = str(quant.get("quant_algo") or "") if isinstance(quant, dict) else ""
    if quant_name(algo):
        return quant_name(algo) or "", f"hf_quant_config.json: quant_algo {algo}", ""
    return "", "", ""


def checkpoint_quantization(cfg: dict, directory: Path | None = None) -> tuple[str, str, str]:
    """The weights quantization a checkpoint declares: config.json `quantization_config` (quant_method fp8 /
    mxfp4 / modelopt / compressed-tensors / awq / gptq), else a ModelOpt `hf_quant_config.json` beside it
    (`quantization.quant_algo`). Returns (name, note, unread): ("", "", "") when it declares none (plain dtype
    weights); ("", note, unread) when it declares one tk cannot read, ``unread`` naming the file and field (the
    quantization is then unknown; never an exception, whatever the shape)."""
    config = f"{directory / 'config.json'}" if directory is not None else "config.json"
    qc = cfg.get("quantization_config")
    if qc is not None and not isinstance(qc, dict):
        return _unread(config, f"quantization_config is a {type(qc).__name__}, not a mapping")
    if isinstance(qc, dict):
        declared = _quantization_config(qc, config)
        if declared is not None:
            return declared
    if directory is not None:
        return _hf_quant_config(directory)
    return "", "", ""


@dataclass(frozen=True)
class WeightParams:
    """A model's parameters by how TensorRT-LLM shards them (counts, not bytes).

    Per decoder layer: ``attn_split`` (query/output projections and, for GQA, the K/V projections whose heads
    TP splits), ``attn_replicated`` (MLA's low-rank down projections q_a/kv_a, which every rank holds);
    ``dense_mlp`` (a dense layer's MLP); per MoE layer ``experts`` (all routed experts; TP x EP split them),
    ``shared`` (shared experts) and ``router``. ``mtp_layer``: one multi-token-prediction layer (a MoE layer
    plus its eh_proj)."""

    embed: float
    lm_head: float  # 0 when tied to the embedding
    attn_split: float
    attn_replicated: float
    dense_mlp: float
    experts: float
    shared: float
    router: float
    dense_layers: int
    moe_layers: int
    mtp_layer: float
    active: float  # per token: embeddings excluded, attention, dense/shared MLP and top-k experts

    @property
    def attention(self) -> float:
        return self.attn_split + self.attn_replicated

    @property
    def total(self) -> float:
        layers = (self.dense_layers * (self.attention + self.dense_mlp)
                  + self.moe_layers * (self.attention + self.experts + self.shared + self.router))
        return self.embed + self.lm_head + layers


def weight_params(m: ModelSpec) -> WeightParams:
    """Parameter counts of ``m`` from its geometry (norms and biases left out: well under 0.1 %)."""
    h = m.hidden_size or m.num_attention_heads * m.head_dim
    if m.attention == "mla":
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim or m.head_dim
        v = m.v_head_dim or m.qk_nope_head_dim or m.head_dim
        q_down = h * m.q_lora_rank if m.q_lora_rank else 0
        q_up = (m.q_lora_rank or h) * m.num_attention_heads * qk
        kv_down = h * (m.kv_lora_rank + m.qk_rope_head_dim)
        kv_up = m.kv_lora_rank * m.num_attention_heads * (m.qk_nope_head_dim + v)
        attn_split = q_up + kv_up + m.num_attention_heads * v * h
        attn_replicated = q_down + kv_down
    else:
        q = m.num_attention_heads * m.head_dim
        attn_split = h * q + 2 * h * m.num_kv_heads * m.head_dim + q * h
        attn_replicated = 0
    ffn = m.intermediate_size or 4 * h
    if m.is_moe:
        expert = 3 * h * (m.moe_intermediate_size or ffn)
        experts = m.num_experts * expert
        shared = m.num_shared_experts * expert + 3 * h * m.shared_expert_intermediate_size
        router = h * m.num_experts
        dense_layers = min(m.dense_layers, m.num_layers)
    else:
        expert = experts = shared = router = 0
        dense_layers = m.num_layers
    moe_layers = m.num_layers - dense_layers
    dense_mlp = 3 * h * ffn
    embed = m.vocab_size * h
    lm_head = 0 if m.tie_word_embeddings else embed
    mtp_layer = (attn_split + attn_replicated + experts + shared + router + 2 * h * h) if m.mtp_layers else 0
    active = (dense_layers * (attn_split + attn_replicated + dense_mlp)
              + moe_layers * (attn_split + attn_replicated + shared + router + m.experts_per_token * expert)
              + lm_head + (embed if m.tie_word_embeddings else 0))
    return WeightParams(embed=float(embed), lm_head=float(lm_head), attn_split=float(attn_split),
                        attn_replicated=float(attn_replicated), dense_mlp=float(dense_mlp), experts=float(experts),
                        shared=float(shared), router=float(router), dense_layers=dense_layers,
                        moe_layers=moe_layers, mtp_layer=float(mtp_layer), active=float(active))
