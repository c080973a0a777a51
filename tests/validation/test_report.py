"""Spec: the report merges both sides of every pair, in both directions (context -> generation and the
answer's KV moving back), judges each (verified bytes, bandwidth against the transport's nominal figure,
errors), recommends a tokens_per_block only from sweep passes that agree, and always matches the JSON
Schema shipped in toolkit/validate/ (which docs/validate.md documents)."""

from __future__ import annotations

import jsonschema
import pytest

from tests.conftest import ROOT
from toolkit.api import load_plan
from toolkit.validate.params import Options, build_params
from toolkit.validate.report import build_report, load_schema, recommend, roles_of


def _params(tmp_path, read=True, version="1.3.0rc27", **opts):
    """The 4-agent stand-in recipe as a 1.3 line recipe (the Python transceiver's lists, a tokens_per_block sweep),
    with READ measured too (--read) unless read=False."""
    return build_params(load_plan("standin-2p2d", (f"trtllm_version={version}",)),
                        Options(mode="local", iterations=3, warmup=1, read=read, **opts), str(tmp_path))


def _results(params, latency_s=0.001, reverse_latency_s=None):
    """What four healthy agents write: the initiator times, the data's destination verifies."""
    res = {a["id"]: {"agent": a["id"], "role": a["role"], "host": a["id"], "final": True, "error": None,
                     "stage": "finished", "preflight": [{"name": "nixl_import", "status": "pass", "detail": "x"}],
                     "pairs": [], "sweep": [], "missing_peers": {}, "memory": {"type": "DRAM"}, "transports": []}
           for a in params["agents"]}
    n = params["warmup"] + params["iterations"]
    for r, pairs in enumerate(params["rounds"]):
        for src, dst in pairs:
            for direction in params["directions"]:
                lat = latency_s if direction == "forward" else (reverse_latency_s or latency_s)
                for op in ("WRITE", "READ"):
                    ini, ver = roles_of(src, dst, direction, op)
                    for aid in (src, dst):
                        lengths = [{"tokens": t, "bytes": t * 2048, "blocks": t // 32, "descriptors": t // 32,
                                    "latencies_s": [lat] * params["iterations"] if aid == ini else [],
                                    "prep_s": [], "bytes_verified": n * t * 2048 if aid == ver else 0,
                                    "transfers_verified": n if aid == ver else 0, "error": None}
                                   for t in params["lengths"]]
                        res[aid]["pairs"].append({"src": src, "dst": dst, "op": op, "direction": direction, "round": r,
                                                  "lengths": lengths, "error": None})
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
    assert report["passed"] and len(report["pairs"]) == 16  # 4 pairs x 2 directions x 2 ops
    assert [(p["direction"], p["op"]) for p in report["pairs"][:4]] == [
        ("forward", "WRITE"), ("forward", "READ"), ("reverse", "WRITE"), ("reverse", "READ")]
    p = report["pairs"][0]
    assert (p["src"], p["dst"], p["op"]) == ("node0", "node2", "WRITE")
    assert p["gbps"] == pytest.approx(1024 * 2048 / 0.001 / 1e9, rel=1e-3)
    assert p["bytes_verified"] == 4 * (128 + 256 + 1024) * 2048
    assert report["largest_request"]["measured_transfer_ms"] == pytest.approx(1.0, rel=1e-3)


