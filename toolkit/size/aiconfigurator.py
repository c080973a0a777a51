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
- Columns (agg): ``tp pp dp moe_tp moe_ep cp bs concurrency ttft tpot tokens/s/gpu tokens/s/user num_total_gpus
  gemm moe kvcache memory backend version system``; (disagg) the same with ``(p)`` (prefill = context) and
  ``(d)`` (decode = generation) prefixes, plus ``(p)workers (d)workers``. Times in ms, memory in GiB.
  toolkit/size/candidates.py reads them and says how a row maps onto TensorRT-LLM (attention DP, MoE TP x EP).
- Single configuration: ``cli_estimate(model_path, system_name, mode="disagg", isl=, osl=,
  prefill_tp_size=, prefill_pp_size=, prefill_attention_dp_size=, prefill_moe_tp_size=, prefill_moe_ep_size=,
  prefill_batch_size=, prefill_num_workers=, decode_... the same, gemm_quant_mode=, moe_quant_mode=,
  kvcache_quant_mode=)`` returns ``EstimateResult`` (``ttft``, ``tpot``, ``raw`` with the same disagg columns).
  For a MoE model one of moe_tp/moe_ep is required ("At least one of moe_tp_size or moe_ep_size must be set").
  MTP needs ``nextn`` and ``nextn_accepted`` (the accepted draft tokens per step, "never inferred").
- Models: a local directory holding config.json, or a Hugging Face id; ids outside the pre-downloaded set
  (``aiconfigurator_core.sdk.common.DefaultHFModels``, configs in ``aiconfigurator_core/model_configs/``) are
  downloaded from the hub. tk passes only pre-downloaded ids or local directories, so nothing is fetched.
  Architectures: ``common.ARCHITECTURE_TO_MODEL_FAMILY``. Support: ``common.check_support(model, system,
  backend, architecture=)`` → ``SupportResult`` from the support matrix (pass/total counts per mode); a local
  directory is matched by its config's architecture, which must be passed (the path itself is in no matrix).
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
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import TkError
from toolkit.facts.models import ModelSpec
from toolkit.size.candidates import COLUMNS, Candidate, RoleShape  # noqa: F401  (Candidate: the public name)

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
    "Qwen/Qwen3-30B-A3B": "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen3-235B-A22B": "Qwen/Qwen3-235B-A22B",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mistralai/Mixtral-8x7B-v0.1",
    "openai/gpt-oss-120b": "openai/gpt-oss-120b",
    "deepseek-ai/DeepSeek-R1": "deepseek-ai/DeepSeek-R1",
    "deepseek-ai/DeepSeek-V3": "deepseek-ai/DeepSeek-V3",
    # aiconfigurator ships this config (model_configs/moonshotai--Kimi-K2-Instruct_config.json) but does not list
    # the id among its pre-downloaded ones (it would fetch it from the hub): tk hands it the file as a local
    # directory instead (_cached_config_dir).
    "moonshotai/Kimi-K2-Instruct": "moonshotai/Kimi-K2-Instruct",
}

# aiconfigurator system -> (tk's cluster.gpu, GPUs per node of that system: systems/<system>.yaml
# num_gpus_per_node).
SYSTEM_TO_GPU = {"h100_sxm": ("H100", 8), "h200_sxm": ("H200", 8), "b200_sxm": ("B200", 8),
                 "b300_sxm": ("B300", 8), "gb200": ("GB200", 4), "gb300": ("GB300", 4), "a100_sxm": ("A100", 8),
                 "l40s": ("L40S", 8)}
GPU_TO_SYSTEM = {gpu: system for system, (gpu, _) in SYSTEM_TO_GPU.items()}
# tk's quantization names (facts.models.QUANT_BYTES) -> aiconfigurator's GEMM and MoE quant modes
# (aiconfigurator_core.sdk.common.GEMMQuantMode / MoEQuantMode).
QUANT_MODES = {"fp8": ("fp8", "fp8"), "fp8_block": ("fp8_block", "fp8_block"), "nvfp4": ("nvfp4", "nvfp4"),
               "mxfp4": (None, "w4a16_mxfp4"), "bfloat16": ("bfloat16", "bfloat16"),
               "float16": ("bfloat16", "bfloat16")}

