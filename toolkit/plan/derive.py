"""Stage 2, first half: everything a plan holds, derived from the recipe and the facts before any rule is checked.

``derive`` computes the numbers and files' contents as if the recipe were valid: tk's options and each role's
extra_options as TensorRT-LLM reads them, the transfer buffer, the memory plans, the cache transceiver and what it
moves (toolkit/plan/transceiver.py), placement and ports, membership, environment, KV geometry and estimates. It
refuses nothing, except a model it cannot resolve (without one nothing else can be derived). Then the rules
(``toolkit.plan.rules.RULES``) read the ``Derivation`` and report, and ``toolkit.plan.build`` assembles the Plan from
it. A rule never computes plan data; a derivation never refuses.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.states import Role
from toolkit.errors import RecipeError
from toolkit.facts import llm_args, trtllm
from toolkit.facts import options as option_kinds
from toolkit.facts.containers import PyxisImage, pyxis_image
from toolkit.facts.engines import ENGINES, EngineProfile, emulated_label
from toolkit.facts.hardware import TRANSPORT_PROFILES, TransportProfile
from toolkit.facts.models import BUILTIN_MODELS, ModelError, ModelSpec, resolve_model
from toolkit.plan import memory, options, placement, rules, sizing
from toolkit.plan.transceiver import TransceiverDerivation, derive_transceiver
from toolkit.plan.model import (BufferSizing, EtcdPlan, Estimates, KvGeometry, MembershipPlan, RoleMemory,
                                ServerInstance)
from toolkit.recipe.loader import LoadedRecipe
from toolkit.recipe.schema import Recipe, RoleSpec

ETCD_TLS_DIR = "<run_dir>/secrets/etcd"  # where tk launch writes the run's certificates (launch.sbatch resolves it)


@dataclass(frozen=True)
class Emulation:
    """`standin.emulate` as derived: what the engine is given as the model (a built-in name, or the directory made
    absolute) and its facts; ``error`` where the model cannot be resolved (rules.check_emulation reports it);
    ``kv_report`` the absolute path of the validation report ``kv_validation`` names, None where it names none or
    there is none (rules.check_emulation reports the latter)."""

    model_arg: str | None
    spec: ModelSpec | None
    error: ModelError | None = None
    kv_report: str | None = None


@dataclass(frozen=True)
class RoleDerivation:
    """One role (context or generation) as derived."""

    title: str  # context | generation (the recipe section)
    role: Role
    spec: RoleSpec
    derived: dict  # the LLM-API options tk writes from the recipe, before extra_options
    options: dict  # ctx.yaml / gen.yaml: ``derived`` with the role's extra_options as TensorRT-LLM reads them
    span: int  # nodes one instance spans
    instances: tuple[ServerInstance, ...]
    env: dict  # ctx.env / gen.env


@dataclass(frozen=True)
class SlurmSignal:
    """One --signal of cluster.sbatch_args as Slurm reads it."""

    arg: str  # as written
    batch: bool  # B: the batch shell only (the job's orchestrator), not the job steps (the servers)
    name: str | None  # the signal's name ("SIGUSR1"); None where Slurm names no signal so (rules.check_slurm_signal)
    seconds: int  # sent this long before the time limit


@dataclass(frozen=True)
class Derivation:
    """A recipe's plan data, derived before any rule is checked."""

    loaded: LoadedRecipe
    version: trtllm.TrtllmVersion
    target: llm_args.Target
    engine: EngineProfile  # the engine's profile (its label says so where the timing is emulated)
    model: ModelSpec
    transport: TransportProfile
    emulation: Emulation | None
    buffer: BufferSizing
    extra_layers: int  # KV layers TensorRT-LLM adds for MTP (facts.versions.mtp_kv_layers)
    context: RoleDerivation
    generation: RoleDerivation
    node_count: int
    membership: MembershipPlan | None
    weights_quant: memory.WeightsQuant
    weights_quant_note: str | None  # why the weights' quantization is uncertain (a warning)
    memories: dict[str, RoleMemory]  # title -> the memory plan of one of its GPUs
    transceiver: TransceiverDerivation  # each role's TensorRT-LLM cache transceiver, what it moves per rank pair
    geometry: KvGeometry
    estimates: Estimates
    image: PyxisImage | None
    slurm_signals: tuple[SlurmSignal, ...] = ()  # cluster.sbatch_args' --signal, each as Slurm reads it

    @property
    def recipe(self) -> Recipe:
        return self.loaded.recipe

    @property
    def time_limit_signal(self) -> str | None:
        """The signal Slurm sends the batch shell (the job's orchestrator) before the time limit (--signal=B:SIG@T)."""
        return next((s.name for s in self.slurm_signals if s.batch and s.name), None)

    @property
    def roles(self) -> tuple[RoleDerivation, RoleDerivation]:
        return (self.context, self.generation)

    @property
    def merged(self) -> dict[str, dict]:
        """title -> the role's LLM-API options, what the rules that read option values read."""
        return {d.title: d.options for d in self.roles}

    @property
    def servers(self) -> tuple[ServerInstance, ...]:
        return self.context.instances + self.generation.instances


