"""Every Slurm client call tk makes, each bounded in time, with errors a user can act on."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import TkError

COMMAND_TIMEOUT_S = 30
SLURM_COMMANDS = ("sbatch", "squeue", "scancel", "scontrol", "sinfo")


class SlurmError(TkError):
    """A Slurm command is missing, hung, or refused what tk asked."""


@dataclass(frozen=True)
class JobState:
    phase: str  # PENDING | RUNNING | ENDED
    detail: str = ""
    # RUNNING, but the job's orchestrator (its batch script) is gone while processes it started run: nothing
    # supervises them (locally; on Slurm the batch script's end ends the job and every step)
    unsupervised: bool = False


def run_slurm_command(cmd: list[str], timeout: float = COMMAND_TIMEOUT_S, check: bool = True,
                      env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a Slurm client command with a bound; a missing command or a hang is a clear error."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env=None if env is None else {**os.environ, **env})
    except FileNotFoundError:
        raise SlurmError(f"`{cmd[0]}` not found: Slurm's client commands are not installed here "
                         "(use --local, or run on a Slurm login node; scripts/dev-slurm up gives a local cluster)"
                         ) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(cmd)}` did not answer within {timeout:g}s: is slurmctld reachable?") from None
    if check and proc.returncode != 0:
        raise SlurmError(f"`{' '.join(cmd)}` failed: {(proc.stderr or proc.stdout).strip()}")
    return proc


def submit_batch(script: Path, run_dir: Path, what: str = "the job") -> str:
    """sbatch SCRIPT in run_dir; the job id. TK_RUN_DIR travels in the environment (--export=ALL), not in
    --export's comma-separated list, so that any directory name arrives intact.

    The job carries a unique --comment, so that when sbatch does not answer in time (it may have queued the
    job all the same) the job is found and cancelled rather than left running with nobody watching it."""
    tag = f"tk-submit-{uuid.uuid4().hex}"
    try:
        proc = run_slurm_command(["sbatch", "--parsable", f"--chdir={run_dir}", "--export=ALL", f"--comment={tag}",
                                  str(script)], check=False, env={"TK_RUN_DIR": str(run_dir)})
    except SlurmError as exc:
        raise SlurmError(f"{exc}{_cancel_tagged(tag)}") from None
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip()
        hint = ""
        if "account" in msg.lower():
            hint = " (check cluster.account)"
        elif "generic resource" in msg.lower():
            hint = (" (the partition has no such GPU gres: set cluster.gpu_request to gpus-per-node, or none where "
                    "devices are not confined)")
        elif "partition" in msg.lower():
            hint = " (check cluster.partition)"
        raise SlurmError(f"sbatch refused {what}: {msg}{hint}")
    job_id = proc.stdout.strip().split(";")[0]
    if not JOB_ID.fullmatch(job_id):
        raise SlurmError(f"sbatch answered {proc.stdout.strip()[:200]!r}, not a job id{_cancel_tagged(tag)}")
    return job_id


def _cancel_tagged(tag: str) -> str:
    """Cancel any job whose comment is tag (an sbatch that timed out may have queued it); what was done."""
    try:
        rows = run_slurm_command(["squeue", "-h", "-o", "%i|%k"], check=False).stdout.splitlines()
        ids = [row.split("|", 1)[0] for row in rows if row.partition("|")[2].strip() == tag
               and JOB_ID.fullmatch(row.split("|", 1)[0])]
        for job_id in ids:
            run_slurm_command(["scancel", job_id], check=False)
    except SlurmError:
        return f"; could not check whether it queued a job (look for comment {tag} in squeue and scancel it)"
    return f"; cancelled job(s) {', '.join(ids)} it had queued" if ids else "; it queued no job"


# squeue's job states (squeue(1), JOB STATE CODES): waiting ones, and the final ones it still lists briefly.
WAITING_STATES = ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD")
FINAL_STATES = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
                "OUT_OF_MEMORY", "SPECIAL_EXIT", "REVOKED")


def _unknown_job(proc: subprocess.CompletedProcess) -> bool:
    return "invalid job id" in (proc.stderr + proc.stdout).lower()


JOB_ID = re.compile(r"[0-9]{1,20}(_[0-9]{1,10})?")


def _checked(job_id: str) -> str:
    """A Slurm job id as sbatch prints it, or SlurmError: never an option for squeue / scancel / scontrol."""
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise SlurmError(f"{str(job_id)[:60]!r} is not a Slurm job id (digits, or digits_digits); tk passes nothing "
                         "else to scancel")
    return job_id


def job_state(job_id: str | None) -> JobState:
    """PENDING, RUNNING or ENDED (with squeue's reason or the final state) for one job id. A controller
    that does not answer is a SlurmError, never "the job ended"."""
    if not job_id:
        return JobState("ENDED", "never submitted")
    _checked(job_id)
    proc = run_slurm_command(["squeue", "-h", "-j", job_id, "-o", "%T|%R"], check=False)
    line = proc.stdout.strip()
    if proc.returncode == 0 and line:
        state, _, reason = line.partition("|")
        if state in WAITING_STATES:
            # squeue's %R: "(Resources)", "(Priority)", or "(None)" before the scheduler looked at it
            reason = reason.strip().strip("()")
            detail = "waiting for the scheduler" if reason in ("", "None") else reason
            return JobState("PENDING", detail if state in ("PENDING", "CONFIGURING") else f"{state}: {detail}")
        if state in FINAL_STATES:
            return JobState("ENDED", state)
        # RUNNING, COMPLETING, and the states of a job that still holds its nodes (SUSPENDED, STOPPED,
        # SIGNALING, STAGE_OUT, RESIZING ...): as long as squeue lists it, it has not ended.
        return JobState("RUNNING", state)
    if proc.returncode != 0 and not _unknown_job(proc):
        raise SlurmError(f"squeue could not tell the state of job {job_id} "
                         f"({(proc.stderr or proc.stdout).strip() or 'exit code ' + str(proc.returncode)}); "
                         "is slurmctld reachable?")
    show = run_slurm_command(["scontrol", "show", "job", "-o", job_id], check=False)
    for field in show.stdout.split():
        if field.startswith("JobState="):
            return JobState("ENDED", field.split("=", 1)[1])
    if show.returncode != 0 and not _unknown_job(show):
        raise SlurmError(f"scontrol could not tell the state of job {job_id} "
                         f"({(show.stderr or show.stdout).strip()}); is slurmctld reachable?")
    return JobState("ENDED", "no longer known to Slurm")


def cancel_and_wait(job_id: str | None, timeout_s: float = 60.0, poll_s: float = 1.0) -> list[str]:
    """scancel the job and wait (bounded) until it has left squeue; the problems, if any."""
    if not job_id:
        return []
    _checked(job_id)
    deadline = time.monotonic() + timeout_s
    problem = None
    while time.monotonic() <= deadline:
        try:
            if problem is None or problem.startswith("scancel"):
                run_slurm_command(["scancel", job_id], check=False)
            if job_state(job_id).phase == "ENDED":
                return []
            problem = f"job {job_id} still in squeue after {timeout_s:g}s of scancel"
        except SlurmError as exc:
            problem = f"scancel {job_id} could not be confirmed ({exc}); check `squeue -j {job_id}`"
        time.sleep(poll_s)
    return [problem or f"job {job_id} still in squeue after {timeout_s:g}s of scancel"]


def check_cluster(partition: str | None, nodes: int) -> None:
    """Refuse early, with the reason, a cluster that cannot run `nodes` nodes in `partition`: client commands
    missing, controller down, partition unknown, down or too small."""
    for cmd in SLURM_COMMANDS:
        if shutil.which(cmd) is None:
            raise SlurmError(f"`{cmd}` not found: Slurm's client commands are not installed here "
                             "(use --local, or scripts/dev-slurm up for a local cluster)")
    ping = run_slurm_command(["scontrol", "ping"], timeout=15, check=False)
    if ping.returncode != 0 or "UP" not in ping.stdout:
        said = next((line.strip() for line in (ping.stdout + ping.stderr).splitlines()
                     if line.strip() and not line.startswith("*")), "no output")  # skip its banner
        raise SlurmError(f"the Slurm controller does not answer (`scontrol ping`: {said}); "
                         "check slurmctld and SLURM_CONF")
    rows = run_slurm_command(["sinfo", "-h", "-o", "%P|%D|%a"]).stdout.split()
    partitions = {}
    default = None
    for row in rows:
        name, count, avail = (row.split("|") + ["", ""])[:3]
        if name.endswith("*"):
            name = name[:-1]
            default = name
        partitions[name] = (int(count) if count.isdigit() else 0, avail)
    wanted = partition or default
    if partition and partition not in partitions:
        raise SlurmError(f"partition {partition!r} does not exist on this cluster "
                         f"(partitions: {', '.join(sorted(partitions)) or 'none'}); fix cluster.partition")
    if wanted in partitions:
        count, avail = partitions[wanted]
        if avail not in ("up", ""):
            raise SlurmError(f"partition {wanted!r} is {avail}")
        if nodes > count:
            raise SlurmError(f"the recipe needs {nodes} nodes but partition {wanted!r} has {count}; "
                             "shrink the roles or pick a bigger partition")


def hostnames(nodelist: str) -> list[str]:
    """Expand a Slurm node list (node[0-3]) with scontrol; bounded."""
    names = run_slurm_command(["scontrol", "show", "hostnames", nodelist]).stdout.split()
    if not names:
        raise SlurmError(f"`scontrol show hostnames {nodelist}` returned nothing")
    return names


def nodes_sharing_a_host(nodes: list[str] | None = None, partition: str | None = None) -> list[str]:
    """The Slurm nodes (of `nodes`, else of `partition`) whose host also runs another node's slurmd, as on
    scripts/dev-slurm's one-machine cluster; empty when each node is a host of its own or Slurm cannot say."""
    argv = ["sinfo", "-h", "-N", "-o", "%N|%n"]
    if nodes:
        argv += ["-n", ",".join(nodes)]
    elif partition:
        argv += ["-p", partition]
    try:
        out = run_slurm_command(argv, check=False).stdout
    except SlurmError:
        return []
    by_host: dict[str, set[str]] = {}
    for line in out.splitlines():
        name, _, host = line.partition("|")
        if name.strip() and host.strip():
            by_host.setdefault(host.strip(), set()).add(name.strip())
    return sorted(n for names in by_host.values() if len(names) > 1 for n in names)
