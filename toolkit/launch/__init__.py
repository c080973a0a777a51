"""Stage 4: run a rendered deployment on Slurm or locally, wait until it serves, report, stop.

    launch(plan, backend)  render into a run directory, submit, wait (bounded) for every server's
                           /health, the proxy's /health and one smoke request with >= 1 token
    refresh(run)           the current state of every server
    stop(run)              end it and verify nothing is left
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import requests

from toolkit.errors import TkError
from toolkit.launch.backends import LaunchError, backend_for
from toolkit.launch.run import (RunRecord, find_run, load_run, log_tail, new_run_dir, read_nodes,
                           read_phases)
from toolkit.plan.model import Plan
from toolkit.render import render_files, write_atomically

HEALTH_TIMEOUT_S = 3
SMOKE_PROMPT = "tk smoke test: the KV cache moves from context to generation"


@dataclass
class Progress:
    """What `tk launch` shows while it waits."""

    run: RunRecord
    job: str  # PENDING / RUNNING / ...
    healthy: dict  # role -> (healthy, total)
    message: str


class LaunchFailed(TkError):
    def __init__(self, run: RunRecord, reason: str, component: str | None, tail: str):
        self.run, self.reason, self.component, self.tail = run, reason, component, tail
        text = f"{run.name}: {reason}"
        if component:
            text += f"\n--- last lines of {component}'s log ({run.log_path(component)}) ---\n{tail}"
        super().__init__(text)


def prepare(plan: Plan, backend: str, run_dir: str | None = None) -> RunRecord:
    """Render the plan into a new run directory and create its record."""
    path = new_run_dir(plan, run_dir)
    if (path / "run.json").exists():
        raise TkError(f"{path} already holds a run; give another --run-dir or stop and remove it")
    write_atomically(render_files(plan), path)
    (path / "logs").mkdir(exist_ok=True)
    (path / "state").mkdir(exist_ok=True)
    run = RunRecord.new(plan, path, backend)
    run.set_state("rendered")
    return run


def launch(plan: Plan, backend_name: str, run_dir: str | None = None, *, pending_timeout_s: float | None = None,
           startup_timeout_s: float | None = None, on_progress: Callable[[Progress], None] | None = None,
           smoke: bool = True) -> RunRecord:
    backend = backend_for(backend_name)
    backend.preflight(plan)
    run = prepare(plan, backend_name, run_dir)
    pending_timeout_s = pending_timeout_s or plan.slurm.pending_timeout_s
    startup_timeout_s = startup_timeout_s or plan.slurm.startup_timeout_s
    try:
        backend.submit(run, plan)
        _wait_until_serving(run, backend, pending_timeout_s, startup_timeout_s, on_progress)
        if smoke:
            _smoke_request(run, plan)
    except LaunchFailed:
        raise
    except (TkError, KeyboardInterrupt) as exc:
        reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc)
        _fail(run, backend, reason, None)
    run.set_state("ready", None)
    return run


def _fail(run: RunRecord, backend, reason: str, component: str | None):
    """Record the failure, release everything, raise with the failing component's log tail."""
    tail = log_tail(run.log_path(component)) if component else ""
    if component:
        try:
            run.server(component).state = "failed"
        except KeyError:
            pass
    run.set_state("failed", reason)
    problems = backend.stop(run)
    _mark_stopped(run)
    run.set_state("failed", reason + (f"; cleanup: {'; '.join(problems)}" if problems else ""))
    raise LaunchFailed(run, reason, component, tail)


def _failed_phase(run: RunRecord) -> tuple[str, str | None] | None:
    for _, phase, detail in read_phases(run):
        if phase == "failed":
            first = detail.split(" ", 1)[0]
            names = {s.name for s in run.servers}
            return detail, (first if first in names else None)
    return None


def _wait_until_serving(run, backend, pending_timeout_s, startup_timeout_s, on_progress) -> None:
    submitted = time.monotonic()
    started = None
    while True:
        job = backend.job_state(run)
        failed = _failed_phase(run)
        if failed:
            _fail(run, backend, failed[0], failed[1])
        if job.phase == "PENDING":
            if run.state != "pending":
                run.set_state("pending", job.detail)
            if time.monotonic() - submitted > pending_timeout_s:
                _fail(run, backend, f"job still pending after {pending_timeout_s:g}s ({job.detail}); "
                                    "raise cluster.pending_timeout_s or --pending-timeout", None)
        elif job.phase == "ENDED":
            failed = _failed_phase(run)
            if failed:
                _fail(run, backend, failed[0], failed[1])
            _fail(run, backend, f"the job ended before serving ({job.detail})",
                  "supervisor" if run.backend == "local" else None)
        else:
            if started is None:
                started = time.monotonic()
                run.set_state("starting", None)
            _probe(run)
            if run.server("proxy").state == "healthy":
                return
            if time.monotonic() - started > startup_timeout_s:
                slow = [s.name for s in run.servers if s.state != "healthy"]
                _fail(run, backend, f"not healthy after {startup_timeout_s:g}s: {', '.join(slow)}",
                      slow[0] if slow else None)
        if on_progress:
            on_progress(Progress(run=run, job=job.phase, healthy=_healthy_counts(run), message=job.detail))
        time.sleep(1)


