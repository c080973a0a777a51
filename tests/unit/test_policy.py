"""Spec: the job's supervision policy (orchestrator.policy), branch by branch, with a fake clock.

Pure: nothing is spawned, probed or slept; each spec feeds observations with the time and reads the actions and
the component's state. The same policy runs in the job (orchestrator.job) on both backends."""

from __future__ import annotations

import pytest

from orchestrator.policy import (NOT_CREATED_MAX, UNCONFIRMED_MAX, Deregister, Fail, Kill, ProgressWatch, Record,
                                 RepairMembership, Start, Supervisor, backoff_s, exit_text)
from orchestrator.spec import Supervision
from orchestrator.states import ComponentState as C
from orchestrator.states import EventKind as E
from orchestrator.states import RunState

ROLES = {"ctx-0": "ctx", "gen-0": "gen", "gen-1": "gen", "proxy": "proxy", "etcd": "etcd"}


def policy(**kw) -> Supervision:
    base = dict(policy="restart", max_restarts=3, backoff_initial_s=2, backoff_max_s=10, unhealthy_after_s=20,
                stable_after_s=300, health_interval_s=2, stall_after_s=30, startup_timeout_s=60,
                minimum={"ctx": 1, "gen": 1, "proxy": 1, "etcd": 1})
    base.update(kw)
    return Supervision(**base)


def serving(**kw) -> Supervisor:
    sv = Supervisor(policy(**kw), dict(ROLES), storage_component="etcd")
    sv.begin(0.0)
    sv.take_dirty()
    return sv


def kinds(actions) -> list:
    return [a.event.kind if isinstance(a, Record) else type(a).__name__ for a in actions]


def events(actions, kind) -> list:
    return [a.event for a in actions if isinstance(a, Record) and a.event.kind == kind]


def test_an_exit_is_restarted_after_the_backoff_and_counted():
    sv = serving()
    actions = sv.exited("gen-0", -9, 100.0)
    t = sv.components["gen-0"]
    assert t.state == C.BACKOFF and t.failures == 1 and t.last_exit == 137
    assert Deregister("gen-0") in actions  # its registration goes at once
    (ev,) = events(actions, E.EXITED)
    assert ev.component == "gen-0" and ev.exit_code == 137 and "restart 1 of 3 in 2s" in ev.reason
    assert sv.tick(101.9) == []  # not before the backoff is over
    actions = sv.tick(102.0)
    assert Start("gen-0") in actions and t.state == C.STARTING and t.restarts == 1
    (ev,) = events(sv.probed("gen-0", True, 104.0), E.RESTARTED)
    assert t.state == C.HEALTHY and "restart 1 of this run" in ev.reason and ev.restarts == 1


def test_the_backoff_doubles_per_consecutive_failure_and_stops_at_its_cap():
    assert [backoff_s(2, 10, n) for n in range(5)] == [2, 4, 8, 10, 10]
    assert backoff_s(0, 10, 3) == 0
    sv = serving(max_restarts=10)
    waits = []
    now = 0.0
    for _ in range(5):
        (ev,) = events(sv.exited("gen-0", 1, now), E.EXITED)
        waits.append(sv.components["gen-0"].next_start - now)
        now = sv.components["gen-0"].next_start
        sv.tick(now)
    assert waits == [2, 4, 8, 10, 10]


def test_healthy_for_stable_after_s_resets_the_consecutive_failures():
    sv = serving(stable_after_s=300)
    sv.exited("gen-0", 1, 0.0)
    sv.tick(2.0)
    sv.probed("gen-0", True, 5.0)  # healthy again at t=5
    t = sv.components["gen-0"]
    assert t.failures == 1
    assert sv.probed("gen-0", True, 304.0) == [] and t.failures == 1  # 299 s: not yet
    (ev,) = events(sv.probed("gen-0", True, 305.0), E.STABLE)
    assert t.failures == 0 and ev.component == "gen-0"
    assert "restart 1 of 3" in events(sv.exited("gen-0", 1, 400.0), E.EXITED)[0].reason  # a fresh budget


