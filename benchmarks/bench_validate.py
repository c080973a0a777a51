#!/usr/bin/env python3
"""The validator against a raw NIXL loop on exactly the validator's descriptors, side by side, interleaved.

Two agent processes (one context, one generation: the validator's own agent, validation/agent.py, with
its preflight, registered pools, prepared descriptor lists and rendezvous) run, round after round, for
each direction (context -> generation, generation -> context) and op (WRITE, READ):

  validator  PairRunner.run_op: the request as `tk validate cluster` runs it; transfers in bursts, one per
             destination slot, the pool poisoned before the first burst, every slot verified after each, every byte
  raw        the same request's transfers, in the same order, with the same NIXL calls the engines make
             (make_prepped_xfer on the validator's prepared lists and index arrays, transfer, poll
             check_xfer_state to DONE, release): same registered regions, same scattered block tables, same
             slots, same WRITE notifications; no fill, no check, no handshake between transfers
  raw again  the raw loop once more: raw again / raw is the noise floor of a ratio on this machine now
  raw 1 slot         the raw loop rewriting the first slot's block table every time: on CPU transports a
                     16 MiB working set rewritten back to back stays in the last-level cache
  raw 1 slot paused  the same with a 4 ms sleep between transfers (about one check): what a pause alone
                     costs a copy-based transport on a shared host, whatever runs in it

The kinds run back to back in each round, in a rotating order, so machine noise hits them alike.
Each figure is request bytes / median latency (post -> DONE on the initiator, as the validator reports
it); each round gives a paired ratio validator / raw; the median of the rounds' ratios is printed with
their spread (the first round is discarded: first touch of the pools, lazy connections). Target:
validator >= 95 % of raw, both ops, both directions. The verdict is judged against the control (raw again /
raw: two identical loops, truly 100 %): its noise is how far its median strays from 100 %, or the standard
error of a median of that many rounds given the control's spread, whichever is larger. When that noise is
at least the margin between the validator's median ratio and the target, it could put the ratio on either
side of the target, and the verdict is "inconclusive" rather than met or missed.

On a shared machine run it alone (no deployment, test suite or other benchmark at the same time): the
control ratio shows how much noise is left.

The validator moves what the recipe's TensorRT-LLM transceiver moves (toolkit/facts/transceiver.py): --model lists
(default) is the Python transceiver's descriptor lists (one per block), --model staged the C++ transceiver's one
descriptor per rank pair (the validator gathers before and scatters after each WRITE, outside its timed window; the
raw loop WRITEs the same staged descriptors). READ is compared too, though TensorRT-LLM never READs (the validator
runs it only with --read): what is measured here is the validator's fidelity, op by op. On a GPU,
benchmarks/bench_transceiver_gpu.py puts both models beside raw NIXL, one descriptor and a device copy.

Usage: python benchmarks/bench_validate.py [--tokens 8192] [--tokens-per-block 128] [--iterations 10]
       [--warmup 2] [--rounds 9] [--model lists|staged] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGET = 0.95
TARGET_SHOWN = f"{TARGET * 100:.0f} %"
KINDS = ("validator", "raw", "raw again", "raw 1 slot", "raw 1 slot paused")
PAUSE_S = 0.004  # "raw 1 slot paused": this long between two transfers, about what a check of one slot takes


# -- the agent side (runs in each of the two agent processes) ---------------------------------------------

def raw_target(channel, peer: str, r: int, tag: str, total: int, write: bool) -> None:
    """The passive side of a raw loop: says it is ready, then (WRITE) polls for each transfer's notification exactly as
    the validator's destination does, and waits for the loop's end."""
    from validation import messages as msg
    from validation.pair import TRANSFER_POLL_S

    channel.send(peer, msg.ready(tag, 0, total))
    if write:
        for it in range(total):
            channel.wait(peer, r, (msg.written(tag, it),), 60, f"raw WRITE {it}", poll_s=TRANSFER_POLL_S)
    channel.wait(peer, r, (msg.end_prefix(tag),), 120, "the raw loop's end")


def timed_posts(agent, transfers, op: str, local, remote, indices, notif_of, total: int, warmup: int,
                pause_s: float = 0.0) -> list[float]:
    """``total`` bare NIXL transfers back to back (``indices(it)``: the local and remote descriptor indices,
    ``notif_of(it)``: the notification), each timed from post to DONE (polled in a tight loop); the latencies after
    ``warmup``. pause_s: sleep this long between two transfers (nothing else)."""
    nixl, backends = agent.nixl, transfers.backends
    latencies = []
    for it in range(total):
        if pause_s and it:
            time.sleep(pause_s)
        lidx, ridx = indices(it)
        notif = notif_of(it)
        h = nixl.make_prepped_xfer(op, local, lidx, remote, ridx, notif, backends=backends)
        t0 = time.perf_counter()
        state = nixl.transfer(h, notif)
        while state == "PROC":
            state = nixl.check_xfer_state(h)
        dt = time.perf_counter() - t0
        h.release()
        if state != "DONE":
            raise RuntimeError(f"raw {op} ended in state {state}")
        if it >= warmup:
            latencies.append(dt)
    return latencies


def _raw_loop(agent, channel, transfers, req, op: str, peer: str, one_slot: bool = False,
              pause_s: float = 0.0) -> dict | None:
    """The request's transfers back to back with bare NIXL calls; the initiator returns its latencies.
    one_slot: every transfer into the first slot (one block table rewritten back to back); pause_s: sleep
    this long between two transfers (nothing else)."""
    from validation import messages as msg

    initiator = req.src if op == "WRITE" else req.dst
    if agent.id != initiator:
        raw_target(channel, peer, req.r, req.tag, req.total, write=op == "WRITE")
        return None
    channel.wait(peer, req.r, (msg.ready_prefix(req.tag),), 60, "the raw loop's target")
    local, remote = transfers.dlist(agent.id, req.lists_key), transfers.dlist(peer, req.lists_key)
    lidx, ridx = req.local_remote(op)

    def indices(it: int) -> tuple:
        s = 0 if one_slot else req.slot_of(it)
        return lidx[s], ridx[s]
    latencies = timed_posts(agent, transfers, op, local, remote, indices,
                            lambda it: msg.written(req.tag, it).encode() if op == "WRITE" else b"",
                            req.total, req.warmup, pause_s)
    channel.send(peer, msg.end(req.tag))
    return {"latencies_s": latencies}


def _bench_work(agent, channel, transfers) -> None:
    from validation import messages as msg
    from validation.pair import DIRECTIONS, OPS, PairRunner

    b = agent.p["bench"]
    runner = PairRunner(agent, transfers, channel)
    ctx, gen = agent.p["rounds"][0][0]
    peer = gen if agent.id == ctx else ctx
    tokens, tpb = agent.p["lengths"][0], agent.p["geometry"]["tokens_per_block"]
    channel.send(peer, msg.hello(0))
    channel.wait(peer, 0, (msg.hello(0),), 60, f"{peer} to start")
    out = agent.result.setdefault("bench", [])
    step = 0  # the same on both agents: which kind goes first rotates
    for rnd in range(b["rounds"]):
        for direction in agent.p["directions"]:
            for op, letter in OPS:
                code = f"{letter}{DIRECTIONS[direction]}{rnd}"  # one request (block tables) per round and op
                shift = step % len(KINDS)
                step += 1
                for kind in KINDS[shift:] + KINDS[:shift]:
                    req = runner.request(rnd, ctx, gen, direction, code, 0, tokens, tpb, agent.p["iterations"],
                                         agent.p["warmup"])
                    if kind == "validator":
                        entry = runner.run_op(rnd, ctx, gen, peer, direction, op, code, 0, tokens, tpb,
                                              agent.p["iterations"], agent.p["warmup"])
                        if entry.get("error"):
                            raise RuntimeError(f"validator {direction} {op}: {entry['error']}")
                    else:
                        req.tag = msg.tag(rnd, f"{code}x{KINDS.index(kind)}", 0)  # same blocks, own messages
                        entry = _raw_loop(agent, channel, transfers, req, op, peer, one_slot=kind.startswith("raw 1"),
                                          pause_s=PAUSE_S if kind.endswith("paused") else 0.0)
                    if entry and entry.get("latencies_s"):
                        out.append({"round": rnd, "direction": direction, "op": op, "kind": kind,
                                    "bytes": req.entry["bytes"], "descriptors": req.entry["descriptors"],
                                    "slots": len(req.slots), "latencies_s": entry["latencies_s"],
                                    "transfers_verified": entry.get("transfers_verified")})
        agent.save()


def agent_main(run_dir: str, agent_id: str) -> int:
    from validation.agent import Agent
    from validation.wire import load_params

    code = Agent(load_params(os.path.join(run_dir, "params.json")), agent_id).run(work=_bench_work)
    sys.stdout.flush()
    os._exit(code)


# -- the coordinator ---------------------------------------------------------------------------------

def run(args) -> dict:
    from toolkit.api import load_plan
    from toolkit.validate.params import Options, build_params

    # the transceiver model the validator moves: the Python transceiver's lists (one descriptor per block), or the C++
    # transceiver's one staged descriptor per rank pair (toolkit/facts/transceiver.py)
    version = "1.3.0rc27" if args.model == "lists" else "1.2"  # rc27: the default auto selects Python (NIXL)
    plan = load_plan("standin-2p2d", [f"kv_transfer.tokens_per_block={args.tokens_per_block}",
                                      f"trtllm_version={version}"])
    with tempfile.TemporaryDirectory(prefix="bench-validate-") as run_dir:
        opts = Options(mode="local", nodes=2, lengths=(args.tokens,), iterations=args.iterations, warmup=args.warmup,
                       sweep=False, curve=False, read=True, max_memory_mb=2048)
        params = build_params(plan, opts, run_dir)
        params["bench"] = {"rounds": args.rounds}
        if args.slots:
            params["geometry"]["burst_slots"] = args.slots
        params["timeouts"]["deadline_s"] = 600
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
                    p.wait(timeout=600)
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
        return {"params": {"tokens": args.tokens, "tokens_per_block": args.tokens_per_block, "model": args.model,
                           "iterations": args.iterations, "warmup": args.warmup, "rounds": args.rounds,
                           "env": params["env"]["ctx"], "slots": params["geometry"]["slots"]},
                "rows": rows}


def _gbps(row: dict) -> float:
    return row["bytes"] / statistics.median(row["latencies_s"]) / 1e9


def _span(xs: list, fmt: str) -> str:
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}-{fmt.format(max(xs))}]"


def control_noise(control: list) -> float:
    """How far a median over these rounds may stray from the truth on this machine now, from the control's
    per-round ratios (truly 1): its median's distance from 1, or the standard error of a median of len(control)
    rounds (1.2533 sigma / sqrt(n), sigma estimated robustly as 1.4826 x the median absolute deviation),
    whichever is larger. A single round straying 15 % widens it as much as it should for a median, no more."""
    med = statistics.median(control)
    mad = statistics.median(abs(c - med) for c in control)
    return max(abs(med - 1), 1.2533 * 1.4826 * mad / math.sqrt(len(control)))


def judge(ratio_median: float, noise: float, target: float = TARGET) -> str:
    """"meets", "below" or "inconclusive": the median ratio against the target, unless the control's noise is
    at least the margin between the two (it could put the ratio on either side)."""
    if noise >= abs(ratio_median - target):
        return "inconclusive"
    return "meets" if ratio_median >= target else "below"


def summarize(data: dict, discard: int) -> tuple[list, list]:
    """Per (direction, op): GB/s per kind over the kept rounds, the paired per-round ratios, the verdict."""
    by: dict = {}
    for row in data["rows"]:
        if row["round"] >= discard:
            by.setdefault((row["direction"], row["op"]), {}).setdefault(row["round"], {})[row["kind"]] = _gbps(row)
    lines, verdicts = [], []
    for (direction, op), rounds in sorted(by.items(), key=lambda kv: (kv[0][0] != "forward", kv[0][1] != "WRITE")):
        full = [r for r in rounds.values() if all(k in r for k in KINDS)]
        gb = {k: [r[k] for r in full] for k in KINDS}
        ratio = [r["validator"] / r["raw"] for r in full]
        control = [r["raw again"] / r["raw"] for r in full]
        one = [r["validator"] / r["raw 1 slot"] for r in full]
        paused = [r["raw 1 slot paused"] / r["raw 1 slot"] for r in full]
        med = statistics.median(ratio)
        noise = max(abs(c - 1) for c in control)
        control_med = statistics.median(control)
        control_sd = control_noise(control)
        verdict = judge(med, control_sd)
        shown = {"meets": f">= {TARGET_SHOWN}", "below": f"BELOW {TARGET_SHOWN}",
                 "inconclusive": (f"INCONCLUSIVE: the control's noise ({control_sd:.1%}) is no less than the "
                                  f"{abs(med - TARGET):.1%} between the ratio and {TARGET_SHOWN}")}
        lines.append(f"  {direction:<8} {op:<5} GB/s: validator {_span(gb['validator'], '{:.2f}')}  raw "
                     f"{_span(gb['raw'], '{:.2f}')}  raw 1 slot {_span(gb['raw 1 slot'], '{:.2f}')}\n"
                     f"{'':17}validator/raw {_span(ratio, '{:.1%}')}  {shown[verdict]}   "
                     f"control raw again/raw {_span(control, '{:.1%}')}\n"
                     f"{'':17}validator/raw 1 slot {_span(one, '{:.1%}')}   raw 1 slot paused/raw 1 slot "
                     f"{_span(paused, '{:.1%}')}")
        verdicts.append({"direction": direction, "op": op, "rounds": len(full), "ratio_median": med,
                         "ratio_min": min(ratio), "ratio_max": max(ratio), "control_median": control_med, "control_noise": control_sd,
                         "control_max_deviation": noise, "validator_gbps": statistics.median(gb["validator"]),
                         "raw_gbps": statistics.median(gb["raw"]), "raw_one_slot_gbps": statistics.median(gb["raw 1 slot"]),
                         "ratio_to_one_slot_median": statistics.median(one),
                         "one_slot_paused_ratio_median": statistics.median(paused), "verdict": verdict,
                         "meets_target": None if verdict == "inconclusive" else verdict == "meets"})
    return lines, verdicts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent", nargs=2, metavar=("RUN_DIR", "AGENT_ID"), help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, default=8192, help="request length (a multiple of --tokens-per-block)")
    ap.add_argument("--tokens-per-block", type=int, default=128, help="tokens per block (one descriptor each)")
    ap.add_argument("--iterations", type=int, default=10, help="timed transfers per request, op and kind")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=11, help="interleaved rounds (the first is discarded)")
    ap.add_argument("--slots", type=int, help="destination slots per request (default: the validator's)")
    ap.add_argument("--model", choices=("lists", "staged"), default="lists",
                    help="lists: the Python transceiver's descriptors (one per block); staged: the C++ transceiver's "
                         "one descriptor per rank pair, gathered and scattered around the timed WRITE")
    ap.add_argument("--json", metavar="FILE", help="also write every latency and the summary here")
    args = ap.parse_args()
    if args.agent:
        return agent_main(*args.agent)
    t0 = time.monotonic()
    data = run(args)
    lines, verdicts = summarize(data, discard=1)
    row = data["rows"][0]
    p = data["params"]
    print(f"{row['bytes'] / 2**20:.0f} MiB per request ({p['tokens']} tokens of standin-2p2d, 2 KiB each) in "
          f"{row['descriptors']} {'scattered ' if row['descriptors'] > 1 else 'staged '}descriptor(s) of "
          f"{row['bytes'] // row['descriptors'] // 1024} KiB ({p['model']}), "
          f"{row['slots']} destination slots; UCX env {json.dumps({k: v for k, v in p['env'].items() if k.startswith('UCX_')})}")
    print(f"{p['rounds'] - 1} rounds kept of {p['rounds']} (first discarded), kinds interleaved in rotating order; "
          f"{p['iterations']} timed transfers per kind; GB/s = bytes / median latency (post -> DONE); "
          f"median [min-max] over rounds; ratios paired within each round")
    print("\n".join(lines))
    worst = min(v["ratio_median"] for v in verdicts)
    floor = max(v["control_max_deviation"] for v in verdicts)
    unsure = [f"{v['direction']} {v['op']}" for v in verdicts if v["verdict"] == "inconclusive"]
    missed = [f"{v['direction']} {v['op']}" for v in verdicts if v["verdict"] == "below"]
    overall = "; ".join(
        ([f"target missed: {', '.join(missed)}"] if missed else [])
        + ([f"INCONCLUSIVE for {', '.join(unsure)}: the control's noise reaches the margin judged (run it again "
            "alone)"] if unsure else [])) or f"target met: every median ratio >= {TARGET_SHOWN}, beyond the control's noise"
    print(f"worst median ratio {worst:.1%} (target {TARGET_SHOWN}); {overall}. The control raw/raw ratio strayed up to "
          f"{floor:.1%} from 100 % in some round: single-round differences smaller than that are this machine's noise "
          f"({time.monotonic() - t0:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps({**data, "summary": verdicts}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
