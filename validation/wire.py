"""What the coordinator and the agents exchange through files: the protocol version, params.json, the
result document (results/AGENT.json) and the rendezvous info (rendezvous/AGENT.json).

Standard library only: the coordinator imports this module.
"""

from __future__ import annotations

import json
import os
import socket
import time

from validation.rundir import read_bounded

PROTOCOL = 1
PARAMS_MAX_BYTES = 64 << 20  # a few hundred bytes per agent and per scheduled pair


class ProtocolMismatch(ValueError):
    """params.json was written for another version of the agent."""


def load_params(path: str) -> dict:
    """params.json, checked to be of this agent's protocol (ProtocolMismatch if not; rundir.TooLarge beyond
    PARAMS_MAX_BYTES, ValueError when it is not JSON, OSError when it cannot be read)."""
    params = json.loads(read_bounded(path, PARAMS_MAX_BYTES))
    if not isinstance(params, dict):
        raise ProtocolMismatch(f"{path} is not a JSON object")
    if params.get("protocol") != PROTOCOL:
        raise ProtocolMismatch(f"params protocol {params.get('protocol')} != agent protocol {PROTOCOL}")
    return params


def new_result(agent_id: str, role: str, node) -> dict:
    """An agent's result document as it starts; the agent fills it in and rewrites it after every pair."""
    return {
        "protocol": PROTOCOL, "agent": agent_id, "role": role, "node": node,
        "host": socket.gethostname(), "pid": os.getpid(), "final": False, "stage": "starting",
        "error": None, "preflight": [], "pairs": [], "sweep": [], "missing_peers": {},
        "memory": None, "nixl": None, "started": time.time(), "finished": None,
        "transports": [],
    }


def check_item(name: str, status: str, detail: str) -> dict:
    """One preflight item (status: pass, fail or not_present)."""
    return {"name": name, "status": status, "detail": detail}


def rendezvous_info(agent_id: str, nixl_name: str, ok: bool, error, pool=None) -> dict:
    """rendezvous/AGENT.json: who this agent is, whether its preflight passed, and where its pool lies."""
    info = {"protocol": PROTOCOL, "id": agent_id, "name": nixl_name, "host": socket.gethostname(),
            "pid": os.getpid(), "ok": ok, "error": error}
    if pool is not None:
        info["pool"] = {"addr": pool.addr, "bytes": pool.nbytes, "mem": pool.mem, "dev": pool.dev}
    return info


def nixl_names(params: dict) -> dict:
    """agent id -> the NIXL agent name it registers under (unique per run)."""
    return {a["id"]: f"tkv-{params['run_id'][:8]}-{a['id']}" for a in params["agents"]}
