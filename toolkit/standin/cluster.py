"""Membership as TensorRT-LLM keeps it (``disagg_cluster``; tk CPU stand-in, not TensorRT-LLM).

What TensorRT-LLM does (NVIDIA/TensorRT-LLM, docs/trtllm-versions.md "Membership" cites each point):

- cluster storage (``tensorrt_llm/serve/cluster_storage.py``): ``http(s)://HOST:PORT`` is an in-memory key/value
  store the proxy hosts on its own port, routes ``POST /set`` (JSON ``{key, value, expire_time: -1, ttl,
  overwrite_if_exists}``), ``GET /get?key``, ``DELETE /delete?key``, ``GET /expire?key&ttl``,
  ``GET /get_prefix?key_prefix&keys_only``; every route answers ``{"result": R}``, status 200 when R is truthy,
  else 400. ``set`` of an existing key without ``overwrite_if_exists`` fails; ``ttl > 0`` makes the key expire
  ``ttl`` seconds later (monotonic clock); ``expire`` moves that deadline to now + ttl; a sweep every second drops
  expired keys (and ``get`` drops one it finds expired), each drop a DELETE event for the proxy's watch.
  ``etcd://HOST:PORT[,HOST:PORT]`` uses etcd v3 (a gRPC client there): one lease of ``ttl`` per key, ``set``
  without overwrite = put-if-absent (create_revision == 0), ``expire`` = a lease keep-alive. The stand-in speaks
  etcd's JSON gateway (``/v3/kv/put``, ``/v3/kv/range``, ``/v3/kv/txn``, ``/v3/kv/deleterange``,
  ``/v3/lease/grant``, ``/v3/lease/keepalive``; base64 keys and values) and polls the prefix every second
  instead of watching: the same keys, values and leases in etcd.
- a worker (``DisaggClusterWorker``, ``disagg_auto_scaling.py``) registers key
  ``/trtllm-disagg/{cluster_name}/workers/{worker_id}``, ``worker_id = f"{ROLE}-{host}:{port}-{ms}-{pid}-{rnd:03}"``,
  value ``json.dumps({"worker_id", "host", "port", "role"})`` (role: 0 context, 1 generation), ``ttl =
  inactive_timeout_sec``, without overwrite, retrying every 5 s; then every ``heartbeat_interval_sec`` it calls
  ``expire(key, inactive_timeout_sec)`` and registers again when that fails (the key expired: a restarted proxy
  or a long stall). No heartbeat at all unless ``0 < heartbeat_interval_sec < inactive_timeout_sec``. On shutdown
  it deletes its key. ``host`` is the worker's ``--host`` as given.
- the proxy (``DisaggClusterManager``, ``openai_disagg_service.py``) reads the existing keys under the prefix, then
  watches it: SET adds ``host:port`` to the role's router, DELETE removes it. Ready = registered context workers >=
  ``minimal_instances.context_servers`` and generation >= ``generation_servers``; not ready: ``/health`` answers
  500 and requests fail with ``RuntimeError("Cluster is not ready")``, which the server turns into HTTP 500
  ``{"detail": "Internal server error Cluster is not ready"}`` (the 1.2-era files; 2026 main answers 503 on
  ``/health``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.membership import prefix_end
from toolkit.facts import trtllm
from toolkit.standin.tasks import keep, spawn

log = logging.getLogger("toolkit.standin")

ROLE_IDS = {"context": 0, "generation": 1}  # tensorrt_llm.llmapi.disagg_utils.ServerRole
ROLE_NAMES = {0: "CONTEXT", 1: "GENERATION"}
REGISTER_RETRY_S = trtllm.MEMBERSHIP_REGISTER_RETRY_S  # DisaggClusterWorker.register_worker(retry_interval=5)
SWEEP_S = 1.0  # HttpClusterStorageServer._check_expired_interval
POLL_S = 1.0  # the stand-in's etcd prefix poll (TensorRT-LLM watches)
CLIENT_TIMEOUT_S = 5  # HttpClusterStorageClient: aiohttp.ClientTimeout(total=5)
_FIELDS = {"cluster_uri", "cluster_name", "minimal_instances", "heartbeat_interval_sec", "inactive_timeout_sec"}
_MINIMAL = {"context_servers", "generation_servers"}


class ClusterConfigError(ValueError):
    pass


@dataclass
class ClusterConfig:
    """tensorrt_llm.llmapi.disagg_utils.DisaggClusterConfig with its defaults."""

    cluster_uri: str
    cluster_name: str = ""
    minimal_context: int = trtllm.MEMBERSHIP_DEFAULTS["minimal_instances"]
    minimal_generation: int = trtllm.MEMBERSHIP_DEFAULTS["minimal_instances"]
    heartbeat_interval_sec: float = trtllm.MEMBERSHIP_DEFAULTS["heartbeat_interval_sec"]
    inactive_timeout_sec: float = trtllm.MEMBERSHIP_DEFAULTS["inactive_timeout_sec"]

    @property
    def key_prefix(self) -> str:
        return trtllm.MEMBERSHIP_KEY_PREFIX.format(cluster_name=self.cluster_name)


def parse_cluster_config(cfg: dict, cluster_uri: str | None = None) -> ClusterConfig:
    """extract_disagg_cluster_config(): unknown keys are a KeyError there; cluster_uri overrides the file's."""
    if not isinstance(cfg, dict):
        raise ClusterConfigError("disagg_cluster: expected a mapping with cluster_uri")
    for k in cfg:
        if k not in _FIELDS:
            raise ClusterConfigError(f"disagg_cluster.{k}: Key {k} not found in DisaggClusterConfig")
    mins = cfg.get("minimal_instances") or {}
    if not isinstance(mins, dict):
        raise ClusterConfigError("disagg_cluster.minimal_instances: expected a mapping")
    for k in mins:
        if k not in _MINIMAL:
            raise ClusterConfigError(f"disagg_cluster.minimal_instances.{k}: Key {k} not found in MinimalInstances")
    # extract_disagg_cluster_config: DisaggClusterConfig(cluster_uri or cfg["cluster_uri"]), then every key of the block
    # set over it, cluster_uri included: a cluster_uri in the options file wins over --disagg_cluster_uri
    # (tensorrt_llm/llmapi/disagg_utils.py @ 3e53e4ad)
    uri = cfg.get("cluster_uri") if cfg.get("cluster_uri") is not None else cluster_uri
    if not isinstance(uri, str) or not uri.startswith(("http://", "https://", "etcd://")):
        raise ClusterConfigError(f"disagg_cluster.cluster_uri: Invalid cluster storage URI: {uri}")
    out = ClusterConfig(cluster_uri=uri)
    for key, attr in (("cluster_name", "cluster_name"), ("heartbeat_interval_sec", "heartbeat_interval_sec"),
                      ("inactive_timeout_sec", "inactive_timeout_sec")):
        if cfg.get(key) is not None:
            setattr(out, attr, cfg[key])
    for key, attr in (("context_servers", "minimal_context"), ("generation_servers", "minimal_generation")):
        if mins.get(key) is not None:
            setattr(out, attr, mins[key])
    for attr in ("heartbeat_interval_sec", "inactive_timeout_sec", "minimal_context", "minimal_generation"):
        v = getattr(out, attr)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise ClusterConfigError(f"disagg_cluster: {attr} {v!r} is not a non-negative number")
    return out


