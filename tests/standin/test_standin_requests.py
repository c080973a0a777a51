"""Request fidelity of the CPU stand-in: validation before any leg, sampling controls, error shapes, refusal logs,
and the context KV released when a generation leg fails. Real `tk-standin-serve` processes on loopback; the
official `openai` client against the proxy and against one aggregated server."""

from __future__ import annotations

import concurrent.futures
import json
import math
import time

import pytest
import requests
import yaml

from tests.standin.helpers import MODEL, Proc, free_port
from toolkit.standin import model as M
from toolkit.standin import protocol as P

openai = pytest.importorskip("openai")
if not any(__import__("importlib").util.find_spec(m) for m in ("nixl", "nixl_cu12", "nixl_cu13")):
    pytest.skip("needs NIXL for the disaggregated deployment", allow_module_level=True)

LIMITS = {"max_num_tokens": 256, "max_seq_len": 320, "max_batch_size": 16}


def _options(tmp, name, tpb=32, transceiver=True):
    doc = {**LIMITS, "kv_cache_config": {"tokens_per_block": tpb}}
    if transceiver:
        doc["cache_transceiver_config"] = {"backend": "UCX", "max_tokens_in_buffer": 256,
                                           "kv_transfer_timeout_ms": 10000}
    path = tmp / name
    path.write_text(yaml.safe_dump(doc))
    return path


def _worker(tmp, name, options):
    port = free_port()
    return Proc(name, [MODEL, "--host", "127.0.0.1", "--port", str(port), "--backend", "pytorch", "--tp_size", "1",
                       "--pp_size", "1", "--extra_llm_api_options", str(options)], tmp, port=port)


