"""Spec: `tk bench` gives a verdict you can trust, with NVIDIA's aiperf as the load engine, on the real dev Slurm
cluster and on the local backend (the stand-in with its shipped tokenizer):

- a fixed workload against a deployment tk bench launches itself passes (exit 0) with a valid verdict, and
  writes results JSON/CSV, verdict.json, valid PNG plots and a report linking them; the deployment is stopped;
- an SLA that cannot be met exits 1 naming the metric;
- a deployment whose generation servers receive no KV (every request sent to them whole) exits 2, "not
  disaggregated";
- a deployment that answers streams with zero tokens exits 2;
- the aggregated baseline on the same GPUs runs the identical workload, and the greedy answers agree.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tests.integration.helpers import ROOT, processes_mentioning, tk, wait_until

pytest.importorskip("aiperf")

pytestmark = [pytest.mark.slow, pytest.mark.nixl]

RECIPE = str(ROOT / "recipes" / "standin-2p2d.yaml")
SMALL = ["--isl", "64", "--osl", "8", "--concurrency", "2", "--requests", "16"]


@pytest.fixture(params=[pytest.param("slurm", marks=pytest.mark.slurm), "local"])
def backend(request):
    if request.param == "slurm":
        request.getfixturevalue("dev_slurm")
        return ["--set", "cluster.partition=dev"]
    return ["--local"]


def bench(tmp_path, backend, *args, env=None, timeout=400):
    run_dir = tmp_path / "run"
    proc = tk("bench", RECIPE, *backend, "--run-dir", str(run_dir), *SMALL, *args, "--json",
              env={"TK_RUNS_DIR": str(tmp_path / "runs"), **(env or {})}, timeout=timeout)
    # tk bench RECIPE stops what it launched, whatever the verdict
    wait_until(lambda: not processes_mentioning(str(run_dir)), 60,
               lambda: f"the benchmarked deployment to be stopped (left: {processes_mentioning(str(run_dir))})")
    doc = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    return proc, doc, run_dir


def is_png(path: Path) -> bool:
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return False
    width, height = struct.unpack(">II", data[16:24])
    import matplotlib.image as mpimg
    return width > 100 and height > 100 and mpimg.imread(path).shape[:2] == (height, width)


def test_a_fixed_workload_passes_with_a_valid_verdict_and_every_output(tmp_path, backend):
    proc, doc, run_dir = bench(tmp_path, backend)
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdict = doc["verdict"]
    assert verdict["exit_code"] == 0 and verdict["passed"], verdict
    stages = {c["stage"] for c in verdict["checks"]}
    assert {"validity", "disaggregation"} <= stages and all(c["ok"] for c in verdict["checks"])
    out = Path(doc["bench_dir"])
    assert out.parent == run_dir / "bench"
    on_disk = json.loads((out / "verdict.json").read_text())
    assert on_disk["exit_code"] == 0 and on_disk["checks"] == verdict["checks"]
    results = json.loads((out / "results.json").read_text())
    cell = next(iter(results["cells"].values()))
    assert cell["requests"] == 16 and cell["errors"] == 0
    assert cell["metrics"]["output_sequence_length"]["avg"] == 8
    assert (out / "results.csv").read_text().count("\n") >= 2
    pngs = sorted(out.glob("*.png"))
    assert pngs and all(is_png(p) for p in pngs), pngs
    report = (out / "report.md").read_text()
    for png in pngs:
        assert f"]({png.name})" in report
    proof = doc["proof"]
    assert proof["context_legs"] >= 16 and proof["generation_legs"] >= 16 and proof["kv_transfers"] >= 16


def test_an_sla_that_cannot_be_met_exits_1_naming_the_metric(tmp_path, backend):
    proc, doc, _ = bench(tmp_path, backend, "--sla", "ttft_p99_ms=0.001,itl_p99_ms=100000")
    assert proc.returncode == 1, proc.stderr[-3000:]
    missed = [c for c in doc["verdict"]["checks"] if not c["ok"]]
    assert [c["stage"] for c in missed] == ["sla"] and "ttft_p99_ms" in missed[0]["reason"]


def test_generation_servers_that_receive_no_kv_make_the_run_invalid_not_disaggregated(tmp_path, backend):
    # The stand-in proxy's test fault sends every request whole to a generation server: it answers, but no
    # context leg runs and no KV moves. Counted by the proxy and the workers themselves. (Short prompts: the
    # generation servers' max_num_tokens, 32 in this recipe, must admit the whole prefill.)
    proc, doc, _ = bench(tmp_path, backend, "--isl", "16", env={"TK_STANDIN_FAULT": "skip_context"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    failed = [c for c in doc["verdict"]["checks"] if not c["ok"]]
    assert failed and all(c["stage"] == "disaggregation" for c in failed), failed
    assert "not disaggregated" in doc["verdict"]["summary"]


def test_answers_with_zero_tokens_make_the_run_invalid(tmp_path, backend):
    proc, doc, _ = bench(tmp_path, backend, "--set", "generation.env.TK_STANDIN_FAULT=empty_stream")
    assert proc.returncode == 2, proc.stderr[-3000:]
    failed = [c for c in doc["verdict"]["checks"] if not c["ok"]]
    # aiperf itself counts a stream with no content as a failed request ("no responses with actual content"); a
    # non-streamed zero-token answer is caught by tk's no_zero_token_answers (tests/unit/test_bench.py)
    assert failed and {c["stage"] for c in failed} == {"validity"}, failed
    assert any(c["name"] in ("no_zero_token_answers", "requests_succeeded", "error_rate") for c in failed)
    assert doc["verdict"]["summary"].startswith("INVALID")


def test_the_aggregated_baseline_runs_the_same_workload_and_the_answers_agree(tmp_path, backend):
    proc, doc, _ = bench(tmp_path, backend, "--baseline", "aggregated", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    base = doc["baseline"]
    assert base["answers"]["agree"], base["answers"]["pairs"]
    assert base["gpus"] == doc["gpus"], "the baseline runs on as many GPUs as the deployment"
    assert base["verdict"]["exit_code"] == 0
    out = Path(doc["bench_dir"])
    assert any(p.name.startswith("baseline-") for p in (out / "aiperf").iterdir())
    assert "aggregated" in (out / "report.md").read_text()
