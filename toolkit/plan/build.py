"""Stage 2: a validated recipe becomes a Plan, or a list of every rule it breaks.

This module assembles the Plan; the parts live beside it: ``placement`` (nodes, GPUs, ports), ``sizing``
(KV geometry, buffer, estimates), ``options`` (what the engine is given: LLM-API options, flags, env, proxy
config) and ``rules`` (the checks, which need those derived numbers). Facts come from ``toolkit.facts``.
"""

from __future__ import annotations

import dataclasses

from toolkit import __version__
from toolkit.errors import RecipeError
from toolkit.facts import llm_args, trtllm
from toolkit.facts.containers import pyxis_image
from toolkit.facts.engines import ENGINES, emulated_label
from toolkit.facts.hardware import TRANSPORT_PROFILES
from toolkit.facts.models import ModelError, resolve_model
from toolkit.plan import memory, options, placement, rules, sizing, transceiver
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


def model_config_dirs(r) -> tuple[tuple[str, str], ...]:
    """Where a model given by its Hugging Face id may have its config.json on this machine: the checkpoint
    directories the recipe names (model_path, per role too), as written and, where a container mount maps one
    into the container, at its source on the host (a login node sees /lustre/models/X, the servers /models/X)."""
    out: list[tuple[str, str]] = []
    for path in dict.fromkeys(p for p in (r.model_path, r.context.model_path, r.generation.model_path) if p):
        out.append(("model_path", path))
        for mount in r.cluster.container_mounts:
            src, dst = mount.split(":")[:2]
            dst = dst.rstrip("/") or "/"
            if path == dst or path.startswith(dst.rstrip("/") + "/"):
                out.append((f"model_path through the mount {mount}", src.rstrip("/") + path[len(dst.rstrip("/")):]))
    return tuple(out)


