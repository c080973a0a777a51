"""tk bench: load a serving deployment with NVIDIA's aiperf, judge the result, write a report.

    workload.py  workloads -> aiperf command lines (pure)
    runner.py    aiperf as a bounded subprocess, output to aiperf.log
    results.py   aiperf's export -> typed records
    probe.py     counters before/after: proof that every request took both legs and its KV moved
    verdict.py   validity -> disaggregation -> SLA; exit 0 / 1 / 2 (pure)
    report.py    results.json, results.csv, verdict.json, PNG plots, report.md, rich tables
    compare.py   a baseline (aggregated) beside the deployment, and greedy answers compared

The bench directory RUN/bench/NAME-TIMESTAMP/ is assembled in a hidden staging directory and renamed into
place only when complete; on an error (aiperf failing, a bad input, Ctrl-C) nothing is left behind.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from orchestrator.states import SERVER_ROLES, EventKind, Role
from toolkit.bench import probe as probes
from toolkit.bench.results import CellResult, ExportError, read_export
from toolkit.bench.runner import AiperfFailed, find_aiperf, log_tail, run_aiperf
from toolkit.bench.sla import Objective
from toolkit.bench.verdict import Bounds, Stage, decide
from toolkit.bench.workload import BenchInputError, Limits, Workload, aiperf_argv
from toolkit.errors import TkError
from toolkit.runtime import signals

__all__ = ["BenchInputError", "Target", "target_for_run", "target_for_url", "limits_for_plan", "run_bench",
           "resolve_tokenizer"]


@dataclass
class Target:
    """What a benchmark loads: an OpenAI endpoint, its model, who proves its legs, and its GPUs."""

    name: str  # "disaggregated" | "aggregated"
    endpoint: str
    model: str
    probe: object  # toolkit.bench.probe.Probe
    gpus: int | None = None
    run: dict = field(default_factory=dict)  # the run record's public fields (for the report)
    urls: tuple[str, ...] = ()  # an aggregated run's instances (no proxy): aiperf round-robins over them
    # A generation server of the run, asked for whole requests (as TensorRT-LLM's proxy sends it short prompts under
    # conditional_disagg_config): its greedy answers involve no KV transfer, so answers through the proxy that differ
    # from them mean the KV arrived wrong. None: no such check (an aggregated target, a baseline beside it).
    reference: str | None = None
    workers: dict = field(default_factory=dict)  # server name -> URL (the servers' own counters, multi-turn)


def _server_urls(run) -> dict[str, str]:
    from toolkit.launch.run import read_nodes

    nodes = read_nodes(run)
    out = {}
    for s in run.servers:
        host = s.host or nodes.get(s.node)
        if host:
            out[s.name] = f"http://{host}:{s.port}"
    return out


def target_for_run(run, plan=None, *, name: str = "disaggregated", aggregated: bool = False) -> Target:
    """A Target for a serving run (a RunRecord). BenchInputError (exit 2) when the run does not serve."""
    if run.state != "ready" or not run.endpoint:
        raise BenchInputError(f"run {run.name} is not serving (state {run.state}"
                              f"{', ' + run.reason if run.reason else ''}); start it with tk launch, "
                              f"then check it with tk status {run.name}")
    gpus = plan.gpu_count if plan is not None else None
    # The servers whose counters tk reads: context, generation (or aggregated) servers only, never the proxy nor
    # the etcd a membership run starts, which has no such counters (M1)
    roles = {s.name for s in run.servers if s.role in SERVER_ROLES}
    servers = {k: v for k, v in _server_urls(run).items() if k in roles}
    reference = None
    if aggregated:
        pr = probes.AggregatedProbe()
    else:
        pr = probes.probe_for(run.endpoint, servers)
        reference = next((servers[s.name] for s in run.servers if s.role == Role.GEN and s.name in servers), None)
    urls = tuple(getattr(run, "endpoints", None) or ()) if aggregated else ()
    return Target(name=name, endpoint=run.endpoint, model=run.model, probe=pr, gpus=gpus, run=run.public(),
                  urls=urls, workers=servers, reference=None if aggregated else reference)


def target_for_url(url: str, model: str, *, gpus: int | None = None, name: str = "aggregated") -> Target:
    """A Target for an aggregated server that is already serving (a baseline)."""
    return Target(name=name, endpoint=url.rstrip("/"), model=model, probe=probes.AggregatedProbe(), gpus=gpus,
                  run={"run_dir": "", "engine": "aggregated", "endpoint": url, "name": name})


def limits_for_plan(plan) -> Limits:
    if plan is None:
        return Limits()
    return Limits(plan.traffic.max_input_len, plan.traffic.max_output_len)


def resolve_tokenizer(tokenizer: str | None, plan=None, engine: str = "", no_plan: str | None = None) -> str:
    """--tokenizer DIR, else the engine's shipped tokenizer (if the engine profile names one), else the
    recipe's model path when it is a local directory. BenchInputError (exit 2) with the fix otherwise (no_plan: why
    the run's plan, which names them, could not be rebuilt)."""
    if tokenizer:
        if not Path(tokenizer).is_dir():
            raise BenchInputError(f"--tokenizer {tokenizer}: not a directory (a Hugging Face tokenizer directory: "
                                  f"tokenizer.json, tokenizer_config.json)")
        return str(Path(tokenizer).resolve())
    if plan is not None:
        if plan.engine.tokenizer_dir:  # the engine ships one whose counts equal its own (the stand-in's)
            from toolkit.resources import package_path
            try:
                return str(package_path(plan.engine.tokenizer_dir))
            except FileNotFoundError as exc:
                raise BenchInputError(str(exc)) from None
        model_path = plan.context.model_path
        if model_path and Path(model_path).is_dir():
            return model_path
    raise BenchInputError(
        "no tokenizer for aiperf" + (f" ({no_plan})" if plan is None and no_plan else "")
        + ": pass --tokenizer DIR (the model's tokenizer directory"
        + "; for the CPU stand-in, a whitespace word-level tokenizer)")


