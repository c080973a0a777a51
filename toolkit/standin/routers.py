"""The proxy's routers, deciding as ``tensorrt_llm/serve/router.py`` does (tk CPU stand-in, not TensorRT-LLM).

Read in NVIDIA/TensorRT-LLM commit 00895e31dc5f9865c6bdfd2dd0508a9d6d964e9d (facts: ``toolkit.facts.kvreuse``):

- ``round_robin``: the next server in turn; an excluded one is skipped by taking the one after it.
- ``load_balancing``: fewest in-flight requests (prompt tokens with ``use_tokens``); ties broken by a round-robin
  counter over the tied servers (``LoadBalancingMixin._select_least_loaded``).
- ``kv_cache_aware``: score = matched tokens / padded tokens - in-flight requests / ``max_batch_size`` (64 unless
  the config says), ties by the same counter. A request's block hashes are TensorRT-LLM's v1 block-key hashes of
  ``tokens[:-1]`` in ``tokens_per_block`` blocks (the last may be partial; ``padded`` = blocks x
  tokens_per_block); a server's match is ``tokens_per_block`` for every leading hash in its block table. The block
  table is filled **only** from the server's ``/kv_cache_events`` (``stored`` adds, ``removed`` drops), polled
  inside ``finish_request`` of a request routed to it; with ``track_routed_blocks`` (1.3; earlier
  ``backfill_block_hashes_on_finish``) a finished request's own hashes are added too: opt-in, default off, as at
  00895e31 (``backfill_block_hashes_on_finish: bool = False``); later main (3e53e4ad) renamed it
  ``track_routed_blocks`` and turned it on by default (which release carries that is unverified; tk's plan turns
  the servers' KV-cache events on wherever a kv_cache_aware router reads them, so its table does not depend on
  it: toolkit/plan/options.py). A worker that emits no
  events (``event_buffer_max_size: 0``) leaves every match at 0: the router routes by load alone, silently
  (TensorRT-LLM #14882; the stand-in counts it as ``matches_all_zero`` in ``/standin/stats``).
- ``conversation`` (1.3, PR #12526): a request with a conversation id goes to the server its conversation went to
  (sticky, whatever the load); one without is matched against every known session's block hashes (a prefix trie)
  and follows the longest whose share of the request's blocks is at least ``match_threshold``; else the least
  loaded server by in-flight content weight (blocks x tokens_per_block), ties round-robin, and the request starts a
  session (implicit id ``conv_id:NODE_N`` when it has none). Hashes are over token ids when the request carries
  them (a generation leg's ``prompt_token_ids``), else over the text's unicode code points
  (``role:content`` lines of a chat), as ``use_token_ids: false`` (the default) does.

``get_next_server(token_ids, exclude, request=...)`` returns ``(server, info)``; every server returned must be
handed back with ``finish_request`` (or the async ``finish``, which also polls the events).
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from dataclasses import dataclass

from toolkit.facts import kvreuse as F

log = logging.getLogger("toolkit.standin")
MAX_EVENTS_BYTES = 64 << 20  # bound on one /kv_cache_events answer the router reads


@dataclass(frozen=True)
class RouteRequest:
    """What a router may look at besides the token ids: the request's text (for hashing code points) and its
    conversation id (body ``conversation_params`` or an affinity header, ``toolkit.facts.kvreuse``)."""

    text: str | None = None
    conversation_id: str | None = None
    tokens_of_client: bool = False  # the client sent token ids (not text): routers hash them as they are


class BlockHasher:
    """The chained block hashes of token lists, memoised per (parent hash, block key) so that a conversation's
    history (the same blocks every turn) is hashed once; bounded."""

    def __init__(self, tokens_per_block: int, memo_size: int = 200_000):
        self.tpb = tokens_per_block
        self.memo: OrderedDict[tuple, int] = OrderedDict()
        self.memo_size = memo_size

    def hashes(self, token_ids) -> list[int]:
        out, parent = [], 0
        memo = self.memo
        for key in F.block_keys(token_ids, self.tpb):
            k = (parent, key)
            h = memo.get(k)
            if h is None:
                h = F.block_key_hash(key, parent)
                memo[k] = h
                if len(memo) > self.memo_size:
                    memo.popitem(last=False)
            out.append(h)
            parent = h
        return out


def block_hashes(token_ids, tokens_per_block: int) -> list[int]:
    """TensorRT-LLM's block hashes of one token list (``BlockHashMixin._compute_block_hashes``)."""
    return BlockHasher(tokens_per_block).hashes(token_ids)


