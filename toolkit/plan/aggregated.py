"""The aggregated baseline of a disaggregated plan: the same model on the same GPUs, no disaggregation.

`tk launch RECIPE --aggregated`, `tk bench --baseline aggregated` (``api.launch_baseline``). The GPUs are the
disaggregated plan's (context GPUs + generation GPUs); each instance is a plain `trtllm-serve MODEL`, tp x pp
GPUs, with no cache_transceiver_config and no disaggregated role. The recipe's `aggregated:` section decides:

    tp              null: the generation role's tp
    pp              1
    instances       total GPUs / (tp * pp); an error naming aggregated.tp when that does not divide
    max_batch_size  null: the generation role's (the aggregated server decodes like the generation servers; the
                    context role's small batch is a prefill batch and would starve decoding)
    max_num_tokens  null: the larger of the two roles' max_num_tokens, so the longest request (which the context
                    role is sized to admit in one forward pass) fits here too, as do the generation role's
                    decode batches; a value below the longest request is an error

The other options are the generation role's, derived the same way (toolkit.plan.options.derived_options) with
its extra_options merged in, minus cache_transceiver_config.

No proxy: TensorRT-LLM's `trtllm-serve disaggregated` has no supported way to front aggregated servers (docs/
architecture.md, "The aggregated baseline"), so an aggregated plan has no ProxyPlan and no membership; a client
is given every instance's URL (aiperf 0.13 takes several --url and round-robins over them).
"""

from __future__ import annotations

import dataclasses

from orchestrator.states import Role
from toolkit.errors import RecipeError
from toolkit.facts import llm_args, trtllm
from toolkit.facts import options as option_kinds
from toolkit.plan import memory, options, placement, rules
from toolkit.plan.derive import draft_model_of
from toolkit.plan.model import Plan, RolePlan
from toolkit.plan.sizing import ceil_to, longest_input, role_kv, spec_layers
from toolkit.recipe.loader import LoadedRecipe

ROLE = Role.AGG
TITLE = "aggregated"


