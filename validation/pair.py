"""One pair of agents: the context agent (src) and the generation agent (dst) of a round.

For every request length, a WRITE (the context side pushes) and a READ (the generation side pulls) of a
KV-shaped request: warm-up and timed iterations, every byte of every transfer verified by dst; then the
tokens_per_block sweep (WRITE only). Both agents of the pair run the same code; which part each plays
follows from whether it is src, and the messages (validation.messages) keep them in step.
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
from validation.pattern import Mismatch, WordLayout, fill_blocks, verify_blocks, verify_untouched

OPS = (("WRITE", "W"), ("READ", "R"))


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
            pool_bytes = int(self.p["geometry"]["pool_bytes"][side])
            self.layouts[k] = WordLayout(side_layout(self.p["geometry"], side, tpb), pool_bytes)
        return self.layouts[k]

    def dlist(self, who: str, tpb: int):
        """Prepared descriptor list of every fragment of a pool: mine (who=self.id) or a peer's."""
        k = (who, tpb)
        if k not in self.dlists:
            if who == self.id:
                wl = self.layout(self.role, tpb)
                arr = wl.dlist(self.pool.addr, self.pool.dev)
                self.dlists[k] = self.nixl.prep_xfer_dlist("NIXL_INIT_AGENT", arr, self.pool.mem,
                                                           backends=self.backends)
            else:
                info = self.peers[who]
                role = "gen" if self.role == "ctx" else "ctx"
                wl = self.layout(role, tpb)
                arr = wl.dlist(int(info["pool"]["addr"]), int(info["pool"]["dev"]))
                self.dlists[k] = self.nixl.prep_xfer_dlist(info["nixl_name"], arr, info["pool"]["mem"],
                                                           backends=self.backends)
        return self.dlists[k]

    def xfer(self, op: str, peer: str, tpb: int, lidx, ridx, notif: str) -> tuple[float, float]:
        """One request: make the transfer from prepared lists, post, poll to DONE. (prep s, post->DONE s)."""
        t_prep = time.perf_counter()
        try:
            h = self.nixl.make_prepped_xfer(op, self.dlist(self.id, tpb), lidx, self.dlist(peer, tpb), ridx,
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
    """One (request length, op) of a pair: the blocks on both sides, the source pattern, the record."""

    def __init__(self, run_id: str, r: int, src: str, dst: str, code: str, li: int, tokens: int, tpb: int,
                 iterations: int, warmup: int, wl_src: WordLayout, wl_dst: WordLayout):
        self.r, self.src, self.dst, self.tokens, self.li, self.tpb = r, src, dst, tokens, li, tpb
        self.wl_src, self.wl_dst = wl_src, wl_dst
        self.warmup = warmup
        self.total = warmup + iterations
        self.tag = msg.tag(r, code, li)
        nb = ceil_to(tpb, tokens) // tpb
        self.seed = (run_id, src, dst, r, code, li)
        self.src_blocks = block_table((*self.seed, "src"), wl_src.nblocks, nb)
        self.dst_blocks = block_table((*self.seed, "dst"), wl_dst.nblocks, nb)
        self.key_src = key_of(*self.seed, "src")
        self.entry = {"tokens": tokens, "tokens_per_block": tpb, "blocks": nb,
                      "bytes": nb * sum(n for _, n in wl_src.lay["frags"]),
                      "descriptors": nb * wl_src.nfrags, "iterations": iterations, "warmup": warmup,
                      "latencies_s": [], "prep_s": [], "bytes_verified": 0, "transfers_verified": 0,
                      "error": None}

    def key_stale(self, it: int) -> int:
        """The destination's own pattern before iteration it."""
        return key_of(*self.seed, "stale", it)

    def timed(self, it: int, prep: float, dt: float) -> None:
        if it >= self.warmup:
            self.entry["latencies_s"].append(dt)
            self.entry["prep_s"].append(prep)


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

    # -- the pair ------------------------------------------------------------------------------------
    def _records(self, r: int, src: str, dst: str) -> dict:
        records = {}
        for op, _ in OPS:
            rec = {"src": src, "dst": dst, "op": op, "round": r,
                   "side": ("initiator" if (op == "WRITE") == (self.id == src) else "target"),
                   "verifier": self.id == dst, "lengths": [], "error": None}
            records[op] = rec
            self.result["pairs"].append(rec)
        return records

    def run_pair(self, r: int, src: str, dst: str, peer: str) -> None:
        records = self._records(r, src, dst)
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
                for op, code in OPS:
                    current = records[op]
                    entry = self.run_op(r, src, dst, peer, op, code, li, tokens, tpb,
                                        self.p["iterations"], self.p["warmup"])
                    current["lengths"].append(entry)
                    if entry.get("error") and not current["error"]:
                        current["error"] = entry["error"]
            current = None
            phase = "sweep"
            self._sweep(r, src, dst, peer)
            self.ch.send(peer, msg.bye(r))
            self.ch.wait(peer, r, (msg.bye(r),), self.transfer_timeout, f"{peer} to finish round {r}")
        except PairError as exc:
            self._abandon(r, peer, records, current, phase, str(exc))

    def _sweep(self, r: int, src: str, dst: str, peer: str) -> None:
        sweep = self.p.get("sweep")
        if not sweep:
            return
        for s in sweep["tokens_per_block"]:
            entry = self.run_op(r, src, dst, peer, "WRITE", f"S{s}", 0, int(sweep["tokens"]), int(s),
                                int(sweep["iterations"]), 1)
            entry.update({"src": src, "dst": dst, "tokens_per_block": int(s)})
            self.result["sweep"].append(entry)

    def _abandon(self, r: int, peer: str, records: dict, current, phase: str, why: str) -> None:
        """The pair failed: tell the peer, and record why on every op it left unfinished."""
        if phase == "sweep":
            why = f"during the tokens_per_block sweep: {why}"
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
    def run_op(self, r, src, dst, peer, op, code, li, tokens, tpb, iterations, warmup) -> dict:
        """One (request length, op) between this pair: warm-up + timed iterations, every one verified."""
        req = Request(self.p["run_id"], r, src, dst, code, li, tokens, tpb, iterations, warmup,
                      self.t.layout("ctx", tpb), self.t.layout("gen", tpb))
        i_am_src = self.id == src
        if op == "WRITE":
            return self._push_writes(req, peer) if i_am_src else self._receive_writes(req, peer)
        return self._serve_reads(req, peer) if i_am_src else self._pull_reads(req, peer)

    def _fill_source(self, req: Request) -> None:
        fill_blocks(self.pool.host, req.wl_src, req.src_blocks, req.key_src)
        self.pool.push(req.wl_src, req.src_blocks)

    def _push_writes(self, req: Request, peer: str) -> dict:
        """WRITE, source side: write each iteration the destination announces, until its verdict."""
        self._fill_source(req)
        lidx, ridx = req.wl_src.desc_indices(req.src_blocks), req.wl_dst.desc_indices(req.dst_blocks)
        while True:
            m = self.ch.wait(peer, req.r, (msg.ready_prefix(req.tag), msg.end_prefix(req.tag)), self.transfer_timeout,
                             f"{peer} to prepare its destination (WRITE, {req.tokens} tokens)")
            kind, arg, _ = msg.fields(m)
            if kind == "end":
                req.entry["error"] = msg.end_error(m, f"{peer} reported a verification failure")
                return req.entry
            it = int(arg)
            prep, dt = self.t.xfer("WRITE", peer, req.tpb, lidx, ridx, msg.written(req.tag, it))
            req.timed(it, prep, dt)
            if self.faults.dies() and req.li == 0:
                self.faults.die(self.save)

    def _receive_writes(self, req: Request, peer: str) -> dict:
        """WRITE, destination side: prepare, announce, await the write, verify; iteration by iteration."""
        for it in range(req.total):
            key_stale = req.key_stale(it)
            self._stale(req.wl_dst, req.dst_blocks, key_stale, whole=(it == 0))
            self.ch.send(peer, msg.ready(req.tag, it))
            self.ch.wait(peer, req.r, (msg.written(req.tag, it),), self.transfer_timeout,
                         f"{peer}'s WRITE of the {req.tokens}-token request (iteration {it})")
            err = self._verify(req, key_stale, it, "WRITE")
            if err:
                return self._failed(req, peer, err)
            if self.faults.dies() and req.li == 0 and it == 0:
                self.faults.die(self.save)
        self.ch.send(peer, msg.end(req.tag))
        return req.entry

    def _serve_reads(self, req: Request, peer: str) -> dict:
        """READ, source side: fill the source, say so, and await the puller's verdict."""
        self._fill_source(req)
        self.ch.send(peer, msg.source_filled(req.tag))
        m = self.ch.wait(peer, req.r, (msg.end_prefix(req.tag),), self.transfer_timeout * (req.total + 1) + 10,
                         f"{peer} to finish its READs of the {req.tokens}-token request")
        req.entry["error"] = msg.end_error(m, f"{peer} reported a failure")
        return req.entry

    def _pull_reads(self, req: Request, peer: str) -> dict:
        """READ, destination side (the generation agent pulls): prepare, read, verify; iteration by iteration."""
        self.ch.wait(peer, req.r, (msg.source_filled(req.tag),), self.transfer_timeout,
                     f"{peer} to fill the source of the {req.tokens}-token request")
        lidx, ridx = req.wl_dst.desc_indices(req.dst_blocks), req.wl_src.desc_indices(req.src_blocks)
        for it in range(req.total):
            key_stale = req.key_stale(it)
            self._stale(req.wl_dst, req.dst_blocks, key_stale, whole=(it == 0))
            try:
                prep, dt = self.t.xfer("READ", peer, req.tpb, lidx, ridx, "")
            except PairError as exc:
                self._failed(req, peer, str(exc))
                raise
            req.timed(it, prep, dt)
            err = self._verify(req, key_stale, it, "READ")
            if err:
                return self._failed(req, peer, err)
        self.ch.send(peer, msg.end(req.tag))
        return req.entry

    def _failed(self, req: Request, peer: str, why: str) -> dict:
        """Record why this request length and op failed, and tell the peer, which awaits the verdict."""
        req.entry["error"] = why
        self.ch.send(peer, msg.end(req.tag, why))
        return req.entry

    def _stale(self, wl, blocks, key, whole: bool) -> None:
        """The destination's own pattern: the whole pool before a request's first transfer, else its blocks."""
        fill_blocks(self.pool.host, wl, np.arange(wl.nblocks) if whole else blocks, key)
        self.pool.push(wl, None if whole else blocks)

    def _inject_corruption(self, req: Request, op: str) -> None:
        if not self.faults.armed("corrupt"):
            return
        wl_dst = req.wl_dst
        b = req.dst_blocks[len(req.dst_blocks) // 2]
        o = (len(wl_dst.pos) // 2)
        word = b * wl_dst.bw + int(wl_dst.pos[o])
        self.faults.corrupt(self.pool.host.view(np.uint8), word * 8 + 3, b, op)

    def _verify(self, req: Request, key_stale: int, it: int, op: str) -> str | None:
        """Pull the destination blocks (the whole pool on the first iteration) and check them; the
        mismatch as a sentence, or None."""
        self.pool.pull(req.wl_dst, None if it == 0 else req.dst_blocks)
        self._inject_corruption(req, op)
        try:
            n = verify_blocks(self.pool.host, req.wl_dst, req.dst_blocks, req.wl_src, req.src_blocks,
                              req.key_src, key_stale)
            if it == 0:
                n += verify_untouched(self.pool.host, req.wl_dst, req.dst_blocks, key_stale)
        except Mismatch as exc:
            req.entry["mismatch"] = exc.detail
            return _mismatch_sentence(exc.detail, req, it, op)
        req.entry["bytes_verified"] += n
        req.entry["transfers_verified"] += 1
        return None


def _mismatch_sentence(d: dict, req: Request, it: int, op: str) -> str:
    if d["request_block"] is None:
        where = f"pool block {d['pool_block']} (outside the request) was modified"
    else:
        where = (f"block {d['request_block']} of {len(req.dst_blocks)} (destination pool block "
                 f"{d['pool_block']}), {d['where']}")
    kind = " - stale: the destination still holds its pre-transfer pattern" if d.get("stale") else ""
    return (f"data mismatch {req.src} -> {req.dst} {op}, {req.tokens}-token request, iteration {it}: {where}, "
            f"first bad byte at offset {d['offset']} of the block (expected word {d['expected']}, got "
            f"{d['got']}); {d['bad_words']} bad 8-byte word(s){kind}")
