"""The emulated engine's iteration scheduler: pure logic, no clock, no I/O (tk CPU stand-in, not TensorRT-LLM).

Modelled on TensorRT-LLM's in-flight batching (pytorch backend, GUARANTEED_NO_EVICT, first come first served):

- at most ``max_batch_size`` requests are active; the rest wait in arrival order;
- each iteration first schedules one token for every request in the generation phase, then prefill work for
  requests in the context phase, in arrival order, until ``max_num_tokens`` tokens are scheduled;
- without chunked prefill a context request is scheduled only whole (the worker refuses prompts longer than
  ``max_num_tokens``); with it, a request takes what the budget leaves, in multiples of ``tokens_per_block``
  unless it is the last chunk (TensorRT-LLM's chunk unit);
- a request's first token comes out of the iteration that computes its last prompt chunk; a context-only request
  (a context server's leg) is then done; a generation-only request (a generation server's leg) arrives with its
  KV and first token and only decodes;
- an iteration takes ``cost(shape)`` seconds, ``shape`` being what it schedules as aiconfigurator's forward-pass
  model reads an iteration (``toolkit.facts.steptime.IterationShape``: prefill requests, their new tokens and the KV
  tokens they already hold, decode requests and their KV tokens), so a long prefill scheduled with decodes stalls
  those decodes for its full duration.

A prompt prefix the block cache reused (``cached``) is not computed again, only read.

Not modelled: KV-cache capacity (no eviction, no pausing), the overlap scheduler, CUDA-graph padding.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from toolkit.facts.steptime import IterationShape

FULL, CONTEXT_ONLY, GENERATION_ONLY = "context_and_generation", "context_only", "generation_only"


@dataclass
class SchedRequest:
    rid: int
    kind: str
    prompt_len: int
    new_tokens: int  # tokens this server emits for it (context_only: 1; generation_only: all, the first included)
    prefilled: int = 0
    generated: int = 0
    arrival_iter: int = 0

    @property
    def in_context(self) -> bool:
        return self.prefilled < self.prompt_len


@dataclass(frozen=True)
class Iteration:
    """One scheduled iteration: what it computes, how long it takes, and what it yields."""

    no: int
    chunks: tuple[tuple[int, int], ...]  # (rid, prompt tokens computed)
    decodes: tuple[int, ...]  # rids that get one token
    computed_tokens: int
    kv_tokens_read: int
    seconds: float
    emitted: tuple[tuple[int, int], ...]  # (rid, tokens emitted at the end of the iteration)
    finished: tuple[int, ...]
    queued: int  # requests still waiting for a batch slot after this iteration was composed

    @property
    def num_ctx_requests(self) -> int:
        return len(self.chunks)

    @property
    def num_ctx_tokens(self) -> int:
        return sum(t for _, t in self.chunks)


@dataclass
class Scheduler:
    max_batch_size: int
    max_num_tokens: int
    chunked_prefill: bool
    tokens_per_block: int
    cost: Callable[[IterationShape], float]  # an iteration's shape -> seconds
    waiting: deque = field(default_factory=deque)
    active: list = field(default_factory=list)
    iterations: int = 0

    def add(self, rid: int, kind: str, prompt_len: int, new_tokens: int,
            cached: int = 0) -> tuple[tuple[int, int], ...]:
        """Queue a request. Returns what is emitted at once: a generation-only request's first token (computed by
        the context server). A generation-only request with nothing more to decode never enters the batch.
        ``cached``: prompt tokens whose KV the block cache reused (``toolkit.standin.blockcache``): not computed,
        but read by attention (at most ``prompt_len - 1``: the last prompt token is always computed)."""
        if new_tokens < 1 or prompt_len < 1:
            raise ValueError("a request has at least one prompt token and one new token")
        req = SchedRequest(rid, kind, prompt_len, new_tokens, arrival_iter=self.iterations)
        req.prefilled = max(0, min(int(cached), prompt_len - 1))
        if kind == GENERATION_ONLY:
            req.prefilled, req.generated = prompt_len, 1
            if new_tokens == 1:
                return ((rid, 1),)
            self.waiting.append(req)
            return ((rid, 1),)
        self.waiting.append(req)
        return ()

    def pending(self) -> bool:
        return bool(self.waiting or self.active)

    def step(self) -> Iteration | None:
        """Compose the next iteration and apply its progress; None when there is nothing to do."""
        while self.waiting and len(self.active) < self.max_batch_size:
            self.active.append(self.waiting.popleft())
        if not self.active:
            return None
        budget = self.max_num_tokens
        decodes: list[SchedRequest] = []
        chunks: list[tuple[SchedRequest, int]] = []
        for req in self.active:  # generation phase first
            if not req.in_context and budget > 0:
                decodes.append(req)
                budget -= 1
        for req in self.active:  # then context phase, first come first served
            if not req.in_context or budget <= 0:
                continue
            remaining = req.prompt_len - req.prefilled
            if remaining <= budget:
                take = remaining
            elif self.chunked_prefill:
                take = budget - budget % self.tokens_per_block
            else:
                take = 0  # waits until a whole-prompt budget is free
            if take <= 0:
                continue
            chunks.append((req, take))
            budget -= take
        shape = IterationShape(prefill_requests=len(chunks), prefill_tokens=sum(t for _, t in chunks),
                               prefill_kv_tokens=sum(r.prefilled for r, _ in chunks), decode_requests=len(decodes),
                               decode_kv_tokens=sum(r.prompt_len + r.generated for r in decodes))
        seconds = self.cost(shape)
        emitted, finished = [], []
        for req, take in chunks:
            req.prefilled += take
            if not req.in_context:
                req.generated = 1
                emitted.append((req.rid, 1))
        for req in decodes:
            req.generated += 1
            emitted.append((req.rid, 1))
        for req in list(self.active):
            if not req.in_context and req.generated >= req.new_tokens:
                finished.append(req.rid)
                self.active.remove(req)
        it = Iteration(no=self.iterations, chunks=tuple((r.rid, t) for r, t in chunks),
                       decodes=tuple(r.rid for r in decodes), computed_tokens=shape.computed_tokens,
                       kv_tokens_read=shape.kv_tokens_read,
                       seconds=seconds, emitted=tuple(emitted), finished=tuple(finished), queued=len(self.waiting))
        self.iterations += 1
        return it
