"""Spec: `tk size --measured` (toolkit/size/transfer.py `measured`, the transfer term of every disaggregated candidate)
costs a request as TensorRT-LLM's transceiver moves it. Where a validation report carries the staged transceiver's
per-request time (the C++ transceiver, or the Python one's bounce buffer: the request gathered into one region, ONE
WRITE, scattered on arrival; each pair's longest request's `request_ms` = gather + WRITE + scatter), the term uses that
time, scaled by bytes from the longest validated request; where it does not (descriptor lists, reports written before
the staged model), the link's GB/s as before. Which basis was used is said (the JSON's `bandwidth.basis`, the line tk
size prints). Pure: report files in tmp_path, nothing spawned."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from toolkit.facts.models import BUILTIN_MODELS
from toolkit.size import add_transfer, transfer
from toolkit.size.candidates import Candidate, RoleShape

MIB = 1 << 20
LLAMA8 = BUILTIN_MODELS["meta-llama/Llama-3.1-8B-Instruct"]


def _length(tokens: int, nbytes: int, transfer_ms: float, gather_ms=None, scatter_ms=None, staged=True) -> dict:
    """One request length of a pair as `tk validate cluster` writes it (toolkit/validate/report.py merge_pairs)."""
    request = round((gather_ms or 0) + transfer_ms + (scatter_ms or 0), 4)
    return {"tokens": tokens, "bytes": nbytes, "blocks": tokens // 32, "descriptors": 1 if staged else tokens // 32,
            "iterations": 5, "gbps": round(nbytes / (transfer_ms / 1e3) / 1e9, 4), "latency_p50_ms": transfer_ms,
            "staged": staged, "gather_p50_ms": gather_ms, "scatter_p50_ms": scatter_ms, "request_ms": request,
            "error": None}


def _pair(ctx: str, gen: str, lengths: list[dict], direction="forward", op="WRITE") -> dict:
    longest = lengths[-1]
    return {"src": ctx, "dst": gen, "op": op, "direction": direction, "gbps": longest["gbps"],
            "request_ms": longest["request_ms"], "passed": True, "error": None, "lengths": lengths}


def _report(tmp_path: Path, pairs: list[dict], largest: dict | None = None) -> Path:
    """A report with the fields the reader looks at: its forward WRITE matrix (link GB/s), the pairs, and, where the
    run wrote one, `largest_request`."""
    fwd = [p for p in pairs if p["direction"] == "forward" and p["op"] == "WRITE"]
    doc = {"kind": "tk-validate-cluster", "passed": True, "thresholds": {"transport": "nvlink-single-node"},
           "bandwidth_matrix": {"op": "WRITE", "context": sorted({p["src"] for p in fwd}),
                                "generation": sorted({p["dst"] for p in fwd}),
                                "gbps": [[p["gbps"]] for p in fwd]},
           "pairs": pairs}
    if largest is not None:
        doc["largest_request"] = largest
    d = tmp_path / "val"
    d.mkdir(exist_ok=True)
    (d / "report.json").write_text(json.dumps(doc))
    return d


# The C++ transceiver's 8192-token request of one rank pair: 64 MiB gathered in 2 ms, written in 16 ms, scattered in
# 2 ms (figures of the shape gpu-findings-4 measured on an H100; the link alone is 4.19 GB/s, the request 3.36 GB/s).
STAGED = [_length(2048, 16 * MIB, 4.0, 0.5, 0.5), _length(8192, 64 * MIB, 16.0, 2.0, 2.0)]


def test_a_staged_report_costs_the_request_as_the_transceiver_moves_it(tmp_path):
    d = _report(tmp_path, [_pair("ctx0", "gen0", STAGED)])
    bw = transfer.measured(d)
    per_ms = 64 * MIB / 20.0  # bytes per ms of the longest validated request: gather + WRITE + scatter
    assert bw.basis == "request" and bw.gbps == pytest.approx(per_ms * 1e3 / 1e9, rel=1e-6)
    assert bw.link_gbps == pytest.approx(STAGED[-1]["gbps"], rel=1e-6)  # the link figure is kept beside it
    # the transfer term: the candidate's bytes at the request's milliseconds per byte
    [c] = add_transfer([_candidate()], LLAMA8, 8000, bw.gbps)
    nbytes = transfer.bytes_per_token(LLAMA8, "auto") * 8000
    assert c.transfer_ms == pytest.approx(nbytes / per_ms, rel=1e-5)
    assert c.transfer_ms > nbytes / (bw.link_gbps * 1e9) * 1e3  # more than the link alone: gather and scatter count


def test_the_basis_is_said_in_the_json_and_the_line_tk_size_prints(tmp_path):
    bw = transfer.measured(_report(tmp_path, [_pair("ctx0", "gen0", STAGED)]))
    doc = bw.to_dict()
    assert doc["basis"] == "request" and doc["link_gbps"] == bw.link_gbps
    assert "gather + WRITE + scatter" in doc["basis_text"]
    line = bw.describe()
    assert f"{bw.gbps:g} GB/s" in line and "gather + WRITE + scatter" in line and f"link {bw.link_gbps:g} GB/s" in line
    nominal = transfer.nominal("infiniband")
    assert nominal.basis == "link" and nominal.to_dict()["basis"] == "link" and "50 GB/s (link)" in nominal.describe()


def test_the_slowest_or_median_pair_s_request_time(tmp_path):
    slow = [_length(8192, 64 * MIB, 16.0, 6.0, 6.0)]  # 28 ms
    mid = [_length(8192, 64 * MIB, 16.0, 4.0, 4.0)]  # 24 ms
    d = _report(tmp_path, [_pair("ctx0", "gen0", STAGED), _pair("ctx1", "gen0", slow), _pair("ctx2", "gen0", mid)])
    assert transfer.measured(d).gbps == pytest.approx(64 * MIB / 28e-3 / 1e9, rel=1e-6)
    assert transfer.measured(d, "median").gbps == pytest.approx(64 * MIB / 24e-3 / 1e9, rel=1e-6)
    assert "slowest of 3" in transfer.measured(d).detail


def test_descriptor_lists_and_older_reports_keep_the_link_figure(tmp_path):
    lists = [_length(8192, 64 * MIB, 16.0, staged=False)]
    bw = transfer.measured(_report(tmp_path, [_pair("ctx0", "gen0", lists)]))
    assert bw.basis == "link" and bw.gbps == lists[-1]["gbps"] and bw.link_gbps == bw.gbps
    older = _pair("ctx0", "gen0", STAGED)
    for key in ("lengths", "request_ms"):  # written before the staged model: the link alone
        older.pop(key)
    bw = transfer.measured(_report(tmp_path, [older]))
    assert bw.basis == "link" and bw.gbps == STAGED[-1]["gbps"]
    untimed = [_length(8192, 64 * MIB, 16.0, gather_ms=4.0, scatter_ms=None)]  # request_ms would be WRITE + gather
    bw = transfer.measured(_report(tmp_path, [_pair("ctx0", "gen0", untimed)]))
    assert bw.basis == "link" and bw.gbps == untimed[-1]["gbps"]


def test_the_reverse_direction_keeps_the_link_figure(tmp_path):
    """The pull-back projection (tk bench --validation) reads the reverse pairs: TensorRT-LLM has no such transfer, so
    no transceiver's request time applies to it."""
    d = _report(tmp_path, [_pair("ctx0", "gen0", STAGED), _pair("ctx0", "gen0", STAGED, direction="reverse")])
    bw = transfer.measured(d, direction="reverse")
    assert bw.basis == "link" and bw.gbps == STAGED[-1]["gbps"]


