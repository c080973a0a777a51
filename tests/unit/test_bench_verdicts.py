"""Spec: tk bench verdicts that must not lie (issue 21, M1-M4, M10) and bench inputs and outputs that stay inside the
run directory (m8, m9, M5's stale staging). Pure: nothing is spawned."""

from __future__ import annotations

import errno
import json
import os
import socket
from pathlib import Path

import pytest

from toolkit.bench import probe as probes
from toolkit.bench.compare import answers_agree
from toolkit.bench.results import read_export
from toolkit.bench.verdict import decide
from toolkit.bench.workload import BenchInputError, Limits, build_workload
from toolkit.errors import TkError

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "aiperf"


def _stats(n, *, pid=1, gen1=None, proxy_pid=100):
    """Cumulative /standin/stats of a 1+2 deployment after n requests, every leg taken."""
    doc = {"proxy": {"instance": {"pid": proxy_pid, "started": proxy_pid}, "requests": n, "disaggregated": n,
                     "local_prefill": 0, "errors": 0},
           "ctx-0": {"instance": {"pid": pid, "started": 1.0}, "requests": {"context_only": n}},
           "gen-0": {"instance": {"pid": 2, "started": 2.0}, "requests": {"generation_only": n - n // 2},
                     "kv": {"kv_transfers": n - n // 2, "kv_bytes_received": 100}}}
    g1 = n // 2 if gen1 is None else gen1
    doc["gen-1"] = {"instance": {"pid": 3, "started": 3.0}, "requests": {"generation_only": g1},
                    "kv": {"kv_transfers": g1, "kv_bytes_received": 100}}
    return doc


def _fixed(proof, answers=None):
    wl = build_workload("fixed", isl=128, osl=16, concurrency=(4,))
    res = read_export(FIX / "fixed", wl.cells[0].name)
    return decide(wl, {wl.cells[0].name: res}, proof, answers=answers), len(res.records)


# --- M1: the job's etcd is not a worker -------------------------------------------------------------------------

def test_the_probe_asks_only_context_and_generation_servers_never_the_jobs_etcd(tmp_path, monkeypatch):
    from tests.unit.helpers import plan_of
    from tests.unit.test_launch_states import STANDIN
    from toolkit import bench
    from toolkit.launch.run import RunRecord

    plan = plan_of(STANDIN, "membership.enabled=true", "membership.storage=etcd")
    run = RunRecord.new(plan, tmp_path, "local")
    assert "etcd" in [s.name for s in run.servers]
    (tmp_path / "nodes.tsv").write_text("".join(f"{i}\tlocal\t127.0.0.1\n" for i in range(plan.node_count)))
    run.state, run.endpoint = "ready", "http://127.0.0.1:1"
    asked = {}
    monkeypatch.setattr(bench.probes, "probe_for", lambda url, workers, *a, **k: asked.update(workers) or object())
    bench.target_for_run(run)
    assert asked and set(asked) == {s.name for s in run.servers if s.role in ("ctx", "gen")}


# --- M2: the default workload fits the plan with the chat template's tokens ------------------------------------

def test_the_default_isl_is_lowered_to_what_fits_with_the_chat_template_and_says_so():
    limits = Limits(max_input_len=1024, max_output_len=64)  # standin-2p2d's traffic section
    (cell,) = build_workload("fixed", osl=8, limits=limits).cells
    wl = build_workload("fixed", osl=8, limits=limits)
    assert cell.isl < 1024 and cell.isl + 64 <= 1024
    assert any("clipped" in n and "chat template" in n for n in wl.notes)


def test_an_explicit_isl_the_deployment_cannot_take_is_refused_with_the_largest_that_fits():
    with pytest.raises(BenchInputError) as exc:
        build_workload("fixed", isl=1024, osl=8, limits=Limits(max_input_len=1024, max_output_len=64))
    assert "--isl 960" in str(exc.value) and exc.value.exit_code == 2


def test_the_shipped_standin_recipe_benches_with_the_defaults():
    from toolkit import api
    from toolkit.bench import limits_for_plan

    plan = api.load_plan("standin-2p2d")
    wl = build_workload("fixed", limits=limits_for_plan(plan))
    (cell,) = wl.cells
    assert cell.isl + 64 <= plan.traffic.max_input_len and cell.osl <= plan.traffic.max_output_len


# --- M3: a restart during the run --------------------------------------------------------------------------------

def test_a_generation_server_restarted_mid_run_counts_per_lifetime_and_is_named():
    before = _stats(1500)
    after = _stats(3502, gen1=10)  # gen-1 was killed and came back: its counters started again from 0
    after["gen-1"]["instance"] = {"pid": 33, "started": 33.0}
    proof = probes.standin_proof(before, after)
    assert proof.restarted == ["gen-1"] and proof.generation_legs >= 0 and proof.kv_transfers >= 0
    assert all(v >= 0 for s in proof.per_server.values() for v in s.values())
    v, _ = _fixed(proof)
    assert v.exit_code == 0, v.summary
    assert "restarted during the run: gen-1" in v.summary and "not disaggregated" not in v.summary


def test_a_restarted_proxy_never_makes_counts_negative_nor_calls_prefill_local():
    before, after = _stats(1500), _stats(2000)
    after["proxy"].update({"instance": {"pid": 101, "started": 101}, "requests": 44, "disaggregated": 44,
                           "local_prefill": 0, "errors": 0})
    before["proxy"]["local_prefill"] = 7  # the old proxy's count: the new one starts at 0
    proof = probes.standin_proof(before, after)
    assert proof.local_prefill == 0 and proof.restarted == ["proxy"]
    v, _ = _fixed(proof)
    assert v.exit_code == 0 and "restarted during the run: proxy" in v.summary, v.summary


def test_a_worker_being_restarted_at_the_end_is_named_and_the_proxy_counts_the_legs():
    before = _stats(0)
    after = _stats(44)
    after["gen-1"] = {probes.UNREADABLE: "connection refused"}
    proof = probes.standin_proof(before, after)
    assert proof.unreadable == ["gen-1"]
    v, _ = _fixed(proof)
    assert v.exit_code == 0 and "gen-1" in v.summary, v.summary
    after["proxy"]["disaggregated"] = 10  # the proxy itself says most requests did not take both legs
    v, _ = _fixed(probes.standin_proof(before, after))
    assert v.exit_code == 2 and "through both legs" in v.summary


def test_without_a_restart_a_shortfall_is_still_not_disaggregated():
    v, _ = _fixed(probes.standin_proof(_stats(0), _stats(44, gen1=0)))
    assert v.exit_code == 2 and "not disaggregated" in v.summary


# --- M4: answers that differ from the aggregated baseline ------------------------------------------------------

ANS = ["Paris is the capital of France and its largest city", "The sea is wide and deep and blue today",
       "5, 6, 7, 8, 9, 10, 11, 12", "A KV cache stores the keys and values of past tokens"]


def test_answers_that_all_differ_are_a_fail():
    answers = answers_agree(ANS, ["zq " * 9] * 4)
    v, _ = _fixed(probes.standin_proof(_stats(0), _stats(44)), answers)
    assert not answers["agree"] and v.exit_code == 2 and v.summary.startswith("FAIL:"), v.summary
    assert not v.passed and "0 of 4" in v.summary



def test_a_reference_that_could_not_answer_is_a_named_skipped_parity_check_not_a_silent_pass():
    wl = build_workload("fixed", isl=128, osl=16, concurrency=(4,))
    res = read_export(FIX / "fixed", wl.cells[0].name)
    v = decide(wl, {wl.cells[0].name: res}, probes.standin_proof(_stats(0), _stats(44)),
               reference_error="error: ConnectError: connection refused")
    (parity,) = [c for c in v.checks if c.stage == "parity"]
    assert parity.skipped and "connection refused" in parity.reason
    assert v.exit_code == 0 and "answers not compared" in v.summary, v.summary

def test_a_late_near_tie_flip_in_one_answer_is_not_a_fail():
    theirs = list(ANS)
    theirs[1] = "The sea is wide and deep and grey tonight"  # parts after 6 of 9 words
    answers = answers_agree(ANS, theirs)
    assert answers["agree"], answers["reason"]
    v, _ = _fixed(probes.standin_proof(_stats(0), _stats(44)), answers)
    assert v.exit_code == 0, v.summary


def test_an_early_divergence_or_a_missing_answer_is_a_fail():
    theirs = list(ANS)
    theirs[0] = "Lyon is not the capital of France and its largest city"
    assert not answers_agree(ANS, theirs)["agree"]
    theirs = list(ANS)
    theirs[2] = "<error: HTTP 500>"
    assert not answers_agree(ANS, theirs)["agree"]
    assert answers_agree(ANS, list(ANS))["agree"]


# --- M10: tk diff reads bench results -----------------------------------------------------------------------------

def _bench_dir(run: Path, name: str, summary: str, code: int, ttft: float):
    d = run / "bench" / name
    d.mkdir(parents=True)
    (d / "verdict.json").write_text(json.dumps({"exit_code": code, "passed": code == 0, "summary": summary}))
    (d / "results.csv").write_text(f"target,cell,ttft_p50_ms\ndisaggregated,isl64-osl8-c2,{ttft}\n")


def test_diff_names_differing_bench_verdicts_and_numbers(tmp_path):
    from toolkit.doctor.diff import diff_dirs, format_diff

    a, b = tmp_path / "A", tmp_path / "B"
    for d in (a, b):
        d.mkdir()
        (d / "run.json").write_text("{}")
    _bench_dir(a, "fixed-20260101-100000", "PASS: valid, disaggregated, no SLA declared", 0, 12.0)
    _bench_dir(b, "fixed-20260102-110000", "INVALID: not disaggregated: ...", 2, 30.0)
    doc = diff_dirs(a, b)
    assert not doc["same"]
    text = format_diff(doc)
    assert "PASS" in text and "INVALID" in text and "ttft_p50_ms" in text
    same = diff_dirs(a, a)
    assert same["same"]


# --- m8, m9 and stale staging ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../x", "/tmp/x", "sub/dir", ".hidden", "a" * 65, "x\ny"])
def test_a_bench_name_that_is_not_a_plain_name_is_refused(name):
    from toolkit.bench import check_bench_name

    with pytest.raises(BenchInputError) as exc:
        check_bench_name(name)
    assert "--name" in str(exc.value) and exc.value.exit_code == 2


def test_a_full_disk_is_a_message_and_leaves_nothing(tmp_path, monkeypatch):
    from toolkit import bench

    monkeypatch.setattr(bench, "find_aiperf", lambda: "aiperf")
    monkeypatch.setattr(bench, "_check_serving", lambda target: None)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(bench, "measure", full)
    target = bench.target_for_url("http://127.0.0.1:1", "m")
    with pytest.raises(TkError) as exc:
        bench.run_bench(target, build_workload("fixed", isl=16, osl=4), tokenizer="t", bench_root=tmp_path / "bench")
    assert "No space left on device" in str(exc.value) and "nothing was written" in str(exc.value)
    assert list((tmp_path / "bench").iterdir()) == []


def test_staging_left_by_a_dead_bench_on_this_host_is_removed_and_no_other(tmp_path):
    from toolkit.bench import _host, remove_stale_staging

    dead = 4194304 + 12345  # above Linux's largest pid_max: no such process
    gone = tmp_path / f".fixed-1.partial-{_host()}-{dead}"
    mine = tmp_path / f".fixed-2.partial-{_host()}-{os.getpid()}"
    other = tmp_path / f".fixed-3.partial-not-{socket.gethostname()}x-{dead}"
    for d in (gone, mine, other):
        (d / "aiperf").mkdir(parents=True)
    assert remove_stale_staging(tmp_path) == [gone]
    assert not gone.exists() and mine.exists() and other.exists()


# --- a proxy restart during the run: TensorRT-LLM's /perf_metrics lives in the proxy's memory --------------------

def _trtllm_entries(n: int) -> list[dict]:
    return [{"ctx_server": "c:1", "gen_server": "g:1", "ctx_perf_metrics": {"x": 1},
             "gen_perf_metrics": {"perf_metrics": {"timing_metrics": {"kv_cache_size": 4096}}}}] * n


PROXY_RESTART = [{"time": 5.0, "event": "server-exited", "component": "proxy", "exit_code": 137,
                  "reason": "proxy exited with code 137"},
                 {"time": 9.0, "event": "restarted", "component": "proxy", "exit_code": None, "reason": None}]


def test_a_proxy_restart_that_lost_its_perf_metrics_is_said_so_not_blamed_on_the_buffer():
    """The disaggregated server's /perf_metrics entries are in its process (DisaggPerfMetricsCollector): a proxy
    restart during the run loses those of the requests it finished before; the verdict must say that, not ask to
    raise perf_metrics_max_requests."""
    proof = probes.account_for_restarts(probes.trtllm_proof(_trtllm_entries(20)), PROXY_RESTART)
    assert proof.restarted == ["proxy"] and any("lost" in n for n in proof.notes)
    v, n = _fixed(proof)
    assert v.exit_code == 2 and "proxy restarted during the run" in v.summary and "lost" in v.summary, v.summary
    assert "perf_metrics_max_requests" not in v.summary
    # a worker's restart leaves the proxy's entries whole: nothing to add
    worker = [{**e, "component": "gen-0"} for e in PROXY_RESTART]
    assert probes.account_for_restarts(probes.trtllm_proof(_trtllm_entries(44)), worker).restarted == []
    # the stand-in's counters see the restart themselves (instance), and keep counting through the workers'
    standin = probes.standin_proof(_stats(0), _stats(44))
    assert probes.account_for_restarts(standin, PROXY_RESTART).restarted == []


def test_the_bench_accounts_for_the_jobs_restart_events_in_its_verdict(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from toolkit import bench
    from toolkit.bench.verdict import Bounds

    wl = build_workload("fixed", isl=128, osl=16, concurrency=(4,))
    res = read_export(FIX / "fixed", wl.cells[0].name)
    monkeypatch.setattr(bench, "measure", lambda *a, **k: ({wl.cells[0].name: res},
                                                           probes.trtllm_proof(_trtllm_entries(20))))
    monkeypatch.setattr(bench, "supervision_during", lambda target, t0, t1: PROXY_RESTART)
    target = SimpleNamespace(name="disaggregated", model="m", gpus=2, reference=None, endpoint="http://x",
                             run={"run_dir": str(tmp_path), "engine": "trtllm", "endpoint": "http://x"})
    staging = tmp_path / ".staging"
    staging.mkdir()
    doc = bench._measure_and_publish(target, wl, aiperf="aiperf", tokenizer="t", final=tmp_path / "out",
                                     staging=staging, objectives=(), bounds=Bounds(), plan=None, baseline=None,
                                     after_target=None, timeout_s=10, on_progress=None)
    assert doc["verdict"]["exit_code"] == 2 and "proxy restarted during the run" in doc["verdict"]["summary"]
    assert doc["proof"]["restarted"] == ["proxy"]
