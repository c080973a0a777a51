"""Stage 2: a validated recipe becomes a Plan, or a list of every rule it breaks.

First everything is derived (``toolkit.plan.derive``, from the parts beside it: ``placement`` (nodes, GPUs,
ports), ``sizing`` (KV geometry, buffer, estimates), ``options`` (what the engine is given: LLM-API options, flags,
env, proxy config), ``memory`` (each role's GPU memory)); then every rule in ``rules.RULES`` reads the derivation
and reports; then, when none is broken, this module assembles the Plan. Facts come from ``toolkit.facts``.
"""

from __future__ import annotations

import dataclasses

from orchestrator.states import RestartPolicy
from toolkit import __version__
from toolkit.errors import RecipeError
from toolkit.facts import trtllm
from toolkit.plan import options, placement, rules, sizing
from toolkit.plan.derive import Derivation, RoleDerivation, derive
from toolkit.plan.model import KvTransferPlan, Plan, RolePlan, SlurmPlan, SupervisionPlan, TrafficPlan
from toolkit.recipe.loader import LoadedRecipe

# srun's MPI plugin for an engine's MPI ranks when the recipe names none (cluster.mpi): PMIx, as NVIDIA's own Slurm
# script runs every step (NVIDIA/TensorRT-LLM examples/disaggregated/slurm/benchmark/disaggr_torch.slurm @ 051087cd,
# `srun ... --mpi=pmix`). Clusters whose Slurm has no PMIx plugin (`srun --mpi=list`) set cluster.mpi.
DEFAULT_MPI = "pmix"

HEALTH_INTERVAL_S = 2  # how often the job's orchestrator probes every component once the deployment serves


def build_plan(loaded: LoadedRecipe, aggregated: bool = False) -> Plan:
    """Resolve everything; raise RecipeError listing every rule the recipe breaks. aggregated: the aggregated
    baseline on the same GPUs instead (toolkit.plan.aggregated), once the disaggregated plan is valid."""
    plan = _disaggregated_plan(loaded)
    if aggregated:
        from toolkit.plan.aggregated import aggregated_plan

        return aggregated_plan(plan, loaded)
    return plan


RUN_TAG_LEN = 12


def plan_for_run(plan: Plan, tag: str) -> Plan:
    """The plan a run launches: with membership, its cluster name made unique to the run (the recipe's cluster_name,
    or its name, then "-" and tag), so that deployments sharing an etcd never see each other's workers. Rebuilt from
    the plan's resolved recipe, so the proxy config, the workers' options and the manifest all carry it. A plan
    without membership is returned as it is."""
    if plan.membership is None:
        return plan
    import yaml

    from toolkit.recipe.loader import load_recipe_text

    base = plan.membership.cluster_name[:64 - RUN_TAG_LEN - 1]
    text = yaml.safe_dump(plan.recipe, sort_keys=False)
    run_plan = build_plan(load_recipe_text(text, plan.recipe_file, (f"membership.cluster_name={base}-{tag}",)))
    return dataclasses.replace(run_plan, recipe_file=plan.recipe_file)


def _disaggregated_plan(loaded: LoadedRecipe) -> Plan:
    d = derive(loaded)
    c = rules.Collector(loaded)
    c.warnings.extend(loaded.warnings)  # e.g. an image tag tk cannot read (toolkit.recipe.loader.resolve_version)
    for rule in rules.RULES:
        rule(d, c)
    if c.violations:
        raise RecipeError(c.violations)
    return assemble(d, tuple(dict.fromkeys(c.warnings)))


