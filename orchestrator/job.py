"""The job: start-up in order, then supervision until the job is cancelled, then teardown.

    Job(spec, run_dir, env).run() -> exit code

Start-up (any failure ends the job; nothing is restarted before the deployment first serves):
  nodes and their addresses, ports already taken (fail), provenance (background), TensorRT-LLM's config check,
  then with membership etcd and the proxy (each answering) before the workers, the workers in plan order (an
  instance sharing a node with a launcher that picks its own IPC port waits for it), every worker healthy (all
  waited on together, each bounded by startup_timeout_s), every worker registered, the proxy healthy; without
  membership the proxy last. Then `ready`.
Serving: every health_interval_s one concurrent round of liveness probes (bounded by one probe timeout), progress
  probes and (with membership) a look at every worker's registration in the background, the policy
  (orchestrator.policy) decides; kills, deregistration, membership repair and lookups run as background work
  (orchestrator.background: a failure is an event) and report back through the inbox, as the messages below, so one
  slow kill never stalls the loop.
Teardown on every path (a failure, a signal, the job's time limit): `stopping`, SIGTERM to every step (30 s),
  SIGKILL, then scancel of the job. Signals: see ENDING_SIGNALS.
"""

from __future__ import annotations

import faulthandler
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Callable, Dict, FrozenSet, List, Optional, TextIO, Union

from orchestrator import membership, startup, tls
from orchestrator.background import Background, BackgroundFailed
from orchestrator.events import EventLog, StateFiles, write_atomically
from orchestrator.policy import (Deregister, Event, Fail, Kill, ProgressWatch, Record, RepairMembership, Start,
                                 Supervisor, exit_code, exit_text)
from orchestrator.probe import Prober
from orchestrator.spec import Component, JobSpec
from orchestrator.states import ComponentState as C
from orchestrator.states import EventKind as E
from orchestrator.states import ComponentKind, RunState
from orchestrator.steps import Steps, terminate_all

POLL_S = 1.0  # start-up waits look this often
STEP_LOOKUP_EVERY_S = 2.0  # while some component has no known step (squeue may list a new one late) ...
STEP_LOOKUP_MAX_S = 60.0  # ... backing off to this while squeue lists no step of the job at all (tk's local shim)


def _signals(*names: str) -> FrozenSet[int]:
    return frozenset(int(getattr(signal, n)) for n in names if hasattr(signal, n))


# The real-time signals, SIGRTMIN..SIGRTMAX (their default action ends a process too): Linux numbers its standard
# signals 1..31 (signal(7)), and Python before 3.11 names no real-time one.
REALTIME_SIGNALS = frozenset(int(s) for s in signal.valid_signals() if int(s) >= 32)
# Valid standard signals this Python has no name for (SIGSTKFLT before 3.11): their default ends a process (Term).
UNNAMED_SIGNALS = frozenset(int(s) for s in signal.valid_signals() if int(s) < 32) - frozenset(
    int(s) for s in signal.Signals)


def signal_name(signum: int) -> str:
    """SIGUSR1, or SIGRTMIN+3 for a real-time signal, or "signal 16" for one this Python does not name."""
    if signum in REALTIME_SIGNALS:
        return f"SIGRTMIN+{signum - min(REALTIME_SIGNALS)}"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# Every signal whose default action ends a process (signal(7): "Term" and "Core"), and what the job does with it.
# Ended with teardown and an event naming the signal: SIGTERM (Slurm's time limit, scancel), SIGINT, SIGHUP, and
# every other one a person, a tool or Slurm may send: `--signal=B:SIG@T` in cluster.sbatch_args is the user asking
# for SIG T seconds before the time limit, and the job takes it as the time to end the deployment cleanly (its
# reason says so: JobSpec.time_limit_signal). The real-time signals SIGRTMIN..SIGRTMAX too.
ENDING_SIGNALS = _signals("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGALRM", "SIGVTALRM", "SIGPROF",
                          "SIGIO", "SIGPWR", "SIGSTKFLT", "SIGXCPU", "SIGTRAP", "SIGSYS", "SIGABRT") \
    | REALTIME_SIGNALS | UNNAMED_SIGNALS
