"""Spec: the plan knows which TensorRT-LLM cache transceiver a recipe's servers run and what it hands NIXL for one
request, per (context rank, generation rank) pair (toolkit/facts/transceiver.py, toolkit/plan/transceiver.py)."""

from __future__ import annotations

import json

import pytest

from tests.unit.helpers import BASE, plan_of, tk_in_process
from toolkit.facts import llm_args
from toolkit.facts import transceiver as T

MIB = 1 << 20
LLAMA8 = BASE.replace("meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Llama-3.1-8B-Instruct")
# Llama-3.1-8B bf16: 32 layers, 8 KV heads of 128 (2 bytes): one K (or V) of one layer is 2 KiB per token per rank at
# TP1, 1 KiB at TP2


def test_a_1_2_recipe_moves_one_staged_descriptor_per_rank_pair_of_the_request_s_bytes():
    """TensorRT-LLM 1.2 runs the C++ transceiver: the request's blocks gathered into one staging slice per target
    rank, one WRITE of one descriptor (cacheFormatter.cpp, AgentConnection::send)."""
    p = plan_of(LLAMA8, "quantization=bfloat16", "trtllm_version=1.2", "generation.tp=2", "traffic.max_input_len=8192")
    t = p.kv_transfer.transceiver
    assert (t.runtime, t.layout, t.mapper) == (T.Runtime.CPP, T.Layout.STAGED, T.Layout.HEAD_MISMATCH)
    assert t.targets_per_context_rank == 2  # context TP1 -> generation TP2: each gets half the heads
    d = t.longest
    assert (d.count, d.tokens, d.blocks) == (1, 8192, 256)
    assert d.bytes_each == d.total_bytes == 8192 * 32 * 2 * 1024  # the pair's heads, every layer, K and V: 512 MiB
    assert t.model.startswith("C++ transceiver: staged-per-rank-pair, 1 descriptor per rank pair of 512.0 MiB")
    # 1.2's own snapshot has no transceiver_runtime: the C++ transceiver, cited from 1.2's file (not the 1.3
    # manifest after it, which has the field)
    assert "no transceiver_runtime" in t.runtime_reason and "llm_args.py @ 3e906a0ed7c6" in t.default_source
    assert t.verified


def test_a_1_3_recipe_on_the_python_runtime_moves_the_mapper_s_lists():
    """TP differs: HeadMismatchMapper, one descriptor per block x layer x K/V of the shared heads (peer.py)."""
    p = plan_of(LLAMA8, "quantization=bfloat16", "trtllm_version=1.3.0rc27", "kv_transfer.runtime=PYTHON",
                "generation.tp=2", "traffic.max_input_len=8192")
    t = p.kv_transfer.transceiver
    assert (t.runtime, t.layout) == (T.Runtime.PYTHON, T.Layout.HEAD_MISMATCH)
    assert (t.longest.count, t.longest.bytes_each) == (256 * 32 * 2, 32 * 1024)
    assert t.longest.total_bytes == 8192 * 32 * 2 * 1024  # the same bytes as the C++ transceiver's one descriptor
    same = plan_of(LLAMA8, "quantization=bfloat16", "trtllm_version=1.3.0rc27", "kv_transfer.runtime=PYTHON")
    assert (same.kv_transfer.transceiver.layout, same.kv_transfer.transceiver.longest.count) == (T.Layout.PER_BLOCK, 128)
    assert same.kv_transfer.transceiver.longest.bytes_each == 32 * 32 * 2 * 2048  # a whole block: 4 MiB


def test_the_default_and_what_it_selects_are_the_generated_data_s():
    """manifest@0004396 (1.3.0rc27..1.4.0rc1): default 'auto', which selects the Python transceiver, the C++ one for
    a non-NIXL backend or a null kv_transfer_timeout_ms; manifest@92e3075 (1.3.0rc18..rc20): default null (C++).
    Each read from trtllm_data.json (llm_args.entry: default, resolves), none from tk's code."""
    for release in ("1.3.0rc27", "1.4.0rc1"):
        nixl = plan_of(LLAMA8, f"trtllm_version={release}").kv_transfer.transceiver
        assert (nixl.runtime, nixl.runtime_setting, nixl.verified) == (T.Runtime.PYTHON, "auto", True)
        assert "manifest.json @ 000439672005" in nixl.default_source and "default 'auto'" in nixl.default_source
        entry = llm_args.entry(T.RUNTIME_PATH, llm_args.Target(release[:3], release))
        assert entry["default"] == nixl.runtime_setting and entry["resolves"]["auto"] == nixl.runtime.value
    ucx = plan_of(LLAMA8, "trtllm_version=1.3.0rc27", "kv_transfer.backend=UCX").kv_transfer.transceiver
    assert ucx.runtime is T.Runtime.CPP and "backend UCX" in ucx.runtime_reason
    early = plan_of(LLAMA8, "trtllm_version=1.3.0rc20").kv_transfer.transceiver
    assert (early.runtime, early.runtime_setting) == (T.Runtime.CPP, None) and "92e3075299d7" in early.default_source
    rc27 = llm_args.Target("1.3", "1.3.0rc27")
    assert T.choose_runtime(rc27, True, "auto", "NIXL", timeout_ms_null=True).runtime is T.Runtime.CPP
    assert T.choose_runtime(rc27, True, None, "NIXL").runtime is T.Runtime.CPP  # None is equivalent to CPP


