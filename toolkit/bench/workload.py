"""Workloads -> aiperf command lines. Pure: nothing here runs, reads or writes anything.

A workload is a list of cells; each cell is one `aiperf profile` run (one ISL/OSL shape at one concurrency or
request rate, or multi-turn conversations whose history grows each turn). Every cell streams, excludes a warm-up
phase from the results, fixes the random seed and asks the server to ignore EOS so OSL is exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from toolkit.errors import TkError

WORKLOADS = ("fixed", "isl-sweep", "concurrency-sweep", "multi-turn")
ISL_SWEEP = (128, 512, 1024, 2048)
DEFAULT_CONCURRENCY = {"fixed": (4,), "isl-sweep": (4,), "concurrency-sweep": (1, 4, 16, 64), "multi-turn": (4,)}
DEFAULT_SEED = 100
DEFAULT_ISL, DEFAULT_OSL = 1024, 128  # when --isl / --osl are not given (clipped to what the deployment admits)
# What a chat template may add to the prompt, per message (role markers, a system prompt's share, the generation
# prompt): aiperf's ISL counts the messages' text only, the server counts the templated prompt. The workload keeps
# its requests this far inside the deployment's limit, and the verdict accepts at most this much above ISL.
TEMPLATE_TOKENS_PER_MESSAGE = 32


def template_allowance(turns: int) -> int:
    """Template tokens the last request of a `turns`-turn conversation may carry: its 2 * turns - 1 messages (every
    earlier prompt and answer, the new prompt) and the generation prompt."""
    return TEMPLATE_TOKENS_PER_MESSAGE * 2 * turns


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
    turn_delay_ms: float = 0.0  # multi-turn: think time between a turn's answer and the next turn
    trace: str | None = None  # multi-turn from a mooncake_trace file (sessions, turn deltas, delays, hash_ids)
    trace_block_size: int | None = None  # tokens per hash id of the trace (aiperf --isl-block-size)

    @property
    def multi_turn(self) -> bool:
        return self.turns > 1 or self.trace is not None

    @property
    def warmup_separately(self) -> bool:
        """Multi-turn cells warm up in a run of their own, with other conversations (another seed): aiperf's
        warm-up phase replays the very conversations it then profiles, so the servers' caches would already hold
        the profiled prompts and reuse would be overstated."""
        return self.multi_turn

    def expected_isl(self, turn: int) -> int | None:
        """aiperf's input length of turn `turn` (0-based): the history (every earlier prompt and answer) plus the
        new prompt, before the chat template. None for a trace (its turns differ)."""
        if self.trace is not None:
            return None
        return (turn + 1) * self.isl + turn * self.osl

    @property
    def expected_osl(self) -> int | None:
        """Every answer's length (ignore_eos); None for a trace (its turns differ)."""
        return None if self.trace is not None else self.osl

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


