"""The control messages of a pair (NIXL notifications) and the liveness of the peer on the other end.

Grammar (every message starts with the round, so a late message of an earlier pair is never taken for
one of this pair):

    R|hello|   R|bye|   R|abort|WHO: WHY                       a pair starts, ends, or one side gives up
    TAG|rdy|IT|N   TAG|wd|IT|   TAG|src|IT|   TAG|end|ok|   TAG|end|fail|WHY
                                    one request: TAG = R|CODE|LENGTH_INDEX; CODE is the op and direction
                                    (WF, RF, WB, RB) or S<tokens_per_block><op><pass> for the sweep

Standard library only; NIXL is used through the agent object handed in.
"""

from __future__ import annotations

import os
import time

from validation.rundir import RunDir, write_json

MAX_MESSAGE = 900  # characters; a longer reason is cut


class PairError(Exception):
    """The current pair cannot go on (peer gone, timeout, transfer error); the message says why."""


class OwnDeadline(PairError):
    """This agent's own deadline ran out while it waited: the peer is not to blame, and is not marked."""


# -- building and reading messages ----------------------------------------------------------------

def hello(r: int) -> str:
    return f"{r}|hello|"


def bye(r: int) -> str:
    return f"{r}|bye|"


def abort(r: int, who: str, why: str) -> str:
    return f"{r}|abort|{who}: {why}"[:MAX_MESSAGE]


def abort_prefix(r: int) -> str:
    return f"{r}|abort|"


def abort_reason(msg: str) -> str:
    return msg.split("|", 2)[2]


def tag(r: int, code: str, li: int) -> str:
    """The prefix of every message about one request of a pair."""
    return f"{r}|{code}|{li}"


def ready_prefix(tag_: str) -> str:
    return f"{tag_}|rdy|"


def ready(tag_: str, it, n: int = 1) -> str:
    """The destination is prepared for the burst of n transfers from iteration `it` on (WRITE)."""
    return f"{tag_}|rdy|{it}|{n}"


def written(tag_: str, it) -> str:
    """The source's WRITE of iteration `it` is done (sent with the transfer as its notification)."""
    return f"{tag_}|wd|{it}|"


def source_filled(tag_: str, it) -> str:
    """The source of a READ is filled for the burst from iteration `it` on."""
    return f"{tag_}|src|{it}|"


def end(tag_: str, why: str | None = None) -> str:
    """The verifier's verdict on a request: ok, or fail with the reason."""
    return f"{tag_}|end|ok|" if why is None else f"{tag_}|end|fail|{why}"[:MAX_MESSAGE]


def end_prefix(tag_: str) -> str:
    return f"{tag_}|end|"


def fields(msg: str) -> tuple[str, str, str]:
    """A request message -> (kind, argument, rest): 'R|W|0|rdy|3|' -> ('rdy', '3', '')."""
    parts = msg.split("|")
    return parts[3], parts[4], "|".join(parts[5:])


def end_error(msg: str, default: str) -> str | None:
    """None for an 'end|ok', else the reason an 'end|fail' gives (default when it gives none)."""
    _, verdict, why = fields(msg)
    if verdict == "ok":
        return None
    return why or default


# -- the channel -------------------------------------------------------------------------------------

