"""Train a small CNN on WebDataset shards of JPEG images (``sagemaker-dist pack``'s) with PyTorch DDP under
torchrun, each rank reading its own Pipe-mode channel: the script of notebooks/pytorch_pipe_mode.ipynb.

Each sample is ``<key>.jpg`` and ``<key>.cls`` (its class). ``PipeBatches(record_format="WebDataset")``
reads the rank's FIFO, ``sample_decoder`` keeps the JPEG bytes and parses the label, and
``decode_jpeg_batch`` decodes a whole batch where the model trains (nvJPEG on a GPU, the CPU here). The
hyperparameters come as ``--name value``:

    --epochs 3 --batch-size 16 --learning-rate 0.002 --image-size 32 --classes 3

At the end of each epoch rank 0 prints the metric line (``loss``, ``accuracy``, ``images_per_s``: the
images every rank trained, per second of the epoch), and the model goes to ``$SM_MODEL_DIR/model.pt``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from sagemaker_dist.runtime import (
    PipeBatches,
    PipeTraining,
    ddp_main,
    decode_jpeg_batch,
    sample_decoder,
    setup_ddp,
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, kind, default in (
        ("epochs", int, 3),
        ("batch-size", int, 16),
        ("learning-rate", float, 0.002),
        ("image-size", int, 32),
        ("classes", int, 3),
    ):  # the toolkit passes names as written: accept - and _
        p.add_argument(
            f"--{name}",
            f"--{name.replace('-', '_')}",
            dest=name.replace("-", "_"),
            type=kind,
            default=default,
        )
    args, _ = p.parse_known_args()
    return args


def build_model(classes: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, classes),
    )


@ddp_main
def main() -> None:
    args = parse_args()
    job = setup_ddp()
    torch.manual_seed(0)
    model = DDP(build_model(args.classes).to(job.device), device_ids=job.device_ids)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate * job.world_size)
    decode = sample_decoder({"jpg": "image", "cls": "int"})
    batches = PipeBatches(
        job, args.batch_size, record_format="WebDataset", decode=decode, collate=decode.collate
    )
    training = PipeTraining(job, model, optimizer, epochs=args.epochs)
    size = (args.image_size, args.image_size)
    for _epoch in training.epochs():
        started = time.perf_counter()
        loss_sum, correct, seen = 0.0, 0, 0
        for batch in training.batches(batches):
            images = decode_jpeg_batch(batch["jpg"], device=job.device, size=size).float().div_(255)
            labels = batch["cls"].to(job.device)
            optimizer.zero_grad()
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(labels)
            correct += int((logits.argmax(1) == labels).sum())
            seen += len(labels)
        seconds = time.perf_counter() - started
        # averaged over the ranks by end_epoch: each rank's rate times the ranks is the job's
        training.end_epoch(
            loss=loss_sum / max(seen, 1),
            accuracy=correct / max(seen, 1),
            images_per_s=seen / seconds * job.world_size,
        )
    if job.is_chief:
        model_dir = os.environ.get("SM_MODEL_DIR", "model")
        os.makedirs(model_dir, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(model_dir, "model.pt"))
    job.close()


main()
