"""How a local-mode rank tells the supervisor how it ended: ``<pid_dir>/<rank>.exit``, and when:
``<pid_dir>/<rank>.alive``, a lock it holds while it runs.

A file of its own (not in ``rank_entry``) so the launcher can read the protocol without importing
the module each rank runs with ``python -m`` (which would make every rank warn that the module is already
in ``sys.modules``).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

TERMINATED = "terminated"  # exit-file content of a rank stopped by SIGTERM (the launcher or local mode)
LOCK_WAIT_S = 5.0  # a rank taking its lock waits this long for another holder to let it go


def write_whole(path: Path, text: str) -> None:
    """Write a rank's pid or exit file in one step (the supervisor never reads half of it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def hold_alive_lock(path: Path) -> int | None:
    """Lock ``path`` for as long as this process runs; the descriptor (keep it open), or None where
    its file system has no locks (the supervisor then goes by /proc alone).

    The kernel drops a POSIX lock as the process's files close when it ends, before its sockets
    are released (their last packets) and before its exit ends: so the supervisor can see the lock of
    a killed rank free before a peer fails on that rank's sockets, even while /proc still shows it
    running. Forked children (DataLoader workers) do not inherit it; an exec keeps it.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.set_inheritable(fd, True)  # kept across exec
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except (BlockingIOError, PermissionError):  # held by another process
            if time.monotonic() > deadline:
                os.close(fd)
                raise SystemExit(
                    f"{path} stayed locked for {LOCK_WAIT_S:.0f} s: another process of this rank "
                    "is running; stop it, or start the job in a new work directory"
                ) from None
            time.sleep(0.01)
        except OSError:  # no locks here (ENOLCK)
            os.close(fd)
            path.unlink(missing_ok=True)
            return None


def alive_lock_held(path: Path) -> bool | None:
    """Whether a rank holds its lock at ``path``; None where there is no lock to go by (no file: not
    started, or no locks on its file system)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # closing drops the lock this probe took
    return False
