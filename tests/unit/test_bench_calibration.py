"""Spec: benchmarks/bench_calibration.py's ``--report`` writes the table docs/standin.md shows, column for column."""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import SourceFileLoader

from tests.conftest import ROOT


def _script(monkeypatch):
    loader = SourceFileLoader("bench_calibration", str(ROOT / "benchmarks/bench_calibration.py"))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("bench_calibration", loader))
    monkeypatch.setitem(sys.modules, "bench_calibration", mod)  # its dataclasses look their module up
    monkeypatch.setattr(sys, "path", list(sys.path))  # it puts the repository first
    loader.exec_module(mod)
    return mod


def _doc_table() -> list[str]:
    doc = (ROOT / "docs/standin.md").read_text()
    return [line for line in doc.splitlines() if line.startswith("| configuration (1P1D) |")
            or line.startswith("| Llama-3.3-70B, H100, TP4 | 1 |")]


def test_the_report_prints_the_docs_calibration_table_with_every_column(monkeypatch):
    bench = _script(monkeypatch)
    header, row = _doc_table()
    # the docs' 70B c=1 cell, as calibration.json holds it (the probes' iterations included)
    rep = {"configs": {"Llama-3.3-70B, H100, TP4": {
        "control": {"ttft_p50_ms": 8.541779},
        "cells": {"1": {
            "measured": {"ttft_p50_ms": 161.358847, "ttft_p99_ms": 167.143229, "itl_p50_ms": 15.784419,
                         "output_tokens_per_s_per_gpu": 6.850162},
            "predicted": {"ttft_ms": 145.455014, "tpot_ms": 15.813722, "tokens_s_gpu": 7.006975},
            "formed": {"batches": [{"requests": 1, "tokens": 3, "iterations": 5, "aic_ms": 16.732,
                                    "emulated_ms_mean": 16.732},  # the liveness probes: not prompts
                                   {"requests": 1, "tokens": 2050, "iterations": 8, "aic_ms": 145.455,
                                    "emulated_ms_mean": 145.455}], "wait_ms_mean": 0.058824}}}}}}
    lines = bench.markdown(rep).splitlines()
    assert lines[0] == header
    assert lines[1].count("---") == header.count(" | ") + 1
    assert lines[2] == row
