"""Load a recipe: YAML with line numbers, ``--set a.b=c`` overrides, schema validation.

The result is a ``LoadedRecipe``: the validated ``Recipe`` plus where each field came from,
so later stages can point a user at the line to change.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from toolkit.errors import RecipeError, Violation
from toolkit.recipe.schema import Recipe

Path_ = tuple  # a field path, e.g. ("kv_transfer", "tokens_per_block")


@dataclass(frozen=True)
class LoadedRecipe:
    """A validated recipe and where its values came from."""

    recipe: Recipe
    file: str
    raw: dict  # the mapping as written (after overrides), for the manifest
    lines: dict = field(default_factory=dict)  # field path -> line number
    overrides: tuple = ()  # the --set expressions applied, in order

    def line_of(self, path: Path_) -> int | None:
        """The line of a field, or of its nearest written parent."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None

    def violation(self, path: Path_ | str, message: str, fix: str = "") -> Violation:
        if isinstance(path, str):
            path = tuple(path.split("."))
        source = self.file
        line = self.line_of(path)
        dotted = ".".join(str(p) for p in path)
        for expr in self.overrides:
            if expr.split("=", 1)[0].strip() == dotted:
                source, line = f"--set {expr}", None
        return Violation(file=source, line=line, field=dotted, message=message, fix=fix)

    @property
    def base_dir(self) -> Path:
        return Path(self.file).resolve().parent


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (a silent override is a classic recipe bug)."""


def _construct_mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _line_map(node, path=(), out=None) -> dict:
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = path + (key_node.value,)
            out[child] = key_node.start_mark.line + 1
            _line_map(value_node, child, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[path + (i,)] = item.start_mark.line + 1
            _line_map(item, path + (i,), out)
    return out


def parse_yaml(text: str, file: str) -> tuple[Any, dict]:
    """Parse YAML text; a syntax error becomes a RecipeError pointing at the line."""
    try:
        node = yaml.compose(text, Loader=_LineLoader)
        data = yaml.load(text, Loader=_LineLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise RecipeError([Violation(file, line, "(yaml)", f"not valid YAML: {exc.problem or exc}",
                                     "fix the YAML syntax on that line")]) from None
    except yaml.YAMLError as exc:
        raise RecipeError([Violation(file, None, "(yaml)", f"not valid YAML: {exc}", "fix the YAML syntax")]) from None
    return data, (_line_map(node) if node is not None else {})


def apply_override(data: dict, expr: str) -> None:
    """Apply one ``a.b.c=value`` override in place; the value is parsed as YAML."""
    if "=" not in expr:
        raise RecipeError([Violation(f"--set {expr}", None, expr, "an override must look like a.b=value",
                                     "write e.g. --set generation.instances=4")])
    dotted, raw_value = expr.split("=", 1)
    keys = [k.strip() for k in dotted.strip().split(".")]
    if not all(keys):
        raise RecipeError([Violation(f"--set {expr}", None, dotted, "empty key in the field path",
                                     "write e.g. --set generation.instances=4")])
    try:
        value = yaml.safe_load(raw_value) if raw_value.strip() else ""
    except yaml.YAMLError:
        value = raw_value
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise RecipeError([Violation(f"--set {expr}", None, dotted,
                                         f"{key!r} is not a section, it cannot hold {keys[-1]!r}",
                                         "override a field inside a section, e.g. context.tp=2")])
        node = child
    node[keys[-1]] = value


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> LoadedRecipe:
    """Read, override and validate a recipe. Raises RecipeError with every violation found."""
    file = str(path)
    p = Path(path)
    if not p.is_file():
        raise RecipeError([Violation(file, None, "(file)", "no such recipe file",
                                     "give the path of a recipe YAML, or see `tk recipes` for the built-in ones")])
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError([Violation(file, None, "(file)", f"cannot read the recipe: {exc}",
                                     "check the file's permissions and encoding (UTF-8)")]) from None
    return load_recipe_text(text, file, overrides)


def load_recipe_text(text: str, file: str, overrides=()) -> LoadedRecipe:
    data, lines = parse_yaml(text, file)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError([Violation(file, 1, "(top level)", "a recipe must be a YAML mapping",
                                     "start from a recipe in recipes/ (see `tk recipes`)")])
    for expr in overrides:
        apply_override(data, expr)
    proto = LoadedRecipe(recipe=None, file=file, raw=data, lines=lines, overrides=tuple(overrides))  # type: ignore[arg-type]
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(_violations(exc, proto)) from None
    return LoadedRecipe(recipe=recipe, file=file, raw=data, lines=lines, overrides=tuple(overrides))


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


def _violations(exc: ValidationError, loaded: LoadedRecipe) -> list[Violation]:
    out = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        kind = err["type"]
        if kind == "extra_forbidden":
            model = _model_at(loc)
            known = sorted(model.model_fields) if model else []
            guess = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
            hint = f"did you mean {guess[0]!r}?" if guess else f"known keys here: {', '.join(known)}"
            out.append(loaded.violation(loc, f"unknown key {loc[-1]!r}", hint))
        elif kind == "missing":
            out.append(loaded.violation(loc, "required field is missing", f"add `{loc[-1]}:` to the recipe"))
        elif kind in ("literal_error", "enum"):
            expected = err.get("ctx", {}).get("expected", "")
            out.append(loaded.violation(loc, f"{err['input']!r} is not allowed", f"use one of {expected}"))
        else:
            msg = err["msg"].removeprefix("Value error, ")
            out.append(loaded.violation(loc, f"{msg} (got {err.get('input')!r})", _fix_for(kind, err)))
    return out


def _fix_for(kind: str, err: dict) -> str:
    ctx = err.get("ctx", {})
    if kind.startswith(("greater_than", "less_than")):
        bound = next(iter(ctx.values()), None)
        return f"give a value {kind.replace('_', ' ').replace('equal', 'or equal to')} {bound}"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return f"give a value of type {kind.split('_')[0]}"
    return "correct the value"
