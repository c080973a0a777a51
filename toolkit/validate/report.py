"""Turn the agents' result files into one report (the JSON document `--json` prints, schema in
report.schema.json) and show it: live progress while agents run, then the per-pair table."""

from __future__ import annotations

import json
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


def merge_pairs(params: dict, results: dict, exits: dict, min_gbps: float, final: bool = True) -> list:
    """One entry per (context node, generation node, direction, op), every scheduled one, merged from both
    sides. src/dst name the context and the generation agent in both directions."""
    recs = _records(results)
    n_lengths = len(params["lengths"])
    host = {aid: (res or {}).get("host") for aid, res in results.items()}
    out = []
    for r, pairs in enumerate(params["rounds"]):
        for src, dst in pairs:
            for direction, op in ((d, o) for d in params.get("directions") or ["forward"] for o in OPS):
                by = recs.get((src, dst, op, direction), {})
                initiator, verifier = roles_of(src, dst, direction, op)
                ini, ver = by.get(initiator), by.get(verifier)
                lengths = []
                for li in range(n_lengths):
                    e_i = ini["lengths"][li] if ini and li < len(ini["lengths"]) else None
                    e_v = ver["lengths"][li] if ver and li < len(ver["lengths"]) else None
                    base = e_v or e_i
                    if base is None:
                        continue
                    lat = (e_i or {}).get("latencies_s", [])
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
                entry = {
                    "src": src, "dst": dst, "op": op, "direction": direction, "round": r,
                    "src_host": host.get(src), "dst_host": host.get(dst),
                    "bytes_verified": sum(x["bytes_verified"] for x in lengths),
                    "gbps": gbps,
                    "latency_p50_ms": longest["latency_p50_ms"] if longest else None,
                    "latency_p99_ms": longest["latency_p99_ms"] if longest else None,
                    "passed": False, "error": error, "lengths": lengths,
                }
                if error is None and complete:
                    if not entry["bytes_verified"]:
                        entry["error"] = "no byte was verified"
                    elif not gbps:
                        entry["error"] = "no bandwidth measured"
                    elif gbps < min_gbps:
                        way = "" if direction == "forward" else " (generation -> context)"
                        entry["error"] = (f"bandwidth {gbps:.3f} GB/s for the {longest['tokens']}-token request{way} "
                                          f"is below the threshold {min_gbps:.3f} GB/s")
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


def merge_sweep(params: dict, results: dict, geom: dict, shared_host: bool = False) -> tuple[list, dict | None]:
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
    return rows, recommend(rows, geom["tokens_per_block"], ops, shared_host)


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


