"""Stage 4: run a rendered deployment on Slurm or locally, wait until it serves, report, stop.

    launch(plan, backend)  render into a run directory, submit, wait (bounded) for every server's
                           /health, the proxy's /health and one smoke request with >= 1 token
    refresh(run)           the current state of every server
    stop(run)              end it and verify nothing is left
    diagnose(run)          why it failed: its logs and job state matched against known failure signatures
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, NoReturn

import requests

import toolkit.doctor as doctor
from orchestrator.states import BEYOND_HEALTH_STATES, SUPERVISED_STATES, ComponentState, EventKind, Role, RunState
from toolkit.errors import TkError
from toolkit.launch.backends import LaunchError, backend_for
from toolkit.launch.run import (RunRecord, all_runs, find_run, load_run, log_tail, new_run_dir, read_events,
                                read_nodes, read_supervision)
from toolkit.plan import plan_for_run
from toolkit.plan.build import RUN_TAG_LEN
from toolkit.plan.model import Plan
from toolkit.runtime.tls import write_run_certificates
from toolkit.runtime import bounds, rundir, signals
from toolkit.runtime.slurm import SlurmError
from toolkit.render import render_files, write_atomically

# One /health probe of tk's own (tk launch, tk status). Every server is probed at once, so `tk status` answers in
# about this long whatever the number of servers, even with some hung (benchmarks/bench_status.py).
HEALTH_TIMEOUT_S = 1.0
PROBE_WIDTH = 64
CONTROLLER_GRACE_S = 120  # how long launch waits for an unresponsive slurmctld before giving up
SMOKE_TIMEOUT_S = 300  # bound on the smoke request (no more than the proxy's request timeout where there is one)
SMOKE_PROMPT = "tk smoke test: the KV cache moves from context to generation"


@dataclass
class Progress:
    """What `tk launch` shows while it waits."""

    run: RunRecord
    job: str  # PENDING / RUNNING / ...
    healthy: dict  # role -> (healthy, total)
    message: str


class LaunchFailed(TkError):
    def __init__(self, run: RunRecord, reason: str, component: str | None, tail: str,
                 diagnosis: dict | None = None):
        self.run, self.reason, self.component, self.tail = run, reason, component, tail
        self.diagnosis = diagnosis  # toolkit.doctor.diagnose's document, when it could be made
        text = f"{run.name}: {reason}"
        if diagnosis and diagnosis["findings"]:
            text += "\n" + doctor.format_diagnosis(diagnosis, brief=True)
        if component:
            text += f"\n--- last lines of {component}'s log ({run.log_path(component)}) ---\n{tail}"
        if diagnosis is not None:
            text += f"\n(tk doctor {run.run_dir} explains more)"
        super().__init__(text)


SECRETS_DIR = "secrets"  # RUN/secrets: owner-only; the etcd certificates of a membership run (secrets/etcd)


def prepare(plan: Plan, backend: str, run_dir: str | None = None) -> RunRecord:
    """Render the plan into a new run directory and create its record. With membership, the plan is the run's own
    (plan_for_run: a cluster name no other run shares), and the etcd the job starts gets the run's certificates."""
    plan = plan_for_run(plan, uuid.uuid4().hex[:RUN_TAG_LEN])
    files = render_files(plan)
    path = new_run_dir(plan, run_dir)
    try:
        write_atomically(files, path)
        (path / "logs").mkdir(exist_ok=True)
        (path / "state").mkdir(exist_ok=True)
        etcd = plan.membership.etcd if plan.membership is not None else None
        if etcd is not None and etcd.tls_generated:
            write_run_certificates(path / SECRETS_DIR / "etcd")
        run = RunRecord.new(plan, path, backend)
        run.set_state(RunState.RENDERED)
    except OSError as exc:
        rundir.release_if_unused(path)
        raise TkError(f"{path}: cannot write the run directory ({exc.strerror or exc})") from None
    except BaseException:
        rundir.release_if_unused(path)
        raise
    return run


