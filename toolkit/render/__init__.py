"""Stage 3: a Plan becomes the files of a deployment, through the jinja2 templates in templates/.

Rendering is deterministic (same plan, same bytes) and atomic: files are written into a
temporary directory beside the target and moved into place only when all of them are ready.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path


from toolkit.facts import trtllm
from toolkit.plan.model import Plan
from toolkit.render.escape import RenderError, environment, to_yaml  # noqa: F401 (re-exported)
from toolkit.render.job import JOB_ARCHIVE, JOB_SPEC, job_archive, job_spec
from toolkit.render.output import write_atomically

# The files `tk render` writes, in the order the manifest lists them. launch.sbatch only starts job.pyz (the
# orchestrator package, toolkit/render/job.py), which reads job.json.
RENDERED_FILES = ("ctx.yaml", "gen.yaml", "disagg.yaml", "ctx.env", "gen.env", "proxy.env", "launch.sbatch",
                  "job.json", "job.pyz", "check_config.py")
# An aggregated plan's (`--aggregated`): plain trtllm-serve instances, no proxy, no membership.
RENDERED_FILES_AGGREGATED = ("agg.yaml", "agg.env", "launch.sbatch", "job.json", "job.pyz", "check_config.py")
# The config check the job runs before any server starts (and `tk render --check` runs here): a standalone
# script, copied as it is (it imports only the standard library, PyYAML and, where installed, tensorrt_llm).
CHECK_SCRIPT = "check_config.py"
MANIFEST = "manifest.json"


def worker_command(plan: Plan, role_name: str, port: int) -> list[str]:
    """argv of one server, up to (not including) the options-file flag and path."""
    role = plan.role(role_name)
    flag = trtllm.SERVE_FLAG
    return [*role.launcher_prefix, *plan.engine.launcher, *plan.engine.serve_command, role.model_path, flag["host"],
            worker_host(plan, role_name, port), flag["port"], str(port), *membership_args(plan, role_name),
            *role.serve_args]


def worker_host(plan: Plan, role_name: str, port: int) -> str:
    """The worker's --host. With membership a worker registers exactly this host (TensorRT-LLM's
    DisaggClusterWorker(role, host, port)) and the proxy connects to it, so it is the worker's node as the
    proxy reaches it, `<nodeN>`, which the job resolves as it does in disagg.yaml (127.0.0.1 under
    `tk launch --local`). Without membership the proxy reaches the worker through disagg.yaml's urls, and the
    worker binds `<bindN>`: the job makes that all interfaces (0.0.0.0), or loopback where the node's own
    address is loopback (the local backend's nodes), so a local rehearsal listens on nothing but loopback."""
    server = next((s for s in plan.servers if s.role == role_name and s.port == port), None)
    if server is None:
        return "0.0.0.0"
    return f"<{'node' if plan.membership is not None else 'bind'}{server.first_node}>"


def membership_args(plan: Plan, role_name: str) -> list[str]:
    """`--disagg_cluster_uri URI --server_role ROLE` where the plan has membership (names: facts.trtllm)."""
    if plan.membership is None:
        return []
    f = trtllm.MEMBERSHIP_FLAG
    return [f["uri"], plan.membership.cluster_uri, f["role"], trtllm.MEMBERSHIP_ROLES[role_name]]


def proxy_command(plan: Plan) -> list[str]:
    """argv of the proxy, up to (not including) `-c FILE`."""
    return [*plan.engine.serve_command, trtllm.PROXY_SUBCOMMAND, *plan.proxy.args]


def container_srun_flags(plan: Plan) -> list[str]:
    """pyxis flags that run a step in the recipe's container (none without one)."""
    flags = []
    if plan.slurm.container_image:
        flags.append(f"--container-image={plan.slurm.container_image}")
        if plan.slurm.container_mounts:
            flags.append(f"--container-mounts={','.join(plan.slurm.container_mounts)}")
        flags.append("--no-container-mount-home")
    return flags


def srun_flags(plan: Plan) -> list[str]:
    """Flags of every component's step and of the config check: the container, --mpi, the recipe's srun_args."""
    flags = container_srun_flags(plan)
    if plan.slurm.mpi:
        flags.append(f"--mpi={plan.slurm.mpi}")
    return flags + list(plan.slurm.srun_args)


def check_command(plan: Plan) -> list[str]:
    """argv of the config check after `python3 check_config.py`, up to the files (`--options FILE MODEL` per
    role and `--disagg FILE`, which the job and `tk render --check` add with their own paths)."""
    argv = ["--engine", plan.engine.name, "--line", plan.trtllm_version]
    for spec in trtllm.CONFIG_CHECK_MERGE:
        argv += ["--merge", spec]
    for spec in trtllm.CONFIG_CHECK_LLM_ARGS:
        argv += ["--llm-args", spec]
    for spec in trtllm.CONFIG_CHECK_DISAGG:
        argv += ["--disagg-parser", spec]
    if plan.engine.version_env:
        argv += ["--version-env", plan.engine.version_env]
    return argv


def check_script_text() -> str:
    from toolkit.resources import templates_dir
    return (templates_dir() / CHECK_SCRIPT).read_text()


def ucx_tls_note(plan: Plan, env: dict) -> str:
    """Why this env file sets UCX_TLS as it does (or leaves it to UCX): the transport profile's reason, or that the
    recipe's own value overrides the profile."""
    transport = plan.kv_transfer.transport
    mine = env.get("UCX_TLS")
    if mine is not None and mine != transport.ucx_tls(plan.engine.kv_memory):
        return f"set by the recipe's env; it overrides transport profile {transport.name}"
    return transport.ucx_tls_reason


def render_files(plan: Plan) -> dict[str, str | bytes]:
    """Every file of the deployment, name -> text (job.pyz: bytes), manifest included. Pure: writes nothing."""
    env = environment()
    recipe_name = os.path.basename(plan.recipe_file)
    common = {"plan": plan, "recipe_name": recipe_name}
    files = {f"{role.role}.yaml": env.get_template("llm_api_options.yaml.j2").render(role=role, **common)
             for role in plan.roles}
    if plan.proxy is not None:
        files["disagg.yaml"] = env.get_template("disagg.yaml.j2").render(**common)
    for role in plan.roles:
        files[f"{role.role}.env"] = env.get_template("role.env.j2").render(
            env=role.env, title=f"{role.title} servers", ucx_tls_note=ucx_tls_note(plan, role.env), **common)
    if plan.proxy is not None:
        files["proxy.env"] = env.get_template("role.env.j2").render(
            env=plan.proxy.env, title="proxy", ucx_tls_note=ucx_tls_note(plan, plan.proxy.env), **common)
    files["launch.sbatch"] = env.get_template("launch.sbatch.j2").render(
        ntasks_per_node=plan.slurm.gpus_per_node if plan.engine.uses_mpi else 1, sv=plan.supervision, **common)
    files[JOB_SPEC] = job_spec(plan).to_json()
    files[JOB_ARCHIVE] = job_archive()
    files[CHECK_SCRIPT] = check_script_text()
    files[MANIFEST] = manifest_text(plan, files)
    return files


def manifest(plan: Plan, files: dict[str, str | bytes]) -> dict:
    return {
        "manifest_version": 1,
        "name": plan.name,
        "toolkit_version": plan.toolkit_version,
        "trtllm_version": plan.trtllm_version,
        "trtllm_release": plan.trtllm_release,
        "engine": plan.engine.name,
        "recipe_file": os.path.basename(plan.recipe_file),
        "recipe": plan.recipe,
        # values the recipe file did not write (site defaults, --set), and where from; only where there are any
        **({"value_sources": {field: source for field, _, source in plan.value_sources}}
           if plan.value_sources else {}),
        "derived": derived_numbers(plan),
        "files": {name: hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()
                  for name, data in sorted(files.items())},
    }


def manifest_text(plan: Plan, files: dict[str, str | bytes]) -> str:
    return json.dumps(manifest(plan, files), indent=2, sort_keys=False) + "\n"


def derived_numbers(plan: Plan) -> dict:
    """The numbers tk worked out, with the reasons users ask for."""
    mode = {"mode": plan.mode} if plan.is_aggregated else {}  # a disaggregated plan's manifest is as before
    return {
        **mode,
        "model": asdict(plan.model),
        "kv": asdict(plan.kv),
        "max_tokens_in_buffer": plan.buffer.max_tokens_in_buffer,
        "max_tokens_in_buffer_reason": plan.buffer.reason,
        "estimates": asdict(plan.estimates),
        "nodes": plan.node_count,
        "gpu": plan.gpu,
        "quantization": plan.quantization,
        "roles": {
            role.title: {
                "instances": len(role.instances), "tp": role.tp, "pp": role.pp, "ep": role.ep,
                "moe_tp": role.moe_tp, "attention_dp": role.attention_dp,
                "gpus_per_instance": role.gpus_per_instance, "gpus": role.gpu_count, "nodes": role.node_count,
                "memory": memory_numbers(role.memory),
            } for role in plan.roles
        },
        "servers": [{"name": s.name, "role": s.role, "index": s.index, "nodes": list(s.nodes),
                     "gpus": list(s.gpus), "port": s.port, "internal_ports": dict(s.internal_ports),
                     "start_after": s.start_after} for s in plan.servers],
        "proxy": {"node": plan.proxy.node, "port": plan.proxy.port} if plan.proxy is not None else None,
        "membership": asdict(plan.membership) if plan.membership else None,
        "warnings": list(plan.warnings),
    }


def memory_numbers(m) -> dict | None:
    """A role's memory plan (plan.model.RoleMemory) as JSON: every field, and whether the pool holds one full
    sequence and the whole batch."""
    if m is None:
        return None
    doc = asdict(m)
    doc["weights_detail"] = dict(m.weights_detail)
    doc["notes"] = list(m.notes)
    doc["fits_sequence"], doc["fits_batch"] = m.fits_sequence, m.fits_batch
    return doc


def render(plan: Plan, out_dir: str | os.PathLike) -> tuple[Path, dict[str, str | bytes]]:

    files = render_files(plan)
    return write_atomically(files, out_dir), files


def check_rendered(plan: Plan, out_dir: str | os.PathLike, python: str | None = None,
                   timeout_s: float = trtllm.CONFIG_CHECK_TIMEOUT_S) -> tuple[str, str]:
    """Run the rendered check_config.py here (`tk render --check`): TensorRT-LLM's own classes where this Python
    imports tensorrt_llm, the stand-in's tables for a stand-in plan. The proxy config is checked in a copy whose
    <nodeN> placeholders read nodeN, as the job resolves them. Returns (status, message):

        ok        every file parsed and was accepted
        failed    the engine's own parser refused something (message: what)
        skipped   the check ran and said it cannot check here (tensorrt_llm not importable): NOT checked
        error     the check could not run or gave no verdict (timeout, missing interpreter, a crash): NOT checked

    The script runs in a scratch directory, so every path it is given is absolute (a relative output directory,
    `tk render RECIPE --check` with its default render/NAME, must be checked all the same)."""
    import re
    import subprocess
    import sys
    import tempfile

    out = Path(out_dir).resolve()
    with tempfile.TemporaryDirectory(prefix="tk-check-") as tmp:
        argv = [python or sys.executable, str(out / CHECK_SCRIPT), *check_command(plan)]
        for role in plan.roles:
            argv += ["--options", str(out / f"{role.role}.yaml"), role.model_path]
        if plan.proxy is not None:
            disagg = Path(tmp) / "disagg.yaml"
            disagg.write_text(re.sub(r"<node([0-9]+)>", r"node\1", (out / "disagg.yaml").read_text()))
            argv += ["--disagg", str(disagg)]
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, timeout=timeout_s, cwd=tmp)
        except subprocess.TimeoutExpired:
            return "error", f"the check did not finish in {timeout_s:.0f}s"
        except OSError as exc:
            return "error", f"the check could not run ({exc})"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("OK: ", "FAIL: ", "SKIP: "))]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or [""])[-1]
        return "error", f"the check gave no verdict (exit {proc.returncode}) {tail}".strip()
    kind, _, message = lines[-1].partition(": ")
    return {"OK": "ok", "FAIL": "failed", "SKIP": "skipped"}.get(kind, "error"), message
