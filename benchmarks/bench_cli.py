#!/usr/bin/env python3
"""Start-up and render cost of tk, side by side with a bare interpreter, in one run.

Prints the median wall time of each and its ratio to `python -c pass`:
  - `tk --help` (must stay light: no pydantic, rich, nixl, numpy or torch at import)
  - `tk render` of every shipped recipe, in one process
Usage: python benchmarks/bench_cli.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RENDER_ALL = """
import sys, tempfile
from pathlib import Path
from toolkit.plan import build_plan
from toolkit.recipe import load_recipe
from toolkit.render import render
out = Path(sys.argv[1])
for path in sorted(Path(sys.argv[2]).glob('*.yaml')):
    render(build_plan(load_recipe(path)), out / path.stem)
"""


def timed(cmd: list[str], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    py = sys.executable
    recipes = sorted((ROOT / "recipes").glob("*.yaml"))
    with tempfile.TemporaryDirectory() as tmp:
        cases = {
            "python -c pass": [py, "-c", "pass"],
            "tk --help": [py, "-m", "toolkit.cli", "--help"],
            f"render all {len(recipes)} recipes": [py, "-c", RENDER_ALL, tmp, str(ROOT / "recipes")],
        }
        # interleave the cases so machine noise hits them alike
        results = {name: [] for name in cases}
        for _ in range(args.repeat):
            for name, cmd in cases.items():
                results[name].append(timed(cmd, 1))
    base = statistics.median(results["python -c pass"])
    print(f"{'case':<28} {'median ms':>10} {'x python -c pass':>18}")
    for name, samples in results.items():
        med = statistics.median(samples)
        print(f"{name:<28} {med * 1e3:>10.1f} {med / base:>18.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
