"""Where a deployment runs: a Slurm cluster, or this machine. Both run the same rendered launch.sbatch, which
starts the job's orchestrator (job.pyz: start-up, health waits, supervision and teardown, written once in the
`orchestrator` package); a backend only starts the job, reads its state and ends it.

    preflight(plan)   refuse early, with a clear reason, what cannot run (missing Slurm, ports in use...)
    submit(run)       start the job; record its id (Slurm job id / local session) in the run record
    job_state(run)    PENDING | RUNNING | ENDED, with a detail
    stop(run)         end it and wait, bounded, until every process it started is gone
    log_name          the component whose log holds the job's own output, for failure messages

The local backend runs launch.sbatch with bash under a small shim (local_shim/: srun, scontrol, scancel,
hostname) in a new session: the job's session plus its TK_RUN_ID are exactly what it owns.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Protocol

from toolkit.errors import TkError
from toolkit.launch.run import RunRecord
from toolkit.plan.model import Plan
from toolkit.runtime import files, ports, procs, signals, slurm
from toolkit.runtime.rundir import wait_until
from toolkit.runtime.slurm import JobState

SHIM = Path(__file__).resolve().parent / "local_shim"
SHIM_COMMANDS = ("srun", "scontrol", "scancel", "squeue", "hostname")
LOCAL_JOB_LOG = "job"  # logs/job.log: the local job's own output (Slurm's is slurm-JOBID.out)
# Every node of a local run is this machine on loopback, and so is UCX's: without this, each server's UCX TCP
# transport (NIXL's, moving the KV) listens on every interface (UCX_NET_DEVICES, default "all"), whatever this
# shell exports. A recipe's own kv_transfer.net_devices (its role env, sourced in the step) still wins.
LOOPBACK_ONLY = {"UCX_NET_DEVICES": "lo"}


PORT_WAIT_S = 5.0  # how long the local preflight waits for a port held by a connection (not a listener) to free


class LaunchError(TkError):
    pass


def _run_holding(port: int) -> str | None:
    """The name of a tk run that is (or was, as last recorded) serving on ``port``, if any."""
    from toolkit.launch.run import all_runs

    for run in reversed(all_runs()):
        if run.state in ("submitted", "pending", "starting", "ready", "degraded") and \
                any(s.port == port for s in run.servers):
            return run.name
    return None


class Backend(Protocol):
    name: str
    log_name: str | None

    def preflight(self, plan: Plan) -> None: ...

    def submit(self, run: RunRecord) -> None: ...

    def job_state(self, run: RunRecord) -> JobState: ...

    def stop(self, run: RunRecord) -> list[str]: ...


class SlurmBackend:
    name = "slurm"
    log_name = None

    def preflight(self, plan: Plan) -> None:
        try:
            slurm.check_cluster(plan.slurm.partition, plan.slurm.nodes)
        except slurm.SlurmError as exc:
            raise LaunchError(str(exc)) from None

    def submit(self, run: RunRecord) -> None:
        # A signal between sbatch's answer and the job id in the record would leave the job unwatched: it waits
        # (deferred) until the id is recorded, then ends the launch, which cancels that job.
        with signals.deferred():
            try:
                job_id = slurm.submit_batch(run.path / "launch.sbatch", run.path)
            except slurm.SlurmError as exc:
                raise LaunchError(str(exc)) from None
            run.job_id = job_id
            run.set_state("submitted", f"job {job_id}")

    def job_state(self, run: RunRecord) -> JobState:
        return slurm.job_state(run.job_id)

    def stop(self, run: RunRecord, timeout_s: float = 60.0) -> list[str]:
        # Slurm ends every step of a cancelled job on every node: the job id is all this run owns.
        return slurm.cancel_and_wait(run.job_id, timeout_s)


class LocalBackend:
    name = "local"
    log_name = LOCAL_JOB_LOG

    def preflight(self, plan: Plan) -> None:
        # Every port the run binds, the etcd client, peer and gateway ports included, each with the setting that
        # moves it: a port taken there would otherwise fail the job later with etcd's or the gateway's bind error.
        wanted = plan.bound_ports
        listening = ports.listening_ports()
        for b in wanted:
            if b.port in listening:
                holder = _run_holding(b.port)
                raise LaunchError(f"port {b.port} ({b.what}) is already in use on this machine: something listens on "
                                  "it" + (f" (the tk run {holder}: `tk stop {holder}`)" if holder else
                                          f"; stop what holds it (`ss -ltnp 'sport = :{b.port}'`)")
                                  + f", or move {b.setting}")
        for b in wanted:
            name, port, move = b.what, b.port, f"move {b.setting}"
            # Servers bind with SO_REUSEADDR, so a port whose last connections linger in TIME_WAIT is free for them.
            # Nothing listens here; a bind can still fail while a live connection's local end holds the port (a
            # client's ephemeral source port): wait for it to close, bounded, then say what it is.
            if not wait_until(lambda port=port: ports.bindable(port), PORT_WAIT_S, 0.2):
                span = ports.ephemeral_range()
                where = (f" (this machine's ephemeral ports are {span[0]}-{span[1]}: outgoing connections take "
                         "their source ports there)" if span else "")
                raise LaunchError(f"port {port} ({name}) is held on this machine by the local end of a connection, "
                                  f"not by a listener{where}; a server cannot bind it until that connection "
                                  f"closes: {move}" + (" outside that range" if span else ""))
        if shutil.which("bash") is None:
            raise LaunchError("bash not found: the local backend runs launch.sbatch with bash")

    def submit(self, run: RunRecord) -> None:
        bin_dir = run.path / "local" / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        for name in SHIM_COMMANDS:
            files.write_regular_atomically(bin_dir / name, (SHIM / name).read_bytes(), 0o755, sync=False)
        run.run_id = run.run_id or uuid.uuid4().hex
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               "TK_RUN_DIR": str(run.path), "TK_LOCAL_NODES": str(run.nodes),
               "SLURM_JOB_ID": f"local-{run.run_id[:12]}", "SLURM_JOB_NODELIST": "local",
               **LOOPBACK_ONLY}
        (run.path / "logs").mkdir(exist_ok=True)
        try:
            proc = procs.start_group(["bash", str(run.path / "launch.sbatch")], cwd=run.path, env=env,
                                     log_path=run.log_path(LOCAL_JOB_LOG), run_id=run.run_id)
        except OSError as exc:
            raise LaunchError(f"could not start the local job: {exc}") from None
        run.job_id, run.job_pid = env["SLURM_JOB_ID"], proc.pid
        run.set_state("submitted", f"local job, session {proc.pid}")

    def job_state(self, run: RunRecord) -> JobState:
        left = procs.members(run.job_pid, run.run_id or "")
        if not left and procs.leads_session(run.job_pid):
            # Its batch script leads its session but its TK_RUN_ID could not be read (a process caught between
            # exec and a readable /proc/PID/environ on a loaded machine): still running, not ended.
            return JobState("RUNNING", f"session {run.job_pid}")
        if not left:
            return JobState("ENDED", "the local job has exited")
        if run.job_pid in left:
            return JobState("RUNNING", f"session {run.job_pid}")
        return JobState("RUNNING", f"its batch script is gone; {len(left)} of its processes still run",
                        unsupervised=True)

    def stop(self, run: RunRecord, timeout_s: float = 30.0) -> list[str]:
        left = procs.terminate(run.job_pid, run.run_id or "", grace_s=timeout_s)
        return [f"processes of the local job still running after SIGKILL: {left}"] if left else []


def backend_for(name: str) -> Backend:
    return {"slurm": SlurmBackend, "local": LocalBackend}[name]()