# --- storage: the proxy's own HTTP store -------------------------------------------------------------------------

class HttpStorage:
    """HttpClusterStorageServer: the store the proxy hosts. Listeners get ("SET" | "DELETE", key, value)."""

    def __init__(self):
        self.items: dict[str, tuple[str, float]] = {}  # key -> (value, expire_time or -1)
        self.listeners: list = []
        self._sweeper = None

    def _notify(self, kind: str, key: str, value: str) -> None:
        for cb in self.listeners:
            cb(kind, key, value)

    async def start(self) -> None:
        if self._sweeper is None:  # TensorRT-LLM's sweep catches and logs its errors and goes on: so does keep()
            self._sweeper = keep(self._sweep, "storage-expiry-sweep", component="proxy")

    async def stop(self) -> None:
        if self._sweeper:
            self._sweeper.cancel()
            self._sweeper = None

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            for k, (v, exp) in list(self.items.items()):
                if 0 < exp < now:
                    self.items.pop(k, None)
                    self._notify("DELETE", k, v)

    def set(self, key: str, value: str, ttl: int = -1, overwrite_if_exists: bool = False,
            expire_time: float = -1) -> bool:
        if key in self.items and not overwrite_if_exists:
            return False
        if expire_time < 0 and ttl and ttl > 0:
            expire_time = time.monotonic() + ttl
        self.items[key] = (value, expire_time)
        self._notify("SET", key, value)
        return True

    def get(self, key: str) -> str | None:
        if key in self.items:
            value, exp = self.items[key]
            if exp < 0 or exp > time.monotonic():
                return value
            self.items.pop(key)
            self._notify("DELETE", key, value)
        return None

    def expire(self, key: str, ttl: int) -> bool:
        if key in self.items:
            self.items[key] = (self.items[key][0], time.monotonic() + int(ttl))
            return True
        return False

    def delete(self, key: str) -> bool:
        if key in self.items:
            value, _ = self.items.pop(key)
            self._notify("DELETE", key, value)
            return True
        return False

    def get_prefix(self, key_prefix: str, keys_only: bool = False) -> dict:
        return {k: "" if keys_only else v for k, (v, _) in self.items.items() if k.startswith(key_prefix)}

    def add_routes(self, app) -> None:
        from aiohttp import web

        def answer(result):
            return web.json_response({"result": result}, status=200 if result else 400)

        async def set_(request):
            try:
                item = await request.json()
                ok = self.set(str(item["key"]), str(item.get("value") or ""), int(item.get("ttl") or -1),
                              bool(item.get("overwrite_if_exists")), float(item.get("expire_time", -1)))
            except (ValueError, KeyError, TypeError) as exc:
                return web.json_response({"detail": f"invalid storage item: {exc}"}, status=422)
            return answer(ok)

        def arg(request, name):
            if name not in request.query:
                raise web.HTTPUnprocessableEntity(text=json.dumps({"detail": f"{name} is required"}),
                                                  content_type="application/json")
            return request.query[name]

        async def get(request):
            return answer(self.get(arg(request, "key")))

        async def delete(request):
            return answer(self.delete(arg(request, "key")))

        async def expire(request):
            try:
                ttl = int(arg(request, "ttl"))
            except ValueError:
                return web.json_response({"detail": "ttl is not an integer"}, status=422)
            return answer(self.expire(arg(request, "key"), ttl))

        async def get_prefix(request):
            keys_only = request.query.get("keys_only", "0") not in ("0", "false", "False", "")
            return answer(self.get_prefix(arg(request, "key_prefix"), keys_only))

        app.router.add_post("/set", set_)
        app.router.add_get("/get", get)
        app.router.add_delete("/delete", delete)
        app.router.add_get("/expire", expire)
        app.router.add_get("/get_prefix", get_prefix)


