"""Hardware facts: GPUs and the KV transport profiles, for the plan's estimates and environment.

Nominal bandwidths are per GPU (per tensor-parallel rank), one direction, as sold:
the validator measures the real ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Dense BF16 peak, TFLOP/s per GPU (vendor datasheets, SXM parts).
GPU_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "B200": 2250.0, "GB200": 2500.0,
                   "A100": 312.0, "L40S": 362.0, "CPU": 0.5}
GPUS = tuple(GPU_PEAK_TFLOPS)
# The fraction of peak a prefill reaches; used only for the estimate `tk plan` prints.
PREFILL_EFFICIENCY = 0.4
# GPUs whose multi-node NVLink (MNNVL) spans nodes: CUDA IPC between nodes is left on for them.
MNNVL_GPUS = ("GB200",)


@dataclass(frozen=True)
class TransportProfile:
    """How KV bytes cross between context and generation GPUs, and the env that selects it."""

    name: str
    nominal_gbps: float  # GB/s per GPU, one direction
    ucx_tls_gpu: str  # UCX_TLS with GPU memory transports
    ucx_tls_host: str  # UCX_TLS when the KV cache lives in host memory
    env: dict = field(default_factory=dict)  # further UCX_*/FI_* settings
    nixl_transport: str = "UCX"  # TRTLLM_NIXL_KVCACHE_BACKEND
    multi_node: bool = True
    description: str = ""

    def ucx_tls(self, kv_memory: str) -> str:
        """UCX_TLS for an engine whose KV cache lives in ``kv_memory`` ("gpu" or "host")."""
        return {"gpu": self.ucx_tls_gpu, "host": self.ucx_tls_host}[kv_memory]


TRANSPORT_PROFILES = {
    p.name: p
    for p in [
        TransportProfile(
            "infiniband", 50.0, "rc,cuda_copy,cuda_ipc,gdr_copy,sm,self", "rc,sm,self",
            description="InfiniBand NDR, 400 Gb/s per GPU, GPUDirect RDMA"),
        TransportProfile(
            "roce", 50.0, "rc,cuda_copy,cuda_ipc,gdr_copy,sm,self", "rc,sm,self",
            env={"UCX_IB_GID_INDEX": "3"},
            description="RoCE v2, 400 Gb/s per GPU; GID index 3 is RoCE v2 over IPv4 on most hosts"),
        TransportProfile(
            "efa", 50.0, "tcp,cuda_copy,cuda_ipc,sm,self", "tcp,sm,self",
            env={"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1"}, nixl_transport="LIBFABRIC",
            description="AWS EFA, NIXL over libfabric (UCX only for the control path)"),
        TransportProfile(
            "nvlink-single-node", 450.0, "cuda_copy,cuda_ipc,sm,self,tcp", "sm,self,tcp",
            multi_node=False,
            description="context and generation on the same NVLink domain, CUDA IPC"),
        TransportProfile(
            "tcp", 3.125, "tcp,cuda_copy,sm,self", "tcp,sm,self",
            description="plain TCP, 25 GbE; for rehearsal and for the CPU stand-in"),
    ]
}
TRANSPORTS = tuple(TRANSPORT_PROFILES)
