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
- ``bandwidth``: GB/s (1e9 bytes/s) per link, one direction: the transport profile's nominal figure
  (``facts.hardware.TRANSPORT_PROFILES``) or a figure measured by ``tk validate cluster``
  (``report.json`` → ``bandwidth_matrix``: its slowest or median context→generation pair).

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


@dataclass(frozen=True)
class Bandwidth:
    """The link figure the transfer term divides by, and where it came from."""

    gbps: float
    source: str  # "nominal" | "measured"
    detail: str  # e.g. "infiniband profile, nominal" or "slowest of 4 pairs in runs/x/report.json"
    transport: str | None = None

    def to_dict(self) -> dict:
        return {"gbps": self.gbps, "source": self.source, "detail": self.detail, "transport": self.transport}


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


_DIRECTIONS = {"forward": ("context→generation", _Figures.forward), "reverse": ("generation→context", _Figures.reverse)}


def measured(run_dir: str | Path, pick: str = "slowest", direction: str = "forward") -> Bandwidth:
    """The bandwidth a ``tk validate cluster`` run measured in one direction: ``pick`` is "slowest" (default: the
    deployment is as fast as its slowest pair) or "median" of the pairs' figures.

    ``forward`` (context→generation, the KV of every request): ``report.json``'s ``bandwidth_matrix`` (written
    since tk size), else the forward WRITE ``pairs``. ``reverse`` (generation→context, an answer's KV moving back:
    the multi-turn pull-back): the ``pairs`` with ``"direction": "reverse"``, WRITE where there are such entries
    (READ when the agents shared a host over a CPU-progressed transport, where WRITE figures measure the host: the
    report's ``timing.shared_host`` and ``timing.cpu_progressed``), else every reverse one."""
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be 'forward' or 'reverse', got {direction!r}")
    if pick not in ("slowest", "median"):
        raise ValueError(f"pick must be 'slowest' or 'median', got {pick!r}")
    report_file, report = _read_report(run_dir)
    what, read = _DIRECTIONS[direction]
    values, where = read(_Figures(report_file, report, direction))
    gbps = min(values) if pick == "slowest" else statistics.median(values)
    transport = _dict(report.get("thresholds")).get("transport")
    note = "" if report.get("passed") is True else " (that validation did NOT pass)"
    return Bandwidth(round(gbps, 6), "measured",
                     f"{pick} of {len(values)} {what} pair(s) in {report_file} ({where}){note}",
                     transport if isinstance(transport, str) and len(transport) <= 64 else None)
