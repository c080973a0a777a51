"""Spec: the memory the stand-in gives a prompt longer than its transfer slots (toolkit.standin.kv.RequestArena).

TensorRT-LLM moves such a prompt through buffers allocated for it where no agent connection forbids it; the
stand-in carves them from one mapping bounded by what the slots leave of TK_STANDIN_POOL_MB: whole pages, a wait
bounded by a timeout when the arena is full, a clear refusal (the caller's) when one could never fit, and freed
pages that stay mapped and read as zeros (a late READ finds no header, never another request's KV or a fault).
"""

from __future__ import annotations

import asyncio
import mmap

import pytest

pytest.importorskip("numpy")

from toolkit.standin.kv import RequestArena  # noqa: E402

PAGE = mmap.PAGESIZE


def test_extents_are_whole_pages_and_the_arena_bounds_what_is_held_at_once():
    async def run():
        arena = RequestArena(4 * PAGE + 100)  # rounded down to whole pages
        assert arena.limit == 4 * PAGE
        assert arena.fits(4 * PAGE) and not arena.fits(4 * PAGE + 1)
        assert await arena.take(5 * PAGE, 1.0) is None  # could never fit: the caller says so at once
        a = await arena.take(PAGE + 1, 0.1)
        b = await arena.take(2 * PAGE, 0.1)
        assert a == (0, 2 * PAGE) and b == (2 * PAGE, 2 * PAGE) and arena.held == 4 * PAGE
        assert await arena.take(1, 0.05) is None  # full past the timeout
        arena.give(a)
        assert await arena.take(3 * PAGE, 0.05) is None  # 2 pages free, not 3 in a row
        arena.give(b)  # coalesced with a's pages
        assert arena.free == [(0, 4 * PAGE)] and arena.held == 0
        assert await arena.take(4 * PAGE, 0.05) == (0, 4 * PAGE)
    asyncio.run(run())


def test_a_request_waits_for_room_and_gets_it_when_another_is_freed():
    async def run():
        arena = RequestArena(2 * PAGE)
        first = await arena.take(2 * PAGE, 0.1)
        waiting = asyncio.ensure_future(arena.take(PAGE, 2.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        arena.give(first)
        assert await asyncio.wait_for(waiting, 1.0) == (0, PAGE)
    asyncio.run(run())


def test_freed_pages_stay_mapped_and_read_as_zeros():
    async def run():
        arena = RequestArena(2 * PAGE)
        extent = await arena.take(2 * PAGE, 0.1)
        view = arena.view(extent)
        view[:] = 7
        arena.give(extent)
        assert int(view.max()) == 0  # the header a late READ would find is gone; the memory is still there
    asyncio.run(run())


def test_no_arena_when_the_slots_take_the_whole_pool():
    arena = RequestArena(0)
    assert arena.limit == 0 and arena.mem is None and not arena.fits(1)
