"""The coordinator of `tk validate cluster`: write params, start the agents, watch (bounded), gather,
merge into the report, release everything.

    runs/<recipe>-validate-<YYYYmmdd-HHMMSS>/
        agent.pyz         the agent: a zipapp of the validation package (stdlib + numpy + NIXL; the toolkit
                          need not be installed on the nodes), run as python3 agent.pyz params.json AGENT
        params.json       what every agent does
        validate.sbatch   the Slurm job (default mode)
        rendezvous/       AGENT.md (NIXL metadata), AGENT.json (address, pool), exited/AGENT, done/AGENT
        results/AGENT.json  each agent's preflight, pair records, timings (rewritten after every pair)
        logs/AGENT.log    agent output; logs/ucx-AGENT.log UCX's protocol selection
        report.json       the merged report (what --json prints)
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.states import Role
from toolkit.facts.hardware import Transport
from toolkit.errors import TkError
from validation.rundir import RunDir
from validation.schedule import partners
from toolkit.plan.model import Plan
from toolkit.runtime import bounds, files, rundir, signals
from toolkit.render import container_srun_flags
from toolkit.validate import launchers
from toolkit.validate.params import Options, ValidateError, build_params, parse_fault
from toolkit.validate.report import build_report, merge_pairs
from toolkit.validate.ship import build_agent_archive

POLL_S = 0.3
GRACE_S = 30.0  # beyond the agents' own deadline


def _srun_flags(plan) -> list[str]:
    """Each agent step's flags: the recipe's container and its extra srun arguments (cluster.srun_args)."""
    return [*container_srun_flags(plan), *plan.slurm.srun_args]


def new_run_dir(plan: Plan, run_dir: str | None) -> Path:
    """A new validation run directory, created exclusively (runtime.rundir)."""
    try:
        return rundir.new_run_dir(plan.name, run_dir, kind="validate")
    except TkError as exc:
        raise ValidateError(str(exc)) from exc


def _read_json(path: Path):
    """An agent's result (or the params): bounded in size and depth; None if missing or damaged."""
    try:
        return files.read_json(path, 64 << 20)
    except (OSError, ValueError):
        return None


def gather(run_dir: Path, params: dict) -> tuple[dict, dict]:
    """(agent -> result or None, agent -> exit code or None) from the run directory."""
    layout = RunDir(str(run_dir))  # the agents' own layout of the run directory: one codec, in validation/
    results, exits = {}, {}
    for a in params["agents"]:
        results[a["id"]] = _read_json(Path(layout.result(a["id"])))
        stuck = _read_json(Path(layout.unresponsive(a["id"])))
        if stuck and results[a["id"]] is not None:
            results[a["id"]]["unresponsive"] = stuck
        exits[a["id"]] = layout.exit_code(a["id"])
    return results, exits


def _settled(params: dict, results: dict, exits: dict) -> bool:
    """Every agent has finished (final result or exit code), or the only ones left were given up on by all."""
    open_ = [a for a in results if not ((results[a] or {}).get("final") or exits[a] is not None)]
    if not open_:
        return True
    finished = [a for a in results if a not in open_]
    if not finished:
        return False
    for a in open_:
        peers = [b for b in finished if results[b] and a in _partners(params, b)]
        given_up = [b for b in peers if a in results[b].get("missing_peers", {}) or a in results[b].get("gave_up_on", {})]
        if not peers or len(given_up) != len(peers):
            return False
    return True


def _partners(params: dict, agent: str) -> set:
    return set(partners(params["rounds"], agent))


def _coordinator_preflight(plan: Plan) -> list:
    backend = plan.kv_transfer.backend
    tr = plan.kv_transfer.transceiver
    effective = tr.backend if tr is not None else ("NIXL" if backend == "DEFAULT" else backend)
    named = (f"{backend} ({effective} on TensorRT-LLM {plan.target_release or plan.trtllm_version})"
             if backend == "DEFAULT" else backend)  # DEFAULT: UCX on 1.0/1.1, NIXL from 1.2 (resolve_backend)
    if effective == "NIXL":
        status = "pass"
        detail = (f"kv_transfer.backend {named}: TensorRT-LLM moves KV with NIXL over "
                  f"{plan.kv_transfer.transport.nixl_transport}, as validated here")
    elif effective == "UCX":
        status = "pass"
        detail = (f"kv_transfer.backend {named}: TensorRT-LLM uses UCX directly; validated with NIXL over the "
                  "same UCX library, transports and environment")
    else:
        status = "not_present"
        detail = (f"kv_transfer.backend {named}: not a NIXL/UCX path; the transfers validated here "
                  "are NIXL's, not what this recipe would use")
    return [{"name": "recipe_backend", "status": status, "detail": detail, "agent": None, "host": None}]


