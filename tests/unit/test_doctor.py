"""Spec: `tk doctor` names the cause and fix of known failures from a run's logs, and shows the first error line
and the log tail of unknown ones. Every signature has a log excerpt under tests/fixtures/doctor/
(`<signature id>.<source>.log`, source = server | proxy | job | phases) that it matches and no other row claims."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT
from toolkit.errors import TkError
from toolkit.doctor import diagnose, format_diagnosis, read_bounded, scan
from toolkit.doctor.signatures import BY_ID, SIGNATURES

FIXTURES = ROOT / "tests" / "fixtures" / "doctor"


def _fixture(sig_id: str) -> tuple[Path, str]:
    found = sorted(FIXTURES.glob(f"{sig_id}.*.log"))
    assert found, f"no log excerpt for signature {sig_id} under {FIXTURES}"
    return found[0], found[0].name.split(".")[-2]


def test_there_are_at_least_ten_signatures_each_with_cause_fix_and_source():
    assert len(SIGNATURES) >= 10
    assert len(BY_ID) == len(SIGNATURES), "signature ids are unique"
    for s in SIGNATURES:
        assert s.patterns and s.cause and s.fix and s.source and s.where, s.id
        for p in s.patterns:
            re.compile(p)


@pytest.mark.parametrize("sig", SIGNATURES, ids=lambda s: s.id)
def test_each_signature_matches_its_fixture_and_no_other_signature_claims_it(sig):
    path, source = _fixture(sig.id)
    assert scan(path.read_text().splitlines(), source) == [sig.id]


def test_the_issue_s_signatures_are_all_present():
    for needed in ("transceiver-buffer-mismatch", "transceiver-disabled", "transceiver-buffer-misaligned",
                   "port-in-use", "ucx-no-transport", "ib-inactive", "gpu-registration", "cuda-oom", "mpi-spawn",
                   "health-timeout", "unknown-option-key", "nccl-error", "model-path"):
        assert needed in BY_ID


def test_a_signature_only_looks_where_it_applies():
    # tk's own health deadline is a phase line, not something a server prints
    assert scan(["gen-0 not healthy at http://h:1/health after 300s"], "server") == []
    assert scan(["failed\tgen-0 not healthy at http://h:1/health after 300s"], "phases") == ["health-timeout"]


def _event(t, kind, component, reason) -> str:
    """One line of state/events.jsonl, as the job writes it."""
    return json.dumps({"time": t, "event": kind, "component": component, "state": None, "reason": reason,
                       "exit_code": None, "restarts": None}) + "\n"


def _failed_run(tmp_path: Path) -> Path:
    run = tmp_path / "standin-2p2d-20261014-120000"
    (run / "logs").mkdir(parents=True)
    (run / "state").mkdir()
    (run / "state" / "events.jsonl").write_text("".join(_event(*e) for e in (
        (1760000000, "resolving", None, "job 77"), (1760000001, "started", "ctx-0", "ctx-0 on n0"),
        (1760000002, "started", "gen-0", "gen-0 on n1"),
        (1760000009, "failed", "gen-0", "gen-0 exited with code 1 (log: logs/gen-0.log)"),
        (1760000010, "stopping", None, "exit code 1"))))
    (run / "logs" / "ctx-0.log").write_text("[tk-standin] INFO serving\n" * 5)
    (run / "logs" / "gen-0.log").write_text(
        "[tk-standin] INFO serving\n" * 3 + (FIXTURES / "transceiver-buffer-mismatch.server.log").read_text())
    (run / "logs" / "proxy.log").write_text((FIXTURES / "llm-shutting-down.proxy.log").read_text())
    return run


def test_doctor_on_a_failed_run_directory_names_cause_fix_and_file_line(tmp_path):
    run = _failed_run(tmp_path)
    doc = diagnose(run, state="failed", reason="gen-0 exited with code 1 (log: logs/gen-0.log)")
    assert doc["failing"] == "gen-0"
    first = doc["findings"][0]
    assert first["id"] == "transceiver-buffer-mismatch"
    lines = (run / "logs" / "gen-0.log").read_text().splitlines()
    ev = first["evidence"][0]
    assert ev["file"] == "logs/gen-0.log" and "Message truncated" in lines[ev["line"] - 1]
    assert ev["where"] == f"logs/gen-0.log:{ev['line']}"
    # the proxy's "LLM is shutting down" is a consequence: listed, but after the cause
    assert [f["id"] for f in doc["findings"]][-1] == "llm-shutting-down"
    text = format_diagnosis(doc)
    assert "max_tokens_in_buffer" in text and f"logs/gen-0.log:{ev['line']}" in text
    json.dumps(doc)  # --json prints it as it is


def test_unknown_failure_shows_the_first_error_line_and_the_tail(tmp_path):
    run = tmp_path / "r"
    (run / "logs").mkdir(parents=True)
    (run / "state").mkdir()
    (run / "state" / "events.jsonl").write_text(_event(1, "failed", "ctx-0", "ctx-0 exited with code 3 (log: "
                                                                         "logs/ctx-0.log)"))
    (run / "logs" / "ctx-0.log").write_text("loading\nweights 10%\nValueError: something nobody has seen\nbye\n")
    (run / "logs" / "gen-0.log").write_text("ERROR: a later error elsewhere\n")
    doc = diagnose(run)
    assert doc["findings"] == []
    assert doc["first_error"]["where"] == "logs/ctx-0.log:3"
    assert doc["tail"]["file"] == "logs/ctx-0.log" and doc["tail"]["lines"][-1] == "bye"
    text = format_diagnosis(doc)
    assert "no known failure signature" in text and "logs/ctx-0.log:3" in text


def test_doctor_reads_big_logs_bounded_and_still_numbers_lines(tmp_path):
    log = tmp_path / "gen-0.log"
    with open(log, "w") as f:
        for i in range(1, 200_001):
            f.write(f"line {i} padding padding padding\n")
        f.write("UCX  ERROR  tag receive failed: Message truncated\n")
    lines, size, truncated = read_bounded(log)
    assert truncated and size > 1 << 20
    assert sum(len(t) + 1 for _, t in lines) < 400 * 1024
    assert lines[-1] == (200_001, "UCX  ERROR  tag receive failed: Message truncated")


def test_a_damaged_or_empty_run_directory_never_crashes_the_doctor(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    doc = diagnose(run)
    assert doc["findings"] == [] and doc["first_error"] is None
    (run / "logs").mkdir()
    (run / "logs" / "gen-0.log").write_bytes(b"\xff\xfe\x00garbage\nMessage truncated\n")
    (run / "state").mkdir()
    (run / "state" / "events.jsonl").write_bytes(b"not\ta\tnumber\n\x00\n" + b"[" * 100000 + b"\n")
    assert diagnose(run)["findings"][0]["id"] == "transceiver-buffer-mismatch"


# --- the run index: runs are found from any working directory ----------------------------------------------

def test_runs_are_found_from_another_directory_through_the_index(tmp_path, monkeypatch):
    import toolkit.api as api
    from toolkit.runtime import rundir

    monkeypatch.delenv("TK_RUNS_DIR", raising=False)
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    plan = api.load_plan("standin-2p2d")
    run = api.prepare(plan, local=True)  # runs/standin-2p2d-... relative to this directory
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert [r.name for r in api.runs()] == [run.name]
    assert api.find_run(run.name).run_dir == run.run_dir
    with pytest.raises(TkError, match="only dry runs"):  # a dry run (prepare) is found by name, never as "the last"
        api.find_run()
    run.set_state("failed", "launched, then failed")
    assert api.find_run().run_dir == run.run_dir
    assert api.doctor(run.name)["run"] == run.name
    # TK_RUNS_DIR is still honoured, and the union is taken once per directory
    other = tmp_path / "other-runs"
    monkeypatch.setenv("TK_RUNS_DIR", str(other))
    second = api.prepare(plan, local=True, run_dir=other / "second")
    assert [r.name for r in api.runs()] == [run.name, "second"]
    # a damaged index and a run directory that is gone never break anything
    with open(rundir.index_path(), "ab") as f:
        f.write(b"\x00not json\n{\"path\": 3}\n[]\n{\"path\": \"relative/dir\"}\n")
    import shutil
    shutil.rmtree(run.run_dir)
    assert [r.name for r in api.runs()] == ["second"]
    assert second.run_dir in rundir.index_path().read_text()


def test_an_unwritable_state_directory_never_fails_a_run(tmp_path, monkeypatch):
    import toolkit.api as api

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TK_STATE_DIR", str(blocker / "tk"))  # cannot be created
    run = api.prepare(api.load_plan("standin-2p2d"), local=True, run_dir=tmp_path / "r")
    assert api.find_run(tmp_path / "r").name == run.name


def test_every_run_directory_tk_creates_is_indexed_with_one_line(tmp_path, monkeypatch):
    import json

    from toolkit.runtime import rundir

    monkeypatch.setenv("TK_RUNS_DIR", str(tmp_path / "runs"))
    paths = [rundir.new_run_dir("x", None, "validate") for _ in range(3)]
    entries = [json.loads(line) for line in rundir.index_path().read_text().splitlines()]
    assert [e["path"] for e in entries] == [str(p.resolve()) for p in paths]
    assert {e["kind"] for e in entries} == {"validate"}


# --- tk diff ---------------------------------------------------------------------------------------------------

def test_tk_diff_of_two_renders_shows_the_changed_files_bounded(tmp_path):
    import toolkit.api as api
    from toolkit.cli import main

    a, _ = api.render(api.load_plan("standin-2p2d"), tmp_path / "a")
    b, _ = api.render(api.load_plan("standin-2p2d", ["generation.instances=3"]), tmp_path / "b")
    doc = api.diff(a, b)
    assert doc["rendered"]["disagg.yaml"]["status"] == "changed"
    assert any(line == "+  num_instances: 3" for line in doc["rendered"]["disagg.yaml"]["diff"])
    assert doc["rendered"]["ctx.yaml"]["status"] == "same" and not doc["same"]
    assert api.diff(a, a)["same"]
    (b / "provenance").mkdir()
    (b / "provenance" / "n1.json").write_text('{"node": "n1", "engine": "1.2.0", "ucx": null}')
    (b / "provenance" / "n2.json").write_text('not json')
    doc = api.diff(a, b)
    assert doc["versions"]["differ"]["engine"] == {"A": None, "B": ["1.2.0"]}
    assert main(["diff", str(a), str(b)]) == 0
    assert main(["diff", str(a), str(tmp_path / "nothing")]) != 0


def test_tk_diff_compares_what_the_jobs_supervision_did_from_its_events(tmp_path):
    import toolkit.api as api
    from toolkit.doctor.diff import format_diff

    a, _ = api.render(api.load_plan("standin-2p2d"), tmp_path / "a")
    b, _ = api.render(api.load_plan("standin-2p2d"), tmp_path / "b")
    for d in (a, b):
        (d / "state").mkdir()
    (b / "state" / "events.jsonl").write_text("".join(_event(*e) for e in (
        (1, "wedged", "gen-0", "gen-0 wedged: no token for 120s"), (2, "server-exited", "gen-0", "..."),
        (3, "restarting", "gen-0", "gen-0 (restart 1 of this run)"), (4, "step-not-created", "gen-1", "..."))))
    doc = api.diff(a, b)
    assert not doc["same"]
    assert doc["supervision"]["gen-0"]["B"] == {"exits": 1, "restarts": 1, "wedged": 1, "lost": 0,
                                                "steps_not_created": 0, "unregistered": 0}
    assert doc["supervision"]["gen-0"]["A"]["restarts"] == 0 and doc["supervision"]["gen-1"]["B"]["steps_not_created"] == 1
    assert "supervision of gen-0: A nothing  B 1 exits, 1 restarts, 1 wedged" in format_diff(doc)


def test_tk_doctor_command_prints_the_diagnosis_and_json(tmp_path, capsys):
    from toolkit.cli import main

    run = _failed_run(tmp_path)
    import toolkit.api as api

    record = api.prepare(api.load_plan("standin-2p2d"), local=True, run_dir=tmp_path / "run")
    for sub in ("logs", "state"):
        for f in (run / sub).iterdir():
            (record.path / sub / f.name).write_bytes(f.read_bytes())
    record.set_state("failed", "gen-0 exited with code 1 (log: logs/gen-0.log)")
    capsys.readouterr()
    assert main(["doctor", str(record.path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["findings"][0]["id"] == "transceiver-buffer-mismatch"
    assert main(["doctor", str(record.path)]) == 0
    assert "diagnosis [transceiver-buffer-mismatch]" in capsys.readouterr().out


def test_every_fixture_is_claimed_by_exactly_its_signature():
    # A signature may have several excerpts (one per place it shows): each must be matched by it alone.
    for path in sorted(FIXTURES.glob("*.log")):
        sig_id, source = path.name.split(".")[0], path.name.split(".")[-2]
        assert scan(path.read_text().splitlines(), source) == [sig_id], path.name


# --- first-hour failures: a missing model, no serving command, Ctrl-C, and requests a client got refused ----------

def _run_dir(tmp_path: Path, events: list[tuple[str, str | None, str]], logs: dict[str, str]) -> Path:
    """A run directory as the job leaves it: its events (kind, component, reason) in state/events.jsonl, which
    is what tk doctor reads of the job's own account, and its logs."""
    run = tmp_path / "r"
    (run / "logs").mkdir(parents=True)
    (run / "state").mkdir()
    (run / "state" / "events.jsonl").write_text("".join(_event(1760000000 + i, kind, component, reason)
                                                        for i, (kind, component, reason) in enumerate(events)))
    for name, text in logs.items():
        (run / "logs" / name).write_text(text)
    return run


