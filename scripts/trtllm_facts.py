#!/usr/bin/env python3
"""Generate toolkit/facts/trtllm_data.json from TensorRT-LLM's own files (listed in scripts/trtllm_sources.yaml).

    python scripts/trtllm_facts.py --download            # fetch each file at its commit from GitHub, then generate
    python scripts/trtllm_facts.py --from-dir DIR         # files already downloaded, as DIR/<commit>/<path>
    python scripts/trtllm_facts.py --from-dir DIR --check # exit 1 if the committed data file differs
    python scripts/trtllm_facts.py --from-dir DIR --reuse # a file DIR lacks: its facts from the committed data file

What is read, per kind of source (docs/trtllm-versions.md has the sources and how to add a release):
  manifest       tensorrt_llm/usage/llm_args_golden_manifest.json: the "TorchLlmArgs" rows (path, annotation, kind,
                 converter, allowed values), the format TensorRT-LLM's telemetry writes since 2026. The manifest
                 leaves out str/Path/dict/Any fields by design, so such fields of the newest older llm_args.py are
                 carried into a manifest snapshot (marked "carried"), and scripts/trtllm_sources.yaml may add
                 individually evidenced ones ("supplement").
  llm_args       tensorrt_llm/llmapi/llm_args.py before the manifest existed: the pydantic models reachable from
                 TorchLlmArgs, walked with the ast module (fields, Literal and Enum values, nested models, unions,
                 TypeAlias; dict/object/external classes are "opaque": TensorRT-LLM takes any keys below them).
  hand           tk's table from before this generator, for the 1.0/1.1 lines (no llm_args.py of that era is stored).
  envutils       cpp/tensorrt_llm/common/envUtils.cpp: the names given to getenv/get*Env.
  envs_registry  tensorrt_llm/envs.py: the keys of ENV_SPECS.
  disagg_utils   tensorrt_llm/llmapi/disagg_utils.py: extract_disagg_cfg's parameters (top-level keys),
                 extract_ctx_gen_cfgs' (server keys), DisaggClusterConfig's fields, extract_router_config's copied keys;
                 with tensorrt_llm/serve/router.py's create_router table (router types).

Every option gets a normalised value kind ("value": int / float / bool / str / enum with its values / list of a
kind / dict / model, optional, bounds) from its annotation, so tk checks values against the data, not a hand table;
the sources file's supplements add what a manifest is silent on (a field it cannot capture, a validator's range or
values, a default), each with its evidence. The release lines' rows (``lines``) and the releases' tag commits
(``releases``) are copied into the data with their evidence.

Only the standard library and PyYAML; no tk import, so it runs from a bare checkout.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import re
import sys
import tempfile
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "scripts" / "trtllm_sources.yaml"
OUTPUT = ROOT / "toolkit" / "facts" / "trtllm_data.json"
MAX_FILE_BYTES = 8 << 20  # the largest llm_args.py is ~0.3 MB; a bound on what a download may be
DOWNLOAD_TIMEOUT_S = 60
# pinned: the snapshot's fields are its releases'; inferred: no file of its releases could be read (a nearby commit's
# fields), so a key it lacks is unsure, never refused (toolkit/facts/llm_args.py reads it)
BASES = ("pinned", "inferred")


class SourceError(Exception):
    pass


# --- fetching ------------------------------------------------------------------------------------------------------

def wanted_files(sources: dict) -> list[tuple[str, str]]:
    """Every (commit, path) the sources name."""
    out = []
    for snap in sources["snapshots"]:
        if snap.get("commit"):
            out.append((snap["commit"], snap["path"]))
    for block in sources.get("env", []) + sources.get("proxy", []):
        if block.get("commit"):
            out.append((block["commit"], block["path"]))
        if block.get("routers_from"):
            out.append((block["routers_from"]["commit"], block["routers_from"]["path"]))
    return sorted(set(out))


def download(sources: dict, into: Path) -> None:
    for commit, path in wanted_files(sources):
        url = sources["raw_url"].format(repo=sources["repo"], commit=commit, path=path)
        target = into / commit / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp:  # noqa: S310 (a fixed https host)
            data = resp.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise SourceError(f"{url}: larger than {MAX_FILE_BYTES} bytes")
        target.write_bytes(data)
        print(f"downloaded {path} @ {commit[:12]}", file=sys.stderr)


def read_source(root: Path, commit: str, path: str) -> str:
    f = root / commit / path
    if not f.is_file():
        raise SourceError(f"missing {f}: download {path} at {commit} (or run with --download)")
    if f.stat().st_size > MAX_FILE_BYTES:
        raise SourceError(f"{f}: larger than {MAX_FILE_BYTES} bytes")
    return f.read_text(encoding="utf-8")


# --- the golden manifest -------------------------------------------------------------------------------------------

def read_manifest(text: str) -> dict[str, dict]:
    doc = json.loads(text)
    rows = doc.get("TorchLlmArgs")
    if not isinstance(rows, list):
        raise SourceError("manifest: no TorchLlmArgs list")
    out = {}
    for row in rows:
        # 2026 format: annotation + converter; the later one spells the annotation as "capture_policy".
        ann = row.get("annotation") or row.get("capture_policy") or ""
        conv = row.get("converter") or ("allowlist" if "allowlist" in str(row.get("capture_policy", "")) else "")
        out[row["path"]] = field(ann, row.get("kind", "value"), row.get("allowed_values") or [], conv)
    return out


def field(annotation: str, kind: str, allowed, converter: str = "", flags=()) -> dict:
    entry = {"annotation": annotation, "kind": kind}
    if allowed:
        entry["allowed"] = [str(v) for v in allowed]
    if converter:
        entry["converter"] = converter
    if flags:
        entry["flags"] = sorted(set(flags))
    return entry


# --- llm_args.py via ast ------------------------------------------------------------------------------------------

MODEL_BASES = {"BaseModel", "StrictBaseModel"}
ENUM_BASES = {"Enum", "StrEnum", "IntEnum"}
SCALARS = {"bool", "int", "float", "NonNegativeInt", "PositiveInt", "NonNegativeFloat", "PositiveFloat"}
UNSAFE = {"str", "Path", "object", "Any", "dict", "Dict", "Callable"}


class LlmArgsReader:
    """The option surface of TorchLlmArgs in one llm_args.py (a whole file or an excerpt of its classes)."""

    def __init__(self, text: str):
        tree = ast.parse(text)
        self.classes: dict[str, ast.ClassDef] = {}
        self.aliases: dict[str, ast.expr] = {}
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None \
                    and ast.unparse(node.annotation) == "TypeAlias":
                self.aliases[node.target.id] = node.value
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and isinstance(node.value, ast.Subscript):
                self.aliases[node.targets[0].id] = node.value
        self.fields: dict[str, dict] = {}
        self.opaque: set[str] = set()

    def bases(self, name: str) -> list[str]:
        cls = self.classes.get(name)
        return [ast.unparse(b) for b in cls.bases] if cls else []

    def derives(self, name: str, roots: set[str], seen=()) -> bool:
        if name in roots:
            return True
        return any(self.derives(b, roots, seen + (name,)) for b in self.bases(name) if b not in seen)

    def is_model(self, name: str) -> bool:
        return name in self.classes and self.derives(name, MODEL_BASES)

    def is_enum(self, name: str) -> bool:
        return name in self.classes and self.derives(name, ENUM_BASES)

    def enum_values(self, name: str) -> list[str]:
        out = []
        for node in self.classes[name].body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                value = node.value
                out.append(value.value if isinstance(value, ast.Constant) and isinstance(value.value, str)
                           else node.targets[0].id)
        return out

    def model_fields(self, name: str, seen=()) -> dict[str, ast.AnnAssign]:
        """Fields in MRO order (bases first; a subclass's annotation overrides), ClassVar and private excluded."""
        out: dict[str, ast.AnnAssign] = {}
        for base in self.bases(name):
            if base in self.classes and base not in seen:
                out.update(self.model_fields(base, seen + (name,)))
        for node in self.classes[name].body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                fname = node.target.id
                if fname.startswith("_") or ast.unparse(node.annotation).startswith("ClassVar"):
                    continue
                out[fname] = node
        return out

    def classvar(self, name: str, var: str, seen=()) -> str | None:
        for node in self.classes[name].body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == var \
                    and isinstance(node.value, ast.Constant):
                return node.value.value
        for base in self.bases(name):
            if base in self.classes and base not in seen:
                found = self.classvar(base, var, seen + (name,))
                if found is not None:
                    return found
        return None

    def dispatch_keys(self, arms: list[str]) -> list[str] | None:
        """The keys of a `config_classes = {...}` table in a from_dict of the arms' common base (the decoding_type
        TensorRT-LLM's update_llm_args_with_extra_dict dispatches on), if there is one."""
        for arm in arms:
            for base in [arm, *self.bases(arm)]:
                cls = self.classes.get(base)
                if cls is None:
                    continue
                for fn in cls.body:
                    if isinstance(fn, ast.FunctionDef) and fn.name == "from_dict":
                        for stmt in ast.walk(fn):
                            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Dict) and any(
                                    isinstance(t, ast.Name) and t.id == "config_classes" for t in stmt.targets):
                                return [k.value for k in stmt.value.keys if isinstance(k, ast.Constant)]
        return None

    # An annotation's meaning: (literal/enum values, nested model classes, capture-safe, opaque)
    def analyze(self, node: ast.expr, seen=()) -> tuple[list, list, bool, bool]:
        if isinstance(node, ast.Constant) and node.value is None:
            return [], [], True, False
        if isinstance(node, ast.Name) or isinstance(node, ast.Attribute):
            name = ast.unparse(node).rsplit(".", 1)[-1]
            if name in SCALARS or name == "None":
                return [], [], True, False
            if name in self.aliases and name not in seen:
                return self.analyze(self.aliases[name], seen + (name,))
            if self.is_model(name):
                return [], [name], True, False
            if self.is_enum(name):
                return self.enum_values(name), [], True, False
            # str, Path, object, dict or a class defined elsewhere (LoraConfig, a tokenizer): keys below it are not
            # TensorRT-LLM's business to refuse here
            return [], [], False, name not in ("str", "Path")
        if isinstance(node, ast.Subscript):
            head = ast.unparse(node.value).rsplit(".", 1)[-1]
            args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if head == "Literal":
                return [a.value for a in args if isinstance(a, ast.Constant)], [], True, False
            if head == "Annotated":
                return self.analyze(args[0], seen)
            if head in ("Dict", "dict", "Mapping"):
                return [], [], False, True
            values, models, safe, opaque = [], [], True, False
            for a in args:
                v, m, s, o = self.analyze(a, seen)
                values += v
                models += m
                safe = safe and s
                opaque = opaque or o
            return values, models, safe, opaque
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # X | Y
            a = self.analyze(node.left, seen)
            b = self.analyze(node.right, seen)
            return a[0] + b[0], a[1] + b[1], a[2] and b[2], a[3] or b[3]
        return [], [], False, True

    def walk(self, name: str, prefix: str, stack=()) -> None:
        for fname, node in self.model_fields(name).items():
            ann = node.annotation
            path = f"{prefix}.{fname}" if prefix else fname
            values, models, safe, opaque = self.analyze(ann)
            unwrapped = ast.unparse(ann)
            kind = "categorical" if values and not models and _is_choice(ann) else "value"
            flags = [] if safe else ["uncapturable"]
            if models:
                # a section: its own row says so; the leaves below are the options
                self.fields[path] = field(unwrapped, "section", [], flags=flags + (["opaque"] if opaque else []))
                if opaque:
                    self.opaque.add(path)
                arms = [m for m in models if m not in stack]
                dispatch = self.dispatch_keys(arms) if len(arms) > 1 else None
                if len(arms) > 1:
                    tags = dispatch or sorted({v for m in arms if (v := self.classvar(m, "decoding_type"))})
                    if tags:
                        self.fields[f"{path}.decoding_type"] = field("dispatch key", "categorical", tags)
                for m in arms:
                    self.walk(m, path, stack + (name,))
                continue
            self.fields[path] = field(unwrapped, kind, values, flags=flags + (["opaque"] if opaque else []))
            default = _literal_default(node.value)
            if default is not NO_DEFAULT:
                self.fields[path]["default"] = default
            bounds = _bounds([node.value]) if isinstance(node.value, ast.Call) else {}
            if bounds:
                self.fields[path]["bounds"] = bounds
            if opaque:
                self.opaque.add(path)

    def read(self) -> dict[str, dict]:
        if "TorchLlmArgs" not in self.classes:
            raise SourceError("llm_args.py: no class TorchLlmArgs")
        self.walk("TorchLlmArgs", "")
        return self.fields


