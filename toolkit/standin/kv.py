"""How the stand-in moves a request's KV cache from context to generation server: real NIXL transfers in host memory.

tk CPU stand-in, not TensorRT-LLM. One NIXL agent per process (UCX backend, or ``TRTLLM_NIXL_KVCACHE_BACKEND``),
created and given one registered host buffer at start-up; every NIXL call is blocking and runs on one dedicated
thread, never on the event loop.

The registered buffer is cut into **slots**, each able to hold ``max_tokens_in_buffer`` tokens of KV (the
``cache_transceiver_config`` value, or what TensorRT-LLM would derive when it is unset): *send* slots
(``min(max_batch_size, 16)``) hold KV a context server has produced until a generation server fetched it;
*receive* slots (``min(max_batch_size, 8)``) are where a generation server reads KV into. The whole buffer is
bounded by ``TK_STANDIN_POOL_MB`` (default 1024); slot counts shrink to fit, and a model whose single slot does not
fit is refused at start-up.

Slot layout::

    [64-byte header: magic, ctx_request_id, num_tokens, epoch (uint64 each)]
    [layer 0: block 0 | block 1 | ... ][layer 1: block 0 | ...] ...      block = tokens_per_block rows of
                                                                          bytes_per_token_per_layer bytes

Context server (``request_type: context_only`` with n prompt tokens): computes the prompt's KV
(``model.kv_content``: n x bytes_per_token bytes, deterministic from the token ids) into a free send slot, writes
the header, and returns in ``encoded_opaque_state`` (msgpack, then base64 by the HTTP layer): its NIXL agent name
and metadata, its HTTP endpoint (for error messages), the header's and every block's (address, length), and the
geometry (model, attention, layers, tokens_per_block, kv dtype, bytes per token). A background task frees a send
slot when the generation server's NIXL notification for it arrives, or after ``kv_transfer_timeout_ms`` if nobody
came (logged, counted as expired).

A prompt longer than ``max_tokens_in_buffer`` (``check_fits``): where TensorRT-LLM's C++ transceiver talks over an
agent connection (NIXL, ``preallocated``) it fails as that does ("Agent need all buffer pre-allocated", HTTP 500).
Everywhere else TensorRT-LLM serves it (the C++ transceiver over UCX or MPI through buffers it allocates for the
request; the Python transceiver has no such buffer at all), and so does the stand-in: the KV goes into a **buffer
of its own** (``Region`` with no slot), laid out as a slot of ``ceil(n / tokens_per_block)`` blocks, allocated and
registered with NIXL for that request; the opaque state carries the same addresses plus the NIXL metadata of that
one registration (``section_metadata``, loaded by the reader into the context agent it knows). Its bytes count
against what the slots leave of ``TK_STANDIN_POOL_MB`` (``RequestArena``): a request waits for room up to
``kv_transfer_timeout_ms``, as for a slot, then gets HTTP 503; one that could never fit gets 500 at once (an
allocation that cannot succeed, not "try again"). It is
deregistered and its pages returned when a slot would be freed (notification, expiry, release). Waiting rather
than refusing at once: TensorRT-LLM allocates from GPU memory and serves such requests under load, so only a
request that could never fit is refused. The generation server likewise READs a
prompt longer than its receive slot into a buffer registered for that request, freed after the READ. (NIXL keeps
what it loaded about a freed buffer in the reader's view of the context agent; it has no call to forget one
section: a few hundred bytes per distinct buffer address.)

Generation server (``request_type: generation_only``): decodes the opaque state; refuses a context server whose
geometry differs from its own (tokens_per_block, kv dtype, model, bytes per token, layers: what TensorRT-LLM's
``CacheFormatter::inquireSupport`` checks when the two connect); adds the context agent once (cached by name;
dropped after a failed transfer); takes a receive slot; READs header and blocks with one NIXL transfer whose
notification tells the context server to free its slot; polls it on the event loop until ``kv_transfer_timeout_ms``
(then cancels it and fails the request naming the context server, never hangs); checks the header (a slot the
context server reclaimed after its timeout is detected); hashes the received bytes in canonical order. That digest
seeds the generated tokens, so a missing or corrupted transfer changes the answer.

Faults for tests (``TK_STANDIN_FAULT``, comma-separated): ``corrupt_kv`` flips one byte of every received KV;
``drop_notif`` sends no notification (the context server then frees the slot only at its timeout);
``empty_stream`` makes a server answer every streamed generation request with HTTP 200 and no tokens (a broken
streaming path: the "benchmark that passes with zero output tokens" failure, which tk bench must call invalid;
plain requests, such as tk launch's smoke request, still get their tokens); ``skip_context`` (read by the proxy)
sends every request to a generation server whole, so no context leg runs and no KV moves (a deployment that only
looks disaggregated, which tk bench must call invalid).
``TK_STANDIN_MAX_TOKENS_IN_BUFFER=N`` replaces this server's cache_transceiver_config.max_tokens_in_buffer (as
a hand-edited options file would): a context and a generation server with different buffers then fail every
transfer with "Message truncated", as TensorRT-LLM does (``check_buffer``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import msgpack
import numpy as np

from toolkit.standin import model as M
from toolkit.standin.options import ConfigError, WorkerSettings

log = logging.getLogger("toolkit.standin")

HEADER_BYTES = 64
MAGIC = 0x746B2D7374616E64  # "tk-stand"
STATE_VERSION = 1
POOL_MB_ENV = "TK_STANDIN_POOL_MB"
FAULT_ENV = "TK_STANDIN_FAULT"
PROGRESS_INTERVAL_S = 0.001  # NIXL progress polling while a transfer is outstanding (no progress thread)
IDLE_PROGRESS_INTERVAL_S = 0.02  # ... and while none is expected
INLINE_WAIT_S = 0.002  # a READ's completion waited for in NIXL's thread before the event loop polls it
# KV up to this size is copied and hashed on the event loop (tens of microseconds); larger, in a worker thread. A
# hand-over to a thread and back took 0.1-0.3 ms on the 2-core development box.
INLINE_BYTES = 256 << 10
SECTION_MAX_BYTES = 64 << 10  # NIXL's metadata of one registration in an opaque state: a few hundred bytes


class TransferError(Exception):
    """A KV transfer the generation server could not complete; answered with this HTTP status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def faults() -> set[str]:
    return {f.strip() for f in os.environ.get(FAULT_ENV, "").split(",") if f.strip()}


