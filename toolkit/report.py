"""Terminal presentation of a plan (rich tables on stderr; stdout is kept for --json)."""

from __future__ import annotations

from toolkit.plan.model import Plan


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def _print_header(console, plan: Plan) -> None:
    """The plan's name, engine, model and size; where its values came from (recipe, site defaults, model config,
    image); what the servers may run from the checkpoint."""
    from rich.markup import escape as esc

    console.print(f"[bold]{esc(plan.name)}[/]  {esc(plan.engine.label)} {plan.target_release or plan.trtllm_version}"
                  f"  model "
                  f"{esc(plan.model.name)}  {plan.node_count} node(s) x {plan.slurm.gpus_per_node} GPU")
    console.print(f"recipe {esc(plan.recipe_file)}" + (f"; site defaults {esc(plan.site_file)}" if plan.site_file
                                                        else ""), soft_wrap=True)
    if plan.model.source != "built-in":
        console.print(f"model config {esc(plan.model.source)}", soft_wrap=True)
    if plan.slurm.container_image:
        console.print(f"image {esc(plan.slurm.container_image)}" +
                      (f"  ({esc(plan.slurm.image_note)})" if plan.slurm.image_note else ""), soft_wrap=True)
    if plan.trtllm_changes:  # what a deployment of this line does differently from the line before's
        console.print(f"TensorRT-LLM {plan.trtllm_version} changes:")
        for change in plan.trtllm_changes:
            console.print(f"  - {esc(change)}")
    if plan.roles[0].llm_api_options.get("trust_remote_code"):
        console.print("trust_remote_code: true (the servers run Python code shipped with the checkpoint)")


def _print_value_sources(console, plan: Plan) -> None:
    """Every value that came from outside the recipe (site defaults, the model's config) and where from."""
    import os

    from rich.markup import escape as esc
    from rich.table import Table

    if not plan.value_sources:
        return
    sources = Table(title="Values from outside the recipe", title_justify="left")
    for col in ("field", "value", "from"):
        sources.add_column(col)
    for dotted, value, source in plan.value_sources:
        if plan.site_file and source.startswith(plan.site_file + ":"):  # the header names the whole path
            source = os.path.basename(plan.site_file) + source[len(plan.site_file):]
        sources.add_row(esc(dotted), esc(value), esc(source))
    console.print(sources)


def _print_roles(console, plan: Plan) -> None:
    from rich.table import Table

    roles = Table(title="Roles", title_justify="left")
    for col in ("role", "instances", "tp", "pp", "ep", "attn DP", "GPUs/inst", "GPUs", "nodes",
                "max_batch", "max_num_tokens"):
        roles.add_column(col, justify="right" if col != "role" else "left")
    for r in plan.roles:
        o = r.llm_api_options
        roles.add_row(r.title, str(len(r.instances)), str(r.tp), str(r.pp), str(r.ep or "-"),
                      "yes" if r.attention_dp else "no", str(r.gpus_per_instance), str(r.gpu_count),
                      str(r.node_count), str(o["max_batch_size"]), str(o["max_num_tokens"]))
    console.print(roles)


def _print_servers(console, plan: Plan) -> None:
    from rich.table import Table

    servers = Table(title="Servers", title_justify="left")
    for col in ("server", "nodes", "GPUs", "port"):
        servers.add_column(col)
    for s in plan.servers:
        servers.add_row(s.name, ",".join(f"node{n}" for n in s.nodes), ",".join(map(str, s.gpus)), str(s.port))
    if plan.proxy is not None:
        servers.add_row("proxy", f"node{plan.proxy.node}", "-", str(plan.proxy.port))
    console.print(servers)


def _print_kv(console, plan: Plan) -> None:
    """The KV cache's size per token, the transfer buffer and transceiver, and the largest request's transfer
    against its prefill."""
    from rich.markup import escape as esc
    from rich.table import Table

    kv, est = plan.kv, plan.estimates
    t = Table(title="KV cache and transfer", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value")
    t.add_row("bytes per token", f"{kv.bytes_per_token:,} B  ({esc(kv.formula)})")
    t.add_row("per TP rank", f"context {kv.ctx_bytes_per_token_per_rank:,} B, "
                             f"generation {kv.gen_bytes_per_token_per_rank:,} B")
    t.add_row("tokens_per_block", str(kv.tokens_per_block))
    buf = plan.buffer
    gen_buf = f", generation {buf.generation_max_tokens_in_buffer}" if buf.generation_max_tokens_in_buffer else ""
    t.add_row("max_tokens_in_buffer", f"{buf.max_tokens_in_buffer}{gen_buf}  ({esc(buf.reason)})")
    tr = plan.kv_transfer.transceiver
    if tr is not None:
        t.add_row("transceiver", f"{esc(tr.model)}; {esc(tr.runtime_reason)} ({esc(tr.default_source)})")
    tls = plan.kv_transfer.transport.ucx_tls(plan.engine.kv_memory)
    t.add_row("UCX_TLS", f"{tls or 'unset'}  ({esc(plan.kv_transfer.transport.ucx_tls_reason)})")
    t.add_row("largest request", f"{kv.largest_request_tokens:,} tokens = {human_bytes(kv.largest_request_bytes)} of KV")
    t.add_row("its transfer", f"{est.largest_request_transfer_ms:.1f} ms at {est.nominal_gbps:g} GB/s per GPU "
                              f"({est.transport}, nominal)")
    t.add_row("its prefill", f"{est.largest_request_prefill_ms:.1f} ms (2 x active params x tokens at "
                             f"{est.prefill_efficiency:.0%} of {est.gpu_peak_tflops:g} TFLOP/s per GPU)")
    verdict = "[red]the transfer dominates: check the transport[/]" if est.transfer_dominates \
        else "the prefill dominates"
    t.add_row("verdict", verdict)
    console.print(t)


def print_plan(plan: Plan) -> None:
    """The plan on stderr, table by table, then its memory plan and warnings."""
    from rich.markup import escape as esc

    from toolkit.progress import stderr_console

    console = stderr_console(120, highlight=False)
    _print_header(console, plan)
    _print_value_sources(console, plan)
    _print_roles(console, plan)
    _print_servers(console, plan)
    _print_kv(console, plan)
    print_memory(console, plan)
    for w in plan.warnings:
        console.print(f"[yellow]warning:[/] {esc(w)}")


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f}"