def _is_choice(ann: ast.expr) -> bool:
    """Literal or Enum after Optional is unwrapped (TensorRT-LLM's derive_kind); a List of Literal is a value."""
    text = ast.unparse(ann)
    return not re.match(r"(Optional\[)?(List|Set|Tuple|list|set|tuple)\[", text)


# --- value kinds -------------------------------------------------------------------------------------------------

# Pydantic's constrained aliases as llm_args.py writes them: name -> the kind and bound they stand for.
CONSTRAINED = {"PositiveInt": ("int", {"ge": 1}), "NonNegativeInt": ("int", {"ge": 0}),
               "PositiveFloat": ("float", {"gt": 0}), "NonNegativeFloat": ("float", {"ge": 0}),
               "StrictInt": ("int", {}), "StrictBool": ("bool", {}), "StrictStr": ("str", {}),
               "StrictFloat": ("float", {})}
PLAIN = {"int": "int", "float": "float", "bool": "bool", "str": "str", "Path": "str"}
LISTS = {"List", "list", "Set", "set", "Tuple", "tuple", "Sequence"}
DICTS = {"Dict", "dict", "Mapping"}


def value_kind(entry: dict) -> dict | None:
    """The kind of value an option takes, from its annotation (and, for a manifest's categorical row, its allowed
    values): {"type": int|float|bool|str|enum|list|dict|model|union|any, "optional": null allowed, "ge"/"gt"/"le"/"lt":
    bounds, "values": an enum's (with "open": the values are a telemetry allow-list, not the validator's set),
    "items": a list's kind, "of": a union's kinds}. None where the source gives no annotation (tk's hand tables)."""
    text = entry.get("annotation", "")
    if entry["kind"] == "section":
        return {"type": "model", **({"optional": True} if re.match(r"Optional\[|.*\bNone\b", text) else {})}
    if entry["kind"] == "categorical" and entry.get("converter") == "allowlist":
        return {"type": "enum", "values": list(entry.get("allowed", ())), "open": True}
    if not text:
        return {"type": "enum", "values": list(entry["allowed"])} if entry.get("allowed") else None
    text = re.sub(r"<(?:class|enum) '([\w.]+)'>", r"\1", text).replace("typing.", "")
    try:
        out = _kind(ast.parse(text, mode="eval").body)
    except SyntaxError:  # "dispatch key": speculative_config's decoding_type tag
        out = {"type": "any"}
    if entry["kind"] == "categorical" and entry.get("allowed"):
        # the row's allowed values are the field's (every arm of a union, an Enum's members), the annotation's
        # Literal may be one arm's
        values = {"type": "enum", "values": list(entry["allowed"])}
        if out.get("type") == "list":
            return {**out, "items": values}
        return {**values, **({"optional": True} if out.get("optional") else {})}
    return out


