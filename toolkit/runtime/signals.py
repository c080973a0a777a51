"""Signals a user or a scheduler sends end a command the way Ctrl-C does.

SIGTERM (kill, a scheduler's time limit) and SIGHUP (the terminal closed) become KeyboardInterrupt while a
command that owns a job runs, so the same cleanup path (release the job, write what is known) runs for
all three. Outside the `with` block the previous handlers are back.
"""

from __future__ import annotations

import contextlib
import signal
import threading

TERMINATING = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the command is; handled like Ctrl-C."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def _raise(signum, _frame):
    raise Terminated(signum)


@contextlib.contextmanager
def interrupt_on_termination():
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be set from the main thread; a library caller keeps its own
        return
    # A signal the caller ignores stays ignored: `nohup tk launch ...` must survive the terminal closing.
    previous = {sig: signal.signal(sig, _raise) for sig in TERMINATING if signal.getsignal(sig) != signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def exit_code(exc: BaseException) -> int:
    """What the shell expects after a signal: 128 + its number (130 for Ctrl-C)."""
    return 128 + (exc.signum if isinstance(exc, Terminated) else signal.SIGINT)


@contextlib.contextmanager
def deferred():
    """Cleanup that must finish (release a job, write a report): Ctrl-C, SIGTERM and SIGHUP received
    meanwhile are remembered, not raised, until the (bounded) cleanup is done; then the first of them is
    raised (KeyboardInterrupt, or Terminated), so the command still ends as the signal asked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _f: received.append(signum))
                for sig in (*TERMINATING, signal.SIGINT) if signal.getsignal(sig) != signal.SIG_IGN}
    completed = False
    try:
        yield
        completed = True
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if completed and received:
        raise KeyboardInterrupt() if received[0] == signal.SIGINT else Terminated(received[0])
