"""One Slurm step per component, and every other Slurm call the job makes, each bounded in time.

A component runs as

    srun --overlap --kill-on-bad-exit=1 --job-name=tk-NAME --nodes=N --ntasks=T --ntasks-per-node=P
         --nodelist=NODES --output=logs/NAME.log --open-mode=append SRUN_FLAGS...
         bash -c WRAPPER tk-NAME GPUS ENV_FILE INSTANCE_ENV STARTED_MARKER ARGV...

where WRAPPER (on the node, in the container) sets CUDA_VISIBLE_DEVICES, exports the role's env file and the
instance's own ports, touches STARTED_MARKER (the step exists and its task ran: an srun that fails without it
never created a step, e.g. the controller was unreachable) and execs ARGV. Every value is a positional argument;
none is ever part of the script. The step is named tk-NAME so that it can be found (squeue -s) and killed on its
node (scancel --signal=KILL JOB.STEP), even when its task is stopped. Locally (tk launch --local) the same argv
runs under tk's shim (toolkit/launch/local_shim/): no steps, the srun process is the server itself.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

SLURM_TIMEOUT_S = 10
KILL_WAIT_S = 15
TERM_GRACE_S = 5.0  # a command past its bound: SIGTERM, then SIGKILL this much later
EXIT_LINGER_S = 1.0  # a command that exited: how long its pipes may stay open (held by a process it started)
MAX_OUTPUT = 1 << 20  # bytes kept of each output of a command
# What srun itself says when it never created the step (srun's own messages, as the Slurm client prints them:
# "srun: error: Unable to create step for job N: ...", "Job N step creation temporarily disabled, retrying",
# "Unable to confirm allocation for job N: ...", "Unable to contact slurm controller (connect failure)",
# "Slurm controller not responding, sleeping and retrying"; the strings of Debian 12's srun, Slurm 22.05.8).
NOT_CREATED = re.compile(r"unable to create step|step creation (temporarily|still) disabled|unable to confirm "
                         r"allocation|unable to contact slurm controller|slurm controller not responding|"
                         r"could not establish a configuration source", re.IGNORECASE)
WRAPPER = ('export CUDA_VISIBLE_DEVICES="$1"; if [ -n "$2" ]; then set -a; . "$2"; set +a; fi; '
           'for kv in $3; do export "$kv"; done; : > "$4"; shift 4; exec "$@"')


def run_bounded(argv: Sequence[str], timeout_s: float, **kw: Any) -> Tuple[int, str, str]:
    """(exit code, stdout, stderr); 124 when it ran past timeout_s (SIGTERM, as GNU timeout sends, then SIGKILL
    after TERM_GRACE_S), 127 when it is not there. Bounded in every way: each output keeps its first MAX_OUTPUT
    bytes (the rest is read and dropped, so the command never blocks on a full pipe); a command that has exited
    is not waited for past EXIT_LINGER_S while something it started still holds its pipes open; after SIGKILL the
    wait is bounded too."""
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                **kw)
    except OSError as exc:
        return 127, "", f"{argv[0]}: {exc.strerror or exc}"
    out, err = bytearray(), bytearray()
    pipes = {proc.stdout: out, proc.stderr: err}
    try:
        if _drain(proc, pipes, time.monotonic() + timeout_s):
            return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
        proc.terminate()
        _drain(proc, pipes, time.monotonic() + TERM_GRACE_S)
        if proc.poll() is None:
            proc.kill()
            try:
                proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        return 124, out.decode(errors="replace"), f"{argv[0]} did not answer within {timeout_s:g}s"
    finally:
        for pipe in pipes:
            if pipe is not None:
                pipe.close()


def _drain(proc: subprocess.Popen, pipes: Dict[Any, bytearray], deadline: float) -> bool:
    """Read proc's pipes into their buffers (each up to MAX_OUTPUT) until it has exited and they are at their end,
    or it has exited EXIT_LINGER_S ago (a process it started holds them), True; or until the deadline, False."""
    selector = selectors.DefaultSelector()
    for pipe in pipes:
        if pipe is not None and not pipe.closed:
            selector.register(pipe, selectors.EVENT_READ)
    exited_at: Optional[float] = None
    try:
        while True:
            now = time.monotonic()
            if proc.poll() is not None:
                exited_at = now if exited_at is None else exited_at
                if not selector.get_map() or now - exited_at >= EXIT_LINGER_S:
                    return True
            elif now >= deadline:
                return False
            if not selector.get_map():  # its pipes are closed and it runs on: wait for it alone
                try:
                    proc.wait(timeout=max(0.0, deadline - now))
                except subprocess.TimeoutExpired:
                    return False
                continue
            wait_s = EXIT_LINGER_S - (now - exited_at) if exited_at is not None else deadline - now
            for key, _ in selector.select(timeout=max(0.0, min(wait_s, 0.2))):
                chunk = os.read(key.fd, 64 << 10)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buf = pipes[key.fileobj]
                buf += chunk[:max(0, MAX_OUTPUT - len(buf))]
    finally:
        selector.close()


class Steps:
    """Starts, finds and kills the job's steps."""

    def __init__(self, run_dir: str, job_id: str, srun_flags: List[str]):
        self.run_dir, self.job_id, self.srun_flags = run_dir, job_id, list(srun_flags)
        self.marker_dir = os.path.join(run_dir, "state", "steps")
        os.makedirs(self.marker_dir, exist_ok=True)

    def marker(self, name: str) -> str:
        return os.path.join(self.marker_dir, f"{name}.started")

    def srun_err(self, name: str) -> str:
        return os.path.join(self.marker_dir, f"{name}.srun.err")

    def argv(self, name: str, nodelist: List[str], ntasks: int, per_node: int, gpus: str, env_file: str,
             instance_env: str, command: List[str]) -> List[str]:
        return ["srun", "--overlap", "--kill-on-bad-exit=1", f"--job-name=tk-{name}", f"--nodes={len(nodelist)}",
                f"--ntasks={ntasks}", f"--ntasks-per-node={per_node}", f"--nodelist={','.join(nodelist)}",
                f"--output={os.path.join(self.run_dir, 'logs', name + '.log')}", "--open-mode=append",
                *self.srun_flags, "bash", "-c", WRAPPER, f"tk-{name}", gpus, env_file, instance_env,
                self.marker(name), *command]

    def start(self, name: str, argv: List[str]) -> subprocess.Popen:
        """Start the step (no wait). Its own messages (srun: error: ...) go to state/steps/NAME.srun.err."""
        for path in (self.marker(name),):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        with open(self.srun_err(name), "wb") as err:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    cwd=self.run_dir)

    def step_created(self, name: str, listed: bool = False) -> Optional[bool]:
        """Did srun create the step of this start? True: squeue listed it (``listed``) or its task left the marker;
        False: srun itself said it could not create it; None: nothing says either way. The marker lives on the
        run directory, often NFS: the directory is listed afresh first (a READDIR revalidates the attributes the
        client cached, which a bare stat of a name cached as absent may not), and its absence alone proves
        nothing."""
        if listed:
            return True
        marker = os.path.basename(self.marker(name))
        try:
            if marker in os.listdir(self.marker_dir):
                return True
        except OSError:
            pass
        if os.path.exists(self.marker(name)):
            return True
        return False if NOT_CREATED.search(self._srun_tail(name)) else None

    def _srun_tail(self, name: str) -> str:
        """The end of what srun itself wrote for this start (bounded)."""
        try:
            with open(self.srun_err(name), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def srun_said(self, name: str, limit: int = 300) -> str:
        """The last line srun itself wrote (why a step was not created), bounded."""
        lines = [ln.strip() for ln in self._srun_tail(name).splitlines() if ln.strip()]
        return lines[-1][:limit] if lines else ""

    def step_ids(self) -> Dict[str, str]:
        """tk-NAME -> JOB.STEP for every step Slurm lists for this job (one bounded squeue); {} when none or
        when squeue does not answer."""
        if not self.job_id:
            return {}
        rc, out, _ = run_bounded(["squeue", "-h", "-s", "-j", self.job_id, "-o", "%i %j"], SLURM_TIMEOUT_S)
        if rc != 0:
            return {}
        steps: Dict[str, str] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].startswith("tk-"):
                steps[parts[1][3:]] = parts[0]
        return steps

    def kill(self, name: str, proc: subprocess.Popen, step: Optional[str]) -> Tuple[bool, Optional[int]]:
        """End a component on its node: scancel --signal=KILL of its step where Slurm knows it (the task itself,
        even if stopped); where it does not, or scancel fails (the controller down, a stale step id), two SIGINTs
        within a second (srun then ends its step's tasks); then SIGKILL of the srun. (True, exit code) once it is
        gone; (False, None) if it survives KILL_WAIT_S."""
        step = step or self.step_ids().get(name)
        scancelled = False
        if step:
            scancelled = run_bounded(["scancel", "--signal=KILL", step], SLURM_TIMEOUT_S)[0] == 0
        if not scancelled:
            for _ in range(2):
                _signal(proc, signal.SIGINT)
                time.sleep(0.3)
        _signal(proc, signal.SIGKILL)
        try:
            return True, proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            return False, None

    def cancel_job(self) -> None:
        """Every remaining step of this job, on every node (the local shim: every process of the job's session)."""
        if self.job_id:
            run_bounded(["scancel", self.job_id], SLURM_TIMEOUT_S)


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except (ProcessLookupError, OSError):
        pass


def terminate_all(procs: List[subprocess.Popen], grace_s: float = 30.0) -> None:
    """SIGTERM every process, wait (bounded by grace_s in all), SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            _signal(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.poll() is None:
            _signal(p, signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
