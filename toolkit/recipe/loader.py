"""Load a recipe: YAML with line numbers, ``--set a.b=c`` overrides, schema validation.

The result is a ``LoadedRecipe``: the validated ``Recipe`` plus where each field came from,
so later stages can point a user at the line to change.
"""

from __future__ import annotations

import difflib
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from toolkit.errors import RecipeError, Violation
from toolkit.facts import versions
from toolkit.facts.engines import ENGINES
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
    # Where recipe.trtllm_version came from: "recipe" (written or --set), "image" (derived from the tag of
    # cluster.container_image) or "default" (versions.latest(): no version written and no readable image tag).
    version_source: str = "recipe"
    warnings: tuple = ()  # found while loading (an unreadable image tag); the plan lists them with its own
    # The site defaults merged under the recipe (toolkit.recipe.site): their file, where each of their values is
    # written, and the field paths whose value is the site's.
    site_file: str | None = None
    site_lines: dict = field(default_factory=dict)
    site_paths: tuple = ()
    # The exact TensorRT-LLM release the recipe runs where it says (trtllm_version "1.3.0rc23", or the tag of
    # cluster.container_image), else None: only the line is known (facts.llm_args.Target).
    release: str | None = None

    def line_of(self, path: Path_) -> int | None:
        """The line of a field, or of its nearest written parent."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None

    def violation(self, path: Path_ | str, message: str, fix: str = "") -> Violation:
        """A violation at ``path``, blamed on the --set that wrote it, else on the recipe file's line."""
        if isinstance(path, str):
            path = tuple(path.split("."))
        path = tuple(path)
        source, line = cut(self.file), self.line_of(path)
        if self.from_site(path):
            source, line = cut(self.site_file or ""), _nearest(self.site_lines, path)
        expr = self.override_of(path)
        if expr is not None:
            source, line = f"--set {cut(expr)}", None
        dotted = cut(".".join(str(p) for p in path))
        return Violation(file=source, line=line, field=dotted, message=message, fix=fix)

    def override_of(self, path: tuple) -> str | None:
        """The last --set that wrote ``path`` or a part of it, or that created it (``--set foo.bar=1`` creates
        the unknown section ``foo``, which is not in the file)."""
        str_path = tuple(str(p) for p in path)
        for expr in reversed(self.overrides):
            target = _set_path(expr)
            n = min(len(target), len(str_path))
            if target[:n] != str_path[:n]:
                continue
            if len(str_path) >= len(target) or path not in self.lines:
                return expr
        return None

    def from_site(self, path: Path_) -> bool:
        """The value at ``path`` (or the part of it that is written) comes from the site file, not the recipe:
        the site writes more of the path than the recipe does."""
        if not self.site_file:
            return False
        path = tuple(path)
        return _written(self.site_lines, path) > _written(self.lines, path)

    def source_of(self, path: Path_) -> str:
        """Where the value at ``path`` came from: "--set EXPR", "SITE_FILE:LINE", "RECIPE_FILE:LINE" or
        "default" (nothing wrote it)."""
        path = tuple(path)
        expr = self.override_of(path)
        if expr is not None:
            return f"--set {cut(expr)}"
        if self.from_site(path):
            return f"{cut(self.site_file or '')}:{_nearest(self.site_lines, path)}"
        if path in self.lines:
            return f"{cut(self.file)}:{self.lines[path]}"
        return "default"

    def outside_sources(self) -> tuple[tuple[str, str, str], ...]:
        """(dotted field, value as text, source) of every value the recipe file did not write: the site file's
        values and the --set overrides, in field order; what `tk plan` lists under "values from outside the
        recipe"."""
        paths = list(self.site_paths)
        for expr in self.overrides:
            target = _set_path(expr)
            if target not in paths:
                paths.append(target)
        out = {}
        for path in paths:
            out[".".join(str(p) for p in path)] = (_shown(_lookup(self.raw, path)), self.source_of(path))
        return tuple((k, v, src) for k, (v, src) in sorted(out.items()))

    @property
    def base_dir(self) -> Path:
        return Path(self.file).resolve().parent


def _lookup(doc, path: tuple):
    """The value at a field path of a recipe mapping (None where there is none)."""
    node = doc
    for key in path:
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            node = node[key]
        else:
            return None
    return node


