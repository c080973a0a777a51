"""Multi-turn conversations through a stand-in deployment: block reuse, KV-cache events and the routers.

Two context servers and one generation server, each reusing KV blocks as TensorRT-LLM does
(toolkit/standin/blockcache.py), behind proxies that differ only in their routers. The client sends chat
conversations whose every turn resends the history (earlier prompts and answers as text), as aiperf does.
"""

from __future__ import annotations

import pytest
import requests

from tests.standin.helpers import MODEL, worker_env

pytestmark = pytest.mark.nixl
pytest.importorskip("numpy")
if not any(__import__("importlib").util.find_spec(m) for m in ("nixl", "nixl_cu12", "nixl_cu13")):
    pytest.skip("NIXL is not installed", allow_module_level=True)

TPB = 32
OSL = 20
KV = {"tokens_per_block": TPB, "dtype": "auto", "enable_block_reuse": True, "event_buffer_max_size": 1024}
CT = {"backend": "NIXL", "max_tokens_in_buffer": 1024, "kv_transfer_timeout_ms": 5000}
CTX = {"max_batch_size": 8, "max_num_tokens": 1024, "max_seq_len": 1100, "kv_cache_config": KV,
       "cache_transceiver_config": CT}
GEN = {**CTX, "max_batch_size": 16}


@pytest.fixture(scope="module")
def workers(launcher):
    ctx_opts = launcher.options("mt_ctx.yaml", CTX)
    quiet = launcher.options("mt_ctx_quiet.yaml", {**CTX, "kv_cache_config": {**KV, "event_buffer_max_size": 0}})
    procs = {"ctx_a": launcher.worker("mt_ctx_a", ctx_opts, wait=False),
             "ctx_b": launcher.worker("mt_ctx_b", ctx_opts, wait=False),
             "quiet_a": launcher.worker("mt_quiet_a", quiet, wait=False),
             "quiet_b": launcher.worker("mt_quiet_b", quiet, wait=False),
             "gen": launcher.worker("mt_gen", launcher.options("mt_gen.yaml", GEN), wait=False),
             "gen_retok": launcher.worker("mt_gen_retok", launcher.options("mt_gen_r.yaml", GEN),
                                          env=worker_env(TK_STANDIN_FAULT="retokenize"), wait=False)}
    for p in procs.values():
        p.wait_healthy()
    return procs


def stats(proc) -> dict:
    return requests.get(proc.url + "/standin/stats", timeout=10).json()


