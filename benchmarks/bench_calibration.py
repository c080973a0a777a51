#!/usr/bin/env python3
"""Calibration of the rehearsal: `tk bench` on the emulated stand-in against aiconfigurator's static prediction of
the same configuration, side by side in one run; and against the seed lab's real H100 figures.

    PYTHONPATH=. python3 benchmarks/bench_calibration.py [--out DIR] [--only NAME] [--skip-lab] [--skip-streams]

Every rehearsed figure is emulated timing of the named model on the named GPU by the tk CPU stand-in (not
TensorRT-LLM, not a GPU): its iterations take aiconfigurator 0.12.0's per-operation time (toolkit/facts/steptime.py),
its queueing, batching and KV transfer are the stand-in's own. For each configuration (1 context + 1 generation
server, TensorRT-LLM 1.3, NIXL over the nvlink-single-node profile) it launches the recipe locally (`tk launch
--local`), runs `tk bench` at concurrency 1, 8 and 64 (fixed ISL/OSL, few requests), stops it, and asks
aiconfigurator (`cli_estimate`, static modes, the same data version and layout) for:

- TTFT: one prefill of the context server's batch, ``static_ctx`` at batch min(c, max_num_tokens // ISL): the
  context server batches what arrives together, up to its token budget;
- ITL: ``static_gen`` TPOT at batch c (the generation server decodes the c streams together);
- output tokens/s per GPU: c x OSL / (TTFT + (OSL - 1) x TPOT) / GPUs, the closed loop its static numbers imply.

Beside the static batch of min(c, 8), the TTFT is also compared like with like: the context server counts the
prefill iterations it formed by shape (``/standin/stats`` ``emulation.prefill_batches``, and how long each prompt
waited for its iteration, ``prefill_wait_s``), and aiconfigurator prices each of those batches (``static_ctx`` at
that batch); the request-weighted median of those figures is what a static model predicts for the arrivals the
rehearsal actually had ("formed"), and the emulated time of those iterations over aiconfigurator's says how exactly
the emulation prices what it ran ("emulated / aic"). At concurrency 8 the closed loop staggers arrivals, so the
context server forms smaller batches than one of 8: the static batch-of-8 figure and the formed one then differ by
the arrival pattern, not by the emulation. (tk bench's warm-up requests are among the counted iterations.)

aiconfigurator's own disaggregated TTFT multiplies the prefill by 1.8 for queueing under load
(``_AUTOSCALE_TTFT_CORRECTION_FACTOR``, sdk/picking.py); the raw static figure is the one compared, because the
rehearsal queues for itself. At concurrency 64 the context server needs 8 iterations for what aiconfigurator
prices as one batch of 8, so TTFT differs by design (the "queueing" column says by how much it should).

The lab (seed: a course lab, Llama-3.1-8B-Instruct BF16 on 2x H100 80GB, vLLM): the aggregated baseline (`tk launch
--aggregated`) of the 8B recipe at TP1 (two instances, aiperf round-robin: per-instance rates as the lab's) and TP2
(one instance), one request at a time at ISL 128..2048 with max_tokens 30 (the lab's "standalone prefill": its
script timed the whole request), and ShareGPT-like 256 in / 128 out at 2 and 6 req/s per instance: ITL p50 against
the lab's 7.22 / 7.41 ms (TP1) and 5.13 / 5.28 ms (TP2). Then `tk bench --baseline aggregated` on the 8B deployment
with arrivals spread (request rate), the lab's mixed-traffic question: TTFT and ITL, disaggregated beside aggregated.

Streams: 256 concurrent streams straight to one emulated generation-capable server (no proxy, no aiperf: the
client is this script's asyncio loop), ITL p50 against the table's decode step: whether the stand-in keeps the
emulated cadence on this machine.

Writes calibration.json into --out. Bounded: about 15 minutes on a 2-core box. Run it under the machine-wide lock
(flock /tmp/tk-heavy.lock ...): it launches servers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ISL, OSL = 2048, 64
CONCURRENCY = (1, 8, 64)
REQUESTS = {1: 6, 8: 24, 64: 128}  # per cell: a few rounds of each closed loop
CTX_BATCH = 8  # the context server's token budget holds 8 prompts: max_num_tokens = 8 x (ISL + template)
TEMPLATE_TOKENS = 2  # the stand-in's chat template adds <|user|> and <|assistant|> (facts/engines.py STANDIN)
SEED_LAB = {  # the course lab's real figures (vLLM, Llama-3.1-8B-Instruct BF16, H100 80GB)
    "standalone_e2e_ms": {128: 120.69, 256: 118.06, 512: 120.10, 1024: 155.77, 2048: 127.58},
    "itl_p50_ms": {("tp1", 2): 7.22, ("tp1", 6): 7.41, ("tp2", 2): 5.13, ("tp2", 6): 5.28},
    "ttft_p50_ms": {("tp1", 2): 923.94, ("tp1", 6): 947.90, ("tp2", 2): 656.14, ("tp2", 6): 675.69},
}


@dataclass(frozen=True)
class Config:
    name: str
    model: str
    gpu: str
    tp: int


CONFIGS = (
    Config("llama-3.1-8b-h100-tp1", "meta-llama/Llama-3.1-8B-Instruct", "H100", 1),
    Config("llama-3.3-70b-h100-tp4", "meta-llama/Llama-3.3-70B-Instruct", "H100", 4),
    Config("qwen3-30b-a3b-h200-tp2", "Qwen/Qwen3-30B-A3B", "H200", 2),  # MoE: EP2 (tk's default ep = tp)
)


def free_port_block(n: int) -> int:
    """A base port with n free ports above it and 1000 + n above that (the servers' internal ports), below Linux's
    ephemeral range (tk launch refuses ports an outgoing connection may hold)."""
    import random

    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(21000, 30000, 10)
        ok = True
        for p in list(range(base, base + n)) + list(range(base + 1000, base + 1000 + n)):
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port block")


# The model the stand-in serves (its own KV, moved for real over NIXL) is a one-layer synthetic config: its real work
# per request (KV content, digests, copies, the NIXL read) stays small beside the emulated times, so on the 2-core box
# what is measured is the emulated timing and the serving path, not numpy (tk/standin-tiny's 2 KiB/token KV costs
# about 20 ms of CPU per 2048-token request; this one's 32 bytes/token almost nothing).
MICRO_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
                "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 8, "hidden_size": 8,
                "intermediate_size": 16, "vocab_size": 32000, "max_position_embeddings": 8192,
                "torch_dtype": "bfloat16"}
SERVED = "served-micro"  # a directory beside the recipe


def recipe_text(cfg: Config, name: str, served: Path) -> str:
    base = free_port_block(8)
    mnt = CTX_BATCH * (ISL + TEMPLATE_TOKENS + 30)
    return f"""# Calibration (benchmarks/bench_calibration.py): emulated timing of {cfg.model} on {cfg.gpu}
schema_version: 1
name: {name}
engine: standin
model: {served}
trtllm_version: "1.3"
cluster:
  gpus_per_node: {2 * cfg.tp}
  gpu: CPU
  share_nodes: true
  time_limit: "00:30:00"
  worker_base_port: {base}
  pending_timeout_s: 120
  startup_timeout_s: 180
context:
  instances: 1
  tp: {cfg.tp}
  max_batch_size: 64
  max_num_tokens: {mnt}
generation:
  instances: 1
  tp: {cfg.tp}
  max_batch_size: 64
aggregated:
  max_num_tokens: {mnt}
kv_transfer:
  backend: NIXL
  transport: nvlink-single-node
  tokens_per_block: 32
traffic:
  max_input_len: {ISL + 96}
  max_output_len: {max(OSL, 128)}
proxy:
  port: {base + 7}
  server_start_timeout_s: 180
  request_timeout_s: 600
standin:
  emulate: {{model: {cfg.model}, gpu: {cfg.gpu}, precision: bf16}}
"""


def write_recipe(tmp: Path, cfg: Config, name: str) -> Path:
    served = tmp / SERVED
    served.mkdir(exist_ok=True)
    (served / "config.json").write_text(json.dumps(MICRO_CONFIG))
    recipe = tmp / f"{name}.yaml"
    recipe.write_text(recipe_text(cfg, name, served.resolve()))
    return recipe


def tk(*args: str, env: dict, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit.cli", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env={**os.environ, **env})


def launch(recipe: Path, env: dict, *extra: str) -> dict:
    proc = tk("launch", str(recipe), "--local", "--fail-fast", "--json", *extra, env=env, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"tk launch {recipe} {' '.join(extra)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def bench(run_dir: str, env: dict, *args: str) -> dict:
    proc = tk("bench", run_dir, "--json", *args, env=env)
    if proc.returncode not in (0, 1):  # 1: an SLA missed (none is set here); 2: invalid
        raise SystemExit(f"tk bench {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def stop(run_dir: str, env: dict) -> None:
    tk("stop", run_dir, env=env, timeout=180)


def row_of(doc: dict) -> dict:
    return doc["rows"][0]


def stats_of(endpoint_urls: list[str]) -> dict:
    import requests
    out = {}
    for url in endpoint_urls:
        try:
            emu = requests.get(url + "/standin/stats", timeout=5).json().get("emulation") or {}
            out[url] = {k: emu.get(k) for k in ("iterations", "tokens", "lag_ms_max", "resyncs")}
            out[url]["timing"] = (emu.get("timing") or {}).get("source")
        except Exception as exc:  # noqa: BLE001 - a report line, never a failure
            out[url] = {"error": str(exc)[:200]}
    return out


def workers_of(run_dir: str, role: str | None = None) -> list[str]:
    """The workers' URLs (the run record's servers other than the proxy; of ``role`` only where given)."""
    record = json.loads((Path(run_dir) / "run.json").read_text())
    return [f"http://{s.get('host') or '127.0.0.1'}:{s['port']}" for s in record.get("servers") or []
            if isinstance(s, dict) and s.get("role") != "proxy" and s.get("port")
            and (role is None or s.get("role") == role)]


def prefill_counts(urls: list[str]) -> dict:
    """The context servers' prefill iterations by shape so far, and their requests' waits (/standin/stats)."""
    import requests
    out: dict = {"batches": {}, "wait_s": 0.0, "requests": 0}
    for url in urls:
        emu = requests.get(url + "/standin/stats", timeout=5).json().get("emulation") or {}
        for b in emu.get("prefill_batches") or []:
            key = (b["requests"], b["tokens"], b["decodes"])
            n, ms = out["batches"].get(key, (0, 0.0))
            out["batches"][key] = (n + b["iterations"], ms + b["emulated_ms"])
        out["wait_s"] += emu.get("prefill_wait_s") or 0.0
        out["requests"] += emu.get("prefill_requests") or 0
    return out


def formed(before: dict, after: dict) -> dict:
    """What the context servers did between two prefill_counts: the prefill iterations they formed, by shape."""
    batches = {}
    for key, (n, ms) in after["batches"].items():
        n0, ms0 = before["batches"].get(key, (0, 0.0))
        if n > n0:
            batches[key] = (n - n0, ms - ms0)
    requests = after["requests"] - before["requests"]
    return {"batches": batches, "requests": requests,
            "wait_ms_mean": (after["wait_s"] - before["wait_s"]) / requests * 1e3 if requests else None}


# --- aiconfigurator's static prediction -----------------------------------------------------------------------

def predict(cfg: Config, c: int) -> dict:
    from toolkit.facts.models import resolve_model
    from toolkit.size import aiconfigurator as aic

    model = resolve_model(cfg.model)
    choice = aic.choose_data(cfg.gpu, "1.3", None)
    isl = ISL + TEMPLATE_TOKENS  # what the servers see
    ctx_batch = min(c, CTX_BATCH)
    ctx = aic.estimate_static(model, choice, mode="static_ctx", batch=ctx_batch, isl=isl, osl=OSL, tp=cfg.tp)
    gen = aic.estimate_static(model, choice, mode="static_gen", batch=c, isl=isl, osl=OSL, tp=cfg.tp)
    ttft, tpot = float(ctx["ttft"]), float(gen["tpot"])
    gpus = 2 * cfg.tp
    rounds = -(-c // CTX_BATCH)  # context iterations the closed loop's burst needs
    return {"ttft_ms": ttft, "tpot_ms": tpot, "ctx_batch": ctx_batch, "version": choice.version,
            "system": choice.system, "tokens_s_gpu": c * OSL / ((ttft + (OSL - 1) * tpot) / 1e3) / gpus,
            "queueing_ttft_p50_ms": ttft * (rounds + 1) / 2 if rounds > 1 else ttft}


def predict_formed(cfg: Config, shapes: dict) -> dict:
    """aiconfigurator's static prefill (``static_ctx``) for each prefill iteration the context server formed: the
    batch of r prompts of (its tokens / r) tokens each, beside the iteration's emulated time (``formed_summary``
    reads them)."""
    from toolkit.facts.models import resolve_model
    from toolkit.size import aiconfigurator as aic

    model = resolve_model(cfg.model)
    choice = aic.choose_data(cfg.gpu, "1.3", None)
    batches = []
    for (r, tokens, decodes), (n, ms) in sorted(shapes["batches"].items()):
        if r == 0 or decodes:  # the stats' overflow bucket; a mixed iteration (none on a context server)
            continue
        est = float(aic.estimate_static(model, choice, mode="static_ctx", batch=r, isl=max(1, round(tokens / r)),
                                        osl=OSL, tp=cfg.tp)["ttft"])
        batches.append({"requests": r, "tokens": tokens, "iterations": n, "aic_ms": round(est, 3),
                        "emulated_ms_mean": round(ms / n, 3)})
    return {"batches": batches, "wait_ms_mean": shapes["wait_ms_mean"], **formed_summary(batches)}


def formed_summary(batches: list[dict]) -> dict:
    """Over the iterations that prefilled the cell's prompts (each weighted by how many ISL-long prompts it held:
    the liveness probes' few-token prompts are left out, a probe batched with prompts counts for the prompts): the
    request-weighted median of aiconfigurator's figure for the batch each prompt was in (the like-for-like TTFT of
    the arrivals the rehearsal had, before waiting and the serving path), and the emulated time of those iterations
    over aiconfigurator's (how exactly the emulation prices what it ran)."""
    per_prompt: list[float] = []
    aic_ms = emu_ms = 0.0
    for b in batches:
        prompts = min(b["requests"], b["tokens"] // (ISL + TEMPLATE_TOKENS))
        if prompts < 1:
            continue
        per_prompt += [b["aic_ms"]] * (prompts * b["iterations"])
        aic_ms += b["aic_ms"] * b["iterations"]
        emu_ms += b["emulated_ms_mean"] * b["iterations"]
    return {"ttft_p50_ms": statistics.median(per_prompt) if per_prompt else None,
            "emulated_over_aic": emu_ms / aic_ms if aic_ms else None, "prompts": len(per_prompt)}


# --- the rehearsal ---------------------------------------------------------------------------------------------

def calibrate(cfg: Config, tmp: Path, env: dict, concurrency: tuple = CONCURRENCY) -> dict:
    recipe = write_recipe(tmp, cfg, f"calib-{cfg.name}")
    run = launch(recipe, env)
    out = {"config": cfg.__dict__, "run_dir": run["run_dir"], "cells": {}}
    ctx_urls = workers_of(run["run_dir"], "ctx")
    try:
        for c in concurrency:
            t0 = time.monotonic()
            before = prefill_counts(ctx_urls)
            doc = bench(run["run_dir"], env, "--isl", str(ISL), "--osl", str(OSL), "--concurrency", str(c),
                        "--requests", str(REQUESTS[c]), "--name", f"c{c}")
            r = row_of(doc)
            out["cells"][c] = {"measured": {k: r.get(k) for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
                                                                 "itl_p99_ms", "output_tokens_per_s_per_gpu",
                                                                 "requests", "errors")},
                               "gpus": doc.get("gpus"), "wall_s": round(time.monotonic() - t0, 1),
                               "predicted": predict(cfg, c),
                               "formed": predict_formed(cfg, formed(before, prefill_counts(ctx_urls)))}
            f = out["cells"][c]["formed"]
            print(f"  {cfg.name} c={c}: TTFT p50 {r.get('ttft_p50_ms')}, ITL p50 {r.get('itl_p50_ms')}, "
                  f"tok/s/GPU {r.get('output_tokens_per_s_per_gpu')} ({out['cells'][c]['wall_s']} s); prefill "
                  f"batches formed (prompts x iterations) "
                  f"{[(b['requests'], b['iterations']) for b in f['batches'] if b['tokens'] > ISL]}, aic for them "
                  f"{num(f['ttft_p50_ms'])} ms, emulated/aic {num(f['emulated_over_aic'], '.3f')}, wait "
                  f"{num(f['wait_ms_mean'])} ms", flush=True)
        out["servers"] = stats_of(workers_of(run["run_dir"]))
    finally:
        stop(run["run_dir"], env)
    # The control: the same deployment and load without emulated timing, one stream: what the stand-in, the proxy,
    # the loopback and aiperf on this machine add to a request by themselves (a GPU deployment has its own, smaller).
    run = launch(recipe, env, "--set", "standin.emulate=null")
    try:
        doc = bench(run["run_dir"], env, "--isl", str(ISL), "--osl", str(OSL), "--concurrency", "1", "--requests",
                    str(REQUESTS[1]), "--name", "control")
        r = row_of(doc)
        out["control"] = {k: r.get(k) for k in ("ttft_p50_ms", "itl_p50_ms")}
        print(f"  {cfg.name} control (no emulated timing), c=1: TTFT p50 {r.get('ttft_p50_ms')}, "
              f"ITL p50 {r.get('itl_p50_ms')}", flush=True)
    finally:
        stop(run["run_dir"], env)
    return out


