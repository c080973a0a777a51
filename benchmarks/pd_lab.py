"""The P/D lab (a course lab measuring TTFT against input length on 2x H100) on the CPU stand-in with emulated
timing, not TensorRT-LLM.

    PYTHONPATH=. python3 benchmarks/pd_lab.py [--out DIR] [--quick]

Every figure it prints is "emulated timing of Llama-3.1-8B-Instruct on H100": the stand-in's iterations sleep the
roofline time (toolkit/facts/roofline.py, figures and efficiencies in toolkit/facts/hardware.py); nothing here is a
measurement of TensorRT-LLM or of a GPU. It starts, on loopback only:

- aggregated TP=1 and TP=2: one stand-in server answering whole requests (tk has no aggregated launch: this is
  the stand-in's aggregated mode, as tests/standin use it), with the generation role's options of
  recipes/standin-lab-1p1d.yaml minus cache_transceiver_config and TensorRT-LLM's default max_num_tokens (8192);
- 1P1D: recipes/standin-lab-1p1d.yaml's context and generation options and env, plus the stand-in proxy; the KV
  moves for real over NIXL, the emulated model's other KV bytes are charged at the recipe transport's nominal
  bandwidth.

Workloads (bounded request counts; the load comes from a small asyncio/aiohttp client in this file, not aiperf:
aiperf 0.13 pulls about 80 packages, transformers 5 and pandas among them, too much for this lab):

1. standalone: one request at a time, input 128/256/512/1024/2048 tokens, max_tokens 30: TTFT (streamed) and the
   end-to-end time of the same request non-streamed (what the seed's "standalone prefill TTFT" script measured);
2. mixed: short background traffic (input 256, output 128, Poisson 2 req/s) plus one long prefill (2048) every
   second, probes at each input length: TTFT per input length, and the background's ITL p50/p99;
3. ShareGPT-like at 2 req/s (input 256, output 200, 20 requests): TTFT and ITL, TP=1 against TP=2;
4. P:D ratios 1P1D, 1P2D and 2P1D at one fixed high rate (8 req/s, 40 requests): TTFT and ITL p50/p99 per ratio.

It prints the tables, the seed's real H100 figures next to the emulated ones with the ratio, the stand-in's CPU
cost per emulated token, and writes pd_lab.json and pd_lab.png (matplotlib, if installed) into --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import requests
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from toolkit import api  # noqa: E402

RECIPE = ROOT / "recipes" / "standin-lab-1p1d.yaml"
SERVED_MODEL = "tk/standin-tiny"
LENGTHS = (128, 256, 512, 1024, 2048)
# The lab's real H100 figures (its handout: vLLM with P2pNcclConnector, 2x H100 80GB, Llama-3.1-8B-Instruct BF16).
SEED = {
    "standalone_ms": {128: 120.69, 256: 118.06, 512: 120.10, 1024: 155.77, 2048: 127.58},
    "tp1_2rps": {"ttft_p50_ms": 923.94, "itl_p50_ms": 7.22},
    "tp2_2rps": {"ttft_p50_ms": 656.14, "itl_p50_ms": 5.13},
}
LABEL = "emulated timing of Llama-3.1-8B-Instruct on H100 (tk CPU stand-in, not TensorRT-LLM)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    def __init__(self, name: str, args: list[str], env: dict, workdir: Path, port: int):
        self.name, self.port, self.url = name, port, f"http://127.0.0.1:{port}"
        self.log = workdir / f"{name}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "toolkit.standin", *args], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)

    def wait(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited; see {self.log}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not healthy after {timeout_s}s; see {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)


class Deployment:
    """A set of stand-in servers and the URL clients use."""

    def __init__(self, name: str, servers: list[Server], url: str):
        self.name, self.servers, self.url = name, servers, url
        self.workers = [s for s in servers if s.name != "proxy"]

    def cpu(self) -> float:
        return sum(cpu_seconds(s.proc.pid) for s in self.servers)

    def emulated_tokens(self) -> int:
        return sum(requests.get(s.url + "/standin/stats", timeout=5).json()["emulation"]["tokens"]
                   for s in self.workers)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


def write(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def worker_args(port: int, options: Path, tp: int) -> list[str]:
    return [SERVED_MODEL, "--host", "127.0.0.1", "--port", str(port), "--backend", "pytorch", "--tp_size", str(tp),
            "--pp_size", "1", "--extra_llm_api_options", str(options)]


def start_aggregated(plan, workdir: Path, tp: int) -> Deployment:
    opts = dict(plan.generation.llm_api_options)
    opts.pop("cache_transceiver_config", None)
    opts.update(tensor_parallel_size=tp, max_num_tokens=8192, print_iter_log=False, cuda_graph_config=None)
    env = {**os.environ, **plan.generation.env, "UCX_TLS": "tcp,sm,self"}
    port = free_port()
    s = Server(f"agg-tp{tp}", worker_args(port, write(workdir / f"agg-tp{tp}.yaml", opts), tp), env, workdir, port)
    s.wait()
    return Deployment(f"aggregated TP={tp}", [s], s.url)


def start_disagg(plan, workdir: Path, n_ctx: int = 1, n_gen: int = 1) -> Deployment:
    """n_ctx context and n_gen generation servers with the recipe's options and env, and the stand-in proxy."""
    servers = {"ctx": [], "gen": []}
    for role, count in ((plan.context, n_ctx), (plan.generation, n_gen)):
        opts = {**role.llm_api_options, "print_iter_log": False}
        env = {**os.environ, **role.env, "UCX_TLS": "tcp,sm,self"}
        options = write(workdir / f"{role.role}.yaml", opts)
        for i in range(count):
            port = free_port()
            servers[role.role].append(Server(f"{role.role}-{i}", worker_args(port, options, role.tp), env, workdir,
                                             port))
    workers = servers["ctx"] + servers["gen"]
    for s in workers:
        s.wait()
    port = free_port()
    cfg = {**plan.proxy.config, "hostname": "127.0.0.1", "port": port}
    for key, role in (("context_servers", "ctx"), ("generation_servers", "gen")):
        cfg[key] = {**cfg[key], "num_instances": len(servers[role]),
                    "urls": [f"127.0.0.1:{s.port}" for s in servers[role]]}
    proxy = Server("proxy", ["disaggregated", "-c", str(write(workdir / "proxy.yaml", cfg)), "-t", "60", "-r", "120"],
                   {**os.environ, "UCX_TLS": "tcp,sm,self"}, workdir, port)
    proxy.wait()
    return Deployment(f"{n_ctx}P{n_gen}D (disaggregated)", workers + [proxy], proxy.url)


