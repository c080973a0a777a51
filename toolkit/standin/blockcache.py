"""The stand-in's KV-cache block manager: reuse of prompt prefixes as TensorRT-LLM's does it (tk CPU stand-in).

Pure bookkeeping: no clock, no I/O, no KV bytes (the stand-in's real KV lives in ``toolkit.standin.kv``; this
module decides how many of a prompt's tokens the engine would *not* compute again, and what it tells a
KV-cache-aware router). It follows TensorRT-LLM's V1 block manager (``cpp/tensorrt_llm/batch_manager/
kvCacheManager.cpp``: a radix tree of blocks keyed by their tokens, ``loadOrAllocateBlocks`` /
``storeContextBlocks`` / ``releaseBlocks``) and the facts in ``toolkit.facts.kvreuse``:

- a request's **block keys** are ``tokens[:-1]`` cut into ``tokens_per_block`` blocks, the last possibly partial;
- **lookup** walks the tree from the root: a child with the same key is reused whole; with partial reuse on
  (``enable_partial_reuse``, the default) the walk may end in a child that shares only a prefix of the key, whose
  matching tokens are reused too (copied, ``copy_on_partial_reuse``); the reused count is the request's
  ``cached_tokens`` (at most ``prompt - 1``);
- the blocks a request reuses are **pinned** while it runs; the prompt's blocks are **stored** in the tree when
  its context phase ends (``per_request``: after the last chunk; ``all_reusable`` commits every chunk, which only
  matters to requests running at the same time), and the whole sequence's (prompt + generated tokens) when it
  ends, except under KV cache manager V2, whose generated blocks are not reusable (PR #18711, closed);
- **capacity** is a number of blocks (the worker sizes it: ``toolkit.standin.worker.create_block_cache``); a request's
  new blocks come from
  free ones, else by **evicting** the least recently used unpinned leaf blocks of the tree (a block's children go
  first, so the tree stays a tree); a request that cannot get its blocks still runs (the stand-in's scheduler has
  no capacity model) and is counted as ``over_capacity``;
- every store and eviction is a **KV-cache event** in TensorRT-LLM's JSON shape (``created``, ``stored``,
  ``removed``), kept in a buffer of ``event_buffer_max_size`` events (0: none, TensorRT-LLM's default) that
  ``/kv_cache_events`` drains.

``enable_block_reuse: false`` turns lookup and storing off (every token is computed, nothing is an event).
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import count

from toolkit.facts.kvreuse import block_key_hash, block_keys

EVENT_PRIORITY_DEFAULT = 35  # KvCacheRetentionConfig's default priority, as TensorRT-LLM's stored events carry it
_TOKEN = '{"type":"unique_token","token_id":%d,"token_extra_id":0}'
_TOKENS_JSON: list[str] = []  # _TOKEN of every id below _TOKENS_TABLE, built on first use
_TOKENS_TABLE = 1 << 16


class _Block:
    __slots__ = ("_hash", "children", "id", "key", "lru", "parent", "pins")

    def __init__(self, bid: int, key: tuple, parent: _Block | None):
        self.id = bid
        self.key = key
        self.parent = parent
        self._hash: int | None = 0 if parent is None else None
        self.children: dict[tuple, _Block] = {}
        self.pins = 0
        self.lru = 0

    @property
    def hash(self) -> int:
        """The v1 block hash, computed when an event first needs it (a cache without events never does)."""
        if self._hash is None:
            self._hash = block_key_hash(self.key, self.parent.hash)
        return self._hash


@dataclass
class Lease:
    """One request's hold on the cache: what it reused, what it pinned, how many blocks it took."""

    cached_tokens: int = 0
    pinned: dict = field(default_factory=dict)  # block id -> block
    private_blocks: int = 0  # blocks allocated for it and not (yet) in the tree
    released: bool = False