def launch(plan: Plan, backend_name: str, run_dir: str | None = None, *, pending_timeout_s: float | None = None,
           startup_timeout_s: float | None = None, on_progress: Callable[[Progress], None] | None = None,
           smoke: bool = True) -> RunRecord:
    """Render, submit, wait (bounded) until the deployment serves. Any failure, Ctrl-C, SIGTERM or SIGHUP
    releases the job before LaunchFailed is raised: nothing keeps running unwatched."""
    pending_timeout_s = bounds.wait_seconds("--pending-timeout", pending_timeout_s) or plan.slurm.pending_timeout_s
    startup_timeout_s = bounds.wait_seconds("--startup-timeout", startup_timeout_s) or plan.slurm.startup_timeout_s
    backend = backend_for(backend_name)
    backend.preflight(plan)
    with signals.interrupt_on_termination():
        run = prepare(plan, backend_name, run_dir)
        try:
            backend.submit(run)
            _wait_until_serving(run, backend, pending_timeout_s, startup_timeout_s, on_progress)
            if smoke:
                _smoke_request(run, plan)
            run.set_state(RunState.READY, None)
        except LaunchFailed:
            raise
        except signals.Terminated as exc:
            _fail(run, backend, f"interrupted by {exc}", None, exit_code=signals.exit_code(exc))
        except KeyboardInterrupt as exc:
            _fail(run, backend, "interrupted", None, exit_code=signals.exit_code(exc))
        except OSError as exc:  # e.g. the disk filled after sbatch: the job id is in memory, release it
            _fail(run, backend, f"cannot write the run directory ({exc.strerror or exc})", None)
        except TkError as exc:
            _fail(run, backend, str(exc), None)
    return run


def _fail(run: RunRecord, backend, reason: str, component: str | None, exit_code: int = 1) -> NoReturn:
    """Record the failure, release everything, raise with the failing component's log tail."""
    tail = log_tail(run.log_path(component)) if component else ""
    if component:
        try:
            run.server(component).state = ComponentState.FAILED.value
        except KeyError:
            pass
    with signals.deferred():  # a second signal must not cut the cleanup short
        try:
            run.set_state(RunState.FAILED, reason)
        except OSError:
            pass  # the record cannot be written (disk full, read-only): release the job all the same
        try:
            problems = backend.stop(run)
        except TkError as exc:
            problems = [f"could not confirm the job was released: {exc}"]
        _mark_stopped(run)
        try:
            run.set_state(RunState.FAILED, reason + (f"; cleanup: {'; '.join(problems)}" if problems else ""))
        except OSError as exc:
            reason += f"; run.json could not be written ({exc.strerror or exc})"
    reason += f"; cleanup: {'; '.join(problems)}" if problems else ""
    failed = LaunchFailed(run, reason, component, tail, _diagnosis(run, reason, component))
    failed.exit_code = exit_code  # 128 + the signal when a signal ended the launch, as the shell expects
    raise failed


def _diagnosis(run: RunRecord, reason: str, component: str | None) -> dict | None:
    """The doctor's reading of a failed launch; None if even that fails (it must never hide the failure)."""
    try:
        return doctor.diagnose(run.path, name=run.name, state=RunState.FAILED.value, reason=reason, failing=component)
    except Exception:  # noqa: BLE001
        return None


def diagnose(run: RunRecord) -> dict:
    """Why the run failed (or what its logs show): the job's state, the job's phases, every log matched
    against toolkit.doctor.signatures; see toolkit.doctor.diagnose for the document."""
    job = None
    if run.state != RunState.RENDERED:
        try:
            state = backend_for(run.backend).job_state(run)
            job = {"phase": state.phase, "detail": state.detail}
        except Exception as exc:  # noqa: BLE001  (a controller that does not answer is part of the story)
            job = {"phase": "UNKNOWN", "detail": str(exc)[:300]}
    failing = next((s.name for s in run.servers if s.state == ComponentState.FAILED), None)
    doc = doctor.diagnose(run.path, name=run.name, state=run.state, reason=run.reason, failing=failing, job=job)
    doc["servers"] = [{"name": s.name, "node": s.node, "host": s.host, "port": s.port, "state": s.state}
                      for s in run.servers]
    return doc


def _failed_event(run: RunRecord) -> tuple[str, str | None] | None:
    """The job's first `failed` event: (its reason, the component it names, if that is one of the run's)."""
    for e in read_events(run):
        if e["event"] == EventKind.FAILED:
            names = {s.name for s in run.servers}
            return e["reason"] or "the job failed", (e["component"] if e["component"] in names else None)
    return None


