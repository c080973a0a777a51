"""Spec: the launch state machine (toolkit.launch), whichever backend runs the job.

A fake backend stands in for Slurm or the local job: the tests write the job's own state files
(state/events.jsonl, nodes.tsv) as the job's orchestrator would, and answer /health and the smoke request through
a fake HTTP layer. No process, no port, no sleep."""

from __future__ import annotations

import pytest

import toolkit.launch as launch_mod
from toolkit.launch import LaunchFailed, launch, refresh, stop
from toolkit.runtime.slurm import JobState
from tests.unit.helpers import plan_of

STANDIN = """\
schema_version: 1
name: sm
model: tk/standin-tiny
engine: standin
cluster:
  gpus_per_node: 1
kv_transfer:
  transport: tcp
"""


class FakeBackend:
    """A job whose life the test scripts: a list of JobStates, the last one repeating."""

    name = "fake"
    log_name = "job"

    def __init__(self, states, on_submit=None):
        self.states = list(states)
        self.on_submit = on_submit
        self.stopped = 0
        self.run = None

    def preflight(self, plan):
        pass

    def submit(self, run):
        self.run = run
        run.job_id = "77"
        run.set_state("submitted", "job 77")
        if self.on_submit:
            self.on_submit(run)

    def job_state(self, run):
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def stop(self, run):
        self.stopped += 1
        return []


class FakeHttp:
    """/health answers per port; the smoke request answers a body."""

    def __init__(self, healthy_ports=(), completion_tokens=4):
        self.healthy_ports = set(healthy_ports)
        self.completion_tokens = completion_tokens

    def get(self, url, timeout):
        port = int(url.split(":")[2].split("/")[0])
        return _Resp(200 if port in self.healthy_ports else 503, {})

    def post(self, url, json, timeout):
        text = "abc" if self.completion_tokens else ""
        return _Resp(200, {"choices": [{"text": text}], "usage": {"completion_tokens": self.completion_tokens}})


class _Resp:
    def __init__(self, status, body):
        self.status_code, self._body, self.text = status, body, str(body)

    def json(self):
        return self._body


def write_job_files(run, started=(), failed=None, ready=None):
    """What the job writes: node addresses, then an event per step; "ready" once its start-up is over (by default
    when it started something and nothing failed). `failed` is the failure's reason; the job names the component
    it is about (here: the reason's first word, where that is a server of the run)."""
    import json
    (run.path / "nodes.tsv").write_text("".join(f"{i}\tn{i}\t127.0.0.1\n" for i in range(run.nodes)))

    def event(t, kind, component=None, reason=""):
        return json.dumps({"time": t, "event": kind, "component": component, "state": None, "reason": reason,
                           "exit_code": None, "restarts": None}) + "\n"
    lines = [event(1, "started", name, f"{name} on n0") for name in started]
    if failed:
        first = failed.split(" ", 1)[0]
        lines.append(event(2, "failed", first if first in {s.name for s in run.servers} else None, failed))
    if ready if ready is not None else (started and not failed):
        lines.append(event(3, "ready", None, "http://127.0.0.1"))
    (run.path / "state" / "events.jsonl").write_text("".join(lines))


@pytest.fixture
def plan():
    return plan_of(STANDIN)


@pytest.fixture
def fake(monkeypatch):
    def install(backend, http):
        monkeypatch.setattr(launch_mod, "backend_for", lambda name: backend)
        monkeypatch.setattr(launch_mod.requests, "get", http.get)
        monkeypatch.setattr(launch_mod.requests, "post", http.post)
        monkeypatch.setattr(launch_mod.time, "sleep", lambda s: None)
        return backend
    return install


def all_names(plan):
    return [s.name for s in plan.servers] + ["proxy"]


def all_ports(plan):
    return [s.port for s in plan.servers] + [plan.proxy.port]


