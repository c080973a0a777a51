"""An aggregated stand-in worker (no cache_transceiver_config): the baseline every disaggregated answer must equal."""

from __future__ import annotations

import json

import msgpack
import pytest
import requests

from toolkit.client import complete

OPTIONS = {"max_batch_size": 4, "max_num_tokens": 64, "max_seq_len": 96, "print_iter_log": True,
           "enable_iter_perf_stats": True, "kv_cache_config": {"tokens_per_block": 32, "dtype": "auto"}}


@pytest.fixture(scope="module")
def agg(launcher):
    return launcher.worker("agg", launcher.options("agg.yaml", OPTIONS))


def post(url, path, body, **kw):
    return requests.post(url + path, json=body, timeout=30, **kw)


def sse_docs(resp):
    lines = [ln for ln in resp.text.split("\n\n") if ln]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(ln[len("data: "):]) for ln in lines[:-1]]


def test_completions_are_deterministic_with_usage(agg):
    body = {"model": "tk/standin-tiny", "prompt": "the quick brown fox", "max_tokens": 7}
    a, b = post(agg.url, "/v1/completions", body).json(), post(agg.url, "/v1/completions", body).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert len(a["choices"][0]["text"].split()) == 7 and a["choices"][0]["finish_reason"] == "length"
    # the second time the prompt's KV is reused from the block cache (all but its last token, which is always
    # computed), and usage says so as TensorRT-LLM's does
    assert a["usage"] == {"prompt_tokens": 4, "completion_tokens": 7, "total_tokens": 11,
                          "prompt_tokens_details": {"cached_tokens": 0}}
    assert b["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}
    other = post(agg.url, "/v1/completions", {**body, "prompt": "the quick brown cat"}).json()
    assert other["choices"][0]["text"] != a["choices"][0]["text"]


def test_token_id_prompt_equals_text_prompt(agg):
    from toolkit.standin.model import encode
    text = post(agg.url, "/v1/completions", {"model": "m", "prompt": "a b c", "max_tokens": 5}).json()
    ids = post(agg.url, "/v1/completions", {"model": "m", "prompt": encode("a b c"), "max_tokens": 5}).json()
    assert text["choices"][0]["text"] == ids["choices"][0]["text"]


@pytest.mark.parametrize("chat", [False, True])
def test_streaming_equals_non_streaming(agg, chat):
    prompt = "stream me some pseudo words please"
    plain = complete(agg.url, "tk/standin-tiny", prompt, max_tokens=9, chat=chat)
    streamed = complete(agg.url, "tk/standin-tiny", prompt, max_tokens=9, chat=chat, stream=True)
    assert plain == streamed and len(plain.split()) == 9


def test_stream_usage_chunk_when_asked(agg):
    resp = post(agg.url, "/v1/completions", {"model": "m", "prompt": "x y", "max_tokens": 3, "stream": True,
                                            "stream_options": {"include_usage": True}})
    docs = sse_docs(resp)
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert docs[-1]["choices"] == [] and docs[-1]["usage"]["completion_tokens"] == 3
    assert [d["choices"][0]["finish_reason"] for d in docs[:-1]] == [None, None, "length"]
    bad = post(agg.url, "/v1/completions", {"model": "m", "prompt": "x", "stream_options": {"include_usage": True}})
    assert bad.status_code == 400 and "Stream options can only be defined when stream is true" in bad.text


def test_chat_uses_the_fixed_template(agg):
    r = post(agg.url, "/v1/chat/completions", {"model": "m", "max_tokens": 4,
                                               "messages": [{"role": "user", "content": "hi there"}]}).json()
    assert r["object"] == "chat.completion" and r["choices"][0]["message"]["role"] == "assistant"
    assert r["usage"]["prompt_tokens"] == 4  # "<|user|> hi there <|assistant|>"


def test_msgpack_request_and_response(agg):
    body = {"model": "m", "prompt": "pack me", "max_tokens": 5}
    as_json = post(agg.url, "/v1/completions", body).json()
    resp = requests.post(agg.url + "/v1/completions", data=msgpack.packb(body), timeout=30,
                         headers={"Content-Type": "application/json", "X-TRTLLM-Msgpack": "1",
                                  "Accept": "application/msgpack"})
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("application/msgpack")
    doc = msgpack.unpackb(resp.content)
    assert doc["choices"][0]["text"] == as_json["choices"][0]["text"]
    garbage = requests.post(agg.url + "/v1/completions", data=b"\xc1\xc1", headers={"X-TRTLLM-Msgpack": "1"})
    assert garbage.status_code == 400 and "msgpack" in garbage.json()["message"]


def test_limits_like_trtllm(agg):
    long = " ".join(["w"] * 65)
    r = post(agg.url, "/v1/completions", {"model": "m", "prompt": long, "max_tokens": 1})
    assert r.status_code == 400
    assert r.json()["message"] == "The sum of prompt length (65.0), query length (0) should not exceed max_num_tokens (64)"
    assert r.json()["object"] == "error" and r.json()["code"] == 400
    r = post(agg.url, "/v1/completions", {"model": "m", "prompt": " ".join(["w"] * 60), "max_tokens": 100}).json()
    assert r["usage"]["completion_tokens"] == 36  # clamped to max_seq_len - prompt
    r = post(agg.url, "/v1/completions", {"model": "m", "prompt": "w", "max_tokens": 0})
    assert r.status_code == 400


def test_disaggregated_requests_are_refused_without_a_transceiver(agg):
    r = post(agg.url, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 1,
                                          "disaggregated_params": {"request_type": "context_only"}})
    assert r.status_code == 400 and "cache transceiver is disabled" in r.json()["message"]


def test_models_metrics_health(agg):
    assert requests.get(agg.url + "/health").status_code == 200
    models = requests.get(agg.url + "/v1/models").json()
    assert models["data"][0]["id"] == "tk/standin-tiny"
    assert models["data"][0]["owned_by"] == "tk CPU stand-in, not TensorRT-LLM"
    requests.get(agg.url + "/metrics")  # drain
    post(agg.url, "/v1/completions", {"model": "m", "prompt": "count me", "max_tokens": 2})
    stats = requests.get(agg.url + "/metrics").json()
    assert len(stats) == 1 and stats[0]["inflightBatchingStats"]["numCtxTokens"] == 2
    assert {"maxNumBlocks", "freeNumBlocks", "usedNumBlocks", "tokensPerBlock", "reusedBlocks", "missedBlocks",
            "cacheHitRate"} <= set(stats[0]["kvCacheStats"])  # TensorRT-LLM's names
    assert requests.get(agg.url + "/metrics").json() == []  # iterations since the last call
    assert "tk CPU stand-in, not TensorRT-LLM" in agg.log() and "num_ctx_tokens" in agg.log()