# --- the client ------------------------------------------------------------------------------------------------

def prompt(n: int, salt: int) -> str:
    return " ".join(f"t{salt}x{i}" for i in range(n))  # n whitespace tokens; unique per request (no reuse)


async def event_stamps(resp) -> list[float]:
    """When each server-sent data event of a streamed completion arrived (time.perf_counter of its chunk)."""
    stamps, buf = [], b""
    async for chunk in resp.content.iter_any():
        now = time.perf_counter()
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if event.startswith(b"data: {"):
                stamps.append(now)
    return stamps


async def one(session, url: str, n: int, out: int, salt: int, stream: bool = True) -> dict:
    body = {"model": SERVED_MODEL, "prompt": prompt(n, salt), "max_tokens": out, "stream": stream}
    t0 = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        if not stream:
            await resp.read()
            return {"n": n, "e2e": time.perf_counter() - t0}
        stamps = [t - t0 for t in await event_stamps(resp)]
    itl = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"n": n, "ttft": stamps[0], "e2e": stamps[-1], "itl": itl}


def pct(values, q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))] if v else float("nan")


async def standalone(url: str, reps: int) -> dict:
    out = {}
    async with aiohttp.ClientSession() as session:
        salt = 0
        for n in LENGTHS:
            ttft, e2e = [], []
            for _ in range(reps):
                salt += 1
                ttft.append((await one(session, url, n, 30, salt))["ttft"])
                salt += 1
                e2e.append((await one(session, url, n, 30, salt, stream=False))["e2e"])
            out[n] = {"ttft_ms": statistics.median(ttft) * 1e3, "e2e30_ms": statistics.median(e2e) * 1e3}
    return out