class Router:
    def __init__(self, servers: list[str], args: dict | None = None, dynamic: bool = False):
        if not servers and not dynamic:
            raise ValueError("a router needs at least one server")
        self.servers = list(servers)
        self.args = dict(args or {})
        self.active = {s: 0 for s in self.servers}
        self.active_tokens = {s: 0 for s in self.servers}
        self._rr = 0
        self.stats = {"routed": 0}

    def add_server(self, server: str) -> None:
        """A worker that registered (membership): TensorRT-LLM's Router.add_server."""
        if server not in self.servers:
            self.servers.append(server)
            self.active.setdefault(server, 0)
            self.active_tokens.setdefault(server, 0)

    def remove_server(self, server: str) -> None:
        """A worker that went inactive or deregistered: no new requests go to it (in-flight ones finish)."""
        if server in self.servers:
            self.servers.remove(server)

    def choose(self, token_ids: list[int], exclude: str | None, request: RouteRequest) -> tuple[str, dict]:
        raise NotImplementedError

    def get_next_server(self, token_ids: list[int] | None = None, exclude: str | None = None,
                        request: RouteRequest | None = None) -> tuple[str, dict]:
        if not self.servers:
            raise LookupError("no server is registered")
        tokens = list(token_ids or ())
        server, info = self.choose(tokens, exclude, request or RouteRequest())
        self.active[server] = self.active.get(server, 0) + 1
        self.active_tokens[server] = self.active_tokens.get(server, 0) + len(tokens)
        self.stats["routed"] += 1
        info.setdefault("token_lists", [tokens])
        info["_tokens"] = len(tokens)
        return server, info

    def finish_request(self, server: str, token_ids: list[int] | None = None, ok: bool = True,
                       info: dict | None = None) -> None:
        self.active[server] = max(0, self.active.get(server, 0) - 1)
        n = (info or {}).get("_tokens", len(token_ids or ()))
        self.active_tokens[server] = max(0, self.active_tokens.get(server, 0) - n)

    async def finish(self, server: str, info: dict, ok: bool, session) -> None:
        """finish_request, plus what a router does on the network when a request ends (kv_cache_aware: poll)."""
        self.finish_request(server, None, ok, info)

    def _least_loaded(self, cands: list[str], load: dict) -> str:
        least = min(load.get(s, 0) for s in cands)
        tied = [s for s in cands if load.get(s, 0) == least]
        server = tied[self._rr % len(tied)]
        self._rr += 1
        return server

    def _candidates(self, exclude) -> list[str]:
        return [s for s in self.servers if s != exclude]

    def describe(self) -> dict:
        return dict(self.stats)


class RoundRobinRouter(Router):
    def choose(self, token_ids, exclude, request):
        n = len(self.servers)
        server = self.servers[self._rr % n]
        self._rr += 1
        if exclude and server == exclude:
            server = self.servers[self._rr % n]
            self._rr += 1
            if server == exclude:
                raise LookupError(f"No available servers after excluding {exclude}")
        return server, {}


class LoadBalancingRouter(Router):
    def choose(self, token_ids, exclude, request):
        cands = self._candidates(exclude)
        if not cands:
            raise LookupError(f"No available servers after excluding {exclude}")
        load = self.active_tokens if self.args.get("use_tokens") else self.active
        return self._least_loaded(cands, load), {}


