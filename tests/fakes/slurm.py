"""Stand-ins for Slurm's client commands and a server, for specs that execute a rendered job under them, and a
reader of the job's events. One kit, shared by tests/exec (and the supervision specs)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

# Records its arguments; runs the command after srun's options like srun would (on one "node").
FAKE_SRUN = r"""#!/bin/bash
printf '%s\0' "$@" >> "$FAKE_LOG/srun.args"; printf '\n' >> "$FAKE_LOG/srun.args"
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do
    case "$1" in --output=*) exec >>"${1#--output=}" 2>&1 ;; esac  # a step's log, as srun writes it
    shift
done
if [ "${4:-}" = tk-nodes ]; then  # the step on every node: hostname and ports already taken
    for n in $FAKE_NODES; do SLURMD_NODENAME=$n bash -c "$3" "$4" "$5"; done
    exit 0
fi
exec "$@"
"""


def exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def events(run_dir: Path) -> list[dict]:
    """state/events.jsonl, oldest first ([] before the job wrote any)."""
    path = Path(run_dir) / "state" / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def phases(run_dir: Path) -> list[tuple[str, str]]:
    """(event, reason) of every event, oldest first."""
    return [(e["event"], e.get("reason") or "") for e in events(run_dir)]


def fake_slurm_env(tmp_path: Path, out: Path, nodes: str = "nodeA nodeB") -> dict:
    """PATH with recording stand-ins for srun/scontrol/scancel, for a job over `nodes`."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    exe(fake / "srun", FAKE_SRUN)
    exe(fake / "scontrol", "#!/bin/bash\n" + "".join(f"echo {n}\n" for n in nodes.split()))
    exe(fake / "scancel", "#!/bin/bash\necho \"$@\" >> \"$FAKE_LOG/scancel.args\"\n")
    return {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path), "FAKE_NODES": nodes,
            "SLURM_JOB_NODELIST": "node[A-B]", "SLURM_JOB_ID": "4242", "TK_RUN_DIR": str(out)}
