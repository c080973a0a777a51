"""Where a deployment runs: a Slurm cluster, or processes on this machine. One small interface.

    preflight(plan)   refuse early, with a clear reason, what cannot run (missing Slurm, ports in use...)
    submit(run, plan) start it; remember the job id / supervisor pid in the run record
    job_state(run)    PENDING | RUNNING | ENDED, with a detail
    stop(run)         end it and wait, bounded, until it is gone
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import TkError
from toolkit.launch.run import RunRecord
from toolkit.launch.supervisor import LOCAL_PLAN
from toolkit.plan.model import Plan
from toolkit.render import proxy_command, worker_command

COMMAND_TIMEOUT_S = 30


@dataclass(frozen=True)
class JobState:
    phase: str  # PENDING | RUNNING | ENDED
    detail: str = ""


class LaunchError(TkError):
    pass


def run_slurm_command(cmd: list[str], timeout: float = COMMAND_TIMEOUT_S, check: bool = True,
                      env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a Slurm client command with a bound; a missing command or a hang is a clear error."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env=None if env is None else {**os.environ, **env})
    except FileNotFoundError:
        raise LaunchError(f"`{cmd[0]}` not found: Slurm's client commands are not installed here "
                          "(use --local, or run on a Slurm login node; scripts/dev-slurm up gives a local cluster)"
                          ) from None
    except subprocess.TimeoutExpired:
        raise LaunchError(f"`{' '.join(cmd)}` did not answer within {timeout:g}s: is slurmctld reachable?") from None
    if check and proc.returncode != 0:
        raise LaunchError(f"`{' '.join(cmd)}` failed: {(proc.stderr or proc.stdout).strip()}")
    return proc


def submit_batch(script: Path, run_dir: Path, what: str = "the job") -> str:
    """sbatch SCRIPT in run_dir; the job id. TK_RUN_DIR travels in the environment (--export=ALL), not in
    --export's comma-separated list, so that any directory name arrives intact."""
    proc = run_slurm_command(["sbatch", "--parsable", f"--chdir={run_dir}", "--export=ALL", str(script)],
                             check=False, env={"TK_RUN_DIR": str(run_dir)})
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip()
        hint = ""
        if "account" in msg.lower():
            hint = " (check cluster.account)"
        elif "partition" in msg.lower():
            hint = " (check cluster.partition)"
        raise LaunchError(f"sbatch refused {what}: {msg}{hint}")
    return proc.stdout.strip().split(";")[0]


# A run's own processes name its directory and one of these (a user's `less logs/x.log` does not).
_RUN_PROCESS_MARKS = ("--extra_llm_api_options", "disagg.resolved.yaml", "toolkit.launch.supervisor", "srun",
                      "toolkit.validate")


def processes_mentioning(text: str) -> list[int]:
    """PIDs of this run's processes on this machine: the command line names text and is one of ours."""
    out = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and any(mark in cmdline for mark in _RUN_PROCESS_MARKS):
            out.append(int(entry.name))
    return out


def _kill_leftovers(run: RunRecord, wait_s: float = 10.0) -> list[int]:
    """Terminate (then kill) any process still running from this run directory; return what survived."""
    pids = processes_mentioning(run.run_dir)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s / 2
        while time.monotonic() < deadline:
            pids = [p for p in processes_mentioning(run.run_dir) if _alive(p)]
            if not pids:
                return []
            time.sleep(0.2)
    return pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


