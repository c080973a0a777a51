"""Small helpers for the unit specs."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from toolkit.errors import RecipeError
from toolkit.plan import build_plan
from toolkit.recipe import load_recipe_text

BASE = """\
schema_version: 1
name: t
model: meta-llama/Llama-3.3-70B-Instruct
cluster: {gpus_per_node: 8}
quantization: fp8
"""
# (fp8: 70.6 GB of weights fit one H100, the default GPU, so single-GPU roles plan; bf16 would not. The cluster
# is one line so the lines the specs append keep their numbers.)


def plan_of(text: str = BASE, *overrides: str):
    return build_plan(load_recipe_text(text, "r.yaml", list(overrides)))


def violations_of(text: str = BASE, *overrides: str):
    with pytest.raises(RecipeError) as info:
        plan_of(text, *overrides)
    return info.value.violations


def fields(violations) -> set[str]:
    return {v.field for v in violations}


def tk_in_process(*args: str, env: dict | None = None, cwd=None):
    """Run the tk command line in this process (toolkit.cli.main), as a user's shell would see it: the exit code,
    stdout and stderr. No interpreter start-up per call; tests/unit/test_cli.py covers the installed entry point."""
    import contextlib
    import io
    import os
    import subprocess

    from toolkit.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.update(env or {})
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["tk", *args], code, out.getvalue(), err.getvalue())


@functools.lru_cache(maxsize=None)
def parsed(path: Path) -> ast.Module:
    """The syntax tree of one source file, parsed once for all the specs that read the tree (they only read it)."""
    return ast.parse(Path(path).read_text())
