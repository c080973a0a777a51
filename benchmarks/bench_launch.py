#!/usr/bin/env python3
"""Launch-to-healthy time and the proxy's added latency, for the 2+2 stand-in on the dev Slurm cluster.

Measured side by side in one run and printed as ratios:
  - launch-to-healthy: `tk launch recipes/standin-2p2d.yaml` from the command until it prints the endpoint
    (submit, pending, 4 servers healthy, proxy healthy, one smoke request), against the start-up of one
    stand-in server on its own (the floor any launch pays once);
  - per-request latency through the proxy (context leg + NIXL KV transfer + generation leg) against the
    same request sent directly to an aggregated stand-in server, interleaved request by request.

Usage: python benchmarks/bench_launch.py [--launches 3] [--requests 40] [--local]
Brings the dev cluster up (scripts/dev-slurm up --nodes 4) unless --local; stops every run it starts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "standin-2p2d.yaml"
MODEL = "tk/standin-tiny"
PROMPT = " ".join(f"token{i}" for i in range(200))


def tk(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit.cli", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def phases(run_dir: str) -> dict[str, float]:
    """When tk's run record first entered each state (submitted, pending, starting, ready)."""
    out: dict[str, float] = {}
    for t, state, _ in json.loads((Path(run_dir) / "run.json").read_text()).get("history", []):
        out.setdefault(state, t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--local", action="store_true", help="local backend instead of the dev Slurm cluster")
    args = ap.parse_args()

    from toolkit.client import complete
    from toolkit.standin.baseline import AggregatedServer

    if not args.local:
        up = subprocess.run([str(ROOT / "scripts" / "dev-slurm"), "up", "--nodes", "4"], capture_output=True,
                            text=True, timeout=300)
        if up.returncode != 0:
            print(up.stderr, file=sys.stderr)
            return 1
        conf = subprocess.run([str(ROOT / "scripts" / "dev-slurm"), "env"], capture_output=True, text=True)
        os.environ["SLURM_CONF"] = conf.stdout.strip().split("=", 1)[1]
    backend = "local" if args.local else "slurm"

    with tempfile.TemporaryDirectory(prefix="tk-bench-") as tmp:
        os.environ["TK_RUNS_DIR"] = str(Path(tmp) / "runs")
        launch_s, single_s = [], []
        for i in range(args.launches):
            # one stand-in on its own: interpreter, imports, NIXL agent, HTTP listener
            t0 = time.perf_counter()
            with _single(Path(tmp) / f"single{i}"):
                single_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            proc = tk("launch", str(RECIPE), "--json", *(["--local"] if args.local else []))
            elapsed = time.perf_counter() - t0
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return 1
            record = json.loads(proc.stdout)
            launch_s.append(elapsed)
            p = phases(record["run_dir"])
            detail = ", ".join(f"{a} -> {b} {p[b] - p[a]:.2f}s" for a, b in (("submitted", "starting"),
                                                                             ("starting", "ready")) if a in p and b in p)
            print(f"  launch {i + 1}: {elapsed:.2f}s to healthy ({detail})", file=sys.stderr)
            last = i == args.launches - 1
            if last:
                latencies = _proxy_vs_direct(record, Path(tmp), args.requests, complete, AggregatedServer)
            stop = tk("stop", record["name"], timeout=120)
            if stop.returncode != 0:
                print(stop.stderr, file=sys.stderr)
                return 1

    single, launch = statistics.median(single_s), statistics.median(launch_s)
    via_proxy, direct = latencies
    print(f"\n{backend} backend, {args.launches} launches, {args.requests} requests of {len(PROMPT.split())} words "
          f"(median wall time)")
    print(f"  {'one stand-in server to healthy':<46} {single * 1000:9.0f} ms   1.00x")
    print(f"  {'tk launch 2 ctx + 2 gen + proxy to healthy':<46} {launch * 1000:9.0f} ms   {launch / single:.2f}x")
    print(f"  {'request direct to an aggregated server':<46} {direct * 1000:9.2f} ms   1.00x")
    print(f"  {'request through the proxy (disaggregated)':<46} {via_proxy * 1000:9.2f} ms   "
          f"{via_proxy / direct:.2f}x   (+{(via_proxy - direct) * 1000:.2f} ms per request)")
    return 0


class _single:
    """One stand-in server with the generation role's options, started and stopped."""

    def __init__(self, workdir: Path):
        self.workdir = workdir

    def __enter__(self):
        import yaml

        from toolkit.plan import build_plan
        from toolkit.recipe import load_recipe
        from toolkit.render import render_files
        from toolkit.standin.baseline import AggregatedServer

        options = yaml.safe_load(render_files(build_plan(load_recipe(RECIPE)))["gen.yaml"])
        options.pop("cache_transceiver_config", None)
        self.server = AggregatedServer(MODEL, options, self.workdir)
        return self.server

    def __exit__(self, *exc):
        self.server.close()


def _proxy_vs_direct(record: dict, tmp: Path, n: int, complete, AggregatedServer) -> tuple[float, float]:
    with AggregatedServer.like(Path(record["run_dir"]) / "gen.yaml", tmp / "baseline", model=MODEL) as baseline:
        for url in (record["endpoint"], baseline.url):  # warm-up: connections, NIXL metadata exchange
            for _ in range(3):
                complete(url, MODEL, PROMPT, max_tokens=8)
        via_proxy, direct = [], []
        for _ in range(n):
            for url, samples in ((record["endpoint"], via_proxy), (baseline.url, direct)):
                t0 = time.perf_counter()
                complete(url, MODEL, PROMPT, max_tokens=8)
                samples.append(time.perf_counter() - t0)
    return statistics.median(via_proxy), statistics.median(direct)


if __name__ == "__main__":
    sys.exit(main())
