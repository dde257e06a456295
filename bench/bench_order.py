"""What the order of the records does to learning: the demo models trained on data laid out one class
per object, under each order the product offers (figures in docs/benchmarks.md, "Record order and
learning").

The train set is the demo's CIFAR-shaped records (``local.demo_data.generate_examples``: a colour per
class under noise, a quarter of the labels random) grouped by label into ``--objects-per-class``
objects per class of ``--records-per-object`` records each, named so that key order is class order: the
layout of data written one class (or day, or source) at a time. The validation set is mixed, as the
demo's. Each order is a real local-mode job (2 hosts x 1 rank, Pipe mode) of the demo script of each
framework (``train_cifar10.py`` under Horovod, ``train_torch.py`` under torchrun), for ``--epochs``
epochs; the figure is rank 0's ``val_accuracy`` at each epoch's end (the metric line):

- ``fixed``: the stream's order (``--reader-shuffle-seed -1``), no ShuffleConfig;
- ``window N``: the reader's seeded shuffle window of N records (smaller than a rank's epoch);
- ``window N + ShuffleConfig``: the same window, and SageMaker's ShuffleConfig (another permutation of the
  objects each epoch before ShardedByS3Key deals them to the hosts);
- ``window``: the reader's default window (4096 records; here more than a rank's epoch).

    .venv/bin/python bench/bench_order.py [--epochs 4] [--frameworks horovod,torchrun]
        [--window 1000] [--plot docs/img/order_learning.png]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sagemaker_dist import embedded_s3, run_local  # noqa: E402
from sagemaker_dist.contract.distributions import distribution as registered  # noqa: E402
from sagemaker_dist.contract.metric_line import PREFIX  # noqa: E402
from sagemaker_dist.launch.records import encode_example  # noqa: E402
from sagemaker_dist.local.backend import LocalBackend  # noqa: E402
from sagemaker_dist.local.demo import DEMO_JOB_DIR, demo_estimator  # noqa: E402
from sagemaker_dist.local.demo_data import (  # noqa: E402
    IMAGE_KEY,
    LABEL_KEY,
    NUM_CLASSES,
    generate_examples,
    tfrecord_file,
    tfrecord_frame,
)
from sagemaker_dist.local.endpoint import s3_client  # noqa: E402

BUCKET = "bench-order"
SHUFFLE_CONFIG_SEED = 7
VAL_ACCURACY = re.compile(r"epoch=(\d+)\b.*\bval_accuracy=([0-9.eE+-]+)")


def write_class_sorted(client, objects_per_class: int, records_per_object: int) -> int:
    """The train set one class per object, key order = class order; the mixed validation set."""
    by_label: dict[int, list[bytes]] = {label: [] for label in range(NUM_CLASSES)}
    wanted = objects_per_class * records_per_object
    seed = 0
    while min(len(v) for v in by_label.values()) < wanted:
        for image, label in generate_examples(4096, seed=1000 + seed):
            if len(by_label[label]) < wanted:
                by_label[label].append(tfrecord_frame(encode_example({IMAGE_KEY: image, LABEL_KEY: label})))
        seed += 1
    for label, frames in by_label.items():
        for part in range(objects_per_class):
            body = b"".join(frames[part * records_per_object : (part + 1) * records_per_object])
            key = f"sorted/train/class-{label:02d}-part-{part:02d}.tfrecord"
            client.put_object(Bucket=BUCKET, Key=key, Body=body)
    for part in range(2):
        body = tfrecord_file(500, 99 + part)
        client.put_object(Bucket=BUCKET, Key=f"sorted/validation/part-{part}.tfrecord", Body=body)
    return NUM_CLASSES * wanted


def orders(window: int) -> list[tuple[str, dict, int | None]]:
    """(name, the script's hyperparameters, ShuffleConfig's seed) of each order measured."""
    small = {"reader_shuffle_seed": 0, "reader_shuffle_records": window}
    return [
        ("fixed", {"reader_shuffle_seed": -1}, None),
        (f"window {window}", small, None),
        (f"window {window} + ShuffleConfig", small, SHUFFLE_CONFIG_SEED),
        ("window", {"reader_shuffle_seed": 0}, None),
    ]


def train(framework: str, hyperparameters: dict, shuffle_seed: int | None, epochs: int, name: str):
    """One local job; rank 0's val_accuracy after each epoch."""
    estimator = demo_estimator(
        BUCKET,
        2,
        1,
        "Pipe",
        {"epochs": epochs, "batch_size": 32, **hyperparameters},
        entry_point=registered(framework).demo_script,
        distribution=framework,
        shuffle_seed=shuffle_seed,
    )
    inputs = {"train": f"s3://{BUCKET}/sorted/train/", "validation": f"s3://{BUCKET}/sorted/validation/"}
    request = estimator.prepare(inputs, name, printer=None, backend=LocalBackend()).request
    result = run_local(request, DEMO_JOB_DIR, echo=lambda line: None)  # LocalJobFailed names a failure
    accuracy: dict[int, float] = {}
    for line in result.output:
        if PREFIX in line and (match := VAL_ACCURACY.search(line)):
            accuracy[int(match.group(1))] = float(match.group(2))
    if sorted(accuracy) != list(range(1, epochs + 1)):
        raise SystemExit(f"{name}: metric lines for epochs {sorted(accuracy)}, wanted 1..{epochs}")
    return [accuracy[e] for e in range(1, epochs + 1)]


def plot(results: dict[str, dict[str, list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6), sharey=True, squeeze=False)
    for ax, (framework, rows) in zip(axes[0], results.items()):
        for name, values in rows.items():
            ax.plot(range(1, len(values) + 1), values, marker="o", label=name)
        ax.set_title(f"{framework}: class-sorted objects")
        ax.set_xlabel("epoch")
        ax.set_xticks(range(1, len(next(iter(rows.values()))) + 1))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("validation accuracy (rank 0)")
    axes[0][-1].legend(loc="center right", fontsize=8)  # clear of the curves: they lie near 0.1-0.25 and 0.77
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--frameworks", default="horovod,torchrun")
    parser.add_argument("--objects-per-class", type=int, default=2)
    parser.add_argument("--records-per-object", type=int, default=400)
    parser.add_argument("--window", type=int, default=1000, help="records in the small window")
    parser.add_argument("--plot", type=Path, default=None, help="write the accuracy curves to this PNG")
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {}
    with embedded_s3(state_dir=None):
        client = s3_client()
        client.create_bucket(Bucket=BUCKET)
        total = write_class_sorted(client, args.objects_per_class, args.records_per_object)
        print(
            f"cpus: {os.cpu_count()}; train: {total} records in "
            f"{NUM_CLASSES * args.objects_per_class} objects, one class each "
            f"({args.records_per_object} records an object); 2 hosts x 1 rank; "
            f"{args.epochs} epochs; figure: rank 0's val_accuracy after each epoch"
        )
        for framework in args.frameworks.split(","):
            rows = results.setdefault(framework, {})
            for i, (name, hps, shuffle_seed) in enumerate(orders(args.window)):
                start = time.monotonic()
                rows[name] = train(framework, hps, shuffle_seed, args.epochs, f"order-{framework}-{i}")
                figures = " ".join(f"{v:.3f}" for v in rows[name])
                print(f"{framework:>9} {name:<30} {figures}   ({time.monotonic() - start:.0f} s)", flush=True)
    if args.plot:
        plot(results, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
