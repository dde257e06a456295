"""The training script the FSDP2 torchrun tests run: a small MLP under ``fully_shard`` over raw records.

Each record is 28 bytes (an int64 id, 4 float32 inputs, a float32 target), read by ``RecordBatches``
(``record_bytes=28``). Every rank writes what it trained to ``$TEST_OUT/rank<R>.jsonl``; rank 0 writes
the whole model and optimizer state (gathered from the shards) to ``$TEST_OUT/state-<tag>.pt`` where
the test compares states: ``restored`` (right after a resume), ``step-E-S`` (after step S of epoch E,
when a periodic checkpoint is written in the background while training goes on) and ``final``.

``$TEST_EPOCHS`` epochs, a step checkpoint every ``$TEST_EVERY`` steps; ``$TEST_STOP_AT`` = ``E:S``: rank
1 sends itself SIGTERM after step S of epoch E; ``$TEST_SLOW_CHECKPOINT`` (a checkpoint's name): rank
1's storage takes 120 s to write that checkpoint (a rank that cannot finish its shard in the stop
window); ``$TEST_CHECKPOINT_S3_URI``: the checkpoints go straight to that S3 prefix.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from sagemaker_dist.runtime import PipeTraining, RecordBatches, ddp_main, setup_ddp
from sagemaker_dist.runtime.torch.stop import TrainingStopped

OUT = Path(os.environ["TEST_OUT"])
EPOCHS = int(os.environ.get("TEST_EPOCHS", "2"))
EVERY = int(os.environ.get("TEST_EVERY", "0")) or None
STOP_AT = (
    tuple(int(v) for v in os.environ["TEST_STOP_AT"].split(":")) if os.environ.get("TEST_STOP_AT") else None
)
DUMP_EVERY = bool(os.environ.get("TEST_DUMP_EVERY"))
RECORD_BYTES = 28


def log(rank: int, **fields) -> None:
    with open(OUT / f"rank{rank}.jsonl", "a") as f:
        f.write(json.dumps(fields) + "\n")


def dump(model, optimizer, rank: int, tag: str) -> None:
    """The whole state, gathered from every rank's shard (a collective: every rank calls it)."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    if rank == 0:
        torch.save({"model": model_state, "optim": optim_state}, OUT / f"state-{tag}.pt")


def slow_storage(name: str) -> None:
    """This rank's disk stalls on checkpoint ``name``: its shard cannot be written in time."""
    from torch.distributed.checkpoint import FileSystemWriter

    plain = FileSystemWriter.write_data

    def write_data(self, plan, planner):
        if f".tmp-{name}-" in str(self.path):
            time.sleep(120)
        return plain(self, plan, planner)

    FileSystemWriter.write_data = write_data


@ddp_main
def main() -> None:
    job = setup_ddp()
    import torch
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard

    rank = job.rank
    if os.environ.get("TEST_SLOW_CHECKPOINT") and rank == 1:
        slow_storage(os.environ["TEST_SLOW_CHECKPOINT"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9)
    batches = RecordBatches(job, 4, record_bytes=RECORD_BYTES)
    training = PipeTraining(
        job,
        model,
        optimizer,
        scheduler,
        epochs=EPOCHS,
        checkpoint_every_steps=EVERY,
        keep=None,
        checkpoint_s3_uri=os.environ.get("TEST_CHECKPOINT_S3_URI"),
    )
    training.state["batches_seen"] = 0
    try:
        for epoch in training.epochs():
            if (
                training.resumed_at
                and epoch == training.resumed_at[0]
                and training.step == training.resumed_at[1]
            ):
                log(
                    rank,
                    event="restored",
                    resumed_at=training.resumed_at,
                    lr_step=scheduler.last_epoch,
                    state=training.state,
                    world_size=job.world_size,
                )
                dump(model, optimizer, rank, "restored")
            losses = []
            for raw in training.batches(batches):
                ids = raw[:, :8].contiguous().view(torch.int64).view(-1)
                values = raw[:, 8:].contiguous().view(torch.float32)
                optimizer.zero_grad()
                loss = F.mse_loss(model(values[:, :4]), values[:, 4:])
                loss.backward()
                optimizer.step()
                scheduler.step()
                losses.append(loss.item())
                step = training.step + 1
                training.state["batches_seen"] += 1
                log(rank, event="step", epoch=epoch, step=step, ids=ids.tolist(), loss=loss.item())
                if DUMP_EVERY and EVERY and step % EVERY == 0:
                    dump(model, optimizer, rank, f"step-{epoch}-{step}")  # what the next save must hold
                if STOP_AT == (epoch, step) and rank == 1:
                    os.kill(os.getpid(), signal.SIGTERM)
            training.end_epoch(loss=sum(losses) / max(len(losses), 1))
            log(rank, event="epoch_end", epoch=epoch, steps=training.last.steps)
    except TrainingStopped as stopped:
        log(
            rank,
            event="stopped",
            epoch=stopped.epoch,
            step=stopped.step,
            checkpoint=stopped.checkpoint.path.name if stopped.checkpoint else None,
            lr_step=scheduler.last_epoch,
            blocked_s=training.sharded_checkpoints.blocked_s,
        )
        raise
    dump(model, optimizer, rank, "final")
    log(rank, event="done", blocked_s=training.sharded_checkpoints.blocked_s)
    job.close()


if __name__ == "__main__":
    sys.exit(main())
