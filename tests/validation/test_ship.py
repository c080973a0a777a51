"""Spec: the agent reaches the nodes as one file, RUN_DIR/agent.pyz, a zipapp of the `validation`
package. It runs where nothing of the project is installed (only Python, numpy and NIXL, as in a serving
container), it holds every module of the package and nothing else, and building it twice gives the same
bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from toolkit.validate.launchers import agent_argv
from toolkit.validate.ship import build_agent_archive
from validation.wire import PROTOCOL

np = pytest.importorskip("numpy")
SITE = str(Path(np.__file__).resolve().parent.parent)  # numpy's site-packages, without its .pth files

# A python with the standard library, site-packages (numpy, NIXL) and the archive on sys.path, and nothing
# else: no site processing (no .pth, so no editable install of the project), no PYTHONPATH, no cwd.
# Importing toolkit or tests raises.
ISOLATED = r"""
import sys
class Forbidden:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("toolkit", "tests"):
            raise ImportError(f"the agent imported {name}")
sys.meta_path.insert(0, Forbidden())
archive, site = sys.argv[1], sys.argv[2]
sys.path.append(site)
checkout = @CHECKOUT@
assert not any(p == checkout or p.startswith(checkout + "/") for p in sys.path), sys.path
""".replace("@CHECKOUT@", repr(str(ROOT)))  # nothing on the path is this checkout
RUN_ARCHIVE = ISOLATED + r"""
import runpy
sys.argv = [archive, *sys.argv[3:]]
runpy.run_path(archive, run_name="__main__")
"""
IMPORT_ALL = ISOLATED + r"""
import importlib, json, zipfile
sys.path.insert(0, archive)
names = [n[:-3].replace("/", ".").removesuffix(".__init__") for n in zipfile.ZipFile(archive).namelist()
         if n.startswith("validation/")]
files = {n: importlib.import_module(n).__file__ for n in names}
print(json.dumps({"files": files, "toolkit": sorted(m for m in sys.modules if m.partition(".")[0] == "toolkit")}))
"""


def package_files() -> set[str]:
    return {f"validation/{p.relative_to(ROOT / 'validation').as_posix()}" for p in (ROOT / "validation").rglob("*.py")}


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    return build_agent_archive(tmp_path_factory.mktemp("run"))


def isolated(code: str, archive: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": ""}
    return subprocess.run([sys.executable, "-I", "-S", "-c", code, str(archive), SITE, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_archive_lands_in_the_run_directory_and_the_launchers_run_it(tmp_path):
    path = build_agent_archive(tmp_path)
    assert path == tmp_path / "agent.pyz" and zipfile.is_zipfile(path)
    assert path.read_bytes().startswith(b"#!/usr/bin/env python3\n") and os.access(path, os.X_OK)
    argv = agent_argv(tmp_path, "python3", "node0")
    assert argv[4:7] == ["python3", str(path), str(tmp_path / "params.json")]
    sbatch = (ROOT / "templates" / "validate.sbatch.j2").read_text()
    assert '"$RUN_DIR/agent.pyz" "$RUN_DIR/params.json"' in sbatch and "agent.py\"" not in sbatch


def test_the_archive_holds_every_module_of_the_package_and_nothing_else(archive):
    names = zipfile.ZipFile(archive).namelist()
    assert names == sorted(names)
    assert set(names) == package_files() | {"__main__.py"}
    assert not [n for n in names if "__pycache__" in n or not n.endswith(".py")]


def test_building_twice_gives_the_same_bytes(tmp_path):
    one = build_agent_archive(tmp_path / "one.pyz").read_bytes()
    two = build_agent_archive(tmp_path / "two.pyz").read_bytes()
    assert one == two
    infos = zipfile.ZipFile(tmp_path / "one.pyz").infolist()
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}  # no build time or source mtime inside


def test_every_module_imports_from_the_archive_without_the_toolkit(archive, tmp_path):
    proc = isolated(IMPORT_ALL, archive, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert {n.replace(".", "/") for n in out["files"]} >= {"validation/agent", "validation/pair", "validation/wire"}
    assert len(out["files"]) == len(package_files())
    for name, file in out["files"].items():
        assert file.startswith(str(archive)), (name, file)  # from the archive, not from a checkout
    assert out["toolkit"] == []


def test_the_archive_runs_where_nothing_of_the_project_is_installed(archive, tmp_path):
    usage = isolated(RUN_ARCHIVE, archive, cwd=tmp_path)
    assert usage.returncode == 2 and "usage: agent.pyz PARAMS_JSON AGENT_ID" in usage.stderr

    params = tmp_path / "params.json"
    params.write_text(json.dumps({"protocol": PROTOCOL + 1}))
    old = isolated(RUN_ARCHIVE, archive, str(params), "node0", cwd=tmp_path)
    assert old.returncode == 2 and f"agent protocol {PROTOCOL}" in old.stderr

    # the whole agent (numpy, memory, pair ...) is imported before it finds it has no part in this run
    params.write_text(json.dumps({"protocol": PROTOCOL, "run_dir": str(tmp_path), "agents": []}))
    stranger = isolated(RUN_ARCHIVE, archive, str(params), "node9", cwd=tmp_path)
    assert stranger.returncode == 1, stranger.stderr
    assert f"agent 'node9' is not in {tmp_path}/params.json" in stranger.stderr
    assert "ImportError" not in stranger.stderr


def test_python3_runs_the_archive_file_as_the_launchers_do(archive, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, str(archive)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("usage: agent.pyz")


def test_the_coordinator_takes_only_numpy_free_modules_of_the_agent():
    """The login node may lack numpy and NIXL: the coordinator imports the wire, schedule, layout, stats and
    rundir (the run directory's layout) modules of the agent package, and neither numpy nor NIXL."""
    code = ("import sys, toolkit.validate.run\n"
            "print(' '.join(sorted(m for m in sys.modules if m.partition('.')[0] in "
            "('numpy', 'nixl', 'nixl_cu12', 'nixl_cu13', 'validation'))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert set(proc.stdout.split()) <= {"validation", "validation.wire", "validation.schedule", "validation.layout",
                                        "validation.stats", "validation.rundir"}
