"""The /opt/ml tree SageMaker gives a training container, and the names of what lies in it.

One ``OptMl`` describes every path the platform and the sagemaker-training toolkit fix, relative to
a root: ``/opt/ml`` in a real container, a temporary directory per simulated host in local mode
(``$SAGEMAKER_DIST_OPT_ML`` points the runtime at it). Pipe-mode FIFOs are ``<channel>_<epoch>``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

DEFAULT_ROOT = "/opt/ml"
ROOT_ENV = "SAGEMAKER_DIST_OPT_ML"  # the runtime's override of the /opt/ml root (tests, local mode, agents)
RESOURCE_CONFIG = "resourceconfig.json"
INPUT_DATA_CONFIG = "inputdataconfig.json"
HYPERPARAMETERS = "hyperparameters.json"
# CheckpointConfig.LocalPath and TensorBoardOutputConfig.LocalPath as the estimator sets them.
CHECKPOINT_LOCAL_PATH = f"{DEFAULT_ROOT}/checkpoints"
TENSORBOARD_LOCAL_PATH = f"{DEFAULT_ROOT}/output/tensorboard"
CODE_CHANNEL = "code"  # the source tarball's File channel under network isolation


def opt_ml_root(root: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The /opt/ml root: ``root`` if given, else $SAGEMAKER_DIST_OPT_ML, else /opt/ml."""
    env = os.environ if environ is None else environ
    return Path(root if root is not None else env.get(ROOT_ENV) or DEFAULT_ROOT)


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
        """A container path such as CheckpointConfig.LocalPath (``/opt/ml/...``) mapped into this tree."""
        path = PurePosixPath(container_path or default)
        relative = (
            path.relative_to(DEFAULT_ROOT) if path.is_relative_to(DEFAULT_ROOT) else path.relative_to("/")
        )
        return self.root / relative if str(relative) != "." else self.root / PurePosixPath(default).name
