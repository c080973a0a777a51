"""``tk bench RECIPE --compare KEY=V1,V2 ...``: the same workload on every variant of a recipe, side by side.

Pure except ``write_comparison``. Each ``--compare`` is one axis; the variants are every combination of the axes'
values, in order (``--compare router=round_robin,kv_cache_aware --compare conditional=off,512``: four). A key is
a shorthand or any recipe field path (what ``--set`` takes):

- ``router=NAME``: ``proxy.context_router`` (round_robin, load_balancing, kv_cache_aware, conversation);
- ``conditional=off|N``: conditional disaggregation off, or ``proxy.conditional_max_local_prefill_length=N``
  with the KV-cache-aware generation router TensorRT-LLM requires for it;
- ``a.b.c=V``: that field, e.g. ``context.instances=1,2`` or
  ``context.extra_options.kv_cache_config.enable_block_reuse=true,false``.

The comparison: per variant and turn, TTFT p50/p99, cached and recomputed tokens (answers apart) and the share of the
resent history reused; a plot of per-turn TTFT and recomputed tokens; and a recommendation: the valid variant
with the lowest TTFT p50 over the turns that resend history (turn 2 on), with what it saves against the others.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.bench.verdict import Outcome, Stage
from toolkit.bench.workload import BenchInputError

MAX_VARIANTS = 16
SHORTHANDS = ("router", "conditional")
_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+){0,7}$")
_VALUE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


@dataclass(frozen=True)
class Variant:
    label: str  # "router=kv_cache_aware conditional=512"
    slug: str  # "router-kv_cache_aware_conditional-512" (file and run names)
    overrides: tuple[str, ...]  # --set expressions

    def to_dict(self) -> dict:
        return asdict(self)


def _overrides(key: str, value: str) -> tuple[str, ...]:
    if key == "router":
        return (f"proxy.context_router={value}",)
    if key == "conditional":
        if value == "off":
            return ("proxy.conditional_max_local_prefill_length=null",)
        if not value.isdigit():
            raise BenchInputError(f"--compare conditional={value}: off or a token count (max_local_prefill_length)")
        return (f"proxy.conditional_max_local_prefill_length={int(value)}", "proxy.generation_router=kv_cache_aware")
    return (f"{key}={value}",)


def parse_axes(specs) -> list[tuple[str, list[str]]]:
    axes = []
    for spec in specs or ():
        key, sep, values = str(spec).partition("=")
        key = key.strip()
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not vals:
            raise BenchInputError(f"--compare {spec!r}: expected KEY=V1,V2 (e.g. router=round_robin,kv_cache_aware)")
        if key not in SHORTHANDS and not _PATH.match(key):
            raise BenchInputError(f"--compare {key}: one of {', '.join(SHORTHANDS)} or a recipe field path "
                                  f"(e.g. context.instances)")
        bad = [v for v in vals if not _VALUE.match(v)]
        if bad:
            raise BenchInputError(f"--compare {key}: value {bad[0]!r} is not a plain word or number")
        if len(set(vals)) != len(vals):
            raise BenchInputError(f"--compare {key}: a value is listed twice")
        if any(k == key for k, _ in axes):
            raise BenchInputError(f"--compare {key} is given twice: list every value in one --compare")
        axes.append((key, vals))
    return axes


def build_variants(specs) -> list[Variant]:
    axes = parse_axes(specs)
    if not axes:
        raise BenchInputError("--compare needs at least one KEY=V1,V2")
    combos = list(itertools.product(*[[(k, v) for v in vals] for k, vals in axes]))
    if len(combos) < 2:
        raise BenchInputError("--compare: one variant only; give two values or more to compare")
    if len(combos) > MAX_VARIANTS:
        raise BenchInputError(f"--compare: {len(combos)} variants; at most {MAX_VARIANTS} (each is a launch and a "
                              f"benchmark)")
    out = []
    for combo in combos:
        label = " ".join(f"{k}={v}" for k, v in combo)
        slug = "_".join(f"{k.split('.')[-1]}-{v}" for k, v in combo)
        out.append(Variant(label, slug, tuple(o for k, v in combo for o in _overrides(k, v))))
    return out


def _later_mean(turns: list[dict], key: str) -> float | None:
    vals = [t[key] for t in turns if t["turn"] >= 2 and t.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def summarise(variant: Variant, doc: dict | None, error: str | None = None) -> dict:
    """One variant's line of the comparison."""
    if doc is None:
        return {"variant": variant.label, "slug": variant.slug, "error": error, "valid": False, "turns": []}
    turns = doc.get("turns") or []
    mt = next(iter((doc.get("multi_turn") or {}).values()), {})
    row = (doc.get("rows") or [{}])[0]
    return {"variant": variant.label, "slug": variant.slug, "valid": doc["verdict"]["exit_code"] != Outcome.INVALID,
            "verdict": doc["verdict"]["summary"], "bench_dir": doc.get("bench_dir"),
            "turns": [{k: t.get(k) for k in ("turn", "requests", "prompt_tokens", "cached_tokens", "reusable_tokens",
                                           "recomputed_tokens", "recomputed_answer_tokens", "ttft_p50_ms",
                                           "ttft_p99_ms")} for t in turns],
            "ttft_p50_later_ms": _later_mean(turns, "ttft_p50_ms"),
            "recomputed_later": _later_mean(turns, "recomputed_tokens"),
            "reuse_share": mt.get("reuse_share"), "request_throughput": row.get("request_throughput"),
            "pullback": (doc.get("pullback_projection") or {}).get("summary"),
            "findings": [c["name"] for c in doc["verdict"]["checks"] if c["stage"] == Stage.REUSE and not c["ok"]]}


