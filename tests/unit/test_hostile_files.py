"""Spec: every file tk reads is bounded (size, nesting depth, time) and contained in its run directory, a bad one is a
message naming it that never breaks the others, outputs a user names are only ever regular files, job ids are
validated where they are read, and secrets in a recipe are owner-only (issue 21: M6, M9, m4, m6, m8, m12 and their
classes). Pure file work in tmp_path: nothing is spawned."""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from pathlib import Path

import pytest

from tests.unit.helpers import plan_of
from tests.unit.test_launch_states import STANDIN
from toolkit.errors import TkError
from toolkit.launch.run import RunRecord, all_runs, load_run, log_tail
from toolkit.runtime import files, rundir


@pytest.fixture
def runs_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TK_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("TK_RUNS_DIR", str(tmp_path / "runs"))
    (tmp_path / "runs").mkdir()
    return tmp_path


def _run(root: Path, name: str, **fields) -> Path:
    d = root / name
    (d / "state").mkdir(parents=True)
    (d / "logs").mkdir()
    record = RunRecord.new(plan_of(STANDIN), d, "local")
    for k, v in fields.items():
        setattr(record, k, v)
    record.save()
    return d


# --- M6: a job id is a job id ------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend,job_id", [("slurm", "--name=tkblock"), ("slurm", "--user=root"), ("slurm", "1 2"),
                                            ("slurm", "12;rm"), ("local", "local-../../x"), ("local", "12")])
def test_a_job_id_that_is_not_one_makes_the_record_unreadable_naming_the_field(runs_env, backend, job_id):
    d = _run(runs_env / "runs", "x", backend=backend, job_id=job_id, state="ready")
    with pytest.raises(TkError) as exc:
        load_run(d)
    assert "job_id" in str(exc.value) and "not a readable tk run" in str(exc.value)


@pytest.mark.parametrize("backend,job_id", [("slurm", "24"), ("slurm", "1234_7"), ("local", "local-0123456789ab")])
def test_real_job_ids_are_read(runs_env, backend, job_id):
    assert load_run(_run(runs_env / "runs", "x", backend=backend, job_id=job_id)).job_id == job_id


def test_slurm_calls_refuse_an_option_for_a_job_id():
    from toolkit.runtime.slurm import SlurmError, cancel_and_wait, job_state

    for call in (job_state, cancel_and_wait):
        with pytest.raises(SlurmError, match="not a Slurm job id"):
            call("--name=other")


# --- m6: deep, huge, odd files are messages that never break the listing of other runs ----------------------------

def test_a_deeply_nested_run_json_or_index_line_is_skipped_and_the_other_runs_are_listed(runs_env):
    good = _run(runs_env / "runs", "good")
    bad = runs_env / "runs" / "bad"
    bad.mkdir()
    (bad / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    rundir.index_path().parent.mkdir(parents=True, exist_ok=True)
    with open(rundir.index_path(), "w") as f:
        f.write("[" * 100_000 + "\n")
        f.write(json.dumps({"path": str(good.resolve()), "name": "good"}) + "\n")
    assert [r.name for r in all_runs()] == ["good"]
    with pytest.raises(TkError) as exc:
        load_run(bad)
    assert "nested deeper" in str(exc.value) and str(bad) in str(exc.value)


def test_a_fifo_or_oversized_run_json_is_named_and_never_blocks(runs_env):
    fifo = runs_env / "runs" / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "run.json")
    big = runs_env / "runs" / "big"
    big.mkdir()
    with open(big / "run.json", "wb") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB of zeros
    good = _run(runs_env / "runs", "good")

    def blocked(*_):
        raise TimeoutError("listing the runs blocked on a FIFO")
    previous = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(10)  # a FIFO opened for reading (without O_NONBLOCK) would block forever
    try:
        assert [r.name for r in all_runs()] == ["good"]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    for d, why in ((fifo, "not a regular file"), (big, "more than")):
        with pytest.raises(TkError, match=why):
            load_run(d)
    assert good.exists()


def test_deep_json_everywhere_tk_reads_is_a_message(tmp_path):
    from toolkit.doctor.diff import diff_dirs
    from toolkit.size.transfer import MeasuredError, measured

    deep = "[" * 50_000 + "]" * 50_000
    for name in ("a", "b"):
        (tmp_path / name / "provenance").mkdir(parents=True)
        (tmp_path / name / "provenance" / "n0.json").write_text(deep)
        (tmp_path / name / "report.json").write_text(deep)
    assert diff_dirs(tmp_path / "a", tmp_path / "b")["same"]  # read as absent, not a RecursionError
    with pytest.raises(MeasuredError, match="nested deeper"):
        measured(tmp_path / "a")
    assert files.depth(json.loads("[[1, {\"a\": [2]}]]")) == 4


