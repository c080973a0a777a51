"""Spec: nothing that runs in the background ends without a word.

Every thread of the job's orchestrator starts through orchestrator.background, every asyncio task of the stand-in
through toolkit.standin.tasks, every task of the etcd gateway through its own handlers: a failure is a structured
event (component, cause), and what the work owed is still delivered, or the work is started again, or the component
it serves fails. The source is read for the bare forms (a thread, a task, an executor job nobody awaits), and for a
broad `except` that swallows what it caught without a word.
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
from pathlib import Path

import pytest

from orchestrator import job as job_mod
from orchestrator import membership
from orchestrator.background import Background, BackgroundFailed
from tests.conftest import ROOT
from tests.unit.helpers import parsed
from tests.unit.test_orchestrator import job_in_process  # noqa: F401  (the fixture)

# Where background work is started, and the one place in each program allowed to start it.
PROGRAMS = {
    "orchestrator": ["orchestrator/background.py"],
    # its task starter, and its /proc lookups' one thread (whose every pass is awaited)
    "templates/etcd_gateway.py": ["templates/etcd_gateway.py:spawn", "templates/etcd_gateway.py:TableOwners._passes"],
    "toolkit/standin": ["toolkit/standin/tasks.py", "toolkit/standin/kv.py:KvPool.__init__"],  # NIXL's one thread
}
# Calls that start work nobody waits for: the bare forms (asyncio.Task(coro) is a task as create_task's is).
STARTERS = {"Thread", "Timer", "ThreadPoolExecutor", "ProcessPoolExecutor", "ensure_future", "create_task",
            "start_new_thread", "run_coroutine_threadsafe", "call_soon_threadsafe", "Task"}
# Calls whose work is given to a thread or a task and must be awaited where they are made (the exception reaches
# the caller): a gather nobody awaits runs its coroutines as tasks whose failures nobody hears.
AWAITED = {"run_in_executor", "to_thread", "gather"}
# The programs and modules whose broad `except` must say what it caught (or raise).
SPOKEN = ["orchestrator", "templates/etcd_gateway.py", "toolkit/standin", "toolkit/api.py"]


def _files(where: str) -> list[Path]:
    path = ROOT / where
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def _name(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _calls(tree: ast.AST):
    """(call, the name it calls, the qualified function it is in, whether it is awaited right there)."""
    out = []

    def visit(node, scope, awaited=False):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = f"{scope}.{node.name}" if scope else node.name
        if isinstance(node, ast.Call):
            out.append((node, _name(node.func), scope, awaited))
        for child in ast.iter_child_nodes(node):
            visit(child, scope, isinstance(node, ast.Await) and child is node.value)
    visit(tree, "")
    return out


def _annotations(tree: ast.AST) -> set:
    """The nodes of every annotation (a return type, an argument's or a variable's): a type names a starter
    without starting anything."""
    out: set = set()
    for node in ast.walk(tree):
        roots = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            roots.append(node.returns)
        if isinstance(node, (ast.arg, ast.AnnAssign)) and node.annotation is not None:
            roots.append(node.annotation)
        for root in roots:
            out |= {id(n) for n in ast.walk(root)}
    return out


def _references(tree: ast.AST):
    """(node, the starter it names, the qualified function it is in) for every mention of a starter that is not
    the called name of a call: `T = threading.Thread`, `partial(threading.Thread, ...)`, `map(loop.create_task, ...)`,
    `getattr(threading, "Thread")`, `from threading import Thread as T` (an import under its own name is left to the
    calls it makes)."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    typed = _annotations(tree)
    out = []

    def visit(node, scope):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope = f"{scope}.{node.name}" if scope else node.name
        if isinstance(node, (ast.Attribute, ast.Name)) and _name(node) in STARTERS and id(node) not in called \
                and id(node) not in typed:
            out.append((node, _name(node), scope))
        if isinstance(node, ast.alias) and node.name.rpartition(".")[2] in STARTERS and node.asname:
            out.append((node, node.name, scope))
        if isinstance(node, ast.Call) and _name(node.func) == "getattr" and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in STARTERS:
            out.append((node, node.args[1].value, scope))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)
    visit(tree, "")
    return out