def recommend(lines: list[dict]) -> dict:
    ok = [ln for ln in lines if ln["valid"] and ln.get("ttft_p50_later_ms") is not None]
    if not ok:
        return {"variant": None, "reason": "no variant gave a valid measurement with later turns to compare"}
    best = min(ok, key=lambda ln: (ln["ttft_p50_later_ms"], ln.get("recomputed_later") or 0))
    others = [ln for ln in ok if ln is not best]
    parts = [f"lowest TTFT p50 from turn 2 on: {best['ttft_p50_later_ms']:.4g} ms"]
    if best.get("reuse_share") is not None:
        parts.append(f"{100 * best['reuse_share']:.0f} % of the resent history reused")
    for o in others:
        d = o["ttft_p50_later_ms"] - best["ttft_p50_later_ms"]
        rel = d / o["ttft_p50_later_ms"] if o["ttft_p50_later_ms"] else 0
        rec = ""
        if o.get("recomputed_later") is not None and best.get("recomputed_later") is not None:
            fewer = o["recomputed_later"] - best["recomputed_later"]
            rec = (f", {fewer:.0f} fewer tokens recomputed per request" if fewer >= 1 else
                   ", as many tokens recomputed" if fewer > -1 else
                   f", though {-fewer:.0f} more tokens recomputed per request")
        parts.append(f"vs {o['variant']}: {d:.3g} ms ({100 * rel:.0f} %) faster{rec}")
    return {"variant": best["variant"], "reason": "; ".join(parts)}


def comparison_markdown(doc: dict, plot: str | None) -> str:
    lines = [f"# tk bench --compare: {doc['recipe']}", "",
             f"Workload: {doc['workload']}; each variant launched, measured and stopped in turn.", "",
             f"**Recommendation: {doc['recommendation']['variant'] or 'none'}** — {doc['recommendation']['reason']}",
             "", ("| variant | valid | TTFT p50 turn>=2 ms | recomputed/request turn>=2 | history reused | req/s | "
                  "findings |"), "|---|---|---|---|---|---|---|"]

    def f(v, nd=4):
        return "–" if v is None else (f"{v:.{nd}g}" if isinstance(v, float) else str(v))
    for ln in doc["variants"]:
        if ln.get("error"):
            lines.append(f"| {ln['variant']} | **failed** | – | – | – | – | {ln['error'][:200]} |")
            continue
        share = f"{100 * ln['reuse_share']:.0f} %" if ln.get("reuse_share") is not None else "–"
        lines.append(f"| {ln['variant']} | {'yes' if ln['valid'] else '**no**'} | {f(ln['ttft_p50_later_ms'])} | "
                     f"{f(ln['recomputed_later'])} | {share} | {f(ln['request_throughput'])} | "
                     f"{', '.join(ln['findings']) or '-'} |")
    lines += ["", "## Per turn", "", ("| variant | turn | TTFT p50 | TTFT p99 | prompt | cached | recomputed | "
                                      "recomputed answers |"), "|---|---|---|---|---|---|---|---|"]
    for ln in doc["variants"]:
        for t in ln.get("turns") or []:
            lines.append(f"| {ln['variant']} | {t['turn']} | {f(t['ttft_p50_ms'])} | {f(t['ttft_p99_ms'])} | "
                         f"{f(t['prompt_tokens'])} | {f(t['cached_tokens'])} | {f(t['recomputed_tokens'])} | "
                         f"{f(t['recomputed_answer_tokens'])} |")
    lines += ["", ("Tokens are means per request; TTFT in ms. Each variant's own report (verdict, checks, pull-back "
                   "projection) is in its bench directory:"), ""]
    for ln in doc["variants"]:
        if ln.get("bench_dir"):
            lines.append(f"- {ln['variant']}: `{ln['bench_dir']}/report.md`")
    if plot:
        lines += ["", f"![{plot}]({plot})"]
    return "\n".join(lines) + "\n"


def write_comparison(out: Path, doc: dict) -> None:
    from toolkit.bench.report import write_turn_plot

    plot = "compare_turns.png" if write_turn_plot(
        out / "compare_turns.png", {ln["variant"]: ln["turns"] for ln in doc["variants"] if ln.get("turns")},
        f"{doc['recipe']}: per-turn TTFT and recomputed tokens by variant") else None
    doc["plot"] = plot
    from toolkit.runtime import files

    files.write_regular_atomically(out / "compare.json", json.dumps(doc, indent=2, default=str) + "\n")
    files.write_regular_atomically(out / "compare.md", comparison_markdown(doc, plot))
