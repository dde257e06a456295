"""What the SageMaker platform does on a job's hosts around the ranks, written once for local mode's
simulated hosts (all of them, on one machine) and the platforms' pipe agent (the one node it runs on).

In order: the entry script's folder (a local folder, or the source package from S3, unpacked), the
``/opt/ml`` trees laid out (``host_trees_for``: each a ``HostTree``, together a ``JobHosts`` that says
which host each rank runs on), checkpoints restored from ``CheckpointConfig.S3Uri``
into each host's tree, every channel listed and the File-mode ones downloaded (before any rank
starts), then, while the ranks run, the Pipe-mode FIFOs fed and the checkpoints synced back every few
seconds; at the end the feeds closed, the checkpoints synced a last time and, from the job's first
host, ``model.tar.gz`` and ``output.tar.gz`` packed into the output path. Starting and watching the
ranks is the caller's.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tarfile
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from sagemaker_dist.contract import toolkit
from sagemaker_dist.contract.hyperparameters import encode_all
from sagemaker_dist.contract.paths import contained_path
from sagemaker_dist.contract.s3_uri import parse_s3_uri
from sagemaker_dist.contract.training_request import (
    MODEL_TARBALL,
    OUTPUT_TARBALL,
    ChannelSpec,
    container_variables,
    input_data_config,
)
from sagemaker_dist.errors import ConfigurationError, DataError
from sagemaker_dist.host.feeder import (
    ChannelFeeder,
    FeedError,
    FeedStats,
    S3Item,
    channel_download_dir,
    download_target,
    epoch_objects,
    resolve_objects,
)
from sagemaker_dist.host.job_spec import HostTree, JobHosts
from sagemaker_dist.host.outputs import CheckpointSync, pack_and_upload


class OutputUploadError(DataError):
    """The job's model or output could not be packed into the output path; names the host and target."""


DEFAULT_INSTANCE_TYPE = "local"  # resourceconfig.json's instance type where the request names none


def build_host_trees(
    base_dir: Path,
    names: Sequence[str],
    channels: Sequence[ChannelSpec],
    hyperparameters: dict,
    instance_type: str = DEFAULT_INSTANCE_TYPE,
    num_gpus: int = 0,
    job_name: str = "local-job",
    environment: dict | None = None,
    checkpoint_local_path: str | None = None,
    network_interface_name: str = "lo",
    only: int | None = None,
    script: toolkit.ScriptHyperparameters | None = None,
) -> list[HostTree]:
    """Create ``base_dir/<name>`` trees for the hosts ``names`` (the job's ``host_names``) with the
    three config files and return them with their env.
    ``network_interface_name``: the interface the hosts reach each other on, which the toolkit gives
    mpirun (``lo`` where they all run on this machine's loopback). ``only``: host ``only``'s tree
    alone (a platform's node), at ``base_dir`` itself (the node's root), still naming every host of
    the job. Each file is written beside and renamed into place, so a rank that starts early (a
    platform's) never reads half of one; FIFOs an earlier run left in the data dir are removed.
    ``script``: the hyperparameters as the toolkit reads them, where the job has read them already."""
    names = list(names)
    hps = encode_all(hyperparameters)
    script = script or toolkit.ScriptHyperparameters.read(hps)
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
        tree.env.update(
            toolkit.sm_environment(tree, names, data_config, script, resource, num_gpus, job_name)
        )
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
        script=job.script_hyperparameters,
    )
    return JobHosts.of(trees, job, node or 0)