def _files(finding: dict) -> set[str]:
    return {e["file"] for e in finding["evidence"]}


def test_a_missing_model_path_found_by_the_config_check_is_diagnosed(tmp_path):
    message = "MODEL: model directory /nonexistent/model does not exist (nor does /nonexistent)"
    run = _run_dir(tmp_path, [("checking", None, "options"),
                              ("failed", None, f"config check: {message} (log: logs/config-check.log)")],
                   {"config-check.log": f"tk-standin-serve: {message}\n", "job.log": "[tk] failed\n"})
    doc = diagnose(run, state="failed")
    assert doc["findings"][0]["id"] == "model-path"
    assert _files(doc["findings"][0]) >= {"logs/config-check.log", "state/events.jsonl"}  # the job said so too
    assert doc["phases"][-1].startswith("failed\tconfig check: MODEL: model directory")
    assert format_diagnosis(doc).count("Llama") == 0  # no list of built-in models, let alone three


def test_a_serving_command_that_is_not_there_is_diagnosed(tmp_path):
    run = _run_dir(tmp_path, [("failed", "proxy", "proxy exited with code 127 (log: logs/proxy.log)")],
                   {"proxy.log": "tk-proxy: line 2: exec: trtllm-serve: not found\n", "job.log": "[tk] started\n"})
    doc = diagnose(run, state="failed")
    assert doc["findings"][0]["id"] == "engine-not-found"
    assert "cluster.container_image" in doc["findings"][0]["fix"]
    assert _files(doc["findings"][0]) == {"logs/proxy.log", "state/events.jsonl"}
    assert doc["failing"] == "proxy" and doc["first_error"]["file"] == "logs/proxy.log"  # the log that says why


