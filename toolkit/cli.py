"""The `tk` command line: a thin click layer over `toolkit.api`. Each command parses its options, calls
the API and prints (prose on stderr, `--json` documents on stdout). Heavy modules (pydantic, rich, nixl,
numpy) are imported by the API inside its functions, so `tk --help` starts fast."""

from __future__ import annotations

import json
import sys

import click

from orchestrator.states import Role
from toolkit import __version__, api
from toolkit.errors import RecipeError, TkError
from toolkit.facts.hardware import Transport


def _emit_json(doc) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=False))


class _Finite(click.FloatRange):
    """A float in [min, max]; NaN and infinity are refused (click's FloatRange lets them through)."""

    def convert(self, value, param, ctx):
        import math

        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


WEEK_S = 7 * 24 * 3600.0


def _seconds(minimum: float) -> _Finite:
    return _Finite(min=minimum, max=WEEK_S)


class _LazyChoice(click.Choice):
    """A click.Choice whose words are a vocabulary defined in a module `tk --help` does not import: read when the
    option is used or its help is shown."""

    def __init__(self, words):
        self._words = words
        super().__init__(())

    @property  # type: ignore[override]
    def choices(self):
        return tuple(self._words())

    @choices.setter
    def choices(self, _value) -> None:
        pass


def _import_formats() -> tuple[str, ...]:
    from toolkit.importer import KINDS

    return tuple(KINDS)


def _say(msg: str) -> None:
    """Prose for people: always stderr, so stdout stays one JSON document under --json."""
    click.echo(msg, err=True)


