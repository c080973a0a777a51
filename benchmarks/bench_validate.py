#!/usr/bin/env python3
"""The validator's KV transfer bandwidth, side by side with a minimal NIXL transfer and a memory copy.

For one request of N tokens with 128-token blocks (the stand-in recipe's 2 KiB per token: 256 KiB per
descriptor), in one run and with the same UCX environment:
  - validator   `tk validate cluster standin-2p2d --local --nodes 2` (prepared descriptor lists, one
                descriptor per block, scattered block tables, every transfer verified in between)
  - minimal     two bare NIXL agents, one single-descriptor WRITE/READ of the same bytes, nothing else
  - minimal+check  the same, with a numpy pass over the bytes between two transfers, as the validator
                verifies every transfer: on shared VMs a transfer after other work runs from colder caches
  - minimal cold   the same single-descriptor transfers, each into its own fresh region of the peer
                (no region written twice), as every validator transfer lands in blocks the destination
                has just poisoned: the back-to-back minimal rewrites one region that stays in cache
  - memcpy      numpy copy of the same bytes in one process
Each figure is bytes / median latency over the timed transfers (post -> DONE for NIXL). Rounds are
interleaved (validator, minimal, memcpy, repeat) so machine noise hits them alike; the median of the
rounds is printed with the ratios. Aim: validator >= 90 % of minimal.

Usage: python benchmarks/bench_validate.py [--tokens 8192] [--iterations 20] [--rounds 3]
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
BYTES_PER_TOKEN = 2048  # standin-2p2d: tk/standin-tiny, 4 layers x 2 KV heads x 64 x bf16 x K/V
TPB = 128

MINIMAL = r'''
import json, os, sys, time
import numpy as np
role, rdv, nbytes, iters, warmup, op, check, regions = (
    sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6],
    sys.argv[8] == "check", int(sys.argv[9]))
for k, v in json.loads(sys.argv[7]).items():
    os.environ[k] = v
from nixl_cu12._api import nixl_agent, nixl_agent_config
me, peer_role = ("ini", "tgt") if role == "ini" else ("tgt", "ini")
ag = nixl_agent(f"bench-{me}-{os.getpid()}", nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
buf = np.ones(regions * nbytes // 8, dtype=np.uint64)  # the initiator uses the first region only
ag.register_memory([(buf.ctypes.data, regions * nbytes, 0, "")], "DRAM")
def put(name, data):
    with open(f"{rdv}/{name}.tmp", "wb") as f: f.write(data)
    os.replace(f"{rdv}/{name}.tmp", f"{rdv}/{name}")
put(f"{me}.md", ag.get_agent_metadata()); put(f"{me}.addr", str(buf.ctypes.data).encode())
deadline = time.time() + 60
while not os.path.exists(f"{rdv}/{peer_role}.addr"):
    assert time.time() < deadline; time.sleep(0.01)
peer = ag.add_remote_agent(open(f"{rdv}/{peer_role}.md", "rb").read())
addr = int(open(f"{rdv}/{peer_role}.addr").read())
if role == "tgt":
    while not os.path.exists(f"{rdv}/done"):
        ag.get_new_notifs(); time.sleep(0.001)
    sys.exit(0)
local = ag.get_xfer_descs([(buf.ctypes.data, nbytes, 0)], "DRAM")
remotes = [ag.get_xfer_descs([(addr + j * nbytes, nbytes, 0)], "DRAM") for j in range(regions)]
lat = []
for i in range(warmup + iters):
    if check:  # what the validator does between two transfers: a vectorised pass over the same bytes
        assert not (buf[:nbytes // 8] != (buf[:nbytes // 8] + np.uint64(0))).any()
    h = ag.initialize_xfer(op, local, remotes[i % regions], peer)
    t0 = time.perf_counter()
    st = ag.transfer(h)
    while st == "PROC":
        st = ag.check_xfer_state(h)
    dt = time.perf_counter() - t0
    assert st == "DONE", st
    h.release()
    if i >= warmup:
        lat.append(dt)
put("done", b"")
print(json.dumps(lat))
'''


def median_gbps(nbytes: int, latencies: list) -> float:
    return nbytes / statistics.median(latencies) / 1e9


def run_validator(tokens: int, iterations: int, warmup: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "toolkit.cli", "validate", "cluster", str(ROOT / "recipes" / "standin-2p2d.yaml"),
             "--local", "--nodes", "2", "--set", f"kv_transfer.tokens_per_block={TPB}", "--lengths", str(tokens),
             "--iterations", str(iterations), "--warmup", str(warmup), "--no-sweep", "--max-memory-mb", "1024",
             "--run-dir", f"{tmp}/run", "--json"],
            capture_output=True, text=True, timeout=600, env={**os.environ, "TK_RUNS_DIR": tmp}, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"validator failed:\n{proc.stderr[-2000:]}")
        report = json.loads(proc.stdout)
    out = {}
    for p in report["pairs"]:
        (x,) = p["lengths"]
        out[p["op"]] = {"gbps": x["gbps"], "bytes": x["bytes"], "descriptors": x["descriptors"]}
    return out


def run_minimal(nbytes: int, iterations: int, warmup: int, op: str, env: dict, check: bool = False,
                cold: bool = False) -> float:
    regions = warmup + iterations if cold else 1
    with tempfile.TemporaryDirectory() as rdv:
        args = [str(nbytes), str(iterations), str(warmup), op, json.dumps(env), "check" if check else "-",
                str(regions)]
        tgt = subprocess.Popen([sys.executable, "-c", MINIMAL, "tgt", rdv, *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        ini = subprocess.run([sys.executable, "-c", MINIMAL, "ini", rdv, *args], capture_output=True, text=True,
                             timeout=300, check=False)
        tgt.wait(timeout=60)
        if ini.returncode != 0:
            raise SystemExit(f"minimal transfer failed:\n{ini.stderr[-2000:]}")
        return median_gbps(nbytes, json.loads(ini.stdout.strip().splitlines()[-1]))


def run_memcpy(nbytes: int, iterations: int, warmup: int) -> float:
    import numpy as np

    src = np.ones(nbytes // 8, dtype=np.uint64)
    dst = np.zeros_like(src)
    lat = []
    for i in range(warmup + iterations):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        dt = time.perf_counter() - t0
        if i >= warmup:
            lat.append(dt)
    return median_gbps(nbytes, lat)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192, help="request length (a multiple of 128)")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from toolkit.api import load_plan

    env = {k: v for k, v in load_plan("standin-2p2d", ()).context.env.items() if k.startswith("UCX_")}
    nbytes = args.tokens * BYTES_PER_TOKEN
    rows = {k: [] for k in ("validator WRITE", "validator READ", "minimal WRITE", "minimal READ",
                            "minimal+check WRITE", "minimal+check READ", "minimal cold WRITE", "minimal cold READ",
                            "numpy memcpy")}
    descriptors = None
    for _ in range(args.rounds):
        v = run_validator(args.tokens, args.iterations, args.warmup)
        assert v["WRITE"]["bytes"] == nbytes, v
        descriptors = v["WRITE"]["descriptors"]
        rows["validator WRITE"].append(v["WRITE"]["gbps"])
        rows["validator READ"].append(v["READ"]["gbps"])
        rows["minimal WRITE"].append(run_minimal(nbytes, args.iterations, args.warmup, "WRITE", env))
        rows["minimal READ"].append(run_minimal(nbytes, args.iterations, args.warmup, "READ", env))
        rows["minimal+check WRITE"].append(run_minimal(nbytes, args.iterations, args.warmup, "WRITE", env, True))
        rows["minimal+check READ"].append(run_minimal(nbytes, args.iterations, args.warmup, "READ", env, True))
        rows["minimal cold WRITE"].append(run_minimal(nbytes, args.iterations, args.warmup, "WRITE", env, cold=True))
        rows["minimal cold READ"].append(run_minimal(nbytes, args.iterations, args.warmup, "READ", env, cold=True))
        rows["numpy memcpy"].append(run_memcpy(nbytes, args.iterations, args.warmup))
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"{nbytes / 2**20:.0f} MiB per request ({args.tokens} tokens x {BYTES_PER_TOKEN} B), validator: "
          f"{descriptors} descriptors of {TPB * BYTES_PER_TOKEN // 1024} KiB; minimal: 1 descriptor; env {env}")
    print(f"{args.rounds} round(s) x {args.iterations} timed transfers; GB/s = bytes / median latency; "
          f"median over rounds (all rounds in brackets)")
    for name, v in med.items():
        print(f"  {name:<20} {v:8.3f} GB/s   [{', '.join(f'{x:.3f}' for x in rows[name])}]")
    for op in ("WRITE", "READ"):
        print(f"  validator / minimal {op:<5}        {med[f'validator {op}'] / med[f'minimal {op}']:7.1%}   "
              "(minimal: back-to-back transfers)")
        print(f"  validator / minimal+check {op:<5}  {med[f'validator {op}'] / med[f'minimal+check {op}']:7.1%}   "
              "(minimal with a numpy pass over the bytes between transfers, the validator's cadence)")
        print(f"  validator / minimal cold {op:<5}   {med[f'validator {op}'] / med[f'minimal cold {op}']:7.1%}   "
              "(minimal, every transfer into a region not written before)")
        print(f"  minimal {op:<5} / memcpy            {med[f'minimal {op}'] / med['numpy memcpy']:7.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
