"""Emulated timing: the stand-in's iterations take the time a named model would on a named GPU.

tk CPU stand-in, not TensorRT-LLM: every figure this produces is "emulated timing of MODEL on GPU", never a
measurement. Where the time of an iteration comes from, in that order (``timing_for``; the server says which in
its first log line, ``/version``, ``/server_info`` and ``/standin/stats``):

1. aiconfigurator's per-operation database (GEMM, context and generation attention, TP all-reduce, MoE and its
   dispatch; measured per GPU and TensorRT-LLM version) for the emulated model in this server's layout (TP, PP,
   EP, attention DP), precision and KV dtype, on the data of the TensorRT-LLM line the server imitates: queried
   once at start-up into a table (``toolkit.facts.steptime``, through tk's one aiconfigurator adapter), read in
   microseconds per iteration;
2. the roofline (``toolkit.facts.roofline``: datasheet peaks, assumed efficiencies) where aiconfigurator has no
   data for that GPU or TensorRT-LLM line, or is not installed (the reason is stated).

Turned on by the environment the plan renders from a recipe's ``standin.emulate`` (prefix
``toolkit.facts.engines.STANDIN.emulate_env_prefix``): ``..._MODEL`` (a built-in name or a directory with
config.json), ``..._GPU``, ``..._PRECISION`` (bf16 | fp8), ``..._KV_GBPS`` (the transport profile's nominal GB/s:
the link of the emulated KV transfer, ``kv_transfer``) and ``..._KV_REPORT`` (a ``tk validate cluster`` report whose
measured GB/s replaces it). The layout is the server's own
(``--tp_size``, ``--pp_size``, ``--ep_size`` or ``moe_expert_parallel_size``, ``enable_attention_dp``), the line
``TK_STANDIN_TRTLLM_VERSION``.

``EmulatedEngine`` runs ``toolkit.standin.scheduler.Scheduler`` on the event loop: it composes an iteration,
sleeps its time against an absolute deadline (asyncio, no busy-waiting), then hands out the tokens the iteration
produced. A CPU too slow to keep up shows as ``lag_ms`` in ``/standin/stats``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from dataclasses import dataclass

from toolkit.facts.engines import STANDIN
from toolkit.facts.hardware import EMULATED_GPUS
from toolkit.facts.models import ModelError, ModelSpec, resolve_model
from toolkit.facts.roofline import PRECISIONS, Roofline, iteration_time, roofline
from toolkit.facts.steptime import IterationShape
from toolkit.standin.scheduler import GENERATION_ONLY, Iteration, Scheduler

log = logging.getLogger("toolkit.standin")
PREFIX = STANDIN.emulate_env_prefix
RESYNC_S = 0.05  # behind the emulated clock by more than this: start again from now (counted as lag)
MAX_PREFILL_SHAPES = 256  # distinct prefill iteration shapes kept in the stats; the rest under (0, 0, 0)


class EmulationError(ValueError):
    pass


class EngineStopped(RuntimeError):
    """The emulated engine's loop is gone: the request cannot finish."""


@dataclass(frozen=True)
class Emulation:
    model_arg: str
    model: ModelSpec
    gpu: str
    precision: str
    kv_gbps: float | None  # the link the emulated KV transfer runs at (GB/s, one direction, per GPU); None: no term
    kv_link: str = ""  # where that figure comes from (the transport's nominal figure, or a validation report)

    def roofline(self, tp: int, kv_dtype: str) -> Roofline:
        return roofline(self.model, self.gpu, tp=tp, precision=self.precision, kv_dtype=kv_dtype)


@dataclass(frozen=True)
class Layout:
    """An emulated server's parallel layout, as the KV transfer sees it (the context server's travels in its opaque
    state, so the generation server can work out the rank pairs)."""

    tp: int = 1
    pp: int = 1
    attention_dp: bool = False

    @property
    def attention_tp(self) -> int:
        """TP per attention DP group: under attention DP every rank holds whole heads of its own requests."""
        return 1 if self.attention_dp else self.tp

    def to_dict(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "attention_dp": self.attention_dp}

    @classmethod
    def from_dict(cls, doc) -> "Layout | None":
        if not isinstance(doc, dict):
            return None
        tp, pp, adp = doc.get("tp"), doc.get("pp"), doc.get("attention_dp")
        if not (isinstance(tp, int) and isinstance(pp, int) and tp >= 1 and pp >= 1 and isinstance(adp, bool)):
            return None
        return cls(tp, pp, adp)