def _kind(node: ast.expr) -> dict:
    if isinstance(node, ast.Constant) and node.value is None:
        return {"type": "null"}
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = ast.unparse(node).rsplit(".", 1)[-1]
        if name in CONSTRAINED:
            kind, bounds = CONSTRAINED[name]
            return {"type": kind, **bounds}
        if name in ("None", "NoneType"):
            return {"type": "null"}
        return {"type": PLAIN.get(name, "dict" if name in DICTS else "any")}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union([node.left, node.right])
    if not isinstance(node, ast.Subscript):
        return {"type": "any"}
    head = ast.unparse(node.value).rsplit(".", 1)[-1]
    args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    if head == "Optional":
        return {**_kind(args[0]), "optional": True}
    if head == "Union":
        return _union(args)
    if head == "Literal":
        return {"type": "enum", "values": [str(a.value) for a in args if isinstance(a, ast.Constant)]}
    if head == "Annotated":
        return {**_kind(args[0]), **_bounds(args[1:])}
    if head in LISTS:
        return {"type": "list", "items": _kind(args[0])}
    if head in DICTS:
        return {"type": "dict"}
    return {"type": "any"}


def _union(arms: list) -> dict:
    kinds = [_kind(a) for a in arms]
    optional = any(k["type"] == "null" or k.get("optional") for k in kinds)
    kinds = [{k: v for k, v in kd.items() if k != "optional"} for kd in kinds if kd["type"] != "null"]
    if any(k["type"] == "any" for k in kinds):
        out = {"type": "any"}
    elif len(kinds) == 1:
        out = kinds[0]
    elif {k["type"] for k in kinds} == {"str"}:
        out = {"type": "str"}
    else:
        out = {"type": "union", "of": kinds}
    return {**out, "optional": True} if optional else out


