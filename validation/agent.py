#!/usr/bin/env python3
"""`tk validate cluster`: the agent that runs on every node (one process per node and role).

    python3 agent.pyz PARAMS_JSON AGENT_ID      (RUN_DIR/agent.pyz: a zipapp of this package)

This file runs inside the serving container, where tk may not be installed: it needs only the Python
standard library, numpy and NIXL (``nixl._api``, else ``nixl_cu12._api`` / ``nixl_cu13._api``). The
toolkit ships it to the run directory beside ``params.json``; it must never ``import toolkit``.

What one agent does, in order (every wait is bounded; every failure ends in a written verdict):

1. apply its role's environment (the recipe's ctx.env / gen.env: UCX_TLS ...) *before* importing NIXL;
2. preflight: numpy and NIXL importable (version), the backend (UCX) created with the memory type it
   needs, the environment applied, GPUs (nvidia-smi), RDMA NICs (ibv_devinfo), nvidia_peermem;
3. allocate and register one buffer (the KV pool of its role; DRAM, or VRAM when a GPU is used);
4. rendezvous through files in the run directory: write its NIXL metadata (tmp + rename), poll for
   every peer's, bounded; a peer that never shows up is named in the result;
5. for every round of the round-robin schedule, the pair it belongs to: WRITE (context pushes) and READ
   (generation pulls) of KV-shaped requests of three lengths, every byte verified after every transfer,
   then the tokens_per_block sweep;
6. write its result file (results/AGENT.json) after every pair, wait (bounded) for the others, exit.

Pure helpers at the top (schedule, layout, pattern keys, percentiles) are shared with the toolkit.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

try:  # the coordinator imports this module for its pure helpers and may lack numpy
    import numpy as np
except ImportError:  # pragma: no cover - reported as a preflight failure by the agent
    np = None

PROTOCOL = 1
# Pattern: the 64-bit word at word offset w of pool block b holds key + b*A + w*B (mod 2**64).
# A and B are odd, so a word from another block, another offset or another key (an earlier round,
# iteration, request or pair) differs, except with negligible probability.
A_MUL = 0x9E3779B97F4A7C15
B_MUL = 0xD6E8FEB86659FD93
MASK64 = (1 << 64) - 1
KV_NAMES = ("K", "V")


# ------------------------------------------------------------------------------------------------
# Pure helpers (no numpy), shared with toolkit.validate
# ------------------------------------------------------------------------------------------------

def round_robin(ctx: list, gen: list) -> list:
    """Rounds of disjoint (ctx, gen) pairs covering every ctx x gen pair exactly once.

    max(len(ctx), len(gen)) rounds: a proper edge colouring of the complete bipartite graph, so N nodes
    finish in at most N-1 rounds and every agent is in at most one pair per round.
    """
    c, g = len(ctx), len(gen)
    rounds = []
    for r in range(max(c, g) if c and g else 0):
        if c <= g:
            rounds.append([(ctx[i], gen[(i + r) % g]) for i in range(c)])
        else:
            rounds.append([(ctx[(j + r) % c], gen[j]) for j in range(g)])
    return rounds


def ceil_to(multiple: int, value: int) -> int:
    return -(-int(value) // int(multiple)) * int(multiple)


def key_of(*parts) -> int:
    """A 64-bit key from (src, dst, round, op, length, kind, iteration ...)."""
    h = hashlib.blake2b("|".join(str(p) for p in parts).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


def block_table(seed, pool_blocks: int, n: int) -> list:
    """n distinct pool blocks in a scattered order, as an engine's block table looks after a while."""
    if n > pool_blocks:
        raise ValueError(f"request needs {n} blocks, the pool has {pool_blocks}")
    return random.Random(str(seed)).sample(range(pool_blocks), n)


def side_layout(geom: dict, side: str, tpb: int) -> dict:
    """How one side's pool is cut into blocks and which fragments of a block a pair moves.

    A block holds tokens_per_block tokens of every layer, laid out [layer][K|V][token][heads x dim] as
    TensorRT-LLM's KV pool is. When both roles hold the same heads per rank ("block" mode) a block moves
    as one descriptor (TensorRT-LLM's head-match mapper); otherwise ("fragment" mode) every (layer, K|V)
    slice of a block is one descriptor of the heads both ranks share (head-mismatch mapper).
    Returns block_bytes, slot_bytes (one layer's K or V of one block) and frags [(offset, length)].
    """
    layers, kvf = int(geom["layers"]), int(geom["kv_factor"])
    slot_tok = int(geom["slot_bytes_per_token"][side])
    slot = tpb * slot_tok
    block = layers * kvf * slot
    if geom["mode"] == "block":
        frags = [(0, block)]
    else:
        flen = tpb * int(geom["frag_bytes_per_token"])
        frags = [((layer * kvf + k) * slot, flen) for layer in range(layers) for k in range(kvf)]
    return {"tpb": tpb, "block_bytes": block, "slot_bytes": slot, "frags": frags, "kv_factor": kvf,
            "layers": layers, "slot_bytes_per_token": slot_tok}


def request_bytes(geom: dict, tokens: int, tpb: int) -> int:
    lay = side_layout(geom, "ctx", tpb)
    return ceil_to(tpb, tokens) // tpb * sum(n for _, n in lay["frags"])


