"""`tk import`: an existing TensorRT-LLM disaggregated deployment config becomes a tk recipe.

Formats (``KINDS``): NVIDIA/srt-slurm TensorRT-LLM recipes, TensorRT-LLM's own Slurm benchmark config
(examples/disaggregated/slurm/benchmark/config.yaml) and a `trtllm-serve disaggregated` config that carries the
servers' options (TensorRT-LLM's disaggregated examples and test configs). The recipe carries everything tk can
express; what it cannot is listed (``ImportResult.ledger.dropped``), never dropped silently; and the recipe is
planned at once, so the result also says what tk renders differently from the source (``changed``) and what it adds
(``added``), and whether the deployment passes tk's checks (TensorRT-LLM's own, facts.llm_args).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from toolkit.errors import RecipeError, Violation
from toolkit.importer import srtslurm, trtllm_bench, trtllm_disagg
from toolkit.importer.common import Ledger, SourceError, flatten
from toolkit.recipe.yaml import parse_yaml
from toolkit.text import cut, escape_controls

KINDS = {m.KIND: m for m in (srtslurm, trtllm_bench, trtllm_disagg)}
MAX_SOURCE_BYTES = 1 << 20
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class ImportResult:
    kind: str
    source: str
    recipe: dict  # the recipe as data
    text: str  # the recipe as YAML, with a header saying where it came from and what was not carried
    ledger: Ledger
    violations: list = field(default_factory=list)  # the imported recipe's: schema or plan (TensorRT-LLM's rules)
    warnings: list = field(default_factory=list)  # the plan's
    changed: list = field(default_factory=list)  # (source path, source value, value tk renders)
    added: list = field(default_factory=list)  # (rendered path, value): what tk writes that the source did not
    plan: object = None  # the Plan, when the recipe plans

    @property
    def ok(self) -> bool:
        return not self.violations


def read_source(path: str | Path) -> dict:
    return _read(path)[0]


def _read(path: str | Path) -> tuple[dict, dict]:
    """The source's mapping and the line of each field path in it (toolkit.recipe.yaml.parse_yaml)."""
    p = Path(path)
    file = cut(str(path))
    if not p.is_file():
        raise RecipeError([Violation(file, None, "(file)", "no such file", "give the path of the config to import")])
    try:
        with p.open("rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError([Violation(file, None, "(file)", f"cannot read it: {cut(str(exc))}",
                                     "check the file's permissions and encoding (UTF-8)")]) from None
    if len(data) > MAX_SOURCE_BYTES:
        raise RecipeError([Violation(file, None, "(size)", f"larger than {MAX_SOURCE_BYTES} bytes",
                                     "give the deployment config, not a data file")])
    doc, lines = parse_yaml(text, file)
    if not isinstance(doc, dict):
        raise RecipeError([Violation(file, 1, "(top level)", "not a YAML mapping",
                                     f"give a config of one of the formats {', '.join(KINDS)}")])
    return doc, lines


def detect(doc: dict) -> str | None:
    for kind, module in KINDS.items():
        if module.looks_like(doc):
            return kind
    return None


STDOUT = "<stdout>"  # what the plan check's messages name when the recipe is printed, not written
SITE_AUTO = "auto"  # check with the site file `tk plan` reads (toolkit.recipe.site.load_site)


def import_config(path: str | Path, kind: str | None = None, name: str | None = None,
                  output: str | Path | None = None, site=SITE_AUTO) -> ImportResult:
    """Convert, write nothing. Raises RecipeError when the source cannot be read or converted at all. ``output``:
    where the recipe will be written (the plan check's messages name it); ``site``: the site defaults the check
    merges under the recipe, as `tk plan` will (a SiteDefaults, None for none, or the user's site file)."""
    doc, lines = _read(path)
    return import_doc(doc, str(path), kind=kind, name=name, lines=lines, output=output, site=site)