def _proxy(tmp, name, ctx, gen):
    port = free_port()
    cfg = {"hostname": "127.0.0.1", "port": port, "backend": "pytorch", "max_retries": 0,
           "context_servers": {"num_instances": len(ctx), "urls": [p.endpoint for p in ctx]},
           "generation_servers": {"num_instances": len(gen), "urls": [p.endpoint for p in gen]}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return Proc(name, ["disaggregated", "-c", str(path), "-t", "60", "-r", "30"], tmp, port=port)


@pytest.fixture(scope="module")
def dep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("standin-requests")
    procs = {"ctx": _worker(tmp, "ctx", _options(tmp, "ctx.yaml")),
             "gen": _worker(tmp, "gen", _options(tmp, "gen.yaml")),
             # a generation server whose tokens_per_block differs: it refuses every generation leg (400)
             "badgen": _worker(tmp, "badgen", _options(tmp, "badgen.yaml", tpb=64)),
             "agg": _worker(tmp, "agg", _options(tmp, "agg.yaml", transceiver=False))}
    try:
        for p in procs.values():
            p.wait_healthy()
        procs["proxy"] = _proxy(tmp, "proxy", [procs["ctx"]], [procs["gen"]]).wait_healthy()
        procs["badproxy"] = _proxy(tmp, "badproxy", [procs["ctx"]], [procs["badgen"]]).wait_healthy()
        yield procs
    finally:
        for p in procs.values():
            p.stop()


def client(proc):
    return openai.OpenAI(base_url=proc.url + "/v1", api_key="x", max_retries=0, timeout=30)


def words(n, seed="w"):
    return " ".join(f"{seed}{i}" for i in range(n))


def _call(proc, kind, **kw):
    c = client(proc)
    if kind == "completion":
        return c.completions.create(model=MODEL, **kw)
    return c.chat.completions.create(model=MODEL, **kw)


def _stream_text(stream, kind):
    parts, finish = [], None
    for ev in stream:
        for ch in ev.choices:
            parts.append(ch.text if kind == "completion" else (ch.delta.content or ""))
            finish = ch.finish_reason or finish
    return "".join(parts), finish


MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me a story"}]

# what a client audit found breaks or differs: each case through the proxy and an aggregated server
REFUSED = [  # (kind, kwargs, status on the proxy, status on the aggregated server, text in the error)
    ("completion", {"prompt": "a b", "max_tokens": 0}, 400, 400, "max_tokens must be a positive integer"),
    ("completion", {"prompt": "a b", "max_tokens": -1}, 400, 400, "max_tokens must be a positive integer"),
    ("chat", {"messages": MSGS, "max_completion_tokens": 0}, 400, 400, "max_tokens must be a positive integer"),
    ("completion", {"prompt": "a b", "temperature": -1}, 400, 400, "temperature must be >= 0"),
    ("completion", {"prompt": "a b", "extra_body": {"bogus_field": 1}}, 400, 400, "Extra inputs are not permitted"),
    ("chat", {"messages": MSGS, "extra_body": {"bogus_field": 1}}, 400, 400, "Extra inputs are not permitted"),
    ("completion", {"prompt": words(300)}, 400, 400, "should not exceed max_num_tokens (256)"),
    ("completion", {"prompt": "a b", "n": 2, "best_of": 1}, 400, 400, "best_of (1) cannot be less than n (2)"),
    ("chat", {"messages": MSGS, "top_logprobs": 2}, 400, 400, "logprobs must be true when using top_logprobs"),
    ("completion", {"prompt": "a b", "suffix": "z"}, 400, 400, "suffix is not supported"),
]


@pytest.mark.parametrize("kind,kw,proxy_status,agg_status,text", REFUSED)
def test_refused_alike_by_the_proxy_and_an_aggregated_server_and_never_after_the_context_leg(
        dep, kind, kw, proxy_status, agg_status, text):
    before = requests.get(dep["ctx"].url + "/standin/stats", timeout=5).json()["requests"]["context_only"]
    for target, status in (("proxy", proxy_status), ("agg", agg_status)):
        with pytest.raises(openai.APIStatusError) as exc:
            _call(dep[target], kind, **kw)
        assert exc.value.status_code == status, (target, exc.value.body)
        # openai-python puts only ErrorResponse's "message" into str(e); TensorRT-LLM's proxy bodies ({"detail"},
        # {"error"}) reach the client in e.body
        assert text in str(exc.value) + json.dumps(exc.value.body), (target, exc.value.body)
    assert requests.get(dep["ctx"].url + "/standin/stats", timeout=5).json()["requests"]["context_only"] == before


def test_error_bodies_are_shaped_as_tensorrt_llms(dep):
    post = lambda proc, body: requests.post(proc.url + "/v1/completions", json=body, timeout=10)  # noqa: E731
    # worker: ErrorResponse
    r = post(dep["agg"], {"model": MODEL, "prompt": "a", "bogus": 1})
    assert r.status_code == 400 and r.json()["object"] == "error" and r.json()["type"] == "BadRequestError"
    # proxy, request validation: {"error": str(exc)} with 400
    r = post(dep["proxy"], {"model": MODEL, "prompt": "a", "bogus": 1})
    assert r.status_code == 400 and set(r.json()) == {"error"} and "bogus" in r.json()["error"]
    # proxy, what a worker would refuse: {"detail": the worker's message}, the worker's status
    r = post(dep["proxy"], {"model": MODEL, "prompt": "a", "max_tokens": 0})
    assert r.status_code == 400 and set(r.json()) == {"detail"} and "max_tokens" in r.json()["detail"]
    # proxy, a list of prompts: TensorRT-LLM's own 500 (a ValueError in its service)
    r = post(dep["proxy"], {"model": MODEL, "prompt": ["a b", "c d"]})
    assert r.status_code == 500 and "only supports single string prompt" in r.json()["detail"]
    # proxy, n > 1: TensorRT-LLM's disaggregated service refuses more than one context choice
    r = post(dep["proxy"], {"model": MODEL, "prompt": "a b", "n": 2})
    assert r.status_code == 500 and "returned 2 choices, expecting 1" in r.json()["detail"]
    # a generation leg that fails: the worker's message, not its URL
    r = post(dep["badproxy"], {"model": MODEL, "prompt": "a b c", "max_tokens": 4})
    assert r.status_code == 400 and set(r.json()) == {"detail"} and "tokens_per_block" in r.json()["detail"]
    # unknown routes, models/{id}, wrong method: FastAPI's JSON, on workers and proxy
    for proc in (dep["agg"], dep["proxy"]):
        for path in ("/v1/embeddings", f"/v1/models/{MODEL}"):
            r = requests.get(proc.url + path, timeout=5)
            assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})
        r = requests.get(proc.url + "/v1/completions", timeout=5)
        assert (r.status_code, r.json()) == (405, {"detail": "Method Not Allowed"})


