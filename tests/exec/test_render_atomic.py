"""Spec: an output directory holds the old render or the new one, whole — under SIGKILL at any moment,
concurrent renders of the same target, and write errors — and what the user put there is kept.
(a hostile-input audit's bug 6.)"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolkit.api import load_plan
from toolkit.errors import TkError
from toolkit.render import render_files
from toolkit.render import output as render_output
from toolkit.render.output import write_atomically

RECIPE = "standin-2p2d"


def consistent(out: Path) -> bool:
    """Every file the manifest lists has the manifest's hash (a torn render fails this)."""
    manifest = json.loads((out / "manifest.json").read_text())
    return all(hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
               for name, digest in manifest["files"].items() if name != "manifest.json")


def leftovers(parent: Path, name: str) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name.startswith(f".{name}.tk-")]


def render_cmd(out: Path, instances: int) -> list[str]:
    return [sys.executable, "-m", "toolkit.cli", "render", RECIPE, "-o", str(out), "--set",
            f"context.instances={instances}"]


def test_user_files_in_the_output_directory_survive_a_new_render(tmp_path):
    out = tmp_path / "out"
    write_atomically(render_files(load_plan(RECIPE, ["context.instances=1"])), out)
    (out / "notes.txt").write_text("mine")
    (out / "logs").mkdir()
    (out / "logs" / "ctx-0.log").write_text("a log")
    write_atomically(render_files(load_plan(RECIPE)), out)
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "logs" / "ctx-0.log").read_text() == "a log"
    assert consistent(out) and "ctx-1" in (out / "job.json").read_text()
    assert oct((out).stat().st_mode & 0o777) == "0o755"


def test_a_write_error_during_the_swap_leaves_the_old_render_whole(tmp_path, monkeypatch):
    out = tmp_path / "out"
    write_atomically(render_files(load_plan(RECIPE, ["context.instances=1"])), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(a, b):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(render_output, "_exchange", broken)
    with pytest.raises(TkError, match="No space left on device.*as it was"):
        write_atomically(render_files(load_plan(RECIPE)), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert leftovers(tmp_path, "out") == []


def test_a_render_killed_between_the_fallback_renames_is_repaired_by_the_next_one(tmp_path, monkeypatch):
    # Where the file system cannot exchange two directories, the old one is renamed aside first; a kill
    # right then leaves no output directory. The next render puts the old one back before it starts.
    out = tmp_path / "out"
    write_atomically(render_files(load_plan(RECIPE, ["context.instances=1"])), out)
    (out / "notes.txt").write_text("mine")
    monkeypatch.setattr(render_output, "_exchange", lambda a, b: False)
    real_rename = os.rename

    def killed_after_aside(src, dst):
        real_rename(src, dst)
        if Path(src) == out:
            raise KeyboardInterrupt  # stands for the SIGKILL: nothing after this line runs

    monkeypatch.setattr(render_output.os, "rename", killed_after_aside)
    with pytest.raises(KeyboardInterrupt):
        write_atomically(render_files(load_plan(RECIPE)), out)
    assert not out.exists()
    monkeypatch.setattr(render_output.os, "rename", real_rename)
    write_atomically(render_files(load_plan(RECIPE)), out)
    assert consistent(out) and (out / "notes.txt").read_text() == "mine"
    assert leftovers(tmp_path, "out") == []


@pytest.mark.slow
def test_sigkill_at_random_moments_never_leaves_a_torn_render(tmp_path):
    out = tmp_path / "out"
    subprocess.run(render_cmd(out, 1), check=True, capture_output=True, timeout=60)
    rng = random.Random(6)
    for i in range(16):
        proc = subprocess.Popen(render_cmd(out, 1 + i % 2), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.2, 0.9))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if out.exists():
            assert consistent(out), f"torn render after a kill in round {i}"
    subprocess.run(render_cmd(out, 2), check=True, capture_output=True, timeout=60)
    assert consistent(out) and leftovers(tmp_path, "out") == []


@pytest.mark.slow
def test_concurrent_renders_of_one_target_queue_and_each_leaves_a_whole_render(tmp_path):
    out = tmp_path / "out"
    for _ in range(3):
        procs = [subprocess.Popen(render_cmd(out, n), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for n in (1, 2, 1, 2)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        assert consistent(out)
    assert leftovers(tmp_path, "out") == []


def test_a_failure_of_the_second_fallback_rename_puts_the_old_render_back(tmp_path, monkeypatch):
    out = tmp_path / "out"
    write_atomically(render_files(load_plan(RECIPE, ["context.instances=1"])), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(render_output, "_exchange", lambda a, b: False)
    real_rename = os.rename

    def second_fails(src, dst):
        if Path(dst) == out and ".tk-render-" in Path(src).name:
            raise OSError(5, "Input/output error")
        real_rename(src, dst)

    monkeypatch.setattr(render_output.os, "rename", second_fails)
    with pytest.raises(TkError, match="as it was"):
        write_atomically(render_files(load_plan(RECIPE)), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert leftovers(tmp_path, "out") == []


def test_an_output_name_with_glob_characters_repairs_only_its_own_leftovers(tmp_path):
    other = tmp_path / ".abc.tk-old-1-2"  # a leftover of the target "abc", not of "a*"
    other.mkdir()
    (other / "theirs.txt").write_text("not yours")
    out = tmp_path / "a*"
    write_atomically(render_files(load_plan(RECIPE)), out)
    write_atomically(render_files(load_plan(RECIPE, ["context.instances=1"])), out)
    assert not (out / "theirs.txt").exists() and (other / "theirs.txt").read_text() == "not yours"
    assert consistent(out)


@pytest.mark.slow
def test_concurrent_launches_never_share_a_run_directory(tmp_path):
    """(from tests/unit/test_operator_faults.py: five tk processes at once) each `tk launch --dry-run` gets a run
    directory of its own."""
    env = {**os.environ, "TK_RUNS_DIR": str(tmp_path / "runs")}
    procs = [subprocess.Popen([sys.executable, "-m", "toolkit.cli", "launch", "standin-2p2d", "--local", "--dry-run",
                               "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(5)]
    dirs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        dirs.append(json.loads(out)["run_dir"])
    assert len(set(dirs)) == 5
