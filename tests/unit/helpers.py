"""Small helpers for the unit specs."""

from __future__ import annotations

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
