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


@pytest.fixture(autouse=True)
def _run_index(tmp_path_factory, monkeypatch):
    """Every test gets its own run index (toolkit.runtime.rundir.index_path), never the user's."""
    monkeypatch.setenv("TK_STATE_DIR", str(tmp_path_factory.mktemp("tk-state")))
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
