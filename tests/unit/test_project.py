"""Spec: the README's first lines stay true. CI runs exactly the README's test command, and that command
runs pytest over the whole tests/ tree."""

import re

from tests.conftest import ROOT


def readme_commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()[:6]
    return [line.split("#")[0].strip() for line in lines if line.startswith("    bash ")]


def test_ci_runs_the_readme_test_command():
    main_job, test_command = readme_commands()
    assert "scripts/demo" in main_job and "scripts/setup" in main_job
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in [line.strip() for line in ci.splitlines()], (test_command, ci)


def test_the_test_command_runs_pytest_over_every_test():
    script = (ROOT / "scripts" / "test").read_text()
    assert re.search(r"^exec python3 -m pytest\b", script, re.M), script
    assert 'testpaths = ["tests"]' in (ROOT / "pyproject.toml").read_text()
