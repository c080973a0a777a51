"""Spec: membership storage that the proxy's clients cannot write (issue 21, C1), against Debian's real etcd-server
running with client-certificate authentication.

- TensorRT-LLM's etcd client (and the stand-in, which behaves as it does) sends no credentials and speaks no TLS:
  pointed straight at the run's etcd, it cannot read or write a key.
- tk's gateway (templates/etcd_gateway.py) carries both of etcd's protocols, gRPC (etcdctl, as TensorRT-LLM's
  client) and the JSON gateway (the stand-in, membership.py), into that etcd with the run's certificate, and ends
  with the command it was started for.
- Two deployments sharing one external etcd never see each other's workers (each run's own cluster name).
- Every user of a node reaches its loopback: the gateway carries only its own user's connections (the owner of the
  other end, from the kernel's socket tables), and the etcd's peer port speaks only TLS to the run's peer
  certificate, as the job starts it (toolkit.render.job.ETCD_SH).
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
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
from toolkit.render.job import ETCD_SH
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
    """Debian's etcd, started by the job's own command (ETCD_SH) with a run's certificates: clients and peers must
    hold a certificate of the run's own authority. Yields (client port, peer port, certificates)."""
    if ETCD is None:
        pytest.skip("etcd is not installed (scripts/setup installs etcd-server)")
    certs = write_run_certificates(tmp_path / "secrets" / "etcd")
    client, peer = _free_port(), _free_port()
    proc = subprocess.Popen(["bash", "-c", ETCD_SH, "tk-etcd", "127.0.0.1", str(tmp_path / "etcd"), str(client),
                             str(peer), str(certs)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cert = (str(certs / "client.crt"), str(certs / "client.key"))

    def healthy():
        try:
            return requests.get(f"https://127.0.0.1:{client}/health", cert=cert, verify=False, timeout=2).ok
        except requests.RequestException:
            return False
    try:
        wait_until(healthy, 30, "etcd to answer over TLS")
        yield client, peer, certs
    finally:
        proc.terminate()
        proc.wait(15)


def _gateway(port: int, etcd_port: int, certs: Path, *command: str, log=None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(GATEWAY), "--listen", f"127.0.0.1:{port}", "--etcd",
                             f"127.0.0.1:{etcd_port}", "--tls-dir", str(certs), "--", *command], stderr=log)
    wait_until(lambda: _listening(port), 15, "the gateway to listen")
    return proc


async def _set(uri: str, key: str = "/trtllm-disagg/x/workers/ROGUE") -> bool:
    """A worker registering as TensorRT-LLM's client does (etcd's JSON gateway, no TLS, no credentials)."""
    client = C.EtcdClient(uri)
    try:
        return await client.set(key, "{}", ttl=30)
    finally:
        await client.close()


def try_set(uri: str, key: str = "/trtllm-disagg/x/workers/ROGUE") -> bool:
    return asyncio.run(_set(uri, key))


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_trtllms_client_cannot_reach_the_runs_etcd_and_the_gateway_carries_grpc_and_json(tls_etcd, tmp_path):
    etcd_port, _, certs = tls_etcd

    # as TensorRT-LLM's Etcd3ClusterStorage: no TLS, no credentials (a user:password@ part is not sent)
    assert not try_set(f"etcd://127.0.0.1:{etcd_port}")
    assert not try_set(f"etcd://root:secret@127.0.0.1:{etcd_port}")
    assert C.etcd_endpoints("etcd://root:secret@h1:1,h2:2") == ["h1:1", "h2:2"]
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"https://127.0.0.1:{etcd_port}/health", verify=False, timeout=5)  # TLS without a certificate

    gw = _free_port()
    proc = _gateway(gw, etcd_port, certs, "sleep", "30")
    try:
        assert try_set(f"etcd://127.0.0.1:{gw}")  # JSON gateway over HTTP/1.1, through the gateway
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


def _load_gateway_module():
    spec = importlib.util.spec_from_file_location("etcd_gateway", GATEWAY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _keys(etcd_port: int, certs: Path, prefix: str) -> list[str]:
    """The keys under `prefix`, read with the run's certificate straight from etcd."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    doc = requests.post(f"https://127.0.0.1:{etcd_port}/v3/kv/range", verify=False, timeout=10,
                        cert=(str(certs / "client.crt"), str(certs / "client.key")),
                        json={"key": base64.b64encode(prefix.encode()).decode(),
                              "range_end": base64.b64encode(end.encode()).decode(), "keys_only": True}).json()
    return [base64.b64decode(k["key"]).decode() for k in doc.get("kvs", [])]


def test_the_gateway_carries_only_its_own_users_connections(tls_etcd, tmp_path, capsys):
    """The owner of each connection's other end comes from the kernel's socket tables (the real lookup, no fake):
    the gateway's own user registers through it; a gateway of another uid refuses the same connection, says why
    in its log, and nothing reaches etcd."""
    etcd_port, _, certs = tls_etcd
    gateway_module = _load_gateway_module()

    async def register_through_gateway_of(uid: int, key: str) -> bool:
        gateway = gateway_module.Gateway([("127.0.0.1", etcd_port)], str(certs), uid=uid)
        server = await asyncio.start_server(gateway.handle, "127.0.0.1", 0)
        async with server:
            return await _set(f"etcd://127.0.0.1:{server.sockets[0].getsockname()[1]}", key)

    assert asyncio.run(register_through_gateway_of(os.getuid(), "/trtllm-disagg/x/workers/MINE"))
    assert not asyncio.run(register_through_gateway_of(os.getuid() + 1, "/trtllm-disagg/x/workers/NOT-ITS-USERS"))
    uid = os.getuid()
    assert f"its socket belongs to uid {uid}, not to this gateway's uid {uid + 1}" in capsys.readouterr().err
    assert _keys(etcd_port, certs, "/trtllm-disagg/x/") == ["/trtllm-disagg/x/workers/MINE"]


SYSTEM_PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)
OTHER_USER = 65534  # nobody
REGISTER_AS_ANOTHER_USER = """
import base64, http.client, json, sys
key = base64.b64encode(b"/trtllm-disagg/x/workers/NOBODY").decode()
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=20)
try:
    conn.request("POST", "/v3/kv/put", body=json.dumps({"key": key, "value": "e30="}))
    print("answered", conn.getresponse().status)
