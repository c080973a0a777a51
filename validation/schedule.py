"""Which context agent meets which generation agent, round by round. Standard library only."""

from __future__ import annotations


def round_robin(ctx: list, gen: list) -> list:
    """Rounds of disjoint (ctx, gen) pairs covering every ctx x gen pair exactly once.

    max(len(ctx), len(gen)) rounds: a proper edge colouring of the complete bipartite graph, so N nodes
    finish in at most N-1 rounds and every agent is in at most one pair per round.
    """
    c, g = len(ctx), len(gen)
    rounds = []
    for r in range(max(c, g) if c and g else 0):
        if c <= g:
            rounds.append([(ctx[i], gen[(i + r) % g]) for i in range(c)])
        else:
            rounds.append([(ctx[(j + r) % c], gen[j]) for j in range(g)])
    return rounds


def partners(rounds: list, agent: str) -> list:
    """The agent's partner in each round it takes part in, in schedule order."""
    out = []
    for pairs in rounds:
        for s, d in pairs:
            if agent in (s, d):
                out.append(d if agent == s else s)
    return out


def my_pair(pairs: list, agent: str):
    """(src, dst) of the agent's pair in one round, or None when it sits the round out."""
    mine = [(s, d) for s, d in pairs if agent in (s, d)]
    return mine[0] if mine else None
