"""Spec: the import rules in pyproject.toml ([tool.importlinter]) hold. `lint-imports` prints which import broke
which contract; docs/architecture.md says what each package may import and why."""

import importlib.util
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(importlib.util.find_spec("importlinter") is None,
                                reason="import-linter is not installed (pip install -e '.[test]')")


def _lint_imports(*args):
    exe = shutil.which("lint-imports")
    cmd = [exe] if exe else [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                                                    "sys.exit(lint_imports_command())"]
    # --no-logo exists from import-linter 2.7; the bench extra (aiperf's rich~=14.1) resolves it to 2.6
    logo = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=60).stdout
    extra = ["--no-logo"] if "--no-logo" in logo else []
    return subprocess.run([*cmd, "--no-cache", *extra, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


CONTRACTS = ["agent-standalone", "job-standalone", "standin-separate", "standin-protected", "stages", "acyclic"]


def test_every_contract_in_pyproject_is_checked_here():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert [c["id"] for c in config["contracts"]] == CONTRACTS


@pytest.fixture(scope="module")
def lint():
    """One run of lint-imports over every contract (it analyses the whole tree once)."""
    return _lint_imports()


@pytest.mark.parametrize("contract", CONTRACTS)
def test_import_contract_holds(contract, lint):
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    name = next(c["name"] for c in config["contracts"] if c["id"] == contract)
    kept = [line for line in lint.stdout.splitlines() if name in line]
    assert kept and "KEPT" in kept[0] and "BROKEN" not in kept[0], lint.stdout[-4000:] + lint.stderr[-2000:]


def test_the_stand_in_contract_names_every_toolkit_module_but_the_stand_in():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["id"] == "standin-separate")
    on_disk = {f"toolkit.{p.stem}" for p in (ROOT / "toolkit").iterdir()
               if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").exists())}
    assert set(contract["source_modules"]) == on_disk - {"toolkit.standin"}
