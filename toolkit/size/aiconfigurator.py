"""The one module that talks to aiconfigurator (NVIDIA's TensorRT-LLM sizing model), imported lazily.

Pinned: aiconfigurator==0.12.0 (the `size` extra). Facts taken from its source, not its code
(aiconfigurator 0.12.0 and aiconfigurator-core 0.12.0 wheels from the package index; upstream
github.com/ai-dynamo/aiconfigurator, its SDK files at 095f58a):

- Search: ``aiconfigurator.cli.api.cli_default(model_path, total_gpus, system, isl=, osl=, ttft=, tpot=,
  backend="trtllm", top_n=)`` builds an "agg" and a "disagg" experiment and returns ``CLIResult``:
  ``pareto_fronts[exp]`` (a pandas DataFrame of every Pareto point, SLA-meeting or not) and ``best_configs``
  (the top-N under the TPOT limit). TTFT is enforced during the sweep, TPOT at picking time
  (cli/api.py docstring of cli_default). One row is one *replica*: ``num_total_gpus`` GPUs; a budget of
  N GPUs runs ``N // num_total_gpus`` replicas and ``tokens/s/gpu_cluster = tokens/s/gpu × replicas ×
  num_total_gpus / N`` (sdk/pareto_analysis.py).
- Columns (agg): ``tp pp dp bs concurrency ttft tpot tokens/s/gpu tokens/s/user num_total_gpus gemm kvcache
  backend version system``; (disagg) the same with ``(p)`` (prefill = context) and ``(d)`` (decode =
  generation) prefixes, plus ``(p)workers (d)workers (p)bs (d)bs``. Times in ms.
- Single configuration: ``cli_estimate(model_path, system_name, mode="disagg", isl=, osl=,
  prefill_tp_size=, prefill_pp_size=, prefill_batch_size=, prefill_num_workers=, decode_tp_size=, ...)``
  returns ``EstimateResult`` (``ttft``, ``tpot``, ``raw`` with the same disagg columns).
- Models: a local directory holding config.json, or a Hugging Face id; ids outside the pre-downloaded set
  (``aiconfigurator_core.sdk.common.DefaultHFModels``, configs in ``aiconfigurator_core/model_configs/``) are
  downloaded from the hub. tk passes only pre-downloaded ids or local directories, so nothing is fetched.
  Architectures: ``common.ARCHITECTURE_TO_MODEL_FAMILY``. Support: ``common.check_support(model, system,
  backend)`` → (agg, disagg) from the support matrix.
- Systems: ``aiconfigurator_core.sdk.perf_database.get_supported_databases()`` → {system: {backend:
  [versions]}} (h100_sxm, h200_sxm, b200_sxm, b300_sxm, gb200, gb300, a100_sxm, l40s, ...; TensorRT-LLM data
  1.3.0rc20 / 1.3.0rc23 on Hopper and Blackwell).
- No KV-transfer term: ``sdk/inference_session.py`` ("TODO, should consider kvcache model in future");
  toolkit/size/transfer.py adds it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from toolkit.errors import TkError
from toolkit.facts.models import ModelSpec

PINNED = "0.12.0"
BACKEND = "trtllm"

# tk's built-in models -> the pre-downloaded aiconfigurator config with the same attention geometry (layers,
# heads, KV heads, head_dim; checked against tk's facts on every use, see _check_geometry). Instruct and base
# checkpoints share a config; Llama-3.3-70B has Llama-3.1-70B's architecture.
BUILTIN_TO_AIC = {
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "meta-llama/Llama-3.3-70B-Instruct": "meta-llama/Meta-Llama-3.1-70B",
    "Qwen/Qwen3-0.6B": "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-32B": "Qwen/Qwen3-32B",
    "Qwen/Qwen3-235B-A22B": "Qwen/Qwen3-235B-A22B",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mistralai/Mixtral-8x7B-v0.1",
    "openai/gpt-oss-120b": "openai/gpt-oss-120b",
    "deepseek-ai/DeepSeek-R1": "deepseek-ai/DeepSeek-R1",
    "deepseek-ai/DeepSeek-V3": "deepseek-ai/DeepSeek-V3",
}

# aiconfigurator system -> (tk's cluster.gpu, GPUs per node of that system).
SYSTEM_TO_GPU = {"h100_sxm": ("H100", 8), "h200_sxm": ("H200", 8), "b200_sxm": ("B200", 8),
                 "gb200": ("GB200", 4), "a100_sxm": ("A100", 8), "l40s": ("L40S", 8)}
GPU_TO_SYSTEM = {gpu: system for system, (gpu, _) in SYSTEM_TO_GPU.items()}


class SizingError(TkError):
    """Sizing cannot go on: an unsupported model or system, a missing extra, no feasible configuration.
    ``exit_code`` 2 (a usage problem the message explains)."""

    exit_code = 2


@dataclass(frozen=True)
class Candidate:
    """One configuration aiconfigurator evaluated (one row of its Pareto front), for the whole GPU budget."""

    mode: str  # "agg" | "disagg"
    replicas: int  # copies of aiconfigurator's replica that fit the budget
    gpus_used: int
    ctx_instances: int  # disagg: context servers (all replicas); agg: 0
    ctx_tp: int
    ctx_pp: int
    ctx_batch: int
    gen_instances: int  # disagg: generation servers; agg: the aggregated servers
    gen_tp: int
    gen_pp: int
    gen_batch: int
    concurrency: int  # per replica, as aiconfigurator reports it
    ttft_ms: float  # aiconfigurator's (no KV transfer)
    tpot_ms: float
    tokens_s_gpu: float  # over the whole budget (aiconfigurator's tokens/s/gpu_cluster)
    tokens_s_user: float
    gemm: str
    kvcache: str
    trtllm_version: str
    aic_rank: int = 0  # 1 = aiconfigurator's best by tokens/s/GPU among SLA-meeting rows (no transfer term)
    transfer_ms: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def ttft_total_ms(self) -> float:
        return self.ttft_ms + self.transfer_ms

    def shape(self) -> str:
        if self.mode == "agg":
            return f"{self.gen_instances}x agg TP{self.gen_tp}{_pp(self.gen_pp)} bs{self.gen_batch}"
        return (f"{self.ctx_instances}x ctx TP{self.ctx_tp}{_pp(self.ctx_pp)} bs{self.ctx_batch} + "
                f"{self.gen_instances}x gen TP{self.gen_tp}{_pp(self.gen_pp)} bs{self.gen_batch}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ttft_total_ms"] = round(self.ttft_total_ms, 3)
        d["shape"] = self.shape()
        return d


def _pp(pp: int) -> str:
    return f" PP{pp}" if pp > 1 else ""


def _import():
    try:
        import aiconfigurator
        from aiconfigurator.cli import api as aic_api
    except ImportError as exc:
        raise SizingError(f"tk size needs aiconfigurator {PINNED} ({exc}); install the extra: "
                          "pip install 'tk-disagg[size]'") from None
    version = getattr(aiconfigurator, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version
        version = dist_version("aiconfigurator")
    if version != PINNED:
        raise SizingError(f"tk size is pinned to aiconfigurator {PINNED}; {version} is installed "
                          f"(pip install aiconfigurator=={PINNED})")
    for name in ("aiconfigurator", "aiconfigurator_core"):  # its INFO lines would drown tk's table
        logging.getLogger(name).setLevel(logging.ERROR)
    return aic_api


@contextlib.contextmanager
def _quiet():
    """aiconfigurator prints progress and tables on stdout: keep stdout for tk's --json document."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink):
        yield sink