# --- storage clients (the workers', and the proxy's with etcd) -------------------------------------------------------

class HttpClient:
    """HttpClusterStorageClient: set/expire are True on HTTP 200; failures are False (logged)."""

    def __init__(self, uri: str):
        self.base = uri.rstrip("/") if uri.startswith("http") else f"http://{uri}"
        self.session = None

    async def _session(self):
        import aiohttp
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S))
        return self.session

    async def close(self) -> None:
        if self.session:
            await self.session.close()
            self.session = None

    async def _call(self, method: str, route: str, **kw):
        import aiohttp
        try:
            s = await self._session()
            async with s.request(method, f"{self.base}/{route}", **kw) as resp:
                body = await resp.json(content_type=None) if resp.status == 200 else None
                if resp.status == 200 and not isinstance(body, dict):
                    log.warning("cluster storage %s/%s: %.200s is not {\"result\": ...}", self.base, route, body)
                    return False, None
                return resp.status == 200, (body or {}).get("result")
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError) as exc:
            log.warning("cluster storage %s/%s: %s", self.base, route, exc)
            return False, None

    async def set(self, key: str, value: str, ttl: int = -1, overwrite_if_exists: bool = False) -> bool:
        item = {"key": key, "value": value, "expire_time": -1, "ttl": ttl, "overwrite_if_exists": overwrite_if_exists}
        return (await self._call("POST", "set", json=item))[0]

    async def expire(self, key: str, ttl: int) -> bool:
        return (await self._call("GET", "expire", params={"key": key, "ttl": str(ttl)}))[0]

    async def delete(self, key: str) -> bool:
        return (await self._call("DELETE", "delete", params={"key": key}))[0]

    async def get_prefix(self, key_prefix: str, keys_only: bool = False) -> dict | None:
        ok, result = await self._call("GET", "get_prefix", params={"key_prefix": key_prefix,
                                                                   "keys_only": str(int(keys_only))})
        if ok and not isinstance(result, dict):
            log.warning("cluster storage %s/get_prefix: %.200s is not a mapping of keys", self.base, result)
            return None
        return result if ok else None


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text, validate=True).decode()


