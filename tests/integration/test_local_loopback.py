"""Spec: `tk launch --local` listens on loopback only, UCX included (issue 21, m1): every listening socket of every
process of the run (servers, proxy, and the UCX/NIXL transport inside the servers) is bound to 127.0.0.1 or ::1,
after KV has moved (so NIXL's UCX workers exist)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import requests

from tests.integration.helpers import MODEL, STANDIN_RECIPE, tk, tk_json

pytestmark = [pytest.mark.slow, pytest.mark.nixl]

LISTEN = "0A"


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(target[8:-1])
    except OSError:
        pass
    return out


def _listeners() -> dict[str, str]:
    """inode -> local address of every listening TCP socket (IPv4 and IPv6), from /proc/net."""
    out = {}
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == LISTEN:
                out[parts[9]] = parts[1].split(":")[0][:width]
    return out


def _loopback(hexaddr: str) -> bool:
    if len(hexaddr) == 8:  # little-endian IPv4: 127.x.x.x ends in 7F
        return hexaddr.endswith("7F")
    return hexaddr == "0" * 24 + "01000000" or (hexaddr.startswith("0000000000000000FFFF0000")
                                                  and hexaddr.endswith("7F"))


def _run_pids(run_id: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                env = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if f"TK_RUN_ID={run_id}".encode() in env.split(b"\0"):
                pids.append(int(entry))
    return pids


def test_a_local_deployment_listens_on_loopback_only_ucx_included(tmp_path):
    env = {"TK_RUNS_DIR": str(tmp_path / "runs"), "TK_STATE_DIR": str(tmp_path / "state")}
    # ports below Linux's ephemeral range (32768-60999), where an outgoing connection can hold one
    record = tk_json("launch", str(STANDIN_RECIPE), "--local", "--set", "proxy.port=24100",
                     "--set", "cluster.worker_base_port=24200", "--set", "cluster.internal_base_port=24400",
                     env=env, timeout=400)
    try:
        for i in range(4):  # KV moves: NIXL's UCX transport is up in every server
            requests.post(f"{record['endpoint']}/v1/completions", timeout=60, json={
                "model": MODEL, "prompt": f"hello loopback {i} " * 20, "max_tokens": 4}).raise_for_status()
        run = json.loads((Path(record["run_dir"]) / "run.json").read_text())
        pids = _run_pids(run["run_id"])
        assert len(pids) >= 5, pids
        listening = _listeners()
        mine = {inode: listening[inode] for pid in pids for inode in _socket_inodes(pid) if inode in listening}
        assert len(mine) >= 5  # the servers' and the proxy's HTTP ports at least
        outside = {inode: addr for inode, addr in mine.items() if not _loopback(addr)}
        assert not outside, f"sockets listening beyond loopback: {outside}"
    finally:
        tk("stop", record["run_dir"], env=env, timeout=120)
