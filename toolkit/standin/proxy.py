"""``tk-standin-serve disaggregated -c FILE [-t S] [-r S]``: the proxy (tk CPU stand-in, not TensorRT-LLM).

It reads the same YAML as ``trtllm-serve disaggregated`` (``tensorrt_llm/llmapi/disagg_utils.py``) and refuses at
start-up what TensorRT-LLM refuses (urls not ``num_instances`` long, a missing server section, an unknown router
type, conditional disaggregation without a KV-cache-aware generation router, a top-level key contradicting a
section, negative ``max_retries``), plus what only leads to confusion later (``<nodeN>`` placeholders left in,
urls that are not ``host:port``, duplicate urls). Unknown top-level keys are inherited by both sections and
ignored, as TensorRT-LLM does; the stand-in logs a warning naming them.

Forwarding is TensorRT-LLM's ``context_first`` flow: the context leg is the client's request with
``disaggregated_params {request_type: context_only, disagg_request_id, schedule_style: 0}``, ``stream: false``,
``stream_options: null`` (``max_tokens`` stays the client's); its single choice must carry ``disaggregated_params`` with
``ctx_request_id``; then the generation leg is the client's original request with the context response's
``disaggregated_params`` (``request_type: generation_only``) and the prompt replaced by its ``prompt_token_ids``.
Only the generation leg streams, passed through byte for byte. With ``conditional_disagg_config`` the KV-cache-aware
generation router picks the generation server first and the request skips the context server when the server
already holds a prefix and at most ``max_local_prefill_length`` tokens are left to prefill.

Connection failures are retried ``max_retries`` times, 1 s apart (``TRTLLM_DISAGG_NO_RETRY=1`` turns that off);
an HTTP error from a worker is returned to the client with the worker's status as ``{"detail": its message}``
(TensorRT-LLM's shape); requests are validated (``protocol.parse_request``) before any leg, and a generation leg
that fails releases the context KV at once (see ``Proxy._release``); each leg is bounded by
``-r``. ``GET /health`` is 200 once the start-up wait for the workers is over (as TensorRT-LLM's). Request bodies to the
workers are msgpack (``X-TRTLLM-Msgpack: 1``) when ``TRTLLM_SERVE_ENABLE_MSGSPEC=1``, JSON otherwise.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace

import yaml

from toolkit.facts import trtllm
from toolkit.standin.options import ConfigError, target_version
from toolkit.standin.routers import RouteRequest

log = logging.getLogger("toolkit.standin")

_FLAGS = {"-c": "config", "--config_file": "config", "--config": "config", "-t": "start_timeout",
          "--server_start_timeout": "start_timeout", "-r": "request_timeout", "--request_timeout": "request_timeout",
          "-l": "log_level", "--log_level": "log_level", "-m": "metadata", "--metadata_server_config_file": "metadata"}
_SECTIONS = ("context_servers", "generation_servers")


@dataclass
class ProxySettings:
    config_file: str
    hostname: str
    port: int
    ctx_urls: list[str]
    gen_urls: list[str]
    ctx_router: dict
    gen_router: dict
    max_retries: int
    max_local_prefill_length: int | None
    server_start_timeout_s: float
    request_timeout_s: float
    version: trtllm.TrtllmVersion
    inherited: dict = field(default_factory=dict)
    cluster: object = None  # toolkit.standin.cluster.ClusterConfig: membership TensorRT-LLM keeps (disagg_cluster)


def proxy_settings(argv: list[str]) -> ProxySettings:
    version = target_version()
    allowed = set(trtllm.disaggregated_flags(version))
    values: dict = {}
    i = 0
    while i < len(argv):
        name, eq, inline = argv[i].partition("=")
        key = _FLAGS.get(name)
        short = next((f for f, k in _FLAGS.items() if k == key and not f.startswith("--")), None)
        if key is None or short not in allowed:
            raise ConfigError(f"tk-standin-serve disaggregated: no such option: {name} (TensorRT-LLM {version.line}'s "
                              f"`trtllm-serve disaggregated` takes {', '.join(sorted(allowed))})")
        if eq:
            values[key] = inline
            i += 1
        elif i + 1 < len(argv):
            values[key] = argv[i + 1]
            i += 2
        else:
            raise ConfigError(f"tk-standin-serve disaggregated: option {name} requires an argument")
    if "metadata" in values:
        raise ConfigError("tk-standin-serve disaggregated: -m: the stand-in has no etcd metadata server; "
                          "list the workers under urls")
    if "config" not in values:
        raise ConfigError("tk-standin-serve disaggregated: -c/--config_file FILE is required")

    def seconds(key, flag):
        try:
            v = float(values.get(key, 180))
        except ValueError:
            raise ConfigError(f"tk-standin-serve disaggregated: {flag} {values[key]!r} is not a number") from None
        if v <= 0:
            raise ConfigError(f"tk-standin-serve disaggregated: {flag} must be positive")
        return v
    s = parse_config(values["config"], version)
    s.server_start_timeout_s = seconds("start_timeout", "-t")
    s.request_timeout_s = seconds("request_timeout", "-r")
    return s


def _urls(where: str, section: str, cfg: dict) -> list[str]:
    n = cfg.get("num_instances", 1)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"{where}: {section}.num_instances: {n!r} is not a positive integer")
    urls = cfg.get("urls")
    if urls is None:
        raise ConfigError(f"{where}: {section}.urls is missing (the stand-in has no disagg_cluster service "
                          f"discovery; list num_instances host:port entries)")
    if not isinstance(urls, list):
        raise ConfigError(f"{where}: {section}.urls: expected a list of host:port strings")
    if len(urls) != n:
        raise ConfigError(f"{where}: {section}.urls: Number of hostnames ({len(urls)}) should be equal to the "
                          f"number of instances ({n})")
    out = []
    for u in urls:
        text = str(u)
        if re.search(r"<node\d+>", text):
            raise ConfigError(f"{where}: {section}.urls: {text!r} still has a <nodeN> placeholder; give the proxy "
                              f"the resolved file (disagg.resolved.yaml) with real host names")
        parts = text.split(":")
        if len(parts) != 2 or not parts[0] or not parts[1].isdigit():
            raise ConfigError(f"{where}: {section}.urls: {text!r} is not host:port (TensorRT-LLM splits on ':'; "
                              f"no http:// prefix, no IPv6 literal)")
        url = f"http://{text}"
        if url in out:
            raise ConfigError(f"{where}: {section}.urls: {text!r} is listed twice")
        out.append(url)
    return out


def _is_count(value, least: int = 0) -> bool:
    """An int (a bool is not one) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _read_config(where: str) -> dict:
    try:
        with open(where) as f:
            cfg = yaml.safe_load(f)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the proxy config ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: expected a mapping (hostname, port, context_servers, generation_servers, ...)")
    return cfg


