"""Fault injection for the tests (params["fault"], from TK_VALIDATE_FAULT): one agent misbehaves once.

    absent   never joins the rendezvous
    kill     exits (SIGKILL) during its first request
    hang     stops answering during its first request
    corrupt  flips one byte of its first received request, after the request's last burst, before the check
"""

from __future__ import annotations

import os
import signal
import time


class Faults:
    def __init__(self, fault: dict | None, agent_id: str, log):
        self.fault = fault or {}
        self.agent = agent_id
        self.log = log
        self.fired = False

    def armed(self, kind: str) -> bool:
        """This agent is to inject `kind` and has not injected anything yet."""
        return self.fault.get("kind") == kind and self.fault.get("agent") == self.agent and not self.fired

    def dies(self) -> bool:
        """A kill or hang is pending for this agent."""
        return self.armed("kill") or self.armed("hang")

    def stay_absent(self) -> None:
        """The 'absent' fault: never return (the launcher ends the process)."""
        if self.fault.get("kind") == "absent" and self.fault.get("agent") == self.agent:
            self.log("fault injection: absent (never joins the rendezvous)")
            while True:
                time.sleep(3600)

    def die(self, save) -> None:
        """The 'kill' or 'hang' fault, after saving the result so far."""
        self.fired = True
        save()
        if self.fault["kind"] == "hang":
            self.log("fault injection: hang (this agent stops answering mid-run)")
            while True:
                time.sleep(3600)
        self.log("fault injection: kill (this agent exits mid-run)")
        os.kill(os.getpid(), signal.SIGKILL)

    def corrupt(self, flip, offset: int, block: int, op: str) -> None:
        """The 'corrupt' fault: flip bits of one received byte (flip(offset): the pool's, where it lives)."""
        if not self.armed("corrupt"):
            return
        self.fired = True
        flip(offset)
        self.log(f"fault injection: corrupted one byte of pool block {block} after the {op}")