def test_a_server_the_job_saw_miss_its_health_deadline_is_diagnosed_from_the_job_s_events_alone(tmp_path):
    run = _run_dir(tmp_path, [("started", "gen-0", "gen-0 on n1"),
                              ("failed", "gen-0", "gen-0 not healthy at http://n1:8001 after 300s (log: "
                                                  "logs/gen-0.log)")],
                   {"gen-0.log": "[tk-standin] INFO loading weights\n"})
    doc = diagnose(run, state="failed")
    assert doc["findings"][0]["id"] == "health-timeout" and doc["failing"] == "gen-0"
    (evidence,) = doc["findings"][0]["evidence"]
    assert evidence["file"] == "state/events.jsonl" and evidence["line"] == 2
    assert doc["tail"]["file"] == "logs/gen-0.log"  # and the log of the server it names


def test_an_interrupted_launch_says_so(tmp_path):
    run = _run_dir(tmp_path, [("started", "ctx-0", "ctx-0 on n0"), ("failed", None, "signal received (SIGINT)")],
                   {"ctx-0.log": "loading\n"})
    doc = diagnose(run, state="failed", reason="interrupted; cleanup: none")
    # the job's own account (a signal ended it) comes after, as what followed from the interruption
    assert [f["id"] for f in doc["findings"]] == ["interrupted", "job-signalled"]
    assert doc["findings"][1]["secondary"]
    assert "launch again" in doc["findings"][0]["fix"]
    assert doc["phases"] == ["started\tctx-0 on n0", "failed\tsignal received (SIGINT)"]