async def mixed(url: str, duration_s: float, probes: int, seed: int = 1) -> dict:
    """Background short streams (Poisson 2 req/s, 256 in / 128 out), a 2048-token prefill every second, and probes
    of each input length (30 out) spread over the run."""
    rng = random.Random(seed)
    results = {"bg": [], "long": [], "probe": []}
    async with aiohttp.ClientSession() as session:
        tasks = []
        salt = 10_000

        async def later(delay, kind, n, out):
            await asyncio.sleep(delay)
            results[kind].append(await one(session, url, n, out, salt_box.pop()))

        salt_box = list(range(salt, salt + 100_000))
        t = 0.0
        while t < duration_s:
            tasks.append(asyncio.create_task(later(t, "bg", 256, 128)))
            t += rng.expovariate(2.0)
        for k in range(int(duration_s)):
            tasks.append(asyncio.create_task(later(0.5 + k, "long", 2048, 8)))
        step = duration_s / (probes * len(LENGTHS))
        for i in range(probes * len(LENGTHS)):
            tasks.append(asyncio.create_task(later(0.25 + i * step, "probe", LENGTHS[i % len(LENGTHS)], 30)))
        await asyncio.gather(*tasks)
    itl = [x for r in results["bg"] for x in r["itl"]]
    by_len = {n: [r["ttft"] for r in results["probe"] if r["n"] == n] for n in LENGTHS}
    return {"ttft_p50_ms": {n: statistics.median(v) * 1e3 for n, v in by_len.items()},
            "bg_ttft_p50_ms": statistics.median(r["ttft"] for r in results["bg"]) * 1e3,
            "bg_itl_p50_ms": pct(itl, 50) * 1e3, "bg_itl_p99_ms": pct(itl, 99) * 1e3,
            "requests": sum(len(v) for v in results.values())}


async def sharegpt_like(url: str, count: int, rate: float, seed: int = 2) -> dict:
    rng = random.Random(seed)
    async with aiohttp.ClientSession() as session:
        async def at(delay, i):
            await asyncio.sleep(delay)
            return await one(session, url, 256, 200, 500_000 + i)
        t, tasks = 0.0, []
        for i in range(count):
            tasks.append(asyncio.create_task(at(t, i)))
            t += rng.expovariate(rate)
        res = await asyncio.gather(*tasks)
    itl = [x for r in res for x in r["itl"]]
    ttft = [r["ttft"] for r in res]
    return {"ttft_p50_ms": statistics.median(ttft) * 1e3, "ttft_p99_ms": pct(ttft, 99) * 1e3,
            "itl_p50_ms": pct(itl, 50) * 1e3, "itl_p99_ms": pct(itl, 99) * 1e3, "requests": len(res), "rate": rate}


