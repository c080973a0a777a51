"""The console on stderr: live progress while `tk launch` and `tk validate cluster` wait, and the console every
command prints its tables on (stdout is kept for --json)."""

from __future__ import annotations


def stderr_console(width: int = 120, highlight: bool = True):
    """A rich Console on stderr; where stderr is not a terminal (logs and pipes), ``width`` columns, wide enough that
    no column is cut."""
    from rich.console import Console

    console = Console(stderr=True, highlight=highlight)
    if not console.is_terminal:
        console.width = width
    return console


class StatusLine:
    """One live line on stderr (a rich spinner), or a plain line per change where stderr is not a terminal."""

    def __init__(self, enabled: bool = True, first: str = "starting"):
        self.enabled = enabled
        self.first = first
        self._status = None
        self._last = None

    def __enter__(self):
        if self.enabled:
            from rich.console import Console

            self.console = Console(stderr=True)
            self._status = self.console.status(self.first)
            self._status.__enter__()
        return self

    def show(self, text: str) -> None:
        """text is plain (names and paths may hold [brackets]); it is never read as rich markup."""
        if not self.enabled:
            return
        from rich.markup import escape

        text = escape(text)
        self._status.update(text)
        if text != self._last and not self.console.is_terminal:
            self.console.print(text)  # a log line per change when nobody watches a spinner
        self._last = text

    def __exit__(self, *exc):
        if self._status is not None:
            self._status.__exit__(*exc)
        return False


class LaunchProgress(StatusLine):
    def __init__(self, enabled: bool = True):
        super().__init__(enabled, "submitting")

    def update(self, p) -> None:
        from orchestrator.states import Role

        h = p.healthy
        if Role.PROXY not in h:  # an aggregated run: no proxy
            self.show(f"{p.run.name}: job {p.job}{' (' + p.message + ')' if p.message and p.job == 'PENDING' else ''}"
                      + "".join(f"  {role} {n}/{total} healthy" for role, (n, total) in h.items()))
            return
        self.show(f"{p.run.name}: job {p.job}{' (' + p.message + ')' if p.message and p.job == 'PENDING' else ''}"
                  f"  context {h[Role.CTX][0]}/{h[Role.CTX][1]} healthy, generation {h[Role.GEN][0]}/{h[Role.GEN][1]}, "
                  f"proxy {'up' if h[Role.PROXY][0] else 'waiting'}")
