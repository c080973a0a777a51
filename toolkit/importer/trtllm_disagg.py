"""A `trtllm-serve disaggregated -c` config that also carries the servers' options (TensorRT-LLM's disaggregated
examples and integration-test configs, tests/integration/defs/disaggregated/test_configs/*.yaml) as a tk recipe.

extract_disagg_cfg (tensorrt_llm/llmapi/disagg_utils.py @ 0228a71223416496ff056a157936bad2e42c762f) copies every
top-level key it does not name into both server sections (a key set in both places must agree), and reads
num_instances, urls and router of each section; the rest of a section are that role's LLM-API options.
"""

from __future__ import annotations

from toolkit.facts import llm_args
from toolkit.importer.common import (Ledger, model_name, role_options, section, shared_fields, speculative,
                                     transport_for)

KIND = "trtllm-disagg"
ROLES = {"context_servers": "context", "generation_servers": "generation"}
# Top-level keys the test harness passes to trtllm-serve as flags rather than options.
FLAG_KEYS = {"free_gpu_memory_fraction": "kv_cache_config.free_gpu_memory_fraction"}


def looks_like(doc: dict) -> bool:
    return isinstance(doc.get("context_servers"), dict) and isinstance(doc.get("generation_servers"), dict)


def convert(doc: dict, ledger: Ledger, line: str = "1.3") -> dict:
    proxy_keys = set(llm_args.proxy(line).get("top", ())) | {"backend", "model"}
    recipe: dict = {"schema_version": 1, "name": "imported"}
    model, served = model_name(str(doc.get("model") or ""))
    recipe["model"] = model
    if doc.get("model"):
        ledger.carry("model")
    if served:
        recipe["model_path"] = served
    inherited = {k: v for k, v in doc.items() if k not in proxy_keys}
    proxy: dict = {}
    if isinstance(doc.get("port"), int):
        proxy["port"] = doc["port"]
        ledger.carry("port")
    if "hostname" in doc:
        ledger.drop("hostname", doc["hostname"], "tk runs the proxy on the allocation's first node")
    if isinstance(doc.get("max_retries"), int):
        proxy["max_retries"] = doc["max_retries"]
        ledger.carry("max_retries")
    if isinstance(doc.get("perf_metrics_max_requests"), int):
        proxy["perf_metrics_max_requests"] = doc["perf_metrics_max_requests"]
        ledger.carry("perf_metrics_max_requests")
    cond = section(doc, "conditional_disagg_config")
    if isinstance(cond.get("max_local_prefill_length"), int):
        proxy["conditional_max_local_prefill_length"] = cond["max_local_prefill_length"]
        ledger.carry("conditional_disagg_config")
    for key in proxy_keys - {"hostname", "port", "max_retries", "perf_metrics_max_requests",
                             "conditional_disagg_config", "context_servers", "generation_servers", "backend", "model"}:
        if key in doc:
            ledger.drop(key, doc[key], "a proxy setting tk does not carry (see docs/recipe.md, proxy)")
    if doc.get("backend") not in (None, "pytorch"):
        ledger.drop("backend", doc["backend"], "tk serves the pytorch backend only")
    elif "backend" in doc:
        ledger.carry("backend")
    per_role, roles, where = {}, {}, {}
    for servers, title in ROLES.items():
        src = dict(doc[servers])
        where[title] = servers
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
        role, rest = role_options(src, title, where[title], ledger)
        role["instances"] = instances
        ledger.carry(f"{servers}.num_instances")
        if "urls" in doc[servers]:
            ledger.notes.append(f"{servers}.urls: tk places the servers and writes the urls itself")
            ledger.carry(f"{servers}.urls")
        if isinstance(router, dict):
            args = dict(router)
            rtype = args.pop("type", "round_robin")
            prefix = "context" if title == "context" else "generation"
            proxy[f"{prefix}_router"] = rtype
            args.pop("tokens_per_block", None)  # tk writes the servers' own
            if args:
                proxy[f"{prefix}_router_args"] = args
            ledger.carry(f"{servers}.router")
        per_role[title], roles[title] = rest, role
    for key in inherited:
        ledger.carry(key)
    kv = shared_fields(per_role, where, ledger)
    spec = speculative(per_role, where, ledger)
    for title in ROLES.values():
        if per_role[title]:
            roles[title]["extra_options"] = per_role[title]
        recipe[title] = roles[title]
    if "kv_transfer_timeout_ms" not in kv:
        kv["kv_transfer_timeout_ms"] = None
    kv["transport"] = transport_for(None, recipe, ledger)  # the config names no GPU or fabric
    recipe["kv_transfer"] = kv
    if spec:
        recipe["speculative"] = spec
    if proxy:
        recipe["proxy"] = proxy
    recipe["cluster"] = {"gpus_per_node": 8}
    ledger.notes.append("the config names no cluster: cluster.gpus_per_node is 8; set cluster.gpu, partition and "
                        "the container image")
    return recipe
