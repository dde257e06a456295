"""The training script the torchrun tests run: nn.Linear under DDP over this rank's Pipe channel.

Every rank writes what it trained to ``$TEST_OUT/rank<R>.jsonl`` (one line per step: epoch, step,
record ids) and what it saw at start and at a stop. ``$TEST_MODE``: ``train`` (epoch 0 ends at the
shortest rank, epoch 1 trains every record through Join), ``stop`` (rank 1 sends itself SIGTERM
after step ``$TEST_STOP_AFTER`` of epoch 1), ``raise`` (rank 1 raises at its second step), ``resume``
(plain training, after a stop).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

started = time.monotonic()

from sagemaker_dist.runtime import (  # noqa: E402 - the clock starts before the imports
    PipeBatches,
    PipeTraining,
    ddp_main,
    example_decoder,
    setup_ddp,
)
from sagemaker_dist.runtime.torch.stop import TrainingStopped  # noqa: E402

MODE = os.environ.get("TEST_MODE", "train")
OUT = Path(os.environ["TEST_OUT"])


def log(rank: int, **fields) -> None:
    with open(OUT / f"rank{rank}.jsonl", "a") as f:
        f.write(json.dumps(fields) + "\n")


def checksum(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


@ddp_main
def main() -> None:
    before = time.monotonic()
    try:
        job = setup_ddp()
    except Exception as exc:
        import torch.distributed as dist

        rank = int(os.environ.get("RANK", "0"))
        log(
            rank,
            event="setup_failed",
            seconds=time.monotonic() - before,
            error=str(exc),
            process_group=dist.is_initialized(),
            since_start=time.monotonic() - started,
        )
        raise
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9)
    decode = example_decoder({"id": "int64", "x": ("float", [4]), "y": ("float", [1])})
    batches = PipeBatches(job, batch_size=4, decode=decode)
    training = PipeTraining(job, model, optimizer, scheduler, epochs=2)
    rank = job.rank
    log(rank, event="start", resumed_at=training.resumed_at, checked_in_s=job.checked_in_s)
    try:
        for epoch in training.epochs():
            if training.resumed_at and epoch == training.resumed_at[0]:
                log(
                    rank,
                    event="restored",
                    resumed_at=training.resumed_at,
                    checksum=checksum(model),
                    lr_step=scheduler.last_epoch,
                )
            training.join = MODE == "train" and epoch == 1
            losses = []
            for batch in training.batches(batches):
                optimizer.zero_grad()
                loss = F.mse_loss(model(batch["x"]), batch["y"])
                loss.backward()
                optimizer.step()
                scheduler.step()
                losses.append(loss.item())
                log(
                    rank, event="step", epoch=epoch, step=training.step + 1, ids=batch["id"].view(-1).tolist()
                )
                if MODE == "raise" and rank == 1 and len(losses) == 2:
                    raise ValueError("boom at rank 1's second step")
                if MODE == "stop" and rank == 1 and epoch == 1 and training.step + 1 == STOP_AFTER:
                    os.kill(os.getpid(), signal.SIGTERM)
            training.end_epoch(loss=sum(losses) / max(len(losses), 1))
            log(
                rank, event="epoch_end", epoch=epoch, steps=training.last.steps, ran_out=training.last.ran_out
            )
    except TrainingStopped as stopped:
        log(
            rank,
            event="stopped",
            epoch=stopped.epoch,
            step=stopped.step,
            checksum=checksum(model),
            lr_step=scheduler.last_epoch,
            checkpoint=str(stopped.checkpoint) if stopped.checkpoint else None,
        )
        raise
    log(rank, event="done", records=batches.records)
    job.close()


STOP_AFTER = int(os.environ.get("TEST_STOP_AFTER", "2"))

if __name__ == "__main__":
    sys.exit(main())
