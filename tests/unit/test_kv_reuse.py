"""Block reuse as TensorRT-LLM does it, and the routers that depend on it: the stand-in's block cache, the v1 block
hash, KV-cache events and the kv_cache_aware / conversation routers (pure, in-process)."""

from __future__ import annotations

import pytest

from toolkit.facts import kvreuse as F
from toolkit.standin.blockcache import BlockCache
from toolkit.standin.routers import (
    ConversationRouter,
    KvCacheAwareRouter,
    LoadBalancingRouter,
    RoundRobinRouter,
    RouteRequest,
    block_hashes,
    create_router,
)

# --- block keys and hashes -------------------------------------------------------------------------------------

def test_block_keys_leave_out_the_last_token_and_keep_a_partial_last_block():
    assert F.block_keys(list(range(10)), 4) == [(0, 1, 2, 3), (4, 5, 6, 7), (8,)]
    assert F.block_keys(list(range(9)), 4) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert F.block_keys([7], 4) == []


def test_block_hash_is_chained_and_depends_on_length_and_parent():
    a = F.block_key_hash((1, 2, 3), 0)
    assert a == F.block_key_hash([1, 2, 3], 0)  # a pure function of the key and the parent
    assert a != F.block_key_hash((1, 2, 3), 5) and a != F.block_key_hash((1, 2), 0)
    assert 0 <= a < 1 << 64
    h = block_hashes(list(range(10)), 4)
    assert h[1] == F.block_key_hash((4, 5, 6, 7), h[0]) and h[2] == F.block_key_hash((8,), h[1])


def test_reuse_facts_by_line():
    assert not F.reuse_facts("1.2").ctx_usage_passthrough and not F.reuse_facts("1.2").conversation_router
    assert F.reuse_facts("1.3").ctx_usage_passthrough and F.reuse_facts("1.3").block_reuse_config
    assert F.reuse_facts("1.9").line == "1.3"  # a newer line gets the newest row


