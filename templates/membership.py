#!/usr/bin/env python3
"""launch.sbatch's view of TensorRT-LLM's cluster storage (disagg_cluster), standard library only.

    membership.py registered URI PREFIX HOST:PORT...   exit 0 once every worker has a key; else prints the missing
    membership.py deregister URI PREFIX HOST:PORT      delete that worker's keys; prints how many

URI is the proxy config's cluster_uri: http://HOST:PORT (storage hosted by the proxy: GET /get_prefix, DELETE
/delete, answers {"result": R}) or etcd://HOST:PORT (etcd v3's JSON gateway: /v3/kv/range, /v3/kv/deleterange).
Worker keys are PREFIX/{ROLE}-{host}:{port}-{ms}-{pid}-{rnd} (tensorrt_llm/serve/disagg_auto_scaling.py,
get_worker_key; docs/trtllm-versions.md "Membership"). A worker that dies without deleting its key stays in the
proxy's routers until the key's TTL (inactive_timeout_sec) passes; the job deletes it at once, as the worker
itself does on a clean exit, so the proxy stops routing to it within one supervision interval.
Every call is bounded (5 s); any failure is exit 2 with the reason on stderr.

With TK_ETCD_TLS_DIR set (the run's certificates, ca.crt / client.crt / client.key: the etcd the job starts opens
to them only), etcd is asked over TLS with that client certificate, its own checked against the run's CA.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import sys
import urllib.parse
import urllib.request

TIMEOUT_S = 5


def _tls() -> ssl.SSLContext | None:
    tls_dir = os.environ.get("TK_ETCD_TLS_DIR")
    if not tls_dir:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(os.path.join(tls_dir, "ca.crt"))
    ctx.check_hostname = False  # the run's own CA signs only the run's etcd
    ctx.load_cert_chain(os.path.join(tls_dir, "client.crt"), os.path.join(tls_dir, "client.key"))
    return ctx


def _etcd(host: str) -> str:
    return f"{'https' if os.environ.get('TK_ETCD_TLS_DIR') else 'http'}://{host}"


def _http(method: str, url: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S, context=_tls() if url.startswith("https") else None) \
                as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:  # the HTTP storage answers 400 for an empty result
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _prefix_end(prefix: str) -> str:
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return base64.b64encode(bytes(raw)).decode()


def keys(uri: str, prefix: str) -> list[str]:
    scheme, _, rest = uri.partition("://")
    if scheme == "etcd":
        host = rest.split(",")[0]
        status, doc = _http("POST", f"{_etcd(host)}/v3/kv/range",
                            {"key": _b64(prefix), "range_end": _prefix_end(prefix), "keys_only": True})
        if status != 200:
            raise RuntimeError(f"etcd {host} answered {status} to a range of {prefix}")
        return [base64.b64decode(kv["key"]).decode() for kv in doc.get("kvs", [])]
    query = urllib.parse.urlencode({"key_prefix": prefix, "keys_only": 1})
    status, doc = _http("GET", f"{uri.rstrip('/')}/get_prefix?{query}")
    if status not in (200, 400):
        raise RuntimeError(f"{uri} answered {status} to get_prefix")
    return list((doc.get("result") or {}).keys())


def delete(uri: str, key: str) -> bool:
    """True when the storage says the key is gone."""
    scheme, _, rest = uri.partition("://")
    if scheme == "etcd":
        status, doc = _http("POST", f"{_etcd(rest.split(',')[0])}/v3/kv/deleterange", {"key": _b64(key)})
        return status == 200 and int(doc.get("deleted", 0)) > 0
    status, doc = _http("DELETE", f"{uri.rstrip('/')}/delete?{urllib.parse.urlencode({'key': key})}")
    return status == 200 and bool(doc.get("result"))


def of_worker(all_keys: list[str], worker: str) -> list[str]:
    return [k for k in all_keys if f"-{worker}-" in k.rsplit("/", 1)[-1]]


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] not in ("registered", "deregister"):
        print(__doc__, file=sys.stderr)
        return 2
    command, uri, prefix, workers = argv[0], argv[1], argv[2].rstrip("/") + "/", argv[3:]
    try:
        found = keys(uri, prefix)
        if command == "registered":
            missing = [w for w in workers if not of_worker(found, w)]
            if missing:
                print(" ".join(missing))
                return 1
            return 0
        gone = [key for key in of_worker(found, workers[0]) if delete(uri, key)]
        print(len(gone))
        return 0
    except (OSError, ValueError, RuntimeError, KeyError, ssl.SSLError) as exc:
        print(f"membership.py {command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
