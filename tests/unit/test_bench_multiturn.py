"""tk bench's multi-turn reuse: per-turn figures from the servers' counts, the reuse findings, the pull-back projection,
--compare variants and the trace workload (pure: records, reports and fixtures in, documents out)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from toolkit.bench import multiturn as MT
from toolkit.bench import pullback, reuse, variants
from toolkit.bench.results import Record, read_export
from toolkit.bench.workload import BenchInputError, aiperf_argv, build_workload

FIX = Path(__file__).resolve().parent.parent / "fixtures"


def conversation(session: str, turns: int, isl: int, osl: int, cached, ttft=(50.0,)) -> list[Record]:
    """One conversation as the server reports it: the prompt grows by the previous answer and a new message
    (isl + 2 template markers); ``cached(turn, prompt, previous_prompt)`` is what the server reused."""
    recs, prompt, prev = [], isl + 2, 0
    for t in range(turns):
        recs.append(Record(phase="profiling", conversation=session, turn=t, isl=None, osl=osl, prompt_tokens=prompt,
                           completion_tokens=osl, ttft_ms=ttft[min(t, len(ttft) - 1)], latency_ms=None,
                           cached_tokens=cached(t, prompt, prev), session=session))
        prev, prompt = prompt, prompt + osl + isl + 2
    return recs


def STICKY(t, prompt, prev):  # noqa: N802 (a named policy, used like a constant)
    return prev


def NOTHING(t, prompt, prev):  # noqa: N802
    return 0


def test_with_a_reuse_preserving_router_only_the_previous_answer_is_recomputed():
    reqs = MT.request_reuse([r for s in range(3) for r in conversation(f"s{s}", 4, 100, 20, STICKY)])
    rows = MT.turn_table(reqs)
    assert [r.turn for r in rows] == [1, 2, 3, 4] and all(r.requests == 3 for r in rows)
    assert rows[0].reusable_tokens == 0 and rows[0].cached_tokens == 0
    for r in rows[1:]:
        assert r.cached_tokens == r.reusable_tokens - 20  # everything but the last answer
        assert r.recomputed_answer_tokens == 20 and r.recomputed_prompt_tokens == 0
    assert rows[3].reusable_answer_tokens == 60 and rows[3].reusable_prompt_tokens == rows[3].reusable_tokens - 60
    # 3 conversations x 3 later turns, 20 answer tokens recomputed each
    assert MT.reuse_share(reqs) == pytest.approx(1 - 9 * 20 / sum(r.reusable_tokens for r in reqs))


def test_round_robin_recomputes_every_earlier_answer():
    reqs = MT.request_reuse(conversation("s", 4, 100, 20, NOTHING))
    rows = MT.turn_table(reqs)
    assert [r.recomputed_answer_tokens for r in rows] == [0, 20, 40, 60]
    assert [r.recomputed_tokens for r in rows] == [r.reusable_tokens for r in rows]
    assert MT.reuse_share(reqs) == 0


def test_cached_beyond_the_history_is_counted_apart_and_sessions_are_told_apart():
    # the same dataset conversation run twice (aiperf samples it again): told apart by the correlation id
    first = conversation("a", 2, 100, 20, NOTHING)
    again = [Record(**{**r.__dict__, "session": "b"}) for r in conversation("a", 2, 100, 20,
                                                                             lambda t, p, prev: p - 1)]
    reqs = MT.request_reuse(first + again)
    assert len({r.session for r in reqs}) == 2
    turn1 = next(r for r in reqs if r.session == "b" and r.turn == 1)
    assert turn1.reusable_tokens == 0 and turn1.cached_outside_history == turn1.prompt_tokens - 1


def test_a_missing_turn_restarts_the_history_and_failed_or_warmup_requests_are_left_out():
    recs = conversation("s", 3, 100, 20, STICKY)
    recs[1] = Record(**{**recs[1].__dict__, "error": "500 boom"})
    warm = Record(**{**recs[0].__dict__, "phase": "warmup", "session": "w"})
    reqs = MT.request_reuse(recs + [warm])
    assert [(r.turn, r.reusable_tokens) for r in reqs] == [(1, 0), (3, 0)]


def test_whole_prompt_cached_is_recognised_in_a_real_export():
    """1.2: the generation worker's count (the whole prompt) reaches the client (before PR #13620)."""
    res = read_export(FIX / "aiperf" / "multiturn-gencached", "mt")
    reqs = MT.request_reuse(res.records)
    assert len(reqs) == 32 and len({r.session for r in reqs}) == 8 and {r.turn for r in reqs} == {1, 2, 3, 4}
    assert all(r.cached_tokens == r.prompt_tokens for r in reqs)
    assert MT.cached_is_whole_prompt(reqs)
    rows = MT.turn_table(reqs, cached_trusted=False)
    assert rows[1].reusable_tokens == 258 + 64 and rows[1].cached_tokens is None and rows[1].ttft_p50_ms > 0