def _has_trtllm_data(system: str) -> bool:
    _import()
    import os

    from aiconfigurator_core.sdk.perf_database import get_systems_paths

    for root in get_systems_paths():
        data = os.path.join(root, "data", system)
        if os.path.isfile(os.path.join(root, f"{system}.yaml")) and os.path.isdir(data):
            return any(os.path.isdir(os.path.join(data, op, BACKEND)) for op in os.listdir(data))
    return False


def supported_systems() -> list[str]:
    _import()
    from aiconfigurator_core.sdk.perf_database import get_supported_databases

    return sorted(s for s, backends in get_supported_databases().items() if backends.get(BACKEND))


def supported_models() -> tuple[list[str], list[str]]:
    """(tk built-in names aiconfigurator can size, architectures a local config.json may have)."""
    _import()
    from aiconfigurator_core.sdk import common

    return sorted(BUILTIN_TO_AIC), sorted(common.ARCHITECTURE_TO_MODEL_FAMILY)


def model_path_for(model: ModelSpec) -> str:
    """What aiconfigurator reads for ``model``: a pre-downloaded id (built-in) or the local directory."""
    _import()
    from aiconfigurator_core.sdk import common

    if model.source == "built-in":
        aic = BUILTIN_TO_AIC.get(model.name)
        if aic is None or aic not in common.DefaultHFModels:
            names, _ = supported_models()
            raise SizingError(f"aiconfigurator {PINNED} cannot size {model.name}; tk can size these built-in "
                              f"models: {', '.join(names)}; or give a local directory with a config.json of a "
                              f"supported architecture (tk size --help)")
        _check_geometry(model, aic)
        return aic
    directory = str(Path(model.source).parent)
    _check_architecture(directory)
    return directory


