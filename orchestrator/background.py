"""Background work of the job's orchestrator: every thread it starts is started here (standard library only).

    work = Background(report)
    work.start(task, fn, component=None, on_failure=None)   fn() on a daemon thread of its own
    work.after(task, seconds, fn)                           fn() once seconds have passed, unless cancelled first
    work.pool(task, width)                                  a thread pool whose failures the caller reports (fail())
    work.fail(task, component, exc)                         say that a piece of background work failed

Nothing started here can end without a word. Whatever ends a piece of work with an exception (a bug included) is
reported as one structured failure, ``BackgroundFailed(task, component, cause, where)``, to ``report`` (the job
writes it as the event ``background-failed``, its component being the server the work was for), and then
``on_failure(exc)`` runs: it delivers what the work owed the job, so that nothing waits for an answer that never
comes, and that answer decides what happens to the component the work serves. A kill that failed answers with
whether the process is still there (still there: the policy gives the component up, and the run fails where its
role falls below the minimum); a progress probe that failed answers "no progress" (a server that stays so is
killed and restarted as wedged); a membership repair that failed ends, and the next return of the storage runs it
again; a lookup (Slurm steps, registrations) that failed is asked again on a later round. The serving loop itself
runs on the main thread, where any exception ends the job with teardown and a `failed` event (orchestrator.job).

The test tests/unit/test_background_work.py fails when a thread is started anywhere else in the orchestrator.
"""

from __future__ import annotations

import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class BackgroundFailed:
    """One piece of background work ended by an exception."""

    task: str  # what the work was ("kill", "deregister", "membership-repair", "progress-probe", ...)
    component: Optional[str]  # the component it was for (None: the run as a whole)
    cause: str  # the exception: "KeyError: 'kvs'"
    where: str  # the innermost frame it was raised in: "orchestrator/membership.py:211 in repair"

    def describe(self) -> str:
        return f"background work {self.task}" + (f" for {self.component}" if self.component else "") + \
            f" failed: {self.cause} (at {self.where})"


def failure(task: str, component: Optional[str], exc: BaseException) -> BackgroundFailed:
    frames = traceback.extract_tb(exc.__traceback__)
    where = "unknown"
    if frames:
        last = frames[-1]
        parts = last.filename.replace("\\", "/").split("/")
        where = f"{'/'.join(parts[-2:])}:{last.lineno} in {last.name}"
    return BackgroundFailed(task, component, f"{type(exc).__name__}: {exc}"[:500], where)


def _to_stderr(failed: BackgroundFailed) -> None:
    try:
        print(f"[tk] {failed.describe()}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class Background:
    def __init__(self, report: Callable[[BackgroundFailed], None] = _to_stderr):
        self.report = report

    def fail(self, task: str, component: Optional[str], exc: BaseException) -> None:
        """Say that `task` failed with exc (the report itself must not end the thread that says it)."""
        failed = failure(task, component, exc)
        try:
            self.report(failed)
        except Exception as inner:  # noqa: BLE001  (the report failed too: the job's output still says both)
            _to_stderr(failed)
            _to_stderr(failure(f"{task} (its report)", component, inner))

    def start(self, task: str, fn: Callable[[], None], component: Optional[str] = None,
              on_failure: Optional[Callable[[BaseException], None]] = None) -> threading.Thread:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001  (a bug included: said, then what the work owed is delivered)
                self.fail(task, component, exc)
                if on_failure is not None:
                    try:
                        on_failure(exc)
                    except BaseException as inner:  # noqa: BLE001
                        self.fail(f"{task} (its fallback)", component, inner)
        thread = threading.Thread(target=run, name=f"tk-{task}" + (f"-{component}" if component else ""), daemon=True)
        thread.start()
        return thread

    def after(self, task: str, seconds: float, fn: Callable[[], None], component: Optional[str] = None
              ) -> threading.Event:
        """fn() once `seconds` have passed; setting the returned event first cancels it."""
        cancelled = threading.Event()

        def wait_then_run() -> None:
            if not cancelled.wait(max(0.0, seconds)):
                fn()
        self.start(task, wait_then_run, component)
        return cancelled

    def pool(self, task: str, width: int) -> ThreadPoolExecutor:
        """A pool of `width` threads for short calls whose futures the caller reads: a future that ended with an
        exception is the caller's to report (fail(task, component, future.exception()))."""
        return ThreadPoolExecutor(max_workers=max(1, width), thread_name_prefix=f"tk-{task}")


__all__ = ["Background", "BackgroundFailed", "failure"]