def test_what_a_setting_selects_follows_the_data_not_the_code():
    """A snapshot whose data says 'auto' selects the C++ transceiver is read so; a snapshot without the field has
    only the C++ transceiver; a setting the snapshot does not resolve is left to the rules (None)."""
    flipped = T.SnapshotRuntime("a snapshot", "1.9", has_field=True, default="auto",
                                resolves=(("auto", "CPP"), ("auto_when_not_nixl", "CPP"), ("null", "PYTHON")))
    assert flipped.select("auto", "NIXL", False)[0] is T.Runtime.CPP
    assert flipped.select(None, "NIXL", False)[0] is T.Runtime.PYTHON
    assert flipped.select("auto", "NIXL", True) is None  # the data says nothing of auto with a null timeout
    assert T.SnapshotRuntime("s", "1.2", has_field=False).select("PYTHON", "NIXL", False)[0] is T.Runtime.CPP


def test_a_release_between_snapshots_that_disagree_is_planned_from_the_newer_and_named_unverified():
    """1.3.0rc23 lies between manifest@92e3075 (null: C++) and manifest@0004396 ('auto': Python on NIXL): the plan
    takes the newer one's, as llm_args reads every field there, says which transceiver is unverified, and refuses
    no buffer that only the C++ transceiver would fail."""
    p = plan_of(LLAMA8, "trtllm_version=1.3.0rc23")
    t = p.kv_transfer.transceiver
    assert (t.runtime, t.verified) == (T.Runtime.PYTHON, False)
    assert any("which cache transceiver TensorRT-LLM 1.3.0rc23 runs is unverified" in w for w in p.warnings)
    p = plan_of(LLAMA8, "trtllm_version=1.3.0rc23", "traffic.max_input_len=4096",
                "kv_transfer.max_tokens_in_buffer=2048")  # no RecipeError
    assert any("smaller than the longest input" in w and "Agent need all buffer pre-allocated" in w
               for w in p.warnings)
    chosen = plan_of(LLAMA8, "trtllm_version=1.3.0rc23", "kv_transfer.runtime=CPP")
    assert chosen.kv_transfer.transceiver.verified and not any("unverified" in w and "transceiver" in w
                                                               for w in chosen.warnings)


def test_the_1_4_recipe_plans_the_python_transceiver_and_a_1_2_recipe_the_cpp_staged_one():
    from tests.conftest import ROOT
    from toolkit.plan import build_plan
    from toolkit.recipe import load_recipe

    py = build_plan(load_recipe(ROOT / "recipes" / "standin-1p1d-1.4.yaml")).kv_transfer.transceiver
    assert (py.runtime, py.layout, py.runtime_setting) == (T.Runtime.PYTHON, T.Layout.PER_BLOCK, "auto")
    cpp = build_plan(load_recipe(ROOT / "recipes" / "llama-3.1-8b-1node.yaml")).kv_transfer.transceiver
    assert (cpp.runtime, cpp.layout, cpp.longest.count) == (T.Runtime.CPP, T.Layout.STAGED, 1)


def test_pipeline_parallelism_that_differs_moves_blocks_over_the_shared_layers():
    assert T.mapper_layout(1, 1, 8, False, 32, 16) is T.Layout.HEAD_MATCH
    assert T.mapper_layout(4, 8, 8, False, 32, 32) is T.Layout.HEAD_MISMATCH
    assert T.mapper_layout(8, 16, 8, False, 32, 32) is T.Layout.PER_BLOCK  # TP 16 > 8 heads: duplicated, they match
    assert T.mapper_layout(1, 8, 1, True, 61, 61) is T.Layout.PER_BLOCK  # MLA's latent is not split by TP
    assert T.targets_per_context_rank(1, 2, 1, 2) == 4