def import_nixl():
    """NIXL's Python API: ``nixl._api``, else the wheel's own package (``nixl_cu12`` / ``nixl_cu13``)."""
    errors = []
    for mod in ("nixl._api", "nixl_cu12._api", "nixl_cu13._api"):
        try:
            module = __import__(mod, fromlist=["nixl_agent", "nixl_agent_config"])
            return module.nixl_agent, module.nixl_agent_config
        except ImportError as exc:
            errors.append(f"{mod}: {exc}")
    raise ImportError("NIXL is not installed (pip install nixl-cu12): " + "; ".join(errors))


def encode_state(state: dict) -> str:
    return base64.b64encode(msgpack.packb(state, use_bin_type=True)).decode()


def decode_state(encoded: str | None) -> dict:
    if not encoded:
        raise TransferError(400, "generation_only request without disaggregated_params.encoded_opaque_state")
    try:
        state = msgpack.unpackb(base64.b64decode(encoded), raw=False)
    except Exception as exc:  # noqa: BLE001
        raise TransferError(400, f"encoded_opaque_state is not a state the stand-in wrote ({exc})") from None
    if not isinstance(state, dict) or state.get("engine") != "tk-standin" or state.get("v") != STATE_VERSION:
        raise TransferError(400, "encoded_opaque_state was not written by a tk stand-in context server "
                                 f"of state version {STATE_VERSION}")
    return state


@dataclass
class Region:
    """Where one request's KV lies, in the slot layout (header, then per layer ``tokens // tokens_per_block``
    blocks): a slot of the pool's buffer (``slot`` its index), or a buffer allocated and registered with NIXL for
    this request alone (``slot`` None; ``reg`` its registration, ``section`` that registration's NIXL metadata for
    the reader, ``extent`` its (offset, bytes) in the ``RequestArena``)."""

    view: np.ndarray  # header and blocks, uint8
    tokens: int
    slot: int | None = None
    reg: object = None
    section: bytes | None = None
    extent: tuple[int, int] | None = None

    @property
    def addr(self) -> int:
        return self.view.ctypes.data

    def header(self) -> np.ndarray:
        return self.view[:HEADER_BYTES].view(np.uint64)

    def data(self, geo: M.KvLayout) -> np.ndarray:
        size = geo.num_layers * self.tokens * geo.bytes_per_token_per_layer
        return self.view[HEADER_BYTES:HEADER_BYTES + size].reshape(geo.num_layers, self.tokens,
                                                                   geo.bytes_per_token_per_layer)

    def block_addrs(self, geo: M.KvLayout, nblocks: int) -> list[int]:
        base, bb, per_layer = self.addr + HEADER_BYTES, geo.block_bytes, self.tokens // geo.tokens_per_block
        return [base + (layer * per_layer + b) * bb for layer in range(geo.num_layers) for b in range(nblocks)]


def region_bytes(geo: M.KvLayout, tokens: int) -> int:
    return HEADER_BYTES + geo.num_layers * tokens * geo.bytes_per_token_per_layer