def test_a_request_the_servers_refused_is_not_the_run_s_diagnosis(tmp_path):
    refused = (FIXTURES / "prompt-exceeds-max-num-tokens.proxy.log").read_text()
    run = _run_dir(tmp_path, [("ready", None, "http://127.0.0.1:8000")], {"proxy.log": "serving\n" + refused})
    doc = diagnose(run, state="ready")
    assert doc["findings"] == [] and doc["phases"] == ["ready\thttp://127.0.0.1:8000"]
    assert [f["id"] for f in doc["refused_requests"]] == ["prompt-exceeds-max-num-tokens"]
    text = format_diagnosis(doc)
    assert "diagnosis [" not in text and "not a failure of the run" in text


def test_signature_sources_cite_upstream_links_not_files_outside_the_repository():
    for s in SIGNATURES:
        assert ".md" not in s.source and not s.source.startswith(("/", "../")), (s.id, s.source)
        for number in re.findall(r"#[0-9]+", s.source):
            raise AssertionError(f"{s.id}: {number} in {s.source!r} is not a link")


# --- round 4: the knob for a taken port, Slurm's gres refusal, and what the doctor prints is inert ------------------

def _events(run: Path, *events: dict) -> None:
    (run / "state").mkdir(parents=True, exist_ok=True)
    base = {"time": 1.0, "component": None, "state": None, "reason": None, "exit_code": None, "restarts": None}
    (run / "state" / "events.jsonl").write_text("".join(json.dumps({**base, **e}) + "\n" for e in events))


