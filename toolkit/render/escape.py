"""The one place where text becomes part of a rendered file: one escaping function per place a value can
land, used as a jinja2 filter by every template (launch.sbatch, validate.sbatch, env files, YAML files).

    sh       a bash word (also env-file values, which are sourced by bash): shlex.quote; inert whatever it holds
    comment  text on a comment line of any file: every non-printable character (newline, CR, U+2028, ...)
             shown as an escape (toolkit/text.py, the one escaper), so a comment can never end early and start a
             command or a YAML key
    sbatch   a value on an `#SBATCH` line: sbatch's directive parser has no quoting tk can rely on, so only
             a conservative set of characters is allowed; anything else is refused (RenderError)
    to_yaml  data in a YAML file: PyYAML's safe dumper, no anchors

Recipe validation refuses control characters in the fields users give (toolkit/recipe/schema.py); these
filters are the second line, for values that do not come from a recipe field (the recipe's file name, a
run directory).
"""

from __future__ import annotations

import functools
import re
import shlex

import jinja2
import yaml

from toolkit.errors import TkError
from toolkit.resources import templates_dir
from toolkit.text import escape_controls

_SBATCH_SAFE = re.compile(r"[A-Za-z0-9._:/@%+=,\-]+")


class RenderError(TkError):
    pass


def sh(value) -> str:
    return shlex.quote(str(value))


def comment(value) -> str:
    return escape_controls(str(value))


def sbatch(value) -> str:
    text = str(value)
    if not _SBATCH_SAFE.fullmatch(text):
        raise RenderError(f"{comment(text)[:200]!r} cannot be written on an #SBATCH line (only letters, digits "
                          "and ._:/@%+=,- are safe there); change the value")
    return text


class _Dumper(yaml.SafeDumper):
    """Block-style YAML; never emits anchors, so every file reads on its own."""

    def ignore_aliases(self, data):
        return True


def to_yaml(value) -> str:
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100).rstrip("\n")


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The jinja2 environment every template is rendered with: strict, no autoescape (the filters above
    do the escaping, per file type), comments as {## ##} because bash uses ${#x}. One for the process, so each
    template is compiled once (jinja2's cache is per environment; it still reloads a template whose file changed)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False,
                             comment_start_string="{##", comment_end_string="##}")
    env.filters.update(sh=sh, comment=comment, sbatch=sbatch, to_yaml=to_yaml)
    return env
