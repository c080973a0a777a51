"""Hardware facts: GPUs and the KV transport profiles, for the plan's estimates and environment.

Nominal bandwidths are per GPU (per tensor-parallel rank), one direction, as sold:
the validator measures the real ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.states import Word


@dataclass(frozen=True)
class GpuFigures:
    """One GPU's roofline figures, per GPU, dense (no sparsity), as sold; ``source`` says where they come from."""

    name: str
    bf16_tflops: float  # dense BF16 tensor-core peak, TFLOP/s
    fp8_tflops: float | None  # dense FP8 tensor-core peak, TFLOP/s (None: no FP8 tensor cores)
    hbm_tbps: float  # memory bandwidth, TB/s
    source: str
    # Device memory as nvidia-smi reports it (its "Total", MiB; see MIB_TOTAL below). 0: not a GPU.
    memory_bytes: int = 0
    arch: str = ""  # "ampere" | "ada" | "hopper" | "blackwell": what the quantization kernels depend on


MIB = 1 << 20
# Device memory per GPU as `nvidia-smi` reports it (memory.total, MiB), not the marketing GB or a round GiB:
#   H100   81,559 MiB  "NVIDIA H100 80GB HBM3" (SXM), read on the project's machines (tk issue 30) and in public
#                      nvidia-smi printouts; aiconfigurator 0.12.0 h100_sxm.yaml has 80 GiB (81,920 MiB)
#   H200  143,771 MiB  "NVIDIA H200", read likewise; aiconfigurator h200_sxm.yaml has 141 GiB (144,384 MiB)
#   B200  183,359 MiB  "NVIDIA B200" (public nvidia-smi printouts); aiconfigurator b200_sxm.yaml has 180 GiB
#   B300  275,040 MiB, GB200 189,471 MiB, GB300 284,208 MiB, L40S 46,068 MiB: aiconfigurator 0.12.0's own
#                      systems/<system>.yaml `mem_capacity` ("reported by nvidia-smi" for the first three; L40S's
#                      comment gives the MiB alone)
#   A100   81,920 MiB  "NVIDIA A100-SXM4-80GB" (public nvidia-smi printouts; aiconfigurator's 80 GiB is the same)
# What TensorRT-LLM sizes its KV pool against is CUDA's total (torch.cuda.mem_get_info, KvCacheCreator), a few
# hundred MiB below nvidia-smi's where the driver reserves memory (H100 80GB HBM3: 81,082-81,090 MiB in public
# torch.cuda.get_device_properties printouts): the memory plan's pool is that much optimistic, which its verdicts
# absorb (only what cannot fit whatever the estimates' error is refused, toolkit/plan/memory.py).
MIB_TOTAL = {"H100": 81559, "H200": 143771, "B200": 183359, "GB200": 189471, "B300": 275040, "GB300": 284208,
             "A100": 81920, "L40S": 46068}

