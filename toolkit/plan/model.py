"""The resolved deployment: pure data, everything later stages need and nothing they must derive.

The Plan is the only thing render, launch and validation read. ``Plan.recipe`` (the resolved recipe as a
dict) exists for the manifest only; every number a later stage uses is a typed field here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from orchestrator.states import RestartPolicy, Role
from toolkit.facts import trtllm
from toolkit.facts.engines import EngineProfile
from toolkit.facts.hardware import TransportProfile
from toolkit.facts.models import ModelSpec
from toolkit.facts.transceiver import Descriptors, Layout, RankPairGeometry, Runtime


@dataclass(frozen=True)
class KvGeometry:
    """How big the KV cache of one token is, and what that means for the largest request."""

    attention: str  # "gqa" or "mla"
    num_layers: int  # KV-cache layers TensorRT-LLM allocates: the model's, plus one per MTP layer
    bytes_per_element: float
    bytes_per_token: int  # whole model, all layers, one request
    bytes_per_token_per_layer: int
    tokens_per_block: int
    # per tensor-parallel rank, for each role (TP splits KV heads; MLA's latent is not split)
    ctx_bytes_per_token_per_rank: int
    gen_bytes_per_token_per_rank: int
    largest_request_tokens: int
    largest_request_bytes: int
    formula: str


@dataclass(frozen=True)
class RoleKv:
    """The KV cache of one token on one rank of a role's server (TP splits KV heads; MLA's latent is not split)."""

    layers_per_rank: int  # on the fullest pipeline rank, MTP layers included (they sit on the last rank)
    bytes_per_token_per_layer_per_rank: float  # K and V together (GQA), or the latent (MLA)
    bytes_per_token_per_rank: int  # all the rank's layers


@dataclass(frozen=True)
class RoleMemory:
    """One GPU of one of the role's servers (its fullest rank), in bytes: toolkit/plan/memory.py says how each
    number is worked out and which are estimates."""

    gpu: str
    gpu_memory_bytes: int
    quantization: str  # what the weights are assumed stored as ("bfloat16", "fp8_block", "nvfp4", ...)
    quantization_source: str  # and why
    weights_bytes: int  # estimate
    weights_min_bytes: int  # lower bound (every linear layer split over TP, at the narrowest width possible)
    weights_detail: tuple[tuple[str, int], ...]  # (layers | embedding | lm_head | mtp, bytes)
    activation_bytes: int  # the profiling forward pass over max_num_tokens (estimate)
    cuda_graph_bytes: int  # the largest captured decode batch (estimate)
    runtime_bytes: int  # CUDA context, workspaces, NCCL buffers (estimate)
    free_gpu_memory_fraction: float
    kv_pool_bytes: int  # (memory - all the above) x free_gpu_memory_fraction
    kv_dtype: str
    kv_bytes_per_token: int  # on this rank, all its layers (MTP included)
    kv_pool_tokens: int
    kv_pool_tokens_max: int  # with no activations and the weights' lower bound: what errors are judged on
    sequence_tokens: int  # one full request on this role (context: the longest input; generation: max_seq_len)
    max_batch_size: int
    batch_tokens: int  # max_batch_size x sequence_tokens (per attention-DP rank under attention DP)
    transfer_buffer_bytes: int  # cache_transceiver_config.max_tokens_in_buffer of KV
    headroom_bytes: int  # what the KV pool leaves free
    notes: tuple[str, ...] = ()

    @property
    def fits_sequence(self) -> bool:
        return self.kv_pool_tokens >= self.sequence_tokens

    @property
    def fits_batch(self) -> bool:
        return self.kv_pool_tokens >= self.batch_tokens


@dataclass(frozen=True)
class TransceiverPlan:
    """Which TensorRT-LLM cache transceiver the servers run and what it hands NIXL for one request, per (context rank,
    generation rank) pair (toolkit/facts/transceiver.py: the model, with its sources; toolkit/plan/transceiver.py)."""

    runtime: Runtime  # the context servers' (the sender's)
    runtime_setting: str | None  # transceiver_runtime as the options file gives it, else the release's default
    runtime_reason: str
    default_source: str  # the snapshot of the generated data whose default or resolution decided
    verified: bool  # every snapshot that speaks for the release selects this runtime (not so between two that differ)
    backend: str  # cache_transceiver_config.backend with DEFAULT resolved
    mapper: Layout  # the Python transceiver's mapper for this pair of roles (what it would move without bounce)
    layout: Layout  # what the runtime moves: staged on the C++ transceiver, the mapper's lists or bounce on Python
    bounce_size_mb: int  # kv_cache_bounce_size_mb (0: off)
    pair: RankPairGeometry  # one context rank's KV for one generation rank, per token
    targets_per_context_rank: int  # generation ranks one context rank sends a request's KV to
    longest: Descriptors  # the longest admitted request, one rank pair
    model: str  # the model in words: "C++ transceiver: staged-per-rank-pair, 1 descriptor per rank pair of ..."
    writers_per_generation_rank: int = 1  # context ranks writing one generation rank's share (bounce takes one)


@dataclass(frozen=True)
class KvTransferPlan:
    """How KV moves from context to generation servers."""

    backend: str  # cache_transceiver_config.backend: DEFAULT | UCX | NIXL | MPI | MOONCAKE
    dtype: str  # kv_cache_config.dtype
    transport: TransportProfile  # the fabric, its UCX_TLS and NIXL backend
    transceiver: TransceiverPlan | None = None  # None only for a plan built without roles to pair


@dataclass(frozen=True)
class TrafficPlan:
    """The requests the deployment is sized for (tokens)."""

    max_input_len: int
    prefix_len: int
    max_output_len: int
    typical_input_len: int | None


@dataclass(frozen=True)
class Estimates:
    """Rough timings so users see whether the KV transfer or the prefill dominates."""

    transport: str
    nominal_gbps: float
    largest_request_transfer_ms: float
    largest_request_prefill_ms: float
    prefill_efficiency: float
    gpu_peak_tflops: float
    transfer_dominates: bool


@dataclass(frozen=True)
class BufferSizing:
    """cache_transceiver_config.max_tokens_in_buffer: the context servers' and, where a recipe gives the generation
    role its own, the generation servers'. TensorRT-LLM sizes each server's pre-allocated transfer buffer from its
    own value (cacheTransBuffer.cpp). A request larger than a side's buffer: the C++ transceiver over NIXL or MOONCAKE
    fails it ("Agent need all buffer pre-allocated", toolkit/facts/transceiver.py), over UCX or MPI it moves through
    buffers allocated for that request. The Python transceiver moves the KV pools' blocks themselves."""

    max_tokens_in_buffer: int  # the context servers'
    reason: str
    user_given: bool
    generation_max_tokens_in_buffer: int | None = None  # None: the same as the context servers'

    def for_role(self, title: str) -> int:
        if title == "generation" and self.generation_max_tokens_in_buffer is not None:
            return self.generation_max_tokens_in_buffer
        return self.max_tokens_in_buffer