def _wait_until_serving(run, backend, pending_timeout_s, startup_timeout_s, on_progress) -> None:
    submitted = time.monotonic()
    started = None
    unreachable_since = None
    while True:
        try:
            job = backend.job_state(run)
            unreachable_since = None
        except SlurmError as exc:
            # A controller that stops answering is not a job that ended: wait (bounded) for it to come back.
            unreachable_since = unreachable_since or time.monotonic()
            if time.monotonic() - unreachable_since > CONTROLLER_GRACE_S:
                _fail(run, backend, f"the Slurm controller has not answered for {CONTROLLER_GRACE_S:g}s: {exc}", None)
            if on_progress:
                on_progress(Progress(run=run, job="UNKNOWN", healthy=_healthy_counts(run), message=str(exc)))
            time.sleep(2)
            continue
        failed = _failed_event(run)
        if failed:
            _fail(run, backend, failed[0], failed[1])
        if job.phase == "PENDING":
            if run.state != RunState.PENDING:
                run.set_state(RunState.PENDING, job.detail)
            if time.monotonic() - submitted > pending_timeout_s:
                _fail(run, backend, f"job still pending after {pending_timeout_s:g}s ({job.detail}); "
                                    "raise cluster.pending_timeout_s or --pending-timeout", None)
        elif job.phase == "ENDED":
            _ended_before_serving(run, backend, job)
        else:
            if started is None:
                started = time.monotonic()
                run.set_state(RunState.STARTING, None)
            _probe(run)
            run.save()
            if _serving(run):
                return
            if time.monotonic() - started > startup_timeout_s:
                _start_up_overdue(run, backend, startup_timeout_s)
        if on_progress:
            on_progress(Progress(run=run, job=job.phase, healthy=_healthy_counts(run), message=job.detail))
        time.sleep(1)


def _ended_before_serving(run: RunRecord, backend, job) -> NoReturn:
    """The job ended before serving: fail with its own failure where it said one, else with the job's log."""
    failed = _failed_event(run)
    if failed:
        _fail(run, backend, failed[0], failed[1])
    _fail(run, backend, f"the job ended before serving ({job.detail})", backend.log_name)


def _start_up_overdue(run: RunRecord, backend, startup_timeout_s: float) -> NoReturn:
    """Past the start-up bound: fail naming the servers that are not healthy, or, where every one answers but the
    job is still in its start-up (e.g. registration), the job's last event."""
    slow = [s.name for s in run.servers if s.state != ComponentState.HEALTHY]
    if not slow:
        events = read_events(run)
        last = f"{events[-1]['event']} {events[-1]['reason'] or ''}".strip() if events else "none"
        _fail(run, backend, f"the job did not report ready within {startup_timeout_s:g}s "
                            f"(its last event: {last})", None)
    _fail(run, backend, f"not healthy after {startup_timeout_s:g}s: {', '.join(slow)}", slow[0])


def _serving(run: RunRecord) -> bool:
    """The job says it is ready (its start-up is over, every worker registered, supervision has taken over), and
    from here the proxy answers /health; in an aggregated run (no proxy), every server does."""
    if not _job_said_ready(run):
        return False
    if run.front:
        return run.server(run.front).state == ComponentState.HEALTHY
    return all(s.state == ComponentState.HEALTHY for s in run.servers)


def _job_said_ready(run: RunRecord) -> bool:
    """The job said `ready` (an event in the events' tail), or wrote the endpoint it writes just before saying so
    (a long run's early `ready` may have left the bounded tail tk reads)."""
    return any(e["event"] == EventKind.READY for e in read_events(run)) or (run.path / "endpoint").is_file()


def _healthy_counts(run: RunRecord) -> dict:
    out = {}
    for role in dict.fromkeys([Role.CTX, Role.GEN, Role.PROXY] if run.front else [s.role for s in run.servers]):
        servers = [s for s in run.servers if s.role == role]
        out[role] = (sum(s.state == ComponentState.HEALTHY for s in servers), len(servers))
    return out


def _health(url: str) -> bool:
    try:
        return requests.get(url, timeout=HEALTH_TIMEOUT_S).status_code == 200
    except requests.RequestException:
        return False


