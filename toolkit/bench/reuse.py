"""Multi-turn reuse in a bench: the per-turn table, the reuse findings and the pull-back projection of one cell.

Reads what the servers reported per request (aiperf's records: usage prompt_tokens, completion_tokens,
prompt_tokens_details.cached_tokens) and per server (``ServerCounts``: the workers' own KV-cache counters and
iteration stats, read before and after the cell), the plan's settings (routers, instances, block reuse, events,
conditional disaggregation, KV bytes, estimates) and a validation report's reverse bandwidth.

The findings are a stage of their own, ``reuse``: they explain a result and never change the exit code (a
deployment that reuses little is a valid measurement of that deployment).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from toolkit.bench import multiturn as MT
from toolkit.bench.pullback import Bandwidth, projection
from toolkit.bench.verdict import Check, Stage
from toolkit.facts.trtllm import Router

STAGE = Stage.REUSE


@dataclass(frozen=True)
class ReuseSetting:
    """What the deployment does about reuse (from its plan)."""

    context_router: str
    generation_router: str
    context_servers: int
    generation_servers: int
    context_block_reuse: bool
    context_events: bool
    conditional: int | None
    line: str
    aggregated: bool = False

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def setting_of(plan) -> ReuseSetting | None:
    if plan is None:
        return None
    if plan.mode == "aggregated":
        role = plan.aggregated
        kvc = (role.llm_api_options.get("kv_cache_config") or {}) if role else {}
        return ReuseSetting("-", "-", 0, len(role.instances) if role else 0, kvc.get("enable_block_reuse", True),
                            False, None, plan.trtllm_version, aggregated=True)
    cfg = plan.proxy.config if plan.proxy else {}
    kvc = plan.context.llm_api_options.get("kv_cache_config") or {}
    cond = (cfg.get("conditional_disagg_config") or {}).get("max_local_prefill_length")
    return ReuseSetting(
        context_router=((cfg.get("context_servers") or {}).get("router") or {}).get("type", Router.ROUND_ROBIN.value),
        generation_router=((cfg.get("generation_servers") or {}).get("router") or {}).get("type", Router.ROUND_ROBIN.value),
        context_servers=len(plan.context.instances), generation_servers=len(plan.generation.instances),
        context_block_reuse=bool(kvc.get("enable_block_reuse", True)),
        context_events=bool(kvc.get("event_buffer_max_size", 0)), conditional=cond, line=plan.trtllm_version)


@dataclass
class ServerCounts:
    """The servers' own counters over a cell: per server, KV-cache figures (the stand-in's ``kv_cache`` section of
    /standin/stats, or TensorRT-LLM's kvCacheStats in /metrics) and the context iterations' prefill rate."""

    per_server: dict = field(default_factory=dict)
    routers: dict = field(default_factory=dict)  # the proxy's router counters (the stand-in's /standin/stats)
    ctx_tokens: int = 0  # prefill tokens in context-only iterations of the context servers
    ctx_ms: float = 0.0  # ... and their iteration time

    def to_dict(self) -> dict:
        return {"per_server": self.per_server, "routers": self.routers, "ctx_prefill_tokens": self.ctx_tokens,
                "ctx_prefill_ms": round(self.ctx_ms, 3)}

    @property
    def evicted_blocks(self) -> int:
        return sum(int(v.get("evicted_blocks") or 0) for v in self.per_server.values())

    @property
    def pool_full(self) -> bool:
        return any(v.get("min_free_blocks") == 0 for v in self.per_server.values())


def server_counts(before: dict, after: dict) -> ServerCounts:
    """Pure: two snapshots of ``toolkit.bench.reuseprobe`` -> what happened in between. Counted per server
    lifetime: a server restarted in between (its ``instance`` changed) counts from 0, is marked ``restarted``, and
    no count goes below 0."""
    out = ServerCounts()
    for name, a in after.get("workers", {}).items():
        b = before.get("workers", {}).get(name, {})
        entry: dict = {}
        restarted = "instance" in a and a.get("instance") != b.get("instance")
        kc_a = a.get("kv_cache") or {}
        kc_b = {} if restarted else (b.get("kv_cache") or {})
        if restarted:
            entry["restarted"] = True
        for key in ("lookups", "cached_tokens", "lookup_tokens", "evicted_blocks", "stored_blocks", "reused_blocks",
                    "missed_blocks", "events", "events_dropped", "over_capacity"):
            if isinstance(kc_a.get(key), (int, float)):
                entry[key] = max(0, kc_a[key] - (kc_b.get(key) or 0))
        for key in ("capacity_blocks", "enable_block_reuse", "event_buffer_max_size"):
            if key in kc_a:
                entry[key] = kc_a[key]
        iters = a.get("metrics") or []
        frees = [it.get("kvCacheStats", {}).get("freeNumBlocks") for it in iters if isinstance(it, dict)]
        frees = [f for f in frees if isinstance(f, (int, float))]
        if frees:
            entry["min_free_blocks"] = min(frees)
        if name.startswith("ctx"):
            for it in iters:
                ib = it.get("inflightBatchingStats", {}) if isinstance(it, dict) else {}
                if ib.get("numCtxTokens") and not ib.get("numGenRequests"):
                    out.ctx_tokens += int(ib["numCtxTokens"])
                    out.ctx_ms += float(it.get("iterLatencyMS") or 0)
        out.per_server[name] = entry
    proxy_restarted = after.get("proxy_instance") != before.get("proxy_instance")
    for role, r in (after.get("routers") or {}).items():
        rb = {} if proxy_restarted else (before.get("routers") or {}).get(role, {})
        out.routers[role] = {k: (max(0, v - rb.get(k, 0)) if isinstance(v, (int, float)) and not isinstance(v, bool)
                                 else v) for k, v in r.items()}
    return out


def analyse(cell, res, *, plan=None, proof=None, counts: ServerCounts | None = None,
            bandwidth: Bandwidth | None = None, requests_in_run: int | None = None) -> tuple[dict, list[Check]]:
    """The multi-turn section of one cell and its reuse findings. requests_in_run: the requests of every cell the
    proof's transfer count covers (default: this cell's)."""
    reqs = MT.request_reuse(res.records)
    setting = setting_of(plan)
    reported = any(r.cached_tokens is not None for r in reqs)
    whole = MT.cached_is_whole_prompt(reqs)
    trusted = reported and not whole
    kv_bpt, kv_src, pre_ms, pre_src = _plan_figures(plan, counts)
    moved_share = None
    if proof is not None and getattr(proof, "available", False) and proof.kind != "aggregated":
        sent = requests_in_run or len(res.records)  # the proof counts the transfers of the whole run
        moved_share = min(1.0, proof.kv_transfers / sent) if sent else None
    turns = [t.to_dict() for t in MT.turn_table(reqs, cached_trusted=trusted, kv_bytes_per_token=kv_bpt,
                                                kv_moved_share=moved_share)]
    share = MT.reuse_share(reqs) if trusted else None
    doc = {"turns": turns, "sessions": len({r.session for r in reqs}), "requests": len(reqs),
           "cached_tokens_reported": reported, "cached_tokens_trusted": trusted, "reuse_share": share,
           "setting": setting.to_dict() if setting else None,
           "servers": counts.to_dict() if counts else None,
           "kv_bytes_moved_note": ("computed, per context rank: mean prompt tokens x the plan's KV bytes per token on "
                                   "one context rank x the share of the run's requests whose KV moved (the servers' "
                                   "transfer count)")}
    if trusted and pre_ms is not None and kv_bpt is not None and bandwidth is not None:
        doc["pullback_projection"] = projection(turns, prefill_ms_per_token=pre_ms, prefill_source=pre_src,
                                                kv_bytes_per_token=kv_bpt, kv_source=kv_src, bandwidth=bandwidth)
    else:
        why = ("the servers' cached_tokens are unusable" if not trusted else
               "no plan (prefill rate, KV bytes per token)" if kv_bpt is None or pre_ms is None else
               "no bandwidth")
        doc["pullback_projection"] = {"label": "projection", "summary": f"not projected: {why}", "turns": [],
                                      "inputs": {}}
    return doc, _checks(cell, reqs, doc, setting, counts, proof, reported, whole, share)


def _plan_figures(plan, counts):
    """KV bytes per token per rank and prefill ms per token: the plan's (the emulated model's with emulated
    timing), the prefill rate measured on the context servers' iterations where they ran any."""
    if plan is None:
        return None, "", None, ""
    est = plan.estimates
    tokens = plan.kv.largest_request_tokens or 1
    kv_bpt = est.largest_request_transfer_ms / 1e3 * est.nominal_gbps * 1e9 / tokens
    kv_src = f"the plan's KV transfer estimate ({est.largest_request_transfer_ms:g} ms for {tokens} tokens at " \
             f"{est.nominal_gbps:g} GB/s): bytes per token on one context rank"
    if counts is not None and counts.ctx_tokens >= 64 and counts.ctx_ms > 0:
        return kv_bpt, kv_src, counts.ctx_ms / counts.ctx_tokens, (
            f"measured: {counts.ctx_tokens} tokens in {counts.ctx_ms:.1f} ms of the context servers' prefill "
            f"iterations (their /metrics iteration stats{'; emulated timing' if 'emulated' in plan.engine.label else ''})")
    return kv_bpt, kv_src, est.largest_request_prefill_ms / tokens, (
        f"the plan's prefill estimate ({est.largest_request_prefill_ms:g} ms for {tokens} tokens, "
        f"{est.prefill_efficiency:g} of {est.gpu_peak_tflops:g} TFLOP/s)")


