"""The kind of value an LLM-API option takes, and what TensorRT-LLM's pydantic makes of a value of another kind.

Each option's kind is in the generated data (``trtllm_data.json``, field "value": scripts/trtllm_facts.py normalises
the annotation of TensorRT-LLM's own field, and the sources file adds a validator's bounds where the annotation is
silent), so a new field or a changed type is regenerated data, never a table here. ``kind_of(target, path)`` is the
kind in the newest snapshot that speaks for the target.

TensorRT-LLM's option models are ``StrictBaseModel`` = pydantic ``BaseModel`` with ``extra="forbid"``
(tensorrt_llm/llmapi/llm_args.py), not ``strict=True``: pydantic's lax mode converts (bool: 0/1, "true"/"false",
"yes"/"no", "on"/"off"; int: "2", 2.0, true; float: "0.5"; lists item by item). ``OptionKind.lax`` is that
conversion, done by pydantic itself; a value it cannot convert fails at start-up, and tk refuses it first.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

ABSENT: Any = object()  # no value: an option tk does not write, or a value pydantic cannot convert
INT64 = (-(1 << 63), (1 << 63) - 1)  # what any int option holds once it reaches C++ or numpy


@functools.lru_cache(maxsize=None)
def _adapter(shape):
    from pydantic import TypeAdapter

    return TypeAdapter(_python_type(shape))


def _python_type(shape):
    """The Python type pydantic validates a kind with (``shape``: the kind, frozen by ``_shape``)."""
    kind, optional, extra = shape
    base: Any = {"int": int, "float": float, "bool": bool, "str": str, "enum": Union[str, int, float, bool],
                 "dict": dict, "model": dict}.get(kind, Any)
    if kind == "list":
        base = list[_python_type(extra)]  # type: ignore[misc]
    elif kind == "union":
        base = Union[tuple(_python_type(s) for s in extra)]  # type: ignore[misc]
    return Optional[base] if optional else base


def _shape(spec: Mapping):
    kind = spec.get("type", "any")
    extra = (_shape(spec.get("items", {})) if kind == "list" else
             tuple(_shape(s) for s in spec.get("of", ())) if kind == "union" else None)
    return kind, bool(spec.get("optional")), extra


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class OptionKind:
    """One option's kind of value, as the data gives it (see the module docstring)."""

    spec: Mapping

    @property
    def type(self) -> str:
        return str(self.spec.get("type", "any"))

    def check(self, value) -> bool:
        """Whether ``value`` is of this kind as written (true is not 1, "8" is not 8); an enum's membership is
        facts.llm_args.value_status's (it knows which snapshots allow which values)."""
        if value is None:
            return bool(self.spec.get("optional")) or self.type == "any"
        check = getattr(self, f"_check_{self.type}", None)
        return True if check is None else check(value)

    def _check_int(self, value) -> bool:
        return _whole(value) and INT64[0] <= value <= INT64[1] and self._in_bounds(value)

    def _check_float(self, value) -> bool:
        return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and self._in_bounds(value))

    def _check_bool(self, value) -> bool:
        return isinstance(value, bool)

    def _check_str(self, value) -> bool:
        return isinstance(value, str)

    def _check_enum(self, value) -> bool:
        return isinstance(value, (str, int, float))

    def _check_list(self, value) -> bool:
        item = OptionKind(self.spec.get("items", {}))
        return isinstance(value, list) and all(item.check(v) for v in value)

    def _check_dict(self, value) -> bool:
        return isinstance(value, dict)

    _check_model = _check_dict

    def _check_union(self, value) -> bool:
        return any(OptionKind(s).check(value) for s in self.spec.get("of", ()))

    def _in_bounds(self, value) -> bool:
        s = self.spec
        return (("ge" not in s or value >= s["ge"]) and ("gt" not in s or value > s["gt"])
                and ("le" not in s or value <= s["le"]) and ("lt" not in s or value < s["lt"]))

    def lax(self, value):
        """``value`` as TensorRT-LLM's pydantic (lax mode) converts it, where the result is of this kind; else
        ABSENT (pydantic refuses it, or tk does: the kind's bounds are TensorRT-LLM's validators)."""
        if self.check(value):
            return value
        if isinstance(value, dict) or self.type in ("dict", "model", "any"):
            return ABSENT
        from pydantic import ValidationError

        try:
            converted = _adapter(_shape(self.spec)).validate_python(value)
        except (ValidationError, ValueError, TypeError, OverflowError):
            return ABSENT
        return converted if self.check(converted) else ABSENT

    def describe(self) -> str:
        """The kind in words, for "X is not <describe()>"."""
        text = self._words()
        return f"{text} (or null)" if self.spec.get("optional") else text

    def _words(self, plural: bool = False) -> str:
        s, kind = self.spec, self.type
        if kind == "int":
            return _int_words(s, plural)
        if kind == "float":
            if s.get("ge") == 0 and s.get("le") == 1:
                return "fractions from 0 to 1" if plural else "a fraction from 0 to 1"
            return "numbers" + _bounds_words(s) if plural else "a number" + _bounds_words(s)
        if kind == "list":
            return "a list of " + OptionKind(s.get("items", {}))._words(plural=True)
        if kind == "enum":
            return "one of " + ", ".join(map(str, s.get("values", ())))
        if kind == "union":
            return " or ".join(OptionKind(o)._words(plural) for o in s.get("of", ()))
        singular = {"bool": "a boolean", "str": "a string", "dict": "a mapping", "model": "a mapping",
                    "any": "a value"}
        word = singular.get(kind, "a value")
        return word.split(" ", 1)[1] + "s" if plural else word