class Channel:
    """Notifications to and from the peers, and whether a peer is gone.

    peers: agent id -> rendezvous info with its "nixl_name"; gone: agent id -> why it cannot take part
    any more (shared with the agent, which reports it); left(): seconds to the agent's deadline.
    """

    def __init__(self, agent_id: str, nixl, rundir: RunDir, names: dict, peers: dict, gone: dict, left):
        self.id = agent_id
        self.nixl = nixl
        self.rundir = rundir
        self.ids_by_name = {v: k for k, v in names.items()}
        self.peers = peers
        self.gone = gone
        self.left = left
        self.inbox: dict[str, list] = {}
        self._last_gone_check = 0.0

    def send(self, peer: str, msg: str) -> None:
        try:
            self.nixl.send_notif(self.peers[peer]["nixl_name"], msg.encode())
        except Exception as exc:  # noqa: BLE001
            code = self.rundir.exit_code(peer)
            if code is not None:
                self.gone[peer] = f"{peer} exited with code {code} (log: logs/{peer}.log)"
                raise PairError(f"{self.gone[peer]}; sending it a control message failed "
                                f"({type(exc).__name__})") from None
            raise PairError(f"sending a control message to {peer} failed: {type(exc).__name__}: {exc}") from None

    def _pump(self) -> None:
        for name, msgs in self.nixl.get_new_notifs().items():
            peer = self.ids_by_name.get(name if isinstance(name, str) else name.decode(), str(name))
            self.inbox.setdefault(peer, []).extend(m.decode(errors="replace") for m in msgs)

    def peer_gone(self, peer: str) -> str | None:
        """Why the peer is gone (exited, done without this pair, declared unresponsive), at most 4 times a second."""
        now = time.monotonic()
        if now - self._last_gone_check < 0.25:
            return None
        self._last_gone_check = now
        code = self.rundir.exit_code(peer)
        if code is not None:
            return f"{peer} exited with code {code} (log: logs/{peer}.log)"
        if self.rundir.is_done(peer):
            return f"{peer} finished without completing this pair (it gave up on it; see its result)"
        marker = self.rundir.unresponsive_marker(peer)
        if marker:
            return f"{peer} stopped answering ({marker['by']}: {marker['why']})"
        return None

    def _take(self, peer: str, r: int, prefixes: tuple) -> str | None:
        """The first waiting message of the peer that starts with one of prefixes; PairError on its abort."""
        q = self.inbox.get(peer, [])
        for i, m in enumerate(q):
            if m.startswith(prefixes):
                return q.pop(i)
            if m.startswith(abort_prefix(r)):
                q.pop(i)
                raise PairError(f"{peer} aborted the pair: {abort_reason(m)}")
        return None

    def _timed_out(self, peer: str, timeout: float, what: str) -> PairError:
        why = f"no answer from {peer} within {timeout:g}s while waiting for {what}"
        self.gone[peer] = f"{peer} stopped answering: {why}"
        path = self.rundir.unresponsive(peer)
        if not os.path.exists(path):  # tell its other partners, so they do not wait for it too
            write_json(path, {"by": self.id, "why": why})
        return PairError(why)

    def wait(self, peer: str, r: int, prefixes: tuple, timeout: float, what: str,
             poll_s: float | None = None) -> str:
        """The next message of the peer starting with one of prefixes, bounded by timeout and the deadline.

        A peer silent for the whole timeout is declared unresponsive (PairError, and the marker that tells
        its other partners). When this agent's own deadline comes first, the wait ends then with OwnDeadline,
        and the peer, which had less than its timeout to answer, is not blamed.

        The pause between polls grows from none to 2 ms; poll_s fixes it instead (a destination awaiting a
        WRITE's notification: without a progress thread, the WRITE completes only when it polls)."""
        left = self.left()
        own_deadline = left < timeout
        limit = time.monotonic() + max(0.0, min(timeout, left))
        sleep = poll_s or 0.0
        while True:
            self._pump()
            msg = self._take(peer, r, prefixes)
            if msg is not None:
                return msg
            gone = self.peer_gone(peer)
            if gone:
                self.gone[peer] = gone
                raise PairError(f"{gone}, while waiting for {what}")
            if time.monotonic() > limit:
                if own_deadline:
                    raise OwnDeadline(f"this agent's own deadline (--timeout) ran out while waiting for {what}; "
                                      f"{peer} had {max(0.0, left):.1f}s of its {timeout:g}s to answer and is not "
                                      "blamed")
                raise self._timed_out(peer, timeout, what)
            if sleep:
                time.sleep(sleep)
            if poll_s is None:
                sleep = min(0.002, sleep + 0.0001)
