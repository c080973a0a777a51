"""Check a tk deployment's option files and proxy config with the engine's own parsers, before any server starts.

Copied by tk into the rendered directory; launch.sbatch runs it inside the container on the first node, and
`tk render --check` runs it where tk runs. Standalone: the standard library, PyYAML and, where installed,
tensorrt_llm (never tk). No GPU work: only TensorRT-LLM's pydantic argument classes and its proxy-config parser.

    python3 check_config.py --engine trtllm --line 1.2 --merge MOD:FUNC... --llm-args MOD:CLASS...
        --disagg-parser MOD:FUNC... --options ctx.yaml MODEL --options gen.yaml MODEL --disagg disagg.yaml

The last line on stdout is the verdict, and the exit code says the same:
    OK: ...    0  every file was accepted
    FAIL: ...  1  the engine refused a file; the line names the file, the key and the version
    SKIP: ...  3  nothing here can check (tensorrt_llm not importable, or not the functions expected)
For --engine standin the CPU stand-in's own tables check the files (`tk-standin-serve check-config`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import shutil
import subprocess
import sys

OK, FAIL, SKIP = 0, 1, 3


def verdict(kind: str, text: str) -> int:
    print(f"{kind}: {' '.join(str(text).split())[:900]}", flush=True)
    return {"OK": OK, "FAIL": FAIL, "SKIP": SKIP}[kind]


def load(specs: list[str]):
    """The first MOD:ATTR of specs that imports, as (object, "MOD:ATTR"); ImportError/AttributeError if none."""
    last = None
    for spec in specs:
        mod, _, attr = spec.partition(":")
        try:
            return getattr(importlib.import_module(mod), attr), spec
        except (ImportError, AttributeError) as exc:
            last = exc
    raise last or ImportError("nothing to load")


def _section_of(cls, title: str, data: dict) -> str:
    """The top-level option whose type is the pydantic model `title` (KvCacheConfig -> kv_cache_config)."""
    for name, info in getattr(cls, "model_fields", {}).items():
        if name in data and title in str(getattr(info, "annotation", "")):
            return name
    return ""


def describe(exc: Exception, cls, data: dict) -> str:
    """A pydantic ValidationError as 'key.path: message'; any other error as its text."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return f"{type(exc).__name__}: {exc}"
    try:
        items = errors()
    except Exception:  # noqa: BLE001 - not a pydantic error after all
        return f"{type(exc).__name__}: {exc}"
    title = getattr(exc, "title", "") or ""
    prefix = _section_of(cls, title, data) if title and title != cls.__name__ else ""
    parts = []
    for item in items[:3]:
        loc = ".".join(str(p) for p in item.get("loc", ()))
        key = ".".join(p for p in (prefix, loc) if p)
        parts.append(f"{key or title}: {item.get('msg', '')}")
    more = f" (and {len(items) - 3} more)" if len(items) > 3 else ""
    return "; ".join(parts) + more


def check_trtllm(args) -> int:
    if importlib.util.find_spec("tensorrt_llm") is None:
        return verdict("SKIP", f"tensorrt_llm is not importable by {sys.executable} on {os.uname().nodename}; "
                               "the servers check their options at start-up")
    try:
        version = importlib.metadata.version("tensorrt_llm")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    label = f"TensorRT-LLM {version}" + ("" if version.startswith(args.line + ".") else
                                         f", files rendered for {args.line}")
    import yaml  # a dependency of tensorrt_llm
    try:
        merge, _ = load(args.merge)
        llm_args, llm_spec = load(args.llm_args)
        parse_disagg, disagg_spec = load(args.disagg_parser) if args.disagg else (None, "")
    except Exception as exc:  # noqa: BLE001 - importing tensorrt_llm can fail in many ways; none is a verdict
        return verdict("SKIP", f"{label}: cannot import its config parsers ({type(exc).__name__}: {exc})")
    try:  # later lines add keyword-only parameters (explicit_cli_keys): pass what the function asks for
        params = inspect.signature(merge).parameters
    except (TypeError, ValueError):
        params = {}
    merge_kwargs = {"explicit_cli_keys": set()} if "explicit_cli_keys" in params else {}
    checked = []
    for path, model in args.options or []:
        name = os.path.basename(path)
        try:
            with open(path) as f:
                data = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as exc:
            return verdict("FAIL", f"{name}: cannot be read as YAML ({exc}) ({label})")
        # What trtllm-serve does: its CLI values, the options file merged over them, then the LLM-args class.
        base = {"model": model, "backend": "pytorch", "skip_tokenizer_init": True}
        try:
            merged = merge(dict(base), dict(data) if isinstance(data, dict) else data, path, **merge_kwargs)
            # serve.py pops the membership block before building the LLM args (tensorrt_llm/commands/serve.py)
            if isinstance(merged, dict):
                merged.pop("disagg_cluster", None)
            llm_args(**merged)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # pydantic's ValidationError is a ValueError
            return verdict("FAIL", f"{name}: {describe(exc, llm_args, data if isinstance(data, dict) else {})} "
                                   f"({label}, {llm_spec.split(':')[-1]})")
        except Exception as exc:  # noqa: BLE001 - not a verdict on the file (a model directory, CUDA ...)
            return verdict("SKIP", f"{label} could not finish checking {name}: {type(exc).__name__}: {exc}")
        checked.append(name)
    if args.disagg:
        name = os.path.basename(args.disagg)
        try:
            parse_disagg(args.disagg)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            return verdict("FAIL", f"{name}: {type(exc).__name__}: {exc} ({label}, {disagg_spec.split(':')[-1]})")
        except Exception as exc:  # noqa: BLE001
            return verdict("SKIP", f"{label} could not finish checking {name}: {type(exc).__name__}: {exc}")
        checked.append(name)
    return verdict("OK", f"{', '.join(checked)} accepted by {label}")


def check_standin(args) -> int:
    exe = shutil.which("tk-standin-serve")
    if exe is None:
        return verdict("SKIP", "tk-standin-serve is not on PATH here; the stand-in checks its options at start-up")
    argv = [exe, "check-config"]
    for path, model in args.options or []:
        argv += ["--options", path, model]
    if args.disagg:
        argv += ["--disagg", args.disagg]
    env = dict(os.environ)
    if args.version_env:
        env[args.version_env] = args.line
    proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("OK: ", "FAIL: ", "SKIP: "))]
    if not lines:
        return verdict("SKIP", f"tk-standin-serve check-config gave no verdict (exit {proc.returncode})")
    print(lines[-1], flush=True)
    return {"OK": OK, "FAIL": FAIL}.get(lines[-1].split(":", 1)[0], SKIP)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="check_config.py", description=__doc__.splitlines()[0])
    p.add_argument("--engine", required=True)
    p.add_argument("--line", required=True, help="the TensorRT-LLM release line the files were rendered for")
    p.add_argument("--merge", action="append", default=[])
    p.add_argument("--llm-args", action="append", default=[])
    p.add_argument("--disagg-parser", action="append", default=[])
    p.add_argument("--version-env", default="")
    p.add_argument("--options", nargs=2, action="append", metavar=("FILE", "MODEL"))
    p.add_argument("--disagg")
    args = p.parse_args(argv)
    if args.engine == "standin":
        return check_standin(args)
    return check_trtllm(args)


if __name__ == "__main__":
    sys.exit(main())
