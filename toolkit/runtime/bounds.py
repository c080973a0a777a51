"""Every number a user gives has a finite range: NaN and infinity never turn a bound or a check off."""

from __future__ import annotations

import math

from toolkit.errors import TkError

# The longest any wait may be told to last: a week.
MAX_WAIT_S = 7 * 24 * 3600.0


class BoundError(TkError):
    exit_code = 2


def finite(name: str, value: float | None, low: float, high: float) -> float | None:
    """value itself, or a BoundError naming the option, its range and what was given; None passes."""
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise BoundError(f"{name}: {value!r} is not a number; give a value from {low:g} to {high:g}") from None
    except OverflowError:  # an int too large for a float (10**400)
        raise BoundError(f"{name}: {str(value)[:20]}... is out of range; give a value from {low:g} to {high:g}") \
            from None
    if not math.isfinite(v) or not (low <= v <= high):
        raise BoundError(f"{name}: {value!r} is out of range; give a value from {low:g} to {high:g}")
    return v


def wait_seconds(name: str, value: float | None) -> float | None:
    """A wait in seconds: more than 0, at most a week."""
    v = finite(name, value, 0.0, MAX_WAIT_S)
    if v is not None and v <= 0:
        raise BoundError(f"{name}: {value!r} must be more than 0 seconds (at most {MAX_WAIT_S:g})")
    return v
