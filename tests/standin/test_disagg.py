"""A disaggregated stand-in deployment with real NIXL KV transfers: context + generation servers and the proxy.

Every answer must equal the aggregated baseline (toolkit.standin.baseline, the generation role's options without
cache_transceiver_config); corrupted KV, a mismatched peer, a dead or frozen context server and KV nobody fetched
must all fail or show, never hang.
"""

from __future__ import annotations

import base64
import signal
import time

import msgpack
import pytest
import requests

from tests.standin.helpers import MODEL, worker_env
from toolkit.client import CompletionError, complete
from toolkit.standin.baseline import AggregatedServer

pytestmark = pytest.mark.nixl
pytest.importorskip("numpy")
if not any(__import__("importlib").util.find_spec(m) for m in ("nixl", "nixl_cu12", "nixl_cu13")):
    pytest.skip("NIXL is not installed", allow_module_level=True)

TIMEOUT_MS = 3000
BUFFER = 128
CTX = {"max_batch_size": 8, "max_num_tokens": 256, "max_seq_len": 320, "disable_overlap_scheduler": True,
       "print_iter_log": True, "kv_cache_config": {"tokens_per_block": 32, "dtype": "auto", "enable_block_reuse": False},
       "cache_transceiver_config": {"backend": "NIXL", "max_tokens_in_buffer": BUFFER,
                                    "kv_transfer_timeout_ms": TIMEOUT_MS}}
# the generation servers publish their blocks (/kv_cache_events), as tk renders them for a kv_cache_aware router
GEN = {**CTX, "max_batch_size": 16, "max_num_tokens": 128, "disable_overlap_scheduler": False,
       "kv_cache_config": {**CTX["kv_cache_config"], "enable_block_reuse": True, "event_buffer_max_size": 1024}}
GEN16 = {**GEN, "kv_cache_config": {**GEN["kv_cache_config"], "tokens_per_block": 16},
         "cache_transceiver_config": {**GEN["cache_transceiver_config"], "max_tokens_in_buffer": 128}}
LENGTHS = [1, 2, 31, 32, 33, 64, 100, 128]
# UCX on the C++ transceiver: a request larger than the pre-allocated buffer moves through buffers allocated for it
CTX_UCX = {**CTX, "cache_transceiver_config": {**CTX["cache_transceiver_config"], "backend": "UCX"}}
GEN_UCX = {**GEN, "cache_transceiver_config": {**GEN["cache_transceiver_config"], "backend": "UCX"}}
# gen_ucx's pool: its 24 slots of 128 tokens (6.0 MiB) and 0.4 MiB for buffers of one request: one of 160 tokens
# (81 pages of 4 KiB), not one of 256 (129 pages)
GEN_UCX_POOL_MB = "6.4"


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


@pytest.fixture(scope="module")
def dep(launcher):
    """ctx, gen, a corrupting gen, a tokens_per_block=16 gen, a UCX ctx and gen, a proxy (msgpack to workers) and
    the baseline."""
    ctx_opts, gen_opts = launcher.options("ctx.yaml", CTX), launcher.options("gen.yaml", GEN)
    procs = {
        "ctx": launcher.worker("ctx", ctx_opts, wait=False),
        "gen": launcher.worker("gen", gen_opts, wait=False),
        "gen_corrupt": launcher.worker("gen_corrupt", gen_opts, env=worker_env(TK_STANDIN_FAULT="corrupt_kv"),
                                       wait=False),
        "gen16": launcher.worker("gen16", launcher.options("gen16.yaml", GEN16), wait=False),
        "ctx_ucx": launcher.worker("ctx_ucx", launcher.options("ctx_ucx.yaml", CTX_UCX), wait=False),
        "gen_ucx": launcher.worker("gen_ucx", launcher.options("gen_ucx.yaml", GEN_UCX),
                                   env=worker_env(TK_STANDIN_POOL_MB=GEN_UCX_POOL_MB), wait=False),
    }
    baseline = AggregatedServer.like(gen_opts, launcher.dir / "baseline", model=MODEL)
    try:
        for p in procs.values():
            p.wait_healthy()
        procs["proxy"] = launcher.proxy("proxy", [procs["ctx"]], [procs["gen"]],
                                        env=worker_env(TRTLLM_SERVE_ENABLE_MSGSPEC=1))
        procs["baseline"] = baseline
        yield procs
    finally:
        baseline.close()


def wait_for(predicate, what: str, timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def stats(proc) -> dict:
    return requests.get(proc.url + "/standin/stats", timeout=10).json()


def context_leg(ctx, prompt: str) -> dict:
    r = requests.post(ctx.url + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": prompt, "max_tokens": 1, "stream": False,
        "disaggregated_params": {"request_type": "context_only", "disagg_request_id": (1 << 40) + 7,
                                 "schedule_style": 0}})
    assert r.status_code == 200, r.text
    return r.json()


