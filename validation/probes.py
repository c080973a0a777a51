"""Preflight probes of the node an agent runs on: its role's environment, NIXL, GPUs, RDMA NICs, GPUDirect
peer memory, and (after the transfers) the transports UCX chose. Each probe returns (status, detail),
status one of pass, fail, not_present; the agent records them. Standard library only.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess

SHOWN_ENV = ("UCX_", "NIXL_", "FI_", "TRTLLM_NIXL")
INHERITED_ENV = ("UCX_", "NIXL_", "FI_")
NIXL_MODULES = (("nixl._api", ("nixl", "nixl-cu12", "nixl-cu13")), ("nixl_cu12._api", ("nixl-cu12",)),
                ("nixl_cu13._api", ("nixl-cu13",)))


# -- the role's environment (applied before NIXL is imported) -----------------------------------

def apply_role_env(env: dict, role: str, ucx_log: str | None) -> tuple[str, str]:
    """Apply the role's environment; with ucx_log, ask UCX to print its protocol choice into it."""
    inherited = {k: v for k, v in os.environ.items() if k.startswith(INHERITED_ENV) and k not in env}
    for k, v in env.items():
        os.environ[k] = str(v)
    if ucx_log is not None:
        os.environ.setdefault("UCX_PROTO_INFO", "y")
        os.environ.setdefault("UCX_LOG_FILE", ucx_log)
    applied = [k for k in env if os.environ.get(k) == str(env[k])]
    shown = ", ".join(f"{k}={env[k]}" for k in env if k.startswith(SHOWN_ENV))
    detail = f"applied {len(applied)} variable(s) of the {role} role env ({shown or 'no UCX/NIXL variables'})"
    if inherited:
        detail += "; also inherited from the node: " + ", ".join(f"{k}={v}" for k, v in sorted(inherited.items()))
    return ("pass" if len(applied) == len(env) else "fail"), detail


# -- NIXL -----------------------------------------------------------------------------------------

def _dist_version(dists) -> str:
    try:
        from importlib import metadata
    except ImportError:
        return "unknown"
    for d in dists:
        try:
            return f"{d} {metadata.version(d)}"
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def import_nixl():
    """(module, {module, version}) or (None, reason). `nixl._api`, then the CUDA-specific wheels."""
    errors = []
    for name, dists in NIXL_MODULES:
        try:
            mod = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        return mod, {"module": name, "version": _dist_version(dists)}
    return None, "; ".join(errors)


# -- GPUs and GPUDirect peer memory ---------------------------------------------------------------

def gpu_count() -> tuple[int, str]:
    """(number of GPUs, how we know) without torch/cupy: nvidia-smi, else /proc/driver/nvidia."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=15, check=False)
            if out.returncode == 0:
                gpus = [ln for ln in out.stdout.splitlines() if ln.startswith("GPU ")]
                return len(gpus), "; ".join(gpus)[:400] or "nvidia-smi lists no GPU"
            return 0, f"nvidia-smi failed: {(out.stderr or out.stdout).strip()[:300]}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 0, f"nvidia-smi did not answer: {exc}"
    if os.path.isdir("/proc/driver/nvidia/gpus"):
        n = len(os.listdir("/proc/driver/nvidia/gpus"))
        return n, f"{n} GPU(s) in /proc/driver/nvidia/gpus"
    return 0, "nvidia-smi not found"


def gpus_status(n_gpus: int) -> str:
    """A node with nvidia-smi but no GPU listed fails; one without NVIDIA tooling has none to check."""
    if shutil.which("nvidia-smi") or n_gpus:
        return "pass" if n_gpus else "fail"
    return "not_present"


def peermem_check(n_gpus: int) -> tuple[str, str]:
    if not n_gpus:
        return "not_present", "no NVIDIA GPU on this node"
    if os.path.isdir("/sys/module/nvidia_peermem") or os.path.exists("/sys/kernel/mm/memory_peers/nv_mem/version"):
        return "pass", "GPUDirect RDMA peer memory module loaded"
    return ("not_present",
            "nvidia_peermem is not loaded: GPUDirect RDMA needs it unless UCX can use DMA-BUF "
            "(rdma-core >= 41, CUDA >= 11.7); slow or failing VRAM transfers point here")


# -- RDMA NICs ------------------------------------------------------------------------------------

def parse_ibv_devinfo(text: str) -> list:
    """ibv_devinfo's output -> [(device, port, state)]."""
    ports, dev, port = [], None, None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("hca_id:"):
            dev = s.split(":", 1)[1].strip()
        elif s.startswith("port:"):
            port = s.split(":", 1)[1].strip()
        elif s.startswith("state:") and dev:
            ports.append((dev, port, s.split(":", 1)[1].strip()))
    return ports


def _nics_from_sysfs() -> tuple[str, str]:
    devs = sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else []
    if devs:
        return "pass", f"RDMA devices {', '.join(devs)} (ibv_devinfo not installed, states unknown)"
    return "not_present", "ibv_devinfo not found and no /sys/class/infiniband devices"


