"""Spec: every number tk reads from a file this run did not just write is checked (type, finite, in range) and a bad one
is a message naming the file and the field, never a traceback (hostile round 4: m4 trace files, m5 job.json, and a
validation report given to --measured or --validation). Property tests (hypothesis) feed arbitrary documents; the
reproductions of the findings are one test each. Pure: files in tmp_path, nothing spawned."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.bench.workload import BenchInputError, build_workload, read_trace

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                    max_leaves=12)
# lines close to a valid entry (lengths usually valid) so that the checks after the first are reached too
NEAR_TRACE = st.fixed_dictionaries(
    {"input_length": st.integers(1, 4096) | JSON, "output_length": st.integers(1, 256) | JSON},
    optional={"session_id": st.text(max_size=8) | JSON, "delay": st.floats(0, 1e4) | JSON,
              "timestamp": st.floats() | JSON,
              "hash_ids": st.lists(st.integers(0, 2**40), max_size=6) | st.lists(JSON, max_size=4) | JSON})


# An integer JSON reads whole but float() cannot hold (OverflowError, and math.isfinite raises it too): refused like any
# other number out of range, never a traceback (review of issue 31).
HUGE = 10**400


def _trace(tmp_path: Path, *lines: str) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def _dumps(doc) -> str:
    return json.dumps(doc, allow_nan=True)


# --- m4: trace files ----------------------------------------------------------------------------------------------

def test_a_line_of_200000_brackets_is_a_message_naming_the_line(tmp_path):
    p = _trace(tmp_path, '{"session_id": "a", "input_length": 10, "output_length": 4}', "[" * 200_000)
    with pytest.raises(BenchInputError, match=rf"{p.name}:2: .*nested deeper"):
        build_workload("multi-turn", trace=str(p))


@pytest.mark.parametrize("hash_ids,why", [
    (7, "not a list"), ("abc", "not a list"), ({"a": 1}, "not a list"),
    ([1, "2", 3], "hash_ids\\[1\\]"), ([1, 2.5], "hash_ids\\[1\\]"), ([True, 2], "hash_ids\\[0\\]"),
    ([1, None], "hash_ids\\[1\\]"), ([1, 2**70], "hash_ids\\[1\\]"), (list(range(11)), "more hash_ids than"),
])
def test_hash_ids_are_a_list_of_integers_or_a_message_naming_them(tmp_path, hash_ids, why):
    p = _trace(tmp_path, _dumps({"session_id": "a", "input_length": 10, "output_length": 4, "hash_ids": hash_ids}))
    with pytest.raises(BenchInputError, match=rf"{p.name}:1: .*{why}"):
        build_workload("multi-turn", trace=str(p))


@pytest.mark.parametrize("field,value", [("session_id", 7), ("session_id", ["a"]), ("session_id", "x" * 5000),
                                         ("delay", math.nan), ("delay", -1), ("timestamp", math.inf),
                                         ("timestamp", "soon"), ("input_length", 1.5), ("output_length", True),
                                         ("delay", HUGE), ("timestamp", HUGE), ("input_length", HUGE)],
                         ids=lambda v: str(v)[:20])
def test_every_field_aiperf_reads_is_checked(tmp_path, field, value):
    doc = {"session_id": "a", "input_length": 10, "output_length": 4, field: value}
    p = _trace(tmp_path, _dumps(doc))
    with pytest.raises(BenchInputError, match=rf"{p.name}:1: {field}"):
        read_trace(str(p))


def test_entries_without_a_session_are_each_their_own_conversation_as_aiperf_makes_them(tmp_path):
    p = _trace(tmp_path, *[_dumps({"session_id": s, "input_length": 10, "output_length": 4})
                           for s in (None, None, "", "a", "a")])
    cell = build_workload("multi-turn", trace=str(p), concurrency=(1,)).cells[0]
    assert cell.conversations == 4 and cell.turns == 2  # three single-turn entries and the two turns of "a"


def test_a_trace_that_is_a_fifo_is_a_message(tmp_path):
    import os

    fifo = tmp_path / "t.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(BenchInputError, match="t.jsonl: a FIFO, not a regular file"):
        build_workload("multi-turn", trace=str(fifo))
    with pytest.raises(BenchInputError, match=f"{tmp_path}: a directory, not a regular file"):
        build_workload("multi-turn", trace=str(tmp_path))
    with pytest.raises(BenchInputError, match="nope.jsonl: no such file"):  # "no such file" only where there is none
        build_workload("multi-turn", trace=str(tmp_path / "nope.jsonl"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=NEAR_TRACE | JSON)
def test_any_trace_line_is_read_or_refused_with_a_message(tmp_path, doc):
    p = _trace(tmp_path, _dumps(doc))
    try:
        build_workload("multi-turn", trace=str(p), concurrency=(1,))
        entries = read_trace(str(p))
    except BenchInputError as exc:
        assert f"{p}:1" in str(exc) or str(p) in str(exc)
        return
    (e,) = entries  # what is read is what aiperf's MooncakeTrace takes, within tk's bounds
    for key in ("input_length", "output_length"):
        assert type(e[key]) is int and 1 <= e[key] <= 1 << 20
    ids = e.get("hash_ids")
    assert ids is None or all(type(i) is int and -2**63 <= i < 2**63 for i in ids) and len(ids) <= e["input_length"]
    assert e.get("session_id") is None or isinstance(e["session_id"], str)
    for key in ("delay", "timestamp"):
        v = e.get(key)
        assert v is None or type(v) in (int, float) and math.isfinite(v) and v >= 0


# --- m5: job.json ------------------------------------------------------------------------------------------------

def _job_doc(*overrides: str) -> dict:
    from tests.unit.helpers import plan_of
    from tests.unit.test_launch_states import STANDIN
    from toolkit.render.job import job_spec

    return json.loads(job_spec(plan_of(STANDIN, *overrides)).to_json())


SECONDS = ("backoff_initial_s", "backoff_max_s", "unhealthy_after_s", "stable_after_s", "health_interval_s",
           "stall_after_s", "startup_timeout_s", "probe_timeout_s")


@pytest.mark.parametrize("where,key,value", [
    ("supervision", "health_interval_s", math.nan), ("supervision", "startup_timeout_s", math.nan),
    ("supervision", "probe_timeout_s", math.inf), ("supervision", "unhealthy_after_s", -5),
    ("supervision", "max_restarts", -1), ("supervision", "health_interval_s", 0), ("", "nodes", 10**12),
    ("", "nodes", 0), ("check", "timeout_s", -math.inf), ("launcher", "stagger_s", math.nan),
    ("supervision", "max_restarts", 10**9), ("supervision", "backoff_max_s", 1e300),
    ("supervision", "health_interval_s", HUGE), ("launcher", "stagger_s", HUGE), ("check", "timeout_s", -HUGE),
], ids=lambda v: repr(v)[:20])
def test_job_json_numbers_are_finite_and_in_range_or_refused_naming_the_field(where, key, value):
    from orchestrator.spec import JobSpec, SpecError

    doc = _job_doc()
    (doc[where] if where else doc)[key] = value
    with pytest.raises(SpecError, match=(where + "." if where else "") + key):
        JobSpec.from_dict(json.loads(_dumps(doc)))


def test_job_json_minimum_counts_and_node_ports_are_in_range():
    from orchestrator.spec import JobSpec, SpecError

    for edit, field in ((lambda d: d["supervision"]["minimum"].update(ctx=-1), "supervision.minimum"),
                        (lambda d: d["node_ports"][0].append(70000), "node_ports"),
                        (lambda d: d["components"][0].update(ntasks=0), "ntasks"),
                        (lambda d: d["components"][0].update(ntasks_per_node=10**9), "ntasks_per_node")):
        doc = _job_doc()
        edit(doc)
        with pytest.raises(SpecError, match=field):
            JobSpec.from_dict(doc)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1, 1e300, "10", True, None, HUGE],
                         ids=lambda v: repr(v)[:20])
def test_membership_rejoin_s_is_finite_and_in_range_or_refused_naming_the_field(value):
    """membership.rejoin_s (how long a worker whose key lapsed has to register again before the job restarts it)
    is a number of seconds like the supervision's: NaN would make that deadline never pass."""
    from orchestrator.spec import JobSpec, SpecError

    doc = _job_doc("membership.enabled=true")
    assert JobSpec.from_dict(json.loads(_dumps(doc))).membership.rejoin_s == doc["membership"]["rejoin_s"] > 0
    doc["membership"]["rejoin_s"] = value
    with pytest.raises(SpecError, match="membership.rejoin_s"):
        JobSpec.from_dict(json.loads(_dumps(doc)))