def generation_leg(gen, ctx_resp: dict, max_tokens: int = 12) -> tuple[int, dict, float]:
    params = {**ctx_resp["choices"][0]["disaggregated_params"], "request_type": "generation_only"}
    t0 = time.monotonic()
    r = requests.post(gen.url + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": ctx_resp["prompt_token_ids"], "max_tokens": max_tokens,
        "disaggregated_params": params})
    return r.status_code, r.json(), time.monotonic() - t0


def test_context_response_carries_trtllm_fields(dep):
    resp = context_leg(dep["ctx"], words(40))
    params = resp["choices"][0]["disaggregated_params"]
    assert params["request_type"] == "context_only" and params["disagg_request_id"] == (1 << 40) + 7
    assert isinstance(params["ctx_request_id"], int) and len(params["first_gen_tokens"]) == 1
    assert isinstance(params["encoded_opaque_state"], str) and params["schedule_style"] == 0
    assert "draft_tokens" in params
    assert len(resp["prompt_token_ids"]) == 40 and resp["choices"][0]["finish_reason"] == "length"
    status, _doc, _ = generation_leg(dep["gen"], resp)  # fetch it, so the slot is freed
    assert status == 200


def test_disaggregated_answers_equal_the_aggregated_baseline(dep):
    proxy, base = dep["proxy"], dep["baseline"]
    before_ctx, before_gen = stats(dep["ctx"]), stats(dep["gen"])
    for n in LENGTHS:
        prompt = words(n, f"p{n}x")
        expected = complete(base.url, MODEL, prompt, max_tokens=12)
        assert complete(proxy.url, MODEL, prompt, max_tokens=12) == expected, n
        assert complete(proxy.url, MODEL, prompt, max_tokens=12, stream=True) == expected, n
    for n in (1, 20, 100):
        prompt = words(n, "chat")
        expected = complete(base.url, MODEL, prompt, max_tokens=6, chat=True)
        assert complete(proxy.url, MODEL, prompt, max_tokens=6, chat=True) == expected
        assert complete(proxy.url, MODEL, prompt, max_tokens=6, chat=True, stream=True) == expected
    after_ctx, after_gen = stats(dep["ctx"]), stats(dep["gen"])
    legs = 2 * len(LENGTHS) + 6
    assert after_ctx["requests"]["context_only"] - before_ctx["requests"]["context_only"] == legs
    assert after_gen["requests"]["generation_only"] - before_gen["requests"]["generation_only"] == legs
    assert after_gen["requests"]["context_and_generation"] == before_gen["requests"]["context_and_generation"]
    assert after_gen["kv"]["kv_transfers"] - before_gen["kv"]["kv_transfers"] == legs
    assert after_gen["kv"]["kv_bytes_received"] > before_gen["kv"]["kv_bytes_received"]
    # the context server's NIXL agent is added once, not per request
    assert after_gen["kv"]["kv_remote_agents_added"] - before_gen["kv"]["kv_remote_agents_added"] <= 1
    freed = before_ctx["kv"]["kv_slots_freed_by_notification"] + legs  # every READ's notification freed its slot
    wait_for(lambda: stats(dep["ctx"])["kv"]["kv_slots_freed_by_notification"] >= freed, "the notifications")


def test_prompt_longer_than_max_tokens_in_buffer_fails_as_tensorrt_llm_s_agent_check(dep):
    """NIXL on the C++ transceiver (the 1.2 line's): no dynamic-buffer fallback, the request fails with TensorRT-LLM's
    TLLM_CHECK "Agent need all buffer pre-allocated" (cacheFormatter.cpp), which the client sees as an error."""
    prompt = words(BUFFER + 10)
    assert complete(dep["baseline"].url, MODEL, prompt, max_tokens=4)  # the baseline takes it
    with pytest.raises(CompletionError) as exc:
        complete(dep["proxy"].url, MODEL, prompt, max_tokens=4)
    msg = str(exc.value)
    assert "HTTP 500" in msg and "Agent need all buffer pre-allocated" in msg
    assert "max_tokens_in_buffer is 128" in msg and dep["ctx"].endpoint in msg


