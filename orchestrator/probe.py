"""HTTP probes, concurrent and bounded: a round over N components takes about one probe timeout, whatever N.

    status(url, timeout_s)          the HTTP status (None: no answer in time, or no connection)
    Prober.round({name: url})       {name: status} for all of them, in parallel, bounded as a whole
    Prober.start_progress(...)      one progress probe (a bounded generation) in the background

Standard library only (urllib in a thread pool), as the batch host may have nothing else.
"""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Dict, Optional

MAX_BODY = 64 << 10


def status(url: str, timeout_s: float) -> Optional[int]:
    """GET url: its HTTP status, or None when it does not answer within timeout_s (or refuses the connection).
    The body is read (bounded) so that a server that sends headers and then hangs counts as not answering."""
    req = urllib.request.Request(url, method="GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (http URLs the plan built)
            resp.read(MAX_BODY)
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, ValueError, socket.timeout):
        return None


class Prober:
    """Liveness rounds on a pool as wide as the deployment, and progress probes on their own threads."""

    def __init__(self, timeout_s: float, get: Callable[[str, float], Optional[int]] = status, width: int = 64):
        self.timeout_s = timeout_s
        self.get = get
        self.pool = ThreadPoolExecutor(max_workers=max(1, width), thread_name_prefix="tk-probe")

    def round(self, urls: Dict[str, str]) -> Dict[str, Optional[int]]:
        """Every URL at once; a probe still running when the round's bound passes counts as no answer."""
        futures = {name: self.pool.submit(self.get, url, self.timeout_s) for name, url in urls.items()}
        wait(list(futures.values()), timeout=self.timeout_s + 1.0)
        out: Dict[str, Optional[int]] = {}
        for name, fut in futures.items():
            out[name] = fut.result() if fut.done() and fut.exception() is None else None
        return out

    def start_progress(self, url: str, timeout_s: float, done: Callable[[Optional[int]], None]) -> None:
        """GET url on a thread of its own (it may take up to timeout_s); done(status) is called with the result."""
        def run() -> None:
            try:
                done(self.get(url, timeout_s))
            except Exception:  # noqa: BLE001  (a probe thread must never die silently without an answer)
                done(None)
        threading.Thread(target=run, name="tk-progress", daemon=True).start()

    def close(self) -> None:
        self.pool.shutdown(wait=False)