aggregated_option = click.option(
    "--aggregated", is_flag=True,
    help="The aggregated baseline instead: plain trtllm-serve instances on the same GPUs (context + generation), "
         "no proxy; the recipe's `aggregated:` section sets tp (default: the generation role's) and pp.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
set_option = click.option("--set", "overrides", multiple=True, metavar="FIELD=VALUE",
                          help="Override a recipe field, e.g. --set generation.instances=4 (repeatable).")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tk")
def cli():
    """tk: render, launch and validate TensorRT-LLM disaggregated serving.

    \b
    tk recipes                      built-in recipes
    tk size --model M --system S    from GPUs and an SLA to a recipe (aiconfigurator + KV transfer)
    tk plan RECIPE [--predict]      the resolved deployment, nothing written
    tk render RECIPE -o DIR         every file the deployment needs
    tk launch RECIPE [--local]      run it, wait until it serves
    tk runs | status | logs | stop  look after runs (found from any directory)
    tk bench RUN [--sla ...]        aiperf against a serving run: verdict (0/1/2) and report
    tk doctor [RUN]                 why a run failed: cause, fix, evidence
    tk diff RUN_A RUN_B             what differs between two runs or renders
    tk validate cluster RECIPE      NIXL transfers between every context and generation node
    tk import CONFIG -o RECIPE      an srt-slurm / TensorRT-LLM disaggregated config as a tk recipe

    Site defaults (partition, account, image, mounts, ...) for every recipe: ~/.config/tk/site.yaml, or the file
    $TK_SITE names (TK_SITE=none: none); `tk plan` shows which values came from it.
    """


@cli.command()
@json_option
@click.option("--models", is_flag=True, help="List the built-in models instead.")
def recipes(as_json: bool, models: bool):
    """List the built-in recipes (or models), one line each."""
    if models:
        rows = api.list_models()
        if as_json:
            _emit_json({"models": rows})
        else:
            for r in rows:
                click.echo(f"{r['name']:<42} {r['attention']:<4} {r['layers']:>3} layers{'  MoE' if r['moe'] else ''}")
        return
    rows = api.list_recipes()
    if as_json:
        _emit_json({"recipes": rows})
        return
    for r in rows:
        click.echo(f"{r['name']:<22} {r['description']}")


@cli.command()
@click.argument("recipe")
@click.option("--predict", is_flag=True, help="Add aiconfigurator's predicted TTFT, TPOT and tokens/s/GPU for this "
              "exact configuration, with the KV-transfer term (needs the size extra).")
@click.option("--turns", type=click.IntRange(1, 1000), help="Multi-turn traffic: turns per conversation; shows what "
              "the context servers recompute each turn (with --predict, at aiconfigurator's prefill cost).")
@click.option("--answer-len", type=click.IntRange(1, 1 << 20), help="Multi-turn: tokens per answer (default "
              "traffic.max_output_len).")
@click.option("--message-len", type=click.IntRange(1, 1 << 21), help="Multi-turn: new tokens per turn (default: "
              "the plan's input length split over the turns).")
@set_option
@json_option
@aggregated_option
def plan(recipe: str, predict: bool, turns: int | None, answer_len: int | None, message_len: int | None,
         overrides: tuple[str, ...], as_json: bool, aggregated: bool):
    """Show the resolved deployment of RECIPE; writes nothing."""
    if (answer_len or message_len) and not turns:
        raise click.UsageError("--answer-len and --message-len describe a multi-turn shape: add --turns N")
    p = api.load_plan(recipe, overrides, aggregated=aggregated)
    prediction = api.predict(p) if predict else None
    multi = api.multi_turn_share(p, turns, answer_len, message_len, prediction) if turns else None
    if as_json:
        _emit_json({**api.plan_summary(p), **({"prediction": prediction} if predict else {}),
                    **({"multi_turn": multi} if multi else {})})
        return
    from toolkit.report import print_plan

    print_plan(p)
    if prediction:
        from toolkit.size.report import print_prediction

        print_prediction(prediction)
    if multi:
        from toolkit.size.multiturn import print_recompute

        print_recompute(multi)


# --- import --------------------------------------------------------------------------------------

@cli.command(name="import")
@click.argument("source", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the recipe here (default: stdout).")
@click.option("--kind", type=_LazyChoice(_import_formats),
              help="The source's format (default: detected).")
@click.option("--name", help="The recipe's name (default: the source's).")
@click.option("--force", is_flag=True, help="Overwrite an existing -o file.")
@json_option
def import_(source, output, kind, name, force, as_json):
    """Turn an existing disaggregated config into a tk recipe: an NVIDIA srt-slurm TensorRT-LLM recipe, TensorRT-LLM's
    examples/disaggregated/slurm/benchmark config.yaml, or a `trtllm-serve disaggregated` config carrying the
    servers' options. Lists what tk could not carry and what it renders differently, and plans the recipe: exit 0
    when it plans, 1 when tk refuses it (TensorRT-LLM's own rules; the recipe is still written), 2 on a source it
    cannot read."""
    result = api.import_config(source, kind=kind, name=name, output=output, force=force)
    if as_json:
        _emit_json({"ok": result.ok, "kind": result.kind, "source": result.source, "output": output,
                    "recipe": result.recipe if output is None else None,
                    "not_carried": [{"path": d.path, "value": d.value, "why": d.why} for d in result.ledger.dropped],
                    "notes": result.ledger.notes,
                    "changed": [{"path": p, "source": a, "tk": b} for p, a, b in result.changed],
                    "added": [{"path": p, "tk": v} for p, v in result.added],
                    "errors": [v.to_dict() for v in result.violations], "warnings": result.warnings})
    else:
        if output is None:
            click.echo(result.text, nl=False)
        from toolkit.report import print_import

        print_import(result, output)
    if not result.ok:
        raise SystemExit(1)


# --- size ----------------------------------------------------------------------------------------

@cli.command()
@click.option("--model", required=True, help="A built-in model (tk recipes --models) or a local directory with a "
              "Hugging Face config.json.")
@click.option("--system", required=True, metavar="SYSTEM", help="aiconfigurator system: h100_sxm, h200_sxm, b200_sxm, "
              "gb200, a100_sxm, l40s.")
@click.option("--gpus", required=True, type=click.IntRange(1, 4096), help="GPU budget.")
@click.option("--isl", required=True, type=click.IntRange(1, 1 << 20), help="Input tokens per request.")
@click.option("--osl", required=True, type=click.IntRange(1, 1 << 20), help="Output tokens per request.")
@click.option("--ttft", required=True, type=_Finite(min=0.1, max=3_600_000.0), help="TTFT limit, ms.")
@click.option("--tpot", required=True, type=_Finite(min=0.01, max=60_000.0), help="TPOT limit, ms.")
@click.option("--transport", type=click.Choice([t.value for t in Transport]),
              help="KV transport (its nominal GB/s is the transfer term's bandwidth; default nvlink-single-node "
                   "when the budget fits one node, else infiniband).")
@click.option("--measured", type=click.Path(exists=True), metavar="RUN_DIR",
              help="Take the bandwidth from a `tk validate cluster` run (its report.json) instead.")
@click.option("--measured-pick", type=click.Choice(["slowest", "median"]), default="slowest", show_default=True,
              help="Which measured context->generation pair's GB/s to use.")
@click.option("--gpus-per-node", type=click.IntRange(1, 72), help="Default: the system's (8; gb200 4).")
@click.option("--name", help="Recipe name (default: model-NpMd-system).")
@click.option("--top", type=click.IntRange(1, 1000), default=15, show_default=True, help="Rows of the table.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the chosen recipe here.")
@click.option("--turns", type=click.IntRange(1, 1000), help="Multi-turn traffic: turns per conversation (ISL new "
              "tokens each); shows what the chosen configuration's context servers recompute each turn.")
@click.option("--answer-len", type=click.IntRange(1, 1 << 20), help="Multi-turn: tokens per answer (default OSL).")
@json_option
def size(model, system, gpus, isl, osl, ttft, tpot, transport, measured, measured_pick, gpus_per_node, name, top,
         output, turns, answer_len, as_json):
    """Size a deployment: aiconfigurator ranks aggregated and disaggregated configurations for the SLA, tk adds
    the KV transfer to each disaggregated TTFT, marks the ones that meet it and writes the best as a recipe.

    Candidates tk cannot deploy as sized (a layout a recipe cannot express, or one tk's plan refuses: memory,
    heads, placement) are marked and skipped. Exit 0 when the recipe, re-checked by tk's plan, deploys exactly the
    chosen row (GPUs, instances, TP/PP/EP, attention DP, batch); 1 when it would deploy anything else (the
    differences are reported, nothing is written); 2 for an unsupported model or system, or an SLA no deployable
    candidate meets (with the closest candidate's numbers)."""
    if transport and measured:
        raise click.UsageError("--transport and --measured exclude each other")
    if answer_len and not turns:  # before the search, so nothing is written
        raise click.UsageError("--answer-len describes a multi-turn shape: add --turns N")
    if output:  # an -o that cannot be written is refused before the search, not after it
        from toolkit.size.recipe import check_output

        check_output(output)
    result = api.size(model, system, gpus, isl, osl, ttft, tpot, transport=transport, measured=measured,
                      measured_pick=measured_pick, gpus_per_node=gpus_per_node, name=name, output=output)
    from toolkit.size.report import print_size

    if output and result.recheck.get("ok"):
        from toolkit.size.recipe import write_file

        write_file(output, result.recipe_text)
    doc = {**result.to_dict(), "output": output}
    multi = api.size_multi_turn(result, turns, answer_len) if turns else None
    if multi:
        doc["multi_turn"] = multi
    if as_json:
        _emit_json(doc)
    else:
        print_size(result, top=top)
        if multi:
            from toolkit.size.multiturn import print_recompute

            print_recompute(multi)
        if output:
            _say(f"wrote {output}" if result.recheck.get("ok") else f"did NOT write {output}: the recipe would not "
                 "deploy what was sized")
        elif result.recheck.get("ok"):
            click.echo(result.recipe_text, nl=False)
    if not result.recheck.get("ok"):
        raise SystemExit(1)


@cli.command()
@click.argument("recipe")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output directory (default: render/<recipe name>).")
@click.option("--check", is_flag=True,
              help="Then parse the rendered files with TensorRT-LLM's own classes where tensorrt_llm is installed "
                   "here (the stand-in's tables for a stand-in recipe). Exit 1 when they are refused or the check "
                   "could not run; 'NOT checked' (exit 0) where nothing here can check.")
@set_option
@json_option
@aggregated_option
def render(recipe: str, out_dir: str | None, check: bool, overrides: tuple[str, ...], as_json: bool,
           aggregated: bool):
    """Render every file of the deployment of RECIPE into a directory."""
    p = api.load_plan(recipe, overrides, aggregated=aggregated)
    out, files = api.render(p, out_dir or None)
    verdict = api.check_config(p, out) if check else None
    if as_json:
        from toolkit.render import memory_numbers

        doc = {"name": p.name, "output": str(out), "files": sorted(files), "warnings": list(p.warnings),
               "memory": {r.title: memory_numbers(r.memory) for r in p.roles}}
        if verdict:
            doc["check"] = {"status": verdict[0], "checked": verdict[0] in ("ok", "failed"), "message": verdict[1]}
        _emit_json(doc)
    else:
        from toolkit.report import memory_lines

        for w in p.warnings:
            _say(f"warning: {w}")
        for line in memory_lines(p):
            _say(line)
        _say(f"rendered {len(files)} files for {p.name} into {out}/")
        for name in files:
            _say(f"  {name}")
        if verdict:
            _say({"ok": "config check: ", "failed": "config check FAILED: ",
                  "skipped": "config NOT checked: ",
                  "error": "config NOT checked (the check itself failed): "}[verdict[0]] + verdict[1])
    if verdict and verdict[0] in ("failed", "error"):
        raise SystemExit(1)


# --- launch and runs -----------------------------------------------------------------------------

@cli.command()
@click.argument("recipe")
@click.option("--local", "local", is_flag=True, help="Run as processes on this machine instead of Slurm.")
@click.option("--dry-run", is_flag=True, help="Render into the run directory and show what would run.")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Run directory (default runs/<name>-<time>).")
@click.option("--pending-timeout", type=_seconds(1), help="Seconds a Slurm job may pend.")
@click.option("--startup-timeout", type=_seconds(1), help="Seconds servers may take to be healthy.")
@click.option("--fail-fast", is_flag=True,
              help="End the whole run when any server exits or hangs (for benchmarks and tests), instead of "
                   "restarting it (the recipe's supervision policy; same as --set supervision.policy=fail-fast).")
@set_option
@json_option
@aggregated_option
def launch(recipe, local, dry_run, run_dir, pending_timeout, startup_timeout, fail_fast, overrides, as_json,
           aggregated):
    """Launch RECIPE on Slurm (or --local), wait until it serves, print the endpoint.

    Once it serves, a server that exits or stops answering /health is restarted on its node (bounded retries,
    backoff) while the others keep serving; see the recipe's `supervision:` section, or --fail-fast."""
    if fail_fast:
        overrides = (*overrides, "supervision.policy=fail-fast")
    p = api.load_plan(recipe, overrides, aggregated=aggregated)
    for w in p.warnings:  # every time (stderr, also with --json): e.g. storage the recipe accepts anyone can write
        _say(f"warning: {w}")
    backend = "local" if local else "slurm"
    if dry_run:
        run = api.prepare(p, local=local, run_dir=run_dir)
        if as_json:
            _emit_json({**run.public(), "dry_run": True})
            return
        _say(f"rendered into {run.run_dir}/ (dry run, nothing started)")
        if backend == "slurm":
            import shlex

            d = shlex.quote(str(run.run_dir))
            _say(f"would run: TK_RUN_DIR={d} sbatch --chdir={d} --export=ALL {d}/launch.sbatch")
        for s in run.servers:
            _say(f"  {s.name:<8} node{s.node} port {s.port}")
        return
    from toolkit.progress import LaunchProgress

    with LaunchProgress(enabled=not as_json) as progress:
        run = api.launch(p, local=local, run_dir=run_dir, pending_timeout_s=pending_timeout,
                         startup_timeout_s=startup_timeout, on_progress=progress.update)
    if as_json:
        _emit_json(run.public())
        return
    _say(f"{run.name} is serving at {run.endpoint}  ({backend}{', job ' + run.job_id if run.job_id else ''})")
    if run.tokenizer:
        _say(f"  tokenizer for clients that count tokens (aiperf --tokenizer): {run.tokenizer}")
    click.echo(run.endpoint)


@cli.command()
@json_option
def runs(as_json):
    """List every run: name, backend, job id, state, endpoint; `tk validate cluster` runs among them."""
    records = api.runs()
    validations = api.validation_runs()
    if as_json:
        _emit_json({"runs": [r.public() for r in records], "validations": [v.to_dict() for v in validations]})
        return
    if not records and not validations:
        _say("no runs yet; start one with `tk launch RECIPE`")
        return
    import time

    from toolkit.doctor import inert

    listed = sorted([(r.created, (r.name, r.backend, r.job_id or "-",
                                  "dry run" if r.state == "rendered" else r.state, r.endpoint or "-"))
                     for r in records] +
                    [(v.created, (v.name, v.mode, v.job_id or "-", f"validate: {v.state}", "-")) for v in validations],
                    key=lambda row: row[0])
    rows = [(inert(name), backend, inert(job), state, time.strftime("%Y-%m-%d %H:%M", time.localtime(created)),
             inert(endpoint)) for created, (name, backend, job, state, endpoint) in listed]
    header = ("RUN", "BACKEND", "JOB", "STATE", "CREATED", "ENDPOINT")
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header) - 1)]
    for row in (header, *rows):
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])


