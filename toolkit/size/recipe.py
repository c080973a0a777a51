"""The chosen candidate as a tk recipe (schema_version 1), re-checked by tk's own recipe and plan stages."""

from __future__ import annotations

import re

import yaml

from toolkit.size.aiconfigurator import PINNED, Candidate
from toolkit.size.transfer import kv_dtype_of


def _name(model: str, c: Candidate, system: str) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", model.rstrip("/").split("/")[-1]).strip("-._").lower() or "model"
    return f"{base[:36]}-{c.ctx_instances}p{c.gen_instances}d-{system}"[:64].strip("-._")


def write_recipe(result, c: Candidate, *, gpu: str, gpus_per_node: int, name: str | None = None) -> str:
    """YAML text of a recipe for candidate ``c``, with comments that say where it came from."""
    share = c.gpus_used <= gpus_per_node
    kv_dtype = kv_dtype_of(c.kvcache)
    recipe: dict = {
        "schema_version": 1,
        "name": name or _name(result.model.name, c, result.system),
        "description": f"sized by tk size (aiconfigurator {PINNED}): {c.shape()}, ISL {result.isl} / OSL {result.osl}",
        "model": result.model_arg if result.model.source != "built-in" else result.model.name,
    }
    if c.gemm in ("fp8", "nvfp4"):
        recipe["quantization"] = c.gemm
    recipe["cluster"] = {"gpus_per_node": gpus_per_node, "gpu": gpu, **({"share_nodes": True} if share else {})}
    recipe["context"] = {"instances": c.ctx_instances, "tp": c.ctx_tp, **({"pp": c.ctx_pp} if c.ctx_pp > 1 else {}),
                         "max_batch_size": c.ctx_batch}
    recipe["generation"] = {"instances": c.gen_instances, "tp": c.gen_tp,
                            **({"pp": c.gen_pp} if c.gen_pp > 1 else {}), "max_batch_size": c.gen_batch}
    recipe["kv_transfer"] = {"backend": "NIXL", "transport": result.transport, "tokens_per_block": 32,
                             "dtype": kv_dtype}
    recipe["traffic"] = {"max_input_len": result.isl, "max_output_len": result.osl}
    bw = result.bandwidth
    head = [
        f"Written by tk size from aiconfigurator {PINNED}'s search (TensorRT-LLM {c.trtllm_version} data) for",
        f"  {result.model.name} on {result.gpus} x {result.system}, ISL {result.isl}, OSL {result.osl},",
        f"  SLA TTFT <= {result.ttft_ms:g} ms, TPOT <= {result.tpot_ms:g} ms.",
        f"Predicted: TTFT {c.ttft_total_ms:.1f} ms (aiconfigurator {c.ttft_ms:.1f} ms + KV transfer "
        f"{c.transfer_ms:.2f} ms at {bw.gbps:g} GB/s, {bw.source}),",
        f"  TPOT {c.tpot_ms:.2f} ms, {c.tokens_s_gpu:.1f} tokens/s/GPU, {c.tokens_s_user:.1f} tokens/s/user, "
        f"concurrency {c.concurrency} per replica x {c.replicas}.",
        f"  gemm {c.gemm}, KV cache {c.kvcache}; {c.gpus_used} of {result.gpus} GPUs used.",
        "A prediction, not a measurement: validate the fabric (tk validate cluster) and benchmark before trusting it.",
        "Set model_path (and container_image, partition, account) for your cluster before launching.",
    ]
    body = yaml.safe_dump(recipe, sort_keys=False, default_flow_style=False, width=120)
    return "".join(f"# {line}\n" for line in head) + body


def recheck(text: str, c: Candidate, result) -> dict:
    """Load the recipe text with tk's recipe and plan stages; every violation, warning and disagreement
    between tk's plan and the candidate is returned (never dropped)."""
    from toolkit.errors import RecipeError
    from toolkit.plan import build_plan
    from toolkit.recipe.loader import load_recipe_text

    out: dict = {"ok": True, "errors": [], "warnings": [], "disagreements": []}
    try:
        plan = build_plan(load_recipe_text(text, "<tk size>"))
    except RecipeError as exc:
        out["ok"] = False
        out["errors"] = [str(v) for v in exc.violations]
        return out
    out["warnings"] = list(plan.warnings)
    got = {"context instances": len(plan.context.instances), "context tp": plan.context.tp,
           "context max_batch_size": plan.context.llm_api_options.get("max_batch_size"),
           "generation instances": len(plan.generation.instances), "generation tp": plan.generation.tp,
           "generation max_batch_size": plan.generation.llm_api_options.get("max_batch_size")}
    want = {"context instances": c.ctx_instances, "context tp": c.ctx_tp, "context max_batch_size": c.ctx_batch,
            "generation instances": c.gen_instances, "generation tp": c.gen_tp,
            "generation max_batch_size": c.gen_batch}
    for key, value in want.items():
        if got[key] != value:
            out["disagreements"].append(f"{key}: aiconfigurator {value}, tk's plan {got[key]}")
    gpus = plan.node_count * plan.slurm.gpus_per_node
    if gpus > result.gpus:
        out["disagreements"].append(f"tk's plan places the servers on {plan.node_count} node(s) = {gpus} GPUs, "
                                    f"more than the {result.gpus} GPUs sized for")
    if plan.estimates.transfer_dominates:
        out["disagreements"].append(
            f"tk's plan estimates the longest request's KV transfer ({plan.estimates.largest_request_transfer_ms:.1f} "
            f"ms) exceeds its prefill ({plan.estimates.largest_request_prefill_ms:.1f} ms)")
    out["ok"] = not out["disagreements"]
    out["plan"] = {"nodes": plan.node_count, "trtllm_version": plan.trtllm_version,
                   "bytes_per_token_per_ctx_rank": plan.kv.ctx_bytes_per_token_per_rank}
    return out


def write_file(path: str, text: str) -> None:
    """Write the recipe as a regular file, whole (a temporary file beside it, then a rename). Whatever is at `path`
    must be a regular file or nothing: a device (`-o /dev/null`, even as root), a FIFO, a directory or a symlink is
    refused and left as it is (toolkit.runtime.files.write_regular_atomically)."""
    from toolkit.errors import TkError
    from toolkit.runtime import files

    try:
        files.write_regular_atomically(path, text, 0o644)
    except files.FileProblem as exc:
        raise TkError(f"-o {exc}; nothing was written") from None
    except OSError as exc:
        raise TkError(f"{path}: cannot write the recipe there ({exc.strerror or exc}); give -o a writable path") \
            from None
