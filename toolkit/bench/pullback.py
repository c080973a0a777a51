"""The pull-back projection: what moving the previous answers' KV back from the generation to the context server
would save per turn, instead of recomputing it. Pure, except ``reverse_bandwidth`` (reads a validation report).

TensorRT-LLM has no such transfer (PR #18711 closed; #15736 and #18158 open; vLLM ships one, PR #32553): the
context server recomputes every earlier answer whose KV it does not hold. Per turn:

    recompute_ms = recomputed answer tokens x prefill ms per token          (measured rate, or the plan's estimate)
    transfer_ms  = recomputed answer tokens x KV bytes per token per rank / reverse GB/s
    saved_ms     = recompute_ms - transfer_ms                                (< 0: the pull-back would cost TTFT)

A **projection**, labelled as one with its inputs, never a measurement: no transfer latency or setup, no overlap of
the pull with the new message's prefill, no contention. The reverse bandwidth is ``tk validate cluster``'s
generation->context figure (``pairs`` entries with ``"direction": "reverse"``), else the transport's nominal GB/s.
"""

from __future__ import annotations

from pathlib import Path

from toolkit.size.transfer import Bandwidth, MeasuredError, measured

LABEL = ("projection, not a measurement: the TTFT a pull-back of the previous answers' KV (generation -> context "
         "server) would save instead of their recompute")
# One reader of a validation report's bandwidth for tk size (forward) and tk bench (reverse): toolkit.size.transfer.
ReportError = MeasuredError


def reverse_bandwidth(path: str | Path, pick: str = "slowest") -> Bandwidth:
    """The generation->context bandwidth a ``tk validate cluster`` run measured (``pairs`` entries with
    ``"direction": "reverse"``: the answer's KV moving back), ``pick`` "slowest" (a deployment is as fast as its
    slowest pair) or "median"; ReportError says why a report cannot give one."""
    return measured(path, pick, direction="reverse")


def projection(turns: list[dict], *, prefill_ms_per_token: float, prefill_source: str,
               kv_bytes_per_token: float, kv_source: str, bandwidth: Bandwidth) -> dict:
    """Per turn (from turn 2): recompute time of the recomputed answer tokens minus their transfer time."""
    rows = []
    for t in turns:
        tokens = t.get("recomputed_answer_tokens")
        if t["turn"] < 2 or tokens is None:
            continue
        recompute = tokens * prefill_ms_per_token
        transfer = tokens * kv_bytes_per_token / (bandwidth.gbps * 1e9) * 1e3
        rows.append({"turn": t["turn"], "recomputed_answer_tokens": tokens, "recompute_ms": round(recompute, 3),
                     "transfer_ms": round(transfer, 3), "saved_ttft_ms": round(recompute - transfer, 3),
                     "ttft_p50_ms": t.get("ttft_p50_ms"),
                     "saved_share_of_ttft_p50": (round((recompute - transfer) / t["ttft_p50_ms"], 4)
                                                 if t.get("ttft_p50_ms") else None)})
    per_token_recompute = prefill_ms_per_token
    per_token_transfer = kv_bytes_per_token / (bandwidth.gbps * 1e9) * 1e3
    if not rows:
        summary = "nothing to project: no turn recomputed an earlier answer (or cached tokens were not reported)"
    elif per_token_transfer < per_token_recompute:
        best = max(rows, key=lambda r: r["saved_ttft_ms"])
        summary = (f"a pull-back would save up to {best['saved_ttft_ms']:.3g} ms of TTFT per request (turn "
                   f"{best['turn']}): moving an answer token's KV back takes {per_token_transfer * 1e3:.3g} us, "
                   f"recomputing it {per_token_recompute * 1e3:.3g} us")
    else:
        summary = (f"a pull-back would not pay at {bandwidth.gbps:g} GB/s: moving an answer token's KV back takes "
                   f"{per_token_transfer * 1e3:.3g} us, recomputing it {per_token_recompute * 1e3:.3g} us")
    return {"label": LABEL, "summary": summary,
            "inputs": {"prefill_ms_per_token": round(prefill_ms_per_token, 6), "prefill_source": prefill_source,
                       "kv_bytes_per_token_per_rank": round(kv_bytes_per_token, 1), "kv_bytes_source": kv_source,
                       "reverse_gbps": bandwidth.gbps, "reverse_source": bandwidth.source,
                       "reverse_detail": bandwidth.detail,
                       "not_modelled": "transfer latency and setup, overlap with the new message's prefill, "
                                       "contention between requests"},
            "turns": rows}
