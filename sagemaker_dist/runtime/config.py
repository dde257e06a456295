"""The SageMaker container contract: /opt/ml/input/config/*.json and the SM_* variables.

The root (/opt/ml) comes from an explicit argument, else ``$SAGEMAKER_DIST_OPT_ML``, else /opt/ml,
so tests and local mode can point a training script at a temporary directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagemaker_dist.contract import distributions
from sagemaker_dist.contract import hyperparameters as hp
from sagemaker_dist.contract.layout import LAYOUT_HYPERPARAMETER, ChannelLayout
from sagemaker_dist.contract.paths import (  # noqa: F401 - ROOT_ENV and opt_ml_root are the runtime's API too
    HYPERPARAMETERS,
    INPUT_DATA_CONFIG,
    RESOURCE_CONFIG,
    ROOT_ENV,
    OptMl,
    opt_ml_root,
)
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime import environment

# Where the sagemaker-training toolkit mirrors the files for the user script.
_ENV_FALLBACKS = {
    RESOURCE_CONFIG: environment.RESOURCE_CONFIG,
    INPUT_DATA_CONFIG: environment.INPUT_DATA_CONFIG,
    HYPERPARAMETERS: environment.HYPERPARAMETERS,
}


class ContainerConfigError(ConfigurationError):
    """A container config file or SM_* variable that cannot be read."""


def _read_json(path: Path, env_name: str, env: Mapping[str, str]) -> tuple[dict, str]:
    """Read one config document from its file, else from its SM_* variable; ({} , 'missing') if neither."""
    try:
        text = path.read_text()
        source = str(path)
    except FileNotFoundError:
        if env_name not in env:
            return {}, "missing"
        text = env[env_name]
        source = f"${env_name}"
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ContainerConfigError(f"{source} is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise ContainerConfigError(f"{source} holds a {type(doc).__name__}, expected a JSON object")
    return doc, source


@dataclass(frozen=True)
class ContainerConfig:
    """What the container was started with; build it with :meth:`load`."""

    root: Path
    resource_config: dict = field(default_factory=dict)
    input_data_config: dict = field(default_factory=dict)
    hyperparameters: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)  # file name -> path / $SM_* variable / "missing"
    environ: dict = field(default_factory=dict, repr=False)

    @classmethod
    def load(
        cls, root: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None
    ) -> ContainerConfig:
        """Read the three config files under ``<root>/input/config`` (SM_* variables as a fallback)."""
        env = dict(environment.environ(environ))
        base = opt_ml_root(root, env)
        docs, sources = {}, {}
        for name, env_name in _ENV_FALLBACKS.items():
            docs[name], sources[name] = _read_json(OptMl(base).config_dir / name, env_name, env)
        resource = docs[RESOURCE_CONFIG]
        if not resource and (environment.CURRENT_HOST in env or environment.HOSTS in env):
            resource = {"current_host": env.get(environment.CURRENT_HOST, "algo-1")}
            if environment.HOSTS in env:
                resource["hosts"] = json.loads(env[environment.HOSTS])
            sources[RESOURCE_CONFIG] = "$SM_CURRENT_HOST/$SM_HOSTS"
        return cls(
            root=base,
            resource_config=resource,
            input_data_config=docs[INPUT_DATA_CONFIG],
            hyperparameters=hp.decode_all(docs[HYPERPARAMETERS]),
            sources=sources,
            environ=env,
        )

    # Paths of the contract.
    @property
    def paths(self) -> OptMl:
        return OptMl(self.root)

    @property
    def config_dir(self) -> Path:
        return self.paths.config_dir

    @property
    def data_dir(self) -> Path:
        """Where the Pipe-mode FIFOs (and File-mode channel directories) are."""
        return self.paths.data_dir

    @property
    def pipe_state_dir(self) -> Path:
        return self.paths.pipe_state_dir

    @property
    def model_dir(self) -> Path:
        return Path(self.environ.get(environment.MODEL_DIR) or self.paths.model_dir)

    @property
    def output_data_dir(self) -> Path:
        return Path(self.environ.get(environment.OUTPUT_DATA_DIR) or self.paths.output_data_dir)

    @property
    def checkpoint_dir(self) -> Path:
        return self.paths.checkpoint_dir

    # Cluster.
    @property
    def hosts(self) -> list[str]:
        return list(self.resource_config.get("hosts") or [self.current_host])

    @property
    def current_host(self) -> str:
        return self.resource_config.get("current_host", "algo-1")

    @property
    def host_index(self) -> int:
        hosts = self.hosts
        return hosts.index(self.current_host) if self.current_host in hosts else 0

    @property
    def num_gpus(self) -> int | None:
        value = self.environ.get(environment.NUM_GPUS)
        return int(value) if value not in (None, "") else None

    # Channels.
    @property
    def channels(self) -> list[str]:
        return sorted(self.input_data_config)

    def input_mode(self, channel: str) -> str | None:
        """TrainingInputMode of ``channel`` ('Pipe', 'File'; FastFile shows as 'File'), None if absent."""
        entry = self.input_data_config.get(channel)
        return None if entry is None else entry.get("TrainingInputMode", "File")

    def record_wrapper(self, channel: str) -> str:
        return (self.input_data_config.get(channel) or {}).get("RecordWrapperType", "None")

    # Hyperparameters.
    @property
    def user_hyperparameters(self) -> dict[str, Any]:
        """Hyperparameters for the script (keys starting with ``sagemaker_`` are framework parameters)."""
        return hp.user_hyperparameters(self.hyperparameters)

    @property
    def layout(self) -> ChannelLayout | None:
        """The channel layout the SDK side wrote, or None if the job was not launched by sagemaker-dist."""
        raw = self.hyperparameters.get(LAYOUT_HYPERPARAMETER)
        return None if raw is None else ChannelLayout.from_json(raw)

    @property
    def distribution(self) -> distributions.Distribution | None:
        """The registry's entry of the distribution the job was launched as: the layout's, else the one
        whose toolkit switch (``sagemaker_mpi_enabled``, ...) the hyperparameters set; None where neither
        says. Raises ``LayoutError`` for a layout it cannot read, as ``layout`` does."""
        layout = self.layout
        if layout is not None:
            return distributions.distribution(layout.distribution)
        for entry in distributions.REGISTRY.values():
            if str(self.hyperparameters.get(entry.enabled_hyperparameter, "")).strip().lower() == "true":
                return entry
        return None
