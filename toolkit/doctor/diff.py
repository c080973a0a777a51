"""`tk diff RUN_A RUN_B`: what differs between two runs (or two `tk render` directories).

    rendered   per rendered file (ctx.yaml, gen.yaml, disagg.yaml, *.env, launch.sbatch, job.json): same, changed (a
               unified diff, at most MAX_DIFF_LINES lines), or only in one of them
    versions   per version key of the nodes' provenance (provenance/NODE.json, written at launch): the values
               seen on the nodes of each run, where they differ
    nodes      the nodes each run ran on (nodes.tsv), where they differ
    run        the run records' backend, recipe, engine, state and reason, where they differ
    supervision  per component, what the job's supervision did (state/events.jsonl: exits, restarts, wedges, lost,
               restarts whose step srun never created), where it differs
    results    validation and benchmark results (report.json, benchmark*.json / results/*.json, and each tk bench
               directory's verdict.json and results.csv, paired by bench name, the latest of each): the values that
               differ (at most MAX_RESULT_KEYS)

Reads only, and only regular files inside each directory (no symlink leads out of it); every file is read bounded
in size (MAX_FILE_BYTES) and JSON in nesting depth; a damaged file counts as absent.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import os
import re
from pathlib import Path

from orchestrator.states import EventKind
from toolkit.runtime import files, rundir

MAX_FILE_BYTES = 1 << 20
MAX_DIFF_LINES = 200
MAX_DIFF_INPUT_LINES = 5000  # longer files are said to differ, not diffed (difflib is quadratic in the worst case)
MAX_RESULT_KEYS = 60
RENDERED = ("ctx.yaml", "gen.yaml", "disagg.yaml", "ctx.env", "gen.env", "proxy.env", "launch.sbatch", "job.json",
            "validate.sbatch", "params.json")
# The job's events counted per component (orchestrator.states.EventKind values).
SUPERVISION_COUNTS = {"exits": EventKind.EXITED, "restarts": EventKind.RESTARTING, "wedged": EventKind.WEDGED,
                      "lost": EventKind.LOST, "steps_not_created": EventKind.STEP_NOT_CREATED,
                      "unregistered": EventKind.UNREGISTERED}
RUN_FIELDS = ("recipe", "backend", "engine", "model", "nodes", "state", "reason")
RESULT_FILES = ("report.json", "benchmark.json", "benchmark*.json", "results/*.json")


BENCH_STAMP = re.compile(r"-[0-9]{8}-[0-9]{6}(-[0-9]+)?")  # tk bench's NAME-YYYYmmdd-HHMMSS[-N]
MAX_BENCH_DIRS = 256


def _read(root: Path, rel: str | Path, cut: bool = True) -> str | None:
    """root/rel if it is a regular file inside root (symlinks resolved): its first MAX_FILE_BYTES (marked when cut);
    None if absent, unreadable, or anything else."""
    try:
        path = files.inside(root, rel)
        data = files.read_bytes(path, MAX_FILE_BYTES + 1, follow=False, longer="head")
    except (OSError, files.FileProblem):
        return None
    text = data[:MAX_FILE_BYTES].decode(errors="replace")
    return text + ("\n[... cut at 1 MiB ...]\n" if cut and len(data) > MAX_FILE_BYTES else "")


def _json(root: Path, rel: str | Path):
    """A JSON file inside root, bounded in size and depth; None if absent or damaged."""
    text = _read(root, rel, cut=False)
    if text is None or len(text) >= MAX_FILE_BYTES:
        return None
    try:
        return files.loads(text)
    except files.FileProblem:
        return None


def _rendered_names(d: Path) -> set[str]:
    names = {n for n in RENDERED if (d / n).is_file()}
    manifest = _json(d, "manifest.json")
    if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict):
        names |= {n for n in manifest["files"] if isinstance(n, str) and "/" not in n and n != "manifest.json"
                  and (d / n).is_file()}
    return names


def _rendered(a: Path, b: Path) -> dict:
    out = {}
    for name in sorted(_rendered_names(a) | _rendered_names(b)):
        ta, tb = _read(a, name), _read(b, name)
        if ta is None or tb is None:
            out[name] = {"status": f"only in {'A' if tb is None else 'B'}"}
            continue
        if ta == tb:
            out[name] = {"status": "same"}
            continue
        la, lb = ta.splitlines(), tb.splitlines()
        if max(len(la), len(lb)) > MAX_DIFF_INPUT_LINES:
            out[name] = {"status": "changed", "diff": [f"[{len(la)} / {len(lb)} lines: longer than tk diffs "
                                                       f"({MAX_DIFF_INPUT_LINES}); compare the files]"]}
            continue
        lines = list(difflib.unified_diff(la, lb, f"A/{name}", f"B/{name}", lineterm="", n=2))
        cut = len(lines) > MAX_DIFF_LINES
        out[name] = {"status": "changed", "diff": lines[:MAX_DIFF_LINES] + ([f"[... {len(lines) - MAX_DIFF_LINES} "
                                                                             "more diff lines ...]"] if cut else [])}
    return out


def provenance(d: Path) -> dict[str, dict]:
    """Node name -> that node's provenance record (provenance/*.json); damaged files are skipped."""
    out = {}
    try:
        names = sorted(p.name for p in files.inside(d, "provenance").glob("*.json"))[:1024]
    except (OSError, files.FileProblem):
        return out
    for name in names:
        doc = _json(d, Path("provenance") / name)
        if isinstance(doc, dict):
            out[name[:-len(".json")]] = doc
    return out