@cli.command()
@click.argument("run", required=False)
@json_option
def status(run, as_json):
    """Per server of RUN (default: the last run): node, port, state, health."""
    from toolkit.doctor import inert
    from toolkit.launch.run import log_tail

    record = api.status(run)
    if as_json:
        _emit_json(record.public())
    else:  # reasons and logs are the job's words: printed inert, as `tk doctor` prints them
        _say(inert(f"{record.name}: {record.state}{' - ' + record.reason if record.reason else ''}"))
        if record.engine_label:
            _say(f"  engine {record.engine_label}")
        _say(f"  backend {record.backend}{', job ' + record.job_id if record.job_id else ''}, "
             f"endpoint {record.endpoint or '-'}")
        if record.tokenizer:
            _say(f"  tokenizer {record.tokenizer}")
        for s in record.servers:
            where = f"step {s.step}" if s.step else f"pid {s.pid}" if s.pid else ""
            extra = [where] if where else []
            if s.restarts:
                extra.append(f"{s.restarts} restart{'s' if s.restarts != 1 else ''}")
            if s.last_exit is not None:
                extra.append(f"last exit {s.last_exit}")
            if s.reason and s.state != "healthy":
                extra.append(inert(s.reason))
            _say(f"  {s.name:<8} node{s.node:<3} {s.host or '-':<16} port {s.port:<6} {s.state:<9} "
                 f"{', '.join(extra)}".rstrip())
    failed = [s for s in record.servers if s.state == "failed"]
    if record.state == "failed" and not as_json:
        for s in failed:
            _say(f"--- last lines of {s.name} ({inert(record.log_path(s.name))}) ---")
            _say("\n".join(inert(line) for line in log_tail(record.log_path(s.name)).splitlines()))
    if record.state in ("failed", "degraded"):
        raise SystemExit(1)