def _min_fraction(opts: Options, plan: Plan, results: dict) -> float:
    if opts.min_fraction is not None:
        return opts.min_fraction
    mems = {(r or {}).get("memory", {}) and r["memory"]["type"] for r in results.values() if r and r.get("memory")}
    if plan.estimates.transport == Transport.TCP or mems == {"DRAM"}:
        return 0.0  # rehearsal profiles: host memory / TCP say nothing about the production fabric
    return 0.5


MAX_LOCAL_AGENTS = 256  # --local --nodes: the pair schedule is quadratic in the agent count
MAX_LENGTH_TOKENS = 10_000_000


def check_bounds(opts: Options) -> None:
    """Every number of the options within a finite range (NaN and infinity refused): BoundError, exit 2."""
    bounds.finite("--nodes", opts.nodes, 2, MAX_LOCAL_AGENTS)
    bounds.finite("--max-memory-mb", opts.max_memory_mb, 1, 1 << 20)
    bounds.finite("--iterations", opts.iterations, 1, 1_000_000)
    bounds.finite("--warmup", opts.warmup, 0, 1_000_000)
    bounds.finite("--sweep-iterations", opts.sweep_iterations, 1, 1_000_000)
    bounds.finite("--sweep-repeats", opts.sweep_repeats, 1, 1000)
    bounds.finite("--min-fraction", opts.min_fraction, 0.0, 1.0)
    for length in opts.lengths or ():
        bounds.finite("--lengths", length, 1, MAX_LENGTH_TOKENS)
    bounds.wait_seconds("--transfer-timeout", opts.transfer_timeout_s)
    bounds.wait_seconds("--rendezvous-timeout", opts.rendezvous_timeout_s)
    bounds.wait_seconds("--timeout", opts.timeout_s)
    bounds.wait_seconds("--pending-timeout", opts.pending_timeout_s)


def available_memory() -> tuple[int, int] | None:
    """(bytes available, bytes in all) on this machine: /proc/meminfo's MemAvailable and MemTotal (Linux), else
    the free and total physical pages; None where neither can be read."""
    try:
        fields = {}
        for line in files.read_text("/proc/meminfo", 1 << 16).splitlines():
            key, _, value = line.partition(":")
            fields[key] = int(value.split()[0]) * 1024
        return fields["MemAvailable"], fields["MemTotal"]
    except (OSError, ValueError, KeyError, IndexError):
        pass
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
    except (OSError, ValueError, AttributeError):
        return None


def check_local_memory(params: dict) -> None:
    """--local: every agent runs here, each registering its role's KV pool; the pools in host memory (DRAM) must
    together fit the memory this machine has available (a cap above it risks the OOM killer on a shared login node).
    VRAM pools (--memory vram) live on the GPU and are not counted where the agents can check them there (torch or
    CuPy importable here); without either, each keeps a host mirror of its whole pool (validation/memory.py's
    HostMirrorPool), which is counted. --memory auto is counted (its agents fall back to DRAM where no GPU is
    visible). ValidateError with the figures otherwise."""
    if params["memory"] == "vram" and any(importlib.util.find_spec(m) is not None for m in ("torch", "cupy")):
        return
    pools = params["geometry"]["pool_bytes"]
    agents = params["agents"]
    need = sum(int(pools[a["role"]]) for a in agents)
    have = available_memory()
    if have is None or need <= have[0]:
        return
    gib = 1 << 30
    per = ", ".join(f"{pools[r] / gib:.1f} GiB per {'context' if r == Role.CTX else 'generation'} agent"
                    for r in (Role.CTX, Role.GEN) if any(a["role"] == r for a in agents))
    raise ValidateError(f"--local: the {len(agents)} agents would register {need / gib:.1f} GiB of host-memory "
                        "buffers together "
                        f"({per}) and this machine has {have[0] / gib:.1f} GiB available (of {have[1] / gib:.1f} GiB); "
                        "lower --max-memory-mb (the cap per agent) or --lengths, or validate on the cluster")


