#!/usr/bin/env python3
"""tk bench's own overhead over a bare aiperf run of the same workload, side by side in one run.

One local deployment of recipes/standin-lab-1p1d.yaml (the stand-in with emulated timing of Llama-3.1-8B on an
H100, so requests take the time a GPU would and the numbers are not the CPU's noise). Then, alternating, ROUNDS
times each: `tk bench RUN` (aiperf as its load engine, plus tk's counters before and after, the verdict and the
report) and a bare `aiperf profile` with exactly the command line tk bench gives it (toolkit.bench.workload
.aiperf_argv). Compared: aiperf's request throughput and TTFT p50 / p99 as each run's aiperf export reports
them, and each run's wall time. Target: tk bench within 5 % of bare aiperf on request throughput and TTFT.

Usage: python benchmarks/bench_tk_bench.py [--rounds 4] [--isl 256] [--osl 32] [--concurrency 4] [--requests 64]
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
sys.path.insert(0, str(ROOT))

RECIPE = ROOT / "recipes" / "standin-lab-1p1d.yaml"


def tk(*args: str, env: dict, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit.cli", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env={**os.environ, **env})


def numbers(export: Path) -> dict:
    doc = json.loads(export.read_text())
    return {"req_s": doc["request_throughput"]["avg"], "ttft_p50": doc["time_to_first_token"]["p50"],
            "ttft_p99": doc["time_to_first_token"]["p99"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4, help="an even number puts each first equally often")
    ap.add_argument("--isl", type=int, default=256)
    ap.add_argument("--osl", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=64)
    args = ap.parse_args()

    from toolkit.bench import find_aiperf
    from toolkit.bench.workload import aiperf_argv, build_workload
    from toolkit.resources import package_path

    with tempfile.TemporaryDirectory(prefix="tk-bench-overhead-") as tmp:
        env = {"TK_RUNS_DIR": str(Path(tmp) / "runs")}
        proc = tk("launch", str(RECIPE), "--local", "--fail-fast", "--json", env=env)
        if proc.returncode != 0:
            raise SystemExit(f"launch failed:\n{proc.stderr[-2000:]}")
        run = json.loads(proc.stdout)
        tokenizer = run["tokenizer"] or str(package_path("standin/tokenizer"))
        cell = build_workload("fixed", isl=args.isl, osl=args.osl, concurrency=(args.concurrency,),
                              requests=args.requests).cells[0]
        rows = {"tk bench": [], "aiperf": []}
        try:
            for r in range(args.rounds):
                order = ("tk bench", "aiperf") if r % 2 == 0 else ("aiperf", "tk bench")
                for who in order:
                    t0 = time.monotonic()
                    if who == "tk bench":
                        out = tk("bench", run["run_dir"], "--isl", str(args.isl), "--osl", str(args.osl),
                                 "--concurrency", str(args.concurrency), "--requests", str(args.requests),
                                 "--json", env=env)
                        if out.returncode != 0:
                            raise SystemExit(f"tk bench exited {out.returncode}:\n{out.stderr[-2000:]}")
                        bench_dir = Path(json.loads(out.stdout)["bench_dir"])
                        export = next((bench_dir / "aiperf").glob("*/profile_export_aiperf.json"))
                    else:
                        out_dir = Path(tmp) / f"bare-{r}"
                        argv = aiperf_argv(cell, aiperf=find_aiperf(), url=run["endpoint"], model=run["model"],
                                           tokenizer=tokenizer, out_dir=str(out_dir))
                        bare = subprocess.run(argv, capture_output=True, text=True, timeout=900)
                        if bare.returncode != 0:
                            raise SystemExit(f"aiperf exited {bare.returncode}:\n{bare.stderr[-2000:]}")
                        export = out_dir / "profile_export_aiperf.json"
                    rows[who].append({**numbers(export), "wall_s": time.monotonic() - t0})
        finally:
            tk("stop", run["run_dir"], env=env, timeout=120)

    for r in range(args.rounds):
        print(f"round {r}: " + "  ".join(f"{who} {x['req_s']:.2f} req/s, TTFT p50 {x['ttft_p50']:.1f} ms"
                                         for who, x in ((w, rows[w][r]) for w in ("aiperf", "tk bench"))))
    med = {who: {k: statistics.median(x[k] for x in runs) for k in runs[0]} for who, runs in rows.items()}
    print(f"{args.rounds} rounds each, alternating; ISL {args.isl}, OSL {args.osl}, concurrency {args.concurrency}, "
          f"{args.requests} requests; medians")
    print(f"{'':<10} {'req/s':>8} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'wall s':>8}")
    for who in ("aiperf", "tk bench"):
        m = med[who]
        print(f"{who:<10} {m['req_s']:>8.2f} {m['ttft_p50']:>12.2f} {m['ttft_p99']:>12.2f} {m['wall_s']:>8.1f}")
    a, t = med["aiperf"], med["tk bench"]
    print(f"{'ratio':<10} {t['req_s'] / a['req_s']:>8.3f} {t['ttft_p50'] / a['ttft_p50']:>12.3f} "
          f"{t['ttft_p99'] / a['ttft_p99']:>12.3f} {t['wall_s'] / a['wall_s']:>8.3f}   (tk bench / aiperf; "
          "target: req/s and TTFT within 5 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
