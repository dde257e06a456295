"""The torchrun script of test_shuffled_resume_jobs.py: PipeTraining over a shuffled reader, stopped and
resumed. Each rank writes ``$TEST_OUT/rank<R>.jsonl``: a start line (where it resumes), one line per
step it trains (epoch, record ids) and a line at a stop.

``$TEST_READER``: ``pipe`` (PipeBatches over Examples with an ``id``) or ``fixed`` (RecordBatches of
16-byte raw records, the id in the first 8). ``$TEST_STOP_AT`` ``E:S``: rank 1 sends itself SIGTERM
after step S of epoch E (0-based) on the first attempt. ``$TEST_SEED``, ``$TEST_WINDOW``: the shuffle.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from sagemaker_dist.runtime import (
    PipeBatches,
    PipeTraining,
    RecordBatches,
    ddp_main,
    example_decoder,
    setup_ddp,
)
from sagemaker_dist.runtime.framing.shuffle import ShuffleWindow
from sagemaker_dist.runtime.torch.stop import TrainingStopped

OUT = Path(os.environ["TEST_OUT"])
READER = os.environ.get("TEST_READER", "pipe")
STOP_AT = (
    tuple(int(x) for x in os.environ["TEST_STOP_AT"].split(":")) if os.environ.get("TEST_STOP_AT") else None
)
WINDOW = ShuffleWindow(
    int(os.environ.get("TEST_SEED", "5")), records=int(os.environ.get("TEST_WINDOW", "24"))
)
EPOCHS = int(os.environ.get("TEST_EPOCHS", "3"))


def log(rank: int, **fields) -> None:
    with open(OUT / f"rank{rank}.jsonl", "a") as f:
        f.write(json.dumps(fields) + "\n")


@ddp_main
def main() -> None:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    job = setup_ddp()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if READER == "pipe":
        batches = PipeBatches(job, 4, decode=example_decoder({"id": "int64"}), shuffle=WINDOW)

        def ids(batch):
            return batch["id"].view(-1).tolist()
    else:
        batches = RecordBatches(job, 4, record_bytes=16, shuffle=WINDOW)

        def ids(batch):
            return batch[:, :8].contiguous().view(torch.int64).view(-1).tolist()

    training = PipeTraining(job, model, optimizer, epochs=EPOCHS)
    rank = job.rank
    started = False
    try:
        for epoch in training.epochs():
            if not started:
                started = True
                log(rank, event="start", epoch=epoch, step=training.step, resumed_at=training.resumed_at)
            for batch in training.batches(batches):
                optimizer.zero_grad()
                loss = model(torch.ones(len(ids(batch)), 1)).sum()
                loss.backward()
                optimizer.step()
                log(rank, event="step", epoch=epoch, ids=ids(batch))
                if (
                    STOP_AT
                    and training.resumed_at is None
                    and rank == 1
                    and (epoch, training.step + 1) == STOP_AT
                ):
                    os.kill(os.getpid(), signal.SIGTERM)
            training.end_epoch()
    except TrainingStopped as stopped:
        log(rank, event="stopped", epoch=stopped.epoch, step=stopped.step)
        raise
    log(rank, event="done")
    job.close()


main()
