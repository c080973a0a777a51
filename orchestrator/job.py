"""The job: start-up in order, then supervision until the job is cancelled, then teardown.

    Job(spec, run_dir, env).run() -> exit code

Start-up (any failure ends the job; nothing is restarted before the deployment first serves):
  nodes and their addresses, ports already taken (fail), provenance (background), TensorRT-LLM's config check,
  then with membership etcd and the proxy (each answering) before the workers, the workers in plan order (an
  instance sharing a node with a launcher that picks its own IPC port waits for it), every worker healthy (all
  waited on together, each bounded by startup_timeout_s), every worker registered, the proxy healthy; without
  membership the proxy last. Then `ready`.
Serving: every health_interval_s one concurrent round of liveness probes (bounded by one probe timeout), progress
  probes in the background, the policy (orchestrator.policy) decides; kills, deregistration and membership repair
  run on threads and report back, so one slow kill never stalls the loop.
Teardown on every path (failure, SIGTERM/SIGINT/SIGHUP): `stopping`, SIGTERM to every step (30 s), SIGKILL, then
  scancel of the job.
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
from types import FrameType
from typing import Callable, Dict, List, Optional, TextIO

from orchestrator import membership, startup, tls
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


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


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
        self.prober = prober or Prober(spec.supervision.probe_timeout_s)
        self.stop = threading.Event()
        self.signum: Optional[int] = None
        self.handles_signals = False
        self.procs: Dict[str, subprocess.Popen] = {}  # the current process (srun) of each started component
        self.others: List[subprocess.Popen] = []  # provenance and other helper steps, ended at teardown
        self.inbox: "queue.Queue[tuple]" = queue.Queue()  # results of background work, handled by the loop
        self.nodes: Optional[startup.Nodes] = None
        self.supervisor: Optional[Supervisor] = None
        self.progress = ProgressWatch(spec.supervision.stall_after_s, spec.supervision.health_interval_s)
        self.step_of: Dict[str, str] = {}
        self.launches: Dict[str, int] = {}  # starts of each component so far: a step lookup's answer is its own
        self.killing: set = set()
        self.repairing = False
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
        self.handles_signals = True
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

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
        except startup.StartupFailed as exc:
            self.record(E.FAILED, exc.component, exc.reason, state=RunState.FAILED.value)
        except Interrupted as exc:
            self.record(E.FAILED, None, f"signal received ({exc})", state=RunState.FAILED.value)
            rc = 128 + exc.signum
        except Exception as exc:  # noqa: BLE001  (a bug here must still end in teardown, and say so)
            self.record(E.FAILED, None, f"the job's orchestrator failed: {type(exc).__name__}: {exc}",
                        state=RunState.FAILED.value)
        finally:
            self.teardown(rc)
        return rc

    def teardown(self, rc: int) -> None:
        if self.handles_signals:  # a second signal must not cut the teardown short
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
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
        startup.provenance(spec, self.run_dir, self.others.append)
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
                                          log_of=self.log, storage_component=etcd if spec.membership else None)
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
        probe = [c for c in self.spec.components if sv.components[c.name].state in (C.HEALTHY, C.UNHEALTHY,
                                                                                      C.STARTING)
                 and c.name not in self.killing]
        answers = self.prober.round({c.name: self.url(c, c.live) for c in probe})
        now = self.clock()
        for c in probe:
            if sv.components[c.name].state in (C.HEALTHY, C.UNHEALTHY, C.STARTING):
                actions += sv.probed(c.name, answers.get(c.name) == 200, now, url=c.live)
        self.start_progress_probes(now)
        for name, seconds in self.progress.stalls(now):
            actions += sv.stalled(name, seconds, now, failing=self.progress.failing(name))
        actions += sv.tick(now)
        self.execute(actions)
        self.execute(sv.overall(self.clock()))
        self.maybe_lookup_steps()
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
                    and sv.components[c.name].state in (C.HEALTHY, C.UNHEALTHY) and c.name not in self.killing]
        bound = self.spec.supervision.stall_after_s + 2 * self.spec.supervision.health_interval_s + 5
        for name, generation in self.progress.due(eligible, now):
            c = self.spec.component(name)
            assert c.progress is not None
            self.prober.start_progress(self.url(c, c.progress), bound, self._progress_answer(name, generation))

    def _progress_answer(self, name: str, generation: int) -> Callable[[Optional[int]], None]:
        def done(status: Optional[int]) -> None:
            self.inbox.put(("progress", name, generation, status))
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
            kind = item[0]
            if kind == "killed":
                _, name, died, rc = item
                self.killing.discard(name)
                actions += sv.killed(name, died, rc, now, step_created=self.step_created(name))
            elif kind == "progress":
                _, name, generation, status = item
                refused = self.progress.answered(name, generation, status, now)
                if refused:
                    self.record(E.PROBE_REFUSED, name, f"{name}: {refused}")
            elif kind == "event":
                self.events.write(item[1])
            elif kind == "repaired":
                self.repairing = False
                self.events.write(item[1])
            elif kind == "steps":
                _, found, launches = item
                self.step_lookup_busy = False
                self.step_lookup_every = (STEP_LOOKUP_EVERY_S if found
                                          else min(STEP_LOOKUP_MAX_S, self.step_lookup_every * 2))
                # a component (re)started after the lookup began: what squeue listed may be its previous step
                found = {n: s for n, s in found.items()
                         if n in sv.components and self.launches.get(n) == launches.get(n)}
                changed = {n for n, s in found.items() if self.step_of.get(n) != s}
                self.step_of.update(found)
                sv.dirty.update(changed)

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
                raise startup.StartupFailed(a.reason, a.component)

    def kill_in_background(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is None:
            self.inbox.put(("killed", name, True, -9))
            return
        self.killing.add(name)
        step = self.step_of.get(name)

        def run() -> None:
            try:
                died, rc = self.steps.kill(name, proc, step)
            except Exception:  # noqa: BLE001
                died, rc = proc.poll() is not None, proc.poll()
            self.inbox.put(("killed", name, died, rc))
        threading.Thread(target=run, name=f"tk-kill-{name}", daemon=True).start()

    def deregister_in_background(self, name: str) -> None:
        m = self.spec.membership
        if m is None or name not in m.workers or self.nodes is None:
            return
        uri, addr = self.nodes.resolve(m.cluster_uri), self.nodes.resolve(m.workers[name])

        def run() -> None:
            try:
                gone = membership.deregister(uri, m.worker_key_prefix, addr)
            except membership.StorageError as exc:
                self.inbox.put(("event", Event(E.DEREGISTERED, name, None, f"{name} ({addr}): its keys could not "
                                               f"be deleted ({exc}); the storage's TTL removes them")))
                return
            if gone:
                self.inbox.put(("event", Event(E.DEREGISTERED, name, None, f"{name} ({addr}): {gone} key(s) "
                                               "deleted from the cluster storage")))
        threading.Thread(target=run, name=f"tk-deregister-{name}", daemon=True).start()

    def repair_in_background(self) -> None:
        m = self.spec.membership
        sv = self.supervisor
        if m is None or self.nodes is None or sv is None or self.repairing:
            return
        self.repairing = True
        uri = self.nodes.resolve(m.cluster_uri)
        by_role: Dict[str, List[str]] = {}
        for name, addr in m.workers.items():
            if sv.components[name].state == C.HEALTHY:
                by_role.setdefault(sv.components[name].role, []).append(self.nodes.resolve(addr))

        def run() -> None:
            reason = "the cluster storage came back, but its registrations could not be repaired"
            try:
                done = membership.repair(uri, m.worker_key_prefix, list(by_role.values()), stop=self.stop.is_set)
                reason = (f"the cluster storage came back: {len(done['replaced'])} worker registration(s) replaced "
                          "one per role at a time")
                if done["not_back"]:
                    reason += f"; not registered again yet: {', '.join(done['not_back'])}"
            except membership.StorageError as exc:
                reason += f" ({exc})"
            except Exception as exc:  # noqa: BLE001  (said, and the next time the storage returns it runs again)
                reason += f" ({type(exc).__name__}: {exc})"
            finally:  # whatever happened: `repairing` must be cleared, or membership is never repaired again
                self.inbox.put(("repaired", Event(E.MEMBERSHIP_REPAIRED, None, None, reason)))
        threading.Thread(target=run, name="tk-membership-repair", daemon=True).start()

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

        def run() -> None:
            try:
                found = self.steps.step_ids()
            except Exception:  # noqa: BLE001
                found = {}
            self.inbox.put(("steps", found, launches))
        threading.Thread(target=run, name="tk-steps", daemon=True).start()


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
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # `kill -USR2 JOBPID`: every thread's stack, in its output
    job = Job(spec, run_dir)
    job.install_signals()
    return job.run()
