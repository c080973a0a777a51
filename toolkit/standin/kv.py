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
geometry (model, attention, layers, tokens_per_block, kv dtype, bytes per token). A request longer than
``max_tokens_in_buffer`` fails as TensorRT-LLM's C++ transceiver over NIXL fails it ("Agent need all buffer
pre-allocated", HTTP 500), and is refused with a clear error otherwise (``check_fits``). A background task frees a
send slot when the generation server's NIXL notification for it arrives, or after ``kv_transfer_timeout_ms`` if
nobody came (logged, counted as expired).

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
import os
import time
from concurrent.futures import ThreadPoolExecutor

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
        self.blocks_per_slot = self.slot_tokens // geo.tokens_per_block
        self.slot_bytes = HEADER_BYTES + geo.num_layers * self.slot_tokens * geo.bytes_per_token_per_layer
        n_send = max(1, min(settings.max_batch_size, 16))
        n_recv = max(1, min(settings.max_batch_size, 8))
        limit = int(float(os.environ.get(POOL_MB_ENV, "1024")) * (1 << 20))
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
        self.pending: dict[bytes, tuple[int, float, int]] = {}  # tag -> (slot, deadline, ctx_request_id)
        self.remote_agents: dict[str, bytes] = {}
        self.epoch = 0
        self.faults = faults()
        self.stats = {"kv_sent_slots": 0, "kv_slots_freed_by_notification": 0, "kv_slots_expired": 0,
                      "kv_transfers": 0, "kv_bytes_received": 0, "kv_transfer_failures": 0,
                      "kv_remote_agents_added": 0, "kv_slots_released": 0}
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

        def teardown():
            for name in list(self.remote_agents):
                with contextlib.suppress(Exception):
                    self.agent.remove_remote_agent(name)
            with contextlib.suppress(Exception):
                self.agent.deregister_memory(self.reg)
        await self._nixl(teardown)
        self.executor.shutdown(wait=False)

    def describe(self) -> dict:
        return {"agent": self.agent_name, "backend": self.backend, "send_slots": self.n_send,
                "recv_slots": self.n_recv, "slot_tokens": self.slot_tokens, "slot_bytes": self.slot_bytes,
                "pool_bytes": int(self.buf.nbytes), "kv_transfer_timeout_ms": self.timeout_ms}

    async def _nixl(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    # --- slot geometry -----------------------------------------------------------------------------------

    def _slot_offset(self, slot: int) -> int:
        return slot * self.slot_bytes

    def _slot_data(self, slot: int) -> np.ndarray:
        off = self._slot_offset(slot) + HEADER_BYTES
        size = self.slot_bytes - HEADER_BYTES
        return self.buf[off:off + size].reshape(self.geo.num_layers, self.slot_tokens,
                                                self.geo.bytes_per_token_per_layer)

    def _header(self, slot: int) -> np.ndarray:
        off = self._slot_offset(slot)
        return self.buf[off:off + HEADER_BYTES].view(np.uint64)

    def _block_addrs(self, slot: int, nblocks: int) -> list[int]:
        base = self.base + self._slot_offset(slot) + HEADER_BYTES
        bb = self.geo.block_bytes
        return [base + (layer * self.blocks_per_slot + b) * bb
                for layer in range(self.geo.num_layers) for b in range(nblocks)]

    # --- context side ------------------------------------------------------------------------------------

    def check_fits(self, n: int, side: str = "context") -> None:
        """A prompt's KV must fit one transfer slot (max_tokens_in_buffer tokens). TensorRT-LLM's C++ transceiver over
        NIXL fails such a request: its agent connection takes no dynamic buffer (TLLM_CHECK "Agent need all buffer
        pre-allocated" in CacheFormatter::format, "Agent need buffer pre-allocated" in unformat), and the client
        gets an error; the stand-in answers the same way. Elsewhere TensorRT-LLM would move it through buffers
        allocated for the request, which the stand-in's fixed slots cannot: it refuses it, saying so."""
        if n <= self.slot_tokens:
            return
        what = (f"{side} server {self.endpoint}: the prompt has {n} tokens but "
                f"cache_transceiver_config.max_tokens_in_buffer is {self.slot_tokens}; its KV "
                f"({n * self.geo.bytes_per_token} bytes) does not fit the pre-allocated transfer buffer")
        fix = "raise max_tokens_in_buffer to the longest prompt (a multiple of tokens_per_block)"
        if self.preallocated:
            check = "Agent need all buffer pre-allocated" if side == "context" else "Agent need buffer pre-allocated"
            raise TransferError(500, f"{what}: [TensorRT-LLM][ERROR] Assertion failed: {check} (cacheFormatter.cpp: "
                                     f"the C++ transceiver over NIXL has no dynamic-buffer fallback); {fix}")
        raise TransferError(400, f"{what}, and the stand-in has no buffers allocated per request (TensorRT-LLM's "
                                 f"transceiver would move it through one); {fix}")

    async def publish(self, kv: np.ndarray, ctx_request_id: int) -> dict:
        """Put a prompt's KV in a send slot; returns the opaque state for the generation server."""
        n = kv.shape[1]
        self.check_fits(n)
        try:
            slot = await asyncio.wait_for(self.free_send.get(), timeout=self.timeout_s)
        except asyncio.TimeoutError:
            raise TransferError(503, f"context server {self.endpoint}: all {self.n_send} KV send slots stayed busy "
                                     f"for kv_transfer_timeout_ms={self.timeout_ms}") from None
        self.epoch += 1
        data = self._slot_data(slot)
        if kv.nbytes <= INLINE_BYTES:  # copied in less time than a hand-over to a thread takes
            np.copyto(data[:, :n, :], kv)
        else:
            await asyncio.to_thread(np.copyto, data[:, :n, :], kv)
        self._header(slot)[:4] = (MAGIC, ctx_request_id, n, self.epoch)
        tag = f"tk-kv:{ctx_request_id}:{self.epoch}".encode()
        self.pending[tag] = (slot, time.monotonic() + self.timeout_s, ctx_request_id)
        self._published.set()
        self.stats["kv_sent_slots"] += 1
        nblocks = -(-n // self.geo.tokens_per_block)
        header_addr = self.base + self._slot_offset(slot)
        return {
            "engine": "tk-standin", "v": STATE_VERSION, "agent": self.agent_name, "agent_metadata": self.metadata,
            "endpoint": self.endpoint, "ctx_request_id": ctx_request_id, "epoch": self.epoch, "num_tokens": n,
            "tag": tag, "header": [header_addr, HEADER_BYTES],
            "blocks": [[a, self.geo.block_bytes] for a in self._block_addrs(slot, nblocks)],
            "geometry": self.geo.to_dict(), "max_tokens_in_buffer": self.slot_tokens,
        }

    def release(self, ctx_request_id: int) -> bool:
        """Free the send slot of ``ctx_request_id`` now (its generation leg failed; nobody will READ it). The header
        is cleared first, so a generation server still reading it fails clearly instead of reading another request's
        KV. False when no slot holds it (already fetched, expired or released)."""
        for tag, (slot, _, rid) in list(self.pending.items()):
            if rid == ctx_request_id:
                del self.pending[tag]
                self._header(slot)[:4] = 0
                self.free_send.put_nowait(slot)
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
                        self.free_send.put_nowait(entry[0])
                        self.stats["kv_slots_freed_by_notification"] += 1
            now = time.monotonic()
            for tag, (slot, deadline, rid) in list(self.pending.items()):
                if now > deadline:
                    del self.pending[tag]
                    self._header(slot)[:4] = 0
                    self.free_send.put_nowait(slot)
                    self.stats["kv_slots_expired"] += 1
                    log.warning("KV of ctx_request_id %d was not fetched within kv_transfer_timeout_ms=%d; "
                                "its slot is freed", rid, self.timeout_ms)

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
        blocks = state.get("blocks") or []
        if len(blocks) != self.geo.num_layers * nblocks:
            raise TransferError(400, f"the opaque state from {ctx} lists {len(blocks)} blocks, expected "
                                     f"{self.geo.num_layers * nblocks}")
        deadline = time.monotonic() + self.timeout_s
        try:
            slot = await asyncio.wait_for(self.free_recv.get(), timeout=self.timeout_s)
        except asyncio.TimeoutError:
            raise TransferError(503, f"generation server {self.endpoint}: no free KV receive slot within "
                                     f"kv_transfer_timeout_ms={self.timeout_ms}") from None
        try:
            return await self._read(state, slot, n, nblocks, blocks, deadline)
        finally:
            self.free_recv.put_nowait(slot)

    def _post_read(self, local, remote, name: str, notif: bytes, deadline: float):
        """Runs on NIXL's thread: posts the READ and waits for it briefly. Most READs finish within a millisecond:
        waited for here, with sleeps of tens of microseconds. The event loop's timers wake on epoll's millisecond
        ticks, so polling from it made a read done in 0.2 ms take 1.2 (and each poll one more hand-over to this
        thread); on the emulated generation server that is the stand-in's own cost beside the emulated transfer.
        Past INLINE_WAIT_S the loop polls (``_until_done``), as for a long transfer. Returns (handle still to
        release or None, status)."""
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

    async def _read(self, state, slot, n, nblocks, blocks, deadline) -> bytes:
        ctx = state.get("endpoint", "?")
        name = state["agent"]
        self._header(slot)[:4] = 0
        local = np.array([[self.base + self._slot_offset(slot), HEADER_BYTES, 0]]
                         + [[a, self.geo.block_bytes, 0] for a in self._block_addrs(slot, nblocks)], dtype=np.uint64)
        remote = np.array([[state["header"][0], state["header"][1], 0]] + [[a, ln, 0] for a, ln in blocks],
                          dtype=np.uint64)
        notif = b"" if "drop_notif" in self.faults else bytes(state["tag"])
        handle = None
        what = "transfer"
        try:
            what = "connecting to its NIXL agent (is the context server still running?)"
            name = await self._remote(state)
            what = "posting the NIXL READ"
            handle, status = await self._nixl(self._post_read, local, remote, name, notif, deadline)
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
        hdr = [int(x) for x in self._header(slot)[:4]]
        if hdr != [MAGIC, int(state["ctx_request_id"]), n, int(state["epoch"])]:
            self.stats["kv_transfer_failures"] += 1
            raise TransferError(500, (
                f"KV of ctx_request_id {state['ctx_request_id']} is gone from context server {ctx}: it freed the "
                f"slot (kv_transfer_timeout_ms passed before the generation request came)"))
        self.stats["kv_transfers"] += 1
        self.stats["kv_bytes_received"] += len(blocks) * self.geo.block_bytes
        data = self._slot_data(slot)[:, :n, :]
        corrupt = "corrupt_kv" in self.faults

        def digest():
            kv = np.ascontiguousarray(data)
            if corrupt:
                kv.reshape(-1)[kv.size // 2] ^= 0xFF
            return M.kv_digest(kv)
        if data.nbytes <= INLINE_BYTES:  # hashed in less time than a hand-over to a thread takes
            return digest()
        return await asyncio.to_thread(digest)