class KvCacheAwareRouter(Router):
    def __init__(self, servers, args=None, dynamic=False):
        super().__init__(servers, args, dynamic)
        env = os.environ.get(F.TOKENS_PER_BLOCK_ENV)
        self.tokens_per_block = int(env or self.args.get("tokens_per_block") or F.KV_AWARE_TOKENS_PER_BLOCK_DEFAULT)
        self.max_batch_size = int(self.args.get("max_batch_size") or F.KV_AWARE_MAX_BATCH_SIZE_DEFAULT)
        self.track_routed = bool(self.args.get("track_routed_blocks") or self.args.get("backfill_block_hashes_on_finish"))
        self.hasher = BlockHasher(self.tokens_per_block)
        self.tables: dict[str, set] = {s: set() for s in self.servers}
        self.stats.update({"events_polled": 0, "events_stored": 0, "events_removed": 0, "poll_failures": 0,
                           "matches_all_zero": 0, "matched_tokens": 0})

    def add_server(self, server: str) -> None:
        super().add_server(server)
        self.tables.setdefault(server, set())

    def matched_tokens(self, server: str, hashes: list[int]) -> int:
        table = self.tables.get(server, ())
        n = 0
        for h in hashes:
            if h not in table:
                break
            n += 1
        return n * self.tokens_per_block

    def choose(self, token_ids, exclude, request):
        cands = self._candidates(exclude)
        if not cands:
            raise LookupError(f"No available servers after excluding {exclude}")
        hashes = self.hasher.hashes(token_ids)
        padded = max(len(hashes) * self.tokens_per_block, 1)
        matches = [self.matched_tokens(s, hashes) for s in cands]
        scores = [m / padded - self.active.get(s, 0) / self.max_batch_size for s, m in zip(cands, matches)]
        best = max(scores)
        tied = [i for i, sc in enumerate(scores) if sc == best]
        win = tied[self._rr % len(tied)]
        self._rr += 1
        self.stats["matches_all_zero"] += not any(matches)
        self.stats["matched_tokens"] += matches[win]
        return cands[win], {"matches": [matches[win]], "all_matches": dict(zip(cands, matches)),
                            "block_hashes": [hashes], "token_lists": [token_ids]}

    def update_with_events(self, server: str, events) -> None:
        table = self.tables.setdefault(server, set())
        for raw in events if isinstance(events, list) else []:
            ev = raw.get("data", raw) if isinstance(raw, dict) else None
            if not isinstance(ev, dict):
                continue
            self.stats["events_polled"] += 1
            if ev.get("type") == "stored":
                for b in ev.get("blocks") or []:
                    if isinstance(b, dict) and "block_hash" in b:
                        table.add(b["block_hash"])
                        self.stats["events_stored"] += 1
            elif ev.get("type") == "removed":
                for h in ev.get("block_hashes") or []:
                    table.discard(h)
                    self.stats["events_removed"] += 1

    async def finish(self, server, info, ok, session) -> None:
        self.finish_request(server, None, ok, info)
        if self.track_routed and ok and server in self.tables:
            for hl in info.get("block_hashes") or []:
                self.tables[server].update(hl)
        if session is None or server not in self.tables:
            return
        try:  # KvCacheAwareServerState.poll_and_update: failures are a warning, the table stays as it was
            import aiohttp
            async with session.post(server + "/kv_cache_events", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}")
                chunks, size = [], 0
                async for chunk in resp.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > MAX_EVENTS_BYTES:  # the stand-in's own bound; the worker has drained them already,
                        self.tables[server].clear()  # so the removals among them are lost: start the table again
                        raise RuntimeError(f"more than {MAX_EVENTS_BYTES} bytes of events: the block table of "
                                           f"{server} was cleared")
                    chunks.append(chunk)
            import json
            self.update_with_events(server, json.loads(b"".join(chunks) or b"[]"))
        except Exception as exc:  # noqa: BLE001
            self.stats["poll_failures"] += 1
            log.warning("Failed to poll KV cache events from %s: %s", server, exc)


class _Trie:
    """Block-hash prefix tree -> the sessions whose hashes pass through each node (ConversationRouter's
    ``_BlockHashTrie``)."""

    def __init__(self):
        self.root: dict = {"c": {}, "s": set()}

    def insert(self, sid: str, hashes: list) -> None:
        node = self.root
        for h in hashes:
            node = node["c"].setdefault(h, {"c": {}, "s": set()})
            node["s"].add(sid)

    def remove(self, sid: str, hashes: list) -> None:
        node, path = self.root, []
        for h in hashes:
            child = node["c"].get(h)
            if child is None:
                break
            path.append((node, h))
            node = child
            node["s"].discard(sid)
        for parent, h in reversed(path):
            child = parent["c"][h]
            if child["s"] or child["c"]:
                break
            del parent["c"][h]

    def longest(self, hashes: list, valid) -> tuple[str | None, int]:
        node, best, depth_best = self.root, None, 0
        for depth, h in enumerate(hashes, 1):
            node = node["c"].get(h)
            if node is None:
                break
            for sid in node["s"]:
                if valid(sid):
                    best, depth_best = sid, depth
                    break
        return best, depth_best


