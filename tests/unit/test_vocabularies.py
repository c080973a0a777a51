"""Spec: every vocabulary (role, component kind, restart policy, router, transport, bench verdict and stage, the
facts' verdict) is one Enum, defined once; the command line's choices are derived from it, and no copy of its words
remains in the tree."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import click
import pytest

from orchestrator.spec import JobSpec, SpecError
from orchestrator.states import ComponentKind, RestartPolicy, Role
from tests.unit.helpers import parsed, tk_in_process
from toolkit.bench.verdict import Outcome, Stage
from toolkit.facts.hardware import TRANSPORT_PROFILES, Transport
from toolkit.facts import llm_args
from toolkit.facts.trtllm import Router

ROOT = Path(__file__).resolve().parents[2]
VOCABULARIES = (Role, ComponentKind, RestartPolicy, Router, Transport, Stage, llm_args.Verdict)
# Words that are another format's own, equal to tk's by coincidence: (file, the name they are assigned to, why).
NOT_COPIES = {("toolkit/importer/trtllm_bench.py", "ROLES"): "the worker_config keys of TensorRT-LLM's benchmark "
              "config.yaml (ctx, gen), mapped to tk's recipe sections"}


def _option(command: str, name: str) -> click.Parameter:
    from toolkit.cli import cli

    return next(p for p in cli.commands[command].params if p.name == name)


def test_the_command_line_choices_are_the_vocabularies():
    from toolkit.importer import KINDS

    assert list(_option("logs", "role").type.choices) == [r.value for r in Role]
    assert list(_option("size", "transport").type.choices) == list(TRANSPORT_PROFILES) == [t.value for t in Transport]
    assert list(_option("import", "kind").type.choices) == list(KINDS)


@pytest.mark.parametrize("role", ["agg", "etcd"])
def test_logs_takes_every_role_a_run_has(role, tmp_path):
    # before: "Invalid value for '--role'" (the choices were ctx, gen, proxy); now the run is looked up
    proc = tk_in_process("logs", "--role", role, "no-such-run", cwd=tmp_path, env={"TK_RUNS_DIR": str(tmp_path)})
    assert "Invalid value for '--role'" not in proc.stderr and "no-such-run" in proc.stderr


def test_import_refuses_a_format_it_does_not_have_naming_them(tmp_path):
    proc = tk_in_process("import", str(tmp_path / "x.yaml"), "--kind", "slurmish")
    assert proc.returncode == 2 and "srt-slurm" in proc.stderr and "trtllm-disagg" in proc.stderr


def test_a_word_is_its_text_in_comparisons_dicts_json_and_messages():
    assert Role.CTX == "ctx" and {"ctx": 1}[Role.CTX] == 1 and {Role.GEN: 2}["gen"] == 2
    assert json.dumps({Role.AGG: [ComponentKind.ETCD, RestartPolicy.FAIL_FAST]}) == '{"agg": ["etcd", "fail-fast"]}'
    assert f"{Role.PROXY} {Transport.TCP} {Router.CONVERSATION} {Stage.SLA}" == "proxy tcp conversation sla"
    assert json.dumps({"exit_code": Outcome.SLA_MISSED}) == '{"exit_code": 1}' and Outcome.INVALID == 2
    assert tuple(r.value for r in Router) == llm_args.all_routers()  # the routers are the data's


def test_job_json_reads_back_as_the_vocabularies_and_names_them_when_it_is_wrong():
    from tests.unit.helpers import plan_of
    from toolkit.render.job import job_spec

    doc = json.loads(job_spec(plan_of()).to_json())
    spec = JobSpec.from_dict(doc)
    assert spec.supervision.policy is RestartPolicy.RESTART and {c.kind for c in spec.components} == {
        ComponentKind.WORKER, ComponentKind.PROXY}
    assert {c.role for c in spec.components} == {Role.CTX, Role.GEN, Role.PROXY}
    doc["components"][0]["kind"] = "server"
    with pytest.raises(SpecError, match="kind: 'server' is not one of worker, proxy, etcd"):
        JobSpec.from_dict(doc)


def test_every_rdma_transport_has_its_nics_checked():
    # before: a hand list (infiniband, roce, efa) left infiniband-800g unchecked
    rdma = {t for t, p in TRANSPORT_PROFILES.items() if p.rdma}
    assert rdma == {Transport.INFINIBAND, Transport.INFINIBAND_800G, Transport.ROCE, Transport.EFA}


def _assigned_to(tree: ast.AST) -> dict[int, str]:
    """Line -> the name a value on it is assigned to (module level)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            for sub in ast.walk(node.value):
                if hasattr(sub, "lineno"):
                    out[sub.lineno] = node.targets[0].id
    return out


def test_no_copy_of_a_vocabulary_remains():
    """No tuple, list, set or dict of two or more of a vocabulary's words outside its Enum (the stand-in, its own
    package, and the validation agent's wire format excepted)."""
    words = {v.__name__: {w.value for w in v} for v in VOCABULARIES}
    copies = []
    for path in sorted([*ROOT.glob("toolkit/**/*.py"), *ROOT.glob("orchestrator/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("toolkit/standin/"):
            continue
        tree = parsed(path)
        names = _assigned_to(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                items = node.elts
            elif isinstance(node, ast.Dict):
                items = [k for k in node.keys if k is not None]
            else:
                continue
            texts = [e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            for name, vocabulary in words.items():
                if len([t for t in texts if t in vocabulary]) >= 2 and (rel, names.get(node.lineno)) not in NOT_COPIES:
                    copies.append(f"{rel}:{node.lineno} restates {name}: {texts}")
    assert not copies, "\n".join(copies)


# An attribute or key holding a word of a vocabulary: the vocabulary it holds.
HOLDS = {"role": Role, "transport": Transport, "stage": Stage, "policy": RestartPolicy, "router": Router,
         "context_router": Router, "generation_router": Router}


def test_no_word_of_a_vocabulary_is_compared_as_text():
    """`x.role == "etcd"`, `c.stage == "reuse"`, `transport == "tcp"`, `counts["ctx"]`: a vocabulary's word written as
    text where its Enum member belongs (a renamed word would leave the comparison silently false)."""
    copies = []
    for path in sorted([*ROOT.glob("toolkit/**/*.py"), *ROOT.glob("orchestrator/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("toolkit/standin/"):
            continue
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                held = [HOLDS[s.attr] for s in sides if isinstance(s, ast.Attribute) and s.attr in HOLDS]
                held += [HOLDS[s.id] for s in sides if isinstance(s, ast.Name) and s.id in HOLDS]
                texts = [c.value for s in sides for c in ([s] if isinstance(s, ast.Constant) else
                                                          getattr(s, "elts", ())) if isinstance(c, ast.Constant)]
                for vocabulary in held:
                    words = [t for t in texts if t in {w.value for w in vocabulary}]
                    if words:
                        copies.append(f"{rel}:{node.lineno} compares {vocabulary.__name__} with {words}")
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and \
                    node.slice.value in {Role.CTX.value, Role.GEN.value, Role.AGG.value}:
                copies.append(f"{rel}:{node.lineno} indexes by the Role word {node.slice.value!r}")
    assert not copies, "\n".join(copies)
