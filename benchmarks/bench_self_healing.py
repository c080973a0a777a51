#!/usr/bin/env python3
"""Serving through faults: good-request throughput before, during and after, failed requests, the time the job
took to notice (from its own events) and the time until it served whole again, side by side in one run.

Faults (each on a deployment of recipes/standin-2p2d.yaml under the same closed-loop load of the official `openai`
client, tests/integration/faultload.py: CONCURRENCY streaming chat clients, no client retries):

  kill -9 gen-1, kill -9 ctx-1      restart policy (tk's default)
  wedge gen-0                       SIGUSR1: the stand-in's engine stops producing tokens while /health stays 200
                                    (supervision.stall_after_s = STALL_S): found by the progress probe, restarted
  kill -9 gen-1                     --fail-fast (tk bench's policy): never recovers
  etcd stall                        membership.storage etcd, etcd SIGSTOPped for 30 s: restarted by supervision,
                                    the workers' stale registrations replaced one per role at a time
  controller outage (--slurm)       slurmctld SIGSTOPped for 30 s and gen-1 killed meanwhile: restarts whose srun
                                    cannot create a step are retried without spending max_restarts

Per fault: `before` is the PHASE_S seconds before it, `during` from the fault until `tk status` shows the victim
healthy again and the run ready (PHASE_S under fail-fast, which never recovers), `after` the PHASE_S seconds after.
`detect s`: the job's first event about the victim after the fault (server-exited, wedged, unhealthy), from
state/events.jsonl. Printed: good requests/s per phase and ratios to `before`, failed requests, detect and recover s.

Usage: python benchmarks/bench_self_healing.py [--concurrency 6] [--phase 8] [--slurm] [--only kill,wedge,...]
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
STALL_S = 10
ETCD_UNHEALTHY_S = 8
STALL_FOR_S = 30  # how long etcd or the controller is stopped
DETECTED = ("server-exited", "wedged", "unhealthy", "killed")


def tk(*args: str, env: dict, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit.cli", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env={**os.environ, **env})


def status(env: dict) -> dict:
    return json.loads(tk("status", "--json", env=env, timeout=60).stdout or "{}")


def server(doc: dict, name: str) -> dict:
    return next((s for s in doc.get("servers", []) if s["name"] == name), {})


def events(run_dir: str) -> list[dict]:
    path = Path(run_dir) / "state" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def detected_after(run_dir: str, victim: str, wall_fault: float) -> float | None:
    """Seconds from the fault to the job's first event about the victim."""
    times = [e["time"] for e in events(run_dir) if e["component"] == victim and e["event"] in DETECTED
             and e["time"] >= wall_fault - 0.5]
    return min(times) - wall_fault if times else None


