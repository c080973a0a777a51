"""Bench outputs: results.json, results.csv, verdict.json, PNG plots (matplotlib, Agg) and a one-page report.md."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

from toolkit.bench.verdict import Outcome, Stage
from toolkit.runtime import files

CSV_COLUMNS = ["target", "cell", "isl", "osl", "turns", "concurrency", "request_rate", "requests", "errors",
               "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
               "e2e_p50_ms", "e2e_p99_ms", "request_throughput", "output_tokens_per_s",
               "output_tokens_per_s_per_gpu", "output_tokens_per_s_per_user"]


def cell_row(target: str, cell, res, gpus: int | None) -> dict:
    from toolkit.bench.results import TOKEN_TIMING_METRICS

    def s(metric: str, stat: str = "avg"):
        if res is None or (metric in TOKEN_TIMING_METRICS and res.one_chunk_streams):
            return None  # not measured, or not measurable (every stream in one chunk): shown as "-", never 0
        return res.stat(metric, stat)

    out_tps = s("output_token_throughput")
    prof = res.profiled if res else []
    return {"target": target, "cell": cell.name, "isl": cell.isl, "osl": cell.osl, "turns": cell.turns,
            "concurrency": cell.concurrency, "request_rate": cell.request_rate, "requests": len(prof),
            "errors": sum(1 for r in prof if not r.ok),
            "ttft_p50_ms": s("time_to_first_token", "p50"), "ttft_p99_ms": s("time_to_first_token", "p99"),
            "itl_p50_ms": s("inter_chunk_latency", "p50"), "itl_p99_ms": s("inter_chunk_latency", "p99"),
            "tpot_p50_ms": s("inter_token_latency", "p50"), "tpot_p99_ms": s("inter_token_latency", "p99"),
            "e2e_p50_ms": s("request_latency", "p50"), "e2e_p99_ms": s("request_latency", "p99"),
            "request_throughput": s("request_throughput"), "output_tokens_per_s": out_tps,
            "output_tokens_per_s_per_gpu": (out_tps / gpus) if out_tps is not None and gpus else None,
            "output_tokens_per_s_per_user": s("output_token_throughput_per_user")}


def csv_text(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r[k]) for k in CSV_COLUMNS})
    return buf.getvalue()


def _save(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    files.write_regular_atomically(path, buf.getvalue(), sync=False)


def _plot(path: Path, title: str, xlabel: str, ylabel: str, series: dict[str, list[tuple[float, float]]],
          logx: bool = False) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {k: sorted(v) for k, v in series.items() if v}
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    for label, pts in series.items():
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="o", linestyle="--" if label.startswith("aggregated") else "-", label=label)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return True


def write_plots(out: Path, rows: list[dict]) -> list[str]:
    """ttft_vs_isl.png, throughput_vs_concurrency.png, pareto.png (where the data has two points or more)."""
    written = []
    by = lambda key: {}  # noqa: E731
    ttft, thr, pareto = by(0), by(1), by(2)
    for r in rows:
        load = f"c{r['concurrency']}" if r["concurrency"] is not None else f"r{r['request_rate']:g}"
        if r["ttft_p50_ms"] is not None:
            ttft.setdefault(f"{r['target']} {load}", []).append((r["isl"], r["ttft_p50_ms"]))
        if r["concurrency"] is not None and r["request_throughput"] is not None:
            thr.setdefault(f"{r['target']} isl{r['isl']}", []).append((r["concurrency"], r["request_throughput"]))
        y = r["output_tokens_per_s_per_gpu"]
        if y is None:
            y = r["output_tokens_per_s"]
        if r["output_tokens_per_s_per_user"] is not None and y is not None:
            pareto.setdefault(f"{r['target']} isl{r['isl']}", []).append((r["output_tokens_per_s_per_user"], y))
    if any(len({x for x, _ in v}) > 1 for v in ttft.values()) or len(ttft) > 0:
        if _plot(out / "ttft_vs_isl.png", "TTFT p50 vs input length", "input tokens (ISL)", "TTFT p50 (ms)", ttft):
            written.append("ttft_vs_isl.png")
    if _plot(out / "throughput_vs_concurrency.png", "Request throughput vs concurrency", "concurrency",
             "requests/s", thr, logx=True):
        written.append("throughput_vs_concurrency.png")
    if _plot(out / "pareto.png", "Throughput per GPU vs per user", "output tokens/s/user",
             "output tokens/s/GPU", pareto):
        written.append("pareto.png")
    return written


def write_turn_plot(path: Path, series: dict[str, list[dict]], title: str) -> bool:
    """Per turn, one line per series: TTFT p50 (left) and recomputed tokens per request, answers dashed (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {k: v for k, v in series.items() if v}
    if not series:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=100)
    for label, turns in series.items():
        xs = [t["turn"] for t in turns]
        ax1.plot(xs, [t["ttft_p50_ms"] for t in turns], marker="o", label=label)
        if any(t.get("recomputed_tokens") is not None for t in turns):
            line, = ax2.plot(xs, [t.get("recomputed_tokens") for t in turns], marker="o", label=f"{label}: all")
            ax2.plot(xs, [t.get("recomputed_answer_tokens") for t in turns], marker="x", linestyle="--",
                     color=line.get_color(), label=f"{label}: answers")
    ax1.set_title("TTFT p50 per turn")
    ax1.set_xlabel("turn")
    ax1.set_ylabel("ms")
    ax2.set_title("recomputed tokens per request")
    ax2.set_xlabel("turn")
    ax2.set_ylabel("tokens")
    if not ax2.lines:
        ax2.text(0.5, 0.5, "cached_tokens not usable:\nsee the reuse checks", ha="center", va="center",
                 transform=ax2.transAxes, fontsize=9)
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return True


