"""The emulated engine's clock (toolkit.standin.emulate.EmulatedEngine): an iteration ends at its start plus its
emulated time, whatever the server's own work does meanwhile, and the prefill iterations it forms are counted by
shape, with how long each request waited for its own."""

from __future__ import annotations

import asyncio
import time

import pytest

from toolkit.facts.models import resolve_model
from toolkit.standin.emulate import Emulation, EmulatedEngine
from toolkit.standin.scheduler import CONTEXT_ONLY

EMU = Emulation(model_arg="meta-llama/Llama-3.1-8B-Instruct", model=resolve_model("meta-llama/Llama-3.1-8B-Instruct"),
                gpu="H100", precision="bf16", kv_gbps=None)
PREFILL_S = 0.06


class PerRequest:
    """A timing that prices a prefill iteration at PREFILL_S per request in it."""

    source, detail = "test", "PREFILL_S per prefill request"

    def seconds(self, shape) -> float:
        return PREFILL_S * shape.prefill_requests + 0.001 * shape.decode_requests

    def summary(self) -> dict:
        return {"source": self.source}


def engine() -> EmulatedEngine:
    return EmulatedEngine(EMU, tp=1, kv_dtype="auto", max_batch_size=8, max_num_tokens=8192, chunked_prefill=False,
                          tokens_per_block=32, timing=PerRequest())


def test_an_iteration_ends_at_its_start_plus_its_emulated_time_while_the_server_works_beside_it():
    async def run():
        eng = engine()
        eng.start()
        try:
            submitted = time.monotonic()
            ticket = eng.submit(CONTEXT_ONLY, 2048, 1)
            await asyncio.sleep(0.005)  # the iteration has started
            time.sleep(0.03)  # the server's own work (tokenizing, KV, JSON) on the loop, inside the iteration
            await ticket.wait_for(1)
            return ticket.first_at - submitted
        finally:
            await eng.stop()
    took = asyncio.run(run())
    # a deadline: 60 ms from the start (give or take the loop's timer ticks), not 60 ms after the 30 ms of work
    assert PREFILL_S <= took < PREFILL_S + 0.02, took


def test_prefill_batches_are_counted_by_shape_with_each_requests_wait_for_its_iteration():
    async def run():
        eng = engine()
        eng.start()
        try:
            first = eng.submit(CONTEXT_ONLY, 2048, 1)
            await asyncio.sleep(0.01)  # the first prompt's prefill is under way: the next two wait for it
            later = [eng.submit(CONTEXT_ONLY, 2048, 1) for _ in range(2)]
            for t in [first, *later]:
                await t.wait_for(1)
            return eng.summary()
        finally:
            await eng.stop()
    s = asyncio.run(run())
    assert [(b["requests"], b["tokens"], b["iterations"]) for b in s["prefill_batches"]] == [(1, 2048, 1),
                                                                                           (2, 4096, 1)]
    assert [b["emulated_ms"] for b in s["prefill_batches"]] == [pytest.approx(60.0), pytest.approx(120.0)]
    assert s["prefill_requests"] == 3
    # the first waited for nothing, the other two for the rest of its iteration (about 50 ms each)
    assert 0.08 <= s["prefill_wait_s"] <= 0.11, s["prefill_wait_s"]
