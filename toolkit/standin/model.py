"""The stand-in's "model": a deterministic tokenizer, KV content and token stream (tk CPU stand-in, not TensorRT-LLM).

Nothing here is a neural network. The contract the rest of the stand-in relies on:

- ``encode(text)`` splits on whitespace; a word the stand-in generates (``decode_token(i)``) encodes back to ``i``,
  any other word is hashed into the vocabulary of ``VOCAB_SIZE`` ids. So an answer sent back as text in the next
  turn re-tokenizes to the ids that were generated, as a real tokenizer does for ordinary text (what makes its KV
  reusable; the ``retokenize`` test fault breaks that on purpose, inference-perf #649's failure);
  ``chat_prompt(messages)`` is the concatenation of the messages in one fixed template.
- ``kv_content(geometry, token_ids)`` is the KV cache of a prompt: ``num_layers x n x bytes_per_token_per_layer``
  bytes (uint8), a pure function of the token ids *and their prefix* (token t's rows depend on tokens 0..t, like
  causal attention), computed with numpy.
- ``kv_digest(kv)`` hashes those bytes in canonical order (layer-major, token rows 0..n-1, no padding).
- ``token_stream(digest, last_prompt_token)`` yields the generated ids: token i is a hash of the digest, the
  position i and token i-1. The context server emits token 0 from its own KV; the generation server continues
  from the digest of the KV bytes **it received**; the aggregated server does both from its local KV. So a
  disaggregated answer equals the aggregated one exactly when the KV arrived intact.
- ``decode_token(id)`` is a readable pseudo-word; the text of a completion is ``"".join(" " + word)``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from toolkit.facts.models import ModelSpec

VOCAB_SIZE = 32000
_MASK = (1 << 64) - 1
_K1 = 0x9E3779B97F4A7C15
_K2 = 0xBF58476D1CE4E5B9
_K3 = 0x94D049BB133111EB

_CONSONANTS = "bdfghjklmnprstvz"  # 16
_VOWELS = "aeiou"  # 5 -> 80 syllables
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]


@dataclass(frozen=True)
class KvLayout:
    """What one token's KV cache looks like on this server (the whole model, every layer)."""

    model: str
    attention: str  # "gqa" | "mla"
    num_layers: int
    bytes_per_token_per_layer: int
    tokens_per_block: int
    kv_dtype: str

    @property
    def bytes_per_token(self) -> int:
        return self.num_layers * self.bytes_per_token_per_layer

    @property
    def block_bytes(self) -> int:
        """One block of one layer: tokens_per_block rows."""
        return self.tokens_per_block * self.bytes_per_token_per_layer

    def to_dict(self) -> dict:
        return {"model": self.model, "attention": self.attention, "num_layers": self.num_layers,
                "bytes_per_token_per_layer": self.bytes_per_token_per_layer,
                "bytes_per_token": self.bytes_per_token, "tokens_per_block": self.tokens_per_block,
                "kv_dtype": self.kv_dtype}


def geometry(model: ModelSpec, tokens_per_block: int, kv_dtype: str) -> KvLayout:
    """KV bytes per token per layer, by the formula tk's plan uses (GQA: 2 x kv_heads x head_dim; MLA: the latent)."""
    per_layer = model.kv_bytes_per_token_per_layer(kv_dtype)
    return KvLayout(model=model.name, attention=model.attention, num_layers=model.num_layers,
                      bytes_per_token_per_layer=max(1, int(per_layer)), tokens_per_block=tokens_per_block,
                      kv_dtype=kv_dtype)


# --- tokenizer ----------------------------------------------------------------------------------------

def _h64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


_GENERATED: dict[str, int] = {}
# Every word's id, the generated words' and those of words seen since (hashed): a prompt's words recur (a corpus, a
# chat's history), and hashing each one again cost about 3 ms per 2048-word prompt on the 2-core development box,
# paid by the proxy and by the context server before the emulated prefill even starts (a real tokenizer takes a few
# hundred microseconds there). Bounded: past LEARNED_WORDS_MAX learned words a new word is hashed every time.
_WORD_IDS: dict[str, int] = {}
LEARNED_WORDS_MAX = 1 << 16


def _generated_words() -> dict[str, int]:
    if not _GENERATED:
        _GENERATED.update((decode_token(i), i) for i in range(VOCAB_SIZE))
    return _GENERATED


def _word_ids() -> dict[str, int]:
    if not _WORD_IDS:
        _WORD_IDS.update(_generated_words())
    return _WORD_IDS


def encode(text: str) -> list[int]:
    words = text.split()
    known = _word_ids()
    ids = list(map(known.get, words))
    if None in ids:  # words not seen yet: hashed into the vocabulary, remembered while the bound allows
        for k, i in enumerate(ids):
            if i is None:
                ids[k] = i = _h64(words[k].encode("utf-8")) % VOCAB_SIZE
                if len(known) < VOCAB_SIZE + LEARNED_WORDS_MAX:
                    known[words[k]] = i
    return ids  # type: ignore[return-value]  (every None replaced)


def message_text(m: dict) -> str:
    """A message's text: its content, or the text parts of a content list."""
    content = m.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content or ""


