"""Spec: the stand-in's cluster storage client and its background loops fail as TensorRT-LLM's do, and never silently
(toolkit/standin/cluster.py; nothing spawned: etcd's answers are given to the client directly).

- A key with a ttl is never written without its lease: when etcd grants none, set() fails and says why
  (TensorRT-LLM: Etcd3ClusterStorage._get_lease raises, set answers False; hostile round 4, m2).
- An answer not shaped as etcd's (a range whose entries are not key/value) is skipped with a warning, never an
  exception that ends the proxy's membership poll (hostile round 4: the poll died without a line and the proxy
  went on routing to a deregistered worker); and a poll that fails anyway is said and started again.
- A worker whose registration task fails stops (exit 1) instead of answering /health out of the routing.
"""

from __future__ import annotations

import asyncio
import base64
import logging

import pytest

from orchestrator.membership import prefix_end
from toolkit.standin import cluster as C


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class FakeEtcd(C.EtcdClient):
    """etcd's JSON gateway answering from a table: path -> answer (None: no answer, as _post gives on failure)."""

    def __init__(self, answers: dict):
        super().__init__("etcd://127.0.0.1:1")
        self.answers, self.calls = answers, []

    async def _post(self, path, body):
        self.calls.append((path, body))
        answer = self.answers.get(path)
        return answer(body) if callable(answer) else answer


def test_a_key_is_never_put_without_its_lease_when_etcd_grants_none(caplog):
    etcd = FakeEtcd({"/v3/lease/grant": None, "/v3/kv/txn": {"succeeded": True}})
    with caplog.at_level(logging.ERROR, logger="toolkit.standin"):
        assert asyncio.run(etcd.set("/trtllm-disagg/c/workers/GENERATION-h:1-1-1-001", "{}", ttl=10)) is False
    assert [path for path, _ in etcd.calls] == ["/v3/lease/grant"]  # nothing was put
    assert "Error setting key /trtllm-disagg/c/workers/GENERATION-h:1-1-1-001: etcd granted no lease of 10s" in \
        caplog.text
    for odd in ({"ID": "0"}, {"ID": "x"}, {"error": "too many requests"}, {"ID": float("inf")}, {"ID": float("nan")}):
        etcd = FakeEtcd({"/v3/lease/grant": odd, "/v3/kv/txn": {"succeeded": True}})
        assert asyncio.run(etcd.set("k", "v", ttl=10)) is False and len(etcd.calls) == 1


def test_a_granted_lease_is_put_with_the_key_and_kept_for_the_heartbeat():
    etcd = FakeEtcd({"/v3/lease/grant": {"ID": "7587"}, "/v3/kv/txn": {"succeeded": True},
                     "/v3/lease/keepalive": {"result": {"ID": "7587", "TTL": "10"}}})
    assert asyncio.run(etcd.set("k", "v", ttl=10)) is True
    txn = etcd.calls[1][1]
    assert txn["success"][0]["request_put"]["lease"] == "7587"
    assert asyncio.run(etcd.expire("k", 10)) is True
    etcd.answers["/v3/lease/keepalive"] = {"result": ["not", "etcd's"]}
    assert asyncio.run(etcd.expire("k", 10)) is False  # an odd answer is a failed keep-alive, not an exception
    for ttl in (float("inf"), float("nan")):  # int(inf) is an OverflowError
        etcd.leases["k"] = 7587
        etcd.answers["/v3/lease/keepalive"] = {"result": {"ID": "7587", "TTL": ttl}}
        assert asyncio.run(etcd.expire("k", 10)) is False


def test_a_range_with_entries_not_shaped_as_etcds_skips_them_and_keeps_the_rest(caplog):
    good = {"key": b64("/p/a"), "value": b64("{}")}
    odd = [{"value": b64("x")}, {"key": "%%%"}, "text", {"key": b64("/p/b"), "value": 7}, {"key": 12}]
    etcd = FakeEtcd({"/v3/kv/range": {"kvs": [good, *odd]}})
    with caplog.at_level(logging.WARNING, logger="toolkit.standin"):
        assert asyncio.run(etcd.get_prefix("/p/")) == {"/p/a": "{}"}
    assert "5 entries that are not etcd's key/value skipped" in caplog.text
    etcd.answers["/v3/kv/range"] = {"kvs": "nope"}
    assert asyncio.run(etcd.get_prefix("/p/")) is None
    assert etcd.calls[0][1]["range_end"] == prefix_end("/p/")  # one range_end for the job and the stand-in


def test_the_stand_in_and_the_job_share_one_prefix_end():
    assert not hasattr(C, "prefix_end") or C.prefix_end is prefix_end


