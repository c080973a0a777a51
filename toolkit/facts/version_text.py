"""How TensorRT-LLM versions are written: the one grammar of the versions a recipe names, the releases the data
records and the tags of NVIDIA's images, and their order.

A version is MAJOR.MINOR.PATCH with an optional pre-release (rcN) and post suffix, as tensorrt_llm/version.py writes
it ("1.0.0rc4", "1.2.0rc6.post1") and NGC tags its images (nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc3); the facts
are per MINOR line, and a recipe may name the line alone ("1.2"). facts.versions (the rows of the lines) and
facts.llm_args (the snapshots of the data, ordered by release) both read it; it reads neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# MAJOR.MINOR[.PATCH][aN|bN|rcN|devN][.postN]
VERSION_TEXT = re.compile(
    r"(?P<major>[0-9]{1,4})\.(?P<minor>[0-9]{1,4})(?:\.(?P<patch>[0-9]{1,4}))?"
    r"(?:(?P<pre>a|b|rc|dev)(?P<pren>[0-9]{0,4}))?(?:\.?post(?P<post>[0-9]{1,4}))?", re.ASCII)
_PRE_ORDER = {"dev": 0, "a": 1, "b": 2, "rc": 3, None: 4}


@dataclass(frozen=True)
class ParsedVersion:
    text: str  # as written
    line: str  # "1.2"
    prerelease: bool  # an rc/dev/alpha/beta build of the line
    key: tuple  # the order of versions (version_key)

    @property
    def line_only(self) -> bool:
        """The text names a line ("1.2"), not a release."""
        return self.text.count(".") == 1 and self.key[3:] == (_PRE_ORDER[None], 0, 0)


def parse_version(text) -> ParsedVersion | None:
    """``1.2``, ``1.2.1``, ``1.0.0``, ``1.2.0rc3``, ``1.2.0rc6.post1`` -> its line and order; None if not a version."""
    m = VERSION_TEXT.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        return None
    key = (int(m["major"]), int(m["minor"]), int(m["patch"] or 0), _PRE_ORDER[m["pre"]], int(m["pren"] or 0),
           int(m["post"] or 0))
    return ParsedVersion(text=text, line=f"{key[0]}.{key[1]}", prerelease=bool(m["pre"]), key=key)


def version_key(text: str) -> tuple:
    """An order for TensorRT-LLM versions: 1.2.0rc6 < 1.2.0rc6.post1 < 1.2.0 < 1.2.1 < 1.3.0rc0."""
    parsed = parse_version(text)
    if parsed is None:
        raise ValueError(f"not a TensorRT-LLM version: {text!r}")
    return parsed.key


def line_key(line: str) -> tuple:
    return version_key(line + ".0")