def chat(url: str, messages: list, conversation: str | None = None) -> dict:
    headers = {"X-Correlation-ID": conversation} if conversation else {}
    r = requests.post(url + "/v1/chat/completions", headers=headers, timeout=60, json={
        "model": MODEL, "messages": messages, "max_tokens": OSL, "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()


def converse(url: str, tag: str, turns: int, conversation: str | None = None, user_words: int = 40,
             servers=()) -> list[dict]:
    """One conversation; per turn the server's usage, the answer and (``servers``) the tokens those servers'
    block caches reused for it (their own counters)."""
    messages, out = [], []
    for t in range(turns):
        messages.append({"role": "user", "content": " ".join(f"{tag}t{t}w{i}" for i in range(user_words))})
        before = cached(servers)
        doc = chat(url, messages, conversation)
        answer = doc["choices"][0]["message"]["content"]
        out.append({**doc["usage"], "answer": answer, "reused": cached(servers) - before})
        messages.append({"role": "assistant", "content": answer})
    return out


def cached(servers) -> int:
    return sum(stats(p)["kv_cache"]["cached_tokens"] for p in servers)


def test_kv_cache_aware_router_keeps_each_turn_where_its_history_is(launcher, workers):
    ctx = [workers["ctx_a"], workers["ctx_b"]]
    proxy = launcher.proxy("mt_proxy_kv", ctx, [workers["gen"]],
                           extra={"context_servers": {"router": {"type": "kv_cache_aware", "tokens_per_block": TPB}}})
    for conv in range(3):
        turns = converse(proxy.url, f"kv{conv}", 3, servers=ctx)
        # a first turn shares at most the chat template's first marker with earlier conversations (partial reuse)
        assert turns[0]["reused"] <= 1
        # every later turn reuses the whole previous prompt on the context server that computed it; only the
        # previous answer (generated on the generation server) and the new message are computed again
        assert [t["reused"] for t in turns[1:]] == [turns[0]["prompt_tokens"], turns[1]["prompt_tokens"]]
        for t in (1, 2):
            history = turns[t - 1]["prompt_tokens"] + turns[t - 1]["completion_tokens"]
            assert turns[t]["prompt_tokens"] > history  # the history is resent, then the new message
    router = stats(proxy)["routers"]["context"]
    assert router["events_stored"] > 0 and router["poll_failures"] == 0


def test_round_robin_sends_the_next_turn_to_a_server_without_the_history(launcher, workers):
    ctx = [workers["ctx_a"], workers["ctx_b"]]
    proxy = launcher.proxy("mt_proxy_rr", ctx, [workers["gen"]])
    turns = converse(proxy.url, "rr", 2, servers=ctx)  # turn 1 on one server, turn 2 on the other
    assert turns[1]["reused"] <= 1  # nothing of the history: at most the template's first marker


def test_without_kv_cache_events_the_kv_cache_aware_router_silently_routes_by_load(launcher, workers):
    """TensorRT-LLM #14882: the block table is filled only from /kv_cache_events; a worker with
    event_buffer_max_size 0 (the default) gives it nothing, every match is 0 and nothing says so."""
    quiet = [workers["quiet_a"], workers["quiet_b"]]
    proxy = launcher.proxy("mt_proxy_blind", quiet, [workers["gen"]],
                           extra={"context_servers": {"router": {"type": "kv_cache_aware", "tokens_per_block": TPB}}})
    for p in quiet:
        assert requests.post(p.url + "/kv_cache_events", timeout=5).json() == []
    converse(proxy.url, "blind", 3)
    router = stats(proxy)["routers"]["context"]
    assert router["routed"] == 3 and router["matches_all_zero"] == 3 and router["events_stored"] == 0


def test_conditional_disaggregation_prefills_a_short_delta_on_the_generation_server(launcher, workers):
    gen = workers["gen"]
    proxy = launcher.proxy("mt_proxy_cond", [workers["ctx_a"]], [gen], extra={
        "generation_servers": {"router": {"type": "kv_cache_aware", "tokens_per_block": TPB}},
        "conditional_disagg_config": {"max_local_prefill_length": 64}})
    turns = converse(proxy.url, "cond", 3, user_words=30, servers=[gen])
    s = stats(proxy)
    # turn 1: nothing cached anywhere -> context server; turns 2 and 3: the generation server holds the history
    # (the prompt it received and the answer it generated), 30 new words + markers are left: prefilled there
    assert s["disaggregated"] == 1 and s["local_prefill"] == 2, s["routers"]
    for t in (1, 2):
        # reused: everything but the last answer token (its KV was never computed); the client sees the count
        history = turns[t - 1]["prompt_tokens"] + turns[t - 1]["completion_tokens"]
        assert turns[t]["reused"] == history - 1 == turns[t]["prompt_tokens_details"]["cached_tokens"]


def test_an_answer_that_does_not_retokenize_to_its_ids_is_not_reused(launcher, workers):
    """inference-perf #649: the answer resent as text must encode to the generated ids, or its KV is useless."""
    gen = workers["gen_retok"]
    proxy = launcher.proxy("mt_proxy_retok", [workers["ctx_a"]], [gen], extra={
        "generation_servers": {"router": {"type": "kv_cache_aware", "tokens_per_block": TPB}},
        "conditional_disagg_config": {"max_local_prefill_length": 200}})
    turns = converse(proxy.url, "retok", 2, user_words=30)
    assert stats(proxy)["local_prefill"] == 1
    # the generation server held prompt + answer, but the resent answer's words encode to other ids: only the
    # first turn's prompt is reused
    assert turns[1]["prompt_tokens_details"]["cached_tokens"] == turns[0]["prompt_tokens"]


def test_kv_cache_events_have_tensorrt_llm_shape(workers):
    events = requests.post(workers["ctx_a"].url + "/kv_cache_events", timeout=5).json()
    assert isinstance(events, list)
    # without enable_iter_perf_stats (TensorRT-LLM's default) the executor keeps no iteration stats: /metrics is
    # empty however many requests ran (the stats' shape: tests/standin/test_aggregated.py)
    assert requests.get(workers["ctx_a"].url + "/metrics", timeout=5).json() == []


def _line_13():
    from toolkit.facts import versions
    if "1.3" not in versions.supported():
        pytest.skip("the 1.3 line is not in this tk")


def test_on_1_3_the_client_sees_the_context_servers_cached_tokens(launcher, workers):
    """PR #13620: the proxy hands the context leg's usage to the generation leg (ctx_usage); before it, the client
    saw the generation worker's count, the whole prompt."""
    _line_13()
    ctx = [workers["ctx_a"], workers["ctx_b"]]
    kv = {"context_servers": {"router": {"type": "kv_cache_aware", "tokens_per_block": TPB}}}
    old = launcher.proxy("mt_proxy_12", ctx, [workers["gen"]], extra=kv)
    assert all(t["prompt_tokens_details"]["cached_tokens"] == t["prompt_tokens"]
               for t in converse(old.url, "v12", 2))
    new = launcher.proxy("mt_proxy_13", ctx, [workers["gen"]], extra=kv,
                         env=worker_env(TK_STANDIN_TRTLLM_VERSION="1.3"))
    turns = converse(new.url, "v13", 3, servers=ctx)
    for t in turns:
        assert t["prompt_tokens_details"]["cached_tokens"] == t["reused"]
    assert turns[1]["reused"] == turns[0]["prompt_tokens"]


def test_the_conversation_router_keeps_a_conversation_on_one_context_server(launcher, workers):
    _line_13()
    ctx = [workers["ctx_a"], workers["ctx_b"]]
    proxy = launcher.proxy("mt_proxy_conv", ctx, [workers["gen"]],
                           extra={"context_servers": {"router": {"type": "conversation"}}},
                           env=worker_env(TK_STANDIN_TRTLLM_VERSION="1.3"))
    for conv in range(2):
        turns = converse(proxy.url, f"conv{conv}", 3, conversation=f"session-{conv}", servers=ctx)
        assert [t["reused"] for t in turns[1:]] == [turns[0]["prompt_tokens"], turns[1]["prompt_tokens"]]
    router = stats(proxy)["routers"]["context"]
    assert router["sticky"] == 4 and router["fallback"] == 2