@cli.command()
@click.argument("run", required=False)
@click.option("--role", type=click.Choice([r.value for r in Role]), help="Only this role's logs.")
@click.option("--instance", type=int, help="Only this instance of the role.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the run ends (Ctrl-C stops).")
@click.option("--lines", "-n", type=click.IntRange(0, 1_000_000), default=50, show_default=True,
              help="Lines of each log to show (0: none); with --follow, shown before the new ones.")
def logs(run, role, instance, follow, lines):
    """Show the logs of RUN's servers."""
    from toolkit.launch.logs import follow_logs, show_logs

    record = api.find_run(run)
    paths = api.logs(record, role, instance)
    if follow:
        follow_logs(record, paths, lines)
    else:
        show_logs(paths, lines)


@cli.command()
@click.argument("run", required=False)
@json_option
def stop(run, as_json):
    """Stop RUN (default: the run under way; with several under way, name one) and verify nothing is left."""
    record = api.find_run(run, active=run is None)
    problems = api.stop(record)
    if as_json:
        _emit_json({**record.public(), "clean": not problems, "problems": problems})
    else:
        _say(f"{record.name}: stopped" + ("" if not problems else f", but: {'; '.join(problems)}"))
    if problems:
        raise SystemExit(1)


@cli.command()
@click.argument("run", required=False)
@json_option
def doctor(run, as_json):
    """Explain RUN (default: the last run): known failure signatures in its logs, with cause, fix and evidence."""
    from toolkit.doctor import format_diagnosis, inert

    doc = api.doctor(run)
    if as_json:
        _emit_json(doc)
        return
    job = doc.get("job") or {}
    # everything below comes from files the run wrote (reasons, events, Slurm's words): printed inert
    _say(inert(f"{doc['run']}: {doc['state']}{' - ' + doc['reason'] if doc.get('reason') else ''}"))
    _say(inert(f"  run directory {doc['run_dir']}" + (f"; job {job.get('phase')} {job.get('detail') or ''}".rstrip()
                                                      if job else "")))
    if doc["phases"]:
        _say("  last phases: " + " | ".join(inert(p.replace("\t", " ")) for p in doc["phases"][-4:]))
    click.echo(format_diagnosis(doc))


