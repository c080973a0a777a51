"""Membership TensorRT-LLM keeps itself (disagg_cluster): the stand-in's cluster storage, worker registration and
heartbeat, the proxy's routers following the registered workers, and tk's plan rules and rendering of it.
Everything on loopback, free ports, bounded (the whole file runs in about 15 s)."""

from __future__ import annotations

import asyncio
import contextlib
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


@contextlib.asynccontextmanager
async def _running_proxy(settings, port):
    """The stand-in proxy serving on `port` with its cluster storage, closed afterwards."""
    from toolkit.standin.proxy import Proxy
    proxy = Proxy(settings)
    await proxy.open()
    runner = await start_app(proxy.app(), port)
    await proxy.cluster.start()
    try:
        yield proxy
    finally:
        await proxy.cluster.stop()
        await runner.cleanup()
        await proxy.close()


async def _health(http, base) -> int:
    async with http.get(f"{base}/health") as r:
        return r.status


async def _register_two_context_one_generation(settings, proxy, http, base, workers: list) -> None:
    """Three workers register (added to `workers`, which the caller deregisters whatever happens): each one's key
    and value as TensorRT-LLM writes them, the routers follow, the proxy is ready and round-robins between the
    context workers."""
    ctx_a = C.ClusterWorker(settings.cluster, "context", "127.0.0.1", 9101)
    ctx_b = C.ClusterWorker(settings.cluster, "context", "127.0.0.1", 9102)
    gen = C.ClusterWorker(settings.cluster, "generation", "127.0.0.1", 9103)
    workers += [ctx_a, ctx_b, gen]
    for w in (ctx_a, ctx_b, gen):
        assert await w.register()
    value = json.loads(proxy.cluster.storage.items[ctx_a.key][0])
    assert value == {"worker_id": ctx_a.worker_id, "host": "127.0.0.1", "port": 9101, "role": 0}
    assert ctx_a.key.startswith("/trtllm-disagg/t/workers/CONTEXT-127.0.0.1:9101-")
    assert proxy.ctx_router.servers == ["http://127.0.0.1:9101", "http://127.0.0.1:9102"]
    assert proxy.gen_router.servers == ["http://127.0.0.1:9103"]
    assert await _health(http, base) == 200
    async with http.get(f"{base}/cluster_info") as r:
        info = await r.json()
    assert info["is_ready"] and len(info["current_workers"]["context_servers"]) == 2
    picked = {proxy.ctx_router.get_next_server([1])[0] for _ in range(4)}
    assert picked == {"http://127.0.0.1:9101", "http://127.0.0.1:9102"}