@pytest.mark.parametrize("value", ["USR1", "SIG", "SIGUSR1; rm", "SIG" + "A" * 60, 10, True, ["SIGUSR1"]])
def test_job_json_time_limit_signal_is_a_signals_name_or_refused(value):
    from orchestrator.spec import JobSpec, SpecError

    doc = _job_doc('cluster.sbatch_args=["--signal=B:USR1@300"]')
    assert JobSpec.from_dict(doc).time_limit_signal == doc["time_limit_signal"] == "SIGUSR1"
    doc["time_limit_signal"] = value
    with pytest.raises(SpecError, match="time_limit_signal"):
        JobSpec.from_dict(doc)


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(SECONDS + ("max_restarts",)),
       value=st.floats(allow_nan=True, allow_infinity=True) | st.integers(-2**40, 2**40) | JSON
       | st.sampled_from([HUGE, -HUGE]))
def test_any_supervision_number_is_accepted_within_its_range_or_refused(key, value):
    from orchestrator.spec import JobSpec, SpecError

    doc = _job_doc()
    doc["supervision"][key] = value
    try:
        spec = JobSpec.from_dict(json.loads(_dumps(doc)))
    except SpecError as exc:
        assert f"supervision.{key}" in str(exc)
        return
    got = getattr(spec.supervision, key)
    assert math.isfinite(got) and 0 <= got <= 7 * 86400
    if key in ("health_interval_s", "startup_timeout_s", "probe_timeout_s"):
        assert got > 0  # a wait of 0 is a busy loop


