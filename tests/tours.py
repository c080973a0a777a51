"""README tours, kept true: every transcript in the docs that a reader is meant to run is run, and its output
compared with what the docs show.

A tour is a fenced block preceded by a marker comment (blank lines between them are allowed):

    <!-- tour: NAME [layer=unit|slow|slurm|launch] [match=exact|shape] [host=WORD] [file=PATH] -->
    ```
    $ tk render recipes/llama-3.3-70b-h100.yaml -o out/ --set generation.instances=4
    rendered 10 files for llama-3.3-70b-h100 into out/
    ...
    ```

- ``$ `` starts a command (a line ending in ``\\`` continues it); the lines up to the next ``$ `` are its output,
  stdout and stderr together, as a terminal shows them. A command shown without output is run and its output not
  compared. A line ``...`` stands for any number of lines (none included); ``…`` in a line for any text there.
- Every command must exit 0, unless the next command is ``echo $?``, whose output then says what it must be.
- Blocks with the same NAME are one tour: they run in order in one scratch directory (which holds links to the
  checkout's ``recipes``, ``scripts``, ``docs`` and ``benchmarks``), each block in a fresh ``bash``; a block with
  ``file=PATH`` is not run: its text must equal the file PATH the tour's earlier blocks wrote.
- A ```` ```python ```` block is run with this Python (the checkout importable).
- ``match=shape`` compares numbers as numbers (any value) and table borders whatever their widths: for output
  measured on a machine (timings, throughput). ``host=WORD``: WORD in the shown output stands for this machine's
  host name. Run names' timestamps (``-20261122-224701``) and local job ids (``local-741b86774534``) always match
  any other.
- ``layer``: ``unit`` (seconds, nothing launched: tests/unit), ``slow`` (aiconfigurator, tens of seconds:
  tests/size, marked slow), ``launch`` (starts a local deployment) and ``slurm`` (uses the dev Slurm cluster):
  tests/integration, run alone.

A block with ``$ `` commands and no tour marker must say why it is not one: ``<!-- not-a-tour: REASON -->``
(a syntax summary, output that cannot be reproduced here). tests/unit/test_readme_tours.py holds that rule.

Each tour runs with its own run index and runs directory (TK_STATE_DIR, TK_RUNS_DIR in the scratch directory) and no
site defaults (TK_SITE=none), so it neither sees nor touches the user's runs.

    python3 -m tests.tours [FILE.md ...] [--layer unit,slow] [--tour NAME] [--keep]     (scripts/check-readme)
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = (ROOT / "README.md",)
LAYERS = ("unit", "slow", "launch", "slurm")
LINKED = ("recipes", "scripts", "docs", "benchmarks")
_MARKER = re.compile(r"<!--\s*(tour|not-a-tour):?\s*(.*?)\s*-->")
_FENCE = re.compile(r"^(`{3,})(\w*)\s*$")
_TIMESTAMP = re.compile(r"-[0-9]{8}-[0-9]{6}(-[0-9]+)?")
_LOCAL_JOB = re.compile(r"\blocal-[0-9a-f]{12}\b")  # a local run's job id (tk launch --local)
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?")
TOUR_TIMEOUT_S = {"unit": 120, "slow": 300, "launch": 600, "slurm": 600}
_MARK = "@@TK-TOUR"


@dataclass
class Command:
    text: str  # as shown (continuation lines joined with their backslashes and newlines)
    expected: list[str] = field(default_factory=list)
    line: int = 0  # where it is in the file


@dataclass
class Block:
    tour: str
    file: Path
    line: int  # the fence's line
    lang: str
    text: str
    options: dict
    commands: list[Command] = field(default_factory=list)

    @property
    def layer(self) -> str:
        return self.options.get("layer", "unit")

    @property
    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


@dataclass
class Unmarked:
    file: Path
    line: int


def _options(text: str) -> tuple[str, dict]:
    words = shlex.split(text)
    name = words[0] if words and "=" not in words[0] else ""
    return name, dict(w.split("=", 1) for w in words[1 if name else 0:] if "=" in w)


def parse(path: Path) -> tuple[list[Block], list[Unmarked]]:
    """The tours of a markdown file, and the blocks with `$ ` commands that carry no marker."""
    lines = path.read_text().splitlines()
    blocks, unmarked = [], []
    marker = None
    i = 0
    while i < len(lines):
        m = _MARKER.search(lines[i])
        if m:
            marker = (m.group(1), m.group(2))
            i += 1
            continue
        fence = _FENCE.match(lines[i])
        if not fence:
            if lines[i].strip():
                marker = None  # a marker belongs to the block right after it
            i += 1
            continue
        start, lang = i, fence.group(2)
        body = []
        i += 1
        while i < len(lines) and lines[i].rstrip() != fence.group(1):
            body.append(lines[i])
            i += 1
        i += 1
        kind, text = marker or ("", "")
        marker = None
        has_commands = any(b.startswith("$ ") for b in body)
        if kind == "tour":
            name, options = _options(text)
            block = Block(tour=name or f"{path.name}:{start + 1}", file=path, line=start + 1, lang=lang,
                          text="\n".join(body) + "\n", options=options)
            block.commands = _commands(body, start + 2)
            blocks.append(block)
        elif kind != "not-a-tour" and has_commands:
            unmarked.append(Unmarked(path, start + 1))
    return blocks, unmarked


def _commands(body: list[str], first_line: int) -> list[Command]:
    out: list[Command] = []
    cont = False
    for n, line in enumerate(body, first_line):
        if cont:
            out[-1].text += "\n" + line
            cont = line.endswith("\\")
        elif line.startswith("$ "):
            out.append(Command(line[2:], line=n))
            cont = line.endswith("\\")
        elif out:
            out[-1].expected.append(line)
    return out


def tours(paths=DOCS, layers=LAYERS) -> dict[str, list[Block]]:
    """Tour name -> its blocks, in file order, for tours whose every block is in one of `layers`."""
    out: dict[str, list[Block]] = {}
    for path in paths:
        for block in parse(Path(path))[0]:
            out.setdefault(block.tour, []).append(block)
    return {name: blocks for name, blocks in out.items() if all(b.layer in layers for b in blocks)}


# --- running -----------------------------------------------------------------------------------------------

def scratch_dir(base: Path | None = None) -> Path:
    work = Path(tempfile.mkdtemp(prefix="tk-tour-", dir=base))
    for name in LINKED:
        (work / name).symlink_to(ROOT / name)
    return work


def environment(work: Path) -> dict:
    env = {**os.environ, "TK_STATE_DIR": str(work / ".state"), "TK_RUNS_DIR": str(work / "runs"), "TK_SITE": "none",
           "PYTHONPATH": str(ROOT), "COLUMNS": "120", "TERM": "dumb", "PYTHONUNBUFFERED": "1"}
    env.pop("NO_COLOR", None)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def _script(block: Block) -> str:
    parts = ["set +e", "exec 2>&1", "__tk_rc=0"]
    for i, cmd in enumerate(block.commands):
        # the markers must not change $?: `echo $?` shows the previous command's status
        parts.append(f"printf '\\n{_MARK} CMD {i}\\n'; (exit $__tk_rc)")
        parts.append(cmd.text)
        parts.append(f"__tk_rc=$?; printf '\\n{_MARK} RC {i} %d\\n' \"$__tk_rc\"")
    return "\n".join(parts) + "\n"


@dataclass
class Outcome:
    block: Block
    problems: list[str]
    output: str


def run_block(block: Block, work: Path, timeout_s: float | None = None) -> Outcome:
    timeout_s = timeout_s or TOUR_TIMEOUT_S.get(block.layer, 300)
    if "file" in block.options:
        target = work / block.options["file"]
        actual = target.read_text() if target.is_file() else None
        if actual is None:
            return Outcome(block, [f"{block.where}: the tour wrote no {block.options['file']}"], "")
        diff = compare(block.text.splitlines(), actual.splitlines(), block.options)
        return Outcome(block, [f"{block.where}: {block.options['file']} differs: {d}" for d in diff], actual)
    env = environment(work)
    if block.lang == "python":
        argv = [sys.executable, "-c", block.text]
    else:
        argv = ["bash", "-c", _script(block)]
    try:
        proc = subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout_s, start_new_session=True)
        output = proc.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace")
        return Outcome(block, [f"{block.where}: did not finish in {timeout_s:g}s"], output)
    if block.lang == "python":
        return Outcome(block, [] if proc.returncode == 0 else
                       [f"{block.where}: the Python block exited {proc.returncode}: {output[-2000:]}"], output)
    return Outcome(block, _check_commands(block, output), output)


def _check_commands(block: Block, output: str) -> list[str]:
    pieces = re.split(rf"\n?{_MARK} CMD ([0-9]+)\n", output)
    results: dict[int, tuple[str, int | None]] = {}
    for i in range(1, len(pieces) - 1, 2):
        text = pieces[i + 1]
        m = re.search(rf"\n?{_MARK} RC [0-9]+ ([0-9]+)\n?$", text)
        results[int(pieces[i])] = (text[:m.start()] if m else text, int(m.group(1)) if m else None)
    problems = []
    for i, cmd in enumerate(block.commands):
        where = f"{block.file.relative_to(ROOT)}:{cmd.line}: $ {cmd.text.splitlines()[0][:100]}"
        if i not in results:
            problems.append(f"{where}: never ran (an earlier command ended the shell?)")
            break
        text, rc = results[i]
        nxt = block.commands[i + 1].text.strip() if i + 1 < len(block.commands) else ""
        if rc is None:
            problems.append(f"{where}: did not finish")
        elif rc != 0 and nxt != "echo $?":
            tail = "\n".join(text.splitlines()[-15:])
            problems.append(f"{where}: exited {rc}\n{tail}")
        if cmd.expected:
            for d in compare(cmd.expected, text.splitlines(), block.options):
                problems.append(f"{where}: {d}")
    return problems


# --- comparing ----------------------------------------------------------------------------------------------

def normalize(line: str, options: dict) -> str:
    line = _TIMESTAMP.sub("-<time>", line.rstrip())
    line = _LOCAL_JOB.sub("local-<job>", line)
    if options.get("match") == "shape":
        line = _NUMBER.sub("#", line)
        line = re.sub(r"[━─═]+", "─", line)
        line = re.sub(r"\s+", " ", line)
    return line


class _Elided(str):
    """A shown line with "…" in it: "…" stands for any text on that line."""

    def __eq__(self, other):
        pattern = ".*".join(re.escape(part) for part in str.split(self, "…"))
        return isinstance(other, str) and re.fullmatch(pattern, other) is not None

    __hash__ = str.__hash__


def compare(expected: list[str], actual: list[str], options: dict) -> list[str]:
    """What differs between the lines shown and the lines printed ("..." lines match any run of lines, "…" in a
    line any text)."""
    host = options.get("host")
    here = socket.gethostname()
    exp = []
    for line in expected:
        if host:
            line = re.sub(rf"\b{re.escape(host)}\b", here, line)
        if line.strip() == "...":
            exp.append(None)
        else:
            shown = normalize(line, options)
            exp.append(_Elided(shown) if "…" in shown else shown)
    act = [normalize(line, options) for line in actual]
    while act and not act[-1].strip():
        act.pop()
    while act and not act[0].strip():
        act.pop(0)
    if _match(exp, 0, act, 0, {}):
        return []
    return [_first_difference(exp, act)]


def _match(exp, i, act, j, memo) -> bool:
    key = (i, j)
    if key in memo:
        return memo[key]
    if i == len(exp):
        ok = j == len(act)
    elif exp[i] is None:
        ok = _match(exp, i + 1, act, j, memo) or (j < len(act) and _match(exp, i, act, j + 1, memo))
    else:
        ok = j < len(act) and exp[i] == act[j] and _match(exp, i + 1, act, j + 1, memo)
    memo[key] = ok
    return ok


def _first_difference(exp, act) -> str:
    """Where the best alignment of the shown lines with the printed ones breaks: the shown line furthest along that
    some alignment reaches, against the printed line there."""
    seen, frontier, best = set(), [(0, 0)], (0, 0)
    while frontier:
        i, j = frontier.pop()
        if (i, j) in seen or i > len(exp) or j > len(act):
            continue
        seen.add((i, j))
        best = max(best, (i, j))
        if i == len(exp):
            continue
        if exp[i] is None:
            frontier += [(i + 1, j), (i, j + 1)] if j < len(act) else [(i + 1, j)]
        elif j < len(act) and exp[i] == act[j]:
            frontier.append((i + 1, j + 1))
    i, j = best
    if i == len(exp):
        return f"the output has {len(act) - j} more line(s), from {act[j]!r}" if j < len(act) else "differs"
    if j >= len(act):
        return f"shown line {i + 1} {exp[i]!r} is missing (the output has {len(act)} lines)"
    return f"shown line {i + 1} differs:\n      shown:   {exp[i]!r}\n      printed: {act[j]!r}"


def run_tour(blocks: list[Block], base: Path | None = None, keep: bool = False, show: bool = False) -> list[str]:
    work = scratch_dir(base)
    problems: list[str] = []
    try:
        for block in blocks:
            outcome = run_block(block, work)
            if show:  # what the block printed, each command's output after its `$ ` line (to update the docs)
                text = re.sub(rf"\n?{_MARK} RC [0-9]+ ([0-9]+)\n", lambda m: f"[exit {m.group(1)}]\n", outcome.output)
                text = re.sub(rf"\n?{_MARK} CMD ([0-9]+)\n",
                              lambda m, block=block: "$ " + block.commands[int(m.group(1))].text + "\n", text)
                print(f"--- {block.where} ---\n{text}", flush=True)
            problems += outcome.problems
            if outcome.problems:
                printed = re.sub(rf"\n?{_MARK} (CMD|RC) [0-9 ]+\n", "\n", outcome.output).strip().splitlines()
                problems.append(f"{block.where}: what it printed (last {min(len(printed), 80)} lines):\n    "
                                + "\n    ".join(printed[-80:]))
                break
    finally:
        _stop_runs(work)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return problems


def _stop_runs(work: Path) -> None:
    """Stop what a failed tour left running (its own runs only: the tour's run index). A tour that made no run (no
    runs directory, no run index) has nothing to stop: no interpreter is started to find that out."""
    if not any((work / name).exists() for name in ("runs", ".state")):
        return
    env = environment(work)
    code = ("from toolkit import api\nfor r in api.runs():\n    if r.state not in ('stopped', 'failed', 'rendered'):"
            "\n        api.stop(r)\n")
    subprocess.run([sys.executable, "-c", code], cwd=work, env=env, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="check-readme", description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, default=list(DOCS))
    ap.add_argument("--layer", default="unit,slow", help=f"comma-separated, of {', '.join(LAYERS)} (or all)")
    ap.add_argument("--tour", action="append", help="only this tour (repeatable)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directories")
    ap.add_argument("--show", action="store_true", help="print what each block printed")
    ap.add_argument("--list", action="store_true", help="list the tours and exit")
    args = ap.parse_args(argv)
    layers = LAYERS if args.layer == "all" else tuple(args.layer.split(","))
    files = [p.resolve() for p in args.files]
    found = tours(files, layers)
    bad = [u for f in files for u in parse(f)[1]]
    for u in bad:
        print(f"{u.file.relative_to(ROOT)}:{u.line}: a block with $ commands and no <!-- tour: ... --> or "
              "<!-- not-a-tour: REASON --> marker", file=sys.stderr)
    failed = 0
    for name, blocks in found.items():
        if args.tour and name not in args.tour:
            continue
        if args.list:
            print(f"{name:<24} {blocks[0].layer:<7} {', '.join(b.where for b in blocks)}")
            continue
        problems = run_tour(blocks, keep=args.keep, show=args.show)
        print(f"{'ok  ' if not problems else 'FAIL'} {name} ({', '.join(b.where for b in blocks)})", flush=True)
        for p in problems:
            print("  " + p.replace("\n", "\n  "))
        failed += bool(problems)
    return 1 if failed or bad else 0


if __name__ == "__main__":
    sys.exit(main())