TURN_COLUMNS = (("turn", "turn"), ("requests", "req"), ("prompt_tokens", "prompt"), ("cached_tokens", "cached"),
                ("reusable_prompt_tokens", "reusable: prompts"), ("reusable_answer_tokens", "reusable: answers"),
                ("recomputed_prompt_tokens", "recomputed: prompts"),
                ("recomputed_answer_tokens", "recomputed: answers"), ("ttft_p50_ms", "TTFT p50"),
                ("ttft_p99_ms", "TTFT p99"), ("kv_bytes_moved", "KV MB moved"))


def _turn_cell(row: dict, key: str) -> str:
    v = row.get(key)
    if key == "kv_bytes_moved" and isinstance(v, (int, float)):
        return f"{v / 1e6:.3g}"
    return _fmt(v)


def multi_turn_markdown(doc: dict) -> list[str]:
    lines = []
    for cell, mt in (doc.get("multi_turn") or {}).items():
        lines += ["", f"## Multi-turn reuse: {cell}", "",
                  f"{mt['sessions']} conversations, {mt['requests']} requests. Tokens are means per request, from "
                  "what the servers reported (usage.prompt_tokens, completion_tokens, "
                  "prompt_tokens_details.cached_tokens). Reusable: the history the client resent (earlier prompts "
                  "and earlier answers); recomputed: the part of it the server computed again.", ""]
        if not mt["cached_tokens_trusted"]:
            lines += ["**The reported cached_tokens are not the context servers' reuse** (see the reuse checks): "
                      "cached and recomputed are left out.", ""]
        lines += ["| " + " | ".join(h for _, h in TURN_COLUMNS) + " |", "|" + "---|" * len(TURN_COLUMNS)]
        for t in mt["turns"]:
            lines.append("| " + " | ".join(_turn_cell(t, k) for k, _ in TURN_COLUMNS) + " |")
        if mt.get("reuse_share") is not None:
            lines += ["", f"Reused: {100 * mt['reuse_share']:.1f} % of the resent history (turns 2 on)."]
        lines += ["", f"KV MB moved: {mt['kv_bytes_moved_note']}."]
        pb = mt.get("pullback_projection") or {}
        lines += ["", "### Pull-back of the previous answers' KV: a projection", "", f"{pb.get('label', '')}.", "",
                  f"**{pb.get('summary', '')}**"]
        if pb.get("turns"):
            inp = pb["inputs"]
            lines += ["", "| turn | answer tokens recomputed | recompute ms | transfer back ms | TTFT saved ms | "
                      "TTFT p50 ms |", "|---|---|---|---|---|---|"]
            for r in pb["turns"]:
                lines.append(f"| {r['turn']} | {_fmt(r['recomputed_answer_tokens'])} | {_fmt(r['recompute_ms'])} | "
                             f"{_fmt(r['transfer_ms'])} | {_fmt(r['saved_ttft_ms'])} | {_fmt(r['ttft_p50_ms'])} |")
            lines += ["", "Inputs:", f"- prefill: {inp['prefill_ms_per_token'] * 1e3:.4g} us per token "
                      f"({inp['prefill_source']})",
                      f"- KV: {inp['kv_bytes_per_token_per_rank']:.0f} bytes per token per rank ({inp['kv_bytes_source']})",
                      f"- generation -> context bandwidth: {inp['reverse_gbps']:g} GB/s, {inp['reverse_source']} "
                      f"({inp['reverse_detail']})", f"- not modelled: {inp['not_modelled']}"]
    return lines


def _fmt(v, nd=3):
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}g}"
    return str(v)