class ConversationRouter(Router):
    def __init__(self, servers, args=None, dynamic=False):
        super().__init__(servers, args, dynamic)
        d = F.CONVERSATION_DEFAULTS
        env = os.environ.get(F.TOKENS_PER_BLOCK_ENV)
        self.tokens_per_block = int(env or self.args.get("tokens_per_block") or d["tokens_per_block"])
        self.match_threshold = float(self.args.get("match_threshold", d["match_threshold"]))
        self.use_token_ids = bool(self.args.get("use_token_ids", d["use_token_ids"]))
        self.hash_skip_count = int(self.args.get("hash_skip_count", d["hash_skip_count"]))
        self.max_sessions = int(self.args.get("max_sessions", d["max_sessions"]))
        self.node_id = int(self.args.get("disagg_node_id", 0))
        self.hasher = BlockHasher(self.tokens_per_block)
        self.sessions: OrderedDict[str, tuple[str, list]] = OrderedDict()
        self.trie = _Trie()
        self.content_load = {s: 0 for s in self.servers}
        self._implicit = 0
        self.stats.update({"sticky": 0, "implicit": 0, "fallback": 0})

    def add_server(self, server):
        super().add_server(server)
        self.content_load.setdefault(server, 0)

    def remove_server(self, server):
        super().remove_server(server)
        for cid, (s, hashes) in list(self.sessions.items()):
            if s == server:
                del self.sessions[cid]
                self.trie.remove(cid, hashes)

    def _hashes(self, token_ids, request: RouteRequest) -> list[int]:
        if request.tokens_of_client or request.text is None or self.use_token_ids:
            seq, skip = list(token_ids), self.hash_skip_count
        else:
            seq, skip = [ord(c) for c in request.text], self.hash_skip_count * F.CONVERSATION_CHARS_PER_TOKEN
        return self.hasher.hashes(seq[skip:] if skip else seq)

    def _update(self, cid: str, server: str, hashes: list) -> None:
        old = self.sessions.pop(cid, None)
        if old is not None:
            self.trie.remove(cid, old[1])
        self.sessions[cid] = (server, hashes)
        self.trie.insert(cid, hashes)
        while len(self.sessions) > self.max_sessions:
            old_cid, (_, old_hashes) = self.sessions.popitem(last=False)
            self.trie.remove(old_cid, old_hashes)

    def choose(self, token_ids, exclude, request):
        hashes = self._hashes(token_ids, request)
        weight = len(hashes) * self.tokens_per_block or 1
        cid = request.conversation_id
        info = {"weight": weight}
        if cid and cid in self.sessions:
            sticky = self.sessions[cid][0]
            if sticky in self.servers and sticky != exclude:
                self._update(cid, sticky, hashes)
                self.stats["sticky"] += 1
                return self._load(sticky, weight, info, "sticky")
        if not cid and hashes:
            def valid(sid):
                entry = self.sessions.get(sid)
                return entry is not None and entry[0] in self.servers and entry[0] != exclude
            best, depth = self.trie.longest(hashes, valid)
            if best is not None and depth / len(hashes) >= self.match_threshold:
                server = self.sessions[best][0]
                self._update(best, server, hashes)
                self.stats["implicit"] += 1
                return self._load(server, weight, info, "implicit")
        cands = self._candidates(exclude)
        if not cands:
            raise LookupError(f"No available servers after excluding {exclude}")
        server = self._least_loaded(cands, self.content_load)
        if not cid:
            self._implicit += 1
            cid = f"conv_id:{self.node_id}_{self._implicit}"
        self._update(cid, server, hashes)
        self.stats["fallback"] += 1
        return self._load(server, weight, info, "fallback")

    def _load(self, server, weight, info, how):
        self.content_load[server] = self.content_load.get(server, 0) + weight
        info["route"] = how
        return server, info

    def finish_request(self, server, token_ids=None, ok=True, info=None):
        super().finish_request(server, token_ids, ok, info)
        w = (info or {}).get("weight", 0)
        self.content_load[server] = max(0, self.content_load.get(server, 0) - w)


ROUTER_CLASSES = {"round_robin": RoundRobinRouter, "load_balancing": LoadBalancingRouter,
                  "kv_cache_aware": KvCacheAwareRouter, F.CONVERSATION_ROUTER: ConversationRouter}


def create_router(config: dict, servers: list[str], dynamic: bool = False) -> Router:
    cfg = dict(config or {})
    kind = str(cfg.pop("type", "round_robin")).lower()
    cls = ROUTER_CLASSES.get(kind)
    if cls is None:
        raise ValueError(f"Unsupported router type: {kind}. Supported types are: {list(ROUTER_CLASSES)}")
    return cls(servers, cfg, dynamic)