def test_percentile_matches_numpy_linear():
    assert MT.percentile([1, 2, 3, 4], 50) == 2.5
    assert MT.percentile([10.0], 99) == 10.0 and MT.percentile([], 50) is None


# --- findings ----------------------------------------------------------------------------------------------------

def _res(records):
    return SimpleNamespace(records=records)


def _setting(router="round_robin", ctx=2, events=False, reuse_on=True):
    return reuse.ReuseSetting(router, "load_balancing", ctx, 1, reuse_on, events, None, "1.3")


def _cell(name="mt"):
    return SimpleNamespace(name=name)


def test_reuse_far_below_theoretical_names_the_router(monkeypatch):
    recs = [r for s in range(4) for r in conversation(f"s{s}", 3, 100, 20, NOTHING)]
    monkeypatch.setattr(reuse, "setting_of", lambda plan: _setting("round_robin"))
    doc, checks = reuse.analyse(_cell(), _res(recs))
    bad = {c.name: c for c in checks if not c.ok}
    assert set(bad) == {"reuse_vs_theoretical"} and all(c.stage == "reuse" for c in checks)
    assert "round_robin" in bad["reuse_vs_theoretical"].reason and doc["reuse_share"] == 0


def test_router_fallback_and_eviction_are_named_from_the_servers_counts(monkeypatch):
    recs = [r for s in range(4) for r in conversation(f"s{s}", 3, 100, 20, NOTHING)]
    monkeypatch.setattr(reuse, "setting_of", lambda plan: _setting("kv_cache_aware"))
    counts = reuse.ServerCounts(per_server={"ctx-0": {"evicted_blocks": 12}},
                                routers={"context": {"routed": 12, "matches_all_zero": 12}})
    _, checks = reuse.analyse(_cell(), _res(recs), counts=counts)
    reason = next(c for c in checks if c.name == "reuse_vs_theoretical").reason
    assert "#14882" in reason and "12 of 12 routing decisions" in reason and "event_buffer_max_size is 0" in reason
    assert "evicted 12 KV blocks" in reason


def test_good_reuse_passes_and_whole_prompt_counts_fall_back_to_the_servers(monkeypatch):
    recs = [r for s in range(3) for r in conversation(f"s{s}", 3, 100, 20, STICKY)]
    monkeypatch.setattr(reuse, "setting_of", lambda plan: _setting("kv_cache_aware", events=True))
    _, checks = reuse.analyse(_cell(), _res(recs))
    assert all(c.ok for c in checks)
    whole = [Record(**{**r.__dict__, "cached_tokens": r.prompt_tokens}) for r in recs]
    counts = reuse.ServerCounts(per_server={"ctx-0": {"cached_tokens": 10}, "gen-0": {"cached_tokens": 10**6}})
    doc, checks = reuse.analyse(_cell(), _res(whole), counts=counts)
    names = {c.name: c.ok for c in checks}
    assert names["cached_tokens_meaningful"] is False and names["reuse_vs_theoretical"] is False
    assert doc["turns"][1]["cached_tokens"] is None and not doc["cached_tokens_trusted"]