def test_an_mla_context_rank_sends_its_latent_to_every_generation_rank_it_feeds():
    # MLACacheFormatter::format sends one slice per PP domain to every connection, and the connections are
    # targetIRanks' TP domain x PP domain (cacheSplitConcat.cu): the latent is not split by TP but each generation TP
    # rank (attention DP off) needs it whole; under generation attention DP one rank serves the request
    assert T.targets_per_context_rank(1, 8, 1, 1) == 8
    assert T.targets_per_context_rank(1, 1, 1, 2) == 2  # attention DP on the generation side: TP 1 per group
    assert T.targets_per_context_rank(8, 1, 1, 1) == 1  # fewer generation ranks: one sender each


def test_the_bounce_buffer_coalesces_what_clears_its_gate():
    g = T.RankPairGeometry(tokens_per_block=32, layers=32, kv_factor=2, slot_bytes_per_token=1024)
    big = T.descriptors(T.Layout.HEAD_MISMATCH, g, 8192)
    assert T.layout_for(T.Runtime.PYTHON, T.Layout.HEAD_MISMATCH, 1024, big.total_bytes) is T.Layout.BOUNCE
    assert T.layout_for(T.Runtime.PYTHON, T.Layout.HEAD_MISMATCH, 256, big.total_bytes) is T.Layout.HEAD_MISMATCH
    small = T.descriptors(T.Layout.HEAD_MISMATCH, T.RankPairGeometry(32, 16, 2, 1024), 32)  # below the 2 MiB gate
    assert small.total_bytes == MIB
    assert T.layout_for(T.Runtime.PYTHON, T.Layout.HEAD_MISMATCH, 1024, small.total_bytes) is T.Layout.HEAD_MISMATCH
    assert T.layout_for(T.Runtime.CPP, T.Layout.HEAD_MISMATCH, 1024, big.total_bytes) is T.Layout.STAGED
    p = plan_of(LLAMA8, "quantization=bfloat16", "trtllm_version=1.3.0rc27", "kv_transfer.runtime=PYTHON",
                "kv_transfer.bounce_size_mb=1024", "generation.tp=2", "traffic.max_input_len=8192")
    t = p.kv_transfer.transceiver
    assert (t.layout, t.longest.count, t.bounce_size_mb) == (T.Layout.BOUNCE, 1, 1024)


def test_the_bounce_region_is_its_size_rounded_up_to_whole_chunks():
    # FixedSizing.resolve (native/bounce/config.py @ 247f14e5): max(round_up(capacity_mb MiB, chunk), chunk) with
    # Config.chunk_mb 32: a 500 MiB setting holds a 510 MiB request, a 1 MiB one a 20 MiB request
    assert T.layout_for(T.Runtime.PYTHON, T.Layout.HEAD_MISMATCH, 500, 510 * MIB) is T.Layout.BOUNCE
    assert T.layout_for(T.Runtime.PYTHON, T.Layout.HEAD_MISMATCH, 1, 20 * MIB) is T.Layout.BOUNCE
    assert T.layout_for(T.Runtime.PYTHON, T.Layout.HEAD_MISMATCH, 500, 513 * MIB) is T.Layout.HEAD_MISMATCH


