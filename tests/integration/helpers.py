"""What integration tests do as a user would: run `tk`, talk HTTP to the deployment, read the process table."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
STANDIN_RECIPE = ROOT / "recipes" / "standin-2p2d.yaml"
MODEL = "tk/standin-tiny"

# 20 prompts of different lengths: from one word to several hundred tokens (the recipe admits 1024).
PROMPTS = [" ".join(f"w{i}x{j}" for j in range(n)) for i, n in
           enumerate([1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 120, 150, 200, 7, 17, 42, 64, 99, 256, 300])]


def tk(*args: str, env: dict | None = None, timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess:
    """Run the tk command line (the installed console script's module) and capture its output."""
    proc = subprocess.run([sys.executable, "-m", "tk.cli", *args], capture_output=True, text=True, timeout=timeout,
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


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(interval_s)


def complete(base_url: str, prompt: str, max_tokens: int = 12, stream: bool = False, chat: bool = False) -> str:
    """The generated text for one request; streaming answers are concatenated from their SSE chunks."""
    if chat:
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "temperature": 0, "stream": stream}
        path = "/v1/chat/completions"
    else:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
        path = "/v1/completions"
    resp = requests.post(base_url + path, json=body, timeout=60, stream=stream)
    assert resp.status_code == 200, f"{path} answered {resp.status_code}: {resp.text[:500]}"
    if not stream:
        choice = resp.json()["choices"][0]
        return choice["message"]["content"] if chat else choice["text"]
    text = []
    done = False
    for line in resp.iter_lines(decode_unicode=True):
        if not line or not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            done = True
            break
        choice = json.loads(data)["choices"][0]
        piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
        text.append(piece or "")
    assert done, "stream ended without data: [DONE]"
    return "".join(text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AggregatedServer:
    """One stand-in server answering whole requests: the baseline disaggregated answers must equal.

    It gets the generation role's options without cache_transceiver_config (aggregated mode)."""

    def __init__(self, run_dir: Path, workdir: Path):
        import yaml

        options = yaml.safe_load((run_dir / "gen.yaml").read_text())
        options.pop("cache_transceiver_config", None)
        self.options_file = workdir / "aggregated.yaml"
        self.options_file.write_text(yaml.safe_dump(options))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(workdir / "aggregated.log", "wb")
        self.proc = subprocess.Popen(
            ["tk-standin-serve", MODEL, "--host", "127.0.0.1", "--port", str(self.port), "--backend", "pytorch",
             "--extra_llm_api_options", str(self.options_file)],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        wait_until(self._healthy, 60, f"the aggregated baseline server on port {self.port}")

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"aggregated server exited {self.proc.returncode}; see {self.log.name}")
        try:
            return requests.get(self.url + "/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        self.log.close()