def test_refused_requests_leave_one_bounded_log_line(dep):
    marker = "zq" * 400  # a long field name: the logged reason is cut
    for proc, path in ((dep["agg"], "/v1/completions"), (dep["proxy"], "/v1/chat/completions")):
        body = {"prompt": "a"} if path == "/v1/completions" else {"messages": MSGS}
        r = requests.post(proc.url + path, json={"model": MODEL, **body, marker: 1}, timeout=10)
        assert r.status_code == 400
        deadline = time.monotonic() + 5
        while True:
            lines = [ln for ln in proc.log().splitlines() if "[refused] POST " + path + " 400" in ln and "zqzq" in ln]
            if lines or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(lines) == 1, proc.log()[-2000:]
        assert len(lines[0]) < P.RefusalLog.MAX_REASON + 200 and lines[0].rstrip().endswith("...")


def test_refusal_log_is_rate_bounded():
    class Sink:
        lines = []

        def warning(self, fmt, *args):
            self.lines.append(fmt % args)
    sink = Sink()
    rl = P.RefusalLog(sink)
    for _ in range(200):
        rl.note("POST", "/v1/completions", 400, "bad\nthing")
    assert len(sink.lines) <= 2 * P.RefusalLog.PER_SECOND and "\\x0a" in sink.lines[0]
    time.sleep(1.05)
    rl.note("POST", "/v1/completions", 400, "again")
    assert "more refused, not logged" in sink.lines[-1]


def test_a_failed_generation_leg_releases_the_context_kv_at_once(dep):
    def bad(i):
        return requests.post(dep["badproxy"].url + "/v1/completions", timeout=30,
                             json={"model": MODEL, "prompt": words(40, f"k{i}-"), "max_tokens": 4}).status_code
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert set(pool.map(bad, range(16))) == {400}
    kv = requests.get(dep["ctx"].url + "/standin/stats", timeout=5).json()["kv"]
    assert kv["pending"] == 0 and kv["kv_slots_released"] >= 16 and kv["kv_slots_expired"] == 0
    t0 = time.monotonic()
    r = requests.post(dep["proxy"].url + "/v1/completions", timeout=30,
                      json={"model": MODEL, "prompt": words(40, "good"), "max_tokens": 4})
    assert r.status_code == 200 and time.monotonic() - t0 < 2.0  # not kv_transfer_timeout_ms (10 s)


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("stream", [False, True])
def test_stop_cuts_the_text_and_finishes_with_stop_through_the_proxy_as_aggregated(dep, kind, stream):
    base = {"prompt": "once upon a time"} if kind == "completion" else {"messages": MSGS}
    full = _call(dep["agg"], kind, max_tokens=8, **base).choices[0]
    full_text = full.text if kind == "completion" else full.message.content
    stop_word = full_text.split()[3]
    expected = full_text[:full_text.index(stop_word)]
    for target in ("agg", "proxy"):
        if stream:
            text, finish = _stream_text(_call(dep[target], kind, max_tokens=8, stop=[stop_word], stream=True,
                                              **base), kind)
        else:
            ch = _call(dep[target], kind, max_tokens=8, stop=[stop_word], **base).choices[0]
            text, finish = (ch.text if kind == "completion" else ch.message.content), ch.finish_reason
        assert (text, finish) == (expected, "stop"), target
    kept = _call(dep["proxy"], kind, max_tokens=8, stop=stop_word, extra_body={"include_stop_str_in_output": True},
                 **base).choices[0]
    assert (kept.text if kind == "completion" else kept.message.content) == expected + stop_word