@pytest.mark.parametrize("field,value", [("request_ms", math.nan), ("request_ms", -1.0), ("request_ms", 10**400),
                                         ("request_ms", "20"), ("request_ms", 0), ("bytes", 0), ("bytes", 2.5),
                                         ("bytes", 10**400), ("request_ms", 1e-9)],
                         ids=lambda v: repr(v)[:20])
def test_a_request_time_that_is_not_one_is_refused_naming_the_file_and_field(tmp_path, field, value):
    lengths = [dict(x) for x in STAGED]
    lengths[-1][field] = value
    with pytest.raises(transfer.MeasuredError, match=rf"report\.json: pairs\[0\]\.lengths\[1\]\.{field}"):
        transfer.measured(_report(tmp_path, [_pair("ctx0", "gen0", lengths)]))


def _candidate() -> Candidate:
    one = RoleShape(workers=1, tp=1, pp=1, dp=1, moe_tp=1, moe_ep=1, batch=1, kvcache="bfloat16")
    return Candidate(mode="disagg", replicas=1, gpus_used=2, ctx=one, gen=one, concurrency=8, ttft_ms=200.0,
                     tpot_ms=20.0, tokens_s_gpu=100.0, tokens_s_user=50.0, is_moe=False, trtllm_version="1.3.0rc20")