def test_an_answer_that_does_not_round_trip_is_flagged():
    recs = conversation("s", 3, 100, 20, STICKY)
    recs[0] = Record(**{**recs[0].__dict__, "osl": 27})  # aiperf re-tokenized the answer text into 27 tokens
    _, checks = reuse.analyse(_cell(), _res(recs))
    c = next(c for c in checks if c.name == "answers_round_trip")
    assert not c.ok and "#649" in c.reason and "27 for 20" in c.reason


def test_answers_never_reused_where_they_were_generated_are_flagged(monkeypatch):
    # conditional disaggregation prefilled later turns on the generation server, yet the reuse stops at the
    # previous prompt every time: the answers' KV was there but their text did not encode to its ids
    recs = conversation("s", 3, 100, 20, STICKY)
    proof = SimpleNamespace(available=True, kind="standin-stats", local_prefill=2, kv_transfers=1)
    _, checks = reuse.analyse(_cell(), _res(recs), proof=proof)
    c = next(c for c in checks if c.name == "answers_round_trip")
    assert not c.ok and "2 requests were prefilled on the generation server" in c.reason


def test_server_counts_are_deltas_and_give_the_context_prefill_rate():
    it = {"iterLatencyMS": 10.0, "inflightBatchingStats": {"numCtxTokens": 400, "numGenRequests": 0},
          "kvCacheStats": {"freeNumBlocks": 3}}
    before = {"workers": {"ctx-0": {"kv_cache": {"cached_tokens": 100, "evicted_blocks": 1}}}}
    after = {"workers": {"ctx-0": {"kv_cache": {"cached_tokens": 350, "evicted_blocks": 1}, "metrics": [it, it]},
                         "gen-0": {"metrics": [{**it, "kvCacheStats": {"freeNumBlocks": 0}}]}},
             "routers": {"context": {"type": "kv_cache_aware", "routed": 5}}}
    c = reuse.server_counts(before, after)
    assert c.per_server["ctx-0"]["cached_tokens"] == 250 and c.ctx_tokens == 800 and c.ctx_ms == 20.0
    assert c.pool_full and c.routers["context"]["routed"] == 5



def test_a_server_restarted_during_the_cell_counts_from_zero_and_is_named():
    before = {"workers": {"ctx-0": {"instance": {"pid": 1}, "kv_cache": {"cached_tokens": 5000, "evicted_blocks": 400}}},
              "proxy_instance": {"pid": 9}, "routers": {"context": {"routed": 100}}}
    after = {"workers": {"ctx-0": {"instance": {"pid": 2}, "kv_cache": {"cached_tokens": 800, "evicted_blocks": 100}}},
             "proxy_instance": {"pid": 10}, "routers": {"context": {"routed": 10}}}
    c = reuse.server_counts(before, after)
    assert c.per_server["ctx-0"] == {"restarted": True, "cached_tokens": 800, "evicted_blocks": 100}
    assert c.routers["context"]["routed"] == 10
    recs = [r for s in range(3) for r in conversation(f"s{s}", 3, 100, 20, NOTHING)]
    _, checks = reuse.analyse(_cell(), _res(recs), counts=c)
    low = next(x for x in checks if x.name == "reuse_vs_theoretical")
    assert not low.ok and "ctx-0 restarted during the cell" in low.reason and "evicted 100 KV blocks" in low.reason


def test_whole_prompt_counts_without_the_servers_counters_leave_reuse_unjudged():
    # a real pre-#13620 TensorRT-LLM: whole-prompt cached_tokens, and no server counter to take reuse from
    recs = [r for s in range(3) for r in conversation(f"s{s}", 3, 100, 20, STICKY)]
    whole = [Record(**{**r.__dict__, "cached_tokens": r.prompt_tokens}) for r in recs]
    counts = reuse.ServerCounts(per_server={"ctx-0": {}, "gen-0": {}})
    _, checks = reuse.analyse(_cell(), _res(whole), counts=counts)
    judged = next(x for x in checks if x.name == "reuse_vs_theoretical")
    assert judged.ok and judged.skipped and "not judged" in judged.reason

# --- the pull-back projection -------------------------------------------------------------------------------------

