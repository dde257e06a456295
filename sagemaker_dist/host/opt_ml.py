"""The ``/opt/ml`` tree of each host (``algo-1`` .. ``algo-H``: local mode's simulated hosts, or a
platform's node), as the SageMaker platform and the sagemaker-training toolkit present it to the user
script: config JSON files, channel directories and the ``SM_*`` environment. Pure file writing, no AWS.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from sagemaker_dist.contract import hyperparameters as hp
from sagemaker_dist.contract import toolkit
from sagemaker_dist.contract.paths import CHECKPOINT_LOCAL_PATH, ROOT_ENV, OptMl
from sagemaker_dist.contract.rank_slots import RankSlot, host_names
from sagemaker_dist.contract.training_request import ChannelSpec, container_variables
from sagemaker_dist.errors import ConfigurationError

DEFAULT_INSTANCE_TYPE = "local"  # resourceconfig.json's instance type where the request names none


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
    def of(
        cls, trees, job_slots: Sequence[RankSlot], processes_per_host: int, first_index: int = 0
    ) -> JobHosts:
        """``trees`` (hosts ``first_index`` on of a job whose ranks' slots are ``job_slots``) with
        their ranks' slots."""
        mine = range(first_index, first_index + len(trees))
        return cls(
            tuple(trees), processes_per_host, first_index, tuple(s for s in job_slots if s.cross_rank in mine)
        )

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


def input_data_config(channels: Sequence[ChannelSpec]) -> dict[str, dict]:
    """inputdataconfig.json for the request's channels (FastFile shows as File)."""
    doc = {}
    for ch in channels:
        entry = {
            "TrainingInputMode": ch.input_mode,
            "S3DistributionType": ch.distribution,
            "RecordWrapperType": ch.record_wrapper,
        }
        if ch.content_type:
            entry["ContentType"] = ch.content_type
        doc[ch.name] = entry
    return doc


def build_host_trees(
    base_dir: Path,
    hosts: int | Sequence[str],
    channels: Sequence[ChannelSpec],
    hyperparameters: dict,
    instance_type: str = DEFAULT_INSTANCE_TYPE,
    num_gpus: int = 0,
    job_name: str = "local-job",
    environment: dict | None = None,
    checkpoint_local_path: str | None = None,
    network_interface_name: str = "lo",
    only: int | None = None,
) -> list[HostTree]:
    """Create ``base_dir/algo-N`` trees with the three config files and return them with their env
    (``hosts``: how many, or their names).
    ``network_interface_name``: the interface the hosts reach each other on, which the toolkit gives
    mpirun (``lo`` where they all run on this machine's loopback). ``only``: host ``only``'s tree
    alone (a platform's node), at ``base_dir`` itself (the node's root), still naming every host of
    the job. Each file is written beside and renamed into place, so a rank that starts early (a
    platform's) never reads half of one; FIFOs an earlier run left in the data dir are removed."""
    names = host_names(hosts) if isinstance(hosts, int) else list(hosts)
    hps = hp.encode_all(hyperparameters)
    data_config = input_data_config(channels)
    trees = []
    for name in names if only is None else names[only : only + 1]:
        root = Path(base_dir) / name if only is None else Path(base_dir)
        tree = HostTree.laid_out(root, name, checkpoint_local_path)
        config_dir = tree.config_dir
        for d in (
            config_dir,
            tree.data_dir,
            tree.model_dir,
            tree.output_data_dir,
            tree.output_dir / "tensorboard",
            tree.checkpoint_dir,
        ):
            d.mkdir(parents=True, exist_ok=True)
        resource = {
            "current_host": name,
            "hosts": names,
            "network_interface_name": network_interface_name,
            "current_instance_type": instance_type,
            "current_group_name": "homogeneousCluster",
            "instance_groups": [
                {"instance_group_name": "homogeneousCluster", "instance_type": instance_type, "hosts": names}
            ],
        }
        files = {
            "resourceconfig.json": resource,
            "inputdataconfig.json": data_config,
            "hyperparameters.json": hps,
        }
        for filename, doc in files.items():
            _write_whole(config_dir / filename, json.dumps(doc, indent=1))
        _remove_fifos(tree.data_dir)
        tree.env.update(sm_environment(tree, names, data_config, hps, resource, num_gpus, job_name))
        tree.env.update(container_variables(job_name, environment))
        trees.append(tree)
    return trees


def _write_whole(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def _remove_fifos(data_dir: Path) -> None:
    """An earlier run's FIFOs on a platform's node would block the feeder's mkfifo."""
    for stale in data_dir.iterdir():
        if stat.S_ISFIFO(stale.lstat().st_mode):
            stale.unlink()


def host_trees_for(
    job, base_dir: Path, network_interface_name: str = "lo", node: int | None = None
) -> JobHosts:
    """Every host's tree for ``job`` (a ``JobSpec``) under ``base_dir``, as SageMaker lays it out
    (host ``node``'s alone, at ``base_dir``, for a platform's node): one layout for local mode and the
    platforms' pipe agent."""
    trees = build_host_trees(
        base_dir,
        job.host_names,
        job.channels,
        job.hyperparameters,
        instance_type=job.instance_type or DEFAULT_INSTANCE_TYPE,
        job_name=job.name,
        environment=job.environment,
        checkpoint_local_path=job.checkpoint_local_path,
        network_interface_name=network_interface_name,
        only=node,
    )
    return JobHosts.of(trees, job.slots, job.processes_per_host, node or 0)


def sm_environment(tree, names, data_config, hps, resource, num_gpus, job_name) -> dict[str, str]:
    """The variables the sagemaker-training toolkit sets for the user script, for this host (JSON values
    written as its ``mapping.to_env_vars`` writes them: sorted keys, no spaces)."""
    user_hps = hp.decode_all(hp.user_hyperparameters(hps))
    env = {
        ROOT_ENV: str(tree.root),  # the runtime's override of the /opt/ml root
        "SM_HOSTS": toolkit.env_value(names),
        "SM_CURRENT_HOST": tree.name,
        "SM_NUM_GPUS": str(num_gpus),
        "SM_NUM_CPUS": str(os.cpu_count() or 1),
        "SM_CHANNELS": toolkit.env_value(sorted(data_config)),
        "SM_MODEL_DIR": str(tree.model_dir),
        "SM_OUTPUT_DATA_DIR": str(tree.output_data_dir),
        "SM_OUTPUT_DIR": str(tree.output_dir),
        "SM_INPUT_DIR": str(tree.root / "input"),
        "SM_INPUT_CONFIG_DIR": str(tree.config_dir),
        "SM_INPUT_DATA_CONFIG": toolkit.env_value(data_config),
        "SM_RESOURCE_CONFIG": toolkit.env_value(resource),
        "SM_NETWORK_INTERFACE_NAME": resource["network_interface_name"],
        "SM_CURRENT_INSTANCE_TYPE": resource["current_instance_type"],
    }
    for channel in data_config:
        env[f"SM_CHANNEL_{channel.upper()}"] = str(tree.data_dir / channel)
    env.update(toolkit.user_environment(hps))  # SM_HPS, SM_USER_ARGS, SM_HP_<KEY> as the toolkit writes them
    env["SM_TRAINING_ENV"] = toolkit.env_value(
        {
            "hosts": names,
            "current_host": tree.name,
            "channel_input_dirs": {c: env[f"SM_CHANNEL_{c.upper()}"] for c in data_config},
            "hyperparameters": user_hps,
            "job_name": job_name,
            "model_dir": str(tree.model_dir),
            "num_gpus": num_gpus,
        }
    )
    return env


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
