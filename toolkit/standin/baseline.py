"""The aggregated baseline: one stand-in server answering whole requests on this machine.

A disaggregated stand-in deployment must answer exactly like it (same model, same options, no
cache_transceiver_config), since the stand-in's tokens are a function of the KV bytes the generation
server actually holds. The demo, the benchmarks and the tests compare against it:

    with AggregatedServer.like(run_dir / "gen.yaml", workdir) as baseline:
        expected = complete(baseline.url, model, prompt)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import requests
import yaml

START_TIMEOUT_S = 60


class AggregatedServer:
    def __init__(self, model: str, options: dict, workdir: Path, *, start_timeout_s: float = START_TIMEOUT_S):
        workdir.mkdir(parents=True, exist_ok=True)
        self.model = model
        self.options_file = workdir / "aggregated.yaml"
        self.options_file.write_text(yaml.safe_dump(options, sort_keys=False))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "aggregated.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                ["tk-standin-serve", model, "--host", "127.0.0.1", "--port", str(self.port), "--backend", "pytorch",
                 "--extra_llm_api_options", str(self.options_file)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_healthy(start_timeout_s)
        except BaseException:
            self.close()
            raise

    @classmethod
    def like(cls, role_options_file: Path, workdir: Path, model: str = "tk/standin-tiny") -> AggregatedServer:
        """A baseline with a role's rendered options minus its cache_transceiver_config (aggregated mode).

        Chunked prefill is switched on: a generation role's max_num_tokens is sized for decode batches, and
        without chunking the server would refuse prompts longer than it (as TensorRT-LLM does). The answers do
        not depend on it.
        """
        options = yaml.safe_load(Path(role_options_file).read_text()) or {}
        options.pop("cache_transceiver_config", None)
        options["enable_chunked_prefill"] = True
        return cls(model, options, workdir)

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the aggregated stand-in exited with code {self.proc.returncode}; "
                                   f"see {self.log_path}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the aggregated stand-in was not healthy after {timeout_s:g}s; see {self.log_path}")
            time.sleep(0.2)

    def close(self) -> None:
        if self.proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> AggregatedServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
