"""Spec: the README's tours that start deployments run as shown (tests/tours.py): the local rehearsal of a sized
recipe, the self-healing walk-through, the bench tour and the Python API on this machine, and the launch tour on the
dev Slurm cluster. Each runs in a scratch directory with its own run index and stops what it started."""

from __future__ import annotations

import pytest

from tests import tours

LAUNCH = tours.tours(layers=("launch",))
SLURM = tours.tours(layers=("slurm",))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LAUNCH))
def test_local_tour(name, tmp_path):
    assert tours.run_tour(LAUNCH[name], base=tmp_path) == []


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.parametrize("name", sorted(SLURM))
def test_slurm_tour(name, tmp_path, dev_slurm):
    assert tours.run_tour(SLURM[name], base=tmp_path) == []