def test_reverse_bandwidth_comes_from_the_reverse_pairs_of_a_validation_report():
    bw = pullback.reverse_bandwidth(FIX / "validate" / "report-bidirectional.json")
    assert bw.gbps == 1.25 and bw.source == "measured" and "generation→context" in bw.detail
    assert pullback.reverse_bandwidth(FIX / "validate" / "report-bidirectional.json", "median").gbps == 1.6091
    with pytest.raises(pullback.ReportError, match="forward direction only"):
        pullback.reverse_bandwidth(FIX / "validate" / "report-forward-only.json")
    with pytest.raises(pullback.ReportError, match="no such file"):
        pullback.reverse_bandwidth(FIX / "validate" / "nothing")
    with pytest.raises(pullback.ReportError, match="not a `tk validate cluster` report"):
        pullback.reverse_bandwidth(FIX / "aiperf" / "fixed" / "profile_export_aiperf.json")



def test_on_a_shared_host_the_reverse_bandwidth_is_read_not_write(tmp_path):
    # agents sharing a host: a WRITE completes only when its destination is scheduled (docs/validate.md), so the
    # pull-back projection takes the READ figures
    doc = json.loads((FIX / "validate" / "report-bidirectional.json").read_text())
    doc["timing"] = {**(doc.get("timing") or {}), "shared_host": True}
    (tmp_path / "report.json").write_text(json.dumps(doc))
    bw = pullback.reverse_bandwidth(tmp_path)
    assert bw.gbps == 7.6821 and "(READ)" in bw.detail


def test_on_a_shared_host_with_cuda_memory_the_reverse_bandwidth_is_write(tmp_path):
    # one GPU node: cuda_ipc completes a WRITE without the destination's CPU, so WRITE (what a pull-back would issue)
    # stands; a READ measured with --read is UCX's software emulation there (~0.5 GB/s) and must not be projected
    doc = json.loads((FIX / "validate" / "report-bidirectional.json").read_text())
    doc["timing"] = {**(doc.get("timing") or {}), "shared_host": True, "cpu_progressed": False}
    (tmp_path / "report.json").write_text(json.dumps(doc))
    bw = pullback.reverse_bandwidth(tmp_path)
    assert bw.gbps == 1.25 and "(WRITE)" in bw.detail

def test_projection_is_recompute_minus_transfer_per_turn_and_labelled():
    turns = [{"turn": 1, "recomputed_answer_tokens": 0, "ttft_p50_ms": 50.0},
             {"turn": 2, "recomputed_answer_tokens": 100, "ttft_p50_ms": 80.0},
             {"turn": 3, "recomputed_answer_tokens": 100, "ttft_p50_ms": 90.0}]
    fast = pullback.Bandwidth(50.0, "nominal", "infiniband")
    p = pullback.projection(turns, prefill_ms_per_token=0.04, prefill_source="s", kv_bytes_per_token=131072,
                            kv_source="k", bandwidth=fast)
    assert p["label"].startswith("projection, not a measurement") and [r["turn"] for r in p["turns"]] == [2, 3]
    r = p["turns"][0]
    assert r["recompute_ms"] == 4.0 and r["transfer_ms"] == pytest.approx(0.262, abs=1e-3)
    assert r["saved_ttft_ms"] == pytest.approx(3.738, abs=1e-3) and "would save" in p["summary"]
    assert p["inputs"]["reverse_gbps"] == 50.0 and p["inputs"]["prefill_source"] == "s"
    slow = pullback.projection(turns, prefill_ms_per_token=0.04, prefill_source="s", kv_bytes_per_token=131072,
                               kv_source="k", bandwidth=pullback.Bandwidth(2.0, "measured", "tcp"))
    assert slow["turns"][0]["saved_ttft_ms"] < 0 and "would not pay" in slow["summary"]


# --- --compare -----------------------------------------------------------------------------------------------------

