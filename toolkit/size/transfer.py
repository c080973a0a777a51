"""The KV-transfer term that sizing tools leave out (pure: no aiconfigurator, no I/O).

aiconfigurator rate-matches context and generation workers and reports the context phase's TTFT; it has no
KV-transfer term ("TODO, should consider kvcache model in future", aiconfigurator 0.12.0,
``sdk/inference_session.py``). tk adds one to every disaggregated candidate:

    transfer_ms = bytes_per_token × ISL / bandwidth

- ``bytes_per_token``: the KV bytes one token takes on **one context rank** (all its layers), the figure the
  plan and ``tk validate cluster`` use (``KvGeometry.ctx_bytes_per_token_per_rank``,
  ``largest_request.bytes_per_rank``): every context rank sends its own shard over its own link at the
  same time, so the request is through when the fullest rank's shard is. At TP1 it is the whole model's KV
  bytes per token (``ModelSpec.kv_bytes_per_token_per_layer × layers``).
- ``bandwidth``: GB/s (1e9 bytes/s) per rank pair, one direction, on one of two bases (``Bandwidth.basis``):
  - ``link``: the transport profile's nominal figure (``facts.hardware.TRANSPORT_PROFILES``), or the link GB/s
    ``tk validate cluster`` measured (``report.json`` → ``bandwidth_matrix``: its slowest or median
    context→generation pair) where the report has no staged request time (descriptor lists; older reports);
  - ``request``: where the report carries it, what TensorRT-LLM's transceiver costs per request: the staged
    transfer's gather + WRITE + scatter (each forward WRITE pair's ``lengths[-1].request_ms``, the time its longest
    validated request took), as bytes of that request per millisecond, so the term scales it by bytes. The C++
    transceiver gathers a request's blocks into a staging buffer, posts one WRITE per rank pair and scatters on
    arrival (``CacheFormatter::format``/``unformat``, cacheFormatter.cpp @ 00c77b30; docs/validate.md): the link's
    GB/s alone leaves the two device copies out.

Nothing else is modelled: no per-transfer latency, no overlap of the transfer with the first decode step,
no contention between concurrent requests on one link.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from toolkit.facts.hardware import TRANSPORT_PROFILES
from toolkit.facts.models import ModelSpec

from toolkit.runtime import files

REPORT_MAX_BYTES = 64 << 20  # a validation report of the largest sweep is a few MiB
MAX_GBPS = 10_000.0  # above any fabric's bandwidth per pair (NVLink 5: 900 GB/s each way): a larger figure is not one
REQUEST_MS_RANGE = (1e-6, 3.6e6)  # a request's time: a nanosecond to an hour (the validator's bounds are far inside)
MAX_REQUEST_BYTES = 1 << 50  # one request of one rank pair: far above any KV cache

LINK = "link"
REQUEST = "request"
BASIS_TEXT = {
    LINK: "the link: bytes / the transfer's GB/s",
    REQUEST: "the transceiver's request time: gather + WRITE + scatter of the staged transfer, per byte of the "
             "longest validated request",
}


@dataclass(frozen=True)
class Bandwidth:
    """The figure the transfer term divides by, what it is (``basis``: the link's GB/s, or the transceiver's request
    time as bytes per second) and where it came from."""

    gbps: float
    source: str  # "nominal" | "measured"
    detail: str  # e.g. "infiniband profile, nominal" or "slowest of 4 pairs in runs/x/report.json"
    transport: str | None = None
    basis: str = LINK  # LINK | REQUEST
    link_gbps: float | None = None  # the link's figure (REQUEST: beside the request's; LINK: gbps itself)

    def __post_init__(self):
        if self.link_gbps is None and self.basis == LINK:
            object.__setattr__(self, "link_gbps", self.gbps)

    def describe(self) -> str:
        """The line tk size prints: the figure, its basis, its source."""
        if self.basis == REQUEST:
            return (f"{self.gbps:g} GB/s (per request as the transceiver moves it: gather + WRITE + scatter; "
                    f"link {self.link_gbps:g} GB/s): {self.detail}")
        return f"{self.gbps:g} GB/s (link): {self.detail}"

    def to_dict(self) -> dict:
        return {"gbps": self.gbps, "source": self.source, "detail": self.detail, "transport": self.transport,
                "basis": self.basis, "basis_text": BASIS_TEXT[self.basis], "link_gbps": self.link_gbps}


def kv_dtype_of(aic_kvcache: str | None) -> str:
    """tk's kv dtype name for aiconfigurator's KV-cache quantization column ('bfloat16', 'fp8', 'int8')."""
    value = (aic_kvcache or "bfloat16").lower()
    if value in ("fp8", "int8"):  # both one byte per element
        return "fp8"
    return "auto"


def bytes_per_token(model: ModelSpec, kv_dtype: str, ctx_tp: int = 1, ctx_pp: int = 1) -> int:
    """KV bytes one token takes on the fullest context rank (the whole model's at TP1, PP1)."""
    return model.kv_bytes_per_token_per_rank(kv_dtype, ctx_tp, ctx_pp)


def transfer_ms(nbytes_per_token: float, isl: int, gbps: float) -> float:
    """Milliseconds to move ``isl`` tokens of ``nbytes_per_token`` at ``gbps`` GB/s (1e9 bytes/s)."""
    if not (gbps > 0 and math.isfinite(gbps)):
        raise ValueError(f"bandwidth must be a positive finite number of GB/s, got {gbps!r}")
    return nbytes_per_token * isl / (gbps * 1e9) * 1e3


def nominal(transport: str) -> Bandwidth:
    profile = TRANSPORT_PROFILES[transport]
    return Bandwidth(profile.nominal_gbps, "nominal",
                     f"{transport} profile, nominal {profile.nominal_gbps:g} GB/s per GPU", transport)


class MeasuredError(ValueError):
    """A validate run directory tk cannot take a bandwidth from; the message says why."""


def _read_report(run_dir: str | Path) -> tuple[Path, dict]:
    """(report.json's path, the report) of a validate run directory, or of the report file itself."""
    path = Path(run_dir)
    report_file = path / "report.json" if path.is_dir() else path
    try:
        report = files.read_json(report_file, REPORT_MAX_BYTES)
    except FileNotFoundError:
        raise MeasuredError(f"{report_file}: no such file; give the run directory (or report.json) of a "
                            "`tk validate cluster` run") from None
    except (OSError, ValueError) as exc:  # files.FileProblem: too big, too deep, not JSON, not a regular file
        raise MeasuredError(f"{report_file}: cannot read the validation report ({str(exc)[:300]})") from None
    if not isinstance(report, dict) or report.get("kind") != "tk-validate-cluster":
        raise MeasuredError(f"{report_file}: not a `tk validate cluster` report")
    return report_file, report


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class _Figures:
    """The measured GB/s of one direction's pairs of a validation report, each checked as it is read."""

    report_file: Path
    report: dict
    direction: str

    def figure(self, v, field: str) -> float | None:
        """A measured GB/s: a finite number above 0 and at most MAX_GBPS; None or 0 for a pair that has none (it
        failed); anything else is not what tk writes there."""
        if v is None or v == 0 and not isinstance(v, bool):
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= MAX_GBPS or not math.isfinite(v):
            raise MeasuredError(f"{self.report_file}: {field}: {repr(v)[:40]} is not a measured bandwidth (a finite "
                                f"GB/s above 0 and at most {MAX_GBPS:g}); not a report tk wrote: validate again")
        return float(v)

    @property
    def pairs(self) -> list[tuple[int, dict]]:
        """(index in ``pairs``, pair) of this direction's pairs."""
        raw = self.report.get("pairs") if isinstance(self.report.get("pairs"), list) else []
        return [(i, p) for i, p in enumerate(raw)
                if isinstance(p, dict) and p.get("direction", "forward") == self.direction]

    def from_pairs(self, wanted) -> list[float]:
        """The figures of the pairs ``wanted(pair)`` selects."""
        found = (self.figure(p.get("gbps"), f"pairs[{i}].gbps") for i, p in self.pairs if wanted(p))
        return [v for v in found if v is not None]

    def from_matrix(self) -> list[float]:
        rows = _dict(self.report.get("bandwidth_matrix")).get("gbps")
        if not isinstance(rows, list):
            return []
        found = (self.figure(v, f"bandwidth_matrix.gbps[{r}][{c}]")
                 for r, row in enumerate(rows) for c, v in enumerate(row if isinstance(row, list) else []))
        return [v for v in found if v is not None]

    def forward(self) -> tuple[list[float], str]:
        """(figures, where they were read): the bandwidth matrix, else the forward WRITE pairs."""
        values = self.from_matrix()
        if values:
            return values, "bandwidth_matrix"
        values = self.from_pairs(lambda p: p.get("op", "WRITE") == "WRITE")
        if not values:
            raise MeasuredError(f"{self.report_file}: no measured context→generation bandwidth (every pair failed or "
                                "none ran); fix the cluster and validate again")
        return values, "pairs (WRITE)"

    def reverse(self) -> tuple[list[float], str]:
        """(figures, where they were read): the reverse pairs of the op the hosts can be trusted with (READ where
        the agents shared a host over a CPU-progressed transport), else every reverse pair."""
        if not self.pairs:
            raise MeasuredError(f"{self.report_file}: no generation→context (\"direction\": \"reverse\") pairs: "
                                "that validation measured the forward direction only; validate again with a tk that "
                                "measures both")
        # READ only where WRITE figures measure the host: agents on one host over a CPU-progressed transport (host
        # memory; reports before `cpu_progressed` were all such). CUDA memory over cuda_ipc or RDMA: WRITE stands,
        # and a READ there may be UCX's software emulation (docs/validate.md)
        timing = _dict(self.report.get("timing"))
        prefer = "READ" if timing.get("shared_host") is True and timing.get("cpu_progressed") is not False else "WRITE"
        every = self.from_pairs(lambda p: True)  # every figure checked, whichever op is used
        values = self.from_pairs(lambda p: p.get("op") == prefer)
        if values:
            return values, f"pairs ({prefer})"
        if not every:
            raise MeasuredError(f"{self.report_file}: every generation→context pair failed; fix the cluster and "
                                "validate again")
        return every, "pairs (any op)"

    def number(self, v, field: str, low, high, whole: bool = False) -> float:
        """A number of a pair's request within [low, high] (an integer where ``whole``; compared before any conversion:
        an integer too large for a float is refused, not an OverflowError), else MeasuredError naming the field."""
        if isinstance(v, bool) or not isinstance(v, int if whole else (int, float)) or not low <= v <= high:
            raise MeasuredError(f"{self.report_file}: {field}: {repr(v)[:40]} is not a measured request figure (a "
                                f"number from {low:g} to {high:g}); not a report tk wrote: validate again")
        return float(v)

    def requests(self) -> list[float] | None:
        """Each forward WRITE pair's request time as GB/s (bytes of its longest validated request / its request_ms:
        gather + WRITE + scatter), where every measured pair's longest request was staged and each of the three
        timed; None where any is not (descriptor lists, older reports, a gather or scatter without a figure): their
        link figure stands."""
        measured = [(i, p) for i, p in self.pairs if p.get("op", "WRITE") == "WRITE" and p.get("gbps")]
        rates = []
        for i, p in measured:
            lengths = p.get("lengths")
            longest = lengths[-1] if isinstance(lengths, list) and lengths else None
            if (not isinstance(longest, dict) or longest.get("staged") is not True
                    or any(longest.get(k) is None for k in ("request_ms", "gather_p50_ms", "scatter_p50_ms"))):
                return None  # not staged, or a copy untimed: request_ms would be the WRITE alone
            where = f"pairs[{i}].lengths[{len(lengths) - 1}]"
            ms = self.number(longest.get("request_ms"), f"{where}.request_ms", *REQUEST_MS_RANGE)
            nbytes = self.number(longest.get("bytes"), f"{where}.bytes", 1, MAX_REQUEST_BYTES, whole=True)
            rates.append(self.figure(nbytes / ms * 1e3 / 1e9, f"{where}.bytes / {where}.request_ms"))
        return [r for r in rates if r is not None] or None


_DIRECTIONS = {"forward": ("context→generation", _Figures.forward), "reverse": ("generation→context", _Figures.reverse)}


def measured(run_dir: str | Path, pick: str = "slowest", direction: str = "forward") -> Bandwidth:
    """The bandwidth a ``tk validate cluster`` run measured in one direction: ``pick`` is "slowest" (default: the
    deployment is as fast as its slowest pair) or "median" of the pairs' figures.

    ``forward`` (context→generation, the KV of every request): where every measured forward WRITE pair's longest
    request was staged (the C++ transceiver; the Python one's bounce buffer), the transceiver's request time
    (gather + WRITE + scatter, ``basis`` "request", the link's figure beside it); else the link: ``report.json``'s
    ``bandwidth_matrix`` (written since tk size), else the forward WRITE ``pairs``. ``reverse``
    (generation→context, an answer's KV moving back: the multi-turn pull-back, which TensorRT-LLM has no
    transceiver for: the link): the ``pairs`` with ``"direction": "reverse"``, WRITE where there are such entries
    (READ when the agents shared a host over a CPU-progressed transport, where WRITE figures measure the host: the
    report's ``timing.shared_host`` and ``timing.cpu_progressed``), else every reverse one."""
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be 'forward' or 'reverse', got {direction!r}")
    if pick not in ("slowest", "median"):
        raise ValueError(f"pick must be 'slowest' or 'median', got {pick!r}")
    report_file, report = _read_report(run_dir)
    what, read = _DIRECTIONS[direction]
    figures = _Figures(report_file, report, direction)
    values, where = read(figures)

    def chosen(xs: list[float]) -> float:
        return round(min(xs) if pick == "slowest" else statistics.median(xs), 6)

    transport = _dict(report.get("thresholds")).get("transport")
    transport = transport if isinstance(transport, str) and len(transport) <= 64 else None
    note = "" if report.get("passed") is True else " (that validation did NOT pass)"
    requests = figures.requests() if direction == "forward" else None
    if requests:
        return Bandwidth(chosen(requests), "measured",
                         f"{pick} of {len(requests)} {what} pair(s) in {report_file} (pairs: the longest validated "
                         f"request's request_ms, staged){note}", transport, basis=REQUEST, link_gbps=chosen(values))
    return Bandwidth(chosen(values), "measured", f"{pick} of {len(values)} {what} pair(s) in {report_file} ({where}){note}",
                     transport)
