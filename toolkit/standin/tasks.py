"""Background tasks the stand-in starts: every one of them through here (tk CPU stand-in, not TensorRT-LLM).

    spawn(coro, name, on_error=None, component=...)   one task. A failure is logged as a structured event, then
                                                      on_error(exc): the owner's reaction, which fails what the task
                                                      served (the requests waiting on it, or the server itself)
    keep(make, name, component=...)                   a loop that must go on running (a sweep, a poll, a reaper): a
                                                      failure is logged and the loop is started again from make()
                                                      after a backoff (1 s, doubled up to 30 s, back to 1 s once a
                                                      start has run that long)

Both keep a reference to the task (the asyncio documentation asks for one: the loop holds only a weak reference).
Every failure is one log line, the event name then a JSON object, so a dead background loop shows up in the
server's log (and in `tk doctor`, which matches it) instead of as hangs or 503s with no cause:

    background-failed {"task": "membership-poll", "component": "proxy", "cause": "KeyError: 'key'", "then": "..."}

The test tests/unit/test_background_work.py fails when a task is created anywhere else in the stand-in.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine

log = logging.getLogger("toolkit.standin")
_RUNNING: set[asyncio.Task] = set()
KEEP_FIRST_DELAY_S = 1.0
KEEP_MAX_DELAY_S = 30.0


def report(task: str, component: str, exc: BaseException, then: str) -> None:
    """The structured line for a failed background task (and its traceback, for people)."""
    doc = {"task": task, "component": component, "cause": f"{type(exc).__name__}: {exc}"[:500], "then": then}
    log.error("background-failed %s", json.dumps(doc), exc_info=exc)


def spawn(coro: Coroutine, name: str, on_error: Callable[[BaseException], None] | None = None,
          component: str = "stand-in") -> asyncio.Task:
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _RUNNING.add(task)

    def done(t: asyncio.Task) -> None:
        _RUNNING.discard(t)
        if t.cancelled():
            return
        exc = t.exception()
        if exc is None:
            return
        report(name, component, exc, "its owner reacts" if on_error is not None else "nothing waits on it")
        if on_error is not None:
            try:
                on_error(exc)
            except Exception as inner:  # noqa: BLE001 - the owner's reaction must not hide the first failure
                report(f"{name} (its failure handler)", component, inner, "nothing more")

    task.add_done_callback(done)
    return task


def keep(make: Callable[[], Awaitable[None]], name: str, component: str = "stand-in",
         first_delay_s: float | None = None, max_delay_s: float | None = None) -> asyncio.Task:
    """Run make() and start it again whenever it fails; the returned task is cancelled to stop it."""
    first_delay_s = KEEP_FIRST_DELAY_S if first_delay_s is None else first_delay_s
    max_delay_s = KEEP_MAX_DELAY_S if max_delay_s is None else max_delay_s

    async def kept() -> None:
        loop = asyncio.get_running_loop()
        delay = first_delay_s
        while True:
            started = loop.time()
            try:
                await make()
                return  # it ended by itself: nothing to keep
            except Exception as exc:  # noqa: BLE001 - said, then started again
                if loop.time() - started >= max_delay_s:
                    delay = first_delay_s  # it had run a good while: a fresh failure, not a crash loop
                report(name, component, exc, f"started again in {delay:g}s")
            await asyncio.sleep(delay)
            delay = min(max_delay_s, delay * 2)
    return spawn(kept(), name, component=component)