def lab(tmp: Path, env: dict) -> dict:
    cfg = CONFIGS[0]
    recipe = write_recipe(tmp, cfg, "calib-lab")
    out: dict = {}
    for name, sets in (("tp1", ["--set", "aggregated.tp=1"]), ("tp2", ["--set", "aggregated.tp=2"])):
        run = launch(recipe, env, "--aggregated", *sets)
        instances = 2 if name == "tp1" else 1
        try:
            doc = bench(run["run_dir"], env, "--workload", "isl-sweep", "--osl", "30", "--concurrency", "1",
                        "--requests", "4", "--name", "standalone")
            out[f"{name}_standalone"] = {r["isl"]: {"ttft_p50_ms": r["ttft_p50_ms"], "e2e_p50_ms": r["e2e_p50_ms"]}
                                         for r in doc["rows"]}
            rates = ",".join(f"{x * instances:g}" for x in (2, 6))
            doc = bench(run["run_dir"], env, "--isl", "256", "--osl", "128", "--request-rate", rates, "--requests",
                        "40", "--name", "sharegpt-like")
            out[f"{name}_rates"] = {round(r["request_rate"] / instances): {k: r[k] for k in (
                "ttft_p50_ms", "itl_p50_ms", "itl_p99_ms", "output_tokens_per_s")} for r in doc["rows"]}
            print(f"  lab {name}: {out[f'{name}_rates']}", flush=True)
        finally:
            stop(run["run_dir"], env)
    run = launch(recipe, env)
    try:
        doc = bench(run["run_dir"], env, "--isl", str(ISL), "--osl", str(OSL), "--request-rate", "4",
                    "--requests", "40", "--baseline", "aggregated", "--name", "tradeoff")
        rows = {r["target"]: r for r in doc["rows"]}
        out["tradeoff"] = {t: {k: r[k] for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms",
                                                  "output_tokens_per_s_per_gpu")} for t, r in rows.items()}
        out["tradeoff_baseline"] = {k: v for k, v in (doc.get("baseline") or {}).items() if k != "cells"}
        print(f"  trade-off: {out['tradeoff']}", flush=True)
    finally:
        stop(run["run_dir"], env)
    return out


