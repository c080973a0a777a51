"""Spec: the stand-in reads its LLM-API options file as TensorRT-LLM would (toolkit.standin.options.read_options):
each refusal is one line naming the file and the key, the first problem in the file's order; nothing spawned."""

from __future__ import annotations

import pytest

from toolkit.facts import versions
from toolkit.standin.options import VERSION_ENV, ConfigError, read_options

UNKNOWN = "in the LLM-API options of TensorRT-LLM 1.2 (TensorRT-LLM forbids extra keys and fails at start-up)"


@pytest.mark.parametrize("line,text,message", [
    ("1.2", "{a: [", "not valid YAML (while parsing a flow node)"),
    ("1.2", "- 1\n", "expected a mapping of LLM-API options, got list"),
    ("1.2", "{1: 2}", "option name 1 is not a string"),
    ("1.2", "kv_cache_config: {1: 2}", "option name 1 is not a string"),
    ("1.2", "max_batch_sizes: 8", f"unknown key 'max_batch_sizes' {UNKNOWN}; did you mean 'max_batch_size'?"),
    ("1.2", "speculative_config: {decoding_type: MTP, whatever_key: 1}",
     f"unknown key 'speculative_config.whatever_key' {UNKNOWN}"),
    ("1.2", "cache_transceiver_config: {backend: FOO}",
     "cache_transceiver_config.backend: 'FOO' is not accepted by TensorRT-LLM 1.2 (use one of DEFAULT, MOONCAKE, "
     "MPI, NIXL, UCX)"),
    ("1.2", "kv_cache_config.tokens_per_block: 32", "kv_cache_config: expected a mapping"),
    ("1.2", "kv_cache_config: 3", "kv_cache_config: expected a mapping, got int"),
    ("1.2", "moe_config: []", "moe_config: expected a mapping, got list"),
    ("1.2", "backend: tensorrt", "backend: 'tensorrt' is not accepted by TensorRT-LLM 1.2 (use one of pytorch)"),
    ("1.0", "backend: _autodeploy", "backend: '_autodeploy'; the stand-in emulates the pytorch backend only"),
    # under a field that takes any keys, the keys are not looked up, but each must still be text
    ("1.2", "moe_config: {load_balancer: {anything: 1, 2: x}}", "option name 2 is not a string"),
    # the first problem in the file's order is the one named; the sections' kinds are checked after every key
    ("1.2", "max_batch_sizes: 8\nkv_cache_config: 3", f"unknown key 'max_batch_sizes' {UNKNOWN}; did you mean "
     "'max_batch_size'?"),
    ("1.2", "kv_cache_config: 3\nbackend: tensorrt",
     "backend: 'tensorrt' is not accepted by TensorRT-LLM 1.2 (use one of pytorch)"),
    ("1.0", "disagg_cluster: {cluster_uri: x, 1: y}", "option name 1 is not a string"),
])
def test_a_bad_options_file_is_refused_with_one_line_naming_the_file_and_key(tmp_path, monkeypatch, line, text,
                                                                             message):
    monkeypatch.setenv(VERSION_ENV, line)
    path = tmp_path / "ctx.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_options(path, versions.get(line))
    assert str(info.value) == f"{path}: {message}"


def test_an_options_file_that_cannot_be_read_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv(VERSION_ENV, "1.2")
    path = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError) as info:
        read_options(path, versions.get("1.2"))
    assert str(info.value) == f"{path}: cannot read the options file (No such file or directory)"


@pytest.mark.parametrize("line,text,options", [
    ("1.2", "", {}),
    ("1.2", "speculative_config: null\nbackend: null", {"speculative_config": None, "backend": None}),
    ("1.2", "moe_config: {load_balancer: 3}", {"moe_config": {"load_balancer": 3}}),
    # lines whose trtllm-serve pops disagg_cluster before the LLM args see it take any keys in it
    ("1.2", "disagg_cluster: {cluster_uri: x, 1: y}", {"disagg_cluster": {"cluster_uri": "x", 1: "y"}}),
])
def test_an_options_file_the_engine_accepts_is_read_as_written(tmp_path, monkeypatch, line, text, options):
    monkeypatch.setenv(VERSION_ENV, line)
    path = tmp_path / "ctx.yaml"
    path.write_text(text)
    assert read_options(path, versions.get(line)) == options
