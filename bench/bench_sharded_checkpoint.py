"""Sharded checkpoints of an FSDP2 model (about 1 GB of state) against rank 0's ``torch.save``, on Gloo.

Run: .venv/bin/python bench/bench_sharded_checkpoint.py [--gigabytes 1 --repeats 3 --dir /tmp/bench-ckpt]
It starts itself under ``torchrun`` (CPU, Gloo, 127.0.0.1), once per phase:

- **save**, on 2 and on 4 ranks: a stack of ``Linear(4096, 4096)`` layers under ``fully_shard``, with
  AdamW's two moments (parameters and moments in fp32: ``--gigabytes`` of state in all). Arms
  interleaved and rotated over ``--repeats``: **dcp** (``ShardedCheckpoints.save``: every rank writes
  its shard, rank 0 commits ``meta.json`` and renames; fsynced), **rank0** (what a whole-model save
  costs a sharded model: the state gathered to rank 0, which writes it with ``torch.save`` through
  ``write_checkpoint``, fsynced; its write alone is what DDP's rank-0 save costs), and **async**
  (``save(blocking=False)``: the loop waits for the state's copy to host memory only; the write and
  the commit go on in a thread, waited for before the next arm). Each time runs from a barrier to a
  barrier, on rank 0.
- **load**: the 4-rank job's last ``dcp`` checkpoint restored (``ShardedCheckpoints.restore``: DCP
  plans, reads and reshards) on 4 ranks (the same world size) and on 2 (another), the two interleaved
  over ``--repeats`` runs of their own, from the page cache (the files were just written).

Rank 0 of each phase prints one JSON line; the driver prints the medians and the ratios of each run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_pipe_reader import rotated
from gloo_group import start_gloo

WIDTH = 4096
RESULT = "sagemaker-dist-bench:"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gigabytes", type=float, default=1.0, help="model and optimizer state, in all")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of each arm")
    p.add_argument("--dir", type=Path, default=Path("/tmp/sagemaker-dist-bench-ckpt"))
    p.add_argument("--phase", default=None, help=argparse.SUPPRESS)  # set by the driver for the ranks
    return p.parse_args()


def layers_for(gigabytes: float) -> int:
    """Linear layers whose weights, biases and AdamW's two moments (fp32) make ``gigabytes``."""
    per_layer = (WIDTH * WIDTH + WIDTH) * 4 * 3
    return max(1, round(gigabytes * 1e9 / per_layer))


def torchrun(args, world: int, phase: str) -> dict:
    """Run this file's ``phase`` on ``world`` ranks; rank 0's JSON result."""
    command = [str(Path(sys.executable).parent / "torchrun"), "--nnodes", "1", "--nproc_per_node", str(world)]
    command += ["--master_addr", "127.0.0.1", "--master_port", "29531", __file__, "--phase", phase]
    command += ["--gigabytes", str(args.gigabytes), "--repeats", str(args.repeats), "--dir", str(args.dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{phase} on {world} rank(s) failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT) :])