def _allowed(rel: str, scope: str, allowed: list[str]) -> bool:
    for a in allowed:
        file, _, where = a.partition(":")
        if rel == file and (not where or scope == where or scope.startswith(where + ".")):
            return True
    return False


def _bare_forms(tree: ast.AST, rel: str, allowed: list[str]) -> list[str]:
    """Where background work is started in `tree` (the file `rel`) other than in the allowed places."""
    bare = []
    for call, name, scope, awaited in _calls(tree):
        if name in STARTERS and not _allowed(rel, scope, allowed):
            bare.append(f"{rel}:{call.lineno} {name} in {scope or 'the module'}")
        if name in AWAITED and not awaited and not _allowed(rel, scope, allowed):
            bare.append(f"{rel}:{call.lineno} {name} not awaited where it is called")
    for node, name, scope in _references(tree):
        if not _allowed(rel, scope, allowed):
            bare.append(f"{rel}:{node.lineno} {name} named (not called) in {scope or 'the module'}")
    return bare


def test_every_thread_and_task_starts_through_the_programs_one_helper():
    bare = []
    for where, allowed in PROGRAMS.items():
        for path in _files(where):
            rel = str(path.relative_to(ROOT))
            bare += _bare_forms(parsed(path), rel, allowed)
    assert bare == [], "background work started without the helper that reports its failure:\n" + "\n".join(bare)


def _broad(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in ("Exception", "BaseException") for n in names)


def test_a_broad_except_says_what_it_caught_or_raises():
    """`except Exception: return None` hides a bug; a broad handler must use the exception it caught (log it,
    report it, put it in a reason) or raise."""
    silent = []
    for where in SPOKEN:
        for path in _files(where):
            for node in ast.walk(parsed(path)):
                if not isinstance(node, ast.ExceptHandler) or not _broad(node):
                    continue
                body = [n for stmt in node.body for n in ast.walk(stmt)]
                raises = any(isinstance(n, ast.Raise) for n in body)
                used = node.name is not None and any(isinstance(n, ast.Name) and n.id == node.name for n in body)
                if not (raises or used):
                    silent.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert silent == [], "broad excepts that swallow what they caught:\n" + "\n".join(silent)


def test_the_source_check_finds_the_bare_forms_it_forbids():
    src = ("import asyncio, threading\n"
           "def f():\n    threading.Thread(target=g).start()\n"
           "async def h(loop):\n    asyncio.ensure_future(g())\n    loop.run_in_executor(None, g)\n"
           "    await loop.run_in_executor(None, g)\n")
    found = [(name, awaited) for _, name, _, awaited in _calls(ast.parse(src)) if name in STARTERS | AWAITED]
    assert found == [("Thread", False), ("ensure_future", False), ("run_in_executor", False),
                     ("run_in_executor", True)]
    handler = ast.parse("try:\n    x()\nexcept Exception:\n    return_value = None\n").body[0].handlers[0]
    assert _broad(handler) and handler.name is None


@pytest.mark.parametrize("src", [
    "from threading import Thread as Worker\ndef f():\n    Worker(target=g).start()\n",
    "import threading\nT = threading.Thread\ndef f():\n    T(target=g).start()\n",
    "import threading, functools\ndef f():\n    functools.partial(threading.Thread, target=g)().start()\n",
    "import threading\ndef f():\n    getattr(threading, 'Thread')(target=g).start()\n",
    "import asyncio\nasync def f():\n    asyncio.Task(g())\n",
    "import asyncio\nasync def f(loop):\n    spawn = loop.create_task\n    spawn(g())\n",
    "import asyncio\nasync def f():\n    list(map(asyncio.ensure_future, [g()]))\n",
    "import asyncio\nasync def f():\n    asyncio.gather(g(), h())\n",
], ids=["import-as", "assigned", "partial", "getattr", "Task()", "bound-method", "map", "gather-not-awaited"])
def test_the_source_check_sees_through_an_alias_or_a_reference(src):
    """A starter reached under another name (import ... as, an assignment, functools.partial, getattr, map) or by a
    form the call names miss (asyncio.Task(coro), a gather nobody awaits) is still background work nobody hears
    from: the check finds it (review of issue 31: `T = threading.Thread; T(...)` passed it)."""
    assert _bare_forms(ast.parse(src), "x.py", []), src


