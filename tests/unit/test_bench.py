"""Spec: tk bench. Workloads -> aiperf argv, aiperf's real export -> records, the verdict's rules (2 invalid,
1 SLA missed naming the metric, 0 pass), reports (valid PNGs, links that exist), bad input (exit 2)."""

import json
from pathlib import Path

import pytest

from toolkit.bench import probe as probes
from toolkit.bench.report import write_all, cell_row
from toolkit.bench.results import Record, read_export
from toolkit.bench.sla import parse_sla, valid_keys
from toolkit.bench.verdict import decide
from toolkit.bench.workload import BenchInputError, Limits, aiperf_argv, build_workload

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "aiperf"


def test_fixed_argv_streams_excludes_warmup_and_fixes_seed():
    wl = build_workload("fixed", isl=128, osl=16, concurrency=(4,))
    (cell,) = wl.cells
    argv = aiperf_argv(cell, aiperf="aiperf", url="http://h:1", model="m", tokenizer="/tok", out_dir="/o", seed=7)
    s = " ".join(argv)
    assert argv[:2] == ["aiperf", "profile"] and "--streaming" in argv
    for frag in ("--concurrency 4", "--request-count 40", "--warmup-request-count 8", "--prompt-input-tokens-mean 128",
                 "--prompt-input-tokens-stddev 0", "--prompt-output-tokens-mean 16", "--extra-inputs ignore_eos:true",
                 "--random-seed 7", "--endpoint-type chat", "--output-artifact-dir /o", "--tokenizer /tok"):
        assert frag in s


def test_isl_sweep_is_clipped_to_the_plan_with_a_note():
    # 1024 itself is skipped: the chat template's tokens would push it over the 1024 the deployment admits (M2)
    wl = build_workload("isl-sweep", osl=64, limits=Limits(max_input_len=1024, max_output_len=512))
    assert [c.isl for c in wl.cells] == [128, 512]
    assert any("2048" in n and "1024" in n for n in wl.notes) and any("ISL 1024 skipped" in n for n in wl.notes)
    with pytest.raises(BenchInputError, match="--osl"):
        build_workload("fixed", osl=1000, limits=Limits(max_input_len=1024, max_output_len=512))


def test_concurrency_sweep_and_multi_turn_argv():
    wl = build_workload("concurrency-sweep", isl=256, osl=32)
    assert [c.concurrency for c in wl.cells] == [1, 4, 16, 64]
    mt = build_workload("multi-turn", isl=64, osl=8, turns=3, concurrency=(2,)).cells[0]
    s = " ".join(aiperf_argv(mt, aiperf="a", url="u", model="m", tokenizer="t", out_dir="o"))
    assert "--conversation-num 8 --conversation-turn-mean 3 --conversation-turn-stddev 0" in s
    assert "--request-count" not in s
    assert [mt.expected_isl(t) for t in range(3)] == [64, 136, 208]


@pytest.mark.parametrize("kind", ["bogus", ""])
def test_unknown_workload_is_exit_2(kind):
    with pytest.raises(BenchInputError) as e:
        build_workload(kind)
    assert e.value.exit_code == 2 and "concurrency-sweep" in str(e.value)


def test_sla_keys():
    objs = parse_sla("ttft_p99_ms=500,itl_p50_ms=30,output_tokens_per_s_per_gpu_min=10")
    assert [(o.metric, o.stat, o.kind) for o in objs] == [("time_to_first_token", "p99", "max"),
                                                          ("inter_chunk_latency", "p50", "max"),
                                                          ("output_token_throughput", "avg", "min")]
    with pytest.raises(BenchInputError) as e:
        parse_sla("ttft_p42_ms=1")
    assert e.value.exit_code == 2 and "ttft_p99_ms" in str(e.value) and "request_throughput_min" in str(e.value)
    assert "tpot_p99_ms" in valid_keys()


