"""The roofline timing model: how long a TensorRT-LLM iteration of MODEL would take on GPU, from datasheet figures.

Pure functions over ``toolkit.facts.hardware.GPU_FIGURES`` (peaks, HBM bandwidth, efficiencies, each with its
source) and ``toolkit.facts.models.ModelSpec`` (parameters, KV bytes). The CPU stand-in's emulated timing
(``standin.emulate`` in a recipe) sleeps these times; nothing here is a measurement.

- prefill (compute-bound): 2 x active params x tokens / (peak FLOP/s x prefill efficiency x TP)
- decode step (memory-bound): (weight bytes / TP + KV bytes read) / (HBM bytes/s x decode efficiency)
- one iteration of a mixed batch: the larger of the two (the roofline), with every token the iteration
  computes (prefill chunks plus one per decoding request) in the first and the weights plus every scheduled
  request's KV in the second.

Left out on purpose (docs/standin.md, "Limits"): attention FLOPs (quadratic in the context), communication
between TP ranks, kernel-launch and scheduling overheads, pipeline parallelism, MoE routing imbalance.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.facts.hardware import DECODE_EFFICIENCY, GPU_FIGURES, PREFILL_EFFICIENCY, GpuFigures
from toolkit.facts.models import ModelSpec

PRECISIONS = ("bf16", "fp8")  # weights and activations; the KV cache dtype is the role's own
WEIGHT_BYTES = {"bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class Roofline:
    """MODEL on GPU at TP, ready to time iterations. Build it with ``roofline()``."""

    model: ModelSpec
    gpu: GpuFigures
    tp: int
    precision: str
    kv_bytes_per_token: float  # per rank, all layers, at the role's KV dtype
    prefill_efficiency: float = PREFILL_EFFICIENCY
    decode_efficiency: float = DECODE_EFFICIENCY

    @property
    def peak_flops(self) -> float:
        """Dense tensor-core peak of one GPU at this precision, FLOP/s."""
        tflops = self.gpu.fp8_tflops if self.precision == "fp8" else self.gpu.bf16_tflops
        return tflops * 1e12

    @property
    def weight_bytes_per_rank(self) -> float:
        return self.model.params * WEIGHT_BYTES[self.precision] / self.tp

    def describe(self) -> str:
        """How every report names the timing: never a measurement of TensorRT-LLM."""
        return f"emulated timing of {self.model.name} on {self.gpu.name} (TP={self.tp}, {self.precision})"


def roofline(model: ModelSpec, gpu: str, tp: int = 1, precision: str = "bf16", kv_dtype: str = "auto") -> Roofline:
    if gpu not in GPU_FIGURES:
        raise ValueError(f"no figures for GPU {gpu!r} (one of {', '.join(GPU_FIGURES)})")
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    figures = GPU_FIGURES[gpu]
    if precision == "fp8" and figures.fp8_tflops is None:
        raise ValueError(f"{gpu} has no FP8 tensor cores; emulate it with precision bf16")
    if tp < 1:
        raise ValueError("tp must be at least 1")
    kv = model.kv_bytes_per_token_per_rank(kv_dtype, tp, 1)
    return Roofline(model=model, gpu=figures, tp=tp, precision=precision, kv_bytes_per_token=kv)


def prefill_time(r: Roofline, tokens: int) -> float:
    """Seconds to compute ``tokens`` tokens' forward pass (compute-bound): 2 x active params x tokens / (peak x
    efficiency x TP)."""
    return 2.0 * r.model.active_params * tokens / (r.peak_flops * r.prefill_efficiency * r.tp)


def decode_step_time(r: Roofline, kv_tokens_read: int) -> float:
    """Seconds for one decode step that reads the weights once and ``kv_tokens_read`` tokens of KV (the sum of the
    batch's context lengths): (weight bytes / TP + KV bytes) / (HBM x efficiency)."""
    moved = r.weight_bytes_per_rank + kv_tokens_read * r.kv_bytes_per_token
    return moved / (r.gpu.hbm_tbps * 1e12 * r.decode_efficiency)


def iteration_time(r: Roofline, computed_tokens: int, kv_tokens_read: int) -> float:
    """One scheduler iteration: the roofline (larger) of its compute time over every token it computes (prefill
    chunks + one per decoding request) and its memory time (weights + the KV every scheduled request reads).
    An empty iteration takes no time."""
    if computed_tokens <= 0:
        return 0.0
    return max(prefill_time(r, computed_tokens), decode_step_time(r, kv_tokens_read))


def transfer_time(extra_bytes: float, nominal_gbps: float) -> float:
    """Seconds for ``extra_bytes`` at a transport profile's nominal GB/s (the emulated model's KV bytes that the real
    NIXL transfer of the stand-in's own, smaller KV did not move)."""
    if extra_bytes <= 0 or nominal_gbps <= 0:
        return 0.0
    return extra_bytes / (nominal_gbps * 1e9)