def run_lab(out_dir: Path, quick: bool) -> dict:
    plan = api.load_plan(str(RECIPE))
    assert "emulated timing" in plan.engine.label, plan.engine.label
    workdir = out_dir / "servers"
    workdir.mkdir(parents=True, exist_ok=True)
    reps, duration, probes, count = (1, 4.0, 1, 8) if quick else (3, 10.0, 2, 20)
    report = {"label": LABEL, "engine": plan.engine.label, "deployments": {}}
    for name, start in (("agg_tp1", lambda: start_aggregated(plan, workdir, 1)),
                        ("agg_tp2", lambda: start_aggregated(plan, workdir, 2)),
                        ("pd_1p1d", lambda: start_disagg(plan, workdir))):
        dep = start()
        try:
            print(f"--- {dep.name}: {LABEL}", flush=True)
            cpu0, tok0, wall0 = dep.cpu(), dep.emulated_tokens(), time.monotonic()
            doc = {"name": dep.name,
                   "standalone": asyncio.run(standalone(dep.url, reps)),
                   "mixed": asyncio.run(mixed(dep.url, duration, probes)),
                   "sharegpt_2rps": asyncio.run(sharegpt_like(dep.url, count, 2.0))}
            cpu, tokens, wall = dep.cpu() - cpu0, dep.emulated_tokens() - tok0, time.monotonic() - wall0
            doc["cpu"] = {"cpu_s": cpu, "wall_s": wall, "emulated_tokens": tokens,
                          "cpu_ms_per_emulated_token": cpu / max(tokens, 1) * 1e3,
                          "cpu_percent_of_one_core": cpu / wall * 100}
            report["deployments"][name] = doc
        finally:
            dep.stop()
    # (5) P:D ratios at one fixed high request rate: which side is the bottleneck shows in TTFT (context) or
    # ITL (generation).
    report["ratios"] = {"rate": RATIO_RATE, "by_ratio": {}}
    for n_ctx, n_gen in RATIOS:
        dep = start_disagg(plan, workdir, n_ctx, n_gen)
        try:
            print(f"--- {dep.name} at {RATIO_RATE:g} req/s: {LABEL}", flush=True)
            report["ratios"]["by_ratio"][f"{n_ctx}P{n_gen}D"] = asyncio.run(
                sharegpt_like(dep.url, count * 2, RATIO_RATE, seed=3))
        finally:
            dep.stop()
    return report