def test_a_job_whose_servers_and_proxy_answer_and_whose_smoke_request_returns_tokens_is_ready(plan, fake, tmp_path):
    backend = fake(FakeBackend([JobState("PENDING", "Priority"), JobState("RUNNING")],
                               on_submit=lambda run: write_job_files(run, all_names(plan))),
                   FakeHttp(all_ports(plan)))
    run = launch(plan, "fake", str(tmp_path / "run"))
    assert run.state == "ready" and run.reason is None
    assert run.endpoint == f"http://127.0.0.1:{plan.proxy.port}"
    assert [h[1] for h in run.history] == ["rendered", "submitted", "pending", "starting", "ready"]
    assert backend.stopped == 0


def test_health_is_trusted_only_from_servers_the_job_has_started(plan, fake, tmp_path):
    # Something answers on every port, but the job has not started any server yet: not ready, and the
    # startup bound ends the run.
    backend = fake(FakeBackend([JobState("RUNNING")], on_submit=lambda run: write_job_files(run, ())),
                   FakeHttp(all_ports(plan)))
    with pytest.raises(LaunchFailed, match="not healthy after"):
        launch(plan, "fake", str(tmp_path / "run"), startup_timeout_s=0.05)
    assert backend.stopped == 1


def test_a_job_pending_past_its_bound_is_cancelled_and_fails_with_the_schedulers_reason(plan, fake, tmp_path):
    backend = fake(FakeBackend([JobState("PENDING", "Resources")]), FakeHttp())
    with pytest.raises(LaunchFailed, match=r"still pending after .*\(Resources\).*pending_timeout_s"):
        launch(plan, "fake", str(tmp_path / "run"), pending_timeout_s=0.01)
    assert backend.stopped == 1
    assert backend.run.state == "failed"


def test_a_server_the_job_reports_failed_fails_the_run_with_its_log_tail(plan, fake, tmp_path):
    def job(run):
        write_job_files(run, ["ctx-0"], failed="ctx-0 exited with code 3 (log: logs/ctx-0.log)")
        run.log_path("ctx-0").write_text("line 1\nCUDA out of memory\n")

    backend = fake(FakeBackend([JobState("RUNNING")], on_submit=job), FakeHttp())
    with pytest.raises(LaunchFailed) as info:
        launch(plan, "fake", str(tmp_path / "run"))
    assert info.value.component == "ctx-0"
    assert "CUDA out of memory" in str(info.value)
    assert backend.run.server("ctx-0").state == "failed"
    assert all(s.state == "stopped" for s in backend.run.servers if s.name != "ctx-0")
    assert backend.stopped == 1


def test_a_job_that_ends_before_serving_fails_with_the_jobs_own_log(plan, fake, tmp_path):
    def job(run):
        run.log_path("job").write_text("sbatch: error: something\n")

    fake(FakeBackend([JobState("ENDED", "FAILED")], on_submit=job), FakeHttp())
    with pytest.raises(LaunchFailed, match=r"ended before serving \(FAILED\)") as info:
        launch(plan, "fake", str(tmp_path / "run"))
    assert info.value.component == "job" and "something" in info.value.tail


def test_a_smoke_request_with_zero_tokens_is_a_failed_launch_not_a_ready_one(plan, fake, tmp_path):
    backend = fake(FakeBackend([JobState("RUNNING")], on_submit=lambda run: write_job_files(run, all_names(plan))),
                   FakeHttp(all_ports(plan), completion_tokens=0))
    with pytest.raises(LaunchFailed, match="no tokens"):
        launch(plan, "fake", str(tmp_path / "run"))
    assert backend.stopped == 1 and backend.run.state == "failed"


def test_ctrl_c_while_waiting_releases_the_job(plan, fake, tmp_path, monkeypatch):
    backend = fake(FakeBackend([JobState("PENDING", "Priority")]), FakeHttp())

    def interrupt(_):
        raise KeyboardInterrupt

    monkeypatch.setattr(launch_mod.time, "sleep", interrupt)
    with pytest.raises(LaunchFailed, match="interrupted"):
        launch(plan, "fake", str(tmp_path / "run"))
    assert backend.stopped == 1


