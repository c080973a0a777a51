"""Proof that a deployment served disaggregated: counters read from the proxy and the workers before and after
the benchmark. One small interface, `Probe.snapshot() -> dict` and `Probe.proof(before, after) -> Proof`, over
the endpoints a run lists (run.json: servers with role, host and port; nodes.tsv for addresses).

- `StandinProbe` (a proxy that answers /standin/stats, the CPU stand-in): `GET /standin/stats` on the proxy (requests, disaggregated, local_prefill,
  ctx_finished_early, errors, per-server leg counts) and on every worker (requests by request_type; on
  generation workers kv.kv_transfers and kv.kv_bytes_received).
- `TrtllmProbe` (otherwise, TensorRT-LLM): `GET /perf_metrics` on the disaggregated server. TensorRT-LLM's
  `DisaggPerfMetricsCollector.get_perf_metrics` (tensorrt_llm/serve/perf_metrics.py, mounted by
  tensorrt_llm/serve/openai_disagg_server.py) returns one entry per finished disaggregated request that both
  legs reported, `{"ctx_server", "gen_server", "ctx_perf_metrics", "gen_perf_metrics", ...}`, and drains them:
  a snapshot before the run empties the buffer, the one after holds the run's requests. It needs
  `perf_metrics_max_requests` (disagg config) and `return_perf_metrics` on both roles; a buffer smaller than the
  run is reported. KV is taken as moved where a leg's metrics carry a kv_cache_size > 0 (the generation leg's
  timing metrics), else counted from the ctx/gen pairs alone.
- `AggregatedProbe`: a baseline with no legs to prove; its proof says so and the verdict skips the check.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol

import requests

from orchestrator.states import EventKind


@dataclass
class Proof:
    kind: str  # standin-stats | trtllm | aggregated | unavailable
    available: bool
    requests: int = 0  # requests the front end saw during the run
    context_legs: int = 0
    generation_legs: int = 0
    kv_transfers: int = 0
    kv_bytes: int = 0
    local_prefill: int = 0  # requests the proxy served without a context leg
    errors: int = 0
    disaggregated: int | None = None  # requests the front end itself says took both legs (None: it does not say)
    notes: list[str] = field(default_factory=list)
    per_server: dict = field(default_factory=dict)
    # servers whose counters started again during the run (a restart: another process answered after than before),
    # and workers that did not answer the snapshot after the run: their counts cover only part of the run
    restarted: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class Probe(Protocol):
    kind: str

    def snapshot(self) -> dict: ...

    def proof(self, before: dict, after: dict) -> Proof: ...


def _get(url: str, timeout_s: float):
    resp = requests.get(url, timeout=timeout_s)
    resp.raise_for_status()
    return resp.json()


class StandinProbe:
    kind = "standin-stats"

    def __init__(self, proxy_url: str, workers: dict[str, str], timeout_s: float = 5.0):
        self.proxy_url = proxy_url.rstrip("/")
        self.workers = {name: url.rstrip("/") for name, url in workers.items()}  # ctx-0 -> http://h:p
        self.timeout_s = timeout_s

    def snapshot(self) -> dict:
        """The proxy's counters (it must answer) and every worker's; a worker being restarted at that moment is
        recorded as unreadable instead of failing the whole snapshot."""
        doc = {"proxy": _get(self.proxy_url + "/standin/stats", self.timeout_s)}
        for name, url in self.workers.items():
            try:
                doc[name] = _get(url + "/standin/stats", self.timeout_s)
            except Exception as exc:  # noqa: BLE001
                doc[name] = {UNREADABLE: str(exc)[:300]}
        return doc

    def proof(self, before: dict, after: dict) -> Proof:
        return standin_proof(before, after)


UNREADABLE = "unreadable"


def _instance(doc) -> object:
    return doc.get("instance") if isinstance(doc, dict) else None


def _delta(after: dict, before: dict, *path) -> int:
    """after - before of one counter, per server lifetime: a server whose process changed in between (restarted)
    counts from 0, so a counter never goes negative; a server without counters counts 0."""
    def dig(d):
        for p in path:
            d = (d or {}).get(p) if isinstance(d, dict) else None
        return d if isinstance(d, (int, float)) else 0
    server = path[0]
    a, b = after.get(server), before.get(server)
    if not isinstance(a, dict) or UNREADABLE in a:
        return 0
    if not isinstance(b, dict) or UNREADABLE in b or _instance(a) != _instance(b):
        return int(dig(after))
    return max(0, int(dig(after) - dig(before)))


def standin_proof(before: dict, after: dict) -> Proof:
    """Pure: two /standin/stats snapshots -> what happened in between, counted per server lifetime."""
    p = Proof(kind="standin-stats", available=True)
    for name in sorted(after):
        a, b = after.get(name), before.get(name)
        if not isinstance(a, dict) or UNREADABLE in a:
            p.unreadable.append(name)
            p.notes.append(f"{name} did not answer after the run ({(a or {}).get(UNREADABLE, 'no counters')}): "
                           "its counts are not known")
        elif isinstance(b, dict) and UNREADABLE not in b and _instance(a) != _instance(b):
            p.restarted.append(name)
            was, now = (_instance(b) or {}).get("pid"), (_instance(a) or {}).get("pid")
            p.notes.append(f"{name} restarted during the run (pid {was} -> {now}): counted per server lifetime, "
                           "so what it served before the restart is not counted")
    p.requests = _delta(after, before, "proxy", "requests")
    p.local_prefill = _delta(after, before, "proxy", "local_prefill")
    p.errors = _delta(after, before, "proxy", "errors")
    disagg = _delta(after, before, "proxy", "disaggregated")
    early = _delta(after, before, "proxy", "ctx_finished_early")
    for name in sorted(k for k in after if k != "proxy"):
        if name.startswith("ctx"):
            n = _delta(after, before, name, "requests", "context_only")
            p.context_legs += n
            p.per_server[name] = {"context_only": n}
        elif name.startswith("gen"):
            n = _delta(after, before, name, "requests", "generation_only")
            t = _delta(after, before, name, "kv", "kv_transfers")
            b = _delta(after, before, name, "kv", "kv_bytes_received")
            p.generation_legs += n
            p.kv_transfers += t
            p.kv_bytes += b
            p.per_server[name] = {"generation_only": n, "kv_transfers": t, "kv_bytes_received": b}
    p.per_server["proxy"] = {"requests": p.requests, "disaggregated": disagg, "local_prefill": p.local_prefill,
                             "ctx_finished_early": early, "errors": p.errors}
    p.disaggregated = disagg
    if early:
        p.notes.append(f"{early} request(s) finished on the context server (no generation leg)")
    return p


class TrtllmProbe:
    kind = "trtllm"

    def __init__(self, proxy_url: str, timeout_s: float = 10.0):
        self.proxy_url = proxy_url.rstrip("/")
        self.timeout_s = timeout_s

    def snapshot(self) -> dict:
        entries = _get(self.proxy_url + "/perf_metrics", self.timeout_s)
        return {"perf_metrics": entries if isinstance(entries, list) else []}

    def proof(self, before: dict, after: dict) -> Proof:
        return trtllm_proof(after.get("perf_metrics") or [])


def _find(d, key):
    if isinstance(d, dict):
        if key in d and isinstance(d[key], (int, float)):
            return d[key]
        for v in d.values():
            found = _find(v, key)
            if found is not None:
                return found
    elif isinstance(d, list):
        for v in d:
            found = _find(v, key)
            if found is not None:
                return found
    return None


def trtllm_proof(entries: list) -> Proof:
    """Pure: the disaggregated server's /perf_metrics entries after the run (the buffer was drained before)."""
    p = Proof(kind="trtllm", available=True)
    p.requests = len(entries)
    with_size = 0
    for e in entries:
        if not isinstance(e, dict):
            continue
        ctx, gen = e.get("ctx_perf_metrics"), e.get("gen_perf_metrics")
        if ctx:
            p.context_legs += 1
            p.per_server.setdefault(str(e.get("ctx_server")), {"context_legs": 0})["context_legs"] += 1
        if gen:
            p.generation_legs += 1
            p.per_server.setdefault(str(e.get("gen_server")), {"generation_legs": 0})["generation_legs"] += 1
        size = _find(gen, "kv_cache_size") if gen else None
        if size is not None:
            with_size += 1
            if size > 0:
                p.kv_transfers += 1
                p.kv_bytes += int(size)
        elif ctx and gen:
            p.kv_transfers += 1  # both legs of one ctx_request_id: the generation leg was handed the KV
    if entries and not with_size:
        p.notes.append("no kv_cache_size in the generation legs' metrics: KV counted from ctx/gen pairs")
    if not entries:
        p.available = False
        p.notes.append("/perf_metrics returned no entries: set perf_metrics_max_requests (disagg config) and "
                       "return_perf_metrics: true on both roles to let tk prove the legs")
    return p