def test_the_source_check_leaves_annotations_and_awaited_gathers_alone():
    src = ("import asyncio, threading\nfrom typing import Optional\n"
           "def f() -> threading.Thread:\n    t: Optional[asyncio.Task] = None\n    return t\n"
           "async def h():\n    await asyncio.gather(g(), g())\n")
    assert _bare_forms(ast.parse(src), "x.py", []) == []


# --- the orchestrator's helper ----------------------------------------------------------------------------------

def test_a_failing_piece_of_work_is_reported_with_its_component_and_cause_then_its_fallback_runs():
    said: list[BackgroundFailed] = []
    fallback = []

    def boom():
        raise KeyError("kvs")
    Background(said.append).start("membership-repair", boom, "gen-0", on_failure=fallback.append).join(10)
    (failed,) = said
    assert (failed.task, failed.component, failed.cause) == ("membership-repair", "gen-0", "KeyError: 'kvs'")
    assert failed.where.startswith("unit/test_background_work.py:") and failed.where.endswith(" in boom")
    assert [type(e) for e in fallback] == [KeyError]


def test_a_fallback_that_fails_too_is_reported_as_well():
    said: list[BackgroundFailed] = []

    def boom():
        raise ValueError("first")

    def worse(_exc):
        raise RuntimeError("second")
    Background(said.append).start("kill", boom, "ctx-0", on_failure=worse).join(10)
    assert [(f.task, f.cause) for f in said] == [("kill", "ValueError: first"),
                                                 ("kill (its fallback)", "RuntimeError: second")]


def test_a_timer_runs_once_its_time_has_passed_unless_cancelled_first():
    import threading
    ran = threading.Event()
    Background().after("deadline", 0.0, ran.set)
    assert ran.wait(10)
    ran.clear()
    Background().after("deadline", 5.0, ran.set).set()
    assert not ran.wait(0.2)


# --- the job: background failures are events, and the loop still gets its answer ------------------------------------

def _events(tmp_path):
    return [json.loads(line) for line in (tmp_path / "state" / "events.jsonl").read_text().splitlines()]


def _serving_job(job_in_process, *overrides):
    from tests.unit.test_orchestrator import _serving, spec_of
    return _serving(job_in_process(spec_of(*overrides)))


def test_a_kill_that_fails_is_an_event_and_the_loop_still_learns_whether_the_process_died(job_in_process, tmp_path):
    j = _serving_job(job_in_process, "membership.enabled=false")

    def kill(name, proc, step):
        raise OSError("scancel: no such file")
    j.steps.kill = kill
    j.kill_in_background("gen-0")
    answer = j.inbox.get(timeout=10)
    assert answer == job_mod.Killed("gen-0", False, None)  # FakeProc still runs: it did not die
    (ev,) = [e for e in _events(tmp_path) if e["event"] == "background-failed"]
    assert ev["component"] == "gen-0" and "kill" in ev["reason"] and "OSError: scancel: no such file" in ev["reason"]


def test_a_step_lookup_that_fails_is_an_event_and_is_asked_again_later(job_in_process, tmp_path):
    j = _serving_job(job_in_process, "membership.enabled=false")

    def step_ids():
        raise RuntimeError("squeue broke")
    j.steps.step_ids = step_ids
    j.step_lookup_at = float("-inf")
    j.maybe_lookup_steps()
    answer = j.inbox.get(timeout=10)
    assert answer == job_mod.StepsFound({}, dict(j.launches))
    j.inbox.put(answer)
    j.drain_inbox(j.clock())
    assert not j.step_lookup_busy
    assert any(e["event"] == "background-failed" and "squeue broke" in e["reason"] for e in _events(tmp_path))


