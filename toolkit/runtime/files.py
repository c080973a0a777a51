"""Reading files tk did not necessarily write, and writing files a user named, safely.

Reading (every run.json, index line, manifest, provenance record, report, log and --measured file):
  - bounded in size (the caller's limit; a longer file is refused, or only its tail is read where that is the
    point, as for logs), in nesting depth (JSON deeper than MAX_DEPTH is refused before it is parsed: a file of
    100,000 '[' is a message, not a RecursionError), and in time (only regular files are opened, non-blocking:
    a FIFO or a device named run.json never blocks a listing);
  - contained: `inside(root, relative)` opens a path under a directory only if, symlinks resolved, it is still
    under that directory, and never follows a symlink in its last component;
  - a bad file raises FileProblem (a ValueError) whose text names the file and what is wrong with it.

Writing a path the user named (`tk size -o`): only ever a regular file, written whole under a temporary name
beside it and renamed over it; a device, a FIFO, a socket, a directory or a symlink at that path is refused, so
nothing but what the user named is ever replaced (`-o /dev/null` as root stays a device).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from toolkit.errors import TkError

MAX_DEPTH = 64  # JSON nesting tk ever writes is a handful of levels; TensorRT-LLM's own configs stay under 10


class FileProblem(TkError, ValueError):
    """A file that cannot be used: its text names the file and the reason (a TkError: a message, exit 1)."""


def depth(doc) -> int:
    """The deepest nesting of lists and dicts in a parsed document; iterative (no recursion), linear in its size."""
    deepest = 0
    stack = [(doc, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        elif not isinstance(node, list):
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in node if isinstance(child, (list, dict)))
    return deepest


def loads(text: str, *, what: str = "JSON", max_depth: int = MAX_DEPTH):
    """json.loads (linear), refusing (FileProblem) a document nested deeper than max_depth: the parser's own
    RecursionError on very deep input becomes that message too, so no reader of it ever recurses that deep."""
    try:
        doc = json.loads(text)
    except RecursionError:
        raise FileProblem(f"{what}: nested deeper than {max_depth} levels; not a file tk wrote") from None
    except ValueError as exc:
        raise FileProblem(f"{what}: not valid JSON ({str(exc)[:200]})") from None
    if depth(doc) > max_depth:
        raise FileProblem(f"{what}: nested deeper than {max_depth} levels; not a file tk wrote")
    return doc


def _open_regular(path: Path, *, follow: bool = True) -> int:
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == getattr(os, "ELOOP", 40) and not follow:
            raise FileProblem(f"{path}: a symbolic link; tk reads only regular files here") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileProblem(f"{path}: not a regular file; tk reads only regular files here")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str | os.PathLike, limit: int, *, follow: bool = True, longer: str = "refuse") -> bytes:
    """At most `limit` bytes of a regular file. A longer file is a FileProblem (longer="refuse"), or its first
    (longer="head") or last (longer="tail") `limit` bytes. OSError for a missing or unreadable file; FileProblem
    for a FIFO, a device, a directory (or, follow=False, a symlink)."""
    path = Path(path)
    fd = _open_regular(path, follow=follow)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit and longer == "tail":
            f.seek(size - limit)
        data = f.read(limit + 1)
    if len(data) > limit or size > limit:
        if longer == "refuse":
            raise FileProblem(f"{path}: {max(size, len(data))} bytes, more than the {limit} tk reads from such a "
                              "file")
        data = data[-limit:] if longer == "tail" else data[:limit]
    return data


def read_text(path: str | os.PathLike, limit: int, **kw) -> str:
    return read_bytes(path, limit, **kw).decode(errors="replace")


def read_json(path: str | os.PathLike, limit: int, *, max_depth: int = MAX_DEPTH, follow: bool = True):
    """A JSON file, bounded in size and depth (FileProblem naming the file otherwise; OSError if unreadable)."""
    return loads(read_text(path, limit, follow=follow), what=str(path), max_depth=max_depth)


def inside(root: str | os.PathLike, relative: str | os.PathLike) -> Path:
    """root/relative, if it stays inside root once every symlink is resolved; FileProblem otherwise. The path
    need not exist (its existing part is resolved)."""
    root_real = Path(os.path.realpath(root))
    target = Path(os.path.realpath(Path(root) / relative))
    if target != root_real and root_real not in target.parents:
        raise FileProblem(f"{Path(root) / relative}: leads outside {root} (a symbolic link or '..'); tk does not "
                          "read or write there")
    return Path(root) / relative


def write_regular_atomically(path: str | os.PathLike, text: str, mode: int = 0o644) -> None:
    """Write a user-named output as a regular file, whole: a temporary file beside it, then renamed over it. What
    is at the path already must be a regular file (it is replaced) or nothing; anything else is a FileProblem and
    is left as it is. OSError for a directory that cannot be written."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = ("a symbolic link" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                or stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise FileProblem(f"{path}: is {kind}; tk writes only regular files: give the path of a new or regular file")
    tmp = path.with_name(f".{path.name}.tk-tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # the umask does not decide who may read it
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
