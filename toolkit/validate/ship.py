"""Ship the agent to the nodes as one file: a zipapp of the installed `validation` package (toolkit/zipapps.py).

    python3 RUN_DIR/agent.pyz RUN_DIR/params.json AGENT_ID

The nodes need only Python, numpy and NIXL (the serving container), not the toolkit.
"""

from __future__ import annotations

from pathlib import Path

from toolkit.runtime import files
from toolkit.zipapps import archive_bytes, package_sources  # noqa: F401 (package_sources: re-exported)

PACKAGE = "validation"
ARCHIVE = "agent.pyz"
MAIN_IMPORT = "from validation.__main__ import main"


def build_agent_archive(dest: Path | str) -> Path:
    """Write the agent archive; dest is a directory (then dest/agent.pyz) or the archive's path."""
    dest = Path(dest)
    return files.write_regular_atomically(dest / ARCHIVE if dest.is_dir() else dest,
                                          archive_bytes(PACKAGE, MAIN_IMPORT), 0o755, sync=False)
