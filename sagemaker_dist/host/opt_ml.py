"""The ``/opt/ml`` trees of a job's hosts (``algo-1`` .. ``algo-H``: local mode's simulated hosts, or
a platform's node) once laid out (``host.lifecycle`` lays them out): each tree's paths and the
environment its ranks get, which host each rank runs on, and the private directories a shared node's
roots live in.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from sagemaker_dist.contract.paths import CHECKPOINT_LOCAL_PATH, OptMl
from sagemaker_dist.contract.rank_slots import RankSlot
from sagemaker_dist.errors import ConfigurationError


@dataclass(frozen=True)
class HostTree(OptMl):
    """The /opt/ml tree of one host (its paths from the contract) and the environment its ranks get;
    ``checkpoint_dir``: CheckpointConfig.LocalPath mapped into it, once the tree is laid out."""

    name: str = ""
    env: dict[str, str] = field(default_factory=dict)
    checkpoint_dir: Path | None = None

    @classmethod
    def laid_out(cls, root: Path, name: str, checkpoint_local_path: str | None) -> HostTree:
        """Host ``name``'s tree at ``root``, its checkpoint dir mapped into it."""
        tree = cls(root, name)
        return replace(tree, checkpoint_dir=tree.checkpoint_path(checkpoint_local_path))

    def checkpoint_path(self, local_path: str | None) -> Path:
        """CheckpointConfig.LocalPath (default /opt/ml/checkpoints) mapped into this tree."""
        return self.local_path(local_path, CHECKPOINT_LOCAL_PATH)


@dataclass(frozen=True)
class JobHosts(Sequence[HostTree]):
    """The trees of a job's hosts laid out here, in host order, and which host each rank runs on: the
    one answer to "where is rank r" for the launchers, the failure messages and the job's summary.
    (SageMaker fills hosts in order: rank r runs on host r // processes_per_host.) Local mode holds
    every host; a platform's node, its own alone: ``first_index`` is the first's index.
    ``slots``: the slots of the ranks on these hosts (``contract.rank_slots``), worked out once."""

    trees: tuple[HostTree, ...]
    processes_per_host: int
    first_index: int = 0
    slots: tuple[RankSlot, ...] = ()

    @classmethod
    def of(cls, trees, job, first_index: int = 0) -> JobHosts:
        """``trees``: hosts ``first_index`` on of ``job`` (a ``JobSpec``), with their ranks' slots."""
        hosts = job.slots_by_host[first_index : first_index + len(trees)]
        return cls(tuple(trees), job.processes_per_host, first_index, tuple(s for h in hosts for s in h))

    def __getitem__(self, index):
        return self.trees[index]

    def __len__(self) -> int:
        return len(self.trees)

    def __iter__(self) -> Iterator[HostTree]:
        return iter(self.trees)

    @property
    def world(self) -> int:
        return len(self.trees) * self.processes_per_host

    def slot(self, rank: int) -> RankSlot | None:
        """Rank ``rank``'s slot; None for a rank not on these hosts."""
        index = rank - self.slots[0].rank if self.slots else -1
        return self.slots[index] if 0 <= index < len(self.slots) else None

    def host_of(self, rank: int) -> str:
        """The name of the host rank ``rank`` runs on; "?" for a rank outside the job."""
        slot = self.slot(rank)
        return slot.host if slot is not None else "?"

    def local_rank(self, rank: int) -> int:
        slot = self.slot(rank)
        return slot.local_rank if slot is not None else rank % self.processes_per_host


def private_directory(path: Path) -> Path:
    """``path`` as a directory only this user can enter: made 0700 if absent, else checked.

    On a shared node another user could create a predictable path first (job ids are sequential)
    and then read the data, take bytes from a FIFO or swap the code the ranks run: refuse it.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigurationError(
            f"{path} exists and is not a directory (a symlink?): remove it or use another root"
        )
    if info.st_uid != os.geteuid():
        raise ConfigurationError(
            f"{path} exists and belongs to uid {info.st_uid}, not to this user ({os.geteuid()}): another "
            "user may have created it to read or replace the job's files. Remove it, or set another root"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)  # ours, but others could enter it: close it before anything goes in
    return path


def fresh_private_root(root: Path) -> Path:
    """A new, empty node root in a private parent (a stale tree of the same job id is removed)."""
    private_directory(root.parent)
    if root.is_symlink() or root.is_file():
        root.unlink()
    elif root.exists():
        shutil.rmtree(root)
    return private_directory(root)
