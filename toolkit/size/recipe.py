"""The chosen candidate as a tk recipe (schema_version 1), re-checked by tk's own recipe and plan stages."""

from __future__ import annotations

import os
import re

import yaml

from toolkit.facts.models import ModelSpec, quant_name
from toolkit.size.aiconfigurator import PINNED
from toolkit.size.candidates import Candidate
from toolkit.size.transfer import kv_dtype_of

TOKENS_PER_BLOCK = 32  # kv_transfer.tokens_per_block of every recipe tk size writes


def _name(model: str, c: Candidate, system: str) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", model.rstrip("/").split("/")[-1]).strip("-._").lower() or "model"
    return f"{base[:36]}-{c.ctx.workers}p{c.gen.workers}d-{system}"[:64].strip("-._")


def weights_quantization(model: ModelSpec, c: Candidate) -> str | None:
    """The checkpoint quantization the candidate was estimated with, when it is not the model's own (the recipe
    then says so: the servers must load such a checkpoint)."""
    role = c.ctx
    name = quant_name(role.moe if model.is_moe and role.moe else role.gemm)
    own = model.quantization or quant_name(model.dtype) or "bfloat16"
    return name if name and name != own and not (name in ("fp8", "fp8_block") and own in ("fp8", "fp8_block")) \
        else None


def model_field(result) -> str:
    """The recipe's ``model``: a built-in name, a Hugging Face id as given, or a local directory as an absolute
    path. A recipe reads a relative model path from its own directory (toolkit.recipe.loader.LoadedRecipe.base_dir),
    not from where tk size ran, so ``--model ./DIR`` is written as the directory it named here."""
    model = result.model
    if model.source == "built-in":
        return model.name
    given = os.path.expanduser(result.model_arg)
    return os.path.abspath(given) if os.path.isdir(given) else result.model_arg