def _flat(doc, prefix: str = "", depth: int = 0) -> dict[str, object]:
    out: dict[str, object] = {}
    if isinstance(doc, dict) and depth < 4:
        for k, v in doc.items():
            out.update(_flat(v, f"{prefix}{k}.", depth + 1))
    elif isinstance(doc, (str, int, float, bool)) or doc is None:
        out[prefix[:-1]] = doc
    return out


def _versions(a: Path, b: Path) -> dict:
    pa, pb = provenance(a), provenance(b)

    def values(prov: dict) -> dict[str, list]:
        seen: dict[str, set] = {}
        for doc in prov.values():
            for k, v in _flat(doc).items():
                if k in ("node", "hostname", "time", "written_at"):
                    continue
                seen.setdefault(k, set()).add(json.dumps(v))
        return {k: sorted(json.loads(x) if x != "null" else None for x in vs) if len(vs) > 1
                else [json.loads(next(iter(vs)))] for k, vs in seen.items()}

    va, vb = values(pa), values(pb)
    differ = {k: {"A": va.get(k), "B": vb.get(k)} for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k)}
    return {"nodes_with_provenance": {"A": len(pa), "B": len(pb)}, "differ": differ}


def _nodes(d: Path) -> list[str]:
    text = _read(d, "nodes.tsv") or ""
    return [line.split("\t")[1] for line in text.splitlines() if len(line.split("\t")) == 3]


def _run(d: Path) -> dict:
    doc = _json(d, "run.json")
    return {k: doc.get(k) for k in RUN_FIELDS} if isinstance(doc, dict) else {}


def _results(d: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for pattern in RESULT_FILES:
        try:
            found = sorted(d.glob(pattern))[:64]
        except OSError:
            continue
        for p in found:
            rel = p.relative_to(d)
            doc = _json(d, rel)
            if doc is not None:
                out.update({f"{rel}:{k}": v for k, v in _flat(doc).items()})
    out.update(_bench(d))
    return out


def _bench(d: Path) -> dict[str, object]:
    """Each tk bench result under d/bench, by bench name (NAME-TIMESTAMP without the time; the latest of each name):
    its verdict (exit code, summary) and its numbers per target and cell (results.csv)."""
    out: dict[str, object] = {}
    try:
        root = files.inside(d, "bench")
        entries = sorted(e.name for e in os.scandir(root)
                         if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))[-MAX_BENCH_DIRS:]
    except (OSError, files.FileProblem):
        return out
    latest: dict[str, str] = {}
    for name in entries:  # sorted: a later time stamp of the same name wins
        latest[BENCH_STAMP.sub("", name)] = name
    for key, name in sorted(latest.items()):
        verdict = _json(d, Path("bench") / name / "verdict.json")
        if isinstance(verdict, dict):
            for k in ("exit_code", "summary"):
                out[f"bench/{key}:verdict.{k}"] = verdict.get(k)
        text = _read(d, Path("bench") / name / "results.csv", cut=False)
        if text and len(text) < MAX_FILE_BYTES:
            for row in list(csv.DictReader(io.StringIO(text)))[:64]:
                where = f"bench/{key}/{row.get('target')}/{row.get('cell')}"
                out.update({f"{where}:{k}": _number(v) for k, v in row.items()
                            if k not in ("target", "cell") and isinstance(k, str) and v not in (None, "")})
    return out


def _number(text: str):
    try:
        v = float(text)
    except ValueError:
        return text
    return int(v) if v.is_integer() and "." not in text else v


