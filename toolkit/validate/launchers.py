"""Where the agents run: processes on this machine (--local), srun steps inside the current allocation
(--in-allocation), or a Slurm job of their own (the default). One small interface:

    start()  start every agent
    poll()   None while it may still run; else why it ended (job ended, pending too long ...)
    running  whether the agents have started (a Slurm job may pend first)
    stop()   end whatever is left (process groups / srun steps / scancel) and wait, bounded; problems

Every agent runs under a tiny bash wrapper that records its exit code in rendezvous/exited/AGENT, so
peers notice a dead agent in well under a second instead of waiting for a timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from toolkit.runtime import files, signals, slurm
from toolkit.validate.params import ValidateError
from toolkit.render.escape import environment

# $1 python  $2 agent.pyz  $3 params.json  $4 agent id  $5 exit marker
WRAPPER = ('"$1" "$2" "$3" "$4"; rc=$?; printf "%s\\n" "$rc" > "$5.tmp.$$" && mv -f "$5.tmp.$$" "$5"; exit "$rc"')


def agent_argv(run_dir: Path, python: str, agent_id: str) -> list[str]:
    return ["bash", "-c", WRAPPER, "tk-validate-agent", python, str(run_dir / "agent.pyz"),
            str(run_dir / "params.json"), agent_id, str(run_dir / "rendezvous" / "exited" / agent_id)]


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _Processes:
    """Agents as child processes, each in its own session so its whole group can be ended."""

    def __init__(self, run_dir: Path, params: dict, python: str):
        self.run_dir, self.params, self.python = run_dir, params, python
        self.procs: dict[str, subprocess.Popen] = {}
        self.running = False
        self.job_id = None

    def argv(self, agent: dict) -> list[str]:
        return agent_argv(self.run_dir, self.python, agent["id"])

    def start(self) -> None:
        for agent in self.params["agents"]:
            with files.open_append(self.run_dir / "logs" / f"{agent['id']}.log") as log:
                try:
                    self.procs[agent["id"]] = subprocess.Popen(
                        self.argv(agent), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        cwd=self.run_dir, start_new_session=True, env=self.env())
                except OSError as exc:
                    raise ValidateError(f"could not start agent {agent['id']}: {exc}") from None
        self.running = True

    def env(self) -> dict | None:
        """The agents' environment: this one (None)."""
        return None

    def poll(self) -> str | None:
        if self.procs and all(p.poll() is not None for p in self.procs.values()):
            return "every agent process has exited"
        return None

    def stop(self, grace_s: float = 5.0) -> list[str]:
        alive = [p for p in self.procs.values() if p.poll() is None]
        for p in alive:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in alive:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        left = [aid for aid, p in self.procs.items() if p.poll() is None]
        return [f"agent processes still running: {', '.join(left)}"] if left else []

    def describe(self) -> str:
        return f"{len(self.procs)} local agent process(es)"


class LocalLauncher(_Processes):
    name = "local"

    def env(self) -> dict | None:
        """Agents on this machine move bytes over loopback only: UCX's TCP transport listens on no other interface
        (over an UCX_NET_DEVICES exported here, which may name a cluster's devices)."""
        return {**os.environ, "UCX_NET_DEVICES": "lo"}


class InAllocationLauncher(_Processes):
    """srun one step per agent on the nodes of the allocation this command runs in."""

    name = "in-allocation"

    def __init__(self, run_dir: Path, params: dict, python: str, srun_flags: list[str], needed_nodes: int):
        super().__init__(run_dir, params, python)
        self.srun_flags = srun_flags
        self.job_id = os.environ.get("SLURM_JOB_ID")
        self.nodes = self.allocation_nodes(needed_nodes)

    @staticmethod
    def allocation_nodes(needed_nodes: int) -> list[str]:
        """The node names of the allocation this command runs in; an error if there is none or it is too small."""
        job_id = os.environ.get("SLURM_JOB_ID")
        nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
        if not job_id or not nodelist:
            raise ValidateError("--in-allocation needs SLURM_JOB_ID and SLURM_JOB_NODELIST: run it inside salloc or "
                                "an sbatch script (or drop --in-allocation to submit a job)")
        nodes = hostnames(nodelist)
        if len(nodes) < needed_nodes:
            raise ValidateError(f"the allocation (job {job_id}) has {len(nodes)} node(s) "
                                f"({', '.join(nodes)}); the recipe needs {needed_nodes}")
        return nodes

    def argv(self, agent: dict) -> list[str]:
        return ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={self.nodes[agent['node']]}",
                f"--job-name=tk-validate-{agent['id']}", *self.srun_flags, *super().argv(agent)]

    def describe(self) -> str:
        return f"srun steps in job {self.job_id} on {', '.join(self.nodes[: max(a['node'] for a in self.params['agents']) + 1])}"


