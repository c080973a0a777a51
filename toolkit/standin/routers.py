"""The proxy's routers, as ``tensorrt_llm/serve/router.py`` describes them (tk CPU stand-in, not TensorRT-LLM).

- ``round_robin``: cycles through the servers, skipping an excluded one.
- ``load_balancing``: fewest in-flight requests (or prompt tokens with ``use_tokens: true``), ties round-robin.
- ``kv_cache_aware``: scores each server by ``matched_tokens / padded_tokens - active_requests / max_batch_size``
  over chained hashes of the prompt's full ``tokens_per_block`` blocks. TensorRT-LLM learns which blocks a worker
  holds by polling its ``/kv_cache_events``; the stand-in's router remembers the blocks of the prompts each server
  has completed instead (the stand-in workers keep no reusable KV cache).

``get_next_server`` returns ``(server, info)``; every server it returns must be handed back with
``finish_request(server, ...)``.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict


class Router:
    def __init__(self, servers: list[str], args: dict | None = None, dynamic: bool = False):
        if not servers and not dynamic:
            raise ValueError("a router needs at least one server")
        self.servers = list(servers)
        self.args = dict(args or {})
        self.active = {s: 0 for s in self.servers}
        self.active_tokens = {s: 0 for s in self.servers}
        self._next = 0

    def _rotate(self, candidates: list[str]) -> str:
        """The first candidate at or after the round-robin cursor."""
        n = len(self.servers)
        for k in range(n):
            s = self.servers[(self._next + k) % n]
            if s in candidates:
                self._next = (self.servers.index(s) + 1) % n
                return s
        return candidates[0]

    def _take(self, server: str, tokens: int) -> str:
        self.active[server] += 1
        self.active_tokens[server] += tokens
        return server

    def choose(self, token_ids: list[int] | None, exclude: str | None) -> tuple[str, dict]:
        raise NotImplementedError

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
            self._next = self._next % len(self.servers) if self.servers else 0

    def get_next_server(self, token_ids: list[int] | None = None, exclude: str | None = None) -> tuple[str, dict]:
        if not self.servers:
            raise LookupError("no server is registered")
        server, info = self.choose(token_ids, exclude)
        return self._take(server, len(token_ids or ())), info

    def finish_request(self, server: str, token_ids: list[int] | None = None, ok: bool = True) -> None:
        self.active[server] = max(0, self.active.get(server, 0) - 1)
        self.active_tokens[server] = max(0, self.active_tokens.get(server, 0) - len(token_ids or ()))

    def _candidates(self, exclude):
        c = [s for s in self.servers if s != exclude]
        return c or list(self.servers)


class RoundRobinRouter(Router):
    def choose(self, token_ids, exclude):
        return self._rotate(self._candidates(exclude)), {}


class LoadBalancingRouter(Router):
    def choose(self, token_ids, exclude):
        load = self.active_tokens if self.args.get("use_tokens") else self.active
        cands = self._candidates(exclude)
        least = min(load[s] for s in cands)
        return self._rotate([s for s in cands if load[s] == least]), {}


def block_hashes(token_ids: list[int], tokens_per_block: int) -> list[bytes]:
    out, prev = [], b""
    for i in range(len(token_ids) // tokens_per_block):
        block = token_ids[i * tokens_per_block:(i + 1) * tokens_per_block]
        prev = hashlib.blake2b(prev + b"".join(t.to_bytes(4, "little") for t in block), digest_size=12).digest()
        out.append(prev)
    return out


class KvCacheAwareRouter(Router):
    MAX_BLOCKS_PER_SERVER = 200_000

    def __init__(self, servers, args=None, dynamic=False):
        super().__init__(servers, args, dynamic)
        env = os.environ.get("TRTLLM_KVCACHE_AWARE_ROUTER_HASH_TOKENS_PER_BLOCK")
        self.tokens_per_block = int(env or self.args.get("tokens_per_block") or 32)
        self.max_batch_size = int(self.args.get("max_batch_size") or 64)
        self.blocks: dict[str, OrderedDict] = {s: OrderedDict() for s in self.servers}

    def add_server(self, server: str) -> None:
        super().add_server(server)
        self.blocks.setdefault(server, OrderedDict())

    def matched_tokens(self, server: str, hashes: list[bytes]) -> int:
        known = self.blocks.get(server, {})
        n = 0
        for h in hashes:
            if h not in known:
                break
            n += 1
        return n * self.tokens_per_block

    def choose(self, token_ids, exclude):
        tokens = list(token_ids or [])
        hashes = block_hashes(tokens, self.tokens_per_block)
        padded = max(1, -(-len(tokens) // self.tokens_per_block) * self.tokens_per_block)
        best, best_score, best_match = None, None, 0
        for s in self._rotation(self._candidates(exclude)):
            match = self.matched_tokens(s, hashes)
            score = match / padded - self.active[s] / self.max_batch_size
            if best_score is None or score > best_score:
                best, best_score, best_match = s, score, match
        self._next = (self.servers.index(best) + 1) % len(self.servers)
        return best, {"matches": [best_match], "token_lists": [tokens]}

    def _rotation(self, cands):
        n = len(self.servers)
        order = [self.servers[(self._next + k) % n] for k in range(n)]
        return [s for s in order if s in cands]

    def finish_request(self, server, token_ids=None, ok=True):
        super().finish_request(server, token_ids, ok)
        if ok and token_ids and server in self.blocks:
            known = self.blocks[server]
            for h in block_hashes(list(token_ids), self.tokens_per_block):
                known[h] = True
                known.move_to_end(h)
            while len(known) > self.MAX_BLOCKS_PER_SERVER:
                known.popitem(last=False)


def create_router(config: dict, servers: list[str], dynamic: bool = False) -> Router:
    cfg = dict(config or {})
    kind = cfg.pop("type", "round_robin")
    classes = {"round_robin": RoundRobinRouter, "load_balancing": LoadBalancingRouter,
               "kv_cache_aware": KvCacheAwareRouter}
    if kind not in classes:
        raise ValueError(f"Unsupported router type: {kind}. Supported types are: {list(classes)}")
    return classes[kind](servers, cfg, dynamic)
