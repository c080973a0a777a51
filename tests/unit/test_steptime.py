"""The iteration-time table (toolkit.facts.steptime) and the choice of aiconfigurator data (pure: no aiconfigurator).

The table stores aiconfigurator's parts of an iteration on grids and composes them as its forward-pass model does;
here the parts are simple functions, so every lookup has an exact expected value."""

from __future__ import annotations

import math

import pytest

from toolkit.facts import steptime as st
from toolkit.size.aiconfigurator import DataChoice, SizingError, choose_data, quant_modes
from toolkit.facts.steptime import IterationShape as Shape


# --- grids and interpolation -------------------------------------------------------------------------------------

@pytest.mark.parametrize("grid", [st.octaves(8192), st.octaves(2), st.steps(10240), st.steps(3),
                                  st.axis(131072, first=16, factor=2 ** 0.25), st.axis(5, dense_to=4)])
def test_grids_increase_strictly_and_end_at_their_limit(grid):
    assert all(a < b for a, b in zip(grid, grid[1:]))
    assert grid[0] >= 1


def test_octaves_keep_both_sides_of_every_power_of_two():
    grid = st.octaves(8192)
    assert grid[-1] == 8192 and set(range(1, 9)) <= set(grid)
    for k in range(4, 13):
        assert {2 ** k, 2 ** k + 1} <= set(grid)
    assert st.octaves(1000)[-1] == 1000


def test_dense_steps_every_integer_then_every_8_then_every_32():
    grid = st.steps(2000)
    assert grid[:64] == tuple(range(1, 65)) and 72 in grid and 1024 in grid and 1056 in grid and grid[-1] == 2000
    assert 1040 not in grid


def test_dense_steps_keep_the_point_just_past_each_power_of_two_and_multiple_of_256():
    grid = set(st.steps(8192))
    assert {2 ** k + 1 for k in range(6, 13)} <= grid and {97, 161, 1281, 2305, 3585} <= grid
    assert 1057 not in grid and 8193 not in grid


def test_interpolation_is_exact_at_grid_points_and_for_multilinear_functions():
    xs, ys, zs = (1, 2, 4, 8), (1, 3, 9), (0, 10, 100)

    def f(x, y, z):  # multilinear: linear in each variable with the others fixed
        return 2 + 3 * x + 5 * y + 7 * z + 0.5 * x * y + 0.25 * y * z + 0.125 * x * z + 0.01 * x * y * z
    v3 = tuple(f(x, y, z) for x in xs for y in ys for z in zs)
    v2 = tuple(f(x, y, 0) for x in xs for y in ys)
    v1 = tuple(f(x, 1, 0) for x in xs)
    for x, y, z in [(1, 1, 0), (8, 9, 100), (3, 2, 55), (7.5, 8.9, 0.5), (2, 3, 10)]:
        assert st.interp3(xs, ys, zs, v3, x, y, z) == pytest.approx(f(x, y, z))
        assert st.interp2(xs, ys, v2, x, y) == pytest.approx(f(x, y, 0))
        assert st.interp1(xs, v1, x) == pytest.approx(f(x, 1, 0))


def test_past_the_last_point_it_extrapolates_the_last_cell_and_below_the_first_it_holds():
    xs, vs = (1, 2, 4), (10.0, 20.0, 30.0)
    assert st.interp1(xs, vs, 8) == pytest.approx(50.0)  # slope of the last cell: 5 per unit
    assert st.interp1(xs, vs, 0.5) == 10.0


# --- the table's composition -------------------------------------------------------------------------------------