def _bounds(metadata: list) -> dict:
    """Gt(gt=0), Ge(ge=0), Lt/Le as pydantic prints them in an Annotated (or Field(gt=...) keywords)."""
    out = {}
    for meta in metadata:
        for kw in getattr(meta, "keywords", ()):
            if kw.arg in ("gt", "ge", "lt", "le") and isinstance(kw.value, ast.Constant):
                out[kw.arg] = kw.value.value
    return out


def _literal_default(call: ast.expr | None):
    """A field's default where llm_args.py writes it as a literal (``= 5`` or ``Field(default=5, ...)``); else a
    marker that there is none to record (a default_factory, a computed value, no default)."""
    if call is None:
        return NO_DEFAULT
    if isinstance(call, ast.Call) and ast.unparse(call.func).rsplit(".", 1)[-1] == "Field":
        for kw in call.keywords:
            if kw.arg == "default":
                call = kw.value
                break
        else:
            return NO_DEFAULT
    try:
        return ast.literal_eval(call)
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return NO_DEFAULT


NO_DEFAULT = object()


# --- environment and proxy ------------------------------------------------------------------------------------------

ENV_CALL = re.compile(r'(?:getenv|get\w*Env|get\w*FromEnv)\(\s*"([A-Za-z_][A-Za-z0-9_]*)"')


