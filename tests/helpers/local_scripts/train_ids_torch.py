"""Test entry script for local spot interruptions under ``distribution="torchrun"``: train_ids.py's twin
for PyTorch (PipeTraining over PipeBatches, no record counts) on records with an ``id``. Each rank
appends to ``--out``/trained-rank<R>.jsonl a start line (pid, the epoch and step it resumes at) and one
line per batch it trains (epoch, ids); ``--pause`` slows a step; ``--shuffle_seed S`` reads the channel
through the seeded shuffle window (``--shuffle_window`` records).
"""

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from sagemaker_dist.runtime import (
    PipeBatches,
    PipeTraining,
    ShuffleWindow,
    ddp_main,
    example_decoder,
    setup_ddp,
)

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--batch_size", type=int, default=4)
p.add_argument("--pause", type=float, default=0.1)
p.add_argument("--shuffle_seed", type=int, default=-1, help="the reader's shuffle window's seed (-1: none)")
p.add_argument("--shuffle_window", type=int, default=4096, help="records in the reader's shuffle window")
args, _ = p.parse_known_args()
decode = example_decoder({"id": "int64", "label": "int64"})


@ddp_main
def main() -> None:
    job = setup_ddp()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(1, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    training = PipeTraining(job, model, optimizer, epochs=args.epochs)
    shuffle = (
        ShuffleWindow(args.shuffle_seed, records=args.shuffle_window) if args.shuffle_seed >= 0 else None
    )
    batches = PipeBatches(job, args.batch_size, decode=decode, shuffle=shuffle)
    started: list[dict] = []
    with open(Path(args.out) / f"trained-rank{job.rank}.jsonl", "a") as trained:
        for epoch in training.epochs():
            if not started:  # the first epoch this attempt trains: where it resumes
                started.append({"start": os.getpid(), "epoch": epoch, "step": training.step})
                trained.write(json.dumps(started[0]) + "\n")
                trained.flush()
            for batch in training.batches(batches):
                optimizer.zero_grad()
                x = batch["id"].float().view(-1, 1) / 1000.0
                F.cross_entropy(model(x), batch["label"].view(-1)).backward()
                optimizer.step()
                ids = batch["id"].view(-1).tolist()
                trained.write(json.dumps({"pid": os.getpid(), "epoch": epoch, "ids": ids}) + "\n")
                trained.flush()
                time.sleep(args.pause)
            training.end_epoch()
    print(f"rank {job.rank}: finished", flush=True)
    job.close()


main()