def test_a_progress_probe_that_fails_answers_no_progress_and_says_why(tmp_path):
    from orchestrator.probe import Prober
    said: list[BackgroundFailed] = []
    answers = []

    def get(url, timeout_s):
        raise AttributeError("a bug")
    prober = Prober(1.0, get=get, work=Background(said.append))
    prober.start_progress("http://x/health_generate", 1.0, answers.append, component="gen-1")
    for _ in range(100):
        if answers:
            break
        import time
        time.sleep(0.05)
    assert answers == [None]
    assert [(f.task, f.component) for f in said] == [("progress-probe", "gen-1")]
    assert prober.round({"gen-1": "http://x/health"}) == {"gen-1": None}  # a liveness probe that fails: no answer
    assert [(f.task, f.component, f.cause) for f in said][1:] == [("liveness-probe", "gen-1", "AttributeError: a bug")]
    prober.close()


def test_the_inbox_holds_messages_not_tagged_tuples(job_in_process):
    j = _serving_job(job_in_process, "membership.enabled=false")
    j.procs.pop("gen-1")
    j.kill_in_background("gen-1")  # no process: answered at once
    assert j.inbox.get_nowait() == job_mod.Killed("gen-1", True, -9)
    with pytest.raises(TypeError, match="not an inbox message"):
        j.inbox.put(("killed", "gen-1", True, -9))
        j.drain_inbox(j.clock())


def test_a_failure_once_serving_raises_job_failed_not_a_start_up_failure(job_in_process, tmp_path):
    from orchestrator import startup
    from orchestrator.policy import Fail
    j = _serving_job(job_in_process, "membership.enabled=false")
    with pytest.raises(job_mod.JobFailed) as info:
        j.execute([Fail("gen-0 lost, below the minimum", "gen-0")])
    assert not isinstance(info.value, startup.StartupFailed)
    assert (info.value.reason, info.value.component) == ("gen-0 lost, below the minimum", "gen-0")


# --- the stand-in's helper ------------------------------------------------------------------------------------------

def _failures(caplog) -> list[dict]:
    return [json.loads(r.getMessage().split(" ", 1)[1]) for r in caplog.records
            if r.getMessage().startswith("background-failed ")]


def test_a_stand_in_task_that_dies_is_a_structured_line_and_its_owner_reacts(caplog):
    from toolkit.standin.tasks import spawn
    reacted = []

    async def main():
        async def boom():
            raise KeyError("key")
        spawn(boom(), "membership-heartbeat", on_error=reacted.append, component="worker 127.0.0.1:9")
        await asyncio.sleep(0.05)
    with caplog.at_level(logging.ERROR, logger="toolkit.standin"):
        asyncio.run(main())
    assert _failures(caplog) == [{"task": "membership-heartbeat", "component": "worker 127.0.0.1:9",
                                  "cause": "KeyError: 'key'", "then": "its owner reacts"}]
    assert [type(e) for e in reacted] == [KeyError]


def test_a_stand_in_loop_that_must_keep_running_is_started_again_after_a_failure(caplog):
    from toolkit.standin.tasks import keep
    runs = []

    async def main():
        async def poll():
            runs.append(1)
            if len(runs) < 3:
                raise ValueError("an unexpected value")
            await asyncio.sleep(10)
        task = keep(poll, "membership-poll", component="proxy", first_delay_s=0.01)
        await asyncio.sleep(0.3)
        task.cancel()
    with caplog.at_level(logging.ERROR, logger="toolkit.standin"):
        asyncio.run(main())
    assert len(runs) == 3
    assert [(f["task"], f["cause"]) for f in _failures(caplog)] == [("membership-poll", "ValueError: an unexpected "
                                                                      "value")] * 2


def test_the_registration_lookup_reports_back_even_when_the_storage_call_raises_something_else(job_in_process,
                                                                                               tmp_path, monkeypatch):
    from toolkit.runtime.tls import write_run_certificates
    write_run_certificates(tmp_path / "secrets" / "etcd")
    j = _serving_job(job_in_process, "membership.enabled=true")

    def missing(uri, prefix, workers):
        raise KeyError("kvs")
    monkeypatch.setattr(membership, "missing", missing)
    j.registration_at = float("-inf")
    j.maybe_check_registrations()
    answer = j.inbox.get(timeout=10)
    assert isinstance(answer, job_mod.Registrations) and answer.missing is None
    j.inbox.put(answer)
    j.drain_inbox(j.clock())
    assert not j.registration_busy
    assert any(e["event"] == "background-failed" and "KeyError" in e["reason"] for e in _events(tmp_path))