def test_refresh_marks_a_ready_run_degraded_when_a_server_stops_answering(plan, fake, tmp_path):
    http = FakeHttp(all_ports(plan))
    fake(FakeBackend([JobState("RUNNING")], on_submit=lambda run: write_job_files(run, all_names(plan))), http)
    run = launch(plan, "fake", str(tmp_path / "run"))
    http.healthy_ports.discard(plan.generation.instances[0].port)
    run = refresh(run)
    assert run.state == "degraded" and "gen-0" in run.reason
    assert run.server("gen-0").state == "unhealthy"



def test_a_long_runs_stable_servers_stay_probed_after_their_start_left_the_events_tail(plan, fake, tmp_path):
    # weeks of a flapping gen-1: the events' bounded tail no longer holds the others' `started` nor `ready`, but the
    # job's state files and endpoint still say what it started and that it served
    import json
    http = FakeHttp(all_ports(plan))
    fake(FakeBackend([JobState("RUNNING")], on_submit=lambda run: write_job_files(run, all_names(plan))), http)
    run = launch(plan, "fake", str(tmp_path / "run"))
    assert run.state == "ready"
    states = run.path / "state" / "servers"
    states.mkdir(parents=True, exist_ok=True)
    for name in all_names(plan):
        (states / f"{name}.json").write_text(json.dumps(
            {"name": name, "role": name.split("-")[0], "state": "healthy", "since": 1.0, "restarts": 0, "failures": 0,
             "last_exit": None, "pid": None, "step": None, "reason": None, "policy": "restart"}))
    (run.path / "endpoint").write_text(f"http://127.0.0.1:{plan.proxy.port}\n")
    flap = json.dumps({"time": 9.0, "event": "restarted", "component": "gen-1", "state": "starting",
                       "reason": "gen-1 restarted " + "x" * 200, "exit_code": None, "restarts": 1}) + "\n"
    (run.path / "state" / "events.jsonl").write_text(flap * (2 * (1 << 20) // len(flap)))
    http.healthy_ports.discard(plan.context.instances[0].port)
    run = refresh(run)
    assert run.state == "degraded" and run.server("ctx-0").state == "unhealthy"  # still probed: its failure is seen
    assert run.server("gen-0").state == "healthy"

@pytest.mark.parametrize("left_at", ["submitted", "pending", "starting"])
def test_a_run_whose_launcher_was_killed_takes_its_state_from_the_jobs_events(plan, fake, tmp_path, left_at):
    # `kill -9` of tk launch once the job runs; the job goes on and says ready. tk status
    # must not keep the launcher's last state for ever.
    from toolkit.launch import prepare
    fake(FakeBackend([JobState("RUNNING")]), FakeHttp(all_ports(plan)))
    run = prepare(plan, "fake", str(tmp_path / "run"))
    run.job_id = "77"
    run.set_state(left_at, None)  # where the killed launcher left the record
    write_job_files(run, all_names(plan))  # the job, unaware, got to ready
    (run.path / "endpoint").write_text(f"http://127.0.0.1:{plan.proxy.port}\n")
    run = refresh(run)
    assert run.state == "ready" and run.reason is None
    assert run.endpoint == f"http://127.0.0.1:{plan.proxy.port}"
    assert {s.state for s in run.servers} == {"healthy"}


def test_a_running_job_that_has_not_said_ready_is_starting_not_pending(plan, fake, tmp_path):
    from toolkit.launch import prepare
    fake(FakeBackend([JobState("RUNNING")]), FakeHttp(all_ports(plan)))
    run = prepare(plan, "fake", str(tmp_path / "run"))
    run.set_state("pending", "Priority")
    write_job_files(run, ["ctx-0"], ready=False)
    assert refresh(run).state == "starting"


def test_refresh_of_a_job_that_ended_by_itself_says_failed_and_stops_every_server(plan, fake, tmp_path):
    backend = fake(FakeBackend([JobState("RUNNING")], on_submit=lambda run: write_job_files(run, all_names(plan))),
                   FakeHttp(all_ports(plan)))
    run = launch(plan, "fake", str(tmp_path / "run"))
    backend.states = [JobState("ENDED", "TIMEOUT")]
    run = refresh(run)
    assert run.state == "failed" and "TIMEOUT" in run.reason
    assert {s.state for s in run.servers} == {"stopped"}


def test_stop_ends_the_job_and_a_later_refresh_keeps_it_stopped(plan, fake, tmp_path):
    backend = fake(FakeBackend([JobState("RUNNING")], on_submit=lambda run: write_job_files(run, all_names(plan))),
                   FakeHttp(all_ports(plan)))
    run = launch(plan, "fake", str(tmp_path / "run"))
    assert stop(run) == []
    assert backend.stopped == 1 and run.state == "stopped"
    backend.states = [JobState("ENDED", "CANCELLED")]
    assert refresh(run).state == "stopped"


def test_a_full_disk_after_submission_still_releases_the_job_it_submitted(plan, fake, tmp_path, monkeypatch):
    # sbatch succeeded, then run.json cannot be written (ENOSPC): the job id is in hand, so it is cancelled.
    import errno

    from toolkit.launch.run import RunRecord

    backend = fake(FakeBackend([JobState("RUNNING")]), FakeHttp())
    real_save = RunRecord.save

    def save(self):
        if self.job_id:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(self)

    monkeypatch.setattr(RunRecord, "save", save)
    with pytest.raises(LaunchFailed, match="No space left on device"):
        launch(plan, "fake", str(tmp_path / "run"))
    assert backend.stopped == 1 and backend.run.job_id == "77"


def test_sigterm_while_waiting_releases_the_job_like_ctrl_c(plan, fake, tmp_path, monkeypatch):
    import signal

    backend = fake(FakeBackend([JobState("PENDING", "Priority")]), FakeHttp())
    monkeypatch.setattr(launch_mod.time, "sleep", lambda s: signal.raise_signal(signal.SIGTERM))
    with pytest.raises(LaunchFailed, match="interrupted by SIGTERM") as info:
        launch(plan, "fake", str(tmp_path / "run"))
    assert info.value.exit_code == 128 + signal.SIGTERM
    assert backend.stopped == 1
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers are put back


def test_a_slurm_controller_that_stops_answering_is_not_a_job_that_ended(plan, fake, tmp_path, monkeypatch):
    from toolkit.runtime.slurm import SlurmError

    class Unreachable(FakeBackend):
        def job_state(self, run):
            raise SlurmError("`squeue` did not answer within 30s: is slurmctld reachable?")

    backend = fake(Unreachable([JobState("RUNNING")]), FakeHttp())
    monkeypatch.setattr(launch_mod, "CONTROLLER_GRACE_S", -1)
    with pytest.raises(LaunchFailed, match="controller has not answered.*slurmctld reachable") as info:
        launch(plan, "fake", str(tmp_path / "run"))
    assert "ended" not in str(info.value)
    assert backend.stopped == 1


@pytest.mark.parametrize("option", ["pending_timeout_s", "startup_timeout_s"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0.0, 10**400], ids=lambda v: repr(v)[:12])
def test_waits_are_finite_and_positive(plan, fake, tmp_path, option, value):
    from toolkit.runtime.bounds import BoundError

    backend = fake(FakeBackend([JobState("RUNNING")]), FakeHttp())
    with pytest.raises(BoundError, match="timeout"):
        launch(plan, "fake", str(tmp_path / "run"), **{option: value})
    assert backend.run is None and not (tmp_path / "run").exists()  # refused before anything was made


def test_a_launch_rides_out_a_controller_that_misses_a_few_answers(plan, fake, tmp_path):
    from toolkit.runtime.slurm import SlurmError

    class Flaky(FakeBackend):
        misses = 2

        def job_state(self, run):
            if self.misses:
                self.misses -= 1
                raise SlurmError("`squeue` did not answer within 30s: is slurmctld reachable?")
            return super().job_state(run)

    backend = fake(Flaky([JobState("RUNNING")], on_submit=lambda run: write_job_files(run, all_names(plan))),
                   FakeHttp(all_ports(plan)))
    run = launch(plan, "fake", str(tmp_path / "run"))
    assert run.state == "ready" and backend.misses == 0 and backend.stopped == 0


def test_a_proxy_that_answers_before_the_job_says_ready_is_not_a_ready_run(plan, fake, tmp_path):
    # With membership the proxy answers /health once its minimum has registered, while the job still waits for
    # every worker to register; until the job says "ready" its start-up rules apply (any exit fails it), so
    # tk launch must not report the run ready before that.
    backend = fake(FakeBackend([JobState("RUNNING")],
                               on_submit=lambda run: write_job_files(run, all_names(plan), ready=False)),
                   FakeHttp(all_ports(plan)))
    with pytest.raises(LaunchFailed) as exc:
        launch(plan, "fake", str(tmp_path / "run"), startup_timeout_s=0.05)
    assert "did not report ready" in str(exc.value) and "started proxy" in str(exc.value)
    assert backend.stopped == 1


def _state_file(run, name, state, reason):
    import json
    states = run.path / "state" / "servers"
    states.mkdir(parents=True, exist_ok=True)
    (states / f"{name}.json").write_text(json.dumps(
        {"name": name, "role": name.split("-")[0], "state": state, "since": 1.0, "restarts": 0, "failures": 0,
         "last_exit": None, "pid": None, "step": None, "reason": reason, "policy": "restart"}))


def test_a_worker_the_job_sees_out_of_the_cluster_storage_is_not_shown_healthy_for_answering_health(plan, fake,
                                                                                                   tmp_path):
    http = FakeHttp(all_ports(plan))
    fake(FakeBackend([JobState("RUNNING")], on_submit=lambda run: write_job_files(run, all_names(plan))), http)
    run = launch(plan, "fake", str(tmp_path / "run"))
    _state_file(run, "gen-0", "unregistered", "answers /health but has no key in the cluster storage: the proxy does "
                                              "not route to it")
    run = refresh(run)  # gen-0 still answers /health
    assert run.server("gen-0").state == "unregistered" and run.state == "degraded"
    assert "gen-0 unregistered (answers /health but has no key" in run.reason


def test_a_run_whose_orchestrator_is_gone_is_degraded_and_says_nothing_supervises_it(plan, fake, tmp_path):
    """The orchestrator's own life: a local job whose batch script was killed (SIGKILL: nothing can catch it) leaves
    its servers serving, unsupervised; tk status must not say ready."""
    http = FakeHttp(all_ports(plan))
    backend = fake(FakeBackend([JobState("RUNNING")], on_submit=lambda run: write_job_files(run, all_names(plan))),
                   http)
    run = launch(plan, "fake", str(tmp_path / "run"))
    backend.states = [JobState("RUNNING", "its batch script is gone; 5 of its processes still run", unsupervised=True)]
    run = refresh(run)
    assert run.state == "degraded" and {s.state for s in run.servers} == {"healthy"}
    assert run.reason.startswith("the job's orchestrator is gone (its batch script is gone; 5 of its processes still "
                                 "run): nothing supervises the servers")
    from toolkit.doctor import diagnose
    doc = diagnose(run.path, state=run.state, reason=run.reason)
    assert doc["findings"][0]["id"] == "orchestrator-gone"
