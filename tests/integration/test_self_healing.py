"""Spec: a deployment keeps serving when a worker dies or hangs (supervision policy `restart`, the default).

On the real dev Slurm cluster and on the local backend, with the official `openai` client driving streaming load
through the proxy (tests/integration/faultload.py): kill -9 of a generation server, then of a context server,
then SIGSTOP of a generation server (a hung one, for 20 s). For each fault:

- the requests that fail are bounded: they end within the outage window (fault .. the server healthy again +
  the proxy's retry), and there are at most as many as clients could send in that window;
- the deployment keeps serving meanwhile (good requests complete during the outage);
- the server is restarted on its node and is healthy and taking traffic again within RECOVERY_BOUND_S;
- `tk status` shows the run degraded, then ready again with no stale reason, and the restart with the exit code;
- `tk stop` leaves nothing.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import pytest
import requests
import yaml

from tests.integration.faultload import ClosedLoopLoad, good_per_s
from tests.integration.helpers import STANDIN_RECIPE, processes_mentioning, tk, tk_json, wait_until
from tests.integration.test_launch import assert_nothing_left, backend, server_pids  # noqa: F401 (backend: a fixture)

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.slow, pytest.mark.nixl]

# A stand-in server starts in about 2 s; the first restart waits backoff_initial_s (2 s); the job looks every
# health_interval_s (2 s) plus a probe (at most 3 s). A hung server is killed after unhealthy_after_s (set to 8 s
# below), and SIGSTOP lasts 20 s. 30 s bounds all of it with room for a loaded 2-core machine.
RECOVERY_BOUND_S = 30
UNHEALTHY_AFTER_S = 8
CONCURRENCY = 6


def _status(env) -> dict:
    return json.loads(tk("status", "--json", env=env).stdout)


def _server(doc: dict, name: str) -> dict:
    return next(s for s in doc["servers"] if s["name"] == name)


def _gen_legs(endpoint: str, port: int) -> int:
    """Generation legs the proxy sent to the server on `port` (the stand-in proxy's own counters)."""
    stats = requests.get(f"{endpoint}/standin/stats", timeout=10).json()
    return sum(n for url, n in stats["generation_servers"].items() if url.endswith(f":{port}"))


def _ctx_legs(endpoint: str, port: int) -> int:
    stats = requests.get(f"{endpoint}/standin/stats", timeout=10).json()
    return sum(n for url, n in stats["context_servers"].items() if url.endswith(f":{port}"))


def _fault_and_recovery(env, run_dir: str, endpoint: str, backend: str, victim: str, port: int, how: signal.Signals,
                        legs) -> tuple[float, float]:
    """Send `how` to the victim's processes (SIGSTOP: for 20 s); tk status must show the run degraded naming it,
    then ready again with no stale reason once the victim is restarted (exit 137), and the victim must take
    traffic again. (fault time, recovery time)."""
    pids = server_pids(run_dir, port)
    assert pids, f"no process for {victim} in {processes_mentioning(run_dir)}"
    t_fault = time.monotonic()
    for pid in pids:
        os.kill(pid, how)

    def degraded():
        doc = _status(env)
        return doc if doc["state"] == "degraded" and _server(doc, victim)["state"] != "healthy" else None

    seen = wait_until(degraded, 40 if how == signal.SIGSTOP else 15, f"tk status to show {victim} down")
    assert victim in seen["reason"]
    if how == signal.SIGSTOP:
        time.sleep(max(0.0, 20 - (time.monotonic() - t_fault)))
        for pid in pids:  # the 20 s are over; by now supervision has killed and replaced it
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def recovered():
        doc = _status(env)
        s = _server(doc, victim)
        return doc if doc["state"] == "ready" and s["state"] == "healthy" and s["restarts"] >= 1 else None

    doc = wait_until(recovered, RECOVERY_BOUND_S + 20, f"{victim} restarted and the run ready again")
    t_back = time.monotonic()
    assert t_back - t_fault < RECOVERY_BOUND_S + (20 if how == signal.SIGSTOP else 0), \
        f"{victim} took {t_back - t_fault:.1f}s to recover"
    assert doc["reason"] is None, "a ready run carries no stale reason"
    back = _server(doc, victim)
    assert back["last_exit"] == 137, back  # SIGKILL: by us, or by supervision for the hung one
    where = "step" if backend == "slurm" else "pid"
    wait_until(lambda: _server(_status(env), victim)[where], 10, f"tk status to show {victim}'s {where}")
    before = legs(endpoint, port)
    wait_until(lambda: legs(endpoint, port) > before, 20, f"{victim} to take traffic again")
    return t_fault, t_back


def _assert_failures_bounded(records: list, windows: list) -> None:
    """Good requests were served through every outage; every failure ended within one, and at most as many as the
    clients could send there."""
    assert len(records) > 50, f"only {len(records)} requests were sent"
    for victim, t_fault, t_back in windows:
        outage = t_back - t_fault
        good = good_per_s(records, t_fault, t_back)
        assert good > 0, f"nothing was served while {victim} was down ({outage:.1f}s)"
    failed = [r for r in records if not r.ok]
    # Failures end within an outage (plus the proxy's 1 s retry and a request's length); none outside.
    in_windows = [r for r in failed if any(t0 <= r.t_end <= t1 + 5 for _, t0, t1 in windows)]
    assert failed == in_windows, f"failures outside the outage windows: {[r for r in failed if r not in in_windows][:3]}"
    # Each client can lose at most one request per proxy retry interval (1 s) while a server is out of reach.
    bound = sum(CONCURRENCY * (t1 - t0 + 5) for _, t0, t1 in windows)
    assert len(failed) <= bound, f"{len(failed)} failed requests, bound {bound:.0f}"


def test_the_deployment_keeps_serving_through_killed_and_hung_workers(backend, tmp_path):
    env = {"TK_RUNS_DIR": str(tmp_path / "runs")}
    args = ["launch", str(STANDIN_RECIPE), "--set", f"supervision.unhealthy_after_s={UNHEALTHY_AFTER_S}"]
    record = tk_json(*args, *(["--local"] if backend == "local" else []), env=env, timeout=400)
    run_dir, endpoint = record["run_dir"], record["endpoint"]
    servers = {s["name"]: s for s in record["servers"]}
    load = ClosedLoopLoad(endpoint, record["model"], concurrency=CONCURRENCY).start()
    windows = []
    try:
        time.sleep(4)
        for victim, how, legs in (("gen-1", signal.SIGKILL, _gen_legs), ("ctx-1", signal.SIGKILL, _ctx_legs),
                                  ("gen-0", signal.SIGSTOP, _gen_legs)):
            windows.append((victim, *_fault_and_recovery(env, run_dir, endpoint, backend, victim,
                                                         servers[victim]["port"], how, legs)))
            time.sleep(3)
    finally:
        records = load.stop()
        stopped = tk("stop", run_dir, env=env, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert_nothing_left(run_dir, backend, record.get("job_id"))
    _assert_failures_bounded(records, windows)


def test_with_etcd_storage_a_dead_worker_is_deregistered_at_once_and_rejoins_when_restarted(tmp_path):
    """membership (storage etcd, its default): the job starts a real etcd (Debian's etcd-server) on the proxy's node,
    opened only to the run's own client certificate; a killed generation server's key is deleted by the job at once,
    and the restarted one registers again. Neither a client of the proxy nor anyone without the run's certificate
    can touch the worker registry (issue 21, C1)."""
    env = {"TK_RUNS_DIR": str(tmp_path / "runs")}
    record = tk_json("launch", str(STANDIN_RECIPE), "--local", "--set", "membership.enabled=true",
                     "--set", "membership.etcd_port=28379", env=env, timeout=400)
    run_dir, endpoint = record["run_dir"], record["endpoint"]
    try:
        assert any(e["event"] == "registered" and e["reason"] == "every worker in the cluster storage "
                   "etcd://127.0.0.1:28379" for e in _events(run_dir))
        # C1: the proxy's clients find no storage on its port; the etcd refuses whoever lacks the run's certificate
        rogue = {"key": "/trtllm-disagg//workers/CONTEXT-127.0.0.1:1-1-1-001", "value": json.dumps(
            {"worker_id": "CONTEXT-127.0.0.1:1-1-1-001", "host": "127.0.0.1", "port": 1, "role": 0}), "ttl": 3600}
        assert requests.post(f"{endpoint}/set", json=rogue, timeout=10).status_code == 404
        assert requests.delete(f"{endpoint}/delete", params={"key": "x"}, timeout=10).status_code in (404, 405)
        with pytest.raises(requests.exceptions.ConnectionError):  # TLS required, and a certificate with it
            requests.post("http://127.0.0.1:28379/v3/kv/range", json={"key": "Lw=="}, timeout=5)
        with pytest.raises(requests.exceptions.SSLError):
            requests.post("https://127.0.0.1:28379/v3/kv/range", json={"key": "Lw=="}, verify=False, timeout=5)
        assert (Path(run_dir) / "secrets").stat().st_mode & 0o077 == 0
        port = next(s["port"] for s in record["servers"] if s["name"] == "gen-1")
        for pid in server_pids(run_dir, port):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: any(e["event"] == "deregistered" and e["component"] == "gen-1" for e in _events(run_dir)),
                   15, "the job to delete gen-1's key")

        def back():
            doc = _status(env)
            return doc["state"] == "ready" and _server(doc, "gen-1")["restarts"] == 1

        wait_until(back, RECOVERY_BOUND_S, "gen-1 restarted and the run ready again")
        def registered():  # the restarted server registers again once it listens; the proxy reads etcd each second
            info = requests.get(f"{endpoint}/cluster_info", timeout=10).json()
            return port in {w["port"] for w in info["current_workers"]["generation_servers"]}

        wait_until(registered, 15, "the restarted gen-1 registered in etcd and taken back by the proxy")
        before = _gen_legs(endpoint, port)
        for _ in range(6):
            requests.post(f"{endpoint}/v1/completions", json={"model": record["model"], "prompt": "hello again",
                                                               "max_tokens": 4}, timeout=30).raise_for_status()
        assert _gen_legs(endpoint, port) > before
    finally:
        tk("stop", run_dir, env=env, timeout=120)
    assert_nothing_left(run_dir, "local", None)


STALL_AFTER_S = 8
INTERVAL_S = 2  # the job's probe interval (toolkit/plan/build.py HEALTH_INTERVAL_S)


def _events(run_dir: str) -> list[dict]:
    path = Path(run_dir) / "state" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def test_a_wedged_generation_server_under_load_is_detected_and_restarted_and_serving_continues(backend, tmp_path):
    """m11 / issue 22: gen-0 keeps answering /health but produces no token (the stand-in's SIGUSR1 fault, TensorRT-LLM's
    largest hang class). The job's progress probe (/health_generate) sees no progress for stall_after_s: the event
    says `wedged`, the server is killed and restarted, the run is ready again, and the rest kept serving."""
    env = {"TK_RUNS_DIR": str(tmp_path / "runs")}
    args = ["launch", str(STANDIN_RECIPE), "--set", f"supervision.stall_after_s={STALL_AFTER_S}"]
    record = tk_json(*args, *(["--local"] if backend == "local" else []), env=env, timeout=400)
    run_dir, endpoint = record["run_dir"], record["endpoint"]
    port = next(s["port"] for s in record["servers"] if s["name"] == "gen-0")
    load = ClosedLoopLoad(endpoint, record["model"], concurrency=CONCURRENCY).start()
    try:
        time.sleep(4)
        pids = server_pids(run_dir, port)
        assert pids, f"no process for gen-0 in {processes_mentioning(run_dir)}"
        t_fault, wall_fault = time.monotonic(), time.time()
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)
        wedged = wait_until(lambda: [e for e in _events(run_dir) if e["event"] == "wedged"], STALL_AFTER_S + 30,
                            "the job to find gen-0 wedged")
        assert wedged[0]["component"] == "gen-0" and "no token" in wedged[0]["reason"], wedged
        detect_s = wedged[0]["time"] - wall_fault
        # within stall_after_s of the last progress seen (at most one probe interval before the fault) plus one
        # round of the loop (an interval and a probe); 2 s more for a loaded 2-core machine
        assert detect_s <= STALL_AFTER_S + INTERVAL_S + 3 + 2, f"detected after {detect_s:.1f}s"

        def recovered():
            doc = _status(env)
            s = _server(doc, "gen-0")
            return doc if doc["state"] == "ready" and s["state"] == "healthy" and s["restarts"] >= 1 else None

        doc = wait_until(recovered, RECOVERY_BOUND_S, "gen-0 restarted and the run ready again")
        t_back = time.monotonic()
        assert _server(doc, "gen-0")["last_exit"] == 137  # killed by supervision
        exited = [e for e in _events(run_dir) if e["event"] == "server-exited" and e["component"] == "gen-0"]
        assert exited and "wedged" in exited[0]["reason"]
        before = _gen_legs(endpoint, port)
        wait_until(lambda: _gen_legs(endpoint, port) > before, 20, "the restarted gen-0 to take traffic again")
        time.sleep(3)
    finally:
        records = load.stop()
        stopped = tk("stop", run_dir, env=env, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert_nothing_left(run_dir, backend, record.get("job_id"))
    assert good_per_s(records, t_fault, t_back) > 0, "nothing was served while gen-0 was wedged"
    failed = [r for r in records if not r.ok]
    assert all(t_fault <= r.t_end <= t_back + 5 for r in failed), "failures outside the wedge window"
    # What fails, and how many: the requests in flight on the wedged server when it is killed (one per client at
    # most); then, until it is healthy again, the proxy's static round robin still sends it requests (TensorRT-LLM's
    # disagg server with static urls does not drop a dead server), and each fails after the proxy's retries
    # (max_retries, 1 s apart): so a client fails at most once per retry window while gen-0 restarts.
    t_kill = t_fault + (wedged[0]["time"] - wall_fault)  # found wedged, then killed at once
    retry_s = max(1.0, 1.0 * yaml.safe_load((Path(run_dir) / "disagg.yaml").read_text()).get("max_retries", 1))
    in_flight = [r for r in failed if r.t_start <= t_kill]
    while_restarting = [r for r in failed if r.t_start > t_kill]
    assert len(in_flight) <= CONCURRENCY, f"{len(in_flight)} failed requests at the kill: more than the clients"
    bound = CONCURRENCY * math.ceil((t_back + 5 - t_kill) / retry_s)
    assert len(while_restarting) <= bound, (f"{len(while_restarting)} requests failed while gen-0 restarted "
                                            f"({t_back - t_kill:.1f} s): more than one per client per {retry_s:g} s")


class ClusterWatch:
    """Polls the proxy's /cluster_info (every 0.3 s, in a thread): the fewest registered workers of each role seen."""

    def __init__(self, endpoint: str):
        import threading
        self.endpoint, self.samples = endpoint, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                info = requests.get(f"{self.endpoint}/cluster_info", timeout=2).json()["current_workers"]
                self.samples.append((time.monotonic(), len(info["context_servers"]), len(info["generation_servers"])))
            except (requests.RequestException, ValueError, KeyError):
                pass
            self._stop.wait(0.3)

    def __enter__(self) -> "ClusterWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


def test_an_etcd_stall_does_not_empty_the_cluster_when_etcd_returns(tmp_path):
    """M7: etcd stopped (SIGSTOP) under load; supervision kills and restarts it after unhealthy_after_s. The workers'
    keep-alives failed meanwhile and their put-if-absent re-registration is blocked by their own old keys, which etcd
    restores with a fresh TTL: left alone, every key expires at the same moment and the proxy has no worker. The job
    replaces the stale registrations one worker per role at a time, so no role is ever empty; its events say so."""
    env = {"TK_RUNS_DIR": str(tmp_path / "runs")}
    record = tk_json("launch", str(STANDIN_RECIPE), "--local", "--set", "membership.enabled=true",
                     "--set", "membership.etcd_port=28379", "--set", f"supervision.unhealthy_after_s={UNHEALTHY_AFTER_S}",
                     env=env, timeout=400)
    run_dir, endpoint = record["run_dir"], record["endpoint"]
    etcd = next(s for s in record["servers"] if s["name"] == "etcd")
    load = ClosedLoopLoad(endpoint, record["model"], concurrency=2).start()
    try:
        with ClusterWatch(endpoint) as watch:
            time.sleep(3)
            pid = json.loads((Path(run_dir) / "state" / "servers" / "etcd.json").read_text())["pid"]
            t_stall = time.monotonic()
            os.kill(pid, signal.SIGSTOP)
            wait_until(lambda: any(e["event"] == "restarted" and e["component"] == "etcd" for e in _events(run_dir)),
                       UNHEALTHY_AFTER_S + 30, "the job to restart the stalled etcd")
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            time.sleep(35)  # well past the restored leases' TTL (inactive_timeout_s, 10 s)
            t_end = time.monotonic()
        after = [(ctx, gen) for t, ctx, gen in watch.samples if t >= t_stall]
        assert after and min(c for c, _ in after) >= 1 and min(g for _, g in after) >= 1, \
            f"a role was left with no registered worker: {after}"
        repaired = [e for e in _events(run_dir) if e["event"] == "membership-repaired"]
        assert repaired and "4 worker registration(s) replaced" in repaired[0]["reason"], repaired
        doc = _status(env)
        assert doc["state"] == "ready" and _server(doc, "etcd")["restarts"] >= 1
        assert etcd["port"] == 28379
    finally:
        records = load.stop()
        tk("stop", run_dir, env=env, timeout=120)
    assert_nothing_left(run_dir, "local", None)
    failed = [r for r in records if not r.ok and t_stall <= r.t_end <= t_end]
    assert good_per_s(records, t_stall, t_end) > 0
    assert len(failed) <= 4, f"{len(failed)} requests failed around the etcd stall: {failed[:3]}"


@pytest.mark.slurm
def test_a_slurm_controller_outage_does_not_spend_a_dying_servers_restart_budget(dev_slurm, tmp_path):
    """M8: slurmctld stops answering, then gen-1 dies. Every restart's srun fails without creating a step while the
    controller is away: retried with backoff, not counted against max_restarts (1 here), so gen-1 is restarted once
    the controller is back instead of being given up."""
    env = {"TK_RUNS_DIR": str(tmp_path / "runs"), **dev_slurm.env}
    record = tk_json("launch", str(STANDIN_RECIPE), "--set", "supervision.max_restarts=1", env=env, timeout=400)
    run_dir = record["run_dir"]
    port = next(s["port"] for s in record["servers"] if s["name"] == "gen-1")
    controller = int((Path(dev_slurm.conf).parent / "run" / "slurmctld.pid").read_text().split()[0])
    try:
        os.kill(controller, signal.SIGSTOP)
        try:
            for pid in server_pids(run_dir, port):
                os.kill(pid, signal.SIGKILL)
            wait_until(lambda: len([e for e in _events(run_dir) if e["event"] == "step-not-created"]) >= 2, 90,
                       "restarts that srun could not create while the controller is away")
        finally:
            os.kill(controller, signal.SIGCONT)

        def back():
            doc = _status(env)
            s = _server(doc, "gen-1")
            return doc if doc["state"] == "ready" and s["state"] == "healthy" and s["restarts"] >= 1 else None

        wait_until(back, 120, "gen-1 restarted once the controller answers again")
        state = json.loads((Path(run_dir) / "state" / "servers" / "gen-1.json").read_text())
        assert state["failures"] == 1 and state["restarts"] == 1, state  # one counted restart, the budget not spent
        assert not [e for e in _events(run_dir) if e["event"] == "lost"]
    finally:
        tk("stop", run_dir, env=env, timeout=120)
    assert_nothing_left(run_dir, "slurm", record.get("job_id"))
