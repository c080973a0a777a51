"""`tk validate cluster`: the agent that runs on every node (one process per node and role).

    python3 agent.pyz PARAMS_JSON AGENT_ID      (the toolkit ships this package as RUN_DIR/agent.pyz)

What one agent does, in order (every wait is bounded; every failure ends in a written verdict):

1. apply its role's environment (the recipe's ctx.env / gen.env: UCX_TLS ...) *before* importing NIXL;
2. preflight: numpy and NIXL importable (version), the backend (UCX) created with the memory type it
   needs, the environment applied, GPUs (nvidia-smi), RDMA NICs (ibv_devinfo), nvidia_peermem;
3. allocate and register one buffer (the KV pool of its role; DRAM, or VRAM when a GPU is used);
4. rendezvous through files in the run directory: write its NIXL metadata (tmp + rename), poll for
   every peer's, bounded; a peer that never shows up is named in the result;
5. for every round of the round-robin schedule, the pair it belongs to (validation.pair): WRITE and READ
   of KV-shaped requests of three lengths, context -> generation and back, every byte of every transfer
   verified, then the tokens_per_block sweep;
6. write its result file (results/AGENT.json) after every pair, wait (bounded) for the others, exit.
"""

from __future__ import annotations

import copy
import os
import socket
import threading
import time
import traceback

try:
    import numpy as np
except ImportError:  # pragma: no cover - reported as a preflight failure
    np = None

from validation import probes, wire
from validation.faults import Faults
from validation.memory import DramPool, vram_pool
from validation.messages import Channel
from validation.pair import PairRunner, Transfers
from validation.rundir import METADATA_MAX_BYTES, RunDir, TooLarge, read_bounded, read_json, touch, write_bytes, write_json
from validation.schedule import my_pair, partners