def markdown(doc: dict, plots: list[str]) -> str:
    v = doc["verdict"]
    lines = [f"# tk bench: {doc['name']}", "",
             f"**Verdict: {v['summary']}** (exit {v['exit_code']})", "",
             f"- run: `{doc['run']['run_dir']}` ({doc['run']['engine']}, {doc['run'].get('engine_label') or ''})",
             f"- endpoint: `{doc['run']['endpoint']}`, model `{doc['model']}`, tokenizer `{doc['tokenizer']}`",
             f"- workload: {doc['workload']['kind']}, seed {doc['workload']['seed']}, aiperf "
             f"{doc.get('aiperf_version') or '?'} (streaming, warm-up excluded, ignore_eos)",
             f"- GPUs: {doc.get('gpus') or 'unknown'}"]
    for n in doc["workload"]["notes"]:
        lines.append(f"- note: {n}")
    lines += ["", "## Results", "",
              "| target | cell | req | err | TTFT p50 | TTFT p99 | ITL p99 | TPOT p50 | req/s | tok/s | tok/s/GPU | tok/s/user |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        lines.append(f"| {r['target']} | {r['cell']} | {r['requests']} | {r['errors']} | {_fmt(r['ttft_p50_ms'])} | "
                     f"{_fmt(r['ttft_p99_ms'])} | {_fmt(r['itl_p99_ms'])} | {_fmt(r['tpot_p50_ms'])} | "
                     f"{_fmt(r['request_throughput'])} | {_fmt(r['output_tokens_per_s'])} | "
                     f"{_fmt(r['output_tokens_per_s_per_gpu'])} | {_fmt(r['output_tokens_per_s_per_user'])} |")
    lines += ["", "Latencies in ms. ITL: gaps between streamed chunks; TPOT: (latency - TTFT) / (OSL - 1).", "",
              "## Checks", "", "| stage | check | cell | ok | reason |", "|---|---|---|---|---|"]
    for c in v["checks"]:
        ok = "skipped" if c.get("skipped") else ("yes" if c["ok"] else "**NO**")
        lines.append(f"| {c['stage']} | {c['name']} | {c.get('cell') or ''} | {ok} | {c['reason']} |")
    lines += multi_turn_markdown(doc)
    est = doc.get("estimates")
    if est:
        lines += ["", "## Measured beside estimated", "", "| quantity | estimated | measured | note |",
                  "|---|---|---|---|"]
        for e in est:
            lines.append(f"| {e['quantity']} | {_fmt(e['estimated'])} | {_fmt(e['measured'])} | {e['note']} |")
    if doc.get("supervision"):
        lines += ["", "## The deployment's supervision during the run", "",
                  "The job restarted or lost components while it was measured (its events, state/events.jsonl):",
                  "", "| time | component | event | reason |", "|---|---|---|---|"]
        for e in doc["supervision"]:
            stamp = time.strftime("%H:%M:%S", time.localtime(e["time"]))
            lines.append(f"| {stamp} | {e['component'] or ''} | {e['event']} | {e['reason'] or ''} |")
    if doc.get("baseline_error"):
        lines += ["", "## Disaggregated beside aggregated", "",
                  f"**No baseline:** {doc['baseline_error']}. The deployment's own results above stand."]
    comp = doc.get("baseline")
    if comp:
        lines += ["", "## Disaggregated beside aggregated", "",
                  f"Baseline `{comp['endpoint']}`; answers agree: **{comp['answers']['agree']}** "
                  f"({comp['answers']['matching']}/{comp['answers']['prompts']} greedy answers identical)", "",
                  "| cell | TTFT p50 disagg/agg | req/s disagg/agg | tok/s/GPU disagg/agg |", "|---|---|---|---|"]
        for c in comp["cells"]:
            lines.append(f"| {c['cell']} | {_fmt(c['ttft_p50_ratio'])} | {_fmt(c['request_throughput_ratio'])} | "
                         f"{_fmt(c['tokens_per_gpu_ratio'])} |")
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    lines += ["", "## Files", "", "- [results.json](results.json), [results.csv](results.csv), "
              "[verdict.json](verdict.json), [aiperf.log](aiperf.log)",
              "- aiperf exports: " + ", ".join(f"[{c}](aiperf/{c}/profile_export_aiperf.json)"
                                               for c in doc["cells_dirs"]), ""]
    return "\n".join(lines)


def write_all(out: Path, doc: dict) -> list[str]:
    plots = write_plots(out, doc["rows"])
    if doc.get("multi_turn"):
        if write_turn_plot(out / "turns.png", {c: mt["turns"] for c, mt in doc["multi_turn"].items()},
                           f"per-turn TTFT and recomputed tokens: {doc['name']}"):
            plots.append("turns.png")
    doc["plots"] = plots
    for name, text in (("results.json", json.dumps(doc, indent=2, default=str) + "\n"),
                       ("results.csv", csv_text(doc["rows"])),
                       ("verdict.json", json.dumps(doc["verdict"], indent=2, default=str) + "\n"),
                       ("report.md", markdown(doc, plots))):
        files.write_regular_atomically(out / name, text)
    return plots


