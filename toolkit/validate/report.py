"""Turn the agents' result files into one report (the JSON document `--json` prints, schema in
report.schema.json) and show it: live progress while agents run, then the per-pair table."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from orchestrator.states import Role
from toolkit.progress import StatusLine
from validation.stats import percentile

SCHEMA_FILE = Path(__file__).resolve().parent / "report.schema.json"
REPORT_VERSION = 1
DIRECTIONS = ("forward", "reverse")  # context -> generation; generation -> context (the answer's KV moving back)
OPS = ("WRITE", "READ")
# tokens_per_block: a change from the recipe's value is recommended only when, in every op that can be
# trusted on these hosts, over at least MIN_PASSES passes whose figures agree within MAX_SPREAD, a block
# size beats the recipe's by at least MIN_GAIN in every pass (paired, pass by pass) and its slowest pass
# is faster than the recipe's fastest; then the smallest such block size within RECOMMEND_WITHIN of the
# best is the one recommended. Anything less is noise on a shared machine (docs/validate.md).
RECOMMEND_WITHIN = 0.9
MIN_GAIN = 0.10
MIN_PASSES = 3
MAX_SPREAD = 0.25  # a block size whose passes differ by more than this (of their median) is not consistent


def load_schema() -> dict:
    return json.loads(SCHEMA_FILE.read_text())


def _ms(x):
    return None if x is None else round(x * 1e3, 4)


def _gbps(nbytes: int, latencies: list) -> float | None:
    """Request bytes / median request latency, in GB/s (1e9): robust to the odd descheduled transfer."""
    med = percentile(latencies, 50)
    if not med or med <= 0:
        return None
    return round(nbytes / med / 1e9, 4)


def _gbps_mean(nbytes: int, latencies: list) -> float | None:
    """Bytes of all timed requests / their total time."""
    total = sum(latencies)
    if not latencies or total <= 0:
        return None
    return round(nbytes * len(latencies) / total / 1e9, 4)


def _records(results: dict) -> dict:
    """(context agent, generation agent, op, direction) -> {agent id: record}."""
    out: dict = {}
    for aid, res in results.items():
        for rec in (res or {}).get("pairs", []):
            key = (rec["src"], rec["dst"], rec["op"], rec.get("direction", "forward"))
            out.setdefault(key, {})[aid] = rec
    return out


def roles_of(ctx: str, gen: str, direction: str, op: str) -> tuple[str, str]:
    """(initiator, verifier) of one op: the data's destination verifies; WRITE is posted by the data's
    source, READ by its destination. forward: context -> generation; reverse: generation -> context."""
    data_src, data_dst = (ctx, gen) if direction == "forward" else (gen, ctx)
    return (data_src if op == "WRITE" else data_dst), data_dst


def absence_reason(aid: str, results: dict, exits: dict) -> str:
    """Why an agent's part is missing, as precisely as the run dir tells."""
    res = results.get(aid)
    if res and res.get("unresponsive"):
        u = res["unresponsive"]
        return f"{aid} stopped answering ({u['by']}: {u['why']}; log: logs/{aid}.log)"
    if res and res.get("error"):
        return f"{aid} failed: {res['error']} (stage {res.get('stage')}; log: logs/{aid}.log)"
    for r in results.values():
        if r and aid in r.get("missing_peers", {}):
            return r["missing_peers"][aid]
    code = exits.get(aid)
    if code is not None:
        return f"{aid} exited with code {code} before reporting (log: logs/{aid}.log)"
    return f"{aid} did not report in time (log: logs/{aid}.log)"


def scheduled_ops(params: dict) -> tuple[str, ...]:
    """The ops the agents ran: WRITE, the one TensorRT-LLM issues, and READ only when asked (reports written before
    READ became opt-in ran both)."""
    asked = params.get("ops") or OPS
    return tuple(op for op in OPS if op in asked)


def _p50_ms(values: list):
    return _ms(percentile(values, 50)) if values else None


