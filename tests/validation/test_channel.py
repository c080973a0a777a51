"""Spec: a wait for a peer's message ends within the peer's timeout and this agent's own deadline. A peer
silent for its whole timeout is declared unresponsive (the marker tells its other partners); a wait cut
short by this agent's own deadline says so and blames no one."""

from __future__ import annotations

import time

import pytest

from validation.messages import Channel, OwnDeadline, PairError, hello
from validation.rundir import RunDir


class SilentNixl:
    """A NIXL agent whose peers never say anything."""

    def get_new_notifs(self):
        return {}


def _channel(tmp_path, left: float) -> Channel:
    deadline = time.monotonic() + left
    return Channel("node0", SilentNixl(), RunDir(str(tmp_path)), {"node0": "tkv-node0", "node1": "tkv-node1"},
                   {"node1": {"nixl_name": "tkv-node1"}}, {}, lambda: deadline - time.monotonic())


@pytest.mark.parametrize("left", [-5.0, 0.0])
def test_a_wait_after_the_own_deadline_blames_no_peer(tmp_path, left):
    ch = _channel(tmp_path, left)
    t0 = time.monotonic()
    with pytest.raises(OwnDeadline) as info:
        ch.wait("node1", 0, (hello(0),), 30, "node1 to start round 0")
    assert time.monotonic() - t0 < 1
    assert "own deadline" in str(info.value) and "node1 to start round 0" in str(info.value)
    assert "no answer from node1" not in str(info.value)
    assert ch.gone == {} and not ch.rundir.is_unresponsive("node1")


def test_a_deadline_before_the_timeout_ends_the_wait_then_without_blame(tmp_path):
    ch = _channel(tmp_path, 0.3)
    t0 = time.monotonic()
    with pytest.raises(OwnDeadline, match="node1 had 0.3s of its 30s to answer"):
        ch.wait("node1", 0, (hello(0),), 30, "node1 to start round 0")
    assert 0.25 < time.monotonic() - t0 < 2
    assert ch.gone == {} and not ch.rundir.is_unresponsive("node1")


def test_a_peer_silent_for_its_whole_timeout_is_marked_unresponsive(tmp_path):
    ch = _channel(tmp_path, 60)
    with pytest.raises(PairError, match="no answer from node1 within 0.2s") as info:
        ch.wait("node1", 0, (hello(0),), 0.2, "node1 to start round 0")
    assert not isinstance(info.value, OwnDeadline)
    assert "node1" in ch.gone and ch.rundir.unresponsive_marker("node1")["by"] == "node0"
