"""Start-up checks of tk-standin-serve: refused the way TensorRT-LLM refuses them, before any port is bound."""

from __future__ import annotations

import socket

import pytest
import yaml

from tests.standin.helpers import MODEL, free_port, run_standin, worker_env
from toolkit.standin.options import ConfigError, worker_settings
from toolkit.standin.proxy import parse_config

GOOD = {
    "max_batch_size": 8, "max_num_tokens": 256, "max_seq_len": 320,
    "kv_cache_config": {"tokens_per_block": 32, "dtype": "auto"},
    "cache_transceiver_config": {"backend": "NIXL", "max_tokens_in_buffer": 256, "kv_transfer_timeout_ms": 5000},
}


def write(tmp_path, options, name="ctx.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(options))
    return p


def settings(path, monkeypatch, version="1.2", *extra):
    monkeypatch.setenv("TK_STANDIN_TRTLLM_VERSION", version)
    return worker_settings([MODEL, "--host", "127.0.0.1", "--port", "19000", "--backend", "pytorch",
                            "--tp_size", "1", "--pp_size", "1", *extra, "--extra_llm_api_options", str(path)])


def refused(path, monkeypatch, version="1.2", *extra) -> str:
    with pytest.raises(ConfigError) as exc:
        settings(path, monkeypatch, version, *extra)
    return str(exc.value)


def test_unknown_key_fails_at_startup_naming_file_and_key_and_binds_nothing(tmp_path):
    path = write(tmp_path, {**GOOD, "max_batch_sizes": 8})
    port = free_port()
    proc = run_standin(MODEL, "--host", "127.0.0.1", "--port", str(port), "--extra_llm_api_options", str(path))
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert str(path) in err and "'max_batch_sizes'" in err and "did you mean 'max_batch_size'" in err
    with socket.socket() as s:  # nothing listens there
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_unknown_nested_key_is_refused(tmp_path, monkeypatch):
    msg = refused(write(tmp_path, {**GOOD, "kv_cache_config": {"tokens_per_block": 32, "token_per_block": 3}}),
                  monkeypatch)
    assert "kv_cache_config.token_per_block" in msg


def test_accepted_keys_follow_the_target_version(tmp_path, monkeypatch):
    path = write(tmp_path, GOOD)
    s = settings(path, monkeypatch, "1.2")
    assert s.transceiver.kv_transfer_timeout_ms == 5000 and s.transceiver.max_tokens_in_buffer == 256
    msg = refused(path, monkeypatch, "1.0")  # no kv_transfer_timeout_ms on 1.0 (toolkit.facts.llm_args)
    assert "cache_transceiver_config.kv_transfer_timeout_ms" in msg and str(path) in msg
    assert settings(path, monkeypatch, "1.1").transceiver.kv_transfer_timeout_ms == 5000  # 1.1: may have it


def test_the_1_3_transceiver_fields_are_checked_as_tensorrt_llm_checks_them(tmp_path, monkeypatch):
    ct = {"backend": "NIXL", "max_tokens_in_buffer": 256, "transceiver_runtime": "PYTHON",
          "kv_transfer_poll_interval_ms": 100, "kv_cache_bounce_size_mb": 0, "enable_pipelined_transfer": True}
    path = write(tmp_path, {**GOOD, "enable_chunked_prefill": True, "cache_transceiver_config": ct})
    s = settings(path, monkeypatch, "1.3.0rc26")
    assert (s.transceiver.runtime, s.transceiver.pipelined) == ("PYTHON", True)
    assert "enable_pipelined_transfer" in refused(path, monkeypatch, "1.2")  # a 1.3 key
    path = write(tmp_path, {**GOOD, "cache_transceiver_config": ct})
    assert "enable_chunked_prefill is required" in refused(path, monkeypatch, "1.3.0rc26")
    path = write(tmp_path, {**GOOD, "enable_chunked_prefill": True,
                            "cache_transceiver_config": {**ct, "backend": "UCX"}})
    assert "only supports NIXL backend" in refused(path, monkeypatch, "1.3.0rc26")


def test_max_tokens_in_buffer_must_be_a_multiple_of_tokens_per_block(tmp_path, monkeypatch):
    opts = {**GOOD, "cache_transceiver_config": {"backend": "NIXL", "max_tokens_in_buffer": 100}}
    msg = refused(write(tmp_path, opts), monkeypatch)
    assert "cache_transceiver_config.max_tokens_in_buffer" in msg and "multiple of" in msg and "=32" in msg


def test_backend_must_exist_in_the_version_and_be_emulated(tmp_path, monkeypatch):
    path = write(tmp_path, {**GOOD, "cache_transceiver_config": {"backend": "MOONCAKE"}})
    assert "not accepted by TensorRT-LLM 1.1" in refused(path, monkeypatch, "1.1")
    assert "cannot emulate MOONCAKE" in refused(path, monkeypatch, "1.2")
    path = write(tmp_path, {**GOOD, "cache_transceiver_config": {"backend": "nixl"}})
    assert "'nixl' is not accepted" in refused(path, monkeypatch)


def test_no_cache_transceiver_config_means_aggregated(tmp_path, monkeypatch):
    opts = {k: v for k, v in GOOD.items() if k != "cache_transceiver_config"}
    assert not settings(write(tmp_path, opts), monkeypatch).disaggregated
    assert not settings(write(tmp_path, {**opts, "cache_transceiver_config": {"backend": None}}),
                        monkeypatch).disaggregated


def test_unknown_cli_flag_exits_2(tmp_path):
    proc = run_standin(MODEL, "--port", "19000", "--max_batch_szie", "4")
    assert proc.returncode == 2
    assert "no such option: --max_batch_szie" in proc.stderr and "--max_batch_size" in proc.stderr


def test_unknown_model_exits_2():
    proc = run_standin("no/such-model", "--port", "19000")
    assert proc.returncode == 2 and "model 'no/such-model' is not built in" in proc.stderr


def test_every_rendered_standin_file_is_accepted_by_every_version(tmp_path, monkeypatch):
    """What `tk render` writes for the stand-in recipe starts, for every line."""
    from tests.conftest import ROOT
    from toolkit.plan import build_plan
    from toolkit.recipe import load_recipe
    from toolkit.render import render, worker_command
    for line in ("1.0", "1.1", "1.2", "1.3.0rc23"):
        overrides = [f"trtllm_version={line}"]
        if line == "1.0":  # no kv_transfer_timeout_ms on 1.0
            overrides.append("kv_transfer.kv_transfer_timeout_ms=null")
        plan = build_plan(load_recipe(ROOT / "recipes" / "standin-2p2d.yaml", overrides))
        out = tmp_path / line
        render(plan, out)
        for role in ("ctx", "gen"):
            port = next(s.port for s in plan.servers if s.role == role)
            argv = worker_command(plan, role, port)[1:]  # drop the command itself
            monkeypatch.setenv("TK_STANDIN_TRTLLM_VERSION", line)
            s = worker_settings([*argv, "--extra_llm_api_options", str(out / f"{role}.yaml")])
            assert s.disaggregated and s.transceiver.max_tokens_in_buffer % s.tokens_per_block == 0
        resolved = out / "disagg.resolved.yaml"
        text = (out / "disagg.yaml").read_text()
        for i in range(plan.node_count):
            text = text.replace(f"<node{i}>", "127.0.0.1")
        resolved.write_text(text)
        cfg = parse_config(str(resolved))
        if plan.membership is None:
            assert len(cfg.ctx_urls) == 2 and len(cfg.gen_urls) == 2
        else:  # 1.2, 1.3: the workers register into the proxy's cluster storage; no static urls
            assert cfg.ctx_urls == [] and cfg.gen_urls == [] and cfg.cluster is not None
        with pytest.raises(ConfigError, match="placeholder"):
            parse_config(str(out / "disagg.yaml"))


# --- the proxy ---------------------------------------------------------------------------------------------

PROXY = {"hostname": "127.0.0.1", "port": 19001, "backend": "pytorch",
         "context_servers": {"num_instances": 1, "urls": ["127.0.0.1:19002"]},
         "generation_servers": {"num_instances": 1, "urls": ["127.0.0.1:19003"], "router": {"type": "load_balancing"}}}


def proxy_refused(tmp_path, cfg) -> str:
    path = write(tmp_path, cfg, "disagg.yaml")
    proc = run_standin("disaggregated", "-c", str(path), "-t", "1")
    assert proc.returncode == 2, proc.stderr
    assert str(path) in proc.stderr
    return proc.stderr


def test_proxy_urls_must_match_num_instances(tmp_path):
    err = proxy_refused(tmp_path, {**PROXY, "context_servers": {"num_instances": 2, "urls": ["127.0.0.1:19002"]}})
    assert "context_servers.urls" in err and "Number of hostnames (1) should be equal to the number of instances (2)" in err


def test_proxy_sections_are_required(tmp_path):
    cfg = {k: v for k, v in PROXY.items() if k != "generation_servers"}
    assert "At least one generation server must be provided" in proxy_refused(tmp_path, cfg)
    cfg = {k: v for k, v in PROXY.items() if k != "context_servers"}
    assert "At least one context server must be provided" in proxy_refused(tmp_path, cfg)


def test_proxy_refuses_what_trtllm_refuses(tmp_path):
    bad_router = {**PROXY, "generation_servers": {**PROXY["generation_servers"], "router": {"type": "fastest"}}}
    assert "Unsupported router type: fastest" in proxy_refused(tmp_path, bad_router)
    cond = {**PROXY, "conditional_disagg_config": {"max_local_prefill_length": 64}}
    assert "Generation router must be a KvCacheAwareRouter" in proxy_refused(tmp_path, cond)
    url = {**PROXY, "generation_servers": {"num_instances": 1, "urls": ["http://127.0.0.1:19003"]}}
    assert "is not host:port" in proxy_refused(tmp_path, url)
    conflict = {**PROXY, "max_batch_size": 4,
                "context_servers": {**PROXY["context_servers"], "max_batch_size": 8}}
    assert "Parameter max_batch_size is specified both in the top-level" in proxy_refused(tmp_path, conflict)


def test_proxy_exits_naming_the_workers_that_never_became_healthy(tmp_path):
    cfg = {**PROXY, "port": free_port(), "context_servers": {"num_instances": 1, "urls": [f"127.0.0.1:{free_port()}"]},
           "generation_servers": {"num_instances": 1, "urls": [f"127.0.0.1:{free_port()}"]}}
    path = write(tmp_path, cfg, "disagg.yaml")
    proc = run_standin("disaggregated", "-c", str(path), "-t", "1", "-r", "5", env=worker_env())
    assert proc.returncode == 1
    for url in cfg["context_servers"]["urls"] + cfg["generation_servers"]["urls"]:
        assert url in proc.stderr
    assert "Timeout waiting for context and generation servers to be ready" in proc.stderr


def test_proxy_refuses_unknown_flags():
    proc = run_standin("disaggregated", "-c", "x.yaml", "--workers", "2")
    assert proc.returncode == 2 and "no such option: --workers" in proc.stderr


# --- issue 15: the launcher's internal port (W2) and the config check before any server starts ----------------

def test_an_instance_given_a_taken_ipc_port_fails_like_the_launcher_leader(tmp_path):
    # TensorRT-LLM 1.2: TLLM_SPAWN_PROXY_PROCESS_IPC_PORT -> tcp://127.0.0.1:PORT, bound by the launcher's leader
    # before the HTTP server; a second instance given the same port cannot bind it.
    path = write(tmp_path, GOOD)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        http = free_port()
        proc = run_standin(MODEL, "--host", "127.0.0.1", "--port", str(http), "--extra_llm_api_options", str(path),
                           env=worker_env(TLLM_SPAWN_PROXY_PROCESS_IPC_PORT=taken), timeout=60)
    assert proc.returncode == 1
    assert "Address already in use" in proc.stderr and f"tcp://127.0.0.1:{taken}" in proc.stderr
    assert "TLLM_SPAWN_PROXY_PROCESS_IPC_PORT" in proc.stderr
    with socket.socket() as s:  # the HTTP port was never bound
        s.bind(("127.0.0.1", http))


def test_lines_without_the_knob_ignore_the_variable():
    from toolkit.facts import trtllm
    from toolkit.standin.worker import bind_launcher_ipc
    import os
    os.environ["TLLM_SPAWN_PROXY_PROCESS_IPC_PORT"] = "1"  # would fail to bind if it were read
    try:
        assert bind_launcher_ipc(trtllm.get("1.1")) is None
    finally:
        del os.environ["TLLM_SPAWN_PROXY_PROCESS_IPC_PORT"]


def test_check_config_names_the_file_key_and_version(tmp_path):
    good = write(tmp_path, GOOD)
    bad = write(tmp_path, {**GOOD, "cache_transceiver_config": {**GOOD["cache_transceiver_config"]}}, "gen.yaml")
    ok = run_standin("check-config", "--options", str(good), MODEL, "--options", str(bad), MODEL)
    assert ok.returncode == 0 and ok.stdout.startswith("OK: ctx.yaml, gen.yaml accepted"), ok.stdout
    # kv_transfer_timeout_ms is a 1.2 key: the 1.0 tables refuse it, as TensorRT-LLM 1.0's pydantic class does
    proc = run_standin("check-config", "--options", str(good), MODEL,
                       env=worker_env(TK_STANDIN_TRTLLM_VERSION="1.0"))
    assert proc.returncode == 1
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("FAIL: ") and "ctx.yaml" in line and "kv_transfer_timeout_ms" in line
    assert "TensorRT-LLM 1.0" in line
