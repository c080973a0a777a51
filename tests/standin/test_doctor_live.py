"""Spec (live, the CPU stand-in under the local backend): a launch whose generation servers were given a different
transfer buffer than the context servers (TK_STANDIN_MAX_TOKENS_IN_BUFFER, as a hand-edited gen.yaml would) fails
its smoke request with "Message truncated", as TensorRT-LLM does; the failed launch's message and `tk doctor`
name the cause and the fix with the log line; every node wrote its provenance; `tk diff` of that run and a
render shows what differs."""

from __future__ import annotations

import json
import random
import socket

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("msgpack")

from toolkit import api  # noqa: E402
from toolkit.errors import TkError  # noqa: E402

pytestmark = pytest.mark.slow


def _free_range(n: int) -> int:
    for _ in range(200):
        base = random.randint(29400, 29900)
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("0.0.0.0", port))
        except OSError:
            continue
        return base
    pytest.skip("no free port range in 29400-29900")


def _nixl_available() -> bool:
    import importlib.util

    return any(importlib.util.find_spec(m) is not None for m in ("nixl", "nixl_cu12", "nixl_cu13"))


@pytest.mark.skipif(not _nixl_available(), reason="the stand-in moves KV with NIXL (pip install nixl-cu12)")
def test_a_mismatched_transceiver_buffer_is_diagnosed_live(tmp_path, monkeypatch):
    base = _free_range(6)
    monkeypatch.setenv("TK_RUNS_DIR", str(tmp_path / "runs"))
    overrides = [f"proxy.port={base + 5}", f"cluster.worker_base_port={base}", "cluster.startup_timeout_s=90",
                 "generation.env.TK_STANDIN_MAX_TOKENS_IN_BUFFER=64"]
    plan = api.load_plan("standin-2p2d", overrides)
    with pytest.raises(TkError) as failed:
        api.launch(plan, local=True, run_dir=tmp_path / "bad")
    message = str(failed.value)
    assert "Message truncated" in message
    assert "diagnosis [transceiver-buffer-mismatch]" in message and "kv_transfer.max_tokens_in_buffer" in message

    monkeypatch.chdir(tmp_path.parent)  # found from another directory, by name, through the run index
    doc = api.doctor("bad")
    assert doc["state"] == "failed" and doc["job"]["phase"] == "ENDED"
    first = doc["findings"][0]
    assert first["id"] == "transceiver-buffer-mismatch"
    ev = first["evidence"][0]
    assert ev["file"].startswith("logs/gen-") and "Message truncated" in ev["text"]
    log_lines = (tmp_path / "bad" / ev["file"]).read_text().splitlines()
    assert "Message truncated" in log_lines[ev["line"] - 1]

    # provenance: one file per node, real JSON, the stand-in's real version, absent tools as null
    prov = sorted((tmp_path / "bad" / "provenance").glob("*.json"))
    assert len(prov) == plan.node_count
    for p in prov:
        rec = json.loads(p.read_text())
        assert rec["engine"].startswith("tk-standin-serve ") and "not TensorRT-LLM" in rec["engine"]
        assert rec["node"] == p.stem
        assert set(rec) >= {"nixl", "ucx", "driver", "container_image", "image_digest"}

    # tk diff: the run against a plain render of the same recipe shows the injected env and the versions
    out, _ = api.render(api.load_plan("standin-2p2d", overrides[:3]), tmp_path / "render")
    d = api.diff("bad", out)
    assert d["rendered"]["gen.env"]["status"] == "changed"
    assert any("TK_STANDIN_MAX_TOKENS_IN_BUFFER" in line for line in d["rendered"]["gen.env"]["diff"])
    assert d["rendered"]["ctx.yaml"]["status"] == "same"
    assert d["versions"]["nodes_with_provenance"] == {"A": plan.node_count, "B": 0}
    assert "engine" in d["versions"]["differ"]
