"""Load a recipe: its YAML (toolkit.recipe.yaml), the site defaults under it (toolkit.recipe.site), ``--set a.b=c``
overrides, schema validation (refusals worded by toolkit.recipe.violations), the TensorRT-LLM version it targets.

The result is a ``LoadedRecipe``: the validated ``Recipe`` plus where each field came from,
so later stages can point a user at the line to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from toolkit.errors import RecipeError, Violation
from toolkit.facts import versions
from toolkit.facts.engines import ENGINES
from toolkit.recipe import yaml as recipe_yaml
from toolkit.recipe.schema import Recipe
from toolkit.recipe.site import load_site, merge_under, site_leaves
from toolkit.recipe.violations import violations
from toolkit.recipe.yaml import MAX_DEPTH, MAX_NODES, MAX_RECIPE_BYTES
from toolkit.text import cut, short

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
        value, _, texts = recipe_yaml.parse(raw_value, source) if raw_value.strip() else ("", {}, {})
    except RecipeError as exc:
        if exc.violations[0].field != "(yaml)" or not exc.violations[0].message.startswith("not valid YAML"):
            raise  # a bound (size, depth, aliases): never taken as a plain string
        value = raw_value  # not YAML: the text as given, e.g. --set description=a: b: c
    else:
        if tuple(keys) in recipe_yaml.AS_WRITTEN and isinstance(value, (int, float)) and not isinstance(value, bool):
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
    data, lines, texts = recipe_yaml.parse(text, cut(file))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError([Violation(cut(file), 1, "(top level)", "a recipe must be a YAML mapping",
                                     "start from a recipe in recipes/ (see `tk recipes`)")])
    recipe_yaml.keep_as_written(data, texts)
    site_kw: dict = {}
    if site is not None:
        site_kw = {"site_file": site.file, "site_lines": dict(site.lines),
                   "site_paths": tuple(site_leaves(site.data, data))}
        data = merge_under(recipe_yaml.expand(site.data), data)
    for expr in overrides:
        apply_override(data, expr)
    if overrides and recipe_yaml.count_values(data, MAX_NODES) > MAX_NODES:
        raise RecipeError([Violation(f"--set {cut(overrides[-1])}", None, "(size)",
                                     f"with the overrides the recipe holds more than {MAX_NODES} values",
                                     "set fewer or smaller values")])
    proto = LoadedRecipe(recipe=None, file=file, raw=data, lines=lines, overrides=overrides,  # type: ignore[arg-type]
                         **site_kw)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(violations(exc, proto)) from None
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

