"""Spec: every file tk writes where someone could have put something first goes through one writer
(toolkit.runtime.files.write_regular_atomically): only ever a regular file, written whole, never through a symlink
and never over a device, a FIFO, a socket, a directory or a symlink (hostile round 4, "a path that writes a user's
file without the care the others take"; code review 4: five atomic writes, one for the toolkit). Pure file work in
tmp_path: nothing is spawned."""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import pytest

from tests.unit.helpers import parsed, plan_of
from tests.unit.test_launch_states import STANDIN
from tests.unit.test_import import SRT
from toolkit import api
from toolkit.errors import RecipeError, TkError
from toolkit.runtime import files

ROOT = Path(__file__).resolve().parents[2]


def _hostile_kinds(tmp_path: Path, name: str):
    """(path, is_kind) for a FIFO, a directory, a symlink to a victim and a dangling symlink at `name`-*; as root also
    a character device of our own (a /dev/null)."""
    victim = tmp_path / f"{name}-victim.txt"
    victim.write_text("keep me\n")
    out = []
    fifo = tmp_path / f"{name}.fifo"
    os.mkfifo(fifo)
    out.append((fifo, stat.S_ISFIFO))
    d = tmp_path / f"{name}.dir"
    d.mkdir()
    out.append((d, stat.S_ISDIR))
    link = tmp_path / f"{name}.link"
    os.symlink(victim, link)
    out.append((link, stat.S_ISLNK))
    dangling = tmp_path / f"{name}.dangling"
    os.symlink(tmp_path / "nowhere" / "x", dangling)
    out.append((dangling, stat.S_ISLNK))
    if os.geteuid() == 0:
        dev = tmp_path / f"{name}.null"
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        out.append((dev, stat.S_ISCHR))
    return out, victim


def _no_temporaries(d: Path) -> None:
    assert [p.name for p in d.iterdir() if ".tk-tmp-" in p.name or p.name.endswith(".tmp")] == []


# --- the writer itself -------------------------------------------------------------------------------------------

def test_the_writer_refuses_every_kind_that_is_not_a_regular_file_and_leaves_it(tmp_path):
    kinds, victim = _hostile_kinds(tmp_path, "out")
    for path, is_kind in kinds:
        for replace in (True, False):
            with pytest.raises(files.FileProblem, match="tk writes only regular files"):
                files.write_regular_atomically(path, "x: 1\n", replace=replace)
            assert is_kind(os.lstat(path).st_mode), path
    assert victim.read_text() == "keep me\n"
    _no_temporaries(tmp_path)


def test_the_writer_replaces_a_regular_file_whole_with_its_mode_or_refuses_it_when_told(tmp_path):
    out = tmp_path / "r.yaml"
    files.write_regular_atomically(out, "a: 1\n", 0o600)
    assert out.read_text() == "a: 1\n" and stat.S_IMODE(out.stat().st_mode) == 0o600
    files.write_regular_atomically(out, b"a: 2\n", 0o644)
    assert out.read_bytes() == b"a: 2\n" and stat.S_IMODE(out.stat().st_mode) == 0o644
    with pytest.raises(FileExistsError):
        files.write_regular_atomically(out, "a: 3\n", replace=False)
    assert out.read_text() == "a: 2\n"
    files.write_regular_atomically(tmp_path / "new" / "deep" / "r.yaml", "b: 1\n", parents=True)
    assert (tmp_path / "new" / "deep" / "r.yaml").read_text() == "b: 1\n"
    _no_temporaries(tmp_path)


def test_appending_never_blocks_on_a_fifo_nor_follows_a_symlink(tmp_path):
    fifo = tmp_path / "runs.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(OSError):  # no reader: ENXIO at once, never a block
        files.append_regular(fifo, b"x\n")
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    os.symlink(victim, tmp_path / "link.jsonl")
    with pytest.raises(OSError):
        files.append_regular(tmp_path / "link.jsonl", b"x\n")
    assert victim.read_text() == "keep\n"


# --- tk import -o [--force] -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("force", [False, True])
def test_import_output_is_never_written_over_or_through_anything_but_a_regular_file(tmp_path, force):
    src = tmp_path / "srt.yaml"
    src.write_text(SRT)
    kinds, victim = _hostile_kinds(tmp_path, "recipe")
    for path, is_kind in kinds:
        with pytest.raises((TkError, RecipeError)) as exc:
            api.import_config(src, output=path, force=force)
        assert str(path) in str(exc.value) or any(v.file == str(path) for v in
                                                   getattr(exc.value, "violations", ()))
        assert is_kind(os.lstat(path).st_mode), path
    assert victim.read_text() == "keep me\n"
    _no_temporaries(tmp_path)
    out = tmp_path / "new.yaml"
    api.import_config(src, output=out, force=force)
    assert "schema_version" in out.read_text() and stat.S_IMODE(out.stat().st_mode) == 0o644


# --- state and reports tk writes into its own directories -----------------------------------------------------------

