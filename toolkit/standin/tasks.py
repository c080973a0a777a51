"""Background tasks the stand-in starts, observed (tk CPU stand-in, not TensorRT-LLM).

``spawn(coro, name)`` keeps a reference to the task (the asyncio documentation asks for one: the loop holds only
a weak reference) and logs, with its name, any exception that ends it, so a dead background loop shows up in the
server's log instead of as hangs or 503s with no cause. ``on_error`` lets the owner react (fail the requests that
wait on the loop, for instance).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine

log = logging.getLogger("toolkit.standin")
_RUNNING: set[asyncio.Task] = set()


def spawn(coro: Coroutine, name: str, on_error: Callable[[BaseException], None] | None = None) -> asyncio.Task:
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _RUNNING.add(task)

    def done(t: asyncio.Task) -> None:
        _RUNNING.discard(t)
        if t.cancelled():
            return
        exc = t.exception()
        if exc is None:
            return
        log.error("background task %s died: %s: %s", name, type(exc).__name__, exc, exc_info=exc)
        if on_error is not None:
            try:
                on_error(exc)
            except Exception as inner:  # noqa: BLE001 - the owner's reaction must not hide the first failure
                log.error("background task %s: its failure handler failed too: %s", name, inner)

    task.add_done_callback(done)
    return task