class HostLifecycle:
    """The platform's side of a job (a ``JobSpec``) under ``base_dir``: every host's (local mode: the
    trees in ``base_dir/hosts/algo-N``) or node ``node``'s alone (a pipe agent: its tree at
    ``base_dir``, the node's root); the entry script's folder is ``source_dir``, else the job's source
    package unpacked into ``base_dir/code`` (a node fetches only a package in S3: a path is its ranks').

    Entering it fetches the code, lays out the trees (``trees``: a ``JobHosts``; ``interface``: the
    one the hosts reach each other on), restores the checkpoints and opens the feeds (File mode
    downloads there); ``start`` starts the feeds and the checkpoint sync; ``finish`` (the ranks ended
    well) stops feeding and syncs the checkpoints; leaving it closes everything, on any exit.
    ``errors`` collects what a feed reported while running. ``channels`` are those the hosts feed
    (every channel by default), ``items`` their objects where the caller listed them already,
    ``max_epochs`` a Pipe feed's epochs. ``announce_uploads``: a line per tarball uploaded (the pipe
    agent's log; local mode's summary names the model's URI, and its job lines are the ranks' own).
    """

    def __init__(
        self,
        job,
        base_dir: Path,
        client,
        echo=print,
        *,
        node: int | None = None,
        interface: str = "lo",
        source_dir=None,
        channels=None,
        items=None,
        stop: threading.Event | None = None,
        max_epochs: int | None = None,
        label: str = "",
        announce_uploads: bool = False,
    ):
        self.job, self.base_dir, self.client, self.echo = job, Path(base_dir), client, echo
        self.node, self.interface, self.source_dir = node, interface, source_dir
        self.label, self.announce_uploads = label, announce_uploads
        self.channels = job.channels if channels is None else channels
        self._items, self._max_epochs = items, max_epochs
        self.stop = stop or threading.Event()
        self.errors: list[str] = []
        self.feeds: list = []
        self.code_dir: Path | None = None
        self.trees: JobHosts | None = None
        self.checkpoints: CheckpointSync | None = None

    def __enter__(self) -> HostLifecycle:
        try:
            self.code_dir = self._fetch_code()
            at = self.base_dir / "hosts" if self.node is None else self.base_dir
            self.trees = host_trees_for(self.job, at, self.interface, node=self.node)
            local_dirs = [t.checkpoint_dir for t in self.trees]
            self.checkpoints = CheckpointSync(self.job.checkpoint_s3_uri, local_dirs, self.client)
            restored = self.checkpoints.restore()
            if restored:
                self.echo(
                    f"{self.label}restored {restored} checkpoint file(s) from {self.checkpoints.s3_uri}"
                )
            self.feeds += open_feeds(
                self.channels, self.trees, self.client, self.stop, self.errors.append, self.echo,
                hosts=self.job.hosts, items=self._items,
                max_epochs=self._max_epochs,
            )  # fmt: skip
        except BaseException:
            self.__exit__()
            raise
        return self

    def _fetch_code(self) -> Path | None:
        """The entry script's folder, checked to hold it; None on a node whose ranks bring their own."""
        submit = self.job.submit_directory
        if self.node is not None and not str(submit or "").startswith("s3://"):
            return None
        code = fetch_source_dir(self.source_dir, submit, self.base_dir, self.client)
        if not (code / self.job.entry_point).is_file():
            raise SourceDirError(f"entry script {self.job.entry_point!r} is not in the source dir {code}")
        return code

    def start(self) -> None:
        """The ranks are about to start: feed the FIFOs, sync the checkpoints every few seconds."""
        for feed in self.feeds:
            feed.start()
        self.checkpoints.start()

    def finish(self) -> None:
        """The ranks ended well: stop feeding, sync the checkpoints a last time."""
        self.stop.set()
        self.checkpoints.stop()

    def __exit__(self, *exc) -> None:
        self.stop.set()  # first: the feeders see it and end
        close_feeds(self.feeds)
        if self.checkpoints is not None:
            self.checkpoints.stop()  # also after a failure: the last complete checkpoint reaches S3

    def upload_outputs(self) -> str | None:
        """From the job's first host, as SageMaker after the job: ``model.tar.gz`` and ``output.tar.gz``
        into the output path (an empty directory uploads nothing: a failed or stopped job's model).
        Returns the model's URI, None where none was uploaded."""
        if self.trees.first_index != 0 or not self.job.output_path:
            return None
        tree, uploaded = self.trees[0], {}
        for directory, tarball in ((tree.model_dir, MODEL_TARBALL), (tree.output_data_dir, OUTPUT_TARBALL)):
            uri = self.job.output_uri(tarball)
            try:
                uploaded[tarball] = pack_and_upload(directory, uri, self.client)
            except Exception as exc:  # noqa: BLE001 - boto3's upload errors vary; name the target
                raise OutputUploadError(f"{tree.name}: cannot upload {directory} to {uri}: {exc}") from exc
            if uploaded[tarball] and self.announce_uploads:
                self.echo(f"{self.label}uploaded {uri}")
        return uploaded[MODEL_TARBALL]


class FileFeed:
    """A File-mode channel of one host: downloaded when made; nothing runs during the job."""

    def __init__(self, spec, items, tree, client, host_index: int, hosts: int, echo):
        started = time.monotonic()
        dest = channel_download_dir(spec, tree.data_dir)
        size = download_channel(spec, items, dest, client, host_index, hosts)
        # downloaded before the ranks start: no streaming figures
        self.stats = FeedStats(
            tree.name, spec.name, epochs=1, bytes=size, records=None, first_byte=None, last_byte=None
        )
        echo(
            f"{tree.name}: downloaded channel {spec.name} ({size / 1e6:.1f} MB) in "
            f"{time.monotonic() - started:.1f} s (File mode)"
        )

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass


def open_feeds(
    specs, trees, client, stop, on_error, echo, *, hosts=None, items=None, max_epochs=None
) -> list:
    """One feed per (channel, host) for ``trees`` (a ``JobHosts``: hosts from its ``first_index`` of the
    job's ``hosts``, all of them by default); File-mode channels are downloaded here, Pipe ones start
    later and feed ``max_epochs`` epochs (None: until stopped). Every channel is listed (and its keys
    checked) before any is downloaded, unless ``items`` (channel name -> its objects) were listed
    already."""
    hosts = len(trees) if hosts is None else hosts
    listed = [(spec, items[spec.name] if items else resolve_objects(spec, client)) for spec in specs]
    feeds: list = []
    for spec, objects in listed:
        for index, tree in enumerate(trees, trees.first_index):
            if spec.input_mode == "File":
                feeds.append(FileFeed(spec, objects, tree, client, index, hosts, echo))
            else:
                feeds.append(
                    ChannelFeeder(
                        spec, objects, tree.data_dir, index, hosts, client, stop, on_error,
                        host_name=tree.name, max_epochs=max_epochs,
                    )
                )  # fmt: skip
    return feeds