def test_prompt_longer_than_max_tokens_in_buffer_is_served_where_tensorrt_llm_allocates_a_buffer_for_it(dep):
    """UCX on the C++ transceiver falls back to buffers allocated for the request (cacheTransBuffer.cpp,
    getOrAllocateBuffers), the Python transceiver has no such limit: the stand-in moves the KV through a buffer
    registered with NIXL for that request on each side, and frees it when the READ's notification comes."""
    ctx, gen = dep["ctx_ucx"], dep["gen_ucx"]
    before = stats(ctx)["kv"]
    prompt = words(BUFFER + 10, "long")
    expected = requests.post(dep["baseline"].url + "/v1/completions", timeout=30,
                             json={"model": MODEL, "prompt": prompt, "max_tokens": 12}).json()["choices"][0]["text"]
    status, doc, _ = generation_leg(gen, context_leg(ctx, prompt))
    assert status == 200 and doc["choices"][0]["text"] == expected, doc  # the digest of every byte READ
    after = stats(ctx)["kv"]
    assert after["kv_request_buffers_sent"] == before["kv_request_buffers_sent"] + 1
    assert after["kv_sent_slots"] == before["kv_sent_slots"]
    assert stats(gen)["kv"]["kv_request_buffers_received"] >= 1
    wait_for(lambda: stats(ctx)["kv"]["kv_request_buffer_bytes_held"] == 0, "the buffer freed on the notification")
    assert stats(gen)["kv"]["kv_request_buffer_bytes_held"] == 0
    # bounded: a buffer larger than what the generation server's per-request buffers may ever hold is an allocation
    # that cannot succeed (500, not 503's "try again"), saying which bound
    status, doc, _ = generation_leg(gen, context_leg(ctx, words(250, "huge")))
    assert status == 500 and f"TK_STANDIN_POOL_MB={GEN_UCX_POOL_MB}" in doc["message"], doc
    assert gen.endpoint in doc["message"]
    # the state of a buffer of its own must carry that registration's NIXL metadata, bounded, and only then
    resp = context_leg(ctx, words(BUFFER + 10, "nosection"))
    params = resp["choices"][0]["disaggregated_params"]
    state = msgpack.unpackb(base64.b64decode(params["encoded_opaque_state"]))
    del state["section_metadata"]
    params["encoded_opaque_state"] = base64.b64encode(msgpack.packb(state, use_bin_type=True)).decode()
    status, doc, _ = generation_leg(gen, resp)
    assert status == 400 and "section_metadata" in doc["message"], doc


def test_worker_errors_reach_the_client_with_status_and_message(dep):
    # TensorRT-LLM's disaggregated server answers a worker's refusal as {"detail": the worker's message}; the
    # stand-in proxy applies the context servers' limits itself, before the context leg
    r = requests.post(dep["proxy"].url + "/v1/completions", json={"model": MODEL, "prompt": words(300)}, timeout=30)
    assert r.status_code == 400 and "should not exceed max_num_tokens (256)" in r.json()["detail"]


def test_corrupted_kv_changes_the_answer(dep):
    prompt = words(50, "c")
    expected = requests.post(dep["baseline"].url + "/v1/completions", timeout=30,
                             json={"model": MODEL, "prompt": prompt, "max_tokens": 12}).json()["choices"][0]["text"]
    status, good, _ = generation_leg(dep["gen"], context_leg(dep["ctx"], prompt))
    assert status == 200 and good["choices"][0]["text"] == expected
    status, bad, _ = generation_leg(dep["gen_corrupt"], context_leg(dep["ctx"], prompt))
    assert status == 200
    got = bad["choices"][0]["text"].split()
    assert got[0] == expected.split()[0]  # the first token comes from the context server
    assert got[1:] != expected.split()[1:]


def test_tokens_per_block_mismatch_is_refused(dep):
    status, doc, _ = generation_leg(dep["gen16"], context_leg(dep["ctx"], words(40)))
    assert status == 400
    msg = doc["message"]
    assert "tokens_per_block" in msg and "context 32, generation 16" in msg and dep["ctx"].endpoint in msg


def test_kv_nobody_fetched_is_freed_after_the_timeout(dep):
    before = stats(dep["ctx"])["kv"]["kv_slots_expired"]
    resp = context_leg(dep["ctx"], words(20, "late"))
    long_resp = context_leg(dep["ctx_ucx"], words(BUFFER + 40, "late"))  # in a buffer of its own
    time.sleep(TIMEOUT_MS / 1000 + 0.3)
    assert stats(dep["ctx"])["kv"]["kv_slots_expired"] >= before + 1  # (earlier tests' unfetched KV expires too)
    status, doc, _ = generation_leg(dep["gen"], resp)
    assert status == 500 and "freed the slot" in doc["message"] and dep["ctx"].endpoint in doc["message"]
    # a buffer of its own is freed the same way; a READ that comes later finds no KV, and the context server serves on
    wait_for(lambda: stats(dep["ctx_ucx"])["kv"]["kv_request_buffer_bytes_held"] == 0, "the buffer freed")
    status, doc, _ = generation_leg(dep["gen_ucx"], long_resp)
    assert status == 500 and "freed the slot" in doc["message"] and dep["ctx_ucx"].endpoint in doc["message"]
    assert generation_leg(dep["gen_ucx"], context_leg(dep["ctx_ucx"], words(BUFFER + 40, "again")))[0] == 200