def test_real_export_is_read():
    res = read_export(FIX / "fixed", "isl128-osl16-c4")
    assert res.aiperf_version == "0.13.0"
    assert len(res.profiled) == 40 and len(res.warmup) == 4
    r = res.profiled[0]
    assert (r.isl, r.osl, r.prompt_tokens, r.completion_tokens) == (128, 16, 130, 16) and r.ok
    assert res.stat("time_to_first_token", "p99") > 0 and res.stat("request_count") == 40
    fail = read_export(FIX / "allfail", "x")
    assert not fail.summary and all(not r.ok and "400" in r.error for r in fail.profiled)


def _standin_stats(n, *, local=0, kv=None):
    kv = n if kv is None else kv
    return {"proxy": {"requests": n, "disaggregated": n - local, "local_prefill": local, "errors": 0},
            "ctx-0": {"requests": {"context_only": n - local}},
            "gen-0": {"requests": {"generation_only": n}, "kv": {"kv_transfers": kv, "kv_bytes_received": kv * 100}}}


def _verdict(cell_dir="fixed", proof=None, sla=None, isl=128, osl=16, conc=4, kind="fixed", **kw):
    wl = build_workload(kind, isl=isl, osl=osl, concurrency=(conc,), **kw)
    res = read_export(FIX / cell_dir, wl.cells[0].name)
    if proof is None:
        proof = probes.standin_proof(_standin_stats(0), _standin_stats(len(res.records)))
    return decide(wl, {wl.cells[0].name: res}, proof, parse_sla(sla), gpus=2), res, wl


def test_pass_is_exit_0():
    v, _, _ = _verdict(sla="ttft_p99_ms=10000,request_throughput_min=1")
    assert v.exit_code == 0, v.summary


def test_multi_turn_lengths_account_for_history_and_template():
    v, _, _ = _verdict("multiturn", kind="multi-turn", isl=64, osl=8, conc=2, turns=3)
    assert v.exit_code == 0, v.summary


def test_sla_miss_is_exit_1_naming_the_metric():
    v, _, _ = _verdict(sla="ttft_p99_ms=0.001")
    assert v.exit_code == 1 and "ttft_p99_ms" in v.summary


def test_zero_token_answer_is_exit_2():
    wl = build_workload("fixed", isl=128, osl=16, concurrency=(4,))
    res = read_export(FIX / "fixed", wl.cells[0].name)
    r0 = res.records[-1]
    res.records[-1] = Record(**{**r0.__dict__, "osl": 0, "completion_tokens": 0})
    proof = probes.standin_proof(_standin_stats(0), _standin_stats(44))
    v = decide(wl, {wl.cells[0].name: res}, proof, parse_sla("ttft_p99_ms=10000"))
    assert v.exit_code == 2 and "no_zero_token_answers" in v.summary


def test_not_disaggregated_is_exit_2():
    v, _, _ = _verdict(proof=probes.standin_proof(_standin_stats(0), _standin_stats(44, local=44)))
    assert v.exit_code == 2 and "disaggregated" in v.summary
    v, _, _ = _verdict(proof=probes.standin_proof(_standin_stats(0), _standin_stats(44, kv=0)))
    assert v.exit_code == 2 and "KV transfers" in v.summary
    v, _, _ = _verdict(proof=probes.trtllm_proof([]))
    assert v.exit_code == 2 and "perf_metrics_max_requests" in v.summary


def test_trtllm_perf_metrics_prove_the_legs():
    entries = [{"ctx_server": "c:1", "gen_server": "g:1", "ctx_perf_metrics": {"x": 1},
                "gen_perf_metrics": {"perf_metrics": {"timing_metrics": {"kv_cache_size": 4096}}}}] * 44
    v, _, _ = _verdict(proof=probes.trtllm_proof(entries))
    assert v.exit_code == 0, v.summary


