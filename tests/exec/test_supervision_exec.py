"""Spec: the supervision policy of the job (launch.sbatch starting job.pyz), executed for real under fake
srun/scontrol/scancel/squeue and a fake server (a small HTTP server that answers every GET with 200): a killed server is restarted with its
restart counted; killed again with no restarts left it is given up ("lost"), and its role below its minimum
ends the job, naming the cause; each component's state file says so."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.fakes.slurm import FAKE_SRUN, exe as _exe, phases as _phases
from toolkit.plan import build_plan
from toolkit.recipe import load_recipe_text
from toolkit.render import render

pytestmark = pytest.mark.slow

FAKE_HTTP_SERVER = r"""#!/usr/bin/env python3
import http.server, os, sys, yaml
args = sys.argv[1:]
if "--version" in args:
    print("fake 0"); sys.exit(0)
if args and args[0] == "disaggregated":
    port = yaml.safe_load(open(args[args.index("-c") + 1]))["port"]
else:
    port = int(args[args.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer.allow_reuse_address = True
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""

RECIPE = """\
schema_version: 1
name: supervised
engine: standin
model: tk/standin-tiny
trtllm_version: "1.1"
cluster:
  gpus_per_node: 1
  gpu: CPU
  gpu_request: none
  worker_base_port: {port}
  startup_timeout_s: 20
kv_transfer:
  transport: tcp
  kv_transfer_timeout_ms: null
proxy:
  port: {proxy_port}
supervision:
  max_restarts: 1
  backoff_initial_s: 0
  unhealthy_after_s: 4
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _state(out: Path, name: str) -> dict:
    return json.loads((out / "state" / "servers" / f"{name}.json").read_text())


def test_a_killed_server_is_restarted_then_given_up_and_its_role_below_minimum_ends_the_job(tmp_path):
    base = _free_port()
    while any(not _port_free(p) for p in (base, base + 1, base + 1000, base + 1001)):
        base = _free_port()
    text = RECIPE.format(port=base, proxy_port=_free_port())
    out, _ = render(build_plan(load_recipe_text(text, str(tmp_path / "r.yaml"))), tmp_path / "run")
    fake = tmp_path / "bin"
    fake.mkdir()
    _exe(fake / "srun", FAKE_SRUN)
    _exe(fake / "scontrol", "#!/bin/bash\necho nodeA\necho nodeB\n")
    _exe(fake / "scancel", "#!/bin/bash\necho \"$@\" >> \"$FAKE_LOG/scancel.args\"\n")
    _exe(fake / "squeue", "#!/bin/bash\nexit 0\n")  # no Slurm steps: servers are ended through their process
    _exe(fake / "hostname", "#!/bin/bash\necho 127.0.0.1\n")
    _exe(fake / "tk-standin-serve", FAKE_HTTP_SERVER)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path),
           "FAKE_NODES": "nodeA nodeB", "SLURM_JOB_NODELIST": "node[A-B]", "SLURM_JOB_ID": "4242",
           "TK_RUN_DIR": str(out)}
    job = subprocess.Popen(["bash", str(out / "launch.sbatch")], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for(lambda: ("ready" in [p for p, _ in _phases(out)]), 60, "the job to be ready")
        first = _state(out, "gen-0")
        assert first["state"] == "healthy" and first["restarts"] == 0 and first["policy"] == "restart"

        os.kill(first["pid"], signal.SIGKILL)
        _wait_for(lambda: any(p == "restarted" and d.startswith("gen-0") for p, d in _phases(out)), 30,
                  "gen-0 restarted")
        again = _state(out, "gen-0")
        assert again["state"] == "healthy" and again["restarts"] == 1 and again["last_exit"] == 137
        assert again["pid"] != first["pid"]
        assert any(p == "server-exited" and "restart 1 of 1" in d for p, d in _phases(out))
        _wait_for(lambda: any(p == "serving" for p, _ in _phases(out)), 10, "every component healthy again")
        names = [p for p, _ in _phases(out)]
        assert names.index("degraded") < names.index("serving")

        os.kill(again["pid"], signal.SIGKILL)  # no restart left: given up, and no generation server remains
        assert job.wait(timeout=30) != 0
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    phases = _phases(out)
    assert any(p == "lost" and d.startswith("gen-0") for p, d in phases)
    failed = [d for p, d in phases if p == "failed"]
    assert failed and "below the minimum of 1" in failed[0] and failed[0].startswith("gen-0"), phases
    lost = _state(out, "gen-0")
    assert lost["state"] == "lost" and lost["last_exit"] == 137 and lost["restarts"] == 1
    assert "4242" in (tmp_path / "scancel.args").read_text(), "the job cancels itself"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not all(_port_free(p) for p in (base, base + 1)):
        time.sleep(0.2)
    assert all(_port_free(p) for p in (base, base + 1)), "the job's cleanup ended every server"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False
