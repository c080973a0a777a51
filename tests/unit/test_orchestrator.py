"""Spec: the job's orchestrator outside its policy (tests/unit/test_policy.py): job.json reads back what tk renders
and refuses what tk does not write; the job's start-up order and failures, in-process with fake steps and probes;
its files (events, state files that are never stale); the membership repair after an etcd outage; job.pyz runs."""

from __future__ import annotations

import errno
import http.client
import json
import subprocess
import sys

import pytest

from orchestrator import job as job_mod
from orchestrator import membership, startup
from orchestrator.events import EventLog, StateFiles
from orchestrator.policy import Event
from orchestrator.spec import JobSpec, SpecError
from orchestrator.states import EventKind
from tests.conftest import ROOT
from toolkit.api import load_plan
from toolkit.render import job_spec, render

STANDIN = str(ROOT / "recipes" / "standin-2p2d.yaml")
REAL_MISSING = membership.missing  # the job_in_process fixture replaces it


def spec_of(*overrides: str) -> JobSpec:
    return job_spec(load_plan(STANDIN, list(overrides)))


# --- job.json ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides", [[], ["membership.enabled=false"], ["membership.enabled=true"]])
def test_job_json_reads_back_exactly_what_was_rendered(overrides):
    spec = spec_of(*overrides)
    assert JobSpec.from_dict(json.loads(spec.to_json())) == spec


@pytest.mark.parametrize("edit,field", [
    (lambda d: d.update(schema=2), "schema"),
    (lambda d: d["supervision"].update(policy="sometimes"), "supervision.policy"),
    (lambda d: d["components"][0].update(port=0), "port"),
    (lambda d: d["components"][0].update(argv=["ok", {"run_file": "../etc/passwd"}]), "argv"),
    (lambda d: d["components"][0].update(nodes=[99]), "components"),
    (lambda d: d.update(components="x"), "components"),
    (lambda d: d["supervision"].update(max_restarts=True), "max_restarts"),
])
def test_a_job_json_tk_did_not_write_is_refused_naming_the_field(edit, field):
    doc = json.loads(spec_of().to_json())
    edit(doc)
    with pytest.raises(SpecError, match=field):
        JobSpec.from_dict(doc)


def test_the_start_order_is_etcd_and_the_proxy_first_with_membership_and_the_proxy_last_without():
    assert [c.name for c in spec_of("membership.enabled=true").components][:2] == ["etcd", "proxy"]
    assert spec_of("membership.enabled=true").proxy_first
    static = spec_of("membership.enabled=false")
    assert static.components[-1].name == "proxy" and not static.proxy_first
    assert all(c.progress == "/health_generate" for c in static.components if c.kind == "worker")
    assert all(c.progress is None for c in spec_of("supervision.stall_after_s=0").components)


# --- start-up, in process ----------------------------------------------------------------------------------

class FakeProc:
    def __init__(self, rc=None):
        self.rc, self.pid = rc, 4242

    def poll(self):
        return self.rc

    def wait(self, timeout=None):
        return self.rc

    def send_signal(self, sig):
        pass

    def kill(self):
        pass


class FakeSteps:
    """Records what was started; every step runs (and its task started) unless told otherwise."""

    def __init__(self, exits=()):
        self.started, self.exits, self.cancelled = [], set(exits), 0

    def argv(self, name, nodelist, ntasks, per_node, gpus, env_file, instance_env, command):
        return [name, *command]

    def start(self, name, argv):
        self.started.append((name, argv))
        return FakeProc(3 if name in self.exits else None)

    def step_created(self, name, listed=False):
        return True

    def srun_said(self, name):
        return ""

    def step_ids(self):
        return {}

    def cancel_job(self):
        self.cancelled += 1


class FakeProber:
    def __init__(self, down=()):
        self.down = set(down)

    def round(self, urls):
        return {name: (None if name in self.down else 200) for name in urls}

    def start_progress(self, url, timeout_s, done, component=None):
        done(200)

    def close(self):
        pass