def _checks(cell, reqs, doc, setting: ReuseSetting | None, counts, proof, reported, whole, share) -> list[Check]:
    checks = []
    name = cell.name
    if not reported:
        checks.append(Check("cached_tokens_reported", STAGE, False,
                            "the server reported no usage.prompt_tokens_details.cached_tokens: reuse per turn is "
                            "unknown (TensorRT-LLM reports it by default; another engine may need a flag)", name))
        return checks
    if whole:
        checks.append(Check("cached_tokens_meaningful", STAGE, False,
                            "first turns report the whole prompt as cached: that is the generation worker's count "
                            "(its KV arrived by transfer), which TensorRT-LLM's disaggregated server passed on before "
                            "PR #13620 (2026-04); per-turn reuse is taken from the servers' own counters instead",
                            name, {"line": setting.line if setting else None}))
    checks.append(_prefix_check(name, reqs))
    checks.append(_roundtrip_check(name, reqs, proof, setting, whole))
    if share is None and not whole:
        return checks
    if whole:
        ctx = [v for k, v in (counts.per_server if counts else {}).items() if k.startswith("ctx")]
        counted = [v["cached_tokens"] for v in ctx if "cached_tokens" in v]
        reusable = sum(r.reusable_tokens for r in reqs)
        if not counted or not reusable:  # a real TensorRT-LLM exposes no such counter: unknown, not 0 %
            checks.append(Check("reuse_vs_theoretical", STAGE, True,
                                "not judged: the requests' cached_tokens are the generation worker's count and the "
                                "context servers expose no reuse counter to take it from", name, skipped=True))
            return checks
        share = sum(counted) / reusable
    numbers = {"reuse_share": round(share, 4), "floor": MT.REUSE_FLOOR}
    if share >= MT.REUSE_FLOOR:
        checks.append(Check("reuse_vs_theoretical", STAGE, True,
                            f"{100 * share:.1f} % of the resent history was reused (later turns)", name, numbers))
        return checks
    causes = _causes(setting, counts)
    checks.append(Check("reuse_vs_theoretical", STAGE, False,
                        f"only {100 * share:.1f} % of the resent history was reused (later turns; theoretical "
                        f"100 %): " + ("; ".join(causes) if causes else "cause not identified"), name,
                        {**numbers, "causes": causes}))
    return checks