def _membership(where: str, cfg: dict, version: trtllm.TrtllmVersion):
    """The cluster membership config (disagg_cluster), or None: with it, urls are neither read nor checked
    (DISAGG_MID)."""
    if cfg.get(trtllm.MEMBERSHIP_KEY) is None:
        return None
    from toolkit.standin.cluster import ClusterConfigError, parse_cluster_config

    if trtllm.MEMBERSHIP_KEY not in version.disagg_keys:
        raise ConfigError(f"{where}: {trtllm.MEMBERSHIP_KEY}: TensorRT-LLM {version.line} has no cluster membership")
    try:
        cluster = parse_cluster_config(cfg[trtllm.MEMBERSHIP_KEY])
    except ClusterConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if re.search(r"<node\d+>", cluster.cluster_uri):
        raise ConfigError(f"{where}: disagg_cluster.cluster_uri: {cluster.cluster_uri!r} is a placeholder; use "
                          f"disagg.resolved.yaml")
    return cluster


def _router(where: str, sec: str, scfg: dict, version: trtllm.TrtllmVersion) -> dict:
    """A section's router config: its type (round_robin by default) one of the version's, with the section's
    batch limits and, for the KV-cache-aware router, its tokens_per_block."""
    router = scfg.get("router") or {}
    if not isinstance(router, dict):
        raise ConfigError(f"{where}: {sec}.router: expected a mapping with type")
    router = dict(router)
    router.setdefault("type", "round_robin")
    if router["type"] not in version.routers:
        raise ConfigError(f"{where}: {sec}.router.type: Unsupported router type: {router['type']}. "
                          f"Supported types are: {list(version.routers)}")
    for k in ("max_batch_size", "max_num_tokens"):
        if k in scfg:
            router.setdefault(k, scfg[k])
    kvc = scfg.get("kv_cache_config")
    if router["type"] == "kv_cache_aware" and isinstance(kvc, dict) and "tokens_per_block" in kvc:
        router.setdefault("tokens_per_block", kvc["tokens_per_block"])
    return router


def _section(where: str, sec: str, cfg: dict, inherited: dict, version: trtllm.TrtllmVersion,
             membership: bool) -> tuple[list[str], dict]:
    """A server section's (urls, router): no top-level key contradicted, no urls read under cluster membership."""
    scfg = cfg[sec]
    if not isinstance(scfg, dict):
        raise ConfigError(f"{where}: {sec}: expected a mapping with num_instances, urls and router")
    for k, v in list(inherited.items()) + ([("backend", cfg["backend"])] if "backend" in cfg else []):
        if k in scfg and scfg[k] != v:
            raise ConfigError(f"{where}: {sec}.{k}: Parameter {k} is specified both in the top-level and in "
                              f"the {sec} section, but with different values")
    router = _router(where, sec, scfg, version)
    return ([] if membership else _urls(where, sec, scfg)), router