def etcd_endpoints(uri: str) -> list[str]:
    """host:port per endpoint of an etcd:// URI, as Etcd3ClusterStorage takes them: host and port only. No user or
    password is ever sent (a user:password@ part is dropped: urlparse's hostname and port, `secure=False`, at
    NVIDIA/TensorRT-LLM@057d4a79; `rsplit(":")` into host and port at @b3809755, where such a part makes the host
    unreachable), and never TLS: against an etcd that wants authentication or a client certificate, TensorRT-LLM's
    storage calls fail, and so do the stand-in's (tk puts its gateway in between: templates/etcd_gateway.py)."""
    out = []
    for part in uri.removeprefix("etcd://").split(","):
        hostport = part.strip().rsplit("@", 1)[-1].strip("/")
        if hostport:
            out.append(hostport)
    return out


class LeaseError(RuntimeError):
    """etcd granted no lease (no answer, or not one etcd gives)."""


class EtcdClient:
    """Etcd3ClusterStorage over etcd's v3 JSON gateway: one lease per key (ttl), put-if-absent, lease keep-alive;
    plain HTTP without credentials, as TensorRT-LLM's client connects (etcd_endpoints). A key with a ttl is never
    written without its lease: when etcd grants none, set() fails, as TensorRT-LLM's does (Etcd3ClusterStorage:
    `_get_lease` calls `self.client.lease(ttl)`, which raises, and `set` answers False with "Error setting key
    KEY: ..." at NVIDIA/TensorRT-LLM@b3809755, through handle_etcd_error(return_on_error=False) at @057d4a79;
    tensorrt_llm/serve/cluster_storage.py). Answers not shaped as etcd's are failures, never exceptions."""

    def __init__(self, uri: str):
        self.endpoints = etcd_endpoints(uri)
        self.leases: dict[str, int] = {}
        self.session = None

    async def close(self) -> None:
        if self.session:
            await self.session.close()
            self.session = None

    async def _post(self, path: str, body: dict) -> dict | None:
        import aiohttp
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S))
        for ep in self.endpoints:
            try:
                async with self.session.post(f"http://{ep}{path}", json=body) as resp:
                    doc = await resp.json(content_type=None)
                    if resp.status == 200 and isinstance(doc, dict):
                        return doc
                    log.warning("etcd %s%s: HTTP %d %s", ep, path, resp.status, doc)
                    return None
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError) as exc:
                log.warning("etcd %s%s: %s", ep, path, exc)
        return None

    async def _lease(self, key: str, ttl: int) -> int | None:
        """The key's lease (granted once per key); None for no ttl; LeaseError when etcd grants none."""
        if ttl <= 0:
            return None
        if key not in self.leases:
            doc = await self._post("/v3/lease/grant", {"TTL": int(ttl)})
            try:
                lease = int((doc or {})["ID"])
            except (KeyError, TypeError, ValueError, OverflowError):  # int(inf) is an OverflowError
                raise LeaseError(f"etcd granted no lease of {int(ttl)}s (answer: {str(doc)[:200]})") from None
            if lease <= 0:
                raise LeaseError(f"etcd answered lease {lease}, not a lease")
            self.leases[key] = lease
        return self.leases[key]

    async def set(self, key: str, value: str, ttl: int = -1, overwrite_if_exists: bool = False) -> bool:
        try:
            lease = await self._lease(key, ttl)
        except LeaseError as exc:
            log.error("Error setting key %s: %s", key, exc)
            return False
        put = {"key": _b64(key), "value": _b64(value), **({"lease": str(lease)} if lease else {})}
        if overwrite_if_exists:
            return await self._post("/v3/kv/put", put) is not None
        doc = await self._post("/v3/kv/txn", {
            "compare": [{"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": put}], "failure": []})
        return bool(doc and doc.get("succeeded"))

    async def expire(self, key: str, ttl: int) -> bool:
        if ttl <= 0 or key not in self.leases:
            # a worker that registered through another client, or never: TensorRT-LLM creates a lease here,
            # whose keep-alive succeeds but which holds no key; the stand-in reports the failure instead
            return False
        doc = await self._post("/v3/lease/keepalive", {"ID": str(self.leases[key])})
        try:
            ttl_left = int((doc or {}).get("result", {}).get("TTL", 0))
        except (AttributeError, TypeError, ValueError, OverflowError):
            ttl_left = 0  # not etcd's answer: the keep-alive is not known to have worked
        if ttl_left <= 0:  # the lease expired: its key is gone
            self.leases.pop(key, None)
            return False
        return True

    async def delete(self, key: str) -> bool:
        doc = await self._post("/v3/kv/deleterange", {"key": _b64(key)})
        self.leases.pop(key, None)
        return doc is not None

    async def get_prefix(self, key_prefix: str, keys_only: bool = False) -> dict | None:
        doc = await self._post("/v3/kv/range", {"key": _b64(key_prefix), "range_end": prefix_end(key_prefix),
                                               **({"keys_only": True} if keys_only else {})})
        if doc is None:
            return None
        kvs = doc.get("kvs", [])
        if not isinstance(kvs, list):
            log.warning("etcd range of %s: %.200s is not a list of keys", key_prefix, kvs)
            return None
        out, odd = {}, 0
        for kv in kvs:
            try:
                out[_unb64(kv["key"])] = "" if keys_only else _unb64(kv.get("value", ""))
            except (AttributeError, KeyError, TypeError, ValueError):  # binascii.Error, UnicodeDecodeError included
                odd += 1
        if odd:
            log.warning("etcd range of %s: %d entries that are not etcd's key/value skipped", key_prefix, odd)
        return out