def _ports_verdict(ports: list, rdma: bool) -> tuple[str, str]:
    active = [f"{d}:{p}" for d, p, st in ports if "ACTIVE" in st]
    down = [f"{d}:{p} {st}" for d, p, st in ports if "ACTIVE" not in st]
    if active:
        return "pass", f"active ports {', '.join(active)}" + (f"; not active: {', '.join(down)}" if down else "")
    return (("fail" if rdma else "pass"),
            f"no ACTIVE RDMA port ({', '.join(down) or 'none'})"
            + ("" if rdma else "; not needed by this transport profile"))


def nic_check(rdma: bool) -> tuple[str, str]:
    """RDMA ports and their states (ibv_devinfo, else /sys/class/infiniband); rdma: the profile needs one."""
    tool = shutil.which("ibv_devinfo")
    if not tool:
        return _nics_from_sysfs()
    try:
        out = subprocess.run([tool], capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "fail", f"ibv_devinfo did not answer: {exc}"
    text = out.stdout + out.stderr
    if "No IB devices found" in text or not text.strip():
        return "not_present", "ibv_devinfo: no RDMA devices"
    return _ports_verdict(parse_ibv_devinfo(text), rdma)


# -- the transports UCX chose (UCX_PROTO_INFO=y) ----------------------------------------------------

_TITLE = re.compile(r"\|\s*(\S+)\s+(self|intra-node|inter-node)\s+cfg#\d+\s*\|(?:\s*([^|]*?)\s*\|)?")
# "remote memory write by ucp_put* from host memory to cuda", "... by ucp_put*(multi) from cuda/GPU0 to cuda/dev[0]",
# "remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[0]": (local, remote) memory types
_MEMORY = (re.compile(r"\bfrom (\w+)\S*(?: memory)? to (\w+)"), re.compile(r"\binto (\w+)\S* from (\w+)"))
EMULATION = "software emulation"
_RANGE = re.compile(r"^\d+(\.\.\S+)?$")  # a table row's message-size range: 0..inf, 2049..8K, 0


def parse_ucx_proto_info(text) -> list:
    """Tables UCX prints with UCX_PROTO_INFO=y -> [{scope, operation, op, memory, protocols, transports}] for RMA
    put (op WRITE) and get (READ); memory: (local, remote) memory types ("host", "cuda"); protocols: the protocol
    column of each row ("zero-copy", "short", "software emulation" ...). The operation is on the title's line (newer
    UCX) or the line after it. text: the log as one string, or its lines (a file read line by line)."""
    out = []
    cur = None
    for raw in (text.splitlines() if isinstance(text, str) else text):
        raw = raw.rstrip("\r\n")
        line = raw.split("]", 2)[-1] if raw.startswith("[") else raw
        m = _TITLE.search(line)
        if m:
            cur = {"scope": m.group(2), "operation": (m.group(3) or None), "transports": [], "protocols": []}
            out.append(cur)
        elif cur is not None:
            _table_row(cur, line)
    tables = [t for t in out if t["operation"] and t["operation"].startswith("remote memory")]
    for t in tables:
        t["op"] = "WRITE" if "ucp_put" in t["operation"] or " write " in t["operation"] else "READ"
        mem = next((m.search(t["operation"]) for m in _MEMORY if m.search(t["operation"])), None)
        t["memory"] = [mem.group(1), mem.group(2)] if mem else []
        t["emulated"] = any(EMULATION in p for p in t["protocols"])
    return tables


def _table_row(cur: dict, line: str) -> None:
    """One line under a table title: the operation (first one-cell line), or a row naming a protocol and transports."""
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if cur["operation"] is None and len(cells) == 1 and cells[0] and not cells[0].startswith("+"):
        cur["operation"] = cells[0]
        return
    if len(cells) >= 3 and cur["operation"]:
        if _RANGE.match(cells[0]) and cells[-2] not in cur["protocols"]:  # a row, not the Range|Description header
            cur["protocols"].append(cells[-2])
        for tok in re.split(r"[\s+]+", cells[-1]):
            if "/" in tok and tok not in cur["transports"]:
                cur["transports"].append(tok)


def protocol_choices(tables: list) -> list:
    """One entry per (scope, op, memory types): the protocols and transports UCX chose, and whether it emulates."""
    merged: dict = {}
    for t in tables:
        if t["scope"] == "self":
            continue
        key = (t["scope"], t["op"], tuple(t["memory"]))
        e = merged.setdefault(key, {"scope": t["scope"], "op": t["op"], "memory": list(t["memory"]),
                                    "protocols": [], "transports": [], "emulated": False})
        e["protocols"] += [p for p in t["protocols"] if p not in e["protocols"]]
        e["transports"] += [x for x in t["transports"] if x not in e["transports"]]
        e["emulated"] = e["emulated"] or t["emulated"]
    return list(merged.values())


def protocol_verdict(choices: list, ucx_tls: str | None) -> tuple[str, str]:
    """Fail when TensorRT-LLM's op (WRITE) of CUDA memory is served by UCX's software emulation (a copy through host
    memory, ~0.5 GB/s, where cuda_ipc or RDMA move ~100 GB/s and more), naming the likely cause and the fix; a READ
    so served is said, not failed (TensorRT-LLM never READs)."""
    if not choices:
        return "not_present", "UCX printed no RMA protocol selection"
    shown = "; ".join(f"{c['op']} {c['scope']} {'->'.join(c['memory']) or '?'}: {', '.join(c['protocols']) or '?'} "
                      f"({', '.join(c['transports']) or '?'})" for c in choices)
    cuda = [c for c in choices if c["emulated"] and "cuda" in c["memory"]]
    bad_write = [c for c in cuda if c["op"] == "WRITE"]
    if bad_write:
        tls = ucx_tls or "unset (UCX picks)"
        intra = any(c["scope"] == "intra-node" for c in bad_write)
        missing = ("cuda_ipc" if intra else "an RDMA transport (rc, dc or ib)")
        cause = (f"UCX_TLS={tls} lacks {missing}" if ucx_tls and ((intra and "cuda_ipc" not in ucx_tls) or
                 (not intra and not any(x in ucx_tls for x in ("rc", "dc", "ib", "all")))) else
                 "the memory is not shareable by cuda_ipc (a CUDA VMM allocation without IPC handles: TensorRT-LLM PR "
                 "#17241, the Python transceiver's KV pools on H100) or UCX lacks GPUDirect RDMA (nvidia_peermem or "
                 "DMA-BUF)")
        return "fail", (f"software emulation: UCX serves the WRITE of CUDA memory through host memory (~0.5 GB/s); "
                        f"cause: {cause}; fix: add {missing} to UCX_TLS (kv_transfer.transport's profile or the role "
                        f"env), or, for VMM pools, run the C++ transceiver (kv_transfer.runtime: CPP), which stages "
                        f"through cudaMalloc'd buffers. UCX's choices: {shown}")
    if cuda:
        return "pass", (f"READ of CUDA memory is served by UCX's software emulation (slow), which does not matter to "
                        f"TensorRT-LLM: it WRITEs. UCX's choices: {shown}")
    return "pass", shown


# The log UCX writes to may hold far more than the protocol tables (UCX_LOG_LEVEL=debug writes hundreds of MB):
# it is read line by line, up to this many bytes; a longer line is cut (table lines are ~100 characters).
UCX_LOG_MAX_BYTES = 64 << 20
UCX_LOG_MAX_LINE = 4096


class _BoundedLines:
    """The lines of a file opened in binary mode, decoded, each cut at max_line bytes, until max_bytes bytes
    were read. truncated: the cap was reached before the end of the file."""

    def __init__(self, f, max_bytes: int, max_line: int):
        self.f, self.max_bytes, self.max_line = f, max_bytes, max_line
        self.read = 0
        self.truncated = False

    def _readline(self) -> bytes:
        line = self.f.readline(min(self.max_line, self.max_bytes - self.read))
        self.read += len(line)
        return line

    def __iter__(self):
        while self.read < self.max_bytes:
            line = self._readline()
            if not line:
                return
            rest = line
            while not rest.endswith(b"\n") and self.read < self.max_bytes:  # cut: skip the rest of the line
                rest = self._readline()
                if not rest:
                    break
            yield line.decode(errors="replace")
        self.truncated = bool(self.f.read(1))


def read_ucx_proto_info(path: str, max_bytes: int = UCX_LOG_MAX_BYTES) -> tuple[list, bool]:
    """(the RMA tables of the UCX log, whether the log went on past max_bytes and was not read to its end)."""
    try:
        with open(path, "rb") as f:
            lines = _BoundedLines(f, max_bytes, UCX_LOG_MAX_LINE)
            return parse_ucx_proto_info(lines), lines.truncated
    except OSError:
        return [], False


def transports_by_scope(tables: list) -> dict:
    """scope (intra-node, inter-node) -> set of transports UCX chose for RMA; 'self' left out."""
    seen: dict = {}
    for t in tables:
        if t["scope"] == "self":
            continue
        seen.setdefault(t["scope"], set()).update(t["transports"])
    return seen


def transport_verdict(seen: dict, expect: dict) -> tuple[str, str]:
    """Fail when a profile that expects RDMA fell back to TCP between nodes."""
    desc = "; ".join(f"{s}: {', '.join(sorted(v))}" for s, v in sorted(seen.items())) or "self only"
    inter = seen.get("inter-node", set())
    tcp = sorted(t for t in inter if t.startswith("tcp"))
    if expect.get("rdma") and tcp:
        return "fail", (f"TCP fallback: inter-node RMA uses {', '.join(tcp)} but the "
                        f"{expect['transport']} profile expects RDMA ({desc})")
    if not inter:
        return "pass", f"{desc} (peers on this host only; no inter-node transport exercised)"
    return "pass", desc
