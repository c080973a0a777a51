#!/usr/bin/env python3
"""Derive tk's regression corpus from NVIDIA/srt-slurm's TensorRT-LLM recipes: a compact JSON of the key paths and
values each recipe uses (tests/fixtures/corpus/srt_slurm_trtllm.json), read from a git checkout at one commit.
The recipes themselves are not copied: the fixture keeps what tk import reads (model, resources, the per-role
TensorRT-LLM options and environment, benchmark lengths, srtctl settings) and the names of the sections it
does not carry.

    python scripts/derive_corpus.py GIT_DIR [--commit C88EF73...]

GIT_DIR: a clone (or the bare snapshot) of https://github.com/NVIDIA/srt-slurm. Standard library and PyYAML only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "corpus" / "srt_slurm_trtllm.json"
CARRIED = {"name", "model", "resources", "backend", "benchmark", "frontend", "sbatch_directives", "srun_options",
           "identity"}


def git(gitdir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={gitdir}", *args], check=True, capture_output=True, text=True).stdout


def flatten(d: dict, prefix: str = "") -> list:
    out = []
    for k, v in d.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out += flatten(v, path)
        else:
            out.append((path, v))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("gitdir")
    ap.add_argument("--commit", default="HEAD")
    args = ap.parse_args(argv)
    commit = git(args.gitdir, "rev-parse", args.commit).strip()
    date = git(args.gitdir, "show", "-s", "--format=%cs", commit).strip()
    files = [f for f in git(args.gitdir, "ls-tree", "-r", "--name-only", commit).split("\n")
             if f.startswith(("recipes/", "examples/")) and f.endswith((".yaml", ".yml"))]
    paths: list[str] = []
    leaves: list[list] = []
    index: dict[str, int] = {}
    envs: list[dict] = []
    recipes = []

    def leaf(path: str, value) -> int:
        if path not in paths:
            paths.append(path)
        key = json.dumps([path, value], sort_keys=True)
        if key not in index:
            index[key] = len(leaves)
            leaves.append([paths.index(path), value])
        return index[key]

    def env_id(env: dict) -> int:
        if env not in envs:
            envs.append(env)
        return envs.index(env)

    for f in sorted(files):
        try:
            doc = yaml.safe_load(git(args.gitdir, "show", f"{commit}:{f}"))
        except yaml.YAMLError:
            continue
        backend = doc.get("backend") if isinstance(doc, dict) else None
        if not isinstance(backend, dict) or backend.get("type") != "trtllm":
            continue
        configs = backend.get("trtllm_config") or {}
        rec = {"file": f, "name": doc.get("name"), "model": doc.get("model"), "resources": doc.get("resources"),
               "roles": {role: [leaf(p, v) for p, v in flatten(cfg)] for role, cfg in configs.items()
                         if isinstance(cfg, dict)},
               "env": {k.removesuffix("_environment"): env_id(v) for k, v in backend.items()
                       if k.endswith("_environment") and isinstance(v, dict)},
               "backend_settings": {k: v for k, v in backend.items()
                                    if k not in ("type", "trtllm_config") and not k.endswith("_environment")},
               # tk import reads isl/osl; the rest of srtctl's benchmark only by name (it lists them as not carried)
               "benchmark": {k: (v if k in ("isl", "osl") else None) for k, v in (doc.get("benchmark") or {}).items()},
               "frontend": (doc.get("frontend") or {}).get("type"),
               "sbatch_directives": doc.get("sbatch_directives"), "srun_options": doc.get("srun_options"),
               "identity": doc.get("identity"),
               "other_sections": sorted(k for k in doc if k not in CARRIED)}
        recipes.append({k: v for k, v in rec.items() if v not in (None, {}, [])})
    out = {"source": {"repo": "NVIDIA/srt-slurm", "commit": commit, "date": date,
                      "selection": "recipes/ and examples/ YAML files whose backend.type is trtllm",
                      "derived_by": "scripts/derive_corpus.py"},
           "paths": paths, "leaves": leaves, "envs": envs, "recipes": recipes}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, separators=(",", ":"), sort_keys=True) + "\n")
    print(f"{len(recipes)} recipes, {len(leaves)} distinct option values, {len(envs)} environments -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
