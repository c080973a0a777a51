"""Spec: the stand-in answers /health_generate as trtllm-serve does (one minimal generation through the engine),
and its wedge test fault (SIGUSR1) stops all progress while /health stays 200 — TensorRT-LLM's largest hang class,
which the job's progress probe (orchestrator.policy.ProgressWatch) must catch."""

from __future__ import annotations

import signal
import threading

import pytest
import requests

from tests.standin.test_aggregated import OPTIONS


@pytest.fixture(scope="module")
def worker(launcher):
    return launcher.worker("wedge", launcher.options("wedge.yaml", OPTIONS))


def test_health_generate_runs_one_generation_and_is_not_counted_as_a_request(worker):
    before = requests.get(worker.url + "/standin/stats", timeout=10).json()
    resp = requests.get(worker.url + "/health_generate", timeout=10)
    assert resp.status_code == 200 and resp.text == "Generation health check OK"
    after = requests.get(worker.url + "/standin/stats", timeout=10).json()
    assert after["requests"] == before["requests"] and after["health_generate"] == before.get("health_generate", 0) + 1


def test_a_wedged_engine_answers_health_but_no_request_and_no_generation_probe(worker):
    body = {"model": "tk/standin-tiny", "prompt": "a request in flight when the engine wedges", "max_tokens": 4,
            "stream": True}
    worker.signal(signal.SIGUSR1)
    outcome = {}

    def in_flight():
        try:
            outcome["status"] = requests.post(worker.url + "/v1/completions", json=body, timeout=3).status_code
        except requests.RequestException as exc:
            outcome["error"] = type(exc).__name__
    t = threading.Thread(target=in_flight)
    t.start()
    assert requests.get(worker.url + "/health", timeout=5).status_code == 200  # still "healthy"
    with pytest.raises(requests.Timeout):
        requests.get(worker.url + "/health_generate", timeout=2)
    t.join(10)
    assert "error" in outcome, outcome  # no token came back: the client gave up (its 3 s read timeout)
    assert "wedged" in worker.log()