except (OSError, http.client.HTTPException) as exc:
    print("refused", type(exc).__name__)
"""


@pytest.mark.skipif(os.getuid() != 0 or SYSTEM_PYTHON is None, reason="needs root to run a client as another user")
def test_another_user_on_the_node_cannot_register_through_the_gateway(tls_etcd, tmp_path):
    """A real second user (nobody) connects to the running gateway's loopback port as the other job on a shared node
    would: the connection is dropped before a byte reaches etcd, and the gateway's log names its uid."""
    etcd_port, _, certs = tls_etcd
    gw, log = _free_port(), tmp_path / "gateway.log"
    with open(log, "wb") as stderr:
        proc = _gateway(gw, etcd_port, certs, "sleep", "60", log=stderr)
    try:
        other = subprocess.run([SYSTEM_PYTHON, "-c", REGISTER_AS_ANOTHER_USER, str(gw)], user=OTHER_USER,
                               group=OTHER_USER, extra_groups=[], cwd="/", capture_output=True, text=True, timeout=60)
        assert other.stdout.startswith("refused"), (other.stdout, other.stderr)
        assert try_set(f"etcd://127.0.0.1:{gw}", "/trtllm-disagg/x/workers/MINE")  # its own user still passes
        assert _keys(etcd_port, certs, "/trtllm-disagg/x/") == ["/trtllm-disagg/x/workers/MINE"]
        assert (f"its socket belongs to uid {OTHER_USER}, not to this gateway's uid 0"
                in log.read_text()), log.read_text()
    finally:
        proc.kill()
        proc.wait(10)


def test_the_etcds_peer_port_speaks_only_tls_to_the_runs_peer_certificate(tls_etcd):
    """The peer port is on loopback, which every user of the node reaches: plain HTTP, TLS without a certificate
    and the run's client certificate (which every gateway presents) are all refused; the peer certificate gets
    etcd's member list, whose peer URL is https."""
    _, peer_port, certs = tls_etcd
    url = f"127.0.0.1:{peer_port}/members"
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://{url}", timeout=10)
    for cert in (None, (str(certs / "client.crt"), str(certs / "client.key"))):
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(f"https://{url}", cert=cert, verify=False, timeout=10)
    members = requests.get(f"https://{url}", cert=(str(certs / "peer.crt"), str(certs / "peer.key")),
                           verify=str(certs / "ca.crt"), timeout=10)  # checked against ca.crt and 127.0.0.1
    assert members.status_code == 200
    assert [m["peerURLs"] for m in members.json()] == [[f"https://{url.rsplit('/', 1)[0]}"]]


def _launch(name: str, base: int, etcd_port: int, certs: Path, env: dict) -> dict:
    return tk_json("launch", str(STANDIN_RECIPE), "--local", "--run-dir", str(Path(env["TK_RUNS_DIR"]) / name),
                   "--set", "context.instances=1", "--set", "generation.instances=1",
                   "--set", f"proxy.port={base}", "--set", f"cluster.worker_base_port={base + 10}",
                   "--set", f"cluster.internal_base_port={base + 20}", "--set", f"membership.etcd_port={base + 30}",
                   "--set", "membership.enabled=true", "--set", f"membership.etcd_endpoint=127.0.0.1:{etcd_port}",
                   "--set", f"membership.etcd_tls_dir={certs}", env=env, timeout=400)


def test_two_deployments_sharing_one_etcd_never_see_each_others_workers(tls_etcd, tmp_path):
    etcd_port, _, certs = tls_etcd
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
        names = {base64.b64decode(k["key"]).decode().split("/")[2] for k in keys}
        assert len(names) == 2 and all(n.startswith("standin-2p2d-") for n in names), names
    finally:
        for record in runs:
            tk("stop", record["run_dir"], env=env, timeout=120)
    for record in runs:
        assert json.loads((Path(record["run_dir"]) / "run.json").read_text())["state"] == "stopped"