def test_reverse_direction_keeps_context_and_generation_and_has_its_own_matrix(tmp_path):
    """The answer's KV moving back: src/dst still name the context and generation agent, the context side
    verifies, and the bandwidth matrix has a reverse part per pair (what a pull-back projection reads)."""
    params = _params(tmp_path)
    report = _report(params, _results(params, latency_s=0.001, reverse_latency_s=0.004))
    jsonschema.validate(report, load_schema())
    back = [p for p in report["pairs"] if p["direction"] == "reverse"]
    assert {(p["src"], p["dst"]) for p in back} == {(c, g) for c in ("node0", "node1") for g in ("node2", "node3")}
    assert all(p["bytes_verified"] > 0 and p["gbps"] == pytest.approx(1024 * 2048 / 0.004 / 1e9, rel=1e-3)
               for p in back)
    m = report["bandwidth_matrix"]
    assert m["op"] == "WRITE" and m["gbps"][0][0] == pytest.approx(2.097, rel=1e-3)  # forward, as tk size reads it
    rev = m["reverse"]["ops"]
    assert rev["WRITE"]["context"] == ["node0", "node1"] and rev["WRITE"]["generation"] == ["node2", "node3"]
    assert rev["READ"]["gbps"] == [[pytest.approx(0.524, rel=1e-2)] * 2] * 2
    # the largest request is a context -> generation transfer: only forward pairs count
    assert report["largest_request"]["worst_pair_gbps"] == pytest.approx(2.097, rel=1e-3)


def test_a_reverse_verification_failure_fails_only_the_reverse_op(tmp_path):
    params = _params(tmp_path)
    results = _results(params)
    rec = next(r for r in results["node0"]["pairs"]  # the context agent verifies generation -> context
               if r["op"] == "READ" and r["dst"] == "node3" and r["direction"] == "reverse")
    rec["error"] = "data mismatch node3 -> node0 READ (reverse: generation -> context), 128-token request"
    report = _report(params, results)
    jsonschema.validate(report, load_schema())
    bad = [(p["src"], p["dst"], p["direction"], p["op"]) for p in report["pairs"] if not p["passed"]]
    assert bad == [("node0", "node3", "reverse", "READ")] and not report["passed"]


def test_a_report_without_reverse_is_forward_only(tmp_path):
    params = _params(tmp_path, reverse=False)
    report = _report(params, _results(params))
    jsonschema.validate(report, load_schema())
    assert len(report["pairs"]) == 8 and {p["direction"] for p in report["pairs"]} == {"forward"}
    assert "reverse" not in report["bandwidth_matrix"]


def test_one_failed_side_fails_the_pair_and_the_run(tmp_path):
    params = _params(tmp_path)
    results = _results(params)
    rec = next(r for r in results["node2"]["pairs"]
               if r["op"] == "WRITE" and r["src"] == "node0" and r["direction"] == "forward")
    rec["error"] = "data mismatch node0 -> node2 WRITE, 128-token request: block 1"
    report = _report(params, results)
    jsonschema.validate(report, load_schema())
    bad = [p for p in report["pairs"] if not p["passed"]]
    assert not report["passed"] and [(p["src"], p["dst"], p["direction"], p["op"]) for p in bad] == [
        ("node0", "node2", "forward", "WRITE")]
    assert "data mismatch" in bad[0]["error"]


def test_a_slow_pair_fails_the_bandwidth_threshold(tmp_path):
    """WRITE decides (what TensorRT-LLM issues); a READ measured as asked is shown, labelled, and judges nothing."""
    params = _params(tmp_path)
    results = _results(params)
    report = _report(params, results, min_fraction=0.9)  # nominal tcp 3.125 GB/s; measured 2.1 GB/s
    assert not report["passed"] and report["thresholds"]["basis"] == "nominal"
    writes = [p for p in report["pairs"] if p["op"] == "WRITE"]
    reads = [p for p in report["pairs"] if p["op"] == "READ"]
    assert writes and all("below the threshold 2.812 GB/s" in p["error"] for p in writes)
    assert reads and all(p["passed"] and p["issued_by_trtllm"] is False and p["min_gbps"] is None for p in reads)


def test_read_is_reported_only_when_asked(tmp_path):
    params = _params(tmp_path, read=False)
    report = _report(params, _results(params))
    jsonschema.validate(report, load_schema())
    assert report["passed"] and {p["op"] for p in report["pairs"]} == {"WRITE"} and len(report["pairs"]) == 8
    assert report["params"]["ops"] == ["WRITE"] and set(report["bandwidth_matrix"]["ops"]) == {"WRITE"}
    assert not any("READ" in c for c in report["timing"]["caveats"])
    asked = _report(_params(tmp_path), _results(_params(tmp_path)))
    assert any("TensorRT-LLM never READs" in c for c in asked["timing"]["caveats"])


