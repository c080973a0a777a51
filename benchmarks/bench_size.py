"""tk size's wall time against a bare aiconfigurator run of the same search, side by side.

    PYTHONPATH=. python3 benchmarks/bench_size.py [--repeat 3]

Both run in a fresh interpreter each time (imports included, as a user pays them): the bare run is
aiconfigurator's own Python API (cli_default) with the same model config, system, GPUs, ISL/OSL and SLA that
tk passes; tk's is `python3 -m toolkit.cli size ... --json`. Cases: Llama-3.1-8B on 8 and Llama-3.3-70B on 16
H100, DeepSeek-V3 on 16 H200 (MoE with attention DP). Target: tk adds under 10 %."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

# (tk model, aiconfigurator model, system, GPUs, ISL, OSL, TTFT, TPOT): two dense searches, and the MoE
# attention-DP one of newcomer B1 (tk translates, re-checks and memory-plans every candidate it considers)
CASES = [
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B", "h100_sxm", 8, 4000, 500, 1000, 30),
    ("meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B", "h100_sxm", 16, 4000, 500, 1000, 30),
    ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3", "h200_sxm", 16, 8000, 1000, 2000, 40),
]

BARE = """
import logging, contextlib, io
from aiconfigurator.cli.api import cli_default
logging.getLogger("aiconfigurator").setLevel(logging.ERROR); logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
with contextlib.redirect_stdout(io.StringIO()):
    cli_default(model_path={m!r}, total_gpus={g}, system={s!r}, backend="trtllm", isl={i}, osl={o}, ttft={t}, tpot={p}, top_n=5)
"""


INNER: list[float] = []  # tk's own time / aiconfigurator's search, measured inside each tk run (timings_s)


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    took = time.perf_counter() - t
    if "toolkit.cli" in cmd:
        timings = json.loads(proc.stdout)["timings_s"]
        INNER.append(timings["tk_overhead"] / timings["aiconfigurator_search"])
    return took


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"{'model':<36} {'GPUs':>4} {'aiconfigurator s':>17} {'tk size s':>10} {'overhead':>9}")
    worst = 0.0
    for tk_model, aic_model, system, gpus, isl, osl, ttft, tpot in CASES:
        bare_cmd = [sys.executable, "-c", BARE.format(m=aic_model, g=gpus, s=system, i=isl, o=osl, t=ttft, p=tpot)]
        tk_cmd = [sys.executable, "-m", "toolkit.cli", "size", "--model", tk_model, "--system", system,
                  "--gpus", str(gpus), "--isl", str(isl), "--osl", str(osl), "--ttft", str(ttft), "--tpot",
                  str(tpot), "--json"]
        bare, tk = [], []
        for _ in range(args.repeat):  # alternated, so a change in the machine's load hits both alike
            bare.append(timed(bare_cmd))
            tk.append(timed(tk_cmd))
        b, k = statistics.median(bare), statistics.median(tk)
        worst = max(worst, k / b - 1)
        print(f"{tk_model:<36} {gpus:>4} {b:>17.2f} {k:>10.2f} {k / b - 1:>+9.1%}")
    print(f"worst overhead {worst:+.1%} (median of {args.repeat} alternated runs each, fresh interpreters; "
          "target < +10%)")
    print(f"inside tk size: tk's own work (checks, transfer term, ranking, recipe, plan re-check) = "
          f"{statistics.median(INNER):+.1%} of aiconfigurator's search (median, worst {max(INNER):+.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