def test_errors_above_the_bound_are_exit_2():
    wl = build_workload("fixed", isl=32, osl=4, concurrency=(2,), requests=6)
    res = read_export(FIX / "allfail", wl.cells[0].name)
    v = decide(wl, {wl.cells[0].name: res}, probes.AggregatedProbe().proof({}, {}))
    assert v.exit_code == 2 and "400" in v.summary


def test_report_writes_valid_pngs_and_links_that_exist(tmp_path):
    v, res, wl = _verdict(sla="ttft_p99_ms=10000")
    # the fixture's streams arrived in one chunk (the plain stand-in), so its tok/s/user is not measurable: give the
    # rows one, as a deployment with real token timing has
    row = {**cell_row("disaggregated", wl.cells[0], res, 2), "output_tokens_per_s_per_user": 140.0}
    rows = [row, {**row, "cell": "b", "isl": 512, "concurrency": 16}]
    (tmp_path / "aiperf" / wl.cells[0].name).mkdir(parents=True)
    (tmp_path / "aiperf" / wl.cells[0].name / "profile_export_aiperf.json").write_text("{}")
    (tmp_path / "aiperf.log").write_text("")
    doc = {"name": "n", "run": {"run_dir": "/r", "engine": "standin", "endpoint": "http://h:1"}, "model": "m",
           "tokenizer": "t", "gpus": 2, "workload": wl.to_dict(), "verdict": v.to_dict(), "rows": rows,
           "cells_dirs": [wl.cells[0].name], "estimates": [], "bench_dir": str(tmp_path)}
    plots = write_all(tmp_path, doc)
    assert set(plots) == {"ttft_vs_isl.png", "throughput_vs_concurrency.png", "pareto.png"}
    for p in plots:
        assert (tmp_path / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "report.md").read_text()
    import re
    for link in re.findall(r"\]\(([^)]+)\)", md):
        assert (tmp_path / link).exists(), link
    assert json.loads((tmp_path / "verdict.json").read_text())["exit_code"] == 0
    assert (tmp_path / "results.csv").read_text().startswith("target,cell,isl")


def test_cli_bad_input_is_exit_2_and_writes_nothing(tmp_path, capsys):
    from toolkit.cli import main

    assert main(["bench", str(tmp_path), "--workload", "nope"]) == 2
    assert main(["bench", str(tmp_path), "--sla", "bogus_key=1"]) == 2
    assert "valid keys" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_is_not_serving_is_exit_2_naming_it_and_writes_nothing(tmp_path, capsys):
    from tests.unit.helpers import plan_of
    from tests.unit.test_launch_states import STANDIN
    from toolkit.cli import main
    from toolkit.launch.run import RunRecord

    run_dir = tmp_path / "run"
    (run_dir / "state").mkdir(parents=True)
    record = RunRecord.new(plan_of(STANDIN), run_dir, "local")
    record.set_state("stopped")
    assert main(["bench", str(run_dir), "--isl", "16", "--osl", "4"]) == 2
    err = capsys.readouterr().err
    assert "not serving" in err and "tk launch" in err and "Traceback" not in err
    assert not (run_dir / "bench").exists()


def test_aiperf_missing_is_a_clear_error_with_the_fix(tmp_path, monkeypatch):
    from toolkit.bench import runner
    from toolkit.bench.workload import BenchInputError

    monkeypatch.delenv(runner.AIPERF_ENV, raising=False)
    monkeypatch.setattr(runner.shutil, "which", lambda name: None)
    monkeypatch.setattr(runner.sys, "executable", str(tmp_path / "bin" / "python3"))
    with pytest.raises(BenchInputError) as exc:
        runner.find_aiperf()
    assert "aiperf is not installed" in str(exc.value) and "bench" in str(exc.value)
    assert getattr(exc.value, "exit_code", 2) == 2


# --- streams that arrive in one chunk (the plain stand-in): token timing is not measurable --------------------