# tk's KV cache dtypes (the plan's, "auto" resolved) -> aiconfigurator's KV cache quant mode
# (aiconfigurator_core.sdk.common.KVCacheQuantMode: bfloat16, int8, fp8; float16 has bfloat16's two bytes). Always
# passed where it exists: left out, aiconfigurator infers one from the checkpoint (fp8 for DeepSeek's fp8 blocks),
# which TensorRT-LLM does not do.
KV_MODES = {"bfloat16": "bfloat16", "float16": "bfloat16", "fp8": "fp8"}


class SizingError(TkError):
    """Sizing cannot go on: an unsupported model or system, a missing extra, no feasible configuration.
    ``exit_code`` 2 (a usage problem the message explains)."""

    exit_code = 2


def _check_pin() -> None:
    """aiconfigurator is installed at the pinned version, its log lines quietened; imports only its small top
    package and ``aiconfigurator_core`` (not ``aiconfigurator.cli.api``, which pulls pandas: about 0.6 s)."""
    try:
        import aiconfigurator
        import aiconfigurator_core  # noqa: F401  (the compiled engine and the per-operation data)
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


def _import():
    _check_pin()
    try:
        from aiconfigurator.cli import api as aic_api
    except ImportError as exc:
        raise SizingError(f"tk size needs aiconfigurator {PINNED} ({exc}); install the extra: "
                          "pip install 'tk-disagg[size]'") from None
    return aic_api