@dataclass(frozen=True)
class _Room:
    """What the deployment leaves a workload's requests: a conversation of ``turns`` turns with answers of ``osl``
    tokens, each request with up to ``allowance`` chat-template tokens on top, must fit its input limit."""

    limits: Limits
    turns: int
    osl: int

    @property
    def allowance(self) -> int:
        return template_allowance(max(1, self.turns))

    @property
    def fitting(self) -> int | None:
        """The largest first-turn ISL whose last turn, with the chat template's tokens, fits the deployment (None
        where its input limit is unknown)."""
        if self.limits.max_input_len is None:
            return None
        return (self.limits.max_input_len - self.allowance - (self.turns - 1) * self.osl) // max(1, self.turns)

    def default_isl(self, kind: str, notes: list[str]) -> int:
        """DEFAULT_ISL, clipped to what fits (with a note); an ISL sweep keeps it (its own lengths are clipped)."""
        fitting = self.fitting
        if kind == "isl-sweep" or fitting is None or not DEFAULT_ISL > fitting >= 1:
            return DEFAULT_ISL
        notes.append(f"ISL {fitting}: the default {DEFAULT_ISL} clipped to what the deployment admits "
                     f"({self.limits.max_input_len} input tokens, {self.limits.source}, less up to {self.allowance} "
                     "tokens the chat template may add)")
        return fitting

    def check_given(self, kind: str, isl: int, given_isl: bool) -> None:
        """An --isl or --osl given is never clipped: one that cannot fit is refused naming the largest that fits."""
        fitting = self.fitting
        if kind not in ("isl-sweep", "multi-turn") and given_isl and fitting is not None and isl > fitting:
            raise BenchInputError(f"--isl {isl} is more than the deployment admits ({self.limits.max_input_len} input "
                                  f"tokens, {self.limits.source}, and the chat template may add up to "
                                  f"{self.allowance}); use --isl {max(1, fitting)} or less")
        if self.limits.max_output_len is not None and self.osl > self.limits.max_output_len:
            raise BenchInputError(f"--osl {self.osl} is more than the deployment admits ({self.limits.max_output_len} "
                                  f"output tokens, {self.limits.source}); use --osl {self.limits.max_output_len} or "
                                  "less")

    def kept(self, isls: list[int], notes: list[str]) -> list[int]:
        """The input lengths that fit, each one skipped with a note; BenchInputError where none does."""
        fitting = self.fitting
        kept = []
        for n in isls:
            longest = self.turns * n + (self.turns - 1) * self.osl
            if fitting is not None and n > fitting:
                what = f"ISL {n}" if self.turns == 1 else f"ISL {n} x {self.turns} turns (last turn {longest} tokens)"
                notes.append(f"{what} skipped: with up to {self.allowance} chat template tokens it is longer than the "
                             f"{self.limits.max_input_len} input tokens the deployment admits ({self.limits.source})")
                continue
            kept.append(n)
        if not kept:
            fix = f"use --isl {fitting} or less" if fitting and fitting >= 1 else "use fewer --turns or a smaller --osl"
            raise BenchInputError("every input length of the workload is longer than the deployment admits: "
                                  + "; ".join(notes) + f". {fix[0].upper()}{fix[1:]}.")
        return kept


def _default_osl(limits: Limits, notes: list[str]) -> int:
    """DEFAULT_OSL, clipped to what the deployment admits (with a note)."""
    if limits.max_output_len is not None and DEFAULT_OSL > limits.max_output_len:
        notes.append(f"OSL {limits.max_output_len}: the default {DEFAULT_OSL} clipped to what the deployment admits "
                     f"({limits.source})")
        return limits.max_output_len
    return DEFAULT_OSL


def _check_options(kind: str, isl: int, osl: int, concurrency, request_rate, turns: int, turn_delay_ms: float) -> None:
    if isl < 1 or osl < 1:
        raise BenchInputError("--isl and --osl must be >= 1")
    if concurrency and request_rate:
        raise BenchInputError("--concurrency and --request-rate exclude each other: give one load axis")
    if kind == "multi-turn" and request_rate:
        raise BenchInputError("multi-turn runs at a concurrency (conversations in flight), not a request rate")
    if turns < 1:
        raise BenchInputError("--turns must be >= 1")
    if not (0 <= turn_delay_ms <= 600_000):
        raise BenchInputError("--turn-delay must be 0 to 600000 ms")


def _loads(kind: str, concurrency, request_rate) -> list[tuple[int | None, float | None]]:
    """(concurrency, request rate) of each cell: the rates given, else the concurrencies (the workload's default)."""
    if request_rate:
        loads: list[tuple[int | None, float | None]] = [(None, r) for r in request_rate]
    else:
        loads = [(c, None) for c in (concurrency or DEFAULT_CONCURRENCY[kind])]
    if any((c is not None and not 1 <= c <= 100_000) or (r is not None and not (math.isfinite(r) and 0 < r <= 100_000))
           for c, r in loads):
        raise BenchInputError("concurrency must be 1..100000 and request rates finite, above 0 and at most 100000/s")
    return loads


