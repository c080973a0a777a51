"""The stand-in's determinism contract and its routers, in-process (no servers)."""

from __future__ import annotations

import numpy as np

from toolkit.facts.models import resolve_model
from toolkit.standin import model as M
from toolkit.standin.routers import (
    KvCacheAwareRouter,
    LoadBalancingRouter,
    RoundRobinRouter,
    block_hashes,
)

GEO = M.geometry(resolve_model("tk/standin-tiny"), 32, "auto")


def test_geometry_matches_tk_plan_formula():
    assert GEO.bytes_per_token == 2 * 4 * 2 * 64 * 2  # 2 (K,V) x layers x kv_heads x head_dim x 2 bytes
    assert M.geometry(resolve_model("tk/standin-tiny"), 32, "fp8").bytes_per_token == GEO.bytes_per_token // 2


def test_tokenizer_and_detokenizer_are_deterministic_and_readable():
    assert M.encode("a b  c\nd") == M.encode("a b c d") and len(M.encode("a b c d")) == 4
    assert all(0 <= t < M.VOCAB_SIZE for t in M.encode("hello world"))
    word = M.decode_token(12345)
    assert word.isalpha() and word == M.decode_token(12345)
    assert M.decode([1, 2]) == " " + M.decode_token(1) + " " + M.decode_token(2)


def test_kv_is_causal_and_the_answer_follows_the_kv_bytes():
    ids = M.encode(" ".join(f"w{i}" for i in range(70)))
    kv = M.kv_content(GEO, ids)
    assert kv.shape == (4, 70, 512)
    assert np.array_equal(M.kv_content(GEO, ids[:40]), kv[:, :40, :])  # token t's rows depend on tokens <= t
    assert not np.array_equal(M.kv_content(GEO, ids[:39] + [ids[40]])[:, 39], kv[:, 39])
    digest = M.kv_digest(kv)
    tokens = M.generate(digest, ids[-1], 10)
    assert tokens == M.generate(digest, ids[-1], 10)
    assert M.generate(digest, ids[-1], 10, first=tokens[0]) == tokens
    corrupted = kv.copy()
    corrupted[2, 33, 7] ^= 1
    assert M.generate(M.kv_digest(corrupted), ids[-1], 10)[1:] != tokens[1:]


def test_round_robin_cycles_and_skips_the_excluded_server():
    r = RoundRobinRouter(["a", "b", "c"])
    picks = [r.get_next_server()[0] for _ in range(4)]
    assert picks == ["a", "b", "c", "a"]
    assert r.get_next_server(exclude="b")[0] == "c"


def test_load_balancing_picks_the_least_busy_server():
    r = LoadBalancingRouter(["a", "b"])
    assert r.get_next_server()[0] == "a"
    assert r.get_next_server()[0] == "b"  # a is busy
    assert r.get_next_server()[0] == "a"  # tie, round robin
    r.finish_request("b")
    assert r.get_next_server()[0] == "b"


def test_kv_cache_aware_router_prefers_the_server_whose_events_hold_the_prefix():
    from toolkit.standin.blockcache import BlockCache
    r = KvCacheAwareRouter(["a", "b"], {"tokens_per_block": 4})
    prompt = list(range(10))
    server, info = r.get_next_server(prompt)
    assert info["matches"] == [0] and info["token_lists"] == [prompt]
    r.finish_request(server, prompt)  # finishing teaches nothing: the table comes from /kv_cache_events only
    cache = BlockCache(4, 64, event_buffer_max_size=16)
    lease = cache.begin(prompt)
    cache.store(lease, prompt)
    r.update_with_events(server, cache.drain_events())
    other, info = r.get_next_server(prompt + [11, 12])
    # the stored partial block (token 8) is not the new one (8, 9, 10): the router matches whole hashes only
    assert other == server and info["matches"] == [8]
    assert len(block_hashes(prompt, 4)) == 3


def test_generation_side_refuses_a_context_server_with_other_geometry():
    from types import SimpleNamespace

    import pytest

    from toolkit.standin.kv import KvPool, TransferError
    me = SimpleNamespace(geo=GEO, endpoint="gen-host:2")
    KvPool.check_geometry(me, {"geometry": GEO.to_dict(), "endpoint": "ctx-host:1"})  # same: accepted
    for other, words in ((M.geometry(resolve_model("tk/standin-tiny"), 32, "fp8"), "kv_cache_config.dtype"),
                         (M.geometry(resolve_model("tk/standin-tiny"), 64, "auto"), "tokens_per_block"),
                         (M.geometry(resolve_model("Qwen/Qwen3-0.6B"), 32, "auto"), "the model")):
        with pytest.raises(TransferError) as exc:
            KvPool.check_geometry(me, {"geometry": other.to_dict(), "endpoint": "ctx-host:1"})
        assert exc.value.status == 400 and words in exc.value.message and "ctx-host:1" in exc.value.message


def test_a_words_id_is_its_hash_whether_remembered_or_not_and_remembering_is_bounded(monkeypatch):
    import hashlib
    monkeypatch.setattr(M, "_WORD_IDS", {})
    monkeypatch.setattr(M, "LEARNED_WORDS_MAX", 3)

    def hashed(word):
        return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little") % M.VOCAB_SIZE
    text = "alpha omega " + M.decode_token(77) + " gamma delta alpha epsilon"
    want = [hashed("alpha"), hashed("omega"), 77, hashed("gamma"), hashed("delta"), hashed("alpha"),
            hashed("epsilon")]
    assert M.encode(text) == want
    assert M.encode(text) == want  # again, from what it remembered
    assert len(M._WORD_IDS) == M.VOCAB_SIZE + 3  # the generated words and three learned ones, no more
