"""The stand-in worker: ``tk-standin-serve MODEL ...`` serving trtllm-serve's HTTP API (tk CPU stand-in, not TensorRT-LLM).

Routes: ``GET /health``, ``/health_generate`` (one minimal chat completion through the engine, one token, as
trtllm-serve does: 200 only once it comes back), ``/version``, ``/v1/models``, ``/metrics`` (the iteration stats
since the last call, a JSON list, like trtllm-serve; empty unless ``enable_iter_perf_stats`` is set, as the PyTorch
executor's ``get_latest_iteration_stats`` returns ``[]`` without it), ``/server_info``, ``GET|POST /steady_clock_offset``,
``POST /kv_cache_events`` (the KV-cache events since the last call, drained; none unless
``kv_cache_config.event_buffer_max_size`` > 0), ``POST /v1/completions``, ``POST /v1/chat/completions``
(``stream: true`` gives server-sent events ending ``data: [DONE]``), and ``GET /standin/stats`` (cumulative
counters, a stand-in addition).

Limits as TensorRT-LLM's pytorch backend applies them: a prompt longer than ``max_num_tokens`` is refused (400)
unless chunked prefill is on or the request is generation_only; ``max_tokens`` is clamped to
``max_seq_len - prompt``, and a prompt that leaves no room is refused; at most ``max_batch_size`` requests run at
once (the rest queue).

Without ``cache_transceiver_config`` (or with ``backend`` unset) the worker is **aggregated**: it answers whole
requests and refuses context_only / generation_only ones. With it, it also serves both disaggregated legs, moving
the KV through ``toolkit.standin.kv``.

Test fault: ``kill -USR1 PID`` wedges the engine the way TensorRT-LLM's largest hang class does (/health stays
200, no request makes progress): from then on no token is produced for any request, in flight or new, and
/health_generate never answers. Only a restart ends it (the job's progress probe: orchestrator.policy).

With emulated timing (``standin.emulate`` in the recipe, ``toolkit.standin.emulate``) requests run through an
iteration scheduler whose iterations sleep the emulated model's time on the emulated GPU from its timing source
(aiconfigurator's per-operation data where it has the GPU and TensorRT-LLM line, else the roofline: ``timing_for``);
tokens come out at that cadence, and every report says "emulated timing of MODEL on GPU".
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections import deque

from aiohttp import web

from toolkit.standin import model as M
from toolkit.standin import protocol as P
from toolkit.standin.kv import faults as kv_faults
from toolkit.standin.options import WorkerSettings

log = logging.getLogger("toolkit.standin")
DECODE_DELAY_ENV = "TK_STANDIN_DECODE_MS"  # optional per-token delay, to rehearse load


class Worker:
    def __init__(self, settings: WorkerSettings):
        self.s = settings
        self.geo = M.geometry(settings.model, settings.tokens_per_block, settings.kv_dtype)
        self.pool = None
        self.endpoint = f"{_display_host(settings.host)}:{settings.port}"
        self.batch = asyncio.Semaphore(settings.max_batch_size)
        self.active = 0
        self.queued = 0
        self.completed = 0
        self.ctx_ids = itertools.count(1)
        self.iter_no = itertools.count(0)
        maxlen = int(settings.options.get("iter_stats_max_iterations") or 1000)
        self.iter_stats: deque = deque(maxlen=maxlen)
        # TensorRT-LLM keeps iteration stats only with enable_iter_perf_stats (default false): /metrics is [] without
        self.iter_perf_stats = settings.options.get("enable_iter_perf_stats") is True
        self.counters = {"requests": {t: 0 for t in P.REQUEST_TYPES}, "errors": 0, "prompt_tokens": 0,
                         "completion_tokens": 0}
        # which process these counters belong to: a restarted server counts from 0 again (tk bench counts per lifetime)
        self.instance = {"pid": os.getpid(), "started": round(time.time(), 6)}
        self.decode_delay = float(os.environ.get(DECODE_DELAY_ENV, "0") or 0) / 1000.0
        self.clock_offset = 0.0
        self.engine = None  # the emulated engine (toolkit.standin.emulate), created on the event loop
        self.timing = None  # its iteration timing (toolkit.standin.emulate.timing_for): built after the port is
        # bound, before it listens
        self.refusals = P.RefusalLog(log)
        self.cache, self.cache_source = create_block_cache(settings)
        self.counters["cached_tokens"] = 0
        self.wedged = False  # the SIGUSR1 test fault: no progress from now on
        self._never: asyncio.Event | None = None

    def start_emulation(self) -> None:
        s = self.s
        if s.emulate is None:
            return
        from toolkit.standin.emulate import EmulatedEngine, Layout
        tr = s.transceiver
        self.engine = EmulatedEngine(s.emulate, tp=s.tp, kv_dtype=s.kv_dtype, max_batch_size=s.max_batch_size,
                                     max_num_tokens=s.max_num_tokens, chunked_prefill=s.enable_chunked_prefill,
                                     tokens_per_block=s.tokens_per_block,
                                     on_iteration=self._record_emulated_iteration, timing=self.timing,
                                     layout=Layout(s.tp, s.pp, s.attention_dp),
                                     transceiver=(tr.resolved_runtime, tr.bounce_size_mb) if tr else None)
        self.engine.start()

    @property
    def what(self) -> str:
        """What this server is, as every report says it."""
        if self.engine:
            return f"tk CPU stand-in, not TensorRT-LLM; {self.engine.describe()}"
        return "tk CPU stand-in, not TensorRT-LLM"

    # --- set-up -----------------------------------------------------------------------------------------

    def create_pool(self, agent_name: str) -> None:
        if self.s.disaggregated:
            from toolkit.standin.kv import KvPool
            self.pool = KvPool(self.s, self.geo, self.endpoint, agent_name)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20, middlewares=[P.error_middleware(self.refusals)])
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health_generate)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/server_info", self.server_info)
        app.router.add_get("/steady_clock_offset", self.clock_get)
        app.router.add_post("/steady_clock_offset", self.clock_post)
        app.router.add_post("/kv_cache_events", self.kv_events)
        app.router.add_get("/standin/stats", self.stats)
        app.router.add_post(P.KV_RELEASE_PATH, self.kv_release)
        app.router.add_post("/v1/completions", lambda r: self.generate(r, "completion"))
        app.router.add_post("/v1/chat/completions", lambda r: self.generate(r, "chat"))
        return app

    # --- small routes -----------------------------------------------------------------------------------

    async def health(self, request):
        return web.Response(status=200)

    def wedge(self) -> None:
        """The test fault (SIGUSR1): the engine stops making progress; /health still answers 200."""
        self.wedged = True
        log.warning("tk CPU stand-in test fault: the engine is wedged (SIGUSR1): no request makes progress from now "
                    "on, /health still answers 200")

    async def _progress(self) -> None:
        """Where a token (or an iteration) would come out: a wedged engine never gets past this."""
        if self.wedged:
            if self._never is None:
                self._never = asyncio.Event()
            await self._never.wait()

    async def health_generate(self, request):
        """trtllm-serve's /health_generate (tensorrt_llm/serve/openai_server.py): a minimal chat request ("hi",
        one token, temperature 0) through the engine; 200 "Generation health check OK" once it returns, 500 when
        it fails. Not counted in /standin/stats' request counters."""
        try:
            req = P.parse_request("chat", {"model": self.s.model_arg, "messages": [{"role": "user", "content": "hi"}],
                                           "max_tokens": 1, "temperature": 0.0, "stream": False})
            n = len(req.prompt_ids)
            self._check_limits(req, n)
        except P.RequestError as exc:
            return web.Response(status=500, text=f"Generation health check failed: {exc.message}")
        self.counters["health_generate"] = self.counters.get("health_generate", 0) + 1
        if self.engine:
            from toolkit.standin.scheduler import FULL
            ticket = self.engine.submit(FULL, n, 1)
            await self._progress()
            await ticket.wait_for(1)
        else:
            async with self.batch:
                await self._progress()
                await asyncio.to_thread(M.kv_content, self.geo, req.prompt_ids)
        await self._progress()
        return web.Response(status=200, text="Generation health check OK")

    async def version(self, request):
        doc = {"version": f"{self.s.version.release} ({self.what})"}
        if self.engine:
            doc["emulated_timing"] = self.engine.describe()
            doc["emulated_timing_source"] = self.engine.timing.source  # "aiconfigurator" | "roofline"
            doc["emulated_timing_detail"] = self.engine.timing.detail
        return web.json_response(doc)

    async def models(self, request):
        return web.json_response({"object": "list", "data": [
            {"id": self.s.model_arg, "object": "model", "created": int(time.time()), "owned_by": P.OWNED_BY}]})

    async def metrics(self, request):
        stats = list(self.iter_stats) if self.iter_perf_stats else []
        self.iter_stats.clear()  # trtllm-serve returns the iterations since the last call
        return web.json_response(stats)

    async def server_info(self, request):
        return web.json_response({"engine": self.what, "model": self.s.model_arg,
                                  "disaggregated": self.s.disaggregated, "kv_geometry": self.geo.to_dict(),
                                  "limits": self.limits.to_dict(),
                                  "kv": self.pool.describe() if self.pool else None,
                                  "emulation": self.engine.summary() if self.engine else None})

    async def clock_get(self, request):
        now = time.monotonic() + self.clock_offset
        return web.json_response({"receive_ts": now, "transmit_ts": time.monotonic() + self.clock_offset})

    async def clock_post(self, request):
        try:
            self.clock_offset = float((await request.json())["offset"])
        except (ValueError, KeyError, TypeError):  # not JSON (a ValueError), not {"offset": number}
            return web.json_response(P.RequestError(400, 'expected {"offset": float}').body(), status=400)
        return web.Response(status=200)

    async def kv_events(self, request):
        """TensorRT-LLM's ``/kv_cache_events``: the block events since the last call (created / stored / removed,
        ``toolkit.standin.blockcache``), drained; always ``[]`` with ``kv_cache_config.event_buffer_max_size: 0``
        (TensorRT-LLM's default), which is what leaves a kv_cache_aware router blind (#14882)."""
        return web.Response(body=self.cache.drain_events_json(), content_type="application/json")

    async def kv_release(self, request):
        """Free the send slot of a context leg whose generation leg failed (a stand-in endpoint; see proxy.py)."""
        try:
            rid = (await request.json())["ctx_request_id"]
            if not isinstance(rid, int) or isinstance(rid, bool):
                raise ValueError
        except (ValueError, KeyError, TypeError):  # not JSON (a ValueError), not {"ctx_request_id": int}
            return self._error(P.RequestError(400, 'expected {"ctx_request_id": int}'), request.headers)
        if not self.pool:
            return self._error(P.RequestError(400, "this server has no KV pool (aggregated)"), request.headers)
        return web.json_response({"ctx_request_id": rid, "released": self.pool.release(rid)})

    async def stats(self, request):
        doc = {"engine": P.OWNED_BY, "mode": "disaggregated" if self.s.disaggregated else "aggregated",
               "instance": self.instance, "active": self.active, "queued": self.queued, "completed": self.completed,
               **self.counters}
        if self.pool:
            doc["kv"] = {**self.pool.describe(), **self.pool.stats, "pending": len(self.pool.pending)}
        doc["kv_cache"] = {**self.cache.describe(), "capacity_source": self.cache_source,
                           "policy": self.s.kv.policy, "max_num_turns": self.s.kv.max_num_turns}
        if self.engine:
            doc["emulation"] = self.engine.summary()
        return web.json_response(doc)

    # --- the work ---------------------------------------------------------------------------------------

    def _error(self, exc, headers) -> web.Response:
        self.counters["errors"] += 1
        body, ctype = P.encode_body(exc.body(), headers)
        return web.Response(status=exc.status, body=body, content_type=ctype.split(";")[0])

    async def generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        from toolkit.standin.kv import TransferError
        try:
            req, n, count, state = await self._admit(request, kind)
        except (P.RequestError, TransferError) as exc:
            if isinstance(exc, TransferError):
                exc = P.RequestError(exc.status, exc.message)
            return self._error(exc, request.headers)
        if self.engine:
            return await self._generate_emulated(request, req, n, count, state)
        return await self._generate_direct(request, req, n, count, state)

    async def _admit(self, request: web.Request, kind: str) -> tuple[P.Request, int, int, dict | None]:
        """The request parsed and checked before it takes a batch slot: (the request, its prompt length, how many
        tokens it generates, the context server's KV state for a generation leg). Raises RequestError or
        TransferError (a generation leg's state that cannot be decoded)."""
        from toolkit.standin.kv import decode_state
        raw = await request.read()
        body = P.decode_body(raw, request.headers)
        if len(raw) > P.OFFLOAD_BYTES:  # tokenizing a long prompt would stall every other request's tokens
            req = await asyncio.to_thread(P.parse_request, kind, body)
        else:
            req = P.parse_request(kind, body)
        n = len(req.prompt_ids)
        if req.n > 1 and req.request_type != "context_and_generation":
            raise P.RequestError(400, f"n={req.n}: a {req.request_type} leg carries one sequence (TensorRT-LLM's "
                                      f"disaggregated proxy expects one choice from the context server)")
        if req.request_type != "context_and_generation" and not self.s.disaggregated:
            raise P.RequestError(400, (
                f"disaggregated_params.request_type {req.request_type}: this server's cache transceiver is "
                f"disabled (no cache_transceiver_config.backend in "
                f"{self.s.options_file or 'its options'}), it serves whole requests only"))
        self._check_limits(req, n)
        allowed = self.s.max_seq_len - n
        count = min(req.max_tokens or allowed, allowed)
        if req.request_type == "context_only":
            count = 1
        state = None
        if req.request_type == "generation_only":
            first = req.disagg.get("first_gen_tokens") or []
            if not first or req.disagg.get("ctx_request_id") is None:
                raise P.RequestError(400, "generation_only request without disaggregated_params."
                                          "first_gen_tokens and ctx_request_id")
            state = decode_state(req.disagg.get("encoded_opaque_state"))
        elif req.request_type == "context_only" and self.pool:
            self.pool.check_fits(n)
        return req, n, count, state

    async def _generate_direct(self, request, req: P.Request, n: int, count: int, state) -> web.StreamResponse:
        """The request without emulated timing: it waits for a batch slot, then the real work runs at once."""
        from toolkit.standin.kv import TransferError
        self.queued += 1
        await self.batch.acquire()
        self.queued -= 1
        self.active += 1
        started = time.monotonic()
        self.counters["requests"][req.request_type] += 1
        lease = self.cache.begin(req.prompt_ids, reuse=req.request_type != "generation_only")
        tokens: list[int] = []
        try:
            await self._progress()
            try:
                tokens, disagg_out, extra = await self._run(req, n, count, state)
            except TransferError as exc:
                log.error("%s", exc.message)
                return self._error(P.RequestError(exc.status, exc.message), request.headers)
            if req.request_type != "generation_only":
                self.cache.store(lease, req.prompt_ids)  # the context phase is over: its blocks are reusable
            self._record_iteration(req, n, len(tokens), time.monotonic() - started)
            self.counters["prompt_tokens"] += n
            self.counters["completion_tokens"] += len(tokens)
            return await self._respond(request, req, n, tokens, disagg_out, extra=extra,
                                       cached=self._cached(req, lease))
        finally:
            self.cache.release(lease, req.prompt_ids + tokens[:count] if tokens else None)
            self.active -= 1
            self.completed += 1
            self.batch.release()

    async def _generate_emulated(self, request, req: P.Request, n: int, count: int, state) -> web.StreamResponse:
        """The request through the emulated engine: the scheduler decides when its prefill and tokens happen."""
        from toolkit.standin.emulate import EngineStopped
        from toolkit.standin.kv import TransferError
        from toolkit.standin.scheduler import CONTEXT_ONLY, FULL, GENERATION_ONLY
        self.counters["requests"][req.request_type] += 1
        self.active += 1
        lease = self.cache.begin(req.prompt_ids, reuse=req.request_type != "generation_only")
        cached = lease.cached_tokens  # a reused prefix costs no prefill time, only its KV reads
        tokens: list[int] = []
        try:
            try:
                if req.request_type == "context_only":
                    # The real KV is computed while the emulated prefill runs, and published after it (publishing
                    # later keeps the KV slot's expiry clock out of the queueing): the stand-in's own work stays
                    # inside the emulated time instead of adding to it.
                    ticket = self.engine.submit(CONTEXT_ONLY, n, 1, cached)
                    from toolkit.standin.tasks import spawn
                    # awaited below (its failure fails this request); spawn also logs it as background work
                    computing = spawn(self._kv_of(req.prompt_ids), "context-kv")
                    try:
                        await ticket.wait_for(1)
                    except BaseException:
                        computing.cancel()
                        raise
                    self.cache.store(lease, req.prompt_ids)
                    tokens, disagg_out, extra = await self._run(req, n, count, state, computed=await computing)
                elif req.request_type == "generation_only":
                    started = time.monotonic()
                    tokens, disagg_out, extra = await self._run(req, n, count, state)  # the real NIXL read
                    from toolkit.standin.emulate import Layout
                    xfer = self.engine.kv_transfer(n, Layout.from_dict(state.get("emulated_layout")))
                    if xfer is not None:  # the emulated model's transfer on TensorRT-LLM's transceiver
                        wait = self.engine.transfer_wait(xfer, time.monotonic() - started)
                        if wait > 0:
                            await asyncio.sleep(wait)
                    ticket = self.engine.submit(GENERATION_ONLY, n, len(tokens))
                else:  # the real work overlaps the emulated prefill
                    ticket = self.engine.submit(FULL, n, count, cached)
                    ticket.on_first = lambda: self.cache.store(lease, req.prompt_ids)
                    tokens, disagg_out, extra = await self._run(req, n, count, state)
            except TransferError as exc:
                log.error("%s", exc.message)
                return self._error(P.RequestError(exc.status, exc.message), request.headers)
            except EngineStopped as exc:
                return self._error(P.RequestError(500, str(exc)), request.headers)
            self.counters["prompt_tokens"] += n
            self.counters["completion_tokens"] += len(tokens)
            return await self._respond(request, req, n, tokens, disagg_out, ticket, extra=extra,
                                       cached=self._cached(req, lease))
        finally:
            self.cache.release(lease, req.prompt_ids + tokens[:count] if tokens else None)
            self.active -= 1
            self.completed += 1

    def _record_emulated_iteration(self, it) -> None:
        stats = {
            "iter": it.no, "iterLatencyMS": round(it.seconds * 1e3, 3), "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
            "numActiveRequests": len(it.decodes) + it.num_ctx_requests, "numQueuedRequests": it.queued,
            "numCompletedRequests": len(it.finished), "maxNumActiveRequests": self.s.max_batch_size,
            "inflightBatchingStats": {"numContextRequests": it.num_ctx_requests, "numCtxTokens": it.num_ctx_tokens,
                                      "numGenRequests": len(it.decodes), "numScheduledRequests":
                                      len(it.decodes) + it.num_ctx_requests, "numPausedRequests": 0,
                                      "microBatchId": 0, "avgNumDecodedTokensPerIter": 1.0},
            "kvCacheStats": self.cache.kv_cache_stats(),
            "standin": {"emulated_timing": self.engine.describe(), "kv_tokens_read": it.kv_tokens_read},
        }
        self.iter_stats.append(stats)
        if self.s.print_iter_log:
            log.info("iter = %d, iterLatencyMS = %.3f (emulated), states = {'num_ctx_requests': %d, "
                     "'num_ctx_tokens': %d, 'num_generation_tokens': %d}", it.no, it.seconds * 1e3,
                     it.num_ctx_requests, it.num_ctx_tokens, len(it.decodes))

    @property
    def limits(self) -> P.Limits:
        s = self.s
        return P.Limits(max_num_tokens=s.max_num_tokens, max_seq_len=s.max_seq_len,
                        chunked_prefill=bool(s.enable_chunked_prefill), max_input_len=s.max_input_len)

    def _check_limits(self, req: P.Request, n: int) -> None:
        self.limits.check(n, req.request_type)

    async def _kv_of(self, ids: list[int]):
        """The prompt's KV and its digest (in a worker thread, one hand-over for both)."""
        def compute():
            kv = M.kv_content(self.geo, ids)
            return kv, M.kv_digest(kv)
        return await asyncio.to_thread(compute)

    async def _run(self, req: P.Request, n: int, count: int, state: dict | None, computed=None):
        ids = req.prompt_ids
        if req.request_type == "generation_only":
            digest = await self.pool.fetch(state, n)
            first = int(req.disagg["first_gen_tokens"][0])
            return M.generate(digest, ids[-1], count, first=first), None, []
        kv, digest = computed if computed is not None else await self._kv_of(ids)
        tokens = M.generate(digest, ids[-1], count)
        if req.request_type != "context_only":
            extra = [M.generate(M.choice_digest(digest, i), ids[-1], count) for i in range(1, req.n)]
            return tokens, None, extra
        ctx_request_id = next(self.ctx_ids)
        opaque = await self.pool.publish(kv, ctx_request_id)
        if self.engine is not None:  # the emulated layout, for the generation server's emulated transfer
            opaque["emulated_layout"] = self.engine.layout.to_dict()
        from toolkit.standin.kv import encode_state
        params = {"request_type": "context_only", "first_gen_tokens": tokens[:1], "ctx_request_id": ctx_request_id,
                  "encoded_opaque_state": encode_state(opaque), "draft_tokens": None}
        for later in ("disagg_request_id", "schedule_style"):  # newer fields: echoed only when given
            if req.disagg.get(later) is not None:
                params[later] = req.disagg[later]
        return tokens, params, []

    def _cached(self, req: P.Request, lease) -> tuple[int, int]:
        """(prompt_tokens, cached_tokens) this server reports in ``usage``.

        Context and whole requests: the prompt and what the block cache reused. A generation leg: TensorRT-LLM's
        generation worker reports the whole prompt as cached (its KV arrived by transfer; PR #12923's description)
        unless the disaggregated server passed the context leg's usage along (``disaggregated_params.ctx_usage``,
        PR #13620/#14177), which it then reports instead (``rewrite_usage_info_from_ctx`` in
        tensorrt_llm/llmapi/disagg_utils.py)."""
        n = len(req.prompt_ids)
        if req.request_type != "generation_only":
            self.counters["cached_tokens"] += lease.cached_tokens
            return n, lease.cached_tokens
        ctx = req.disagg.get("ctx_usage")
        if isinstance(ctx, dict) and isinstance(ctx.get("prompt_tokens"), int):
            details = ctx.get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            return ctx["prompt_tokens"], cached if isinstance(cached, int) else 0
        return n, n

    async def _respond(self, request, req: P.Request, n: int, tokens: list[int], disagg_out, ticket=None,
                       extra: list[list[int]] | None = None, cached: tuple[int, int] | None = None):
        rid = P.new_id(req.kind)
        model = req.model or self.s.model_arg
        if req.stream and "empty_stream" in kv_faults() and req.request_type != "context_only":
            tokens, extra = [], [[] for _ in extra or []]  # a test fault: a 200 stream with no tokens (see kv.py)
        choices = [P.make_choice(req, i, t) for i, t in enumerate([tokens, *(extra or [])])]
        prompt_tokens, cached_tokens = cached if cached is not None else (n, None)
        use = P.usage(prompt_tokens, sum(len(c.tokens) for c in choices), cached_tokens)
        top_k = req.logprobs or 0
        if not req.stream or req.request_type == "context_only":
            if ticket is not None:
                await ticket.wait_for(len(tokens))
            elif self.decode_delay:
                await asyncio.sleep(self.decode_delay * len(choices[0].tokens))
            await self._progress()
            doc = P.response(req.kind, rid, model, choices, use, disagg_params=disagg_out,
                             prompt_token_ids=req.prompt_ids if req.request_type == "context_only" else None,
                             top_k=top_k)
            body, ctype = P.encode_body(doc, request.headers)
            return web.Response(body=body, content_type=ctype)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        offset = 1 if req.kind == "chat" else 0  # chat opens with a role chunk, sent with the first token
        for choice in choices:
            for j, chunk in enumerate(P.stream_chunks(req.kind, rid, model, choice, top_k)):
                if choice.index == 0 and ticket is not None:
                    await ticket.wait_for(max(1, j - offset + 1))
                elif self.decode_delay:
                    await asyncio.sleep(self.decode_delay)
                await self._progress()
                await resp.write(P.sse(chunk))
        if req.include_usage:
            await resp.write(P.sse(P.usage_chunk(req.kind, rid, model, use)))
        await resp.write(P.SSE_DONE)
        await resp.write_eof()
        return resp

    def _record_iteration(self, req: P.Request, n: int, generated: int, seconds: float) -> None:
        ctx = req.request_type != "generation_only"
        gen_tokens = 0 if req.request_type == "context_only" else generated
        it = next(self.iter_no)
        stats = {
            "iter": it, "iterLatencyMS": round(seconds * 1e3, 3), "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
            "numActiveRequests": self.active, "numQueuedRequests": self.queued,
            "numCompletedRequests": self.completed, "maxNumActiveRequests": self.s.max_batch_size,
            "inflightBatchingStats": {"numContextRequests": 1 if ctx else 0, "numCtxTokens": n if ctx else 0,
                                      "numGenRequests": 0 if req.request_type == "context_only" else 1,
                                      "numScheduledRequests": 1, "numPausedRequests": 0, "microBatchId": 0,
                                      "avgNumDecodedTokensPerIter": 1.0},
            "kvCacheStats": self.cache.kv_cache_stats(),
            "standin": {"request_type": req.request_type, "generated_tokens": gen_tokens},
        }
        self.iter_stats.append(stats)
        if self.s.print_iter_log:
            log.info("iter = %d, iterLatencyMS = %.3f, states = {'num_ctx_requests': %d, 'num_ctx_tokens': %d, "
                     "'num_generation_tokens': %d}", it, seconds * 1e3, 1 if ctx else 0, n if ctx else 0, gen_tokens)


