"""The default process group of a benchmark's ranks, started and ended as the runtime's ``setup_ddp``
does (``runtime.torch.group_exit``), so that a rank that has printed its figures does not abort in the
interpreter's teardown ("terminate called without an active exception", SIGABRT: a plain
``init_process_group`` leaves the group to the DDP model's reducer, freed last)."""

from __future__ import annotations

import datetime


def start_gloo(timeout_s: float = 1800) -> None:
    """``init_process_group("gloo")`` from torchrun's environment, with its group kept until exit."""
    import torch.distributed as dist

    from sagemaker_dist.runtime.torch.group_exit import bind_collectives_first, keep_until_exit

    bind_collectives_first()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    keep_until_exit(dist.group.WORLD)
