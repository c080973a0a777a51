"""The servers' own reuse counters, read before and after a multi-turn cell (bounded reads, best effort).

Every worker: ``GET /metrics`` (trtllm-serve's iteration stats since the previous call, drained by each read:
``kvCacheStats`` with maxNumBlocks / freeNumBlocks / reusedBlocks / missedBlocks, ``inflightBatchingStats`` with
numCtxTokens, ``iterLatencyMS``) and, where it answers, the stand-in's ``GET /standin/stats`` (``kv_cache``:
cumulative lookups, cached tokens, evictions, events). The proxy: the stand-in's router counters. A server that
does not answer is left out; nothing here fails a benchmark.
"""

from __future__ import annotations

import json

import requests

MAX_BYTES = 16 << 20


def _get(url: str, timeout_s: float):
    with requests.get(url, timeout=timeout_s, stream=True) as resp:
        resp.raise_for_status()
        raw = resp.raw.read(MAX_BYTES + 1, decode_content=True)
    if len(raw) > MAX_BYTES:
        raise ValueError(f"{url}: more than {MAX_BYTES} bytes")
    return json.loads(raw)


class ReuseProbe:
    def __init__(self, proxy_url: str | None, workers: dict[str, str], timeout_s: float = 5.0):
        self.proxy_url = proxy_url.rstrip("/") if proxy_url else None
        self.workers = {k: v.rstrip("/") for k, v in workers.items()}
        self.timeout_s = timeout_s

    def snapshot(self) -> dict:
        out: dict = {"workers": {}, "routers": {}}
        for name, url in self.workers.items():
            entry: dict = {}
            try:
                metrics = _get(url + "/metrics", self.timeout_s)
                entry["metrics"] = metrics if isinstance(metrics, list) else []
            except Exception:  # noqa: BLE001 - a server without iteration stats: no rate, no pool figures
                entry["metrics"] = []
            try:
                stats = _get(url + "/standin/stats", self.timeout_s)
                if isinstance(stats, dict) and isinstance(stats.get("kv_cache"), dict):
                    entry["kv_cache"] = stats["kv_cache"]
                    entry["instance"] = stats.get("instance")  # a restart in between: counters start again at 0
            except Exception as exc:  # noqa: BLE001 - TensorRT-LLM has no such endpoint
                entry["kv_cache_unread"] = type(exc).__name__
            out["workers"][name] = entry
        if self.proxy_url:
            try:
                stats = _get(self.proxy_url + "/standin/stats", self.timeout_s)
                routers = stats.get("routers") if isinstance(stats, dict) else None
                if isinstance(routers, dict):
                    out["routers"] = routers
                    out["proxy_instance"] = stats.get("instance")
            except Exception as exc:  # noqa: BLE001 - TensorRT-LLM's proxy has no such endpoint
                out["routers_unread"] = type(exc).__name__
        return out
