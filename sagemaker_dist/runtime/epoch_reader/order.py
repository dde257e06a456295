"""A reader's place in its channel, and what a restarted job does to read an epoch's records again.

A restarted job (a spot interruption, a rerun) gets fresh FIFOs: ``<channel>_0`` again. Where the
channel's objects come in the same order every epoch (no ShuffleConfig, the planner's seeded order
included), every FIFO carries the same records, so the resumed epoch reads its first FIFO and drops the
records trained before the stop. Where they come in another order each epoch (SageMaker's ShuffleConfig,
the pipe agent's ``--shuffle-seed``; with ShardedByS3Key each host also gets other objects), the
records of the stopped epoch are those of the FIFO it read, ``<channel>_<F>``: the restarted job opens
and closes ``<channel>_0 .. <channel>_<F-1>`` unread (``replay_fifos``), and ``<channel>_<F>`` carries
the same objects in the same order again, because the order of each epoch is drawn from the seed and
the epoch's number (as the feeders here draw it, and as SageMaker's Seed is documented to determine it).
"""

from __future__ import annotations

import os
import select
import time
from dataclasses import dataclass
from pathlib import Path

from sagemaker_dist.errors import DataError
from sagemaker_dist.runtime.epoch_reader.epochs import current_epoch, next_epoch_fifo
from sagemaker_dist.runtime.fifo import FifoTimeoutError

# Beside the FIFOs, a feeder that permutes a channel's objects each epoch without a ShuffleConfig in the
# job's layout (the pipe agent's --shuffle-seed) leaves this file: ``.<channel>.per-epoch-order``.
PER_EPOCH_ORDER_SUFFIX = ".per-epoch-order"
STATE_VERSION = 1


class ReaderStateError(DataError):
    """A reader's saved position that this reader cannot take up exactly."""


def per_epoch_order_marker(data_dir: str | os.PathLike, channel: str) -> Path:
    return Path(data_dir) / f".{channel}{PER_EPOCH_ORDER_SUFFIX}"


def per_epoch_order(config, channel: str) -> bool:
    """Whether ``channel``'s objects come in another order each epoch: a ShuffleConfig in the job's
    layout, or a feeder's marker beside the FIFOs."""
    try:
        layout = config.layout
    except Exception:  # a layout it cannot read is the start-up check's to report
        layout = None
    if layout is not None and layout.shuffle_seed is not None:
        return True
    return per_epoch_order_marker(config.data_dir, channel).exists()


def close_unread(path: Path, timeout: float) -> None:
    """Open FIFO ``path``, wait (at most ``timeout`` s) for its writer's first bytes or its end, and
    close it: the writer goes on to the next epoch's FIFO, as after an iteration left early."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        deadline = time.monotonic() + timeout
        while True:  # a reader that is open: the writer's open succeeds, then its bytes (or its close) come
            left = deadline - time.monotonic()
            if left <= 0:
                raise FifoTimeoutError(
                    f"{path}: no writer came within {timeout:g} s to the FIFO skipped on the way to the "
                    "stopped epoch's"
                )
            if select.select([fd], [], [], min(left, 1.0))[0]:
                return
    finally:
        os.close(fd)


def replay_fifos(config, channel: str, fifo: int, timeout: float) -> int:
    """Before a restarted job reads the epoch that FIFO ``fifo`` carried in the stopped one: where the
    channel's objects come in another order each epoch, open and close the FIFOs before it unread, so the
    next one read is ``<channel>_<fifo>``. Returns the FIFOs skipped."""
    if fifo <= 0 or not per_epoch_order(config, channel):
        return 0
    state_dir, data_dir = Path(config.pipe_state_dir), Path(config.data_dir)
    skipped = 0
    while current_epoch(state_dir, channel) < fifo:
        _, path = next_epoch_fifo(state_dir, data_dir, channel, timeout)
        close_unread(path, timeout)
        skipped += 1
    return skipped


def other_world_line(epoch: int, step: int, saved: int, size: int) -> str:
    """The line a job prints when it resumes from a checkpoint written inside epoch ``epoch`` (0-based)
    after ``step`` steps by ``saved`` ranks, running ``size``: it resumes at the next epoch's start."""
    return (
        f"sagemaker-dist: the checkpoint was written inside epoch {epoch + 1} (after step {step}) by {saved} "
        f"rank(s) and this job runs {size}: each rank reads another stream now, so the records of epoch "
        f"{epoch + 1} not trained before the stop are not trained; resuming at the start of epoch {epoch + 2}"
    )


EPOCH_BASE_DIR = ".epoch-base"


def epoch_base(state_dir: str | os.PathLike, channel: str) -> int:
    """What a TensorFlow reader adds to a FIFO's number to get the epoch it shuffles it as (0 unless a
    resumed job said otherwise: ``set_epoch_base``); the compiled op reads the same file."""
    try:
        text = (Path(state_dir) / EPOCH_BASE_DIR / channel).read_text().strip()
    except FileNotFoundError:
        return 0
    return int(text) if text else 0