def hostnames(nodelist: str) -> list[str]:
    """Expand a Slurm node list (node[0-3]) with scontrol; bounded."""
    try:
        return slurm.hostnames(nodelist)
    except slurm.SlurmError as exc:
        raise ValidateError(str(exc)) from exc


nodes_sharing_a_host = slurm.nodes_sharing_a_host


def render_sbatch(plan, params: dict, run_dir: Path, python: str, srun_flags: list[str], time_limit: str) -> str:
    env = environment()
    per_node: dict[int, int] = {}
    for a in params["agents"]:
        per_node[a["node"]] = per_node.get(a["node"], 0) + 1
    return env.get_template("validate.sbatch.j2").render(
        name=plan.name, job_name=f"tk-validate-{plan.name}", nodes=plan.node_count,
        tasks_per_node=max(per_node.values()), partition=plan.slurm.partition, account=plan.slurm.account,
        time_limit=time_limit, run_dir=str(run_dir), agents=params["agents"], python=python,
        wrapper=WRAPPER, srun_flags=srun_flags, timeout_s=int(params["timeouts"]["deadline_s"]) + 60,
        # the recipe's GPU request, --exclusive and extra #SBATCH arguments, as launch.sbatch has them
        extra_sbatch=(*plan.slurm.gpu_directives, *plan.slurm.sbatch_args))


CONTROLLER_GRACE_S = 120  # as launch: how long an unresponsive slurmctld is waited for


class SlurmLauncher:
    """A Slurm job of its own: validate.sbatch runs one srun step per agent on the recipe's nodes."""

    name = "slurm"

    def __init__(self, run_dir: Path, plan, pending_timeout_s: float):
        self.run_dir = run_dir
        self.pending_timeout_s = pending_timeout_s
        self.job_id = None
        self.running = False
        self.submitted = None
        self._polled = 0.0
        self._unreachable_since = None
        self.plan = plan

    def preflight(self) -> str:
        try:  # sbatch/squeue present, controller up, partition big enough
            slurm.check_cluster(self.plan.slurm.partition, self.plan.node_count)
        except slurm.SlurmError as exc:
            raise ValidateError(str(exc)) from exc
        return (f"Slurm controller up; partition {self.plan.slurm.partition or '(default)'} can hold "
                f"{self.plan.node_count} node(s)")

    def start(self) -> None:
        with signals.deferred():  # the job id is kept before a signal can end the command (then it is cancelled)
            try:
                self.job_id = slurm.submit_batch(self.run_dir / "validate.sbatch", self.run_dir, "the validation job")
            except slurm.SlurmError as exc:
                raise ValidateError(str(exc)) from exc
        self.submitted = time.monotonic()

    def _state(self) -> slurm.JobState:
        try:
            return slurm.job_state(self.job_id)
        except slurm.SlurmError as exc:
            raise ValidateError(str(exc)) from exc

    def poll(self) -> str | None:
        now = time.monotonic()
        if now - self._polled < 2.0:  # squeue at most every 2 s
            return None
        self._polled = now
        try:
            state = self._state()
            self._unreachable_since = None
        except ValidateError as exc:
            # A controller that stops answering is not a job that ended: wait (bounded) for it to come back.
            self._unreachable_since = self._unreachable_since or now
            if now - self._unreachable_since > CONTROLLER_GRACE_S:
                return f"the Slurm controller has not answered for {CONTROLLER_GRACE_S:g}s: {exc}"
            return None
        if state.phase == "PENDING":
            if time.monotonic() - self.submitted > self.pending_timeout_s:
                return (f"job {self.job_id} still pending after {self.pending_timeout_s:g}s ({state.detail}); "
                        "raise cluster.pending_timeout_s or --pending-timeout")
            return None
        if state.phase == "RUNNING":
            self.running = True
            return None
        self.running = True
        return f"job {self.job_id} ended ({state.detail})"

    def stop(self, timeout_s: float = 60.0) -> list[str]:
        try:
            return slurm.cancel_and_wait(self.job_id, timeout_s)
        except slurm.SlurmError as exc:
            return [f"job {self.job_id}: {exc}"]

    def describe(self) -> str:
        return f"Slurm job {self.job_id}"