def test_frozen_or_killed_context_server_fails_the_generation_request_in_time(launcher, dep):
    victim = launcher.worker("ctx_victim", launcher.options("ctx_victim.yaml", CTX))
    gen = dep["gen"]
    # frozen after the context leg: the READ never completes; bounded by kv_transfer_timeout_ms
    resp = context_leg(victim, words(30, "f"))
    victim.signal(signal.SIGSTOP)
    try:
        status, doc, took = generation_leg(gen, resp)
    finally:
        victim.signal(signal.SIGCONT)
    assert status == 500 and victim.endpoint in doc["message"] and "kv_transfer_timeout_ms=3000" in doc["message"]
    assert TIMEOUT_MS / 1000 - 0.2 < took < TIMEOUT_MS / 1000 + 1.5
    # killed after the context leg: fails, naming the context server, well within the timeout
    resp = context_leg(victim, words(30, "k"))
    victim.signal(signal.SIGKILL)
    victim.popen.wait(timeout=10)
    status, doc, took = generation_leg(gen, resp)
    assert status == 500 and victim.endpoint in doc["message"], doc
    assert took < TIMEOUT_MS / 1000 + 1.0
    # and the generation server still serves
    assert complete(dep["proxy"].url, MODEL, "still alive", max_tokens=3)


def test_proxy_health_models_and_stats(dep):
    proxy = dep["proxy"]
    assert requests.get(proxy.url + "/health", timeout=10).status_code == 200
    assert requests.get(proxy.url + "/v1/models", timeout=10).json()["data"][0]["owned_by"] == \
        "tk CPU stand-in, not TensorRT-LLM"
    s = stats(proxy)
    assert s["disaggregated"] > 0 and s["local_prefill"] == 0
    assert "tk CPU stand-in, not TensorRT-LLM" in proxy.log()


def test_conditional_disaggregation_sends_a_short_remainder_straight_to_generation(launcher, dep):
    proxy = launcher.proxy("proxy_cond", [dep["ctx"]], [dep["gen"]], extra={
        "generation_servers": {"router": {"type": "kv_cache_aware", "tokens_per_block": 32}},
        "conditional_disagg_config": {"max_local_prefill_length": 16}})
    base, ctx, gen = dep["baseline"], dep["ctx"], dep["gen"]
    first = words(64, "cond")
    assert complete(proxy.url, MODEL, first, max_tokens=5) == complete(base.url, MODEL, first, max_tokens=5)
    s = stats(proxy)
    assert s["disaggregated"] == 1 and s["local_prefill"] == 0  # nothing cached yet: via the context server
    ctx_before, gen_before = stats(ctx)["requests"], stats(gen)["requests"]
    longer = first + " " + words(8, "more")  # 64 tokens known to the generation server, 8 left to prefill
    assert complete(proxy.url, MODEL, longer, max_tokens=5) == complete(base.url, MODEL, longer, max_tokens=5)
    s = stats(proxy)
    assert s["local_prefill"] == 1 and s["disaggregated"] == 1
    assert stats(ctx)["requests"]["context_only"] == ctx_before["context_only"]
    assert stats(gen)["requests"]["context_and_generation"] == gen_before["context_and_generation"] + 1
    other = words(72, "fresh")  # no cached prefix: disaggregated again
    assert complete(proxy.url, MODEL, other, max_tokens=5) == complete(base.url, MODEL, other, max_tokens=5)
    assert stats(proxy)["disaggregated"] == 2


def test_request_timeout_bounds_each_leg(launcher, dep):
    slow = launcher.worker("gen_slow", launcher.options("gen_slow.yaml", GEN),
                           env=worker_env(TK_STANDIN_DECODE_MS=200))
    proxy = launcher.proxy("proxy_r1", [dep["ctx"]], [slow], flags=("-t", "60", "-r", "1"))
    t0 = time.monotonic()
    r = requests.post(proxy.url + "/v1/completions", json={"model": MODEL, "prompt": "slow", "max_tokens": 20},
                      timeout=30)
    assert r.status_code == 504 and slow.endpoint in r.json()["detail"] and "-r 1s" in r.json()["detail"]
    assert time.monotonic() - t0 < 3
    # the proxy's health is its own, as TensorRT-LLM's static-url proxy (is_ready() is True once started): a
    # dead worker does not make a load balancer drop the whole endpoint
    slow.signal(signal.SIGKILL)
    slow.popen.wait(timeout=10)
    time.sleep(1.5)
    assert requests.get(proxy.url + "/health", timeout=10).status_code == 200