def read_envutils(text: str) -> list[str]:
    return sorted(set(ENV_CALL.findall(text)))


def read_envs_registry(text: str) -> list[str]:
    for node in ast.parse(text).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "ENV_SPECS" and isinstance(node.value, ast.Dict):
            return sorted(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    raise SourceError("envs.py: no ENV_SPECS")


def read_disagg_utils(text: str) -> dict:
    tree = ast.parse(text)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def params(fn: str, skip=()) -> list[str]:
        f = funcs.get(fn)
        if f is None:
            raise SourceError(f"disagg_utils.py: no {fn}")
        return [a.arg for a in f.args.args if a.arg not in skip]

    def dataclass_fields(cls: str) -> list[str]:
        c = classes.get(cls)
        if c is None:
            raise SourceError(f"disagg_utils.py: no {cls}")
        return [n.target.id for n in c.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]

    copied = []
    for stmt in ast.walk(funcs.get("extract_router_config", ast.Module(body=[], type_ignores=[]))):
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.List) and any(
                isinstance(t, ast.Name) and t.id == "extract_keys" for t in stmt.targets):
            copied = [e.value for e in stmt.value.elts if isinstance(e, ast.Constant)]
    return {"top": params("extract_disagg_cfg"), "server": params("extract_ctx_gen_cfgs", skip=("type",)) + ["router"],
            "cluster": dataclass_fields("DisaggClusterConfig"), "router_copied": copied}