def _healthy_counts(run: RunRecord) -> dict:
    out = {}
    for role in ("ctx", "gen", "proxy"):
        servers = [s for s in run.servers if s.role == role]
        out[role] = (sum(s.state == "healthy" for s in servers), len(servers))
    return out


def _probe(run: RunRecord) -> None:
    """Ask every server the job has started (after its port checks) for /health; update the record.
    Before that, whatever answers on a server's host and port is not this run's server."""
    nodes = read_nodes(run)
    started = {detail.split(" ", 1)[0] for _, phase, detail in read_phases(run) if phase == "started"}
    for s in run.servers:
        if s.node not in nodes or s.name not in started:
            continue
        s.host = nodes[s.node]
        try:
            ok = requests.get(f"http://{s.host}:{s.port}/health", timeout=HEALTH_TIMEOUT_S).status_code == 200
        except requests.RequestException:
            ok = False
        if ok:
            s.state = "healthy"
        elif s.state == "healthy":
            s.state = "unhealthy"
        elif s.state == "planned":
            s.state = "starting"
    proxy = run.server("proxy")
    if proxy.host:
        run.endpoint = f"http://{proxy.host}:{proxy.port}"
    run.save()


def _smoke_request(run: RunRecord, plan: Plan) -> None:
    body = {"model": run.model, "prompt": SMOKE_PROMPT, "max_tokens": 4, "temperature": 0, "stream": False}
    try:
        resp = requests.post(f"{run.endpoint}/v1/completions", json=body,
                             timeout=min(300, plan.proxy.request_timeout_s))
    except requests.RequestException as exc:
        raise LaunchError(f"smoke request through the proxy failed: {exc}") from None
    if resp.status_code != 200:
        raise LaunchError(f"smoke request through the proxy answered HTTP {resp.status_code}: {resp.text[:300]}")
    try:
        doc = resp.json()
        tokens = doc.get("usage", {}).get("completion_tokens") or 0
        text = doc["choices"][0].get("text") or ""
    except (ValueError, KeyError, IndexError, AttributeError):
        raise LaunchError(f"smoke request returned an unexpected body: {resp.text[:300]}") from None
    if tokens < 1 and not text:
        raise LaunchError("smoke request through the proxy returned no tokens")


def refresh(run: RunRecord) -> RunRecord:
    """Bring the record up to date: job state, the job's own phases, every server's health."""
    backend = backend_for(run.backend)
    if run.state in ("stopped",):
        return run
    job = backend.job_state(run) if run.state != "rendered" else None
    failed = _failed_phase(run)
    if failed:
        reason, component = failed
        if component:
            run.server(component).state = "failed"
        run.reason = reason
        run.state = "failed"
    if job and job.phase == "RUNNING":
        _probe(run)
        if run.state != "failed":
            down = [s.name for s in run.servers if s.state in ("unhealthy", "failed")]
            if down and run.state == "ready":
                run.state, run.reason = "degraded", f"not healthy: {', '.join(down)}"
    elif job and job.phase == "ENDED" and run.state not in ("failed", "stopped"):
        run.state, run.reason = "failed", f"the job ended ({job.detail})"
    if job and job.phase == "ENDED":
        _mark_stopped(run)
    run.save()
    return run


def _mark_stopped(run: RunRecord) -> None:
    """Once the job is gone, every server that did not fail is stopped."""
    for s in run.servers:
        if s.state != "failed":
            s.state = "stopped"


def stop(run: RunRecord) -> list[str]:
    problems = backend_for(run.backend).stop(run)
    _mark_stopped(run)
    if run.state != "failed":
        run.set_state("stopped", "; ".join(problems) or None)
    else:
        run.save()
    return problems


__all__ = ["LaunchFailed", "Progress", "find_run", "launch", "load_run", "prepare", "refresh", "stop"]