def close_feeds(feeds: list) -> None:
    for feed in feeds:
        feed.close()


def download_channel(spec: ChannelSpec, items: list[S3Item], dest: Path, client, host_index: int, hosts: int):
    """File mode: download this host's objects into ``dest`` (relative key paths kept, each one inside
    ``dest``: checked when listed, and again here with links resolved). Returns bytes."""
    from boto3.s3.transfer import TransferConfig

    dest.mkdir(parents=True, exist_ok=True)
    total = 0
    config = TransferConfig(max_concurrency=4)
    for item in epoch_objects(items, spec, 0, host_index, hosts):
        target = download_target(spec, item, dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        try:
            client.download_file(item.bucket, item.key, str(tmp), Config=config)
        except Exception as exc:  # noqa: BLE001 - botocore already retried; name the object
            tmp.unlink(missing_ok=True)
            raise FeedError(f"channel {spec.name!r}: cannot download {item.uri}: {exc}") from exc
        tmp.rename(target)
        total += target.stat().st_size
    return total


class SourceDirError(ConfigurationError):
    """The entry script's folder is missing or its package cannot be fetched."""


def fetch_source_dir(source_dir, submit_directory: str | None, work: Path, client) -> Path:
    """The entry script's folder: ``source_dir``, else ``submit_directory`` (the job's
    ``sagemaker_submit_directory``: a path, or the source package in S3, downloaded and unpacked into
    ``work/code``)."""
    if source_dir is not None:
        path = Path(source_dir).resolve()
        if not path.is_dir():
            raise SourceDirError(f"source dir {source_dir} does not exist or is not a directory")
        return path
    uri = submit_directory
    if not uri:
        raise SourceDirError(
            "no source dir: pass source_dir= or set hyperparameter sagemaker_submit_directory"
        )
    if not str(uri).startswith("s3://"):
        return fetch_source_dir(uri, None, work, client)
    bucket, key = parse_s3_uri(uri)
    target = work / "code"
    unpacked = Path(tempfile.mkdtemp(prefix=".code-", dir=work))  # beside: moved into place whole
    try:
        tarball = unpacked / "sourcedir.tar.gz"
        try:
            client.download_file(bucket, key, str(tarball))
        except Exception as exc:  # noqa: BLE001 - botocore retried already; name the object
            raise SourceDirError(f"cannot download the source package {uri}: {exc}") from exc
        (unpacked / "code").mkdir()
        with tarfile.open(tarball) as tar:
            _extract_safely(tar, unpacked / "code", uri)
        shutil.rmtree(target, ignore_errors=True)  # an earlier run's, on a platform's node
        os.replace(unpacked / "code", target)
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)
    return target


def _extract_safely(tar: tarfile.TarFile, target: Path, uri: str) -> None:
    """Unpack only plain files and folders inside ``target``, with what tarfile's ``data`` filter
    does to them (no setuid, setgid or sticky bit, no group or other write, owner read-write, our
    own owner), checked by hand first so that a Python without that filter (3.10.12+, 3.11.4+ and
    3.12 have it; Debian 12's 3.11.2 has not) refuses and strips the same; the filter runs as well
    where there is one."""
    members = [_safe_member(member, target, uri) for member in tar.getmembers()]
    if hasattr(tarfile, "data_filter"):
        tar.extractall(target, members=members, filter="data")
    else:
        tar.extractall(target, members=members)


def _safe_member(member: tarfile.TarInfo, target: Path, uri: str) -> tarfile.TarInfo:
    """``member`` as the ``data`` filter would extract it, or SourceDirError naming it."""
    fix = "pack the source dir with sagemaker-dist (or tar without links, devices or paths outside it)"
    if not (member.isfile() or member.isdir()):
        raise SourceDirError(
            f"the source package {uri} holds {member.name!r}, which is not a plain file or folder; {fix}"
        )
    if not (member.isdir() and member.name in (".", "./")):  # the package's own top folder
        contained_path(target, member.name, f"the source package {uri} holds", fix=fix, error=SourceDirError)
    mode = member.mode & 0o755  # no setuid, setgid, sticky; no group or other write
    if member.isfile():
        mode = (mode if mode & 0o100 else mode & ~0o111) | 0o600
    else:
        mode |= 0o700
    member.mode = mode
    member.uid, member.gid = os.getuid(), os.getgid()
    member.uname = member.gname = ""
    return member