def print_memory(console, plan: Plan) -> None:
    """One GPU of each role's servers: weights, activations, the KV pool and what it holds (toolkit/plan/memory.py)."""
    from rich.markup import escape as esc
    from rich.table import Table

    roles = [r for r in plan.roles if r.memory is not None]
    if not roles:
        return
    m0 = roles[0].memory
    t = Table(title=f"Memory per GPU, GiB ({m0.gpu}: {_gib(m0.gpu_memory_bytes)}; weights {m0.quantization})",
              title_justify="left", caption=f"weights {m0.quantization}: {esc(m0.quantization_source)}",
              caption_justify="left")
    for col in ("role", "weights (min)", "activations", "runtime", "KV pool (fraction)", "KV tokens",
                "a sequence", "batch"):
        t.add_column(col, justify="right" if col != "role" else "left")
    for r in roles:
        m = r.memory
        seq = f"{m.sequence_tokens:,} " + ("fits" if m.fits_sequence else "[red]no[/]")
        held = m.kv_pool_tokens // max(1, m.sequence_tokens)
        batch = f"{m.max_batch_size}" + ("/rank" if r.attention_dp else "") + " " + \
            ("fits" if m.fits_batch else f"[yellow]{held} fit[/]")
        t.add_row(r.title, f"{_gib(m.weights_bytes)} ({_gib(m.weights_min_bytes)})",
                  _gib(m.activation_bytes + m.cuda_graph_bytes), _gib(m.runtime_bytes),
                  f"{_gib(m.kv_pool_bytes)} ({m.free_gpu_memory_fraction:g})", f"{m.kv_pool_tokens:,}", seq, batch)
    console.print(t)


def memory_lines(plan: Plan) -> list[str]:
    """One line per role of the memory plan, for commands that print no tables (tk render)."""
    out = []
    for r in plan.roles:
        m = r.memory
        if m is None:
            continue
        held = m.kv_pool_tokens // max(1, m.sequence_tokens)
        out.append(f"memory per GPU ({r.title}): weights {_gib(m.weights_bytes)} of {_gib(m.gpu_memory_bytes)} GiB "
                   f"({m.quantization}), KV pool {_gib(m.kv_pool_bytes)} GiB = {m.kv_pool_tokens:,} tokens: a "
                   f"sequence of {m.sequence_tokens:,} {'fits' if m.fits_sequence else 'does NOT fit'}, max_batch_size "
                   f"{m.max_batch_size}{'/rank' if r.attention_dp else ''} "
                   + ("fits" if m.fits_batch else f"does not ({held} fit)"))
    return out


def print_import(result, output) -> None:
    """What `tk import` did: where the recipe went, what was not carried, what tk renders differently, the plan."""
    from rich.markup import escape as rich_escape

    from toolkit.progress import stderr_console
    from toolkit.text import escape_controls

    def esc(text: str) -> str:  # a source's keys and values may hold ESC or line breaks: one line each, inert
        return rich_escape(escape_controls(text))

    console = stderr_console(120, highlight=False)
    led = result.ledger
    console.print(f"[bold]{esc(result.source)}[/] ({led.kind}) -> "
                  f"{esc(str(output)) if output else 'stdout'}: {len(led.carried)} value(s) carried")
    for d in led.dropped:
        console.print(f"[yellow]not carried:[/] {esc(d.path)}: {esc(d.why)}")
    for n in led.notes:
        console.print(f"[cyan]check:[/] {esc(n)}")
    for path, theirs, mine in result.changed:
        shown = "left out" if mine is None else f"{mine!r}"
        console.print(f"[yellow]tk renders differently:[/] {esc(path)}: {esc(repr(theirs))} -> {esc(shown)}")
    if result.added:
        console.print("tk adds: " + esc(", ".join(f"{p}={v!r}" for p, v in result.added)))
    for w in result.warnings:
        console.print(f"[yellow]warning:[/] {esc(w)}")
    for v in result.violations:
        console.print(f"[red]error:[/] {esc(str(v))}")
    if result.ok:
        console.print(f"[green]the recipe plans[/] ({result.plan.trtllm_version}, {result.plan.node_count} node(s)); "
                      f"next: tk plan {esc(str(output)) if output else 'RECIPE'}")
    else:
        console.print(f"[red]{len(result.violations)} problem(s)[/]: the recipe is written as imported; fix them "
                      "there (each names its field)")