def test_kv_pool_from_gpu_memory_weights_runtime_and_fraction():
    # Llama-3.1-8B BF16 on an H100 (80 GiB): 16.06 GB of weights, 3.5 GiB of runtime, 0.9 of the rest, 128 KiB/token
    tokens = F.kv_pool_tokens(85899345920, 16.06e9, 3758096384, 131072, 0.9)
    assert tokens == int((85899345920 - 16.06e9 - 3758096384) * 0.9 // 131072)
    assert F.kv_pool_tokens(85899345920, 16.06e9, 0, 131072, 0.9, max_tokens=1000) == 1000
    assert F.kv_pool_tokens(10, 16.06e9, 0, 131072, 0.9) == 0


# --- the block cache ---------------------------------------------------------------------------------------------

def test_a_stored_prompt_is_reused_by_the_next_turn_up_to_its_stored_tokens():
    c = BlockCache(4, 64, event_buffer_max_size=64)
    p1 = list(range(1, 11))
    lease = c.begin(p1)
    assert lease.cached_tokens == 0
    c.store(lease, p1)  # its context phase is over
    c.release(lease, p1 + [101, 102, 103])  # the sequence with its 3 generated tokens
    turn2 = p1 + [101, 102, 103] + [200, 201, 202]
    assert c.match(turn2) == 12  # prompt + generated, but never the last generated token (no KV for it)
    assert c.match(p1 + [999, 998]) == 10  # the whole prompt: 8 in full blocks, 2 by partial reuse of (9, 10, 101)
    assert c.match([5, 6, 7]) == 0


def test_generated_blocks_are_not_reusable_under_kv_cache_manager_v2():
    c = BlockCache(4, 64, store_generated=False)
    p1 = list(range(1, 11))
    lease = c.begin(p1)
    c.store(lease, p1)
    c.release(lease, p1 + [101, 102, 103])
    assert c.match(p1 + [101, 102, 103, 200]) == 9  # the prompt's keys only (its last token is not a key)


def test_partial_reuse_can_be_turned_off_and_reuse_altogether():
    c = BlockCache(4, 64, partial_reuse=False)
    p = list(range(1, 11))
    c.release(c.begin(p), p + [50])
    assert c.match(p + [51, 52]) == 8  # whole blocks only
    off = BlockCache(4, 64, reuse=False, event_buffer_max_size=8)
    off.release(off.begin(p), p + [50])
    assert off.match(p + [51]) == 0 and off.tree_blocks == 0
    assert [e["data"]["type"] for e in off.drain_events()] == ["created"]  # nothing stored, nothing to announce


def test_lru_eviction_takes_unpinned_leaves_first_and_says_so_in_removed_events():
    c = BlockCache(2, 5, event_buffer_max_size=64)
    a, b = [1, 2, 3, 4, 5], [9, 8, 7, 6, 5]
    c.release(c.begin(a), a)  # a keeps two blocks in the tree: (1, 2), (3, 4)
    c.release(c.begin(b), b)  # b two more: one block of the five is free
    assert c.tree_blocks == 4 and c.stats.evicted_blocks == 0
    c.drain_events()
    # reuses b's two blocks and pins them, needs two new ones: a's leaf (3, 4), the least recently used, goes
    pinned = c.begin([9, 8, 7, 6, 1, 2, 3])
    assert pinned.cached_tokens == 4
    events = c.drain_events()
    removed = [e["data"] for e in events if e["data"]["type"] == "removed"]
    assert removed and c.stats.evicted_blocks >= 1
    assert c.match(b) == 4  # b survived: pinned and more recent
    c.release(pinned)


def test_events_are_tensorrt_llm_shaped_and_bounded():
    c = BlockCache(4, 64, event_buffer_max_size=2)
    for i in range(3):
        p = [i * 10 + j for j in range(9)]
        c.release(c.begin(p), p)
    events = c.drain_events()
    assert len(events) == 2 and c.stats.events_dropped >= 2  # 'created' and the first store dropped
    stored = events[-1]["data"]
    assert stored["type"] == "stored" and stored["parent_hash"] is None
    block = stored["blocks"][0]
    assert block["type"] == "stored_block" and isinstance(block["block_hash"], int)
    assert block["tokens"][0] == {"type": "unique_token", "token_id": 20, "token_extra_id": 0}
    assert c.drain_events() == []
    assert BlockCache(4, 64).drain_events() == []  # event_buffer_max_size 0: TensorRT-LLM's default, no events


def test_kv_cache_stats_use_tensorrt_llm_names():
    c = BlockCache(4, 100)
    p = list(range(20))
    c.release(c.begin(p), p)
    c.release(c.begin(p + [1]), p + [1])
    s = c.kv_cache_stats()
    assert s["maxNumBlocks"] == 100 and s["tokensPerBlock"] == 4 and s["reusedBlocks"] >= 4
    assert s["usedNumBlocks"] + s["freeNumBlocks"] == 100 and 0 < s["cacheHitRate"] <= 1



def test_released_blocks_that_stay_reusable_count_as_free_as_tensorrt_llm_reports_them():
    c = BlockCache(4, 10)
    p = list(range(20))  # 5 blocks
    lease = c.begin(p)
    c.store(lease, p)
    assert c.kv_cache_stats()["freeNumBlocks"] == 5  # held by the running request
    c.release(lease, p)
    s = c.kv_cache_stats()
    assert s["freeNumBlocks"] == 10 and s["usedNumBlocks"] == 0  # in the free queue, still reusable
    again = c.begin(p + [7])
    assert again.cached_tokens == 19 and c.kv_cache_stats()["freeNumBlocks"] < 10

# --- routers -----------------------------------------------------------------------------------------------------

def _events_for(prompt, tpb=4):
    c = BlockCache(tpb, 256, event_buffer_max_size=64)
    lease = c.begin(prompt)
    c.store(lease, prompt)
    return c.drain_events()


def test_kv_cache_aware_router_scores_matches_against_load():
    r = KvCacheAwareRouter(["a", "b"], {"tokens_per_block": 4, "max_batch_size": 2})
    prompt = list(range(17))
    r.update_with_events("b", _events_for(prompt))
    server, info = r.get_next_server(prompt + [50, 51, 52, 53])
    assert server == "b" and info["matches"] == [16]  # the 4 full blocks b stored
    # b now has one request in flight: 16/20 - 1/2 = 0.3 still beats a's 0
    assert r.get_next_server(prompt + [60, 61, 62, 63])[0] == "b"
    # a second one: 0.8 - 1.0 < 0: a wins on load
    assert r.get_next_server(prompt + [70, 71, 72, 73])[0] == "a"


def test_kv_cache_aware_router_without_events_routes_by_load_alone_silently():
    """TensorRT-LLM #14882: nothing fills the table, every match is 0; only the stand-in's counter says so."""
    r = KvCacheAwareRouter(["a", "b"], {"tokens_per_block": 4})
    prompt = list(range(40))
    first, info = r.get_next_server(prompt)
    r.finish_request(first, prompt, True, info)
    picks = {r.get_next_server(prompt + [i])[0] for i in range(2)}
    assert picks == {"a", "b"} and r.stats["matches_all_zero"] == 3


def test_track_routed_blocks_fills_the_table_from_the_router_itself():
    import asyncio
    r = KvCacheAwareRouter(["a", "b"], {"tokens_per_block": 4, "track_routed_blocks": True})
    prompt = list(range(17))
    server, info = r.get_next_server(prompt)
    asyncio.run(r.finish(server, info, True, None))
    assert r.get_next_server(prompt + [1, 2, 3, 4])[1]["matches"] == [16]


def test_removed_events_drop_blocks_from_the_table():
    r = KvCacheAwareRouter(["a"], {"tokens_per_block": 4})
    prompt = list(range(9))
    events = _events_for(prompt)
    r.update_with_events("a", events)
    hashes = [b["block_hash"] for e in events if e["data"]["type"] == "stored" for b in e["data"]["blocks"]]
    r.update_with_events("a", [{"event_id": 9, "data": {"type": "removed", "block_hashes": hashes}}])
    assert r.get_next_server(prompt + [1])[1]["matches"] == [0]


def test_round_robin_and_load_balancing_as_tensorrt_llm():
    rr = RoundRobinRouter(["a", "b", "c"])
    assert [rr.get_next_server()[0] for _ in range(4)] == ["a", "b", "c", "a"]
    assert rr.get_next_server(exclude="b")[0] == "c"
    lb = LoadBalancingRouter(["a", "b"], {"use_tokens": True})
    assert lb.get_next_server([1] * 10)[0] == "a"
    assert lb.get_next_server([1] * 2)[0] == "b"
    assert lb.get_next_server([1] * 2)[0] == "b"  # b holds 2 tokens, a 10


def test_conversation_router_sticks_to_a_conversation_id_whatever_the_load():
    r = ConversationRouter(["a", "b"])
    first, _ = r.get_next_server([1, 2, 3], request=RouteRequest(text="user:hello", conversation_id="c1"))
    for i in range(3):
        assert r.get_next_server([1, 2, 3, i], request=RouteRequest(text=f"user:hello {i}",
                                                                     conversation_id="c1"))[0] == first
    other = r.get_next_server([9], request=RouteRequest(text="user:other", conversation_id="c2"))[0]
    assert other != first  # a new conversation goes to the least loaded server
    assert r.stats["sticky"] == 3 and r.stats["fallback"] == 2


def test_conversation_router_matches_an_id_less_request_to_the_session_holding_its_prefix():
    r = ConversationRouter(["a", "b"], {"tokens_per_block": 8})
    history = "user:" + "x" * 200
    s1, _ = r.get_next_server(request=RouteRequest(text=history))
    s2, _ = r.get_next_server(request=RouteRequest(text="user:" + "y" * 200))
    assert s1 != s2
    # the next turn resends the history: >= 75 % of its blocks match s1's session
    assert r.get_next_server(request=RouteRequest(text=history + "\nassistant:ok\nuser:more"))[0] == s1
    # a request sharing too little goes by load
    assert r.stats["implicit"] == 1


def test_create_router_refuses_an_unknown_type():
    assert isinstance(create_router({"type": "conversation"}, ["a"]), ConversationRouter)
    with pytest.raises(ValueError, match="Unsupported router type: magic"):
        create_router({"type": "magic"}, ["a"])


def test_the_proxy_reads_conversation_ids_from_the_body_before_the_headers():
    from toolkit.standin.proxy import Proxy
    body = {"messages": [{"role": "user", "content": "hi"}], "conversation_params": {"conversation_id": "body"}}
    r = Proxy._route_request(None, "chat", body, {"X-Correlation-ID": "hdr"})
    assert r.conversation_id == "body" and r.text == "user:hi"
    headers = {"x-session-id": " ", "X-Correlation-ID": "aiperf-1"}  # names compare case-insensitively
    assert Proxy._route_request(None, "chat", {"messages": []}, headers).conversation_id == "aiperf-1"
    assert Proxy._route_request(None, "completion", {"prompt": [1, 2]}, {}).tokens_of_client


# --- /kv_cache_events exposure (hostile round 4, H3) -------------------------------------------------------------

def test_the_plan_warns_where_workers_answer_kv_cache_events_to_anyone_who_reaches_them():
    """TensorRT-LLM's POST /kv_cache_events is unauthenticated and drains the events it returns, token ids included
    (tensorrt_llm/serve/openai_server.py @ 00057725, cpp/tensorrt_llm/batch_manager/kvCacheEventManager.cpp @
    05843b0a): where a recipe turns the events on, tk plan says who can read them and what a reader takes."""
    from toolkit import api

    plan = api.load_plan("standin-multiturn")  # kv_cache_aware context router: tk turns the events on
    (warning,) = [w for w in plan.warnings if "/kv_cache_events" in w]
    for said in ("context", "event_buffer_max_size", "unauthenticated", "drain", "token ids", "router",
                 "0.0.0.0", "docs/multiturn.md"):
        assert said in warning, said
    gen = api.load_plan("standin-2p2d", ['generation.extra_options={"kv_cache_config": {"event_buffer_max_size": 8}}'])
    assert any("/kv_cache_events" in w and w.startswith("generation") for w in gen.warnings)
    quiet = api.load_plan("standin-2p2d")  # no events: no warning
    assert not any("/kv_cache_events" in w for w in quiet.warnings)