def _check_geometry(model: ModelSpec, aic_id: str) -> None:
    from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

    with _quiet():
        cfg = get_model_config_from_model_path(aic_id)
    if model.attention == "mla":
        return  # aiconfigurator models MLA from the checkpoint; tk's num_kv_heads/head_dim are the latent's
    ours = (model.num_layers, model.num_attention_heads, model.num_kv_heads, model.head_dim)
    theirs = (cfg.get("layers"), cfg.get("n"), cfg.get("n_kv"), cfg.get("d"))
    if ours != theirs:
        raise SizingError(f"{model.name}: tk's facts (layers, heads, KV heads, head_dim = {ours}) differ from "
                          f"aiconfigurator's {aic_id} config {theirs}; the mapping in "
                          "toolkit/size/aiconfigurator.py is wrong")


def _check_architecture(directory: str) -> None:
    import json

    from aiconfigurator_core.sdk import common

    try:
        archs = json.loads((Path(directory) / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        archs = []
    if not any(a in common.ARCHITECTURE_TO_MODEL_FAMILY for a in archs):
        raise SizingError(f"{directory}/config.json: architectures {archs or '(none)'} is not one aiconfigurator "
                          f"{PINNED} models; supported: {', '.join(sorted(common.ARCHITECTURE_TO_MODEL_FAMILY))}")


def check_system(system: str) -> None:
    if system in SYSTEM_TO_GPU and _has_trtllm_data(system):
        return  # the cheap path; the full listing below reads every system's data tree (about a second)
    systems = supported_systems()
    if system not in systems:
        raise SizingError(f"system {system!r} has no TensorRT-LLM data in aiconfigurator {PINNED}; supported: "
                          f"{', '.join(systems)}")
    if system not in SYSTEM_TO_GPU:
        raise SizingError(f"system {system!r} is modelled by aiconfigurator but tk has no GPU for it; tk can "
                          f"deploy: {', '.join(sorted(SYSTEM_TO_GPU))}")


def check_support(model_path: str, system: str) -> None:
    from aiconfigurator_core.sdk import common

    agg, disagg = common.check_support(model_path, system, BACKEND)
    if not disagg:
        raise SizingError(f"aiconfigurator {PINNED}'s support matrix has no passing disaggregated TensorRT-LLM "
                          f"result for {model_path} on {system}")


def search(model_path: str, system: str, gpus: int, isl: int, osl: int, ttft_ms: float, tpot_ms: float,
           top_n: int = 5) -> list[Candidate]:
    """aiconfigurator's agg and disagg search; every Pareto point of both, as candidates for the budget."""
    aic_api = _import()
    from aiconfigurator.sdk.errors import NoFeasibleConfigError

    try:
        with _quiet():
            result = aic_api.cli_default(model_path=model_path, total_gpus=gpus, system=system, backend=BACKEND,
                                         isl=isl, osl=osl, ttft=ttft_ms, tpot=tpot_ms, top_n=top_n)
    except NoFeasibleConfigError as exc:
        raise SizingError(f"aiconfigurator found no configuration of {model_path} on {gpus} x {system} "
                          f"for ISL {isl} / OSL {osl} within TTFT {ttft_ms:g} ms: {exc}") from None
    out: list[Candidate] = []
    for mode in ("agg", "disagg"):
        df = result.pareto_fronts.get(mode)
        if df is None or df.empty:
            continue
        for row in df.to_dict("records"):
            cand = _candidate(mode, row, gpus)
            if cand is not None:
                out.append(cand)
    return out


def _num(row: dict, key: str, default=0.0) -> float:
    value = row.get(key, default)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return float(default)
    return value if math.isfinite(value) else float(default)


def _candidate(mode: str, row: dict, gpus: int) -> Candidate | None:
    per_replica = int(_num(row, "num_total_gpus"))
    if per_replica <= 0 or per_replica > gpus:
        return None
    replicas = gpus // per_replica
    cluster_tps = _num(row, "tokens/s/gpu") * replicas * per_replica / gpus
    common = dict(mode=mode, replicas=replicas, gpus_used=replicas * per_replica,
                  concurrency=int(_num(row, "concurrency")), ttft_ms=_num(row, "ttft"), tpot_ms=_num(row, "tpot"),
                  tokens_s_gpu=round(cluster_tps, 3), tokens_s_user=_num(row, "tokens/s/user"))
    if mode == "agg":
        workers = int(_num(row, "dp", 1)) or 1
        return Candidate(**common, ctx_instances=0, ctx_tp=0, ctx_pp=0, ctx_batch=0,
                         gen_instances=replicas * max(1, per_replica // max(1, int(_num(row, "tp", 1)) *
                                                                              int(_num(row, "pp", 1)))),
                         gen_tp=int(_num(row, "tp", 1)), gen_pp=int(_num(row, "pp", 1)), gen_batch=int(_num(row, "bs")),
                         gemm=str(row.get("gemm")), kvcache=str(row.get("kvcache")),
                         trtllm_version=str(row.get("version")), extra={"dp": workers})
    return Candidate(**common,
                     ctx_instances=replicas * int(_num(row, "(p)workers", 1)), ctx_tp=int(_num(row, "(p)tp", 1)),
                     ctx_pp=int(_num(row, "(p)pp", 1)), ctx_batch=int(_num(row, "(p)bs", 1)),
                     gen_instances=replicas * int(_num(row, "(d)workers", 1)), gen_tp=int(_num(row, "(d)tp", 1)),
                     gen_pp=int(_num(row, "(d)pp", 1)), gen_batch=int(_num(row, "(d)bs", 1)),
                     gemm=str(row.get("(p)gemm")), kvcache=str(row.get("(p)kvcache")),
                     trtllm_version=str(row.get("(p)version")))


_QUANT = {"fp8": "fp8", "nvfp4": "nvfp4"}


def estimate_disagg(model_path: str, system: str, *, isl: int, osl: int, ctx_tp: int, ctx_pp: int, ctx_batch: int,
                    ctx_instances: int, gen_tp: int, gen_pp: int, gen_batch: int, gen_instances: int,
                    quantization: str | None, kv_dtype: str) -> dict:
    """aiconfigurator's estimate of one exact disaggregated configuration: its raw disagg columns."""
    aic_api = _import()
    kwargs = {}
    if quantization in _QUANT:
        kwargs["gemm_quant_mode"] = _QUANT[quantization]
    if kv_dtype == "fp8":
        kwargs["kvcache_quant_mode"] = "fp8"
    try:
        with _quiet():
            res = aic_api.cli_estimate(model_path, system, mode="disagg", backend_name=BACKEND, isl=isl, osl=osl,
                                       prefill_tp_size=ctx_tp, prefill_pp_size=ctx_pp, prefill_batch_size=ctx_batch,
                                       prefill_num_workers=ctx_instances, decode_tp_size=gen_tp,
                                       decode_pp_size=gen_pp, decode_batch_size=gen_batch,
                                       decode_num_workers=gen_instances, **kwargs)
    except Exception as exc:  # aiconfigurator raises plain ValueError/RuntimeError for what it cannot model
        raise SizingError(f"aiconfigurator {PINNED} cannot estimate this configuration: {exc}") from None
    raw = dict(res.raw)
    raw["kv_cache_warning"] = res.kv_cache_warning
    return raw
