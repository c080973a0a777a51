"""Spec: the result file has two writers, the main thread (after every pair) and the watchdog (its verdict at
the deadline). They write one at a time, each through a temporary file of its own, from a snapshot of the
result taken under the lock; the watchdog's verdict changes only its snapshot, and it does not wait for ever
on a main thread stuck in its write."""

from __future__ import annotations

import json
import os
import threading

from tests.validation.test_bounded_reads import _agent
from validation import agent as agent_mod
from validation.rundir import write_bytes


def test_two_threads_writing_one_file_use_their_own_temporary_names(tmp_path, monkeypatch):
    real_replace = os.replace
    tmps = []
    both_in = threading.Barrier(2, timeout=5)

    def replace(src, dst):
        tmps.append(src)
        both_in.wait()  # each thread has written its temporary file before either renames
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    path = str(tmp_path / "result.json")
    threads = [threading.Thread(target=write_bytes, args=(path, data)) for data in (b"main", b"watchdog")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(set(tmps)) == 2 and all(t.startswith(path + ".tmp.") for t in tmps)
    assert (tmp_path / "result.json").read_bytes() in (b"main", b"watchdog")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_save_writes_a_snapshot_not_the_live_result(tmp_path, monkeypatch):
    agent = _agent(tmp_path)
    agent.result["pairs"].append({"lengths": [{"latencies_s": [0.001]}]})
    agent.missing["node1"] = "node1 never showed up"
    written = []
    monkeypatch.setattr(agent_mod, "write_json", lambda path, doc: written.append(doc))
    agent.save()
    (doc,) = written
    assert doc is not agent.result and doc["pairs"] is not agent.result["pairs"]
    assert doc["pairs"][0]["lengths"][0] is not agent.result["pairs"][0]["lengths"][0]
    assert doc["pairs"] == agent.result["pairs"] and doc["missing_peers"] == {"node1": "node1 never showed up"}
    agent.result["pairs"][0]["lengths"][0]["latencies_s"].append(0.002)  # the main thread goes on ...
    assert doc["pairs"][0]["lengths"][0]["latencies_s"] == [0.001]  # ... the saved copy does not move


def test_a_save_waits_for_the_one_in_progress(tmp_path):
    agent = _agent(tmp_path)
    saver = threading.Thread(target=agent.save)
    with agent._save_lock:  # another thread is saving
        saver.start()
        saver.join(0.3)
        assert saver.is_alive() and not os.path.exists(agent.results_path)
    saver.join(5)
    assert not saver.is_alive() and json.loads(open(agent.results_path).read())["agent"] == "node0"


def test_the_watchdog_verdict_is_written_from_a_snapshot_and_ends_the_process(tmp_path):
    agent = _agent(tmp_path)
    agent.result["stage"] = "round 0: node0 -> node1"
    codes = []
    agent._give_up(codes.append)
    doc = json.loads(open(agent.results_path).read())
    assert codes == [3] and doc["final"] is True
    assert doc["error"] == "agent deadline (60s) exceeded during 'round 0: node0 -> node1'"
    assert agent.result["error"] is None and agent.result["final"] is False  # the live result is the main thread's
    assert not agent._save_lock.acquire(blocking=False)  # held to the end: no older document replaces the verdict


def test_the_watchdog_does_not_wait_for_ever_on_a_stuck_save(tmp_path, monkeypatch):
    agent = _agent(tmp_path)
    monkeypatch.setattr(agent_mod, "SAVE_WAIT_S", 0.1)
    agent._save_lock.acquire()  # the main thread is stuck inside its write
    codes = []
    agent._give_up(codes.append)
    assert codes == [3] and json.loads(open(agent.results_path).read())["final"] is True
