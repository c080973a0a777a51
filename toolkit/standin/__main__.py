"""``tk-standin-serve``: the CPU stand-in's command line (tk CPU stand-in, not TensorRT-LLM).

    tk-standin-serve MODEL --host H --port P --backend pytorch --tp_size N --pp_size N [...] --extra_llm_api_options F
    tk-standin-serve disaggregated -c FILE [-t SERVER_START_TIMEOUT_S] [-r REQUEST_TIMEOUT_S]
    tk-standin-serve --version   one line: the stand-in's version and the TensorRT-LLM line it imitates
    tk-standin-serve check-config [--options FILE MODEL]... [--disagg FILE]

check-config parses option files and a proxy config exactly as the servers would at start-up, and prints one
verdict line, "OK: ...", "FAIL: FILE: key ..." (exit 1) or "SKIP: ..." (the step launch.sbatch runs before any
server starts, as TensorRT-LLM's own classes do for the real engine).

Start-up problems print one line naming the file and key and exit 2, before any port is bound.
"""

from __future__ import annotations

import logging
import sys

from toolkit.facts import trtllm


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="[tk-standin] %(asctime)s %(levelname)s %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _tk_version() -> str:
    """tk's version without importing the toolkit (the stand-in imports only toolkit.facts): the installed
    distribution's, else the `__version__` line of the toolkit package it runs from."""
    import importlib.metadata
    import importlib.util
    import re
    try:
        return importlib.metadata.version("tk-disagg")
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("toolkit")
    try:
        text = open(spec.origin).read() if spec and spec.origin else ""
    except OSError:
        text = ""
    found = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    return found.group(1) if found else "unknown"


def version_string() -> str:
    """What provenance records for the stand-in: a real version, never TensorRT-LLM's."""
    from toolkit.standin.options import ConfigError, target_version
    try:
        line = target_version().line
    except ConfigError:
        line = "unknown"
    return f"tk-standin-serve {_tk_version()} (tk CPU stand-in, not TensorRT-LLM; imitates the TensorRT-LLM {line} protocol)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from toolkit.standin.options import ConfigError
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if argv and argv[0] == "--version":
        print(version_string())
        return 0
    _logging()
    if argv and argv[0] == "check-config":
        return check_config(argv[1:])
    try:
        if argv and argv[0] == "disaggregated":
            from toolkit.standin.proxy import proxy_settings, run
            settings = proxy_settings(argv[1:])
        else:
            if argv and argv[0] == "serve":
                argv = argv[1:]
            from toolkit.standin.options import worker_settings
            settings = worker_settings(argv)
            from toolkit.standin.worker import run
        return run(settings)
    except ConfigError as exc:
        print(f"tk-standin-serve: error: {exc}" if not str(exc).startswith("tk-standin-serve") else str(exc),
              file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def check_config(argv: list[str]) -> int:
    """Every option file and the proxy config through the stand-in's start-up checks; one verdict line."""
    import argparse
    import os

    from toolkit.standin.options import ConfigError, target_version, worker_settings
    p = argparse.ArgumentParser(prog="tk-standin-serve check-config")
    p.add_argument("--options", nargs=2, action="append", metavar=("FILE", "MODEL"), default=[])
    p.add_argument("--disagg")
    args = p.parse_args(argv)
    checked = []
    try:
        version = target_version()
        label = f"the tk CPU stand-in's tables for TensorRT-LLM {version.line}"
        for path, model in args.options:
            argv = [model, "--extra_llm_api_options", path]
            if version.cluster_storages and _has_cluster_block(path):
                # the job gives each server --disagg_cluster_uri (its own) and --server_role: the block is checked as
                # the server reads it, with a stand-in URI for the one only the command line carries
                argv += [trtllm.MEMBERSHIP_FLAG["uri"], "etcd://check-config:1", trtllm.MEMBERSHIP_FLAG["role"],
                         "context"]
            worker_settings(argv)
            checked.append(os.path.basename(path))
        if args.disagg:
            from toolkit.standin.proxy import parse_config
            parse_config(args.disagg, version)
            checked.append(os.path.basename(args.disagg))
    except ConfigError as exc:
        text = str(exc).removeprefix("tk-standin-serve: ")
        print(f"FAIL: {' '.join(text.split())} ({label if 'label' in locals() else 'tk CPU stand-in'})")
        return 1
    print(f"OK: {', '.join(checked) or 'nothing'} accepted by {label}")
    return 0


def _has_cluster_block(path: str) -> bool:
    import yaml

    try:
        with open(path) as f:
            doc = yaml.safe_load(f.read(1 << 20))
    except (OSError, yaml.YAMLError):
        return False  # worker_settings says what is wrong with it
    return isinstance(doc, dict) and isinstance(doc.get(trtllm.MEMBERSHIP_KEY), dict) and \
        doc[trtllm.MEMBERSHIP_KEY].get("cluster_uri") is None


if __name__ == "__main__":
    sys.exit(main())
