"""The /opt/ml tree SageMaker gives a training container, and the names of what lies in it.

One ``OptMl`` describes every path the platform and the sagemaker-training toolkit fix, relative to
a root: ``/opt/ml`` in a real container, a temporary directory per simulated host in local mode
(``$SAGEMAKER_DIST_OPT_ML`` points the runtime at it). Pipe-mode FIFOs are ``<channel>_<epoch>``.

Every name from outside the job that becomes a local path (an S3 key under a channel or checkpoint
prefix, a manifest entry, a tarball member, a key of the embedded S3's state, a request's LocalPath)
goes through one containment rule, ``contained_name`` / ``contained_path``: nothing from S3, a
request or the network may land outside the directory it is meant for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sagemaker_dist.contract.environment import variable
from sagemaker_dist.errors import ConfigurationError, DataError

DEFAULT_ROOT = "/opt/ml"
ROOT_ENV = "SAGEMAKER_DIST_OPT_ML"  # the runtime's override of the /opt/ml root (tests, local mode, agents)
RESOURCE_CONFIG = "resourceconfig.json"
INPUT_DATA_CONFIG = "inputdataconfig.json"
HYPERPARAMETERS = "hyperparameters.json"
# CheckpointConfig.LocalPath and TensorBoardOutputConfig.LocalPath as the estimator sets them.
CHECKPOINT_LOCAL_PATH = f"{DEFAULT_ROOT}/checkpoints"
TENSORBOARD_LOCAL_PATH = f"{DEFAULT_ROOT}/output/tensorboard"
CODE_CHANNEL = "code"  # the source tarball's File channel under network isolation
CONTAINMENT_FIX = "rename or remove it"  # the default of what to do about a name that would escape


class UnsafePathError(DataError):
    """A name from S3, a manifest, a tarball or a request that would land outside its directory."""


def _escape_problem(relative: object) -> str | None:
    """Why ``relative`` cannot name a file inside a directory, or None: the one lexical rule.

    A ``..`` that stays inside (``a/../b``) is allowed, as the path is still in the tree; empty
    components and ``.`` are (S3 keys like ``a//b`` are common); what climbs above the top is not.
    """
    if not isinstance(relative, str):
        return f"is not a string (a {type(relative).__name__})"
    if "\0" in relative:
        return "holds a NUL byte"
    if relative.startswith("/"):
        return "is an absolute path"
    depth = 0
    for part in relative.split("/"):
        if part in ("", "."):
            continue
        depth += -1 if part == ".." else 1
        if depth < 0:
            return "climbs out of its directory with '..'"
    return None if depth > 0 else "names no file (it is empty or names the directory itself)"


def contained_name(
    relative: object, what: str, *, fix: str = CONTAINMENT_FIX, error: type[Exception] = UnsafePathError
) -> PurePosixPath:
    """``relative`` as a path that stays inside whatever directory it is put under, else ``error``
    naming ``what`` (the channel or prefix and the key) and ``fix``. Pure: listings are checked with
    it before anything is downloaded or any rank starts."""
    problem = _escape_problem(relative)
    if problem:
        raise error(f"{what} {relative!r}, which {problem}; {fix}")
    return PurePosixPath(os.path.normpath(relative))


def contained_path(
    root: str | os.PathLike,
    relative: object,
    what: str,
    *,
    fix: str = CONTAINMENT_FIX,
    error: type[Exception] = UnsafePathError,
) -> Path:
    """``root/relative`` where it is about to be written: ``contained_name``'s rule, and the path with
    every symbolic link resolved still inside ``root`` (a link left in a persistent tree must not
    carry a download out of it)."""
    name = contained_name(relative, what, fix=fix, error=error)
    base = os.path.realpath(root)
    target = os.path.realpath(os.path.join(base, name))
    if target == base or os.path.commonpath([base, target]) != base:
        raise error(
            f"{what} {relative!r}, which leads out of {root} through a symbolic link (to {target}); {fix}"
        )
    return Path(root) / name


def opt_ml_root(root: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The /opt/ml root: ``root`` if given, else $SAGEMAKER_DIST_OPT_ML, else /opt/ml."""
    return Path(root if root is not None else variable(ROOT_ENV, environ) or DEFAULT_ROOT)


def fifo_name(channel: str, epoch: int) -> str:
    """The Pipe-mode FIFO of ``channel`` for ``epoch`` (0-based), as SageMaker names it."""
    return f"{channel}_{epoch}"


@dataclass(frozen=True)
class OptMl:
    """The paths of one /opt/ml tree rooted at ``root``."""

    root: Path

    @property
    def config_dir(self) -> Path:
        return self.root / "input" / "config"

    @property
    def data_dir(self) -> Path:
        """Where Pipe-mode FIFOs and File-mode channel directories are."""
        return self.root / "input" / "data"

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def output_dir(self) -> Path:
        return self.root / "output"

    @property
    def output_data_dir(self) -> Path:
        return self.root / "output" / "data"

    @property
    def checkpoint_dir(self) -> Path:
        """Where the runtime writes checkpoints (CheckpointConfig.LocalPath as the estimator sets it)."""
        return self.local_path(None, CHECKPOINT_LOCAL_PATH)

    @property
    def pipe_state_dir(self) -> Path:
        """Where the reader keeps each channel's next epoch (as AWS's PipeModeDataset does)."""
        return self.root / "pipe_state"

    def channel_dir(self, channel: str) -> Path:
        return self.data_dir / channel

    def fifo(self, channel: str, epoch: int) -> Path:
        return self.data_dir / fifo_name(channel, epoch)

    def local_path(self, container_path: str | None, default: str) -> Path:
        """A container path such as CheckpointConfig.LocalPath (``/opt/ml/...``) mapped into this tree;
        one that is relative or climbs out with ``..`` is refused (it would map outside the tree)."""
        path = container_path or default
        problem = local_path_problem(path)
        if problem:
            raise ConfigurationError(f"LocalPath {path!r} {problem}")
        relative = _tree_relative(path)
        return self.root / relative if relative != "." else self.root / PurePosixPath(default).name


def _tree_relative(container_path: str) -> str:
    """An absolute container path relative to /opt/ml if it is under it, else relative to /."""
    path = PurePosixPath(container_path)
    return str(path.relative_to(DEFAULT_ROOT) if path.is_relative_to(DEFAULT_ROOT) else path.relative_to("/"))


def local_path_problem(container_path: object) -> str | None:
    """Why a request's LocalPath (CheckpointConfig, TensorBoardOutputConfig) cannot be mapped into a
    host's tree, or None. SageMaker's API takes any string up to 4096 characters; a ``..`` would put
    a host's checkpoints outside its tree in local mode and on the pipe agent's platforms."""
    if not isinstance(container_path, str) or not container_path.startswith("/"):
        return "is not an absolute container path; give one such as /opt/ml/checkpoints"
    relative = _tree_relative(container_path)
    problem = _escape_problem(relative) if relative != "." else None
    if problem:
        return (
            f"maps to {relative!r} under /opt/ml, which {problem}; give a plain absolute path such as "
            "/opt/ml/checkpoints"
        )
    return None