def _shown(value, limit: int = 80) -> str:
    """A value as `tk plan` shows it in one table cell."""
    import json

    try:
        text = value if isinstance(value, str) else json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return cut(text, limit)


def _written(lines: dict, path: tuple) -> int:
    """How much of ``path`` a file writes: the length of its longest prefix that has a line."""
    for n in range(len(path), 0, -1):
        if path[:n] in lines:
            return n
    return 0


def _nearest(lines: dict, path: tuple) -> int | None:
    n = _written(lines, path)
    return lines[path[:n]] if n else None


# Bounds on what a recipe may be: a recipe is a small hand-written file, and a YAML alias "bomb"
# (a few hundred bytes that expand to billions of values) must be refused before it is expanded.
MAX_RECIPE_BYTES = 1 << 20  # 1 MiB, the recipe file and each --set value
MAX_NODES = 10_000  # values in the document, every alias and merge key counted as expanded
MAX_DEPTH = 64  # nesting of mappings and sequences, aliases expanded
MAX_ECHO = 200  # characters of a value an error message repeats
MAX_VIOLATIONS = 50  # violations reported at once

_MERGE_TAG = "tag:yaml.org,2002:merge"


def escape_controls(text: str) -> str:
    """``text`` with every control character, surrogate and line or paragraph separator written as its escape
    (\\n, \\x85, \\u2028): what is left is one line to a terminal and to YAML (whose line breaks include
    \\x85, \\u2028 and \\u2029)."""
    return "".join(ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp")
                   else ch for ch in text)


def cut(text: str, limit: int = MAX_ECHO) -> str:
    """Text for an error message: control characters escaped (a newline or ESC in a file name or a --set
    must not break the message or drive the terminal), cut to ``limit`` characters (a 20,000-entry mapping
    is not echoed whole)."""
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


class _Bound(Exception):
    """The document breaks a size, depth or alias bound (raised while composing, before expanding)."""

    def __init__(self, mark, message: str, fix: str):
        super().__init__(message)
        self.line = mark.line + 1 if mark is not None else None
        self.message = message
        self.fix = fix


class _BoundedComposer(yaml.composer.Composer):
    """Composes the node graph while counting what it would expand to.

    PyYAML shares an aliased node instead of copying it, so composing a billion-laughs document is cheap;
    the expansion happens later, in whoever walks the data. Here each node counts once, and each alias
    (merge keys included) counts as the size of what it points to, so the walk is refused before it starts.
    Recursive aliases (an anchor used inside itself) are refused too: the data would be a cycle.
    """

    def compose_document(self):
        self._tk_total = 0
        self._tk_heights: list[int] = []  # per open node: the tallest child so far
        self._tk_open: set[str] = set()  # anchors whose node is still being composed
        self._tk_anchored: dict[str, tuple[int, int]] = {}  # anchor -> (expanded size, height)
        self._tk_aliases = 0
        return super().compose_document()

    def _tk_add(self, n: int, mark) -> None:
        self._tk_total += n
        if self._tk_total > MAX_NODES:
            if self._tk_aliases:
                raise _Bound(mark, f"the document expands to more than {MAX_NODES} values, each alias (*name, "
                             "<<: *name) counted as the values it repeats; a recipe is a small file",
                             "remove the aliases that repeat large parts, or write the values out")
            raise _Bound(mark, f"the document holds more than {MAX_NODES} values; a recipe is a small file",
                         "remove what tk does not need")

    def compose_node(self, parent, index):
        if self.check_event(yaml.events.AliasEvent):
            event = self.peek_event()
            if event.anchor in self._tk_open:
                raise _Bound(event.start_mark, f"alias *{event.anchor} is used inside its own anchor "
                             f"&{event.anchor} (a recursive structure)",
                             f"remove *{event.anchor} from inside the value it names")
            node = super().compose_node(parent, index)  # raises on an undefined alias
            self._tk_aliases += 1
            size, height = self._tk_anchored.get(event.anchor, (1, 1))
            if len(self._tk_heights) + height > MAX_DEPTH:
                raise _Bound(event.start_mark, f"alias *{event.anchor} nests values deeper than {MAX_DEPTH} "
                             "levels", "flatten the structure")
            self._tk_add(size, event.start_mark)
            if self._tk_heights:
                self._tk_heights[-1] = max(self._tk_heights[-1], height)
            return node
        event = self.peek_event()
        if len(self._tk_heights) >= MAX_DEPTH:
            raise _Bound(event.start_mark, f"values nested deeper than {MAX_DEPTH} levels",
                         "flatten the structure; a recipe needs only a few levels")
        anchor = event.anchor
        before = self._tk_total
        self._tk_add(1, event.start_mark)
        if anchor is not None:
            self._tk_open.add(anchor)
        self._tk_heights.append(0)
        node = super().compose_node(parent, index)
        height = 1 + self._tk_heights.pop()
        if self._tk_heights:
            self._tk_heights[-1] = max(self._tk_heights[-1], height)
        if anchor is not None:
            self._tk_open.discard(anchor)
            self._tk_anchored[anchor] = (self._tk_total - before, height)
        return node