def _disaggregated_plan(loaded: LoadedRecipe) -> Plan:
    r = loaded.recipe
    c = rules.Collector(loaded)
    c.warnings.extend(loaded.warnings)  # e.g. an image tag tk cannot read (toolkit.recipe.loader.resolve_version)
    version = trtllm.get(r.trtllm_version)
    target = llm_args.Target(version.line, loaded.release)
    engine = ENGINES[r.engine]

    try:
        model = resolve_model(r.model, base_dir=loaded.base_dir, config_dirs=model_config_dirs(r))
    except ModelError as exc:
        c.add("model", str(exc),
              exc.fix or "use a name from `tk recipes --models` or a directory with config.json")
        raise RecipeError(c.violations) from None

    transport = TRANSPORT_PROFILES[r.kv_transfer.transport]
    rules.check_version_features(r, version, engine, transport, c, target)
    rules.check_speculative(r, target, model, c)
    rules.check_proxy(r, version, c)
    rules.check_parallelism(r, model, c)
    emulated_model = rules.check_emulation(r, engine, c)
    buffer = sizing.size_buffer(r, c)

    merged = {}
    for title, spec in (("context", r.context), ("generation", r.generation)):
        derived = options.derived_options(r, title, spec, model, version, buffer, target)
        # the rules below read values from the merged options: only what check_extra_options did not report
        checked = rules.check_extra_options(r, title, spec, derived, version, c, target)
        rules.check_extra_serve_args(title, spec, version, c)
        merged[title] = options.deep_merge(derived, checked)
    ctx_opts, gen_opts = merged["context"], merged["generation"]
    rules.check_unverified_options(version, merged, c)
    rules.check_transceiver(r, target, merged, c)
    rules.check_role_options(r, ctx_opts, gen_opts, c)
    rules.check_agreement(r, ctx_opts, gen_opts, c)
    extra_layers = sizing.spec_layers(r, version)  # MTP adds KV layers (facts.trtllm.mtp_kv_layers)
    memories = memory.plan_roles(r, model, engine, merged, extra_layers, buffer, c)
    kv_transceiver = transceiver.plan_transceiver(r, version, target, model, merged, buffer, extra_layers, c)

    gpn = r.cluster.gpus_per_node
    ctx_span = placement.nodes_per_instance(r.context, gpn, "context", c)
    gen_span = placement.nodes_per_instance(r.generation, gpn, "generation", c)

    port = r.cluster.worker_base_port
    cursor = placement.GpuCursor(gpn)
    ctx_instances = placement.place("ctx", r.context, cursor, first_port=port, uses_mpi=engine.uses_mpi)
    if not r.cluster.share_nodes:
        cursor.next_node()
    gen_instances = placement.place("gen", r.generation, cursor, first_port=port + len(ctx_instances),
                                    uses_mpi=engine.uses_mpi)
    servers = placement.internal_ports(ctx_instances + gen_instances, version, engine,
                                       r.cluster.internal_base_port or r.cluster.worker_base_port + 1000)
    ctx_instances, gen_instances = servers[:len(ctx_instances)], servers[len(ctx_instances):]
    ctx_nodes, gen_nodes = placement.nodes_used(ctx_instances), placement.nodes_used(gen_instances)
    node_count = 1 + max(n for s in servers for n in s.nodes)
    rules.check_placement(r, transport, servers, node_count, ctx_nodes, gen_nodes, c)
    rules.check_internal_ports(r, servers, c)
    rules.check_slurm_args(r, c)
    rules.check_supervision(r, c)
    membership = rules.check_membership(r, version, servers, c)
    if membership is not None:
        # A worker takes its cluster_name, heartbeat and timeout from a disagg_cluster block of its options file
        # (serve.py pops it before the LLM args; without one, DisaggClusterConfig's defaults, cluster_name ""), its
        # cluster_uri from --disagg_cluster_uri. No cluster_uri in the block: extract_disagg_cluster_config sets every
        # key of the block over the CLI's URI (tensorrt_llm/llmapi/disagg_utils.py, tensorrt_llm/commands/serve.py).
        block = options.worker_cluster_block(membership)
        ctx_opts, gen_opts = ({**o, trtllm.MEMBERSHIP_KEY: block} for o in (ctx_opts, gen_opts))

    env_base = options.worker_env(r, version, engine, transport, target)
    if emulated_model is not None:
        env_base.update(options.emulation_env(r, engine, transport, emulated_model, loaded.base_dir))
        emu = r.standin.emulate
        engine = dataclasses.replace(engine, label=emulated_label(engine, emulated_model, emu.gpu, emu.precision))
    ctx_env = {**env_base, **r.context.env}
    gen_env = {**env_base, **r.generation.env}
    for role, env in (("context", ctx_env), ("generation", gen_env)):
        rules.check_env(r, role, env, version, c)
    if c.violations:
        raise RecipeError(c.violations)

    geometry = sizing.geometry(r, model, extra_layers)
    if emulated_model is not None:  # the run's timing is the emulated model's on the emulated GPU
        emulated = resolve_model(emulated_model, base_dir=loaded.base_dir)
        estimates = sizing.estimates(r, emulated, sizing.geometry(r, emulated, extra_layers), transport,
                                     gpu=r.standin.emulate.gpu)
    else:
        estimates = sizing.estimates(r, model, geometry, transport)
    dtype = r.kv_transfer.dtype

    def role_plan(name: str, title: str, spec, span: int, nodes: int, instances, opts: dict, env: dict) -> RolePlan:
        return RolePlan(role=name, title=title, tp=spec.tp, pp=spec.pp, ep=opts.get("moe_expert_parallel_size"),
                        attention_dp=spec.attention_dp, gpus_per_instance=spec.tp * spec.pp,
                        nodes_per_instance=span, node_count=nodes, instances=instances,
                        model_path=spec.model_path or r.model_path or r.model, llm_api_options=opts,
                        serve_args=options.serve_args(spec, opts, model), env=env,
                        kv=sizing.role_kv(model, dtype, spec, extra_layers),
                        launcher_prefix=tuple(spec.launcher_prefix), memory=memories.get(title))

    ctx_plan = role_plan("ctx", "context", r.context, ctx_span, ctx_nodes, ctx_instances, ctx_opts, ctx_env)
    gen_plan = role_plan("gen", "generation", r.generation, gen_span, gen_nodes, gen_instances, gen_opts, gen_env)
    proxy = options.proxy_plan(r, ctx_instances, gen_instances, transport, engine, membership, version)
    if r.cluster.mpi and not engine.uses_mpi:
        c.warnings.append(f"cluster.mpi {r.cluster.mpi} is not used: the {engine.label} starts one process per "
                          "server, without MPI")
    image = pyxis_image(r.cluster.container_image) if r.cluster.container_image else None
    if image is not None and image.warning:
        c.warnings.append(image.warning)
    slurm = SlurmPlan(job_name=f"tk-{r.name}", nodes=node_count, gpus_per_node=gpn,
                      partition=r.cluster.partition, account=r.cluster.account, time_limit=r.cluster.time_limit,
                      container_image=image.rendered if image else None,
                      image_note=image.note if image else "", container_mounts=tuple(r.cluster.container_mounts),
                      mpi=(r.cluster.mpi or DEFAULT_MPI) if engine.uses_mpi else None,
                      pending_timeout_s=r.cluster.pending_timeout_s, startup_timeout_s=r.cluster.startup_timeout_s,
                      gpu_request=r.cluster.gpu_request, exclusive=r.cluster.exclusive,
                      sbatch_args=tuple(r.cluster.sbatch_args), srun_args=tuple(r.cluster.srun_args))
    sv = r.supervision
    supervision = SupervisionPlan(policy=sv.policy, max_restarts=sv.max_restarts,
                                  backoff_initial_s=sv.backoff_initial_s, backoff_max_s=sv.backoff_max_s,
                                  unhealthy_after_s=sv.unhealthy_after_s, stable_after_s=sv.stable_after_s,
                                  health_interval_s=HEALTH_INTERVAL_S, min_context=sv.min_context,
                                  min_generation=sv.min_generation, stall_after_s=sv.stall_after_s)
    t = r.traffic
    return Plan(
        name=r.name, recipe_file=loaded.file, toolkit_version=__version__, trtllm_version=version.line,
        trtllm_release=version.release, model=model, engine=engine, kv=geometry,
        kv_transfer=KvTransferPlan(backend=r.kv_transfer.backend, dtype=dtype, transport=transport,
                                   transceiver=kv_transceiver),
        traffic=TrafficPlan(max_input_len=t.max_input_len, prefix_len=t.prefix_len,
                            max_output_len=t.max_output_len, typical_input_len=t.typical_input_len),
        buffer=buffer, estimates=estimates, context=ctx_plan, generation=gen_plan, proxy=proxy, slurm=slurm,
        supervision=supervision, membership=membership,
        node_count=node_count, recipe=r.manifest_doc(), gpu=r.cluster.gpu,
        quantization=r.context.quantization or r.quantization, warnings=tuple(dict.fromkeys(c.warnings)),
        target_release=loaded.release, site_file=loaded.site_file, value_sources=loaded.outside_sources(),
    )