@cli.command()
@click.argument("run_a")
@click.argument("run_b")
@json_option
def diff(run_a, run_b, as_json):
    """What differs between RUN_A and RUN_B (runs, run directories or render directories): rendered files,
    versions each node ran, nodes, validation and benchmark results."""
    from toolkit.doctor.diff import format_diff

    doc = api.diff(run_a, run_b)
    if as_json:
        _emit_json(doc)
        return
    click.echo(format_diff(doc))


# --- validate ------------------------------------------------------------------------------------

@cli.group()
def validate():
    """Check a cluster before serving on it."""


def _lengths_option(ctx, param, value):
    if not value:
        return None
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter("a comma-separated list of token counts, e.g. 128,1024,8192") from None
    if not out or min(out) < 1:
        raise click.BadParameter("token counts must be >= 1")
    return out


@validate.command("cluster")
@click.argument("recipe")
@click.option("--local", "local", is_flag=True, help="Run the agents as processes on this machine.")
@click.option("--nodes", type=click.IntRange(2, 256), help="With --local: this many agents, half context, half "
              "generation (default: the recipe's nodes).")
@click.option("--in-allocation", is_flag=True, help="Inside salloc/sbatch: srun the agents on SLURM_JOB_NODELIST.")
@click.option("--memory", type=click.Choice(["auto", "dram", "vram"]), default="auto", show_default=True,
              help="Where the KV-shaped buffers live (auto: VRAM when a GPU is visible; DRAM for stand-in recipes).")
@click.option("--max-memory-mb", type=click.IntRange(1, 1 << 20), default=256, show_default=True,
              help="Cap on the buffer each agent registers; layers are scaled down to fit (and the report says so).")
@click.option("--iterations", type=click.IntRange(1, 1_000_000), default=10, show_default=True,
              help="Timed transfers per request length and op.")
@click.option("--warmup", type=click.IntRange(0, 1_000_000), default=2, show_default=True,
              help="Untimed (but verified) transfers first: connections are lazy.")
@click.option("--sweep/--no-sweep", default=True, show_default=True,
              help="Measure 16..256 tokens per descriptor, in repeated passes, and recommend a tokens_per_block "
                   "only from differences that hold across the passes.")
@click.option("--sweep-iterations", type=click.IntRange(1, 1_000_000), default=5, show_default=True,
              help="Timed transfers per block size, op and pass of the sweep.")
@click.option("--sweep-repeats", type=click.IntRange(1, 1000), default=3, show_default=True,
              help="Passes over the block sizes; a tokens_per_block change is recommended only when it holds in "
                   "every pass (at least 3).")
@click.option("--reverse/--no-reverse", default=True, show_default=True,
              help="Also measure generation -> context (the answer's KV moving back) for every pair.")
@click.option("--read/--no-read", default=False, show_default=True,
              help="Also measure READ (the destination pulls). TensorRT-LLM never READs: READ figures are shown "
                   "and judge nothing.")
@click.option("--curve/--no-curve", default=True, show_default=True,
              help="The descriptor-size curve: the longest request's bytes in 1 .. 2048 descriptors (raw WRITEs); "
                   "its one-descriptor figure is the threshold's basis.")
@click.option("--lengths", callback=_lengths_option, metavar="N,N,...",
              help="Request lengths in tokens (default: short, typical, longest admitted).")