def test_restarts_exhausted_give_the_component_up_and_the_role_keeps_serving_above_its_minimum():
    sv = serving(max_restarts=1)
    sv.exited("gen-0", -9, 0.0)
    sv.tick(2.0)
    sv.probed("gen-0", True, 3.0)
    actions = sv.exited("gen-0", -9, 10.0)  # no restart left
    assert sv.components["gen-0"].state == C.LOST
    assert events(actions, E.LOST) and not any(isinstance(a, Fail) for a in actions)  # gen-1 still serves
    assert kinds(sv.overall(10.0)) == [E.DEGRADED] and sv.run_state == RunState.DEGRADED


def test_a_role_below_its_minimum_fails_the_run_naming_the_component():
    sv = serving(max_restarts=0)
    sv.exited("gen-0", -9, 0.0)
    actions = sv.exited("gen-1", -9, 1.0)
    (fail,) = [a for a in actions if isinstance(a, Fail)]
    assert fail.component == "gen-1" and "below the minimum of 1" in fail.reason and fail.reason.startswith("gen-1")


def test_liveness_failing_for_unhealthy_after_s_kills_then_restarts():
    sv = serving(unhealthy_after_s=20)
    (ev,) = events(sv.probed("gen-0", False, 10.0), E.UNHEALTHY)
    assert sv.components["gen-0"].state == C.UNHEALTHY
    assert sv.probed("gen-0", False, 29.0) == []
    actions = sv.probed("gen-0", False, 30.0)
    assert Kill("gen-0", "/health failed for 20s, killed") in actions and sv.components["gen-0"].state == C.KILLING
    actions = sv.killed("gen-0", True, -9, 31.0)
    (ev,) = events(actions, E.EXITED)
    assert "/health failed for 20s, killed; exited with code 137" in ev.reason and sv.components["gen-0"].failures == 1


def test_a_component_that_answers_again_before_the_deadline_recovers():
    sv = serving()
    sv.probed("gen-0", False, 10.0)
    assert kinds(sv.probed("gen-0", True, 12.0)) == [E.RECOVERED] and sv.components["gen-0"].state == C.HEALTHY


def test_under_fail_fast_liveness_lost_fails_the_run_and_an_exit_fails_it_at_once():
    sv = serving(policy="fail-fast")
    sv.probed("gen-0", False, 0.0)
    actions = sv.probed("gen-0", False, 20.0)
    assert any(isinstance(a, Fail) and a.component == "gen-0" and "fail-fast" in a.reason for a in actions)
    assert not any(isinstance(a, Kill) for a in actions)
    sv = serving(policy="fail-fast")
    actions = sv.exited("ctx-0", 3, 0.0)
    assert any(isinstance(a, Fail) and a.component == "ctx-0" for a in actions)
    assert sv.components["ctx-0"].state == C.EXITED


def test_a_component_that_survives_sigkill_is_given_up_and_below_minimum_fails():
    sv = serving()
    sv.probed("ctx-0", False, 0.0)
    sv.probed("ctx-0", False, 20.0)  # killed
    actions = sv.killed("ctx-0", False, None, 36.0)
    assert sv.components["ctx-0"].state == C.LOST and "did not die" in sv.components["ctx-0"].reason
    assert any(isinstance(a, Fail) and "does not die" in a.reason for a in actions)  # the only ctx


def test_restarted_but_never_healthy_is_killed_at_its_deadline_and_counted():
    sv = serving(startup_timeout_s=60)
    sv.exited("gen-0", 1, 0.0)
    sv.tick(2.0)  # started again; deadline 62
    assert sv.probed("gen-0", False, 61.0) == []
    actions = sv.probed("gen-0", False, 62.0)
    assert any(isinstance(a, Kill) and "not healthy within 60s of its restart" in a.reason for a in actions)
    events_ = events(sv.killed("gen-0", True, -9, 63.0), E.EXITED)
    assert sv.components["gen-0"].failures == 2 and "restart 2 of 3" in events_[0].reason


