"""Why a run failed: its logs and its job's own account matched against known failure signatures.

    diagnose(run_dir, ...)   -> a JSON-ready document: findings (signature, cause, fix, evidence file:line),
                                the first error-looking line and a log tail when nothing known matched
    format_diagnosis(doc)    -> the text `tk doctor` prints and a failed `tk launch` appends
    diff_runs(a, b)          -> what differs between two runs or render directories (toolkit.doctor.diff)

Reads only files in the run directory (state/events.jsonl, logs/*.log, slurm-*.out), each bounded: its first
HEAD_BYTES and last TAIL_BYTES. Sits between toolkit.launch (which asks it to explain a failure) and
toolkit.runtime; the job state (Slurm or local) is given by the caller (toolkit.api.doctor asks the launch
backend). Never raises on unreadable or odd files: a diagnosis must not fail.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from toolkit.doctor.signatures import AFTER_LINES, JOB, PHASES, PROXY, SERVER, SIGNATURES, Signature
from orchestrator.states import EventKind
from toolkit.runtime import files, rundir
from toolkit.text import escape_controls

HEAD_BYTES = 64 * 1024
TAIL_BYTES = 256 * 1024
COUNT_LINES_UP_TO = 64 << 20  # a longer file's tail lines are placed by byte offset instead of line number
MAX_EVIDENCE = 3  # lines quoted per finding
MAX_LINE = 400  # characters quoted per line
TAIL_LINES = 20
MAX_LOGS = 512  # log files read per run: the failing component's first, then the run's own components', then others
MAX_LOG_ENTRIES = 100_000  # directory entries of logs/ looked at
MAX_SCAN_LINE = 4096  # characters of a line the signatures are searched in (every scan is linear in the file)
COMPONENT_LOG = re.compile(r"((ctx|gen|agg)-[0-9]+|proxy|etcd|job|membership|config-check|provenance)\.log")

# Each alternative starts at a literal (no leading \w*): a search is linear in the line's length.
ERROR_LINE = re.compile(r"\bERROR\b|Error\b|\berror:|Traceback \(most recent call last\)|Exception\b"
                        r"|\bFATAL\b|Assertion failed|\bKilled\b|exited with code [1-9]|\bfailed\b"
                        r"|: (command )?not found\b")
_NOT_ERROR = re.compile(r"\b(0|no) errors?\b|errors?=0\b|\"errors\": 0")


@dataclass
class Text:
    """One bounded text of the run: where it came from and its lines (line number or None, text)."""

    file: str  # relative to the run directory ("logs/gen-0.log", "state/events.jsonl", "run.json")
    source: str  # server | proxy | job | phases
    lines: list[tuple[int | None, str]]
    size: int
    truncated: bool


def _source_of(name: str) -> str:
    if name.startswith(("ctx-", "gen-", "agg-")):
        return SERVER
    if name.startswith("proxy"):
        return PROXY
    return JOB


def read_bounded(path: Path, head: int = HEAD_BYTES, tail: int = TAIL_BYTES) -> tuple[list[tuple[int | None, str]],
                                                                                      int, bool]:
    """A file's lines with their numbers: all of it, or its first `head` and last `tail` bytes. Only a regular file
    (never a FIFO, a device, or a symlink: opened non-blocking, without following a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return [], 0, False
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(0)
            if size <= head + tail:
                data = f.read(head + tail)
                return [(i, line) for i, line in enumerate(data.decode(errors="replace").splitlines(), 1)], size, False
            first = f.read(head)
            start = size - tail
            f.seek(start)
            last = f.read(tail)
            base = None
            if size <= COUNT_LINES_UP_TO:
                f.seek(0)
                newlines, pos = 0, 0
                while pos < start:
                    chunk = f.read(min(1 << 20, start - pos))
                    if not chunk:
                        break
                    newlines += chunk.count(b"\n")
                    pos += len(chunk)
                base = newlines + 1
    except OSError:
        return [], 0, False
    head_lines = first.decode(errors="replace").splitlines()
    if not first.endswith(b"\n") and head_lines:
        head_lines.pop()  # cut mid-line
    out: list[tuple[int | None, str]] = [(i, line) for i, line in enumerate(head_lines, 1)]
    tail_text = last.decode(errors="replace")
    tail_lines = tail_text.splitlines()
    skip = 0 if start == 0 or last[:1] == b"\n" else 1  # the first tail line is usually cut
    for i, line in enumerate(tail_lines[skip:], skip):
        out.append(((base + i) if base is not None else None, line))
    return out, size, True


def _log_files(directory: Path, accept) -> list[Path]:
    """Regular files (not symlinks) of a directory inside the run whose names `accept` takes; bounded."""
    out = []
    try:
        with os.scandir(directory) as it:
            for i, entry in enumerate(it):
                if i >= MAX_LOG_ENTRIES:
                    break
                if accept(entry.name) and entry.is_file(follow_symlinks=False):
                    out.append(Path(entry.path))
    except OSError:
        pass
    return out


def _texts(run_dir: Path, reason: str | None, failing: str | None = None) -> list[Text]:
    texts: list[Text] = []
    # the job's events as "event<TAB>reason" lines: the reason is the words a signature may match
    phase_lines = [(i, f"{e['event']}\t{e['reason'] or ''}") for i, e in enumerate(rundir.read_events(run_dir), 1)]
    texts.append(Text("state/events.jsonl", PHASES, phase_lines, 0, False))
    if reason:
        texts.append(Text("run.json (reason)", PHASES, [(None, reason)], len(reason), False))
    logs: list[Path] = []
    try:
        log_dir = files.inside(run_dir, "logs")  # logs/ itself must not lead out of the run
        logs = _log_files(log_dir, lambda n: n.endswith((".log", ".out", ".err")))
    except files.FileProblem:
        pass
    logs += _log_files(run_dir, lambda n: n.startswith("slurm-") and n.endswith(".out"))

    def first(p: Path) -> tuple:  # the failing component's own log, the run's components', the job's, the rest
        return (p.stem != failing, not (COMPONENT_LOG.fullmatch(p.name) or p.parent == run_dir), p.name)
    for p in sorted(logs, key=first)[:MAX_LOGS]:
        lines, size, truncated = read_bounded(p)
        rel = str(p.relative_to(run_dir))
        source = JOB if p.parent == run_dir else _source_of(p.name)
        texts.append(Text(rel, source, lines, size, truncated))
    return texts


def _evidence(text: Text, number: int | None, line: str) -> dict:
    where = f"{text.file}:{number}" if number is not None else text.file
    return {"file": text.file, "line": number, "where": where, "text": line.strip()[:MAX_LINE]}


def match(sig: Signature, texts: list[Text]) -> list[dict]:
    """Every line of `texts` (in the sources the signature applies to) one of its patterns finds."""
    out = []
    patterns = sig.compiled()
    after = re.compile(sig.after) if sig.after else None
    header = re.compile(sig.header) if sig.after and sig.header else None
    for text in texts:
        if text.source not in sig.where:
            continue
        last_after = None  # the index of the last line `after` matched
        for i, (number, line) in enumerate(text.lines):
            head = line[:MAX_SCAN_LINE]
            if after is not None and after.search(head):
                last_after = i
            elif header is not None and header.search(head):
                last_after = None  # another table begins: the rows under it are not `after`'s
            if any(p.search(head) for p in patterns) and (
                    after is None or (last_after is not None and i - last_after <= AFTER_LINES)):
                out.append(_evidence(text, number, line))
    return out


def scan(lines: list[str], source: str = SERVER, file: str = "log") -> list[str]:
    """The ids of the signatures that match these lines (as if read from a `source` log): for tests."""
    text = Text(file, source, list(enumerate(lines, 1)), 0, False)
    return [s.id for s in SIGNATURES if match(s, [text])]


def _order(failing: str | None):
    def key(text: Text) -> tuple:
        own = failing is not None and Path(text.file).stem == failing
        return (not own, {PHASES: 0, SERVER: 1, PROXY: 2, JOB: 3}[text.source], text.file)
    return key


def first_error(texts: list[Text], failing: str | None) -> dict | None:
    for text in sorted(texts, key=_order(failing)):
        if text.source == PHASES:
            continue
        for number, line in text.lines:
            if ERROR_LINE.search(line[:MAX_SCAN_LINE]) and not _NOT_ERROR.search(line[:MAX_SCAN_LINE]):
                return _evidence(text, number, line)
    return None


def diagnose(run_dir: str | os.PathLike, *, name: str | None = None, state: str | None = None,
             reason: str | None = None, failing: str | None = None, job: dict | None = None,
             tail_lines: int = TAIL_LINES) -> dict:
    """Match every signature against the run's texts; a JSON-ready document (see the module docstring)."""
    run_dir = Path(run_dir)
    if failing is None:
        failing = failing_component(run_dir)
    texts = _texts(run_dir, reason, failing)
    findings, refused = [], []
    for index, sig in enumerate(SIGNATURES):
        evidence = match(sig, texts)
        if not evidence:
            continue
        own = failing is not None and any(Path(e["file"]).stem == failing for e in evidence)
        finding = {"id": sig.id, "title": sig.title, "cause": sig.cause, "fix": sig.fix_for(evidence), "source": sig.source,
                   "secondary": sig.secondary, "matches": len(evidence), "evidence": evidence[:MAX_EVIDENCE]}
        if sig.per_request:  # a client's request the servers refused: not why a run failed
            refused.append(finding)
        else:
            findings.append((sig.secondary, not own, index, finding))
    findings.sort(key=lambda f: f[:3])
    doc = {
        "run": name or run_dir.name, "run_dir": str(run_dir), "state": state, "reason": reason, "job": job,
        "failing": failing,
        "phases": [line for _, line in texts[0].lines[-8:]],
        "findings": [f[3] for f in findings],
        "refused_requests": refused,
        "logs": [{"file": t.file, "bytes": t.size, "truncated": t.truncated} for t in texts if t.source != PHASES],
        "first_error": first_error(texts, failing),
        "tail": None,
    }
    log_texts = [t for t in sorted(texts, key=_order(failing)) if t.source != PHASES and t.lines]
    tail_of = None
    if doc["first_error"]:
        tail_of = next((t for t in log_texts if t.file == doc["first_error"]["file"]), None)
    tail_of = tail_of or (log_texts[0] if log_texts else None)
    if tail_of is not None and tail_lines > 0:
        doc["tail"] = {"file": tail_of.file, "lines": [line[:MAX_LINE] for _, line in tail_of.lines[-tail_lines:]]}
    return doc


def failing_component(run_dir: Path) -> str | None:
    """The component the job's first `failed` event names (ctx-0, gen-1, proxy, etcd), if any."""
    for e in rundir.read_events(run_dir):
        if e["event"] == EventKind.FAILED:
            return e["component"]
    return None


def inert(text) -> str:
    """Text a run wrote (log lines, event reasons, file names), made safe to print: every control character, line
    or paragraph separator shown as its escape (ESC, BEL, OSC and CSI sequences never reach the terminal):
    toolkit.text's one escaper."""
    return escape_controls(str(text))


def format_diagnosis(doc: dict, *, brief: bool = False) -> str:
    """Plain text: each finding's cause, fix and evidence; else the first error line and the log tail. What the run
    wrote (evidence, the first error line, the tail, file names) is printed inert (`inert`)."""
    out = []
    primary = [f for f in doc["findings"] if not f["secondary"]] or doc["findings"]
    shown = primary[:1] if brief else doc["findings"]
    for f in shown:
        out.append(f"diagnosis [{f['id']}]: {f['title']}")
        out.append(f"  cause: {f['cause']}")
        out.append(f"  fix:   {f['fix']}")
        for e in f["evidence"]:
            out.append(f"  seen:  {inert(e['where'])}: {inert(e['text'])}")
        if f["matches"] > len(f["evidence"]):
            out.append(f"         (+{f['matches'] - len(f['evidence'])} more matching lines)")
        out.append(f"  source: {f['source']}")
    if brief and len(doc["findings"]) > 1:
        out.append(f"  ({len(doc['findings']) - 1} more finding(s): tk doctor {inert(doc['run_dir'])})")
    for f in [] if brief else doc.get("refused_requests", []):
        out.append(f"refused requests [{f['id']}]: {f['title']} ({f['matches']} line(s)); not a failure of the run, "
                   "which went on serving")
        out.append(f"  fix:   {f['fix']}")
        for e in f["evidence"][:1]:
            out.append(f"  seen:  {inert(e['where'])}: {inert(e['text'])}")
    if not doc["findings"]:
        out.append("no known failure signature matched")
        if doc["first_error"]:
            e = doc["first_error"]
            out.append(f"first error-looking line: {inert(e['where'])}: {inert(e['text'])}")
        if doc["tail"] and not brief:
            out.append(f"--- last lines of {inert(doc['tail']['file'])} ---")
            out.extend(inert(line) for line in doc["tail"]["lines"])
    return "\n".join(out)


__all__ = ["diagnose", "failing_component", "format_diagnosis", "inert", "read_bounded", "scan"]
