"""Ship the agent to the nodes as one file: a zipapp of the installed `validation` package.

    python3 RUN_DIR/agent.pyz RUN_DIR/params.json AGENT_ID

The nodes need only Python, numpy and NIXL (the serving container), not the toolkit. The package is
found through importlib, so a wheel install and a checkout ship the same thing. The archive is
deterministic: entries sorted, fixed timestamps and modes, stored uncompressed, no __pycache__.
"""

from __future__ import annotations

import io
import zipapp
import zipfile
from importlib import resources
from pathlib import Path

PACKAGE = "validation"
ARCHIVE = "agent.pyz"
INTERPRETER = "/usr/bin/env python3"
# The archive's own __main__ (sys.path[0] is the archive, so the package inside it is what runs).
MAIN = (b"import sys\n\nfrom validation.__main__ import main\n\nsys.exit(main())\n")
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry


def package_sources(package: str = PACKAGE) -> dict[str, bytes]:
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


def _entry(name: str, data: bytes, zf: zipfile.ZipFile) -> None:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.external_attr = 0o100644 << 16  # a regular file, rw-r--r--
    info.create_system = 3  # unix, whatever builds it
    zf.writestr(info, data, compress_type=zipfile.ZIP_STORED)


def build_agent_archive(dest: Path | str) -> Path:
    """Write the agent archive; dest is a directory (then dest/agent.pyz) or the archive's path."""
    dest = Path(dest)
    target = dest / ARCHIVE if dest.is_dir() else dest
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        files = {"__main__.py": MAIN, **package_sources()}
        for name in sorted(files):
            _entry(name, files[name], zf)
    buf.seek(0)
    zipapp.create_archive(buf, str(target), interpreter=INTERPRETER)  # str: zipapp marks only a str executable
    return target
