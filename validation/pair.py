"""One pair of agents: the context agent (ctx) and the generation agent (gen) of a round.

For every request length and direction, a WRITE (the data's source pushes) and a READ (its destination
pulls) of a KV-shaped request: warm-up and timed iterations, every byte of every transfer verified by the
destination. forward: context -> generation, the KV of the prompt; reverse: generation -> context, the
KV of the answer moving back (a pull-back). Then the tokens_per_block sweep (forward, both ops, repeated
in passes). Both agents of the pair run the same code; which part each plays follows from whether it is
the data's source, and the messages (validation.messages) keep them in step.

Timing. The destination holds up to `slots` disjoint block tables for a request. Transfers go in bursts,
one per slot: the source fills its blocks with the burst's own pattern, the initiator runs the burst's
transfers back to back (each timed from post to DONE), then the destination verifies every slot. Before
the first burst the destination poisons its whole pool; before a later one each slot holds the previous
burst's pattern, which differs from this burst's in every word, so a transfer that did not land (or only
partly) is caught without poisoning the destination again. After the first and the last burst, and after
every burst on DRAM, the destination also checks what the burst must not have touched: the blocks outside
the slots (still its own pattern) and the slots a partial last burst left idle (still the previous burst's
data). The check never runs between two transfers
of a burst, so what is timed is the link as a raw NIXL loop on the same descriptors sees it
(benchmarks/bench_validate.py measures the two side by side), and every transfer is verified on its own.

What moves is what the recipe's TensorRT-LLM transceiver moves (params["geometry"]["transfer"]; the model is
toolkit/facts/transceiver.py): the Python transceiver's descriptor lists (one per block, or per block, layer and
K/V), or, for the C++ transceiver (and the Python one's bounce buffer), a *staged* transfer: the source gathers the
request's blocks into a staging slice after its pool, one WRITE of one descriptor lands in the destination's slice
for that slot, and the destination scatters it into the slot's blocks. Gather and scatter are device copies, each
timed on its own beside the WRITE (post to DONE). Only WRITE is run unless params["ops"] asks for READ too:
TensorRT-LLM never READs. After the lengths, the descriptor-size curve: the longest request's bytes in 1 .. 2048
equal descriptors, raw NIXL WRITEs from the context side, the one-descriptor figure being what the link can do.
"""

from __future__ import annotations

import time

try:
    import numpy as np
except ImportError:  # pragma: no cover - the agent reports it as a preflight failure
    np = None

from validation import messages as msg
from validation.layout import block_table, ceil_to, key_of, side_layout
from validation.messages import PairError
from validation.pattern import Mismatch, WordLayout

OPS = (("WRITE", "W"), ("READ", "R"))
DIRECTIONS = {"forward": "F", "reverse": "B"}  # context -> generation; generation -> context
# A destination awaiting a WRITE's notification polls at this fixed pause: without a progress thread the
# WRITE completes only when the destination polls, and a pause that has grown while it waited for the
# initiator would add up to 2 ms to a timed transfer; busier polling steals CPU from the copy on a small host.
# The WRITE's initiator awaits the destination's announcement of a burst the same way: a process that slept
# through the check starts its burst on a cold core (measured: the first WRITEs of a burst ~20 % slower).
TRANSFER_POLL_S = 0.0002


def release(h) -> None:
    try:
        h.release()
    except Exception as exc:  # noqa: BLE001 - a handle that cannot be cancelled is leaked, not fatal
        print(f"releasing a transfer handle failed ({type(exc).__name__}); leaked", flush=True)


