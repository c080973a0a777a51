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


def _tracked_text_files():
    import subprocess

    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in names.split("\0"):
        path = ROOT / name
        if not name or not path.is_file() or name.startswith("tests/golden/") or path.suffix in (".png", ".whl"):
            continue
        try:
            yield name, path.read_text()
        except UnicodeDecodeError:
            continue


def test_nothing_in_the_repository_cites_files_outside_it():
    # The project's reference notes and seeds live outside the repository: cite upstream files, commits, issues
    # and pull requests instead. (The patterns are split so this file does not match itself.)
    outside = re.compile("|".join([r"/work" + "/", r"shared/" + "(reference|seeds)", r"peers" + r"(-[0-9])?\.md",
                                   r"[a-z]+-" + r"findings(-[0-9])?\.md", r"trtllm-" + r"(disagg|fidelity)\.md",
                                   r"nixl-" + r"validation\.md", r"code-" + r"review(-[0-9])?\.md",
                                   "002_" + "34738"]))
    hits = [f"{name}:{n}: {line.strip()[:100]}" for name, text in _tracked_text_files()
            for n, line in enumerate(text.splitlines(), 1) if outside.search(line)]
    assert not hits, "\n".join(hits)
