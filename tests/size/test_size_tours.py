"""Spec: the README's sizing tours (layer `slow`: each runs aiconfigurator's search, tens of seconds) run as shown
and print what they show. The harness and the other layers: tests/unit/test_readme_tours.py."""

from __future__ import annotations

import pytest

from tests import tours

SLOW = tours.tours(layers=("slow",))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SLOW))
def test_slow_tour(name, tmp_path):
    assert tours.run_tour(SLOW[name], base=tmp_path) == []
