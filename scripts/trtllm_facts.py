#!/usr/bin/env python3
"""Generate toolkit/facts/trtllm_data.json from TensorRT-LLM's own files (listed in scripts/trtllm_sources.yaml).

    python scripts/trtllm_facts.py --download            # fetch each file at its commit from GitHub, then generate
    python scripts/trtllm_facts.py --from-dir DIR         # files already downloaded, as DIR/<commit>/<path>
    python scripts/trtllm_facts.py --from-dir DIR --check # exit 1 if the committed data file differs

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

    def model_fields(self, name: str, seen=()) -> dict[str, ast.expr]:
        """Fields in MRO order (bases first; a subclass's annotation overrides), ClassVar and private excluded."""
        out: dict[str, ast.expr] = {}
        for base in self.bases(name):
            if base in self.classes and base not in seen:
                out.update(self.model_fields(base, seen + (name,)))
        for node in self.classes[name].body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                fname = node.target.id
                if fname.startswith("_") or ast.unparse(node.annotation).startswith("ClassVar"):
                    continue
                out[fname] = node.annotation
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
        for fname, ann in self.model_fields(name).items():
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

def hand_fields(snap: dict, by_id: dict) -> dict[str, dict]:
    out = dict(by_id[snap["base"]]["fields"]) if snap.get("base") else {}
    for section, names in (snap.get("fields") or {}).items():
        if section:
            out.setdefault(section, field("", "section", []))
        for name in names:
            out[f"{section}.{name}" if section else name] = field("", "value", [])
    for path, values in (snap.get("categorical") or {}).items():
        out[path] = field("", "categorical", values)
    return out


def generate(sources: dict, root: Path) -> dict:
    snapshots, by_id = [], {}
    last_complete: dict | None = None
    for snap in sources["snapshots"]:
        kind = snap["kind"]
        record = {k: snap[k] for k in ("id", "line", "kind", "first_release", "last_release", "note") if k in snap}
        if snap.get("commit"):
            record["source"] = {"repo": sources["repo"], "path": snap["path"], "commit": snap["commit"]}
        if kind == "hand":
            fields = hand_fields(snap, by_id)
            record["complete_sections"] = snap.get("complete_sections", [])
        elif kind == "llm_args":
            reader = LlmArgsReader(read_source(root, snap["commit"], snap["path"]))
            fields = reader.read()
            record["complete_sections"] = ["*"] if snap.get("complete") else []
        elif kind == "manifest":
            fields = read_manifest(read_source(root, snap["commit"], snap["path"]))
            sections = {p.rsplit(".", 1)[0] for p in fields if "." in p}
            for s in sorted(sections):  # every prefix of a captured path is a section
                parts = s.split(".")
                for i in range(1, len(parts) + 1):
                    fields.setdefault(".".join(parts[:i]), field("", "section", []))
            if last_complete is not None:  # fields the manifest cannot capture, from the newest complete llm_args.py
                captured_before = {p for s in snapshots if s["kind"] == "manifest" for p, e in s["fields"].items()
                                   if "carried" not in e.get("flags", [])}
                for path, entry in last_complete["fields"].items():
                    if path in fields or path in captured_before:  # an earlier manifest captured it: its absence
                        continue                                     # here is news, not a blind spot
                    flags = set(entry.get("flags", []))
                    parent = path.rsplit(".", 1)[0] if "." in path else ""
                    if "uncapturable" in flags and (not parent or parent in fields):
                        fields[path] = {**entry, "flags": sorted(flags | {"carried"}),
                                        "carried_from": last_complete["id"]}
            record["complete_sections"] = []
        else:
            raise SourceError(f"snapshot {snap['id']}: unknown kind {kind}")
        record["fields"] = fields
        snapshots.append(record)
        by_id[snap["id"]] = record
        if kind == "llm_args" and snap.get("complete"):
            last_complete = record
    for sup in sources.get("supplements", []):
        for sid in sup["snapshots"]:
            by_id[sid]["fields"][sup["path"]] = {**field(sup["annotation"], "value", [], flags=["supplement"]),
                                                 "evidence": " ".join(sup["evidence"].split())}
    env = {}
    for block in sources.get("env", []):
        if block["kind"] == "hand":
            names, src = block["names"], {"kind": "hand", "note": " ".join(block["note"].split())}
        else:
            text = read_source(root, block["commit"], block["path"])
            names = read_envutils(text) if block["kind"] == "envutils" else read_envs_registry(text)
            src = {"kind": block["kind"], "repo": sources["repo"], "path": block["path"], "commit": block["commit"]}
        for line in block["lines"]:
            side = env.setdefault(line, {}).setdefault(block["side"], {"names": [], "sources": []})
            side["names"] = sorted(set(side["names"]) | set(names))
            side["sources"].append(src)
    proxy = {}
    for block in sources.get("proxy", []):
        if block["kind"] == "hand":
            for line in block["lines"]:
                proxy[line] = {"top": sorted(set(block["top"]) | set(block.get("top_by_line", {}).get(line, []))),
                               "server": block["server"], "cluster": block["cluster"], "routers": block["routers"],
                               "router_copied": block["router_copied"],
                               "sources": [{"kind": "hand", "note": block["note"]}]}
        else:
            parsed = read_disagg_utils(read_source(root, block["commit"], block["path"]))
            rf = block["routers_from"]
            routers = read_router_types(read_source(root, rf["commit"], rf["path"]))
            for line in block["lines"]:
                proxy[line] = {**parsed, "routers": routers, "sources": [
                    {"kind": "disagg_utils", "repo": sources["repo"], "path": block["path"], "commit": block["commit"]},
                    {"kind": "router", "repo": sources["repo"], "path": rf["path"], "commit": rf["commit"]}]}
    renames = [{k: str(v) for k, v in r.items()} for r in sources.get("renames", [])]
    return {
        "format": 1,
        "generated_by": "scripts/trtllm_facts.py from scripts/trtllm_sources.yaml",
        "repo": sources["repo"],
        "snapshots": snapshots,
        "renames": renames,
        "env": env,
        "proxy": proxy,
    }


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
    ap.add_argument("--sources", type=Path, default=SOURCES)
    ap.add_argument("--output", type=Path, default=OUTPUT)
    args = ap.parse_args(argv)
    sources = yaml.safe_load(args.sources.read_text())
    try:
        if args.download:
            with tempfile.TemporaryDirectory() as tmp:
                download(sources, Path(tmp))
                data = generate(sources, Path(tmp))
        else:
            data = generate(sources, args.from_dir)
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