@dataclass
class CacheStats:
    lookups: int = 0
    hits: int = 0  # lookups that reused at least one token
    lookup_tokens: int = 0  # prompt tokens looked up
    cached_tokens: int = 0  # prompt tokens reused
    reused_blocks: int = 0
    missed_blocks: int = 0
    stored_blocks: int = 0
    evicted_blocks: int = 0
    over_capacity: int = 0  # requests that could not get all their blocks
    events: int = 0
    events_dropped: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class BlockCache:
    def __init__(self, tokens_per_block: int, capacity_blocks: int, *, reuse: bool = True,
                 partial_reuse: bool = True, store_generated: bool = True, event_buffer_max_size: int = 0,
                 window_size: int | None = None):
        if tokens_per_block < 1 or capacity_blocks < 1:
            raise ValueError("tokens_per_block and capacity_blocks must be positive")
        self.tpb = tokens_per_block
        self.capacity = capacity_blocks
        self.reuse = reuse
        self.partial_reuse = partial_reuse
        self.store_generated = store_generated
        self.root = _Block(0, (), None)
        self._ids = count(1)
        self._clock = count(1)
        self.tree_blocks = 0
        self.pinned_tree_blocks = 0  # tree blocks some running request holds
        self.private_blocks = 0
        self.evictable: OrderedDict[int, _Block] = OrderedDict()  # unpinned leaves, least recently used first
        self.stats = CacheStats()
        self.event_max = max(0, int(event_buffer_max_size))
        self.events: deque = deque()
        self._event_ids = count(0)
        self.window_size = window_size
        self._event({"type": "created", "num_blocks_per_cache_level": [capacity_blocks, 0]})

    # --- what TensorRT-LLM would report ------------------------------------------------------------------------

    @property
    def used_blocks(self) -> int:
        return self.tree_blocks + self.private_blocks

    @property
    def free_blocks(self) -> int:
        return max(0, self.capacity - self.used_blocks)

    @property
    def reported_free_blocks(self) -> int:
        """Free as TensorRT-LLM counts it: a released block that is still reusable sits in the free queue and counts
        as free (``LRUEvictionPolicy::releaseBlock`` adds it to the free queue; kvCacheManager.cpp), so only the
        blocks running requests hold are used."""
        return max(0, self.capacity - self.pinned_tree_blocks - self.private_blocks)

    def kv_cache_stats(self) -> dict:
        """The ``kvCacheStats`` of an iteration-stats entry (TensorRT-LLM's field names)."""
        s = self.stats
        total = s.reused_blocks + s.missed_blocks
        free = self.reported_free_blocks
        return {"maxNumBlocks": self.capacity, "freeNumBlocks": free, "usedNumBlocks": self.capacity - free,
                "tokensPerBlock": self.tpb, "allocTotalBlocks": total, "allocNewBlocks": s.missed_blocks,
                "reusedBlocks": s.reused_blocks, "missedBlocks": s.missed_blocks,
                "cacheHitRate": (s.reused_blocks / total) if total else 0.0}

    def describe(self) -> dict:
        return {"enable_block_reuse": self.reuse, "enable_partial_reuse": self.partial_reuse,
                "tokens_per_block": self.tpb, "capacity_blocks": self.capacity,
                "capacity_tokens": self.capacity * self.tpb, "tree_blocks": self.tree_blocks,
                "used_blocks": self.used_blocks, "event_buffer_max_size": self.event_max,
                "generated_blocks_reusable": self.store_generated, **self.stats.to_dict()}

    def drain_events(self) -> list[dict]:
        return json.loads(self.drain_events_json())

    def drain_events_json(self) -> bytes:
        """The buffered events as the JSON array ``/kv_cache_events`` answers, drained. Each event is serialized
        once, when it happens (the token lists of stored blocks make these the bulk of the bookkeeping)."""
        out = b"[" + b",".join(self.events) + b"]"
        self.events.clear()
        return out

    # --- a request's life ----------------------------------------------------------------------------------------

    def match(self, token_ids) -> int:
        """Tokens a request with these ids would reuse now (no side effect)."""
        if not self.reuse:
            return 0
        matched, _, _ = self._walk(block_keys(token_ids, self.tpb))
        return matched

    def begin(self, token_ids, reuse: bool = True) -> Lease:
        """Look the request up (``reuse``: False for a generation leg, whose KV arrives by transfer), pin what it
        reuses, take blocks for the rest."""
        n = len(token_ids)
        lease = Lease()
        need = -(-n // self.tpb)
        if self.reuse and reuse:
            keys = block_keys(token_ids, self.tpb)
            matched, path, partial = self._walk(keys)
            self.stats.lookups += 1
            self.stats.lookup_tokens += n
            self.stats.cached_tokens += matched
            self.stats.hits += matched > 0
            full = len(path)
            self.stats.reused_blocks += full + (1 if partial else 0)
            self.stats.missed_blocks += max(0, need - full - (1 if partial else 0))
            now = next(self._clock)
            for b in path:
                self._pin(b, now)
                lease.pinned[b.id] = b
            lease.cached_tokens = matched
            need -= full  # a partially matched block is copied into a new one (copy_on_partial_reuse)
        lease.private_blocks = self._allocate(need)
        return lease

    def store(self, lease: Lease, token_ids) -> None:
        """Put the blocks of ``token_ids[:-1]`` in the tree (a context phase's prompt, or a finished sequence)."""
        if not self.reuse or lease.released:
            return
        node, stored = self.root, []
        now = next(self._clock)
        for key in block_keys(token_ids, self.tpb):
            child = node.children.get(key)
            if child is None:
                child = _Block(next(self._ids), key, node)
                if not node.children:
                    self.evictable.pop(node.id, None)  # it had no child: no longer a leaf
                node.children[key] = child
                self.tree_blocks += 1
                self.stats.stored_blocks += 1
                if lease.private_blocks:  # the request's own block moves into the tree
                    lease.private_blocks -= 1
                    self.private_blocks -= 1
                stored.append(child)
            if child.id not in lease.pinned:
                self._pin(child, now)
                lease.pinned[child.id] = child
            node = child
        if stored and self.event_max:
            self._event({"type": "stored", "parent_hash": stored[0].parent.hash if stored[0].parent is not self.root
                         else None, "blocks": [self._stored_block(b) for b in stored]})
        self._make_room()

    def release(self, lease: Lease, sequence=None) -> None:
        """The request ended: store its whole sequence (prompt + generated) where that is reusable, unpin."""
        if lease.released:
            return
        if sequence is not None and self.store_generated:
            self.store(lease, sequence)
        lease.released = True
        now = next(self._clock)
        for b in lease.pinned.values():
            b.pins -= 1
            b.lru = now
            self.pinned_tree_blocks -= b.pins == 0
            if b.pins == 0 and not b.children:
                self.evictable[b.id] = b
                self.evictable.move_to_end(b.id)
        self.private_blocks -= lease.private_blocks
        lease.private_blocks = 0
        lease.pinned = {}
        self._make_room()

    # --- internals -------------------------------------------------------------------------------------------

    def _walk(self, keys: list) -> tuple[int, list, bool]:
        node, matched, path = self.root, 0, []
        for key in keys:
            child = node.children.get(key)
            if child is not None:
                matched += len(key)
                path.append(child)
                node = child
                continue
            if self.partial_reuse and node.children:
                best = 0
                for other in node.children:
                    k = 0
                    for a, b in zip(other, key):
                        if a != b:
                            break
                        k += 1
                    best = max(best, k)
                if best:
                    matched += best
                    return matched, path, True
            break
        return matched, path, False

    def _pin(self, b: _Block, now: int) -> None:
        self.pinned_tree_blocks += b.pins == 0
        b.pins += 1
        b.lru = now
        self.evictable.pop(b.id, None)

    def _allocate(self, n: int) -> int:
        if n <= 0:
            return 0
        self._evict(n - self.free_blocks)
        if self.free_blocks < n:
            self.stats.over_capacity += 1
        self.private_blocks += n
        return n

    def _make_room(self) -> None:
        if self.used_blocks > self.capacity:
            self._evict(self.used_blocks - self.capacity)

    def _evict(self, n: int) -> None:
        removed = []
        while n > 0 and self.evictable:
            _, b = self.evictable.popitem(last=False)
            parent = b.parent
            del parent.children[b.key]
            self.tree_blocks -= 1
            self.stats.evicted_blocks += 1
            removed.append(b)
            n -= 1
            if parent is not self.root and parent.pins == 0 and not parent.children:
                self.evictable[parent.id] = parent
                self.evictable.move_to_end(parent.id, last=False)  # an orphaned parent is as old as its child
        if removed and self.event_max:
            self._event({"type": "removed", "block_hashes": [b.hash for b in removed]})

    def _stored_block(self, b: _Block) -> str:
        if not _TOKENS_JSON:
            _TOKENS_JSON.extend(_TOKEN % t for t in range(_TOKENS_TABLE))
        table = _TOKENS_JSON
        tokens = ",".join(table[t] if 0 <= t < _TOKENS_TABLE else _TOKEN % t for t in b.key)
        return (f'{{"type":"stored_block","block_hash":{b.hash},"tokens":[{tokens}],"lora_id":null,'
                f'"cache_level":0,"priority":{EVENT_PRIORITY_DEFAULT}}}')

    def _event(self, data: dict) -> None:
        """Buffer one event, serialized now: ``{"event_id", "data", "window_size"}`` (TensorRT-LLM's
        KVCacheEventSerializer shape; a stored event's ``blocks`` arrive as JSON text from _stored_block)."""
        if not self.event_max:
            return
        self.stats.events += 1
        if len(self.events) >= self.event_max:
            self.events.popleft()
            self.stats.events_dropped += 1
        blocks = data.pop("blocks", None)
        body = json.dumps(data)
        if blocks is not None:
            body = body[:-1] + ',"blocks":[' + ",".join(blocks) + "]}"
        window = f',"window_size":{self.window_size}' if self.window_size else ""
        self.events.append(f'{{"event_id":{next(self._event_ids)},"data":{body}{window}}}'.encode())
