"""The run directory as the agents see it: where each file lives, atomic writes, and the markers a
peer leaves behind (exit code, done, unresponsive).

    RUN_DIR/params.json                    what every agent does (written by the coordinator)
    RUN_DIR/results/AGENT.json             each agent's result, rewritten after every pair
    RUN_DIR/logs/ucx-AGENT.log             UCX's protocol selection (UCX_PROTO_INFO)
    RUN_DIR/rendezvous/AGENT.md            the agent's NIXL metadata
    RUN_DIR/rendezvous/AGENT.json          its rendezvous info, written last: its presence means .md is there
    RUN_DIR/rendezvous/exited/AGENT        its exit code (written by the launcher's wrapper)
    RUN_DIR/rendezvous/done/AGENT          every pair of it is over
    RUN_DIR/rendezvous/unresponsive/AGENT  {"by", "why"}: a partner gave up waiting for it

Standard library only: the coordinator may use it too.
"""

from __future__ import annotations

import json
import os
import threading


def write_bytes(path: str, data: bytes) -> None:
    """Write through a temporary file and rename, so a reader sees all of it or nothing. The temporary name
    is the writer's own (process and thread): two threads writing one file never share it."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: str, doc) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_bytes(path, (json.dumps(doc, indent=1) + "\n").encode())


# What an agent reads from the run directory is written by its peers, so every read is bounded: a
# rendezvous info or a marker is a few hundred bytes, a NIXL metadata blob kilobytes.
JSON_MAX_BYTES = 1 << 20
METADATA_MAX_BYTES = 16 << 20
MARKER_MAX_BYTES = 64


class TooLarge(ValueError):
    """A file in the run directory is larger than what it may hold; it was not read."""

    def __init__(self, path: str, limit: int):
        self.path, self.limit = path, limit
        super().__init__(f"{path} is larger than {limit} bytes; not read")


def read_bounded(path: str, limit: int) -> bytes:
    """The file's bytes; TooLarge when it holds more than limit, OSError when it cannot be read."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(path, limit)
    return data


def read_json(path: str, limit: int = JSON_MAX_BYTES):
    """The document, or None when it is absent or not (yet) valid JSON; TooLarge beyond limit bytes."""
    try:
        return json.loads(read_bounded(path, limit))
    except TooLarge:
        raise
    except (OSError, ValueError):
        return None


def touch(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_bytes(path, b"")


class RunDir:
    """Paths and markers of one run directory."""

    def __init__(self, run_dir: str):
        self.root = run_dir
        self.rendezvous = os.path.join(run_dir, "rendezvous")

    def result(self, agent: str) -> str:
        return os.path.join(self.root, "results", f"{agent}.json")

    def ucx_log(self, agent: str) -> str:
        return os.path.join(self.root, "logs", f"ucx-{agent}.log")

    def metadata(self, agent: str) -> str:
        return os.path.join(self.rendezvous, f"{agent}.md")

    def info(self, agent: str) -> str:
        return os.path.join(self.rendezvous, f"{agent}.json")

    def done(self, agent: str) -> str:
        return os.path.join(self.rendezvous, "done", agent)

    def unresponsive(self, agent: str) -> str:
        return os.path.join(self.rendezvous, "unresponsive", agent)

    def exited(self, agent: str) -> str:
        return os.path.join(self.rendezvous, "exited", agent)

    def exit_code(self, agent: str):
        """The agent's exit code as its wrapper recorded it ('?' when empty), or None while it runs."""
        try:
            with open(self.exited(agent), "rb") as f:
                return f.read(MARKER_MAX_BYTES).decode(errors="replace").strip() or "?"
        except OSError:
            return None

    def is_done(self, agent: str) -> bool:
        return os.path.exists(self.done(agent))

    def is_unresponsive(self, agent: str) -> bool:
        return os.path.exists(self.unresponsive(agent))

    def unresponsive_marker(self, agent: str) -> dict | None:
        """{"by", "why"} once a partner has declared the agent unresponsive, else None."""
        try:
            doc = read_json(self.unresponsive(agent))
        except TooLarge as exc:
            return {"by": "?", "why": f"its marker could not be read ({exc})"}
        if doc is None:
            return None
        if not isinstance(doc, dict):
            return {"by": "?", "why": "its marker is not a JSON object"}
        return {"by": str(doc.get("by", "?")), "why": str(doc.get("why", "no reason given"))}