def _curve(params, results, gbps: dict, copy_s=None):
    """Curve entries as the agents write them: the context side times raw WRITEs of n descriptors at gbps[n]."""
    total = 1024 * 2048
    for rd in params["rounds"]:
        for c, g in rd:
            for n, bw in gbps.items():
                e = {"src": c, "dst": g, "descriptors": n, "descriptor_bytes": total // n, "bytes": total, "error": None}
                results[c].setdefault("curve", []).append({**e, "latencies_s": [total / (bw * 1e9)] * 3})
                results[g].setdefault("curve", []).append({**e, "latencies_s": [], "bytes_verified": total,
                                                           **({"copy_s": copy_s} if copy_s and n == 1 else {})})


def test_the_threshold_is_relative_to_one_descriptor_of_the_same_bytes_measured_on_the_pair(tmp_path):
    params = _params(tmp_path, read=False)
    results = _results(params, latency_s=0.001)  # 2.097 GB/s for the 2 MiB request
    _curve(params, results, {1: 8.0, 4: 6.0, 16: 4.0, 64: 2.0}, copy_s=0.0002)
    report = _report(params, results, min_fraction=0.5)
    th = report["thresholds"]
    assert th["basis"] == "measured" and "one descriptor of the longest request's bytes" in th["basis_text"]
    assert th["min_gbps"] == pytest.approx(4.0, rel=1e-3) and th["pairs"][0]["copy_gbps"] == pytest.approx(10.49, 1e-3)
    assert not report["passed"] and all(p["min_gbps"] == pytest.approx(4.0, rel=1e-3) for p in report["pairs"])
    assert [r["descriptors"] for r in report["curve"]] == [1, 4, 16, 64]
    assert report["curve"][0]["gbps_median"] == pytest.approx(8.0, rel=1e-3) and report["curve"][0]["pairs"] == 4


def test_no_threshold_is_said_as_none_never_as_measured(tmp_path):
    """--min-fraction 0 (or the rehearsal default: host memory, TCP): no bandwidth threshold applies, even where the
    curve measured what each pair can do; the basis says so instead of naming the measurement it did not use."""
    params = _params(tmp_path, read=False)
    results = _results(params)
    _curve(params, results, {1: 8.0, 4: 6.0})
    report = _report(params, results, min_fraction=0.0)
    jsonschema.validate(report, load_schema())
    th = report["thresholds"]
    assert th["basis"] == "none" and th["min_gbps"] == 0 and "no bandwidth threshold applies" in th["basis_text"]
    assert all(r["possible_gbps"] for r in th["pairs"])  # measured, and shown, but not a threshold's basis
    assert report["passed"]


def _staged_report(tmp_path) -> dict:
    """standin-2p2d (the 1.2 line: the C++ transceiver, staged) with every length one staged descriptor, its
    gather 0.5 ms on the source and its scatter 0.3 ms on the destination."""
    params = build_params(load_plan("standin-2p2d", ()), Options(mode="local", iterations=3, warmup=1),
                          str(tmp_path))
    results = _results(params)
    for res in results.values():
        for rec in res["pairs"]:
            for e in rec["lengths"]:
                e["staged"], e["descriptors"] = True, 1
                e["gather_s"] = [0.0005] * 3 if res["agent"] == rec["src"] else []
                e["scatter_s"] = [0.0003] * 3 if res["agent"] == rec["dst"] else []
    return _report(params, results)


def test_the_report_names_the_model_and_the_request_time_beside_the_link(tmp_path):
    report = _staged_report(tmp_path)
    jsonschema.validate(report, load_schema())
    assert report["transceiver"]["model"].startswith(
        "C++ transceiver: staged-per-rank-pair, 1 descriptor per rank pair of 2.00 MiB for the 1024-token request")
    x = report["pairs"][0]["lengths"][-1]
    assert (x["gather_p50_ms"], x["scatter_p50_ms"]) == (0.5, 0.3) and x["request_ms"] == pytest.approx(1.8)
    assert report["pairs"][0]["request_ms"] == pytest.approx(1.8)


def test_the_largest_request_counts_the_staged_gather_and_scatter(tmp_path):
    """The C++ transceiver pays a gather and a scatter around every WRITE: the largest request's measured time is
    gather + WRITE + scatter at the measured rates (the link alone beside it), and decides whether it dominates."""
    from toolkit.validate.report import largest_request

    report = _staged_report(tmp_path)
    jsonschema.validate(report, load_schema())
    lr = report["largest_request"]
    assert lr["measured_transfer_ms"] == pytest.approx(1.0, rel=1e-3)  # the link: 2 MiB at 2.097 GB/s
    assert lr["measured_request_ms"] == pytest.approx(1.8, rel=1e-3)  # + gather 0.5 + scatter 0.3, same bytes
    info = {"largest_request_tokens": 1024, "largest_request_bytes_per_rank": 4 << 20,
            "largest_request_transfer_ms": 0.67, "largest_request_prefill_ms": 3.0}
    lr = largest_request(info, report["pairs"])
    assert lr["measured_transfer_ms"] == pytest.approx(2.0, rel=1e-3) and lr["measured_request_ms"] == pytest.approx(
        3.6, rel=1e-3)
    assert lr["transfer_dominates"] is True  # 3.6 ms of gather + WRITE + scatter against a 3 ms prefill


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


# --- the tokens_per_block recommendation: only from passes that agree ---------------------------------------

def _sweep_rows(figures: dict) -> list:
    """figures: {tokens_per_block: {op: [GB/s per pass]}} -> the report's sweep rows."""
    from toolkit.validate.report import _spread

    return [{"tokens_per_block": tpb, "ops": {op: {"passes": v, **_spread(v)} for op, v in ops.items()}}
            for tpb, ops in sorted(figures.items())]


def test_a_block_size_faster_in_every_pass_is_recommended():
    rows = _sweep_rows({16: {"READ": [4.0, 4.1, 4.2]}, 32: {"READ": [5.0, 5.1, 4.9]},
                        64: {"READ": [7.9, 8.0, 8.2]}, 128: {"READ": [8.1, 8.3, 8.0]}})
    rec = recommend(rows, 32, ["READ"], shared_host=False)
    assert rec["status"] == "change" and rec["tokens_per_block"] == 64 and not rec["matches_recipe"]
    assert "every pass" in rec["reason"] and "5.000" in rec["reason"]


def test_a_difference_inside_the_spread_keeps_the_recipe_value():
    # 256's median is 40 % higher, but one of its passes is slower than one of the recipe's: noise
    rows = _sweep_rows({32: {"READ": [5.0, 5.6, 5.2]}, 256: {"READ": [7.3, 5.4, 7.0]}})
    rec = recommend(rows, 32, ["READ"], shared_host=False)
    assert rec["status"] == "keep" and rec["tokens_per_block"] == 32 and rec["matches_recipe"]
    assert "no block size is faster" in rec["reason"]


def test_inconsistent_passes_withhold_the_recommendation():
    rows = _sweep_rows({32: {"READ": [3.0, 7.0, 5.0]}, 256: {"READ": [9.0, 9.5, 9.2]}})
    rec = recommend(rows, 32, ["READ"], shared_host=False)
    assert rec["status"] == "withheld" and rec["tokens_per_block"] == 32 and "not consistent" in rec["reason"]


def test_too_few_passes_withhold_the_recommendation():
    rows = _sweep_rows({32: {"READ": [5.0, 5.1]}, 256: {"READ": [9.0, 9.5]}})
    assert recommend(rows, 32, ["READ"], shared_host=False)["status"] == "withheld"


def test_write_is_not_used_when_the_agents_share_a_host():
    """The demo's case: on one host WRITE read 0.4-0.6 GB/s at 32 and more at 256 (the destination's wake-up,
    not the transfer): no change follows from it."""
    rows = _sweep_rows({32: {"WRITE": [0.45, 0.5, 0.48], "READ": [5.2, 5.4, 5.1]},
                        256: {"WRITE": [2.0, 2.1, 2.2], "READ": [5.5, 5.3, 5.6]}})
    rec = recommend(rows, 32, ["WRITE", "READ"], shared_host=True)
    assert rec["status"] == "keep" and rec["ops"] == ["READ"] and "WRITE" in rec["excluded"]
    only_write = _sweep_rows({32: {"WRITE": [0.45, 0.5, 0.48]}, 256: {"WRITE": [2.0, 2.1, 2.2]}})
    assert recommend(only_write, 32, ["WRITE"], shared_host=True)["status"] == "withheld"
    assert recommend(rows, 32, ["WRITE", "READ"], shared_host=False)["status"] == "keep"  # the ops disagree


def test_the_shared_host_write_exclusion_never_applies_to_cuda_transports(tmp_path):
    """cuda_ipc and RDMA move the bytes themselves: a WRITE between agents of one host is not waiting for its
    destination's CPU, so WRITE (what TensorRT-LLM issues) decides there too."""
    from toolkit.validate.report import cpu_progressed

    rows = _sweep_rows({32: {"WRITE": [5.0, 5.1, 4.9]}, 256: {"WRITE": [8.0, 8.1, 8.2]}})
    rec = recommend(rows, 32, ["WRITE"], shared_host=True, cpu_progressed=False)
    assert rec["status"] == "change" and rec["tokens_per_block"] == 256 and rec["excluded"] == {}
    params = _params(tmp_path)
    vram = {"a": {"memory": {"type": "VRAM"}, "protocols": [{"op": "WRITE", "emulated": False, "scope": "intra-node"}]}}
    assert cpu_progressed(params, vram)[0] is False
    assert cpu_progressed(params, {"a": {"memory": {"type": "DRAM"}}})[0] is True
    emulated = {"a": {"agent": "a", "memory": {"type": "VRAM"},
                      "protocols": [{"op": "WRITE", "emulated": True, "scope": "intra-node"}]}}
    assert cpu_progressed(params, emulated) == (True, "UCX served WRITE by software emulation (a: intra-node)")
    for mem, floor in (("VRAM", False), ("DRAM", True)):
        results = _results(params)
        for res in results.values():
            res["memory"], res["host"] = {"type": mem}, "one-host"
        timing = _report(params, results)["timing"]
        assert timing["shared_host"] is True and timing["cpu_progressed"] is floor
        assert any("read WRITE figures as a floor" in c for c in timing["caveats"]) is floor


def test_the_curve_advises_fewer_descriptors_where_their_count_costs_the_link():
    from toolkit.validate.report import advise

    rows = [{"descriptors": n, "gbps_median": g} for n, g in ((1, 1100.0), (16, 650.0), (256, 41.0), (2048, 6.1))]
    pairs = [{"direction": "forward", "op": "WRITE", "lengths": [
        {"tokens": 8192, "bytes": 96 << 20, "descriptors": 3072, "staged": False}]}]
    python = {"runtime": "PYTHON", "label": "Python transceiver", "layout": "head-mismatch",
              "plan_pair_bytes": 512 << 20}
    adv = advise(python, rows, pairs, 32, True, "")
    assert adv["status"] == "change" and adv["bounce_size_mb"] == 512 and adv["gbps_one_descriptor"] == 1100.0
    assert "kv_transfer.bounce_size_mb: 512" in adv["reason"] and adv["gbps_at_recipe"] < 6.2
    staged = advise({"runtime": "CPP", "label": "C++ transceiver", "layout": "staged-per-rank-pair"}, rows,
                    [{"direction": "forward", "op": "WRITE", "lengths": [{"tokens": 8192, "bytes": 96 << 20,
                                                                          "descriptors": 1, "staged": True}]}], 32,
                    True, "")
    assert staged["status"] == "keep" and "one descriptor per rank pair" in staged["reason"]
    assert advise(python, rows, pairs, 32, False, "the agents share a host")["status"] == "withheld"


def test_a_descriptor_count_beyond_the_curve_is_read_at_its_own_count():
    """Llama-3.1-8B TP1 -> TP2 on the Python transceiver: 3072 descriptors as validated (16384 at full depth), past
    the curve's 2048. Each descriptor costs its time on top of the bytes (the curve's last two points give how
    much), so the recipe's count is slower than the 2048-descriptor point, not equal to it."""
    from toolkit.validate.report import advise

    rows = [{"descriptors": n, "gbps_median": g} for n, g in ((1, 1110.0), (1024, 9.4), (2048, 6.1))]
    nbytes = 96 << 20
    pairs = [{"direction": "forward", "op": "WRITE", "lengths": [
        {"tokens": 8192, "bytes": nbytes, "descriptors": 3072, "staged": False}]}]
    adv = advise({"runtime": "PYTHON", "label": "Python transceiver", "layout": "head-mismatch"}, rows, pairs, 32,
                 True, "")
    per_descriptor = (nbytes / 6.1e9 - nbytes / 9.4e9) / 1024
    assert adv["gbps_at_recipe"] == pytest.approx(nbytes / (nbytes / 6.1e9 + 1024 * per_descriptor) / 1e9, rel=1e-3)
    assert adv["gbps_at_recipe"] < 4.6


def test_the_sweep_rows_carry_every_pass_per_op(tmp_path):
    params = _params(tmp_path)
    results = _results(params)
    ctx, gen = params["rounds"][0][0]
    for n in range(3):
        for tpb in params["sweep"]["tokens_per_block"]:
            for op in ("WRITE", "READ"):
                ini = ctx if op == "WRITE" else gen
                results[ini]["sweep"].append({"src": ctx, "dst": gen, "op": op, "pass": n, "tokens_per_block": tpb,
                                              "bytes": 2 << 20, "descriptors": 1024 // tpb,
                                              "latencies_s": [0.001 * (1 + n / 100)] * 5, "error": None})
    report = _report(params, results)
    jsonschema.validate(report, load_schema())
    row = report["sweep"][0]
    assert row["passes"] == 3 and len(row["ops"]["READ"]["passes"]) == 3 and row["ops"]["WRITE"]["spread"] < 0.03
    assert report["recommendation"]["status"] == "keep"  # every block size measured the same
    assert report["timing"]["shared_host"] is False and report["timing"]["slots"] >= 1


def test_a_sweep_transfer_whose_bytes_did_not_verify_fails_the_run_and_times_nothing(tmp_path):
    params = _params(tmp_path)
    results = _results(params)
    ctx, gen = params["rounds"][0][0]
    tpbs = params["sweep"]["tokens_per_block"]
    for n in range(3):
        for tpb in tpbs:
            bad = n == 1 and tpb == tpbs[-1]  # one pass of one block size: a corrupted block, caught on the target
            results[ctx]["sweep"].append({"src": ctx, "dst": gen, "op": "WRITE", "pass": n, "tokens_per_block": tpb,
                                          "bytes": 2 << 20, "descriptors": 1024 // tpb,
                                          "latencies_s": [0.0001 if bad else 0.001] * 5,
                                          "error": "block 3 differs at byte 17" if bad else None})
    report = _report(params, results)
    jsonschema.validate(report, load_schema())
    assert report["passed"] is False
    assert any(f.startswith(f"tokens_per_block sweep {tpbs[-1]}:") and "block 3 differs" in f
               for f in report["failures"])
    row = next(r for r in report["sweep"] if r["tokens_per_block"] == tpbs[-1])
    # the failed pass's ten-times-faster figure is not a measurement: only the two verified passes are timed, and
    # no block size is recommended from it
    assert row["ops"]["WRITE"]["passes"] == [2.0972, 2.0972]
    assert report["recommendation"]["status"] == "keep"