def test_completion_logprobs_and_echo_through_the_proxy_as_aggregated(dep):
    ids = M.encode("the quick brown fox")
    # echo of a token-id prompt: the generation server sees token ids either way, so proxy == aggregated
    answers = [_call(dep[t], "completion", prompt=ids, max_tokens=6, logprobs=3, echo=True) for t in ("agg", "proxy")]
    a, p = (x.choices[0] for x in answers)
    assert a.text == p.text and a.text.startswith(M.decode(ids) + " ")
    assert a.logprobs.model_dump() == p.logprobs.model_dump()
    lp = a.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens) == a.text[len(M.decode(ids)):]
    assert lp.text_offset[0] == len(M.decode(ids))
    # echo of a string prompt on an aggregated server: the prompt itself
    echoed = _call(dep["agg"], "completion", prompt="the quick brown fox", max_tokens=6, echo=True).choices[0].text
    assert echoed == "the quick brown fox" + a.text[len(M.decode(ids)):]
    for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        vals = list(top.values())
        assert len(top) == 3 and math.isfinite(val) and val <= 0 and top[tok] == val == max(vals)
        assert vals == sorted(vals, reverse=True) and sum(math.exp(v) for v in vals) < 1
    streamed = [ch.choices[0] for ch in _call(dep["proxy"], "completion", prompt="the quick brown fox",
                                              max_tokens=6, logprobs=3, stream=True)]
    assert [s.logprobs.token_logprobs[0] for s in streamed] == lp.token_logprobs


def test_chat_logprobs_through_the_proxy_as_aggregated(dep):
    got = [_call(dep[t], "chat", messages=MSGS, max_tokens=5, logprobs=True, top_logprobs=2).choices[0]
           for t in ("agg", "proxy")]
    assert got[0].logprobs.model_dump() == got[1].logprobs.model_dump()
    content = got[0].logprobs.content
    assert "".join(c.token for c in content) == got[0].message.content and len(content) == 5
    for c in content:
        assert len(c.top_logprobs) == 2 and c.top_logprobs[0].token == c.token and c.logprob <= 0
        assert c.top_logprobs[0].logprob > c.top_logprobs[1].logprob and c.bytes == list(c.token.encode())
    streamed = [ev.choices[0].logprobs.content[0].logprob for ev in
                _call(dep["proxy"], "chat", messages=MSGS, max_tokens=5, logprobs=True, stream=True)
                if ev.choices and ev.choices[0].logprobs]
    assert streamed == [c.logprob for c in content]
    plain = _call(dep["proxy"], "chat", messages=MSGS, max_tokens=5).choices[0]
    assert plain.logprobs is None and plain.message.content == got[0].message.content


def test_n_choices_on_an_aggregated_server(dep):
    out = _call(dep["agg"], "completion", prompt="pick a word", max_tokens=4, n=3)
    assert [c.index for c in out.choices] == [0, 1, 2] and len({c.text for c in out.choices}) == 3
    assert out.usage.completion_tokens == 12
    one = _call(dep["agg"], "completion", prompt="pick a word", max_tokens=4)
    assert out.choices[0].text == one.choices[0].text
    stream = _call(dep["agg"], "chat", messages=MSGS, max_tokens=3, n=2, stream=True)
    assert {ch.index for ev in stream for ch in ev.choices} == {0, 1}


def test_validation_is_one_function_with_tensorrt_llms_fields():
    assert P.parse_request("chat", {"messages": MSGS, "max_tokens": 3}).max_tokens == 3  # validation_alias
    with pytest.raises(P.ValidationError, match="Extra inputs are not permitted"):
        P.parse_request("completion", {"prompt": "a", "messages": MSGS})
    with pytest.raises(P.ValidationError, match="Stream options can only be defined when stream is true"):
        P.parse_request("completion", {"prompt": "a", "stream_options": {"include_usage": True}})
    with pytest.raises(P.RequestError, match="should not exceed max_num_tokens"):
        P.parse_request("completion", {"prompt": words(11)}, [(P.Limits(10, 100), "context_and_generation")])
    P.parse_request("completion", {"prompt": words(11)}, [(P.Limits(10, 100), "generation_only")])
    with pytest.raises(P.RequestError, match="Greedy decoding in the LLM API does not allow multiple returns"):
        P.parse_request("completion", {"prompt": "a", "n": 2, "top_k": 1, "top_p": 0.0})
    assert M.top_logprobs(0, 1, 2, 1) == M.top_logprobs(0, 1, 2, 1)