class Parts:
    """aiconfigurator's parts as simple functions (milliseconds), with the same relations its own have:
    prefill_ms = S(n t) + R(n) + A(n, t) + C(n, t, p); decode_ms = N(m) + G(m, k)."""

    describe, notes = "fake model (TP1)", ("a note",)

    def S(self, x): return 5.0 + 0.02 * x + (0.7 if x > 512 else 0.0)  # a step past 512, as GEMM data has  # noqa: E704
    def R(self, n): return 0.001 * n  # noqa: E704
    def A(self, n, t): return 0.0005 * n * t  # noqa: E704
    def C(self, n, t, p): return 1e-6 * n * t * p  # noqa: E704
    def N(self, m): return 4.0 + 0.03 * m  # noqa: E704
    def G(self, m, k): return 2e-5 * m * k  # noqa: E704

    def shared_ms(self, x): return self.S(x)  # noqa: E704
    def context_attention_ms(self, n, t): return self.A(n, t)  # noqa: E704
    def prefill_ms(self, n, t, p): return self.S(n * t) + self.R(n) + self.A(n, t) + self.C(n, t, p)  # noqa: E704
    def decode_ms(self, m, k): return self.N(m) + self.G(m, k)  # noqa: E704
    def decode_attention_ms(self, m, k): return self.G(m, k)  # noqa: E704


@pytest.fixture(scope="module")
def table():
    return st.build(Parts(), max_batch_size=64, max_num_tokens=4096, max_seq_len=8192, source="fake data")


def test_a_prefill_only_iteration_is_the_context_phase_at_its_average_shape(table):
    p = Parts()
    assert table.milliseconds(Shape(prefill_requests=1, prefill_tokens=1024)) == pytest.approx(p.prefill_ms(1, 1024, 0))
    # three requests, 2100 new tokens and 2700 cached between them: 700 after 900 each, as aiconfigurator averages
    assert table.milliseconds(Shape(3, 2100, 2700)) == pytest.approx(p.prefill_ms(3, 700, 900), rel=1e-3)


def test_a_decode_only_iteration_is_one_generation_step(table):
    assert table.milliseconds(Shape(decode_requests=8, decode_kv_tokens=8 * 1100)) == \
        pytest.approx(Parts().decode_ms(8, 1100))


def test_a_mixed_iteration_counts_the_non_attention_work_once_over_all_its_tokens(table):
    p = Parts()
    got = table.milliseconds(Shape(1, 512, 512, 8, 8 * 1100))
    assert got == pytest.approx(p.S(512 + 8) + p.A(1, 512) + p.C(1, 512, 512) + p.G(8, 1100), rel=1e-3)
    # not the prefill plus the decode step: their non-attention work would be counted twice
    assert got < p.prefill_ms(1, 512, 512) + p.decode_ms(8, 1100) - 3.0


def test_a_step_in_the_gemm_data_is_kept_within_the_dense_grid(table):
    at, past = (table.milliseconds(Shape(1, x)) for x in (512, 520))  # S is sampled every 8 tokens here
    assert past - at == pytest.approx(0.7 + 0.02 * 8 + 0.0005 * 8, abs=1e-6)


def test_empty_iterations_take_no_time_and_seconds_are_milliseconds_over_1000(table):
    assert table.milliseconds(Shape()) == 0.0
    shape = Shape(decode_requests=4, decode_kv_tokens=400)
    assert table.seconds(shape) == pytest.approx(table.milliseconds(shape) / 1e3)


def test_attention_dp_times_one_ranks_share():
    table = st.build(Parts(), max_batch_size=64, max_num_tokens=4096, max_seq_len=8192, attention_dp=4)
    assert table.batch[-1] == 16  # 64 requests over 4 ranks
    assert table.milliseconds(Shape(decode_requests=32, decode_kv_tokens=32 * 1000)) == \
        pytest.approx(Parts().decode_ms(8, 1000))


def test_attention_dp_never_splits_a_request_across_ranks():
    """TensorRT-LLM places whole requests on attention-DP ranks: the busiest rank holds ceil(r / d) of them."""
    alone = st.build(Parts(), max_batch_size=64, max_num_tokens=4096, max_seq_len=8192)
    spread = st.build(Parts(), max_batch_size=64, max_num_tokens=4096, max_seq_len=8192, attention_dp=8)
    for shape in (Shape(1, 2048), Shape(1, 1000, 3000), Shape(decode_requests=1, decode_kv_tokens=5000),
                  Shape(1, 512, 0, 1, 900)):
        assert spread.milliseconds(shape) == pytest.approx(alone.milliseconds(shape), rel=1e-9)
    # 10 prompts of 300 tokens on 8 ranks: one rank runs 2 of them; 12 decodes: one rank runs 2 of mean KV
    assert spread.milliseconds(Shape(10, 3000)) == pytest.approx(Parts().prefill_ms(2, 300, 0), rel=1e-3)
    assert spread.milliseconds(Shape(decode_requests=12, decode_kv_tokens=12 * 700)) == \
        pytest.approx(Parts().decode_ms(2, 700), rel=1e-3)


