"""What every importer shares: splitting a role's TensorRT-LLM options into tk's recipe fields and extra_options,
and the ledger of what was carried, what was not (and why), and what tk writes differently.

Nothing is dropped silently: a value tk cannot carry goes to ``Ledger.dropped`` with the reason, and the report of
``tk import`` lists it; a value tk carries but renders differently is found by ``compare`` after the plan is built.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

from toolkit.facts.hardware import GPUS, MNNVL_GPUS, Transport
from toolkit.facts.models import ALIASES, BUILTIN_MODELS, KV_DTYPES

# Option paths a role's servers take that are recipe fields of the role: path -> RoleSpec field.
ROLE_FIELDS = {
    "tensor_parallel_size": "tp", "pipeline_parallel_size": "pp", "moe_expert_parallel_size": "ep",
    "enable_attention_dp": "attention_dp", "max_batch_size": "max_batch_size", "max_num_tokens": "max_num_tokens",
    "max_seq_len": "max_seq_len", "kv_cache_config.free_gpu_memory_fraction": "free_gpu_memory_fraction",
    "cache_transceiver_config.max_tokens_in_buffer": "max_tokens_in_buffer",
}
# Option paths both roles must share, recipe fields of kv_transfer: path -> KvTransferSpec field.
SHARED_FIELDS = {
    "kv_cache_config.dtype": "dtype", "kv_cache_config.tokens_per_block": "tokens_per_block",
    "cache_transceiver_config.backend": "backend",
    "cache_transceiver_config.kv_transfer_timeout_ms": "kv_transfer_timeout_ms",
}
# cache_transceiver_config keys kv_transfer writes to both roles when they agree (else each role's extra_options).
OPTIONAL_SHARED = {
    "cache_transceiver_config.transceiver_runtime": "runtime",
    "cache_transceiver_config.kv_transfer_poll_interval_ms": "poll_interval_ms",
    "cache_transceiver_config.kv_cache_bounce_size_mb": "bounce_size_mb",
    "cache_transceiver_config.enable_pipelined_transfer": "pipelined",
}
GRACE_GPUS = ("GB200", "GB300")  # Grace-Blackwell nodes: NVIDIA's srt-slurm binds memory with numactl -m 0,1
NUMACTL = ["numactl", "-m", "0,1"]


@dataclass
class Dropped:
    path: str  # where in the source
    value: object
    why: str


@dataclass
class Ledger:
    """What an import did with the source."""

    kind: str  # the source's format
    source: str  # file
    carried: list[str] = field(default_factory=list)  # source paths carried into the recipe
    dropped: list[Dropped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the user should know (a site alias to resolve, ...)
    role_sources: dict = field(default_factory=dict)  # role title -> the source's LLM-API options of that role

    def drop(self, path: str, value, why: str) -> None:
        self.dropped.append(Dropped(path, value, why))

    def carry(self, path: str) -> None:
        self.carried.append(path)

    def accounted(self, path: str) -> bool:
        """Whether ``path`` (a source leaf) was carried or dropped, itself or as part of a section."""
        return any(path == p or path.startswith(p + ".") for p in [*self.carried, *(d.path for d in self.dropped)])

    def sweep(self, doc: dict) -> None:
        """Every leaf of the source no rule carried or dropped is dropped as not understood, with its path: what an
        importer does not know (a key a newer release of the format added) is listed, never lost silently."""
        for path, value in leaves(doc):
            if not self.accounted(path):
                self.drop(path, value, f"not understood: tk's {self.kind} import has no rule for it")


class SourceError(ValueError):
    """A part of the source of the wrong kind: ``path`` (dotted, in the source) holds ``value``, not ``expected``."""

    def __init__(self, path: str, value, expected: str):
        super().__init__(f"{path} is {kind_of(value)}, not {expected}")
        self.path, self.value, self.expected = path, value, expected


def kind_of(value) -> str:
    """What a YAML value is, in words: "a list", "the number 5", "the text 'dsr1'"."""
    if isinstance(value, bool):
        return f"the boolean {'true' if value else 'false'}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    return {list: "a list", dict: "a mapping"}.get(type(value), type(value).__name__)


def section(parent: dict, key: str, where: str = "") -> dict:
    """The mapping at ``parent[key]`` ({} when absent or null); anything else raises SourceError naming the path
    (``where``: the parent's dotted path in the source)."""
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SourceError(f"{where}.{key}" if where else key, value, "a mapping")
    return value


def flatten(d: dict, prefix: str = "") -> dict:
    """{dotted path: value} of the leaves (a mapping value is walked; a list or null is a leaf)."""
    out = {}
    for k, v in d.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, path))
        else:
            out[path] = v
    return out