# The job's events that mean the proxy's process was replaced or gone
PROXY_GONE_EVENTS = (EventKind.EXITED, EventKind.KILLED, EventKind.RESTARTED, EventKind.LOST)


def account_for_restarts(proof: Proof, supervision: list[dict]) -> Proof:
    """The proof, with what the job's own supervision events (bench.supervision_during: the measurement's window)
    say it cannot see. TensorRT-LLM's /perf_metrics entries live in the disaggregated server's memory
    (DisaggPerfMetricsCollector, tensorrt_llm/serve/perf_metrics.py): a proxy that exited or was restarted while
    the benchmark ran lost the entries of the requests it finished before, so its counts cover only part of the
    run, and the proof says so (``restarted``, a note) rather than leave a shortfall to be read as a small buffer.
    The stand-in's counters see a restart themselves (each carries its process's ``instance``) and the workers'
    keep counting, so a stand-in proof is returned as it is."""
    if proof.kind != "trtllm" or "proxy" in proof.restarted:
        return proof
    gone = [e for e in supervision if e.get("component") == "proxy" and e.get("event") in PROXY_GONE_EVENTS]
    if gone:
        proof.restarted.append("proxy")
        proof.notes.append(f"the proxy ({gone[0]['event']} during the run) lost the /perf_metrics entries of the "
                           "requests it had finished before: they live in its process, so the legs are counted "
                           "for part of the run only")
    return proof


class AggregatedProbe:
    kind = "aggregated"

    def snapshot(self) -> dict:
        return {}

    def proof(self, before: dict, after: dict) -> Proof:
        return Proof(kind="aggregated", available=True, notes=["aggregated baseline: no legs to prove"])


def unavailable(reason: str) -> Proof:
    return Proof(kind="unavailable", available=False, notes=[reason])


def probe_for(proxy_url: str, workers: dict[str, str], timeout_s: float = 5.0):
    """The stand-in's counters where the proxy serves /standin/stats, else TensorRT-LLM's /perf_metrics: asked of
    the deployment itself, so no code here names an engine."""
    try:
        requests.get(proxy_url.rstrip("/") + "/standin/stats", timeout=timeout_s).raise_for_status()
        return StandinProbe(proxy_url, workers, timeout_s)
    except Exception:  # noqa: BLE001
        return TrtllmProbe(proxy_url)
