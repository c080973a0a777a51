"""tk size: from a model, a GPU budget and an SLA to a recipe, with the KV-transfer term added.

    size(model, system, gpus, isl, osl, ttft_ms, tpot_ms, transport=None, measured=None) -> SizeResult
    predict(plan) -> dict   aiconfigurator's estimate of an existing recipe's exact configuration

aiconfigurator (toolkit/size/aiconfigurator.py, the only module that imports it) ranks aggregated and
disaggregated configurations; toolkit/size/candidates.py reads its rows and translates each into recipe roles
(attention DP, MoE TP x EP, PP, workers, per-rank batches), marking those tk cannot express;
toolkit/size/transfer.py adds the KV transfer of the input to each disaggregated TTFT; toolkit/size/recipe.py
writes the best SLA-meeting candidate tk can deploy as a recipe and re-checks it with tk's own recipe and plan
stages (memory plan included): what the recipe deploys must equal the row. Sits beside launch and validate in
the import layers: reads plan, recipe and facts, never launch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from toolkit.facts.hardware import TRANSPORT_PROFILES
from toolkit.runtime import bounds
from toolkit.facts.models import ModelError, ModelSpec, resolve_model
from toolkit.size import aiconfigurator as aic
from toolkit.size import transfer
from toolkit.size.aiconfigurator import SizingError
from toolkit.size.candidates import Candidate, RoleShape, candidate

__all__ = ["Candidate", "RoleShape", "SizeResult", "SizingError", "predict", "size"]

MAX_RECHECKS = 25  # SLA-meeting disaggregated candidates tk re-checks, best first, before giving up


@dataclass
class SizeResult:
    """What tk size found: every candidate (ranked with the transfer term), the chosen one, the recipe."""

    model: ModelSpec
    model_arg: str
    aic_model: str
    system: str
    gpus: int
    isl: int
    osl: int
    ttft_ms: float
    tpot_ms: float
    bandwidth: transfer.Bandwidth
    transport: str
    candidates: list[Candidate]  # ranked: SLA-meeting first, then tokens/s/GPU
    chosen: Candidate | None = None
    best_overall: Candidate | None = None  # may be aggregated, which tk does not deploy
    rank_changes: list[dict] = field(default_factory=list)
    recipe_text: str = ""
    recheck: dict = field(default_factory=dict)
    timings_s: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def meets(self, c: Candidate) -> bool:
        return meets_sla(c, self.ttft_ms, self.tpot_ms)

    def to_dict(self) -> dict:
        return {
            "model": self.model.name, "aiconfigurator_model": self.aic_model, "system": self.system,
            "gpus": self.gpus, "isl": self.isl, "osl": self.osl,
            "sla": {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms},
            "aiconfigurator": aic.PINNED, "transport": self.transport,
            "bandwidth": self.bandwidth.to_dict(),
            "transfer_term": "ttft_total_ms = ttft_ms + bytes_per_token_per_ctx_rank * isl / (gbps * 1e9) * 1e3, "
                             "gbps on bandwidth.basis: the link's GB/s, or the staged transceiver's request time "
                             "(gather + WRITE + scatter) as bytes per second",
            "candidates": [{**c.to_dict(), "rank": i + 1, "meets_sla": self.meets(c)}
                           for i, c in enumerate(self.candidates)],
            "chosen": self.chosen.to_dict() if self.chosen else None,
            "best_overall": self.best_overall.to_dict() if self.best_overall else None,
            "rank_changes": self.rank_changes, "recheck": self.recheck, "notes": self.notes,
            "recipe": self.recipe_text, "timings_s": self.timings_s,
        }


def meets_sla(c: Candidate, ttft_ms: float, tpot_ms: float) -> bool:
    return c.ttft_total_ms <= ttft_ms and c.tpot_ms <= tpot_ms


def _order(cands: list[Candidate], ttft_ms: float, tpot_ms: float, with_transfer: bool) -> list[Candidate]:
    def key(c: Candidate):
        ttft = c.ttft_total_ms if with_transfer else c.ttft_ms
        ok = ttft <= ttft_ms and c.tpot_ms <= tpot_ms
        return (not ok, -c.tokens_s_gpu, ttft)
    return sorted(cands, key=key)


def add_transfer(cands: list[Candidate], model: ModelSpec, isl: int, gbps: float) -> list[Candidate]:
    """Each disaggregated candidate with its transfer term; aggregated ones move no KV (transfer 0). A context
    rank holds the KV heads of its attention TP (all of them under attention DP, where aiconfigurator's tp is 1)."""
    out = []
    for c in cands:
        if c.mode != "disagg":
            out.append(replace(c, transfer_ms=0.0))
            continue
        kv_dtype = transfer.kv_dtype_of(c.kvcache)
        nbytes = transfer.bytes_per_token(model, kv_dtype, c.ctx.tp, c.ctx.pp)
        out.append(replace(c, transfer_ms=round(transfer.transfer_ms(nbytes, isl, gbps), 6),
                           extra={**c.extra, "bytes_per_token_per_ctx_rank": nbytes, "kv_dtype": kv_dtype}))
    return out


def _check_bounds(gpus: int, isl: int, osl: int, ttft_ms: float, tpot_ms: float) -> None:
    for what, value, low, high in (("gpus", gpus, 1, 4096), ("isl", isl, 1, 1 << 21), ("osl", osl, 1, 1 << 21),
                                   ("ttft", ttft_ms, 0.001, 3.6e6), ("tpot", tpot_ms, 0.001, 3.6e6)):
        try:
            bounds.finite(f"--{what}", value, low, high)
        except bounds.BoundError as exc:
            raise SizingError(str(exc)) from None


def _resolve_model(model: str, isl: int, osl: int) -> ModelSpec:
    """The model, refused where ISL + OSL exceeds its context: what tk's plan refuses too (traffic.max_input_len,
    toolkit/plan/rules.py)."""
    try:
        spec = resolve_model(model)
    except ModelError as exc:
        raise SizingError(str(exc)) from None
    context = spec.max_position_embeddings
    if context and isl + osl > context:
        where = f"{spec.source}: max_position_embeddings" if spec.source != "built-in" else \
            "max_position_embeddings of the checkpoint"
        raise SizingError(f"--isl {isl} + --osl {osl} = {isl + osl} tokens exceeds {spec.name}'s {context}-token "
                          f"context ({where}), whatever the GPUs. Fix: lower --isl or --osl so they sum to at most "
                          f"{context}")
    return spec


def _bandwidth(transport: str | None, gpus: int, per_node: int, measured: str | None,
               measured_pick: str) -> tuple[str, transfer.Bandwidth]:
    """The transport (NVLink within one node, else InfiniBand, unless given) and the bandwidth the transfer term
    uses: measured by tk validate cluster where a report is given, else the transport's nominal figure."""
    if transport is None:
        transport = "nvlink-single-node" if gpus <= per_node else "infiniband"
    if transport not in TRANSPORT_PROFILES:
        raise SizingError(f"unknown transport {transport!r}; tk knows: {', '.join(TRANSPORT_PROFILES)}")
    if not measured:
        return transport, transfer.nominal(transport)
    try:
        return transport, transfer.measured(measured, measured_pick)
    except transfer.MeasuredError as exc:
        raise SizingError(str(exc)) from None


def _rank(raw: list[Candidate], spec: ModelSpec, isl: int, ttft_ms: float, tpot_ms: float,
          gbps: float) -> list[Candidate]:
    """The candidates ranked with the transfer term, each keeping its rank without it (aiconfigurator's)."""
    before = _order(raw, ttft_ms, tpot_ms, with_transfer=False)
    aic_rank = {id(c): i + 1 for i, c in enumerate(before)}
    raw = [replace(c, aic_rank=aic_rank[id(c)]) for c in raw]
    return _order(add_transfer(raw, spec, isl, gbps), ttft_ms, tpot_ms, with_transfer=True)


def _rank_changes(result: SizeResult) -> list[dict]:
    """Every candidate whose rank the transfer term moved."""
    return [{"shape": c.shape(), "mode": c.mode, "aiconfigurator_rank": c.aic_rank, "tk_rank": i + 1,
             "transfer_ms": c.transfer_ms,
             "meets_sla_without_transfer": c.ttft_ms <= result.ttft_ms and c.tpot_ms <= result.tpot_ms,
             "meets_sla": result.meets(c)}
            for i, c in enumerate(result.candidates) if c.aic_rank != i + 1]


def _impossible_sla(result: SizeResult, ok: list[Candidate]) -> SizingError:
    """No disaggregated candidate meets the SLA: the error names why, the closest one and the best ranked."""
    ranked, ttft_ms, tpot_ms = result.candidates, result.ttft_ms, result.tpot_ms
    best = ranked[0]
    why = ("no candidate meets the SLA" if not ok else
           f"only aggregated candidates meet the SLA (best: {ok[0].shape()}, "
           f"{ok[0].tokens_s_gpu:.1f} tokens/s/GPU),"
           " and tk size writes disaggregated recipes")
    disagg = [c for c in ranked if c.mode == "disagg"]
    closest = min(disagg or ranked, key=lambda c: max(c.ttft_total_ms / ttft_ms, c.tpot_ms / tpot_ms))
    return SizingError(
        f"impossible SLA (TTFT <= {ttft_ms:g} ms, TPOT <= {tpot_ms:g} ms) for {result.model.name} on {result.gpus} x "
        f"{result.system}, ISL {result.isl} / OSL {result.osl}: {why}. Closest: {closest.shape()}: TTFT "
        f"{closest.ttft_total_ms:.1f} ms (transfer {closest.transfer_ms:.1f} ms), TPOT {closest.tpot_ms:.1f} ms, "
        f"{closest.tokens_s_gpu:.1f} tokens/s/GPU; "
        f"{'best SLA-meeting' if result.meets(best) else 'first ranked'} {best.shape()}: TTFT "
        f"{best.ttft_total_ms:.1f} ms, TPOT {best.tpot_ms:.1f} ms, {best.tokens_s_gpu:.1f} tokens/s/GPU")


def _choose(result: SizeResult, ok_disagg: list[Candidate], *, gpu: str, per_node: int, name: str | None,
            output: str | None) -> Candidate:
    """The first SLA-meeting disaggregated candidate (of the best MAX_RECHECKS) tk can express and whose written
    recipe its plan accepts (returned; result.chosen, with its recipe and re-check); every candidate passed over is
    marked with why. SizingError where none is left."""
    from toolkit.size.recipe import recheck, write_recipe

    ranked = result.candidates
    marked: dict[int, str] = {}
    for c in ok_disagg[:MAX_RECHECKS]:
        why = c.why_not()
        if why:
            marked[id(c)] = f"tk cannot express it: {why}"
            continue
        text = write_recipe(result, c, gpu=gpu, gpus_per_node=per_node, name=name)
        check = recheck(text, c, result, output=output)
        if check["errors"]:  # tk's recipe or plan rules refuse it (the memory plan, heads, placement)
            marked[id(c)] = "tk's plan refuses it: " + check["errors"][0]
            continue
        result.chosen, result.recipe_text, result.recheck = c, text, check
        break
    result.candidates = [replace(c, rejected=marked.get(id(c), "")) for c in ranked]
    result.best_overall = result.candidates[0]
    if result.chosen is None:
        tried = [c for c in result.candidates if c.rejected]
        raise SizingError(
            f"none of the {len(ok_disagg)} SLA-meeting disaggregated candidates is one tk can deploy (the best "
            f"{len(tried)} checked): " + "; ".join(f"{c.shape()}: {c.rejected}" for c in tried[:3])
            + ". Fix: more GPUs (--gpus), a GPU with more memory, or a looser SLA")
    result.chosen = result.candidates[ranked.index(result.chosen)]
    return result.chosen


def _choice_notes(result: SizeResult, chosen: Candidate, best_ok: Candidate) -> list[str]:
    """What the user should know about the choice: an aggregated deployment predicted better, better-ranked
    candidates passed over."""
    notes = []
    if best_ok.mode == "agg":
        gain = best_ok.tokens_s_gpu / chosen.tokens_s_gpu - 1 if chosen.tokens_s_gpu else math.inf
        notes.append(f"aggregated serving ({best_ok.shape()}) is predicted {gain:.0%} more tokens/s/GPU than "
                     f"the best disaggregated candidate (tk launch --aggregated deploys it on the same GPUs); "
                     f"the recipe is the best disaggregated one")
    skipped = [c for c in result.candidates if c.rejected and result.meets(c)]
    if skipped:
        notes.append(f"{len(skipped)} better-ranked candidate(s) skipped: " +
                     "; ".join(f"{c.shape()} ({c.rejected})" for c in skipped[:3]))
    return notes


def size(model: str, system: str, gpus: int, isl: int, osl: int, ttft_ms: float, tpot_ms: float, *,
         transport: str | None = None, measured: str | None = None, measured_pick: str = "slowest",
         gpus_per_node: int | None = None, name: str | None = None, output: str | None = None,
         adapter=None) -> SizeResult:
    """Search, add the transfer term, rank, choose the best SLA-meeting disaggregated candidate tk can deploy,
    write and re-check its recipe. Raises SizingError (exit 2) for an unsupported model or system, or an SLA no
    deployable candidate meets. ``output``: where the recipe will be written (the re-check reads its relative
    paths from there). ``adapter``: the aiconfigurator adapter (toolkit/size/aiconfigurator.py; the specs give one
    that replays recorded aiconfigurator output)."""
    adapter = adapter or aic
    _check_bounds(gpus, isl, osl, ttft_ms, tpot_ms)
    ti = time.perf_counter()
    adapter._import()  # aiconfigurator's own import (about a second), which a bare aiconfigurator run pays too
    t0 = time.perf_counter()
    spec = _resolve_model(model, isl, osl)
    adapter.check_system(system)
    aic_model, architecture = adapter.model_path_for(spec)
    support_note = adapter.check_support(aic_model, system, architecture)
    gpu, default_per_node = adapter.SYSTEM_TO_GPU[system]
    per_node = gpus_per_node or default_per_node
    transport, bw = _bandwidth(transport, gpus, per_node, measured, measured_pick)
    t1 = time.perf_counter()
    rows = adapter.search(aic_model, system, gpus, isl, osl, ttft_ms, tpot_ms)
    t2 = time.perf_counter()
    raw = [c for mode, records in rows.items() for row in records
           if (c := candidate(mode, row, gpus, spec.is_moe)) is not None]
    if not raw:
        raise SizingError(f"aiconfigurator returned no configuration of {spec.name} on {gpus} x {system}")
    ranked = _rank(raw, spec, isl, ttft_ms, tpot_ms, bw.gbps)
    result = SizeResult(model=spec, model_arg=model, aic_model=aic_model, system=system, gpus=gpus, isl=isl,
                        osl=osl, ttft_ms=ttft_ms, tpot_ms=tpot_ms, bandwidth=bw, transport=transport,
                        candidates=ranked, best_overall=ranked[0])
    if support_note:
        result.notes.append(support_note)
    result.rank_changes = _rank_changes(result)
    ok = [c for c in ranked if result.meets(c)]
    ok_disagg = [c for c in ok if c.mode == "disagg"]
    if not ok_disagg:
        raise _impossible_sla(result, ok)
    chosen = _choose(result, ok_disagg, gpu=gpu, per_node=per_node, name=name, output=output)
    result.notes += _choice_notes(result, chosen, ok[0])
    t3 = time.perf_counter()
    result.timings_s = {"total": round(t3 - ti, 3), "aiconfigurator_import": round(t0 - ti, 3),
                        "aiconfigurator_search": round(t2 - t1, 3),
                        "tk_overhead": round((t3 - t0) - (t2 - t1), 3)}
    return result


def _role_shape(role, instances: int, batch: int) -> RoleShape:
    """A plan role as aiconfigurator's parallel sizes (attention DP: tp 1, dp = TensorRT-LLM's tp)."""
    ep = role.ep or 1  # moe_expert_parallel_size (MoE models), None for a dense one
    dp = role.tp if role.attention_dp else 1
    return RoleShape(workers=instances, tp=1 if role.attention_dp else role.tp, pp=role.pp, dp=dp,
                     moe_tp=max(1, role.tp // ep), moe_ep=ep, batch=batch)


def kv_cache_dtype(plan) -> str:
    """The KV cache dtype the plan's servers use: kv_transfer.dtype, with "auto" resolved as TensorRT-LLM does for
    a checkpoint that declares no KV quantization (the model's dtype, 2 bytes, as tk's plan counts it)."""
    if plan.kv_transfer.dtype != "auto":
        return plan.kv_transfer.dtype
    from toolkit.facts.models import quant_name

    own = quant_name(plan.model.dtype)
    return own if own in ("bfloat16", "float16") else "bfloat16"


@dataclass(frozen=True)
class _Basis:
    """What a prediction of a plan is estimated with: aiconfigurator's model and system, ISL and OSL, the recipe's
    quantization and the KV cache dtype the plan resolved."""

    plan: Any
    adapter: Any
    aic_model: str
    system: str
    support_note: str | None
    isl: int
    osl: int
    quant: str | None
    kv_dtype: str

    @property
    def common(self) -> dict:
        return dict(is_moe=self.plan.model.is_moe, quantization=self.quant, kv_dtype=self.kv_dtype)

    def head(self) -> dict:
        return {"recipe": self.plan.name, "mode": self.plan.mode, "aiconfigurator": aic.PINNED,
                "aiconfigurator_model": self.aic_model, "system": self.system, "isl": self.isl, "osl": self.osl}

    def role_doc(self, role, shape: RoleShape) -> dict:
        doc = {"instances": shape.workers, "tp": role.tp, "pp": role.pp, "batch": shape.batch}
        if self.plan.model.is_moe:
            doc.update({"attention_dp": role.attention_dp, "ep": shape.moe_ep, "moe_tp": shape.moe_tp,
                        "layout": shape.layout(True)})
        return doc

    def not_modelled(self, raw: dict, options: dict) -> list[str]:
        """What the recipe uses that the estimate leaves out."""
        out = []
        if "speculative_config" in options:
            out.append("MTP speculative decoding (estimated without it)")
        if self.plan.traffic.prefix_len:
            out.append(f"prefix reuse ({self.plan.traffic.prefix_len} tokens)")
        if self.quant and self.quant not in aic.QUANT_MODES:
            out.append(f"quantization {self.quant!r} (estimated as the checkpoint's own)")
        if self.kv_dtype not in aic.KV_MODES:
            out.append(f"KV cache {self.kv_dtype} (aiconfigurator {aic.PINNED} has no such KV mode: it picked its own)")
        if raw.get("fmha_fallback"):
            out.append(raw["fmha_fallback"])
        return out


def _estimated(raw: dict) -> tuple[float, float]:
    """aiconfigurator's (TTFT, TPOT) in ms; SizingError where it gave no finite figures."""
    ttft, tpot = raw.get("ttft"), raw.get("tpot")
    if not isinstance(ttft, (int, float)) or not isinstance(tpot, (int, float)) \
            or not (math.isfinite(ttft) and math.isfinite(tpot)):
        raise SizingError(f"aiconfigurator gave no TTFT/TPOT estimate for this configuration "
                          f"({sorted(raw)[:12]}); nothing is predicted")
    return float(ttft), float(tpot)


def _predict_aggregated(b: _Basis) -> dict:
    """One aggregated server of the role's sizes with its max_batch_size and its max_num_tokens as the prompt
    tokens per step, times its instances; no KV moves."""
    agg = b.plan.aggregated
    instances = len(agg.instances)
    mnt = int(agg.llm_api_options.get("max_num_tokens") or b.isl)
    shape = _role_shape(agg, instances, int(agg.llm_api_options.get("max_batch_size") or 1))
    raw = b.adapter.estimate_agg(b.aic_model, b.system, isl=b.isl, osl=b.osl, server=shape, ctx_tokens=mnt, **b.common)
    ttft, tpot = _estimated(raw)
    per_server = raw.get("num_total_gpus")
    concurrency = raw.get("concurrency")
    return {
        **b.head(),
        "aggregated": b.role_doc(agg, shape),
        "prompt_tokens_per_step": mnt,  # max_num_tokens: aiconfigurator's ctx_tokens
        "ttft_ms": round(ttft, 3), "transfer_ms": 0.0, "ttft_total_ms": round(ttft, 3),
        "tpot_ms": tpot, "tokens_s_gpu": raw.get("tokens/s/gpu"), "tokens_s_user": raw.get("tokens/s/user"),
        "concurrency": concurrency * instances if isinstance(concurrency, (int, float)) else None,
        "request_latency_ms": raw.get("request_latency"),
        "gpus": per_server * instances if isinstance(per_server, int) else None,
        "gemm": raw.get("gemm"), "moe": raw.get("moe"), "kvcache": raw.get("kvcache"),
        "kv_cache_dtype": {"recipe": b.plan.kv_transfer.dtype, "estimated_as": b.kv_dtype},
        "aiconfigurator_memory_gib": {"aggregated": raw.get("memory")},
        "aiconfigurator_trtllm_version": raw.get("version"), "kv_cache_warning": raw.get("kv_cache_warning"),
        "support_note": b.support_note,
        "transfer": None,  # aggregated serving moves no KV between servers
        "not_modelled": b.not_modelled(raw, agg.llm_api_options) + ["free_gpu_memory_fraction"],
    }


def _predict_disaggregated(b: _Basis) -> dict:
    """Context and generation instances at their batches, plus tk's transfer term at the transport's nominal
    bandwidth."""
    ctx, gen = b.plan.context, b.plan.generation
    # A context server batches as many whole prompts as its max_num_tokens holds (TensorRT-LLM's token budget
    # per step), at most max_batch_size: the prefill batch aiconfigurator should model.
    ctx_max_bs = int(ctx.llm_api_options.get("max_batch_size") or 1)
    ctx_tokens = ctx.llm_api_options.get("max_num_tokens")
    ctx_bs = max(1, min(ctx_max_bs, int(ctx_tokens) // b.isl)) if ctx_tokens else ctx_max_bs
    gen_bs = int(gen.llm_api_options.get("max_batch_size") or 1)
    c_shape = _role_shape(ctx, len(ctx.instances), ctx_bs)
    g_shape = _role_shape(gen, len(gen.instances), gen_bs)
    raw = b.adapter.estimate_disagg(b.aic_model, b.system, isl=b.isl, osl=b.osl, ctx=c_shape, gen=g_shape,
                                    **b.common)
    ttft, tpot = _estimated(raw)
    nbytes = b.plan.kv.ctx_bytes_per_token_per_rank
    gbps = b.plan.kv_transfer.transport.nominal_gbps
    xfer = transfer.transfer_ms(nbytes, b.isl, gbps)
    return {
        **b.head(),
        "context": b.role_doc(ctx, c_shape),
        "context_batch_basis": f"min(max_batch_size {ctx_max_bs}, max_num_tokens {ctx_tokens} // ISL {b.isl}), at "
                               "least 1" if ctx_tokens else f"max_batch_size {ctx_max_bs}",
        "generation": b.role_doc(gen, g_shape),
        "ttft_ms": round(ttft, 3), "transfer_ms": round(xfer, 3), "ttft_total_ms": round(ttft + xfer, 3),
        "tpot_ms": tpot, "tokens_s_gpu": raw.get("tokens/s/gpu"), "tokens_s_user": raw.get("tokens/s/user"),
        "concurrency": raw.get("concurrency"), "request_latency_ms": raw.get("request_latency"),
        "gpus": raw.get("num_total_gpus"), "gemm": raw.get("(p)gemm"), "moe": raw.get("(p)moe"),
        "kvcache": raw.get("(p)kvcache"),
        "kv_cache_dtype": {"recipe": b.plan.kv_transfer.dtype, "estimated_as": b.kv_dtype},
        "aiconfigurator_memory_gib": {"context": raw.get("(p)memory"), "generation": raw.get("(d)memory")},
        "aiconfigurator_trtllm_version": raw.get("(p)version"), "kv_cache_warning": raw.get("kv_cache_warning"),
        "support_note": b.support_note,
        "transfer": {"bytes_per_token_per_ctx_rank": nbytes, "isl": b.isl, "gbps": gbps,
                     "transport": b.plan.kv_transfer.transport.name, "source": "nominal"},
        "not_modelled": b.not_modelled(raw, ctx.llm_api_options) + ["max_num_tokens chunking",
                                                                    "free_gpu_memory_fraction"],
    }


def predict(plan, adapter=None) -> dict:
    """aiconfigurator's estimate for an existing plan's exact configuration, plus tk's transfer term.

    A disaggregated plan (cli_estimate mode "disagg"): context and generation instances x TP x PP, attention DP
    (aiconfigurator's dp; its tp is then 1), MoE TP x EP (TensorRT-LLM's moe_tp = tp // ep); the generation batch
    is its max_batch_size (per attention-DP rank; the estimate assumes every server runs full), the context batch
    the whole prompts its max_num_tokens holds (at most max_batch_size). An aggregated plan (``tk plan
    --aggregated``: mode "agg"): one aggregated server of the same sizes with its max_batch_size and its
    max_num_tokens as the prompt tokens per step, times its instances; no KV moves, so no transfer term. Both:
    ISL (traffic.typical_input_len, else max_input_len), OSL (max_output_len), the recipe's quantization (fp8,
    fp8_block, nvfp4, mxfp4; else the checkpoint's) and the KV cache dtype the plan resolved (kv_cache_dtype:
    "auto" is the model's dtype, as TensorRT-LLM keeps it). Not modelled (listed in ``not_modelled`` when the
    recipe uses them): MTP speculative decoding (aiconfigurator needs the accepted draft length, which only a run
    measures), prefix reuse, max_num_tokens chunking (disaggregated), and the KV memory fraction."""
    adapter = adapter or aic
    system = adapter.GPU_TO_SYSTEM.get(plan.gpu)
    if system is None:
        raise SizingError(f"aiconfigurator has no system for GPU {plan.gpu}; tk maps: "
                          f"{', '.join(f'{g} -> {s}' for g, s in adapter.GPU_TO_SYSTEM.items())}")
    adapter.check_system(system)
    aic_model, architecture = adapter.model_path_for(plan.model)
    support_note = adapter.check_support(aic_model, system, architecture)
    from toolkit.facts.models import quant_name

    basis = _Basis(plan=plan, adapter=adapter, aic_model=aic_model, system=system, support_note=support_note,
                   isl=plan.traffic.typical_input_len or plan.traffic.max_input_len, osl=plan.traffic.max_output_len,
                   quant=quant_name(plan.quantization) or plan.quantization, kv_dtype=kv_cache_dtype(plan))
    return _predict_aggregated(basis) if plan.is_aggregated else _predict_disaggregated(basis)