def test_the_proxys_membership_poll_is_started_again_after_a_failure_and_says_so(caplog, monkeypatch):
    cfg = C.ClusterConfig(cluster_uri="etcd://127.0.0.1:1", cluster_name="c")
    monkeypatch.setattr(C, "POLL_S", 0.01)
    monkeypatch.setattr("toolkit.standin.tasks.KEEP_FIRST_DELAY_S", 0.01)
    answers = iter([RuntimeError("a bug"), {cfg.key_prefix + "/GENERATION-h:9-1-1-001":
                                            '{"worker_id": "w", "host": "h", "port": 9, "role": 1}'}])

    class Client:
        async def get_prefix(self, prefix):
            answer = next(answers, {})
            if isinstance(answer, Exception):
                raise answer
            return answer

        async def close(self):
            pass

    async def main():
        manager = C.ClusterManager(cfg, _Router(), _Router())
        manager.client = Client()
        await manager.start()
        for _ in range(100):
            if manager.workers:
                break
            await asyncio.sleep(0.02)
        await manager.stop()
        return manager
    with caplog.at_level(logging.ERROR, logger="toolkit.standin"):
        manager = asyncio.run(main())
    assert manager.counts == (0, 1)  # the poll ran again after its failure, and found the worker
    assert 'background-failed {"task": "membership-poll", "component": "proxy", "cause": "RuntimeError: a bug"' in \
        caplog.text


class _Router:
    def __init__(self):
        self.servers = set()

    def add_server(self, url):
        self.servers.add(url)

    def remove_server(self, url):
        self.servers.discard(url)


@pytest.mark.parametrize("value", [
    '{"worker_id": "z", "host": "127.0.0.1", "port": 1e400, "role": 1}',  # int(inf): OverflowError
    '{"worker_id": "z", "host": "127.0.0.1", "port": NaN, "role": 1}',  # int(nan): ValueError
    '{"worker_id": "z", "host": "127.0.0.1", "port": 9, "role": 1e400}',
    '[1, 2]', 'not json', '{"worker_id": "z"}', '{"worker_id": "z", "host": "h", "port": 9, "role": 7}',
], ids=["port-inf", "port-nan", "role-inf", "list", "text", "no-host", "role-7"])
def test_one_odd_worker_value_is_skipped_and_the_poll_goes_on_following_the_storage(caplog, value):
    """TensorRT-LLM's DisaggClusterManager._parse_worker_info catches every exception of a set event, logs "Failed to
    parse set event" and goes on (tensorrt_llm/serve/disagg_auto_scaling.py at NVIDIA/TensorRT-LLM@00184339). The
    stand-in caught three kinds: a value whose port is 1e400 ended every pass of the poll with OverflowError, so the
    proxy stopped following the storage (a worker deregistered stayed routed) for as long as that key stayed (review
    of issue 31: etcdctl put under the worker prefix on a live run)."""
    cfg = C.ClusterConfig(cluster_uri="etcd://127.0.0.1:1", cluster_name="c")
    good = cfg.key_prefix + "/GENERATION-h:9-1-1-001"
    manager = C.ClusterManager(cfg, _Router(), _Router())
    with caplog.at_level(logging.ERROR, logger="toolkit.standin"):
        manager.on_event("SET", cfg.key_prefix + "/ODD", value)
        manager.on_event("SET", good, '{"worker_id": "w", "host": "h", "port": 9, "role": 1}')
    assert manager.counts == (0, 1) and list(manager.workers) == [good]
    assert "Failed to parse set event" in caplog.text


def test_a_worker_whose_registration_task_fails_is_failed_by_its_owner(caplog, monkeypatch):
    cfg = C.ClusterConfig(cluster_uri="etcd://127.0.0.1:1", cluster_name="c")
    failed = []

    class Client:
        async def set(self, *a, **k):
            raise TypeError("an answer nobody expected")

        async def delete(self, key):
            return True

        async def close(self):
            pass
    monkeypatch.setattr(C, "storage_client", lambda uri: Client())

    async def main():
        member = C.Membership(cfg, "generation", "127.0.0.1", 9, on_failure=failed.append)
        await member()
        await asyncio.sleep(0.05)
        await member.stop()
    with caplog.at_level(logging.ERROR, logger="toolkit.standin"):
        asyncio.run(main())
    assert [type(e) for e in failed] == [TypeError]
    assert '"task": "membership-register", "component": "worker 127.0.0.1:9"' in caplog.text


def test_odd_answers_of_the_proxy_hosted_storage_are_failures_not_exceptions(caplog):
    """The HTTP storage client: a body that is not {"result": ...}, or a listing that is not a mapping, is a failed
    call (logged), which the poll rides out; an unexpected key never reaches the routers."""
    client = C.HttpClient("http://127.0.0.1:1")

    def answering(body):
        async def call(method, route, **kw):
            return True, body
        return call
    client._call = answering(["not", "a", "mapping"])
    with caplog.at_level(logging.WARNING, logger="toolkit.standin"):
        assert asyncio.run(client.get_prefix("/p/")) is None
    assert "is not a mapping of keys" in caplog.text
    cfg = C.ClusterConfig(cluster_uri="etcd://127.0.0.1:1", cluster_name="c")
    manager = C.ClusterManager(cfg, None, None)
    manager.on_event("SET", 7, "{}")  # not a key: ignored, no exception
    assert manager.workers == {}