def _probe(run: RunRecord) -> None:
    """Ask every server the job has started (after its port checks) for /health, all at once (bounded by one
    probe timeout), and read what the job's supervision last recorded for it (state, restarts, last exit, PID or
    step); update the record. Before a server is started, whatever answers on its host and port is not this
    run's server."""
    nodes = read_nodes(run)
    supervision = read_supervision(run)
    # started: a `started` event in the events' tail, or a state file (the job writes one when it starts a server,
    # so a long run's stable servers stay probed after their `started` event left the bounded tail)
    started = {e["component"] for e in read_events(run) if e["event"] == EventKind.STARTED} | set(supervision)
    targets = [s for s in run.servers if s.node in nodes and s.name in started]
    for s in targets:
        s.host = nodes[s.node]
    tls_dir = run.path / SECRETS_DIR / "etcd"

    def healthy(s) -> bool:
        if s.role == Role.ETCD and tls_dir.is_dir():  # the job's etcd opens to the run's certificate only
            return _tls_health_ok(s.host, s.port, tls_dir)
        return _health(f"http://{s.host}:{s.port}/health")
    with ThreadPoolExecutor(max_workers=max(1, min(PROBE_WIDTH, len(targets)))) as pool:
        answers = dict(zip([s.name for s in targets], pool.map(healthy, targets)))
    for s in targets:
        seen = supervision.get(s.name)
        if seen:
            s.restarts, s.last_exit, s.step = seen["restarts"], seen["last_exit"], seen["step"]
            s.pid = seen["pid"] if run.backend == "local" else None  # on Slurm that PID is srun's, not the server's
        ok = answers[s.name]
        before = s.state
        if ok and seen and seen["state"] in BEYOND_HEALTH_STATES:  # /health answers, but the job sees more
            s.state, s.reason = seen["state"], seen["reason"]
        elif ok:
            s.state, s.reason = ComponentState.HEALTHY.value, None
        elif seen and seen["state"] in SUPERVISED_STATES:
            s.state, s.reason = seen["state"], seen["reason"]
        elif s.state == ComponentState.HEALTHY:
            s.state, s.reason = ComponentState.UNHEALTHY.value, "/health does not answer 200"
        elif s.state == ComponentState.PLANNED:
            s.state = ComponentState.STARTING.value
        if s.state != before or s.since is None:
            s.since = seen["since"] if seen and seen["state"] == s.state else round(time.time(), 3)
    if run.front:
        proxy = run.server(run.front)
        if proxy.host:
            run.endpoint = f"http://{proxy.host}:{proxy.port}"
    elif all(s.host for s in run.servers):  # aggregated: every server is an endpoint, the first is the run's
        run.endpoints = [f"http://{s.host}:{s.port}" for s in run.servers]
        run.endpoint = run.endpoints[0]


def _tls_health_ok(host: str, port: int, tls_dir) -> bool:
    """GET /health over TLS with the run's client certificate; the etcd's certificate checked against the run's CA
    (not a host name: toolkit.runtime.tls)."""
    import http.client
    import ssl

    try:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(str(tls_dir / "ca.crt"))
        ctx.check_hostname = False
        ctx.load_cert_chain(str(tls_dir / "client.crt"), str(tls_dir / "client.key"))
        conn = http.client.HTTPSConnection(host, port, timeout=HEALTH_TIMEOUT_S, context=ctx)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        finally:
            conn.close()
    except (OSError, ssl.SSLError, http.client.HTTPException):
        return False


def _smoke_request(run: RunRecord, plan: Plan) -> None:
    """One completion through the proxy; in an aggregated run, one through every server."""
    if plan.proxy is None:
        for url in run.endpoints:
            _smoke_one(run, url, SMOKE_TIMEOUT_S, "the aggregated server " + url)
        return
    _smoke_one(run, run.endpoint, plan.proxy.request_timeout_s, "the proxy")


def _smoke_one(run: RunRecord, url: str, timeout_s: float, through: str) -> None:
    body = {"model": run.model, "prompt": SMOKE_PROMPT, "max_tokens": 4, "temperature": 0, "stream": False}
    try:
        resp = requests.post(f"{url}/v1/completions", json=body, timeout=min(SMOKE_TIMEOUT_S, timeout_s))
    except requests.RequestException as exc:
        raise LaunchError(f"smoke request through {through} failed: {exc}") from None
    if resp.status_code != 200:
        raise LaunchError(f"smoke request through {through} answered HTTP {resp.status_code}: {resp.text[:300]}")
    try:
        doc = resp.json()
        tokens = doc.get("usage", {}).get("completion_tokens") or 0
        text = doc["choices"][0].get("text") or ""
    except (ValueError, KeyError, IndexError, AttributeError):
        raise LaunchError(f"smoke request returned an unexpected body: {resp.text[:300]}") from None
    if tokens < 1 and not text:
        raise LaunchError(f"smoke request through {through} returned no tokens")