def set_epoch_base(state_dir: str | os.PathLike, channel: str, base: int) -> None:
    """Shuffle the FIFO number ``n`` of ``channel`` as epoch ``n + base`` from the next iteration on."""
    folder = Path(state_dir) / EPOCH_BASE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{channel}.tmp"
    tmp.write_text(str(int(base)))
    os.replace(tmp, folder / channel)


HEADS_DIR = ".heads"


def write_head(state_dir: str | os.PathLike, channel: str, fifo: int, head: int) -> None:
    """Note the head (``framing.shuffle.StreamHead``) of FIFO ``<channel>_<fifo>``: the TensorFlow
    readers' way to tell the Keras helpers (the compiled op writes the same file)."""
    folder = Path(state_dir) / HEADS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{channel}_{fifo}").write_text(f"{head:016x}")


def read_head(state_dir: str | os.PathLike, channel: str, fifo: int) -> int | None:
    try:
        return int((Path(state_dir) / HEADS_DIR / f"{channel}_{fifo}").read_text().strip(), 16)
    except (FileNotFoundError, ValueError):
        return None


def head_mismatch_line(channel: str, fifo, saved_fifo, epoch: int, dropped: str) -> str:
    """The line a resumed reader prints when the FIFO it reads the stopped epoch from does not start
    with the records the stopped attempt's did (an order of the channel's objects not reproduced)."""
    return (
        f"sagemaker-dist: WARNING: {channel}_{fifo}, read for epoch {epoch + 1} after a restart, does not "
        f"start with the records the stopped attempt's {channel}_{saved_fifo} started with: the channel's "
        f"objects did not come in the same order again, so the {dropped} dropped as trained before the "
        "stop are not exactly those (some records of that epoch are trained twice, others not at all)"
    )


@dataclass
class EpochPosition:
    """Where a reader is: ``epoch`` (the shuffle's), ``records`` of it handed out, ``fifo`` (the FIFO
    number it reads; None for a File channel or before it opened one), ``done`` once read to the end,
    ``head`` the digest of its stream's first records (``StreamHead``) once read; ``expected``: the head
    the stopped attempt's stream had, with its FIFO (a loaded state inside an epoch, this rank's)."""

    epoch: int
    records: int = 0
    fifo: int | None = None
    done: bool = False
    head: int | None = None
    expected: tuple[int, int | None] | None = None

    def after(self, resume: EpochPosition | None, next_epoch: int) -> EpochPosition:
        """The position a ``state_dict()`` reports: a loaded one not yet iterated, else the iteration
        under way (or left early), else the start of the next epoch."""
        if resume is not None:
            return resume
        if self.done:
            return EpochPosition(epoch=next_epoch)
        return self

    def to_dict(self, shuffle: dict | None, channel: str, rank: int = 0) -> dict:
        return {
            "version": STATE_VERSION,
            "channel": channel,
            "rank": rank,
            "epoch": self.epoch,
            "records": self.records,
            "fifo": self.fifo,
            "head": self.head,
            "shuffle": shuffle,
        }

    @classmethod
    def from_dict(cls, state: dict, shuffle: dict | None, channel: str, rank: int = 0) -> EpochPosition:
        """The position in ``state``; a state inside an epoch of another channel or another shuffle (seed,
        window, rank) is refused: its records would be others."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ReaderStateError(
                f"channel {channel!r}: {state!r} is not a reader state of version {STATE_VERSION} "
                "(a state_dict() of PipeBatches or RecordBatches)"
            )
        position = cls(
            epoch=int(state["epoch"]),
            records=int(state["records"]),
            fifo=state.get("fifo"),
            head=state.get("head"),
        )
        if position.records and state.get("head") is not None and state.get("rank", rank) == rank:
            position.expected = (int(state["head"]), state.get("fifo"))  # this rank's stream's head
        if position.epoch < 0 or position.records < 0:
            raise ReaderStateError(
                f"channel {channel!r}: the state's epoch and records must be >= 0: {state!r}"
            )
        if position.records:
            if state.get("channel") != channel:
                raise ReaderStateError(
                    f"the state was saved inside epoch {position.epoch} of channel {state.get('channel')!r}; "
                    f"this reader reads {channel!r}, whose records are others (another rank or layout): "
                    "resume at the start of an epoch instead (a state with records 0)"
                )
            if state.get("shuffle") != shuffle:
                raise ReaderStateError(
                    f"channel {channel!r}: the state was saved inside epoch {position.epoch} under the "
                    f"shuffle {state.get('shuffle')!r}, this reader shuffles {shuffle!r}: its first "
                    f"{position.records} records would be others; give the reader the same shuffle= (and "
                    "rank), or resume at the start of an epoch"
                )
        return position