@click.option("--min-fraction", type=_Finite(min=0.0, max=1.0), default=None,
              help="Fail a pair whose WRITE is below this fraction of what the pair moved with one descriptor of the "
                   "same bytes (the curve), else of the transport profile's nominal GB/s "
                   "(default 0 for tcp/DRAM rehearsal, else 0.5).")
@click.option("--transfer-timeout", type=_seconds(0.1), default=30.0, show_default=True,
              help="Seconds one transfer or one answer from a peer may take.")
@click.option("--rendezvous-timeout", type=_seconds(0.1), default=None,
              help="Seconds to wait for every peer's metadata (default 60 local, 180 Slurm).")
@click.option("--timeout", type=_seconds(1), default=900.0, show_default=True,
              help="Bound on the whole run once the agents start.")
@click.option("--pending-timeout", type=_seconds(1), help="Seconds the Slurm job may pend.")
@click.option("--run-dir", type=click.Path(file_okay=False), help="Run directory (default runs/<name>-validate-<time>).")
@click.option("--python", "python", help="Interpreter for the agents (default: this one; python3 in containers).")
@click.option("--progress-thread/--no-progress-thread", default=None,
              help="NIXL's progress thread in each agent (default: on where every agent has a host of its own, "
                   "off with --local or where Slurm nodes share a host).")
@set_option
@json_option
def validate_cluster(recipe, local, nodes, in_allocation, memory, max_memory_mb, iterations, warmup, sweep,
                     sweep_iterations, sweep_repeats, reverse, read, curve, lengths, min_fraction, transfer_timeout,
                     rendezvous_timeout, timeout,
                     pending_timeout, run_dir, python, progress_thread, overrides, as_json):
    """Real NIXL transfers shaped like RECIPE's KV blocks between every context and generation node.

    Every byte is verified; per-pair bandwidth and latency are measured. Exit 0 only when every pair
    passed every check. Without --local or --in-allocation, submits its own Slurm job.
    """
    if local and in_allocation:
        raise click.UsageError("--local and --in-allocation exclude each other")
    if nodes and not local:
        raise click.UsageError("--nodes goes with --local (on Slurm the recipe decides the nodes)")
    from toolkit.validate.report import LiveProgress, print_report

    p = api.load_plan(recipe, overrides)
    n_agents = nodes or sum(len({n for s in r.instances for n in s.nodes}) for r in p.roles)
    with LiveProgress(enabled=not as_json, total_pairs=0, rounds=0) as progress:
        def on_progress(phase, pairs=None, up=0, total=0):
            if pairs is not None:
                progress.total = len(pairs)
                progress.rounds = 1 + max((x["round"] for x in pairs), default=-1)
            progress.update(phase, pairs, up, total or n_agents)

        report = api.validate(
            p, mode="local" if local else "in-allocation" if in_allocation else "slurm", nodes=nodes,
            memory=memory, max_memory_mb=max_memory_mb, iterations=iterations, warmup=warmup, sweep=sweep,
            sweep_iterations=sweep_iterations, sweep_repeats=sweep_repeats, reverse=reverse, read=read, curve=curve,
            lengths=lengths, min_fraction=min_fraction,
            transfer_timeout_s=transfer_timeout, rendezvous_timeout_s=rendezvous_timeout, timeout_s=timeout,
            pending_timeout_s=pending_timeout, run_dir=run_dir, python=python, progress_thread=progress_thread,
            on_progress=on_progress)
    if as_json:
        _emit_json(report)
    else:
        print_report(report)
    if not report["passed"]:
        raise SystemExit(1)


# --- bench ---------------------------------------------------------------------------------------

def _int_list(ctx, param, value):
    if not value:
        return None
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter("a comma-separated list of integers, e.g. 1,4,16,64") from None
    if not out or min(out) < 1 or max(out) > 100_000 or len(out) > 64:
        raise click.BadParameter("1 to 64 values, each from 1 to 100000")
    return out


def _float_list(ctx, param, value):
    if not value:
        return None
    try:
        out = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter("a comma-separated list of numbers, e.g. 1,2.5,5") from None
    import math
    if not out or len(out) > 64 or not all(math.isfinite(v) and 0 < v <= 100_000 for v in out):
        raise click.BadParameter("1 to 64 finite values, each above 0 and at most 100000 (requests/s)")
    return out


@cli.command()
@click.argument("target", required=False)
@click.option("--workload", default="fixed", show_default=True, metavar="fixed|isl-sweep|concurrency-sweep|multi-turn",
              help="What load: one ISL/OSL; ISL 128..2048 (clipped to the plan); concurrencies; growing conversations.")
@click.option("--isl", type=click.IntRange(1, 1 << 20), default=None,
              help="Input tokens. [default: 1024, lowered to what the deployment admits with the chat template]")
@click.option("--osl", type=click.IntRange(1, 1 << 20), default=None,
              help="Output tokens. [default: 128, lowered to what the deployment admits]")