def test_a_lookup_costs_microseconds(table):
    import time
    shape = Shape(2, 900, 300, 48, 48 * 1000)
    t0 = time.perf_counter()
    for _ in range(2000):
        table.seconds(shape)
    assert (time.perf_counter() - t0) / 2000 < 200e-6  # ~10 µs on the 2-core box; generous for a loaded CI


def test_unusable_figures_are_refused_at_build():
    class Broken(Parts):
        def decode_attention_ms(self, m, k):
            return math.nan if k > 100 else 1.0
    with pytest.raises(ValueError, match="unusable times"):
        st.build(Broken(), max_batch_size=4, max_num_tokens=256, max_seq_len=512)


def test_the_summary_says_what_and_where_from(table):
    doc = table.summary()
    assert doc["describe"] == "fake model (TP1)" and doc["source"] == "fake data" and doc["notes"] == ["a note"]
    assert doc["grid"]["batch"][1] == 64 and doc["grid"]["kv"][1] == 8192 and doc["points"] > 1000


def test_shape_counts_what_the_roofline_reads():
    s = Shape(2, 300, 100, 5, 5000)
    assert s.computed_tokens == 305 and s.kv_tokens_read == 5400


# --- which aiconfigurator data times which TensorRT-LLM ----------------------------------------------------------

def listing(system):
    return {"h100_sxm": (["1.3.0rc20", "1.3.0rc23"], "1.3.0rc20"), "a100_sxm": (["1.0.0"], None)}.get(system, ([], None))


def test_the_release_asked_for_when_aiconfigurator_has_it():
    assert choose_data("H100", "1.3", "1.3.0rc23", listing) == DataChoice("h100_sxm", "1.3.0rc23",
                                                                          "the release asked for")


def test_otherwise_its_maintained_default_of_the_same_line():
    choice = choose_data("H100", "1.3", "1.3.0rc24", listing)
    assert choice.version == "1.3.0rc20" and "maintained default" in choice.note and "1.3.0rc24" in choice.note
    assert choose_data("H100", "1.3", None, listing).version == "1.3.0rc20"


def test_otherwise_the_newest_of_the_line():
    assert choose_data("H100", "1.3", None, lambda s: (["1.3.0rc9", "1.3.0rc20", "1.2.0"], None)).version == "1.3.0rc20"
    assert choose_data("A100", "1.0", "v1.0.0", listing).version == "1.0.0"


def test_no_data_of_the_line_or_for_the_gpu_is_a_reason_naming_what_there_is():
    with pytest.raises(SizingError, match=r"no TensorRT-LLM 1\.2 data for h100_sxm \(it has 1\.3\.0rc20, 1\.3\.0rc23\)"):
        choose_data("H100", "1.2", None, listing)
    with pytest.raises(SizingError, match="no system for GPU CPU"):
        choose_data("CPU", "1.3", None, listing)
    with pytest.raises(SizingError, match="no TensorRT-LLM data for gb200"):
        choose_data("GB200", "1.3", None, listing)


def test_quant_modes_follow_the_precision_the_checkpoint_and_the_kv_dtype():
    from toolkit.facts.models import BUILTIN_MODELS as M
    assert quant_modes(M["meta-llama/Llama-3.1-8B-Instruct"], "bf16", "auto") == \
        {"gemm_quant_mode": "bfloat16", "kvcache_quant_mode": "bfloat16"}
    assert quant_modes(M["Qwen/Qwen3-30B-A3B"], "fp8", "fp8") == \
        {"gemm_quant_mode": "fp8", "moe_quant_mode": "fp8", "kvcache_quant_mode": "fp8"}
    assert quant_modes(M["deepseek-ai/DeepSeek-V3"], "fp8", "auto")["gemm_quant_mode"] == "fp8_block"