def test_a_taken_port_names_the_setting_that_moves_it(tmp_path):
    """Hostile round 4 (m6): a port an etcd or an etcd gateway could not bind was answered with
    cluster.worker_base_port / proxy.port, the wrong knob."""
    etcd = tmp_path / "etcd-run"
    (etcd / "logs").mkdir(parents=True)
    (etcd / "logs" / "etcd.log").write_text(
        '{"level":"fatal","caller":"etcdmain/etcd.go:204","msg":"discovery failed","error":"listen tcp '
        '127.0.0.1:2380: bind: address already in use"}\n')
    _events(etcd, {"event": "failed", "component": "etcd", "reason": "etcd exited with code 1 (log: logs/etcd.log)"})
    gw = tmp_path / "gateway-run"
    (gw / "logs").mkdir(parents=True)
    (gw / "logs" / "gen-0.log").write_text("etcd_gateway.py: [Errno 98] Address already in use\n")
    for run in (etcd, gw):
        finding = next(f for f in diagnose(run)["findings"] if f["id"] == "port-in-use")
        assert "membership.etcd_port" in finding["fix"] and "worker_base_port" not in finding["fix"], run.name
    server = tmp_path / "server-run"
    (server / "logs").mkdir(parents=True)
    (server / "logs" / "ctx-0.log").write_text("OSError: [Errno 98] Address already in use\n")
    finding = next(f for f in diagnose(server)["findings"] if f["id"] == "port-in-use")
    for knob in ("cluster.worker_base_port", "cluster.internal_base_port", "proxy.port", "membership.etcd_port"):
        assert knob in finding["fix"]


