"""Facts about TensorRT-LLM's KV-cache block reuse, its KV-cache event stream and the reuse-aware routers.

Pure data and two small pure functions; read by the plan (a router the line lacks), `tk bench` (what a reported
``cached_tokens`` means on a line) and the CPU stand-in (which reuses blocks as TensorRT-LLM does). Sources, all
NVIDIA/TensorRT-LLM unless said otherwise:

- block keys and their hash: ``tensorrt_llm/runtime/kv_cache_hash.py`` (``hash_v1_block_key``, commit
  991de58c52acf039626cabc30e7c4f4106d222fd), the Python twin of the C++ ``BlockKeyHasher``
  (``cpp/tensorrt_llm/batch_manager/blockKey.cpp``) that names the blocks in ``/kv_cache_events``; the router
  hashes ``tokens[:-1]`` ("in KvCacheManager, the last token is not included in the block key"), cut into
  ``tokens_per_block`` blocks, the last one possibly partial (``tensorrt_llm/serve/router.py``
  ``BlockHashMixin._compute_block_hashes``, commit 00895e31dc5f9865c6bdfd2dd0508a9d6d964e9d);
- ``KvCacheConfig`` defaults: the LLM-API reference of 1.3.0rc27 (``enable_block_reuse=True``,
  ``event_buffer_max_size=0``, ``free_gpu_memory_fraction=0.9``, ``enable_partial_reuse=True``,
  ``copy_on_partial_reuse=True``) and ``BlockReuseConfig`` (``policy`` all_reusable | per_request |
  per_conversation, ``max_num_turns=1``; PR #16115, made nested by the BREAKING PR #16883, 2026-08-04);
- what the client sees as ``usage.prompt_tokens_details.cached_tokens`` through the disaggregated server: before
  PR #13620 (merged 2026-04-29; PR #14177 moved it into the generation leg's ``ctx_usage``) the generation worker's
  own count, which is the whole prompt (its KV arrived by transfer: PR #12923's description, "the GEN worker reports
  cached_tokens == prompt_tokens"); since then the context leg's ``prompt_tokens`` and ``cached_tokens``
  (``tensorrt_llm/llmapi/disagg_utils.py`` ``rewrite_usage_info_from_ctx``);
- conversation ids: ``tensorrt_llm/serve/conversation_id.py`` (commit 295125be1eeeb886c83ece14958db7b34e0e48a6):
  body ``conversation_params.conversation_id``, else the first non-empty of four headers;
- the ``conversation`` router: PR #12526 (2026-03-25), ``ConversationRouter`` in router.py (commit 00895e31):
  ``match_threshold=0.75``, ``tokens_per_block=128``, ``use_token_ids=False`` (hashes the text's code points),
  ``hash_skip_count=0``, ``max_sessions=100000``;
- #14882 (open): ``KvCacheAwareRouter`` fills its per-server block table **only** by polling the worker's
  ``/kv_cache_events`` inside ``finish_request``; a worker that emits no events (``event_buffer_max_size: 0``, the
  default) leaves every match at 0 and the router silently routes by load alone. ``track_routed_blocks`` (PR
  #15074, which replaced ``backfill_block_hashes_on_finish``) adds the routed request's own hashes on finish.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.facts.trtllm import Router

# --- KvCacheConfig / BlockReuseConfig defaults ------------------------------------------------------------------
ENABLE_BLOCK_REUSE_DEFAULT = True
EVENT_BUFFER_MAX_SIZE_DEFAULT = 0
FREE_GPU_MEMORY_FRACTION_DEFAULT = 0.9
ENABLE_PARTIAL_REUSE_DEFAULT = True
BLOCK_REUSE_POLICIES = ("all_reusable", "per_request", "per_conversation")
BLOCK_REUSE_POLICY_DEFAULT = "all_reusable"
MAX_NUM_TURNS_DEFAULT = 1

# --- router defaults --------------------------------------------------------------------------------------------
KV_AWARE_TOKENS_PER_BLOCK_DEFAULT = 32  # KvCacheAwareRouter(tokens_per_block=32)
KV_AWARE_MAX_BATCH_SIZE_DEFAULT = 64  # KvCacheAwareRouter(max_batch_size=64)
TOKENS_PER_BLOCK_ENV = "TRTLLM_KVCACHE_AWARE_ROUTER_HASH_TOKENS_PER_BLOCK"  # BlockHashMixin._init_block_hashing
CONVERSATION_ROUTER = Router.CONVERSATION
CONVERSATION_DEFAULTS = {"match_threshold": 0.75, "tokens_per_block": 128, "use_token_ids": False,
                         "hash_skip_count": 0, "max_sessions": 100000}
CONVERSATION_CHARS_PER_TOKEN = 5  # ConversationRouter.CHAR_PER_TOKEN ("approximately 4 characters per token + 1")
CONVERSATION_ID_HEADERS = ("x-session-id", "x-correlation-id", "x-session-affinity", "x-multi-turn-session-id")


@dataclass(frozen=True)
class ReuseFacts:
    """What one release line does about reuse that tk (and the stand-in) must know."""

    line: str
    # The disaggregated server hands the context leg's usage to the generation leg (``ctx_usage``) and the client
    # sees the context server's cached_tokens; False: the generation worker's own count (the whole prompt).
    ctx_usage_passthrough: bool
    conversation_router: bool  # router type "conversation" and conversation ids (body / headers)
    block_reuse_config: bool  # kv_cache_config.block_reuse_config.{policy,max_num_turns}
    track_routed_blocks: bool  # KvCacheAwareRouter arg track_routed_blocks (PR #15074)
    source: str


_FACTS = {f.line: f for f in (
    ReuseFacts("1.0", False, False, False, False, "v1.0.0: before PRs #12526, #13620, #15074, #16115"),
    ReuseFacts("1.1", False, False, False, False, "v1.1.0: before PRs #12526, #13620, #15074, #16115"),
    ReuseFacts("1.2", False, False, False, False,
               "v1.2.0 (early 2026): before PR #12526 (2026-03-25) and #13620 (2026-04-29); back-ports unverified"),
    ReuseFacts("1.3", True, True, True, True,
               "1.3 release candidates (docs 1.3.0rc27): PRs #12526, #13620/#14177, #15074, #16115/#16883 merged "
               "on main before them"),
)}


def reuse_facts(line: str) -> ReuseFacts:
    """The facts of a release line; a line newer than the table gets the newest row's."""
    if line in _FACTS:
        return _FACTS[line]

    def key(v: str) -> tuple:
        return tuple(int(p) for p in v.split(".") if p.isdigit())
    older = [f for f in _FACTS.values() if key(f.line) <= key(line)]
    return max(older, key=lambda f: key(f.line)) if older else _FACTS[min(_FACTS, key=key)]