def storage_client(uri: str):
    if uri.startswith(("http://", "https://")):
        return HttpClient(uri)
    if uri.startswith("etcd://"):
        return EtcdClient(uri)
    raise ClusterConfigError(f"Invalid cluster storage URI: {uri}")


# --- the worker side --------------------------------------------------------------------------------------------------

class ClusterWorker:
    """DisaggClusterWorker: register, heartbeat, re-register when the key is gone, delete on stop. A heartbeat task
    that fails (an exception: not a failed keep-alive, which registers again) calls on_failure: the worker cannot
    stay registered, and says so (Membership stops the server, so that supervision restarts it)."""

    def __init__(self, config: ClusterConfig, role: str, host: str, port: int, client=None,
                 on_failure: Callable[[BaseException], None] | None = None):
        self.config, self.role, self.host, self.port = config, role, host, port
        self.on_failure = on_failure
        self.client = client or storage_client(config.cluster_uri)
        self.worker_id = (f"{ROLE_NAMES[ROLE_IDS[role]]}-{host}:{port}-{int(time.time() * 1000)}-{os.getpid()}-"
                          f"{random.randint(0, 1000):03}")
        self.key = f"{config.key_prefix}/{self.worker_id}"
        self.registrations = 0
        self.heartbeats = 0
        self._task = None

    @property
    def value(self) -> str:
        return json.dumps({"worker_id": self.worker_id, "host": self.host, "port": self.port,
                           "role": ROLE_IDS[self.role]})

    async def register(self, retry_interval: float = REGISTER_RETRY_S) -> bool:
        while not await self.client.set(self.key, self.value, ttl=int(self.config.inactive_timeout_sec)):
            if retry_interval <= 0:
                return False
            log.warning("Worker %s registration failed, retry in %g seconds", self.worker_id, retry_interval)
            await asyncio.sleep(retry_interval)
        self.registrations += 1
        log.info("Worker %s registration successful (%s)", self.worker_id, self.config.cluster_uri)
        hb, inactive = self.config.heartbeat_interval_sec, self.config.inactive_timeout_sec
        if 0 < hb < inactive:
            if self._task is None:
                self._task = spawn(self._heartbeat(), "membership-heartbeat", on_error=self.on_failure,
                                   component=f"worker {self.host}:{self.port}")
        else:
            log.warning("Heartbeat interval %s is not positive or less than inactive timeout %s, heartbeat is "
                        "disabled", hb, inactive)
        return True

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_sec)
            if await self.client.expire(self.key, int(self.config.inactive_timeout_sec)):
                self.heartbeats += 1
            else:
                log.warning("Worker %s heartbeat failed, re-registering", self.worker_id)
                await self.register()

    async def deregister(self) -> bool:
        if self._task:
            self._task.cancel()
            self._task = None
        ok = await self.client.delete(self.key)
        await self.client.close()
        return ok


# --- the proxy side ---------------------------------------------------------------------------------------------------