def import_doc(doc: dict, file: str, kind: str | None = None, name: str | None = None,
               lines: dict | None = None, output: str | Path | None = None, site=None) -> ImportResult:
    """Convert a source already read (``file`` names it in messages; ``lines``: field path -> line in it; ``output``
    and ``site`` as for ``import_config``)."""
    found = kind or detect(doc)
    if found is None or found not in KINDS:
        raise RecipeError([Violation(file, 1, "(format)", "not a config tk can import" if found is None else
                                     f"unknown format {found!r}", f"give one of: {', '.join(KINDS)} (--kind)")])
    ledger = Ledger(kind=found, source=file)
    doc = as_data(doc)
    try:
        recipe = KINDS[found].convert(doc, ledger)
        ledger.sweep(doc)
    except SourceError as exc:
        raise RecipeError([Violation(file, (lines or {}).get(tuple(exc.path.split("."))), exc.path,
                                     f"{cut(str(exc))}: tk cannot import it as {found}",
                                     f"write {exc.path} as {exc.expected}, as a {found} config has it")]) from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise RecipeError([Violation(file, None, "(format)", f"cannot import it as {found}: {exc}",
                                     "import a disaggregated config of this format")]) from None
    head = {"schema_version": recipe.pop("schema_version", 1),
            "name": SAFE_NAME.sub("-", str(name or recipe.pop("name", ""))).strip("-._")[:64] or "imported",
            "description": f"imported by tk import from {Path(file).name} ({found})"[:1000]}
    recipe.pop("name", None)
    recipe.pop("description", None)
    recipe = {**head, **recipe}
    text = render_text(recipe, ledger)
    result = ImportResult(kind=found, source=file, recipe=recipe, text=text, ledger=ledger)
    check(result, STDOUT if output is None else str(output), site)
    return result


def as_data(value):
    """The source as JSON-like data: YAML's dates and times, binary and sets (yaml.safe_load builds date, datetime,
    bytes and set objects) as text and lists, keys too, so that the recipe, the ledger and `tk import --json` carry
    only what a JSON document and a recipe can hold."""
    if isinstance(value, dict):
        return {k if isinstance(k, (str, int, float, bool)) or k is None else str(k): as_data(v)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_data(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((as_data(v) for v in value), key=str)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)  # datetime.date / datetime.datetime: ISO 8601, as YAML wrote it


def render_text(recipe: dict, ledger: Ledger) -> str:
    head = [f"# Imported by `tk import` from {ledger.source} ({ledger.kind}).",
            "# Every value tk can carry is here; " + ("what it could not carry, or did not understand, is listed below."
                                                     if ledger.dropped else "nothing was dropped.")]
    if ledger.dropped:
        head.append("# Not carried:")
        head += [f"#   {d.path}: {d.why}" for d in ledger.dropped]
    if ledger.notes:
        head.append("# To check:")
        head += [f"#   {n}" for n in ledger.notes]
    body = yaml.safe_dump(recipe, sort_keys=False, default_flow_style=None, width=120)
    # each header entry stays one comment line: a source's key or value with a line break (\n, \r, \x85, \u2028)
    # would otherwise end the comment and write a recipe line of its own
    return "\n".join(escape_controls(h) for h in head) + "\n" + body


def check(result: ImportResult, file: str = STDOUT, site=None) -> None:
    """Load and plan the imported recipe as `tk plan FILE` will (``file``: where it is written; ``site``: the site
    defaults, or SITE_AUTO for the user's site file); compare what tk renders with the source's options."""
    from toolkit.plan import build_plan
    from toolkit.recipe import load_recipe_text
    from toolkit.recipe.site import load_site

    try:
        loaded = load_recipe_text(result.text, file, site=load_site() if site == SITE_AUTO else site)
        plan = build_plan(loaded)
    except RecipeError as exc:
        result.violations = list(exc.violations)
        return
    result.plan = plan
    result.warnings = list(plan.warnings)
    for role in plan.roles:
        source = result.ledger.role_sources.get(role.title)
        if source is None:
            continue
        mine = flatten(role.llm_api_options)
        theirs = flatten(source)
        for path, value in theirs.items():
            if path in mine and mine[path] != value:
                result.changed.append((f"{role.title}.{path}", value, mine[path]))
            elif path not in mine and not any(p.startswith(path + ".") for p in mine) and value is not None:
                result.changed.append((f"{role.title}.{path}", value, None))
        for path, value in mine.items():
            if path not in theirs and not any(t.startswith(path + ".") or path.startswith(t + ".") for t in theirs):
                result.added.append((f"{role.title}.{path}", value))