@dataclass(frozen=True)
class KvTransfer:
    """The emulated model's KV move for one request, as the transceiver TensorRT-LLM runs moves it."""

    seconds: float
    runtime: str  # CPP | PYTHON
    layout: str  # toolkit.facts.transceiver.Layout value
    descriptors_per_pair: int
    bytes_per_pair: int
    targets_per_context_rank: int
    describe: str


def kv_transfer(model: ModelSpec, *, kv_dtype: str, tokens_per_block: int, tokens: int, ctx: Layout, gen: Layout,
                runtime: str, bounce_size_mb: int, link_gbps: float) -> KvTransfer:
    """What moving ``tokens`` tokens of the emulated model's KV from a context server of layout ``ctx`` to a generation
    server of layout ``gen`` takes on TensorRT-LLM's transceiver (``toolkit.facts.transceiver``, each fact cited
    there): the C++ one gathers each target's slice into a staging buffer, posts one WRITE of one descriptor per
    (context rank, generation rank) and scatters it on arrival; the Python one WRITEs its mapper's per-block (or
    per block x layer x K/V) lists, or one bounce region. Every context rank sends its own shard at the same time over
    its own link; one rank sends its targets one after the other, so the request is through after ``targets`` pair
    transfers: ``targets x (gather + count x per-descriptor cost + bytes / link + scatter)``."""
    from toolkit.facts import transceiver as T
    from toolkit.facts.models import KV_DTYPE_BYTES

    mla = model.attention == "mla"
    elem = KV_DTYPE_BYTES[kv_dtype]
    ctx_layers, gen_layers = model.layers_per_rank(ctx.pp), model.layers_per_rank(gen.pp)
    if mla:
        slot = (model.kv_lora_rank + model.qk_rope_head_dim) * elem
    else:
        heads = min(max(1, model.num_kv_heads // ctx.attention_tp), max(1, model.num_kv_heads // gen.attention_tp))
        slot = heads * model.head_dim * elem
    pair = T.RankPairGeometry(tokens_per_block=tokens_per_block, layers=min(ctx_layers, gen_layers),
                              kv_factor=model.kv_factor, slot_bytes_per_token=max(1, int(slot)))
    rt = T.Runtime(runtime)
    mapper = T.mapper_layout(ctx.attention_tp, gen.attention_tp, model.num_kv_heads, mla, ctx_layers, gen_layers)
    layout = T.layout_for(rt, mapper, bounce_size_mb, T.descriptors(mapper, pair, tokens).total_bytes)
    d = T.descriptors(layout, pair, tokens)
    targets = T.targets_per_context_rank(ctx.attention_tp, gen.attention_tp, ctx.pp, gen.pp)
    seconds = targets * T.transfer_time(d, link_gbps=link_gbps).total_s
    return KvTransfer(seconds=seconds, runtime=rt.value, layout=d.layout.value, descriptors_per_pair=d.count,
                      bytes_per_pair=d.total_bytes, targets_per_context_rank=targets,
                      describe=f"{T.describe(rt, d)}; {targets} target rank(s) per context rank at {link_gbps:g} GB/s")


ROOFLINE, DATABASE = "roofline", "aiconfigurator"


class RooflineTiming:
    """The fallback: the roofline of the whole batch (``toolkit.facts.roofline.iteration_time``)."""

    source = ROOFLINE

    def __init__(self, roof: Roofline, why: str):
        self.roof, self.why = roof, why

    def seconds(self, shape: IterationShape) -> float:
        return iteration_time(self.roof, shape.computed_tokens, shape.kv_tokens_read)

    @property
    def detail(self) -> str:
        return (f"roofline from datasheet figures and assumed efficiencies (toolkit/facts/hardware.py; not a "
                f"measurement) because {self.why}")

    def summary(self) -> dict:
        r = self.roof
        return {"source": self.source, "detail": self.detail, "gpu_source": r.gpu.source,
                "prefill_efficiency": r.prefill_efficiency, "decode_efficiency": r.decode_efficiency}


class DatabaseTiming:
    """aiconfigurator's per-operation data, as a table (``toolkit.facts.steptime.StepTable``)."""

    source = DATABASE

    def __init__(self, table, note: str):
        self.table, self.note = table, note

    def seconds(self, shape: IterationShape) -> float:
        return self.table.seconds(shape)

    @property
    def detail(self) -> str:
        t = self.table
        return f"{t.source} ({self.note}), {t.describe}" + (f"; {'; '.join(t.notes)}" if t.notes else "")

    def summary(self) -> dict:
        return {"source": self.source, "detail": self.detail, "table": self.table.summary()}


def timing_for(emu: Emulation, *, tp: int, pp: int = 1, ep: int | None = None, attention_dp: bool = False,
               kv_dtype: str = "auto", version_text: str | None = None, max_batch_size: int, max_num_tokens: int,
               max_seq_len: int):
    """aiconfigurator's timing of the emulated model in this layout on the data of the TensorRT-LLM line
    ``version_text`` names (a line such as 1.3, or a release such as 1.3.0rc24), else the roofline with the
    reason. Builds the table (about a second, most of it aiconfigurator compiling the model's operations)."""
    from toolkit.facts import steptime
    from toolkit.facts import versions
    from toolkit.size import aiconfigurator as aic

    roof = emu.roofline(tp, kv_dtype)
    parsed = versions.parse_version((version_text or versions.LATEST).lstrip("v"))
    if parsed is None:
        return RooflineTiming(roof, f"{version_text!r} names no TensorRT-LLM version")
    release = parsed.text if parsed.text.count(".") >= 2 else None
    try:
        choice = aic.choose_data(emu.gpu, parsed.line, release)
        engine = aic.step_engine(emu.model, choice, tp=tp, pp=pp, attention_dp=attention_dp, ep=ep,
                                 precision=emu.precision, kv_dtype=kv_dtype)
        table = steptime.build(engine, max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
                               max_seq_len=max_seq_len, attention_dp=tp if attention_dp else 1,
                               source=f"aiconfigurator {aic.PINNED}'s per-operation data for {choice.system}, "
                                      f"TensorRT-LLM {choice.version}")
    except (aic.SizingError, ValueError) as exc:
        return RooflineTiming(roof, str(exc))
    return DatabaseTiming(table, choice.note)


def from_env(env=os.environ) -> Emulation | None:
    """The emulation the environment asks for, or None. EmulationError names the variable at fault."""
    model_arg = env.get(PREFIX + "MODEL")
    if not model_arg:
        return None
    gpu = env.get(PREFIX + "GPU", "")
    if gpu not in EMULATED_GPUS:
        raise EmulationError(f"{PREFIX}GPU={gpu!r}: emulated GPUs are {', '.join(EMULATED_GPUS)}")
    precision = env.get(PREFIX + "PRECISION") or "bf16"
    if precision not in PRECISIONS:
        raise EmulationError(f"{PREFIX}PRECISION={precision!r}: one of {', '.join(PRECISIONS)}")
    try:
        model = resolve_model(model_arg)
    except ModelError as exc:
        raise EmulationError(f"{PREFIX}MODEL: {exc}") from None
    gbps = env.get(PREFIX + "KV_GBPS")
    try:
        kv_gbps = float(gbps) if gbps else None
    except ValueError:
        raise EmulationError(f"{PREFIX}KV_GBPS={gbps!r} is not a number of GB/s") from None
    if kv_gbps is not None and not (kv_gbps > 0 and kv_gbps < float("inf")):
        raise EmulationError(f"{PREFIX}KV_GBPS={gbps!r} must be a positive number")
    kv_link = f"the transport's nominal {kv_gbps:g} GB/s" if kv_gbps else ""
    report = env.get(PREFIX + "KV_REPORT")
    if report:  # a `tk validate cluster` run's measured figure replaces the nominal one
        from toolkit.size.transfer import MeasuredError, measured
        try:
            bw = measured(report)
        except MeasuredError as exc:
            raise EmulationError(f"{PREFIX}KV_REPORT: {exc}") from None
        kv_gbps, kv_link = bw.gbps, f"{bw.gbps:g} GB/s measured: {bw.detail}"
    try:
        roofline(model, gpu, precision=precision)
    except ValueError as exc:
        raise EmulationError(f"{PREFIX}*: {exc}") from None
    return Emulation(model_arg=model_arg, model=model, gpu=gpu, precision=precision, kv_gbps=kv_gbps, kv_link=kv_link)


class Ticket:
    """One request's view of the engine: how many of its tokens have come out, and whether it is done."""

    __slots__ = ("available", "done", "_event", "first_at", "error", "on_first")

    def __init__(self):
        self.available = 0
        self.done = False
        self.first_at: float | None = None
        self.error: BaseException | None = None  # the engine loop died: waiting on this ticket raises it
        self.on_first = None  # called once, when the first token is out (its context phase is over)
        self._event = asyncio.Event()

    def advance(self, n: int, done: bool) -> None:
        if n and self.first_at is None:
            self.first_at = time.monotonic()
            if self.on_first is not None:
                self.on_first()
        self.available += n
        self.done = self.done or done
        self._event.set()

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.done = True
        self._event.set()

    async def wait_for(self, count: int) -> None:
        """Until ``count`` tokens are out (or the request is done); raises EngineStopped when the engine's loop died
        (the wait is otherwise bounded by the request timeout of whoever asked)."""
        while self.available < count and not self.done:
            self._event.clear()
            await self._event.wait()
        if self.error is not None:
            raise EngineStopped(f"the emulated engine's iteration loop died: {self.error}")


class EmulatedEngine:
    def __init__(self, emu: Emulation, *, tp: int, kv_dtype: str, max_batch_size: int, max_num_tokens: int,
                 chunked_prefill: bool, tokens_per_block: int, on_iteration=None, timing=None,
                 layout: Layout | None = None, transceiver: tuple[str, int] | None = None):
        self.emu = emu
        self.kv_dtype = kv_dtype
        self.layout = layout or Layout(tp=tp)
        self.transceiver = transceiver  # (TensorRT-LLM runtime CPP | PYTHON, bounce MiB); None: aggregated
        self.last_transfer = ""
        self.roof = emu.roofline(tp, kv_dtype)
        self.timing = timing or RooflineTiming(self.roof, "no other timing was given")
        self.sched = Scheduler(max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
                               chunked_prefill=chunked_prefill, tokens_per_block=tokens_per_block,
                               cost=self.timing.seconds)
        self.tp = tp
        self.on_iteration = on_iteration
        self.tickets: dict[int, Ticket] = {}
        self.ids = itertools.count(1)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.dead: BaseException | None = None
        self.stats = {"iterations": 0, "emulated_busy_s": 0.0, "tokens": 0, "lag_ms_total": 0.0, "lag_ms_max": 0.0,
                      "resyncs": 0, "kv_transfers": 0, "kv_emulated_s": 0.0, "kv_real_s": 0.0,
                      "kv_real_over_emulated_s": 0.0, "prefill_requests": 0, "prefill_wait_s": 0.0}
        # The prefill iterations this server formed, by shape (context requests, their tokens, decodes beside them):
        # what a static model would price them at (the calibration compares aiconfigurator's figure for each shape
        # with the emulated time). Bounded.
        self.prefill_batches: dict[tuple[int, int, int], list] = {}
        self._arrived: dict[int, float] = {}  # rid -> when a request with a context phase was submitted

    def describe(self) -> str:
        return self.roof.describe()

    def summary(self) -> dict:
        r = self.roof
        return {"emulated_timing": self.describe(), "model": self.emu.model_arg, "gpu": self.emu.gpu,
                "precision": self.emu.precision, "tp": self.tp, "timing": self.timing.summary(),
                "kv_bytes_per_token_per_rank": r.kv_bytes_per_token, "kv_link_gbps": self.emu.kv_gbps,
                "kv_link": self.emu.kv_link, "kv_transfer": self.last_transfer, "layout": self.layout.to_dict(),
                "prefill_batches": [{"requests": r, "tokens": t, "decodes": d, "iterations": n,
                                     "emulated_ms": round(sec * 1e3, 3)}
                                    for (r, t, d), (n, sec) in sorted(self.prefill_batches.items())],
                "not_a_measurement": True, **{k: (round(v, 3) if isinstance(v, float) else v)
                                              for k, v in self.stats.items()}}

    def start(self) -> None:
        from toolkit.standin.tasks import spawn
        self._wake = asyncio.Event()
        self._task = spawn(self._loop(), "emulated-engine", on_error=self._failed)

    def _failed(self, exc: BaseException) -> None:
        """The iteration loop died: every waiting request fails now instead of hanging until the client's timeout."""
        for ticket in self.tickets.values():
            ticket.fail(exc)
        self.tickets.clear()
        self._arrived.clear()
        self.dead = exc

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def kv_transfer(self, tokens: int, ctx: Layout | None) -> KvTransfer | None:
        """The emulated model's KV transfer of a ``tokens``-token request from a context server of layout ``ctx``
        (None: this server's own) to this one; None where the server has no transfer term (no link figure, or no
        cache transceiver)."""
        if not self.emu.kv_gbps or self.transceiver is None:
            return None
        runtime, bounce = self.transceiver
        return kv_transfer(self.emu.model, kv_dtype=self.kv_dtype, tokens_per_block=self.sched.tokens_per_block,
                           tokens=tokens, ctx=ctx or self.layout, gen=self.layout, runtime=runtime,
                           bounce_size_mb=bounce, link_gbps=self.emu.kv_gbps)

    def transfer_wait(self, xfer: KvTransfer, real_s: float) -> float:
        """Seconds still to wait once the real NIXL read took ``real_s``: the emulated transfer takes ``xfer``'s
        time, of which the stand-in's own read (its small KV over this machine's transport) is a part; a read slower
        than the emulated transfer is counted (``kv_real_over_emulated_s``), never hidden."""
        self.stats["kv_transfers"] += 1
        self.stats["kv_emulated_s"] += xfer.seconds
        self.stats["kv_real_s"] += real_s
        self.stats["kv_real_over_emulated_s"] += max(0.0, real_s - xfer.seconds)
        self.last_transfer = xfer.describe
        return max(0.0, xfer.seconds - real_s)

    def submit(self, kind: str, prompt_len: int, new_tokens: int, cached: int = 0) -> Ticket:
        """Queue a request; ``cached`` prompt tokens came from the block cache (read, not computed)."""
        if self.dead is not None:
            raise EngineStopped(f"the emulated engine's iteration loop died: {self.dead}")
        rid = next(self.ids)
        ticket = Ticket()
        self.tickets[rid] = ticket
        if kind != GENERATION_ONLY:
            self._arrived[rid] = asyncio.get_running_loop().time()
        emitted = self.sched.add(rid, kind, prompt_len, new_tokens, cached)
        for _, n in emitted:
            ticket.advance(n, done=new_tokens <= n)
        if ticket.done:
            del self.tickets[rid]
        else:
            self._wake.set()
        return ticket

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if not self.sched.pending():
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
            it = self.sched.step()
            if it is None:
                await asyncio.sleep(0)
                continue
            if it.chunks:
                self._count_prefill(it, deadline)
            deadline += it.seconds
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            lag = loop.time() - deadline
            if lag > 0:
                self.stats["lag_ms_total"] += lag * 1e3
                self.stats["lag_ms_max"] = max(self.stats["lag_ms_max"], lag * 1e3)
                if lag > RESYNC_S:
                    self.stats["resyncs"] += 1
                    deadline = loop.time()
            self._deliver(it)

    def _count_prefill(self, it: Iteration, start: float) -> None:
        """A prefill iteration starting at ``start`` (the emulated clock): its shape, and how long each request it
        starts prefilling waited for it since it was submitted (queued behind earlier iterations)."""
        for rid, _ in it.chunks:
            arrived = self._arrived.pop(rid, None)
            if arrived is not None:
                self.stats["prefill_requests"] += 1
                self.stats["prefill_wait_s"] += max(0.0, start - arrived)
        key = (it.num_ctx_requests, it.num_ctx_tokens, len(it.decodes))
        if key not in self.prefill_batches and len(self.prefill_batches) >= MAX_PREFILL_SHAPES:
            key = (0, 0, 0)  # past the bound: counted together
        entry = self.prefill_batches.setdefault(key, [0, 0.0])
        entry[0] += 1
        entry[1] += it.seconds

    def _deliver(self, it: Iteration) -> None:
        finished = set(it.finished)
        for rid, n in it.emitted:
            ticket = self.tickets.get(rid)
            if ticket is not None:
                ticket.advance(n, rid in finished)
        for rid in finished:
            ticket = self.tickets.pop(rid, None)
            if ticket is not None and not ticket.done:
                ticket.advance(0, True)
        self.stats["iterations"] += 1
        self.stats["emulated_busy_s"] += it.seconds
        self.stats["tokens"] += len(it.emitted)
        if self.on_iteration:
            self.on_iteration(it)