def _causes(setting: ReuseSetting | None, counts: ServerCounts | None) -> list[str]:
    causes = []
    restarted = sorted(k for k, v in (counts.per_server if counts else {}).items() if v.get("restarted"))
    if restarted:
        causes.append(f"restart: {', '.join(restarted)} restarted during the cell and lost its cached blocks")
    if counts is not None and (counts.evicted_blocks or counts.pool_full):
        causes.append(f"eviction: the servers evicted {counts.evicted_blocks} KV blocks"
                      + (" and their KV pool ran full" if counts.pool_full else "")
                      + " (a larger pool: free_gpu_memory_fraction, fewer conversations per server)")
    if setting is None:
        return causes
    if not setting.aggregated and not setting.context_block_reuse:
        causes.append("block reuse is off on the context servers (kv_cache_config.enable_block_reuse: false)")
    if not setting.aggregated and setting.context_servers > 1:
        router = setting.context_router
        if router in (Router.ROUND_ROBIN, Router.LOAD_BALANCING):
            causes.append(f"the context router ({router}) does not keep a conversation on the context server that "
                          f"holds its history ({setting.context_servers} context servers)")
        elif router == Router.KV_CACHE_AWARE:
            blind = (counts.routers.get("context") or {}).get("matches_all_zero") if counts else None
            routed = (counts.routers.get("context") or {}).get("routed") if counts else None
            evidence = (f": {blind} of {routed} routing decisions saw no cached block anywhere" if blind else "")
            causes.append("router fallback (TensorRT-LLM #14882): the kv_cache_aware router learns which blocks a "
                          "server holds only from its /kv_cache_events, polled when a request finishes; with "
                          "kv_cache_config.event_buffer_max_size 0 (the default) it routes by load alone, "
                          f"silently{evidence}" + ("" if setting.context_events else
                                                   " (the context servers' event_buffer_max_size is 0)"))
    return causes


