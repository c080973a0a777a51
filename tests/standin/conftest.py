"""The `launcher` fixture: stand-in processes for one test module, all stopped when the module is done."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.standin.helpers import MODEL, Proc, free_port


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    """Start stand-in processes; all of them are stopped when the module's tests are done."""
    log_dir = tmp_path_factory.mktemp("standin")
    started: list[Proc] = []

    class Launcher:
        dir = log_dir

        def options(self, name: str, options: dict) -> Path:
            path = log_dir / name
            path.write_text(yaml.safe_dump(options, sort_keys=False))
            return path

        def worker(self, name: str, options_file: Path | None, env: dict | None = None, wait: bool = True) -> Proc:
            port = free_port()
            args = [MODEL, "--host", "127.0.0.1", "--port", str(port), "--backend", "pytorch",
                    "--tp_size", "1", "--pp_size", "1"]
            if options_file:
                args += ["--extra_llm_api_options", str(options_file)]
            p = Proc(name, args, log_dir, env, port)
            started.append(p)
            return p.wait_healthy() if wait else p

        def proxy(self, name: str, ctx: list[Proc], gen: list[Proc], extra: dict | None = None,
                  env: dict | None = None, wait: bool = True, flags=("-t", "60", "-r", "30")) -> Proc:
            port = free_port()
            cfg = {"hostname": "127.0.0.1", "port": port, "backend": "pytorch", "max_retries": 1,
                   "context_servers": {"num_instances": len(ctx), "urls": [p.endpoint for p in ctx],
                                       "router": {"type": "round_robin"}},
                   "generation_servers": {"num_instances": len(gen), "urls": [p.endpoint for p in gen],
                                          "router": {"type": "load_balancing"}}}
            for k, v in (extra or {}).items():
                if isinstance(v, dict) and isinstance(cfg.get(k), dict):
                    cfg[k] = {**cfg[k], **v}
                else:
                    cfg[k] = v
            path = self.options(f"{name}.yaml", cfg)
            p = Proc(name, ["disaggregated", "-c", str(path), *flags], log_dir, env, port)
            started.append(p)
            return p.wait_healthy() if wait else p

    try:
        yield Launcher()
    finally:
        for p in started:
            p.stop()

