"""Benchmark plan_shards: 1,000,000 synthetic objects with heavy-tailed sizes into 64 shards.

Prints, per size distribution, the time of ``sagemaker_dist.launch.sharding.plan_shards`` and its largest
shard divided by the lower bound max(total / shards, largest object), next to the same ratio for
round-robin by key name (the reference split) and the time of a textbook LPT (Python ``sorted`` and
a heap of tuples) measured in the same run. Targets: <= 2 s and ratio <= 1.001.

    .venv/bin/python bench/bench_sharding.py [--objects 1000000] [--shards 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import heapq
import sys
import time

import numpy as np

from sagemaker_dist.launch.sharding import ShardPlan, plan_shards, round_robin_by_name

TIME_TARGET_S = 2.0
RATIO_TARGET = 1.001


def sizes_for(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Heavy-tailed object sizes in bytes (TFRecord shards of very different lengths)."""
    if kind == "pareto1.5":  # mean ~300 KB, a few objects of hundreds of MB
        raw = (rng.pareto(1.5, n) + 1) * 100_000
    elif kind == "pareto1.1":  # heavier: the largest object can exceed total / shards
        raw = (rng.pareto(1.1, n) + 1) * 10_000
    elif kind == "lognormal":
        raw = rng.lognormal(mean=12, sigma=2.0, size=n)
    else:
        raise ValueError(kind)
    return np.maximum(raw, 1).astype(np.int64)


def textbook_lpt(objects, shards: int) -> list[int]:
    """Reference LPT in plain Python: sort by size, heap of (load, shard) tuples."""
    heap = [(0, i) for i in range(shards)]
    loads = [0] * shards
    for _key, size in sorted(objects, key=lambda o: (-o[1], o[0])):
        load, i = heapq.heappop(heap)
        loads[i] = load + size
        heapq.heappush(heap, (load + size, i))
    return loads


def ratio(loads: list[int], sizes: np.ndarray, shards: int) -> float:
    bound = max(int(sizes.sum()) / shards, int(sizes.max()))
    return max(loads) / bound


def timed(fn, repeat: int):
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main(argv=None) -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="best of N timings")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dist", nargs="*", default=["pareto1.5", "pareto1.1", "lognormal"])
    args = parser.parse_args(argv)

    print(f"{args.objects:,} objects into {args.shards} shards, best of {args.repeat} timings")
    ok = True
    for kind in args.dist:
        rng = np.random.default_rng(args.seed)
        sizes = sizes_for(kind, args.objects, rng)
        # In S3 listing order (sorted by key), as list_objects returns them ...
        objects = [(f"data/part-{i:07d}.tfrecord", s) for i, s in enumerate(sizes.tolist())]
        # ... and shuffled, which costs plan_shards a sort by name.
        shuffled = [objects[i] for i in rng.permutation(args.objects)]

        t_plan, plan = timed(lambda objects=objects: plan_shards(objects, args.shards), args.repeat)
        t_shuf, plan_shuf = timed(lambda objects=shuffled: plan_shards(objects, args.shards), args.repeat)
        assert plan_shuf == plan, "plan depends on input order"
        t_rr, rr = timed(lambda objects=objects: round_robin_by_name(objects, args.shards), 1)
        t_ref, ref_loads = timed(lambda objects=objects: textbook_lpt(objects, args.shards), 1)
        assert isinstance(plan, ShardPlan) and plan.num_objects == args.objects
        r_plan = ratio(plan.bytes_per_shard, sizes, args.shards)
        r_rr = ratio(rr.bytes_per_shard, sizes, args.shards)
        r_ref = ratio(ref_loads, sizes, args.shards)
        bound_kind = "largest object" if sizes.max() > sizes.sum() / args.shards else "total/shards"
        total, largest = sizes.sum() / 1e9, sizes.max() / 1e6
        print(f"\n{kind}: total {total:.1f} GB, largest object {largest:.1f} MB, bound = {bound_kind}")
        print(f"  plan_shards (LPT)        {t_plan:7.3f} s   max/bound {r_plan:.6f}")
        print(f"  plan_shards, shuffled    {t_shuf:7.3f} s   (same plan)")
        print(f"  round-robin by name      {t_rr:7.3f} s   max/bound {r_rr:.6f}")
        print(f"  textbook LPT (tuples)    {t_ref:7.3f} s   max/bound {r_ref:.6f}")
        print(f"  plan_shards is x{t_ref / t_plan:.1f} faster than textbook LPT; round-robin's largest shard "
              f"is x{r_rr / r_plan:.3f} plan_shards' largest")
        meets = max(t_plan, t_shuf) <= TIME_TARGET_S and r_plan <= RATIO_TARGET
        ok &= meets
        print(f"  targets (<= {TIME_TARGET_S} s, <= {RATIO_TARGET}): {'met' if meets else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