# --- the v1 block key hash ---------------------------------------------------------------------------------------
# Constants of kv_cache_hash.py / blockKey.cpp: a 32-bit integer mix of each token combined boost-style into a
# 64-bit seed that starts from the block's length and the parent block's hash.
_M32, _M64 = (1 << 32) - 1, (1 << 64) - 1
_MIX32 = 0x45D9F3B
_GOLDEN = 0x9E3779B9
_PARENT = 0xBF58476D1CE4E5B9


def _token_mix(token: int) -> int:
    v = token & _M32
    v = (((v >> 16) ^ v) * _MIX32) & _M32
    v = (((v >> 16) ^ v) * _MIX32) & _M32
    return ((((v >> 16) ^ v) & _M32) + _GOLDEN) & _M32


_MIXED: list[int] = []  # _token_mix of every token id below 2**16, built on first use (a table lookup is cheaper)
_TABLE = 1 << 16


def block_key_hash(tokens, parent_hash: int = 0) -> int:
    """The v1 hash of one block key (``tokens`` of one block, 1..tokens_per_block of them) under its parent block
    (0 for the first block): what TensorRT-LLM's KV-cache events and its kv_cache_aware router call a block."""
    if not _MIXED:
        _MIXED.extend(_token_mix(t) for t in range(_TABLE))
    mixed = _MIXED
    seed = (len(tokens) ^ ((parent_hash * _PARENT) & _M64)) & _M64
    for t in tokens:
        m = mixed[t] if 0 <= t < _TABLE else _token_mix(t)
        seed ^= (m + ((seed << 6) & _M64) + (seed >> 2)) & _M64
    return seed


def block_keys(token_ids, tokens_per_block: int) -> list:
    """The block keys of a request: ``token_ids[:-1]`` cut into ``tokens_per_block`` tuples, the last possibly
    shorter (the engine never reuses a prompt's last token: at least one is computed)."""
    n = len(token_ids) - 1
    return [tuple(token_ids[i:min(i + tokens_per_block, n)]) for i in range(0, max(n, 0), tokens_per_block)]


def kv_pool_tokens(gpu_memory_bytes: int, weight_bytes_per_rank: float, other_bytes: float,
                   kv_bytes_per_token_per_rank: float, free_gpu_memory_fraction: float,
                   max_tokens: int | None = None) -> int:
    """Tokens of KV one rank's pool holds, as TensorRT-LLM's KvCacheCreator sizes it: ``free_gpu_memory_fraction``
    of the memory the weights and everything else (``other_bytes``: runtime, NCCL, activations where known) leave,
    capped by ``kv_cache_config.max_tokens`` when given (the smaller of the two wins)."""
    free = gpu_memory_bytes - weight_bytes_per_rank - other_bytes
    tokens = int(max(0.0, free) * free_gpu_memory_fraction // max(kv_bytes_per_token_per_rank, 1e-9))
    return min(tokens, max_tokens) if max_tokens else tokens
