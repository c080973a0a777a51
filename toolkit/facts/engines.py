"""Engine facts: one ``EngineProfile`` row per engine that can serve a plan.

The plan, the templates, the reports and validation read fields of the profile; none of them asks which
engine it is. The CPU stand-in (``toolkit/standin``, a rehearsal engine) is a row here like TensorRT-LLM.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.facts import trtllm


@dataclass(frozen=True)
class EngineProfile:
    """How one engine is started and what it needs from the deployment. Data only."""

    name: str  # the recipe's `engine`
    label: str  # how `tk plan` names the engine
    serve_command: tuple[str, ...]  # the `trtllm-serve`-compatible command (servers and proxy)
    launcher: tuple[str, ...]  # wraps each server's ranks (the MPI launcher), or ()
    uses_mpi: bool  # one MPI rank per GPU (srun --mpi=pmix, ntasks = tp*pp) or one process per server
    uses_gpus: bool  # its servers need the node's GPUs: the job asks Slurm for them (cluster.gpu_request's default)
    options_file_flag: str  # how a server is handed its LLM-API options file
    kv_memory: str  # "gpu" | "host": where the KV cache lives; picks the transport profile's UCX_TLS
    # cache_transceiver_config backends the engine can serve (None: whatever the TensorRT-LLM line accepts),
    # why the others are refused, and what to use instead.
    kv_backends: tuple[str, ...] | None
    kv_backends_reason: str
    kv_backends_fix: str
    validate_memory: str  # what `tk validate cluster --memory auto` registers: "auto" (GPU if present) or "dram"
    gpu_fabric_env: bool  # GPU-only transport settings apply (UCX_CUDA_IPC_ENABLE_MNNVL across NVLink domains)
    version_env: str | None  # env var naming the TensorRT-LLM line the engine imitates, or None
    image_holds_trtllm: bool  # cluster.container_image holds the TensorRT-LLM that serves (its tag is read)
    version_command: tuple[str, ...]  # prints the engine's version (last line), for provenance/NODE.json
    script_note: str  # a comment line launch.sbatch carries ("" for none)
    options_note: str  # a comment line ctx.yaml / gen.yaml carry ("" for none)
    # Emulated timing (recipe `standin.emulate`): the env var prefix the engine reads it from (PREFIX + MODEL, GPU,
    # PRECISION, KV_GBPS), or None for an engine that runs for real and cannot emulate another GPU.
    emulate_env_prefix: str | None = None
    # A Hugging Face tokenizer directory whose token counts equal the engine's, relative to the installed `toolkit`
    # package (resolve it with toolkit.resources.package_path), for clients that count tokens themselves (aiperf,
    # genai-perf: --tokenizer DIR); None where the model's own tokenizer applies.
    tokenizer_dir: str | None = None


TRTLLM = EngineProfile(
    name="trtllm",
    label="TensorRT-LLM",
    serve_command=(trtllm.SERVE_COMMAND,),
    launcher=(trtllm.LAUNCHER,),
    uses_mpi=True,
    uses_gpus=True,
    options_file_flag=trtllm.OPTIONS_FILE_FLAG,
    kv_memory="gpu",
    kv_backends=None,
    kv_backends_reason="",
    kv_backends_fix="",
    validate_memory="auto",
    gpu_fabric_env=True,
    version_env=None,
    image_holds_trtllm=True,
    version_command=("python3", "-c", "import tensorrt_llm; print(tensorrt_llm.__version__)"),
    script_note="",
    options_note="",
)

STANDIN = EngineProfile(
    name="standin",
    label="CPU stand-in (rehearsal, not TensorRT-LLM)",
    serve_command=("tk-standin-serve",),
    launcher=(),
    uses_mpi=False,
    uses_gpus=False,  # a CPU engine: a GPU request would only keep it off partitions without GPU gres
    options_file_flag=trtllm.OPTIONS_FILE_FLAG,  # it parses trtllm-serve's command line
    kv_memory="host",
    kv_backends=("NIXL", "UCX", "DEFAULT"),
    kv_backends_reason="the CPU stand-in moves KV with NIXL",
    kv_backends_fix="use NIXL, UCX or DEFAULT for stand-in recipes",
    validate_memory="dram",  # its KV cache is in host memory: validate what will serve
    gpu_fabric_env=False,
    version_env="TK_STANDIN_TRTLLM_VERSION",
    image_holds_trtllm=False,  # it imitates the line named by trtllm_version, whatever the image
    version_command=("tk-standin-serve", "--version"),
    script_note="Engine: tk CPU stand-in (tk-standin-serve), a rehearsal engine, not TensorRT-LLM.",
    options_note="Engine: tk CPU stand-in (rehearsal only, not TensorRT-LLM).",
    emulate_env_prefix="TK_STANDIN_EMULATE_",
    # one token per whitespace-separated word, as the stand-in counts (scripts/build_standin_tokenizer.py); for chat,
    # aiperf's ISL is the server's usage.prompt_tokens minus 2 (the template's <|user|> and <|assistant|>)
    tokenizer_dir="standin/tokenizer",
)


def emulated_label(engine: EngineProfile, model: str, gpu: str, precision: str) -> str:
    """How the plan, `tk plan` and `tk status` name an engine that emulates MODEL's timing on GPU."""
    return f"{engine.label}, emulated timing of {model} on {gpu} ({precision})"

ENGINES: dict[str, EngineProfile] = {e.name: e for e in (TRTLLM, STANDIN)}