# The one table of GPU figures: `tk plan`'s prefill estimate and the stand-in's emulated timing
# (toolkit.facts.roofline) both read it. Datasheet peaks are "with sparsity" for tensor cores; the dense
# figure is half of it.
GPU_FIGURES = {g.name: g for g in (
    GpuFigures("H100", 989.0, 1979.0, 3.35,
               "NVIDIA H100 Tensor Core GPU datasheet, SXM5 80GB: BF16 1,979 / FP8 3,958 TFLOPS with sparsity, "
               "HBM3 3.35 TB/s", memory_bytes=MIB_TOTAL["H100"] * MIB, arch="hopper"),
    GpuFigures("H200", 989.0, 1979.0, 4.8,
               "NVIDIA H200 Tensor Core GPU datasheet, SXM 141GB: BF16 1,979 / FP8 3,958 TFLOPS with sparsity, "
               "HBM3e 4.8 TB/s", memory_bytes=MIB_TOTAL["H200"] * MIB, arch="hopper"),
    GpuFigures("B200", 2250.0, 4500.0, 8.0,
               "NVIDIA HGX B200 datasheet, per GPU: BF16 4.5 / FP8 9 PFLOPS with sparsity, HBM3e 8 TB/s",
               memory_bytes=MIB_TOTAL["B200"] * MIB, arch="blackwell"),
    GpuFigures("GB200", 2500.0, 5000.0, 8.0,
               "NVIDIA GB200 NVL72 datasheet, per Blackwell GPU (1/72 of the rack): BF16 5 / FP8 10 PFLOPS with "
               "sparsity, HBM3e 8 TB/s", memory_bytes=MIB_TOTAL["GB200"] * MIB, arch="blackwell"),
    # Blackwell Ultra. Dense figures per GPU (NVIDIA GB300 NVL72 and HGX B300 datasheet figures as compiled at
    # glennklockwood.com/garden/processors/B300 and verda.com/blog/gb300-nvl72-architecture): GB300 BF16 2.5 /
    # FP8 5 PFLOPS, HBM3e 8 TB/s; HGX B300 BF16 2.25 / FP8 4.5 PFLOPS, HBM3e 8 TB/s.
    GpuFigures("B300", 2250.0, 4500.0, 8.0,
               "NVIDIA HGX B300, per GPU: BF16 2.25 / FP8 4.5 PFLOPS dense, HBM3e 8 TB/s",
               memory_bytes=MIB_TOTAL["B300"] * MIB, arch="blackwell"),
    GpuFigures("GB300", 2500.0, 5000.0, 8.0,
               "NVIDIA GB300 NVL72, per Blackwell Ultra GPU (1/72 of the rack): BF16 2.5 / FP8 5 PFLOPS dense, "
               "HBM3e 8 TB/s", memory_bytes=MIB_TOTAL["GB300"] * MIB, arch="blackwell"),
    GpuFigures("A100", 312.0, None, 2.039,
               "NVIDIA A100 Tensor Core GPU datasheet, SXM 80GB: BF16 312 TFLOPS dense, HBM2e 2,039 GB/s; "
               "no FP8", memory_bytes=MIB_TOTAL["A100"] * MIB, arch="ampere"),
    GpuFigures("L40S", 181.0, 362.0, 0.864,
               "NVIDIA L40S datasheet: BF16 362 / FP8 733 TFLOPS with sparsity, GDDR6 864 GB/s",
               memory_bytes=MIB_TOTAL["L40S"] * MIB, arch="ada"),
    GpuFigures("CPU", 0.5, None, 0.1,
               "not a GPU: a nominal figure for CPU rehearsal clusters (the stand-in); never emulated"),
)}
GPU_PEAK_TFLOPS = {name: g.bf16_tflops for name, g in GPU_FIGURES.items()}  # dense BF16, TFLOP/s per GPU
GPUS = tuple(GPU_FIGURES)
# GPUs the stand-in can emulate (standin.emulate.gpu): every row with real datasheet figures.
EMULATED_GPUS = tuple(name for name in GPU_FIGURES if name != "CPU")

# Efficiencies: the fraction of the peak a real engine reaches. Assumptions, stated once, not measurements:
# - prefill: dense-model prefill GEMMs at a few thousand tokens reach 40-60% of dense peak in published
#   TensorRT-LLM / vLLM benchmarks; tk takes the low end (0.4), as `tk plan`'s estimate always has.
# - decode: each step streams the weights and the KV once at 60-85% of peak HBM bandwidth; 0.7 is close to what
#   the P/D lab's real H100 figure implies (benchmarks/pd_lab.py SEED: Llama-3.1-8B BF16 TP=1, ITL 7.2 ms at 2 req/s;
#   16.06 GB / 3.35 TB/s = 4.8 ms at 100%, i.e. 0.67 with the engine's own overheads included).
PREFILL_EFFICIENCY = 0.4  # compute-bound phase: achieved / dense peak FLOP/s
DECODE_EFFICIENCY = 0.7  # memory-bound phase: achieved / peak HBM bandwidth
# GPUs whose multi-node NVLink (MNNVL) spans nodes (the NVL72 racks): CUDA IPC between nodes is left on for them.
MNNVL_GPUS = ("GB200", "GB300")


class Transport(Word):
    """The KV transport profiles (recipe kv_transfer.transport, `tk size --transport`): one TransportProfile each."""

    INFINIBAND = "infiniband"
    INFINIBAND_800G = "infiniband-800g"
    NVLINK_MULTI_NODE = "nvlink-multi-node"
    ROCE = "roce"
    EFA = "efa"
    NVLINK_SINGLE_NODE = "nvlink-single-node"
    TCP = "tcp"


@dataclass(frozen=True)
class TransportProfile:
    """How KV bytes cross between context and generation GPUs, and the env that selects it."""

    name: Transport
    nominal_gbps: float  # GB/s per GPU, one direction
    ucx_tls_gpu: str  # UCX_TLS with GPU memory transports; "": left unset, UCX chooses (ucx_tls_reason says why)
    ucx_tls_host: str  # UCX_TLS when the KV cache lives in host memory
    env: dict = field(default_factory=dict)  # further UCX_*/FI_* settings
    nixl_transport: str = "UCX"  # TRTLLM_NIXL_KVCACHE_BACKEND
    multi_node: bool = True
    description: str = ""
    gpus: tuple[str, ...] = ()  # the GPUs the fabric exists for; () = any
    rdma: bool = False  # KV moves over RDMA NICs (the validation agents check each node has one)
    # Why tk sets UCX_TLS for this profile (or leaves it unset), for the env files and `tk plan`.
    ucx_tls_reason: str = ("set so that a host-wide UCX_TLS (e.g. tcp from the site's MPI module) is never "
                           "inherited; TensorRT-LLM's own Slurm scripts unset it and let UCX choose. Set UCX_TLS in "
                           "a role's env to use another list (tk then warns that it overrides this profile)")

    def ucx_tls(self, kv_memory: str) -> str:
        """UCX_TLS for an engine whose KV cache lives in ``kv_memory`` ("gpu" or "host"); "" = leave it unset."""
        return {"gpu": self.ucx_tls_gpu, "host": self.ucx_tls_host}[kv_memory]


