"""job.json: everything the job needs, written by `tk render` from the typed Plan and read here.

tk (toolkit.render) builds a JobSpec and writes ``to_json()``; the job reads it with ``JobSpec.load``. It is data
only: argv lists, ports, names, numbers. No value in it is ever given to a shell as text; where a node's bash
runs something (the step wrapper, the port probe) values travel as positional arguments.

Placeholders, resolved on the batch host once the nodes are known (as in disagg.yaml):
    <nodeN>   node N's address as the node itself reports it
    <bindN>   a listen address on node N: 0.0.0.0, or the node's address where that is loopback (local runs)
    <run_dir> the run directory (in argv items and membership.tls_dir: the etcd gateway, the run's certificates)
    {"run_file": "ctx.yaml"}   an argv item: that file of the run directory, as an absolute path
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

from orchestrator.states import ComponentKind, RestartPolicy, Role

SCHEMA = 1
ArgItem = Union[str, Dict[str, str]]


class SpecError(ValueError):
    """job.json is not what tk writes (the field says where)."""


@dataclass(frozen=True)
class Supervision:
    policy: RestartPolicy
    max_restarts: int  # consecutive failed restarts of one component before it is given up
    backoff_initial_s: float
    backoff_max_s: float
    unhealthy_after_s: float  # liveness failing this long: killed (restart) or the job fails (fail-fast)
    stable_after_s: float  # healthy this long: consecutive failures reset
    health_interval_s: float  # one probe round every this many seconds
    stall_after_s: float  # a progress probe unanswered this long: wedged (0: no progress probes)
    startup_timeout_s: float  # each start-up wait, and a restarted component's time to turn healthy
    minimum: Dict[Role, int]  # fewer live components of a role than this ends the run
    probe_timeout_s: float = 3.0  # one liveness probe


@dataclass(frozen=True)
class Component:
    name: str  # ctx-0, gen-1, agg-0, proxy, etcd; its step is tk-NAME, its log logs/NAME.log
    role: Role
    kind: ComponentKind
    nodes: List[int]  # plan node indices; the first is where it is reached
    ntasks: int
    ntasks_per_node: int
    gpus: str  # CUDA_VISIBLE_DEVICES
    env_file: str  # of the run directory, sourced by the step wrapper ("" for none)
    instance_env: List[Tuple[str, str]]  # exported after env_file, this instance only
    argv: List[ArgItem]
    port: int
    health: str = "/health"  # 200 = started and healthy
    live: str = "/health"  # what supervision probes once serving (the proxy with membership: /cluster_info)
    progress: Optional[str] = None  # a bounded generation (TensorRT-LLM's /health_generate); None: not probed
    start_after: Optional[str] = None  # a co-located instance whose launcher must bind its IPC port first
    tls: bool = False  # reached over HTTPS with the run's client certificate (the job's etcd: membership.tls_dir)

    @property
    def first_node(self) -> int:
        return self.nodes[0]


@dataclass(frozen=True)
class Membership:
    storage: str  # http | etcd
    cluster_uri: str  # with <nodeN> placeholders
    worker_key_prefix: str
    workers: Dict[str, str]  # worker name -> "<nodeN>:PORT", the address it registers
    # The client certificate the storage wants (ca.crt, client.crt, client.key; <run_dir> resolved): the job's etcd
    # opens to the run's own only. None: the storage takes anyone (accepted by the recipe).
    tls_dir: Optional[str] = None
    # How long a worker whose key lapsed takes to register again by itself (TensorRT-LLM: its next heartbeat fails,
    # then put-if-absent retried every 5 s): the job restarts one that is not registered after this (at least
    # supervision.unhealthy_after_s).
    rejoin_s: float = 0.0


@dataclass(frozen=True)
class ConfigCheck:
    argv: List[str]  # after `python3 check_config.py`
    options: List[Tuple[str, str]]  # (run file, model path) per role
    disagg: bool  # also --disagg disagg.resolved.yaml
    timeout_s: float


@dataclass(frozen=True)
class Provenance:
    flags: List[str]  # the container flags of a step
    image: str
    version_command: List[str]


@dataclass(frozen=True)
class Launcher:
    """TensorRT-LLM lines whose launcher picks its IPC port itself (no per-instance knob)."""

    ipc_addr_env: str  # the variable its log line names, "NAME: tcp://HOST:PORT"
    stagger_s: float  # at most this long for the previous instance on the node to bind it


@dataclass(frozen=True)
class JobSpec:
    name: str
    nodes: int
    node_ports: List[List[int]]  # per node: the ports this plan puts there (checked free before start)
    srun_flags: List[str]  # every component step and the config check (container, --mpi, recipe srun_args)
    components: List[Component]  # in start order: etcd, proxy (membership), then the servers, then the proxy
    supervision: Supervision
    check: ConfigCheck
    provenance: Provenance
    launcher: Launcher
    proxy_first: bool = False  # membership: etcd and the proxy start (and answer) before the workers
    membership: Optional[Membership] = None
    disagg_config: Optional[str] = None  # disagg.yaml; the job writes disagg.resolved.yaml from it
    # The signal cluster.sbatch_args asks Slurm to send the batch shell before the time limit (--signal=B:SIG@T),
    # as "SIGUSR1": the job ends the deployment cleanly on it (as on any signal that ends a process) and says why.
    time_limit_signal: Optional[str] = None
    schema: int = SCHEMA
    toolkit_version: str = ""
    trtllm_version: str = ""

    # -- codec ------------------------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, doc: Any) -> "JobSpec":
        try:
            return _spec(doc)
        except SpecError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise SpecError(f"malformed ({type(exc).__name__}: {str(exc)[:200]})") from None

    @classmethod
    def load(cls, path: str) -> "JobSpec":
        with open(path, "rb") as f:
            data = f.read(16 << 20)
        try:
            doc = json.loads(data.decode())
        except (ValueError, RecursionError) as exc:
            raise SpecError(f"not JSON ({exc})") from None
        return cls.from_dict(doc)

    # -- lookups ----------------------------------------------------------------------------------------------
    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def front(self) -> Optional[Component]:
        return next((c for c in self.components if c.kind == ComponentKind.PROXY), None)


def _need(doc: Dict[str, Any], key: str, kind: Any, where: str) -> Any:
    if key not in doc:
        raise SpecError(f"{where}{key}: missing")
    value = doc[key]
    if isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise SpecError(f"{where}{key}: {value!r} is not what tk writes there")
    if not isinstance(value, kind):
        raise SpecError(f"{where}{key}: {str(value)[:60]!r} is not what tk writes there")
    return value


def _strings(value: Any, where: str) -> List[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{where}: not a list of strings")
    return list(value)


def _argv(value: Any, where: str) -> List[ArgItem]:
    out: List[ArgItem] = []
    if not isinstance(value, list):
        raise SpecError(f"{where}: not a list")
    for item in value:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict) and set(item) == {"run_file"} and isinstance(item["run_file"], str) \
                and "/" not in item["run_file"] and item["run_file"] not in ("", ".", ".."):
            out.append({"run_file": item["run_file"]})
        else:
            raise SpecError(f"{where}: {str(item)[:60]!r} is neither text nor a run file")
    return out


NUMBER = (int, float)
WEEK_S = 7 * 86400  # the longest wait tk writes anywhere (toolkit.runtime.bounds)
MAX_NODES = 100000  # node indices are below this (components[].nodes)
MAX_COUNT = 100000  # restarts, tasks, a role's minimum: far above anything a plan holds
# Seconds that must be above 0: a wait of 0 turns a loop into a busy one (and NaN would make every deadline never pass)
POSITIVE_S = ("health_interval_s", "startup_timeout_s", "probe_timeout_s")


def _seconds(doc: Dict[str, Any], key: str, where: str, positive: bool = False) -> float:
    """A number of seconds: finite, from 0 (above 0 where ``positive``) to a week."""
    given = _need(doc, key, NUMBER, where)
    try:
        value = float(given)
    except OverflowError:  # an integer of hundreds of digits: JSON reads it whole, a float cannot hold it
        raise SpecError(f"{where}{key}: {str(given)[:20]}... is not a number of seconds from 0 to {WEEK_S} (what tk "
                        "writes)") from None
    if not math.isfinite(value) or value < 0 or positive and value <= 0 or value > WEEK_S:
        raise SpecError(f"{where}{key}: {value!r} is not a number of seconds from {'above ' if positive else ''}0 to "
                        f"{WEEK_S} (what tk writes)")
    return value


def _count(doc: Dict[str, Any], key: str, where: str, low: int, high: int = MAX_COUNT) -> int:
    value = _need(doc, key, int, where)
    if not low <= value <= high:
        raise SpecError(f"{where}{key}: {value} is not a count from {low} to {high}")
    return value


def _word(vocabulary: Any, text: Any, where: str) -> Any:
    """``text`` as a word of ``vocabulary`` (an Enum of orchestrator.states), or SpecError naming the words."""
    try:
        return vocabulary(text)
    except ValueError:
        raise SpecError(f"{where}: {str(text)[:40]!r} is not one of "
                        f"{', '.join(w.value for w in vocabulary)}") from None


def _spec(doc: Any) -> JobSpec:
    if not isinstance(doc, dict):
        raise SpecError("not a JSON object")
    if doc.get("schema") != SCHEMA:
        raise SpecError(f"schema: {doc.get('schema')!r}; this job reads schema {SCHEMA} (re-render with this tk)")
    supervision = _supervision(_need(doc, "supervision", dict, ""))
    components = [_component(i, c) for i, c in enumerate(_need(doc, "components", list, ""))]
    names = [c.name for c in components]
    if len(set(names)) != len(names) or not all(n and n.replace("-", "").replace("_", "").isalnum() for n in names):
        raise SpecError("components: names must be unique letters, digits, '-' or '_'")
    membership = _membership(doc.get("membership"))
    check = _check(_need(doc, "check", dict, ""))
    pv = _need(doc, "provenance", dict, "")
    provenance = Provenance(flags=_strings(_need(pv, "flags", list, "provenance."), "provenance.flags"),
                            image=_need(pv, "image", str, "provenance."),
                            version_command=_strings(_need(pv, "version_command", list, "provenance."),
                                                     "provenance.version_command"))
    la = _need(doc, "launcher", dict, "")
    launcher = Launcher(ipc_addr_env=_need(la, "ipc_addr_env", str, "launcher."),
                        stagger_s=_seconds(la, "stagger_s", "launcher."))
    node_ports = _need(doc, "node_ports", list, "")
    if not all(isinstance(p, list) and all(isinstance(x, int) and not isinstance(x, bool) and 0 < x < 65536 for x in p)
               for p in node_ports):
        raise SpecError("node_ports: not a list of port lists (ports 1 to 65535)")
    disagg = doc.get("disagg_config")
    if disagg is not None and (not isinstance(disagg, str) or "/" in disagg):
        raise SpecError("disagg_config: not a file of the run directory")
    nodes = _count(doc, "nodes", "", 1, MAX_NODES)
    if len(node_ports) > nodes:
        raise SpecError(f"node_ports: {len(node_ports)} lists for {nodes} nodes")
    spec = JobSpec(name=_need(doc, "name", str, ""), nodes=nodes, node_ports=node_ports,
                   srun_flags=_strings(_need(doc, "srun_flags", list, ""), "srun_flags"), components=components,
                   supervision=supervision, check=check, provenance=provenance, launcher=launcher,
                   proxy_first=bool(doc.get("proxy_first", False)), membership=membership,
                   disagg_config=disagg, time_limit_signal=_time_limit_signal(doc.get("time_limit_signal")),
                   toolkit_version=str(doc.get("toolkit_version", "")),
                   trtllm_version=str(doc.get("trtllm_version", "")))
    for c in components:
        if any(n >= spec.nodes for n in c.nodes) or c.start_after is not None and c.start_after not in names:
            raise SpecError(f"components: {c.name} names a node or a predecessor the job does not have")
    return spec


def _supervision(sv: Dict[str, Any]) -> Supervision:
    minimum = _need(sv, "minimum", dict, "supervision.")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT for v in minimum.values()):
        raise SpecError(f"supervision.minimum: not role -> count (0 to {MAX_COUNT})")
    return Supervision(
        policy=_word(RestartPolicy, _need(sv, "policy", str, "supervision."), "supervision.policy"),
        max_restarts=_count(sv, "max_restarts", "supervision.", 0, 1000),
        minimum={_word(Role, k, "supervision.minimum"): v for k, v in minimum.items()},
        **{k: _seconds(sv, k, "supervision.", positive=k in POSITIVE_S) for k in (
            "backoff_initial_s", "backoff_max_s", "unhealthy_after_s", "stable_after_s", "health_interval_s",
            "stall_after_s", "startup_timeout_s", "probe_timeout_s")})


def _component(i: int, c: Any) -> Component:
    where = f"components[{i}]."
    if not isinstance(c, dict):
        raise SpecError(f"components[{i}]: not an object")
    nodes = _need(c, "nodes", list, where)
    if not nodes or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < MAX_NODES for n in nodes):
        raise SpecError(f"{where}nodes: not a list of node indices")
    env = _need(c, "instance_env", list, where)
    if not all(isinstance(kv, list) and len(kv) == 2 and all(isinstance(x, str) for x in kv) for kv in env):
        raise SpecError(f"{where}instance_env: not a list of [NAME, VALUE]")
    port = _need(c, "port", int, where)
    if not 0 < port < 65536:
        raise SpecError(f"{where}port: {port} is not a port")
    progress = c.get("progress")
    start_after = c.get("start_after")
    if progress is not None and not isinstance(progress, str) or \
            start_after is not None and not isinstance(start_after, str):
        raise SpecError(f"{where}progress/start_after: not text")
    return Component(
        name=_need(c, "name", str, where), role=_word(Role, _need(c, "role", str, where), where + "role"),
        kind=_word(ComponentKind, _need(c, "kind", str, where), where + "kind"), nodes=list(nodes),
        ntasks=_count(c, "ntasks", where, 1), ntasks_per_node=_count(c, "ntasks_per_node", where, 1),
        gpus=_need(c, "gpus", str, where), env_file=_need(c, "env_file", str, where),
        instance_env=[(k, v) for k, v in env], argv=_argv(_need(c, "argv", list, where), where + "argv"),
        port=port, health=_need(c, "health", str, where), live=_need(c, "live", str, where),
        progress=progress, start_after=start_after, tls=bool(c.get("tls", False)))


def _membership(m: Any) -> Optional[Membership]:
    if m is None:
        return None
    if not isinstance(m, dict):
        raise SpecError("membership: not an object")
    workers = _need(m, "workers", dict, "membership.")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in workers.items()):
        raise SpecError("membership.workers: not name -> host:port")
    tls_dir = m.get("tls_dir")
    if tls_dir is not None and not isinstance(tls_dir, str):
        raise SpecError("membership.tls_dir: not a directory")
    return Membership(storage=_need(m, "storage", str, "membership."),
                      cluster_uri=_need(m, "cluster_uri", str, "membership."),
                      worker_key_prefix=_need(m, "worker_key_prefix", str, "membership."),
                      workers=dict(workers), tls_dir=tls_dir,
                      rejoin_s=_seconds(m, "rejoin_s", "membership.") if "rejoin_s" in m else 0.0)


def _time_limit_signal(name: Any) -> Optional[str]:
    """A signal's name as orchestrator.job.signal_name gives it (SIGUSR1, SIGRTMIN+3), or None."""
    if name is not None and (not isinstance(name, str) or not 3 < len(name) <= 16 or not name.startswith("SIG")
                             or not name[3:].replace("+", "").isalnum()):
        raise SpecError(f"time_limit_signal: {str(name)[:40]!r} is not a signal's name (SIGUSR1, SIGRTMIN+3)")
    return name


def _check(ch: Dict[str, Any]) -> ConfigCheck:
    options = _need(ch, "options", list, "check.")
    if not all(isinstance(o, list) and len(o) == 2 and all(isinstance(x, str) for x in o) for o in options):
        raise SpecError("check.options: not a list of [file, model]")
    return ConfigCheck(argv=_strings(_need(ch, "argv", list, "check."), "check.argv"),
                       options=[(a, b) for a, b in options], disagg=_need(ch, "disagg", bool, "check."),
                       timeout_s=_seconds(ch, "timeout_s", "check.", positive=True))


__all__ = ["ArgItem", "Component", "ConfigCheck", "JobSpec", "Launcher", "Membership", "Provenance", "SpecError",
           "Supervision"]