@dataclass(frozen=True)
class ServerInstance:
    """One context or generation server: an MPI world of tp*pp ranks on one or more nodes."""

    role: Role  # ctx | gen | agg (an aggregated plan's plain trtllm-serve instance)
    index: int
    nodes: tuple[int, ...]  # indices into Plan.nodes
    gpus: tuple[int, ...]  # GPU ids on each node (CUDA_VISIBLE_DEVICES)
    port: int
    ntasks: int
    ntasks_per_node: int
    # Internal channels of this instance: (environment variable, port) pairs the batch script exports into this
    # instance's environment (facts.trtllm.INTERNAL_PORT_ENVS; e.g. TLLM_SPAWN_PROXY_PROCESS_IPC_PORT on 1.2).
    internal_ports: tuple[tuple[str, int], ...] = ()
    # Where the line has no such knob: the instance started before this one on the same node, whose launcher
    # must have bound its IPC port (or LAUNCHER_STAGGER_S passed) before this one starts; None: start at once.
    start_after: str | None = None

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def first_node(self) -> int:
        return self.nodes[0]


@dataclass(frozen=True)
class RolePlan:
    role: Role  # ctx | gen | agg
    title: str  # "context" | "generation" | "aggregated"
    tp: int
    pp: int
    ep: int | None
    attention_dp: bool
    gpus_per_instance: int
    nodes_per_instance: int
    node_count: int
    instances: tuple[ServerInstance, ...]
    model_path: str
    llm_api_options: dict  # the exact content of ctx.yaml / gen.yaml
    serve_args: tuple[str, ...]  # `trtllm-serve` flags besides host/port/options file
    env: dict  # the exact content of ctx.env / gen.env
    kv: RoleKv
    # Words before each server's command on its nodes (recipe {role}.launcher_prefix, e.g. numactl -m 0,1): the
    # server runs as PREFIX... [engine launcher] serve_command MODEL ...
    launcher_prefix: tuple[str, ...] = ()
    # One GPU's memory plan (toolkit/plan/memory.py); None where the engine keeps no KV on a GPU (the stand-in)
    # or the GPU's memory is unknown (cluster.gpu CPU).
    memory: RoleMemory | None = None

    @property
    def moe_tp(self) -> int | None:
        """MoE tensor parallelism TensorRT-LLM derives: tp // moe_expert_parallel_size (tensorrt_llm/mapping.py)."""
        return self.tp // self.ep if self.ep else None

    @property
    def gpu_count(self) -> int:
        return self.gpus_per_instance * len(self.instances)


