"""Cache folders that only this user (or root) can write, and files in them opened without links.

What a cache holds is loaded or run later (the compiled reader's ``.so``, the embedded S3's state),
so a cache another user can write is a way for them to run code as this user. ``trusted_dir``
creates the folders it is asked for with mode 0700 (an existing folder keeps its mode) and refuses,
naming the path, its owner and mode and what to do, a cache root or anything under it that is not a
directory of this user's (or root's), is a symbolic link, or is writable by group or others; the
root's parent (whose owner can swap the root) must be this user's or root's and not writable by
group or others, unless it has the sticky bit (``/tmp``: nobody else can rename or remove what is
ours there). ``check_path`` does the same for one file or folder (``lstat``: a link is refused, never
followed); ``open_trusted`` opens with ``O_NOFOLLOW`` and checks what it opened; ``create_new`` writes
a new file with ``O_CREAT|O_EXCL|O_NOFOLLOW``.

Framework-neutral and stdlib only: the runtime (the compiled reader's build cache) and local mode
(the embedded S3's state dir) both use it.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from pathlib import Path

from sagemaker_dist.errors import ConfigurationError

DIR_MODE = 0o700
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


class UntrustedCacheError(ConfigurationError):
    """A cache folder or file that another user could have written: the message names it and the fix."""


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _trusted_owner(uid: int) -> bool:
    return uid in (os.geteuid(), 0)


def _refuse(path, st: os.stat_result, problem: str, fix: str, hint: str) -> UntrustedCacheError:
    mode = f"{stat.filemode(st.st_mode)} ({stat.S_IMODE(st.st_mode):04o})"
    return UntrustedCacheError(
        f"{path} (owner {_user(st.st_uid)}, mode {mode}) {problem}: what this process would load from "
        f"it could be another user's; {fix}{'; or ' + hint if hint else ''}"
    )


def _check(path, st: os.stat_result, kind: str, hint: str, sticky_ok: bool = False) -> None:
    """Refuse ``st`` (``path``'s lstat) unless it is a ``kind`` ("dir" or "file") of ours, not
    writable by group or others (or, with ``sticky_ok``, sticky like /tmp)."""
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, st, "is a symbolic link", "remove the link", hint)
    is_kind = stat.S_ISDIR(st.st_mode) if kind == "dir" else stat.S_ISREG(st.st_mode)
    if not is_kind:
        what = "a directory" if kind == "dir" else "a regular file"
        raise _refuse(path, st, f"is not {what}", "remove it", hint)
    if not _trusted_owner(st.st_uid):
        problem = f"belongs to another user, neither you ({_user(os.geteuid())}) nor root"
        raise _refuse(path, st, problem, "remove it (its owner or root can)", hint)
    if st.st_mode & _OTHERS_WRITE and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        raise _refuse(path, st, "is writable by group or others", f"run `chmod go-w {path}`", hint)


def check_path(path: str | os.PathLike, kind: str = "file", hint: str = "") -> os.stat_result | None:
    """``path``'s lstat where it is a ``kind`` ("file" or "dir") of ours that only we can write; None
    where nothing is there; ``UntrustedCacheError`` otherwise (a link is refused, not followed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    _check(path, st, kind, hint)
    return st


def _lstat_or_create(path: Path, create: bool) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        if not create:
            return None
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        pass  # made at the same time by another process: checked as any existing one
    return os.lstat(path)


def trusted_dir(
    path: str | os.PathLike, root: str | os.PathLike | None = None, create: bool = True, hint: str = ""
) -> Path:
    """``path`` (``root`` or a folder under it; default ``root`` = ``path``) with symbolic links in
    ``root``'s own path resolved, once every folder from ``root`` down to it is ours (or root's), not a
    link and not writable by group or others, and ``root``'s parent is ours or root's and not writable
    by group or others unless sticky. Missing folders are created with mode 0700 (with ``create``;
    else the check stops at the first missing one). ``UntrustedCacheError`` names what is wrong and
    what to do (``hint``: where else the cache may go); ``OSError`` where a folder cannot be made."""
    path = Path(os.path.abspath(path))
    root = path if root is None else Path(os.path.abspath(root))
    relative = path.relative_to(root)  # ValueError: our bug
    if create:
        missing = []
        above = root.parent
        while not os.path.lexists(above):
            missing.append(above)
            above = above.parent
        for folder in reversed(missing):
            _lstat_or_create(folder, create=True)
    real_root = Path(os.path.realpath(root))
    parent = real_root.parent
    try:
        parent_stat = os.stat(parent)  # realpath: no link left in it
    except FileNotFoundError:
        if create:
            raise
        return real_root / relative  # nothing there yet to trust or distrust
    _check(parent, parent_stat, "dir", hint, sticky_ok=True)
    folder = real_root
    for part in (None, *relative.parts):
        folder = folder if part is None else folder / part
        st = _lstat_or_create(folder, create)
        if st is None:
            break
        _check(folder, st, "dir", hint)
    return real_root / relative


def open_trusted(path: str | os.PathLike, flags: int, mode: int = 0o600, hint: str = "") -> int:
    """``os.open`` with ``O_NOFOLLOW`` (a link is refused, never followed; ``O_CREAT`` never creates
    through one) and ``O_NONBLOCK`` (a FIFO left there never blocks); the descriptor, once ``fstat``
    says it is a regular file of ours that only we can write. Raises ``UntrustedCacheError`` or
    ``OSError`` (``FileNotFoundError`` without ``O_CREAT``)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):  # O_NOFOLLOW met a link
            raise _refuse(path, os.lstat(path), "is a symbolic link", "remove the link", hint) from None
        raise
    try:
        _check(path, os.fstat(fd), "file", hint)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_new(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to a new file ``path`` (``O_CREAT|O_EXCL|O_NOFOLLOW``: ``FileExistsError`` where
    anything, a link included, is already there)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