def write_recipe(result, c: Candidate, *, gpu: str, gpus_per_node: int, name: str | None = None) -> str:
    """YAML text of a recipe for candidate ``c`` (one tk can express: ``c.why_not()`` is ""), with comments that
    say where it came from."""
    # Roles share nodes when the budget fits one node, or when packing each role on nodes of its own would take
    # more GPUs than the budget (6 single-GPU context servers + 5 TP2 generation servers on 16 GPUs).
    own_nodes = sum(-(-role.gpus // gpus_per_node) for role in (c.ctx, c.gen)) * gpus_per_node
    share = c.gpus_used <= gpus_per_node or own_nodes > result.gpus
    kv_dtype = kv_dtype_of(c.kvcache)
    model = result.model
    recipe: dict = {
        "schema_version": 1,
        "name": name or _name(model.name, c, result.system),
        "description": f"sized by tk size (aiconfigurator {PINNED}): {c.shape()}, ISL {result.isl} / OSL {result.osl}",
        "model": model_field(result),
    }
    quant = weights_quantization(model, c)
    if quant:
        recipe["quantization"] = quant
    recipe["cluster"] = {"gpus_per_node": gpus_per_node, "gpu": gpu, **({"share_nodes": True} if share else {})}
    recipe["context"] = c.ctx.recipe_fields(model.is_moe, prefill_isl=result.isl, tokens_per_block=TOKENS_PER_BLOCK)
    recipe["generation"] = c.gen.recipe_fields(model.is_moe)
    recipe["kv_transfer"] = {"backend": "NIXL", "transport": result.transport, "tokens_per_block": TOKENS_PER_BLOCK,
                             "dtype": kv_dtype}
    recipe["traffic"] = {"max_input_len": result.isl, "max_output_len": result.osl}
    bw = result.bandwidth
    gemm = c.ctx.gemm + (f", MoE {c.ctx.moe}" if model.is_moe and c.ctx.moe else "")
    head = [
        f"Written by tk size from aiconfigurator {PINNED}'s search (TensorRT-LLM {c.trtllm_version} data) for",
        f"  {model.name} on {result.gpus} x {result.system}, ISL {result.isl}, OSL {result.osl},",
        f"  SLA TTFT <= {result.ttft_ms:g} ms, TPOT <= {result.tpot_ms:g} ms.",
        f"Predicted: TTFT {c.ttft_total_ms:.1f} ms (aiconfigurator {c.ttft_ms:.1f} ms + KV transfer "
        f"{c.transfer_ms:.2f} ms at {bw.gbps:g} GB/s, {bw.source}"
        f"{', per request: gather + WRITE + scatter' if bw.basis == 'request' else ''}),",
        f"  TPOT {c.tpot_ms:.2f} ms, {c.tokens_s_gpu:.1f} tokens/s/GPU, {c.tokens_s_user:.1f} tokens/s/user, "
        f"concurrency {c.concurrency} per replica x {c.replicas}.",
        f"  gemm {gemm}, KV cache {c.kvcache}; {c.gpus_used} of {result.gpus} GPUs used.",
    ]
    if c.ctx.dp > 1 or c.gen.dp > 1:
        head.append("  Attention DP (attention_dp: true): max_batch_size is each rank's batch; tp is the ranks.")
    if c.ctx.batch > 1:
        head.append(f"  Context max_num_tokens holds its batch of {c.ctx.batch} whole {result.isl}-token prompts, "
                    "prefilled together as sized.")
    head += [
        "A prediction, not a measurement: validate the fabric (tk validate cluster) and benchmark before trusting it.",
        "Set model_path (and container_image, partition, account) for your cluster before launching.",
    ]
    body = yaml.safe_dump(recipe, sort_keys=False, default_flow_style=False, width=120)
    return "".join(f"# {line}\n" for line in head) + body


def deployed(plan) -> dict:
    """What a plan deploys, per role, in the terms of a candidate's row (toolkit/size/candidates.py)."""
    out = {}
    for title, role in (("context", plan.context), ("generation", plan.generation)):
        out[title] = {"instances": len(role.instances), "GPUs per instance": role.gpus_per_instance,
                      "tp": role.tp, "pp": role.pp, "attention_dp": role.attention_dp, "ep": role.ep,
                      "moe_tp": role.moe_tp, "max_batch_size": role.llm_api_options.get("max_batch_size")}
    out["context"]["max_num_tokens"] = plan.context.llm_api_options.get("max_num_tokens")
    out["GPUs"] = plan.context.gpu_count + plan.generation.gpu_count
    return out


def expected(c: Candidate, isl: int) -> dict:
    """What the row asks for, in the same terms as ``deployed``; the context servers' max_num_tokens holds their
    batch of whole ``isl``-token prompts (aiconfigurator's (p)bs prefilled together)."""
    out = {}
    for title, role in (("context", c.ctx), ("generation", c.gen)):
        out[title] = {"instances": role.workers, "GPUs per instance": role.gpus_per_worker,
                      "tp": role.tp * role.dp, "pp": role.pp, "attention_dp": role.dp > 1,
                      "ep": role.moe_ep if c.is_moe else None, "moe_tp": role.moe_tp if c.is_moe else None,
                      "max_batch_size": role.batch}
    out["context"]["max_num_tokens"] = c.ctx.prefill_tokens(isl, TOKENS_PER_BLOCK)
    out["GPUs"] = c.gpus_used
    return out


def compare(plan, c: Candidate, isl: int | None = None) -> list[str]:
    """Every difference between what ``plan`` deploys and candidate ``c``'s row, sized for ``isl`` input tokens
    (default: the plan's traffic.max_input_len, which tk size writes as the ISL)."""
    got, want = deployed(plan), expected(c, isl or plan.traffic.max_input_len)
    diffs = []
    for title in ("context", "generation"):
        for key, value in want[title].items():
            if got[title][key] != value:
                diffs.append(f"{title} {key}: aiconfigurator {value}, the recipe {got[title][key]}")
    if got["GPUs"] != want["GPUs"]:
        diffs.append(f"GPUs: aiconfigurator {want['GPUs']}, the recipe {got['GPUs']}")
    return diffs


def recheck(text: str, c: Candidate, result, output: str | None = None) -> dict:
    """Load the recipe text with tk's recipe and plan stages; every violation, warning and disagreement
    between what the recipe deploys and the candidate's row is returned (never dropped). ``ok``: no errors and
    no disagreement. ``output``: where the text will be written; its relative paths are then read from that
    file's directory, as a recipe's are (without it, from the working directory)."""
    from toolkit.errors import RecipeError
    from toolkit.plan import build_plan
    from toolkit.recipe.loader import load_recipe_text

    out: dict = {"ok": True, "errors": [], "warnings": [], "disagreements": [], "notes": []}
    try:
        plan = build_plan(load_recipe_text(text, output or "<tk size>"))
    except RecipeError as exc:
        out["ok"] = False
        out["errors"] = [f"{v.field}: {v.message}" for v in exc.violations]
        return out
    out["warnings"] = list(plan.warnings)
    out["disagreements"] = compare(plan, c, result.isl)
    gpus = plan.node_count * plan.slurm.gpus_per_node
    if gpus > result.gpus:
        out["disagreements"].append(f"tk's plan places the servers on {plan.node_count} node(s) = {gpus} GPUs, "
                                    f"more than the {result.gpus} GPUs sized for")
    if plan.estimates.transfer_dominates:
        out["notes"].append(
            f"tk's plan estimates the longest request's KV transfer ({plan.estimates.largest_request_transfer_ms:.1f} "
            f"ms) exceeds its prefill ({plan.estimates.largest_request_prefill_ms:.1f} ms)")
    out["ok"] = not out["disagreements"]
    out["deployed"] = deployed(plan)
    out["plan"] = {"nodes": plan.node_count, "trtllm_version": plan.trtllm_version,
                   "bytes_per_token_per_ctx_rank": plan.kv.ctx_bytes_per_token_per_rank,
                   "memory": {role.title: {"weights_gib": round(role.memory.weights_bytes / (1 << 30), 1),
                                           "kv_pool_tokens": role.memory.kv_pool_tokens}
                              for role in plan.roles if role.memory is not None}}
    return out


def check_output(path: str) -> None:
    """Refuse, before any search, an -o that write_file would refuse (a device, a FIFO, a directory, a symlink)."""
    from toolkit.errors import TkError
    from toolkit.runtime import files

    try:
        files.refuse_unless_regular(path)
    except files.FileProblem as exc:
        raise TkError(f"-o {exc}; nothing was written") from None
    except OSError as exc:  # a parent that is a file, a directory that cannot be searched
        raise TkError(f"{path}: cannot write the recipe there ({exc.strerror or exc}); give -o a writable path") \
            from None


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