@dataclass(frozen=True)
class ProxyPlan:
    node: int
    port: int
    config: dict  # the exact content of disagg.yaml (urls with <nodeN> placeholders)
    args: tuple[str, ...]  # `disaggregated` flags besides -c
    env: dict
    request_timeout_s: int  # bound on one request through the proxy (its -r)


@dataclass(frozen=True)
class SupervisionPlan:
    """What the job's orchestrator does when a component exits, stops answering /health or stops making progress
    once the deployment serves (orchestrator.policy)."""

    policy: RestartPolicy
    max_restarts: int  # consecutive failed restarts of one component before it is given up ("lost")
    backoff_initial_s: int
    backoff_max_s: int
    unhealthy_after_s: int  # /health failing this long: the component is killed and restarted
    stable_after_s: int  # healthy this long: its consecutive-failure count resets
    health_interval_s: int  # how often the job probes every component
    min_context: int  # fewer live (healthy or being restarted) servers of a role than this ends the run
    min_generation: int
    stall_after_s: int = 120  # a progress probe unanswered this long: the server is wedged (0: not probed)
    min_aggregated: int = 1  # an aggregated plan: fewer live instances than this ends the run

    @property
    def restarts(self) -> bool:
        return self.policy == RestartPolicy.RESTART


@dataclass(frozen=True)
class EtcdPlan:
    """The etcd a membership with storage etcd uses: one tk's job starts, or one that exists already."""

    endpoint: str  # host:port the workers and the proxy reach (<nodeN> placeholders as in disagg.yaml)
    started_by_job: bool  # True: launch.sbatch starts it on `node`, client port `port`
    node: int | None  # node index of the etcd the job starts
    port: int | None  # its client port
    peer_port: int | None  # its peer port (bound on loopback only: a single-member cluster; TLS with peer.crt)
    # Client certificates (ca.crt, client.crt, client.key; for the job's etcd also server.crt/.key and peer.crt/.key):
    # the run's own, written by tk launch into RUN/secrets/etcd (`<run_dir>/secrets/etcd`), or the recipe's
    # etcd_tls_dir. None: the etcd takes anyone (an external one the recipe accepts unauthenticated).
    tls_dir: str | None = None

    @property
    def tls_generated(self) -> bool:
        """tk writes this run's certificate authority and certificates (the etcd the job starts)."""
        return self.started_by_job and self.tls_dir is not None