class RequestArena:
    """The memory buffers allocated per request come from: one anonymous mapping of ``limit`` bytes (virtual until
    touched), carved first-fit in whole pages. What is carved at once is bounded by ``limit``; a request waits for
    room, up to a deadline (``take`` returns None past it); one larger than the whole arena is the caller's to
    refuse (``fits``). A freed extent's pages go back to the system (MADV_DONTNEED) but stay mapped: a READ that
    comes after the context server freed the KV (its timeout passed, or a retried generation leg) reads zeros and
    fails the header check, where unmapped memory would crash the context server (a READ served over UCX's tcp
    transport copies from the address it is given)."""

    def __init__(self, limit: int):
        self.limit = max(0, limit) // mmap.PAGESIZE * mmap.PAGESIZE
        # private: MADV_DONTNEED drops its pages (they read as zeros); a shared mapping would keep them
        self.mem = mmap.mmap(-1, self.limit, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) if self.limit else None
        self.free: list[tuple[int, int]] = [(0, self.limit)] if self.limit else []  # (offset, size), by offset
        self.held = 0
        self._freed: asyncio.Event | None = None

    @staticmethod
    def pages(nbytes: int) -> int:
        return -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE

    def fits(self, nbytes: int) -> bool:
        return self.pages(nbytes) <= self.limit

    def _carve(self, size: int) -> int | None:
        for i, (off, room) in enumerate(self.free):
            if room >= size:
                self.free[i:i + 1] = [(off + size, room - size)] if room > size else []
                self.held += size
                return off
        return None

    async def take(self, nbytes: int, timeout_s: float) -> tuple[int, int] | None:
        """An extent of whole pages for ``nbytes``, waiting for room up to ``timeout_s``; None past it or where it
        could never fit. Carving is synchronous, so a cancelled wait never loses an extent."""
        size = self.pages(nbytes)
        if not self.fits(nbytes):
            return None
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            off = self._carve(size)
            if off is not None:
                return off, size
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if self._freed is None:
                self._freed = asyncio.Event()
            self._freed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._freed.wait(), left)

    def view(self, extent: tuple[int, int]) -> np.ndarray:
        assert self.mem is not None
        return np.frombuffer(self.mem, dtype=np.uint8, count=extent[1], offset=extent[0])

    def give(self, extent: tuple[int, int]) -> None:
        """An extent back: its pages to the system (still mapped), its room to whoever waits. Synchronous, so it
        happens even in a cancelled request's cleanup."""
        off, size = extent
        assert self.mem is not None
        self.mem.madvise(mmap.MADV_DONTNEED, off, size)
        self.held -= size
        self.free.append((off, size))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for o, n in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((o, n))
        self.free = merged
        if self._freed is not None:
            self._freed.set()