@click.option("--concurrency", callback=_int_list, metavar="N,N,...", help="Concurrencies (default 4; sweep 1,4,16,64).")
@click.option("--request-rate", callback=_float_list, metavar="R,R,...", help="Requests/s instead of concurrency.")
@click.option("--requests", type=click.IntRange(1, 10_000_000), help="Profiled requests per cell (default 10 x load, >= 32).")
@click.option("--turns", type=click.IntRange(1, 100), default=3, show_default=True, help="multi-turn: turns per conversation.")
@click.option("--turn-delay", "turn_delay_ms", type=_Finite(min=0.0, max=600_000.0), default=0.0, show_default=True,
              metavar="MS", help="multi-turn: think time between an answer and the next turn.")
@click.option("--trace", metavar="NAME|FILE", help="multi-turn from a mooncake_trace JSONL (session_id, input_length, "
              "output_length, delay, hash_ids); shipped: multiturn-small.")
@click.option("--compare", "compare", multiple=True, metavar="KEY=V1,V2",
              help="With a RECIPE: the same workload on every variant (router=..., conditional=off|N, or a recipe "
                   "field path), one after another; a table, a plot and a recommendation. Repeat for more axes.")
@click.option("--validation", type=click.Path(), metavar="RUN_DIR",
              help="multi-turn: a `tk validate cluster` run whose generation->context bandwidth the pull-back "
                   "projection uses (default: the transport's nominal GB/s).")
@click.option("--sla", metavar="KEY=V,...", help="e.g. ttft_p99_ms=500,itl_p99_ms=30,output_tokens_per_s_per_gpu_min=100.")
@click.option("--tokenizer", type=click.Path(), help="Tokenizer directory for aiperf (default: the model's).")
@click.option("--baseline", type=click.Choice(["aggregated"]), help="Also benchmark an aggregated deployment on the same GPUs.")
@click.option("--baseline-url", metavar="URL", help="An aggregated server already serving, benchmarked as the baseline.")
@click.option("--max-error-rate", type=_Finite(min=0.0, max=1.0), default=0.01, show_default=True,
              help="Fraction of failed requests above which the run is invalid.")
@click.option("--seed", type=click.IntRange(0, 2**31), default=100, show_default=True)
@click.option("--timeout", type=_seconds(1), default=1800.0, show_default=True, help="Bound on each aiperf run.")
@click.option("--name", help="Bench directory name prefix (default: the workload).")
@click.option("--local", "local", is_flag=True, help="With a RECIPE: launch it on this machine.")
@click.option("--run-dir", type=click.Path(file_okay=False), help="With a RECIPE: its run directory.")
@set_option
@json_option
def bench(target, workload, isl, osl, concurrency, request_rate, requests, turns, turn_delay_ms, trace, compare,
          validation, sla, tokenizer, baseline, baseline_url, max_error_rate, seed, timeout, name, local, run_dir,
          overrides, as_json):
    """Benchmark a serving RUN (or launch RECIPE, benchmark it, stop it) with aiperf.

    \b
    Exit 0: valid, disaggregated, every SLA objective met.
    Exit 1: an SLA objective missed (named).
    Exit 2: invalid (zero-token answers, errors, lengths off, legs not proven) or bad input.
    Writes RUN/bench/NAME-TIMESTAMP/: results.json/.csv, verdict.json, plots, report.md, aiperf exports.
    """
    from toolkit.bench.workload import WORKLOADS, BenchInputError

    if workload not in WORKLOADS:
        raise BenchInputError(f"unknown workload {workload!r}; valid: {', '.join(WORKLOADS)}")
    if baseline and baseline_url:
        raise click.UsageError("--baseline and --baseline-url exclude each other")
    from toolkit.bench.sla import parse_sla

    parse_sla(sla)  # an unknown key is exit 2 before anything is looked up or started
    kwargs = dict(workload=workload, isl=isl, osl=osl, concurrency=concurrency, request_rate=request_rate,
                  requests=requests, turns=turns, sla=sla, tokenizer=tokenizer, baseline_url=baseline_url,
                  max_error_rate=max_error_rate, seed=seed, timeout_s=timeout, name=name,
                  turn_delay_ms=turn_delay_ms, trace=trace, validation=validation)
    on_progress = _bench_progress(as_json)
    try:
        chosen = api.bench_target(target)
    except TkError as exc:
        raise BenchInputError(f"{exc}; tk bench takes a serving run (tk runs) or a recipe") from None
    run = None if isinstance(chosen, str) else chosen
    _check_bench_target(run, compare=bool(compare), baseline=bool(baseline or baseline_url),
                        deploys=bool(local or overrides or run_dir))
    if compare:
        _bench_compare(chosen, compare, local, overrides, run_dir, kwargs, on_progress, as_json)
        return
    if run is not None:
        doc = api.bench(run, on_progress=on_progress, baseline=baseline, **kwargs)
    else:
        for w in api.load_plan(target, overrides).warnings:  # as tk launch: every time
            _say(f"warning: {w}")

        def launched(record):
            if not as_json:
                _say(f"{record.name} is serving at {record.endpoint} (launched for this benchmark, fail-fast; "
                     "tk bench stops it)")
        doc = api.bench_recipe(chosen, local=local, overrides=overrides, run_dir=run_dir, baseline=baseline,
                               on_launch=launched, on_progress=on_progress, **kwargs)
    if as_json:
        _emit_json({k: v for k, v in doc.items() if k != "cells"})
    else:
        from toolkit.bench.report import print_summary

        print_summary(doc)
    code = doc["verdict"]["exit_code"]
    if code:
        raise SystemExit(code)