def leaves(d: dict, prefix: str = ""):
    """(dotted path, value) of every leaf: a value that is not a mapping, or an empty mapping."""
    for k, v in d.items():
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            yield from leaves(v, path)
        else:
            yield path, v


def dig(d, path: str, default=None):
    for k in path.split("."):
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def pop_path(d: dict, path: str):
    """Remove ``path`` from nested ``d`` (and emptied parents); its value, or None."""
    parts = path.split(".")
    node = d
    for k in parts[:-1]:
        node = node.get(k) if isinstance(node, dict) else None
        if node is None:
            return None
    value = node.pop(parts[-1], None) if isinstance(node, dict) else None
    for i in range(len(parts) - 1, 0, -1):  # drop emptied sections
        parent = dig(d, ".".join(parts[:i - 1])) if i > 1 else d
        key = parts[i - 1]
        if isinstance(parent, dict) and parent.get(key) == {}:
            parent.pop(key)
    return value


def set_path(d: dict, path: str, value) -> None:
    parts = path.split(".")
    for k in parts[:-1]:
        d = d.setdefault(k, {})
    d[parts[-1]] = value


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def gpu_name(text) -> str | None:
    """A GPU type as tk spells it (h100 -> H100, gb300 -> GB300), or None if tk has no such GPU."""
    if not isinstance(text, str):
        return None
    up = text.strip().upper()
    return up if up in GPUS else None


def model_name(path: str) -> tuple[str, str | None]:
    """The model tk sizes KV for, and the path the servers load when it is not the same: a built-in name where the
    source names a known checkpoint (srt-slurm's aliases dsr1 / dsr1-fp8 / DeepSeek-R1-0528 are DeepSeek-R1;
    hf:ORG/NAME is a Hugging Face id), else the path as given."""
    text = path.strip()
    if text.startswith("hf:"):
        text = text[3:]
    base = text.rstrip("/").rsplit("/", 1)[-1].lower()
    if text in BUILTIN_MODELS:
        return text, None
    if base in ALIASES:
        return ALIASES[base], None if text == ALIASES[base] else path
    if re.fullmatch(r"(dsr1|deepseek-r1)(-[a-z0-9.]+)*", base):
        return "deepseek-ai/DeepSeek-R1", path
    return text, None


def role_options(src: dict, title: str, where: str, ledger: Ledger) -> tuple[dict, dict]:
    """Split one role's TensorRT-LLM options into (RoleSpec fields, leftover options) — the leftover still holds
    the shared paths, for ``shared_fields`` to take."""
    opts = copy.deepcopy(src)
    role: dict = {}
    for path, fld in ROLE_FIELDS.items():
        value = dig(opts, path)
        if value is None:
            continue
        if fld == "attention_dp":
            ok = isinstance(value, bool)
        elif fld == "free_gpu_memory_fraction":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1
        else:
            ok = _int(value) and value > 0
        if ok:
            role[fld] = value
            pop_path(opts, path)
            ledger.carry(f"{where}.{path}")
    if "cuda_graph_config" in opts and opts["cuda_graph_config"] is None:
        opts.pop("cuda_graph_config")
        ledger.carry(f"{where}.cuda_graph_config")
        if title == "generation":
            role["cuda_graph"] = False  # tk writes null for the context role anyway
    if opts.get("backend") == "pytorch":  # tk serves the pytorch backend (trtllm-serve --backend pytorch)
        opts.pop("backend")
        ledger.carry(f"{where}.backend")
    return role, opts


def shared_fields(per_role: dict[str, dict], where: dict[str, str], ledger: Ledger) -> dict:
    """kv_transfer fields from the options both roles must share; what disagrees stays per role (and the plan
    refuses it where TensorRT-LLM needs agreement)."""
    kv: dict = {}
    for path, fld in {**SHARED_FIELDS, **OPTIONAL_SHARED}.items():
        values = {t: dig(o, path) for t, o in per_role.items()}
        present = {t: v for t, v in values.items() if v is not None}
        if not present:
            continue
        distinct = {repr(v) for v in present.values()}
        if len(distinct) != 1 or len(present) != len(per_role):
            if path in OPTIONAL_SHARED:
                continue  # stays in each role's extra_options
            if path == "cache_transceiver_config.kv_transfer_timeout_ms":
                continue  # stays per role; tk writes the recipe's value on both (the plan says so)
            for t, v in present.items():
                ledger.notes.append(f"{where[t]}.{path} = {v!r}: the roles disagree; TensorRT-LLM needs one value, "
                                    f"set kv_transfer.{fld}")
            continue
        value = next(iter(present.values()))
        if fld == "dtype" and value not in KV_DTYPES:
            continue  # stays in extra_options; the plan names kv_transfer.dtype
        kv[fld] = value
        for t, o in per_role.items():
            pop_path(o, path)
            ledger.carry(f"{where[t]}.{path}")
    return kv