def build_workload(kind: str, *, isl: int | None = None, osl: int | None = None,
                   concurrency: tuple[int, ...] | None = None,
                   request_rate: tuple[float, ...] | None = None, requests: int | None = None,
                   warmup: int | None = None, turns: int = 3, conversations: int | None = None,
                   seed: int = DEFAULT_SEED, limits: Limits | None = None, turn_delay_ms: float = 0.0,
                   trace: str | None = None) -> Workload:
    """The cells of a workload, clipped to what the deployment admits (each clip is a note). isl / osl None: the
    defaults (DEFAULT_ISL, DEFAULT_OSL), clipped to the deployment's limits, ISL with room for the chat template's
    tokens (template_allowance); a value given is never clipped, and one that cannot fit is refused naming the flag
    and the largest that fits. ``trace``: a multi-turn workload from a mooncake_trace file."""
    if kind not in WORKLOADS:
        raise BenchInputError(f"unknown workload {kind!r}; valid: {', '.join(WORKLOADS)}")
    limits = limits or Limits()
    notes: list[str] = []
    given_isl = isl is not None
    if osl is None:
        osl = _default_osl(limits, notes)
    n_turns = turns if kind == "multi-turn" else 1
    room = _Room(limits, n_turns, osl)
    if isl is None:
        isl = room.default_isl(kind, notes)
    _check_options(kind, isl, osl, concurrency, request_rate, turns, turn_delay_ms)
    if trace is not None:
        if kind != "multi-turn":
            raise BenchInputError("--trace is a multi-turn workload: add --workload multi-turn")
        return _trace_workload(trace, concurrency, seed, limits, warmup)
    loads = _loads(kind, concurrency, request_rate)
    room.check_given(kind, isl, given_isl)
    kept = room.kept(list(ISL_SWEEP) if kind == "isl-sweep" else [isl], notes)

    cells = []
    for n in kept:
        for c, r in loads:
            load = f"c{c}" if c is not None else f"r{r:g}"
            if kind == "multi-turn":
                convs = conversations or max(8, 2 * (c or 1))
                cells.append(Cell(name=f"mt{n_turns}-isl{n}-osl{osl}-{load}", isl=n, osl=osl, concurrency=c,
                                  request_rate=None, requests=convs * n_turns, warmup=_warmup_for(c, warmup),
                                  turns=n_turns, conversations=convs, turn_delay_ms=turn_delay_ms))
            else:
                cells.append(Cell(name=f"isl{n}-osl{osl}-{load}", isl=n, osl=osl, concurrency=c, request_rate=r,
                                  requests=_requests_for(c, r, requests), warmup=_warmup_for(c, warmup)))
    return Workload(kind=kind, cells=tuple(cells), seed=seed, notes=tuple(notes))


TRACES = ("multiturn-small",)  # traces shipped with tk (toolkit/bench/traces/NAME.jsonl)


def trace_path(name_or_file: str) -> str:
    """A shipped trace's path, or a file the user gave. BenchInputError names the fix."""
    from pathlib import Path

    if name_or_file in TRACES:
        return str(Path(__file__).with_name("traces") / f"{name_or_file}.jsonl")
    p = Path(name_or_file)
    if not p.is_file():
        what = ("no such file" if not p.exists() else "a directory, not a regular file" if p.is_dir()
                else "a FIFO, not a regular file" if p.is_fifo() else "not a regular file")
        raise BenchInputError(f"--trace {name_or_file}: {what} (a mooncake_trace JSONL file, or one of the "
                              f"shipped traces: {', '.join(TRACES)})")
    return str(p.resolve())