def refresh(run: RunRecord) -> RunRecord:
    """Bring the record up to date: job state, the job's own events, every server's health. The job's events
    are the authority on where it is: a run whose launcher was killed before it recorded `ready` is ready once
    the job says so."""
    backend = backend_for(run.backend)
    if run.state == RunState.STOPPED:
        return run
    job = backend.job_state(run) if run.state != RunState.RENDERED else None
    failed = _failed_event(run)
    if failed:
        reason, component = failed
        if component:
            run.server(component).state = ComponentState.FAILED.value
        run.reason = reason
        run.state = RunState.FAILED.value
    if job and job.phase == "RUNNING":
        _probe(run)
        if failed and failed[1]:
            # the job is ending because of it: that outranks its last probe
            run.server(failed[1]).state = ComponentState.FAILED.value
        if run.state in (RunState.SUBMITTED, RunState.PENDING, RunState.STARTING):
            # the launcher is gone (or still waiting): the job's own account says where it is
            if _job_said_ready(run):
                run.state = RunState.READY.value
            elif run.state != RunState.STARTING:
                run.set_state(RunState.STARTING, None)
        if run.state in (RunState.READY, RunState.DEGRADED):
            _serving_state(run, job)
    elif job and job.phase == "ENDED" and run.state not in (RunState.FAILED, RunState.STOPPED):
        run.state, run.reason = RunState.FAILED.value, f"the job ended ({job.detail})"
    if job and job.phase == "ENDED":
        _mark_stopped(run)
    try:
        run.save()
    except OSError:
        pass  # a read-only or copied run directory: the state shown is still current
    return run


def _serving_state(run: RunRecord, job) -> None:
    """A serving run is ready or degraded (naming what is down), worked out afresh on every refresh, so a run that
    recovered is "ready" again with no stale reason."""
    down = [s for s in run.servers if s.state != ComponentState.HEALTHY]
    state = RunState.DEGRADED if down or job.unsupervised else RunState.READY
    reason = "; ".join(f"{s.name} {s.state}" + (f" ({s.reason})" if s.reason else "") for s in down) or None
    if job.unsupervised:  # the orchestrator's own life: nothing restarts what fails from now on
        reason = "; ".join(filter(None, [ORCHESTRATOR_GONE.format(detail=job.detail, run=run.name), reason]))
    if state != run.state:
        run.history.append([round(time.time(), 3), state.value, reason])
    run.state, run.reason = state.value, reason
    if run.endpoint is None:
        _endpoint_from_job(run)


ORCHESTRATOR_GONE = ("the job's orchestrator is gone ({detail}): nothing supervises the servers, and a failure is "
                     "neither restarted nor said; tk stop {run}, then launch again")


def _endpoint_from_job(run: RunRecord) -> None:
    """The endpoint the job wrote (RUN/endpoint), for a run whose launcher never recorded it."""
    try:
        text = (run.path / "endpoint").read_text(errors="replace")[:512].strip()
    except OSError:
        return
    if text.startswith("http://") and " " not in text:
        run.endpoint = text


def _mark_stopped(run: RunRecord) -> None:
    """Once the job is gone, every server that did not fail is stopped."""
    for s in run.servers:
        if s.state != ComponentState.FAILED:
            s.state = ComponentState.STOPPED.value


ACTIVE_STATES = (RunState.SUBMITTED, RunState.PENDING, RunState.STARTING, RunState.READY, RunState.DEGRADED)


def active_runs() -> list[RunRecord]:
    """The runs whose record says they are under way and whose job the backend has not seen end (a job it cannot
    ask about, a Slurm controller that does not answer, counts as under way), oldest first."""
    out = []
    for run in all_runs():
        if run.state not in ACTIVE_STATES:
            continue
        try:
            if backend_for(run.backend).job_state(run).phase == "ENDED":
                continue
        except TkError:
            pass
        out.append(run)
    return out


def stop(run: RunRecord) -> list[str]:
    """End the run's job (bounded) and record it; the problems, if any."""
    with signals.deferred():
        problems = backend_for(run.backend).stop(run)
        _mark_stopped(run)
        try:
            if run.state != RunState.FAILED:
                run.set_state(RunState.STOPPED, "; ".join(problems) or None)
            else:
                run.save()
        except OSError as exc:
            problems.append(f"the job was ended, but {run.path / 'run.json'} could not be written "
                            f"({exc.strerror or exc})")
    return problems


__all__ = ["LaunchFailed", "Progress", "active_runs", "diagnose", "find_run", "launch", "load_run", "prepare", "refresh",
           "stop"]