class _LineLoader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, _BoundedComposer,
                  yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
    """SafeLoader with bounds, that refuses duplicate and complex keys and supports merge keys (``<<: *x``).

    Duplicate keys are refused because a silent override is a classic recipe bug; a key given by a merge
    key and again in the mapping itself is an override by design (YAML 1.1), not a duplicate.
    """

    def __init__(self, stream):
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        _BoundedComposer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)


def _construct_mapping(loader, node, deep=False):
    if not isinstance(node, yaml.MappingNode):
        raise yaml.constructor.ConstructorError(None, None, f"expected a mapping, found {node.id}", node.start_mark)
    seen = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        if not isinstance(key_node, yaml.ScalarNode):
            raise yaml.constructor.ConstructorError(
                None, None, f"a key must be a plain name, not a {key_node.id} (`? [a, b]` or `? {{a: 1}}`)",
                key_node.start_mark)
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(None, None, f"key {short(key)} cannot be a mapping key",
                                                    key_node.start_mark) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {short(key)} (first on line {seen[key] + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    loader.flatten_mapping(node)  # merge keys: the merged pairs first, so the mapping's own keys win
    return yaml.constructor.BaseConstructor.construct_mapping(loader, node, deep=deep)


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _line_map(node, path=(), out=None, texts=None) -> tuple[dict, dict]:
    """field path -> line, and field path -> source text of each unquoted number (see ``_AS_WRITTEN``).

    Walks the flattened node graph (merge keys already applied), so it visits at most MAX_NODES nodes."""
    out = {} if out is None else out
    texts = {} if texts is None else texts
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = path + (key_node.value,)
            out[child] = key_node.start_mark.line + 1
            _line_map(value_node, child, out, texts)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[path + (i,)] = item.start_mark.line + 1
            _line_map(item, path + (i,), out, texts)
    elif isinstance(node, yaml.ScalarNode) and path in _AS_WRITTEN and node.style is None:
        texts[path] = node.value
    return out, texts


# Fields that are strings even when written as a YAML number: `trtllm_version: 1.10` means "1.10",
# which YAML would read as the float 1.1. The loader keeps the text as written.
_AS_WRITTEN = {("trtllm_version",)}


def _expand(value):
    """A fresh copy of the data: an aliased value is shared by PyYAML, and an override of one use must not
    change the others. Bounded by the composer (at most MAX_NODES values, MAX_DEPTH deep)."""
    if isinstance(value, dict):
        return {k: _expand(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v) for v in value]
    return value


def _yaml_violation(source: str, exc: BaseException) -> Violation:
    if isinstance(exc, _Bound):
        return Violation(source, exc.line, "(yaml)", exc.message, exc.fix)
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        return Violation(source, line, "(yaml)", f"not valid YAML: {cut(str(exc.problem or exc))}",
                         "fix the YAML syntax on that line")
    if isinstance(exc, yaml.YAMLError):
        return Violation(source, None, "(yaml)", f"not valid YAML: {cut(str(exc))}", "fix the YAML syntax")
    # A value PyYAML cannot build (e.g. the date 2024-13-01), or a bound this module missed.
    return Violation(source, None, "(yaml)", f"cannot read the YAML: {cut(f'{type(exc).__name__}: {exc}')}",
                     "fix the value, or quote it to make it a string")


def parse_site_text(text: str, source: str) -> tuple[Any, dict]:
    """A site file's YAML, read with a recipe's bounds and rules (toolkit.recipe.site); numbers written for
    text fields (``trtllm_version: 1.10``) are kept as written, as in a recipe."""
    data, lines, texts = _parse(text, source)
    if isinstance(data, dict):
        _keep_as_written(data, texts)
    return data, lines


def _keep_as_written(data: dict, texts: dict) -> None:
    for path, written in texts.items():  # `trtllm_version: 1.10` is "1.10", not the float 1.1
        if len(path) == 1 and isinstance(data.get(path[0]), (int, float)) and not isinstance(data.get(path[0]), bool):
            data[path[0]] = written


def parse_yaml(text: str, file: str) -> tuple[Any, dict]:
    """Parse YAML text within the bounds; any problem becomes a RecipeError pointing at the line."""
    data, lines, _ = _parse(text, file)
    return data, lines


def _parse(text: str, source: str) -> tuple[Any, dict, dict]:
    if len(text) > MAX_RECIPE_BYTES:
        raise RecipeError([Violation(source, None, "(size)", f"{len(text)} characters, more than the "
                                     f"{MAX_RECIPE_BYTES} a recipe may have", "a recipe is a small file; "
                                     "remove what tk does not need")])
    loader = None
    try:
        loader = _LineLoader(text)  # the reader refuses unprintable characters here already
        node = loader.get_single_node()
        if node is None:
            return None, {}, {}
        data = loader.construct_document(node)
        lines, texts = _line_map(node)
        return _expand(data), lines, texts
    except (yaml.YAMLError, _Bound, ValueError, TypeError, OverflowError, RecursionError, MemoryError) as exc:
        raise RecipeError([_yaml_violation(source, exc)]) from None
    finally:
        if loader is not None:
            loader.dispose()


def _count_values(data, limit: int) -> int:
    """How many values ``data`` holds, stopping past ``limit`` (the overrides can add up)."""
    count, stack = 0, [data]
    while stack and count <= limit:
        v = stack.pop()
        count += 1
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return count


def _set_path(expr: str) -> tuple:
    return tuple(k.strip() for k in expr.split("=", 1)[0].strip().split("."))


def apply_override(data: dict, expr: str) -> None:
    """Apply one ``a.b.c=value`` override in place; the value is parsed as YAML, within the same bounds."""
    source = f"--set {cut(expr)}"
    if "=" not in expr:
        raise RecipeError([Violation(source, None, cut(expr), "an override must look like a.b=value",
                                     "write e.g. --set generation.instances=4")])
    dotted, raw_value = expr.split("=", 1)
    keys = [k.strip() for k in dotted.strip().split(".")]
    if not all(keys):
        raise RecipeError([Violation(source, None, cut(dotted), "empty key in the field path",
                                     "write e.g. --set generation.instances=4")])
    if len(keys) > MAX_DEPTH:
        raise RecipeError([Violation(source, None, cut(dotted), f"a field path deeper than {MAX_DEPTH} levels",
                                     "give the path of a recipe field, e.g. context.env.NAME")])
    try:
        value, _, texts = _parse(raw_value, source) if raw_value.strip() else ("", {}, {})
    except RecipeError as exc:
        if exc.violations[0].field != "(yaml)" or not exc.violations[0].message.startswith("not valid YAML"):
            raise  # a bound (size, depth, aliases): never taken as a plain string
        value = raw_value  # not YAML: the text as given, e.g. --set description=a: b: c
    else:
        if tuple(keys) in _AS_WRITTEN and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = raw_value.strip()  # --set trtllm_version=1.10 means "1.10"
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise RecipeError([Violation(source, None, cut(dotted),
                                         f"{short(key)} is not a section, it cannot hold {short(keys[-1])}",
                                         "override a field inside a section, e.g. context.tp=2")])
        node = child
    node[keys[-1]] = value


_SITE_AUTO = object()


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = (), site: Any = _SITE_AUTO) -> LoadedRecipe:
    """Read, override and validate a recipe, with the site defaults (toolkit.recipe.site) merged under it.
    site: a SiteDefaults, None for none, or (default) the site file of this user / $TK_SITE.
    Raises RecipeError with every violation found."""
    file = str(path)
    p = Path(path)

    def refuse(message: str, fix: str):
        return RecipeError([Violation(cut(file), None, "(file)", message, fix)])

    if p.is_dir():
        name = p.name.removesuffix(".yaml")
        builtin = _builtin_recipe(name)
        if builtin is not None:
            raise refuse(f"is a directory, not a recipe file (it shadows the built-in recipe {name!r})",
                         f"give the built-in recipe by its path: {builtin}; or rename the directory")
        raise refuse("is a directory, not a recipe file", "give the path of a recipe YAML file")
    if not p.exists():
        raise refuse("no such recipe file",
                     "give the path of a recipe YAML, or see `tk recipes` for the built-in ones")
    if not p.is_file():
        raise refuse("not a regular file (a pipe, device or socket)", "give the path of a recipe YAML file")
    try:
        with p.open("rb") as f:
            data = f.read(MAX_RECIPE_BYTES + 1)
        if len(data) > MAX_RECIPE_BYTES:
            raise refuse(f"the file is larger than {MAX_RECIPE_BYTES} bytes (1 MiB); a recipe is a small file",
                         "give the recipe YAML, not a data file; remove what tk does not need")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise refuse(f"cannot read the recipe: {cut(str(exc))}",
                     "check the file's permissions and encoding (UTF-8)") from None
    if site is _SITE_AUTO:
        from toolkit.recipe.site import load_site

        site = load_site()
    return load_recipe_text(text, file, overrides, site=site)


def _builtin_recipe(name: str) -> Path | None:
    try:
        from toolkit.resources import recipes_dir

        candidate = recipes_dir() / f"{name}.yaml"
    except (OSError, ValueError):
        return None
    return candidate if candidate.is_file() else None


def load_recipe_text(text: str, file: str, overrides=(), site=None) -> LoadedRecipe:
    """Parse, override and validate recipe text. site: a toolkit.recipe.site.SiteDefaults merged under the
    recipe (None: none; a resolved recipe read back from a manifest must not get the site again)."""
    overrides = tuple(overrides)
    data, lines, texts = _parse(text, cut(file))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError([Violation(cut(file), 1, "(top level)", "a recipe must be a YAML mapping",
                                     "start from a recipe in recipes/ (see `tk recipes`)")])
    _keep_as_written(data, texts)
    site_kw: dict = {}
    if site is not None:
        from toolkit.recipe.site import merge_under, site_leaves

        site_kw = {"site_file": site.file, "site_lines": dict(site.lines),
                   "site_paths": tuple(site_leaves(site.data, data))}
        data = merge_under(_expand(site.data), data)
    for expr in overrides:
        apply_override(data, expr)
    if overrides and _count_values(data, MAX_NODES) > MAX_NODES:
        raise RecipeError([Violation(f"--set {cut(overrides[-1])}", None, "(size)",
                                     f"with the overrides the recipe holds more than {MAX_NODES} values",
                                     "set fewer or smaller values")])
    proto = LoadedRecipe(recipe=None, file=file, raw=data, lines=lines, overrides=overrides,  # type: ignore[arg-type]
                         **site_kw)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(_violations(exc, proto)) from None
    line, source, warnings = resolve_version(recipe, proto)
    release = _release(recipe)
    if recipe.trtllm_version is None:
        recipe = recipe.model_copy(update={"trtllm_version": line})
    return LoadedRecipe(recipe=recipe, file=file, raw=data, lines=lines, overrides=overrides,
                        version_source=source, warnings=tuple(warnings), release=release, **site_kw)


def _image(recipe: Recipe) -> str | None:
    """cluster.container_image where it says which TensorRT-LLM it holds (the engine runs TensorRT-LLM's image)."""
    image = recipe.cluster.container_image
    return image if image and ENGINES[recipe.engine].image_holds_trtllm else None


def _release(recipe: Recipe) -> str | None:
    """The exact release: a trtllm_version with more than the line ("1.2.0rc6.post1"), else a readable image tag."""
    given = versions.parse_version(recipe.trtllm_version) if recipe.trtllm_version else None
    if given and not given.line_only:
        return given.text
    image = _image(recipe)
    found = versions.image_version(image).version if image else None
    if found is not None and (not given or given.line == found.line):
        return found.text
    return None


def resolve_version(recipe: Recipe, loaded: LoadedRecipe) -> tuple[str, str, list[str]]:
    """The TensorRT-LLM line the recipe targets, where it came from, and warnings (``_resolve_version``); a release
    named by trtllm_version or the image's tag that tk does not know was published is a warning too."""
    line, source, warnings = _resolve_version(recipe, loaded)
    named = {"trtllm_version": recipe.trtllm_version}
    image = _image(recipe)
    if image:
        found = versions.image_version(image).version
        named["cluster.container_image"] = found.text if found else None
    for where, text in named.items():
        why = versions.unknown_release(text) if text else None
        if why and not (where != "trtllm_version" and text == named["trtllm_version"]):  # said once
            shown = short(text) if where == "trtllm_version" else f"{short(image)} (tag {text})"
            warnings.append(f"{where} {shown}: {why}")
    return line, source, warnings


def _resolve_version(recipe: Recipe, loaded: LoadedRecipe) -> tuple[str, str, list[str]]:
    """The TensorRT-LLM line the recipe targets, where it came from, and warnings.

    The tag of ``cluster.container_image`` is read where tk can (facts.versions.image_version): with no
    ``trtllm_version`` written, its line is the recipe's; with one written, the two must name the same line
    (a 1.0.0 container fed 1.2 options fails at start-up on keys it does not know). An image tk cannot read is
    a warning: nothing checks that it holds the targeted line. Raises RecipeError on a contradiction."""
    given = recipe.trtllm_version
    image = _image(recipe)
    if not image:
        return (versions.get(given).line, "recipe", []) if given else (versions.latest(), "default", [])
    found = versions.image_version(image)
    if found.version is None:
        why = f"cannot read the TensorRT-LLM version of cluster.container_image {short(image)}: {found.reason}; "
        if given:
            return versions.get(given).line, "recipe", [
                why + f"tk renders for trtllm_version {given} and cannot check that the image holds it"]
        return versions.latest(), "default", [
            why + f"tk renders for its newest line, {versions.latest()}: set trtllm_version to the image's line "
            f"({', '.join(versions.supported())})"]
    version = found.version
    from toolkit.facts.containers import pyxis_image

    repository = pyxis_image(image).rendered.rsplit(":", 1)[0]  # the fixes show the spelling pyxis needs
    if version.line not in versions.supported():
        raise RecipeError([loaded.violation(
            ("cluster", "container_image"), f"the image holds TensorRT-LLM {version.text} (line {version.line}); tk "
            f"has facts only for the lines {', '.join(versions.supported())}, so it cannot render options that image "
            f"accepts", f"use an image of a supported line, e.g. {repository}:"
            f"{versions.get(versions.latest()).release.lstrip('v')}")])
    warnings = _prerelease_warning(version, image)
    if not given:
        return version.line, "image", warnings
    line = versions.get(given).line
    if line != version.line:
        raise RecipeError([_contradiction(loaded, given, line, version, image, repository)])
    return line, "recipe", warnings


def _prerelease_warning(version: versions.ParsedVersion, image: str) -> list[str]:
    """A pre-release no snapshot was read at is checked against the nearest ones: said once."""
    from toolkit.facts import llm_args

    if not version.prerelease or llm_args.read_at(version.text):
        return []
    ev = llm_args.evidence(llm_args.Target(version.line, version.text))
    return [f"cluster.container_image {short(image)} is a pre-release ({version.text}); tk has no facts read at it: "
            f"its options are checked against {' and '.join(s.cite for s in ev)}, and a key only one of them has is a "
            "warning"]


def _contradiction(loaded: LoadedRecipe, given: str, line: str, version: versions.ParsedVersion, image: str,
                   repository: str) -> Violation:
    """trtllm_version and the image name different lines: blamed on the value the user changed last (a --set of the
    image alone points at the image)."""
    example = f"{repository}:{versions.get(given).release.lstrip('v')}"
    image_set = loaded.override_of(("cluster", "container_image")) is not None
    version_set = loaded.override_of(("trtllm_version",)) is not None
    if image_set and not version_set:
        return loaded.violation(
            ("cluster", "container_image"),
            f"the image holds TensorRT-LLM {version.text} (line {version.line}) but the recipe's "
            f"trtllm_version is {given}; tk would render {line} options for a {version.line} container",
            f"use a {line} image (e.g. {example}), or set trtllm_version: \"{version.line}\" too, "
            "or remove trtllm_version to follow the image")
    return loaded.violation(
        ("trtllm_version",),
        f"trtllm_version {given} contradicts cluster.container_image {short(image)}, which holds TensorRT-LLM "
        f"{version.text} (line {version.line}); the servers would start {line} options in a "
        f"{version.line} container",
        f"set cluster.container_image to a {line} image too (e.g. --set cluster.container_image={example}), "
        + ("or drop --set trtllm_version" if version_set else "or remove trtllm_version") + " to follow the image")


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