class Transfers:
    """Prepared NIXL descriptor lists of this agent's pool and its peers' pools, and single transfers."""

    def __init__(self, params: dict, agent_id: str, role: str, nixl, pool, peers: dict, transfer_timeout: float):
        self.p = params
        self.id = agent_id
        self.role = role
        self.nixl = nixl
        self.pool = pool
        self.peers = peers
        self.transfer_timeout = transfer_timeout
        self.backends = [params["backend"]]
        self.layouts: dict = {}
        self.dlists: dict = {}

    def layout(self, side: str, tpb: int) -> WordLayout:
        k = (side, tpb)
        if k not in self.layouts:
            geom = self.p["geometry"]  # the blocks: what is registered, less the staging slices after them
            pool_bytes = int((geom.get("blocks_bytes") or geom["pool_bytes"])[side])
            self.layouts[k] = WordLayout(side_layout(geom, side, tpb), pool_bytes)
        return self.layouts[k]

    def entries(self, side: str, addr: int, dev: int, key: tuple):
        """Nx3 (addr, len, dev) of a list: ("pool", tpb) every fragment of every block of a side's pool;
        ("staged", nbytes, nrecv) its send slice then nrecv receive slices of nbytes after its pool's blocks;
        ("flat", n, each) n descriptors of each bytes from the pool's start (the descriptor-size curve)."""
        if key[0] == "pool":
            return self.layout(side, key[1]).dlist(addr, dev)
        if key[0] == "staged":
            nbytes, nrecv = key[1], key[2]
            base = addr + int(self.p["geometry"]["staging"]["offset"][side])
            starts = [base + i * nbytes for i in range(1 + nrecv)]
        else:
            starts = [addr + i * key[2] for i in range(key[1])]
            nbytes = key[2]
        out = np.empty((len(starts), 3), dtype=np.uint64)
        out[:, 0] = starts
        out[:, 1] = nbytes
        out[:, 2] = dev
        return out

    def dlist(self, who: str, key):
        """Prepared descriptor list of mine (who=self.id) or a peer's pool (see entries; an int key: ("pool", it))."""
        key = ("pool", key) if isinstance(key, int) else tuple(key)
        k = (who, key)
        if k not in self.dlists:
            if who == self.id:
                arr = self.entries(self.role, self.pool.addr, self.pool.dev, key)
                self.dlists[k] = self.nixl.prep_xfer_dlist("NIXL_INIT_AGENT", arr, self.pool.mem,
                                                           backends=self.backends)
            else:
                info = self.peers[who]
                role = "gen" if self.role == "ctx" else "ctx"
                arr = self.entries(role, int(info["pool"]["addr"]), int(info["pool"]["dev"]), key)
                self.dlists[k] = self.nixl.prep_xfer_dlist(info["nixl_name"], arr, info["pool"]["mem"],
                                                           backends=self.backends)
        return self.dlists[k]

    def xfer(self, op: str, peer: str, key, lidx, ridx, notif: str) -> tuple[float, float]:
        """One request: make the transfer from prepared lists, post, poll to DONE. (prep s, post->DONE s)."""
        t_prep = time.perf_counter()
        try:
            h = self.nixl.make_prepped_xfer(op, self.dlist(self.id, key), lidx, self.dlist(peer, key), ridx,
                                            notif.encode(), backends=self.backends)
        except Exception as exc:  # noqa: BLE001
            raise PairError(f"NIXL could not create the {op} request: {type(exc).__name__}: {exc}") from None
        t0 = time.perf_counter()
        try:
            dt = self._complete(h, op, peer, notif, t0)
        except PairError:
            release(h)
            raise
        except Exception as exc:  # noqa: BLE001
            release(h)
            raise PairError(f"{op} transfer failed: {type(exc).__name__}: {exc}") from None
        release(h)
        return t0 - t_prep, dt

    def _complete(self, h, op: str, peer: str, notif: str, t0: float) -> float:
        """Post the transfer and poll it to DONE, bounded; seconds from post to DONE."""
        state = self.nixl.transfer(h, notif.encode())
        n = 0
        while state == "PROC":
            n += 1
            if not n & 1023 and time.perf_counter() - t0 > self.transfer_timeout:
                raise PairError(f"{op} transfer did not complete within {self.transfer_timeout:g}s "
                                f"(state PROC); {peer} may be hung or the network stalled")
            state = self.nixl.check_xfer_state(h)
        dt = time.perf_counter() - t0
        if state != "DONE":
            raise PairError(f"{op} transfer ended in state {state}")
        return dt


