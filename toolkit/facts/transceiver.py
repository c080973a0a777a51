"""TensorRT-LLM's KV cache transceiver: which one a release runs, and what it hands NIXL for one request.

Pure data and pure functions (the standard library, and the generated data through ``llm_args``). The plan
(``KvTransferPlan.transceiver``), the validator (what its agents move), the sizing and the stand-in's emulated transfer
time all read them. Every fact below was read in TensorRT-LLM's source at the commit cited beside it.

Two transceivers
----------------
``Runtime.CPP``, the C++ transceiver (every line; the only one before 1.3), CacheFormatter::format in
cpp/tensorrt_llm/batch_manager/cacheFormatter.cpp @ 00c77b3088c960b4f2da1c90b4559b6028d750c7: it collects the
request's blocks, computes one buffer size per target rank, takes a *pre-allocated* send buffer from
CacheTransBufferManager (cacheTransBuffer.cpp @ 012f8ad2031a113485f7485fd9bfb8aaacded4c5: ``max_tokens_in_buffer`` x
the rank's KV bytes per token, or TRTLLM_KVCACHE_TRANSFER_BUFFER_SIZE), gathers the blocks into one slice per target
with splitKVCacheDispatch ("Ideally, we send only once (one buffer) for each target") and calls session.send once per
target. With the NIXL (and MOONCAKE) backend the connection is an AgentConnection (cacheTransceiver.cpp: "NIXL
Connection Manager created"), whose send posts ONE TransferRequest{kWRITE} with one source and one destination
descriptor into the receiver's pre-registered receive buffer, waits for it, then notifies the receiver
(cpp/tensorrt_llm/executor/cache_transmission/agent_utils/connection.cpp @ 01027ae423dca32c3bb1d6d83268f1c9780ab370,
AgentConnection::send). The receiver scatters the slices into its blocks with concatKvCacheV2Dispatch
(CacheFormatter::unformat). Only the staging buffers are registered with NIXL (AgentConnectionManager's constructor).
An agent connection has no dynamic-buffer fallback: format checks TLLM_CHECK_WITH_INFO(bufferCoverTargetNum ==
bufferTargetNum, "Agent need all buffer pre-allocated") and unformat "Agent need buffer pre-allocated"; so a request
whose KV does not fit either side's buffer fails (``AGENT_BUFFER_CHECK``).

``Runtime.PYTHON``, the Python transceiver (tensorrt_llm/_torch/disaggregation, KvCacheTransceiverV2): it registers
the KV pools themselves and moves per-block descriptor lists built by a mapper,
tensorrt_llm/_torch/disaggregation/native/mixers/attention/peer.py @ 0b308487366ddf724e72650d9cf122f9a53967d2
(AttentionPolicy.build_kv_mapper; the same mappers in native/region/block.py @ 27671b7ff56d41391a120e91017b6d8ddf2d033b):

- IdentityMapper when the heads match (same TP per DP group, MLA, or duplicated heads) and both pools hold the
  transferred layers: one descriptor per block (``Layout.PER_BLOCK``);
- HeadMatchMapper when the heads match but the layers differ (PP differs): one descriptor per block over the
  transferred layers (``Layout.HEAD_MATCH``);
- HeadMismatchMapper otherwise (TP differs): one descriptor per block x layer x K/V of the heads both ranks share
  (``Layout.HEAD_MISMATCH``).

With ``cache_transceiver_config.kv_cache_bounce_size_mb`` > 0 (PR #15618) it gathers the request into one fabric-VMM
region and issues "a single multi-rail NIXL write" (llm_args.py @ 0004396720054fd8e205cbf616f21f0b57c6b412), then
scatters on the receiver (native/bounce/impl.py @ 0e63c12e1ba71a73495d7aa0b5d5b4b31032d4e1, VmmBounceTransport); a
transfer below 2 MiB (native/bounce/config.py @ 247f14e5f9f1b289ee8c611726a3529b9a9d50c4, DEFAULT_MIN_BYTES), larger
than the region, or written by several context ranks ("Multi-writer bounce is intentionally rejected", reserve(); the
earlier fan-in versions of impl.py coalesced each writer's share instead) stays on the per-block path
(``Layout.BOUNCE``). PR #15780 (agent_bounce_buffer_enable, after
the 1.3 snapshots tk has) does the same in the C++ NIXL agent in chunks of at most 32 MiB, for lists of >= 1024
descriptors of <= 16 KiB on average.

Neither transceiver READs: the context side WRITEs into the generation side.

Which one runs
--------------
``cache_transceiver_config.transceiver_runtime``: CPP | PYTHON, and from PR #16164 ``auto`` as the default. None
"is equivalent to 'CPP'". At llm_args.py @ 0004396720054fd8e205cbf616f21f0b57c6b412 (after PR #18134): "'auto'
(default) adopts the model's preferred runtime when it declares one; otherwise it selects the Python transceiver,
falling back to the C++ transceiver only when this config itself rules it out (non-NIXL backend or a null
kv_transfer_timeout_ms)". The models that declare a preference (GPT-OSS PR #16479, DeepSeek-V3 PR #16908, GLM-5,
Llama/Gemma3 PR #16787) prefer PYTHON, so ``auto`` resolves as without one.

Which default a release has and what each setting selects is the generated data's, not this module's
(``trtllm_data.json``: the field's ``default`` and ``resolves`` per snapshot, with their evidence in
scripts/trtllm_sources.yaml): null (= C++) in manifest@92e3075 (1.3.0rc18..rc20), ``auto`` -> PYTHON, or CPP for a
non-NIXL backend or a null timeout, in manifest@0004396 (1.3.0rc27..1.4.0rc1). A snapshot without the field (1.0 to
1.2) has only the C++ transceiver. A release between two snapshots (1.3.0rc21..rc26) is read as llm_args reads any
field there, from the newer one, and where the two select different transceivers that choice is unverified
(``RuntimeChoice.candidates``): the plan says so, and refuses nothing that only one of them would refuse.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from toolkit.facts import llm_args

RUNTIME_PATH = "cache_transceiver_config.transceiver_runtime"

# Where each fact comes from (file @ commit), for code comments, plan notes and the report.
SOURCES = {
    "cpp_format": "cpp/tensorrt_llm/batch_manager/cacheFormatter.cpp @ 00c77b3088c960b4f2da1c90b4559b6028d750c7 "
                  "(CacheFormatter::format / unformat)",
    "cpp_buffer": "cpp/tensorrt_llm/batch_manager/cacheTransBuffer.cpp @ 012f8ad2031a113485f7485fd9bfb8aaacded4c5",
    "agent_send": "cpp/tensorrt_llm/executor/cache_transmission/agent_utils/connection.cpp @ "
                  "01027ae423dca32c3bb1d6d83268f1c9780ab370 (AgentConnection::send: one kWRITE, one descriptor)",
    "mappers": "tensorrt_llm/_torch/disaggregation/native/mixers/attention/peer.py @ "
               "0b308487366ddf724e72650d9cf122f9a53967d2 (AttentionPolicy.build_kv_mapper)",
    "bounce": "tensorrt_llm/_torch/disaggregation/native/bounce/impl.py @ 0e63c12e1ba71a73495d7aa0b5d5b4b31032d4e1, "
              "config.py @ 247f14e5f9f1b289ee8c611726a3529b9a9d50c4 (kv_cache_bounce_size_mb, PR #15618)",
    "runtime": "tensorrt_llm/llmapi/llm_args.py @ 0004396720054fd8e205cbf616f21f0b57c6b412 "
               "(CacheTransceiverConfig.transceiver_runtime; PR #16164, PR #18134)",
}

# TLLM_CHECK_WITH_INFO(bufferCoverTargetNum == bufferTargetNum, "Agent need all buffer pre-allocated") in
# CacheFormatter::format (and "Agent need buffer pre-allocated" in unformat): an agent connection (NIXL, MOONCAKE)
# of the C++ transceiver takes no request larger than the pre-allocated buffer.
AGENT_BUFFER_CHECK = "Agent need all buffer pre-allocated"
AGENT_BUFFER_SOURCE = SOURCES["cpp_format"]
# Per role, the check that fails and where: the context's send buffer in format, the generation's receive buffer in
# unformat (TLLM_CHECK_WITH_INFO(bufferCoverTargetNum == targetNum, "Agent need buffer pre-allocated")).
AGENT_BUFFER_CHECKS = {"context": ("Agent need all buffer pre-allocated", "CacheFormatter::format"),
                       "generation": ("Agent need buffer pre-allocated", "CacheFormatter::unformat")}
SOURCE_CPP_FORMAT_FILE = "cpp/tensorrt_llm/batch_manager/cacheFormatter.cpp @ 00c77b3088c960b4f2da1c90b4559b6028d750c7"
# Backends whose C++ connection is an AgentConnection (cacheTransceiver.cpp: NIXL and MOONCAKE make an
# AgentConnectionManager; UCX and MPI have their own connections, which fall back to dynamic buffers).
AGENT_BACKENDS = ("NIXL", "MOONCAKE")


def agent_buffer_checks(roles) -> str:
    """The TLLM_CHECKs that fail a request larger than these roles' ("context", "generation") buffers, cited."""
    cited = "; ".join(f"\"{AGENT_BUFFER_CHECKS[r][0]}\" in {AGENT_BUFFER_CHECKS[r][1]}"
                      for r in ("context", "generation") if r in roles)
    return f"TLLM_CHECK {cited}, {SOURCE_CPP_FORMAT_FILE}"


