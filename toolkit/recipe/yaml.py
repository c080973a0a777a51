"""Reading a recipe's YAML (and a site file's, and a --set value's): bounded, with the line of every field.

PyYAML's safe loader (its events from LibYAML where PyYAML has it: five times faster, the same documents; composed
and constructed in Python here) with bounds checked while the document is composed (size, nesting, aliases counted as what
they expand to, so an alias "bomb" is refused before it is expanded), duplicate and complex keys refused, merge keys
(``<<: *x``) supported, and a map of field path -> line so later stages can blame the line to change. Any problem
is a RecipeError naming the source and the line. toolkit.recipe.loader (recipes, --set) and toolkit.recipe.site
(the site file) read through here; so does the importer (another tool's config).
"""

from __future__ import annotations

from typing import Any

import yaml

from toolkit.errors import RecipeError, Violation
from toolkit.text import cut, short

# Bounds on what a recipe may be: a recipe is a small hand-written file, and a YAML alias "bomb"
# (a few hundred bytes that expand to billions of values) must be refused before it is expanded.
MAX_RECIPE_BYTES = 1 << 20  # 1 MiB, the recipe file and each --set value
MAX_NODES = 10_000  # values in the document, every alias and merge key counted as expanded
MAX_DEPTH = 64  # nesting of mappings and sequences, aliases expanded

_MERGE_TAG = "tag:yaml.org,2002:merge"


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


try:  # LibYAML's reader, scanner and parser where PyYAML was built with it (the events only; composed below)
    from yaml.cyaml import CParser as _Events
except ImportError:  # pragma: no cover - a PyYAML without LibYAML
    _Events = None


class _LineLoader(_BoundedComposer, *((_Events,) if _Events else (yaml.reader.Reader, yaml.scanner.Scanner,
                                                                   yaml.parser.Parser)),
                  yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
    """SafeLoader with bounds, that refuses duplicate and complex keys and supports merge keys (``<<: *x``).

    Duplicate keys are refused because a silent override is a classic recipe bug; a key given by a merge
    key and again in the mapping itself is an override by design (YAML 1.1), not a duplicate.
    """

    def __init__(self, stream):
        if _Events:
            _Events.__init__(self, stream)
        else:
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
    """field path -> line, and field path -> source text of each unquoted number (see ``AS_WRITTEN``).

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
    elif isinstance(node, yaml.ScalarNode) and path in AS_WRITTEN and not node.style:  # plain: None, LibYAML ""
        texts[path] = node.value
    return out, texts


# Fields that are strings even when written as a YAML number: `trtllm_version: 1.10` means "1.10",
# which YAML would read as the float 1.1. The loader keeps the text as written.
AS_WRITTEN = {("trtllm_version",)}


def expand(value):
    """A fresh copy of the data: an aliased value is shared by PyYAML, and an override of one use must not
    change the others. Bounded by the composer (at most MAX_NODES values, MAX_DEPTH deep)."""
    if isinstance(value, dict):
        return {k: expand(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expand(v) for v in value]
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
    data, lines, texts = parse(text, source)
    if isinstance(data, dict):
        keep_as_written(data, texts)
    return data, lines


def keep_as_written(data: dict, texts: dict) -> None:
    for path, written in texts.items():  # `trtllm_version: 1.10` is "1.10", not the float 1.1
        if len(path) == 1 and isinstance(data.get(path[0]), (int, float)) and not isinstance(data.get(path[0]), bool):
            data[path[0]] = written


def parse_yaml(text: str, file: str) -> tuple[Any, dict]:
    """Parse YAML text within the bounds; any problem becomes a RecipeError pointing at the line."""
    data, lines, _ = parse(text, file)
    return data, lines


def parse(text: str, source: str) -> tuple[Any, dict, dict]:
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
        return expand(data), lines, texts
    except (yaml.YAMLError, _Bound, ValueError, TypeError, OverflowError, RecursionError, MemoryError) as exc:
        raise RecipeError([_yaml_violation(source, exc)]) from None
    finally:
        if loader is not None:
            loader.dispose()


def count_values(data, limit: int) -> int:
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