def derive(loaded: LoadedRecipe) -> Derivation:
    """The recipe's plan data (module doc); RecipeError only for a model tk cannot resolve."""
    r = loaded.recipe
    version = trtllm.get(r.trtllm_version)
    target = llm_args.Target(version.line, loaded.release)
    engine = ENGINES[r.engine]
    try:
        model = resolve_model(r.model, base_dir=loaded.base_dir, config_dirs=model_config_dirs(r))
    except ModelError as exc:
        raise RecipeError([loaded.violation("model", str(exc), exc.fix or "use a name from `tk recipes --models` "
                                                                          "or a directory with config.json")]) from None
    transport = TRANSPORT_PROFILES[r.kv_transfer.transport]
    emulation = emulation_of(r, engine, loaded.base_dir)
    buffer = sizing.size_buffer(r)
    merged = {}
    derived = {}
    for title, spec in (("context", r.context), ("generation", r.generation)):
        derived[title] = options.derived_options(r, title, spec, model, version, buffer, target)
        extra = extra_as_read(r, title, spec, derived[title], version, target)
        merged[title] = options.deep_merge(derived[title], extra)
    extra_layers = sizing.spec_layers(r, version)
    q, note = memory.weights_quant(model, r.context.quantization or r.quantization,
                                   bool(r.model_path or r.context.model_path or r.generation.model_path))
    drafts = {title: draft_model_of(loaded, opts) for title, opts in merged.items()}
    memories = memory.role_memories(r, model, engine, q, merged, extra_layers, drafts)
    transceiver = derive_transceiver(r, target, model, merged, buffer, extra_layers, sizing.longest_input(r))

    gpn = r.cluster.gpus_per_node
    port = r.cluster.worker_base_port
    cursor = placement.GpuCursor(gpn)
    ctx_instances = placement.place(Role.CTX, r.context, cursor, first_port=port, uses_mpi=engine.uses_mpi)
    if not r.cluster.share_nodes:
        cursor.next_node()
    gen_instances = placement.place(Role.GEN, r.generation, cursor, first_port=port + len(ctx_instances),
                                    uses_mpi=engine.uses_mpi)
    servers = placement.internal_ports(ctx_instances + gen_instances, version, engine,
                                       r.cluster.internal_base_port or r.cluster.worker_base_port + 1000)
    ctx_instances, gen_instances = servers[:len(ctx_instances)], servers[len(ctx_instances):]

    env_base = options.worker_env(r, version, engine, transport, target)
    if emulation is not None and emulation.model_arg is not None:
        env_base.update(options.emulation_env(r, engine, transport, emulation.model_arg, emulation.kv_report))
        emu = r.standin.emulate
        engine = dataclasses.replace(engine, label=emulated_label(engine, emulation.model_arg, emu.gpu, emu.precision))

    geometry = sizing.geometry(r, model, extra_layers)
    if emulation is not None and emulation.spec is not None:  # the run's timing is the emulated model's on its GPU
        estimates = sizing.estimates(r, emulation.spec, sizing.geometry(r, emulation.spec, extra_layers), transport,
                                     gpu=r.standin.emulate.gpu)
    else:
        estimates = sizing.estimates(r, model, geometry, transport)

    def role(title: str, name: Role, spec: RoleSpec, instances: tuple[ServerInstance, ...]) -> RoleDerivation:
        return RoleDerivation(title=title, role=name, spec=spec, derived=derived[title], options=merged[title],
                              span=placement.nodes_per_instance(spec, gpn), instances=instances,
                              env={**env_base, **spec.env})

    return Derivation(
        loaded=loaded, version=version, target=target, engine=engine, model=model, transport=transport,
        emulation=emulation, buffer=buffer, extra_layers=extra_layers,
        context=role("context", Role.CTX, r.context, ctx_instances),
        generation=role("generation", Role.GEN, r.generation, gen_instances),
        node_count=1 + max(n for s in servers for n in s.nodes), membership=membership_plan(r, version, servers),
        weights_quant=q, weights_quant_note=note, memories=memories, transceiver=transceiver,
        geometry=geometry, estimates=estimates,
        image=pyxis_image(r.cluster.container_image) if r.cluster.container_image else None,
        slurm_signals=slurm_signals(r.cluster.sbatch_args))


