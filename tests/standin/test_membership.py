"""Membership TensorRT-LLM keeps itself (disagg_cluster): the stand-in's cluster storage, worker registration and
heartbeat, the proxy's routers following the registered workers, and tk's plan rules and rendering of it.
Everything on loopback, free ports, bounded (the whole file runs in about 15 s)."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
import yaml

from toolkit.errors import RecipeError
from toolkit.facts import trtllm

aiohttp = pytest.importorskip("aiohttp")
from aiohttp import web  # noqa: E402

from toolkit.standin import cluster as C  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def start_app(app, port):
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    return runner


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


# --- the storage protocol -----------------------------------------------------------------------------------------

def test_http_storage_routes_speak_trtllms_json():
    async def body():
        storage = C.HttpStorage()
        app = web.Application()
        storage.add_routes(app)
        port = free_port()
        runner = await start_app(app, port)
        await storage.start()
        try:
            async with aiohttp.ClientSession() as s:
                base = f"http://127.0.0.1:{port}"
                item = {"key": "/trtllm-disagg//workers/a", "value": "v1", "expire_time": -1, "ttl": 2,
                        "overwrite_if_exists": False}
                async with s.post(f"{base}/set", json=item) as r:
                    assert (r.status, await r.json()) == (200, {"result": True})
                async with s.post(f"{base}/set", json=item) as r:  # exists, no overwrite
                    assert (r.status, await r.json()) == (400, {"result": False})
                async with s.get(f"{base}/get", params={"key": item["key"]}) as r:
                    assert (r.status, await r.json()) == (200, {"result": "v1"})
                async with s.get(f"{base}/get_prefix", params={"key_prefix": "/trtllm-disagg//"}) as r:
                    assert await r.json() == {"result": {item["key"]: "v1"}}
                async with s.get(f"{base}/get_prefix", params={"key_prefix": "/x", "keys_only": "1"}) as r:
                    assert (r.status, await r.json()) == (400, {"result": {}})  # empty dict is falsy: 400
                async with s.get(f"{base}/expire", params={"key": "/nope", "ttl": "2"}) as r:
                    assert r.status == 400
                for _ in range(3):  # kept alive past its ttl by expire
                    await asyncio.sleep(0.8)
                    async with s.get(f"{base}/expire", params={"key": item["key"], "ttl": "2"}) as r:
                        assert r.status == 200
                await asyncio.sleep(3.2)  # no more expire: swept within ttl + 1 s
                async with s.get(f"{base}/get", params={"key": item["key"]}) as r:
                    assert (r.status, await r.json()) == (400, {"result": None})
                assert storage.set("k", "v")
                async with s.delete(f"{base}/delete", params={"key": "k"}) as r:
                    assert r.status == 200
                async with s.delete(f"{base}/delete", params={"key": "k"}) as r:
                    assert r.status == 400
        finally:
            await storage.stop()
            await runner.cleanup()
    run(body())


# --- a worker registers and heartbeats ----------------------------------------------------------------------------------

def _proxy_config(tmp_path, port, minimal=(1, 1), heartbeat=1, inactive=2, uri=None):
    cfg = {"hostname": "127.0.0.1", "port": port, "backend": "pytorch",
           "context_servers": {"num_instances": 2, "router": {"type": "round_robin"}},
           "generation_servers": {"num_instances": 1, "router": {"type": "kv_cache_aware"}},
           "disagg_cluster": {"cluster_uri": uri or f"http://127.0.0.1:{port}", "cluster_name": "t",
                              "minimal_instances": {"context_servers": minimal[0], "generation_servers": minimal[1]},
                              "heartbeat_interval_sec": heartbeat, "inactive_timeout_sec": inactive}}
    path = tmp_path / "disagg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_proxy_routes_only_registered_active_workers_drops_inactive_takes_restarted_back(tmp_path):
    from toolkit.standin.proxy import Proxy, parse_config
    port = free_port()
    s = parse_config(_proxy_config(tmp_path, port), trtllm.get("1.2"))
    assert s.ctx_urls == [] and s.cluster.minimal_context == 1 and s.cluster.key_prefix == "/trtllm-disagg/t/workers"

    async def body():
        proxy = Proxy(s)
        await proxy.open()
        runner = await start_app(proxy.app(), port)
        await proxy.cluster.start()
        workers = []
        try:
            async with aiohttp.ClientSession() as http:
                base = f"http://127.0.0.1:{port}"
                async with http.get(f"{base}/health") as r:
                    assert r.status == 500  # nobody registered: below minimal_instances
                async with http.post(f"{base}/v1/completions", json={"prompt": "a b", "max_tokens": 2}) as r:
                    assert r.status == 500
                    assert (await r.json())["detail"] == "Internal server error Cluster is not ready"
                ctx_a = C.ClusterWorker(s.cluster, "context", "127.0.0.1", 9101)
                ctx_b = C.ClusterWorker(s.cluster, "context", "127.0.0.1", 9102)
                gen = C.ClusterWorker(s.cluster, "generation", "127.0.0.1", 9103)
                workers = [ctx_a, ctx_b, gen]
                for w in workers:
                    assert await w.register()
                value = json.loads(proxy.cluster.storage.items[ctx_a.key][0])
                assert value == {"worker_id": ctx_a.worker_id, "host": "127.0.0.1", "port": 9101, "role": 0}
                assert ctx_a.key.startswith("/trtllm-disagg/t/workers/CONTEXT-127.0.0.1:9101-")
                assert proxy.ctx_router.servers == ["http://127.0.0.1:9101", "http://127.0.0.1:9102"]
                assert proxy.gen_router.servers == ["http://127.0.0.1:9103"]
                async with http.get(f"{base}/health") as r:
                    assert r.status == 200
                async with http.get(f"{base}/cluster_info") as r:
                    info = await r.json()
                assert info["is_ready"] and len(info["current_workers"]["context_servers"]) == 2
                picked = {proxy.ctx_router.get_next_server([1])[0] for _ in range(4)}
                assert picked == {"http://127.0.0.1:9101", "http://127.0.0.1:9102"}
                # heartbeats keep every worker past inactive_timeout_sec
                await asyncio.sleep(3.5)
                assert len(proxy.ctx_router.servers) == 2 and ctx_a.heartbeats >= 2
                # ctx_b stops heartbeating (a frozen or killed worker): dropped within inactive_timeout + sweep
                ctx_b._task.cancel()
                ctx_b._task = None
                await asyncio.sleep(3.5)
                assert proxy.ctx_router.servers == ["http://127.0.0.1:9101"]
                # the generation worker deregisters: the proxy is below minimal_instances again
                await gen.deregister()
                workers.remove(gen)
                async with http.get(f"{base}/health") as r:
                    assert r.status == 500
                # a restarted generation worker (new worker id) is taken back
                gen2 = C.ClusterWorker(s.cluster, "generation", "127.0.0.1", 9103)
                workers.append(gen2)
                assert await gen2.register()
                assert gen2.worker_id != gen.worker_id
                assert proxy.gen_router.servers == ["http://127.0.0.1:9103"]
                async with http.get(f"{base}/health") as r:
                    assert r.status == 200
        finally:
            for w in workers:
                await w.deregister()
            await proxy.cluster.stop()
            await runner.cleanup()
            await proxy.close()
    run(body())


def test_worker_reregisters_when_its_key_expired_and_retries_while_the_storage_is_away(tmp_path):
    port = free_port()
    cfg = C.ClusterConfig(cluster_uri=f"http://127.0.0.1:{port}", heartbeat_interval_sec=1, inactive_timeout_sec=2)

    async def body():
        w = C.ClusterWorker(cfg, "generation", "127.0.0.1", 9200)
        assert not await w.register(retry_interval=0)  # no storage yet
        task = asyncio.ensure_future(w.register(retry_interval=0.3))
        await asyncio.sleep(0.5)
        storage = C.HttpStorage()
        app = web.Application()
        storage.add_routes(app)
        runner = await start_app(app, port)
        try:
            assert await asyncio.wait_for(task, 5)
            assert w.key in storage.items
            storage.items.clear()  # a restarted proxy: its storage is empty
            await asyncio.sleep(1.6)
            assert w.key in storage.items and w.registrations == 2
        finally:
            await w.deregister()
            await runner.cleanup()
        assert w.key not in storage.items
    run(body())


def test_cluster_config_refuses_what_trtllm_refuses():
    with pytest.raises(C.ClusterConfigError, match="Key inactive_interval_sec not found in DisaggClusterConfig"):
        C.parse_cluster_config({"cluster_uri": "http://h:1", "inactive_interval_sec": 10})  # PR #8602's README typo
    with pytest.raises(C.ClusterConfigError, match="Invalid cluster storage URI"):
        C.parse_cluster_config({"cluster_uri": "h:1"})
    c = C.parse_cluster_config({"cluster_uri": "etcd://a:2379"}, cluster_uri="http://b:1")
    assert (c.cluster_uri, c.heartbeat_interval_sec, c.inactive_timeout_sec, c.minimal_context) == \
        ("http://b:1", 5, 10, 1)


def test_worker_command_line_takes_the_membership_flags(monkeypatch):
    from toolkit.standin.options import ConfigError, worker_settings
    monkeypatch.setenv("TK_STANDIN_TRTLLM_VERSION", "1.2")
    s = worker_settings(["tk/standin-tiny", "--host", "127.0.0.1", "--disagg_cluster_uri", "http://127.0.0.1:9",
                         "--server_role", "CONTEXT"])
    assert s.cluster.cluster_uri == "http://127.0.0.1:9" and s.server_role == "context"
    with pytest.raises(ConfigError, match="server_role is required"):
        worker_settings(["tk/standin-tiny", "--disagg_cluster_uri", "http://127.0.0.1:9"])
    monkeypatch.setenv("TK_STANDIN_TRTLLM_VERSION", "1.1")
    with pytest.raises(ConfigError, match="no such option: --disagg_cluster_uri"):
        worker_settings(["tk/standin-tiny", "--disagg_cluster_uri", "http://127.0.0.1:9", "--server_role", "context"])


# --- etcd: against a real etcd where one is installed ---------------------------------------------------------------

def test_etcd_storage_through_the_json_gateway(tmp_path):
    import shutil
    import subprocess
    import time
    etcd = shutil.which("etcd")
    if etcd is None:
        pytest.skip("etcd is not installed (apt-get install etcd-server)")
    client_port, peer_port = free_port(), free_port()
    proc = subprocess.Popen([etcd, "--name", "tk-test", "--data-dir", str(tmp_path / "etcd"),
                             "--listen-client-urls", f"http://127.0.0.1:{client_port}",
                             "--advertise-client-urls", f"http://127.0.0.1:{client_port}",
                             "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                             "--initial-cluster", f"tk-test=http://127.0.0.1:{peer_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async def body():
            cfg = C.ClusterConfig(cluster_uri=f"etcd://127.0.0.1:{client_port}", cluster_name="e",
                                  heartbeat_interval_sec=1, inactive_timeout_sec=2)
            client = C.EtcdClient(cfg.cluster_uri)
            deadline = time.monotonic() + 20
            while await client.get_prefix("/") is None:
                assert time.monotonic() < deadline, "etcd did not start"
                await asyncio.sleep(0.3)
            from toolkit.standin.routers import create_router
            ctx, gen = create_router({}, [], dynamic=True), create_router({}, [], dynamic=True)
            manager = C.ClusterManager(cfg, ctx, gen)
            await manager.start()
            w = C.ClusterWorker(cfg, "context", "127.0.0.1", 9300)
            try:
                assert await w.register()
                assert not await C.EtcdClient(cfg.cluster_uri).set(w.key, "x", ttl=2)  # put-if-absent
                got = await client.get_prefix(cfg.key_prefix)
                assert json.loads(got[w.key])["role"] == 0
                await asyncio.sleep(3.5)  # heartbeats (lease keep-alive) keep it
                assert ctx.servers == ["http://127.0.0.1:9300"]
                w._task.cancel()
                w._task = None
                await asyncio.sleep(4)  # the lease runs out: etcd deletes the key, the proxy drops the worker
                assert ctx.servers == [] and not manager.is_ready()
            finally:
                await w.deregister()
                await manager.stop()
                await client.close()
        run(body())
    finally:
        proc.terminate()
        proc.wait(10)


# --- tk: the plan's rules and what it renders -----------------------------------------------------------------------

def _plan(*sets):
    from toolkit import api
    return api.load_plan("standin-2p2d", overrides=list(sets)) if sets else api.load_plan("standin-2p2d")


def test_plan_membership_per_line_and_render():
    from toolkit.render import render_files, worker_command
    p = _plan()
    m = p.membership
    assert (m.storage, m.cluster_uri, m.heartbeat_interval_s, m.inactive_timeout_s) == \
        ("http", f"http://<node0>:{p.proxy.port}", 5, 10)
    # minimal_instances are the supervision minimum, not every instance: the proxy must keep serving while one
    # worker restarts
    assert (m.minimal_context, m.minimal_generation) == (1, 1)
    doc = yaml.safe_load(render_files(p)["disagg.yaml"])
    assert doc["disagg_cluster"]["minimal_instances"] == {"context_servers": 1, "generation_servers": 1}
    two = _plan("supervision.min_generation=2").membership
    assert (two.minimal_context, two.minimal_generation) == (1, 2)
    assert "urls" not in doc["context_servers"] and doc["context_servers"]["num_instances"] == 2
    ctx = p.context.instances[1]
    argv = worker_command(p, "ctx", ctx.port)
    assert argv[argv.index("--host") + 1] == f"<node{ctx.first_node}>"
    i = argv.index("--disagg_cluster_uri")
    assert argv[i:i + 4] == ["--disagg_cluster_uri", m.cluster_uri, "--server_role", "context"]
    for line in ("1.0", "1.1"):
        old = _plan(f"trtllm_version={line}", "kv_transfer.kv_transfer_timeout_ms=null")
        assert old.membership is None
        assert "urls" in yaml.safe_load(render_files(old)["disagg.yaml"])["context_servers"]
        argv = worker_command(old, "gen", old.generation.instances[0].port)
        # static urls: the worker binds <bindN> (0.0.0.0, or loopback where the node's address is loopback)
        assert "--disagg_cluster_uri" not in argv and argv[argv.index("--host") + 1] == "<bind2>"
    off = _plan("membership.enabled=false")
    assert off.membership is None
    etcd = _plan("membership.storage=etcd")
    assert etcd.membership.cluster_uri == "etcd://<node0>:2379" and etcd.membership.etcd.started_by_job
    assert 2379 in etcd.ports_by_node[0] and 2380 in etcd.ports_by_node[0]
    ext = _plan("membership.storage=etcd", "membership.etcd_endpoint=etcd1:2379")
    assert ext.membership.cluster_uri == "etcd://etcd1:2379" and not ext.membership.etcd.started_by_job


@pytest.mark.parametrize("sets, field, text", [
    (["trtllm_version=1.1", "kv_transfer.kv_transfer_timeout_ms=null", "membership.enabled=true"], "membership.enabled", "has no disagg_cluster"),
    (["membership.heartbeat_interval_s=10"], "membership.inactive_timeout_s", "must be greater than"),
    (["supervision.min_generation=3"], "supervision.min_generation", "the run could never meet it"),
    (["membership.etcd_endpoint=etcd1:2379"], "membership.etcd_endpoint", "only read with storage: etcd"),
    (["membership.storage=etcd", "membership.etcd_port=18000"], "membership.etcd_port", "already uses"),
])
def test_membership_rules_name_the_field(sets, field, text):
    with pytest.raises(RecipeError) as e:
        _plan(*sets)
    hits = [v for v in e.value.violations if v.field == field]
    assert hits and text in hits[0].message, e.value.violations
