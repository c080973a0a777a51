"""What the stand-in's KV-cache bookkeeping costs: CPU per emulated token with block reuse on and off, side by side.

    PYTHONPATH=. python3 benchmarks/bench_kv_reuse.py [--rounds 2] [--conversations 6] [--turns 4]

tk CPU stand-in, not TensorRT-LLM. Starts, on loopback only, 1 context + 1 generation server and the proxy from
recipes/standin-multiturn.yaml (emulated timing of Llama-3.1-8B-Instruct on H100) in two variants:

- **bookkeeping on**: the recipe as shipped: a kv_cache_aware context router (the proxy hashes every prompt's
  blocks and polls the context server's /kv_cache_events after every context leg), block reuse and KV-cache
  events on the context server (the radix tree, LRU, events; a reused prefix also skips its emulated prefill);
- **bookkeeping off**: a round_robin context router, enable_block_reuse false, no events.

Each variant serves the same multi-turn chat load (conversations that resend their history, answers included),
alternating variants for ``--rounds`` rounds; the CPU time of every stand-in process (utime + stime, /proc) is
divided by the emulated tokens the servers produced (``/standin/stats`` emulation.tokens, the measure
benchmarks/pd_lab.py uses). Prints both and the ratio; the target is a ratio under 1.05.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from pd_lab import SERVED_MODEL, start_disagg  # noqa: E402

from toolkit import api  # noqa: E402

RECIPE = ROOT / "recipes" / "standin-multiturn.yaml"
COMMON = ("context.instances=1", "membership.enabled=false")  # static urls: the servers below are started here
VARIANTS = {
    "bookkeeping on": (*COMMON, "proxy.context_router=kv_cache_aware"),
    "bookkeeping off": (*COMMON, "proxy.context_router=round_robin"),
}
TARGET = 1.05


async def conversation(session, url: str, tag: str, turns: int, words: int, answer: int) -> None:
    messages = []
    for t in range(turns):
        messages.append({"role": "user", "content": " ".join(f"{tag}t{t}w{i}" for i in range(words))})
        async with session.post(url + "/v1/chat/completions", json={
                "model": SERVED_MODEL, "messages": messages, "max_tokens": answer, "ignore_eos": True}) as r:
            doc = await r.json()
            if r.status != 200:
                raise RuntimeError(f"{r.status}: {doc}")
        messages.append({"role": "assistant", "content": doc["choices"][0]["message"]["content"]})


async def load(url: str, tag: str, conversations: int, turns: int, words: int, answer: int, concurrency: int):
    sem = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def one(i):
            async with sem:
                await conversation(session, url, f"{tag}c{i}", turns, words, answer)
        await asyncio.gather(*(one(i) for i in range(conversations)))


def measure(name: str, workdir: Path, rnd: int, args) -> dict:
    plan = api.load_plan(str(RECIPE), VARIANTS[name])
    where = workdir / f"{name.replace(' ', '-')}-{rnd}"
    where.mkdir()
    dep = start_disagg(plan, where)
    try:
        cpu0, tok0, t0 = dep.cpu(), dep.emulated_tokens(), time.monotonic()
        asyncio.run(load(dep.url, f"r{rnd}{name[13:]}", args.conversations, args.turns, args.words, args.answer,
                         args.concurrency))
        cpu, tokens, wall = dep.cpu() - cpu0, dep.emulated_tokens() - tok0, time.monotonic() - t0
        import requests
        cached = sum(requests.get(s.url + "/standin/stats", timeout=5).json()["kv_cache"]["cached_tokens"]
                     for s in dep.workers)
    finally:
        dep.stop()
    return {"variant": name, "round": rnd, "cpu_s": cpu, "emulated_tokens": tokens, "wall_s": wall,
            "cached_tokens": cached}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--words", type=int, default=256, help="new tokens per turn")
    ap.add_argument("--answer", type=int, default=128, help="tokens per answer")
    ap.add_argument("--concurrency", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="tk-bench-kv-reuse-") as tmp:
        for rnd in range(args.rounds):
            order = list(VARIANTS) if rnd % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                runs.append(measure(name, Path(tmp), rnd, args))
                r = runs[-1]
                print(f"round {rnd} {name:16} cpu {r['cpu_s']:.2f} s, {r['emulated_tokens']} emulated tokens, "
                      f"{1e3 * r['cpu_s'] / max(1, r['emulated_tokens']):.3f} ms/token, cached {r['cached_tokens']}",
                      flush=True)
    per = {}
    for name in VARIANTS:
        rs = [r for r in runs if r["variant"] == name]
        per[name] = sum(r["cpu_s"] for r in rs) / max(1, sum(r["emulated_tokens"] for r in rs))
    ratio = per["bookkeeping on"] / per["bookkeeping off"]
    print(f"CPU per emulated token (emulated timing of Llama-3.1-8B-Instruct on H100; tk CPU stand-in, not "
          f"TensorRT-LLM): bookkeeping on {1e3 * per['bookkeeping on']:.3f} ms, off {1e3 * per['bookkeeping off']:.3f} "
          f"ms; ratio {ratio:.3f} (target < {TARGET})")
    if args.out:
        args.out.write_text(json.dumps({"runs": runs, "per_token_s": per, "ratio": ratio}, indent=2) + "\n")
    return 0 if ratio < TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
