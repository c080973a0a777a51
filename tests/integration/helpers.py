"""What integration tests do as a user would: run `tk`, talk HTTP to the deployment, read the process table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


from toolkit import client as tk_client
from toolkit.standin.baseline import AggregatedServer

ROOT = Path(__file__).resolve().parents[2]
STANDIN_RECIPE = ROOT / "recipes" / "standin-2p2d.yaml"
MODEL = "tk/standin-tiny"

# 20 prompts of different lengths: from one word to several hundred tokens (the recipe admits 1024).
PROMPTS = [" ".join(f"w{i}x{j}" for j in range(n)) for i, n in
           enumerate([1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 120, 150, 200, 7, 17, 42, 64, 99, 256, 300])]


def tk(*args: str, env: dict | None = None, timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess:
    """Run the tk command line (the installed console script's module) and capture its output."""
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"tk {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\n"
                             f"stderr:\n{proc.stderr}")
    return proc


def tk_json(*args: str, **kw) -> dict:
    proc = tk(*args, "--json", check=True, **kw)
    return json.loads(proc.stdout)


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Every live process whose command line contains `text` (e.g. a run directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append((int(entry.name), cmdline.strip()))
    return found


def wait_until(predicate, timeout_s: float, what, interval_s: float = 0.5):
    """Poll predicate until it returns something truthy; `what` (text, or a callable giving it at the
    moment of failure) says what was awaited."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what() if callable(what) else what}")
        time.sleep(interval_s)


def complete(base_url: str, prompt: str, max_tokens: int = 12, stream: bool = False, chat: bool = False) -> str:
    return tk_client.complete(base_url, MODEL, prompt, max_tokens=max_tokens, stream=stream, chat=chat)


def aggregated_baseline(run_dir: Path, workdir: Path) -> AggregatedServer:
    """The aggregated stand-in with the generation role's options: what every answer must equal."""
    return AggregatedServer.like(Path(run_dir) / "gen.yaml", workdir, model=MODEL)
