"""A run: one launched deployment and the directory that holds everything about it.

    runs/<recipe-name>-<YYYYmmdd-HHMMSS>/
        ctx.yaml gen.yaml disagg.yaml *.env launch.sbatch manifest.json   (rendered)
        run.json          the run record (backend, job id, servers, state)
        nodes.tsv         index, Slurm node name, address (written by the job)
        disagg.resolved.yaml   disagg.yaml with real hostnames
        job.json job.pyz  what the job runs (the orchestrator package) and its data, rendered
        state/events.jsonl  what the job did, one JSON event a line (orchestrator.events)
        state/servers/NAME.json  each component's supervision state (restarts, last exit, PID or step)
        logs/<server>.log one log per server, logs/proxy.log; logs/job.log the local job's own output
        provenance/NODE.json  what each node runs (engine, NIXL, UCX, driver, image), written at start
        local/bin/        the local backend's srun/scontrol/scancel shim (tk launch --local)
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator.states import SERVER_ROLES, ComponentState, Role, RunState
from toolkit.errors import TkError
from toolkit.plan.model import Plan
from toolkit.runtime import files, rundir
from toolkit.runtime.rundir import runs_root

RUN_RECORD = "run.json"
BACKENDS = ("slurm", "local")
RUN_RECORD_MAX_BYTES = 4 << 20  # a run.json is a few KiB; its history grows a line per state change
# Slurm job ids (JOBID, or ARRAYJOB_TASK) and the local backend's session tag (LocalBackend.submit)
JOB_IDS = {"slurm": re.compile(r"[0-9]{1,20}(_[0-9]{1,10})?"), "local": re.compile(r"local-[0-9a-f]{12}")}
JOB_ID_FORMS = {"slurm": "digits, or digits_digits for an array task", "local": "local- and 12 hex digits"}
RUN_ID = re.compile(r"[0-9a-f]{32}")
SERVER_NAME = re.compile(rf"({'|'.join(SERVER_ROLES)})-[0-9]{{1,4}}|{Role.PROXY}|{Role.ETCD}")


@dataclass
class ServerRecord:
    name: str  # ctx-0, gen-1, proxy; agg-0 (an aggregated run)
    role: str  # an orchestrator.states.Role value: ctx | gen | agg | proxy | etcd
    instance: int
    node: int  # plan node index of its first node
    port: int
    # an orchestrator.states.ComponentState value; once the job runs, what its supervision (state/servers/NAME.json)
    # and a /health probe say now
    state: str = ComponentState.PLANNED.value
    host: str | None = None  # address once known
    restarts: int = 0  # restarts by the job's supervision in this run
    last_exit: int | None = None  # exit code of its last exit (128 + N: killed by signal N)
    pid: int | None = None  # local backend: the server's process
    step: str | None = None  # Slurm: the job step (JOB.STEP) that runs it
    since: float | None = None  # when it entered its state
    reason: str | None = None  # why it is not healthy, current as of the last refresh


@dataclass
class RunRecord:
    name: str
    run_dir: str
    recipe: str
    backend: str  # slurm | local
    engine: str
    created: float
    servers: list[ServerRecord]
    job_id: str | None = None
    state: str = RunState.RENDERED.value  # an orchestrator.states.RunState value (docs/architecture.md, "States")
    endpoint: str | None = None
    reason: str | None = None
    job_pid: int | None = None  # local backend: the batch script, leader of the job's process group
    run_id: str | None = None  # local backend: TK_RUN_ID, carried by every process the job starts
    nodes: int = 1
    model: str = ""
    engine_label: str = ""  # the plan's engine label (says "emulated timing of MODEL on GPU" where it is)
    tokenizer: str | None = None  # a tokenizer directory the engine ships for clients that count tokens (aiperf)
    history: list = field(default_factory=list)
    mode: str = "disaggregated"  # or "aggregated": plain trtllm-serve instances, no proxy (toolkit.plan.aggregated)
    endpoints: list = field(default_factory=list)  # aggregated: every instance's URL (endpoint is the first)

    @property
    def front(self) -> str | None:
        """The component whose health means the run serves: the proxy; None in an aggregated run (every server)."""
        return None if self.mode == "aggregated" else "proxy"

    @classmethod
    def new(cls, plan: Plan, run_dir: Path, backend: str) -> "RunRecord":
        servers = [ServerRecord(name=s.name, role=s.role.value, instance=s.index, node=s.first_node, port=s.port)
                   for s in plan.servers]
        if plan.proxy is not None:
            servers.append(ServerRecord(name="proxy", role=Role.PROXY.value, instance=0, node=plan.proxy.node,
                                        port=plan.proxy.port))
        etcd = plan.membership.etcd if plan.membership is not None else None
        if etcd is not None and etcd.started_by_job:  # the job starts and supervises it: status shows it too
            servers.append(ServerRecord(name="etcd", role=Role.ETCD.value, instance=0, node=etcd.node, port=etcd.port))
        return cls(name=run_dir.name, run_dir=str(run_dir.resolve()), recipe=plan.recipe_file, backend=backend,
                   engine=plan.engine.name, created=time.time(), servers=servers,
                   model=plan.roles[0].model_path, nodes=plan.node_count, engine_label=plan.engine.label,
                   mode=plan.mode, tokenizer=_shipped_tokenizer(plan))

    def to_dict(self) -> dict:
        return asdict(self)

    def public(self) -> dict:
        """The record users and scripts read (`tk launch --json`, `tk status --json`)."""
        d = self.to_dict()
        d.pop("history", None)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "RunRecord":
        """A record as run.json holds it; ValueError for anything tk did not write (a damaged or edited file)."""
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        d = dict(d)
        d.pop("supervisor_pid", None)  # records written before the local backend ran launch.sbatch
        servers = d.get("servers", [])
        if not isinstance(servers, list) or not all(isinstance(s, dict) for s in servers):
            raise ValueError("servers: not a list of objects")
        d["servers"] = [ServerRecord(**s) for s in servers]
        record = cls(**d)
        for name, kinds in _FIELD_TYPES.items():
            value = getattr(record, name)
            if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
                raise ValueError(f"{name}: {type(value).__name__} {str(value)[:60]!r} is not what tk writes there")
        if record.backend not in BACKENDS:
            raise ValueError(f"backend: {record.backend[:60]!r} is not one of {', '.join(BACKENDS)}")
        # The job id is handed to scancel / squeue / scontrol: only what Slurm or tk's local backend writes there,
        # never an option (`--name=X`, `--user=$USER` would cancel other jobs).
        if record.job_pid is not None and record.job_pid <= 1:
            raise ValueError(f"job_pid: {record.job_pid} is not a process tk started")
        if record.job_id is not None and not JOB_IDS[record.backend].fullmatch(record.job_id):
            raise ValueError(f"job_id: {record.job_id[:60]!r} is not a {record.backend} job id "
                             f"({JOB_ID_FORMS[record.backend]})")
        if record.run_id is not None and not RUN_ID.fullmatch(record.run_id):
            raise ValueError(f"run_id: {record.run_id[:60]!r} is not what tk writes there")
        for s in record.servers:
            if not isinstance(s.name, str) or not isinstance(s.port, int) or not isinstance(s.node, int):
                raise ValueError(f"servers: {str(s.name)[:60]!r} has a malformed name, port or node")
            if not SERVER_NAME.fullmatch(s.name):  # it names logs/NAME.log: nothing that leads out of the run
                raise ValueError(f"servers: {s.name[:60]!r} is not a server name tk writes")
        return record

    # -- persistence --------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return Path(self.run_dir)

    def save(self) -> None:
        # rewritten at every state change and poll: whole for every reader, but not synced to disk each time
        files.write_regular_atomically(self.path / RUN_RECORD, json.dumps(self.to_dict(), indent=2) + "\n",
                                       sync=False)

    def set_state(self, state: RunState | str, reason: str | None = None) -> None:
        self.state = RunState(state).value
        self.reason = reason  # a reason belongs to its state: "ready" must not carry "pending (Priority)"
        self.history.append([round(time.time(), 3), self.state, reason])
        self.save()

    def server(self, name: str) -> ServerRecord:
        for s in self.servers:
            if s.name == name:
                return s
        raise KeyError(name)

    def log_path(self, name: str) -> Path:
        return self.path / "logs" / f"{name}.log"


def _shipped_tokenizer(plan: Plan) -> str | None:
    if not plan.engine.tokenizer_dir:
        return None
    from toolkit.resources import package_path
    try:
        return str(package_path(plan.engine.tokenizer_dir))
    except FileNotFoundError:
        return None


_FIELD_TYPES = {"name": (str,), "run_dir": (str,), "recipe": (str,), "backend": (str,), "engine": (str,),
                "created": (int, float), "job_id": (str, type(None)), "state": (str,),
                "endpoint": (str, type(None)), "reason": (str, type(None)), "job_pid": (int, type(None)),
                "run_id": (str, type(None)), "nodes": (int,), "model": (str,), "engine_label": (str,),
                "history": (list,), "mode": (str,), "endpoints": (list,), "tokenizer": (str, type(None))}


def new_run_dir(plan: Plan, run_dir: str | None, kind: str = "") -> Path:
    """A new run directory, created exclusively: the given one, or runs/NAME[-KIND]-TIMESTAMP[-N]."""
    return rundir.new_run_dir(plan.name, run_dir, kind)


def load_run(path: Path) -> RunRecord:
    """The run whose record is in path. The record's own run_dir is not trusted: a run directory that was
    copied or moved (or a hand-edited record) is read and written where it is now."""
    try:
        record = RunRecord.from_dict(files.read_json(Path(path) / RUN_RECORD, RUN_RECORD_MAX_BYTES, follow=False))
    except (OSError, ValueError, TypeError) as exc:  # files.FileProblem is a ValueError
        raise TkError(f"{path}: not a readable tk run ({str(exc)[:300]})") from None
    record.run_dir = str(Path(path).resolve())
    return record


def all_runs() -> list[RunRecord]:
    """Every run under the runs directory ($TK_RUNS_DIR, default runs/ here) and in the run index (runs
    started from any directory), each once, oldest first. Unreadable ones are skipped."""
    root = runs_root()
    candidates: list[Path] = []
    try:
        if root.is_dir():
            candidates = sorted(root.iterdir())
    except OSError:
        pass
    candidates += rundir.indexed_dirs()
    out, seen = [], set()
    for d in candidates:
        try:
            key = str(d.resolve())
            if key in seen or not (d / RUN_RECORD).is_file():
                continue
            seen.add(key)
            out.append(load_run(d))
        except (TkError, OSError):
            continue
    return sorted(out, key=lambda r: r.created)


def find_run(ref: str | None) -> RunRecord:
    """A run by directory, by name (or a unique prefix of one), or (None) the most recent run that was launched
    (dry runs are found by name only)."""
    if ref:
        p = Path(ref)
        if (p / RUN_RECORD).is_file():
            return load_run(p)
        runs = all_runs()
        exact = [r for r in runs if r.name == ref]
        matches = exact or [r for r in runs if r.name.startswith(ref)]  # an exact name wins over prefixes
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise TkError(f"{ref!r} matches several runs: {', '.join(r.name for r in matches)}; give the full name")
        raise TkError(f"no run {ref!r} (a run directory or a name from `tk runs`: runs under {runs_root()}/ "
                      f"and in the run index {rundir.index_path()})")
    runs = all_runs()
    launched = [r for r in runs if r.state != "rendered"]  # a dry run (tk launch --dry-run) is never "the last run"
    if not launched:
        dry = f" (only dry runs: {runs[-1].name}...)" if runs else ""
        raise TkError(f"no launched runs under {runs_root()}/ or in the run index {rundir.index_path()}{dry}; "
                      "start one with `tk launch RECIPE`, or name a run")
    return launched[-1]


def read_events(run: RunRecord) -> list[dict]:
    """The job's own account of itself (state/events.jsonl), oldest first."""
    return rundir.read_events(run.path)


def read_supervision(run: RunRecord) -> dict[str, dict]:
    """What the job's supervision last wrote for each component (state/servers/NAME.json); {} where none."""
    return rundir.read_server_states(run.path, [s.name for s in run.servers])


def read_nodes(run: RunRecord) -> dict[int, str]:
    """Plan node index -> address, once the job has resolved them."""
    return rundir.read_nodes(run.path)


def log_tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of a log (none for 0), read from its last 64 KiB: a regular file inside its run
    directory (a log that is a symlink leading elsewhere, a FIFO or a device is named, not read)."""
    if lines <= 0:
        return ""
    try:
        files.inside(path.parent.parent, Path(path.parent.name) / path.name)
        text = files.read_text(path, 64 * 1024, follow=False, longer="tail")
    except FileNotFoundError:
        return f"(no log at {path})"
    except (OSError, ValueError) as exc:
        return f"(log {path} not read: {str(exc)[:200]})"
    return "\n".join(text.splitlines()[-lines:])