def read_router_types(text: str) -> list[str]:
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "router_map" for t in node.targets) \
                and isinstance(node.value, ast.Dict):
            return [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
    raise SourceError("router.py: no router_map")


# --- assembly ------------------------------------------------------------------------------------------------------

DERIVED = ("value", "default_from", "evidence", "resolves")  # what generate() adds to a field read from a file


def hand_fields(snap: dict, by_id: dict) -> dict[str, dict]:
    out = {p: _raw(e) for p, e in by_id[snap["base"]]["fields"].items()} if snap.get("base") else {}
    for section, names in (snap.get("fields") or {}).items():
        if section:
            out.setdefault(section, field("", "section", []))
        for name in names:
            out[f"{section}.{name}" if section else name] = field("", "value", [])
    for path, values in (snap.get("categorical") or {}).items():
        out[path] = field("", "categorical", values)
    return out


def _raw(entry: dict) -> dict:
    """A field as its source gave it, without what generate() derived (for a base snapshot or a reused record)."""
    out = {k: v for k, v in entry.items() if k not in DERIVED and k != "annotation_from"}
    if entry.get("default_from") == "supplement":
        out.pop("default", None)
    if entry.get("annotation_from"):
        out["annotation"] = ""
    return out


class Reader:
    """Reads the pinned files from DIR/<commit>/<path>; with ``previous`` (the committed data file), a file DIR lacks is
    taken from the record generated from the same commit, so adding a release needs only its own new files."""

    def __init__(self, root: Path, previous: dict | None):
        self.root, self.previous, self.reused = root, previous, []

    def has(self, commit: str, path: str) -> bool:
        return (self.root / commit / path).is_file()

    def text(self, commit: str, path: str) -> str:
        return read_source(self.root, commit, path)

    def snapshot(self, snap: dict) -> dict[str, dict] | None:
        """The raw fields of a snapshot read earlier from the same file at the same commit, if reuse is on."""
        if self.previous is None or self.has(snap["commit"], snap["path"]):
            return None
        for old in self.previous.get("snapshots", ()):
            if old["id"] == snap["id"] and (old.get("source") or {}).get("commit") == snap["commit"]:
                self.reused.append(f"{snap['path']} @ {snap['commit'][:12]}")
                return {p: _raw(e) for p, e in old["fields"].items() if "supplement" not in e.get("flags", ())
                        and "carried" not in e.get("flags", ())}
        return None

    def source_names(self, kind: str, commit: str, path: str) -> list[str] | None:
        if self.previous is None or self.has(commit, path):
            return None
        for sides in self.previous.get("env", {}).values():
            for side in sides.values():
                for src in side.get("sources", ()):
                    if (src.get("kind"), src.get("commit"), src.get("path")) != (kind, commit, path):
                        continue
                    if "names" in src or len(side["sources"]) == 1:  # a side of one source has its names
                        self.reused.append(f"{path} @ {commit[:12]}")
                        return list(src.get("names", side["names"]))
        return None

    def proxy(self, block: dict) -> dict | None:
        rf = block["routers_from"]
        if self.previous is None or (self.has(block["commit"], block["path"]) and self.has(rf["commit"], rf["path"])):
            return None
        for old in self.previous.get("proxy", {}).values():
            commits = [src.get("commit") for src in old.get("sources", ())]
            if commits == [block["commit"], rf["commit"]]:
                self.reused.append(f"{block['path']} @ {block['commit'][:12]}")
                return {k: old[k] for k in ("top", "server", "cluster", "router_copied", "routers")}
        return None


def snapshot_fields(snap: dict, reader: Reader, by_id: dict, snapshots: list, last_complete: dict | None) -> dict:
    kind = snap["kind"]
    if kind == "hand":
        return hand_fields(snap, by_id)
    fields = reader.snapshot(snap)
    if kind == "llm_args":
        return fields if fields is not None else LlmArgsReader(reader.text(snap["commit"], snap["path"])).read()
    if kind != "manifest":
        raise SourceError(f"snapshot {snap['id']}: unknown kind {kind}")
    if fields is None:
        fields = read_manifest(reader.text(snap["commit"], snap["path"]))
    for s in sorted({p.rsplit(".", 1)[0] for p in fields if "." in p}):  # every prefix of a captured path
        parts = s.split(".")
        for i in range(1, len(parts) + 1):
            fields.setdefault(".".join(parts[:i]), field("", "section", []))
    if last_complete is not None:
        carry_uncapturable(fields, snapshots, last_complete)
    return fields


def carry_uncapturable(fields: dict, snapshots: list, last_complete: dict) -> None:
    """Fields the manifest cannot capture (str/Path/dict/Any), carried from the newest complete llm_args.py."""
    captured_before = {p for s in snapshots if s["kind"] == "manifest" for p, e in s["fields"].items()
                       if "carried" not in e.get("flags", [])}
    for path, entry in last_complete["fields"].items():
        mine = fields.get(path)
        if mine is not None and mine["kind"] == entry["kind"] == "section" and not mine.get("annotation"):
            mine["annotation"] = entry["annotation"]  # the manifest lists no section's type: whether it may be null
            mine["annotation_from"] = last_complete["id"]
        if path in fields or path in captured_before:  # an earlier manifest captured it: its absence here is news,
            continue                                     # not a blind spot
        flags = set(entry.get("flags", []))
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        if "uncapturable" in flags and (not parent or parent in fields):
            fields[path] = {**_raw(entry), "flags": sorted(flags | {"carried"}), "carried_from": last_complete["id"]}


def read_snapshots(sources: dict, reader: Reader) -> list[dict]:
    snapshots: list[dict] = []
    by_id: dict[str, dict] = {}
    last_complete: dict | None = None
    for snap in sources["snapshots"]:
        record = {k: snap[k] for k in ("id", "line", "kind", "first_release", "last_release", "note") if k in snap}
        if snap.get("basis") not in BASES:
            raise ValueError(f"snapshot {snap['id']}: basis must be one of {', '.join(BASES)}, not "
                             f"{snap.get('basis')!r} (does a file of its releases give its fields?)")
        record["basis"] = snap["basis"]
        if snap.get("commit"):
            record["source"] = {"repo": sources["repo"], "path": snap["path"], "commit": snap["commit"]}
        record["complete_sections"] = (snap.get("complete_sections", []) if snap["kind"] == "hand" else
                                       ["*"] if snap.get("complete") else [])
        record["fields"] = snapshot_fields(snap, reader, by_id, snapshots, last_complete)
        snapshots.append(record)
        by_id[snap["id"]] = record
        if snap["kind"] == "llm_args" and snap.get("complete"):
            last_complete = record
    return snapshots


def apply_kinds(snapshots: list[dict]) -> None:
    for snap in snapshots:
        for entry in snap["fields"].values():
            kind = value_kind(entry)
            if kind is not None:
                entry["value"] = {**kind, **entry.get("bounds", {})}


def apply_supplements(snapshots: list[dict], supplements: list[dict]) -> None:
    """The sources file's evidence for what a snapshot's file is silent on: a field it cannot list (``annotation``),
    a validator's bounds (``value``), a closed set of accepted values (``values``), a default (``default``)."""
    by_id = {s["id"]: s for s in snapshots}
    for sup in supplements:
        ids = [s["id"] for s in snapshots] if sup["snapshots"] == "*" else sup["snapshots"]
        evidence = " ".join(str(sup["evidence"]).split())
        for sid in ids:
            if sid not in by_id:
                raise SourceError(f"supplement {sup['path']}: no snapshot {sid}")
            fields = by_id[sid]["fields"]
            entry = fields.get(sup["path"])
            if entry is None:
                if "annotation" not in sup:
                    continue  # a bound or default for a field this snapshot does not have
                entry = fields[sup["path"]] = field(sup["annotation"], "value", [], flags=["supplement"])
                entry["value"] = value_kind(entry) or {"type": "any"}
            _supplement(entry, sup, evidence)


def _supplement(entry: dict, sup: dict, evidence: str) -> None:
    if "value" in sup:
        entry["value"] = {**entry.get("value", {}), **sup["value"]}
    if "values" in sup:
        entry["value"] = {"type": "enum", "values": [str(v) for v in sup["values"]],
                          **({"optional": True} if entry.get("value", {}).get("optional") else {})}
    if "default" in sup:
        entry["default"], entry["default_from"] = sup["default"], "supplement"
    if "resolves" in sup:  # what the default (or a value such as 'auto') selects at start-up
        entry["resolves"] = sup["resolves"]
    entry["evidence"] = sorted(set(entry.get("evidence", [])) | {evidence})


def read_env(sources: dict, reader: Reader) -> dict:
    env: dict = {}
    for block in sources.get("env", []):
        if block["kind"] == "hand":
            names, src = block["names"], {"kind": "hand", "note": " ".join(block["note"].split())}
        else:
            names = reader.source_names(block["kind"], block["commit"], block["path"])
            if names is None:
                text = reader.text(block["commit"], block["path"])
                names = read_envutils(text) if block["kind"] == "envutils" else read_envs_registry(text)
            src = {"kind": block["kind"], "repo": sources["repo"], "path": block["path"], "commit": block["commit"],
                   "names": sorted(names)}
        for line in block["lines"]:
            side = env.setdefault(line, {}).setdefault(block["side"], {"names": [], "sources": []})
            side["names"] = sorted(set(side["names"]) | set(names))
            side["sources"].append(src)
    return env


def read_proxy(sources: dict, reader: Reader) -> dict:
    proxy = {}
    for block in sources.get("proxy", []):
        if block["kind"] == "hand":
            for line in block["lines"]:
                proxy[line] = {"top": sorted(set(block["top"]) | set(block.get("top_by_line", {}).get(line, []))),
                               "server": block["server"], "cluster": block["cluster"], "routers": block["routers"],
                               "router_copied": block["router_copied"],
                               "sources": [{"kind": "hand", "note": block["note"]}]}
            continue
        rf = block["routers_from"]
        parsed = reader.proxy(block)
        if parsed is None:
            parsed = {**read_disagg_utils(reader.text(block["commit"], block["path"])),
                      "routers": read_router_types(reader.text(rf["commit"], rf["path"]))}
        for line in block["lines"]:
            proxy[line] = {**parsed, "sources": [
                {"kind": "disagg_utils", "repo": sources["repo"], "path": block["path"], "commit": block["commit"]},
                {"kind": "router", "repo": sources["repo"], "path": rf["path"], "commit": rf["commit"]}]}
    return proxy


LINE_KEYS = ("line", "release", "releases", "prerelease", "nixl_transports", "cluster_storages", "mtp_kv_layers",
             "internal_port_envs", "serve_config_flag", "proxy_metadata_flag", "notes", "changes")
OWN_KEYS = ("notes", "changes")  # a row's own, never its base's


def read_lines(sources: dict, snapshots: list[dict]) -> list[dict]:
    """The release lines' rows, each complete (``base``: the row it repeats, then overrides)."""
    rows: dict[str, dict] = {}
    for row in sources.get("lines", []):
        merged = {**rows[row["base"]], **{k: [] for k in OWN_KEYS}} if row.get("base") else {"changes": []}
        merged.update({k: v for k, v in row.items() if k != "base"})
        unknown = set(merged) - set(LINE_KEYS)
        if unknown or set(LINE_KEYS) - set(merged):
            raise SourceError(f"line {row.get('line')}: unknown keys {sorted(unknown)} or missing "
                              f"{sorted(set(LINE_KEYS) - set(merged))}")
        for key in OWN_KEYS:
            merged[key] = [" ".join(str(n).split()) for n in merged[key]]
        rows[row["line"]] = merged
    known = {s["line"] for s in snapshots}
    for line in rows:
        if not any(_line_key(s) <= _line_key(line) for s in known):
            raise SourceError(f"line {line}: no snapshot of it or of an earlier line speaks for it")
    return list(rows.values())


def _line_key(line: str) -> tuple[int, ...]:
    return tuple(int(p) for p in line.split("."))


def generate(sources: dict, root: Path, previous: dict | None = None) -> dict:
    reader = Reader(root, previous)
    snapshots = read_snapshots(sources, reader)
    apply_kinds(snapshots)
    apply_supplements(snapshots, sources.get("supplements", []))
    data = {
        "format": 2,
        "generated_by": "scripts/trtllm_facts.py from scripts/trtllm_sources.yaml",
        "repo": sources["repo"],
        "snapshots": snapshots,
        "renames": [{k: str(v) for k, v in r.items()} for r in sources.get("renames", [])],
        "env": read_env(sources, reader),
        "proxy": read_proxy(sources, reader),
        "lines": read_lines(sources, snapshots),
        "releases": [{k: str(v) for k, v in r.items()} for r in sources.get("releases", [])],
    }
    if reader.reused:
        print("reused from the committed data (same commit): " + ", ".join(sorted(set(reader.reused))),
              file=sys.stderr)
    return data


def summary(data: dict) -> str:
    lines = []
    for snap in data["snapshots"]:
        fields = snap["fields"]
        leaves = [p for p, e in fields.items() if e["kind"] != "section"]
        lines.append(f"{snap['id']:<22} line {snap['line']}  {len(leaves):4d} options "
                     f"({sum('carried' in e.get('flags', []) for e in fields.values())} carried)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-dir", type=Path, help="downloaded files, as DIR/<commit>/<path>")
    src.add_argument("--download", action="store_true", help="fetch every file from GitHub at its commit first")
    ap.add_argument("--check", action="store_true", help="compare with the committed data file instead of writing")
    ap.add_argument("--reuse", action="store_true",
                    help="a file DIR lacks: take its facts from the committed data file, generated from the same commit")
    ap.add_argument("--sources", type=Path, default=SOURCES)
    ap.add_argument("--output", type=Path, default=OUTPUT)
    args = ap.parse_args(argv)
    sources = yaml.safe_load(args.sources.read_text())
    try:
        previous = json.loads(args.output.read_text()) if args.reuse and args.output.exists() else None
        if args.download:
            with tempfile.TemporaryDirectory() as tmp:
                download(sources, Path(tmp))
                data = generate(sources, Path(tmp), previous)
        else:
            data = generate(sources, args.from_dir, previous)
    except (SourceError, OSError, SyntaxError, ValueError, KeyError) as exc:
        print(f"trtllm_facts: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            diff = difflib.unified_diff(current.splitlines(), text.splitlines(), "committed", "generated", n=1,
                                        lineterm="")
            print("\n".join(list(diff)[:80]))
            return 1
        print("up to date")
        return 0
    tmp = args.output.with_suffix(".json.tmp")
    tmp.write_text(text)
    tmp.replace(args.output)
    print(summary(data))
    print(f"wrote {args.output.relative_to(ROOT) if args.output.is_relative_to(ROOT) else args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
