"""A `trtllm-serve disaggregated -c` config that also carries the servers' options (TensorRT-LLM's disaggregated
examples and integration-test configs, tests/integration/defs/disaggregated/test_configs/*.yaml) as a tk recipe.

extract_disagg_cfg (tensorrt_llm/llmapi/disagg_utils.py @ 0228a71223416496ff056a157936bad2e42c762f) copies every
top-level key it does not name into both server sections (a key set in both places must agree), and reads
num_instances, urls and router of each section; the rest of a section are that role's LLM-API options.
"""

from __future__ import annotations

from toolkit.facts import llm_args, versions
from toolkit.facts.trtllm import Router
from toolkit.importer.common import Ledger, finish_roles, model_name, role_options, section, transport_for

KIND = "trtllm-disagg"
ROLES = {"context_servers": "context", "generation_servers": "generation"}
# Top-level keys the test harness passes to trtllm-serve as flags rather than options.
FLAG_KEYS = {"free_gpu_memory_fraction": "kv_cache_config.free_gpu_memory_fraction"}


def looks_like(doc: dict) -> bool:
    return isinstance(doc.get("context_servers"), dict) and isinstance(doc.get("generation_servers"), dict)


# Proxy keys tk carries into the recipe's proxy section: source key -> proxy field (whole numbers).
PROXY_FIELDS = {"port": "port", "max_retries": "max_retries", "perf_metrics_max_requests": "perf_metrics_max_requests"}


def convert(doc: dict, ledger: Ledger, line: str | None = None) -> dict:
    """``line``: whose proxy keys the top level is read with (default: the newest line's, which has them all)."""
    proxy_keys = set(llm_args.proxy(line or versions.supported()[-1]).get("top", ())) | {"backend", "model"}
    recipe: dict = {"schema_version": 1, "name": "imported"}
    model, served = model_name(str(doc.get("model") or ""))
    recipe["model"] = model
    if doc.get("model"):
        ledger.carry("model")
    if served:
        recipe["model_path"] = served
    inherited = {k: v for k, v in doc.items() if k not in proxy_keys}
    proxy = _proxy(doc, proxy_keys, ledger)
    roles, per_role, where = {}, {}, {}
    for servers, title in ROLES.items():
        where[title] = servers
        roles[title], per_role[title] = _role(doc, servers, title, inherited, proxy, ledger)
    for key in inherited:
        ledger.carry(key)
    kv = finish_roles(recipe, roles, per_role, where, ledger)
    kv["transport"] = transport_for(None, recipe, ledger)  # the config names no GPU or fabric
    if proxy:
        recipe["proxy"] = proxy
    recipe["cluster"] = {"gpus_per_node": 8}
    ledger.notes.append("the config names no cluster: cluster.gpus_per_node is 8; set cluster.gpu, partition and "
                        "the container image")
    return recipe


def _proxy(doc: dict, proxy_keys: set, ledger: Ledger) -> dict:
    proxy: dict = {}
    for key, fld in PROXY_FIELDS.items():
        if isinstance(doc.get(key), int) and not isinstance(doc.get(key), bool):
            proxy[fld] = doc[key]
            ledger.carry(key)
    if "hostname" in doc:
        ledger.drop("hostname", doc["hostname"], "tk runs the proxy on the allocation's first node")
    cond = section(doc, "conditional_disagg_config")
    if isinstance(cond.get("max_local_prefill_length"), int):
        proxy["conditional_max_local_prefill_length"] = cond["max_local_prefill_length"]
        ledger.carry("conditional_disagg_config")
    for key in proxy_keys - {"hostname", *PROXY_FIELDS, "conditional_disagg_config", *ROLES, "backend", "model"}:
        if key in doc and not ledger.accounted(key):
            ledger.drop(key, doc[key], "a proxy setting tk does not carry (see docs/recipe.md, proxy)")
    if doc.get("backend") not in (None, "pytorch"):
        ledger.drop("backend", doc["backend"], "tk serves the pytorch backend only")
    elif "backend" in doc:
        ledger.carry("backend")
    return proxy


def _role(doc: dict, servers: str, title: str, inherited: dict, proxy: dict, ledger: Ledger) -> tuple[dict, dict]:
    src = dict(doc[servers])
    for key, value in inherited.items():  # extract_disagg_cfg: the top level is inherited by both sections
        target = FLAG_KEYS.get(key, key)
        if target != key:
            src.setdefault("kv_cache_config", {}).setdefault(target.split(".", 1)[1], value)
        else:
            src.setdefault(key, value)
    ledger.role_sources[title] = {k: v for k, v in src.items() if k not in ("num_instances", "urls", "router")}
    instances = src.pop("num_instances", 1)
    src.pop("urls", None)
    router = src.pop("router", None)
    role, rest = role_options(src, title, servers, ledger)
    role["instances"] = instances
    ledger.carry(f"{servers}.num_instances")
    if "urls" in doc[servers]:
        ledger.notes.append(f"{servers}.urls: tk places the servers and writes the urls itself")
        ledger.carry(f"{servers}.urls")
    if isinstance(router, dict):
        args = dict(router)
        prefix = "context" if title == "context" else "generation"
        proxy[f"{prefix}_router"] = args.pop("type", Router.ROUND_ROBIN.value)
        args.pop("tokens_per_block", None)  # tk writes the servers' own
        if args:
            proxy[f"{prefix}_router_args"] = args
        ledger.carry(f"{servers}.router")
    return role, rest