def _bench_progress(as_json: bool):
    """The progress callback of tk bench: a line as each cell's aiperf run starts (nothing with --json)."""
    def on_progress(kind, **kw):
        if not as_json and kind == "cell":
            _say(f"[{kw['index'] + 1}/{kw['total']}] {kw['target']} {kw['cell']}: aiperf running")
    return on_progress


def _check_bench_target(run, *, compare: bool, baseline: bool, deploys: bool) -> None:
    """What fits the target: a run is measured as it is; --compare launches variants of a recipe, without a
    baseline. ``deploys``: --local, --set or --run-dir was given."""
    if compare and run is not None:
        raise click.UsageError("--compare launches every variant: give the recipe (tk bench RECIPE --compare ...), "
                               "not a run")
    if compare and baseline:
        raise click.UsageError("--compare and --baseline exclude each other")
    if not compare and run is not None and deploys:
        raise click.UsageError("--local, --set and --run-dir are for tk bench RECIPE (a deployment it launches)")


def _bench_compare(target, compare, local, overrides, run_dir, kwargs, on_progress, as_json) -> None:
    from toolkit.bench.report import print_summary

    def launched(record):
        if not as_json:
            _say(f"{record.name} is serving at {record.endpoint} (a variant, fail-fast; tk bench stops it)")

    def variant_done(variant, doc, error):
        if as_json:
            return
        if error:
            _say(f"variant {variant.label}: failed: {error}")
        else:
            print_summary(doc)

    out = api.bench_compare(target, compare, local=local, overrides=overrides, run_dir=run_dir, on_launch=launched,
                            on_variant=variant_done, on_progress=on_progress, **kwargs)
    if as_json:
        _emit_json(out)
        return
    from rich.table import Table

    from toolkit.progress import stderr_console

    con = stderr_console(120)
    t = Table(title=f"tk bench --compare {out['recipe']} ({out['workload']})", title_justify="left")
    for col in ("variant", "valid", "TTFT p50 turn>=2", "recomputed turn>=2", "history reused", "req/s"):
        t.add_column(col, justify="left" if col == "variant" else "right", no_wrap=True)
    for ln in out["variants"]:
        if ln.get("error"):
            t.add_row(ln["variant"], "failed", "-", "-", "-", "-")
            continue
        share = f"{100 * ln['reuse_share']:.0f} %" if ln.get("reuse_share") is not None else "-"
        fmt = (lambda v: "-" if v is None else f"{v:.4g}")  # noqa: E731
        t.add_row(ln["variant"], "yes" if ln["valid"] else "no", fmt(ln["ttft_p50_later_ms"]),
                  fmt(ln["recomputed_later"]), share, fmt(ln["request_throughput"]))
    con.print(t)
    rec = out["recommendation"]
    con.print(f"recommendation: [bold]{rec['variant'] or 'none'}[/bold]: {rec['reason']}", highlight=False)
    con.print(f"comparison: {out['compare_dir']}/compare.md")
    if all(ln.get("error") for ln in out["variants"]):
        raise SystemExit(2)


def main(argv=None) -> int:
    """Entry point: user errors are reported without a traceback."""
    as_json = "--json" in (argv if argv is not None else sys.argv[1:])
    try:
        cli.main(args=argv, prog_name="tk", standalone_mode=False)
        return 0
    except RecipeError as exc:
        for v in exc.violations:
            _say(f"error: {v}")
        _say(f"{len(exc.violations)} problem(s) found; nothing was written.")
        if as_json:
            _emit_json({"ok": False, "errors": [v.to_dict() for v in exc.violations]})
        return exc.exit_code
    except TkError as exc:
        from toolkit.text import escape_lines

        _say(f"error: {escape_lines(str(exc))}")  # run names, paths and values in it come from files and users
        if as_json:
            _emit_json({"ok": False, "errors": [{"message": str(exc)}]})
        return exc.exit_code
    except click.exceptions.Abort as exc:  # click's form of Ctrl-C; SIGTERM/SIGHUP arrive the same way
        from toolkit.runtime.signals import Terminated, exit_code

        cause = exc.__cause__ or exc.__context__
        _say(f"interrupted by {cause}" if isinstance(cause, Terminated) else "aborted")
        return exit_code(cause) if isinstance(cause, KeyboardInterrupt) else 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt as exc:
        from toolkit.runtime.signals import exit_code

        _say(f"interrupted ({exc})" if str(exc) else "interrupted")
        return exit_code(exc)


if __name__ == "__main__":
    sys.exit(main())
