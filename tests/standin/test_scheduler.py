"""The emulated engine's scheduler (toolkit.standin.scheduler): exact iteration compositions and times."""

from __future__ import annotations

import pytest

from toolkit.facts.models import resolve_model
from toolkit.facts.roofline import decode_step_time, iteration_time, prefill_time, roofline
from toolkit.standin.scheduler import CONTEXT_ONLY, FULL, GENERATION_ONLY, Scheduler


def unit_cost(shape):  # 1 ms per computed token: easy to read
    return shape.computed_tokens * 1e-3


def sched(mbs=4, mnt=4096, chunked=False, tpb=32, cost=unit_cost):
    return Scheduler(max_batch_size=mbs, max_num_tokens=mnt, chunked_prefill=chunked, tokens_per_block=tpb,
                     cost=cost)


def compose(it):
    return (it.chunks, it.decodes, it.emitted, it.finished)


def test_whole_request_prefills_then_decodes_one_token_per_iteration():
    s = sched()
    assert s.add(1, FULL, 100, 3) == ()
    it = s.step()
    assert compose(it) == (((1, 100),), (), ((1, 1),), ())
    assert it.computed_tokens == 100 and it.kv_tokens_read == 100 and it.seconds == pytest.approx(0.1)
    it = s.step()
    assert compose(it) == ((), (1,), ((1, 1),), ()) and it.kv_tokens_read == 101
    it = s.step()
    assert compose(it) == ((), (1,), ((1, 1),), (1,)) and it.kv_tokens_read == 102
    assert s.step() is None and not s.pending()


def test_long_prefill_stalls_the_decodes_of_its_iteration_with_the_roofline():
    r = roofline(resolve_model("meta-llama/Llama-3.1-8B-Instruct"), "H100")
    s = sched(mbs=8, mnt=8192, cost=lambda s: iteration_time(r, s.computed_tokens, s.kv_tokens_read))
    s.add(1, FULL, 128, 50)
    s.add(2, FULL, 128, 50)
    first = s.step()
    assert first.chunks == ((1, 128), (2, 128)) and first.decodes == ()
    # 256 prompt tokens: compute-bound (the ridge is at about 169 tokens for Llama-3.1-8B BF16 on H100)
    assert first.seconds == pytest.approx(prefill_time(r, 256))
    steady = s.step()
    assert steady.decodes == (1, 2) and steady.seconds == pytest.approx(decode_step_time(r, 129 + 129))
    s.add(3, FULL, 2048, 10)
    stalled = s.step()
    assert stalled.decodes == (1, 2) and stalled.chunks == ((3, 2048),)
    assert stalled.computed_tokens == 2050
    assert stalled.seconds == pytest.approx(prefill_time(r, 2050)) and stalled.seconds > 10 * steady.seconds


def test_chunked_prefill_fills_the_budget_in_block_multiples():
    s = sched(mbs=8, mnt=512, chunked=True, tpb=32)
    s.add(1, FULL, 10, 100)
    s.add(2, FULL, 10, 100)
    s.step()  # both prompts (20 tokens)
    s.add(3, FULL, 2000, 5)
    it = s.step()
    # 2 decodes leave 510 tokens: the chunk is 480 (15 blocks of 32)
    assert it.decodes == (1, 2) and it.chunks == ((3, 480),) and it.computed_tokens == 482
    assert it.emitted == ((1, 1), (2, 1))
    sizes = [s.step().chunks for _ in range(4)]
    assert sizes == [((3, 480),), ((3, 480),), ((3, 480),), ((3, 80),)]  # the last chunk is what remains
    assert s.active[2].generated == 1


def test_without_chunking_a_prompt_waits_for_a_whole_budget():
    s = sched(mbs=8, mnt=1000)
    s.add(1, FULL, 600, 2)
    s.add(2, FULL, 600, 2)
    it = s.step()
    assert it.chunks == ((1, 600),)
    it = s.step()
    assert it.decodes == (1,) and it.chunks == ((2, 600),) and it.finished == (1,)


def test_max_batch_size_bounds_the_active_requests():
    s = sched(mbs=2)
    for rid in (1, 2, 3):
        s.add(rid, FULL, 10, 2)
    it = s.step()
    assert it.chunks == ((1, 10), (2, 10)) and it.queued == 1
    it = s.step()
    assert it.finished == (1, 2) and it.chunks == ()
    it = s.step()
    assert it.chunks == ((3, 10),) and it.queued == 0


def test_context_server_prefills_only_and_generation_server_only_decodes():
    ctx = sched()
    ctx.add(7, CONTEXT_ONLY, 300, 1)
    it = ctx.step()
    assert compose(it) == (((7, 300),), (), ((7, 1),), (7,))
    gen = sched()
    assert gen.add(7, GENERATION_ONLY, 300, 3) == ((7, 1),)  # the context server's token, at once
    it = gen.step()
    assert compose(it) == ((), (7,), ((7, 1),), ()) and it.kv_tokens_read == 301
    assert gen.step().finished == (7,)
    assert gen.add(8, GENERATION_ONLY, 5, 1) == ((8, 1),) and not gen.pending()