@contextlib.contextmanager
def _quiet():
    """aiconfigurator prints progress and tables on stdout: keep stdout for tk's --json document."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink):
        yield sink


def _has_trtllm_data(system: str) -> bool:
    _check_pin()
    from aiconfigurator_core.sdk.perf_database import get_systems_paths

    for root in get_systems_paths():
        data = os.path.join(root, "data", system)
        if os.path.isfile(os.path.join(root, f"{system}.yaml")) and os.path.isdir(data):
            return any(os.path.isdir(os.path.join(data, op, BACKEND)) for op in os.listdir(data))
    return False


def supported_systems() -> list[str]:
    _check_pin()
    from aiconfigurator_core.sdk.perf_database import get_supported_databases

    return sorted(s for s, backends in get_supported_databases().items() if backends.get(BACKEND))


def supported_models() -> tuple[list[str], list[str]]:
    """(tk built-in names aiconfigurator can size, architectures a local config.json may have)."""
    _check_pin()
    from aiconfigurator_core.sdk import common

    return sorted(BUILTIN_TO_AIC), sorted(common.ARCHITECTURE_TO_MODEL_FAMILY)


_CACHED_DIRS: dict[str, tempfile.TemporaryDirectory] = {}


def _cached_config_dir(aic_id: str) -> str | None:
    """A directory whose config.json is aiconfigurator's own cached copy of ``aic_id`` (for ids it ships but does
    not list as pre-downloaded); None when it ships none. Lives as long as this process."""
    if aic_id not in _CACHED_DIRS:
        from aiconfigurator_core.sdk import utils

        cached = Path(utils._get_model_config_path()) / f"{aic_id.replace('/', '--')}_config.json"
        if not cached.is_file():
            return None
        tmp = tempfile.TemporaryDirectory(prefix="tk-aic-model-")
        os.symlink(cached, Path(tmp.name) / "config.json")
        _CACHED_DIRS[aic_id] = tmp
    return _CACHED_DIRS[aic_id].name


def model_path_for(model: ModelSpec) -> tuple[str, str | None]:
    """What aiconfigurator reads for ``model``, and its architecture: a pre-downloaded id (built-in), the cached
    config of one, or the local directory (whose config.json's architecture tk passes on)."""
    _check_pin()
    from aiconfigurator_core.sdk import common

    if model.source == "built-in":
        aic = BUILTIN_TO_AIC.get(model.name)
        path = aic if aic in common.DefaultHFModels else (_cached_config_dir(aic) if aic else None)
        if path is None:
            names, _ = supported_models()
            raise SizingError(f"aiconfigurator {PINNED} cannot size {model.name}; tk can size these built-in "
                              f"models: {', '.join(names)}; or give a local directory with a config.json of a "
                              f"supported architecture (tk size --help)")
        _check_geometry(model, path)
        return path, model.architecture or None
    directory = str(Path(model.source).parent)
    return directory, _check_architecture(directory, model)


def _check_geometry(model: ModelSpec, aic_path: str) -> None:
    from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

    try:
        with _quiet():
            cfg = get_model_config_from_model_path(aic_path)
    except Exception as exc:  # noqa: BLE001 - aiconfigurator's own failure on its config: a message
        raise failed_on_model(aic_path, exc) from None
    if model.attention == "mla":
        return  # aiconfigurator models MLA from the checkpoint; tk's num_kv_heads/head_dim are the latent's
    ours = (model.num_layers, model.num_attention_heads, model.num_kv_heads, model.head_dim)
    theirs = (cfg.get("layers"), cfg.get("n"), cfg.get("n_kv"), cfg.get("d"))
    if ours != theirs:
        raise SizingError(f"{model.name}: tk's facts (layers, heads, KV heads, head_dim = {ours}) differ from "
                          f"aiconfigurator's {aic_path} config {theirs}; the mapping in "
                          "toolkit/size/aiconfigurator.py is wrong")


def _check_architecture(directory: str, model: ModelSpec) -> str:
    """The architecture of a local model aiconfigurator models, or a SizingError saying the architecture is the
    problem."""
    from aiconfigurator_core.sdk import common

    archs = [model.architecture] if model.architecture else []  # read (bounded and checked) by facts.models
    for arch in archs:
        if arch in common.ARCHITECTURE_TO_MODEL_FAMILY:
            return arch
    known = sorted(common.ARCHITECTURE_TO_MODEL_FAMILY)
    raise SizingError(
        f"{directory}/config.json: the architecture is the problem: {', '.join(map(str, archs)) or '(none given)'}"
        f" is not one aiconfigurator {PINNED} models ({', '.join(known)}). Fix: size a built-in model of the same "
        "shape (tk recipes --models), or plan the recipe without a prediction (tk plan checks memory and layout)")


def check_system(system: str) -> None:
    if system in SYSTEM_TO_GPU and _has_trtllm_data(system):
        return  # the cheap path; the full listing below reads every system's data tree (about a second)
    systems = supported_systems()
    if system not in systems:
        raise SizingError(f"the system is the problem: {system!r} has no TensorRT-LLM data in aiconfigurator "
                          f"{PINNED}. Fix: --system one of {', '.join(s for s in systems if s in SYSTEM_TO_GPU)}")
    if system not in SYSTEM_TO_GPU:
        raise SizingError(f"the system is the problem: {system!r} is modelled by aiconfigurator but tk has no GPU "
                          f"for it. Fix: --system one of {', '.join(sorted(SYSTEM_TO_GPU))}")


def check_support(model_path: str, system: str, architecture: str | None = None) -> str | None:
    """aiconfigurator's support matrix on (model, system): None when it passes there, a note when the matrix
    has no result at all (untested: the estimate is aiconfigurator's model of the architecture), or a
    SizingError naming the systems where it passes when its tests fail on this one."""
    from aiconfigurator_core.sdk import common

    def result(sys_name: str):
        try:
            return common.check_support(model_path, sys_name, BACKEND, architecture=architecture)
        except Exception as exc:  # noqa: BLE001 - it may read the config: a message, never a traceback
            raise failed_on_model(model_path, exc) from None

    r = result(system)
    if r.disagg_supported:
        return None
    what = architecture or model_path
    if not r.disagg_total_count:
        return (f"aiconfigurator {PINNED}'s support matrix has no disaggregated TensorRT-LLM result for {what} on "
                f"{system}: its numbers are its model of the architecture, untested there")
    passing = [s for s in sorted(SYSTEM_TO_GPU) if s != system and _has_trtllm_data(s) and result(s).disagg_supported]
    raise SizingError(
        f"the system is the problem: aiconfigurator {PINNED}'s support matrix has {what} failing disaggregated "
        f"TensorRT-LLM runs on {system} ({r.disagg_pass_count} of {r.disagg_total_count} pass). Fix: "
        + (f"--system one of {', '.join(passing)}" if passing else "no system passes it; size a built-in model"))


def failed_on_model(model_path: str, exc: BaseException) -> SizingError:
    """What aiconfigurator raised while reading or modelling ``model_path`` (a local directory, or the id of a
    config it ships), as a SizingError naming the file and the key or cause: it raises KeyError for a config.json
    key it needs (``_parse_hf_config_json`` in aiconfigurator_core/sdk/utils.py of 0.12.0 indexes
    max_position_embeddings, hidden_size, vocab_size... directly) and plain ValueError/RuntimeError for what it
    cannot model."""
    local = os.path.isdir(model_path)
    where = f"{model_path}/config.json" if local else f"its config of {model_path}"
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
        key = exc.args[0]
        fix = (f"add {key} to {model_path}/config.json (the checkpoint's own value)" if local else
               "size a local directory holding the checkpoint's config.json")
        head = f"{where}: aiconfigurator {PINNED} needs {key!r}" if local else \
            f"aiconfigurator {PINNED} needs {key!r} in {where}"
        return SizingError(f"{head}, which it does not have. Fix: {fix}")
    detail = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else "(no message)"
    head = f"{where}: aiconfigurator {PINNED} failed on it" if local else f"aiconfigurator {PINNED} failed on {where}"
    fix = (f"if {model_path}/config.json was edited, restore the checkpoint's own; otherwise aiconfigurator cannot "
           "model it: size a built-in model of the same shape (tk recipes --models)" if local else
           "another --system, or a built-in model of the same shape (tk recipes --models)")
    return SizingError(f"{head}: {type(exc).__name__}: {detail}. Fix: {fix}")


def search(model_path: str, system: str, gpus: int, isl: int, osl: int, ttft_ms: float, tpot_ms: float,
           top_n: int = 5) -> dict[str, list[dict]]:
    """aiconfigurator's agg and disagg search: every Pareto row of both (the columns tk reads), by mode. Whatever
    aiconfigurator raises is a SizingError (failed_on_model), never a traceback."""
    aic_api = _import()
    from aiconfigurator.sdk.errors import NoFeasibleConfigError

    try:
        with _quiet():
            result = aic_api.cli_default(model_path=model_path, total_gpus=gpus, system=system, backend=BACKEND,
                                         isl=isl, osl=osl, ttft=ttft_ms, tpot=tpot_ms, top_n=top_n)
    except NoFeasibleConfigError as exc:
        raise SizingError(f"aiconfigurator found no configuration of {model_path} on {gpus} x {system} "
                          f"for ISL {isl} / OSL {osl} within TTFT {ttft_ms:g} ms: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - aiconfigurator's own failures (KeyError, ValueError, ...) on a model
        raise failed_on_model(model_path, exc) from None
    out: dict[str, list[dict]] = {}
    for mode in ("agg", "disagg"):
        df = result.pareto_fronts.get(mode)
        if df is None or df.empty:
            continue
        keep = [c for c in COLUMNS if c in df.columns]
        out[mode] = [{k: _plain(v) for k, v in row.items()} for row in df[keep].to_dict("records")]
    return out


def _plain(value):
    """A DataFrame cell as a JSON value (numpy numbers to Python ones; NaN to None)."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _quant_kwargs(is_moe: bool, quantization: str | None, kv_dtype: str) -> dict:
    """cli_estimate's quant modes for the recipe's quantization and the plan's KV cache dtype."""
    kwargs = {}
    gemm, moe = QUANT_MODES.get(quantization or "", (None, None))
    if gemm:
        kwargs["gemm_quant_mode"] = gemm
    if moe and is_moe:
        kwargs["moe_quant_mode"] = moe
    if kv_dtype in KV_MODES:
        kwargs["kvcache_quant_mode"] = KV_MODES[kv_dtype]
    return kwargs


def _estimate(model_path: str, system: str, mode: str, kv_dtype: str, **kwargs) -> dict:
    """One cli_estimate call (mode "agg" or "disagg"): its raw columns, with its KV-cache warning and the FMHA
    fallback it needed, if any. Whatever it raises is a SizingError."""
    aic_api = _import()

    def run(**more):
        with _quiet():
            return aic_api.cli_estimate(model_path, system, mode=mode, backend_name=BACKEND, **kwargs, **more)

    fallback = None
    try:
        try:
            res = run()
        except Exception as exc:
            # Its sweep picks the attention (FMHA) precision per phase (bfloat16 context MLA beside an fp8 decode
            # one on Hopper); cli_estimate takes one for both and, from an fp8 KV cache, infers fp8, for which some
            # systems have no context data ("perf database error: context MLA data missing"). Then both phases are
            # estimated with bfloat16 attention, and the prediction says so.
            if "data missing" not in str(exc) or kv_dtype != "fp8":
                raise
            res = run(fmha_quant_mode="bfloat16")
            fallback = (f"attention (FMHA) in bfloat16{' on both roles' if mode == 'disagg' else ''}: aiconfigurator "
                        f"{PINNED} has no fp8 context attention data for this model on {system}")
    except KeyError as exc:  # a config.json key it needs (failed_on_model)
        raise failed_on_model(model_path, exc) from None
    except Exception as exc:  # aiconfigurator raises plain ValueError/RuntimeError for what it cannot model
        raise SizingError(f"aiconfigurator {PINNED} cannot estimate this configuration: {exc}") from None
    raw = {k: _plain(v) for k, v in dict(res.raw).items()}
    raw["kv_cache_warning"] = res.kv_cache_warning
    raw["fmha_fallback"] = fallback
    return raw


def estimate_disagg(model_path: str, system: str, *, isl: int, osl: int, ctx: RoleShape, gen: RoleShape,
                    is_moe: bool, quantization: str | None, kv_dtype: str) -> dict:
    """aiconfigurator's estimate of one exact disaggregated configuration: its raw disagg columns."""
    kwargs = _quant_kwargs(is_moe, quantization, kv_dtype)
    for prefix, role in (("prefill", ctx), ("decode", gen)):
        kwargs.update({f"{prefix}_tp_size": role.tp, f"{prefix}_pp_size": role.pp,
                       f"{prefix}_attention_dp_size": role.dp, f"{prefix}_batch_size": role.batch,
                       f"{prefix}_num_workers": role.workers})
        if is_moe:
            kwargs.update({f"{prefix}_moe_tp_size": role.moe_tp, f"{prefix}_moe_ep_size": role.moe_ep})
    return _estimate(model_path, system, "disagg", kv_dtype, isl=isl, osl=osl, **kwargs)


def estimate_agg(model_path: str, system: str, *, isl: int, osl: int, server: RoleShape, ctx_tokens: int,
                 is_moe: bool, quantization: str | None, kv_dtype: str) -> dict:
    """aiconfigurator's estimate of one aggregated (in-flight batching) server of ``server``'s shape, ``batch``
    requests per attention-DP rank and ``ctx_tokens`` prompt tokens per step (TensorRT-LLM's max_num_tokens):
    its raw agg columns (cli_estimate mode "agg", one server; ``server.workers`` is not passed)."""
    kwargs = _quant_kwargs(is_moe, quantization, kv_dtype)
    kwargs.update({"tp_size": server.tp, "pp_size": server.pp, "attention_dp_size": server.dp,
                   "batch_size": server.batch, "ctx_tokens": ctx_tokens})
    if is_moe:
        kwargs.update({"moe_tp_size": server.moe_tp, "moe_ep_size": server.moe_ep})
    return _estimate(model_path, system, "agg", kv_dtype, isl=isl, osl=osl, **kwargs)


# --- Per-iteration times (the CPU stand-in's emulated timing; the table: toolkit/facts/steptime.py) ------------------
#
# Facts from aiconfigurator 0.12.0's source (the wheels; upstream github.com/ai-dynamo/aiconfigurator at 095f58a):
# - ``aiconfigurator_core.sdk.engine.EngineHandle.compile(model_path, system, backend, backend_version=, tp_size=,
#   pp_size=, attention_dp_size=, moe_tp_size=, moe_ep_size=, gemm_quant_mode=, moe_quant_mode=,
#   kvcache_quant_mode=, fmha_quant_mode=)`` builds the model's context and generation operation lists (GEMMs,
#   context/generation attention, TP all-reduce, MoE and its dispatch, ...) once and evaluates them in its compiled
#   engine against the per-operation database of (system, TensorRT-LLM version). It is what ``cli_estimate``'s
#   static modes run (sdk/backends/base_backend.py ``_run_static_breakdown`` ->
#   rust_engine_step.estimate_static_latency_breakdown_with_rust).
# - ``predict_prefill_latency(bs, isl, prefix)`` is one pass over the context operations at batch ``bs`` and
#   ``isl - prefix`` new tokens per request (aic-core/rust/aiconfigurator-core/src/engine/runtime.rs
#   ``predict_prefill_latency`` -> ``run_context_phase``); ``predict_decode_latency(bs, isl, osl=2)`` one decode
#   step at KV length ``isl + 1`` (``run_generation_phase``: ``s = isl + i + 1``, i = 0). These are what its
#   forward-pass model (the Dynamo mocker's contract, ``Engine::rank_latency_ms``) uses for a prefill-only and a
#   decode-only iteration: ``run_context_ops(n, sum_prefill_tokens / n, sum_prefill_kv_tokens / n)`` and
#   ``run_generation_ops_step(n, sum_decode_kv_tokens / n)``.
# - A mixed iteration (``get_mix_step_ops`` in src/session.rs): the non-attention context operations once over all
#   its tokens (batch 1, prefill + decode tokens), plus context attention at the prefill shape, plus generation
#   attention at the decode shape. ``mixed_step_breakdown(ctx, gen, isl, osl, prefix)`` returns those three parts
#   separately (``[total, shared_non_attention, context_attention, decode_attention]``, runtime.rs
#   ``mixed_step_breakdown``; decode attention at ``s = isl + osl // 2 + 1``).
# - Versions: ``perf_database.get_version_slots(system, backend)`` names the maintained default ("current") and
#   the opt-in "next"; with slots, those are the queryable versions (``get_supported_databases``).

PRECISION_TO_QUANT = {"bf16": "bfloat16", "fp8": "fp8"}  # the stand-in's standin.emulate.precision -> GEMM mode


@dataclass(frozen=True)
class DataChoice:
    """Which aiconfigurator database times a TensorRT-LLM version on a GPU."""

    system: str  # aiconfigurator's system (h100_sxm, ...)
    version: str  # its TensorRT-LLM data version (1.3.0rc20, ...)
    note: str  # why this version, for the server's first log line and /version


def trtllm_data_versions(system: str) -> tuple[list[str], str | None]:
    """(the TensorRT-LLM data versions aiconfigurator queries for ``system``, its maintained default): the version
    slots when it has them (reads one small file), else every version it lists (reads every system's tree)."""
    _check_pin()
    from aiconfigurator_core.sdk import perf_database

    try:
        slots = perf_database.get_version_slots(system, BACKEND)
        if slots:
            return sorted(set(slots.values())), slots.get("current")
        versions = perf_database.get_supported_databases().get(system, {}).get(BACKEND, [])
    except Exception as exc:  # noqa: BLE001 - its own files unreadable: a reason, never a traceback
        raise SizingError(f"aiconfigurator {PINNED} could not list its TensorRT-LLM data for {system}: "
                          f"{type(exc).__name__}: {str(exc)[:200]}") from None
    return sorted(versions), None


def choose_data(gpu: str, line: str, release: str | None, listing=trtllm_data_versions) -> DataChoice:
    """The database for TensorRT-LLM ``line`` (``release`` when the recipe names one) on tk's ``gpu``: the
    release itself when aiconfigurator has it, else its maintained default when that is of the same line, else
    the newest of the line. SizingError (naming what it does have) when it has no data of that line for the GPU:
    the caller then falls back to another timing model."""
    from toolkit.facts.versions import parse_version, version_key

    system = GPU_TO_SYSTEM.get(gpu)
    if system is None:
        raise SizingError(f"aiconfigurator {PINNED} has no system for GPU {gpu}")
    versions, default = listing(system)
    if not versions:
        raise SizingError(f"aiconfigurator {PINNED} has no TensorRT-LLM data for {system}")

    def line_of(v: str) -> str | None:
        parsed = parse_version(v.lstrip("v"))
        return parsed.line if parsed else None
    same = [v for v in versions if line_of(v) == line]
    if not same:
        raise SizingError(f"aiconfigurator {PINNED} has no TensorRT-LLM {line} data for {system} "
                          f"(it has {', '.join(versions)})")
    wanted = (release or "").lstrip("v")
    if wanted in same:
        return DataChoice(system, wanted, "the release asked for")
    pick = default if default in same else max(same, key=lambda v: version_key(v.lstrip("v")))
    why = f"its maintained default for {line}" if pick == default else f"the newest {line} data it has"
    return DataChoice(system, pick, f"asked for {wanted or line}: {why}")


def quant_modes(model: ModelSpec, precision: str, kv_dtype: str) -> dict:
    """EngineHandle.compile's quant modes for the emulated model at ``precision`` (bf16 | fp8: an fp8 checkpoint's
    own flavour, e.g. DeepSeek's fp8_block, else per-tensor fp8) and the role's KV cache dtype."""
    gemm = PRECISION_TO_QUANT[precision]
    if precision == "fp8" and model.quantization in ("fp8", "fp8_block"):
        gemm = model.quantization
    modes = {"gemm_quant_mode": gemm}
    if model.is_moe:
        modes["moe_quant_mode"] = gemm
    kv = "bfloat16" if kv_dtype == "auto" else kv_dtype
    if kv in KV_MODES:
        modes["kvcache_quant_mode"] = KV_MODES[kv]
    return modes


class StepEngine:
    """aiconfigurator's compiled engine for one model, layout, precision and database: the parts of one iteration
    in milliseconds (the composition and the table: toolkit/facts/steptime.py)."""

    def __init__(self, handle, choice: DataChoice, describe: str, notes: tuple[str, ...]):
        self._h = handle
        self.choice = choice
        self.describe = describe  # model, layout, quant modes
        self.notes = notes

    def prefill_ms(self, n: int, tokens: int, prefix: int) -> float:
        """n requests computing ``tokens`` new tokens each after ``prefix`` tokens already in their KV."""
        return self._h.predict_prefill_latency(n, tokens + prefix, prefix)

    def decode_ms(self, n: int, kv: int) -> float:
        """One decode step of n requests whose KV holds ``kv`` tokens each (the token being written included)."""
        return self._h.predict_decode_latency(n, max(1, kv - 1), 2)

    def shared_ms(self, tokens: int) -> float:
        """The non-attention work of a mixed iteration over ``tokens`` prefill + decode tokens."""
        return self._h.mixed_step_breakdown(tokens, 0, tokens, 1, 0)[1]

    def context_attention_ms(self, n: int, tokens: int) -> float:
        """Context attention of n requests of ``tokens`` new tokens each, nothing cached before them."""
        return self._h.mixed_step_breakdown(n * tokens, 0, tokens, 1, 0)[2]

    def decode_attention_ms(self, n: int, kv: int) -> float:
        """Generation attention of n decoding requests whose KV holds ``kv`` tokens each."""
        return self._h.mixed_step_breakdown(0, n, max(1, kv - 1), 1, 0)[3]


def step_engine(model: ModelSpec, choice: DataChoice, *, tp: int, pp: int = 1, attention_dp: bool = False,
                ep: int | None = None, precision: str = "bf16", kv_dtype: str = "auto") -> StepEngine:
    """Compile aiconfigurator's engine for ``model`` on ``choice``'s database in TensorRT-LLM's layout: attention
    DP as aiconfigurator's ``attention_dp_size = tp`` with attention ``tp = 1``; MoE as ``moe_ep = ep`` (default
    tp, as tk's plan writes moe_expert_parallel_size) and ``moe_tp = tp // ep``. Whatever aiconfigurator raises is
    a SizingError naming the cause (a model, layout or precision it has no data for)."""
    _check_pin()
    from aiconfigurator_core.sdk.engine import EngineHandle

    path, _architecture = model_path_for(model)
    kwargs: dict = {"tp_size": 1 if attention_dp else tp, "pp_size": pp, "attention_dp_size": tp if attention_dp else 1}
    if model.is_moe:
        moe_ep = ep or tp
        kwargs.update(moe_tp_size=max(1, tp // moe_ep), moe_ep_size=moe_ep)
    kwargs.update(quant_modes(model, precision, kv_dtype))
    notes: list[str] = []

    def compile_and_probe(**more):
        with _quiet():
            handle = EngineHandle.compile(path, choice.system, BACKEND, backend_version=choice.version, **kwargs,
                                          **more)
            handle.predict_prefill_latency(1, 16, 0)  # a database miss shows here, not in the first iteration
            handle.predict_decode_latency(1, 16, 2)
        return handle

    try:
        try:
            handle = compile_and_probe()
        except Exception as exc:
            if "data missing" not in str(exc) or kwargs.get("kvcache_quant_mode") != "fp8":
                raise
            handle = compile_and_probe(fmha_quant_mode="bfloat16")  # as _estimate: no fp8 context attention data
            notes.append(f"attention (FMHA) in bfloat16: aiconfigurator {PINNED} has no fp8 context attention data "
                         f"for this model on {choice.system}")
    except SizingError:
        raise
    except KeyError as exc:
        raise failed_on_model(path, exc) from None
    except Exception as exc:  # noqa: BLE001 - its ValueError/RuntimeError/PerfDataNotAvailableError: a message
        detail = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise SizingError(f"aiconfigurator {PINNED} cannot time {model.name} on {choice.system} "
                          f"({choice.version}): {detail}") from None
    layout = (f"TP{tp}" + (f" PP{pp}" if pp > 1 else "") + (" attention DP" if attention_dp else "")
              + (f" EP{kwargs['moe_ep_size']}" if model.is_moe else ""))
    quant = ", ".join(f"{k.removesuffix('_quant_mode')} {v}" for k, v in kwargs.items() if k.endswith("_quant_mode"))
    return StepEngine(handle, choice, f"{model.name} ({layout}; {quant})", tuple(notes))


def estimate_static(model: ModelSpec, choice: DataChoice, *, mode: str, batch: int, isl: int, osl: int, tp: int,
                    pp: int = 1, attention_dp: bool = False, ep: int | None = None, precision: str = "bf16",
                    kv_dtype: str = "auto") -> dict:
    """aiconfigurator's static estimate (``cli_estimate`` mode ``static_ctx``: one prefill of ``batch`` prompts,
    its TTFT; ``static_gen``: ``batch`` requests decoding ``osl`` tokens after ``isl``, its TPOT; ``static``: both)
    of one server in the layout, precision and data version the stand-in's table uses (``step_engine``): its raw
    columns. No queueing, no batching dynamics, no KV transfer (sdk/backends/base_backend.py ``run_static``)."""
    path, _ = model_path_for(model)
    kwargs: dict = {"tp_size": 1 if attention_dp else tp, "pp_size": pp, "attention_dp_size": tp if attention_dp else 1,
                    "batch_size": batch, "backend_version": choice.version}
    if model.is_moe:
        moe_ep = ep or tp
        kwargs.update(moe_tp_size=max(1, tp // moe_ep), moe_ep_size=moe_ep)
    modes = quant_modes(model, precision, kv_dtype)
    kv = modes.pop("kvcache_quant_mode", None)
    kwargs.update(modes)
    if kv:
        kwargs["kvcache_quant_mode"] = kv
    return _estimate(path, choice.system, mode, "fp8" if kv == "fp8" else "bfloat16", isl=isl, osl=osl, **kwargs)
