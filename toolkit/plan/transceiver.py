"""The plan's transceiver, derived: which TensorRT-LLM cache transceiver each role's servers run (its options file,
else the release's default from the generated data) and what it hands NIXL for the longest request.

Part of the derivation (toolkit/plan/derive.py): it refuses nothing. The rules that read it
(toolkit/plan/rules.py: check_transceiver_runtimes, check_transfer_buffer) report. The facts and their sources are
in toolkit/facts/transceiver.py; this module only applies them to a recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.facts import llm_args, trtllm
from toolkit.facts import transceiver as T
from toolkit.facts.models import ModelSpec
from toolkit.plan.model import BufferSizing, TransceiverPlan
from toolkit.plan.sizing import attention_tp, role_kv
from toolkit.recipe.schema import Recipe

ROLES = ("context", "generation")


@dataclass(frozen=True)
class RoleTransceiver:
    """One role's servers' transceiver: the runtime chosen (with the others the release may run), the effective
    backend (DEFAULT resolved) and the transfer buffer in tokens."""

    title: str
    choice: T.RuntimeChoice
    backend: str
    buffer_tokens: int


@dataclass(frozen=True)
class TransceiverDerivation:
    """Each role's transceiver (roles that have one: cache_transceiver_config with a backend) and, where both do,
    the plan's model of what the context servers move per rank pair."""

    roles: tuple[RoleTransceiver, ...]
    plan: TransceiverPlan | None


def role_transceiver(r: Recipe, title: str, ct: dict, target: llm_args.Target, buffer: BufferSizing
                     ) -> RoleTransceiver:
    env = {**r.kv_transfer.env, **getattr(r, title).env}
    backend = T.resolve_backend(str(ct.get("backend")), env, target.line, trtllm.BACKEND_SELECTORS)
    timeout_null = "kv_transfer_timeout_ms" in ct and ct["kv_transfer_timeout_ms"] is None
    given = "transceiver_runtime" in ct
    choice = T.choose_runtime(target, given, ct.get("transceiver_runtime") if given else None, backend, timeout_null)
    return RoleTransceiver(title=title, choice=choice, backend=backend, buffer_tokens=buffer.for_role(title))


def derive_transceiver(r: Recipe, target: llm_args.Target, model: ModelSpec, merged: dict[str, dict],
                       buffer: BufferSizing, extra_layers: int, longest: int) -> TransceiverDerivation:
    """Each role's transceiver and the longest request's (``longest`` tokens) descriptors per rank pair."""
    roles = {}
    for title in ROLES:
        ct = merged.get(title, {}).get("cache_transceiver_config")
        if isinstance(ct, dict) and ct.get("backend") is not None:
            roles[title] = role_transceiver(r, title, ct, target, buffer)
    if len(roles) != len(ROLES):
        return TransceiverDerivation(tuple(roles.values()), None)
    ctx = roles["context"]
    ctx_kv = role_kv(model, r.kv_transfer.dtype, r.context, extra_layers)
    gen_kv = role_kv(model, r.kv_transfer.dtype, r.generation, extra_layers)
    kvf = model.kv_factor
    slot = min(ctx_kv.bytes_per_token_per_layer_per_rank, gen_kv.bytes_per_token_per_layer_per_rank) / kvf
    pair = T.RankPairGeometry(tokens_per_block=r.kv_transfer.tokens_per_block,
                              layers=min(ctx_kv.layers_per_rank, gen_kv.layers_per_rank), kv_factor=kvf,
                              slot_bytes_per_token=max(1, round(slot)))
    mla = model.attention == "mla"
    mapper = T.mapper_layout(attention_tp(r.context), attention_tp(r.generation), model.num_kv_heads, mla,
                             ctx_kv.layers_per_rank, gen_kv.layers_per_rank)
    bounce = merged["context"]["cache_transceiver_config"].get("kv_cache_bounce_size_mb") or 0
    bounce = bounce if isinstance(bounce, int) and not isinstance(bounce, bool) else 0
    whole = T.descriptors(mapper, pair, longest)
    runtime = ctx.choice.runtime
    writers = T.writers_per_generation_rank(attention_tp(r.context), attention_tp(r.generation), r.context.pp,
                                            r.generation.pp, model.num_kv_heads, mla)
    layout = T.layout_for(runtime, mapper, bounce, whole.total_bytes, writers)
    desc = T.descriptors(layout, pair, longest)
    plan = TransceiverPlan(
        runtime=runtime, runtime_setting=ctx.choice.setting, runtime_reason=ctx.choice.why,
        default_source=ctx.choice.default_source, verified=ctx.choice.verified, backend=ctx.backend, mapper=mapper,
        layout=layout, bounce_size_mb=bounce, pair=pair,
        targets_per_context_rank=T.targets_per_context_rank(attention_tp(r.context), attention_tp(r.generation),
                                                            r.context.pp, r.generation.pp),
        longest=desc, model=T.describe(runtime, desc), writers_per_generation_rank=writers)
    return TransceiverDerivation(tuple(roles.values()), plan)
