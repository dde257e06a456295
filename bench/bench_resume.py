"""What resuming a shuffled epoch costs: the state kept, and the time from ``load_state_dict`` to the
first batch after the records already trained, at 1 and 10 million records per rank.

For each count N, a stream of N + 16 batches of 100-byte TFRecords goes through a FIFO from a writer
process (``bench_pipe_reader.py``'s). ``resume``: a reader (shuffled, ``ShuffleWindow(7)``) that loaded
the state of one that had handed out N records of the epoch (as a stop's checkpoint holds it) reads the
FIFO and drops those N records, unread into batches; the clock runs from ``iter()`` to its first batch.
``read``: the same reader reading the same N records into batches (the reference: what the stopped
attempt paid for them). ``replay``: the restarted job's reader under a ShuffleConfig opening and closing
10 FIFOs unread (the feeder's next FIFO made once the last is closed) before the stopped epoch's; per
FIFO. ``state``: the bytes of the state as JSON. Readers: ``RecordBatches(record_bytes=100)`` and
``PipeBatches`` (records as ``bytes``, no decode). Runs interleaved, medians.

    .venv/bin/python bench/bench_resume.py [--counts 1000000,10000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pipe_reader import rotated, start_writer  # noqa: E402

from sagemaker_dist.contract.record_formats import encode_tfrecord  # noqa: E402

BATCH, SIZE, REPLAYED = 256, 100, 10


def make_stream(path: Path, records: int) -> None:
    block = b"".join(encode_tfrecord(i.to_bytes(4, "little") * (SIZE // 4)) for i in range(4096))
    with open(path, "wb") as f:
        for start in range(0, records, 4096):
            f.write(block if records - start >= 4096 else block[: (records - start) * (SIZE + 16)])


def opt_ml(base: Path, name: str, shuffled_objects: bool = False) -> Path:
    from sagemaker_dist.contract.layout import LAYOUT_HYPERPARAMETER, plan_layout

    root = base / name
    (root / "input" / "data").mkdir(parents=True)
    (root / "input" / "config").mkdir(parents=True)
    pipe = {"TrainingInputMode": "Pipe", "RecordWrapperType": "None"}
    (root / "input" / "config" / "inputdataconfig.json").write_text(json.dumps({"train_0": pipe}))
    layout = plan_layout(1, 1, shuffle_seed=3 if shuffled_objects else None)
    (root / "input" / "config" / "hyperparameters.json").write_text(
        json.dumps({LAYOUT_HYPERPARAMETER: layout.to_json()})
    )
    return root


def make_reader(kind: str, root: Path):
    from sagemaker_dist.runtime import PipeBatches, RecordBatches
    from sagemaker_dist.runtime.config import ContainerConfig

    config = ContainerConfig.load(root, {})
    if kind == "RecordBatches":
        return RecordBatches("train_0", BATCH, record_bytes=SIZE, config=config, shuffle=7, pin_memory=False)
    return PipeBatches("train_0", BATCH, config=config, shuffle=7, pin_memory=False)


def one_run(kind: str, arm: str, base: Path, src: Path, n: int, run: int) -> float:
    root = opt_ml(base, f"{kind}-{arm}-{n}-{run}")
    writer = start_writer(src, root / "input" / "data" / "train_0_0")
    reader = make_reader(kind, root)
    if arm == "resume":
        state = reader.state_dict()
        state.update(epoch=0, records=n, fifo=0)
        reader.load_state_dict(state)
    started = time.perf_counter()
    got = 0
    batches = iter(reader)
    for batch in batches:
        got += len(batch)
        if arm == "resume" or got >= n:
            break
    took = time.perf_counter() - started
    batches.close()  # the rest of the FIFO closed unread
    writer.kill()
    writer.wait()
    return took


def replay_run(base: Path, run: int) -> float:
    """Seconds per FIFO replayed: REPLAYED FIFOs opened and closed unread, each made once the last closed."""
    from sagemaker_dist.runtime.config import ContainerConfig
    from sagemaker_dist.runtime.epoch_reader.order import replay_fifos

    root = opt_ml(base, f"replay-{run}", shuffled_objects=True)
    data = root / "input" / "data"
    done = threading.Event()

    def feed():  # SageMaker's part: FIFO n+1 once FIFO n is closed
        for n in range(REPLAYED + 1):
            path = data / f"train_0_{n}"
            os.mkfifo(path)
            try:
                with open(path, "wb") as f:
                    while not done.is_set():
                        f.write(b"\0" * 65536)
            except BrokenPipeError:
                pass
            path.unlink()

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    started = time.perf_counter()
    assert replay_fifos(ContainerConfig.load(root, {}), "train_0", REPLAYED, 30) == REPLAYED
    took = time.perf_counter() - started
    done.set()
    return took / REPLAYED


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="1000000,10000000", help="records already trained per rank")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--readers", default="RecordBatches,PipeBatches")
    args = parser.parse_args()
    import torch  # noqa: F401 - every PyTorch script has it; not timed

    from sagemaker_dist.runtime.framing.shuffle import ShuffleWindow

    print(
        f"{os.cpu_count()} CPU(s), {SIZE}-byte TFRecords through a FIFO, batches of {BATCH}, shuffle="
        f"{ShuffleWindow(7)}, median of {args.repeats} interleaved runs"
    )
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        base = Path(tmp)
        state = None
        for n in [int(c) for c in args.counts.split(",")]:
            src = base / f"stream-{n}.tfrecord"
            make_stream(src, n + 16 * BATCH)
            arms = [(k, a) for k in args.readers.split(",") for a in ("read", "resume")]
            times: dict = {arm: [] for arm in arms}
            for round_ in range(args.repeats):
                for kind, arm in rotated(arms, round_):
                    times[(kind, arm)].append(one_run(kind, arm, base, src, n, round_))
            print(f"-- {n:,} records ({n * (SIZE + 16) / 1e9:.2f} GB) trained before the stop, load average "
                  f"{os.getloadavg()[0]:.1f}")  # fmt: skip
            for kind in args.readers.split(","):
                read, resume = (statistics.median(times[(kind, a)]) for a in ("read", "resume"))
                print(f"{kind:>14}: to the first batch after them {resume:6.2f} s; reading them into batches "
                      f"{read:6.2f} s ({read / resume:.1f}x the resume's time)")  # fmt: skip
            src.unlink()
            position = make_reader("RecordBatches", opt_ml(base, f"state-{n}")).state_dict()
            position.update(epoch=3, records=n, fifo=3)
            state = json.dumps(position)
            print(f"{'state':>14}: {len(state)} bytes as JSON ({state})")
        replays = [replay_run(base, r) for r in range(args.repeats)]
        print(f"{'replay':>14}: {statistics.median(replays) * 1000:.1f} ms a FIFO opened and closed unread")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