def _max_local_prefill_length(where: str, cfg: dict, gen_router: dict) -> int | None:
    """conditional_disagg_config's max_local_prefill_length (None without the section); it needs the KV-cache-aware
    generation router."""
    cond = cfg.get("conditional_disagg_config")
    if cond is None:
        return None
    if not isinstance(cond, dict) or set(cond) - {"max_local_prefill_length"}:
        raise ConfigError(f"{where}: conditional_disagg_config: only max_local_prefill_length is accepted")
    mlpl = cond.get("max_local_prefill_length", 0)
    if not _is_count(mlpl):
        raise ConfigError(f"{where}: conditional_disagg_config.max_local_prefill_length: {mlpl!r} is not a "
                          f"non-negative integer")
    if gen_router["type"] != "kv_cache_aware":
        raise ConfigError(f"{where}: conditional_disagg_config: Generation router must be a KvCacheAwareRouter "
                          f"to enable conditional disaggregation (set generation_servers.router.type: "
                          f"kv_cache_aware)")
    return mlpl


def parse_config(path: str, version: trtllm.TrtllmVersion | None = None) -> ProxySettings:
    """The proxy's settings from its YAML, checked part by part; the first problem found is the one reported."""
    version = version or target_version()
    where = str(path)
    cfg = _read_config(where)
    cluster = _membership(where, cfg, version)
    inherited = {k: v for k, v in cfg.items() if k not in version.disagg_keys}
    if "generation_servers" not in cfg or not cfg["generation_servers"]:
        raise ConfigError(f"{where}: generation_servers is missing: At least one generation server must be provided")
    if "context_servers" not in cfg or not cfg["context_servers"]:
        raise ConfigError(f"{where}: context_servers is missing: At least one context server must be provided")
    ctx_urls, ctx_router = _section(where, "context_servers", cfg, inherited, version, cluster is not None)
    gen_urls, gen_router = _section(where, "generation_servers", cfg, inherited, version, cluster is not None)
    retries = cfg.get("max_retries", 1)
    if not _is_count(retries):
        raise ConfigError(f"{where}: max_retries: Max retries {retries} must be greater than or equal to 0")
    mlpl = _max_local_prefill_length(where, cfg, gen_router)
    hostname = str(cfg.get("hostname", "localhost"))
    if re.search(r"<node\d+>", hostname):
        raise ConfigError(f"{where}: hostname: {hostname!r} is a placeholder; use disagg.resolved.yaml")
    port = cfg.get("port", 8000)
    if not _is_count(port, 1) or port >= 65536:
        raise ConfigError(f"{where}: port: {port!r} is not a TCP port")
    return ProxySettings(config_file=where, hostname=hostname, port=port, ctx_urls=ctx_urls, gen_urls=gen_urls,
                         ctx_router=ctx_router, gen_router=gen_router,
                         max_retries=0 if os.environ.get("TRTLLM_DISAGG_NO_RETRY") == "1" else retries,
                         max_local_prefill_length=mlpl, server_start_timeout_s=180, request_timeout_s=180,
                         version=version, inherited={k: v for k, v in inherited.items() if k != "backend"},
                         cluster=cluster)


# --- the running proxy -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _ContextLeg:
    """A context leg's answer: the server that holds the request's KV, its response, and the disaggregated_params
    of the response's single choice."""

    server: str
    response: dict
    params: dict

    @property
    def choice(self) -> dict:
        return self.response["choices"][0]

    @property
    def finished_early(self) -> bool:
        """The context server finished the request (finish_reason neither length nor not_finished, e.g. its first
        token was a stop token): nothing is left to generate."""
        return self.choice.get("finish_reason") not in ("length", "not_finished")


class WorkerError(Exception):
    """A worker answered with an HTTP error: returned to the client as is."""

    def __init__(self, status: int, body: bytes, content_type: str):
        super().__init__(f"HTTP {status}")
        self.status, self.body, self.content_type = status, body, content_type


