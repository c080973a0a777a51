"""Spec: a request whose transfers outnumber the destination's slots runs in several bursts, and each burst
is checked as the first one is: every moved byte of every transfer once (bytes_verified = transfers x bytes),
and what no transfer of the burst may touch (blocks outside the slots, a slot the last burst left idle)
unchanged. The destination side of pair.PairRunner, driven here without NIXL: the test moves the bytes.

The same holds for a staged transfer (the C++ transceiver's: the source gathers the request into a staging slice,
one descriptor lands in the destination's slice of the slot, which scatters it into the slot's blocks), and where
the pool lives on a device: there the checks run on the device (here torch's CPU tensors stand in for it), and
only a slot that fails is copied to the host."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.validation.test_payload import _transfer
from validation.faults import Faults
from validation.layout import side_layout
from validation.memory import DevicePool, DramPool
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


def device_pool(nbytes: int):
    pytest.importorskip("torch")
    return DevicePool.torch_host(nbytes)


class Harness:
    """The generation agent's PairRunner over a DRAM pool (or a device one, torch on the CPU), and a context pool
    the test copies from (staged: through the staging slices, as NIXL's one descriptor would)."""

    def __init__(self, mode: str, fault=None, device: bool = False, staged: bool = False):
        geom = {**GEOMETRY[mode], "tokens_per_block": TPB, "burst_slots": SLOTS}
        lay = {side: side_layout(geom, side, TPB) for side in ("ctx", "gen")}
        blocks = {side: POOL_BLOCKS * lay[side]["block_bytes"] for side in lay}
        self.wl = {side: WordLayout(lay[side], blocks[side]) for side in lay}
        nbytes = TOKENS // TPB * sum(n for _, n in lay["ctx"]["frags"])  # one request of one rank pair
        staging = {"offset": blocks, "slice_bytes": nbytes, "recv_slices": SLOTS} if staged else None
        extra = (1 + SLOTS) * nbytes if staged else 0
        geom["staging"] = staging
        self.src = DramPool(blocks["ctx"] + extra)
        self.pool = device_pool(blocks["gen"] + extra) if device else DramPool(blocks["gen"] + extra)
        self.memory = self.pool.u8.numpy().view(np.uint64) if device else self.pool.host  # where NIXL writes
        agent = SimpleNamespace(p={"geometry": geom, "run_id": "r1"}, id="gen0", result={}, pool=self.pool,
                                faults=Faults(fault, "gen0", lambda _: None), gone={}, log=lambda _: None,
                                save=lambda: None, transfer_timeout=5.0, pair_timeout=5.0)
        self.runner = PairRunner(agent, transfers=None, channel=None)
        self.req = Request("r1", 0, "ctx0", "gen0", "forward", "WF", 0, TOKENS, TPB, 10, 2, SLOTS,
                           self.wl["ctx"], self.wl["gen"], staging=staging)

    def move(self, s: int) -> None:
        """One transfer into slot s: NIXL's part (staged: the send slice into slot s's receive slice)."""
        req = self.req
        if not req.staging:
            _transfer(req.wl_src, req.wl_dst, self.src.host, self.memory, req.src_blocks, req.slots[s])
            return
        self.src.gather(req.wl_src, req.src_blocks, req.send_offset())
        a, b, n = req.send_offset() // 8, req.recv_offset(s) // 8, req.nbytes // 8
        self.memory[b:b + n] = self.src.host[a:a + n]

    def run(self, meddle=None) -> list:
        """Every burst as the agents run it (the pool poisoned before the first); meddle(b) runs after burst
        b's transfers, before its check. The check's verdict per burst."""
        req = self.req
        verdicts = []
        for b, burst in enumerate(req.bursts()):
            if b == 0:
                self.runner.poison(req)
            fill_blocks(self.src.host, req.wl_src, req.src_blocks, req.key_src(b))
            for _, s in burst:
                self.move(s)
            self.runner._scatter(req, burst)
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


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("mode", ["block", "fragment"])
def test_every_transfer_of_every_burst_is_verified_once(mode, staged):
    h = Harness(mode, staged=staged)
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


def test_a_staged_transfer_is_one_descriptor_from_the_send_slice_into_the_slot_s_slice():
    h = Harness("fragment", staged=True)
    req = h.req
    assert req.entry["descriptors"] == 1 and req.lists_key == ("staged", req.nbytes, SLOTS)
    assert req.local_remote("WRITE") == ([[0]] * SLOTS, [[1 + s] for s in range(SLOTS)])
    assert req.local_remote("READ") == ([[1 + s] for s in range(SLOTS)], [[0]] * SLOTS)
    h.run()
    assert len(req.entry["scatter_s"]) == 10  # every timed transfer's scatter, timed apart from the WRITE


@pytest.mark.parametrize("device", [False, True])
def test_a_stray_write_outside_the_slots_in_the_last_burst_is_caught(device):
    h = Harness("block", device=device)
    stray = h.outside()

    def meddle(b):
        if b == 2:
            h.memory.view(np.uint8)[stray * h.wl["gen"].lay["block_bytes"] + 40] ^= 1

    verdicts = h.run(meddle)
    assert verdicts[:2] == [None, None] and verdicts[2] is not None
    assert f"pool block {stray} (outside the request) was modified" in verdicts[2]
    assert "after the burst of iterations 10-11" in verdicts[2]


@pytest.mark.parametrize("device", [False, True])
def test_a_stray_write_outside_the_slots_in_a_middle_burst_is_caught_at_once(device):
    h = Harness("fragment", device=device, staged=True)
    stray = h.outside()

    def meddle(b):
        if b == 1:
            h.memory.view(np.uint8)[stray * h.wl["gen"].lay["block_bytes"] + 8] ^= 0x10

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


@pytest.mark.parametrize("device", [False, True])
def test_the_corrupt_fault_hits_the_last_burst(device):
    h = Harness("block", fault={"kind": "corrupt", "agent": "gen0"}, device=device)
    verdicts = h.run()
    assert verdicts[:2] == [None, None]
    assert "iteration 10:" in verdicts[2] and f"block {len(h.req.dst_blocks) // 2} of" in verdicts[2]
    assert h.req.entry["transfers_verified"] == 10  # the first two bursts passed


def test_a_device_pool_is_checked_on_the_device_and_never_copied_whole():
    """Every burst's slots and untouched blocks are compared where they live; only a slot with a mismatch is copied
    to the host, to name the block and the byte."""
    h = Harness("fragment", device=True, staged=True)
    assert h.run() == [None, None, None] and h.pool.pulled_bytes == 0
    h = Harness("fragment", device=True, staged=True)
    blk = h.req.slots[1][0]

    def meddle(b):
        if b == 1:
            h.memory.view(np.uint8)[blk * h.wl["gen"].lay["block_bytes"] + int(h.wl["gen"].pos[0]) * 8] ^= 2

    verdicts = h.run(meddle)
    assert verdicts[0] is None and "iteration 6:" in verdicts[1] and f"destination pool block {blk}" in verdicts[1]
    assert h.pool.pulled_bytes == len(h.req.dst_blocks) * h.wl["gen"].lay["block_bytes"]  # that slot only
