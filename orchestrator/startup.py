"""Start-up helpers: the allocation's nodes and their addresses, ports already taken, placeholders, provenance,
TensorRT-LLM's config check, a co-located launcher's IPC port. Each Slurm call is bounded.

The per-node work (hostname and busy ports, provenance, waiting for a port) runs as a small bash script through
`srun` on every node, because a compute node outside the container may have no Python. Values reach those
scripts as positional arguments only, and they answer in plain fields (provenance: base64 per field), so no
JSON is written by hand anywhere.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from orchestrator.background import Background
from orchestrator.spec import ArgItem, JobSpec
from orchestrator.steps import run_bounded

NODE_PROBE_TIMEOUT_S = 120
PROVENANCE_TIMEOUT_S = 300
PROVENANCE_MAX_LINE = 16 << 10

# On every node: its hostname, and which of the ports this plan puts on it already accept connections.
NODE_PROBE_SH = r'''host=$(hostname); busy=""
for kv in $1; do
    [ "${kv%%=*}" = "$SLURMD_NODENAME" ] || continue
    IFS=, read -ra ports <<< "${kv#*=}"
    for port in "${ports[@]}"; do
        for h in 127.0.0.1 "$host"; do
            if timeout 3 bash -c "exec 3<>/dev/tcp/$h/$port" 2>/dev/null; then busy+="${busy:+,}$port"; break; fi
        done
    done
done
echo "$SLURMD_NODENAME $host $busy"'''

# On every node, in the servers' container: what it runs. One line per field: TKPROV NODE FIELD BASE64(VALUE).
PROVENANCE_SH = r'''v() { command -v "$1" >/dev/null 2>&1 && timeout 120 "$@" 2>/dev/null; }
node=${SLURMD_NODENAME:-$(hostname)}
f() { printf 'TKPROV %s %s %s\n' "$node" "$1" "$(printf '%s' "$2" | head -c 2000 | base64 | tr -d '\n')"; }
image=$1; shift
f engine "$(v "$@" | tail -n 1)"
f engine_command "$*"
f nixl "$(v python3 -c 'import importlib.metadata as m
for d in ("nixl", "nixl-cu12", "nixl-cu13"):
    try:
        print(d, m.version(d)); break
    except Exception: pass')"
f ucx "$(v ucx_info -v | grep -i -m 1 -E 'version' | sed 's/^# *//')"
f driver "$(v nvidia-smi --query-gpu=driver_version,name --format=csv,noheader | head -n 1)"
f container_image "$image"
digest=""; case "$image" in *@sha256:*) digest="sha256:${image##*@sha256:}" ;; esac
f image_digest "$digest"
f cuda_version "${CUDA_VERSION:-}"
f nvidia_build_id "${NVIDIA_BUILD_ID:-}"
f python "$(v python3 -V 2>&1)"
f kernel "$(uname -r)"
f hostname "$(hostname)"'''

PROVENANCE_FIELDS = ("hostname", "engine", "engine_command", "nixl", "ucx", "driver", "container_image",
                     "image_digest", "cuda_version", "nvidia_build_id", "python", "kernel")

WAIT_PORT_SH = 'until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do sleep 1; done'


class StartupFailed(Exception):
    def __init__(self, reason: str, component: Optional[str] = None):
        super().__init__(reason)
        self.reason, self.component = reason, component


@dataclass
class Nodes:
    names: List[str]  # Slurm node names, in allocation order (index = plan node index)
    addrs: List[str]  # the address each reports for itself

    def resolve(self, text: str) -> str:
        """<nodeN> -> node N's address; <bindN> -> 0.0.0.0, or the node's address where that is loopback."""
        for i, addr in enumerate(self.addrs):
            bind = addr if addr.startswith("127.") or addr in ("localhost", "::1") else "0.0.0.0"
            text = text.replace(f"<node{i}>", addr).replace(f"<bind{i}>", bind)
        return text

    def argv(self, items: List[ArgItem], run_dir: str) -> List[str]:
        out = []
        for item in items:
            if isinstance(item, dict):
                out.append(os.path.join(run_dir, item["run_file"]))
            else:
                out.append(self.resolve(item).replace("<run_dir>", run_dir))
        return out


def hostnames(nodelist: str) -> List[str]:
    rc, out, err = run_bounded(["scontrol", "show", "hostnames", nodelist], 30)
    if rc != 0:
        raise StartupFailed(f"`scontrol show hostnames` failed: {(err or out).strip()[:300]}")
    return out.split()


def probe_nodes(spec: JobSpec, names: List[str]) -> Dict[str, Tuple[str, str]]:
    """node name -> (address, busy ports "p1,p2") from one srun step over every node."""
    port_spec = " ".join(f"{name}={','.join(str(p) for p in spec.node_ports[i])}" if i < len(spec.node_ports)
                         else f"{name}=" for i, name in enumerate(names))
    n = spec.nodes
    rc, out, _ = run_bounded(["srun", "--overlap", f"--nodes={n}", "--ntasks-per-node=1", f"--ntasks={n}",
                              "bash", "-c", NODE_PROBE_SH, "tk-nodes", port_spec], NODE_PROBE_TIMEOUT_S)
    found: Dict[str, Tuple[str, str]] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            found[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
    return found


def discover(spec: JobSpec, nodelist: str, run_dir: str) -> Nodes:
    """The first spec.nodes nodes of the allocation with their addresses, checked free; writes nodes.tsv."""
    names = hostnames(nodelist)
    if len(names) < spec.nodes:
        raise StartupFailed(f"allocation has {len(names)} nodes, the plan needs {spec.nodes}")
    names = names[:spec.nodes]
    found = probe_nodes(spec, names)
    addrs = []
    for name in names:
        if name not in found:
            raise StartupFailed(f"node {name} did not report its hostname")
        addr, busy = found[name]
        if busy:
            raise StartupFailed(f"port(s) {busy} already in use on {name} (a server left from another run?); stop "
                                "what holds them or move cluster.worker_base_port / proxy.port")
        addrs.append(addr)
    with open(os.path.join(run_dir, "nodes.tsv"), "w") as f:
        for i, (name, addr) in enumerate(zip(names, addrs)):
            f.write(f"{i}\t{name}\t{addr}\n")
    return Nodes(names, addrs)


def write_resolved(spec: JobSpec, nodes: Nodes, run_dir: str) -> Optional[str]:
    """disagg.yaml -> disagg.resolved.yaml with every <nodeN> replaced (the proxy reads the copy)."""
    if not spec.disagg_config:
        return None
    with open(os.path.join(run_dir, spec.disagg_config)) as f:
        text = f.read()
    target = os.path.join(run_dir, "disagg.resolved.yaml")
    with open(target, "w") as f:
        f.write(nodes.resolve(text))
    return target


def provenance(spec: JobSpec, run_dir: str, register: Callable[[subprocess.Popen], None],
               work: Background) -> threading.Thread:
    """In the background, one step per node: provenance/NODE.json. `register(proc)` hands the srun process to
    the job (so teardown ends it); nothing here can fail or delay the job (a failure is said: `work` reports it)."""
    out_dir = os.path.join(run_dir, "provenance")
    os.makedirs(out_dir, exist_ok=True)
    n = spec.nodes
    argv = ["srun", "--overlap", f"--nodes={n}", "--ntasks-per-node=1", f"--ntasks={n}", *spec.provenance.flags,
            "bash", "-c", PROVENANCE_SH, "tk-provenance", spec.provenance.image, *spec.provenance.version_command]

    def run() -> None:
        try:
            with open(os.path.join(run_dir, "logs", "provenance.log"), "ab") as err:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
        except OSError:
            return
        register(proc)
        killer = work.after("provenance-deadline", PROVENANCE_TIMEOUT_S, proc.kill)
        docs: Dict[str, Dict[str, Optional[str]]] = {}
        try:
            assert proc.stdout is not None
            whole = True  # the previous read ended its line
            while True:
                raw = proc.stdout.readline(PROVENANCE_MAX_LINE)  # a field is at most ~2.7 kB of base64
                if not raw:
                    break
                starts, whole = whole, raw.endswith(b"\n")
                if not (starts and whole):  # a line longer than any the script prints: skipped, piece by piece
                    continue
                parts = raw.decode(errors="replace").split()
                if len(parts) not in (3, 4) or parts[0] != "TKPROV" or parts[2] not in PROVENANCE_FIELDS:
                    continue
                if parts[1] not in docs and len(docs) >= n:  # one node name per node of the job
                    continue
                try:
                    value = base64.b64decode(parts[3]).decode(errors="replace") if len(parts) == 4 else ""
                except (binascii.Error, ValueError):
                    value = ""
                docs.setdefault(parts[1], {})[parts[2]] = value or None
            proc.wait()
        finally:
            killer.set()
        for node, fields in docs.items():
            doc = {"node": node, **{k: fields.get(k) for k in PROVENANCE_FIELDS}, "time": int(time.time())}
            safe = re.sub(r"[^A-Za-z0-9._-]", "_", node)
            try:
                with open(os.path.join(out_dir, f"{safe}.json"), "w") as f:
                    f.write(json.dumps(doc) + "\n")
            except OSError:
                pass

    return work.start("provenance", run)


def config_check(spec: JobSpec, nodes: Nodes, run_dir: str, stop: Callable[[], bool] = lambda: False
                 ) -> Tuple[str, str]:
    """TensorRT-LLM checks its own config on the first node: ("ok" | "failed" | "skipped", message). Bounded by
    the check's timeout; a signal to the job (stop()) ends the wait at once."""
    argv = ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={nodes.names[0]}", *spec.srun_flags,
            "python3", os.path.join(run_dir, "check_config.py"), *spec.check.argv]
    for file, model in spec.check.options:
        argv += ["--options", os.path.join(run_dir, file), model]
    if spec.check.disagg:
        argv += ["--disagg", os.path.join(run_dir, "disagg.resolved.yaml")]
    out_path = os.path.join(run_dir, "state", "config-check.out")
    with open(out_path, "wb") as out, open(os.path.join(run_dir, "logs", "config-check.log"), "ab") as err:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        except OSError as exc:
            return "skipped", f"the check did not run ({exc.strerror or exc}) (log: logs/config-check.log); " \
                              "the servers check their options at start-up"
        deadline = time.monotonic() + spec.check.timeout_s
        rc = None
        while rc is None and time.monotonic() < deadline and not stop():
            try:
                rc = proc.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass
        if rc is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = 124
    with open(out_path, "rb") as f:
        lines = f.read(1 << 20).decode(errors="replace").splitlines()
    verdicts = [ln for ln in lines if ln.startswith(("OK: ", "FAIL: ", "SKIP: "))]
    if verdicts:
        kind, _, message = verdicts[-1].partition(": ")
        return {"OK": "ok", "FAIL": "failed"}.get(kind, "skipped"), message
    why = f"timed out after {spec.check.timeout_s:g}s" if rc == 124 else f"the check did not run (exit {rc})"
    return "skipped", f"{why} (log: logs/config-check.log); the servers check their options at start-up"


def launcher_port(log_path: str, env_name: str) -> Optional[int]:
    """The IPC port a launcher logged ("ENV: tcp://HOST:PORT"), read from the first 1 MiB of its log."""
    try:
        with open(log_path, "rb") as f:
            text = f.read(1 << 20).decode(errors="replace")
    except OSError:
        return None
    m = re.search(re.escape(env_name) + r": tcp://[0-9.]+:([0-9]+)", text)
    return int(m.group(1)) if m else None


def wait_port_on(node: str, port: int, timeout_s: float) -> None:
    """Until something listens on node's loopback port (bounded)."""
    run_bounded(["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "bash", "-c", WAIT_PORT_SH,
                 "tk-wait-ipc", str(port)], max(1.0, timeout_s))