def test_compare_axes_make_every_combination_with_their_overrides():
    vs = variants.build_variants(["router=round_robin,kv_cache_aware,conversation", "conditional=off,512"])
    assert len(vs) == 6 and vs[0].label == "router=round_robin conditional=off"
    assert vs[1].overrides == ("proxy.context_router=round_robin", "proxy.conditional_max_local_prefill_length=512",
                               "proxy.generation_router=kv_cache_aware")
    assert vs[0].overrides[-1] == "proxy.conditional_max_local_prefill_length=null"
    generic = variants.build_variants(["context.instances=1,2"])
    assert [v.overrides for v in generic] == [("context.instances=1",), ("context.instances=2",)]
    assert generic[0].slug == "instances-1"


@pytest.mark.parametrize("specs, words", [
    ([], "at least one"), (["router=a"], "one variant only"), (["router"], "KEY=V1,V2"),
    (["conditional=off,soon"], "off or a token count"), (["bad key=1,2"], "recipe field path"),
    (["router=a,a"], "listed twice"), (["router=a,b", "router=c,d"], "given twice"),
    (["a.b=1,2,3,4", "c.d=1,2,3,4,5"], "at most 16"), (["router=x;rm,b"], "plain word")])
def test_compare_refuses_what_it_cannot_run(specs, words):
    with pytest.raises(BenchInputError, match=words):
        variants.build_variants(specs)


def test_recommendation_picks_the_valid_variant_with_the_lowest_later_ttft():
    lines = [{"variant": "rr", "valid": True, "ttft_p50_later_ms": 120.0, "recomputed_later": 900.0,
              "reuse_share": 0.0},
             {"variant": "kv", "valid": True, "ttft_p50_later_ms": 80.0, "recomputed_later": 64.0,
              "reuse_share": 0.9},
             {"variant": "broken", "valid": False, "ttft_p50_later_ms": 10.0}]
    rec = variants.recommend(lines)
    assert rec["variant"] == "kv" and "vs rr: 40 ms (33 %) faster, 836 fewer tokens recomputed" in rec["reason"]
    assert variants.recommend([{"variant": "x", "valid": False}])["variant"] is None


def test_comparison_report_has_a_table_per_variant_and_turn(tmp_path):
    v = variants.build_variants(["router=round_robin,kv_cache_aware"])
    doc = {"verdict": {"exit_code": 0, "summary": "PASS", "checks": []}, "bench_dir": "/x",
           "rows": [{"request_throughput": 2.0}], "multi_turn": {"c": {"reuse_share": 0.5}},
           "turns": [{"turn": 1, "ttft_p50_ms": 50.0, "recomputed_tokens": 0},
                     {"turn": 2, "ttft_p50_ms": 70.0, "recomputed_tokens": 20, "recomputed_answer_tokens": 20}],
           "pullback_projection": {"summary": "s"}}
    lines = [variants.summarise(v[0], doc), variants.summarise(v[1], None, "launch failed")]
    out = {"recipe": "r", "workload": "w", "variants": lines, "recommendation": variants.recommend(lines)}
    variants.write_comparison(tmp_path, out)
    md = (tmp_path / "compare.md").read_text()
    assert "**Recommendation: router=round_robin**" in md and "| router=kv_cache_aware | **failed**" in md
    assert "| router=round_robin | 2 | 70 |" in md and (tmp_path / "compare_turns.png").stat().st_size > 1000
    assert json.loads((tmp_path / "compare.json").read_text())["variants"][0]["ttft_p50_later_ms"] == 70.0



def test_an_interrupted_comparison_keeps_the_variants_measured_and_recommends_nothing(monkeypatch, tmp_path):
    import toolkit.api as api
    from toolkit.runtime.signals import Terminated
    doc = {"verdict": {"exit_code": 0, "summary": "PASS", "checks": []}, "bench_dir": "/x",
           "rows": [{"request_throughput": 2.0}], "multi_turn": {"c": {"reuse_share": 0.9}},
           "turns": [{"turn": 1, "ttft_p50_ms": 50.0}, {"turn": 2, "ttft_p50_ms": 60.0, "recomputed_tokens": 2}]}
    calls = []

    def bench_recipe(recipe, **kw):  # the first variant is measured; SIGTERM arrives during the second
        calls.append(kw["run_dir"])
        if len(calls) == 2:
            raise Terminated(15)
        return doc
    monkeypatch.setattr(api, "bench_recipe", bench_recipe)
    with pytest.raises(Terminated):
        api.bench_compare("standin-multiturn", ["router=round_robin,kv_cache_aware,conversation"], local=True,
                          run_dir=tmp_path / "cmp", workload="multi-turn")
    out = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert out["interrupted"] and [ln["variant"] for ln in out["variants"]] == ["router=round_robin"]
    assert out["not_run"] == ["router-kv_cache_aware", "router-conversation"] and len(calls) == 2
    assert out["recommendation"]["variant"] is None and "1 of 3 variants" in out["recommendation"]["reason"]
    assert "**Recommendation: none**" in (tmp_path / "cmp" / "compare.md").read_text()

