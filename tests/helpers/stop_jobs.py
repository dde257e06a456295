"""A one-host /opt/ml tree for horovodrun tests, and FIFOs fed with TFRecords whose ``id`` says which
record each is (rank r's shard: ids r*N .. r*N+N-1, the same every epoch, as without a ShuffleConfig)."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

from sagemaker_dist.contract.layout import LAYOUT_HYPERPARAMETER, plan_layout
from sagemaker_dist.local.demo_data import encode_example, generate_examples, tfrecord_frame


def shard_bytes(first_id: int, count: int, seed: int) -> bytes:
    return b"".join(
        tfrecord_frame(encode_example({"image": image, "label": label, "id": first_id + i}))
        for i, (image, label) in enumerate(generate_examples(count, seed))
    )


def write_config(root: Path, world: int, validation: str | None = None) -> None:
    """A host running ``world`` ranks, Pipe channels train_0 .. train_<world-1> (and validation's)."""
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (root / "input" / "data").mkdir(parents=True)
    layout = plan_layout(1, world, validation=validation)
    channels = {
        name: {
            "TrainingInputMode": "Pipe",
            "S3DistributionType": "FullyReplicated",
            "RecordWrapperType": "None",
        }
        for name in layout.channel_names
    }
    resource = {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "lo"}
    (config / "resourceconfig.json").write_text(json.dumps(resource))
    (config / "inputdataconfig.json").write_text(json.dumps(channels))
    (config / "hyperparameters.json").write_text(json.dumps({LAYOUT_HYPERPARAMETER: layout.to_json()}))


def feed_fifo(
    path: Path, data: bytes, deadline: float, after: threading.Thread | None = None
) -> threading.Thread:
    """Create FIFO ``path`` (once ``after``, the previous epoch's feeder, is done) and write ``data``
    into it when a reader opens it, as SageMaker does; gives up at ``deadline``."""

    def run():
        if after is not None:
            after.join(max(0.0, deadline - time.monotonic()))
            if after.is_alive():
                return
        os.mkfifo(path)
        while time.monotonic() < deadline:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except FileNotFoundError:  # the reader's side removed it (its job ended)
                return
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                    raise
                time.sleep(0.02)
        else:
            return
        os.set_blocking(fd, True)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except BrokenPipeError:
            pass
        finally:
            os.close(fd)

    thread = threading.Thread(target=run, daemon=True, name=f"feed-{path.name}")
    thread.start()
    return thread


def feed_epochs(data_dir: Path, world: int, per_rank: int, epochs: int, deadline: float) -> None:
    """FIFOs train_<r>_<e> for every rank and epoch, each made once the one before was read."""
    for r in range(world):
        data = shard_bytes(r * per_rank, per_rank, seed=r)
        before = None
        for e in range(epochs):
            before = feed_fifo(data_dir / f"train_{r}_{e}", data, deadline, before)


def trained_segments(path: Path) -> list[dict]:
    """A rank's attempts in order from the trained-rank<R>.jsonl lines train_ids.py writes: each
    {"start": {"epoch": ..., "step": ...}, "epochs": {epoch: [ids of each batch]}}."""
    attempts = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if "start" in entry:
            attempts.append({"start": entry, "epochs": {}})
        else:
            attempts[-1]["epochs"].setdefault(entry["epoch"], []).append(entry["ids"])
    return attempts


def after_batches(out: Path, batches: int, rank: int = 0):
    """A spot interruption's ``when`` (``run_interrupted``): the first attempt is interrupted once rank
    ``rank`` has logged ``batches`` trained batches to ``out``/trained-rank<R>.jsonl: a point of the
    training, whatever the start-up takes on a loaded machine."""
    path = out / f"trained-rank{rank}.jsonl"

    def when(attempt: int) -> bool:
        try:
            lines = path.read_text().count("\n")
        except FileNotFoundError:
            return False
        return attempt == 1 and lines - 1 >= batches  # the attempt's start line, then a line a batch

    return when


def check_resumed_inside_the_epoch(
    one: dict, two: dict, stopped_at: tuple[int, int], steps: int, epochs: int, split_tail: bool = False
):
    """One rank's two attempts (``trained_segments``), stopped after ``stopped_at`` (epoch counted from
    1, step) of ``steps`` an epoch: the epochs before the stop trained whole and once, the second attempt
    starts at the stop's step (no epoch restarted), the stopped epoch's batches are each trained once
    across both attempts (no batch skipped, none repeated), and the later epochs train the same shard.
    A stop on the epoch's last step is a checkpoint of the whole epoch: the second attempt starts the next.
    A stop agreed before an epoch's first batch (step 0, as the PyTorch helpers can agree one) trained none
    of it: the second attempt trains that epoch whole.

    ``split_tail`` (tf-mwms): tf.distribute splits a worker's merged batch over every replica in sync,
    so a resume after an odd step leaves one batch alone at the epoch's end, trained as two half
    batches; then every record of the stopped epoch is trained once, and every batch but those two
    is one of the epoch's batches."""
    epoch, step = stopped_at
    for e in range(epoch - 1):
        assert len(one["epochs"][e]) == steps
    # trained up to the agreed step, then stopped; step 0: the stop came before the epoch's first batch
    stopped = one["epochs"].get(epoch - 1, [])
    assert len(stopped) == step
    if step == steps:  # the stop was its epoch's last step: checkpointed whole, resumed at the next
        assert (two["start"]["epoch"], two["start"]["step"]) == (epoch, 0)
        assert not two["epochs"] or min(two["epochs"]) == epoch
        for e in range(epoch, epochs):
            assert sorted(sum(two["epochs"][e], [])) == sorted(sum(stopped, []))
        return
    assert (two["start"]["epoch"], two["start"]["step"]) == (epoch - 1, step)
    assert min(two["epochs"]) == epoch - 1  # no epoch restarted
    resumed = stopped + two["epochs"][epoch - 1]
    other = one["epochs"][0] if epoch > 1 else two["epochs"].get(epoch)  # a whole epoch of the shard
    whole = sorted(sum(other, [])) if other else None
    if split_tail and len(resumed) == steps + 1:
        records = sorted(sum(resumed, []))
        assert len(set(records)) == len(records) and records == (whole or records), (
            "the stopped epoch: every record once across both attempts"
        )
        resumed = resumed[:-2] + [resumed[-2] + resumed[-1]]
    assert len(resumed) == steps, "the stopped epoch: every batch once across both attempts"
    assert len({tuple(b) for b in resumed}) == steps
    if whole:
        assert sorted(sum(resumed, [])) == whole
    for e in range(epoch, epochs):
        assert sorted(sum(two["epochs"][e], [])) == sorted(sum(resumed, []))