def _fault_from_environment(plan: Plan, opts: Options) -> None:
    """TK_VALIDATE_FAULT (the fault-injection specs' hook) where --fault was not given."""
    if opts.fault is None and os.environ.get("TK_VALIDATE_FAULT"):
        from toolkit.validate.params import agents_for

        opts.fault = parse_fault(os.environ["TK_VALIDATE_FAULT"], agents_for(plan, opts))


def _coordinator_check(name: str, detail: str) -> dict:
    """A passed preflight check of the coordinator's own (no agent, no host)."""
    return {"name": name, "status": "pass", "detail": detail, "agent": None, "host": None}


def _decide_progress_thread(plan: Plan, opts: Options, nodes: list[str] | None, preflight: list) -> None:
    """NIXL's progress thread polls without pause: right for an agent with a host to itself (as in serving), but
    agents whose Slurm nodes share one machine would starve each other, so it is off there unless forced."""
    shared = launchers.nodes_sharing_a_host(nodes=nodes, partition=plan.slurm.partition)
    opts.progress_thread = not shared
    if shared:
        preflight.append(_coordinator_check(
            "progress_thread", f"off: Slurm nodes {', '.join(shared)} share a host, and busy-polling progress threads "
                               "would starve each other (--progress-thread forces it)"))


def _agents_python(plan: Plan, opts: Options) -> str:
    """The interpreter that runs agent.pyz: --python, else the container's python3, else this one (--local and bare
    nodes share this machine's or the cluster's install)."""
    return opts.python or ("python3" if plan.slurm.container_image and opts.mode != "local" else sys.executable)


def _launch_preflight(plan: Plan, opts: Options, run_dir: Path, preflight: list):
    """What is checked before anything is written: Slurm's preflight (slurm mode: returns its launcher; the other
    modes' launchers need the params, so None), the allocation (--in-allocation) and the progress-thread decision
    where --progress-thread left it open."""
    launcher = None
    if opts.mode == "slurm":
        launcher = launchers.SlurmLauncher(run_dir, plan, opts.pending_timeout_s or plan.slurm.pending_timeout_s)
        preflight.append(_coordinator_check("slurm", launcher.preflight()))
    # --in-allocation outside an allocation (or in one too small) is refused here, whatever --progress-thread says
    nodes = launchers.InAllocationLauncher.allocation_nodes(plan.node_count) if opts.mode == "in-allocation" else None
    if opts.progress_thread is None and opts.mode != "local":
        _decide_progress_thread(plan, opts, nodes, preflight)
    return launcher