def _prefix_check(name, reqs) -> Check:
    later = [r for r in reqs if r.reusable_tokens]
    bad = [r for r in later if not r.history_is_prefix]
    return Check("history_resent", STAGE, not bad,
                 (f"{len(bad)} of {len(later)} later turns are shorter than the previous turn's prompt plus answer: "
                  f"the chat template does not resend the history verbatim, so the reuse figures are upper bounds")
                 if bad else f"every later turn resends its history ({len(later)} requests)", name,
                 {"later_turns": len(later), "not_prefix": len(bad)})


def _roundtrip_check(name, reqs, proof, setting, whole: bool = False) -> Check:
    """inference-perf #649: an answer resent as text must re-tokenize to the generated ids, or no server can ever
    reuse its KV. Seen two ways: by count (aiperf's tokenizer counts the answer's text, the server counted the
    generated tokens) and by reuse (where a server that generated an answer prefilled the next turn, nothing of
    that answer was reused)."""
    pairs = [r for r in reqs if r.answer_retokenized is not None and r.answer_generated is not None]
    off = [r for r in pairs if r.answer_retokenized != r.answer_generated]
    if off:
        r = off[0]
        return Check("answers_round_trip", STAGE, False,
                     f"{len(off)} of {len(pairs)} answers re-tokenize to another number of tokens than were "
                     f"generated (e.g. {r.answer_retokenized} for {r.answer_generated}): an answer resent as text "
                     f"is not its generated ids, so its KV can never be reused (inference-perf #649)", name,
                     {"answers": len(pairs), "mismatched": len(off)})
    local = (proof.local_prefill if proof is not None and getattr(proof, "available", False) else 0) or 0
    could = local or (setting is not None and setting.aggregated)
    # (whole-prompt counts say nothing about which tokens were reused: judged by count only)
    later = [] if whole else [r for r in reqs if r.reusable_answer_tokens and r.cached_tokens is not None]
    if could and later:
        into = [r for r in later if r.cached_tokens > r.reusable_tokens - r.answer_generated]
        if not into:
            where = ("the deployment is aggregated" if not local else
                     f"{local} requests were prefilled on the generation server that had generated those answers")
            return Check("answers_round_trip", STAGE, False,
                         f"no request reused any token of an earlier answer, although {where}: "
                         f"the answers resent as text do not re-tokenize to the generated ids (inference-perf #649)",
                         name, {"requests": len(later), "local_prefill": local})
    if not pairs and not (could and later):
        return Check("answers_round_trip", STAGE, True, "not judged: no answer's token counts to compare", name,
                     {"answers": 0}, skipped=True)
    return Check("answers_round_trip", STAGE, True,
                 f"{len(pairs)} answers re-tokenize to as many tokens as were generated", name,
                 {"answers": len(pairs)})
