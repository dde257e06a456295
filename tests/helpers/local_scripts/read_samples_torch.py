"""Test entry script, written from the WebDataset page of the docs: each rank reads its channel with
``PipeBatches(record_format="WebDataset")`` and ``sample_decoder`` (the files named by ``--fields``, kept as
bytes), trains a step on each batch through ``PipeTraining`` (``join=True``: every sample of uneven shards),
and appends to ``--out``/samples-rank<R>.jsonl one line per sample: its key and the SHA-256 of each file.
"""

import argparse
import hashlib
import json
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from sagemaker_dist.runtime import PipeBatches, PipeTraining, ddp_main, sample_decoder, setup_ddp

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--fields", default="bin,cls")
p.add_argument("--batch_size", type=int, default=4)
args, _ = p.parse_known_args()


@ddp_main
def main() -> None:
    job = setup_ddp()
    model = DDP(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    training = PipeTraining(job, model, optimizer, epochs=1, join=True)
    fields = args.fields.split(",")
    decode = sample_decoder({ext: "bytes" for ext in fields}, keep_key=True)
    batches = PipeBatches(
        job, args.batch_size, record_format="WebDataset", decode=decode, collate=decode.collate
    )
    with open(Path(args.out) / f"samples-rank{job.rank}.jsonl", "a") as log:
        for _ in training.epochs():
            for batch in training.batches(batches):
                sizes = torch.tensor([[float(len(b))] for b in batch[fields[0]]])
                optimizer.zero_grad()
                model(sizes / 1000).sum().backward()
                optimizer.step()
                for i, key in enumerate(batch["__key__"]):
                    row = {"key": key, **{ext: hashlib.sha256(batch[ext][i]).hexdigest() for ext in fields}}
                    log.write(json.dumps(row) + "\n")
            training.end_epoch()
    job.close()


main()