def _check_serving(target: Target) -> None:
    import requests

    # /health: both trtllm-serve and the disaggregated server have it (the disaggregated server has no /v1/models,
    # tensorrt_llm/serve/openai_disagg_server.py register_routes, NVIDIA/TensorRT-LLM@01edceae)
    try:
        resp = requests.get(target.endpoint + "/health", timeout=5)
        resp.raise_for_status()
    except Exception as exc:  # noqa: BLE001
        raise BenchInputError(f"{target.endpoint} does not answer /health with 200 ({exc}); is the run serving? "
                              f"(tk status)") from None


BENCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
PARTIAL = re.compile(r"\.(?P<name>.+)\.partial-(?P<host>[A-Za-z0-9._-]+)-(?P<pid>[0-9]+)")


def check_bench_name(name: str | None) -> None:
    """--name becomes a directory name under RUN/bench: nothing that could lead elsewhere (m8)."""
    if name is not None and not BENCH_NAME.fullmatch(name):
        raise BenchInputError(f"--name {name[:80]!r}: 1-64 letters, digits, '.', '_' or '-', starting with a letter "
                              "or digit (it names a directory under RUN/bench)")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64] or "host"


def remove_stale_staging(root: Path) -> list[Path]:
    """Staging directories left by benchmarks on this host whose process is gone (a kill -9, a power cut): removed.
    One of another host, or of a process still running, is left alone."""
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries[:10000]:
        m = PARTIAL.fullmatch(entry.name)
        if not m or m["host"] != _host() or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            os.kill(int(m["pid"]), 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError, ValueError):
            continue  # someone else's process, or no such pid number
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def _bench_dir(root: Path, name: str) -> tuple[Path, Path]:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(root)
    final = root / f"{name}-{stamp}"
    n = 1
    while final.exists():
        n += 1
        final = root / f"{name}-{stamp}-{n}"
    staging = root / f".{final.name}.partial-{_host()}-{os.getpid()}"
    staging.mkdir()
    return final, staging


