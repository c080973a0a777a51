"""The public Python API of tk: what the `tk` command does, callable from a program.

    list_recipes()                      the shipped recipes (name, path, engine, model, description)
    list_models()                       the built-in models
    load_plan(recipe, overrides=())     a recipe name or path -> the frozen, typed Plan
    plan_summary(plan)                  the numbers `tk plan --json` prints
    render(plan, out_dir=None)          every file of the deployment, written atomically
    prepare(plan, ...)                  render into a new run directory, start nothing (`tk launch --dry-run`)
    launch(plan, ...)                   run it (Slurm or local), wait until it serves -> RunRecord
    runs() / find_run(ref)              every run / one run by directory, name or (None) the latest
    validation_runs()                   every `tk validate cluster` run (tk runs lists them with the runs)
    status(run) / logs(run) / stop(run) look after a run
    doctor(run)                         why a run failed: known failure signatures, cause, fix, evidence
    diff(run_a, run_b)                  what differs between two runs or render directories
    validate(plan, ...)                 NIXL transfers between every context and generation node -> report
    size(model, system, gpus, ...)      aiconfigurator's search + the KV-transfer term -> a sized recipe
    import_config(source, ...)          an srt-slurm / TensorRT-LLM disaggregated config -> a tk recipe (and its plan)
    predict(plan)                       aiconfigurator's TTFT/TPOT/tokens/s/GPU for a plan's exact configuration
    bench(run, workload=..., sla=...)   aiperf against a serving run -> results, verdict (exit 0/1/2), report
    bench_recipe(recipe, ...)           launch, bench, stop (the lead fills the launching)
    bench_compare(recipe, compare, ...) the same workload on every variant of a recipe, side by side
    multi_turn_share(plan, turns, ...)  what a multi-turn shape recomputes on the plan's context servers
    size_multi_turn(result, turns, ...) ... on tk size's chosen configuration
    launch_baseline(run, ...)           the run's aggregated baseline on the same GPUs, serving -> RunRecord

Errors are `toolkit.errors.TkError` (and its `RecipeError`, which lists every violation); nothing here
prints or exits. `toolkit.cli` is a thin click layer over these functions.

Heavy modules (pydantic, jinja2, requests, numpy, rich) are imported inside the functions, so importing
this module (and `toolkit`) stays cheap: `tk --help` must start fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from toolkit.resources import recipes_dir

if TYPE_CHECKING:
    from toolkit.launch import Progress
    from toolkit.launch.run import RunRecord
    from toolkit.plan.model import Plan

__all__ = [
    "baseline_plan",
    "bench",
    "bench_compare",
    "bench_recipe",
    "bench_target",
    "check_config",
    "diff",
    "doctor",
    "find_run",
    "import_config",
    "launch",
    "launch_baseline",
    "list_models",
    "list_recipes",
    "load_plan",
    "logs",
    "multi_turn_share",
    "plan_summary",
    "predict",
    "prepare",
    "recipe_path",
    "render",
    "runs",
    "size",
    "size_multi_turn",
    "status",
    "stop",
    "validate",
    "validation_runs",
]

# --- recipe -> plan ------------------------------------------------------------------------------

def recipe_path(recipe: str | os.PathLike) -> str:
    """A path as given, or the file of a shipped recipe named `recipe` (with or without `.yaml`).

    An unknown name is returned unchanged, so loading it reports the missing file.
    """
    recipe = os.fspath(recipe)
    if Path(recipe).exists():
        return recipe
    builtin = recipes_dir() / (recipe if recipe.endswith(".yaml") else f"{recipe}.yaml")
    if builtin.exists():
        return str(builtin)
    return recipe


def load_plan(recipe: str | os.PathLike, overrides: Sequence[str] = (), *, aggregated: bool = False) -> Plan:
    """Load, validate and resolve a recipe (a shipped name or a path) into its Plan.

    overrides are `FIELD=VALUE` strings, as `tk --set` takes them. aggregated: the recipe's aggregated baseline
    on the same GPUs (the recipe's `aggregated:` section; toolkit.plan.aggregated) instead of the disaggregated
    deployment. Raises RecipeError with every violation.
    """
    from toolkit.plan import build_plan
    from toolkit.recipe import load_recipe

    return build_plan(load_recipe(recipe_path(recipe), tuple(overrides)), aggregated=aggregated)


def list_recipes() -> list[dict[str, Any]]:
    """The shipped recipes, sorted by name: {name, path, engine, model, description} each."""
    import yaml

    rows = []
    for path in sorted(recipes_dir().glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        rows.append({"name": path.stem, "path": str(path), "engine": data.get("engine", "trtllm"),
                     "model": data.get("model"), "description": data.get("description", "")})
    return rows


def list_models() -> list[dict[str, Any]]:
    """The built-in models: {name, attention, layers, moe} each."""
    from toolkit.facts.models import BUILTIN_MODELS

    return [{"name": m.name, "attention": m.attention, "layers": m.num_layers, "moe": m.is_moe}
            for m in BUILTIN_MODELS.values()]


def plan_summary(plan: Plan) -> dict[str, Any]:
    """The resolved deployment as one JSON-ready document (what `tk plan --json` prints)."""
    from dataclasses import asdict

    from toolkit.render import derived_numbers

    doc = {"name": plan.name, "engine": plan.engine.name, "trtllm_version": plan.trtllm_version,
           "trtllm_changes": list(plan.trtllm_changes),
           "recipe_file": plan.recipe_file, "site_file": plan.site_file,
           "value_sources": {field: {"value": value, "from": source} for field, value, source in plan.value_sources},
           **derived_numbers(plan)}
    doc["bytes_per_token"] = plan.kv.bytes_per_token
    tr = plan.kv_transfer.transceiver
    doc["transceiver"] = asdict(tr) if tr is not None else None
    return doc


# --- plan -> files -------------------------------------------------------------------------------

def render(plan: Plan, out_dir: str | os.PathLike | None = None) -> tuple[Path, dict[str, str]]:
    """Write every file of the deployment into out_dir (default `render/<plan name>`), atomically.

    Returns (the directory, {file name: text}). Files in out_dir that tk does not render are kept.
    """
    from toolkit.render import render as render_plan

    return render_plan(plan, out_dir if out_dir is not None else Path("render") / plan.name)


def check_config(plan: Plan, out_dir: str | os.PathLike) -> tuple[str, str]:
    """Check the files rendered into out_dir with the engine's own parsers, here (TensorRT-LLM's classes where
    tensorrt_llm is importable by this Python; the stand-in's tables for a stand-in plan).
    Returns ("ok" | "failed" | "skipped" | "error", message): "skipped" when nothing here can check (no
    tensorrt_llm), "error" when the check could not run; neither means the files were checked. Starts nothing,
    uses no GPU."""
    from toolkit.render import check_rendered

    return check_rendered(plan, out_dir)


# --- launch and runs -----------------------------------------------------------------------------

def _backend(local: bool) -> str:
    return "local" if local else "slurm"


def prepare(plan: Plan, *, local: bool = False, run_dir: str | os.PathLike | None = None) -> RunRecord:
    """Render the plan into a new run directory and record the run; starts nothing."""
    from toolkit.launch import prepare as prepare_run

    return prepare_run(plan, _backend(local), os.fspath(run_dir) if run_dir is not None else None)


def launch(plan: Plan, *, local: bool = False, run_dir: str | os.PathLike | None = None,
           pending_timeout_s: float | None = None, startup_timeout_s: float | None = None,
           on_progress: Callable[[Progress], None] | None = None) -> RunRecord:
    """Launch the plan on Slurm (or local processes), wait (bounded) until it serves; the ready run.

    Raises TkError (LaunchFailed, with the failing component's log tail) when it does not come up;
    nothing is left running then.
    """
    from toolkit.launch import launch as launch_plan

    return launch_plan(plan, _backend(local), os.fspath(run_dir) if run_dir is not None else None,
                       pending_timeout_s=pending_timeout_s, startup_timeout_s=startup_timeout_s,
                       on_progress=on_progress)


def runs() -> list[RunRecord]:
    """Every run under the runs directory (`$TK_RUNS_DIR`, default `runs/`), oldest first."""
    from toolkit.launch.run import all_runs

    return all_runs()


def validation_runs() -> list:
    """Every `tk validate cluster` run (toolkit.validate.runs.ValidationRun: name, run_dir, recipe, mode, created,
    state validating|passed|failed|incomplete, job_id, report), oldest first; `tk runs` lists them with the runs."""
    from toolkit.validate.runs import validation_runs as found

    return found()


def find_run(ref: str | os.PathLike | None = None, *, active: bool = False) -> RunRecord:
    """A run by directory, by name (or unique prefix), or (None) the most recent one. ``active`` (what `tk stop`
    without RUN stops): with ref None, the one run under way (its job not ended); several under way is a TkError
    naming them (none is chosen for the user); none under way: the most recent one, as without ``active``."""
    from toolkit.errors import TkError
    from toolkit.launch import active_runs
    from toolkit.launch.run import find_run as find

    if ref is None and active:
        under_way = active_runs()
        if len(under_way) > 1:
            raise TkError(f"{len(under_way)} runs are active: {', '.join(r.name for r in under_way)}; "
                          "`tk stop RUN` names the one to stop (`tk runs` lists them)")
        if under_way:
            return under_way[0]
    return find(os.fspath(ref) if ref is not None else None)


def bench_target(ref: str | os.PathLike | None) -> RunRecord | str:
    """What `tk bench REF` measures: a run (RunRecord) or a recipe to launch (its path).

    A run directory or an exact run name selects that run; a shipped recipe's name or a recipe file selects the
    recipe; a name that is a recipe and also the prefix of runs (standin-2p2d and standin-2p2d-20261125-160608)
    is refused as ambiguous, naming both; any other prefix of one run's name selects it; None: the last run."""
    from toolkit.errors import TkError
    from toolkit.launch.run import RUN_RECORD

    if ref is None:
        return find_run(None)
    text = os.fspath(ref)
    if (Path(text) / RUN_RECORD).is_file():
        return find_run(text)
    every = runs()
    exact = [r for r in every if r.name == text]
    if exact:
        return exact[-1]
    path = recipe_path(text)
    is_recipe = Path(path).is_file()
    prefixed = [r for r in every if r.name.startswith(text)]
    if is_recipe and prefixed:
        names = ", ".join(r.name for r in prefixed[-3:]) + (f" (and {len(prefixed) - 3} more)" if len(prefixed) > 3
                                                              else "")
        raise TkError(f"{text!r} is ambiguous: the recipe {path} and run(s) {names}; give the recipe's path "
                      f"to launch it, or a run's full name (tk runs) to measure that run")
    if is_recipe:
        return path
    return find_run(text)


def _record(run: RunRecord | str | os.PathLike | None) -> RunRecord:
    from toolkit.launch.run import RunRecord

    return run if isinstance(run, RunRecord) else find_run(run)


def status(run: RunRecord | str | os.PathLike | None = None) -> RunRecord:
    """The run with every server's current state (asks Slurm or the local processes)."""
    from toolkit.launch import refresh

    return refresh(_record(run))


def logs(run: RunRecord | str | os.PathLike | None = None, role: str | None = None,
         instance: int | None = None) -> list[Path]:
    """The log files of the run's components, optionally only one role (an orchestrator.states.Role: ctx, gen, agg,
    proxy, etcd) and instance."""
    from toolkit.launch.logs import select_logs

    return select_logs(_record(run), role, instance)


def stop(run: RunRecord | str | os.PathLike | None = None) -> list[str]:
    """Stop the run and verify nothing is left; the problems found (empty when it stopped cleanly). None: the one
    run under way (find_run(None, active=True): several is a TkError naming them)."""
    from toolkit.launch import stop as stop_run
    from toolkit.launch.run import RunRecord as Record

    return stop_run(run if isinstance(run, Record) else find_run(run, active=run is None))


def doctor(run: RunRecord | str | os.PathLike | None = None) -> dict[str, Any]:
    """Why RUN failed: its job state, phases and logs (bounded reads) matched against the known failure
    signatures (toolkit/doctor/signatures.py). {"findings": [{id, title, cause, fix, source, evidence:
    [{file, line, where, text}]}], "first_error", "tail", "job", "phases", "servers", ...}. Reads only."""
    from toolkit.launch import diagnose

    return diagnose(_record(run))


def diff(run_a: RunRecord | str | os.PathLike, run_b: RunRecord | str | os.PathLike) -> dict[str, Any]:
    """What differs between two runs (or render directories): rendered files (bounded unified diffs),
    provenance (versions per node), nodes, and validation / benchmark results where present."""
    from toolkit.doctor.diff import diff_dirs

    return diff_dirs(_dir_of(run_a), _dir_of(run_b))


def _dir_of(ref: RunRecord | str | os.PathLike) -> Path:
    """A run's directory: a RunRecord, a directory (a run or a `tk render` output), or a run name."""
    from toolkit.launch.run import RunRecord

    if isinstance(ref, RunRecord):
        return ref.path
    p = Path(os.fspath(ref))
    if p.is_dir() and ((p / "manifest.json").is_file() or (p / "run.json").is_file()):
        return p
    return find_run(ref).path


# --- validate ------------------------------------------------------------------------------------

_VALIDATE_MODES = ("slurm", "in-allocation", "local")


def validate(plan: Plan, *, mode: str = "slurm", on_progress: Callable[..., None] | None = None,
             **options: Any) -> dict[str, Any]:
    """Real NIXL transfers shaped like the plan's KV blocks between every context and generation node.

    mode: "slurm" (submit a job), "in-allocation" (srun inside salloc/sbatch) or "local" (processes here).
    options: the fields of `toolkit.validate.params.Options` (nodes, memory, max_memory_mb, iterations,
    warmup, sweep, sweep_iterations, lengths, min_fraction, transfer_timeout_s, rendezvous_timeout_s,
    timeout_s, pending_timeout_s, run_dir, python, progress_thread, ...).
    Returns the report (also written to the run directory); report["passed"] is the verdict.
    """
    from toolkit.validate.params import Options, ValidateError
    from toolkit.validate.run import validate as run_validation

    if plan.is_aggregated:
        raise ValidateError(f"{plan.name}: an aggregated plan moves no KV between servers, so there is nothing to "
                            "validate; validate the disaggregated plan (without --aggregated)")

    if mode not in _VALIDATE_MODES:
        raise ValidateError(f"mode {mode!r}: one of {', '.join(_VALIDATE_MODES)}")
    if options.get("nodes") and mode != "local":
        raise ValidateError("nodes goes with mode='local' (on Slurm the recipe decides the nodes)")
    try:
        opts = Options(mode=mode, **options)
    except TypeError as exc:
        raise ValidateError(f"validate(): {exc}") from None
    return run_validation(plan, opts, on_progress=on_progress)


# --- sizing (the `size` extra: aiconfigurator) ----------------------------------------------------

def size_multi_turn(result, turns: int, answer_len: int | None = None) -> dict[str, Any]:
    """What a multi-turn shape recomputes on the context servers of tk size's chosen configuration: messages of ISL
    tokens, answers of ``answer_len`` (default OSL); the prefill cost per token from the chosen candidate's
    context TTFT; the pull-back at the bandwidth tk size used."""
    from toolkit.errors import TkError
    from toolkit.size import transfer
    from toolkit.size.multiturn import MultiTurnShape, recompute

    c = result.chosen or result.best_overall
    if c is None:
        raise TkError("tk size chose no configuration: nothing to estimate a multi-turn shape on")
    try:
        shape = MultiTurnShape(turns, result.isl, answer_len or result.osl)
    except ValueError as exc:
        raise TkError(f"--turns/--answer-len: {exc}") from None
    ctx = c.ctx  # the KV one context rank sends (None: an aggregated candidate, whose one rank holds it all)
    kv = transfer.bytes_per_token(result.model, transfer.kv_dtype_of(c.kvcache),
                                  ctx.tp if ctx else 1, ctx.pp if ctx else 1)
    return recompute(shape, prefill_ms_per_token=c.ttft_ms / result.isl,
                     prefill_source=f"aiconfigurator's context TTFT of the chosen configuration "
                                    f"({c.ttft_ms:g} ms for ISL {result.isl})",
                     kv_bytes_per_token=kv, gbps=result.bandwidth.gbps, bandwidth_source=result.bandwidth.detail)


def size(model: str, system: str, gpus: int, isl: int, osl: int, ttft_ms: float, tpot_ms: float, *,
         transport: str | None = None, measured: str | os.PathLike | None = None, measured_pick: str = "slowest",
         gpus_per_node: int | None = None, name: str | None = None, output: str | os.PathLike | None = None):
    """Rank aggregated and disaggregated configurations of `model` on `gpus` x `system` for ISL/OSL under the
    TTFT/TPOT limits (aiconfigurator), add the KV transfer to each disaggregated TTFT (the transport's nominal
    GB/s, or a `tk validate cluster` run's measured pairs), and write the best SLA-meeting disaggregated one as
    a recipe re-checked by tk's plan (reading its relative paths from ``output``'s directory, where it will be
    written) -> toolkit.size.SizeResult. Raises TkError (exit 2) for an unsupported
    model or system, or an SLA nothing meets (the message has the closest candidate's numbers)."""
    from toolkit.size import size as run_size

    return run_size(model, system, gpus, isl, osl, ttft_ms, tpot_ms, transport=transport,
                    measured=os.fspath(measured) if measured else None, measured_pick=measured_pick,
                    gpus_per_node=gpus_per_node, name=name, output=os.fspath(output) if output else None)


def multi_turn_share(plan: Plan, turns: int, answer_len: int | None = None, message_len: int | None = None,
                     prediction: dict | None = None) -> dict[str, Any]:
    """What a multi-turn shape recomputes on this plan's context servers (toolkit.size.multiturn): ``turns`` turns of
    ``message_len`` new tokens (default: the plan's typical or max input length split over the turns and answers)
    and ``answer_len``-token answers (default max_output_len). Prefill cost per token: aiconfigurator's context TTFT
    over its ISL when ``prediction`` is given, else the plan's estimate; the pull-back at the transport's nominal
    GB/s."""
    from toolkit.errors import TkError
    from toolkit.size.multiturn import MultiTurnShape, recompute

    answer = answer_len or plan.traffic.max_output_len
    total = plan.traffic.typical_input_len or plan.traffic.max_input_len
    message = message_len or max(1, (total - (turns - 1) * answer) // turns)
    try:
        shape = MultiTurnShape(turns, message, answer)
    except ValueError as exc:
        raise TkError(f"--turns/--answer-len/--message-len: {exc}") from None
    if shape.prompt(turns) > plan.traffic.max_input_len:
        raise TkError(f"a {turns}-turn conversation of {message}-token messages and {answer}-token answers reaches "
                      f"{shape.prompt(turns)} input tokens; the plan admits {plan.traffic.max_input_len} "
                      f"(traffic.max_input_len): fewer turns or shorter messages")
    est = plan.estimates
    if prediction and prediction.get("ttft_ms") and prediction.get("isl"):
        per_token = prediction["ttft_ms"] / prediction["isl"]
        source = f"aiconfigurator's context TTFT {prediction['ttft_ms']:g} ms for ISL {prediction['isl']}"
    else:
        per_token = est.largest_request_prefill_ms / plan.kv.largest_request_tokens
        source = f"the plan's prefill estimate ({est.largest_request_prefill_ms:g} ms for " \
                 f"{plan.kv.largest_request_tokens} tokens)"
    kv = est.largest_request_transfer_ms / 1e3 * est.nominal_gbps * 1e9 / plan.kv.largest_request_tokens
    return recompute(shape, prefill_ms_per_token=per_token, prefill_source=source, kv_bytes_per_token=kv,
                     gbps=est.nominal_gbps, bandwidth_source=f"{est.transport}, nominal")


def predict(plan: Plan) -> dict[str, Any]:
    """aiconfigurator's predicted TTFT, TPOT and tokens/s/GPU for `plan`'s exact configuration (instances x
    TP x PP and max_batch_size per role), with tk's KV-transfer term; `not_modelled` lists what it leaves out."""
    from toolkit.size import predict as run_predict

    return run_predict(plan)


# --- bench -------------------------------------------------------------------------------------------

def _plan_of_run(run: RunRecord) -> tuple[Plan | None, str | None]:
    """The plan a run was launched from (limits, estimates, GPU count): rebuilt from the resolved recipe its
    manifest.json records (its --set overrides included, whatever the recipe file says now), in the run's mode.
    (None, why) when it cannot be: a damaged manifest, or a recipe this tk does not read (a newer tk's field); bench
    then goes without the plan's numbers and says why (a workload note, and the tokenizer error if it needs one)."""
    from toolkit.errors import RecipeError, TkError

    try:
        return _launched_plan(run, aggregated=run.mode == "aggregated"), None
    except (RecipeError, TkError) as exc:
        why = str(exc)
    except Exception as exc:  # noqa: BLE001 - a planner bug must not stop the bench: said, with its type
        why = f"{type(exc).__name__}: {exc}"
    first = why.strip().splitlines()[0] if why.strip() else "no reason given"
    return None, f"the plan could not be rebuilt from {run.path / 'manifest.json'} ({first[:300]})"


def _launched_plan(record: RunRecord, overrides: Sequence[str] = (), *, aggregated: bool) -> Plan:

    import yaml

    from toolkit.errors import TkError
    from toolkit.plan import build_plan
    from toolkit.recipe.loader import load_recipe_text

    from toolkit.runtime import files

    manifest = record.path / "manifest.json"
    try:
        recipe = files.read_json(manifest, 16 << 20, follow=False)["recipe"]
    except (OSError, ValueError, KeyError, TypeError) as exc:  # files.FileProblem: too big, too deep, not JSON
        raise TkError(f"{manifest}: cannot read the run's resolved recipe ({str(exc)[:300]})") from None
    text = yaml.safe_dump(recipe, sort_keys=False)
    return build_plan(load_recipe_text(text, record.recipe or str(manifest), tuple(overrides)), aggregated=aggregated)


_BASELINE_PORT_SHIFT = 100  # tk bench RUN --baseline aggregated: the baseline's ports, beside the serving run's


def bench(run: RunRecord | str | os.PathLike | None = None, *, workload: str = "fixed", isl: int | None = None,
          osl: int | None = None, concurrency: Sequence[int] | None = None, request_rate: Sequence[float] | None = None,
          requests: int | None = None, turns: int = 3, sla: str | None = None, tokenizer: str | None = None,
          baseline: str | RunRecord | None = None, baseline_url: str | None = None, max_error_rate: float = 0.01,
          seed: int = 100, timeout_s: float = 1800.0, name: str | None = None,
          after_target: Callable[[], None] | None = None,
          on_progress: Callable[..., None] | None = None, turn_delay_ms: float = 0.0, trace: str | None = None,
          validation: str | os.PathLike | None = None) -> dict[str, Any]:
    """Benchmark a serving run with aiperf; write RUN/bench/NAME-TIMESTAMP/; return the results document whose
    "verdict" has "exit_code" 0 (pass), 1 (SLA missed) or 2 (invalid). Bad input raises BenchInputError (exit 2).

    baseline "aggregated": after the run is measured, tk launches an aggregated deployment of the same recipe on
    the same number of GPUs (launch_baseline; fail-fast; on ports _BASELINE_PORT_SHIFT above the run's unless
    after_target freed them), runs the identical workload, compares greedy answers, and stops it. A RunRecord
    (an aggregated run already serving) or baseline_url (an aggregated server) is measured as it is."""
    import contextlib
    import dataclasses

    from toolkit.bench import (check_bench_name, limits_for_plan, resolve_tokenizer, run_bench, target_for_run,
                               target_for_url)
    from toolkit.bench.sla import parse_sla
    from toolkit.bench.verdict import Bounds
    from toolkit.bench.workload import BenchInputError, build_workload
    from toolkit.launch.run import RunRecord as Record

    objectives = parse_sla(sla)  # bad input first: nothing is started for a typo
    check_bench_name(name)
    record = _refresh_run(_record(run))
    plan, no_plan = _plan_of_run(record)
    wl = build_workload(workload, isl=isl, osl=osl, concurrency=tuple(concurrency) if concurrency else None,
                        request_rate=tuple(request_rate) if request_rate else None, requests=requests, turns=turns,
                        seed=seed, limits=limits_for_plan(plan), turn_delay_ms=turn_delay_ms, trace=trace)
    if no_plan:
        wl = dataclasses.replace(wl, notes=(*wl.notes, f"{no_plan}: ISL and OSL are not checked against what the "
                                                       "deployment admits, and the plan's estimates are not shown"))
    # not serving: said first, before anything else is looked up; an aggregated run is measured as one (every
    # instance's URL, no legs to prove)
    target = target_for_run(record, plan, aggregated=record.mode == "aggregated",
                            name="aggregated" if record.mode == "aggregated" else "disaggregated")
    tok = resolve_tokenizer(tokenizer, plan, record.engine, no_plan=no_plan)
    _check_trace_tokenizer(wl, tok)
    base = None
    if baseline == "aggregated":
        shift = () if after_target is not None else _shifted_ports(plan)

        @contextlib.contextmanager
        def base():
            base_run = launch_baseline(record, overrides=shift)
            try:
                yield target_for_run(_refresh_run(base_run), _plan_of_run(base_run)[0], name="aggregated",
                                     aggregated=True)
            finally:
                stop(base_run)
    elif isinstance(baseline, Record):
        base = target_for_run(_refresh_run(baseline), _plan_of_run(baseline)[0], name="aggregated", aggregated=True)
    elif baseline is not None:
        raise BenchInputError(f"--baseline {baseline}: the only baseline is 'aggregated'")
    elif baseline_url:
        base = target_for_url(baseline_url, record.model, gpus=target.gpus)
    return run_bench(target, wl, tokenizer=tok, bench_root=record.path / "bench", objectives=objectives,
                     bounds=Bounds(max_error_rate=max_error_rate), plan=plan, name=name, baseline=base,
                     after_target=after_target, timeout_s=timeout_s, on_progress=on_progress,
                     validation=os.fspath(validation) if validation else None)


def _check_trace_tokenizer(wl, tokenizer: str) -> None:
    """aiperf 0.13 synthesizes the prompts of 10 or more hash_ids trace entries in worker processes that force the
    Hugging Face hub offline and then take a tokenizer *directory* for a hub repo id, and fail
    (aiperf/dataset/generator/parallel_decode.py ``_init_worker``); fewer are decoded in-process and work."""
    from toolkit.bench.workload import BenchInputError, read_trace

    for cell in wl.cells:
        if cell.trace and Path(tokenizer).is_dir():
            n = sum(1 for e in read_trace(cell.trace) if e.get("hash_ids"))
            if n >= 10:
                raise BenchInputError(
                    f"--trace {cell.trace}: {n} entries carry hash_ids and the tokenizer is a directory "
                    f"({tokenizer}); aiperf 0.13 decodes 10 or more of them in worker processes that cannot load a "
                    f"tokenizer directory. Give --tokenizer a Hugging Face model name (cached), or keep hash_ids to "
                    f"fewer than 10 entries (e.g. first turns only)")


def _shifted_ports(plan) -> tuple[str, ...]:
    """--set overrides that move a baseline's ports _BASELINE_PORT_SHIFT above the plan's (its servers must not meet
    the run still serving on the same nodes)."""
    if plan is None:
        return ()
    out = [f"proxy.port={plan.proxy.port + _BASELINE_PORT_SHIFT}",
           f"cluster.worker_base_port={min(s.port for s in plan.servers) + _BASELINE_PORT_SHIFT}"]
    internal = [p for s in plan.servers for _, p in s.internal_ports]
    if internal:
        out.append(f"cluster.internal_base_port={min(internal) + _BASELINE_PORT_SHIFT}")
    return tuple(out)


def bench_recipe(recipe: str | os.PathLike, *, local: bool = False, overrides: Sequence[str] = (),
                 run_dir: str | os.PathLike | None = None, baseline: str | None = None,
                 on_launch: Callable[[RunRecord], None] | None = None, **bench_kwargs) -> dict[str, Any]:
    """Launch RECIPE fail-fast, benchmark it, stop it (always). With baseline "aggregated" the deployment is
    stopped once measured, and the aggregated one is launched on the GPUs it freed. Same result as bench()."""
    from toolkit.runtime import signals

    plan = load_plan(recipe, (*overrides, "supervision.policy=fail-fast"))
    # Everything that can be refused is refused before GPUs are allocated: the SLA, the workload against the
    # plan's limits, the tokenizer, aiperf itself.
    _bench_recipe_checks(plan, bench_kwargs)
    # SIGTERM and SIGHUP end it as Ctrl-C does: the deployment it launched is stopped whatever stage it is in
    with signals.interrupt_on_termination():
        run = launch(plan, local=local, run_dir=run_dir)
        stopped = []

        def stop_target():
            stop(run)
            stopped.append(run)

        try:
            if on_launch is not None:
                on_launch(run)
            return bench(run, baseline=baseline, after_target=stop_target if baseline == "aggregated" else None,
                         **bench_kwargs)
        finally:
            if not stopped:
                stop(run)


def bench_compare(recipe: str | os.PathLike, compare: Sequence[str], *, local: bool = False,
                  overrides: Sequence[str] = (), run_dir: str | os.PathLike | None = None,
                  on_launch: Callable[[RunRecord], None] | None = None,
                  on_variant: Callable[[Any, dict | None, str | None], None] | None = None,
                  **bench_kwargs) -> dict[str, Any]:
    """The same workload on every variant of RECIPE (``compare``: ``KEY=V1,V2`` axes, toolkit.bench.variants), one
    after another: launch fail-fast, benchmark, stop. Every variant's plan is checked before the first launch.
    Writes DIR/compare.json, compare.md and compare_turns.png (DIR: ``run_dir``, else
    $TK_RUNS_DIR/compare-NAME-TIME, each variant's run inside it) and returns the comparison (``recommendation``,
    ``variants``, ``compare_dir``). A variant that fails is reported and the others still run."""
    import time

    from toolkit.bench.variants import build_variants, recommend, summarise, write_comparison
    from toolkit.errors import TkError
    from toolkit.runtime import signals
    from toolkit.runtime.rundir import runs_root

    variants = build_variants(compare)
    plans = [load_plan(recipe, (*overrides, *v.overrides, "supervision.policy=fail-fast")) for v in variants]
    _bench_recipe_checks(plans[0], bench_kwargs)
    base = Path(run_dir) if run_dir else runs_root() / f"compare-{plans[0].name}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:  # a new directory, made by this command (mkdir never follows a symlink there, a dangling one included)
        base.parent.mkdir(parents=True, exist_ok=True)
        base.mkdir()
    except FileExistsError:
        raise TkError(f"{base} exists: give another --run-dir for the comparison") from None
    except OSError as exc:
        raise TkError(f"{base}: cannot create the comparison directory ({exc.strerror or exc})") from None
    lines: list[dict] = []
    prefix = bench_kwargs.pop("name", None) or "compare"
    wl = bench_kwargs.get("workload", "fixed")
    shape = (f"trace {bench_kwargs['trace']}" if bench_kwargs.get("trace") else
             f"{wl}, ISL {bench_kwargs.get('isl') or 'default'}, OSL {bench_kwargs.get('osl') or 'default'}"
             + (f", {bench_kwargs.get('turns', 3)} turns" if wl == "multi-turn" else ""))

    def comparison(interrupted: bool) -> dict[str, Any]:
        doc = {"recipe": plans[0].name, "workload": shape, "compare_dir": str(base), "axes": list(compare),
               "variants": lines, "recommendation": recommend(lines)}
        if interrupted:  # what ran is kept; no recommendation rests on a partial comparison
            doc |= {"interrupted": True, "not_run": [v.slug for v in variants[len(lines):]],
                    "recommendation": {"variant": None, "reason": f"interrupted after {len(lines)} of "
                                       f"{len(variants)} variants: no recommendation from a partial comparison"}}
        return doc

    # SIGTERM and SIGHUP end it as Ctrl-C does, between variants too: the variant running is stopped by
    # bench_recipe, and the variants already measured are written before the signal ends the command
    with signals.interrupt_on_termination():
        try:
            for v in variants:
                doc = err = None
                try:
                    doc = bench_recipe(recipe, local=local, overrides=(*overrides, *v.overrides),
                                       run_dir=base / v.slug, on_launch=on_launch, name=f"{prefix}-{v.slug}",
                                       **bench_kwargs)
                except TkError as exc:
                    err = str(exc).splitlines()[0][:500] if str(exc) else type(exc).__name__
                lines.append(summarise(v, doc, err))
                if on_variant is not None:
                    on_variant(v, doc, err)
        except (KeyboardInterrupt, signals.Terminated):
            if lines:
                with signals.deferred():
                    write_comparison(base, comparison(interrupted=True))
            raise
    out = comparison(interrupted=False)
    write_comparison(base, out)
    return out


def _bench_recipe_checks(plan: Plan, bench_kwargs: dict) -> None:
    """What tk bench RECIPE refuses before it allocates anything: the SLA, the workload against the plan's limits,
    the tokenizer, aiperf, a validation report."""
    from toolkit.bench import check_bench_name, find_aiperf, limits_for_plan, resolve_tokenizer
    from toolkit.bench.sla import parse_sla
    from toolkit.bench.workload import build_workload

    parse_sla(bench_kwargs.get("sla"))
    check_bench_name(bench_kwargs.get("name"))
    build_workload(bench_kwargs.get("workload", "fixed"), isl=bench_kwargs.get("isl"),
                   osl=bench_kwargs.get("osl"),
                   concurrency=tuple(bench_kwargs["concurrency"]) if bench_kwargs.get("concurrency") else None,
                   request_rate=tuple(bench_kwargs["request_rate"]) if bench_kwargs.get("request_rate") else None,
                   requests=bench_kwargs.get("requests"), turns=bench_kwargs.get("turns", 3),
                   limits=limits_for_plan(plan), turn_delay_ms=bench_kwargs.get("turn_delay_ms", 0.0),
                   trace=bench_kwargs.get("trace"))
    resolve_tokenizer(bench_kwargs.get("tokenizer"), plan, plan.engine.name)
    find_aiperf()
    if bench_kwargs.get("validation"):
        from toolkit.bench import reverse_bandwidth_for
        reverse_bandwidth_for(os.fspath(bench_kwargs["validation"]), plan)


def _refresh_run(run: RunRecord) -> RunRecord:
    from toolkit.launch import refresh

    return refresh(run)


def baseline_plan(run: RunRecord | str | os.PathLike, overrides: Sequence[str] = ()) -> Plan:
    """The aggregated plan of a run's recipe as it was launched: the resolved recipe its manifest.json records
    (--set overrides and defaults included; the recipe file may have changed since), read as if it were the
    recipe file (relative model paths resolve beside it), then `overrides`, then `--aggregated`."""
    from toolkit.errors import TkError

    record = _record(run)
    if record.mode == "aggregated":
        raise TkError(f"{record.name} is already an aggregated run; give the disaggregated run")
    return _launched_plan(record, overrides, aggregated=True)


def launch_baseline(run: RunRecord | str | os.PathLike, *, local: bool | None = None,
                    run_dir: str | os.PathLike | None = None, overrides: Sequence[str] = (),
                    pending_timeout_s: float | None = None, startup_timeout_s: float | None = None,
                    on_progress: Callable[[Progress], None] | None = None) -> RunRecord:
    """Launch the aggregated baseline of `run` (a RunRecord, run directory or name): the same model on the same
    GPU count, plain `trtllm-serve` instances (toolkit.plan.aggregated), with the run's backend (unless `local`
    says), fail-fast supervision, and wait until it serves. Returns its RunRecord (mode "aggregated"; endpoints:
    every instance's URL). Raises TkError as launch() does; stop it with stop(record)."""
    record = _record(run)
    plan = baseline_plan(record, (*overrides, "supervision.policy=fail-fast"))
    use_local = record.backend == "local" if local is None else local
    return launch(plan, local=use_local, run_dir=run_dir, pending_timeout_s=pending_timeout_s,
                  startup_timeout_s=startup_timeout_s, on_progress=on_progress)




def import_config(source: str | os.PathLike, *, kind: str | None = None, name: str | None = None,
                  output: str | os.PathLike | None = None, force: bool = False):
    """Convert an existing disaggregated deployment config into a tk recipe (toolkit.importer): NVIDIA srt-slurm
    TensorRT-LLM recipes ("srt-slurm"), TensorRT-LLM's Slurm benchmark config.yaml ("trtllm-bench") or a
    `trtllm-serve disaggregated` config with the servers' options ("trtllm-disagg"); ``kind`` None detects it.
    The recipe is planned at once: the result lists what was not carried, what tk renders differently, and the
    plan's violations (TensorRT-LLM's rules) if any. With ``output`` the recipe is written there atomically (an
    existing file only with ``force``). Raises RecipeError when the source cannot be read or converted."""
    from toolkit.errors import RecipeError, TkError, Violation
    from toolkit.importer import import_config as convert
    from toolkit.runtime import files

    result = convert(source, kind=kind, name=name, output=output)
    if output is None:
        return result
    out = Path(output)
    exists = Violation(str(out), None, "(output)", "exists already; tk import does not overwrite it",
                       "choose another -o path, or pass --force")
    try:  # a whole regular file or none (toolkit.runtime.files): with force a regular file is replaced, nothing else
        files.write_regular_atomically(out, result.text, 0o644, replace=force, parents=True)
    except FileExistsError:
        raise RecipeError([exists]) from None
    except files.FileProblem as exc:
        raise TkError(f"-o {exc}; nothing was written") from None
    except OSError as exc:
        raise TkError(f"{out}: cannot write the recipe ({exc.strerror or exc})") from None
    return result
