"""The job's view of TensorRT-LLM's cluster storage (disagg_cluster), standard library only.

URI is the proxy config's cluster_uri: http://HOST:PORT (storage hosted by the proxy: GET /get_prefix, DELETE
/delete, answers {"result": R}) or etcd://HOST:PORT (etcd v3's JSON gateway: /v3/kv/range, /v3/kv/deleterange,
/v3/lease/keepalive). Worker keys are PREFIX/{ROLE}-{host}:{port}-{ms}-{pid}-{rnd} (tensorrt_llm/serve/
disagg_auto_scaling.py, get_worker_key; docs/trtllm-versions.md "Membership").

- registered(): the start-up waits until every worker has a key.
- deregister(): a worker that dies without deleting its key stays in the proxy's routers until the key's TTL
  (inactive_timeout_sec) passes; the job deletes it at once, as the worker itself does on a clean exit.
- repair(): after the job's etcd was restarted or stalled, every worker's keep-alive has failed and the worker
  retries registration, which is put-if-absent, every 5 s (DisaggClusterWorker.register_worker). Its old key
  survives the restart (etcd restores leases with a fresh TTL), so every retry fails until all the old leases
  expire at the same moment: the proxy then has no worker of any role and refuses every request. repair()
  deletes the stale keys one worker per role at a time, waiting for that worker's new registration before the
  next, and keeps the others' leases alive meanwhile, so no role ever loses all its workers.
Every call is bounded (TIMEOUT_S); every failure raises StorageError with the reason: no connection, an answer
cut short or malformed (http.client's IncompleteRead, LineTooLong, RemoteDisconnected...: an etcd restarting) or
a JSON document not shaped as etcd's; never another exception (the job's callers handle StorageError only). The
etcd the job starts speaks HTTPS and wants the run's client certificate (orchestrator.tls), which every call then
presents.
"""

from __future__ import annotations

import base64
import functools
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, TypeVar, cast

from orchestrator import tls

TIMEOUT_S = 5
MAX_BODY = 8 << 20


class StorageError(RuntimeError):
    pass


F = TypeVar("F", bound=Callable[..., Any])
# what a storage answer cut short or shaped unexpectedly raises on its way through urllib, json and our reading
_ODD_ANSWER = (http.client.HTTPException, OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError,
               OverflowError)  # int(inf) of a number etcd never sends


def _storage_call(fn: F) -> F:
    """Every failure of fn is a StorageError that names it."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except StorageError:
            raise
        except _ODD_ANSWER as exc:
            raise StorageError(f"{fn.__name__}: an answer it could not read ({type(exc).__name__}: {exc})"
                               ) from None
    return cast(F, call)


def _http(method: str, url: str, body: Optional[dict] = None) -> Tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    ctx = tls.context() if url.startswith("https:") else None
    try:
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S, context=ctx) as resp:  # noqa: S310
                return resp.status, _json(resp.read(MAX_BODY))
        except urllib.error.HTTPError as exc:  # the HTTP storage answers 400 for an empty result
            return exc.code, _json(exc.read(MAX_BODY))
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        # no connection; or an answer cut short or malformed (IncompleteRead, LineTooLong, RemoteDisconnected)
        raise StorageError(f"{method} {url}: {type(exc).__name__}: {exc}") from None


def _json(raw: bytes) -> dict:
    try:
        doc = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def prefix_end(prefix: str) -> str:
    """etcd's range_end for every key that starts with prefix: the prefix with its last byte below 0xff
    incremented (trailing 0xff bytes dropped), base64; a prefix of only 0xff bytes ranges to the end ("\\0")."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return base64.b64encode(b"\0").decode()
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


def _etcd_host(uri: str) -> str:
    return uri.partition("://")[2].split(",")[0]