def merge_pairs(params: dict, results: dict, exits: dict, min_gbps, final: bool = True) -> list:
    """One entry per (context node, generation node, direction, op), every scheduled one, merged from both
    sides. src/dst name the context and the generation agent in both directions. min_gbps: one threshold, or
    (context agent, generation agent) -> the pair's; it judges WRITE only (TensorRT-LLM never READs)."""
    recs = _records(results)
    n_lengths = len(params["lengths"])
    host = {aid: (res or {}).get("host") for aid, res in results.items()}
    out = []
    for r, pairs in enumerate(params["rounds"]):
        for src, dst in pairs:
            for direction, op in ((d, o) for d in params.get("directions") or ["forward"] for o in scheduled_ops(params)):
                by = recs.get((src, dst, op, direction), {})
                initiator, verifier = roles_of(src, dst, direction, op)
                ini, ver = by.get(initiator), by.get(verifier)
                source = by.get(src if direction == "forward" else dst)
                lengths = []
                for li in range(n_lengths):
                    e_i = ini["lengths"][li] if ini and li < len(ini["lengths"]) else None
                    e_v = ver["lengths"][li] if ver and li < len(ver["lengths"]) else None
                    e_s = source["lengths"][li] if source and li < len(source["lengths"]) else None
                    base = e_v or e_i
                    if base is None:
                        continue
                    lat = (e_i or {}).get("latencies_s", [])
                    gather, scatter = _p50_ms((e_s or {}).get("gather_s", [])), _p50_ms((e_v or {}).get("scatter_s", []))
                    transfer = _ms(percentile(lat, 50))
                    lengths.append({
                        "tokens": base["tokens"], "bytes": base["bytes"], "blocks": base["blocks"],
                        "descriptors": base["descriptors"], "iterations": len(lat),
                        "gbps": _gbps(base["bytes"], lat), "gbps_mean": _gbps_mean(base["bytes"], lat),
                        "latency_p50_ms": _ms(percentile(lat, 50)), "latency_p99_ms": _ms(percentile(lat, 99)),
                        "prep_p50_ms": _ms(percentile((e_i or {}).get("prep_s", []), 50)),
                        "slots": base.get("slots", 1),
                        "bytes_verified": (e_v or {}).get("bytes_verified", 0),
                        "transfers_verified": (e_v or {}).get("transfers_verified", 0),
                        "untouched_bytes_checked": (e_v or {}).get("untouched_bytes_checked", 0),
                        "staged": bool(base.get("staged")),
                        "gather_p50_ms": gather, "scatter_p50_ms": scatter,
                        "request_ms": (round((gather or 0) + transfer + (scatter or 0), 4)
                                       if transfer is not None else None),
                        "error": (e_v or {}).get("error") or (e_i or {}).get("error"),
                    })
                error = None
                for rec in (ver, ini, by.get(src), by.get(dst)):
                    if rec and rec.get("error"):
                        error = rec["error"]
                        break
                complete = len(lengths) == n_lengths and all(x["iterations"] for x in lengths)
                if error is None and not complete:
                    gone = [a for a in dict.fromkeys((initiator, verifier, src, dst)) if a not in by]
                    if gone:
                        error = "; ".join(absence_reason(a, results, exits) for a in gone) if final else None
                    elif final:
                        error = "incomplete: the agents stopped before finishing this pair"
                longest = lengths[-1] if complete else None
                gbps = longest["gbps"] if longest else None
                threshold = min_gbps.get((src, dst), 0.0) if isinstance(min_gbps, dict) else min_gbps
                judged = op == "WRITE"
                entry = {
                    "src": src, "dst": dst, "op": op, "direction": direction, "round": r,
                    "src_host": host.get(src), "dst_host": host.get(dst),
                    "bytes_verified": sum(x["bytes_verified"] for x in lengths),
                    "gbps": gbps,
                    "latency_p50_ms": longest["latency_p50_ms"] if longest else None,
                    "latency_p99_ms": longest["latency_p99_ms"] if longest else None,
                    "request_ms": longest["request_ms"] if longest else None,
                    "issued_by_trtllm": judged,
                    "min_gbps": round(threshold, 6) if judged else None,
                    "passed": False, "error": error, "lengths": lengths,
                }
                if error is None and complete:
                    if not entry["bytes_verified"]:
                        entry["error"] = "no byte was verified"
                    elif not gbps:
                        entry["error"] = "no bandwidth measured"
                    elif judged and gbps < threshold:
                        way = "" if direction == "forward" else " (generation -> context)"
                        entry["error"] = (f"bandwidth {gbps:.3f} GB/s for the {longest['tokens']}-token request{way} "
                                          f"is below the threshold {threshold:.3f} GB/s")
                    else:
                        entry["passed"] = True
                entry["done"] = entry["passed"] or entry["error"] is not None
                out.append(entry)
    return out


def _spread(values: list) -> dict:
    """median, min, max and (max - min) / median of a list of GB/s figures (None when empty)."""
    if not values:
        return {"gbps_median": None, "gbps_min": None, "gbps_max": None, "spread": None}
    med = statistics.median(values)
    return {"gbps_median": round(med, 4), "gbps_min": round(min(values), 4), "gbps_max": round(max(values), 4),
            "spread": round((max(values) - min(values)) / med, 4) if med else None}


def merge_sweep(params: dict, results: dict, geom: dict, shared_host: bool = False,
                cpu_progressed: bool = True) -> tuple[list, dict | None]:
    """One row per tokens_per_block: per op, each pass's median over the pairs, and their median, min, max
    and spread; the top-level figures are WRITE's (or READ's when WRITE was not swept). Then the
    recommendation (recommend)."""
    sweep = params.get("sweep")
    if not sweep:
        return [], None
    ops = list(sweep.get("ops") or ["WRITE"])
    timed: dict = {}
    errs: dict = {}
    for res in results.values():
        for e in (res or {}).get("sweep", []):
            k = (e["tokens_per_block"], e.get("op", "WRITE"))
            if e.get("latencies_s") and not e.get("error"):  # a transfer that failed its check times nothing
                timed.setdefault(k, []).append(e)
            if e.get("error"):
                errs.setdefault(e["tokens_per_block"], []).append(
                    f"{e['src']} -> {e['dst']} {e.get('op', 'WRITE')}: {e['error']}")
    frag = geom["frag_bytes_per_token"] if geom["mode"] == "fragment" else \
        geom["layers"] * geom["kv_factor"] * geom["slot_bytes_per_token"][Role.CTX]
    rows = []
    for tpb in sweep["tokens_per_block"]:
        per_op = {}
        for op in ops:
            entries = timed.get((tpb, op), [])
            by_pass: dict = {}
            for e in entries:
                bw = _gbps(e["bytes"], e["latencies_s"])
                if bw:
                    by_pass.setdefault(e.get("pass", 0), []).append(bw)
            passes = [round(statistics.median(v), 4) for _, v in sorted(by_pass.items())]
            every = [x for v in by_pass.values() for x in v]
            lats = [percentile(e["latencies_s"], 50) for e in entries]
            per_op[op] = {"passes": passes, **_spread(passes),
                          "pairs": max((len(v) for v in by_pass.values()), default=0),
                          "gbps_min_pair": round(min(every), 4) if every else None,
                          "latency_p50_ms": _ms(statistics.median(lats)) if lats else None,
                          "descriptors": entries[0]["descriptors"] if entries else None}
        main = per_op.get("WRITE") or per_op[ops[0]]
        rows.append({
            "tokens_per_block": tpb, "descriptor_bytes": tpb * frag, "descriptors": main["descriptors"],
            "request_tokens": sweep["tokens"], "pairs": main["pairs"], "passes": len(main["passes"]),
            "gbps_median": main["gbps_median"], "gbps_min": main["gbps_min_pair"],
            "latency_p50_ms": main["latency_p50_ms"], "errors": errs.get(tpb, []),
            "ops": {op: {k: v for k, v in x.items() if k != "descriptors"} for op, x in per_op.items()},
        })
    return rows, recommend(rows, geom["tokens_per_block"], ops, shared_host, cpu_progressed)


