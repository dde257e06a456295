"""How a local-mode rank tells the supervisor how it ended: ``<pid_dir>/<rank>.exit``.

A file of its own (not in ``rank_entry``) so the launcher can read the protocol without importing
the module each rank runs with ``python -m`` (which would make every rank warn that the module is already
in ``sys.modules``).
"""

from __future__ import annotations

import os
from pathlib import Path

TERMINATED = "terminated"  # exit-file content of a rank stopped by SIGTERM (the launcher or local mode)


def write_exit(path: Path, text: str) -> None:
    """Write a rank's exit file in one step (the supervisor never reads half of it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
