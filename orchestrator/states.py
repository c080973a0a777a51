"""The vocabulary the job and tk share: run states, component states and event kinds, each an Enum.

The job (this package, on the batch host) writes them into state/events.jsonl and state/servers/NAME.json; tk
(toolkit.launch) reads them back and imports this module, so there is one spelling of every state. Every value is
a plain string (``str`` Enums), so the files stay readable JSON and older records still load.

docs/architecture.md ("States") draws every transition.
"""

from __future__ import annotations

import enum


class RunState(str, enum.Enum):
    """A run as `tk status` shows it (run.json ``state``)."""

    RENDERED = "rendered"  # files written, nothing submitted
    SUBMITTED = "submitted"  # sbatch answered (or the local job started); the job has not said anything yet
    PENDING = "pending"  # Slurm has not started the job (squeue's reason is the detail)
    STARTING = "starting"  # the job runs: nodes, config check, servers starting, health and registration waits
    READY = "ready"  # the job said ready and every component answers /health
    DEGRADED = "degraded"  # ready before, and now a component is down, being restarted or given up; still serving
    FAILED = "failed"  # the job ended itself (a role below its minimum, fail-fast, a start-up failure) or tk gave up
    STOPPED = "stopped"  # `tk stop` (or the job ended with no failure recorded)

    @property
    def serving(self) -> bool:
        return self in (RunState.READY, RunState.DEGRADED)

    @property
    def terminal(self) -> bool:
        return self in (RunState.FAILED, RunState.STOPPED)


class ComponentState(str, enum.Enum):
    """One server, the proxy or the job's etcd, as the job's supervision sees it (state/servers/NAME.json)."""

    PLANNED = "planned"  # not started yet (tk only: before the job started it)
    STARTING = "starting"  # its step was started; not healthy yet (at first, or after a restart)
    HEALTHY = "healthy"  # answers its liveness URL with 200 and makes progress
    UNHEALTHY = "unhealthy"  # stopped answering 200; killed after supervision.unhealthy_after_s
    # answers /health but has no key in the cluster storage (membership): out of the proxy's routing; killed and
    # restarted when it is not registered again in time (its lease lapsed, its etcd gateway ended)
    UNREGISTERED = "unregistered"
    KILLING = "killing"  # being killed (hung, wedged, or not healthy in time); its exit follows
    BACKOFF = "backoff"  # exited; restarted after the backoff (the reason says when, and which restart)
    LOST = "lost"  # given up: max_restarts in a row used, or it survived SIGKILL
    EXITED = "exited"  # exited and not restarted: before the deployment served, or under fail-fast
    FAILED = "failed"  # tk only: the component the failed run names
    STOPPED = "stopped"  # tk only: the job is gone

    @property
    def down(self) -> bool:
        """Not serving now (anything but healthy)."""
        return self is not ComponentState.HEALTHY


# What the job's supervision can say of a component that tk's own probe finds not answering: tk shows it as is.
SUPERVISED_STATES = frozenset({ComponentState.STARTING, ComponentState.UNHEALTHY, ComponentState.KILLING,
                               ComponentState.BACKOFF, ComponentState.LOST, ComponentState.EXITED,
                               ComponentState.UNREGISTERED})
# What only the job's supervision can see: tk's own /health probe answering 200 does not make it healthy.
BEYOND_HEALTH_STATES = frozenset({ComponentState.UNREGISTERED})


class EventKind(str, enum.Enum):
    """What happened, one JSON line each in state/events.jsonl (orchestrator.events)."""

    # start-up, in order
    RESOLVING = "resolving"  # reading the allocation's nodes
    CHECKING = "checking"  # TensorRT-LLM's own config check runs
    CHECKED = "checked"  # it accepted every file
    CHECK_SKIPPED = "check-skipped"  # it could not run here (no tensorrt_llm, timed out); the servers check
    STARTED = "started"  # a component's step was started (component, its nodes)
    WAITING = "waiting"  # waiting for a co-located launcher to bind its IPC port
    HEALTHY = "healthy"  # a component answered its health URL during start-up
    REGISTERED = "registered"  # every worker is in the cluster storage
    READY = "ready"  # the deployment serves (reason: the endpoint)
    # serving
    UNHEALTHY = "unhealthy"  # a healthy component stopped answering 200
    RECOVERED = "recovered"  # it answers again before it was killed
    WEDGED = "wedged"  # /health answers but a request in flight produced no token for stall_after_s
    KILLED = "killed"  # supervision killed it (reason: why)
    EXITED = "server-exited"  # it ended; restart pending (reason: which restart, when)
    STEP_NOT_CREATED = "step-not-created"  # srun never started it (controller away); retried, not counted
    RESTARTING = "restarting"  # its step is started again
    RESTARTED = "restarted"  # healthy again after a restart
    STABLE = "stable"  # healthy for stable_after_s: its consecutive failures reset
    LOST = "lost"  # given up
    UNREGISTERED = "unregistered"  # a serving worker has no key in the cluster storage: the proxy does not route to it
    DEREGISTERED = "deregistered"  # its keys deleted from the cluster storage
    MEMBERSHIP_REPAIRED = "membership-repaired"  # stale registrations replaced after the storage came back
    PROBE_REFUSED = "progress-probe-refused"  # no progress route (404/405/501) or a 4xx: wedge detection off until restart
    BACKGROUND_FAILED = "background-failed"  # background work (a kill, a lookup, a probe) failed: component, cause
    DEGRADED = "degraded"  # some component is down (reason: which)
    SERVING = "serving"  # every component healthy again
    # the end
    FAILED = "failed"  # the job ends itself (component: the cause, where there is one)
    STOPPING = "stopping"  # teardown (a signal, or after failed)


class Word(str, enum.Enum):
    """A word of a vocabulary (tk's and the job's): compares equal to its text, hashes and formats as it
    (f"{Role.CTX}" is "ctx" on every Python), and is written as its text in JSON."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __hash__(self) -> int:  # the text's hash, as equality is the text's: Role.CTX and "ctx" are one dict key
        return str.__hash__(self)


class Role(Word):
    """What a component of a run is for: a server role of the plan (ctx, gen, agg) or the proxy or the job's etcd.
    A component's logs are logs/NAME.log; `tk logs --role` takes each of these."""

    CTX = "ctx"  # a context (prefill) server
    GEN = "gen"  # a generation (decode) server
    AGG = "agg"  # a plain trtllm-serve instance of the aggregated baseline (no proxy, no KV transfer)
    PROXY = "proxy"  # `trtllm-serve disaggregated`
    ETCD = "etcd"  # the etcd the job starts for membership

    @property
    def serves(self) -> bool:
        """A server that runs the model (not the proxy or etcd)."""
        return self in SERVER_ROLES


SERVER_ROLES = (Role.CTX, Role.GEN, Role.AGG)


class ComponentKind(Word):
    """How the job starts, probes and supervises a component (job.json ``kind``)."""

    WORKER = "worker"  # a server: an MPI world of tp x pp ranks, probed for progress too
    PROXY = "proxy"  # the front of a disaggregated deployment
    ETCD = "etcd"  # the cluster storage the job starts (membership with storage etcd)


class RestartPolicy(Word):
    """What supervision does when a component fails once the deployment serves (recipe supervision.policy)."""

    RESTART = "restart"  # kill (when hung) and restart it, with backoff, up to max_restarts in a row
    FAIL_FAST = "fail-fast"  # the run fails