class SlurmBackend:
    name = "slurm"

    def preflight(self, plan: Plan) -> None:
        for cmd in ("sbatch", "squeue", "scancel", "scontrol", "sinfo"):
            if shutil.which(cmd) is None:
                raise LaunchError(f"`{cmd}` not found: Slurm's client commands are not installed here "
                                  "(use --local, or scripts/dev-slurm up for a local cluster)")
        ping = run_slurm_command(["scontrol", "ping"], timeout=15, check=False)
        if ping.returncode != 0 or "UP" not in ping.stdout:
            said = next((line.strip() for line in (ping.stdout + ping.stderr).splitlines()
                         if line.strip() and not line.startswith("*")), "no output")  # skip its banner
            raise LaunchError(f"the Slurm controller does not answer (`scontrol ping`: {said}); "
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
        wanted = plan.slurm.partition or default
        if plan.slurm.partition and plan.slurm.partition not in partitions:
            raise LaunchError(f"partition {plan.slurm.partition!r} does not exist on this cluster "
                              f"(partitions: {', '.join(sorted(partitions)) or 'none'}); fix cluster.partition")
        if wanted in partitions:
            count, avail = partitions[wanted]
            if avail not in ("up", ""):
                raise LaunchError(f"partition {wanted!r} is {avail}")
            if plan.slurm.nodes > count:
                raise LaunchError(f"the recipe needs {plan.slurm.nodes} nodes but partition {wanted!r} has {count}; "
                                  "shrink the roles or pick a bigger partition")

    def submit(self, run: RunRecord, plan: Plan) -> None:
        run.job_id = submit_batch(Path(run.run_dir) / "launch.sbatch", Path(run.run_dir))
        run.set_state("submitted", f"job {run.job_id}")

    def job_state(self, run: RunRecord) -> JobState:
        if not run.job_id:
            return JobState("ENDED", "never submitted")
        proc = run_slurm_command(["squeue", "-h", "-j", run.job_id, "-o", "%T|%R"], check=False)
        line = proc.stdout.strip()
        if proc.returncode == 0 and line:
            state, _, reason = line.partition("|")
            if state in ("PENDING", "CONFIGURING"):
                # squeue's %R: "(Resources)", "(Priority)", or "(None)" before the scheduler looked at it
                reason = reason.strip().strip("()")
                return JobState("PENDING", "waiting for the scheduler" if reason in ("", "None") else reason)
            if state in ("RUNNING", "COMPLETING"):
                return JobState("RUNNING", state)
            return JobState("ENDED", state)
        show = run_slurm_command(["scontrol", "show", "job", "-o", run.job_id], check=False)
        for field in show.stdout.split():
            if field.startswith("JobState="):
                return JobState("ENDED", field.split("=", 1)[1])
        return JobState("ENDED", "no longer known to Slurm")

    def stop(self, run: RunRecord, timeout_s: float = 60.0) -> list[str]:
        problems = []
        if run.job_id:
            run_slurm_command(["scancel", run.job_id], check=False)
            deadline = time.monotonic() + timeout_s
            while self.job_state(run).phase != "ENDED":
                if time.monotonic() > deadline:
                    problems.append(f"job {run.job_id} still in squeue after {timeout_s:g}s")
                    break
                time.sleep(1)
        left = _kill_leftovers(run)
        if left:
            problems.append(f"processes still running: {left}")
        return problems


class LocalBackend:
    name = "local"

    def preflight(self, plan: Plan) -> None:
        for name, port in [*((s.name, s.port) for s in plan.servers), ("proxy", plan.proxy.port)]:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                # Servers bind with SO_REUSEADDR, so a port whose last connections linger in TIME_WAIT is free
                # for them; only a listening or bound socket makes it busy.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind(("0.0.0.0", port))
                except OSError:
                    raise LaunchError(f"port {port} ({name}) is already in use on this machine; stop what holds "
                                      "it or move cluster.worker_base_port / proxy.port") from None

    def submit(self, run: RunRecord, plan: Plan) -> None:
        run_dir = Path(run.run_dir)
        spec = {
            "nodes": plan.node_count,
            "startup_timeout_s": plan.slurm.startup_timeout_s,
            "servers": [{"name": s.name, "node": s.first_node, "port": s.port, "gpus": ",".join(map(str, s.gpus)),
                         "env_file": str(run_dir / f"{s.role}.env"),
                         "argv": [*worker_command(plan, s.role, s.port), "--extra_llm_api_options",
                                  str(run_dir / f"{s.role}.yaml")]}
                        for s in plan.servers],
            "proxy": {"name": "proxy", "node": plan.proxy.node, "port": plan.proxy.port, "gpus": "",
                      "env_file": str(run_dir / "proxy.env"),
                      "argv": [*proxy_command(plan), "-c", str(run_dir / "disagg.resolved.yaml")]},
        }
        (run_dir / LOCAL_PLAN).write_text(json.dumps(spec, indent=2) + "\n")
        (run_dir / "logs").mkdir(exist_ok=True)
        with open(run_dir / "logs" / "supervisor.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "toolkit.launch.supervisor", str(run_dir)], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        run.supervisor_pid = proc.pid
        run.set_state("submitted", f"supervisor pid {proc.pid}")

    def job_state(self, run: RunRecord) -> JobState:
        if run.supervisor_pid and _alive(run.supervisor_pid):
            return JobState("RUNNING", f"supervisor pid {run.supervisor_pid}")
        return JobState("ENDED", "supervisor exited")

    def stop(self, run: RunRecord, timeout_s: float = 30.0) -> list[str]:
        if run.supervisor_pid and _alive(run.supervisor_pid):
            try:
                os.kill(run.supervisor_pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout_s
            while _alive(run.supervisor_pid) and time.monotonic() < deadline:
                time.sleep(0.2)
        left = _kill_leftovers(run)
        return [f"processes still running: {left}"] if left else []


def backend_for(name: str):
    return {"slurm": SlurmBackend, "local": LocalBackend}[name]()