def aggregated_plan(plan: Plan, loaded: LoadedRecipe) -> Plan:
    """The aggregated baseline of `plan` (built from `loaded`); RecipeError naming the aggregated.* field. Derived
    first (the instances' sizes, options and memory), then checked, as the disaggregated plan is."""
    if plan.is_aggregated:
        return plan
    r = loaded.recipe
    a = r.aggregated
    c = rules.Collector(loaded)
    total = plan.context.gpu_count + plan.generation.gpu_count
    tp = a.tp or r.generation.tp
    world = tp * a.pp
    if total % world:  # no instance count to derive anything from
        c.add("aggregated.tp", *_indivisible(r, plan, tp, world))
        raise RecipeError(c.violations)
    version = trtllm.get(r.trtllm_version)
    mnt = a.max_num_tokens or max(plan.context.llm_api_options["max_num_tokens"],
                                  plan.generation.llm_api_options["max_num_tokens"])
    gen = r.generation
    ep = gen.ep if gen.ep and tp % gen.ep == 0 else None
    spec = gen.model_copy(update={
        "instances": total // world, "tp": tp, "pp": a.pp, "ep": ep, "attention_dp": gen.attention_dp and tp >= 2,
        "max_batch_size": a.max_batch_size or plan.generation.llm_api_options["max_batch_size"],
        "max_num_tokens": mnt})
    gpn = r.cluster.gpus_per_node
    derived = options.derived_options(r, "generation", spec, plan.model, version, plan.buffer)
    extra = option_kinds.lax_converted(  # as TensorRT-LLM reads them, as the disaggregated plan writes them
        {k: v for k, v in gen.extra_options.items() if k != "cache_transceiver_config"},
        llm_args.Target(version.line, loaded.release))
    opts = options.deep_merge(derived, extra)
    opts.pop("cache_transceiver_config", None)  # aggregated: no KV transfer (what makes a server disaggregated)
    opts["max_num_tokens"] = mnt  # over an extra_options value: the longest request must fit
    extra_layers = spec_layers(r, version)
    # The memory plan of an aggregated server (toolkit/plan/memory.py), its refusals naming aggregated.tp.
    q, note = memory.weights_quant(plan.model, r.context.quantization or r.quantization,
                                   bool(r.model_path or r.context.model_path or r.generation.model_path))
    memories = memory.role_memories(r, plan.model, plan.engine, q, {TITLE: opts}, extra_layers,
                                    {TITLE: draft_model_of(loaded, opts)})
    instances = placement.place(ROLE, spec, placement.GpuCursor(gpn), first_port=r.cluster.worker_base_port,
                                uses_mpi=plan.engine.uses_mpi)
    instances = placement.internal_ports(instances, version, plan.engine,
                                         r.cluster.internal_base_port or r.cluster.worker_base_port + 1000)

    longest = ceil_to(r.kv_transfer.tokens_per_block, longest_input(r))
    if mnt < longest:
        c.add("aggregated.max_num_tokens",
              f"max_num_tokens={mnt} does not admit the longest request ({longest} tokens: traffic.max_input_len "
              "rounded up to tokens_per_block), which an aggregated server prefills in one forward pass",
              f"set aggregated.max_num_tokens >= {longest}, or null (the larger of the roles')")
    problem = placement.packing_problem(spec, gpn)
    if problem:
        c.add(f"{TITLE}.tp", *problem)
    memory.check_roles(r, plan.model, plan.engine, q, note, {TITLE: opts}, memories, extra_layers, c, general=False)
    if c.violations:
        raise RecipeError(c.violations)

    node_count = 1 + max(n for s in instances for n in s.nodes)
    role = RolePlan(role=ROLE, title=TITLE, tp=tp, pp=a.pp, ep=opts.get("moe_expert_parallel_size"),
                    attention_dp=spec.attention_dp, gpus_per_instance=world,
                    nodes_per_instance=placement.nodes_per_instance(spec, gpn),
                    node_count=placement.nodes_used(instances), instances=instances,
                    model_path=plan.generation.model_path, llm_api_options=opts,
                    serve_args=options.serve_args(spec, opts, plan.model), env=dict(plan.generation.env),
                    kv=role_kv(plan.model, r.kv_transfer.dtype, spec, extra_layers),
                    memory=memories.get(TITLE))
    slurm = dataclasses.replace(plan.slurm, job_name=f"{plan.slurm.job_name}-agg", nodes=node_count)
    supervision = dataclasses.replace(plan.supervision, min_aggregated=1)
    warnings = plan.warnings + tuple(w for w in c.warnings if w not in plan.warnings)
    return dataclasses.replace(plan, name=f"{plan.name}-agg", mode="aggregated", aggregated=role, proxy=None,
                               membership=None, slurm=slurm, supervision=supervision, node_count=node_count,
                               warnings=warnings)


def _indivisible(r, plan: Plan, tp: int, world: int) -> tuple[str, str]:
    """Why instances of tp*pp GPUs cannot run on the disaggregated plan's GPUs, and the tp*pp that can."""
    total = plan.context.gpu_count + plan.generation.gpu_count
    gpn = r.cluster.gpus_per_node
    fixes = [d for d in range(1, total + 1) if total % d == 0 and d % r.aggregated.pp == 0
             and (gpn % d == 0 if d <= gpn else d % gpn == 0)]  # as placement.packing_problem packs
    return (f"the aggregated baseline runs on the disaggregated deployment's {total} GPUs (context "
            f"{plan.context.gpu_count} + generation {plan.generation.gpu_count}); instances of tp*pp={world} "
            f"GPUs do not divide them" + ("" if r.aggregated.tp else " (aggregated.tp is null: the generation role's tp)"),
            f"set aggregated.tp so that tp*pp divides {total} (tp*pp one of {', '.join(map(str, fixes))})")