@_storage_call
def entries(uri: str, prefix: str) -> Dict[str, Optional[str]]:
    """Every key under prefix -> its etcd lease id (None for the HTTP storage)."""
    scheme = uri.partition("://")[0]
    if scheme == "etcd":
        host = _etcd_host(uri)
        status, doc = _http("POST", f"{tls.scheme()}://{host}/v3/kv/range",
                            {"key": _b64(prefix), "range_end": prefix_end(prefix), "keys_only": True})
        if status != 200:
            raise StorageError(f"etcd {host} answered {status} to a range of {prefix}")
        out: Dict[str, Optional[str]] = {}
        kvs = doc.get("kvs") or []
        if not isinstance(kvs, list):
            raise StorageError(f"etcd {host} answered a range of {prefix} without a list of keys")
        for kv in kvs:
            if not isinstance(kv, dict):
                continue
            try:
                out[base64.b64decode(kv["key"]).decode()] = str(kv["lease"]) if kv.get("lease") else None
            except (KeyError, TypeError, ValueError):
                continue
        return out
    query = urllib.parse.urlencode({"key_prefix": prefix, "keys_only": 1})
    status, doc = _http("GET", f"{uri.rstrip('/')}/get_prefix?{query}")
    if status not in (200, 400):
        raise StorageError(f"{uri} answered {status} to get_prefix")
    result = doc.get("result") or {}
    return {str(k): None for k in (result.keys() if isinstance(result, dict) else [])}


def keys(uri: str, prefix: str) -> List[str]:
    return list(entries(uri, prefix))


@_storage_call
def delete(uri: str, key: str) -> bool:
    """True when the storage says the key is gone."""
    if uri.startswith("etcd://"):
        status, doc = _http("POST", f"{tls.scheme()}://{_etcd_host(uri)}/v3/kv/deleterange", {"key": _b64(key)})
        try:
            return status == 200 and int(doc.get("deleted", 0)) > 0
        except (TypeError, ValueError, OverflowError):
            return False
    status, doc = _http("DELETE", f"{uri.rstrip('/')}/delete?{urllib.parse.urlencode({'key': key})}")
    return status == 200 and bool(doc.get("result"))


@_storage_call
def keep_alive(uri: str, lease: str) -> bool:
    """One etcd lease keep-alive (what a worker's heartbeat does)."""
    if not uri.startswith("etcd://") or not lease:
        return False
    status, _ = _http("POST", f"{tls.scheme()}://{_etcd_host(uri)}/v3/lease/keepalive", {"ID": lease})
    return status == 200


def of_worker(all_keys: Iterable[str], worker: str) -> List[str]:
    """The keys of the worker registered as host:port."""
    return [k for k in all_keys if f"-{worker}-" in k.rsplit("/", 1)[-1]]


def _prefix(prefix: str) -> str:
    return prefix.rstrip("/") + "/"


@_storage_call
def missing(uri: str, prefix: str, workers: List[str]) -> List[str]:
    """The workers (host:port) with no key in the storage."""
    found = keys(uri, _prefix(prefix))
    return [w for w in workers if not of_worker(found, w)]


@_storage_call
def deregister(uri: str, prefix: str, worker: str) -> int:
    """Delete a dead worker's keys; how many."""
    return sum(1 for key in of_worker(keys(uri, _prefix(prefix)), worker) if delete(uri, key))


@_storage_call
def repair(uri: str, prefix: str, roles: List[List[str]], *, wait_s: float = 15.0, poll_s: float = 0.5,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
           stop: Callable[[], bool] = lambda: False) -> Dict[str, List[str]]:
    """Replace every worker's stale registration, one worker of each role at a time (roles: the workers' host:port
    grouped by role). A worker's key is the same before and after (its worker_id is fixed per process): once its
    old key is deleted, any key of it is its new registration. Returns {"replaced": [...], "not_back": [...]}
    (not_back: its key deleted, and it had not registered again within wait_s)."""
    prefix = _prefix(prefix)
    replaced: List[str] = []
    not_back: List[str] = []
    for i in range(max((len(r) for r in roles), default=0)):
        if stop():
            break
        batch = [r[i] for r in roles if i < len(r)]
        later = [w for r in roles for w in r[i + 1:]]
        current = entries(uri, prefix)
        old = {w: set(of_worker(current, w)) for w in batch}
        for w in batch:
            for key in old[w]:
                delete(uri, key)
        deadline = clock() + wait_s
        waiting = [w for w in batch if old[w]]
        while waiting and clock() < deadline and not stop():
            sleep(poll_s)
            current = entries(uri, prefix)
            leases = {current[k] for w in later for k in of_worker(current, w)}
            for lease in sorted(lease for lease in leases if lease):
                keep_alive(uri, lease)  # the workers still waiting keep their old registration meanwhile
            back = [w for w in waiting if of_worker(current, w)]  # a worker registers under the same key again
            replaced += back
            waiting = [w for w in waiting if w not in back]
        not_back += waiting
    return {"replaced": replaced, "not_back": not_back}
