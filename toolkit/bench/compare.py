"""A baseline beside the deployment: the same workload's numbers side by side, and whether both answer the same
greedy completions of a few fixed prompts."""

from __future__ import annotations

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


def answers_agree(a: list[str], b: list[str], prompts=PROMPTS) -> dict:
    """The two deployments' greedy answers to the same prompts, compared exactly."""
    pairs = [{"prompt": p, "disaggregated": x, "aggregated": y, "same": x == y} for p, x, y in zip(prompts, a, b)]
    matching = sum(1 for x in pairs if x["same"])
    return {"agree": matching == len(pairs), "matching": matching, "prompts": len(pairs), "pairs": pairs}


def compare(rows: list[dict], base_rows: list[dict], baseline, answers: dict) -> dict:
    return {"endpoint": baseline.endpoint, "model": baseline.model, "gpus": baseline.gpus,
            "cells": side_by_side(rows, base_rows), "answers": answers}
