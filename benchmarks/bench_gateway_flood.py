#!/usr/bin/env python3
"""The etcd gateway under another user's flood (hostile round 4, H1): does the run's own worker keep its lease?

Side by side in one run, against one real etcd (Debian's, with the run's certificates, as the job starts it):

  old       templates/etcd_gateway.py as of --old (default 70942f5): every owner lookup reads /proc/net/tcp{,6} on the
            event loop (up to 3 passes), and a refused connection holds one of the 256 places meanwhile
  new       templates/etcd_gateway.py as it is: the exact lookup (the kernel's socket diagnostics, netlink)
  fallback  the same file with the socket diagnostics taken away: /proc read off the event loop, bounded

For each: a worker of the gateway's own user (this process, as TensorRT-LLM's defaults have it: a lease of
--ttl 10 s kept alive every --heartbeat 5 s, a new connection through the gateway each time, 5 s client timeout)
while another user (uid 65534; this script must run as root to become it) holds --idle idle loopback connections
(2 rows each in /proc/net/tcp) and opens --bursts bursts of --burst connections to the gateway, one burst every
--every seconds (connect, shutdown(SHUT_WR)), as H1 did. Printed: the heartbeats that failed, the longest time
between two keep-alives that arrived, whether the lease (and its key) survived, and the owner lookup's own cost.

Target (issue 31): no lease lost under the flood. Usage (root; machine-wide lock: it binds ports):
    flock /tmp/tk-heavy.lock python3 benchmarks/bench_gateway_flood.py [--bursts 6] [--idle 5000]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from toolkit.render.job import ETCD_SH  # noqa: E402
from toolkit.runtime.tls import write_run_certificates  # noqa: E402

OTHER_UID = 65534  # nobody
FALLBACK = ("import runpy, sys; sys.argv[0] = {path!r}; "
            "ns = runpy.run_path({path!r}, run_name='gateway'); "
            "ns['exact_owners'].__globals__['exact_owners'] = lambda sock: (None, 'taken away by the benchmark'); "
            "sys.exit(ns['main'](sys.argv[1:]))")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def start_etcd(work: Path, certs: Path) -> tuple[subprocess.Popen, int]:
    client, peer = free_port(), free_port()
    proc = subprocess.Popen(["bash", "-c", ETCD_SH, "tk-etcd", "127.0.0.1", str(work / "etcd"), str(client),
                             str(peer), str(certs)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cert = (str(certs / "client.crt"), str(certs / "client.key"))

    def healthy() -> bool:
        try:
            return requests.get(f"https://127.0.0.1:{client}/health", cert=cert, verify=False, timeout=2).ok
        except requests.RequestException:
            return False
    wait_for(healthy, 30, "etcd")
    return proc, client


def start_gateway(variant: str, gateway_file: Path, port: int, etcd_port: int, certs: Path,
                  log: Path) -> subprocess.Popen:
    args = ["--listen", f"127.0.0.1:{port}", "--etcd", f"127.0.0.1:{etcd_port}", "--tls-dir", str(certs)]
    argv = [sys.executable, "-c", FALLBACK.format(path=str(gateway_file)), *args] if variant == "fallback" else \
        [sys.executable, str(gateway_file), *args]
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False
    wait_for(listening, 15, f"the {variant} gateway")
    return proc


def call(port: int, path: str, body: dict, timeout_s: float = 5.0) -> dict | None:
    """One request through the gateway on a new connection, as a worker whose session was reset makes it."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        doc = json.loads(resp.read(1 << 20) or b"{}")
        return doc if resp.status == 200 and isinstance(doc, dict) else None
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()


