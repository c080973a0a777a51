"""What a multi-turn traffic shape recomputes on the context servers of a disaggregated deployment. Pure.

A conversation of ``turns`` turns, each a new message of ``message`` tokens and an answer of ``answer`` tokens,
resends its history every turn: turn t's prompt is ``t x message + (t - 1) x answer`` tokens. Three ways to serve
it (``docs/multiturn.md``):

- **no reuse** (round robin over several context servers, or block reuse off): every turn prefills its whole
  prompt; everything but the new message is computed again;
- **reuse** (TensorRT-LLM today: block reuse with a ``kv_cache_aware`` or ``conversation`` router keeping a
  conversation on the context server that holds it): the context server holds every earlier prompt, but the
  previous answer was generated on a generation server, so each turn recomputes it (``answer`` tokens) with the
  new message;
- **reuse with a pull-back** (the previous answer's KV moved back from the generation server; vLLM PR #32553,
  not in TensorRT-LLM): only the new message is prefilled, and the answer's KV crosses the link instead.

Given a prefill cost per token (aiconfigurator's or the plan's estimate) and the KV bytes per token per context
rank with a bandwidth, each way's prefill time per turn follows, and the pull-back's transfer time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class MultiTurnShape:
    turns: int
    message: int  # new tokens the user sends each turn
    answer: int  # tokens of each answer

    def __post_init__(self):
        if not (1 <= self.turns <= 1000 and 1 <= self.message <= 1 << 21 and 1 <= self.answer <= 1 << 20):
            raise ValueError("turns must be 1 to 1000, message and answer lengths positive token counts")

    def prompt(self, t: int) -> int:
        """Turn t's (1-based) prompt: every earlier message and answer, then the new message."""
        return t * self.message + (t - 1) * self.answer

    def to_dict(self) -> dict:
        return asdict(self)


WAYS = (("no_reuse", "no reuse (round robin, or block reuse off)"),
        ("reuse", "reuse with a conversation kept on its context server (TensorRT-LLM today)"),
        ("pullback", "reuse with a pull-back of the previous answer's KV (not in TensorRT-LLM)"))


def recompute(shape: MultiTurnShape, *, prefill_ms_per_token: float | None = None, prefill_source: str = "",
              kv_bytes_per_token: float | None = None, gbps: float | None = None, bandwidth_source: str = "") -> dict:
    """Per turn and over the conversation: tokens each way prefills, how many of them are recomputed (and of
    those, earlier answers), and with a prefill cost the prefill milliseconds; the pull-back's transfer time."""
    rows = []
    totals = {w: {"computed": 0, "recomputed": 0, "recomputed_answers": 0} for w, _ in WAYS}
    for t in range(1, shape.turns + 1):
        prompt = shape.prompt(t)
        history = prompt - shape.message
        prev_answer = shape.answer if t > 1 else 0
        ways = {"no_reuse": (prompt, history, (t - 1) * shape.answer),
                "reuse": (shape.message + prev_answer, prev_answer, prev_answer),
                "pullback": (shape.message, 0, 0)}
        row = {"turn": t, "prompt_tokens": prompt}
        for w, (computed, recomputed, answers) in ways.items():
            totals[w]["computed"] += computed
            totals[w]["recomputed"] += recomputed
            totals[w]["recomputed_answers"] += answers
            row[w] = {"computed": computed, "recomputed": recomputed, "recomputed_answers": answers}
            if prefill_ms_per_token is not None:
                row[w]["prefill_ms"] = round(computed * prefill_ms_per_token, 3)
        if kv_bytes_per_token and gbps and prev_answer:
            row["pullback"]["transfer_ms"] = round(prev_answer * kv_bytes_per_token / (gbps * 1e9) * 1e3, 3)
        rows.append(row)
    for w in totals.values():
        w["recompute_share"] = round(w["recomputed"] / w["computed"], 4) if w["computed"] else 0.0
    no, re = totals["no_reuse"], totals["reuse"]
    summary = (f"a {shape.turns}-turn conversation ({shape.message}-token messages, {shape.answer}-token answers): "
               f"with no reuse the context servers prefill {no['computed']:,} tokens, {100 * no['recompute_share']:.0f} % "
               f"of them recomputed history; with reuse {re['computed']:,}, {100 * re['recompute_share']:.0f} % "
               f"recomputed (the previous answers, {re['recomputed_answers']:,} tokens); a pull-back would leave "
               f"{totals['pullback']['computed']:,}")
    return {"shape": shape.to_dict(), "ways": dict(WAYS), "turns": rows, "totals": totals, "summary": summary,
            "inputs": {"prefill_ms_per_token": prefill_ms_per_token, "prefill_source": prefill_source,
                       "kv_bytes_per_token_per_rank": kv_bytes_per_token, "gbps": gbps,
                       "bandwidth_source": bandwidth_source},
            "note": "an estimate from the shape alone: no queueing, no eviction, template tokens left out"}


def print_recompute(doc: dict) -> None:
    from rich.table import Table

    from toolkit.progress import stderr_console

    con = stderr_console(120)
    timed = doc["inputs"]["prefill_ms_per_token"] is not None
    t = Table(title="multi-turn: prefill tokens per turn on the context servers (recomputed in brackets)",
              title_justify="left")
    for col in ("turn", "prompt", "no reuse", "reuse", "pull-back"):
        t.add_column(col, justify="right")
    for r in doc["turns"]:
        def cell(w, r=r):
            v = r[w]
            text = f"{v['computed']:,} ({v['recomputed']:,})"
            if timed:
                text += f" {v['prefill_ms']:.3g} ms"
            if w == "pullback" and v.get("transfer_ms"):
                text += f" + {v['transfer_ms']:.3g} ms back"
            return text
        t.add_row(str(r["turn"]), f"{r['prompt_tokens']:,}", cell("no_reuse"), cell("reuse"), cell("pullback"))
    con.print(t)
    shares = ", ".join(f"{k.replace('_', ' ')} {100 * v['recompute_share']:.0f} %" for k, v in doc["totals"].items())
    con.print(f"recompute share of the prefill: {shares}", highlight=False, soft_wrap=True)
    con.print(doc["summary"], highlight=False, soft_wrap=True)
    inp = doc["inputs"]
    if timed:
        con.print(f"prefill: {inp['prefill_ms_per_token'] * 1e3:.3g} us/token ({inp['prefill_source']})"
                  + (f"; pull-back at {inp['gbps']:g} GB/s ({inp['bandwidth_source']})" if inp.get("gbps") else ""),
                  highlight=False, soft_wrap=True)
