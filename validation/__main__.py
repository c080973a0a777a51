"""The agent's command line: ``python3 agent.pyz PARAMS_JSON AGENT_ID`` (or ``python3 -m validation ...``)."""

from __future__ import annotations

import os
import sys

USAGE = "usage: agent.pyz PARAMS_JSON AGENT_ID"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(USAGE, file=sys.stderr)
        return 2
    from validation.agent import Agent
    from validation.wire import ProtocolMismatch, load_params

    try:
        params = load_params(argv[0])
    except ProtocolMismatch as exc:
        print(exc, file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:  # unreadable, too large (rundir.TooLarge) or not JSON
        print(f"cannot read {argv[0]}: {exc}", file=sys.stderr)
        return 2
    code = Agent(params, argv[1]).run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip NIXL/UCX teardown: every peer is done (barrier) and exit frees everything


if __name__ == "__main__":
    sys.exit(main())