def print_summary(doc: dict) -> None:
    """Rich tables on stderr: the numbers per target and cell, the baseline side by side, then the verdict as
    one line per stage with every failed check spelled out."""
    from rich.markup import escape
    from rich.table import Table

    from toolkit.progress import stderr_console

    con = stderr_console(120)
    t = Table(title=f"tk bench {doc['name']}", title_justify="left")
    for col in ("target", "cell", "req", "err", "TTFT p50", "TTFT p99", "ITL p99", "req/s", "tok/s/GPU",
                "tok/s/user"):
        t.add_column(col, no_wrap=True, justify="left" if col in ("target", "cell") else "right")
    for r in doc["rows"]:
        t.add_row(r["target"], r["cell"], str(r["requests"]), str(r["errors"]), _fmt(r["ttft_p50_ms"]),
                  _fmt(r["ttft_p99_ms"]), _fmt(r["itl_p99_ms"]), _fmt(r["request_throughput"]),
                  _fmt(r["output_tokens_per_s_per_gpu"]), _fmt(r["output_tokens_per_s_per_user"]))
    con.print(t)
    for note in (doc.get("workload") or {}).get("notes", []):
        con.print(f"workload: {escape(note)}", highlight=False)
    if doc.get("baseline_error"):
        con.print(f"[red]no aggregated baseline:[/red] {escape(doc['baseline_error'])}")
    base = doc.get("baseline")
    if base:
        b = Table(title="disaggregated / aggregated on the same GPUs", title_justify="left")
        for col in ("cell", "TTFT p50", "req/s", "tok/s/GPU"):
            b.add_column(col, no_wrap=True, justify="left" if col == "cell" else "right")
        for c in base["cells"]:
            b.add_row(c["cell"], _ratio_text(c["ttft_p50_ratio"]), _ratio_text(c["request_throughput_ratio"]),
                      _ratio_text(c["tokens_per_gpu_ratio"]))
        con.print(b)
        a = base["answers"]
        con.print(f"greedy answers: {a['matching']}/{a['prompts']} identical" + ("" if a["agree"] else
                  " [red](they differ: see report.md)[/red]"))
    print_turns(con, doc)
    v = doc["verdict"]
    for stage in Stage:
        checks = [c for c in v["checks"] if c["stage"] == stage and not c.get("skipped")]
        if not checks:
            continue
        bad = [c for c in checks if not c["ok"]]
        if stage == Stage.REUSE:  # findings explain the numbers; they do not change the exit code
            con.print(f"{stage}: " + (f"{len(checks)} check(s) passed" if not bad else
                                      f"[yellow]{len(bad)} finding(s)[/yellow] (the exit code is unchanged)"))
        else:
            con.print(f"{stage}: " + (f"{len(checks)} check(s) passed" if not bad else
                                      f"[red]{len(bad)} of {len(checks)} check(s) failed[/red]"))
        for c in bad:
            where = escape(f" [{c['cell']}]") if c.get("cell") else ""
            con.print(f"  [red]x[/red] {escape(c['name'])}{where}: {escape(c['reason'])}", highlight=False)
    one_chunk = [c["cell"] for c in v["checks"] if c["name"] == "token_timing"]
    if one_chunk:
        con.print(f"note: the streams arrived in one chunk in {len(one_chunk)} cell(s): ITL, TPOT and tokens/s per "
                  "user are not measurable there (shown as -), and no SLA objective on them was judged",
                  highlight=False)
    style = "green" if v["exit_code"] == Outcome.PASS else "red"
    con.print(f"[{style}]{v['summary']}[/{style}]", soft_wrap=True)  # one line, whatever its length (grep-able)
    con.print(f"report: {doc['bench_dir']}/report.md", soft_wrap=True)  # a path is never split across lines


def print_turns(con, doc: dict) -> None:
    from rich.table import Table

    for cell, mt in (doc.get("multi_turn") or {}).items():
        t = Table(title=f"multi-turn reuse per turn, {cell} (tokens per request)", title_justify="left")
        for _, head in TURN_COLUMNS:
            t.add_column(head, justify="right")
        for row in mt["turns"]:
            t.add_row(*(_turn_cell(row, k) for k, _ in TURN_COLUMNS))
        con.print(t)
        pb = mt.get("pullback_projection") or {}
        con.print(f"pull-back ({pb.get('label', 'projection')}): {pb.get('summary', '')}", highlight=False)


def _ratio_text(x) -> str:
    return f"{x:.2f}x" if isinstance(x, (int, float)) else "-"
