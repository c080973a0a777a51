"""Where tk's data lives: the jinja2 templates and the shipped recipes.

In a wheel they are package data (`toolkit/templates`, `toolkit/recipes`, put there by the build's
force-include); in a checkout or an editable install they are the top-level `templates/` and `recipes/`
beside the `toolkit/` package. This is the one resolver; nothing else builds these paths.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    installed = _PACKAGE / name
    if installed.is_dir():
        return installed
    checkout = _PACKAGE.parent / name
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"tk's {name}/ directory is missing (looked in {installed} and {checkout}); "
                            "reinstall tk")


def templates_dir() -> Path:
    return _data_dir("templates")


def recipes_dir() -> Path:
    return _data_dir("recipes")


def package_path(relative: str) -> Path:
    """A directory shipped inside the `toolkit` package (a wheel carries it as package data), e.g. an engine
    profile's ``tokenizer_dir``."""
    path = _PACKAGE / relative
    if not path.exists():
        raise FileNotFoundError(f"tk's {relative} is missing (looked in {path}); reinstall tk")
    return path