class ProxyError(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def _upstream_error_message(status: int, body: bytes) -> str:
    """A worker's error message as TensorRT-LLM's disaggregated server lifts it out of the body
    (``_upstream_error_message`` in openai_disagg_server.py, newest stored version): ``error.message``, else
    ``message``, else only the status (the raw body may carry the worker's URL)."""
    try:
        doc = json.loads(body)
    except (ValueError, TypeError):
        doc = None
    if isinstance(doc, dict):
        inner = doc.get("error")
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if doc.get("message"):
            return str(doc["message"])
    return f"context worker rejected the request with status {status}"


class Proxy:
    def __init__(self, s: ProxySettings):
        from toolkit.standin.routers import create_router
        self.s = s
        self.ctx_router = create_router(s.ctx_router, s.ctx_urls, dynamic=s.cluster is not None)
        self.gen_router = create_router(s.gen_router, s.gen_urls, dynamic=s.cluster is not None)
        self.cluster = None
        if s.cluster is not None:  # membership: the routers follow the registered workers (toolkit/standin/cluster.py)
            from toolkit.standin.cluster import ClusterManager, HttpStorage
            storage = HttpStorage() if s.cluster.cluster_uri.startswith("http") else None
            self.cluster = ClusterManager(s.cluster, self.ctx_router, self.gen_router, storage)
        self.session = None
        self.msgpack = os.environ.get("TRTLLM_SERVE_ENABLE_MSGSPEC") == "1"
        from toolkit.facts.kvreuse import reuse_facts
        self.ctx_usage = reuse_facts(s.version.line).ctx_usage_passthrough
        self.counters = {"requests": 0, "disaggregated": 0, "local_prefill": 0, "ctx_finished_early": 0,
                         "errors": 0, "retries": 0, "kv_released": 0,
                         "context_servers": defaultdict(int, {u: 0 for u in s.ctx_urls}),
                         "generation_servers": defaultdict(int, {u: 0 for u in s.gen_urls})}
        self.instance = {"pid": os.getpid(), "started": round(time.time(), 6)}  # whose counters these are
        self._server_limits: dict = {}
        self._limits_missed: dict = {}  # url -> when its /server_info last failed
        from toolkit.standin.kv import faults
        self.faults = faults()  # TK_STANDIN_FAULT: skip_context sends no request through a context server
        from toolkit.standin.protocol import RefusalLog
        self.refusals = RefusalLog(log)

    async def open(self):
        import aiohttp
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
            timeout=aiohttp.ClientTimeout(total=self.s.request_timeout_s))

    async def close(self):
        if self.session:
            await self.session.close()

    def app(self):
        from aiohttp import web

        from toolkit.standin.protocol import error_middleware
        app = web.Application(client_max_size=64 << 20, middlewares=[error_middleware(self.refusals)])
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/cluster_info", self.cluster_info)
        if self.cluster and self.cluster.storage is not None:
            self.cluster.storage.add_routes(app)  # the HTTP cluster storage lives on the proxy's own port
        app.router.add_get("/perf_metrics", lambda r: web.json_response([]))
        app.router.add_get("/standin/stats", self.stats)
        app.router.add_post("/v1/completions", lambda r: self.handle(r, "completion"))
        app.router.add_post("/v1/chat/completions", lambda r: self.handle(r, "chat"))
        return app

    # --- readiness -----------------------------------------------------------------------------------------

    async def _healthy(self, url: str, timeout: float = 2.0) -> bool:
        import aiohttp
        try:
            async with self.session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):  # no answer: not healthy (yet)
            return False

    async def wait_ready(self) -> list[str]:
        """[] once every worker is healthy; else, after -t seconds, the ones that never were."""
        deadline = time.monotonic() + self.s.server_start_timeout_s
        waiting = self.s.ctx_urls + self.s.gen_urls
        it = 0
        while True:
            ok = await asyncio.gather(*(self._healthy(u) for u in waiting))
            waiting = [u for u, good in zip(waiting, ok) if not good]
            if not waiting or time.monotonic() > deadline:
                return waiting
            if it % 5 == 0:
                log.info("Waiting for servers, context: %s, generation: %s",
                         [u for u in waiting if u in self.s.ctx_urls], [u for u in waiting if u in self.s.gen_urls])
            it += 1
            await asyncio.sleep(min(1.0, max(0.05, deadline - time.monotonic())))

    async def cluster_info(self, request):
        from aiohttp import web
        return web.json_response(self.cluster.info() if self.cluster else {})

    async def health(self, request):
        """TensorRT-LLM's disagg server answers /health from its coordinator's ``is_ready()``: with static urls that
        is True once the start-up wait for every worker is over, whatever the workers' health later
        (tensorrt_llm/serve/disagg_coordinator.py ``DisaggCoordinatorService.is_ready``, and
        openai_disagg_server.py ``health``, NVIDIA/TensorRT-LLM@0186c597). The proxy's health is its own: a load
        balancer in front of it must not drop the whole endpoint for one worker."""
        from aiohttp import web
        if self.cluster is not None:  # TensorRT-LLM 1.2: 500 while below minimal_instances (docstring of cluster.py)
            return web.Response(status=200 if self.cluster.is_ready() else 500)
        return web.Response(status=200)

    async def version(self, request):
        from aiohttp import web
        return web.json_response({"version": f"{self.s.version.release} (tk CPU stand-in, not TensorRT-LLM)"})

    async def models(self, request):
        from aiohttp import web
        for url in list(self.gen_router.servers) + list(self.ctx_router.servers):  # registered ones, with membership
            try:
                async with self.session.get(url + "/v1/models") as resp:
                    if resp.status == 200:
                        return web.json_response(await resp.json())
            except Exception as exc:  # noqa: BLE001
                log.debug("%s/v1/models: %s", url, exc)
        return web.json_response({"detail": "no worker answered /v1/models"}, status=503)

    async def stats(self, request):
        from aiohttp import web
        return web.json_response({"engine": "tk CPU stand-in proxy, not TensorRT-LLM", "instance": self.instance,
                                  **self.counters,
                                  "in_flight": {"context_servers": self.ctx_router.active,
                                                "generation_servers": self.gen_router.active},
                                  "routers": {"context": {"type": self.s.ctx_router["type"],
                                                          **self.ctx_router.describe()},
                                              "generation": {"type": self.s.gen_router["type"],
                                                             **self.gen_router.describe()}}})

    # --- forwarding ----------------------------------------------------------------------------------------

    def _encode(self, body: dict) -> tuple[bytes, dict]:
        if self.msgpack:
            import msgpack
            return msgpack.packb(body, use_bin_type=True), {"Content-Type": "application/json",
                                                             "X-TRTLLM-Msgpack": "1"}
        return json.dumps(body).encode(), {"Content-Type": "application/json"}

    async def _open(self, role: str, url: str, path: str, body: dict):
        """POST with retries on connection failures; returns the open response (caller releases it)."""
        import aiohttp
        data, headers = self._encode(body)
        for attempt in range(self.s.max_retries + 1):
            try:
                return await self.session.post(url + path, data=data, headers=headers)
            except asyncio.TimeoutError:
                raise ProxyError(504, f"the {role} server {url} did not answer within the request timeout "
                                      f"(-r {self.s.request_timeout_s:g}s)") from None
            except (aiohttp.ClientError, OSError) as exc:
                if attempt == self.s.max_retries:
                    raise ProxyError(502, f"the {role} server {url} cannot be reached: {exc} "
                                          f"({self.s.max_retries} retries)") from None
                self.counters["retries"] += 1
                log.warning("%s server %s: %s - retry %d of %d", role, url, exc, attempt + 1, self.s.max_retries)
                await asyncio.sleep(1.0)

    async def _post_json(self, role: str, url: str, path: str, body: dict) -> dict:
        resp = await self._open(role, url, path, body)
        try:
            raw = await resp.read()
        except asyncio.TimeoutError:
            raise ProxyError(504, f"the {role} server {url} did not answer within the request timeout "
                                  f"(-r {self.s.request_timeout_s:g}s)") from None
        finally:
            resp.release()
        if resp.status != 200:
            raise WorkerError(resp.status, raw, resp.headers.get("Content-Type", "application/json"))
        try:
            return json.loads(raw)
        except ValueError:
            raise ProxyError(500, f"the {role} server {url} answered a body that is not JSON") from None

    def _route_request(self, kind: str, body: dict, headers) -> RouteRequest:
        """What the routers see besides the token ids: the request's text (ConversationRouter._extract_text: the
        prompt, or ``role:content`` lines of a chat) and its conversation id: body
        ``conversation_params.conversation_id``, else the first non-empty of the affinity headers
        (tensorrt_llm/serve/conversation_id.py, commit 295125be1eeeb886c83ece14958db7b34e0e48a6)."""
        from toolkit.facts.kvreuse import CONVERSATION_ID_HEADERS
        cid = None
        params = body.get("conversation_params")
        if isinstance(params, dict) and params.get("conversation_id") is not None:
            cid = str(params["conversation_id"])
        else:
            lower = {str(k).lower(): v for k, v in headers.items()}
            for name in CONVERSATION_ID_HEADERS:
                value = str(lower.get(name, "")).strip()
                if value:
                    cid = value
                    break
        if kind == "completion":
            prompt = body.get("prompt")
            return RouteRequest(text=prompt if isinstance(prompt, str) else None, conversation_id=cid,
                                tokens_of_client=not isinstance(prompt, str))
        if body.get("prompt_token_ids"):
            return RouteRequest(conversation_id=cid, tokens_of_client=True)
        lines = []
        for m in body.get("messages") or []:
            if isinstance(m, dict):
                lines.append(f"{m.get('role', '')}:{m.get('content', '')}")
        return RouteRequest(text="\n".join(lines), conversation_id=cid)

    async def _limits(self) -> list:
        """(Limits, request_type) of every server, from its /server_info (fetched once per server; a server that
        does not answer is skipped: it still applies its own limits)."""
        from toolkit.standin import protocol as P
        pairs = []
        for urls, as_type in ((self.ctx_router.servers, "context_and_generation"),
                              (self.gen_router.servers, "generation_only")):
            for url in list(urls):
                if url not in self._server_limits:
                    if time.monotonic() - self._limits_missed.get(url, -60.0) < 5.0:
                        continue  # it did not answer a moment ago (dead or hung): ask again in a few seconds
                    try:
                        import aiohttp
                        async with self.session.get(url + "/server_info",
                                                    timeout=aiohttp.ClientTimeout(total=2)) as resp:
                            doc = await resp.json() if resp.status == 200 else {}
                        self._server_limits[url] = P.Limits.from_dict(doc["limits"]) if doc.get("limits") else None
                    except Exception as exc:  # noqa: BLE001
                        log.debug("%s/server_info: %s", url, exc)
                        self._limits_missed[url] = time.monotonic()
                        continue
                if self._server_limits[url] is not None:
                    pairs.append((self._server_limits[url], as_type))
        return pairs

    async def handle(self, request, kind: str):
        from aiohttp import web

        from toolkit.standin import protocol as P
        self.counters["requests"] += 1
        try:
            raw = await request.read()
            body = P.decode_body(raw, request.headers)
            # The checks TensorRT-LLM's disaggregated server makes, in its order, all before any leg
            # (openai_disagg_server.py / openai_disagg_service.py, newest stored versions):
            # 1. FastAPI parses the body as CompletionRequest / ChatCompletionRequest (extra="forbid" and the
            #    model validators): a failure is answered 400 {"error": str(exc)} by validation_exception_handler.
            P.check_fields(kind, body)
        except P.RequestError as exc:
            self.counters["errors"] += 1
            return web.json_response({"error": exc.message}, status=400)
        try:
            # 2. OpenAIDisaggregatedService.openai_completion: only a string or token ids; any other prompt is a
            #    ValueError, which _handle_exception answers 500 "Internal server error ..." (TensorRT-LLM's own
            #    status for it, kept although it is the client's mistake).
            if kind == "completion":
                prompt = body.get("prompt")
                if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                    body["prompt"] = prompt = prompt[0]
                if not isinstance(prompt, str) and not (
                        isinstance(prompt, list) and all(isinstance(x, int) for x in prompt)):
                    raise ProxyError(500, "Internal server error Disaggregated server currently only supports "
                                          "single string prompt or list of integers in request")
            if self.cluster is not None and not self.cluster.is_ready():
                raise ProxyError(500, "Internal server error Cluster is not ready")
            # 3. What the context server would refuse (400): its engine-level checks and limits, applied here so
            #    that nothing is refused after a context leg has published KV. TensorRT-LLM relays a worker's
            #    4xx as HTTPException(status, detail=the worker's message) -> {"detail": ...}.
            # The prompt is tokenized once, here (in a worker thread when it is long), and its ids serve the
            # routers too; TensorRT-LLM's KV-cache-aware router likewise tokenizes off the event loop
            # (asyncio.to_thread in KvCacheAwareRouter.get_next_server).
            limits = await self._limits()
            try:
                if len(raw) > P.OFFLOAD_BYTES:
                    req = await asyncio.to_thread(P.parse_request, kind, body, limits)
                else:
                    req = P.parse_request(kind, body, limits)
            except P.RequestError as exc:
                raise ProxyError(exc.status, exc.message) from None
            # 4. n > 1: the context server answers n choices and _verify_ctx_response raises "Context server
            #    returned N choices, expecting 1." (a ValueError: 500). Refused here before the context leg.
            if req.n > 1:
                raise ProxyError(500, f"Internal server error Context server returned {req.n} choices, expecting 1.")
            return await self._disagg(request, kind, body, req.prompt_ids,
                                      self._route_request(kind, body, request.headers))
        except WorkerError as exc:
            self.counters["errors"] += 1
            # A worker's HTTP error: HTTPException(status, detail=_upstream_error_message(...)), i.e. the worker's
            # own message (its ErrorResponse "message"), never its URL (openai_disagg_server.py _handle_exception).
            detail = _upstream_error_message(exc.status, exc.body)
            return web.json_response({"detail": detail}, status=exc.status)
        except ProxyError as exc:
            self.counters["errors"] += 1
            if exc.status >= 500:
                log.error("%s", exc.detail)
            return web.json_response({"detail": exc.detail}, status=exc.status)

    async def _release(self, ctx_server: str, ctx_request_id) -> None:
        """Tell the context server to free the KV of a context leg whose generation leg failed.

        A stand-in endpoint, not TensorRT-LLM's: its disaggregated service sends nothing to the context server when
        the generation leg fails (openai_disagg_service.py _send_disagg_request_ctx_first, commit 00bb903d965ffe9710a457d5848065d7d1b8f60a; a
        client that hangs up only closes the in-flight POST), so there the context KV stays until
        kv_transfer_timeout_ms. The stand-in frees it at once so one failing generation server does not pin every
        context send slot (client-findings §3.3)."""
        import aiohttp

        from toolkit.standin import protocol as P
        try:
            async with self.session.post(ctx_server + P.KV_RELEASE_PATH, json={"ctx_request_id": ctx_request_id},
                                         timeout=aiohttp.ClientTimeout(total=2)) as resp:
                await resp.read()
                self.counters["kv_released"] += resp.status == 200
        except Exception as exc:  # noqa: BLE001 - best effort: the slot still expires at kv_transfer_timeout_ms
            log.warning("could not release ctx_request_id %s on %s: %s", ctx_request_id, ctx_server, exc)

    def _conditional_disagg(self, token_ids: list[int], route: RouteRequest) -> tuple[str, dict, bool]:
        """_check_conditional_disagg: the KV-cache-aware generation router picks (and reserves) the generation
        server; the request skips the context server when that server holds a prefix and at most
        max_local_prefill_length tokens are left to prefill (the reused part does not count). (server, its routing
        info, whether the context leg is needed)."""
        gen_server, gen_info = self.gen_router.get_next_server(token_ids, request=route)
        match = sum(gen_info.get("matches", [0]))
        total = sum(len(t) for t in gen_info.get("token_lists", [token_ids]))
        return gen_server, gen_info, match == 0 or total - match > self.s.max_local_prefill_length

    async def _context_leg(self, path: str, body: dict, token_ids: list[int], route: RouteRequest,
                           exclude: str | None) -> _ContextLeg:
        """The context_only request on a context server (never ``exclude``, the generation server already picked);
        its answer must be one choice carrying disaggregated_params with a ctx_request_id."""
        # max_tokens stays the client's: TensorRT-LLM's _get_ctx_request updates only disaggregated_params, stream
        # and stream_options (openai_disagg_service.py, commit 00bb903d); a context_only request yields one token
        # whatever max_tokens says.
        ctx_req = {**body, "disaggregated_params": {"request_type": "context_only",
                                                    "disagg_request_id": random.randrange(1 << 40, 1 << 63),
                                                    "schedule_style": 0},
                   "stream": False, "stream_options": None}
        server, info = self.ctx_router.get_next_server(token_ids, exclude=exclude, request=route)
        self.counters["context_servers"][server] += 1
        ok = False
        try:
            resp = await self._post_json("context", server, path, ctx_req)
            ok = True
        finally:
            await self.ctx_router.finish(server, info, ok, self.session)
        choices = resp.get("choices") or []
        if len(choices) != 1:
            raise ProxyError(500, "Internal server error Context server did not return a single choice")
        params = choices[0].get("disaggregated_params")
        if not params or params.get("ctx_request_id") is None:
            raise ProxyError(500, f"Internal server error Context server {server} did not return "
                                  f"disaggregated params")
        return _ContextLeg(server, resp, params)

    def _generation_request(self, kind: str, body: dict, ctx: _ContextLeg) -> dict:
        """_get_gen_request: the client's request with the context leg's disaggregated_params (generation_only) and
        its prompt_token_ids in place of the prompt."""
        body = dict(body)  # shallow: only top-level keys change (a deep copy of a long prompt is costly)
        body["disaggregated_params"] = {**ctx.params, "request_type": "generation_only", "schedule_style": 0}
        if self.ctx_usage and isinstance(ctx.response.get("usage"), dict):
            # _get_gen_request: disaggregated_params.ctx_usage = ctx_response.usage; the generation
            # worker reports the context leg's prompt_tokens and cached_tokens (PR #13620/#14177)
            body["disaggregated_params"]["ctx_usage"] = ctx.response["usage"]
        if kind == "completion":
            body["prompt"] = ctx.response.get("prompt_token_ids")
        else:
            body["prompt_token_ids"] = ctx.response.get("prompt_token_ids")
        return body

    async def _generation_leg(self, request, server: str, path: str, body: dict):
        """The generation request: its JSON answer, or its stream passed through byte for byte."""
        from aiohttp import web
        if not body.get("stream"):
            return web.json_response(await self._post_json("generation", server, path, body))
        return await self._stream(request, server, path, body)

    async def _free_context_kv(self, ctx: _ContextLeg, exc: BaseException) -> None:
        """After a failed generation leg: the context KV nobody will fetch is freed now (awaited unless the request
        itself was cancelled)."""
        from toolkit.standin.tasks import spawn
        release = spawn(self._release(ctx.server, ctx.params["ctx_request_id"]), "kv-release", component="proxy")
        if not isinstance(exc, asyncio.CancelledError):
            await release

    async def _disagg(self, request, kind: str, body: dict, token_ids: list[int], route: RouteRequest):
        from aiohttp import web
        path = "/v1/completions" if kind == "completion" else "/v1/chat/completions"
        gen_server = gen_info = None
        need_ctx = True
        if self.s.max_local_prefill_length is not None:
            gen_server, gen_info, need_ctx = self._conditional_disagg(token_ids, route)
        if "skip_context" in self.faults:
            need_ctx = False  # a test fault: every request prefilled on its generation server, no KV moves
        ok = False
        ctx = None
        try:
            if need_ctx:
                ctx = await self._context_leg(path, body, token_ids, route, exclude=gen_server)
                if ctx.finished_early:
                    self.counters["ctx_finished_early"] += 1
                    if body.get("stream"):
                        return await self._stream_done(request)
                    ctx.choice.pop("disaggregated_params", None)
                    return web.json_response(ctx.response)
                self.counters["disaggregated"] += 1
                body = self._generation_request(kind, body, ctx)
            else:
                self.counters["local_prefill"] += 1
                body = dict(body)
                body.pop("disaggregated_params", None)
            if gen_server is None:
                gen_server, gen_info = self.gen_router.get_next_server(
                    token_ids, exclude=ctx.server if ctx else None,
                    request=replace(route, tokens_of_client=True) if ctx else route)
            self.counters["generation_servers"][gen_server] += 1
            try:
                resp = await self._generation_leg(request, gen_server, path, body)
                ok = True
                return resp
            except BaseException as exc:
                if ctx is not None:
                    await self._free_context_kv(ctx, exc)
                raise
        finally:
            if gen_server is not None:
                await self.gen_router.finish(gen_server, gen_info or {}, ok, self.session)

    async def _stream_done(self, request):
        from aiohttp import web
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _stream(self, request, url: str, path: str, body: dict):
        from aiohttp import web
        upstream = await self._open("generation", url, path, body)
        try:
            if upstream.status != 200:
                raw = await upstream.read()
                raise WorkerError(upstream.status, raw, upstream.headers.get("Content-Type", "application/json"))
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    if chunk:
                        await resp.write(chunk)
            except Exception as exc:  # noqa: BLE001 - bytes already went out: no retry, end the stream
                log.error("stream from generation server %s broke: %s", url, exc)
                self.counters["errors"] += 1
            await resp.write_eof()
            return resp
        finally:
            upstream.release()


