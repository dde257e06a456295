"""What the SageMaker platform does on a job's hosts around the ranks, written once for local mode's
simulated hosts (all of them, on one machine) and the platforms' pipe agent (the one node it runs on).

In order: checkpoints restored from ``CheckpointConfig.S3Uri`` into each host's tree, every channel
listed and the File-mode ones downloaded (before any rank starts), then, while the ranks run, the
Pipe-mode FIFOs fed and the checkpoints synced back every few seconds; at the end the feeds closed,
the checkpoints synced a last time and, from the job's first host, ``model.tar.gz`` and
``output.tar.gz`` packed into the output path. The ``/opt/ml`` trees themselves are
``host_trees_for``'s; starting and watching the ranks is the caller's.
"""

from __future__ import annotations

import threading

from sagemaker_dist.contract.training_request import MODEL_TARBALL, OUTPUT_TARBALL
from sagemaker_dist.errors import DataError
from sagemaker_dist.host.feeds import close_feeds, open_feeds
from sagemaker_dist.host.opt_ml import JobHosts
from sagemaker_dist.host.outputs import CheckpointSync, pack_and_upload


class OutputUploadError(DataError):
    """The job's model or output could not be packed into the output path; names the host and target."""


class HostLifecycle:
    """The platform's side of a job (a ``JobSpec``) on ``trees``: every host's (local mode) or one
    node's (``JobHosts.node``, a pipe agent).

    Entering it restores the checkpoints and opens the feeds (File mode downloads there); ``start``
    starts the feeds and the checkpoint sync; ``finish`` (the ranks ended well) stops feeding and
    syncs the checkpoints; leaving it closes everything, on any exit. ``errors`` collects what a feed
    reported while running. ``channels`` are those the hosts feed (every channel by default), ``items``
    their objects where the caller listed them already, ``max_epochs`` a Pipe feed's epochs.
    ``announce_uploads``: a line per tarball uploaded (the pipe agent's log; local mode's summary
    names the model's URI, and its job lines are the ranks' own).
    """

    def __init__(
        self,
        job,
        trees: JobHosts,
        client,
        echo=print,
        *,
        channels=None,
        items=None,
        stop: threading.Event | None = None,
        max_epochs: int | None = None,
        label: str = "",
        announce_uploads: bool = False,
    ):
        self.job, self.trees, self.client, self.echo = job, trees, client, echo
        self.label, self.announce_uploads = label, announce_uploads
        self.channels = job.channels if channels is None else channels
        self._items, self._max_epochs = items, max_epochs
        self.stop = stop or threading.Event()
        self.errors: list[str] = []
        self.feeds: list = []
        local_dirs = [t.checkpoint_dir for t in self.trees]
        self.checkpoints = CheckpointSync(job.checkpoint_s3_uri, local_dirs, client)

    def __enter__(self) -> HostLifecycle:
        try:
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