def test_itl_is_not_judged_when_the_streams_arrived_in_one_chunk():
    v, res, wl = _verdict(sla="ttft_p99_ms=10000,itl_p99_ms=50,tpot_p99_ms=50")
    assert res.one_chunk_streams and res.one_chunk_count == (39, 40)
    assert v.exit_code == 0
    sla = {c.name: c for c in v.checks if c.stage == "sla"}
    assert not sla["ttft_p99_ms"].skipped
    assert sla["itl_p99_ms"].skipped and "not judged" in sla["itl_p99_ms"].reason
    assert sla["tpot_p99_ms"].skipped
    assert "1 SLA objective(s) met" in v.summary and "itl_p99_ms, tpot_p99_ms not judged" in v.summary
    note = next(c for c in v.checks if c.name == "token_timing")
    assert "39 of 40 streams arrived in one chunk" in note.reason and "not measurable" in note.reason


def test_a_one_chunk_cell_shows_no_itl_rather_than_zero():
    _, res, wl = _verdict()
    row = cell_row("disaggregated", wl.cells[0], res, 2)
    assert row["itl_p99_ms"] is None and row["tpot_p99_ms"] is None and row["output_tokens_per_s_per_user"] is None
    assert row["ttft_p99_ms"] > 0 and row["request_throughput"] > 0


def test_streams_with_token_gaps_are_judged():
    wl = build_workload("fixed", isl=128, osl=16, concurrency=(4,))
    res = read_export(FIX / "fixed", wl.cells[0].name)
    res.records = [Record(**{**r.__dict__, "latency_ms": (r.ttft_ms or 0) + 30.0}) for r in res.records]
    proof = probes.standin_proof(_standin_stats(0), _standin_stats(len(res.records)))
    v = decide(wl, {wl.cells[0].name: res}, proof, parse_sla("itl_p99_ms=50"), gpus=2)
    assert not res.one_chunk_streams
    assert not any(c.skipped for c in v.checks if c.stage == "sla")


# --- defaults clipped to the deployment, given values never -----------------------------------------------

def test_default_lengths_are_clipped_to_what_the_deployment_admits_with_a_note():
    # with room for the chat template's tokens (2 messages x 32): 1024 itself would be refused by the server (M2)
    wl = build_workload("fixed", limits=Limits(max_input_len=1024, max_output_len=64))
    assert (wl.cells[0].isl, wl.cells[0].osl) == (960, 64)
    assert any("OSL 64: the default 128 clipped" in n for n in wl.notes)
    assert any("ISL 960: the default 1024 clipped" in n and "chat template" in n for n in wl.notes)
    wl = build_workload("fixed", limits=Limits(max_input_len=512, max_output_len=64))
    assert wl.cells[0].isl == 448 and any("ISL 448: the default 1024 clipped" in n for n in wl.notes)


def test_given_lengths_over_the_limits_are_refused_naming_the_flag_isl_first():
    with pytest.raises(BenchInputError, match=r"--osl 128 is more than the deployment admits"):
        build_workload("fixed", isl=100, osl=128, limits=Limits(max_input_len=1024, max_output_len=64))
    with pytest.raises(BenchInputError, match=r"--isl 5000 is more than the deployment admits"):
        build_workload("fixed", isl=5000, osl=128, limits=Limits(max_input_len=1024, max_output_len=64))


def test_a_benchmark_records_what_the_jobs_supervision_did_while_it_ran(tmp_path):
    """From the job's events (fields, not words): a wedge and a restart inside the window, nothing outside it."""
    from toolkit.bench import Target, supervision_during

    (tmp_path / "state").mkdir()
    lines = [(5.0, "server-exited", "gen-1"), (12.0, "wedged", "gen-0"), (13.0, "server-exited", "gen-0"),
             (15.0, "restarted", "gen-0"), (16.0, "started", "gen-0"), (40.0, "lost", "ctx-1")]
    (tmp_path / "state" / "events.jsonl").write_text("".join(
        json.dumps({"time": t, "event": e, "component": c, "state": None, "reason": f"{c} {e}", "exit_code": None,
                    "restarts": None}) + "\n" for t, e, c in lines))
    target = Target(name="disaggregated", endpoint="http://x", model="m", probe=None, run={"run_dir": str(tmp_path)})
    got = supervision_during(target, 10.0, 30.0)
    assert [(e["event"], e["component"]) for e in got] == [("wedged", "gen-0"), ("server-exited", "gen-0"),
                                                           ("restarted", "gen-0")]
    assert supervision_during(Target(name="x", endpoint="e", model="m", probe=None), 0, 1e12) == []