RATIOS = ((1, 1), (1, 2), (2, 1))
# req/s, 256 in / 200 out: the most a 2-core box serves (1P1D costs ~0.6 ms CPU per emulated token) without the
# stand-in itself becoming the bottleneck
RATIO_RATE = 8.0


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def print_report(rep: dict) -> None:
    d = rep["deployments"]
    print(f"\n== P/D lab: {rep['label']}")
    print("\nTTFT p50 (ms) against input length, mixed traffic (2 req/s short streams + one 2048-token prefill/s)")
    print(f"{'input':>6} | {'agg TP=1':>9} | {'agg TP=2':>9} | {'1P1D':>9} | {'1P1D vs agg TP=1':>16}")
    for n in LENGTHS:
        a, b, c = (d[k]["mixed"]["ttft_p50_ms"][n] for k in ("agg_tp1", "agg_tp2", "pd_1p1d"))
        print(f"{n:>6} | {a:>9.1f} | {b:>9.1f} | {c:>9.1f} | {(a - c) / a * 100:>+15.0f}%")
    print("\nDecode under the same mixed traffic: background streams' ITL (ms)")
    for k in ("agg_tp1", "agg_tp2", "pd_1p1d"):
        m = d[k]["mixed"]
        print(f"  {d[k]['name']:<22} ITL p50 {m['bg_itl_p50_ms']:6.2f}  p99 {m['bg_itl_p99_ms']:7.2f}  "
              f"(TTFT p50 {m['bg_ttft_p50_ms']:.1f})")
    print("\nStandalone (one request at a time, max_tokens 30), emulated vs the seed's real H100 (vLLM)")
    print(f"{'input':>6} | {'TTFT':>7} | {'e2e 30 tok':>10} | {'seed':>7} | {'e2e/seed':>8}")
    for n in LENGTHS:
        s = d["agg_tp1"]["standalone"][n]
        seed = SEED["standalone_ms"][n]
        print(f"{n:>6} | {s['ttft_ms']:>7.1f} | {s['e2e30_ms']:>10.1f} | {seed:>7.1f} | {ratio(s['e2e30_ms'], seed):>8}")
    print("  (the seed's script timed the whole non-streamed request with max_tokens 30: its ~120 ms 'prefill' is "
          "mostly 30 decode steps)")
    print("\nShareGPT-like, 2 req/s (256 in / 200 out): emulated vs the seed's real H100")
    for k, sk in (("agg_tp1", "tp1_2rps"), ("agg_tp2", "tp2_2rps")):
        e, s = d[k]["sharegpt_2rps"], SEED[sk]
        print(f"  {d[k]['name']:<14} TTFT p50 {e['ttft_p50_ms']:7.1f} (seed {s['ttft_p50_ms']:.1f}, "
              f"{ratio(e['ttft_p50_ms'], s['ttft_p50_ms'])})  ITL p50 {e['itl_p50_ms']:5.2f} "
              f"(seed {s['itl_p50_ms']:.2f}, {ratio(e['itl_p50_ms'], s['itl_p50_ms'])})")
    t1, t2 = d["agg_tp1"]["sharegpt_2rps"], d["agg_tp2"]["sharegpt_2rps"]
    print(f"  TP=2/TP=1: TTFT {t2['ttft_p50_ms'] / t1['ttft_p50_ms']:.2f} (seed 0.71), "
          f"ITL {t2['itl_p50_ms'] / t1['itl_p50_ms']:.2f} (seed 0.71)")
    r = rep.get("ratios")
    if r:
        print(f"\nP:D ratios at {r['rate']:g} req/s (ShareGPT-like 256 in / 200 out), the same emulated GPUs per server")
        print(f"{'ratio':>6} | {'TTFT p50':>9} | {'TTFT p99':>9} | {'ITL p50':>8} | {'ITL p99':>8}")
        for k, e in r["by_ratio"].items():
            print(f"{k:>6} | {e['ttft_p50_ms']:>9.1f} | {e['ttft_p99_ms']:>9.1f} | {e['itl_p50_ms']:>8.2f} | "
                  f"{e['itl_p99_ms']:>8.2f}")
    print("\nThe stand-in's own CPU cost (all its processes, this machine)")
    for k in ("agg_tp1", "agg_tp2", "pd_1p1d"):
        c = d[k]["cpu"]
        print(f"  {d[k]['name']:<22} {c['cpu_ms_per_emulated_token']:.3f} ms CPU per emulated token, "
              f"{c['emulated_tokens']} tokens, {c['cpu_percent_of_one_core']:.0f}% of one core")


def plot(rep: dict, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no PNG (pip install matplotlib)")
        return False
    d = rep["deployments"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for k, style in (("agg_tp1", "o-"), ("agg_tp2", "s-"), ("pd_1p1d", "^-")):
        ax1.plot(LENGTHS, [d[k]["mixed"]["ttft_p50_ms"][n] for n in LENGTHS], style, label=d[k]["name"])
    ax1.set(xlabel="input length (tokens)", ylabel="TTFT p50 (ms)", title="mixed traffic: TTFT vs input length")
    ax1.legend()
    ax2.plot(LENGTHS, [d["agg_tp1"]["standalone"][n]["ttft_ms"] for n in LENGTHS], "o-", label="emulated TTFT")
    ax2.plot(LENGTHS, [d["agg_tp1"]["standalone"][n]["e2e30_ms"] for n in LENGTHS], "s-",
             label="emulated e2e, 30 tokens")
    ax2.plot(LENGTHS, [SEED["standalone_ms"][n] for n in LENGTHS], "k--", label="seed: real H100 (vLLM)")
    ax2.set(xlabel="input length (tokens)", ylabel="ms", title="standalone, TP=1")
    ax2.legend()
    fig.suptitle(LABEL, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="pd-lab-out")
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rep = run_lab(out, args.quick)
    (out / "pd_lab.json").write_text(json.dumps(rep, indent=1, default=str))
    print_report(rep)
    if plot(rep, out / "pd_lab.png"):
        print(f"\nwrote {out / 'pd_lab.json'} and {out / 'pd_lab.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
