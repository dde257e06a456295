"""Train a tiny CNN on CIFAR-10-shaped TFRecords with PyTorch DDP under torchrun, each rank reading its
own Pipe-mode channel (the demo of ``distribution='torchrun'``; no TensorFlow needed).

Records are ``tf.train.Example`` with ``image`` (32x32x3 uint8, raw bytes) and ``label`` (int64, 0-9),
decoded by ``example_decoder``. The sagemaker-training toolkit runs this under ``torchrun`` and passes
the user hyperparameters as ``--name value`` (``sagemaker-dist local`` does the same):

    --epochs 2 --batch-size 32 --learning-rate 0.001 [--tensorboard-s3-uri s3://bucket/tb/job]
    [--tensorboard-interval 30] [--reader-shuffle-seed 0] [--reader-shuffle-records 4096]

The train reader shuffles each epoch's records in a seeded window (``shuffle=``; a resume inside the
epoch trains each record once; ``--reader-shuffle-seed -1`` reads the stream in order).

No record counts: ``PipeTraining`` ends every epoch on the same step on every rank (when the first
runs out), validates on every rank when the job has a validation channel, prints the metric line
SageMaker's metric definitions read (rank 0), checkpoints each epoch (rank 0) and resumes from the
newest checkpoint. The model's ``state_dict`` goes to ``$SM_MODEL_DIR/model.pt`` from rank 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from sagemaker_dist.contract.paths import opt_ml_root
from sagemaker_dist.runtime import (
    PipeBatches,
    PipeTraining,
    ShuffleWindow,
    ddp_main,
    example_decoder,
    setup_ddp,
)
from sagemaker_dist.runtime.config import ContainerConfig

IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10


def parse_args(argv=None, *, description=None, more=None, **defaults) -> argparse.Namespace:
    """The demo's hyperparameters as the toolkit passes them; ``more(arg)`` adds a script's own (the
    GPT demo's), ``defaults`` change the defaults."""
    p = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])

    def arg(name, **kw):  # the toolkit passes hyperparameter names as written: accept - and _
        p.add_argument(f"--{name}", f"--{name.replace('-', '_')}", dest=name.replace("-", "_"), **kw)

    arg("epochs", type=int, default=2)
    arg("batch-size", type=int, default=32, help="per rank")
    arg("learning-rate", type=float, default=0.001, help="single-worker rate; scaled by the rank count")
    arg("tensorboard-s3-uri", default=None)
    arg("tensorboard-interval", type=float, default=30.0, help="seconds between TensorBoard uploads to S3")
    arg("model-dir", default=None, help="local directory; default $SM_MODEL_DIR, else <root>/model")
    arg("reader-shuffle-seed", type=int, default=0, help="the train reader's shuffle; -1 reads in order")
    arg("reader-shuffle-records", type=int, default=None, help="records in a shuffle window (default 4096)")
    if more is not None:
        more(arg)
    p.set_defaults(**defaults)
    args, unknown = p.parse_known_args(argv)
    if unknown:
        logging.getLogger(__name__).info("ignoring arguments %s", unknown)
    return args


_example = example_decoder({"image": "bytes", "label": ("int64", [])})


def decode(record: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    """One serialized Example -> (float CHW image in [0, 1], int label)."""
    parsed = _example(record)
    image = torch.frombuffer(bytearray(parsed["image"]), dtype=torch.uint8).view(IMAGE_SHAPE)
    return image.permute(2, 0, 1).float() / 255.0, parsed["label"].long().view(())


def collate(items: list) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = zip(*items)
    return torch.stack(images), torch.stack(labels)


def build_model() -> torch.nn.Module:
    """A tiny CNN: fast on CPU with tiny data, still a real conv net."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, NUM_CLASSES),
    )


def reader_shuffle(args: argparse.Namespace) -> ShuffleWindow | None:
    """The train reader's ``shuffle=``: a seeded window, or None (stream order) for a negative seed."""
    if args.reader_shuffle_seed < 0:
        return None
    if args.reader_shuffle_records is None:
        return ShuffleWindow(args.reader_shuffle_seed)
    return ShuffleWindow(args.reader_shuffle_seed, records=args.reader_shuffle_records)


@ddp_main
def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    layout = ContainerConfig.load().layout
    validate = layout is not None and layout.has_role("validation")
    job = setup_ddp(("train", "validation") if validate else ("train",))
    torch.manual_seed(0)
    model = DDP(build_model().to(job.device), device_ids=job.device_ids)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate * job.world_size)
    # batches handed out on this rank's device (on a GPU, copied ahead on a side stream)
    batches = {"decode": decode, "collate": collate, "device": job.device}
    train = PipeBatches(job, args.batch_size, shuffle=reader_shuffle(args), **batches)
    valid = PipeBatches(job, args.batch_size, role="validation", **batches) if validate else None
    training = PipeTraining(
        job,
        model,
        optimizer,
        epochs=args.epochs,
        tensorboard_s3_uri=args.tensorboard_s3_uri,
        tensorboard_interval=args.tensorboard_interval,
    )
    for _epoch in training.epochs():
        model.train()
        loss_sum, correct, seen = 0.0, 0, 0
        for images, labels in training.batches(train):
            optimizer.zero_grad()
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(labels)
            correct += int((logits.argmax(1) == labels).sum())
            seen += len(labels)
        metrics = {"loss": loss_sum / max(seen, 1), "accuracy": correct / max(seen, 1)}
        if valid is not None:
            model.eval()
            v_loss, v_correct, v_seen = 0.0, 0, 0
            with torch.no_grad():
                for images, labels in training.evaluate(valid):
                    logits = model(images)
                    v_loss += F.cross_entropy(logits, labels, reduction="sum").item()
                    v_correct += int((logits.argmax(1) == labels).sum())
                    v_seen += len(labels)
            metrics.update(val_loss=v_loss / max(v_seen, 1), val_accuracy=v_correct / max(v_seen, 1))
        training.end_epoch(**metrics)
    print(f"rank {job.rank}: trained {train.records} record(s)", flush=True)
    if job.is_chief:
        model_dir = args.model_dir or os.environ.get("SM_MODEL_DIR") or str(opt_ml_root() / "model")
        os.makedirs(model_dir, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(model_dir, "model.pt"))
        print(f"model saved to {model_dir}/model.pt", flush=True)
    job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