def _int_words(s: Mapping, plural: bool) -> str:
    low = s.get("ge", s["gt"] + 1 if "gt" in s else None)
    noun = "integers" if plural else "integer"
    name = {1: f"positive {noun}", 0: f"non-negative {noun}"}.get(low) if low is not None else None
    high = s.get("le", s["lt"] - 1 if "lt" in s else None)
    if name is None:
        article = "" if plural else "an "
        text = f"{article}{noun}" + (f" from {low}" if low is not None else "")
    else:
        text = name if plural else f"a {name}"
    return text + (f" (at most {high})" if high is not None else "")


def _bounds_words(s: Mapping) -> str:
    parts = [f"{w} {s[k]}" for k, w in (("ge", "at least"), ("gt", "above"), ("le", "at most"), ("lt", "below"))
             if k in s]
    return f" ({', '.join(parts)})" if parts else ""


def kind_of(target, path: str) -> OptionKind | None:
    """The kind of ``path`` in the newest snapshot that speaks for ``target`` (a facts.llm_args.Target) and gives one;
    where none does (tk's hand tables of 1.0/1.1 record no types), the nearest snapshot that does, later ones first;
    None where no snapshot knows the key."""
    from toolkit.facts import llm_args

    ev = llm_args.evidence(target)
    every = llm_args.snapshots()
    last = every.index(ev[-1]) if ev else len(every) - 1
    for snap in [*reversed(ev), *every[last + 1:], *reversed(every[:last + 1])]:
        spec = (snap.fields.get(path) or {}).get("value")
        if spec and spec.get("type"):
            return OptionKind(spec)
    return None


def lax_converted(options: dict, target, prefix: str = "", drop: bool = False) -> dict:
    """A copy of ``options`` with every value pydantic converts to its option's kind replaced by what it converts
    to: what TensorRT-LLM reads, written so (toolkit.plan.derive, toolkit.plan.aggregated). ``drop``: a value of an
    option's kind that pydantic cannot convert, and a key that is not text, left out (rules.check_extra_options
    refuses them)."""
    out = {}
    for key, value in options.items():
        if drop and not isinstance(key, str):
            continue
        dotted = f"{prefix}.{key}" if prefix else str(key)
        kind = kind_of(target, dotted)
        if kind is not None and not kind.check(value):
            converted = kind.lax(value)
            if converted is not ABSENT:
                value = converted
            elif drop:
                continue
            elif isinstance(value, dict):
                value = lax_converted(value, target, dotted)
        elif isinstance(value, dict):
            value = lax_converted(value, target, dotted, drop)
        out[key] = value
    return out