# The watchdog waits this long for a save in progress (the main thread's) before it writes its verdict anyway.
SAVE_WAIT_S = 5.0
SNAPSHOT_TRIES = 20


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
        self.rundir = RunDir(params["run_dir"])
        self.rdv = self.rundir.rendezvous
        self.results_path = self.rundir.result(agent_id)
        self.ucx_log = self.rundir.ucx_log(agent_id)
        self.names = wire.nixl_names(params)
        self.gone: dict[str, str] = {}  # peer -> why it cannot take part any more
        self.missing: dict[str, str] = {}
        self.peers: dict[str, dict] = {}
        self.faults = Faults(params.get("fault"), agent_id, self.log)
        self.result = wire.new_result(agent_id, self.role, self.me["node"])
        # the main thread and the watchdog both write results/AGENT.json: one at a time, each from a snapshot
        self._save_lock = threading.Lock()

    # -- bookkeeping --------------------------------------------------------------------------
    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} {self.id}] {msg}", flush=True)

    def check(self, name: str, status: str, detail: str) -> dict:
        item = wire.check_item(name, status, detail)
        self.result["preflight"].append(item)
        self.log(f"preflight {name}: {status} - {detail}")
        return item

    def save(self) -> None:
        """Write the result document (results/AGENT.json) as it stands: one writer at a time."""
        with self._save_lock:
            write_json(self.results_path, self._snapshot())

    def _snapshot(self) -> dict:
        """A deep copy of the result with the peers missing and given up on. Only the main thread changes the
        result; the watchdog's copy may meet a change in progress, and takes it again."""
        for _ in range(SNAPSHOT_TRIES):
            try:
                doc, missing, gone = copy.deepcopy((self.result, self.missing, self.gone))
                break
            except RuntimeError:  # a dict changed size while it was copied
                time.sleep(0.005)
        else:  # the main thread never held still: what is sure, and why the rest is not there
            doc = {k: v for k, v in list(self.result.items()) if v is None or isinstance(v, (str, int, float))}
            doc["pairs"], doc["preflight"], doc["sweep"] = [], [], []
            missing, gone = {}, {}
            doc["error"] = f"{doc.get('error') or ''} (the result changed while it was saved; details lost)".strip()
        doc["missing_peers"] = missing
        doc["gave_up_on"] = gone
        return doc

    def stage(self, what: str) -> None:
        self.result["stage"] = what
        self.log(what)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    # -- main -----------------------------------------------------------------------------------
    def run(self, work=None) -> int:
        """Everything above; the exit code. work(agent, channel, transfers), when given, runs instead of the
        schedule's pairs (benchmarks/bench_validate.py runs the validator and a raw loop side by side)."""
        watchdog = threading.Thread(target=self._watchdog, daemon=True)
        watchdog.start()
        try:
            self.faults.stay_absent()
            self.stage("preflight")
            if not self._preflight():
                self._publish(ok=False)
                self.result["error"] = self.result["error"] or "preflight failed"
                return self._finish(1)
            self._publish(ok=True)
            self.stage("rendezvous")
            self._rendezvous()
            self.save()
            self._rounds(work)
            self.result["memory"]["copied_to_host_bytes"] = self.pool.pulled_bytes  # for checks: none on a device
            self._transport_check()
            self.save()
            touch(self.rundir.done(self.id))  # every pair of mine is over
            self.stage("barrier")
            self._barrier()
            return self._finish(0)
        except Exception as exc:  # noqa: BLE001 - the verdict must be written whatever happens
            self.result["error"] = f"{type(exc).__name__}: {exc}"
            self.log(traceback.format_exc())
            return self._finish(1)

    def _rounds(self, work=None) -> None:
        channel = Channel(self.id, self.nixl, self.rundir, self.names, self.peers, self.gone, self.left)
        transfers = Transfers(self.p, self.id, self.role, self.nixl, self.pool, self.peers, self.transfer_timeout)
        if work is not None:
            work(self, channel, transfers)
            return
        runner = PairRunner(self, transfers, channel)
        for r, pairs in enumerate(self.p["rounds"]):
            mine = my_pair(pairs, self.id)
            if mine is None:
                continue
            src, dst = mine
            peer = dst if self.id == src else src
            self.stage(f"round {r}: {src} -> {dst}")
            runner.run_pair(r, src, dst, peer)
            self.save()

    def _finish(self, code: int) -> int:
        self.result["final"] = True
        self.result["finished"] = time.time()
        self.stage("finished" if code == 0 else "finished with errors")
        self.save()
        touch(self.rundir.done(self.id))
        return code

    def _watchdog(self) -> None:
        while True:
            time.sleep(1.0)
            if self.left() < 0:
                self._give_up(os._exit)

    def _give_up(self, exit_) -> None:
        """The deadline passed (watchdog thread): write the verdict, from a snapshot, and end the process with 3.
        It waits up to SAVE_WAIT_S for a save in progress and then holds the lock to the end, so no older
        document replaces its verdict; a main thread stuck in its write longer does not stop it."""
        self._save_lock.acquire(timeout=SAVE_WAIT_S)  # never released: the process ends here
        try:
            doc = self._snapshot()
            doc["error"] = (f"agent deadline ({self.p['timeouts']['deadline_s']}s) exceeded during "
                            f"'{doc.get('stage')}'")
            doc["final"] = True
            write_json(self.results_path, doc)
            self.log(doc["error"])
        finally:
            exit_(3)

    # -- 1-3: environment, preflight, the registered pool -------------------------------------------
    def _ucx_proto_info(self) -> bool:
        return bool(self.p.get("proto_info", True) and self.p["backend"] == "UCX")

    def _preflight(self) -> bool:
        self._apply_env()
        if not self._import_libraries():
            return False
        n_gpus, gpu_detail = self._probe_node()
        memory = self._choose_memory(n_gpus, gpu_detail)
        if memory is None or not self._create_backend(memory):
            return False
        return self._register_pool(memory, n_gpus)

    def _apply_env(self) -> None:
        env = self.p["env"].get(self.role, {})
        ucx_log = self.ucx_log if self._ucx_proto_info() else None
        self.check("env", *probes.apply_role_env(env, self.role, ucx_log))

    def _import_libraries(self) -> bool:
        if np is None:
            self.check("numpy", "fail", "numpy is not importable; the agent needs it to fill and check buffers")
            return False
        mod, how = probes.import_nixl()
        if mod is None:
            self.check("nixl_import", "fail", how)
            self.result["error"] = f"NIXL is not importable: {how}"
            return False
        self.nixl_mod = mod
        self.result["nixl"] = how
        self.check("nixl_import", "pass", f"{how['module']} {how['version']}")
        return True

    def _probe_node(self) -> tuple[int, str]:
        n_gpus, gpu_detail = probes.gpu_count()
        self.check("gpus", probes.gpus_status(n_gpus), gpu_detail)
        self.check("nics", *probes.nic_check(bool(self.p.get("expect", {}).get("rdma"))))
        self.check("nvidia_peermem", *probes.peermem_check(n_gpus))
        return n_gpus, gpu_detail

    def _choose_memory(self, n_gpus: int, gpu_detail: str) -> str | None:
        """dram or vram (auto: vram when a GPU is visible); None when vram is asked for and there is no GPU."""
        memory = self.p["memory"]
        if memory == "auto":
            memory = "vram" if n_gpus else "dram"
        if memory == "vram" and not n_gpus:
            self.check("memory", "fail", f"--memory vram, but no GPU is visible on {socket.gethostname()} ({gpu_detail})")
            self.result["error"] = "VRAM requested but no GPU is visible"
            return None
        return memory

    def _create_backend(self, memory: str) -> bool:
        backend = self.p["backend"]
        try:
            return self._new_nixl_agent(backend, "VRAM_SEG" if memory == "vram" else "DRAM_SEG")
        except Exception as exc:  # noqa: BLE001
            self.check("backend", "fail", f"creating the NIXL agent with {backend} failed: {type(exc).__name__}: {exc}")
            self.result["error"] = f"NIXL agent creation failed: {exc}"
            return False

    def _new_nixl_agent(self, backend: str, need: str) -> bool:
        mod = self.nixl_mod
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
        if need not in mems:
            self.check("backend", "fail", f"{backend} backend does not support {need} (it has {', '.join(mems)})")
            return False
        self.check("backend", "pass", f"{backend} created; memory types {', '.join(mems)}; "
                   f"progress thread {'on' if self.p.get('progress_thread', True) else 'off'}")
        return True

    def _register_pool(self, memory: str, n_gpus: int) -> bool:
        backend = self.p["backend"]
        pool_bytes = int(self.p["geometry"]["pool_bytes"][self.role])
        try:
            if memory == "vram":
                self.pool = vram_pool(pool_bytes, int(self.me.get("gpu") or 0))
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
                                 "gpu": self.pool.dev if self.pool.mem == "VRAM" else None, "checks": self.pool.checks}
        note = "" if memory == self.p["memory"] else f" (auto: {'GPU found' if n_gpus else 'no GPU'})"
        self.check("memory", "pass", f"{self.pool.mem} pool of {pool_bytes / 2**20:.1f} MiB registered once "
                   f"with {backend} via {self.pool.how}{note}; checks on the {self.pool.checks}")
        return True

    def _transport_check(self) -> None:
        if not self._ucx_proto_info():
            self.check("ucx_transport", "not_present", "UCX protocol info disabled")
            return
        if os.environ.get("UCX_LOG_FILE") != self.ucx_log:
            self.check("ucx_transport", "not_present", "UCX_LOG_FILE is set by the environment; protocol info not read")
            return
        tables, truncated = probes.read_ucx_proto_info(self.ucx_log)
        cut = (f"; only the first {probes.UCX_LOG_MAX_BYTES >> 20} MiB of {self.ucx_log} were read (is UCX_LOG_LEVEL "
               "raised?)" if truncated else "")
        if not tables:
            self.check("ucx_transport", "not_present",
                       f"UCX printed no protocol selection for RMA (no transfer ran?){cut}")
            return
        seen = probes.transports_by_scope(tables)
        self.result["transports"] = [{"scope": s, "transports": sorted(v)} for s, v in sorted(seen.items())]
        status, detail = probes.transport_verdict(seen, self.p.get("expect", {}))
        self.check("ucx_transport", status, detail + cut)
        choices = probes.protocol_choices(tables)
        for c in choices:
            c["agent"] = self.id
        self.result["protocols"] = choices
        self.check("ucx_protocol", *probes.protocol_verdict(choices, os.environ.get("UCX_TLS")))

    # -- 4: rendezvous --------------------------------------------------------------------------
    def _publish(self, ok: bool) -> None:
        os.makedirs(self.rdv, exist_ok=True)
        pool = None
        if ok:
            write_bytes(self.rundir.metadata(self.id), self.nixl.get_agent_metadata())
            pool = self.pool
        info = wire.rendezvous_info(self.id, self.names[self.id], ok, self.result["error"], pool)
        write_json(self.rundir.info(self.id), info)  # last: its presence means md is there

    def _load_peer(self, peer: str, info: dict) -> None:
        """A peer's rendezvous info is there: load its NIXL metadata, or note why it is missing."""
        if not info.get("ok"):
            self.missing[peer] = f"{peer} failed its preflight: {info.get('error') or 'see its log'}"
            return
        try:
            name = self.nixl.add_remote_agent(read_bounded(self.rundir.metadata(peer), METADATA_MAX_BYTES))
            if isinstance(name, bytes):
                name = name.decode()
            info["nixl_name"] = name
            self.peers[peer] = info
        except Exception as exc:  # noqa: BLE001
            self.missing[peer] = f"loading {peer}'s NIXL metadata failed: {type(exc).__name__}: {exc}"

    def _poll_peers(self, want: set) -> None:
        """One pass over the peers still awaited: load those that published, drop those that exited."""
        for peer in sorted(want):
            try:
                info = read_json(self.rundir.info(peer))
            except TooLarge as exc:
                want.discard(peer)
                self.missing[peer] = f"{peer}'s rendezvous info was not read: {exc}"
                continue
            if info is not None and not isinstance(info, dict):
                want.discard(peer)
                self.missing[peer] = f"{peer}'s rendezvous info {self.rundir.info(peer)} is not a JSON object"
                continue
            if info is not None:
                want.discard(peer)
                self._load_peer(peer, info)
                continue
            code = self.rundir.exit_code(peer)
            if code is not None:
                want.discard(peer)
                self.missing[peer] = f"{peer} exited (code {code}) before the rendezvous (log: logs/{peer}.log)"

    def _rendezvous(self) -> None:
        want = set(partners(self.p["rounds"], self.id))
        limit = time.monotonic() + float(self.p["timeouts"]["rendezvous_s"])
        while want:
            self._poll_peers(want)
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

    def _barrier(self) -> None:
        """Stay reachable until every partner has finished its pairs (a READ needs its source alive)."""
        want = set(partners(self.p["rounds"], self.id)) - set(self.missing) - set(self.gone)
        limit = time.monotonic() + min(self.transfer_timeout, max(1.0, self.left()))
        while want and time.monotonic() < limit:
            for peer in sorted(want):
                if (self.rundir.is_done(peer) or self.rundir.exit_code(peer) is not None
                        or self.rundir.is_unresponsive(peer)):
                    want.discard(peer)
            time.sleep(0.2)
        if want:
            self.log(f"barrier: {', '.join(sorted(want))} not done after {self.transfer_timeout:g}s; leaving anyway")