MAX_TRACE_BYTES = 64 << 20
MAX_SESSION_ID = 1024  # characters of a session_id (tk and aiperf key conversations by it)
HASH_ID_RANGE = (-2**63, 2**63)  # what a 64-bit block hash holds; aiperf keys its synthetic blocks by them


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _trace_entry(doc, where: str) -> dict:
    """One mooncake_trace line as aiperf 0.13 reads it (aiperf/dataset/loader/models.py ``MooncakeTrace``:
    input_length and output_length ints, hash_ids a list of ints, session_id a string, delay and timestamp numbers
    of milliseconds), checked within tk's bounds. BenchInputError names the line (``where``) and the field."""
    def is_int(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    def is_ms(v) -> bool:
        # an int is compared as it is: math.isfinite(10**400) raises OverflowError
        return (is_int(v) or isinstance(v, float) and math.isfinite(v)) and 0 <= v <= 2**53

    if not isinstance(doc, dict):
        raise BenchInputError(f"{where}: expected an object with session_id, input_length, output_length")
    for key in ("input_length", "output_length"):
        v = doc.get(key)
        if not is_int(v) or not 1 <= v <= 1 << 20:
            raise BenchInputError(f"{where}: {key} {_shown(v)} is not a token count from 1 to {1 << 20}")
    session = doc.get("session_id")
    if session is not None and (not isinstance(session, str) or len(session) > MAX_SESSION_ID):
        raise BenchInputError(f"{where}: session_id {_shown(session)} is not text of at most {MAX_SESSION_ID} "
                              "characters (aiperf reads it as a string)")
    delay = doc.get("delay", 0)
    if delay is not None and (not is_ms(delay) or delay > 3_600_000):
        raise BenchInputError(f"{where}: delay {_shown(delay)} is not 0 to 3600000 ms")
    stamp = doc.get("timestamp")
    if stamp is not None and not is_ms(stamp):
        raise BenchInputError(f"{where}: timestamp {_shown(stamp)} is not a finite number of ms from 0")
    ids = doc.get("hash_ids")
    if ids is not None:
        if not isinstance(ids, list):
            raise BenchInputError(f"{where}: hash_ids {_shown(ids)} is not a list of block hashes (integers)")
        for i, h in enumerate(ids):
            if not is_int(h) or not HASH_ID_RANGE[0] <= h < HASH_ID_RANGE[1]:
                raise BenchInputError(f"{where}: hash_ids[{i}] {_shown(h)} is not a 64-bit integer block hash")
        if len(ids) > doc["input_length"]:
            raise BenchInputError(f"{where}: {len(ids)} hash_ids, more hash_ids than the {doc['input_length']} input "
                                  "tokens they cover (each names a block of at least one token)")
    return doc


def read_trace(path: str) -> list[dict]:
    """The entries of a mooncake_trace file, checked for what tk and aiperf read (session_id, input_length,
    output_length; hash_ids, delay and timestamp optional): bounded in size and in each line's nesting, every
    number finite and in range. BenchInputError names the line and the field at fault."""
    from toolkit.runtime import files

    try:
        text = files.read_text(path, MAX_TRACE_BYTES)
    except files.FileProblem as exc:
        raise BenchInputError(f"--trace {exc}; split the trace or give a regular file") from None
    except OSError as exc:
        raise BenchInputError(f"--trace {path}: cannot be read ({exc.strerror or exc})") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:  # bounded nesting: a line of 200,000 '[' is a message, never a RecursionError
            doc = files.loads(line, what=f"{path}:{n}")
        except files.FileProblem as exc:
            raise BenchInputError(str(exc)) from None
        out.append(_trace_entry(doc, f"{path}:{n}"))
    if not out:
        raise BenchInputError(f"{path}: no trace entries")
    return out


def _trace_workload(trace: str, concurrency, seed: int, limits: Limits, warmup: int | None) -> Workload:
    path = trace_path(trace)
    entries = read_trace(path)
    sessions: dict[object, list[dict]] = {}
    for i, e in enumerate(entries):
        # aiperf gives an entry without a session_id (absent, null or "") a conversation of its own
        # (MooncakeTraceDatasetLoader._group_traces: ``trace.session_id or self.session_id_generator.next()``)
        sessions.setdefault(e.get("session_id") or ("single", i), []).append(e)
    turns = max(len(v) for v in sessions.values())
    longest = max(sum(e["input_length"] + e["output_length"] for e in v) - v[-1]["output_length"]
                  for v in sessions.values())
    osl_max = max(e["output_length"] for e in entries)
    if limits.max_input_len is not None and longest > limits.max_input_len:
        raise BenchInputError(f"--trace {trace}: its longest conversation reaches {longest} input tokens; the "
                              f"deployment admits {limits.max_input_len} ({limits.source})")
    if limits.max_output_len is not None and osl_max > limits.max_output_len:
        raise BenchInputError(f"--trace {trace}: an answer of {osl_max} tokens; the deployment admits "
                              f"{limits.max_output_len} ({limits.source})")
    block = None
    for e in entries:
        ids = e.get("hash_ids") or []
        if len(ids) > 1:  # (len - 1) full blocks and a last, possibly shorter one (aiperf --isl-block-size)
            block = max(block or 0, -(-e["input_length"] // len(ids)))
    isl = round(sum(e["input_length"] for e in entries) / len(entries))
    osl = round(sum(e["output_length"] for e in entries) / len(entries))
    name = trace if trace in TRACES else __import__("pathlib").Path(path).stem
    cells = tuple(Cell(name=f"trace-{name}-c{c}", isl=isl, osl=osl, concurrency=c, request_rate=None,
                       requests=len(entries), warmup=_warmup_for(c, warmup), turns=turns,
                       conversations=len(sessions), trace=path, trace_block_size=block)
                  for c in (concurrency or DEFAULT_CONCURRENCY["multi-turn"]))
    return Workload(kind="multi-turn", cells=cells, seed=seed,
                    notes=(f"trace {name}: {len(sessions)} conversations, {len(entries)} turns (up to {turns} per "
                           f"conversation), mean new input {isl} and answer {osl} tokens per turn",))


def aiperf_argv(cell: Cell, *, aiperf: str, url: str | Sequence[str], model: str, tokenizer: str, out_dir: str,
                seed: int = DEFAULT_SEED, request_timeout_s: float | None = None, warmup_run: bool = False) -> list[str]:
    """The `aiperf profile` command line of one cell (aiperf 0.13). Several urls (an aggregated run's instances,
    which have no proxy in front): one --url each, which aiperf 0.13 round-robins over (`aiperf profile --help`:
    "Multiple URLs can be specified for load balancing across multiple instances", --url-strategy round-robin).

    Multi-turn: aiperf's conversations (``--conversation-num``, ``--conversation-turn-mean``, think time
    ``--conversation-turn-delay-mean``), or a ``mooncake_trace`` file (``--input-file``, ``--custom-dataset-type``:
    sessions by ``session_id``, per-turn ``input_length`` deltas, ``output_length``, ``delay``, ``hash_ids`` of
    ``--isl-block-size`` tokens); history is resent with the live answers (context mode
    ``deltas_without_responses``), each session under its own ``X-Correlation-ID`` header, which TensorRT-LLM's
    conversation router reads as the conversation id. ``warmup_run``: the cell's separate warm-up (another seed,
    synthetic conversations, no warm-up phase of its own)."""
    urls = [url] if isinstance(url, str) else list(url)
    argv = [aiperf, "profile", "--model", model, "--tokenizer", tokenizer]
    for u in urls:
        argv += ["--url", u]
    argv += ["--endpoint-type", "chat", "--streaming"]
    if cell.concurrency is not None:
        argv += ["--concurrency", str(cell.concurrency)]
    if cell.request_rate is not None:
        argv += ["--request-rate", f"{cell.request_rate:g}"]
    trace = cell.trace if not warmup_run else None
    if trace is not None:
        argv += ["--input-file", trace, "--custom-dataset-type", "mooncake_trace", "--no-fixed-schedule",
                 "--conversation-num", str(cell.conversations)]  # every session (aiperf's default: 10 requests)
        if cell.trace_block_size:
            argv += ["--isl-block-size", str(cell.trace_block_size)]
    elif warmup_run:
        sessions = max(1, -(-cell.warmup // max(cell.turns, 1)))
        argv += ["--conversation-num", str(sessions), "--conversation-turn-mean", str(min(cell.turns, 2)),
                 "--conversation-turn-stddev", "0"]
    elif cell.turns > 1 or cell.conversations:
        argv += ["--conversation-num", str(cell.conversations), "--conversation-turn-mean", str(cell.turns),
                 "--conversation-turn-stddev", "0"]
        if cell.turn_delay_ms:
            argv += ["--conversation-turn-delay-mean", f"{cell.turn_delay_ms:g}",
                     "--conversation-turn-delay-stddev", "0"]
    else:
        argv += ["--request-count", str(cell.requests)]
    if not cell.warmup_separately:
        argv += ["--warmup-request-count", str(cell.warmup)]
    if trace is None:
        argv += ["--prompt-input-tokens-mean", str(cell.isl), "--prompt-input-tokens-stddev", "0",
                 "--prompt-output-tokens-mean", str(cell.osl), "--prompt-output-tokens-stddev", "0"]
    argv += ["--extra-inputs", "ignore_eos:true",
             "--random-seed", str(seed + 1 if warmup_run else seed),
             "--ui-type", "none", "--no-server-metrics",
             "--output-artifact-dir", out_dir]
    if request_timeout_s:
        argv += ["--request-timeout-seconds", f"{request_timeout_s:g}"]
    return argv