# Not ending the job: SIGUSR2 prints every thread's stack into the job's output (faulthandler; `kill -USR2 JOBPID`);
# SIGPIPE and SIGXFSZ stay ignored, as Python starts (a write to a closed pipe, or past the file size limit, fails
# with an error the writer handles: the job's output, an event line).
KEPT_SIGNALS = _signals("SIGUSR2", "SIGPIPE", "SIGXFSZ")
# Not catchable, or not safely: SIGKILL; SIGSEGV, SIGBUS, SIGILL, SIGFPE are the interpreter faulting (a handler that
# returns re-runs the faulting instruction), so faulthandler prints every thread's stack and the process ends. On
# Slurm the batch script's end ends the job and every step; locally `tk status` says the job's orchestrator is gone.
UNCATCHABLE_SIGNALS = _signals("SIGKILL", "SIGSTOP", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE")


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal_name(signum))
        self.signum = signum


class JobFailed(Exception):
    """Once serving: the policy ended the run (a role below its minimum, fail-fast)."""

    def __init__(self, reason: str, component: Optional[str] = None):
        super().__init__(reason)
        self.reason, self.component = reason, component


# -- the inbox: what background work tells the serving loop -----------------------------------------------------
@dataclass(frozen=True)
class Killed:
    """A kill finished: the component died (its exit code) or survived SIGKILL."""

    name: str
    died: bool
    rc: Optional[int]


@dataclass(frozen=True)
class ProgressAnswered:
    """A progress probe ended: its HTTP status, None for no answer."""

    name: str
    generation: int
    status: Optional[int]


@dataclass(frozen=True)
class Said:
    """An event background work wants written (deregistration)."""

    event: Event


@dataclass(frozen=True)
class Repaired:
    """A membership repair ended (its event says how)."""

    event: Event


@dataclass(frozen=True)
class StepsFound:
    """squeue's answer: component -> Slurm step, as of the starts counted in `launches`."""

    found: Dict[str, str]
    launches: Dict[str, int]


@dataclass(frozen=True)
class Registrations:
    """Which of `asked` (workers) have no key in the cluster storage, as of `launches` and repair `epoch`; None
    when the storage did not answer (its own liveness is supervised as a component)."""

    asked: List[str]
    missing: Optional[List[str]]
    launches: Dict[str, int]
    epoch: int


Message = Union[Killed, ProgressAnswered, Said, Repaired, StepsFound, Registrations]

LIVE_STATES = (C.HEALTHY, C.UNHEALTHY, C.UNREGISTERED)  # serving, or not yet judged otherwise: progress is probed
PROBED_STATES = (*LIVE_STATES, C.STARTING)  # liveness is probed
REGISTERED_STATES = (C.HEALTHY, C.UNREGISTERED)  # a worker whose registration is looked at