def test_a_step_srun_never_created_is_retried_and_not_counted():
    sv = serving(max_restarts=1)
    sv.exited("gen-0", -9, 0.0)  # counted: failures 1 of 1
    sv.tick(2.0)
    t = sv.components["gen-0"]
    for _ in range(6):  # the controller is away for a while: every srun fails without a step
        now = t.next_start
        actions = sv.exited("gen-0", 1, now, step_created=False, why="Unable to contact slurm controller")
        (ev,) = events(actions, E.STEP_NOT_CREATED)
        assert "not counted against max_restarts" in ev.reason and t.state == C.BACKOFF
        assert t.failures == 1 and t.restarts == 1
        assert Start("gen-0") in sv.tick(t.next_start)
    assert t.next_start - now <= 10  # retries back off, capped
    sv.probed("gen-0", True, t.next_start + 1)
    assert t.state == C.HEALTHY and t.restarts == 1 and t.last_exit == 137


def test_a_crash_loop_whose_steps_leave_no_sign_of_creation_still_reaches_max_restarts():
    # The marker lives on a shared filesystem: with attribute caching the batch host can miss it. A server that
    # crashes at once after each restart, srun saying nothing about its step, must not be retried for ever.
    sv = serving(max_restarts=2)
    t = sv.components["gen-0"]
    now, exits, uncounted = 0.0, 0, 0
    while t.state != C.LOST:
        actions = sv.exited("gen-0", 1, now, step_created=None)
        exits += 1
        uncounted += len(events(actions, E.STEP_NOT_CREATED))
        now = t.next_start
        sv.tick(now)
        assert exits < 20, "a crash loop never given up"
    assert uncounted == UNCONFIRMED_MAX and exits == UNCONFIRMED_MAX + 3  # then 2 restarts, then lost
    (ev,) = [e for e in events(actions, E.LOST)]
    assert "given up after 2 restart(s)" in ev.reason


def test_an_exit_after_the_uncounted_ones_says_why_it_counts():
    sv = serving()
    for i in range(UNCONFIRMED_MAX):
        sv.exited("gen-0", 1, float(i), step_created=None)
    (ev,) = events(sv.exited("gen-0", 1, 10.0, step_created=None), E.EXITED)
    assert f"{UNCONFIRMED_MAX} times in a row" in ev.reason and "restart 1 of 3" in ev.reason


def test_steps_srun_says_it_could_not_create_are_retried_uncounted_longer_but_not_for_ever():
    sv = serving(max_restarts=1, backoff_max_s=1)
    t = sv.components["gen-0"]
    now = 0.0
    for _ in range(NOT_CREATED_MAX):  # the controller away for a long while: not the server's failure
        assert events(sv.exited("gen-0", 1, now, step_created=False, why="Unable to create step"),
                      E.STEP_NOT_CREATED)
        now = t.next_start
        sv.tick(now)
    assert t.failures == 0
    assert events(sv.exited("gen-0", 1, now, step_created=False), E.EXITED) and t.failures == 1


def test_a_healthy_restart_starts_the_uncounted_count_again():
    sv = serving()
    t = sv.components["gen-0"]
    for i in range(UNCONFIRMED_MAX):
        sv.exited("gen-0", 1, float(i), step_created=None)
    sv.tick(t.next_start)
    sv.probed("gen-0", True, t.next_start + 1)  # it came up after all
    assert t.state == C.HEALTHY
    assert events(sv.exited("gen-0", 1, 100.0, step_created=None), E.STEP_NOT_CREATED)


def test_a_restart_whose_srun_waits_for_the_controller_past_its_deadline_is_killed_and_not_counted():
    sv = serving(startup_timeout_s=60)
    sv.exited("gen-0", -9, 0.0)
    sv.tick(2.0)
    sv.probed("gen-0", False, 62.0)  # srun still waiting for slurmctld: killed at the deadline
    actions = sv.killed("gen-0", True, -9, 63.0, step_created=False)
    assert events(actions, E.STEP_NOT_CREATED) and sv.components["gen-0"].failures == 1