def _publish(staging: Path, final: Path) -> Path:
    n = 1
    base = final
    while True:
        try:
            os.mkdir(final)  # claim the name exclusively, then swap the finished tree in
        except FileExistsError:
            n += 1
            final = base.with_name(f"{base.name}-{n}")
            continue
        os.rmdir(final)
        os.rename(staging, final)
        return final


def measure(target: Target, workload: Workload, *, aiperf: str, tokenizer: str, out: Path, log: Path,
            timeout_s: float, on_progress: Callable[..., None] | None = None,
            prefix: str = "") -> tuple[dict[str, CellResult], probes.Proof]:
    """Run every cell of a workload against a target; the probe is read before and after."""
    try:
        before = target.probe.snapshot()
    except Exception as exc:  # noqa: BLE001
        before = None
        proof_err = f"counters unreadable before the run ({exc})"
    results: dict[str, CellResult] = {}
    for i, cell in enumerate(workload.cells):
        cell_dir = out / "aiperf" / f"{prefix}{cell.name}"
        common = dict(aiperf=aiperf, url=target.urls or target.endpoint, model=target.model, tokenizer=tokenizer,
                      seed=workload.seed)
        if on_progress:
            on_progress("cell", target=target.name, cell=cell.name, index=i, total=len(workload.cells))
        warm = None
        if cell.warmup_separately:
            # other conversations than the profiled ones (aiperf's own warm-up would replay those and leave their
            # KV in the servers' caches); its records are kept as the cell's warm-up
            warm_dir = out / "aiperf" / f"{prefix}{cell.name}-warmup"
            rc = run_aiperf(aiperf_argv(cell, out_dir=str(warm_dir), warmup_run=True, **common), log, timeout_s,
                            on_line=(lambda line: on_progress("line", line=line)) if on_progress else None)
            try:
                warm = read_export(warm_dir, cell.name)
            except ExportError as exc:
                raise AiperfFailed(rc, f"{exc}\n{log_tail(log)}") from None
        argv = aiperf_argv(cell, out_dir=str(cell_dir), **common)
        counter = None
        if cell.multi_turn and target.workers:
            from toolkit.bench.reuseprobe import ReuseProbe
            counter = ReuseProbe(None if target.urls else target.endpoint, target.workers)
            counts_before = counter.snapshot()
        rc = run_aiperf(argv, log, timeout_s,
                        on_line=(lambda line: on_progress("line", line=line)) if on_progress else None)
        try:
            res = read_export(cell_dir, cell.name)
        except ExportError as exc:
            raise AiperfFailed(rc, f"{exc}\n{log_tail(log)}") from None
        if warm is not None:
            from dataclasses import replace
            res.records = [replace(r, phase="warmup") for r in warm.records] + res.records
        if counter is not None:
            from toolkit.bench.reuse import server_counts
            res.servers = server_counts(counts_before, counter.snapshot())
        results[cell.name] = res  # rc 1 with records (every request failed) is judged by the verdict
    if before is None:
        proof = probes.unavailable(proof_err)
    else:
        try:
            proof = target.probe.proof(before, target.probe.snapshot())
        except Exception as exc:  # noqa: BLE001
            proof = probes.unavailable(f"counters unreadable after the run ({exc})")
    return results, proof


def _estimates(plan, workload: Workload, results: dict[str, CellResult]) -> list[dict]:
    if plan is None:
        return []
    est = plan.estimates
    cells = [c for c in workload.cells if c.turns == 1 and results.get(c.name) is not None]
    if not cells:
        return []
    # the longest input at the lowest load: closest to the estimate's single largest request
    cell = max(cells, key=lambda c: (c.isl, -(c.concurrency or 0)))
    ttft = results[cell.name].stat("time_to_first_token", "p50")
    scale = cell.isl / plan.traffic.max_input_len if plan.traffic.max_input_len else 1.0
    prefill, transfer = est.largest_request_prefill_ms * scale, est.largest_request_transfer_ms * scale
    return [{"quantity": f"prefill + KV transfer at ISL {cell.isl} (TTFT p50, {cell.name})",
             "estimated": prefill + transfer, "measured": ttft,
             "note": f"plan estimate scaled from ISL {plan.traffic.max_input_len} (prefill {prefill:.3g} ms, "
                     f"transfer {transfer:.3g} ms over {est.transport}); measured TTFT includes queueing and HTTP"}]