async def _streams(url: str, n: int, isl: int, osl: int) -> list[float]:
    import aiohttp

    from benchmarks.pd_lab import event_stamps

    async def one(session, i):
        body = {"model": "m", "prompt": " ".join(f"s{i}w{j}" for j in range(isl)), "max_tokens": osl, "stream": True}
        async with session.post(url + "/v1/completions", json=body) as resp:
            stamps = await event_stamps(resp)
        return [b - a for a, b in zip(stamps, stamps[1:])]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        gaps = await asyncio.gather(*(one(session, i) for i in range(n)))
    return sorted(x for g in gaps for x in g[1:])  # from the second gap: every stream is decoding


def streams(tmp: Path, n: int = 256, isl: int = 128, osl: int = 64) -> dict:
    """n streams straight to one emulated aggregated server (Llama-3.1-8B on H100, TensorRT-LLM 1.3 data)."""
    import requests

    from toolkit.facts.models import resolve_model
    from toolkit.size import aiconfigurator as aic

    opts = tmp / "streams.yaml"
    opts.write_text(f"max_batch_size: {n}\nmax_num_tokens: 8192\nmax_seq_len: 4096\n"
                    "kv_cache_config: {tokens_per_block: 32}\n")
    port = free_port_block(1)
    env = {**os.environ, "TK_STANDIN_TRTLLM_VERSION": "1.3", "TK_STANDIN_EMULATE_MODEL": CONFIGS[0].model,
           "TK_STANDIN_EMULATE_GPU": CONFIGS[0].gpu}
    log = open(tmp / "streams.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.standin", "tk/standin-tiny", "--host", "127.0.0.1",
                             "--port", str(port), "--backend", "pytorch", "--tp_size", "1", "--pp_size", "1",
                             "--extra_llm_api_options", str(opts)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(url + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.2)
        asyncio.run(_streams(url, 8, isl, 4))  # warm-up
        gaps = asyncio.run(_streams(url, n, isl, osl))
        emu = requests.get(url + "/standin/stats", timeout=5).json()["emulation"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    engine = aic.step_engine(resolve_model(CONFIGS[0].model), aic.choose_data(CONFIGS[0].gpu, "1.3", None), tp=1)
    step = engine.decode_ms(n, isl + 2 + osl // 2)
    return {"streams": n, "isl": isl, "osl": osl, "itl_p50_ms": statistics.median(gaps) * 1e3,
            "itl_p90_ms": gaps[int(0.9 * (len(gaps) - 1))] * 1e3, "emulated_step_ms": step,
            "lag_ms_max": emu["lag_ms_max"], "resyncs": emu["resyncs"], "timing": emu["timing"]["source"]}


# --- the report ------------------------------------------------------------------------------------------------

def ratio(a, b) -> str:
    return f"{a / b:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "-"


def num(v, fmt=".1f") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) else "-"


def less_control(run: dict, measured: dict) -> float | None:
    """The cell's TTFT p50 less the control's (what the emulation added over the serving path), or None."""
    ctl, ttft = (run.get("control") or {}).get("ttft_p50_ms"), measured.get("ttft_p50_ms")
    return ttft - ctl if isinstance(ctl, (int, float)) and isinstance(ttft, (int, float)) else None


def print_report(rep: dict) -> None:
    print(f"\n== Calibration: tk bench on the emulated stand-in vs aiconfigurator {rep['aiconfigurator']} static "
          f"(ISL {ISL}, OSL {OSL}; {rep['machine']}; {rep['date']})")
    print("TTFT: against the static prefill of min(c, 8) prompts ('aic'), and against the static prefill of each "
          "batch the context server formed ('formed', request-weighted median); 'emu/aic': the emulated time of those "
          "iterations over aiconfigurator's; 'wait': the mean time a prompt queued for its prefill iteration")
    print(f"{'configuration':<24} {'c':>3} | {'TTFT p50':>8} {'aic':>7} {'ratio':>5} {'formed':>7} {'ratio':>5} "
          f"{'emu/aic':>7} {'wait':>6} {'p99':>7} {'-ctl':>7} {'ratio':>5} | {'ITL p50':>7} {'aic':>6} {'ratio':>5} | {'tok/s/GPU':>9} "
          f"{'aic':>7} {'ratio':>5} | {'aic queueing':>12}")
    for name, run in rep["configs"].items():
        for c, cell in run["cells"].items():
            m, p, f = cell["measured"], cell["predicted"], cell.get("formed") or {}
            f = {**f, **formed_summary(f["batches"])} if f.get("batches") else f
            less = less_control(run, m)
            print(f"{name:<24} {c:>3} | {num(m['ttft_p50_ms']):>8} {num(p['ttft_ms']):>7} "
                  f"{ratio(m['ttft_p50_ms'], p['ttft_ms']):>5} {num(f.get('ttft_p50_ms')):>7} "
                  f"{ratio(m['ttft_p50_ms'], f.get('ttft_p50_ms')):>5} {num(f.get('emulated_over_aic'), '.3f'):>7} "
                  f"{num(f.get('wait_ms_mean')):>6} {num(m['ttft_p99_ms']):>7} {num(less):>7} "
                  f"{ratio(less, p['ttft_ms']):>5} | "
                  f"{num(m['itl_p50_ms'], '.2f'):>7} {num(p['tpot_ms'], '.2f'):>6} "
                  f"{ratio(m['itl_p50_ms'], p['tpot_ms']):>5} | {num(m['output_tokens_per_s_per_gpu']):>9} "
                  f"{num(p['tokens_s_gpu']):>7} {ratio(m['output_tokens_per_s_per_gpu'], p['tokens_s_gpu']):>5} | "
                  f"{num(p['queueing_ttft_p50_ms']):>12}")
            if f.get("batches"):
                print(f"{'':<28}   prefill iterations formed (iterations x prompts: aic, emulated ms): " + ", ".join(
                    f"{b['iterations']} x {b['requests']}: {b['aic_ms']:.1f}, {b['emulated_ms_mean']:.1f}"
                    for b in f["batches"] if b["tokens"] > ISL))
        ctl = run.get("control") or {}
        lags = [v.get("lag_ms_max") for v in (run.get("servers") or {}).values() if isinstance(v, dict)]
        sources = sorted({str(v.get("timing")) for v in (run.get("servers") or {}).values() if isinstance(v, dict)})
        print(f"{'':<24}     control (the same deployment without emulated timing, c=1): TTFT p50 "
              f"{num(ctl.get('ttft_p50_ms'))} ms; servers' timing {', '.join(sources)}, engine lag max "
              f"{num(max((x for x in lags if isinstance(x, (int, float))), default=None))} ms")
    lab_doc = rep.get("lab")
    if lab_doc:
        print("\n== The seed lab (vLLM on H100, Llama-3.1-8B-Instruct BF16) vs the rehearsal (TensorRT-LLM 1.3 data)")
        print("standalone, one request at a time, max_tokens 30: the lab timed the whole request")
        print(f"{'input':>6} | {'TP1 TTFT':>8} {'TP1 e2e':>8} | {'lab e2e':>8} {'ratio':>5}")
        for isl, lab_ms in SEED_LAB["standalone_e2e_ms"].items():
            r = (lab_doc.get("tp1_standalone") or {}).get(isl) or {}
            print(f"{isl:>6} | {num(r.get('ttft_p50_ms')):>8} {num(r.get('e2e_p50_ms')):>8} | {lab_ms:>8.1f} "
                  f"{ratio(r.get('e2e_p50_ms'), lab_ms):>5}")
        print("ShareGPT-like 256 in / 128 out, Poisson, per instance")
        for tpn in ("tp1", "tp2"):
            for rate in (2, 6):
                r = (lab_doc.get(f"{tpn}_rates") or {}).get(rate) or {}
                lab_itl = SEED_LAB["itl_p50_ms"][(tpn, rate)]
                print(f"  {tpn.upper()} {rate} req/s: ITL p50 {num(r.get('itl_p50_ms'), '.2f')} ms (lab {lab_itl}, "
                      f"{ratio(r.get('itl_p50_ms'), lab_itl)}), TTFT p50 {num(r.get('ttft_p50_ms'))} ms (lab "
                      f"{SEED_LAB['ttft_p50_ms'][(tpn, rate)]})")
        t = lab_doc.get("tradeoff") or {}
        if t:
            print(f"disaggregated (1P1D) vs aggregated (2 x TP1), ISL {ISL} / OSL {OSL} at 4 req/s: the lab's "
                  "mixed-traffic question")
            for target, r in t.items():
                print(f"  {target:<40} TTFT p50 {num(r['ttft_p50_ms']):>7} p99 {num(r['ttft_p99_ms']):>7} | "
                      f"ITL p50 {num(r['itl_p50_ms'], '.2f'):>6} p99 {num(r['itl_p99_ms'], '.2f'):>7}")
    s = rep.get("streams")
    if s:
        print(f"\n== {s['streams']} streams on one emulated server (Llama-3.1-8B on H100): ITL p50 "
              f"{s['itl_p50_ms']:.2f} ms against the emulated step {s['emulated_step_ms']:.2f} ms "
              f"(ratio {s['itl_p50_ms'] / s['emulated_step_ms']:.2f}); p90 {s['itl_p90_ms']:.2f}; engine lag max "
              f"{s['lag_ms_max']:.1f} ms, {s['resyncs']} resyncs")


def markdown(rep: dict) -> str:
    """The calibration table as docs/standin.md shows it."""
    lines = ["| configuration (1P1D) | c | TTFT p50 ms (aic) | ratio | formed | ratio | emulated / aic | wait ms | "
             "TTFT p99 | TTFT p50 − control | ratio | ITL p50 ms (aic) | ratio | out tok/s/GPU (aic) | ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, run in rep["configs"].items():
        for c, cell in run["cells"].items():
            m, p, f = cell["measured"], cell["predicted"], cell.get("formed") or {}
            f = {**f, **formed_summary(f["batches"])} if f.get("batches") else f
            less = less_control(run, m)
            lines.append(f"| {name} | {c} | {num(m['ttft_p50_ms'])} ({num(p['ttft_ms'])}) | "
                         f"{ratio(m['ttft_p50_ms'], p['ttft_ms'])} | {num(f.get('ttft_p50_ms'))} | "
                         f"{ratio(m['ttft_p50_ms'], f.get('ttft_p50_ms'))} | "
                         f"{num(f.get('emulated_over_aic'), '.3f')} | {num(f.get('wait_ms_mean'))} | "
                         f"{num(m['ttft_p99_ms'])} | {num(less)} | {ratio(less, p['ttft_ms'])} | "
                         f"{num(m['itl_p50_ms'], '.2f')} "
                         f"({num(p['tpot_ms'], '.2f')}) | {ratio(m['itl_p50_ms'], p['tpot_ms'])} | "
                         f"{num(m['output_tokens_per_s_per_gpu'])} ({num(p['tokens_s_gpu'])}) | "
                         f"{ratio(m['output_tokens_per_s_per_gpu'], p['tokens_s_gpu'])} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="calibration-out")
    ap.add_argument("--only", action="append", help="a configuration name (repeatable)")
    ap.add_argument("--concurrency", type=lambda v: tuple(int(x) for x in v.split(",")), default=CONCURRENCY,
                    help="comma-separated (default 1,8,64)")
    ap.add_argument("--skip-lab", action="store_true")
    ap.add_argument("--skip-streams", action="store_true")
    ap.add_argument("--report", metavar="JSON", help="print the report of a calibration.json this script wrote, "
                    "without running anything")
    args = ap.parse_args()
    if args.report:
        rep = json.loads(Path(args.report).read_text())
        for run in rep["configs"].values():  # JSON keys are text
            run["cells"] = {int(c): cell for c, cell in run["cells"].items()}
        print_report(rep)
        print("\n" + markdown(rep))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from toolkit.size import aiconfigurator as aic

    rep = {"aiconfigurator": aic.PINNED, "date": time.strftime("%Y-%m-%d"),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores", "configs": {}}
    with tempfile.TemporaryDirectory(prefix="tk-calibration-") as tmp_name:
        tmp = Path(tmp_name)
        env = {"TK_RUNS_DIR": str(tmp / "runs")}
        for cfg in CONFIGS:
            if args.only and cfg.name not in args.only:
                continue
            print(f"--- {cfg.name}", flush=True)
            rep["configs"][cfg.name] = calibrate(cfg, tmp, env, args.concurrency)
            (out / "calibration.json").write_text(json.dumps(rep, indent=1, default=str))
        if not args.skip_lab:
            print("--- the lab", flush=True)
            rep["lab"] = lab(tmp, env)
        if not args.skip_streams:
            print("--- 256 streams", flush=True)
            rep["streams"] = streams(tmp)
    (out / "calibration.json").write_text(json.dumps(rep, indent=1, default=str))
    print_report(rep)
    print("\n" + markdown(rep))
    print(f"\nwrote {out / 'calibration.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