def test_the_bounce_buffer_takes_one_writer_per_generation_rank_only():
    """VmmBounceTransport.reserve (native/bounce/impl.py @ 0e63c12e): "Multi-writer bounce is intentionally rejected"
    (a generation rank fed by several context ranks stays on the per-block path): context TP2 -> generation TP1 has
    two writers for each generation rank's heads, context PP2 -> generation PP1 two for its layers."""
    g = T.RankPairGeometry(tokens_per_block=32, layers=32, kv_factor=2, slot_bytes_per_token=1024)
    big = T.descriptors(T.Layout.HEAD_MISMATCH, g, 8192)
    assert T.layout_for(T.Runtime.PYTHON, T.Layout.HEAD_MISMATCH, 1024, big.total_bytes, writers=2) \
        is T.Layout.HEAD_MISMATCH
    assert T.writers_per_generation_rank(2, 1, 1, 1, 8, False) == 2
    assert T.writers_per_generation_rank(1, 2, 1, 1, 8, False) == 1
    assert T.writers_per_generation_rank(1, 1, 2, 1, 8, False) == 2
    assert T.writers_per_generation_rank(16, 8, 1, 1, 8, False) == 1  # duplicated heads: one of the two sends
    assert T.writers_per_generation_rank(8, 1, 1, 1, 1, True) == 1  # MLA: one context rank sends the latent
    p = plan_of(LLAMA8, "quantization=bfloat16", "trtllm_version=1.3.0rc27", "kv_transfer.runtime=PYTHON",
                "kv_transfer.bounce_size_mb=1024", "context.tp=2", "traffic.max_input_len=8192")
    t = p.kv_transfer.transceiver
    assert (t.layout, t.writers_per_generation_rank) == (T.Layout.HEAD_MISMATCH, 2)
    from toolkit.validate.params import Options, geometry

    transfer = geometry(p, Options(mode="local", sweep=False, curve=False))[0]["transfer"]
    assert not any(transfer["staged"]) and transfer["layout"] == T.Layout.HEAD_MISMATCH.value
    from toolkit.validate.report import advise  # nor is the bounce buffer advised where it would not coalesce

    rows = [{"descriptors": n, "gbps_median": g} for n, g in ((1, 1100.0), (256, 41.0), (2048, 6.1))]
    pairs = [{"direction": "forward", "op": "WRITE", "lengths": [
        {"tokens": 8192, "bytes": 96 * MIB, "descriptors": 3072, "staged": False}]}]
    assert advise(transfer, rows, pairs, 32, True, "")["bounce_size_mb"] is None


def test_the_transfer_time_an_emulation_takes_from_the_model():
    """Issue 32's emulated KV transfer: descriptors x per-descriptor overhead + bytes / bandwidth, plus a gather and
    a scatter (device copies) where the layout stages."""
    g = T.RankPairGeometry(tokens_per_block=32, layers=32, kv_factor=2, slot_bytes_per_token=1024)
    staged = T.descriptors(T.Layout.STAGED, g, 8192)
    lists = T.descriptors(T.Layout.HEAD_MISMATCH, g, 8192)
    a = T.transfer_time(staged, link_gbps=100, per_descriptor_s=5e-6, copy_gbps=1000)
    b = T.transfer_time(lists, link_gbps=100, per_descriptor_s=5e-6, copy_gbps=1000)
    assert a.transfer_s == pytest.approx(5e-6 + 512 * MIB / 100e9)
    assert a.gather_s == a.scatter_s == pytest.approx(512 * MIB / 1000e9) and b.gather_s == b.scatter_s == 0
    assert b.transfer_s == pytest.approx(16384 * 5e-6 + 512 * MIB / 100e9)
    assert a.total_s == pytest.approx(a.gather_s + a.transfer_s + a.scatter_s)
    with pytest.raises(ValueError, match="link_gbps"):
        T.transfer_time(staged, link_gbps=float("nan"))
    curve = T.same_bytes(staged.total_bytes, 2048)
    assert (curve.count, curve.bytes_each, curve.total_bytes) == (2048, 256 * 1024, 512 * MIB)


def test_tk_plan_shows_the_transceiver_and_its_json_carries_it():
    out = tk_in_process("plan", "llama-3.1-8b-1node", "--json")
    assert out.returncode == 0, out.stderr
    t = json.loads(out.stdout)["transceiver"]
    assert (t["runtime"], t["layout"], t["longest"]["count"]) == ("CPP", "staged-per-rank-pair", 1)
    shown = tk_in_process("plan", "llama-3.1-8b-1node")
    assert "C++ transceiver: staged-per-rank-pair, 1 descriptor per rank pair" in " ".join(shown.stderr.split())


def test_validate_names_the_backend_default_resolves_to():
    # backend DEFAULT is UCX on 1.0/1.1 and NIXL from 1.2 (resolve_backend): the validator's preflight says which
    from toolkit.validate.run import _coordinator_preflight

    old = plan_of(LLAMA8, "quantization=bfloat16", "trtllm_version=1.1.0", "kv_transfer.backend=DEFAULT")
    assert old.kv_transfer.transceiver.backend == "UCX"
    [check] = _coordinator_preflight(old)
    assert "DEFAULT (UCX on TensorRT-LLM 1.1.0)" in check["detail"] and "uses UCX directly" in check["detail"]
    new = plan_of(LLAMA8, "quantization=bfloat16", "trtllm_version=1.2", "kv_transfer.backend=DEFAULT")
    [check] = _coordinator_preflight(new)
    assert "DEFAULT (NIXL on TensorRT-LLM 1.2" in check["detail"] and "moves KV with NIXL" in check["detail"]