def reverse_bandwidth_for(validation: str | None, plan):
    """The generation->context bandwidth for the pull-back projection: a validation report's reverse pairs, else the
    plan's transport at its nominal GB/s (labelled so). BenchInputError for a report that cannot be read."""
    from toolkit.bench.pullback import Bandwidth, ReportError, reverse_bandwidth
    if validation:
        try:
            return reverse_bandwidth(validation)
        except ReportError as exc:
            raise BenchInputError(f"--validation: {exc}") from None
    if plan is None:
        return None
    est = plan.estimates
    return Bandwidth(est.nominal_gbps, "nominal",
                     f"the {est.transport} transport's nominal {est.nominal_gbps:g} GB/s (an assumption: no "
                     f"validation report given; pass --validation RUN_DIR of a `tk validate cluster` run)")


def _multi_turn(workload: Workload, results: dict, plan, proof, reverse, verdict) -> dict:
    """Per multi-turn cell: the per-turn reuse table, the pull-back projection; the reuse findings join the
    verdict as the stage "reuse" (they never change its exit code)."""
    from toolkit.bench import reuse
    out = {}
    in_run = sum(len(r.records) for r in results.values() if r is not None)
    for cell in workload.cells:
        res = results.get(cell.name)
        if not cell.multi_turn or res is None:
            continue
        section, checks = reuse.analyse(cell, res, plan=plan, proof=proof, counts=res.servers, bandwidth=reverse,
                                        requests_in_run=in_run)
        out[cell.name] = section
        verdict.checks.extend(checks)
    verdict.summary += _reuse_findings([c for c in verdict.checks if c.stage == reuse.STAGE])
    return out


def _reuse_findings(checks: list) -> str:
    """What the verdict's summary adds for the reuse checks that found something ("" where none did)."""
    bad = [c for c in checks if not c.ok and not c.skipped]
    return f" (reuse: {len(bad)} finding(s): " + "; ".join(c.name for c in bad) + ")" if bad else ""


# What the job's supervision did to a component while it was measured (orchestrator.states.EventKind values).
SUPERVISION_EVENTS = (EventKind.EXITED, EventKind.WEDGED, EventKind.KILLED, EventKind.RESTARTED, EventKind.LOST,
                      EventKind.STEP_NOT_CREATED, EventKind.UNHEALTHY, EventKind.MEMBERSHIP_REPAIRED,
                      EventKind.UNREGISTERED)


def supervision_during(target: Target, t0: float, t1: float) -> list[dict]:
    """The job's own supervision events (state/events.jsonl) between t0 and t1: a restart, a wedge, a component
    lost while the benchmark ran. Read from the job's fields, never its words; [] where there is no run."""
    run_dir = target.run.get("run_dir") if isinstance(target.run, dict) else None
    if not run_dir:
        return []
    from toolkit.runtime.rundir import read_events
    return [{"time": e["time"], "event": e["event"], "component": e["component"], "exit_code": e["exit_code"],
             "reason": e["reason"]} for e in read_events(Path(run_dir))
            if t0 <= e["time"] <= t1 and e["event"] in SUPERVISION_EVENTS]


