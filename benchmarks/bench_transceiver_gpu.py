#!/usr/bin/env python3
"""On one GPU machine, no network: what `tk validate cluster` measures, beside what NIXL and the GPU can do.

Two agent processes on the same GPU (the validator's own agent, validation/agent.py: preflight, VRAM pools
registered once, rendezvous through files, the recipe's role environment applied before NIXL is imported) run,
round after round, in a rotating order, each a context -> generation WRITE of the recipe's longest request (or
--tokens) of one rank pair:

  validator C++        `tk validate cluster`'s request as TensorRT-LLM's C++ transceiver moves it (1.0-1.2, 1.3 with
                       transceiver_runtime CPP): the blocks gathered into a staging slice, ONE descriptor WRITE into the
                       destination's slice, scattered there; every byte verified on the device (torch or CuPy);
                       gather and scatter timed apart from the WRITE
  raw, same (C++)      the same staged descriptor, bare NIXL calls (make_prepped_xfer, transfer, poll to DONE)
  validator Python     the same request as the Python transceiver's mapper lists it (1.3 auto, 1.4): one descriptor per
                       block, or per block x layer x K/V where the roles' TP differ (the recipe's geometry)
  raw, same (Python)   the same lists, bare NIXL calls
  raw, one descriptor  the request's bytes in one descriptor: what the link can do with them
  device copy          one copy of the same bytes on the GPU (torch/CuPy; a host memcpy with --memory dram)

GB/s = request bytes / median latency (post -> DONE on the initiator); median [min-max] over the kept rounds (the
first is discarded: lazy connections, first touch); ratios paired within each round. Target (issue 29): validator
>= 90 % of raw NIXL on the same descriptors, both models. --with-validate also times `tk validate cluster RECIPE
--local --nodes 4 --memory vram --no-sweep` (target: under 2 minutes).

Without a GPU it says so and stops (exit 2); --memory dram runs the same comparison on host memory (no device copy,
the transport is then a CPU copy: the figures say nothing about a GPU). docs/validate.md says how to run it on a GPU
machine, with the nixl-cu13 wheel carried along.

Usage: python benchmarks/bench_transceiver_gpu.py [--recipe llama-3.1-8b-1node] [--tokens N] [--rounds 6]
       [--iterations 10] [--warmup 2] [--max-memory-mb 4096] [--memory auto|vram|dram] [--with-validate]
       [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator.states import Role  # noqa: E402  (the standard library only, as the agents)

KINDS = ("validator C++", "raw, same (C++)", "validator Python", "raw, same (Python)", "raw, one descriptor",
         "device copy")
TARGET = 0.90
# Bounds, so that everything ends inside the documented command's `timeout 500` (docs/validate.md), itself inside the
# device machine's 10-minute command: the agents' own deadline (each agent's watchdog), the grace the coordinator
# gives them after it, and the 4-agent `tk validate cluster` of --with-validate (its --timeout; the coordinator's
# own 30 s after it; then this process gives up on it).
AGENT_DEADLINE_S = 200.0
AGENT_GRACE_S = 30.0
VALIDATE_TIMEOUT_S = 180
VALIDATE_GIVE_UP_S = VALIDATE_TIMEOUT_S + 60


# -- the agent side --------------------------------------------------------------------------------------------

def _raw_one(agent, channel, transfers, peer: str, tag: str, nbytes: int, total: int, warmup: int) -> dict | None:
    """nbytes in one descriptor from the start of both pools, bare NIXL WRITEs (the destination polls its
    notifications as the validator's does); the initiator returns its latencies."""
    from benchmarks.bench_validate import raw_target, timed_posts
    from validation import messages as msg

    if agent.role != Role.CTX:
        raw_target(channel, peer, 0, tag, total, write=True)
        return None
    channel.wait(peer, 0, (msg.ready_prefix(tag),), 60, "the raw loop's target")
    key = ("flat", 1, nbytes)
    local, remote = transfers.dlist(agent.id, key), transfers.dlist(peer, key)
    lat = timed_posts(agent, transfers, "WRITE", local, remote, lambda it: ([0], [0]),
                      lambda it: msg.written(tag, it).encode(), total, warmup)
    channel.send(peer, msg.end(tag))
    return {"latencies_s": lat}


def _gpu_work(agent, channel, transfers) -> None:
    from benchmarks.bench_validate import _raw_loop
    from validation import messages as msg
    from validation.pair import PairRunner

    b = agent.p["bench"]
    runner = PairRunner(agent, transfers, channel)
    ctx, gen = agent.p["rounds"][0][0]
    peer = gen if agent.id == ctx else ctx
    tokens, tpb = agent.p["lengths"][0], agent.p["geometry"]["tokens_per_block"]
    iters, warm = agent.p["iterations"], agent.p["warmup"]
    channel.send(peer, msg.hello(0))
    channel.wait(peer, 0, (msg.hello(0),), 60, f"{peer} to start")
    out = agent.result.setdefault("bench", [])
    for rnd in range(b["rounds"]):
        shift = rnd % len(KINDS)
        for kind in KINDS[shift:] + KINDS[:shift]:
            staged = "C++" in kind
            code = f"W{rnd}{KINDS.index(kind)}"
            req = runner.request(rnd, ctx, gen, "forward", code, 0, tokens, tpb, iters, warm, staged=staged)
            one = kind in ("raw, one descriptor", "device copy")
            row = {"round": rnd, "kind": kind, "bytes": req.nbytes, "descriptors": 1 if one else req.entry["descriptors"]}
            if kind.startswith("validator"):
                entry = runner.run_op(rnd, ctx, gen, peer, "forward", "WRITE", code, 0, tokens, tpb, iters, warm,
                                      staged=staged)
                if entry.get("error"):
                    raise RuntimeError(f"{kind}: {entry['error']}")
                row.update(latencies_s=entry["latencies_s"], gather_s=entry["gather_s"],
                           scatter_s=entry["scatter_s"], transfers_verified=entry["transfers_verified"])
            elif kind.startswith("raw, same"):
                req.tag = msg.tag(rnd, f"{code}x", 0)
                row.update(_raw_loop(agent, channel, transfers, req, "WRITE", peer) or {})
            elif kind == "raw, one descriptor":
                row.update(_raw_one(agent, channel, transfers, peer, msg.tag(rnd, f"{code}o", 0), req.nbytes,
                                    warm + iters, warm) or {})
            elif agent.id == ctx:  # device copy: on the context agent's GPU, the same bytes
                lat = [agent.pool.copy_seconds(0, req.nbytes, req.nbytes) for _ in range(warm + iters)][warm:]
                row.update(latencies_s=lat, how=agent.pool.how)
            if row.get("latencies_s") or row.get("scatter_s"):  # the destination's row carries the scatters
                out.append(row)
        agent.save()


def agent_main(run_dir: str, agent_id: str) -> int:
    from validation.agent import Agent
    from validation.wire import load_params

    code = Agent(load_params(os.path.join(run_dir, "params.json")), agent_id).run(work=_gpu_work)
    sys.stdout.flush()
    os._exit(code)


# -- the coordinator -------------------------------------------------------------------------------------------

def gpu_present() -> tuple[bool, str]:
    """(a CUDA GPU this process can use, how we know)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False, "nvidia-smi not found"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"nvidia-smi did not answer: {exc}"
    gpus = [ln for ln in out.stdout.splitlines() if ln.startswith("GPU ")]
    return (bool(gpus), gpus[0] if gpus else (out.stderr or out.stdout).strip()[:200] or "no GPU listed")


def nixl_version() -> str | None:
    from validation.probes import import_nixl

    mod, how = import_nixl()
    return None if mod is None else f"{how['module']} {how['version']}"


def run(args, memory: str) -> dict:
    from toolkit.api import load_plan
    from toolkit.validate.params import Options, build_params

    plan = load_plan(args.recipe, [f"trtllm_version={args.version}"])  # the C++ transceiver: its staging slices
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as run_dir:
        opts = Options(mode="local", nodes=2, memory=memory, lengths=(args.tokens,) if args.tokens else None,
                       iterations=args.iterations, warmup=args.warmup, sweep=False, curve=False,
                       max_memory_mb=args.max_memory_mb)
        params = build_params(plan, opts, run_dir)
        params["lengths"] = params["lengths"][-1:]  # the longest request only
        params["geometry"]["transfer"]["staged"] = [True]
        params["progress_thread"] = False
        params["bench"] = {"rounds": args.rounds}
        params["timeouts"]["deadline_s"] = args.deadline
        for sub in ("logs", "results", "rendezvous/exited", "rendezvous/done", "rendezvous/unresponsive"):
            os.makedirs(os.path.join(run_dir, sub), exist_ok=True)
        Path(run_dir, "params.json").write_text(json.dumps(params))
        procs = []
        with contextlib.ExitStack() as logs:
            for a in params["agents"]:
                log = logs.enter_context(open(os.path.join(run_dir, "logs", f"{a['id']}.log"), "wb"))
                procs.append((a["id"], subprocess.Popen([sys.executable, __file__, "--agent", run_dir, a["id"]],
                                                        stdout=log, stderr=subprocess.STDOUT,
                                                        stdin=subprocess.DEVNULL, start_new_session=True)))
            try:
                for _, p in procs:
                    p.wait(timeout=args.deadline + AGENT_GRACE_S)
            finally:
                for _, p in procs:  # only the agents this benchmark started, by their process group
                    if p.poll() is None:
                        os.killpg(p.pid, 9)
                        p.wait()
        results = {aid: json.loads(Path(run_dir, "results", f"{aid}.json").read_text()) for aid, _ in procs}
        for aid, res in results.items():
            if res.get("error") or not res.get("final"):
                log = Path(run_dir, "logs", f"{aid}.log").read_text()[-3000:]
                raise SystemExit(f"agent {aid} failed: {res.get('error')}\n{log}")
        rows = [row for res in results.values() for row in res.get("bench", [])]
        g = params["geometry"]
        return {"params": {"recipe": args.recipe, "version": args.version, "tokens": params["lengths"][0],
                           "memory": memory, "layers": g["layers"], "layers_per_rank": g["layers_per_rank"],
                           "tokens_per_block": g["tokens_per_block"], "mode": g["mode"], "notes": g["notes"],
                           "iterations": args.iterations, "warmup": args.warmup, "rounds": args.rounds,
                           "env": {k: v for k, v in params["env"][Role.CTX].items() if k.startswith("UCX_")}},
                "memory": {aid: res.get("memory") for aid, res in results.items()},
                "protocols": [c for res in results.values() for c in res.get("protocols", [])],
                "rows": rows}


def _ms(xs: list) -> float:
    return statistics.median(xs) * 1e3


def _span(xs: list, fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}-{fmt.format(max(xs))}]"


def summarize(data: dict, discard: int = 1) -> tuple[list, dict]:
    by: dict = {}
    rows_of: dict = {}
    for row in data["rows"]:
        if row["round"] >= discard:
            if row.get("latencies_s"):  # the initiator's (the context agent's)
                by.setdefault(row["round"], {})[row["kind"]] = \
                    row["bytes"] / statistics.median(row["latencies_s"]) / 1e9
            rows_of.setdefault(row["kind"], []).append(row)
    full = [r for r in by.values() if all(k in r for k in KINDS)]
    if not full:
        raise SystemExit("no complete round was measured (see the agents' logs)")
    gb = {k: [r[k] for r in full] for k in KINDS}

    def ratio(a: str, b: str) -> list:
        return [r[a] / r[b] for r in full]

    lines = []
    for k in KINDS:
        any_row = next(r for r in rows_of[k] if r.get("latencies_s"))
        shape = (f"{any_row['descriptors']} x {any_row['bytes'] // any_row['descriptors'] / 2**10:,.0f} KiB"
                 if k != "device copy" else f"1 copy ({any_row.get('how', '?')})")
        extra = ""
        if k == "validator C++":
            g = [_ms(r["gather_s"]) for r in rows_of[k] if r.get("gather_s")]
            s = [_ms(r["scatter_s"]) for r in rows_of[k] if r.get("scatter_s")]
            w = [_ms(r["latencies_s"]) for r in rows_of[k] if r.get("latencies_s")]
            extra = (f"  request {statistics.median(g) + statistics.median(w) + statistics.median(s):.3f} ms = gather "
                     f"{statistics.median(g):.3f} + WRITE {statistics.median(w):.3f} + scatter {statistics.median(s):.3f}")
        lines.append(f"  {k:<20} {shape:>22}   GB/s {_span(gb[k])}{extra}")
    verdicts = {
        "validator C++ / raw, same (C++)": ratio("validator C++", "raw, same (C++)"),
        "validator Python / raw, same (Python)": ratio("validator Python", "raw, same (Python)"),
        "raw, same (Python) / raw, one descriptor": ratio("raw, same (Python)", "raw, one descriptor"),
        "raw, one descriptor / device copy": ratio("raw, one descriptor", "device copy"),
    }
    lines.append("  ratios (paired per round, median [min-max]):")
    out = {}
    for name, xs in verdicts.items():
        judged = name.startswith("validator")
        med = statistics.median(xs)
        mark = (f"  {'>=' if med >= TARGET else 'BELOW'} {TARGET:.0%}" if judged else "")
        lines.append(f"    {name:<42} {_span(xs, '{:.1%}')}{mark}")
        out[name] = {"median": med, "min": min(xs), "max": max(xs), "meets_target": (med >= TARGET) if judged else None}
    return lines, {"gbps": {k: statistics.median(v) for k, v in gb.items()}, "ratios": out, "rounds": len(full)}


def run_validate(args, memory: str) -> dict:
    """`tk validate cluster RECIPE --local --nodes 4 --memory MEM --no-sweep`, timed (issue 29: under 2 minutes)."""
    with tempfile.TemporaryDirectory(prefix="bench-gpu-validate-") as tmp:
        cmd = [sys.executable, "-m", "toolkit.cli", "validate", "cluster", args.recipe, "--local", "--nodes", "4",
               "--memory", memory, "--no-sweep", "--timeout", str(VALIDATE_TIMEOUT_S), "--run-dir",
               os.path.join(tmp, "run"), "--json", "--set", f"trtllm_version={args.version}"]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=VALIDATE_GIVE_UP_S, check=False,
                                  stdin=subprocess.DEVNULL, env={**os.environ, "TK_RUNS_DIR": tmp})
        except subprocess.TimeoutExpired as exc:
            tail = (exc.stderr or b"")[-1500:]
            return {"seconds": round(time.monotonic() - t0, 1), "exit_code": None, "passed": False,
                    "failures": [f"did not end within {VALIDATE_GIVE_UP_S} s"],
                    "stderr_tail": tail.decode(errors="replace") if isinstance(tail, bytes) else tail}
        elapsed = time.monotonic() - t0
        try:
            report = json.loads(proc.stdout)
        except ValueError:
            report = None
    return {"seconds": round(elapsed, 1), "exit_code": proc.returncode, "passed": bool(report and report["passed"]),
            "failures": (report or {}).get("failures", [])[:5], "stderr_tail": proc.stderr[-1500:] if not report else ""}


def worst_case_s(args) -> float:
    """The longest this benchmark can run before it prints: the agents' deadline and grace, then --with-validate's
    bound (the setup and the summary take seconds)."""
    return args.deadline + AGENT_GRACE_S + (VALIDATE_GIVE_UP_S if args.with_validate else 0)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent", nargs=2, metavar=("RUN_DIR", "AGENT_ID"), help=argparse.SUPPRESS)
    ap.add_argument("--recipe", default="llama-3.1-8b-1node", help="whose KV geometry (default: ctx TP1 -> gen TP2)")
    ap.add_argument("--version", default="1.2", help="the TensorRT-LLM line the plan is made for (1.2: its C++ "
                                                     "transceiver, whose staging slices the agents register)")
    ap.add_argument("--tokens", type=int, help="request length (default: the recipe's longest admitted input)")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds (the first is discarded)")
    ap.add_argument("--iterations", type=int, default=10, help="timed transfers per kind and round")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-memory-mb", type=int, default=4096, help="per agent (layers are scaled down to fit)")
    ap.add_argument("--memory", choices=("auto", "vram", "dram"), default="auto",
                    help="auto: VRAM when a GPU is here, else say so and stop; dram: exercise it on host memory")
    ap.add_argument("--deadline", type=float, default=AGENT_DEADLINE_S, help="bound on the agents' run, seconds")
    ap.add_argument("--with-validate", action="store_true", help="also time a 4-agent `tk validate cluster --local`")
    ap.add_argument("--json", metavar="FILE", help="also write every latency and the summary here")
    return ap


def main() -> int:
    args = parser().parse_args()
    if args.agent:
        return agent_main(*args.agent)
    have_gpu, gpu = gpu_present()
    memory = args.memory
    if memory == "auto":
        memory = "vram" if have_gpu else ""
    if memory == "vram" and not have_gpu:
        memory = ""
    if not memory:
        print(f"no GPU here ({gpu}): this benchmark compares the validator with raw NIXL and a device copy on a GPU. "
              "Run it on a GPU machine (docs/validate.md: `tk validate cluster` on a GPU), or with --memory dram to "
              "exercise it on host memory (figures of a CPU copy, not of a GPU).", file=sys.stderr)
        return 2
    nixl = nixl_version()
    if nixl is None:
        print("NIXL is not importable here: install the wheel for this CUDA (nixl-cu13 or nixl-cu12), or put the "
              "unpacked one on PYTHONPATH (docs/validate.md, scripts/device-wheels)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    data = run(args, memory)
    lines, summary = summarize(data)
    p = data["params"]
    row = next(r for r in data["rows"] if r["kind"] == "validator Python")
    print(f"device: {gpu if memory == 'vram' else 'host memory (--memory dram)'}; {nixl}; checks on the "
          f"{next(iter(data['memory'].values()))['checks']}")
    print(f"{p['recipe']} (TensorRT-LLM {p['version']} plan), one rank pair, the {p['tokens']}-token request: "
          f"{row['bytes'] / 2**20:.1f} MiB ({p['layers']} of {p['layers_per_rank']} layers; "
          f"tokens_per_block {p['tokens_per_block']}, {p['mode']} lists); UCX env {json.dumps(p['env'])}")
    for note in p["notes"]:
        print(f"note: {note}")
    print(f"{summary['rounds']} rounds kept of {p['rounds']} (first discarded), kinds in rotating order; "
          f"{p['iterations']} timed WRITEs per kind; GB/s = bytes / median latency (post -> DONE)")
    print("\n".join(lines))
    shown = {(c["op"], tuple(c["memory"]), ", ".join(c["protocols"]), ", ".join(c["transports"]))
             for c in data["protocols"]}
    for op, mem, proto, tls in sorted(shown):
        print(f"  UCX: {op} {'->'.join(mem)}: {proto} ({tls})")
    summary["validate"] = run_validate(args, memory) if args.with_validate else None
    if summary["validate"]:
        v = summary["validate"]
        print(f"tk validate cluster {args.recipe} --local --nodes 4 --memory {memory} --no-sweep: "
              f"{'passed' if v['passed'] else 'FAILED'} in {v['seconds']:.0f} s (target: under 120 s)"
              + (f"; {v['failures']}" if v["failures"] else "") + (f"\n{v['stderr_tail']}" if v["stderr_tail"] else ""))
    print(f"({time.monotonic() - t0:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({**data, "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
