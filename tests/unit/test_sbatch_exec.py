"""Spec: launch.sbatch runs what the recipe says and nothing else, even with hostile values.

The batch script is executed for real by bash, with stand-ins for srun/scontrol/scancel and for
the server command that record what they were given."""

import json
import os
import socket
import stat
import subprocess
import time
from pathlib import Path

from toolkit.plan import build_plan
from toolkit.recipe import load_recipe_text
from toolkit.render import render

HOSTILE = """\
schema_version: 1
name: hostile
model: meta-llama/Llama-3.1-8B-Instruct
model_path: "/models/x; touch {marker}; $(touch {marker}) `touch {marker}`"
cluster:
  gpus_per_node: 2
  startup_timeout_s: 3
  container_mounts: ["/a:/b$(touch {marker})"]
  container_image: "img'; touch {marker}; '"
context:
  extra_serve_args: ["--log_level", "info; touch {marker}"]
  env:
    EVIL: "$(touch {marker})"
kv_transfer:
  transport: tcp
"""

FAKE_SRUN = r"""#!/bin/bash
# Records its arguments; runs the command after srun's options like srun would (on one "node").
printf '%s\0' "$@" >> "$FAKE_LOG/srun.args"; printf '\n' >> "$FAKE_LOG/srun.args"
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
if [ "${4:-}" = tk-nodes ]; then  # the step on every node: hostname and ports already taken
    for n in $FAKE_NODES; do SLURMD_NODENAME=$n bash -c "$3" "$4" "$5"; done
    exit 0
fi
exec "$@"
"""

FAKE_SERVER = r"""#!/bin/bash
python3 -c 'import json, os, sys; print(json.dumps({"argv": sys.argv[1:], "EVIL": os.environ.get("EVIL"), "UCX_TLS": os.environ.get("UCX_TLS"), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}))' "$@" >> "$FAKE_LOG/server.jsonl"
exec sleep 60
"""


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _fake_slurm_env(tmp_path: Path, out: Path) -> dict:
    """PATH with recording stand-ins for srun/scontrol/scancel and the server, for a 2-node job."""
    fake = tmp_path / "bin"
    fake.mkdir()
    _exe(fake / "srun", FAKE_SRUN)
    _exe(fake / "scontrol", "#!/bin/bash\necho nodeA\necho nodeB\n")
    _exe(fake / "scancel", "#!/bin/bash\necho \"$@\" >> \"$FAKE_LOG/scancel.args\"\n")
    _exe(fake / "trtllm-llmapi-launch", '#!/bin/bash\nexec "$@"\n')
    _exe(fake / "trtllm-serve", FAKE_SERVER)
    return {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path),
            "FAKE_NODES": "nodeA nodeB", "SLURM_JOB_NODELIST": "node[A-B]", "SLURM_JOB_ID": "4242",
            "TK_RUN_DIR": str(out)}


def test_a_port_already_taken_on_a_node_fails_the_job_before_any_server_starts(tmp_path):
    # Something (an orphan of an earlier run, another deployment) listens on ctx-0's port: it would answer
    # this run's health checks, so the job must refuse to start rather than serve through it.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        text = HOSTILE.replace("/models/x; touch {marker}; $(touch {marker}) `touch {marker}`", "/models/x")
        text = text.replace("  startup_timeout_s: 3\n", f"  startup_timeout_s: 3\n  worker_base_port: {port}\n")
        text = text.format(marker=tmp_path / "unused")
        out, _ = render(build_plan(load_recipe_text(text, str(tmp_path / "r.yaml"))), tmp_path / "run")
        proc = subprocess.run(["bash", str(out / "launch.sbatch")], env=_fake_slurm_env(tmp_path, out),
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    phases = (out / "state" / "phases.tsv").read_text()
    assert f"port(s) {port} already in use on nodeA" in phases, phases
    assert "cluster.worker_base_port" in phases
    assert "started" not in phases and not (tmp_path / "server.jsonl").exists()
    assert "4242" in (tmp_path / "scancel.args").read_text()


def test_hostile_values_reach_the_server_as_data_not_as_commands(tmp_path):
    marker = tmp_path / "PWNED"
    loaded = load_recipe_text(HOSTILE.format(marker=marker), str(tmp_path / "hostile.yaml"))
    out, _ = render(build_plan(loaded), tmp_path / "run")
    env = _fake_slurm_env(tmp_path, out)
    start = time.monotonic()
    proc = subprocess.run(["bash", str(out / "launch.sbatch")], env=env, capture_output=True, text=True,
                          timeout=90)
    elapsed = time.monotonic() - start

    assert not marker.exists(), "a recipe value was executed as a command"
    # No server answers /health, so the job fails after startup_timeout_s and cancels itself.
    assert proc.returncode != 0
    assert elapsed < 60
    phases = (out / "state" / "phases.tsv").read_text()
    assert "not healthy" in phases and "ctx-0" in phases
    assert "4242" in (tmp_path / "scancel.args").read_text()

    servers = [json.loads(line) for line in (tmp_path / "server.jsonl").read_text().splitlines()]
    assert len(servers) == 2  # ctx-0 and gen-0 started, each exactly once
    for s in servers:
        assert s["argv"][0] == f"/models/x; touch {marker}; $(touch {marker}) `touch {marker}`"
        assert s["UCX_TLS"] == "tcp,cuda_copy,sm,self"
    ctx = next(s for s in servers if "8336" in s["argv"])
    assert ctx["EVIL"] == f"$(touch {marker})" and ctx["CUDA_VISIBLE_DEVICES"] == "0"
    assert ctx["argv"][-4:-2] == ["--log_level", f"info; touch {marker}"]
    srun_calls = [c.split("\0") for c in (tmp_path / "srun.args").read_text().split("\n") if c]
    images = [a for call in srun_calls for a in call if a.startswith("--container-image=")]
    assert images and all(a == "--container-image=img'; touch " + str(marker) + "; '" for a in images)
    # every process the job started is gone (a recorder may need a moment to finish its write)
    deadline = time.monotonic() + 5
    while True:
        left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left