class Request:
    """One (request length, direction, op) of a pair: the blocks on both sides, the source pattern, the record.

    Data moves from `src` to `dst`: context -> generation (forward) or generation -> context (reverse).
    The destination holds up to `slots` disjoint block tables (as many as its pool fits); iteration `it`
    lands in slot `it % len(slots)`, and iterations go in bursts of one transfer per slot."""

    def __init__(self, run_id: str, r: int, ctx: str, gen: str, direction: str, code: str, li: int, tokens: int,
                 tpb: int, iterations: int, warmup: int, slots: int, wl_ctx: WordLayout, wl_gen: WordLayout,
                 staging: dict | None = None):
        forward = direction == "forward"
        self.r, self.direction, self.tokens, self.li, self.tpb = r, direction, tokens, li, tpb
        self.src, self.dst = (ctx, gen) if forward else (gen, ctx)
        self.src_side, self.dst_side = ("ctx", "gen") if forward else ("gen", "ctx")
        self.wl_src, self.wl_dst = (wl_ctx, wl_gen) if forward else (wl_gen, wl_ctx)
        self.warmup = warmup
        self.total = warmup + iterations
        self.tag = msg.tag(r, code, li)
        nb = ceil_to(tpb, tokens) // tpb
        self.seed = (run_id, ctx, gen, r, code, li)
        self.src_blocks = block_table((*self.seed, "src"), self.wl_src.nblocks, nb)
        nbytes = nb * sum(n for _, n in self.wl_src.lay["frags"])
        # staged (a staging dict: offset per side, slice_bytes, recv_slices): one descriptor per transfer, from the
        # source's send slice into the destination's slice of the slot
        self.staging = staging
        # as many slots as asked and as the pool holds, leaving a fifth of it outside every slot (untouched: checked)
        k = max(1, min(int(slots), self.total, self.wl_dst.nblocks * 4 // 5 // max(1, nb)))
        if staging:  # and as the destination's staging region holds slices of this request
            k = max(1, min(k, (1 + int(staging["recv_slices"])) * int(staging["slice_bytes"]) // nbytes - 1))
        table = block_table((*self.seed, "dst"), self.wl_dst.nblocks, nb * k)
        self.slots = [table[i * nb:(i + 1) * nb] for i in range(k)]
        self.dst_blocks = self.slots[0]
        self.n_bursts = -(-self.total // k)
        # bytes_verified: the bytes the transfers moved, each transfer's once; untouched_bytes_checked: what no
        # transfer may write (the rest of each destination block, blocks outside the slots, idle slots)
        self.nbytes = nbytes
        self.lists_key = ("staged", nbytes, k) if staging else ("pool", tpb)
        self.entry = {"tokens": tokens, "tokens_per_block": tpb, "direction": direction, "blocks": nb,
                      "bytes": nbytes, "descriptors": 1 if staging else nb * self.wl_src.nfrags,
                      "staged": bool(staging), "iterations": iterations, "warmup": warmup,
                      "slots": k, "latencies_s": [], "prep_s": [], "gather_s": [], "scatter_s": [],
                      "bytes_verified": 0, "transfers_verified": 0, "untouched_bytes_checked": 0, "error": None}

    def key_src(self, burst: int) -> int:
        """The source's pattern during one burst (each burst its own)."""
        return key_of(*self.seed, "src", burst)

    def key_stale(self) -> int:
        """The destination's own pattern, over its whole pool before the first burst."""
        return key_of(*self.seed, "stale")

    def slot_of(self, it: int) -> int:
        return it % len(self.slots)

    def burst_of(self, it: int) -> int:
        return it // len(self.slots)

    def bursts(self):
        """The iterations in bursts of one transfer per slot: lists of (iteration, slot)."""
        k = len(self.slots)
        for start in range(0, self.total, k):
            yield [(it, it - start) for it in range(start, min(self.total, start + k))]

    def local_remote(self, op: str) -> tuple[list, list]:
        """Per slot, (this side's, the peer's) descriptor indices, in the lists of lists_key, for the initiator of op."""
        if self.staging:  # entry 0: the send slice; 1 + s: the receive slice of slot s
            src_idx, dst_idx = [[0]] * len(self.slots), [[1 + s] for s in range(len(self.slots))]
            return (src_idx, dst_idx) if op == "WRITE" else (dst_idx, src_idx)
        src_idx = self.wl_src.desc_indices(self.src_blocks)
        dst_idx = [self.wl_dst.desc_indices(b) for b in self.slots]
        if op == "WRITE":
            return [src_idx] * len(dst_idx), dst_idx
        return dst_idx, [src_idx] * len(dst_idx)

    def send_offset(self) -> int:
        """Byte offset of the source's send slice in its registered buffer."""
        return int(self.staging["offset"][self.src_side])

    def recv_offset(self, s: int) -> int:
        """Byte offset of slot s's receive slice in the destination's registered buffer."""
        return int(self.staging["offset"][self.dst_side]) + (1 + s) * self.nbytes

    def timed(self, it: int, prep: float, dt: float) -> None:
        if it >= self.warmup:
            self.entry["latencies_s"].append(dt)
            self.entry["prep_s"].append(prep)

    def copied(self, it: int, what: str, dt: float) -> None:
        """A gather (source) or scatter (destination) of a staged transfer, timed apart from the WRITE."""
        if it >= self.warmup:
            self.entry[what].append(dt)


class PairRunner:
    """Runs this agent's side of its pair in each round and records it in the result document."""

    def __init__(self, agent, transfers: Transfers, channel: msg.Channel):
        self.p = agent.p
        self.id = agent.id
        self.result = agent.result
        self.pool = agent.pool
        self.faults = agent.faults
        self.gone = agent.gone
        self.log = agent.log
        self.save = agent.save
        self.transfer_timeout = agent.transfer_timeout
        self.pair_timeout = agent.pair_timeout
        self.t = transfers
        self.ch = channel
        geom = self.p["geometry"]
        self.slots = int(geom.get("burst_slots", geom.get("slots", 1)))

    # -- the pair ------------------------------------------------------------------------------------
    def directions(self) -> list:
        return list(self.p.get("directions") or ["forward"])

    def ops(self) -> list:
        """(op, letter) of the ops run: WRITE (what TensorRT-LLM issues), and READ only when asked."""
        asked = self.p.get("ops") or [op for op, _ in OPS]
        return [(op, letter) for op, letter in OPS if op in asked]

    def _records(self, r: int, ctx: str, gen: str) -> dict:
        records = {}
        for direction in self.directions():
            data_src, data_dst = (ctx, gen) if direction == "forward" else (gen, ctx)
            for op, _ in self.ops():
                initiator = data_src if op == "WRITE" else data_dst
                rec = {"src": ctx, "dst": gen, "op": op, "direction": direction, "round": r,
                       "side": "initiator" if self.id == initiator else "target",
                       "verifier": self.id == data_dst, "lengths": [], "error": None}
                records[(direction, op)] = rec
                self.result["pairs"].append(rec)
        return records

    def run_pair(self, r: int, ctx: str, gen: str, peer: str) -> None:
        records = self._records(r, ctx, gen)
        if peer in self.gone:
            for rec in records.values():
                rec["error"] = f"not run: {self.gone[peer]}"
            return
        tpb = int(self.p["geometry"]["tokens_per_block"])
        current = None
        phase = "start"
        try:
            self.ch.send(peer, msg.hello(r))
            self.ch.wait(peer, r, (msg.hello(r),), self.pair_timeout, f"{peer} to start round {r}")
            phase = "lengths"
            for li, tokens in enumerate(self.p["lengths"]):
                for direction in self.directions():
                    for op, letter in self.ops():
                        current = records[(direction, op)]
                        entry = self.run_op(r, ctx, gen, peer, direction, op, letter + DIRECTIONS[direction], li,
                                            tokens, tpb, self.p["iterations"], self.p["warmup"])
                        current["lengths"].append(entry)
                        if entry.get("error") and not current["error"]:
                            current["error"] = entry["error"]
            current = None
            phase = "sweep"
            self._sweep(r, ctx, gen, peer)
            phase = "curve"
            self._curve(r, ctx, gen, peer)
            self.ch.send(peer, msg.bye(r))
            self.ch.wait(peer, r, (msg.bye(r),), self.transfer_timeout, f"{peer} to finish round {r}")
        except PairError as exc:
            self._abandon(r, peer, records, current, phase, str(exc))

    def _sweep(self, r: int, ctx: str, gen: str, peer: str) -> None:
        """Every tokens_per_block of the sweep, forward, for each op, in passes (alternately ascending and
        descending, so a drift of the machine does not line up with the block size): the report takes each
        pass's median over the pairs, and recommends only what holds across the passes."""
        sweep = self.p.get("sweep")
        if not sweep:
            return
        tpbs = list(sweep["tokens_per_block"])
        for n in range(int(sweep.get("repeats", 1))):
            for s in (tpbs if n % 2 == 0 else tpbs[::-1]):
                for op in sweep.get("ops", ["WRITE"]):
                    entry = self.run_op(r, ctx, gen, peer, "forward", op, f"S{s}{op[0]}{n}", 0, int(sweep["tokens"]),
                                        int(s), int(sweep["iterations"]), 1, staged=False)
                    entry.update({"src": ctx, "dst": gen, "op": op, "pass": n, "tokens_per_block": int(s)})
                    self.result["sweep"].append(entry)

    def curve_bytes(self) -> int:
        """The bytes of the longest validated request, one rank pair: what every point of the curve moves."""
        geom = self.p["geometry"]
        tpb = int(geom["tokens_per_block"])
        return ceil_to(tpb, max(self.p["lengths"])) * int(geom["bytes_per_token"])

    def _curve(self, r: int, ctx: str, gen: str, peer: str) -> None:
        """The descriptor-size curve: the longest request's bytes in 1 .. 2048 equal descriptors from the start of
        the pools, raw NIXL WRITEs from the context side (warm-up, then timed), the destination verifying the
        region after each point; the destination also times one device (or host) copy of the same bytes."""
        curve = self.p.get("curve")
        if not curve:
            return
        total = self.curve_bytes()
        iters, warm = int(curve["iterations"]), int(curve.get("warmup", 1))
        for n in curve["descriptors"]:
            each = total // int(n) // 8 * 8
            if each < 8:
                continue
            nbytes = each * int(n)
            tag = msg.tag(r, f"C{n}", 0)
            key_src, key_stale = key_of(self.p["run_id"], ctx, gen, r, "curve", n), key_of(self.p["run_id"], "cs", n)
            entry = {"src": ctx, "dst": gen, "descriptors": int(n), "descriptor_bytes": each, "bytes": nbytes,
                     "latencies_s": [], "error": None}
            if self.id == ctx:
                self.ch.wait(peer, r, (msg.ready_prefix(tag),), self.transfer_timeout,
                             f"{peer} to prepare the {n}-descriptor curve point", poll_s=TRANSFER_POLL_S)
                self.pool.fill_flat(0, nbytes // 8, key_src)
                key = ("flat", int(n), each)
                idx = list(range(int(n)))
                for it in range(warm + iters):
                    _, dt = self.t.xfer("WRITE", peer, key, idx, idx, msg.written(tag, it))
                    if it >= warm:
                        entry["latencies_s"].append(dt)
                m = self.ch.wait(peer, r, (msg.end_prefix(tag),), self.transfer_timeout,
                                 f"{peer}'s check of the {n}-descriptor curve point")
                entry["error"] = msg.end_error(m, f"{peer} reported a verification failure")
            else:
                self.pool.fill_flat(0, nbytes // 8, key_stale)
                self.ch.send(peer, msg.ready(tag, 0, warm + iters))
                for it in range(warm + iters):
                    self.ch.wait(peer, r, (msg.written(tag, it),), self.transfer_timeout,
                                 f"{peer}'s WRITE of the {n}-descriptor curve point", poll_s=TRANSFER_POLL_S)
                bad = self.pool.check_flat(0, nbytes // 8, key_src)
                why = (f"data mismatch {ctx} -> {gen} in the {n}-descriptor curve point: {bad} bad 8-byte word(s) of "
                       f"{nbytes // 8}") if bad else None
                entry["error"] = why
                entry["bytes_verified"] = 0 if bad else nbytes
                if n == 1 and 2 * nbytes <= self.pool.nbytes:
                    entry["copy_s"] = sorted(self.pool.copy_seconds(0, nbytes, nbytes) for _ in range(3))[1]
                self.ch.send(peer, msg.end(tag, why))
            self.result.setdefault("curve", []).append(entry)

    def _abandon(self, r: int, peer: str, records: dict, current, phase: str, why: str) -> None:
        """The pair failed: tell the peer, and record why on every op it left unfinished."""
        if phase in ("sweep", "curve"):
            why = (f"during the tokens_per_block sweep: {why}" if phase == "sweep"
                   else f"during the descriptor-size curve: {why}")
        self.log(f"round {r} with {peer} failed: {why}")
        try:
            self.ch.send(peer, msg.abort(r, self.id, why))
        except PairError:
            pass
        for rec in records.values():
            if rec["error"]:
                continue
            if rec is current or phase != "lengths":
                rec["error"] = why
            else:
                rec["error"] = f"{'not completed' if rec['lengths'] else 'not run'}: {why}"

    # -- one request -----------------------------------------------------------------------------------
    def staged(self, li: int) -> bool:
        """Whether the transceiver stages the li-th request length (one descriptor per rank pair)."""
        flags = self.p["geometry"].get("transfer", {}).get("staged") or []
        return bool(self.p["geometry"].get("staging")) and li < len(flags) and bool(flags[li])

    def request(self, r, ctx, gen, direction, code, li, tokens, tpb, iterations, warmup, staged=None) -> Request:
        """The request run_op runs: its block tables, slots and patterns (the benchmark replays it raw)."""
        staged = self.staged(li) if staged is None else staged
        return Request(self.p["run_id"], r, ctx, gen, direction, code, li, tokens, tpb, iterations, warmup,
                       self.slots, self.t.layout("ctx", tpb), self.t.layout("gen", tpb),
                       staging=self.p["geometry"]["staging"] if staged else None)

    def run_op(self, r, ctx, gen, peer, direction, op, code, li, tokens, tpb, iterations, warmup,
               staged=None) -> dict:
        """One (request length, direction, op) of this pair: warm-up + timed iterations, every one verified."""
        req = self.request(r, ctx, gen, direction, code, li, tokens, tpb, iterations, warmup, staged)
        i_am_src = self.id == req.src
        if op == "WRITE":
            return self._push_writes(req, peer) if i_am_src else self._receive_writes(req, peer)
        return self._serve_reads(req, peer) if i_am_src else self._pull_reads(req, peer)

    def fill_source(self, req: Request, burst: int) -> None:
        self.pool.fill(req.wl_src, req.src_blocks, req.key_src(burst))

    def _push_writes(self, req: Request, peer: str) -> dict:
        """WRITE, source side: for each burst the destination announces, fill the source with the burst's
        pattern and write its transfers back to back (a staged transfer gathers the blocks into the send slice
        first, timed apart); until the destination's verdict."""
        lidx, ridx = req.local_remote("WRITE")
        while True:
            m = self.ch.wait(peer, req.r, (msg.ready_prefix(req.tag), msg.end_prefix(req.tag)), self.transfer_timeout,
                             f"{peer} to prepare its destination (WRITE, {req.tokens} tokens)", poll_s=TRANSFER_POLL_S)
            kind, arg, rest = msg.fields(m)
            if kind == "end":
                req.entry["error"] = msg.end_error(m, f"{peer} reported a verification failure")
                return req.entry
            first = int(arg)
            self.fill_source(req, req.burst_of(first))
            for it in range(first, first + int(rest or 1)):
                s = req.slot_of(it)
                if req.staging:
                    req.copied(it, "gather_s", self.pool.gather(req.wl_src, req.src_blocks, req.send_offset()))
                prep, dt = self.t.xfer("WRITE", peer, req.lists_key, lidx[s], ridx[s], msg.written(req.tag, it))
                req.timed(it, prep, dt)
                if self.faults.dies() and req.li == 0:
                    self.faults.die(self.save)

    def _scatter(self, req: Request, burst: list) -> None:
        """A staged burst's receive slices into their slots' blocks, each timed (the destination's side)."""
        if req.staging:
            for it, s in burst:
                req.copied(it, "scatter_s", self.pool.scatter(req.wl_dst, req.slots[s], req.recv_offset(s)))

    def _receive_writes(self, req: Request, peer: str) -> dict:
        """WRITE, destination side: announce each burst (the pool poisoned before the first), await its
        writes, scatter them (staged), verify each slot."""
        for b, burst in enumerate(req.bursts()):
            if b == 0:
                self.poison(req)
            self.ch.send(peer, msg.ready(req.tag, burst[0][0], len(burst)))
            for it, _ in burst:
                self.ch.wait(peer, req.r, (msg.written(req.tag, it),), self.transfer_timeout,
                             f"{peer}'s WRITE of the {req.tokens}-token request (iteration {it})",
                             poll_s=TRANSFER_POLL_S)
            self._scatter(req, burst)
            err = self._verify(req, b, burst, "WRITE")
            if err:
                return self._failed(req, peer, err)
            if self.faults.dies() and req.li == 0:
                self.faults.die(self.save)
        self.ch.send(peer, msg.end(req.tag))
        return req.entry

    def _serve_reads(self, req: Request, peer: str) -> dict:
        """READ, source side: fill the source with each announced burst's pattern (a staged one gathered into the
        send slice, timed), say so; until the puller's verdict."""
        while True:
            m = self.ch.wait(peer, req.r, (msg.ready_prefix(req.tag), msg.end_prefix(req.tag)),
                             self.transfer_timeout * (len(req.slots) + 1) + 10,
                             f"{peer} to read and check a burst of the {req.tokens}-token request")
            kind, arg, _ = msg.fields(m)
            if kind == "end":
                req.entry["error"] = msg.end_error(m, f"{peer} reported a failure")
                return req.entry
            self.fill_source(req, req.burst_of(int(arg)))
            if req.staging:
                req.copied(int(arg), "gather_s", self.pool.gather(req.wl_src, req.src_blocks, req.send_offset()))
            self.ch.send(peer, msg.source_filled(req.tag, arg))

    def _pull_reads(self, req: Request, peer: str) -> dict:
        """READ, destination side (the puller): announce each burst (the pool poisoned before the first),
        read it back to back once the source is filled, scatter (staged), verify each slot."""
        lidx, ridx = req.local_remote("READ")
        for b, burst in enumerate(req.bursts()):
            if b == 0:
                self.poison(req)
            self.ch.send(peer, msg.ready(req.tag, burst[0][0], len(burst)))
            self.ch.wait(peer, req.r, (msg.source_filled(req.tag, burst[0][0]),), self.transfer_timeout,
                         f"{peer} to fill the source of the {req.tokens}-token request", poll_s=TRANSFER_POLL_S)
            for it, s in burst:
                try:
                    prep, dt = self.t.xfer("READ", peer, req.lists_key, lidx[s], ridx[s], "")
                except PairError as exc:
                    self._failed(req, peer, str(exc))
                    raise
                req.timed(it, prep, dt)
            self._scatter(req, burst)
            err = self._verify(req, b, burst, "READ")
            if err:
                return self._failed(req, peer, err)
        self.ch.send(peer, msg.end(req.tag))
        return req.entry

    def _failed(self, req: Request, peer: str, why: str) -> dict:
        """Record why this request length and op failed, and tell the peer, which awaits the verdict."""
        req.entry["error"] = why
        self.ch.send(peer, msg.end(req.tag, why))
        return req.entry

    def poison(self, req: Request) -> None:
        """The destination's own pattern over its whole pool, before a request's first burst: every block
        outside the slots, and every byte of a slot no fragment moves to, must keep it. A staged request's receive
        slices too: a WRITE that did not land then scatters the stale pattern (caught as such), and no timed WRITE
        meets pages touched for the first time."""
        self.pool.poison(req.wl_dst, req.key_stale())
        if req.staging:
            self.pool.fill_flat(req.recv_offset(0) // 8, len(req.slots) * req.nbytes // 8, req.key_stale())

    def _inject_corruption(self, req: Request, b: int, op: str) -> None:
        """The corrupt fault: one byte of the request's first slot, after its last burst (the first burst
        when there is only one), so a later burst's check is what must catch it."""
        if b != req.n_bursts - 1 or not self.faults.armed("corrupt"):
            return
        wl_dst = req.wl_dst
        blk = req.dst_blocks[len(req.dst_blocks) // 2]
        o = (len(wl_dst.pos) // 2)
        word = blk * wl_dst.bw + int(wl_dst.pos[o])
        self.faults.corrupt(self.pool.corrupt, word * 8 + 3, blk, op)

    def _verify(self, req: Request, b: int, burst: list, op: str) -> str | None:
        """Check burst b: each of its slots against the burst's source pattern (every moved byte of every
        transfer, and the rest of each slot's blocks still the destination's own pattern); then what no transfer
        of the burst may have touched: every block outside the slots still holds the destination's own pattern,
        and a slot the burst left idle (the last burst may be partial) still holds the previous burst's data.
        That second check runs after every burst where the pool checks in place (DRAM, or on the device with
        torch or CuPy), else (a host mirror) after the first and the last. The first mismatch as a sentence, or
        None."""
        used = [s for _, s in burst]
        rest = b == 0 or b == req.n_bursts - 1 or getattr(self.pool, "checks_in_place", True)
        self._inject_corruption(req, b, op)
        before = None if b == 0 else req.key_src(b - 1)  # what the slots held: the previous burst's data
        entry = req.entry
        checking = burst[0][0]  # the iteration a mismatch is reported against
        try:
            for it, s in burst:
                checking = it
                n = self.pool.check_blocks(req.wl_dst, req.slots[s], req.wl_src, req.src_blocks, req.key_src(b),
                                           req.key_stale(), before)
                entry["bytes_verified"] += entry["bytes"]
                entry["untouched_bytes_checked"] += n - entry["bytes"]
                entry["transfers_verified"] += 1
            checking = None
            if rest:
                for s in range(len(req.slots)):
                    if s not in used:
                        entry["untouched_bytes_checked"] += self._verify_idle_slot(req, b, s)
                entry["untouched_bytes_checked"] += self.pool.check_untouched(
                    req.wl_dst, np.concatenate(req.slots), req.key_stale())
        except Mismatch as exc:
            entry["mismatch"] = exc.detail
            when = (f"iteration {checking}" if checking is not None else
                    f"after the burst of iterations {burst[0][0]}-{burst[-1][0]}")
            return _mismatch_sentence(exc.detail, req, when, op)
        return None

    def _verify_idle_slot(self, req: Request, b: int, s: int) -> int:
        """A slot burst b did not use holds burst b-1's data, verified then: it must not have changed."""
        try:
            return self.pool.check_blocks(req.wl_dst, req.slots[s], req.wl_src, req.src_blocks, req.key_src(b - 1),
                                          req.key_stale())
        except Mismatch as exc:
            exc.detail["idle_slot"] = s
            raise


def _mismatch_sentence(d: dict, req: Request, when: str, op: str) -> str:
    if d["request_block"] is None:
        where = f"pool block {d['pool_block']} (outside the request) was modified"
    elif d.get("idle_slot") is not None:
        where = (f"pool block {d['pool_block']} of slot {d['idle_slot']} (not used by this burst) changed after "
                 f"the previous burst's check, {d['where']}")
    else:
        where = (f"block {d['request_block']} of {len(req.dst_blocks)} (destination pool block "
                 f"{d['pool_block']}), {d['where']}")
    kind = (" - stale: the destination still holds what it held before the transfer (its own pattern or the "
            "previous burst's data)" if d.get("stale") and d.get("idle_slot") is None else "")
    direction = "" if req.direction == "forward" else " (reverse: generation -> context)"
    return (f"data mismatch {req.src} -> {req.dst} {op}{direction}, {req.tokens}-token request, {when}: "
            f"{where}, first bad byte at offset {d['offset']} of the block (expected word {d['expected']}, got "
            f"{d['got']}); {d['bad_words']} bad 8-byte word(s){kind}")
