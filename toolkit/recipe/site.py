"""Site defaults: one YAML file of recipe values that every recipe on this login node or cluster shares.

Platform teams repeat the same partition, account, container image and mounts, transport profile and GPU type
in every recipe; a site file holds them once. It is written like a recipe (any recipe section and field), and
merged *under* every recipe a user loads from a file or by name: the recipe's own values win over the site's,
and ``--set`` wins over both. Mappings merge key by key; a list or a value replaces the site's whole.

Where it is, first match wins:

    $TK_SITE                           a path (an admin's shared file, set in a module file); TK_SITE="" or
                                       TK_SITE=none: no site file at all
    $XDG_CONFIG_HOME/tk/site.yaml      default ~/.config/tk/site.yaml

The file is checked as strictly as a recipe (the same bounded YAML reader, the same schema once merged), and
every error in a value that came from it names the site file and its line. It may not say what a deployment
is (``name``, ``description``, ``model``, ``model_path``, ``quantization``): those belong to each recipe.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.errors import RecipeError, Violation
from toolkit.recipe.yaml import parse_site_text
from toolkit.text import cut

SITE_ENV = "TK_SITE"
SITE_FILE = "site.yaml"
DISABLED = ("", "none")
# What a deployment is: never a site default.
PER_RECIPE = ("name", "description", "model", "model_path", "quantization")
MAX_SITE_BYTES = 1 << 20


@dataclass(frozen=True)
class SiteDefaults:
    """The site file as read: its mapping and where each value is written."""

    file: str
    data: dict
    lines: dict = field(default_factory=dict)  # field path -> line


def site_path() -> Path | None:
    """The site file tk would read now (it may not exist), or None where TK_SITE turns it off."""
    given = os.environ.get(SITE_ENV)
    if given is not None:
        return None if given.strip().lower() in DISABLED else Path(given).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    try:
        root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    except RuntimeError:  # no home directory
        return None
    return root / "tk" / SITE_FILE


def load_site(path: Path | None = None) -> SiteDefaults | None:
    """Read and check the site file (``site_path()`` unless given); None when there is none.

    A file named by TK_SITE must exist (a typo in a module file must not silently drop every default); the
    default location is optional. Raises RecipeError naming the site file."""
    named = path is not None or os.environ.get(SITE_ENV) is not None
    path = path if path is not None else site_path()
    if path is None:
        return None
    source = cut(str(path))

    def refuse(message: str, fix: str, line: int | None = None, where: str = "(site file)"):
        return RecipeError([Violation(source, line, where, message, fix)])

    try:
        if not path.exists():
            if named:
                raise refuse(f"no such site file (named by ${SITE_ENV})",
                             f"create it, correct ${SITE_ENV}, or unset it (TK_SITE=none: no site defaults)")
            return None
        if not path.is_file():
            raise refuse("the site file is not a regular file", "give the path of a YAML file")
        with path.open("rb") as f:
            raw = f.read(MAX_SITE_BYTES + 1)
    except OSError as exc:
        raise refuse(f"cannot read the site file: {cut(str(exc))}", "check its permissions") from None
    if len(raw) > MAX_SITE_BYTES:
        raise refuse(f"larger than {MAX_SITE_BYTES} bytes; a site file is a small file", "keep only defaults")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise refuse("not UTF-8 text", "save the site file as UTF-8") from None
    data, lines = parse_site_text(text, source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise refuse("a site file must be a YAML mapping of recipe sections (cluster:, kv_transfer:, ...)",
                     "write it like a recipe, e.g. `cluster:` then `  partition: gpu`", line=1, where="(top level)")
    problems = []
    for key in PER_RECIPE:
        if key in data:
            problems.append(Violation(source, lines.get((key,)), key, "says what one deployment is; a site file "
                                      "holds only what every recipe on this site shares",
                                      f"move `{key}:` into the recipe"))
    version = data.pop("schema_version", 1)
    if version != 1 or isinstance(version, bool):
        problems.append(Violation(source, lines.get(("schema_version",)), "schema_version",
                                  f"{cut(repr(version))} is not a schema tk knows", "write schema_version: 1 or "
                                  "leave it out"))
    if problems:
        raise RecipeError(problems)
    return SiteDefaults(file=str(path), data=data, lines={k: v for k, v in lines.items() if k != ("schema_version",)})


def merge_under(site: dict, recipe: dict) -> dict:
    """``recipe`` over ``site``: mappings merge key by key (recursively), anything else in the recipe replaces
    the site's value whole (a list of mounts is the recipe's, not both)."""
    out = dict(site)
    for key, value in recipe.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_under(out[key], value)
        else:
            out[key] = value
    return out


def site_leaves(site: dict, recipe: dict | None, path: tuple = ()) -> list[tuple]:
    """The field paths whose merged value is the site's: every leaf (a value, a list, an empty mapping) of the
    site file that the recipe does not write itself."""
    out = []
    for key, value in site.items():
        here = path + (key,)
        mine = recipe.get(key, _ABSENT) if isinstance(recipe, dict) else _ABSENT
        if isinstance(value, dict) and value and (mine is _ABSENT or isinstance(mine, dict)):
            out.extend(site_leaves(value, None if mine is _ABSENT else mine, here))
        elif mine is _ABSENT:
            out.append(here)
    return out


_ABSENT = object()


__all__ = ["SITE_ENV", "SiteDefaults", "load_site", "merge_under", "site_leaves", "site_path"]
