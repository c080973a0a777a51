"""Turn the agents' result files into one report (the JSON document `--json` prints, schema in
report.schema.json) and show it: live progress while agents run, then the per-pair table."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from toolkit.progress import StatusLine
from validation.stats import percentile

SCHEMA_FILE = Path(__file__).resolve().parent / "report.schema.json"
REPORT_VERSION = 1
RECOMMEND_WITHIN = 0.9  # the smallest tokens_per_block within 10 % of the best measured bandwidth


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
    """(src, dst, op) -> {agent id: record}."""
    out: dict = {}
    for aid, res in results.items():
        for rec in (res or {}).get("pairs", []):
            out.setdefault((rec["src"], rec["dst"], rec["op"]), {})[aid] = rec
    return out


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
    """One entry per (context node, generation node, op), every scheduled one, merged from both sides."""
    recs = _records(results)
    n_lengths = len(params["lengths"])
    host = {aid: (res or {}).get("host") for aid, res in results.items()}
    out = []
    for r, pairs in enumerate(params["rounds"]):
        for src, dst in pairs:
            for op in ("WRITE", "READ"):
                by = recs.get((src, dst, op), {})
                initiator = src if op == "WRITE" else dst
                ini, ver = by.get(initiator), by.get(dst)
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
                        "bytes_verified": (e_v or {}).get("bytes_verified", 0),
                        "transfers_verified": (e_v or {}).get("transfers_verified", 0),
                        "error": (e_v or {}).get("error") or (e_i or {}).get("error"),
                    })
                error = None
                for rec in (ver, ini, by.get(src)):
                    if rec and rec.get("error"):
                        error = rec["error"]
                        break
                complete = len(lengths) == n_lengths and all(x["iterations"] for x in lengths)
                if error is None and not complete:
                    gone = [a for a in dict.fromkeys((initiator, dst, src)) if a not in by]
                    if gone:
                        error = "; ".join(absence_reason(a, results, exits) for a in gone) if final else None
                    elif final:
                        error = "incomplete: the agents stopped before finishing this pair"
                longest = lengths[-1] if complete else None
                gbps = longest["gbps"] if longest else None
                entry = {
                    "src": src, "dst": dst, "op": op, "round": r,
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
                        entry["error"] = (f"bandwidth {gbps:.3f} GB/s for the {longest['tokens']}-token request is "
                                          f"below the threshold {min_gbps:.3f} GB/s")
                    else:
                        entry["passed"] = True
                entry["done"] = entry["passed"] or entry["error"] is not None
                out.append(entry)
    return out


def merge_sweep(params: dict, results: dict, geom: dict) -> tuple[list, dict | None]:
    sweep = params.get("sweep")
    if not sweep:
        return [], None
    ini: dict = {}
    errs: dict = {}
    for res in results.values():
        for e in (res or {}).get("sweep", []):
            k = e["tokens_per_block"]
            if e.get("latencies_s"):
                ini.setdefault(k, []).append(e)
            if e.get("error"):
                errs.setdefault(k, []).append(f"{e['src']} -> {e['dst']}: {e['error']}")
    rows = []
    for tpb in sweep["tokens_per_block"]:
        entries = ini.get(tpb, [])
        bws = [b for b in (_gbps(e["bytes"], e["latencies_s"]) for e in entries) if b]
        lats = [percentile(e["latencies_s"], 50) for e in entries]
        frag = geom["frag_bytes_per_token"] if geom["mode"] == "fragment" else \
            geom["layers"] * geom["kv_factor"] * geom["slot_bytes_per_token"]["ctx"]
        rows.append({
            "tokens_per_block": tpb, "descriptor_bytes": tpb * frag,
            "descriptors": entries[0]["descriptors"] if entries else None,
            "request_tokens": sweep["tokens"], "pairs": len(bws),
            "gbps_median": round(statistics.median(bws), 4) if bws else None,
            "gbps_min": round(min(bws), 4) if bws else None,
            "latency_p50_ms": _ms(statistics.median(lats)) if lats else None,
            "errors": errs.get(tpb, []),
        })
    measured = [r for r in rows if r["gbps_median"]]
    if not measured:
        return rows, None
    best = max(r["gbps_median"] for r in measured)
    pick = min((r for r in measured if r["gbps_median"] >= RECOMMEND_WITHIN * best), key=lambda r: r["tokens_per_block"])
    current = geom["tokens_per_block"]
    cur = next((r for r in measured if r["tokens_per_block"] == current), None)
    reason = (f"smallest tokens_per_block within {1 - RECOMMEND_WITHIN:.0%} of the best median bandwidth "
              f"({best:.3f} GB/s); smaller blocks waste less KV memory per request and reuse prefixes at a finer grain")
    if cur and pick["tokens_per_block"] != current:
        reason += (f"; the recipe's {current} measured {cur['gbps_median']:.3f} GB/s vs {pick['gbps_median']:.3f} "
                   f"at {pick['tokens_per_block']}")
    return rows, {"tokens_per_block": pick["tokens_per_block"], "recipe_tokens_per_block": current,
                  "matches_recipe": pick["tokens_per_block"] == current, "gbps_median": pick["gbps_median"],
                  "reason": reason}


def largest_request(plan_info: dict, pairs: list) -> dict:
    measured = [p["gbps"] for p in pairs if p["gbps"]]
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


def bandwidth_matrix(pairs: list) -> dict:
    """Context (rows) x generation (columns) GB/s of the longest validated request, per op: the machine-readable
    form `tk size --measured` reads. None where a pair was not measured (failed or not scheduled)."""
    out: dict = {"unit": "GB/s (1e9 bytes/s), longest validated request, bytes / median latency", "ops": {}}
    for op in ("WRITE", "READ"):
        rows = [p for p in pairs if p["op"] == op]
        if not rows:
            continue
        srcs = sorted({p["src"] for p in rows})
        dsts = sorted({p["dst"] for p in rows})
        cell = {(p["src"], p["dst"]): p["gbps"] for p in rows}
        measured = [v for v in cell.values() if v]
        out["ops"][op] = {
            "context": srcs, "generation": dsts,
            "gbps": [[cell.get((s_, d)) for d in dsts] for s_ in srcs],
            "min": min(measured) if measured else None,
            "median": statistics.median(measured) if measured else None,
            "max": max(measured) if measured else None,
        }
    primary = out["ops"].get("WRITE") or out["ops"].get("READ") or {}
    out["op"] = "WRITE" if "WRITE" in out["ops"] else ("READ" if out["ops"] else None)
    out["context"] = primary.get("context", [])
    out["generation"] = primary.get("generation", [])
    out["gbps"] = primary.get("gbps", [])
    return out


def build_report(*, params: dict, results: dict, exits: dict, coordinator_preflight: list, plan_info: dict,
                 min_fraction: float, run: dict) -> dict:
    nominal = params["expect"]["nominal_gbps"]
    min_gbps = min_fraction * nominal
    pairs = merge_pairs(params, results, exits, min_gbps)
    for p in pairs:
        p.pop("done", None)
    sweep, rec = merge_sweep(params, results, params["geometry"])
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
    passed = bool(pairs) and all(p["passed"] for p in pairs) and not any(i["status"] == "fail" for i in preflight)
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
                                          "descriptors_per_block", "descriptor_bytes", "pool_bytes", "notes")},
        "thresholds": {"transport": params["expect"]["transport"], "nominal_gbps": nominal,
                       "min_fraction": min_fraction, "min_gbps": round(min_gbps, 6),
                       "applies_to": "bandwidth of the longest validated request, per pair and op"},
        "sweep": sweep,
        "recommendation": rec,
        "largest_request": largest_request(plan_info, pairs),
        "bandwidth_matrix": bandwidth_matrix(pairs),
        "params": {k: params[k] for k in ("backend", "memory", "progress_thread", "lengths", "iterations", "warmup",
                                          "timeouts", "proto_info")}
                  | {"sweep": params.get("sweep"), "fault": params.get("fault"), "agents": len(params["agents"])},
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
    for col in ("context -> generation", "op", "bytes verified", "GB/s", "p50 ms", "p99 ms", "verdict"):
        t.add_column(col, justify="right" if col not in ("context -> generation", "op", "verdict") else "left",
                     overflow="fold")
    for p in report["pairs"]:
        verdict = "[green]pass[/]" if p["passed"] else f"[red]FAIL[/] {esc(p['error'] or '')}"
        t.add_row(*plain(f"{p['src']} -> {p['dst']}", p["op"]), _human_bytes(p["bytes_verified"]), _f(p["gbps"]),
                  _f(p["latency_p50_ms"]), _f(p["latency_p99_ms"]), verdict)
    console.print(t)
    if any(s["gbps_median"] for s in report["sweep"]):
        t = Table(title="tokens_per_block sweep (WRITE, median over pairs)", title_justify="left")
        for col in ("tokens_per_block", "descriptor", "descriptors", "GB/s", "min GB/s", "p50 ms"):
            t.add_column(col, justify="right")
        for s in report["sweep"]:
            t.add_row(str(s["tokens_per_block"]), _human_bytes(s["descriptor_bytes"]), str(s["descriptors"] or "-"),
                      _f(s["gbps_median"]), _f(s["gbps_min"]), _f(s["latency_p50_ms"]))
        console.print(t)
    rec = report["recommendation"]
    if rec:
        console.print(f"recommended tokens_per_block: [bold]{rec['tokens_per_block']}[/] "
                      f"({'the recipe already uses it' if rec['matches_recipe'] else 'recipe: ' + str(rec['recipe_tokens_per_block'])}); "
                      f"{esc(rec['reason'])}")
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
