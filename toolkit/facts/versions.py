"""TensorRT-LLM versions: the one grammar of the versions a recipe names, releases and image tags (defined in
facts.version_text, which facts.llm_args reads too, and used through here), and one row per release line with
everything line-specific in it.

A version is MAJOR.MINOR.PATCH with an optional pre-release (rcN) and post suffix, as tensorrt_llm/version.py writes
it ("1.0.0rc4", "1.2.0rc6.post1") and NGC tags its images (nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc3); the facts
are per MINOR line, and a recipe may name the line alone ("1.2").

The rows (``lines`` in the generated data, one per line in scripts/trtllm_sources.yaml with its evidence) hold what
no TensorRT-LLM file lists: the releases tk knows, transports, flags, membership storages, MTP layers, internal
ports; ``get(line)`` combines a row with the line's option, env and proxy facts (facts.llm_args). A new line is one
row in the sources file and regenerated data: nothing here names a line.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from toolkit.facts import llm_args
from toolkit.facts.models import KV_DTYPES
from toolkit.facts.version_text import ParsedVersion, line_key, parse_version, version_key  # noqa: F401 (callers')


class UnsupportedVersion(ValueError):
    pass


# --- container images -----------------------------------------------------------------------------------------------

# Images whose tag is the TensorRT-LLM version: NVIDIA's NGC release and devel images, under any registry or mirror
# that keeps the repository path. Other images (Dynamo's tensorrtllm-runtime, whose tag is the Dynamo version; a
# site's own build; a .sqsh file) do not say which TensorRT-LLM they hold.
IMAGE_REPOSITORIES = ("nvidia/tensorrt-llm/release", "nvidia/tensorrt-llm/devel")
_IMAGE_TAG = re.compile(r"v?(?P<version>[0-9][0-9A-Za-z.]*)", re.ASCII)


@dataclass(frozen=True)
class ImageVersion:
    """What tk can read from a container image reference about the TensorRT-LLM it holds."""

    image: str
    version: ParsedVersion | None  # None: not readable
    reason: str  # why not readable ("" when readable)


def image_version(image: str) -> ImageVersion:
    """Read the TensorRT-LLM version from an image reference as pyxis takes it (``REGISTRY/PATH:TAG``,
    ``REGISTRY#PATH:TAG``, optionally ``@sha256:...``). Only a tag of an image in ``IMAGE_REPOSITORIES`` is read; a
    digest alone names no version."""
    ref = image.strip()
    if ref.startswith(("/", "./", "../", "~")) or ref.endswith((".sqsh", ".squashfs")):
        return ImageVersion(image, None, "it is an image file, whose name need not say which TensorRT-LLM it holds")
    name, _, digest = ref.partition("@")
    name = name.replace("#", "/")  # enroot/pyxis spell the registry separator '#'
    last = name.rsplit("/", 1)[-1]
    repo, tag = (name.rsplit(":", 1) if ":" in last else (name, ""))
    if not any(repo == r or repo.endswith("/" + r) for r in IMAGE_REPOSITORIES):
        return ImageVersion(image, None, "it is not one of NVIDIA's TensorRT-LLM images "
                                         f"({', '.join(IMAGE_REPOSITORIES)}), whose tag is the version")
    if not tag:
        return ImageVersion(image, None, "it is pinned by digest only; a digest does not name a version"
                            if digest else "it has no tag (pyxis pulls :latest, which moves)")
    m = _IMAGE_TAG.fullmatch(tag)
    parsed = parse_version(m["version"]) if m else None
    if parsed is None:
        return ImageVersion(image, None, f"its tag {tag!r} is not a TensorRT-LLM version such as 1.2.0 or 1.2.0rc3")
    return ImageVersion(image, parsed, "")


# --- the lines ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrtllmVersion:
    """What one TensorRT-LLM release line accepts: its row plus the option, env and proxy facts of its snapshots."""

    line: str  # "1.2"
    release: str  # the release the row's facts were read for
    releases: tuple[str, str]  # the first and last release tk knows was published
    prerelease: bool  # no final release yet: never the default line
    llm_api_keys: frozenset[str]  # top-level keys of the --extra_llm_api_options YAML (pytorch backend)
    kv_cache_config_keys: frozenset[str]
    cache_transceiver_backends: tuple[str, ...]
    kv_dtypes: tuple[str, ...]  # the recipe's KV dtypes (facts.models.KV_DTYPES) the line takes
    disagg_keys: frozenset[str]  # top level of `trtllm-serve disaggregated -c` YAML
    disagg_server_keys: frozenset[str]  # keys tk writes under context_servers / generation_servers
    routers: tuple[str, ...]
    env_vars: frozenset[str]  # TRTLLM_* variables this version reads
    nixl_transports: tuple[str, ...]  # values of TRTLLM_NIXL_KVCACHE_BACKEND
    cluster_storages: tuple[str, ...]  # membership storages (disagg_cluster); () = no membership
    mtp_kv_layers: str  # "per_mtp_layer" (N layers for N MTP modules) or "one"
    internal_port_envs: tuple[str, ...]  # variables that give one instance its own internal port
    serve_config_flag: bool  # trtllm-serve takes --config for --extra_llm_api_options
    proxy_metadata_flag: bool  # trtllm-serve disaggregated takes -m
    notes: tuple[str, ...] = field(default_factory=tuple)
    changes: tuple[str, ...] = ()  # what a deployment of this line does differently from the line before's


def _rows() -> dict[str, dict]:
    return {row["line"]: row for row in llm_args.data()["lines"]}


def _known_releases(line: str) -> tuple[str, str]:
    """The first and last release of ``line`` tk knows was published: the row's, the last one widened to the newest
    of the line in the data's ``releases`` (each with its sdist's commit), so a release is added in one place."""
    first, last = _rows()[line]["releases"]
    listed = [r["release"] for r in llm_args.data().get("releases", ()) if (p := parse_version(r["release"]))
              and p.line == line]
    return first, max([last, *listed], key=version_key)


@llm_args.cleared_with_data
@functools.lru_cache(maxsize=None)
def _build(line: str) -> TrtllmVersion:
    row = _rows()[line]
    target = llm_args.Target(line)
    proxy = llm_args.proxy(line)
    env = llm_args.env_names(line)
    kv_dtypes = tuple(d for d in KV_DTYPES if not _refused(llm_args.value_status(target, "kv_cache_config.dtype", d)))
    return TrtllmVersion(
        line=line, release=row["release"], releases=_known_releases(line), prerelease=row["prerelease"],
        llm_api_keys=llm_args.section_keys(line, ""), kv_cache_config_keys=llm_args.section_keys(line, "kv_cache_config"),
        cache_transceiver_backends=llm_args.line_choices(line, "cache_transceiver_config.backend"), kv_dtypes=kv_dtypes,
        # tk writes `backend: pytorch` at the top of the proxy config: extract_disagg_cfg takes unknown top-level keys
        # as **kwargs and copies them into both server sections (disagg_utils.py @ 0228a712), so it is accepted.
        disagg_keys=frozenset(proxy["top"]) | {"backend"}, disagg_server_keys=frozenset(proxy["server"]),
        routers=tuple(proxy["routers"]), env_vars=env["cpp"] | env["python"],
        nixl_transports=tuple(row["nixl_transports"]), cluster_storages=tuple(row["cluster_storages"]),
        mtp_kv_layers=row["mtp_kv_layers"], internal_port_envs=tuple(row["internal_port_envs"]),
        serve_config_flag=row["serve_config_flag"], proxy_metadata_flag=row["proxy_metadata_flag"],
        notes=tuple(row["notes"]), changes=tuple(row["changes"]))


def _refused(st) -> bool:
    return st is not None and st.verdict is llm_args.Verdict.ABSENT


def supported() -> tuple[str, ...]:
    """Every line tk has facts for, oldest first."""
    return tuple(sorted(_rows(), key=line_key))


def latest() -> str:
    """The newest release line (not a pre-release line): what a recipe naming no version renders for."""
    return max((line for line, row in _rows().items() if not row["prerelease"]), key=line_key)


def prerelease_lines() -> tuple[str, ...]:
    return tuple(line for line in supported() if _rows()[line]["prerelease"])


def __getattr__(name: str):
    """SUPPORTED, LATEST and PRERELEASE_LINES, read from the data when first asked for."""
    values = {"SUPPORTED": supported, "LATEST": latest, "PRERELEASE_LINES": prerelease_lines}
    if name in values:
        return values[name]()
    raise AttributeError(name)


def get(text) -> TrtllmVersion:
    """The row of a release line ("1.2"), a release or patch release ("1.2.0", "1.2.1") or a pre-release
    ("1.2.0rc3")."""
    parsed = parse_version(str(text))
    line = parsed.line if parsed else str(text)
    if line not in _rows():
        raise UnsupportedVersion(
            f"TensorRT-LLM {text} is not supported; supported release lines: {', '.join(supported())}")
    return _build(line)


def unknown_release(text: str) -> str | None:
    """Why ``text`` (a release, not a line alone) is not a release tk knows of its line, or None."""
    parsed = parse_version(text)
    if parsed is None or parsed.line_only or parsed.line not in _rows():
        return None
    first, last = _known_releases(parsed.line)
    if version_key(first) <= parsed.key <= version_key(last):
        return None
    return (f"TensorRT-LLM has no release {text} that tk knows of: the {parsed.line} line's releases it knows are "
            f"{first} .. {last}; tk checks the recipe against the {parsed.line} line's facts")


def mtp_kv_layers(version: TrtllmVersion, mtp_layers: int) -> int:
    """KV layers TensorRT-LLM allocates beyond the model's own for ``mtp_layers`` MTP draft tokens: the model's
    layers plus get_num_spec_layers(spec_config) (tensorrt_llm/_torch/speculative/utils.py), on the last pipeline
    rank, so the context servers send and the generation servers receive them too. The row says which count."""
    if not mtp_layers:
        return 0
    if version.mtp_kv_layers == "per_mtp_layer":
        return mtp_layers
    if version.mtp_kv_layers == "one":
        return 1
    raise AssertionError(version.mtp_kv_layers)
