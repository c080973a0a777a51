"""The supervision policy: a pure state machine over the components, driven by observations and a clock.

Nothing here sleeps, spawns or probes. The serving loop (orchestrator.job) feeds it what it saw, with the time
(``now``, seconds on a monotonic clock), and carries out the actions it returns:

    exited(name, rc, now, step_created)   the component's step ended (or srun never created one: False; None
                                          when nothing says whether it did)
    probed(name, ok, now)                 one liveness probe (HTTP 200 or not)
    stalled(name, seconds, now, failing)  its progress probe has shown no progress for stall_after_s
    killed(name, died, rc, now)           a Kill finished: it died (rc), or it survived SIGKILL
    registration(name, registered, now)   with membership: whether a serving worker has a key in the storage
    tick(now)                             time passed: restarts whose backoff is over
    overall(now)                          after a round: degraded <-> serving

Actions: Start(name), Kill(name, reason), Deregister(name), RepairMembership(), Fail(reason, component), and
Record(event) for every state change (orchestrator.events writes them). The policy (docs/recipe.md
`supervision:`): an exit is restarted after an exponential backoff (backoff_initial_s doubled per consecutive
failure, capped at backoff_max_s), up to max_restarts in a row, after which the component is lost; a role with
fewer live (not lost) components than its minimum ends the run. Healthy for stable_after_s resets the
consecutive count. Liveness failing for unhealthy_after_s, or no progress for stall_after_s, is killed (and
restarted). A worker that answers /health but has no key in the cluster storage (membership) is out of the
proxy's routing: `unregistered`, and killed (and restarted) when it has not registered again within
unregistered_after_s (a restarted worker is judged once it has registered, or startup_timeout_s after its start).
fail-fast: the first exit, or liveness or registration lost, ends the run. An srun that never created its step (the
Slurm controller unreachable, resources not yet released) is retried with backoff and not counted, up to
NOT_CREATED_MAX times in a row where srun said so; where nothing said either way (no marker, squeue never listed
the step, srun silent: a marker on a shared filesystem can be missed), only UNCONFIRMED_MAX times in a row, so a
crash loop still reaches max_restarts. After that every such exit counts until the component is healthy again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Set, Union

from orchestrator.spec import Supervision
from orchestrator.states import ComponentState as C
from orchestrator.states import EventKind as E
from orchestrator.states import RestartPolicy, Role, RunState


NOT_CREATED_MAX = 30  # restarts in a row srun said it could not create (about 30 min at backoff_max_s 60), uncounted
UNCONFIRMED_MAX = 3  # restarts in a row with no sign either way whether a step was created, uncounted


@dataclass(frozen=True)
class Event:
    """One line of state/events.jsonl (the time is added when it is written)."""

    kind: E
    component: Optional[str] = None
    state: Optional[str] = None  # the component's state after it, or the run's for run events
    reason: Optional[str] = None  # what happened, in words, for people
    exit_code: Optional[int] = None
    restarts: Optional[int] = None


@dataclass(frozen=True)
class Start:
    name: str


@dataclass(frozen=True)
class Kill:
    name: str
    reason: str


@dataclass(frozen=True)
class Deregister:
    name: str


@dataclass(frozen=True)
class RepairMembership:
    """The storage came back (etcd restarted or answering again): replace stale registrations, one per role at a
    time, so the proxy never loses every worker of a role at once."""


@dataclass(frozen=True)
class Fail:
    reason: str
    component: Optional[str] = None


@dataclass(frozen=True)
class Record:
    event: Event


Action = Union[Start, Kill, Deregister, RepairMembership, Fail, Record]


def exit_text(rc: int) -> str:
    """'exited with code 137 (signal 9)'."""
    if rc > 128:
        return f"exited with code {rc} (signal {rc - 128})"
    if rc < 0:  # a Popen return code: killed by signal -rc
        return f"exited with code {128 - rc} (signal {-rc})"
    return f"exited with code {rc}"


def exit_code(rc: int) -> int:
    """As a shell reports it: 128 + N for a process killed by signal N (Popen says -N)."""
    return 128 - rc if rc < 0 else rc


def backoff_s(initial: float, maximum: float, failures: int) -> float:
    """initial * 2^failures, capped at maximum."""
    wait = float(initial)
    for _ in range(failures):
        if wait >= maximum:
            break
        wait *= 2
    return min(wait, float(maximum))


@dataclass
class Tracked:
    """One component as the policy sees it."""

    name: str
    role: Role
    state: C = C.STARTING
    since: float = 0.0
    restarts: int = 0  # restarts by supervision in this run
    failures: int = 0  # consecutive counted failures (resets after stable_after_s healthy)
    uncounted: int = 0  # consecutive starts whose step was never created (or not known to be)
    unconfirmed: int = 0  # of those, the ones nothing said whether their step was created
    last_exit: Optional[int] = None
    reason: Optional[str] = None
    bad_since: float = 0.0
    next_start: float = 0.0
    deadline: float = 0.0
    healthy_since: float = 0.0
    kill_reason: Optional[str] = None
    retrying: bool = False  # the next start repeats a restart whose step was never created
    started_at: float = 0.0  # its current life began (begin, or its last Start)
    registered: bool = False  # seen registered in the cluster storage in its current life
    unregistered_since: Optional[float] = None  # first seen without a key (since it was last seen with one)


class Supervisor:
    """The policy over every component, all of them healthy when supervision begins (``begin``)."""

    def __init__(self, policy: Supervision, roles: Dict[str, Role], *,
                 log_of: Callable[[str], str] = lambda name: f"logs/{name}.log",
                 storage_component: Optional[str] = None, unregistered_after_s: Optional[float] = None):
        self.p = policy
        # a worker without a key for this long is restarted: at least unhealthy_after_s, and at least as long as
        # TensorRT-LLM's own worker takes to register again (its heartbeat interval plus its 5 s retry)
        self.unregistered_after_s = max(policy.unhealthy_after_s, unregistered_after_s or 0.0)
        self.components: Dict[str, Tracked] = {name: Tracked(name, role) for name, role in roles.items()}
        self.run_state = RunState.STARTING
        self.log_of = log_of
        self.storage_component = storage_component  # the job's etcd: its return triggers RepairMembership
        self.dirty: Set[str] = set()  # components whose state file must be written

    # -- helpers ------------------------------------------------------------------------------------------------
    def _set(self, t: Tracked, state: C, now: float, reason: Optional[str] = None) -> None:
        if t.state != state:
            t.since = now
        t.state, t.reason = state, reason
        self.dirty.add(t.name)

    def live(self, role: Role) -> int:
        return sum(1 for t in self.components.values() if t.role == role and t.state != C.LOST)

    def minimum(self, role: Role) -> int:
        return int(self.p.minimum.get(role, 1))

    def _record(self, kind: E, t: Optional[Tracked], reason: str, exit_code_: Optional[int] = None) -> Record:
        return Record(Event(kind, t.name if t else None, (t.state.value if t else self.run_state.value), reason,
                            exit_code_, t.restarts if t else None))

    @property
    def restart(self) -> bool:
        return self.p.policy == RestartPolicy.RESTART

    # -- entry points -------------------------------------------------------------------------------------------
    def begin(self, now: float) -> List[Action]:
        """The deployment serves: every component is healthy (the start-up waited for it)."""
        self.run_state = RunState.READY
        for t in self.components.values():
            self._set(t, C.HEALTHY, now)
            t.healthy_since = t.started_at = now
            t.registered = True  # the start-up waited for every worker's registration
        return []

    def exited(self, name: str, rc: int, now: float, step_created: Optional[bool] = True,
               why: Optional[str] = None) -> List[Action]:
        """step_created: True (its step ran), False (srun said it could not create it), None (nothing says)."""
        t = self.components[name]
        code = exit_code(rc)
        what = (f"{why}; " if why else "") + exit_text(rc)
        t.kill_reason = None
        actions: List[Action] = [Deregister(name)]
        if step_created is not True and self.restart:
            if step_created is None:
                t.unconfirmed += 1
            if t.uncounted < NOT_CREATED_MAX and t.unconfirmed <= UNCONFIRMED_MAX:
                # srun never started it: not the component's failure. Retry, without spending the budget.
                wait = backoff_s(max(self.p.backoff_initial_s, 2.0), self.p.backoff_max_s, t.uncounted)
                t.uncounted += 1
                t.next_start = now + wait
                t.retrying = True
                said = "srun did not create its step" if step_created is False else \
                    "no sign that srun created its step (no marker, not listed by squeue, srun silent about it)"
                self._set(t, C.BACKOFF, now, f"{said} ({what}); retry in {wait:g}s, not counted against "
                                             "max_restarts")
                return actions + [self._record(E.STEP_NOT_CREATED, t, f"{name}: {said} ({what}); retry "
                                               f"{t.uncounted} in {wait:g}s, not counted against max_restarts "
                                               f"(log: {self.log_of(name)})", code)]
            if step_created is None:
                what += f"; no sign its step was created {t.unconfirmed - 1} times in a row before, so it counts"
            else:
                what += f"; srun could not create its step {t.uncounted} times in a row, so it counts"
        else:
            t.uncounted = t.unconfirmed = 0
        t.last_exit = code
        t.retrying = False
        if not self.restart:
            self._set(t, C.EXITED, now, what)
            reason = f"{name} {what} (log: {self.log_of(name)}; supervision policy fail-fast)"
            return actions + [self._record(E.EXITED, t, reason, code), Fail(reason, name)]
        if t.failures >= self.p.max_restarts:
            self._set(t, C.LOST, now, f"{what}; given up after {self.p.max_restarts} restart(s) in a row")
            actions.append(self._record(E.LOST, t, f"{name} {what}; given up after {self.p.max_restarts} "
                                                   f"restart(s) in a row (log: {self.log_of(name)})", code))
            live = self.live(t.role)
            if live < self.minimum(t.role):
                actions.append(Fail(f"{name} {what}, and no more restarts are allowed: {live} live {t.role} "
                                    f"component(s), below the minimum of {self.minimum(t.role)} "
                                    f"(log: {self.log_of(name)})", name))
            return actions
        wait = backoff_s(self.p.backoff_initial_s, self.p.backoff_max_s, t.failures)
        t.failures += 1
        t.next_start = now + wait
        self._set(t, C.BACKOFF, now, f"{what}; restart {t.failures} of {self.p.max_restarts} in {wait:g}s")
        return actions + [self._record(E.EXITED, t, f"{name} {what}; restart {t.failures} of "
                                                    f"{self.p.max_restarts} in {wait:g}s "
                                                    f"(log: {self.log_of(name)})", code)]

    def probed(self, name: str, ok: bool, now: float, url: str = "/health") -> List[Action]:
        t = self.components[name]
        if ok:
            if t.state == C.STARTING:
                self._set(t, C.HEALTHY, now)
                t.healthy_since = now
                t.uncounted = t.unconfirmed = 0
                out: List[Action] = [self._record(E.RESTARTED, t, f"{name} healthy again (restart {t.restarts} "
                                                                   "of this run)")]
                if name == self.storage_component:
                    out.append(RepairMembership())
                return out
            if t.state == C.UNHEALTHY:
                self._set(t, C.HEALTHY, now)
                t.healthy_since = now
                out = [self._record(E.RECOVERED, t, f"{name} answers {url} again")]
                if name == self.storage_component:
                    out.append(RepairMembership())
                return out
            if t.state == C.HEALTHY and t.failures > 0 and now - t.healthy_since >= self.p.stable_after_s:
                t.failures = 0
                self.dirty.add(name)
                return [self._record(E.STABLE, t, f"{name} healthy for {self.p.stable_after_s:g}s: its "
                                                  "consecutive failures reset")]
            return []
        if t.state in (C.HEALTHY, C.UNREGISTERED):
            t.bad_since = now if t.unregistered_since is None else min(now, t.unregistered_since)
            self._set(t, C.UNHEALTHY, now, f"{url} does not answer 200")
            return [self._record(E.UNHEALTHY, t, f"{name} {url} does not answer 200")]
        if t.state == C.UNHEALTHY and now - t.bad_since >= self.p.unhealthy_after_s:
            why = f"{url} failed for {self.p.unhealthy_after_s:g}s"
            if not self.restart:
                self._set(t, C.UNHEALTHY, now, why)
                reason = f"{name} {why} (supervision policy fail-fast; log: {self.log_of(name)})"
                return [self._record(E.UNHEALTHY, t, reason), Fail(reason, name)]
            return self._kill(t, f"{why}, killed", now)
        if t.state == C.STARTING and now >= t.deadline:
            return self._kill(t, f"not healthy within {self.p.startup_timeout_s:g}s of its restart, killed", now)
        return []

    def stalled(self, name: str, seconds: float, now: float, failing: Optional[str] = None) -> List[Action]:
        """Its progress probe (a bounded generation request) has produced no token for `seconds`; `failing`: what
        its probes answered meanwhile when they did answer ("HTTP 500": the generation failed)."""
        t = self.components[name]
        if t.state not in (C.HEALTHY, C.UNHEALTHY, C.UNREGISTERED):
            return []
        if failing:
            why = (f"wedged: no progress for {seconds:g}s, its generation probe answers {failing} while /health "
                   "answers")
        else:
            why = f"wedged: no token for {seconds:g}s from a request in flight while /health answers"
        if not self.restart:
            self._set(t, t.state, now, why)
            reason = f"{name} {why} (supervision policy fail-fast; log: {self.log_of(name)})"
            return [self._record(E.WEDGED, t, reason), Fail(reason, name)]
        return [self._record(E.WEDGED, t, f"{name} {why}; killing it (log: {self.log_of(name)})"),
                *self._kill(t, f"{why}, killed", now)]

    def registration(self, name: str, registered: bool, now: float) -> List[Action]:
        """With membership, one look at the cluster storage: whether the worker `name` has a key there."""
        t = self.components[name]
        if registered:
            t.registered, t.unregistered_since = True, None
            if t.state == C.UNREGISTERED:
                self._set(t, C.HEALTHY, now)
                return [self._record(E.RECOVERED, t, f"{name} is registered in the cluster storage again")]
            return []
        if t.state == C.HEALTHY:
            if not t.registered and now - t.started_at < self.p.startup_timeout_s:
                return []  # restarted: it registers once it serves (TensorRT-LLM registers after its HTTP server)
            if t.unregistered_since is None:
                t.unregistered_since = now
            why = ("answers /health but has no key in the cluster storage: the proxy does not route to it" +
                   ("" if t.registered else f" (not registered within {self.p.startup_timeout_s:g}s of its start)"))
            self._set(t, C.UNREGISTERED, now, why)
            then = ("restarted" if self.restart else "the run fails (supervision policy fail-fast)")
            return [self._record(E.UNREGISTERED, t, f"{name} {why}; {then} unless it registers again within "
                                                    f"{self.unregistered_after_s:g}s (log: {self.log_of(name)})")]
        if t.state == C.UNREGISTERED and t.unregistered_since is not None and \
                now - t.unregistered_since >= self.unregistered_after_s:
            why = f"not registered in the cluster storage for {self.unregistered_after_s:g}s (out of the proxy's routing)"
            if not self.restart:
                reason = f"{name} {why} (supervision policy fail-fast; log: {self.log_of(name)})"
                return [self._record(E.UNREGISTERED, t, reason), Fail(reason, name)]
            return self._kill(t, f"{why}, killed", now)
        return []

    def _kill(self, t: Tracked, reason: str, now: float) -> List[Action]:
        t.kill_reason = reason
        self._set(t, C.KILLING, now, reason)
        return [self._record(E.KILLED, t, f"{t.name} {reason}"), Kill(t.name, reason)]

    def killed(self, name: str, died: bool, rc: Optional[int], now: float, step_created: Optional[bool] = True
               ) -> List[Action]:
        """A Kill finished. A restart whose srun was still waiting for the controller (no step created) when its
        deadline passed is not the component's failure either."""
        t = self.components[name]
        why = t.kill_reason or "killed"
        if died:
            return self.exited(name, rc if rc is not None else -9, now, step_created=step_created, why=why)
        t.kill_reason = None
        self._set(t, C.LOST, now, f"{why}, but it did not die within 15 s of SIGKILL (uninterruptible?)")
        actions: List[Action] = [Deregister(name), self._record(E.LOST, t, f"{name} does not die; given up "
                                                                          f"(log: {self.log_of(name)})")]
        if self.live(t.role) < self.minimum(t.role):
            actions.append(Fail(f"{name} is hung and does not die: {t.role} below its minimum of "
                                f"{self.minimum(t.role)}", name))
        return actions

    def tick(self, now: float) -> List[Action]:
        actions: List[Action] = []
        for t in self.components.values():
            if t.state == C.BACKOFF and now >= t.next_start:
                if not t.retrying:
                    t.restarts += 1
                t.deadline = now + self.p.startup_timeout_s
                t.started_at, t.registered, t.unregistered_since = now, False, None
                self._set(t, C.STARTING, now)
                actions += [self._record(E.RESTARTING, t, f"{t.name} (restart {t.restarts} of this run"
                                         + (", its step not created before" if t.retrying else "") + ")"),
                            Start(t.name)]
        return actions

    def overall(self, now: float) -> List[Action]:
        """After a round: the run is degraded while any component is not healthy, serving again once all are."""
        down = [t for t in self.components.values() if t.state != C.HEALTHY]
        if down and self.run_state == RunState.READY:
            self.run_state = RunState.DEGRADED
            return [self._record(E.DEGRADED, None, ", ".join(f"{t.name} {t.state.value}" for t in down))]
        if not down and self.run_state == RunState.DEGRADED:
            self.run_state = RunState.READY
            return [self._record(E.SERVING, None, "every component healthy again")]
        return []

    def take_dirty(self) -> List[str]:
        names = sorted(self.dirty)
        self.dirty.clear()
        return names


