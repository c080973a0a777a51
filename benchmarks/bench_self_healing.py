#!/usr/bin/env python3
"""Serving through a worker loss: good-request throughput before, during and after, failed requests, and the
time to recover, for kill -9 of a generation server and of a context server, under the restart policy (tk's
default) and under --fail-fast (today's benchmark policy), measured side by side in one run.

One deployment per policy (recipes/standin-2p2d.yaml, local backend unless --slurm), the same closed-loop load of
the official `openai` client (tests/integration/faultload.py: CONCURRENCY streaming chat clients, no client
retries). Per fault: `before` is the PHASE_S seconds before the kill, `during` from the kill until `tk status`
shows the server healthy again (or PHASE_S under fail-fast, which never recovers), `after` the PHASE_S seconds
after that. Printed: good requests/s in each phase and their ratio to `before`, failed requests, and seconds to
recover.

Usage: python benchmarks/bench_self_healing.py [--concurrency 6] [--phase 8] [--slurm]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.faultload import ClosedLoopLoad, good_per_s  # noqa: E402
from tests.integration.test_launch import server_pids  # noqa: E402

RECIPE = ROOT / "recipes" / "standin-2p2d.yaml"


def tk(*args: str, env: dict, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit.cli", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env={**os.environ, **env})


def status(env: dict) -> dict:
    return json.loads(tk("status", "--json", env=env, timeout=60).stdout or "{}")


def server(doc: dict, name: str) -> dict:
    return next((s for s in doc.get("servers", []) if s["name"] == name), {})


def wait_recovered(env: dict, victim: str, bound_s: float) -> float | None:
    """Seconds until tk status shows the victim healthy after a restart and the run ready; None past bound_s."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < bound_s:
        doc = status(env)
        s = server(doc, victim)
        if doc.get("state") == "ready" and s.get("state") == "healthy" and s.get("restarts", 0) >= 1:
            return time.monotonic() - t0
        if doc.get("state") in ("failed", "stopped"):
            return None
        time.sleep(0.5)
    return None


def run_policy(policy: str, args, backend: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="tk-bench-heal-") as tmp:
        env = {"TK_RUNS_DIR": str(Path(tmp) / "runs")}
        extra = ["--fail-fast"] if policy == "fail-fast" else []
        proc = tk("launch", str(RECIPE), *backend, *extra, "--json", env=env)
        if proc.returncode != 0:
            raise SystemExit(f"launch failed: {proc.stderr[-2000:]}")
        record = json.loads(proc.stdout)
        run_dir, endpoint = record["run_dir"], record["endpoint"]
        ports = {s["name"]: s["port"] for s in record["servers"]}
        rows = []
        load = ClosedLoopLoad(endpoint, record["model"], concurrency=args.concurrency).start()
        try:
            victims = ["gen-1", "ctx-1"] if policy == "restart" else ["gen-1"]
            for victim in victims:
                time.sleep(args.phase)
                t_kill = time.monotonic()
                for pid in server_pids(run_dir, ports[victim]):
                    os.kill(pid, signal.SIGKILL)
                recover_s = wait_recovered(env, victim, 60) if policy == "restart" else None
                t_back = t_kill + (recover_s if recover_s is not None else args.phase)
                time.sleep(args.phase)
                rows.append({"policy": policy, "victim": victim, "t_kill": t_kill, "t_back": t_back,
                             "recover_s": recover_s})
        finally:
            records = load.stop()
            tk("stop", run_dir, env=env, timeout=120)
    for row in rows:
        t_kill, t_back = row["t_kill"], row["t_back"]
        row["before"] = good_per_s(records, t_kill - args.phase, t_kill)
        row["during"] = good_per_s(records, t_kill, t_back)
        row["after"] = good_per_s(records, t_back, t_back + args.phase)
        row["failed"] = sum(1 for r in records if not r.ok and t_kill <= r.t_end < t_back + args.phase)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--phase", type=float, default=8.0, help="seconds measured before and after each fault")
    ap.add_argument("--slurm", action="store_true", help="the dev Slurm cluster instead of the local backend")
    args = ap.parse_args()
    backend = ["--set", "cluster.partition=dev"] if args.slurm else ["--local"]
    rows = run_policy("restart", args, backend) + run_policy("fail-fast", args, backend)
    print(f"{'policy':<10} {'killed':<7} {'good/s before':>13} {'during':>8} {'after':>8} "
          f"{'during/before':>13} {'after/before':>12} {'failed':>7} {'recover s':>9}")
    for r in rows:
        ratio = (lambda x: f"{x / r['before']:.2f}" if r["before"] else "-")
        recover = f"{r['recover_s']:.1f}" if r["recover_s"] is not None else "never"
        print(f"{r['policy']:<10} {r['victim']:<7} {r['before']:>13.1f} {r['during']:>8.1f} {r['after']:>8.1f} "
              f"{ratio(r['during']):>13} {ratio(r['after']):>12} {r['failed']:>7} "
              f"{recover:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
