"""Spec: every file the agent reads has a size bound. UCX's log (hundreds of MB with UCX_LOG_LEVEL=debug)
is streamed line by line up to a cap, and says when it was cut; a peer's rendezvous info, NIXL metadata and
markers, and params.json, are refused past their caps with a reason that names the file, never read whole."""

from __future__ import annotations

import json

import pytest

from tests.validation.test_payload import UCX_TABLES
from validation import agent as agent_mod
from validation import probes
from validation.agent import Agent
from validation.rundir import RunDir, TooLarge, read_json, write_json
from validation.wire import ProtocolMismatch, load_params

JUNK = "[1795371756.1] [vm:1:0]  ucp_worker.c:1 UCX DEBUG a debug line that is not a protocol table\n"


def test_a_ucx_log_is_read_up_to_its_cap_and_says_it_was_cut(tmp_path):
    log = tmp_path / "ucx.log"
    log.write_text(UCX_TABLES + JUNK * 40_000)  # ~3.6 MB of debug lines after the tables
    tables, cut = probes.read_ucx_proto_info(str(log), max_bytes=1 << 20)
    assert [t["scope"] for t in tables] == ["self", "inter-node", "inter-node"] and cut
    assert probes.read_ucx_proto_info(str(log)) == (tables, False)  # under the default cap: read to the end


def test_tables_past_the_cap_are_not_read(tmp_path):
    log = tmp_path / "ucx.log"
    log.write_text(JUNK * 20_000 + UCX_TABLES)
    assert probes.read_ucx_proto_info(str(log), max_bytes=1 << 20) == ([], True)


def test_an_endless_line_is_cut_and_the_tables_after_it_still_read(tmp_path):
    log = tmp_path / "ucx.log"
    log.write_text("x" * (3 << 20) + "\n" + UCX_TABLES)  # one 3 MB line
    tables, cut = probes.read_ucx_proto_info(str(log), max_bytes=4 << 20)
    assert len(tables) == 3 and not cut
    assert probes.read_ucx_proto_info(str(tmp_path / "absent.log")) == ([], False)


def test_an_oversized_json_file_is_refused_by_name(tmp_path):
    path = tmp_path / "info.json"
    path.write_text(json.dumps({"pad": "x" * 2048}))
    with pytest.raises(TooLarge, match="info.json is larger than 1024 bytes"):
        read_json(str(path), limit=1024)
    assert read_json(str(path))["pad"] == "x" * 2048
    assert read_json(str(tmp_path / "absent.json")) is None


def test_an_unreadable_unresponsive_marker_still_marks_the_peer(tmp_path):
    rd = RunDir(str(tmp_path))
    write_json(rd.unresponsive("node2"), {"by": "node0", "why": "x" * (2 << 20)})
    marker = rd.unresponsive_marker("node2")
    assert marker["by"] == "?" and "larger than" in marker["why"]
    write_json(rd.unresponsive("node3"), ["not", "an", "object"])
    assert rd.unresponsive_marker("node3")["by"] == "?"
    assert rd.unresponsive_marker("node1") is None


def test_params_larger_than_the_cap_are_refused(tmp_path, monkeypatch):
    from validation import wire

    path = tmp_path / "params.json"
    path.write_text(json.dumps({"protocol": wire.PROTOCOL, "pad": "x" * 4096}))
    assert load_params(str(path))["pad"]
    monkeypatch.setattr(wire, "PARAMS_MAX_BYTES", 1024)
    with pytest.raises(TooLarge):
        load_params(str(path))
    path.write_text("[1, 2]")
    with pytest.raises(ProtocolMismatch):
        load_params(str(path))


class FakeNixl:
    def __init__(self):
        self.loaded = []

    def add_remote_agent(self, blob: bytes) -> bytes:
        self.loaded.append(blob)
        return b"tkv-node1"


def _agent(tmp_path) -> Agent:
    params = {"run_id": "0123456789", "run_dir": str(tmp_path), "fault": None,
              "agents": [{"id": "node0", "node": 0, "role": "ctx"}, {"id": "node1", "node": 1, "role": "gen"}],
              "rounds": [[["node0", "node1"]]],
              "timeouts": {"deadline_s": 60, "transfer_s": 5, "pair_s": 5, "rendezvous_s": 5}}
    agent = Agent(params, "node0")
    agent.nixl = FakeNixl()
    return agent


def test_a_peer_metadata_blob_past_the_cap_makes_it_missing_not_loaded(tmp_path, monkeypatch):
    agent = _agent(tmp_path)
    rd = agent.rundir
    (tmp_path / "rendezvous").mkdir()
    (tmp_path / "rendezvous" / "node1.md").write_bytes(b"m" * 4096)
    monkeypatch.setattr(agent_mod, "METADATA_MAX_BYTES", 1024)
    agent._load_peer("node1", {"ok": True})
    assert agent.nixl.loaded == [] and "node1" not in agent.peers
    assert "node1.md is larger than 1024 bytes" in agent.missing["node1"]
    monkeypatch.setattr(agent_mod, "METADATA_MAX_BYTES", 8192)
    agent.missing.clear()
    agent._load_peer("node1", {"ok": True})
    assert agent.nixl.loaded == [b"m" * 4096] and agent.peers["node1"]["nixl_name"] == "tkv-node1"
    assert rd.metadata("node1").endswith("node1.md")


def test_a_peer_rendezvous_info_past_the_cap_is_named_at_once(tmp_path):
    agent = _agent(tmp_path)
    write_json(agent.rundir.info("node1"), {"ok": True, "pad": "x" * (2 << 20)})
    want = {"node1"}
    agent._poll_peers(want)
    assert want == set() and "rendezvous info was not read" in agent.missing["node1"]
    assert "larger than" in agent.missing["node1"]