def test_a_wedged_server_is_killed_and_restarted_and_the_event_says_so():
    sv = serving()
    actions = sv.stalled("gen-0", 30.0, 40.0)
    (ev,) = events(actions, E.WEDGED)
    assert "wedged" in ev.reason and "no token for 30s" in ev.reason and ev.component == "gen-0"
    assert any(isinstance(a, Kill) for a in actions)
    (ex,) = events(sv.killed("gen-0", True, -9, 41.0), E.EXITED)
    assert "wedged" in ex.reason and sv.components["gen-0"].state == C.BACKOFF
    assert sv.stalled("gen-0", 30.0, 42.0) == []  # a stale report of a server already restarting


def test_under_fail_fast_a_wedge_fails_the_run():
    sv = serving(policy="fail-fast")
    assert any(isinstance(a, Fail) and "wedged" in a.reason for a in sv.stalled("gen-1", 30.0, 40.0))


def test_the_run_is_degraded_while_any_component_is_down_and_serving_again_once_all_are_back():
    sv = serving()
    sv.exited("gen-0", -9, 0.0)
    assert kinds(sv.overall(0.0)) == [E.DEGRADED]
    assert sv.overall(1.0) == []
    sv.tick(2.0)
    sv.probed("gen-0", True, 3.0)
    (ev,) = events(sv.overall(3.0), E.SERVING)
    assert sv.run_state == RunState.READY and ev.state == "ready"


def test_etcd_back_after_a_restart_or_a_stall_asks_for_a_membership_repair():
    sv = serving()
    sv.probed("etcd", False, 0.0)
    assert RepairMembership() in sv.probed("etcd", True, 5.0)  # it answered again
    sv.exited("etcd", -9, 10.0)
    sv.tick(12.0)
    assert RepairMembership() in sv.probed("etcd", True, 14.0)  # restarted
    assert RepairMembership() not in sv.probed("gen-0", True, 15.0)


def test_exit_texts():
    assert exit_text(137) == "exited with code 137 (signal 9)"
    assert exit_text(-15) == "exited with code 143 (signal 15)"
    assert exit_text(3) == "exited with code 3"


# --- progress probes ---------------------------------------------------------------------------------------------

def test_one_progress_probe_at_a_time_per_server_and_a_stall_is_reported_once():
    w = ProgressWatch(stall_after_s=30, interval_s=2)
    w.reset("gen-0")
    assert w.due(["gen-0"], 0.0) == [("gen-0", 1)]
    assert w.due(["gen-0"], 5.0) == []  # still in flight
    assert w.stalls(29.0) == []
    assert w.stalls(30.0) == [("gen-0", 30.0)]
    assert w.stalls(35.0) == []  # reported once


def test_a_stall_counts_from_the_last_progress_seen_so_a_wedge_is_seen_within_stall_after_s():
    w = ProgressWatch(stall_after_s=30, interval_s=2)
    w.reset("gen-0")
    (_, gen), = w.due(["gen-0"], 0.0)
    w.answered("gen-0", gen, 200, 0.5)  # progress at 0.5; the engine wedges right after
    w.due(["gen-0"], 2.5)  # the next probe, which will never answer
    assert w.stalls(30.4) == []
    assert w.stalls(30.5) == [("gen-0", 30.0)]  # 30 s after the last progress, not after the probe was sent


def test_an_answer_clears_the_probe_and_the_next_waits_one_interval():
    w = ProgressWatch(stall_after_s=30, interval_s=2)
    w.reset("gen-0")
    (_, gen), = w.due(["gen-0"], 0.0)
    assert w.answered("gen-0", gen, 200, 1.0) is None
    assert w.due(["gen-0"], 2.9) == [] and w.due(["gen-0"], 3.0) == [("gen-0", gen)]


def test_an_answer_from_a_previous_life_is_ignored():
    w = ProgressWatch(stall_after_s=30, interval_s=2)
    w.reset("gen-0")
    (_, old), = w.due(["gen-0"], 0.0)
    w.reset("gen-0")  # restarted meanwhile
    (_, new), = w.due(["gen-0"], 1.0)
    assert w.answered("gen-0", old, 200, 2.0) is None
    assert w.stalls(31.0) == [("gen-0", 30.0)]  # the new probe is still in flight


