"""SLA keys (`--sla ttft_p99_ms=500,itl_p99_ms=30`) -> checks against aiperf's summary. Pure."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from toolkit.bench.workload import BenchInputError

# latency key prefix -> aiperf metric (ms). aiperf's "inter_token_latency" is per request (latency - TTFT) /
# (OSL - 1), i.e. TPOT; "inter_chunk_latency" is every gap between streamed chunks, i.e. ITL.
LATENCIES = {"ttft": "time_to_first_token", "itl": "inter_chunk_latency", "tpot": "inter_token_latency",
             "e2e": "request_latency"}
STATS = ("p50", "p90", "p95", "p99", "avg", "max")
# floor key -> (aiperf metric, divide by GPUs)
FLOORS = {"request_throughput_min": ("request_throughput", False),
          "output_tokens_per_s_min": ("output_token_throughput", False),
          "output_tokens_per_s_per_gpu_min": ("output_token_throughput", True),
          "output_tokens_per_s_per_user_min": ("output_token_throughput_per_user", False)}
_LATENCY_KEY = re.compile(r"^(ttft|itl|tpot|e2e)_(p50|p90|p95|p99|avg|max)_ms$")


def valid_keys() -> list[str]:
    return [f"{k}_{s}_ms" for k in LATENCIES for s in STATS] + list(FLOORS)


@dataclass(frozen=True)
class Objective:
    key: str
    limit: float
    metric: str  # aiperf metric
    stat: str  # avg | p99 ...
    kind: str  # "max" (latency ceiling) | "min" (throughput floor)
    per_gpu: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def parse_sla(text: str | None) -> tuple[Objective, ...]:
    """`ttft_p99_ms=500,itl_p99_ms=30` -> objectives. Unknown keys and bad numbers: BenchInputError (exit 2)."""
    if not text:
        return ()
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep:
            raise BenchInputError(f"--sla {part!r}: expected KEY=VALUE, e.g. ttft_p99_ms=500")
        try:
            limit = float(value)
        except ValueError:
            raise BenchInputError(f"--sla {key}: {value!r} is not a number") from None
        if not math.isfinite(limit) or limit <= 0:
            raise BenchInputError(f"--sla {key}: {value!r} must be a finite number > 0")
        m = _LATENCY_KEY.match(key)
        if m:
            out.append(Objective(key, limit, LATENCIES[m.group(1)], m.group(2), "max"))
        elif key in FLOORS:
            metric, per_gpu = FLOORS[key]
            out.append(Objective(key, limit, metric, "avg", "min", per_gpu))
        else:
            raise BenchInputError(f"--sla: unknown key {key!r}; valid keys: {', '.join(valid_keys())}")
    return tuple(out)
