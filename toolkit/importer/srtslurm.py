"""NVIDIA/srt-slurm's TensorRT-LLM recipes (``backend: {type: trtllm}``) as tk recipes.

The format, as srtctl reads it (NVIDIA/srt-slurm @ c88ef731636890ff6385a783e152c1790e15b194,
src/srtctl/backends/trtllm.py and the recipes under recipes/trtllm/): ``model`` (path, container, precision),
``resources`` (gpu_type, gpus_per_node, prefill/decode workers and nodes), ``backend`` (prefill_environment,
decode_environment, trtllm_config.prefill / .decode: the options each worker's --extra-engine-args / --config file
gets, numa_memory_bind), ``benchmark`` (isl, osl, ...), ``frontend``, ``dynamo``, ``sbatch_directives``,
``srun_options``. srtctl prefixes gb200/gb300 workers with ``numactl -m 0,1`` (numa_memory_bind None), always
wraps them in trtllm-llmapi-launch, and serves through Dynamo's frontend or ``trtllm-serve disaggregated``
(frontend.type trtllm_serve); tk always runs the latter.
"""

from __future__ import annotations

from toolkit.facts.models import BUILTIN_MODELS, FOUR_BIT
from toolkit.importer.common import (Ledger, drop_known, env_mapping, finish_roles, gpu_name, launcher_for, model_name,
                                     role_options, section, transport_for)

KIND = "srt-slurm"
ROLES = {"prefill": "context", "decode": "generation"}

# srt-slurm model paths tk sizes as one of its built-in models (beyond what common.model_name finds): srtslurm.yaml
# aliases and Hugging Face ids of NVIDIA/srt-slurm recipes (@ c88ef731; the Kimi-K2.5 ones @ 7eef3dfd, K2.6 @
# 161e476a). Kimi-K2.5/2.6 keep Kimi-K2's language model (61 layers, MLA): tk sizes them as Kimi-K2-Instruct.
MODELS = {"nvidia/Kimi-K2.5-NVFP4": "moonshotai/Kimi-K2-Instruct", "nvidia/Kimi-K2.6-NVFP4": "moonshotai/Kimi-K2-Instruct"}
# Aliases that name the weights whatever `precision` says: dsr1-fp8 is DeepSeek's own FP8 (block-scaled) checkpoint.
ALIAS_WEIGHTS = {"dsr1-fp8": "fp8_block"}


def srt_model(path: str, precision) -> tuple[str, str | None, str | None]:
    """(the model tk sizes, the path the servers load when it is not that, the weights' quantization) of a srt-slurm
    recipe's model.path and model.precision. srtctl's precision is the checkpoint's family, not its format: "fp4" is
    NVIDIA's NVFP4 (nvidia/*-NVFP4 checkpoints) except for a model whose own checkpoint is another 4-bit format
    (gpt-oss: MXFP4, quant_method mxfp4 in its config.json; facts.models); "fp8" is the checkpoint's FP8 flavour
    (DeepSeek-R1's block-scaled FP8). Shared with tests/fixtures/srt_slurm/derive.py."""
    text = str(path).strip()
    if text.removeprefix("hf:") in MODELS:
        name, served = MODELS[text.removeprefix("hf:")], text.removeprefix("hf:")
    else:
        name, served = model_name(text)
    if precision is None:
        return name, served, None
    own = BUILTIN_MODELS[name].quantization if name in BUILTIN_MODELS else ""
    wanted = str(precision)
    if text in ALIAS_WEIGHTS:
        quant = ALIAS_WEIGHTS[text]
    elif wanted == "fp4":
        quant = own if own in FOUR_BIT else "nvfp4"
    elif wanted == "fp8":
        quant = own if own.startswith("fp8") else "fp8"
    else:
        quant = wanted
    return name, served, quant


def looks_like(doc: dict) -> bool:
    backend = doc.get("backend")
    return isinstance(backend, dict) and backend.get("type") == "trtllm" and "trtllm_config" in backend


MACHINERY = ("srtctl's own deployment machinery (Dynamo, NATS/etcd, health polling): tk runs and supervises the "
             "deployment itself")
WORKER_SETTING = "a srtctl/Dynamo worker setting tk has no counterpart for"
# Source paths srtctl reads that tk does not carry, with the reason.
DROPPED = {"dynamo": MACHINERY, "health_check": MACHINERY, "infra": MACHINERY,
           "backend.publish_events_and_metrics": WORKER_SETTING, "backend.sequential_node_start": WORKER_SETTING}
# Placement srtctl computes that tk derives itself from tp x pp and gpus_per_node.
PLACEMENT = ("prefill_nodes", "decode_nodes", "gpus_per_prefill", "gpus_per_decode")


