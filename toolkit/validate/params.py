"""What the agents are told to do: nodes and roles, the schedule, the KV geometry of the payloads,
lengths, iterations, timeouts. Written to RUN_DIR/params.json; agents read nothing else.

Pure (no numpy, no NIXL): the coordinator may run on a login node that has neither.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

from orchestrator.states import Role
from toolkit.errors import TkError
from toolkit.facts import transceiver as T
from toolkit.plan.model import Plan
from validation.layout import ceil_to
from validation.schedule import round_robin
from validation.wire import PROTOCOL

SWEEP_TOKENS_PER_BLOCK = (16, 32, 64, 128, 256)
# TensorRT-LLM never READs: both transceivers WRITE from the context side (toolkit/facts/transceiver.py). READ is
# measured only when asked (--read), and reported as not what TensorRT-LLM issues.
TRTLLM_OPS = ("WRITE",)
ALL_OPS = ("WRITE", "READ")
# The descriptor-size curve: the longest request's bytes of one rank pair in this many equal descriptors, raw NIXL
# WRITEs (context -> generation); 1 is what the transport can do with these bytes (the threshold's basis).
CURVE_DESCRIPTORS = (1, 4, 16, 64, 256, 1024, 2048)
# Destination slots per request: transfers go in bursts of one per slot, back to back, and the check runs
# between bursts (validation/pair.py). With a slot per transfer (warm-up + timed, up to BURST_SLOTS) a
# request is one burst: every check after the timed window. On CPU transports the first one or two
# transfers after a check run ~20 % slower (benchmarks/bench_validate.py): in one burst those are the
# warm-ups. Fewer slots when the memory cap needs it (before layers shrink); shorter requests get up to
# BURST_SLOTS from the same pool.
BURST_SLOTS = 16
SHORT_REQUEST_TOKENS = 128


class ValidateError(TkError):
    """A validation that cannot start (bad options, no Slurm, ...): exit 1 with the reason."""


@dataclass
class Options:
    mode: str = "slurm"  # slurm | in-allocation | local
    nodes: int | None = None  # --local --nodes N
    memory: str = "auto"  # auto | dram | vram
    max_memory_mb: int = 256
    iterations: int = 10
    warmup: int = 2
    sweep: bool = True
    sweep_iterations: int = 5
    sweep_repeats: int = 3
    reverse: bool = True
    read: bool = False  # also READ (the destination pulls): not what TensorRT-LLM issues
    curve: bool = True  # the descriptor-size curve (1 .. 2048 descriptors of the same bytes)
    lengths: tuple[int, ...] | None = None
    min_fraction: float | None = None
    transfer_timeout_s: float = 30.0
    rendezvous_timeout_s: float | None = None
    timeout_s: float = 900.0
    pending_timeout_s: float | None = None
    run_dir: str | None = None
    python: str | None = None
    progress_thread: bool | None = None
    proto_info: bool = True
    fault: dict | None = field(default=None)


def agents_for(plan: Plan, opts: Options) -> list[dict]:
    """One agent per node and role: the plan's context nodes and generation nodes, or N local ones."""
    if opts.mode == "local" and opts.nodes:
        if opts.nodes < 2:
            raise ValidateError("--nodes must be at least 2 (one context and one generation node)")
        n_ctx = max(1, opts.nodes // 2)
        return [{"id": f"node{i}", "node": i, "role": Role.CTX if i < n_ctx else Role.GEN, "gpu": 0}
                for i in range(opts.nodes)]
    by_node: dict[int, dict[str, int]] = {}
    for role in plan.roles:
        for inst in role.instances:
            for node in inst.nodes:
                by_node.setdefault(node, {}).setdefault(role.role, inst.gpus[0] if inst.gpus else 0)
    agents = []
    for node in sorted(by_node):
        roles = by_node[node]
        for role in (Role.CTX, Role.GEN):
            if role in roles:
                agent_id = f"node{node}" if len(roles) == 1 else f"node{node}-{role}"
                agents.append({"id": agent_id, "node": node, "role": role, "gpu": roles[role]})
    return agents


def _lengths(plan: Plan, opts: Options, tpb: int) -> list[int]:
    traffic = plan.traffic
    longest = plan.kv.largest_request_tokens
    if opts.lengths:
        chosen = list(opts.lengths)
    else:
        typical = traffic.typical_input_len
        typical = typical + traffic.prefix_len if typical else max(1, longest // 4)
        chosen = [min(SHORT_REQUEST_TOKENS, longest), min(typical, longest), longest]
    out = sorted({ceil_to(tpb, max(1, int(n))) for n in chosen})
    return out


def _slices(plan: Plan, tpbs: list[int], notes: list[str]) -> tuple[dict, int, str]:
    """Per role the bytes one token takes in one layer slice (K or V, or the latent) on a rank, the fragment a
    context rank sends a generation rank, and the mode: "block" where both roles' slices match, else "fragment"
    (TP differs). Rounded up to 8 bytes (with a note) where a slice is not, so every byte is checked as 64-bit
    words at every tokens_per_block in ``tpbs``."""
    kvf = plan.model.kv_factor
    slot = {Role.CTX: plan.context.kv.bytes_per_token_per_layer_per_rank / kvf,
            Role.GEN: plan.generation.kv.bytes_per_token_per_layer_per_rank / kvf}
    mode = "block" if slot[Role.CTX] == slot[Role.GEN] else "fragment"
    frag = min(slot.values())

    def aligned(x):
        return all((t * x) % 8 == 0 for t in tpbs) and float(x).is_integer()

    if not (aligned(slot[Role.CTX]) and aligned(slot[Role.GEN]) and aligned(frag)):
        slot = {s: ceil_to(8, math.ceil(v)) for s, v in slot.items()}
        frag = min(slot.values()) if mode == "fragment" else slot[Role.CTX]
        notes.append("per-token slices rounded up to a multiple of 8 bytes so every byte can be checked as "
                     "64-bit words")
    return {s: int(v) for s, v in slot.items()}, int(frag), mode


def _transfer(plan: Plan, lengths: list[int], full_bytes_per_token: int, mode: str) -> dict:
    """What the recipe's transceiver moves (params' geometry.transfer): its runtime and layout and, per length,
    whether the request is gathered into one region (the bounce buffer coalesces only what clears its gate, judged
    on TensorRT-LLM's bytes: ``full_bytes_per_token``, every layer of the rank pair)."""
    tr = plan.kv_transfer.transceiver
    tpb = plan.kv.tokens_per_block
    if tr is None:
        mapper = (T.Layout.PER_BLOCK if mode == "block" else T.Layout.HEAD_MISMATCH).value
        return {"runtime": None, "layout": mapper, "mapper": mapper, "label": "descriptor lists",
                "bounce_size_mb": 0, "staged": [False] * len(lengths), "plan_model": None}
    staged_lengths = [T.layout_for(tr.runtime, tr.mapper, tr.bounce_size_mb, ceil_to(tpb, n) * full_bytes_per_token,
                                   tr.writers_per_generation_rank).gathers for n in lengths]
    return {"runtime": tr.runtime.value, "layout": tr.layout.value, "mapper": tr.mapper.value,
            "label": tr.runtime.label, "bounce_size_mb": tr.bounce_size_mb, "staged": staged_lengths,
            "writers": tr.writers_per_generation_rank,
            "plan_model": tr.model, "plan_pair_bytes": tr.longest.total_bytes}


@dataclass(frozen=True)
class _Registration:
    """What an agent registers for a request shape: its role's blocks (with spares), then, where the transceiver
    stages a request, the staging slices."""

    tpb: int  # tokens per block
    kvf: int  # K and V, or one latent
    slot: dict  # per role: bytes per token of one layer slice on a rank
    frag: int  # bytes per token of one layer slice a context rank sends a generation rank
    staged: bool  # the transceiver gathers a request into a staging slice (one descriptor per rank pair)

    def pools(self, layers: int, tokens: int, slots: int = 1) -> dict:
        """Per role the bytes of ``slots`` requests' blocks, plus spare blocks (scattered block tables, untouched
        blocks)."""
        blocks = slots * math.ceil(tokens / self.tpb)
        blocks += max(2, math.ceil(blocks / 4))
        return {s: blocks * self.tpb * layers * self.kvf * self.slot[s] for s in (Role.CTX, Role.GEN)}

    def staging(self, layers: int, tokens: int, slots: int) -> int:
        """A staged transfer's slices after the blocks: one to send from, one per destination slot to land in."""
        return (1 + slots) * ceil_to(self.tpb, tokens) * layers * self.kvf * self.frag if self.staged else 0

    def registered(self, pools: dict, layers: int, tokens: int, slots: int) -> int:
        return max(pools.values()) + self.staging(layers, tokens, slots)


@dataclass
class _Fit:
    """The request shape each agent registers buffers for, shrunk step by step to fit --max-memory-mb: fewer burst
    slots first, then fewer layers, then shorter requests (each step with the note that says so)."""

    reg: _Registration
    cap: int  # bytes: --max-memory-mb
    layers: int
    lengths: list[int]
    slots: int  # the longest request's burst slots
    sweep_tokens: int  # the tokens_per_block sweep's request (0: no sweep)
    sweep_tpbs: list[int]

    @property
    def longest(self) -> int:
        return max(self.lengths)

    @property
    def pool_tokens(self) -> int:
        return max(self.longest, self.sweep_tokens)

    @property
    def pools(self) -> dict:
        return self.reg.pools(self.layers, self.pool_tokens, self.slots)

    def fits(self) -> bool:
        return self.reg.registered(self.pools, self.layers, self.longest, self.slots) <= self.cap

    def fewer_slots(self) -> None:
        while self.slots > 1 and not self.fits():
            self.slots -= 1

    def fewer_layers(self) -> None:
        """One slot, and as many layers as one request of the longest length (and the sweep's) fits."""
        self.slots = 1
        per_layer = self.reg.registered(self.reg.pools(1, self.pool_tokens), 1, self.longest, 1)
        self.layers = max(1, self.cap // per_layer)

    def shorter_requests(self, notes: list[str]) -> None:
        """Lengths (and the sweep's request) capped at what one layer of one slot fits."""
        tpb = self.reg.tpb
        per_token = self.reg.registered(self.reg.pools(1, tpb * 4), 1, tpb * 4, 1) / (tpb * 4)
        fit = max(tpb, int(self.cap / per_token) // tpb * tpb)
        self.lengths = sorted({min(n, fit) for n in self.lengths})
        if self.sweep_tokens:
            self.sweep_tokens = (fit // 256) * 256
            if not self.sweep_tokens:
                self.sweep_tpbs = []
                notes.append("tokens_per_block sweep skipped: a 256-token request does not fit --max-memory-mb")


def _fit_memory(fit: _Fit, opts: Options, layers_total: int, mode: str, notes: list[str]) -> None:
    """Shrink ``fit`` until each agent registers at most --max-memory-mb, noting every step taken."""
    reg = fit.reg
    wanted_slots = fit.slots
    fit.fewer_slots()
    if fit.slots < wanted_slots:
        notes.append(f"the longest request is timed in bursts of {fit.slots} transfer(s) instead of {wanted_slots} to "
                     f"fit --max-memory-mb={opts.max_memory_mb}: more of its timed transfers directly follow a check, "
                     "which on CPU transports (shared memory, TCP) reads lower, not on RDMA (docs/validate.md)")
    if fit.fits():
        return
    fit.fewer_layers()
    effect = ("the one staged descriptor per rank pair shrinks with them" if reg.staged else
              "descriptor sizes are unchanged (one per layer and K/V)" if mode == "fragment" else
              f"each block descriptor is {reg.tpb * fit.layers * reg.kvf * reg.slot[Role.CTX]} bytes instead of "
              f"{reg.tpb * layers_total * reg.kvf * reg.slot[Role.CTX]}")
    notes.append(f"layers scaled down from {layers_total} to {fit.layers} per request so each agent registers at most "
                 f"--max-memory-mb={opts.max_memory_mb} MiB; bytes per request shrink by the same factor and "
                 f"{effect}")
    if fit.fits():
        return
    fit.shorter_requests(notes)
    notes.append(f"request lengths capped at {fit.longest} tokens to fit --max-memory-mb={opts.max_memory_mb}")


def geometry(plan: Plan, opts: Options) -> tuple[dict, list[int], list[str]]:
    """The payload shape per side, the pool sizes and the lengths, within --max-memory-mb; plus notes."""
    kv = plan.kv
    tpb = kv.tokens_per_block
    notes: list[str] = []
    kvf = plan.model.kv_factor  # one descriptor per K and per V (GQA), or per latent (MLA)
    layers_total = min(plan.context.kv.layers_per_rank, plan.generation.kv.layers_per_rank)
    # What the recipe's transceiver moves (toolkit/facts/transceiver.py): the C++ one (and the Python one's bounce
    # buffer) gathers a request into a staging slice and WRITEs one descriptor; the Python one the mapper's lists.
    tr = plan.kv_transfer.transceiver
    staged = tr is not None and tr.layout.gathers
    sweep_tpbs = sorted({*SWEEP_TOKENS_PER_BLOCK, tpb}) if opts.sweep and not staged else []
    if opts.sweep and staged:
        notes.append(f"tokens_per_block sweep skipped: the {tr.runtime.label} moves one descriptor per rank pair "
                     "whatever tokens_per_block is (the descriptor-size curve shows what a list would cost)")
    slot, frag, mode = _slices(plan, [tpb, *sweep_tpbs], notes)

    lengths = _lengths(plan, opts, tpb)
    fit = _Fit(_Registration(tpb, kvf, slot, frag, staged), cap=int(opts.max_memory_mb) * 2**20, layers=layers_total,
               lengths=lengths, slots=max(1, min(BURST_SLOTS, opts.warmup + opts.iterations)),
               sweep_tokens=ceil_to(256, max(lengths)) if sweep_tpbs else 0, sweep_tpbs=sweep_tpbs)
    wanted_slots = fit.slots
    _fit_memory(fit, opts, layers_total, mode, notes)
    layers, pools = int(fit.layers), fit.pools
    slice_bytes = ceil_to(tpb, fit.longest) * layers * kvf * frag
    stage = fit.reg.staging(layers, fit.longest, fit.slots)

    geom = {
        "mode": mode,
        "attention": kv.attention,
        "tokens_per_block": tpb,
        "kv_factor": kvf,
        "layers": layers,
        "layers_per_rank": layers_total,
        "slot_bytes_per_token": slot,
        "frag_bytes_per_token": frag if mode == "fragment" else layers * kvf * slot[Role.CTX],
        "bytes_per_token": layers * kvf * frag,  # what one ctx rank sends one gen rank, per token
        "bytes_per_token_full": layers_total * kvf * frag,
        "descriptors_per_block": 1 if mode == "block" else layers * kvf,
        "descriptor_bytes": tpb * (layers * kvf * slot[Role.CTX] if mode == "block" else frag),
        "pool_bytes": {s_: pools[s_] + stage for s_ in pools},  # what each agent registers: blocks, then staging
        "blocks_bytes": pools,
        "staging": ({"offset": dict(pools), "slice_bytes": slice_bytes, "recv_slices": fit.slots} if stage else None),
        "transfer": _transfer(plan, fit.lengths, layers_total * kvf * frag, mode),
        "pool_tokens": fit.pool_tokens,
        "slots": fit.slots,  # the longest request's
        "burst_slots": wanted_slots,  # what shorter requests may use when the pool holds them
        "sweep_tokens": fit.sweep_tokens,
        "sweep_tokens_per_block": fit.sweep_tpbs,
        "notes": notes,
    }
    return geom, fit.lengths, notes


def build_params(plan: Plan, opts: Options, run_dir: str) -> dict:
    if opts.memory not in ("auto", "dram", "vram"):
        raise ValidateError(f"--memory must be auto, dram or vram, not {opts.memory!r}")
    if opts.iterations < 1 or opts.warmup < 0:
        raise ValidateError("--iterations must be >= 1 and --warmup >= 0")
    agents = agents_for(plan, opts)
    ctx = [a["id"] for a in agents if a["role"] == Role.CTX]
    gen = [a["id"] for a in agents if a["role"] == Role.GEN]
    if not ctx or not gen:
        raise ValidateError("the plan has no context or no generation node to pair")
    geom, lengths, _ = geometry(plan, opts)
    transport = plan.estimates.transport
    profile = plan.kv_transfer.transport
    memory = opts.memory
    if memory == "auto":
        memory = plan.engine.validate_memory  # e.g. dram for an engine whose KV cache is in host memory
    local = opts.mode == "local"
    progress_thread = (not local) if opts.progress_thread is None else opts.progress_thread
    t = opts.transfer_timeout_s
    rendezvous = opts.rendezvous_timeout_s or (60.0 if local else 180.0)
    return {
        "protocol": PROTOCOL,
        "run_id": uuid.uuid4().hex,
        "run_dir": run_dir,
        "recipe": plan.name,
        "mode": opts.mode,
        "agents": agents,
        "rounds": [[list(p) for p in pairs] for pairs in round_robin(ctx, gen)],
        "env": {Role.CTX: dict(plan.context.env), Role.GEN: dict(plan.generation.env)},
        "backend": profile.nixl_transport,
        "memory": memory,
        "progress_thread": progress_thread,
        "proto_info": opts.proto_info,
        "geometry": geom,
        "lengths": lengths,
        "iterations": opts.iterations,
        "warmup": opts.warmup,
        "directions": ["forward", "reverse"] if opts.reverse else ["forward"],
        "ops": list(ALL_OPS if opts.read else TRTLLM_OPS),
        "sweep": ({"tokens_per_block": geom["sweep_tokens_per_block"], "tokens": geom["sweep_tokens"],
                   "iterations": opts.sweep_iterations, "repeats": opts.sweep_repeats,
                   "ops": list(ALL_OPS if opts.read else TRTLLM_OPS)}
                  if geom["sweep_tokens_per_block"] else None),
        "curve": ({"descriptors": list(CURVE_DESCRIPTORS), "iterations": opts.sweep_iterations, "warmup": 1}
                  if opts.curve else None),
        "timeouts": {"rendezvous_s": rendezvous, "transfer_s": t,
                     "pair_s": min(opts.timeout_s, max(60.0, 10 * t)), "deadline_s": opts.timeout_s},
        "expect": {"transport": transport, "rdma": plan.kv_transfer.transport.rdma,
                   "nominal_gbps": plan.estimates.nominal_gbps},
        "fault": opts.fault,
    }


def parse_fault(text: str | None, agents: list[dict]) -> dict | None:
    """TK_VALIDATE_FAULT=corrupt|kill|hang|absent[:AGENT] (tests): default target the first generation agent."""
    if not text:
        return None
    kind, _, who = text.partition(":")
    if kind not in ("corrupt", "kill", "hang", "absent"):
        raise ValidateError(f"TK_VALIDATE_FAULT={text!r}: the kind must be corrupt, kill, hang or absent")
    ids = [a["id"] for a in agents]
    if who and who not in ids:
        raise ValidateError(f"TK_VALIDATE_FAULT={text!r}: no agent {who!r} (agents: {', '.join(ids)})")
    if not who:
        who = next((a["id"] for a in agents if a["role"] == Role.GEN), ids[-1])
    return {"kind": kind, "agent": who}
