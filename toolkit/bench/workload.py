"""Workloads -> aiperf command lines. Pure: nothing here runs, reads or writes anything.

A workload is a list of cells; each cell is one `aiperf profile` run (one ISL/OSL shape at one concurrency or
request rate, or multi-turn conversations whose history grows each turn). Every cell streams, excludes a warm-up
phase from the results, fixes the random seed and asks the server to ignore EOS so OSL is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from toolkit.errors import TkError

WORKLOADS = ("fixed", "isl-sweep", "concurrency-sweep", "multi-turn")
ISL_SWEEP = (128, 512, 1024, 2048)
DEFAULT_CONCURRENCY = {"fixed": (4,), "isl-sweep": (4,), "concurrency-sweep": (1, 4, 16, 64), "multi-turn": (4,)}
DEFAULT_SEED = 100
DEFAULT_ISL, DEFAULT_OSL = 1024, 128  # when --isl / --osl are not given (clipped to what the deployment admits)


class BenchInputError(TkError):
    """Bad input to tk bench (unknown workload or SLA key, a run that does not serve, aiperf missing): exit 2."""

    exit_code = 2


@dataclass(frozen=True)
class Cell:
    """One aiperf run."""

    name: str  # isl1024-osl128-c4, isl1024-osl128-r2.5, mt3-isl256-osl64-c4
    isl: int  # input tokens of a (first-turn) request
    osl: int
    concurrency: int | None
    request_rate: float | None
    requests: int  # profiled requests (multi-turn: conversations x turns)
    warmup: int  # warm-up requests, excluded from the results
    turns: int = 1
    conversations: int | None = None  # multi-turn only

    def expected_isl(self, turn: int) -> int:
        """aiperf's input length of turn `turn` (0-based): the history (every earlier prompt and answer) plus the
        new prompt, before the chat template."""
        return (turn + 1) * self.isl + turn * self.osl

    @property
    def longest_input(self) -> int:
        return self.expected_isl(self.turns - 1)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Workload:
    kind: str
    cells: tuple[Cell, ...]
    seed: int = DEFAULT_SEED
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "seed": self.seed, "notes": list(self.notes),
                "cells": [c.to_dict() for c in self.cells]}


@dataclass(frozen=True)
class Limits:
    """What the deployment admits (the plan's traffic section); None where unknown."""

    max_input_len: int | None = None
    max_output_len: int | None = None
    source: str = "the plan's traffic.max_input_len / max_output_len"


def _requests_for(concurrency: int | None, rate: float | None, requests: int | None) -> int:
    if requests:
        return requests
    if concurrency:
        return max(32, 10 * concurrency)
    return max(32, int(round(10 * (rate or 1))))


def _warmup_for(concurrency: int | None, warmup: int | None) -> int:
    if warmup is not None:
        return max(1, warmup)  # aiperf refuses 0 (`--warmup-request-count` must be > 0)
    return max(1, min(2 * (concurrency or 1), 32))


def build_workload(kind: str, *, isl: int | None = None, osl: int | None = None,
                   concurrency: tuple[int, ...] | None = None,
                   request_rate: tuple[float, ...] | None = None, requests: int | None = None,
                   warmup: int | None = None, turns: int = 3, conversations: int | None = None,
                   seed: int = DEFAULT_SEED, limits: Limits | None = None) -> Workload:
    """The cells of a workload, clipped to what the deployment admits (each clip is a note). isl / osl None: the
    defaults (DEFAULT_ISL, DEFAULT_OSL), clipped to the deployment's limits; a value given is never clipped, and
    one over a limit is refused naming the flag."""
    if kind not in WORKLOADS:
        raise BenchInputError(f"unknown workload {kind!r}; valid: {', '.join(WORKLOADS)}")
    limits = limits or Limits()
    notes: list[str] = []
    if isl is None:
        isl = DEFAULT_ISL
        if kind != "isl-sweep" and limits.max_input_len is not None and isl > limits.max_input_len:
            isl = limits.max_input_len
            notes.append(f"ISL {isl}: the default {DEFAULT_ISL} clipped to what the deployment admits "
                         f"({limits.source})")
    if osl is None:
        osl = DEFAULT_OSL
        if limits.max_output_len is not None and osl > limits.max_output_len:
            osl = limits.max_output_len
            notes.append(f"OSL {osl}: the default {DEFAULT_OSL} clipped to what the deployment admits "
                         f"({limits.source})")
    if isl < 1 or osl < 1:
        raise BenchInputError("--isl and --osl must be >= 1")
    if concurrency and request_rate:
        raise BenchInputError("--concurrency and --request-rate exclude each other: give one load axis")
    if kind == "multi-turn" and request_rate:
        raise BenchInputError("multi-turn runs at a concurrency (conversations in flight), not a request rate")
    if turns < 1:
        raise BenchInputError("--turns must be >= 1")
    if request_rate:
        loads: list[tuple[int | None, float | None]] = [(None, r) for r in request_rate]
    else:
        loads = [(c, None) for c in (concurrency or DEFAULT_CONCURRENCY[kind])]
    import math
    if any((c is not None and not 1 <= c <= 100_000) or (r is not None and not (math.isfinite(r) and 0 < r <= 100_000))
           for c, r in loads):
        raise BenchInputError("concurrency must be 1..100000 and request rates finite, above 0 and at most 100000/s")

    isls = list(ISL_SWEEP) if kind == "isl-sweep" else [isl]
    n_turns = turns if kind == "multi-turn" else 1
    if kind not in ("isl-sweep", "multi-turn") and limits.max_input_len is not None and isl > limits.max_input_len:
        raise BenchInputError(f"--isl {isl} is more than the deployment admits ({limits.max_input_len} input "
                              f"tokens, {limits.source}); use --isl {limits.max_input_len} or less")
    if limits.max_output_len is not None and osl > limits.max_output_len:
        raise BenchInputError(f"--osl {osl} is more than the deployment admits ({limits.max_output_len} output "
                              f"tokens, {limits.source}); use --osl {limits.max_output_len} or less")
    kept = []
    for n in isls:
        longest = n_turns * n + (n_turns - 1) * osl
        if limits.max_input_len is not None and longest > limits.max_input_len:
            what = f"ISL {n}" if n_turns == 1 else f"ISL {n} x {n_turns} turns (last turn {longest} tokens)"
            notes.append(f"{what} skipped: the deployment admits at most {limits.max_input_len} input tokens "
                         f"({limits.source})")
            continue
        kept.append(n)
    if not kept:
        raise BenchInputError("every input length of the workload is longer than the deployment admits: "
                              + "; ".join(notes) + ". Use a smaller --isl (or fewer --turns).")

    cells = []
    for n in kept:
        for c, r in loads:
            load = f"c{c}" if c is not None else f"r{r:g}"
            if kind == "multi-turn":
                convs = conversations or max(8, 2 * (c or 1))
                cells.append(Cell(name=f"mt{n_turns}-isl{n}-osl{osl}-{load}", isl=n, osl=osl, concurrency=c,
                                  request_rate=None, requests=convs * n_turns, warmup=_warmup_for(c, warmup),
                                  turns=n_turns, conversations=convs))
            else:
                cells.append(Cell(name=f"isl{n}-osl{osl}-{load}", isl=n, osl=osl, concurrency=c, request_rate=r,
                                  requests=_requests_for(c, r, requests), warmup=_warmup_for(c, warmup)))
    return Workload(kind=kind, cells=tuple(cells), seed=seed, notes=tuple(notes))


def aiperf_argv(cell: Cell, *, aiperf: str, url: str | Sequence[str], model: str, tokenizer: str, out_dir: str,
                seed: int = DEFAULT_SEED, request_timeout_s: float | None = None) -> list[str]:
    """The `aiperf profile` command line of one cell (aiperf 0.13). Several urls (an aggregated run's instances,
    which have no proxy in front): one --url each, which aiperf 0.13 round-robins over (`aiperf profile --help`:
    "Multiple URLs can be specified for load balancing across multiple instances", --url-strategy round-robin)."""
    urls = [url] if isinstance(url, str) else list(url)
    argv = [aiperf, "profile", "--model", model, "--tokenizer", tokenizer]
    for u in urls:
        argv += ["--url", u]
    argv += ["--endpoint-type", "chat", "--streaming"]
    if cell.concurrency is not None:
        argv += ["--concurrency", str(cell.concurrency)]
    if cell.request_rate is not None:
        argv += ["--request-rate", f"{cell.request_rate:g}"]
    if cell.turns > 1 or cell.conversations:
        argv += ["--conversation-num", str(cell.conversations), "--conversation-turn-mean", str(cell.turns),
                 "--conversation-turn-stddev", "0"]
    else:
        argv += ["--request-count", str(cell.requests)]
    argv += ["--warmup-request-count", str(cell.warmup),
             "--prompt-input-tokens-mean", str(cell.isl), "--prompt-input-tokens-stddev", "0",
             "--prompt-output-tokens-mean", str(cell.osl), "--prompt-output-tokens-stddev", "0",
             "--extra-inputs", "ignore_eos:true",
             "--random-seed", str(seed),
             "--ui-type", "none", "--no-server-metrics",
             "--output-artifact-dir", out_dir]
    if request_timeout_s:
        argv += ["--request-timeout-seconds", f"{request_timeout_s:g}"]
    return argv
