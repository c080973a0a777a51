"""Spec: a request whose transfers outnumber the destination's slots runs in several bursts, and each burst
is checked as the first one is: every moved byte of every transfer once (bytes_verified = transfers x bytes),
and what no transfer of the burst may touch (blocks outside the slots, a slot the last burst left idle)
unchanged. The destination side of pair.PairRunner, driven here without NIXL: the test moves the bytes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.validation.test_payload import _transfer
from validation.faults import Faults
from validation.layout import side_layout
from validation.memory import DramPool
from validation.pair import PairRunner, Request
from validation.pattern import WordLayout, fill_blocks

TPB = 16
GEOMETRY = {
    "block": {"mode": "block", "kv_factor": 2, "layers": 3, "slot_bytes_per_token": {"ctx": 64, "gen": 64},
              "frag_bytes_per_token": 3 * 2 * 64},
    "fragment": {"mode": "fragment", "kv_factor": 2, "layers": 3, "slot_bytes_per_token": {"ctx": 128, "gen": 64},
                 "frag_bytes_per_token": 64},
}
POOL_BLOCKS = 40
SLOTS = 5  # 2 warm-up + 10 timed transfers: bursts of 5, 5 and 2
TOKENS = 6 * TPB


class FakeVramPool:
    """A VRAM pool's contract without a GPU: transfers land in `device`; the checks read the host mirror,
    which pull(blocks) refreshes (all of it for None); every pull is recorded."""

    mem = "VRAM"

    def __init__(self, nbytes: int):
        self.device = np.zeros(nbytes // 8, dtype=np.uint64)
        self.host = np.zeros_like(self.device)
        self.pulls: list = []

    def _copy(self, wl, blocks, to, frm):
        bw = wl.bw
        for b in (range(wl.nblocks) if blocks is None else blocks):
            to[int(b) * bw:(int(b) + 1) * bw] = frm[int(b) * bw:(int(b) + 1) * bw]

    def push(self, wl, blocks):
        self._copy(wl, blocks, self.device, self.host)

    def pull(self, wl, blocks):
        self.pulls.append(None if blocks is None else len(blocks))
        self._copy(wl, blocks, self.host, self.device)


class Harness:
    """The generation agent's PairRunner over a DRAM pool (or a fake VRAM one), and a context pool the test
    copies from."""

    def __init__(self, mode: str, fault=None, vram: bool = False):
        geom = {**GEOMETRY[mode], "tokens_per_block": TPB, "burst_slots": SLOTS}
        lay = {side: side_layout(geom, side, TPB) for side in ("ctx", "gen")}
        self.wl = {side: WordLayout(lay[side], POOL_BLOCKS * lay[side]["block_bytes"]) for side in lay}
        self.src = np.zeros(POOL_BLOCKS * lay["ctx"]["block_bytes"] // 8, dtype=np.uint64)
        nbytes = POOL_BLOCKS * lay["gen"]["block_bytes"]
        self.pool = FakeVramPool(nbytes) if vram else DramPool(nbytes)
        self.memory = self.pool.device if vram else self.pool.host  # where NIXL writes
        agent = SimpleNamespace(p={"geometry": geom, "run_id": "r1"}, id="gen0", result={}, pool=self.pool,
                                faults=Faults(fault, "gen0", lambda _: None), gone={}, log=lambda _: None,
                                save=lambda: None, transfer_timeout=5.0, pair_timeout=5.0)
        self.runner = PairRunner(agent, transfers=None, channel=None)
        self.req = Request("r1", 0, "ctx0", "gen0", "forward", "WF", 0, TOKENS, TPB, 10, 2, SLOTS,
                           self.wl["ctx"], self.wl["gen"])

    def run(self, meddle=None) -> list:
        """Every burst as the agents run it (the pool poisoned before the first); meddle(b) runs after burst
        b's transfers, before its check. The check's verdict per burst."""
        req = self.req
        verdicts = []
        for b, burst in enumerate(req.bursts()):
            if b == 0:
                self.runner.poison(req)
            fill_blocks(self.src, req.wl_src, req.src_blocks, req.key_src(b))
            for _, s in burst:
                _transfer(req.wl_src, req.wl_dst, self.src, self.memory, req.src_blocks, req.slots[s])
            if meddle:
                meddle(b)
            verdicts.append(self.runner._verify(req, b, burst, "WRITE"))
            if verdicts[-1]:
                break
        return verdicts

    def outside(self) -> int:
        """A pool block in no slot."""
        used = set(np.concatenate(self.req.slots).tolist())
        return next(b for b in range(POOL_BLOCKS) if b not in used)


@pytest.mark.parametrize("mode", ["block", "fragment"])
def test_every_transfer_of_every_burst_is_verified_once(mode):
    h = Harness(mode)
    assert [len(b) for b in h.req.bursts()] == [5, 5, 2] and h.req.n_bursts == 3
    assert h.run() == [None, None, None]
    e = h.req.entry
    assert e["transfers_verified"] == 12 and e["bytes_verified"] == 12 * e["bytes"]
    # besides: the rest of each slot's blocks (fragment mode), the blocks outside the slots after every burst
    # (a DRAM pool), and the 3 slots the last burst left idle
    bb = h.wl["gen"].lay["block_bytes"]
    nb = len(h.req.dst_blocks)
    outside = (POOL_BLOCKS - SLOTS * nb) * bb
    unmoved = 12 * nb * bb - 12 * e["bytes"]
    assert e["untouched_bytes_checked"] == unmoved + 3 * outside + 3 * nb * bb


@pytest.mark.parametrize("vram", [False, True])
def test_a_stray_write_outside_the_slots_in_the_last_burst_is_caught(vram):
    h = Harness("block", vram=vram)
    stray = h.outside()

    def meddle(b):
        if b == 2:
            h.memory.view(np.uint8)[stray * h.wl["gen"].lay["block_bytes"] + 40] ^= 1

    verdicts = h.run(meddle)
    assert verdicts[:2] == [None, None] and verdicts[2] is not None
    assert f"pool block {stray} (outside the request) was modified" in verdicts[2]
    assert "after the burst of iterations 10-11" in verdicts[2]


def test_a_stray_write_outside_the_slots_in_a_middle_burst_is_caught_on_dram():
    h = Harness("fragment")
    stray = h.outside()

    def meddle(b):
        if b == 1:
            h.pool.host.view(np.uint8)[stray * h.wl["gen"].lay["block_bytes"] + 8] ^= 0x10

    assert h.run(meddle)[1] is not None


def test_a_slot_the_last_burst_left_idle_must_keep_its_data():
    """The last burst uses slots 0 and 1; slot 3 still holds burst 1's data, checked after burst 1."""
    h = Harness("block")
    blk = h.req.slots[3][2]

    def meddle(b):
        if b == 2:
            h.pool.host.view(np.uint8)[blk * h.wl["gen"].lay["block_bytes"] + 16] ^= 0xFF

    verdicts = h.run(meddle)
    assert verdicts[:2] == [None, None]
    assert f"pool block {blk} of slot 3 (not used by this burst) changed after the previous burst's check" in verdicts[2]


def test_the_corrupt_fault_hits_the_last_burst():
    h = Harness("block", fault={"kind": "corrupt", "agent": "gen0"})
    verdicts = h.run()
    assert verdicts[:2] == [None, None]
    assert "iteration 10:" in verdicts[2] and f"block {len(h.req.dst_blocks) // 2} of" in verdicts[2]
    assert h.req.entry["transfers_verified"] == 10  # the first two bursts passed


def test_a_vram_pool_is_pulled_whole_after_the_first_and_the_last_burst_only():
    """Bounded: the bursts between copy only their own slots to the host; so a stray write outside the slots
    in a middle burst is caught by the last burst's check, not by its own."""
    h = Harness("block", vram=True)
    stray = h.outside()

    def meddle(b):
        if b == 1:
            h.memory.view(np.uint8)[stray * h.wl["gen"].lay["block_bytes"]] ^= 4

    verdicts = h.run(meddle)
    assert h.pool.pulls == [None, SLOTS * len(h.req.dst_blocks), None]
    assert verdicts[:2] == [None, None] and f"pool block {stray} (outside the request)" in verdicts[2]
