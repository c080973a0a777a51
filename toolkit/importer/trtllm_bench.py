"""TensorRT-LLM's own disaggregated Slurm benchmark config (examples/disaggregated/slurm/benchmark/config.yaml,
NVIDIA/TensorRT-LLM @ 180891e14df3d9907ddb858153f1ee6eb837fffd) as a tk recipe.

Sections: ``slurm`` (partition, account, job_time, job_name, numa_bind, extra_args), ``benchmark``,
``hardware`` (gpus_per_node, num_ctx_servers, num_gen_servers), ``sequence`` (input_length, output_length),
``environment`` (container_mount, container_image, model_path, worker_env_var, server_env_var, ...), ``profiling``,
``worker_config`` (eplb_num_slots, gen, ctx: the LLM-API options of each role).
"""

from __future__ import annotations

from toolkit.importer.common import (Ledger, env_mapping, launcher_for, model_name, role_options, section,
                                     set_path, shared_fields, speculative, transport_for)

KIND = "trtllm-bench"
ROLES = {"ctx": "context", "gen": "generation"}


def looks_like(doc: dict) -> bool:
    wc = doc.get("worker_config")
    return isinstance(wc, dict) and isinstance(wc.get("ctx"), dict) and isinstance(wc.get("gen"), dict)


def convert(doc: dict, ledger: Ledger) -> dict:
    slurm = section(doc, "slurm")
    hw = section(doc, "hardware")
    seq = section(doc, "sequence")
    envs = section(doc, "environment")
    wc = section(doc, "worker_config")
    name = str(slurm.get("job_name") or "imported")
    if name.startswith("<"):
        name = "imported"
    recipe: dict = {"schema_version": 1, "name": name}
    ledger.carry("slurm.job_name")
    model_path = str(envs.get("model_path") or "")
    model, _ = model_name(model_path)
    recipe["model"] = model
    if model_path:
        recipe["model_path"] = model_path
        ledger.carry("environment.model_path")
    if not model_path or model_path.startswith("<"):
        ledger.notes.append("environment.model_path is a placeholder: set model (a built-in name or a directory with "
                            "config.json) and model_path")
    cluster: dict = {"gpus_per_node": hw.get("gpus_per_node", 8)}
    ledger.carry("hardware.gpus_per_node")
    for src, dst in (("partition", "partition"), ("account", "account"), ("job_time", "time_limit")):
        value = slurm.get(src)
        if value and not str(value).startswith("<"):
            cluster[dst] = str(value)
            ledger.carry(f"slurm.{src}")
        elif value:
            ledger.drop(f"slurm.{src}", value, "a placeholder")
    if envs.get("container_image") and not str(envs["container_image"]).startswith("<"):
        cluster["container_image"] = str(envs["container_image"])
        ledger.carry("environment.container_image")
    mounts = envs.get("container_mount")
    if mounts and not str(mounts).startswith("<"):
        cluster["container_mounts"] = [m for m in str(mounts).split(",") if m]
        ledger.carry("environment.container_mount")
    extra = slurm.get("extra_args")
    if extra:
        cluster["sbatch_args"] = str(extra).split()
        ledger.carry("slurm.extra_args")
    recipe["cluster"] = cluster
    per_role, roles, where = {}, {}, {}
    for src, title in ROLES.items():
        where[title] = f"worker_config.{src}"
        ledger.role_sources[title] = dict(wc[src])
        role, rest = role_options(wc[src], title, where[title], ledger)
        role["instances"] = hw.get(f"num_{src}_servers", 1)
        ledger.carry(f"hardware.num_{src}_servers")
        prefix = launcher_for(None, slurm.get("numa_bind"))
        if prefix:
            role["launcher_prefix"] = prefix
        per_role[title], roles[title] = rest, role
    if slurm.get("numa_bind") is not None:
        ledger.carry("slurm.numa_bind")
        if slurm.get("numa_bind"):
            ledger.notes.append("slurm.numa_bind: true is written as the launcher prefix numactl -m 0,1 (what "
                                "NVIDIA's srt-slurm uses on Grace nodes)")
    slots = wc.get("eplb_num_slots")
    if isinstance(slots, int) and slots > 0:
        for title in ROLES.values():  # what the benchmark's worker-config generator writes for EPLB
            set_path(per_role[title], "moe_config.load_balancer.num_slots", slots)
        ledger.carry("worker_config.eplb_num_slots")
    elif "eplb_num_slots" in wc:
        ledger.carry("worker_config.eplb_num_slots")
    kv = shared_fields(per_role, where, ledger)
    spec = speculative(per_role, where, ledger)
    for title in ROLES.values():
        if per_role[title]:
            roles[title]["extra_options"] = per_role[title]
            for key in per_role[title]:
                ledger.carry(f"{where[title]}.{key}")
        recipe[title] = roles[title]
    if "kv_transfer_timeout_ms" not in kv:
        kv["kv_transfer_timeout_ms"] = None
    recipe["kv_transfer"] = kv
    if spec:
        recipe["speculative"] = spec
    traffic = {}
    for src, dst in (("input_length", "max_input_len"), ("output_length", "max_output_len")):
        if isinstance(seq.get(src), int):
            traffic[dst] = seq[src]
            ledger.carry(f"sequence.{src}")
    if traffic:
        recipe["traffic"] = traffic
    env = env_mapping(envs.get("worker_env_var"), "environment.worker_env_var", ledger)
    for title in ROLES.values():
        if env:
            roles[title].setdefault("env", {}).update(env)
    server_env = env_mapping(envs.get("server_env_var"), "environment.server_env_var", ledger)
    if server_env:
        recipe.setdefault("proxy", {})["env"] = server_env
    kv["transport"] = transport_for(None, recipe, ledger)  # the config names no GPU
    for key, value in envs.items():
        if key not in ("model_path", "container_image", "container_mount", "worker_env_var", "server_env_var"):
            ledger.drop(f"environment.{key}", value, "the benchmark script's own setting (a TensorRT-LLM checkout, "
                        "a work or dataset directory): tk needs none")
    for key in ("benchmark", "profiling", "accuracy"):
        if key in doc:
            ledger.drop(key, doc[key], "the benchmark script's run settings: use tk bench")
    for key, value in slurm.items():
        if key not in ("job_name", "partition", "account", "job_time", "numa_bind", "extra_args"):
            ledger.drop(f"slurm.{key}", value, "tk writes its own batch script")
    return recipe