DEFAULT_POOL_TOKENS = 262144  # without emulated timing: the pool when kv_cache_config.max_tokens is not given


def create_block_cache(s: WorkerSettings):
    """The block cache of this server and where its capacity comes from: with emulated timing,
    ``free_gpu_memory_fraction`` of what the emulated model's weights (per rank) and the runtime's own memory
    (facts.hardware: RUNTIME_OTHER_BYTES, NCCL buffers) leave of the emulated GPU, in the emulated model's KV bytes
    per token per rank (toolkit.facts.kvreuse.kv_pool_tokens; profiled activations and CUDA graphs, which tk's
    memory plan adds, are left out: an upper bound), capped by ``kv_cache_config.max_tokens``; without it (no
    GPU to size from), ``max_tokens`` or DEFAULT_POOL_TOKENS."""
    from toolkit.facts.kvreuse import kv_pool_tokens
    from toolkit.standin.blockcache import BlockCache
    kv = s.kv
    if s.emulate is not None:
        from toolkit.facts.hardware import GPU_FIGURES, RUNTIME_OTHER_BYTES, nccl_bytes
        r = s.emulate.roofline(s.tp, s.kv_dtype)
        gpu = GPU_FIGURES[s.emulate.gpu]
        other = RUNTIME_OTHER_BYTES + nccl_bytes(s.tp)
        tokens = max(s.tokens_per_block, kv_pool_tokens(gpu.memory_bytes, r.weight_bytes_per_rank, other,
                                                        r.kv_bytes_per_token, kv.free_gpu_memory_fraction,
                                                        kv.max_tokens))
        source = (f"free_gpu_memory_fraction {kv.free_gpu_memory_fraction:g} of the emulated {gpu.name}'s "
                  f"{gpu.memory_bytes / 2**30:.0f} GiB after {r.weight_bytes_per_rank / 2**30:.1f} GiB of "
                  f"{r.model.name} weights per rank and {other / 2**30:.1f} GiB of runtime; "
                  f"{r.kv_bytes_per_token:.0f} KV bytes per token per rank"
                  + (f"; capped by max_tokens {kv.max_tokens}" if kv.max_tokens else ""))
    else:
        tokens = kv.max_tokens or DEFAULT_POOL_TOKENS
        source = (f"kv_cache_config.max_tokens {kv.max_tokens}" if kv.max_tokens else
                  f"the stand-in's default of {DEFAULT_POOL_TOKENS} tokens (no emulated GPU to size from; set "
                  f"kv_cache_config.max_tokens to rehearse eviction)")
    blocks = max(1, tokens // s.tokens_per_block)
    cache = BlockCache(s.tokens_per_block, blocks, reuse=kv.enable_block_reuse, partial_reuse=kv.enable_partial_reuse,
                       store_generated=not kv.manager_v2, event_buffer_max_size=kv.event_buffer_max_size,
                       window_size=s.max_seq_len)
    return cache, source


def _display_host(host: str) -> str:
    if host in ("0.0.0.0", "", "::"):
        return socket.gethostname()
    return host


def bind(host: str, port: int) -> socket.socket:
    """Bind the listening socket (TensorRT-LLM: 'Failed to bind socket to ...' on conflict)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"Failed to bind socket to {host}:{port}: {exc.strerror or exc}") from None
    return sock


async def serve(app: web.Application, sock: socket.socket, on_start=None, on_stop=None, on_listening=None,
                on_usr1=None, stopping: asyncio.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT (or `stopping` is set: a part of the server failed), then clean up. on_usr1: the
    worker's wedge test fault."""
    stop = stopping or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if on_usr1 is not None:
        loop.add_signal_handler(signal.SIGUSR1, on_usr1)
    if on_start:
        await on_start()
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.SockSite(runner, sock, shutdown_timeout=2.0)
    await site.start()
    if on_listening:  # e.g. register into the cluster storage only once requests can be answered (PR #14289)
        await on_listening()
    try:
        await stop.wait()
    finally:
        if on_listening and hasattr(on_listening, "stop"):
            await on_listening.stop()
        await runner.cleanup()
        if on_stop:
            await on_stop()


def emulated_timing(s: WorkerSettings):
    """Where this server's iteration times come from (toolkit.standin.emulate.timing_for): aiconfigurator's data for
    the emulated model in this server's layout and limits on the TensorRT-LLM line it imitates, else the roofline."""
    from toolkit.standin.emulate import timing_for
    from toolkit.standin.options import target_of
    target = target_of(s.version)
    return timing_for(s.emulate, tp=s.tp, pp=s.pp, ep=s.ep, attention_dp=s.attention_dp, kv_dtype=s.kv_dtype,
                      version_text=target.release or target.line, max_batch_size=s.max_batch_size,
                      max_num_tokens=s.max_num_tokens, max_seq_len=s.max_seq_len)


def _serving_mode(worker: Worker, settings: WorkerSettings) -> str:
    """How this server takes part in disaggregated serving, for its start-up line."""
    if worker.pool:
        return (f"disaggregated-capable, cache_transceiver_config.backend {settings.transceiver.backend} emulated "
                f"with NIXL ({', '.join(f'{k}={v}' for k, v in worker.pool.describe().items())})")
    return "aggregated (cache transceiver disabled: no cache_transceiver_config.backend)"


def _log_emulation(settings: WorkerSettings, timing) -> None:
    """The start-up line of a server with emulated timing: the emulated model, where its iteration times come from
    and its emulated KV transfer."""
    e = settings.emulate
    tr = settings.transceiver
    log.info("tk CPU stand-in, not TensorRT-LLM: %s, %s; the emulated KV transfer: %s",
             e.roofline(settings.tp, settings.kv_dtype).describe(), timing.detail,
             (f"TensorRT-LLM's {'C++' if tr.resolved_runtime == 'CPP' else 'Python'} transceiver at {e.kv_link}"
              if tr and e.kv_gbps else "none (no cache transceiver or no link figure)"))


def run(settings: WorkerSettings) -> int:
    worker = Worker(settings)
    agent_name = f"tk-standin-{socket.gethostname()}-{settings.port}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    worker.create_pool(agent_name)  # before binding: start-up errors never leave a port bound
    try:
        # TensorRT-LLM's launcher leader binds its IPC address before the HTTP server listens.
        ipc = bind_launcher_ipc(settings.version)
    except RuntimeError as exc:
        print(f"tk-standin-serve: {exc}", file=sys.stderr)
        return 1
    try:
        sock = bind(settings.host, settings.port)
    except RuntimeError as exc:
        print(f"tk-standin-serve: {exc}", file=sys.stderr)
        if ipc:
            ipc.close()
        return 1
    mode = _serving_mode(worker, settings)
    if settings.emulate is not None:
        worker.timing = emulated_timing(settings)
        _log_emulation(settings, worker.timing)
    log.info("tk CPU stand-in, not TensorRT-LLM: serving %s for the TensorRT-LLM %s protocol on http://%s:%d; "
             "KV %d bytes/token (%s, tokens_per_block %d); %s", settings.model_arg, settings.version.line,
             settings.host, settings.port, worker.geo.bytes_per_token, settings.kv_dtype,
             settings.tokens_per_block, mode)

    async def start():
        worker.start_emulation()
        if worker.pool:
            await worker.pool.start()

    async def stop():
        if worker.engine:
            await worker.engine.stop()
        if worker.pool:
            await worker.pool.close()
    member = None
    stopping = asyncio.Event()
    failures: list[BaseException] = []

    def membership_failed(exc: BaseException) -> None:
        """Its registration cannot be kept: stop (exit 1) rather than answer /health out of the proxy's routing."""
        failures.append(exc)
        stopping.set()
    if settings.cluster is not None:  # membership TensorRT-LLM keeps: toolkit/standin/cluster.py
        from toolkit.standin.cluster import Membership
        member = Membership(settings.cluster, settings.server_role, settings.host, settings.port,
                            on_failure=membership_failed)
    try:
        asyncio.run(serve(worker.app(), sock, start, stop, member, on_usr1=worker.wedge, stopping=stopping))
    finally:
        if ipc:
            ipc.close()
    if failures:
        log.error("tk CPU stand-in worker on port %d stopped: its membership failed (%s: %s)", settings.port,
                  type(failures[0]).__name__, failures[0])
        return 1
    log.info("tk CPU stand-in worker on port %d stopped", settings.port)
    return 0


def bind_launcher_ipc(version) -> socket.socket | None:
    """Hold the internal port TensorRT-LLM's launcher would bind for this instance (tcp://127.0.0.1:PORT from
    TLLM_SPAWN_PROXY_PROCESS_IPC_PORT, on lines that read it), so two instances given one port fail as the
    engine does: the second cannot bind ("Address already in use"). None where the line has no such knob or the
    variable is unset (the launcher then searches from 10012 itself)."""
    from toolkit.facts import trtllm
    env = trtllm.LAUNCHER_IPC_PORT_ENV
    value = os.environ.get(env)
    if env not in version.internal_port_envs or not value:
        return None
    addr = f"tcp://{trtllm.LAUNCHER_IPC_HOST}:{value}"
    try:
        port = int(value)
        if not 0 < port < 65536:
            raise ValueError
    except ValueError:
        raise RuntimeError(f"zmq.error.ZMQError: Invalid argument (addr={addr!r}, from {env})") from None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((trtllm.LAUNCHER_IPC_HOST, port))
        sock.listen(1)
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"zmq.error.ZMQError: {exc.strerror or exc} (addr={addr!r}, from {env}; "
                           "another instance on this node holds it)") from None
    log.info("launcher IPC channel of this instance: %s (%s)", addr, env)
    return sock
