"""Spec: `tk bench --workload multi-turn` measures what a disaggregated deployment recomputes turn by turn, from the
servers' own counts, on the real dev Slurm cluster and locally (the stand-in with emulated timing of
Llama-3.1-8B-Instruct on H100, recipes/standin-multiturn.yaml, TensorRT-LLM 1.3 protocol: the client sees the
context server's cached_tokens):

- with the kv_cache_aware context router, cached tokens > 0 from turn 2 on, and the recomputed answer tokens are
  one answer per turn (the previous one: generated on the generation server);
- with round robin over the two context servers (block reuse off, as tk renders it), cached tokens stay about 0
  and the recomputed answers grow by one answer per turn;
- one `--compare` command runs both, with a table, a plot and a recommendation;
- conditional disaggregation prefills the short deltas on the generation server, which holds the answers;
- the report carries the pull-back projection with its inputs (the reverse bandwidth of a validation report).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.helpers import ROOT, processes_mentioning, tk, wait_until
from toolkit.facts import versions

pytest.importorskip("aiperf")
pytestmark = [pytest.mark.slow, pytest.mark.nixl]
if "1.3" not in versions.supported():
    pytest.skip("the 1.3 line (ctx_usage, conversation router) is not in this tk", allow_module_level=True)

RECIPE = str(ROOT / "recipes" / "standin-multiturn.yaml")
OSL = 32
TURNS = 3
LOAD = ["--workload", "multi-turn", "--isl", "128", "--osl", str(OSL), "--turns", str(TURNS), "--concurrency", "2",
        "--set", "trtllm_version=1.3"]
FIXTURE = ROOT / "tests" / "fixtures" / "validate" / "report-bidirectional.json"


def run(tmp_path, *args, timeout=480):
    run_dir = tmp_path / "run"
    proc = tk("bench", RECIPE, "--run-dir", str(run_dir), *LOAD, *args, "--json",
              env={"TK_RUNS_DIR": str(tmp_path / "runs")}, timeout=timeout)
    wait_until(lambda: not processes_mentioning(str(run_dir)), 60,
               lambda: f"the benchmarked deployments to be stopped (left: {processes_mentioning(str(run_dir))})")
    doc = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    return proc, doc


@pytest.mark.parametrize("backend", ["slurm", "local"])
def test_reuse_per_turn_with_a_reuse_preserving_router_and_the_projection(tmp_path, backend, request):
    where = ["--local"]
    if backend == "slurm":
        request.getfixturevalue("dev_slurm")
        where = ["--set", "cluster.partition=dev"]
    proc, doc = run(tmp_path, *where, "--validation", str(FIXTURE))
    assert proc.returncode == 0, proc.stderr[-3000:]
    turns = doc["turns"]
    assert [t["turn"] for t in turns] == list(range(1, TURNS + 1))
    for key in ("turn", "prompt_tokens", "cached_tokens", "reusable_tokens", "recomputed_tokens",
                "recomputed_answer_tokens", "ttft_p50_ms", "ttft_p99_ms"):
        assert all(t.get(key) is not None for t in turns), key
    assert turns[0]["reusable_tokens"] == 0
    for t in turns[1:]:
        assert t["cached_tokens"] > 0 and t["cached_tokens"] >= t["reusable_tokens"] - OSL - 1
        assert t["recomputed_answer_tokens"] == OSL  # the previous answer, generated elsewhere
    pb = doc["pullback_projection"]
    assert pb["label"].startswith("projection") and pb["inputs"]["reverse_gbps"] == 1.25
    assert pb["inputs"]["reverse_source"] == "measured" and [r["turn"] for r in pb["turns"]] == [2, 3]
    report = (Path(doc["bench_dir"]) / "report.md").read_text()
    assert "## Multi-turn reuse" in report and "a projection" in report and "turns.png" in report
    assert all(c["ok"] for c in doc["verdict"]["checks"] if c["stage"] == "reuse"), doc["verdict"]["checks"]


def test_one_compare_command_measures_the_routers_side_by_side(tmp_path):
    proc, doc = run(tmp_path, "--local", "--compare", "router=round_robin,kv_cache_aware", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {ln["variant"]: ln for ln in doc["variants"]}
    rr, kv = lines["router=round_robin"], lines["router=kv_cache_aware"]
    assert rr["valid"] and kv["valid"]
    # round robin over two context servers, block reuse off: nothing of the history is reused, and every earlier
    # answer is recomputed; kv_cache_aware: only the previous answer
    assert all(t["cached_tokens"] <= 1 for t in rr["turns"])
    assert [t["recomputed_answer_tokens"] for t in rr["turns"]] == [0, OSL, 2 * OSL]
    assert [t["recomputed_answer_tokens"] for t in kv["turns"]] == [0, OSL, OSL]
    assert kv["reuse_share"] > 0.5 and "reuse_vs_theoretical" in rr["findings"]
    assert doc["recommendation"]["variant"] is not None
    out = Path(doc["compare_dir"])
    md = (out / "compare.md").read_text()
    assert "**Recommendation:" in md and "| router=round_robin | 3 |" in md
    assert (out / "compare_turns.png").stat().st_size > 1000


def test_conditional_disaggregation_prefills_the_deltas_where_the_answers_are(tmp_path):
    proc, doc = run(tmp_path, "--local", "--set", "proxy.conditional_max_local_prefill_length=512",
                    "--set", "proxy.generation_router=kv_cache_aware")
    assert proc.returncode in (0, 2), proc.stderr[-3000:]
    # later turns go to the generation server whole: not every request took a context leg (the verdict says so)
    assert doc["proof"]["local_prefill"] > 0
    for t in doc["turns"][1:]:
        assert t["recomputed_answer_tokens"] <= 1  # the generation server held the answers it generated