class ClusterManager:
    """DisaggClusterManager + the proxy's watch loop: routers follow the registered workers."""

    def __init__(self, config: ClusterConfig, ctx_router, gen_router, storage: HttpStorage | None = None):
        self.config = config
        self.routers = {0: ctx_router, 1: gen_router}
        self.workers: dict[str, dict] = {}  # key -> worker info
        self.storage = storage
        self.client = None if storage is not None else storage_client(config.cluster_uri)
        self._task = None

    @property
    def counts(self) -> tuple[int, int]:
        roles = [w["role"] for w in self.workers.values()]
        return roles.count(0), roles.count(1)

    def is_ready(self) -> bool:
        ctx, gen = self.counts
        return ctx >= self.config.minimal_context and gen >= self.config.minimal_generation

    def info(self) -> dict:
        def listing(role):
            return [{"worker_id": w["worker_id"], "host": w["host"], "port": w["port"], "role": role}
                    for w in self.workers.values() if w["role"] == role]
        return {"is_ready": self.is_ready(),
                "current_workers": {"context_servers": listing(0), "generation_servers": listing(1)},
                "minimal_instances": {"context_servers": self.config.minimal_context,
                                      "generation_servers": self.config.minimal_generation}}

    def on_event(self, kind: str, key: str, value: str) -> None:
        if not isinstance(key, str) or not key.startswith(self.config.key_prefix):
            return
        if kind == "SET":
            try:
                w = json.loads(value)
                w = {"worker_id": str(w["worker_id"]), "host": str(w["host"]), "port": int(w["port"]),
                     "role": int(w["role"])}
                router = self.routers[w["role"]]
            except Exception as exc:  # noqa: BLE001 - as TensorRT-LLM's _parse_worker_info: any odd value is one log line
                log.error("Failed to parse set event: %s: %.200s, error: %s", key, value, exc)
                return
            self.workers[key] = w
            router.add_server(f"http://{w['host']}:{w['port']}")
            change = "active/updated"
        else:
            w = self.workers.pop(key, None)
            if w is None:
                return
            url = f"http://{w['host']}:{w['port']}"
            if not any(f"http://{o['host']}:{o['port']}" == url for o in self.workers.values()):
                self.routers[w["role"]].remove_server(url)
            change = "inactive"
        ctx, gen = self.counts
        log.info("Worker %s becomes %s, current context worker: %d/%d, current generation worker: %d/%d",
                 w["worker_id"], change, ctx, self.config.minimal_context, gen, self.config.minimal_generation)

    async def start(self) -> None:
        if self.storage is not None:
            await self.storage.start()
            for k, v in self.storage.get_prefix(self.config.key_prefix).items():
                self.on_event("SET", k, v)
            self.storage.listeners.append(self.on_event)
        else:  # a poll that fails is said and started again: routing must follow the storage
            self._task = keep(self._poll, "membership-poll", component="proxy")

    async def _poll(self) -> None:
        while True:
            current = await self.client.get_prefix(self.config.key_prefix)
            if current is not None:
                for k in [k for k in self.workers if k not in current]:
                    self.on_event("DELETE", k, "")
                for k, v in current.items():
                    if k not in self.workers:
                        self.on_event("SET", k, v)
            await asyncio.sleep(POLL_S)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            self._task = None
        if self.storage is not None:
            await self.storage.stop()
        if self.client is not None:
            await self.client.close()


class Membership:
    """The worker's hook for worker.serve(): register once listening, heartbeat, delete the key on stop. When its
    registration or heartbeat task fails, on_failure(exc) (worker.run: the server stops with exit code 1, and the
    job's supervision restarts it: a worker that cannot be registered must not go on answering /health)."""

    def __init__(self, config: ClusterConfig, role: str, host: str, port: int,
                 on_failure: Callable[[BaseException], None] | None = None):
        self.config, self.role, self.host, self.port = config, role, host, port
        self.on_failure = on_failure
        self.worker = None
        self._task = None

    async def __call__(self) -> None:
        self.worker = ClusterWorker(self.config, self.role, self.host, self.port, on_failure=self.on_failure)
        # retries every 5 s while the storage is away
        self._task = spawn(self.worker.register(), "membership-register", on_error=self.on_failure,
                           component=f"worker {self.host}:{self.port}")

    async def stop(self) -> None:
        if self._task and not self._task.done():
            self._task.cancel()
        if self.worker:
            await self.worker.deregister()