def _range(x: dict) -> str:
    return f"{x['gbps_median']:.3f} GB/s (passes {x['gbps_min']:.3f}-{x['gbps_max']:.3f})"


def _judge_op(rows: list, op: str, current: int) -> tuple[str, int | None, str]:
    """What one op's sweep says: ("better", the block size, why), ("none", None, why) when nothing is
    measurably better than the recipe's, or ("insufficient", None, why) when the sweep cannot tell."""
    measured = [r for r in rows if r["ops"].get(op, {}).get("gbps_median")]
    cur = next((r["ops"][op] for r in measured if r["tokens_per_block"] == current), None)
    if cur is None:
        return "insufficient", None, f"{op}: the recipe's tokens_per_block {current} was not measured"
    if len(cur["passes"]) < MIN_PASSES:
        return "insufficient", None, (f"{op}: {len(cur['passes'])} pass(es), at least {MIN_PASSES} are needed to tell "
                                      "a difference from noise")
    if cur["spread"] > MAX_SPREAD:
        return "insufficient", None, (f"{op}: the recipe's {current} varied by {cur['spread']:.0%} between passes "
                                      f"({_range(cur)}), more than {MAX_SPREAD:.0%}: the measurements are not "
                                      "consistent enough to compare block sizes")

    def beats(x: dict) -> bool:
        return (len(x["passes"]) == len(cur["passes"]) and x["spread"] <= MAX_SPREAD and x["gbps_min"] > cur["gbps_max"]
                and all(a >= (1 + MIN_GAIN) * b for a, b in zip(x["passes"], cur["passes"])))

    better = [r for r in measured if r["tokens_per_block"] != current and beats(r["ops"][op])]
    if not better:
        best = max(measured, key=lambda r: r["ops"][op]["gbps_median"])
        return "none", None, (f"{op}: no block size is faster than the recipe's {current} in every pass by {MIN_GAIN:.0%} "
                      f"or more (the recipe's: {_range(cur)}; the best median: {best['tokens_per_block']} at "
                      f"{_range(best['ops'][op])})")
    top = max(r["ops"][op]["gbps_median"] for r in better)
    pick = min((r for r in better if r["ops"][op]["gbps_median"] >= RECOMMEND_WITHIN * top),
               key=lambda r: r["tokens_per_block"])
    return "better", pick["tokens_per_block"], (f"{op}: {pick['tokens_per_block']} at {_range(pick['ops'][op])} beats the "
                                      f"recipe's {current} at {_range(cur)} in every pass")


def recommend(rows: list, current: int, ops: list, shared_host: bool, cpu_progressed: bool = True) -> dict | None:
    """The tokens_per_block recommendation, made only from measurements that hold (see MIN_GAIN): status
    "change" (every op trusted here agrees on a measurably faster block size), "keep" (none is measurably
    faster), or "withheld" (too few passes, the recipe's value not measured, nothing trustworthy measured);
    the reason says which and with what numbers. None without a sweep.

    WRITE is left out only where the agents share a host AND the transport is progressed by a CPU (host memory
    over shared memory or TCP, or UCX's software emulation): there a WRITE completes when its destination is
    scheduled. cuda_ipc and RDMA move the bytes themselves, so WRITE (what TensorRT-LLM issues) stands."""
    if not rows:
        return None
    excluded = {}
    if shared_host and cpu_progressed and "WRITE" in ops:
        excluded["WRITE"] = ("the agents share a host and the transport is progressed by a CPU (host memory over "
                             "shared memory or TCP): a WRITE completes only when its destination is scheduled, so "
                             "WRITE figures measure the host, not the transfer")
    trusted = [op for op in ops if op not in excluded and any(r["ops"].get(op, {}).get("gbps_median") for r in rows)]
    verdicts = {op: _judge_op(rows, op, current) for op in trusted}
    picks = {op: tpb for op, (_, tpb, _) in verdicts.items()}
    reasons = [why for _, _, why in verdicts.values()] + [f"{op} not used: {why}" for op, why in excluded.items()]
    if not trusted or any(state == "insufficient" for state, _, _ in verdicts.values()):
        status, pick = "withheld", current
    elif all(state == "better" for state, _, _ in verdicts.values()) and len(set(picks.values())) == 1:
        status, pick = "change", next(iter(picks.values()))
    else:
        status, pick = "keep", current
        if any(state == "better" for state, _, _ in verdicts.values()):
            reasons.insert(0, "the ops disagree, so no change is recommended")
    basis = trusted[0] if trusted else None
    row = next((r for r in rows if r["tokens_per_block"] == pick), None)
    gbps = row["ops"][basis]["gbps_median"] if row and basis else None
    lead = {"change": f"{pick} is faster than the recipe's {current} in every pass of every trusted op",
            "keep": f"no block size is measurably faster than the recipe's {current}",
            "withheld": "the sweep cannot tell"}[status]
    return {"tokens_per_block": pick, "recipe_tokens_per_block": current, "matches_recipe": pick == current,
            "status": status, "gbps_median": gbps, "ops": trusted, "excluded": excluded,
            "passes": max((len(r["ops"].get(basis, {}).get("passes", [])) for r in rows), default=0) if basis else 0,
            "reason": f"{lead}: " + "; ".join(reasons)}