@dataclass(frozen=True)
class MembershipPlan:
    """Membership TensorRT-LLM keeps itself (proxy config `disagg_cluster`, worker `--disagg_cluster_uri`)."""

    storage: str  # "http" (hosted by the proxy itself) | "etcd"
    # The storage itself, as the job reads it (membership.py): http://<node0>:PROXY_PORT or etcd://HOST:PORT
    # (<nodeN> placeholders, resolved at run time). Servers reach an etcd with certificates through their gateway.
    cluster_uri: str
    cluster_name: str
    heartbeat_interval_s: int
    inactive_timeout_s: int
    minimal_context: int
    minimal_generation: int
    worker_key_prefix: str  # where workers register: /trtllm-disagg/{cluster_name}/workers
    etcd: EtcdPlan | None = None  # storage etcd only
    # With an etcd that wants a client certificate: per component (proxy, ctx-0, ...) the loopback port of its
    # gateway (templates/etcd_gateway.py), which presents the certificate for it; its cluster_uri is that port.
    gateways: tuple[tuple[str, int], ...] = ()
    unauthenticated: bool = False  # storage anyone who reaches it can write, accepted by the recipe

    def uri_for(self, component: str) -> str:
        """The cluster_uri component (proxy, ctx-0, ...) is given: its gateway's, else the storage's own."""
        port = dict(self.gateways).get(component)
        return f"{trtllm.MEMBERSHIP_URI_SCHEMES['etcd']}://127.0.0.1:{port}" if port else self.cluster_uri


@dataclass(frozen=True)
class SlurmPlan:
    job_name: str
    nodes: int
    gpus_per_node: int
    partition: str | None
    account: str | None
    time_limit: str
    container_image: str | None  # as pyxis takes it (facts.containers.pyxis_image): registry images as REGISTRY#IMAGE
    container_mounts: tuple[str, ...]
    pending_timeout_s: int
    startup_timeout_s: int
    gpu_request: str = "none"  # "gres" | "gpus-per-node" | "none"
    exclusive: bool = False
    sbatch_args: tuple[str, ...] = ()  # extra #SBATCH arguments, checked by the rules
    srun_args: tuple[str, ...] = ()  # extra arguments of every server step (and the config check)
    image_note: str = ""  # how and why container_image differs from the recipe's spelling ("" when it does not)
    # `srun --mpi=` of every server step (cluster.mpi, else the engine's default: pmix for TensorRT-LLM's MPI
    # ranks); None: no --mpi (an engine that starts one process per server)
    mpi: str | None = None
    # the signal cluster.sbatch_args asks Slurm to send the batch shell before the time limit (--signal=B:SIG@T,
    # "SIGUSR1"): the job's orchestrator ends the deployment cleanly on it and says why (job.json time_limit_signal)
    time_limit_signal: str | None = None

    @property
    def gpu_directives(self) -> tuple[str, ...]:
        """The #SBATCH arguments that request GPUs and exclusivity."""
        out = {"gres": (f"--gres=gpu:{self.gpus_per_node}",),
               "gpus-per-node": (f"--gpus-per-node={self.gpus_per_node}",)}.get(self.gpu_request, ())
        return out + (("--exclusive",) if self.exclusive else ())


@dataclass(frozen=True)
class BoundPort:
    """A port a deployment binds: on which plan node, what binds it ("ctx-0", "proxy", "etcd peer", "gen-1's etcd
    gateway"), and the recipe setting that moves it (the doctor's and the preflight's advice)."""

    node: int
    port: int
    what: str
    setting: str


