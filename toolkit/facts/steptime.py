"""Iteration times from aiconfigurator's per-operation data, as a table: built once, read every iteration (pure).

What the CPU stand-in's emulated timing sleeps when aiconfigurator has data for the emulated GPU and TensorRT-LLM
line (``toolkit.standin.emulate``); never a measurement. ``build(engine, ...)`` asks aiconfigurator's compiled
engine (``toolkit.size.aiconfigurator.StepEngine``, the one adapter) for the parts of an iteration on a grid once,
at server start (about a second); ``StepTable.seconds(shape)`` then interpolates in microseconds of pure Python.

An iteration is what aiconfigurator's forward-pass model reads (the Dynamo mocker's ``ForwardPassMetrics``,
aic-core/rust/aiconfigurator-core/src/fpm/metrics.rs at 095f58a): the prefill requests, the new tokens they compute,
the KV tokens they already hold (a reused prefix, earlier chunks), the decoding requests and their KV tokens.
Its time, as that model composes it (``Engine::rank_latency_ms`` in src/engine/runtime.rs, ``get_mix_step_ops`` in
src/session.rs), per request on averages (n prefills of t new tokens after p, m decodes of k KV tokens):

- prefill only: the context operations at batch n, t new tokens after p: ``S(n·t) + R(n) + A(n, t) + C(n, t, p)``;
- decode only: one generation step: ``N(m) + G(m, k)``;
- both: ``S(n·t + m) + A(n, t) + C(n, t, p) + G(m, k)``: the non-attention work once over every token,
  context attention at the prefill shape, generation attention at the decode shape;

with the parts as ``StepTable`` names them (S, R, A, C: context phase; N, G: generation phase). For a model whose
attention sits outside aiconfigurator's "context_attention" operation (MLA's module), what a prefix adds is still
C (the difference it makes to the whole context phase).

Grids (``octaves``): batch, tokens and KV every integer to 8, then in each octave 2^k, 2^k + 1 and quarter steps (the
GEMM data steps just past powers of two), up to max_batch_size, max_num_tokens, max_seq_len; C on coarser axes
for batch (×√2) and tokens (×2), where it is smooth (attention only), and quarter octaves of prefix 0, 16, 19, 23,
... max_seq_len, where it is not (Qwen3-30B-A3B on H200, 9 x 818 new tokens: 93 ms at 8192 cached, 111 at 10000,
137 at 11600). Between grid points the
value is piecewise linear along each axis (multilinear), extrapolated linearly past the last point. Attention DP of d
ranks: TensorRT-LLM places whole requests on ranks, so the busiest rank is timed: ceil(r / d) of the r prefills at
their mean length and prefix, ceil(m / d) of the m decodes at their mean KV length (one 2048-token prompt at d = 8
takes as long as at d = 1).
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right
from dataclasses import dataclass, field


@dataclass(frozen=True)
class IterationShape:
    """One iteration's scheduled work (aiconfigurator's ForwardPassMetrics ``scheduled_requests``)."""

    prefill_requests: int = 0
    prefill_tokens: int = 0  # new tokens computed for them
    prefill_kv_tokens: int = 0  # KV tokens they hold before this iteration (cached prefix, earlier chunks)
    decode_requests: int = 0
    decode_kv_tokens: int = 0  # their KV lengths summed (the token each writes now included)

    @property
    def computed_tokens(self) -> int:
        return self.prefill_tokens + self.decode_requests

    @property
    def kv_tokens_read(self) -> int:
        """Every KV token the iteration's attention reads (the roofline's memory term)."""
        return self.prefill_kv_tokens + self.prefill_tokens + self.decode_kv_tokens


def axis(limit: int, *, first: int = 1, factor: float = math.sqrt(2.0), dense_to: int = 0) -> tuple:
    """Grid points from ``first`` to ``limit`` (both included): every integer up to ``dense_to``, then each point
    ``factor`` times the last (rounded, distinct)."""
    limit = max(int(limit), first + 1)
    points = list(range(first, min(dense_to, limit) + 1)) or [first]
    y = float(points[-1])
    while True:
        y *= factor
        v = int(round(y))
        if v >= limit:
            break
        if v > points[-1]:
            points.append(v)
    if points[-1] != limit:
        points.append(limit)
    return tuple(points)


def octaves(limit: int, per_octave: int = 4, dense_to: int = 8) -> tuple:
    """Grid points 1..``limit``: every integer up to ``dense_to``, then in each octave [2^k, 2^(k+1)) the points
    2^k, 2^k + 1 and 2^k·(1 + j/per_octave). aiconfigurator's GEMM data steps just past each power of two (a tile
    boundary: Llama-3.1-8B on H100, 512 → 528 tokens of non-attention work: 11.5 → 12.3 ms), which the
    2^k / 2^k + 1 pair keeps instead of smearing it over the octave."""
    limit = max(int(limit), 2)
    points = set(range(1, min(dense_to, limit) + 1))
    base = 1
    while base <= limit:
        if base >= dense_to:
            points.add(base)
            points.add(base + 1)
            points.update(base + base * j // per_octave for j in range(1, per_octave))
        base *= 2
    points.add(limit)
    return tuple(sorted(p for p in points if p <= limit))


def steps(limit: int) -> tuple:
    """Dense 1-D grid 1..``limit``: every integer to 64, every 8 to 1024, every 32 beyond (and ``limit``), and the
    point just past each multiple of 32 to 1024 and of 256 beyond (every power of two among them). For the
    one-dimensional parts (S over tokens, N and R over batch): aiconfigurator's GEMM data is uneven at the percent
    level between its own sample points (Llama-3.1-8B on H100: S is 53.3 ms at 2560 tokens, 53.2 at 2624), so these
    are sampled, not smoothed; and it steps just past them (Llama-3.3-70B TP4 on H100: S is 130.6 ms at 2048 tokens,
    138.4 at 2049; steps of 0.4 to 8 % seen at multiples of 16 to 256 tokens and of 256 to 4096), which the pair
    p, p + 1 keeps instead of smearing it over the next cell."""
    limit = max(int(limit), 2)
    points = set(range(1, min(64, limit) + 1))
    points.update(range(72, min(1024, limit) + 1, 8))
    points.update(range(1056, limit + 1, 32))
    points.update(p + 1 for p in range(64, min(1024, limit), 32))
    points.update(p + 1 for p in range(1024, limit, 256))
    points.add(limit)
    return tuple(sorted(points))


def _locate(points: tuple, x: float) -> tuple[int, float]:
    """Cell index i and weight w with x = points[i] + w (points[i+1] - points[i]); w < 0 never (clamped at the
    start), w > 1 past the end (linear extrapolation from the last cell)."""
    if x <= points[0]:
        return 0, 0.0
    if x >= points[-1]:
        i = len(points) - 2
    else:
        i = bisect_right(points, x) - 1
    return i, (x - points[i]) / (points[i + 1] - points[i])


def interp1(xs: tuple, values: tuple, x: float) -> float:
    i, w = _locate(xs, x)
    return values[i] + w * (values[i + 1] - values[i])


def interp2(xs: tuple, ys: tuple, values: tuple, x: float, y: float) -> float:
    """values[i * len(ys) + j] at (xs[i], ys[j]); bilinear."""
    i, u = _locate(xs, x)
    j, v = _locate(ys, y)
    n = len(ys)
    a, b = values[i * n + j], values[i * n + j + 1]
    c, d = values[(i + 1) * n + j], values[(i + 1) * n + j + 1]
    lo = a + v * (b - a)
    hi = c + v * (d - c)
    return lo + u * (hi - lo)


def interp3(xs: tuple, ys: tuple, zs: tuple, values: tuple, x: float, y: float, z: float) -> float:
    """values[(i * len(ys) + j) * len(zs) + k] at (xs[i], ys[j], zs[k]); trilinear."""
    i, u = _locate(xs, x)
    j, v = _locate(ys, y)
    k, w = _locate(zs, z)
    ny, nz = len(ys), len(zs)

    def at(a: int, b: int) -> float:
        base = (a * ny + b) * nz + k
        return values[base] + w * (values[base + 1] - values[base])
    lo = at(i, j) + v * (at(i, j + 1) - at(i, j))
    hi = at(i + 1, j) + v * (at(i + 1, j + 1) - at(i + 1, j))
    return lo + u * (hi - lo)


@dataclass(frozen=True)
class StepTable:
    """aiconfigurator's parts of an iteration on grids, in milliseconds; ``seconds(shape)`` is the iteration's time.

    Its composition (checked against aiconfigurator's own per-phase sums: the parts add up exactly, see build):
    ``S(x)`` the context phase's non-attention operations over x tokens at batch 1 (GEMMs, TP all-reduce, MoE and
    its dispatch, norms: pass 1 of a mixed iteration), ``R(n)`` what a prefill batch of n adds to it (the logits
    GEMM over n rows), ``A(n, t)`` context attention of n requests of t tokens with nothing cached, ``C(n, t, p)``
    what p cached tokens per request add (attention only), ``N(m)`` the generation phase's non-attention
    operations at batch m, ``G(m, k)`` generation attention of m requests of k KV tokens."""

    describe: str  # what is timed: model, layout, quant modes
    source: str  # where the figures come from (aiconfigurator version, system, TensorRT-LLM data version)
    tokens: tuple  # x axis of S (``steps``)
    batch_dense: tuple  # n axis of R, m axis of N (``steps``)
    batch: tuple  # n axis of A, m axis of G (``octaves``)
    new_tokens: tuple  # t axis of A
    kv: tuple  # k axis of G
    batch_coarse: tuple  # C's axes: attention only, smooth
    tokens_coarse: tuple
    prefix: tuple  # p: 0 first
    shared_ms: tuple  # S[x]
    prefill_batch_ms: tuple  # R[n]
    context_attention_ms: tuple  # A[n][t]
    prefix_ms: tuple  # C[n][t][p]
    decode_shared_ms: tuple  # N[m]
    decode_attention_ms: tuple  # G[m][k]
    attention_dp: int = 1
    build_s: float = 0.0
    notes: tuple = field(default_factory=tuple)

    def _attention(self, n: float, t: float, p: float) -> float:
        a = interp2(self.batch, self.new_tokens, self.context_attention_ms, n, t)
        if p > 0:
            a += interp3(self.batch_coarse, self.tokens_coarse, self.prefix, self.prefix_ms, n, t, p)
        return max(0.0, a)

    def prefill(self, n: float, t: float, p: float) -> float:
        """n requests computing t new tokens each after p already in their KV: a prefill-only iteration."""
        return (interp1(self.tokens, self.shared_ms, n * t) + interp1(self.batch_dense, self.prefill_batch_ms, n)
                + self._attention(n, t, p))

    def decode(self, m: float, k: float) -> float:
        """One decode step of m requests of k KV tokens each: a decode-only iteration."""
        return (interp1(self.batch_dense, self.decode_shared_ms, m)
                + interp2(self.batch, self.kv, self.decode_attention_ms, m, k))

    def milliseconds(self, shape: IterationShape) -> float:
        r, m = shape.prefill_requests, shape.decode_requests
        tokens, prefix, kv = shape.prefill_tokens, shape.prefill_kv_tokens, shape.decode_kv_tokens
        d = self.attention_dp
        if d > 1:  # the busiest rank: whole requests go to ranks, ceil(r / d) of them of the mean length on one
            n, md = -(-r // d), -(-m // d)
            if r:
                tokens, prefix = tokens * n / r, prefix * n / r
            if m:
                kv = kv * md / m
            r, m = n, md
        prefill = r > 0 and tokens > 0
        decode = m > 0
        if not prefill:
            return self.decode(m, max(1.0, kv / m)) if decode else 0.0
        t, p = tokens / r, prefix / r
        if not decode:
            return self.prefill(r, t, p)
        k = max(1.0, kv / m)
        return (interp1(self.tokens, self.shared_ms, tokens + m) + self._attention(r, t, p)
                + interp2(self.batch, self.kv, self.decode_attention_ms, m, k))

    def seconds(self, shape: IterationShape) -> float:
        return self.milliseconds(shape) / 1e3

    def summary(self) -> dict:
        def span(points: tuple) -> list:
            return [points[0], points[-1], len(points)]
        parts = (self.shared_ms, self.prefill_batch_ms, self.context_attention_ms, self.prefix_ms,
                 self.decode_shared_ms, self.decode_attention_ms)
        return {"describe": self.describe, "source": self.source, "attention_dp": self.attention_dp,
                "grid": {"tokens": span(self.tokens), "batch": span(self.batch), "kv": span(self.kv),
                         "prefix": span(self.prefix)},
                "points": sum(len(v) for v in parts), "build_s": round(self.build_s, 3), "notes": list(self.notes)}


REFERENCE_TOKENS = 16  # R(n) and N(m) are read at one shape: they do not depend on it (the parts add up exactly)


def build(engine, *, max_batch_size: int, max_num_tokens: int, max_seq_len: int, attention_dp: int = 1,
          source: str = "") -> StepTable:
    """Query ``engine`` (``toolkit.size.aiconfigurator.StepEngine``: prefill_ms, decode_ms, shared_ms,
    context_attention_ms, decode_attention_ms) on the grids a server with these limits needs: up to
    max_batch_size requests (under attention DP of d ranks, ceil(max_batch_size / d) per rank), at most
    max_num_tokens tokens computed per iteration, KV up to max_seq_len."""
    t0 = time.monotonic()
    d = max(1, attention_dp)
    per_rank = max(2, -(-max_batch_size // d))
    budget = max(2, max_num_tokens)
    tokens, batch_dense, batch = steps(budget + per_rank), steps(per_rank), octaves(per_rank)
    new_tokens, kv = octaves(budget), octaves(max(2, max_seq_len))
    batch_coarse, tokens_coarse = axis(per_rank, dense_to=4), axis(budget, dense_to=2, factor=2.0)
    prefix = (0,) + axis(max(32, max_seq_len), first=16, factor=2 ** 0.25)
    ref = REFERENCE_TOKENS
    shared = tuple(engine.shared_ms(x) for x in tokens)
    ctx_attn = tuple(engine.context_attention_ms(n, t) for n in batch for t in new_tokens)
    prefill_batch = tuple(engine.prefill_ms(n, ref, 0) - engine.shared_ms(n * ref) - engine.context_attention_ms(n, ref)
                          for n in batch_dense)
    cached = tuple(engine.prefill_ms(n, t, p) - engine.prefill_ms(n, t, 0) if p else 0.0
                   for n in batch_coarse for t in tokens_coarse for p in prefix)
    dec_attn = tuple(engine.decode_attention_ms(m, k) for m in batch for k in kv)
    dec_shared = tuple(engine.decode_ms(m, ref) - engine.decode_attention_ms(m, ref) for m in batch_dense)
    parts = {"S": shared, "A": ctx_attn, "G": dec_attn, "N": dec_shared}
    bad = [(k, v) for k, part in parts.items() for v in part if not (math.isfinite(v) and v >= 0)]
    bad += [("R/C", v) for v in prefill_batch + cached if not math.isfinite(v)]
    if bad:
        raise ValueError(f"aiconfigurator returned {len(bad)} unusable times (e.g. {bad[0][0]} = {bad[0][1]!r})")
    return StepTable(describe=getattr(engine, "describe", ""), source=source, tokens=tokens, batch_dense=batch_dense,
                     batch=batch,
                     new_tokens=new_tokens, kv=kv, batch_coarse=batch_coarse, tokens_coarse=tokens_coarse,
                     prefix=prefix, shared_ms=shared, prefill_batch_ms=prefill_batch, context_attention_ms=ctx_attn,
                     prefix_ms=cached, decode_shared_ms=dec_shared, decode_attention_ms=dec_attn, attention_dp=d,
                     build_s=time.monotonic() - t0, notes=tuple(getattr(engine, "notes", ())))
