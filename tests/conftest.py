import importlib.util
import itertools
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


def pytest_configure(config):
    """No test writes the user's run index or reads the user's site defaults (~/.config/tk/site.yaml):
    module- and session-scoped fixtures included."""
    import os
    import tempfile

    os.environ["TK_STATE_DIR"] = tempfile.mkdtemp(prefix="tk-test-state-")
    os.environ["TK_SITE"] = "none"


UNIT_TIMEOUT_S = 60  # a unit spec that takes longer is hung (the layer runs in seconds); others: pyproject's


def _capabilities() -> dict:
    """What this machine can run: markers whose tests need something not every machine has."""
    return {"nixl": any(importlib.util.find_spec(m) is not None for m in ("nixl", "nixl_cu12", "nixl_cu13")),
            "slurm": all(shutil.which(c) for c in ("slurmctld", "slurmd", "munged", "sbatch"))}


def pytest_collection_modifyitems(config, items):
    """Unit specs get a tight timeout. A test marked nixl or slurm is skipped, saying why, where that capability is
    absent; under CI (which installs everything) it runs anyway and fails loudly instead."""
    have = _capabilities()
    ci = bool(os.environ.get("CI"))
    for item in items:
        if "tests/unit/" in item.nodeid.replace("\\", "/") and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT_S))
        if ci:
            continue
        for marker, present in have.items():
            if not present and item.get_closest_marker(marker) is not None:
                item.add_marker(pytest.mark.skip(reason=f"needs {marker} (not installed here; scripts/setup installs it)"))


@pytest.fixture(scope="session")
def _state_dirs(tmp_path_factory):
    """Where the tests' state directories are made: one numbered directory each, by a counter (pytest's mktemp
    lists every earlier directory to number the next one: 2 ms a test by the last of 1,500)."""
    return tmp_path_factory.mktemp("tk-state"), itertools.count()


@pytest.fixture(autouse=True)
def _run_index(_state_dirs, monkeypatch):
    """Every test gets its own run index (toolkit.runtime.rundir.index_path), never the user's."""
    base, numbers = _state_dirs
    state = base / str(next(numbers))
    state.mkdir()
    monkeypatch.setenv("TK_STATE_DIR", str(state))
    monkeypatch.setenv("TK_SITE", "none")


@pytest.fixture
def recipe_file(tmp_path):
    """Write a recipe from text; returns its path."""

    def write(text: str, name: str = "r.yaml") -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p

    return write


MINIMAL = """\
schema_version: 1
name: t
model: meta-llama/Llama-3.3-70B-Instruct
cluster:
  gpus_per_node: 8
"""
