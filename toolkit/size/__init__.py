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
            "transfer_term": "ttft_total_ms = ttft_ms + bytes_per_token_per_ctx_rank * isl / (gbps * 1e9) * 1e3",
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
    for what, value, low, high in (("gpus", gpus, 1, 4096), ("isl", isl, 1, 1 << 21), ("osl", osl, 1, 1 << 21),
                                   ("ttft", ttft_ms, 0.001, 3.6e6), ("tpot", tpot_ms, 0.001, 3.6e6)):
        try:
            bounds.finite(f"--{what}", value, low, high)
        except bounds.BoundError as exc:
            raise SizingError(str(exc)) from None
    ti = time.perf_counter()
    adapter._import()  # aiconfigurator's own import (about a second), which a bare aiconfigurator run pays too
    t0 = time.perf_counter()
    try:
        spec = resolve_model(model)
    except ModelError as exc:
        raise SizingError(str(exc)) from None
    context = spec.max_position_embeddings
    if context and isl + osl > context:  # what tk's plan refuses too (traffic.max_input_len, toolkit/plan/rules.py)
        where = f"{spec.source}: max_position_embeddings" if spec.source != "built-in" else \
            "max_position_embeddings of the checkpoint"
        raise SizingError(f"--isl {isl} + --osl {osl} = {isl + osl} tokens exceeds {spec.name}'s {context}-token "
                          f"context ({where}), whatever the GPUs. Fix: lower --isl or --osl so they sum to at most "
                          f"{context}")
    adapter.check_system(system)
    aic_model, architecture = adapter.model_path_for(spec)
    support_note = adapter.check_support(aic_model, system, architecture)
    gpu, default_per_node = adapter.SYSTEM_TO_GPU[system]
    per_node = gpus_per_node or default_per_node
    if transport is None:
        transport = "nvlink-single-node" if gpus <= per_node else "infiniband"
    if transport not in TRANSPORT_PROFILES:
        raise SizingError(f"unknown transport {transport!r}; tk knows: {', '.join(TRANSPORT_PROFILES)}")
    if measured:
        try:
            bw = transfer.measured(measured, measured_pick)
        except transfer.MeasuredError as exc:
            raise SizingError(str(exc)) from None
    else:
        bw = transfer.nominal(transport)
    t1 = time.perf_counter()
    rows = adapter.search(aic_model, system, gpus, isl, osl, ttft_ms, tpot_ms)
    t2 = time.perf_counter()
    raw = [c for mode, records in rows.items() for row in records
           if (c := candidate(mode, row, gpus, spec.is_moe)) is not None]
    if not raw:
        raise SizingError(f"aiconfigurator returned no configuration of {spec.name} on {gpus} x {system}")
    before = _order(raw, ttft_ms, tpot_ms, with_transfer=False)
    aic_rank = {id(c): i + 1 for i, c in enumerate(before)}
    raw = [replace(c, aic_rank=aic_rank[id(c)]) for c in raw]
    ranked = _order(add_transfer(raw, spec, isl, bw.gbps), ttft_ms, tpot_ms, with_transfer=True)
    result = SizeResult(model=spec, model_arg=model, aic_model=aic_model, system=system, gpus=gpus, isl=isl,
                        osl=osl, ttft_ms=ttft_ms, tpot_ms=tpot_ms, bandwidth=bw, transport=transport,
                        candidates=ranked)
    if support_note:
        result.notes.append(support_note)
    for i, c in enumerate(ranked):
        if c.aic_rank != i + 1:
            result.rank_changes.append({"shape": c.shape(), "mode": c.mode, "aiconfigurator_rank": c.aic_rank,
                                        "tk_rank": i + 1, "transfer_ms": c.transfer_ms,
                                        "meets_sla_without_transfer": c.ttft_ms <= ttft_ms and c.tpot_ms <= tpot_ms,
                                        "meets_sla": result.meets(c)})
    result.best_overall = ranked[0]
    ok = [c for c in ranked if result.meets(c)]
    ok_disagg = [c for c in ok if c.mode == "disagg"]
    if not ok_disagg:
        best = ranked[0]
        why = ("no candidate meets the SLA" if not ok else
               f"only aggregated candidates meet the SLA (best: {ok[0].shape()}, "
               f"{ok[0].tokens_s_gpu:.1f} tokens/s/GPU),"
               " and tk size writes disaggregated recipes")
        disagg = [c for c in ranked if c.mode == "disagg"]
        closest = min(disagg or ranked, key=lambda c: max(c.ttft_total_ms / ttft_ms, c.tpot_ms / tpot_ms))
        raise SizingError(
            f"impossible SLA (TTFT <= {ttft_ms:g} ms, TPOT <= {tpot_ms:g} ms) for {spec.name} on {gpus} x {system}, "
            f"ISL {isl} / OSL {osl}: {why}. Closest: {closest.shape()}: TTFT {closest.ttft_total_ms:.1f} ms "
            f"(transfer {closest.transfer_ms:.1f} ms), TPOT {closest.tpot_ms:.1f} ms, "
            f"{closest.tokens_s_gpu:.1f} tokens/s/GPU; "
            f"{'best SLA-meeting' if result.meets(best) else 'first ranked'} {best.shape()}: TTFT "
            f"{best.ttft_total_ms:.1f} ms, TPOT {best.tpot_ms:.1f} ms, {best.tokens_s_gpu:.1f} tokens/s/GPU")
    from toolkit.size.recipe import recheck, write_recipe

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
    if result.chosen is not None:
        result.chosen = result.candidates[ranked.index(result.chosen)]
    else:
        tried = [c for c in result.candidates if c.rejected]
        raise SizingError(
            f"none of the {len(ok_disagg)} SLA-meeting disaggregated candidates is one tk can deploy (the best "
            f"{len(tried)} checked): " + "; ".join(f"{c.shape()}: {c.rejected}" for c in tried[:3])
            + ". Fix: more GPUs (--gpus), a GPU with more memory, or a looser SLA")
    if ok[0].mode == "agg":
        gain = ok[0].tokens_s_gpu / result.chosen.tokens_s_gpu - 1 if result.chosen.tokens_s_gpu else math.inf
        result.notes.append(f"aggregated serving ({ok[0].shape()}) is predicted {gain:.0%} more tokens/s/GPU than "
                            f"the best disaggregated candidate (tk launch --aggregated deploys it on the same GPUs); "
                            f"the recipe is the best disaggregated one")
    skipped = [c for c in result.candidates if c.rejected and result.meets(c)]
    if skipped:
        result.notes.append(f"{len(skipped)} better-ranked candidate(s) skipped: " +
                            "; ".join(f"{c.shape()} ({c.rejected})" for c in skipped[:3]))
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
    isl = plan.traffic.typical_input_len or plan.traffic.max_input_len
    osl = plan.traffic.max_output_len
    from toolkit.facts.models import quant_name

    quant = quant_name(plan.quantization) or plan.quantization
    kv_dtype = kv_cache_dtype(plan)
    common = dict(is_moe=plan.model.is_moe, quantization=quant, kv_dtype=kv_dtype)

    def role_doc(role, shape: RoleShape) -> dict:
        doc = {"instances": shape.workers, "tp": role.tp, "pp": role.pp, "batch": shape.batch}
        if plan.model.is_moe:
            doc.update({"attention_dp": role.attention_dp, "ep": shape.moe_ep, "moe_tp": shape.moe_tp,
                        "layout": shape.layout(True)})
        return doc

    def not_modelled(raw: dict, options: dict) -> list[str]:
        out = []
        if "speculative_config" in options:
            out.append("MTP speculative decoding (estimated without it)")
        if plan.traffic.prefix_len:
            out.append(f"prefix reuse ({plan.traffic.prefix_len} tokens)")
        if quant and quant not in aic.QUANT_MODES:
            out.append(f"quantization {quant!r} (estimated as the checkpoint's own)")
        if kv_dtype not in aic.KV_MODES:
            out.append(f"KV cache {kv_dtype} (aiconfigurator {aic.PINNED} has no such KV mode: it picked its own)")
        if raw.get("fmha_fallback"):
            out.append(raw["fmha_fallback"])
        return out

    def estimated(raw: dict) -> tuple[float, float]:
        ttft, tpot = raw.get("ttft"), raw.get("tpot")
        if not isinstance(ttft, (int, float)) or not isinstance(tpot, (int, float)) \
                or not (math.isfinite(ttft) and math.isfinite(tpot)):
            raise SizingError(f"aiconfigurator gave no TTFT/TPOT estimate for this configuration "
                              f"({sorted(raw)[:12]}); nothing is predicted")
        return float(ttft), float(tpot)

    head = {"recipe": plan.name, "mode": plan.mode, "aiconfigurator": aic.PINNED, "aiconfigurator_model": aic_model,
            "system": system, "isl": isl, "osl": osl}
    if plan.is_aggregated:
        agg = plan.aggregated
        instances = len(agg.instances)
        mnt = int(agg.llm_api_options.get("max_num_tokens") or isl)
        shape = _role_shape(agg, instances, int(agg.llm_api_options.get("max_batch_size") or 1))
        raw = adapter.estimate_agg(aic_model, system, isl=isl, osl=osl, server=shape, ctx_tokens=mnt, **common)
        ttft, tpot = estimated(raw)
        per_server = raw.get("num_total_gpus")
        concurrency = raw.get("concurrency")
        return {
            **head,
            "aggregated": role_doc(agg, shape),
            "prompt_tokens_per_step": mnt,  # max_num_tokens: aiconfigurator's ctx_tokens
            "ttft_ms": round(ttft, 3), "transfer_ms": 0.0, "ttft_total_ms": round(ttft, 3),
            "tpot_ms": tpot, "tokens_s_gpu": raw.get("tokens/s/gpu"), "tokens_s_user": raw.get("tokens/s/user"),
            "concurrency": concurrency * instances if isinstance(concurrency, (int, float)) else None,
            "request_latency_ms": raw.get("request_latency"),
            "gpus": per_server * instances if isinstance(per_server, int) else None,
            "gemm": raw.get("gemm"), "moe": raw.get("moe"), "kvcache": raw.get("kvcache"),
            "kv_cache_dtype": {"recipe": plan.kv_transfer.dtype, "estimated_as": kv_dtype},
            "aiconfigurator_memory_gib": {"aggregated": raw.get("memory")},
            "aiconfigurator_trtllm_version": raw.get("version"), "kv_cache_warning": raw.get("kv_cache_warning"),
            "support_note": support_note,
            "transfer": None,  # aggregated serving moves no KV between servers
            "not_modelled": not_modelled(raw, agg.llm_api_options) + ["free_gpu_memory_fraction"],
        }

    ctx, gen = plan.context, plan.generation
    # A context server batches as many whole prompts as its max_num_tokens holds (TensorRT-LLM's token budget
    # per step), at most max_batch_size: the prefill batch aiconfigurator should model.
    ctx_max_bs = int(ctx.llm_api_options.get("max_batch_size") or 1)
    ctx_tokens = ctx.llm_api_options.get("max_num_tokens")
    ctx_bs = max(1, min(ctx_max_bs, int(ctx_tokens) // isl)) if ctx_tokens else ctx_max_bs
    gen_bs = int(gen.llm_api_options.get("max_batch_size") or 1)
    c_shape = _role_shape(ctx, len(ctx.instances), ctx_bs)
    g_shape = _role_shape(gen, len(gen.instances), gen_bs)
    raw = adapter.estimate_disagg(aic_model, system, isl=isl, osl=osl, ctx=c_shape, gen=g_shape, **common)
    ttft, tpot = estimated(raw)
    nbytes = plan.kv.ctx_bytes_per_token_per_rank
    gbps = plan.kv_transfer.transport.nominal_gbps
    xfer = transfer.transfer_ms(nbytes, isl, gbps)
    return {
        **head,
        "context": role_doc(ctx, c_shape),
        "context_batch_basis": f"min(max_batch_size {ctx_max_bs}, max_num_tokens {ctx_tokens} // ISL {isl}), at least 1"
                               if ctx_tokens else f"max_batch_size {ctx_max_bs}",
        "generation": role_doc(gen, g_shape),
        "ttft_ms": round(ttft, 3), "transfer_ms": round(xfer, 3), "ttft_total_ms": round(ttft + xfer, 3),
        "tpot_ms": tpot, "tokens_s_gpu": raw.get("tokens/s/gpu"), "tokens_s_user": raw.get("tokens/s/user"),
        "concurrency": raw.get("concurrency"), "request_latency_ms": raw.get("request_latency"),
        "gpus": raw.get("num_total_gpus"), "gemm": raw.get("(p)gemm"), "moe": raw.get("(p)moe"),
        "kvcache": raw.get("(p)kvcache"),
        "kv_cache_dtype": {"recipe": plan.kv_transfer.dtype, "estimated_as": kv_dtype},
        "aiconfigurator_memory_gib": {"context": raw.get("(p)memory"), "generation": raw.get("(d)memory")},
        "aiconfigurator_trtllm_version": raw.get("(p)version"), "kv_cache_warning": raw.get("kv_cache_warning"),
        "support_note": support_note,
        "transfer": {"bytes_per_token_per_ctx_rank": nbytes, "isl": isl, "gbps": gbps,
                     "transport": plan.kv_transfer.transport.name, "source": "nominal"},
        "not_modelled": not_modelled(raw, ctx.llm_api_options) + ["max_num_tokens chunking",
                                                                  "free_gpu_memory_fraction"],
    }
