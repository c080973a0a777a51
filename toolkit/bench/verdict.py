"""The verdict of a benchmark, in this order. Pure: data in, a Verdict out.

1. validity (exit 2): every cell has profiled requests; no successful request with zero output tokens; the error
   rate within a bound; measured ISL/OSL match the workload (aiperf's counts within a tolerance; the server's
   usage.prompt_tokens at least aiperf's ISL and at most a chat-template allowance per message above it;
   usage.completion_tokens equal to OSL); the warm-up excluded (the summary counts only profiled requests).
2. disaggregation (exit 2): counters read before and after (per server lifetime: a restarted server counts from
   0, and the restart is named) show every successful request took the context and the generation leg and its
   KV moved (skipped for an aggregated baseline).
3. parity (exit 2, FAIL): the greedy answers agree with the aggregated baseline's, or without one with a
   generation server's own answers to whole requests (no KV transfer in them) (toolkit.bench.compare).
4. SLA (exit 1): every objective at its declared statistic, in every cell; a miss names the metric and cell.
Exit 0 when all pass.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field

from orchestrator.states import Word

from toolkit.bench.probe import Proof
from toolkit.bench.results import TOKEN_TIMING_METRICS, CellResult
from toolkit.bench.sla import Objective
from toolkit.bench.workload import TEMPLATE_TOKENS_PER_MESSAGE, Workload



class Outcome(enum.IntEnum):
    """A benchmark's verdict, which is `tk bench`'s exit code (verdict.json ``exit_code``)."""

    PASS = 0  # valid, disaggregated, every SLA objective met
    SLA_MISSED = 1  # valid, and an SLA objective missed (named)
    INVALID = 2  # invalid (zero-token answers, errors, lengths off, legs not proven) or the answers differ


class Stage(Word):
    """Which part of the verdict a check belongs to, in the order they are judged (the module doc)."""

    VALIDITY = "validity"
    DISAGGREGATION = "disaggregation"
    PARITY = "parity"
    SLA = "sla"
    REUSE = "reuse"  # informational findings of multi-turn reuse (toolkit.bench.reuse): they change no exit code


PASS, SLA_MISSED, INVALID = Outcome.PASS, Outcome.SLA_MISSED, Outcome.INVALID


@dataclass(frozen=True)
class Bounds:
    max_error_rate: float = 0.01  # fraction of profiled requests
    length_tolerance: float = 0.02  # relative, on aiperf's ISL and OSL
    length_slack_tokens: int = 2  # absolute, on top of the relative tolerance
    template_tokens_per_message: int = TEMPLATE_TOKENS_PER_MESSAGE  # chat template allowance per message

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Check:
    name: str
    stage: Stage
    ok: bool
    reason: str
    cell: str | None = None
    numbers: dict = field(default_factory=dict)
    skipped: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Verdict:
    exit_code: Outcome
    summary: str
    checks: list[Check]

    @property
    def passed(self) -> bool:
        return self.exit_code == PASS

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok and not c.skipped]

    def to_dict(self) -> dict:
        return {"exit_code": self.exit_code, "passed": self.passed, "summary": self.summary,
                "checks": [c.to_dict() for c in self.checks]}


def _within(measured: int, expected: int, b: Bounds) -> bool:
    return abs(measured - expected) <= max(b.length_slack_tokens, b.length_tolerance * expected)


def _validity(workload: Workload, results: dict[str, CellResult], b: Bounds) -> list[Check]:
    checks = []
    for cell in workload.cells:
        res = results.get(cell.name)
        if res is None:
            checks.append(Check("results_present", Stage.VALIDITY, False, "aiperf left no results", cell.name))
            continue
        prof = res.profiled
        ok_recs = [r for r in prof if r.ok]
        n, n_err = len(prof), len(prof) - len(ok_recs)
        if not n or not ok_recs:
            why = f"no successful profiled request ({n} sent, {n_err} failed)"
            first = next((r.error for r in prof if r.error), None)
            checks.append(Check("requests_succeeded", Stage.VALIDITY, False,
                                why + (f"; first error: {first}" if first else ""), cell.name,
                                {"requests": n, "errors": n_err}))
            continue
        zero = [r for r in ok_recs if not r.osl or r.completion_tokens == 0]
        checks.append(Check("no_zero_token_answers", Stage.VALIDITY, not zero,
                            f"{len(zero)} of {len(ok_recs)} successful requests returned no output tokens"
                            if zero else f"all {len(ok_recs)} successful requests returned tokens",
                            cell.name, {"zero_token_answers": len(zero), "successful": len(ok_recs)}))
        rate = n_err / n
        first = next((r.error for r in prof if r.error), None)
        checks.append(Check("error_rate", Stage.VALIDITY, rate <= b.max_error_rate,
                            f"{n_err} of {n} requests failed ({100 * rate:.2f} %, bound {100 * b.max_error_rate:g} %)"
                            + (f"; first: {first}" if first and rate > b.max_error_rate else ""),
                            cell.name, {"errors": n_err, "requests": n, "error_rate": rate,
                                        "bound": b.max_error_rate}))
        bad_isl = [r for r in ok_recs if r.isl is None or (cell.expected_isl(r.turn) is not None
                                                           and not _within(r.isl, cell.expected_isl(r.turn), b))]
        bad_osl = [r for r in ok_recs if r.osl is None or (cell.expected_osl is not None
                                                           and not _within(r.osl, cell.expected_osl, b))]
        bad_usage_out = [r for r in ok_recs if r.completion_tokens is not None and r.osl is not None
                         and not _within(r.completion_tokens, r.osl, b)]
        bad_usage_in = [r for r in ok_recs if r.prompt_tokens is not None and r.isl is not None
                        and not (r.isl - b.length_slack_tokens <= r.prompt_tokens
                                 <= r.isl + b.template_tokens_per_message * (2 * r.turn + 2))]
        overhead = sorted({r.prompt_tokens - r.isl for r in ok_recs if r.prompt_tokens is not None and r.isl})
        isl_vals = sorted({r.isl for r in ok_recs if r.isl is not None})
        osl_vals = sorted({r.osl for r in ok_recs if r.osl is not None})
        problems = []
        if bad_isl:
            problems.append(f"{len(bad_isl)} requests with ISL off the workload (e.g. {bad_isl[0].isl} for "
                            f"{cell.expected_isl(bad_isl[0].turn)} expected)")
        if bad_osl:
            problems.append(f"{len(bad_osl)} requests with OSL off the workload (e.g. {bad_osl[0].osl} for "
                            f"{cell.osl}; was ignore_eos honoured?)")
        if bad_usage_out:
            problems.append(f"{len(bad_usage_out)} requests where the server's completion_tokens differ from the "
                            f"streamed tokens (e.g. {bad_usage_out[0].completion_tokens} vs {bad_usage_out[0].osl})")
        if bad_usage_in:
            r = bad_usage_in[0]
            problems.append(f"{len(bad_usage_in)} requests where the server's prompt_tokens do not match the sent "
                            f"prompt plus chat template (e.g. {r.prompt_tokens} vs ISL {r.isl}): is the benchmark's "
                            f"tokenizer the model's?")
        checks.append(Check("lengths_match", Stage.VALIDITY, not problems,
                            "; ".join(problems) or f"ISL {isl_vals[:4]}, OSL {osl_vals[:4]} as asked; server prompt "
                            f"tokens exceed ISL by {overhead[:4]} (chat template)", cell.name,
                            {"isl": isl_vals[:8], "osl": osl_vals[:8], "template_overhead": overhead[:8],
                             "expected_isl": cell.isl, "expected_osl": cell.osl, "turns": cell.turns}))
        if res.one_chunk_streams:
            one, streams = res.one_chunk_count
            checks.append(Check("token_timing", Stage.VALIDITY, True,
                                f"{one} of {streams} streams arrived in one chunk (the server answers at once, e.g. "
                                "the plain CPU stand-in without emulated timing): ITL, TPOT and tokens/s per user are "
                                "not measurable; TTFT, latency and throughput are", cell.name,
                                {"one_chunk_streams": one, "streams": streams}))
        counted = res.stat("request_count")
        warm_in_summary = counted is not None and int(counted) != len(ok_recs)
        checks.append(Check("warmup_excluded", Stage.VALIDITY, bool(res.warmup) and not warm_in_summary,
                            (f"{len(res.warmup)} warm-up requests kept out of the summary"
                             if res.warmup and not warm_in_summary else
                             "no warm-up phase in the records" if not res.warmup else
                             f"the summary counts {counted:g} requests, not the {len(ok_recs)} profiled"),
                            cell.name, {"warmup_requests": len(res.warmup), "summary_requests": counted,
                                        "profiled_successful": len(ok_recs)}))
    return checks


def _disaggregation(results: dict[str, CellResult], proof: Proof | None, conditional: bool = False) -> list[Check]:
    if proof is None or proof.kind == "aggregated":
        return [Check("disaggregated", Stage.DISAGGREGATION, True, "aggregated baseline: not applicable", skipped=True)]
    sent = sum(len(r.records) for r in results.values())  # warm-up included: it went through the proxy too
    ok = sum(1 for res in results.values() for r in res.records if r.ok)
    numbers = {**{k: v for k, v in proof.to_dict().items() if k not in ("notes", "per_server")},
               "client_requests": sent, "client_successful": ok}
    if not proof.available:
        return [Check("disaggregated", Stage.DISAGGREGATION, False,
                      "cannot prove the deployment served disaggregated: " + "; ".join(proof.notes), numbers=numbers)]
    problems = []
    if proof.kind == "trtllm" and "proxy" in proof.restarted:
        # its /perf_metrics entries were in the process that went away (probe.account_for_restarts)
        return [Check("disaggregated", "disaggregation", False,
                      f"the legs cannot be counted: the proxy restarted during the run and its /perf_metrics "
                      f"entries of the requests before were lost with its process ({proof.requests} entries for "
                      f"{ok} successful requests); measure again without a restart", numbers=numbers)]
    if proof.kind == "trtllm" and proof.requests < ok:
        problems.append(f"/perf_metrics holds {proof.requests} requests for {ok} successful "
                        f"(raise perf_metrics_max_requests to at least {ok})")
        need = proof.requests
    else:
        need = ok
    local = 0
    if proof.local_prefill and not conditional:
        problems.append(f"{proof.local_prefill} requests were prefilled on the generation server (no context leg)")
    elif proof.local_prefill:
        # conditional disaggregation (the plan asks for it): a request whose uncached part is short goes to the
        # generation server whole, by design; it needs no context leg and moves no KV
        local = proof.local_prefill
    affected = sorted(set(proof.restarted) | set(proof.unreadable))
    workers_affected = [n for n in affected if n != "proxy"]
    if workers_affected and "proxy" not in affected and proof.disaggregated is not None:
        # A worker restarted (or was restarting at the end): its earlier lifetime's counters are gone, but the
        # proxy, whole over the run, counted each request that took both legs.
        if proof.disaggregated + local < need:
            problems.append(f"the proxy counted {proof.disaggregated} requests through both legs for {need} "
                            "successful requests")
    elif workers_affected:
        problems.append(f"the legs cannot be counted: {', '.join(affected)} restarted or did not answer during "
                        "the run, the proxy included")
    else:  # every worker's counters cover the whole run (a restarted proxy's own counters are not needed here)
        if proof.context_legs + local < need:
            problems.append(f"{proof.context_legs} context legs for {need} successful requests")
        if proof.generation_legs + local < need:
            problems.append(f"{proof.generation_legs} generation legs for {need} successful requests")
        if proof.kv_transfers + local < need:
            problems.append(f"{proof.kv_transfers} KV transfers for {need} successful requests")
    reason = "; ".join(problems) or (
        f"{need} successful requests; {proof.context_legs} context legs, {proof.generation_legs} generation "
        f"legs, {proof.kv_transfers} KV transfers" + (f" ({proof.kv_bytes} bytes)" if proof.kv_bytes else "")
        + (f"; {local} prefilled on the generation server (conditional disaggregation)" if local else "")
        + (f"; the proxy counted {proof.disaggregated} through both legs (per server lifetime: "
           f"{', '.join(affected)} restarted during the run)" if workers_affected else ""))
    return [Check("disaggregated", Stage.DISAGGREGATION, not problems, reason, numbers=numbers)]


def _sla(workload: Workload, results: dict[str, CellResult], objectives: tuple[Objective, ...],
         gpus: int | None) -> list[Check]:
    checks = []
    for obj in objectives:
        for cell in workload.cells:
            res = results.get(cell.name)
            if res is not None and obj.metric in TOKEN_TIMING_METRICS and res.one_chunk_streams:
                checks.append(Check(obj.key, Stage.SLA, True, f"{obj.key} not judged at {cell.name}: most streams "
                                    "arrived in one chunk, so the gaps between tokens were never seen", cell.name,
                                    {"limit": obj.limit, "metric": obj.metric, "stat": obj.stat}, skipped=True))
                continue
            value = res.stat(obj.metric, obj.stat) if res else None
            if value is not None and obj.per_gpu:
                value = value / gpus if gpus else None
            if value is None:
                checks.append(Check(obj.key, Stage.SLA, False, f"{obj.key}: aiperf reported no {obj.metric} "
                                    f"{obj.stat}" + (" (GPU count unknown)" if obj.per_gpu and not gpus else ""),
                                    cell.name, {"limit": obj.limit}))
                continue
            ok = value <= obj.limit if obj.kind == "max" else value >= obj.limit
            op = "<=" if obj.kind == "max" else ">="
            bad_op = ">" if obj.kind == "max" else "<"
            reason = (f"{obj.key}: {value:.4g} {op} {obj.limit:g}" if ok else
                      f"{obj.key} missed: {value:.4g} {bad_op} {obj.limit:g} at {cell.name}")
            checks.append(Check(obj.key, Stage.SLA, ok, reason, cell.name,
                                {"measured": value, "limit": obj.limit, "metric": obj.metric, "stat": obj.stat}))
    return checks


def _parity(answers: dict | None, baseline_error: str | None, reference_error: str | None = None) -> list[Check]:
    """The deployment's greedy answers against a reference's: the aggregated baseline's, or without one a
    generation server's own whole answers (toolkit.bench.compare.answers_agree). A reference that could not answer
    is a skipped check, named, never a silent absence."""
    if answers is None:
        if baseline_error:
            return [Check("answers_match", Stage.PARITY, True, f"not compared: the baseline failed "
                          f"({baseline_error[:200]})", skipped=True)]
        if reference_error:
            return [Check("answers_match", Stage.PARITY, True, f"not compared: the generation server answering whole "
                          f"requests failed ({reference_error[:200]})", skipped=True)]
        return []
    return [Check("answers_match", Stage.PARITY, bool(answers.get("agree")), str(answers.get("reason", "")),
                  numbers={k: answers.get(k) for k in ("matching", "prompts")})]


def decide(workload: Workload, results: dict[str, CellResult], proof: Proof | None,
           objectives: tuple[Objective, ...] = (), *, gpus: int | None = None, bounds: Bounds = Bounds(),
           answers: dict | None = None, baseline_error: str | None = None, reference_error: str | None = None,
           against: str = "the aggregated baseline's", conditional: bool = False) -> Verdict:
    """answers: the greedy answers compared with a reference's (compare.answers_agree; `against` names it); answers
    that do not agree are a FAIL (exit 2): the deployment computes something else than the model does.
    ``conditional``: the deployment uses conditional disaggregation, so requests prefilled on a generation
    server (no context leg, no KV moved) are by design, not a deployment that only looks disaggregated."""
    checks = _validity(workload, results, bounds)
    checks += _disaggregation(results, proof, conditional)
    checks += _parity(answers, baseline_error, reference_error)
    checks += _sla(workload, results, objectives, gpus)
    failed = [c for c in checks if not c.ok and not c.skipped]
    # A restart during the run is named in every verdict: the numbers include its outage.
    restarts = sorted(set(proof.restarted) | set(proof.unreadable)) if proof is not None else []
    during = f" [restarted during the run: {', '.join(restarts)}]" if restarts else ""
    invalid = [c for c in failed if c.stage in (Stage.VALIDITY, Stage.DISAGGREGATION)]
    if invalid:
        what = "not disaggregated: " if all(c.stage == Stage.DISAGGREGATION for c in invalid) else ""
        return Verdict(INVALID, "INVALID: " + what + "; ".join(
            f"{c.name}{f' [{c.cell}]' if c.cell else ''}: {c.reason}" for c in invalid[:3]) + during, checks)
    wrong = [c for c in failed if c.stage == Stage.PARITY]
    if wrong:
        return Verdict(INVALID, f"FAIL: the answers differ from {against}: "
                       + "; ".join(c.reason for c in wrong) + during, checks)
    missed = [c for c in failed if c.stage == Stage.SLA]
    if missed:
        return Verdict(SLA_MISSED, "SLA MISSED: " + "; ".join(c.reason for c in missed[:4]) + during, checks)
    unjudged = sorted({c.name for c in checks if c.stage == Stage.SLA and c.skipped})
    judged = [o for o in objectives if o.key not in unjudged or
              any(c.name == o.key and c.stage == Stage.SLA and not c.skipped for c in checks)]
    n_sla = len(judged)
    sla_text = (f", {n_sla} SLA objective(s) met in every cell" if n_sla else
                ", no SLA declared" if not objectives else ", no SLA objective could be judged")
    if unjudged:
        sla_text += f" ({', '.join(unjudged)} not judged: the streams arrived in one chunk)"
    sla_text += "".join(f"; answers {c.reason}" for c in checks if c.stage == Stage.PARITY and c.skipped)
    return Verdict(PASS, "PASS: valid" + (", disaggregated" if proof and proof.kind != "aggregated" else "")
                   + sla_text + during, checks)
