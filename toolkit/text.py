"""Text from outside tk shown to people or written on one line of a file: escaped, and cut to a bound.

One escaper for every place such text lands: an error message on a terminal (a recipe's file name, a --set
expression, a value), a rich table (toolkit/report.py), the header of an imported recipe (toolkit/importer), a
comment line of a rendered file (toolkit/render/escape.py, the `comment` filter), and what `tk doctor`, `tk status`
and `tk runs` print from a run's files (toolkit.doctor.inert). Every character that is not
printable (``str.isprintable``: control characters, surrogates, line and paragraph separators, format characters
such as the bidirectional overrides, spaces other than the ASCII one, unassigned code points) is written as its
Python escape (``\\n``, ``\\x1b``, ``\\u2028``), so what is left is one line that cannot end early, start a YAML key
or a command, or drive the terminal.
"""

from __future__ import annotations

from typing import Any

MAX_ECHO = 200  # characters of a value an error message repeats


def escape_controls(text: str) -> str:
    """``text`` with every character that is not printable written as its escape (\\n, \\x85, \\u2028, \\u202e):
    what is left is one line to a terminal and to YAML (whose line breaks include \\x85, \\u2028 and \\u2029)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def escape_lines(text: str) -> str:
    """``text`` with each of its lines escaped (escape_controls): a message of several lines keeps them, and no line
    can drive the terminal (an error naming a run whose name came from its run.json)."""
    return "\n".join(escape_controls(line) for line in text.split("\n"))


def cut(text: str, limit: int = MAX_ECHO) -> str:
    """Text for an error message: escaped (a newline or ESC in a file name or a --set must not break the message or
    drive the terminal), cut to ``limit`` characters (a 20,000-entry mapping is not echoed whole)."""
    n = len(text)
    text = escape_controls(text[:limit])
    if len(text) > limit or n > limit:
        text = text[:limit] + f"... ({n} characters)"
    return text


def short(value: Any, limit: int = MAX_ECHO) -> str:
    """``repr`` of a value for an error message, cut to ``limit`` characters."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - an odd object must not break the error report
        text = f"<{type(value).__name__}>"
    return cut(text, limit)


__all__ = ["MAX_ECHO", "cut", "escape_controls", "escape_lines", "short"]
