"""Known failure signatures of TensorRT-LLM disaggregated serving (and of tk's own job), one row each.

Data only, like ``toolkit/facts``: `tk doctor` and a failed `tk launch` match these rows against a run's logs
and print the cause and the fix. A row names:

    id        a stable name (`tk doctor --json` reports it; tests refer to it)
    title     one line for people
    patterns  regular expressions (Python ``re``, searched line by line, case-sensitive unless (?i))
    where     which texts it is searched in: "server" (logs/ctx-*.log, logs/gen-*.log), "proxy" (logs/proxy.log),
              "job" (logs/job.log, slurm-*.out: the batch script and the Slurm/pyxis output) and "phases"
              (state/events.jsonl and the run record's reason: the job's own account of itself)
    cause     why it happens
    fix       what to change, in recipe terms where tk owns the setting
    source    where the error string and the explanation come from: upstream issues and pull requests (links),
              or the tool whose message it is
    after     a pattern that must match one of the AFTER_LINES lines before a matching line (a log table whose
              header names what a row means), or None
    header    with `after`: a pattern for the header line of every such table; a later header that `after` does not
              match ends the table `after` found, so the rows under another table's header are not claimed
    fix_when  (pattern, fix) pairs: where a line of the evidence (its file and text) matches the pattern, the fix is
              that one instead (the first that matches): one cause whose remedy depends on what failed
    secondary a consequence of an earlier failure, not a cause: shown after the others ("look further up")
    per_request  one client request the servers refused (a prompt too long, ...): the deployment is fine and keeps
              serving, so it is reported apart from the run's failures ("refused requests"), never as its diagnosis

A new signature is one row here plus one log excerpt under tests/fixtures/doctor/ (tests/unit/test_doctor.py
checks that every row has one, that its excerpt matches it, and that no other row claims it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from toolkit.facts.engines import ENGINES

# "<serve command>: error: ..." as any engine's server prints a refused option (names from the engine profiles)
_SERVE_ERROR = "(?:" + "|".join(sorted({re.escape(e.serve_command[0]) for e in ENGINES.values()})) + "): error: "

SERVER, PROXY, JOB, PHASES = "server", "proxy", "job", "phases"
LOGS = (SERVER, PROXY, JOB)
EVERYWHERE = (SERVER, PROXY, JOB, PHASES)


@dataclass(frozen=True)
class Signature:
    id: str
    title: str
    patterns: tuple[str, ...]
    where: tuple[str, ...]
    cause: str
    fix: str
    source: str
    secondary: bool = False
    per_request: bool = False
    after: str | None = None
    header: str | None = None
    fix_when: tuple[tuple[str, str], ...] = ()

    def fix_for(self, evidence: list[dict]) -> str:
        """The fix for this evidence: the first fix_when whose pattern a line of it matches, else `fix`."""
        for pattern, fix in self.fix_when:
            rx = re.compile(pattern)
            if any(rx.search(f"{e['file']} {e['text']}") for e in evidence):
                return fix
        return self.fix

    def compiled(self) -> tuple[re.Pattern, ...]:
        return _compiled(self)


AFTER_LINES = 8  # how far back a signature's `after` pattern is looked for


_CACHE: dict[str, tuple] = {}
_FLAGS = re.compile(r"\(\?[aiLmsux]+\)")


class Sequence:
    """A pattern `A.*B.*C` searched as A, then B after A, then C after B: the same lines as re.search of the whole
    (`.` never crosses a line, and the leftmost match of each part ends earliest for these literal-led parts), but
    linear in the line's length, where re's backtracking over `.*` is quadratic on a line full of A."""

    def __init__(self, pattern: str):
        flags = _FLAGS.match(pattern)
        prefix = flags.group(0) if flags else ""
        body = pattern[len(prefix):]
        self.pattern = pattern
        self.parts = tuple(re.compile(prefix + part) for part in body.split(".*"))

    def search(self, line: str):
        pos, first = 0, None
        for part in self.parts:
            m = part.search(line, pos)
            if m is None:
                return None
            first = first or m
            pos = m.end()
        return first


def _compiled(sig: Signature) -> tuple:
    if sig.id not in _CACHE:
        _CACHE[sig.id] = tuple(Sequence(p) if ".*" in p else re.compile(p) for p in sig.patterns)
    return _CACHE[sig.id]


SIGNATURES: tuple[Signature, ...] = (
    # --- the cache transceiver's configuration ------------------------------------------------------------
    Signature(
        id="transceiver-buffer-mismatch",
        title="context and generation transfer buffers differ (\"Message truncated\")",
        patterns=(r"Message truncated", r"UCS_ERR_MESSAGE_TRUNCATED"),
        where=(SERVER, PROXY, JOB),
        cause="the context and generation servers' cache_transceiver_config.max_tokens_in_buffer (or "
              "TRTLLM_KVCACHE_TRANSFER_BUFFER_SIZE) differ, so a KV message does not fit the receiving buffer",
        fix="give both roles the same buffer: set kv_transfer.max_tokens_in_buffer once in the recipe (tk writes it "
            "to ctx.yaml and gen.yaml alike), drop per-role overrides and TRTLLM_KVCACHE_TRANSFER_BUFFER_SIZE "
            "from the role env, re-render and relaunch",
        source="https://github.com/ai-dynamo/dynamo/pull/1572, https://github.com/NVIDIA/TensorRT-LLM/pull/9782",
    ),
    Signature(
        id="transceiver-disabled",
        title="cache transceiver disabled: no cache_transceiver_config on a role",
        patterns=(r"(?i)(kv_)?cache_transceiver is disabled", r"cache transceiver is\s+disabled"),
        where=(SERVER, PROXY),
        cause="a server started without cache_transceiver_config (or with backend unset), so it serves whole "
              "requests only and refuses the proxy's context_only / generation_only requests",
        fix="set an explicit cache_transceiver_config.backend on both roles (tk writes kv_transfer.backend into "
            "ctx.yaml and gen.yaml; check that an edited or hand-written options file kept it)",
        source="https://github.com/ai-dynamo/dynamo/pull/2278 (TensorRT-LLM >= 1.0.0rc4)",
    ),
    Signature(
        id="transceiver-buffer-misaligned",
        title="max_tokens_in_buffer is not a multiple of tokens_per_block",
        patterns=(r"maxNumTokens\.value\(\) % tokensPerBlock == 0",),
        where=(SERVER, JOB),
        cause="cache_transceiver_config.max_tokens_in_buffer is not a multiple of kv_cache_config.tokens_per_block; "
              "the transfer buffer asserts at start-up (cacheTransBuffer.cpp)",
        fix="make kv_transfer.max_tokens_in_buffer a multiple of kv_transfer.tokens_per_block, or leave it unset "
            "and let tk derive an aligned value",
        source="https://github.com/ai-dynamo/aiconfigurator/pull/375, https://github.com/ai-dynamo/aiconfigurator/pull/459",
    ),
    Signature(
        id="transceiver-buffer-too-small",
        title="transfer buffer smaller than a request's KV (\"Agent need all buffer pre-allocated\")",
        patterns=(r"bufferCoverTargetNum:\s*\d+\s*<\s*targetNum", r"may use dynamic buffer which will fail with NIXL",
                  r"Agent need (all )?buffer pre-allocated", r"does not fit the pre-allocated transfer buffer"),
        where=(SERVER,),
        cause="cache_transceiver_config.max_tokens_in_buffer is smaller than the prompt: the C++ transceiver's "
              "pre-allocated transfer buffer does not hold the request's KV, and over NIXL (or MOONCAKE) its agent "
              "connection has no dynamic-buffer fallback, so the request fails (TLLM_CHECK \"Agent need all buffer "
              "pre-allocated\" in CacheFormatter::format, cacheFormatter.cpp); tk plan refuses such a recipe",
        fix="raise kv_transfer.max_tokens_in_buffer to at least traffic.max_input_len (rounded up to "
            "tokens_per_block), or leave it unset so tk derives it; mind its GPU memory next to "
            "free_gpu_memory_fraction",
        source="https://github.com/ai-dynamo/dynamo/pull/5523, https://github.com/NVIDIA/TensorRT-LLM/issues/13506",
    ),
    Signature(
        id="kv-layout-mismatch",
        title="context and generation KV layouts differ (page size, tokens_per_block, dtype)",
        patterns=(r"Page size mismatch", r"refuses the KV of context server .*differs"),
        where=(SERVER, PROXY),
        cause="the two roles disagree on the KV layout (tokens_per_block / page size, KV dtype, model or layer "
              "count), so the generation side cannot take the context side's blocks",
        fix="give both roles the same kv_cache_config (tk writes kv_transfer.tokens_per_block and kv_transfer.dtype "
            "to both; remove per-role kv_cache_config overrides from extra_options)",
        source="https://github.com/NVIDIA/srt-slurm/issues/429; TensorRT-LLM CacheFormatter::inquireSupport",
    ),
    Signature(
        id="unknown-option-key",
        title="an option key this TensorRT-LLM version does not know",
        patterns=(r"extra_forbidden", r"Extra inputs are not permitted", r"literal_error",
                  _SERVE_ERROR + r".*(has no|is not accepted by TensorRT-LLM)",
                  r"config check: .*unknown key"),
        where=(SERVER, PROXY, JOB, PHASES),
        cause="the LLM-API options file has a key (or a value spelling) the TensorRT-LLM inside the container does "
              "not accept: its pydantic config classes forbid extra keys. Usually the container image is a "
              "different release than the recipe's trtllm_version (e.g. 1.2 keys in a 1.0 image), or a key in "
              "extra_options is misspelt; a literal_error on backend is the casing of that version",
        fix="make container_image and trtllm_version agree (tk renders keys for trtllm_version), then check the "
            "named key in ctx.yaml / gen.yaml: rename or remove it in the role's extra_options; `tk render --check` "
            "parses the files with the installed TensorRT-LLM",
        source="TensorRT-LLM CacheTransceiverConfig extra=\"forbid\"; https://github.com/NVIDIA/TensorRT-LLM/pull/6887 (backend casing)",
    ),
    Signature(
        id="prompt-exceeds-max-num-tokens",
        title="a prompt longer than the context server's max_num_tokens",
        patterns=(r"should not exceed max_num_tokens",),
        where=(SERVER, PROXY),
        cause="a request's prompt is longer than the context server's max_num_tokens and chunked prefill is off",
        fix="keep clients within traffic.max_input_len; to admit longer prompts raise traffic.max_input_len (tk "
            "sizes context.max_num_tokens and the transfer buffer from it) or enable chunked prefill in "
            "context.extra_options",
        source="https://github.com/NVIDIA/TensorRT-LLM/issues/3937",
        per_request=True,
    ),
    # --- ports, processes, launchers ----------------------------------------------------------------------
    Signature(
        id="port-in-use",
        title="a port the deployment needs is already in use",
        patterns=(r"[Aa]ddress already in use", r"EADDRINUSE", r"Failed to bind socket to",
                  r"port\(s\) [0-9,]+ already in use on"),
        where=EVERYWHERE,
        cause="another process (often a server left from an earlier run, or another deployment on the same node) "
              "holds a port of this plan; tk's own port check (phase 'failed: port(s) ... already in use') or the "
              "server's bind found it",
        fix="`tk runs` and `tk stop RUN` for a run left behind; otherwise move the setting of the port that is "
            "taken to a free range (`tk plan` lists every port): cluster.worker_base_port (the servers), "
            "cluster.internal_base_port (their internal ports), proxy.port (the proxy), membership.etcd_port (the "
            "etcd the job starts, its peer port and the servers' etcd gateways)",
        source="https://github.com/NVIDIA/TensorRT-LLM/pull/17460 (port races); tk launch.sbatch port check",
        # etcd's own bind error (logs/etcd.log, "etcdmain") or a server's etcd gateway's (templates/etcd_gateway.py)
        fix_when=((r"etcd", "`tk runs` and `tk stop RUN` for a run left behind; otherwise move membership.etcd_port "
                   "to a free range: the etcd the job starts takes etcd_port (clients) and etcd_port + 1 (its peer "
                   "port), and each server's etcd gateway one of the ports after those"),),
    ),
    Signature(
        id="mpi-spawn",
        title="MPI / launcher start-up failure under Slurm",
        patterns=(r"MpiPoolSession", r"MPI_Comm_spawn", r"PMIX ERROR", r"PMI2?_Init failed",
                  r"mpi4py\.MPI\.Exception", r"OPAL ERROR"),
        where=(SERVER, JOB),
        cause="the MPI launcher could not start or connect the ranks under Slurm (PMIx mismatch, or MPI spawn "
              "confused by the Slurm environment)",
        fix="one srun per instance with exactly tp*pp tasks and --mpi=pmix (what tk renders by default); check "
            "that the cluster's srun has that plugin (`srun --mpi=list`) and set cluster.mpi to one it lists "
            "(pmix_v4, pmi2, ...); Dynamo's workaround for spawn errors is to unset SLURM_JOBID SLURM_JOB_ID "
            "SLURM_NODELIST in the worker",
        source="https://github.com/ai-dynamo/dynamo/pull/992, https://github.com/NVIDIA/TensorRT-LLM/issues/8961, https://github.com/NVIDIA/TensorRT-LLM/pull/17334",
    ),
    Signature(
        id="health-timeout",
        title="a server did not become healthy in time",
        patterns=(r"not healthy at \S+ after \d+s", r"not healthy after \d+(\.\d+)?s"),
        where=(PHASES,),
        cause="a server was still loading (weights, JIT, autotuner warm-up: B200/B300 need ~370 s) or hung at "
              "start-up (MPI, NCCL) when the startup deadline passed",
        fix="read the named server's log tail below: if it was still loading, raise cluster.startup_timeout_s "
            "(or --startup-timeout); if it stopped printing, look for an MPI/NCCL hang",
        source="https://github.com/NVIDIA/TensorRT-LLM/pull/18372, https://github.com/NVIDIA/TensorRT-LLM/pull/17881, https://github.com/NVIDIA/srt-slurm/issues/180",
    ),
    Signature(
        id="slurm-pending",
        title="the Slurm job never started",
        patterns=(r"job still pending after",),
        where=(PHASES,),
        cause="the cluster did not give the job its nodes within the pending timeout (busy partition, a request "
              "no node satisfies: GPUs, partition, account, time limit)",
        fix="check `squeue -j JOB -o %R` for the reason; fix cluster.partition / account / gpus_per_node, or raise "
            "cluster.pending_timeout_s",
        source="tk launch (Slurm pending reasons)",
    ),
    Signature(
        id="container-import",
        title="the container image could not be imported or started",
        patterns=(r"pyxis: (failed|couldn't|could not)", r"enroot[-\w]*: (error|\[ERROR\])",
                  r"\[ERROR\] URL \S+ returned error code: 40[1-4]"),
        where=(JOB, SERVER),
        cause="pyxis/enroot could not pull or start cluster.container_image (wrong tag, no registry credentials, "
              "no space for the squashfs)",
        fix="write a registry image as REGISTRY#IMAGE:TAG (nvcr.io#nvidia/tensorrt-llm/release:1.2.0; tk renders "
            "either spelling so, but a hand-edited launch.sbatch may not): enroot before 4.0 reads "
            "nvcr.io/nvidia/... as a Docker Hub image and asks registry-1.docker.io for it; check the tag against "
            "trtllm_version, run `enroot import docker://IMAGE` on a node, and the registry credentials in "
            "~/.config/enroot/.credentials",
        source="NVIDIA/pyxis and enroot error output; enroot's URI [USER@][REGISTRY#]IMAGE[:TAG] "
               "(https://github.com/NVIDIA/enroot/blob/v3.5.0/src/docker.sh, https://github.com/NVIDIA/pyxis "
               "args.c)",
    ),
    Signature(
        id="model-path",
        title="the model path or name cannot be found",
        patterns=(r"does not appear to have a file named config\.json", r"HFValidationError",
                  r"Repo id must be in the form", r"(?i)model path .* (does not exist|not found)",
                  r"MODEL: .*(not a directory|no such|unknown model|not found|does not exist)"),
        where=(SERVER, JOB, PHASES),
        cause="the servers (or the config check before them) cannot read the model: model_path is not visible "
              "inside the container (missing container_mounts), a mistyped path, or a Hub name without network "
              "access",
        fix="set model_path (or context/generation.model_path) to a directory every node sees, and mount it with "
            "cluster.container_mounts",
        source="transformers / huggingface_hub error messages; tk's and the stand-in's model checks",
    ),
    Signature(
        id="engine-not-found",
        title="the serving command is not there (exit 127)",
        patterns=(r"exec: \S+: not found", r"\b(trtllm-serve|trtllm-llmapi-launch|tk-standin-serve|python3): "
                  r"(command )?not found", r"exited with code 127\b"),
        where=EVERYWHERE,
        cause="a server's or the proxy's command does not exist where it runs (the shell's exit code 127): no "
              "cluster.container_image, so the servers run in the node's own environment, which has no "
              "TensorRT-LLM; or an image without it",
        fix="set cluster.container_image to a TensorRT-LLM release image (nvcr.io#nvidia/tensorrt-llm/release:TAG, "
            "in the recipe or the site file ~/.config/tk/site.yaml), or install TensorRT-LLM so that trtllm-serve "
            "is on the nodes' PATH; rehearse without GPUs with engine: standin",
        source="POSIX shell: exit status 127 for a command not found; pyxis --container-image",
    ),
    Signature(
        id="remote-code",
        title="the checkpoint needs its own Python code (trust_remote_code)",
        patterns=(r"trust_remote_code=True", r"contains custom code which must be executed"),
        where=(SERVER, JOB),
        cause="the checkpoint's config.json maps its configuration, model or tokenizer to Python files shipped "
              "with it (auto_map), and TensorRT-LLM does not run them unless told to",
        fix="read the checkpoint's code, then set trust_remote_code: true in the recipe (tk writes it into ctx.yaml "
            "and gen.yaml)",
        source="transformers' error when auto_map code is not trusted (configuration_auto.py, "
               "dynamic_module_utils.py); TensorRT-LLM TorchLlmArgs.trust_remote_code (default False)",
    ),
    Signature(
        id="interrupted",
        title="the launch was interrupted (Ctrl-C or a signal)",
        patterns=(r"^interrupted\b",),
        where=(PHASES,),
        cause="tk launch was stopped by the user (Ctrl-C) or a signal (SIGTERM, SIGHUP) before the deployment "
              "served; tk released the job, as it does for every failed launch",
        fix="nothing failed on its own: launch again (tk launch RECIPE); a later finding, if any, is what the "
            "servers said before the interruption",
        source="tk launch (signals and Ctrl-C end the launch and release the job)",
    ),
    Signature(
        id="job-signalled",
        title="the job's orchestrator was ended by a signal",
        patterns=(r"^failed\tsignal received \(SIG",),
        where=(PHASES,),
        cause="a signal reached the job's orchestrator (the batch script): Slurm's time limit (SIGTERM), "
              "--signal=B:SIG@T in cluster.sbatch_args (sent T seconds before it), scancel --signal, or a person; the "
              "job ended the deployment cleanly on it",
        fix="if the time limit ended it, raise cluster.time_limit; if a --signal in cluster.sbatch_args did, that is "
            "its purpose; otherwise find who sent the signal the event names",
        source="tk's job (orchestrator/job.py ENDING_SIGNALS); sbatch(1) --signal",
        secondary=True,  # tk launch's own interruption, or tk stop, signals the job too: that cause comes first
    ),
    Signature(
        id="worker-unregistered",
        title="a worker lost its place in the cluster storage",
        patterns=(r"^unregistered\t",),
        where=(PHASES,),
        cause="a worker answered /health but had no key in the cluster storage, so the proxy did not route to it: "
              "its lease lapsed (an etcd stall, a flood of connections to its etcd gateway) and it did not register "
              "again, or its etcd gateway ended (the gateway's line `etcd_gateway: ...` in the worker's log says "
              "why); supervision restarts it when it does not register again in time",
        fix="read the worker's log around the event for the gateway's or the heartbeat's failure; if leases lapse "
            "under load, raise membership.inactive_timeout_s (TensorRT-LLM's inactive_timeout_sec)",
        source="tk's job (orchestrator/policy.py Supervisor.registration); TensorRT-LLM disagg_auto_scaling.py "
               "DisaggClusterWorker (heartbeat, re-registration)",
    ),
    Signature(
        id="background-failed",
        title="background work failed (said, not silent)",
        patterns=(r"^background-failed\t", r"\bbackground-failed \{"),
        where=EVERYWHERE,
        cause="a piece of background work of tk's job (a kill, a lookup, a probe, the membership repair), of the "
              "stand-in (a heartbeat, the membership poll) or of an etcd gateway ended with an exception; the "
              "line names the component and the cause, and what happened next (restarted, the component failed)",
        fix="read the cause: a storage or Slurm answer tk did not expect is a bug to report with the line; the "
            "component it names was restarted or failed as the line says",
        source="tk's job (orchestrator/background.py), the stand-in (toolkit/standin/tasks.py), "
               "templates/etcd_gateway.py",
        secondary=True,
    ),
    Signature(
        id="orchestrator-gone",
        title="the job's orchestrator is gone while its servers run",
        patterns=(r"the job's orchestrator is gone",),
        where=(PHASES,),
        cause="the local job's batch script (tk's job orchestrator) ended without its teardown (SIGKILL, the OOM "
              "killer, the interpreter faulting) while servers it started still run: nothing supervises them",
        fix="tk stop RUN, then launch again; `kill -USR2` of a live orchestrator prints its threads' stacks into "
            "logs/job.log, and faulthandler's dump there says where a faulting one stopped",
        source="tk status (the local backend's session, toolkit/launch/backends.py LocalBackend.job_state)",
    ),
    # --- GPU, memory, NCCL --------------------------------------------------------------------------------
    Signature(
        id="cuda-oom",
        title="CUDA out of memory",
        patterns=(r"CUDA out of memory", r"OutOfMemoryError", r"cudaErrorMemoryAllocation",
                  r"CUDA error: out of memory"),
        where=(SERVER,),
        cause="the GPU ran out of memory: the KV cache (free_gpu_memory_fraction), the transfer buffers "
              "(max_tokens_in_buffer x send+recv per rank), CUDA graphs and the weights together exceed it",
        fix="lower the role's free_gpu_memory_fraction (e.g. 0.8) or max_batch_size, or kv_transfer."
            "max_tokens_in_buffer; check that no other process uses the GPU (`nvidia-smi`)",
        source="https://github.com/NVIDIA/TensorRT-LLM/issues/13506",
    ),
    Signature(
        id="slurm-gres-invalid",
        title="Slurm refused the job's GPU request (gres)",
        patterns=(r"Invalid generic resource \(gres\) specification",),
        where=(PHASES, JOB),
        cause="the job asks for GPUs as a generic resource (#SBATCH --gres=gpu:N, cluster.gpu_request \"gres\", the "
              "default for TensorRT-LLM) and the partition has no GPU gres configured, or not that many per node: "
              "sbatch refuses the whole job (Slurm's ESLURM_INVALID_GRES)",
        fix="set cluster.gpu_request to how this cluster hands out GPUs: \"gpus-per-node\" (--gpus-per-node=N), or "
            "\"none\" for a partition that does not confine devices (and the CPU stand-in, which asks for none by "
            "default); check `sinfo -N -o '%N %G'` for the partition's gres, and cluster.partition",
        source="Slurm's error text for ESLURM_INVALID_GRES (SchedMD/slurm src/common/slurm_errno.c @ 46783aa7)",
    ),
    Signature(
        id="no-gpu-visible",
        title="the servers see no GPU",
        patterns=(r"No CUDA GPUs are available", r"Found no NVIDIA driver", r"cudaErrorNoDevice",
                  r"CUDA driver version is insufficient"),
        where=(SERVER,),
        cause="the job got no GPU: the cluster confines devices per job and the batch script requested none, or "
              "the container lacks the driver",
        fix="request GPUs in the recipe (the cluster section's GPU request: --gres=gpu:N or --gpus-per-node) and "
            "check `srun --gres=gpu:1 nvidia-smi` on the partition",
        source="PyTorch CUDA error messages; Slurm cgroup ConstrainDevices",
    ),
    Signature(
        id="nccl-error",
        title="NCCL error between the ranks of a server",
        patterns=(r"NCCL error", r"ncclInternalError", r"ncclSystemError", r"ncclUnhandledCudaError",
                  r"ncclRemoteError", r"NCCL WARN .*(failed|error|timeout)"),
        where=(SERVER,),
        cause="the ranks of one tensor/pipeline-parallel server could not communicate (network interface, "
              "IB/NVLink setup, or a rank that died)",
        fix="rerun with NCCL_DEBUG=INFO in the role env, check NCCL_SOCKET_IFNAME / NCCL_IB_HCA against the "
            "nodes' interfaces, and `tk validate cluster` the nodes",
        source="NCCL error messages (nccl.h ncclResult_t names)",
    ),
    # --- UCX / NIXL transport -----------------------------------------------------------------------------
    Signature(
        id="ucx-endpoint-timeout",
        title="UCX endpoint timeout (wrong UCX path)",
        patterns=(r"UCX_ERR_ENDPOINT_TIMEOUT", r"Endpoint timeout"),
        where=(SERVER, PROXY),
        cause="with the default UCX_TLS, NIXL's UCX control channel picked a path that does not work (an IB "
              "loopback path on some DGX B200s); requests hang",
        fix="set an explicit UCX_TLS for the roles (kv_transfer.transport picks one; kv_transfer.env.UCX_TLS "
            "overrides it) and restrict kv_transfer.net_devices to ACTIVE ports",
        source="https://github.com/NVIDIA/TensorRT-LLM/pull/18301",
    ),
    Signature(
        id="ucx-tcp-inherited",
        title="UCX treats GPU memory as host memory (inherited UCX_TLS=tcp)",
        patterns=(r"VRAM memory is detected as host by UCX", r"status == NIXL_SUCCESS"),
        where=(SERVER,),
        cause="UCX_TLS=tcp (from the host MPI / Slurm environment) reached the workers, so NIXL cannot register "
              "GPU memory and the executor asserts at init",
        fix="do not export UCX_TLS into the job (check `env | grep UCX_` on the login node and the cluster's "
            "module files); tk writes the role's UCX_TLS into ctx.env / gen.env, which must win",
        source="https://github.com/NVIDIA/TensorRT-LLM/pull/18373",
    ),
    Signature(
        id="ucx-no-transport",
        title="UCX found no usable transport (or fell back to TCP)",
        patterns=(r"no (active messages|remote memory access|auxiliary) transport to",
                  r"Destination is unreachable", r"tcp\(sw-emul\)", r"UCX CUDA support was not found",
                  r"transports? '?cuda_ipc'?.* (is|are) not available"),
        where=(SERVER, JOB),
        cause="UCX could not find a transport that reaches the peer with the allowed UCX_TLS / UCX_NET_DEVICES "
              "(or one without CUDA support), or silently carried the KV over TCP",
        fix="check UCX_TLS and UCX_NET_DEVICES in ctx.env / gen.env against `ucx_info -d` on the nodes; run "
            "`tk validate cluster RECIPE` to see the transport actually selected",
        source="UCX wire-up errors; https://github.com/ai-dynamo/nixl/issues/791, https://github.com/LMCache/LMCache/issues/605",
    ),
    Signature(
        id="nvlink-domain",
        title="servers in different NVLink domains (CUDA IPC import fails)",
        patterns=(r"cuMemImportFromShareableHandle failed",),
        where=(SERVER,),
        cause="UCX tried CUDA IPC across NVLink (MNNVL) domains that do not share a fabric",
        fix="set UCX_CUDA_IPC_ENABLE_MNNVL=n in kv_transfer.env (tk does when the transport profile says so) "
            "and compare the nodes' Fabric.ClusterUUID (`nvidia-smi -q`)",
        source="https://github.com/NVIDIA/TensorRT-LLM/pull/6085",
    ),
    Signature(
        id="ucx-cuda-software-emulation",
        title="UCX writes CUDA memory by \"software emulation\" (a copy through host memory, ~0.5 GB/s)",
        patterns=(r"\|\s*software emulation\s*\|",),
        # only a put (WRITE) table's rows: TensorRT-LLM's transceivers WRITE and never READ, so an emulated get
        # (UCX serves READ into CUDA memory so even where cuda_ipc WRITEs, gpu-findings-4) is not the cause
        after=r"remote memory write by ucp_put\S*.*cuda",
        header=r"remote memory \w+ by ucp_|active message by ucp_",
        where=(SERVER,),
        cause="UCX's protocol table (UCX_PROTO_INFO=y) shows a put (WRITE) of CUDA memory served by software "
              "emulation: no transport UCX was given can reach that memory directly, so every byte is copied "
              "through host memory over TCP or shared memory. Either UCX_TLS lacks cuda_ipc (one node) or an RDMA "
              "transport (between nodes), or the memory is a CUDA VMM allocation that cuda_ipc cannot map (the "
              "Python transceiver's KV pools on H100, TensorRT-LLM PR #17241; the C++ transceiver stages through "
              "cudaMalloc'd buffers, which it can). A get (READ) so served is not this finding: TensorRT-LLM WRITEs",
        fix="keep tk's UCX_TLS for the transport profile (it lists cuda_copy,cuda_ipc for one node; rc for "
            "InfiniBand) and drop a role env's UCX_TLS that leaves them out; load nvidia_peermem for GPUDirect RDMA; "
            "with the Python transceiver on H100, set kv_transfer.runtime: CPP; check with tk validate cluster "
            "--memory vram, whose ucx_protocol preflight names UCX's choice per op",
        source="https://github.com/NVIDIA/TensorRT-LLM/pull/17241, https://github.com/openucx/ucx/issues/11865",
    ),
    Signature(
        id="ucx-version-skew",
        title="a different UCX library than the image's is loaded",
        patterns=(r"UCP API version is incompatible",),
        where=(SERVER, JOB),
        cause="LD_LIBRARY_PATH (or a host mount) puts another UCX before the container's",
        fix="remove host UCX paths from the role env and container_mounts; use the container's UCX",
        source="https://github.com/NVIDIA/TensorRT-LLM/issues/9680",
    ),
    Signature(
        id="nixl-unavailable",
        title="NIXL or its backend plugin cannot be loaded",
        patterns=(r"NIXL is not available", r"backend '\w+' not found", r"unsupported backend '\w+'",
                  r"Failed to load plugin", r"No module named '?nixl"),
        where=(SERVER, JOB),
        cause="the image has no NIXL, or NIXL cannot find its plugin directory / libucp",
        fix="use an image with NIXL (TensorRT-LLM release images have it), set NIXL_PLUGIN_DIR and "
            "LD_LIBRARY_PATH in the role env if the plugins live elsewhere",
        source="https://github.com/ai-dynamo/dynamo/issues/3054, https://github.com/ai-dynamo/dynamo/issues/1758, https://github.com/ai-dynamo/nixl/issues/1561",
    ),
    Signature(
        id="nixl-libfabric-double",
        title="both LIBFABRIC selector variables are set",
        patterns=(r"Failed to deserialize data rail endpoints",),
        where=(SERVER,),
        cause="TRTLLM_NIXL_KVCACHE_BACKEND=LIBFABRIC and NIXL_BACKEND=LIBFABRIC are both set; the endpoint "
              "exchange breaks",
        fix="remove NIXL_BACKEND from the role env; set only TRTLLM_NIXL_KVCACHE_BACKEND",
        source="https://github.com/NVIDIA/TensorRT-LLM/issues/10024",
    ),
    Signature(
        id="ib-inactive",
        title="InfiniBand ports not ACTIVE / accelerated IB missing",
        patterns=(r"accelerated IB support was not found", r"\bPORT_(INIT|DOWN)\b"),
        where=(SERVER, JOB),
        cause="UCX opened HCAs whose ports are not ACTIVE (or without the accelerated verbs), so connection "
              "set-up is retried or falls back",
        fix="restrict kv_transfer.net_devices to ACTIVE ports (`ibstat` / `ibv_devinfo` on the nodes)",
        source="https://github.com/ai-dynamo/nixl/issues/2084, https://github.com/NVIDIA/srt-slurm/issues/429",
    ),
    Signature(
        id="gpu-registration",
        title="GPU memory registration failed (nvidia_peermem / DMA-BUF missing)",
        patterns=(r"registerMem: registration failed", r"ibv_reg_dmabuf_mr", r"ibv_reg_mr.*failed",
                  r"loadRemoteMD.*NIXL_ERR_NOT_FOUND"),
        where=(SERVER,),
        cause="the NIC cannot register GPU memory: the nvidia_peermem module is not loaded and DMA-BUF is not "
              "available, so GPUDirect RDMA cannot work",
        fix="load nvidia_peermem on the nodes (`lsmod | grep peermem`, `modprobe nvidia_peermem`) or use a "
            "driver/kernel with DMA-BUF; `tk validate cluster --memory vram` checks it before serving",
        source="https://github.com/ai-dynamo/nixl/issues/1694, https://github.com/NVIDIA/srt-slurm/issues/429",
    ),
    # --- transfers at run time ----------------------------------------------------------------------------
    Signature(
        id="kv-transfer-timeout",
        title="a KV transfer timed out",
        patterns=(r"Timed out waiting for context KV cache transfer", r"was not fetched within kv_transfer_timeout_ms",
                  r"KV transfer .*timed out"),
        where=(SERVER, PROXY),
        cause="a context-to-generation transfer never completed (transport hang, dropped notification, leaked "
              "blocks); the timeout path gave up",
        fix="run `tk validate cluster RECIPE` on the same nodes; check UCX_TLS / net_devices; upgrade past the "
            "transceiver hang fixes",
        source="https://github.com/NVIDIA/TensorRT-LLM/issues/17665, https://github.com/NVIDIA/TensorRT-LLM/pull/16402, https://github.com/NVIDIA/TensorRT-LLM/pull/12313",
    ),
    Signature(
        id="kv-blocks-leaked",
        title="no context requests scheduled while requests queue",
        patterns=(r"scheduled 0 context requests",),
        where=(SERVER,),
        cause="leaked KV blocks or stale transfer state: /health answers 200 but nothing is served",
        fix="restart the deployment; upgrade TensorRT-LLM (PR #14633, #16402); keep kv_transfer_timeout_ms set",
        source="https://github.com/NVIDIA/TensorRT-LLM/pull/14633, https://github.com/NVIDIA/TensorRT-LLM/pull/16402",
    ),
    Signature(
        id="nixl-remote-disconnect",
        title="a NIXL peer disconnected",
        patterns=(r"NIXL_ERR_REMOTE_DISCONNECT",),
        where=(SERVER,),
        cause="the other side of a KV transfer went away (its server exited or the UCX connection died)",
        fix="find the server that exited first (its log below); after long uptimes, restart the deployment: "
            "answers after this error may be corrupt",
        source="https://github.com/wtdcode/vllm-backport/issues/33",
    ),
    Signature(
        id="llm-shutting-down",
        title="the proxy saw a server shutting down (a consequence)",
        patterns=(r"LLM is shutting down",),
        where=(PROXY, SERVER),
        cause="a server was already shutting down after an earlier failure",
        fix="look for the first failure in the servers' logs (the other findings, or the first error line)",
        source="TensorRT-LLM's executor error text ('LLM is shutting down') once a server stops",
        secondary=True,
    ),
)

BY_ID = {s.id: s for s in SIGNATURES}
