"""Spec: the Plan is the contract. Later stages read typed fields (model, kv_transfer, traffic, proxy timeout,
per-role KV per rank); Plan.recipe is for the manifest only, and the numbers validation uses are the plan's."""

import ast
import dataclasses
import math
from pathlib import Path

import pytest

from toolkit.facts.hardware import TRANSPORT_PROFILES
from toolkit.facts.models import ModelSpec, resolve_model
from toolkit.render import manifest
from toolkit.validate.params import Options, geometry
from tests.unit.helpers import BASE, parsed, plan_of

ROOT = Path(__file__).resolve().parents[2]


def with_model(model, *extra):
    return plan_of(BASE.replace("meta-llama/Llama-3.3-70B-Instruct", model), *extra)


def test_the_plan_is_frozen_and_its_model_is_typed():
    p = plan_of(BASE)
    assert isinstance(p.model, ModelSpec) and p.model.name == "meta-llama/Llama-3.3-70B-Instruct"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "other"  # type: ignore[misc]
    # the manifest keeps its shape: the model as a plain dict
    assert manifest(p, {})["derived"]["model"] == dataclasses.asdict(p.model)


def test_kv_transfer_traffic_and_proxy_timeout_come_from_the_recipe():
    p = plan_of(BASE, "kv_transfer.transport=efa", "kv_transfer.dtype=fp8",
                "traffic.max_input_len=3000", "traffic.prefix_len=96", "traffic.typical_input_len=700",
                "traffic.max_output_len=500", "proxy.request_timeout_s=42", "kv_transfer.backend=NIXL")
    assert p.kv_transfer.backend == "NIXL" and p.kv_transfer.dtype == "fp8"
    assert p.kv_transfer.transport is TRANSPORT_PROFILES["efa"]
    assert (p.traffic.max_input_len, p.traffic.prefix_len, p.traffic.typical_input_len,
            p.traffic.max_output_len) == (3000, 96, 700, 500)
    assert p.proxy.request_timeout_s == 42
    assert plan_of(BASE).traffic.typical_input_len is None


@pytest.mark.parametrize("model,tp,pp", [
    ("meta-llama/Llama-3.3-70B-Instruct", 4, 1),
    ("meta-llama/Llama-3.3-70B-Instruct", 8, 2),  # more ranks than KV heads: one head per rank
    ("Qwen/Qwen3-235B-A22B", 8, 1),
    ("deepseek-ai/DeepSeek-R1", 8, 3),  # MLA: latent replicated; 61 layers over 3 stages
])
def test_per_role_kv_per_rank(model, tp, pp):
    m = resolve_model(model)
    p = with_model(model, f"generation.tp={tp}", f"generation.pp={pp}", "kv_transfer.dtype=fp8", "context.tp=8",
                   "cluster.gpu=H200")
    kv = p.generation.kv
    assert kv.layers_per_rank == math.ceil(m.num_layers / pp)
    if m.attention == "mla":
        assert kv.bytes_per_token_per_layer_per_rank == m.kv_lora_rank + m.qk_rope_head_dim
    else:
        assert kv.bytes_per_token_per_layer_per_rank == 2 * max(1, m.num_kv_heads // tp) * m.head_dim
    assert kv.bytes_per_token_per_rank == kv.layers_per_rank * kv.bytes_per_token_per_layer_per_rank
    assert kv.bytes_per_token_per_rank == p.kv.gen_bytes_per_token_per_rank
    assert p.context.kv.bytes_per_token_per_rank == p.kv.ctx_bytes_per_token_per_rank


def test_validation_payload_uses_the_plans_per_rank_numbers():
    p = plan_of(BASE, "context.tp=2", "generation.tp=8", "kv_transfer.dtype=fp8")
    geom, _, _ = geometry(p, Options(sweep=False))
    kvf = p.model.kv_factor
    assert geom["slot_bytes_per_token"] == {"ctx": p.context.kv.bytes_per_token_per_layer_per_rank // kvf,
                                            "gen": p.generation.kv.bytes_per_token_per_layer_per_rank // kvf}
    assert geom["layers_per_rank"] == min(p.context.kv.layers_per_rank, p.generation.kv.layers_per_rank)


def test_later_stages_do_not_read_the_raw_recipe_or_model_dicts():
    """Only render's manifest may read Plan.recipe; nobody indexes plan.model like a dict."""
    offenders = []
    for stage in ("launch", "validate", "render", "report.py", "size"):
        root = ROOT / "toolkit" / stage
        for path in ([root] if root.is_file() else root.rglob("*.py")):
            for node in ast.walk(parsed(path)):
                if isinstance(node, ast.Attribute) and node.attr == "recipe" and \
                        isinstance(node.value, ast.Name) and node.value.id == "plan":
                    if not (stage == "render" and _inside(path, node, "manifest")):
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} plan.recipe")
                if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and \
                        node.value.attr == "model" and isinstance(node.value.value, ast.Name) and \
                        node.value.value.id == "plan":
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} plan.model[...]")
    assert not offenders


def _inside(path: Path, target: ast.AST, function: str) -> bool:
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return node.lineno <= target.lineno <= node.end_lineno
    return False