@pytest.mark.parametrize("status", [404, 405, 501, 401])  # 401: an auth layer refuses it, whatever the engine does
def test_a_server_without_the_progress_route_is_not_probed_again(status):
    w = ProgressWatch(stall_after_s=30, interval_s=2)
    w.reset("gen-0")
    (_, gen), = w.due(["gen-0"], 0.0)
    assert f"HTTP {status}" in w.answered("gen-0", gen, status, 1.0)
    assert w.due(["gen-0"], 10.0) == []


@pytest.mark.parametrize("status", [500, 503, None])
def test_a_failing_generation_is_no_progress_and_a_stall_not_a_reason_to_stop_watching(status):
    # trtllm-serve's /health_generate answers 500 when its one-token generation fails: the very failure the watch
    # is there to catch (a None is a probe that timed out or found no connection)
    w = ProgressWatch(stall_after_s=30, interval_s=2)
    w.reset("gen-0")
    (_, gen), = w.due(["gen-0"], 0.0)
    assert w.answered("gen-0", gen, 200, 0.5) is None  # progress at 0.5
    now = 2.5
    while now < 40:
        if w.due(["gen-0"], now):
            if w.stalls(now):
                break
            assert w.answered("gen-0", gen, status, now + 0.1) is None  # not turned off
        now += 2.0
    assert 30.5 <= now <= 30.5 + 2 * 2.0  # within stall_after_s and a round or two of the last progress
    assert w.failing("gen-0") == (f"HTTP {status}" if status else None)


def test_a_5xx_from_a_probe_that_never_worked_is_said_once_and_judged_only_once_it_has_worked():
    w = ProgressWatch(stall_after_s=30, interval_s=2)
    w.reset("gen-0")
    said, now = [], 0.0
    while now < 100:  # every probe fails from the start (the model has no chat template, say): not a wedge
        sent = w.due(["gen-0"], now)
        assert sent and w.stalls(now) == []
        for name, gen in sent:
            said.append(w.answered(name, gen, 500, now))
        now += 2.0
    assert "never answered 200" in said[0] and said[1:] == [None] * (len(said) - 1)
    (_, gen), = w.due(["gen-0"], now)
    w.answered("gen-0", gen, 200, now)  # it works after all: from now on a failing generation is judged
    w.reset("gen-0")  # even in its next life
    start = now
    while True:  # as the job's round does: send what is due, look for stalls, answers come later
        sent = w.due(["gen-0"], now)
        if w.stalls(now):
            break
        for name, gen in sent:
            assert w.answered(name, gen, 500, now + 0.1) is None
        now += 2.0
    assert 30 <= now - start <= 34


def test_a_restarted_server_is_watched_again_even_after_its_probe_was_turned_off():
    w = ProgressWatch(stall_after_s=30, interval_s=2)
    w.reset("gen-0")
    (_, gen), = w.due(["gen-0"], 0.0)
    w.answered("gen-0", gen, 404, 1.0)
    w.reset("gen-0")  # restarted, perhaps as another build that has the route
    assert w.due(["gen-0"], 2.0) == [("gen-0", gen + 1)] and w.failing("gen-0") is None


def test_a_stall_while_the_generation_probe_fails_says_so():
    sv = serving()
    (ev,) = events(sv.stalled("gen-0", 30.0, 40.0, failing="HTTP 500"), E.WEDGED)
    assert "no progress for 30s" in ev.reason and "answers HTTP 500" in ev.reason


@pytest.mark.parametrize("stall", [0, -1])
def test_progress_probes_are_off_without_a_stall_bound(stall):
    assert ProgressWatch(stall_after_s=stall, interval_s=2).due(["gen-0"], 0.0) == []


# --- registration: a worker that answers /health but is out of the cluster storage ---------------------------------

def registered_serving(**kw) -> Supervisor:
    sv = Supervisor(policy(**kw), dict(ROLES), storage_component="etcd", unregistered_after_s=10.0)
    sv.begin(0.0)
    sv.take_dirty()
    return sv