def flood(gateway_port: int, idle: int, bursts: int, burst: int, every_s: float, ready_fd: int) -> None:
    """In a child: become uid 65534, hold `idle` loopback connections, then the bursts (H1's recipe)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    need = 2 * idle + burst + 256  # both ends of each idle connection, one burst, the interpreter's own
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
    os.setgroups([])
    os.setgid(OTHER_UID)
    os.setuid(OTHER_UID)
    listener = socket.socket()
    listener.bind(("127.0.0.3", 0))
    listener.listen(4096)
    held = []
    for _ in range(idle):
        c = socket.socket()
        c.connect(listener.getsockname())
        held += [c, listener.accept()[0]]
    os.write(ready_fd, b"r")
    for _ in range(bursts):
        t0 = time.monotonic()
        opened = []
        for _ in range(burst):
            s = socket.socket()
            s.settimeout(2)
            try:
                s.bind(("127.0.0.3", 0))
                s.connect(("127.0.0.1", gateway_port))
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            opened.append(s)
        time.sleep(max(0.0, every_s - (time.monotonic() - t0)))
        for s in opened:
            s.close()


def lookup_cost(gateway_file: Path, idle_rows: int) -> tuple[float, float] | None:
    """ms per owner lookup of one connection, /proc table read vs the socket diagnostics, with the flood's idle
    connections in the tables (measured in this process)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gw_bench", gateway_file)
    gw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gw)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    owners, _ = gw.exact_owners(listener)
    client = socket.create_connection(listener.getsockname())
    accepted, peer = listener.accept()
    c, s = gw.canonical_address(*peer[:2]), gw.canonical_address(*accepted.getsockname()[:2])
    try:
        t0 = time.perf_counter()
        for _ in range(20):
            gw.connection_owner(c, s)
        table_ms = (time.perf_counter() - t0) / 20 * 1000
        if owners is None:
            return table_ms, float("nan")
        t0 = time.perf_counter()
        for _ in range(2000):
            owners(c, s)
        return table_ms, (time.perf_counter() - t0) / 2000 * 1000
    finally:
        client.close()
        accepted.close()
        listener.close()


def start_flood(gateway_port: int, idle: int, bursts: int, burst: int, every_s: float, what: str) -> int:
    """Fork the other user's flood (flood()); return once its idle connections are open: the child's pid."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.close(r)
            flood(gateway_port, idle, bursts, burst, every_s, w)
            code = 0
        except BaseException as exc:  # noqa: BLE001 - said; the parent then stops
            print(f"{what} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        finally:
            os._exit(code)
    os.close(w)
    if os.read(r, 1) != b"r":
        raise SystemExit(f"{what} could not start (the other user's idle connections)")
    os.close(r)
    return child


class Heartbeats(threading.Thread):
    """The worker's keep-alives of its lease through the gateway, every `every_s`, each on a new connection:
    (when, whether the lease was still alive) per beat."""

    def __init__(self, port: int, lease: int, every_s: float):
        super().__init__(daemon=True)
        self.port, self.lease, self.every_s = port, lease, every_s
        self.beats: list[tuple[float, bool]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.every_s):
            doc = call(self.port, "/v3/lease/keepalive", {"ID": self.lease})
            ttl = int(((doc or {}).get("result") or {}).get("TTL", 0) or 0)
            self.beats.append((time.monotonic(), ttl > 0))

    def longest_gap(self, t0: float) -> float:
        """The longest time without a keep-alive that arrived, from t0 to now (the last gap runs to the end)."""
        ok_times = [t0] + [t for t, ok in self.beats if ok] + [time.monotonic()]
        gaps = [b - a for a, b in zip(ok_times, ok_times[1:])]
        return max(gaps) if gaps else float("inf")


def refusals_logged(log: Path) -> int:
    """The refusals a gateway's log names: one line each, then "N refused in the last minute" counts."""
    text = log.read_text(errors="replace")
    return text.count("refused a connection") + sum(
        int(line.split()[1]) for line in text.splitlines() if line.endswith("refused in the last minute"))


def stop_gateway(gateway: subprocess.Popen) -> None:
    gateway.send_signal(signal.SIGTERM)
    try:
        gateway.wait(10)
    except subprocess.TimeoutExpired:
        gateway.kill()
        gateway.wait(10)