def recommend(rows: list, current: int, ops: list, shared_host: bool) -> dict | None:
    """The tokens_per_block recommendation, made only from measurements that hold (see MIN_GAIN): status
    "change" (every op trusted here agrees on a measurably faster block size), "keep" (none is measurably
    faster), or "withheld" (too few passes, the recipe's value not measured, nothing trustworthy measured);
    the reason says which and with what numbers. None without a sweep."""
    if not rows:
        return None
    excluded = {}
    if shared_host and "WRITE" in ops:
        excluded["WRITE"] = ("the agents share a host: without a host each, a WRITE completes only when its "
                             "destination is scheduled, so WRITE figures measure the host, not the transfer")
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
    measured = [p["gbps"] for p in pairs if p["gbps"] and p.get("direction", "forward") == "forward"]
    worst = min(measured) if measured else None
    nbytes = plan_info["largest_request_bytes_per_rank"]
    ms = round(nbytes / (worst * 1e9) * 1e3, 3) if worst else None
    prefill = plan_info["largest_request_prefill_ms"]
    return {
        "tokens": plan_info["largest_request_tokens"],
        "bytes_per_rank": nbytes,
        "worst_pair_gbps": worst,
        "measured_transfer_ms": ms,
        "estimated_transfer_ms": plan_info["largest_request_transfer_ms"],
        "estimated_prefill_ms": prefill,
        "transfer_dominates": (ms > prefill) if ms is not None else None,
        "basis": "bytes one context rank sends for the longest admitted request (plan) / the slowest pair's "
                 "measured bandwidth on the longest validated request",
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


def timing_note(params: dict, shared_host: bool) -> dict:
    """How the figures were taken, in the report itself (docs/validate.md explains it)."""
    slots = params["geometry"].get("slots", 1)
    note = {"method": f"per transfer, post to DONE on the initiator; transfers in bursts of up to {slots} back to "
                      "back, one per destination slot, the destination pool poisoned before the first burst and "
                      "every slot verified after each burst (a slot then holds a pattern the next burst's differs "
                      "from in every word); "
                      "GB/s = request bytes / median latency",
            "slots": slots, "shared_host": shared_host, "progress_thread": params.get("progress_thread"),
            "caveats": []}
    if shared_host:
        note["caveats"].append("context and generation agents share a host: on CPU transports (shared memory, "
                               "TCP) the figures are memory copies competing with everything else on the host, and "
                               "a WRITE completes only when its destination polls; read WRITE figures as a floor")
    return note


def build_report(*, params: dict, results: dict, exits: dict, coordinator_preflight: list, plan_info: dict,
                 min_fraction: float, run: dict) -> dict:
    nominal = params["expect"]["nominal_gbps"]
    min_gbps = min_fraction * nominal
    pairs = merge_pairs(params, results, exits, min_gbps)
    for p in pairs:
        p.pop("done", None)
    hosts = {aid: (res or {}).get("host") for aid, res in results.items()}
    shared_host = any(hosts.get(c) and hosts.get(c) == hosts.get(g) for pairs_ in params["rounds"] for c, g in pairs_)
    sweep, rec = merge_sweep(params, results, params["geometry"], shared_host)
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
                      "transports": (res or {}).get("transports", []), "exit_code": exits.get(a["id"]),
                      "missing_peers": (res or {}).get("missing_peers", {}), "log": f"logs/{a['id']}.log"})
    failures = [f"{p['src']} -> {p['dst']} {p['op']}: {p['error']}" for p in pairs if not p["passed"]]
    failures += [f"preflight {i['name']}{' on ' + i['agent'] if i.get('agent') else ''}: {i['detail']}"
                 for i in preflight if i["status"] == "fail"]
    # a sweep transfer that failed (its bytes did not verify, or it did not complete) fails the run as a pair does
    failures += [f"tokens_per_block sweep {row['tokens_per_block']}: {err}" for row in sweep for err in row["errors"]]
    passed = (bool(pairs) and all(p["passed"] for p in pairs) and not any(i["status"] == "fail" for i in preflight)
              and not any(row["errors"] for row in sweep))
    geom = params["geometry"]
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
                    | {"slots": geom.get("slots", 1)},
        "thresholds": {"transport": params["expect"]["transport"], "nominal_gbps": nominal,
                       "min_fraction": min_fraction, "min_gbps": round(min_gbps, 6),
                       "applies_to": "bandwidth of the longest validated request, per pair and op"},
        "sweep": sweep,
        "recommendation": rec,
        "largest_request": largest_request(plan_info, pairs),
        "bandwidth_matrix": bandwidth_matrix(pairs),
        "timing": timing_note(params, shared_host),
        "params": {k: params[k] for k in ("backend", "memory", "progress_thread", "lengths", "iterations", "warmup",
                                          "timeouts", "proto_info")}
                  | {"sweep": params.get("sweep"), "fault": params.get("fault"), "agents": len(params["agents"]),
                     "directions": params.get("directions") or ["forward"]},
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


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.markup import escape as esc
    from rich.table import Table
    from rich.text import Text

    def plain(*cells) -> list:  # table cells shown as given: a [bracket] in a name or path is not markup
        return [Text(str(c)) for c in cells]

    console = Console(stderr=True, highlight=False)
    if not console.is_terminal:
        console.width = 140
    g = report["geometry"]
    console.print(f"[bold]{esc(report['recipe'])}[/]  tk validate cluster ({report['mode']})  "
                  f"{len(report['nodes'])} agents, {report['schedule']['rounds']} round(s); "
                  f"{g['mode']} descriptors of {_human_bytes(g['descriptor_bytes'])}, tokens_per_block "
                  f"{g['tokens_per_block']}, lengths {', '.join(map(str, report['params']['lengths']))} tokens")
    for note in g["notes"]:
        console.print(f"[yellow]note:[/] {esc(note)}")
    bad = [i for i in report["preflight"] if i["status"] == "fail"]
    if bad:
        t = Table(title="Preflight failures", title_justify="left")
        for col in ("check", "agent", "detail"):
            t.add_column(col, overflow="fold")
        for i in bad:
            t.add_row(*plain(i["name"], i.get("agent") or "-", i["detail"]))
        console.print(t)
    t = Table(title=f"Pairs (bandwidth and latency of the longest request; threshold "
                    f"{report['thresholds']['min_gbps']:.3f} GB/s)", title_justify="left")
    for col in ("context / generation", "direction", "op", "bytes verified", "GB/s", "p50 ms", "p99 ms", "verdict"):
        t.add_column(col, justify="left" if col in ("context / generation", "direction", "op", "verdict") else "right",
                     overflow="fold")
    for p in report["pairs"]:
        verdict = "[green]pass[/]" if p["passed"] else f"[red]FAIL[/] {esc(p['error'] or '')}"
        way = "ctx -> gen" if p.get("direction", "forward") == "forward" else "gen -> ctx"
        t.add_row(*plain(f"{p['src']} / {p['dst']}", way, p["op"]), _human_bytes(p["bytes_verified"]),
                  _f(p["gbps"]), _f(p["latency_p50_ms"]), _f(p["latency_p99_ms"]), verdict)
    console.print(t)
    _print_matrix_summary(console, report["bandwidth_matrix"])
    if any(s["gbps_median"] or any(x.get("gbps_median") for x in s.get("ops", {}).values()) for s in report["sweep"]):
        ops = list(report["sweep"][0].get("ops", {}) or ["WRITE"])
        passes = max(s.get("passes", 1) for s in report["sweep"])
        t = Table(title=esc(f"tokens_per_block sweep (context -> generation; per op the median over {passes} "
                            "pass(es) of each pass's median over the pairs, [slowest-fastest pass])"),
                  title_justify="left")
        for col in ("tokens_per_block", "descriptor", "descriptors", *(f"{op} GB/s" for op in ops)):
            t.add_column(col, justify="right")
        for s in report["sweep"]:
            cells = []
            for op in ops:
                x = s.get("ops", {}).get(op) or {"gbps_median": s["gbps_median"], "gbps_min": None, "gbps_max": None}
                rng = f" [{_f(x['gbps_min'])}-{_f(x['gbps_max'])}]" if x.get("gbps_min") is not None else ""
                cells.append(f"{_f(x['gbps_median'])}{rng}")
            t.add_row(str(s["tokens_per_block"]), _human_bytes(s["descriptor_bytes"]), str(s["descriptors"] or "-"),
                      *cells)
        console.print(t)
    rec = report["recommendation"]
    if rec:
        status = rec.get("status", "change")
        if status == "change" and not rec["matches_recipe"]:
            head = f"recommended tokens_per_block: [bold]{rec['tokens_per_block']}[/] (recipe: {rec['recipe_tokens_per_block']})"
        elif status == "withheld":
            head = f"tokens_per_block: [bold]no recommendation[/] (recipe: {rec['recipe_tokens_per_block']})"
        else:
            head = f"tokens_per_block: keep the recipe's [bold]{rec['recipe_tokens_per_block']}[/]"
        console.print(f"{head}. {esc(rec['reason'][:1].upper() + rec['reason'][1:])}")
    for caveat in report.get("timing", {}).get("caveats", []):
        console.print(f"[yellow]note:[/] {esc(caveat)}")
    lr = report["largest_request"]
    if lr["measured_transfer_ms"] is not None:
        verdict = "[red]the transfer dominates[/]" if lr["transfer_dominates"] else "the prefill dominates"
        console.print(f"largest request ({lr['tokens']} tokens, {_human_bytes(lr['bytes_per_rank'])} per rank): "
                      f"{lr['measured_transfer_ms']:.1f} ms at the slowest pair's {lr['worst_pair_gbps']:.3f} GB/s "
                      f"(nominal estimate {lr['estimated_transfer_ms']:.1f} ms) vs prefill ~{lr['estimated_prefill_ms']:.1f} ms: "
                      f"{verdict}")
    n_ok = sum(p["passed"] for p in report["pairs"])
    if report["passed"]:
        console.print(f"[green bold]PASSED[/]: {n_ok}/{len(report['pairs'])} pair checks, every byte verified. "
                      f"Report: {esc(report['report_file'])}")
    else:
        console.print(f"[red bold]FAILED[/]: {n_ok}/{len(report['pairs'])} pair checks passed; "
                      f"{len(report['failures'])} problem(s). Report: {esc(report['report_file'])}")