class Job:
    def __init__(self, spec: JobSpec, run_dir: str, env: Optional[Dict[str, str]] = None, *,
                 steps: Optional[Steps] = None, prober: Optional[Prober] = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 out: Optional[TextIO] = None):
        env = dict(os.environ if env is None else env)
        self.spec, self.run_dir = spec, run_dir
        self.job_id = env.get("SLURM_JOB_ID", "")
        self.nodelist = env.get("SLURM_JOB_NODELIST", "")
        self.state_dir = os.path.join(run_dir, "state")
        os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
        os.makedirs(self.state_dir, exist_ok=True)
        self.clock, self.wall = clock, wall
        self.events = EventLog(self.state_dir, clock=wall, out=out)
        self.states = StateFiles(self.state_dir, spec.supervision.policy)
        self.steps = steps or Steps(run_dir, self.job_id, spec.srun_flags)
        self.work = Background(self._background_failed)
        self.prober = prober or Prober(spec.supervision.probe_timeout_s, work=self.work)
        self.stop = threading.Event()
        self.signum: Optional[int] = None
        self.handles_signals = False
        self.procs: Dict[str, subprocess.Popen] = {}  # the current process (srun) of each started component
        self.others: List[subprocess.Popen] = []  # provenance and other helper steps, ended at teardown
        self.inbox: "queue.Queue[Message]" = queue.Queue()  # results of background work, handled by the loop
        self.nodes: Optional[startup.Nodes] = None
        self.supervisor: Optional[Supervisor] = None
        self.progress = ProgressWatch(spec.supervision.stall_after_s, spec.supervision.health_interval_s)
        self.step_of: Dict[str, str] = {}
        self.launches: Dict[str, int] = {}  # starts of each component so far: a step lookup's answer is its own
        self.killing: set = set()
        self.repairing = False
        self.repair_epoch = 0  # repairs begun: a registration lookup from before one is not believed
        self.registration_busy = False
        self.registration_at = float("-inf")
        self.step_lookup_at = float("-inf")
        self.step_lookup_every = STEP_LOOKUP_EVERY_S
        self.step_lookup_busy = False
        self.last_exit: Dict[str, Optional[int]] = {}
        self.start_states: Dict[str, C] = {}  # start-up: each component's state for its state file

    # -- small helpers ----------------------------------------------------------------------------------------
    def record(self, kind: E, component: Optional[str] = None, reason: str = "", state: Optional[str] = None,
               exit_code_: Optional[int] = None, restarts: Optional[int] = None) -> None:
        self.events.write(Event(kind, component, state, reason or None, exit_code_, restarts))

    def url(self, c: Component, path: str) -> str:
        assert self.nodes is not None
        return f"{'https' if c.tls else 'http'}://{self.nodes.addrs[c.first_node]}:{c.port}{path}"

    def log(self, name: str) -> str:
        return f"logs/{name}.log"

    def _check_signal(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum)

    def _wait(self, seconds: float) -> None:
        self.stop.wait(max(0.0, seconds))
        self._check_signal()

    def _on_signal(self, signum: int, _frame: Optional[FrameType]) -> None:
        if self.signum is None:
            self.signum = signum
        self.stop.set()

    def install_signals(self) -> None:
        """Every signal of ENDING_SIGNALS ends the job with teardown and an event; KEPT_SIGNALS keep what they do."""
        self.handles_signals = True
        for sig in ENDING_SIGNALS:
            signal.signal(sig, self._on_signal)

    def signal_reason(self, signum: int) -> str:
        name = signal_name(signum)
        said = f"signal received ({name})"
        if self.spec.time_limit_signal and self.spec.time_limit_signal == name:
            said += (f": Slurm's --signal=B:{name[3:]}@T of cluster.sbatch_args, sent T seconds before the job's "
                     "time limit; the deployment is ended cleanly before it")
        return said

    def _background_failed(self, failed: BackgroundFailed) -> None:
        """Background work failed: the event (any thread may write one: one append per line)."""
        self.events.write(Event(E.BACKGROUND_FAILED, failed.component, None, failed.describe()))

    def write_state(self, name: str) -> None:
        c = self.spec.component(name)
        proc = self.procs.get(name)
        t = self.supervisor.components.get(name) if self.supervisor else None
        if t is not None:
            since = self.wall() - (self.clock() - t.since)
            self.states.write(name, c.role, t.state.value, since, t.restarts, t.failures, t.last_exit,
                              proc.pid if proc else None, self.step_of.get(name), t.reason)
        else:
            state = self.start_states.get(name, C.STARTING)
            self.states.write(name, c.role, state.value, self.wall(), 0, 0, self.last_exit.get(name),
                              proc.pid if proc else None, self.step_of.get(name), None)

    # -- the whole life -----------------------------------------------------------------------------------------
    def run(self) -> int:
        rc = 1
        try:
            self.start_up()
            self.serve()
        except (startup.StartupFailed, JobFailed) as exc:
            self.record(E.FAILED, exc.component, exc.reason, state=RunState.FAILED.value)
        except Interrupted as exc:
            self.record(E.FAILED, None, self.signal_reason(exc.signum), state=RunState.FAILED.value)
            rc = 128 + exc.signum
        except Exception as exc:  # noqa: BLE001  (a bug here must still end in teardown, and say so)
            self.record(E.FAILED, None, f"the job's orchestrator failed: {type(exc).__name__}: {exc}",
                        state=RunState.FAILED.value)
        finally:
            self.teardown(rc)
        return rc

    def teardown(self, rc: int) -> None:
        if self.handles_signals:  # a second signal must not cut the teardown short
            for sig in ENDING_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
        self.record(E.STOPPING, None, f"exit code {rc}")
        terminate_all([*self.procs.values(), *self.others])
        self.steps.cancel_job()
        self.prober.close()

    # -- start-up -------------------------------------------------------------------------------------------------
    def start_up(self) -> None:
        spec = self.spec
        self.record(E.RESOLVING, None, f"job {self.job_id}")
        if spec.membership is not None and spec.membership.tls_dir:
            try:  # the etcd opens to the run's client certificate only: the job's own calls present it
                tls.use_client_certificate(spec.membership.tls_dir.replace("<run_dir>", self.run_dir))
            except (tls.CertificateMissing, OSError, ValueError) as exc:
                raise startup.StartupFailed(str(exc)) from None
        self.nodes = startup.discover(spec, self.nodelist, self.run_dir)
        self._check_signal()
        startup.write_resolved(spec, self.nodes, self.run_dir)
        startup.provenance(spec, self.run_dir, self.others.append, self.work)
        self.record(E.CHECKING, None, f"options and proxy config on {self.nodes.names[0]}")
        verdict, message = startup.config_check(spec, self.nodes, self.run_dir, stop=self.stop.is_set)
        self._check_signal()
        if verdict == "failed":
            raise startup.StartupFailed(f"config check: {message} (log: logs/config-check.log)")
        self.record(E.CHECKED if verdict == "ok" else E.CHECK_SKIPPED, None, message)
        front = spec.front
        workers = [c for c in spec.components if c.kind == ComponentKind.WORKER]
        if spec.proxy_first:
            for c in spec.components:
                if c.kind == ComponentKind.ETCD:
                    self.launch(c)
                    self.wait_healthy([c], path=c.health)
            if front is not None:
                self.launch(front)
                self.wait_answering(front)
        for c in workers:
            if c.start_after:
                self.wait_launcher(c.start_after, c.first_node)
            self.launch(c)
        self.wait_healthy(workers)
        if spec.membership is not None and front is not None:
            self.wait_registered()
            self.wait_healthy([front], path=front.health)
        elif front is not None:
            self.launch(front)
            self.wait_healthy([front])
        if front is not None:
            endpoint = self.url(front, "")
        else:
            endpoints = [self.url(c, "") for c in workers]
            write_atomically(os.path.join(self.state_dir, "endpoints"), "".join(f"{u}\n" for u in endpoints))
            endpoint = endpoints[0]
        write_atomically(os.path.join(self.run_dir, "endpoint"), endpoint + "\n")
        self.note_steps()
        self.record(E.READY, None, endpoint, state=RunState.READY.value)

    def note_steps(self) -> None:
        """Before `ready`: which Slurm step runs each server (one bounded squeue), so that the first `tk status`
        after `tk launch` already names them; supervision keeps looking up steps that appear later."""
        if not self.job_id:
            return
        found = {n: s for n, s in self.steps.step_ids().items() if n in self.procs}
        self.step_of.update(found)
        for name in found:
            self.write_state(name)

    def command(self, c: Component) -> List[str]:
        assert self.nodes is not None
        env = " ".join(f"{k}={v}" for k, v in c.instance_env)
        env_file = os.path.join(self.run_dir, c.env_file) if c.env_file else ""
        return self.steps.argv(c.name, [self.nodes.names[i] for i in c.nodes], c.ntasks, c.ntasks_per_node, c.gpus,
                               env_file, env, self.nodes.argv(c.argv, self.run_dir))

    def launch(self, c: Component, restart: bool = False) -> bool:
        """Start its step; False when srun itself could not be run."""
        assert self.nodes is not None
        try:
            self.procs[c.name] = self.steps.start(c.name, self.command(c))
        except OSError as exc:
            if not restart:
                raise startup.StartupFailed(f"{c.name} could not be started: srun: {exc.strerror or exc}",
                                            c.name) from None
            return False
        self.step_of.pop(c.name, None)
        self.launches[c.name] = self.launches.get(c.name, 0) + 1
        self.progress.reset(c.name)
        env = " ".join(f"{k}={v}" for k, v in c.instance_env)
        where = ",".join(self.nodes.names[i] for i in c.nodes)
        self.record(E.STARTED, c.name, f"{c.name} on {where}" + (f" ({env})" if env else ""),
                    state=C.STARTING.value)
        if not restart:
            self.start_states[c.name] = C.STARTING
            self.write_state(c.name)
        return True

    def check_alive(self) -> None:
        """Before the deployment serves, a started component that exits ends the job."""
        for name, proc in self.procs.items():
            rc = proc.poll()
            if rc is not None:
                code = exit_code(rc)
                self.last_exit[name] = code
                self.start_states[name] = C.EXITED
                self.write_state(name)
                raise startup.StartupFailed(f"{name} {exit_text(rc)} before the deployment served (log: "
                                            f"{self.log(name)})", name)

    def wait_healthy(self, components: List[Component], path: Optional[str] = None) -> None:
        """Every one answers 200 (on path, else its health URL), each bounded by startup_timeout_s."""
        timeout = self.spec.supervision.startup_timeout_s
        deadline = self.clock() + timeout
        waiting = list(components)
        while waiting:
            answers = self.prober.round({c.name: self.url(c, path or c.health) for c in waiting})
            for c in list(waiting):
                if answers.get(c.name) == 200:
                    waiting.remove(c)
                    self.start_states[c.name] = C.HEALTHY
                    self.write_state(c.name)
                    self.record(E.HEALTHY, c.name, f"{c.name} {self.url(c, '')}", state=C.HEALTHY.value)
            if not waiting:
                return
            self.check_alive()
            if self.clock() >= deadline:
                c = waiting[0]
                raise startup.StartupFailed(f"{c.name} not healthy at {self.url(c, '')} after {timeout:g}s "
                                            f"(log: {self.log(c.name)})", c.name)
            self._wait(POLL_S)

    def wait_answering(self, c: Component) -> None:
        """The proxy with membership answers at all: its /health is 500 until the workers register."""
        timeout = self.spec.supervision.startup_timeout_s
        deadline = self.clock() + timeout
        while self.prober.round({c.name: self.url(c, c.live)}).get(c.name) != 200:
            self.check_alive()
            if self.clock() >= deadline:
                raise startup.StartupFailed(f"{c.name} does not answer at {self.url(c, '')} after {timeout:g}s "
                                            f"(log: {self.log(c.name)})", c.name)
            self._wait(POLL_S)

    def wait_registered(self) -> None:
        m = self.spec.membership
        assert m is not None and self.nodes is not None
        uri = self.nodes.resolve(m.cluster_uri)
        addrs = [self.nodes.resolve(a) for a in m.workers.values()]
        timeout = self.spec.supervision.startup_timeout_s
        deadline = self.clock() + timeout
        while True:
            try:
                left = membership.missing(uri, m.worker_key_prefix, addrs)
            except membership.StorageError as exc:
                left, said = None, str(exc)
            if left == []:
                break
            self.check_alive()
            if self.clock() >= deadline:
                what = " ".join(left) if left else f"the storage did not answer ({said})"
                raise startup.StartupFailed(f"not registered in the cluster storage ({uri}) after {timeout:g}s: "
                                            f"{what}")
            self._wait(POLL_S)
        self.record(E.REGISTERED, None, f"every worker in the cluster storage {uri}")

    def wait_launcher(self, name: str, node_index: int) -> None:
        """A co-located instance starts once the previous one's launcher has logged its IPC address and that port
        answers on the node, or after the launcher stagger, whichever comes first (toolkit/facts/trtllm.py, W2)."""
        assert self.nodes is not None
        stagger = self.spec.launcher.stagger_s
        node = self.nodes.names[node_index]
        self.record(E.WAITING, name, f"{name}'s launcher to bind its IPC port on {node} (at most {stagger:g}s)")
        deadline = self.clock() + stagger
        port = None
        while self.clock() < deadline:
            self.check_alive()
            port = startup.launcher_port(os.path.join(self.run_dir, self.log(name)), self.spec.launcher.ipc_addr_env)
            if port:
                break
            self._wait(POLL_S)
        if port and self.clock() < deadline:
            startup.wait_port_on(node, port, deadline - self.clock() + 1)

    # -- serving --------------------------------------------------------------------------------------------------
    def serve(self) -> None:
        self.begin_supervision()
        interval = self.spec.supervision.health_interval_s
        while True:
            self._check_signal()
            self.round()
            self._wait(interval)

    def begin_supervision(self) -> None:
        spec = self.spec
        etcd = next((c.name for c in spec.components if c.kind == ComponentKind.ETCD), None)
        self.supervisor = sv = Supervisor(spec.supervision, {c.name: c.role for c in spec.components},
                                          log_of=self.log, storage_component=etcd if spec.membership else None,
                                          unregistered_after_s=spec.membership.rejoin_s if spec.membership else None)
        sv.begin(self.clock())
        for name in sv.take_dirty():
            self.write_state(name)

    def round(self) -> None:
        """One look at everything: exits, background results, liveness (concurrently), progress, the clock."""
        sv = self.supervisor
        assert sv is not None
        actions = []
        now = self.clock()
        for name, proc in list(self.procs.items()):
            t = sv.components[name]
            if name in self.killing or t.state in (C.BACKOFF, C.LOST, C.EXITED):
                continue
            rc = proc.poll()
            if rc is not None:
                created = self.step_created(name)
                why = None if created else (self.steps.srun_said(name) or "srun said nothing")
                actions += sv.exited(name, rc, now, step_created=created, why=why)
        actions += self.drain_inbox(now)
        probe = [c for c in self.spec.components if sv.components[c.name].state in PROBED_STATES
                 and c.name not in self.killing]
        answers = self.prober.round({c.name: self.url(c, c.live) for c in probe})
        now = self.clock()
        for c in probe:
            if sv.components[c.name].state in PROBED_STATES:
                actions += sv.probed(c.name, answers.get(c.name) == 200, now, url=c.live)
        self.start_progress_probes(now)
        for name, seconds in self.progress.stalls(now):
            actions += sv.stalled(name, seconds, now, failing=self.progress.failing(name))
        actions += sv.tick(now)
        self.execute(actions)
        self.execute(sv.overall(self.clock()))
        self.maybe_lookup_steps()
        self.maybe_check_registrations()
        for name in sv.take_dirty():
            self.write_state(name)

    def step_created(self, name: str) -> Optional[bool]:
        """Whether its current start's step was created: squeue listed it (step_of holds only steps found after
        the start) or its marker is there (True), srun said it could not (False), or nothing says (None)."""
        return self.steps.step_created(name, listed=name in self.step_of)

    def start_progress_probes(self, now: float) -> None:
        sv = self.supervisor
        assert sv is not None
        eligible = [c.name for c in self.spec.components if c.progress and c.kind == ComponentKind.WORKER
                    and sv.components[c.name].state in LIVE_STATES and c.name not in self.killing]
        bound = self.spec.supervision.stall_after_s + 2 * self.spec.supervision.health_interval_s + 5
        for name, generation in self.progress.due(eligible, now):
            c = self.spec.component(name)
            assert c.progress is not None
            self.prober.start_progress(self.url(c, c.progress), bound, self._progress_answer(name, generation),
                                       component=name)

    def _progress_answer(self, name: str, generation: int) -> Callable[[Optional[int]], None]:
        def done(status: Optional[int]) -> None:
            self.inbox.put(ProgressAnswered(name, generation, status))
        return done

    def drain_inbox(self, now: float) -> list:
        sv = self.supervisor
        assert sv is not None
        actions: list = []
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return actions
            if isinstance(item, Killed):
                self.killing.discard(item.name)
                actions += sv.killed(item.name, item.died, item.rc, now, step_created=self.step_created(item.name))
            elif isinstance(item, ProgressAnswered):
                refused = self.progress.answered(item.name, item.generation, item.status, now)
                if refused:
                    self.record(E.PROBE_REFUSED, item.name, f"{item.name}: {refused}")
            elif isinstance(item, Said):
                self.events.write(item.event)
            elif isinstance(item, Repaired):
                self.repairing = False
                self.events.write(item.event)
            elif isinstance(item, StepsFound):
                self.step_lookup_busy = False
                self.step_lookup_every = (STEP_LOOKUP_EVERY_S if item.found
                                          else min(STEP_LOOKUP_MAX_S, self.step_lookup_every * 2))
                # a component (re)started after the lookup began: what squeue listed may be its previous step
                found = {n: s for n, s in item.found.items()
                         if n in sv.components and self.launches.get(n) == item.launches.get(n)}
                changed = {n for n, s in found.items() if self.step_of.get(n) != s}
                self.step_of.update(found)
                sv.dirty.update(changed)
            elif isinstance(item, Registrations):
                self.registration_busy = False
                if item.missing is None or self.repairing or item.epoch != self.repair_epoch:
                    continue  # the storage did not answer, or a repair deletes and restores keys meanwhile
                for name in item.asked:  # a worker (re)started since the lookup began is judged on the next one
                    if self.launches.get(name) == item.launches.get(name) and name not in self.killing:
                        actions += sv.registration(name, name not in item.missing, now)
            else:  # not reached: every message is one of the above (mypy checks the union)
                raise TypeError(f"not an inbox message: {item!r}")

    def execute(self, actions: list) -> None:
        sv = self.supervisor
        assert sv is not None
        for a in actions:
            if isinstance(a, Record):
                self.events.write(a.event)
            elif isinstance(a, Start):
                if not self.launch(self.spec.component(a.name), restart=True):
                    self.execute(sv.exited(a.name, 127, self.clock(), why="srun could not be started"))
            elif isinstance(a, Kill):
                self.kill_in_background(a.name)
            elif isinstance(a, Deregister):
                self.deregister_in_background(a.name)
            elif isinstance(a, RepairMembership):
                self.repair_in_background()
            elif isinstance(a, Fail):
                for name in sv.take_dirty():
                    self.write_state(name)
                raise JobFailed(a.reason, a.component)

    def kill_in_background(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is None:
            self.inbox.put(Killed(name, True, -9))
            return
        self.killing.add(name)
        step = self.step_of.get(name)

        def run() -> None:
            died, rc = self.steps.kill(name, proc, step)
            self.inbox.put(Killed(name, died, rc))

        def failed(_exc: BaseException) -> None:  # whether the kill happened is what the process says now
            rc = proc.poll()
            self.inbox.put(Killed(name, rc is not None, rc))
        self.work.start("kill", run, name, on_failure=failed)

    def deregister_in_background(self, name: str) -> None:
        m = self.spec.membership
        if m is None or name not in m.workers or self.nodes is None:
            return
        uri, addr = self.nodes.resolve(m.cluster_uri), self.nodes.resolve(m.workers[name])

        def run() -> None:
            try:
                gone = membership.deregister(uri, m.worker_key_prefix, addr)
            except membership.StorageError as exc:
                self.inbox.put(Said(Event(E.DEREGISTERED, name, None, f"{name} ({addr}): its keys could not be "
                                          f"deleted ({exc}); the storage's TTL removes them")))
                return
            if gone:
                self.inbox.put(Said(Event(E.DEREGISTERED, name, None, f"{name} ({addr}): {gone} key(s) deleted "
                                          "from the cluster storage")))
        self.work.start("deregister", run, name)  # a failure: its event; the storage's TTL removes the keys

    def repair_in_background(self) -> None:
        m = self.spec.membership
        sv = self.supervisor
        if m is None or self.nodes is None or sv is None or self.repairing:
            return
        self.repairing = True
        self.repair_epoch += 1
        uri = self.nodes.resolve(m.cluster_uri)
        by_role: Dict[str, List[str]] = {}
        for name, addr in m.workers.items():
            if sv.components[name].state == C.HEALTHY:  # one without a key has none to replace
                by_role.setdefault(sv.components[name].role, []).append(self.nodes.resolve(addr))
        failed_reason = "the cluster storage came back, but its registrations could not be repaired"

        def run() -> None:
            try:
                done = membership.repair(uri, m.worker_key_prefix, list(by_role.values()), stop=self.stop.is_set)
            except membership.StorageError as exc:
                self.inbox.put(Repaired(Event(E.MEMBERSHIP_REPAIRED, None, None, f"{failed_reason} ({exc})")))
                return
            reason = (f"the cluster storage came back: {len(done['replaced'])} worker registration(s) replaced one "
                      "per role at a time")
            if done["not_back"]:
                reason += f"; not registered again yet: {', '.join(done['not_back'])}"
            self.inbox.put(Repaired(Event(E.MEMBERSHIP_REPAIRED, None, None, reason)))

        def failed(exc: BaseException) -> None:  # `repairing` must be cleared, or membership is never repaired again
            self.inbox.put(Repaired(Event(E.MEMBERSHIP_REPAIRED, None, None,
                                          f"{failed_reason} ({type(exc).__name__}: {exc})")))
        self.work.start("membership-repair", run, on_failure=failed)

    def maybe_check_registrations(self) -> None:
        """With membership, once per health interval: is every serving worker still registered in the cluster
        storage? A worker that lost its key (its etcd gateway ended, its lease lapsed and nothing registered it
        again) keeps answering /health but is out of the proxy's routing; the policy says `unregistered` and
        restarts it (Supervisor.registration). Not while the storage itself is down or a repair runs."""
        sv, m = self.supervisor, self.spec.membership
        if m is None or self.nodes is None or sv is None or self.registration_busy or self.repairing:
            return
        if self.clock() - self.registration_at < self.spec.supervision.health_interval_s:
            return
        storage = [c.name for c in self.spec.components if c.kind in (ComponentKind.ETCD, ComponentKind.PROXY)]
        if any(sv.components[n].state != C.HEALTHY for n in storage):
            return
        asked = [n for n in m.workers if sv.components[n].state in REGISTERED_STATES and n not in self.killing]
        if not asked:
            return
        self.registration_busy, self.registration_at = True, self.clock()
        uri = self.nodes.resolve(m.cluster_uri)
        addrs = {self.nodes.resolve(m.workers[n]): n for n in asked}
        launches, epoch = dict(self.launches), self.repair_epoch

        def run() -> None:
            try:
                left: Optional[List[str]] = [addrs[a] for a in membership.missing(uri, m.worker_key_prefix,
                                                                                  list(addrs))]
            except membership.StorageError:
                left = None  # the storage's own liveness is watched as a component; asked again next round
            self.inbox.put(Registrations(asked, left, launches, epoch))
        self.work.start("registration-lookup", run,
                        on_failure=lambda _exc: self.inbox.put(Registrations(asked, None, launches, epoch)))

    def maybe_lookup_steps(self) -> None:
        """Which Slurm step runs each component (tk status shows it; a kill uses it): one squeue, in the
        background, while some component has none and at most every STEP_LOOKUP_EVERY_S."""
        sv = self.supervisor
        if not self.job_id or self.step_lookup_busy or sv is None:
            return
        if all(n in self.step_of for n in self.procs) or self.clock() - self.step_lookup_at < self.step_lookup_every:
            return
        self.step_lookup_busy, self.step_lookup_at = True, self.clock()
        launches = dict(self.launches)
        self.work.start("step-lookup", lambda: self.inbox.put(StepsFound(self.steps.step_ids(), launches)),
                        on_failure=lambda _exc: self.inbox.put(StepsFound({}, launches)))


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python3 job.pyz RUN_DIR/job.json", file=sys.stderr)
        return 2
    from orchestrator.spec import SpecError
    path = os.path.abspath(argv[0])
    try:
        spec = JobSpec.load(path)
    except (OSError, SpecError) as exc:
        print(f"tk job: {path}: {exc}", file=sys.stderr)
        return 2
    run_dir = os.environ.get("TK_RUN_DIR") or os.path.dirname(path)
    faulthandler.enable(all_threads=True)  # the interpreter faulting (UNCATCHABLE_SIGNALS): every thread's stack
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # `kill -USR2 JOBPID`: every thread's stack, in its output
    job = Job(spec, run_dir)
    job.install_signals()
    return job.run()