def largest_request(plan_info: dict, pairs: list) -> dict:
    """The recipe's longest admitted request, projected from the forward WRITE pairs: over the link alone
    (``measured_transfer_ms``, the slowest pair's GB/s) and as TensorRT-LLM's transceiver moves it
    (``measured_request_ms``: with the gather and the scatter a staged transfer does around the WRITE, at the slowest
    pair's measured milliseconds per byte of its longest request). The second decides ``transfer_dominates``."""
    forward = [p for p in pairs if p.get("direction", "forward") == "forward" and p.get("op", "WRITE") == "WRITE"]
    measured = [p["gbps"] for p in forward if p["gbps"]]
    worst = min(measured) if measured else None
    nbytes = plan_info["largest_request_bytes_per_rank"]
    ms = round(nbytes / (worst * 1e9) * 1e3, 3) if worst else None
    per_byte = [p["lengths"][-1]["request_ms"] / p["lengths"][-1]["bytes"] for p in forward
                if p["gbps"] and p.get("lengths") and p["lengths"][-1].get("request_ms")
                and p["lengths"][-1].get("bytes")]
    request = round(nbytes * max(per_byte), 3) if per_byte else ms
    prefill = plan_info["largest_request_prefill_ms"]
    return {
        "tokens": plan_info["largest_request_tokens"],
        "bytes_per_rank": nbytes,
        "worst_pair_gbps": worst,
        "measured_transfer_ms": ms,
        "measured_request_ms": request,
        "estimated_transfer_ms": plan_info["largest_request_transfer_ms"],
        "estimated_prefill_ms": prefill,
        "transfer_dominates": (request > prefill) if request is not None else None,
        "basis": "bytes one context rank sends for the longest admitted request (plan) / the slowest pair's "
                 "measured bandwidth on the longest validated request (measured_transfer_ms: the link); "
                 "measured_request_ms: the same bytes at the slowest pair's gather + WRITE + scatter per byte",
    }


def _matrix(pairs: list) -> dict:
    """{op: {context, generation, gbps (rows x columns), min, median, max}} of one direction's pairs."""
    ops: dict = {}
    for op in OPS:
        rows = [p for p in pairs if p["op"] == op]
        if not rows:
            continue
        srcs = sorted({p["src"] for p in rows})
        dsts = sorted({p["dst"] for p in rows})
        cell = {(p["src"], p["dst"]): p["gbps"] for p in rows}
        measured = [v for v in cell.values() if v]
        ops[op] = {
            "context": srcs, "generation": dsts,
            "gbps": [[cell.get((s_, d)) for d in dsts] for s_ in srcs],
            "min": min(measured) if measured else None,
            "median": statistics.median(measured) if measured else None,
            "max": max(measured) if measured else None,
        }
    primary = ops.get("WRITE") or ops.get("READ") or {}
    return {"op": "WRITE" if "WRITE" in ops else ("READ" if ops else None), "context": primary.get("context", []),
            "generation": primary.get("generation", []), "gbps": primary.get("gbps", []), "ops": ops}


def bandwidth_matrix(pairs: list) -> dict:
    """Context (rows) x generation (columns) GB/s of the longest validated request, per op: the machine-readable
    form `tk size --measured` reads (context -> generation). `reverse` has the same shape for generation ->
    context (the answer's KV moving back), when measured. None where a pair was not measured."""
    forward = _matrix([p for p in pairs if p.get("direction", "forward") == "forward"])
    out = {"unit": "GB/s (1e9 bytes/s), longest validated request, bytes / median latency", **forward}
    back = [p for p in pairs if p.get("direction") == "reverse"]
    if back:
        out["reverse"] = {"direction": "generation -> context; rows are still the context agents", **_matrix(back)}
    return out


def cpu_progressed(params: dict, results: dict) -> tuple[bool, str]:
    """Whether the transfers were progressed by a CPU (so a WRITE between agents of one host completes when its
    destination runs): host memory, or a WRITE that UCX served by software emulation. CUDA memory over cuda_ipc or
    RDMA is not: the copy engine or the NIC moves it."""
    mems = {r["memory"]["type"] for r in results.values() if r and isinstance(r.get("memory"), dict)}
    emulated = [f"{r.get('agent')}: {t.get('scope')}" for r in results.values() if r
                for t in r.get("protocols", []) if t.get("op") == "WRITE" and t.get("emulated")]
    if emulated:
        return True, f"UCX served WRITE by software emulation ({'; '.join(emulated[:3])})"
    if "VRAM" in mems:
        return False, "CUDA memory: cuda_ipc or RDMA moves it, not the destination's CPU"
    if mems or params.get("memory") == "dram":
        return True, "host memory over UCX's CPU transports (shared memory, TCP)"
    return True, "no agent reported its memory"


def merge_curve(params: dict, results: dict) -> tuple[list, dict, dict]:
    """The descriptor-size curve: per descriptor count, each pair's raw WRITE GB/s (context side) and the check
    (generation side); their median, slowest and fastest. Also per pair (context agent, generation agent) the
    one-descriptor GB/s (what the link can do with these bytes) and the destination's copy of the same bytes."""
    if not params.get("curve"):
        return [], {}, {}
    by_n: dict = {}
    possible: dict = {}
    copy: dict = {}
    for res in results.values():
        for e in (res or {}).get("curve", []):
            row = by_n.setdefault(e["descriptors"], {"descriptors": e["descriptors"],
                                                     "descriptor_bytes": e["descriptor_bytes"], "bytes": e["bytes"],
                                                     "pairs": [], "errors": []})
            if e.get("error"):
                row["errors"].append(f"{e['src']} -> {e['dst']}: {e['error']}")
            if e.get("latencies_s") and not e.get("error"):
                bw = _gbps(e["bytes"], e["latencies_s"])
                if bw:
                    row["pairs"].append(bw)
                    if e["descriptors"] == 1:
                        possible[(e["src"], e["dst"])] = bw
            if e.get("copy_s"):
                copy[(e["src"], e["dst"])] = round(e["bytes"] / e["copy_s"] / 1e9, 4)
    rows = []
    for n in sorted(by_n):
        row = by_n[n]
        bws = row.pop("pairs")
        errs = list(dict.fromkeys(row["errors"]))
        rows.append({**row, "errors": errs, "pairs": len(bws),
                     "gbps_median": round(statistics.median(bws), 4) if bws else None,
                     "gbps_min": round(min(bws), 4) if bws else None, "gbps_max": round(max(bws), 4) if bws else None})
    return rows, possible, copy