class KvPool:
    def __init__(self, settings: WorkerSettings, geo: M.KvLayout, endpoint: str, agent_name: str):
        tr = settings.transceiver
        assert tr is not None
        self.geo = geo
        self.endpoint = endpoint
        self.timeout_s = tr.kv_transfer_timeout_ms / 1000.0
        self.timeout_ms = tr.kv_transfer_timeout_ms
        self.slot_tokens = tr.max_tokens_in_buffer
        self.preallocated = tr.preallocated_buffer
        self.slot_bytes = HEADER_BYTES + geo.num_layers * self.slot_tokens * geo.bytes_per_token_per_layer
        n_send = max(1, min(settings.max_batch_size, 16))
        n_recv = max(1, min(settings.max_batch_size, 8))
        self.pool_mb = float(os.environ.get(POOL_MB_ENV, "1024"))
        limit = int(self.pool_mb * (1 << 20))
        if 2 * self.slot_bytes > limit:
            raise ConfigError(
                f"{settings.options_file}: cache_transceiver_config.max_tokens_in_buffer: one KV slot of "
                f"{self.slot_tokens} tokens x {geo.bytes_per_token} bytes/token needs {self.slot_bytes >> 20} MiB; "
                f"the stand-in's host pool is {limit >> 20} MiB ({POOL_MB_ENV}); use a smaller model "
                f"(tk/standin-tiny) or a smaller buffer")
        while (n_send + n_recv) * self.slot_bytes > limit:
            if n_send >= n_recv and n_send > 1:
                n_send -= 1
            else:
                n_recv -= 1
        self.n_send, self.n_recv = n_send, n_recv
        self.buf = np.zeros((n_send + n_recv) * self.slot_bytes, dtype=np.uint8)
        self.base = self.buf.ctypes.data
        self.agent_name = agent_name
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nixl")
        self.backend = os.environ.get("TRTLLM_NIXL_KVCACHE_BACKEND", "UCX") or "UCX"
        nixl_agent, nixl_agent_config = import_nixl()
        # No NIXL progress thread: the Python API starts it with no delay between polls, a busy loop that
        # takes most of a core per server even when idle. The stand-in drives progress itself instead: the
        # context side polls while published KV awaits its READ (_reap), the generation side while its
        # READ is in flight (_read).
        self.agent = nixl_agent(agent_name, nixl_agent_config(enable_prog_thread=False, backends=[self.backend]))
        if self.backend not in getattr(self.agent, "backends", {self.backend: None}):
            raise ConfigError(f"TRTLLM_NIXL_KVCACHE_BACKEND={self.backend}: NIXL could not create that backend "
                              f"(plugin missing or unusable on this machine)")
        self.reg = self.agent.register_memory([(self.base, self.buf.nbytes, 0, "")], "DRAM")
        self.metadata = self.agent.get_agent_metadata()
        self.free_send: asyncio.LifoQueue | None = None
        self.free_recv: asyncio.LifoQueue | None = None
        self.pending: dict[bytes, tuple[Region, float, int]] = {}  # tag -> (region, deadline, ctx_request_id)
        # Buffers allocated per request (prompts longer than a slot, where TensorRT-LLM allocates too): what the
        # slots leave of TK_STANDIN_POOL_MB, at once; freed ones wait here for the reaper to deregister them.
        self.arena = RequestArena(limit - int(self.buf.nbytes))
        self.retired: list[Region] = []
        self.orphans: list[tuple[list, tuple[int, int]]] = []  # (registrations, extent) of cancelled requests
        self.remote_agents: dict[str, bytes] = {}
        self.epoch = 0
        self.faults = faults()
        self.stats = {"kv_sent_slots": 0, "kv_slots_freed_by_notification": 0, "kv_slots_expired": 0,
                      "kv_transfers": 0, "kv_bytes_received": 0, "kv_transfer_failures": 0,
                      "kv_remote_agents_added": 0, "kv_slots_released": 0,
                      "kv_request_buffers_sent": 0, "kv_request_buffers_received": 0,
                      "kv_request_buffer_bytes_held": 0}
        self._reaper: asyncio.Task | None = None
        self._published: asyncio.Event | None = None

    # --- lifecycle ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        # Last freed, first taken: light traffic keeps reusing the slots whose pages are already resident. (The
        # buffer is allocated lazily; a slot's first use takes page faults: 20-40 ms for 4 MiB on the 2-core box,
        # which a round-robin over every slot would pay on each of its first n_send requests.)
        self.free_send = asyncio.LifoQueue()
        self.free_recv = asyncio.LifoQueue()
        for i in reversed(range(self.n_send)):
            self.free_send.put_nowait(i)
        for i in reversed(range(self.n_recv)):
            self.free_recv.put_nowait(self.n_send + i)
        self._published = asyncio.Event()
        from toolkit.standin.tasks import keep
        self._reaper = keep(self._reap, "kv-slot-reaper", component="worker")  # slots must go on being reaped

    async def close(self) -> None:
        if self._reaper:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reaper

        owned = ([r.reg for r, _, _ in self.pending.values() if r.reg is not None] + [r.reg for r in self.retired]
                 + [reg for registered, _ in self.orphans for reg in registered])

        def teardown():
            for name in list(self.remote_agents):
                with contextlib.suppress(Exception):
                    self.agent.remove_remote_agent(name)
            for reg in [*owned, self.reg]:
                with contextlib.suppress(Exception):
                    self.agent.deregister_memory(reg)
        await self._nixl(teardown)
        self.executor.shutdown(wait=False)

    def describe(self) -> dict:
        return {"agent": self.agent_name, "backend": self.backend, "send_slots": self.n_send,
                "recv_slots": self.n_recv, "slot_tokens": self.slot_tokens, "slot_bytes": self.slot_bytes,
                "pool_bytes": int(self.buf.nbytes), "kv_transfer_timeout_ms": self.timeout_ms,
                "preallocated_only": self.preallocated, "request_buffer_limit_bytes": self.arena.limit}

    async def _nixl(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    # --- slot geometry -----------------------------------------------------------------------------------

    def _slot(self, slot: int) -> Region:
        off = slot * self.slot_bytes
        return Region(self.buf[off:off + self.slot_bytes], self.slot_tokens, slot=slot)

    async def _own_buffer(self, n: int, side: str, deadline: float) -> Region:
        """A buffer for one request of n tokens longer than a slot, registered with NIXL: what TensorRT-LLM's C++
        transceiver over UCX or MPI does with such a request (CacheTransBufferManager::getOrAllocateBuffers
        allocates each target's buffer the pre-allocated one does not cover, cacheTransBuffer.cpp @
        012f8ad2031a113485f7485fd9bfb8aaacded4c5; CacheFormatter::format / unformat use them where no agent
        connection asks for "all buffer pre-allocated", cacheFormatter.cpp @ 00c77b3088c960b4f2da1c90b4559b6028d750c7),
        and the Python transceiver's whole-request slices need no transfer buffer at all (KVSlice over every block,
        tensorrt_llm/_torch/disaggregation/native/py_cache_transceiver.py @ 0223e36b52eb5f053548a8c906010019e0a84b0a;
        it never reads max_tokens_in_buffer). Bounded by the ``arena``: waits for room until ``deadline``."""
        tokens = -(-n // self.geo.tokens_per_block) * self.geo.tokens_per_block
        nbytes = region_bytes(self.geo, tokens)
        where = (f"{side} server {self.endpoint}: the prompt's KV ({n} tokens, longer than "
                 f"max_tokens_in_buffer={self.slot_tokens}) needs a transfer buffer of its own of {nbytes} bytes")
        if not self.arena.fits(nbytes):  # never, whatever else is held: an allocation failure, not "try again"
            raise TransferError(500, f"{where}, more than the {self.arena.limit} bytes the stand-in's "
                                     f"per-request buffers may hold (what the slots leave of {POOL_MB_ENV}="
                                     f"{self.pool_mb:g}); raise {POOL_MB_ENV} or max_tokens_in_buffer")
        extent = await self.arena.take(nbytes, max(0.0, deadline - time.monotonic()))
        if extent is None:
            raise TransferError(503, f"{where}; per-request buffers held {self.arena.held} of {self.arena.limit} "
                                     f"bytes for kv_transfer_timeout_ms={self.timeout_ms}")
        self.stats["kv_request_buffer_bytes_held"] = self.arena.held
        view = self.arena.view(extent)[:nbytes]
        registered: list = []  # what NIXL's thread registered, for the reaper if this request is cancelled meanwhile

        def register():
            reg = self.agent.register_memory([(view.ctypes.data, nbytes, 0, "")], "DRAM")
            registered.append(reg)
            return reg, (self.agent.get_partial_agent_metadata(reg, inc_conn_info=False) if side == "context"
                         else None)
        try:
            reg, section = await self._nixl(register)
        except asyncio.CancelledError:
            # The registration goes on on NIXL's thread; the reaper's deregistration is queued behind it there (one
            # thread), so it finds what was registered, if anything, and the extent goes back after.
            self.orphans.append((registered, extent))
            self._wake_reaper()
            raise
        except Exception as exc:  # noqa: BLE001 - NIXL raises its status names
            self._give_back(extent)
            raise TransferError(500, f"{where}; NIXL could not register it: {type(exc).__name__}: {exc}") from None
        return Region(view, tokens, reg=reg, section=section, extent=extent)

    def _wake_reaper(self) -> None:
        if self._published is not None:
            self._published.set()

    def _give_back(self, extent: tuple[int, int]) -> None:
        self.arena.give(extent)
        self.stats["kv_request_buffer_bytes_held"] = self.arena.held

    async def _deregister(self, region: Region) -> None:
        assert region.extent is not None
        try:
            await self._nixl(self.agent.deregister_memory, region.reg)
        except asyncio.CancelledError:  # it goes on on NIXL's thread: the extent goes back after it (the reaper)
            self.orphans.append(([], region.extent))
            self._wake_reaper()
            raise
        except Exception as exc:  # noqa: BLE001 - the memory is dropped either way
            log.warning("NIXL deregister_memory of a per-request KV buffer failed: %s", exc)
        self._give_back(region.extent)

    async def _deregister_orphan(self, registered: list, extent: tuple[int, int]) -> None:
        """A buffer whose request was cancelled while it was being registered: what NIXL's thread registered (read
        there, after the registration) is deregistered, then the extent goes back."""
        def undo():
            for reg in registered:
                self.agent.deregister_memory(reg)
        try:
            await self._nixl(undo)
        except Exception as exc:  # noqa: BLE001 - the memory is dropped either way
            log.warning("NIXL deregister_memory of a cancelled request's KV buffer failed: %s", exc)
        self._give_back(extent)

    def _free_sent(self, region: Region) -> None:
        """A send region is done with: its header cleared (a late READ then fails clearly), a slot back to the free
        ones, a buffer of its own to the reaper, which deregisters and frees it on NIXL's thread."""
        region.header()[:4] = 0
        if region.slot is not None:
            self.free_send.put_nowait(region.slot)
        else:
            self.retired.append(region)
            self._published.set()

    # --- context side ------------------------------------------------------------------------------------

    def check_fits(self, n: int, side: str = "context") -> None:
        """Where TensorRT-LLM's C++ transceiver talks over an agent connection (NIXL: ``preallocated``), a prompt's KV
        must fit its pre-allocated buffer (max_tokens_in_buffer tokens): TLLM_CHECK "Agent need all buffer
        pre-allocated" in CacheFormatter::format, "Agent need buffer pre-allocated" in unformat (cacheFormatter.cpp
        @ 00c77b3088c960b4f2da1c90b4559b6028d750c7), and the client gets an error; the stand-in answers the same
        way. Elsewhere TensorRT-LLM serves it, and the stand-in moves it through a buffer of its own
        (``_own_buffer``)."""
        if n <= self.slot_tokens or not self.preallocated:
            return
        what = (f"{side} server {self.endpoint}: the prompt has {n} tokens but "
                f"cache_transceiver_config.max_tokens_in_buffer is {self.slot_tokens}; its KV "
                f"({n * self.geo.bytes_per_token} bytes) does not fit the pre-allocated transfer buffer")
        fix = "raise max_tokens_in_buffer to the longest prompt (a multiple of tokens_per_block)"
        check = "Agent need all buffer pre-allocated" if side == "context" else "Agent need buffer pre-allocated"
        raise TransferError(500, f"{what}: [TensorRT-LLM][ERROR] Assertion failed: {check} (cacheFormatter.cpp: "
                                 f"the C++ transceiver over NIXL has no dynamic-buffer fallback); {fix}")

    async def publish(self, kv: np.ndarray, ctx_request_id: int) -> dict:
        """Put a prompt's KV in a send slot; returns the opaque state for the generation server."""
        n = kv.shape[1]
        self.check_fits(n)
        if n > self.slot_tokens:
            region = await self._own_buffer(n, "context", time.monotonic() + self.timeout_s)
            self.stats["kv_request_buffers_sent"] += 1
        else:
            try:
                region = self._slot(await asyncio.wait_for(self.free_send.get(), timeout=self.timeout_s))
            except asyncio.TimeoutError:
                raise TransferError(503, f"context server {self.endpoint}: all {self.n_send} KV send slots stayed "
                                         f"busy for kv_transfer_timeout_ms={self.timeout_ms}") from None
            self.stats["kv_sent_slots"] += 1
        self.epoch += 1
        data = region.data(self.geo)
        if kv.nbytes <= INLINE_BYTES:  # copied in less time than a hand-over to a thread takes
            np.copyto(data[:, :n, :], kv)
        else:
            await asyncio.to_thread(np.copyto, data[:, :n, :], kv)
        region.header()[:4] = (MAGIC, ctx_request_id, n, self.epoch)
        tag = f"tk-kv:{ctx_request_id}:{self.epoch}".encode()
        self.pending[tag] = (region, time.monotonic() + self.timeout_s, ctx_request_id)
        self._published.set()
        nblocks = -(-n // self.geo.tokens_per_block)
        state = {
            "engine": "tk-standin", "v": STATE_VERSION, "agent": self.agent_name, "agent_metadata": self.metadata,
            "endpoint": self.endpoint, "ctx_request_id": ctx_request_id, "epoch": self.epoch, "num_tokens": n,
            "tag": tag, "header": [region.addr, HEADER_BYTES],
            "blocks": [[a, self.geo.block_bytes] for a in region.block_addrs(self.geo, nblocks)],
            "geometry": self.geo.to_dict(), "max_tokens_in_buffer": self.slot_tokens,
        }
        if region.section is not None:  # a buffer registered after the agent's metadata was taken
            state["section_metadata"] = region.section
        return state

    def release(self, ctx_request_id: int) -> bool:
        """Free the send slot of ``ctx_request_id`` now (its generation leg failed; nobody will READ it). The header
        is cleared first, so a generation server still reading it fails clearly instead of reading another request's
        KV. False when no slot holds it (already fetched, expired or released)."""
        for tag, (region, _, rid) in list(self.pending.items()):
            if rid == ctx_request_id:
                del self.pending[tag]
                self._free_sent(region)
                self.stats["kv_slots_released"] += 1
                log.info("KV of ctx_request_id %d released: its generation leg failed", rid)
                return True
        return False

    async def _reap(self) -> None:
        """Free send slots on their notification, or when kv_transfer_timeout_ms passed with nobody coming."""
        while True:
            # A READ from a generation server may need this side's progress (UCX emulates small GETs over
            # active messages): poll often while published KV awaits pickup, now and then otherwise (a late
            # READ of KV that expired must still complete, and find the slot freed).
            if self.pending:
                await asyncio.sleep(PROGRESS_INTERVAL_S)
            else:
                self._published.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._published.wait(), timeout=IDLE_PROGRESS_INTERVAL_S)
            try:
                notifs = await self._nixl(self.agent.get_new_notifs)
            except Exception as exc:  # noqa: BLE001
                log.warning("NIXL get_new_notifs failed: %s", exc)
                notifs = {}
            for msgs in notifs.values():
                for msg in msgs:
                    entry = self.pending.pop(bytes(msg), None)
                    if entry:
                        self._free_sent(entry[0])
                        self.stats["kv_slots_freed_by_notification"] += 1
            now = time.monotonic()
            for tag, (region, deadline, rid) in list(self.pending.items()):
                if now > deadline:
                    del self.pending[tag]
                    self._free_sent(region)
                    self.stats["kv_slots_expired"] += 1
                    log.warning("KV of ctx_request_id %d was not fetched within kv_transfer_timeout_ms=%d; "
                                "its slot is freed", rid, self.timeout_ms)
            while self.retired:
                await self._deregister(self.retired.pop())
            while self.orphans:
                await self._deregister_orphan(*self.orphans.pop())

    # --- generation side ---------------------------------------------------------------------------------

    def check_geometry(self, state: dict) -> None:
        theirs = state.get("geometry") or {}
        mine = self.geo.to_dict()
        ctx = state.get("endpoint", "?")
        for key, what in (("tokens_per_block", "kv_cache_config.tokens_per_block"),
                          ("kv_dtype", "kv_cache_config.dtype"), ("model", "the model"),
                          ("num_layers", "the number of layers"), ("attention", "the attention type"),
                          ("bytes_per_token", "KV bytes per token")):
            if theirs.get(key) != mine[key]:
                raise TransferError(400, (
                    f"generation server {self.endpoint} refuses the KV of context server {ctx}: {what} differs "
                    f"(context {theirs.get(key)!r}, generation {mine[key]!r}); TensorRT-LLM's cache transceiver "
                    f"refuses to connect such servers; give both roles the same {what}"))

    async def _remote(self, state: dict) -> str:
        name, md = state["agent"], state["agent_metadata"]
        if self.remote_agents.get(name) == md:
            return name
        if name in self.remote_agents:
            await self._forget(name)
        loaded = await self._nixl(self.agent.add_remote_agent, md)
        loaded = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
        self.remote_agents[loaded] = md
        self.stats["kv_remote_agents_added"] += 1
        return loaded

    async def _forget(self, name: str) -> None:
        self.remote_agents.pop(name, None)
        try:
            await self._nixl(self.agent.remove_remote_agent, name)
        except Exception as exc:  # noqa: BLE001
            log.debug("NIXL remove_remote_agent(%s): %s", name, exc)

    def check_buffer(self, state: dict) -> None:
        """Both roles' transfer buffers must be equal. TensorRT-LLM's transceiver sizes its messages by the
        sender's buffer and posts receives of the receiver's; differing max_tokens_in_buffer on ctx and gen
        fail the transfer with UCX's "Message truncated" (ai-dynamo/dynamo PR #1572; the UCX path works only
        with equal sizes, NVIDIA/TensorRT-LLM PR #9782). The stand-in fails the same way, on every transfer."""
        theirs = state.get("max_tokens_in_buffer")
        if theirs is not None and theirs != self.slot_tokens:
            raise TransferError(500, (
                f"KV transfer from context server {state.get('endpoint', '?')} failed: Message truncated "
                f"(UCS_ERR_MESSAGE_TRUNCATED): the context server's cache_transceiver_config.max_tokens_in_buffer "
                f"is {theirs}, this generation server's {self.slot_tokens}; both roles need the same transfer "
                f"buffer"))

    def check_section(self, state: dict, n: int) -> None:
        """A prompt longer than a slot is in a buffer the context server registered for it, whose NIXL metadata
        (``section_metadata``: bytes, bounded) the opaque state must carry; a prompt that fits a slot carries none."""
        section = state.get("section_metadata")
        ctx = state.get("endpoint", "?")
        if n <= self.slot_tokens:
            if section is not None:
                raise TransferError(400, f"the opaque state from {ctx} carries section_metadata for a prompt of {n} "
                                         f"tokens, which fits a slot of max_tokens_in_buffer={self.slot_tokens}")
            return
        if not isinstance(section, bytes) or not 0 < len(section) <= SECTION_MAX_BYTES:
            raise TransferError(400, f"the opaque state from {ctx} lacks the NIXL metadata of the buffer its "
                                     f"{n}-token prompt's KV is in (section_metadata: bytes, 1 to "
                                     f"{SECTION_MAX_BYTES})")

    async def fetch(self, state: dict, prompt_len: int) -> bytes:
        """READ a context server's KV; returns the digest of the received bytes."""
        self.check_geometry(state)
        self.check_buffer(state)
        ctx = state.get("endpoint", "?")
        n = int(state.get("num_tokens", -1))
        if n != prompt_len:
            raise TransferError(400, f"the context server {ctx} holds KV of {n} tokens but the generation request "
                                     f"has {prompt_len} prompt tokens")
        nblocks = -(-n // self.geo.tokens_per_block)
        self.check_fits(n, side="generation")
        self.check_section(state, n)
        blocks = state.get("blocks") or []
        if len(blocks) != self.geo.num_layers * nblocks:
            raise TransferError(400, f"the opaque state from {ctx} lists {len(blocks)} blocks, expected "
                                     f"{self.geo.num_layers * nblocks}")
        deadline = time.monotonic() + self.timeout_s
        if n > self.slot_tokens:  # into a buffer registered for this request (see _own_buffer)
            region = await self._own_buffer(n, "generation", deadline)
            try:
                self.stats["kv_request_buffers_received"] += 1
                return await self._read(state, region, n, nblocks, blocks, deadline)
            finally:
                await self._deregister(region)
        try:
            slot = await asyncio.wait_for(self.free_recv.get(), timeout=self.timeout_s)
        except asyncio.TimeoutError:
            raise TransferError(503, f"generation server {self.endpoint}: no free KV receive slot within "
                                     f"kv_transfer_timeout_ms={self.timeout_ms}") from None
        try:
            return await self._read(state, self._slot(slot), n, nblocks, blocks, deadline)
        finally:
            self.free_recv.put_nowait(slot)

    def _post_read(self, local, remote, name: str, notif: bytes, deadline: float, section: bytes | None = None):
        """Runs on NIXL's thread: posts the READ and waits for it briefly. Most READs finish within a millisecond:
        waited for here, with sleeps of tens of microseconds. The event loop's timers wake on epoll's millisecond
        ticks, so polling from it made a read done in 0.2 ms take 1.2 (and each poll one more hand-over to this
        thread); on the emulated generation server that is the stand-in's own cost beside the emulated transfer.
        Past INLINE_WAIT_S the loop polls (``_until_done``), as for a long transfer. ``section``: the NIXL metadata
        of a buffer the context server registered for this request, loaded into its agent first. Returns (handle
        still to release or None, status)."""
        if section is not None:
            loaded = self.agent.add_remote_agent(section)
            loaded = loaded.decode() if isinstance(loaded, bytes) else str(loaded)
            if loaded != name:
                raise ValueError(f"the opaque state's section_metadata is agent {loaded[:64]!r}'s, not {name!r}'s")
        ld = self.agent.get_xfer_descs(local, "DRAM")
        rd = self.agent.get_xfer_descs(remote, "DRAM")
        h = self.agent.initialize_xfer("READ", ld, rd, name, notif)
        status = self.agent.transfer(h)
        end = min(deadline, time.monotonic() + INLINE_WAIT_S)
        pause = 20e-6
        while status == "PROC" and time.monotonic() < end:
            time.sleep(pause)
            pause = min(2 * pause, 200e-6)
            status = self.agent.check_xfer_state(h)
        if status == "PROC":
            return h, status
        try:  # done (or failed): released in the same hand-over
            self.agent.release_xfer_handle(h)
        except Exception as exc:  # noqa: BLE001 - said; the transfer's outcome stands
            log.debug("NIXL release_xfer_handle: %s", exc)
        return None, status

    async def _until_done(self, handle, status: str, ctx: str, name: str, deadline: float) -> str:
        """Polls a READ still in progress from the event loop, backing off up to PROGRESS_INTERVAL_S, until it is no
        longer in progress or ``deadline`` passes (then the request is cancelled with the context server named)."""
        delay = 0.0002
        while status == "PROC":
            if time.monotonic() > deadline:
                raise TransferError(500, (
                    f"KV transfer from context server {ctx} (NIXL agent {name}) did not complete within "
                    f"kv_transfer_timeout_ms={self.timeout_ms}; the request is cancelled"))
            await asyncio.sleep(delay)
            delay = min(delay * 2, PROGRESS_INTERVAL_S)
            status = await self._nixl(self.agent.check_xfer_state, handle)
        return status

    async def _read(self, state, region: Region, n, nblocks, blocks, deadline) -> bytes:
        ctx = state.get("endpoint", "?")
        name = state["agent"]
        region.header()[:4] = 0
        local = np.array([[region.addr, HEADER_BYTES, 0]]
                         + [[a, self.geo.block_bytes, 0] for a in region.block_addrs(self.geo, nblocks)],
                         dtype=np.uint64)
        remote = np.array([[state["header"][0], state["header"][1], 0]] + [[a, ln, 0] for a, ln in blocks],
                          dtype=np.uint64)
        notif = b"" if "drop_notif" in self.faults else bytes(state["tag"])
        handle = None
        what = "transfer"
        try:
            what = "connecting to its NIXL agent (is the context server still running?)"
            name = await self._remote(state)
            what = "posting the NIXL READ"
            handle, status = await self._nixl(self._post_read, local, remote, name, notif, deadline,
                                              state.get("section_metadata"))
            what = "the NIXL READ"
            status = await self._until_done(handle, status, ctx, name, deadline)
            if status != "DONE":
                raise TransferError(500, f"KV transfer from context server {ctx} (NIXL agent {name}) failed: "
                                         f"transfer state {status}")
        except TransferError:
            self.stats["kv_transfer_failures"] += 1
            await self._forget(name)
            raise
        except Exception as exc:  # noqa: BLE001 - NIXL raises its status names as exceptions
            self.stats["kv_transfer_failures"] += 1
            await self._forget(name)
            raise TransferError(500, f"KV transfer from context server {ctx} (NIXL agent {name}) failed while "
                                     f"{what}: {type(exc).__name__}: {exc}") from None
        finally:
            if handle is not None:
                try:
                    await self._nixl(self.agent.release_xfer_handle, handle)
                except Exception as exc:  # noqa: BLE001
                    log.debug("NIXL release_xfer_handle: %s", exc)
        hdr = [int(x) for x in region.header()[:4]]
        if hdr != [MAGIC, int(state["ctx_request_id"]), n, int(state["epoch"])]:
            self.stats["kv_transfer_failures"] += 1
            raise TransferError(500, (
                f"KV of ctx_request_id {state['ctx_request_id']} is gone from context server {ctx}: it freed the "
                f"slot (kv_transfer_timeout_ms passed before the generation request came)"))
        self.stats["kv_transfers"] += 1
        self.stats["kv_bytes_received"] += len(blocks) * self.geo.block_bytes
        data = region.data(self.geo)[:, :n, :]
        corrupt = "corrupt_kv" in self.faults

        def digest():
            kv = np.ascontiguousarray(data)
            if corrupt:
                kv.reshape(-1)[kv.size // 2] ^= 0xFF
            return M.kv_digest(kv)
        if data.nbytes <= INLINE_BYTES:  # hashed in less time than a hand-over to a thread takes
            return digest()
        return await asyncio.to_thread(digest)