def run(s: ProxySettings) -> int:
    from toolkit.standin.worker import bind, serve
    if s.inherited:
        log.warning("%s: top-level keys %s are not proxy settings; TensorRT-LLM copies them into both server "
                    "sections and the HTTP proxy ignores them (a typo?)", s.config_file, sorted(s.inherited))
    try:
        sock = bind(s.hostname, s.port)
    except RuntimeError as exc:
        print(f"tk-standin-serve disaggregated: {exc}", file=sys.stderr)
        return 1
    proxy = Proxy(s)
    log.info("tk CPU stand-in, not TensorRT-LLM: disaggregated proxy for the TensorRT-LLM %s protocol on "
             "http://%s:%d; context servers %s (%s), generation servers %s (%s)%s; max_retries %d, -t %gs, -r %gs",
             s.version.line, s.hostname, s.port, s.ctx_urls, s.ctx_router["type"], s.gen_urls, s.gen_router["type"],
             f", conditional disaggregation max_local_prefill_length {s.max_local_prefill_length}"
             if s.max_local_prefill_length is not None else "", s.max_retries, s.server_start_timeout_s,
             s.request_timeout_s)

    async def main() -> int:
        await proxy.open()
        try:
            if proxy.cluster is not None:  # membership: workers come and go; /health says when enough are here
                await proxy.cluster.start()
                try:
                    await serve(proxy.app(), sock)
                finally:
                    await proxy.cluster.stop()
                return 0
            missing = await proxy.wait_ready()
            if missing:
                log.error("Timeout waiting for context and generation servers to be ready: after %gs these never "
                          "answered /health with 200: %s", s.server_start_timeout_s, ", ".join(missing))
                return 1
            log.info("Context and generation servers are ready")
            await serve(proxy.app(), sock)
            return 0
        finally:
            await proxy.close()
    rc = asyncio.run(main())
    sock.close()
    return rc
