"""Upload TensorBoard logs from rank 0 to S3 while training runs, so curves show up before the job ends.

A daemon thread runs a round of the S3 mirror (``s3_mirror``: upload the files new or changed since the
last round) every ``interval`` seconds. botocore retries each call; a round that still fails is logged
and tried again next round. Nothing here raises into the training loop and the training thread never
waits on S3, except for the final flush, which is bounded by ``flush_timeout``. Framework-neutral: the
Keras callback that syncs at epoch ends is
``runtime.tensorflow.keras.tensorboard_callback.TensorBoardSyncCallback`` (``keras_callback`` imports it
when called); the training session (``training_session.TrainingSession``) starts the chief's syncer for
every front end, and PyTorch's ``PipeTraining`` asks it for ``sync_now`` after flushing its writer.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from pathlib import Path

from sagemaker_dist.contract.s3_uri import S3UriError, parse_s3_uri
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime.s3_mirror import DEFAULT_MAX_ATTEMPTS, S3Mirror

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 30.0
DEFAULT_FLUSH_TIMEOUT = 60.0


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")``; errors name TensorBoard."""
    try:
        bucket, prefix = parse_s3_uri(uri)
    except S3UriError as exc:
        raise ConfigurationError(f"TensorBoard S3 location: {exc}") from None
    return bucket, prefix.strip("/")


class TensorBoardSyncer:
    """Mirror ``log_dir`` to ``s3_uri`` from a background thread (start it on rank 0 only).

    ``start()`` begins periodic uploads and registers a final flush at interpreter exit; ``sync_now()``
    asks for an upload round without waiting; ``stop()`` uploads what is left and waits at most
    ``flush_timeout`` seconds. ``uploads``, ``failures``, ``last_error`` and ``cpu_seconds`` say how it went.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike,
        s3_uri: str,
        *,
        interval: float = DEFAULT_INTERVAL,
        flush_timeout: float = DEFAULT_FLUSH_TIMEOUT,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        client=None,
    ):
        if interval <= 0:
            raise ConfigurationError(
                f"TensorBoard sync interval is {interval!r}; give a number of seconds > 0"
            )
        self.log_dir = Path(log_dir)
        self.s3_uri = s3_uri
        self.bucket, self.prefix = split_s3_uri(s3_uri)
        self.interval = float(interval)
        self.flush_timeout = float(flush_timeout)
        self.max_attempts = int(max_attempts)
        self.failures = 0
        self.cpu_seconds = 0.0  # CPU time the sync thread used: what it can take from training
        self.last_error: BaseException | None = None
        self._mirror = S3Mirror(
            self.log_dir, self.bucket, self.prefix, max_attempts=max_attempts, client=client
        )
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def uploads(self) -> int:
        """Files uploaded by the rounds that finished."""
        return self._mirror.uploads

    # -- public API -------------------------------------------------------------------------------
    def start(self) -> TensorBoardSyncer:
        """Start the background thread (idempotent) and register the final flush at exit."""
        if self._thread is None:
            self._mirror.client()  # build the client now: at interpreter exit boto3 can no longer be set up
            self._thread = threading.Thread(target=self._run, name="tensorboard-s3-sync", daemon=True)
            self._thread.start()
            atexit.register(self.stop)
            log.info("TensorBoard sync: %s -> %s every %.0fs", self.log_dir, self.s3_uri, self.interval)
        return self

    def sync_now(self) -> None:
        """Ask the thread for an upload round now; returns at once."""
        self._wake.set()

    def stop(self, timeout: float | None = None) -> bool:
        """Final upload round, bounded by ``timeout`` (default ``flush_timeout``); True if it finished."""
        thread = self._thread
        if thread is None:
            return True
        self._stopping = True
        self._wake.set()
        thread.join(self.flush_timeout if timeout is None else timeout)
        finished = not thread.is_alive()
        # one bounded wait only: after a timed-out flush (S3 hanging) the exit handler must not wait
        # again; the daemon thread keeps trying until the interpreter exits
        atexit.unregister(self.stop)
        if finished:
            self._thread = None
        else:
            log.warning(
                "TensorBoard sync: final upload to %s did not finish within %.0fs; "
                "training goes on without it",
                self.s3_uri,
                self.flush_timeout if timeout is None else timeout,
            )
        return finished

    def sync_once(self) -> int:
        """Upload every new or changed file once; returns how many were uploaded. Raises on S3 errors."""
        return self._mirror.upload_changed()

    def keras_callback(self, tensorboard=None):
        """A Keras callback: sync at each epoch end (flushing ``tensorboard``'s writers first), stop at
        train end. Pass the ``tf.keras.callbacks.TensorBoard`` instance so epoch scalars reach disk."""
        from sagemaker_dist.runtime.tensorflow.keras.tensorboard_callback import (
            TensorBoardSyncCallback,  # loads TF
        )

        return TensorBoardSyncCallback(self, tensorboard)

    def __enter__(self) -> TensorBoardSyncer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- internals --------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            final = self._stopping
            self._sync_logged()
            if final:
                return

    def _sync_logged(self) -> None:
        started = time.thread_time()
        try:
            self.sync_once()
        except Exception as exc:  # S3 trouble must never reach the training loop
            self.failures += 1
            self.last_error = exc
            log.error(
                "TensorBoard sync to %s failed (%s: %s); will try again in %.0fs",
                self.s3_uri,
                type(exc).__name__,
                exc,
                self.interval,
            )
        finally:
            self.cpu_seconds += time.thread_time() - started


def start_tensorboard_sync(
    log_dir: str | os.PathLike, s3_uri: str | None, *, rank: int, **kwargs
) -> TensorBoardSyncer | None:
    """Start a syncer on rank 0 when ``s3_uri`` is set; None elsewhere (other ranks write no logs)."""
    if rank != 0 or not s3_uri:
        return None
    return TensorBoardSyncer(log_dir, s3_uri, **kwargs).start()