@dataclass
class _Watch:
    generation: int = 0
    sent_at: Optional[float] = None  # a probe in flight since
    done_at: float = float("-inf")  # the last answer
    progress_at: Optional[float] = None  # the last time progress was seen (an answer; at first, the first probe)
    reported: bool = False  # its stall was reported
    disabled: bool = False  # the server has no progress route (this life of it)
    failing: Optional[str] = None  # what its last probe answered when that was no progress ("HTTP 500")


class ProgressWatch:
    """Liveness as progress: a bounded generation request (``/health_generate``, one token) every interval per
    server, at most one in flight. A server whose probe is in flight and that has shown no progress for
    ``stall_after_s`` (since its last 200) is stalled, reported once: so a wedge is seen within stall_after_s plus
    one round of the loop. A 5xx answer or none (timed out, no connection) is no progress: trtllm-serve's
    /health_generate answers 500 "Generation health check failed" when its one-token generation fails or raises
    (tensorrt_llm/serve/openai_server.py, OpenAIServer.health_generate, NVIDIA/TensorRT-LLM @
    00057725d9a6591f033e44f31c219e2426827bb7), the very failure the watch is for. Only an answer that says the
    route is not there (ROUTE_MISSING) or that the probe is refused (another 4xx: e.g. an auth layer in front)
    turns the watch off for that server, until it is restarted (``reset``). A 5xx from a server whose probe has
    never answered 200 in this run is not judged (said once): the probe itself may not work for its model (a
    tokenizer without a chat template fails every chat request, /health_generate included), and killing every
    server of such a deployment would be tk's failure, not the engine's; once it has answered 200, it is."""

    # 404/405: no such route or method (a build without /health_generate); 501: not implemented
    ROUTE_MISSING = (404, 405, 501)

    def __init__(self, stall_after_s: float, interval_s: float):
        self.stall_after_s, self.interval_s = stall_after_s, interval_s
        self.watches: Dict[str, _Watch] = {}
        self.proven: Set[str] = set()  # servers whose probe has answered 200 in this run (in any life)
        self.told: Set[str] = set()  # servers whose unproven 5xx was said

    def reset(self, name: str) -> None:
        """The component was (re)started: forget probes of its previous life."""
        w = self.watches.setdefault(name, _Watch())
        w.generation += 1
        w.sent_at, w.done_at, w.progress_at, w.reported = None, float("-inf"), None, False
        w.disabled, w.failing = False, None  # a restarted server (perhaps another build) is watched again

    def due(self, names: Iterable[str], now: float) -> List[tuple]:
        """(name, generation) of each server a probe should be sent to now; marks them sent."""
        if self.stall_after_s <= 0:
            return []
        out = []
        for name in names:
            w = self.watches.setdefault(name, _Watch())
            if w.disabled or w.sent_at is not None or now - w.done_at < self.interval_s:
                continue
            w.sent_at, w.reported = now, False
            if w.progress_at is None:
                w.progress_at = now
            out.append((name, w.generation))
        return out

    def answered(self, name: str, generation: int, status: Optional[int], now: float) -> Optional[str]:
        """A probe ended: status 2xx (progress), 5xx or None (no progress: the generation failed, the probe timed
        out or the connection was refused), or a status saying there is no such route or the probe is refused.
        Returns a reason when the watch turns itself off for that server (until its next restart)."""
        w = self.watches.setdefault(name, _Watch())
        if generation != w.generation:
            return None
        w.sent_at, w.done_at = None, now
        if status is not None and 200 <= status < 300:
            w.progress_at, w.failing = now, None
            self.proven.add(name)
        elif status is None:
            w.failing = None
        elif status >= 500 and status not in self.ROUTE_MISSING:
            w.failing = f"HTTP {status}"
            if name not in self.proven:  # the probe has never worked for it: no judgement yet
                w.progress_at = now
                if name not in self.told:
                    self.told.add(name)
                    return (f"its progress probe answered HTTP {status} and has never answered 200 in this run "
                            "(a model without a chat template fails it); a failing generation is judged once it has")
        elif not w.disabled:
            w.disabled = True
            what = "has no progress route" if status in self.ROUTE_MISSING else "refuses the progress probe"
            return (f"its progress probe answered HTTP {status} (the server {what}); wedge detection is off for it "
                    "until it restarts")
        return None

    def failing(self, name: str) -> Optional[str]:
        """What the server's last progress probe answered when it was no progress ("HTTP 500"); None when it
        showed progress, or timed out."""
        w = self.watches.get(name)
        return w.failing if w else None

    def stalls(self, now: float) -> List[tuple]:
        """(name, seconds without progress) of each server with a probe in flight and no progress for
        stall_after_s, reported once."""
        out = []
        for name, w in self.watches.items():
            if w.sent_at is None or w.reported or w.progress_at is None:
                continue
            if now - w.progress_at >= self.stall_after_s:
                w.reported = True
                out.append((name, now - w.progress_at))
        return out
