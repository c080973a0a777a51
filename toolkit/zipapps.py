"""Programs that run on the nodes, shipped as one file: a deterministic zipapp of a standard-library package.

    archive_bytes("orchestrator", "from orchestrator.job import main")  -> bytes of job.pyz

Whoever ships one writes the bytes: the render with its files, the validation through toolkit.runtime.files.

The package is found through importlib, so a wheel install and a checkout ship the same thing. The archive is
deterministic: entries sorted, fixed timestamps and modes, stored uncompressed, no __pycache__. Used for the
validation agent (agent.pyz: toolkit/validate/ship.py) and the job's orchestrator (job.pyz: toolkit/render).
"""

from __future__ import annotations

import io
import zipapp
import zipfile
from importlib import resources

INTERPRETER = "/usr/bin/env python3"
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry


def package_sources(package: str) -> dict[str, bytes]:
    """{archive name: bytes} of every .py file of the installed package, subpackages included."""
    out: dict[str, bytes] = {}

    def walk(node, prefix: str) -> None:
        for child in node.iterdir():
            if child.is_dir():
                if child.name != "__pycache__":
                    walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith(".py"):
                out[f"{prefix}{child.name}"] = child.read_bytes()

    walk(resources.files(package), f"{package}/")
    return out


def _main(main_import: str) -> bytes:
    """The archive's own __main__ (sys.path[0] is the archive, so the package inside it is what runs)."""
    return f"import sys\n\n{main_import}\n\nsys.exit(main())\n".encode()


def _entry(name: str, data: bytes, zf: zipfile.ZipFile) -> None:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.external_attr = 0o100644 << 16  # a regular file, rw-r--r--
    info.create_system = 3  # unix, whatever builds it
    zf.writestr(info, data, compress_type=zipfile.ZIP_STORED)


def archive_bytes(package: str, main_import: str) -> bytes:
    """The zipapp (shebang + zip) of package, whose __main__ runs `main` from main_import."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        files = {"__main__.py": _main(main_import), **package_sources(package)}
        for name in sorted(files):
            _entry(name, files[name], zf)
    buf.seek(0)
    out = io.BytesIO()
    zipapp.create_archive(buf, out, interpreter=INTERPRETER)
    return out.getvalue()
