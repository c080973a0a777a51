"""A real client driving load while servers fail: the official `openai` SDK (AsyncOpenAI, no retries of its own),
N closed-loop streaming chat clients in a background thread, one record per request. Used by the self-healing
specs (tests/integration/test_self_healing.py) and benchmarks/bench_self_healing.py."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass


@dataclass
class Request:
    t_start: float  # seconds on time.monotonic()
    t_end: float
    ok: bool  # every asked-for token arrived
    tokens: int
    error: str = ""


class ClosedLoopLoad:
    """``concurrency`` clients, each sending its next request as soon as the last one ends, until ``stop()``.

    A failed request is followed by a 50 ms pause, so that instant refusals do not spin. Every request is bounded
    by ``timeout_s``; ``stop()`` waits (bounded) for the requests in flight to end."""

    def __init__(self, url: str, model: str, concurrency: int = 8, prompt_words: int = 32, max_tokens: int = 16,
                 timeout_s: float = 60.0):
        self.url, self.model, self.concurrency = url, model, concurrency
        self.prompt_words, self.max_tokens, self.timeout_s = prompt_words, max_tokens, timeout_s
        self.records: list[Request] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> "ClosedLoopLoad":
        self._thread.start()
        return self

    def stop(self) -> list[Request]:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + 30)
        if self._thread.is_alive():
            raise TimeoutError("the load's clients did not finish within their request timeout")
        return sorted(self.records, key=lambda r: r.t_start)

    async def _main(self) -> None:
        import httpx
        import openai

        http = httpx.AsyncClient(limits=httpx.Limits(max_connections=self.concurrency + 4),
                                 timeout=httpx.Timeout(self.timeout_s))
        client = openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0,
                                    timeout=self.timeout_s, http_client=http)

        async def one(worker: int) -> None:
            n = 0
            while not self._stop.is_set():
                n += 1
                prompt = " ".join(f"w{worker}x{n}y{i}" for i in range(self.prompt_words))
                t0, tokens, error = time.monotonic(), 0, ""
                try:
                    stream = await client.chat.completions.create(
                        model=self.model, messages=[{"role": "user", "content": prompt}],
                        max_tokens=self.max_tokens, temperature=0, stream=True)
                    async for chunk in stream:
                        if chunk.choices and chunk.choices[0].delta and chunk.choices[0].delta.content:
                            tokens += len(chunk.choices[0].delta.content.split())
                except Exception as exc:  # noqa: BLE001  (what the client saw is the record)
                    error = f"{type(exc).__name__}: {str(exc)[:200]}"
                ok = not error and tokens == self.max_tokens
                if not ok and not error:
                    error = f"short answer: {tokens} of {self.max_tokens} tokens"
                self.records.append(Request(t0, time.monotonic(), ok, tokens, error))
                if not ok:
                    await asyncio.sleep(0.05)

        try:
            await asyncio.gather(*(one(i) for i in range(self.concurrency)))
        finally:
            await client.close()


def good_per_s(records: list[Request], t0: float, t1: float) -> float:
    """Requests that completed with every token between t0 and t1, per second."""
    return sum(1 for r in records if r.ok and t0 <= r.t_end < t1) / max(t1 - t0, 1e-9)


def failed_between(records: list[Request], t0: float, t1: float) -> list[Request]:
    return [r for r in records if not r.ok and t0 <= r.t_end < t1]