def _prepare(plan: Plan, opts: Options, run_dir: Path, python: str, launcher, preflight: list) -> tuple:
    """The params, the launcher of every mode, and the run directory's files: (launcher, params)."""
    params = build_params(plan, opts, str(run_dir))
    if opts.mode == "local":
        check_local_memory(params)
        launcher = launchers.LocalLauncher(run_dir, params, python)
    elif opts.mode == "in-allocation":
        launcher = launchers.InAllocationLauncher(run_dir, params, python, _srun_flags(plan), plan.node_count)
        preflight.append(_coordinator_check("allocation", f"job {launcher.job_id}: {', '.join(launcher.nodes)}"))
    for sub in ("logs", "results", "state", "rendezvous/exited", "rendezvous/done", "rendezvous/unresponsive"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    build_agent_archive(run_dir)
    files.write_regular_atomically(run_dir / "params.json", json.dumps(params, indent=1) + "\n")
    if opts.mode == "slurm":
        minutes = int((opts.timeout_s + params["timeouts"]["rendezvous_s"] + 180) // 60) + 1
        files.write_regular_atomically(run_dir / "validate.sbatch", launchers.render_sbatch(
            plan, params, run_dir, python, _srun_flags(plan), f"{minutes}"))
    return launcher, params


def _show_progress(launcher, params: dict, results: dict, exits: dict, progress: Callable) -> None:
    if launcher.running:
        pairs = merge_pairs(params, results, exits, 0.0, final=False)
        progress("running", pairs, sum(1 for r in results.values() if r), len(results))
    else:
        progress(f"{launcher.describe()} pending")


def _watch(launcher, run_dir: Path, params: dict, opts: Options, progress: Callable) -> str | None:
    """Start the agents and poll until they settle; why the run ended before that (the launcher's reason, or the
    --timeout counted from when the agents run), or None."""
    launcher.start()
    progress("submitted" if opts.mode == "slurm" else "starting agents")
    deadline = None
    while True:
        reason = launcher.poll()
        if launcher.running and deadline is None:
            deadline = time.monotonic() + opts.timeout_s + GRACE_S
        results, exits = gather(run_dir, params)
        _show_progress(launcher, params, results, exits, progress)
        if launcher.running and _settled(params, results, exits):
            return None
        if reason:
            time.sleep(1.0)  # let the last result files land
            results, exits = gather(run_dir, params)
            return None if _settled(params, results, exits) else reason
        if deadline is not None and time.monotonic() > deadline:
            return f"timed out after {opts.timeout_s:g}s (--timeout)"
        time.sleep(POLL_S)


def _plan_info(plan: Plan) -> dict:
    """What the plan expects of the longest request, for the report's comparison with what was measured."""
    kv, est = plan.kv, plan.estimates
    return {"largest_request_tokens": kv.largest_request_tokens,
            "largest_request_bytes_per_rank": kv.ctx_bytes_per_token_per_rank * kv.largest_request_tokens,
            "largest_request_transfer_ms": est.largest_request_transfer_ms,
            "largest_request_prefill_ms": est.largest_request_prefill_ms}


@dataclass(frozen=True)
class _Outcome:
    """How a run went, as the report records it."""

    started: float  # time.time() at the start
    duration_s: float
    ended: str | None  # why the run ended before the agents settled, or None
    cleanup: list[str]  # what could not be released


def _write_report(plan: Plan, opts: Options, run_dir: Path, params: dict, launcher, preflight: list,
                  outcome: _Outcome) -> dict:
    """Gather the agents' results into the report, written to RUN_DIR/report.json."""
    report_path = run_dir / "report.json"
    results, exits = gather(run_dir, params)
    if outcome.ended:
        preflight.append({"name": "run", "status": "fail", "detail": f"{launcher.describe()}: {outcome.ended}",
                          "agent": None, "host": None})
    run = {"mode": opts.mode, "recipe_file": plan.recipe_file, "run_dir": str(run_dir),
           "report_file": str(report_path), "job_id": launcher.job_id,
           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(outcome.started)),
           "duration_s": round(outcome.duration_s, 3),
           "cleanup": {"released": not outcome.cleanup, "problems": outcome.cleanup}}
    report = build_report(params=params, results=results, exits=exits, coordinator_preflight=preflight,
                          plan_info=_plan_info(plan), min_fraction=_min_fraction(opts, plan, results), run=run)
    if outcome.cleanup:
        report["passed"] = False
        report["failures"].append("cleanup: " + "; ".join(outcome.cleanup))
    files.write_regular_atomically(report_path, json.dumps(report, indent=2) + "\n")
    return report


def validate(plan: Plan, opts: Options, on_progress: Callable | None = None) -> dict:
    """Run the whole validation; return the report (also written to RUN_DIR/report.json). Ctrl-C, SIGTERM
    and SIGHUP release the agents or the job, write the report, then propagate."""
    check_bounds(opts)
    started = time.time()
    t0 = time.monotonic()
    _fault_from_environment(plan, opts)
    run_dir = new_run_dir(plan, opts.run_dir).resolve()
    preflight = _coordinator_preflight(plan)
    python = _agents_python(plan, opts)
    try:
        launcher = _launch_preflight(plan, opts, run_dir, preflight)
    except BaseException:
        rundir.release_if_unused(run_dir)  # refused before anything started: leave nothing behind
        raise
    try:
        launcher, params = _prepare(plan, opts, run_dir, python, launcher, preflight)
    except OSError as exc:  # a full disk or a read-only run directory before anything started
        rundir.release_if_unused(run_dir)
        raise ValidateError(f"{run_dir}: cannot prepare the validation run ({exc.strerror or exc})") from None
    except BaseException:
        rundir.release_if_unused(run_dir)
        raise

    ended = None
    cleanup: list[str] = []
    interrupted: KeyboardInterrupt | None = None
    try:
        with signals.interrupt_on_termination():
            ended = _watch(launcher, run_dir, params, opts, on_progress or (lambda *a, **k: None))
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP: release everything, still write the report
        ended = f"interrupted by {exc}" if isinstance(exc, signals.Terminated) else "interrupted"
        interrupted = exc
    except (TkError, OSError) as exc:  # sbatch refused, an agent that could not start ...: still write the report
        ended = str(exc)
    finally:
        with signals.deferred():
            cleanup = launcher.stop()
    with signals.deferred():
        report = _write_report(plan, opts, run_dir, params, launcher, preflight,
                               _Outcome(started, time.monotonic() - t0, ended, cleanup))
    if interrupted is not None:
        raise interrupted
    return report