# The bounce path's gate: below this many bytes a transfer stays on the per-block path (native/bounce/config.py).
BOUNCE_MIN_BYTES = 2 << 20
# Its region: kv_cache_bounce_size_mb rounded up to whole physical chunks of Config.chunk_mb (32 MiB), at least one
# (FixedSizing.resolve, native/bounce/config.py @ 247f14e5f9f1b289ee8c611726a3529b9a9d50c4); at setup it is also
# clamped to half the GPU memory left free, which only the server knows.
BOUNCE_CHUNK_BYTES = 32 << 20


def bounce_region_bytes(bounce_size_mb: int) -> int:
    """What a kv_cache_bounce_size_mb setting reserves per direction, before the free-memory clamp (0: off)."""
    if bounce_size_mb <= 0:
        return 0
    return max(BOUNCE_CHUNK_BYTES, -(-(bounce_size_mb << 20) // BOUNCE_CHUNK_BYTES) * BOUNCE_CHUNK_BYTES)
# PR #15780's C++ agent bounce: chunks of at most this many bytes, for lists of at least BOUNCE_AGENT_MIN_DESCRIPTORS
# descriptors of at most BOUNCE_AGENT_MAX_AVERAGE_BYTES on average (agent_bounce_params defaults in the PR).
BOUNCE_AGENT_CHUNK_BYTES = 32 << 20
BOUNCE_AGENT_MIN_DESCRIPTORS = 1024
BOUNCE_AGENT_MAX_AVERAGE_BYTES = 16 << 10

class Runtime(str, enum.Enum):
    CPP = "CPP"
    PYTHON = "PYTHON"

    @property
    def label(self) -> str:
        return "C++ transceiver" if self is Runtime.CPP else "Python transceiver"


class Layout(str, enum.Enum):
    """How one request's KV for one (context rank, generation rank) pair is cut into NIXL descriptors."""

    STAGED = "staged-per-rank-pair"  # C++: gathered into a staging slice, one descriptor, scattered on arrival
    PER_BLOCK = "per-block"  # Python IdentityMapper: one descriptor per block
    HEAD_MATCH = "head-match"  # Python HeadMatchMapper (PP differs): one per block over the transferred layers
    HEAD_MISMATCH = "head-mismatch"  # Python HeadMismatchMapper (TP differs): one per block x layer x K/V
    BOUNCE = "bounce-coalesced"  # Python with kv_cache_bounce_size_mb: gathered into one region, one descriptor

    @property
    def gathers(self) -> bool:
        """A device gather into one region before the WRITE and a scatter after it."""
        return self in (Layout.STAGED, Layout.BOUNCE)

    @property
    def what(self) -> str:
        return {Layout.STAGED: "gathered into a staging slice per target rank, one WRITE, scattered on arrival",
                Layout.PER_BLOCK: "one descriptor per block",
                Layout.HEAD_MATCH: "one descriptor per block over the rank's transferred layers",
                Layout.HEAD_MISMATCH: "one descriptor per block x layer x K/V of the heads both ranks share",
                Layout.BOUNCE: "gathered into one bounce region, one WRITE, scattered on arrival"}[self]


@dataclass(frozen=True)
class RankPairGeometry:
    """What one context rank sends one generation rank, per token: the input of ``descriptors``.

    ``slot_bytes_per_token``: one layer's K (or V, or MLA latent) of one token, of the heads both ranks share; a block
    of the pair's KV is ``tokens_per_block x layers x kv_factor x slot_bytes_per_token`` bytes."""

    tokens_per_block: int
    layers: int
    kv_factor: int
    slot_bytes_per_token: int

    @property
    def bytes_per_token(self) -> int:
        return self.layers * self.kv_factor * self.slot_bytes_per_token

    @property
    def block_bytes(self) -> int:
        return self.tokens_per_block * self.bytes_per_token


@dataclass(frozen=True)
class Descriptors:
    """One request's transfer for one rank pair: ``count`` descriptors of ``bytes_each`` in one WRITE."""

    layout: Layout
    tokens: int  # whole blocks: the request's tokens rounded up to tokens_per_block
    blocks: int
    count: int
    bytes_each: int
    total_bytes: int

    @property
    def gathers(self) -> bool:
        return self.layout.gathers


def blocks_of(tokens: int, tokens_per_block: int) -> int:
    return -(-int(tokens) // int(tokens_per_block))


def descriptors(layout: Layout, geom: RankPairGeometry, tokens: int) -> Descriptors:
    """The descriptors of one ``tokens``-token request between one context rank and one generation rank."""
    nb = blocks_of(tokens, geom.tokens_per_block)
    total = nb * geom.block_bytes
    if layout in (Layout.STAGED, Layout.BOUNCE):
        count, each = 1, total
    elif layout in (Layout.PER_BLOCK, Layout.HEAD_MATCH):
        count, each = nb, geom.block_bytes
    else:
        count, each = nb * geom.layers * geom.kv_factor, geom.tokens_per_block * geom.slot_bytes_per_token
    return Descriptors(layout=layout, tokens=nb * geom.tokens_per_block, blocks=nb, count=count, bytes_each=each,
                       total_bytes=total)


def same_bytes(total_bytes: int, count: int, align: int = 8) -> Descriptors:
    """``total_bytes`` cut into ``count`` equal descriptors (each a multiple of ``align``): the descriptor-size curve."""
    each = max(align, total_bytes // count // align * align)
    return Descriptors(layout=Layout.PER_BLOCK, tokens=0, blocks=count, count=count, bytes_each=each,
                       total_bytes=each * count)


# -- which mapper the Python transceiver picks ------------------------------------------------------------------

def heads_match(ctx_tp: int, gen_tp: int, kv_heads: int, mla: bool) -> bool:
    """AttentionPolicy.head_match: MLA, the same TP per DP group, or duplicated heads (each side's kv heads per rank x
    TP differ because a side's TP exceeds the KV heads, which are then repeated)."""
    if mla or ctx_tp == gen_tp:
        return True
    per_rank = (max(1, kv_heads // ctx_tp), max(1, kv_heads // gen_tp))
    return per_rank[0] * ctx_tp != per_rank[1] * gen_tp


def mapper_layout(ctx_tp: int, gen_tp: int, kv_heads: int, mla: bool, ctx_layers: int, gen_layers: int) -> Layout:
    """AttentionPolicy.build_kv_mapper: identity, head-match or head-mismatch (``ctx_tp``/``gen_tp``: TP per DP group,
    1 under attention DP; layers: each side's layers per rank)."""
    if not heads_match(ctx_tp, gen_tp, kv_heads, mla):
        return Layout.HEAD_MISMATCH
    return Layout.PER_BLOCK if ctx_layers == gen_layers else Layout.HEAD_MATCH


def layout_for(runtime: Runtime, mapper: Layout, bounce_size_mb: int, total_bytes: int, writers: int = 1) -> Layout:
    """The layout a transfer of ``total_bytes`` (one rank pair) takes: staged on the C++ transceiver; on the Python
    one the mapper's lists, or one coalesced region when the bounce buffer is on, the transfer clears its gate, and
    one context rank writes the generation rank's share (``writers``: VmmBounceTransport.reserve rejects a
    multi-writer plan, "Multi-writer bounce is intentionally rejected", native/bounce/impl.py @ 0e63c12e)."""
    if runtime is Runtime.CPP:
        return Layout.STAGED
    if bounce_size_mb > 0 and writers == 1 and BOUNCE_MIN_BYTES <= total_bytes <= bounce_region_bytes(bounce_size_mb):
        return Layout.BOUNCE
    return mapper


def writers_per_generation_rank(ctx_tp: int, gen_tp: int, ctx_pp: int, gen_pp: int, kv_heads: int, mla: bool) -> int:
    """How many context ranks write one generation rank's share of a request (``ctx_tp``/``gen_tp``: TP per attention
    DP group): more context TP splits a generation rank's KV heads over several context ranks (MLA's latent, and heads
    duplicated over ranks, come from one of them: the others do not send, needSendCache in cacheFormatter.cpp and
    mlaCacheFormatter.cpp); more context PP splits its layers."""
    tp = 1 if mla else max(1, max(1, kv_heads // max(1, gen_tp)) // max(1, kv_heads // max(1, ctx_tp)))
    return tp * max(1, ctx_pp // max(1, gen_pp))


def targets_per_context_rank(ctx_tp: int, gen_tp: int, ctx_pp: int, gen_pp: int) -> int:
    """How many generation ranks one context rank sends a request's KV to (``ctx_tp``/``gen_tp``: TP per attention
    DP group): targetIRanks' TP domain x PP domain (TargetRanksInfoForDPImpl, cacheSplitConcat.cu @
    1a43c7d62d008ca9d1efdfd50f9180390598d314). More generation TP splits the heads over more ranks; MLA's latent is
    not split, but every generation TP rank needs it whole, so MLACacheFormatter::format sends it to each of them
    (one slice per PP domain); more generation PP splits the layers."""
    return max(1, gen_tp // max(1, ctx_tp)) * max(1, gen_pp // max(1, ctx_pp))


# -- which transceiver runs -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SnapshotRuntime:
    """What one snapshot of TensorRT-LLM's option surface says about transceiver_runtime (the generated data's field
    entry): its default and what each setting selects (``resolves``); ``has_field`` False where the snapshot has no
    transceiver_runtime, which is the C++ transceiver whatever is set."""

    cite: str
    line: str
    has_field: bool
    default: str | None = None
    resolves: tuple[tuple[str, str], ...] = ()

    def select(self, setting: str | None, backend: str, timeout_ms_null: bool) -> tuple[Runtime, str] | None:
        """The runtime ``setting`` (None: unset) selects with the effective ``backend``, and why; None where this
        snapshot does not say (a setting it does not allow)."""
        if not self.has_field:
            return Runtime.CPP, "no transceiver_runtime: the C++ transceiver"
        resolves = dict(self.resolves)
        if setting in (Runtime.CPP.value, Runtime.PYTHON.value):
            return Runtime(setting), f"transceiver_runtime {setting}"
        if setting is None:
            key, why = "null", "transceiver_runtime unset (None)"
        elif setting == "auto" and backend != "NIXL":
            key, why = "auto_when_not_nixl", f"transceiver_runtime auto with backend {backend}"
        elif setting == "auto" and timeout_ms_null:
            key, why = "auto_when_no_timeout", "transceiver_runtime auto with kv_transfer_timeout_ms null"
        else:
            key, why = str(setting), f"transceiver_runtime {setting} with the NIXL backend"
        if key not in resolves:
            return None
        runtime = Runtime(resolves[key])
        return runtime, f"{why}: the {runtime.label}"


def snapshot_runtimes(target: llm_args.Target) -> tuple[SnapshotRuntime, ...]:
    """What every snapshot that speaks for ``target`` (llm_args.evidence: the release's own, else the nearest before
    and after it) says about transceiver_runtime, oldest first, from the generated data (trtllm_data.json: the
    field's ``default`` and ``resolves``; scripts/trtllm_sources.yaml gives their evidence). A snapshot that has the
    field but records neither (a new release before its default is read) is read with the nearest earlier snapshot
    that does, and its cite says so."""
    snaps = llm_args.snapshots()
    out = []
    for snap in llm_args.evidence(target):
        entry = snap.fields.get(RUNTIME_PATH)
        if entry is None:
            out.append(SnapshotRuntime(snap.cite, snap.line, has_field=False))
            continue
        cite = snap.cite
        if "default" not in entry and "resolves" not in entry:
            before = snaps[:next(i for i, s in enumerate(snaps) if s is snap)]
            earlier = [s for s in before if "default" in s.fields.get(RUNTIME_PATH, {})]
            if earlier:
                cite = f"{snap.cite}, which records no default: read as {earlier[-1].cite}"
                entry = earlier[-1].fields[RUNTIME_PATH]
        out.append(SnapshotRuntime(cite, snap.line, has_field=True, default=entry.get("default"),
                                   resolves=tuple(sorted((entry.get("resolves") or {}).items()))))
    return tuple(out)


@dataclass(frozen=True)
class RuntimeChoice:
    """The transceiver one role's servers run: what the newest snapshot that speaks for the release selects (as
    llm_args.entry reads a field), and every runtime the snapshots that speak for it select (more than one for a
    release between two snapshots that disagree, e.g. 1.3.0rc21..rc26: then which one runs is unverified)."""

    runtime: Runtime
    setting: str | None  # transceiver_runtime as the options file gives it, else the deciding snapshot's default
    why: str
    default_source: str  # the snapshot whose default or resolution decided
    candidates: frozenset[Runtime]

    @property
    def verified(self) -> bool:
        return len(self.candidates) == 1


def choose_runtime(target: llm_args.Target, given: bool, setting: str | None, backend: str,
                   timeout_ms_null: bool = False) -> RuntimeChoice:
    """The transceiver a server of ``target`` runs: ``setting`` where its options file sets transceiver_runtime
    (``given``), else each snapshot's default, resolved with the effective ``backend`` (DEFAULT resolved) by each
    snapshot's ``resolves``. The newest snapshot that speaks for the release decides, as llm_args.entry reads a
    field, where the release surely has the field (llm_args.status KNOWN); where that is not established (1.2.0:
    only the 1.3 snapshot after it has the field), the newest snapshot without it decides (the C++ transceiver); of
    the line's own snapshots where it has any. A target tk has no facts for, or a setting no snapshot resolves (one
    TensorRT-LLM refuses; the rules report it), runs the C++ transceiver."""
    known = llm_args.status(target, RUNTIME_PATH).verdict is llm_args.Verdict.KNOWN
    picks = []
    for snap in snapshot_runtimes(target):
        value = setting if given else snap.default
        chosen = snap.select(value, backend, timeout_ms_null)
        if chosen is not None:
            picks.append((snap, value, *chosen))
    if not picks:
        return RuntimeChoice(Runtime.CPP, setting if given else None,
                             f"transceiver_runtime {setting!r} is resolved by no snapshot tk has for TensorRT-LLM "
                             f"{target}: the C++ transceiver", "no snapshot", frozenset({Runtime.CPP}))
    deciding = [p for p in picks if p[0].has_field == known] or picks
    deciding = [p for p in deciding if p[0].line == target.line] or deciding  # the release's own line first
    snap, value, runtime, why = deciding[-1]
    source = snap.cite if given or not snap.has_field else f"{snap.cite}: default {snap.default!r}"
    return RuntimeChoice(runtime, value, why, source, frozenset(p[2] for p in picks))


def resolve_backend(backend: str, env: dict, line: str, selectors: dict) -> str:
    """cache_transceiver_config.backend as a server takes it: DEFAULT is the first TRTLLM_USE_*_KVCACHE selector set
    to 1 (``selectors``: backend -> variable), else NIXL from 1.2 on and UCX on 1.0/1.1 (toolkit/facts/trtllm.py
    notes: PR #5234, PR #7926)."""
    if backend != "DEFAULT":
        return backend
    chosen = next((b for b, var in selectors.items() if env.get(var) == "1"), None)
    if chosen:
        return chosen
    return "UCX" if line in ("1.0", "1.1") else "NIXL"


def agent_needs_preallocated_buffer(runtime: Runtime, backend: str) -> bool:
    """The C++ transceiver over an agent connection (NIXL, MOONCAKE) refuses a request larger than its buffer."""
    return runtime is Runtime.CPP and backend in AGENT_BACKENDS


# -- what a transfer costs (for an emulated transfer time) ------------------------------------------------------

# Measured on one H100 with nixl-cu13 1.5.1 over cuda_ipc, two processes (gpu-findings-4 in the project's reference
# notes): each descriptor costs about 5 us on top of the bytes; one large descriptor reaches the device-copy limit.
PER_DESCRIPTOR_S_MEASURED = 5e-6
DEVICE_COPY_GBPS_MEASURED = 1475.0


@dataclass(frozen=True)
class TransferTime:
    """One request's KV move for one rank pair, in seconds: the gather, the WRITE, the scatter."""

    gather_s: float
    transfer_s: float
    scatter_s: float

    @property
    def total_s(self) -> float:
        return self.gather_s + self.transfer_s + self.scatter_s


def transfer_time(d: Descriptors, *, link_gbps: float, per_descriptor_s: float = PER_DESCRIPTOR_S_MEASURED,
                  copy_gbps: float = DEVICE_COPY_GBPS_MEASURED) -> TransferTime:
    """The time of ``d``'s WRITE: ``count x per_descriptor_s + total_bytes / link``; with a gathering layout also a
    gather and a scatter of ``total_bytes`` at ``copy_gbps`` each (a device copy). GB/s are 1e9 bytes per second."""
    for name, v in (("link_gbps", link_gbps), ("copy_gbps", copy_gbps), ("per_descriptor_s", per_descriptor_s)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0) or (name != "per_descriptor_s" and v == 0):
            raise ValueError(f"{name} must be a finite positive number, not {v!r}")
    copy = d.total_bytes / (copy_gbps * 1e9) if d.gathers else 0.0
    return TransferTime(gather_s=copy, transfer_s=d.count * per_descriptor_s + d.total_bytes / (link_gbps * 1e9),
                        scatter_s=copy)


def describe(runtime: Runtime, d: Descriptors) -> str:
    """'C++ transceiver: staged-per-rank-pair, 1 descriptor per rank pair of 48.0 MiB (...)'."""
    n = "1 descriptor" if d.count == 1 else f"{d.count} descriptors"
    return (f"{runtime.label}: {d.layout.value}, {n} per rank pair of {_size(d.bytes_each)} for a {d.tokens}-token "
            f"request ({d.layout.what})")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"