def test_proxy_routes_only_registered_active_workers_drops_inactive_takes_restarted_back(tmp_path):
    from toolkit.standin.proxy import parse_config
    port = free_port()
    s = parse_config(_proxy_config(tmp_path, port), trtllm.get("1.2"))
    assert s.ctx_urls == [] and s.cluster.minimal_context == 1 and s.cluster.key_prefix == "/trtllm-disagg/t/workers"
    base = f"http://127.0.0.1:{port}"

    async def body():
        workers: list = []
        async with _running_proxy(s, port) as proxy:
            try:
                async with aiohttp.ClientSession() as http:
                    assert await _health(http, base) == 500  # nobody registered: below minimal_instances
                    async with http.post(f"{base}/v1/completions", json={"prompt": "a b", "max_tokens": 2}) as r:
                        assert r.status == 500
                        assert (await r.json())["detail"] == "Internal server error Cluster is not ready"
                    await _register_two_context_one_generation(s, proxy, http, base, workers)
                    ctx_a, ctx_b, gen = workers
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
                    assert await _health(http, base) == 500
                    # a restarted generation worker (new worker id) is taken back
                    gen2 = C.ClusterWorker(s.cluster, "generation", "127.0.0.1", 9103)
                    workers.append(gen2)
                    assert await gen2.register()
                    assert gen2.worker_id != gen.worker_id
                    assert proxy.gen_router.servers == ["http://127.0.0.1:9103"]
                    assert await _health(http, base) == 200
            finally:
                for w in workers:
                    await w.deregister()
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
    # extract_disagg_cluster_config builds DisaggClusterConfig(cli_uri or block["cluster_uri"]) and then sets every key
    # of the block over it: a cluster_uri in the options file wins over --disagg_cluster_uri, whatever its docstring
    # says (tensorrt_llm/llmapi/disagg_utils.py @ 3e53e4ad); tk therefore writes none there
    c = C.parse_cluster_config({"cluster_uri": "etcd://a:2379"}, cluster_uri="http://b:1")
    assert (c.cluster_uri, c.heartbeat_interval_sec, c.inactive_timeout_sec, c.minimal_context) == \
        ("etcd://a:2379", 5, 10, 1)
    c = C.parse_cluster_config({"cluster_name": "x", "heartbeat_interval_sec": 2}, cluster_uri="http://b:1")
    assert (c.cluster_uri, c.cluster_name, c.heartbeat_interval_sec) == ("http://b:1", "x", 2)


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
    # static urls are the default, as in every published config (issue 21, C1)
    assert _plan().membership is None
    assert "urls" in yaml.safe_load(render_files(_plan())["disagg.yaml"])["context_servers"]
    p = _plan("membership.enabled=true")
    m = p.membership
    assert (m.storage, m.cluster_uri, m.heartbeat_interval_s, m.inactive_timeout_s, m.cluster_name) == \
        ("etcd", "etcd://<node0>:2379", 5, 10, "standin-2p2d")
    # minimal_instances are the supervision minimum, not every instance: the proxy must keep serving while one
    # worker restarts
    assert (m.minimal_context, m.minimal_generation) == (1, 1)
    files = render_files(p)
    doc = yaml.safe_load(files["disagg.yaml"])
    assert doc["disagg_cluster"]["minimal_instances"] == {"context_servers": 1, "generation_servers": 1}
    two = _plan("membership.enabled=true", "supervision.min_generation=2").membership
    assert (two.minimal_context, two.minimal_generation) == (1, 2)
    assert "urls" not in doc["context_servers"] and doc["context_servers"]["num_instances"] == 2
    ctx = p.context.instances[1]
    argv = worker_command(p, "ctx", ctx.port)
    assert argv[argv.index("--host") + 1] == f"<node{ctx.first_node}>"
    i = argv.index("--disagg_cluster_uri")
    assert argv[i:i + 4] == ["--disagg_cluster_uri", m.uri_for(ctx.name), "--server_role", "context"]
    # the worker's cluster name, heartbeat and timeout come from its options file; no cluster_uri there (it would
    # override --disagg_cluster_uri: extract_disagg_cluster_config)
    block = yaml.safe_load(files["ctx.yaml"])["disagg_cluster"]
    assert block == {"cluster_name": "standin-2p2d", "heartbeat_interval_sec": 5, "inactive_timeout_sec": 10}
    for line in ("1.0", "1.1"):
        old = _plan(f"trtllm_version={line}", "kv_transfer.kv_transfer_timeout_ms=null", "membership.enabled=auto")
        assert old.membership is None
        assert "urls" in yaml.safe_load(render_files(old)["disagg.yaml"])["context_servers"]
        argv = worker_command(old, "gen", old.generation.instances[0].port)
        # static urls: the worker binds <bindN> (0.0.0.0, or loopback where the node's address is loopback)
        assert "--disagg_cluster_uri" not in argv and argv[argv.index("--host") + 1] == "<bind2>"
    assert 2379 in p.ports_by_node[0] and 2380 in p.ports_by_node[0] and p.membership.etcd.started_by_job


def test_the_jobs_etcd_opens_only_to_the_runs_certificate_and_servers_reach_it_through_their_gateway():
    from toolkit.render import GATEWAY_SCRIPT, proxy_command, render_files, worker_command
    p = _plan("membership.enabled=true")
    m = p.membership
    assert m.etcd.tls_dir == "<run_dir>/secrets/etcd" and m.etcd.tls_generated and not m.unauthenticated
    ports = dict(m.gateways)
    assert set(ports) == {"proxy", *(s.name for s in p.servers)} and len(set(ports.values())) == len(ports)
    for s in p.servers:
        argv = worker_command(p, s.role, s.port)
        assert argv[:9] == ["python3", f"<run_dir>/{GATEWAY_SCRIPT}", "--listen", f"127.0.0.1:{ports[s.name]}",
                            "--etcd", "<node0>:2379", "--tls-dir", "<run_dir>/secrets/etcd", "--"]
        assert ports[s.name] in p.ports_by_node[s.first_node]  # the job's port check covers them
    assert proxy_command(p)[:2] == ["python3", f"<run_dir>/{GATEWAY_SCRIPT}"]
    files = render_files(p)
    assert yaml.safe_load(files["disagg.yaml"])["disagg_cluster"]["cluster_uri"] == \
        f"etcd://127.0.0.1:{ports['proxy']}"
    assert files[GATEWAY_SCRIPT] and "--client-cert-auth" in files["job.json"]
    assert GATEWAY_SCRIPT not in render_files(_plan())  # static urls: no gateway