def drive(args) -> int:
    import torch

    layers = layers_for(args.gigabytes)
    state_gb = layers * (WIDTH * WIDTH + WIDTH) * 4 * 3 / 1e9
    print(
        f"{layers} x Linear({WIDTH}, {WIDTH}) under fully_shard with AdamW: {state_gb:.2f} GB of state; "
        f"torch {torch.__version__}, Gloo on the CPU, {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.1f}; checkpoints in {args.dir}",
        flush=True,
    )
    shutil.rmtree(args.dir, ignore_errors=True)
    for world in (2, 4):
        r = torchrun(args, world, "save")
        dcp, rank0, write = (statistics.median(r[k]) for k in ("dcp", "rank0", "rank0_write"))
        blocked, total = statistics.median(r["async_blocked"]), statistics.median(r["async_total"])
        print(
            f"save, {world} ranks, medians of {args.repeats}: dcp {dcp:.2f} s, rank0 {rank0:.2f} s "
            f"(its torch.save and fsync {write:.2f} s), dcp / rank0 {dcp / rank0:.2f}, dcp / rank0's write "
            f"{dcp / write:.2f}; async: the loop waits {blocked:.2f} s of {total:.2f} s "
            f"(sync dcp / async wait {dcp / blocked:.1f}x)",
            flush=True,
        )
        print(f"  every time: {json.dumps(r)}", flush=True)
    loads: dict[int, list[float]] = {4: [], 2: []}
    for repeat in range(args.repeats):
        for world in rotated((4, 2), repeat):
            loads[world] += torchrun(args, world, "load")["load"]
    same, other = statistics.median(loads[4]), statistics.median(loads[2])
    print(
        f"load of the 4-rank checkpoint, medians of {args.repeats} runs each: on 4 ranks {same:.2f} s, "
        f"on 2 ranks (resharded) {other:.2f} s; other / same {other / same:.2f}; every time: {loads}",
        flush=True,
    )
    shutil.rmtree(args.dir, ignore_errors=True)
    return 0


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from sagemaker_dist.runtime.torch.sharded import ShardedCheckpoints

    start_gloo()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers_for(args.gigabytes))))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, WIDTH)).sum().backward()
    optimizer.step()  # the moments exist: the whole state is there to save
    common = {
        "model": model,
        "optimizer": optimizer,
        "rank": rank,
        "local_rank": int(os.environ["LOCAL_RANK"]),
    }
    if args.phase == "load":
        loader = ShardedCheckpoints(args.dir / "world-4", world_size=world, **common)
        found: list = []
        result = {"load": [timed(lambda: found.append(loader.restore()[2]))]}
        if found[0] is None:
            raise SystemExit(f"no checkpoint to load in {args.dir / 'world-4'}")
        result["loaded"] = [found[0].path.name]
    else:
        result = save_arms(args, world, common)
    if rank == 0:
        print(RESULT + json.dumps(result), flush=True)
    dist.destroy_process_group()


def save_arms(args, world: int, common: dict) -> dict[str, list[float]]:
    """The three save arms, interleaved and rotated; seconds of each."""
    import datetime

    import torch.distributed as dist

    from sagemaker_dist.runtime.torch.sharded import ShardedCheckpoints

    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=1800))
    checkpoints = ShardedCheckpoints(
        args.dir / f"world-{world}", world_size=world, async_group=group, keep=1, **common
    )
    result: dict[str, list[float]] = {}
    for repeat in range(args.repeats):
        for number, arm in enumerate(rotated(("dcp", "rank0", "async"), repeat)):
            step = 1 + 3 * repeat + number  # every save a position of its own
            if arm == "dcp":
                result.setdefault(arm, []).append(timed(lambda s=step: checkpoints.save(0, s)))
            elif arm == "async":
                started = time.perf_counter()
                blocked = timed(lambda s=step: checkpoints.save(0, s, blocking=False))
                checkpoints.wait()
                dist.barrier()
                result.setdefault("async_blocked", []).append(blocked)
                result.setdefault("async_total", []).append(time.perf_counter() - started)
            else:
                everything, write = rank0_save(common, args.dir / f"rank0-{world}")
                result.setdefault(arm, []).append(everything)
                result.setdefault("rank0_write", []).append(write)
    return result


def timed(action) -> float:
    import torch.distributed as dist

    dist.barrier()
    started = time.perf_counter()
    action()
    dist.barrier()
    return time.perf_counter() - started


def rank0_save(common: dict, directory: Path) -> tuple[float, float]:
    """The whole state gathered to rank 0 and written there as a DDP job's checkpoint is: (seconds in
    all, seconds of rank 0's torch.save and fsync)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from sagemaker_dist.runtime.checkpoint_format import write_checkpoint

    write = 0.0
    dist.barrier()
    started = time.perf_counter()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optim_state = get_state_dict(common["model"], common["optimizer"], options=options)
    if common["rank"] == 0:
        state = {"model": model_state, "optimizer": optim_state}
        begun = time.perf_counter()
        write_checkpoint(
            directory, 1, 0, lambda tmp: torch.save(state, tmp / "state.pt"), {"format": "torch"}
        )
        write = time.perf_counter() - begun
    dist.barrier()
    return time.perf_counter() - started, write


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.phase:
        rank_main(arguments)
    else:
        sys.exit(drive(arguments))
