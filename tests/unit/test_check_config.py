"""Spec: check_config.py (copied into every run directory) asks TensorRT-LLM's own classes, names the key and the
version when they refuse a file, and says it skipped when tensorrt_llm is not importable.

The TensorRT-LLM package here is a stand-in module tree with the same names (tensorrt_llm.llmapi.llm_args:
update_llm_args_with_extra_dict / TorchLlmArgs, tensorrt_llm.llmapi.disagg_utils.parse_disagg_config_file),
pydantic models with extra="forbid" as upstream has them."""

import subprocess
import sys
import textwrap

from tests.conftest import ROOT
from toolkit.facts import trtllm

SCRIPT = ROOT / "templates" / "check_config.py"

LLM_ARGS = textwrap.dedent('''
    from typing import Optional
    from pydantic import BaseModel, ConfigDict

    class StrictBaseModel(BaseModel):
        model_config = ConfigDict(extra="forbid")

    class CacheTransceiverConfig(StrictBaseModel):
        backend: Optional[str] = None
        max_tokens_in_buffer: Optional[int] = None

    class KvCacheConfig(StrictBaseModel):
        free_gpu_memory_fraction: Optional[float] = None
        dtype: str = "auto"

    class TorchLlmArgs(StrictBaseModel):
        model: str
        backend: Optional[str] = None
        skip_tokenizer_init: bool = False
        max_batch_size: Optional[int] = None
        kv_cache_config: KvCacheConfig = KvCacheConfig()
        cache_transceiver_config: Optional[CacheTransceiverConfig] = None

    def update_llm_args_with_extra_dict(llm_args, llm_args_dict, extra_llm_api_options=None):
        for name, cls in (("kv_cache_config", KvCacheConfig), ("cache_transceiver_config", CacheTransceiverConfig)):
            if name in llm_args_dict:
                llm_args_dict[name] = cls(**llm_args_dict[name])
        return llm_args | llm_args_dict
''')
DISAGG = textwrap.dedent('''
    import yaml

    def parse_disagg_config_file(path):
        cfg = yaml.safe_load(open(path))
        for url in cfg["context_servers"]["urls"]:
            int(url.rsplit(":", 1)[1])
        return cfg
''')


def fake_trtllm(root, version="1.0.0"):
    pkg = root / "tensorrt_llm"
    (pkg / "llmapi").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "llmapi" / "__init__.py").write_text("")
    (pkg / "llmapi" / "llm_args.py").write_text(LLM_ARGS)
    (pkg / "llmapi" / "disagg_utils.py").write_text(DISAGG)
    dist = root / f"tensorrt_llm-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {version}\n")
    return root


def check(tmp_path, options: str, disagg: str = "context_servers: {urls: ['node0:8336']}\n", path=None):
    (tmp_path / "ctx.yaml").write_text(options)
    (tmp_path / "disagg.yaml").write_text(disagg)
    argv = [sys.executable, str(SCRIPT), "--engine", "trtllm", "--line", "1.0"]
    for flag, specs in (("--merge", trtllm.CONFIG_CHECK_MERGE), ("--llm-args", trtllm.CONFIG_CHECK_LLM_ARGS),
                        ("--disagg-parser", trtllm.CONFIG_CHECK_DISAGG)):
        for spec in specs:
            argv += [flag, spec]
    argv += ["--options", str(tmp_path / "ctx.yaml"), "/models/x", "--disagg", str(tmp_path / "disagg.yaml")]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(path) if path else ""}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    return proc.returncode, proc.stdout.strip().splitlines()[-1]


def test_accepted_files_name_the_version(tmp_path):
    rc, line = check(tmp_path, "max_batch_size: 8\nkv_cache_config: {dtype: fp8}\n",
                     path=fake_trtllm(tmp_path / "site"))
    assert rc == 0 and line == "OK: ctx.yaml, disagg.yaml accepted by TensorRT-LLM 1.0.0", line


def test_an_unknown_nested_key_fails_naming_the_key_and_the_version(tmp_path):
    rc, line = check(tmp_path, "cache_transceiver_config: {backend: NIXL, kv_transfer_timeout_ms: 60000}\n",
                     path=fake_trtllm(tmp_path / "site"))
    assert rc == 1 and line.startswith("FAIL: ctx.yaml: cache_transceiver_config.kv_transfer_timeout_ms: Extra inputs")
    assert "(TensorRT-LLM 1.0.0, TorchLlmArgs)" in line


def test_an_unknown_top_level_key_fails(tmp_path):
    rc, line = check(tmp_path, "max_batch_sizes: 8\n", path=fake_trtllm(tmp_path / "site"))
    assert rc == 1 and "ctx.yaml: max_batch_sizes: Extra inputs are not permitted" in line


def test_a_bad_proxy_config_fails(tmp_path):
    rc, line = check(tmp_path, "{}\n", "context_servers: {urls: ['node0:http']}\n", path=fake_trtllm(tmp_path / "site"))
    assert rc == 1 and line.startswith("FAIL: disagg.yaml: ValueError") and "parse_disagg_config_file" in line


def test_without_tensorrt_llm_it_says_it_skipped(tmp_path):
    rc, line = check(tmp_path, "max_batch_size: 8\n")
    assert rc == 3 and line.startswith("SKIP: tensorrt_llm is not importable")
