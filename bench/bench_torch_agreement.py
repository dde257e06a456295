"""Per-step cost, under PyTorch DDP on Gloo, of ending epochs together without record counts.

Run: .venv/bin/python bench/bench_torch_agreement.py [--steps 40 --epochs 3 --repeats 5]
It starts itself under ``torchrun --nproc_per_node 2`` (CPU, Gloo, a static rendezvous on 127.0.0.1).
Each rank trains the torchrun demo's small CNN (``local/demo_job/train_torch.py``) under DDP on
in-memory CIFAR-10-shaped batches of 32, in three arms, interleaved and rotated: "fixed" (the epoch's
``steps`` batches iterated as they are: no collective but DDP's gradient allreduce), "agreed"
(``agreed_batches``: before every step a min-allreduce of "I have a batch, I do not want to stop",
what ``PipeTraining.batches`` runs) and "join" (every record trained under
``torch.distributed.algorithms.Join``, one allreduce of the stop flags at the epoch's end). Step time
is an epoch's wall time over its steps, epochs after the first of each repeat; rank 0 prints the
medians and each arm's difference from "fixed" in microseconds and as a share of its step. Steps on
a shared 2-core machine vary by several percent, so the agreement is also timed alone: the same
epochs iterated without a model (``--iterate-steps`` batches), an upper bound of its per-step cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_pipe_reader import rotated
from demo_scripts import demo_module
from gloo_group import start_gloo

ARMS = ("fixed", "agreed", "join")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="batches per epoch")
    p.add_argument("--epochs", type=int, default=3, help="epochs per repeat (the first is not timed)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats per arm")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--iterate-steps", type=int, default=400, help="batches per epoch when iterating alone")
    return p.parse_args()


def launch() -> int:
    torchrun = Path(sys.executable).parent / "torchrun"
    command = [str(torchrun), "--nnodes", "1", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
    command += ["--master_port", "29517", __file__, *sys.argv[1:]]
    env = {**os.environ, "SAGEMAKER_DIST_BENCH_RANK": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.call(command, env=env)


def epoch_seconds(arm: str, batches: list, model, optimizer, loss_fn) -> float:
    """One epoch of ``batches`` through ``arm``; seconds per step."""
    from sagemaker_dist.runtime.torch.epochs import agreed_batches

    start = time.perf_counter()
    if arm == "fixed":
        epoch = batches
    else:
        epoch = agreed_batches(batches, join=[model] if arm == "join" else None)
    steps = 0
    for images, labels in epoch:
        if model is not None:
            optimizer.zero_grad()
            loss_fn(model(images), labels).backward()
            optimizer.step()
        steps += 1
    return (time.perf_counter() - start) / max(steps, 1)


def timed(args, batches: list, model, optimizer, loss_fn, arms, epochs: int) -> dict[str, list[float]]:
    """Step times per arm over ``args.repeats`` rotated repeats of ``epochs`` epochs, the first dropped."""
    times = {arm: [] for arm in arms}
    for repeat in range(args.repeats):
        for arm in rotated(arms, repeat):
            for epoch in range(epochs):
                seconds = epoch_seconds(arm, batches, model, optimizer, loss_fn)
                if epoch:
                    times[arm].append(seconds)
    return times


def run_rank(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    start_gloo()
    rank = dist.get_rank()
    torch.manual_seed(rank)
    batches = [
        (torch.rand(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,))) for _ in range(args.steps)
    ]
    model = DDP(demo_module("train_torch.py").build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.functional.cross_entropy
    times = timed(args, batches, model, optimizer, loss_fn, ARMS, args.epochs)
    empty = [(torch.zeros(1), torch.zeros(1))] * args.iterate_steps
    alone = timed(args, empty, None, None, None, ARMS[:2], 2)
    if rank == 0:
        fixed = statistics.median(times["fixed"])
        print(
            f"step time, median of {len(times['fixed'])} epochs per arm ({args.repeats} interleaved repeats, "
            f"{args.steps} steps of {args.batch}, 2 ranks, Gloo, CPU, torch {torch.__version__}): "
            f"fixed {fixed * 1e3:.2f} ms",
            flush=True,
        )
        for arm in ARMS[1:]:
            median = statistics.median(times[arm])
            print(
                f"  {arm} {median * 1e3:.2f} ms: {(median - fixed) * 1e6:+.0f} us per step = "
                f"{(median - fixed) / fixed:+.2%} (ratio {median / fixed:.3f})",
                flush=True,
            )
        alone_fixed, alone_agreed = statistics.median(alone["fixed"]), statistics.median(alone["agreed"])
        cost = alone_agreed - alone_fixed
        print(
            f"iterating alone ({args.iterate_steps} batches, median of {len(alone['fixed'])} epochs per "
            "arm): "
            f"fixed {alone_fixed * 1e6:.1f} us, agreed {alone_agreed * 1e6:.1f} us per batch; the agreement "
            f"costs {cost * 1e6:.0f} us per step = {cost / fixed:.2%} of the fixed training step",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    arguments = parse_args()
    if os.environ.get("SAGEMAKER_DIST_BENCH_RANK"):
        run_rank(arguments)
    else:
        sys.exit(launch())