def percentile(values, q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of a list of numbers; None when empty."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def describe_offset(lay: dict, offset: int) -> str:
    """'layer 3 V, token 5 of the block, byte 12' for a byte offset inside a block."""
    slot = lay["slot_bytes"]
    tpb = lay["tpb"]
    idx, within = divmod(offset, slot)
    layer, kv = divmod(idx, lay["kv_factor"])
    per_tok = max(1, slot // tpb)
    token, byte = divmod(within, per_tok)
    kv_name = KV_NAMES[kv] if lay["kv_factor"] == 2 else "latent"
    return f"layer {layer} {kv_name}, token {token} of the block, byte {byte} of that token's slice"


def parse_ucx_proto_info(text: str) -> list:
    """Tables UCX prints with UCX_PROTO_INFO=y -> [{scope, operation, transports}] for RMA put/get."""
    out = []
    title = re.compile(r"\|\s*(\S+)\s+(self|intra-node|inter-node)\s+cfg#\d+\s*\|")
    cur = None
    for raw in text.splitlines():
        line = raw.split("]", 2)[-1] if raw.startswith("[") else raw
        m = title.search(line)
        if m:
            cur = {"scope": m.group(2), "operation": None, "transports": []}
            out.append(cur)
            continue
        if cur is None:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cur["operation"] is None and len(cells) == 1 and cells[0] and not cells[0].startswith("+"):
            cur["operation"] = cells[0]
            continue
        if len(cells) >= 3 and cur["operation"]:
            for tok in re.split(r"[\s+]+", cells[-1]):
                if "/" in tok and tok not in cur["transports"]:
                    cur["transports"].append(tok)
    return [t for t in out if t["operation"] and t["operation"].startswith("remote memory")]


# ------------------------------------------------------------------------------------------------
# Pattern fill and verification (numpy, vectorised; pools are viewed as uint64 words)
# ------------------------------------------------------------------------------------------------

CHUNK_BYTES = 1 << 20  # verify in L2-sized pieces: small temporaries, little cache pollution


class WordLayout:
    """A side_layout in 64-bit words, with the arrays fill/verify need."""

    def __init__(self, lay: dict, pool_bytes: int):
        for name, v in (("block", lay["block_bytes"]), *((f"fragment {o}+{n}", o | n) for o, n in lay["frags"])):
            if v % 8:
                raise ValueError(f"{name} is not a multiple of 8 bytes")
        self.lay = lay
        self.bw = lay["block_bytes"] // 8
        self.nblocks = pool_bytes // lay["block_bytes"]
        self.frag_offsets = [o // 8 for o, _ in lay["frags"]]
        self.fw = lay["frags"][0][1] // 8
        self.nfrags = len(lay["frags"])
        self.words_b = np.arange(self.bw, dtype=np.uint64) * np.uint64(B_MUL)
        # word positions, inside a block, of the bytes a pair moves (fragment by fragment)
        self.pos = (np.asarray(self.frag_offsets, dtype=np.int64)[:, None]
                    + np.arange(self.fw, dtype=np.int64)[None, :]).ravel()
        self.full = self.nfrags == 1 and self.fw == self.bw
        self.chunk = max(1, CHUNK_BYTES // lay["block_bytes"])

    def view(self, pool64):
        return pool64[: self.nblocks * self.bw].reshape(self.nblocks, self.bw)

    def rows(self, blocks, key):
        b = np.asarray(blocks, dtype=np.uint64)
        return (np.uint64(key) + b * np.uint64(A_MUL))[:, None] + self.words_b[None, :]

    def desc_indices(self, blocks):
        b = np.asarray(blocks, dtype=np.int64)
        return (b[:, None] * self.nfrags + np.arange(self.nfrags, dtype=np.int64)[None, :]).ravel()

    def dlist(self, base: int, dev: int):
        """Nx3 (addr, len, dev) for every fragment of every block of the pool."""
        starts = (np.arange(self.nblocks, dtype=np.uint64)[:, None] * np.uint64(self.lay["block_bytes"])
                  + np.asarray([o for o, _ in self.lay["frags"]], dtype=np.uint64)[None, :]).ravel()
        out = np.empty((starts.size, 3), dtype=np.uint64)
        out[:, 0] = starts + np.uint64(base)
        out[:, 1] = self.lay["frags"][0][1]
        out[:, 2] = dev
        return out


def fill_blocks(pool64, wl: WordLayout, blocks, key: int) -> None:
    """Fill whole blocks with the pattern of key."""
    view = wl.view(pool64)
    blocks = np.asarray(blocks, dtype=np.int64)
    for i in range(0, blocks.size, wl.chunk):
        cb = blocks[i:i + wl.chunk]
        view[cb] = wl.rows(cb, key)


class Mismatch(Exception):
    def __init__(self, detail: dict):
        self.detail = detail
        super().__init__(detail.get("message", "data mismatch"))


def verify_blocks(pool64, wl_dst: WordLayout, dst_blocks, wl_src: WordLayout, src_blocks,
                  key_src: int, key_stale: int) -> int:
    """Check every byte of the destination blocks of a request; return the bytes checked.

    The moved fragments must hold the source pattern of the matching source block and offset; the rest
    of each destination block must still hold the destination's own stale pattern. Raises Mismatch with
    the first bad block and byte and the count of bad words.
    """
    view = wl_dst.view(pool64)
    bd = np.asarray(dst_blocks, dtype=np.int64)
    bs = np.asarray(src_blocks, dtype=np.int64)
    spos_b = wl_src.pos.astype(np.uint64) * np.uint64(B_MUL)
    checked = 0
    first = None
    bad = 0
    for i in range(0, bd.size, wl_dst.chunk):
        cd, cs = bd[i:i + wl_dst.chunk], bs[i:i + wl_dst.chunk]
        got = view[cd]
        src_vals = (np.uint64(key_src) + cs.astype(np.uint64) * np.uint64(A_MUL))[:, None] + spos_b[None, :]
        if wl_dst.full:
            exp = src_vals
        else:
            exp = wl_dst.rows(cd, key_stale)
            exp[:, wl_dst.pos] = src_vals
        neq = got != exp
        checked += got.nbytes
        if neq.any():
            n = int(np.count_nonzero(neq))
            bad += n
            if first is None:
                flat = int(np.argmax(neq))
                j, w = divmod(flat, wl_dst.bw)
                e, g = int(exp[j, w]), int(got[j, w])
                x = e ^ g
                byte = (x & -x).bit_length() - 1
                stale = (key_stale + int(cd[j]) * A_MUL + w * B_MUL) & MASK64
                first = {"request_block": i + j, "pool_block": int(cd[j]), "word": w,
                         "offset": w * 8 + byte // 8, "expected": f"{e:#018x}", "got": f"{g:#018x}",
                         "stale": g == stale}
    if first is not None:
        first["bad_words"] = bad
        first["where"] = describe_offset(wl_dst.lay, first["offset"])
        raise Mismatch(first)
    return checked


def verify_untouched(pool64, wl: WordLayout, skip_blocks, key_stale: int) -> int:
    """Blocks no transfer should touch must still hold the stale pattern; returns bytes checked."""
    view = wl.view(pool64)
    skip = np.zeros(wl.nblocks, dtype=bool)
    skip[np.asarray(skip_blocks, dtype=np.int64)] = True
    rest = np.flatnonzero(~skip)
    checked = 0
    for i in range(0, rest.size, wl.chunk):
        cb = rest[i:i + wl.chunk]
        got = view[cb]
        neq = got != wl.rows(cb, key_stale)
        checked += got.nbytes
        if neq.any():
            j, w = divmod(int(np.argmax(neq)), wl.bw)
            raise Mismatch({"request_block": None, "pool_block": int(cb[j]), "word": w, "offset": w * 8,
                            "expected": f"{int(wl.rows(cb[j:j + 1], key_stale)[0, w]):#018x}",
                            "got": f"{int(got[j, w]):#018x}", "stale": False, "bad_words": int(neq.sum()),
                            "where": "a block outside the request (it must stay untouched)"})
    return checked


# ------------------------------------------------------------------------------------------------
# Memory: one registered pool per agent, in DRAM or VRAM
# ------------------------------------------------------------------------------------------------

class DramPool:
    mem = "DRAM"
    how = "numpy"

    def __init__(self, nbytes: int):
        self.host = np.zeros(nbytes // 8, dtype=np.uint64)
        self.addr = int(self.host.ctypes.data)
        self.nbytes = nbytes
        self.dev = 0

    def push(self, wl, blocks):  # host is the registered memory
        pass

    def pull(self, wl, blocks):
        pass


class VramPool:
    """Device memory with a host mirror for filling and checking. torch when present, else libcudart."""

    mem = "VRAM"

    def __init__(self, nbytes: int, gpu: int):
        self.nbytes = nbytes
        self.dev = gpu
        self.host = np.zeros(nbytes // 8, dtype=np.uint64)
        self._torch = None
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.set_device(gpu)
                self._dev_t = torch.zeros(nbytes, dtype=torch.uint8, device=f"cuda:{gpu}")
                self._host_t = torch.from_numpy(self.host.view(np.uint8))
                self._torch = torch
                self.addr = int(self._dev_t.data_ptr())
                self.how = "torch"
                return
        except Exception:  # noqa: BLE001 - fall back to the CUDA runtime
            self._torch = None
        import ctypes

        self._ct = ctypes
        self._rt = _cudart()
        err = self._rt.cudaSetDevice(gpu)
        if err:
            raise RuntimeError(f"cudaSetDevice({gpu}) failed with CUDA error {err}")
        ptr = ctypes.c_void_p()
        err = self._rt.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        if err:
            raise RuntimeError(f"cudaMalloc({nbytes}) failed with CUDA error {err}")
        self.addr = int(ptr.value)
        self.how = "libcudart"

    def _copy(self, offset: int, n: int, to_device: bool) -> None:
        if self._torch is not None:
            if to_device:
                self._dev_t[offset:offset + n].copy_(self._host_t[offset:offset + n])
            else:
                self._host_t[offset:offset + n].copy_(self._dev_t[offset:offset + n])
            return
        ct = self._ct
        host = int(self.host.ctypes.data) + offset
        dev = self.addr + offset
        dst, src, kind = (dev, host, 1) if to_device else (host, dev, 2)  # cudaMemcpyHostToDevice / DeviceToHost
        err = self._rt.cudaMemcpy(ct.c_void_p(dst), ct.c_void_p(src), ct.c_size_t(n), kind)
        if err:
            raise RuntimeError(f"cudaMemcpy failed with CUDA error {err}")

    def _blocks(self, wl, blocks, to_device: bool) -> None:
        bb = wl.lay["block_bytes"]
        if blocks is None:
            self._copy(0, wl.nblocks * bb, to_device)
        else:
            for b in blocks:
                self._copy(int(b) * bb, bb, to_device)
        if self._torch is not None:
            self._torch.cuda.synchronize()

    def push(self, wl, blocks):
        self._blocks(wl, blocks, True)

    def pull(self, wl, blocks):
        self._blocks(wl, blocks, False)


def _cudart():
    import ctypes
    import glob

    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"]
    for base in sys.path:
        names += sorted(glob.glob(os.path.join(base, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError("no CUDA runtime (libcudart) found, and torch with CUDA is not available")


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


# ------------------------------------------------------------------------------------------------
# The agent
# ------------------------------------------------------------------------------------------------

class PairError(Exception):
    """The current pair cannot go on (peer gone, timeout, transfer error); the message says why."""


class Agent:
    def __init__(self, params: dict, agent_id: str):
        self.p = params
        self.id = agent_id
        me = [a for a in params["agents"] if a["id"] == agent_id]
        if not me:
            raise SystemExit(f"agent {agent_id!r} is not in {params.get('run_dir')}/params.json")
        self.me = me[0]
        self.role = self.me["role"]
        self.t0 = time.monotonic()
        t = params["timeouts"]
        self.deadline = self.t0 + float(t["deadline_s"])
        self.transfer_timeout = float(t["transfer_s"])
        self.pair_timeout = float(t["pair_s"])
        run_dir = params["run_dir"]
        self.rdv = os.path.join(run_dir, "rendezvous")
        self.results_path = os.path.join(run_dir, "results", f"{agent_id}.json")
        self.ucx_log = os.path.join(run_dir, "logs", f"ucx-{agent_id}.log")
        self.names = {a["id"]: f"tkv-{params['run_id'][:8]}-{a['id']}" for a in params["agents"]}
        self.ids_by_name = {v: k for k, v in self.names.items()}
        self.inbox: dict[str, list] = {}
        self.gone: dict[str, str] = {}  # peer -> why it cannot take part any more
        self.missing: dict[str, str] = {}
        self.peers: dict[str, dict] = {}
        self.dlists: dict = {}
        self.layouts: dict = {}
        self.fault = params.get("fault") or {}
        self._fault_fired = False
        self._last_gone_check = 0.0
        self.result = {
            "protocol": PROTOCOL, "agent": agent_id, "role": self.role, "node": self.me["node"],
            "host": socket.gethostname(), "pid": os.getpid(), "final": False, "stage": "starting",
            "error": None, "preflight": [], "pairs": [], "sweep": [], "missing_peers": {},
            "memory": None, "nixl": None, "started": time.time(), "finished": None,
            "transports": [],
        }

    # -- bookkeeping --------------------------------------------------------------------------
    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} {self.id}] {msg}", flush=True)

    def check(self, name: str, status: str, detail: str) -> dict:
        item = {"name": name, "status": status, "detail": detail}
        self.result["preflight"].append(item)
        self.log(f"preflight {name}: {status} - {detail}")
        return item

    def save(self) -> None:
        self.result["missing_peers"] = dict(self.missing)
        self.result["gave_up_on"] = dict(self.gone)
        _write_json(self.results_path, self.result)

    def stage(self, what: str) -> None:
        self.result["stage"] = what
        self.log(what)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    # -- main -----------------------------------------------------------------------------------
    def run(self) -> int:
        watchdog = threading.Thread(target=self._watchdog, daemon=True)
        watchdog.start()
        try:
            if self.fault.get("kind") == "absent" and self.fault.get("agent") == self.id:
                self.log("fault injection: absent (never joins the rendezvous)")
                while True:
                    time.sleep(3600)
            self.stage("preflight")
            if not self._preflight():
                self._publish(ok=False)
                self.result["error"] = self.result["error"] or "preflight failed"
                return self._finish(1)
            self._publish(ok=True)
            self.stage("rendezvous")
            self._rendezvous()
            self.save()
            for r, pairs in enumerate(self.p["rounds"]):
                mine = [(s, d) for s, d in pairs if self.id in (s, d)]
                if not mine:
                    continue
                src, dst = mine[0]
                peer = dst if self.id == src else src
                self.stage(f"round {r}: {src} -> {dst}")
                self._run_pair(r, src, dst, peer)
                self.save()
            self._transport_check()
            self.save()
            _touch(os.path.join(self.rdv, "done", self.id))  # every pair of mine is over
            self.stage("barrier")
            self._barrier()
            return self._finish(0)
        except Exception as exc:  # noqa: BLE001 - the verdict must be written whatever happens
            self.result["error"] = f"{type(exc).__name__}: {exc}"
            self.log(traceback.format_exc())
            return self._finish(1)

    def _finish(self, code: int) -> int:
        self.result["final"] = True
        self.result["finished"] = time.time()
        self.stage("finished" if code == 0 else "finished with errors")
        self.save()
        _touch(os.path.join(self.rdv, "done", self.id))
        return code

    def _watchdog(self) -> None:
        while True:
            time.sleep(1.0)
            if self.left() < 0:
                self.result["error"] = (f"agent deadline ({self.p['timeouts']['deadline_s']}s) exceeded during "
                                        f"'{self.result['stage']}'")
                self.result["final"] = True
                try:
                    self.save()
                    self.log(self.result["error"])
                finally:
                    os._exit(3)

    # -- 1-2: environment and preflight -----------------------------------------------------------
    def _preflight(self) -> bool:
        env = self.p["env"].get(self.role, {})
        inherited = {k: v for k, v in os.environ.items()
                     if k.startswith(("UCX_", "NIXL_", "FI_")) and k not in env}
        for k, v in env.items():
            os.environ[k] = str(v)
        if self.p.get("proto_info", True) and self.p["backend"] == "UCX":
            os.environ.setdefault("UCX_PROTO_INFO", "y")
            os.environ.setdefault("UCX_LOG_FILE", self.ucx_log)
        applied = [k for k in env if os.environ.get(k) == str(env[k])]
        shown = ", ".join(f"{k}={env[k]}" for k in env if k.startswith(("UCX_", "NIXL_", "FI_", "TRTLLM_NIXL")))
        detail = f"applied {len(applied)} variable(s) of the {self.role} role env ({shown or 'no UCX/NIXL variables'})"
        if inherited:
            detail += "; also inherited from the node: " + ", ".join(f"{k}={v}" for k, v in sorted(inherited.items()))
        self.check("env", "pass" if len(applied) == len(env) else "fail", detail)

        ok = True
        if np is None:
            self.check("numpy", "fail", "numpy is not importable; the agent needs it to fill and check buffers")
            return False
        mod, how = _import_nixl()
        if mod is None:
            self.check("nixl_import", "fail", how)
            self.result["error"] = f"NIXL is not importable: {how}"
            return False
        self.nixl_mod = mod
        self.result["nixl"] = how
        self.check("nixl_import", "pass", f"{how['module']} {how['version']}")

        n_gpus, gpu_detail = gpu_count()
        if shutil.which("nvidia-smi") or n_gpus:
            self.check("gpus", "pass" if n_gpus else "fail", gpu_detail)
        else:
            self.check("gpus", "not_present", gpu_detail)
        self._nic_check()
        self._peermem_check(n_gpus)

        memory = self.p["memory"]
        if memory == "auto":
            memory = "vram" if n_gpus else "dram"
        if memory == "vram" and not n_gpus:
            self.check("memory", "fail", f"--memory vram, but no GPU is visible on {socket.gethostname()} ({gpu_detail})")
            self.result["error"] = "VRAM requested but no GPU is visible"
            return False

        backend = self.p["backend"]
        try:
            cfg = mod.nixl_agent_config(enable_prog_thread=bool(self.p.get("progress_thread", True)),
                                        enable_listen_thread=False, backends=[backend])
            self.nixl = mod.nixl_agent(self.names[self.id], cfg)
            plugins = list(self.nixl.get_plugin_list())
            if backend not in self.nixl.backends:
                self.check("backend", "fail",
                           f"NIXL could not create the {backend} backend (plugins found: {', '.join(plugins)}; "
                           f"check NIXL_PLUGIN_DIR and the UCX libraries)")
                return False
            mems = list(self.nixl.get_backend_mem_types(backend))
            need = "VRAM_SEG" if memory == "vram" else "DRAM_SEG"
            if need not in mems:
                self.check("backend", "fail", f"{backend} backend does not support {need} (it has {', '.join(mems)})")
                return False
            self.check("backend", "pass", f"{backend} created; memory types {', '.join(mems)}; "
                       f"progress thread {'on' if self.p.get('progress_thread', True) else 'off'}")
        except Exception as exc:  # noqa: BLE001
            self.check("backend", "fail", f"creating the NIXL agent with {backend} failed: {type(exc).__name__}: {exc}")
            self.result["error"] = f"NIXL agent creation failed: {exc}"
            return False

        pool_bytes = int(self.p["geometry"]["pool_bytes"][self.role])
        try:
            if memory == "vram":
                self.pool = VramPool(pool_bytes, int(self.me.get("gpu") or 0))
            else:
                self.pool = DramPool(pool_bytes)
            self.reg = self.nixl.register_memory([(self.pool.addr, pool_bytes, self.pool.dev, "")], self.pool.mem,
                                                 backends=[backend])
        except Exception as exc:  # noqa: BLE001
            self.check("memory", "fail", f"allocating/registering {pool_bytes} bytes of {memory.upper()} failed: "
                       f"{type(exc).__name__}: {exc}")
            self.result["error"] = f"memory registration failed: {exc}"
            return False
        self.result["memory"] = {"type": self.pool.mem, "bytes": pool_bytes, "allocator": self.pool.how,
                                 "gpu": self.pool.dev if self.pool.mem == "VRAM" else None}
        note = "" if memory == self.p["memory"] else f" (auto: {'GPU found' if n_gpus else 'no GPU'})"
        self.check("memory", "pass", f"{self.pool.mem} pool of {pool_bytes / 2**20:.1f} MiB registered once "
                   f"with {backend} via {self.pool.how}{note}")
        return ok

    def _nic_check(self) -> None:
        tool = shutil.which("ibv_devinfo")
        rdma = bool(self.p.get("expect", {}).get("rdma"))
        if not tool:
            devs = sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir("/sys/class/infiniband") else []
            if devs:
                self.check("nics", "pass", f"RDMA devices {', '.join(devs)} (ibv_devinfo not installed, states unknown)")
            else:
                self.check("nics", "not_present", "ibv_devinfo not found and no /sys/class/infiniband devices")
            return
        try:
            out = subprocess.run([tool], capture_output=True, text=True, timeout=15, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.check("nics", "fail", f"ibv_devinfo did not answer: {exc}")
            return
        text = out.stdout + out.stderr
        if "No IB devices found" in text or not text.strip():
            self.check("nics", "not_present", "ibv_devinfo: no RDMA devices")
            return
        ports, dev = [], None
        for line in text.splitlines():
            s = line.strip()
            if s.startswith("hca_id:"):
                dev = s.split(":", 1)[1].strip()
            elif s.startswith("port:"):
                port = s.split(":", 1)[1].strip()
            elif s.startswith("state:") and dev:
                ports.append((dev, port, s.split(":", 1)[1].strip()))
        active = [f"{d}:{p}" for d, p, st in ports if "ACTIVE" in st]
        down = [f"{d}:{p} {st}" for d, p, st in ports if "ACTIVE" not in st]
        if active:
            self.check("nics", "pass", f"active ports {', '.join(active)}" + (f"; not active: {', '.join(down)}" if down else ""))
        else:
            self.check("nics", "fail" if rdma else "pass",
                       f"no ACTIVE RDMA port ({', '.join(down) or 'none'})"
                       + ("" if rdma else "; not needed by this transport profile"))

    def _peermem_check(self, n_gpus: int) -> None:
        if not n_gpus:
            self.check("nvidia_peermem", "not_present", "no NVIDIA GPU on this node")
            return
        if os.path.isdir("/sys/module/nvidia_peermem") or os.path.exists("/sys/kernel/mm/memory_peers/nv_mem/version"):
            self.check("nvidia_peermem", "pass", "GPUDirect RDMA peer memory module loaded")
        else:
            self.check("nvidia_peermem", "not_present",
                       "nvidia_peermem is not loaded: GPUDirect RDMA needs it unless UCX can use DMA-BUF "
                       "(rdma-core >= 41, CUDA >= 11.7); slow or failing VRAM transfers point here")

    def _transport_check(self) -> None:
        if not (self.p.get("proto_info", True) and self.p["backend"] == "UCX"):
            self.check("ucx_transport", "not_present", "UCX protocol info disabled")
            return
        if os.environ.get("UCX_LOG_FILE") != self.ucx_log:
            self.check("ucx_transport", "not_present", "UCX_LOG_FILE is set by the environment; protocol info not read")
            return
        try:
            with open(self.ucx_log, errors="replace") as f:
                tables = parse_ucx_proto_info(f.read())
        except OSError:
            tables = []
        if not tables:
            self.check("ucx_transport", "not_present", "UCX printed no protocol selection for RMA (no transfer ran?)")
            return
        seen = {}
        for t in tables:
            if t["scope"] == "self":
                continue
            seen.setdefault(t["scope"], set()).update(t["transports"])
        self.result["transports"] = [{"scope": s, "transports": sorted(v)} for s, v in sorted(seen.items())]
        desc = "; ".join(f"{s}: {', '.join(sorted(v))}" for s, v in sorted(seen.items())) or "self only"
        inter = seen.get("inter-node", set())
        tcp = sorted(t for t in inter if t.startswith("tcp"))
        if self.p.get("expect", {}).get("rdma") and tcp:
            self.check("ucx_transport", "fail", f"TCP fallback: inter-node RMA uses {', '.join(tcp)} but the "
                       f"{self.p['expect']['transport']} profile expects RDMA ({desc})")
        elif not inter:
            self.check("ucx_transport", "pass", f"{desc} (peers on this host only; no inter-node transport exercised)")
        else:
            self.check("ucx_transport", "pass", desc)

    # -- 4: rendezvous --------------------------------------------------------------------------
    def _publish(self, ok: bool) -> None:
        os.makedirs(self.rdv, exist_ok=True)
        info = {"protocol": PROTOCOL, "id": self.id, "name": self.names[self.id], "host": socket.gethostname(),
                "pid": os.getpid(), "ok": ok, "error": self.result["error"]}
        if ok:
            md = self.nixl.get_agent_metadata()
            _write_bytes(os.path.join(self.rdv, f"{self.id}.md"), md)
            info["pool"] = {"addr": self.pool.addr, "bytes": self.pool.nbytes, "mem": self.pool.mem,
                            "dev": self.pool.dev}
        _write_json(os.path.join(self.rdv, f"{self.id}.json"), info)  # last: its presence means md is there

    def _partners(self) -> list:
        out = []
        for pairs in self.p["rounds"]:
            for s, d in pairs:
                if self.id in (s, d):
                    out.append(d if self.id == s else s)
        return out

    def _rendezvous(self) -> None:
        want = set(self._partners())
        limit = time.monotonic() + float(self.p["timeouts"]["rendezvous_s"])
        while want:
            for peer in sorted(want):
                info = _read_json(os.path.join(self.rdv, f"{peer}.json"))
                if info is not None:
                    want.discard(peer)
                    if not info.get("ok"):
                        self.missing[peer] = f"{peer} failed its preflight: {info.get('error') or 'see its log'}"
                        continue
                    try:
                        with open(os.path.join(self.rdv, f"{peer}.md"), "rb") as f:
                            name = self.nixl.add_remote_agent(f.read())
                        if isinstance(name, bytes):
                            name = name.decode()
                        info["nixl_name"] = name
                        self.peers[peer] = info
                    except Exception as exc:  # noqa: BLE001
                        self.missing[peer] = f"loading {peer}'s NIXL metadata failed: {type(exc).__name__}: {exc}"
                    continue
                code = self._exit_code(peer)
                if code is not None:
                    want.discard(peer)
                    self.missing[peer] = f"{peer} exited (code {code}) before the rendezvous (log: logs/{peer}.log)"
            if not want:
                break
            if time.monotonic() > limit:
                for peer in sorted(want):
                    self.missing[peer] = (f"{peer} never showed up: no metadata in {self.rdv} after "
                                          f"{self.p['timeouts']['rendezvous_s']}s (is its node up? log: logs/{peer}.log)")
                break
            time.sleep(0.2)
        for peer, why in self.missing.items():
            self.gone[peer] = why
            self.log(f"missing peer: {why}")
        self.log(f"rendezvous done: {len(self.peers)} peer(s) loaded, {len(self.missing)} missing")

    def _exit_code(self, peer: str):
        try:
            with open(os.path.join(self.rdv, "exited", peer)) as f:
                return f.read().strip() or "?"
        except OSError:
            return None

    def _barrier(self) -> None:
        """Stay reachable until every partner has finished its pairs (a READ needs its source alive)."""
        want = set(self._partners()) - set(self.missing) - set(self.gone)
        limit = time.monotonic() + min(self.transfer_timeout, max(1.0, self.left()))
        while want and time.monotonic() < limit:
            for peer in sorted(want):
                if (os.path.exists(os.path.join(self.rdv, "done", peer)) or self._exit_code(peer) is not None
                        or os.path.exists(os.path.join(self.rdv, "unresponsive", peer))):
                    want.discard(peer)
            time.sleep(0.2)
        if want:
            self.log(f"barrier: {', '.join(sorted(want))} not done after {self.transfer_timeout:g}s; leaving anyway")

    # -- messages --------------------------------------------------------------------------------
    def send(self, peer: str, msg: str) -> None:
        try:
            self.nixl.send_notif(self.peers[peer]["nixl_name"], msg.encode())
        except Exception as exc:  # noqa: BLE001
            code = self._exit_code(peer)
            if code is not None:
                self.gone[peer] = f"{peer} exited with code {code} (log: logs/{peer}.log)"
                raise PairError(f"{self.gone[peer]}; sending it a control message failed "
                                f"({type(exc).__name__})") from None
            raise PairError(f"sending a control message to {peer} failed: {type(exc).__name__}: {exc}") from None

    def _pump(self) -> None:
        for name, msgs in self.nixl.get_new_notifs().items():
            peer = self.ids_by_name.get(name if isinstance(name, str) else name.decode(), str(name))
            self.inbox.setdefault(peer, []).extend(m.decode(errors="replace") for m in msgs)

    def _peer_gone(self, peer: str) -> str | None:
        now = time.monotonic()
        if now - self._last_gone_check < 0.25:
            return None
        self._last_gone_check = now
        code = self._exit_code(peer)
        if code is not None:
            return f"{peer} exited with code {code} (log: logs/{peer}.log)"
        if os.path.exists(os.path.join(self.rdv, "done", peer)):
            return f"{peer} finished without completing this pair (it gave up on it; see its result)"
        marker = _read_json(os.path.join(self.rdv, "unresponsive", peer))
        if marker:
            return f"{peer} stopped answering ({marker['by']}: {marker['why']})"
        return None

    def wait(self, peer: str, r: int, prefixes: tuple, timeout: float, what: str) -> str:
        limit = time.monotonic() + min(timeout, max(0.0, self.left()))
        sleep = 0.0
        while True:
            self._pump()
            q = self.inbox.get(peer, [])
            for i, m in enumerate(q):
                if m.startswith(prefixes):
                    return q.pop(i)
                if m.startswith(f"{r}|abort|"):
                    q.pop(i)
                    raise PairError(f"{peer} aborted the pair: {m.split('|', 2)[2]}")
            gone = self._peer_gone(peer)
            if gone:
                self.gone[peer] = gone
                raise PairError(f"{gone}, while waiting for {what}")
            if time.monotonic() > limit:
                why = f"no answer from {peer} within {timeout:g}s while waiting for {what}"
                self.gone[peer] = f"{peer} stopped answering: {why}"
                path = os.path.join(self.rdv, "unresponsive", peer)
                if not os.path.exists(path):  # tell its other partners, so they do not wait for it too
                    _write_json(path, {"by": self.id, "why": why})
                raise PairError(why)
            if sleep:
                time.sleep(sleep)
            sleep = min(0.002, sleep + 0.0001)

    # -- transfers -------------------------------------------------------------------------------
    def _layout(self, side: str, tpb: int) -> WordLayout:
        k = (side, tpb)
        if k not in self.layouts:
            pool_bytes = int(self.p["geometry"]["pool_bytes"][side])
            self.layouts[k] = WordLayout(side_layout(self.p["geometry"], side, tpb), pool_bytes)
        return self.layouts[k]

    def _dlist(self, who: str, tpb: int):
        """Prepared descriptor list of every fragment of a pool: mine (who=self.id) or a peer's."""
        k = (who, tpb)
        if k not in self.dlists:
            if who == self.id:
                wl = self._layout(self.role, tpb)
                arr = wl.dlist(self.pool.addr, self.pool.dev)
                self.dlists[k] = self.nixl.prep_xfer_dlist("NIXL_INIT_AGENT", arr, self.pool.mem,
                                                           backends=[self.p["backend"]])
            else:
                info = self.peers[who]
                role = "gen" if self.role == "ctx" else "ctx"
                wl = self._layout(role, tpb)
                arr = wl.dlist(int(info["pool"]["addr"]), int(info["pool"]["dev"]))
                self.dlists[k] = self.nixl.prep_xfer_dlist(info["nixl_name"], arr, info["pool"]["mem"],
                                                           backends=[self.p["backend"]])
        return self.dlists[k]

    def xfer(self, op: str, peer: str, tpb: int, lidx, ridx, notif: str) -> tuple[float, float]:
        """One request: make the transfer from prepared lists, post, poll to DONE. (prep s, post->DONE s)."""
        t_prep = time.perf_counter()
        try:
            h = self.nixl.make_prepped_xfer(op, self._dlist(self.id, tpb), lidx, self._dlist(peer, tpb), ridx,
                                            notif.encode(), backends=[self.p["backend"]])
        except Exception as exc:  # noqa: BLE001
            raise PairError(f"NIXL could not create the {op} request: {type(exc).__name__}: {exc}") from None
        t0 = time.perf_counter()
        try:
            state = self.nixl.transfer(h, notif.encode())
            n = 0
            while state == "PROC":
                n += 1
                if not n & 1023 and time.perf_counter() - t0 > self.transfer_timeout:
                    raise PairError(f"{op} transfer did not complete within {self.transfer_timeout:g}s "
                                    f"(state PROC); {peer} may be hung or the network stalled")
                state = self.nixl.check_xfer_state(h)
            dt = time.perf_counter() - t0
            if state != "DONE":
                raise PairError(f"{op} transfer ended in state {state}")
        except PairError:
            _release(h)
            raise
        except Exception as exc:  # noqa: BLE001
            _release(h)
            raise PairError(f"{op} transfer failed: {type(exc).__name__}: {exc}") from None
        _release(h)
        return t0 - t_prep, dt

    # -- 5: one pair -----------------------------------------------------------------------------
    def _run_pair(self, r: int, src: str, dst: str, peer: str) -> None:
        ops = [("WRITE", "W"), ("READ", "R")]
        records = {}
        for op, _ in ops:
            rec = {"src": src, "dst": dst, "op": op, "round": r,
                   "side": ("initiator" if (op == "WRITE") == (self.id == src) else "target"),
                   "verifier": self.id == dst, "lengths": [], "error": None}
            records[op] = rec
            self.result["pairs"].append(rec)
        if peer in self.gone:
            for rec in records.values():
                rec["error"] = f"not run: {self.gone[peer]}"
            return
        geom = self.p["geometry"]
        tpb = int(geom["tokens_per_block"])
        current = None
        phase = "start"
        try:
            self.send(peer, f"{r}|hello|")
            self.wait(peer, r, (f"{r}|hello|",), self.pair_timeout, f"{peer} to start round {r}")
            phase = "lengths"
            for li, tokens in enumerate(self.p["lengths"]):
                for op, code in ops:
                    current = records[op]
                    entry = self._run_op(r, src, dst, peer, op, code, li, tokens, tpb,
                                         self.p["iterations"], self.p["warmup"])
                    current["lengths"].append(entry)
                    if entry.get("error") and not current["error"]:
                        current["error"] = entry["error"]
            current = None
            phase = "sweep"
            sweep = self.p.get("sweep")
            if sweep:
                for s in sweep["tokens_per_block"]:
                    entry = self._run_op(r, src, dst, peer, "WRITE", f"S{s}", 0, int(sweep["tokens"]), int(s),
                                         int(sweep["iterations"]), 1)
                    entry.update({"src": src, "dst": dst, "tokens_per_block": int(s)})
                    self.result["sweep"].append(entry)
            self.send(peer, f"{r}|bye|")
            self.wait(peer, r, (f"{r}|bye|",), self.transfer_timeout, f"{peer} to finish round {r}")
        except PairError as exc:
            why = str(exc)
            if phase == "sweep":
                why = f"during the tokens_per_block sweep: {why}"
            self.log(f"round {r} with {peer} failed: {why}")
            try:
                self.send(peer, f"{r}|abort|{self.id}: {why}"[:900])
            except PairError:
                pass
            for rec in records.values():
                if rec["error"]:
                    continue
                if rec is current or phase != "lengths":
                    rec["error"] = why
                else:
                    rec["error"] = f"{'not completed' if rec['lengths'] else 'not run'}: {why}"

    def _run_op(self, r, src, dst, peer, op, code, li, tokens, tpb, iterations, warmup) -> dict:
        """One (request length, op) between this pair: warm-up + timed iterations, every one verified."""
        wl_src = self._layout("ctx", tpb)
        wl_dst = self._layout("gen", tpb)
        nb = ceil_to(tpb, tokens) // tpb
        seed = (self.p["run_id"], src, dst, r, code, li)
        src_blocks = block_table((*seed, "src"), wl_src.nblocks, nb)
        dst_blocks = block_table((*seed, "dst"), wl_dst.nblocks, nb)
        nbytes = nb * sum(n for _, n in wl_src.lay["frags"])
        key_src = key_of(*seed, "src")
        entry = {"tokens": tokens, "tokens_per_block": tpb, "blocks": nb, "bytes": nbytes,
                 "descriptors": nb * wl_src.nfrags, "iterations": iterations, "warmup": warmup,
                 "latencies_s": [], "prep_s": [], "bytes_verified": 0, "transfers_verified": 0, "error": None}
        total = warmup + iterations
        i_am_src = self.id == src
        tag = f"{r}|{code}|{li}"
        is_fault = (lambda kind: self.fault.get("kind") == kind and self.fault.get("agent") == self.id
                    and not self._fault_fired)

        if op == "WRITE":
            if i_am_src:
                fill_blocks(self.pool.host, wl_src, src_blocks, key_src)
                self.pool.push(wl_src, src_blocks)
                lidx, ridx = wl_src.desc_indices(src_blocks), wl_dst.desc_indices(dst_blocks)
                while True:
                    m = self.wait(peer, r, (f"{tag}|rdy|", f"{tag}|end|"), self.transfer_timeout,
                                  f"{peer} to prepare its destination ({op}, {tokens} tokens)")
                    parts = m.split("|")
                    if parts[3] == "end":
                        if parts[4] != "ok":
                            entry["error"] = "|".join(parts[5:]) or f"{peer} reported a verification failure"
                        break
                    it = int(parts[4])
                    prep, dt = self.xfer("WRITE", peer, tpb, lidx, ridx, f"{tag}|wd|{it}|")
                    if it >= warmup:
                        entry["latencies_s"].append(dt)
                        entry["prep_s"].append(prep)
                    if (is_fault("kill") or is_fault("hang")) and li == 0:
                        self._die()
            else:
                for it in range(total):
                    key_stale = key_of(*seed, "stale", it)
                    self._stale(wl_dst, dst_blocks, key_stale, whole=(it == 0))
                    self.send(peer, f"{tag}|rdy|{it}|")
                    self.wait(peer, r, (f"{tag}|wd|{it}|",), self.transfer_timeout,
                              f"{peer}'s WRITE of the {tokens}-token request (iteration {it})")
                    err = self._verify(entry, wl_dst, dst_blocks, wl_src, src_blocks, key_src, key_stale, it,
                                       src, dst, op, tokens)
                    if err:
                        return self._failed(entry, peer, tag, err)
                    if (is_fault("kill") or is_fault("hang")) and li == 0 and it == 0:
                        self._die()
                self.send(peer, f"{tag}|end|ok|")
            return entry

        # READ: the generation side pulls
        if i_am_src:
            fill_blocks(self.pool.host, wl_src, src_blocks, key_src)
            self.pool.push(wl_src, src_blocks)
            self.send(peer, f"{tag}|src|")
            m = self.wait(peer, r, (f"{tag}|end|",), self.transfer_timeout * (total + 1) + 10,
                          f"{peer} to finish its READs of the {tokens}-token request")
            parts = m.split("|")
            if parts[4] != "ok":
                entry["error"] = "|".join(parts[5:]) or f"{peer} reported a failure"
            return entry
        self.wait(peer, r, (f"{tag}|src|",), self.transfer_timeout,
                  f"{peer} to fill the source of the {tokens}-token request")
        lidx, ridx = wl_dst.desc_indices(dst_blocks), wl_src.desc_indices(src_blocks)
        for it in range(total):
            key_stale = key_of(*seed, "stale", it)
            self._stale(wl_dst, dst_blocks, key_stale, whole=(it == 0))
            try:
                prep, dt = self.xfer("READ", peer, tpb, lidx, ridx, "")
            except PairError as exc:
                self._failed(entry, peer, tag, str(exc))
                raise
            if it >= warmup:
                entry["latencies_s"].append(dt)
                entry["prep_s"].append(prep)
            err = self._verify(entry, wl_dst, dst_blocks, wl_src, src_blocks, key_src, key_stale, it,
                               src, dst, op, tokens)
            if err:
                return self._failed(entry, peer, tag, err)
        self.send(peer, f"{tag}|end|ok|")
        return entry

    def _failed(self, entry: dict, peer: str, tag: str, why: str) -> dict:
        """Record why this request length and op failed, and tell the peer, which awaits the verdict."""
        entry["error"] = why
        self.send(peer, f"{tag}|end|fail|{why}"[:900])
        return entry

    def _stale(self, wl, blocks, key, whole: bool) -> None:
        """The destination's own pattern: the whole pool before a request's first transfer, else its blocks."""
        fill_blocks(self.pool.host, wl, np.arange(wl.nblocks) if whole else blocks, key)
        self.pool.push(wl, None if whole else blocks)

    def _verify(self, entry, wl_dst, dst_blocks, wl_src, src_blocks, key_src, key_stale, it,
                src, dst, op, tokens) -> str | None:
        self.pool.pull(wl_dst, None if it == 0 else dst_blocks)
        if self.fault.get("kind") == "corrupt" and self.fault.get("agent") == self.id and not self._fault_fired:
            self._fault_fired = True
            b = dst_blocks[len(dst_blocks) // 2]
            o = (len(wl_dst.pos) // 2)
            word = b * wl_dst.bw + int(wl_dst.pos[o])
            self.pool.host.view(np.uint8)[word * 8 + 3] ^= 0x5A
            self.log(f"fault injection: corrupted one byte of pool block {b} after the {op}")
        try:
            n = verify_blocks(self.pool.host, wl_dst, dst_blocks, wl_src, src_blocks, key_src, key_stale)
            if it == 0:
                n += verify_untouched(self.pool.host, wl_dst, dst_blocks, key_stale)
        except Mismatch as exc:
            d = exc.detail
            if d["request_block"] is None:
                where = f"pool block {d['pool_block']} (outside the request) was modified"
            else:
                where = (f"block {d['request_block']} of {len(dst_blocks)} (destination pool block "
                         f"{d['pool_block']}), {d['where']}")
            kind = " - stale: the destination still holds its pre-transfer pattern" if d.get("stale") else ""
            entry["mismatch"] = d
            return (f"data mismatch {src} -> {dst} {op}, {tokens}-token request, iteration {it}: {where}, "
                    f"first bad byte at offset {d['offset']} of the block (expected word {d['expected']}, got "
                    f"{d['got']}); {d['bad_words']} bad 8-byte word(s){kind}")
        entry["bytes_verified"] += n
        entry["transfers_verified"] += 1
        return None

    def _die(self) -> None:
        self._fault_fired = True
        self.save()
        if self.fault["kind"] == "hang":
            self.log("fault injection: hang (this agent stops answering mid-run)")
            while True:
                time.sleep(3600)
        self.log("fault injection: kill (this agent exits mid-run)")
        os.kill(os.getpid(), signal.SIGKILL)


def _release(h) -> None:
    try:
        h.release()
    except Exception as exc:  # noqa: BLE001 - a handle that cannot be cancelled is leaked, not fatal
        print(f"releasing a transfer handle failed ({type(exc).__name__}); leaked", flush=True)


def _import_nixl():
    """(module, {module, version}) or (None, reason). `nixl._api`, then the CUDA-specific wheels."""
    errors = []
    for name, dist in (("nixl._api", ("nixl", "nixl-cu12", "nixl-cu13")), ("nixl_cu12._api", ("nixl-cu12",)),
                       ("nixl_cu13._api", ("nixl-cu13",))):
        try:
            mod = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        version = "unknown"
        try:
            from importlib import metadata

            for d in dist:
                try:
                    version = f"{d} {metadata.version(d)}"
                    break
                except metadata.PackageNotFoundError:
                    continue
        except ImportError:
            pass
        return mod, {"module": name, "version": version}
    return None, "; ".join(errors)


def _write_bytes(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_json(path: str, doc) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _write_bytes(path, (json.dumps(doc, indent=1) + "\n").encode())


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _touch(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _write_bytes(path, b"")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: agent.pyz PARAMS_JSON AGENT_ID", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        params = json.load(f)
    if params.get("protocol") != PROTOCOL:
        print(f"params protocol {params.get('protocol')} != agent protocol {PROTOCOL}", file=sys.stderr)
        return 2
    code = Agent(params, argv[1]).run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip NIXL/UCX teardown: every peer is done (barrier) and exit frees everything


if __name__ == "__main__":
    sys.exit(main())
