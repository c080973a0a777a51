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

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from orchestrator.states import EventKind
from toolkit.bench import probe as probes
from toolkit.bench.results import CellResult, ExportError, read_export
from toolkit.bench.runner import AiperfFailed, find_aiperf, log_tail, run_aiperf
from toolkit.bench.sla import Objective
from toolkit.bench.verdict import Bounds, decide
from toolkit.bench.workload import BenchInputError, Limits, Workload, aiperf_argv
from toolkit.errors import TkError

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
    if aggregated:
        pr = probes.AggregatedProbe()
    else:
        urls = _server_urls(run)
        pr = probes.probe_for(run.endpoint, {k: v for k, v in urls.items() if k != "proxy"})
    urls = tuple(getattr(run, "endpoints", None) or ()) if aggregated else ()
    return Target(name=name, endpoint=run.endpoint, model=run.model, probe=pr, gpus=gpus, run=run.public(),
                  urls=urls)


def target_for_url(url: str, model: str, *, gpus: int | None = None, name: str = "aggregated") -> Target:
    """A Target for an aggregated server that is already serving (a baseline)."""
    return Target(name=name, endpoint=url.rstrip("/"), model=model, probe=probes.AggregatedProbe(), gpus=gpus,
                  run={"run_dir": "", "engine": "aggregated", "endpoint": url, "name": name})


def limits_for_plan(plan) -> Limits:
    if plan is None:
        return Limits()
    return Limits(plan.traffic.max_input_len, plan.traffic.max_output_len)


def resolve_tokenizer(tokenizer: str | None, plan=None, engine: str = "") -> str:
    """--tokenizer DIR, else the engine's shipped tokenizer (if the engine profile names one), else the
    recipe's model path when it is a local directory. BenchInputError (exit 2) with the fix otherwise."""
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
        "no tokenizer for aiperf: pass --tokenizer DIR (the model's tokenizer directory"
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


def _bench_dir(root: Path, name: str) -> tuple[Path, Path]:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{name}-{stamp}"
    n = 1
    while final.exists():
        n += 1
        final = root / f"{name}-{stamp}-{n}"
    staging = root / f".{final.name}.partial-{os.getpid()}"
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
        argv = aiperf_argv(cell, aiperf=aiperf, url=target.urls or target.endpoint, model=target.model, tokenizer=tokenizer,
                           out_dir=str(cell_dir), seed=workload.seed)
        if on_progress:
            on_progress("cell", target=target.name, cell=cell.name, index=i, total=len(workload.cells))
        rc = run_aiperf(argv, log, timeout_s,
                        on_line=(lambda line: on_progress("line", line=line)) if on_progress else None)
        try:
            res = read_export(cell_dir, cell.name)
        except ExportError as exc:
            raise AiperfFailed(rc, f"{exc}\n{log_tail(log)}") from None
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


# What the job's supervision did to a component while it was measured (orchestrator.states.EventKind values).
SUPERVISION_EVENTS = (EventKind.EXITED, EventKind.WEDGED, EventKind.KILLED, EventKind.RESTARTED, EventKind.LOST,
                      EventKind.STEP_NOT_CREATED, EventKind.UNHEALTHY, EventKind.MEMBERSHIP_REPAIRED)


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
              on_progress: Callable[..., None] | None = None) -> dict:
    """Benchmark target, then (if given) a baseline with the same workload; write the bench directory; return its
    document (with "verdict" and "bench_dir"). Raises BenchInputError / TkError, leaving nothing behind.

    baseline: a Target already serving, or a callable returning a context manager that starts one and ends it
    (an aggregated deployment on the same GPUs: tk bench calls after_target first, e.g. to stop the disaggregated
    deployment and free its GPUs, then starts the baseline). The greedy answers of both are compared."""
    import contextlib

    from toolkit.bench import report
    from toolkit.bench.compare import answers_agree, compare, greedy_answers

    aiperf = find_aiperf()
    _check_serving(target)
    if isinstance(baseline, Target):
        _check_serving(baseline)
    final, staging = _bench_dir(Path(bench_root), name or workload.kind)
    try:
        log = staging / "aiperf.log"
        started = time.time()
        results, proof = measure(target, workload, aiperf=aiperf, tokenizer=tokenizer, out=staging, log=log,
                                 timeout_s=timeout_s, on_progress=on_progress)
        supervision = supervision_during(target, started, time.time())
        verdict = decide(workload, results, proof, objectives, gpus=target.gpus, bounds=bounds)
        rows = [report.cell_row(target.name, c, results.get(c.name), target.gpus) for c in workload.cells]
        cells_dirs = [c.name for c in workload.cells]
        doc = {"name": final.name, "bench_dir": str(final), "created": time.time(), "run": target.run,
               "model": target.model, "tokenizer": tokenizer, "gpus": target.gpus,
               "aiperf_version": next((r.aiperf_version for r in results.values() if r.aiperf_version), None),
               "workload": workload.to_dict(), "sla": [o.to_dict() for o in objectives],
               "bounds": bounds.to_dict(), "proof": proof.to_dict(),
               "cells": {k: v.to_dict() for k, v in results.items()}, "verdict": verdict.to_dict(),
               "estimates": _estimates(plan, workload, results), "rows": rows, "cells_dirs": cells_dirs,
               "supervision": supervision}
        if baseline is not None:
            mine = greedy_answers(target.endpoint, target.model)
            if after_target is not None:
                after_target()
            try:
                starting = baseline() if callable(baseline) else contextlib.nullcontext(baseline)
                with starting as base:
                    _check_serving(base)
                    base_results, _ = measure(base, workload, aiperf=aiperf, tokenizer=tokenizer, out=staging,
                                              log=log, timeout_s=timeout_s, on_progress=on_progress,
                                              prefix="baseline-")
                    theirs = greedy_answers(base.endpoint, base.model)
            except (TkError, AiperfFailed, TimeoutError) as exc:
                # The deployment's own measurement stands; the report says why there is no baseline beside it.
                doc["baseline_error"] = (f"aiperf failed (exit {exc.rc})" if isinstance(exc, AiperfFailed)
                                         else str(exc))[:2000]
            else:
                base_rows = [report.cell_row(base.name, c, base_results.get(c.name), base.gpus)
                             for c in workload.cells]
                doc["rows"] = rows + base_rows  # a new list: `rows` stays the deployment's own for the comparison
                doc["cells_dirs"] += [f"baseline-{c}" for c in cells_dirs]
                doc["baseline"] = compare(rows, base_rows, base, answers_agree(mine, theirs))
                doc["baseline"]["run"] = base.run
                doc["baseline"]["verdict"] = decide(workload, base_results, None, objectives, gpus=base.gpus,
                                                    bounds=bounds).to_dict()
        report.write_all(staging, doc)
        return {**doc, "bench_dir": str(_publish(staging, final))}
    except AiperfFailed as exc:
        raise TkError(f"aiperf failed (exit {exc.rc}); nothing was written. Its last lines:\n{exc.tail}") from None
    except TimeoutError as exc:
        raise TkError(f"{exc}; nothing was written (raise --timeout)") from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
