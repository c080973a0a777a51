"""TensorRT-LLM's own disaggregated Slurm benchmark config (examples/disaggregated/slurm/benchmark/config.yaml,
NVIDIA/TensorRT-LLM @ 180891e14df3d9907ddb858153f1ee6eb837fffd) as a tk recipe.

Sections: ``slurm`` (partition, account, job_time, job_name, numa_bind, extra_args), ``benchmark``,
``hardware`` (gpus_per_node, num_ctx_servers, num_gen_servers), ``sequence`` (input_length, output_length),
``environment`` (container_mount, container_image, model_path, worker_env_var, server_env_var, ...), ``profiling``,
``worker_config`` (eplb_num_slots, gen, ctx: the LLM-API options of each role).
"""

from __future__ import annotations

from toolkit.importer.common import (Ledger, env_mapping, finish_roles, launcher_for, model_name, role_options, section,
                                     set_path, transport_for)

KIND = "trtllm-bench"
ROLES = {"ctx": "context", "gen": "generation"}


def looks_like(doc: dict) -> bool:
    wc = doc.get("worker_config")
    return isinstance(wc, dict) and isinstance(wc.get("ctx"), dict) and isinstance(wc.get("gen"), dict)


SCRIPT_ENV = ("the benchmark script's own setting (a TensorRT-LLM checkout, a work or dataset directory): tk needs "
              "none")
CARRIED_ENV = ("model_path", "container_image", "container_mount", "worker_env_var", "server_env_var")
CARRIED_SLURM = ("job_name", "partition", "account", "job_time", "numa_bind", "extra_args")


def _placeholder(value) -> bool:
    return str(value).startswith("<")  # "<container_image>": the example's slots for the user's values


def convert(doc: dict, ledger: Ledger) -> dict:
    slurm = section(doc, "slurm")
    hw = section(doc, "hardware")
    envs = section(doc, "environment")
    wc = section(doc, "worker_config")
    name = str(slurm.get("job_name") or "imported")
    recipe: dict = {"schema_version": 1, "name": "imported" if _placeholder(name) else name}
    ledger.carry("slurm.job_name")
    model_path = str(envs.get("model_path") or "")
    recipe["model"], _ = model_name(model_path)
    if model_path:
        recipe["model_path"] = model_path
        ledger.carry("environment.model_path")
    if not model_path or _placeholder(model_path):
        ledger.notes.append("environment.model_path is a placeholder: set model (a built-in name or a directory with "
                            "config.json) and model_path")
    recipe["cluster"] = _cluster(slurm, hw, envs, ledger)
    roles, per_role, where = {}, {}, {}
    for src, title in ROLES.items():
        where[title] = f"worker_config.{src}"
        ledger.role_sources[title] = dict(wc[src])
        roles[title], per_role[title] = role_options(wc[src], title, where[title], ledger)
        roles[title]["instances"] = hw.get(f"num_{src}_servers", 1)
        ledger.carry(f"hardware.num_{src}_servers")
        prefix = launcher_for(None, slurm.get("numa_bind"))
        if prefix:
            roles[title]["launcher_prefix"] = prefix
    if slurm.get("numa_bind") is not None:
        ledger.carry("slurm.numa_bind")
        if slurm.get("numa_bind"):
            ledger.notes.append("slurm.numa_bind: true is written as the launcher prefix numactl -m 0,1 (what "
                                "NVIDIA's srt-slurm uses on Grace nodes)")
    _eplb(wc, per_role, ledger)
    kv = finish_roles(recipe, roles, per_role, where, ledger)
    traffic = _traffic(section(doc, "sequence"), ledger)
    if traffic:
        recipe["traffic"] = traffic
    _env(envs, recipe, roles, ledger)
    kv["transport"] = transport_for(None, recipe, ledger)  # the config names no GPU
    for key, value in envs.items():
        if key not in CARRIED_ENV:
            ledger.drop(f"environment.{key}", value, SCRIPT_ENV)
    for key in ("benchmark", "profiling", "accuracy"):
        if key in doc:
            ledger.drop(key, doc[key], "the benchmark script's run settings: use tk bench")
    for key, value in slurm.items():
        if key not in CARRIED_SLURM:
            ledger.drop(f"slurm.{key}", value, "tk writes its own batch script")
    return recipe


def _cluster(slurm: dict, hw: dict, envs: dict, ledger: Ledger) -> dict:
    cluster: dict = {"gpus_per_node": hw.get("gpus_per_node", 8)}
    ledger.carry("hardware.gpus_per_node")
    for src, dst in (("partition", "partition"), ("account", "account"), ("job_time", "time_limit")):
        value = slurm.get(src)
        if value and not _placeholder(value):
            cluster[dst] = str(value)
            ledger.carry(f"slurm.{src}")
        elif value:
            ledger.drop(f"slurm.{src}", value, "a placeholder")
    for src, dst in (("container_image", "container_image"), ("container_mount", "container_mounts")):
        value = envs.get(src)
        if value and not _placeholder(value):
            cluster[dst] = str(value) if src == "container_image" else [m for m in str(value).split(",") if m]
            ledger.carry(f"environment.{src}")
        elif value:
            ledger.drop(f"environment.{src}", value, "a placeholder")
    extra = slurm.get("extra_args")
    if extra:
        cluster["sbatch_args"] = str(extra).split()
        ledger.carry("slurm.extra_args")
    return cluster


def _eplb(wc: dict, per_role: dict, ledger: Ledger) -> None:
    slots = wc.get("eplb_num_slots")
    if isinstance(slots, int) and slots > 0:
        for rest in per_role.values():  # what the benchmark's worker-config generator writes for EPLB
            set_path(rest, "moe_config.load_balancer.num_slots", slots)
    if "eplb_num_slots" in wc:
        ledger.carry("worker_config.eplb_num_slots")


def _traffic(seq: dict, ledger: Ledger) -> dict:
    traffic = {}
    for src, dst in (("input_length", "max_input_len"), ("output_length", "max_output_len")):
        if isinstance(seq.get(src), int):
            traffic[dst] = seq[src]
            ledger.carry(f"sequence.{src}")
    return traffic


def _env(envs: dict, recipe: dict, roles: dict, ledger: Ledger) -> None:
    env = env_mapping(envs.get("worker_env_var"), "environment.worker_env_var", ledger)
    for role in roles.values():
        if env:
            role.setdefault("env", {}).update(env)
    server_env = env_mapping(envs.get("server_env_var"), "environment.server_env_var", ledger)
    if server_env:
        recipe.setdefault("proxy", {})["env"] = server_env