def speculative(per_role: dict[str, dict], where: dict[str, str], ledger: Ledger) -> dict:
    """The recipe's speculative section from speculative_config (the same on both roles)."""
    configs = {t: o.get("speculative_config") for t, o in per_role.items()}
    present = [c for c in configs.values() if c]
    if not present:
        return {}
    if len(present) != len(configs) or any(c != present[0] for c in present):
        for t in configs:
            ledger.notes.append(f"{where[t]}.speculative_config differs between the roles; TensorRT-LLM's generation "
                                "servers must run the context servers' draft configuration")
        return {}
    cfg = dict(present[0])
    for t, o in per_role.items():
        o.pop("speculative_config", None)
        ledger.carry(f"{where[t]}.speculative_config")
    kind = cfg.pop("decoding_type", None)
    out: dict = {}
    if kind == "MTP":
        out["mtp_layers"] = cfg.pop("num_nextn_predict_layers", 1)
    elif kind is not None:
        out["decoding_type"] = kind
        for key in ("speculative_model", "speculative_model_dir"):
            if key in cfg:
                out["model"] = str(cfg.pop(key))
        if _int(cfg.get("max_draft_len")) and cfg["max_draft_len"] > 0:
            out["max_draft_len"] = cfg.pop("max_draft_len")
    if cfg:
        out["options"] = cfg
    return out


def finish_roles(recipe: dict, roles: dict[str, dict], per_role: dict[str, dict], where: dict[str, str],
                 ledger: Ledger) -> dict:
    """What every importer does once each role's options are split: the shared kv_transfer fields and the
    speculative section from both roles' options, the rest as each role's extra_options (carried), the roles into
    the recipe. Returns the recipe's kv_transfer section (without a transport: the caller knows the GPU)."""
    kv = shared_fields(per_role, where, ledger)
    spec = speculative(per_role, where, ledger)
    for title, rest in per_role.items():
        if rest:
            roles[title]["extra_options"] = rest
            for key in rest:
                ledger.carry(f"{where[title]}.{key}")
        recipe[title] = roles[title]
    kv.setdefault("kv_transfer_timeout_ms", None)  # the source sets none: TensorRT-LLM's default, not tk's 60000
    recipe["kv_transfer"] = kv
    if spec:
        recipe["speculative"] = spec
    return kv


def drop_known(doc: dict, table: dict[str, str], ledger: Ledger) -> None:
    """Drop every path of ``table`` (dotted source path -> why tk does not carry it) the source has."""
    missing = object()
    for path, why in table.items():
        value = dig(doc, path, missing)
        if value is not missing:
            ledger.drop(path, value, why)


def launcher_for(gpu: str | None, numa_bind) -> list[str]:
    if numa_bind is True or (numa_bind is None and gpu in GRACE_GPUS):
        return list(NUMACTL)
    return []


def transport_for(gpu: str | None, recipe: dict, ledger: Ledger) -> str:
    """The transport profile for a source that names none: srt-slurm and TensorRT-LLM's scripts leave UCX_TLS to
    UCX. On GB200/GB300 (NVL72 racks) tk's nvlink-multi-node profile does the same; elsewhere tk's infiniband
    profile sets UCX_TLS (its reason is in the env files), which the import says unless a role's env sets it."""
    if gpu in MNNVL_GPUS:
        return Transport.NVLINK_MULTI_NODE.value
    if not any("UCX_TLS" in (recipe.get(t) or {}).get("env", {}) for t in ("context", "generation")):
        ledger.notes.append("the source leaves UCX_TLS to UCX; tk's transport profile infiniband sets it (tk plan "
                            "shows the list and why): set kv_transfer.transport, or UCX_TLS in a role's env")
    return Transport.INFINIBAND.value


def env_mapping(value, where: str, ledger: Ledger) -> dict:
    """An environment mapping as tk takes it (names as given, values as text)."""
    if value is None:
        return {}
    if isinstance(value, str):  # "A=1 B=2", as TensorRT-LLM's benchmark config spells worker_env_var
        out = {}
        for word in value.split():
            name, eq, val = word.partition("=")
            if eq:
                out[name] = val
            else:
                ledger.drop(f"{where}", word, "not NAME=VALUE")
        ledger.carry(where)
        return out
    if not isinstance(value, dict):
        ledger.drop(where, value, "not a mapping of NAME: value")
        return {}
    out = {}
    for k, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            ledger.drop(f"{where}.{k}", v, "an environment value must be text")
            continue
        out[str(k)] = str(v)
        ledger.carry(f"{where}.{k}")
    return out