# --- a validation report given to tk size --measured or tk bench --validation ------------------------------------------

def _report(tmp_path: Path, matrix=None, pairs=None) -> Path:
    doc = {"kind": "tk-validate-cluster", "passed": True, "thresholds": {"transport": "tcp"},
           "bandwidth_matrix": {"generation": ["g0"], "gbps": matrix if matrix is not None else [[12.5]]},
           "pairs": pairs if pairs is not None else [
               {"src": "c0", "dst": "g0", "op": "WRITE", "gbps": 12.5},
               {"src": "g0", "dst": "c0", "op": "WRITE", "gbps": 11.0, "direction": "reverse"}]}
    d = tmp_path / "val"
    d.mkdir(exist_ok=True)
    (d / "report.json").write_text(_dumps(doc))
    return d


@pytest.mark.parametrize("value", [math.nan, math.inf, -3.0, 1e300, True, "12", HUGE], ids=lambda v: repr(v)[:20])
def test_a_measured_bandwidth_that_is_not_one_is_refused_naming_the_file_and_field(tmp_path, value):
    from toolkit.size.transfer import MeasuredError, measured

    d = _report(tmp_path, matrix=[[12.5, value]])
    with pytest.raises(MeasuredError, match=r"report\.json: bandwidth_matrix\.gbps\[0\]\[1\]"):
        measured(d)
    d = _report(tmp_path, pairs=[{"src": "g0", "dst": "c0", "op": "WRITE", "gbps": 11.0, "direction": "reverse"},
                                 {"src": "g1", "dst": "c0", "op": "WRITE", "gbps": value, "direction": "reverse"}])
    with pytest.raises(MeasuredError, match=r"report\.json: pairs\[1\]\.gbps"):
        measured(d, direction="reverse")


def test_bench_validation_names_the_report_and_field(tmp_path):
    from toolkit.bench import reverse_bandwidth_for

    d = _report(tmp_path, pairs=[{"src": "g0", "dst": "c0", "op": "WRITE", "gbps": -1, "direction": "reverse"}])
    with pytest.raises(BenchInputError, match=r"--validation: .*report\.json: pairs\[0\]\.gbps"):
        reverse_bandwidth_for(str(d), None)