def test_a_run_record_is_never_written_through_a_symlink_at_its_temporary_name(tmp_path):
    from toolkit.launch.run import RunRecord

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    for pid in {os.getpid(), os.getppid()}:  # the temporary names the old writer used
        os.symlink(victim, run_dir / f".run.json.tmp.{pid}")
    record = RunRecord.new(plan_of(STANDIN), run_dir, "local")
    record.save()
    assert victim.read_text() == "keep me\n"
    assert '"backend": "local"' in (run_dir / "run.json").read_text()
    os.unlink(run_dir / "run.json")
    os.symlink(victim, run_dir / "run.json")
    with pytest.raises(files.FileProblem):
        record.save()
    assert victim.read_text() == "keep me\n"


def test_a_rendered_name_that_is_not_a_regular_file_is_refused_and_left(tmp_path):
    out = tmp_path / "render"
    out.mkdir()
    os.mkfifo(out / "ctx.yaml")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    os.symlink(victim, out / "gen.yaml")
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(TkError, match=r"ctx\.yaml.*FIFO|gen\.yaml.*symbolic link"):
        api.render(plan_of(STANDIN), out)
    assert stat.S_ISFIFO(os.lstat(out / "ctx.yaml").st_mode) and stat.S_ISLNK(os.lstat(out / "gen.yaml").st_mode)
    assert victim.read_text() == "keep me\n" and (out / "notes.txt").read_text() == "mine\n"
    os.unlink(out / "ctx.yaml")
    os.unlink(out / "gen.yaml")
    api.render(plan_of(STANDIN), out)  # regular files (or nothing) there: rendered, the user's notes kept
    assert (out / "ctx.yaml").is_file() and (out / "notes.txt").read_text() == "mine\n"


def test_a_comparison_directory_that_is_a_dangling_symlink_is_a_message(tmp_path, monkeypatch):
    monkeypatch.setattr(api, "_bench_recipe_checks", lambda plan, kw: None)  # no aiperf needed to get that far
    base = tmp_path / "cmp"
    os.symlink(tmp_path / "nowhere", base)
    with pytest.raises(TkError, match="cmp"):
        api.bench_compare("standin-multiturn", ["router=round_robin,kv_cache_aware"], run_dir=base)
    assert os.path.islink(base) and not (tmp_path / "nowhere").exists()


# --- one writer: no other way to write a file in the toolkit ----------------------------------------------------------

# Where the toolkit may still create a file itself, and why that is safe: each creates it exclusively (O_EXCL) in a
# directory it has just made, or is the render's directory swap.
ALLOWED = {
    ("toolkit/runtime/files.py", "*"): "the writer",
    ("toolkit/render/output.py", "*"): "the render's directory swap (toolkit.render.output): a fresh temporary "
                                       "directory, O_EXCL files, rendered names that are not regular files refused",
    ("toolkit/runtime/tls.py", "os.open"): "keys created O_EXCL in the run's fresh 0700 directory",
    ("toolkit/runtime/rundir.py", "os.open"): "the claim file, created O_EXCL",
    ("toolkit/bench/__init__.py", "os.rename"): "a finished bench directory moved under a name claimed by mkdir",
    ("toolkit/bench/report.py", "fig.savefig"): "a plot drawn into memory, then written through the writer",
    ("toolkit/render/__init__.py", "disagg.write_text"): "a copy in the config check's own fresh temporary "
                                                         "directory",
    ("toolkit/size/aiconfigurator.py", "os.symlink"): "a link in its own fresh temporary directory",
}
WRITES = {"write_text", "write_bytes", "savefig", "replace", "rename", "copyfile", "copy", "copy2", "dump", "open",
          "mkfifo", "symlink", "link"}


def _raw_writes(path: Path) -> list[tuple[int, str]]:
    tree = parsed(path)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
        if name not in WRITES:
            continue
        if name == "open":
            # open(path, "w"...), os.open(..., O_CREAT...): a file created or written
            text = ast.unparse(node)
            if owner == "os" and "O_CREAT" not in text and "O_WRONLY" not in text:
                continue
            mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"),
                                                                 None)
            if owner != "os" and not (isinstance(mode, ast.Constant) and set(str(mode.value)) & set("wax+")):
                continue
        if name == "replace" and owner != "os" or name == "dump" and (
                owner not in ("json", "yaml") or len(node.args) < 2 and not any(k.arg in ("fp", "stream")
                                                                         for k in node.keywords)):
            continue  # str.replace; yaml.dump(data) returns text
        if name in ("rename", "link", "symlink", "mkfifo") and owner != "os":
            continue
        out.append((node.lineno, f"{owner + '.' if owner else ''}{name}"))
    return out


def test_every_file_the_toolkit_writes_goes_through_the_one_writer():
    found = []
    for path in sorted((ROOT / "toolkit").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("toolkit/standin/"):  # the stand-in engine is its own package (docs/architecture.md)
            continue
        for line, call in _raw_writes(path):
            if (rel, "*") in ALLOWED or (rel, call) in ALLOWED:
                continue
            found.append(f"{rel}:{line}: {call}")
    assert found == [], "write these through toolkit.runtime.files.write_regular_atomically:\n" + "\n".join(found)