def test_a_worker_that_loses_its_key_is_unregistered_then_restarted_unless_it_registers_again():
    sv = registered_serving()
    t = sv.components["gen-0"]
    assert sv.registration("gen-0", True, 5.0) == []
    (ev,) = events(sv.registration("gen-0", False, 6.0), E.UNREGISTERED)
    assert t.state == C.UNREGISTERED and "has no key in the cluster storage" in ev.reason
    assert "restarted unless it registers again within 20s" in ev.reason  # the larger of unhealthy_after_s and rejoin
    assert sv.probed("gen-0", True, 7.0) == [] and t.state == C.UNREGISTERED  # /health answering does not clear it
    (ev,) = events(sv.overall(7.0), E.DEGRADED)
    assert "gen-0 unregistered" in ev.reason
    assert sv.registration("gen-0", False, 25.9) == []
    actions = sv.registration("gen-0", False, 26.0)
    assert Kill("gen-0", "not registered in the cluster storage for 20s (out of the proxy's routing), killed") \
        in actions and t.state == C.KILLING
    assert sv.killed("gen-0", True, -9, 27.0)[0] == Deregister("gen-0") and t.state == C.BACKOFF


def test_a_worker_that_registers_again_in_time_is_healthy_again():
    sv = registered_serving()
    sv.registration("gen-1", False, 10.0)
    (ev,) = events(sv.registration("gen-1", True, 15.0), E.RECOVERED)
    assert sv.components["gen-1"].state == C.HEALTHY and "registered in the cluster storage again" in ev.reason
    sv.registration("gen-1", False, 40.0)  # lost again later: its grace starts afresh
    assert sv.registration("gen-1", False, 59.0) == [] and sv.components["gen-1"].state == C.UNREGISTERED


def test_the_grace_is_at_least_what_the_worker_takes_to_register_again_by_itself():
    sv = Supervisor(policy(unhealthy_after_s=4), dict(ROLES), unregistered_after_s=10.0)
    assert sv.unregistered_after_s == 10.0
    assert Supervisor(policy(unhealthy_after_s=30), dict(ROLES), unregistered_after_s=10.0).unregistered_after_s == 30


def test_a_restarted_worker_is_judged_once_it_has_registered_or_its_start_up_time_is_over():
    sv = registered_serving()
    t = sv.components["gen-0"]
    sv.exited("gen-0", -9, 100.0)
    sv.tick(102.0)
    sv.probed("gen-0", True, 104.0)
    assert t.state == C.HEALTHY
    assert sv.registration("gen-0", False, 105.0) == []  # it registers after it serves (TensorRT-LLM's order)
    assert sv.registration("gen-0", True, 106.0) == [] and t.registered
    assert kinds(sv.registration("gen-0", False, 107.0)) == [E.UNREGISTERED]
    sv.exited("gen-1", -9, 200.0)
    sv.tick(202.0)
    sv.probed("gen-1", True, 204.0)
    assert sv.registration("gen-1", False, 261.0) == []  # never registered, within startup_timeout_s (60) of start
    (ev,) = events(sv.registration("gen-1", False, 262.0), E.UNREGISTERED)
    assert "not registered within 60s of its start" in ev.reason


def test_a_worker_without_its_key_that_stops_answering_is_unhealthy_counted_from_when_its_key_went():
    sv = registered_serving()
    sv.registration("gen-0", False, 10.0)
    sv.probed("gen-0", False, 12.0)
    t = sv.components["gen-0"]
    assert t.state == C.UNHEALTHY and t.bad_since == 10.0
    assert kinds(sv.probed("gen-0", False, 30.0))[-1] == "Kill"


def test_under_fail_fast_a_worker_not_registered_again_in_time_ends_the_run():
    sv = registered_serving(policy="fail-fast")
    sv.registration("ctx-0", False, 1.0)
    actions = sv.registration("ctx-0", False, 21.0)
    (fail,) = [a for a in actions if isinstance(a, Fail)]
    assert fail.component == "ctx-0" and "not registered in the cluster storage for 20s" in fail.reason
