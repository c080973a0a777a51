"""The recipe format, schema_version 1.

A recipe says what to deploy; everything tk can derive (buffer sizes, node counts, ports,
environment) it derives in the plan stage. ``None`` on a field means "let tk derive it".
"""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from toolkit.facts import trtllm
from toolkit.facts.hardware import GPUS, TRANSPORTS
from toolkit.facts.trtllm import ROUTERS

# Names end up in file names, Slurm job names and log paths: keep them boring.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Environment variable names tk lets a recipe set.
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
TIME_LIMIT = re.compile(r"^(\d+-)?\d{1,3}:\d{2}(:\d{2})?$|^\d+$")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)


def _check_env(env) -> dict[str, str]:
    """Environment values are strings; numbers written unquoted in YAML (`X: 1`) are taken as written."""
    if not isinstance(env, dict):
        raise ValueError("must be a mapping of NAME: value")
    env = dict(env)
    for name, value in env.items():
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ValueError(f"value of {name} must be a string; quote it, e.g. {name}: \"1\"")
        env[name] = value = str(value)
        if not ENV_NAME.match(name):
            raise ValueError(f"environment variable name {name!r} is not of the form [A-Z_][A-Z0-9_]*")
        if "\x00" in value or "\n" in value:
            raise ValueError(f"value of {name} contains a newline or NUL byte")
    return env


class ClusterSpec(Section):
    """Where the deployment runs."""

    gpus_per_node: int = Field(ge=1, le=72)
    gpu: Literal[GPUS] = "H100"  # type: ignore[valid-type]
    partition: Optional[str] = None
    account: Optional[str] = None
    time_limit: str = "02:00:00"
    container_image: Optional[str] = None
    container_mounts: list[str] = Field(default_factory=list)
    worker_base_port: int = Field(8336, ge=1024, le=65000)
    share_nodes: bool = False  # generation servers may use GPUs left free on context nodes
    pending_timeout_s: int = Field(1800, ge=1, le=7 * 86400)
    startup_timeout_s: int = Field(1800, ge=1, le=86400)

    @field_validator("time_limit")
    @classmethod
    def _time_limit(cls, v: str) -> str:
        if not TIME_LIMIT.match(v):
            raise ValueError("time_limit must be Slurm's [D-]HH:MM[:SS] or minutes, e.g. 02:00:00")
        return v

    @field_validator("partition", "account")
    @classmethod
    def _slurm_name(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.match(r"^[A-Za-z0-9_.-]+$", v):
            raise ValueError("must contain only letters, digits, '_', '.' and '-'")
        return v

    @field_validator("container_mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for m in v:
            parts = m.split(":")
            if len(parts) not in (2, 3) or not all(parts[:2]) or "," in m:
                raise ValueError(f"container mount {m!r} must be SRC:DST[:FLAGS] with no commas")
        return v


class RoleSpec(Section):
    """One server role (context or generation): how many instances, how each is parallelised."""

    instances: int = Field(1, ge=1, le=512)
    tp: int = Field(1, ge=1, le=256)
    pp: int = Field(1, ge=1, le=64)
    ep: Optional[int] = Field(None, ge=1, le=1024)
    attention_dp: bool = False
    max_batch_size: Optional[int] = Field(None, ge=1, le=65536)
    max_num_tokens: Optional[int] = Field(None, ge=1, le=1 << 20)
    free_gpu_memory_fraction: Optional[float] = Field(None, gt=0.0, le=1.0)
    cuda_graph: Optional[bool] = None
    model_path: Optional[str] = None
    quantization: Optional[str] = None
    extra_options: dict = Field(default_factory=dict)
    extra_serve_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    _env = field_validator("env", mode="before")(classmethod(lambda cls, v: _check_env(v)))


class KvTransferSpec(Section):
    """How the KV cache moves from context to generation servers."""

    backend: Literal["DEFAULT", "UCX", "NIXL", "MPI", "MOONCAKE"] = "NIXL"
    transport: Literal[TRANSPORTS] = "infiniband"  # type: ignore[valid-type]
    tokens_per_block: int = Field(32, ge=1, le=1024)
    dtype: Literal["auto", "fp8", "nvfp4"] = "auto"
    max_tokens_in_buffer: Optional[int] = Field(None, ge=1)
    kv_transfer_timeout_ms: Optional[int] = Field(60000, ge=1)
    net_devices: Optional[str] = None
    env: dict[str, str] = Field(default_factory=dict)

    _env = field_validator("env", mode="before")(classmethod(lambda cls, v: _check_env(v)))

    @field_validator("net_devices")
    @classmethod
    def _net_devices(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.match(r"^[A-Za-z0-9_.:,-]+$", v):
            raise ValueError("net_devices must look like mlx5_0:1,mlx5_1:1")
        return v


class TrafficSpec(Section):
    """The requests the deployment is sized for."""

    max_input_len: int = Field(4096, ge=1, le=1 << 21)
    max_output_len: int = Field(1024, ge=1, le=1 << 20)
    prefix_len: int = Field(0, ge=0, le=1 << 21)
    typical_input_len: Optional[int] = Field(None, ge=1)


class SpeculativeSpec(Section):
    """Speculative decoding; applied identically to both roles."""

    mtp_layers: int = Field(0, ge=0, le=8)


class ProxySpec(Section):
    """The `trtllm-serve disaggregated` proxy."""

    port: int = Field(8000, ge=1024, le=65535)
    context_router: Literal[ROUTERS] = "round_robin"  # type: ignore[valid-type]
    generation_router: Literal[ROUTERS] = "round_robin"  # type: ignore[valid-type]
    conditional_max_local_prefill_length: Optional[int] = Field(None, ge=0)
    server_start_timeout_s: int = Field(1800, ge=1)
    request_timeout_s: int = Field(7200, ge=1)
    max_retries: int = Field(1, ge=0, le=16)


class Recipe(Section):
    """A whole recipe file."""

    schema_version: Literal[1]
    name: str
    description: str = ""
    engine: Literal["trtllm", "standin"] = "trtllm"
    model: str
    model_path: Optional[str] = None
    quantization: Optional[str] = None
    trtllm_version: str = trtllm.LATEST
    cluster: ClusterSpec
    context: RoleSpec = Field(default_factory=RoleSpec)
    generation: RoleSpec = Field(default_factory=RoleSpec)
    kv_transfer: KvTransferSpec = Field(default_factory=KvTransferSpec)
    traffic: TrafficSpec = Field(default_factory=TrafficSpec)
    speculative: SpeculativeSpec = Field(default_factory=SpeculativeSpec)
    proxy: ProxySpec = Field(default_factory=ProxySpec)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not SAFE_NAME.match(v):
            raise ValueError("name must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return v

    @field_validator("trtllm_version", mode="before")
    @classmethod
    def _version(cls, v):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = str(v)  # `trtllm_version: 1.2` is a YAML float; accept it as written
        if not isinstance(v, str):
            raise ValueError("trtllm_version must be a string such as \"1.2\"")
        trtllm.get(v)  # raises with the supported list
        return v