def chat_prompt(messages: list) -> str:
    """The fixed chat template: ``<|role|> content`` per message, then ``<|assistant|>``."""
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            raise TypeError("each message must be an object with role and content")
        parts.append(f"<|{m.get('role', 'user')}|> {message_text(m)}")
    parts.append("<|assistant|>")
    return "\n".join(parts)


def decode_token(token_id: int) -> str:
    n = len(_SYLLABLES)
    a, b, c = token_id % n, (token_id // n) % n, token_id // (n * n)
    return _SYLLABLES[a] + _SYLLABLES[b] + (_SYLLABLES[c % n] if c else "")


def decode(token_ids) -> str:
    return "".join(" " + decode_token(t) for t in token_ids)


RETOKENIZE_MARK = "\u02bc"  # the ``retokenize`` test fault: a modifier apostrophe after every generated word


def answer_word(token_id: int, retokenize_fault: bool = False) -> str:
    """The text of one generated token as the server streams it. With the ``retokenize`` fault the word carries a
    mark, so the text still counts one token per word but encodes to other ids (an answer that does not
    round-trip through the tokenizer, as a harmony-format model's cannot: inference-perf #649)."""
    return decode_token(token_id) + (RETOKENIZE_MARK if retokenize_fault else "")


# --- KV content ---------------------------------------------------------------------------------------

def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(_K2)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(_K3)
    return x ^ (x >> np.uint64(31))


def _prefix_hashes(model: str, token_ids) -> np.ndarray:
    h = _h64(model.encode())
    out = np.empty(len(token_ids), dtype=np.uint64)
    for t, tok in enumerate(token_ids):
        h = ((h ^ ((tok + 1) * _K1)) * _K2 + t) & _MASK
        h ^= h >> 29
        out[t] = h
    return out


def kv_content(geo: KvLayout, token_ids) -> np.ndarray:
    """The KV cache of a prompt: uint8 array (num_layers, n, bytes_per_token_per_layer)."""
    n = len(token_ids)
    words = -(-geo.bytes_per_token_per_layer // 8)
    with np.errstate(over="ignore"):
        h = _prefix_hashes(geo.model, token_ids)
        layer = (np.arange(1, geo.num_layers + 1, dtype=np.uint64) * np.uint64(_K3))[:, None, None]
        col = (np.arange(1, words + 1, dtype=np.uint64) * np.uint64(_K1))[None, None, :]
        x = _mix(h[None, :, None] ^ layer ^ col)
    raw = x.view(np.uint8).reshape(geo.num_layers, n, words * 8)
    return raw[:, :, :geo.bytes_per_token_per_layer]


def kv_digest(kv: np.ndarray) -> bytes:
    """16-byte digest of KV bytes in canonical order (layer-major, token rows, no padding)."""
    return hashlib.blake2b(np.ascontiguousarray(kv).data, digest_size=16).digest()


def next_token(digest: bytes, position: int, prev: int) -> int:
    d = int.from_bytes(digest[:8], "little") ^ int.from_bytes(digest[8:], "little")
    x = (d ^ ((position + 1) * _K1) ^ ((prev + 7) * _K2)) & _MASK
    x = ((x ^ (x >> 30)) * _K2) & _MASK
    x = ((x ^ (x >> 27)) * _K3) & _MASK
    x ^= x >> 31
    return x % VOCAB_SIZE


def choice_digest(digest: bytes, index: int) -> bytes:
    """The seed of choice ``index`` of an ``n > 1`` request (choice 0 is the request's own digest)."""
    if index == 0:
        return digest
    return hashlib.blake2b(digest + index.to_bytes(4, "little"), digest_size=16).digest()


def top_logprobs(position: int, prev: int, token: int, k: int) -> list[tuple[int, float]]:
    """The ``max(k, 1)`` most likely tokens at ``position`` (after ``prev``) with their log-probabilities.

    Deterministic from (position, prev, token) only, so an aggregated server and a generation server that continues
    a context server's first token give the same values. The generated token is the most likely one (greedy), every
    value is finite and <= 0, the list is sorted by decreasing log-probability, and the probabilities sum to < 1.
    """
    x = next_token(b"\x5a" * 16, position, prev * VOCAB_SIZE + token)
    best = -0.5 - (x % 1000) / 1000.0  # log p of the chosen token, in (-1.5, -0.5]
    out = [(token, best)]
    seen = {token}
    j = 1
    while len(out) < max(k, 1):
        alt = next_token(b"\xa5" * 16, position * 64 + j, prev ^ token)
        j += 1
        if alt in seen:
            continue
        seen.add(alt)
        out.append((alt, best - 0.5 - 1.0 * len(out) - (alt % 97) / 1000.0))
    return out


def generate(digest: bytes, last_prompt_token: int, count: int, first: int | None = None) -> list[int]:
    """The first ``count`` tokens of the stream; ``first`` overrides token 0 (the context server's first token)."""
    out = []
    prev = last_prompt_token
    for i in range(count):
        tok = first if (i == 0 and first is not None) else next_token(digest, i, prev)
        out.append(tok)
        prev = tok
    return out
