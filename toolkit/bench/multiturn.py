"""Multi-turn reuse, turn by turn, from what the servers reported for every request. Pure: records in, tables out.

A conversation's turn t resends its history: every earlier prompt and answer, then the new message. With a chat
template that keeps earlier turns verbatim, turn t-1's prompt (``P``, its server-reported ``prompt_tokens``) and
its answer (``C``, ``completion_tokens``) are the first ``P + C`` tokens of turn t's prompt. So, per request:

- **reusable** (theoretical, an infinite cache on one server): ``P + C`` of the previous turn, split into
  **earlier answers** (the sum of every earlier ``C``: each answer k sits at ``[P_k, P_k + C_k)``) and **earlier
  prompts** (the rest: messages and template);
- **cached**: the server's ``usage.prompt_tokens_details.cached_tokens``; the part inside the history is what was
  reused of it (more is a prompt seen before, e.g. the warm-up's, counted apart as ``cached_outside_history``);
- **recomputed**: reusable - cached (within the history), and its **answer** part: the answer spans the cache did
  not cover, ``sum_k |[P_k, P_k + C_k) \\ [0, cached)|``; the rest is recomputed prompt tokens.

Sessions are told apart by aiperf's per-session correlation id (the dataset's conversation id repeats when aiperf
samples a conversation again). A session whose earlier turn failed or was not recorded contributes from its first
recorded turn only. Turns are numbered from 1.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from toolkit.bench.results import Record

REUSE_FLOOR = 0.5  # reuse below this share of the theoretical (turns >= 2) is called far below it


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), None for no values."""
    vals = sorted(v for v in values if v is not None and math.isfinite(v))
    if not vals:
        return None
    pos = (len(vals) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


@dataclass
class RequestReuse:
    """One request's reuse, all in tokens."""

    session: str
    turn: int  # 1-based
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    reusable_tokens: int
    reusable_answer_tokens: int
    recomputed_tokens: int | None
    recomputed_answer_tokens: int | None
    cached_outside_history: int | None
    ttft_ms: float | None
    history_is_prefix: bool = True
    answer_retokenized: int | None = None  # the previous answer as aiperf re-tokenized its text (its OSL)
    answer_generated: int | None = None  # ... and as the server counted its generated tokens


def _mean(values) -> float | None:
    vals = [v for v in values if v is not None]
    return round(sum(vals) / len(vals), 2) if vals else None


@dataclass
class TurnRow:
    turn: int
    requests: int
    prompt_tokens: float | None
    cached_tokens: float | None
    reusable_tokens: float | None
    reusable_prompt_tokens: float | None
    reusable_answer_tokens: float | None
    recomputed_tokens: float | None
    recomputed_prompt_tokens: float | None
    recomputed_answer_tokens: float | None
    cached_outside_history: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    kv_bytes_moved: float | None = None  # computed: prompt tokens x KV bytes/token x the share that moved KV
    totals: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def request_reuse(records: list[Record]) -> list[RequestReuse]:
    """Every successful profiled request with its reuse figures, in session and turn order."""
    sessions: dict[str, list[Record]] = {}
    for r in records:
        if r.phase != "profiling" or not r.ok or r.prompt_tokens is None:
            continue
        sessions.setdefault(r.session or r.conversation, []).append(r)
    out = []
    for sid, recs in sessions.items():
        recs.sort(key=lambda r: r.turn)
        answers: list[tuple[int, int]] = []  # (start, length) of every earlier answer in this session
        prev: Record | None = None
        for r in recs:
            contiguous = prev is not None and r.turn == prev.turn + 1 and prev.completion_tokens is not None
            if not contiguous:
                answers = []  # the history before this turn is unknown: count from here
                reusable = 0
            else:
                answers.append((prev.prompt_tokens, prev.completion_tokens))
                reusable = prev.prompt_tokens + prev.completion_tokens
            prefix_ok = r.prompt_tokens >= reusable
            reusable_answer = sum(n for _, n in answers)
            cached = r.cached_tokens
            if cached is None:
                rec = rec_ans = outside = None
            else:
                within = min(cached, reusable)
                rec = reusable - within
                rec_ans = sum(max(0, s + n - max(s, within)) for s, n in answers)
                outside = max(0, cached - reusable)
            out.append(RequestReuse(
                session=sid, turn=r.turn + 1, prompt_tokens=r.prompt_tokens,
                completion_tokens=r.completion_tokens or 0, cached_tokens=cached, reusable_tokens=reusable,
                reusable_answer_tokens=reusable_answer, recomputed_tokens=rec, recomputed_answer_tokens=rec_ans,
                cached_outside_history=outside, ttft_ms=r.ttft_ms, history_is_prefix=prefix_ok,
                answer_retokenized=prev.osl if contiguous else None,
                answer_generated=prev.completion_tokens if contiguous else None))
            prev = r
    return out


def turn_table(reqs: list[RequestReuse], *, cached_trusted: bool = True, kv_bytes_per_token: float | None = None,
               kv_moved_share: float | None = None) -> list[TurnRow]:
    """Per turn: means per request (tokens), TTFT percentiles, and sums in ``totals``. ``cached_trusted`` False
    (the reported cached_tokens is not the context server's reuse) leaves cached and recomputed unknown."""
    rows = []
    for turn in sorted({r.turn for r in reqs}):
        rs = [r for r in reqs if r.turn == turn]

        def col(attr, trusted=True, rs=rs):
            if not trusted:
                return []
            return [getattr(r, attr) for r in rs]
        ok = cached_trusted
        recomputed = col("recomputed_tokens", ok)
        rec_ans = col("recomputed_answer_tokens", ok)
        rec_prompt = [a - b for a, b in zip(recomputed, rec_ans) if a is not None and b is not None]
        reusable = col("reusable_tokens")
        reusable_ans = col("reusable_answer_tokens")
        prompt = col("prompt_tokens")
        kv = None
        if kv_bytes_per_token and kv_moved_share is not None:
            kv = round(sum(prompt) / len(rs) * kv_bytes_per_token * kv_moved_share, 1)
        totals = {"prompt_tokens": sum(prompt), "reusable_tokens": sum(reusable),
                  "reusable_answer_tokens": sum(reusable_ans)}
        if ok and all(v is not None for v in recomputed):
            totals.update(cached_tokens=sum(r.cached_tokens for r in rs), recomputed_tokens=sum(recomputed),
                          recomputed_answer_tokens=sum(rec_ans),
                          cached_in_history=sum(min(r.cached_tokens, r.reusable_tokens) for r in rs))
        rows.append(TurnRow(
            turn=turn, requests=len(rs), prompt_tokens=_mean(prompt),
            cached_tokens=_mean(col("cached_tokens", ok)) if ok else None, reusable_tokens=_mean(reusable),
            reusable_prompt_tokens=_mean([a - b for a, b in zip(reusable, reusable_ans)]),
            reusable_answer_tokens=_mean(reusable_ans), recomputed_tokens=_mean(recomputed) if ok else None,
            recomputed_prompt_tokens=_mean(rec_prompt) if ok else None,
            recomputed_answer_tokens=_mean(rec_ans) if ok else None,
            cached_outside_history=_mean(col("cached_outside_history", ok)) if ok else None,
            ttft_p50_ms=_round(percentile([r.ttft_ms for r in rs], 50)),
            ttft_p99_ms=_round(percentile([r.ttft_ms for r in rs], 99)), kv_bytes_moved=kv, totals=totals))
    return rows


def _round(v, nd=3):
    return round(v, nd) if isinstance(v, float) else v


def cached_is_whole_prompt(reqs: list[RequestReuse]) -> bool:
    """True when first turns report (nearly) the whole prompt as cached: what TensorRT-LLM's generation worker
    reports before PR #13620 (its KV arrived by transfer), not a context server's reuse."""
    first = [r for r in reqs if r.reusable_tokens == 0 and r.cached_tokens is not None]
    if len(first) < 2:
        return False
    whole = [r for r in first if r.cached_tokens >= r.prompt_tokens - 1]
    return len(whole) >= 0.9 * len(first)


def reuse_share(reqs: list[RequestReuse]) -> float | None:
    """Cached within the history / reusable, over turns >= 2 (None when nothing was reusable or reported)."""
    later = [r for r in reqs if r.reusable_tokens > 0 and r.cached_tokens is not None]
    reusable = sum(r.reusable_tokens for r in later)
    if not reusable:
        return None
    return sum(min(r.cached_tokens, r.reusable_tokens) for r in later) / reusable