# Slurm's --signal=[{R|B}:]SIG[@TIME] (sbatch(1), Slurm 22.05.8 on Debian 12: "When a job is within sig_time
# seconds of its end time, send it the signal sig_num ... Use the "B:" option to signal only the batch shell, none of
# the other processes will be signaled. By default all job steps will be signaled, but not the batch shell itself.";
# sig_num a number or a name, "10" or "USR1"; sig_time 0..65535, 60 when omitted).
_SLURM_SIGNAL = re.compile(r"(?:(?P<flags>[RBrb]+):)?(?P<sig>[A-Za-z0-9+]+)(?:@(?P<time>[0-9]+))?")


def slurm_signals(args: Sequence[str]) -> tuple[SlurmSignal, ...]:
    """Each --signal of sbatch arguments, as Slurm reads it."""
    out = []
    items = list(args)
    for i, arg in enumerate(items):
        name, eq, value = arg.partition("=")
        if len(name) < 5 or not "--signal".startswith(name):  # getopt takes an unambiguous prefix (--sig)
            continue
        if not eq:
            value = items[i + 1] if i + 1 < len(items) else ""
        m = _SLURM_SIGNAL.fullmatch(value.strip())
        if not m:
            out.append(SlurmSignal(arg, False, None, 60))
            continue
        sig = m["sig"].upper()
        if sig.isdigit():
            try:
                sig = signal.Signals(int(sig)).name
            except ValueError:
                sig = ""
        else:
            sig = sig if sig.startswith("SIG") else f"SIG{sig}"
            sig = sig if sig in signal.Signals.__members__ else ""
        out.append(SlurmSignal(arg, "B" in (m["flags"] or "").upper(), sig or None, int(m["time"] or 60)))
    return tuple(out)


def model_config_dirs(r: Recipe) -> tuple[tuple[str, str], ...]:
    """Where a model given by its Hugging Face id may have its config.json on this machine: the checkpoint
    directories the recipe names (model_path, per role too), as written and, where a container mount maps one
    into the container, at its source on the host (a login node sees /lustre/models/X, the servers /models/X)."""
    paths = dict.fromkeys(p for p in (r.model_path, r.context.model_path, r.generation.model_path) if p)
    return tuple(d for path in paths for d in host_dirs("model_path", path, r.cluster.container_mounts))


def host_dirs(what: str, path: str, mounts) -> list[tuple[str, str]]:
    """A directory the servers see, as written and, where a container mount maps it, at its source on the host."""
    out = [(what, path)]
    for mount in mounts:
        src, dst = mount.split(":")[:2]
        dst = dst.rstrip("/") or "/"
        if path == dst or path.startswith(dst.rstrip("/") + "/"):
            out.append((f"{what} through the mount {mount}", src.rstrip("/") + path[len(dst.rstrip("/")):]))
    return out


def draft_model_of(loaded: LoadedRecipe, opts: dict) -> ModelSpec | None:
    """The config.json of the speculative draft model a server loads (speculative_config's speculative_model /
    speculative_model_dir: a directory, through a container mount too, or a Hugging Face id in the cache), where
    tk can read it on this machine; None otherwise (the memory plan then estimates, and says so)."""
    spec = opts.get("speculative_config")
    if not isinstance(spec, dict) or spec.get("decoding_type") not in memory.EAGLE_DRAFTS + memory.SEPARATE_DRAFTS:
        return None
    path = spec.get("speculative_model") or spec.get("speculative_model_dir")
    if not isinstance(path, str) or not path:
        return None
    dirs = tuple(d for d in host_dirs("speculative model", path, loaded.recipe.cluster.container_mounts)[1:])
    try:
        return resolve_model(path, base_dir=loaded.base_dir, config_dirs=dirs)
    except ModelError:
        return None


