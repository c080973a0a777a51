"""Spec: the round-robin schedule pairs every context node with every generation node exactly once, in
parallel rounds where no node is in two pairs, and N nodes finish in O(N) rounds."""

from __future__ import annotations

import itertools

import pytest

from validation.schedule import round_robin


@pytest.mark.parametrize("n_ctx,n_gen", [(1, 1), (1, 5), (5, 1), (2, 2), (3, 2), (2, 3), (4, 4), (7, 3), (16, 16),
                                         (1, 64), (33, 31)])
def test_every_pair_exactly_once_in_disjoint_rounds(n_ctx, n_gen):
    ctx = [f"c{i}" for i in range(n_ctx)]
    gen = [f"g{j}" for j in range(n_gen)]
    rounds = round_robin(ctx, gen)
    seen = [p for rd in rounds for p in rd]
    assert sorted(seen) == sorted(itertools.product(ctx, gen))  # every pair, exactly once
    for rd in rounds:
        nodes = [n for p in rd for n in p]
        assert len(nodes) == len(set(nodes)), f"a node is in two pairs of one round: {rd}"
    assert len(rounds) == max(n_ctx, n_gen) <= n_ctx + n_gen - 1  # O(N), and optimal (a node has max(C,G) peers)


def test_rounds_are_full_when_roles_are_balanced():
    rounds = round_robin(["c0", "c1"], ["g0", "g1"])
    assert rounds == [[("c0", "g0"), ("c1", "g1")], [("c0", "g1"), ("c1", "g0")]]


def test_no_pairs_without_one_role():
    assert round_robin(["c0"], []) == []
    assert round_robin([], ["g0"]) == []