@pytest.mark.parametrize("sets, field", [
    (["membership.storage=http"], "membership.storage"),
    (["membership.etcd_endpoint=etcd1:2379"], "membership.etcd_tls_dir"),
])
def test_storage_anyone_can_write_is_refused_unless_the_recipe_accepts_the_risk(sets, field):
    with pytest.raises(RecipeError) as e:
        _plan("membership.enabled=true", *sets)
    hits = [v for v in e.value.violations if v.field == field]
    assert hits and "accept_unauthenticated_storage" in hits[0].fix, e.value.violations
    p = _plan("membership.enabled=true", *sets, "membership.accept_unauthenticated_storage=true")
    assert p.membership.unauthenticated and not p.membership.gateways
    assert any("accept_unauthenticated_storage" in w for w in p.warnings)


def test_an_external_etcd_with_a_client_certificate_is_reached_through_the_gateway(tmp_path):
    from toolkit.render import worker_command
    p = _plan("membership.enabled=true", "membership.etcd_endpoint=etcd1:2379", f"membership.etcd_tls_dir={tmp_path}")
    m = p.membership
    assert not m.unauthenticated and not m.etcd.started_by_job and not m.etcd.tls_generated
    argv = worker_command(p, "gen", p.generation.instances[0].port)
    assert argv[argv.index("--etcd") + 1] == "etcd1:2379" and argv[argv.index("--tls-dir") + 1] == str(tmp_path)
    with pytest.raises(RecipeError) as e:
        _plan("membership.enabled=true", f"membership.etcd_tls_dir={tmp_path}")
    assert "membership.etcd_tls_dir" in {v.field for v in e.value.violations}


def test_each_run_gets_a_cluster_name_no_other_run_shares():
    from toolkit.plan import plan_for_run
    from toolkit.render import render_files
    p = _plan("membership.enabled=true", "membership.etcd_endpoint=etcd1:2379",
              "membership.accept_unauthenticated_storage=true")
    a, b = plan_for_run(p, "0123456789ab"), plan_for_run(p, "ba9876543210")
    assert a.membership.cluster_name == "standin-2p2d-0123456789ab" != b.membership.cluster_name
    assert a.membership.worker_key_prefix == "/trtllm-disagg/standin-2p2d-0123456789ab/workers"
    for plan in (a, b):
        files = render_files(plan)
        name = plan.membership.cluster_name
        for f in ("disagg.yaml", "ctx.yaml", "gen.yaml"):
            assert yaml.safe_load(files[f])["disagg_cluster"]["cluster_name"] == name
    assert plan_for_run(_plan(), "0123456789ab") == _plan()  # static urls: nothing to name


@pytest.mark.parametrize("sets, field, text", [
    (["trtllm_version=1.1", "kv_transfer.kv_transfer_timeout_ms=null", "membership.enabled=true"],
     "membership.enabled", "has no disagg_cluster"),
    (["membership.enabled=true", "membership.heartbeat_interval_s=10"], "membership.inactive_timeout_s",
     "must be greater than"),
    (["supervision.min_generation=3"], "supervision.min_generation", "the run could never meet it"),
    (["membership.enabled=true", "membership.storage=http", "membership.accept_unauthenticated_storage=true",
      "membership.etcd_endpoint=etcd1:2379"], "membership.etcd_endpoint", "only read with storage: etcd"),
    (["membership.enabled=true", "membership.etcd_port=18000"], "membership.etcd_port", "already uses"),
    (["membership.enabled=true", "membership.etcd_port=18332"], "membership.etcd_port", "gateways would take"),
])
def test_membership_rules_name_the_field(sets, field, text):
    with pytest.raises(RecipeError) as e:
        _plan(*sets)
    hits = [v for v in e.value.violations if v.field == field]
    assert hits and text in hits[0].message, e.value.violations
