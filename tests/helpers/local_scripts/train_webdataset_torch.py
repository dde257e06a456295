"""Test entry script for a local torchrun job over WebDataset shards (``sagemaker-dist pack``'s): each rank
reads its channel with ``PipeBatches(record_format="WebDataset")`` and ``sample_decoder``, decodes the
JPEGs with ``decode_jpeg_batch``, trains a small model on them through ``PipeTraining`` (``join=True``:
every sample of uneven shards trained), and appends to ``--out``/samples-rank<R>.jsonl one line per
sample: its key, the SHA-256 of its JPEG's bytes and its label.
"""

import argparse
import hashlib
import json
from pathlib import Path

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

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--batch_size", type=int, default=4)
p.add_argument("--classes", type=int, default=3)
args, _ = p.parse_known_args()


@ddp_main
def main() -> None:
    job = setup_ddp()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, args.classes)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    training = PipeTraining(job, model, optimizer, epochs=args.epochs, join=True)
    decode = sample_decoder({"jpg": "image", "cls": "int"}, keep_key=True)
    batches = PipeBatches(
        job, args.batch_size, record_format="WebDataset", decode=decode, collate=decode.collate
    )
    with open(Path(args.out) / f"samples-rank{job.rank}.jsonl", "a") as log:
        for _ in training.epochs():
            losses = []
            for batch in training.batches(batches):
                images = decode_jpeg_batch(batch["jpg"], device=job.device, size=(16, 16))
                optimizer.zero_grad()
                loss = F.cross_entropy(model(images.float() / 255), batch["cls"].to(job.device))
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                jpegs = [batch["jpg"].record(i).numpy().tobytes() for i in range(len(batch["__key__"]))]
                for key, jpeg, label in zip(batch["__key__"], jpegs, batch["cls"].tolist()):
                    row = {"key": key, "sha256": hashlib.sha256(jpeg).hexdigest(), "label": label}
                    log.write(json.dumps(row) + "\n")
            training.end_epoch(loss=sum(losses) / max(len(losses), 1))
    print(f"rank {job.rank}: finished", flush=True)
    job.close()


main()
