"""Small statistics shared by the agent and the coordinator. Standard library only."""

from __future__ import annotations


def percentile(values, q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of a list of numbers; None when empty."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
