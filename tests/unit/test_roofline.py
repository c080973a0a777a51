"""The roofline timing model (toolkit.facts.roofline): exact times for stated inputs."""

from __future__ import annotations

import pytest

from toolkit.facts.hardware import GPU_FIGURES, GPU_PEAK_TFLOPS
from toolkit.facts.models import resolve_model
from toolkit.facts.roofline import (decode_step_time, iteration_time, prefill_time, roofline, transfer_time)

LLAMA8B = resolve_model("meta-llama/Llama-3.1-8B-Instruct")  # 8.03e9 params, 32 layers x 8 KV heads x 128


def test_every_gpu_row_has_a_source_and_the_plan_reads_the_same_table():
    for name, g in GPU_FIGURES.items():
        assert g.source and g.bf16_tflops > 0 and g.hbm_tbps > 0, name
        assert GPU_PEAK_TFLOPS[name] == g.bf16_tflops


def test_prefill_llama8b_h100_tp1():
    r = roofline(LLAMA8B, "H100")
    # 2 x 8.03e9 x 2048 / (989e12 x 0.4 x 1) = 3.289088e13 / 3.956e14
    assert prefill_time(r, 2048) == pytest.approx(3.289088e13 / 3.956e14, rel=1e-12)
    assert prefill_time(r, 2048) == pytest.approx(0.08314176, rel=1e-6)
    assert prefill_time(r, 128) == pytest.approx(0.08314176 / 16, rel=1e-6)


def test_decode_llama8b_h100_tp1():
    r = roofline(LLAMA8B, "H100")
    assert r.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131072
    # 16.06e9 bytes of BF16 weights / (3.35e12 x 0.7)
    assert decode_step_time(r, 0) == pytest.approx(16.06e9 / 2.345e12, rel=1e-12)
    assert decode_step_time(r, 1000) == pytest.approx((16.06e9 + 1000 * 131072) / 2.345e12, rel=1e-12)


def test_tp2_halves_compute_weights_and_kv_per_rank():
    r1, r2 = roofline(LLAMA8B, "H100"), roofline(LLAMA8B, "H100", tp=2)
    assert r2.kv_bytes_per_token == 65536
    assert prefill_time(r2, 1024) == pytest.approx(prefill_time(r1, 1024) / 2, rel=1e-12)
    assert decode_step_time(r2, 500) == pytest.approx(decode_step_time(r1, 500) / 2, rel=1e-12)


def test_fp8_uses_fp8_peak_and_one_byte_weights():
    r = roofline(LLAMA8B, "H200", precision="fp8")
    assert prefill_time(r, 1000) == pytest.approx(2 * 8.03e9 * 1000 / (1979e12 * 0.4), rel=1e-12)
    assert decode_step_time(r, 0) == pytest.approx(8.03e9 / (4.8e12 * 0.7), rel=1e-12)
    with pytest.raises(ValueError, match="no FP8"):
        roofline(LLAMA8B, "A100", precision="fp8")


def test_iteration_is_the_roofline_of_its_batch():
    r = roofline(LLAMA8B, "H100")
    # 8 decodes with 1000 tokens of context each: memory-bound
    assert iteration_time(r, 8, 8000) == pytest.approx(decode_step_time(r, 8000), rel=1e-12)
    # a 2048-token prefill in the same iteration: compute-bound, the decodes wait for it
    assert iteration_time(r, 2048 + 8, 8000 + 2048) == pytest.approx(prefill_time(r, 2056), rel=1e-12)
    assert iteration_time(r, 0, 0) == 0.0


def test_transfer_time_at_nominal_bandwidth():
    assert transfer_time(50e9, 50.0) == pytest.approx(1.0)
    assert transfer_time(-5, 50.0) == 0.0