def run_bench(target: Target, workload: Workload, *, tokenizer: str, bench_root: Path,
              objectives: tuple[Objective, ...] = (), bounds: Bounds = Bounds(), plan=None, name: str | None = None,
              baseline=None, after_target: Callable[[], None] | None = None, timeout_s: float = 1800.0,
              on_progress: Callable[..., None] | None = None, validation: str | None = None) -> dict:
    """Benchmark target, then (if given) a baseline with the same workload; write the bench directory; return its
    document (with "verdict" and "bench_dir"). Raises BenchInputError / TkError, leaving nothing behind.

    baseline: a Target already serving, or a callable returning a context manager that starts one and ends it
    (an aggregated deployment on the same GPUs: tk bench calls after_target first, e.g. to stop the disaggregated
    deployment and free its GPUs, then starts the baseline). The greedy answers of both are compared.
    name: the bench directory's name (NAME-TIMESTAMP under bench_root): letters, digits, '.', '_', '-' only."""
    check_bench_name(name)
    aiperf = find_aiperf()
    reverse = reverse_bandwidth_for(validation, plan) if any(c.multi_turn for c in workload.cells) else None
    _check_serving(target)
    if isinstance(baseline, Target):
        _check_serving(baseline)
    with signals.interrupt_on_termination():  # SIGTERM / SIGHUP end the benchmark as Ctrl-C does
        staging = None
        try:
            final, staging = _bench_dir(Path(bench_root), name or workload.kind)
            return _measure_and_publish(target, workload, aiperf=aiperf, tokenizer=tokenizer, final=final,
                                        staging=staging, objectives=objectives, bounds=bounds, plan=plan,
                                        baseline=baseline, after_target=after_target, timeout_s=timeout_s,
                                        on_progress=on_progress, reverse=reverse)
        except AiperfFailed as exc:
            raise TkError(f"aiperf failed (exit {exc.rc}); nothing was written. Its last lines:\n{exc.tail}") \
                from None
        except TimeoutError as exc:
            raise TkError(f"{exc}; nothing was written (raise --timeout)") from None
        except OSError as exc:  # a full disk, a read-only or vanished bench directory
            raise TkError(f"cannot write the bench directory under {bench_root} ({exc.strerror or exc}); nothing "
                          "was written") from None
        finally:
            with signals.deferred():  # a second signal must not leave the staging directory behind
                if staging is not None and staging.exists():
                    shutil.rmtree(staging, ignore_errors=True)


def _measure_and_publish(target: Target, workload: Workload, *, aiperf: str, tokenizer: str, final: Path,
                         staging: Path, objectives, bounds: Bounds, plan, baseline, after_target, timeout_s: float,
                         on_progress, reverse=None) -> dict:
    from toolkit.bench import report

    measure_cells = functools.partial(measure, workload=workload, aiperf=aiperf, tokenizer=tokenizer, out=staging,
                                      log=staging / "aiperf.log", timeout_s=timeout_s, on_progress=on_progress)
    started = time.time()
    results, proof = measure_cells(target)
    supervision = supervision_during(target, started, time.time())
    proof = probes.account_for_restarts(proof, supervision)  # what a restart took from the counters, said
    conditional = bool(plan is not None and plan.proxy is not None
                       and (plan.proxy.config.get("conditional_disagg_config") or {}))
    # the measurement's own verdict (the multi-turn reuse findings join it); decided again at the end with the
    # answers compared
    verdict = decide(workload, results, proof, objectives, gpus=target.gpus, bounds=bounds, conditional=conditional)
    multi_turn = _multi_turn(workload, results, plan, proof, reverse, verdict)
    rows = [report.cell_row(target.name, c, results.get(c.name), target.gpus) for c in workload.cells]
    doc = {"name": final.name, "bench_dir": str(final), "created": time.time(), "run": target.run,
           "model": target.model, "tokenizer": tokenizer, "gpus": target.gpus,
           "aiperf_version": next((r.aiperf_version for r in results.values() if r.aiperf_version), None),
           "workload": workload.to_dict(), "sla": [o.to_dict() for o in objectives],
           "bounds": bounds.to_dict(), "proof": proof.to_dict(),
           "cells": {k: v.to_dict() for k, v in results.items()},
           "estimates": _estimates(plan, workload, results), "rows": rows, "cells_dirs": [c.name for c in workload.cells],
           "supervision": supervision}
    if multi_turn:
        # per cell; the first multi-turn cell's turns and projection also at the top (one cell is the usual)
        first = next(iter(multi_turn.values()))
        doc.update(multi_turn=multi_turn, turns=first["turns"], pullback_projection=first["pullback_projection"])
    answers, against = None, "the aggregated baseline's"
    if baseline is not None:
        answers = _measure_baseline(doc, target, workload, baseline, after_target, measure_cells, objectives, bounds)
    elif target.reference:
        answers, against = _against_reference(doc, target)
    # decided once everything is known: answers that differ are a FAIL of the deployment
    final_verdict = decide(workload, results, proof, objectives, gpus=target.gpus, bounds=bounds, answers=answers,
                           baseline_error=doc.get("baseline_error"), reference_error=doc.get("reference_error"),
                           against=against, conditional=conditional)
    reuse_checks = [c for c in verdict.checks if c.stage == Stage.REUSE]  # informational: they change no exit code
    final_verdict.checks += reuse_checks
    final_verdict.summary += _reuse_findings(reuse_checks)
    doc["verdict"] = final_verdict.to_dict()
    report.write_all(staging, doc)
    return {**doc, "bench_dir": str(_publish(staging, final))}


