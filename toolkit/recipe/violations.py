"""The schema's refusals as recipe violations: pydantic's ValidationError, each error named by its field, blamed on
the line (or --set, or site file) that wrote it, with the fix said in a recipe writer's words."""

from __future__ import annotations

import difflib
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from toolkit.errors import Violation
from toolkit.recipe.schema import Recipe
from toolkit.text import MAX_ECHO, cut, short

MAX_VIOLATIONS = 50  # violations reported at once


class Blamer(Protocol):
    """What names the source of a field (toolkit.recipe.loader.LoadedRecipe)."""

    file: str

    def violation(self, path: Any, message: str, fix: str = "") -> Violation: ...


def _model_at(path: tuple) -> type[BaseModel] | None:
    """The schema class that holds the field at ``path`` (for did-you-mean)."""
    model: Any = Recipe
    for key in path[:-1]:
        field_info = getattr(model, "model_fields", {}).get(key)
        if field_info is None:
            return None
        ann = field_info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return None
    return model


def violations(exc: ValidationError, loaded: Blamer) -> list[Violation]:
    out = []
    errors = exc.errors()
    for err in errors[:MAX_VIOLATIONS]:
        loc = tuple(err["loc"])
        kind = err["type"]
        if kind == "extra_forbidden":
            model = _model_at(loc)
            known = sorted(model.model_fields) if model else []
            guess = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
            hint = f"did you mean {guess[0]!r}?" if guess else f"known keys here: {', '.join(known)}"
            out.append(loaded.violation(loc, f"unknown key {short(loc[-1])}", hint))
        elif kind == "missing":
            out.append(loaded.violation(loc, "required field is missing", f"add `{cut(str(loc[-1]))}:` to the recipe"))
        elif kind in ("literal_error", "enum"):
            expected = err.get("ctx", {}).get("expected", "")
            out.append(loaded.violation(loc, f"{short(err['input'])} is not allowed", f"use one of {expected}"))
        elif kind == "model_type":  # pydantic says "a valid dictionary or instance of RoleSpec": a class name
            out.append(loaded.violation(loc, f"a section is a mapping of its fields, not {short(err.get('input'))}",
                                        _fix_for(kind, err)))
        else:
            msg = cut(str(err["msg"]).removeprefix("Value error, "), 2 * MAX_ECHO)
            out.append(loaded.violation(loc, f"{msg} (got {short(err.get('input'))})", _fix_for(kind, err)))
    if len(errors) > MAX_VIOLATIONS:
        out.append(Violation(cut(loaded.file), None, "(more)", f"{len(errors) - MAX_VIOLATIONS} more violations "
                             "not shown", "fix the ones above and run again"))
    return out


# pydantic's error types (int_parsing, model_type, ...) by their first word, as a recipe writer says it: a section
# (a pydantic model) or any other dict is a mapping.
_TYPE_WORDS = {"model": "a mapping (the section's fields, key: value)", "dict": "a mapping (key: value)",
               "list": "a list", "int": "a whole number", "float": "a number", "bool": "true or false",
               "string": "text (quote it if YAML reads it as something else)"}


def _fix_for(kind: str, err: dict) -> str:
    ctx = err.get("ctx", {})
    if kind.startswith(("greater_than", "less_than")):
        bound = next(iter(ctx.values()), None)
        return f"give a value {kind.replace('_', ' ').replace('equal', 'or equal to')} {bound}"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return f"give {_TYPE_WORDS.get(kind.split('_')[0], 'a value of type ' + kind.split('_')[0])}"
    return "correct the value"
