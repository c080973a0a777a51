"""aiconfigurator's rows as tk candidates, and their translation into recipe roles (pure: no aiconfigurator).

A row of aiconfigurator 0.12.0's Pareto front (``cli_default(...).pareto_fronts["agg" | "disagg"]``, a pandas
DataFrame; tk reads its records) describes one *replica*: for disaggregated serving ``(p)workers`` prefill
(context) and ``(d)workers`` decode (generation) workers, each of ``(p|d)tp x (p|d)pp x (p|d)dp`` GPUs with MoE
layers split ``(p|d)moe_tp x (p|d)moe_ep`` (``(p|d)parallel`` spells it ``tp1pp1dp8etp4ep2``), a batch of
``(p|d)bs`` *per attention-DP rank* (``(p|d)global_bs`` = bs x dp), the quantization it assumed
(``(p|d)gemm``, ``(p|d)moe``, ``(p|d)kvcache``) and its memory estimate in GiB (``(p|d)memory``). Aggregated rows
carry the same without a prefix.

How a row becomes TensorRT-LLM's layout (aiconfigurator's own generator, aiconfigurator/generator/rule_plugin/
trtllm.rule and module_bridge.py in the 0.12.0 wheel): ``tensor_parallel_size = moe_tp x moe_ep``,
``enable_attention_dp = dp > 1`` (MoE models), ``moe_expert_parallel_size = moe_ep``, one worker =
``tp x pp x dp`` GPUs. aiconfigurator's sweep keeps ``tp x dp == moe_tp x moe_ep`` (sdk ModelConfig
``resolve_moe_parallelism``) and never pairs attention TP with attention DP for TensorRT-LLM
(``enumerate_parallel_config``: "trtllm don't supports attn tp > 1" with dp > 1). So a DEP row ``tp1 dp8
moe_tp4 moe_ep2`` is the tk role ``tp: 8, attention_dp: true, ep: 2`` (TensorRT-LLM derives moe_tp = tp // ep,
tensorrt_llm/mapping.py), with ``max_batch_size`` the per-rank batch (TensorRT-LLM schedules each attention-DP
rank's own batch). A row tk cannot express is kept, marked, and never written.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class RoleShape:
    """One role of a candidate as aiconfigurator sized it: ``workers`` servers (over the whole budget) of
    ``tp x pp x dp`` GPUs each."""

    workers: int
    tp: int  # attention tensor parallelism
    pp: int
    dp: int  # attention data parallelism (TensorRT-LLM's attention DP)
    moe_tp: int
    moe_ep: int
    batch: int  # per attention-DP rank
    cp: int = 1
    gemm: str = ""
    moe: str = ""
    kvcache: str = ""
    memory_gib: float = 0.0  # aiconfigurator's memory estimate of one GPU

    @property
    def gpus_per_worker(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker

    def layout(self, is_moe: bool) -> str:
        """TP8 | TEP8 | DEP8 | TP8 EP2 ETP4 | ADP8 EP2 ETP4 (+ PP2), as TensorRT-LLM and srt-slurm name them."""
        width = self.tp * self.dp
        if not is_moe:
            text = f"TP{self.tp}" + (f" DP{self.dp}" if self.dp > 1 else "")
        elif self.dp > 1:
            text = f"DEP{self.dp}" if (self.tp, self.moe_ep) == (1, width) else \
                (f"TP{self.tp} " if self.tp > 1 else "") + f"ADP{self.dp} EP{self.moe_ep} ETP{self.moe_tp}"
        elif self.moe_ep == width and width > 1:
            text = f"TEP{width}"
        elif self.moe_ep == 1:
            text = f"TP{width}"
        else:
            text = f"TP{width} EP{self.moe_ep} ETP{self.moe_tp}"
        return text + (f" PP{self.pp}" if self.pp > 1 else "") + (f" CP{self.cp}" if self.cp > 1 else "")

    def batch_text(self) -> str:
        return f"bs{self.batch}" + ("/rank" if self.dp > 1 else "")

    def why_not(self, is_moe: bool) -> str:
        """Why tk cannot write this role as a recipe ("" when it can)."""
        if self.cp > 1:
            return f"context parallelism (cp{self.cp}): tk recipes have no CP"
        if self.dp > 1 and not is_moe:
            return f"attention DP (dp{self.dp}) for a dense model: TensorRT-LLM's attention DP is a MoE layout"
        if self.dp > 1 and self.tp > 1:
            return (f"attention TP x DP (tp{self.tp} dp{self.dp}): TensorRT-LLM's attention DP runs attention at "
                    "TP 1 on every rank")
        if is_moe and self.moe_tp * self.moe_ep != self.tp * self.dp:
            return (f"MoE TP x EP {self.moe_tp} x {self.moe_ep} is not the attention width {self.tp * self.dp} "
                    "(TensorRT-LLM needs moe_tp x moe_ep = tensor_parallel_size)")
        return ""

    def prefill_tokens(self, isl: int, tokens_per_block: int) -> int:
        """max_num_tokens a context server needs to prefill its batch of whole ``isl``-token prompts in one step
        (TensorRT-LLM's per-step token budget), rounded up to tokens_per_block as tk rounds token counts."""
        return math.ceil(self.batch * isl / tokens_per_block) * tokens_per_block

    def recipe_fields(self, is_moe: bool, prefill_isl: int | None = None, tokens_per_block: int = 32) -> dict:
        """The recipe role that deploys exactly this (call only when why_not is ""). ``prefill_isl``: a context
        role's input length; a batch of several prompts then gets the max_num_tokens to prefill them together
        (one prompt's, tk's default, would prefill one per step)."""
        out: dict = {"instances": self.workers, "tp": self.tp * self.dp}
        if self.pp > 1:
            out["pp"] = self.pp
        if is_moe:
            out["ep"] = self.moe_ep
        if self.dp > 1:
            out["attention_dp"] = True
        out["max_batch_size"] = self.batch
        if prefill_isl and self.batch > 1:
            out["max_num_tokens"] = self.prefill_tokens(prefill_isl, tokens_per_block)
        return out


@dataclass(frozen=True)
class Candidate:
    """One configuration aiconfigurator evaluated (one row of its Pareto front), for the whole GPU budget."""

    mode: str  # "agg" | "disagg"
    replicas: int  # copies of aiconfigurator's replica that fit the budget
    gpus_used: int
    ctx: RoleShape | None  # disagg: the context (prefill) role; agg: None
    gen: RoleShape  # disagg: the generation (decode) role; agg: the aggregated servers
    concurrency: int  # per replica, as aiconfigurator reports it
    ttft_ms: float  # aiconfigurator's (no KV transfer)
    tpot_ms: float
    tokens_s_gpu: float  # over the whole budget (aiconfigurator's tokens/s/gpu_cluster)
    tokens_s_user: float
    is_moe: bool
    trtllm_version: str
    aic_rank: int = 0  # 1 = aiconfigurator's best by tokens/s/GPU among SLA-meeting rows (no transfer term)
    transfer_ms: float = 0.0
    rejected: str = ""  # why tk does not write it: a layout tk cannot express, or what tk's plan refuses
    extra: dict = field(default_factory=dict)

    @property
    def ttft_total_ms(self) -> float:
        return self.ttft_ms + self.transfer_ms

    @property
    def kvcache(self) -> str:
        return (self.ctx or self.gen).kvcache

    def shape(self) -> str:
        g = self.gen
        if self.mode == "agg":
            return f"{g.workers}x agg {g.layout(self.is_moe)} {g.batch_text()}"
        c = self.ctx
        return (f"{c.workers}x ctx {c.layout(self.is_moe)} {c.batch_text()} + "
                f"{g.workers}x gen {g.layout(self.is_moe)} {g.batch_text()}")

    def why_not(self) -> str:
        """Why tk cannot write this candidate as a recipe ("" when it can)."""
        if self.mode != "disagg":
            return "aggregated serving"
        for title, role in (("context", self.ctx), ("generation", self.gen)):
            why = role.why_not(self.is_moe)
            if why:
                return f"{title}: {why}"
        return ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ttft_total_ms"] = round(self.ttft_total_ms, 3)
        d["shape"] = self.shape()
        for title, role in (("context", self.ctx), ("generation", self.gen)):
            if role is not None and self.mode == "disagg":
                d[f"{title}_layout"] = role.layout(self.is_moe)
        return d


def _num(row: dict, key: str, default=0.0) -> float:
    value = row.get(key, default)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return float(default)
    return value if math.isfinite(value) else float(default)


def _int(row: dict, key: str, default: int = 1) -> int:
    return max(0, int(_num(row, key, default)))


def _role(row: dict, prefix: str, replicas: int) -> RoleShape:
    p = prefix
    return RoleShape(workers=replicas * max(1, _int(row, f"{p}workers", 1)), tp=max(1, _int(row, f"{p}tp")),
                     pp=max(1, _int(row, f"{p}pp")), dp=max(1, _int(row, f"{p}dp")),
                     moe_tp=max(1, _int(row, f"{p}moe_tp")), moe_ep=max(1, _int(row, f"{p}moe_ep")),
                     batch=max(1, _int(row, f"{p}bs")), cp=max(1, _int(row, f"{p}cp")),
                     gemm=str(row.get(f"{p}gemm") or ""), moe=str(row.get(f"{p}moe") or ""),
                     kvcache=str(row.get(f"{p}kvcache") or ""), memory_gib=_num(row, f"{p}memory", 0.0))


def candidate(mode: str, row: dict, gpus: int, is_moe: bool) -> Candidate | None:
    """The candidate of one Pareto row (a record of aiconfigurator's DataFrame) on a budget of ``gpus``; None for a
    replica larger than the budget."""
    per_replica = int(_num(row, "num_total_gpus"))
    if per_replica <= 0 or per_replica > gpus:
        return None
    replicas = gpus // per_replica
    cluster_tps = _num(row, "tokens/s/gpu") * replicas * per_replica / gpus
    common = dict(mode=mode, replicas=replicas, gpus_used=replicas * per_replica,
                  concurrency=int(_num(row, "concurrency")), ttft_ms=_num(row, "ttft"), tpot_ms=_num(row, "tpot"),
                  tokens_s_gpu=round(cluster_tps, 3), tokens_s_user=_num(row, "tokens/s/user"), is_moe=is_moe)
    if mode == "agg":
        role = _role(row, "", 1)
        role = replace(role, workers=replicas * max(1, per_replica // role.gpus_per_worker))
        return Candidate(**common, ctx=None, gen=role, trtllm_version=str(row.get("version") or ""))
    return Candidate(**common, ctx=_role(row, "(p)", replicas), gen=_role(row, "(d)", replicas),
                     trtllm_version=str(row.get("(p)version") or ""))


# Columns tk reads (what tests/fixtures/aiconfigurator/ records of aiconfigurator's output).
COLUMNS = ("num_total_gpus", "tokens/s/gpu", "tokens/s/user", "concurrency", "ttft", "tpot",
           *(f"{p}{c}" for p in ("", "(p)", "(d)") for c in ("workers", "tp", "pp", "dp", "moe_tp", "moe_ep", "cp",
                                                              "bs", "gemm", "moe", "kvcache", "memory", "version",
                                                              "parallel")))
