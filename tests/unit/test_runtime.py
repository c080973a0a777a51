"""Spec: the machinery launch and validate share (toolkit.runtime): run directories are never shared, and
a run ends exactly the processes it started."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from toolkit.errors import TkError
from toolkit.runtime import procs, rundir


def test_automatic_run_directories_are_created_exclusively(tmp_path, monkeypatch):
    monkeypatch.setenv("TK_RUNS_DIR", str(tmp_path / "runs"))
    made = {rundir.new_run_dir("r", None) for _ in range(5)}
    assert len(made) == 5 and all(p.is_dir() for p in made)


def test_a_named_run_directory_must_be_new_or_empty_and_is_claimed_once(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert rundir.new_run_dir("r", empty) == empty
    with pytest.raises(TkError, match="already holds"):
        rundir.new_run_dir("r", empty)  # claimed by the first command
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    with pytest.raises(TkError, match="already holds"):
        rundir.new_run_dir("r", used)
    assert (used / "notes.txt").read_text() == "mine"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(TkError, match="not a directory"):
        rundir.new_run_dir("r", a_file)


def test_a_run_directory_refused_before_use_is_removed(tmp_path):
    path = rundir.new_run_dir("r", tmp_path / "x")
    rundir.release_if_unused(path)
    assert not path.exists()
    path = rundir.new_run_dir("r", tmp_path / "y")
    (path / "report.json").write_text("{}")
    rundir.release_if_unused(path)
    assert (path / "report.json").exists()


def _group(tmp_path, name: str, run_id: str) -> subprocess.Popen:
    d = tmp_path / name
    d.mkdir()
    # A leader and a child in its group: as launch.sbatch and the servers it starts.
    return procs.start_group(["bash", "-c", f"sleep 60 & exec sleep 61 # {d}"], cwd=d, env=dict(os.environ),
                             log_path=d / "log", run_id=run_id)


def test_terminate_ends_the_runs_process_group_and_spares_a_run_whose_directory_shares_its_prefix(tmp_path):
    mine = _group(tmp_path, "x", "run-x")
    other = _group(tmp_path, "x-2", "run-x-2")
    try:
        assert rundir.wait_until(lambda: len(procs.members(mine.pid, "run-x")) == 2, 5)
        assert procs.members(mine.pid, "run-x-2") == []  # same group, other id: not this run's
        assert procs.terminate(mine.pid, "run-x", grace_s=5) == []
        assert procs.members(mine.pid, "run-x") == []
        assert len(procs.members(other.pid, "run-x-2")) == 2
    finally:
        procs.terminate(other.pid, "run-x-2", grace_s=5)
        for p in (mine, other):
            p.wait(timeout=5)


def test_a_process_that_ignores_sigterm_is_killed_within_the_bound(tmp_path):
    d = tmp_path / "stubborn"
    d.mkdir()
    # SIGTERM ignored, which exec keeps: the sleep itself ignores it (no interpreter to start)
    proc = procs.start_group(["bash", "-c", "trap '' TERM; echo up; exec sleep 60"], cwd=d, env=dict(os.environ),
                             log_path=d / "log", run_id="stubborn")
    assert rundir.wait_until(lambda: (d / "log").read_text().startswith("up"), 5)
    t0 = time.monotonic()
    assert procs.terminate(proc.pid, "stubborn", grace_s=0.5) == []
    assert time.monotonic() - t0 < 5
    proc.wait(timeout=5)


def test_a_child_that_moved_to_its_own_process_group_is_still_the_runs(tmp_path):
    # GNU timeout puts its command in a process group of its own (launch.sbatch runs `timeout 300 srun ...`):
    # it stays in the run's session, so stopping the run ends it too.
    d = tmp_path / "t"
    d.mkdir()
    proc = procs.start_group(["bash", "-c", "timeout 60 sleep 61 & exec sleep 62"], cwd=d, env=dict(os.environ),
                             log_path=d / "log", run_id="run-t")
    try:
        assert rundir.wait_until(lambda: len(procs.members(proc.pid, "run-t")) == 3, 5)
        groups = {int(open(f"/proc/{p}/stat").read().rsplit(") ", 1)[1].split()[2]) for p in procs.members(proc.pid, "run-t")}
        assert len(groups) == 2  # the leader's group and timeout's own
        assert procs.terminate(proc.pid, "run-t", grace_s=5) == []
    finally:
        proc.wait(timeout=5)


def test_a_signal_the_caller_ignores_stays_ignored_and_one_received_during_cleanup_is_raised_after_it():
    import signal

    from toolkit.runtime import signals

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with signals.interrupt_on_termination():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            signal.raise_signal(signal.SIGHUP)  # ignored: nothing raised
    finally:
        signal.signal(signal.SIGHUP, previous)
    done = []
    with pytest.raises(signals.Terminated) as info:
        with signals.deferred():
            signal.raise_signal(signal.SIGTERM)
            done.append("cleanup finished")  # the signal did not cut it short
    assert done == ["cleanup finished"] and info.value.signum == signal.SIGTERM


@pytest.mark.parametrize("state, phase", [("PENDING", "PENDING"), ("REQUEUED", "PENDING"),
                                          ("REQUEUE_HOLD", "PENDING"), ("RUNNING", "RUNNING"),
                                          ("SUSPENDED", "RUNNING"), ("STAGE_OUT", "RUNNING"),
                                          ("COMPLETING", "RUNNING"), ("CANCELLED", "ENDED"), ("TIMEOUT", "ENDED")])
def test_a_job_squeue_still_lists_in_a_live_state_has_not_ended(monkeypatch, state, phase):
    from toolkit.runtime import slurm

    def fake(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 0, stdout=f"{state}|(Priority)\n", stderr="")

    monkeypatch.setattr(slurm, "run_slurm_command", fake)
    assert slurm.job_state("7").phase == phase


def test_a_refused_start_leaves_a_directory_the_user_made_beforehand(tmp_path):
    mine = tmp_path / "made-by-user"
    mine.mkdir()
    rundir.release_if_unused(rundir.new_run_dir("r", mine))
    assert mine.is_dir() and list(mine.iterdir()) == []


def test_a_moved_run_directory_is_read_where_it_is_now(tmp_path):
    import json
    import shutil

    from toolkit.api import load_plan, prepare
    from toolkit.launch.run import load_run

    run = prepare(load_plan("standin-2p2d"), local=True, run_dir=tmp_path / "a")
    shutil.move(str(run.path), str(tmp_path / "b"))
    assert json.loads((tmp_path / "b" / "run.json").read_text())["run_dir"] == str(tmp_path / "a")
    assert load_run(tmp_path / "b").path == (tmp_path / "b").resolve()


def test_a_process_of_the_session_with_another_run_id_is_not_the_runs(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    proc = procs.start_group(["bash", "-c", "TK_RUN_ID=someone-else sleep 61 & exec sleep 62"], cwd=d,
                             env=dict(os.environ), log_path=d / "log", run_id="run-s")
    try:
        assert rundir.wait_until(lambda: len(procs.members(proc.pid, "someone-else")) == 1, 5)
        other = procs.members(proc.pid, "someone-else")
        assert procs.terminate(proc.pid, "run-s", grace_s=5) == []
        assert procs.members(proc.pid, "someone-else") == other  # same session, other run id: spared
    finally:
        procs.terminate(proc.pid, "someone-else", grace_s=5)
        proc.wait(timeout=5)


def test_the_runs_certificates_give_the_job_etcds_peer_port_an_identity_of_its_own(tmp_path):
    """peer.crt: the job's etcd presents it on its loopback peer port and as a member dialing a peer (both usages),
    naming 127.0.0.1, which etcd checks a peer client certificate's IP SANs against; the job's etcd admits only it
    there (--peer-cert-allowed-cn). The client certificate every gateway presents is no peer's."""
    import ipaddress

    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    from toolkit.render.job import ETCD_SH
    from toolkit.runtime.tls import FILES, write_run_certificates

    out = write_run_certificates(tmp_path / "secrets" / "etcd")
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    assert all(os.stat(out / f).st_mode & 0o777 == 0o600 for f in FILES) and os.stat(out).st_mode & 0o777 == 0o700
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    cert = {leaf: x509.load_pem_x509_certificate((out / f"{leaf}.crt").read_bytes())
            for leaf in ("server", "peer", "client")}
    for c in cert.values():
        c.verify_directly_issued_by(ca)
    both = {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    usages = {leaf: set(c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) for leaf, c in cert.items()}
    assert usages == {"server": both, "peer": both, "client": {ExtendedKeyUsageOID.CLIENT_AUTH}}
    sans = cert["peer"].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    for leaf in ("server", "client"):  # etcd would check these against the address they connect from
        with pytest.raises(x509.ExtensionNotFound):
            cert[leaf].extensions.get_extension_for_class(x509.SubjectAlternativeName)
    peer_cn = cert["peer"].subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert f'--peer-cert-allowed-cn "{peer_cn}"' in ETCD_SH
    assert cert["client"].subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value != peer_cn
    for flag in ('--peer-client-cert-auth', '--peer-trusted-ca-file "$5/ca.crt"', '--peer-cert-file "$5/peer.crt"',
                 '--peer-key-file "$5/peer.key"', '--listen-peer-urls "$scheme://127.0.0.1:$4"',
                 '--initial-advertise-peer-urls "$scheme://127.0.0.1:$4"', '--initial-cluster "tk=$scheme://127.0.0.1:$4"'):
        assert flag in ETCD_SH