def test_a_run_whose_plan_cannot_be_rebuilt_says_why_in_the_tokenizer_error_and_the_workload_notes(tmp_path):
    """Hostile m3: a manifest a newer tk wrote (a field this tk does not know) used to make the plan vanish without a
    word: bench then lost its limits and asked for a tokenizer with no reason given."""
    import json

    from tests.unit.helpers import plan_of
    from tests.unit.test_launch_states import STANDIN
    from toolkit import api
    from toolkit.bench import resolve_tokenizer
    from toolkit.bench.workload import BenchInputError
    from toolkit.launch.run import RunRecord
    from toolkit.render import render

    out, _ = render(plan_of(STANDIN), tmp_path / "run")
    record = RunRecord.new(plan_of(STANDIN), out, "local")
    assert api._plan_of_run(record)[1] is None  # the manifest tk wrote: the plan comes back
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["recipe"]["traffic"]["newer_knob"] = 1
    (out / "manifest.json").write_text(json.dumps(manifest))
    plan, why = api._plan_of_run(record)
    assert plan is None and "the plan could not be rebuilt from" in why and "newer_knob" in why
    with pytest.raises(BenchInputError, match="no tokenizer for aiperf \\(the plan could not be rebuilt .*newer_knob"):
        resolve_tokenizer(None, plan, record.engine, no_plan=why)


def test_options_that_do_not_fit_the_target_are_usage_errors_before_anything_starts(tmp_path, capsys, monkeypatch):
    """A run is measured as it is (no --local, --set, --run-dir, --compare); --compare launches recipe variants and
    has no baseline; --baseline and --baseline-url exclude each other: each is exit 2 naming the option, and
    nothing is launched or measured."""
    from tests.unit.helpers import plan_of
    from tests.unit.test_launch_states import STANDIN
    from toolkit import api
    from toolkit.cli import main
    from toolkit.launch.run import RunRecord

    def nothing_starts(*args, **kwargs):
        raise AssertionError("nothing may be launched or measured")
    for name in ("bench", "bench_recipe", "bench_compare"):
        monkeypatch.setattr(api, name, nothing_starts)
    monkeypatch.setenv("TK_RUNS_DIR", str(tmp_path / "runs"))
    run_dir = tmp_path / "run"
    (run_dir / "state").mkdir(parents=True)
    RunRecord.new(plan_of(STANDIN), run_dir, "local").set_state("ready")
    cases = [
        (["bench", str(run_dir), "--baseline", "aggregated", "--baseline-url", "http://h:1"], "exclude each other"),
        (["bench", str(run_dir), "--compare", "router=round_robin,kv_cache_aware"], "give the recipe"),
        (["bench", "standin-2p2d", "--compare", "router=round_robin", "--baseline", "aggregated"],
         "--compare and --baseline"),
        (["bench", "standin-2p2d", "--compare", "router=round_robin", "--baseline-url", "http://h:1"],
         "--compare and --baseline"),
        (["bench", str(run_dir), "--local"], "--local, --set and --run-dir"),
        (["bench", str(run_dir), "--set", "traffic.max_input_len=2048"], "--local, --set and --run-dir"),
        (["bench", str(run_dir), "--run-dir", str(tmp_path / "other")], "--local, --set and --run-dir"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert not (run_dir / "bench").exists() and not (tmp_path / "other").exists()
