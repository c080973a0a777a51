"""Spec: the report merges both sides of every pair, judges each pair (verified bytes, bandwidth against
the transport's nominal figure, errors), and always matches the JSON Schema shipped in tk/validation/
(which docs/validate.md documents)."""

from __future__ import annotations

import jsonschema
import pytest

from tests.conftest import ROOT
from toolkit.api import load_plan
from toolkit.validate.params import Options, build_params
from toolkit.validate.report import build_report, load_schema


def _params(tmp_path):
    return build_params(load_plan("standin-2p2d", ()), Options(mode="local", iterations=3, warmup=1),
                        str(tmp_path))


def _results(params, latency_s=0.001):
    """What four healthy agents write: the initiator times, the destination verifies."""
    res = {a["id"]: {"agent": a["id"], "role": a["role"], "host": "h", "final": True, "error": None,
                     "stage": "finished", "preflight": [{"name": "nixl_import", "status": "pass", "detail": "x"}],
                     "pairs": [], "sweep": [], "missing_peers": {}, "memory": {"type": "DRAM"}, "transports": []}
           for a in params["agents"]}
    n = params["warmup"] + params["iterations"]
    for r, pairs in enumerate(params["rounds"]):
        for src, dst in pairs:
            for op in ("WRITE", "READ"):
                ini = src if op == "WRITE" else dst
                for aid in (src, dst):
                    lengths = [{"tokens": t, "bytes": t * 2048, "blocks": t // 32, "descriptors": t // 32,
                                "latencies_s": [latency_s] * params["iterations"] if aid == ini else [],
                                "prep_s": [], "bytes_verified": n * t * 2048 if aid == dst else 0,
                                "transfers_verified": n if aid == dst else 0, "error": None}
                               for t in params["lengths"]]
                    res[aid]["pairs"].append({"src": src, "dst": dst, "op": op, "round": r, "lengths": lengths,
                                              "error": None})
    return res


def _report(params, results, exits=None, min_fraction=0.0):
    plan_info = {"largest_request_tokens": 1024, "largest_request_bytes_per_rank": 1024 * 2048,
                 "largest_request_transfer_ms": 0.67, "largest_request_prefill_ms": 512.0}
    run = {"mode": "local", "recipe_file": "r.yaml", "run_dir": "/x", "report_file": "/x/report.json",
           "job_id": None, "started": "now", "duration_s": 1.0, "cleanup": {"released": True, "problems": []}}
    return build_report(params=params, results=results, exits=exits or {a: "0" for a in results},
                        coordinator_preflight=[], plan_info=plan_info, min_fraction=min_fraction, run=run)


def test_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(load_schema())


def test_a_healthy_run_passes_and_matches_the_schema(tmp_path):
    params = _params(tmp_path)
    report = _report(params, _results(params))
    jsonschema.validate(report, load_schema())
    assert report["passed"] and len(report["pairs"]) == 8
    p = report["pairs"][0]
    assert (p["src"], p["dst"], p["op"]) == ("node0", "node2", "WRITE")
    assert p["gbps"] == pytest.approx(1024 * 2048 / 0.001 / 1e9, rel=1e-3)
    assert p["bytes_verified"] == 4 * (128 + 256 + 1024) * 2048
    assert report["largest_request"]["measured_transfer_ms"] == pytest.approx(1.0, rel=1e-3)


def test_one_failed_side_fails_the_pair_and_the_run(tmp_path):
    params = _params(tmp_path)
    results = _results(params)
    rec = next(r for r in results["node2"]["pairs"] if r["op"] == "WRITE" and r["src"] == "node0")
    rec["error"] = "data mismatch node0 -> node2 WRITE, 128-token request: block 1"
    report = _report(params, results)
    jsonschema.validate(report, load_schema())
    bad = [p for p in report["pairs"] if not p["passed"]]
    assert not report["passed"] and [(p["src"], p["dst"], p["op"]) for p in bad] == [("node0", "node2", "WRITE")]
    assert "data mismatch" in bad[0]["error"]


def test_a_slow_pair_fails_the_bandwidth_threshold(tmp_path):
    params = _params(tmp_path)
    results = _results(params)
    report = _report(params, results, min_fraction=0.9)  # nominal tcp 3.125 GB/s; measured 2.1 GB/s
    assert not report["passed"]
    assert all("below the threshold" in p["error"] for p in report["pairs"])


def test_an_agent_that_never_reported_is_named(tmp_path):
    params = _params(tmp_path)
    results = _results(params)
    results["node3"] = None
    for r in ("node0", "node1"):
        results[r]["missing_peers"] = {"node3": "node3 never showed up: no metadata after 5s"}
    report = _report(params, results, exits={"node0": "0", "node1": "0", "node2": "0", "node3": None})
    jsonschema.validate(report, load_schema())
    assert not report["passed"]
    failed = {(p["src"], p["dst"]) for p in report["pairs"] if not p["passed"]}
    assert failed == {("node0", "node3"), ("node1", "node3")}
    assert any(i["name"] == "agent" and i["agent"] == "node3" and "never showed up" in i["detail"]
               for i in report["preflight"])


def test_a_preflight_failure_fails_the_run(tmp_path):
    params = _params(tmp_path)
    results = _results(params)
    results["node1"]["preflight"].append({"name": "ucx_transport", "status": "fail", "detail": "TCP fallback"})
    report = _report(params, results)
    assert not report["passed"] and all(p["passed"] for p in report["pairs"])


def test_the_docs_describe_every_top_level_field():
    text = (ROOT / "docs" / "validate.md").read_text()
    for name in load_schema()["required"]:
        assert f"`{name}`" in text, f"docs/validate.md does not describe `{name}`"