def _measure_baseline(doc: dict, target: Target, workload: Workload, baseline, after_target, measure_cells,
                      objectives, bounds: Bounds) -> dict | None:
    """The baseline measured with the same workload after the target (after_target first, e.g. to free the GPUs),
    its rows, cells and verdict added to ``doc`` with the comparison; the greedy answers of both compared (None
    where the baseline could not be measured: ``doc["baseline_error"]`` says why)."""
    import contextlib

    from toolkit.bench import report
    from toolkit.bench.compare import answers_agree, compare, greedy_answers

    mine = greedy_answers(target.endpoint, target.model)
    if after_target is not None:
        after_target()
    try:
        starting = baseline() if callable(baseline) else contextlib.nullcontext(baseline)
        with starting as base:
            _check_serving(base)
            base_results, _ = measure_cells(base, prefix="baseline-")
            theirs = greedy_answers(base.endpoint, base.model)
    except (TkError, AiperfFailed, TimeoutError) as exc:
        # The deployment's own measurement stands; the report says why there is no baseline beside it.
        doc["baseline_error"] = (f"aiperf failed (exit {exc.rc})" if isinstance(exc, AiperfFailed)
                                 else str(exc))[:2000]
        return None
    rows = doc["rows"]
    base_rows = [report.cell_row(base.name, c, base_results.get(c.name), base.gpus) for c in workload.cells]
    doc["rows"] = rows + base_rows  # a new list: `rows` stays the deployment's own for the comparison
    doc["cells_dirs"] += [f"baseline-{c.name}" for c in workload.cells]
    answers = answers_agree(mine, theirs)
    doc["baseline"] = compare(rows, base_rows, base, answers)
    doc["baseline"]["run"] = base.run
    doc["baseline"]["verdict"] = decide(workload, base_results, None, objectives, gpus=base.gpus,
                                        bounds=bounds).to_dict()
    return answers


def _against_reference(doc: dict, target: Target) -> tuple[dict | None, str]:
    """No baseline: the deployment's greedy answers through the proxy against one generation server's whole
    answers; (the comparison, or None where the reference failed: ``doc["reference_error"]``; what it is against)."""
    from toolkit.bench.compare import ERROR_PREFIX, answers_agree, greedy_answers

    mine = greedy_answers(target.endpoint, target.model)
    theirs = greedy_answers(target.reference, target.model)
    against = f"those of a generation server ({target.reference}) answering whole requests"
    if any(t.startswith(ERROR_PREFIX) for t in theirs):
        doc["reference_error"] = next(t for t in theirs if t.startswith(ERROR_PREFIX))[:500]
        return None, against
    answers = answers_agree(mine, theirs, against="generation_server")
    doc["answers"] = {**answers, "against": target.reference}
    return answers, against