def _supervision(d: Path) -> dict[str, dict[str, int]]:
    """Component -> how many of each supervision event the job recorded (only components with any)."""
    out: dict[str, dict[str, int]] = {}
    for e in rundir.read_events(d):
        for name, kind in SUPERVISION_COUNTS.items():
            if e["event"] == kind and e["component"]:
                out.setdefault(e["component"], dict.fromkeys(SUPERVISION_COUNTS, 0))[name] += 1
    return out


def diff_dirs(a: str | Path, b: str | Path) -> dict:
    """The differences between run (or render) directories a and b; see the module docstring."""
    a, b = Path(a), Path(b)
    rendered = _rendered(a, b)
    ra, rb = _run(a), _run(b)
    run = {k: {"A": ra.get(k), "B": rb.get(k)} for k in RUN_FIELDS if ra.get(k) != rb.get(k)}
    na, nb = _nodes(a), _nodes(b)
    xa, xb = _results(a), _results(b)
    differing = [k for k in sorted(set(xa) | set(xb)) if xa.get(k) != xb.get(k)]
    results = {k: {"A": xa.get(k), "B": xb.get(k)} for k in differing[:MAX_RESULT_KEYS]}
    versions = _versions(a, b)
    sa, sb = _supervision(a), _supervision(b)
    zero = dict.fromkeys(SUPERVISION_COUNTS, 0)
    supervision = {c: {"A": sa.get(c, zero), "B": sb.get(c, zero)} for c in sorted(set(sa) | set(sb))
                   if sa.get(c, zero) != sb.get(c, zero)}
    doc = {
        "A": str(a), "B": str(b),
        "rendered": rendered,
        "versions": versions,
        "nodes": {"A": na, "B": nb} if na != nb else {},
        "run": run,
        "supervision": supervision,
        "results": results,
        "results_cut": max(0, len(differing) - MAX_RESULT_KEYS),
    }
    doc["same"] = (all(v["status"] == "same" for v in rendered.values()) and not versions["differ"]
                   and not doc["nodes"] and not run and not supervision and not results)
    return doc


def format_diff(doc: dict) -> str:
    """Plain text for `tk diff`."""
    out = [f"A: {doc['A']}", f"B: {doc['B']}"]
    if doc["same"]:
        out.append("no differences in rendered files, versions, nodes, run records, supervision or results")
        return "\n".join(out)
    changed = {n: v for n, v in doc["rendered"].items() if v["status"] != "same"}
    same = [n for n, v in doc["rendered"].items() if v["status"] == "same"]
    out.append(f"rendered files: {len(changed)} differ" + (f", same: {', '.join(same)}" if same else ""))
    for name, v in changed.items():
        if v["status"] != "changed":
            out.append(f"  {name}: {v['status']}")
            continue
        out.append(f"  {name}:")
        out.extend(f"    {line}" for line in v["diff"])
    prov = doc["versions"]
    counts = prov["nodes_with_provenance"]
    if prov["differ"]:
        out.append(f"versions (provenance of {counts['A']} / {counts['B']} nodes):")
        for k, v in prov["differ"].items():
            out.append(f"  {k}: A {_show(v['A'])}  B {_show(v['B'])}")
    elif counts["A"] or counts["B"]:
        out.append(f"versions: same on every node ({counts['A']} / {counts['B']} nodes recorded)")
    else:
        out.append("versions: no provenance recorded in either (it is written when a run starts)")
    if doc["nodes"]:
        out.append(f"nodes: A {', '.join(doc['nodes']['A']) or '-'}  B {', '.join(doc['nodes']['B']) or '-'}")
    for k, v in doc["run"].items():
        out.append(f"run.{k}: A {_show(v['A'])}  B {_show(v['B'])}")
    for component, v in doc.get("supervision", {}).items():
        def counts(c: dict) -> str:
            return ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in c.items() if n) or "nothing"
        out.append(f"supervision of {component}: A {counts(v['A'])}  B {counts(v['B'])}")
    if doc["results"]:
        out.append("results:")
        for k, v in doc["results"].items():
            out.append(f"  {k}: A {_show(v['A'])}  B {_show(v['B'])}")
        if doc["results_cut"]:
            out.append(f"  [... {doc['results_cut']} more differing values: --json shows none of them either; "
                       "compare the files ...]")
    return "\n".join(out)


def _show(v) -> str:
    if v is None:
        return "-"
    text = json.dumps(v) if not isinstance(v, str) else v
    return text if len(text) <= 80 else text[:77] + "..."
