"""tk size's table and tk plan --predict's lines, rich on stderr (stdout stays for --json and the recipe)."""

from __future__ import annotations


def _console():
    import sys

    from rich.console import Console

    # The table is 130 columns wide; a pipe or a CI log gets it whole instead of wrapped at 80.
    return Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 150)


def print_size(result, top: int = 15) -> None:
    from rich.table import Table
    from rich.text import Text

    console = _console()
    bw = result.bandwidth
    console.print(Text(f"tk size: {result.model.name} on {result.gpus} x {result.system}, ISL {result.isl}, "
                       f"OSL {result.osl}; SLA TTFT <= {result.ttft_ms:g} ms, TPOT <= {result.tpot_ms:g} ms"))
    console.print(Text(f"  engine: aiconfigurator {result.to_dict()['aiconfigurator']} ({result.aic_model}); KV transfer "
                       f"at {bw.describe()}"))
    t = Table(title=None, show_lines=False)
    for col, just in (("#", "right"), ("aic#", "right"), ("SLA", "center"), ("tk", "center"), ("mode", "left"),
                      ("configuration", "left"), ("GPUs", "right"), ("tok/s/GPU", "right"), ("tok/s/user", "right"),
                      ("TTFT ms", "right"), ("+xfer ms", "right"), ("TPOT ms", "right")):
        t.add_column(col, justify=just)
    shown = result.candidates[:top]
    if result.chosen is not None and result.chosen not in shown:
        shown = shown + [result.chosen]
    for c in shown:
        i = result.candidates.index(c) + 1
        moved = "" if c.aic_rank == i else (" ▲" if c.aic_rank > i else " ▼")
        mark = "✔" if result.meets(c) else "✘"
        style = "bold green" if c is result.chosen else (None if result.meets(c) else "dim")
        tk = "▶" if c is result.chosen else ("✘" if c.rejected else "")
        t.add_row(str(i), f"{c.aic_rank}{moved}", mark, tk, c.mode, Text(c.shape()), f"{c.gpus_used}",
                  f"{c.tokens_s_gpu:.1f}", f"{c.tokens_s_user:.1f}", f"{c.ttft_total_ms:.1f}",
                  f"{c.transfer_ms:.2f}" if c.mode == "disagg" else "-", f"{c.tpot_ms:.2f}", style=style)
    console.print(t)
    meets = sum(result.meets(c) for c in result.candidates)
    console.print(Text(f"  {meets} of {len(result.candidates)} candidates meet the SLA (✔); aic# is aiconfigurator's "
                       f"rank without the transfer term (▲▼ where tk's differs); TTFT includes the transfer"))
    if any(c.rejected for c in result.candidates):
        console.print(Text("  tk: ▶ the recipe; ✘ not deployable as sized (why below)"))
    for c in shown:
        if c.rejected:
            console.print(Text(f"  ✘ #{result.candidates.index(c) + 1} {c.shape()}: {c.rejected}", style="yellow"))
    if result.rank_changes:
        flips = [r for r in result.rank_changes if r["meets_sla_without_transfer"] != r["meets_sla"]]
        console.print(Text(f"  the transfer term moved {len(result.rank_changes)} candidate(s)"
                           + (f"; {len(flips)} no longer meet the SLA: " + "; ".join(r["shape"] for r in flips[:3])
                              if flips else "")))
    else:
        console.print(Text("  the transfer term changed no rank"))
    for note in result.notes:
        console.print(Text(f"  note: {note}"))
    c = result.chosen
    if c is not None:
        console.print(Text(f"chosen: {c.shape()} — TTFT {c.ttft_total_ms:.1f} ms (transfer {c.transfer_ms:.2f}), "
                           f"TPOT {c.tpot_ms:.2f} ms, {c.tokens_s_gpu:.1f} tok/s/GPU", style="bold"))
    rc = result.recheck
    for e in rc.get("errors", []):
        console.print(Text(f"  tk's recipe/plan rejects it: {e}", style="red"))
    for d in rc.get("disagreements", []):
        console.print(Text(f"  disagreement: {d}", style="yellow"))
    for w in rc.get("warnings", []):
        console.print(Text(f"  plan warning: {w}", style="yellow"))
    for n in rc.get("notes", []):
        console.print(Text(f"  plan note: {n}", style="yellow"))
    if rc.get("ok"):
        plan = rc.get("plan", {})
        dep = rc.get("deployed", {})
        console.print(Text(f"  re-checked by tk's plan: deploys exactly this ({dep.get('GPUs')} GPUs on "
                           f"{plan.get('nodes')} node(s), TensorRT-LLM line {plan.get('trtllm_version')})"))


def print_prediction(p: dict) -> None:
    from rich.text import Text

    console = _console()
    console.print(Text(f"prediction (aiconfigurator {p['aiconfigurator']}, {p['system']}, {p['aiconfigurator_model']}, "
                       f"ISL {p['isl']} / OSL {p['osl']}):", style="bold"))

    def shape(r: dict) -> str:
        return f"{r['layout'] if 'layout' in r else 'TP' + str(r['tp'])}{' PP' + str(r['pp']) if r['pp'] > 1 else ''}" \
               f" bs{r['batch']}{'/rank' if r.get('attention_dp') else ''}"

    mem = p.get("aiconfigurator_memory_gib") or {}
    if p.get("mode") == "aggregated":
        agg = p["aggregated"]
        console.print(Text(f"  {agg['instances']}x agg {shape(agg)} at full batch, up to "
                           f"{p['prompt_tokens_per_step']} prompt tokens per step (max_num_tokens)"))
        console.print(Text(f"  TTFT {p['ttft_ms']:.1f} ms, no KV transfer (aggregated)"))
    else:
        ctx, gen = p["context"], p["generation"]
        console.print(Text(f"  {ctx['instances']}x ctx {shape(ctx)} + {gen['instances']}x gen {shape(gen)} "
                           "at full batch"))
        tr = p["transfer"]
        console.print(Text(f"  TTFT {p['ttft_total_ms']:.1f} ms = {p['ttft_ms']:.1f} prefill + {p['transfer_ms']:.2f} "
                           f"KV transfer ({tr['bytes_per_token_per_ctx_rank']} B/token/rank x {tr['isl']} at "
                           f"{tr['gbps']:g} GB/s {tr['transport']}, nominal)"))
    console.print(Text(f"  TPOT {p['tpot_ms']:.2f} ms, {p['tokens_s_gpu']:.1f} tokens/s/GPU, "
                       f"{p['tokens_s_user']:.1f} tokens/s/user, concurrency {p['concurrency']}"))
    if mem.get("context") is not None:
        console.print(Text(f"  aiconfigurator's memory per GPU: context {mem['context']:.1f} GiB, generation "
                           f"{mem['generation']:.1f} GiB (tk's memory plan is in the table above)"))
    elif mem.get("aggregated") is not None:
        console.print(Text(f"  aiconfigurator's memory per GPU: {mem['aggregated']:.1f} GiB (tk's memory plan is in "
                           "the table above)"))
    if p.get("support_note"):
        console.print(Text(f"  note: {p['support_note']}", style="yellow"))
    if p.get("kv_cache_warning"):
        console.print(Text(f"  warning: {p['kv_cache_warning']}", style="yellow"))
    console.print(Text(f"  not modelled: {', '.join(p['not_modelled'])}"))
