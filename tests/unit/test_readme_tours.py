"""Spec: every tour in the README runs as shown and prints what it shows (tests/tours.py runs them). The tours
that launch nothing run here; those that run aiconfigurator (layer slow) in tests/size/test_size_tours.py; those
that launch deployments or use the dev Slurm cluster in tests/integration/test_readme_tours.py. A new tour is a
fenced block under a `<!-- tour: NAME -->` marker."""

from __future__ import annotations

import re
import textwrap

import pytest

from tests import tours
from tests.conftest import ROOT

UNIT = tours.tours(layers=("unit",))


def test_every_readme_block_with_commands_is_a_tour_or_says_why_not():
    blocks, unmarked = tours.parse(ROOT / "README.md")
    assert not unmarked, [f"README.md:{u.line}" for u in unmarked]
    assert {"render", "size", "rehearse", "launch", "self-healing", "bench", "python"} <= {b.tour for b in blocks}
    assert all(b.layer in tours.LAYERS for b in blocks)


@pytest.mark.parametrize("name", sorted(UNIT))
def test_unit_tour(name, tmp_path):
    assert tours.run_tour(UNIT[name], base=tmp_path) == []


# --- the harness itself ----------------------------------------------------------------------------------

def _doc(tmp_path, text: str):
    path = tmp_path / "doc.md"
    path.write_text(textwrap.dedent(text))
    return path


def _run(tmp_path, text: str) -> list[str]:
    path = _doc(tmp_path, text)
    found = tours.tours([path])
    assert found, "no tour parsed"
    return [p for blocks in found.values() for p in tours.run_tour(blocks, base=tmp_path)]


def test_output_is_compared_line_by_line_with_elisions(tmp_path, monkeypatch):
    monkeypatch.setattr(tours, "ROOT", tmp_path)
    ok = """\
        <!-- tour: t -->
        ```
        $ printf 'a\\nb\\nc\\nd 12:34\\n'
        a
        ...
        d …
        $ echo quiet-is-not-compared
        ```
        """
    assert _run(tmp_path, ok) == []
    bad = ok.replace("d …", "e …")
    problem, printed = _run(tmp_path, bad)
    assert "doc.md:3" in problem and "'e …'" in problem
    assert "what it printed" in printed and "d 12:34" in printed


def test_a_failing_command_fails_the_tour_unless_its_status_is_shown(tmp_path, monkeypatch):
    monkeypatch.setattr(tours, "ROOT", tmp_path)
    problem, _ = _run(tmp_path, "<!-- tour: t -->\n```\n$ false\n$ true\n```\n")
    assert "exited 1" in problem
    assert _run(tmp_path, "<!-- tour: t -->\n```\n$ (exit 3)\n$ echo $?\n3\n```\n") == []
    problem, _ = _run(tmp_path, "<!-- tour: t -->\n```\n$ (exit 3)\n$ echo $?\n0\n```\n")
    assert "'0'" in problem and "'3'" in problem


def test_shape_matching_ignores_measured_numbers_and_table_widths():
    shown = ["┏━━━━┳━━━━━━┓", "┃ ms ┃ req  ┃", "│ 12 │ 3.5  │", "run-20261125-180933 took 1.25 s"]
    printed = ["┏━━━━━━━━┳━━━━━┓", "┃ ms     ┃ req ┃", "│ 123.75 │ 4   │", "run-20270101-000000 took 9 s"]
    assert tours.compare(shown, printed, {"match": "shape"}) == []
    assert tours.compare(shown, printed, {}) != []  # exact by default
    assert tours.compare(["x 1"], ["y 1"], {"match": "shape"}) != []


def test_a_file_block_must_equal_the_file_the_tour_wrote(tmp_path, monkeypatch):
    monkeypatch.setattr(tours, "ROOT", tmp_path)
    text = "<!-- tour: t -->\n```\n$ printf 'k: 1\\n' > out.yaml\n```\n\n<!-- tour: t file=out.yaml -->\n```\nk: {v}\n```\n"
    assert _run(tmp_path, text.format(v=1)) == []
    assert "out.yaml differs" in _run(tmp_path, text.format(v=2))[0]


def test_a_block_with_commands_and_no_marker_is_reported(tmp_path):
    path = _doc(tmp_path, "text\n\n```\n$ tk plan x\n```\n\n<!-- not-a-tour: syntax -->\n```\n$ tk doctor [RUN]\n```\n")
    blocks, unmarked = tours.parse(path)
    assert blocks == [] and [u.line for u in unmarked] == [3]


# --- the first screen ------------------------------------------------------------------------------------

def test_the_first_screen_shows_the_login_node_install_right_after_the_main_and_test_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    first_screen = "\n".join(lines[:24])
    assert lines[2].startswith("    bash scripts/setup && bash scripts/demo")
    assert lines[3].startswith("    bash scripts/setup && bash scripts/test")
    install = next(line for line in lines[4:24] if "pip install" in line)
    assert lines.index(install) < next(i for i, line in enumerate(lines) if line.startswith("## "))
    extras = re.search(r"'\.\[([a-z,]+)\]'", install).group(1)
    assert extras == "size,bench"
    # CI installs the wheel with exactly those extras, as a user without root (scripts/check-wheel)
    assert f'"${{WHEEL}}[{extras}]"' in (ROOT / "scripts" / "check-wheel").read_text()
    for command in ("tk plan qwen3-smoke", "tk launch qwen3-smoke", "site.example.yaml"):
        assert command in first_screen
    assert "no root" in first_screen
