"""The local backend's stand-in for the Slurm job: runs a deployment's processes on this machine.

`tk launch --local` starts it detached (`python -m toolkit.launch.supervisor RUN_DIR`). It does what
launch.sbatch does inside a Slurm job, step for step and with the same state files:
resolve nodes (all 127.0.0.1), start every server with its role's env file, wait (bounded) until
each answers /health, start the proxy, then watch: any process exiting ends the whole deployment.
SIGTERM stops everything it started and waits (bounded) for it to go.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

LOCAL_PLAN = "local.json"
WRAPPER = 'export CUDA_VISIBLE_DEVICES="$1"; set -a; . "$2"; set +a; shift 2; exec "$@"'


class Supervisor:
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.spec = json.loads((run_dir / LOCAL_PLAN).read_text())
        self.procs: dict[str, subprocess.Popen] = {}
        self.stopping = False
        (run_dir / "logs").mkdir(exist_ok=True)
        (run_dir / "state").mkdir(exist_ok=True)

    def phase(self, name: str, detail: str = "") -> None:
        line = f"{int(time.time())}\t{name}\t{detail}\n"
        with open(self.run_dir / "state" / "phases.tsv", "a") as f:
            f.write(line)
        print(f"[tk] {time.strftime('%F %T')} {name} {detail}", flush=True)

    def start(self, server: dict) -> None:
        log = open(self.run_dir / "logs" / f"{server['name']}.log", "ab")
        argv = ["bash", "-c", WRAPPER, f"tk-{server['name']}", server["gpus"], server["env_file"], *server["argv"]]
        self.procs[server["name"]] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                      stdin=subprocess.DEVNULL, cwd=self.run_dir,
                                                      start_new_session=True)
        log.close()
        self.phase("started", f"{server['name']} on node{server['node']}")

    def check_alive(self) -> None:
        if self.stopping:
            raise _Failed("stop requested")
        for name, proc in self.procs.items():
            rc = proc.poll()
            if rc is not None:
                raise _Failed(f"{name} exited with code {rc} (log: logs/{name}.log)")

    def wait_healthy(self, name: str, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if _http_ok(url):
                self.phase("healthy", f"{name} {url}")
                return
            self.check_alive()
            if time.monotonic() > deadline:
                raise _Failed(f"{name} not healthy at {url} after {timeout_s:g}s (log: logs/{name}.log)")
            time.sleep(0.5)

    def stop_all(self, grace_s: float = 15.0) -> None:
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def run(self) -> int:
        spec = self.spec
        with open(self.run_dir / "nodes.tsv", "w") as f:
            for i in range(spec["nodes"]):
                f.write(f"{i}\tlocal{i}\t127.0.0.1\n")
        text = (self.run_dir / "disagg.yaml").read_text()
        for i in range(spec["nodes"]):
            text = text.replace(f"<node{i}>", "127.0.0.1")
        (self.run_dir / "disagg.resolved.yaml").write_text(text)
        try:
            self.phase("starting", f"{len(spec['servers'])} servers")
            for server in spec["servers"]:
                self.start(server)
            for server in spec["servers"]:
                self.wait_healthy(server["name"], f"http://127.0.0.1:{server['port']}/health",
                                  spec["startup_timeout_s"])
            self.start(spec["proxy"])
            url = f"http://127.0.0.1:{spec['proxy']['port']}"
            self.wait_healthy("proxy", f"{url}/health", spec["startup_timeout_s"])
            (self.run_dir / "endpoint").write_text(url + "\n")
            self.phase("ready", url)
            while not self.stopping:
                self.check_alive()
                time.sleep(0.5)
            self.phase("stopping", "stop requested")
            self.stop_all()
            self.phase("stopped", "")
            return 0
        except _Failed as exc:
            if self.stopping:
                self.phase("stopping", "stop requested")
                self.stop_all()
                self.phase("stopped", "")
                return 0
            self.phase("failed", str(exc))
            self.stop_all()
            return 1

    def request_stop(self, *_):
        self.stopping = True


class _Failed(Exception):
    pass


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except Exception:
        return False


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m toolkit.launch.supervisor RUN_DIR", file=sys.stderr)
        return 2
    sup = Supervisor(Path(argv[0]).resolve())
    signal.signal(signal.SIGTERM, sup.request_stop)
    signal.signal(signal.SIGINT, sup.request_stop)
    return sup.run()


if __name__ == "__main__":
    sys.exit(main())