def extra_as_read(r: Recipe, title: str, spec: RoleSpec, derived: dict, version: trtllm.TrtllmVersion,
                  target: llm_args.Target) -> dict:
    """A role's extra_options as TensorRT-LLM reads them and tk writes them: pydantic's lax conversions applied;
    what TensorRT-LLM could not read (a value of the wrong kind, a key that is not text) and what contradicts a value
    tk derives (rules.owned_conflict) left out, so tk's value stands there. check_extra_options reports both."""
    extra = option_kinds.lax_converted(spec.extra_options, target, drop=True)
    implied = {**trtllm.TK_IMPLIED_OPTIONS, "model": spec.model_path or r.model_path or r.model}
    for dotted, owner in trtllm.TK_OWNED_OPTIONS.items():
        *parents, key = dotted.split(".")
        node = extra
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if not isinstance(node, dict) or key not in node:
            continue
        tk_value = rules.owned_value(dotted, derived, implied)
        if rules.owned_conflict(dotted, node[key], tk_value, owner.replace("{role}", title), title, spec.tp,
                                version) is not None:
            del node[key]
    return extra


def emulation_of(r: Recipe, engine: EngineProfile, base_dir: Path | None) -> Emulation | None:
    """`standin.emulate` for an engine that can emulate timing (its profile names the env it reads); None where
    there is nothing to emulate or the engine cannot (rules.check_emulation refuses that)."""
    emu = r.standin.emulate if r.standin else None
    if emu is None or engine.emulate_env_prefix is None:
        return None
    try:
        spec = resolve_model(emu.model, base_dir=base_dir)
    except ModelError as exc:
        return Emulation(None, None, exc)
    report = emulation_report(emu.kv_validation, base_dir) if emu.kv_validation else None
    if spec.name in BUILTIN_MODELS:
        return Emulation(spec.name, spec, kv_report=report)
    return Emulation(str(_under(emu.model, base_dir).resolve()), spec, kv_report=report)


def emulation_report(given: str, base_dir: Path | None) -> str | None:
    """The absolute path of the validation report ``standin.emulate.kv_validation`` names (a run directory holding
    report.json, or the file), read relative to the recipe's directory; None when there is none."""
    path = _under(given, base_dir)
    report = path / "report.json" if path.is_dir() else path
    return str(report.resolve()) if report.is_file() else None


def _under(given: str, base_dir: Path | None) -> Path:
    """A path the recipe gives, relative to the recipe's directory unless absolute (``~`` expanded)."""
    path = Path(given).expanduser()
    return Path(base_dir) / path if not path.is_absolute() and base_dir is not None else path


def membership_plan(r: Recipe, version: trtllm.TrtllmVersion, servers: tuple[ServerInstance, ...]
                    ) -> MembershipPlan | None:
    """The membership TensorRT-LLM keeps (disagg_cluster), or None where it is off (the default: static urls) or the
    line lacks it. rules.check_membership says what is refused and why (who can write the storage)."""
    m = r.membership
    if m.enabled is False or not version.cluster_storages:
        return None
    etcd = None
    if m.storage == "etcd":
        if m.etcd_endpoint:
            etcd = EtcdPlan(endpoint=m.etcd_endpoint, started_by_job=False, node=None, port=None, peer_port=None,
                            tls_dir=m.etcd_tls_dir)
        else:
            etcd = EtcdPlan(endpoint=f"<node0>:{m.etcd_port}", started_by_job=True, node=0, port=m.etcd_port,
                            peer_port=m.etcd_port + 1, tls_dir=ETCD_TLS_DIR)
        uri = f"{trtllm.MEMBERSHIP_URI_SCHEMES['etcd']}://{etcd.endpoint}"
    else:
        uri = f"{trtllm.MEMBERSHIP_URI_SCHEMES['http']}://<node0>:{r.proxy.port}"
    # one loopback gateway port per component, from etcd_port + 2 on, where the etcd wants a client certificate
    gateways: tuple[tuple[str, int], ...] = ()
    if etcd is not None and etcd.tls_dir is not None:
        names = [str(Role.PROXY), *(s.name for s in servers)]
        gateways = tuple(zip(names, (m.etcd_port + 2 + i for i in range(len(names)))))
    name = m.cluster_name or r.name
    # minimal_instances is the supervision minimum (checked by check_supervision): a proxy that required every
    # instance would refuse all requests while one worker restarts.
    return MembershipPlan(storage=m.storage, cluster_uri=uri, cluster_name=name,
                          heartbeat_interval_s=m.heartbeat_interval_s, inactive_timeout_s=m.inactive_timeout_s,
                          minimal_context=r.supervision.min_context, minimal_generation=r.supervision.min_generation,
                          worker_key_prefix=trtllm.MEMBERSHIP_KEY_PREFIX.format(cluster_name=name),
                          etcd=etcd, gateways=gateways, unauthenticated=rules.unauthenticated_storage(r) is not None)
