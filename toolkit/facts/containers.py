"""Container image references as pyxis and enroot read them: what `srun --container-image=` must be given.

Facts, from the source (read at the commits named):

- pyxis (NVIDIA/pyxis@107519944221822ea1dace4db8e7234b2eaa4cd5): `--container-image` is
  "[USER@][REGISTRY#]IMAGE[:TAG]|PATH" (args.c). An image that starts with "." or "/" (``strspn(image, "./") >
  0``) is a squashfs file, used as it is; anything else is handed to `enroot import` as ``docker://IMAGE``
  unless it already starts with ``docker://`` or ``dockerd://`` (pyxis_slurmstepd.c, ``enroot_container_create``
  and the squashfs test before it). pyxis never rewrites the reference itself.
- enroot before 4.0 (NVIDIA/enroot tag v3.5.0, c7dc4a6b66e817af5ceb7d5315850696067b3f80, src/docker.sh): the
  URI is ``docker://[USER@][REGISTRY#]IMAGE[:TAG]``; without ``#`` the registry is Docker Hub, and
  ``nvcr.io/nvidia/...`` is re-read as registry ``nvcr.io`` only when ~/.config/enroot/.credentials has a
  ``machine nvcr.io`` line ("if the registry has been mistakenly specified as part of the image"). NGC's
  TensorRT-LLM release images are public, so users without that line pull ``nvcr.io/nvidia/...`` from Docker
  Hub and fail.
- enroot 4.0 and later (commit f29a45cfc4af3a580bab4fc1873260c162953384, "Improve handling of docker-style
  URI", first in v4.0.0; src/docker.sh ``docker::_parse_uri`` at 8ea147d337da60cb1c557140f3a85cdf0d620968)
  also take Docker's own spelling: a first path component with a "." or a ":" is a registry.

So the ``REGISTRY#IMAGE`` spelling is read the same way by every enroot; tk accepts both spellings in a recipe
and renders that one (``pyxis_image``). Docker treats ``localhost`` as a registry too; tk does the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SQUASHFS_SUFFIXES = (".sqsh", ".squashfs", ".sqfs")
_DIGEST = re.compile(r"@sha256:[0-9A-Za-z]+$", re.ASCII)


@dataclass(frozen=True)
class PyxisImage:
    """An image reference as the recipe wrote it, as tk renders it for pyxis, and what a user should know."""

    written: str
    rendered: str
    note: str  # why the rendered form differs ("" when it does not)
    warning: str  # a reference pyxis will most likely not read as meant ("" when none)


def is_file_reference(image: str) -> bool:
    """pyxis takes it as a squashfs path: it starts with '.' or '/' (pyxis_slurmstepd.c, strspn(image, "./"))."""
    return image[:1] in (".", "/")


def _registry_form(ref: str) -> tuple[str, bool]:
    """``[USER@]REGISTRY/IMAGE[:TAG][@DIGEST]`` -> ``[USER@]REGISTRY#IMAGE...``; (text, whether it changed)."""
    digest = ""
    m = _DIGEST.search(ref)
    if m:
        ref, digest = ref[:m.start()], m.group(0)
    user, at, rest = ref.rpartition("@")
    if "#" in rest or "/" not in rest:
        return ref + digest, False
    first, _, image = rest.partition("/")
    if "." in first or ":" in first or first == "localhost":
        return f"{user}{at}{first}#{image}{digest}", True
    return ref + digest, False


def pyxis_image(image: str) -> PyxisImage:
    """The reference to give `srun --container-image=` for the image a recipe names (see the module docstring)."""
    text = image.strip()
    if is_file_reference(text):
        warning = ""
        if not text.startswith("/"):
            warning = (f"cluster.container_image {text!r} is a relative path: pyxis opens it from each step's "
                       "working directory (the run directory); give an absolute path")
        return PyxisImage(image, text, "", warning)
    if text.startswith("dockerd://"):
        return PyxisImage(image, text, "", "")
    scheme = "docker://" if text.startswith("docker://") else ""
    rendered, changed = _registry_form(text[len(scheme):])
    rendered = scheme + rendered
    note = ""
    if changed:
        note = (f"the recipe's {text!r} in enroot's REGISTRY#IMAGE spelling, which every enroot reads; enroot "
                "before 4.0 reads REGISTRY/IMAGE as a Docker Hub image")
    warning = ""
    if text.startswith("~") or (not scheme and text.endswith(SQUASHFS_SUFFIXES)):
        warning = (f"cluster.container_image {text!r} looks like an image file, but pyxis reads only paths that "
                   "start with '/' or '.' as files and would pull it from a registry; give an absolute path")
    return PyxisImage(image, rendered, note, warning)


__all__ = ["PyxisImage", "is_file_reference", "pyxis_image"]