def _curve_at(rows: list, count: int) -> float | None:
    """The curve's median GB/s at ``count`` descriptors, log-linear between its points. Below its first point, the
    first; past its last, each further descriptor costs what one did between the last two points (the time of the
    same bytes, 1/GB/s, grows linearly with the count there), never faster than the last point."""
    pts = [(r["descriptors"], r["gbps_median"]) for r in rows if r.get("gbps_median")]
    if not pts:
        return None
    if count <= pts[0][0]:
        return pts[0][1]
    for (n0, g0), (n1, g1) in zip(pts, pts[1:]):
        if n0 <= count <= n1:
            f = (math.log(count) - math.log(n0)) / (math.log(n1) - math.log(n0))
            return g0 + (g1 - g0) * f
    n1, g1 = pts[-1]
    if len(pts) < 2:
        return g1
    n0, g0 = pts[-2]
    per_descriptor = max(0.0, (1 / g1 - 1 / g0) / (n1 - n0))  # what one more descriptor adds to 1/GB/s
    return 1 / (1 / g1 + (count - n1) * per_descriptor)


def advise(transfer: dict, rows: list, pairs: list, tpb: int, trusted: bool, why_not: str) -> dict | None:
    """What the descriptor-size curve says about the recipe's transfer: the GB/s its descriptor count reaches
    against one descriptor of the same bytes, and, when the count costs more than a tenth, what would cut it:
    a larger tokens_per_block (fewer descriptors), or the Python transceiver's bounce buffer (one descriptor).
    None without a curve."""
    if not rows:
        return None
    forward = [p for p in pairs if p.get("direction", "forward") == "forward" and p["op"] == "WRITE" and p["lengths"]]
    longest = forward[0]["lengths"][-1] if forward else None
    one = _curve_at(rows, 1)
    base = {"status": "withheld", "tokens_per_block": tpb, "recipe_tokens_per_block": tpb, "bounce_size_mb": None,
            "descriptors": longest["descriptors"] if longest else None,
            "descriptor_bytes": (longest["bytes"] // max(1, longest["descriptors"])) if longest else None,
            "gbps_one_descriptor": round(one, 4) if one else None, "gbps_at_recipe": None}
    if longest is None or not one:
        return {**base, "reason": "the curve or the longest request was not measured"}
    count = int(longest["descriptors"])
    at = _curve_at(rows, count)
    base["gbps_at_recipe"] = round(at, 4) if at else None
    if not trusted:
        return {**base, "reason": f"WRITE figures are not trusted here: {why_not}"}
    label = transfer.get("label") or "the transceiver"
    if longest.get("staged") or count == 1:
        return {**base, "status": "keep", "reason": (
            f"the {label} moves one descriptor per rank pair ({transfer.get('layout')}): tokens_per_block does not "
            f"change its transfer; one descriptor of these bytes: {one:.3f} GB/s")}
    if at and at >= 0.9 * one:
        return {**base, "status": "keep", "reason": (
            f"{count} descriptors of {base['descriptor_bytes']} bytes reach {at:.3f} GB/s, within 10 % of one "
            f"descriptor of the same bytes ({one:.3f} GB/s)")}
    pick = None
    for cand in (64, 128, 256, 512):
        g = _curve_at(rows, max(1, count * tpb // cand)) if cand > tpb else None
        if g and g >= 0.9 * one:
            pick = cand
            break
    bounce = None
    # the bounce buffer holds the whole request of one rank pair, written by one context rank (a generation rank fed
    # by several stays on the lists: toolkit/facts/transceiver.py layout_for)
    if transfer.get("runtime") == "PYTHON" and int(transfer.get("writers") or 1) == 1:
        full = int(transfer.get("plan_pair_bytes") or longest["bytes"])
        bounce = max(1, -(-full // (1 << 20)))
    options = []
    if pick:
        options.append(f"kv_transfer.tokens_per_block: {pick} ({count * tpb // pick} descriptors)")
    if bounce:
        options.append(f"kv_transfer.bounce_size_mb: {bounce} or more (the longest admitted request of one rank pair "
                       "coalesced into one descriptor, as one descriptor measured here)")
    return {**base, "status": "change" if options else "keep", "tokens_per_block": pick or tpb,
            "bounce_size_mb": bounce, "reason": (
                f"{count} descriptors of {base['descriptor_bytes']} bytes (the request as validated) reach {at:.3f} "
                f"GB/s where one descriptor of the same bytes reaches {one:.3f} GB/s ({at / one:.0%})" +
                (f"; to cut the descriptor count: {'; or '.join(options)}" if options else
                 "; no block size up to 512 reaches 90 % of one descriptor"))}


def transceiver_section(params: dict, pairs: list) -> dict:
    """The transceiver model the run moved: runtime, layout, and in words what one request of one rank pair was."""
    t = dict(params["geometry"].get("transfer") or {})
    forward = [p for p in pairs if p.get("direction", "forward") == "forward" and p["op"] == "WRITE" and p["lengths"]]
    longest = forward[0]["lengths"][-1] if forward else None
    if longest:
        n = longest["descriptors"]
        how = "staged: gathered, one WRITE, scattered" if longest.get("staged") else "descriptor lists"
        t["model"] = (f"{t.get('label') or 'transfer'}: {t.get('layout')}, {n} descriptor{'s' if n != 1 else ''} per "
                      f"rank pair of {_human_bytes(longest['bytes'] // max(1, n))} for the {longest['tokens']}-token "
                      f"request as validated ({how})")
    else:
        t["model"] = t.get("plan_model") or t.get("label")
    t["source"] = "toolkit/facts/transceiver.py"
    return t


def timing_note(params: dict, shared_host: bool, cpu: tuple[bool, str] = (True, "")) -> dict:
    """How the figures were taken, in the report itself (docs/validate.md explains it)."""
    slots = params["geometry"].get("slots", 1)
    note = {"method": f"per transfer, post to DONE on the initiator; transfers in bursts of up to {slots} back to "
                      "back, one per destination slot, the destination pool poisoned before the first burst and "
                      "every slot verified after each burst (a slot then holds a pattern the next burst's differs "
                      "from in every word); "
                      "GB/s = request bytes / median latency",
            "slots": slots, "shared_host": shared_host, "progress_thread": params.get("progress_thread"),
            "cpu_progressed": cpu[0], "caveats": []}
    if "READ" in scheduled_ops(params):
        note["caveats"].append("READ was measured as asked (--read): TensorRT-LLM never READs (the context side "
                               "WRITEs), so READ figures are shown but judge nothing")
    if shared_host and cpu[0]:
        note["caveats"].append("context and generation agents share a host: on CPU transports (shared memory, "
                               "TCP) the figures are memory copies competing with everything else on the host, and "
                               "a WRITE completes only when its destination polls; read WRITE figures as a floor")
    return note


def thresholds(params: dict, min_fraction: float, possible: dict, copy: dict) -> tuple[dict, dict]:
    """(the report's thresholds, (context agent, generation agent) -> the pair's min GB/s). A pair's threshold is
    min_fraction of what was measured as possible on it (raw NIXL, one descriptor of the same bytes: the curve's
    first point), else of the transport profile's nominal GB/s; ``basis`` says which, or ``none`` where min_fraction
    is 0 and no threshold applies."""
    nominal = params["expect"]["nominal_gbps"]
    pairs = [(c, g) for rd in params["rounds"] for c, g in rd]
    per_pair, rows = {}, []
    for c, g in pairs:
        measured = possible.get((c, g))
        per_pair[(c, g)] = min_fraction * (measured if measured else nominal)
        rows.append({"context": c, "generation": g, "possible_gbps": measured, "copy_gbps": copy.get((c, g)),
                     "min_gbps": round(per_pair[(c, g)], 6)})
    measured_all = bool(pairs) and all(possible.get(p) for p in pairs)
    basis = "measured" if measured_all else "nominal"
    text = (f"{min_fraction:g} x raw NIXL WRITE of one descriptor of the longest request's bytes, measured on each "
            "pair (the descriptor-size curve's first point)" if measured_all else
            f"{min_fraction:g} x the {params['expect']['transport']} profile's nominal {nominal:g} GB/s"
            + (" (the curve did not measure every pair)" if params.get("curve") else ""))
    if not min_fraction:  # the pairs' possible_gbps stay shown, but no figure was the basis of a threshold
        basis = "none"
        text = ("no bandwidth threshold applies (min_fraction 0: host memory or TCP, a rehearsal that says nothing "
                "about the fabric; a run still fails on any error and on a zero bandwidth)")
    values = list(per_pair.values()) or [min_fraction * nominal]
    return ({"transport": params["expect"]["transport"], "nominal_gbps": nominal, "min_fraction": min_fraction,
             "min_gbps": round(min(values), 6), "basis": basis, "basis_text": text, "pairs": rows,
             "applies_to": "WRITE bandwidth of the longest validated request, per pair and direction (READ, when "
                           "asked for, is not judged: TensorRT-LLM never READs)"}, per_pair)


def build_report(*, params: dict, results: dict, exits: dict, coordinator_preflight: list, plan_info: dict,
                 min_fraction: float, run: dict) -> dict:
    curve, possible, copy = merge_curve(params, results)
    thresh, per_pair = thresholds(params, min_fraction, possible, copy)
    pairs = merge_pairs(params, results, exits, per_pair)
    for p in pairs:
        p.pop("done", None)
    hosts = {aid: (res or {}).get("host") for aid, res in results.items()}
    shared_host = any(hosts.get(c) and hosts.get(c) == hosts.get(g) for pairs_ in params["rounds"] for c, g in pairs_)
    cpu = cpu_progressed(params, results)
    sweep, rec = merge_sweep(params, results, params["geometry"], shared_host, cpu[0])
    preflight = list(coordinator_preflight)
    nodes = []
    for a in params["agents"]:
        res = results.get(a["id"])
        for item in (res or {}).get("preflight", []):
            preflight.append({**item, "agent": a["id"], "host": res.get("host")})
        if not res or not res.get("final") or res.get("error"):
            preflight.append({"name": "agent", "status": "fail", "agent": a["id"], "host": (res or {}).get("host"),
                              "detail": absence_reason(a["id"], results, exits) if not (res and res.get("final"))
                              else f"{a['id']} ended with an error: {res['error']}"})
        nodes.append({"agent": a["id"], "node": a["node"], "role": a["role"], "host": (res or {}).get("host"),
                      "memory": (res or {}).get("memory"), "nixl": (res or {}).get("nixl"),
                      "transports": (res or {}).get("transports", []),
                      "protocols": (res or {}).get("protocols", []), "exit_code": exits.get(a["id"]),
                      "missing_peers": (res or {}).get("missing_peers", {}), "log": f"logs/{a['id']}.log"})
    failures = [f"{p['src']} -> {p['dst']} {p['op']}: {p['error']}" for p in pairs if not p["passed"]]
    failures += [f"preflight {i['name']}{' on ' + i['agent'] if i.get('agent') else ''}: {i['detail']}"
                 for i in preflight if i["status"] == "fail"]
    # a sweep transfer that failed (its bytes did not verify, or it did not complete) fails the run as a pair does
    failures += [f"tokens_per_block sweep {row['tokens_per_block']}: {err}" for row in sweep for err in row["errors"]]
    failures += [f"descriptor-size curve, {row['descriptors']} descriptor(s): {err}" for row in curve
                 for err in row["errors"]]
    passed = (bool(pairs) and all(p["passed"] for p in pairs) and not any(i["status"] == "fail" for i in preflight)
              and not any(row["errors"] for row in sweep) and not any(row["errors"] for row in curve))
    geom = params["geometry"]
    trusted = not (shared_host and cpu[0])
    why_not = ("the agents share a host and the transport is progressed by a CPU: a WRITE completes when its "
               f"destination is scheduled ({cpu[1]})")
    return {
        "schema_version": REPORT_VERSION,
        "kind": "tk-validate-cluster",
        "passed": passed,
        "recipe": params["recipe"],
        **run,
        "preflight": preflight,
        "pairs": pairs,
        "failures": failures,
        "nodes": nodes,
        "schedule": {"rounds": len(params["rounds"]), "pairs": [[list(p) for p in rd] for rd in params["rounds"]]},
        "geometry": {k: geom[k] for k in ("mode", "attention", "tokens_per_block", "kv_factor", "layers",
                                          "layers_per_rank", "bytes_per_token", "bytes_per_token_full",
                                          "descriptors_per_block", "descriptor_bytes", "pool_bytes", "notes")}
                    | {"slots": geom.get("slots", 1), "staging": geom.get("staging")},
        "transceiver": transceiver_section(params, pairs),
        "thresholds": thresh,
        "sweep": sweep,
        "recommendation": rec,
        "curve": curve,
        "advice": advise(geom.get("transfer") or {}, curve, pairs, geom["tokens_per_block"], trusted, why_not),
        "largest_request": largest_request(plan_info, pairs),
        "bandwidth_matrix": bandwidth_matrix(pairs),
        "timing": timing_note(params, shared_host, cpu),
        "params": {k: params[k] for k in ("backend", "memory", "progress_thread", "lengths", "iterations", "warmup",
                                          "timeouts", "proto_info")}
                  | {"sweep": params.get("sweep"), "fault": params.get("fault"), "agents": len(params["agents"]),
                     "directions": params.get("directions") or ["forward"], "ops": list(scheduled_ops(params)),
                     "curve": params.get("curve")},
    }


# ------------------------------------------------------------------------------------------------
# Terminal output (stderr; stdout is kept for --json)
# ------------------------------------------------------------------------------------------------

def _human_bytes(n) -> str:
    from toolkit.report import human_bytes

    return human_bytes(n)


class LiveProgress(StatusLine):
    """rounds done, pairs passed/failed, while the agents run."""

    def __init__(self, enabled: bool, total_pairs: int, rounds: int):
        super().__init__(enabled, "starting agents")
        self.total = total_pairs
        self.rounds = rounds

    def update(self, phase: str, pairs: list | None = None, agents_up: int = 0, agents: int = 0) -> None:
        text = phase
        if pairs is not None:
            done = [p for p in pairs if p["done"]]
            ok = sum(p["passed"] for p in done)
            rounds_done = sum(1 for r in range(self.rounds) if all(p["done"] for p in pairs if p["round"] == r))
            text = (f"{phase}  agents {agents_up}/{agents} up  rounds {rounds_done}/{self.rounds}  "
                    f"pairs {ok} passed, {len(done) - ok} failed, {self.total - len(done)} to go")
        self.show(text)


def _f(x, fmt="{:.3f}"):
    return "-" if x is None else fmt.format(x)


def _print_matrix_summary(console, matrix: dict) -> None:
    """One line per direction and op: the slowest, median and fastest pair (every pair is in the table above)."""
    for label, m in (("context -> generation", matrix), ("generation -> context", matrix.get("reverse"))):
        for op, x in ((m or {}).get("ops") or {}).items():
            if x["median"] is not None:
                console.print(f"{label} {op:<5}: slowest pair {x['min']:.3f}, median {x['median']:.3f}, fastest "
                              f"{x['max']:.3f} GB/s over {sum(v is not None for row in x['gbps'] for v in row)} pair(s)")


def _plain(*cells) -> list:
    """Table cells shown as given: a [bracket] in a name or path is not markup."""
    from rich.text import Text

    return [Text(str(c)) for c in cells]


def _gbps_range(x: dict) -> str:
    """ " [slowest-fastest]" after a median where the figures have a range, else nothing."""
    return f" [{_f(x['gbps_min'])}-{_f(x['gbps_max'])}]" if x.get("gbps_min") is not None else ""


def _print_header(console, report: dict) -> None:
    from rich.markup import escape as esc

    g = report["geometry"]
    console.print(f"[bold]{esc(report['recipe'])}[/]  tk validate cluster ({report['mode']})  "
                  f"{len(report['nodes'])} agents, {report['schedule']['rounds']} round(s); tokens_per_block "
                  f"{g['tokens_per_block']}, lengths {', '.join(map(str, report['params']['lengths']))} tokens")
    tr = report.get("transceiver") or {}
    if tr.get("model"):
        console.print(f"moves what TensorRT-LLM moves: {esc(tr['model'])}")
    for note in g["notes"]:
        console.print(f"[yellow]note:[/] {esc(note)}")


def _print_preflight_failures(console, report: dict) -> None:
    from rich.table import Table

    bad = [i for i in report["preflight"] if i["status"] == "fail"]
    if not bad:
        return
    t = Table(title="Preflight failures", title_justify="left")
    for col in ("check", "agent", "detail"):
        t.add_column(col, overflow="fold")
    for i in bad:
        t.add_row(*_plain(i["name"], i.get("agent") or "-", i["detail"]))
    console.print(t)


def _print_pairs(console, report: dict) -> None:
    """The per-pair table; READs (and anything else TensorRT-LLM does not issue) starred and explained."""
    from rich.markup import escape as esc
    from rich.table import Table

    th = report["thresholds"]
    t = Table(title=f"Pairs (the longest request: link GB/s, WRITE post to DONE; request ms = gather + WRITE + "
                    f"scatter, p50; threshold {th.get('basis_text') or th['min_gbps']})", title_justify="left")
    for col in ("context / generation", "direction", "op", "bytes verified", "GB/s", "min GB/s", "p50 ms", "p99 ms",
                "request ms", "verdict"):
        t.add_column(col, justify="left" if col in ("context / generation", "direction", "op", "verdict") else "right",
                     overflow="fold")
    for p in report["pairs"]:
        verdict = "[green]pass[/]" if p["passed"] else f"[red]FAIL[/] {esc(p['error'] or '')}"
        way = "ctx -> gen" if p.get("direction", "forward") == "forward" else "gen -> ctx"
        op = p["op"] if p.get("issued_by_trtllm", True) else f"{p['op']}*"
        t.add_row(*_plain(f"{p['src']} / {p['dst']}", way, op), _human_bytes(p["bytes_verified"]),
                  _f(p["gbps"]), _f(p.get("min_gbps")), _f(p["latency_p50_ms"]), _f(p["latency_p99_ms"]),
                  _f(p.get("request_ms")), verdict)
    console.print(t)
    if not all(p.get("issued_by_trtllm", True) for p in report["pairs"]):
        console.print("* not what TensorRT-LLM issues (it WRITEs from the context side): measured as asked, judges "
                      "nothing")


def _print_sweep(console, sweep: list) -> None:
    """The tokens_per_block sweep, where it measured anything: per op, the median and range over the passes."""
    from rich.markup import escape as esc
    from rich.table import Table

    if not any(s["gbps_median"] or any(x.get("gbps_median") for x in s.get("ops", {}).values()) for s in sweep):
        return
    ops = list(sweep[0].get("ops", {}) or ["WRITE"])
    passes = max(s.get("passes", 1) for s in sweep)
    t = Table(title=esc(f"tokens_per_block sweep (context -> generation; per op the median over {passes} "
                        "pass(es) of each pass's median over the pairs, [slowest-fastest pass])"),
              title_justify="left")
    for col in ("tokens_per_block", "descriptor", "descriptors", *(f"{op} GB/s" for op in ops)):
        t.add_column(col, justify="right")
    for s in sweep:
        figures = [s.get("ops", {}).get(op) or {"gbps_median": s["gbps_median"], "gbps_min": None, "gbps_max": None}
                   for op in ops]
        t.add_row(str(s["tokens_per_block"]), _human_bytes(s["descriptor_bytes"]), str(s["descriptors"] or "-"),
                  *(f"{_f(x['gbps_median'])}{_gbps_range(x)}" for x in figures))
    console.print(t)


def _print_curve(console, report: dict) -> None:
    """The descriptor-size curve, where it measured anything, and what a copy of the same bytes costs."""
    from rich.markup import escape as esc
    from rich.table import Table

    curve = report.get("curve") or []
    if not any(row.get("gbps_median") for row in curve):
        return
    t = Table(title=esc("Descriptor-size curve (raw NIXL WRITE, context -> generation, the longest request's "
                        "bytes of one rank pair; median [slowest-fastest] over the pairs)"), title_justify="left")
    for col in ("descriptors", "each", "GB/s"):
        t.add_column(col, justify="right")
    for row in curve:
        t.add_row(str(row["descriptors"]), _human_bytes(row["descriptor_bytes"]), f"{_f(row['gbps_median'])}{_gbps_range(row)}")
    console.print(t)
    copies = [x["copy_gbps"] for x in report["thresholds"].get("pairs", []) if x.get("copy_gbps")]
    if copies:
        where = "device" if any((n.get("memory") or {}).get("type") == "VRAM" for n in report["nodes"]) else "host"
        console.print(f"a {where} copy of the same bytes on the destination: {min(copies):.3f}-{max(copies):.3f} "
                      "GB/s (what a gather or scatter costs at best)")


_ADVICE_HEADS = {"change": "[bold]descriptor count[/]: change", "keep": "descriptor count: keep",
                "withheld": "descriptor count: no advice"}


def _recommendation_head(rec: dict) -> str:
    if rec.get("status", "change") == "change" and not rec["matches_recipe"]:
        return f"recommended tokens_per_block: [bold]{rec['tokens_per_block']}[/] (recipe: {rec['recipe_tokens_per_block']})"
    if rec.get("status") == "withheld":
        return f"tokens_per_block: [bold]no recommendation[/] (recipe: {rec['recipe_tokens_per_block']})"
    return f"tokens_per_block: keep the recipe's [bold]{rec['recipe_tokens_per_block']}[/]"


def _print_advice(console, report: dict) -> None:
    """The descriptor-count advice and the tokens_per_block recommendation, then the timing caveats."""
    from rich.markup import escape as esc

    adv = report.get("advice")
    if adv:
        console.print(f"{_ADVICE_HEADS[adv['status']]}. {esc(adv['reason'])}")
    rec = report["recommendation"]
    if rec:
        console.print(f"{_recommendation_head(rec)}. {esc(rec['reason'][:1].upper() + rec['reason'][1:])}")
    for caveat in report.get("timing", {}).get("caveats", []):
        console.print(f"[yellow]note:[/] {esc(caveat)}")


def _print_largest_request(console, lr: dict) -> None:
    if lr["measured_transfer_ms"] is None:
        return
    verdict = "[red]the transfer dominates[/]" if lr["transfer_dominates"] else "the prefill dominates"
    request = lr.get("measured_request_ms")
    staged = (f"; {request:.1f} ms with the gather and scatter around it" if request is not None
              and request > lr["measured_transfer_ms"] * 1.001 else "")
    console.print(f"largest request ({lr['tokens']} tokens, {_human_bytes(lr['bytes_per_rank'])} per rank): "
                  f"{lr['measured_transfer_ms']:.1f} ms at the slowest pair's {lr['worst_pair_gbps']:.3f} GB/s "
                  f"link{staged} (nominal estimate {lr['estimated_transfer_ms']:.1f} ms) vs prefill "
                  f"~{lr['estimated_prefill_ms']:.1f} ms: {verdict}")


def _print_verdict(console, report: dict) -> None:
    from rich.markup import escape as esc

    n_ok = sum(p["passed"] for p in report["pairs"])
    if report["passed"]:
        console.print(f"[green bold]PASSED[/]: {n_ok}/{len(report['pairs'])} pair checks, every byte verified. "
                      f"Report: {esc(report['report_file'])}")
    else:
        console.print(f"[red bold]FAILED[/]: {n_ok}/{len(report['pairs'])} pair checks passed; "
                      f"{len(report['failures'])} problem(s). Report: {esc(report['report_file'])}")


def print_report(report: dict) -> None:
    """The report on stderr, section by section (stdout is kept for --json)."""
    from toolkit.progress import stderr_console

    console = stderr_console(140, highlight=False)
    _print_header(console, report)
    _print_preflight_failures(console, report)
    _print_pairs(console, report)
    _print_matrix_summary(console, report["bandwidth_matrix"])
    _print_sweep(console, report["sweep"])
    _print_curve(console, report)
    _print_advice(console, report)
    _print_largest_request(console, report["largest_request"])
    _print_verdict(console, report)