def test_slurms_gres_refusal_names_cluster_gpu_request(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    doc = diagnose(run, state="failed", reason="sbatch refused the job: sbatch: error: Invalid generic resource "
                                                "(gres) specification")
    assert doc["findings"][0]["id"] == "slurm-gres-invalid" and "cluster.gpu_request" in doc["findings"][0]["fix"]


def test_the_doctor_prints_what_a_run_wrote_inert(tmp_path, capsys):
    """Hostile round 4 (m8): an event reason with an OSC sequence and BEL reached the terminal raw."""
    from toolkit.cli import main
    import toolkit.api as api

    record = api.prepare(api.load_plan("standin-2p2d"), local=True, run_dir=tmp_path / "run")
    evil = "gen-0 exited\x1b]0;owned\x07 \x1b[2J\x9b31m\u2028next"
    _events(record.path, {"event": "failed", "component": "gen-0", "reason": evil})
    (record.path / "logs").mkdir(exist_ok=True)
    (record.path / "logs" / "gen-0.log").write_text(f"RuntimeError: CUDA out of memory \x1b]52;c;AAAA\x07\n{evil}\n")
    record.set_state("failed", evil)
    capsys.readouterr()
    main(["doctor", str(record.path)])
    out = capsys.readouterr()
    text = out.out + out.err
    for raw in ("\x1b", "\x07", "\x9b", "\u2028"):
        assert raw not in text, repr(raw)
    assert "\\x1b]0;owned\\x07" in text  # shown, as its escape
    assert "CUDA out of memory" in text


def _ucx_table(op: str, description: str, transport: str) -> list[str]:
    """One UCX_PROTO_INFO table of CUDA memory as UCX 1.19 prints it (title and operation on one line)."""
    what = ("remote memory write by ucp_put*(multi) from cuda/GPU0 to cuda/dev[1]" if op == "WRITE" else
            "remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1]")
    rule = "[1795841642.1] [gpu:5:0]   +--------------------------------+---------------------------+---------------+"
    return [f"[1795841642.1] [gpu:5:0]   | ucp_context_0 intra-node cfg#2 | {what} |", rule,
            f"[1795841642.1] [gpu:5:0]   |                         0..inf | {description:<25} | {transport:<13} |",
            rule]


def test_ucx_software_emulation_is_the_finding_for_a_write_only():
    """TensorRT-LLM's transceivers WRITE (the context side puts); a READ of CUDA memory that UCX emulates (as on one
    H100 with cuda_ipc, where the WRITE was zero-copy) is not what slowed or failed a deployment."""
    emulated = "ucx-cuda-software-emulation"
    write_ok = _ucx_table("WRITE", "zero-copy", "cuda_ipc/cuda")
    read_emulated = _ucx_table("READ", "software emulation", "tcp/lo")
    assert emulated in scan(_ucx_table("WRITE", "software emulation", "tcp/lo"))
    assert emulated not in scan(read_emulated)
    assert emulated not in scan(write_ok + read_emulated)  # the READ row is under its own table, not the WRITE's
    assert emulated in scan(read_emulated + _ucx_table("WRITE", "software emulation", "tcp/lo"))
