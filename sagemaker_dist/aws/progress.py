"""Progress bars for the SDK side's long steps (listing a prefix, writing shards, waiting for a job).

A bar shows where someone is watching: a terminal, or a Jupyter notebook (where stderr is not a
terminal, so tqdm alone would hide it). Elsewhere (CI logs, pipes) it is silent, so logs keep only
the printed lines. ``enabled=True``/``False`` overrides the guess.
"""

from __future__ import annotations

import sys


def in_notebook() -> bool:
    """True inside a Jupyter kernel (IPython's ZMQ shell), where a user watches the cell's output."""
    shell = sys.modules.get("IPython")
    if shell is None or "ipykernel" not in sys.modules:
        return False
    ipython = shell.get_ipython()
    return ipython is not None and type(ipython).__name__ == "ZMQInteractiveShell"


def watched() -> bool:
    """Someone is looking: stderr is a terminal, or this runs in a notebook."""
    return in_notebook() or (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())


def progress_bar(
    total: float | None = None, desc: str = "", unit: str = "it", enabled: bool | None = None, **kwargs
):
    """A ``tqdm`` bar on stderr, disabled when nobody watches (see ``watched``); use as a context
    manager or call ``close()``. Notebooks get tqdm's text bar, which needs no widget library."""
    from tqdm import tqdm

    show = watched() if enabled is None else enabled
    return tqdm(
        total=total, desc=desc, unit=unit, disable=not show, file=sys.stderr, dynamic_ncols=True, **kwargs
    )