# --- containment: names and symlinks never lead out of the run directory ------------------------------------------

def test_a_server_name_that_is_a_path_makes_the_record_unreadable(runs_env):
    d = _run(runs_env / "runs", "x")
    doc = json.loads((d / "run.json").read_text())
    doc["servers"][0]["name"] = "../../../../etc/passwd"
    (d / "run.json").write_text(json.dumps(doc))
    with pytest.raises(TkError, match="not a server name"):
        load_run(d)


def test_a_log_that_is_a_symlink_out_of_the_run_is_not_read(runs_env):
    secret = runs_env / "secret.txt"
    secret.write_text("TOP SECRET\n")
    d = _run(runs_env / "runs", "x")
    os.symlink(secret, d / "logs" / "ctx-0.log")
    run = load_run(d)
    text = log_tail(run.log_path("ctx-0"))
    assert "TOP SECRET" not in text and "not read" in text
    from toolkit.doctor import diagnose
    doc = diagnose(d, failing="ctx-0")
    assert "TOP SECRET" not in json.dumps(doc)
    os.unlink(d / "logs" / "ctx-0.log")
    (d / "logs").rmdir()
    os.symlink(runs_env, d / "logs")  # the whole logs directory leads elsewhere
    (runs_env / "gen-0.log").write_text("TOP SECRET\n")
    assert "TOP SECRET" not in json.dumps(diagnose(d)) and "TOP SECRET" not in log_tail(run.log_path("gen-0"))


def test_inside_refuses_dotdot_and_symlinks_and_accepts_what_is_inside(tmp_path):
    (tmp_path / "run" / "logs").mkdir(parents=True)
    assert files.inside(tmp_path / "run", "logs/a.log") == tmp_path / "run" / "logs" / "a.log"
    with pytest.raises(files.FileProblem, match="leads outside"):
        files.inside(tmp_path / "run", "../x")
    os.symlink("/etc", tmp_path / "run" / "etc")
    with pytest.raises(files.FileProblem, match="leads outside"):
        files.inside(tmp_path / "run", "etc/passwd")


# --- m4: the failing component's log is read first, whatever else logs/ holds --------------------------------------

def test_doctor_reads_the_failing_components_log_among_600_others(tmp_path):
    from toolkit.doctor import diagnose

    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(600):
        (logs / f"aaa-{i:04}.log").write_text("nothing to see\n")
    (logs / "gen-0.log").write_text("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "events.jsonl").write_text(json.dumps(
        {"time": 1, "event": "failed", "component": "gen-0", "state": "failed",
         "reason": "gen-0 exited with code 1 (log: logs/gen-0.log)", "exit_code": 1, "restarts": None}) + "\n")
    doc = diagnose(tmp_path)
    assert doc["failing"] == "gen-0" and doc["findings"] and doc["findings"][0]["id"] == "cuda-oom"


def test_signature_scans_are_linear_on_hostile_lines(tmp_path):
    from toolkit.doctor import diagnose

    logs = tmp_path / "logs"
    logs.mkdir()
    # lines that make a backtracking `A.*B` or `\w*Error` search quadratic in their length
    (logs / "ctx-0.log").write_text("refuses the KV of context server " * 9000 + "\n" + "x" * 300_000 + "\n"
                                    + "model path " * 30_000 + "\n")
    started = time.monotonic()
    diagnose(tmp_path)
    assert time.monotonic() - started < 20


# --- M9: tk size -o writes only a regular file ----------------------------------------------------------------------