TRANSPORT_PROFILES = {
    p.name: p
    for p in [
        TransportProfile(
            Transport.INFINIBAND, 50.0, "rc,cuda_copy,cuda_ipc,gdr_copy,sm,self", "rc,sm,self", rdma=True,
            description="InfiniBand NDR, 400 Gb/s per GPU, GPUDirect RDMA"),
        TransportProfile(
            Transport.INFINIBAND_800G, 100.0, "rc,cuda_copy,cuda_ipc,gdr_copy,sm,self", "rc,sm,self", rdma=True,
            description="InfiniBand XDR, 800 Gb/s per GPU (ConnectX-8 SuperNIC on B300/GB300), GPUDirect RDMA"),
        TransportProfile(
            # Context and generation in one NVL72 NVLink domain across nodes: UCX's cuda_ipc reaches the other
            # nodes' GPUs over MNNVL (UCX_CUDA_IPC_ENABLE_MNNVL, on by default). NVIDIA's GB200/GB300 recipes leave
            # UCX_TLS unset (NVIDIA/srt-slurm recipes/trtllm/gb200-*, gb300-* @ c88ef731): so does this profile.
            Transport.NVLINK_MULTI_NODE, 900.0, "", "sm,self,tcp", gpus=("GB200", "GB300"),
            description="GB200/GB300 NVL72: multi-node NVLink (MNNVL), 1.8 TB/s per GPU both ways",
            ucx_tls_reason=("left unset: UCX picks cuda_ipc over MNNVL itself, as in NVIDIA's GB200/GB300 recipes "
                            "(NVIDIA/srt-slurm @ c88ef731)")),
        TransportProfile(
            Transport.ROCE, 50.0, "rc,cuda_copy,cuda_ipc,gdr_copy,sm,self", "rc,sm,self",
            env={"UCX_IB_GID_INDEX": "3"}, rdma=True,
            description="RoCE v2, 400 Gb/s per GPU; GID index 3 is RoCE v2 over IPv4 on most hosts"),
        TransportProfile(
            Transport.EFA, 50.0, "tcp,cuda_copy,cuda_ipc,sm,self", "tcp,sm,self",
            env={"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}, nixl_transport="LIBFABRIC", rdma=True,
            description="AWS EFA, NIXL over libfabric (UCX only for the control path)"),
        TransportProfile(
            Transport.NVLINK_SINGLE_NODE, 450.0, "cuda_copy,cuda_ipc,sm,self,tcp", "sm,self,tcp",
            multi_node=False,
            description="context and generation on the same NVLink domain, CUDA IPC"),
        TransportProfile(
            Transport.TCP, 3.125, "tcp,cuda_copy,sm,self", "tcp,sm,self",
            description="plain TCP, 25 GbE; for rehearsal and for the CPU stand-in"),
    ]
}
TRANSPORTS = tuple(t.value for t in Transport)
assert set(TRANSPORT_PROFILES) == set(Transport), "one TransportProfile per Transport"

# What the runtime takes besides weights, activations and the KV pool, per GPU (bytes). aiconfigurator 0.12.0's
# memory model (aiconfigurator_core/systems/*.yaml `misc`, "nonofficial correction based on observations"):
# CUDA context, cuBLAS/NCCL workspaces and the like ("other_mem", 3.5 GiB) and NCCL buffers by TP size
# ("nccl_mem": 0 at TP1, 342 MB at TP2, 392 MB from TP4).
RUNTIME_OTHER_BYTES = 3758096384
NCCL_BYTES_BY_TP = {1: 0, 2: 358612992, 4: 411041792, 8: 411041792}


def nccl_bytes(tp: int) -> int:
    """NCCL buffers of a rank in a TP group of ``tp`` (aiconfigurator clamps TP at 8)."""
    return NCCL_BYTES_BY_TP[min(max(1, 1 << (max(1, tp).bit_length() - 1)), 8)]