def convert(doc: dict, ledger: Ledger) -> dict:
    model = section(doc, "model")
    res = section(doc, "resources")
    backend = section(doc, "backend")
    configs = section(backend, "trtllm_config", "backend")
    if configs.get("aggregated") or res.get("agg_workers"):
        raise ValueError("an aggregated-only srt-slurm recipe (resources.agg_workers, trtllm_config.aggregated): tk "
                         "deploys disaggregated serving, and runs the aggregated baseline of a disaggregated recipe "
                         "(tk launch --aggregated)")
    missing = [r for r in ROLES if not isinstance(configs.get(r), dict)]
    if missing:
        raise ValueError(f"backend.trtllm_config has no {' / '.join(missing)} section")
    recipe: dict = {"schema_version": 1, "name": str(doc.get("name") or "imported")}
    ledger.carry("name")
    ledger.carry("backend.type")  # what makes it a TensorRT-LLM recipe (looks_like)
    recipe.update(_model(model, ledger))
    gpu = gpu_name(res.get("gpu_type"))
    recipe["cluster"] = _cluster(doc, model, res, gpu, ledger)
    roles, per_role, where = {}, {}, {}
    for src_name, title in ROLES.items():
        where[title] = f"backend.trtllm_config.{src_name}"
        roles[title], per_role[title] = _role(src_name, title, configs[src_name], res, backend, gpu, ledger)
    kv = finish_roles(recipe, roles, per_role, where, ledger)
    kv["transport"] = transport_for(gpu, recipe, ledger)
    traffic = _traffic(section(doc, "benchmark"), ledger)
    if traffic:
        recipe["traffic"] = traffic
    for key in PLACEMENT:
        if key in res:
            ledger.notes.append(f"resources.{key} = {res[key]}: tk places the servers itself from tp x pp and "
                                "gpus_per_node (tk plan shows the nodes)")
            ledger.carry(f"resources.{key}")
    frontend = section(doc, "frontend")
    if frontend.get("type") not in (None, "trtllm_serve"):
        ledger.drop("frontend", frontend, "tk serves through TensorRT-LLM's own proxy (trtllm-serve disaggregated) "
                    "and trtllm-serve workers, not the Dynamo frontend and dynamo.trtllm workers")
    elif frontend:
        ledger.carry("frontend")
    drop_known(doc, DROPPED, ledger)
    return recipe


def _model(model: dict, ledger: Ledger) -> dict:
    out: dict = {}
    path = str(model.get("path", ""))
    name, served, quant = srt_model(path, model.get("precision"))
    out["model"] = name
    if served is not None and "/" in served.removeprefix("hf:"):
        out["model_path"] = served.removeprefix("hf:")
        ledger.notes.append(f"model.path {path!r} is sized as {name}, tk's built-in of the same architecture")
    elif served is not None:
        out["model_path"] = served
        ledger.notes.append(f"model.path {path!r} is a srt-slurm model alias (srtslurm.yaml model_paths) for "
                            f"{name}; set model_path to the checkpoint directory the servers load")
    ledger.carry("model.path")
    if quant is not None:
        out["quantization"] = quant
        ledger.carry("model.precision")
    return out


def _flags(mapping: dict) -> list[str]:
    return [f"--{k}={v}" if v not in (None, "") else f"--{k}" for k, v in mapping.items()]


def _cluster(doc: dict, model: dict, res: dict, gpu: str | None, ledger: Ledger) -> dict:
    cluster: dict = {}
    if gpu:
        cluster["gpu"] = gpu
        ledger.carry("resources.gpu_type")
    elif res.get("gpu_type") is not None:
        ledger.drop("resources.gpu_type", res["gpu_type"], "a GPU tk has no facts for")
    if res.get("gpus_per_node") is not None:
        cluster["gpus_per_node"] = res["gpus_per_node"]
        ledger.carry("resources.gpus_per_node")
    identity = section(section(doc, "identity"), "container", "identity")
    container = model.get("container") or identity.get("image")
    if container:
        cluster["container_image"] = str(container)
        ledger.carry("model.container" if model.get("container") else "identity.container.image")
        if "/" not in str(container) and "#" not in str(container):
            ledger.notes.append(f"model.container {container!r} is a srtctl container alias (srtslurm.yaml "
                                "containers); set cluster.container_image to the image it names")
    for src, dst in (("sbatch_directives", "sbatch_args"), ("srun_options", "srun_args")):
        flags = _flags(section(doc, src))
        if flags:
            cluster[dst] = flags
            ledger.carry(src)
    return cluster


def _role(src_name: str, title: str, options: dict, res: dict, backend: dict, gpu: str | None,
          ledger: Ledger) -> tuple[dict, dict]:
    where = f"backend.trtllm_config.{src_name}"
    ledger.role_sources[title] = dict(options)
    role, rest = role_options(options, title, where, ledger)
    role["instances"] = res.get(f"{src_name}_workers", 1)
    ledger.carry(f"resources.{src_name}_workers")
    env = env_mapping(backend.get(f"{src_name}_environment"), f"backend.{src_name}_environment", ledger)
    if env:
        role["env"] = env
    prefix = launcher_for(gpu, backend.get("numa_memory_bind"))
    if prefix:
        role["launcher_prefix"] = prefix
        ledger.carry("backend.numa_memory_bind" if "numa_memory_bind" in backend else "resources.gpu_type")
    elif "numa_memory_bind" in backend:
        ledger.carry("backend.numa_memory_bind")  # false: no prefix, which is what tk writes
    return role, rest


def _traffic(bench: dict, ledger: Ledger) -> dict:
    traffic = {}
    for key, fld in (("isl", "max_input_len"), ("osl", "max_output_len")):
        if isinstance(bench.get(key), int) and not isinstance(bench.get(key), bool):
            traffic[fld] = bench[key]
            ledger.carry(f"benchmark.{key}")
        elif key in bench:
            ledger.drop(f"benchmark.{key}", bench[key], f"not a whole number of tokens for traffic.{fld}")
    for key, value in bench.items():
        if key not in ("isl", "osl"):
            ledger.drop(f"benchmark.{key}", value, "srtctl's benchmark settings: run tk bench with its own options")
    return traffic
