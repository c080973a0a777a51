"""HTTP probes, concurrent and bounded: a round over N components takes about one probe timeout, whatever N.

    status(url, timeout_s)          the HTTP status (None: no answer in time, or no connection)
    Prober.round({name: url})       {name: status} for all of them, in parallel, bounded as a whole
    Prober.start_progress(...)      one progress probe (a bounded generation) in the background

Standard library only (urllib in a thread pool), as the batch host may have nothing else.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from concurrent.futures import wait
from typing import Callable, Dict, Optional

from orchestrator import tls
from orchestrator.background import Background

MAX_BODY = 64 << 10
ROUND_SLACK_S = 1.0  # a liveness round waits one probe timeout and this much more for its answers


def status(url: str, timeout_s: float) -> Optional[int]:
    """GET url: its HTTP status, or None when it does not answer within timeout_s (or refuses the connection).
    The body is read (bounded) so that a server that sends headers and then hangs counts as not answering."""
    req = urllib.request.Request(url, method="GET")
    ctx = tls.context() if url.startswith("https:") else None  # the job's etcd: the run's client certificate
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=ctx) as resp:  # noqa: S310 (URLs the plan built)
            resp.read(MAX_BODY)
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, ValueError, socket.timeout):
        return None


class Prober:
    """Liveness rounds on a pool as wide as the deployment, and progress probes on their own threads; a probe that
    fails in a way no server causes (a bug: `status` answers every network outcome) counts as no answer and is
    reported through `work` (the job: a `background-failed` event naming the component)."""

    def __init__(self, timeout_s: float, get: Callable[[str, float], Optional[int]] = status, width: int = 64,
                 work: Optional[Background] = None):
        self.timeout_s = timeout_s
        self.get = get
        self.work = work or Background()
        self.pool = self.work.pool("probe", width)

    def round(self, urls: Dict[str, str]) -> Dict[str, Optional[int]]:
        """Every URL at once; a probe still running when the round's bound passes counts as no answer."""
        futures = {name: self.pool.submit(self.get, url, self.timeout_s) for name, url in urls.items()}
        wait(list(futures.values()), timeout=self.timeout_s + ROUND_SLACK_S)
        out: Dict[str, Optional[int]] = {}
        for name, fut in futures.items():
            out[name] = None
            if fut.done():
                exc = fut.exception()
                if exc is None:
                    out[name] = fut.result()
                else:
                    self.work.fail("liveness-probe", name, exc)
        return out

    def start_progress(self, url: str, timeout_s: float, done: Callable[[Optional[int]], None],
                       component: Optional[str] = None) -> None:
        """GET url on a thread of its own (it may take up to timeout_s); done(status) is called with the result,
        done(None) (no progress) when the probe itself failed."""
        self.work.start("progress-probe", lambda: done(self.get(url, timeout_s)), component,
                        on_failure=lambda _exc: done(None))

    def close(self) -> None:
        self.pool.shutdown(wait=False)