def test_unmeasured_pairs_are_skipped_and_measured_ones_read(tmp_path):
    from toolkit.size.transfer import measured

    d = _report(tmp_path, matrix=[[12.5, None, 0]])  # a failed pair has no figure: skipped, not an error
    assert measured(d).gbps == 12.5 and measured(d, direction="reverse").gbps == 11.0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(report=JSON | st.fixed_dictionaries({"kind": st.just("tk-validate-cluster")},
                                           optional={"bandwidth_matrix": JSON, "pairs": JSON, "timing": JSON,
                                                     "thresholds": JSON, "passed": JSON}))
def test_any_report_gives_a_finite_bandwidth_or_a_message(tmp_path, report):
    from toolkit.size.transfer import MeasuredError, measured

    p = tmp_path / "report.json"
    p.write_text(_dumps(report))
    for direction in ("forward", "reverse"):
        try:
            bw = measured(p, direction=direction)
        except MeasuredError as exc:
            assert str(p) in str(exc)
            continue
        assert math.isfinite(bw.gbps) and 0 < bw.gbps <= 10_000
        assert bw.transport is None or isinstance(bw.transport, str)


# --- m7: tk validate cluster --local sizes no more than this machine holds -------------------------------------------

def test_local_validation_refuses_buffers_beyond_this_machines_memory_with_the_figure(tmp_path, monkeypatch):
    """Hostile round 4 (m7): --max-memory-mb 1048576 --lengths 10000000 sized 286 GiB per agent on standin-2p2d,
    with no check against the machine's memory."""
    from toolkit import api
    from toolkit.validate import launchers, run
    from toolkit.validate.params import ValidateError

    monkeypatch.setenv("TK_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("TK_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(run, "available_memory", lambda: (6 << 30, 16 << 30))  # 6 GiB free of 16

    def no_agents(self):
        raise AssertionError("no agent may start")
    monkeypatch.setattr(launchers.LocalLauncher, "start", no_agents)
    plan = api.load_plan("standin-2p2d")
    with pytest.raises(ValidateError) as exc:
        api.validate(plan, mode="local", max_memory_mb=1 << 20, lengths=(10_000_000,), sweep=False, reverse=False)
    text = str(exc.value)
    assert "GiB" in text and "6.0 GiB available" in text and "4 agents" in text and "--max-memory-mb" in text
    assert not any((tmp_path / "runs").glob("*/params.json"))  # refused before anything was prepared
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []  # and its directory removed


def test_local_validation_counts_only_host_memory_pools_against_this_machines_memory(tmp_path, monkeypatch):
    """--memory vram puts every agent's pool on the GPU: the host's available memory says nothing about it where the
    agents check it there (torch or CuPy), so pools that would not fit in host memory are not refused; without
    either, each agent mirrors its pool in host memory, which is counted; the same pools in DRAM are counted."""
    from toolkit import api
    from toolkit.validate import run
    from toolkit.validate.params import Options, ValidateError, build_params

    monkeypatch.setattr(run, "available_memory", lambda: (1 << 30, 16 << 30))  # 1 GiB free of 16
    plan = api.load_plan("standin-2p2d")

    def params(memory):
        return build_params(plan, Options(mode="local", memory=memory, max_memory_mb=1024, lengths=(65536,),
                                          sweep=False, reverse=False), str(tmp_path))
    vram = params("vram")
    assert sum(vram["geometry"]["pool_bytes"].values()) > 1 << 30  # would not fit the host's 1 GiB
    find_spec, device_checkers = run.importlib.util.find_spec, {"torch": None, "cupy": None}
    monkeypatch.setattr(run.importlib.util, "find_spec",
                        lambda name, *a: device_checkers[name] if name in device_checkers else find_spec(name, *a))
    device_checkers["torch"] = object()
    run.check_local_memory(vram)  # VRAM pools checked on the GPU (torch or CuPy): not the host's memory
    device_checkers["torch"] = None
    with pytest.raises(ValidateError, match="1.0 GiB available"):  # neither: each agent mirrors its pool in DRAM
        run.check_local_memory(vram)
    for memory in ("dram", "auto"):  # auto: host memory where no GPU is visible (standin's engine: DRAM)
        with pytest.raises(ValidateError, match="1.0 GiB available"):
            run.check_local_memory(params(memory))