def _kinds(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    d = tmp_path / "dir"
    d.mkdir()
    target = tmp_path / "elsewhere.yaml"
    target.write_text("keep me\n")
    link = tmp_path / "link.yaml"
    os.symlink(target, link)
    out = [(fifo, stat.S_ISFIFO), (d, stat.S_ISDIR), (link, stat.S_ISLNK)]
    if os.geteuid() == 0:
        dev = tmp_path / "null"
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of our own
        out.append((dev, stat.S_ISCHR))
    return out, target


def test_size_output_is_never_written_over_a_device_fifo_directory_or_symlink(tmp_path):
    from toolkit.size.recipe import write_file

    kinds, target = _kinds(tmp_path)
    for path, is_kind in kinds:
        with pytest.raises(TkError) as exc:
            write_file(str(path), "schema_version: 1\n")
        assert str(path) in str(exc.value) and "nothing was written" in str(exc.value)
        assert is_kind(os.lstat(path).st_mode), path
    assert target.read_text() == "keep me\n"
    assert [p.name for p in tmp_path.iterdir() if ".tk-tmp-" in p.name] == []
    ok = tmp_path / "new.yaml"
    write_file(str(ok), "a: 1\n")
    write_file(str(ok), "a: 2\n")
    assert ok.read_text() == "a: 2\n" and stat.S_IMODE(ok.stat().st_mode) == 0o644


def test_size_refuses_an_output_that_is_not_a_regular_file_before_it_searches(tmp_path, monkeypatch, capsys):
    """`tk size -o FIFO` searched for 10-47 s (aiconfigurator), then refused the output (review of issue 31): the
    output is looked at first, as tk import's and tk render's are."""
    from toolkit import api
    from toolkit.cli import main

    def search(*args, **kwargs):
        raise AssertionError("the search ran before the output was checked")
    monkeypatch.setattr(api, "size", search)
    kinds, target = _kinds(tmp_path)
    for path, is_kind in kinds:
        assert main(["size", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--system", "h100_sxm", "--gpus", "8",
                     "--isl", "1000", "--osl", "100", "--ttft", "1000", "--tpot", "50", "-o", str(path)]) != 0
        err = capsys.readouterr().err
        assert "nothing was written" in err or "is a directory" in err, err
        assert is_kind(os.lstat(path).st_mode), path
    assert target.read_text() == "keep me\n"
    assert main(["size", "--model", "m", "--system", "h100_sxm", "--gpus", "8", "--isl", "1000", "--osl", "100",
                 "--ttft", "1000", "--tpot", "50", "-o", str(target / "under-a-file.yaml")]) == 1
    assert "cannot write the recipe there (Not a directory)" in capsys.readouterr().err


# --- m12: secrets in a recipe's env ---------------------------------------------------------------------------------

def test_env_files_and_the_manifest_are_owner_only(tmp_path):
    from toolkit.render import render

    plan = plan_of(STANDIN, 'context.env={"HF_TOKEN": "hf_secret"}')
    out, written = render(plan, tmp_path / "r")
    for name in written:
        mode = stat.S_IMODE((out / name).stat().st_mode)
        if b"hf_secret" in (out / name).read_bytes():
            assert mode == 0o600, name
        if name.endswith(".env") or name == "manifest.json":
            assert mode == 0o600, name
    assert any(b"hf_secret" in (out / n).read_bytes() for n in written)


# --- m1: local mode is loopback only, UCX included -------------------------------------------------------------------

def test_local_runs_and_local_validation_keep_ucx_on_loopback(tmp_path, monkeypatch):
    from toolkit.launch.backends import LOOPBACK_ONLY
    from toolkit.validate.launchers import InAllocationLauncher, LocalLauncher

    monkeypatch.setenv("UCX_NET_DEVICES", "mlx5_0:1")  # a login node's export must not reach a local run
    assert LOOPBACK_ONLY == {"UCX_NET_DEVICES": "lo"}
    assert LocalLauncher(tmp_path, {"agents": []}, "python3").env()["UCX_NET_DEVICES"] == "lo"
    assert InAllocationLauncher.env is not LocalLauncher.env  # steps on a cluster keep the cluster's own devices


def test_tokens_in_tks_environment_are_written_nowhere(runs_env, monkeypatch):
    from toolkit import api

    monkeypatch.setenv("HF_TOKEN", "hf_envtoken123")
    monkeypatch.setenv("NGC_API_KEY", "ngc_envtoken456")
    run = api.prepare(api.load_plan("standin-2p2d", ["membership.enabled=true"]), local=True,
                      run_dir=runs_env / "runs" / "r")
    texts = [p.read_bytes() for p in Path(run.run_dir).rglob("*") if p.is_file()]
    texts.append(rundir.index_path().read_bytes())
    assert texts and not any(b"envtoken" in t for t in texts)


def test_diff_of_huge_rendered_files_is_bounded(tmp_path):
    from toolkit.doctor.diff import diff_dirs

    for name, seed in (("a", "x"), ("b", "y")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "launch.sbatch").write_text("".join(f"{seed}{i}\n" for i in range(60_000)))
    started = time.monotonic()
    doc = diff_dirs(tmp_path / "a", tmp_path / "b")
    assert doc["rendered"]["launch.sbatch"]["status"] == "changed" and time.monotonic() - started < 10
