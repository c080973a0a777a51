from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))


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
