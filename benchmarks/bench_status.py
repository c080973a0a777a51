#!/usr/bin/env python3
"""`tk status` of a 16-component deployment with one component hung: the whole command's wall time, against the
serial probing tk did before (one /health probe after another, each bounded by 3 s), side by side in one run.

No real deployment: 15 tiny HTTP servers on loopback answer /health, and one port (gen-0's) accepts connections
but never answers, as a SIGSTOPped server does. A local run record (recipes/standin-2p2d.yaml with 8 context and 7
generation instances and the proxy) points at them; its "job" is a sleeping process of the run's session, and the
job's files (nodes.tsv, state/events.jsonl) say every component started and the job is ready.

Target (issue 22): under 2 s. Usage: python benchmarks/bench_status.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from toolkit.api import load_plan, prepare  # noqa: E402
from toolkit.runtime import procs  # noqa: E402

OLD_TIMEOUT_S = 3  # tk's probe before issue 22: one server after another, curl -m 3 / requests timeout=3


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def free_base(count: int) -> int:
    """A base port with `count` free ports above it."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count >= 65000:
            continue
        socks = []
        try:
            for p in range(base, base + count):
                sock = socket.socket()
                sock.bind(("127.0.0.1", p))
                socks.append(sock)
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise SystemExit("no free port range")


HUNG = "gen-0"  # the component whose port accepts connections but never answers


def serve_health(run) -> tuple[list, socket.socket]:
    """Every component's /health answered on its port, except HUNG's, which only the kernel accepts: (the
    servers, HUNG's listening socket)."""
    servers, hung = [], None
    for s in run.servers:
        if s.name == HUNG:
            hung = socket.socket()
            hung.bind(("127.0.0.1", s.port))
            hung.listen(64)  # connections are accepted by the kernel; nothing ever answers
            continue
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", s.port), Health)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
    assert hung is not None
    return servers, hung


def start_ready_job(run):
    """The job's files as a ready job writes them (every component started, then ready) and its process: a sleep
    in the run's session; the run recorded ready."""
    (run.path / "nodes.tsv").write_text("".join(f"{i}\tlocal{i}\t127.0.0.1\n" for i in range(run.nodes)))
    lines = [{"event": "started", "component": s.name} for s in run.servers] + [{"event": "ready"}]
    (run.path / "state" / "events.jsonl").write_text("".join(json.dumps(
        {"time": time.time(), "event": e["event"], "component": e.get("component"), "state": None, "reason": None,
         "exit_code": None, "restarts": None}) + "\n" for e in lines))
    run.run_id = uuid.uuid4().hex
    job = procs.start_group(["sleep", "300"], cwd=run.path, env=dict(os.environ), log_path=run.path / "job.log",
                            run_id=run.run_id)
    run.job_pid, run.job_id = job.pid, f"local-{run.run_id[:12]}"
    run.set_state("ready")
    return job


def time_status(run, env: dict, repeat: int) -> list[float]:
    """The whole `tk status --json` command's wall time, `repeat` times; each must say degraded, HUNG not healthy."""
    times = []
    for _ in range(repeat):
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "toolkit.cli", "status", str(run.path), "--json"],
                              capture_output=True, text=True, timeout=120, env={**os.environ, **env})
        times.append(time.monotonic() - t0)
        doc = json.loads(proc.stdout)
        hung_state = next(s["state"] for s in doc["servers"] if s["name"] == HUNG)
        assert doc["state"] == "degraded" and hung_state != "healthy", (doc["state"], hung_state)
    return times


def time_serial_probes(run, repeat: int) -> list[float]:
    """tk before issue 22: one /health probe after another, each bounded by OLD_TIMEOUT_S."""
    times = []
    for _ in range(repeat):
        t0 = time.monotonic()
        for s in run.servers:
            try:
                requests.get(f"http://127.0.0.1:{s.port}/health", timeout=OLD_TIMEOUT_S)
            except requests.RequestException:
                pass
        times.append(time.monotonic() - t0)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tk-bench-status-") as tmp:
        env = {"TK_RUNS_DIR": f"{tmp}/runs", "TK_STATE_DIR": f"{tmp}/state"}
        os.environ.update(env)
        base = free_base(16)
        plan = load_plan(str(ROOT / "recipes" / "standin-2p2d.yaml"),
                         ["context.instances=8", "generation.instances=7", f"proxy.port={base}",
                          f"cluster.worker_base_port={base + 1}", "membership.enabled=false"])
        run = prepare(plan, local=True, run_dir=f"{tmp}/run")
        assert len(run.servers) == 16, len(run.servers)
        servers, hung = serve_health(run)
        job = None
        try:
            job = start_ready_job(run)
            now = time_status(run, env, args.repeat)
            before = time_serial_probes(run, args.repeat)
        finally:
            if job is not None:
                job.kill()
                job.wait()
            for srv in servers:
                srv.shutdown()
            hung.close()
    med_now, med_before = statistics.median(now), statistics.median(before)
    print(f"tk status, 16 components, 1 hung ({args.repeat} runs, median)")
    print(f"  tk status (whole command, concurrent probes): {med_now:6.2f} s   target < 2 s: "
          f"{'met' if med_now < 2 else 'NOT met'}")
    print(f"  the probes alone, serially (tk before):       {med_before:6.2f} s")
    print(f"  ratio serial probes / whole command now:      {med_before / med_now:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
