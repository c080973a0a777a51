"""Spec: a new user's real client, the official `openai` SDK, against a `tk launch --local` deployment of the
stand-in with emulated timing (recipes/standin-lab-1p1d.yaml): completions and chat, plain and streamed,
through the proxy; usage counts are right and streamed tokens arrive at the emulated cadence, one by one,
not in one burst (before emulation, every stream arrived at once)."""

from __future__ import annotations

import time

import pytest

from tests.integration.helpers import ROOT, tk, tk_json

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.slow, pytest.mark.nixl]

RECIPE = ROOT / "recipes" / "standin-lab-1p1d.yaml"
PORTS = ["--set", "proxy.port=28600", "--set", "cluster.worker_base_port=28936"]


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("openai") / "run"
    record = tk_json("launch", str(RECIPE), "--local", "--run-dir", str(run_dir), *PORTS, timeout=300)
    try:
        yield record["endpoint"], record["model"]
    finally:
        tk("stop", str(run_dir), timeout=120, check=True)


def test_plain_completion_and_chat_answer_with_the_tokens_asked_for(endpoint):
    url, model = endpoint
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=60, max_retries=0)
    done = client.completions.create(model=model, prompt="the KV cache moves", max_tokens=12, temperature=0)
    assert done.choices[0].text and done.usage.completion_tokens == 12 and done.usage.prompt_tokens > 0
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hello"}],
                                          max_tokens=8, temperature=0)
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 8


def test_a_stream_arrives_token_by_token_at_the_emulated_cadence(endpoint):
    url, model = endpoint
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=60, max_retries=0)
    stamps, text = [], ""
    for chunk in client.completions.create(model=model, prompt="x " * 200, max_tokens=24, temperature=0,
                                           stream=True):
        if chunk.choices and chunk.choices[0].text:
            stamps.append(time.perf_counter())
            text += chunk.choices[0].text
    assert len(stamps) >= 20 and text
    gaps = sorted(b - a for a, b in zip(stamps, stamps[1:]))
    # One decode step of Llama-3.1-8B on an H100 is a few milliseconds in the roofline; a burst would be ~0.
    assert gaps[len(gaps) // 2] > 0.002, f"median inter-token gap {gaps[len(gaps) // 2] * 1e3:.3f} ms"
    plain = client.completions.create(model=model, prompt="x " * 200, max_tokens=24, temperature=0)
    assert plain.choices[0].text == text  # greedy: streamed and plain answers agree
