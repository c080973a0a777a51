"""Spec: `tk validate cluster --local` runs real NIXL agents as processes here. On the 4-node stand-in
recipe (TensorRT-LLM 1.2: the C++ transceiver, one staged descriptor per rank pair) every context x generation
pair passes, in both directions (context -> generation and the answer's KV moving back), WRITE only, with every
byte checked and a positive bandwidth; as a 1.3 recipe (the Python transceiver's lists) the sweep and the READ it
is asked for run too; so does a run whose memory cap leaves fewer destination slots than transfers (several bursts
per request); an injected corruption, a killed agent and an agent that never shows up each end, within a bound, in
a failure that names the pair (or the node) and the cause, with no agent process left behind."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import ROOT
from toolkit.validate.report import load_schema

pytest.importorskip("numpy")
RECIPE = str(ROOT / "recipes" / "standin-2p2d.yaml")
SMALL = ["--iterations", "3", "--warmup", "1", "--sweep-iterations", "2", "--transfer-timeout", "5",
         "--rendezvous-timeout", "5", "--timeout", "120"]
AGENT_PACKAGE = ROOT / "validation"
AS_1_3 = ("--set", "trtllm_version=1.3.0rc27")  # the Python transceiver (auto on NIXL): descriptor lists


def validate(tmp_path, *extra, fault=None, json_out=True, timeout=180, base=SMALL):
    env = {**os.environ, "TK_RUNS_DIR": str(tmp_path / "runs")}
    env.pop("TK_VALIDATE_FAULT", None)
    if fault:
        env["TK_VALIDATE_FAULT"] = fault
    args = [sys.executable, "-m", "toolkit.cli", "validate", "cluster", RECIPE, "--local", "--run-dir",
            str(tmp_path / "run"), *base, *extra] + (["--json"] if json_out else [])
    t0 = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL,
                          check=False)
    proc.elapsed = time.monotonic() - t0
    proc.report = json.loads(proc.stdout) if json_out and proc.stdout.strip().startswith("{") else None
    return proc


def failed_pairs(proc, within_s: float | None = None) -> tuple[dict, list[dict]]:
    """A validation that ended in a verdict: exit 1 (within the bound), a schema-valid report, and the
    pairs that failed."""
    assert proc.returncode == 1, proc.stderr[-3000:]
    if within_s is not None:
        assert proc.elapsed < within_s
    report = proc.report
    jsonschema.validate(report, load_schema())
    return report, [p for p in report["pairs"] if not p["passed"]]


def agents_left(run_dir: Path) -> list[str]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(run_dir) in cmd and "agent.pyz" in cmd:
                out.append(cmd)
    return out


def test_agent_needs_only_stdlib_numpy_and_nixl():
    """Every module of the agent package imports only the standard library, numpy (torch for VRAM, when
    present) and the package itself: never toolkit, tests or anything else the nodes may lack."""
    sources = sorted(AGENT_PACKAGE.rglob("*.py"))
    assert {p.name for p in sources} >= {"__main__.py", "agent.py", "wire.py", "pair.py"}
    mods = set()
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path.name}: relative import"  # absolute: one rule to check
                mods.add(node.module.split(".")[0])
    optional = {"numpy", "torch", "cupy"}  # torch or CuPy only for VRAM, when present
    assert mods - set(sys.stdlib_module_names) - optional - {"validation"} == set(), mods
    text = "".join(p.read_text() for p in sources)
    for name in ("nixl._api", "nixl_cu12._api"):  # imported by name, after the role env is applied
        assert f'"{name}"' in text


@pytest.mark.nixl
@pytest.mark.slow
def test_four_local_nodes_pass_with_every_byte_checked(tmp_path):
    proc = validate(tmp_path, "--nodes", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.report
    jsonschema.validate(report, load_schema())
    assert report["passed"] and report["mode"] == "local"
    assert json.loads((tmp_path / "run" / "report.json").read_text()) == report  # a copy stays in the run dir
    pairs = report["pairs"]
    assert {(p["src"], p["dst"]) for p in pairs} == {(c, g) for c in ("node0", "node1") for g in ("node2", "node3")}
    assert {(p["src"], p["dst"], p["direction"], p["op"]) for p in pairs} == {  # WRITE only: TensorRT-LLM's op
        (c, g, d, "WRITE") for c in ("node0", "node1") for g in ("node2", "node3") for d in ("forward", "reverse")}
    assert report["transceiver"]["model"].startswith(
        "C++ transceiver: staged-per-rank-pair, 1 descriptor per rank pair of 2.00 MiB for the 1024-token request")
    transfers = 1 + 3  # warm-up + timed, each verified
    for p in pairs:
        assert p["passed"] and p["error"] is None and p["gbps"] > 0
        assert p["latency_p50_ms"] > 0 and p["latency_p99_ms"] >= p["latency_p50_ms"]
        assert [x["tokens"] for x in p["lengths"]] == [128, 256, 1024]
        for x in p["lengths"]:
            assert x["descriptors"] == 1 and x["staged"] and x["bytes"] == x["tokens"] * 2048
            assert x["gather_p50_ms"] > 0 and x["scatter_p50_ms"] > 0 and x["request_ms"] > x["latency_p50_ms"]
            assert x["transfers_verified"] == transfers and x["slots"] >= 2  # timed in bursts, checked between
            assert x["bytes_verified"] == transfers * x["bytes"]  # every moved byte, every transfer, once
            assert x["untouched_bytes_checked"] > 0  # and the blocks outside the slots
    for item in report["preflight"]:
        assert item["status"] in ("pass", "not_present"), item
    names = {i["name"] for i in report["preflight"] if i.get("agent") == "node0"}
    assert {"env", "nixl_import", "backend", "memory", "gpus", "nics", "nvidia_peermem", "ucx_transport",
            "ucx_protocol"} <= names
    proto = next(n for n in report["nodes"] if n["agent"] == "node0")["protocols"]
    assert {c["op"] for c in proto} >= {"WRITE"} and all(c["memory"] for c in proto)
    assert report["sweep"] == [] and report["recommendation"] is None  # one descriptor whatever tokens_per_block
    assert [r["descriptors"] for r in report["curve"]] == [1, 4, 16, 64, 256, 1024, 2048]
    assert all(r["pairs"] == 4 and r["gbps_median"] > 0 and not r["errors"] for r in report["curve"])
    assert report["advice"]["status"] == "withheld"  # one host, shared memory: WRITE figures are the host's
    assert report["bandwidth_matrix"]["reverse"]["ops"]["WRITE"]["min"] > 0
    assert report["cleanup"]["released"] and not agents_left(tmp_path / "run")
    # the agent applied the role env before importing NIXL: what is validated is what will serve
    env = next(i for i in report["preflight"] if i["name"] == "env" and i["agent"] == "node2")
    assert "UCX_TLS=tcp,sm,self" in env["detail"]


@pytest.mark.nixl
@pytest.mark.slow
def test_a_1_3_recipe_moves_the_python_transceiver_s_lists_and_sweeps_and_reads_when_asked(tmp_path):
    proc = validate(tmp_path, "--nodes", "2", "--read", "--sweep-repeats", "3", *AS_1_3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.report
    jsonschema.validate(report, load_schema())
    assert report["transceiver"]["runtime"] == "PYTHON" and report["transceiver"]["layout"] == "per-block"
    assert {(p["direction"], p["op"]) for p in report["pairs"]} == {
        (d, o) for d in ("forward", "reverse") for o in ("WRITE", "READ")}
    for p in report["pairs"]:
        assert p["passed"] and p["issued_by_trtllm"] is (p["op"] == "WRITE")
        assert [x["descriptors"] for x in p["lengths"]] == [4, 8, 32] and not any(x["staged"] for x in p["lengths"])
    assert [s["tokens_per_block"] for s in report["sweep"]] == [16, 32, 64, 128, 256]
    assert all(len(s["ops"][op]["passes"]) == 3 for s in report["sweep"] for op in ("WRITE", "READ"))
    rec = report["recommendation"]
    assert rec["excluded"].keys() == {"WRITE"} and rec["status"] in ("change", "keep", "withheld")
    assert not agents_left(tmp_path / "run")


# 2 warm-up + 10 timed transfers per request, in a pool of 13 MiB: the 1024-token request gets 5 destination
# slots (bursts of 5, 5, 2), the 512-token one 10 (bursts of 10, 2). Large recipes run this way by default
# (Llama-3.3-70B gets fewer than 12 slots at the default 256 MiB cap).
BURSTS = ["--iterations", "10", "--warmup", "2", "--max-memory-mb", "13", "--lengths", "512,1024", "--no-sweep", "--no-curve",
          "--transfer-timeout", "10", "--rendezvous-timeout", "5", "--timeout", "150"]


@pytest.mark.nixl
@pytest.mark.slow
def test_requests_in_several_bursts_verify_every_transfer(tmp_path):
    """Later bursts refill the source and land on the previous burst's data: each is still checked."""
    proc = validate(tmp_path, "--nodes", "2", *AS_1_3, base=BURSTS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.report
    jsonschema.validate(report, load_schema())
    assert report["passed"] and report["geometry"]["slots"] == 5
    assert any("bursts of 5 transfer(s) instead of 12" in n for n in report["geometry"]["notes"])
    assert len(report["pairs"]) == 2  # forward and reverse WRITE
    for p in report["pairs"]:
        assert p["passed"] and p["error"] is None and p["gbps"] > 0
        assert [(x["tokens"], x["slots"]) for x in p["lengths"]] == [(512, 10), (1024, 5)]
        for x in p["lengths"]:
            assert x["iterations"] == 10
            assert x["transfers_verified"] == 12  # every transfer of every burst, warm-ups included
            assert x["bytes_verified"] == 12 * x["bytes"]  # each transfer's bytes, once
            assert x["untouched_bytes_checked"] > 0  # and what no transfer should have written
    assert not agents_left(tmp_path / "run")


@pytest.mark.nixl
@pytest.mark.slow
def test_corruption_in_a_later_burst_fails_naming_the_block(tmp_path):
    """The corrupt fault flips a byte after the last burst of node1's first request (512 tokens, bursts of
    10 and 2): the check after that burst names it."""
    report, bad = failed_pairs(validate(tmp_path, "--nodes", "2", *AS_1_3, base=BURSTS, fault="corrupt:node1"))
    assert [(p["src"], p["dst"], p["direction"], p["op"]) for p in bad] == [("node0", "node1", "forward", "WRITE")]
    err = bad[0]["error"]
    for needle in ("data mismatch node0 -> node1 WRITE", "512-token request", "iteration 10:", "block 8 of 16",
                   "destination pool block", "first bad byte at offset"):
        assert needle in err, err
    assert "stale" not in err  # the data landed; one byte of it is wrong
    assert not report["passed"] and not agents_left(tmp_path / "run")


@pytest.mark.nixl
@pytest.mark.slow
def test_human_output_is_a_table_on_stderr(tmp_path):
    proc = validate(tmp_path, "--nodes", "2", "--no-sweep", json_out=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == ""
    assert "node0 / node1" in proc.stderr and "gen -> ctx" in proc.stderr and "PASSED" in proc.stderr
    assert "generation -> context WRITE" in proc.stderr and "GB/s" in proc.stderr
    assert "moves what TensorRT-LLM moves: C++ transceiver: staged-per-rank-pair" in " ".join(proc.stderr.split())


@pytest.mark.nixl
@pytest.mark.slow
def test_corrupted_buffer_fails_naming_the_pair_block_and_offset(tmp_path):
    report, bad = failed_pairs(validate(tmp_path, "--nodes", "4", "--no-sweep", "--no-curve", fault="corrupt:node2"))
    assert [(p["src"], p["dst"], p["direction"], p["op"]) for p in bad] == [("node0", "node2", "forward", "WRITE")]
    err = bad[0]["error"]
    for needle in ("data mismatch", "node0 -> node2", "128-token request", "block", "offset"):
        assert needle in err, err
    assert not report["passed"] and not agents_left(tmp_path / "run")


@pytest.mark.nixl
@pytest.mark.slow
def test_corruption_moving_back_is_caught_by_the_context_side(tmp_path):
    """generation -> context: the context agent verifies, and names the reverse direction."""
    _, bad = failed_pairs(validate(tmp_path, "--nodes", "2", "--no-sweep", "--no-curve", fault="corrupt:node0"))
    assert [(p["src"], p["dst"], p["direction"], p["op"]) for p in bad] == [("node0", "node1", "reverse", "WRITE")]
    assert "data mismatch node1 -> node0 WRITE (reverse: generation -> context)" in bad[0]["error"]


@pytest.mark.nixl
@pytest.mark.slow
def test_agent_killed_mid_run_fails_within_the_bound(tmp_path):
    report, bad = failed_pairs(validate(tmp_path, "--nodes", "4", "--no-sweep", "--no-curve", fault="kill:node2"), within_s=60)
    assert {(p["src"], p["dst"]) for p in bad} == {("node0", "node2"), ("node1", "node2")}
    assert all("node2" in p["error"] for p in bad)
    assert any("exited with code 137" in p["error"] for p in bad)
    assert all(p["passed"] for p in report["pairs"] if p["dst"] == "node3")  # the rest still validated
    assert not agents_left(tmp_path / "run")


@pytest.mark.nixl
@pytest.mark.slow
def test_agent_that_stops_answering_fails_its_pairs_within_the_bound(tmp_path):
    report, bad = failed_pairs(validate(tmp_path, "--nodes", "4", "--no-sweep", "--no-curve", "--transfer-timeout", "3",
                                        fault="hang:node2"), within_s=60)
    assert {(p["src"], p["dst"]) for p in bad} == {("node0", "node2"), ("node1", "node2")}
    assert all("no answer from node2 within 3s" in p["error"] or "node2 stopped answering" in p["error"]
               for p in bad)
    assert all(p["passed"] for p in report["pairs"] if p["dst"] == "node3")
    assert not agents_left(tmp_path / "run")  # the hung agent was ended


@pytest.mark.nixl
@pytest.mark.slow
def test_peer_that_never_shows_up_is_named_within_the_bound(tmp_path):
    report, bad = failed_pairs(validate(tmp_path, "--nodes", "4", "--no-sweep", "--no-curve", "--rendezvous-timeout", "3",
                                        fault="absent:node3"), within_s=60)
    assert {(p["src"], p["dst"]) for p in bad} == {("node0", "node3"), ("node1", "node3")}
    assert all("node3 never showed up" in p["error"] for p in bad)
    assert not agents_left(tmp_path / "run")  # the hung agent was ended


@pytest.mark.nixl
@pytest.mark.slow
def test_vram_without_a_gpu_is_a_clear_preflight_failure(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    proc = validate(tmp_path, "--nodes", "2", "--no-sweep", "--no-curve", "--memory", "vram")
    assert proc.returncode == 1
    items = [i for i in proc.report["preflight"] if i["name"] == "memory"]
    assert items and all(i["status"] == "fail" and "no GPU" in i["detail"] for i in items)


@pytest.mark.slow
@pytest.mark.nixl
def test_a_passed_validation_whose_run_directory_holds_markup_exits_0(tmp_path):
    """(from tests/unit/test_operator_faults.py: it starts NIXL agents, which the unit layer never does) rich markup
    in the run directory's name is shown as written, and a passed validation exits 0."""
    from tests.unit.helpers import tk_in_process

    run_dir = tmp_path / "v[/b]"
    proc = tk_in_process("validate", "cluster", "standin-2p2d", "--local", "--nodes", "2", "--no-sweep",
                         "--iterations", "1", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"Report: {run_dir}/report.json" in proc.stderr
