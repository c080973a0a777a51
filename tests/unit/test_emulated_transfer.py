"""The stand-in's emulated KV transfer (toolkit.standin.emulate.kv_transfer): the emulated model's KV moved as
TensorRT-LLM's transceiver moves it (toolkit.facts.transceiver), at the transport's or a validation run's GB/s."""

from __future__ import annotations

import json

import pytest

from toolkit.facts import transceiver as T
from toolkit.facts.models import resolve_model
from toolkit.standin.emulate import EmulationError, KvTransfer, Layout, from_env, kv_transfer

LLAMA8 = resolve_model("meta-llama/Llama-3.1-8B-Instruct")  # 32 layers, 8 KV heads of 128: 128 KiB/token in bf16
TP1, TP2 = Layout(1), Layout(2)


def xfer(ctx=TP1, gen=TP1, runtime="CPP", bounce=0, tokens=2048, gbps=100.0, model=LLAMA8):
    return kv_transfer(model, kv_dtype="auto", tokens_per_block=32, tokens=tokens, ctx=ctx, gen=gen, runtime=runtime,
                       bounce_size_mb=bounce, link_gbps=gbps)


def test_the_cpp_transceiver_stages_one_descriptor_per_rank_pair_gathered_and_scattered():
    x = xfer()
    total = 2048 * 32 * 2 * 8 * 128 * 2
    assert (x.runtime, x.layout, x.descriptors_per_pair, x.bytes_per_pair) == ("CPP", "staged-per-rank-pair", 1, total)
    copy = total / (T.DEVICE_COPY_GBPS_MEASURED * 1e9)
    assert x.seconds == pytest.approx(2 * copy + T.PER_DESCRIPTOR_S_MEASURED + total / 100e9)


def test_the_python_transceiver_moves_one_descriptor_per_block_and_pays_for_each():
    x = xfer(runtime="PYTHON")
    assert (x.layout, x.descriptors_per_pair) == ("per-block", 64)
    assert x.seconds == pytest.approx(64 * T.PER_DESCRIPTOR_S_MEASURED + x.bytes_per_pair / 100e9)  # no gather
    bounce = xfer(runtime="PYTHON", bounce=1024)  # 268 MiB: above bounce's 2 MiB gate, within 1 GiB
    assert (bounce.layout, bounce.descriptors_per_pair) == ("bounce-coalesced", 1)


def test_more_generation_tp_means_more_targets_per_context_rank_and_smaller_slices():
    cpp = xfer(ctx=TP1, gen=TP2)
    assert cpp.targets_per_context_rank == 2 and cpp.bytes_per_pair == xfer().bytes_per_pair // 2
    py = xfer(ctx=TP1, gen=TP2, runtime="PYTHON")
    assert py.layout == "head-mismatch" and py.descriptors_per_pair == 64 * 32 * 2  # block x layer x K/V
    # attention DP: whole heads per rank, one target
    adp = xfer(ctx=Layout(4, 1, True), gen=Layout(4, 1, True), model=resolve_model("Qwen/Qwen3-30B-A3B"))
    assert adp.targets_per_context_rank == 1 and adp.layout == "staged-per-rank-pair"


def test_the_time_scales_with_the_link():
    slow, fast = xfer(gbps=10.0), xfer(gbps=400.0)
    assert slow.seconds > 10 * fast.seconds > 0 and "10 GB/s" in slow.describe and "C++ transceiver" in slow.describe


def test_the_context_layout_travels_in_the_opaque_state_and_anything_else_is_ignored():
    assert Layout.from_dict(Layout(4, 2, True).to_dict()) == Layout(4, 2, True)
    for bad in (None, [], {"tp": "4", "pp": 1, "attention_dp": False}, {"tp": 0, "pp": 1, "attention_dp": False}):
        assert Layout.from_dict(bad) is None


def test_the_real_read_counts_toward_the_emulated_time_and_an_overrun_is_counted():
    from toolkit.standin.emulate import EmulatedEngine, from_env as emu_env
    emu = emu_env({"TK_STANDIN_EMULATE_MODEL": LLAMA8.name, "TK_STANDIN_EMULATE_GPU": "H100",
                   "TK_STANDIN_EMULATE_KV_GBPS": "100"})
    engine = EmulatedEngine(emu, tp=1, kv_dtype="auto", max_batch_size=4, max_num_tokens=4096, chunked_prefill=False,
                            tokens_per_block=32, transceiver=("CPP", 0))
    x = engine.kv_transfer(2048, None)
    assert isinstance(x, KvTransfer) and x.seconds == pytest.approx(xfer().seconds)
    assert engine.transfer_wait(x, 0.001) == pytest.approx(x.seconds - 0.001)
    assert engine.transfer_wait(x, x.seconds + 0.005) == 0.0
    assert engine.stats["kv_transfers"] == 2 and engine.stats["kv_real_over_emulated_s"] == pytest.approx(0.005)
    aggregated = EmulatedEngine(emu, tp=1, kv_dtype="auto", max_batch_size=4, max_num_tokens=4096,
                                chunked_prefill=False, tokens_per_block=32)
    assert aggregated.kv_transfer(2048, None) is None


def _env(**more):
    return {"TK_STANDIN_EMULATE_MODEL": LLAMA8.name, "TK_STANDIN_EMULATE_GPU": "H100",
            "TK_STANDIN_EMULATE_KV_GBPS": "450", **more}


def test_a_validation_report_replaces_the_nominal_figure_with_its_slowest_pair(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"kind": "tk-validate-cluster", "passed": True,
                                  "bandwidth_matrix": {"gbps": [[12.5, 20.0]]}}))
    emu = from_env(_env(TK_STANDIN_EMULATE_KV_REPORT=str(report)))
    assert emu.kv_gbps == 12.5 and "measured" in emu.kv_link and str(report) in emu.kv_link
    assert from_env(_env()).kv_link == "the transport's nominal 450 GB/s"


def test_a_report_tk_cannot_read_stops_the_server_naming_the_variable(tmp_path):
    bad = tmp_path / "report.json"
    bad.write_text(json.dumps({"kind": "something-else"}))
    with pytest.raises(EmulationError, match="TK_STANDIN_EMULATE_KV_REPORT: .*not a `tk validate cluster` report"):
        from_env(_env(TK_STANDIN_EMULATE_KV_REPORT=str(bad)))
    with pytest.raises(EmulationError, match="must be a positive number"):
        from_env(_env(TK_STANDIN_EMULATE_KV_GBPS="inf"))