def wait_recovered(env: dict, victim: str, bound_s: float, restarts_before: int = 0) -> float | None:
    """Seconds until tk status shows the victim healthy after a restart and the run ready; None past bound_s."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < bound_s:
        doc = status(env)
        s = server(doc, victim)
        if doc.get("state") == "ready" and s.get("state") == "healthy" and s.get("restarts", 0) > restarts_before:
            return time.monotonic() - t0
        if doc.get("state") in ("failed", "stopped"):
            return None
        time.sleep(0.5)
    return None


def controller_pid() -> int:
    conf = os.environ.get("SLURM_CONF") or subprocess.run([str(ROOT / "scripts" / "dev-slurm"), "env"],
                                                          capture_output=True, text=True).stdout.split("=", 1)[1]
    return int((Path(conf.strip().strip("'\"")).parent / "run" / "slurmctld.pid").read_text().split()[0])


def inject(fault: str, run_dir: str, ports: dict, env: dict) -> tuple[str, callable]:
    """Start a fault; (the victim, a function that ends what must be ended once the job has dealt with it)."""
    if fault in ("kill gen-1", "kill ctx-1", "outage"):
        victim = "gen-1" if fault != "kill ctx-1" else "ctx-1"
        stopped = None
        if fault == "outage":
            stopped = controller_pid()
            os.kill(stopped, signal.SIGSTOP)
        for pid in server_pids(run_dir, ports[victim]):
            os.kill(pid, signal.SIGKILL)
        if stopped is None:
            return victim, lambda: None
        deadline = time.monotonic() + STALL_FOR_S
        return victim, lambda: (time.sleep(max(0.0, deadline - time.monotonic())), os.kill(stopped, signal.SIGCONT))
    if fault == "wedge gen-0":
        for pid in server_pids(run_dir, ports["gen-0"]):
            os.kill(pid, signal.SIGUSR1)
        return "gen-0", lambda: None
    if fault == "etcd stall":
        pid = json.loads((Path(run_dir) / "state" / "servers" / "etcd.json").read_text())["pid"]
        wall = time.time()
        os.kill(pid, signal.SIGSTOP)

        def resume():
            # stopped for STALL_FOR_S, or until supervision has killed it (after unhealthy_after_s), if sooner
            deadline = time.monotonic() + STALL_FOR_S
            while time.monotonic() < deadline and not any(
                    e["component"] == "etcd" and e["event"] == "server-exited" and e["time"] >= wall
                    for e in events(run_dir)):
                time.sleep(0.5)
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        return "etcd", resume
    raise ValueError(fault)


def run_deployment(label: str, launch_args: list[str], faults: list[str], args) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="tk-bench-heal-") as tmp:
        env = {"TK_RUNS_DIR": str(Path(tmp) / "runs")}
        proc = tk("launch", str(RECIPE), *launch_args, "--json", env=env)
        if proc.returncode != 0:
            raise SystemExit(f"launch failed: {proc.stderr[-2000:]}")
        record = json.loads(proc.stdout)
        run_dir, endpoint = record["run_dir"], record["endpoint"]
        ports = {s["name"]: s["port"] for s in record["servers"]}
        rows = []
        load = ClosedLoopLoad(endpoint, record["model"], concurrency=args.concurrency).start()
        try:
            for fault in faults:
                time.sleep(args.phase)
                restarts = {s["name"]: s.get("restarts", 0) for s in status(env).get("servers", [])}
                t_fault, wall_fault = time.monotonic(), time.time()
                victim, finish = inject(fault, run_dir, ports, env)
                if label == "fail-fast":
                    time.sleep(args.phase)
                    finish()
                    recover_s = None
                else:
                    finish()
                    recover_s = wait_recovered(env, victim, 120, restarts.get(victim, 0))
                    recover_s = None if recover_s is None else time.monotonic() - t_fault
                t_back = t_fault + (recover_s if recover_s is not None else args.phase)
                if os.environ.get("TK_BENCH_DEBUG"):
                    print(json.dumps(events(run_dir)[-12:], indent=0), file=sys.stderr)
                rows.append({"policy": label, "fault": fault, "t_fault": t_fault, "t_back": t_back,
                             "recover_s": recover_s, "detect_s": detected_after(run_dir, victim, wall_fault)})
                time.sleep(args.phase)
        finally:
            records = load.stop()
            tk("stop", run_dir, env=env, timeout=120)
    for row in rows:
        t_fault, t_back = row["t_fault"], row["t_back"]
        row["before"] = good_per_s(records, t_fault - args.phase, t_fault)
        row["during"] = good_per_s(records, t_fault, t_back)
        row["after"] = good_per_s(records, t_back, t_back + args.phase)
        row["failed"] = sum(1 for r in records if not r.ok and t_fault <= r.t_end < t_back + args.phase)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--phase", type=float, default=8.0, help="seconds measured before and after each fault")
    ap.add_argument("--slurm", action="store_true", help="the dev Slurm cluster instead of the local backend")
    ap.add_argument("--only", default="kill,wedge,fail-fast,etcd,outage",
                    help="comma-separated: kill, wedge, fail-fast, etcd, outage (outage needs --slurm)")
    args = ap.parse_args()
    only = set(args.only.split(","))
    backend = ["--set", "cluster.partition=dev"] if args.slurm else ["--local"]
    if args.slurm and not os.environ.get("SLURM_CONF"):  # the dev cluster's (scripts/dev-slurm up)
        os.environ["SLURM_CONF"] = subprocess.run([str(ROOT / "scripts" / "dev-slurm"), "env"], capture_output=True,
                                                  text=True).stdout.strip().split("=", 1)[1].strip("'\"")
    rows = []
    restart_faults = [f for f, key in (("kill gen-1", "kill"), ("kill ctx-1", "kill"), ("wedge gen-0", "wedge"))
                      if key in only]
    if args.slurm and "outage" in only:
        restart_faults.append("outage")
    if restart_faults:
        rows += run_deployment("restart", [*backend, "--set", f"supervision.stall_after_s={STALL_S}"],
                               restart_faults, args)
    if "fail-fast" in only:
        rows += run_deployment("fail-fast", [*backend, "--fail-fast"], ["kill gen-1"], args)
    if "etcd" in only:
        rows += run_deployment("restart", [*backend, "--set", "membership.storage=etcd",
                                           "--set", "membership.etcd_port=28479",
                                           "--set", f"supervision.unhealthy_after_s={ETCD_UNHEALTHY_S}"],
                               ["etcd stall"], args)
    print(f"{'policy':<10} {'fault':<12} {'good/s before':>13} {'during':>8} {'after':>8} "
          f"{'during/before':>13} {'after/before':>12} {'failed':>7} {'detect s':>8} {'recover s':>9}")
    for r in rows:
        def ratio(x: float, r: dict = r) -> str:
            return f"{x / r['before']:.2f}" if r["before"] else "-"
        recover = f"{r['recover_s']:.1f}" if r["recover_s"] is not None else "never"
        detect = f"{r['detect_s']:.1f}" if r["detect_s"] is not None else "-"
        print(f"{r['policy']:<10} {r['fault']:<12} {r['before']:>13.1f} {r['during']:>8.1f} {r['after']:>8.1f} "
              f"{ratio(r['during']):>13} {ratio(r['after']):>12} {r['failed']:>7} {detect:>8} {recover:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
