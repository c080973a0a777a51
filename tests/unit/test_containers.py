"""Spec: container images as pyxis needs them. A recipe may write a registry image either way
(nvcr.io/nvidia/... or enroot's nvcr.io#nvidia/...); tk renders enroot's REGISTRY#IMAGE form, which every enroot
reads (before 4.0 enroot reads REGISTRY/IMAGE as a Docker Hub image), and a squashfs path as it is.
Sources: toolkit/facts/containers.py (pyxis args.c and pyxis_slurmstepd.c, enroot src/docker.sh)."""

from __future__ import annotations

import pytest

from tests.conftest import RECIPES, ROOT
from tests.unit.helpers import BASE, plan_of
from toolkit.doctor.signatures import BY_ID
from toolkit.facts.containers import pyxis_image
from toolkit.render import render_files

SPELLINGS = [
    # (as written, as rendered)
    ("nvcr.io/nvidia/tensorrt-llm/release:1.2.0", "nvcr.io#nvidia/tensorrt-llm/release:1.2.0"),
    ("nvcr.io#nvidia/tensorrt-llm/release:1.2.0", "nvcr.io#nvidia/tensorrt-llm/release:1.2.0"),
    ("nvcr.io/nvidia/tensorrt-llm/release:1.2.0@sha256:" + "a" * 64,
     "nvcr.io#nvidia/tensorrt-llm/release:1.2.0@sha256:" + "a" * 64),
    ("$oauthtoken@nvcr.io/nvidia/tensorrt-llm/release:1.2.0", "$oauthtoken@nvcr.io#nvidia/tensorrt-llm/release:1.2.0"),
    ("registry.example.com:5000/team/trtllm:1.2.0", "registry.example.com:5000#team/trtllm:1.2.0"),
    ("localhost/trtllm:dev", "localhost#trtllm:dev"),
    ("docker://nvcr.io/nvidia/tensorrt-llm/release:1.2.0", "docker://nvcr.io#nvidia/tensorrt-llm/release:1.2.0"),
    # Docker Hub images and local files: as written
    ("nvidia/cuda:12.4.1-base-ubuntu22.04", "nvidia/cuda:12.4.1-base-ubuntu22.04"),
    ("ubuntu:24.04", "ubuntu:24.04"),
    ("/lustre/images/trtllm-1.2.0.sqsh", "/lustre/images/trtllm-1.2.0.sqsh"),
    ("./trtllm.sqsh", "./trtllm.sqsh"),
    ("dockerd://trtllm:local", "dockerd://trtllm:local"),
]


@pytest.mark.parametrize("written,rendered", SPELLINGS)
def test_an_image_is_rendered_in_the_spelling_pyxis_needs(written, rendered):
    image = pyxis_image(written)
    assert image.rendered == rendered
    assert bool(image.note) == (written != rendered)


@pytest.mark.parametrize("written", ["trtllm.sqsh", "images/trtllm.sqsh", "~/trtllm.sqsh"])
def test_an_image_file_pyxis_would_pull_from_a_registry_is_warned_about(written):
    image = pyxis_image(written)
    assert image.rendered == written and "pulls" not in image.warning
    assert "absolute path" in image.warning


def test_a_relative_squashfs_path_is_used_as_written_with_a_warning():
    assert "relative path" in pyxis_image("./trtllm.sqsh").warning
    assert pyxis_image("/images/trtllm.sqsh").warning == ""


def test_the_batch_script_gets_the_rendered_spelling_and_the_plan_says_why():
    plan = plan_of(BASE, "cluster.container_image=nvcr.io/nvidia/tensorrt-llm/release:1.2.0")
    assert plan.slurm.container_image == "nvcr.io#nvidia/tensorrt-llm/release:1.2.0"
    assert "Docker Hub" in plan.slurm.image_note
    job = render_files(plan)["job.json"]  # the job's srun flags: what pyxis is given
    assert "--container-image=nvcr.io#nvidia/tensorrt-llm/release:1.2.0" in job
    assert "nvcr.io/nvidia" not in job
    # the version is read from either spelling alike
    assert plan.trtllm_version == "1.2"
    assert plan_of(BASE, "cluster.container_image=nvcr.io#nvidia/tensorrt-llm/release:1.0.0").trtllm_version == "1.0"


def test_an_image_file_pyxis_cannot_open_is_a_plan_warning():
    plan = plan_of(BASE, "cluster.container_image=images/trtllm.sqsh", "trtllm_version=1.2")
    assert any("images/trtllm.sqsh" in w and "absolute path" in w for w in plan.warnings)


def test_shipped_recipes_and_docs_write_the_registry_with_a_hash():
    for path in RECIPES:
        assert "nvcr.io/nvidia" not in path.read_text(), path.name
    for doc in (ROOT / "README.md", ROOT / "docs" / "recipe.md"):
        for line in doc.read_text().splitlines():
            if "container_image" in line and "nvcr.io" in line:
                assert "nvcr.io#" in line, (doc.name, line)


def test_doctor_s_pyxis_signature_teaches_the_spelling():
    fix = BY_ID["container-import"].fix
    assert "nvcr.io#nvidia/tensorrt-llm/release" in fix and "Docker Hub" in fix