# --- workloads ------------------------------------------------------------------------------------------------------

def test_multi_turn_cells_warm_up_apart_with_other_conversations_and_think_time():
    wl = build_workload("multi-turn", isl=256, osl=64, turns=4, concurrency=(4,), turn_delay_ms=500)
    cell = wl.cells[0]
    argv = aiperf_argv(cell, aiperf="aiperf", url="http://p", model="m", tokenizer="t", out_dir="o", seed=100)
    assert "--warmup-request-count" not in argv and "--conversation-turn-delay-mean" in argv
    assert argv[argv.index("--conversation-turn-delay-mean") + 1] == "500"
    warm = aiperf_argv(cell, aiperf="aiperf", url="http://p", model="m", tokenizer="t", out_dir="w", seed=100,
                       warmup_run=True)
    assert warm[warm.index("--random-seed") + 1] == "101" and "--conversation-turn-delay-mean" not in warm


def test_the_shipped_trace_is_a_multi_turn_workload():
    wl = build_workload("multi-turn", trace="multiturn-small", concurrency=(2,))
    cell = wl.cells[0]
    assert cell.trace.endswith("multiturn-small.jsonl") and cell.conversations == 8 and cell.turns == 5
    assert cell.trace_block_size == 64 and cell.expected_isl(1) is None and "8 conversations" in wl.notes[0]
    argv = aiperf_argv(cell, aiperf="aiperf", url="http://p", model="m", tokenizer="t", out_dir="o")
    assert argv[argv.index("--custom-dataset-type") + 1] == "mooncake_trace" and "--isl-block-size" in argv
    assert "--prompt-input-tokens-mean" not in argv


def test_bad_traces_are_refused_with_the_line(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"session_id": "a", "input_length": 10, "output_length": 4}\n{"session_id": "a", "input_length": 0}\n')
    with pytest.raises(BenchInputError, match=r"t.jsonl:2: input_length 0"):
        build_workload("multi-turn", trace=str(bad))
    with pytest.raises(BenchInputError, match="no such file"):
        build_workload("multi-turn", trace=str(tmp_path / "none.jsonl"))
    with pytest.raises(BenchInputError, match="--workload multi-turn"):
        build_workload("fixed", trace="multiturn-small")
    from toolkit.bench.workload import Limits
    with pytest.raises(BenchInputError, match="admits 100"):
        build_workload("multi-turn", trace="multiturn-small", limits=Limits(max_input_len=100))


def test_requests_prefilled_on_the_generation_server_are_by_design_under_conditional_disaggregation():
    from toolkit.bench.probe import Proof
    from toolkit.bench.results import CellResult
    from toolkit.bench.verdict import _disaggregation

    res = {"c": CellResult(name="c", records=conversation("s", 4, 100, 20, STICKY))}
    proof = Proof(kind="standin-stats", available=True, requests=4, context_legs=1, generation_legs=1,
                  kv_transfers=1, local_prefill=3)
    assert not _disaggregation(res, proof)[0].ok  # a deployment that only looks disaggregated
    check = _disaggregation(res, proof, conditional=True)[0]
    assert check.ok and "3 prefilled on the generation server (conditional disaggregation)" in check.reason
    short = Proof(kind="standin-stats", available=True, requests=4, context_legs=0, generation_legs=1,
                  kv_transfers=1, local_prefill=3)
    assert not _disaggregation(res, short, conditional=True)[0].ok
