"""Reading files tk did not necessarily write, and writing files a user named, safely.

Reading (every run.json, index line, manifest, provenance record, report, log and --measured file):
  - bounded in size (the caller's limit; a longer file is refused, or only its tail is read where that is the
    point, as for logs), in nesting depth (JSON deeper than MAX_DEPTH is refused before it is parsed: a file of
    100,000 '[' is a message, not a RecursionError), and in time (only regular files are opened, non-blocking:
    a FIFO or a device named run.json never blocks a listing);
  - contained: `inside(root, relative)` opens a path under a directory only if, symlinks resolved, it is still
    under that directory, and never follows a symlink in its last component;
  - a bad file raises FileProblem (a ValueError) whose text names the file and what is wrong with it.

Writing (`write_regular_atomically`, the one writer of every file tk writes where someone could have put something
first: `tk import -o`, `tk size -o`, run.json, a validation's params and report, a benchmark's results): only ever
a regular file, written whole under a temporary name beside it and renamed (or, where nothing may be replaced,
linked) into place; a device, a FIFO, a socket, a directory or a symlink at that path is refused and left as it
is, so nothing but what was named is ever replaced (`-o /dev/null` as root stays a device). A render directory is
written by toolkit.render.output, which swaps whole directories and refuses the same kinds at a rendered name.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
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


def _kind_of(mode: int) -> str:
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode)
            else "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def refuse_unless_regular(path: str | os.PathLike) -> bool:
    """True when a regular file is at path, False when nothing is; FileProblem (naming what is there) otherwise: what
    write_regular_atomically checks, for a command to ask before its work (`tk size -o` before its search)."""
    return _refuse_unless_regular(Path(path))


def _refuse_unless_regular(path: Path) -> bool:
    """True when a regular file is at path, False when nothing is; FileProblem (naming what is there) otherwise."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode):
        raise FileProblem(f"{path}: is {_kind_of(st.st_mode)}; tk writes only regular files: give the path of a new "
                          "or regular file")
    return True


def write_regular_atomically(path: str | os.PathLike, data: str | bytes, mode: int = 0o644, *,
                             replace: bool = True, parents: bool = False, sync: bool = True) -> Path:
    """The one way tk writes a file whose path someone could have prepared: a user-named output (`tk import -o`,
    `tk size -o`), a run's record and reports, a benchmark's results. Written whole under a temporary name beside
    it (created exclusively, never through a symlink) with its mode, then put in place in one step, so a reader
    sees the old file or the new one, never a part.

    What is at the path already must be a regular file (``replace``: it is replaced; otherwise FileExistsError)
    or nothing; a symlink (even a dangling one), a FIFO, a device, a socket or a directory is a FileProblem and is
    left as it is: nothing is ever written through it or over it (`-o /dev/null` as root stays a device). Without
    ``replace`` the file is linked into place, so whatever appears at the path meanwhile is never replaced either.
    ``parents``: create missing directories first. ``sync``: fsync before the rename (user outputs; state files
    rewritten every second pass False). OSError for a directory that cannot be written."""
    path = Path(path)
    if parents:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # a file where a directory should be: not "the output exists already"
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path.parent)) from None
    if _refuse_unless_regular(path) and not replace:
        raise FileExistsError(errno.EEXIST, "exists already", str(path))
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tk-tmp-", dir=path.parent)  # O_EXCL, never follows a link
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fchmod(f.fileno(), mode)  # the umask does not decide who may read it
            if sync:
                os.fsync(f.fileno())
        if not replace:
            os.link(tmp, path)  # fails on anything at the path, a dangling symlink included
        else:
            _refuse_unless_regular(path)  # again, just before: something put there meanwhile is not replaced
            os.replace(tmp, path)
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return path


def open_append(path: str | os.PathLike, mode: int = 0o644):
    """A regular file opened for appending (binary), created if missing: a log tk or its children write to. Never
    through a symlink and never blocking on a FIFO (OSError, or FileProblem for another kind of file)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileProblem(f"{path}: not a regular file; tk appends only to regular files")
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise


def append_regular(path: str | os.PathLike, data: bytes, mode: int = 0o600) -> None:
    """Append data with one write (O_APPEND: concurrent writers never interleave) to a regular file (open_append)."""
    with open_append(path, mode) as f:
        f.write(data)
