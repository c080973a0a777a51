"""Spec: benchmarks/bench_validate.py judges the validator's median ratio to a raw NIXL loop against its
95 % target only when the raw/raw control is quieter than the margin being judged (its median's distance
from 100 %, or the standard error of a median given its spread); otherwise the verdict is "inconclusive",
in the summary and in the printed line."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import ROOT

spec = importlib.util.spec_from_file_location("bench_validate", ROOT / "benchmarks" / "bench_validate.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _data(validator: list, control: list) -> dict:
    """Rounds 0..n (round 0 discarded): GB/s per kind, raw at 10 GB/s."""
    rows = []
    for rnd, (v, c) in enumerate(zip([1.0, *validator], [1.0, *control])):
        gbps = {"validator": 10 * v, "raw": 10, "raw again": 10 * c, "raw 1 slot": 18, "raw 1 slot paused": 15}
        for kind, g in gbps.items():
            rows.append({"round": rnd, "direction": "forward", "op": "WRITE", "kind": kind, "bytes": 10**9,
                         "latencies_s": [1 / g]})
    return {"rows": rows}


def _verdict(validator, control):
    lines, (v,) = bench.summarize(_data(validator, control), discard=1)
    return v, lines[0]


def test_a_ratio_clear_of_the_target_by_more_than_the_control_strays_meets_it():
    v, line = _verdict([1.0, 0.99, 1.01, 1.0, 0.98], [1.0, 1.01, 1.15, 0.86, 1.0])  # single rounds stray 15 %
    assert (v["verdict"], v["meets_target"]) == ("meets", True) and ">= 95 %" in line


def test_a_ratio_below_the_target_by_more_than_the_noise_misses_it():
    v, line = _verdict([0.8, 0.82, 0.79], [1.0, 1.01, 0.99])
    assert (v["verdict"], v["meets_target"]) == ("below", False) and "BELOW 95 %" in line


@pytest.mark.parametrize("validator, control", [
    ([0.96, 0.97, 0.96], [0.98, 0.97, 0.98]),  # 1.5 % above the target, the control 2 % off
    ([0.94, 0.93, 0.94], [1.02, 1.03, 1.02]),  # 1 % below it, the control 2 % off
    ([1.0, 1.0, 1.0], [1.06, 1.07, 1.05]),  # 5 % above it, the control 6 % off
    ([0.97, 0.98, 0.97, 0.96, 0.97], [0.85, 1.15, 0.86, 1.14, 1.0]),  # a control centred on 100 %, but all over
])
def test_a_control_that_strays_as_far_as_the_margin_makes_it_inconclusive(validator, control):
    v, line = _verdict(validator, control)
    assert (v["verdict"], v["meets_target"]) == ("inconclusive", None)
    assert "INCONCLUSIVE" in line and "95 %" in line and ">= 95 %" not in line and "BELOW" not in line