def one_variant(variant: str, gateway_file: Path, etcd_port: int, certs: Path, work: Path, a) -> dict:
    port = free_port()
    log = work / f"gateway-{variant}.log"
    gateway = start_gateway(variant, gateway_file, port, etcd_port, certs, log)
    try:
        granted = call(port, "/v3/lease/grant", {"TTL": a.ttl})
        lease = granted["ID"]
        key = base64.b64encode(f"/trtllm-disagg/bench/workers/GENERATION-{variant}".encode()).decode()
        assert call(port, "/v3/kv/put", {"key": key, "value": "e30=", "lease": lease}) is not None
        child = start_flood(port, a.idle, a.bursts, a.burst, a.every, "the flood")
        t0 = time.monotonic()
        heartbeats = Heartbeats(port, lease, a.heartbeat)
        heartbeats.start()
        os.waitpid(child, 0)
        time.sleep(a.heartbeat + 1)  # one more heartbeat after the flood
        heartbeats.stopped.set()
        heartbeats.join(a.heartbeat + 10)
        beats = heartbeats.beats
        alive = call(port, "/v3/lease/timetolive", {"ID": lease}) or {}
        kvs = (call(port, "/v3/kv/range", {"key": key}) or {}).get("kvs") or []
        return {"variant": variant, "heartbeats": len(beats), "failed": sum(1 for _, ok in beats if not ok),
                "longest_gap_s": heartbeats.longest_gap(t0),
                "lease": "kept" if int(alive.get("TTL", -1)) > 0 and kvs else "LOST",
                "refusals_logged": refusals_logged(log), "seconds": time.monotonic() - t0}
    finally:
        stop_gateway(gateway)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", default="70942f5", help="the commit of the old gateway")
    p.add_argument("--variants", default="old,new,fallback")
    p.add_argument("--idle", type=int, default=5000, help="idle loopback connections of the other user")
    p.add_argument("--bursts", type=int, default=6)
    p.add_argument("--burst", type=int, default=256)
    p.add_argument("--every", type=float, default=4.5)
    p.add_argument("--ttl", type=int, default=10, help="the worker's lease (TensorRT-LLM: inactive_timeout_sec 10)")
    p.add_argument("--heartbeat", type=float, default=5.0, help="TensorRT-LLM: heartbeat_interval_sec 5")
    return p.parse_args()


def flooded_variants(a, work: Path) -> list[dict]:
    """Every variant's row, one after another against one etcd."""
    certs = write_run_certificates(work / "secrets" / "etcd")
    old = work / "etcd_gateway_old.py"
    old.write_bytes(subprocess.run(["git", "-C", str(ROOT), "show", f"{a.old}:templates/etcd_gateway.py"],
                                   check=True, capture_output=True).stdout)
    files = {"old": old, "new": ROOT / "templates" / "etcd_gateway.py",
             "fallback": ROOT / "templates" / "etcd_gateway.py"}
    etcd, etcd_port = start_etcd(work, certs)
    rows = []
    try:
        for variant in a.variants.split(","):
            print(f"... {variant}: {a.idle} idle connections, {a.bursts} bursts of {a.burst} every {a.every:g}s "
                  "from uid 65534", flush=True)
            rows.append(one_variant(variant, files[variant], etcd_port, certs, work, a))
    finally:
        etcd.terminate()
        etcd.wait(15)
    return rows


def idle_lookup_cost(a) -> tuple[float, float] | None:
    """The lookup's own cost, with as many sockets in the tables as the flood held."""
    child = start_flood(free_port(), a.idle, 1, 0, 3 * (a.idle / 2000 + 1), "the idle connections")
    try:
        return lookup_cost(ROOT / "templates" / "etcd_gateway.py", 2 * a.idle)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def print_table(a, rows: list[dict], cost: tuple[float, float] | None) -> None:
    print()
    print(f"worker lease {a.ttl}s, keep-alive every {a.heartbeat:g}s through the gateway; flood: uid 65534, "
          f"{a.idle} idle connections, {a.bursts} x {a.burst} connections every {a.every:g}s")
    print(f"{'variant':<10}{'heartbeats':>11}{'failed':>8}{'longest gap':>13}{'lease':>7}{'wall':>8}"
          f"{'refusals logged':>17}")
    for row in rows:
        print(f"{row['variant']:<10}{row['heartbeats']:>11}{row['failed']:>8}{row['longest_gap_s']:>12.1f}s"
              f"{row['lease']:>7}{row['seconds']:>7.0f}s{row['refusals_logged']:>17}")
    print("(longest gap: without a keep-alive that arrived, from the flood's start to the end; refusals logged: at "
          "most 10 a minute, then a count at the next refusal a minute later)")
    if cost:
        table_ms, exact_ms = cost
        print(f"owner lookup with {2 * a.idle} extra sockets: /proc table {table_ms:.2f} ms, socket diagnostics "
              f"{exact_ms * 1000:.1f} us ({table_ms / exact_ms:.0f}x)")


def main() -> int:
    a = parse_args()
    if os.getuid() != 0:
        print("run as root: the flood runs as uid 65534", file=sys.stderr)
        return 2
    if shutil.which("etcd") is None:
        print("etcd is not installed (scripts/setup installs etcd-server)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tk-bench-gateway-") as tmp:
        rows = flooded_variants(a, Path(tmp))
        cost = idle_lookup_cost(a)
    print_table(a, rows, cost)
    return 0 if all(r["lease"] == "kept" for r in rows if r["variant"] != "old") else 1


if __name__ == "__main__":
    sys.exit(main())
