"""Spec: membership storage that the proxy's clients cannot write (issue 21, C1), against Debian's real etcd-server
running with client-certificate authentication.

- TensorRT-LLM's etcd client (and the stand-in, which behaves as it does) sends no credentials and speaks no TLS:
  pointed straight at the run's etcd, it cannot read or write a key.
- tk's gateway (templates/etcd_gateway.py) carries both of etcd's protocols, gRPC (etcdctl, as TensorRT-LLM's
  client) and the JSON gateway (the stand-in, membership.py), into that etcd with the run's certificate, and ends
  with the command it was started for.
- Two deployments sharing one external etcd never see each other's workers (each run's own cluster name).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.integration.helpers import ROOT, STANDIN_RECIPE, tk, tk_json, wait_until
from toolkit.runtime.tls import write_run_certificates
from toolkit.standin import cluster as C

pytestmark = [pytest.mark.slow]

ETCD = shutil.which("etcd")
GATEWAY = ROOT / "templates" / "etcd_gateway.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tls_etcd(tmp_path):
    """Debian's etcd, opened only to a certificate of a run's own authority (as the job starts it)."""
    if ETCD is None:
        pytest.skip("etcd is not installed (scripts/setup installs etcd-server)")
    certs = write_run_certificates(tmp_path / "secrets" / "etcd")
    client, peer = _free_port(), _free_port()
    proc = subprocess.Popen([ETCD, "--name", "tk", "--data-dir", str(tmp_path / "etcd"),
                             "--listen-client-urls", f"https://127.0.0.1:{client}",
                             "--advertise-client-urls", f"https://127.0.0.1:{client}",
                             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-cluster", f"tk=http://127.0.0.1:{peer}",
                             "--client-cert-auth", "--trusted-ca-file", str(certs / "ca.crt"),
                             "--cert-file", str(certs / "server.crt"), "--key-file", str(certs / "server.key")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cert = (str(certs / "client.crt"), str(certs / "client.key"))

    def healthy():
        try:
            return requests.get(f"https://127.0.0.1:{client}/health", cert=cert, verify=False, timeout=2).ok
        except requests.RequestException:
            return False
    try:
        wait_until(healthy, 30, "etcd to answer over TLS")
        yield client, certs
    finally:
        proc.terminate()
        proc.wait(15)


def _gateway(port: int, etcd_port: int, certs: Path, *command: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(GATEWAY), "--listen", f"127.0.0.1:{port}", "--etcd",
                             f"127.0.0.1:{etcd_port}", "--tls-dir", str(certs), "--", *command])
    wait_until(lambda: _listening(port), 15, "the gateway to listen")
    return proc


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_trtllms_client_cannot_reach_the_runs_etcd_and_the_gateway_carries_grpc_and_json(tls_etcd, tmp_path):
    etcd_port, certs = tls_etcd

    async def try_set(uri: str) -> bool:
        client = C.EtcdClient(uri)
        try:
            return await client.set("/trtllm-disagg/x/workers/ROGUE", "{}", ttl=30)
        finally:
            await client.close()

    # as TensorRT-LLM's Etcd3ClusterStorage: no TLS, no credentials (a user:password@ part is not sent)
    assert not asyncio.run(try_set(f"etcd://127.0.0.1:{etcd_port}"))
    assert not asyncio.run(try_set(f"etcd://root:secret@127.0.0.1:{etcd_port}"))
    assert C.etcd_endpoints("etcd://root:secret@h1:1,h2:2") == ["h1:1", "h2:2"]
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"https://127.0.0.1:{etcd_port}/health", verify=False, timeout=5)  # TLS without a certificate

    gw = _free_port()
    proc = _gateway(gw, etcd_port, certs, "sleep", "30")
    try:
        assert asyncio.run(try_set(f"etcd://127.0.0.1:{gw}"))  # JSON gateway over HTTP/1.1, through the gateway
        etcdctl = shutil.which("etcdctl")
        if etcdctl:  # gRPC over HTTP/2, as TensorRT-LLM's client speaks it (Debian's etcd-client)
            env = {**os.environ, "ETCDCTL_API": "3"}
            put = subprocess.run([etcdctl, f"--endpoints=127.0.0.1:{gw}", "put", "/k", "v"], env=env,
                                 capture_output=True, text=True, timeout=30)
            assert put.returncode == 0 and "OK" in put.stdout, put.stderr
            got = subprocess.run([etcdctl, f"--endpoints=127.0.0.1:{gw}", "get", "/trtllm-disagg/", "--prefix",
                                  "--keys-only"], env=env, capture_output=True, text=True, timeout=30)
            assert "/trtllm-disagg/x/workers/ROGUE" in got.stdout, got.stderr
            direct = subprocess.run([etcdctl, f"--endpoints=127.0.0.1:{etcd_port}", "--dial-timeout=3s",
                                     "--command-timeout=5s", "get", "/k"], env=env, capture_output=True, text=True,
                                    timeout=30)
            assert direct.returncode != 0  # gRPC without TLS and certificate: refused
        # the gateway ends with the command it serves (the server's process; its PID is the command's)
        proc.wait(40)
        wait_until(lambda: not _listening(gw), 10, "the gateway to end with its command")
    finally:
        proc.kill()


def _launch(name: str, base: int, etcd_port: int, certs: Path, env: dict) -> dict:
    return tk_json("launch", str(STANDIN_RECIPE), "--local", "--run-dir", str(Path(env["TK_RUNS_DIR"]) / name),
                   "--set", "context.instances=1", "--set", "generation.instances=1",
                   "--set", f"proxy.port={base}", "--set", f"cluster.worker_base_port={base + 10}",
                   "--set", f"cluster.internal_base_port={base + 20}", "--set", f"membership.etcd_port={base + 30}",
                   "--set", "membership.enabled=true", "--set", f"membership.etcd_endpoint=127.0.0.1:{etcd_port}",
                   "--set", f"membership.etcd_tls_dir={certs}", env=env, timeout=400)


def test_two_deployments_sharing_one_etcd_never_see_each_others_workers(tls_etcd, tmp_path):
    etcd_port, certs = tls_etcd
    env = {"TK_RUNS_DIR": str(tmp_path / "runs"), "TK_STATE_DIR": str(tmp_path / "state")}
    runs = []
    try:
        runs.append(_launch("a", 29100, etcd_port, certs, env))
        runs.append(_launch("b", 29200, etcd_port, certs, env))
        ports = []
        for record in runs:
            info = requests.get(f"{record['endpoint']}/cluster_info", timeout=10).json()
            seen = {w["port"] for role in info["current_workers"].values() for w in role}
            own = {s["port"] for s in record["servers"] if s["role"] in ("ctx", "gen")}
            assert seen == own, (record["name"], seen, own)
            ports.append(own)
        assert not ports[0] & ports[1]
        keys = requests.post(f"https://127.0.0.1:{etcd_port}/v3/kv/range", verify=False, timeout=10,
                             cert=(str(certs / "client.crt"), str(certs / "client.key")),
                             json={"key": "Lw==", "range_end": "MA==", "keys_only": True}).json().get("kvs", [])
        import base64
        names = {base64.b64decode(k["key"]).decode().split("/")[2] for k in keys}
        assert len(names) == 2 and all(n.startswith("standin-2p2d-") for n in names), names
    finally:
        for record in runs:
            tk("stop", record["run_dir"], env=env, timeout=120)
    for record in runs:
        assert json.loads((Path(record["run_dir"]) / "run.json").read_text())["state"] == "stopped"