def assemble(d: Derivation, warnings: tuple[str, ...]) -> Plan:
    """The Plan of a derivation every rule passed."""
    r = d.recipe
    membership = d.membership
    proxy = options.proxy_plan(r, d.context.instances, d.generation.instances, d.transport, d.engine, membership,
                               d.version)
    image = d.image
    slurm = SlurmPlan(job_name=f"tk-{r.name}", nodes=d.node_count, gpus_per_node=r.cluster.gpus_per_node,
                      partition=r.cluster.partition, account=r.cluster.account, time_limit=r.cluster.time_limit,
                      container_image=image.rendered if image else None,
                      image_note=image.note if image else "", container_mounts=tuple(r.cluster.container_mounts),
                      mpi=(r.cluster.mpi or DEFAULT_MPI) if d.engine.uses_mpi else None,
                      pending_timeout_s=r.cluster.pending_timeout_s, startup_timeout_s=r.cluster.startup_timeout_s,
                      gpu_request=r.cluster.gpu_request or ("gres" if d.engine.uses_gpus else "none"),
                      exclusive=r.cluster.exclusive,
                      sbatch_args=tuple(r.cluster.sbatch_args), srun_args=tuple(r.cluster.srun_args),
                      time_limit_signal=d.time_limit_signal)
    sv = r.supervision
    supervision = SupervisionPlan(policy=RestartPolicy(sv.policy), max_restarts=sv.max_restarts,
                                  backoff_initial_s=sv.backoff_initial_s, backoff_max_s=sv.backoff_max_s,
                                  unhealthy_after_s=sv.unhealthy_after_s, stable_after_s=sv.stable_after_s,
                                  health_interval_s=HEALTH_INTERVAL_S, min_context=sv.min_context,
                                  min_generation=sv.min_generation, stall_after_s=sv.stall_after_s)
    t = r.traffic
    return Plan(
        name=r.name, recipe_file=d.loaded.file, toolkit_version=__version__, trtllm_version=d.version.line,
        trtllm_release=d.version.release, model=d.model, engine=d.engine, kv=d.geometry,
        kv_transfer=KvTransferPlan(backend=r.kv_transfer.backend, dtype=r.kv_transfer.dtype, transport=d.transport,
                                   transceiver=d.transceiver.plan),
        traffic=TrafficPlan(max_input_len=t.max_input_len, prefix_len=t.prefix_len,
                            max_output_len=t.max_output_len, typical_input_len=t.typical_input_len),
        buffer=d.buffer, estimates=d.estimates, context=_role_plan(d, d.context), generation=_role_plan(d, d.generation),
        proxy=proxy, slurm=slurm, supervision=supervision, membership=membership,
        node_count=d.node_count, recipe=r.manifest_doc(), gpu=r.cluster.gpu,
        quantization=r.context.quantization or r.quantization, warnings=warnings,
        target_release=d.loaded.release, site_file=d.loaded.site_file, value_sources=d.loaded.outside_sources(),
        trtllm_changes=d.version.changes,
    )


def _role_plan(d: Derivation, role: RoleDerivation) -> RolePlan:
    r, spec, opts = d.recipe, role.spec, role.options
    if d.membership is not None:
        # A worker takes its cluster_name, heartbeat and timeout from a disagg_cluster block of its options file
        # (serve.py pops it before the LLM args; without one, DisaggClusterConfig's defaults, cluster_name ""), its
        # cluster_uri from --disagg_cluster_uri. No cluster_uri in the block: extract_disagg_cluster_config sets every
        # key of the block over the CLI's URI (tensorrt_llm/llmapi/disagg_utils.py, tensorrt_llm/commands/serve.py).
        opts = {**opts, trtllm.MEMBERSHIP_KEY: options.worker_cluster_block(d.membership)}
    return RolePlan(role=role.role, title=role.title, tp=spec.tp, pp=spec.pp, ep=opts.get("moe_expert_parallel_size"),
                    attention_dp=spec.attention_dp, gpus_per_instance=spec.tp * spec.pp,
                    nodes_per_instance=role.span, node_count=placement.nodes_used(role.instances),
                    instances=role.instances, model_path=spec.model_path or r.model_path or r.model,
                    llm_api_options=opts, serve_args=options.serve_args(spec, opts, d.model), env=role.env,
                    kv=sizing.role_kv(d.model, r.kv_transfer.dtype, spec, d.extra_layers),
                    launcher_prefix=tuple(spec.launcher_prefix), memory=d.memories.get(role.title))