@pytest.fixture
def job_in_process(tmp_path, monkeypatch):
    def make(spec: JobSpec, steps=None, prober=None):
        monkeypatch.setattr(startup, "discover", lambda s, nodelist, run_dir: startup.Nodes(
            [f"n{i}" for i in range(s.nodes)], ["127.0.0.1"] * s.nodes))
        monkeypatch.setattr(startup, "provenance", lambda *a: None)
        monkeypatch.setattr(startup, "config_check", lambda *a, **k: ("ok", "accepted"))
        monkeypatch.setattr(startup, "write_resolved", lambda *a: None)
        monkeypatch.setattr(membership, "missing", lambda uri, prefix, addrs: [])
        monkeypatch.setattr(job_mod, "POLL_S", 0.0)
        j = job_mod.Job(spec, str(tmp_path), {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[0-3]"},
                        steps=steps or FakeSteps(), prober=prober or FakeProber(), out=open("/dev/null", "w"))
        return j
    return make


def _events(tmp_path):
    return [json.loads(line) for line in (tmp_path / "state" / "events.jsonl").read_text().splitlines()]


def test_start_up_starts_in_order_waits_for_health_then_says_ready(job_in_process, tmp_path):
    from toolkit.runtime.tls import write_run_certificates
    spec = spec_of("membership.enabled=true")
    write_run_certificates(tmp_path / "secrets" / "etcd")  # what tk launch writes for the job's etcd
    j = job_in_process(spec)
    j.start_up()
    started = [name for name, _ in j.steps.started]
    assert started == ["etcd", "proxy", "ctx-0", "ctx-1", "gen-0", "gen-1"]
    kinds = [e["event"] for e in _events(tmp_path)]
    assert kinds[-2:] == ["healthy", "ready"] and "registered" in kinds
    argv = dict(j.steps.started)["ctx-0"]
    assert str(tmp_path / "ctx.yaml") in argv and "<node0>" not in " ".join(argv)  # placeholders and run files
    assert (tmp_path / "endpoint").read_text().startswith("http://127.0.0.1:")
    # the job's etcd is reached over TLS with the run's certificate; the etcd step is given the certificates
    assert j.url(spec.component("etcd"), "/health").startswith("https://")
    assert dict(j.steps.started)["etcd"][-1] == str(tmp_path / "secrets" / "etcd")
    ctx = dict(j.steps.started)["ctx-0"]
    assert ctx[ctx.index("python3") + 1] == str(tmp_path / "etcd_gateway.py")



def test_when_ready_each_servers_state_file_names_its_slurm_step(job_in_process, tmp_path):
    class StepsSlurmLists(FakeSteps):
        def step_ids(self):  # squeue lists the job's steps (and one that is not a server of this run)
            return {"proxy": "77.0", "ctx-0": "77.1", "ctx-1": "77.2", "gen-0": "77.3", "gen-1": "77.4",
                    "other": "77.9"}
    j = job_in_process(spec_of("membership.enabled=false"), steps=StepsSlurmLists())
    j.start_up()
    assert _events(tmp_path)[-1]["event"] == "ready"
    steps = {f.stem: json.loads(f.read_text())["step"] for f in (tmp_path / "state" / "servers").glob("*.json")}
    assert steps == {"proxy": "77.0", "ctx-0": "77.1", "ctx-1": "77.2", "gen-0": "77.3", "gen-1": "77.4"}

def _serving(j):
    j.start_up()
    j.begin_supervision()
    return j


def test_a_server_whose_step_squeue_listed_is_counted_when_it_exits_though_its_marker_is_not_seen(job_in_process,
                                                                                                   tmp_path):
    class StepsNoMarkerSeen(FakeSteps):  # the marker on NFS is not seen yet from the batch host; srun said nothing
        def step_created(self, name, listed=False):
            return True if listed else None

        def step_ids(self):
            return {"gen-0": "77.3"}
    j = _serving(job_in_process(spec_of("membership.enabled=false"), steps=StepsNoMarkerSeen()))
    assert j.step_of["gen-0"] == "77.3"
    j.procs["gen-0"].rc = 1
    j.round()
    (ev,) = [e for e in _events(tmp_path) if e["component"] == "gen-0" and e["event"] in ("server-exited",
                                                                                          "step-not-created")]
    assert ev["event"] == "server-exited" and "restart 1 of" in ev["reason"]


def test_a_run_directory_without_the_runs_certificates_fails_the_job_saying_why(job_in_process, tmp_path):
    j = job_in_process(spec_of("membership.enabled=true"))
    with pytest.raises(startup.StartupFailed, match=r"no ca.crt, client.crt, client.key in .*secrets/etcd: tk launch"):
        j.start_up()
    assert j.steps.started == []


def test_a_component_that_exits_before_the_deployment_serves_fails_the_job_naming_it(job_in_process, tmp_path):
    j = job_in_process(spec_of("membership.enabled=false"), steps=FakeSteps(exits={"gen-1"}),
                       prober=FakeProber(down={"gen-1"}))
    assert j.run() == 1
    failed = [e for e in _events(tmp_path) if e["event"] == "failed"]
    assert failed[0]["component"] == "gen-1" and "before the deployment served" in failed[0]["reason"]
    assert _events(tmp_path)[-1]["event"] == "stopping" and j.steps.cancelled == 1
    assert json.loads((tmp_path / "state" / "servers" / "gen-1.json").read_text())["state"] == "exited"


def test_a_server_that_never_turns_healthy_fails_the_job_after_the_startup_timeout(job_in_process, tmp_path,
                                                                                   monkeypatch):
    clock = iter(range(0, 10_000, 50))
    spec = spec_of("membership.enabled=false")
    j = job_in_process(spec, prober=FakeProber(down={"ctx-1"}))
    j.clock = lambda: float(next(clock))
    with pytest.raises(startup.StartupFailed, match=r"ctx-1 not healthy at http://127.0.0.1:\d+ after 120s \(log: logs/ctx-1.log\)") as info:
        j.start_up()
    assert info.value.component == "ctx-1"


# --- steps ----------------------------------------------------------------------------------------------------

def test_a_step_is_created_when_squeue_listed_it_or_its_marker_is_there_and_not_when_srun_says_so(tmp_path):
    from orchestrator.steps import Steps
    steps = Steps(str(tmp_path), "77", [])
    err = tmp_path / "state" / "steps" / "gen-0.srun.err"
    err.write_text("srun: error: Unable to create step for job 77: Socket timed out on send/recv operation\n")
    assert steps.step_created("gen-0") is False  # srun's own words
    assert steps.step_created("gen-0", listed=True) is True  # squeue listed it: created, whatever srun said
    err.write_text("srun: error: n1: task 0: Exited with exit code 1\n")
    assert steps.step_created("gen-0") is None  # no marker, and srun says nothing about the step: unknown
    (tmp_path / "state" / "steps" / "gen-0.started").touch()
    assert steps.step_created("gen-0") is True


class SignalledProc(FakeProc):
    def __init__(self):
        super().__init__()
        self.signals = []

    def send_signal(self, sig):
        self.signals.append(sig)

    def wait(self, timeout=None):
        return -9


@pytest.mark.parametrize("scancel_rc,sigints", [(0, 0), (1, 2), (124, 2)])
def test_a_kill_falls_back_to_srun_ending_its_step_when_scancel_fails(tmp_path, monkeypatch, scancel_rc, sigints):
    # scancel fails when the controller is down or the step id is stale: SIGKILL of srun alone would leave the
    # step's tasks running on the node while the server is reported dead
    import signal as sig
    from orchestrator import steps as steps_mod
    calls = []
    monkeypatch.setattr(steps_mod, "run_bounded", lambda argv, timeout_s: calls.append(argv) or (scancel_rc, "", ""))
    monkeypatch.setattr(steps_mod.time, "sleep", lambda s: None)
    proc = SignalledProc()
    assert steps_mod.Steps(str(tmp_path), "77", []).kill("gen-0", proc, "77.3") == (True, -9)
    assert calls == [["scancel", "--signal=KILL", "77.3"]]
    assert proc.signals == [sig.SIGINT] * sigints + [sig.SIGKILL]


def test_a_step_lookup_begun_before_a_restart_does_not_name_the_new_process_s_step(job_in_process, tmp_path):
    import threading
    release, asked = threading.Event(), threading.Event()

    class SlowSqueue(FakeSteps):
        listing: dict = {}

        def step_ids(self):
            if not self.listing:  # the start-up's lookup
                return {}
            asked.set()
            release.wait(10)
            return dict(self.listing)
    j = _serving(job_in_process(spec_of("membership.enabled=false"), steps=SlowSqueue()))
    SlowSqueue.listing = {"gen-0": "77.3", "gen-1": "77.4"}  # gen-0's old step, listed before its restart
    j.maybe_lookup_steps()
    assert asked.wait(10)
    j.launch(spec_of("membership.enabled=false").component("gen-0"), restart=True)  # gen-0 restarted meanwhile
    release.set()
    j.inbox.put(j.inbox.get(timeout=10))  # the lookup's answer is in
    j.drain_inbox(j.clock())
    assert j.step_of == {"gen-1": "77.4"}  # the old step is not taken for the new process's


def test_a_slurm_command_s_output_is_kept_only_up_to_its_bound(tmp_path):
    from orchestrator.steps import MAX_OUTPUT, run_bounded
    rc, out, err = run_bounded([sys.executable, "-c", "import sys; sys.stdout.write('x' * (3 << 20)); "
                                "sys.stderr.write('e' * (3 << 20))"], 30)
    assert rc == 0 and len(out) == MAX_OUTPUT == 1 << 20 and len(err) == MAX_OUTPUT


def _grandchild(tmp_path, script: str) -> list:
    """argv of a bash that leaves a `sleep 20` holding its output pipes; the sleep's pid goes to tmp_path/pid."""
    return ["bash", "-c", f"sleep 20 & echo $! > {tmp_path}/pid; {script}"]


def _end_grandchild(tmp_path):
    import os
    import signal as sig
    try:
        os.kill(int((tmp_path / "pid").read_text()), sig.SIGKILL)
    except (OSError, ValueError):
        pass


def test_a_command_that_exits_while_a_child_of_its_holds_the_pipe_is_not_waited_for(tmp_path, monkeypatch):
    import time
    from orchestrator import steps as steps_mod
    monkeypatch.setattr(steps_mod, "EXIT_LINGER_S", 0.2)  # the linger is a constant; its length is not the point
    t0 = time.monotonic()
    try:
        rc, out, _ = steps_mod.run_bounded(_grandchild(tmp_path, "echo done"), 10)
    finally:
        _end_grandchild(tmp_path)
    assert (rc, out) == (0, "done\n") and time.monotonic() - t0 < 5  # not the child's 20 s, nor the 10 s bound


def test_a_command_past_its_bound_is_ended_even_when_a_child_of_its_holds_the_pipe(tmp_path, monkeypatch):
    import time
    from orchestrator import steps as steps_mod
    monkeypatch.setattr(steps_mod, "TERM_GRACE_S", 0.2)
    t0 = time.monotonic()
    try:  # it ignores SIGTERM, and its child keeps the pipes open after SIGKILL
        rc, _, err = steps_mod.run_bounded(_grandchild(tmp_path, "trap '' TERM; while :; do sleep 0.1; done"), 0.4)
    finally:
        _end_grandchild(tmp_path)
    assert rc == 124 and "did not answer within 0.4s" in err and time.monotonic() - t0 < 8  # not the child's 20 s


def test_the_provenance_reader_reads_lines_of_bounded_length(tmp_path, monkeypatch):
    import base64

    class Output:  # a node that prints one endless line, then its fields
        def __init__(self):
            self.left = 64 << 20
            self.tail = [b"TKPROV n0 kernel " + base64.b64encode(b"6.1") + b"\n"]

        def readline(self, limit=-1):
            assert 0 < limit <= 1 << 20, "an unbounded read of a line"
            if self.left:
                n = min(limit, self.left)
                self.left -= n
                return b"x" * n if self.left else b"x" * (n - 1) + b"\n"
            return self.tail.pop(0) if self.tail else b""

        def __iter__(self):
            raise AssertionError("an unbounded read of a line")

    class Proc:
        stdout = Output()

        def wait(self, timeout=None):
            return 0

        def kill(self):
            pass
    monkeypatch.setattr(startup.subprocess, "Popen", lambda *a, **k: Proc())
    (tmp_path / "logs").mkdir()
    from orchestrator.background import Background
    failures = []
    startup.provenance(spec_of(), str(tmp_path), lambda proc: None, Background(failures.append)).join(30)
    assert failures == []
    assert json.loads((tmp_path / "provenance" / "n0.json").read_text())["kernel"] == "6.1"


def test_the_marker_directory_is_listed_afresh_before_its_absence_is_believed(tmp_path, monkeypatch):
    # NFS: a name the client has cached as absent can stay "absent" to stat for a while after another host made it
    from orchestrator.steps import Steps
    steps = Steps(str(tmp_path), "77", [])
    (tmp_path / "state" / "steps" / "gen-0.started").touch()
    monkeypatch.setattr("os.path.exists", lambda path: False)
    assert steps.step_created("gen-0") is True


# --- the job's files ---------------------------------------------------------------------------------------

def test_events_are_one_json_object_a_line_with_every_field(tmp_path):
    log = EventLog(str(tmp_path), clock=lambda: 1718000000.1234, out=open("/dev/null", "w"))
    log.write(Event(EventKind.EXITED, "gen-1", "backoff", "gen-1 exited\nwith code 137", 137, 0))
    (doc,) = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert doc == {"time": 1718000000.123, "event": "server-exited", "component": "gen-1", "state": "backoff",
                   "reason": "gen-1 exited\nwith code 137", "exit_code": 137, "restarts": 0}


def test_a_state_file_that_cannot_be_written_is_removed_not_left_stale(tmp_path, monkeypatch):
    files = StateFiles(str(tmp_path), "restart")
    assert files.write("gen-1", "gen", "healthy", 1.0, 0, 0, None, 11, None, None)
    path = tmp_path / "servers" / "gen-1.json"
    assert json.loads(path.read_text())["pid"] == 11
    real_open = open

    def full_disk(file, mode="r", *a, **kw):
        if str(file).endswith(".tmp") and "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(file, mode, *a, **kw)

    monkeypatch.setattr("builtins.open", full_disk)
    assert not files.write("gen-1", "gen", "backoff", 2.0, 1, 1, 137, 12, None, "exited")
    monkeypatch.undo()
    assert not path.exists() and not list((tmp_path / "servers").glob("*.tmp"))  # never shown as current


# --- membership repair after an etcd outage ---------------------------------------------------------------------

class FakeEtcd:
    """Keys with leases; a worker registers again (same key, new lease) once its key is gone and time passes."""

    def __init__(self, workers):
        self.keys = {f"/p/{w.split(':')[0]}-{w}-1-1-001": f"lease-{w}" for w in workers}
        self.deleted, self.kept_alive, self.now = [], [], 0.0
        self.min_per_role = {}

    def entries(self, uri, prefix):
        return dict(self.keys)

    def delete(self, uri, key):
        self.deleted.append(key)
        return self.keys.pop(key, None) is not None

    def keep_alive(self, uri, lease):
        self.kept_alive.append(lease)
        return True

    def sleep(self, s):
        self.now += s
        for key in self.deleted:  # every deleted key comes back at its worker's next retry
            self.keys.setdefault(key, "lease-new")


def test_repair_replaces_one_worker_per_role_at_a_time_and_keeps_the_others_alive(monkeypatch):
    roles = [["ctx:1", "ctx:2"], ["gen:3", "gen:4"]]
    etcd = FakeEtcd([w for r in roles for w in r])
    fewest = []  # after each deletion: the fewest registered workers of any role

    def delete(uri, key):
        gone = etcd.delete(uri, key)
        fewest.append(min(sum(1 for k in etcd.keys if f"-{role}:" in k) for role in ("ctx", "gen")))
        return gone
    monkeypatch.setattr(membership, "entries", etcd.entries)
    monkeypatch.setattr(membership, "delete", delete)
    monkeypatch.setattr(membership, "keep_alive", etcd.keep_alive)
    done = membership.repair("etcd://h:1", "/p", roles, clock=lambda: etcd.now, sleep=etcd.sleep)
    assert sorted(done["replaced"]) == ["ctx:1", "ctx:2", "gen:3", "gen:4"] and done["not_back"] == []
    assert [k.split("-")[1] for k in etcd.deleted] == ["ctx:1", "gen:3", "ctx:2", "gen:4"]  # one per role at a time
    assert min(fewest) >= 1  # no role was ever without a registered worker
    assert "lease-ctx:2" in etcd.kept_alive and "lease-gen:4" in etcd.kept_alive  # waiting ones kept alive


def test_a_worker_that_does_not_register_again_is_reported_and_the_repair_goes_on(monkeypatch):
    etcd = FakeEtcd(["ctx:1", "gen:3"])
    etcd.sleep = lambda s: setattr(etcd, "now", etcd.now + s)  # nobody registers again
    monkeypatch.setattr(membership, "entries", etcd.entries)
    monkeypatch.setattr(membership, "delete", etcd.delete)
    monkeypatch.setattr(membership, "keep_alive", etcd.keep_alive)
    done = membership.repair("etcd://h:1", "/p", [["ctx:1"], ["gen:3"]], wait_s=3, clock=lambda: etcd.now,
                             sleep=etcd.sleep)
    assert done == {"replaced": [], "not_back": ["ctx:1", "gen:3"]}


class Answer:
    """What urlopen returns: a status and a body (or a read that fails as a half-sent answer does)."""

    def __init__(self, body=b"{}", status=200, read_error=None):
        self.status, self.body, self.read_error = status, body, read_error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read(self, limit=-1):
        if self.read_error is not None:
            raise self.read_error
        return self.body


def _etcd_range(keys) -> bytes:
    import base64
    return json.dumps({"kvs": [{"key": base64.b64encode(k.encode()).decode(), "lease": "7"} for k in keys]}).encode()


def _raises(exc):
    def answer():
        raise exc
    return answer


ODD_ANSWERS = [  # (what urlopen does, whether no answer at all came back)
    pytest.param(lambda: Answer(read_error=http.client.IncompleteRead(b'{"kvs"')), True, id="incomplete-read"),
    pytest.param(_raises(http.client.LineTooLong("header line")), True, id="line-too-long"),
    pytest.param(_raises(http.client.BadStatusLine("HTTP/9")), True, id="bad-status-line"),
    pytest.param(_raises(http.client.RemoteDisconnected("closed")), True, id="remote-disconnected"),
    pytest.param(lambda: Answer(b'{"kvs": 5}'), True, id="kvs-not-a-list"),
    pytest.param(lambda: Answer(b'{"kvs": {"key": 1}}'), True, id="kvs-an-object"),
    pytest.param(lambda: Answer(b'{"kvs": [{"key": "%%%"}, 3, null]}'), False, id="kvs-entries-malformed"),
    pytest.param(lambda: Answer(b'{"deleted": [1]}'), False, id="deleted-not-a-number"),
    pytest.param(lambda: Answer(b'{"deleted": 1e400}'), False, id="deleted-infinite"),  # int(inf): OverflowError
]


@pytest.mark.parametrize("answer,cut", ODD_ANSWERS)
def test_an_odd_answer_from_the_storage_is_a_storage_error_and_never_another_exception(monkeypatch, answer, cut):
    # an etcd restarting, or something in front of it, can cut an answer short or send anything: every caller
    # handles StorageError, and nothing else may escape
    monkeypatch.setattr(membership.urllib.request, "urlopen", lambda req, timeout, context: answer())
    for call in (lambda: membership.missing("etcd://h:1", "/p", ["h:2"]),
                 lambda: membership.deregister("etcd://h:1", "/p", "h:2"),
                 lambda: membership.delete("etcd://h:1", "/p/k"),
                 lambda: membership.keep_alive("etcd://h:1", "7"),
                 lambda: membership.repair("etcd://h:1", "/p", [["h:2"]], sleep=lambda s: None)):
        try:
            call()
        except membership.StorageError:
            pass
    if cut:
        with pytest.raises(membership.StorageError, match="etcd|h:1"):
            membership.missing("etcd://h:1", "/p", ["h:2"])
    else:  # an entry it cannot read is no registration
        assert membership.missing("etcd://h:1", "/p", ["h:2"]) == ["h:2"]


def test_the_start_up_waits_through_an_odd_storage_answer_for_every_worker_to_register(job_in_process, tmp_path,
                                                                                     monkeypatch):
    from toolkit.runtime.tls import write_run_certificates
    write_run_certificates(tmp_path / "secrets" / "etcd")
    spec = spec_of("membership.enabled=true")
    j = job_in_process(spec)
    monkeypatch.setattr(membership, "missing", REAL_MISSING)
    answers = []

    def urlopen(req, timeout, context):
        answers.append(req.full_url)
        if len(answers) == 1:  # etcd restarting: its first answer is cut short
            return Answer(read_error=http.client.IncompleteRead(b""))
        workers = [j.nodes.resolve(a) for a in spec.membership.workers.values()]
        return Answer(_etcd_range(f"{spec.membership.worker_key_prefix.rstrip('/')}/x-{w}-1-1-a" for w in workers))
    monkeypatch.setattr(membership.urllib.request, "urlopen", urlopen)
    j.start_up()
    assert [e["event"] for e in _events(tmp_path)][-1] == "ready" and len(answers) == 2


def test_a_repair_that_fails_in_any_way_is_said_and_the_next_one_runs(job_in_process, tmp_path, monkeypatch):
    from toolkit.runtime.tls import write_run_certificates
    write_run_certificates(tmp_path / "secrets" / "etcd")
    j = _serving(job_in_process(spec_of("membership.enabled=true")))

    def repair(*a, **k):
        raise KeyError("kvs")  # anything at all: the repair thread must still report back
    monkeypatch.setattr(membership, "repair", repair)
    j.repair_in_background()
    assert j.repairing
    item = j.inbox.get(timeout=10)
    j.inbox.put(item)
    j.drain_inbox(j.clock())
    assert not j.repairing  # the next time etcd comes back, membership is repaired again
    (ev,) = [e for e in _events(tmp_path) if e["event"] == "membership-repaired"]
    assert "could not be repaired" in ev["reason"] and "kvs" in ev["reason"]


def test_prefix_end_covers_every_key_under_the_prefix():
    import base64
    assert base64.b64decode(membership.prefix_end("/trtllm-disagg/c/workers/")) == b"/trtllm-disagg/c/workers0"
    assert base64.b64decode(membership.prefix_end("/a\u00ff")) == "/a\u00ff".encode()[:-1] + b"\xc0"
    assert base64.b64decode(membership.prefix_end("")) == b"\0"  # everything


# --- job.pyz -------------------------------------------------------------------------------------------------

def test_the_package_s_docstring_names_every_module_it_ships():
    import pkgutil
    import re

    import orchestrator
    listed = re.findall(r"^    ([a-z_]+) {2,}\S", orchestrator.__doc__ or "", re.MULTILINE)
    shipped = [m.name for m in pkgutil.iter_modules(orchestrator.__path__) if m.name != "__main__"]
    assert sorted(listed) == sorted(shipped)


def test_the_rendered_job_pyz_runs_with_python3_and_reads_its_job_json(tmp_path):
    out, _ = render(load_plan(STANDIN), tmp_path / "out")
    usage = subprocess.run([sys.executable, str(out / "job.pyz")], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "job.json" in usage.stderr
    (tmp_path / "bad.json").write_text('{"schema": 1}')
    bad = subprocess.run([sys.executable, str(out / "job.pyz"), str(tmp_path / "bad.json")], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "supervision: missing" in bad.stderr


# --- probes ---------------------------------------------------------------------------------------------------

def test_a_probe_round_takes_about_one_probe_timeout_whatever_the_number_of_components():
    import time

    from orchestrator.probe import Prober

    def get(url, timeout_s):  # 15 slow answers and one that never comes within the bound
        time.sleep(timeout_s * (10 if url.endswith("hung") else 0.5))
        return 200

    prober = Prober(timeout_s=0.2, get=get)
    urls = {f"s{i}": f"http://x/{i}" for i in range(15)} | {"h": "http://x/hung"}
    t0 = time.monotonic()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("orchestrator.probe.ROUND_SLACK_S", 0.2)
        answers = prober.round(urls)
    took = time.monotonic() - t0
    prober.close()
    assert took < 0.2 + 0.2 + 0.3, took  # one timeout plus the round's slack, not 16 of them (3.5 s one by one)
    assert answers["h"] is None and all(answers[f"s{i}"] == 200 for i in range(15))


# --- registration watched as health is ---------------------------------------------------------------------------

def _registration_round(j):
    j.registration_at = float("-inf")
    j.maybe_check_registrations()
    answer = j.inbox.get(timeout=10)
    j.inbox.put(answer)
    j.execute(j.drain_inbox(j.clock()))
    return answer


def test_a_serving_worker_whose_key_is_gone_is_unregistered_then_restarted(job_in_process, tmp_path, monkeypatch):
    from toolkit.runtime.tls import write_run_certificates
    write_run_certificates(tmp_path / "secrets" / "etcd")
    spec = spec_of("membership.enabled=true")
    j = _serving(job_in_process(spec))
    gen0 = j.nodes.resolve(spec.membership.workers["gen-0"])
    asked = []

    def missing(uri, prefix, workers):
        asked.append(sorted(workers))
        return [gen0]
    monkeypatch.setattr(membership, "missing", missing)
    answer = _registration_round(j)
    assert answer.missing == ["gen-0"] and set(answer.asked) == {"ctx-0", "ctx-1", "gen-0", "gen-1"}
    assert j.supervisor.components["gen-0"].state.value == "unregistered"
    (ev,) = [e for e in _events(tmp_path) if e["event"] == "unregistered"]
    assert ev["component"] == "gen-0" and "the proxy does not route to it" in ev["reason"]
    j.clock = lambda: 10 ** 6  # its grace passed, still without a key: killed (and restarted by the policy)
    _registration_round(j)
    assert j.supervisor.components["gen-0"].state.value in ("killing", "backoff")
    assert any(e["event"] == "killed" and e["component"] == "gen-0" for e in _events(tmp_path))


def test_a_registration_lookup_from_before_a_repair_is_not_believed(job_in_process, tmp_path, monkeypatch):
    from toolkit.runtime.tls import write_run_certificates
    write_run_certificates(tmp_path / "secrets" / "etcd")
    spec = spec_of("membership.enabled=true")
    j = _serving(job_in_process(spec))
    monkeypatch.setattr(membership, "missing", lambda uri, prefix, workers: list(workers))  # a repair deletes keys
    j.registration_at = float("-inf")
    j.maybe_check_registrations()
    answer = j.inbox.get(timeout=10)
    j.repair_epoch += 1  # a repair began meanwhile
    j.inbox.put(answer)
    j.drain_inbox(j.clock())
    assert all(t.state.value == "healthy" for t in j.supervisor.components.values())
    j.repairing = True
    j.maybe_check_registrations()
    assert not j.registration_busy  # none is asked while a repair runs


def test_registrations_are_not_looked_at_while_the_storage_itself_is_down(job_in_process, tmp_path, monkeypatch):
    from toolkit.runtime.tls import write_run_certificates
    write_run_certificates(tmp_path / "secrets" / "etcd")
    j = _serving(job_in_process(spec_of("membership.enabled=true")))
    j.supervisor.probed("etcd", False, j.clock())
    j.registration_at = float("-inf")
    j.maybe_check_registrations()
    assert not j.registration_busy and j.inbox.empty()


# --- signals: every one whose default ends the process ---------------------------------------------------------

# signal(7), Linux: the default action of these is Term or Core (the real-time signals' too); the rest stop,
# continue or are ignored.
DEFAULT_ENDS = ("SIGABRT", "SIGALRM", "SIGBUS", "SIGFPE", "SIGHUP", "SIGILL", "SIGINT", "SIGIO", "SIGKILL", "SIGPIPE",
                "SIGPROF", "SIGPWR", "SIGQUIT", "SIGSEGV", "SIGSTKFLT", "SIGSYS", "SIGTERM", "SIGTRAP", "SIGUSR1",
                "SIGUSR2", "SIGVTALRM", "SIGXCPU", "SIGXFSZ")


@pytest.fixture
def signal_handlers():
    """The test process's own handlers, put back afterwards."""
    import signal
    saved = {s: signal.getsignal(s) for s in job_mod.ENDING_SIGNALS}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_every_signal_whose_default_ends_the_job_is_handled_or_left_as_documented(job_in_process, signal_handlers):
    import signal
    default_ends = {int(getattr(signal, n)) for n in DEFAULT_ENDS if hasattr(signal, n)} | job_mod.REALTIME_SIGNALS
    kept, uncatchable = job_mod.KEPT_SIGNALS, job_mod.UNCATCHABLE_SIGNALS
    assert default_ends == job_mod.ENDING_SIGNALS | kept | (uncatchable & default_ends)
    assert {job_mod.signal_name(s) for s in kept} == {"SIGUSR2", "SIGPIPE", "SIGXFSZ"}
    assert len(job_mod.REALTIME_SIGNALS) >= 30  # SIGRTMIN..SIGRTMAX
    j = job_in_process(spec_of("membership.enabled=false"))
    j.install_signals()
    assert all(signal.getsignal(s) == j._on_signal for s in job_mod.ENDING_SIGNALS)


@pytest.mark.parametrize("name", ["SIGUSR1", "SIGQUIT", "SIGALRM", "SIGRTMIN+3"])
def test_a_signal_the_job_did_not_handle_before_now_ends_it_with_teardown_and_an_event(job_in_process, tmp_path,
                                                                                      signal_handlers, name):
    """Hostile round 4: SIGUSR1 (Slurm's --signal=B:USR1@T) killed the orchestrator without teardown or a word, and
    the servers went on serving unsupervised."""
    import signal
    signum = min(job_mod.REALTIME_SIGNALS) + 3 if name == "SIGRTMIN+3" else int(getattr(signal, name))
    j = job_in_process(spec_of("membership.enabled=false"))
    j.install_signals()
    j.start_up()
    signal.raise_signal(signum)
    assert j.run() == 128 + signum
    events = _events(tmp_path)
    failed = [e for e in events if e["event"] == "failed"]
    assert failed and failed[-1]["reason"] == f"signal received ({name})"
    assert events[-1]["event"] == "stopping" and j.steps.cancelled >= 1  # teardown ran: the job is cancelled


def test_the_signal_slurm_sends_before_the_time_limit_is_named_as_such(job_in_process, tmp_path, signal_handlers):
    import dataclasses
    import signal
    spec = dataclasses.replace(spec_of("membership.enabled=false"), time_limit_signal="SIGUSR1")
    j = job_in_process(spec)
    j.install_signals()
    signal.raise_signal(signal.SIGUSR1)
    assert j.run() == 128 + signal.SIGUSR1
    (failed,) = [e for e in _events(tmp_path) if e["event"] == "failed"]
    assert "--signal=B:USR1@T of cluster.sbatch_args" in failed["reason"] and "time limit" in failed["reason"]


def test_sbatch_args_that_signal_the_batch_shell_render_into_job_json_and_one_without_b_is_warned():
    from toolkit.plan.derive import SlurmSignal, slurm_signals
    assert spec_of("cluster.sbatch_args=[\"--signal=B:USR1@300\"]").time_limit_signal == "SIGUSR1"
    assert spec_of().time_limit_signal is None
    assert slurm_signals(["--signal=10@5", "--sig=B:TERM", "--signal", "RB:RTMIN@9"])[:2] == (
        SlurmSignal("--signal=10@5", False, "SIGUSR1", 5), SlurmSignal("--sig=B:TERM", True, "SIGTERM", 60))
    plan = load_plan(STANDIN, ["cluster.sbatch_args=[\"--signal=USR1@300\"]"])
    (warning,) = [w for w in plan.warnings if "--signal" in w]
    assert "sends SIGUSR1 to every job step, the servers" in warning and "--signal=B:USR1@300" in warning
    plan = load_plan(STANDIN, ["cluster.sbatch_args=[\"--signal=B:USR2@60\"]"])
    assert any("does not end on SIGUSR2" in w for w in plan.warnings)
