"""aiperf's export (aiperf 0.13) -> typed records. Reads files, writes nothing.

An aiperf artifact directory holds (names without --profile-export-prefix, as tk runs it):

    profile_export_aiperf.json   the summary of the profiling phase: one object per metric
                                 ({"unit", "avg", "p50", "p99", ...}), plus error_summary, input_config,
                                 warmup_metrics (the warm-up's own summary, kept apart), was_cancelled
    profile_export_aiperf.csv    the same summary as a table
    profile_export.jsonl         one line per request: metadata (benchmark_phase warmup|profiling,
                                 conversation_id, turn_index, x_correlation_id: one per session) and metrics
                                 ({"value", "unit"}; usage_prompt_cache_read_tokens is the server's
                                 usage.prompt_tokens_details.cached_tokens); a failed request
                                 has "error": {"code", "type", "message"} instead of most metrics
    phase_manifest.json          the phases with their request counts (absent when every request failed)

When every request fails aiperf exits 1 and writes no summary; the records still say why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from toolkit.runtime import files

EXPORT_MAX_BYTES = 1 << 30  # aiperf's per-request records: about 1 KiB a request
SUMMARY = "profile_export_aiperf.json"
SUMMARY_CSV = "profile_export_aiperf.csv"
RECORDS = "profile_export.jsonl"
# Metrics that need the gaps between a stream's tokens (aiperf: inter_chunk_latency is ITL, inter_token_latency is
# TPOT, and tokens/s per user is 1000 / TPOT): not measurable when a stream arrives in one chunk.
TOKEN_TIMING_METRICS = ("inter_chunk_latency", "inter_token_latency", "output_token_throughput_per_user")
ONE_CHUNK_MS = 0.001  # request latency within 1 us of TTFT: the stream's tokens came in one chunk


@dataclass(frozen=True)
class Record:
    """One request as aiperf measured it."""

    phase: str  # warmup | profiling
    conversation: str
    turn: int
    isl: int | None  # aiperf's count with the benchmark's tokenizer (no chat template)
    osl: int | None
    prompt_tokens: int | None  # the server's usage.prompt_tokens (chat template included)
    completion_tokens: int | None  # the server's usage.completion_tokens
    ttft_ms: float | None
    latency_ms: float | None
    error: str | None = None  # "400 Bad Request: ..." for a failed request
    cached_tokens: int | None = None  # the server's usage.prompt_tokens_details.cached_tokens (None: not reported)
    session: str = ""  # aiperf's per-session correlation id (a sampled conversation's one run); "" if absent

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class CellResult:
    """One aiperf run: its summary metrics and its per-request records."""

    name: str
    summary: dict = field(default_factory=dict)  # metric -> {"unit", "avg", "p50", ...}
    records: list[Record] = field(default_factory=list)
    aiperf_version: str | None = None
    input_config: dict = field(default_factory=dict)
    was_cancelled: bool = False
    errors: list = field(default_factory=list)  # aiperf's error_summary
    servers: object = None  # multi-turn: the servers' own counters over the cell (toolkit.bench.reuse.ServerCounts)

    @property
    def profiled(self) -> list[Record]:
        return [r for r in self.records if r.phase == "profiling"]

    @property
    def warmup(self) -> list[Record]:
        return [r for r in self.records if r.phase == "warmup"]

    @property
    def one_chunk_count(self) -> tuple[int, int]:
        """(streams whose tokens all arrived in one chunk, streams): successful profiled streams of more than one
        token whose last token came with the first (request latency = TTFT), as from a server that answers at once
        (the plain CPU stand-in)."""
        streams = [r for r in self.profiled if r.ok and (r.osl or 0) > 1 and r.ttft_ms is not None
                   and r.latency_ms is not None]
        return sum(r.latency_ms - r.ttft_ms < ONE_CHUNK_MS for r in streams), len(streams)

    @property
    def one_chunk_streams(self) -> bool:
        """Most streams (at least half) arrived in one chunk: the gaps between tokens were mostly never seen, so
        ITL, TPOT and tokens/s per user are not measurable (their percentiles would be the zeros of those)."""
        one, streams = self.one_chunk_count
        return streams > 0 and 2 * one >= streams

    def stat(self, metric: str, stat: str = "avg") -> float | None:
        value = (self.summary.get(metric) or {}).get(stat)
        return float(value) if isinstance(value, (int, float)) else None

    def to_dict(self) -> dict:
        prof = self.profiled
        return {"name": self.name, "aiperf_version": self.aiperf_version, "was_cancelled": self.was_cancelled,
                "requests": len(prof), "errors": sum(1 for r in prof if not r.ok),
                "warmup_requests": len(self.warmup), "error_summary": self.errors,
                "metrics": {k: v for k, v in self.summary.items() if isinstance(v, dict) and "unit" in v}}


def _value(metrics: dict, name: str):
    v = (metrics.get(name) or {}).get("value")
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def parse_record(line: str) -> Record:
    doc = files.loads(line, what="record", max_depth=16)
    meta = doc.get("metadata") or {}
    metrics = doc.get("metrics") or {}
    err = doc.get("error")
    error = None
    if err:
        error = f"{err.get('code')} {err.get('type') or ''}: {str(err.get('message') or '')[:300]}".strip()
    isl = _value(metrics, "input_sequence_length")
    if isl is None:
        isl = _value(metrics, "error_isl")
    ints = lambda v: int(v) if v is not None else None  # noqa: E731
    return Record(phase=str(meta.get("benchmark_phase") or meta.get("phase_kind") or "profiling"),
                  conversation=str(meta.get("conversation_id") or ""), turn=int(meta.get("turn_index") or 0),
                  isl=ints(isl), osl=ints(_value(metrics, "output_sequence_length")),
                  prompt_tokens=ints(_value(metrics, "usage_prompt_tokens")),
                  completion_tokens=ints(_value(metrics, "usage_completion_tokens")),
                  ttft_ms=_value(metrics, "time_to_first_token"), latency_ms=_value(metrics, "request_latency"),
                  error=error, cached_tokens=ints(_value(metrics, "usage_prompt_cache_read_tokens")),
                  session=str(meta.get("x_correlation_id") or ""))


class ExportError(Exception):
    """The artifact directory is not an aiperf export tk can read."""


def read_export(out_dir: Path, name: str) -> CellResult:
    out_dir = Path(out_dir)
    rec_path = out_dir / RECORDS
    if not rec_path.is_file():
        raise ExportError(f"{rec_path}: missing (aiperf wrote no per-request records)")
    records = []
    try:
        text = files.read_text(rec_path, EXPORT_MAX_BYTES)
    except (OSError, ValueError) as exc:
        raise ExportError(f"{rec_path}: cannot be read ({str(exc)[:300]})") from None
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(parse_record(line))
            except (ValueError, TypeError, AttributeError) as exc:
                raise ExportError(f"{rec_path}:{n}: not an aiperf record ({exc})") from None
    result = CellResult(name=name, records=records)
    sum_path = out_dir / SUMMARY
    if sum_path.is_file():
        try:
            doc = files.read_json(sum_path, EXPORT_MAX_BYTES)
        except (OSError, ValueError) as exc:
            raise ExportError(f"{sum_path}: not JSON ({str(exc)[:300]})") from None
        if not isinstance(doc, dict):
            raise ExportError(f"{sum_path}: not a JSON object")
        result.summary = {k: v for k, v in doc.items() if isinstance(v, dict) and "unit" in v}
        result.aiperf_version = doc.get("aiperf_version")
        result.input_config = doc.get("input_config") or {}
        result.was_cancelled = bool(doc.get("was_cancelled"))
        result.errors = doc.get("error_summary") or []
    return result
