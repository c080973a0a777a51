"""A baseline beside the deployment: the same workload's numbers side by side, and whether both answer the same
greedy completions of a few fixed prompts.

Greedy answers of one model on two deployments can legitimately differ: the aggregated servers and the
disaggregated roles run different parallelism (TP), batch compositions and kernels, which change the order of
floating-point reductions, and where two candidate tokens are nearly tied the argmax can flip; from that token on
the answers part. Such flips are rare and come at some point inside an answer. A deployment that computes
something else (KV that arrives corrupted, the wrong weights, a broken cache transceiver) differs in most answers,
from their first words. So the answers agree when most prompts (PARITY_MIN_IDENTICAL of them) are answered
identically and every answer that differs still agrees on its first half (PARITY_AGREED_PREFIX), word by word;
an answer that could not be obtained on either side is a failure (nothing was compared).
"""

from __future__ import annotations

import math

PROMPTS = ("The capital of France is", "Write one sentence about the sea.", "1, 2, 3, 4,",
           "Explain what a KV cache is in one line.")


def _ratio(a, b):
    return (a / b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def side_by_side(rows: list[dict], base_rows: list[dict]) -> list[dict]:
    """Pure: per cell, disaggregated / aggregated ratios."""
    base = {r["cell"]: r for r in base_rows}
    out = []
    for r in rows:
        b = base.get(r["cell"])
        if not b:
            continue
        out.append({"cell": r["cell"], "ttft_p50_ratio": _ratio(r["ttft_p50_ms"], b["ttft_p50_ms"]),
                    "request_throughput_ratio": _ratio(r["request_throughput"], b["request_throughput"]),
                    "tokens_per_gpu_ratio": _ratio(r["output_tokens_per_s_per_gpu"], b["output_tokens_per_s_per_gpu"]),
                    "disaggregated": r, "aggregated": b})
    return out


def greedy_answers(url: str, model: str, prompts=PROMPTS, max_tokens: int = 16) -> list[str]:
    """Greedy completions (temperature 0) of fixed prompts; an error is kept as its text."""
    from toolkit.client import complete

    out = []
    for p in prompts:
        try:
            out.append(complete(url, model, p, max_tokens=max_tokens))
        except Exception as exc:  # noqa: BLE001
            out.append(f"<error: {exc}>")
    return out


PARITY_MIN_IDENTICAL = 0.75  # of the prompts must be answered identically
PARITY_AGREED_PREFIX = 0.5  # of its words a differing answer must share with the other from the start
ERROR_PREFIX = "<error: "


def _agreed_words(x: str, y: str) -> tuple[int, int]:
    """(words the two answers share from the start, words in the shorter one)."""
    wx, wy = x.split(), y.split()
    n = 0
    for u, v in zip(wx, wy):
        if u != v:
            break
        n += 1
    return n, min(len(wx), len(wy))


def answers_agree(a: list[str], b: list[str], prompts=PROMPTS, *, against: str = "aggregated") -> dict:
    """The deployment's greedy answers (a) and a reference's (b: the aggregated baseline's, or a generation
    server's own whole answers) to the same prompts, compared (see the module docstring): "agree", the counts, a
    "reason" in words, and each pair with where it parts."""
    pairs = []
    for p, x, y in zip(prompts, a, b):
        agreed, shorter = _agreed_words(x, y)
        pairs.append({"prompt": p, "disaggregated": x, against: y, "same": x == y,
                      "error": x.startswith(ERROR_PREFIX) or y.startswith(ERROR_PREFIX),
                      "agreed_words": agreed, "words": shorter})
    n = len(pairs)
    matching = sum(1 for x in pairs if x["same"])
    errors = [x for x in pairs if x["error"]]
    early = [x for x in pairs if not x["same"] and not x["error"]
             and x["agreed_words"] < math.ceil(PARITY_AGREED_PREFIX * x["words"])]
    need = math.ceil(PARITY_MIN_IDENTICAL * n)
    problems = []
    if errors:
        x = errors[0]
        failed = x["disaggregated"] if x["disaggregated"].startswith(ERROR_PREFIX) else x[against]
        problems.append(f"{len(errors)} of {n} prompts could not be answered on both sides (e.g. {failed[:200]})")
    if matching < need:
        problems.append(f"{matching} of {n} greedy answers identical (at least {need} must be)")
    if early:
        x = early[0]
        problems.append(f"{len(early)} answer(s) part within their first half (e.g. {x['prompt']!r} after "
                        f"{x['agreed_words']} of {x['words']} words)")
    if problems:
        reason = "; ".join(problems)
    else:
        late = [x for x in pairs if not x["same"]]
        reason = f"{matching} of {n} greedy answers identical" + (
            f"; {len(late)} part late (after {', '.join(str(x['agreed_words']) for x in late)} words), as a near-tie "
            "flip between different parallelism can" if late else "")
    return {"agree": not problems, "matching": matching, "prompts": n, "reason": reason, "pairs": pairs}


def compare(rows: list[dict], base_rows: list[dict], baseline, answers: dict) -> dict:
    return {"endpoint": baseline.endpoint, "model": baseline.model, "gpus": baseline.gpus,
            "cells": side_by_side(rows, base_rows), "answers": answers}
