"""What a process does around its default process group so that ending it neither aborts nor hangs:
``bind_collectives_first`` before ``init_process_group``, ``keep_until_exit`` after it.
The failures are "terminate called without an active exception" (SIGABRT) after a rank ended well, the
group's work or threads alive while the interpreter tears down, and a rank that never exits because the
group was destroyed with the GIL held while one of Gloo's threads waited for it."""

from __future__ import annotations

import atexit
import gc

_KEPT: list = []  # the default groups setup_ddp used, then their backends, released at exit


def keep_until_exit(group) -> None:
    """Hold ``group`` and its backends until ``release_at_exit``. A DDP model's reducer owns its group in
    C++; freed last there (the model dropped after ``destroy_process_group``), the group's destructor
    joins Gloo's threads with the GIL held, and a thread still freeing a finished collective's tensor
    waits for the GIL: the rank never exits (seen in local-mode runs, ``~ProcessGroupGloo`` in
    ``thread.join`` under ``~Reducer``). Dropped from Python, the group and its backends release the GIL
    first, so that thread finishes."""
    import torch

    atexit.unregister(release_at_exit)  # once, however many groups a process keeps
    atexit.register(release_at_exit)
    if any(kept is group for kept in _KEPT):
        return
    backends = [group._get_backend(torch.device(kind)) for kind in getattr(group, "_device_types", ())]
    _KEPT.extend([group, *backends])


def release_at_exit() -> None:
    """At exit, while the interpreter is whole: collect garbage, then drop the kept groups, each group
    before its backends. A DDP model and its reducer sit in reference cycles, so they often outlive
    ``main`` until the collection that interpreter teardown makes; their group's Gloo work, freed
    there, can abort the process after a rank has ended well."""
    gc.collect()
    while _KEPT:
        _KEPT.pop(0)


def bind_collectives_first() -> None:
    """Import ``torch.distributed.nn`` before the default group exists. Its functions take
    ``group.WORLD`` as a default argument, bound at import, and DCP imports it: imported after
    ``init_process_group`` they hold the group past ``destroy_process_group``, and its Gloo threads then
    race the interpreter's exit ("terminate called without an active exception": 3 of 12 runs of a
    2-rank sharded save ended in SIGABRT after the rank had returned; none of 16 with this import first)."""
    import torch.distributed.nn  # noqa: F401
