"""Writing a render: an output directory holds the old render or the new one, whole, never a mix.

    1. take the lock (flock on the parent directory; bounded), so concurrent renders of one target queue;
    2. write every file into a sibling temporary directory; hard-link into it whatever the old directory
       holds that tk did not render (a user's notes, a run's logs), so nothing a user put there is lost;
    3. swap the two directories in one step (renameat2 RENAME_EXCHANGE), then remove the old one. Where the
       file system cannot exchange, rename the old directory aside, rename the new one in, remove the old;
       a render killed between those two renames is repaired by the next render (under the lock), which
       puts the old directory back before it starts.

A write error (disk full, read-only) or a kill before step 3 leaves the old directory untouched; the
temporary directory of a killed render is removed by the next render of the same target.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

from toolkit.errors import TkError

LOCK_TIMEOUT_S = 60.0


def owner_only(name: str) -> bool:
    """Rendered files that hold the recipe's env values: the role env files and the manifest (the whole recipe)."""
    return name.endswith(".env") or name == "manifest.json"

_TMP_TAG = ".tk-render-"
_OLD_TAG = ".tk-old-"

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
try:
    _renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
except (AttributeError, OSError):  # not glibc >= 2.28
    _renameat2 = None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories atomically; False where the system or file system cannot."""
    if _renameat2 is None:
        return False
    rc = _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))


class _Lock:
    """flock on the parent directory: one render at a time into it (bounded wait)."""

    def __init__(self, parent: Path, timeout_s: float):
        self.parent, self.timeout_s = parent, timeout_s

    def __enter__(self):
        self.fd = os.open(self.parent, os.O_RDONLY)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self.fd)
                    raise TkError(f"{self.parent}: another tk render into this directory has held its lock for "
                                  f"{self.timeout_s:g}s; try again when it has finished") from None
                time.sleep(0.05)

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _repair(out: Path, parent: Path) -> None:
    """Under the lock: undo what a killed render left (its temporary directory; an old directory renamed
    aside with no new one in its place)."""
    def named(tag: str) -> list[Path]:  # by prefix, not glob: the name may hold *, ? or [
        return sorted(p for p in parent.iterdir() if p.name.startswith(f".{out.name}{tag}"))

    asides = named(_OLD_TAG)
    if asides and not out.exists():
        os.rename(asides.pop(), out)
    for leftover in [*asides, *named(_TMP_TAG)]:
        shutil.rmtree(leftover, ignore_errors=True)


def _carry_over(old: Path, new: Path, rendered: set[str]) -> None:
    """Hard-link (copy where links cannot be made) what the old directory holds beyond the rendered files."""
    for item in old.iterdir():
        if item.name in rendered:
            continue
        target = new / item.name
        if item.is_dir() and not item.is_symlink():
            shutil.copytree(item, target, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(item, target)


def _link_or_copy(src, dst) -> None:
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _refuse_odd_entries(out: Path, names) -> None:
    """A rendered name in an existing output directory must be a regular file (replaced) or nothing: a FIFO, a
    device, a socket, a directory or a symlink there is refused and left as it is, as every file tk writes
    (toolkit.runtime.files.write_regular_atomically)."""
    for name in names:
        try:
            mode = os.lstat(out / name).st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:  # the directory itself cannot be read: said by the write below
            if exc.errno == errno.ENOTDIR:
                return
            raise TkError(f"{out / name}: cannot be checked ({exc.strerror or exc})") from None
        if not stat.S_ISREG(mode):
            kind = ("a symbolic link" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode)
                    else "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                    else "not a regular file")
            raise TkError(f"{out / name}: is {kind}; tk renders only regular files there and leaves this as it is: "
                          "remove it or choose another output directory with -o")


def write_atomically(files: dict[str, str | bytes], out_dir: str | os.PathLike) -> Path:
    """Write the rendered files into out_dir as one directory swap (see the module docstring)."""
    out = Path(out_dir)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise TkError(f"{out}: exists and is not a directory; choose another output directory with -o")
    _refuse_odd_entries(out, files)
    parent = out.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TkError(f"{parent}: cannot create the output directory ({exc.strerror})") from None
    with _Lock(parent, LOCK_TIMEOUT_S):
        try:
            _repair(out, parent)
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}{_TMP_TAG}", dir=parent))
        except OSError as exc:
            raise TkError(f"{parent}: cannot write next to the output directory ({exc.strerror or exc})") from None
        try:
            tmp.chmod(0o755)
            for name, data in files.items():
                # Files that carry the recipe's env values (tokens a user put there) are readable by the owner
                # only, from their creation on; the others are readable by all, as before.
                mode = 0o600 if owner_only(name) else 0o755 if name.endswith((".sbatch", ".pyz")) else 0o644
                path = tmp / name
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))  # created with its mode
                if isinstance(data, bytes):
                    path.write_bytes(data)
                else:
                    path.write_text(data, encoding="utf-8")
                os.chmod(path, mode)  # whatever the umask
            if not out.exists():
                os.rename(tmp, out)
                return out
            _carry_over(out, tmp, set(files))
            if _exchange(tmp, out):
                shutil.rmtree(tmp, ignore_errors=True)  # now the old render
                return out
            aside = parent / f".{out.name}{_OLD_TAG}{os.getpid()}-{time.time_ns()}"
            os.rename(out, aside)
            try:
                os.rename(tmp, out)
            except OSError:
                os.rename(aside, out)  # put the old render back before reporting "as it was"
                raise
            shutil.rmtree(aside, ignore_errors=True)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise TkError(f"{out}: cannot write the rendered files ({exc.strerror or exc}); "
                          "the directory is as it was") from None
    return out