@dataclass(frozen=True)
class Plan:
    name: str
    recipe_file: str
    toolkit_version: str
    trtllm_version: str  # release line, e.g. "1.2"
    trtllm_release: str  # tag the version table was written from
    model: ModelSpec
    engine: EngineProfile  # the engine's profile row (toolkit.facts.engines)
    kv: KvGeometry
    kv_transfer: KvTransferPlan
    traffic: TrafficPlan
    buffer: BufferSizing
    estimates: Estimates
    context: RolePlan
    generation: RolePlan
    proxy: ProxyPlan | None  # None in an aggregated plan: no `trtllm-serve disaggregated` in front
    slurm: SlurmPlan
    supervision: SupervisionPlan
    node_count: int
    recipe: dict  # the resolved recipe (all defaults filled), for the manifest only: later stages read fields
    gpu: str  # cluster.gpu (a facts.hardware.GPU_FIGURES row)
    # The recipe's `quantization` (context's and generation's agree, a rule): the checkpoint the servers load;
    # None: the model's own (RoleMemory.quantization says what that is).
    quantization: str | None
    warnings: tuple[str, ...] = field(default_factory=tuple)
    # None: the line has no disagg_cluster, or the recipe turned membership off (static urls then).
    membership: MembershipPlan | None = None
    # "disaggregated", or "aggregated": the baseline on the same GPUs (toolkit.plan.aggregated). An aggregated
    # plan's servers are `aggregated`'s instances, plain `trtllm-serve MODEL` (role "agg"), with no proxy and
    # no membership; `context` and `generation` stay the disaggregated roles it was derived from.
    mode: str = "disaggregated"
    aggregated: RolePlan | None = None
    # Where values came from when the recipe file did not write them: the site defaults file merged under the
    # recipe (toolkit.recipe.site), and (dotted field, value as text, "SITE_FILE:LINE" | "--set EXPR") for each
    # such value.
    site_file: str | None = None
    value_sources: tuple[tuple[str, str, str], ...] = ()
    # The exact TensorRT-LLM release the options were checked for ("1.3.0rc23"), where the recipe or its image says;
    # None: the line (trtllm_version), any release of it.
    target_release: str | None = None
    # What a deployment of the target TensorRT-LLM line does differently from the line before's (its facts row's
    # changes: a default, fields, environment), shown by tk plan.
    trtllm_changes: tuple[str, ...] = ()

    @property
    def is_aggregated(self) -> bool:
        return self.mode == "aggregated"

    @property
    def roles(self) -> tuple[RolePlan, ...]:
        """The roles whose servers this plan runs (and renders files for)."""
        if self.is_aggregated:
            return (self.aggregated,)
        return (self.context, self.generation)

    @property
    def servers(self) -> tuple[ServerInstance, ...]:
        return tuple(s for role in self.roles for s in role.instances)

    @property
    def gpu_count(self) -> int:
        return sum(role.gpu_count for role in self.roles)

    def role(self, name: Role | str) -> RolePlan:
        """The role named ctx, gen or agg."""
        for role in self.roles:
            if role.role == name:
                return role
        raise KeyError(name)

    @property
    def bound_ports(self) -> tuple[BoundPort, ...]:
        """Every port this deployment binds, on which node, what binds it and the recipe setting that moves it: the
        servers (HTTP and internal, bound by rank 0 on the first node), the proxy, the etcd the job starts (client
        and peer) and each component's etcd gateway."""
        out = []
        for s in self.servers:
            out.append(BoundPort(s.first_node, s.port, s.name, "cluster.worker_base_port"))
            out.extend(BoundPort(s.first_node, p, f"{s.name} {env}", "cluster.internal_base_port")
                       for env, p in s.internal_ports)
        if self.proxy is not None:
            out.append(BoundPort(self.proxy.node, self.proxy.port, "proxy", "proxy.port"))
        etcd = self.membership.etcd if self.membership else None
        if etcd and etcd.started_by_job and etcd.node is not None and etcd.port and etcd.peer_port:
            out += [BoundPort(etcd.node, etcd.port, "etcd client", "membership.etcd_port"),
                    BoundPort(etcd.node, etcd.peer_port, "etcd peer", "membership.etcd_port")]
        if self.membership and self.membership.gateways:
            nodes = {s.name: s.first_node for s in self.servers}
            if self.proxy is not None:
                nodes["proxy"] = self.proxy.node
            out.extend(BoundPort(nodes[name], port, f"{name}'s etcd gateway", "membership.etcd_port")
                       for name, port in self.membership.gateways)
        return tuple(out)

    @property
    def ports_by_node(self) -> tuple[tuple[int, ...], ...]:
        """Per node index, the ports this deployment binds there (bound_ports)."""
        ports: list[list[int]] = [[] for _ in range(self.node_count)]
        for b in self.bound_ports:
            ports[b.node].append(b.port)
        return tuple(tuple(sorted(p)) for p in ports)

    def to_dict(self) -> dict:
        return asdict(self)
